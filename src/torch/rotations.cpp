// The LibTorch layer for the rotation position encodings of issue 5: STRING (phasor/
// string_rotation.h), multiplicative GRAPE (phasor/grape.h) and the equivariant structured
// rotations (phasor/structured_rotation.h). One torch::autograd::Function per op, running the
// core's optimized kernels (Impl::chunk) forward and backward, as src/torch/rotary.cpp does.
//
// Dtypes: every floating argument keeps its own dtype (float16/bfloat16 are first converted to
// float32, differentiably); the core accepts float32 and float64 mixed, computes the vector
// arithmetic in x's dtype and the angles in float64. Each gradient comes back in its input's
// dtype. Parameters shared by the heads receive the sum over the heads (the core reduces them).
#include <string>
#include <tuple>

#include "layer_util.h"
#include "phasor/grape.h"
#include "phasor/string_rotation.h"
#include "phasor/structured_rotation.h"
#include "phasor/torch.h"

namespace phasor {
namespace {

using namespace torch_detail;  // NOLINT(google-build-using-namespace): the layer's own helpers

// [B, T, R] angles (or positions) shared by the heads as a [B, T, H, R] view with a zero stride.
at::Tensor broadcast_heads(const at::Tensor& t, std::int64_t heads) {
  if (t.dim() == 4) return t;
  return t.unsqueeze(2).expand({t.size(0), t.size(1), heads, t.size(2)});
}

// Arguments that receive no gradient from the core (a decomposition's basis): refuse a tensor
// that requires grad instead of silently dropping its gradient.
void check_no_grad(const std::string& op, const std::string& name, const at::Tensor& t,
                   const std::string& why) {
  if (t.defined() && t.requires_grad())
    fail(op, name, "a tensor that does not require grad (" + why + ")",
         "a tensor with requires_grad=true");
}

// ---- nd_rope_angles -----------------------------------------------------------------------------

struct NdRopeAnglesFunction : torch::autograd::Function<NdRopeAnglesFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& positions,
                               const at::Tensor& omega) {
    const at::ScalarType dtype = at::promote_types(positions.scalar_type(), omega.scalar_type());
    const std::int64_t B = positions.size(0), T = positions.size(1);
    at::Tensor theta =
        omega.dim() == 2
            ? at::empty({B, T, omega.size(1)}, positions.options().dtype(dtype))
            : at::empty({B, T, omega.size(0), omega.size(2)}, positions.options().dtype(dtype));
    rethrow_as_torch([&] {
      nd_rope_angles_forward(view_of(positions), view_of(omega), Impl::chunk, view_of(theta));
    });
    ctx->save_for_backward({positions, omega});
    ctx->saved_data["need"] = c10::List<bool>({requires_grad(positions), requires_grad(omega)});
    ctx->set_materialize_grads(false);
    return {theta};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("nd_rope_angles");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &positions = saved[0], &omega = saved[1];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor d_theta = incoming_grad(grads, 0);
    if (!d_theta.defined()) return {at::Tensor(), at::Tensor()};
    at::Tensor d_positions = grad_buffer(positions, need[0]), d_omega = grad_buffer(omega, need[1]);
    rethrow_as_torch([&] {
      nd_rope_angles_backward(view_of(positions), view_of(omega), Impl::chunk, view_of(d_theta),
                              view_of(d_positions), view_of(d_omega));
    });
    return {d_positions, d_omega};
  }
};

// ---- Cayley-STRING ------------------------------------------------------------------------------

CayleyStringParams cayley_params(const at::Tensor& x, const at::Tensor& positions,
                                 const at::Tensor& omega, const at::Tensor& generator,
                                 RotaryLayout layout) {
  CayleyStringParams p;
  p.z = view_of(x);
  p.positions = view_of(positions);
  p.omega = view_of(omega);
  p.generator = view_of(generator);
  p.layout = layout;
  return p;
}

