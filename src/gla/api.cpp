// GLA: metadata checks, the problem description, and the dispatch to the implementation on the
// call's device (common/dispatch.h).
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/rotation.h"
#include "gla/gla.h"
#include "gla/kernels.h"
#include "phasor/gla.h"
#include "phasor/ops.h"

namespace phasor {
namespace {

using detail::gla::Problem;

// Checks the metadata of every input of `params` against q's and builds the problem.
Problem make_problem(const std::string& op, const GlaParams& params, Impl impl) {
  Problem p;
  p.device = detail::call_device(op, "q", params.q, /*gpu_capable=*/true);
  detail::check_float_rank(op, "q", params.q, 4, "[B, T, H, K]", p.device);
  p.B = params.q.size(0), p.T = params.q.size(1), p.H = params.q.size(2), p.K = params.q.size(3);
  detail::check_float_tensor(op, "k", params.k, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}},
                             p.device);
  detail::check_float_rank(op, "v", params.v, 4, "[B, T, H, V]", p.device);
  p.V = params.v.size(3);
  detail::check_float_tensor(op, "v", params.v, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.V, "V"}},
                             p.device);
  detail::check_float_tensor(op, "g", params.g, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}},
                             p.device);
  p.q = params.q, p.k = params.k, p.v = params.v, p.g = params.g;
  p.sequences = detail::sequences(op, params.cu_seqlens, p.B, p.T, p.device);
  if (params.initial_state.defined())
    detail::check_float_tensor(op, "initial_state", params.initial_state,
                               {{p.num_sequences(), "N"}, {p.H, "H"}, {p.K, "K"}, {p.V, "V"}},
                               p.device);
  p.initial_state = params.initial_state;
  detail::check_theta(op, params.theta, p.B, p.T, p.H, p.K, "H", p.device);
  p.theta = params.theta;
  p.rotary_layout = params.rotary_layout;
  p.scale = detail::resolve_scale(op, params.scale, p.K);
  // The recurrent kernel uses chunk_size as its backward checkpoint interval; only the
  // reference ignores it.
  if (impl != Impl::reference) detail::check_positive(op, "chunk_size", params.chunk_size);
  // The GPU chunk kernels are built for chunks of 16, 32 and 64 tokens.
  if (impl == Impl::chunk && p.device != Device::cpu && params.chunk_size != 16 &&
      params.chunk_size != 32 && params.chunk_size != 64)
    detail::fail(op, "chunk_size", "16, 32 or 64 on a GPU device",
                 std::to_string(params.chunk_size));
  // A chunk longer than the batch is the whole sequence; clamping keeps the kernels' offset
  // arithmetic (offset + chunk_size) far from overflow for huge values.
  p.chunk_size = std::max<std::int64_t>(1, std::min<std::int64_t>(params.chunk_size, p.T));
  return p;
}

// What the call's device must check in the data before any kernel reads it.
detail::ValueChecks value_checks(const Problem& p) {
  detail::ValueChecks checks;
  checks.sequences = p.sequences;
  checks.add("g", p.g, detail::ValueRule::log_gate);
  return checks;
}

// State-shaped views: [N, H, K, V].
void check_state(const std::string& op, const char* name, const TensorView& x, const Problem& p) {
  detail::check_output(op, name, x, {{p.num_sequences(), "N"}, {p.H, "H"}, {p.K, "K"}, {p.V, "V"}},
                       p.device);
}

}  // namespace

