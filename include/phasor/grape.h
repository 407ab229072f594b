// Multiplicative GRAPE (GRAPE-M, "Group Representational Position Encoding", grape.txt): position
// encodings as one-parameter groups of rotations G(η) = exp(η L) in SO(K), forward and backward.
// (Additive GRAPE — ALiBi and the content-gated GRAPE-A-QK bias fused into FoX — lives in
// additive GRAPE: forgetting_attn.h.)
//
// Because G(η_i)ᵀ G(η_j) = G(η_j − η_i) exactly (§2.2), the logits of rotated queries and keys,
// (G(η_i) q_i)ᵀ (G(η_j) k_j) = q_iᵀ G(η_j − η_i) k_j, depend only on the relative position, while
// each token is still encoded on its own (caches and linear attention work as with RoPE, §2.5).
//
// Two forms:
//
// 1. Single-plane GRAPE-M (grape_forward / grape_backward), §2.1–2.3 and Appendix I.
//    A rank-2 skew generator per head  L = a bᵀ − b aᵀ  (a, b ∈ R^K learnable), the angle
//      η[b, t, h] = positions[b, t(, h)] · ω[h]                 (the paper's G(n) = exp(n ω L))
//    and, with α = |a|², β = |b|², γ = a·b, Δ = αβ − γ² ≥ 0, ν = √Δ (the plane's rotation rate),
//      y = exp(η L) z = z + (sin(ην)/ν) L z + ((1 − cos(ην))/ν²) L² z           (Rodrigues, §2.3)
//    which rotates span{a, b} by the angle ην and leaves its orthogonal complement unchanged.
//    Applied in O(K) per token without forming L: L z = a (b·z) − b (a·z). The kernels use the
//    orthogonalised pair (a, b⊥), b⊥ = b − (γ/α) a, which spans the same plane and gives the same L
//    (a b⊥ᵀ − b⊥ aᵀ = a bᵀ − b aᵀ), so that Δ = α |b⊥|² and L² z = −(|b⊥|² (a·z) a + α (b⊥·z) b⊥)
//    carry no cancellation when a and b are nearly parallel. sin(x)/x, (1 − cos x)/x² and the
//    derivatives the backward needs are evaluated by Taylor series for |x| < 1, so values and
//    gradients stay accurate as ν → 0; for ν = 0 (a ∥ b, or a = 0) G = I exactly.
//    Parameterisation (as in the paper): initialise |a| = |b| = 1, a ⊥ b (then ν = 1 and the angle
//    is position · ω); the scales of a and b are absorbed into the effective frequency ω ν
//    (Corollary 2.1). `positions` may be token indices (the paper's n ∈ Z), real positions, or
//    per-token, per-head phases (contextual GRAPE-M: e.g. cumulative sums from
//    selective_rope_phases with R = 1).
//
// 2. Multi-subspace GRAPE-M (grape_subspace_forward / grape_subspace_backward), §3, Prop. 3.1,
//    Algorithm 1 (Appendix H): K/2 commuting rank-2 generators on mutually orthogonal planes,
//    i.e. RoPE in a learned orthogonal basis B:
//      y = B · RoPE(θ) · Bᵀ z,     θ[b, t, h, i] = position · ω_i (or any angles)
//    The middle step is phasor's apply_rotary (rotary.h) with the given pair layout; with B = I it
//    IS apply_rotary, and with B = I, layout interleaved (the paper's canonical planes
//    (e_{2i−1}, e_{2i})) and θ from rope_angles it is the canonical RoPE exactly.
//    B is given by the caller and must be orthogonal (checked, see below). A convenient
//    parameterisation is the Cayley map of a skew matrix S = W − Wᵀ: B = (I − S)(I + S)^{-1}
//    (always orthogonal with det = +1), or B = exp(S); both are differentiable, so the caller
//    chains d_basis through them. For the exact relative law θ must be linear in the position
//    (θ = n · ω); contextual phases give the same per-token separability without it.
//
// Layouts (floating arguments: float32, float64, bfloat16 or float16, may differ; CPU):
//   z:          [B, T, H, K]  vectors to rotate (queries or keys), any strides
//   a, b:       [H, K] (per head) or [K] (shared by the heads); both of the same rank
//   omega:      [H]           per-head frequency ω
//   positions:  [B, T] (shared by the heads) or [B, T, H] (per head, e.g. contextual phases)
//   basis:      [K, K] or [H, K, K]   orthogonal B (columns are the basis vectors)
//   theta:      [B, T, H, K/2]        rotation angles (a zero stride over H broadcasts them)
//
// Implementations (Impl) and the op names they report in errors:
//   reference            "<op>_reference"  float64 loops straight from the equations: the dense
//                                          generator L (O(K²) per token) for grape, dense
//                                          products and apply_rotary's reference for the subspace.
//   recurrent or chunk   "<op>"            the optimized kernel (one pass over the tokens in
//                                          blocks; both select it).
// <op> is "grape" or "grape_subspace". The optimized kernels compute vector arithmetic in z's
// dtype; the per-token scalars (η, sin, cos, series) always in float64. Work is split over
// (batch row, head, block of tokens); parameter gradients are reduced over the blocks in a fixed
// order, so results are bit-identical for any thread count.
//
// Outputs are written, never accumulated into. y (dz) may be exactly the same view as z (dy);
// otherwise outputs must not overlap inputs.
#pragma once

