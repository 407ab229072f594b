// Internal: the rotation of the float64 reference implementations (GLA, Gated DeltaNet, FoX).
//
// Kept apart from the fast path in rotation.h (vectorised, float cos/sin, angle caching) so the
// references the tests trust stay plain loops straight from the equations (R1)–(R3) there:
//   x'_a = x_a cos θ − x_b sin θ,   x'_b = x_a sin θ + x_b cos θ                          (R1)
//   dx = R(θ)ᵀ dx',   dθ += dx'_b x'_a − dx'_a x'_b                                  (R2, R3)
// Rows are tokens, θ has one column per rotation pair; cos and sin in float64.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/rotation.h"
#include "common/slices.h"
#include "phasor/common.h"

namespace phasor::detail {

// (R1) in place: x ← R(θ) x, row by row.
inline void reference_rotate_rows(Mat<double>& x, const Mat<double>& theta, RotaryLayout layout) {
  const std::int64_t R = theta.cols();
  for (std::int64_t t = 0; t < x.rows(); ++t)
    for (std::int64_t i = 0; i < R; ++i) {
      const std::int64_t a = rotation_pair_a(layout, i), b = rotation_pair_b(layout, i, R);
      const double c = std::cos(theta(t, i)), s = std::sin(theta(t, i));
      const double xa = x(t, a), xb = x(t, b);
      x(t, a) = xa * c - xb * s;
      x(t, b) = xa * s + xb * c;
    }
}

// (R2), (R3) in place: dy, the gradient with respect to the rotated rows y = R(θ) x, becomes the
// gradient with respect to x, and dy_b y_a − dy_a y_b is added to dtheta.
inline void reference_unrotate_gradient_rows(Mat<double>& dy, const Mat<double>& y,
                                             const Mat<double>& theta, RotaryLayout layout,
                                             Mat<double>& dtheta) {
  const std::int64_t R = theta.cols();
  for (std::int64_t t = 0; t < dy.rows(); ++t)
    for (std::int64_t i = 0; i < R; ++i) {
      const std::int64_t a = rotation_pair_a(layout, i), b = rotation_pair_b(layout, i, R);
      const double c = std::cos(theta(t, i)), s = std::sin(theta(t, i));
      const double da = dy(t, a), db = dy(t, b);
      dtheta(t, i) += db * y(t, a) - da * y(t, b);
      dy(t, a) = da * c + db * s;
      dy(t, b) = db * c - da * s;
    }
}

}  // namespace phasor::detail
