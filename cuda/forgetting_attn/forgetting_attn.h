// FoX decoding on the GPU: one step of ForgettingAttnCache (src/forgetting_attn/recurrent.cpp) on a
// GPU device, for both GPU backends: declared alike for phasor::cuda::fox (nvcc) and
// phasor::emulated::fox (the emulated GPU), defined in cuda/forgetting_attn/recurrent.cu, compiled
// both ways. ForgettingAttnCache::step calls it through PHASOR_ON_GPU once the metadata and the
// value checks (gates, slopes) have passed and the cache's buffers hold this step's slot. Work is
// queued on phasor::cuda::current_stream(); no host synchronisation.
#pragma once

#include "forgetting_attn/problem.h"

// check_decode_step: a phasor::Error naming the argument when the step is beyond the kernels'
// limits (the value dimension's shared memory, the number of key splits); called before the cache
// changes. decode_step: appends the token (rotated key, value, key slope) to its slot, decays
// every cached token by g_t, and writes o [B, 1, HQ, V] = the softmax over the visible tokens,
// split over the keys.
#define PHASOR_FOX_GPU_ENTRY_POINTS                                      \
  void check_decode_step(const ::phasor::detail::fox::DecodeStep& step); \
  void decode_step(const ::phasor::detail::fox::DecodeStep& step, const ::phasor::TensorView& o);

namespace phasor::cuda::fox {
PHASOR_FOX_GPU_ENTRY_POINTS
}  // namespace phasor::cuda::fox
namespace phasor::emulated::fox {
PHASOR_FOX_GPU_ENTRY_POINTS
}  // namespace phasor::emulated::fox
