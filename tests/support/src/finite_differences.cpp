#include "phasor/testing/finite_differences.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace phasor::testing {

std::vector<double> central_differences(
    std::int64_t n, double step, const std::function<double(std::int64_t, double)>& f_shifted) {
  if (!(step > 0))
    throw Error("phasor::testing::central_differences: 'step' must be positive, got " +
                std::to_string(step));
  std::vector<double> gradient(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double up = f_shifted(i, step), down = f_shifted(i, -step);
    gradient[static_cast<std::size_t>(i)] = (up - down) / (2 * step);
  }
  return gradient;
}

Tensor numerical_gradient(Tensor& x, const std::function<double()>& f,
                          const FiniteDifferenceOptions& options) {
  if (!x.defined() || x.dtype() != DType::float64)
    throw Error(std::string("phasor::testing::numerical_gradient: 'x' must be a float64 tensor, "
                            "got ") +
                (x.defined() ? to_string(x.dtype()) : "an undefined one"));
  const std::vector<double> gradient =
      central_differences(x.numel(), options.step, [&](std::int64_t i, double shift) {
        const double saved = x.at(i);
        if (options.zero_at_infinite_inputs && std::isinf(saved)) return 0.0;
        x.set(i, saved + shift);
        const double value = f();
        x.set(i, saved);
        return value;
      });
  return Tensor::from(x.shape(), gradient);
}

GradientCheck check_gradient(const Tensor& analytic, Tensor& x, const std::function<double()>& f,
                             const FiniteDifferenceOptions& options) {
  GradientCheck check;
  check.numeric = numerical_gradient(x, f, options);
  check.rel_rms = rel_rms(analytic, check.numeric);
  check.analytic_finite = all_finite(analytic);
  double squares = 0;
  for (std::int64_t i = 0; i < check.numeric.numel(); ++i)
    squares += check.numeric.at(i) * check.numeric.at(i);
  const double rms = check.numeric.numel() > 0
                         ? std::sqrt(squares / static_cast<double>(check.numeric.numel()))
                         : 0.0;
  for (std::int64_t i = 0; i < check.numeric.numel(); ++i) {
    const double a = analytic.at(i), n = check.numeric.at(i);
    const double scale = std::max(std::fabs(n), rms);
    double error = scale > 0 ? std::fabs(a - n) / scale : std::fabs(a - n);
    if (std::isnan(error)) error = HUGE_VAL;
    if (check.worst_index < 0 || error > check.worst_relative_error) {
      check.worst_relative_error = error;
      check.worst_index = i;
      check.analytic_at_worst = a;
      check.numeric_at_worst = n;
    }
  }
  return check;
}

std::string GradientCheck::where() const {
  if (worst_index < 0) return "no elements";
  std::string shape = "[";
  for (std::size_t d = 0; d < numeric.shape().size(); ++d)
    shape += (d ? ", " : "") + std::to_string(numeric.shape()[d]);
  shape += "]";
  char values[160];
  std::snprintf(values, sizeof values, ": analytic %.10g, numeric %.10g (relative error %.3g)",
                analytic_at_worst, numeric_at_worst, worst_relative_error);
  return "element " + std::to_string(worst_index) + " of " + shape + values;
}

}  // namespace phasor::testing
