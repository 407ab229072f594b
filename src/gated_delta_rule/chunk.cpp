// Gated DeltaNet, chunked (fla's chunk_gated_delta_rule): the WY / UT-transform form of a chunk of
// L ≤ C tokens, built on dense matrix products.
//
// Derivation. Write u_t = β_t (v_t − a_t S_{t−1}ᵀ k_t), so that S_t = a_t S_{t−1} + k_t u_tᵀ.
// Inside a chunk entered with state S, with γ_i = exp(Σ_{s≤i} g_s) and
// Γ_ij = exp(Σ_{s∈(j,i]} g_s) (i ≥ j; Γ_ii = 1):
//   a_t S_{t−1} = γ_t S + Σ_{j<t} Γ_tj k_j u_jᵀ
//   ⇒ u_t + β_t Σ_{j<t} Γ_tj (k_tᵀk_j) u_j = β_t v_t − β_t γ_t Sᵀ k_t,
// i.e. M U_new = diag(β) V − diag(βγ) K S with the unit lower triangular
//   M = I + diag(β) · strictly_lower(K Kᵀ ⊙ Γ).                                            (1)
// With T = M⁻¹ (applied by triangular solves, never formed):
//   X = [U | W] = T [diag(β) V | diag(βγ) K],    U_new = U − W S,                           (2)
//   O = diag(γ) Q̃ S + lower_incl(Q̃ Kᵀ ⊙ Γ) U_new,                                          (3)
//   S_next = γ_{L−1} S + (diag(E) K)ᵀ U_new,     E_j = exp(Σ_{s∈(j,L−1]} g_s).             (4)
//
// Stability: g is a scalar per token, so every decay factor is built elementwise as exp of a sum
// accumulated from a nearby token (γ from the chunk start, E from the chunk end, Γ_ij from i back
// to j) — never a difference of cumulative sums — hence every factor is in [0, 1], zero gates
// (g = −inf) give exact zeros and sums never span more than one chunk.
//
// Backward: the forward stores the state at every chunk boundary (O(T/C · K · V) per work item);
// chunks are then walked in reverse carrying dS = ∂L/∂S_next, each chunk's M, X, U_new are
// recomputed and every dense operation of (1)–(4) is differentiated in reverse order; the adjoint
// of the solve M X = B is Mᵀ Y = dX (a second triangular solve), dB = Y, dM = −Y Xᵀ on the
// strictly lower part.

// GCC 12 reports false -Wmaybe-uninitialized warnings inside Eigen's AVX-512 kernels
// (-march=native); silence them for this file before any header pulls in the intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/parallel.h"
#include "gated_delta_rule/kernels.h"

namespace phasor::detail::gdn {
namespace {

using Eigen::Lower;
using Eigen::UnitLower;
using Eigen::UnitUpper;

// Buffers and recomputed quantities of one chunk of one value head; reused across chunks (they
// are only resized when the chunk length changes, i.e. for the last chunk).
template <class S>
struct ChunkState {
  std::int64_t t0 = 0, L = 0;
  Vec<S> gamma;   // γ_i
  Vec<S> tail;    // E_j
  Mat<S> pair;    // Γ_ij, lower triangle including the diagonal
  Mat<S> kk;      // K Kᵀ, lower triangle
  Mat<S> m;       // strictly lower part of M (its unit diagonal is implicit)
  Mat<S> x;       // [U | W], L × (V + K), after the solve
  Mat<S> u_new;   // U_new, L × V
  Mat<S> qk;      // Q̃ Kᵀ ⊙ Γ, lower triangle including the diagonal
  Mat<S> k_tail;  // diag(E) K
  Mat<S> qs;      // Q̃ S

  // Decay factors of tokens [t0, t0 + L) from the gates g (see the stability note above).
  void compute_gates(const Vec<S>& g) {
    gamma.resize(L);
    tail.resize(L);
    pair.resize(L, L);
    S acc = 0;
    for (std::int64_t i = 0; i < L; ++i) {
      acc += g(t0 + i);
      gamma(i) = std::exp(acc);
    }
    acc = 0;
    for (std::int64_t j = L - 1; j >= 0; --j) {
      tail(j) = std::exp(acc);
      acc += g(t0 + j);
    }
    for (std::int64_t i = 0; i < L; ++i) {
      pair(i, i) = S(1);
      acc = 0;
      for (std::int64_t j = i - 1; j >= 0; --j) {
        acc += g(t0 + j + 1);  // Σ_{s∈(j,i]} g_s, grown one token at a time away from i
        pair(i, j) = std::exp(acc);
      }
    }
  }

