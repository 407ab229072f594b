// GRAPE-M ops: argument validation and dispatch to the reference and optimized kernels.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include "common/eigen.h"  // first: see there

#include <cmath>
#include <sstream>
#include <string>

#include "common/check.h"
#include "grape/kernels.h"
#include "phasor/grape.h"
#include "phasor/ops.h"

namespace phasor {
namespace {

using detail::check_owned_output;

using detail::grape::PlaneProblem;
using detail::grape::SubspaceProblem;

// z [B, T, H, K] and the shapes of everything else relative to it.
PlaneProblem validate_plane(const std::string& op, const GrapeParams& params) {
  detail::check_float_rank(op, "z", params.z, 4, "[B, T, H, K]");
  PlaneProblem p;
  p.z = params.z;
  p.B = params.z.size(0);
  p.T = params.z.size(1);
  p.H = params.z.size(2);
  p.K = params.z.size(3);
  const std::string ab_shapes = "[H, K] = [" + std::to_string(p.H) + ", " + std::to_string(p.K) +
                                "] or [K] = [" + std::to_string(p.K) + "]";
  if (!params.a.defined() || (params.a.rank != 1 && params.a.rank != 2))
    detail::fail(op, "a", ab_shapes, params.a.shape_string());
  p.ab_per_head = params.a.rank == 2;
  if (p.ab_per_head) {
    detail::check_float_tensor(op, "a", params.a, {{p.H, "H (as z)"}, {p.K, "K (as z)"}});
    detail::check_float_tensor(op, "b", params.b, {{p.H, "H (as z and a)"}, {p.K, "K (as z)"}});
  } else {
    detail::check_float_tensor(op, "a", params.a, {{p.K, "K (as z)"}});
    detail::check_float_tensor(op, "b", params.b, {{p.K, "K (as z and a)"}});
  }
  p.a = params.a;
  p.b = params.b;
  detail::check_float_tensor(op, "omega", params.omega, {{p.H, "H (as z)"}});
  p.omega = params.omega;
  if (!params.positions.defined() || (params.positions.rank != 2 && params.positions.rank != 3))
    detail::fail(op, "positions",
                 "[B, T] = [" + std::to_string(p.B) + ", " + std::to_string(p.T) +
                     "] or [B, T, H] = [" + std::to_string(p.B) + ", " + std::to_string(p.T) +
                     ", " + std::to_string(p.H) + "]",
                 params.positions.shape_string());
  p.positions_per_head = params.positions.rank == 3;
  if (p.positions_per_head)
    detail::check_float_tensor(op, "positions", params.positions,
                               {{p.B, "B (as z)"}, {p.T, "T (as z)"}, {p.H, "H (as z)"}});
  else
    detail::check_float_tensor(op, "positions", params.positions,
                               {{p.B, "B (as z)"}, {p.T, "T (as z)"}});
  p.positions = params.positions;
  return p;
}

// max |BᵀB − I| of every head's basis, against the tolerance. BᵀB by one float64 matrix product
// per head (O(K³), a small fraction of the op for T ≫ K).
void check_orthogonal(const std::string& op, const SubspaceProblem& p, double tol) {
  if (std::isinf(tol) && tol > 0) return;
  const std::int64_t heads = p.basis_per_head ? p.H : 1, K = p.K;
  const int r = p.basis.rank;
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t base = p.basis_per_head ? h * p.basis.stride(0) : 0;
    const std::int64_t rs = p.basis.stride(r - 2), cs = p.basis.stride(r - 1);
    Eigen::MatrixXd Bm(K, K);
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t j = 0; j < K; ++j) Bm(i, j) = detail::get(p.basis, base + i * rs + j * cs);
    const Eigen::MatrixXd E = Bm.transpose() * Bm - Eigen::MatrixXd::Identity(K, K);
    double worst = 0;
    std::int64_t wi = 0, wj = 0;
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t j = 0; j < K; ++j) {
        const double err = std::fabs(E(i, j));
        if (!(err <= worst) && !std::isnan(worst)) {  // NaN is the worst and stays
          worst = err;
          wi = i;
          wj = j;
        }
      }
    if (!(worst <= tol)) {
      std::ostringstream got;
      got << "max |BᵀB − I| = " << worst << " at (" << wi << ", " << wj << ")"
          << (p.basis_per_head ? " of head " + std::to_string(h) : std::string());
      std::ostringstream expected;
      expected << "an orthogonal basis (max |BᵀB − I| ≤ orthogonality_tol = " << tol << ")";
      detail::fail(op, "basis", expected.str(), got.str());
    }
  }
}

