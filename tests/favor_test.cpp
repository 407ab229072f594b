// Tests of Performer FAVOR+: the random feature matrices (orthogonality, Haar signs, chi norms,
// reproducibility), the positive features (the −|x|²/2 sign, unbiasedness, the variance gain of
// orthogonal features, the stabilisers), the attention against exact softmax attention as m grows,
// the optimized kernels against the float64 reference (causal, varlen, odd sizes, float32 and
// float64), gradients by central finite differences, determinism and argument errors.
#include "phasor/favor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "phasor/testing/gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;

Tensor random_w(FavorMatrixKind kind, std::uint64_t seed, const std::vector<std::int64_t>& shape,
                DType dtype = DType::float64) {
  Tensor w = Tensor::nans(shape, dtype);
  favor_random_matrix(kind, seed, w.view());
  return w;
}

double w_at(const Tensor& w, std::int64_t r, std::int64_t i) {
  return w.at(r * w.shape().back() + i);
}

// ---------------------------------------------------------------------------------------------
// Random matrices.

TEST(FavorRandomMatrix, BlocksAreOrthogonalWithChiOrFixedNorms) {
  const std::int64_t m = 20, d = 8;  // blocks of 8, 8 and a truncated one of 4
  for (FavorMatrixKind kind :
       {FavorMatrixKind::orthogonal_chi, FavorMatrixKind::orthogonal_fixed}) {
    const Tensor w = random_w(kind, 7, {m, d});
    std::vector<double> norms;
    for (std::int64_t r = 0; r < m; ++r) {
      double n2 = 0;
      for (std::int64_t i = 0; i < d; ++i) n2 += w_at(w, r, i) * w_at(w, r, i);
      norms.push_back(std::sqrt(n2));
      if (kind == FavorMatrixKind::orthogonal_fixed) {
        EXPECT_NEAR(norms.back(), std::sqrt(8.0), 1e-12);
      }
    }
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t s = r + 1; s < m && s / d == r / d; ++s) {  // same block
        double dot = 0;
        for (std::int64_t i = 0; i < d; ++i) dot += w_at(w, r, i) * w_at(w, s, i);
        EXPECT_NEAR(dot / (norms[r] * norms[s]), 0.0, 1e-12)
            << to_string(kind) << " rows " << r << ", " << s;
      }
    if (kind == FavorMatrixKind::orthogonal_chi) {  // chi norms differ from row to row
      const auto [lo, hi] = std::minmax_element(norms.begin(), norms.end());
      EXPECT_GT(*hi - *lo, 0.1);
    }
  }
  // iid rows across the whole matrix are not orthogonal.
  const Tensor w = random_w(FavorMatrixKind::iid, 7, {m, d});
  double dot = 0;
  for (std::int64_t i = 0; i < d; ++i) dot += w_at(w, 0, i) * w_at(w, 1, i);
  EXPECT_GT(std::fabs(dot), 1e-6);
}

// Every row of an orthogonal_chi matrix is marginally N(0, I_d) (what makes the estimate
// unbiased). Without the diag(R) sign fix, Householder QR makes Q's first column −sign(G_00)·g/|g|,
// so W[0, 0] = Q[0, 0] would always be ≤ 0: its mean over seeds would be far from 0.
TEST(FavorRandomMatrix, RowsAreMarginallyStandardNormal) {
  const std::int64_t m = 6, d = 4, seeds = 4000;
  std::vector<double> sum(m * d, 0.0), sum2(m * d, 0.0);
  for (std::int64_t s = 0; s < seeds; ++s) {
    const Tensor w = random_w(FavorMatrixKind::orthogonal_chi, 1000 + s, {m, d});
    for (std::int64_t e = 0; e < m * d; ++e) {
      sum[e] += w.at(e);
      sum2[e] += w.at(e) * w.at(e);
    }
  }
  const double n = static_cast<double>(seeds);
  for (std::int64_t e = 0; e < m * d; ++e) {
    // mean ~ N(0, 1/n): 5 standard errors; E[w²] = 1 with sd √(2/n).
    EXPECT_NEAR(sum[e] / n, 0.0, 5.0 / std::sqrt(n)) << "element " << e;
    EXPECT_NEAR(sum2[e] / n, 1.0, 5.0 * std::sqrt(2.0 / n)) << "element " << e;
  }
}

// The Gaussians are std::mt19937_64 (fixed by the standard) through Box–Muller with 53-bit
// uniforms: an independent re-implementation here reproduces an iid matrix bit for bit, so the
// draws are the same on every platform with the same libm.
TEST(FavorRandomMatrix, ReproducibleBoxMullerDraws) {
  const std::uint64_t seed = 123456789;
  const Tensor w = random_w(FavorMatrixKind::iid, seed, {5, 3});  // 15: an odd count
  std::mt19937_64 rng(seed);
  std::vector<double> expected;
  while (expected.size() < 15) {
    const double u1 = 1.0 - static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * 3.14159265358979323846 * u2;
    expected.push_back(r * std::cos(a));
    expected.push_back(r * std::sin(a));
  }
  for (std::int64_t e = 0; e < 15; ++e) EXPECT_EQ(w.at(e), expected[e]) << e;
}

TEST(FavorRandomMatrix, SeedDeterminesTheDraw) {
  for (FavorMatrixKind kind :
       {FavorMatrixKind::orthogonal_chi, FavorMatrixKind::orthogonal_fixed, FavorMatrixKind::iid}) {
    const Tensor a = random_w(kind, 42, {10, 4}), b = random_w(kind, 42, {10, 4});
    const Tensor c = random_w(kind, 43, {10, 4});
    EXPECT_TRUE(a.bit_equal(b)) << to_string(kind);
    EXPECT_GT(testing::max_abs_diff(a, c), 0.1) << to_string(kind) << ": another seed redraws";
    // float32 output = the float64 draw rounded.
    const Tensor f = random_w(kind, 42, {10, 4}, DType::float32);
    EXPECT_TRUE(f.bit_equal(a.to(DType::float32))) << to_string(kind);
    // [H, m, d]: heads drawn one after the other: head 0 is the [m, d] draw, head 1 differs.
    const Tensor h = random_w(kind, 42, {2, 10, 4});
    double diff0 = 0, diff1 = 0;
    for (std::int64_t e = 0; e < 40; ++e) {
      diff0 = std::max(diff0, std::fabs(h.at(e) - a.at(e)));
      diff1 = std::max(diff1, std::fabs(h.at(40 + e) - a.at(e)));
    }
    EXPECT_EQ(diff0, 0.0);
    EXPECT_GT(diff1, 0.1);
  }
}

// ---------------------------------------------------------------------------------------------
// Features and the softmax-kernel estimate.

