// Equivariant structured positional rotations (Choromanski & Lewis, "Equivariant Structured
// Positional Rotations", ../shared/papers/equivariant-structured-rotations.txt; "the paper").
//
// A commuting family of skew-symmetric generators {L_k} (k = 1..C, each K × K) has a joint real
// block decomposition (the paper's Lemma 1, eq. 3):
//   L_k = U · [ (⊕_{p<m} λ_{k,p} J) ⊕ 0_{K−2m} ] · Uᵀ,    J = [[0, −1], [1, 0]],
// with U orthogonal. Planes p < m (columns 2p, 2p+1 of U) span the ACTIVE subspace, the remaining
// columns the NULL space. The relative rotation (eq. 2, 11) is
//   R(r) = exp(Σ_k r_k L_k) = U · [ (⊕_p R2(θ_p(r))) ⊕ I ] · Uᵀ,   θ_p(r) = Σ_k λ_{k,p} r_k,
// and obeys R(r)ᵀR(s) = R(s − r) exactly (eq. 12). Applied through the decomposition it costs
// O(K·m) per token: u = U_actᵀ z, rotate each pair of u by θ_p, z' = z + U_act (R2 u − u).
//
// The structured Cayley post-rotation (eq. 14, 19): P = (I − S)(I + S)⁻¹ with S supported on the
// null space, S = N S_null Nᵀ (N = U's null columns), so that P = U diag(I_2m, Cayley(S_null)) Uᵀ
// is the identity on the active subspace and commutes with every R(r). The encoding of a token is
//   z ↦ R(r) · P · z                                    (eq. 19, R_sp(r) = R_STR(r) P_sp)
// and Theorem 1's logits α_ij = (2m)^{-1/2} (Π_act R_sp(r_i) q_i)ᵀ (Π_act R_sp(r_j) k_j) depend on
// r_j − r_i only. Because P ∈ 𝒜 commutes with R(r), R_sp(r_i)ᵀR_sp(r_j) = R(r_j − r_i) exactly,
// so the relative law holds for the full vectors too, not only their active parts.
//
// Implementations (Impl): reference = plain float64 loops over tokens (structured_rotation_
// reference in errors); recurrent or chunk = the optimized kernel (blocks of 64 tokens × head, the
// projections as Eigen matrix products in the dtype of x; bit-identical for any thread count).
// The decomposition and the Cayley transform are small dense problems solved once per parameter
// update: one float64 implementation (Eigen), no Impl argument.
//
// Dtypes: float32, float64, bfloat16 or float16 everywhere (16-bit values computed in float32).
// Every requested output element is written (overwritten, never accumulated into).
#pragma once

#include <cstdint>

#include "phasor/common.h"

