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
#include "common/slices.h"
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
  // Optional additive GRAPE slopes: a = slope_q [B, T, HQ], b = slope_k [B, T, H]; the logit of
  // (i, j) gets −(i − j)(a_i + b_j) (slope_bias below), i, j sequence-local positions. Undefined:
  // 0. The kernels load them as float64 columns (zeros when absent) and skip every bias loop when
  // neither is given (has_slopes()).
  TensorView slope_q, slope_k;

  bool has_slopes() const { return slope_q.defined() || slope_k.defined(); }

  std::int64_t group() const { return HQ / H; }  // query heads per key/value head
  std::int64_t num_items() const { return static_cast<std::int64_t>(sequences.size()) * H; }
};

// The first key visible from query i through the window (i − j < window), in sequence-local
// positions.
inline std::int64_t window_start(std::int64_t i, std::int64_t window) {
  return window > i ? 0 : i - window + 1;
}

// The additive GRAPE bias of the pair (query at position i, key at position j ≤ i), in float64:
// −(i − j)(a_i + b_j) (GRAPE Eq. 4.6 with a_i, b_j the caller's ω-scaled gates; ALiBi: a_i = m).
// Its derivative with respect to a_i and to b_j is −(i − j).
inline double slope_bias(std::int64_t i, std::int64_t j, double a_i, double b_j) {
  return -static_cast<double>(i - j) * (a_i + b_j);
}

// Every element of a [B, T, heads] slope tensor must be finite (a phasor::Error naming `name` and
// the first bad index otherwise): an infinite slope would make (i − j)·slope NaN at i = j (0·inf),
// and the NaN would spread through the softmax row. (api.cpp)
void check_finite_slopes(const std::string& op, const char* name, const TensorView& x);

// The slope columns of one sequence: a of query head hq, b of key head h; zeros when absent.
inline void load_slopes(const TensorView& slope, const Sequence& seq, std::int64_t head,
                        Vec<double>& out) {
  if (slope.defined())
    load_column(slope, seq, head, out);
  else
    out = Vec<double>::Zero(seq.length);
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
