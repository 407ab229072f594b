// FAVOR+: the random feature matrices and the optimized CPU kernels (Eigen products per
// (sequence, head) pair; the causal attention runs on phasor's GLA kernel).
#include "common/eigen.h"  // first: see there

#include <Eigen/QR>
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/parallel.h"
#include "common/slices.h"
#include "favor/kernels.h"
#include "phasor/gla.h"

namespace phasor::detail::favor {
namespace {

// ---------------------------------------------------------------------------------------------
// Random matrices.

// Standard normal samples, identical on every platform for a seed: std::mt19937_64's output
// sequence is fixed by the C++ standard, std::normal_distribution's algorithm is not, so we apply
// the Box–Muller transform ourselves (pairs; the second sample of a pair is kept for the next
// call). Uniforms take the top 53 bits of each 64-bit draw.
class Gaussian {
 public:
  explicit Gaussian(std::uint64_t seed) : rng_(seed) {}
  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
    const double u2 = uniform();        // [0, 1)
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * 3.14159265358979323846 * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// One head's m × d matrix. Draw order (part of the reproducibility contract): iid → m·d samples
// row-major; orthogonal → for each block of d rows, d·d samples row-major for its Gaussian matrix,
// then (chi only) d samples per row for the m row norms.
Eigen::MatrixXd draw_matrix(FavorMatrixKind kind, std::int64_t m, std::int64_t d, Gaussian& g) {
  Eigen::MatrixXd W(m, d);
  if (kind == FavorMatrixKind::iid) {
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t i = 0; i < d; ++i) W(r, i) = g();
    return W;
  }
  for (std::int64_t r0 = 0; r0 < m; r0 += d) {
    Eigen::MatrixXd G(d, d);
    for (std::int64_t r = 0; r < d; ++r)
      for (std::int64_t i = 0; i < d; ++i) G(r, i) = g();
    const Eigen::HouseholderQR<Eigen::MatrixXd> qr(G);
    Eigen::MatrixXd Q = qr.householderQ() * Eigen::MatrixXd::Identity(d, d);
    // G = QR is unique once diag(R) > 0; Householder leaves the signs arbitrary, which would bias
    // Q away from the Haar measure (Mezzadri 2007). Flip column j of Q when R_jj < 0.
    for (std::int64_t j = 0; j < d; ++j)
      if (qr.matrixQR()(j, j) < 0) Q.col(j) *= -1.0;
    const std::int64_t rows = std::min(d, m - r0);
    W.middleRows(r0, rows) = Q.transpose().topRows(rows);  // orthonormal rows
  }
  for (std::int64_t r = 0; r < m; ++r) {
    double norm = std::sqrt(static_cast<double>(d));
    if (kind == FavorMatrixKind::orthogonal_chi) {
      double sq = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        const double z = g();
        sq += z * z;
      }
      norm = std::sqrt(sq);  // chi(d): the norm of a N(0, I_d) vector
    }
    W.row(r) *= norm;
  }
  return W;
}

// ---------------------------------------------------------------------------------------------
// Features.

template <class S>
Mat<S> load_w(const Shape& sh, const TensorView& w, std::int64_t h) {
  Mat<S> out;
  const std::int64_t base = sh.w_per_head ? h * w.stride(0) : 0;
  slices_impl::load_2d(w, base, sh.m, w.stride(w.rank - 2), sh.d, w.stride(w.rank - 1), out);
  return out;
}
template <class M>
void store_w(const Shape& sh, const M& in, const TensorView& w, std::int64_t h) {
  const std::int64_t base = sh.w_per_head ? h * w.stride(0) : 0;
  slices_impl::store_2d(in, w, base, w.stride(w.rank - 2), w.stride(w.rank - 1));
}

// Φ = exp(X Wᵀ − |x|²/2 − c)/√m (L × m), c as in favor.h. With the query stabiliser the row's
// |x|²/2 cancels in the exponent, u − max_r u = w_rᵀx − max_r w_rᵀx, and is left out: in float32
// it would round the exponent by eps |x|²/2 (3e-4 at |x| = 100) for nothing.
template <class S>
void compute_features(const Mat<S>& X, const Mat<S>& W, FavorStabilizer stabilizer, Mat<S>& phi) {
  phi.noalias() = X * W.transpose();
  if (phi.size() == 0) return;
  if (stabilizer == FavorStabilizer::query) {
    const Vec<S> c = phi.rowwise().maxCoeff();  // evaluated before phi changes
    phi.colwise() -= c;
  } else {
    const Vec<S> half_sq = S(0.5) * X.rowwise().squaredNorm();
    phi.colwise() -= half_sq;
    if (stabilizer == FavorStabilizer::key) {
      const S c = phi.maxCoeff();
      phi.array() -= c;
    }
  }
  phi = (phi.array().exp() * (S(1) / std::sqrt(static_cast<S>(W.rows())))).matrix();
}

// The attention's features, stabilised per feature (favor.h). With the key exponents
// u_j,r = w_rᵀk̂_j − |k̂_j|²/2 and a stabiliser c_r per feature r — the max over the sequence's keys
// (non-causal), or the running max c_t,r = max_{s ≤ t} u_s,r (causal) — the key features are
// Φ_k(j, r) = exp(u_j,r − c_r) ≤ 1, and c_r moves to the queries: Φ_q(i, r) = exp(w_rᵀq̂_i + c_r
// − C_i) with C_i = max_r (w_rᵀq̂_i + c_r) (the query's |q̂_i|²/2 is common to its features and
// cancels, as C_i does, in o_i = Φ_q(i)ᵀ S_i / Φ_q(i)ᵀ z_i). So A_ij = Σ_r Φ_q(i, r) Φ_k(j, r) is
// φ(q̂_i)·φ(k̂_j) times a factor of row i alone, and the normaliser is never below 1: at the
// query's largest feature r*, Φ_q(i, r*) = 1 and z_r* ≥ 1 (it holds the key that sets c_r*).
// One stabiliser for all features (favor.h's former key max) left Φ_q(i)ᵀ z_i = 0 in float32 —
// o_i = 0/0 — whenever the query's features missed the largest keys' by more than ~100 in the
// exponent (|q̂|, |k̂| of ~100; even for T = 1).
template <class S>
struct AttentionFeatures {
  Mat<S> Fq, Fk;  // L × m
  Mat<S> gates;   // causal: L × m log gates g_t,r = c_{t−1},r − c_t,r ≤ 0 (0 at t = 0)
};

template <class S>
AttentionFeatures<S> attention_features(const Mat<S>& Q, const Mat<S>& K, const Mat<S>& W,
                                        bool causal) {
  AttentionFeatures<S> f;
  const std::int64_t L = K.rows(), m = W.rows();
  Mat<S> u = K * W.transpose();
  u.colwise() -= Vec<S>(S(0.5) * K.rowwise().squaredNorm());
  Mat<S> c(causal ? L : std::min<std::int64_t>(L, 1), m);  // c_r, or c_t,r (causal)
  if (causal) {
    f.gates.resize(L, m);
    for (std::int64_t t = 0; t < L; ++t)
      for (std::int64_t r = 0; r < m; ++r) {
        c(t, r) = t == 0 ? u(t, r) : std::max(c(t - 1, r), u(t, r));
        f.gates(t, r) = t == 0 ? S(0) : c(t - 1, r) - c(t, r);
      }
    f.Fk = (u - c).array().exp().matrix();
  } else if (L > 0) {
    c = u.colwise().maxCoeff();
    f.Fk = (u.rowwise() - c.row(0)).array().exp().matrix();
  }
  Mat<S> a = Q * W.transpose();
  if (causal)
    a += c;
  else if (L > 0)
    a.rowwise() += c.row(0);
  const Vec<S> top = a.rowwise().maxCoeff();
  f.Fq = (a.colwise() - top).array().exp().matrix();
  return f;
}

// G = dΦ ⊙ Φ: dX = G W − diag(Σ_r G) X;  dW += Gᵀ X when dW is wanted (c held constant). For the
// attention's query features, whose exponent has no −|x|²/2 (see attention_features), the second
// term is not there (with_half_square false): Σ_r G is 0 exactly (o does not change when all of a
// row's features scale together), and computed it is rounding, times |q̂|.
template <class S>
void features_grad(const Mat<S>& X, const Mat<S>& W, const Mat<S>& phi, const Mat<S>& d_phi,
                   Mat<S>& dX, Mat<S>* dW, bool with_half_square = true) {
  const Mat<S> G = d_phi.cwiseProduct(phi);
  dX.noalias() = G * W;
  if (with_half_square) dX -= G.rowwise().sum().asDiagonal() * X;
  if (dW) dW->noalias() += G.transpose() * X;  // m·L·d: skipped for fixed features
}

// Sums the per-item gradients of w (item = n·H + h) in item order, so dw is bit-identical for any
// thread count, and stores it.
template <class S>
void reduce_store_dw(const Shape& sh, const std::vector<Mat<S>>& partial, const TensorView& dw) {
  const std::int64_t heads = sh.w_per_head ? sh.H : 1;
  for (std::int64_t hw = 0; hw < heads; ++hw) {
    Mat<S> sum = Mat<S>::Zero(sh.m, sh.d);
    for (std::size_t item = 0; item < partial.size(); ++item) {
      const std::int64_t h = static_cast<std::int64_t>(item) % sh.H;
      if (!sh.w_per_head || h == hw) sum += partial[item];
    }
    store_w(sh, sum, dw, hw);
  }
}

template <class S>
void features_forward_impl(const FeatureProblem& p, const TensorView& phi) {
  const Shape& sh = p.shape;
  parallel_for(sh.num_sequences() * sh.H, [&](std::int64_t item) {
    const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
    const std::int64_t h = item % sh.H;
    if (s.length == 0) return;
    Mat<S> X, F;
    load_rows(p.x, s, h, X);
    compute_features(X, load_w<S>(sh, p.w, h), p.stabilizer, F);
    store_rows(F, phi, s, h);
  });
}

template <class S>
void features_backward_impl(const FeatureProblem& p, const TensorView& d_phi, const TensorView& dx,
                            const TensorView& dw) {
  const Shape& sh = p.shape;
  const std::int64_t items = sh.num_sequences() * sh.H;
  std::vector<Mat<S>> dW(static_cast<std::size_t>(dw.defined() ? items : 0));
  parallel_for(items, [&](std::int64_t item) {
    const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
    const std::int64_t h = item % sh.H;
    Mat<S> dWi = dw.defined() ? Mat<S>(Mat<S>::Zero(sh.m, sh.d)) : Mat<S>();
    if (s.length > 0) {
      Mat<S> X, F, dF, dX;
      load_rows(p.x, s, h, X);
      const Mat<S> W = load_w<S>(sh, p.w, h);
      compute_features(X, W, p.stabilizer, F);
      load_rows(d_phi, s, h, dF);
      features_grad(X, W, F, dF, dX, dw.defined() ? &dWi : nullptr);
      if (dx.defined()) store_rows(dX, dx, s, h);
    }
    if (dw.defined()) dW[static_cast<std::size_t>(item)] = std::move(dWi);
  });
  if (dw.defined()) reduce_store_dw(sh, dW, dw);
}

// ---------------------------------------------------------------------------------------------
// Attention.

// The scaled inputs q̂ = s·q (L × d) of one pair.
template <class S>
Mat<S> load_scaled(const AttentionProblem& p, const TensorView& x, const Sequence& s,
                   std::int64_t h) {
  Mat<S> X;
  load_rows(x, s, h, X);
  X *= static_cast<S>(p.input_scale);
  return X;
}

// [v | 1] (L × (V + 1)): the last column turns the numerator's sums into the normaliser z.
template <class S>
Mat<S> load_v_ext(const AttentionProblem& p, const Sequence& s, std::int64_t h) {
  Mat<S> V, Vx(s.length, p.V + 1);
  load_rows(p.v, s, h, V);
  Vx.leftCols(p.V) = V;
  Vx.col(p.V).setOnes();
  return Vx;
}

// From Ox = [numerator | denominator] (L × (V + 1)) and d_o: o = num/den and
//   d num = d_o/den,   d den = −(d_o·o)/den.
template <class S>
Mat<S> output_grad(const Mat<S>& Ox, const Mat<S>& dO, std::int64_t V) {
  const Vec<S> inv_den = Ox.col(V).cwiseInverse();
  const Mat<S> O = inv_den.asDiagonal() * Ox.leftCols(V);
  Mat<S> dOx(Ox.rows(), V + 1);
  dOx.leftCols(V) = inv_den.asDiagonal() * dO;
  dOx.col(V) = -(dO.cwiseProduct(O).rowwise().sum()).cwiseProduct(inv_den);
  return dOx;
}

// Contiguous [B, T, H, n] scratch tensors of the compute type, for the causal path's GLA call.
template <class S>
struct Scratch {
  std::vector<S> data;
  TensorView view;
  Scratch(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t n)
      : data(static_cast<std::size_t>(B * T * H * n), S(0)),
        view(TensorView::of(data.data(), {B, T, H, n})) {}
};

// The causal path: the features of attention_features (keys with the running stabiliser per
// feature, its log gates g_t,r, and the queries carrying c_t,r) and [v | 1] written to scratch
// tensors, then
//   Ox_t = Σ_{j ≤ t} (Σ_r Φ_q(t, r) exp(u_j,r − c_t,r)) [v_j | 1]
// by GLA (S_t = diag(exp(g_t)) S_{t−1} + Φ_k(t) [v_t | 1]ᵀ, o_t = S_tᵀ Φ_q(t); scale 1): the
// prefix sums of every feature r scaled by its own exp(−c_t,r), which the queries' exp(+c_t,r)
// undoes, leaving a factor of row t alone that cancels in o_t = num/den. The backward holds c (so
// the gates) constant, exact because o does not depend on c: GLA's dg is not needed.
template <class S>
struct CausalState {
  std::int64_t B, T;
  Scratch<S> phi_q, phi_k, gates, v_ext, o_ext;
  GlaParams gla;
  CausalState(const AttentionProblem& p)
      : B(p.q.size(0)),
        T(p.q.size(1)),
        phi_q(B, T, p.shape.H, p.shape.m),
        phi_k(B, T, p.shape.H, p.shape.m),
        gates(B, T, p.shape.H, p.shape.m),
        v_ext(B, T, p.shape.H, p.V + 1),
        o_ext(B, T, p.shape.H, p.V + 1) {
    const Shape& sh = p.shape;
    parallel_for(sh.num_sequences() * sh.H, [&](std::int64_t item) {
      const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
      const std::int64_t h = item % sh.H;
      if (s.length == 0) return;
      const AttentionFeatures<S> f = attention_features(
          load_scaled<S>(p, p.q, s, h), load_scaled<S>(p, p.k, s, h), load_w<S>(sh, p.w, h), true);
      store_rows(f.Fq, phi_q.view, s, h);
      store_rows(f.Fk, phi_k.view, s, h);
      store_rows(f.gates, gates.view, s, h);  // restart at each sequence's first token
      store_rows(load_v_ext<S>(p, s, h), v_ext.view, s, h);
    });
    gla.q = phi_q.view;
    gla.k = phi_k.view;
    gla.v = v_ext.view;
    gla.g = gates.view;
    gla.cu_seqlens = p.cu_seqlens;
    gla.scale = 1.0;
    gla.chunk_size = p.chunk_size;
    gla_forward(gla, p.impl, o_ext.view);
  }
};

template <class S>
void attention_forward_impl(const AttentionProblem& p, const TensorView& o) {
  const Shape& sh = p.shape;
  if (p.causal) {
    CausalState<S> st(p);
    parallel_for(sh.num_sequences() * sh.H, [&](std::int64_t item) {
      const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
      const std::int64_t h = item % sh.H;
      if (s.length == 0) return;
      Mat<S> Ox;
      load_rows(st.o_ext.view, s, h, Ox);
      const Mat<S> O = Ox.col(p.V).cwiseInverse().asDiagonal() * Ox.leftCols(p.V);
      store_rows(O, o, s, h);
    });
    return;
  }
  parallel_for(sh.num_sequences() * sh.H, [&](std::int64_t item) {
    const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
    const std::int64_t h = item % sh.H;
    if (s.length == 0) return;
    const AttentionFeatures<S> f = attention_features(
        load_scaled<S>(p, p.q, s, h), load_scaled<S>(p, p.k, s, h), load_w<S>(sh, p.w, h), false);
    const Mat<S> Sx = f.Fk.transpose() * load_v_ext<S>(p, s, h);  // [S | z], m × (V + 1)
    const Mat<S> Ox = f.Fq * Sx;
    const Mat<S> O = Ox.col(p.V).cwiseInverse().asDiagonal() * Ox.leftCols(p.V);
    store_rows(O, o, s, h);
  });
}

// The features' backward for q and k of one pair: dq = s·dq̂, dk = s·dk̂; dW accumulated.
template <class S>
void qk_grads(const AttentionProblem& p, const FavorAttentionGrads& grads, const Sequence& s,
              std::int64_t h, const Mat<S>& W, const Mat<S>& Fq, const Mat<S>& dFq,
              const Mat<S>& Fk, const Mat<S>& dFk, Mat<S>* dW) {
  Mat<S> dX;
  features_grad(load_scaled<S>(p, p.q, s, h), W, Fq, dFq, dX, dW, /*with_half_square=*/false);
  if (grads.dq.defined()) store_rows(Mat<S>(dX * static_cast<S>(p.input_scale)), grads.dq, s, h);
  features_grad(load_scaled<S>(p, p.k, s, h), W, Fk, dFk, dX, dW);
  if (grads.dk.defined()) store_rows(Mat<S>(dX * static_cast<S>(p.input_scale)), grads.dk, s, h);
}

template <class S>
void attention_backward_impl(const AttentionProblem& p, const TensorView& d_o,
                             const FavorAttentionGrads& grads) {
  const Shape& sh = p.shape;
  const std::int64_t items = sh.num_sequences() * sh.H;
  std::vector<Mat<S>> dW(static_cast<std::size_t>(grads.dw.defined() ? items : 0));
  if (p.causal) {
    CausalState<S> st(p);
    Scratch<S> d_o_ext(st.B, st.T, sh.H, p.V + 1);
    parallel_for(items, [&](std::int64_t item) {
      const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
      const std::int64_t h = item % sh.H;
      if (s.length == 0) return;
      Mat<S> Ox, dO;
      load_rows(st.o_ext.view, s, h, Ox);
      load_rows(d_o, s, h, dO);
      store_rows(output_grad(Ox, dO, p.V), d_o_ext.view, s, h);
    });
    Scratch<S> d_phi_q(st.B, st.T, sh.H, sh.m), d_phi_k(st.B, st.T, sh.H, sh.m),
        d_v_ext(st.B, st.T, sh.H, p.V + 1);
    GlaGrads gg;
    gg.dq = d_phi_q.view;
    gg.dk = d_phi_k.view;
    gg.dv = d_v_ext.view;
    gla_backward(st.gla, p.impl, d_o_ext.view, {}, gg);
    parallel_for(items, [&](std::int64_t item) {
      const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
      const std::int64_t h = item % sh.H;
      Mat<S> dWi = grads.dw.defined() ? Mat<S>(Mat<S>::Zero(sh.m, sh.d)) : Mat<S>();
      if (s.length > 0) {
        Mat<S> Fq, Fk, dFq, dFk, dVx;
        load_rows(st.phi_q.view, s, h, Fq);
        load_rows(st.phi_k.view, s, h, Fk);
        load_rows(d_phi_q.view, s, h, dFq);
        load_rows(d_phi_k.view, s, h, dFk);
        qk_grads(p, grads, s, h, load_w<S>(sh, p.w, h), Fq, dFq, Fk, dFk,
                 grads.dw.defined() ? &dWi : nullptr);
        if (grads.dv.defined()) {
          load_rows(d_v_ext.view, s, h, dVx);
          store_rows(Mat<S>(dVx.leftCols(p.V)), grads.dv, s, h);
        }
      }
      if (grads.dw.defined()) dW[static_cast<std::size_t>(item)] = std::move(dWi);
    });
  } else {
    parallel_for(items, [&](std::int64_t item) {
      const Sequence& s = sh.sequences[static_cast<std::size_t>(item / sh.H)];
      const std::int64_t h = item % sh.H;
      Mat<S> dWi = grads.dw.defined() ? Mat<S>(Mat<S>::Zero(sh.m, sh.d)) : Mat<S>();
      if (s.length > 0) {
        const Mat<S> W = load_w<S>(sh, p.w, h);
        const AttentionFeatures<S> f = attention_features(load_scaled<S>(p, p.q, s, h),
                                                          load_scaled<S>(p, p.k, s, h), W, false);
        const Mat<S>&Fq = f.Fq, &Fk = f.Fk;
        Mat<S> dO;
        const Mat<S> Vx = load_v_ext<S>(p, s, h);
        const Mat<S> Sx = Fk.transpose() * Vx;
        load_rows(d_o, s, h, dO);
        const Mat<S> dOx = output_grad(Mat<S>(Fq * Sx), dO, p.V);
        const Mat<S> dFq = dOx * Sx.transpose();
        const Mat<S> dSx = Fq.transpose() * dOx;
        const Mat<S> dFk = Vx * dSx.transpose();
        qk_grads(p, grads, s, h, W, Fq, dFq, Fk, dFk, grads.dw.defined() ? &dWi : nullptr);
        if (grads.dv.defined()) store_rows(Mat<S>((Fk * dSx).leftCols(p.V)), grads.dv, s, h);
      }
      if (grads.dw.defined()) dW[static_cast<std::size_t>(item)] = std::move(dWi);
    });
  }
  if (grads.dw.defined()) reduce_store_dw(sh, dW, grads.dw);
}

}  // namespace

