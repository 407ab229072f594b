// Tests of multiplicative GRAPE (grape.h): the Rodrigues closed form against a dense matrix
// exponential in float64 (random and degenerate generators), the paper's theorems (one-parameter
// group law, orthogonality and det = +1, relative logits, RoPE as the special case), optimized vs
// reference kernels (float32/float64, adversarial inputs), central finite-difference gradients of
// every learnable input in float64 (including ν → 0), and errors for bad input.
#include "common/eigen.h"  // first: see there

#include "phasor/grape.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "grape/kernels.h"
#include "phasor/rotary.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/matrix_exp.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;
using MatD = Eigen::MatrixXd;
using VecD = Eigen::VectorXd;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr Impl kFast = Impl::chunk;

// ---------------------------------------------------------------------------------------------
// Single plane: cases and runners.

struct PlaneCase {
  Tensor z, a, b, omega, positions;
  std::int64_t B = 0, T = 0, H = 0, K = 0;
  GrapeParams params() const {
    return {z.view(), a.view(), b.view(), omega.view(), positions.view()};
  }
};

PlaneCase make_plane_case(std::mt19937_64& rng, std::int64_t B, std::int64_t T, std::int64_t H,
                          std::int64_t K, bool ab_per_head, bool positions_per_head,
                          DType dtype = DType::float64, double position_scale = 1.0) {
  PlaneCase c;
  c.B = B;
  c.T = T;
  c.H = H;
  c.K = K;
  c.z = testing::randn({B, T, H, K}, rng, 1.0, dtype);
  const std::vector<std::int64_t> ab_shape =
      ab_per_head ? std::vector<std::int64_t>{H, K} : std::vector<std::int64_t>{K};
  c.a = testing::randn(ab_shape, rng, 1.0 / std::sqrt(double(K)), dtype);
  c.b = testing::randn(ab_shape, rng, 1.0 / std::sqrt(double(K)), dtype);
  c.omega = testing::uniform({H}, rng, 0.2, 1.5, dtype);
  c.positions =
      positions_per_head
          ? testing::uniform({B, T, H}, rng, -3 * position_scale, 5 * position_scale, dtype)
          : testing::uniform({B, T}, rng, -3 * position_scale, 5 * position_scale, dtype);
  return c;
}

struct PlaneResult {
  Tensor y, dz, da, db, d_omega, d_positions;
};

PlaneResult run_plane(const PlaneCase& c, Impl impl, const Tensor& dy,
                      DType out_dtype = DType::float64) {
  PlaneResult r;
  r.y = Tensor::nans({c.B, c.T, c.H, c.K}, out_dtype);
  grape_forward(c.params(), impl, r.y.view());
  r.dz = Tensor::nans({c.B, c.T, c.H, c.K}, out_dtype);
  r.da = Tensor::nans(c.a.shape(), out_dtype);
  r.db = Tensor::nans(c.b.shape(), out_dtype);
  r.d_omega = Tensor::nans(c.omega.shape(), out_dtype);
  r.d_positions = Tensor::nans(c.positions.shape(), out_dtype);
  grape_backward(c.params(), impl, dy.view(),
                 {r.dz.view(), r.da.view(), r.db.view(), r.d_omega.view(), r.d_positions.view()});
  return r;
}

// The dense generator of head h and the dense rotation exp(η L) by Eigen's MatrixFunctions
// (testing::matrix_exp).
MatD dense_generator(const PlaneCase& c, std::int64_t h) {
  VecD a(c.K), b(c.K);
  const bool per_head = c.a.shape().size() == 2;
  for (std::int64_t k = 0; k < c.K; ++k) {
    a(k) = c.a.at(per_head ? h * c.K + k : k);
    b(k) = c.b.at(per_head ? h * c.K + k : k);
  }
  return a * b.transpose() - b * a.transpose();
}
double position_of(const PlaneCase& c, std::int64_t b, std::int64_t t, std::int64_t h) {
  return c.positions.shape().size() == 3 ? c.positions.at((b * c.T + t) * c.H + h)
                                         : c.positions.at(b * c.T + t);
}
// y from dense matrix exponentials, token by token.
Tensor dense_expm_forward(const PlaneCase& c) {
  Tensor y = Tensor::zeros({c.B, c.T, c.H, c.K});
  for (std::int64_t h = 0; h < c.H; ++h) {
    const MatD L = dense_generator(c, h);
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t t = 0; t < c.T; ++t) {
        const double eta = position_of(c, b, t, h) * c.omega.at(h);
        const MatD G = testing::matrix_exp(eta * L);
        VecD z(c.K);
        const std::int64_t base = ((b * c.T + t) * c.H + h) * c.K;
        for (std::int64_t k = 0; k < c.K; ++k) z(k) = c.z.at(base + k);
        const VecD out = G * z;
        for (std::int64_t k = 0; k < c.K; ++k) y.set(base + k, out(k));
      }
  }
  return y;
}