// φ(x)ᵀφ(y) for one token pair (x, y: d values), features computed by the op (no stabiliser).
double estimate(const Tensor& w, const std::vector<double>& x, const std::vector<double>& y) {
  const std::int64_t m = w.shape()[0], d = w.shape()[1];
  std::vector<double> xy(x);
  xy.insert(xy.end(), y.begin(), y.end());
  const Tensor in = Tensor::from({1, 2, 1, d}, xy);
  Tensor phi = Tensor::nans({1, 2, 1, m});
  favor_features_forward({in.view(), w.view(), FavorStabilizer::none, {}}, Impl::chunk, phi.view());
  double e = 0;
  for (std::int64_t r = 0; r < m; ++r) e += phi.at(r) * phi.at(m + r);
  return e;
}

// The same estimate with the sign printed in the structured-rotations paper, exp(wᵀx + |x|²/2).
double estimate_plus_sign(const Tensor& w, const std::vector<double>& x,
                          const std::vector<double>& y) {
  const std::int64_t m = w.shape()[0], d = w.shape()[1];
  double x2 = 0, y2 = 0;
  for (std::int64_t i = 0; i < d; ++i) x2 += x[i] * x[i], y2 += y[i] * y[i];
  double e = 0;
  for (std::int64_t r = 0; r < m; ++r) {
    double wx = 0, wy = 0;
    for (std::int64_t i = 0; i < d; ++i) wx += w_at(w, r, i) * x[i], wy += w_at(w, r, i) * y[i];
    e += std::exp(wx + 0.5 * x2) * std::exp(wy + 0.5 * y2) / static_cast<double>(m);
  }
  return e;
}

struct Stats {
  double mean = 0, se = 0, mse = 0;
};
Stats monte_carlo(const std::function<double(std::uint64_t)>& sample, std::int64_t n,
                  double truth) {
  double s = 0, s2 = 0, se2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = sample(static_cast<std::uint64_t>(i) * 7919 + 11);
    s += v;
    s2 += v * v;
    se2 += (v - truth) * (v - truth);
  }
  Stats st;
  st.mean = s / n;
  st.se = std::sqrt(std::max(0.0, s2 / n - st.mean * st.mean) / n);
  st.mse = se2 / n;
  return st;
}

TEST(FavorFeatures, MatchTheFormulaWithTheMinusSign) {
  std::mt19937_64 rng(1);
  const Tensor x = testing::randn({2, 3, 2, 5}, rng);
  const Tensor w = random_w(FavorMatrixKind::orthogonal_chi, 3, {7, 5});
  Tensor phi = Tensor::nans({2, 3, 2, 7});
  favor_features_forward({x.view(), w.view(), FavorStabilizer::none, {}}, Impl::chunk, phi.view());
  for (std::int64_t tok = 0; tok < 12; ++tok) {
    double x2 = 0;
    for (std::int64_t i = 0; i < 5; ++i) x2 += x.at(tok * 5 + i) * x.at(tok * 5 + i);
    for (std::int64_t r = 0; r < 7; ++r) {
      double wx = 0;
      for (std::int64_t i = 0; i < 5; ++i) wx += w_at(w, r, i) * x.at(tok * 5 + i);
      EXPECT_NEAR(phi.at(tok * 7 + r), std::exp(wx - 0.5 * x2) / std::sqrt(7.0), 1e-13);
    }
  }
}

// E[φ(x)ᵀφ(y)] = exp(xᵀy) for iid and orthogonal_chi features (Monte Carlo over seeds, within 4
// standard errors), and the paper's exp(+|x|²/2) is biased: its mean is exp(xᵀy + |x|² + |y|²),
// many standard errors away from exp(xᵀy).
TEST(FavorFeatures, EstimateIsUnbiasedOnlyWithMinusHalfNormSquared) {
  const std::int64_t d = 4, m = 8, n = 3000;
  const std::vector<double> x = {0.3, -0.5, 0.2, 0.4}, y = {0.5, 0.1, -0.3, 0.35};
  double xy = 0, x2 = 0, y2 = 0;
  for (std::int64_t i = 0; i < d; ++i) xy += x[i] * y[i], x2 += x[i] * x[i], y2 += y[i] * y[i];
  const double truth = std::exp(xy);
  for (FavorMatrixKind kind : {FavorMatrixKind::iid, FavorMatrixKind::orthogonal_chi}) {
    const Stats st = monte_carlo(
        [&](std::uint64_t seed) {
          return estimate(random_w(kind, seed, {m, d}), x, y);
        },
        n, truth);
    EXPECT_LT(std::fabs(st.mean - truth), 4.0 * st.se)
        << to_string(kind) << ": mean " << st.mean << " vs exp(xᵀy) " << truth << ", se " << st.se;
    const Stats plus = monte_carlo(
        [&](std::uint64_t seed) {
          return estimate_plus_sign(random_w(kind, seed, {m, d}), x, y);
        },
        n, truth);
    EXPECT_GT(std::fabs(plus.mean - truth), 20.0 * plus.se)
        << to_string(kind) << ": the + sign must be biased; mean " << plus.mean;
    const double plus_truth = std::exp(xy + x2 + y2);  // what the + sign estimates instead
    EXPECT_LT(std::fabs(plus.mean - plus_truth), 4.0 * plus.se) << to_string(kind);
  }
}

// Orthogonal features have a lower mean squared error than iid ones on the same budget
// (Performer Thm. 2): the relative squared error of the estimate of exp(xᵀy), pooled over three
// pairs (|x| = |y| = 0.7, d = m = 16) and 3000 seeds each. The estimate is heavy-tailed, so the
// gap must also be large against its own standard error (z > 3), not only in ratio.
TEST(FavorFeatures, OrthogonalBeatsIidMeanSquaredError) {
  const std::int64_t d = 16, m = 16, n = 3000, pairs = 3;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto draw = [&] {
    std::vector<double> v(d);
    double n2 = 0;
    for (auto& e : v) {
      e = nd(rng);
      n2 += e * e;
    }
    for (auto& e : v) e *= 0.7 / std::sqrt(n2);
    return v;
  };
  double s_iid = 0, s2_iid = 0, s_orth = 0, s2_orth = 0;
  for (std::int64_t p = 0; p < pairs; ++p) {
    const std::vector<double> x = draw(), y = draw();
    double xy = 0;
    for (std::int64_t i = 0; i < d; ++i) xy += x[i] * y[i];
    const double truth = std::exp(xy);
    for (std::int64_t s = 0; s < n; ++s) {
      const std::uint64_t seed = static_cast<std::uint64_t>(p * n + s) * 7919 + 11;
      const double a = estimate(random_w(FavorMatrixKind::iid, seed, {m, d}), x, y) / truth - 1;
      const double b =
          estimate(random_w(FavorMatrixKind::orthogonal_chi, seed, {m, d}), x, y) / truth - 1;
      s_iid += a * a, s2_iid += a * a * a * a, s_orth += b * b, s2_orth += b * b * b * b;
    }
  }
  const double N = static_cast<double>(pairs * n);
  const double mse_iid = s_iid / N, mse_orth = s_orth / N;
  const double var = (s2_iid / N - mse_iid * mse_iid) / N + (s2_orth / N - mse_orth * mse_orth) / N;
  EXPECT_LT(mse_orth, 0.85 * mse_iid) << "orthogonal " << mse_orth << " vs iid " << mse_iid;
  EXPECT_GT((mse_iid - mse_orth) / std::sqrt(var), 3.0)
      << "orthogonal " << mse_orth << " vs iid " << mse_iid << ", se " << std::sqrt(var);
}

