// The LibTorch layer: at::Tensor → TensorView conversion, argument checks, and one
// torch::autograd::Function per op whose forward runs the core *_forward and whose backward runs
// the core *_backward with the same Impl.
#include "phasor/torch.h"

#include <torch/autograd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

#include "phasor/forgetting_attn.h"
#include "phasor/gated_delta_rule.h"
#include "phasor/gla.h"

namespace phasor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- names --------------------------------------------------------------------------------------

// The op name used in messages: fla's name for the implementation (as the core uses).
std::string gla_op_name(Impl impl) {
  switch (impl) {
    case Impl::chunk:
      return "chunk_gla";
    case Impl::recurrent:
      return "fused_recurrent_gla";
    case Impl::reference:
      break;
  }
  return "gla_reference";
}
std::string gated_delta_rule_op_name(Impl impl) {
  switch (impl) {
    case Impl::chunk:
      return "chunk_gated_delta_rule";
    case Impl::recurrent:
      return "fused_recurrent_gated_delta_rule";
    case Impl::reference:
      break;
  }
  return "gated_delta_rule_reference";
}
std::string forgetting_attn_op_name(Impl impl) {
  switch (impl) {
    case Impl::chunk:
      return "parallel_forgetting_attn";
    case Impl::recurrent:
      return "forgetting_attn_recurrent";
    case Impl::reference:
      break;
  }
  return "forgetting_attn_reference";
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// ---- torch-side checks --------------------------------------------------------------------------
// Messages follow the core's format: "<op>: argument '<name>': expected <...>, got <...>".

[[noreturn]] void fail(const std::string& op, const std::string& name, const std::string& expected,
                       const std::string& got) {
  TORCH_CHECK(false, op, ": argument '", name, "': expected ", expected, ", got ", got);
  std::abort();  // unreachable: TORCH_CHECK(false, ...) always throws
}

bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// A defined, dense, CPU tensor of the given rank. `layout` documents the expected dimensions.
void check_tensor(const std::string& op, const std::string& name, const at::Tensor& t, int rank,
                  const char* layout) {
  if (!t.defined()) fail(op, name, std::string("a tensor ") + layout, "an undefined tensor");
  if (!t.device().is_cpu())
    fail(op, name, "a tensor on the cpu", "a tensor on " + t.device().str());
  if (t.layout() != at::kStrided) fail(op, name, "a dense (strided) tensor", "a sparse tensor");
  if (t.dim() != rank)
    fail(op, name, std::to_string(rank) + "-D tensor " + layout,
         std::to_string(t.dim()) + "-D tensor of shape " + shape_of(t));
}

void check_float(const std::string& op, const std::string& name, const at::Tensor& t, int rank,
                 const char* layout) {
  check_tensor(op, name, t, rank, layout);
  if (!is_float_dtype(t.scalar_type()))
    fail(op, name, "a floating dtype (float32, float64, float16 or bfloat16)",
         std::string("dtype ") + c10::toString(t.scalar_type()));
}

void check_optional_float(const std::string& op, const std::string& name,
                          const c10::optional<at::Tensor>& t, int rank, const char* layout) {
  if (t.has_value() && t->defined()) check_float(op, name, *t, rank, layout);
}

void check_cu_seqlens(const std::string& op, const c10::optional<at::Tensor>& cu) {
  if (!cu.has_value() || !cu->defined()) return;
  check_tensor(op, "cu_seqlens", *cu, 1, "[N + 1]");
  if (cu->scalar_type() != at::kInt && cu->scalar_type() != at::kLong)
    fail(op, "cu_seqlens", "dtype int32 or int64",
         std::string("dtype ") + c10::toString(cu->scalar_type()));
}

// ---- conversion ---------------------------------------------------------------------------------

// The one place an at::Tensor becomes a TensorView: same memory, sizes, strides (in elements, as
// in torch), dtype and device. Callers have checked device, layout, rank and dtype; half and
// bfloat16 never get here (they are converted to float32 first).
TensorView view_of(const at::Tensor& t) {
  TensorView v;
  if (!t.defined()) return v;  // absent optional
  TORCH_INTERNAL_ASSERT(t.dim() <= TensorView::kMaxRank, "rank ", t.dim(), " > 4");
  switch (t.scalar_type()) {
    case at::kFloat:
      v.dtype = DType::float32;
      break;
    case at::kDouble:
      v.dtype = DType::float64;
      break;
    case at::kInt:
      v.dtype = DType::int32;
      break;
    case at::kLong:
      v.dtype = DType::int64;
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "unsupported dtype ", t.scalar_type());
  }
  v.device = t.device().is_cpu() ? Device::cpu : Device::cuda;
  v.data = t.data_ptr();
  v.rank = static_cast<int>(t.dim());
  for (int d = 0; d < v.rank; ++d) {
    v.sizes[static_cast<std::size_t>(d)] = t.size(d);
    v.strides[static_cast<std::size_t>(d)] = t.stride(d);
  }
  return v;
}

