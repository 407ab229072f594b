// Internal: validated problems of the STRING ops (phasor/string_rotation.h) and the kernels that
// solve them (reference in reference.cpp, optimized in kernels.cpp). api.cpp validates every
// argument before calling; the views here are already normalised:
//   omega   3-D [Hw, C, R]: Hw = 1 when the frequencies are shared by heads
//   theta   4-D [B, T, Ht, R]: Ht = Hw, or Hw = 1 and Ht ≥ 1 (then every head uses ω[0] and the
//           backward sums dθ over the Ht heads)
#pragma once

#include <cstdint>

#include "phasor/common.h"
#include "phasor/string_rotation.h"

namespace phasor::detail::string_rotation {

// A rank-(r+1) view of x with a leading dimension of size 1 (stride 0).
inline TensorView with_leading_one(const TensorView& x) {
  TensorView v = x;
  v.rank = x.rank + 1;
  for (int d = x.rank; d > 0; --d) {
    v.sizes[static_cast<std::size_t>(d)] = x.sizes[static_cast<std::size_t>(d - 1)];
    v.strides[static_cast<std::size_t>(d)] = x.strides[static_cast<std::size_t>(d - 1)];
  }
  v.sizes[0] = 1;
  v.strides[0] = 0;
  return v;
}
// [B, T, R] → [B, T, 1, R].
inline TensorView insert_head_dim(const TensorView& x) {
  TensorView v = x;
  v.rank = 4;
  v.sizes = {x.size(0), x.size(1), 1, x.size(2)};
  v.strides = {x.stride(0), x.stride(1), 0, x.stride(2)};
  return v;
}
// [B, T, 1, R] → [B, T, H, R] with a zero stride over heads (a broadcast input view).
inline TensorView broadcast_heads(const TensorView& x, std::int64_t H) {
  TensorView v = x;
  v.sizes[2] = H;
  v.strides[2] = 0;
  return v;
}

// (A1)–(A3). omega [Hw, C, R]; outputs optional in the backward.
void reference_angles_forward(const TensorView& positions, const TensorView& omega,
                              const TensorView& theta);
void reference_angles_backward(const TensorView& positions, const TensorView& omega,
                               const TensorView& d_theta, const TensorView& d_positions,
                               const TensorView& d_omega);
void angles_forward(const TensorView& positions, const TensorView& omega, const TensorView& theta);
void angles_backward(const TensorView& positions, const TensorView& omega,
                     const TensorView& d_theta, const TensorView& d_positions,
                     const TensorView& d_omega);

// Cayley-STRING. omega normalised to [Hw, C, K/2], generator to [Ha, K, K]; grads' d_omega and
// d_generator normalised the same way (undefined = not requested).
struct CayleyProblem {
  TensorView z, positions, omega, generator;
  RotaryLayout layout = RotaryLayout::half_split;
};
void reference_cayley_forward(const CayleyProblem& p, const TensorView& y);
void reference_cayley_backward(const CayleyProblem& p, const TensorView& dy,
                               const CayleyStringGrads& grads);
void cayley_forward(const CayleyProblem& p, const TensorView& y);
void cayley_backward(const CayleyProblem& p, const TensorView& dy, const CayleyStringGrads& grads);

// Circulant-STRING. c normalised to [Hc, C, K]; grads.dc likewise.
struct CirculantProblem {
  TensorView z, positions, c;
};
void reference_circulant_forward(const CirculantProblem& p, const TensorView& y);
void reference_circulant_backward(const CirculantProblem& p, const TensorView& dy,
                                  const CirculantStringGrads& grads);
void circulant_forward(const CirculantProblem& p, const TensorView& y);
void circulant_backward(const CirculantProblem& p, const TensorView& dy,
                        const CirculantStringGrads& grads);

}  // namespace phasor::detail::string_rotation
