// Internal: the problem descriptions of the rotary ops — what the references, the CPU kernels and
// the CUDA kernels all take — and the pair layout they share (host and device code). Plain data:
// trivially copyable to a kernel argument.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/sequences.h"
#include "phasor/common.h"

namespace phasor::detail::rotary {

// Selective RoPE phases (selective_rope_phases).
struct PhaseProblem {
  TensorView phi;            // [B, T, H, R]
  TensorView omega;          // [H, R] (omega_per_head) or [R]
  TensorView initial_phase;  // [N, H, R]; undefined: 0
  Sequences sequences;
  std::int64_t B = 0, T = 0, H = 0, R = 0;
  bool omega_per_head = false;
  Device device = Device::cpu;
  PHASOR_HOST_DEVICE std::int64_t num_sequences() const { return sequences.size(); }
};

// Standard RoPE angles (rope_angles): θ[b, t, i] = position_t · base^(−2i/K).
struct AnglesProblem {
  Sequences sequences;
  std::int64_t B = 0, T = 0, R = 0, head_dim = 0, offset = 0;
  double base = 10000.0;
  Device device = Device::cpu;
};

// Applying the rotation (apply_rotary).
struct ApplyProblem {
  TensorView x;      // [B, T, H, K]
  TensorView theta;  // [B, T, H, K/2]
  RotaryLayout layout = RotaryLayout::half_split;
  std::int64_t B = 0, T = 0, H = 0, K = 0;
  Device device = Device::cpu;

  // The problem of already checked views (for ops built on the rotation: STRING, GRAPE).
  static ApplyProblem of(const TensorView& x, const TensorView& theta, RotaryLayout layout) {
    ApplyProblem p;
    p.x = x;
    p.theta = theta;
    p.layout = layout;
    p.B = x.size(0), p.T = x.size(1), p.H = x.size(2), p.K = x.size(3);
    p.device = x.device;
    return p;
  }
};

static_assert(std::is_trivially_copyable_v<PhaseProblem> &&
                  std::is_trivially_copyable_v<AnglesProblem> &&
                  std::is_trivially_copyable_v<ApplyProblem>,
              "kernel arguments");

// Column indices (a, b) of rotation pair i in a row of K = 2R values.
PHASOR_HOST_DEVICE inline std::int64_t pair_a(RotaryLayout layout, std::int64_t i,
                                              std::int64_t /*R*/) {
  return layout == RotaryLayout::half_split ? i : 2 * i;
}
PHASOR_HOST_DEVICE inline std::int64_t pair_b(RotaryLayout layout, std::int64_t i, std::int64_t R) {
  return layout == RotaryLayout::half_split ? i + R : 2 * i + 1;
}

}  // namespace phasor::detail::rotary
