// Gated DeltaNet: metadata checks, the problem description, and the dispatch to the
// implementation on the call's device (common/dispatch.h).
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.

#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/rotation.h"
#include "gated_delta_rule/gated_delta_rule.h"
#include "gated_delta_rule/kernels.h"
#include "phasor/gated_delta_rule.h"
#include "phasor/ops.h"

namespace phasor {
namespace {

using detail::Dim;
using detail::gdn::Problem;

// Checks the metadata of every input of `params` and builds the problem. `uses_chunk_size`: the
// chunk size matters for this call (chunk kernel, or recurrent backward checkpoint interval) and
// must be positive.
Problem make_problem(const std::string& op, const GatedDeltaRuleParams& params,
                     bool uses_chunk_size) {
  Problem p;
  p.device = detail::call_device(op, "q", params.q, /*gpu_capable=*/true);
  detail::check_float_rank(op, "q", params.q, 4, "[B, T, H, K]", p.device);
  p.B = params.q.size(0), p.T = params.q.size(1), p.H = params.q.size(2), p.K = params.q.size(3);
  if (p.H < 1) detail::fail(op, "q", "at least one head (H >= 1)", "H = " + std::to_string(p.H));
  detail::check_float_tensor(op, "k", params.k, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}},
                             p.device);
  detail::check_float_rank(op, "v", params.v, 4, "[B, T, HV, V]", p.device);
  p.HV = params.v.size(2);
  p.V = params.v.size(3);
  detail::check_float_tensor(op, "v", params.v, {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}, {p.V, "V"}},
                             p.device);
  if (p.HV < 1 || p.HV % p.H != 0)
    detail::fail(op, "v",
                 "a number of value heads HV (dim 2) that is a positive multiple of the number "
                 "of q/k heads H = " +
                     std::to_string(p.H),
                 "HV = " + std::to_string(p.HV));
  p.group = p.HV / p.H;
  detail::check_float_tensor(op, "g", params.g, {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}}, p.device);
  detail::check_float_tensor(op, "beta", params.beta, {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}},
                             p.device);
  p.q = params.q, p.k = params.k, p.v = params.v, p.g = params.g, p.beta = params.beta;
  p.sequences = detail::sequences(op, params.cu_seqlens, p.B, p.T, p.device);
  if (params.initial_state.defined())
    detail::check_float_tensor(op, "initial_state", params.initial_state,
                               {{p.num_sequences(), "N"}, {p.HV, "HV"}, {p.K, "K"}, {p.V, "V"}},
                               p.device);
  p.initial_state = params.initial_state;
  p.scale = detail::resolve_scale(op, params.scale, p.K);
  if (uses_chunk_size) detail::check_positive(op, "chunk_size", params.chunk_size);
  p.chunk_size = params.chunk_size;
  // On the cpu a chunk longer than the batch is the whole sequence; clamping keeps the kernels'
  // chunk counts (length + chunk_size − 1) far from overflow for huge values. (The GPU kernels
  // take 16, 32 or 64, checked below.)
  if (p.device == Device::cpu && uses_chunk_size)
    p.chunk_size = std::max<std::int64_t>(1, std::min<std::int64_t>(params.chunk_size, p.T));
  // The GPU chunk kernels are built for chunks of 16, 32 and 64 tokens.
  if (op == op_name(Op::gated_delta_rule, Impl::chunk) && p.device != Device::cpu &&
      params.chunk_size != 16 && params.chunk_size != 32 && params.chunk_size != 64)
    detail::fail(op, "chunk_size", "16, 32 or 64 on a GPU device",
                 std::to_string(params.chunk_size));
  p.l2norm = params.use_qk_l2norm_in_kernel;
  // θ is per q/k head (value heads of a group share their q/k head's rotation).
  detail::check_theta(op, params.theta, p.B, p.T, p.H, p.K, "H (q/k heads)", p.device);
  p.theta = params.theta;
  p.rotary_layout = params.rotary_layout;
  return p;
}

// What the call's device must check in the data before any kernel reads it.
detail::ValueChecks value_checks(const Problem& p) {
  detail::ValueChecks checks;
  checks.sequences = p.sequences;
  checks.add("g", p.g, detail::ValueRule::log_gate);
  return checks;
}

void check_state_shaped(const std::string& op, const char* name, const TensorView& x,
                        const Problem& p) {
  detail::check_output(op, name, x,
                       {{p.num_sequences(), "N"}, {p.HV, "HV"}, {p.K, "K"}, {p.V, "V"}}, p.device);
}

// v_new (phasor/gated_delta_rule.h): Impl::chunk on the cpu, beside chunk_states, v's shape.
void check_v_new(const std::string& op, const TensorView& v_new, Impl impl,
                 const TensorView& chunk_states, const Problem& p) {
  if (!v_new.defined()) return;
  if (impl != Impl::chunk)
    detail::fail(op, "v_new", "no v_new (only Impl::chunk keeps it)",
                 std::string("v_new with Impl::") + to_string(impl));
  if (p.device != Device::cpu)
    detail::fail(op, "v_new", "a call on the cpu (the GPU kernels form U_new themselves)",
                 std::string("a call on ") + to_string(p.device));
  if (!chunk_states.defined())
    detail::fail(op, "v_new", "chunk_states to be given as well (U_new is kept with the states)",
                 "v_new without chunk_states");
  detail::check_owned_output(op, "v_new", v_new, {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}, {p.V, "V"}},
                             p.device);
}

}  // namespace

