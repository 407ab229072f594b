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

// load_rows / store_rows (slices.h) with a fast path for the common layout: when x already has
// the compute dtype and unit stride along D, rows are copied as strided blocks (vectorised)
// instead of element by element through the generic converter. Same values either way.
template <class S>
void load_token_rows(const TensorView& x, const Sequence& s, std::int64_t h, Mat<S>& out) {
  // (D = 0: a tensor with no elements may have no data pointer to offset; the generic path.)
  if (x.dtype == dtype_of<S>() && x.stride(3) == 1 && s.length > 0 && x.size(3) > 0) {
    const S* base = static_cast<const S*>(x.data) + s.batch * x.stride(0) + s.start * x.stride(1) +
                    h * x.stride(2);
    out = Eigen::Map<const Mat<S>, 0, Eigen::OuterStride<>>(base, s.length, x.size(3),
                                                            Eigen::OuterStride<>(x.stride(1)));
    return;
  }
  load_rows(x, s, h, out);
}

template <class S>
void store_token_rows(const Mat<S>& in, const TensorView& x, const Sequence& s, std::int64_t h) {
  if (x.dtype == dtype_of<S>() && x.stride(3) == 1 && s.length > 0 && x.size(3) > 0) {
    S* base =
        static_cast<S*>(x.data) + s.batch * x.stride(0) + s.start * x.stride(1) + h * x.stride(2);
    Eigen::Map<Mat<S>, 0, Eigen::OuterStride<>>(base, s.length, x.size(3),
                                                Eigen::OuterStride<>(x.stride(1))) = in;
    return;
  }
  store_rows(in, x, s, h);
}

}  // namespace phasor::detail::gla
