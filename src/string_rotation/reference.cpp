// STRING ops: the float64 reference, plain loops straight from the equations of
// phasor/string_rotation.h (labels (A1)–(A3) there) and the paper (../shared/papers/string.txt).
// The tests trust these; the optimized kernels (kernels.cpp) are checked against them.
//   Cayley-STRING:    one FullPivLU of I + S per head (float64), y = RoPE(r) (I − S) w,
//                     with the rotation by phasor's reference apply_rotary.
//   Circulant-STRING: the eigendecomposition of Theorem 3.5 with a naive O(K²) DFT per token,
//                     straight from ℓ = Σ_c r_c (c_c − rev c_c) (the first column of L(r)), and a
//                     backward derived independently of the optimized one (through ℓ, not θ).
#include "common/eigen.h"  // first: see there

#include <Eigen/Dense>
#include <cmath>
#include <complex>
#include <vector>

#include "rotary/kernels.h"
#include "string_rotation/kernels.h"

namespace phasor::detail::string_rotation {
namespace {

using Cd = std::complex<double>;
constexpr double kPi = 3.14159265358979323846;

// An owning float64 scratch tensor.
struct Buffer {
  std::vector<double> data;
  TensorView view;
  Buffer(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d)
      : data(static_cast<std::size_t>(a * b * c * d), 0.0),
        view(TensorView::of(data.data(), {a, b, c, d})) {}
};

Eigen::MatrixXd skew(const TensorView& generator, std::int64_t h) {
  const std::int64_t K = generator.size(1);
  const std::int64_t g = generator.size(0) == 1 ? 0 : h;
  Eigen::MatrixXd S(K, K);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < K; ++j)
      S(i, j) = get(generator, offset_of(generator, g, i, j)) -
                get(generator, offset_of(generator, g, j, i));
  return S;
}

// θ for the rotation of [B, T, H, ·] from the normalised angles [B, T, Hw, R].
TensorView theta_for_heads(const Buffer& theta, std::int64_t H) {
  return theta.view.size(2) == 1 ? broadcast_heads(theta.view, H) : theta.view;
}

}  // namespace

// (A1) θ[b, t, h, i] = Σ_c r[b, t, c] ω[h, c, i].
void reference_angles_forward(const TensorView& positions, const TensorView& omega,
                              const TensorView& theta) {
  const std::int64_t C = positions.size(2), R = omega.size(2);
  for (std::int64_t b = 0; b < theta.size(0); ++b)
    for (std::int64_t t = 0; t < theta.size(1); ++t)
      for (std::int64_t h = 0; h < theta.size(2); ++h)
        for (std::int64_t i = 0; i < R; ++i) {
          double s = 0;
          for (std::int64_t c = 0; c < C; ++c)
            s += get(positions, offset_of(positions, b, t, c)) *
                 get(omega, offset_of(omega, omega.size(0) == 1 ? 0 : h, c, i));
          put(theta, offset_of(theta, b, t, h, i), s);
        }
}

// (A2), (A3).
void reference_angles_backward(const TensorView& positions, const TensorView& omega,
                               const TensorView& d_theta, const TensorView& d_positions,
                               const TensorView& d_omega) {
  const std::int64_t B = d_theta.size(0), T = d_theta.size(1), Ht = d_theta.size(2),
                     C = positions.size(2), R = omega.size(2), Hw = omega.size(0);
  std::vector<double> dw(static_cast<std::size_t>(Hw * C * R), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t c = 0; c < C; ++c) {
        double dr = 0;
        const double r = get(positions, offset_of(positions, b, t, c));
        for (std::int64_t h = 0; h < Ht; ++h) {
          const std::int64_t hw = Hw == 1 ? 0 : h;
          for (std::int64_t i = 0; i < R; ++i) {
            const double dth = get(d_theta, offset_of(d_theta, b, t, h, i));
            dr += dth * get(omega, offset_of(omega, hw, c, i));
            dw[static_cast<std::size_t>((hw * C + c) * R + i)] += dth * r;
          }
        }
        if (d_positions.defined()) put(d_positions, offset_of(d_positions, b, t, c), dr);
      }
  if (d_omega.defined())
    for (std::int64_t h = 0; h < Hw; ++h)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t i = 0; i < R; ++i)
          put(d_omega, offset_of(d_omega, h, c, i),
              dw[static_cast<std::size_t>((h * C + c) * R + i)]);
}

