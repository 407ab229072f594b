// Gated DeltaNet (gated delta rule), forward and backward, as in fla's `chunk_gated_delta_rule` /
// `fused_recurrent_gated_delta_rule`.
//
// For each sequence and value head (state S ∈ R^{K×V}), decay first, then the delta correction:
//   S'  = exp(g_t) S_{t−1}
//   S_t = S' + β_t k_t (v_t − S'ᵀ k_t)ᵀ
//   o_t = S_tᵀ (scale · q_t)
// g is a scalar log-decay per token and value head (≤ 0, checked; −inf, a gate of exactly 0, is
// allowed), β ∈ [0, 2] (documented, not checked; β > 1 gives the transition I − β k kᵀ negative
// eigenvalues). With use_qk_l2norm_in_kernel, q and k are first divided by sqrt(Σx² + 1e-6) per
// token and head (and the backward differentiates through that normalisation). Without it, keep
// β‖k‖² ≤ 2 (e.g. normalised keys), or the state can grow without bound, as in the model itself.
// Grouped value heads: HV is a multiple of H, and value head hv reads q/k head hv / (HV / H).
// The chunked kernel uses the WY / UT-transform representation of the product of the chunk's
// generalised Householder transitions; it only ever exponentiates non-positive sums of gates
// taken within one chunk.
//
// Layouts (any strides; float32, float64, bfloat16 or float16 for every floating argument, and they
// may differ; 16-bit values are converted to float32 on load):
//   q, k:          [B, T, H, K]
//   v:             [B, T, HV, V]
//   g, beta:       [B, T, HV]
//   initial_state: [N, HV, K, V]  optional
//   cu_seqlens:    [N + 1] int32/int64, optional; packed variable-length batch. B must be 1, the
//                  sequences [cu[n], cu[n+1]) are independent (empty ones are allowed). Without
//                  it N = B.
// The compute type is q's dtype (float32 accumulates in float32, float64 in float64), except for
// Impl::reference, which always computes in float64 (16-bit inputs compute in float32). All views
// on one device (phasor/common.h: Device); phasor/ops.h lists the implementations with CUDA
// kernels. On a GPU device: fused_recurrent_gated_delta_rule (K ≤ 256) and chunk_gated_delta_rule
// (chunk_size 16, 32 or 64; any K, V; the chunk's triangular solve as the explicit inverse of M;
// matrix products on tensor cores for bfloat16 / float16 q — each operand rounded to q's type,
// whose error grows with the conditioning of M, so normalise q and k — and exact FMA tiles for
// float32 and float64).
// Errors (phasor::Error) name the fla op — "chunk_gated_delta_rule",
// "fused_recurrent_gated_delta_rule" or "gated_delta_rule_reference" — and the argument.
#pragma once

#include <cstdint>
#include <optional>

#include "phasor/common.h"

