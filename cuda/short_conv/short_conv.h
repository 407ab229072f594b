// The short causal convolution on the GPU (causal_conv1d; causal_conv1d_update selects the same
// kernels), forward and backward, for both GPU backends: declared alike for
// phasor::cuda::short_conv (nvcc) and phasor::emulated::short_conv (the emulated GPU), defined in
// cuda/short_conv/kernels.cu, compiled both ways. src/short_conv/api.cpp calls them through
// PHASOR_ON_GPU once the metadata and the value checks (cu_seqlens) have passed; they take the CPU
// kernel's problem description (src/short_conv/problem.h) and compute what it computes
// (src/short_conv/kernels.cpp). Work is queued on phasor::cuda::current_stream(); no host
// synchronisation.
#pragma once

#include "phasor/short_conv.h"
#include "short_conv/problem.h"

#define PHASOR_SHORT_CONV_GPU_ENTRY_POINTS                                                        \
  void kernel_forward(const ::phasor::detail::short_conv::Problem& p,                             \
                      const ::phasor::TensorView& y, const ::phasor::TensorView& final_cache);    \
  void kernel_backward(const ::phasor::detail::short_conv::Problem& p,                            \
                       const ::phasor::TensorView& dy, const ::phasor::TensorView& d_final_cache, \
                       const ::phasor::ShortConvGrads& grads);

namespace phasor::cuda::short_conv {
PHASOR_SHORT_CONV_GPU_ENTRY_POINTS
}  // namespace phasor::cuda::short_conv
namespace phasor::emulated::short_conv {
PHASOR_SHORT_CONV_GPU_ENTRY_POINTS
}  // namespace phasor::emulated::short_conv
