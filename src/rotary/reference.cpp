// Rotary ops: the float64 reference, plain loops straight from the equations in rotary.h. It
// reads and writes views element by element; the tests trust it.
#include <cmath>
#include <vector>

#include "rotary/kernels.h"

namespace phasor::detail::rotary {
namespace {

double omega_at(const PhaseProblem& p, std::int64_t h, std::int64_t i) {
  return p.omega_per_head ? get(p.omega, offset_of(p.omega, h, i))
                          : get(p.omega, offset_of(p.omega, i));
}

double initial_at(const PhaseProblem& p, std::int64_t n, std::int64_t h, std::int64_t i) {
  return p.initial_phase.defined() ? get(p.initial_phase, offset_of(p.initial_phase, n, h, i))
                                   : 0.0;
}

}  // namespace

// P_t = θ_0 + Σ_{s ≤ t} φ_s,  θ_t = ω ⊙ P_t,  final = P_last (θ_0 for an empty sequence).
void reference_phases_forward(const PhaseProblem& p, const TensorView& theta,
                              const TensorView& final_phase) {
  for (std::int64_t n = 0; n < p.num_sequences(); ++n) {
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t i = 0; i < p.R; ++i) {
        double phase = initial_at(p, n, h, i);
        for (std::int64_t t = s.start; t < s.start + s.length; ++t) {
          phase += get(p.phi, offset_of(p.phi, s.batch, t, h, i));
          put(theta, offset_of(theta, s.batch, t, h, i), omega_at(p, h, i) * phase);
        }
        if (final_phase.defined()) put(final_phase, offset_of(final_phase, n, h, i), phase);
      }
  }
}

// dφ_s = Σ_{t ≥ s} ω dθ_t + dP_final;  dθ_0 = dφ at the first token (dP_final if empty);
// dω = Σ dθ_t P_t over sequences and tokens (and heads when ω is shared).
void reference_phases_backward(const PhaseProblem& p, const TensorView& d_theta,
                               const TensorView& d_final_phase, const RotaryPhaseGrads& grads) {
  const std::int64_t omega_rows = p.omega_per_head ? p.H : 1;
  std::vector<double> d_omega(static_cast<std::size_t>(omega_rows * p.R), 0.0);
  for (std::int64_t n = 0; n < p.num_sequences(); ++n) {
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t i = 0; i < p.R; ++i) {
        const double w = omega_at(p, h, i);
        // dω: needs P_t, recomputed forward.
        double phase = initial_at(p, n, h, i);
        double& dw = d_omega[static_cast<std::size_t>((p.omega_per_head ? h : 0) * p.R + i)];
        for (std::int64_t t = s.start; t < s.start + s.length; ++t) {
          phase += get(p.phi, offset_of(p.phi, s.batch, t, h, i));
          dw += get(d_theta, offset_of(d_theta, s.batch, t, h, i)) * phase;
        }
        // dφ: reverse running sum.
        double acc =
            d_final_phase.defined() ? get(d_final_phase, offset_of(d_final_phase, n, h, i)) : 0.0;
        for (std::int64_t t = s.start + s.length - 1; t >= s.start; --t) {
          acc += w * get(d_theta, offset_of(d_theta, s.batch, t, h, i));
          if (grads.d_phi.defined())
            put(grads.d_phi, offset_of(grads.d_phi, s.batch, t, h, i), acc);
        }
        if (grads.d_initial_phase.defined())
          put(grads.d_initial_phase, offset_of(grads.d_initial_phase, n, h, i), acc);
      }
  }
  if (grads.d_omega.defined())
    for (std::int64_t r = 0; r < omega_rows; ++r)
      for (std::int64_t i = 0; i < p.R; ++i) {
        const double v = d_omega[static_cast<std::size_t>(r * p.R + i)];
        put(grads.d_omega,
            p.omega_per_head ? offset_of(grads.d_omega, r, i) : offset_of(grads.d_omega, i), v);
      }
}

// θ[b, t, i] = (offset + t − start) · base^(−2i/K).
void reference_angles(const AnglesProblem& p, const TensorView& theta) {
  for (const Sequence& s : p.sequences)
    for (std::int64_t t = 0; t < s.length; ++t)
      for (std::int64_t i = 0; i < p.R; ++i) {
        const double position = static_cast<double>(p.offset + t);
        const double frequency =
            std::pow(p.base, -2.0 * static_cast<double>(i) / static_cast<double>(p.head_dim));
        put(theta, offset_of(theta, s.batch, s.start + t, i), position * frequency);
      }
}

// y_a = x_a cos θ − x_b sin θ,  y_b = x_a sin θ + x_b cos θ.
void reference_apply_forward(const ApplyProblem& p, const TensorView& y) {
  const TensorView &x = p.x, &theta = p.theta;
  const RotaryLayout layout = p.layout;
  const std::int64_t R = theta.size(3);
  for (std::int64_t b = 0; b < x.size(0); ++b)
    for (std::int64_t t = 0; t < x.size(1); ++t)
      for (std::int64_t h = 0; h < x.size(2); ++h)
        for (std::int64_t i = 0; i < R; ++i) {
          const double angle = get(theta, offset_of(theta, b, t, h, i));
          const std::int64_t a = pair_a(layout, i, R), c = pair_b(layout, i, R);
          const double xa = get(x, offset_of(x, b, t, h, a)), xb = get(x, offset_of(x, b, t, h, c));
          put(y, offset_of(y, b, t, h, a), xa * std::cos(angle) - xb * std::sin(angle));
          put(y, offset_of(y, b, t, h, c), xa * std::sin(angle) + xb * std::cos(angle));
        }
}

// dx_a = dy_a cos θ + dy_b sin θ,  dx_b = −dy_a sin θ + dy_b cos θ  (rotation by −θ);
// dθ = dy_a ∂y_a/∂θ + dy_b ∂y_b/∂θ = dy_a (−x_a sin θ − x_b cos θ) + dy_b (x_a cos θ − x_b sin θ).
void reference_apply_backward(const ApplyProblem& p, const TensorView& dy, const TensorView& dx,
                              const TensorView& d_theta) {
  const TensorView &x = p.x, &theta = p.theta;
  const RotaryLayout layout = p.layout;
  const std::int64_t R = theta.size(3);
  for (std::int64_t b = 0; b < x.size(0); ++b)
    for (std::int64_t t = 0; t < x.size(1); ++t)
      for (std::int64_t h = 0; h < x.size(2); ++h)
        for (std::int64_t i = 0; i < R; ++i) {
          const double angle = get(theta, offset_of(theta, b, t, h, i));
          const double cs = std::cos(angle), sn = std::sin(angle);
          const std::int64_t a = pair_a(layout, i, R), c = pair_b(layout, i, R);
          const double xa = get(x, offset_of(x, b, t, h, a)), xb = get(x, offset_of(x, b, t, h, c));
          const double dya = get(dy, offset_of(dy, b, t, h, a)),
                       dyb = get(dy, offset_of(dy, b, t, h, c));
          if (dx.defined()) {
            put(dx, offset_of(dx, b, t, h, a), dya * cs + dyb * sn);
            put(dx, offset_of(dx, b, t, h, c), -dya * sn + dyb * cs);
          }
          if (d_theta.defined())
            put(d_theta, offset_of(d_theta, b, t, h, i),
                dya * (-xa * sn - xb * cs) + dyb * (xa * cs - xb * sn));
        }
}

}  // namespace phasor::detail::rotary
