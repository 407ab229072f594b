// The LibTorch layer: at::Tensor → TensorView conversion, argument checks, and one
// torch::autograd::Function per op whose forward runs the core *_forward and whose backward runs
// the core *_backward with the same Impl.
#include "phasor/torch.h"

#include <initializer_list>
#include <string>

#include "layer_util.h"
#include "phasor/forgetting_attn.h"
#include "phasor/gated_delta_rule.h"
#include "phasor/gla.h"

namespace phasor {
namespace {

using namespace torch_detail;  // NOLINT(google-build-using-namespace): the layer's own helpers

// ---- GLA ----------------------------------------------------------------------------------------

struct GlaOptions {
  Impl impl;
  c10::optional<double> scale;
  bool output_final_state;
  std::int64_t chunk_size;
  RotaryLayout rotary_layout;
  bool keep_chunk_states;  // the forward keeps the chunk states for the backward
};

// Whether a chunk forward keeps its chunk states for the backward (phasor/gla.h, chunk_states):
// when autograd records the call (grad mode on, an input that requires grad) and a sequence may
// span more than one chunk (with one chunk the backward replays nothing). Under no_grad, as in
// torch.utils.checkpoint's first pass, nothing is kept; nor for CPU tensors computed on a GPU
// (set_compute_device(Device::cuda)), whose states would cross to the host and back.
bool keep_chunk_states(Impl impl, const at::Tensor& q, std::int64_t chunk_size,
                       std::initializer_list<c10::optional<at::Tensor>> inputs) {
  if (impl != Impl::chunk || !at::GradMode::is_enabled() || q.size(1) <= chunk_size ||
      (q.is_cpu() && compute_device() == Device::cuda))
    return false;
  for (const auto& x : inputs)
    if (x && requires_grad(*x)) return true;
  return false;
}

// The chunk states a forward keeps: [num_chunk_states, H, K, V] in the states' dtype.
at::Tensor chunk_state_buffer(const at::Tensor& q, const at::Tensor& cu, std::int64_t H,
                              std::int64_t K, std::int64_t V, std::int64_t chunk_size) {
  const std::int64_t count = num_chunk_states(view_of(q), view_of(cu), chunk_size);  // sizes only
  return at::empty({count, H, K, V}, q.options().dtype(state_dtype(q)));
}

GlaParams gla_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& g, const at::Tensor& h0, const at::Tensor& cu,
                     const at::Tensor& theta, c10::optional<double> scale, std::int64_t chunk_size,
                     RotaryLayout rotary_layout) {
  GlaParams p;
  p.q = compute_view_of(q), p.k = compute_view_of(k), p.v = compute_view_of(v);
  p.g = compute_view_of(g);
  p.initial_state = compute_view_of(h0);
  p.cu_seqlens = compute_view_of(cu);
  if (scale) p.scale = *scale;
  p.chunk_size = chunk_size;
  p.theta = compute_view_of(theta);
  p.rotary_layout = rotary_layout;
  return p;
}

struct GlaFunction : torch::autograd::Function<GlaFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g,
                               const c10::optional<at::Tensor>& initial_state,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const c10::optional<at::Tensor>& theta_in, const GlaOptions& opt) {
    const at::Tensor h0 = value_or_undefined(initial_state), cu = value_or_undefined(cu_seqlens),
                     theta = value_or_undefined(theta_in);
    at::Tensor o = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    at::Tensor ht;
    if (opt.output_final_state)
      ht = at::empty({num_sequences(q, cu), q.size(2), q.size(3), v.size(3)},
                     q.options().dtype(state_dtype(q)));
    at::Tensor kept;
    rethrow_as_torch([&] {
      const GlaParams p =
          gla_params(q, k, v, g, h0, cu, theta, opt.scale, opt.chunk_size, opt.rotary_layout);
      if (opt.keep_chunk_states)
        kept = chunk_state_buffer(q, cu, q.size(2), q.size(3), v.size(3), opt.chunk_size);
      gla_forward(p, opt.impl, compute_out_view_of(o), compute_out_view_of(ht),
                  compute_out_view_of(kept));
    });

    ctx->save_for_backward({q, k, v, g, h0, cu, theta, kept});
    ctx->saved_data["impl"] = static_cast<std::int64_t>(opt.impl);
    ctx->saved_data["scale"] = optional_double(opt.scale);
    ctx->saved_data["chunk_size"] = opt.chunk_size;
    ctx->saved_data["rotary_layout"] = static_cast<std::int64_t>(opt.rotary_layout);
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(q), requires_grad(k), requires_grad(v), requires_grad(g),
                         requires_grad(h0), requires_grad(theta)});
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined (= zero)
    if (ht.defined()) return {o, ht};
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order(gla_op_name(static_cast<Impl>(ctx->saved_data["impl"].toInt())));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &h0 = saved[4],
                     &cu = saved[5], &theta = saved[6], &kept = saved[7];
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const auto need = ctx->saved_data["need"].toBoolList();

    at::Tensor d_o = incoming_grad(grads, 0), dht = incoming_grad(grads, 1);
    if (!d_o.defined()) d_o = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    at::Tensor dq = grad_buffer(q, need[0]), dk = grad_buffer(k, need[1]),
               dv = grad_buffer(v, need[2]), dg = grad_buffer(g, need[3]),
               dh0 = grad_buffer(h0, need[4]), dtheta = grad_buffer(theta, need[5]);
    rethrow_as_torch([&] {
      const GlaParams p =
          gla_params(q, k, v, g, h0, cu, theta, to_optional_double(ctx->saved_data["scale"]),
                     ctx->saved_data["chunk_size"].toInt(), saved_layout(ctx));
      GlaGrads out;
      out.dq = compute_out_view_of(dq), out.dk = compute_out_view_of(dk);
      out.dv = compute_out_view_of(dv), out.dg = compute_out_view_of(dg);
      out.dh0 = compute_out_view_of(dh0), out.dtheta = compute_out_view_of(dtheta);
      gla_backward(p, impl, compute_view_of(d_o), compute_view_of(dht), out, compute_view_of(kept));
    });
    return {dq, dk, dv, dg, dh0, at::Tensor(), dtheta, at::Tensor()};
  }
};