struct CayleyStringFunction : torch::autograd::Function<CayleyStringFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& positions, const at::Tensor& omega,
                               const at::Tensor& generator, RotaryLayout layout) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    rethrow_as_torch([&] {
      cayley_string_forward(cayley_params(x, positions, omega, generator, layout), Impl::chunk,
                            view_of(y));
    });
    ctx->save_for_backward({x, positions, omega, generator});
    ctx->saved_data["rotary_layout"] = static_cast<std::int64_t>(layout);
    ctx->saved_data["need"] = c10::List<bool>({requires_grad(x), requires_grad(positions),
                                               requires_grad(omega), requires_grad(generator)});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("cayley_string");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &positions = saved[1], &omega = saved[2], &generator = saved[3];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor dy = incoming_grad(grads, 0);
    if (!dy.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor dx = grad_buffer(x, need[0]), d_positions = grad_buffer(positions, need[1]),
               d_omega = grad_buffer(omega, need[2]), d_generator = grad_buffer(generator, need[3]);
    CayleyStringGrads out;
    out.dz = view_of(dx), out.d_positions = view_of(d_positions), out.d_omega = view_of(d_omega);
    out.d_generator = view_of(d_generator);
    rethrow_as_torch([&] {
      cayley_string_backward(cayley_params(x, positions, omega, generator, saved_layout(ctx)),
                             Impl::chunk, view_of(dy), out);
    });
    return {dx, d_positions, d_omega, d_generator, at::Tensor()};
  }
};

// ---- Circulant-STRING ---------------------------------------------------------------------------

CirculantStringParams circulant_params(const at::Tensor& x, const at::Tensor& positions,
                                       const at::Tensor& c) {
  CirculantStringParams p;
  p.z = view_of(x);
  p.positions = view_of(positions);
  p.c = view_of(c);
  return p;
}

struct CirculantStringFunction : torch::autograd::Function<CirculantStringFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& positions, const at::Tensor& c) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    rethrow_as_torch([&] {
      circulant_string_forward(circulant_params(x, positions, c), Impl::chunk, view_of(y));
    });
    ctx->save_for_backward({x, positions, c});
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(x), requires_grad(positions), requires_grad(c)});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("circulant_string");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &positions = saved[1], &c = saved[2];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor dy = incoming_grad(grads, 0);
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor dx = grad_buffer(x, need[0]), d_positions = grad_buffer(positions, need[1]),
               dc = grad_buffer(c, need[2]);
    CirculantStringGrads out;
    out.dz = view_of(dx), out.d_positions = view_of(d_positions), out.dc = view_of(dc);
    rethrow_as_torch([&] {
      circulant_string_backward(circulant_params(x, positions, c), Impl::chunk, view_of(dy), out);
    });
    return {dx, d_positions, dc};
  }
};

// ---- single-plane GRAPE-M -----------------------------------------------------------------------

GrapeParams grape_params(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                         const at::Tensor& omega, const at::Tensor& positions) {
  GrapeParams p;
  p.z = view_of(x);
  p.a = view_of(a);
  p.b = view_of(b);
  p.omega = view_of(omega);
  p.positions = view_of(positions);
  return p;
}

struct GrapeFunction : torch::autograd::Function<GrapeFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& a,
                               const at::Tensor& b, const at::Tensor& omega,
                               const at::Tensor& positions) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    rethrow_as_torch(
        [&] { grape_forward(grape_params(x, a, b, omega, positions), Impl::chunk, view_of(y)); });
    ctx->save_for_backward({x, a, b, omega, positions});
    ctx->saved_data["need"] = c10::List<bool>({requires_grad(x), requires_grad(a), requires_grad(b),
                                               requires_grad(omega), requires_grad(positions)});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("grape");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &a = saved[1], &b = saved[2], &omega = saved[3],
                     &positions = saved[4];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor dy = incoming_grad(grads, 0);
    if (!dy.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor dx = grad_buffer(x, need[0]), da = grad_buffer(a, need[1]),
               db = grad_buffer(b, need[2]), d_omega = grad_buffer(omega, need[3]),
               d_positions = grad_buffer(positions, need[4]);
    GrapeGrads out;
    out.dz = view_of(dx), out.da = view_of(da), out.db = view_of(db);
    out.d_omega = view_of(d_omega), out.d_positions = view_of(d_positions);
    rethrow_as_torch([&] {
      grape_backward(grape_params(x, a, b, omega, positions), Impl::chunk, view_of(dy), out);
    });
    return {dx, da, db, d_omega, d_positions};
  }
};

// ---- multi-subspace GRAPE-M ---------------------------------------------------------------------

