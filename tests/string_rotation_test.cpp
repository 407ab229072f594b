// Tests of the STRING ops (phasor/string_rotation.h): N-d RoPE angles, Cayley-STRING and
// Circulant-STRING. Every optimized kernel against the float64 reference (random and adversarial
// inputs, float32 and float64, odd K for the circulant), gradients by central finite differences
// in float64 for every learnable input, and the paper's theorems as tests: the relative law,
// orthogonality and det = +1, commuting generators, separability, RoPE as the special case S = 0,
// the FFT path against a dense matrix exponential (Eigen's MatrixFunctions, testing::matrix_exp).
#include "common/eigen.h"  // first: see there

#include "phasor/string_rotation.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <complex>
#include <functional>
#include <random>
#include <vector>

#include "phasor/rotary.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/matrix_exp.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;
using Md = Eigen::MatrixXd;

constexpr double kPi = 3.14159265358979323846;
constexpr Impl kFast = Impl::chunk;

// ---------------------------------------------------------------------------------------------
// N-d RoPE angles.

TEST(NdRopeAngles, KernelMatchesReference) {
  std::mt19937_64 rng(1);
  for (DType dtype : {DType::float64, DType::float32})
    for (bool per_head : {false, true}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + (per_head ? " per head" : " shared"));
      const std::int64_t B = 2, T = 300, H = 3, C = 3, R = 5;  // T > one token block
      // Adversarial: positions in the thousands (image/point coordinates), mixed signs.
      const Tensor r = testing::randn({B, T, C}, rng, 1000.0, dtype);
      const Tensor w = per_head ? testing::randn({H, C, R}, rng, 1.0, dtype)
                                : testing::randn({C, R}, rng, 1.0, dtype);
      const std::vector<std::int64_t> ts =
          per_head ? std::vector<std::int64_t>{B, T, H, R} : std::vector<std::int64_t>{B, T, R};
      Tensor th_ref = Tensor::nans(ts), th = Tensor::nans(ts, dtype);
      nd_rope_angles_forward(r.view(), w.view(), Impl::reference, th_ref.view());
      nd_rope_angles_forward(r.view(), w.view(), kFast, th.view());
      const double tol = dtype == DType::float32 ? 1e-6 : 1e-14;
      PHASOR_EXPECT_CLOSE(th, th_ref, tol, "theta");
      const Tensor dth = testing::randn(ts, rng, 1.0, dtype);
      Tensor dr_ref = Tensor::nans({B, T, C}), dw_ref = Tensor::nans(w.shape());
      Tensor dr = Tensor::nans({B, T, C}, dtype), dw = Tensor::nans(w.shape(), dtype);
      nd_rope_angles_backward(r.view(), w.view(), Impl::reference, dth.view(), dr_ref.view(),
                              dw_ref.view());
      nd_rope_angles_backward(r.view(), w.view(), kFast, dth.view(), dr.view(), dw.view());
      PHASOR_EXPECT_CLOSE(dr, dr_ref, tol, "d_positions");
      PHASOR_EXPECT_CLOSE(dw, dw_ref, tol, "d_omega");
    }
}

TEST(NdRopeAngles, FiniteDifferences) {
  std::mt19937_64 rng(2);
  for (bool per_head : {false, true})
    for (Impl impl : {Impl::reference, kFast}) {
      const std::int64_t B = 2, T = 3, H = 2, C = 2, R = 3;
      Tensor r = testing::randn({B, T, C}, rng, 2.0);
      Tensor w = per_head ? testing::randn({H, C, R}, rng) : testing::randn({C, R}, rng);
      const std::vector<std::int64_t> ts =
          per_head ? std::vector<std::int64_t>{B, T, H, R} : std::vector<std::int64_t>{B, T, R};
      const Tensor dth = testing::randn(ts, rng);
      Tensor dr = Tensor::nans({B, T, C}), dw = Tensor::nans(w.shape());
      nd_rope_angles_backward(r.view(), w.view(), impl, dth.view(), dr.view(), dw.view());
      auto loss = [&] {
        Tensor th = Tensor::nans(ts);
        nd_rope_angles_forward(r.view(), w.view(), impl, th.view());
        return testing::dot(th, dth);
      };
      PHASOR_EXPECT_GRADIENT(dr, r, loss, 1e-7, "d_positions");
      PHASOR_EXPECT_GRADIENT(dw, w, loss, 1e-7, "d_omega");
    }
}