void gated_delta_rule_forward(const GatedDeltaRuleParams& params, Impl impl, const TensorView& o,
                              const TensorView& final_state, const TensorView& chunk_states,
                              const TensorView& v_new) {
  const std::string op = op_name(Op::gated_delta_rule, impl);
  const Problem p = make_problem(op, params, impl == Impl::chunk);
  detail::check_output(op, "o", o, {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}, {p.V, "V"}}, p.device);
  if (final_state.defined()) check_state_shaped(op, "final_state", final_state, p);
  detail::check_chunk_states(op, chunk_states, impl, p.sequences, p.chunk_size, {p.HV, "HV"}, p.K,
                             p.V, p.device);
  check_v_new(op, v_new, impl, chunk_states, p);
  // The buffers kept for the backward overlap nothing the call reads or writes, nor each other.
  for (const detail::NamedView& kept :
       {detail::NamedView{"chunk_states", chunk_states}, detail::NamedView{"v_new", v_new}})
    if (kept.view.defined())
      detail::check_disjoint(op, kept.name, kept.view,
                             {{"q", p.q},
                              {"k", p.k},
                              {"v", p.v},
                              {"g", p.g},
                              {"beta", p.beta},
                              {"initial_state", p.initial_state},
                              {"theta", p.theta},
                              {"cu_seqlens", params.cu_seqlens},
                              {"o", o},
                              {"final_state", final_state}});
  if (v_new.defined()) detail::check_disjoint(op, "v_new", v_new, {{"chunk_states", chunk_states}});
  detail::run_on_device(
      op, Op::gated_delta_rule, impl, p.device, value_checks(p),
      [&] {
        switch (impl) {
          case Impl::reference:
            return detail::gdn::reference_forward(p, o, final_state);
          case Impl::recurrent:
            return detail::gdn::recurrent_forward(p, o, final_state);
          case Impl::chunk:
            return detail::gdn::chunk_forward(p, o, final_state, chunk_states, v_new);
        }
      },
      // Impl::recurrent and Impl::chunk have CUDA kernels (phasor/ops.h); run_on_device refuses
      // the reference.
      [&] {
        if (impl == Impl::chunk)
          PHASOR_ON_GPU(p.device, gdn::chunk_forward(p, o, final_state, chunk_states));
        else
          PHASOR_ON_GPU(p.device, gdn::recurrent_forward(p, o, final_state));
      });
}

void gated_delta_rule_backward(const GatedDeltaRuleParams& params, Impl impl, const TensorView& d_o,
                               const TensorView& d_final_state, const GatedDeltaRuleGrads& grads,
                               const TensorView& chunk_states, const TensorView& v_new) {
  const std::string op = op_name(Op::gated_delta_rule, impl);
  // The recurrent backward recomputes states from checkpoints every chunk_size tokens.
  const Problem p = make_problem(op, params, impl != Impl::reference);
  detail::check_float_tensor(op, "d_o", d_o, {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}, {p.V, "V"}},
                             p.device);
  if (d_final_state.defined()) check_state_shaped(op, "d_final_state", d_final_state, p);
  const std::initializer_list<Dim> qk_dims = {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}},
                                   gate_dims = {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}};
  if (grads.dq.defined()) detail::check_output(op, "dq", grads.dq, qk_dims, p.device);
  if (grads.dk.defined()) detail::check_output(op, "dk", grads.dk, qk_dims, p.device);
  if (grads.dv.defined())
    detail::check_output(op, "dv", grads.dv, {{p.B, "B"}, {p.T, "T"}, {p.HV, "HV"}, {p.V, "V"}},
                         p.device);
  if (grads.dg.defined()) detail::check_output(op, "dg", grads.dg, gate_dims, p.device);
  if (grads.dbeta.defined()) detail::check_output(op, "dbeta", grads.dbeta, gate_dims, p.device);
  if (grads.dh0.defined()) {
    if (!params.initial_state.defined())
      detail::fail(op, "dh0", "initial_state to be given (dh0 is the gradient with respect to it)",
                   "dh0 requested without initial_state");
    check_state_shaped(op, "dh0", grads.dh0, p);
  }
  detail::check_dtheta(op, grads.dtheta, params.theta, p.device);
  detail::check_chunk_states(op, chunk_states, impl, p.sequences, p.chunk_size, {p.HV, "HV"}, p.K,
                             p.V, p.device);
  check_v_new(op, v_new, impl, chunk_states, p);
  // The kept buffers are read while the gradients are written.
  for (const detail::NamedView& kept :
       {detail::NamedView{"chunk_states", chunk_states}, detail::NamedView{"v_new", v_new}})
    if (kept.view.defined())
      detail::check_disjoint(op, kept.name, kept.view,
                             {{"dq", grads.dq},
                              {"dk", grads.dk},
                              {"dv", grads.dv},
                              {"dg", grads.dg},
                              {"dbeta", grads.dbeta},
                              {"dh0", grads.dh0},
                              {"dtheta", grads.dtheta}});
  detail::run_on_device(
      op, Op::gated_delta_rule, impl, p.device, value_checks(p),
      [&] {
        switch (impl) {
          case Impl::reference:
            return detail::gdn::reference_backward(p, d_o, d_final_state, grads);
          case Impl::recurrent:
            return detail::gdn::recurrent_backward(p, d_o, d_final_state, grads);
          case Impl::chunk:
            return detail::gdn::chunk_backward(p, d_o, d_final_state, grads, chunk_states, v_new);
        }
      },
      [&] {
        if (impl == Impl::chunk)
          PHASOR_ON_GPU(p.device, gdn::chunk_backward(p, d_o, d_final_state, grads));
        else
          PHASOR_ON_GPU(p.device, gdn::recurrent_backward(p, d_o, d_final_state, grads));
      });
}

}  // namespace phasor
