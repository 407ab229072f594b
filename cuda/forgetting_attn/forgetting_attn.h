// FoX on the GPU, for both GPU backends: declared alike for phasor::cuda::fox (nvcc) and
// phasor::emulated::fox (the emulated GPU), compiled both ways. Decoding — one step of
// ForgettingAttnCache (src/forgetting_attn/recurrent.cpp), defined in
// cuda/forgetting_attn/recurrent.cu — is called by ForgettingAttnCache::step through PHASOR_ON_GPU
// once the metadata and the value checks (gates, slopes) have passed and the cache's buffers hold
// this step's slot. The chunk kernels (parallel_forgetting_attn, Impl::chunk), defined in
// cuda/forgetting_attn/chunk.cu, are called by forgetting_attn_forward / _backward
// (src/forgetting_attn/api.cpp) after the same checks. Work is queued on
// phasor::cuda::current_stream(); no host synchronisation.
#pragma once

#include "forgetting_attn/problem.h"
#include "phasor/forgetting_attn.h"

// check_decode_step: a phasor::Error naming the argument when the step is beyond the kernels'
// limits (the value dimension's shared memory, the number of key splits); called before the cache
// changes. decode_step: appends the token (rotated key, value, key slope) to its slot, decays
// every cached token by g_t, and writes o [B, 1, HQ, V] = the softmax over the visible tokens,
// split over the keys.
// chunk_forward / chunk_backward: parallel_forgetting_attn with the semantics of the CPU's
// detail::fox::chunk_forward / chunk_backward (lse optional; the backward recomputes o and lse
// unless both are given); a phasor::Error naming 'q' or 'v' beyond K, V ≤ 256.
#define PHASOR_FOX_GPU_ENTRY_POINTS                                                               \
  void check_decode_step(const ::phasor::detail::fox::DecodeStep& step);                          \
  void decode_step(const ::phasor::detail::fox::DecodeStep& step, const ::phasor::TensorView& o); \
  void chunk_forward(const ::phasor::detail::fox::Problem& p, const ::phasor::TensorView& o,      \
                     const ::phasor::TensorView& lse);                                            \
  void chunk_backward(const ::phasor::detail::fox::Problem& p, const ::phasor::TensorView& d_o,   \
                      const ::phasor::TensorView& o, const ::phasor::TensorView& lse,             \
                      const ::phasor::ForgettingAttnGrads& grads);

namespace phasor::cuda::fox {
PHASOR_FOX_GPU_ENTRY_POINTS
}  // namespace phasor::cuda::fox
namespace phasor::emulated::fox {
PHASOR_FOX_GPU_ENTRY_POINTS
}  // namespace phasor::emulated::fox