// ---- Gated DeltaNet -----------------------------------------------------------------------------

struct GatedDeltaRuleOptions {
  Impl impl;
  c10::optional<double> scale;
  bool output_final_state;
  bool use_qk_l2norm_in_kernel;
  std::int64_t chunk_size;
  RotaryLayout rotary_layout;
  bool keep_chunk_states;  // the forward keeps the chunk states for the backward
};

GatedDeltaRuleParams gated_delta_rule_params(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& g,
                                             const at::Tensor& beta, const at::Tensor& h0,
                                             const at::Tensor& cu, const at::Tensor& theta,
                                             c10::optional<double> scale,
                                             bool use_qk_l2norm_in_kernel, std::int64_t chunk_size,
                                             RotaryLayout rotary_layout) {
  GatedDeltaRuleParams p;
  p.q = compute_view_of(q), p.k = compute_view_of(k), p.v = compute_view_of(v);
  p.g = compute_view_of(g), p.beta = compute_view_of(beta);
  p.initial_state = compute_view_of(h0);
  p.cu_seqlens = compute_view_of(cu);
  if (scale) p.scale = *scale;
  p.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  p.chunk_size = chunk_size;
  p.theta = compute_view_of(theta);
  p.rotary_layout = rotary_layout;
  return p;
}

