// phasor_testing's GoogleTest adapters: EXPECT-style checks built on the library's error measures
// (the library itself does not depend on GoogleTest; `phasor demo` links it without).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "phasor/testing/cases.h"
#include "phasor/testing/compare.h"
#include "phasor/testing/finite_differences.h"
#include "phasor/testing/tensor.h"

namespace phasor::testing {

// `actual` is finite, has `expected`'s element count and is within a relative RMS error `tol` of
// the trusted `expected` (two undefined tensors pass). The failure names `what`.
::testing::AssertionResult close_in_rel_rms(const Tensor& actual, const Tensor& expected,
                                            double tol, const std::string& what);
// Every element within |a − e| ≤ atol + rtol·|e| (NaN fails); the failure shows the worst one.
::testing::AssertionResult all_near(const Tensor& actual, const Tensor& expected, double atol,
                                    double rtol, const std::string& what);
// The analytic gradient of f in x is finite and within a relative RMS error `tol` of central
// differences (check_gradient); the failure shows the worst element.
::testing::AssertionResult gradient_matches(const Tensor& analytic, Tensor& x,
                                            const std::function<double()>& f, double tol,
                                            const std::string& what,
                                            const FiniteDifferenceOptions& options = {});

}  // namespace phasor::testing

// EXPECT that `actual` matches the trusted `expected` to relative RMS ≤ tol, naming the quantity.
// (A statement, so it may stand after an if without braces.)
#define PHASOR_EXPECT_CLOSE(actual, expected, tol, what)                                   \
  do {                                                                                     \
    EXPECT_TRUE(::phasor::testing::close_in_rel_rms((actual), (expected), (tol), (what))); \
  } while (0)
// EXPECT |actual − expected| ≤ atol + rtol·|expected| element by element.
#define PHASOR_EXPECT_ALL_NEAR(actual, expected, atol, rtol, what)                          \
  do {                                                                                      \
    EXPECT_TRUE(::phasor::testing::all_near((actual), (expected), (atol), (rtol), (what))); \
  } while (0)
// EXPECT the analytic gradient of f() in x to match central differences to relative RMS ≤ tol
// (optionally with FiniteDifferenceOptions as a sixth argument).
#define PHASOR_EXPECT_GRADIENT(analytic, x, f, tol, ...)                                        \
  do {                                                                                          \
    EXPECT_TRUE(::phasor::testing::gradient_matches((analytic), (x), (f), (tol), __VA_ARGS__)); \
  } while (0)

namespace phasor::testing {

// Runs `fn` and expects a phasor::Error whose message contains every one of `fragments`.
template <class F>
void expect_error(F&& fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected a phasor::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* f : fragments)
      EXPECT_NE(what.find(f), std::string::npos) << "message '" << what << "' lacks '" << f << "'";
  }
}

// Field by field (the same names in the same order): each field defined in both or in neither,
// and every field `expected` defines within a relative RMS error `tol` of it.
void expect_close(const NamedTensors& actual, const NamedTensors& expected, double tol,
                  const std::string& what = "");
// Field by field: the same dtype, shape and bytes (two undefined fields are equal).
void expect_bit_equal(const NamedTensors& a, const NamedTensors& b, const std::string& what);

// Kept chunk states [slots, heads, K, V] (NaN before the forward): every slot of `chunks`
// checked by check(chunk, its state) — the state a reference computes — and every other slot still
// NaN (a packed batch's slots between sequences are not written).
void expect_chunk_states(const Tensor& chunk_states, const BatchChunks& chunks,
                         const std::function<void(const BatchChunk&, const Tensor&)>& check);

// Every tensor of `results` equal, bit for bit, to the first (`label(i)` names result i).
template <class Label>
void expect_all_bit_equal(const std::vector<Tensor>& results, Label&& label) {
  for (std::size_t i = 1; i < results.size(); ++i)
    EXPECT_TRUE(results[i].bit_equal(results[0])) << label(i) << " differs from " << label(0);
}

// The in-place decoding tests' four runs of one dtype and K (aligned or misaligned state buffer,
// final_state aliasing initial_state or separate): outputs and states of run i against run 0.
void expect_in_place_runs_bit_equal(const std::vector<Tensor>& outputs,
                                    const std::vector<Tensor>& states, DType dtype, std::int64_t K);

}  // namespace phasor::testing
