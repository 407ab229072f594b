// Rotary ops: argument validation and dispatch to the reference and optimized kernels.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <cmath>
#include <string>

#include "common/check.h"
#include "common/dispatch.h"
#include "phasor/ops.h"
#include "phasor/rotary.h"
#include "rotary/kernels.h"
#include "rotary/rotary.h"

namespace phasor {
namespace {

using detail::check_owned_output;

using detail::rotary::AnglesProblem;
using detail::rotary::ApplyProblem;
using detail::rotary::PhaseProblem;

// The value checks of a call whose only checked values are its cu_seqlens offsets.
detail::ValueChecks sequence_checks(const detail::Sequences& sequences) {
  detail::ValueChecks checks;
  checks.sequences = sequences;
  return checks;
}

PhaseProblem make_phase_problem(const std::string& op, const RotaryPhaseParams& params) {
  PhaseProblem p;
  p.device = detail::call_device(op, "phi", params.phi, /*gpu_capable=*/true);
  detail::check_float_rank(op, "phi", params.phi, 4, "[B, T, H, R]", p.device);
  const std::int64_t B = params.phi.size(0), T = params.phi.size(1), H = params.phi.size(2),
                     R = params.phi.size(3);
  p.phi = params.phi;
  p.B = B;
  p.T = T;
  p.H = H;
  p.R = R;
  if (!params.omega.defined() || (params.omega.rank != 1 && params.omega.rank != 2))
    detail::fail(op, "omega",
                 "[H, R] = [" + std::to_string(H) + ", " + std::to_string(R) + "] or [R] = [" +
                     std::to_string(R) + "]",
                 params.omega.shape_string());
  p.omega_per_head = params.omega.rank == 2;
  if (p.omega_per_head)
    detail::check_float_tensor(op, "omega", params.omega, {{H, "H (as phi)"}, {R, "R (as phi)"}},
                               p.device);
  else
    detail::check_float_tensor(op, "omega", params.omega, {{R, "R (as phi)"}}, p.device);
  p.omega = params.omega;
  p.sequences = detail::sequences(op, params.cu_seqlens, B, T, p.device);
  if (params.initial_phase.defined())
    detail::check_float_tensor(op, "initial_phase", params.initial_phase,
                               {{p.num_sequences(), "N"}, {H, "H"}, {R, "R"}}, p.device);
  p.initial_phase = params.initial_phase;
  return p;
}

}  // namespace

void selective_rope_phases_forward(const RotaryPhaseParams& params, Impl impl,
                                   const TensorView& theta, const TensorView& final_phase) {
  const std::string op = op_name(Op::selective_rope_phases, impl);
  const PhaseProblem p = make_phase_problem(op, params);
  check_owned_output(op, "theta", theta, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.R, "R"}},
                     p.device);
  if (final_phase.defined())
    check_owned_output(op, "final_phase", final_phase,
                       {{p.num_sequences(), "N"}, {p.H, "H"}, {p.R, "R"}}, p.device);
  detail::run_on_device(
      op, Op::selective_rope_phases, impl, p.device, sequence_checks(p.sequences),
      [&] {
        if (impl == Impl::reference)
          detail::rotary::reference_phases_forward(p, theta, final_phase);
        else
          detail::rotary::phases_forward(p, theta, final_phase);
      },
      [&] { PHASOR_ON_GPU(p.device, rotary::phases_forward(p, theta, final_phase)); });
}

void selective_rope_phases_backward(const RotaryPhaseParams& params, Impl impl,
                                    const TensorView& d_theta, const TensorView& d_final_phase,
                                    const RotaryPhaseGrads& grads) {
  const std::string op = op_name(Op::selective_rope_phases, impl);
  const PhaseProblem p = make_phase_problem(op, params);
  const std::int64_t B = p.B, T = p.T, N = p.num_sequences();
  detail::check_float_tensor(op, "d_theta", d_theta, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.R, "R"}},
                             p.device);
  if (d_final_phase.defined())
    detail::check_float_tensor(op, "d_final_phase", d_final_phase,
                               {{N, "N"}, {p.H, "H"}, {p.R, "R"}}, p.device);
  if (grads.d_phi.defined())
    check_owned_output(op, "d_phi", grads.d_phi, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.R, "R"}},
                       p.device);
  if (grads.d_omega.defined()) {
    if (p.omega_per_head)
      check_owned_output(op, "d_omega", grads.d_omega,
                         {{p.H, "H (as omega)"}, {p.R, "R (as omega)"}}, p.device);
    else
      check_owned_output(op, "d_omega", grads.d_omega, {{p.R, "R (as omega)"}}, p.device);
  }
  if (grads.d_initial_phase.defined()) {
    if (!params.initial_phase.defined())
      detail::fail(op, "d_initial_phase",
                   "initial_phase to be given (d_initial_phase is its gradient)",
                   "d_initial_phase requested without initial_phase");
    check_owned_output(op, "d_initial_phase", grads.d_initial_phase,
                       {{N, "N"}, {p.H, "H"}, {p.R, "R"}}, p.device);
  }
  detail::run_on_device(
      op, Op::selective_rope_phases, impl, p.device, sequence_checks(p.sequences),
      [&] {
        if (impl == Impl::reference)
          detail::rotary::reference_phases_backward(p, d_theta, d_final_phase, grads);
        else
          detail::rotary::phases_backward(p, d_theta, d_final_phase, grads);
      },
      [&] { PHASOR_ON_GPU(p.device, rotary::phases_backward(p, d_theta, d_final_phase, grads)); });
}