// Sets a (and b) of every head.
void set_ab(PlaneCase& c, const std::function<void(VecD&, VecD&, std::int64_t)>& fn) {
  const bool per_head = c.a.shape().size() == 2;
  for (std::int64_t h = 0; h < (per_head ? c.H : 1); ++h) {
    VecD a(c.K), b(c.K);
    for (std::int64_t k = 0; k < c.K; ++k) {
      a(k) = c.a.at(per_head ? h * c.K + k : k);
      b(k) = c.b.at(per_head ? h * c.K + k : k);
    }
    fn(a, b, h);
    for (std::int64_t k = 0; k < c.K; ++k) {
      c.a.set(per_head ? h * c.K + k : k, a(k));
      c.b.set(per_head ? h * c.K + k : k, b(k));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 1. The scalar series against their closed forms (long double) where both are accurate.
TEST(GrapeScalars, SeriesAndClosedFormsAgree) {
  for (double x : {1e-8, 1e-3, 0.1, 0.5, 0.9, 0.999999, 1.0, 1.5, 3.0, 10.0, 1e4}) {
    const auto r = detail::grape::rodrigues_scalars(x);
    const long double X = x, s = std::sin(X), c = std::cos(X);
    // Closed forms in long double are accurate for x ≥ 0.1; the series for x < 0.1 is checked
    // against its own leading terms.
    if (x >= 0.1) {
      EXPECT_NEAR(r.f1, double(s / X), 1e-15) << x;
      EXPECT_NEAR(r.f2, double((1 - c) / (X * X)), 1e-15) << x;
      EXPECT_NEAR(r.g1, double((X * c - s) / (X * X * X)), 2e-14) << x;
      EXPECT_NEAR(r.g2, double((X * s - 2 * (1 - c)) / (2 * X * X * X * X)), 2e-14) << x;
    } else {
      const double x2 = x * x;
      EXPECT_NEAR(r.f1, 1 - x2 / 6 + x2 * x2 / 120, 1e-16);
      EXPECT_NEAR(r.f2, 0.5 - x2 / 24 + x2 * x2 / 720, 1e-16);
      EXPECT_NEAR(r.g1, -1.0 / 3 + x2 / 30 - x2 * x2 / 840, 1e-16);
      EXPECT_NEAR(r.g2, -1.0 / 24 + x2 / 360 - x2 * x2 / 13440, 1e-16);
    }
    EXPECT_EQ(r.cos_x, std::cos(x));
  }
  // Continuity across the switch at |x| = 1.
  const auto below = detail::grape::rodrigues_scalars(std::nextafter(1.0, 0.0));
  const auto at = detail::grape::rodrigues_scalars(1.0);
  EXPECT_NEAR(below.f1, at.f1, 1e-15);
  EXPECT_NEAR(below.f2, at.f2, 1e-15);
  EXPECT_NEAR(below.g1, at.g1, 1e-14);
  EXPECT_NEAR(below.g2, at.g2, 1e-14);
}

// ---------------------------------------------------------------------------------------------
// 2. Rodrigues (reference and optimized) against the dense matrix exponential, float64.
void expect_matches_expm(const PlaneCase& c, double tol, const char* what) {
  const Tensor expected = dense_expm_forward(c);
  for (Impl impl : {Impl::reference, kFast}) {
    Tensor y = Tensor::nans({c.B, c.T, c.H, c.K});
    grape_forward(c.params(), impl, y.view());
    EXPECT_LE(testing::max_abs_diff(y, expected), tol) << what << " impl " << to_string(impl);
    EXPECT_TRUE(testing::all_finite(y)) << what;
  }
}

TEST(GrapePlane, RodriguesMatchesDenseMatrixExponential) {
  std::mt19937_64 rng(1);
  {
    PlaneCase c = make_plane_case(rng, 2, 5, 3, 9, true, false);
    expect_matches_expm(c, 1e-13, "random, odd K");
  }
  {
    PlaneCase c = make_plane_case(rng, 1, 6, 2, 8, false, true);
    expect_matches_expm(c, 1e-13, "shared a, b; per-head positions");
  }
  {  // a ∥ b exactly: ν = 0, G = I
    PlaneCase c = make_plane_case(rng, 1, 4, 2, 7, true, false);
    set_ab(c, [](VecD& a, VecD& b, std::int64_t) { b = -2.5 * a; });
    expect_matches_expm(c, 1e-14, "parallel");
    Tensor y = Tensor::nans({c.B, c.T, c.H, c.K});
    grape_forward(c.params(), kFast, y.view());
    EXPECT_LE(testing::max_abs_diff(y, c.z), 1e-15) << "a ∥ b must give the identity";
  }
  {  // nearly parallel (ν ~ 1e-9 |a||b|): αβ − γ² would cancel to noise; the orthogonalised plane
     // keeps the tiny rotation rate exact.
    PlaneCase c = make_plane_case(rng, 1, 4, 2, 6, true, false, DType::float64, 200.0);
    set_ab(c, [&](VecD& a, VecD& b, std::int64_t) {
      VecD n(a.size());
      for (auto& e : n) e = std::normal_distribution<double>(0, 1)(rng);
      b = 1.7 * a + 1e-9 * n;
    });
    // positions up to ~1e3 (η |a||b| · eps ≪ 1e-12, so the dense reference stays exact): the
    // naive αβ − γ² and L² z = γ(a v + b u) − β a u − α b v would be off by ~η² · 1e-16.
    expect_matches_expm(c, 1e-12, "nearly parallel");
  }
  {  // a = 0: L = 0
    PlaneCase c = make_plane_case(rng, 1, 3, 1, 5, false, false);
    set_ab(c, [](VecD& a, VecD&, std::int64_t) { a.setZero(); });
    expect_matches_expm(c, 0, "a = 0");
  }
  {  // tiny generators: ν ~ 1e-12, series path only
    PlaneCase c = make_plane_case(rng, 1, 5, 2, 8, true, false);
    set_ab(c, [](VecD& a, VecD& b, std::int64_t) {
      a *= 1e-6;
      b *= 1e-6;
    });
    expect_matches_expm(c, 1e-15, "tiny a, b");
  }
  {  // huge angles: s = η ν up to ~1e3 radians (expm's own error grows with ‖ηL‖).
    PlaneCase c = make_plane_case(rng, 1, 6, 2, 8, true, false, DType::float64, 300.0);
    expect_matches_expm(c, 1e-10, "huge s");
  }
  {  // the switch of the series guard: η ν = 1 ± tiny
    PlaneCase c = make_plane_case(rng, 1, 3, 1, 6, false, false);
    set_ab(c, [](VecD& a, VecD& b, std::int64_t) {
      b -= (a.dot(b) / a.squaredNorm()) * a;
      a.normalize();
      b.normalize();  // ν = 1
    });
    c.omega.set(0, 1.0);
    c.positions.set(0, std::nextafter(1.0, 0.0));
    c.positions.set(1, 1.0);
    c.positions.set(2, -1.0);
    expect_matches_expm(c, 4e-15, "series switch");
  }
}

// Appendix I prints exp(nωL) = I + f1(z) L + f2(z) L² with f1(z) = sin z / z, f2 = (1 − cos z)/z²,
// z = nωs. That drops the factors η = nω and η² (it is only right for η = 1): the correct form is
// exp(ηL) = I + η f1(ηs) L + η² f2(ηs) L² (= I + sin(ηs)/s L + (1 − cos ηs)/s² L², as §2.3/§I's
// "fast application" state). The mathematics wins; this test shows which one is exp(ηL).
TEST(GrapePlane, AppendixIFormulaNeedsEtaFactors) {
  std::mt19937_64 rng(2);
  const std::int64_t K = 6;
  VecD a = VecD::Random(K), b = VecD::Random(K);
  const MatD L = a * b.transpose() - b * a.transpose();
  const double s = std::sqrt(a.squaredNorm() * b.squaredNorm() - std::pow(a.dot(b), 2));
  const double eta = 2.0, z = eta * s;
  const MatD I = MatD::Identity(K, K);
  const MatD expected = testing::matrix_exp(eta * L);
  const double f1 = std::sin(z) / z, f2 = (1 - std::cos(z)) / (z * z);
  const MatD printed = I + f1 * L + f2 * L * L;
  const MatD corrected = I + eta * f1 * L + eta * eta * f2 * L * L;
  EXPECT_GT((printed - expected).norm(), 1e-2);
  EXPECT_LT((corrected - expected).norm(), 1e-13);
}

// Dense G(η) of head 0 from the op itself: rows of z are the unit vectors (all at position η).
MatD op_rotation(const PlaneCase& base, double eta, Impl impl) {
  PlaneCase c;
  c.B = 1;
  c.T = base.K;
  c.H = 1;
  c.K = base.K;
  c.z = Tensor::zeros({1, c.K, 1, c.K});
  for (std::int64_t k = 0; k < c.K; ++k) c.z.set(k * c.K + k, 1.0);
  c.a = Tensor::zeros({c.K});
  c.b = Tensor::zeros({c.K});
  for (std::int64_t k = 0; k < c.K; ++k) {
    c.a.set(k, base.a.at(k));
    c.b.set(k, base.b.at(k));
  }
  c.omega = Tensor::from({1}, {1.0});
  c.positions = Tensor::zeros({1, c.K});
  c.positions.fill(eta);
  Tensor y = Tensor::nans({1, c.K, 1, c.K});
  grape_forward(c.params(), impl, y.view());
  MatD G(c.K, c.K);
  for (std::int64_t col = 0; col < c.K; ++col)
    for (std::int64_t row = 0; row < c.K; ++row) G(row, col) = y.at(col * c.K + row);
  return G;
}

// §2.2: G(s_i)ᵀ G(s_j) = G(s_j − s_i) exactly (one-parameter group), GᵀG = I, det G = +1.
TEST(GrapePlane, OneParameterGroupOrthogonalDeterminantOne) {
  std::mt19937_64 rng(3);
  for (bool near_parallel : {false, true}) {
    PlaneCase c = make_plane_case(rng, 1, 1, 1, 7, false, false);
    if (near_parallel) set_ab(c, [](VecD& a, VecD& b, std::int64_t) { b = 0.3 * a + 1e-5 * b; });
    for (Impl impl : {Impl::reference, kFast}) {
      for (auto [si, sj] : {std::pair{0.3, 1.9}, std::pair{-4.0, 7.5}, std::pair{100.0, 37.0}}) {
        const MatD Gi = op_rotation(c, si, impl), Gj = op_rotation(c, sj, impl);
        const MatD Gd = op_rotation(c, sj - si, impl);
        EXPECT_LT((Gi.transpose() * Gj - Gd).cwiseAbs().maxCoeff(), 1e-13);
        EXPECT_LT((Gi.transpose() * Gi - MatD::Identity(c.K, c.K)).cwiseAbs().maxCoeff(), 1e-14);
        EXPECT_NEAR(Gi.determinant(), 1.0, 1e-13);
        EXPECT_LT((op_rotation(c, -si, impl) - Gi.transpose()).cwiseAbs().maxCoeff(), 1e-14);
      }
      EXPECT_EQ((op_rotation(c, 0.0, impl) - MatD::Identity(c.K, c.K)).cwiseAbs().maxCoeff(), 0.0);
    }
  }
}

// §2.5: logits of rotated q and k depend only on the position difference.
TEST(GrapePlane, RelativeLogitsDependOnlyOnOffset) {
  std::mt19937_64 rng(4);
  PlaneCase q = make_plane_case(rng, 1, 2, 3, 10, true, false);
  PlaneCase k = q;
  k.z = testing::randn({1, 2, 3, 10}, rng);
  auto logits = [&](double i, double j, Impl impl) {
    q.positions = Tensor::from({1, 2}, {i, i});
    k.positions = Tensor::from({1, 2}, {j, j});
    Tensor yq = Tensor::nans({1, 2, 3, 10}), yk = Tensor::nans({1, 2, 3, 10});
    grape_forward(q.params(), impl, yq.view());
    grape_forward(k.params(), impl, yk.view());
    std::vector<double> out;
    for (std::int64_t h = 0; h < 3; ++h) {
      double s = 0;
      for (std::int64_t e = 0; e < 10; ++e) s += yq.at(h * 10 + e) * yk.at(h * 10 + e);
      out.push_back(s);
    }
    return out;
  };
  for (Impl impl : {Impl::reference, kFast}) {
    const auto base = logits(3, 11, impl);
    for (double shift : {-50.0, 1.0, 17.25, 1000.0}) {
      const auto moved = logits(3 + shift, 11 + shift, impl);
      for (std::size_t h = 0; h < base.size(); ++h)
        EXPECT_NEAR(moved[h], base[h], 1e-12 * (1 + std::fabs(base[h])));
    }
    EXPECT_GT(std::fabs(logits(3, 12, impl)[0] - base[0]), 1e-6);  // not trivially constant
  }
}

// ---------------------------------------------------------------------------------------------
// 3. Optimized vs reference, float64 and float32, random and adversarial.

// sqrt(Σ(a − b)²) / max(sqrt(Σ b²), sqrt(n)): the relative RMS error, except that a quantity
// whose exact value is 0 (e.g. dη when a ∥ b: both kernels return rounding noise of different
// size there) is compared absolutely against the O(1) scale of the inputs.
#define EXPECT_CLOSE_OR_TINY(actual, expected, tol, what)                                   \
  do {                                                                                      \
    double num_ = 0, den_ = 0;                                                              \
    for (std::int64_t i_ = 0; i_ < (expected).numel(); ++i_) {                              \
      num_ += std::pow((actual).at(i_) - (expected).at(i_), 2);                             \
      den_ += std::pow((expected).at(i_), 2);                                               \
    }                                                                                       \
    const double err_ =                                                                     \
        std::sqrt(num_) / std::max(std::sqrt(den_), std::sqrt(double((expected).numel()))); \
    EXPECT_TRUE(testing::all_finite(actual)) << (what);                                     \
    EXPECT_LE(err_, (tol)) << (what);                                                       \
  } while (0)
void expect_plane_fast_matches_reference(const PlaneCase& c, std::mt19937_64& rng, double tol,
                                         const char* what) {
  const Tensor dy = testing::randn({c.B, c.T, c.H, c.K}, rng, 1.0, c.z.dtype());
  const PlaneCase c64 = [&] {
    PlaneCase d = c;
    d.z = c.z.to(DType::float64);
    d.a = c.a.to(DType::float64);
    d.b = c.b.to(DType::float64);
    d.omega = c.omega.to(DType::float64);
    d.positions = c.positions.to(DType::float64);
    return d;
  }();
  const PlaneResult ref = run_plane(c64, Impl::reference, dy.to(DType::float64));
  const PlaneResult fast = run_plane(c, kFast, dy, c.z.dtype());
  SCOPED_TRACE(what);
  EXPECT_CLOSE_OR_TINY(fast.y, ref.y, tol, "y");
  EXPECT_CLOSE_OR_TINY(fast.dz, ref.dz, tol, "dz");
  EXPECT_CLOSE_OR_TINY(fast.da, ref.da, tol * 10, "da");
  EXPECT_CLOSE_OR_TINY(fast.db, ref.db, tol * 10, "db");
  EXPECT_CLOSE_OR_TINY(fast.d_omega, ref.d_omega, tol * 10, "d_omega");
  EXPECT_CLOSE_OR_TINY(fast.d_positions, ref.d_positions, tol * 10, "d_positions");
}

TEST(GrapePlane, OptimizedMatchesReference) {
  std::mt19937_64 rng(5);
  for (DType dtype : {DType::float64, DType::float32}) {
    const double tol = dtype == DType::float64 ? 1e-12 : 2e-5;
    for (bool per_head : {true, false})
      for (bool pos_per_head : {true, false}) {
        PlaneCase c = make_plane_case(rng, 2, 70, 3, 13, per_head, pos_per_head, dtype);
        expect_plane_fast_matches_reference(c, rng, tol, "random (T = 70 spans two blocks)");
      }
    {
      PlaneCase c = make_plane_case(rng, 1, 9, 2, 6, true, false, dtype, 500.0);
      expect_plane_fast_matches_reference(c, rng, dtype == DType::float64 ? 1e-11 : 1e-3,
                                          "large positions");
    }
    {
      PlaneCase c = make_plane_case(rng, 1, 9, 2, 6, true, true, dtype);
      set_ab(c, [](VecD& a, VecD& b, std::int64_t h) { b = (h + 1.5) * a; });
      expect_plane_fast_matches_reference(c, rng, tol, "a ∥ b");
    }
    {
      PlaneCase c = make_plane_case(rng, 1, 9, 2, 6, false, false, dtype);
      set_ab(c, [](VecD& a, VecD&, std::int64_t) { a.setZero(); });
      expect_plane_fast_matches_reference(c, rng, tol, "a = 0");
    }
    {
      PlaneCase c = make_plane_case(rng, 1, 9, 2, 5, true, false, dtype);
      set_ab(c, [](VecD& a, VecD& b, std::int64_t) {
        a *= 1e-3;
        b *= 1e-3;
      });
      expect_plane_fast_matches_reference(c, rng, tol, "small ν");
    }
  }
  {  // K = 1: L = 0 always; T = 0: nothing to do
    PlaneCase c = make_plane_case(rng, 2, 3, 1, 1, true, false);
    expect_plane_fast_matches_reference(c, rng, 1e-15, "K = 1");
    PlaneCase e = make_plane_case(rng, 2, 0, 2, 4, true, false);
    const PlaneResult r = run_plane(e, kFast, Tensor::zeros({2, 0, 2, 4}));
    for (std::int64_t i = 0; i < r.da.numel(); ++i) EXPECT_EQ(r.da.at(i), 0.0);
  }
}

// In place (y = z, dz = dy) and strided views.
// K = 1 (found by the numerical soak, tests/soak_test.cpp): R¹ has no plane, so L = a bᵀ − b aᵀ = 0
// for every a, b and y = z. Before, both sides rotated by rounding noise: the kernel's b⊥ =
// b − (a·b / |a|²) a is the rounding of b, ν ≈ eps |a||b| (and its one Gram–Schmidt pass left a·b⊥
// large next to |a||b⊥|), and the reference's a_i b_i − b_i a_i, contracted into an FMA, is the
// rounding error of the product; with |a|, |b| ≈ 1e4 and η ≈ 10 that moved y by ~1e-8.
TEST(GrapePlane, OneDimensionHasNoPlane) {
  std::mt19937_64 rng(5);
  PlaneCase c = make_plane_case(rng, 2, 7, 2, 1, true, true, DType::float64, 1e4);
  for (std::int64_t i = 0; i < c.a.numel(); ++i) {
    c.a.set(i, 1e4 * (1.1 + i));
    c.b.set(i, 3e4 * (0.7 + i) / 3.1);
  }
  c.omega = testing::uniform({c.H}, rng, 1e-3, 2e-3);
  for (DType dtype : {DType::float64, DType::float32}) {
    PlaneCase cd = c;
    for (Tensor* t : {&cd.z, &cd.a, &cd.b, &cd.omega, &cd.positions}) *t = t->to(dtype);
    const Tensor dy = testing::randn(c.z.shape(), rng, 1.0, dtype);
    for (Impl impl : {Impl::reference, kFast}) {
      SCOPED_TRACE(std::string(to_string(impl)) + " " + to_string(dtype));
      const PlaneResult r = run_plane(cd, impl, dy, dtype);
      EXPECT_TRUE(r.y.bit_equal(cd.z)) << "y = z";
      EXPECT_TRUE(r.dz.bit_equal(dy)) << "dz = dy";
      for (const Tensor* zero : {&r.d_omega, &r.d_positions})
        for (std::int64_t i = 0; i < zero->numel(); ++i) EXPECT_EQ(zero->at(i), 0.0);
      // da = (M − Mᵀ) b is 0 too; the kernel forms W a from its terms (A (a·z) dy − A (a·dy) z
      // summed over the tokens), which cancel to the compute type's rounding.
      double bound = 0;
      for (std::int64_t i = 0; i < c.z.numel(); ++i) bound += std::fabs(c.z.at(i) * dy.at(i));
      bound *= 1e4 * 2e-3 * 1e5 * (dtype == DType::float64 ? 1e-15 : 1e-6);
      for (const Tensor* g : {&r.da, &r.db})
        for (std::int64_t i = 0; i < g->numel(); ++i) EXPECT_LE(std::fabs(g->at(i)), bound);
    }
  }
}

TEST(GrapePlane, InPlaceAndStrided) {
  std::mt19937_64 rng(6);
  PlaneCase c = make_plane_case(rng, 2, 5, 3, 8, true, false);
  Tensor expected = Tensor::nans({2, 5, 3, 8});
  grape_forward(c.params(), Impl::reference, expected.view());
  for (Impl impl : {Impl::reference, kFast}) {
    PlaneCase d = c;
    grape_forward(d.params(), impl, d.z.view());
    EXPECT_LE(testing::max_abs_diff(d.z, expected), 1e-14);
  }
  // z given as a [B, T, H, K] view into a [B, H, T, K] buffer.
  Tensor bhtk = Tensor::zeros({2, 3, 5, 8});
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t t = 0; t < 5; ++t)
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t k = 0; k < 8; ++k)
          bhtk.set(((b * 3 + h) * 5 + t) * 8 + k, c.z.at(((b * 5 + t) * 3 + h) * 8 + k));
  GrapeParams p = c.params();
  p.z = TensorView::strided(bhtk.view().data, DType::float64, {2, 5, 3, 8}, {120, 8, 40, 1});
  Tensor y = Tensor::nans({2, 5, 3, 8});
  grape_forward(p, kFast, y.view());
  EXPECT_LE(testing::max_abs_diff(y, expected), 1e-14);
  // dz written into dy's memory.
  const Tensor dy = testing::randn({2, 5, 3, 8}, rng);
  Tensor dz = Tensor::nans({2, 5, 3, 8});
  grape_backward(c.params(), Impl::reference, dy.view(), {dz.view(), {}, {}, {}, {}});
  Tensor inplace = dy;
  grape_backward(c.params(), kFast, inplace.view(), {inplace.view(), {}, {}, {}, {}});
  EXPECT_LE(testing::max_abs_diff(inplace, dz), 1e-14);
}

TEST(GrapePlane, DeterministicAcrossThreadCounts) {
  std::mt19937_64 rng(7);
  PlaneCase c = make_plane_case(rng, 2, 200, 3, 16, false, false, DType::float32);
  const Tensor dy = testing::randn({2, 200, 3, 16}, rng, 1.0, DType::float32);
  set_num_threads(1);
  const PlaneResult one = run_plane(c, kFast, dy, DType::float32);
  set_num_threads(2);
  const PlaneResult two = run_plane(c, kFast, dy, DType::float32);
  set_num_threads(0);
  EXPECT_TRUE(one.y.bit_equal(two.y));
  EXPECT_TRUE(one.da.bit_equal(two.da));
  EXPECT_TRUE(one.db.bit_equal(two.db));
  EXPECT_TRUE(one.d_omega.bit_equal(two.d_omega));
  EXPECT_TRUE(one.d_positions.bit_equal(two.d_positions));
}

// ---------------------------------------------------------------------------------------------
// 4. Finite-difference gradients (float64) of every input, reference and optimized.
// loss = Σ dy ⊙ y; central differences with step h on each element of `x`.
void expect_fd_gradient(const std::function<double()>& loss, Tensor& x, const Tensor& analytic,
                        double h, double tol, const char* what) {
  testing::FiniteDifferenceOptions options;
  options.step = h;
  PHASOR_EXPECT_GRADIENT(analytic, x, loss, tol, what, options);
}

// h_eta: the step for ω and the positions. Near ν = 0 their gradients are O(ν) while the loss
// is O(1), so a 1e-6 step would drown them in the loss's rounding (eps · |loss| / h); the loss is
// a trigonometric polynomial of small frequency ν ω in them, so a larger step costs nothing.
void check_plane_gradients(PlaneCase c, std::mt19937_64& rng, double tol, const char* what,
                           double h_eta = 1e-6) {
  SCOPED_TRACE(what);
  const Tensor dy = testing::randn({c.B, c.T, c.H, c.K}, rng);
  auto loss = [&]() {
    Tensor y = Tensor::nans({c.B, c.T, c.H, c.K});
    grape_forward(c.params(), Impl::reference, y.view());
    return testing::dot(y, dy);
  };
  for (Impl impl : {Impl::reference, kFast}) {
    SCOPED_TRACE(to_string(impl));
    const PlaneResult r = run_plane(c, impl, dy);
    expect_fd_gradient(loss, c.z, r.dz, 1e-6, tol, "dz");
    expect_fd_gradient(loss, c.a, r.da, 1e-6, tol, "da");
    expect_fd_gradient(loss, c.b, r.db, 1e-6, tol, "db");
    expect_fd_gradient(loss, c.omega, r.d_omega, h_eta, tol, "d_omega");
    expect_fd_gradient(loss, c.positions, r.d_positions, h_eta, tol, "d_positions");
  }
}

TEST(GrapePlane, FiniteDifferenceGradients) {
  std::mt19937_64 rng(8);
  check_plane_gradients(make_plane_case(rng, 2, 4, 2, 5, true, false), rng, 1e-8, "per head");
  check_plane_gradients(make_plane_case(rng, 1, 5, 3, 6, false, true), rng, 1e-8, "shared a, b");
  {  // near ν = 0: a ∥ b up to 1e-4, angles η ν ≪ 1 (series path for the values and gradients)
    PlaneCase c = make_plane_case(rng, 1, 4, 2, 5, true, false);
    set_ab(c, [&](VecD& a, VecD& b, std::int64_t) { b = 0.8 * a + 1e-4 * b; });
    check_plane_gradients(c, rng, 1e-7, "near ν = 0", 1e-3);
  }
  {  // exactly ν = 0 (a ∥ b): G = I but the gradients with respect to a, b are not zero
    PlaneCase c = make_plane_case(rng, 1, 4, 2, 5, true, false);
    set_ab(c, [](VecD& a, VecD& b, std::int64_t) { b = -1.3 * a; });
    check_plane_gradients(c, rng, 1e-7, "ν = 0");
    const Tensor dy = testing::randn({1, 4, 2, 5}, rng);
    const PlaneResult r = run_plane(c, kFast, dy);
    double norm = 0;
    for (std::int64_t i = 0; i < r.da.numel(); ++i) norm += std::fabs(r.da.at(i));
    EXPECT_GT(norm, 1e-3);
  }
  {  // large angles (closed-form path)
    PlaneCase c = make_plane_case(rng, 1, 4, 2, 5, true, true, DType::float64, 20.0);
    check_plane_gradients(c, rng, 1e-7, "large angles");
  }
}

// ---------------------------------------------------------------------------------------------
// 5. Multi-subspace GRAPE-M.

struct SubspaceCase {
  Tensor z, basis, theta;
  RotaryLayout layout = RotaryLayout::half_split;
  std::int64_t B = 0, T = 0, H = 0, K = 0;
  GrapeSubspaceParams params() const {
    GrapeSubspaceParams p;
    p.z = z.view();
    p.basis = basis.view();
    p.theta = theta.view();
    p.layout = layout;
    return p;
  }
};

// Random orthogonal B by the Cayley map of a random skew matrix: (I − S)(I + S)^{-1}.
MatD cayley(std::mt19937_64& rng, std::int64_t K, double scale = 0.5) {
  MatD W(K, K);
  std::normal_distribution<double> dist(0, scale);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < K; ++j) W(i, j) = dist(rng);
  const MatD S = W - W.transpose(), I = MatD::Identity(K, K);
  return (I - S) * (I + S).inverse();
}

