// Internal: the Gated DeltaNet kernels (reference, recurrent, chunk) and what they share — the
// validated problem description, per-work-item input loading (with the optional q/k L2
// normalisation) and the storing of gradients (through that normalisation).
//
// Notation used by every kernel, per sequence and value head, state S ∈ R^{K×V}:
//   q̃_t = scale · q̂_t,  q̂_t, k_t: q, k after the optional L2 normalisation,
//   a_t = exp(g_t),  S'_t = a_t S_{t−1},  r_t = v_t − S'_tᵀ k_t,
//   S_t = S'_t + β_t k_t r_tᵀ,  o_t = S_tᵀ q̃_t.
// Kernels work in q̃ and k̂ and return dq̃ and dk̂; store_qk_grads turns those into dq and dk.
//
// Fused rotation (θ given): load_qk rotates q̂ and k̂ by θ_t (R1 of common/rotation.h) right
// after the normalisation, so q̃ = scale · R(θ_t) q̂ and k̂ ← R(θ_t) k̂ are what every kernel sees,
// in the output o_t = S_tᵀ q̃_t and in the delta-rule update alike; the kernels themselves are
// unchanged. store_qk_grads undoes it: dq̃, dk̂ are then gradients with respect to the ROTATED
// rows, turned into gradients of the unrotated inputs and dθ (R2, R3).
//
// Work items: one item = one sequence and one q/k head h together with its HV/H value heads
// hv = h·G … h·G + G − 1 (G = HV/H), so the dq/dk rows of an item (sums over its value heads) are
// written by that item only. Each item runs start to finish on one thread.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <cstdint>

#include "common/check.h"
#include "common/rotation.h"
#include "common/slices.h"
#include "gated_delta_rule/problem.h"
#include "phasor/gated_delta_rule.h"

namespace phasor::detail::gdn {

// Forward and backward entry points; arguments already validated by api.cpp.
void reference_forward(const Problem& p, const TensorView& o, const TensorView& final_state);
void reference_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                        const GatedDeltaRuleGrads& grads);
void recurrent_forward(const Problem& p, const TensorView& o, const TensorView& final_state);
void recurrent_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                        const GatedDeltaRuleGrads& grads);
// chunk_states (chunk only; optional): [num_chunk_states, HV, K, V], the state entering every chunk
// at Sequences::chunk_slot(chunk_size, n, c) — written by the forward, read by the backward in
// place of its replay of the forward. v_new (optional, only with chunk_states): [B, T, HV, V],
// U_new of eq. (2) of chunk.cpp for every token — written by the forward, read by the backward in
// place of its solve.
void chunk_forward(const Problem& p, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states, const TensorView& v_new);
void chunk_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                    const GatedDeltaRuleGrads& grads, const TensorView& chunk_states,
                    const TensorView& v_new);

template <class S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

// The fla normalisation x̂ = x / sqrt(Σx² + 1e-6), applied to every row of x in place;
// inv_norm keeps 1 / sqrt(Σx² + 1e-6) per row for the backward.
template <class S>
void l2_normalize_rows(Mat<S>& x, Vec<S>& inv_norm) {
  inv_norm.resize(x.rows());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    inv_norm(t) = S(1) / std::sqrt(x.row(t).squaredNorm() + S(1e-6));
    x.row(t) *= inv_norm(t);
  }
}

// Backward of l2_normalize_rows, in place: with x̂ = x·ρ, ρ = (Σx² + ε)^{-1/2},
//   ∂x̂_i/∂x_j = ρ (δ_ij − x̂_i x̂_j)  ⇒  dx = ρ (dx̂ − x̂ (x̂·dx̂)).
// For a single channel (K = 1) that is ρ (1 − x̂²) dx̂ with 1 − x̂² = ερ² exactly: evaluated as
// written it would cancel catastrophically (x̂² rounds to 1 in float32), so use ερ³ dx̂ instead.
template <class S>
void l2_normalize_rows_backward(const Mat<S>& x_hat, const Vec<S>& inv_norm, Mat<S>& dx) {
  for (Eigen::Index t = 0; t < dx.rows(); ++t) {
    const S rho = inv_norm(t);
    if (dx.cols() == 1) {
      dx(t, 0) *= S(1e-6) * rho * rho * rho;
      continue;
    }
    const S projection = x_hat.row(t).dot(dx.row(t));
    dx.row(t) = rho * (dx.row(t) - projection * x_hat.row(t));
  }
}