  // Everything of the chunk that does not depend on the entering state: gates, M and X, eq. (1)
  // and the solve in (2).
  void prepare(const QKInputs<S>& qkin, const ValueHeadInputs<S>& in, std::int64_t start,
               std::int64_t length) {
    t0 = start;
    L = length;
    const std::int64_t K = qkin.k.cols(), V = in.v.cols();
    const auto Kc = qkin.k.middleRows(t0, L);
    const auto Vc = in.v.middleRows(t0, L);
    const auto beta = in.beta.segment(t0, L);
    compute_gates(in.g);
    kk.resize(L, L);
    kk.template triangularView<Lower>() = Kc * Kc.transpose();
    m.setZero(L, L);  // the diagonal and upper part are never read; zero them once anyway
    for (std::int64_t i = 0; i < L; ++i)
      for (std::int64_t j = 0; j < i; ++j) m(i, j) = beta(i) * kk(i, j) * pair(i, j);
    x.resize(L, V + K);
    x.leftCols(V) = beta.asDiagonal() * Vc;
    x.rightCols(K) = (beta.array() * gamma.array()).matrix().asDiagonal() * Kc;
    m.template triangularView<UnitLower>().solveInPlace(x);
  }

  // U_new = U − W S, eq. (2).
  void compute_u_new(const Mat<S>& state) {
    const Eigen::Index V = state.cols(), K = state.rows();
    u_new = x.leftCols(V);
    u_new.noalias() -= x.rightCols(K) * state;
  }

  // Q̃ Kᵀ ⊙ Γ on the lower triangle, the intra-chunk attention matrix of eq. (3).
  void compute_qk(const QKInputs<S>& qkin) {
    const auto Kc = qkin.k.middleRows(t0, L);
    const auto Qc = qkin.q.middleRows(t0, L);
    qk.resize(L, L);
    qk.template triangularView<Lower>() = Qc * Kc.transpose();
    for (std::int64_t i = 0; i < L; ++i)
      for (std::int64_t j = 0; j <= i; ++j) qk(i, j) *= pair(i, j);
  }

  // O rows of the chunk, eq. (3); needs compute_u_new and compute_qk.
  template <class Out>
  void output(const QKInputs<S>& qkin, const Mat<S>& state, Out&& o) {
    qs.noalias() = qkin.q.middleRows(t0, L) * state;
    o = gamma.asDiagonal() * qs;
    o.noalias() += qk.template triangularView<Lower>() * u_new;
  }