SubspaceCase make_subspace_case(std::mt19937_64& rng, std::int64_t B, std::int64_t T,
                                std::int64_t H, std::int64_t K, bool per_head, RotaryLayout layout,
                                DType dtype = DType::float64) {
  SubspaceCase c;
  c.B = B;
  c.T = T;
  c.H = H;
  c.K = K;
  c.layout = layout;
  c.z = testing::randn({B, T, H, K}, rng, 1.0, dtype);
  c.basis = per_head ? Tensor({H, K, K}, dtype) : Tensor({K, K}, dtype);
  for (std::int64_t h = 0; h < (per_head ? H : 1); ++h) {
    const MatD Bm = cayley(rng, K);
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t j = 0; j < K; ++j) c.basis.set((h * K + i) * K + j, Bm(i, j));
  }
  c.theta = testing::uniform({B, T, H, K / 2}, rng, -20, 20, dtype);
  return c;
}

struct SubspaceResult {
  Tensor y, dz, d_basis, d_theta;
};
SubspaceResult run_subspace(const SubspaceCase& c, Impl impl, const Tensor& dy,
                            DType out = DType::float64) {
  SubspaceResult r;
  r.y = Tensor::nans({c.B, c.T, c.H, c.K}, out);
  grape_subspace_forward(c.params(), impl, r.y.view());
  r.dz = Tensor::nans({c.B, c.T, c.H, c.K}, out);
  r.d_basis = Tensor::nans(c.basis.shape(), out);
  r.d_theta = Tensor::nans({c.B, c.T, c.H, c.K / 2}, out);
  grape_subspace_backward(c.params(), impl, dy.view(),
                          {r.dz.view(), r.d_basis.view(), r.d_theta.view()});
  return r;
}

