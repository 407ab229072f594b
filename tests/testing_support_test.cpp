// Tests of the test-support library itself (tests/support, phasor_testing): the owning tensor and
// its dtypes, the memory layouts and slices, the seeded inputs, the error measures, the
// finite-difference checker (it must find a wrong gradient, and where), the dense matrix
// exponential, the device staging, and the GoogleTest adapters' verdicts. Every other suite
// trusts these.
#include "common/eigen.h"  // first: see there

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "phasor/testing/compare.h"
#include "phasor/testing/device.h"
#include "phasor/testing/finite_differences.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/layout.h"
#include "phasor/testing/matrix_exp.h"
#include "phasor/testing/random.h"
#include "phasor/testing/tensor.h"

namespace phasor {
namespace {

using testing::MemoryLayout;
using testing::StridedTensor;
using testing::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

// 0, 1, 2, ... in row-major order.
Tensor iota(const testing::Shape& shape, DType dtype = DType::float64) {
  Tensor t(shape, dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
  return t;
}

// ---- the tensor --------------------------------------------------------------------------------

TEST(TestingTensor, ValuesRoundToTheDtype) {
  const double third = 1.0 / 3.0;
  for (DType dtype : {DType::float32, DType::float64, DType::bfloat16, DType::float16}) {
    Tensor t({2}, dtype);
    t.set(0, third);
    t.set(1, -2.5);
    EXPECT_EQ(t.at(1), -2.5) << to_string(dtype);
    const double expected = dtype == DType::float64   ? third
                            : dtype == DType::float32 ? double(float(third))
                            : dtype == DType::bfloat16
                                ? double(bfloat16::from_float(float(third)).to_float())
                                : double(float16::from_float(float(third)).to_float());
    EXPECT_EQ(t.at(0), expected) << to_string(dtype);
    EXPECT_EQ(t.rounded_to(dtype).at(0), expected) << to_string(dtype);
    EXPECT_EQ(t.rounded_to(dtype).dtype(), DType::float64);
  }
  Tensor ints({3}, DType::int64);
  ints.set(2, 1e15 + 1);
  EXPECT_EQ(ints.at(2), 1e15 + 1);
  EXPECT_EQ(Tensor::from({3}, {1, 2, 3}, DType::int32).values(), (std::vector<double>{1, 2, 3}));
}

TEST(TestingTensor, ShapeViewAndEquality) {
  const Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.nbytes(), 24 * sizeof(double));
  const TensorView v = t.view();
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_TRUE(t.bit_equal(t.to(DType::float32).to(DType::float64)));
  Tensor other = t;
  other.set(5, 5.5);
  EXPECT_FALSE(other.bit_equal(t));
  EXPECT_FALSE(t.bit_equal(t.to(DType::float32)));  // dtype counts
  EXPECT_TRUE(Tensor::copy_of(v).bit_equal(t));
  EXPECT_TRUE(std::isnan(Tensor::nans({2}, DType::bfloat16).at(1)));
  EXPECT_EQ(Tensor::full({2}, 3.0).values(), (std::vector<double>{3, 3}));
}

TEST(TestingTensor, UndefinedAndBadUses) {
  const Tensor none;
  EXPECT_FALSE(none.defined());
  EXPECT_EQ(none.numel(), 0);
  EXPECT_FALSE(none.view().defined());
  EXPECT_FALSE(none.to(DType::float32).defined());
  EXPECT_TRUE(none.bit_equal(Tensor()));
  EXPECT_FALSE(none.bit_equal(Tensor({0}, DType::float64)));
  EXPECT_TRUE(Tensor({0}, DType::float64).defined());
  EXPECT_THROW(Tensor::from({2, 2}, {1, 2, 3}), Error);
  EXPECT_THROW(Tensor({1, 1, 1, 1, 2}, DType::float32).view(), Error);
  EXPECT_THROW(Tensor::nans({2}, DType::int32), Error);
  EXPECT_THROW(Tensor({2}, DType::float32).size(1), Error);
}

// ---- layouts and slices ------------------------------------------------------------------------

TEST(TestingLayout, StridesOfEachLayout) {
  const Tensor x = iota({2, 3, 4, 5});
  struct Expected {
    MemoryLayout layout;
    std::array<std::int64_t, 4> strides;
    std::int64_t storage;
  };
  // [2, 3, 4, 5] stored as [2, 4, 3, 5 (+pad, ×step)], or as [2, 4, 5, 3 (+pad, ×step)].
  for (const Expected& e : {Expected{MemoryLayout::contiguous(), {60, 20, 5, 1}, 120},
                            Expected{MemoryLayout::swap_1_2(4), {60, 5, 15, 1}, 120},
                            Expected{MemoryLayout::swap_1_2(4, 0, 2), {120, 10, 30, 2}, 240},
                            Expected{MemoryLayout::swap_1_2(4, 1), {72, 6, 18, 1}, 144},
                            Expected{MemoryLayout::dim_1_innermost(4, 1), {80, 1, 20, 4}, 160}}) {
    const StridedTensor s(x, DType::float32, e.layout);
    for (int d = 0; d < 4; ++d) EXPECT_EQ(s.view().stride(d), e.strides[std::size_t(d)]) << d;
    EXPECT_EQ(s.storage().numel(), e.storage);
    EXPECT_TRUE(s.gather().bit_equal(x.to(DType::float32)));
    // Every storage element outside the view is a NaN gap.
    std::int64_t gaps = 0;
    for (std::int64_t i = 0; i < s.storage().numel(); ++i) gaps += std::isnan(s.storage().at(i));
    EXPECT_EQ(gaps, e.storage - x.numel());
  }
  EXPECT_EQ(MemoryLayout::swap_1_2(2).order, (std::vector<int>{0, 1}));
  const StridedTensor out =
      StridedTensor::nans({3, 2}, DType::float64, MemoryLayout::swap_1_2(2, 1));
  EXPECT_EQ(out.view().stride(0), 3);
  EXPECT_FALSE(testing::all_finite(out.gather()));
  EXPECT_FALSE(StridedTensor(Tensor(), DType::float32, MemoryLayout::swap_1_2(4)).defined());
  EXPECT_THROW(StridedTensor(x, DType::float32, MemoryLayout{{0, 1, 1, 3}, 0, 1}), Error);
}

TEST(TestingLayout, NarrowTokenAndAlignedCopies) {
  const Tensor x = iota({2, 5, 3}, DType::bfloat16);
  const Tensor third = Tensor::copy_of(testing::token(x.view(), 2));
  EXPECT_EQ(third.shape(), (testing::Shape{2, 1, 3}));
  EXPECT_EQ(third.values(), (std::vector<double>{6, 7, 8, 21, 22, 23}));
  const Tensor cols = Tensor::copy_of(testing::narrow(x.view(), 2, 1, 2));
  EXPECT_EQ(cols.at(0), 1);
  EXPECT_EQ(cols.at(3), 5);
  EXPECT_THROW(testing::narrow(x.view(), 1, 4, 2), Error);
  EXPECT_THROW(testing::narrow(x.view(), 3, 0, 1), Error);
  for (bool aligned : {true, false}) {
    const testing::AlignedCopy copy(x, aligned);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(copy.view.data) % 64 == 0, aligned);
    EXPECT_TRUE(copy.tensor().bit_equal(x));
  }
}

// ---- random inputs -----------------------------------------------------------------------------

TEST(TestingRandom, SeededInputsAndPackedBatches) {
  std::mt19937_64 a(5), b(5);
  EXPECT_TRUE(testing::randn({3, 4}, a, 2.0).bit_equal(testing::randn({3, 4}, b, 2.0)));
  std::mt19937_64 rng(1);
  const Tensor u = testing::uniform({1000}, rng, -2.0, 3.0);
  const Tensor g = testing::log_sigmoid_gates({1000}, rng, 2.0, 1.0);
  for (std::int64_t i = 0; i < 1000; ++i) {
    EXPECT_TRUE(u.at(i) >= -2.0 && u.at(i) < 3.0);
    EXPECT_LT(g.at(i), 0.0);
  }
  EXPECT_EQ(testing::cu_seqlens({3, 0, 2}).values(), (std::vector<double>{0, 3, 3, 5}));
  EXPECT_EQ(testing::cu_seqlens({1}, DType::int64).dtype(), DType::int64);
  EXPECT_THROW(testing::cu_seqlens({-1}), Error);
  const Tensor sums = testing::cumulative_sum(iota({2, 3, 2}), 1);
  EXPECT_EQ(sums.values(), (std::vector<double>{0, 1, 2, 4, 6, 9, 6, 7, 14, 16, 24, 27}));
  const testing::Batch plain = testing::batch_of(2, 7, {});
  EXPECT_EQ(plain.B * 100 + plain.T * 10 + plain.N, 272);
  EXPECT_FALSE(plain.cu_seqlens.defined());
  const testing::Batch packed = testing::batch_of(9, 9, {4, 0, 3});
  EXPECT_EQ(packed.B * 100 + packed.T * 10 + packed.N, 173);
  EXPECT_EQ(packed.cu_seqlens.values(), (std::vector<double>{0, 4, 4, 7}));
}

// ---- error measures ----------------------------------------------------------------------------

TEST(TestingCompare, MeasuresOnKnownValues) {
  const Tensor e = Tensor::from({2}, {3, 4}), a = Tensor::from({2}, {3, 5});
  EXPECT_DOUBLE_EQ(testing::rel_rms(a, e), 1.0 / 5.0);
  EXPECT_EQ(testing::rel_rms(e, e), 0.0);
  EXPECT_DOUBLE_EQ(testing::rel_rms(a, Tensor::zeros({2})), std::sqrt(34.0));
  EXPECT_EQ(testing::rel_rms(Tensor(), Tensor()), 0.0);
  EXPECT_THROW(testing::rel_rms(a, Tensor::zeros({3})), Error);
  EXPECT_THROW(testing::rel_rms(Tensor(), Tensor::zeros({0})), Error);
  EXPECT_EQ(testing::max_abs_diff(a, e), 1.0);
  EXPECT_EQ(testing::dot(a, e), 29.0);
  EXPECT_TRUE(testing::all_finite(a));
  EXPECT_FALSE(testing::all_finite(Tensor::from({2}, {1, -kInf})));
  const testing::WorstElement w =
      testing::worst_element(Tensor::from({3}, {1, 2.5, 3}), Tensor::from({3}, {1, 2, 2.9}), 0.1);
  EXPECT_EQ(w.index, 1);
  EXPECT_DOUBLE_EQ(w.excess, 0.4);
  EXPECT_EQ(testing::worst_element(Tensor::from({1}, {kInf}), Tensor::from({1}, {kInf}), 0).excess,
            0.0);
  const testing::WorstElement nan_worst =
      testing::worst_element(Tensor::from({2}, {1, std::nan("")}), Tensor::from({2}, {1, 5}), 10);
  EXPECT_EQ(nan_worst.index, 1);
  EXPECT_EQ(nan_worst.excess, kInf);
  const Tensor none;
  const testing::NamedTensors x = {{"a", &a}, {"none", &none}}, y = {{"a", &e}, {"none", &none}};
  EXPECT_DOUBLE_EQ(testing::worst_rel_rms(x, y), 0.2);
  EXPECT_THROW(testing::worst_rel_rms(x, {{"b", &e}, {"none", &none}}), Error);
}

// ---- finite differences ------------------------------------------------------------------------

// f(x) = Σ w_i sin(x_i) + (Σ x_i)², whose gradient is w_i cos(x_i) + 2 Σ x.
struct SmoothFunction {
  Tensor x, w;
  double operator()() const {
    double f = 0, sum = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      f += w.at(i) * std::sin(x.at(i));
      sum += x.at(i);
    }
    return f + sum * sum;
  }
  Tensor gradient() const {
    double sum = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) sum += x.at(i);
    Tensor g(x.shape(), DType::float64);
    for (std::int64_t i = 0; i < x.numel(); ++i) g.set(i, w.at(i) * std::cos(x.at(i)) + 2 * sum);
    return g;
  }
};

