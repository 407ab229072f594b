// phasor_testing — gradients by central finite differences in float64, and their comparison with
// an analytic gradient: g_i ≈ (f(x + h e_i) − f(x − h e_i)) / 2h, whose error is the truncation
// h²·|f‴|/6 plus the rounding of f, about ε|f|/h. The default h = 1e-6 keeps both small for f and
// its derivatives of order 1 (≈ 2e-13 and ≈ 2e-10), well below the relative RMS error of 1e-7 the
// suites allow; a loss much larger than its gradient wants a larger step (FiniteDifferenceOptions).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "phasor/testing/compare.h"
#include "phasor/testing/tensor.h"

namespace phasor::testing {

struct FiniteDifferenceOptions {
  double step = 1e-6;
  // Elements of x that are ±inf (a closed forget gate, log 0) get gradient 0 without evaluating
  // f: x ± h is x again there.
  bool zero_at_infinite_inputs = false;
};

// The gradient of the scalar function f of n variables: f_shifted(i, δ) is f with variable i
// moved by δ (and the others as they are). The core of every finite-difference check, whatever
// holds the variables (a Tensor here, an at::Tensor in the LibTorch tests).
std::vector<double> central_differences(
    std::int64_t n, double step, const std::function<double(std::int64_t, double)>& f_shifted);

// d f / d x by central differences, f reading x (a float64 Tensor) where the caller keeps it:
// each element of x is moved by ±step in place, f called, and the element restored, so x is
// unchanged on return. A float64 Tensor of x's shape; a phasor::Error if x is not float64.
Tensor numerical_gradient(Tensor& x, const std::function<double()>& f,
                          const FiniteDifferenceOptions& options = {});

// An analytic gradient against central differences of f in x, and where they differ most.
struct GradientCheck {
  Tensor numeric;      // the central-difference gradient
  double rel_rms = 0;  // rel_rms(analytic, numeric)
  // The worst element relative to its own size, but never to less than the RMS size of the
  // whole numeric gradient (so entries ≈ 0 do not blow it up): |a − n| / max(|n|, RMS(n)).
  double worst_relative_error = 0;
  std::int64_t worst_index = -1;
  double analytic_at_worst = 0, numeric_at_worst = 0;
  bool analytic_finite = true;
  // "element 17 of [2, 7, 1, 3]: analytic 0.25, numeric 0.2500013 (relative error 5.2e-06)"
  std::string where() const;
};
GradientCheck check_gradient(const Tensor& analytic, Tensor& x, const std::function<double()>& f,
                             const FiniteDifferenceOptions& options = {});

}  // namespace phasor::testing
