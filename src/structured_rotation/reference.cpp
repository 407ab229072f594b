// Structured rotation: the float64 reference, plain loops over tokens straight from the paper's
// equations: z' = P z (eq. 19), u_p = U_pᵀ z' for each plane p, θ_p = Σ_k λ_{k,p} r_k (Lemma 2),
// w_p = R2(θ_p) u_p, y = z' + Σ_p U_p (w_p − u_p) (eq. 11 with the null block the identity).
#include <cmath>
#include <vector>

#include "structured_rotation/kernels.h"

namespace phasor::detail::structured_rotation {
namespace {

// The operands every token uses, read once as float64.
struct Operands {
  std::int64_t K = 0, C = 0, m = 0;
  std::vector<double> U, lambda, P;  // U [K, 2m], Λ [C, m], P [K, K] (empty when absent)
  double u(std::int64_t i, std::int64_t j) const {
    return U[static_cast<std::size_t>(i * 2 * m + j)];
  }
  double lam(std::int64_t k, std::int64_t q) const {
    return lambda[static_cast<std::size_t>(k * m + q)];
  }
  double post(std::int64_t i, std::int64_t j) const {
    return P[static_cast<std::size_t>(i * K + j)];
  }
};

Operands operands(const ApplyProblem& p) {
  Operands o;
  o.K = p.K;
  o.C = p.C;
  o.m = p.m;
  for (std::int64_t i = 0; i < p.K; ++i)
    for (std::int64_t j = 0; j < 2 * p.m; ++j)
      o.U.push_back(get(p.basis, offset_of(p.basis, i, j)));
  for (std::int64_t k = 0; k < p.C; ++k)
    for (std::int64_t q = 0; q < p.m; ++q)
      o.lambda.push_back(get(p.coefficients, offset_of(p.coefficients, k, q)));
  if (p.post_rotation.defined())
    for (std::int64_t i = 0; i < p.K; ++i)
      for (std::int64_t j = 0; j < p.K; ++j)
        o.P.push_back(get(p.post_rotation, offset_of(p.post_rotation, i, j)));
  return o;
}

// One token's state: z' = P z, the plane coordinates u, their angles θ and rotations w.
struct Token {
  std::vector<double> z, zp, r, theta, ua, ub, wa, wb;
};

Token token(const ApplyProblem& p, const Operands& o, std::int64_t b, std::int64_t t,
            std::int64_t h) {
  Token s;
  for (std::int64_t i = 0; i < p.K; ++i) s.z.push_back(get(p.x, offset_of(p.x, b, t, h, i)));
  for (std::int64_t k = 0; k < p.C; ++k)
    s.r.push_back(get(p.positions, offset_of(p.positions, b, t, h, k)));
  s.zp = s.z;
  if (!o.P.empty())
    for (std::int64_t i = 0; i < p.K; ++i) {
      double acc = 0;
      for (std::int64_t j = 0; j < p.K; ++j) acc += o.post(i, j) * s.z[static_cast<std::size_t>(j)];
      s.zp[static_cast<std::size_t>(i)] = acc;
    }
  for (std::int64_t q = 0; q < p.m; ++q) {
    double th = 0, a = 0, bb = 0;
    for (std::int64_t k = 0; k < p.C; ++k) th += o.lam(k, q) * s.r[static_cast<std::size_t>(k)];
    for (std::int64_t i = 0; i < p.K; ++i) {
      a += o.u(i, 2 * q) * s.zp[static_cast<std::size_t>(i)];
      bb += o.u(i, 2 * q + 1) * s.zp[static_cast<std::size_t>(i)];
    }
    s.theta.push_back(th);
    s.ua.push_back(a);
    s.ub.push_back(bb);
    s.wa.push_back(a * std::cos(th) - bb * std::sin(th));
    s.wb.push_back(a * std::sin(th) + bb * std::cos(th));
  }
  return s;
}

}  // namespace

void reference_forward(const ApplyProblem& p, const TensorView& y) {
  const Operands o = operands(p);
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t t = 0; t < p.T; ++t)
      for (std::int64_t h = 0; h < p.H; ++h) {
        const Token s = token(p, o, b, t, h);  // read before writing: y may be x
        for (std::int64_t i = 0; i < p.K; ++i) {
          double v = s.zp[static_cast<std::size_t>(i)];
          for (std::int64_t q = 0; q < p.m; ++q) {
            const auto Q = static_cast<std::size_t>(q);
            v += o.u(i, 2 * q) * (s.wa[Q] - s.ua[Q]) + o.u(i, 2 * q + 1) * (s.wb[Q] - s.ub[Q]);
          }
          put(y, offset_of(y, b, t, h, i), v);
        }
      }
}

