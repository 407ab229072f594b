// phasor::nn layers (phasor/nn.h): torch::nn modules composing the differentiable ops of
// phasor/torch.h with plain ATen operations. The equations are in nn.h.
#include "phasor/nn.h"
#include "layer_util.h"
#include "nn_util.h"
#include "rms_norm_rows.h"

#include <torch/torch.h>

#include <array>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace phasor::nn {
namespace {

using detail::check_option;
using detail::check_positive;
using detail::kPi;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch_detail::shape_of;

// ---- checks -------------------------------------------------------------------------------------

// x: a defined CPU float32/float64 tensor [B, T, hidden] with T ≥ 1.
void check_input(const char* layer, const at::Tensor& x, std::int64_t hidden) {
  TORCH_CHECK(x.defined(), layer, ": argument 'x': expected a tensor [B, T, ", hidden,
              "], got an undefined tensor");
  TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden && x.size(1) >= 1, layer,
              ": argument 'x': expected shape [B, T ≥ 1, ", hidden, "], got shape ", shape_of(x));
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, layer,
              ": argument 'x': expected dtype float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), layer, ": argument 'x': expected a CPU tensor, got device ",
              x.device());
}

// x's dtype must be the parameters' (ATen would otherwise fail deep inside a matmul).
void check_dtype_matches(const char* layer, const at::Tensor& x, const at::Tensor& parameter) {
  TORCH_CHECK(x.scalar_type() == parameter.scalar_type(), layer, ": argument 'x': expected dtype ",
              parameter.scalar_type(),
              " (the module's parameters; convert with module->to(...)), got ", x.scalar_type());
}

// A width hidden·expand that must come out a positive integer divisible by `heads`.
std::int64_t expanded_width(const char* layer, const char* name, std::int64_t hidden, double expand,
                            std::int64_t heads) {
  const double w = static_cast<double>(hidden) * expand;
  const auto wi = static_cast<std::int64_t>(std::llround(w));
  check_option(wi > 0 && std::abs(w - static_cast<double>(wi)) < 1e-9 && wi % heads == 0, layer,
               name, "hidden_size·" + std::string(name) + " a positive multiple of num_heads",
               std::to_string(w));
  return wi;
}

// ---- shared pieces ------------------------------------------------------------------------------

// x W_iᵀ for bias-free projections of one input x [..., D], as one product with the weights
// stacked ([Σ N_i, D]) and its output split (views of it, [..., N_i] each). At the task harness's
// sizes (2,048 rows, D = 64) a 64-column product runs OpenBLAS far below its rate, and the
// backward pass summed one ∂L/∂x per projection; stacked, it is one product each way and one cat
// of the outputs' gradients. The values are those of separate products up to their rounding.
std::vector<at::Tensor> stacked_projections(const at::Tensor& x,
                                            const std::vector<torch::nn::Linear>& projections) {
  std::vector<at::Tensor> weights;
  std::vector<std::int64_t> widths;
  for (const torch::nn::Linear& p : projections) {
    TORCH_INTERNAL_ASSERT(!p->bias.defined(), "stacked_projections: a projection with a bias");
    weights.push_back(p->weight);
    widths.push_back(p->weight.size(0));
  }
  return at::linear(x, at::cat(weights, 0)).split_with_sizes(widths, -1);
}

using detail::GateActivation;

// act(gate) of rms_norm_gated, as ATen expressions (the node's path off the CPU loops).
at::Tensor activate(const at::Tensor& gate, GateActivation act) {
  return act == GateActivation::silu ? at::silu(gate) : at::sigmoid(gate);
}
// act'(gate): silu' = σ (1 + z (1 − σ)), σ' = σ (1 − σ).
at::Tensor activation_slope(const at::Tensor& gate, GateActivation act) {
  const at::Tensor s = at::sigmoid(gate);
  return act == GateActivation::silu ? s * (1 + gate * (1 - s)) : s * (1 - s);
}

// Whether the CPU row loops (rms_norm_rows.h) take the call: CPU tensors of float32 or float64
// (the others run the ATen expressions, on any device).
bool rows_path(const at::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
}

// RMSNorm, optionally times an activated gate, as one autograd node:
//   y = n ⊙ weight [⊙ act(gate)],   n = x ⊙ r,   r = (mean(x²) + eps)^(−1/2)  (per row of D)
// Backward (∂r/∂x_j = −r³ x_j / D), with a = act(gate) (1 without a gate):
//   dn = dy ⊙ weight ⊙ a,  dx = r ⊙ (dn − n ⊙ mean(dn ⊙ n)),
//   dgate = dy ⊙ n ⊙ weight ⊙ act'(gate),  dweight = Σ_rows dy ⊙ n ⊙ a.
// Composed, autograd would record six nodes for the norm (pow, mean, add, rsqrt, two products) and
// two more for the gate, each with its temporaries; at the harness's sizes (64 channels) their
// bookkeeping, not the arithmetic, was the cost. On CPU float32/float64 tensors both passes are
// one loop over the rows (rms_norm_rows.h); elsewhere they are the ATen expressions above. Saved:
// x, gate, weight and r (one number per row), not n.
// The forward of both nodes (gate_in undefined: rms_norm).
at::Tensor norm_forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate_in,
                        const at::Tensor& weight, double eps, GateActivation act) {
  const bool gated = gate_in.defined();
  at::Tensor x = x_in, gate = gate_in, r, y;
  if (rows_path(x)) {
    x = x.contiguous();
    if (gated) gate = gate.contiguous();
    const at::Tensor w = weight.contiguous();
    const std::int64_t D = x.size(-1), rows = D == 0 ? 0 : x.numel() / D;
    std::vector<std::int64_t> r_shape = x.sizes().vec();
    r_shape.back() = 1;
    r = at::empty(r_shape, x.options());
    y = at::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
      detail::rms_norm_rows_forward<scalar_t>(
          x.data_ptr<scalar_t>(), gated ? gate.data_ptr<scalar_t>() : nullptr, act,
          w.data_ptr<scalar_t>(), rows, D, eps, y.data_ptr<scalar_t>(), r.data_ptr<scalar_t>());
    });
  } else {
    r = at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
    y = x * r * weight;
    if (gated) y = y * activate(gate, act);
  }
  ctx->save_for_backward({x, gate, weight, r});
  ctx->saved_data["activation"] = static_cast<std::int64_t>(act);
  return y;
}

