// Forgetting attention (FoX): softmax attention with a forget gate, as in fla's
// `parallel_forgetting_attn`.
//
// With c = inclusive cumulative sum of g over each sequence (per query head),
//   o_i = Σ_{j ≤ i, i − j < window} softmax_j(scale · q_i·k_j + c_i − c_j) v_j.
// c_i − c_j is the sum of the gates in (j, i], formed without a float32 running sum over the
// whole sequence. g is a log forget gate (≤ 0; −inf allowed: a gate of exactly 0 cuts attention
// to everything before it).
// Grouped queries: HQ is a multiple of H; query head hq reads key/value head hq / (HQ / H).
//
// Implementations: Impl::reference (plain loops, float64), Impl::chunk (tiled, flash-style online
// softmax: O(T) memory, never a T×T matrix), Impl::recurrent (token by token through
// ForgettingAttnCache, the decode path).
//
// Layouts (any strides; float32 or float64):
//   q:          [B, T, HQ, K]
//   k:          [B, T, H, K]
//   v:          [B, T, H, V]
//   g:          [B, T, HQ]
//   cu_seqlens: [N + 1] int32/int64, optional (B must be 1; see gla.h)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "phasor/common.h"

namespace phasor {

struct ForgettingAttnParams {
  TensorView q, k, v, g;
  TensorView cu_seqlens;                 // optional [N + 1]
  std::optional<double> scale;           // default K^-1/2
  std::optional<std::int64_t> window_size;  // none: full causal attention; else ≥ 1
  std::int64_t block_size = 64;          // Impl::chunk tile size (queries and keys)
};

struct ForgettingAttnGrads {
  TensorView dq, dk, dv, dg;  // each optional
};

// o: [B, T, HQ, V]. lse: [B, T, HQ], optional: the natural-log softmax normaliser of each row
// (saved for the backward pass).
void forgetting_attn_forward(const ForgettingAttnParams& params, Impl impl, const TensorView& o,
                             const TensorView& lse = {});

// d_o: [B, T, HQ, V]. o and lse are optional: pass the forward's outputs to skip recomputing them.
void forgetting_attn_backward(const ForgettingAttnParams& params, Impl impl, const TensorView& d_o,
                              const TensorView& o, const TensorView& lse,
                              const ForgettingAttnGrads& grads);

// Decoding with a key/value cache: feed one token per sequence at a time; the outputs equal the
// parallel forward's. The cache holds, per batch row, the keys, values and cumulative gates of
// the tokens seen so far (only the last window_size − 1 when a window is set).
class ForgettingAttnCache {
 public:
  ForgettingAttnCache(std::int64_t batch, std::int64_t num_q_heads, std::int64_t num_kv_heads,
                      std::int64_t head_dim, std::int64_t value_dim,
                      std::optional<std::int64_t> window_size = std::nullopt);
  ~ForgettingAttnCache();
  ForgettingAttnCache(ForgettingAttnCache&&) noexcept;
  ForgettingAttnCache& operator=(ForgettingAttnCache&&) noexcept;

  // q: [B, 1, HQ, K], k: [B, 1, H, K], v: [B, 1, H, V], g: [B, 1, HQ]; writes o: [B, 1, HQ, V].
  void step(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
            const TensorView& o, std::optional<double> scale = std::nullopt);
  std::int64_t length() const;  // tokens seen so far
  void reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace phasor
