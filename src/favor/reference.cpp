// FAVOR+: the float64 reference, plain loops straight from the equations in favor.h. It reads and
// writes views element by element; the tests trust it. The attention is computed in its quadratic
// form (A_ij = φ(q̂_i)·φ(k̂_j), o_i = Σ_j A_ij v_j / Σ_j A_ij), in log space (see attention_pair),
// independently of the optimized kernel's prefix sums.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "favor/kernels.h"

namespace phasor::detail::favor {
namespace {

using Buffer = std::vector<double>;

std::size_t at(std::int64_t row, std::int64_t cols, std::int64_t col) {
  return static_cast<std::size_t>(row * cols + col);
}

// rows(t, i) = scale · x[s.batch, s.start + t, h, i]   (L × d)
Buffer load_rows(const TensorView& x, const Sequence& s, std::int64_t h, std::int64_t cols,
                 double scale = 1.0) {
  Buffer out(static_cast<std::size_t>(s.length * cols));
  for (std::int64_t t = 0; t < s.length; ++t)
    for (std::int64_t i = 0; i < cols; ++i)
      out[at(t, cols, i)] = scale * get(x, offset_of(x, s.batch, s.start + t, h, i));
  return out;
}
void store_rows(const Buffer& in, const TensorView& x, const Sequence& s, std::int64_t h,
                std::int64_t cols) {
  for (std::int64_t t = 0; t < s.length; ++t)
    for (std::int64_t i = 0; i < cols; ++i)
      put(x, offset_of(x, s.batch, s.start + t, h, i), in[at(t, cols, i)]);
}
// W of head h (m × d).
Buffer load_w(const Shape& sh, const TensorView& w, std::int64_t h) {
  Buffer out(static_cast<std::size_t>(sh.m * sh.d));
  for (std::int64_t r = 0; r < sh.m; ++r)
    for (std::int64_t i = 0; i < sh.d; ++i) out[at(r, sh.d, i)] = get(w, sh.w_offset(w, h, r, i));
  return out;
}

// φ(x_t)_r = exp(w_rᵀx_t − |x_t|²/2 − c)/√m  (L × m), c as in favor.h. With the query stabiliser
// c = max_r (w_rᵀx_t − |x_t|²/2) the |x_t|²/2 cancels and is left out (its rounding, eps |x_t|²/2,
// would be all the error: 1e-8 at |x| = 1e4).
Buffer features(const Shape& sh, const Buffer& X, std::int64_t L, const Buffer& W,
                FavorStabilizer stabilizer) {
  const std::int64_t m = sh.m, d = sh.d;
  Buffer e(static_cast<std::size_t>(L * m));
  for (std::int64_t t = 0; t < L; ++t) {
    double sq = 0;
    if (stabilizer != FavorStabilizer::query)
      for (std::int64_t i = 0; i < d; ++i) sq += X[at(t, d, i)] * X[at(t, d, i)];
    for (std::int64_t r = 0; r < m; ++r) {
      double u = 0;
      for (std::int64_t i = 0; i < d; ++i) u += W[at(r, d, i)] * X[at(t, d, i)];
      e[at(t, m, r)] = u - 0.5 * sq;
    }
  }
  double shared_c = -std::numeric_limits<double>::infinity();
  if (stabilizer == FavorStabilizer::key)
    for (double v : e) shared_c = std::max(shared_c, v);
  for (std::int64_t t = 0; t < L; ++t) {
    double c = 0;
    if (stabilizer == FavorStabilizer::key) c = shared_c;
    if (stabilizer == FavorStabilizer::query) {
      c = -std::numeric_limits<double>::infinity();
      for (std::int64_t r = 0; r < m; ++r) c = std::max(c, e[at(t, m, r)]);
    }
    for (std::int64_t r = 0; r < m; ++r)
      e[at(t, m, r)] = std::exp(e[at(t, m, r)] - c) / std::sqrt(static_cast<double>(m));
  }
  return e;
}

// With g_tr = dφ_tr φ_tr: dX_t = Σ_r g_tr (w_r − x_t) (returned, L × d), dW_r += Σ_t g_tr x_t.
Buffer features_backward(const Shape& sh, const Buffer& X, std::int64_t L, const Buffer& W,
                         const Buffer& phi, const Buffer& d_phi, Buffer& dW) {
  const std::int64_t m = sh.m, d = sh.d;
  Buffer dX(static_cast<std::size_t>(L * d), 0.0);
  for (std::int64_t t = 0; t < L; ++t)
    for (std::int64_t r = 0; r < m; ++r) {
      const double g = d_phi[at(t, m, r)] * phi[at(t, m, r)];
      for (std::int64_t i = 0; i < d; ++i) {
        dX[at(t, d, i)] += g * (W[at(r, d, i)] - X[at(t, d, i)]);
        dW[at(r, d, i)] += g * X[at(t, d, i)];
      }
    }
  return dX;
}

void store_w_grad(const Shape& sh, const std::vector<Buffer>& dW, const TensorView& dw) {
  for (std::size_t h = 0; h < dW.size(); ++h)
    for (std::int64_t r = 0; r < sh.m; ++r)
      for (std::int64_t i = 0; i < sh.d; ++i)
        put(dw, sh.w_offset(dw, static_cast<std::int64_t>(h), r, i), dW[h][at(r, sh.d, i)]);
}

}  // namespace

void reference_features_forward(const FeatureProblem& p, const TensorView& phi) {
  const Shape& sh = p.shape;
  for (const Sequence& s : sh.sequences)
    for (std::int64_t h = 0; h < sh.H; ++h) {
      const Buffer X = load_rows(p.x, s, h, sh.d);
      store_rows(features(sh, X, s.length, load_w(sh, p.w, h), p.stabilizer), phi, s, h, sh.m);
    }
}

void reference_features_backward(const FeatureProblem& p, const TensorView& d_phi,
                                 const TensorView& dx, const TensorView& dw) {
  const Shape& sh = p.shape;
  std::vector<Buffer> dW(static_cast<std::size_t>(sh.w_per_head ? sh.H : 1),
                         Buffer(static_cast<std::size_t>(sh.m * sh.d), 0.0));
  for (const Sequence& s : sh.sequences)
    for (std::int64_t h = 0; h < sh.H; ++h) {
      const Buffer X = load_rows(p.x, s, h, sh.d);
      const Buffer W = load_w(sh, p.w, h);
      const Buffer phi = features(sh, X, s.length, W, p.stabilizer);
      const Buffer dX = features_backward(sh, X, s.length, W, phi, load_rows(d_phi, s, h, sh.m),
                                          dW[static_cast<std::size_t>(sh.w_per_head ? h : 0)]);
      if (dx.defined()) store_rows(dX, dx, s, h, sh.d);
    }
  if (dw.defined()) store_w_grad(sh, dW, dw);
}

namespace {

// One (sequence, head) of the attention in quadratic form, in log space. With the exponents
// e_q(i, r) = w_rᵀq̂_i − |q̂_i|²/2 and e_k(j, r) = w_rᵀk̂_j − |k̂_j|²/2 (no stabiliser: o does not
// depend on one), A_ij = φ(q̂_i)·φ(k̂_j) = Σ_r exp(e_q(i, r) + e_k(j, r)) / m, and the attention is a
// softmax over j of the logits ℓ_ij = log Σ_r exp(e_q(i, r) + e_k(j, r)) (the 1/m cancels):
//   o_i = Σ_j P_ij v_j,   P_ij = exp(ℓ_ij − lse_i),   lse_i = log Σ_j exp(ℓ_ij),
// j over all keys (non-causal) or j ≤ i (causal). Each ℓ_ij and lse_i is a log-sum-exp shifted by
// its largest term, so no A_ij or normaliser underflows: with a shared stabiliser, a key logit
// gap beyond ~700 (|k̂| ≈ 40) made every A_ij of a row 0 in float64 and o_i = 0/0, for any query
// whose features miss the key's (or, causal, every query before the sequence's largest key).
// ρ_ijr = exp(e_q(i, r) + e_k(j, r) − ℓ_ij), the share of feature r in A_ij, is kept for the
// backward.
struct Pair {
  Buffer Q, K, Vv, W, eq, ek, P, rho, O;
  std::int64_t L = 0;
  bool causal = false;
  std::int64_t end(std::int64_t i) const { return causal ? i + 1 : L; }
};

// e(t, r) = w_rᵀx_t − |x_t|²/2  (L × m).
Buffer exponents(const Shape& sh, const Buffer& X, std::int64_t L, const Buffer& W) {
  const std::int64_t m = sh.m, d = sh.d;
  Buffer e(static_cast<std::size_t>(L * m));
  for (std::int64_t t = 0; t < L; ++t) {
    double sq = 0;
    for (std::int64_t i = 0; i < d; ++i) sq += X[at(t, d, i)] * X[at(t, d, i)];
    for (std::int64_t r = 0; r < m; ++r) {
      double u = 0;
      for (std::int64_t i = 0; i < d; ++i) u += W[at(r, d, i)] * X[at(t, d, i)];
      e[at(t, m, r)] = u - 0.5 * sq;
    }
  }
  return e;
}

Pair attention_pair(const AttentionProblem& p, const Sequence& s, std::int64_t h) {
  const Shape& sh = p.shape;
  const std::int64_t L = s.length, m = sh.m, V = p.V;
  Pair r;
  r.L = L;
  r.causal = p.causal;
  r.Q = load_rows(p.q, s, h, sh.d, p.input_scale);
  r.K = load_rows(p.k, s, h, sh.d, p.input_scale);
  r.Vv = load_rows(p.v, s, h, V);
  r.W = load_w(sh, p.w, h);
  r.eq = exponents(sh, r.Q, L, r.W);
  r.ek = exponents(sh, r.K, L, r.W);
  r.P.assign(static_cast<std::size_t>(L * L), 0.0);
  r.rho.assign(static_cast<std::size_t>(L * L * m), 0.0);
  r.O.assign(static_cast<std::size_t>(L * V), 0.0);
  Buffer logit(static_cast<std::size_t>(L));
  for (std::int64_t i = 0; i < L; ++i) {
    double row_max = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < r.end(i); ++j) {
      double top = -std::numeric_limits<double>::infinity(), sum = 0;
      for (std::int64_t f = 0; f < m; ++f)
        top = std::max(top, r.eq[at(i, m, f)] + r.ek[at(j, m, f)]);
      for (std::int64_t f = 0; f < m; ++f)
        sum += std::exp(r.eq[at(i, m, f)] + r.ek[at(j, m, f)] - top);
      logit[static_cast<std::size_t>(j)] = top + std::log(sum);
      for (std::int64_t f = 0; f < m; ++f)
        r.rho[static_cast<std::size_t>((i * L + j) * m + f)] =
            std::exp(r.eq[at(i, m, f)] + r.ek[at(j, m, f)] - logit[static_cast<std::size_t>(j)]);
      row_max = std::max(row_max, logit[static_cast<std::size_t>(j)]);
    }
    double sum = 0;
    for (std::int64_t j = 0; j < r.end(i); ++j)
      sum += std::exp(logit[static_cast<std::size_t>(j)] - row_max);
    const double lse = row_max + std::log(sum);
    for (std::int64_t j = 0; j < r.end(i); ++j) {
      const double prob = std::exp(logit[static_cast<std::size_t>(j)] - lse);
      r.P[at(i, L, j)] = prob;
      for (std::int64_t c = 0; c < V; ++c) r.O[at(i, V, c)] += prob * r.Vv[at(j, V, c)];
    }
  }
  return r;
}

}  // namespace