struct GatedDeltaRuleFunction : torch::autograd::Function<GatedDeltaRuleFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                               const c10::optional<at::Tensor>& initial_state,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const c10::optional<at::Tensor>& theta_in,
                               const GatedDeltaRuleOptions& opt) {
    const at::Tensor h0 = value_or_undefined(initial_state), cu = value_or_undefined(cu_seqlens),
                     theta = value_or_undefined(theta_in);
    // Value heads HV and V come from v: o is [B, T, HV, V], states [N, HV, K, V].
    at::Tensor o = at::empty({q.size(0), q.size(1), v.size(2), v.size(3)}, q.options());
    at::Tensor ht;
    if (opt.output_final_state)
      ht = at::empty({num_sequences(q, cu), v.size(2), q.size(3), v.size(3)},
                     q.options().dtype(state_dtype(q)));
    at::Tensor kept, kept_v_new;
    rethrow_as_torch([&] {
      const GatedDeltaRuleParams p =
          gated_delta_rule_params(q, k, v, g, beta, h0, cu, theta, opt.scale,
                                  opt.use_qk_l2norm_in_kernel, opt.chunk_size, opt.rotary_layout);
      if (opt.keep_chunk_states) {
        kept = chunk_state_buffer(q, cu, v.size(2), q.size(3), v.size(3), opt.chunk_size);
        // U_new beside the states (phasor/gated_delta_rule.h, v_new): on the cpu only, where
        // the backward reads it in place of its solve (the GPU kernels form it themselves).
        if (q.is_cpu() && compute_device() == Device::cpu)
          kept_v_new = at::empty(v.sizes(), v.options().dtype(state_dtype(q)));
      }
      gated_delta_rule_forward(p, opt.impl, compute_out_view_of(o), compute_out_view_of(ht),
                               compute_out_view_of(kept), compute_out_view_of(kept_v_new));
    });

    ctx->save_for_backward({q, k, v, g, beta, h0, cu, theta, kept, kept_v_new});
    ctx->saved_data["impl"] = static_cast<std::int64_t>(opt.impl);
    ctx->saved_data["scale"] = optional_double(opt.scale);
    ctx->saved_data["l2norm"] = opt.use_qk_l2norm_in_kernel;
    ctx->saved_data["chunk_size"] = opt.chunk_size;
    ctx->saved_data["rotary_layout"] = static_cast<std::int64_t>(opt.rotary_layout);
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(q), requires_grad(k), requires_grad(v), requires_grad(g),
                         requires_grad(beta), requires_grad(h0), requires_grad(theta)});
    ctx->set_materialize_grads(false);
    if (ht.defined()) return {o, ht};
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order(gated_delta_rule_op_name(static_cast<Impl>(ctx->saved_data["impl"].toInt())));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &beta = saved[4],
                     &h0 = saved[5], &cu = saved[6], &theta = saved[7], &kept = saved[8],
                     &kept_v_new = saved[9];
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const auto need = ctx->saved_data["need"].toBoolList();

    at::Tensor d_o = incoming_grad(grads, 0), dht = incoming_grad(grads, 1);
    if (!d_o.defined()) d_o = at::zeros({q.size(0), q.size(1), v.size(2), v.size(3)}, q.options());
    at::Tensor dq = grad_buffer(q, need[0]), dk = grad_buffer(k, need[1]),
               dv = grad_buffer(v, need[2]), dg = grad_buffer(g, need[3]),
               dbeta = grad_buffer(beta, need[4]), dh0 = grad_buffer(h0, need[5]),
               dtheta = grad_buffer(theta, need[6]);
    rethrow_as_torch([&] {
      const GatedDeltaRuleParams p = gated_delta_rule_params(
          q, k, v, g, beta, h0, cu, theta, to_optional_double(ctx->saved_data["scale"]),
          ctx->saved_data["l2norm"].toBool(), ctx->saved_data["chunk_size"].toInt(),
          saved_layout(ctx));
      GatedDeltaRuleGrads out;
      out.dq = compute_out_view_of(dq), out.dk = compute_out_view_of(dk);
      out.dv = compute_out_view_of(dv), out.dg = compute_out_view_of(dg);
      out.dbeta = compute_out_view_of(dbeta), out.dh0 = compute_out_view_of(dh0);
      out.dtheta = compute_out_view_of(dtheta);
      gated_delta_rule_backward(p, impl, compute_view_of(d_o), compute_view_of(dht), out,
                                compute_view_of(kept), compute_view_of(kept_v_new));
    });
    return {dq, dk, dv, dg, dbeta, dh0, at::Tensor(), dtheta, at::Tensor()};
  }
};

// ---- Forgetting attention -----------------------------------------------------------------------

struct ForgettingAttnOptions {
  Impl impl;
  c10::optional<double> scale;
  c10::optional<std::int64_t> window_size;
  std::int64_t block_size;
  RotaryLayout rotary_layout;
};

ForgettingAttnParams forgetting_attn_params(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& cu, const at::Tensor& theta, c10::optional<double> scale,
    c10::optional<std::int64_t> window_size, std::int64_t block_size, RotaryLayout rotary_layout,
    const at::Tensor& bias_q_slope, const at::Tensor& bias_k_slope) {
  ForgettingAttnParams p;
  p.q = compute_view_of(q), p.k = compute_view_of(k), p.v = compute_view_of(v);
  p.g = compute_view_of(g);
  p.cu_seqlens = compute_view_of(cu);
  if (scale) p.scale = *scale;
  if (window_size) p.window_size = *window_size;
  p.block_size = block_size;
  p.theta = compute_view_of(theta);
  p.rotary_layout = rotary_layout;
  p.bias_q_slope = compute_view_of(bias_q_slope);
  p.bias_k_slope = compute_view_of(bias_k_slope);
  return p;
}