// The backward of both nodes: {dx, dgate, dweight}, each undefined where not asked for.
std::array<at::Tensor, 3> norm_backward(AutogradContext* ctx, const at::Tensor& dy_in, bool want_dx,
                                        bool want_dgate, bool want_dweight) {
  torch_detail::check_first_order("rms_norm");
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &x = saved[0], &gate = saved[1], &weight = saved[2], &r = saved[3];
  const auto act = static_cast<GateActivation>(ctx->saved_data["activation"].toInt());
  const bool gated = gate.defined();
  want_dgate = want_dgate && gated;
  at::Tensor dx, dgate, dweight;
  if (rows_path(x)) {
    const at::Tensor dy = dy_in.contiguous(), w = weight.contiguous();
    const std::int64_t D = x.size(-1), rows = D == 0 ? 0 : x.numel() / D;
    if (want_dx) dx = at::empty_like(x);
    if (want_dgate) dgate = at::empty_like(x);
    if (want_dweight) dweight = at::empty({D}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
      const auto ptr = [](const at::Tensor& t) {
        return t.defined() ? t.data_ptr<scalar_t>() : nullptr;
      };
      detail::rms_norm_rows_backward<scalar_t>(ptr(x), ptr(gate), act, ptr(w), ptr(r), ptr(dy),
                                               rows, D, ptr(dx), ptr(dgate), ptr(dweight));
    });
    return {dx, dgate, dweight.defined() ? dweight.view_as(weight) : dweight};
  }
  const at::Tensor& dy = dy_in;
  const at::Tensor n = x * r;
  const at::Tensor a = gated ? activate(gate, act) : at::Tensor();
  if (want_dx) {
    const at::Tensor dn = gated ? dy * weight * a : dy * weight;
    dx = r * (dn - n * (dn * n).mean(-1, /*keepdim=*/true));
  }
  if (want_dgate) dgate = dy * n * weight * activation_slope(gate, act);
  if (want_dweight) dweight = (gated ? dy * n * a : dy * n).sum_to_size(weight.sizes());
  return {dx, dgate, dweight};
}

// Two nodes, not one with an optional gate: this LibTorch's custom functions take no undefined
// tensor argument.
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               double eps) {
    return {norm_forward(ctx, x, at::Tensor(), weight, eps, GateActivation::silu)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto d =
        norm_backward(ctx, grads[0], ctx->needs_input_grad(0), false, ctx->needs_input_grad(1));
    return {d[0], d[2], at::Tensor()};
  }
};
struct RmsNormGatedFunction : torch::autograd::Function<RmsNormGatedFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate,
                               const at::Tensor& weight, double eps, std::int64_t activation) {
    return {norm_forward(ctx, x, gate, weight, eps, static_cast<GateActivation>(activation))};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto d = norm_backward(ctx, grads[0], ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                 ctx->needs_input_grad(2));
    return {d[0], d[1], d[2], at::Tensor(), at::Tensor()};
  }
};

// The checks of rms_norm and rms_norm_gated.
void check_rms_norm(const char* op, const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, op, ": argument 'x': expected a tensor [..., D], got ",
              x.defined() ? "a scalar" : "an undefined tensor");
  TORCH_CHECK(weight.defined() && weight.dim() == 1 && weight.size(0) == x.size(-1), op,
              ": argument 'weight': expected shape [", x.size(-1), "] (x's last dimension), got ",
              weight.defined() ? "shape " + torch_detail::shape_of(weight) : "an undefined tensor");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), op, ": argument 'weight': expected dtype ",
              x.scalar_type(), " (x's), got ", weight.scalar_type());
  TORCH_CHECK(weight.device() == x.device(), op, ": argument 'weight': expected device ",
              x.device(), " (x's), got ", weight.device());
  TORCH_CHECK(eps >= 0.0, op, ": argument 'eps': expected a number ≥ 0, got ", eps);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rms_norm("rms_norm", x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps)[0];
}

at::Tensor rms_norm_gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight,
                          double eps, const std::string& activation) {
  check_rms_norm("rms_norm_gated", x, weight, eps);
  TORCH_CHECK(gate.defined() && gate.sizes() == x.sizes(),
              "rms_norm_gated: argument 'gate': expected shape ", shape_of(x), " (x's), got ",
              gate.defined() ? "shape " + shape_of(gate) : "an undefined tensor");
  TORCH_CHECK(gate.scalar_type() == x.scalar_type() && gate.device() == x.device(),
              "rms_norm_gated: argument 'gate': expected dtype ", x.scalar_type(), " on ",
              x.device(), " (x's), got ", gate.scalar_type(), " on ", gate.device());
  TORCH_CHECK(activation == "silu" || activation == "swish" || activation == "sigmoid",
              "rms_norm_gated: argument 'activation': expected 'silu' (or 'swish') or 'sigmoid', ",
              "got '", activation, "'");
  const GateActivation act =
      activation == "sigmoid" ? GateActivation::sigmoid : GateActivation::silu;
  return RmsNormGatedFunction::apply(x, gate, weight, eps, static_cast<std::int64_t>(act))[0];
}