GrapeSubspaceParams subspace_params(const at::Tensor& x, const at::Tensor& basis,
                                    const at::Tensor& theta, RotaryLayout layout, double tol) {
  GrapeSubspaceParams p;
  p.z = view_of(x);
  p.basis = view_of(basis);
  p.theta = view_of(broadcast_heads(theta, x.size(2)));
  p.layout = layout;
  p.orthogonality_tol = tol;
  return p;
}

struct GrapeSubspaceFunction : torch::autograd::Function<GrapeSubspaceFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& basis,
                               const at::Tensor& theta, RotaryLayout layout, double tol) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    rethrow_as_torch([&] {
      grape_subspace_forward(subspace_params(x, basis, theta, layout, tol), Impl::chunk,
                             view_of(y));
    });
    ctx->save_for_backward({x, basis, theta});
    ctx->saved_data["rotary_layout"] = static_cast<std::int64_t>(layout);
    ctx->saved_data["tol"] = tol;
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(x), requires_grad(basis), requires_grad(theta)});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("grape_subspace");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &basis = saved[1], &theta = saved[2];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor dy = incoming_grad(grads, 0);
    if (!dy.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor theta4 = broadcast_heads(theta, x.size(2));
    at::Tensor dx = grad_buffer(x, need[0]), d_basis = grad_buffer(basis, need[1]);
    // The core writes one angle gradient per head (it must own its elements); shared angles
    // receive the sum over the heads.
    at::Tensor d_theta4 = need[2] ? at::empty(theta4.sizes(), theta.options()) : at::Tensor();
    GrapeSubspaceGrads out;
    out.dz = view_of(dx), out.d_basis = view_of(d_basis), out.d_theta = view_of(d_theta4);
    rethrow_as_torch([&] {
      grape_subspace_backward(
          subspace_params(x, basis, theta, saved_layout(ctx), ctx->saved_data["tol"].toDouble()),
          Impl::chunk, view_of(dy), out);
    });
    at::Tensor d_theta = d_theta4;
    if (d_theta4.defined() && theta.dim() == 3) d_theta = d_theta4.sum(2);
    return {dx, d_basis, d_theta, at::Tensor(), at::Tensor()};
  }
};

// ---- structured rotations -----------------------------------------------------------------------

StructuredRotationParams structured_params(const at::Tensor& x, const at::Tensor& positions,
                                           const at::Tensor& basis, const at::Tensor& coefficients,
                                           const at::Tensor& post_rotation) {
  StructuredRotationParams p;
  p.x = view_of(x);
  p.positions = view_of(broadcast_heads(positions, x.size(2)));
  p.basis = view_of(basis);
  p.coefficients = view_of(coefficients);
  p.post_rotation = view_of(post_rotation);
  return p;
}

struct StructuredRotationFunction : torch::autograd::Function<StructuredRotationFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& positions, const at::Tensor& basis,
                               const at::Tensor& coefficients,
                               const c10::optional<at::Tensor>& post_rotation_in) {
    const at::Tensor post_rotation = value_or_undefined(post_rotation_in);
    at::Tensor y = at::empty(x.sizes(), x.options());
    rethrow_as_torch([&] {
      structured_rotation_forward(
          structured_params(x, positions, basis, coefficients, post_rotation), Impl::chunk,
          view_of(y));
    });
    ctx->save_for_backward({x, positions, basis, coefficients, post_rotation});
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(x), requires_grad(positions), requires_grad(coefficients),
                         requires_grad(post_rotation)});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("structured_rotation");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &positions = saved[1], &basis = saved[2],
                     &coefficients = saved[3], &post_rotation = saved[4];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor dy = incoming_grad(grads, 0);
    if (!dy.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor positions4 = broadcast_heads(positions, x.size(2));
    at::Tensor dx = grad_buffer(x, need[0]), d_coefficients = grad_buffer(coefficients, need[2]),
               d_post = grad_buffer(post_rotation, need[3]);
    // The position gradient must own its elements: one per head, summed for shared positions.
    at::Tensor d_positions4 =
        need[1] ? at::empty(positions4.sizes(), positions.options()) : at::Tensor();
    StructuredRotationGrads out;
    out.dx = view_of(dx), out.d_positions = view_of(d_positions4);
    out.d_coefficients = view_of(d_coefficients), out.d_post_rotation = view_of(d_post);
    rethrow_as_torch([&] {
      structured_rotation_backward(
          structured_params(x, positions, basis, coefficients, post_rotation), Impl::chunk,
          view_of(dy), out);
    });
    at::Tensor d_positions = d_positions4;
    if (d_positions4.defined() && positions.dim() == 3) d_positions = d_positions4.sum(2);
    return {dx, d_positions, at::Tensor(), d_coefficients, d_post};
  }
};