at::Tensor value_or_undefined(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// float16/bfloat16 → float32 (differentiable, so their gradients come back in their dtype);
// float32/float64 pass through untouched.
at::Tensor to_compute(const at::Tensor& t) {
  if (t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16))
    return t.to(at::kFloat);
  return t;
}
c10::optional<at::Tensor> to_compute(const c10::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return c10::nullopt;
  return to_compute(*t);
}

// Runs a core call; a phasor::Error becomes a c10::Error with the same message.
template <class F>
void rethrow_as_torch(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// Number of sequences: N + 1 entries of cu_seqlens, or the batch size. A malformed cu_seqlens is
// reported by the core; here it only must not produce a negative size.
std::int64_t num_sequences(const at::Tensor& q, const at::Tensor& cu_seqlens) {
  if (!cu_seqlens.defined()) return q.size(0);
  return std::max<std::int64_t>(cu_seqlens.numel() - 1, 0);
}

// The dtype of final states and of FoX's saved log-sum-exp: float64 for float64 q, else float32.
at::ScalarType state_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// A fresh contiguous gradient buffer for `input` (same shape and dtype), or undefined when the
// input is absent or does not require grad.
at::Tensor grad_buffer(const at::Tensor& input, bool needed) {
  if (!needed || !input.defined()) return at::Tensor();
  return at::empty(input.sizes(), input.options());
}

// The incoming gradient of output i; undefined when that output took no part in the loss
// (materialize_grads is off), which the callers treat as zero.
at::Tensor incoming_grad(const variable_list& grads, std::size_t i) {
  return i < grads.size() ? grads[i] : at::Tensor();
}

c10::IValue optional_double(c10::optional<double> x) {
  return x ? c10::IValue(*x) : c10::IValue();
}
c10::optional<double> to_optional_double(const c10::IValue& x) {
  return x.isNone() ? c10::nullopt : c10::optional<double>(x.toDouble());
}

// Which inputs need gradients. Read in forward (requires_grad of the function's inputs) and kept
// for backward, so gradients nobody asked for are not computed.
bool requires_grad(const at::Tensor& t) {
  return t.defined() && t.requires_grad();
}

// The backward passes are not themselves differentiable (the core returns plain numbers), so a
// graph built through them would silently give wrong second derivatives. Autograd runs backward
// with grad mode on only for create_graph=true: refuse that instead.
void check_first_order(const std::string& op) {
  TORCH_CHECK(
      !at::GradMode::is_enabled(), op,
      " backward: double backward (create_graph=true) is not supported; phasor's gradients are "
      "first order only");
}

// ---- GLA ----------------------------------------------------------------------------------------

struct GlaOptions {
  Impl impl;
  c10::optional<double> scale;
  bool output_final_state;
  std::int64_t chunk_size;
};

GlaParams gla_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& g, const at::Tensor& h0, const at::Tensor& cu,
                     c10::optional<double> scale, std::int64_t chunk_size) {
  GlaParams p;
  p.q = view_of(q), p.k = view_of(k), p.v = view_of(v), p.g = view_of(g);
  p.initial_state = view_of(h0);
  p.cu_seqlens = view_of(cu);
  if (scale) p.scale = *scale;
  p.chunk_size = chunk_size;
  return p;
}