namespace {

at::Tensor ones_parameter(std::int64_t n) {
  return torch::ones({n});
}

// U(−bound, bound) of the given shape (nn.Linear / nn.Conv1d's default init).
at::Tensor uniform(at::IntArrayRef shape, double bound) {
  return torch::empty(shape).uniform_(-bound, bound);
}

torch::nn::Linear linear(std::int64_t in, std::int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// The rotation angles θ [B, T, H, K/2] of a layer, or an undefined tensor for NoPE.
at::Tensor position_angles(PosEncoding pe, SelectiveRoPE& rope, double rope_theta,
                           const at::Tensor& x, std::int64_t heads, std::int64_t head_dim,
                           LayerCache* cache, std::int64_t offset) {
  const std::int64_t B = x.size(0), T = x.size(1);
  switch (pe) {
    case PosEncoding::none:
      return {};
    case PosEncoding::rope: {
      // Positions continue from the tokens already in the cache.
      const at::Tensor a =
          phasor::rope_angles(B, T, head_dim, rope_theta, offset, c10::nullopt, x.scalar_type());
      return a.unsqueeze(2).expand({B, T, heads, head_dim / 2}).contiguous();
    }
    case PosEncoding::selective_rope:
      return rope->forward(x, cache ? &cache->rope : nullptr);
    case PosEncoding::string_cayley:
    case PosEncoding::string_circulant:
    case PosEncoding::grape:
      return {};  // the layer's RotationEncodings give θ (nn_rotations.cpp)
  }
  return {};
}

// Checks shared by the layers' position-encoding options.
void check_rotation(const char* layer, PosEncoding pe, std::int64_t head_dim, double rope_theta) {
  if (pe == PosEncoding::none) return;
  check_option(head_dim % 2 == 0, layer, "pos_encoding",
               "an even rotated head dimension K (rotation acts on pairs)",
               "K = " + std::to_string(head_dim));
  if (pe == PosEncoding::rope || is_rotation_encoding(pe))
    check_option(rope_theta > 1.0, layer, "rope_theta", "a base > 1", std::to_string(rope_theta));
}

// The SelectiveRoPE submodule (registered as "rope") with the layer's sizes, for
// PosEncoding::selective_rope; an empty holder otherwise.
SelectiveRoPE make_rope(torch::nn::Module& self, PosEncoding pe, SelectiveRoPEOptions opt,
                        std::int64_t hidden, std::int64_t heads, std::int64_t head_dim) {
  if (pe != PosEncoding::selective_rope) return nullptr;
  opt.hidden_size(hidden).num_heads(heads).head_dim(head_dim);
  return self.register_module("rope", SelectiveRoPE(opt));
}

// q and k rotated explicitly when the rotation is not fused; returns the θ to pass to the op.
at::Tensor unfused_rotation(bool fused, const at::Tensor& theta, at::Tensor& q, at::Tensor& k,
                            RotaryLayout layout) {
  if (!theta.defined() || fused) return theta;
  // θ is per key head; a query group (q heads > k heads, FoX) shares its key head's angles.
  const std::int64_t group = q.size(2) / k.size(2);
  q = phasor::apply_rotary(q, group == 1 ? theta : theta.repeat_interleave(group, 2), layout);
  k = phasor::apply_rotary(k, theta, layout);
  return {};
}

c10::optional<at::Tensor> optional_of(const at::Tensor& t) {
  if (!t.defined()) return c10::nullopt;
  return t;
}

// Context parallelism (nn.h): refuses a decoding cache, passes the layer's option on to its short
// convolutions and SelectiveRoPE (so that setting or clearing it on the layer is enough), and
// returns the global position of this rank's first token (the cache's offset without the option).
std::int64_t context_parallel_setup(const char* layer, const std::shared_ptr<ContextParallel>& cp,
                                    const LayerCache* cache, PosEncoding pe, std::int64_t seq_len,
                                    std::initializer_list<ShortConvolution*> convs,
                                    SelectiveRoPE& rope) {
  for (ShortConvolution* c : convs)
    if (*c) (*c)->options.context_parallel(cp);
  if (rope) rope->options.context_parallel(cp);
  if (!cp) return cache ? cache->offset : 0;
  TORCH_CHECK(cache == nullptr, layer,
              ": option 'context_parallel': a decoding cache cannot be used with context "
              "parallelism (it is for training and prefill); call forward(x) without a cache");
  // Only RoPE and the rotation encodings read absolute positions (a collective: every rank calls).
  if (pe == PosEncoding::rope || is_rotation_encoding(pe)) return cp->token_offset(seq_len);
  return 0;
}

}  // namespace

// ---- ShortConvolution ---------------------------------------------------------------------------

ShortConvolutionImpl::ShortConvolutionImpl(ShortConvolutionOptions options_)
    : options(std::move(options_)) {
  reset();
}

void ShortConvolutionImpl::reset() {
  const char* layer = "ShortConvolution";
  check_positive(layer, "hidden_size", options.hidden_size());
  check_positive(layer, "kernel_size", options.kernel_size());
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.kernel_size()));
  weight =
      register_parameter("weight", uniform({options.hidden_size(), options.kernel_size()}, bound));
  if (options.bias()) bias = register_parameter("bias", uniform({options.hidden_size()}, bound));
}

at::Tensor ShortConvolutionImpl::forward(const at::Tensor& x, at::Tensor* state) {
  check_input("ShortConvolution", x, options.hidden_size());
  check_dtype_matches("ShortConvolution", x, weight);
  if (const auto& cp = options.context_parallel()) {
    TORCH_CHECK(state == nullptr,
                "ShortConvolution: option 'context_parallel': a decoding cache (argument 'state') "
                "cannot be used with context parallelism (it is for training and prefill)");
    return std::get<0>(cp->causal_conv1d(x, weight, optional_of(bias),
                                         options.silu() ? "silu" : "none", c10::nullopt, false,
                                         c10::nullopt));
  }
  c10::optional<at::Tensor> initial;
  if (state && state->defined()) initial = *state;
  auto [y, final_state] = phasor::causal_conv1d(
      x, weight, optional_of(bias), options.silu() ? "silu" : "none", initial, state != nullptr);
  if (state) *state = *final_state;
  return y;
}

// ---- SelectiveRoPE ------------------------------------------------------------------------------

SelectiveRoPEImpl::SelectiveRoPEImpl(SelectiveRoPEOptions options_) : options(std::move(options_)) {
  reset();
}