struct ForgettingAttnFunction : torch::autograd::Function<ForgettingAttnFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const c10::optional<at::Tensor>& theta_in,
                               const c10::optional<at::Tensor>& bias_q_slope_in,
                               const c10::optional<at::Tensor>& bias_k_slope_in,
                               const ForgettingAttnOptions& opt) {
    const at::Tensor cu = value_or_undefined(cu_seqlens), theta = value_or_undefined(theta_in),
                     sq = value_or_undefined(bias_q_slope_in),
                     sk = value_or_undefined(bias_k_slope_in);
    // The backward reads o (in D_i = do_i·o_i): a 16-bit o would add its rounding error there. So
    // o is computed in the compute type (float32 for float16/bfloat16 q), kept for the backward,
    // and returned in q's dtype.
    at::Tensor o =
        at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options().dtype(state_dtype(q)));
    // The per-row log-sum-exp, kept so the backward pass need not recompute the forward.
    at::Tensor lse =
        at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(state_dtype(q)));
    rethrow_as_torch([&] {
      const ForgettingAttnParams p =
          forgetting_attn_params(q, k, v, g, cu, theta, opt.scale, opt.window_size, opt.block_size,
                                 opt.rotary_layout, sq, sk);
      forgetting_attn_forward(p, opt.impl, compute_out_view_of(o), compute_out_view_of(lse));
    });

    ctx->save_for_backward({q, k, v, g, cu, o, lse, theta, sq, sk});
    ctx->saved_data["rotary_layout"] = static_cast<std::int64_t>(opt.rotary_layout);
    ctx->saved_data["impl"] = static_cast<std::int64_t>(opt.impl);
    ctx->saved_data["scale"] = optional_double(opt.scale);
    ctx->saved_data["window_size"] =
        opt.window_size ? c10::IValue(*opt.window_size) : c10::IValue();
    ctx->saved_data["block_size"] = opt.block_size;
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(q), requires_grad(k), requires_grad(v), requires_grad(g),
                         requires_grad(theta), requires_grad(sq), requires_grad(sk)});
    ctx->set_materialize_grads(false);
    return {o.scalar_type() == q.scalar_type() ? o : o.to(q.scalar_type())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order(forgetting_attn_op_name(static_cast<Impl>(ctx->saved_data["impl"].toInt())));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &cu = saved[4],
                     &o = saved[5], &lse = saved[6], &theta = saved[7], &sq = saved[8],
                     &sk = saved[9];
    const auto& window = ctx->saved_data["window_size"];
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const auto need = ctx->saved_data["need"].toBoolList();

    at::Tensor d_o = incoming_grad(grads, 0);
    if (!d_o.defined()) d_o = at::zeros_like(o);
    at::Tensor dq = grad_buffer(q, need[0]), dk = grad_buffer(k, need[1]),
               dv = grad_buffer(v, need[2]), dg = grad_buffer(g, need[3]),
               dtheta = grad_buffer(theta, need[4]), dsq = grad_buffer(sq, need[5]),
               dsk = grad_buffer(sk, need[6]);
    rethrow_as_torch([&] {
      const ForgettingAttnParams p = forgetting_attn_params(
          q, k, v, g, cu, theta, to_optional_double(ctx->saved_data["scale"]),
          window.isNone() ? c10::nullopt : c10::optional<std::int64_t>(window.toInt()),
          ctx->saved_data["block_size"].toInt(), saved_layout(ctx), sq, sk);
      ForgettingAttnGrads out;
      out.dq = compute_out_view_of(dq), out.dk = compute_out_view_of(dk);
      out.dv = compute_out_view_of(dv), out.dg = compute_out_view_of(dg);
      out.dtheta = compute_out_view_of(dtheta);
      out.dbias_q_slope = compute_out_view_of(dsq), out.dbias_k_slope = compute_out_view_of(dsk);
      forgetting_attn_backward(p, impl, compute_view_of(d_o), compute_view_of(o),
                               compute_view_of(lse), out);
    });
    return {dq, dk, dv, dg, at::Tensor(), dtheta, dsq, dsk, at::Tensor()};
  }
};

}  // namespace

// ---- public entry points ------------------------------------------------------------------------

