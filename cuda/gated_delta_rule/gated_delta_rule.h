// Gated DeltaNet's kernels on the GPU — recurrent (fused_recurrent_gated_delta_rule,
// cuda/gated_delta_rule/recurrent.cu) and chunk (chunk_gated_delta_rule, chunk.cu), forward and
// backward — for both GPU backends: declared alike for phasor::cuda::gdn (nvcc) and
// phasor::emulated::gdn (the emulated GPU), compiled both ways. src/gated_delta_rule/api.cpp
// calls them through PHASOR_ON_GPU once the metadata and the value checks (gates, cu_seqlens)
// have passed; they take the CPU kernels' problem description (src/gated_delta_rule/problem.h)
// and compute what src/gated_delta_rule/recurrent.cpp and chunk.cpp compute. Work is queued on
// phasor::cuda::current_stream(); no host synchronisation.
#pragma once

#include "gated_delta_rule/problem.h"
#include "phasor/gated_delta_rule.h"

#define PHASOR_GDN_GPU_ENTRY_POINTS                                                              \
  void recurrent_forward(const ::phasor::detail::gdn::Problem& p, const ::phasor::TensorView& o, \
                         const ::phasor::TensorView& final_state);                               \
  void recurrent_backward(                                                                       \
      const ::phasor::detail::gdn::Problem& p, const ::phasor::TensorView& d_o,                  \
      const ::phasor::TensorView& d_final_state, const ::phasor::GatedDeltaRuleGrads& grads);    \
  void chunk_forward(const ::phasor::detail::gdn::Problem& p, const ::phasor::TensorView& o,     \
                     const ::phasor::TensorView& final_state,                                    \
                     const ::phasor::TensorView& chunk_states);                                  \
  void chunk_backward(const ::phasor::detail::gdn::Problem& p, const ::phasor::TensorView& d_o,  \
                      const ::phasor::TensorView& d_final_state,                                 \
                      const ::phasor::GatedDeltaRuleGrads& grads);

namespace phasor::cuda::gdn {
PHASOR_GDN_GPU_ENTRY_POINTS
}  // namespace phasor::cuda::gdn
namespace phasor::emulated::gdn {
PHASOR_GDN_GPU_ENTRY_POINTS
}  // namespace phasor::emulated::gdn