at::Tensor SelectiveRoPEImpl::spectrum_values(Spectrum spectrum, std::int64_t head_dim,
                                              double base) {
  const std::int64_t R = head_dim / 2;
  at::Tensor w = torch::empty({R}, torch::kDouble);
  auto a = w.accessor<double, 1>();
  for (std::int64_t i = 0; i < R; ++i) {
    if (spectrum == Spectrum::rope) {
      a[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    } else {
      // Quantiles of τ = tan²(α/2), α ~ U[0, 2π]: P(τ ≤ s) = (2/π)·atan(√s), so the level-p
      // quantile is tan²(πp/2); levels 1 − (i + ½)/R, normalised by the i = 0 value.
      auto quantile = [&](std::int64_t j) {
        const double p = 1.0 - (static_cast<double>(j) + 0.5) / static_cast<double>(R);
        const double t = std::tan(kPi * p / 2.0);
        return t * t;
      };
      a[i] = quantile(i) / quantile(0);
    }
  }
  return w;
}

void SelectiveRoPEImpl::reset() {
  const char* layer = "SelectiveRoPE";
  const auto& o = options;
  check_positive(layer, "hidden_size", o.hidden_size());
  check_positive(layer, "num_heads", o.num_heads());
  check_positive(layer, "head_dim", o.head_dim());
  check_option(o.hidden_size() % o.num_heads() == 0, layer, "hidden_size",
               "a multiple of num_heads = " + std::to_string(o.num_heads()) +
                   " (the input is ℓ2-normalised per head)",
               std::to_string(o.hidden_size()));
  check_option(o.head_dim() % 2 == 0, layer, "head_dim", "an even number (rotation pairs)",
               std::to_string(o.head_dim()));
  check_positive(layer, "rank", o.rank());
  check_positive(layer, "conv_size", o.conv_size());
  // Base 1 is allowed: ω ≡ 1 on every pair (the Selective RoPE code's state-tracking setting,
  // temp_theta 1.0); below 1 the frequencies would grow with the pair index.
  check_option(o.spectrum() != Spectrum::rope || o.spectrum_base() >= 1.0, layer, "spectrum_base",
               "a base ≥ 1", std::to_string(o.spectrum_base()));
  const std::int64_t D = o.hidden_size(), H = o.num_heads(), R = o.head_dim() / 2, HR = H * R;

  if (o.projection() == PhaseProjection::low_rank) {
    down = register_module("down", linear(D, o.rank(), false));
    up = register_module("up", linear(o.rank(), HR, false));
  } else {
    proj_weight = register_parameter("proj_weight", uniform({HR, D}, 1.0 / std::sqrt(D)));
    // Weight norm init: the scale equals the direction's norm, so P = V at initialisation.
    proj_scale = register_parameter("proj_scale",
                                    proj_weight.detach().reshape({H, R * D}).norm(2, {1}).clone());
  }
  conv = register_module(
      "conv", ShortConvolution(ShortConvolutionOptions(HR, o.conv_size()).silu(o.conv_silu())));
  // b = 0: exp(b) = 1, a unit phase step per token (RoPE) before the input-dependent part.
  if (o.bias()) bias = register_parameter("bias", torch::zeros({HR}));
  if (o.gate() != PhaseGate::none)
    gate = register_module("gate", linear(D, o.gate() == PhaseGate::per_head ? H : HR, true));
  const at::Tensor w =
      spectrum_values(o.spectrum(), o.head_dim(), o.spectrum_base()).to(at::kFloat);
  if (o.learnable_omega())
    omega_ = register_parameter("omega", w.unsqueeze(0).repeat({H, 1}));
  else
    omega_ = register_buffer("omega", w);
}

at::Tensor SelectiveRoPEImpl::normalized_input(const at::Tensor& x) const {
  const std::int64_t H = options.num_heads(), D = options.hidden_size();
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == D, "SelectiveRoPE: argument 'x': expected [..., ", D,
              "], got ", x.sizes());
  std::vector<std::int64_t> grouped(x.sizes().begin(), x.sizes().end() - 1);
  grouped.push_back(H);
  grouped.push_back(D / H);
  const at::Tensor xg = x.reshape(grouped);
  return (xg * at::rsqrt(xg.pow(2).sum(-1, true) + 1e-6)).reshape(x.sizes());
}

at::Tensor SelectiveRoPEImpl::phase_increments(const at::Tensor& x, at::Tensor* conv_state) {
  const auto& o = options;
  check_input("SelectiveRoPE", x, o.hidden_size());
  check_dtype_matches("SelectiveRoPE", x, conv->weight);
  const std::int64_t B = x.size(0), T = x.size(1), D = o.hidden_size(), H = o.num_heads(),
                     R = o.head_dim() / 2;
  const at::Tensor xn = normalized_input(x);
  at::Tensor p;
  if (o.projection() == PhaseProjection::low_rank) {
    p = up->forward(down->forward(xn));
  } else {
    const at::Tensor v = proj_weight.reshape({H, R * D});
    const at::Tensor w = (v * (proj_scale / v.norm(2, {1})).unsqueeze(1)).reshape({H * R, D});
    p = at::linear(xn, w);
  }
  at::Tensor c = conv->forward(p, conv_state);
  if (bias.defined()) c = c + bias.exp();
  at::Tensor phi = c.reshape({B, T, H, R});
  if (gate) {
    const at::Tensor s = at::sigmoid(gate->forward(xn));
    phi =
        phi * (o.gate() == PhaseGate::per_head ? s.reshape({B, T, H, 1}) : s.reshape({B, T, H, R}));
  }
  return phi;
}

at::Tensor SelectiveRoPEImpl::forward(const at::Tensor& x, SelectiveRoPECache* cache) {
  const auto& cp = options.context_parallel();
  conv->options.context_parallel(cp);
  if (cp) {
    TORCH_CHECK(cache == nullptr,
                "SelectiveRoPE: option 'context_parallel': a decoding cache cannot be used with "
                "context parallelism (it is for training and prefill)");
    return std::get<0>(cp->selective_rope_phases(phase_increments(x, nullptr), omega_, c10::nullopt,
                                                 false, c10::nullopt));
  }
  const at::Tensor phi = phase_increments(x, cache ? &cache->conv_state : nullptr);
  c10::optional<at::Tensor> initial;
  if (cache && cache->phase.defined()) initial = cache->phase;
  auto [theta, final_phase] = phasor::selective_rope_phases(phi, omega_, initial, cache != nullptr);
  if (cache) cache->phase = *final_phase;
  return theta;
}