OutputAndState gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& g, Impl impl, c10::optional<double> scale,
                   const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                   const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size,
                   const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout) {
  const std::string op = gla_op_name(impl);
  check_float(op, "q", q, 4, "[B, T, H, K]");
  check_float(op, "k", k, 4, "[B, T, H, K]");
  check_float(op, "v", v, 4, "[B, T, H, V]");
  check_float(op, "g", g, 4, "[B, T, H, K]");
  check_optional_float(op, "initial_state", initial_state, 4, "[N, H, K, V]");
  check_cu_seqlens(op, cu_seqlens);
  check_optional_float(op, "theta", theta, 4, "[B, T, H, K/2]");
  check_compute_device(op);
  const variable_list out = GlaFunction::apply(
      q, k, v, g, initial_state, cu_seqlens, theta,
      GlaOptions{impl, scale, output_final_state, chunk_size, rotary_layout,
                 keep_chunk_states(impl, q, chunk_size, {q, k, v, g, initial_state, theta})});
  c10::optional<at::Tensor> final_state;
  if (output_final_state) final_state = out[1];
  return {out[0], final_state};
}

OutputAndState chunk_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& g, c10::optional<double> scale,
                         const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                         const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size,
                         const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout) {
  return gla(q, k, v, g, Impl::chunk, scale, initial_state, output_final_state, cu_seqlens,
             chunk_size, theta, rotary_layout);
}

OutputAndState fused_recurrent_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, c10::optional<double> scale,
                                   const c10::optional<at::Tensor>& initial_state,
                                   bool output_final_state,
                                   const c10::optional<at::Tensor>& cu_seqlens,
                                   const c10::optional<at::Tensor>& theta,
                                   RotaryLayout rotary_layout) {
  return gla(q, k, v, g, Impl::recurrent, scale, initial_state, output_final_state, cu_seqlens, 64,
             theta, rotary_layout);
}

OutputAndState gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, Impl impl, c10::optional<double> scale,
    const c10::optional<at::Tensor>& initial_state, bool output_final_state,
    const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
    std::int64_t chunk_size, const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout) {
  const std::string op = gated_delta_rule_op_name(impl);
  check_float(op, "q", q, 4, "[B, T, H, K]");
  check_float(op, "k", k, 4, "[B, T, H, K]");
  check_float(op, "v", v, 4, "[B, T, HV, V]");
  check_float(op, "g", g, 3, "[B, T, HV]");
  check_float(op, "beta", beta, 3, "[B, T, HV]");
  check_optional_float(op, "initial_state", initial_state, 4, "[N, HV, K, V]");
  check_cu_seqlens(op, cu_seqlens);
  check_optional_float(op, "theta", theta, 4, "[B, T, H, K/2]");
  check_compute_device(op);
  const variable_list out = GatedDeltaRuleFunction::apply(
      q, k, v, g, beta, initial_state, cu_seqlens, theta,
      GatedDeltaRuleOptions{
          impl, scale, output_final_state, use_qk_l2norm_in_kernel, chunk_size, rotary_layout,
          // On a GPU the backward's state kernel runs anyway (it also forms U_new): only the CPU
          // kernels read kept states.
          q.is_cpu() && compute_device() == Device::cpu &&
              keep_chunk_states(impl, q, chunk_size, {q, k, v, g, beta, initial_state, theta})});
  c10::optional<at::Tensor> final_state;
  if (output_final_state) final_state = out[1];
  return {out[0], final_state};
}

OutputAndState chunk_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, c10::optional<double> scale,
    const c10::optional<at::Tensor>& initial_state, bool output_final_state,
    const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
    std::int64_t chunk_size, const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout) {
  return gated_delta_rule(q, k, v, g, beta, Impl::chunk, scale, initial_state, output_final_state,
                          cu_seqlens, use_qk_l2norm_in_kernel, chunk_size, theta, rotary_layout);
}

OutputAndState fused_recurrent_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, c10::optional<double> scale,
    const c10::optional<at::Tensor>& initial_state, bool output_final_state,
    const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
    const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout) {
  return gated_delta_rule(q, k, v, g, beta, Impl::recurrent, scale, initial_state,
                          output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, 64, theta,
                          rotary_layout);
}

