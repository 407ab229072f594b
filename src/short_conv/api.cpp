// Short convolution: argument validation and dispatch to the reference and the kernel.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <string>

#include "common/check.h"
#include "common/dispatch.h"
#include "phasor/ops.h"
#include "phasor/short_conv.h"
#include "short_conv/kernels.h"
#include "short_conv/short_conv.h"

namespace phasor {
namespace {

using detail::short_conv::Problem;

// fla's activation names: None / "silu" / "swish".
bool parse_silu(const std::string& op, const std::string& activation) {
  if (activation.empty() || activation == "none" || activation == "identity") return false;
  if (activation == "silu" || activation == "swish") return true;
  detail::fail(op, "activation", "\"none\", \"identity\", \"silu\" or \"swish\"",
               "\"" + activation + "\"");
}

// Checks the metadata of every input of `params` against x's and builds the problem.
Problem make_problem(const std::string& op, const ShortConvParams& params) {
  Problem p;
  p.device = detail::call_device(op, "x", params.x, /*gpu_capable=*/true);
  detail::check_float_rank(op, "x", params.x, 3, "[B, T, D]", p.device);
  p.B = params.x.size(0), p.T = params.x.size(1), p.D = params.x.size(2);
  detail::check_float_rank(op, "weight", params.weight, 2, "[D, W]", p.device);
  p.W = params.weight.size(1);
  if (p.W < 1)
    detail::fail(op, "weight", "kernel width W = weight.size(1) >= 1",
                 "W = " + std::to_string(p.W));
  detail::check_float_tensor(op, "weight", params.weight, {{p.D, "D (as x)"}, {p.W, "W"}},
                             p.device);
  if (params.bias.defined())
    detail::check_float_tensor(op, "bias", params.bias, {{p.D, "D (as x)"}}, p.device);
  p.x = params.x;
  p.weight = params.weight;
  p.bias = params.bias;
  p.sequences = detail::sequences(op, params.cu_seqlens, p.B, p.T, p.device);
  p.silu = parse_silu(op, params.activation);
  if (params.initial_cache.defined())
    detail::check_float_tensor(op, "initial_cache", params.initial_cache,
                               {{p.num_sequences(), "N"}, {p.D, "D"}, {p.W - 1, "W-1"}}, p.device);
  p.initial_cache = params.initial_cache;
  return p;
}

detail::ValueChecks value_checks(const Problem& p) {
  detail::ValueChecks checks;
  checks.sequences = p.sequences;
  return checks;
}

}  // namespace

void short_conv_forward(const ShortConvParams& params, Impl impl, const TensorView& y,
                        const TensorView& final_cache) {
  const std::string op = op_name(Op::short_conv, impl);
  const Problem p = make_problem(op, params);
  detail::check_output(op, "y", y, {{p.B, "B"}, {p.T, "T"}, {p.D, "D"}}, p.device);
  if (final_cache.defined())
    detail::check_output(op, "final_cache", final_cache,
                         {{p.num_sequences(), "N"}, {p.D, "D"}, {p.W - 1, "W-1"}}, p.device);
  detail::run_on_device(
      op, Op::short_conv, impl, p.device, value_checks(p),
      [&] {
        if (impl == Impl::reference)
          detail::short_conv::reference_forward(p, y, final_cache);
        else
          detail::short_conv::kernel_forward(p, y, final_cache);
      },
      [&] { PHASOR_ON_GPU(p.device, short_conv::kernel_forward(p, y, final_cache)); });
}

void short_conv_backward(const ShortConvParams& params, Impl impl, const TensorView& dy,
                         const TensorView& d_final_cache, const ShortConvGrads& grads) {
  const std::string op = op_name(Op::short_conv, impl);
  const Problem p = make_problem(op, params);
  const std::int64_t N = p.num_sequences();
  detail::check_float_tensor(op, "dy", dy, {{p.B, "B"}, {p.T, "T"}, {p.D, "D"}}, p.device);
  if (d_final_cache.defined())
    detail::check_float_tensor(op, "d_final_cache", d_final_cache,
                               {{N, "N"}, {p.D, "D"}, {p.W - 1, "W-1"}}, p.device);
  if (grads.dx.defined())
    detail::check_output(op, "dx", grads.dx, {{p.B, "B"}, {p.T, "T"}, {p.D, "D"}}, p.device);
  if (grads.dweight.defined())
    detail::check_output(op, "dweight", grads.dweight, {{p.D, "D"}, {p.W, "W"}}, p.device);
  if (grads.dbias.defined()) {
    if (!params.bias.defined())
      detail::fail(op, "dbias", "bias to be given (dbias is its gradient)",
                   "dbias requested without bias");
    detail::check_output(op, "dbias", grads.dbias, {{p.D, "D"}}, p.device);
  }
  if (grads.dinitial_cache.defined()) {
    if (!params.initial_cache.defined())
      detail::fail(op, "dinitial_cache",
                   "initial_cache to be given (dinitial_cache is its gradient)",
                   "dinitial_cache requested without initial_cache");
    detail::check_output(op, "dinitial_cache", grads.dinitial_cache,
                         {{N, "N"}, {p.D, "D"}, {p.W - 1, "W-1"}}, p.device);
  }
  detail::run_on_device(
      op, Op::short_conv, impl, p.device, value_checks(p),
      [&] {
        if (impl == Impl::reference)
          detail::short_conv::reference_backward(p, dy, d_final_cache, grads);
        else
          detail::short_conv::kernel_backward(p, dy, d_final_cache, grads);
      },
      [&] { PHASOR_ON_GPU(p.device, short_conv::kernel_backward(p, dy, d_final_cache, grads)); });
}

}  // namespace phasor
