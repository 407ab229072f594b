// Rotary ops: argument validation and dispatch to the reference and optimized kernels.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <cmath>
#include <string>

#include "common/check.h"
#include "phasor/rotary.h"
#include "rotary/kernels.h"

namespace phasor {
namespace {

using detail::check_owned_output;
using detail::op_name;

using detail::rotary::AnglesProblem;
using detail::rotary::PhaseProblem;

PhaseProblem validate_phases(const std::string& op, const RotaryPhaseParams& params) {
  detail::check_float_rank(op, "phi", params.phi, 4, "[B, T, H, R]");
  const std::int64_t B = params.phi.size(0), T = params.phi.size(1), H = params.phi.size(2),
                     R = params.phi.size(3);
  PhaseProblem p;
  p.phi = params.phi;
  p.H = H;
  p.R = R;
  if (!params.omega.defined() || (params.omega.rank != 1 && params.omega.rank != 2))
    detail::fail(op, "omega",
                 "[H, R] = [" + std::to_string(H) + ", " + std::to_string(R) + "] or [R] = [" +
                     std::to_string(R) + "]",
                 params.omega.shape_string());
  p.omega_per_head = params.omega.rank == 2;
  if (p.omega_per_head)
    detail::check_float_tensor(op, "omega", params.omega, {{H, "H (as phi)"}, {R, "R (as phi)"}});
  else
    detail::check_float_tensor(op, "omega", params.omega, {{R, "R (as phi)"}});
  p.omega = params.omega;
  p.sequences = detail::sequences(op, params.cu_seqlens, B, T);
  if (params.initial_phase.defined())
    detail::check_float_tensor(op, "initial_phase", params.initial_phase,
                               {{p.num_sequences(), "N"}, {H, "H"}, {R, "R"}});
  p.initial_phase = params.initial_phase;
  return p;
}

}  // namespace

void selective_rope_phases_forward(const RotaryPhaseParams& params, Impl impl,
                                   const TensorView& theta, const TensorView& final_phase) {
  const std::string op = op_name("selective_rope_phases", impl);
  const PhaseProblem p = validate_phases(op, params);
  const std::int64_t B = params.phi.size(0), T = params.phi.size(1);
  check_owned_output(op, "theta", theta, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.R, "R"}});
  if (final_phase.defined())
    check_owned_output(op, "final_phase", final_phase,
                       {{p.num_sequences(), "N"}, {p.H, "H"}, {p.R, "R"}});
  if (impl == Impl::reference)
    detail::rotary::reference_phases_forward(p, theta, final_phase);
  else
    detail::rotary::phases_forward(p, theta, final_phase);
}

void selective_rope_phases_backward(const RotaryPhaseParams& params, Impl impl,
                                    const TensorView& d_theta, const TensorView& d_final_phase,
                                    const RotaryPhaseGrads& grads) {
  const std::string op = op_name("selective_rope_phases", impl);
  const PhaseProblem p = validate_phases(op, params);
  const std::int64_t B = params.phi.size(0), T = params.phi.size(1), N = p.num_sequences();
  detail::check_float_tensor(op, "d_theta", d_theta, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.R, "R"}});
  if (d_final_phase.defined())
    detail::check_float_tensor(op, "d_final_phase", d_final_phase,
                               {{N, "N"}, {p.H, "H"}, {p.R, "R"}});
  if (grads.d_phi.defined())
    check_owned_output(op, "d_phi", grads.d_phi, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.R, "R"}});
  if (grads.d_omega.defined()) {
    if (p.omega_per_head)
      check_owned_output(op, "d_omega", grads.d_omega,
                         {{p.H, "H (as omega)"}, {p.R, "R (as omega)"}});
    else
      check_owned_output(op, "d_omega", grads.d_omega, {{p.R, "R (as omega)"}});
  }
  if (grads.d_initial_phase.defined()) {
    if (!params.initial_phase.defined())
      detail::fail(op, "d_initial_phase",
                   "initial_phase to be given (d_initial_phase is its gradient)",
                   "d_initial_phase requested without initial_phase");
    check_owned_output(op, "d_initial_phase", grads.d_initial_phase,
                       {{N, "N"}, {p.H, "H"}, {p.R, "R"}});
  }
  if (impl == Impl::reference)
    detail::rotary::reference_phases_backward(p, d_theta, d_final_phase, grads);
  else
    detail::rotary::phases_backward(p, d_theta, d_final_phase, grads);
}