// With one axis, the axis-split spectrum is RoPE's base^(−2i/K) and θ = t ω is rope_angles.
TEST(NdRopeAngles, AxisSplitFrequencies) {
  const std::int64_t K = 12, R = K / 2, T = 5;
  Tensor w1 = Tensor::nans({1, R});
  nd_rope_axis_split_frequencies(1, K, 10000.0, w1.view());
  Tensor pos({1, T, 1}, DType::float64);
  for (std::int64_t t = 0; t < T; ++t) pos.set(t, static_cast<double>(t));
  Tensor th = Tensor::nans({1, T, R}), th_rope = Tensor::nans({1, T, R});
  nd_rope_angles_forward(pos.view(), w1.view(), kFast, th.view());
  RopeAnglesParams rp;
  rp.T = T;
  rp.head_dim = K;
  rope_angles(rp, Impl::reference, th_rope.view());
  PHASOR_EXPECT_CLOSE(th, th_rope, 1e-15, "1-axis split vs rope_angles");
  // Three axes over R = 7 pairs: slices of 3, 2, 2 pairs, each pair owned by exactly one axis,
  // each slice starting at frequency 1 and decaying to base^(−(n−1)/n).
  Tensor w3 = Tensor::nans({3, 7});
  nd_rope_axis_split_frequencies(3, 14, 100.0, w3.view());
  const std::int64_t start[3] = {0, 3, 5}, n[3] = {3, 2, 2};
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t i = 0; i < 7; ++i) {
      const std::int64_t j = i - start[c];
      const double want = (j >= 0 && j < n[c]) ? std::pow(100.0, -double(j) / double(n[c])) : 0.0;
      EXPECT_DOUBLE_EQ(w3.at(c * 7 + i), want) << "axis " << c << " pair " << i;
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers: dense rotation matrices built from an op by encoding the basis vectors.

// The dense K × K matrix R(r) of an encoder `enc(z, positions, y)` for one position r (C values):
// T = K tokens at the same position, z_t = e_t, so y_t is column t of R(r).
using Encoder = std::function<void(const Tensor& z, const Tensor& pos, Tensor& y)>;
Md dense(const Encoder& enc, std::int64_t K, const std::vector<double>& r) {
  const auto C = static_cast<std::int64_t>(r.size());
  Tensor z({1, K, 1, K}, DType::float64), pos({1, K, C}, DType::float64);
  for (std::int64_t t = 0; t < K; ++t) {
    z.set(t * K + t, 1.0);
    for (std::int64_t c = 0; c < C; ++c) pos.set(t * C + c, r[static_cast<std::size_t>(c)]);
  }
  Tensor y = Tensor::nans({1, K, 1, K});
  enc(z, pos, y);
  Md M(K, K);
  for (std::int64_t t = 0; t < K; ++t)
    for (std::int64_t k = 0; k < K; ++k) M(k, t) = y.at(t * K + k);
  return M;
}
std::vector<double> sub(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Orthogonality, det = +1 and (when `group`) the exact relative law R(a)ᵀR(b) = R(b − a).
// Returns ‖R(a)ᵀR(b) − R(b − a)‖ (max abs).
double check_rotation_laws(const Encoder& enc, std::int64_t K, const std::vector<double>& a,
                           const std::vector<double>& b) {
  const Md Ra = dense(enc, K, a), Rb = dense(enc, K, b), Rd = dense(enc, K, sub(b, a));
  const Md I = Md::Identity(K, K);
  EXPECT_LE((Ra.transpose() * Ra - I).cwiseAbs().maxCoeff(), 1e-12) << "RᵀR = I";
  EXPECT_NEAR(Ra.determinant(), 1.0, 1e-12) << "det R = +1";
  return (Ra.transpose() * Rb - Rd).cwiseAbs().maxCoeff();
}

// Logits q_iᵀ R(r_i)ᵀ R(r_j) k_j for one q, k and positions r_i, r_j, through the op.
double logit(const Encoder& enc, const Tensor& q, const Tensor& k, const std::vector<double>& ri,
             const std::vector<double>& rj) {
  const std::int64_t K = q.numel();
  const auto C = static_cast<std::int64_t>(ri.size());
  Tensor pi({1, 1, C}, DType::float64), pj({1, 1, C}, DType::float64);
  for (std::int64_t c = 0; c < C; ++c) {
    pi.set(c, ri[static_cast<std::size_t>(c)]);
    pj.set(c, rj[static_cast<std::size_t>(c)]);
  }
  Tensor yq = Tensor::nans({1, 1, 1, K}), yk = Tensor::nans({1, 1, 1, K});
  enc(q, pi, yq);
  enc(k, pj, yk);
  return testing::dot(yq, yk);
}

// Separability: each token encoded on its own equals the batch result.
void check_separable(const Encoder& enc, const Tensor& z, const Tensor& pos, const Tensor& y) {
  const auto& s = z.shape();
  const std::int64_t B = s[0], T = s[1], H = s[2], K = s[3], C = pos.shape()[2];
  double worst = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      Tensor zt({1, 1, H, K}, DType::float64), pt({1, 1, C}, DType::float64);
      for (std::int64_t i = 0; i < H * K; ++i) zt.set(i, z.at((b * T + t) * H * K + i));
      for (std::int64_t c = 0; c < C; ++c) pt.set(c, pos.at((b * T + t) * C + c));
      Tensor yt = Tensor::nans({1, 1, H, K});
      enc(zt, pt, yt);
      for (std::int64_t i = 0; i < H * K; ++i)
        worst = std::max(worst, std::fabs(yt.at(i) - y.at((b * T + t) * H * K + i)));
    }
  EXPECT_LE(worst, 1e-13) << "token alone vs batch";
}

// N-d RoPE as an encoder: angles then apply_rotary (θ shared by heads, broadcast).
Encoder nd_rope_encoder(const Tensor& omega, RotaryLayout layout) {
  return [&omega, layout](const Tensor& z, const Tensor& pos, Tensor& y) {
    const auto& s = z.shape();
    const std::int64_t R = s[3] / 2;
    Tensor th = Tensor::nans({s[0], s[1], R});
    nd_rope_angles_forward(pos.view(), omega.view(), kFast, th.view());
    apply_rotary_forward(z.view(),
                         TensorView::strided(th.view().data, DType::float64, {s[0], s[1], s[2], R},
                                             {s[1] * R, R, 0, 1}),
                         layout, kFast, y.view());
  };
}

TEST(NdRope, RelativeLawOrthogonalitySeparability) {
  std::mt19937_64 rng(3);
  const std::int64_t K = 8, C = 2;
  const Tensor omega = testing::randn({C, K / 2}, rng);
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    const Encoder enc = nd_rope_encoder(omega, layout);
    // A one-parameter group: R(a)ᵀR(b) = R(b − a) exactly (to rounding).
    EXPECT_LE(check_rotation_laws(enc, K, {0.7, -2.5}, {3.1, 1.2}), 1e-12);
    const Tensor z = testing::randn({2, 3, 2, K}, rng), pos = testing::randn({2, 3, C}, rng, 5.0);
    Tensor y = Tensor::nans({2, 3, 2, K});
    enc(z, pos, y);
    check_separable(enc, z, pos, y);
  }
}

