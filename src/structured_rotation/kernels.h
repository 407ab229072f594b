// Internal: the validated problems of the structured rotation ops and the functions that solve
// them (reference.cpp: plain float64 loops; kernels.cpp: the optimized kernel, the decomposition
// and the Cayley transform). api.cpp validates every argument before calling.
#pragma once

#include <cstdint>
#include <string>

#include "common/check.h"
#include "common/element_access.h"
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

}  // namespace phasor::detail::structured_rotation