// The structured-rotations paper (§3) says the MSE of the positive estimator "scales linearly with
// SM(x, y)". The mathematics: φ(x)ᵀφ(y)/SM(x, y) = mean_r exp(w_rᵀu − |u|²/2) with u = x + y, so
// the relative error depends on u alone and MSE = SM(x, y)² · (exp(|u|²) − 1)/m (iid rows;
// Performer Lemma 2): quadratic in SM. Two pairs with the same u = x + y but different xᵀy, on the
// same seeds, have exactly the same relative errors, so their MSEs are in the ratio SM_A²/SM_B²
// (2.05 here, where "linear" would give 1.43); and the iid MSE matches the formula within 4
// standard errors.
TEST(FavorFeatures, MeanSquaredErrorScalesWithTheSquareOfTheKernel) {
  const std::int64_t d = 4, m = 4, n = 3000;
  const std::vector<double> xa = {0.5, 0, 0, 0}, ya = {0.5, 0, 0, 0};       // xᵀy = 0.25
  const std::vector<double> xb = {0.5, 0.6, 0, 0}, yb = {0.5, -0.6, 0, 0};  // xᵀy = −0.11
  const double sm_a = std::exp(0.25), sm_b = std::exp(0.25 - 0.36), u2 = 1.0;
  double mse_a = 0, mse_b = 0, rel = 0, rel2 = 0;
  for (std::int64_t s = 0; s < n; ++s) {
    const Tensor w = random_w(FavorMatrixKind::iid, static_cast<std::uint64_t>(s) * 31 + 5, {m, d});
    const double ea = estimate(w, xa, ya) - sm_a, eb = estimate(w, xb, yb) - sm_b;
    mse_a += ea * ea / n;
    mse_b += eb * eb / n;
    const double r2 = (ea / sm_a) * (ea / sm_a);
    rel += r2 / n;
    rel2 += r2 * r2 / n;
  }
  EXPECT_NEAR(mse_a / mse_b, (sm_a * sm_a) / (sm_b * sm_b), 1e-9);
  EXPECT_GT(std::fabs(mse_a / mse_b - sm_a / sm_b), 0.5) << "not linear in SM";
  const double se = std::sqrt((rel2 - rel * rel) / n);
  EXPECT_NEAR(rel, (std::exp(u2) - 1) / m, 4 * se) << "relative MSE " << rel << ", se " << se;
}

// The stabilisers only scale: key features are the plain ones times one constant per (sequence,
// head) (so they cancel in S/z), query features one constant per token, and the largest feature
// of the group is exactly 1/√m.
TEST(FavorFeatures, StabilisersAreSharedConstants) {
  std::mt19937_64 rng(2);
  const std::int64_t T = 7, H = 2, d = 6, m = 9;
  const Tensor x = testing::randn({1, T, H, d}, rng, 1.5);
  const Tensor w = random_w(FavorMatrixKind::orthogonal_chi, 4, {H, m, d});
  const Tensor cu = testing::cu_seqlens({3, 4});
  Tensor plain = Tensor::nans({1, T, H, m}), key = Tensor::nans({1, T, H, m}),
         query = Tensor::nans({1, T, H, m});
  favor_features_forward({x.view(), w.view(), FavorStabilizer::none, cu.view()}, Impl::chunk,
                         plain.view());
  favor_features_forward({x.view(), w.view(), FavorStabilizer::key, cu.view()}, Impl::chunk,
                         key.view());
  favor_features_forward({x.view(), w.view(), FavorStabilizer::query, cu.view()}, Impl::chunk,
                         query.view());
  auto idx = [&](std::int64_t t, std::int64_t h, std::int64_t r) { return (t * H + h) * m + r; };
  for (std::int64_t h = 0; h < H; ++h)
    for (auto [start, len] : {std::pair<std::int64_t, std::int64_t>{0, 3}, {3, 4}}) {
      const double ratio = key.at(idx(start, h, 0)) / plain.at(idx(start, h, 0));
      double kmax = 0;
      for (std::int64_t t = start; t < start + len; ++t)
        for (std::int64_t r = 0; r < m; ++r) {
          EXPECT_NEAR(key.at(idx(t, h, r)) / plain.at(idx(t, h, r)), ratio, 1e-10 * ratio);
          kmax = std::max(kmax, key.at(idx(t, h, r)));
        }
      EXPECT_NEAR(kmax, 1.0 / std::sqrt(9.0), 1e-15);
      for (std::int64_t t = start; t < start + len; ++t) {
        const double qr = query.at(idx(t, h, 0)) / plain.at(idx(t, h, 0));
        double qmax = 0;
        for (std::int64_t r = 0; r < m; ++r) {
          EXPECT_NEAR(query.at(idx(t, h, r)) / plain.at(idx(t, h, r)), qr, 1e-10 * qr);
          qmax = std::max(qmax, query.at(idx(t, h, r)));
        }
        EXPECT_NEAR(qmax, 1.0 / std::sqrt(9.0), 1e-15);
      }
    }
}

struct FeatureCase {
  Tensor x, w, cu;
  FavorStabilizer stabilizer;
  FavorFeatureParams params() const { return {x.view(), w.view(), stabilizer, cu.view()}; }
};
struct FeatureResult {
  Tensor phi, dx, dw;
};
FeatureResult run_features(const FeatureCase& c, Impl impl, const Tensor& d_phi, DType out) {
  FeatureResult r;
  r.phi = Tensor::nans(d_phi.shape(), out);
  favor_features_forward(c.params(), impl, r.phi.view());
  r.dx = Tensor::nans(c.x.shape(), out);
  r.dw = Tensor::nans(c.w.shape(), out);
  favor_features_backward(c.params(), impl, d_phi.view(), r.dx.view(), r.dw.view());
  return r;
}

