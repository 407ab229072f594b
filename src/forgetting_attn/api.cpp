// Forgetting attention: argument validation and dispatch to the reference, recurrent and chunk
// kernels.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <cmath>
#include <string>

#include "common/check.h"
#include "common/rotation.h"
#include "common/slices.h"
#include "forgetting_attn/kernels.h"
#include "phasor/forgetting_attn.h"

namespace phasor {
namespace {

using detail::fox::Problem;

// The fla name of each implementation, used in every error message.
std::string op_name(Impl impl) {
  switch (impl) {
    case Impl::reference:
      return "forgetting_attn_reference";
    case Impl::recurrent:
      return "forgetting_attn_recurrent";
    case Impl::chunk:
      return "parallel_forgetting_attn";
  }
  return "forgetting_attn";
}

// A slope gradient, if requested, needs its slope, must have its shape and must own each element
// (work items write disjoint (sequence, head) columns; a zero stride would make them share one).
void check_slope_grad(const std::string& op, const char* name, const TensorView& grad,
                      const char* slope_name, const TensorView& slope) {
  if (!grad.defined()) return;
  if (!slope.defined())
    detail::fail(op, name, std::string(slope_name) + " to be given (" + name + " is its gradient)",
                 std::string(name) + " requested without " + slope_name);
  detail::check_output(op, name, grad,
                       {{slope.size(0), "B"}, {slope.size(1), "T"}, {slope.size(2), "heads"}});
  if (grad.numel() == 0) return;
  for (int d = 0; d < 3; ++d)
    if (grad.size(d) > 1 && grad.stride(d) == 0)
      detail::fail(
          op, name, "a tensor that owns each element (no zero strides)",
          "stride 0 in dimension " + std::to_string(d) + " of shape " + grad.shape_string());
}

// Checks every input of `params` against q's dimensions and resolves sequences and options.
Problem validate_inputs(const std::string& op, const ForgettingAttnParams& params, Impl impl) {
  detail::check_float_rank(op, "q", params.q, 4, "[B, T, HQ, K]");
  const std::int64_t B = params.q.size(0), T = params.q.size(1), HQ = params.q.size(2),
                     K = params.q.size(3);
  detail::check_float_rank(op, "k", params.k, 4, "[B, T, H, K]");
  const std::int64_t H = params.k.size(2);
  if (H < 1 || HQ % H != 0)
    detail::fail(op, "k",
                 "a number of key/value heads H >= 1 that divides the number of query heads HQ = " +
                     std::to_string(HQ),
                 "H = " + std::to_string(H) + " (shape " + params.k.shape_string() + ")");
  detail::check_float_tensor(op, "k", params.k, {{B, "B"}, {T, "T"}, {H, "H"}, {K, "K (as q)"}});
  detail::check_float_rank(op, "v", params.v, 4, "[B, T, H, V]");
  const std::int64_t V = params.v.size(3);
  detail::check_float_tensor(op, "v", params.v, {{B, "B"}, {T, "T"}, {H, "H (as k)"}, {V, "V"}});
  detail::check_float_tensor(op, "g", params.g, {{B, "B"}, {T, "T"}, {HQ, "HQ (as q)"}});

  Problem p;
  p.op = op;
  p.q = params.q;
  p.k = params.k;
  p.v = params.v;
  p.g = params.g;
  p.sequences = detail::sequences(op, params.cu_seqlens, B, T);
  p.HQ = HQ;
  p.H = H;
  p.K = K;
  p.V = V;
  p.scale = detail::resolve_scale(op, params.scale, K);
  if (params.window_size) {
    if (*params.window_size < 1)
      detail::fail(op, "window_size", "none (full causal attention) or an integer >= 1",
                   std::to_string(*params.window_size));
    p.window = *params.window_size;
  }
  // Only the tiled kernel uses block_size.
  if (impl == Impl::chunk) detail::check_positive(op, "block_size", params.block_size);
  p.block_size = params.block_size;
  detail::check_log_gates(op, "g", params.g);
  // θ is per key head: query head hq is rotated by the angles of its key head hq / (HQ / H).
  detail::check_theta(op, params.theta, B, T, H, K, "H (key heads)");
  p.theta = params.theta;
  p.rotary_layout = params.rotary_layout;
  // Additive GRAPE slopes: a per query head, b per key/value head (shared by the group).
  if (params.bias_q_slope.defined()) {
    detail::check_float_tensor(op, "bias_q_slope", params.bias_q_slope,
                               {{B, "B"}, {T, "T"}, {HQ, "HQ (as q)"}});
    detail::fox::check_finite_slopes(op, "bias_q_slope", params.bias_q_slope);
  }
  if (params.bias_k_slope.defined()) {
    detail::check_float_tensor(op, "bias_k_slope", params.bias_k_slope,
                               {{B, "B"}, {T, "T"}, {H, "H (as k)"}});
    detail::fox::check_finite_slopes(op, "bias_k_slope", params.bias_k_slope);
  }
  p.slope_q = params.bias_q_slope;
  p.slope_k = params.bias_k_slope;
  return p;
}

}  // namespace

void forgetting_attn_forward(const ForgettingAttnParams& params, Impl impl, const TensorView& o,
                             const TensorView& lse) {
  const std::string op = op_name(impl);
  const Problem p = validate_inputs(op, params, impl);
  const std::int64_t B = params.q.size(0), T = params.q.size(1);
  detail::check_output(op, "o", o, {{B, "B"}, {T, "T"}, {p.HQ, "HQ"}, {p.V, "V"}});
  if (lse.defined()) detail::check_output(op, "lse", lse, {{B, "B"}, {T, "T"}, {p.HQ, "HQ"}});
  switch (impl) {
    case Impl::reference:
      detail::fox::reference_forward(p, o, lse);
      return;
    case Impl::recurrent:
      detail::fox::recurrent_forward(p, o, lse);
      return;
    case Impl::chunk:
      detail::fox::chunk_forward(p, o, lse);
      return;
  }
}

void forgetting_attn_backward(const ForgettingAttnParams& params, Impl impl, const TensorView& d_o,
                              const TensorView& o, const TensorView& lse,
                              const ForgettingAttnGrads& grads) {
  const std::string op = op_name(impl);
  const Problem p = validate_inputs(op, params, impl);
  const std::int64_t B = params.q.size(0), T = params.q.size(1);
  detail::check_float_tensor(op, "d_o", d_o, {{B, "B"}, {T, "T"}, {p.HQ, "HQ"}, {p.V, "V"}});
  if (o.defined())
    detail::check_float_tensor(op, "o", o, {{B, "B"}, {T, "T"}, {p.HQ, "HQ"}, {p.V, "V"}});
  if (lse.defined()) detail::check_float_tensor(op, "lse", lse, {{B, "B"}, {T, "T"}, {p.HQ, "HQ"}});
  if (grads.dq.defined())
    detail::check_output(op, "dq", grads.dq, {{B, "B"}, {T, "T"}, {p.HQ, "HQ"}, {p.K, "K"}});
  if (grads.dk.defined())
    detail::check_output(op, "dk", grads.dk, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.dv.defined())
    detail::check_output(op, "dv", grads.dv, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.V, "V"}});
  if (grads.dg.defined())
    detail::check_output(op, "dg", grads.dg, {{B, "B"}, {T, "T"}, {p.HQ, "HQ"}});
  detail::check_dtheta(op, grads.dtheta, params.theta);
  check_slope_grad(op, "dbias_q_slope", grads.dbias_q_slope, "bias_q_slope", params.bias_q_slope);
  check_slope_grad(op, "dbias_k_slope", grads.dbias_k_slope, "bias_k_slope", params.bias_k_slope);
  switch (impl) {
    case Impl::reference:
      detail::fox::reference_backward(p, d_o, grads);
      return;
    case Impl::recurrent:
      detail::fox::recurrent_backward(p, d_o, o, lse, grads);
      return;
    case Impl::chunk:
      detail::fox::chunk_backward(p, d_o, o, lse, grads);
      return;
  }
}

namespace detail::fox {

void check_finite_slopes(const std::string& op, const char* name, const TensorView& x) {
  detail::dispatch_float(x, [&](auto tag) {
    using S = decltype(tag);
    const S* data = static_cast<const S*>(x.data);
    for (std::int64_t b = 0; b < x.size(0); ++b)
      for (std::int64_t t = 0; t < x.size(1); ++t)
        for (std::int64_t h = 0; h < x.size(2); ++h) {
          const S value = data[b * x.stride(0) + t * x.stride(1) + h * x.stride(2)];
          if (!std::isfinite(value))
            detail::fail(op, name, "finite slopes",
                         std::string(name) + "[" + std::to_string(b) + ", " + std::to_string(t) +
                             ", " + std::to_string(h) + "] = " + std::to_string(value));
        }
  });
}

}  // namespace detail::fox

}  // namespace phasor