// ---------------------------------------------------------------------------------------------
// Cayley-STRING.

struct CayleyCase {
  Tensor z, pos, omega, A;
  RotaryLayout layout = RotaryLayout::half_split;
  CayleyStringParams params() const {
    return {z.view(), pos.view(), omega.view(), A.view(), layout};
  }
};
CayleyCase cayley_case(std::mt19937_64& rng, std::int64_t B, std::int64_t T, std::int64_t H,
                       std::int64_t K, std::int64_t C, bool per_head, DType dtype = DType::float64,
                       double a_std = 0.5, double pos_std = 3.0) {
  CayleyCase c;
  c.z = testing::randn({B, T, H, K}, rng, 1.0, dtype);
  c.pos = testing::randn({B, T, C}, rng, pos_std, dtype);
  c.omega = per_head ? testing::randn({H, C, K / 2}, rng, 1.0, dtype)
                     : testing::randn({C, K / 2}, rng, 1.0, dtype);
  c.A = per_head ? testing::randn({H, K, K}, rng, a_std, dtype)
                 : testing::randn({K, K}, rng, a_std, dtype);
  return c;
}
struct CayleyOut {
  Tensor y, dz, dpos, domega, dA;
};
CayleyOut run_cayley(const CayleyCase& c, Impl impl, const Tensor& dy, DType out = DType::float64) {
  const auto& s = c.z.shape();
  CayleyOut o;
  o.y = Tensor::nans(s, out);
  cayley_string_forward(c.params(), impl, o.y.view());
  o.dz = Tensor::nans(s, out);
  o.dpos = Tensor::nans(c.pos.shape(), out);
  o.domega = Tensor::nans(c.omega.shape(), out);
  o.dA = Tensor::nans(c.A.shape(), out);
  cayley_string_backward(c.params(), impl, dy.view(),
                         {o.dz.view(), o.dpos.view(), o.domega.view(), o.dA.view()});
  return o;
}
Encoder cayley_encoder(const Tensor& omega, const Tensor& A, RotaryLayout layout,
                       Impl impl = kFast) {
  return [&omega, &A, layout, impl](const Tensor& z, const Tensor& pos, Tensor& y) {
    cayley_string_forward({z.view(), pos.view(), omega.view(), A.view(), layout}, impl, y.view());
  };
}

