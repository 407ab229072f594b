// The last step of Gated DeltaNet's backward on the GPU, shared by the recurrent
// (cuda/gated_delta_rule/recurrent.cu) and the chunk kernels (chunk.cu): dq̃ and dk̂ — the
// gradients with respect to the scaled, normalised, rotated rows, summed by the kernels into
// partials — become dq, dk and dθ. Included by those files inside their anonymous namespace;
// requires simt/simt.h, common/recurrent.h and the op's Problem.
#pragma once

#include <cstdint>

#include "common/recurrent.h"
#include "gated_delta_rule/problem.h"
#include "phasor/gated_delta_rule.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::gdn {
namespace {

using ::phasor::detail::gdn::Problem;

// 1 / sqrt(Σx² + 1e-6) of row (b, t, h) of x, summed in row order.
template <class C>
PHASOR_DEVICE C inverse_norm(const Problem& p, const TensorView& x, std::int64_t b, std::int64_t t,
                             std::int64_t h) {
  C sum = 0;
  for (std::int64_t a = 0; a < p.K; ++a) {
    const C v = simt::load<C>(x, b, t, h, a);
    sum += v * v;
  }
  return C(1) / simt::sqrt(sum + C(1e-6));
}

// Partials of dq̃ and dk̂: [tile][member][B·T][H][K], summed over `tiles` value tiles and
// `members` value heads of the group (in that order: members inside tiles) by finish_qk_kernel.
template <class C>
struct QkPartials {
  simt::Span<C> dq, dk;  // each empty when not needed
  std::int64_t tiles = 1, members = 1;
};

// dq, dk, dθ of one (token, q/k head) row: the partials summed over the tiles and the group's
// value heads, then scale (q), the ℓ2-norm backward in the rotated frame, and the un-rotation,
// as store_qk_grads of src/gated_delta_rule/kernels.h.
template <class C>
PHASOR_GLOBAL void finish_qk_kernel(Problem p, QkPartials<C> parts, GatedDeltaRuleGrads grads) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t BT = p.B * p.T, K = p.K;
  if (e >= BT * p.H) return;
  const std::int64_t h = e % p.H, flat = e / p.H, b = flat / p.T, t = flat % p.T;
  struct Rows {
    TensorView x, dx;
    simt::Span<C> parts;
    C factor, rho, projection;
  };
  Rows rows[2] = {{p.q, grads.dq, parts.dq, static_cast<C>(p.scale), C(1), C(0)},
                  {p.k, grads.dk, parts.dk, C(1), C(1), C(0)}};
  // dq̃ (times scale: dq̂) or dk̂ of row a: value heads, then tiles, in order.
  const auto total = [&](const Rows& x, std::int64_t a) {
    C sum = 0;
    for (std::int64_t tile = 0; tile < parts.tiles; ++tile)
      for (std::int64_t member = 0; member < parts.members; ++member)
        sum += x.parts[(((tile * parts.members + member) * BT + flat) * p.H + h) * K + a];
    return x.factor * sum;
  };
  const auto raw = [&](const Rows& x, std::int64_t a) {  // x̂ before the rotation
    const C v = simt::load<C>(x.x, b, t, h, a);
    return p.l2norm ? v * x.rho : v;
  };
  const auto rotate = [&](const Rows& x, std::int64_t i, C c, C s, C& ya, C& yb) {
    const C xa = raw(x, pair_a(p.rotary_layout, p.K, i)),
            xb = raw(x, pair_b(p.rotary_layout, p.K, i));
    ya = xa * c - xb * s;  // (R1)
    yb = xa * s + xb * c;
  };
  const bool rotated = p.theta.defined();
  for (Rows& x : rows) {
    if (x.parts.size == 0) continue;
    if (p.l2norm) x.rho = inverse_norm<C>(p, x.x, b, t, h);
    if (!p.l2norm || K == 1) continue;
    // The projection x̂·dx̂ of the ℓ2-norm backward, in the rotated frame.
    if (!rotated) {
      for (std::int64_t a = 0; a < K; ++a) x.projection += raw(x, a) * total(x, a);
    } else {
      for (std::int64_t i = 0; i < K / 2; ++i) {
        C c, s, ya, yb;
        angle_of(p.theta, b, t, h, i, c, s);
        rotate(x, i, c, s, ya, yb);
        x.projection += ya * total(x, pair_a(p.rotary_layout, p.K, i));
        x.projection += yb * total(x, pair_b(p.rotary_layout, p.K, i));
      }
    }
  }
  // dx̂ → the gradient of the rows before the normalisation: ρ (dx̂ − x̂ (x̂·dx̂)), ερ³ dx̂ for K = 1.
  const auto norm_backward = [&](const Rows& x, C x_hat, C dx_hat) {
    if (!p.l2norm) return dx_hat;
    if (K == 1) return dx_hat * (C(1e-6) * x.rho * x.rho * x.rho);
    return x.rho * (dx_hat - x.projection * x_hat);
  };
  if (!rotated) {
    for (const Rows& x : rows)
      if (x.dx.defined())
        for (std::int64_t a = 0; a < K; ++a)
          simt::store(x.dx, norm_backward(x, raw(x, a), total(x, a)), b, t, h, a);
    return;
  }
  if (parts.dq.size == 0 && parts.dk.size == 0) return;
  for (std::int64_t i = 0; i < K / 2; ++i) {
    C c, s;
    angle_of(p.theta, b, t, h, i, c, s);
    const std::int64_t ia = pair_a(p.rotary_layout, p.K, i), ib = pair_b(p.rotary_layout, p.K, i);
    C dtheta = 0;  // q's contribution, then k's
    for (const Rows& x : rows) {
      if (x.parts.size == 0) continue;
      C ya, yb;
      rotate(x, i, c, s, ya, yb);
      const C dya = norm_backward(x, ya, total(x, ia)), dyb = norm_backward(x, yb, total(x, ib));
      // (R3) with y = x̂ / ρ, the rotated row before the normalisation; (R2).
      const C y_a = p.l2norm ? ya / x.rho : ya, y_b = p.l2norm ? yb / x.rho : yb;
      dtheta += dyb * y_a - dya * y_b;
      if (x.dx.defined()) {
        simt::store(x.dx, dya * c + dyb * s, b, t, h, ia);
        simt::store(x.dx, dyb * c - dya * s, b, t, h, ib);
      }
    }
    if (grads.dtheta.defined()) simt::store(grads.dtheta, dtheta, b, t, h, i);
  }
}

}  // namespace
}  // namespace phasor::PHASOR_BACKEND::gdn
