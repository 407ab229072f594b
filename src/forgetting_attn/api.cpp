// Forgetting attention: metadata checks, the problem description, and the dispatch to the
// implementation on the call's device (common/dispatch.h).
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/rotation.h"
#include "forgetting_attn/forgetting_attn.h"
#include "forgetting_attn/kernels.h"
#include "phasor/forgetting_attn.h"
#include "phasor/ops.h"

namespace phasor {
namespace {

using detail::fox::Problem;

// A slope gradient, if requested, needs its slope, must have its shape and must own each element
// (work items write disjoint (sequence, head) columns; a zero stride would make them share one).
void check_slope_grad(const std::string& op, const char* name, const TensorView& grad,
                      const char* slope_name, const TensorView& slope, Device device) {
  if (!grad.defined()) return;
  if (!slope.defined())
    detail::fail(op, name, std::string(slope_name) + " to be given (" + name + " is its gradient)",
                 std::string(name) + " requested without " + slope_name);
  detail::check_owned_output(op, name, grad,
                             {{slope.size(0), "B"}, {slope.size(1), "T"}, {slope.size(2), "heads"}},
                             device);
}

// Checks the metadata of every input of `params` against q's and builds the problem.
Problem make_problem(const std::string& op, const ForgettingAttnParams& params, Impl impl) {
  Problem p;
  p.device = detail::call_device(op, "q", params.q, /*gpu_capable=*/true);
  detail::check_float_rank(op, "q", params.q, 4, "[B, T, HQ, K]", p.device);
  p.B = params.q.size(0), p.T = params.q.size(1), p.HQ = params.q.size(2), p.K = params.q.size(3);
  detail::check_float_rank(op, "k", params.k, 4, "[B, T, H, K]", p.device);
  p.H = params.k.size(2);
  if (p.H < 1 || p.HQ % p.H != 0)
    detail::fail(op, "k",
                 "a number of key/value heads H >= 1 that divides the number of query heads HQ = " +
                     std::to_string(p.HQ),
                 "H = " + std::to_string(p.H) + " (shape " + params.k.shape_string() + ")");
  detail::check_float_tensor(op, "k", params.k,
                             {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K (as q)"}}, p.device);
  detail::check_float_rank(op, "v", params.v, 4, "[B, T, H, V]", p.device);
  p.V = params.v.size(3);
  detail::check_float_tensor(op, "v", params.v,
                             {{p.B, "B"}, {p.T, "T"}, {p.H, "H (as k)"}, {p.V, "V"}}, p.device);
  detail::check_float_tensor(op, "g", params.g, {{p.B, "B"}, {p.T, "T"}, {p.HQ, "HQ (as q)"}},
                             p.device);
  p.q = params.q, p.k = params.k, p.v = params.v, p.g = params.g;
  p.sequences = detail::sequences(op, params.cu_seqlens, p.B, p.T, p.device);
  p.scale = detail::resolve_scale(op, params.scale, p.K);
  if (params.window_size) {
    if (*params.window_size < 1)
      detail::fail(op, "window_size", "none (full causal attention) or an integer >= 1",
                   std::to_string(*params.window_size));
    p.window = *params.window_size;
  }
  // Only the tiled kernel uses block_size; the GPU kernels are built for tiles of 16, 32 and 64
  // (an upper bound: they halve it while large K, V need the shared memory).
  if (impl == Impl::chunk) detail::check_positive(op, "block_size", params.block_size);
  if (impl == Impl::chunk && p.device != Device::cpu && params.block_size != 16 &&
      params.block_size != 32 && params.block_size != 64)
    detail::fail(op, "block_size", "16, 32 or 64 on a GPU device",
                 std::to_string(params.block_size));
  p.block_size = params.block_size;
  // On the cpu a block longer than the batch is the whole sequence; clamping keeps the tiles'
  // counts (length + block_size − 1) far from overflow for huge values.
  if (p.device == Device::cpu && impl == Impl::chunk)
    p.block_size = std::max<std::int64_t>(1, std::min<std::int64_t>(params.block_size, p.T));
  // θ is per key head: query head hq is rotated by the angles of its key head hq / (HQ / H).
  detail::check_theta(op, params.theta, p.B, p.T, p.H, p.K, "H (key heads)", p.device);
  p.theta = params.theta;
  p.rotary_layout = params.rotary_layout;
  // Additive GRAPE slopes: a per query head, b per key/value head (shared by the group).
  if (params.bias_q_slope.defined())
    detail::check_float_tensor(op, "bias_q_slope", params.bias_q_slope,
                               {{p.B, "B"}, {p.T, "T"}, {p.HQ, "HQ (as q)"}}, p.device);
  if (params.bias_k_slope.defined())
    detail::check_float_tensor(op, "bias_k_slope", params.bias_k_slope,
                               {{p.B, "B"}, {p.T, "T"}, {p.H, "H (as k)"}}, p.device);
  p.slope_q = params.bias_q_slope;
  p.slope_k = params.bias_k_slope;
  return p;
}

// What the call's device must check in the data before any kernel reads it. An infinite slope
// would make (i − j)·slope NaN at i = j (0·inf), and the NaN would spread through the softmax row.
detail::ValueChecks value_checks(const Problem& p) {
  detail::ValueChecks checks;
  checks.sequences = p.sequences;
  checks.add("g", p.g, detail::ValueRule::log_gate);
  checks.add("bias_q_slope", p.slope_q, detail::ValueRule::finite);
  checks.add("bias_k_slope", p.slope_k, detail::ValueRule::finite);
  return checks;
}

}  // namespace

void forgetting_attn_forward(const ForgettingAttnParams& params, Impl impl, const TensorView& o,
                             const TensorView& lse) {
  const std::string op = op_name(Op::forgetting_attn, impl);
  const Problem p = make_problem(op, params, impl);
  detail::check_output(op, "o", o, {{p.B, "B"}, {p.T, "T"}, {p.HQ, "HQ"}, {p.V, "V"}}, p.device);
  if (lse.defined())
    detail::check_output(op, "lse", lse, {{p.B, "B"}, {p.T, "T"}, {p.HQ, "HQ"}}, p.device);
  detail::run_on_device(
      op, Op::forgetting_attn, impl, p.device, value_checks(p),
      [&] {
        switch (impl) {
          case Impl::reference:
            return detail::fox::reference_forward(p, o, lse);
          case Impl::recurrent:
            return detail::fox::recurrent_forward(p, o, lse);
          case Impl::chunk:
            return detail::fox::chunk_forward(p, o, lse);
        }
      },
      // Only Impl::chunk has CUDA kernels (phasor/ops.h); run_on_device refuses the others.
      [&] { PHASOR_ON_GPU(p.device, fox::chunk_forward(p, o, lse)); });
}

void forgetting_attn_backward(const ForgettingAttnParams& params, Impl impl, const TensorView& d_o,
                              const TensorView& o, const TensorView& lse,
                              const ForgettingAttnGrads& grads) {
  const std::string op = op_name(Op::forgetting_attn, impl);
  Problem p = make_problem(op, params, impl);
  p.dlogit_sums_elsewhere = params.dlogit_sums_elsewhere;
  const std::initializer_list<detail::Dim> out = {{p.B, "B"}, {p.T, "T"}, {p.HQ, "HQ"}, {p.V, "V"}},
                                           rows = {{p.B, "B"}, {p.T, "T"}, {p.HQ, "HQ"}};
  detail::check_float_tensor(op, "d_o", d_o, out, p.device);
  if (o.defined()) detail::check_float_tensor(op, "o", o, out, p.device);
  if (lse.defined()) detail::check_float_tensor(op, "lse", lse, rows, p.device);
  if (grads.dq.defined())
    detail::check_output(op, "dq", grads.dq, {{p.B, "B"}, {p.T, "T"}, {p.HQ, "HQ"}, {p.K, "K"}},
                         p.device);
  if (grads.dk.defined())
    detail::check_output(op, "dk", grads.dk, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}},
                         p.device);
  if (grads.dv.defined())
    detail::check_output(op, "dv", grads.dv, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.V, "V"}},
                         p.device);
  if (grads.dg.defined()) detail::check_output(op, "dg", grads.dg, rows, p.device);
  if (params.dlogit_sums_elsewhere.defined()) {
    if (impl == Impl::reference || p.device != Device::cpu)
      detail::fail(op, "dlogit_sums_elsewhere",
                   "Impl::chunk or Impl::recurrent on the cpu (the kernels that take o and lse)",
                   impl == Impl::reference ? "Impl::reference" : "a GPU device");
    detail::check_float_tensor(op, "dlogit_sums_elsewhere", params.dlogit_sums_elsewhere, rows,
                               p.device);
  }
  detail::check_dtheta(op, grads.dtheta, params.theta, p.device);
  check_slope_grad(op, "dbias_q_slope", grads.dbias_q_slope, "bias_q_slope", params.bias_q_slope,
                   p.device);
  check_slope_grad(op, "dbias_k_slope", grads.dbias_k_slope, "bias_k_slope", params.bias_k_slope,
                   p.device);
  detail::run_on_device(
      op, Op::forgetting_attn, impl, p.device, value_checks(p),
      [&] {
        switch (impl) {
          case Impl::reference:
            return detail::fox::reference_backward(p, d_o, grads);
          case Impl::recurrent:
            return detail::fox::recurrent_backward(p, d_o, o, lse, grads);
          case Impl::chunk:
            return detail::fox::chunk_backward(p, d_o, o, lse, grads);
        }
      },
      [&] { PHASOR_ON_GPU(p.device, fox::chunk_backward(p, d_o, o, lse, grads)); });
}

}  // namespace phasor