TEST(FavorFeatures, OptimizedMatchesReference) {
  std::mt19937_64 rng(3);
  for (DType dtype : {DType::float64, DType::float32})
    for (FavorStabilizer st : {FavorStabilizer::query, FavorStabilizer::key, FavorStabilizer::none})
      for (bool per_head : {false, true})
        for (bool varlen : {false, true}) {
          const std::int64_t B = varlen ? 1 : 2, T = varlen ? 12 : 5, H = 3, d = 7, m = 11;
          FeatureCase c;
          c.x = testing::randn({B, T, H, d}, rng, 0.8, dtype);
          c.w = per_head ? random_w(FavorMatrixKind::orthogonal_chi, 9, {H, m, d}, dtype)
                         : random_w(FavorMatrixKind::orthogonal_fixed, 9, {m, d}, dtype);
          if (varlen) c.cu = testing::cu_seqlens({5, 0, 7});
          c.stabilizer = st;
          const Tensor d_phi = testing::randn({B, T, H, m}, rng, 1.0, dtype);
          const FeatureResult ref = run_features(c, Impl::reference, d_phi, DType::float64);
          const FeatureResult fast = run_features(c, Impl::chunk, d_phi, dtype);
          const double tol = dtype == DType::float64 ? 1e-12 : 2e-5;
          PHASOR_EXPECT_CLOSE(fast.phi, ref.phi, tol, "phi");
          PHASOR_EXPECT_CLOSE(fast.dx, ref.dx, tol, "dx");
          PHASOR_EXPECT_CLOSE(fast.dw, ref.dw, tol, "dw");
        }
}

// Large inputs with the query stabiliser (found by the numerical soak, tests/soak_test.cpp): the
// row's |x|²/2 cancels in u − max_r u and is left out of the exponent. Computed, it rounded the
// float32 exponent by eps |x|²/2: with |x| ≈ 100 mostly outside w's rows (wᵀx of order 1, so the
// features are comparable), φ was off by ~4e-4 relative.
TEST(FavorFeatures, QueryStabiliserKeepsLargeInputsAccurate) {
  std::mt19937_64 rng(12);
  FeatureCase c;
  c.x = testing::randn({1, 20, 2, 4}, rng, 1.0, DType::float32);
  for (std::int64_t i = 0; i < c.x.numel(); ++i)
    if (i % 4 >= 2) c.x.set(i, 100 * c.x.at(i));
  c.w = Tensor::from({2, 4}, {1, 0, 0, 0, 0, 1, 0, 0}, DType::float32);
  c.stabilizer = FavorStabilizer::query;
  const Tensor d_phi = testing::randn({1, 20, 2, 2}, rng, 1.0, DType::float32);
  const FeatureResult ref = run_features(c, Impl::reference, d_phi, DType::float64);
  const FeatureResult fast = run_features(c, Impl::chunk, d_phi, DType::float32);
  PHASOR_EXPECT_CLOSE(fast.phi, ref.phi, 1e-6, "phi");
}

// Central differences of L = Σ d_phi·φ (no stabiliser: φ is then the exact function).
TEST(FavorFeatures, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(4);
  FeatureCase c;
  c.x = testing::randn({1, 4, 2, 3}, rng, 0.7);
  c.w = random_w(FavorMatrixKind::orthogonal_chi, 5, {2, 5, 3});
  c.stabilizer = FavorStabilizer::none;
  const Tensor d_phi = testing::randn({1, 4, 2, 5}, rng);
  for (Impl impl : {Impl::reference, Impl::chunk}) {
    const FeatureResult r = run_features(c, impl, d_phi, DType::float64);
    const auto loss = [&] {
      Tensor phi = Tensor::nans({1, 4, 2, 5});
      favor_features_forward(c.params(), Impl::reference, phi.view());
      return testing::dot(phi, d_phi);
    };
    // Element by element: |analytic − numeric| ≤ 1e-7 (1 + |numeric|).
    PHASOR_EXPECT_ALL_NEAR(r.dx, testing::numerical_gradient(c.x, loss), 1e-7, 1e-7, "dx");
    PHASOR_EXPECT_ALL_NEAR(r.dw, testing::numerical_gradient(c.w, loss), 1e-7, 1e-7, "dw");
  }
}

// ---------------------------------------------------------------------------------------------
// Attention.

struct AttnCase {
  Tensor q, k, v, w, cu;
  bool causal = false;
  std::int64_t chunk_size = 4;
  FavorAttentionParams params() const {
    FavorAttentionParams p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    p.w = w.view();
    p.cu_seqlens = cu.view();
    p.causal = causal;
    p.chunk_size = chunk_size;
    return p;
  }
};
AttnCase make_attn(std::mt19937_64& rng, std::int64_t B, std::int64_t T, std::int64_t H,
                   std::int64_t d, std::int64_t V, std::int64_t m, bool per_head, bool causal,
                   const std::vector<std::int64_t>& lengths = {}, DType dtype = DType::float64,
                   double qk_std = 1.0, std::uint64_t seed = 17) {
  AttnCase c;
  const testing::Batch batch = testing::batch_of(B, T, lengths);
  B = batch.B, T = batch.T;
  c.cu = batch.cu_seqlens;
  c.q = testing::randn({B, T, H, d}, rng, qk_std, dtype);
  c.k = testing::randn({B, T, H, d}, rng, qk_std, dtype);
  c.v = testing::randn({B, T, H, V}, rng, 1.0, dtype);
  c.w = per_head ? random_w(FavorMatrixKind::orthogonal_chi, seed, {H, m, d}, dtype)
                 : random_w(FavorMatrixKind::orthogonal_chi, seed, {m, d}, dtype);
  c.causal = causal;
  return c;
}
struct AttnResult {
  Tensor o, dq, dk, dv, dw;
};
AttnResult run_attn(const AttnCase& c, Impl impl, const Tensor& d_o, DType out) {
  AttnResult r;
  r.o = Tensor::nans(c.v.shape(), out);
  favor_attention_forward(c.params(), impl, r.o.view());
  r.dq = Tensor::nans(c.q.shape(), out);
  r.dk = Tensor::nans(c.k.shape(), out);
  r.dv = Tensor::nans(c.v.shape(), out);
  r.dw = Tensor::nans(c.w.shape(), out);
  favor_attention_backward(c.params(), impl, d_o.view(),
                           {r.dq.view(), r.dk.view(), r.dv.view(), r.dw.view()});
  return r;
}