TEST(CayleyString, KernelMatchesReference) {
  std::mt19937_64 rng(4);
  for (DType dtype : {DType::float64, DType::float32})
    for (bool per_head : {false, true})
      for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
        SCOPED_TRACE(std::string(to_string(dtype)) + (per_head ? " per head " : " shared ") +
                     to_string(layout));
        // Adversarial: a large generator (P far from I), positions in the hundreds.
        CayleyCase c = cayley_case(rng, 2, 7, 3, 10, 3, per_head, dtype, 3.0, 300.0);
        c.layout = layout;
        const Tensor dy = testing::randn(c.z.shape(), rng, 1.0, dtype);
        const CayleyOut ref = run_cayley(c, Impl::reference, dy);
        const CayleyOut fast = run_cayley(c, kFast, dy, dtype);
        const double tol = dtype == DType::float32 ? 2e-4 : 1e-11;
        PHASOR_EXPECT_CLOSE(fast.y, ref.y, tol, "y");
        PHASOR_EXPECT_CLOSE(fast.dz, ref.dz, tol, "dz");
        PHASOR_EXPECT_CLOSE(fast.dpos, ref.dpos, tol, "d_positions");
        PHASOR_EXPECT_CLOSE(fast.domega, ref.domega, tol, "d_omega");
        PHASOR_EXPECT_CLOSE(fast.dA, ref.dA, tol, "d_generator");
        const CayleyOut rec = run_cayley(c, Impl::recurrent, dy, dtype);
        EXPECT_TRUE(rec.y.bit_equal(fast.y));
        EXPECT_TRUE(rec.dA.bit_equal(fast.dA));
      }
}

// A huge generator (|A| ≈ 1e4, found by the numerical soak, tests/soak_test.cpp): I + S has a
// condition number of about |S|. The float32 kernel solved with it in float32 and summed du + dz
// (≈ 0: P ≈ −I away from S's small eigenvalues), so y, dz and dA lost about eps |S| (dA off by 6e-4
// relative); it now applies Q = (I + S)⁻¹ formed in float64, with u = 2 Q z − z and
// du + dz = 2 Qᵀ du, and keeps float32's accuracy.
TEST(CayleyString, HugeGeneratorKeepsFloat32Accuracy) {
  std::mt19937_64 rng(14);
  for (bool per_head : {false, true}) {
    SCOPED_TRACE(per_head ? "per head" : "shared");
    const CayleyCase c = cayley_case(rng, 1, 9, 2, 20, 2, per_head, DType::float32, 1e4, 1.0);
    const Tensor dy = testing::randn(c.z.shape(), rng, 1.0, DType::float32);
    const CayleyOut ref = run_cayley(c, Impl::reference, dy);
    const CayleyOut fast = run_cayley(c, kFast, dy, DType::float32);
    PHASOR_EXPECT_CLOSE(fast.y, ref.y, 1e-5, "y");
    PHASOR_EXPECT_CLOSE(fast.dz, ref.dz, 1e-5, "dz");
    PHASOR_EXPECT_CLOSE(fast.dA, ref.dA, 1e-5, "d_generator");
  }
}

TEST(CayleyString, FiniteDifferences) {
  std::mt19937_64 rng(5);
  for (bool per_head : {false, true})
    for (Impl impl : {Impl::reference, kFast}) {
      SCOPED_TRACE(std::string(to_string(impl)) + (per_head ? " per head" : " shared"));
      CayleyCase c = cayley_case(rng, 1, 3, 2, 6, 2, per_head);
      const Tensor dy = testing::randn(c.z.shape(), rng);
      const CayleyOut o = run_cayley(c, impl, dy);
      auto loss = [&] {
        Tensor y = Tensor::nans(c.z.shape());
        cayley_string_forward(c.params(), impl, y.view());
        return testing::dot(y, dy);
      };
      PHASOR_EXPECT_GRADIENT(o.dz, c.z, loss, 1e-7, "dz");
      PHASOR_EXPECT_GRADIENT(o.dpos, c.pos, loss, 1e-7, "d_positions");
      PHASOR_EXPECT_GRADIENT(o.domega, c.omega, loss, 1e-7, "d_omega");
      PHASOR_EXPECT_GRADIENT(o.dA, c.A, loss, 1e-7, "d_generator");
    }
}