void rope_angles(const RopeAnglesParams& params, Impl impl, const TensorView& theta) {
  const std::string op = op_name("rope_angles", impl);
  if (params.head_dim <= 0 || params.head_dim % 2 != 0)
    detail::fail(op, "head_dim", "a positive even head dimension K (K/2 rotation pairs)",
                 std::to_string(params.head_dim));
  if (!std::isfinite(params.base) || params.base <= 0)
    detail::fail(op, "base", "a finite positive base", std::to_string(params.base));
  if (params.offset < 0) detail::fail(op, "offset", "offset ≥ 0", std::to_string(params.offset));
  if (params.B < 0 || params.T < 0)
    detail::fail(op, "B, T", "non-negative sizes",
                 "B = " + std::to_string(params.B) + ", T = " + std::to_string(params.T));
  AnglesProblem p;
  p.sequences = detail::sequences(op, params.cu_seqlens, params.B, params.T);
  p.head_dim = params.head_dim;
  p.R = params.head_dim / 2;
  p.base = params.base;
  p.offset = params.offset;
  check_owned_output(op, "theta", theta,
                     {{params.B, "B"}, {params.T, "T"}, {p.R, "R = head_dim / 2"}});
  if (impl == Impl::reference)
    detail::rotary::reference_angles(p, theta);
  else
    detail::rotary::angles(p, theta);
}

namespace {
// x: [B, T, H, K] with K even; theta: [B, T, H, K/2].
void validate_apply(const std::string& op, const TensorView& x, const TensorView& theta) {
  detail::check_float_rank(op, "x", x, 4, "[B, T, H, K]");
  const std::int64_t K = x.size(3);
  if (K % 2 != 0)
    detail::fail(op, "x", "an even head dimension K (K/2 rotation pairs)",
                 "K = " + std::to_string(K) + " in " + x.shape_string());
  detail::check_float_tensor(
      op, "theta", theta, {{x.size(0), "B"}, {x.size(1), "T"}, {x.size(2), "H"}, {K / 2, "K/2"}});
}
}  // namespace

void apply_rotary_forward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                          Impl impl, const TensorView& y) {
  const std::string op = op_name("apply_rotary", impl);
  validate_apply(op, x, theta);
  check_owned_output(op, "y", y,
                     {{x.size(0), "B"}, {x.size(1), "T"}, {x.size(2), "H"}, {x.size(3), "K"}});
  if (impl == Impl::reference)
    detail::rotary::reference_apply_forward(x, theta, layout, y);
  else
    detail::rotary::apply_forward(x, theta, layout, y);
}

void apply_rotary_backward(const TensorView& x, const TensorView& theta, RotaryLayout layout,
                           Impl impl, const TensorView& dy, const TensorView& dx,
                           const TensorView& d_theta) {
  const std::string op = op_name("apply_rotary", impl);
  validate_apply(op, x, theta);
  const std::int64_t B = x.size(0), T = x.size(1), H = x.size(2), K = x.size(3);
  detail::check_float_tensor(op, "dy", dy, {{B, "B"}, {T, "T"}, {H, "H"}, {K, "K"}});
  if (dx.defined()) check_owned_output(op, "dx", dx, {{B, "B"}, {T, "T"}, {H, "H"}, {K, "K"}});
  if (d_theta.defined())
    check_owned_output(op, "d_theta", d_theta, {{B, "B"}, {T, "T"}, {H, "H"}, {K / 2, "K/2"}});
  if (impl == Impl::reference)
    detail::rotary::reference_apply_backward(x, theta, layout, dy, dx, d_theta);
  else
    detail::rotary::apply_backward(x, theta, layout, dy, dx, d_theta);
}

}  // namespace phasor
