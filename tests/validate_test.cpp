// The value checks on a GPU (cuda/common/validate.cu) against the host scan (common/check.cpp):
// the same verdict, so the same phasor::Error text, for every kind of failure — cu_seqlens offsets
// (first not 0, a decrease, a last offset other than T, a decrease at the last offset), log gates
// (positive, NaN) and finite values (inf, NaN), in every floating dtype, strided views, several
// checked tensors (the first failing one wins), large tensors (the failing element found by many
// threads at once), and calls that pass. Also the metadata check every view gets before anything
// indexes it (common/check.h: check_view), found by tests/fuzz/op_args_fuzz: a rank above 4,
// negative sizes, element counts or offsets beyond int64 are refused with a phasor::Error.
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "common/dispatch.h"
#include "phasor/forgetting_attn.h"
#include "phasor/gla.h"
#include "phasor/rotary.h"
#include "phasor/structured_rotation.h"
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

// ---- metadata of malformed views (tests/fuzz/regressions/op_args_fuzz)
// ----------------------------

// The message of gla_forward on float32 views q, k, v, g [1, 2, 1, 4] and o [1, 2, 1, 4] after
// `edit` changes q, or "" if the call passes.
template <class Edit>
std::string gla_message(Edit&& edit) {
  std::vector<float> q(8, 0.5f), g(8, -0.25f), o(8);
  GlaParams p;
  p.q = TensorView::of(q.data(), {1, 2, 1, 4});
  p.k = p.v = p.q;
  p.g = TensorView::of(g.data(), {1, 2, 1, 4});
  edit(p.q);
  try {
    gla_forward(p, Impl::recurrent, TensorView::of(o.data(), {1, 2, 1, 4}));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ViewMetadata, MalformedViewsAreRefusedBeforeAnyIndexing) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(gla_message([](TensorView&) {}), "");
  EXPECT_EQ(gla_message([](TensorView& q) { q.rank = 5; }),
            "fused_recurrent_gla: argument 'q': expected a tensor of rank <= 4, got rank 5");
  EXPECT_EQ(gla_message([](TensorView& q) { q.sizes[1] = -2; }),
            "fused_recurrent_gla: argument 'q': expected non-negative sizes, got shape "
            "[1, -2, 1, 4]");
  // 2^32 · 2^32 elements: the count overflows (the memory behind it is never reached); and
  // (2^60 + 1) · 4, within int64 but above the 2^62 that leaves the kernels' rounding room.
  EXPECT_EQ(gla_message([](TensorView& q) { q.sizes[1] = q.sizes[2] = std::int64_t{1} << 32; }),
            "fused_recurrent_gla: argument 'q': expected at most 2^62 elements, got shape "
            "[1, 4294967296, 4294967296, 4]");
  EXPECT_EQ(gla_message([](TensorView& q) { q.sizes[1] = (std::int64_t{1} << 60) + 1; }),
            "fused_recurrent_gla: argument 'q': expected at most 2^62 elements, got shape "
            "[1, 1152921504606846977, 1, 4]");
  // (T − 1)·stride overflows; and an offset that fits in elements but not in bytes (·4).
  const std::string offsets =
      "fused_recurrent_gla: argument 'q': expected sizes and strides "
      "whose element and byte offsets fit in int64, got shape ";
  EXPECT_EQ(gla_message([](TensorView& q) { q.sizes[1] = 3, q.strides[1] = kMax / 2 + 1; }),
            offsets + "[1, 3, 1, 4] with strides [8, 4611686018427387904, 4, 1]");
  EXPECT_EQ(gla_message([](TensorView& q) { q.strides[1] = std::int64_t{1} << 62; }),
            offsets + "[1, 2, 1, 4] with strides [8, 4611686018427387904, 4, 1]");
  EXPECT_EQ(gla_message([](TensorView& q) { q.strides[3] = -(std::int64_t{1} << 62); }),
            offsets + "[1, 2, 1, 4] with strides [8, 4, 4, -4611686018427387904]");
  // cu_seqlens gets the same check.
  std::int32_t cu[2] = {0, 2};
  GlaParams p;
  std::vector<float> x(8, 0.0f);
  p.q = p.k = p.v = p.g = TensorView::of(x.data(), {1, 2, 1, 4});
  p.cu_seqlens = TensorView::strided(cu, DType::int32, {2}, {kMax});
  try {
    gla_forward(p, Impl::chunk, p.q);
    ADD_FAILURE() << "an overflowing cu_seqlens accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'cu_seqlens': expected sizes and strides"),
              std::string::npos)
        << e.what();
  }
}

