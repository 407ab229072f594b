// Internal: the forgetting-attention (FoX) kernels behind phasor/forgetting_attn.h.
//
// api.cpp validates every argument and builds a Problem (forgetting_attn/problem.h); the kernels
// trust it. All three
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

#include "common/check.h"
#include "common/slices.h"
#include "forgetting_attn/problem.h"
#include "phasor/forgetting_attn.h"

namespace phasor::detail::fox {

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