TEST(TestingFiniteDifferences, MatchAKnownGradient) {
  std::mt19937_64 rng(3);
  SmoothFunction f{testing::randn({3, 4}, rng), testing::randn({3, 4}, rng)};
  const Tensor before = f.x;
  const auto loss = [&] { return f(); };  // f itself would be copied, with its own x
  const Tensor numeric = testing::numerical_gradient(f.x, loss);
  EXPECT_TRUE(f.x.bit_equal(before)) << "x must be restored";
  EXPECT_LT(testing::rel_rms(numeric, f.gradient()), 1e-9);
  const testing::GradientCheck good = testing::check_gradient(f.gradient(), f.x, loss);
  EXPECT_LT(good.rel_rms, 1e-9);
  EXPECT_LT(good.worst_relative_error, 1e-8);
  EXPECT_TRUE(testing::gradient_matches(f.gradient(), f.x, loss, 1e-7, "dx"));
  // The central-difference core on its own: d/dy (y0² + 3 y1) = (2 y0, 3).
  const std::vector<double> core = testing::central_differences(
      2, 1e-4, [](std::int64_t i, double d) { return i == 0 ? (1 + d) * (1 + d) : 3 * d; });
  EXPECT_NEAR(core[0], 2.0, 1e-10);
  EXPECT_NEAR(core[1], 3.0, 1e-10);
}

