// Internal: validated problems of the rotary ops and the kernels that solve them (reference in
// reference.cpp, optimized in kernels.cpp). api.cpp validates every argument before calling.
#pragma once

#include <cstdint>
#include <vector>

#include "common/check.h"
#include "common/element_access.h"
#include "phasor/rotary.h"

namespace phasor::detail::rotary {

// Selective RoPE phases: views already checked against phi's dimensions.
struct PhaseProblem {
  TensorView phi, omega, initial_phase;  // initial_phase may be undefined
  std::vector<Sequence> sequences;
  std::int64_t H = 0, R = 0;
  bool omega_per_head = false;  // omega is [H, R] (else [R], shared by heads)
  std::int64_t num_sequences() const { return static_cast<std::int64_t>(sequences.size()); }
};

void reference_phases_forward(const PhaseProblem& p, const TensorView& theta,
                              const TensorView& final_phase);
void reference_phases_backward(const PhaseProblem& p, const TensorView& d_theta,
                               const TensorView& d_final_phase, const RotaryPhaseGrads& grads);
void phases_forward(const PhaseProblem& p, const TensorView& theta, const TensorView& final_phase);
void phases_backward(const PhaseProblem& p, const TensorView& d_theta,
                     const TensorView& d_final_phase, const RotaryPhaseGrads& grads);

// RoPE angles: sequences resolved, R = head_dim / 2.
struct AnglesProblem {
  std::vector<Sequence> sequences;
  std::int64_t R = 0, head_dim = 0, offset = 0;
  double base = 10000.0;
};
void reference_angles(const AnglesProblem& p, const TensorView& theta);
void angles(const AnglesProblem& p, const TensorView& theta);

// apply_rotary: x [B, T, H, K] and theta [B, T, H, K/2] checked; outputs optional in backward.
void reference_apply_forward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                             const TensorView& y);
void reference_apply_backward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                              const TensorView& dy, const TensorView& dx,
                              const TensorView& d_theta);
void apply_forward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                   const TensorView& y);
void apply_backward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                    const TensorView& dy, const TensorView& dx, const TensorView& d_theta);

// Column indices (a, b) of rotation pair i in a row of K = 2R values.
inline std::int64_t pair_a(RotaryLayout layout, std::int64_t i, std::int64_t /*R*/) {
  return layout == RotaryLayout::half_split ? i : 2 * i;
}
inline std::int64_t pair_b(RotaryLayout layout, std::int64_t i, std::int64_t R) {
  return layout == RotaryLayout::half_split ? i + R : 2 * i + 1;
}

}  // namespace phasor::detail::rotary
