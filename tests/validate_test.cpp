// The value checks on a GPU (cuda/common/validate.cu) against the host scan (common/check.cpp):
// the same verdict, so the same phasor::Error text, for every kind of failure — cu_seqlens offsets
// (first not 0, a decrease, a last offset other than T, a decrease at the last offset), log gates
// (positive, NaN) and finite values (inf, NaN), in every floating dtype, strided views, several
// checked tensors (the first failing one wins), large tensors (the failing element found by many
// threads at once), and calls that pass.
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "common/dispatch.h"
#include "phasor/testing/gpu_gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The message of the host scan, or "" when it passes.
std::string host_message(const detail::ValueChecks& checks) {
  try {
    detail::check_values_on_host("op", checks);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string gpu_message(const detail::ValueChecks& checks, Device device) {
  try {
    detail::check_values_on_gpu("op", device, checks);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The checks of `host` tensors, on the host and (copied) on `device`; both must say the same.
struct Case {
  Tensor cu;  // undefined: no cu_seqlens
  std::int64_t T = 0;
  std::vector<std::tuple<const char*, Tensor, detail::ValueRule>> items;
};

void expect_same_verdict(const Case& c, Device device, bool expect_failure) {
  detail::ValueChecks host, gpu;
  OnDevice on(device);
  if (c.cu.defined()) {
    host.sequences = detail::sequences("op", c.cu.view(), 1, c.T);
    TensorView cu = on.in(c.cu);
    gpu.sequences = detail::sequences("op", cu, 1, c.T, device);
  }
  for (const auto& [name, tensor, rule] : c.items) {
    host.add(name, tensor.view(), rule);
    gpu.add(name, on.in(tensor), rule);
  }
  const std::string expected = host_message(host);
  EXPECT_EQ(!expected.empty(), expect_failure) << expected;
  EXPECT_EQ(gpu_message(gpu, device), expected);
}

class ValueChecksOnGpu : public ::testing::TestWithParam<Device> {};

TEST_P(ValueChecksOnGpu, CuSeqlensOffsets) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (DType dtype : {DType::int32, DType::int64}) {
    auto cu = [&](std::vector<double> v) {
      return Tensor::from({static_cast<std::int64_t>(v.size())}, v, dtype);
    };
    expect_same_verdict({cu({0, 3, 3, 7}), 7, {}}, device, false);
    expect_same_verdict({cu({1, 3, 7}), 7, {}}, device, true);        // first not 0
    expect_same_verdict({cu({0, 5, 3, 7}), 7, {}}, device, true);     // a decrease
    expect_same_verdict({cu({0, 3, 9, 2, 1}), 1, {}}, device, true);  // two: the first wins
    expect_same_verdict({cu({0, 3, 6}), 7, {}}, device, true);        // last ≠ T
    expect_same_verdict({cu({0, 5, 4}), 5, {}}, device, true);        // decrease at the last
    expect_same_verdict({cu({2, 1, 0}), 0, {}}, device, true);        // all three kinds
  }
  // Many sequences: the failing offset is found among thousands of threads.
  std::vector<double> offsets(5001);
  for (std::size_t i = 0; i < offsets.size(); ++i) offsets[i] = static_cast<double>(2 * i);
  offsets[3717] = 1;
  offsets[4200] = 0;
  expect_same_verdict({Tensor::from({5001}, offsets, DType::int64), 10000, {}}, device, true);
}

TEST_P(ValueChecksOnGpu, GatesAndFiniteValuesInEveryDtype) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (DType dtype : testing::gpu_test_dtypes()) {
    SCOPED_TRACE(to_string(dtype));
    std::mt19937_64 rng(3);
    Tensor g = testing::log_sigmoid_gates({2, 5, 3, 4}, rng, 2.0, 1.0, dtype);
    g.set(17, -kInf);  // allowed
    expect_same_verdict({{}, 0, {{"g", g, detail::ValueRule::log_gate}}}, device, false);
    Tensor positive = g;
    positive.set(93, 0.5);
    positive.set(41, 2.0);  // earlier: this one is reported
    expect_same_verdict({{}, 0, {{"g", positive, detail::ValueRule::log_gate}}}, device, true);
    Tensor nan = g;
    nan.set(7, std::nan(""));
    expect_same_verdict({{}, 0, {{"g", nan, detail::ValueRule::log_gate}}}, device, true);
    Tensor slopes = testing::randn({1, 6, 2}, rng, 1.0, dtype);
    expect_same_verdict({{}, 0, {{"s", slopes, detail::ValueRule::finite}}}, device, false);
    slopes.set(9, -kInf);
    expect_same_verdict({{}, 0, {{"s", slopes, detail::ValueRule::finite}}}, device, true);
    // Two tensors: the first failing one is reported, whichever has the smaller index.
    expect_same_verdict({{},
                         0,
                         {{"g", g, detail::ValueRule::log_gate},
                          {"s", slopes, detail::ValueRule::finite},
                          {"h", positive, detail::ValueRule::log_gate}}},
                        device, true);
  }
}

TEST_P(ValueChecksOnGpu, StridedLargeAndEmptyTensors) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  // A transposed view: the element reported is the first in row-major order of the view.
  std::vector<double> memory = {-1, 5, -2, -3, -4, 0.5};
  Tensor base = Tensor::from({6}, memory);
  detail::ValueChecks host, gpu;
  OnDevice on(device);
  TensorView on_device = on.in(base);
  TensorView transposed_host = base.view(), transposed = on_device;
  for (TensorView* v : {&transposed_host, &transposed}) {
    v->rank = 2;
    v->sizes = {3, 2, 0, 0};
    v->strides = {1, 3, 0, 0};
  }
  host.add("g", transposed_host, detail::ValueRule::log_gate);
  gpu.add("g", transposed, detail::ValueRule::log_gate);
  EXPECT_NE(host_message(host).find("g[1, 0] = 5"), std::string::npos) << host_message(host);
  EXPECT_EQ(gpu_message(gpu, device), host_message(host));
  // A large tensor: many blocks, several failing elements; the smallest index wins.
  std::mt19937_64 rng(9);
  Tensor big = testing::log_sigmoid_gates({1, 300, 4, 64}, rng);
  big.set(61234, 0.25);
  big.set(12345, 1.5);
  big.set(70000, 3.0);
  expect_same_verdict({{}, 0, {{"g", big, detail::ValueRule::log_gate}}}, device, true);
  // An empty tensor (a batch of no tokens) passes.
  expect_same_verdict(
      {{}, 0, {{"g", Tensor({1, 0, 4}, DType::float32), detail::ValueRule::log_gate}}}, device,
      false);
}

INSTANTIATE_TEST_SUITE_P(Devices, ValueChecksOnGpu, ::testing::ValuesIn(testing::gpu_devices()),
                         testing::device_param_name);

}  // namespace
}  // namespace phasor