// P = (I − S)(I + S)⁻¹ from the op (R(0) = P) against an explicit inverse built here, and
// S = 0 (A symmetric, not zero) recovers N-d RoPE.
TEST(CayleyString, CayleyMatrixAndRopeSpecialCase) {
  std::mt19937_64 rng(6);
  const std::int64_t K = 6, C = 2;
  const Tensor omega = testing::randn({C, K / 2}, rng);
  const Tensor A = testing::randn({K, K}, rng);
  Md Am(K, K);
  for (std::int64_t i = 0; i < K * K; ++i) Am(i / K, i % K) = A.at(i);
  const Md S = Am - Am.transpose(), I = Md::Identity(K, K);
  const Md P = (I - S) * (I + S).inverse();
  const Md P_op = dense(cayley_encoder(omega, A, RotaryLayout::half_split), K, {0.0, 0.0});
  EXPECT_LE((P_op - P).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_GT((P - I).cwiseAbs().maxCoeff(), 0.1);  // a real rotation, not the identity

  Tensor sym({K, K}, DType::float64);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < K; ++j) sym.set(i * K + j, Am(i, j) + Am(j, i));
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    const Md R_cayley = dense(cayley_encoder(omega, sym, layout), K, {1.5, -0.3});
    const Md R_rope = dense(nd_rope_encoder(omega, layout), K, {1.5, -0.3});
    EXPECT_LE((R_cayley - R_rope).cwiseAbs().maxCoeff(), 1e-14) << to_string(layout);
  }
}

// Orthogonality and det = +1; the relative law holds for the LOGITS (q and k share P), but
// R(r_i)ᵀR(r_j) = Pᵀ RoPE(r_j − r_i) P is not R(r_j − r_i) = RoPE(r_j − r_i) P.
TEST(CayleyString, RelativeLawForLogitsNotForMatrices) {
  std::mt19937_64 rng(7);
  const std::int64_t K = 8, C = 2;
  const Tensor omega = testing::randn({C, K / 2}, rng), A = testing::randn({K, K}, rng, 0.7);
  for (Impl impl : {Impl::reference, kFast}) {
    const Encoder enc = cayley_encoder(omega, A, RotaryLayout::half_split, impl);
    const std::vector<double> a = {0.7, -2.5}, b = {3.1, 1.2};
    const double mismatch = check_rotation_laws(enc, K, a, b);
    EXPECT_GT(mismatch, 0.05) << "RoPE(r)·P is not a one-parameter group";
    const Md Ra = dense(enc, K, a), Rb = dense(enc, K, b), P = dense(enc, K, {0.0, 0.0});
    const Md RopeD = dense(nd_rope_encoder(omega, RotaryLayout::half_split), K, sub(b, a));
    EXPECT_LE((Ra.transpose() * Rb - P.transpose() * RopeD * P).cwiseAbs().maxCoeff(), 1e-12);
    // Logits: shifting both positions by the same vector changes nothing.
    const Tensor q = testing::randn({1, 1, 1, K}, rng), k = testing::randn({1, 1, 1, K}, rng);
    const double l0 = logit(enc, q, k, a, b);
    const double l1 = logit(enc, q, k, {a[0] + 17.3, a[1] - 4.1}, {b[0] + 17.3, b[1] - 4.1});
    EXPECT_NEAR(l0, l1, 1e-12 * (1 + std::fabs(l0)));
    EXPECT_GT(std::fabs(l0 - logit(enc, q, k, a, {b[0] + 1, b[1]})), 1e-3);  // and r does matter
    const Tensor z = testing::randn({2, 3, 2, K}, rng), pos = testing::randn({2, 3, C}, rng, 5.0);
    Tensor y = Tensor::nans({2, 3, 2, K});
    cayley_string_forward({z.view(), pos.view(), omega.view(), A.view()}, impl, y.view());
    check_separable(enc, z, pos, y);
  }
}

// ---------------------------------------------------------------------------------------------
// Circulant-STRING.

