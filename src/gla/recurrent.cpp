// GLA recurrent kernel (fla's fused_recurrent_gla): token by token in the compute type.
//
//   S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,      o_t = S_tᵀ (scale · q_t)
//
// Forward: inputs are read in segments of chunk_size tokens into reused buffers; the state
// (K × V) is updated one row (one key channel) at a time, and o_t accumulated from the same row
// while it is in cache. The state is kept in final_state itself when its layout and aliasing
// allow (state_in_place, slices.h): decoding with final_state = initial_state then touches the
// state once per token instead of copying it in and out (bit-identical either way).
//
// Backward: the state is checkpointed at the start of every segment of chunk_size tokens (one
// forward pass), then the segments are walked in reverse: each segment's states are recomputed
// from its checkpoint and the adjoint dS is carried back token by token. Memory per (sequence,
// head) is O(T/C · K·V + C · K·V), never O(T · K·V). The gate gradient uses the direct per-step
// form dg_t = exp(g_t) ⊙ rowsum(S_{t−1} ⊙ dS_t), a sum of products without cancellation.
//
// Rotation (θ given): each segment's q and k rows are rotated by θ (R1, common/rotation.h) as
// they are loaded, in the forward, in both backward passes; the backward's dq, dk (with respect
// to the rotated rows) are turned into dq, dk, dθ (R2, R3) per segment with the same cos/sin.

#include "common/eigen.h"  // first: see there

#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/kept_buffers.h"
#include "common/packets.h"
#include "common/parallel.h"
#include "common/slices.h"
#include "gla/kernels.h"

namespace phasor::detail::gla {
namespace {

template <class S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

// The inputs of one segment of a (sequence, head) pair. decay = exp(g), elementwise. With θ,
// q and k hold the rotated rows R(θ_t) q_t, R(θ_t) k_t and `angles` the segment's cos/sin.
template <class S>
struct Segment {
  Mat<S> q, k, v, decay;
  PairAngles<S> angles;