// Exact softmax attention softmax(q kᵀ/√d) v (causal or not), float64, B rows.
Tensor softmax_attention(const AttnCase& c) {
  const auto B = c.q.shape()[0], T = c.q.shape()[1], H = c.q.shape()[2], d = c.q.shape()[3],
             V = c.v.shape()[3];
  Tensor o({B, T, H, V}, DType::float64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> logits;
        const std::int64_t end = c.causal ? i + 1 : T;
        for (std::int64_t j = 0; j < end; ++j) {
          double s = 0;
          for (std::int64_t e = 0; e < d; ++e)
            s += c.q.at(((b * T + i) * H + h) * d + e) * c.k.at(((b * T + j) * H + h) * d + e);
          logits.push_back(s / std::sqrt(static_cast<double>(d)));
        }
        const double mx = *std::max_element(logits.begin(), logits.end());
        double z = 0;
        for (double& l : logits) z += (l = std::exp(l - mx));
        for (std::int64_t e = 0; e < V; ++e) {
          double acc = 0;
          for (std::int64_t j = 0; j < end; ++j)
            acc += logits[j] * c.v.at(((b * T + j) * H + h) * V + e);
          o.set(((b * T + i) * H + h) * V + e, acc / z);
        }
      }
  return o;
}

// The FAVOR+ output approaches exact softmax attention as m grows (Monte Carlo error ~ 1/√m),
// for both the non-causal and the causal form; averaged over 8 feature seeds and inputs
// (q, k ~ N(0, 0.25), d = 8, T = 16).
TEST(FavorAttention, ErrorAgainstSoftmaxFallsWithFeatures) {
  for (bool causal : {false, true}) {
    std::vector<double> errs;
    for (std::int64_t m : {16, 64, 256, 1024}) {
      double err = 0;
      const int seeds = 8;
      for (int s = 0; s < seeds; ++s) {
        std::mt19937_64 rng(100 + s);
        const AttnCase c =
            make_attn(rng, 1, 16, 1, 8, 4, m, false, causal, {}, DType::float64, 0.5, 1000 + s);
        Tensor o = Tensor::nans(c.v.shape());
        favor_attention_forward(c.params(), Impl::chunk, o.view());
        err += testing::rel_rms(o, softmax_attention(c)) / seeds;
      }
      errs.push_back(err);
      std::printf("favor vs softmax attention, causal %d, m = %4lld: relative RMS error %.4f\n",
                  causal ? 1 : 0, static_cast<long long>(m), err);
    }
    // Monotone; at large m the Monte Carlo rate 1/√m (×1/2 per 4× features); at small m the error
    // saturates (o is a convex combination of the v_j, so it stays bounded).
    for (std::size_t i = 1; i < errs.size(); ++i)
      EXPECT_LT(errs[i], 0.9 * errs[i - 1]) << "causal " << causal << ": m step " << i;
    EXPECT_LT(errs[3], 0.65 * errs[2]) << "causal " << causal;
    EXPECT_LT(errs.back(), errs.front() / 3) << "causal " << causal;
    EXPECT_LT(errs.back(), 0.12) << "causal " << causal;
  }
}

TEST(FavorAttention, OptimizedMatchesReference) {
  std::mt19937_64 rng(6);
  struct Shape {
    std::int64_t B, T, H, d, V, m;
    std::vector<std::int64_t> lengths;
  };
  const std::vector<Shape> shapes = {
      {2, 9, 2, 5, 3, 7, {}},            // odd sizes, V ≠ d, m not a multiple of d
      {1, 0, 2, 4, 4, 6, {4, 0, 9, 1}},  // varlen with an empty and a 1-token sequence
      {1, 13, 1, 3, 6, 16, {}},          // m > d: several orthogonal blocks
  };
  for (DType dtype : {DType::float64, DType::float32})
    for (const Shape& sh : shapes)
      for (bool causal : {false, true})
        for (bool per_head : {false, true})
          for (Impl impl : {Impl::chunk, Impl::recurrent}) {
            AttnCase c = make_attn(rng, sh.B, sh.T, sh.H, sh.d, sh.V, sh.m, per_head, causal,
                                   sh.lengths, dtype);
            c.chunk_size = 3;
            const Tensor d_o = testing::randn(c.v.shape(), rng, 1.0, dtype);
            const AttnResult ref = run_attn(c, Impl::reference, d_o, DType::float64);
            const AttnResult fast = run_attn(c, impl, d_o, dtype);
            const double tol = dtype == DType::float64 ? 1e-11 : 1e-4;
            SCOPED_TRACE(std::string("causal ") + (causal ? "1" : "0") + " per_head " +
                         (per_head ? "1" : "0") + " " + to_string(impl) + " " + to_string(dtype));
            PHASOR_EXPECT_CLOSE(fast.o, ref.o, tol, "o");
            PHASOR_EXPECT_CLOSE(fast.dq, ref.dq, tol, "dq");
            PHASOR_EXPECT_CLOSE(fast.dk, ref.dk, tol, "dk");
            PHASOR_EXPECT_CLOSE(fast.dv, ref.dv, tol, "dv");
            PHASOR_EXPECT_CLOSE(fast.dw, ref.dw, tol, "dw");
          }
}

// Large logits: the stabilisers keep every exponent ≤ 0, so nothing overflows, and the optimized
// kernel still matches the reference.
TEST(FavorAttention, LargeInputsStayFinite) {
  std::mt19937_64 rng(7);
  for (DType dtype : {DType::float64, DType::float32})
    for (bool causal : {false, true}) {
      const AttnCase c = make_attn(rng, 1, 10, 1, 16, 3, 32, false, causal, {}, dtype, 4.0);
      const Tensor d_o = testing::randn(c.v.shape(), rng, 1.0, dtype);
      const AttnResult ref = run_attn(c, Impl::reference, d_o, DType::float64);
      const AttnResult fast = run_attn(c, Impl::chunk, d_o, dtype);
      const double tol = dtype == DType::float64 ? 1e-9 : 1e-3;
      PHASOR_EXPECT_CLOSE(fast.o, ref.o, tol, "o");
      PHASOR_EXPECT_CLOSE(fast.dq, ref.dq, tol, "dq");
      PHASOR_EXPECT_CLOSE(fast.dk, ref.dk, tol, "dk");
      PHASOR_EXPECT_CLOSE(fast.dw, ref.dw, tol, "dw");
    }
}