// A gradient wrong in one element is found, and the check names that element.
TEST(TestingFiniteDifferences, FindTheWrongElement) {
  std::mt19937_64 rng(4);
  SmoothFunction f{testing::randn({2, 5}, rng), testing::randn({2, 5}, rng)};
  const auto loss = [&] { return f(); };
  Tensor wrong = f.gradient();
  wrong.set(7, wrong.at(7) + 1e-3);
  const testing::GradientCheck check = testing::check_gradient(wrong, f.x, loss);
  EXPECT_EQ(check.worst_index, 7);
  EXPECT_GT(check.rel_rms, 1e-5);
  EXPECT_NE(check.where().find("element 7 of [2, 5]"), std::string::npos) << check.where();
  const ::testing::AssertionResult verdict =
      testing::gradient_matches(wrong, f.x, loss, 1e-7, "dx");
  EXPECT_FALSE(verdict);
  EXPECT_NE(std::string(verdict.message()).find("element 7"), std::string::npos)
      << verdict.message();
  wrong.set(3, std::nan(""));
  EXPECT_FALSE(testing::gradient_matches(wrong, f.x, loss, 1.0, "dx"));
}

TEST(TestingFiniteDifferences, InfiniteInputsAndBadArguments) {
  Tensor x = Tensor::from({3}, {-kInf, 0.5, -1.0});
  const auto f = [&] {  // exp(x0) + x1² + x2³: finite at x0 = −inf, where exp has no slope
    return std::exp(x.at(0)) + x.at(1) * x.at(1) + x.at(2) * x.at(2) * x.at(2);
  };
  testing::FiniteDifferenceOptions options;
  options.zero_at_infinite_inputs = true;
  const Tensor g = testing::numerical_gradient(x, f, options);
  EXPECT_EQ(g.at(0), 0.0);
  EXPECT_NEAR(g.at(1), 1.0, 1e-8);
  EXPECT_NEAR(g.at(2), 3.0, 1e-8);
  Tensor single = x.to(DType::float32);
  EXPECT_THROW(testing::numerical_gradient(single, f), Error);
  options.step = 0;
  EXPECT_THROW(testing::numerical_gradient(x, f, options), Error);
}