SubspaceProblem validate_subspace(const std::string& op, const GrapeSubspaceParams& params) {
  detail::check_float_rank(op, "z", params.z, 4, "[B, T, H, K]");
  SubspaceProblem p;
  p.z = params.z;
  p.B = params.z.size(0);
  p.T = params.z.size(1);
  p.H = params.z.size(2);
  p.K = params.z.size(3);
  p.layout = params.layout;
  if (p.K % 2 != 0)
    detail::fail(op, "z", "an even head dimension K (K/2 rotation planes)",
                 "K = " + std::to_string(p.K) + " in " + params.z.shape_string());
  if (!params.basis.defined() || (params.basis.rank != 2 && params.basis.rank != 3))
    detail::fail(op, "basis",
                 "[K, K] = [" + std::to_string(p.K) + ", " + std::to_string(p.K) +
                     "] or [H, K, K] = [" + std::to_string(p.H) + ", " + std::to_string(p.K) +
                     ", " + std::to_string(p.K) + "]",
                 params.basis.shape_string());
  p.basis_per_head = params.basis.rank == 3;
  if (p.basis_per_head)
    detail::check_float_tensor(op, "basis", params.basis,
                               {{p.H, "H (as z)"}, {p.K, "K (as z)"}, {p.K, "K (as z)"}});
  else
    detail::check_float_tensor(op, "basis", params.basis, {{p.K, "K (as z)"}, {p.K, "K (as z)"}});
  p.basis = params.basis;
  detail::check_float_tensor(op, "theta", params.theta,
                             {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K / 2, "K/2"}});
  p.theta = params.theta;
  if (std::isnan(params.orthogonality_tol) || params.orthogonality_tol < 0)
    detail::fail(op, "orthogonality_tol", "a tolerance ≥ 0 (+infinity disables the check)",
                 std::to_string(params.orthogonality_tol));
  check_orthogonal(op, p, params.orthogonality_tol);
  return p;
}

}  // namespace

void grape_forward(const GrapeParams& params, Impl impl, const TensorView& y) {
  const std::string op = op_name(Op::grape, impl);
  const PlaneProblem p = validate_plane(op, params);
  check_owned_output(op, "y", y, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (impl == Impl::reference)
    detail::grape::reference_plane_forward(p, y);
  else
    detail::grape::plane_forward(p, y);
}

void grape_backward(const GrapeParams& params, Impl impl, const TensorView& dy,
                    const GrapeGrads& grads) {
  const std::string op = op_name(Op::grape, impl);
  const PlaneProblem p = validate_plane(op, params);
  detail::check_float_tensor(op, "dy", dy, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.dz.defined())
    check_owned_output(op, "dz", grads.dz, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  for (const auto& [view, name] : {std::pair{grads.da, "da"}, std::pair{grads.db, "db"}}) {
    if (!view.defined()) continue;
    if (p.ab_per_head)
      check_owned_output(op, name, view, {{p.H, "H (as a)"}, {p.K, "K (as a)"}});
    else
      check_owned_output(op, name, view, {{p.K, "K (as a)"}});
  }
  if (grads.d_omega.defined())
    check_owned_output(op, "d_omega", grads.d_omega, {{p.H, "H (as omega)"}});
  if (grads.d_positions.defined()) {
    if (p.positions_per_head)
      check_owned_output(op, "d_positions", grads.d_positions,
                         {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}});
    else
      check_owned_output(op, "d_positions", grads.d_positions, {{p.B, "B"}, {p.T, "T"}});
  }
  if (impl == Impl::reference)
    detail::grape::reference_plane_backward(p, dy, grads);
  else
    detail::grape::plane_backward(p, dy, grads);
}

void grape_subspace_forward(const GrapeSubspaceParams& params, Impl impl, const TensorView& y) {
  const std::string op = op_name(Op::grape_subspace, impl);
  const SubspaceProblem p = validate_subspace(op, params);
  check_owned_output(op, "y", y, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (impl == Impl::reference)
    detail::grape::reference_subspace_forward(p, y);
  else
    detail::grape::subspace_forward(p, y);
}

void grape_subspace_backward(const GrapeSubspaceParams& params, Impl impl, const TensorView& dy,
                             const GrapeSubspaceGrads& grads) {
  const std::string op = op_name(Op::grape_subspace, impl);
  const SubspaceProblem p = validate_subspace(op, params);
  detail::check_float_tensor(op, "dy", dy, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.dz.defined())
    check_owned_output(op, "dz", grads.dz, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.d_basis.defined()) {
    if (p.basis_per_head)
      check_owned_output(op, "d_basis", grads.d_basis,
                         {{p.H, "H (as basis)"}, {p.K, "K (as basis)"}, {p.K, "K (as basis)"}});
    else
      check_owned_output(op, "d_basis", grads.d_basis,
                         {{p.K, "K (as basis)"}, {p.K, "K (as basis)"}});
  }
  if (grads.d_theta.defined())
    check_owned_output(op, "d_theta", grads.d_theta,
                       {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K / 2, "K/2"}});
  if (impl == Impl::reference)
    detail::grape::reference_subspace_backward(p, dy, grads);
  else
    detail::grape::subspace_backward(p, dy, grads);
}

}  // namespace phasor