void rope_angles(const RopeAnglesParams& params, Impl impl, const TensorView& theta) {
  const std::string op = op_name(Op::rope_angles, impl);
  AnglesProblem p;
  // No input tensor: the output names the device (and cu_seqlens must share it).
  p.device = detail::call_device(op, "theta", theta, /*gpu_capable=*/true);
  if (params.head_dim <= 0 || params.head_dim % 2 != 0)
    detail::fail(op, "head_dim", "a positive even head dimension K (K/2 rotation pairs)",
                 std::to_string(params.head_dim));
  if (!std::isfinite(params.base) || params.base <= 0)
    detail::fail(op, "base", "a finite positive base", std::to_string(params.base));
  // Positions offset + t are exact in float64 up to 2^53, and offset + t cannot overflow then.
  if (params.offset < 0 || params.offset > (std::int64_t{1} << 53))
    detail::fail(op, "offset", "offset in [0, 2^53]", std::to_string(params.offset));
  if (params.B < 0 || params.T < 0)
    detail::fail(op, "B, T", "non-negative sizes",
                 "B = " + std::to_string(params.B) + ", T = " + std::to_string(params.T));
  p.sequences = detail::sequences(op, params.cu_seqlens, params.B, params.T, p.device);
  p.B = params.B;
  p.T = params.T;
  p.head_dim = params.head_dim;
  p.R = params.head_dim / 2;
  p.base = params.base;
  p.offset = params.offset;
  check_owned_output(op, "theta", theta,
                     {{params.B, "B"}, {params.T, "T"}, {p.R, "R = head_dim / 2"}}, p.device);
  detail::run_on_device(
      op, Op::rope_angles, impl, p.device, sequence_checks(p.sequences),
      [&] {
        if (impl == Impl::reference)
          detail::rotary::reference_angles(p, theta);
        else
          detail::rotary::angles(p, theta);
      },
      [&] { PHASOR_ON_GPU(p.device, rotary::angles(p, theta)); });
}

namespace {
// x: [B, T, H, K] with K even; theta: [B, T, H, K/2].
ApplyProblem make_apply_problem(const std::string& op, const TensorView& x, const TensorView& theta,
                                RotaryLayout layout) {
  ApplyProblem p;
  p.device = detail::call_device(op, "x", x, /*gpu_capable=*/true);
  detail::check_float_rank(op, "x", x, 4, "[B, T, H, K]", p.device);
  p.B = x.size(0), p.T = x.size(1), p.H = x.size(2), p.K = x.size(3);
  if (p.K % 2 != 0)
    detail::fail(op, "x", "an even head dimension K (K/2 rotation pairs)",
                 "K = " + std::to_string(p.K) + " in " + x.shape_string());
  detail::check_float_tensor(op, "theta", theta,
                             {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K / 2, "K/2"}}, p.device);
  p.x = x;
  p.theta = theta;
  p.layout = layout;
  return p;
}
}  // namespace

void apply_rotary_forward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                          Impl impl, const TensorView& y) {
  const std::string op = op_name(Op::apply_rotary, impl);
  const ApplyProblem p = make_apply_problem(op, x, theta, layout);
  check_owned_output(op, "y", y, {{p.B, "B"}, {p.T, "T"}, {p.H, "H"}, {p.K, "K"}}, p.device);
  detail::run_on_device(
      op, Op::apply_rotary, impl, p.device, detail::ValueChecks{},
      [&] {
        if (impl == Impl::reference)
          detail::rotary::reference_apply_forward(p, y);
        else
          detail::rotary::apply_forward(p, y);
      },
      [&] { PHASOR_ON_GPU(p.device, rotary::apply_forward(p, y)); });
}

void apply_rotary_backward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                           Impl impl, const TensorView& dy, const TensorView& dx,
                           const TensorView& d_theta) {
  const std::string op = op_name(Op::apply_rotary, impl);
  const ApplyProblem p = make_apply_problem(op, x, theta, layout);
  const std::int64_t B = p.B, T = p.T, H = p.H, K = p.K;
  detail::check_float_tensor(op, "dy", dy, {{B, "B"}, {T, "T"}, {H, "H"}, {K, "K"}}, p.device);
  if (dx.defined())
    check_owned_output(op, "dx", dx, {{B, "B"}, {T, "T"}, {H, "H"}, {K, "K"}}, p.device);
  if (d_theta.defined())
    check_owned_output(op, "d_theta", d_theta, {{B, "B"}, {T, "T"}, {H, "H"}, {K / 2, "K/2"}},
                       p.device);
  detail::run_on_device(
      op, Op::apply_rotary, impl, p.device, detail::ValueChecks{},
      [&] {
        if (impl == Impl::reference)
          detail::rotary::reference_apply_backward(p, dy, dx, d_theta);
        else
          detail::rotary::apply_backward(p, dy, dx, d_theta);
      },
      [&] { PHASOR_ON_GPU(p.device, rotary::apply_backward(p, dy, dx, d_theta)); });
}

}  // namespace phasor