  void load(const Problem& p, const Sequence& part, std::int64_t h, bool with_q) {
    if (with_q) load_rows(p.q, part, h, q);
    load_rows(p.k, part, h, k);
    load_rows(p.v, part, h, v);
    load_rows(p.g, part, h, decay);
    decay = decay.array().exp().matrix();
    if (p.theta.defined()) {
      angles.load(p.theta, part, h);
      if (with_q) rotate_rows(q, angles, p.rotary_layout);
      rotate_rows(k, angles, p.rotary_layout);
    }
  }
};

// state ← diag(decay_t) state + k_t v_tᵀ, row by row (each row is one key channel).
template <class S, class State>
void advance(const Segment<S>& seg, std::int64_t t, State&& state) {
  for (std::int64_t a = 0; a < state.rows(); ++a)
    state.row(a) = seg.decay(t, a) * state.row(a) + seg.k(t, a) * seg.v.row(t);
}

// One token's step in float32 for V = 16 · NP ≤ 128 columns, defined with AVX-512 only (reached
// through with_float_packets_of_16, which calls nothing otherwise): see below.
template <int NP>
void step_in_registers(float* state, std::int64_t K, const float* decay, const float* k,
                       const float* v, const float* q_scaled, float* out);

#if defined(__AVX512F__)
// One token's step in float32 for V = 16 · NP columns (V ≤ 128): for every row a of the state
// (key channel), S[a] ← decay_a S[a] + k_a v, then o += (scale q_a) S[a]. The NP packets of v
// and of o stay in registers across all K rows, so each state packet is loaded, updated, stored
// and added into o in one go — the generic loop below makes two passes over each row and keeps
// o in memory, which costs about twice the time when the state is in cache (decoding).
template <int NP>
void step_in_registers(float* state, std::int64_t K, const float* decay, const float* k,
                       const float* v, const float* q_scaled, float* out) {
  __m512 value[NP], acc[NP];
  for (int j = 0; j < NP; ++j) {
    value[j] = _mm512_loadu_ps(v + 16 * j);
    acc[j] = _mm512_setzero_ps();
  }
  for (std::int64_t a = 0; a < K; ++a) {
    float* row = state + a * 16 * NP;
    const __m512 d = _mm512_set1_ps(decay[a]), key = _mm512_set1_ps(k[a]),
                 c = _mm512_set1_ps(q_scaled[a]);
    for (int j = 0; j < NP; ++j) {
      const __m512 updated =
          _mm512_fmadd_ps(d, _mm512_loadu_ps(row + 16 * j), _mm512_mul_ps(key, value[j]));
      _mm512_storeu_ps(row + 16 * j, updated);
      acc[j] = _mm512_fmadd_ps(c, updated, acc[j]);
    }
  }
  for (int j = 0; j < NP; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

#endif

// The buffers of forward_item, kept per thread across calls, as Gated DeltaNet's: decoding calls
// the forward once per token, and a segment's rows freed after every item were trimmed from
// malloc's heap and faulted back in by the next (B = 1, H = 8, T = 1024, K = V = 128: 192 page
// faults a forward). All are O(chunk_size · (K + V) + K · V).
template <class S>
struct ForwardScratch {
  Segment<S> seg;
  Mat<S> out, state, initial;
  Vec<S> q_scaled;
};

// The tokens of sequence s, head h: S_t and o_t; `state` holds S_{start−1} on entry, S_end on exit.
template <class S, class State>
void forward_steps(const Problem& p, const Sequence& s, std::int64_t h, const TensorView& o,
                   State& state, ForwardScratch<S>& w) {
  const S scale = static_cast<S>(p.scale);
  Segment<S>& seg = w.seg;
  Mat<S>& out = w.out;
  for (std::int64_t offset = 0; offset < s.length; offset += p.chunk_size) {
    const Sequence part = subsequence(s, offset, std::min(p.chunk_size, s.length - offset));
    seg.load(p, part, h, /*with_q=*/true);
    out.setZero(part.length, p.V);
    // float32 with AVX-512: step_in_registers. The state is K × V, rows contiguous (Mat or
    // StateMap of one).
    const bool stepped = with_float_packets_of_16<S>(p.V, [&](auto packets) {
      Vec<S>& q_scaled = w.q_scaled;
      for (std::int64_t t = 0; t < part.length; ++t) {
        q_scaled = scale * seg.q.row(t).transpose();
        step_in_registers<decltype(packets)::value>(state.data(), p.K, &seg.decay(t, 0),
                                                    &seg.k(t, 0), &seg.v(t, 0), q_scaled.data(),
                                                    &out(t, 0));
      }
    });
    if (stepped) {
      store_rows(out, o, part, h);
      continue;
    }
    for (std::int64_t t = 0; t < part.length; ++t) {
      // One pass over the rows: update row a of S_t, then o_t += scale · q_t[a] · S_t[a, :].
      auto out_row = out.row(t);
      for (std::int64_t a = 0; a < p.K; ++a) {
        auto row = state.row(a);
        row = seg.decay(t, a) * row + seg.k(t, a) * seg.v.row(t);
        out_row.noalias() += (scale * seg.q(t, a)) * row;
      }
    }
    store_rows(out, o, part, h);
  }
}

// in_place: the state may live in final_state (states_in_place_allowed, slices.h).
template <class S>
void forward_item(const Problem& p, std::int64_t n, std::int64_t h, const TensorView& o,
                  const TensorView& final_state, bool in_place) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  thread_local ForwardScratch<S> w;
  if (S* target = in_place ? state_in_place<S>(final_state, n, h) : nullptr) {
    StateMap<S> state(target, p.K, p.V);
    if (!p.initial_state.defined()) {
      state.setZero();
    } else if (!same_view(p.initial_state, final_state)) {
      load_state(p.initial_state, n, h, w.initial);
      state = w.initial;
    }
    forward_steps<S>(p, s, h, o, state, w);
    return;
  }
  Mat<S>& state = w.state;
  if (p.initial_state.defined())
    load_state(p.initial_state, n, h, state);
  else
    state.setZero(p.K, p.V);
  forward_steps<S>(p, s, h, o, state, w);
  if (final_state.defined()) store_state(state, final_state, n, h);
}

// The buffers of backward_item, kept per thread across calls (an item runs start to finish on one
// thread), so that they are not trimmed from malloc's heap and faulted back in by the next item;
// above kKeptBytes the checkpoints (O(T / C) states) and the segment's states are released after
// the item.
template <class S>
struct BackwardScratch {
  Segment<S> seg;
  Mat<S> checkpoints, state, d_state, states, d_out, dq, dk, dv, dg, dtheta;

  void release_if_large() { detail::release_if_large(checkpoints, states); }
};

template <class S>
void backward_item(const Problem& p, std::int64_t n, std::int64_t h, const TensorView& d_o,
                   const TensorView& d_final_state, const GlaGrads& grads) {
  thread_local BackwardScratch<S> w;
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  const std::int64_t C = p.chunk_size, K = p.K, V = p.V;
  const S scale = static_cast<S>(p.scale);
  const std::int64_t num_segments = (s.length + C - 1) / C;
  // dq', dk' (rotated frame) need turning back only if dq, dk or dθ is requested.
  const bool unrotate =
      p.theta.defined() && (grads.dq.defined() || grads.dk.defined() || grads.dtheta.defined());

  // Pass 1: checkpoints[i] = the state before segment i.
  Mat<S>& checkpoints = w.checkpoints;
  checkpoints.resize(num_segments * K, V);
  Mat<S>& state = w.state;
  state.setZero(K, V);
  if (p.initial_state.defined()) load_state(p.initial_state, n, h, state);
  Segment<S>& seg = w.seg;
  for (std::int64_t i = 0; i < num_segments; ++i) {
    checkpoints.middleRows(i * K, K) = state;
    // Pass 2 needs no state after the last segment (a sequence of one segment replays nothing).
    if (i + 1 == num_segments) break;
    const Sequence part = subsequence(s, i * C, std::min(C, s.length - i * C));
    seg.load(p, part, h, /*with_q=*/false);
    for (std::int64_t t = 0; t < part.length; ++t) advance(seg, t, state);
  }

  // Pass 2: segments in reverse. d_state is the gradient with respect to the state after the
  // token being processed (everything later already folded in).
  Mat<S>& d_state = w.d_state;
  d_state.setZero(K, V);
  if (d_final_state.defined()) load_state(d_final_state, n, h, d_state);
  // (length + 1) blocks of K rows: states[t] = state before token t of the segment
  Mat<S>& states = w.states;
  Mat<S>&d_out = w.d_out, &dq = w.dq, &dk = w.dk, &dv = w.dv, &dg = w.dg, &dtheta = w.dtheta;
  for (std::int64_t i = num_segments - 1; i >= 0; --i) {
    const Sequence part = subsequence(s, i * C, std::min(C, s.length - i * C));
    const std::int64_t L = part.length;
    seg.load(p, part, h, /*with_q=*/true);
    load_rows(d_o, part, h, d_out);
    states.resize((L + 1) * K, V);
    states.topRows(K) = checkpoints.middleRows(i * K, K);
    for (std::int64_t t = 0; t < L; ++t) {
      states.middleRows((t + 1) * K, K) = states.middleRows(t * K, K);
      advance(seg, t, states.middleRows((t + 1) * K, K));
    }
    dq.resize(L, K);
    dk.resize(L, K);
    dg.resize(L, K);
    dv.setZero(L, V);
    for (std::int64_t t = L - 1; t >= 0; --t) {
      auto previous = states.middleRows(t * K, K);       // S_{t−1}
      auto current = states.middleRows((t + 1) * K, K);  // S_t
      auto do_t = d_out.row(t);
      auto dv_t = dv.row(t);
      for (std::int64_t a = 0; a < K; ++a) {
        auto d_row = d_state.row(a);
        d_row.noalias() += (scale * seg.q(t, a)) * do_t;          // o_t = S_tᵀ (scale q_t)
        dq(t, a) = scale * current.row(a).dot(do_t);              // dq_t = scale S_t do_t
        dk(t, a) = d_row.dot(seg.v.row(t));                       // dk_t = dS_t v_t
        dv_t.noalias() += seg.k(t, a) * d_row;                    // dv_t = dS_tᵀ k_t
        dg(t, a) = seg.decay(t, a) * previous.row(a).dot(d_row);  // exp(g) ⊙ rowsum(S_{t−1} ⊙ dS_t)
        d_row *= seg.decay(t, a);  // dS_{t−1} = diag(exp(g_t)) dS_t
      }
    }
    if (unrotate) {  // dq', dk' (rotated frame) → dq, dk, and dθ from both
      dtheta.setZero(L, K / 2);
      unrotate_gradient_rows(dq, seg.q, seg.angles, p.rotary_layout, dtheta);
      unrotate_gradient_rows(dk, seg.k, seg.angles, p.rotary_layout, dtheta);
      if (grads.dtheta.defined()) store_rows(dtheta, grads.dtheta, part, h);
    }
    if (grads.dq.defined()) store_rows(dq, grads.dq, part, h);
    if (grads.dk.defined()) store_rows(dk, grads.dk, part, h);
    if (grads.dv.defined()) store_rows(dv, grads.dv, part, h);
    if (grads.dg.defined()) store_rows(dg, grads.dg, part, h);
  }
  if (grads.dh0.defined()) store_state(d_state, grads.dh0, n, h);
  w.release_if_large();
}

}  // namespace

void recurrent_forward(const Problem& p, const TensorView& o, const TensorView& final_state) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    const bool in_place =
        states_in_place_allowed(final_state, p.initial_state, {p.q, p.k, p.v, p.g, p.theta, o});
    // An item: T_n tokens of 2·K·V multiply-adds (on average over the sequences).
    const std::int64_t tokens = p.B * p.T / std::max<std::int64_t>(1, p.num_sequences());
    const std::int64_t work = 2 * p.K * p.V * std::max<std::int64_t>(1, tokens);
    parallel_for(p.num_work_items(), work, [&](std::int64_t item) {
      forward_item<S>(p, item / p.H, item % p.H, o, final_state, in_place);
    });
  });
}

void recurrent_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                        const GlaGrads& grads) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_work_items(), [&](std::int64_t item) {
      backward_item<S>(p, item / p.H, item % p.H, d_o, d_final_state, grads);
    });
  });
}

}  // namespace phasor::detail::gla
