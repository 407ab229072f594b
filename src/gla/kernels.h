// Internal: the GLA kernels behind gla_forward / gla_backward (include/phasor/gla.h).
//
// api.cpp validates every argument and builds a Problem (gla/problem.h); the kernels trust it. Each
// kernel splits the work over (sequence, head) pairs with parallel_for; one pair is computed start
// to finish by one thread, in a fixed order, so results are bit-identical for any thread count.
//
// Fused rotation (theta defined): the recurrent and chunk kernels rotate q_t and k_t by θ_t
// (R1 of common/rotation.h) right after loading a segment's / chunk's rows, and run unchanged on
// the rotated q', k'. Their backward computes dq', dk' with respect to the rotated rows exactly as
// without rotation (dg and dv only ever see q', k'), then turns them into dq, dk and dθ (R2, R3)
// with the same cos/sin, q and k adding into one dθ block. The reference rotates on its own,
// with plain loops from the equations.
#pragma once

#include <Eigen/Core>
#include <cstdint>

#include "common/check.h"
#include "common/rotation.h"
#include "common/slices.h"
#include "gla/problem.h"
#include "phasor/common.h"
#include "phasor/gla.h"

namespace phasor::detail::gla {

// Forward: o [B, T, H, V] is fully written; final_state [N, H, K, V] if defined (may alias
// problem.initial_state).
void reference_forward(const Problem& problem, const TensorView& o, const TensorView& final_state);
void recurrent_forward(const Problem& problem, const TensorView& o, const TensorView& final_state);
// chunk_states (chunk only; optional): [num_chunk_states, H, K, V], the state entering every chunk,
// at Sequences::chunk_slot(chunk_size, n, c) — written by the forward, read by the backward in
// place of its replay of the state recurrence.
void chunk_forward(const Problem& problem, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states);

// Backward: d_o [B, T, H, V]; d_final_state optional (zeros). Writes each defined view of grads
// (dh0 only if problem.initial_state is defined; api.cpp enforces this).
void reference_backward(const Problem& problem, const TensorView& d_o,
                        const TensorView& d_final_state, const GlaGrads& grads);
void recurrent_backward(const Problem& problem, const TensorView& d_o,
                        const TensorView& d_final_state, const GlaGrads& grads);
void chunk_backward(const Problem& problem, const TensorView& d_o, const TensorView& d_final_state,
                    const GlaGrads& grads, const TensorView& chunk_states);

// The tokens [offset, offset + length) of a sequence, as a Sequence usable with slices.h.
inline Sequence subsequence(const Sequence& s, std::int64_t offset, std::int64_t length) {
  return Sequence{s.batch, s.start + offset, length};
}

}  // namespace phasor::detail::gla
