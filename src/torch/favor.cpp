// The LibTorch layer for Performer FAVOR+ (phasor/favor.h): the seeded random feature matrix, the
// positive softmax features and FAVOR+ attention, each feature/attention op one
// torch::autograd::Function running the core's kernels forward and backward.
#include <ATen/TensorIndexing.h>

#include <array>
#include <string>
#include <vector>

#include "layer_util.h"
#include "phasor/favor.h"
#include "phasor/torch.h"

namespace phasor {
namespace {

using namespace torch_detail;  // NOLINT(google-build-using-namespace): the layer's own helpers

std::string favor_op_name(const char* op, Impl impl) {
  return impl == Impl::reference ? std::string(op) + "_reference" : std::string(op);
}

// ---- features -----------------------------------------------------------------------------------

FavorFeatureParams feature_params(const at::Tensor& x, const at::Tensor& w,
                                  FavorStabilizer stabilizer, const at::Tensor& cu) {
  FavorFeatureParams p;
  p.x = compute_view_of(x);
  p.w = compute_view_of(w);
  p.stabilizer = stabilizer;
  p.cu_seqlens = compute_view_of(cu);
  return p;
}

// The core's backward holds the stabiliser c fixed (exact for attention, where c cancels). The
// features returned here are the stabilised φ_r = exp(u_r − c)/√m themselves, u_r = w_rᵀx − |x|²/2,
// and c = u at the arg max (r*, and for keys t*) of its group, so their true gradient has the extra
// term of c: dφ_r = φ_r (du_r − du_{r*}), i.e. with G = Σ_group dφ·φ
//   dx_{t*} −= G (w_{r*} − x_{t*}),   dw_{r*} −= G x_{t*}        (∇_x u = w − x, ∇_w u = x).
// The arg max is read off φ (its largest entry is exactly exp(0)/√m). Applied in place to dx, dw.
void add_stabilizer_gradient(const at::Tensor& x, const at::Tensor& w, const at::Tensor& phi,
                             const at::Tensor& d_phi, FavorStabilizer stabilizer,
                             const at::Tensor& cu, at::Tensor& dx, at::Tensor& dw) {
  if (stabilizer == FavorStabilizer::none || (!dx.defined() && !dw.defined())) return;
  const std::int64_t B = x.size(0), T = x.size(1), H = x.size(2), d = x.size(3), m = phi.size(3);
  const bool per_head = w.dim() == 3;
  const at::Tensor prod = d_phi.to(phi.scalar_type()) * phi;  // dφ·φ
  const at::Tensor w2 = w.reshape({-1, d});                   // [m, d] or [H·m, d]
  at::Tensor dw2 = dw.defined() ? dw.view({-1, d}) : at::Tensor();
  const at::Tensor heads = at::arange(H, x.options().dtype(at::kLong));
  if (stabilizer == FavorStabilizer::query) {
    // One c per (b, t, h): its row's arg max.
    const at::Tensor r = phi.argmax(-1);                                  // [B, T, H]
    const at::Tensor G = prod.sum(-1).unsqueeze(-1).to(x.scalar_type());  // [B, T, H, 1]
    const at::Tensor rows = (per_head ? r + heads * m : r).reshape({-1});
    if (dx.defined())
      dx.sub_(G * (w2.index_select(0, rows).reshape({B, T, H, d}).to(x.scalar_type()) - x));
    if (dw.defined()) dw2.index_add_(0, rows, (-G * x).reshape({-1, d}).to(dw.scalar_type()));
    return;
  }
  // Keys: one c per (sequence, head), the arg max over all (t, r) of the sequence.
  std::vector<std::array<std::int64_t, 3>> seqs;  // (batch row, first token, end)
  if (cu.defined()) {
    const at::Tensor c = cu.to(at::kLong);
    for (std::int64_t n = 0; n + 1 < c.numel(); ++n)
      seqs.push_back({0, c[n].item<std::int64_t>(), c[n + 1].item<std::int64_t>()});
  } else {
    for (std::int64_t b = 0; b < B; ++b) seqs.push_back({b, 0, T});
  }
  for (const auto& s : seqs) {
    const std::int64_t b = s[0], t0 = s[1], L = s[2] - s[1];
    if (L <= 0) continue;
    const at::Tensor ph = phi.select(0, b).narrow(0, t0, L).permute({1, 0, 2}).reshape({H, L * m});
    const at::Tensor a = ph.argmax(-1);  // [H]
    const at::Tensor t = a.div(m, "floor") + t0, r = a.remainder(m);
    const at::Tensor G = prod.select(0, b)
                             .narrow(0, t0, L)
                             .sum(at::IntArrayRef{0, 2})
                             .unsqueeze(-1)
                             .to(x.scalar_type());           // [H, 1]
    const at::Tensor xs = x.select(0, b).index({t, heads});  // [H, d]
    const at::Tensor rows = per_head ? r + heads * m : r;    // [H]
    if (dx.defined()) {
      const at::Tensor ws = w2.index_select(0, rows).to(x.scalar_type());
      dx.select(0, b).index_put_({t, heads}, -G * (ws - xs), /*accumulate=*/true);
    }
    if (dw.defined()) dw2.index_add_(0, rows, (-G * xs).to(dw.scalar_type()));
  }
}

struct FavorFeaturesFunction : torch::autograd::Function<FavorFeaturesFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               FavorStabilizer stabilizer, Impl impl) {
    const at::Tensor cu = value_or_undefined(cu_seqlens);
    at::Tensor phi = at::empty({x.size(0), x.size(1), x.size(2), w.size(w.dim() - 2)}, x.options());
    rethrow_as_torch([&] {
      favor_features_forward(feature_params(x, w, stabilizer, cu), impl, compute_out_view_of(phi));
    });
    ctx->save_for_backward({x, w, cu, phi});
    ctx->saved_data["stabilizer"] = static_cast<std::int64_t>(stabilizer);
    ctx->saved_data["impl"] = static_cast<std::int64_t>(impl);
    ctx->saved_data["need"] = c10::List<bool>({requires_grad(x), requires_grad(w)});
    ctx->set_materialize_grads(false);
    return {phi};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    check_first_order(favor_op_name("favor_features", impl));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &cu = saved[2], &phi = saved[3];
    const auto stabilizer = static_cast<FavorStabilizer>(ctx->saved_data["stabilizer"].toInt());
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor d_phi = incoming_grad(grads, 0);
    if (!d_phi.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), {}};
    at::Tensor dx = grad_buffer(x, need[0]), dw = grad_buffer(w, need[1]);
    rethrow_as_torch([&] {
      favor_features_backward(feature_params(x, w, stabilizer, cu), impl, compute_view_of(d_phi),
                              compute_out_view_of(dx), compute_out_view_of(dw));
    });
    add_stabilizer_gradient(x, w, phi, d_phi, stabilizer, cu, dx, dw);
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---- attention ----------------------------------------------------------------------------------

struct FavorAttentionOptions {
  Impl impl;
  bool causal;
  c10::optional<double> scale;
  std::int64_t chunk_size;
};

FavorAttentionParams attention_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& w, const at::Tensor& cu, bool causal,
                                      c10::optional<double> scale, std::int64_t chunk_size) {
  FavorAttentionParams p;
  p.q = compute_view_of(q), p.k = compute_view_of(k), p.v = compute_view_of(v);
  p.w = compute_view_of(w);
  p.cu_seqlens = compute_view_of(cu);
  p.causal = causal;
  if (scale) p.scale = *scale;
  p.chunk_size = chunk_size;
  return p;
}

