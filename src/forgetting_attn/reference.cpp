// Forgetting attention, reference: plain loops in float64, straight from the definition
//   o_i = Σ_{j ≤ i, i − j < window} softmax_j(ℓ_ij) v_j,
//   ℓ_ij = scale q_i·k_j + Σ_{s ∈ (j, i]} g_s − (i − j)(a_i + b_j),
// (the last term: the optional additive GRAPE slopes, zeros when absent) one row of logits at a
// time; the backward pass is the plain softmax adjoint, with da_i = −Σ_j (i − j) dℓ_ij and
// db_j = −Σ_i (i − j) dℓ_ij. Whatever the
// input dtype, everything is computed in float64. This is what the tests trust.
// The optional rotation by θ is applied here with plain loops from its equations (not with the
// helpers the fast kernels share), to whole-sequence copies of k and q before the attention, and
// its gradient is taken at the end from the gradients with respect to the rotated copies.

#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/parallel.h"
#include "common/rotation_reference.h"
#include "common/slices.h"
#include "forgetting_attn/kernels.h"

namespace phasor::detail::fox {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Row i of the attention matrix of one (sequence, query head): the visible keys first..i and
// their softmax probabilities.
struct SoftmaxRow {
  std::int64_t first = 0;
  std::vector<double> prob;  // prob[j − first]
  double lse = 0;            // log Σ_j exp(ℓ_ij)
};

// The gate sum Σ_{s ∈ (j, i]} g_s is accumulated from j = i downwards. A zero gate g_s = −inf
// makes it −inf for every j < s: those keys (and all before them) have probability 0, so the row
// stops there. Keys before the window stop it too. j = i (empty sum) is always visible.
SoftmaxRow softmax_row(const Mat<double>& q, const Mat<double>& k, const Vec<double>& g,
                       const Vec<double>& a, const Vec<double>& b, double scale,
                       std::int64_t window, std::int64_t i) {
  std::vector<double> logit;  // logit[i − j] for j = i, i − 1, ...
  double gate_sum = 0;
  for (std::int64_t j = i; j >= window_start(i, window); --j) {
    if (j < i) gate_sum += g[j + 1];
    if (gate_sum == kNegInf) break;
    double qk = 0;
    for (std::int64_t c = 0; c < q.cols(); ++c) qk += q(i, c) * k(j, c);
    logit.push_back(scale * qk + gate_sum - static_cast<double>(i - j) * (a[i] + b[j]));
  }
  SoftmaxRow row;
  const auto n = static_cast<std::int64_t>(logit.size());
  row.first = i - n + 1;
  const double max_logit = *std::max_element(logit.begin(), logit.end());
  double sum = 0;
  for (double l : logit) sum += std::exp(l - max_logit);
  row.lse = max_logit + std::log(sum);
  row.prob.resize(logit.size());
  for (std::int64_t j = row.first; j <= i; ++j)
    row.prob[static_cast<std::size_t>(j - row.first)] =
        std::exp(logit[static_cast<std::size_t>(i - j)] - row.lse);
  return row;
}

}  // namespace

void reference_forward(const Problem& p, const TensorView& o, const TensorView& lse) {
  parallel_for(p.num_items(), [&](std::int64_t item) {
    const Sequence& seq = p.sequences[static_cast<std::size_t>(item / p.H)];
    const std::int64_t h = item % p.H, L = seq.length;
    Mat<double> k, v, q, theta;
    Vec<double> g, a, b;
    load_rows(p.k, seq, h, k);
    load_rows(p.v, seq, h, v);
    load_slopes(p.slope_k, seq, h, b);
    // θ of key head h rotates k and the q of every query head of its group.
    if (p.theta.defined()) {
      load_rows(p.theta, seq, h, theta);
      reference_rotate_rows(k, theta, p.rotary_layout);
    }
    for (std::int64_t hq = h * p.group(); hq < (h + 1) * p.group(); ++hq) {
      load_rows(p.q, seq, hq, q);
      if (p.theta.defined()) reference_rotate_rows(q, theta, p.rotary_layout);
      load_column(p.g, seq, hq, g);
      load_slopes(p.slope_q, seq, hq, a);
      Mat<double> out = Mat<double>::Zero(L, p.V);
      Vec<double> out_lse(L);
      for (std::int64_t i = 0; i < L; ++i) {
        const SoftmaxRow row = softmax_row(q, k, g, a, b, p.scale, p.window, i);
        out_lse[i] = row.lse;
        for (std::int64_t j = row.first; j <= i; ++j)
          for (std::int64_t c = 0; c < p.V; ++c)
            out(i, c) += row.prob[static_cast<std::size_t>(j - row.first)] * v(j, c);
      }
      store_rows(out, o, seq, hq);
      if (lse.defined()) store_column(out_lse, lse, seq, hq);
    }
  });
}