struct StructuredCayleyFunction : torch::autograd::Function<StructuredCayleyFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& s,
                               const c10::optional<at::Tensor>& null_basis_in) {
    const at::Tensor null_basis = value_or_undefined(null_basis_in);
    const std::int64_t K = null_basis.defined() ? null_basis.size(0) : s.size(0);
    at::Tensor p = at::empty({K, K}, s.options());
    rethrow_as_torch(
        [&] { structured_cayley_forward(view_of(s), view_of(null_basis), view_of(p)); });
    ctx->save_for_backward({s, null_basis});
    ctx->set_materialize_grads(false);
    return {p};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("structured_cayley");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &s = saved[0], &null_basis = saved[1];
    const at::Tensor dp = incoming_grad(grads, 0);
    if (!dp.defined()) return {at::Tensor(), at::Tensor()};
    at::Tensor ds = at::empty(s.sizes(), s.options());
    rethrow_as_torch([&] {
      structured_cayley_backward(view_of(s), view_of(null_basis), view_of(dp), view_of(ds));
    });
    return {ds, at::Tensor()};
  }
};

}  // namespace

// ---- entry points -------------------------------------------------------------------------------

at::Tensor nd_rope_angles(const at::Tensor& positions, const at::Tensor& omega) {
  const std::string op = "nd_rope_angles";
  check_float(op, "positions", positions, 3, "[B, T, C]");
  check_float_either_rank(op, "omega", omega, 2, 3, "[C, R] or [H, C, R]");
  return NdRopeAnglesFunction::apply(to_compute(positions), to_compute(omega))[0];
}

at::Tensor nd_rope_axis_split_frequencies(std::int64_t num_axes, std::int64_t head_dim, double base,
                                          at::ScalarType dtype) {
  const std::string op = "nd_rope_axis_split_frequencies";
  if (dtype != at::kFloat && dtype != at::kDouble)
    fail(op, "dtype", "float32 or float64", c10::toString(dtype));
  if (num_axes < 1) fail(op, "num_axes", "C ≥ 1", std::to_string(num_axes));
  if (head_dim <= 0 || head_dim % 2 != 0)
    fail(op, "head_dim", "a positive even head dimension K", std::to_string(head_dim));
  at::Tensor omega = at::empty({num_axes, head_dim / 2}, at::TensorOptions().dtype(dtype));
  rethrow_as_torch(
      [&] { phasor::nd_rope_axis_split_frequencies(num_axes, head_dim, base, view_of(omega)); });
  return omega;
}

at::Tensor cayley_string(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& omega,
                         const at::Tensor& generator, RotaryLayout rotary_layout) {
  const std::string op = "cayley_string";
  check_float(op, "x", x, 4, "[B, T, H, K]");
  check_float(op, "positions", positions, 3, "[B, T, C]");
  check_float_either_rank(op, "omega", omega, 2, 3, "[C, K/2] or [H, C, K/2]");
  check_float_either_rank(op, "generator", generator, 2, 3, "[K, K] or [H, K, K]");
  const variable_list out =
      CayleyStringFunction::apply(to_compute(x), to_compute(positions), to_compute(omega),
                                  to_compute(generator), rotary_layout);
  return in_dtype_of(out[0], x);
}

at::Tensor circulant_string(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& c) {
  const std::string op = "circulant_string";
  check_float(op, "x", x, 4, "[B, T, H, K]");
  check_float(op, "positions", positions, 3, "[B, T, C]");
  check_float_either_rank(op, "c", c, 2, 3, "[C, K] or [H, C, K]");
  const variable_list out =
      CirculantStringFunction::apply(to_compute(x), to_compute(positions), to_compute(c));
  return in_dtype_of(out[0], x);
}