struct FavorAttentionFunction : torch::autograd::Function<FavorAttentionFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& w,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const FavorAttentionOptions& opt) {
    const at::Tensor cu = value_or_undefined(cu_seqlens);
    at::Tensor o = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    rethrow_as_torch([&] {
      favor_attention_forward(
          attention_params(q, k, v, w, cu, opt.causal, opt.scale, opt.chunk_size), opt.impl,
          compute_out_view_of(o));
    });
    // Nothing else is saved: the core's backward recomputes the features.
    ctx->save_for_backward({q, k, v, w, cu});
    ctx->saved_data["impl"] = static_cast<std::int64_t>(opt.impl);
    ctx->saved_data["causal"] = opt.causal;
    ctx->saved_data["scale"] = optional_double(opt.scale);
    ctx->saved_data["chunk_size"] = opt.chunk_size;
    ctx->saved_data["need"] =
        c10::List<bool>({requires_grad(q), requires_grad(k), requires_grad(v), requires_grad(w)});
    ctx->set_materialize_grads(false);
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    check_first_order(favor_op_name("favor_attention", impl));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &w = saved[3], &cu = saved[4];
    const auto need = ctx->saved_data["need"].toBoolList();
    const at::Tensor d_o = incoming_grad(grads, 0);
    if (!d_o.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), {}, {}};
    at::Tensor dq = grad_buffer(q, need[0]), dk = grad_buffer(k, need[1]),
               dv = grad_buffer(v, need[2]), dw = grad_buffer(w, need[3]);
    rethrow_as_torch([&] {
      FavorAttentionGrads out;
      out.dq = compute_out_view_of(dq), out.dk = compute_out_view_of(dk);
      out.dv = compute_out_view_of(dv), out.dw = compute_out_view_of(dw);
      favor_attention_backward(attention_params(q, k, v, w, cu, ctx->saved_data["causal"].toBool(),
                                                to_optional_double(ctx->saved_data["scale"]),
                                                ctx->saved_data["chunk_size"].toInt()),
                               impl, compute_view_of(d_o), out);
    });
    return {dq, dk, dv, dw, at::Tensor(), at::Tensor()};
  }
};

