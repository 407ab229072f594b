#include "phasor/testing/gtest.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "phasor/testing/layout.h"

namespace phasor::testing {
namespace {

std::string format(const char* pattern, double a, double b) {
  char text[128];
  std::snprintf(text, sizeof text, pattern, a, b);
  return text;
}

std::string count_of(const Tensor& x) {
  return x.defined() ? std::to_string(x.numel()) + " elements" : "undefined";
}

}  // namespace

::testing::AssertionResult close_in_rel_rms(const Tensor& actual, const Tensor& expected,
                                            double tol, const std::string& what) {
  if (actual.defined() != expected.defined() || actual.numel() != expected.numel())
    return ::testing::AssertionFailure()
           << what << ": " << count_of(actual) << ", expected " << count_of(expected);
  if (!all_finite(actual)) {
    const WorstElement worst = worst_element(actual, expected, 0);
    return ::testing::AssertionFailure() << what << " has non-finite values (e.g. element "
                                         << worst.index << ": " << worst.actual << ")";
  }
  const double error = rel_rms(actual, expected);
  if (error <= tol) return ::testing::AssertionSuccess();
  const WorstElement worst = worst_element(actual, expected, 0);
  return ::testing::AssertionFailure()
         << what << ": relative RMS error " << error << " exceeds " << tol
         << " (largest difference at element " << worst.index << ": "
         << format("%.10g against %.10g)", worst.actual, worst.expected);
}

::testing::AssertionResult all_near(const Tensor& actual, const Tensor& expected, double atol,
                                    double rtol, const std::string& what) {
  if (actual.defined() != expected.defined() || actual.numel() != expected.numel())
    return ::testing::AssertionFailure()
           << what << ": " << count_of(actual) << ", expected " << count_of(expected);
  const WorstElement worst = worst_element(actual, expected, atol, rtol);
  if (worst.excess <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << "[" << worst.index
         << "]: " << format("%.10g against %.10g", worst.actual, worst.expected) << ", beyond "
         << atol << " + " << rtol << "·|expected|";
}

::testing::AssertionResult gradient_matches(const Tensor& analytic, Tensor& x,
                                            const std::function<double()>& f, double tol,
                                            const std::string& what,
                                            const FiniteDifferenceOptions& options) {
  if (analytic.numel() != x.numel())
    return ::testing::AssertionFailure() << what << ": the analytic gradient has "
                                         << count_of(analytic) << ", the input " << count_of(x);
  const GradientCheck check = check_gradient(analytic, x, f, options);
  if (!check.analytic_finite)
    return ::testing::AssertionFailure() << what << " has non-finite values";
  if (check.rel_rms <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": relative RMS error " << check.rel_rms
         << " against central differences exceeds " << tol << "; worst " << check.where();
}

void expect_close(const NamedTensors& actual, const NamedTensors& expected, double tol,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const std::string name = what.empty() ? expected[i].first : what + " " + expected[i].first;
    ASSERT_EQ(actual[i].first, expected[i].first) << what;
    const Tensor &a = *actual[i].second, &e = *expected[i].second;
    EXPECT_EQ(a.defined(), e.defined()) << name << " defined";
    if (e.defined()) PHASOR_EXPECT_CLOSE(a, e, tol, name);
  }
}

void expect_bit_equal(const NamedTensors& a, const NamedTensors& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first) << what;
    EXPECT_TRUE(a[i].second->bit_equal(*b[i].second)) << what << ": " << a[i].first;
  }
}

void expect_in_place_runs_bit_equal(const std::vector<Tensor>& outputs,
                                    const std::vector<Tensor>& states, DType dtype,
                                    std::int64_t K) {
  const auto mode = [&](std::size_t i) {
    return std::string(to_string(dtype)) + " K = " + std::to_string(K) +
           (i % 2 == 0 ? " aligned" : " misaligned") + (i < 2 ? " aliased" : " separate");
  };
  expect_all_bit_equal(outputs, [&](std::size_t i) { return "o, " + mode(i); });
  expect_all_bit_equal(states, [&](std::size_t i) { return "state, " + mode(i); });
}

void expect_chunk_states(const Tensor& chunk_states, const BatchChunks& chunks,
                         const std::function<void(const BatchChunk&, const Tensor&)>& check) {
  ASSERT_EQ(chunk_states.size(0), chunks.slots) << "num_chunk_states";
  std::vector<bool> written(static_cast<std::size_t>(chunks.slots), false);
  for (const BatchChunk& chunk : chunks.chunks) {
    check(chunk, Tensor::copy_of(narrow(chunk_states.view(), 0, chunk.slot, 1)));
    written[static_cast<std::size_t>(chunk.slot)] = true;
  }
  for (std::int64_t slot = 0; slot < chunks.slots; ++slot) {
    if (written[static_cast<std::size_t>(slot)]) continue;
    for (double x : Tensor::copy_of(narrow(chunk_states.view(), 0, slot, 1)).values())
      EXPECT_TRUE(std::isnan(x)) << "slot " << slot << " (no chunk's) written";
  }
}

}  // namespace phasor::testing