// Rows [t0, t0 + L) of sequence s, as a sequence of their own: kernels load, and store, one
// block of tokens at a time, so their buffers are O(block · (K + V)), not O(T · (K + V)).
inline Sequence block_of(const Sequence& s, std::int64_t t0, std::int64_t L) {
  return {s.batch, s.start + t0, L};
}

// Prefetches block b of the inputs of work item (sequence, q/k head h): q, k, and v and `extra`
// (d_o in the backward, or nothing) of its value heads.
inline void prefetch_inputs(const Problem& p, const Sequence& b, std::int64_t h,
                            const TensorView& extra = {}) {
  prefetch_block(p.q, b, h);
  prefetch_block(p.k, b, h);
  for (std::int64_t hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    prefetch_block(p.v, b, hv);
    prefetch_block(extra, b, hv);
  }
}

// The q/k inputs of one block of tokens of one work item, rows × K each. With θ (and `rotate`
// in load_qk) q_hat, q and k are rotated: q̂' = R(θ) q̂, q̃ = scale · q̂', k̂' = R(θ) k̂.
template <class S>
struct QKInputs {
  Mat<S> q_hat;       // q̂ (normalised if requested, unscaled; rotated if `rotated`)
  Mat<S> q;           // q̃ = scale · q̂, what the kernels use
  Mat<S> k;           // k̂ (rotated if `rotated`)
  Vec<S> q_inv_norm;  // only with l2norm: ρ = (Σx² + ε)^{-1/2} of the raw rows
  Vec<S> k_inv_norm;
  bool rotated = false;
  PairAngles<S> angles;  // cos θ, sin θ of the block's tokens, only if `rotated`
};

// Loads q, k of a block; normalises them if requested, then rotates them by θ if θ is given and
// `rotate` (the reference passes false and rotates on its own, from the equations). Normalising
// first, as the header documents; the rotation preserves norms, so the order does not change the
// function, only the backward's bookkeeping (see store_qk_grads).
template <class S>
void load_qk(const Problem& p, const Sequence& block, std::int64_t h, QKInputs<S>& in,
             bool rotate = true) {
  load_rows(p.q, block, h, in.q_hat);
  load_rows(p.k, block, h, in.k);
  if (p.l2norm) {
    l2_normalize_rows(in.q_hat, in.q_inv_norm);
    l2_normalize_rows(in.k, in.k_inv_norm);
  }
  in.rotated = rotate && p.theta.defined();
  if (in.rotated) {
    in.angles.load(p.theta, block, h);
    rotate_rows(in.q_hat, in.angles, p.rotary_layout);
    rotate_rows(in.k, in.angles, p.rotary_layout);
  }
  in.q = S(p.scale) * in.q_hat;
}

// The inputs of one value head hv for one block of tokens.
template <class S>
struct ValueInputs {
  Mat<S> v;  // rows × V
  Vec<S> g;  // log decays
  Vec<S> beta;
};

template <class S>
void load_values(const Problem& p, const Sequence& block, std::int64_t hv, ValueInputs<S>& in) {
  load_rows(p.v, block, hv, in.v);
  load_column(p.g, block, hv, in.g);
  load_column(p.beta, block, hv, in.beta);
}

// initial_state[n, hv] in the compute type, or zeros.
template <class S>
void load_initial_state(const Problem& p, std::int64_t n, std::int64_t hv, Mat<S>& state) {
  if (p.initial_state.defined())
    load_state(p.initial_state, n, hv, state);
  else
    state = Mat<S>::Zero(p.K, p.V);
}

// d_final_state[n, hv] in the compute type, or zeros.
template <class S>
void load_final_state_grad(const Problem& p, const TensorView& d_final_state, std::int64_t n,
                           std::int64_t hv, Mat<S>& dS) {
  if (d_final_state.defined())
    load_state(d_final_state, n, hv, dS);
  else
    dS = Mat<S>::Zero(p.K, p.V);
}

