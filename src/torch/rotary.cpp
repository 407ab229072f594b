// The LibTorch layer for the rotary ops (phasor/rotary.h) and the short causal convolution
// (phasor/short_conv.h): one torch::autograd::Function per op, running the core's optimized
// kernels (Impl::chunk) forward and backward.
#include <string>
#include <tuple>

#include "layer_util.h"
#include "phasor/rotary.h"
#include "phasor/short_conv.h"
#include "phasor/torch.h"

namespace phasor {
namespace {

using namespace torch_detail;  // NOLINT(google-build-using-namespace): the layer's own helpers

// ---- Selective RoPE phases ----------------------------------------------------------------------

RotaryPhaseParams phase_params(const at::Tensor& phi, const at::Tensor& omega,
                               const at::Tensor& initial_phase, const at::Tensor& cu) {
  RotaryPhaseParams p;
  p.phi = compute_view_of(phi);
  p.omega = compute_view_of(omega);
  p.initial_phase = compute_view_of(initial_phase);
  p.cu_seqlens = compute_view_of(cu);
  return p;
}

struct SelectiveRopePhasesFunction : torch::autograd::Function<SelectiveRopePhasesFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& phi, const at::Tensor& omega,
                               const c10::optional<at::Tensor>& initial_phase_in,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               bool output_final_phase) {
    const at::Tensor initial_phase = value_or_undefined(initial_phase_in),
                     cu = value_or_undefined(cu_seqlens);
    at::Tensor theta = at::empty(phi.sizes(), phi.options());
    at::Tensor final_phase;
    if (output_final_phase)
      final_phase = at::empty({num_sequences(phi, cu), phi.size(2), phi.size(3)},
                              phi.options().dtype(state_dtype(phi)));
    rethrow_as_torch([&] {
      selective_rope_phases_forward(phase_params(phi, omega, initial_phase, cu), Impl::chunk,
                                    compute_out_view_of(theta), compute_out_view_of(final_phase));
    });
    ctx->save_for_backward({phi, omega, initial_phase, cu});
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(phi), requires_grad(omega), requires_grad(initial_phase)});
    ctx->set_materialize_grads(false);
    if (final_phase.defined()) return {theta, final_phase};
    return {theta};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("selective_rope_phases");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &phi = saved[0], &omega = saved[1], &initial_phase = saved[2], &cu = saved[3];
    const auto need = ctx->saved_data["need"].toBoolList();
    at::Tensor d_theta = incoming_grad(grads, 0), d_final = incoming_grad(grads, 1);
    if (!d_theta.defined()) d_theta = at::zeros_like(phi);
    at::Tensor d_phi = grad_buffer(phi, need[0]), d_omega = grad_buffer(omega, need[1]),
               d_initial = grad_buffer(initial_phase, need[2]);
    rethrow_as_torch([&] {
      RotaryPhaseGrads out;
      out.d_phi = compute_out_view_of(d_phi), out.d_omega = compute_out_view_of(d_omega);
      out.d_initial_phase = compute_out_view_of(d_initial);
      selective_rope_phases_backward(phase_params(phi, omega, initial_phase, cu), Impl::chunk,
                                     compute_view_of(d_theta), compute_view_of(d_final), out);
    });
    return {d_phi, d_omega, d_initial, at::Tensor(), at::Tensor()};
  }
};

// ---- apply_rotary -------------------------------------------------------------------------------

// theta [B, T, R] (shared by heads) as a [B, T, H, R] view with a zero stride over heads.
at::Tensor per_head(const at::Tensor& theta, std::int64_t heads) {
  if (theta.dim() == 4) return theta;
  return theta.unsqueeze(2).expand({theta.size(0), theta.size(1), heads, theta.size(2)});
}

