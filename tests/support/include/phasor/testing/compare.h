// phasor_testing — error measures between a result and a trusted value: the relative RMS error
// (the measure every accuracy bound of phasor is stated in), the largest absolute difference, the
// worst element against an |a − e| ≤ atol + rtol·|e| rule, and the same over named sets of tensors
// (the outputs and gradients of one run of an op).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "phasor/testing/tensor.h"

namespace phasor::testing {

// sqrt(Σ(a − e)² / Σe²), in float64; sqrt(Σ(a − e)²) when e is all zeros (0 when both are).
// `expected` is the trusted value. Two undefined tensors give 0; a phasor::Error when the element
// counts differ (or one is undefined and the other is not).
double rel_rms(const Tensor& actual, const Tensor& expected);
// max |a − e| (0 for no elements); the same errors as rel_rms.
double max_abs_diff(const Tensor& actual, const Tensor& expected);
bool all_finite(const Tensor& x);
// Σ a·b over all elements, in float64.
double dot(const Tensor& a, const Tensor& b);

// The element that most exceeds |a − e| ≤ atol + rtol·|e|: excess = |a − e| − (atol + rtol·|e|)
// (≤ 0 everywhere when the rule holds; +inf for a NaN or a mismatched infinity), at `index`
// (row-major; −1 for no elements).
struct WorstElement {
  double excess = 0;
  std::int64_t index = -1;
  double actual = 0, expected = 0;
};
WorstElement worst_element(const Tensor& actual, const Tensor& expected, double atol,
                           double rtol = 0);

// The outputs of one run of an op by name ("o", "dq", ...), for comparing two runs field by field.
// The pointers refer to tensors owned elsewhere (usually a result struct's members).
using NamedTensors = std::vector<std::pair<std::string, const Tensor*>>;
// The largest rel_rms over the fields that `expected` defines (0 when none); a phasor::Error when
// the two lists do not name the same fields in the same order.
double worst_rel_rms(const NamedTensors& actual, const NamedTensors& expected);

}  // namespace phasor::testing