// The gradient dx̂ with respect to rows x̂ (= x·ρ, normalised by l2_normalize_rows and then, if
// in.rotated, rotated: x̂ = R(θ) x ρ) becomes the gradient dx with respect to the raw rows x; with
// rotation, dθ += the rows' contribution (R3). Consumes dx_hat.
//
// With rotation, the function is evaluated as "rotate, then normalise" (the same function, since
// ‖R x‖ = ‖x‖): y = R x, x̂ = y ρ. The normalisation's backward ρ (dx̂ − x̂ (x̂·dx̂)) is run in
// the rotated frame on the stored rotated x̂, giving dy; then (R2, R3) with y = x̂ / ρ turn dy into
// dx and dθ. (R3 with the normalised x̂ and dx̂ instead gives the same dθ: the projection term
// x̂ (x̂·dx̂) contributes c (x̂_b x̂_a − x̂_a x̂_b) = 0 and the factors ρ and 1/ρ cancel.)
template <class S>
void qk_row_grads(const Problem& p, const QKInputs<S>& in, const Mat<S>& x_hat,
                  const Vec<S>& inv_norm, Mat<S>& dx_hat, Mat<S>& dtheta) {
  if (p.l2norm) l2_normalize_rows_backward(x_hat, inv_norm, dx_hat);
  if (!in.rotated) return;
  if (p.l2norm) {
    const Mat<S> y = (x_hat.array().colwise() / inv_norm.array()).matrix();
    unrotate_gradient_rows(dx_hat, y, in.angles, p.rotary_layout, dtheta);
  } else {
    unrotate_gradient_rows(dx_hat, x_hat, in.angles, p.rotary_layout, dtheta);
  }
}

// dq̃, dk̂ of a block (summed over the item's value heads) → dq, dk (and dθ, with rotation): the
// chain rule through q̃ = scale·q̂ and, with l2norm, through the normalisation, and with θ
// through the rotation (qk_row_grads). q and k share θ_t, so their dθ rows add, and so do those
// of the item's value heads (already summed into dq̃, dk̂). Consumes dq_tilde and dk_hat.
template <class S>
void store_qk_grads(const Problem& p, const Sequence& block, std::int64_t h, const QKInputs<S>& in,
                    Mat<S>& dq_tilde, Mat<S>& dk_hat, const GatedDeltaRuleGrads& grads) {
  // dθ needs both gradients whether or not dq, dk are stored.
  const bool want_dtheta = in.rotated && grads.dtheta.defined();
  Mat<S> dtheta;
  if (in.rotated) dtheta.setZero(block.length, p.K / 2);
  if (grads.dq.defined() || want_dtheta) {
    dq_tilde *= S(p.scale);  // now dq̂
    qk_row_grads(p, in, in.q_hat, in.q_inv_norm, dq_tilde, dtheta);
    if (grads.dq.defined()) store_rows(dq_tilde, grads.dq, block, h);
  }
  if (grads.dk.defined() || want_dtheta) {
    qk_row_grads(p, in, in.k, in.k_inv_norm, dk_hat, dtheta);
    if (grads.dk.defined()) store_rows(dk_hat, grads.dk, block, h);
  }
  if (want_dtheta) store_rows(dtheta, grads.dtheta, block, h);
}

// The gradients of one value head for one block of tokens.
template <class S>
struct ValueGrads {
  Mat<S> dv;  // rows × V
  Vec<S> dg;
  Vec<S> dbeta;

  void reset(std::int64_t rows, std::int64_t V) {
    dv.setZero(rows, V);
    dg.setZero(rows);
    dbeta.setZero(rows);
  }
};

template <class S>
void store_value_grads(const Sequence& block, std::int64_t hv, const ValueGrads<S>& d,
                       const GatedDeltaRuleGrads& grads) {
  if (grads.dv.defined()) store_rows(d.dv, grads.dv, block, hv);
  if (grads.dg.defined()) store_column(d.dg, grads.dg, block, hv);
  if (grads.dbeta.defined()) store_column(d.dbeta, grads.dbeta, block, hv);
}

}  // namespace phasor::detail::gdn