struct ApplyRotaryFunction : torch::autograd::Function<ApplyRotaryFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& theta,
                               RotaryLayout layout) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    rethrow_as_torch([&] {
      apply_rotary_forward(compute_view_of(x), compute_view_of(per_head(theta, x.size(2))), layout,
                           Impl::chunk, compute_out_view_of(y));
    });
    ctx->save_for_backward({x, theta});
    ctx->saved_data["rotary_layout"] = static_cast<std::int64_t>(layout);
    ctx->saved_data["need"] = c10::List<bool>({requires_grad(x), requires_grad(theta)});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("apply_rotary");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &theta = saved[1];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor dy = incoming_grad(grads, 0);
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor theta4 = per_head(theta, x.size(2));
    at::Tensor dx = grad_buffer(x, need[0]);
    // The core writes one angle gradient per head; shared angles get the sum over heads, taken
    // in float32 (or float64) before one rounding to a 16-bit theta's dtype.
    const bool shared = theta.dim() == 3;
    at::Tensor d_theta4 =
        need[1] ? at::empty(theta4.sizes(),
                            shared ? theta.options().dtype(state_dtype(theta)) : theta.options())
                : at::Tensor();
    rethrow_as_torch([&] {
      apply_rotary_backward(compute_view_of(x), compute_view_of(theta4), saved_layout(ctx),
                            Impl::chunk, compute_view_of(dy), compute_out_view_of(dx),
                            compute_out_view_of(d_theta4));
    });
    at::Tensor d_theta = d_theta4;
    if (d_theta4.defined() && shared) d_theta = d_theta4.sum(2).to(theta.scalar_type());
    return {dx, d_theta, at::Tensor()};
  }
};

// ---- causal_conv1d ------------------------------------------------------------------------------

ShortConvParams conv_params(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& initial_state, const at::Tensor& cu,
                            const std::string& activation) {
  ShortConvParams p;
  p.x = compute_view_of(x);
  p.weight = compute_view_of(weight);
  p.bias = compute_view_of(bias);
  p.initial_cache = compute_view_of(initial_state);
  p.cu_seqlens = compute_view_of(cu);
  p.activation = activation;
  return p;
}

