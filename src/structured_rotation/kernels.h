// Internal: the validated problems of the structured rotation ops and the functions that solve
// them (reference.cpp: plain float64 loops; kernels.cpp: the optimized kernel, the decomposition
// and the Cayley transform). api.cpp validates every argument before calling.
#pragma once

#include <cstdint>
#include <string>

#include "common/check.h"
#include "phasor/structured_rotation.h"

namespace phasor::detail::structured_rotation {

// The encoding y = R(r) P x: shapes checked (x [B, T, H, K], positions [B, T, H, C], basis
// [K, 2m], coefficients [C, m], post_rotation [K, K] or undefined).
struct ApplyProblem {
  TensorView x, positions, basis, coefficients, post_rotation;
  std::int64_t B = 0, T = 0, H = 0, K = 0, C = 0, m = 0;
};

void reference_forward(const ApplyProblem& p, const TensorView& y);
void reference_backward(const ApplyProblem& p, const TensorView& dy,
                        const StructuredRotationGrads& grads);
void forward(const ApplyProblem& p, const TensorView& y);
void backward(const ApplyProblem& p, const TensorView& dy, const StructuredRotationGrads& grads);

// Lemma 1. `op` names the op in errors (non-skew, non-commuting generators, failed
// decomposition). Returns m.
std::int64_t decompose(const std::string& op, const StructuredDecompositionParams& params,
                       const StructuredDecompositionOutputs& outputs);

// Lemma 3 (shapes checked; null_basis may be undefined).
void cayley_forward(const std::string& op, const TensorView& s, const TensorView& null_basis,
                    const TensorView& p);
void cayley_backward(const std::string& op, const TensorView& s, const TensorView& null_basis,
                     const TensorView& dp, const TensorView& ds);

// Element access of a float view as double, by (up to 4) indices.
inline std::int64_t offset_of(const TensorView& x, std::int64_t i0, std::int64_t i1 = 0,
                              std::int64_t i2 = 0, std::int64_t i3 = 0) {
  const std::int64_t idx[4] = {i0, i1, i2, i3};
  std::int64_t off = 0;
  for (int d = 0; d < x.rank; ++d) off += idx[d] * x.stride(d);
  return off;
}
inline double get(const TensorView& x, std::int64_t offset) {
  return x.dtype == DType::float32 ? static_cast<double>(static_cast<const float*>(x.data)[offset])
                                   : static_cast<const double*>(x.data)[offset];
}
inline void put(const TensorView& x, std::int64_t offset, double v) {
  if (x.dtype == DType::float32)
    static_cast<float*>(x.data)[offset] = static_cast<float>(v);
  else
    static_cast<double*>(x.data)[offset] = v;
}

}  // namespace phasor::detail::structured_rotation
