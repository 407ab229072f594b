// Internal: the forgetting-attention (FoX) kernels behind phasor/forgetting_attn.h.
//
// api.cpp validates every argument and builds a Problem; the kernels trust it. All three
// implementations split the work into (sequence, key/value head) items: an item owns the query
// heads of its group, so the group-summed dk/dv of a key/value head are written by exactly one
// item and every item runs start to finish on one thread (bit-identical for any thread count).
//
// The gate bias of a (query i, key j) pair is b_ij = c_i − c_j = Σ_{s ∈ (j, i]} g_s. No kernel
// forms it as a difference of cumulative sums over the sequence: every implementation adds up
// the gates between j and i directly (from a nearby point, in float64). As all gates are ≤ 0,
// these are sums of same-signed terms — no cancellation — and a zero gate (g = −inf) simply
// makes the sum −inf (never −inf − (−inf) = NaN), which masks the pair.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/check.h"
#include "phasor/forgetting_attn.h"

namespace phasor::detail::fox {

// window_size = none: every causal pair is in the window.
constexpr std::int64_t kNoWindow = std::numeric_limits<std::int64_t>::max();

// A validated call.
struct Problem {
  std::string op;  // the name used in error messages, e.g. "parallel_forgetting_attn"
  TensorView q, k, v, g;
  std::vector<Sequence> sequences;
  double scale = 1.0;
  std::int64_t window = kNoWindow;  // ≥ 1
  std::int64_t block_size = 64;     // Impl::chunk tile size
  std::int64_t HQ = 0, H = 0, K = 0, V = 0;
  // Optional rotation angles θ [B, T, H, K/2], per key head: the kernels rotate k_t and the q_t
  // of the key head's query group by θ_t right after loading them (common/rotation.h, (R1)), and
  // in the backward turn the gradients with respect to the rotated rows into dq, dk and dθ
  // ((R2), (R3)). Undefined: no rotation, and nothing of it runs.
  TensorView theta;
  RotaryLayout rotary_layout = RotaryLayout::half_split;

  std::int64_t group() const { return HQ / H; }  // query heads per key/value head
  std::int64_t num_items() const { return static_cast<std::int64_t>(sequences.size()) * H; }
};

// The first key visible from query i through the window (i − j < window), in sequence-local
// positions.
inline std::int64_t window_start(std::int64_t i, std::int64_t window) {
  return window > i ? 0 : i - window + 1;
}

// Forward: o [B, T, HQ, V]; lse [B, T, HQ] optional.
void reference_forward(const Problem& p, const TensorView& o, const TensorView& lse);
void chunk_forward(const Problem& p, const TensorView& o, const TensorView& lse);
void recurrent_forward(const Problem& p, const TensorView& o, const TensorView& lse);

// Backward: d_o [B, T, HQ, V]; o and lse optional (recomputed unless both are given; the
// reference always recomputes); each gradient optional. grads.dtheta (only with θ) is
// overwritten for every element: the q contributions of the key head's query group plus the k
// contribution.
void reference_backward(const Problem& p, const TensorView& d_o, const ForgettingAttnGrads& grads);
void chunk_backward(const Problem& p, const TensorView& d_o, const TensorView& o,
                    const TensorView& lse, const ForgettingAttnGrads& grads);
void recurrent_backward(const Problem& p, const TensorView& d_o, const TensorView& o,
                        const TensorView& lse, const ForgettingAttnGrads& grads);

}  // namespace phasor::detail::fox