void random_matrix(FavorMatrixKind kind, std::uint64_t seed, const TensorView& w) {
  const bool per_head = w.rank == 3;
  const std::int64_t H = per_head ? w.size(0) : 1, m = w.size(w.rank - 2), d = w.size(w.rank - 1);
  Gaussian g(seed);
  for (std::int64_t h = 0; h < H; ++h) {
    const Eigen::MatrixXd W = draw_matrix(kind, m, d, g);
    const std::int64_t base = per_head ? h * w.stride(0) : 0;
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t i = 0; i < d; ++i)
        put(w, base + r * w.stride(w.rank - 2) + i * w.stride(w.rank - 1), W(r, i));
  }
}

void features_forward(const FeatureProblem& p, const TensorView& phi) {
  dispatch_float(p.x, [&](auto s) { features_forward_impl<decltype(s)>(p, phi); });
}
void features_backward(const FeatureProblem& p, const TensorView& d_phi, const TensorView& dx,
                       const TensorView& dw) {
  dispatch_float(p.x, [&](auto s) { features_backward_impl<decltype(s)>(p, d_phi, dx, dw); });
}
void attention_forward(const AttentionProblem& p, const TensorView& o) {
  dispatch_float(p.q, [&](auto s) { attention_forward_impl<decltype(s)>(p, o); });
}
void attention_backward(const AttentionProblem& p, const TensorView& d_o,
                        const FavorAttentionGrads& grads) {
  dispatch_float(p.q, [&](auto s) { attention_backward_impl<decltype(s)>(p, d_o, grads); });
}

}  // namespace phasor::detail::favor