namespace phasor {

struct GatedDeltaRuleParams {
  TensorView q, k, v, g, beta;
  TensorView initial_state;     // optional [N, HV, K, V]
  TensorView cu_seqlens;        // optional [N + 1]
  std::optional<double> scale;  // default K^-1/2
  bool use_qk_l2norm_in_kernel = false;
  // Impl::chunk: the chunk length (any positive value on the cpu; 16, 32 or 64 on a GPU device).
  // Impl::recurrent backward: the state
  // checkpoint interval (memory O(T / chunk_size + chunk_size) states per value head).
  std::int64_t chunk_size = 64;
  // Optional rotation angles θ [B, T, H (q/k heads), K/2] (K even): q_t and k_t are rotated by θ_t
  // pair by pair inside the kernel (RoPE / Selective RoPE; see phasor/rotary.h for building θ),
  //   x_a' = x_a cos θ − x_b sin θ,   x_b' = x_a sin θ + x_b cos θ,
  // and the op then runs on the rotated q', k' everywhere: in o_t = S_tᵀ (scale · q'_t) and in
  // the delta-rule update S_t = S' + β_t k'_t (v_t − S'ᵀ k'_t)ᵀ. The rotated tensors are never
  // written out. Value head hv uses the angles of its q/k head hv / (HV / H). Rotation commutes
  // with use_qk_l2norm_in_kernel (it preserves norms). The decay is a scalar, so o depends on θ
  // only through differences θ_t − θ_s, as for RoPE: adding a constant c to every θ leaves o
  // unchanged when there is no initial state. The states are NOT invariant: they accumulate the
  // rotated k'_t, i.e. live in the rotated frame, and θ + c turns S_T into R(c) S_T (an initial
  // state must be R(c) S_0 for o to stay the same).
  TensorView theta;
  RotaryLayout rotary_layout = RotaryLayout::half_split;  // pairs (i, i + K/2) or (2i, 2i + 1)
};

// Gradients. Each view is optional (undefined: not computed); dh0 requires initial_state.
// Shapes are those of the matching input; any float dtype. Every element of a requested gradient
// is written (overwritten, never accumulated into).
struct GatedDeltaRuleGrads {
  TensorView dq, dk, dv, dg, dbeta, dh0;
  // [B, T, H, K/2], requires theta: the gradient through the rotation of q and of k (summed),
  // and over the value heads of each q/k head. Must own each element (no zero strides).
  TensorView dtheta;
};

// o: [B, T, HV, V]; final_state: [N, HV, K, V], optional (undefined: not computed).
// final_state may alias initial_state (in-place state update, e.g. for decoding one token at a
// time with Impl::recurrent and T = 1).
// chunk_states: optional, Impl::chunk only (a phasor::Error names it for the others):
// [num_chunk_states(q, cu_seqlens, chunk_size), HV, K, V] (phasor/common.h: the layout; fla's h),
// any float dtype, owning its elements. The forward writes into it the state entering every chunk
// of every value head (chunk 0's: initial_state, or zeros); a training step passes it on to
// gated_delta_rule_backward, which then reads the states instead of replaying the forward's
// recurrence on the cpu (on a GPU device the backward's state kernel also forms U_new, so it still
// runs and reads none of them).
// v_new: optional, Impl::chunk on the cpu only, and only with chunk_states: [B, T, HV, V] (v's
// shape; fla's v_new), any float dtype, owning its elements. The forward writes into it U_new,
// row t of value head h the delta rule's update u_t = β_t (v_t − a_t S_{t−1}ᵀ k_t) (S_t = a_t
// S_{t−1}
// + k_t u_tᵀ); a training step passes it on to gated_delta_rule_backward with chunk_states, which
// then reads U_new instead of solving for it again (the walk back's K S product and triangular
// solve: ~12% of its time at K = V = 128, for V values per token and value head kept).
void gated_delta_rule_forward(const GatedDeltaRuleParams& params, Impl impl, const TensorView& o,
                              const TensorView& final_state = {},
                              const TensorView& chunk_states = {}, const TensorView& v_new = {});

// Backward of gated_delta_rule_forward. d_o: [B, T, HV, V], the gradient of the loss with respect
// to o; d_final_state: [N, HV, K, V], optional (undefined: zero), the gradient with respect to
// final_state (dht in fla). chunk_states: optional (Impl::chunk only), what
// gated_delta_rule_forward wrote with the same params and inputs; trusted, not checked. In the
// compute dtype (float32, or float64 for float64 q) the gradients are bit-identical to a backward
// without them; a 16-bit dtype rounds each state once. v_new: optional, with chunk_states only,
// what the same forward wrote into its v_new; trusted, not checked; the same bits in the compute
// dtype, a 16-bit dtype rounds each row once.
void gated_delta_rule_backward(const GatedDeltaRuleParams& params, Impl impl, const TensorView& d_o,
                               const TensorView& d_final_state, const GatedDeltaRuleGrads& grads,
                               const TensorView& chunk_states = {}, const TensorView& v_new = {});

}  // namespace phasor