// ---------------------------------------------------------------------------------------------
// Cayley-STRING (paper eq. 10): u = (I − S)(I + S)⁻¹ z, y = RoPE(θ) u.

namespace {
// w = (I + S)⁻¹ z and u = (I − S) w for every token, [B, T, H, K] float64.
void cayley_solve(const CayleyProblem& p, Buffer& w, Buffer& u) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3);
  for (std::int64_t h = 0; h < H; ++h) {
    const Eigen::MatrixXd S = skew(p.generator, h);
    const Eigen::MatrixXd I = Eigen::MatrixXd::Identity(K, K);
    const Eigen::FullPivLU<Eigen::MatrixXd> lu(I + S);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        Eigen::VectorXd zt(K);
        for (std::int64_t k = 0; k < K; ++k) zt(k) = get(p.z, offset_of(p.z, b, t, h, k));
        const Eigen::VectorXd wt = lu.solve(zt);
        const Eigen::VectorXd ut = (I - S) * wt;
        for (std::int64_t k = 0; k < K; ++k) {
          put(w.view, offset_of(w.view, b, t, h, k), wt(k));
          put(u.view, offset_of(u.view, b, t, h, k), ut(k));
        }
      }
  }
}
}  // namespace

void reference_cayley_forward(const CayleyProblem& p, const TensorView& y) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3);
  Buffer w(B, T, H, K), u(B, T, H, K), theta(B, T, p.omega.size(0), K / 2);
  cayley_solve(p, w, u);
  reference_angles_forward(p.positions, p.omega, theta.view);
  rotary::reference_apply_forward(
      rotary::ApplyProblem::of(u.view, theta_for_heads(theta, H), p.layout), y);
}

void reference_cayley_backward(const CayleyProblem& p, const TensorView& dy,
                               const CayleyStringGrads& grads) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3);
  Buffer w(B, T, H, K), u(B, T, H, K), theta(B, T, p.omega.size(0), K / 2);
  cayley_solve(p, w, u);
  reference_angles_forward(p.positions, p.omega, theta.view);
  // du = RoPE(θ)ᵀ dy and dθ (per head).
  Buffer du(B, T, H, K), dtheta(B, T, H, K / 2);
  rotary::reference_apply_backward(
      rotary::ApplyProblem::of(u.view, theta_for_heads(theta, H), p.layout), dy, du.view,
      dtheta.view);
  reference_angles_backward(p.positions, p.omega, dtheta.view, grads.d_positions, grads.d_omega);
  // dw = (I − S)ᵀ du, dz = (I + S)⁻ᵀ dw, G = ∂L/∂S = −Σ (du + dz) wᵀ, dA = G − Gᵀ.
  const std::int64_t Ha = p.generator.size(0);
  std::vector<Eigen::MatrixXd> G(static_cast<std::size_t>(Ha), Eigen::MatrixXd::Zero(K, K));
  for (std::int64_t h = 0; h < H; ++h) {
    const Eigen::MatrixXd S = skew(p.generator, h);
    const Eigen::MatrixXd I = Eigen::MatrixXd::Identity(K, K);
    const Eigen::FullPivLU<Eigen::MatrixXd> lu_t((I + S).transpose());
    Eigen::MatrixXd& Gh = G[static_cast<std::size_t>(Ha == 1 ? 0 : h)];
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        Eigen::VectorXd dut(K), wt(K);
        for (std::int64_t k = 0; k < K; ++k) {
          dut(k) = get(du.view, offset_of(du.view, b, t, h, k));
          wt(k) = get(w.view, offset_of(w.view, b, t, h, k));
        }
        const Eigen::VectorXd dwt = (I - S).transpose() * dut;
        const Eigen::VectorXd dzt = lu_t.solve(dwt);
        Gh -= (dut + dzt) * wt.transpose();
        if (grads.dz.defined())
          for (std::int64_t k = 0; k < K; ++k)
            put(grads.dz, offset_of(grads.dz, b, t, h, k), dzt(k));
      }
  }
  if (grads.d_generator.defined())
    for (std::int64_t h = 0; h < Ha; ++h) {
      const Eigen::MatrixXd& Gh = G[static_cast<std::size_t>(h)];
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < K; ++j)
          put(grads.d_generator, offset_of(grads.d_generator, h, i, j), Gh(i, j) - Gh(j, i));
    }
}