// Prop. 3.1: with B = I and angles θ = n · base^(−2i/K) (rope_angles), multi-subspace GRAPE is
// apply_rotary / RoPE exactly (bit-for-bit: the basis products by I are exact).
TEST(GrapeSubspace, RecoversRoPEWithCanonicalPlanes) {
  std::mt19937_64 rng(9);
  const std::int64_t B = 2, T = 37, H = 3, K = 16, R = K / 2;
  Tensor angles = Tensor::zeros({B, T, R});
  rope_angles({B, T, K, 10000.0, 5, {}}, Impl::reference, angles.view());
  const TensorView theta =
      TensorView::strided(angles.view().data, DType::float64, {B, T, H, R}, {T * R, R, 0, 1});
  const Tensor z = testing::randn({B, T, H, K}, rng);
  Tensor identity = Tensor::zeros({K, K});
  for (std::int64_t k = 0; k < K; ++k) identity.set(k * K + k, 1.0);
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    Tensor rope = Tensor::nans({B, T, H, K});
    apply_rotary_forward(z.view(), theta, layout, Impl::reference, rope.view());
    for (Impl impl : {Impl::reference, kFast}) {
      GrapeSubspaceParams p{z.view(), identity.view(), theta, layout};
      Tensor y = Tensor::nans({B, T, H, K});
      grape_subspace_forward(p, impl, y.view());
      EXPECT_LE(testing::max_abs_diff(y, rope), impl == Impl::reference ? 0.0 : 1e-14)
          << to_string(layout);
    }
  }
  // The paper's canonical RoPE, written out: planes (e_{2i−1}, e_{2i}) rotated by
  // R2(nθ_i) = [[cos, −sin], [sin, cos]] — the interleaved layout with B = I.
  Tensor y = Tensor::nans({B, T, H, K});
  GrapeSubspaceParams p{z.view(), identity.view(), theta, RotaryLayout::interleaved};
  grape_subspace_forward(p, kFast, y.view());
  double worst = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < R; ++i) {
          const double n = 5 + t, ang = n * std::pow(10000.0, -2.0 * i / K);
          const std::int64_t base = ((b * T + t) * H + h) * K;
          const double x0 = z.at(base + 2 * i), x1 = z.at(base + 2 * i + 1);
          worst = std::max(
              worst, std::fabs(y.at(base + 2 * i) - (std::cos(ang) * x0 - std::sin(ang) * x1)));
          worst = std::max(
              worst, std::fabs(y.at(base + 2 * i + 1) - (std::sin(ang) * x0 + std::cos(ang) * x1)));
        }
  EXPECT_LT(worst, 1e-12);
  // "B = I up to the pair layout": the permutation B that sends interleaved pair i to the
  // half-split coordinates (i, i + R) turns interleaved GRAPE into half-split RoPE.
  Tensor perm = Tensor::zeros({K, K});
  for (std::int64_t i = 0; i < R; ++i) {
    perm.set(i * K + 2 * i, 1.0);            // B e_{2i}   = e_i
    perm.set((i + R) * K + 2 * i + 1, 1.0);  // B e_{2i+1} = e_{i+R}
  }
  Tensor half = Tensor::nans({B, T, H, K});
  apply_rotary_forward(z.view(), theta, RotaryLayout::half_split, Impl::reference, half.view());
  GrapeSubspaceParams pp{z.view(), perm.view(), theta, RotaryLayout::interleaved};
  Tensor yp = Tensor::nans({B, T, H, K});
  grape_subspace_forward(pp, kFast, yp.view());
  EXPECT_LE(testing::max_abs_diff(yp, half), 1e-15);
}