struct CircCase {
  Tensor z, pos, c;
  CirculantStringParams params() const { return {z.view(), pos.view(), c.view()}; }
};
CircCase circ_case(std::mt19937_64& rng, std::int64_t B, std::int64_t T, std::int64_t H,
                   std::int64_t K, std::int64_t C, bool per_head, DType dtype = DType::float64,
                   double pos_std = 2.0) {
  CircCase c;
  c.z = testing::randn({B, T, H, K}, rng, 1.0, dtype);
  c.pos = testing::randn({B, T, C}, rng, pos_std, dtype);
  c.c = per_head ? testing::randn({H, C, K}, rng, 0.5, dtype)
                 : testing::randn({C, K}, rng, 0.5, dtype);
  return c;
}
struct CircOut {
  Tensor y, dz, dpos, dc;
};
CircOut run_circ(const CircCase& c, Impl impl, const Tensor& dy, DType out = DType::float64) {
  const auto& s = c.z.shape();
  CircOut o;
  o.y = Tensor::nans(s, out);
  circulant_string_forward(c.params(), impl, o.y.view());
  o.dz = Tensor::nans(s, out);
  o.dpos = Tensor::nans(c.pos.shape(), out);
  o.dc = Tensor::nans(c.c.shape(), out);
  circulant_string_backward(c.params(), impl, dy.view(), {o.dz.view(), o.dpos.view(), o.dc.view()});
  return o;
}
Encoder circ_encoder(const Tensor& c, Impl impl = kFast) {
  return [&c, impl](const Tensor& z, const Tensor& pos, Tensor& y) {
    circulant_string_forward({z.view(), pos.view(), c.view()}, impl, y.view());
  };
}

// The dense generator L_k = C_k − C_kᵀ, C_k circulant with first column c_k: (C)_{nj} = c[n − j].
Md dense_generator(const Tensor& c, std::int64_t k, std::int64_t K) {
  Md Cm(K, K);
  for (std::int64_t n = 0; n < K; ++n)
    for (std::int64_t j = 0; j < K; ++j) Cm(n, j) = c.at(k * K + ((n - j) % K + K) % K);
  return Cm - Cm.transpose();
}

TEST(CirculantString, KernelMatchesReference) {
  std::mt19937_64 rng(8);
  for (DType dtype : {DType::float64, DType::float32})
    for (bool per_head : {false, true})
      for (std::int64_t K : {1, 2, 5, 6, 7, 8, 12, 16}) {  // odd, 2 mod 4, 0 mod 4, trivial
        SCOPED_TRACE(std::string(to_string(dtype)) + (per_head ? " per head K=" : " shared K=") +
                     std::to_string(K));
        // Adversarial: positions in the hundreds (angles of thousands of radians).
        const CircCase c = circ_case(rng, 2, 5, 3, K, 3, per_head, dtype, 200.0);
        const Tensor dy = testing::randn(c.z.shape(), rng, 1.0, dtype);
        const CircOut ref = run_circ(c, Impl::reference, dy);
        const CircOut fast = run_circ(c, kFast, dy, dtype);
        // The reference's O(K²) DFT and the FFT round differently on angles of ~10³ rad.
        const double tol = dtype == DType::float32 ? 2e-4 : 1e-10;
        PHASOR_EXPECT_CLOSE(fast.y, ref.y, tol, "y");
        PHASOR_EXPECT_CLOSE(fast.dz, ref.dz, tol, "dz");
        PHASOR_EXPECT_CLOSE(fast.dpos, ref.dpos, tol, "d_positions");
        PHASOR_EXPECT_CLOSE(fast.dc, ref.dc, tol, "dc");
        const CircOut rec = run_circ(c, Impl::recurrent, dy, dtype);
        EXPECT_TRUE(rec.y.bit_equal(fast.y));
        EXPECT_TRUE(rec.dc.bit_equal(fast.dc));
      }
}

TEST(CirculantString, FiniteDifferences) {
  std::mt19937_64 rng(9);
  for (std::int64_t K : {5, 6, 8})
    for (bool per_head : {false, true})
      for (Impl impl : {Impl::reference, kFast}) {
        SCOPED_TRACE(std::string(to_string(impl)) + " K=" + std::to_string(K));
        CircCase c = circ_case(rng, 1, 3, 2, K, 2, per_head);
        const Tensor dy = testing::randn(c.z.shape(), rng);
        const CircOut o = run_circ(c, impl, dy);
        auto loss = [&] {
          Tensor y = Tensor::nans(c.z.shape());
          circulant_string_forward(c.params(), impl, y.view());
          return testing::dot(y, dy);
        };
        PHASOR_EXPECT_GRADIENT(o.dz, c.z, loss, 1e-7, "dz");
        PHASOR_EXPECT_GRADIENT(o.dpos, c.pos, loss, 1e-7, "d_positions");
        PHASOR_EXPECT_GRADIENT(o.dc, c.c, loss, 1e-7, "dc");
      }
}