// Queries whose features miss the keys' (found by the numerical soak, tests/soak_test.cpp): with
// w's rows ±1 (d = 1), q̂ = 400 puts a query's weight on feature 0 and k̂ = −400 a key's on feature
// 1, e^{−1600} apart. One key stabiliser for all features made every A_ij of such a query 0 and
// o = 0/0 — NaN even for T = 1, where o must be v — in float32 and float64 alike, and the float64
// reference's causal path (a whole-sequence key max) too. With a stabiliser per feature folded
// into the queries the normaliser is at least 1; the reference works in log space.
TEST(FavorAttention, QueriesMissingTheKeysFeaturesStayFinite) {
  for (DType dtype : {DType::float64, DType::float32})
    for (bool causal : {false, true})
      for (std::int64_t T : {1, 4}) {
        SCOPED_TRACE(std::string(to_string(dtype)) + (causal ? " causal" : "") +
                     " T = " + std::to_string(T));
        std::mt19937_64 rng(13);
        AttnCase c = make_attn(rng, 1, T, 1, 1, 3, 2, false, causal, {}, dtype);
        c.w = Tensor::from({2, 1}, {1.0, -1.0}, dtype);
        for (std::int64_t t = 0; t < T; ++t) {
          c.q.set(t, t % 2 == 0 ? 400.0 : -300.0);
          c.k.set(t, t % 3 == 0 ? -400.0 : 350.0);
        }
        const Tensor d_o = testing::randn(c.v.shape(), rng, 1.0, dtype);
        const AttnResult ref = run_attn(c, Impl::reference, d_o, DType::float64);
        for (Impl impl : {Impl::recurrent, Impl::chunk}) {
          const AttnResult fast = run_attn(c, impl, d_o, dtype);
          const double tol = dtype == DType::float64 ? 1e-10 : 1e-5;
          if (T == 1) PHASOR_EXPECT_CLOSE(fast.o, c.v, tol, "o = v");
          PHASOR_EXPECT_CLOSE(fast.o, ref.o, tol, "o");
          PHASOR_EXPECT_CLOSE(fast.dv, ref.dv, tol, "dv");
          for (const Tensor* g : {&fast.dq, &fast.dk, &fast.dw})
            EXPECT_TRUE(testing::all_finite(*g));
        }
      }
}

// Central differences of L = Σ d_o·o in float64 for q, k, v and w, causal and not, varlen. The
// stabilisers are on: o does not depend on them, so the gradient is exact.
TEST(FavorAttention, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(8);
  for (bool causal : {false, true})
    for (bool per_head : {false, true}) {
      AttnCase c = make_attn(rng, 1, 0, 2, 3, 2, 5, per_head, causal, {3, 2});
      c.chunk_size = 2;
      const Tensor d_o = testing::randn(c.v.shape(), rng);
      for (Impl impl : {Impl::reference, Impl::chunk}) {
        const AttnResult r = run_attn(c, impl, d_o, DType::float64);
        const auto loss = [&] {
          Tensor o = Tensor::nans(c.v.shape());
          favor_attention_forward(c.params(), Impl::reference, o.view());
          return testing::dot(o, d_o);
        };
        const std::string what = std::string("causal ") + (causal ? "1" : "0") + " per_head " +
                                 (per_head ? "1" : "0") + " " + to_string(impl) + " d";
        // Element by element: |analytic − numeric| ≤ 1e-7 (1 + |numeric|).
        for (auto [t, g, name] : {std::tuple<Tensor*, const Tensor*, const char*>{&c.q, &r.dq, "q"},
                                  {&c.k, &r.dk, "k"},
                                  {&c.v, &r.dv, "v"},
                                  {&c.w, &r.dw, "w"}})
          PHASOR_EXPECT_ALL_NEAR(*g, testing::numerical_gradient(*t, loss), 1e-7, 1e-7,
                                 what + name);
      }
    }
}

// Strided inputs: q, k, v read as every other head of wider tensors and w transposed in memory
// give the same results as their contiguous copies.
TEST(FavorAttention, StridedInputsMatchContiguous) {
  std::mt19937_64 rng(11);
  for (bool causal : {false, true}) {
    const AttnCase c = make_attn(rng, 2, 6, 2, 3, 2, 5, false, causal);
    const std::int64_t B = 2, T = 6, H = 2, d = 3, V = 2, m = 5;
    // Wider buffers [B, T, 2H, ·] holding the inputs at heads 0, 2, … and garbage in between.
    auto widen = [&](const Tensor& x, std::int64_t D) {
      Tensor wide = testing::randn({B, T, 2 * H, D}, rng);
      for (std::int64_t i = 0; i < B * T * H * D; ++i) {
        const std::int64_t e = i % D, h = (i / D) % H, bt = i / (D * H);
        wide.set((bt * 2 * H + 2 * h) * D + e, x.at(i));
      }
      return wide;
    };
    const Tensor qw = widen(c.q, d), kw = widen(c.k, d), vw = widen(c.v, V);
    Tensor wt({d, m}, DType::float64);  // w stored transposed
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t i = 0; i < d; ++i) wt.set(i * m + r, c.w.at(r * d + i));
    auto strided = [&](const Tensor& t, std::int64_t D) {
      return TensorView::strided(t.view().data, DType::float64, {B, T, H, D},
                                 {T * 2 * H * D, 2 * H * D, 2 * D, 1});
    };
    FavorAttentionParams p = c.params();
    p.q = strided(qw, d);
    p.k = strided(kw, d);
    p.v = strided(vw, V);
    p.w = TensorView::strided(wt.view().data, DType::float64, {m, d}, {1, m});
    const Tensor d_o = testing::randn(c.v.shape(), rng);
    const AttnResult ref = run_attn(c, Impl::reference, d_o, DType::float64);
    Tensor o = Tensor::nans(c.v.shape()), dq = Tensor::nans(c.q.shape()),
           dk = Tensor::nans(c.k.shape()), dv = Tensor::nans(c.v.shape()),
           dw = Tensor::nans(c.w.shape());
    favor_attention_forward(p, Impl::chunk, o.view());
    favor_attention_backward(p, Impl::chunk, d_o.view(),
                             {dq.view(), dk.view(), dv.view(), dw.view()});
    PHASOR_EXPECT_CLOSE(o, ref.o, 1e-11, "o");
    PHASOR_EXPECT_CLOSE(dq, ref.dq, 1e-11, "dq");
    PHASOR_EXPECT_CLOSE(dk, ref.dk, 1e-11, "dk");
    PHASOR_EXPECT_CLOSE(dv, ref.dv, 1e-11, "dv");
    PHASOR_EXPECT_CLOSE(dw, ref.dw, 1e-11, "dw");
  }
}

TEST(FavorAttention, DeterministicForAnyThreadCount) {
  std::mt19937_64 rng(9);
  for (bool causal : {false, true}) {
    const AttnCase c = make_attn(rng, 3, 11, 2, 4, 3, 8, false, causal);
    const Tensor d_o = testing::randn(c.v.shape(), rng);
    set_num_threads(1);
    const AttnResult a = run_attn(c, Impl::chunk, d_o, DType::float64);
    set_num_threads(2);
    const AttnResult b = run_attn(c, Impl::chunk, d_o, DType::float64);
    set_num_threads(0);
    EXPECT_TRUE(a.o.bit_equal(b.o));
    EXPECT_TRUE(a.dq.bit_equal(b.dq));
    EXPECT_TRUE(a.dk.bit_equal(b.dk));
    EXPECT_TRUE(a.dv.bit_equal(b.dv));
    EXPECT_TRUE(a.dw.bit_equal(b.dw));
  }
}

