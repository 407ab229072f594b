// Gated DeltaNet, recurrent (fla's fused_recurrent_gated_delta_rule): the recurrence token by
// token in the compute type (float32 for float32 q, float64 for float64 q), with S held in a
// dense K × V matrix. Also the single-token decode path (T = 1, state fed back in place).
//
// Backward: the forward is replayed keeping only the state every chunk_size tokens
// (checkpoints); the sequence is then walked backwards segment by segment, each segment's states
// being recomputed from its checkpoint. Memory per work item: O(T / C · K · V + C · K · V).

// GCC 12 reports false -Wmaybe-uninitialized warnings inside Eigen's AVX-512 kernels
// (-march=native); silence them for this file before any header pulls in the intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cmath>
#include <vector>

#include "common/parallel.h"
#include "gated_delta_rule/kernels.h"

namespace phasor::detail::gdn {
namespace {

// One step of the recurrence, reading `prev` = S_{t−1} and writing `next` = S_t (they may be the
// same matrix):  r = v − a·S_{t−1}ᵀk,  S_t = a·S_{t−1} + k (β r)ᵀ,  and, if `out` is given,
// out = S_tᵀ q̃. Two passes over the rows of S: the first forms S_{t−1}ᵀ k, the second updates
// each row and accumulates the output while the row is in cache.
template <class S>
void advance(const Mat<S>& prev, Mat<S>& next, const S* k, const S* q, const RowVec<S>& v, S g,
             S beta, RowVec<S>& scratch, RowVec<S>* out) {
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

template <class S>
void forward_item(const Problem& p, std::int64_t item, const TensorView& o,
                  const TensorView& final_state) {
  const std::int64_t n = p.item_sequence(item), h = p.item_head(item);
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  QKInputs<S> qk;
  load_qk(p, s, h, qk);
  ValueHeadInputs<S> in;
  Mat<S> out;
  RowVec<S> v_row, scratch, o_row;
  for (std::int64_t hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    load_value_head(p, s, n, hv, in);  // the initial state is read before the final one is stored
    out.resize(s.length, p.V);
    for (std::int64_t t = 0; t < s.length; ++t) {
      v_row = in.v.row(t);
      advance<S>(in.state, in.state, qk.k.data() + t * p.K, qk.q.data() + t * p.K, v_row, in.g(t),
                 in.beta(t), scratch, &o_row);
      out.row(t) = o_row;
    }
    store_rows(out, o, s, hv);
    if (final_state.defined()) store_state(in.state, final_state, n, hv);
  }
}

// Backward of one value head, adding its dq̃, dk̂ contributions into dq, dk. Per step (see
// reference.cpp for the derivation), with dS = ∂L/∂S_t:
//   dq̃_t = S_t do_t,  dS += q̃_t do_tᵀ,  w = dSᵀk,  r = v − a S_{t−1}ᵀ k,
//   dv = β w,  dβ = w·r,  dk = β (dS r − a S_{t−1} w),
//   dS' = dS − β k wᵀ,  dg = a Σ S_{t−1} ⊙ dS',  ∂L/∂S_{t−1} = a dS'.
template <class S>
void backward_value_head(const Problem& p, const Sequence& s, const QKInputs<S>& qk,
                         const ValueHeadInputs<S>& in, const Mat<S>& d_out, Mat<S>& dS, Mat<S>& dq,
                         Mat<S>& dk, ValueHeadGrads<S>& d) {
  const std::int64_t L = s.length, K = p.K, C = p.chunk_size;
  const std::int64_t num_segments = (L + C - 1) / C;
  RowVec<S> v_row, scratch;
  // checkpoints[c] = the state before token c·C.
  std::vector<Mat<S>> checkpoints(static_cast<std::size_t>(num_segments));
  Mat<S> state = in.state;
  for (std::int64_t t = 0; t < L; ++t) {
    if (t % C == 0) checkpoints[static_cast<std::size_t>(t / C)] = state;
    v_row = in.v.row(t);
    advance<S>(state, state, qk.k.data() + t * K, nullptr, v_row, in.g(t), in.beta(t), scratch,
               nullptr);
  }
  // states[j] = the state before token t0 + j of the current segment (j = 0 … len).
  std::vector<Mat<S>> states(static_cast<std::size_t>(std::min(C, L) + 1), Mat<S>(K, p.V));
  RowVec<S> w, kS, r;
  for (std::int64_t c = num_segments - 1; c >= 0; --c) {
    const std::int64_t t0 = c * C, len = std::min(C, L - t0);
    states[0] = checkpoints[static_cast<std::size_t>(c)];
    for (std::int64_t j = 0; j < len; ++j) {
      v_row = in.v.row(t0 + j);
      advance<S>(states[static_cast<std::size_t>(j)], states[static_cast<std::size_t>(j + 1)],
                 qk.k.data() + (t0 + j) * K, nullptr, v_row, in.g(t0 + j), in.beta(t0 + j), scratch,
                 nullptr);
    }
    for (std::int64_t j = len - 1; j >= 0; --j) {
      const std::int64_t t = t0 + j;
      const Mat<S>& S_prev = states[static_cast<std::size_t>(j)];
      const Mat<S>& S_t = states[static_cast<std::size_t>(j + 1)];
      const S a = std::exp(in.g(t)), beta = in.beta(t);
      const S* k = qk.k.data() + t * K;  // rows of row-major L × K matrices
      const S* q = qk.q.data() + t * K;
      const auto d_o = d_out.row(t);
      // Pass 1: dS += q̃ doᵀ; w = dSᵀ k; kS = S_{t−1}ᵀ k; dq̃ = S_t do.
      w.setZero(p.V);
      kS.setZero(p.V);
      for (std::int64_t i = 0; i < K; ++i) {
        dS.row(i).noalias() += q[i] * d_o;
        w.noalias() += k[i] * dS.row(i);
        kS.noalias() += k[i] * S_prev.row(i);
        dq(t, i) += S_t.row(i).dot(d_o);
      }
      r = in.v.row(t) - a * kS;
      // Pass 2: dk, then dS ← a (dS − β k wᵀ), accumulating dg = a Σ S_{t−1} ⊙ dS'.
      S dg = 0;
      for (std::int64_t i = 0; i < K; ++i) {
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
  d.dh0 = dS;
}

template <class S>
void backward_item(const Problem& p, std::int64_t item, const TensorView& d_o,
                   const TensorView& d_final_state, const GatedDeltaRuleGrads& grads) {
  const std::int64_t n = p.item_sequence(item), h = p.item_head(item);
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  QKInputs<S> qk;
  load_qk(p, s, h, qk);
  Mat<S> dq = Mat<S>::Zero(s.length, p.K), dk = Mat<S>::Zero(s.length, p.K);
  ValueHeadInputs<S> in;
  ValueHeadGrads<S> d;
  Mat<S> d_out, dS;
  for (std::int64_t hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    load_value_head(p, s, n, hv, in);
    load_rows(d_o, s, hv, d_out);
    load_final_state_grad(p, d_final_state, n, hv, dS);
    d.reset(s.length, p.K, p.V);
    backward_value_head(p, s, qk, in, d_out, dS, dq, dk, d);
    store_value_head_grads(s, n, hv, d, grads);
  }
  store_qk_grads(p, s, h, qk, dq, dk, grads);
}

}  // namespace

void recurrent_forward(const Problem& p, const TensorView& o, const TensorView& final_state) {
  dispatch_float(p.params->q, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_items(),
                 [&](std::int64_t item) { forward_item<S>(p, item, o, final_state); });
  });
}

void recurrent_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                        const GatedDeltaRuleGrads& grads) {
  dispatch_float(p.params->q, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_items(),
                 [&](std::int64_t item) { backward_item<S>(p, item, d_o, d_final_state, grads); });
  });
}

}  // namespace phasor::detail::gdn