// ---- device staging ----------------------------------------------------------------------------

TEST(TestingDevice, StagingOnTheEmulatedDevice) {
  testing::OnDevice on(Device::emulated);
  const Tensor x = iota({2, 3, 4}, DType::float32);
  const TensorView in = on.in(x);
  EXPECT_EQ(in.device, Device::emulated);
  EXPECT_NE(in.data, x.data());
  EXPECT_TRUE(on.to_host(in).bit_equal(x));
  const TensorView strided = on.in_strided(x);
  EXPECT_EQ(strided.stride(2), 2);
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_TRUE(on.to_host(strided).bit_equal(x));
  const TensorView out = on.out({2, 2}, DType::float64);
  EXPECT_FALSE(testing::all_finite(on.to_host(out)));
  EXPECT_EQ(on.to_host(on.out({3}, DType::int32)).values(), (std::vector<double>{0, 0, 0}));
  EXPECT_FALSE(on.in(Tensor()).defined());
  EXPECT_THROW(on.to_host(x.view()), Error);
  on.synchronize();
  const testing::DeviceTensor d(x, Device::cpu);
  EXPECT_TRUE(d.to_host().bit_equal(x));
  EXPECT_EQ(d.view().stride(0), 12);
}

// ---- dense matrix exponential ------------------------------------------------------------------

