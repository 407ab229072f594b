// Helpers shared by the LibTorch-layer tests (torch_test, favor_torch_test, rotations_torch_test):
// the at::Tensor side of the test-support library (tests/support, phasor_testing) — dtype
// shorthands, a view of a tensor for calling the core directly, the relative RMS error of
// at::Tensors, the EXPECT_CLOSE check, autograd leaves, the expected-c10::Error check, and finite
// differences through the torch API on the library's central-difference core.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "phasor/common.h"
#include "phasor/testing/finite_differences.h"
#include "phasor/testing/tensor.h"

namespace phasor::torch_test {

inline const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
inline const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);

// A view of a contiguous tensor for calling the core directly. Deliberately independent of the
// layer's own conversion (which handles any strides): the expected values go through this one.
inline TensorView core_view(const at::Tensor& t) {
  if (!t.defined()) return {};
  EXPECT_TRUE(t.is_contiguous());
  DType dtype = DType::float32;
  switch (t.scalar_type()) {
    case at::kFloat:
      break;
    case at::kDouble:
      dtype = DType::float64;
      break;
    case at::kInt:
      dtype = DType::int32;
      break;
    case at::kLong:
      dtype = DType::int64;
      break;
    default:
      ADD_FAILURE() << "unexpected dtype " << t.scalar_type();
  }
  return testing::contiguous_view(t.data_ptr(), dtype,
                                  testing::Shape(t.sizes().begin(), t.sizes().end()));
}

// sqrt(Σ(a − b)² / Σb²) in float64; b is trusted (testing::rel_rms's measure, in at:: ops).
inline double rel_rms(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.detach().to(at::kDouble), y = b.detach().to(at::kDouble);
  const double num = (x - y).pow(2).sum().item<double>(), den = y.pow(2).sum().item<double>();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// actual is defined, has expected's shape, is finite and within a relative RMS error tol of it.
// Each argument is evaluated once (a call that updates state may be passed).
#define EXPECT_CLOSE(actual, expected, tol, what)                                                \
  do {                                                                                           \
    const at::Tensor expect_close_a_ = (actual), expect_close_e_ = (expected);                   \
    ASSERT_TRUE(expect_close_a_.defined()) << (what) << " is undefined";                         \
    ASSERT_EQ(expect_close_a_.sizes(), expect_close_e_.sizes()) << (what);                       \
    EXPECT_TRUE(at::isfinite(expect_close_a_.detach()).all().item<bool>())                       \
        << (what) << " not finite";                                                              \
    EXPECT_LE(::phasor::torch_test::rel_rms(expect_close_a_, expect_close_e_), (tol)) << (what); \
  } while (0)

// A fresh leaf with the given values that requires grad.
inline at::Tensor leaf(const at::Tensor& values) {
  return values.detach().clone().requires_grad_(true);
}

// Expects a c10::Error (not some other exception) whose message holds every fragment.
template <class F>
void expect_torch_error(F&& fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected a c10::Error mentioning '" << *fragments.begin() << "'";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    for (const char* f : fragments)
      EXPECT_NE(what.find(f), std::string::npos) << "message '" << what << "' lacks '" << f << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a c10::Error, got another exception: " << e.what();
  }
}

// Central finite differences through the torch API (float64): loss(inputs) is a scalar tensor;
// autograd's gradient of every input is checked against (loss(x + εe_i) − loss(x − εe_i)) / 2ε,
// element by element. With expect_nonzero, a numerical gradient that is ~0 everywhere fails (the
// check would be vacuous).
inline void check_finite_differences(
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& loss,
    const std::vector<at::Tensor>& values, const std::vector<std::string>& names, double tol = 1e-6,
    bool expect_nonzero = false) {
  std::vector<at::Tensor> leaves;
  for (const auto& x : values) leaves.push_back(leaf(x));
  loss(leaves).backward();
  const double eps = 1e-6;
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(leaves[i].grad().defined()) << "no gradient for " << names[i];
    const at::Tensor analytic = leaves[i].grad().reshape(-1);
    const std::vector<double> central =
        testing::central_differences(analytic.numel(), eps, [&](std::int64_t e, double shift) {
          std::vector<at::Tensor> shifted = values;
          shifted[i] = values[i].clone();
          shifted[i].view(-1)[e] += shift;
          return loss(shifted).item<double>();
        });
    const at::Tensor numeric = at::tensor(central, f64);
    if (expect_nonzero) {
      EXPECT_GT(numeric.abs().max().item<double>(), 1e-8) << names[i] << ": a vacuous check";
    }
    EXPECT_LE(rel_rms(analytic, numeric), tol) << "gradient of " << names[i];
  }
}

}  // namespace phasor::torch_test
