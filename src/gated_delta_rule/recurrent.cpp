// Gated DeltaNet, recurrent (fla's fused_recurrent_gated_delta_rule): the recurrence token by
// token in the compute type (float32 for float32 q, float64 for float64 q), with S held in a
// dense K × V matrix. Also the single-token decode path (T = 1, state fed back in place).
//
// Backward: the forward is replayed keeping only the state every chunk_size tokens
// (checkpoints); the sequence is then walked backwards segment by segment, each segment's states
// being recomputed from its checkpoint. Memory per work item (G = HV/H value heads):
// O(G · T/C · K · V) checkpoints + O(C · K · V) for one segment's states; inputs are loaded one
// block of tokens at a time.
// With θ, q and k are rotated as each block is loaded (load_qk, kernels.h), in the forward, the
// checkpoint replay and the backward walk alike; the backward walk's angles also serve to unrotate
// the block's dq, dk and give its dθ (store_qk_grads).

#include "common/eigen.h"  // first: see there

#include <cmath>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/kept_buffers.h"
#include "common/packets.h"
#include "common/parallel.h"
#include "gated_delta_rule/kernels.h"

namespace phasor::detail::gdn {
namespace {

// One step of the recurrence, reading `prev` = S_{t−1} and writing `next` = S_t (they may be the
// same matrix):  r = v − a·S_{t−1}ᵀk,  S_t = a·S_{t−1} + k (β r)ᵀ,  and, if `out` is given,
// out = S_tᵀ q̃. Two passes over the rows of S: the first forms S_{t−1}ᵀ k, the second updates
// each row and accumulates the output while the row is in cache.
template <class S, class Prev, class Next>
void advance(const Prev& prev, Next& next, const S* k, const S* q, const RowVec<S>& v, S g, S beta,
             RowVec<S>& scratch, RowVec<S>* out) {
  const Eigen::Index K = prev.rows();
  const S a = std::exp(g);
  RowVec<S>& u = scratch;
  u.setZero(prev.cols());
  for (Eigen::Index i = 0; i < K; ++i) u.noalias() += k[i] * prev.row(i);  // S_{t−1}ᵀ k
  u = beta * (v - a * u);                                                  // β_t r_t
  if (out) out->setZero(prev.cols());
  for (Eigen::Index i = 0; i < K; ++i) {
    next.row(i) = a * prev.row(i) + k[i] * u;
    if (out) out->noalias() += q[i] * next.row(i);
  }
}

// advance() in float32 for V = 16 · NP ≤ 128 columns, defined with AVX-512 only (reached through
// with_float_packets_of_16, which calls nothing otherwise): see below.
template <int NP>
void advance_in_registers(float* state, std::int64_t K, const float* k, const float* q,
                          const float* v, float a, float beta, float* out);

#if defined(__AVX512F__)
// advance() in float32 with the state updated in place and the output given, for V = 16 · NP
// columns (V ≤ 128): S_{t−1}ᵀ k, β r and o are held in registers (NP packets each) across all K
// rows, so each pass reads (and the second writes) every state packet once, with no vector
// stored and reloaded per row. Same operations, in the same order per element, as advance().
template <int NP>
void advance_in_registers(float* state, std::int64_t K, const float* k, const float* q,
                          const float* v, float a, float beta, float* out) {
  __m512 u[NP], acc[NP];
  for (int j = 0; j < NP; ++j) u[j] = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < K; ++i) {
    const __m512 key = _mm512_set1_ps(k[i]);
    for (int j = 0; j < NP; ++j)
      u[j] = _mm512_fmadd_ps(key, _mm512_loadu_ps(state + i * 16 * NP + 16 * j), u[j]);
  }
  const __m512 decay = _mm512_set1_ps(a), scale = _mm512_set1_ps(beta);
  for (int j = 0; j < NP; ++j) {
    u[j] = _mm512_mul_ps(scale, _mm512_fnmadd_ps(decay, u[j], _mm512_loadu_ps(v + 16 * j)));
    acc[j] = _mm512_setzero_ps();
  }
  for (std::int64_t i = 0; i < K; ++i) {
    float* row = state + i * 16 * NP;
    const __m512 key = _mm512_set1_ps(k[i]), query = _mm512_set1_ps(q[i]);
    for (int j = 0; j < NP; ++j) {
      const __m512 updated =
          _mm512_fmadd_ps(decay, _mm512_loadu_ps(row + 16 * j), _mm512_mul_ps(key, u[j]));
      _mm512_storeu_ps(row + 16 * j, updated);
      acc[j] = _mm512_fmadd_ps(query, updated, acc[j]);
    }
  }
  for (int j = 0; j < NP; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

#endif

// Tokens are loaded (and outputs stored) this many at a time, so buffers stay small.
constexpr std::int64_t kLoadBlock = 64;

// The buffers of forward_item, kept per thread across calls: decoding calls the forward once per
// token, and allocating them afresh (about a dozen small allocations per value head) cost more
// than the arithmetic of a small model's token.
template <class S>
struct ForwardScratch {
  std::vector<Mat<S>> owned;
  std::vector<StateMap<S>> states;  // over final_state's slices, or over `owned`
  QKInputs<S> qk;
  ValueInputs<S> in;
  Mat<S> out;
};

// in_place: the states may live in final_state (states_in_place_allowed, slices.h); each value
// head's state is then updated there when its slice's layout allows (state_in_place), in an owned
// matrix otherwise. Bit-identical either way.
template <class S>
void forward_item(const Problem& p, std::int64_t item, const TensorView& o,
                  const TensorView& final_state, bool in_place) {
  const std::int64_t n = p.item_sequence(item), h = p.item_head(item), G = p.group;
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  // Owned states are stored only at the end, after every initial state has been read (they may
  // alias). In-place states are final_state's own slices: initial_state is then either that
  // same view (nothing to load) or disjoint from it (states_in_place_allowed).
  thread_local ForwardScratch<S> w;
  // Plain references, not a structured binding: the AVX-512 step below captures them in a lambda,
  // which C++17 allows for variables only (clang rejects captured bindings).
  auto& owned = w.owned;
  auto& states = w.states;
  auto& qk = w.qk;
  auto& in = w.in;
  auto& out = w.out;
  RowVec<S> v_row, scratch, o_row;
  if (owned.size() < static_cast<std::size_t>(G)) owned.resize(static_cast<std::size_t>(G));
  states.clear();
  const bool aliased = same_view(p.initial_state, final_state);
  for (std::int64_t r = 0; r < G; ++r) {
    Mat<S>& mine = owned[static_cast<std::size_t>(r)];
    S* target = in_place ? state_in_place<S>(final_state, n, h * G + r) : nullptr;
    if (target == nullptr || !aliased) load_initial_state(p, n, h * G + r, mine);
    states.emplace_back(target != nullptr ? target : mine.data(), p.K, p.V);
    if (target != nullptr && !aliased) states.back() = mine;
  }
  for (std::int64_t t0 = 0; t0 < s.length; t0 += kLoadBlock) {
    const Sequence block = block_of(s, t0, std::min(kLoadBlock, s.length - t0));
    load_qk(p, block, h, qk);
    if (t0 + kLoadBlock < s.length)
      prefetch_inputs(
          p, block_of(s, t0 + kLoadBlock, std::min(kLoadBlock, s.length - t0 - kLoadBlock)), h);
    for (std::int64_t r = 0; r < G; ++r) {
      load_values(p, block, h * G + r, in);
      StateMap<S>& state = states[static_cast<std::size_t>(r)];
      out.resize(block.length, p.V);
      const bool stepped = with_float_packets_of_16<S>(p.V, [&](auto packets) {
        for (std::int64_t t = 0; t < block.length; ++t)
          advance_in_registers<decltype(packets)::value>(state.data(), p.K, qk.k.data() + t * p.K,
                                                         qk.q.data() + t * p.K, &in.v(t, 0),
                                                         std::exp(in.g(t)), in.beta(t), &out(t, 0));
      });
      if (stepped) {
        store_rows(out, o, block, h * G + r);
        continue;
      }
      for (std::int64_t t = 0; t < block.length; ++t) {
        v_row = in.v.row(t);
        advance<S>(state, state, qk.k.data() + t * p.K, qk.q.data() + t * p.K, v_row, in.g(t),
                   in.beta(t), scratch, &o_row);
        out.row(t) = o_row;
      }
      store_rows(out, o, block, h * G + r);
    }
  }
  if (final_state.defined())
    for (std::int64_t r = 0; r < G; ++r)
      if (states[static_cast<std::size_t>(r)].data() == owned[static_cast<std::size_t>(r)].data())
        store_state(owned[static_cast<std::size_t>(r)], final_state, n, h * G + r);
}

// Backward of one segment of one value head. `states[j]` holds the state before token j of the
// segment (j = 0 … len); dS = ∂L/∂S after the segment on entry, before it on exit. Adds the
// segment's dq̃, dk̂ into dq, dk and writes its dv, dg, dβ into d. Per step (see reference.cpp
// for the derivation), with dS = ∂L/∂S_t:
//   dq̃_t = S_t do_t,  dS += q̃_t do_tᵀ,  w = dSᵀk,  r = v − a S_{t−1}ᵀ k,
//   dv = β w,  dβ = w·r,  dk = β (dS r − a S_{t−1} w),
//   dS' = dS − β k wᵀ,  dg = a Σ S_{t−1} ⊙ dS',  ∂L/∂S_{t−1} = a dS'.
template <class S>
void backward_segment(const QKInputs<S>& qk, const ValueInputs<S>& in, const Mat<S>& d_out,
                      const std::vector<Mat<S>>& states, Mat<S>& dS, Mat<S>& dq, Mat<S>& dk,
                      ValueGrads<S>& d) {
  const Eigen::Index K = dS.rows(), V = dS.cols();
  RowVec<S> w, kS, r;
  for (Eigen::Index t = d_out.rows() - 1; t >= 0; --t) {
    const Mat<S>& S_prev = states[static_cast<std::size_t>(t)];
    const Mat<S>& S_t = states[static_cast<std::size_t>(t + 1)];
    const S a = std::exp(in.g(t)), beta = in.beta(t);
    const S* k = qk.k.data() + t * K;  // rows of row-major block × K matrices
    const S* q = qk.q.data() + t * K;
    const auto d_o = d_out.row(t);
    // Pass 1: dS += q̃ doᵀ; w = dSᵀ k; kS = S_{t−1}ᵀ k; dq̃ = S_t do.
    w.setZero(V);
    kS.setZero(V);
    for (Eigen::Index i = 0; i < K; ++i) {
      dS.row(i).noalias() += q[i] * d_o;
      w.noalias() += k[i] * dS.row(i);
      kS.noalias() += k[i] * S_prev.row(i);
      dq(t, i) += S_t.row(i).dot(d_o);
    }
    r = in.v.row(t) - a * kS;
    // Pass 2: dk, then dS ← a (dS − β k wᵀ), accumulating dg = a Σ S_{t−1} ⊙ dS'.
    S dg = 0;
    for (Eigen::Index i = 0; i < K; ++i) {
      dk(t, i) += beta * (dS.row(i).dot(r) - a * S_prev.row(i).dot(w));
      dS.row(i).noalias() -= (beta * k[i]) * w;
      dg += S_prev.row(i).dot(dS.row(i));
      dS.row(i) *= a;
    }
    d.dv.row(t) = beta * w;
    d.dbeta(t) = w.dot(r);
    d.dg(t) = a * dg;
  }
}

// The buffers of backward_item, kept per thread across calls (an item runs start to finish on one
// thread): freed after every item, its K × V states (a segment's C + 1 of them, the checkpoints)
// were trimmed from malloc's heap and faulted back in by the next item — 8,000 page faults and
// 71 ms a backward at B = 32, H = 2, T = 64, K = 32, V = 64, against 2 ms for GLA's. Above
// kKeptBytes the checkpoints (O(T / C) states) and the segment's states are released after the
// item.
template <class S>
struct BackwardScratch {
  QKInputs<S> qk;
  ValueInputs<S> in;
  RowVec<S> v_row, scratch;
  std::vector<Mat<S>> checkpoints, dS, replay, states;
  Mat<S> dq, dk, d_out;
  ValueGrads<S> d;

  void release_if_large() { detail::release_if_large(checkpoints, states); }
};

template <class S>
void backward_item(const Problem& p, std::int64_t item, const TensorView& d_o,
                   const TensorView& d_final_state, const GatedDeltaRuleGrads& grads) {
  const std::int64_t n = p.item_sequence(item), h = p.item_head(item), G = p.group;
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  const std::int64_t C = p.chunk_size, num_segments = (s.length + C - 1) / C;
  auto segment = [&](std::int64_t c) { return block_of(s, c * C, std::min(C, s.length - c * C)); };
  thread_local BackwardScratch<S> w;
  QKInputs<S>& qk = w.qk;
  ValueInputs<S>& in = w.in;
  RowVec<S>&v_row = w.v_row, &scratch = w.scratch;
  // Replay the forward; checkpoints[r · num_segments + c] = state of value head r before
  // segment c.
  std::vector<Mat<S>>& checkpoints = w.checkpoints;
  checkpoints.resize(static_cast<std::size_t>(G * num_segments));
  std::vector<Mat<S>>& dS = w.dS;
  dS.resize(static_cast<std::size_t>(G));
  {
    std::vector<Mat<S>>& states = w.replay;
    states.resize(static_cast<std::size_t>(G));
    for (std::int64_t r = 0; r < G; ++r)
      load_initial_state(p, n, h * G + r, states[static_cast<std::size_t>(r)]);
    for (std::int64_t c = 0; c < num_segments; ++c) {
      for (std::int64_t r = 0; r < G; ++r)
        checkpoints[static_cast<std::size_t>(r * num_segments + c)] =
            states[static_cast<std::size_t>(r)];
      // The walk back needs no state after the last segment (a sequence of one segment replays
      // nothing).
      if (c + 1 == num_segments) break;
      const Sequence block = segment(c);
      load_qk(p, block, h, qk);
      prefetch_inputs(p, segment(c + 1), h);
      for (std::int64_t r = 0; r < G; ++r) {
        load_values(p, block, h * G + r, in);
        Mat<S>& state = states[static_cast<std::size_t>(r)];
        for (std::int64_t t = 0; t < block.length; ++t) {
          v_row = in.v.row(t);
          advance<S>(state, state, qk.k.data() + t * p.K, nullptr, v_row, in.g(t), in.beta(t),
                     scratch, nullptr);
        }
      }
    }
  }
  for (std::int64_t r = 0; r < G; ++r)
    load_final_state_grad(p, d_final_state, n, h * G + r, dS[static_cast<std::size_t>(r)]);
  // Walk the segments backwards, recomputing each one's states from its checkpoint.
  std::vector<Mat<S>>& states = w.states;
  states.resize(static_cast<std::size_t>(std::min(C, s.length) + 1));
  for (Mat<S>& state : states) state.resize(p.K, p.V);
  Mat<S>&dq = w.dq, &dk = w.dk, &d_out = w.d_out;
  ValueGrads<S>& d = w.d;
  for (std::int64_t c = num_segments - 1; c >= 0; --c) {
    const Sequence block = segment(c);
    load_qk(p, block, h, qk);
    if (c > 0) prefetch_inputs(p, segment(c - 1), h, d_o);
    dq.setZero(block.length, p.K);
    dk.setZero(block.length, p.K);
    for (std::int64_t r = 0; r < G; ++r) {
      load_values(p, block, h * G + r, in);
      load_rows(d_o, block, h * G + r, d_out);
      states[0] = checkpoints[static_cast<std::size_t>(r * num_segments + c)];
      for (std::int64_t t = 0; t < block.length; ++t) {
        v_row = in.v.row(t);
        advance<S>(states[static_cast<std::size_t>(t)], states[static_cast<std::size_t>(t + 1)],
                   qk.k.data() + t * p.K, nullptr, v_row, in.g(t), in.beta(t), scratch, nullptr);
      }
      d.reset(block.length, p.V);
      backward_segment(qk, in, d_out, states, dS[static_cast<std::size_t>(r)], dq, dk, d);
      store_value_grads(block, h * G + r, d, grads);
    }
    store_qk_grads(p, block, h, qk, dq, dk, grads);
  }
  if (grads.dh0.defined())
    for (std::int64_t r = 0; r < G; ++r)
      store_state(dS[static_cast<std::size_t>(r)], grads.dh0, n, h * G + r);
  w.release_if_large();
}

}  // namespace

void recurrent_forward(const Problem& p, const TensorView& o, const TensorView& final_state) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    const bool in_place = states_in_place_allowed(final_state, p.initial_state,
                                                  {p.q, p.k, p.v, p.g, p.beta, p.theta, o});
    // An item: T_n tokens of G value heads, each ~4·K·V multiply-adds (on average).
    const std::int64_t tokens = p.B * p.T / std::max<std::int64_t>(1, p.num_sequences());
    const std::int64_t work = 4 * p.group * p.K * p.V * std::max<std::int64_t>(1, tokens);
    parallel_for(p.num_items(), work,
                 [&](std::int64_t item) { forward_item<S>(p, item, o, final_state, in_place); });
  });
}

void recurrent_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                        const GatedDeltaRuleGrads& grads) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_items(),
                 [&](std::int64_t item) { backward_item<S>(p, item, d_o, d_final_state, grads); });
  });
}

}  // namespace phasor::detail::gdn
