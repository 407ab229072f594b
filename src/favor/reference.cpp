// FAVOR+: the float64 reference, plain loops straight from the equations in favor.h. It reads and
// writes views element by element; the tests trust it. The attention is computed in its quadratic
// form (A_ij = φ(q̂_i)·φ(k̂_j), o_i = Σ_j A_ij v_j / Σ_j A_ij), independently of the optimized
// kernel's prefix sums.
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

// φ(x_t)_r = exp(w_rᵀx_t − |x_t|²/2 − c)/√m  (L × m), c as in favor.h.
Buffer features(const Shape& sh, const Buffer& X, std::int64_t L, const Buffer& W,
                FavorStabilizer stabilizer) {
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
// One (sequence, head) of the attention in quadratic form: A_ij = φ(q̂_i)·φ(k̂_j) for j in the
// window (all j, or j ≤ i), o_i = Σ_j A_ij v_j / Σ_j A_ij. The keys use the whole-sequence
// stabiliser even when causal: o does not depend on it, and float64's range covers key logit gaps
// up to ~700 (the optimized float32 kernels need the running max of favor.h instead).
struct Pair {
  Buffer Q, K, Vv, W, phi_q, phi_k, A, den, O;
};
Pair attention_pair(const AttentionProblem& p, const Sequence& s, std::int64_t h) {
  const Shape& sh = p.shape;
  const std::int64_t L = s.length, m = sh.m, V = p.V;
  Pair r;
  r.Q = load_rows(p.q, s, h, sh.d, p.input_scale);
  r.K = load_rows(p.k, s, h, sh.d, p.input_scale);
  r.Vv = load_rows(p.v, s, h, V);
  r.W = load_w(sh, p.w, h);
  r.phi_q = features(sh, r.Q, L, r.W, FavorStabilizer::query);
  r.phi_k = features(sh, r.K, L, r.W, FavorStabilizer::key);
  r.A.assign(static_cast<std::size_t>(L * L), 0.0);
  r.den.assign(static_cast<std::size_t>(L), 0.0);
  r.O.assign(static_cast<std::size_t>(L * V), 0.0);
  for (std::int64_t i = 0; i < L; ++i) {
    const std::int64_t end = p.causal ? i + 1 : L;
    for (std::int64_t j = 0; j < end; ++j) {
      double a = 0;
      for (std::int64_t f = 0; f < m; ++f) a += r.phi_q[at(i, m, f)] * r.phi_k[at(j, m, f)];
      r.A[at(i, L, j)] = a;
      r.den[static_cast<std::size_t>(i)] += a;
      for (std::int64_t c = 0; c < V; ++c) r.O[at(i, V, c)] += a * r.Vv[at(j, V, c)];
    }
    for (std::int64_t c = 0; c < V; ++c) r.O[at(i, V, c)] /= r.den[static_cast<std::size_t>(i)];
  }
  return r;
}
}  // namespace

void reference_attention_forward(const AttentionProblem& p, const TensorView& o) {
  for (const Sequence& s : p.shape.sequences)
    for (std::int64_t h = 0; h < p.shape.H; ++h)
      store_rows(attention_pair(p, s, h).O, o, s, h, p.V);
}

// dA_ij = (d_o_i·v_j − d_o_i·o_i)/den_i,  dv_j = Σ_i A_ij d_o_i/den_i,
// dφ(q̂_i) = Σ_j dA_ij φ(k̂_j),  dφ(k̂_j) = Σ_i dA_ij φ(q̂_i);  then the features' backward and
// dq = s·dq̂, dk = s·dk̂ (the stabilisers held constant: o does not depend on them).
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
      Buffer dV(static_cast<std::size_t>(L * V), 0.0), dphi_q(static_cast<std::size_t>(L * m), 0.0),
          dphi_k(static_cast<std::size_t>(L * m), 0.0);
      for (std::int64_t i = 0; i < L; ++i) {
        const double den = r.den[static_cast<std::size_t>(i)];
        double do_o = 0;
        for (std::int64_t c = 0; c < V; ++c) do_o += dO[at(i, V, c)] * r.O[at(i, V, c)];
        const std::int64_t end = p.causal ? i + 1 : L;
        for (std::int64_t j = 0; j < end; ++j) {
          double do_v = 0;
          for (std::int64_t c = 0; c < V; ++c) {
            do_v += dO[at(i, V, c)] * r.Vv[at(j, V, c)];
            dV[at(j, V, c)] += r.A[at(i, L, j)] * dO[at(i, V, c)] / den;
          }
          const double dA = (do_v - do_o) / den;
          for (std::int64_t f = 0; f < m; ++f) {
            dphi_q[at(i, m, f)] += dA * r.phi_k[at(j, m, f)];
            dphi_k[at(j, m, f)] += dA * r.phi_q[at(i, m, f)];
          }
        }
      }
      Buffer& dWh = dW[static_cast<std::size_t>(sh.w_per_head ? h : 0)];
      Buffer dQ = features_backward(sh, r.Q, L, r.W, r.phi_q, dphi_q, dWh);
      Buffer dK = features_backward(sh, r.K, L, r.W, r.phi_k, dphi_k, dWh);
      for (double& e : dQ) e *= p.input_scale;
      for (double& e : dK) e *= p.input_scale;
      if (grads.dq.defined()) store_rows(dQ, grads.dq, s, h, d);
      if (grads.dk.defined()) store_rows(dK, grads.dk, s, h, d);
      if (grads.dv.defined()) store_rows(dV, grads.dv, s, h, V);
    }
  if (grads.dw.defined()) store_w_grad(sh, dW, grads.dw);
}

}  // namespace phasor::detail::favor