at::Tensor grape(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                 const at::Tensor& omega, const at::Tensor& positions) {
  const std::string op = "grape";
  check_float(op, "x", x, 4, "[B, T, H, K]");
  check_float_either_rank(op, "a", a, 2, 1, "[H, K] or [K]");
  check_float_either_rank(op, "b", b, 2, 1, "[H, K] or [K]");
  check_float(op, "omega", omega, 1, "[H]");
  check_float_either_rank(op, "positions", positions, 2, 3, "[B, T] or [B, T, H]");
  const variable_list out = GrapeFunction::apply(to_compute(x), to_compute(a), to_compute(b),
                                                 to_compute(omega), to_compute(positions));
  return in_dtype_of(out[0], x);
}

at::Tensor grape_subspace(const at::Tensor& x, const at::Tensor& basis, const at::Tensor& theta,
                          RotaryLayout rotary_layout, double orthogonality_tol) {
  const std::string op = "grape_subspace";
  check_float(op, "x", x, 4, "[B, T, H, K]");
  check_float_either_rank(op, "basis", basis, 2, 3, "[K, K] or [H, K, K]");
  check_float_either_rank(op, "theta", theta, 4, 3, "[B, T, H, K/2] or [B, T, K/2]");
  const variable_list out = GrapeSubspaceFunction::apply(
      to_compute(x), to_compute(basis), to_compute(theta), rotary_layout, orthogonality_tol);
  return in_dtype_of(out[0], x);
}

StructuredDecomposition structured_decomposition(const at::Tensor& generators, double tolerance,
                                                 std::uint64_t seed) {
  const std::string op = "structured_decomposition";
  check_float(op, "generators", generators, 3, "[C, K, K]");
  const at::Tensor g = to_compute(generators).detach();
  const std::int64_t C = g.size(0), K = g.size(2);
  StructuredDecomposition d;
  d.basis = at::empty({K, K}, g.options());
  d.coefficients = at::empty({C, K / 2}, g.options());
  d.active_projector = at::empty({K, K}, g.options());
  d.null_projector = at::empty({K, K}, g.options());
  StructuredDecompositionParams p;
  p.generators = view_of(g);
  p.tolerance = tolerance;
  p.seed = seed;
  StructuredDecompositionOutputs o;
  o.basis = view_of(d.basis), o.coefficients = view_of(d.coefficients);
  o.active_projector = view_of(d.active_projector), o.null_projector = view_of(d.null_projector);
  rethrow_as_torch([&] { d.num_active = phasor::structured_decomposition(p, o); });
  return d;
}

at::Tensor structured_rotation(const at::Tensor& x, const at::Tensor& positions,
                               const at::Tensor& basis, const at::Tensor& coefficients,
                               const c10::optional<at::Tensor>& post_rotation) {
  const std::string op = "structured_rotation";
  check_float(op, "x", x, 4, "[B, T, H, K]");
  check_float_either_rank(op, "positions", positions, 4, 3, "[B, T, H, C] or [B, T, C]");
  check_float(op, "basis", basis, 2, "[K, 2m]");
  check_float(op, "coefficients", coefficients, 2, "[C, m]");
  check_optional_float(op, "post_rotation", post_rotation, 2, "[K, K]");
  check_no_grad(op, "basis", basis,
                "the basis is a function of the generators, recomputed by "
                "structured_decomposition; it receives no gradient");
  const variable_list out =
      StructuredRotationFunction::apply(to_compute(x), to_compute(positions), to_compute(basis),
                                        to_compute(coefficients), to_compute(post_rotation));
  return in_dtype_of(out[0], x);
}

at::Tensor structured_cayley(const at::Tensor& s, const c10::optional<at::Tensor>& null_basis) {
  const std::string op = "structured_cayley";
  check_float(op, "s", s, 2, "[n, n]");
  check_optional_float(op, "null_basis", null_basis, 2, "[K, n]");
  const c10::optional<at::Tensor> n = to_compute(null_basis);
  if (n)
    check_no_grad(op, "null_basis", *n,
                  "the null columns of a decomposition's basis; they receive no gradient");
  return in_dtype_of(StructuredCayleyFunction::apply(to_compute(s), n)[0], s);
}

}  // namespace phasor