struct GlaFunction : torch::autograd::Function<GlaFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g,
                               const c10::optional<at::Tensor>& initial_state,
                               const c10::optional<at::Tensor>& cu_seqlens, const GlaOptions& opt) {
    const at::Tensor h0 = value_or_undefined(initial_state), cu = value_or_undefined(cu_seqlens);
    const GlaParams p = gla_params(q, k, v, g, h0, cu, opt.scale, opt.chunk_size);
    at::Tensor o = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    at::Tensor ht;
    if (opt.output_final_state)
      ht = at::empty({num_sequences(q, cu), q.size(2), q.size(3), v.size(3)},
                     q.options().dtype(state_dtype(q)));
    rethrow_as_torch([&] { gla_forward(p, opt.impl, view_of(o), view_of(ht)); });

    ctx->save_for_backward({q, k, v, g, h0, cu});
    ctx->saved_data["impl"] = static_cast<std::int64_t>(opt.impl);
    ctx->saved_data["scale"] = optional_double(opt.scale);
    ctx->saved_data["chunk_size"] = opt.chunk_size;
    ctx->saved_data["need"] = c10::List<bool>({requires_grad(q), requires_grad(k), requires_grad(v),
                                               requires_grad(g), requires_grad(h0)});
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined (= zero)
    if (ht.defined()) return {o, ht};
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order(gla_op_name(static_cast<Impl>(ctx->saved_data["impl"].toInt())));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &h0 = saved[4],
                     &cu = saved[5];
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const GlaParams p = gla_params(q, k, v, g, h0, cu, to_optional_double(ctx->saved_data["scale"]),
                                   ctx->saved_data["chunk_size"].toInt());
    const auto need = ctx->saved_data["need"].toBoolList();

    at::Tensor d_o = incoming_grad(grads, 0), dht = incoming_grad(grads, 1);
    if (!d_o.defined()) d_o = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    at::Tensor dq = grad_buffer(q, need[0]), dk = grad_buffer(k, need[1]),
               dv = grad_buffer(v, need[2]), dg = grad_buffer(g, need[3]),
               dh0 = grad_buffer(h0, need[4]);
    const GlaGrads out{view_of(dq), view_of(dk), view_of(dv), view_of(dg), view_of(dh0)};
    rethrow_as_torch([&] { gla_backward(p, impl, view_of(d_o), view_of(dht), out); });
    return {dq, dk, dv, dg, dh0, at::Tensor(), at::Tensor()};
  }
};

// ---- Gated DeltaNet -----------------------------------------------------------------------------

struct GatedDeltaRuleOptions {
  Impl impl;
  c10::optional<double> scale;
  bool output_final_state;
  bool use_qk_l2norm_in_kernel;
  std::int64_t chunk_size;
};

GatedDeltaRuleParams gated_delta_rule_params(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& g,
                                             const at::Tensor& beta, const at::Tensor& h0,
                                             const at::Tensor& cu, c10::optional<double> scale,
                                             bool use_qk_l2norm_in_kernel,
                                             std::int64_t chunk_size) {
  GatedDeltaRuleParams p;
  p.q = view_of(q), p.k = view_of(k), p.v = view_of(v), p.g = view_of(g), p.beta = view_of(beta);
  p.initial_state = view_of(h0);
  p.cu_seqlens = view_of(cu);
  if (scale) p.scale = *scale;
  p.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  p.chunk_size = chunk_size;
  return p;
}

struct GatedDeltaRuleFunction : torch::autograd::Function<GatedDeltaRuleFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                               const c10::optional<at::Tensor>& initial_state,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const GatedDeltaRuleOptions& opt) {
    const at::Tensor h0 = value_or_undefined(initial_state), cu = value_or_undefined(cu_seqlens);
    const GatedDeltaRuleParams p = gated_delta_rule_params(
        q, k, v, g, beta, h0, cu, opt.scale, opt.use_qk_l2norm_in_kernel, opt.chunk_size);
    // Value heads HV and V come from v: o is [B, T, HV, V], states [N, HV, K, V].
    at::Tensor o = at::empty({q.size(0), q.size(1), v.size(2), v.size(3)}, q.options());
    at::Tensor ht;
    if (opt.output_final_state)
      ht = at::empty({num_sequences(q, cu), v.size(2), q.size(3), v.size(3)},
                     q.options().dtype(state_dtype(q)));
    rethrow_as_torch([&] { gated_delta_rule_forward(p, opt.impl, view_of(o), view_of(ht)); });

