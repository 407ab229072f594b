// Structured rotation: the optimized kernel (blocks of tokens as Eigen matrix products in the
// compute type), the joint block decomposition (Lemma 1) and the Cayley transform (Lemma 3).
#include "common/eigen.h"  // first: see there

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "common/parallel.h"
#include "common/slices.h"
#include "structured_rotation/kernels.h"

namespace phasor::detail::structured_rotation {
namespace {

using MatD = Mat<double>;

// Tokens per work item (as apply_rotary: amortises the item overhead, keeps an item's matrices
// small, spreads a single long sequence over the threads).
constexpr std::int64_t kBlock = 64;

struct Item {
  Sequence rows;
  std::int64_t h;
};
std::int64_t num_items(const ApplyProblem& p) {
  return p.B * p.H * ((p.T + kBlock - 1) / kBlock);
}
Item item_of(const ApplyProblem& p, std::int64_t item) {
  const std::int64_t blocks = (p.T + kBlock - 1) / kBlock;
  const std::int64_t block = item % blocks, h = (item / blocks) % p.H, b = item / (blocks * p.H);
  const std::int64_t start = block * kBlock;
  return {Sequence{b, start, std::min(kBlock, p.T - start)}, h};
}

template <class S>
void load_matrix(const TensorView& x, Mat<S>& out) {
  slices_impl::load_2d(x, 0, x.size(0), x.stride(0), x.size(1), x.stride(1), out);
}

// The operands shared by all items, in the compute type S.
template <class S>
struct Operands {
  Mat<S> U, lambda, P;  // [K, 2m], [C, m], [K, K] (empty when absent)
  explicit Operands(const ApplyProblem& p) {
    load_matrix(p.basis, U);
    load_matrix(p.coefficients, lambda);
    if (p.post_rotation.defined()) load_matrix(p.post_rotation, P);
  }
};

// Rotates pair q of every row of V (columns 2q, 2q+1) by the angle theta(row, q) times sign.
template <class S>
void rotate_pairs(Mat<S>& V, const Mat<S>& theta, S sign) {
  for (Eigen::Index t = 0; t < V.rows(); ++t)
    for (Eigen::Index q = 0; q < theta.cols(); ++q) {
      const S c = std::cos(theta(t, q)), s = sign * std::sin(theta(t, q));
      const S a = V(t, 2 * q), b = V(t, 2 * q + 1);
      V(t, 2 * q) = a * c - b * s;
      V(t, 2 * q + 1) = a * s + b * c;
    }
}

template <class S>
void forward_impl(const ApplyProblem& p, const TensorView& y) {
  const Operands<S> o(p);
  parallel_for(num_items(p), [&](std::int64_t i) {
    const Item it = item_of(p, i);
    Mat<S> X, R;
    load_rows(p.x, it.rows, it.h, X);
    load_rows(p.positions, it.rows, it.h, R);
    if (o.P.size() > 0) X = (X * o.P.transpose()).eval();  // z' = P z, row-wise
    // Plane coordinates u = U_actᵀ z', angles θ = Λᵀ r (Lemma 2), rotated w = R2(θ) u, and
    // y = z' + U_act (w − u): the identity on the null space (eq. 11).
    const Mat<S> Uc = X * o.U;
    const Mat<S> theta = R * o.lambda;
    Mat<S> W = Uc;
    rotate_pairs(W, theta, S(1));
    X.noalias() += (W - Uc) * o.U.transpose();
    store_rows(X, y, it.rows, it.h);
  });
}

template <class S>
void backward_impl(const ApplyProblem& p, const TensorView& dy,
                   const StructuredRotationGrads& grads) {
  const Operands<S> o(p);
  const bool want_lambda = grads.d_coefficients.defined();
  const bool want_P = grads.d_post_rotation.defined();
  const std::int64_t n = num_items(p);
  // Per-item partial sums of the parameter gradients, reduced in item order afterwards, so the
  // result does not depend on the thread count.
  std::vector<MatD> part_lambda(static_cast<std::size_t>(want_lambda ? n : 0));
  std::vector<MatD> part_P(static_cast<std::size_t>(want_P ? n : 0));
  parallel_for(n, [&](std::int64_t i) {
    const Item it = item_of(p, i);
    Mat<S> X, R, G;
    load_rows(p.x, it.rows, it.h, X);
    load_rows(p.positions, it.rows, it.h, R);
    load_rows(dy, it.rows, it.h, G);
    Mat<S> Xp = o.P.size() > 0 ? Mat<S>(X * o.P.transpose()) : X;
    const Mat<S> theta = R * o.lambda;
    Mat<S> W = Xp * o.U;
    rotate_pairs(W, theta, S(1));
    const Mat<S> Gc = G * o.U;  // g = U_actᵀ dy
    Mat<S> dtheta(theta.rows(), theta.cols());
    for (Eigen::Index t = 0; t < theta.rows(); ++t)
      for (Eigen::Index q = 0; q < theta.cols(); ++q)
        dtheta(t, q) = Gc(t, 2 * q + 1) * W(t, 2 * q) - Gc(t, 2 * q) * W(t, 2 * q + 1);
    Mat<S> Gr = Gc;
    rotate_pairs(Gr, theta, S(-1));  // R2(−θ) g: Rᵀ dy in plane coordinates
    Mat<S> dXp = G;
    dXp.noalias() += (Gr - Gc) * o.U.transpose();
    if (grads.dx.defined()) {
      if (o.P.size() > 0)
        store_rows(Mat<S>(dXp * o.P), grads.dx, it.rows, it.h);
      else
        store_rows(dXp, grads.dx, it.rows, it.h);
    }
    if (grads.d_positions.defined())
      store_rows(Mat<S>(dtheta * o.lambda.transpose()), grads.d_positions, it.rows, it.h);
    if (want_lambda)
      part_lambda[static_cast<std::size_t>(i)] = (R.transpose() * dtheta).template cast<double>();
    if (want_P) part_P[static_cast<std::size_t>(i)] = (dXp.transpose() * X).template cast<double>();
  });
  if (want_lambda) {
    MatD acc = MatD::Zero(p.C, p.m);
    for (const MatD& m : part_lambda) acc += m;
    slices_impl::store_2d(acc, grads.d_coefficients, 0, grads.d_coefficients.stride(0),
                          grads.d_coefficients.stride(1));
  }
  if (want_P) {
    MatD acc = MatD::Zero(p.K, p.K);
    for (const MatD& m : part_P) acc += m;
    slices_impl::store_2d(acc, grads.d_post_rotation, 0, grads.d_post_rotation.stride(0),
                          grads.d_post_rotation.stride(1));
  }
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

void forward(const ApplyProblem& p, const TensorView& y) {
  dispatch_float(p.x, [&](auto s) { forward_impl<decltype(s)>(p, y); });
}
void backward(const ApplyProblem& p, const TensorView& dy, const StructuredRotationGrads& grads) {
  dispatch_float(p.x, [&](auto s) { backward_impl<decltype(s)>(p, dy, grads); });
}

// ---------------------------------------------------------------------------------------------
// Lemma 1. The paper's proof diagonalises the commuting family jointly over C and pairs conjugate
// eigenvectors; numerically the real Schur form Q T Qᵀ of one generic combination M = Σ c_k L_k
// gives the same planes directly (M is normal, so T is block diagonal: 2×2 blocks θ_p J on the
// planes, zeros on the null space). Every L_k commutes with M, so it preserves each eigenspace of
// M; for generic c distinct planes have distinct |θ_p| and each plane is an eigenspace, hence
// L_k-invariant, and L_k acts on it as a skew 2×2 block λ_{k,p} J.
std::int64_t decompose(const std::string& op, const StructuredDecompositionParams& params,
                       const StructuredDecompositionOutputs& out) {
  const TensorView& g = params.generators;
  const std::int64_t C = g.size(0), K = g.size(1);
  const double tol = params.tolerance;
  std::vector<Eigen::MatrixXd> L(static_cast<std::size_t>(C), Eigen::MatrixXd(K, K));
  double scale = 0;
  for (std::int64_t k = 0; k < C; ++k) {
    auto& Lk = L[static_cast<std::size_t>(k)];
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t j = 0; j < K; ++j) Lk(i, j) = get(g, offset_of(g, k, i, j));
    if (!Lk.allFinite())
      fail(op, "generators", "finite values", "a non-finite entry in L_" + std::to_string(k));
    scale = std::max(scale, Lk.norm());
  }
  for (std::int64_t k = 0; k < C; ++k) {
    const double asym =
        (L[static_cast<std::size_t>(k)] + L[static_cast<std::size_t>(k)].transpose()).norm();
    if (asym > tol * scale)
      fail(op, "generators",
           "skew-symmetric generators (‖L_k + L_kᵀ‖_F ≤ tolerance · max‖L‖_F = " +
               fmt(tol * scale) + ")",
           "‖L_" + std::to_string(k) + " + L_" + std::to_string(k) + "ᵀ‖_F = " + fmt(asym));
  }
  for (std::int64_t a = 0; a < C; ++a)
    for (std::int64_t b = a + 1; b < C; ++b) {
      const auto& La = L[static_cast<std::size_t>(a)];
      const auto& Lb = L[static_cast<std::size_t>(b)];
      const double comm = (La * Lb - Lb * La).norm();
      if (comm > tol * scale * scale)
        fail(op, "generators",
             "commuting generators (‖[L_i, L_j]‖_F ≤ tolerance · max‖L‖_F² = " +
                 fmt(tol * scale * scale) + ")",
             "‖[L_" + std::to_string(a) + ", L_" + std::to_string(b) + "]‖_F = " + fmt(comm));
    }
  for (auto& Lk : L) Lk = (0.5 * (Lk - Lk.transpose())).eval();  // exactly skew from here on

  const std::int64_t R = K / 2;
  Eigen::MatrixXd U = Eigen::MatrixXd::Identity(K, K), Lam = Eigen::MatrixXd::Zero(C, R);
  std::int64_t m = 0;
  bool ok = scale == 0;  // all generators zero: everything is null, U = I
  double worst = 0;
  for (int attempt = 0; attempt < 4 && !ok; ++attempt) {
    std::mt19937_64 rng(params.seed + static_cast<std::uint64_t>(attempt));
    std::normal_distribution<double> normal(0.0, 1.0);
    Eigen::MatrixXd M = Eigen::MatrixXd::Zero(K, K);
    for (const auto& Lk : L) M += normal(rng) * Lk;
    const Eigen::RealSchur<Eigen::MatrixXd> schur(M);
    const Eigen::MatrixXd& Q = schur.matrixU();
    const Eigen::MatrixXd& T = schur.matrixT();
    // Planes (columns i, i+1 of a 2×2 block of T) and single (null) columns. Active plane j:
    // columns (pa[j], pb[j]) of Q, coefficients lam_all.col(j).
    std::vector<Eigen::Index> pa, pb, null_cols;
    Eigen::MatrixXd lam_all(C, R);
    for (Eigen::Index i = 0; i < K;) {
      if (i + 1 < K && T(i + 1, i) != 0) {
        Eigen::VectorXd lam(C);
        for (std::int64_t k = 0; k < C; ++k) {
          const Eigen::MatrixXd B =
              Q.middleCols(i, 2).transpose() * L[static_cast<std::size_t>(k)] * Q.middleCols(i, 2);
          lam(k) = 0.5 * (B(1, 0) - B(0, 1));  // the block is λ J = [[0, −λ], [λ, 0]]
        }
        if (lam.cwiseAbs().maxCoeff() > tol * scale) {
          // Orientation: swapping the two columns flips λ's sign; make the largest one positive.
          Eigen::Index kmax = 0;
          lam.cwiseAbs().maxCoeff(&kmax);
          const bool flip = lam(kmax) < 0;
          pa.push_back(flip ? i + 1 : i);
          pb.push_back(flip ? i : i + 1);
          lam_all.col(static_cast<Eigen::Index>(pa.size()) - 1) =
              flip ? Eigen::VectorXd(-lam) : lam;
        } else {
          null_cols.push_back(i);
          null_cols.push_back(i + 1);
        }
        i += 2;
      } else {
        null_cols.push_back(i);
        i += 1;
      }
    }
    m = static_cast<std::int64_t>(pa.size());
    std::vector<std::int64_t> order(static_cast<std::size_t>(m));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::vector<double> norms(static_cast<std::size_t>(m));
    for (std::int64_t j = 0; j < m; ++j) norms[static_cast<std::size_t>(j)] = lam_all.col(j).norm();
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
      return norms[static_cast<std::size_t>(x)] > norms[static_cast<std::size_t>(y)];
    });
    Lam.setZero();
    std::int64_t col = 0;
    for (std::int64_t q = 0; q < m; ++q) {
      const auto j = static_cast<std::size_t>(order[static_cast<std::size_t>(q)]);
      U.col(col++) = Q.col(pa[j]);
      U.col(col++) = Q.col(pb[j]);
      Lam.col(q) = lam_all.col(static_cast<Eigen::Index>(j));
    }
    for (Eigen::Index c : null_cols) U.col(col++) = Q.col(c);
    // Lemma 1's reconstruction, checked: Uᵀ L_k U = (⊕ λ_{k,p} J) ⊕ 0. A combination whose
    // distinct planes happened to share |θ_p| would mix them and fail here; try another.
    worst = 0;
    for (std::int64_t k = 0; k < C; ++k) {
      Eigen::MatrixXd D = Eigen::MatrixXd::Zero(K, K);
      for (std::int64_t q = 0; q < m; ++q) {
        D(2 * q + 1, 2 * q) = Lam(k, q);
        D(2 * q, 2 * q + 1) = -Lam(k, q);
      }
      worst = std::max(worst, (U.transpose() * L[static_cast<std::size_t>(k)] * U - D).norm());
    }
    ok = worst <= std::sqrt(tol) * scale;
  }
  if (!ok)
    fail(op, "generators",
         "a family with a joint block decomposition (reconstruction ‖Uᵀ L_k U − blocks‖_F ≤ "
         "√tolerance · max‖L‖_F = " +
             fmt(std::sqrt(tol) * scale) + ")",
         "residual " + fmt(worst) + " after 4 random combinations");