  // S ← S_next, eq. (4); needs compute_u_new.
  void advance(const QKInputs<S>& qkin, Mat<S>& state) {
    k_tail = tail.asDiagonal() * qkin.k.middleRows(t0, L);
    state *= gamma(L - 1);
    state.noalias() += k_tail.transpose() * u_new;
  }
};

template <class S>
void forward_item(const Problem& p, std::int64_t item, const TensorView& o,
                  const TensorView& final_state) {
  const std::int64_t n = p.item_sequence(item), h = p.item_head(item);
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  QKInputs<S> qk;
  load_qk(p, s, h, qk);
  ValueHeadInputs<S> in;
  ChunkState<S> chunk;
  Mat<S> out;
  for (std::int64_t hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    load_value_head(p, s, n, hv, in);  // the initial state is read before the final one is stored
    out.resize(s.length, p.V);
    for (std::int64_t t0 = 0; t0 < s.length; t0 += p.chunk_size) {
      const std::int64_t L = std::min(p.chunk_size, s.length - t0);
      chunk.prepare(qk, in, t0, L);
      chunk.compute_u_new(in.state);
      chunk.compute_qk(qk);
      chunk.output(qk, in.state, out.middleRows(t0, L));
      chunk.advance(qk, in.state);
    }
    store_rows(out, o, s, hv);
    if (final_state.defined()) store_state(in.state, final_state, n, hv);
  }
}

// Reverse-mode buffers of one chunk.
template <class S>
struct ChunkGrad {
  Vec<S> dgamma, dtail;
  Mat<S> weight;   // W_ij = dΓ_ij Γ_ij (i > j): what each pairwise factor passes to its gates
  Mat<S> d_kt;     // ∂/∂(diag(E) K)
  Mat<S> du;       // ∂/∂U_new
  Mat<S> dqk;      // ∂/∂(Q̃ Kᵀ ⊙ Γ), then ∂/∂(Q̃ Kᵀ)
  Mat<S> dos;      // dO Sᵀ
  Mat<S> qg;       // diag(γ) Q̃
  Mat<S> dx;       // [dU | dW], then Y = M⁻ᵀ [dU | dW]
  Mat<S> dm;       // ∂/∂M (strictly lower), then ∂/∂(K Kᵀ)
  Mat<S> dS_prev;  // ∂L/∂S (entering state)
};

// Backward of one chunk: given the entering state and dS = ∂L/∂S_next, adds the chunk's dq̃, dk̂
// rows into dq, dk, writes its dv, dg, dβ rows into d, and replaces dS by ∂L/∂S.
template <class S>
void backward_chunk(const QKInputs<S>& qkin, const ValueHeadInputs<S>& in, const Mat<S>& d_out,
                    const Mat<S>& state, ChunkState<S>& c, ChunkGrad<S>& gr, Mat<S>& dS, Mat<S>& dq,
                    Mat<S>& dk, ValueHeadGrads<S>& d) {
  const std::int64_t t0 = c.t0, L = c.L, K = state.rows(), V = state.cols();
  const auto Kc = qkin.k.middleRows(t0, L);
  const auto Qc = qkin.q.middleRows(t0, L);
  const auto Vc = in.v.middleRows(t0, L);
  const auto dOc = d_out.middleRows(t0, L);
  const auto beta = in.beta.segment(t0, L);
  auto dQc = dq.middleRows(t0, L);
  auto dKc = dk.middleRows(t0, L);
  gr.dgamma.setZero(L);
  gr.dtail.resize(L);
  gr.weight.setZero(L, L);

  // (4) S_next = γ_{L−1} S + (diag(E) K)ᵀ U_new.
  gr.dgamma(L - 1) = state.cwiseProduct(dS).sum();
  gr.dS_prev = c.gamma(L - 1) * dS;
  gr.d_kt.noalias() = c.u_new * dS.transpose();
  for (std::int64_t j = 0; j < L; ++j) gr.dtail(j) = Kc.row(j).dot(gr.d_kt.row(j));
  dKc.noalias() += c.tail.asDiagonal() * gr.d_kt;
  c.k_tail = c.tail.asDiagonal() * Kc;
  gr.du.noalias() = c.k_tail * dS;

  // (3) O = diag(γ) Q̃ S + lower_incl(Q̃ Kᵀ ⊙ Γ) U_new.
  gr.du.noalias() += c.qk.template triangularView<Lower>().transpose() * dOc;
  gr.dqk.resize(L, L);
  gr.dqk.template triangularView<Lower>() = dOc * c.u_new.transpose();
  gr.dos.noalias() = dOc * state.transpose();
  for (std::int64_t i = 0; i < L; ++i) gr.dgamma(i) += Qc.row(i).dot(gr.dos.row(i));
  dQc.noalias() += c.gamma.asDiagonal() * gr.dos;
  gr.qg = c.gamma.asDiagonal() * Qc;
  gr.dS_prev.noalias() += gr.qg.transpose() * dOc;
  for (std::int64_t i = 0; i < L; ++i) {
    for (std::int64_t j = 0; j < i; ++j) gr.weight(i, j) = gr.dqk(i, j) * c.qk(i, j);
    for (std::int64_t j = 0; j <= i; ++j) gr.dqk(i, j) *= c.pair(i, j);
  }
  dQc.noalias() += gr.dqk.template triangularView<Lower>() * Kc;
  dKc.noalias() += gr.dqk.template triangularView<Lower>().transpose() * Qc;

  // (2) U_new = U − W S.
  const auto W = c.x.rightCols(K);
  gr.dx.resize(L, V + K);
  gr.dx.leftCols(V) = gr.du;
  gr.dx.rightCols(K).noalias() = -gr.du * state.transpose();
  gr.dS_prev.noalias() -= W.transpose() * gr.du;

  // (2) X = M⁻¹ B with B = [diag(β) V | diag(βγ) K]: Y = M⁻ᵀ dX, dB = Y, dM = −Y Xᵀ.
  c.m.transpose().template triangularView<UnitUpper>().solveInPlace(gr.dx);
  const auto Yu = gr.dx.leftCols(V);
  const auto Yw = gr.dx.rightCols(K);
  gr.dm.resize(L, L);
  gr.dm.template triangularView<Lower>() = gr.dx * c.x.transpose();  // −dM
  d.dv.middleRows(t0, L) = beta.asDiagonal() * Yu;
  for (std::int64_t i = 0; i < L; ++i) {
    const S ky = Kc.row(i).dot(Yw.row(i));
    d.dbeta(t0 + i) = Vc.row(i).dot(Yu.row(i)) + c.gamma(i) * ky;
    gr.dgamma(i) += beta(i) * ky;
  }
  dKc.noalias() += (beta.array() * c.gamma.array()).matrix().asDiagonal() * Yw;

  // (1) M = I + diag(β) strictly_lower(K Kᵀ ⊙ Γ).
  for (std::int64_t i = 0; i < L; ++i) {
    S dbeta = 0;
    for (std::int64_t j = 0; j < i; ++j) {
      const S dM = -gr.dm(i, j);
      const S kk_pair = c.kk(i, j) * c.pair(i, j);
      dbeta += dM * kk_pair;
      gr.weight(i, j) += dM * beta(i) * kk_pair;
      gr.dm(i, j) = dM * beta(i) * c.pair(i, j);  // ∂/∂(K Kᵀ)_ij
    }
    d.dbeta(t0 + i) += dbeta;
    gr.dm(i, i) = 0;
  }
  // K Kᵀ: dK += (dA + dAᵀ) K with dA strictly lower.
  dKc.noalias() += gr.dm.template triangularView<Lower>() * Kc;
  dKc.noalias() += gr.dm.template triangularView<Lower>().transpose() * Kc;

  // Gates. g_s enters γ_i for i ≥ s, E_j for j < s and Γ_ij for j < s ≤ i; each factor passes
  // (its gradient × its value) to every gate of its segment. All sums stay within the chunk.
  S acc = 0;
  for (std::int64_t s = L - 1; s >= 0; --s) {
    acc += gr.dgamma(s) * c.gamma(s);
    d.dg(t0 + s) = acc;
  }
  acc = 0;
  for (std::int64_t s = 0; s < L; ++s) {
    d.dg(t0 + s) += acc;
    acc += gr.dtail(s) * c.tail(s);
  }
  // F(s) = Σ_{i≥s} Σ_{j<s} W_ij telescopes: F(0) = 0, F(s+1) = F(s) + Σ_{i>s} W_is − Σ_{j<s} W_sj.
  const Vec<S> column_sums = gr.weight.colwise().sum().transpose();  // W is zero on/above diag
  const Vec<S> row_sums = gr.weight.rowwise().sum();
  acc = 0;
  for (std::int64_t s = 0; s < L; ++s) {
    d.dg(t0 + s) += acc;
    acc += column_sums(s) - row_sums(s);
  }
  dS.swap(gr.dS_prev);
}

template <class S>
void backward_item(const Problem& p, std::int64_t item, const TensorView& d_o,
                   const TensorView& d_final_state, const GatedDeltaRuleGrads& grads) {
  const std::int64_t n = p.item_sequence(item), h = p.item_head(item);
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  const std::int64_t C = p.chunk_size, num_chunks = (s.length + C - 1) / C;
  QKInputs<S> qk;
  load_qk(p, s, h, qk);
  Mat<S> dq = Mat<S>::Zero(s.length, p.K), dk = Mat<S>::Zero(s.length, p.K);
  ValueHeadInputs<S> in;
  ValueHeadGrads<S> d;
  ChunkState<S> chunk;
  ChunkGrad<S> gr;
  Mat<S> d_out, dS;
  std::vector<Mat<S>> boundary(static_cast<std::size_t>(num_chunks));  // state entering chunk c
  for (std::int64_t hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    load_value_head(p, s, n, hv, in);
    load_rows(d_o, s, hv, d_out);
    load_final_state_grad(p, d_final_state, n, hv, dS);
    d.reset(s.length, p.K, p.V);
    for (std::int64_t c = 0; c < num_chunks; ++c) {
      boundary[static_cast<std::size_t>(c)] = in.state;
      chunk.prepare(qk, in, c * C, std::min(C, s.length - c * C));
      chunk.compute_u_new(in.state);
      chunk.advance(qk, in.state);
    }
    for (std::int64_t c = num_chunks - 1; c >= 0; --c) {
      const Mat<S>& state = boundary[static_cast<std::size_t>(c)];
      chunk.prepare(qk, in, c * C, std::min(C, s.length - c * C));
      chunk.compute_u_new(state);
      chunk.compute_qk(qk);
      backward_chunk(qk, in, d_out, state, chunk, gr, dS, dq, dk, d);
    }
    d.dh0 = dS;
    store_value_head_grads(s, n, hv, d, grads);
  }
  store_qk_grads(p, s, h, qk, dq, dk, grads);
}

}  // namespace

void chunk_forward(const Problem& p, const TensorView& o, const TensorView& final_state) {
  dispatch_float(p.params->q, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_items(),
                 [&](std::int64_t item) { forward_item<S>(p, item, o, final_state); });
  });
}

void chunk_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                    const GatedDeltaRuleGrads& grads) {
  dispatch_float(p.params->q, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_items(),
                 [&](std::int64_t item) { backward_item<S>(p, item, d_o, d_final_state, grads); });
  });
}

}  // namespace phasor::detail::gdn