// ---- GatedLinearAttention -----------------------------------------------------------------------

GatedLinearAttentionImpl::GatedLinearAttentionImpl(GatedLinearAttentionOptions options_)
    : options(std::move(options_)) {
  reset();
}

void GatedLinearAttentionImpl::reset() {
  const char* layer = "GatedLinearAttention";
  const auto& o = options;
  check_positive(layer, "hidden_size", o.hidden_size());
  check_positive(layer, "num_heads", o.num_heads());
  const std::int64_t D = o.hidden_size(), H = o.num_heads();
  const std::int64_t key_dim = expanded_width(layer, "expand_k", D, o.expand_k(), H);
  const std::int64_t value_dim = expanded_width(layer, "expand_v", D, o.expand_v(), H);
  head_k = key_dim / H, head_v = value_dim / H;
  check_positive(layer, "gate_low_rank_dim", o.gate_low_rank_dim());
  check_option(o.gate_logit_normalizer() > 0, layer, "gate_logit_normalizer", "a positive number",
               std::to_string(o.gate_logit_normalizer()));
  // A floor above 0 would let the state grow (g > 1); NaN would pass no comparison.
  if (o.clamp_min())
    check_option(*o.clamp_min() <= 0.0, layer, "clamp_min", "a number ≤ 0 (a log forget gate)",
                 std::to_string(*o.clamp_min()));
  check_positive(layer, "chunk_size", o.chunk_size());
  if (o.use_short_conv()) check_positive(layer, "conv_size", o.conv_size());
  check_rotation(layer, o.pos_encoding(), head_k, o.rope_theta());

  q_proj = register_module("q_proj", linear(D, key_dim, false));
  k_proj = register_module("k_proj", linear(D, key_dim, false));
  v_proj = register_module("v_proj", linear(D, value_dim, false));
  if (o.use_output_gate()) g_proj = register_module("g_proj", linear(D, value_dim, false));
  const bool tied = o.pos_encoding() != PosEncoding::none && o.tie_gate_pairs();
  gk_down = register_module("gk_down", linear(D, o.gate_low_rank_dim(), false));
  gk_up =
      register_module("gk_up", linear(o.gate_low_rank_dim(), tied ? key_dim / 2 : key_dim, true));
  if (o.use_short_conv()) {
    q_conv = register_module("q_conv",
                             ShortConvolution(ShortConvolutionOptions(key_dim, o.conv_size())));
    k_conv = register_module("k_conv",
                             ShortConvolution(ShortConvolutionOptions(key_dim, o.conv_size())));
    v_conv = register_module("v_conv",
                             ShortConvolution(ShortConvolutionOptions(value_dim, o.conv_size())));
  }
  o_norm_weight = register_parameter("o_norm_weight", ones_parameter(head_v));
  o_proj = register_module("o_proj", linear(value_dim, D, false));
  rope = make_rope(*this, o.pos_encoding(), o.selective_rope(), D, H, head_k);
  rotations.build(*this, o.pos_encoding(), o.rotation(), H, head_k, o.rope_theta(),
                  o.rotary_layout());
}

at::Tensor GatedLinearAttentionImpl::forget_gates(const at::Tensor& x) {
  check_input("GatedLinearAttention", x, options.hidden_size());
  check_dtype_matches("GatedLinearAttention", x, q_proj->weight);
  return forget_gates_from_low_rank(gk_down->forward(x));
}

at::Tensor GatedLinearAttentionImpl::forget_gates_from_low_rank(const at::Tensor& low_rank) {
  const auto& o = options;
  const std::int64_t B = low_rank.size(0), T = low_rank.size(1), H = o.num_heads();
  at::Tensor g = at::log_sigmoid(gk_up->forward(low_rank)) / o.gate_logit_normalizer();
  if (o.clamp_min()) g = at::clamp_min(g, *o.clamp_min());
  const bool tied = o.pos_encoding() != PosEncoding::none && o.tie_gate_pairs();
  if (!tied) return g.reshape({B, T, H, head_k});
  // One decay per rotation pair, copied onto both channels of the pair: pairs are (i, i + K/2)
  // in the half-split layout and (2i, 2i + 1) interleaved (phasor/common.h).
  const at::Tensor gh = g.reshape({B, T, H, head_k / 2});
  if (o.rotary_layout() == RotaryLayout::half_split) return at::cat({gh, gh}, -1);
  return gh.unsqueeze(-1).expand({B, T, H, head_k / 2, 2}).reshape({B, T, H, head_k});
}