// The FFT path against exp(Σ_k r_k L_k) by Eigen's dense matrix exponential, odd K included;
// orthogonality, det = +1, the exact group law and commuting generators.
TEST(CirculantString, MatchesDenseExpmAndGroupLaws) {
  std::mt19937_64 rng(10);
  for (std::int64_t K : {5, 7, 8, 9, 16})
    for (Impl impl : {kFast, Impl::reference}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " " + to_string(impl));
      const std::int64_t C = 3;
      const Tensor c = testing::randn({C, K}, rng, 0.7);
      const Encoder enc = circ_encoder(c, impl);
      const std::vector<double> r = {1.3, -0.4, 2.2};
      Md L = Md::Zero(K, K);
      for (std::int64_t k = 0; k < C; ++k)
        L += r[static_cast<std::size_t>(k)] * dense_generator(c, k, K);
      const Md expL = testing::matrix_exp(L);
      EXPECT_LE((dense(enc, K, r) - expL).cwiseAbs().maxCoeff(), 1e-12) << "FFT vs dense expm";
      const std::vector<double> a = {0.5, 2.0, -1.0}, b = {-3.0, 0.25, 4.5};
      EXPECT_LE(check_rotation_laws(enc, K, a, b), 1e-12) << "R(a)ᵀR(b) = R(b − a)";
      for (std::int64_t i = 0; i < C; ++i)
        for (std::int64_t j = 0; j < C; ++j) {
          const Md Li = dense_generator(c, i, K), Lj = dense_generator(c, j, K);
          EXPECT_LE((Li * Lj - Lj * Li).cwiseAbs().maxCoeff(), 1e-12) << "[L_i, L_j] = 0";
          EXPECT_LE((Li + Li.transpose()).cwiseAbs().maxCoeff(), 0.0) << "L skew";
        }
      // Through the op: R(r) = R(r_1 e_1) R(r_2 e_2) R(r_3 e_3) in any order (commuting).
      const Md R1 = dense(enc, K, {r[0], 0, 0}), R2 = dense(enc, K, {0, r[1], 0}),
               R3 = dense(enc, K, {0, 0, r[2]});
      EXPECT_LE((R3 * R1 * R2 - expL).cwiseAbs().maxCoeff(), 1e-12);
      EXPECT_LE((R1 * R2 - R2 * R1).cwiseAbs().maxCoeff(), 1e-12);
      const Tensor q = testing::randn({1, 1, 1, K}, rng), k = testing::randn({1, 1, 1, K}, rng);
      const double l0 = logit(enc, q, k, a, b);
      const double l1 =
          logit(enc, q, k, {a[0] + 9, a[1] - 3, a[2] + 1}, {b[0] + 9, b[1] - 3, b[2] + 1});
      EXPECT_NEAR(l0, l1, 1e-12 * (1 + std::fabs(l0)));
      const Tensor z = testing::randn({2, 3, 2, K}, rng), pos = testing::randn({2, 3, C}, rng, 5.0);
      Tensor y = Tensor::nans({2, 3, 2, K});
      enc(z, pos, y);
      check_separable(enc, z, pos, y);
    }
}

