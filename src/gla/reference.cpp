// GLA reference: plain loops in float64, straight from the recurrence. Slow and obviously
// correct; the tests trust it.
//
//   S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ          (S ∈ R^{K×V}, S_0 = initial_state or 0)
//   o_t = S_tᵀ (scale · q_t)
//
// The backward is the plain adjoint of that recurrence, with every state kept in memory.
//
// Rotation (θ given): q and k of the whole sequence are first rotated pair by pair, with plain
// loops straight from the equations (not with the helpers the fast kernels share),
//   x'_a = x_a cos θ_t − x_b sin θ_t,   x'_b = x_a sin θ_t + x_b cos θ_t,
// and the recurrence runs on q', k'. Its adjoint gives dq', dk'; at the end
//   dx_a = dx'_a cos θ + dx'_b sin θ,   dx_b = −dx'_a sin θ + dx'_b cos θ,
//   dθ_t = Σ_{x ∈ {q, k}} (dx'_b x'_a − dx'_a x'_b)     (∂x'_a/∂θ = −x'_b, ∂x'_b/∂θ = x'_a).
#include <cmath>
#include <vector>

#include "common/parallel.h"
#include "common/rotation_reference.h"
#include "common/slices.h"
#include "gla/kernels.h"

namespace phasor::detail::gla {
namespace {

using Matrix = Mat<double>;

struct SequenceInputs {
  Matrix q, k, v, g;  // length × K, length × K, length × V, length × K; q, k rotated if θ given
  Matrix theta;       // length × K/2, only with θ
};

SequenceInputs load_inputs(const Problem& p, const Sequence& s, std::int64_t h) {
  SequenceInputs in;
  load_rows(p.q, s, h, in.q);
  load_rows(p.k, s, h, in.k);
  load_rows(p.v, s, h, in.v);
  load_rows(p.g, s, h, in.g);
  if (p.theta.defined()) {
    load_rows(p.theta, s, h, in.theta);
    reference_rotate_rows(in.q, in.theta, p.rotary_layout);
    reference_rotate_rows(in.k, in.theta, p.rotary_layout);
  }
  return in;
}

Matrix initial_state(const Problem& p, std::int64_t n, std::int64_t h) {
  Matrix state = Matrix::Zero(p.K, p.V);
  if (p.initial_state.defined()) load_state(p.initial_state, n, h, state);
  return state;
}

// One step of the recurrence: state ← diag(exp(g_t)) state + k_t v_tᵀ.
void step(const SequenceInputs& in, std::int64_t t, Matrix& state) {
  for (std::int64_t a = 0; a < state.rows(); ++a) {
    const double decay = std::exp(in.g(t, a));
    for (std::int64_t b = 0; b < state.cols(); ++b)
      state(a, b) = decay * state(a, b) + in.k(t, a) * in.v(t, b);
  }
}

}  // namespace

void reference_forward(const Problem& p, const TensorView& o, const TensorView& final_state) {
  parallel_for(p.num_work_items(), [&](std::int64_t item) {
    const std::int64_t n = item / p.H, h = item % p.H;
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    const SequenceInputs in = load_inputs(p, s, h);
    Matrix state = initial_state(p, n, h);
    Matrix out = Matrix::Zero(s.length, p.V);
    for (std::int64_t t = 0; t < s.length; ++t) {
      step(in, t, state);
      // o_t[b] = Σ_a scale · q_t[a] · S_t[a, b]
      for (std::int64_t b = 0; b < p.V; ++b) {
        double sum = 0;
        for (std::int64_t a = 0; a < p.K; ++a) sum += p.scale * in.q(t, a) * state(a, b);
        out(t, b) = sum;
      }
    }
    store_rows(out, o, s, h);
    if (final_state.defined()) store_state(state, final_state, n, h);
  });
}

// Adjoint of the recurrence, walking t = L … 1 with dS the gradient of the loss with respect to
// S_t (everything after token t already folded in):
//   dS   += scale · q_t do_tᵀ                          (o_t reads S_t)
//   dq_t  = scale · S_t do_t
//   dk_t  = dS v_t,   dv_t = dSᵀ k_t                    (S_t = … + k_t v_tᵀ)
//   dg_t  = exp(g_t) ⊙ rowsum(S_{t−1} ⊙ dS)            (∂S_t/∂g_t = diag(exp(g_t)) S_{t−1})
//   dS    ← diag(exp(g_t)) dS                           (now the gradient w.r.t. S_{t−1})
// and finally dh0 = dS.
void reference_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                        const GlaGrads& grads) {
  parallel_for(p.num_work_items(), [&](std::int64_t item) {
    const std::int64_t n = item / p.H, h = item % p.H;
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    const SequenceInputs in = load_inputs(p, s, h);
    Matrix d_out;
    load_rows(d_o, s, h, d_out);

    std::vector<Matrix> states(static_cast<std::size_t>(s.length) + 1);  // states[t] = S_t
    states[0] = initial_state(p, n, h);
    for (std::int64_t t = 0; t < s.length; ++t) {
      states[static_cast<std::size_t>(t) + 1] = states[static_cast<std::size_t>(t)];
      step(in, t, states[static_cast<std::size_t>(t) + 1]);
    }

    Matrix d_state = Matrix::Zero(p.K, p.V);
    if (d_final_state.defined()) load_state(d_final_state, n, h, d_state);
    Matrix dq = Matrix::Zero(s.length, p.K), dk = Matrix::Zero(s.length, p.K),
           dv = Matrix::Zero(s.length, p.V), dg = Matrix::Zero(s.length, p.K);
    // Token t (0-based) produces state index t + 1.
    for (std::int64_t t = s.length - 1; t >= 0; --t) {
      const Matrix& state = states[static_cast<std::size_t>(t) + 1];
      const Matrix& previous = states[static_cast<std::size_t>(t)];
      for (std::int64_t a = 0; a < p.K; ++a)
        for (std::int64_t b = 0; b < p.V; ++b) d_state(a, b) += p.scale * in.q(t, a) * d_out(t, b);
      for (std::int64_t a = 0; a < p.K; ++a) {
        double dq_a = 0, dk_a = 0, dg_a = 0;
        for (std::int64_t b = 0; b < p.V; ++b) {
          dq_a += p.scale * state(a, b) * d_out(t, b);
          dk_a += d_state(a, b) * in.v(t, b);
          dg_a += previous(a, b) * d_state(a, b);
        }
        dq(t, a) = dq_a;
        dk(t, a) = dk_a;
        dg(t, a) = std::exp(in.g(t, a)) * dg_a;
      }
      for (std::int64_t b = 0; b < p.V; ++b) {
        double dv_b = 0;
        for (std::int64_t a = 0; a < p.K; ++a) dv_b += d_state(a, b) * in.k(t, a);
        dv(t, b) = dv_b;
      }
      for (std::int64_t a = 0; a < p.K; ++a) {
        const double decay = std::exp(in.g(t, a));
        for (std::int64_t b = 0; b < p.V; ++b) d_state(a, b) *= decay;
      }
    }
    // dq, dk are so far with respect to the rotated q', k' the recurrence read.
    if (p.theta.defined()) {
      Matrix dtheta = Matrix::Zero(s.length, p.K / 2);
      reference_unrotate_gradient_rows(dq, in.q, in.theta, p.rotary_layout, dtheta);
      reference_unrotate_gradient_rows(dk, in.k, in.theta, p.rotary_layout, dtheta);
      if (grads.dtheta.defined()) store_rows(dtheta, grads.dtheta, s, h);
    }
    if (grads.dq.defined()) store_rows(dq, grads.dq, s, h);
    if (grads.dk.defined()) store_rows(dk, grads.dk, s, h);
    if (grads.dv.defined()) store_rows(dv, grads.dv, s, h);
    if (grads.dg.defined()) store_rows(dg, grads.dg, s, h);
    if (grads.dh0.defined()) store_state(d_state, grads.dh0, n, h);
  });
}

}  // namespace phasor::detail::gla
