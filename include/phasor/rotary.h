// Rotary position embeddings: Selective RoPE cumulative phases, standard RoPE angles, and the
// rotation itself (apply_rotary), forward and backward.
//
// Selective RoPE (input-dependent rotations, "rotation + decay") rotates q and k by angles that
// are a running sum of per-token phase increments φ_t instead of the fixed t·ω_i of RoPE:
//   P_t = θ_0 + Σ_{s ≤ t} φ_s            (the running phase, per sequence, pair i, head h)
//   θ_t = ω ⊙ P_t                        (ω: the temperature / frequency spectrum)
// Standard RoPE is the special case φ_s = 1, θ_0 = offset, ω_i = base^(−2i/K).
//
// Implementations (Impl) and the op names they report in errors:
//   reference            "<op>_reference"  plain float64 loops straight from the equations.
//   recurrent or chunk   "<op>"            the optimized kernel (one streaming pass; there is no
//                                          separate chunked formulation, so both select it).
// <op> is "selective_rope_phases", "rope_angles" or "apply_rotary". The optimized kernels split
// work over (sequence, head) pairs (apply_rotary: over blocks of tokens and heads), each computed
// by one thread in a fixed order, so results are bit-identical for any thread count.
//
// Dtypes: float32, float64, bfloat16 or float16 for every floating argument (they may differ;
// 16-bit values are converted to float32 on load). All views on one device (phasor/common.h:
// Device; phasor/ops.h lists the implementations with CUDA kernels). The optimized kernels compute
// in the dtype of the main input (φ, x), except that the running phase sums P_t (and the reverse
// sums of the backward) are ALWAYS accumulated in float64: a float32 sum over a 65,536 token
// sequence would lose most of its digits. The reference always computes in float64. Every requested
// output element is written (overwritten, never accumulated into).
#pragma once

#include <cstdint>

#include "phasor/common.h"

namespace phasor {

// ---------------------------------------------------------------------------------------------
// 1. Selective RoPE cumulative phases.
//
// Layouts:
//   phi:           [B, T, H, R]  phase increments φ_t (R = K/2 rotation pairs)
//   omega:         [H, R] (per head) or [R] (shared by all heads)
//   initial_phase: [N, H, R]     optional θ_0: the running phase P to start from (un-multiplied
//                                by ω), e.g. the final_phase of the previous piece when decoding.
//   cu_seqlens:    [N + 1] int32/int64, optional: packed batch, B must be 1; the sum restarts at
//                  every sequence start (empty sequences allowed). Without it N = B.
// Outputs:
//   theta:         [B, T, H, R]  θ_t = ω ⊙ P_t
//   final_phase:   [N, H, R]     optional: P at the sequence's last token, i.e. θ_0 + Σ_all φ,
//                                NOT multiplied by ω. Passing it as the next call's
//                                initial_phase continues the sequence exactly (up to rounding to
//                                the output dtype). For an empty sequence it is θ_0 (or 0).
struct RotaryPhaseParams {
  TensorView phi;
  TensorView omega;
  TensorView initial_phase;  // optional [N, H, R]
  TensorView cu_seqlens;     // optional [N + 1]
};

// Gradients (each optional; undefined = not computed). d_initial_phase requires initial_phase.
//   d_phi: [B, T, H, R], d_omega: omega's shape, d_initial_phase: [N, H, R].
struct RotaryPhaseGrads {
  TensorView d_phi, d_omega, d_initial_phase;
};

void selective_rope_phases_forward(const RotaryPhaseParams& params, Impl impl,
                                   const TensorView& theta, const TensorView& final_phase = {});

// d_theta: [B, T, H, R]; d_final_phase: [N, H, R], optional (treated as 0 when undefined).
//   dφ_s  = Σ_{t ≥ s} ω ⊙ dθ_t + dP_final       (within s's sequence)
//   dω    = Σ_{sequences, t} dθ_t ⊙ P_t         (also summed over heads when ω is [R])
//   dθ_0  = Σ_t ω ⊙ dθ_t + dP_final
void selective_rope_phases_backward(const RotaryPhaseParams& params, Impl impl,
                                    const TensorView& d_theta, const TensorView& d_final_phase,
                                    const RotaryPhaseGrads& grads);

// ---------------------------------------------------------------------------------------------
// 2. Standard RoPE angles from positions:
//   θ[b, t, i] = position_t · ω_i,   ω_i = base^(−2i/K),   i ∈ [0, K/2)
//   position_t = offset + (t − start of t's sequence): positions restart at offset for every
//   sequence of cu_seqlens (without cu_seqlens every batch row starts at offset).
// theta: [B, T, R] with R = K/2 (K must be even): angles depend on the position only and are
// shared by all heads, as in fla's rotary embedding. To feed apply_rotary, broadcast it over heads
// with a zero stride: TensorView::strided(data, dtype, {B, T, H, R}, {T·R, R, 0, 1}).
// Angles are computed in float64 and rounded to theta's dtype.
struct RopeAnglesParams {
  std::int64_t B = 1, T = 0;
  std::int64_t head_dim = 0;  // K (even)
  double base = 10000.0;      // must be finite and > 0
  std::int64_t offset = 0;    // position of each sequence's first token (decoding), ≥ 0
  TensorView cu_seqlens;      // optional [N + 1]
};
void rope_angles(const RopeAnglesParams& params, Impl impl, const TensorView& theta);

// ---------------------------------------------------------------------------------------------
// 3. Applying the rotation. For every rotation pair (a, b) of x and its angle θ:
//   y_a = x_a cos θ − x_b sin θ,   y_b = x_a sin θ + x_b cos θ.
// Layout of the pairs within the last dimension (K even, R = K/2):
//   half_split   (a, b) = (i, i + R)   GPT-NeoX / fla default
//   interleaved  (a, b) = (2i, 2i + 1) GPT-J
// x: [B, T, H, K]; theta: [B, T, H, R] (any strides, a zero stride over H broadcasts angles
// shared by heads); y: [B, T, H, K]. y must not overlap x unless it is exactly the same view.
// (RotaryLayout is declared in phasor/common.h: the fused kernels take it too.)

void apply_rotary_forward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                          Impl impl, const TensorView& y);

// Gradients given dy: [B, T, H, K] (each output optional):
//   dx = rotation of dy by −θ;   dθ = dy_b · y_a − dy_a · y_b   (y recomputed from x).
// d_theta: [B, T, H, R] and must own each element (no zero strides): to get the gradient of
// angles shared by heads, sum it over H.
void apply_rotary_backward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                           Impl impl, const TensorView& dy, const TensorView& dx,
                           const TensorView& d_theta);

}  // namespace phasor