// RoPE as K/2 commuting single-plane GRAPE-M rotations (Prop. 3.1 via §2.4), and the sign typo:
// the paper writes L_i = U_i J U_iᵀ = L(e_{2i−1}, e_{2i}), but U_i J U_iᵀ = e_{2i} e_{2i−1}ᵀ −
// e_{2i−1} e_{2i}ᵀ = L(e_{2i}, e_{2i−1}) = −L(e_{2i−1}, e_{2i}). With the paper's b = J a
// (a = e_{2i−1}, b = e_{2i}) the product of the exponentials is RoPE(−θ), not RoPE(θ).
TEST(GrapeSubspace, RoPEIsAProductOfCommutingSinglePlanes) {
  std::mt19937_64 rng(10);
  const std::int64_t K = 8, R = K / 2, T = 6;
  const Tensor z = testing::randn({1, T, 1, K}, rng);
  Tensor positions = Tensor::zeros({1, T});
  for (std::int64_t t = 0; t < T; ++t) positions.set(t, 3.0 * t - 4);
  auto product = [&](bool paper_orientation) {
    Tensor x = z;
    for (std::int64_t i = 0; i < R; ++i) {
      Tensor a = Tensor::zeros({K}), b = Tensor::zeros({K});
      a.set(paper_orientation ? 2 * i : 2 * i + 1, 1.0);
      b.set(paper_orientation ? 2 * i + 1 : 2 * i, 1.0);
      const Tensor omega = Tensor::from({1}, {std::pow(10000.0, -2.0 * i / K)});
      Tensor y = Tensor::nans({1, T, 1, K});
      grape_forward({x.view(), a.view(), b.view(), omega.view(), positions.view()}, kFast,
                    y.view());
      x = y;
    }
    return x;
  };
  Tensor theta = Tensor::zeros({1, T, 1, R}), neg = Tensor::zeros({1, T, 1, R});
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < R; ++i) {
      theta.set(t * R + i, positions.at(t) * std::pow(10000.0, -2.0 * i / K));
      neg.set(t * R + i, -theta.at(t * R + i));
    }
  Tensor rope = Tensor::nans({1, T, 1, K}), rope_neg = Tensor::nans({1, T, 1, K});
  apply_rotary_forward(z.view(), theta.view(), RotaryLayout::interleaved, Impl::reference,
                       rope.view());
  apply_rotary_forward(z.view(), neg.view(), RotaryLayout::interleaved, Impl::reference,
                       rope_neg.view());
  EXPECT_LT(testing::max_abs_diff(product(false), rope), 1e-13);
  EXPECT_LT(testing::max_abs_diff(product(true), rope_neg), 1e-13);
  EXPECT_GT(testing::max_abs_diff(product(true), rope), 1e-2);
}

