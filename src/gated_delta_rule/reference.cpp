// Gated DeltaNet reference: the recurrence token by token in float64, whatever the input dtype,
// and its backward as the plain adjoint of each step with every state kept in memory. Slow and
// memory-hungry (T + 1 states per value head) on purpose: this is what the tests trust.
// The optional rotation by θ is applied here with plain loops from its equations (not with the
// helpers the fast kernels share), to whole-sequence copies of q̃ and k̂ before the recurrence,
// and its gradient is taken at the end.

#include "common/eigen.h"  // first: see there

#include <cmath>
#include <vector>

#include "common/parallel.h"
#include "common/rotation_reference.h"
#include "gated_delta_rule/kernels.h"

namespace phasor::detail::gdn {

using Matd = Mat<double>;
using Vecd = Vec<double>;

namespace {

// θ of sequence s, q/k head h, as float64 (length × K/2).
Matd load_angles(const Problem& p, const Sequence& s, std::int64_t h) {
  Matd theta;
  load_rows(p.theta, s, h, theta);
  return theta;
}

// q̃ and k̂ of a whole sequence (normalised if requested, unrotated) and, with θ, their rotated
// versions q̃' = R(θ) q̃, k̂' = R(θ) k̂, which the recurrence uses.
struct ReferenceQK {
  QKInputs<double> in;  // unrotated
  Matd theta;           // length × K/2, only with θ
  Matd q, k;            // what the recurrence reads: rotated if θ is given
};

ReferenceQK load_reference_qk(const Problem& p, const Sequence& s, std::int64_t h) {
  ReferenceQK r;
  load_qk(p, s, h, r.in, /*rotate=*/false);
  if (p.theta.defined()) {
    r.theta = load_angles(p, s, h);
    r.q = r.in.q, r.k = r.in.k;
    reference_rotate_rows(r.q, r.theta, p.rotary_layout);
    reference_rotate_rows(r.k, r.theta, p.rotary_layout);
  } else {
    r.q = r.in.q;
    r.k = r.in.k;
  }
  return r;
}

}  // namespace

void reference_forward(const Problem& p, const TensorView& o, const TensorView& final_state) {
  parallel_for(p.num_items(), [&](std::int64_t item) {
    const std::int64_t n = p.item_sequence(item), h = p.item_head(item);
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    const ReferenceQK qk = load_reference_qk(p, s, h);
    for (std::int64_t hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
      ValueInputs<double> in;
      load_values(p, s, hv, in);
      Matd S;
      load_initial_state(p, n, hv, S);
      Matd out(s.length, p.V);
      for (std::int64_t t = 0; t < s.length; ++t) {
        const Vecd k = qk.k.row(t).transpose(), q = qk.q.row(t).transpose();
        const Vecd v = in.v.row(t).transpose();
        S *= std::exp(in.g(t));                        // S' = exp(g_t) S_{t−1}
        const Vecd r = v - S.transpose() * k;          // v_t − S'ᵀ k_t
        S += in.beta(t) * k * r.transpose();           // S_t = S' + β_t k_t (v_t − S'ᵀ k_t)ᵀ
        out.row(t) = (S.transpose() * q).transpose();  // o_t = S_tᵀ (scale·q_t)
      }
      store_rows(out, o, s, hv);
      if (final_state.defined()) store_state(S, final_state, n, hv);
    }
  });
}

// Adjoint of one step, S_t = (I − β k kᵀ) S' + β k vᵀ with S' = a S_{t−1}, o_t = S_tᵀ q̃:
//   dq̃ = S_t do,  dS_t += q̃ doᵀ,  w = dS_tᵀ k,  r = v − S'ᵀ k,
//   dv = β w,  dβ = wᵀ r,  dk = β (dS_t r − S' w),
//   dS' = (I − β k kᵀ) dS_t = dS_t − β k wᵀ,  dg = Σ S' ⊙ dS',  dS_{t−1} = a dS'.
void reference_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                        const GatedDeltaRuleGrads& grads) {
  parallel_for(p.num_items(), [&](std::int64_t item) {
    const std::int64_t n = p.item_sequence(item), h = p.item_head(item);
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    const ReferenceQK qk = load_reference_qk(p, s, h);
    Matd dq = Matd::Zero(s.length, p.K), dk = Matd::Zero(s.length, p.K);
    for (std::int64_t hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
      ValueInputs<double> in;
      load_values(p, s, hv, in);
      Matd d_out;
      load_rows(d_o, s, hv, d_out);
      // states[t] = S_t, the state after t tokens (states[0] = initial state).
      std::vector<Matd> states(static_cast<std::size_t>(s.length + 1));
      load_initial_state(p, n, hv, states[0]);
      for (std::int64_t t = 0; t < s.length; ++t) {
        const Vecd k = qk.k.row(t).transpose(), v = in.v.row(t).transpose();
        Matd S = std::exp(in.g(t)) * states[static_cast<std::size_t>(t)];
        const Vecd r = v - S.transpose() * k;
        S += in.beta(t) * k * r.transpose();
        states[static_cast<std::size_t>(t + 1)] = S;
      }
      ValueGrads<double> d;
      d.reset(s.length, p.V);
      Matd dS;
      load_final_state_grad(p, d_final_state, n, hv, dS);
      for (std::int64_t t = s.length - 1; t >= 0; --t) {
        const Vecd k = qk.k.row(t).transpose(), q = qk.q.row(t).transpose();
        const Vecd v = in.v.row(t).transpose(), dout = d_out.row(t).transpose();
        const double a = std::exp(in.g(t)), beta = in.beta(t);
        const Matd& S_t = states[static_cast<std::size_t>(t + 1)];
        const Matd S_decayed = a * states[static_cast<std::size_t>(t)];  // S'
        dq.row(t) += (S_t * dout).transpose();
        dS += q * dout.transpose();
        const Vecd w = dS.transpose() * k;
        const Vecd r = v - S_decayed.transpose() * k;
        d.dv.row(t) = (beta * w).transpose();
        d.dbeta(t) = w.dot(r);
        dk.row(t) += (beta * (dS * r - S_decayed * w)).transpose();
        const Matd dS_decayed = dS - beta * k * w.transpose();
        d.dg(t) = S_decayed.cwiseProduct(dS_decayed).sum();
        dS = a * dS_decayed;
      }
      store_value_grads(s, hv, d, grads);
      if (grads.dh0.defined()) store_state(dS, grads.dh0, n, hv);
    }
    // dq, dk are with respect to q̃ and k̂ as the recurrence saw them (rotated, with θ).
    if (p.theta.defined()) {
      Matd dtheta = Matd::Zero(s.length, p.K / 2);
      reference_unrotate_gradient_rows(dq, qk.q, qk.theta, p.rotary_layout, dtheta);
      reference_unrotate_gradient_rows(dk, qk.k, qk.theta, p.rotary_layout, dtheta);
      if (grads.dtheta.defined()) store_rows(dtheta, grads.dtheta, s, h);
    }
    store_qk_grads(p, s, h, qk.in, dq, dk, grads);
  });
}

}  // namespace phasor::detail::gdn
