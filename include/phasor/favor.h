// Performer FAVOR+: positive orthogonal random features for softmax attention (Choromanski et al.,
// "Rethinking Attention with Performers", 2021; our positional-encodings primer §Performer and
// the equivariant-structured-rotations paper's Performer section).
//
// Three ops:
//   1. favor_random_matrix      W [m, d] (or [H, m, d]): orthogonal random features.
//   2. favor_features_*         φ(x) = exp(Wx − |x|²/2 − c)/√m, positive softmax features.
//   3. favor_attention_*        o_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i, non-causal or causal.
//
// Why exp(−|x|²/2): for w ~ N(0, I_d), E[exp(wᵀx)] = exp(|x|²/2), so
//   E_w[exp(wᵀx − |x|²/2) · exp(wᵀy − |y|²/2)] = exp(|x + y|²/2 − |x|²/2 − |y|²/2) = exp(xᵀy),
// and φ(x)ᵀφ(y) with m rows of W is an unbiased estimate of the softmax kernel exp(xᵀy).
// (The equivariant-structured-rotations paper prints exp(+|x|²/2): that sign is wrong — the
// estimate would then have mean exp(xᵀy + |x|² + |y|²); tests/favor_test.cpp shows both.)
//
// Implementations (Impl) and the op names they report in errors:
//   reference            "<op>_reference"  plain float64 loops straight from the equations.
//   recurrent or chunk   "<op>"            the optimized kernel (Eigen products; the causal
//                                          attention runs phasor's chunked linear-attention
//                                          kernel, GLA with the key stabiliser's log gates; both
//                                          Impl values select it, and pick GLA's chunk or
//                                          recurrent kernel).
// <op> is "favor_features" or "favor_attention". Work is split over (sequence, head) pairs, each
// computed by one thread in a fixed order: results are bit-identical for any thread count.
// Dtypes: float32, float64, bfloat16 or float16 for every floating argument (they may differ;
// 16-bit values are converted to float32 on load); the optimized kernels compute in the dtype of x
// (features) or q (attention), the reference in float64. All views on the CPU. Every requested
// output element is written (overwritten, never accumulated into).
#pragma once

#include <cstdint>
#include <optional>

#include "phasor/common.h"