// w: [m, d] (shared by the heads) or [H, m, d] (per head).
void check_w(const std::string& op, const at::Tensor& w) {
  check_float_either_rank(op, "w", w, 2, 3, "[m, d] or [H, m, d]");
}

}  // namespace

// ---- public entry points ------------------------------------------------------------------------

at::Tensor favor_random_matrix(std::int64_t num_features, std::int64_t head_dim, std::uint64_t seed,
                               FavorMatrixKind kind, c10::optional<std::int64_t> num_heads,
                               at::ScalarType dtype) {
  const std::string op = "favor_random_matrix";
  if (num_features < 1)
    fail(op, "num_features", "at least one feature (m ≥ 1)", std::to_string(num_features));
  if (head_dim < 1) fail(op, "head_dim", "a head dimension d ≥ 1", std::to_string(head_dim));
  if (num_heads && *num_heads < 1)
    fail(op, "num_heads", "a positive number of heads", std::to_string(*num_heads));
  if (dtype != at::kFloat && dtype != at::kDouble)
    fail(op, "dtype", "float32 or float64", c10::toString(dtype));
  std::vector<std::int64_t> shape = {num_features, head_dim};
  if (num_heads) shape.insert(shape.begin(), *num_heads);
  at::Tensor w = at::empty(shape, at::TensorOptions().dtype(dtype));
  rethrow_as_torch([&] { phasor::favor_random_matrix(kind, seed, view_of(w)); });
  return w;
}

at::Tensor favor_features(const at::Tensor& x, const at::Tensor& w, FavorStabilizer stabilizer,
                          const c10::optional<at::Tensor>& cu_seqlens, Impl impl) {
  const std::string op = favor_op_name("favor_features", impl);
  check_float(op, "x", x, 4, "[B, T, H, d]");
  check_w(op, w);
  check_cu_seqlens(op, cu_seqlens);
  check_compute_device(op);
  const variable_list out =
      FavorFeaturesFunction::apply(to_compute(x), to_compute(w), cu_seqlens, stabilizer, impl);
  return in_dtype_of(out[0], x);
}

at::Tensor favor_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& w, bool causal, c10::optional<double> scale,
                           const c10::optional<at::Tensor>& cu_seqlens, Impl impl,
                           std::int64_t chunk_size) {
  const std::string op = favor_op_name("favor_attention", impl);
  check_float(op, "q", q, 4, "[B, T, H, d]");
  check_float(op, "k", k, 4, "[B, T, H, d]");
  check_float(op, "v", v, 4, "[B, T, H, V]");
  check_w(op, w);
  check_cu_seqlens(op, cu_seqlens);
  check_compute_device(op);
  const variable_list out = FavorAttentionFunction::apply(
      to_compute(q), to_compute(k), to_compute(v), to_compute(w), cu_seqlens,
      FavorAttentionOptions{impl, causal, scale, chunk_size});
  return in_dtype_of(out[0], q);
}

}  // namespace phasor