namespace phasor {

// ---------------------------------------------------------------------------------------------
// 1. The joint block decomposition (Lemma 1).
//
// Numerically: the real Schur form of a random linear combination M = Σ c_k L_k (c ~ N(0, 1),
// seeded), whose 2×2 blocks are the joint planes (a generic combination splits planes that one
// generator alone leaves coincident), then λ_{k,p} read off each Uᵀ L_k U. Checked before: every
// L_k skew (‖L_k + L_kᵀ‖_F ≤ tol·s), every pair commuting (‖[L_i, L_j]‖_F ≤ tol·s², s = max_k
// ‖L_k‖_F); after: each L_k reconstructed from (U, Λ) to ‖·‖_F ≤ tol·s (else another combination
// is tried, then an Error). A plane is active when max_k |λ_{k,p}| > tol·s.
//
//   generators:        [C, K, K]  L_k (C ≥ 1, K ≥ 1), any strides
//   tolerance:         relative tolerance tol (finite, > 0)
//   seed:              seed of the random combination (results are deterministic given it)
// Outputs (basis and coefficients required, projectors optional):
//   basis:             [K, K]       U (orthogonal). Columns (2p, 2p+1), p < m: active plane p,
//                                   ordered by decreasing ‖λ_{·,p}‖₂, oriented so that the
//                                   largest-magnitude λ_{k,p} is positive; columns 2m.. : null
//                                   space (for odd K the last column is always null).
//   coefficients:      [C, K / 2]   Λ: λ_{k,p} for p < m, exactly 0 for p ≥ m.
//   active_projector:  [K, K]       Π_act = U_act U_actᵀ (eq. 9)
//   null_projector:    [K, K]       Π_null = I − Π_act (eq. 9)
// Returns m, the number of active planes. To feed structured_rotation_forward pass the active
// columns as a view: TensorView::strided(U, dtype, {K, 2m}, {K, 1}) and Λ's first m columns.
struct StructuredDecompositionParams {
  TensorView generators;
  double tolerance = 1e-8;
  std::uint64_t seed = 0x5eedULL;
};
struct StructuredDecompositionOutputs {
  TensorView basis, coefficients, active_projector, null_projector;
};
std::int64_t structured_decomposition(const StructuredDecompositionParams& params,
                                      const StructuredDecompositionOutputs& outputs);

// ---------------------------------------------------------------------------------------------
// 2. The encoding y = R(r) · P · x (eq. 11, 19), forward and backward.
//
//   x:             [B, T, H, K]  queries or keys
//   positions:     [B, T, H, C]  r of each token (any strides: a zero stride over H shares the
//                                positions between heads, as RoPE does)
//   basis:         [K, 2m]       U_act, orthonormal columns (the active columns of the
//                                decomposition's U; pair p = columns 2p, 2p+1). m = 0 allowed.
//   coefficients:  [C, m]        Λ
//   post_rotation: [K, K]        optional P (e.g. from structured_cayley_forward); absent = I
// y: [B, T, H, K]; y may be the same view as x (in place) but must not otherwise overlap it.
struct StructuredRotationParams {
  TensorView x, positions, basis, coefficients;
  TensorView post_rotation;  // optional
};
void structured_rotation_forward(const StructuredRotationParams& params, Impl impl,
                                 const TensorView& y);

// Gradients given dy [B, T, H, K] (each optional):
//   dx              = Pᵀ R(r)ᵀ dy                         [B, T, H, K]
//   d_positions     dr_k = Σ_p λ_{k,p} dθ_p,  dθ_p = g_b w_a − g_a w_b   [B, T, H, C]
//                   (w = rotated coordinates U_actᵀ y, g = U_actᵀ dy of the pair (a, b)); must
//                   own its elements (sum over H yourself for positions shared by heads)
//   d_coefficients  dλ_{k,p} = Σ_tokens r_k dθ_p         [C, m]
//   d_post_rotation dP = Σ_tokens (R(r)ᵀ dy) xᵀ           [K, K], requires post_rotation
// The basis U_act receives no gradient (it is a function of the generators, recomputed from them).
struct StructuredRotationGrads {
  TensorView dx, d_positions, d_coefficients, d_post_rotation;
};
void structured_rotation_backward(const StructuredRotationParams& params, Impl impl,
                                  const TensorView& dy, const StructuredRotationGrads& grads);

// ---------------------------------------------------------------------------------------------
// 3. The Cayley post-rotation (Lemma 3, eq. 14): P = (I − S)(I + S)⁻¹, computed as the linear
// solve (I + S) P = I − S (I ± S commute), never an explicit inverse.
//
//   s:          [n, n]  S (skew-symmetric for P to be a rotation; not checked, so that the
//                       perturbed S of Theorem 2's proof can be studied; I + S must be invertible,
//                       which it always is for skew S)
//   null_basis: [K, n]  optional N with orthonormal columns (the decomposition's null columns):
//                       P = I − N Nᵀ + N Cayley(S) Nᵀ, the structured family 𝒜 (identity on the
//                       active subspace). Absent: n = K and P = Cayley(S) on all of R^K.
//   p:          [K, K]  output
void structured_cayley_forward(const TensorView& s, const TensorView& null_basis,
                               const TensorView& p);
// ds = ∂L/∂S given dP = ∂L/∂P, every entry of S taken as independent: with A = (I + S)⁻¹ and
// dC = Nᵀ dP N, ds = −2 Aᵀ dC Aᵀ (from Cayley(S) = 2A − I). For a skew parameterisation S = W − Wᵀ
// the gradient of W is ds − dsᵀ.
void structured_cayley_backward(const TensorView& s, const TensorView& null_basis,
                                const TensorView& dp, const TensorView& ds);

}  // namespace phasor