namespace phasor {

// ---------------------------------------------------------------------------------------------
// 1. Random feature matrix.
//
//   orthogonal_chi    (default) rows in blocks of d: each block is the Q factor of the QR
//                     decomposition of a d×d standard Gaussian matrix (Householder), with the
//                     signs fixed by diag(R) so that Q is Haar-distributed; the last block is
//                     truncated to m mod d rows. Row i is then rescaled to the norm of a fresh
//                     Gaussian d-vector (chi(d)-distributed), so each row is marginally N(0, I_d)
//                     — unbiased — while rows within a block stay exactly orthogonal (lower
//                     variance; Performer Thm. 2 / the primer's ORF section).
//   orthogonal_fixed  the same blocks with every row scaled to norm √d (the Performer code's
//                     "regularized" scaling). Rows are then not Gaussian, so the estimate of
//                     exp(xᵀy) is not exactly unbiased; it is offered for comparison.
//   iid               plain N(0, I_d) rows: the baseline, exactly unbiased, higher variance.
//
// Reproducible across platforms: the Gaussians come from std::mt19937_64(seed) (its output is
// fixed by the standard) through our own Box–Muller transform (std::normal_distribution is
// implementation-defined). A different seed redraws. For w: [H, m, d] the heads are drawn one
// after the other from the same generator (head h's matrix differs from head 0's).
enum class FavorMatrixKind : std::uint8_t { orthogonal_chi, orthogonal_fixed, iid };
const char* to_string(FavorMatrixKind kind);  // "orthogonal_chi" | "orthogonal_fixed" | "iid"

// w: [m, d] or [H, m, d], float32 or float64 (computed in float64, rounded to w's dtype).
// m ≥ 1, d ≥ 1 are taken from w's shape.
void favor_random_matrix(FavorMatrixKind kind, std::uint64_t seed, const TensorView& w);

// ---------------------------------------------------------------------------------------------
// 2. Positive softmax features.
//   φ(x)_r = exp(w_rᵀx − |x|²/2 − c) / √m,     r = 0 … m−1
// with the numerical stabiliser c (exp(−c) factors out of every feature of the group it is shared
// by, so overflow never happens and the largest feature of the group is exactly 1/√m):
//   query  c = max_r (w_rᵀx − |x|²/2), per token (row): it cancels between the numerator and the
//          normaliser of o_i.
//   key    c = max over ALL tokens t of the sequence and r of (w_rᵀx_t − |x_t|²/2), one constant
//          per (sequence, head): key features are summed over tokens (S = Σ φ(k_j) v_jᵀ,
//          z = Σ φ(k_j)), so only a constant shared by all of them factors out of S and z and
//          cancels in o. A per-token key stabiliser would reweight the tokens.
//   none   c = 0 (the plain features; overflows for large |x|).
// The backward treats c as a constant (the gradient of exp(wᵀx − |x|²/2 − c)/√m at fixed c).
// That is exact for the attention output, which does not depend on c at all; for the features on
// their own it is the gradient of the features up to the factor exp(−c).
// The attention (favor_attention_*, optimized kernels) stabilises its features otherwise, per
// feature, see below: with one constant for all features, a query whose features miss the
// largest keys' by more than ~100 in the exponent (|q̂|, |k̂| of ~100) gets φ(q̂)ᵀz = 0 in float32
// and o = 0/0, even for T = 1; and in the causal case a later key would scale every earlier key
// feature down to 0 — a future token changing past outputs.
enum class FavorStabilizer : std::uint8_t { query, key, none };

// Layouts:
//   x:          [B, T, H, d]
//   w:          [m, d] (shared by all heads) or [H, m, d] (per head)
//   cu_seqlens: [N + 1] int32/int64, optional (B must be 1): the key stabiliser is per packed
//               sequence. Without it each batch row is a sequence.
// Outputs: phi [B, T, H, m].
struct FavorFeatureParams {
  TensorView x, w;
  FavorStabilizer stabilizer = FavorStabilizer::query;
  TensorView cu_seqlens;
};
void favor_features_forward(const FavorFeatureParams& params, Impl impl, const TensorView& phi);
// d_phi: [B, T, H, m]. dx: [B, T, H, d] and dw: w's shape, each optional (undefined: not
// computed). With g_r = dφ_r · φ_r:  dx = Σ_r g_r (w_r − x),   dw_r = Σ_tokens g_r x  (summed over
// heads too when w is shared).
void favor_features_backward(const FavorFeatureParams& params, Impl impl, const TensorView& d_phi,
                             const TensorView& dx, const TensorView& dw);

// ---------------------------------------------------------------------------------------------
// 3. FAVOR+ attention. With q̂ = s·q, k̂ = s·k, s = scale^{1/2} (default scale = d^{−1/2}, i.e.
// q and k each scaled by d^{−1/4}, so that φ(q̂)ᵀφ(k̂) estimates exp(qᵀk/√d)):
//   o_i = φ(q̂_i)ᵀ S_i / φ(q̂_i)ᵀ z_i,   S_i = Σ_j φ(k̂_j) v_jᵀ,   z_i = Σ_j φ(k̂_j)
// over all j of the sequence (non-causal) or j ≤ i (causal): softmax attention with its
// normaliser, in O(T·m·(d + V)) instead of O(T²). Stabilisers, all of which cancel exactly in o:
// with u_j,r = w_rᵀk̂_j − |k̂_j|²/2, each feature r has its own key stabiliser c_r = max_j u_j,r
// over the sequence (non-causal), or the running c_t,r = max_{s ≤ t} u_s,r restarting at each
// sequence (causal: token t's key features depend on keys s ≤ t only), so every key feature is
// exp(u_j,r − c_r) ≤ 1; c_r moves to the queries, whose features are exp(w_rᵀq̂_i + c_r − C_i) with
// C_i their row max (|q̂_i|²/2 is common to a query's features and cancels in o_i). A_ij is then
// φ(q̂_i)·φ(k̂_j) times a factor of row i alone, and the normaliser is at least 1 (at the query's
// largest feature r*, whose z_r* holds the key that sets c_r*): no 0/0 for any finite input.
// The causal prefix sums run on phasor's GLA kernel (phasor/gla.h) with v extended by a column of
// ones (the normaliser z) and the log gates g_t,r = c_{t−1},r − c_t,r ≤ 0 (one per token and
// feature channel): GLA's S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ is then exactly the prefix sum
// Σ_{j ≤ t} exp(u_j,r − c_t,r) [v_j | 1]ᵀ of each feature. The backward holds the stabilisers
// constant (exact: o does not depend on them), so the gates' gradient is not needed. The float64
// reference computes the same attention in log space (a softmax over j of
// ℓ_ij = log Σ_r exp(e_q(i, r) + e_k(j, r))), which no input can underflow.
// Layouts: q, k [B, T, H, d]; v [B, T, H, V]; w [m, d] or [H, m, d]; cu_seqlens optional [N + 1]
// (B = 1; sequences are independent, empty ones allowed). o: [B, T, H, V].
struct FavorAttentionParams {
  TensorView q, k, v, w;
  TensorView cu_seqlens;
  bool causal = false;
  std::optional<double> scale;  // the softmax scale: default d^{−1/2}; must be finite and > 0
  // Impl::chunk / Impl::recurrent, causal: GLA's chunk size. Must be positive.
  std::int64_t chunk_size = 64;
};
struct FavorAttentionGrads {
  TensorView dq, dk, dv, dw;  // each optional; shapes of q, k, v, w
};
void favor_attention_forward(const FavorAttentionParams& params, Impl impl, const TensorView& o);
// d_o: [B, T, H, V]. Recomputes the features (nothing is saved between forward and backward).
void favor_attention_backward(const FavorAttentionParams& params, Impl impl, const TensorView& d_o,
                              const FavorAttentionGrads& grads);

}  // namespace phasor