at::Tensor forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& g, Impl impl, c10::optional<double> scale,
                           c10::optional<std::int64_t> window_size,
                           const c10::optional<at::Tensor>& cu_seqlens, std::int64_t block_size,
                           const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                           const c10::optional<at::Tensor>& bias_q_slope,
                           const c10::optional<at::Tensor>& bias_k_slope) {
  const std::string op = forgetting_attn_op_name(impl);
  check_float(op, "q", q, 4, "[B, T, HQ, K]");
  check_float(op, "k", k, 4, "[B, T, H, K]");
  check_float(op, "v", v, 4, "[B, T, H, V]");
  check_float(op, "g", g, 3, "[B, T, HQ]");
  check_cu_seqlens(op, cu_seqlens);
  check_optional_float(op, "theta", theta, 4, "[B, T, H, K/2]");
  check_optional_float(op, "bias_q_slope", bias_q_slope, 3, "[B, T, HQ]");
  check_optional_float(op, "bias_k_slope", bias_k_slope, 3, "[B, T, H]");
  check_compute_device(op);
  const variable_list out = ForgettingAttnFunction::apply(
      q, k, v, g, cu_seqlens, theta, bias_q_slope, bias_k_slope,
      ForgettingAttnOptions{impl, scale, window_size, block_size, rotary_layout});
  return out[0];
}

at::Tensor parallel_forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, c10::optional<double> scale,
                                    c10::optional<std::int64_t> window_size,
                                    const c10::optional<at::Tensor>& cu_seqlens,
                                    std::int64_t block_size, const c10::optional<at::Tensor>& theta,
                                    RotaryLayout rotary_layout,
                                    const c10::optional<at::Tensor>& bias_q_slope,
                                    const c10::optional<at::Tensor>& bias_k_slope) {
  return forgetting_attn(q, k, v, g, Impl::chunk, scale, window_size, cu_seqlens, block_size, theta,
                         rotary_layout, bias_q_slope, bias_k_slope);
}

// ---- FoX decoding -------------------------------------------------------------------------------

namespace {
ForgettingAttnCache make_cache(std::int64_t batch, std::int64_t num_q_heads,
                               std::int64_t num_kv_heads, std::int64_t head_dim,
                               std::int64_t value_dim, c10::optional<std::int64_t> window_size) {
  std::optional<std::int64_t> window;
  if (window_size) window = *window_size;
  try {
    return ForgettingAttnCache(batch, num_q_heads, num_kv_heads, head_dim, value_dim, window);
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}
}  // namespace

ForgettingAttnDecoder::ForgettingAttnDecoder(std::int64_t batch, std::int64_t num_q_heads,
                                             std::int64_t num_kv_heads, std::int64_t head_dim,
                                             std::int64_t value_dim,
                                             c10::optional<std::int64_t> window_size,
                                             c10::optional<double> scale)
    : cache_(make_cache(batch, num_q_heads, num_kv_heads, head_dim, value_dim, window_size)),
      num_q_heads_(num_q_heads),
      value_dim_(value_dim),
      scale_(scale) {}

at::Tensor ForgettingAttnDecoder::step(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& g,
                                       const c10::optional<at::Tensor>& theta,
                                       RotaryLayout rotary_layout,
                                       const c10::optional<at::Tensor>& bias_q_slope,
                                       const c10::optional<at::Tensor>& bias_k_slope) {
  const std::string op = "ForgettingAttnDecoder::step";
  check_float(op, "q", q, 4, "[B, 1, HQ, K]");
  check_float(op, "k", k, 4, "[B, 1, H, K]");
  check_float(op, "v", v, 4, "[B, 1, H, V]");
  check_float(op, "g", g, 3, "[B, 1, HQ]");
  check_optional_float(op, "theta", theta, 4, "[B, 1, H, K/2]");
  check_optional_float(op, "bias_q_slope", bias_q_slope, 3, "[B, 1, HQ]");
  check_optional_float(op, "bias_k_slope", bias_k_slope, 3, "[B, 1, H]");
  check_compute_device(op);
  at::NoGradGuard no_grad;
  at::Tensor o = at::empty({q.size(0), q.size(1), num_q_heads_, value_dim_}, q.options());
  std::optional<double> scale;
  if (scale_) scale = *scale_;
  rethrow_as_torch([&] {
    cache_.step(compute_view_of(q), compute_view_of(k), compute_view_of(v), compute_view_of(g),
                compute_out_view_of(o), scale, compute_view_of(value_or_undefined(theta)),
                rotary_layout, compute_view_of(value_or_undefined(bias_q_slope)),
                compute_view_of(value_or_undefined(bias_k_slope)));
  });
  return o;
}

std::int64_t ForgettingAttnDecoder::length() const {
  return cache_.length();
}

void ForgettingAttnDecoder::reset() {
  cache_.reset();
}

}  // namespace phasor
