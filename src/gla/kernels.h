// Internal: the GLA kernels behind gla_forward / gla_backward (include/phasor/gla.h).
//
// api.cpp validates every argument and builds a Problem; the kernels then trust it. Each kernel
// splits the work over (sequence, head) pairs with parallel_for; one pair is computed start to
// finish by one thread, in a fixed order, so results are bit-identical for any thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "common/check.h"
#include "phasor/common.h"
#include "phasor/gla.h"

namespace phasor::detail::gla {

// A validated GLA call: the input views, the packed sequences and the resolved options.
struct Problem {
  TensorView q, k, v, g;
  TensorView initial_state;  // undefined: S_0 = 0
  std::vector<Sequence> sequences;
  std::int64_t H = 0, K = 0, V = 0;
  double scale = 1.0;
  // chunk: tokens per chunk; recurrent backward: tokens between two state checkpoints.
  std::int64_t chunk_size = 64;

  std::int64_t num_sequences() const { return static_cast<std::int64_t>(sequences.size()); }
  std::int64_t num_work_items() const { return num_sequences() * H; }
};

// Forward: o [B, T, H, V] is fully written; final_state [N, H, K, V] if defined (may alias
// problem.initial_state).
void reference_forward(const Problem& problem, const TensorView& o, const TensorView& final_state);
void recurrent_forward(const Problem& problem, const TensorView& o, const TensorView& final_state);
void chunk_forward(const Problem& problem, const TensorView& o, const TensorView& final_state);

// Backward: d_o [B, T, H, V]; d_final_state optional (zeros). Writes each defined view of grads
// (dh0 only if problem.initial_state is defined; api.cpp enforces this).
void reference_backward(const Problem& problem, const TensorView& d_o,
                        const TensorView& d_final_state, const GlaGrads& grads);
void recurrent_backward(const Problem& problem, const TensorView& d_o,
                        const TensorView& d_final_state, const GlaGrads& grads);
void chunk_backward(const Problem& problem, const TensorView& d_o, const TensorView& d_final_state,
                    const GlaGrads& grads);

// The tokens [offset, offset + length) of a sequence, as a Sequence usable with slices.h.
inline Sequence subsequence(const Sequence& s, std::int64_t offset, std::int64_t length) {
  return Sequence{s.batch, s.start + offset, length};
}

}  // namespace phasor::detail::gla