// Learned basis: exact relative law when θ = n ω, and G = B RoPE Bᵀ is orthogonal.
TEST(GrapeSubspace, RelativeLawInLearnedBasis) {
  std::mt19937_64 rng(11);
  const std::int64_t K = 8, R = 4;
  const MatD Bm = cayley(rng, K);
  Tensor basis = Tensor::zeros({K, K});
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < K; ++j) basis.set(i * K + j, Bm(i, j));
  const VecD omega = VecD::Random(R);
  auto rotation = [&](double n) {  // G(n) from the op, applied to the unit vectors
    Tensor z = Tensor::zeros({1, K, 1, K}), theta = Tensor::zeros({1, K, 1, R});
    for (std::int64_t k = 0; k < K; ++k) z.set(k * K + k, 1.0);
    for (std::int64_t t = 0; t < K; ++t)
      for (std::int64_t i = 0; i < R; ++i) theta.set(t * R + i, n * omega(i));
    Tensor y = Tensor::nans({1, K, 1, K});
    grape_subspace_forward({z.view(), basis.view(), theta.view(), RotaryLayout::half_split}, kFast,
                           y.view());
    MatD G(K, K);
    for (std::int64_t c = 0; c < K; ++c)
      for (std::int64_t r = 0; r < K; ++r) G(r, c) = y.at(c * K + r);
    return G;
  };
  for (auto [i, j] : {std::pair{2.0, 9.0}, std::pair{-7.5, 3.25}, std::pair{400.0, 100.0}}) {
    const MatD Gi = rotation(i), Gj = rotation(j);
    EXPECT_LT((Gi.transpose() * Gj - rotation(j - i)).cwiseAbs().maxCoeff(), 1e-12);
    EXPECT_LT((Gi.transpose() * Gi - MatD::Identity(K, K)).cwiseAbs().maxCoeff(), 1e-13);
    EXPECT_NEAR(Gi.determinant(), 1.0, 1e-12);
  }
}