// An empty view (a size 0) with a null pointer has no element to index: accepted, nothing written.
// Its other sizes still multiply to B·T·H… in the kernels, so their product must fit in int64.
TEST(ViewMetadata, EmptyViewsPassUnlessTheirOtherSizesOverflow) {
  auto apply = [](std::int64_t n) {
    const TensorView x = TensorView::strided(nullptr, DType::float32, {n, n, 0, 2}, {0, 0, 0, 1});
    const TensorView theta =
        TensorView::strided(nullptr, DType::float32, {n, n, 0, 1}, {0, 0, 0, 1});
    try {
      apply_rotary_forward(x, theta, RotaryLayout::half_split, Impl::chunk, x);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(apply(std::int64_t{1} << 30), "");
  EXPECT_EQ(apply(std::int64_t{1} << 40),
            "apply_rotary: argument 'x': expected sizes whose product without the zeros is at "
            "most 2^62, got shape [1099511627776, 1099511627776, 0, 2]");
}

// ---- scalar arguments at the edges (tests/fuzz/regressions/op_args_fuzz)
// ---------------------------

// A window far longer than any sequence is no window: the recurrent kernel and the decoding cache
// keep a ring of the last window − 1 tokens, which used to be allocated up front (std::bad_alloc
// for 10^12); it now grows with the tokens seen.
TEST(EdgeArguments, HugeWindowIsNoWindow) {
  constexpr std::int64_t T = 5, K = 4, V = 3;
  std::vector<float> q(T * K), k(T * K), v(T * V), g(T, -0.1f), o(T * V), o_window(T * V),
      o_step(V);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.2f * static_cast<float>(i % 5) - 0.4f;
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.3f * static_cast<float>(i % 3) - 0.2f;
  ForgettingAttnParams p;
  p.q = TensorView::of(q.data(), {1, T, 1, K});
  p.k = TensorView::of(k.data(), {1, T, 1, K});
  p.v = TensorView::of(v.data(), {1, T, 1, V});
  p.g = TensorView::of(g.data(), {1, T, 1});
  forgetting_attn_forward(p, Impl::recurrent, TensorView::of(o.data(), {1, T, 1, V}));
  p.window_size = std::int64_t{1000000000000};
  forgetting_attn_forward(p, Impl::recurrent, TensorView::of(o_window.data(), {1, T, 1, V}));
  EXPECT_EQ(o_window, o);
  ForgettingAttnCache cache(1, 1, 1, K, V, std::int64_t{1000000000000});
  for (std::int64_t t = 0; t < T; ++t) {
    cache.step(TensorView::of(q.data() + t * K, {1, 1, 1, K}),
               TensorView::of(k.data() + t * K, {1, 1, 1, K}),
               TensorView::of(v.data() + t * V, {1, 1, 1, V}),
               TensorView::of(g.data() + t, {1, 1, 1}),
               TensorView::of(o_step.data(), {1, 1, 1, V}));
    for (std::int64_t c = 0; c < V; ++c) EXPECT_NEAR(o_step[c], o[t * V + c], 1e-6) << t;
  }
}

// Positions offset + t must not overflow: offsets beyond 2^53 (not exact in float64 anyway) are
// refused by name.
TEST(EdgeArguments, RopeOffsetBeyond2To53IsRefused) {
  std::vector<float> theta(4);
  RopeAnglesParams p;
  p.B = 1, p.T = 2, p.head_dim = 4;
  p.offset = std::int64_t{1} << 53;
  EXPECT_NO_THROW(rope_angles(p, Impl::chunk, TensorView::of(theta.data(), {1, 2, 2})));
  p.offset = std::numeric_limits<std::int64_t>::max() - 1;
  try {
    rope_angles(p, Impl::chunk, TensorView::of(theta.data(), {1, 2, 2}));
    ADD_FAILURE() << "an offset of 2^63 − 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'offset': expected offset in [0, 2^53]"),
              std::string::npos)
        << e.what();
  }
}

// m planes need 2m ≤ K: with m = 2^62 (a broadcast coefficients view), 2m overflowed.
TEST(EdgeArguments, StructuredRotationPlaneCountWithoutOverflow) {
  std::vector<float> x(4), basis(16), positions(1), coefficients(1), y(4);
  StructuredRotationParams p;
  p.x = TensorView::of(x.data(), {1, 1, 1, 4});
  p.positions = TensorView::of(positions.data(), {1, 1, 1, 1});
  p.basis = TensorView::of(basis.data(), {4, 4});
  p.coefficients =
      TensorView::strided(coefficients.data(), DType::float32, {1, std::int64_t{1} << 62}, {0, 0});
  try {
    structured_rotation_forward(p, Impl::chunk, TensorView::of(y.data(), {1, 1, 1, 4}));
    ADD_FAILURE() << "m = 2^62 planes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'coefficients': expected at most K/2 planes"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace phasor