at::Tensor GatedLinearAttentionImpl::forward(const at::Tensor& x, LayerCache* cache) {
  const auto& o = options;
  check_input("GatedLinearAttention", x, o.hidden_size());
  check_dtype_matches("GatedLinearAttention", x, q_proj->weight);
  const std::int64_t B = x.size(0), T = x.size(1), H = o.num_heads();
  const auto& cp = o.context_parallel();
  const std::int64_t offset = context_parallel_setup(
      "GatedLinearAttention", cp, cache, o.pos_encoding(), T, {&q_conv, &k_conv, &v_conv}, rope);
  // q, k, v, the forget gate's low-rank projection and the output gate all read x: one product
  // with their weights stacked (see stacked_projections).
  std::vector<torch::nn::Linear> projections{q_proj, k_proj, v_proj, gk_down};
  if (g_proj) projections.push_back(g_proj);
  const std::vector<at::Tensor> projected = stacked_projections(x, projections);
  at::Tensor q = projected[0], k = projected[1], v = projected[2];
  if (o.use_short_conv()) {
    q = q_conv->forward(q, cache ? &cache->q_conv : nullptr);
    k = k_conv->forward(k, cache ? &cache->k_conv : nullptr);
    v = v_conv->forward(v, cache ? &cache->v_conv : nullptr);
  }
  q = q.reshape({B, T, H, head_k}), k = k.reshape({B, T, H, head_k});
  v = v.reshape({B, T, H, head_v});
  const at::Tensor g = forget_gates_from_low_rank(projected[3]);
  at::Tensor theta =
      position_angles(o.pos_encoding(), rope, o.rope_theta(), x, H, head_k, cache, offset);
  // Learnable rotations (E1 in nn.h): q, k ← M q, M k, then RoPE(θ) as below.
  if (rotations.defined()) theta = rotations.rotate(q, k, offset);
  theta = unfused_rotation(o.fused_rotation(), theta, q, k, o.rotary_layout());

  c10::optional<at::Tensor> h0;
  if (cache && cache->state.defined()) h0 = cache->state;
  // Decoding one token: the recurrent kernel (fla's fused_recurrent_gla in generation).
  const Impl impl = cache && T == 1 ? Impl::recurrent : o.impl();
  auto [out, ht] =
      cp ? cp->gla(q, k, v, g, impl, c10::nullopt, c10::nullopt, false, c10::nullopt,
                   o.chunk_size(), optional_of(theta), o.rotary_layout())
         : phasor::gla(q, k, v, g, impl, c10::nullopt, h0, cache != nullptr, c10::nullopt,
                       o.chunk_size(), optional_of(theta), o.rotary_layout());
  if (cache) cache->state = *ht, cache->offset += T;
  // The output norm and SiLU gate as one node (fla's FusedRMSNormGated).
  const at::Tensor y = g_proj ? rms_norm_gated(out, projected[4].reshape({B, T, H, head_v}),
                                               o_norm_weight, o.norm_eps(), "silu")
                              : rms_norm(out, o_norm_weight, o.norm_eps());
  return o_proj->forward(y.reshape({B, T, H * head_v}));
}

// ---- GatedDeltaNet ------------------------------------------------------------------------------

GatedDeltaNetImpl::GatedDeltaNetImpl(GatedDeltaNetOptions options_) : options(std::move(options_)) {
  reset();
}

void GatedDeltaNetImpl::reset() {
  const char* layer = "GatedDeltaNet";
  const auto& o = options;
  check_positive(layer, "hidden_size", o.hidden_size());
  check_positive(layer, "num_heads", o.num_heads());
  check_positive(layer, "head_dim", o.head_dim());
  const std::int64_t D = o.hidden_size(), H = o.num_heads(), K = o.head_dim();
  num_v_heads = o.num_v_heads().value_or(H);
  check_option(num_v_heads > 0 && num_v_heads % H == 0, layer, "num_v_heads",
               "a positive multiple of num_heads = " + std::to_string(H),
               std::to_string(num_v_heads));
  head_v = expanded_width(layer, "expand_v", K, o.expand_v(), 1);
  check_positive(layer, "chunk_size", o.chunk_size());
  if (o.use_short_conv()) check_positive(layer, "conv_size", o.conv_size());
  check_rotation(layer, o.pos_encoding(), K, o.rope_theta());
  const std::int64_t HV = num_v_heads, key_dim = H * K, value_dim = HV * head_v;

  q_proj = register_module("q_proj", linear(D, key_dim, false));
  k_proj = register_module("k_proj", linear(D, key_dim, false));
  v_proj = register_module("v_proj", linear(D, value_dim, false));
  a_proj = register_module("a_proj", linear(D, HV, false));
  b_proj = register_module("b_proj", linear(D, HV, false));
  {
    // fla's init: A ~ U[0, 16]; dt log-uniform in [0.001, 0.1], clamped ≥ 1e-4, and
    // dt_bias = softplus⁻¹(dt) = dt + log(−expm1(−dt)), so softplus(0 + dt_bias) = dt.
    torch::NoGradGuard no_grad;
    A_log = register_parameter("A_log", torch::empty({HV}).uniform_(0, 16).log());
    const at::Tensor dt = (torch::rand({HV}) * (std::log(0.1) - std::log(0.001)) + std::log(0.001))
                              .exp()
                              .clamp_min(1e-4);
    dt_bias = register_parameter("dt_bias", dt + at::log(-at::expm1(-dt)));
  }
  if (o.use_short_conv()) {
    q_conv = register_module("q_conv",
                             ShortConvolution(ShortConvolutionOptions(key_dim, o.conv_size())));
    k_conv = register_module("k_conv",
                             ShortConvolution(ShortConvolutionOptions(key_dim, o.conv_size())));
    v_conv = register_module("v_conv",
                             ShortConvolution(ShortConvolutionOptions(value_dim, o.conv_size())));
  }
  if (o.use_gate()) g_proj = register_module("g_proj", linear(D, value_dim, false));
  o_norm_weight = register_parameter("o_norm_weight", ones_parameter(head_v));
  o_proj = register_module("o_proj", linear(value_dim, D, false));
  rope = make_rope(*this, o.pos_encoding(), o.selective_rope(), D, H, K);
  rotations.build(*this, o.pos_encoding(), o.rotation(), H, K, o.rope_theta(), o.rotary_layout());
}