TEST(GrapeSubspace, OptimizedMatchesReference) {
  std::mt19937_64 rng(12);
  for (DType dtype : {DType::float64, DType::float32})
    for (bool per_head : {true, false})
      for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
        SubspaceCase c = make_subspace_case(rng, 2, 70, 3, 10, per_head, layout, dtype);
        const Tensor dy = testing::randn({2, 70, 3, 10}, rng, 1.0, dtype);
        SubspaceCase c64 = c;
        c64.z = c.z.to(DType::float64);
        c64.basis = c.basis.to(DType::float64);
        c64.theta = c.theta.to(DType::float64);
        const SubspaceResult ref = run_subspace(c64, Impl::reference, dy.to(DType::float64));
        const SubspaceResult fast = run_subspace(c, kFast, dy, dtype);
        const double tol = dtype == DType::float64 ? 1e-12 : 3e-5;
        SCOPED_TRACE(std::string(to_string(dtype)) + (per_head ? " per head " : " shared ") +
                     to_string(layout));
        PHASOR_EXPECT_CLOSE(fast.y, ref.y, tol, "y");
        PHASOR_EXPECT_CLOSE(fast.dz, ref.dz, tol, "dz");
        PHASOR_EXPECT_CLOSE(fast.d_basis, ref.d_basis, tol * 10, "d_basis");
        PHASOR_EXPECT_CLOSE(fast.d_theta, ref.d_theta, tol * 10, "d_theta");
      }
}