// Paper typo (appendix A, eq. 33): it factorises a circulant as C = DFT · diag(DFT c) · DFT⁻¹.
// With F the DFT matrix (F_{mn} = e^{−2πi mn/K}) and c the first column, the correct
// diagonalisation is C = F⁻¹ diag(F c) F; the printed order gives the transposed circulant
// (F diag(F c) F⁻¹ = Cᵀ), which differs from C unless C is symmetric.
TEST(CirculantString, PaperFactorisationOrder) {
  std::mt19937_64 rng(11);
  const std::int64_t K = 7;
  const Tensor c = testing::randn({1, K}, rng);
  using Mc = Eigen::MatrixXcd;
  Mc F(K, K);
  for (std::int64_t m = 0; m < K; ++m)
    for (std::int64_t n = 0; n < K; ++n)
      F(m, n) = std::polar(1.0, -2.0 * kPi * double((m * n) % K) / double(K));
  Eigen::VectorXcd cv(K);
  for (std::int64_t j = 0; j < K; ++j) cv(j) = c.at(j);
  const Eigen::VectorXcd Fc = F * cv;
  Md Cm(K, K);
  for (std::int64_t n = 0; n < K; ++n)
    for (std::int64_t j = 0; j < K; ++j) Cm(n, j) = c.at(((n - j) % K + K) % K);
  const Mc correct = F.inverse() * Fc.asDiagonal() * F;
  const Mc printed = F * Fc.asDiagonal() * F.inverse();
  EXPECT_LE((correct - Cm.cast<std::complex<double>>()).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_GT((printed - Cm.cast<std::complex<double>>()).cwiseAbs().maxCoeff(), 0.1);
  EXPECT_LE((printed - Md(Cm.transpose()).cast<std::complex<double>>()).cwiseAbs().maxCoeff(),
            1e-12);
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(StringRotation, Errors) {
  std::mt19937_64 rng(12);
  using testing::expect_error;
  // N-d RoPE angles.
  const Tensor pos = testing::randn({2, 3, 2}, rng), w = testing::randn({2, 4}, rng);
  Tensor th = Tensor::nans({2, 3, 4});
  expect_error(
      [&] {
        nd_rope_angles_forward(pos.view(), testing::randn({3, 4}, rng).view(), kFast, th.view());
      },
      {"nd_rope_angles", "omega", "C (as positions)"});
  expect_error(
      [&] {
        nd_rope_angles_forward(pos.view(), testing::randn({4}, rng).view(), kFast, th.view());
      },
      {"nd_rope_angles", "omega"});
  expect_error(
      [&] {
        nd_rope_angles_forward(pos.view(), w.view(), Impl::reference,
                               Tensor::nans({2, 3, 5}).view());
      },
      {"nd_rope_angles_reference", "theta"});
  {
    Tensor buf = Tensor::nans({2 * 3 * 4});
    const TensorView bad =
        TensorView::strided(buf.view().data, DType::float64, {2, 3, 4}, {12, 0, 1});
    expect_error([&] { nd_rope_angles_forward(pos.view(), w.view(), kFast, bad); },
                 {"nd_rope_angles", "theta", "zero"});
  }
  expect_error(
      [&] {
        nd_rope_axis_split_frequencies(2, 7, 100.0, Tensor::nans({2, 3}).view());
      },
      {"nd_rope_axis_split_frequencies", "head_dim"});
  // Cayley.
  CayleyCase c = cayley_case(rng, 1, 2, 2, 6, 2, false);
  Tensor y = Tensor::nans({1, 2, 2, 6});
  {
    CayleyCase odd = cayley_case(rng, 1, 2, 2, 5, 2, false);
    odd.omega = testing::randn({2, 2}, rng);
    Tensor yo = Tensor::nans({1, 2, 2, 5});
    expect_error([&] { cayley_string_forward(odd.params(), kFast, yo.view()); },
                 {"cayley_string", "'z'", "even"});
  }
  {
    CayleyCase bad = c;
    bad.A = testing::randn({6, 5}, rng);
    expect_error([&] { cayley_string_forward(bad.params(), kFast, y.view()); },
                 {"cayley_string", "generator", "K"});
    bad = c;
    bad.A = testing::randn({3, 6, 6}, rng);
    expect_error([&] { cayley_string_forward(bad.params(), kFast, y.view()); },
                 {"cayley_string", "generator", "H"});
    bad = c;
    bad.pos = testing::randn({2, 2, 2}, rng);
    expect_error([&] { cayley_string_forward(bad.params(), Impl::reference, y.view()); },
                 {"cayley_string_reference", "positions", "B"});
    bad = c;
    bad.omega = testing::randn({2, 4}, rng);
    expect_error([&] { cayley_string_forward(bad.params(), kFast, y.view()); },
                 {"cayley_string", "omega", "K/2"});
    Tensor dA = Tensor::nans({5, 5});
    expect_error(
        [&] {
          cayley_string_backward(c.params(), kFast, y.view(), {{}, {}, {}, dA.view()});
        },
        {"cayley_string", "d_generator"});
  }
  // Circulant.
  CircCase cc = circ_case(rng, 1, 2, 2, 5, 2, true);
  Tensor yc = Tensor::nans({1, 2, 2, 5});
  {
    CircCase bad = cc;
    bad.c = testing::randn({2, 2, 4}, rng);
    expect_error([&] { circulant_string_forward(bad.params(), kFast, yc.view()); },
                 {"circulant_string", "'c'", "K"});
    bad = cc;
    bad.z = testing::randn({1, 2, 2, 0}, rng);
    Tensor y0 = Tensor::nans({1, 2, 2, 0});
    expect_error([&] { circulant_string_forward(bad.params(), kFast, y0.view()); },
                 {"circulant_string", "'z'", "K ≥ 1"});
    expect_error(
        [&] {
          circulant_string_forward(cc.params(), kFast, Tensor::nans({1, 2, 2, 6}).view());
        },
        {"circulant_string", "'y'"});
    Tensor dc = Tensor::nans({2, 3, 5});
    expect_error(
        [&] {
          circulant_string_backward(cc.params(), kFast, yc.view(), {{}, {}, dc.view()});
        },
        {"circulant_string", "dc"});
  }
}

}  // namespace
}  // namespace phasor