at::Tensor GatedDeltaNetImpl::forward(const at::Tensor& x, LayerCache* cache) {
  const auto& o = options;
  check_input("GatedDeltaNet", x, o.hidden_size());
  check_dtype_matches("GatedDeltaNet", x, q_proj->weight);
  const std::int64_t B = x.size(0), T = x.size(1), H = o.num_heads(), K = o.head_dim(),
                     HV = num_v_heads;
  const auto& cp = o.context_parallel();
  const std::int64_t offset = context_parallel_setup("GatedDeltaNet", cp, cache, o.pos_encoding(),
                                                     T, {&q_conv, &k_conv, &v_conv}, rope);
  // q, k, v, β's and the decay's projections and the output gate all read x: one product with
  // their weights stacked (see stacked_projections).
  std::vector<torch::nn::Linear> projections{q_proj, k_proj, v_proj, b_proj, a_proj};
  if (g_proj) projections.push_back(g_proj);
  const std::vector<at::Tensor> projected = stacked_projections(x, projections);
  at::Tensor q = projected[0], k = projected[1], v = projected[2];
  if (o.use_short_conv()) {
    q = q_conv->forward(q, cache ? &cache->q_conv : nullptr);
    k = k_conv->forward(k, cache ? &cache->k_conv : nullptr);
    v = v_conv->forward(v, cache ? &cache->v_conv : nullptr);
  } else {
    q = at::silu(q), k = at::silu(k), v = at::silu(v);  // as fla without short convolutions
  }
  q = q.reshape({B, T, H, K}), k = k.reshape({B, T, H, K}), v = v.reshape({B, T, HV, head_v});
  at::Tensor beta = at::sigmoid(projected[3]);
  if (o.allow_neg_eigval()) beta = beta * 2.0;
  const at::Tensor g = -A_log.exp() * at::softplus(projected[4] + dt_bias);
  at::Tensor theta =
      position_angles(o.pos_encoding(), rope, o.rope_theta(), x, H, K, cache, offset);
  // Learnable rotations (E1 in nn.h): q, k ← M q, M k, then RoPE(θ) as below.
  if (rotations.defined()) theta = rotations.rotate(q, k, offset);
  // ℓ2 normalisation in the kernel commutes with the rotation (rotations preserve norms).
  theta = unfused_rotation(o.fused_rotation(), theta, q, k, o.rotary_layout());

  c10::optional<at::Tensor> h0;
  if (cache && cache->state.defined()) h0 = cache->state;
  const Impl impl = cache && T == 1 ? Impl::recurrent : o.impl();
  auto [out, ht] =
      cp ? cp->gated_delta_rule(q, k, v, g, beta, impl, c10::nullopt, c10::nullopt, false,
                                c10::nullopt, /*use_qk_l2norm_in_kernel=*/true, o.chunk_size(),
                                optional_of(theta), o.rotary_layout())
         : phasor::gated_delta_rule(q, k, v, g, beta, impl, c10::nullopt, h0, cache != nullptr,
                                    c10::nullopt, /*use_qk_l2norm_in_kernel=*/true, o.chunk_size(),
                                    optional_of(theta), o.rotary_layout());
  if (cache) cache->state = *ht, cache->offset += T;
  // The output norm and SiLU gate as one node (fla's FusedRMSNormGated).
  const at::Tensor y = g_proj ? rms_norm_gated(out, projected[5].reshape({B, T, HV, head_v}),
                                               o_norm_weight, o.norm_eps(), "silu")
                              : rms_norm(out, o_norm_weight, o.norm_eps());
  return o_proj->forward(y.reshape({B, T, HV * head_v}));
}

// ---- ForgettingAttention ------------------------------------------------------------------------

at::Tensor alibi_slopes(std::int64_t num_heads) {
  TORCH_CHECK(num_heads > 0, "alibi_slopes: argument 'num_heads': expected a positive number, got ",
              num_heads);
  // Press et al.'s reference: n = 2^k heads get start·start^i with start = 2^(−8/n); other n take
  // the 2^⌊log2 n⌋ slopes and then every other slope of twice that many heads.
  auto power_of_two = [](std::int64_t n) {
    std::vector<double> out;
    const double start = std::pow(2.0, -8.0 / static_cast<double>(n));
    for (std::int64_t i = 0; i < n; ++i) out.push_back(std::pow(start, static_cast<double>(i + 1)));
    return out;
  };
  std::int64_t p = 1;
  while (p * 2 <= num_heads) p *= 2;
  std::vector<double> slopes = power_of_two(p);
  if (p < num_heads) {
    const std::vector<double> extra = power_of_two(2 * p);
    for (std::int64_t i = 0; static_cast<std::int64_t>(slopes.size()) < num_heads; i += 2)
      slopes.push_back(extra[static_cast<std::size_t>(i)]);
  }
  return torch::tensor(slopes, torch::kDouble);
}

ForgettingAttentionImpl::ForgettingAttentionImpl(ForgettingAttentionOptions options_)
    : options(std::move(options_)) {
  reset();
}

void ForgettingAttentionImpl::reset() {
  const char* layer = "ForgettingAttention";
  const auto& o = options;
  check_positive(layer, "hidden_size", o.hidden_size());
  check_positive(layer, "num_heads", o.num_heads());
  const std::int64_t D = o.hidden_size(), HQ = o.num_heads();
  check_option(D % HQ == 0, layer, "hidden_size", "a multiple of num_heads = " + std::to_string(HQ),
               std::to_string(D));
  num_kv_heads = o.num_kv_heads().value_or(HQ);
  check_option(num_kv_heads > 0 && HQ % num_kv_heads == 0, layer, "num_kv_heads",
               "a positive divisor of num_heads = " + std::to_string(HQ),
               std::to_string(num_kv_heads));
  if (o.window_size()) check_positive(layer, "window_size", *o.window_size());
  check_positive(layer, "block_size", o.block_size());
  head_dim = D / HQ;
  check_rotation(layer, o.pos_encoding(), head_dim, o.rope_theta());
  const std::int64_t H = num_kv_heads, K = head_dim;

  q_proj = register_module("q_proj", linear(D, HQ * K, o.qkv_bias()));
  k_proj = register_module("k_proj", linear(D, H * K, o.qkv_bias()));
  v_proj = register_module("v_proj", linear(D, H * K, o.qkv_bias()));
  if (o.use_forget_gate()) f_proj = register_module("f_proj", linear(D, HQ, true));
  if (o.use_output_gate()) g_proj = register_module("g_proj", linear(D, HQ * K, false));
  if (o.qk_norm()) {
    q_norm_weight = register_parameter("q_norm_weight", ones_parameter(K));
    k_norm_weight = register_parameter("k_norm_weight", ones_parameter(K));
  }
  if (o.use_output_norm()) o_norm_weight = register_parameter("o_norm_weight", ones_parameter(K));
  o_proj = register_module("o_proj", linear(HQ * K, D, false));
  rope = make_rope(*this, o.pos_encoding(), o.selective_rope(), D, H, K);
  // Additive position bias (nn.h): fixed ALiBi slopes, or GRAPE-A-QK's learnable v, u, ω.
  if (o.additive_bias() == AdditiveBias::alibi) {
    alibi = register_buffer("alibi_slopes", alibi_slopes(HQ).to(at::kFloat));
  } else if (o.additive_bias() == AdditiveBias::grape_a) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(K));
    grape_v = register_parameter("grape_v", uniform({HQ, K}, bound));
    grape_u = register_parameter("grape_u", uniform({H, K}, bound));
    // ω_h = ALiBi slope / (2 ln 2): with v = u = 0, ω (softplus(0) + softplus(0)) = the slope.
    grape_log_omega = register_parameter(
        "grape_log_omega", (alibi_slopes(H) / (2.0 * std::log(2.0))).log().to(at::kFloat));
  }
  rotations.build(*this, o.pos_encoding(), o.rotation(), H, K, o.rope_theta(), o.rotary_layout());
}