// With g = U_pᵀ dy: dz' = dy + Σ_p U_p (R2(−θ_p) g_p − g_p) (R is orthogonal), dx = Pᵀ dz',
// dθ_p = g_b w_a − g_a w_b (d/dθ R2(θ) u = J R2(θ) u), dr_k = Σ_p λ_{k,p} dθ_p,
// dλ_{k,p} = Σ_tokens r_k dθ_p, dP = Σ_tokens dz' zᵀ.
void reference_backward(const ApplyProblem& p, const TensorView& dy,
                        const StructuredRotationGrads& grads) {
  const Operands o = operands(p);
  std::vector<double> dlam(static_cast<std::size_t>(p.C * p.m), 0.0);
  std::vector<double> dP(static_cast<std::size_t>(p.K * p.K), 0.0);
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t t = 0; t < p.T; ++t)
      for (std::int64_t h = 0; h < p.H; ++h) {
        const Token s = token(p, o, b, t, h);
        std::vector<double> g(static_cast<std::size_t>(p.K));
        for (std::int64_t i = 0; i < p.K; ++i)
          g[static_cast<std::size_t>(i)] = get(dy, offset_of(dy, b, t, h, i));
        std::vector<double> dzp = g, dtheta(static_cast<std::size_t>(p.m));
        for (std::int64_t q = 0; q < p.m; ++q) {
          const auto Q = static_cast<std::size_t>(q);
          double ga = 0, gb = 0;
          for (std::int64_t i = 0; i < p.K; ++i) {
            ga += o.u(i, 2 * q) * g[static_cast<std::size_t>(i)];
            gb += o.u(i, 2 * q + 1) * g[static_cast<std::size_t>(i)];
          }
          dtheta[Q] = gb * s.wa[Q] - ga * s.wb[Q];
          const double c = std::cos(s.theta[Q]), sn = std::sin(s.theta[Q]);
          const double ra = ga * c + gb * sn, rb = -ga * sn + gb * c;  // R2(−θ) g
          for (std::int64_t i = 0; i < p.K; ++i)
            dzp[static_cast<std::size_t>(i)] +=
                o.u(i, 2 * q) * (ra - ga) + o.u(i, 2 * q + 1) * (rb - gb);
        }
        if (grads.dx.defined())
          for (std::int64_t j = 0; j < p.K; ++j) {
            double v = dzp[static_cast<std::size_t>(j)];
            if (!o.P.empty()) {
              v = 0;
              for (std::int64_t i = 0; i < p.K; ++i)
                v += o.post(i, j) * dzp[static_cast<std::size_t>(i)];
            }
            put(grads.dx, offset_of(grads.dx, b, t, h, j), v);
          }
        if (grads.d_positions.defined())
          for (std::int64_t k = 0; k < p.C; ++k) {
            double v = 0;
            for (std::int64_t q = 0; q < p.m; ++q)
              v += o.lam(k, q) * dtheta[static_cast<std::size_t>(q)];
            put(grads.d_positions, offset_of(grads.d_positions, b, t, h, k), v);
          }
        for (std::int64_t k = 0; k < p.C; ++k)
          for (std::int64_t q = 0; q < p.m; ++q)
            dlam[static_cast<std::size_t>(k * p.m + q)] +=
                s.r[static_cast<std::size_t>(k)] * dtheta[static_cast<std::size_t>(q)];
        if (!o.P.empty())
          for (std::int64_t i = 0; i < p.K; ++i)
            for (std::int64_t j = 0; j < p.K; ++j)
              dP[static_cast<std::size_t>(i * p.K + j)] +=
                  dzp[static_cast<std::size_t>(i)] * s.z[static_cast<std::size_t>(j)];
      }
  if (grads.d_coefficients.defined())
    for (std::int64_t k = 0; k < p.C; ++k)
      for (std::int64_t q = 0; q < p.m; ++q)
        put(grads.d_coefficients, offset_of(grads.d_coefficients, k, q),
            dlam[static_cast<std::size_t>(k * p.m + q)]);
  if (grads.d_post_rotation.defined())
    for (std::int64_t i = 0; i < p.K; ++i)
      for (std::int64_t j = 0; j < p.K; ++j)
        put(grads.d_post_rotation, offset_of(grads.d_post_rotation, i, j),
            dP[static_cast<std::size_t>(i * p.K + j)]);
}

}  // namespace phasor::detail::structured_rotation