// exp(θ J) is the rotation by θ; exp of a diagonal is the diagonal of exponentials; exp(0) = I;
// exp(A) exp(−A) = I for a general A; a matrix that is not square is refused.
TEST(TestingMatrixExp, KnownExponentials) {
  const double theta = 2.3;
  Eigen::MatrixXd J(2, 2), R(2, 2);
  J << 0, -1, 1, 0;
  R << std::cos(theta), -std::sin(theta), std::sin(theta), std::cos(theta);
  EXPECT_LE((testing::matrix_exp(theta * J) - R).cwiseAbs().maxCoeff(), 1e-14);
  const Eigen::VectorXd d = Eigen::VectorXd::LinSpaced(5, -3.0, 4.0);
  const Eigen::MatrixXd expected = d.array().exp().matrix().asDiagonal();
  EXPECT_LE((testing::matrix_exp(d.asDiagonal().toDenseMatrix()) - expected).norm(),
            1e-13 * expected.norm());
  EXPECT_EQ(testing::matrix_exp(Eigen::MatrixXd::Zero(3, 3)), Eigen::MatrixXd::Identity(3, 3));
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  Eigen::MatrixXd A(6, 6);
  for (Eigen::Index i = 0; i < A.size(); ++i) A(i) = normal(rng);
  EXPECT_LE((testing::matrix_exp(A) * testing::matrix_exp(-A) - Eigen::MatrixXd::Identity(6, 6))
                .cwiseAbs()
                .maxCoeff(),
            1e-12);
  try {
    testing::matrix_exp(Eigen::MatrixXd::Zero(2, 3));
    ADD_FAILURE() << "a 2×3 matrix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a' must be square, got 2×3"), std::string::npos)
        << e.what();
  }
}

// ---- GoogleTest adapters -----------------------------------------------------------------------

TEST(TestingAdapters, Verdicts) {
  const Tensor e = Tensor::from({3}, {1, 2, 3});
  EXPECT_TRUE(testing::close_in_rel_rms(e, e, 0, "x"));
  EXPECT_TRUE(testing::close_in_rel_rms(Tensor(), Tensor(), 0, "x"));
  const Tensor a = Tensor::from({3}, {1, 2, 3.1});
  const ::testing::AssertionResult far = testing::close_in_rel_rms(a, e, 1e-3, "dq");
  EXPECT_FALSE(far);
  EXPECT_NE(std::string(far.message()).find("dq: relative RMS error"), std::string::npos)
      << far.message();
  EXPECT_NE(std::string(far.message()).find("element 2"), std::string::npos) << far.message();
  EXPECT_TRUE(testing::close_in_rel_rms(a, e, 0.03, "dq"));
  EXPECT_FALSE(testing::close_in_rel_rms(Tensor::from({3}, {1, std::nan(""), 3}), e, 1, "x"));
  EXPECT_FALSE(testing::close_in_rel_rms(Tensor::from({2}, {1, 2}), e, 1, "x"));
  EXPECT_FALSE(testing::close_in_rel_rms(Tensor(), e, 1, "x"));
  EXPECT_TRUE(testing::all_near(a, e, 0.1 + 1e-12, 0, "x"));
  EXPECT_FALSE(testing::all_near(a, e, 0.05, 0, "x"));
  EXPECT_TRUE(testing::all_near(a, e, 0.0, 0.034, "x"));
}

}  // namespace
}  // namespace phasor