    ctx->save_for_backward({q, k, v, g, beta, h0, cu});
    ctx->saved_data["impl"] = static_cast<std::int64_t>(opt.impl);
    ctx->saved_data["scale"] = optional_double(opt.scale);
    ctx->saved_data["l2norm"] = opt.use_qk_l2norm_in_kernel;
    ctx->saved_data["chunk_size"] = opt.chunk_size;
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(q), requires_grad(k), requires_grad(v), requires_grad(g),
                         requires_grad(beta), requires_grad(h0)});
    ctx->set_materialize_grads(false);
    if (ht.defined()) return {o, ht};
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order(gated_delta_rule_op_name(static_cast<Impl>(ctx->saved_data["impl"].toInt())));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &beta = saved[4],
                     &h0 = saved[5], &cu = saved[6];
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const GatedDeltaRuleParams p = gated_delta_rule_params(
        q, k, v, g, beta, h0, cu, to_optional_double(ctx->saved_data["scale"]),
        ctx->saved_data["l2norm"].toBool(), ctx->saved_data["chunk_size"].toInt());
    const auto need = ctx->saved_data["need"].toBoolList();

    at::Tensor d_o = incoming_grad(grads, 0), dht = incoming_grad(grads, 1);
    if (!d_o.defined()) d_o = at::zeros({q.size(0), q.size(1), v.size(2), v.size(3)}, q.options());
    at::Tensor dq = grad_buffer(q, need[0]), dk = grad_buffer(k, need[1]),
               dv = grad_buffer(v, need[2]), dg = grad_buffer(g, need[3]),
               dbeta = grad_buffer(beta, need[4]), dh0 = grad_buffer(h0, need[5]);
    const GatedDeltaRuleGrads out{view_of(dq), view_of(dk),    view_of(dv),
                                  view_of(dg), view_of(dbeta), view_of(dh0)};
    rethrow_as_torch([&] { gated_delta_rule_backward(p, impl, view_of(d_o), view_of(dht), out); });
    return {dq, dk, dv, dg, dbeta, dh0, at::Tensor(), at::Tensor()};
  }
};

// ---- Forgetting attention -----------------------------------------------------------------------

struct ForgettingAttnOptions {
  Impl impl;
  c10::optional<double> scale;
  c10::optional<std::int64_t> window_size;
  std::int64_t block_size;
};

ForgettingAttnParams forgetting_attn_params(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& g,
                                            const at::Tensor& cu, c10::optional<double> scale,
                                            c10::optional<std::int64_t> window_size,
                                            std::int64_t block_size) {
  ForgettingAttnParams p;
  p.q = view_of(q), p.k = view_of(k), p.v = view_of(v), p.g = view_of(g);
  p.cu_seqlens = view_of(cu);
  if (scale) p.scale = *scale;
  if (window_size) p.window_size = *window_size;
  p.block_size = block_size;
  return p;
}

