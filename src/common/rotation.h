// Internal: the RoPE-style rotation fused into the attention kernels (GLA, Gated DeltaNet, FoX).
//
// With angles θ [B, T, H, R] (R = K/2 rotation pairs), q_t and k_t are rotated pair by pair,
//   y_a = x_a cos θ − x_b sin θ,      y_b = x_a sin θ + x_b cos θ,                      (R1)
// right after a kernel loads its rows into owned Eigen storage (slices.h), so the rotated tensors
// never exist in the caller's memory and cost no extra pass over it. The backward takes the
// gradient with respect to the rotated rows, dy, and returns
//   dx_a = dy_a cos θ + dy_b sin θ,   dx_b = −dy_a sin θ + dy_b cos θ    (dx = R(θ)ᵀ dy)   (R2)
//   dθ  += dy_b · y_a − dy_a · y_b      (∂y_a/∂θ = −y_b, ∂y_b/∂θ = y_a)                  (R3)
// q and k share θ_t, so their dθ contributions add up.
//
// cos θ and sin θ are evaluated in float64 and rounded to the compute type: θ may be a running
// phase sum of many thousands of radians, and float32 argument reduction would lose it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/check.h"
#include "common/slices.h"
#include "phasor/common.h"

namespace phasor::detail {

// θ, if given, must be [B, T, H, K/2] with K even. `heads` labels H in the message (e.g.
// "H (q/k heads)").
inline void check_theta(const std::string& op, const TensorView& theta, std::int64_t B,
                        std::int64_t T, std::int64_t H, std::int64_t K, const char* heads = "H",
                        Device device = Device::cpu) {
  if (!theta.defined()) return;
  if (K % 2 != 0)
    fail(op, "theta", "an even head dimension K (rotation pairs) when theta is given",
         "K = " + std::to_string(K));
  check_float_tensor(op, "theta", theta, {{B, "B"}, {T, "T"}, {H, heads}, {K / 2, "K/2"}}, device);
}

// dtheta, if requested, needs theta, must have its shape and must own each of its elements.
inline void check_dtheta(const std::string& op, const TensorView& dtheta, const TensorView& theta,
                         Device device = Device::cpu) {
  if (!dtheta.defined()) return;
  if (!theta.defined())
    fail(op, "dtheta", "theta to be given (dtheta is its gradient)",
         "dtheta requested without theta");
  check_output(
      op, "dtheta", dtheta,
      {{theta.size(0), "B"}, {theta.size(1), "T"}, {theta.size(2), "H"}, {theta.size(3), "K/2"}},
      device);
  // Work items write disjoint (sequence, head) blocks of dθ; a zero stride (e.g. angles broadcast
  // over heads, passed back as the gradient view) would make them race on one element. An empty
  // view has no element to race on (and contiguous empty views do carry zero strides).
  if (dtheta.numel() == 0) return;
  for (int d = 0; d < 4; ++d)
    if (dtheta.size(d) > 1 && dtheta.stride(d) == 0)
      fail(op, "dtheta", "a tensor that owns each element (no zero strides)",
           "stride 0 in dimension " + std::to_string(d) + " of shape " + dtheta.shape_string());
}

// cos θ and sin θ of a run of tokens of one head, rows = tokens, columns = rotation pairs.
template <class S>
struct PairAngles {
  Mat<S> cos, sin;

