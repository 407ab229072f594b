// Performer FAVOR+ on the GPU — the feature map (favor_features) and the attention
// (favor_attention), forward and backward — for both GPU backends: declared alike for
// phasor::cuda::favor (nvcc) and phasor::emulated::favor (the emulated GPU), defined in
// cuda/favor/kernels.cu, compiled both ways. src/favor/api.cpp calls them through PHASOR_ON_GPU
// once the metadata and the value checks (cu_seqlens) have passed; they take the CPU kernels'
// problem descriptions (src/favor/kernels.h) and compute what src/favor/kernels.cpp computes.
// Work is queued on phasor::cuda::current_stream(); the causal attention's GLA call reads one
// verdict of its gate check back (one host sync).
#pragma once

#include "favor/kernels.h"
#include "phasor/favor.h"

#define PHASOR_FAVOR_GPU_ENTRY_POINTS                                                       \
  void features_forward(const ::phasor::detail::favor::FeatureProblem& p,                   \
                        const ::phasor::TensorView& phi);                                   \
  void features_backward(const ::phasor::detail::favor::FeatureProblem& p,                  \
                         const ::phasor::TensorView& d_phi, const ::phasor::TensorView& dx, \
                         const ::phasor::TensorView& dw);                                   \
  void attention_forward(const ::phasor::detail::favor::AttentionProblem& p,                \
                         const ::phasor::TensorView& o);                                    \
  void attention_backward(const ::phasor::detail::favor::AttentionProblem& p,               \
                          const ::phasor::TensorView& d_o,                                  \
                          const ::phasor::FavorAttentionGrads& grads);

namespace phasor::cuda::favor {
PHASOR_FAVOR_GPU_ENTRY_POINTS
}  // namespace phasor::cuda::favor
namespace phasor::emulated::favor {
PHASOR_FAVOR_GPU_ENTRY_POINTS
}  // namespace phasor::emulated::favor
