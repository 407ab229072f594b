// Forgetting attention (FoX): softmax attention with a forget gate, as in fla's
// `parallel_forgetting_attn`.
//
// With c = inclusive cumulative sum of g over each sequence (per query head),
//   o_i = Σ_{j ≤ i, i − j < window} softmax_j(scale · q_i·k_j + c_i − c_j) v_j.
// c_i − c_j is the sum of the gates in (j, i]; every implementation adds those gates up directly
// in float64 (never a difference of cumulative sums, never a float32 running sum over the
// sequence). g is a log forget gate (≤ 0; −inf allowed: a gate of exactly 0 at position s cuts
// every query at or after s off from the keys before s). The first gate of a sequence never
// enters any sum, so its gradient is 0.
// Grouped queries: HQ is a multiple of H; query head hq reads key/value head hq / (HQ / H).
//
// Implementations: Impl::reference (plain loops, float64), Impl::chunk (tiled, flash-style online
// softmax in tiles of block_size × block_size: O(T) memory, never a T×T matrix; its backward
// holds up to ~2.1 · T · (K + V) values more per (sequence, key head) in flight, the partial dk,
// dv sums of the segments a long sequence is cut into),
// Impl::recurrent (each sequence decoded token by token through a key/value cache, as
// ForgettingAttnCache does; its backward is the exact token-by-token adjoint).
// The compute type is q's dtype (float32 computes and accumulates in float32, gate sums and the
// gate gradient's accumulations in float64), except Impl::reference: float64 throughout. Results
// are bit-identical for any thread count.
//
// Additive GRAPE position biases (optional; GRAPE paper, Sections 4–4.2 and Appendix C): with
// per-query slopes a [B, T, HQ] and per-key slopes b [B, T, H] the logits become
//   ℓ_ij = scale · q_i·k_j + (c_i − c_j) − (i − j)(a_i + b_j),
// i, j the positions within the sequence (restarting at 0 in each cu_seqlens sequence). Only
// i − j enters, so the bias obeys the exact relative law (shifting a sequence changes nothing).
//   ALiBi (Sec. 4.2):       a_i = m_h (the head's slope, constant), b = 0.
//   GRAPE-A-QK (Eq. 4.6):   a_i = ω·softplus(vᵀq_i/√d), b_j = ω·softplus(uᵀk_j/√d): the caller
//                           computes the slopes (and takes da, db back through them).
//   GRAPE-A-Q / GRAPE-A-K:  only a, or only b.
//   FoX itself (App. C) is the path-additive case with edge potentials ψ(t, s) = g_s: the gate
//   sum Σ_{s ∈ (j, i]} g_s. With a constant gate g_s = −m it equals −m (i − j): the same logits as
//   ALiBi with a_i = m, b = 0 (tested). The two compose: gates and slopes may be given together.
// Slopes of any sign are accepted (a softmax needs no sign); they must be finite. a follows the
// query head, b the key/value head: all query heads of a group share b_j, and db sums over them.
// The bias is formed in float64 and added to the gate sum before the one rounding to the compute
// type; da, db are accumulated in float64. (The paper's (j − i)·ω·[…] is −(i − j)·ω·[…]: the same.
// Its App. C writes the FoX potential as U_u = Σ_{ℓ<u} a_ℓ; U_t − U_j then sums [j, t), not
// (j, t]: the potential must be the inclusive Σ_{ℓ≤u}, as c above — shown by a test.)
//
// Layouts (any strides; float32, float64, bfloat16 or float16 for every floating argument, and they
// may differ; 16-bit values are converted to float32 on load; all views on one device, see
// phasor/common.h: Device and phasor/ops.h for the implementations with CUDA kernels):
//   q:          [B, T, HQ, K]
//   k:          [B, T, H, K]
//   v:          [B, T, H, V]
//   g:          [B, T, HQ]
//   bias_q_slope: [B, T, HQ], optional (a above)
//   bias_k_slope: [B, T, H], optional (b above)
//   cu_seqlens: [N + 1] int32/int64, optional: packed variable-length batch; B must be 1 and the
//               sequences [cu[n], cu[n+1]) are independent (empty ones are allowed).
// Errors (phasor::Error) name the op — "parallel_forgetting_attn" (chunk),
// "forgetting_attn_recurrent", "forgetting_attn_reference", "ForgettingAttnCache::step" — and
// the argument.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "phasor/common.h"

