// The rotary ops on the GPU (selective_rope_phases, rope_angles, apply_rotary), forward and
// backward, for both GPU backends: declared alike for phasor::cuda::rotary (nvcc) and
// phasor::emulated::rotary (the emulated GPU), defined in cuda/rotary/kernels.cu, compiled both
// ways. src/rotary/api.cpp calls them through PHASOR_ON_GPU once the metadata and the value checks
// (cu_seqlens) have passed; they take the same problem descriptions as the CPU kernels
// (src/rotary/problem.h) and compute what those compute (src/rotary/kernels.cpp). Work is queued on
// phasor::cuda::current_stream(); no host synchronisation.
#pragma once

#include "phasor/rotary.h"
#include "rotary/problem.h"

#define PHASOR_ROTARY_GPU_ENTRY_POINTS                                                             \
  void phases_forward(const ::phasor::detail::rotary::PhaseProblem& p,                             \
                      const ::phasor::TensorView& theta, const ::phasor::TensorView& final_phase); \
  void phases_backward(                                                                            \
      const ::phasor::detail::rotary::PhaseProblem& p, const ::phasor::TensorView& d_theta,        \
      const ::phasor::TensorView& d_final_phase, const ::phasor::RotaryPhaseGrads& grads);         \
  void angles(const ::phasor::detail::rotary::AnglesProblem& p,                                    \
              const ::phasor::TensorView& theta);                                                  \
  void apply_forward(const ::phasor::detail::rotary::ApplyProblem& p,                              \
                     const ::phasor::TensorView& y);                                               \
  void apply_backward(const ::phasor::detail::rotary::ApplyProblem& p,                             \
                      const ::phasor::TensorView& dy, const ::phasor::TensorView& dx,              \
                      const ::phasor::TensorView& d_theta);

namespace phasor::cuda::rotary {
PHASOR_ROTARY_GPU_ENTRY_POINTS
}  // namespace phasor::cuda::rotary
namespace phasor::emulated::rotary {
PHASOR_ROTARY_GPU_ENTRY_POINTS
}  // namespace phasor::emulated::rotary