void reference_attention_forward(const AttentionProblem& p, const TensorView& o) {
  for (const Sequence& s : p.shape.sequences)
    for (std::int64_t h = 0; h < p.shape.H; ++h)
      store_rows(attention_pair(p, s, h).O, o, s, h, p.V);
}

// The softmax adjoint dℓ_ij = P_ij (d_o_i·v_j − d_o_i·o_i), dv_j = Σ_i P_ij d_o_i; then through
// ℓ_ij = log Σ_r exp(e_q(i, r) + e_k(j, r)): ∂ℓ_ij/∂e_q(i, r) = ∂ℓ_ij/∂e_k(j, r) = ρ_ijr, and
// ∂e(t, r)/∂x̂_t = w_r − x̂_t, ∂e(t, r)/∂w_r = x̂_t:
//   dq̂_i = Σ_j dℓ_ij Σ_r ρ_ijr (w_r − q̂_i),  dk̂_j = Σ_i dℓ_ij Σ_r ρ_ijr (w_r − k̂_j),
//   dw_r = Σ_ij dℓ_ij ρ_ijr (q̂_i + k̂_j);  dq = s·dq̂, dk = s·dk̂.
void reference_attention_backward(const AttentionProblem& p, const TensorView& d_o,
                                  const FavorAttentionGrads& grads) {
  const Shape& sh = p.shape;
  const std::int64_t m = sh.m, V = p.V, d = sh.d;
  std::vector<Buffer> dW(static_cast<std::size_t>(sh.w_per_head ? sh.H : 1),
                         Buffer(static_cast<std::size_t>(m * d), 0.0));
  for (const Sequence& s : sh.sequences)
    for (std::int64_t h = 0; h < sh.H; ++h) {
      const std::int64_t L = s.length;
      const Pair r = attention_pair(p, s, h);
      const Buffer dO = load_rows(d_o, s, h, V);
      Buffer dV(static_cast<std::size_t>(L * V), 0.0), dQ(static_cast<std::size_t>(L * d), 0.0),
          dK(static_cast<std::size_t>(L * d), 0.0);
      Buffer& dWh = dW[static_cast<std::size_t>(sh.w_per_head ? h : 0)];
      for (std::int64_t i = 0; i < L; ++i) {
        double do_o = 0;
        for (std::int64_t c = 0; c < V; ++c) do_o += dO[at(i, V, c)] * r.O[at(i, V, c)];
        for (std::int64_t j = 0; j < r.end(i); ++j) {
          const double prob = r.P[at(i, L, j)];
          double do_v = 0;
          for (std::int64_t c = 0; c < V; ++c) {
            do_v += dO[at(i, V, c)] * r.Vv[at(j, V, c)];
            dV[at(j, V, c)] += prob * dO[at(i, V, c)];
          }
          const double dl = prob * (do_v - do_o);
          for (std::int64_t f = 0; f < m; ++f) {
            const double g = dl * r.rho[static_cast<std::size_t>((i * L + j) * m + f)];
            for (std::int64_t c = 0; c < d; ++c) {
              const double w = r.W[at(f, d, c)], q = r.Q[at(i, d, c)], k = r.K[at(j, d, c)];
              dQ[at(i, d, c)] += g * (w - q);
              dK[at(j, d, c)] += g * (w - k);
              dWh[at(f, d, c)] += g * (q + k);
            }
          }
        }
      }
      for (double& e : dQ) e *= p.input_scale;
      for (double& e : dK) e *= p.input_scale;
      if (grads.dq.defined()) store_rows(dQ, grads.dq, s, h, d);
      if (grads.dk.defined()) store_rows(dK, grads.dk, s, h, d);
      if (grads.dv.defined()) store_rows(dV, grads.dv, s, h, V);
    }
  if (grads.dw.defined()) store_w_grad(sh, dW, grads.dw);
}

}  // namespace phasor::detail::favor