namespace phasor {

struct ForgettingAttnParams {
  TensorView q, k, v, g;
  TensorView cu_seqlens;                    // optional [N + 1]
  std::optional<double> scale;              // default K^-1/2
  std::optional<std::int64_t> window_size;  // none: full causal attention; else ≥ 1
  // Impl::chunk tile size (queries and keys). On a GPU device (Device::cuda, Device::emulated) 16,
  // 32 or 64, an upper bound: the kernels halve it (down to 8) while K and V need the shared
  // memory; there K, V ≤ 256.
  std::int64_t block_size = 64;
  // Optional rotation angles θ [B, T, H (key heads), K/2] (K even): q_t and k_t are rotated by θ_t
  // pair by pair inside the kernel (RoPE / Selective RoPE; see phasor/rotary.h for building θ),
  //   x_a' = x_a cos θ − x_b sin θ,   x_b' = x_a sin θ + x_b cos θ,
  // and the op then runs on the rotated q', k'. The rotated tensors are never written out.
  // θ is per KEY head: query head hq is rotated by the angles of its key head hq / (HQ / H).
  // Logits depend on θ only through θ_i − θ_j (q_i'·k_j' = q_iᵀ R(θ_j − θ_i) k_j), so adding the
  // same constant to every θ changes no output and no gradient. θ may have another float dtype
  // than q; cos θ and sin θ are evaluated in float64 when θ is float64 (large running phases).
  // Undefined: no rotation, and no cost.
  TensorView theta;
  RotaryLayout rotary_layout = RotaryLayout::half_split;  // pairs (i, i + K/2) or (2i, 2i + 1)
  // Optional additive GRAPE slopes (see the top of this file): the logit of (query i, key j)
  // gets −(i − j)(a_i + b_j). bias_q_slope = a: [B, T, HQ], one slope per query token and query
  // head (ALiBi: the head's slope m_h at every token). bias_k_slope = b: [B, T, H], one slope per
  // key token and key/value head, shared by the query heads of its group. Finite values, any
  // float dtype; either, both or neither. Undefined: that term is 0, and costs nothing.
  TensorView bias_q_slope, bias_k_slope;
  // Backward only, optional [B, T, HQ] (any float dtype; Impl::chunk and Impl::recurrent on the
  // cpu): for each query row i, Σ_j dℓ_ij over the keys of its softmax that are NOT in this call
  // (context parallelism, phasor/context_parallel.h: the keys of other ranks; o and lse passed to
  // the backward must then be the results over all keys). The backward forms the logit gradient
  // of a dominant key (P_ij* > 1/2) from the rest of its row, dℓ_ij* = −Σ_{j≠j*} dℓ_ij, since the
  // whole row sums to 0 (accurate where P_ij* ≈ 1 makes P(dP − D) cancel); with keys elsewhere
  // the rest of the row includes these sums. Undefined: every key is in the call (sums of 0).
  TensorView dlogit_sums_elsewhere;
};

struct ForgettingAttnGrads {
  TensorView dq, dk, dv, dg;  // each optional
  // dtheta: [B, T, H, K/2], requires theta; every element is written (overwritten). Per key head
  // h and token t: the contributions of the rotated q_t of every query head of h's group plus
  // that of the rotated k_t. Must own each element (no zero strides). Requesting it alone costs
  // the dq and dk computation.
  TensorView dtheta;
  // Gradients of the additive GRAPE slopes, each optional, and each requires its slope:
  //   dbias_q_slope [B, T, HQ]: da_i = −Σ_j (i − j) dℓ_ij;
  //   dbias_k_slope [B, T, H]:  db_j = −Σ_{hq in the group} Σ_i (i − j) dℓ_ij.
  TensorView dbias_q_slope, dbias_k_slope;
};

// o: [B, T, HQ, V]. lse: [B, T, HQ], optional: the natural-log softmax normaliser of each row,
// lse_i = log Σ_j exp(ℓ_ij) (max included; saved for the backward pass).
void forgetting_attn_forward(const ForgettingAttnParams& params, Impl impl, const TensorView& o,
                             const TensorView& lse = {});

// d_o: [B, T, HQ, V]. o and lse are optional: pass both of the forward's outputs to skip
// recomputing them (if either is missing, both are recomputed; Impl::reference always
// recomputes). Gradients: dq like q, dk like k, dv like v, dg like g (and dbias_q_slope,
// dbias_k_slope like the slopes); each optional (undefined: not computed); any float dtype. dk, dv
// and dbias_k_slope sum over the query heads of each group.
void forgetting_attn_backward(const ForgettingAttnParams& params, Impl impl, const TensorView& d_o,
                              const TensorView& o, const TensorView& lse,
                              const ForgettingAttnGrads& grads);

// Decoding with a key/value cache: feed one token per sequence at a time; the outputs equal the
// parallel forward's. The cache holds, per batch row and key/value head, the keys and values of
// the tokens seen so far (only the last window_size − 1 when a window is set, in a ring buffer)
// and, per query head, each cached token's log decay Σ_{s ∈ (p, t]} g_s up to the current token
// (float64). The compute type is q's dtype at the first step after construction or reset();
// later steps must use the same q dtype. Errors name "ForgettingAttnCache" (constructor) or
// "ForgettingAttnCache::step"; a failed step changes nothing.
// Devices: the views of the first step after construction or reset() fix where the cache lives
// and computes — Device::cpu (host memory, the CPU kernels), Device::cuda (GPU memory, the CUDA
// decode kernels on the current stream) or Device::emulated (the same kernels on the emulated GPU);
// later steps must pass views on that device. On a GPU device a step queues three kernels (append
// the token, split-key attention, combine the splits) after the value check of g and the slopes,
// which reads one verdict back (one host sync per step); the cache grows by doubling up to the
// window. Limits there: V ≤ about 3,000 (float32 compute; half that in float64), a clear error
// beyond.
// With additive GRAPE slopes the cache also holds each cached token's key slope b_p and its
// position p (the number of steps since construction or reset(): every batch row is one sequence
// starting at position 0), so a new token t adds −(t − p)(a_t + b_p) to its logit against p.
class ForgettingAttnCache {
 public:
  ForgettingAttnCache(std::int64_t batch, std::int64_t num_q_heads, std::int64_t num_kv_heads,
                      std::int64_t head_dim, std::int64_t value_dim,
                      std::optional<std::int64_t> window_size = std::nullopt);
  ~ForgettingAttnCache();
  ForgettingAttnCache(ForgettingAttnCache&&) noexcept;
  ForgettingAttnCache& operator=(ForgettingAttnCache&&) noexcept;

  // q: [B, 1, HQ, K], k: [B, 1, H, K], v: [B, 1, H, V], g: [B, 1, HQ]; writes o: [B, 1, HQ, V].
  // theta: [B, 1, H, K/2], optional: this token's rotation angles (as ForgettingAttnParams::theta);
  // the cache keeps keys already rotated, so each key is rotated once, and the token's queries
  // are rotated by the θ of their key head. The first step after construction or reset() fixes
  // whether the cache rotates and with which rotary_layout: a later step without theta (or with
  // it, if the first had none) fails naming 'theta', one with another layout naming
  // 'rotary_layout'.
  // bias_q_slope: [B, 1, HQ], bias_k_slope: [B, 1, H], optional: this token's additive GRAPE
  // slopes a_t, b_t (as in ForgettingAttnParams). A missing slope is 0 (for b: the cached b_t is
  // 0), so steps with and without them may be mixed.
  void step(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
            const TensorView& o, std::optional<double> scale = std::nullopt,
            const TensorView& theta = {}, RotaryLayout rotary_layout = RotaryLayout::half_split,
            const TensorView& bias_q_slope = {}, const TensorView& bias_k_slope = {});
  std::int64_t length() const;  // tokens seen so far
  void reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace phasor
