// Internal: validated problems of the rotary ops and the kernels that solve them (reference in
// reference.cpp, optimized in kernels.cpp). api.cpp validates every argument before calling.
#pragma once

#include <cstdint>

#include "common/check.h"
#include "common/element_access.h"
#include "phasor/rotary.h"
#include "rotary/problem.h"

namespace phasor::detail::rotary {

void reference_phases_forward(const PhaseProblem& p, const TensorView& theta,
                              const TensorView& final_phase);
void reference_phases_backward(const PhaseProblem& p, const TensorView& d_theta,
                               const TensorView& d_final_phase, const RotaryPhaseGrads& grads);
void phases_forward(const PhaseProblem& p, const TensorView& theta, const TensorView& final_phase);
void phases_backward(const PhaseProblem& p, const TensorView& d_theta,
                     const TensorView& d_final_phase, const RotaryPhaseGrads& grads);

void reference_angles(const AnglesProblem& p, const TensorView& theta);
void angles(const AnglesProblem& p, const TensorView& theta);

// apply_rotary: outputs optional in the backward.
void reference_apply_forward(const ApplyProblem& p, const TensorView& y);
void reference_apply_backward(const ApplyProblem& p, const TensorView& dy, const TensorView& dx,
                              const TensorView& d_theta);
void apply_forward(const ApplyProblem& p, const TensorView& y);
void apply_backward(const ApplyProblem& p, const TensorView& dy, const TensorView& dx,
                    const TensorView& d_theta);

}  // namespace phasor::detail::rotary