void gla_forward(const GlaParams& params, Impl impl, const TensorView& o,
                 const TensorView& final_state, const TensorView& chunk_states) {
  const std::string op = op_name(Op::gla, impl);
  const Problem p = make_problem(op, params, impl);
  detail::check_output(op, "o", o, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.V, "V"}}, p.device);
  if (final_state.defined()) check_state(op, "final_state", final_state, p);
  detail::check_chunk_states(op, chunk_states, impl, p.sequences, p.chunk_size, {p.H, "H"}, p.K,
                             p.V, p.device);
  if (chunk_states.defined())
    detail::check_disjoint(op, "chunk_states", chunk_states,
                           {{"q", p.q},
                            {"k", p.k},
                            {"v", p.v},
                            {"g", p.g},
                            {"initial_state", p.initial_state},
                            {"theta", p.theta},
                            {"cu_seqlens", params.cu_seqlens},
                            {"o", o},
                            {"final_state", final_state}});
  detail::run_on_device(
      op, Op::gla, impl, p.device, value_checks(p),
      [&] {
        switch (impl) {
          case Impl::reference:
            return detail::gla::reference_forward(p, o, final_state);
          case Impl::recurrent:
            return detail::gla::recurrent_forward(p, o, final_state);
          case Impl::chunk:
            return detail::gla::chunk_forward(p, o, final_state, chunk_states);
        }
      },
      // Impl::recurrent and Impl::chunk have CUDA kernels (phasor/ops.h); run_on_device refuses
      // the reference.
      [&] {
        if (impl == Impl::chunk)
          PHASOR_ON_GPU(p.device, gla::chunk_forward(p, o, final_state, chunk_states));
        else
          PHASOR_ON_GPU(p.device, gla::recurrent_forward(p, o, final_state));
      });
}

void gla_backward(const GlaParams& params, Impl impl, const TensorView& d_o,
                  const TensorView& d_final_state, const GlaGrads& grads,
                  const TensorView& chunk_states) {
  const std::string op = op_name(Op::gla, impl);
  const Problem p = make_problem(op, params, impl);
  const std::initializer_list<detail::Dim> qk = {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}},
                                           vo = {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.V, "V"}};
  detail::check_float_tensor(op, "d_o", d_o, vo, p.device);
  if (d_final_state.defined()) check_state(op, "d_final_state", d_final_state, p);
  if (grads.dq.defined()) detail::check_output(op, "dq", grads.dq, qk, p.device);
  if (grads.dk.defined()) detail::check_output(op, "dk", grads.dk, qk, p.device);
  if (grads.dv.defined()) detail::check_output(op, "dv", grads.dv, vo, p.device);
  if (grads.dg.defined()) detail::check_output(op, "dg", grads.dg, qk, p.device);
  if (grads.dh0.defined()) {
    if (!params.initial_state.defined())
      detail::fail(op, "dh0", "initial_state to be given (dh0 is its gradient)",
                   "dh0 requested without initial_state");
    check_state(op, "dh0", grads.dh0, p);
  }
  detail::check_dtheta(op, grads.dtheta, params.theta, p.device);
  detail::check_chunk_states(op, chunk_states, impl, p.sequences, p.chunk_size, {p.H, "H"}, p.K,
                             p.V, p.device);
  if (chunk_states.defined())  // read while the gradients are written
    detail::check_disjoint(op, "chunk_states", chunk_states,
                           {{"dq", grads.dq},
                            {"dk", grads.dk},
                            {"dv", grads.dv},
                            {"dg", grads.dg},
                            {"dh0", grads.dh0},
                            {"dtheta", grads.dtheta}});
  detail::run_on_device(
      op, Op::gla, impl, p.device, value_checks(p),
      [&] {
        switch (impl) {
          case Impl::reference:
            return detail::gla::reference_backward(p, d_o, d_final_state, grads);
          case Impl::recurrent:
            return detail::gla::recurrent_backward(p, d_o, d_final_state, grads);
          case Impl::chunk:
            return detail::gla::chunk_backward(p, d_o, d_final_state, grads, chunk_states);
        }
      },
      [&] {
        if (impl == Impl::chunk)
          PHASOR_ON_GPU(p.device, gla::chunk_backward(p, d_o, d_final_state, grads, chunk_states));
        else
          PHASOR_ON_GPU(p.device, gla::recurrent_backward(p, d_o, d_final_state, grads));
      });
}

}  // namespace phasor
