// STRING ops: argument validation and dispatch to the reference and optimized kernels.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <cmath>
#include <string>

#include "common/check.h"
#include "common/element_access.h"
#include "phasor/ops.h"
#include "phasor/string_rotation.h"
#include "string_rotation/kernels.h"

namespace phasor {
namespace {

using detail::check_owned_output;

namespace sr = detail::string_rotation;
using detail::Dim;

std::string str(std::int64_t v) {
  return std::to_string(v);
}

// positions: [B, T, C].
void check_positions(const std::string& op, const TensorView& positions, std::int64_t B,
                     std::int64_t T) {
  detail::check_float_rank(op, "positions", positions, 3, "[B, T, C]");
  detail::check_float_tensor(op, "positions", positions,
                             {{B, "B (as z)"}, {T, "T (as z)"}, {positions.size(2), "C"}});
}

// A per-head parameter: [inner...] (shared) or [H, inner...] (per head). Returns it normalised to
// a leading head dimension (size 1 when shared).
TensorView check_head_param(const std::string& op, const char* name, const TensorView& x,
                            std::int64_t H, std::int64_t d1, const char* l1, std::int64_t d2,
                            const char* l2) {
  const std::string shared = "[" + str(d1) + ", " + str(d2) + "]";
  const std::string per_head = "[" + str(H) + ", " + str(d1) + ", " + str(d2) + "]";
  if (!x.defined() || (x.rank != 2 && x.rank != 3))
    detail::fail(
        op, name,
        shared + " (" + l1 + ", " + l2 + ") or " + per_head + " (H, " + l1 + ", " + l2 + ")",
        x.shape_string());
  if (x.rank == 2) {
    detail::check_float_tensor(op, name, x, {{d1, l1}, {d2, l2}});
    return sr::with_leading_one(x);
  }
  detail::check_float_tensor(op, name, x, {{H, "H"}, {d1, l1}, {d2, l2}});
  return x;
}
// The gradient of such a parameter: same shape as the parameter, normalised the same way.
TensorView check_head_param_grad(const std::string& op, const char* name, const TensorView& g,
                                 const TensorView& param) {
  if (!g.defined()) return {};
  if (param.rank == 2) {
    check_owned_output(op, name, g,
                       {{param.size(0), "as the parameter"}, {param.size(1), "as the parameter"}});
    return sr::with_leading_one(g);
  }
  check_owned_output(op, name, g,
                     {{param.size(0), "as the parameter"},
                      {param.size(1), "as the parameter"},
                      {param.size(2), "as the parameter"}});
  return g;
}

// z: [B, T, H, K].
void check_z(const std::string& op, const TensorView& z, bool even_k) {
  detail::check_float_rank(op, "z", z, 4, "[B, T, H, K]");
  // (K = 0 would leave Cayley-STRING's (I + S) an empty system, which Eigen's LU cannot take.)
  if (even_k && (z.size(3) % 2 != 0 || z.size(3) < 2))
    detail::fail(op, "z", "a positive even head dimension K (K/2 ≥ 1 rotation pairs)",
                 "K = " + str(z.size(3)) + " in " + z.shape_string());
  if (!even_k && z.size(3) < 1)
    detail::fail(op, "z", "a head dimension K ≥ 1", "K = " + str(z.size(3)));
}
void check_like_z(const std::string& op, const char* name, const TensorView& x, const TensorView& z,
                  bool output) {
  const std::initializer_list<Dim> dims = {
      {z.size(0), "B"}, {z.size(1), "T"}, {z.size(2), "H"}, {z.size(3), "K"}};
  if (output)
    check_owned_output(op, name, x, dims);
  else
    detail::check_float_tensor(op, name, x, dims);
}

// nd_rope_angles: omega [C, R] → theta [B, T, R]; omega [H, C, R] → theta [B, T, H, R].
struct AnglesArgs {
  TensorView omega3;  // [Hw, C, R]
  std::int64_t B, T, C, R, H;
};
AnglesArgs validate_angles(const std::string& op, const TensorView& positions,
                           const TensorView& omega) {
  detail::check_float_rank(op, "positions", positions, 3, "[B, T, C]");
  AnglesArgs a{};
  a.B = positions.size(0);
  a.T = positions.size(1);
  a.C = positions.size(2);
  if (!omega.defined() || (omega.rank != 2 && omega.rank != 3))
    detail::fail(op, "omega", "[C, R] (shared by heads) or [H, C, R] with C = " + str(a.C),
                 omega.shape_string());
  if (omega.rank == 2) {
    detail::check_float_tensor(op, "omega", omega,
                               {{a.C, "C (as positions)"}, {omega.size(1), "R"}});
    a.omega3 = sr::with_leading_one(omega);
    a.H = 0;
  } else {
    detail::check_float_tensor(
        op, "omega", omega,
        {{omega.size(0), "H"}, {a.C, "C (as positions)"}, {omega.size(2), "R"}});
    a.omega3 = omega;
    a.H = omega.size(0);
  }
  a.R = a.omega3.size(2);
  return a;
}
// theta-shaped view ([B, T, R] or [B, T, H, R]) normalised to 4-D.
TensorView check_theta_like(const std::string& op, const char* name, const TensorView& x,
                            const AnglesArgs& a, bool output) {
  if (a.H == 0) {
    const std::initializer_list<Dim> dims = {{a.B, "B"}, {a.T, "T"}, {a.R, "R (as omega)"}};
    if (output)
      check_owned_output(op, name, x, dims);
    else
      detail::check_float_tensor(op, name, x, dims);
    return sr::insert_head_dim(x);
  }
  const std::initializer_list<Dim> dims = {
      {a.B, "B"}, {a.T, "T"}, {a.H, "H (as omega)"}, {a.R, "R (as omega)"}};
  if (output)
    check_owned_output(op, name, x, dims);
  else
    detail::check_float_tensor(op, name, x, dims);
  return x;
}

// dy, and dz / d_positions when requested: the gradients every STRING rotation shares.
void check_rotation_grads(const std::string& op, const TensorView& z, const TensorView& positions,
                          const TensorView& dy, const TensorView& dz,
                          const TensorView& d_positions) {
  check_like_z(op, "dy", dy, z, false);
  if (dz.defined()) check_like_z(op, "dz", dz, z, true);
  if (d_positions.defined())
    check_owned_output(op, "d_positions", d_positions,
                       {{z.size(0), "B"}, {z.size(1), "T"}, {positions.size(2), "C"}});
}

}  // namespace

void nd_rope_angles_forward(const TensorView& positions, const TensorView& omega, Impl impl,
                            const TensorView& theta) {
  const std::string op = op_name(Op::nd_rope_angles, impl);
  const AnglesArgs a = validate_angles(op, positions, omega);
  const TensorView theta4 = check_theta_like(op, "theta", theta, a, true);
  if (impl == Impl::reference)
    sr::reference_angles_forward(positions, a.omega3, theta4);
  else
    sr::angles_forward(positions, a.omega3, theta4);
}

void nd_rope_angles_backward(const TensorView& positions, const TensorView& omega, Impl impl,
                             const TensorView& d_theta, const TensorView& d_positions,
                             const TensorView& d_omega) {
  const std::string op = op_name(Op::nd_rope_angles, impl);
  const AnglesArgs a = validate_angles(op, positions, omega);
  const TensorView dtheta4 = check_theta_like(op, "d_theta", d_theta, a, false);
  if (d_positions.defined())
    check_owned_output(op, "d_positions", d_positions, {{a.B, "B"}, {a.T, "T"}, {a.C, "C"}});
  const TensorView d_omega3 = check_head_param_grad(op, "d_omega", d_omega, omega);
  if (impl == Impl::reference)
    sr::reference_angles_backward(positions, a.omega3, dtheta4, d_positions, d_omega3);
  else
    sr::angles_backward(positions, a.omega3, dtheta4, d_positions, d_omega3);
}

void nd_rope_axis_split_frequencies(std::int64_t num_axes, std::int64_t head_dim, double base,
                                    const TensorView& omega) {
  const std::string op = "nd_rope_axis_split_frequencies";
  if (num_axes < 1) detail::fail(op, "num_axes", "C ≥ 1", str(num_axes));
  if (head_dim <= 0 || head_dim % 2 != 0)
    detail::fail(op, "head_dim", "a positive even head dimension K", str(head_dim));
  if (!std::isfinite(base) || base <= 0)
    detail::fail(op, "base", "a finite positive base", std::to_string(base));
  const std::int64_t R = head_dim / 2;
  check_owned_output(op, "omega", omega, {{num_axes, "C = num_axes"}, {R, "R = head_dim / 2"}});
  const std::int64_t per_axis = R / num_axes, extra = R % num_axes;
  std::int64_t start = 0;
  for (std::int64_t c = 0; c < num_axes; ++c) {
    const std::int64_t n = per_axis + (c < extra ? 1 : 0);
    for (std::int64_t i = 0; i < R; ++i) {
      const std::int64_t j = i - start;
      const double w = (j >= 0 && j < n)
                           ? std::pow(base, -static_cast<double>(j) / static_cast<double>(n))
                           : 0.0;
      detail::put(omega, detail::offset_of(omega, c, i), w);
    }
    start += n;
  }
}

namespace {
sr::CayleyProblem validate_cayley(const std::string& op, const CayleyStringParams& params) {
  check_z(op, params.z, true);
  const std::int64_t B = params.z.size(0), T = params.z.size(1), H = params.z.size(2),
                     K = params.z.size(3);
  check_positions(op, params.positions, B, T);
  const std::int64_t C = params.positions.size(2);
  sr::CayleyProblem p;
  p.z = params.z;
  p.positions = params.positions;
  p.omega = check_head_param(op, "omega", params.omega, H, C, "C (as positions)", K / 2, "K/2");
  p.generator = check_head_param(op, "generator", params.generator, H, K, "K", K, "K");
  p.layout = params.layout;
  return p;
}
sr::CirculantProblem validate_circulant(const std::string& op,
                                        const CirculantStringParams& params) {
  check_z(op, params.z, false);
  const std::int64_t B = params.z.size(0), T = params.z.size(1), H = params.z.size(2),
                     K = params.z.size(3);
  check_positions(op, params.positions, B, T);
  sr::CirculantProblem p;
  p.z = params.z;
  p.positions = params.positions;
  p.c =
      check_head_param(op, "c", params.c, H, params.positions.size(2), "C (as positions)", K, "K");
  return p;
}
}  // namespace

void cayley_string_forward(const CayleyStringParams& params, Impl impl, const TensorView& y) {
  const std::string op = op_name(Op::cayley_string, impl);
  const sr::CayleyProblem p = validate_cayley(op, params);
  check_like_z(op, "y", y, params.z, true);
  if (impl == Impl::reference)
    sr::reference_cayley_forward(p, y);
  else
    sr::cayley_forward(p, y);
}

void cayley_string_backward(const CayleyStringParams& params, Impl impl, const TensorView& dy,
                            const CayleyStringGrads& grads) {
  const std::string op = op_name(Op::cayley_string, impl);
  const sr::CayleyProblem p = validate_cayley(op, params);
  check_rotation_grads(op, params.z, params.positions, dy, grads.dz, grads.d_positions);
  CayleyStringGrads g =
      grads;  // dz, d_positions as given; the head parameters' views normalised below
  g.d_omega = check_head_param_grad(op, "d_omega", grads.d_omega, params.omega);
  g.d_generator = check_head_param_grad(op, "d_generator", grads.d_generator, params.generator);
  if (impl == Impl::reference)
    sr::reference_cayley_backward(p, dy, g);
  else
    sr::cayley_backward(p, dy, g);
}

void circulant_string_forward(const CirculantStringParams& params, Impl impl, const TensorView& y) {
  const std::string op = op_name(Op::circulant_string, impl);
  const sr::CirculantProblem p = validate_circulant(op, params);
  check_like_z(op, "y", y, params.z, true);
  if (impl == Impl::reference)
    sr::reference_circulant_forward(p, y);
  else
    sr::circulant_forward(p, y);
}

void circulant_string_backward(const CirculantStringParams& params, Impl impl, const TensorView& dy,
                               const CirculantStringGrads& grads) {
  const std::string op = op_name(Op::circulant_string, impl);
  const sr::CirculantProblem p = validate_circulant(op, params);
  check_rotation_grads(op, params.z, params.positions, dy, grads.dz, grads.d_positions);
  CirculantStringGrads g =
      grads;  // dz, d_positions as given; the head parameters' views normalised below
  g.dc = check_head_param_grad(op, "dc", grads.dc, params.c);
  if (impl == Impl::reference)
    sr::reference_circulant_backward(p, dy, g);
  else
    sr::circulant_backward(p, dy, g);
}

}  // namespace phasor