struct CausalConv1dFunction : torch::autograd::Function<CausalConv1dFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const c10::optional<at::Tensor>& bias_in,
                               const c10::optional<at::Tensor>& initial_state_in,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const std::string& activation, bool output_final_state) {
    const at::Tensor bias = value_or_undefined(bias_in),
                     initial_state = value_or_undefined(initial_state_in),
                     cu = value_or_undefined(cu_seqlens);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor final_state;
    if (output_final_state)
      final_state = at::empty({num_sequences(x, cu), x.size(2), weight.size(1) - 1},
                              x.options().dtype(state_dtype(x)));
    rethrow_as_torch([&] {
      short_conv_forward(conv_params(x, weight, bias, initial_state, cu, activation), Impl::chunk,
                         compute_out_view_of(y), compute_out_view_of(final_state));
    });
    ctx->save_for_backward({x, weight, bias, initial_state, cu});
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["need"] = c10::List<bool>({requires_grad(x), requires_grad(weight),
                                               requires_grad(bias), requires_grad(initial_state)});
    ctx->set_materialize_grads(false);
    if (final_state.defined()) return {y, final_state};
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("causal_conv1d");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &bias = saved[2], &initial_state = saved[3],
                     &cu = saved[4];
    const auto need = ctx->saved_data["need"].toBoolList();
    at::Tensor dy = incoming_grad(grads, 0), d_final = incoming_grad(grads, 1);
    if (!dy.defined()) dy = at::zeros_like(x);
    at::Tensor dx = grad_buffer(x, need[0]), dweight = grad_buffer(weight, need[1]),
               dbias = grad_buffer(bias, need[2]), dinitial = grad_buffer(initial_state, need[3]);
    rethrow_as_torch([&] {
      ShortConvGrads out;
      out.dx = compute_out_view_of(dx), out.dweight = compute_out_view_of(dweight);
      out.dbias = compute_out_view_of(dbias), out.dinitial_cache = compute_out_view_of(dinitial);
      short_conv_backward(conv_params(x, weight, bias, initial_state, cu,
                                      ctx->saved_data["activation"].toStringRef()),
                          Impl::chunk, compute_view_of(dy), compute_view_of(d_final), out);
    });
    return {dx, dweight, dbias, dinitial, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::tuple<at::Tensor, c10::optional<at::Tensor>> selective_rope_phases(
    const at::Tensor& phi, const at::Tensor& omega, const c10::optional<at::Tensor>& initial_phase,
    bool output_final_phase, const c10::optional<at::Tensor>& cu_seqlens) {
  const std::string op = "selective_rope_phases";
  check_float(op, "phi", phi, 4, "[B, T, H, R]");
  check_float_either_rank(op, "omega", omega, 2, 1, "[H, R] or [R]");
  check_optional_float(op, "initial_phase", initial_phase, 3, "[N, H, R]");
  check_cu_seqlens(op, cu_seqlens);
  check_compute_device(op);
  const variable_list out =
      SelectiveRopePhasesFunction::apply(phi, omega, initial_phase, cu_seqlens, output_final_phase);
  c10::optional<at::Tensor> final_phase;
  if (output_final_phase) final_phase = out[1];
  return {out[0], final_phase};
}

at::Tensor rope_angles(std::int64_t batch, std::int64_t seq_len, std::int64_t head_dim, double base,
                       std::int64_t offset, const c10::optional<at::Tensor>& cu_seqlens,
                       at::ScalarType dtype) {
  const std::string op = "rope_angles";
  if (dtype != at::kFloat && dtype != at::kDouble)
    fail(op, "dtype", "float32 or float64", c10::toString(dtype));
  check_cu_seqlens(op, cu_seqlens);
  check_compute_device(op);
  RopeAnglesParams p;
  p.B = batch, p.T = seq_len, p.head_dim = head_dim, p.base = base, p.offset = offset;
  const at::Tensor cu = value_or_undefined(cu_seqlens);
  if (batch < 0 || seq_len < 0)
    fail(op, batch < 0 ? "batch" : "seq_len", "a size ≥ 0",
         std::to_string(batch < 0 ? batch : seq_len));
  if (head_dim <= 0 || head_dim % 2 != 0)
    fail(op, "head_dim", "a positive even head dimension K", std::to_string(head_dim));
  at::Tensor theta = at::empty({batch, seq_len, head_dim / 2}, at::TensorOptions().dtype(dtype));
  // The core writes [B, T, R]: angles depend on the position only and are shared by all heads.
  rethrow_as_torch([&] {
    p.cu_seqlens = compute_view_of(cu);
    phasor::rope_angles(p, Impl::chunk, compute_out_view_of(theta));
  });
  return theta;
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& theta, RotaryLayout rotary_layout) {
  const std::string op = "apply_rotary";
  check_float(op, "x", x, 4, "[B, T, H, K]");
  check_float_either_rank(op, "theta", theta, 4, 3, "[B, T, H, K/2] or [B, T, K/2]");
  check_compute_device(op);
  return ApplyRotaryFunction::apply(x, theta, rotary_layout)[0];
}

std::tuple<at::Tensor, c10::optional<at::Tensor>> causal_conv1d(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const std::string& activation, const c10::optional<at::Tensor>& initial_state,
    bool output_final_state, const c10::optional<at::Tensor>& cu_seqlens) {
  const std::string op = "causal_conv1d";
  check_float(op, "x", x, 3, "[B, T, D]");
  check_float(op, "weight", weight, 2, "[D, W]");
  check_optional_float(op, "bias", bias, 1, "[D]");
  check_optional_float(op, "initial_state", initial_state, 3, "[N, D, W-1]");
  check_cu_seqlens(op, cu_seqlens);
  check_compute_device(op);
  if (weight.size(1) < 1)
    fail(op, "weight", "a kernel width W ≥ 1", "weight of shape " + shape_of(weight));
  const variable_list out = CausalConv1dFunction::apply(x, weight, bias, initial_state, cu_seqlens,
                                                        activation, output_final_state);
  c10::optional<at::Tensor> final_state;
  if (output_final_state) final_state = out[1];
  return {out[0], final_state};
}

}  // namespace phasor