std::pair<at::Tensor, at::Tensor> ForgettingAttentionImpl::bias_slopes(const at::Tensor& q,
                                                                       const at::Tensor& k) {
  const std::int64_t B = q.size(0), T = q.size(1), HQ = q.size(2), H = k.size(2), K = q.size(3);
  switch (options.additive_bias()) {
    case AdditiveBias::none:
      break;
    case AdditiveBias::alibi:
      // The head's slope at every token (a zero-stride view; the kernels read any strides).
      return {alibi.to(q.scalar_type()).expand({B, T, HQ}), at::Tensor()};
    case AdditiveBias::grape_a: {
      // GRAPE Eq. 4.6: a_i = ω softplus(vᵀq_i/√K), b_j = ω softplus(uᵀk_j/√K); query head hq
      // uses the ω of its key head hq / (HQ / H).
      const double inv = 1.0 / std::sqrt(static_cast<double>(K));
      const at::Tensor omega = grape_log_omega.exp();
      const at::Tensor a =
          omega.repeat_interleave(HQ / H) * at::softplus((q * grape_v).sum(-1) * inv);
      const at::Tensor b = omega * at::softplus((k * grape_u).sum(-1) * inv);
      return {a, b};
    }
  }
  return {at::Tensor(), at::Tensor()};
}

at::Tensor ForgettingAttentionImpl::forward(const at::Tensor& x, LayerCache* cache) {
  const auto& o = options;
  check_input("ForgettingAttention", x, o.hidden_size());
  check_dtype_matches("ForgettingAttention", x, q_proj->weight);
  const std::int64_t B = x.size(0), T = x.size(1), HQ = o.num_heads(), H = num_kv_heads,
                     K = head_dim;
  const auto& cp = o.context_parallel();
  const std::int64_t offset =
      context_parallel_setup("ForgettingAttention", cp, cache, o.pos_encoding(), T, {}, rope);
  at::Tensor q = q_proj->forward(x).reshape({B, T, HQ, K});
  at::Tensor k = k_proj->forward(x).reshape({B, T, H, K});
  const at::Tensor v = v_proj->forward(x).reshape({B, T, H, K});
  if (o.qk_norm()) {
    q = rms_norm(q, q_norm_weight, o.norm_eps());
    k = rms_norm(k, k_norm_weight, o.norm_eps());
  }
  // Without the forget gate every log gate is 0: the bias Σ f vanishes and the op is plain
  // causal softmax attention (same kernels, so the control arm differs only by the gate).
  const at::Tensor f =
      f_proj ? at::log_sigmoid(f_proj->forward(x)) : at::zeros({B, T, HQ}, x.options());
  // Additive bias slopes from the unrotated q, k (GRAPE-A reads their content).
  const auto [slope_q, slope_k] = bias_slopes(q, k);
  at::Tensor theta =
      position_angles(o.pos_encoding(), rope, o.rope_theta(), x, H, K, cache, offset);
  // Learnable rotations (E1 in nn.h): q, k ← M q, M k, then RoPE(θ) as below.
  if (rotations.defined()) theta = rotations.rotate(q, k, offset);
  theta = unfused_rotation(o.fused_rotation(), theta, q, k, o.rotary_layout());

  at::Tensor out;
  if (cache) {
    if (!cache->fox)
      cache->fox =
          std::make_shared<ForgettingAttnDecoder>(B, HQ, H, K, K, o.window_size(), c10::nullopt);
    std::vector<at::Tensor> rows;
    rows.reserve(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) {
      c10::optional<at::Tensor> theta_t;
      if (theta.defined()) theta_t = theta.narrow(1, t, 1);
      c10::optional<at::Tensor> slope_q_t, slope_k_t;
      if (slope_q.defined()) slope_q_t = slope_q.narrow(1, t, 1);
      if (slope_k.defined()) slope_k_t = slope_k.narrow(1, t, 1);
      rows.push_back(cache->fox->step(q.narrow(1, t, 1), k.narrow(1, t, 1), v.narrow(1, t, 1),
                                      f.narrow(1, t, 1), theta_t, o.rotary_layout(), slope_q_t,
                                      slope_k_t));
    }
    out = at::cat(rows, 1);
    cache->offset += T;
  } else if (cp) {
    out = cp->forgetting_attn(q, k, v, f, Impl::chunk, c10::nullopt, o.window_size(), c10::nullopt,
                              o.block_size(), optional_of(theta), o.rotary_layout(),
                              optional_of(slope_q), optional_of(slope_k));
  } else {
    out = phasor::parallel_forgetting_attn(q, k, v, f, c10::nullopt, o.window_size(), c10::nullopt,
                                           o.block_size(), optional_of(theta), o.rotary_layout(),
                                           optional_of(slope_q), optional_of(slope_k));
  }
  if (g_proj) {
    const at::Tensor gate = g_proj->forward(x).reshape({B, T, HQ, K});
    out = o.use_output_norm() ? rms_norm_gated(out, gate, o_norm_weight, o.norm_eps(), "sigmoid")
                              : out * at::sigmoid(gate);
  } else if (o.use_output_norm()) {
    out = rms_norm(out, o_norm_weight, o.norm_eps());
  }
  return o_proj->forward(out.reshape({B, T, HQ * K}));
}

}  // namespace phasor::nn