// ---------------------------------------------------------------------------------------------
// Circulant-STRING (paper Theorem 3.5, proof in appendix A, with the factorisation corrected to
// C = F⁻¹ diag(F c) F for the DFT matrix F and c the first column).

namespace {
// e^{−2πi n/K} for the integer n (reduced mod K first, so large j·m stay exact).
Cd twiddle(std::int64_t n, std::int64_t K) {
  const std::int64_t r = ((n % K) + K) % K;
  const double a = -2.0 * kPi * static_cast<double>(r) / static_cast<double>(K);
  return {std::cos(a), std::sin(a)};
}
std::vector<Cd> dft(const std::vector<Cd>& x) {
  const auto K = static_cast<std::int64_t>(x.size());
  std::vector<Cd> X(x.size());
  for (std::int64_t m = 0; m < K; ++m) {
    Cd s = 0;
    for (std::int64_t n = 0; n < K; ++n) s += x[static_cast<std::size_t>(n)] * twiddle(m * n, K);
    X[static_cast<std::size_t>(m)] = s;
  }
  return X;
}
std::vector<Cd> idft(const std::vector<Cd>& X) {
  const auto K = static_cast<std::int64_t>(X.size());
  std::vector<Cd> x(X.size());
  for (std::int64_t n = 0; n < K; ++n) {
    Cd s = 0;
    for (std::int64_t m = 0; m < K; ++m) s += X[static_cast<std::size_t>(m)] * twiddle(-m * n, K);
    x[static_cast<std::size_t>(n)] = s / static_cast<double>(K);
  }
  return x;
}
double c_at(const CirculantProblem& p, std::int64_t h, std::int64_t c, std::int64_t j) {
  const std::int64_t K = p.c.size(2);
  return get(p.c, offset_of(p.c, p.c.size(0) == 1 ? 0 : h, c, ((j % K) + K) % K));
}
// ℓ = first column of L(r) = Σ_c r_c (C_c − C_cᵀ): (C_c)_{n0} = c_c[n], (C_cᵀ)_{n0} = c_c[−n].
std::vector<Cd> generator_column(const CirculantProblem& p, std::int64_t b, std::int64_t t,
                                 std::int64_t h) {
  const std::int64_t K = p.z.size(3), C = p.positions.size(2);
  std::vector<Cd> l(static_cast<std::size_t>(K), 0.0);
  for (std::int64_t c = 0; c < C; ++c) {
    const double r = get(p.positions, offset_of(p.positions, b, t, c));
    for (std::int64_t n = 0; n < K; ++n)
      l[static_cast<std::size_t>(n)] += r * (c_at(p, h, c, n) - c_at(p, h, c, -n));
  }
  return l;
}
std::vector<Cd> row(const TensorView& x, std::int64_t b, std::int64_t t, std::int64_t h) {
  std::vector<Cd> v(static_cast<std::size_t>(x.size(3)));
  for (std::int64_t k = 0; k < x.size(3); ++k)
    v[static_cast<std::size_t>(k)] = get(x, offset_of(x, b, t, h, k));
  return v;
}
}  // namespace

