// Structured rotation ops: argument validation and dispatch. Every check happens here, before any
// kernel runs, so a bad call never writes to an output.
#include "common/eigen.h"  // first: see there

#include <cmath>
#include <string>

#include "common/check.h"
#include "common/slices.h"
#include "phasor/ops.h"
#include "phasor/structured_rotation.h"
#include "structured_rotation/kernels.h"

namespace phasor {
namespace {

using detail::check_owned_output;

using detail::structured_rotation::ApplyProblem;

// U_act must have orthonormal columns: y = z + U_act (R2 u − u) is R(r) z only then. Loose
// tolerance (float32 bases are accepted); catches a wrong argument, not rounding.
void check_orthonormal_columns(const std::string& op, const char* name, const TensorView& u) {
  if (u.size(1) == 0) return;  // no columns (m = 0): nothing to check
  detail::Mat<double> m;
  detail::slices_impl::load_2d(u, 0, u.size(0), u.stride(0), u.size(1), u.stride(1), m);
  const double dev =
      (m.transpose() * m - detail::Mat<double>::Identity(m.cols(), m.cols())).cwiseAbs().maxCoeff();
  if (!(dev <= 1e-4))
    detail::fail(op, name, "orthonormal columns (|UᵀU − I| ≤ 1e-4)",
                 "max |UᵀU − I| = " + std::to_string(dev));
}

ApplyProblem validate_apply(const std::string& op, const StructuredRotationParams& params) {
  ApplyProblem p;
  detail::check_float_rank(op, "x", params.x, 4, "[B, T, H, K]");
  p.B = params.x.size(0);
  p.T = params.x.size(1);
  p.H = params.x.size(2);
  p.K = params.x.size(3);
  detail::check_float_rank(op, "coefficients", params.coefficients, 2, "[C, m]");
  p.C = params.coefficients.size(0);
  p.m = params.coefficients.size(1);
  if (p.C < 1) detail::fail(op, "coefficients", "at least one generator (C ≥ 1)", "C = 0");
  if (2 * p.m > p.K)
    detail::fail(op, "coefficients",
                 "at most K/2 planes (m ≤ " + std::to_string(p.K / 2) +
                     " for K = " + std::to_string(p.K) + ")",
                 "m = " + std::to_string(p.m));
  detail::check_float_tensor(op, "basis", params.basis,
                             {{p.K, "K (as x)"}, {2 * p.m, "2m (as coefficients)"}});
  detail::check_float_tensor(op, "positions", params.positions,
                             {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.C, "C (as coefficients)"}});
  if (params.post_rotation.defined())
    detail::check_float_tensor(op, "post_rotation", params.post_rotation, {{p.K, "K"}, {p.K, "K"}});
  check_orthonormal_columns(op, "basis", params.basis);
  p.x = params.x;
  p.positions = params.positions;
  p.basis = params.basis;
  p.coefficients = params.coefficients;
  p.post_rotation = params.post_rotation;
  return p;
}

void check_tolerance(const std::string& op, double tol) {
  if (!std::isfinite(tol) || tol <= 0)
    detail::fail(op, "tolerance", "a finite tolerance > 0", std::to_string(tol));
}

}  // namespace

std::int64_t structured_decomposition(const StructuredDecompositionParams& params,
                                      const StructuredDecompositionOutputs& outputs) {
  const std::string op = "structured_decomposition";
  detail::check_float_rank(op, "generators", params.generators, 3, "[C, K, K]");
  const std::int64_t C = params.generators.size(0), K = params.generators.size(1);
  if (C < 1) detail::fail(op, "generators", "at least one generator (C ≥ 1)", "C = 0");
  if (K < 1 || params.generators.size(2) != K)
    detail::fail(op, "generators", "square generators [C, K, K] with K ≥ 1",
                 "shape " + params.generators.shape_string());
  check_tolerance(op, params.tolerance);
  check_owned_output(op, "basis", outputs.basis, {{K, "K"}, {K, "K"}});
  check_owned_output(op, "coefficients", outputs.coefficients, {{C, "C"}, {K / 2, "K/2"}});
  if (outputs.active_projector.defined())
    check_owned_output(op, "active_projector", outputs.active_projector, {{K, "K"}, {K, "K"}});
  if (outputs.null_projector.defined())
    check_owned_output(op, "null_projector", outputs.null_projector, {{K, "K"}, {K, "K"}});
  return detail::structured_rotation::decompose(op, params, outputs);
}