  slices_impl::store_2d(MatD(U), out.basis, 0, out.basis.stride(0), out.basis.stride(1));
  slices_impl::store_2d(MatD(Lam), out.coefficients, 0, out.coefficients.stride(0),
                        out.coefficients.stride(1));
  // Eq. 9: Π_act = U_act U_actᵀ, Π_null = U_null U_nullᵀ.
  if (out.active_projector.defined()) {
    const MatD Pa = U.leftCols(2 * m) * U.leftCols(2 * m).transpose();
    slices_impl::store_2d(Pa, out.active_projector, 0, out.active_projector.stride(0),
                          out.active_projector.stride(1));
  }
  if (out.null_projector.defined()) {
    const MatD Pn = U.rightCols(K - 2 * m) * U.rightCols(K - 2 * m).transpose();
    slices_impl::store_2d(Pn, out.null_projector, 0, out.null_projector.stride(0),
                          out.null_projector.stride(1));
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// Lemma 3: Cayley(S) = (I − S)(I + S)⁻¹ = (I + S)⁻¹(I − S) (the factors commute), computed by one
// LU solve. With a null basis N the transform is embedded as I − N Nᵀ + N Cayley(S) Nᵀ (eq. 14).
namespace {
struct CayleyParts {
  Eigen::MatrixXd S, N;  // N empty when absent
  Eigen::PartialPivLU<Eigen::MatrixXd> lu;
};
CayleyParts cayley_parts(const std::string& op, const TensorView& s, const TensorView& null_basis) {
  CayleyParts c;
  MatD tmp;
  load_matrix(s, tmp);
  c.S = tmp;
  if (null_basis.defined()) {
    load_matrix(null_basis, tmp);
    c.N = tmp;
  }
  if (!c.S.allFinite()) fail(op, "s", "finite values", "a non-finite entry");
  const Eigen::Index n = c.S.rows();
  c.lu.compute(Eigen::MatrixXd::Identity(n, n) + c.S);
  // I + S is invertible for every skew S (eigenvalues 1 + iμ); a non-skew S may not be.
  if (n > 0 && !(c.lu.rcond() > 1e-12))
    fail(op, "s", "I + s invertible (it is for skew-symmetric s)",
         "reciprocal condition number " + fmt(c.lu.rcond()));
  return c;
}
}  // namespace

void cayley_forward(const std::string& op, const TensorView& s, const TensorView& null_basis,
                    const TensorView& p) {
  const CayleyParts c = cayley_parts(op, s, null_basis);
  const Eigen::Index n = c.S.rows();
  const Eigen::MatrixXd Cay = c.lu.solve(Eigen::MatrixXd::Identity(n, n) - c.S);
  MatD P;
  if (null_basis.defined()) {
    const Eigen::Index K = c.N.rows();
    P = Eigen::MatrixXd::Identity(K, K) - c.N * c.N.transpose() + c.N * Cay * c.N.transpose();
  } else {
    P = Cay;
  }
  slices_impl::store_2d(P, p, 0, p.stride(0), p.stride(1));
}

// Cayley(S) = 2A − I with A = (I + S)⁻¹, δA = −A δS A, so ∂L/∂S = −2 Aᵀ dC Aᵀ, by two solves:
// X = Aᵀ dC solves (I + S)ᵀ X = dC, and X Aᵀ = (A Xᵀ)ᵀ.
void cayley_backward(const std::string& op, const TensorView& s, const TensorView& null_basis,
                     const TensorView& dp, const TensorView& ds) {
  const CayleyParts c = cayley_parts(op, s, null_basis);
  MatD tmp;
  load_matrix(dp, tmp);
  Eigen::MatrixXd dC = tmp;
  if (null_basis.defined()) dC = (c.N.transpose() * dC * c.N).eval();
  const Eigen::MatrixXd X = c.lu.transpose().solve(dC);
  const Eigen::MatrixXd AXt = c.lu.solve(X.transpose());
  const MatD dS = -2.0 * AXt.transpose();
  slices_impl::store_2d(dS, ds, 0, ds.stride(0), ds.stride(1));
}

}  // namespace phasor::detail::structured_rotation