struct ForgettingAttnFunction : torch::autograd::Function<ForgettingAttnFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const ForgettingAttnOptions& opt) {
    const at::Tensor cu = value_or_undefined(cu_seqlens);
    const ForgettingAttnParams p =
        forgetting_attn_params(q, k, v, g, cu, opt.scale, opt.window_size, opt.block_size);
    at::Tensor o = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    // The per-row log-sum-exp, kept so the backward pass need not recompute the forward.
    at::Tensor lse =
        at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(state_dtype(q)));
    rethrow_as_torch([&] { forgetting_attn_forward(p, opt.impl, view_of(o), view_of(lse)); });

    ctx->save_for_backward({q, k, v, g, cu, o, lse});
    ctx->saved_data["impl"] = static_cast<std::int64_t>(opt.impl);
    ctx->saved_data["scale"] = optional_double(opt.scale);
    ctx->saved_data["window_size"] =
        opt.window_size ? c10::IValue(*opt.window_size) : c10::IValue();
    ctx->saved_data["block_size"] = opt.block_size;
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(q), requires_grad(k), requires_grad(v), requires_grad(g)});
    ctx->set_materialize_grads(false);
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order(forgetting_attn_op_name(static_cast<Impl>(ctx->saved_data["impl"].toInt())));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &cu = saved[4],
                     &o = saved[5], &lse = saved[6];
    const auto& window = ctx->saved_data["window_size"];
    const ForgettingAttnParams p = forgetting_attn_params(
        q, k, v, g, cu, to_optional_double(ctx->saved_data["scale"]),
        window.isNone() ? c10::nullopt : c10::optional<std::int64_t>(window.toInt()),
        ctx->saved_data["block_size"].toInt());
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const auto need = ctx->saved_data["need"].toBoolList();

    at::Tensor d_o = incoming_grad(grads, 0);
    if (!d_o.defined()) d_o = at::zeros_like(o);
    at::Tensor dq = grad_buffer(q, need[0]), dk = grad_buffer(k, need[1]),
               dv = grad_buffer(v, need[2]), dg = grad_buffer(g, need[3]);
    const ForgettingAttnGrads out{view_of(dq), view_of(dk), view_of(dv), view_of(dg)};
    rethrow_as_torch(
        [&] { forgetting_attn_backward(p, impl, view_of(d_o), view_of(o), view_of(lse), out); });
    return {dq, dk, dv, dg, at::Tensor(), at::Tensor()};
  }
};

// o in q's original dtype (float16/bfloat16 inputs were computed in float32).
at::Tensor in_dtype_of(const at::Tensor& o, const at::Tensor& q) {
  return o.scalar_type() == q.scalar_type() ? o : o.to(q.scalar_type());
}

}  // namespace

// ---- public entry points ------------------------------------------------------------------------

OutputAndState gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& g, Impl impl, c10::optional<double> scale,
                   const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                   const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size) {
  const std::string op = gla_op_name(impl);
  check_float(op, "q", q, 4, "[B, T, H, K]");
  check_float(op, "k", k, 4, "[B, T, H, K]");
  check_float(op, "v", v, 4, "[B, T, H, V]");
  check_float(op, "g", g, 4, "[B, T, H, K]");
  check_optional_float(op, "initial_state", initial_state, 4, "[N, H, K, V]");
  check_cu_seqlens(op, cu_seqlens);
  const variable_list out = GlaFunction::apply(
      to_compute(q), to_compute(k), to_compute(v), to_compute(g), to_compute(initial_state),
      cu_seqlens, GlaOptions{impl, scale, output_final_state, chunk_size});
  c10::optional<at::Tensor> final_state;
  if (output_final_state) final_state = out[1];
  return {in_dtype_of(out[0], q), final_state};
}

OutputAndState chunk_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& g, c10::optional<double> scale,
                         const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                         const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size) {
  return gla(q, k, v, g, Impl::chunk, scale, initial_state, output_final_state, cu_seqlens,
             chunk_size);
}

OutputAndState fused_recurrent_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, c10::optional<double> scale,
                                   const c10::optional<at::Tensor>& initial_state,
                                   bool output_final_state,
                                   const c10::optional<at::Tensor>& cu_seqlens) {
  return gla(q, k, v, g, Impl::recurrent, scale, initial_state, output_final_state, cu_seqlens);
}