  // theta [B, T, H, R]: tokens s of head h.
  void load(const TensorView& theta, const Sequence& s, std::int64_t h) {
    if constexpr (std::is_same_v<S, float>) {
      if (theta.dtype != DType::float64) {
        // Eigen's vectorised float sin/cos: within ~1 ulp of the float64 value of cos(θ) for
        // every float θ (it falls back to a full range reduction for huge arguments), and several
        // times faster than scalar float64 calls, which would cost as much as a GLA forward.
        // 16-bit angles are converted to float (exactly) and take the same path.
        Mat<float> angles;
        load_rows(theta, s, h, angles);
        cos = angles.array().cos().matrix();
        sin = angles.array().sin().matrix();
        return;
      }
    }
    Mat<double> angles;
    load_rows(theta, s, h, angles);
    // std::cos / std::sin in float64 (correctly reduced for any argument size), then rounded.
    cos = angles.unaryExpr([](double a) { return static_cast<S>(std::cos(a)); });
    sin = angles.unaryExpr([](double a) { return static_cast<S>(std::sin(a)); });
  }
  std::int64_t rows() const { return cos.rows(); }
};

// Column of the a / b member of pair i in a row of K = 2R values.
inline std::int64_t rotation_pair_a(RotaryLayout layout, std::int64_t i) {
  return layout == RotaryLayout::half_split ? i : 2 * i;
}
inline std::int64_t rotation_pair_b(RotaryLayout layout, std::int64_t i, std::int64_t R) {
  return layout == RotaryLayout::half_split ? i + R : 2 * i + 1;
}

// (R1) in place on the rows [0, x.rows()) of x, which hold the tokens [first, first + x.rows())
// of `angles`. X is any writable Eigen expression (a matrix, a block of rows).
template <class S, class X>
void rotate_rows(X&& x, const PairAngles<S>& angles, RotaryLayout layout, std::int64_t first = 0) {
  const std::int64_t R = angles.cos.cols(), L = x.rows();
  // Nothing to rotate; and Eigen's blocks of an empty matrix offset a null pointer (undefined
  // behaviour, found by UBSan).
  if (L == 0 || R == 0) return;
  if (layout == RotaryLayout::half_split) {  // contiguous halves: vectorised array expressions
    const auto c = angles.cos.middleRows(first, L).array();
    const auto s = angles.sin.middleRows(first, L).array();
    const Mat<S> xa = x.leftCols(R);
    x.leftCols(R) = (xa.array() * c - x.rightCols(R).array() * s).matrix();
    x.rightCols(R) = (xa.array() * s + x.rightCols(R).array() * c).matrix();
    return;
  }
  for (std::int64_t t = 0; t < L; ++t) {
    const S* c = angles.cos.data() + (first + t) * R;
    const S* s = angles.sin.data() + (first + t) * R;
    for (std::int64_t i = 0; i < R; ++i) {
      const S xa = x(t, 2 * i), xb = x(t, 2 * i + 1);
      x(t, 2 * i) = xa * c[i] - xb * s[i];
      x(t, 2 * i + 1) = xa * s[i] + xb * c[i];
    }
  }
}

// (R2) and (R3): dy holds the gradient with respect to the rotated rows y (same tokens as in
// rotate_rows); it is replaced by the gradient with respect to the unrotated rows, and
// dy_b·y_a − dy_a·y_b is added to dtheta (rows × R, same rows as dy).
template <class S, class DY, class Y, class DT>
void unrotate_gradient_rows(DY&& dy, const Y& y, const PairAngles<S>& angles, RotaryLayout layout,
                            DT&& dtheta, std::int64_t first = 0) {
  const std::int64_t R = angles.cos.cols(), L = dy.rows();
  if (L == 0 || R == 0) return;  // nothing to unrotate (see rotate_rows)
  if (layout == RotaryLayout::half_split) {
    const auto c = angles.cos.middleRows(first, L).array();
    const auto s = angles.sin.middleRows(first, L).array();
    const Mat<S> dya = dy.leftCols(R);
    dtheta.array() +=
        dy.rightCols(R).array() * y.leftCols(R).array() - dya.array() * y.rightCols(R).array();
    dy.leftCols(R) = (dya.array() * c + dy.rightCols(R).array() * s).matrix();
    dy.rightCols(R) = (dy.rightCols(R).array() * c - dya.array() * s).matrix();
    return;
  }
  for (std::int64_t t = 0; t < L; ++t) {
    const S* c = angles.cos.data() + (first + t) * R;
    const S* s = angles.sin.data() + (first + t) * R;
    for (std::int64_t i = 0; i < R; ++i) {
      const std::int64_t a = rotation_pair_a(layout, i), b = rotation_pair_b(layout, i, R);
      const S dya = dy(t, a), dyb = dy(t, b);
      dtheta(t, i) += dyb * y(t, a) - dya * y(t, b);
      dy(t, a) = dya * c[i] + dyb * s[i];
      dy(t, b) = dyb * c[i] - dya * s[i];
    }
  }
}

}  // namespace phasor::detail