TEST(GrapeSubspace, FiniteDifferenceGradients) {
  std::mt19937_64 rng(13);
  for (bool per_head : {true, false}) {
    SubspaceCase c = make_subspace_case(rng, 1, 5, 2, 6, per_head, RotaryLayout::interleaved);
    const Tensor dy = testing::randn({1, 5, 2, 6}, rng);
    auto loss = [&]() {
      Tensor y = Tensor::nans({1, 5, 2, 6});
      grape_subspace_forward(c.params(), Impl::reference, y.view());
      return testing::dot(y, dy);
    };
    for (Impl impl : {Impl::reference, kFast}) {
      SCOPED_TRACE(to_string(impl));
      const SubspaceResult r = run_subspace(c, impl, dy);
      expect_fd_gradient(loss, c.z, r.dz, 1e-6, 1e-8, "dz");
      // B is perturbed off the orthogonal group by 1e-6 (< orthogonality_tol): y = B R Bᵀ z is
      // a polynomial in B, so the free-matrix gradient is what the caller chains (e.g. Cayley).
      expect_fd_gradient(loss, c.basis, r.d_basis, 1e-6, 1e-8, "d_basis");
      expect_fd_gradient(loss, c.theta, r.d_theta, 1e-6, 1e-8, "d_theta");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 6. Errors.
TEST(GrapeErrors, BadArguments) {
  std::mt19937_64 rng(14);
  PlaneCase c = make_plane_case(rng, 1, 4, 2, 6, true, false);
  Tensor y = Tensor::nans({1, 4, 2, 6});
  using testing::expect_error;
  {
    GrapeParams p = c.params();
    const Tensor bad = Tensor::zeros({1, 4, 6});
    p.z = bad.view();
    expect_error([&] { grape_forward(p, kFast, y.view()); }, {"grape", "'z'", "[B, T, H, K]"});
  }
  {
    GrapeParams p = c.params();
    const Tensor bad = Tensor::zeros({3, 6});
    p.a = bad.view();
    expect_error([&] { grape_forward(p, Impl::reference, y.view()); },
                 {"grape_reference", "'a'", "H (as z)=2", "[3, 6]"});
  }
  {
    GrapeParams p = c.params();
    const Tensor bad = Tensor::zeros({6});
    p.b = bad.view();  // a per head, b shared: ranks differ
    expect_error([&] { grape_forward(p, kFast, y.view()); }, {"'b'", "[6]"});
  }
  {
    GrapeParams p = c.params();
    const Tensor bad = Tensor::zeros({1});
    p.omega = bad.view();
    expect_error([&] { grape_forward(p, kFast, y.view()); }, {"'omega'", "H (as z)=2"});
  }
  {
    GrapeParams p = c.params();
    const Tensor bad = Tensor::zeros({1, 5});
    p.positions = bad.view();
    expect_error([&] { grape_forward(p, kFast, y.view()); }, {"'positions'", "T (as z)=4"});
    p.positions = {};
    expect_error([&] { grape_forward(p, kFast, y.view()); }, {"'positions'", "undefined"});
  }
  {
    const Tensor ints({1, 4, 2, 6}, DType::int32);
    GrapeParams p = c.params();
    p.z = ints.view();
    expect_error([&] { grape_forward(p, kFast, y.view()); },
                 {"'z'", "float32, float64, bfloat16 or float16"});
  }
  {
    Tensor small = Tensor::nans({1, 4, 2, 5});
    expect_error([&] { grape_forward(c.params(), kFast, small.view()); }, {"'y'", "K=6"});
    const Tensor dy = testing::randn({1, 4, 2, 6}, rng);
    Tensor da = Tensor::nans({6});
    expect_error(
        [&] {
          grape_backward(c.params(), kFast, dy.view(), {{}, da.view(), {}, {}, {}});
        },
        {"'da'", "H (as a)=2"});
    Tensor dpos = Tensor::nans({1, 4, 2});
    expect_error(
        [&] {
          grape_backward(c.params(), kFast, dy.view(), {{}, {}, {}, {}, dpos.view()});
        },
        {"'d_positions'"});
    Tensor domega(std::vector<std::int64_t>{1}, DType::float64);
    const TensorView broadcast = TensorView::strided(domega.view().data, DType::float64, {2}, {0});
    expect_error(
        [&] {
          grape_backward(c.params(), kFast, dy.view(), {{}, {}, {}, broadcast, {}});
        },
        {"'d_omega'", "zero (broadcast) strides"});
  }
  // Multi-subspace.
  SubspaceCase s = make_subspace_case(rng, 1, 4, 2, 6, false, RotaryLayout::half_split);
  Tensor ys = Tensor::nans({1, 4, 2, 6});
  {
    SubspaceCase odd = make_subspace_case(rng, 1, 4, 2, 6, false, RotaryLayout::half_split);
    odd.z = testing::randn({1, 4, 2, 5}, rng);
    Tensor yo = Tensor::nans({1, 4, 2, 5});
    expect_error([&] { grape_subspace_forward(odd.params(), kFast, yo.view()); },
                 {"grape_subspace", "'z'", "even head dimension", "K = 5"});
  }
  {
    Tensor notorth = s.basis;
    notorth.set(0, notorth.at(0) + 0.01);
    GrapeSubspaceParams p = s.params();
    p.basis = notorth.view();
    expect_error([&] { grape_subspace_forward(p, kFast, ys.view()); },
                 {"grape_subspace", "'basis'", "orthogonal", "max |BᵀB − I|"});
    p.orthogonality_tol = std::numeric_limits<double>::infinity();  // caller's contract
    grape_subspace_forward(p, kFast, ys.view());
    p.orthogonality_tol = -1;
    expect_error([&] { grape_subspace_forward(p, kFast, ys.view()); }, {"'orthogonality_tol'"});
    Tensor nan_basis = s.basis;
    nan_basis.set(3, kNaN);
    p = s.params();
    p.basis = nan_basis.view();
    expect_error([&] { grape_subspace_forward(p, Impl::reference, ys.view()); },
                 {"grape_subspace_reference", "'basis'", "orthogonal"});
  }
  {
    GrapeSubspaceParams p = s.params();
    const Tensor bad = Tensor::zeros({2, 6, 6});
    p.basis = bad.view();
    SubspaceCase three = make_subspace_case(rng, 1, 4, 3, 6, false, RotaryLayout::half_split);
    p.z = three.z.view();
    expect_error([&] { grape_subspace_forward(p, kFast, ys.view()); }, {"'basis'", "H (as z)=3"});
  }
  {
    GrapeSubspaceParams p = s.params();
    const Tensor bad = Tensor::zeros({1, 4, 2, 2});
    p.theta = bad.view();
    expect_error([&] { grape_subspace_forward(p, kFast, ys.view()); }, {"'theta'", "K/2=3"});
  }
  {
    const Tensor dy = testing::randn({1, 4, 2, 6}, rng);
    Tensor dth = Tensor::zeros({1, 4, 1, 3});
    const TensorView broadcast =
        TensorView::strided(dth.view().data, DType::float64, {1, 4, 2, 3}, {12, 3, 0, 1});
    expect_error(
        [&] {
          grape_subspace_backward(s.params(), kFast, dy.view(), {{}, {}, broadcast});
        },
        {"'d_theta'", "zero (broadcast) strides"});
  }
}

}  // namespace
}  // namespace phasor