#include <cstdint>
#include <limits>

#include "phasor/common.h"

namespace phasor {

// ---------------------------------------------------------------------------------------------
// 1. Single-plane GRAPE-M.
struct GrapeParams {
  TensorView z;          // [B, T, H, K]
  TensorView a, b;       // [H, K] or [K]
  TensorView omega;      // [H]
  TensorView positions;  // [B, T] or [B, T, H]
};

// Gradients (each optional; undefined = not computed), shaped like their inputs:
//   dz = G(η)ᵀ dy = G(−η) dy
//   da, db (summed over the batch, tokens, and over the heads when a, b are [K])
//   d_omega[h]   = Σ_{b,t} dη[b,t,h] · positions[b,t(,h)]
//   d_positions  = dη · ω  (summed over heads when positions are [B, T])
// with dη = cos(ην) dyᵀ L z + (sin(ην)/ν) dyᵀ L² z.
struct GrapeGrads {
  TensorView dz, da, db, d_omega, d_positions;
};

void grape_forward(const GrapeParams& params, Impl impl, const TensorView& y);
void grape_backward(const GrapeParams& params, Impl impl, const TensorView& dy,
                    const GrapeGrads& grads);

// ---------------------------------------------------------------------------------------------
// 2. Multi-subspace GRAPE-M: y = B · RoPE(θ) · Bᵀ z.
struct GrapeSubspaceParams {
  TensorView z;      // [B, T, H, K], K even
  TensorView basis;  // [K, K] (shared) or [H, K, K] (per head), orthogonal
  TensorView theta;  // [B, T, H, K/2]
  RotaryLayout layout = RotaryLayout::half_split;  // pairs of the middle RoPE (see common.h)
  // Every call checks max |BᵀB − I| ≤ orthogonality_tol (an O(H K³) check, small next to the op
  // for T ≫ K) and raises phasor::Error otherwise: a non-orthogonal B silently breaks the relative
  // law and norm preservation. The default admits float32 rounding of a Cayley/exp-built B;
  // +infinity disables the check (the caller then guarantees orthogonality).
  double orthogonality_tol = 1e-4;
};

// Gradients (each optional), with x1 = Bᵀ z, x2 = RoPE(θ) x1 (per token):
//   dz = B · RoPE(−θ) · Bᵀ dy
//   d_basis = Σ_tokens (dy x2ᵀ + z dx1ᵀ), dx1 = RoPE(−θ) Bᵀ dy   (summed over heads for [K, K])
//   d_theta = apply_rotary's dθ of the middle step  ([B, T, H, K/2], must own its elements)
struct GrapeSubspaceGrads {
  TensorView dz, d_basis, d_theta;
};

void grape_subspace_forward(const GrapeSubspaceParams& params, Impl impl, const TensorView& y);
void grape_subspace_backward(const GrapeSubspaceParams& params, Impl impl, const TensorView& dy,
                             const GrapeSubspaceGrads& grads);

}  // namespace phasor