// ---------------------------------------------------------------------------------------------
// The causal key stabiliser in float32 (favor.h: a running max, c_t = max_{s ≤ t} u_s).
//
// Keys by kind, d = m = 64 at the default scale (k̂ = 64^{−1/4} k):
//   'b' big: a random direction of norm 48, logits u_r = w_rᵀk̂ − |k̂|²/2 ≈ 2.4·17 − 144 ≈ −100;
//   'o' outlier: k̂ = w_r* for the longest row r* of W, u_r* = |w_r*|²/2 ≈ +40 (the largest logit
//       any key can reach is max_r |w_r|²/2);
//   'n' normal: N(0, I), u ≈ +3.
// A whole-sequence stabiliser set by an 'o' scales every earlier 'b' feature by
// exp(−(u_o − u_b)) < 2^−149 (float32's smallest denormal): their features, and with them the
// normaliser of every earlier output, would round to 0 and those outputs become 0/0.
AttnCase make_keyed(std::mt19937_64& rng, const std::string& kinds, const Tensor& w) {
  const std::int64_t T = static_cast<std::int64_t>(kinds.size()), d = 64, V = 4;
  const double s = std::pow(64.0, -0.25);  // input_scale at the default softmax scale
  AttnCase c;
  c.q = testing::randn({1, T, 1, d}, rng, 1.0, DType::float32);
  c.v = testing::randn({1, T, 1, V}, rng, 1.0, DType::float32);
  c.k = testing::randn({1, T, 1, d}, rng, 1.0, DType::float32);
  c.w = w;
  c.causal = true;
  c.chunk_size = 8;
  std::int64_t longest = 0;
  for (std::int64_t r = 1; r < 64; ++r) {
    double a = 0, b = 0;
    for (std::int64_t i = 0; i < d; ++i) {
      a += w_at(w, r, i) * w_at(w, r, i);
      b += w_at(w, longest, i) * w_at(w, longest, i);
    }
    if (a > b) longest = r;
  }
  for (std::int64_t t = 0; t < T; ++t) {
    const char kind = kinds[static_cast<std::size_t>(t)];
    double norm = 0;
    for (std::int64_t i = 0; i < d; ++i) norm += c.k.at(t * d + i) * c.k.at(t * d + i);
    norm = std::sqrt(norm);
    for (std::int64_t i = 0; i < d; ++i) {
      if (kind == 'b') c.k.set(t * d + i, c.k.at(t * d + i) * 48.0 / norm);
      if (kind == 'o') c.k.set(t * d + i, w_at(w, longest, i) / s);
    }
  }
  return c;
}

// max_r u_r(k̂_t) in float64, the per-token key logit the stabilisers are built from.
double key_logit(const AttnCase& c, std::int64_t t) {
  const std::int64_t d = 64;
  const double s = std::pow(64.0, -0.25);
  double sq = 0, best = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < d; ++i) sq += s * c.k.at(t * d + i) * s * c.k.at(t * d + i);
  for (std::int64_t r = 0; r < 64; ++r) {
    double u = 0;
    for (std::int64_t i = 0; i < d; ++i) u += w_at(c.w, r, i) * s * c.k.at(t * d + i);
    best = std::max(best, u - 0.5 * sq);
  }
  return best;
}

// Tokens [begin, begin + L) of a one-row problem, as a problem of its own.
AttnCase slice(const AttnCase& c, std::int64_t begin, std::int64_t L) {
  AttnCase out = c;
  out.cu = Tensor();
  auto cut = [&](const Tensor& x) {
    const std::int64_t D = x.shape()[3];
    Tensor y({1, L, 1, D}, x.dtype());
    for (std::int64_t i = 0; i < L * D; ++i) y.set(i, x.at(begin * D + i));
    return y;
  };
  out.q = cut(c.q);
  out.k = cut(c.k);
  out.v = cut(c.v);
  return out;
}

// Outputs at tokens [0, L) of a (one-row) result equal those of another: bit for bit (tol = 0),
// or to within tol relative (a shorter problem has a shorter last chunk, so its dense products
// may round differently).
void expect_prefix_equal(const Tensor& a, std::int64_t a_begin, const Tensor& b, std::int64_t L,
                         const std::string& what, double tol = 0) {
  const std::int64_t V = a.shape()[3];
  for (std::int64_t i = 0; i < L * V; ++i) {
    const double x = a.at(a_begin * V + i), y = b.at(i);
    if (tol == 0)
      ASSERT_EQ(x, y) << what << ": token " << i / V;
    else
      ASSERT_NEAR(x, y, tol * (1 + std::fabs(y))) << what << ": token " << i / V;
  }
}

// A late outlier key must not change (or break) earlier outputs: with the running stabiliser the
// outputs before it are, bit for bit, those of the same problem with an ordinary key in its place,
// and (to rounding) those of the problem cut before it; everything is finite and matches the
// float64 reference.
TEST(FavorAttention, LateOutlierKeyLeavesEarlierOutputsUnchanged) {
  std::mt19937_64 rng(21);
  const Tensor w = random_w(FavorMatrixKind::orthogonal_chi, 5, {64, 64}, DType::float32);
  const std::int64_t t0 = 13;  // mid-chunk (chunk_size 8)
  const AttnCase c = make_keyed(rng, "bbbbbbbbbbbbbonnnnnnnnnn", w);
  AttnCase ordinary = c;  // the outlier replaced by a big key (the key of token 0)
  for (std::int64_t i = 0; i < 64; ++i) ordinary.k.set(t0 * 64 + i, c.k.at(i));
  double early = -std::numeric_limits<double>::infinity();
  for (std::int64_t t = 0; t < t0; ++t) early = std::max(early, key_logit(c, t));
  // The premise: a whole-sequence stabiliser would flush the early keys' features to 0.
  ASSERT_GT(key_logit(c, t0) - early, 104.0);
  const Tensor d_o = testing::randn(c.v.shape(), rng, 1.0, DType::float32);
  const AttnResult ref = run_attn(c, Impl::reference, d_o, DType::float64);
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    SCOPED_TRACE(to_string(impl));
    const AttnResult fast = run_attn(c, impl, d_o, DType::float32);
    PHASOR_EXPECT_CLOSE(fast.o, ref.o, 3e-5, "o");
    PHASOR_EXPECT_CLOSE(fast.dq, ref.dq, 1e-4, "dq");
    PHASOR_EXPECT_CLOSE(fast.dk, ref.dk, 1e-4, "dk");
    PHASOR_EXPECT_CLOSE(fast.dv, ref.dv, 1e-4, "dv");
    PHASOR_EXPECT_CLOSE(fast.dw, ref.dw, 1e-4, "dw");
    const AttnCase cut = slice(c, 0, t0);
    Tensor o_cut = Tensor::nans(cut.v.shape(), DType::float32),
           o_ord = Tensor::nans(c.v.shape(), DType::float32);
    favor_attention_forward(cut.params(), impl, o_cut.view());
    favor_attention_forward(ordinary.params(), impl, o_ord.view());
    expect_prefix_equal(fast.o, 0, o_cut, t0, "cut before the outlier", 1e-6);
    expect_prefix_equal(fast.o, 0, o_ord, t0, "an ordinary key in its place");
  }
}

