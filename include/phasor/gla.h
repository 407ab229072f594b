// Gated Linear Attention (GLA), forward and backward, as in fla's `chunk_gla` /
// `fused_recurrent_gla`.
//
// For each sequence and head, with state S ∈ R^{K×V}:
//   S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,      o_t = S_tᵀ (scale · q_t),      S_0 =
//   initial_state.
// g holds natural-log forget gates (≤ 0, per token and key channel); g = −inf (a gate of exactly 0)
// is allowed. Strong gates are handled without exp(+big) factorisations: the chunked kernel only
// ever exponentiates non-positive sums of gates accumulated within a chunk (never over the whole
// sequence, never as the difference of two cumulative sums), and its gate gradient sums only the
// terms that carry the gate's own decay, so it keeps full relative precision even when every gate
// is exp(−20).
//
// Implementations (Impl) and the op name they report in errors:
//   reference  "gla_reference"        float64 loops over the recurrence; stores every state in
//                                      the backward (O(T·K·V) memory: small inputs only).
//   recurrent  "fused_recurrent_gla"  token by token; the backward checkpoints the state every
//                                      chunk_size tokens (O(T/C·K·V + C·K·V) memory).
//   chunk      "chunk_gla"            chunks of chunk_size tokens with dense products; the
//                                      backward keeps one state per chunk (O(T/C·K·V) memory).
// Every CPU implementation computes each (sequence, head) pair on one thread in a fixed order, so
// results are bit-identical for any thread count. On a GPU device (Device::cuda, emulated):
// fused_recurrent_gla (K ≤ 256) and chunk_gla (chunk_size 16, 32 or 64; any K and V; matrix
// products on tensor cores for bfloat16 / float16 q, each operand rounded to q's 16-bit type,
// exact FMA tiles for float32 and float64), both bit-identical run to run.
//
// Layouts (any strides; float32, float64, bfloat16 or float16 for every floating argument, and they
// may differ; 16-bit values are converted to float32 on load):
//   q, k:          [B, T, H, K]
//   v:             [B, T, H, V]
//   g:             [B, T, H, K]
//   initial_state: [N, H, K, V]  optional
//   cu_seqlens:    [N + 1] int32/int64, optional; packed variable-length batch. B must be 1, the
//                  sequences [cu[n], cu[n+1]) are independent (empty ones are allowed). Without
//                  it N = B.
// The compute type is q's dtype (float32 accumulates in float32, float64 in float64), except for
// Impl::reference, which always computes in float64 (16-bit inputs compute in float32). All views
// on one device (phasor/common.h: Device); phasor/ops.h lists the implementations with CUDA
// kernels.
#pragma once

#include <cstdint>
#include <optional>

#include "phasor/common.h"

namespace phasor {

struct GlaParams {
  TensorView q, k, v, g;
  TensorView initial_state;     // optional [N, H, K, V]
  TensorView cu_seqlens;        // optional [N + 1]
  std::optional<double> scale;  // default K^-1/2
  // Impl::chunk: tokens per chunk (any positive value on the cpu, 16, 32 or 64 on a GPU device; T
  // need not be a multiple). Impl::recurrent:
  // tokens between two state checkpoints of the backward, and the input segment length. Must be
  // positive for both; ignored by Impl::reference.
  std::int64_t chunk_size = 64;
  // Optional rotation angles θ [B, T, H, K/2] (K even): q_t and k_t are rotated by θ_t
  // pair by pair inside the kernel (RoPE / Selective RoPE; see phasor/rotary.h for building θ),
  //   x_a' = x_a cos θ − x_b sin θ,   x_b' = x_a sin θ + x_b cos θ,
  // and the op then runs on the rotated q', k'. The rotated tensors are never written out.
  // Every implementation supports it (reference, recurrent incl. segments, chunk), forward and
  // backward (GlaGrads::dtheta). Angles shared by all heads may be passed with a zero stride
  // over H.
  // The states (initial_state, final_state) hold rotated keys: they are in the frame of
  // zero angles, so decoding token by token, each call given its token's θ_t, continues a
  // sequence exactly.
  // With the gate g tied across each rotation pair (g_a = g_b), S_t is the paper's complex
  // recurrence (per pair, a complex channel with decay exp(g_a) e^{−i(θ_t − θ_{t−1})} in the
  // frame of the current token) and o depends on θ only through differences θ_t − θ_s: adding a
  // constant c to every θ leaves o unchanged when there is no initial_state (an initial state
  // would have to be turned by c too), while the final state turns by c. With untied gates that
  // invariance does not hold.
  TensorView theta;
  RotaryLayout rotary_layout = RotaryLayout::half_split;  // pairs (i, i + K/2) or (2i, 2i + 1)
};

// Gradients. Each view is optional: an undefined view is not computed. dh0 requires
// initial_state (else phasor::Error). Shapes are those of the matching input; any float dtype.
// Every element of a requested view is written (overwritten, never accumulated into).
struct GlaGrads {
  TensorView dq, dk, dv, dg, dh0;
  // [B, T, H, K/2]; requires theta. The sum of the contributions through q and through k (they
  // share θ_t). Must own each element (no zero strides): for angles shared by the heads, sum it
  // over H.
  TensorView dtheta;
};

// o: [B, T, H, V]; final_state: [N, H, K, V], optional (undefined: not computed).
// final_state may alias initial_state (in-place state update, e.g. for decoding one token at a
// time with Impl::recurrent and T = 1).
// chunk_states: optional, Impl::chunk only (a phasor::Error names it for the others):
// [num_chunk_states(q, cu_seqlens, chunk_size), H, K, V] (phasor/common.h: the layout; fla's h),
// any float dtype, owning its elements. The forward writes into it the state entering every chunk
// (chunk 0's: initial_state, or zeros); a training step passes it on to gla_backward, which then
// reads the states instead of replaying the state recurrence (one of its five K × V products per
// token; docs/performance.md). K·V values per chunk and head: at K = V = 128, C = 64 half the size
// of q, k, v and g in float32.
void gla_forward(const GlaParams& params, Impl impl, const TensorView& o,
                 const TensorView& final_state = {}, const TensorView& chunk_states = {});

// Backward of gla_forward. d_o: [B, T, H, V], the gradient of the loss with respect to o;
// d_final_state: [N, H, K, V], optional, the gradient with respect to final_state (dht in fla).
// chunk_states: optional (Impl::chunk only), what gla_forward wrote with the same params and
// inputs; the backward trusts them (they are not recomputed to be checked). In the compute dtype
// (float32, or float64 for float64 q) the gradients are bit-identical to a backward without
// them; a 16-bit dtype rounds each state once.
void gla_backward(const GlaParams& params, Impl impl, const TensorView& d_o,
                  const TensorView& d_final_state, const GlaGrads& grads,
                  const TensorView& chunk_states = {});

}  // namespace phasor