// y = F⁻¹ diag(exp(F ℓ)) F z: the eigenvalues of the circulant L are λ = F ℓ (paper eq. 35).
void reference_circulant_forward(const CirculantProblem& p, const TensorView& y) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::vector<Cd> lambda = dft(generator_column(p, b, t, h));
        std::vector<Cd> Z = dft(row(p.z, b, t, h));
        for (std::int64_t m = 0; m < K; ++m)
          Z[static_cast<std::size_t>(m)] *= std::exp(lambda[static_cast<std::size_t>(m)]);
        const std::vector<Cd> yt = idft(Z);
        for (std::int64_t k = 0; k < K; ++k)
          put(y, offset_of(y, b, t, h, k), yt[static_cast<std::size_t>(k)].real());
      }
}

// With y = Re F⁻¹ (e^{λ} ⊙ F z), λ = F ℓ (an analytic function of the real ℓ and z):
//   dz = Re F⁻¹ (e^{−λ} ⊙ F dy)            (exp(L)ᵀ = exp(−L), conj-symmetric spectra)
//   dℓ_j = Re (1/K) Σ_m conj(F dy)_m e^{λ_m} (F z)_m e^{−2πi jm/K}
//   dr_c = Σ_j dℓ_j (c_c[j] − c_c[−j]),  dc_c[j] = Σ_tokens r_c (dℓ_j − dℓ_{−j}).
void reference_circulant_backward(const CirculantProblem& p, const TensorView& dy,
                                  const CirculantStringGrads& grads) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3),
                     C = p.positions.size(2), Hc = p.c.size(0);
  std::vector<double> dc(static_cast<std::size_t>(Hc * C * K), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      std::vector<double> dr(static_cast<std::size_t>(C), 0.0);
      for (std::int64_t h = 0; h < H; ++h) {
        const std::vector<Cd> lambda = dft(generator_column(p, b, t, h));
        const std::vector<Cd> Z = dft(row(p.z, b, t, h));
        std::vector<Cd> DY = dft(row(dy, b, t, h));
        std::vector<Cd> back(static_cast<std::size_t>(K)), spec(static_cast<std::size_t>(K));
        for (std::int64_t m = 0; m < K; ++m) {
          const auto mi = static_cast<std::size_t>(m);
          back[mi] = std::exp(-lambda[mi]) * DY[mi];
          spec[mi] = std::conj(DY[mi]) * std::exp(lambda[mi]) * Z[mi];
        }
        if (grads.dz.defined()) {
          const std::vector<Cd> dzt = idft(back);
          for (std::int64_t k = 0; k < K; ++k)
            put(grads.dz, offset_of(grads.dz, b, t, h, k), dzt[static_cast<std::size_t>(k)].real());
        }
        std::vector<double> dl(static_cast<std::size_t>(K));
        for (std::int64_t j = 0; j < K; ++j) {
          Cd s = 0;
          for (std::int64_t m = 0; m < K; ++m)
            s += spec[static_cast<std::size_t>(m)] * twiddle(j * m, K);
          dl[static_cast<std::size_t>(j)] = s.real() / static_cast<double>(K);
        }
        const std::int64_t hc = Hc == 1 ? 0 : h;
        for (std::int64_t c = 0; c < C; ++c) {
          const double r = get(p.positions, offset_of(p.positions, b, t, c));
          for (std::int64_t j = 0; j < K; ++j) {
            const double dlj = dl[static_cast<std::size_t>(j)];
            dr[static_cast<std::size_t>(c)] += dlj * (c_at(p, h, c, j) - c_at(p, h, c, -j));
            dc[static_cast<std::size_t>((hc * C + c) * K + j)] +=
                r * (dlj - dl[static_cast<std::size_t>((K - j) % K)]);
          }
        }
      }
      if (grads.d_positions.defined())
        for (std::int64_t c = 0; c < C; ++c)
          put(grads.d_positions, offset_of(grads.d_positions, b, t, c),
              dr[static_cast<std::size_t>(c)]);
    }
  if (grads.dc.defined())
    for (std::int64_t h = 0; h < Hc; ++h)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t j = 0; j < K; ++j)
          put(grads.dc, offset_of(grads.dc, h, c, j),
              dc[static_cast<std::size_t>((h * C + c) * K + j)]);
}

}  // namespace phasor::detail::string_rotation