// Packed sequences: the running stabiliser restarts at each sequence. The second sequence holds
// only big keys; had it inherited the first one's running max (set by its outlier), its features
// would all round to 0. Each sequence's outputs equal those of the sequence run alone.
TEST(FavorAttention, RunningKeyStabiliserRestartsPerSequence) {
  std::mt19937_64 rng(22);
  const Tensor w = random_w(FavorMatrixKind::orthogonal_chi, 6, {64, 64}, DType::float32);
  AttnCase c = make_keyed(rng, "bbbbbbbbbbbbbonnnnnnbbbbbbbbbbbb", w);
  c.cu = testing::cu_seqlens({20, 12});
  double second = -std::numeric_limits<double>::infinity();
  for (std::int64_t t = 20; t < 32; ++t) second = std::max(second, key_logit(c, t));
  ASSERT_GT(key_logit(c, 13) - second, 104.0);
  const Tensor d_o = testing::randn(c.v.shape(), rng, 1.0, DType::float32);
  const AttnResult ref = run_attn(c, Impl::reference, d_o, DType::float64);
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    SCOPED_TRACE(to_string(impl));
    const AttnResult fast = run_attn(c, impl, d_o, DType::float32);
    PHASOR_EXPECT_CLOSE(fast.o, ref.o, 3e-5, "o");
    PHASOR_EXPECT_CLOSE(fast.dq, ref.dq, 1e-4, "dq");
    PHASOR_EXPECT_CLOSE(fast.dk, ref.dk, 1e-4, "dk");
    PHASOR_EXPECT_CLOSE(fast.dv, ref.dv, 1e-4, "dv");
    PHASOR_EXPECT_CLOSE(fast.dw, ref.dw, 1e-4, "dw");
    for (auto [begin, L] : {std::pair<std::int64_t, std::int64_t>{0, 20}, {20, 12}}) {
      const AttnCase alone = slice(c, begin, L);
      Tensor o = Tensor::nans(alone.v.shape(), DType::float32);
      favor_attention_forward(alone.params(), impl, o.view());
      expect_prefix_equal(fast.o, begin, o, L, "sequence at " + std::to_string(begin) + " alone");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(FavorErrors, BadShapesAndDtypes) {
  std::mt19937_64 rng(10);
  using testing::expect_error;
  Tensor bad_w({4}, DType::float64);
  expect_error([&] { favor_random_matrix(FavorMatrixKind::iid, 1, bad_w.view()); },
               {"favor_random_matrix", "'w'", "[4]"});
  Tensor int_w({4, 3}, DType::int32);
  expect_error([&] { favor_random_matrix(FavorMatrixKind::iid, 1, int_w.view()); },
               {"favor_random_matrix", "'w'", "int32"});
  Tensor empty_w({0, 3}, DType::float64);
  expect_error([&] { favor_random_matrix(FavorMatrixKind::iid, 1, empty_w.view()); },
               {"favor_random_matrix", "'w'", "m ≥ 1"});

  AttnCase c = make_attn(rng, 2, 5, 2, 4, 3, 6, false, false);
  Tensor o = Tensor::nans(c.v.shape());
  auto fwd = [&](const AttnCase& cc, Impl impl = Impl::chunk) {
    favor_attention_forward(cc.params(), impl, o.view());
  };
  {
    AttnCase b = c;
    b.w = random_w(FavorMatrixKind::iid, 1, {6, 5});  // d mismatch
    expect_error([&] { fwd(b); }, {"favor_attention", "'w'", "[6, 5]"});
    expect_error([&] { fwd(b, Impl::reference); }, {"favor_attention_reference", "'w'"});
  }
  {
    AttnCase b = c;
    b.w = random_w(FavorMatrixKind::iid, 1, {3, 6, 4});  // H mismatch
    expect_error([&] { fwd(b); }, {"favor_attention", "'w'", "[3, 6, 4]"});
  }
  {
    AttnCase b = c;
    b.k = testing::randn({2, 5, 2, 3}, rng);
    expect_error([&] { fwd(b); }, {"favor_attention", "'k'", "[2, 5, 2, 3]"});
  }
  {
    AttnCase b = c;
    b.q = c.q.to(DType::int32);
    expect_error([&] { fwd(b); }, {"favor_attention", "'q'", "int32"});
  }
  {
    AttnCase b = c;
    b.cu = testing::cu_seqlens({2, 3});  // requires B = 1
    expect_error([&] { fwd(b); }, {"favor_attention", "cu_seqlens"});
  }
  {
    FavorAttentionParams p = c.params();
    p.scale = -1.0;
    expect_error([&] { favor_attention_forward(p, Impl::chunk, o.view()); },
                 {"favor_attention", "'scale'"});
    p = c.params();
    p.chunk_size = 0;
    expect_error([&] { favor_attention_forward(p, Impl::chunk, o.view()); },
                 {"favor_attention", "chunk_size"});
  }
  Tensor bad_o = Tensor::nans({2, 5, 2, 4});
  expect_error([&] { favor_attention_forward(c.params(), Impl::chunk, bad_o.view()); },
               {"favor_attention", "'o'", "[2, 5, 2, 4]"});
  Tensor bad_dw = Tensor::nans({2, 6, 4});
  Tensor d_o = testing::randn(c.v.shape(), rng);
  expect_error(
      [&] {
        favor_attention_backward(c.params(), Impl::chunk, d_o.view(), {{}, {}, {}, bad_dw.view()});
      },
      {"favor_attention", "'dw'", "[2, 6, 4]"});
  const Tensor x = testing::randn({1, 3, 2, 4}, rng);
  Tensor phi = Tensor::nans({1, 3, 2, 7});
  expect_error(
      [&] {
        favor_features_forward({x.view(), c.w.view(), FavorStabilizer::key, {}}, Impl::chunk,
                               phi.view());
      },
      {"favor_features", "'phi'", "[1, 3, 2, 7]"});
  Tensor d_phi_bad = Tensor::nans({1, 3, 2, 5});
  expect_error(
      [&] {
        favor_features_backward({x.view(), c.w.view(), FavorStabilizer::key, {}}, Impl::reference,
                                d_phi_bad.view(), {}, {});
      },
      {"favor_features_reference", "'d_phi'"});
}

}  // namespace
}  // namespace phasor