void reference_backward(const Problem& p, const TensorView& d_o, const ForgettingAttnGrads& grads) {
  parallel_for(p.num_items(), [&](std::int64_t item) {
    const Sequence& seq = p.sequences[static_cast<std::size_t>(item / p.H)];
    const std::int64_t h = item % p.H, L = seq.length;
    Mat<double> k, v, q, dout, theta;
    Vec<double> g, a, b;
    load_rows(p.k, seq, h, k);
    load_rows(p.v, seq, h, v);
    load_slopes(p.slope_k, seq, h, b);
    // db sums over the query heads of the group (they share b).
    Vec<double> db = Vec<double>::Zero(L);
    // With θ, q and k below are the rotated q' = R(θ) q, k' = R(θ) k, and dq, dk are first taken
    // with respect to them.
    if (p.theta.defined()) {
      load_rows(p.theta, seq, h, theta);
      reference_rotate_rows(k, theta, p.rotary_layout);
    }
    // dθ of key head h: q' of every query head of the group and k' share θ, so all add up.
    Mat<double> dtheta = Mat<double>::Zero(p.theta.defined() ? L : 0, p.K / 2);
    // dk, dv sum over the query heads of the group.
    Mat<double> dk = Mat<double>::Zero(L, p.K), dv = Mat<double>::Zero(L, p.V);
    for (std::int64_t hq = h * p.group(); hq < (h + 1) * p.group(); ++hq) {
      load_rows(p.q, seq, hq, q);
      if (p.theta.defined()) reference_rotate_rows(q, theta, p.rotary_layout);
      load_rows(d_o, seq, hq, dout);
      load_column(p.g, seq, hq, g);
      load_slopes(p.slope_q, seq, hq, a);
      Mat<double> dq = Mat<double>::Zero(L, p.K);
      Vec<double> dg = Vec<double>::Zero(L), da = Vec<double>::Zero(L);
      for (std::int64_t i = 0; i < L; ++i) {
        const SoftmaxRow row = softmax_row(q, k, g, a, b, p.scale, p.window, i);
        const std::int64_t n = i - row.first + 1;
        // Softmax adjoint: dP_ij = do_i·v_j, dℓ_ij = P_ij (dP_ij − Σ_j' P_ij' dP_ij').
        std::vector<double> dp(static_cast<std::size_t>(n));
        double weighted = 0;
        for (std::int64_t j = row.first; j <= i; ++j) {
          double d = 0;
          for (std::int64_t c = 0; c < p.V; ++c) d += dout(i, c) * v(j, c);
          dp[static_cast<std::size_t>(j - row.first)] = d;
          weighted += row.prob[static_cast<std::size_t>(j - row.first)] * d;
        }
        double dlogit_prefix = 0;  // Σ_{first ≤ j' ≤ j} dℓ_ij'
        for (std::int64_t j = row.first; j <= i; ++j) {
          const double prob = row.prob[static_cast<std::size_t>(j - row.first)];
          const double dlogit = prob * (dp[static_cast<std::size_t>(j - row.first)] - weighted);
          // ℓ_ij = scale q_i·k_j + ...: dq_i += scale dℓ_ij k_j, dk_j += scale dℓ_ij q_i.
          for (std::int64_t c = 0; c < p.K; ++c) {
            dq(i, c) += p.scale * dlogit * k(j, c);
            dk(j, c) += p.scale * dlogit * q(i, c);
          }
          for (std::int64_t c = 0; c < p.V; ++c) dv(j, c) += prob * dout(i, c);
          // ℓ_ij contains g_s for every s ∈ (j, i]: dg_s = Σ_{j < s} dℓ_ij over this row.
          dlogit_prefix += dlogit;
          if (j < i) dg[j + 1] += dlogit_prefix;
          // ℓ_ij contains −(i − j)(a_i + b_j).
          da[i] -= static_cast<double>(i - j) * dlogit;
          db[j] -= static_cast<double>(i - j) * dlogit;
        }
      }
      if (p.theta.defined())
        reference_unrotate_gradient_rows(dq, q, theta, p.rotary_layout, dtheta);
      if (grads.dq.defined()) store_rows(dq, grads.dq, seq, hq);
      if (grads.dg.defined()) store_column(dg, grads.dg, seq, hq);
      if (grads.dbias_q_slope.defined()) store_column(da, grads.dbias_q_slope, seq, hq);
    }
    if (grads.dbias_k_slope.defined()) store_column(db, grads.dbias_k_slope, seq, h);
    if (p.theta.defined()) {
      reference_unrotate_gradient_rows(dk, k, theta, p.rotary_layout, dtheta);
      if (grads.dtheta.defined()) store_rows(dtheta, grads.dtheta, seq, h);
    }
    if (grads.dk.defined()) store_rows(dk, grads.dk, seq, h);
    if (grads.dv.defined()) store_rows(dv, grads.dv, seq, h);
  });
}

}  // namespace phasor::detail::fox