OutputAndState gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& g, const at::Tensor& beta, Impl impl,
                                c10::optional<double> scale,
                                const c10::optional<at::Tensor>& initial_state,
                                bool output_final_state,
                                const c10::optional<at::Tensor>& cu_seqlens,
                                bool use_qk_l2norm_in_kernel, std::int64_t chunk_size) {
  const std::string op = gated_delta_rule_op_name(impl);
  check_float(op, "q", q, 4, "[B, T, H, K]");
  check_float(op, "k", k, 4, "[B, T, H, K]");
  check_float(op, "v", v, 4, "[B, T, HV, V]");
  check_float(op, "g", g, 3, "[B, T, HV]");
  check_float(op, "beta", beta, 3, "[B, T, HV]");
  check_optional_float(op, "initial_state", initial_state, 4, "[N, HV, K, V]");
  check_cu_seqlens(op, cu_seqlens);
  const variable_list out = GatedDeltaRuleFunction::apply(
      to_compute(q), to_compute(k), to_compute(v), to_compute(g), to_compute(beta),
      to_compute(initial_state), cu_seqlens,
      GatedDeltaRuleOptions{impl, scale, output_final_state, use_qk_l2norm_in_kernel, chunk_size});
  c10::optional<at::Tensor> final_state;
  if (output_final_state) final_state = out[1];
  return {in_dtype_of(out[0], q), final_state};
}

OutputAndState chunk_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta,
                                      c10::optional<double> scale,
                                      const c10::optional<at::Tensor>& initial_state,
                                      bool output_final_state,
                                      const c10::optional<at::Tensor>& cu_seqlens,
                                      bool use_qk_l2norm_in_kernel, std::int64_t chunk_size) {
  return gated_delta_rule(q, k, v, g, beta, Impl::chunk, scale, initial_state, output_final_state,
                          cu_seqlens, use_qk_l2norm_in_kernel, chunk_size);
}

OutputAndState fused_recurrent_gated_delta_rule(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& beta, c10::optional<double> scale,
                                                const c10::optional<at::Tensor>& initial_state,
                                                bool output_final_state,
                                                const c10::optional<at::Tensor>& cu_seqlens,
                                                bool use_qk_l2norm_in_kernel) {
  return gated_delta_rule(q, k, v, g, beta, Impl::recurrent, scale, initial_state,
                          output_final_state, cu_seqlens, use_qk_l2norm_in_kernel);
}

at::Tensor forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& g, Impl impl, c10::optional<double> scale,
                           c10::optional<std::int64_t> window_size,
                           const c10::optional<at::Tensor>& cu_seqlens, std::int64_t block_size) {
  const std::string op = forgetting_attn_op_name(impl);
  check_float(op, "q", q, 4, "[B, T, HQ, K]");
  check_float(op, "k", k, 4, "[B, T, H, K]");
  check_float(op, "v", v, 4, "[B, T, H, V]");
  check_float(op, "g", g, 3, "[B, T, HQ]");
  check_cu_seqlens(op, cu_seqlens);
  const variable_list out = ForgettingAttnFunction::apply(
      to_compute(q), to_compute(k), to_compute(v), to_compute(g), cu_seqlens,
      ForgettingAttnOptions{impl, scale, window_size, block_size});
  return in_dtype_of(out[0], q);
}

at::Tensor parallel_forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, c10::optional<double> scale,
                                    c10::optional<std::int64_t> window_size,
                                    const c10::optional<at::Tensor>& cu_seqlens,
                                    std::int64_t block_size) {
  return forgetting_attn(q, k, v, g, Impl::chunk, scale, window_size, cu_seqlens, block_size);
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
                                       const at::Tensor& v, const at::Tensor& g) {
  const std::string op = "ForgettingAttnDecoder::step";
  check_float(op, "q", q, 4, "[B, 1, HQ, K]");
  check_float(op, "k", k, 4, "[B, 1, H, K]");
  check_float(op, "v", v, 4, "[B, 1, H, V]");
  check_float(op, "g", g, 3, "[B, 1, HQ]");
  at::NoGradGuard no_grad;
  const at::Tensor qc = to_compute(q), kc = to_compute(k), vc = to_compute(v), gc = to_compute(g);
  at::Tensor o = at::empty({q.size(0), q.size(1), num_q_heads_, value_dim_}, qc.options());
  std::optional<double> scale;
  if (scale_) scale = *scale_;
  rethrow_as_torch(
      [&] { cache_.step(view_of(qc), view_of(kc), view_of(vc), view_of(gc), view_of(o), scale); });
  return in_dtype_of(o, q);
}

std::int64_t ForgettingAttnDecoder::length() const {
  return cache_.length();
}

void ForgettingAttnDecoder::reset() {
  cache_.reset();
}

}  // namespace phasor