void structured_rotation_forward(const StructuredRotationParams& params, Impl impl,
                                 const TensorView& y) {
  const std::string op = op_name(Op::structured_rotation, impl);
  const ApplyProblem p = validate_apply(op, params);
  check_owned_output(op, "y", y, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (impl == Impl::reference)
    detail::structured_rotation::reference_forward(p, y);
  else
    detail::structured_rotation::forward(p, y);
}

void structured_rotation_backward(const StructuredRotationParams& params, Impl impl,
                                  const TensorView& dy, const StructuredRotationGrads& grads) {
  const std::string op = op_name(Op::structured_rotation, impl);
  const ApplyProblem p = validate_apply(op, params);
  detail::check_float_tensor(op, "dy", dy, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.dx.defined())
    check_owned_output(op, "dx", grads.dx, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.d_positions.defined())
    check_owned_output(op, "d_positions", grads.d_positions,
                       {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.C, "C"}});
  if (grads.d_coefficients.defined())
    check_owned_output(op, "d_coefficients", grads.d_coefficients, {{p.C, "C"}, {p.m, "m"}});
  if (grads.d_post_rotation.defined()) {
    if (!p.post_rotation.defined())
      detail::fail(op, "d_post_rotation",
                   "post_rotation to be given (d_post_rotation is its gradient)",
                   "d_post_rotation requested without post_rotation");
    check_owned_output(op, "d_post_rotation", grads.d_post_rotation, {{p.K, "K"}, {p.K, "K"}});
  }
  if (impl == Impl::reference)
    detail::structured_rotation::reference_backward(p, dy, grads);
  else
    detail::structured_rotation::backward(p, dy, grads);
}

namespace {
// s [n, n]; null_basis [K, n] (optional, orthonormal columns); returns K.
std::int64_t validate_cayley(const std::string& op, const TensorView& s,
                             const TensorView& null_basis) {
  detail::check_float_rank(op, "s", s, 2, "[n, n]");
  const std::int64_t n = s.size(0);
  if (s.size(1) != n) detail::fail(op, "s", "a square matrix [n, n]", "shape " + s.shape_string());
  if (!null_basis.defined()) return n;
  detail::check_float_rank(op, "null_basis", null_basis, 2, "[K, n]");
  detail::check_float_tensor(op, "null_basis", null_basis,
                             {{null_basis.size(0), "K"}, {n, "n (as s)"}});
  if (null_basis.size(0) < n)
    detail::fail(op, "null_basis", "K ≥ n (n orthonormal columns in R^K)",
                 "shape " + null_basis.shape_string());
  check_orthonormal_columns(op, "null_basis", null_basis);
  return null_basis.size(0);
}
}  // namespace

void structured_cayley_forward(const TensorView& s, const TensorView& null_basis,
                               const TensorView& p) {
  const std::string op = "structured_cayley";
  const std::int64_t K = validate_cayley(op, s, null_basis);
  check_owned_output(op, "p", p, {{K, "K"}, {K, "K"}});
  detail::structured_rotation::cayley_forward(op, s, null_basis, p);
}

void structured_cayley_backward(const TensorView& s, const TensorView& null_basis,
                                const TensorView& dp, const TensorView& ds) {
  const std::string op = "structured_cayley";
  const std::int64_t K = validate_cayley(op, s, null_basis);
  const std::int64_t n = s.size(0);
  detail::check_float_tensor(op, "dp", dp, {{K, "K"}, {K, "K"}});
  check_owned_output(op, "ds", ds, {{n, "n"}, {n, "n"}});
  detail::structured_rotation::cayley_backward(op, s, null_basis, dp, ds);
}

}  // namespace phasor
