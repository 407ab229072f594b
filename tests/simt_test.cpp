// The portability header and the emulated GPU: the test kernels of simt_kernels.cu against plain
// loops on Device::emulated (and on Device::cuda when there is a GPU; skipped otherwise), planted
// bugs that the emulator must report, and schedule perturbation.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "phasor/device.h"
#include "phasor/emulator.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/device.h"
#include "simt_kernels.h"

namespace phasor {
// Test names and messages show the device by name.
void PrintTo(Device device, std::ostream* os) {
  *os << to_string(device);
}
}  // namespace phasor

namespace {

using phasor::Device;
using phasor::DType;
using phasor::TensorView;
using phasor::emulator::Order;
using phasor::emulator::ScopedOptions;
using phasor::simt::FaultKind;
using phasor::simt::KernelFault;
using phasor::testing::Tensor;

// Runs a test kernel on the device's build of simt_kernels.cu.
#if PHASOR_HAS_CUDA
#define RUN(device, kernel, ...)                                           \
  ((device) == Device::cuda ? phasor::cuda::simt_test::kernel(__VA_ARGS__) \
                            : phasor::emulated::simt_test::kernel(__VA_ARGS__))
#else
#define RUN(device, kernel, ...) phasor::emulated::simt_test::kernel(__VA_ARGS__)
#endif

// Memory on a device, filled from / read back to host vectors.
template <class T>
class Buffer {
 public:
  Buffer(Device device, const std::vector<T>& host) : Buffer(device, host.size()) {
    phasor::copy_bytes(data_, device_, host.data(), Device::cpu, host.size() * sizeof(T));
  }
  // Zero-filled (atomics accumulate into it; outputs start defined on every device).
  Buffer(Device device, std::size_t count)
      : device_(device),
        count_(count),
        data_(static_cast<T*>(phasor::device_allocate(device, count * sizeof(T)))) {
    const std::vector<T> zeros(count, T());
    phasor::copy_bytes(data_, device_, zeros.data(), Device::cpu, count * sizeof(T));
  }
  ~Buffer() { phasor::device_free(device_, data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* get() const { return data_; }
  std::vector<T> host() const {
    std::vector<T> h(count_);
    phasor::copy_bytes(h.data(), Device::cpu, data_, device_, count_ * sizeof(T));
    return h;
  }

 private:
  Device device_;
  std::size_t count_;
  T* data_;
};

std::vector<int> random_ints(std::size_t n, int lo, int hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<int> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

class Simt : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (device() == Device::cuda) {
      if (!phasor::cuda_is_built()) GTEST_SKIP() << "this build of phasor has no CUDA backend";
      if (phasor::cuda_device_count() == 0)
        GTEST_SKIP() << "no CUDA device here (cuda_device_count() == 0)";
    }
  }
  Device device() const { return GetParam(); }
  bool emulated() const { return device() == Device::emulated; }
};

// --- shuffles and votes --------------------------------------------------------------------------
// CUDA's documented semantics, lane by lane (the segment of `width` lanes that a lane is in).
int shuffle_source(int op, int lane, int width, int arg) {
  const int first = lane / width * width, last = first + width - 1;
  switch (op) {
    case 0:  // idx: lane `arg` modulo width of the own segment
      return first + arg % width;
    case 1:  // up
      return lane - arg >= first ? lane - arg : lane;
    case 2:  // down
      return lane + arg <= last ? lane + arg : lane;
    default:  // xor (arg < width here)
      return lane ^ arg;
  }
}

template <class T, class Run>
void check_shuffles(Device device, Run run, const std::vector<T>& values) {
  const int n = static_cast<int>(values.size());
  struct Case {
    int width, arg;
    bool half_masks;
  };
  for (const Case c :
       {Case{32, 5, false}, Case{32, 1, false}, Case{32, 31, false}, Case{16, 3, false},
        Case{8, 2, false}, Case{16, 7, true}, Case{8, 1, true}, Case{4, 3, true}}) {
    SCOPED_TRACE("width " + std::to_string(c.width) + ", lane argument " + std::to_string(c.arg) +
                 (c.half_masks ? ", half-warp masks" : ", full mask"));
    Buffer<T> in(device, values), out(device, 4 * values.size());
    run(in.get(), out.get(), n, c.width, c.arg, c.half_masks);
    const std::vector<T> got = out.host();
    for (int op = 0; op < 4; ++op)
      for (int i = 0; i < n; ++i) {
        const int lane = i % 32, warp_base = i - lane;
        const T expected = values[warp_base + shuffle_source(op, lane, c.width, c.arg)];
        ASSERT_EQ(got[op * n + i], expected)
            << "op " << op << " (idx, up, down, xor), thread " << i;
      }
  }
}

TEST_P(Simt, ShufflesMatchCudaSemantics) {
  const Device d = device();
  const std::vector<int> ints = random_ints(128, -1000000, 1000000, 1);
  check_shuffles<int>(
      d, [&](auto... a) { RUN(d, shuffle_int, a...); }, ints);
  std::vector<double> doubles(128);
  for (int i = 0; i < 128; ++i) doubles[i] = std::ldexp(1.0 + i / 7.0, i - 60);
  check_shuffles<double>(
      d, [&](auto... a) { RUN(d, shuffle_double, a...); }, doubles);
  std::vector<long long> longs(128);
  for (int i = 0; i < 128; ++i) longs[i] = (static_cast<long long>(i) << 40) - 3 * i;
  check_shuffles<long long>(
      d, [&](auto... a) { RUN(d, shuffle_int64, a...); }, longs);
}

TEST_P(Simt, VotesMatchLoops) {
  const int n = 128;
  for (const bool half : {false, true}) {
    SCOPED_TRACE(half ? "half-warp masks" : "full mask");
    for (const int density : {0, 1, 2, 10}) {  // none, all, half, most set
      std::vector<int> p(n);
      for (int i = 0; i < n; ++i)
        p[i] = density == 0 ? 0 : density == 1 ? 7 : (i * 37 % density) != 0;
      if (density == 10) p[33] = 0;
      Buffer<int> in(device(), p);
      Buffer<unsigned> out(device(), 3 * n);
      RUN(device(), votes, in.get(), out.get(), n, half);
      const std::vector<unsigned> got = out.host();
      for (int i = 0; i < n; ++i) {
        const int lane = i % 32, base = i - lane;
        const int first = half ? (lane < 16 ? 0 : 16) : 0, width = half ? 16 : 32;
        unsigned ballot = 0;
        for (int u = first; u < first + width; ++u)
          if (p[base + u]) ballot |= 1u << u;
        const unsigned mask = width == 32 ? ~0u : 0xffffu << first;
        ASSERT_EQ(got[i], ballot) << "ballot, thread " << i;
        ASSERT_EQ(got[n + i], ballot == mask ? 1u : 0u) << "all, thread " << i;
        ASSERT_EQ(got[2 * n + i], ballot != 0 ? 1u : 0u) << "any, thread " << i;
      }
    }
  }
}

// --- atomics -------------------------------------------------------------------------------------
TEST_P(Simt, AtomicsMatchLoops) {
  const int n = 256, slot_count = 37, bins = 13;
  const std::vector<int> values = random_ints(n, 0, 5000, 2);
  Buffer<int> in(device(), values);
  Buffer<int> ints(device(), std::vector<int>{0, INT_MIN, INT_MAX, 0});
  Buffer<unsigned> u(device(), 1);
  Buffer<unsigned long long> ull(device(), 1);
  Buffer<float> f(device(), 1);
  Buffer<double> d(device(), 1);
  Buffer<int> slots(device(), slot_count), histogram(device(), bins);
  RUN(device(), atomics, in.get(), n, ints.get(), u.get(), ull.get(), f.get(), d.get(), slots.get(),
      slot_count, histogram.get(), bins);

  long long sum = 0;
  std::vector<int> expected_histogram(bins, 0);
  std::set<int> keys;
  for (int v : values) {
    sum += v;
    ++expected_histogram[v % bins];
    keys.insert(v % slot_count);
  }
  const std::vector<int> got = ints.host();
  EXPECT_EQ(got[0], sum);
  EXPECT_EQ(got[1], *std::max_element(values.begin(), values.end()));
  EXPECT_EQ(got[2], *std::min_element(values.begin(), values.end()));
  EXPECT_EQ(got[3], static_cast<int>(keys.size())) << "one CAS winner per key";
  EXPECT_EQ(u.host()[0], static_cast<unsigned>(sum));
  EXPECT_EQ(ull.host()[0], static_cast<unsigned long long>(sum) << 20);
  EXPECT_EQ(f.host()[0], static_cast<float>(sum));  // integers below 2^24: exact in any order
  EXPECT_EQ(d.host()[0], 0.5 * static_cast<double>(sum));
  EXPECT_EQ(histogram.host(), expected_histogram);
  const std::vector<int> winners = slots.host();
  for (int key = 0; key < slot_count; ++key) {
    if (!keys.count(key)) {
      EXPECT_EQ(winners[key], 0) << "slot " << key;
    } else {
      ASSERT_GE(winners[key], 1);
      EXPECT_EQ(values[winners[key] - 1] % slot_count, key) << "slot " << key;
    }
  }
}

// --- CUB primitives ------------------------------------------------------------------------------
TEST_P(Simt, BlockReduceMatchesLoops) {
  const int blocks = 3, num_valid = 77;
  std::vector<float> values(512 * blocks);
  const std::vector<int> ints = random_ints(values.size(), -50, 50, 3);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(ints[i]);
  Buffer<float> in(device(), values), out(device(), 5 * blocks);
  RUN(device(), block_reduce, in.get(), out.get(), blocks, num_valid);
  const std::vector<float> got = out.host();
  for (int b = 0; b < blocks; ++b) {
    const float* x = &values[512 * b];
    // Small integers: every order of summation gives the exact sum.
    EXPECT_EQ(got[5 * b], std::accumulate(x, x + 128, 0.0f)) << "Sum, block " << b;
    EXPECT_EQ(got[5 * b + 1], *std::max_element(x, x + 128)) << "Reduce(max), block " << b;
    EXPECT_EQ(got[5 * b + 2], std::accumulate(x, x + num_valid, 0.0f)) << "Sum(num_valid)";
    EXPECT_EQ(got[5 * b + 3], std::accumulate(x, x + 512, 0.0f)) << "Sum(items), block " << b;
    // CUB leaves the result undefined outside thread 0; the emulator poisons it.
    if (emulated()) {
      EXPECT_TRUE(std::isnan(got[5 * b + 4])) << "thread 1's Sum";
    }
  }
}

TEST_P(Simt, BlockScanMatchesLoops) {
  const int n = 128;
  const std::vector<int> x = random_ints(512, -100, 100, 4);
  Buffer<int> in(device(), x), out(device(), 13 * n);
  RUN(device(), block_scan, in.get(), out.get());
  const std::vector<int> got = out.host();
  int sum = 0, max = INT_MIN, excl_max = -1000;
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(got[n + t], sum) << "ExclusiveSum " << t;
    EXPECT_EQ(got[3 * n + t], excl_max) << "ExclusiveScan(-1000, max) " << t;
    sum += x[t];
    max = std::max(max, x[t]);
    excl_max = std::max(excl_max, x[t]);
    EXPECT_EQ(got[t], sum) << "InclusiveSum " << t;
    EXPECT_EQ(got[2 * n + t], max) << "InclusiveScan(max) " << t;
  }
  for (int t = 0; t < n; ++t) EXPECT_EQ(got[4 * n + t], sum) << "aggregate seen by " << t;
  int items = 0;
  for (int i = 0; i < 512; ++i) {
    EXPECT_EQ(got[9 * n + i], items) << "ExclusiveSum of items, item " << i;
    items += x[i];
    EXPECT_EQ(got[5 * n + i], items) << "InclusiveSum of items, item " << i;
  }
}

TEST_P(Simt, BlockScanPrefixCallbackCarriesAcrossTiles) {
  const int n = 3 * 512;
  const std::vector<int> x = random_ints(n, -1000, 1000, 5);
  Buffer<int> in(device(), x), inclusive(device(), n), exclusive(device(), n);
  RUN(device(), scan_tiles, in.get(), inclusive.get(), exclusive.get(), n);
  const std::vector<int> incl = inclusive.host(), excl = exclusive.host();
  int sum = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(excl[i], sum) << "exclusive, item " << i;
    sum += x[i];
    ASSERT_EQ(incl[i], sum) << "inclusive, item " << i;
  }
}

TEST_P(Simt, WarpPrimitivesMatchLoops) {
  const int n = 64;
  const std::vector<int> x = random_ints(n, -500, 500, 6);
  Buffer<int> in(device(), x), out(device(), 9 * n);
  RUN(device(), warp_primitives, in.get(), out.get());
  const std::vector<int> got = out.host();
  const int poison = static_cast<int>(0xcdcdcdcdu);
  for (int w = 0; w < 2; ++w) {
    const int* v = &x[32 * w];
    EXPECT_EQ(got[32 * w], std::accumulate(v, v + 32, 0)) << "WarpReduce::Sum, warp " << w;
    EXPECT_EQ(got[n + 32 * w], *std::max_element(v, v + 32)) << "Reduce(max)";
    EXPECT_EQ(got[2 * n + 32 * w], std::accumulate(v, v + 20, 0)) << "Sum(20 valid)";
    if (emulated()) {
      EXPECT_EQ(got[32 * w + 1], poison) << "lane 1's Sum is undefined (poisoned)";
    }
    int sum = 0, max = INT_MIN, excl = 100;
    for (int l = 0; l < 32; ++l) {
      const int t = 32 * w + l;
      EXPECT_EQ(got[4 * n + t], sum) << "ExclusiveSum, lane " << l;
      EXPECT_EQ(got[6 * n + t], excl) << "ExclusiveScan(100, +), lane " << l;
      sum += v[l];
      excl += v[l];
      max = std::max(max, v[l]);
      EXPECT_EQ(got[3 * n + t], sum) << "InclusiveSum, lane " << l;
      EXPECT_EQ(got[5 * n + t], max) << "InclusiveScan(max), lane " << l;
    }
  }
  for (int g = 0; g < 8; ++g) {
    const int* v = &x[8 * g];
    EXPECT_EQ(got[7 * n + 8 * g], std::accumulate(v, v + 8, 0)) << "WarpReduce<8>, group " << g;
    int sum = 0;
    for (int l = 0; l < 8; ++l) {
      sum += v[l];
      EXPECT_EQ(got[8 * n + 8 * g + l], sum) << "WarpScan<8>, group " << g << ", lane " << l;
    }
  }
}

// --- tensor cores --------------------------------------------------------------------------------
// simt::mma_sync (m16n8k16, bfloat16 and float16, float accumulation) against a plain loop over
// the same rounded operands, with the fragments loaded by the PTX ISA's formulas written out and
// by mma.h's mma_a_row & co; a kernel that loads B with the wrong layout gets a wrong product.
TEST_P(Simt, TensorCoreMmaMatchesLoops) {
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> a(256), b(128), c(128);
  for (auto* v : {&a, &b, &c})
    for (float& x : *v) x = normal(rng);
  for (bool half : {false, true}) {
    const auto round = [&](float x) {
      return half ? phasor::float16::from_float(x).to_float()
                  : phasor::bfloat16::from_float(x).to_float();
    };
    std::vector<double> expected(128);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double sum = c[static_cast<std::size_t>(i * 8 + j)];
        for (int k = 0; k < 16; ++k)
          sum += static_cast<double>(round(a[static_cast<std::size_t>(i * 16 + k)])) *
                 round(b[static_cast<std::size_t>(k * 8 + j)]);
        expected[static_cast<std::size_t>(i * 8 + j)] = sum;
      }
    for (int mode : {0, 1, 2}) {
      SCOPED_TRACE(std::string(half ? "float16" : "bfloat16") + " mode " + std::to_string(mode));
      Buffer<float> da(device(), a), db(device(), b), dc(device(), c), dd(device(), 128);
      RUN(device(), mma, da.get(), db.get(), dc.get(), dd.get(), half, mode);
      const std::vector<float> got = dd.host();
      double worst = 0;
      for (std::size_t e = 0; e < 128; ++e)
        worst = std::max(worst, std::fabs(got[e] - expected[e]) / (1.0 + std::fabs(expected[e])));
      if (mode < 2)
        EXPECT_LE(worst, 1e-6) << "the product differs from the loop";
      else
        EXPECT_GT(worst, 0.1) << "a B fragment loaded with the wrong layout went unnoticed";
    }
  }
}

// --- shared memory, dimensions, accessors --------------------------------------------------------
TEST_P(Simt, DynamicSharedMemory) {
  // 64 KiB of extra bytes: over 48 KiB, so the GPU launch must opt in.
  for (const std::size_t extra : {std::size_t{0}, std::size_t{64}, std::size_t{64 * 1024}}) {
    const int n = 96;
    const std::vector<float> x = random_floats(n, 7);
    Buffer<float> in(device(), x), out(device(), 2 * n);
    RUN(device(), dynamic_shared, in.get(), out.get(), n, extra);
    const std::vector<float> got = out.host();
    const float size = static_cast<float>((n * 8 + extra) / 4);
    for (int t = 0; t < n; ++t) {
      ASSERT_EQ(got[t], 2.0f * x[n - 1 - t] + static_cast<float>((n - 1 - t) % 3)) << t;
      ASSERT_EQ(got[n + t], size) << "the view's size";
    }
  }
}

TEST_P(Simt, GridAndBlockDimensions) {
  struct Shape {
    unsigned grid[3], block[3];
  };
  for (const Shape& s : {Shape{{3, 1, 1}, {40, 1, 1}}, Shape{{2, 3, 1}, {8, 5, 1}},
                         Shape{{2, 2, 2}, {4, 3, 5}}, Shape{{1, 1, 3}, {32, 2, 2}}}) {
    const unsigned threads = s.block[0] * s.block[1] * s.block[2];
    const unsigned blocks = s.grid[0] * s.grid[1] * s.grid[2];
    Buffer<int> out(device(), 10 * threads * blocks);
    RUN(device(), dimensions, out.get(), s.grid, s.block);
    const std::vector<int> got = out.host();
    for (unsigned bz = 0, i = 0; bz < s.grid[2]; ++bz)
      for (unsigned by = 0; by < s.grid[1]; ++by)
        for (unsigned bx = 0; bx < s.grid[0]; ++bx)
          for (unsigned tz = 0; tz < s.block[2]; ++tz)
            for (unsigned ty = 0; ty < s.block[1]; ++ty)
              for (unsigned tx = 0; tx < s.block[0]; ++tx, ++i) {
                const unsigned linear = tx + s.block[0] * (ty + s.block[1] * tz);
                const int expected[10] = {
                    int(bx), int(by),          int(bz),          int(tx),         int(ty),
                    int(tz), int(linear % 32), int(linear / 32), int(s.block[0]), int(s.grid[2])};
                for (int k = 0; k < 10; ++k)
                  ASSERT_EQ(got[10 * i + k], expected[k]) << "value " << k << " of thread " << i;
              }
  }
}

// A grid with a zero dimension (a problem with an empty extent) runs nothing and is no error, on
// both devices (CUDA itself would refuse it); a block with a zero dimension is an error.
TEST_P(Simt, EmptyGridRunsNothing) {
  const unsigned block[3] = {32, 1, 1};
  for (const auto& grid : {std::array<unsigned, 3>{0, 1, 1}, std::array<unsigned, 3>{2, 0, 1},
                           std::array<unsigned, 3>{1, 3, 0}}) {
    Buffer<int> out(device(), std::vector<int>(10, -7));
    RUN(device(), dimensions, out.get(), grid.data(), block);
    EXPECT_EQ(out.host(), std::vector<int>(10, -7)) << grid[0] << " " << grid[1] << " " << grid[2];
  }
  const unsigned grid[3] = {1, 1, 1}, empty_block[3] = {0, 1, 1};
  Buffer<int> out(device(), 10);
  EXPECT_THROW(RUN(device(), dimensions, out.get(), grid, empty_block), phasor::Error);
}

TEST_P(Simt, AccessorsConvertEveryDtypeThroughStrides) {
  const DType dtypes[] = {DType::float32, DType::float64, DType::bfloat16,
                          DType::float16, DType::int32,   DType::int64};
  const std::int64_t A = 3, B = 5, C = 7, n = A * B * C;
  for (const DType from : dtypes) {
    // x is stored as [C, A, B] and viewed as [A, B, C] (permuted strides), with values that
    // each dtype holds exactly or rounds (half types). A host Tensor stores a value in a dtype as
    // simt::store does (16-bit types through float).
    Tensor host({n}, from);
    for (std::int64_t i = 0; i < n; ++i)
      host.set(i, phasor::is_floating(from) ? (i - 40) * 0.3173 : static_cast<double>(i * 7 - 100));
    const phasor::testing::DeviceTensor xb(host, device());
    const TensorView x =
        TensorView::strided(xb.view().data, from, {A, B, C}, {B, 1, A * B}, device());
    for (const DType to : dtypes) {
      SCOPED_TRACE(std::string(phasor::to_string(from)) + " -> " + phasor::to_string(to));
      const auto yb = phasor::testing::DeviceTensor::nans({A, B, C}, to, device());
      RUN(device(), convert, x, yb.view());
      const Tensor got = yb.to_host();
      for (std::int64_t a = 0; a < A; ++a)
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t c = 0; c < C; ++c) {
            Tensor expected({1}, to);
            expected.set(0, host.at(a * B + b + c * A * B));
            const std::int64_t at = (a * B + b) * C + c;
            ASSERT_EQ(std::memcmp(static_cast<const unsigned char*>(got.data()) +
                                      at * static_cast<std::int64_t>(expected.nbytes()),
                                  expected.data(), expected.nbytes()),
                      0)
                << "element [" << a << ", " << b << ", " << c << "]";
          }
    }
  }
}

// simt::load_vector reads what simt::load reads, for each dtype it serves, also from a view whose
// rows are padded (row stride > row length) and one with a sliced leading dimension.
TEST_P(Simt, VectorLoadsMatchElementLoads) {
  const std::int64_t A = 3, B = 5, C = 16, padded = 24;  // C and padded: multiples of 8
  for (const DType dtype : {DType::bfloat16, DType::float16, DType::float32, DType::float64}) {
    Tensor host({A + 1, B, padded}, dtype);
    for (std::int64_t i = 0; i < host.numel(); ++i) host.set(i, (i % 997 - 400) * 0.0173);
    const phasor::testing::DeviceTensor xb(host, device());
    const std::int64_t row = padded * B;
    // x = the buffer's rows 1..A, columns [0, C): strides {row, padded, 1}, data 16-byte aligned
    // (row · element size is a multiple of 16).
    const auto element = static_cast<std::int64_t>(phasor::element_size(dtype));
    const TensorView x = TensorView::strided(static_cast<char*>(xb.view().data) + row * element,
                                             dtype, {A, B, C}, {row, padded, 1}, device());
    SCOPED_TRACE(phasor::to_string(dtype));
    const auto yb = phasor::testing::DeviceTensor::nans({A, B, C}, DType::float64, device());
    RUN(device(), vector_copy, x, yb.view());
    const Tensor got = yb.to_host();
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t c = 0; c < C; ++c)
          ASSERT_EQ(got.at((a * B + b) * C + c), host.at((a + 1) * row + b * padded + c))
              << "element [" << a << ", " << b << ", " << c << "]";
  }
}

// simt::store_vector writes what simt::store writes (rounded the same way), into a view with
// padded rows, and leaves the padding alone.
TEST_P(Simt, VectorStoresMatchElementStores) {
  const std::int64_t A = 3, B = 5, C = 16, padded = 24;
  Tensor values({A, B, C}, DType::float64);
  for (std::int64_t i = 0; i < values.numel(); ++i) values.set(i, (i % 991 - 400) * 0.0173 + 1e-5);
  const phasor::testing::DeviceTensor xb(values, device());
  for (const DType dtype : {DType::bfloat16, DType::float16, DType::float32, DType::float64}) {
    SCOPED_TRACE(phasor::to_string(dtype));
    const auto yb = phasor::testing::DeviceTensor::nans({A, B, padded}, dtype, device());
    const TensorView y =
        TensorView::strided(yb.view().data, dtype, {A, B, C}, {B * padded, padded, 1}, device());
    RUN(device(), vector_store, xb.view(), y);
    const Tensor got = yb.to_host();
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t c = 0; c < padded; ++c) {
          const double at = got.at((a * B + b) * padded + c);
          if (c >= C) {
            ASSERT_TRUE(std::isnan(at)) << "padding [" << a << ", " << b << ", " << c << "]";
            continue;
          }
          Tensor expected({1}, dtype);  // a host Tensor rounds as simt::store does
          expected.set(0, values.at((a * B + b) * C + c));
          ASSERT_EQ(at, expected.at(0)) << "element [" << a << ", " << b << ", " << c << "]";
        }
  }
}

TEST_P(Simt, LoadIndexReadsInt32AndInt64) {
  const std::vector<float> x = random_floats(50, 8);
  Buffer<float> xb(device(), x);
  const std::vector<std::int32_t> i32 = {49, 0, 3, 3, 17, 25};
  const std::vector<std::int64_t> i64(i32.begin(), i32.end());
  Buffer<std::int32_t> b32(device(), i32);
  Buffer<std::int64_t> b64(device(), i64);
  for (const TensorView& index :
       {TensorView::of(b32.get(), {6}, device()), TensorView::of(b64.get(), {6}, device())}) {
    Buffer<float> yb(device(), 6);
    RUN(device(), gather, index, TensorView::of(xb.get(), {50}, device()),
        TensorView::of(yb.get(), {6}, device()));
    const std::vector<float> y = yb.host();
    for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], x[i32[i]]) << phasor::to_string(index.dtype);
  }
}

TEST_P(Simt, SharedWarpReductionWithSyncwarp) {
  const std::vector<int> x = random_ints(64, -1000, 1000, 9);
  Buffer<int> in(device(), x), out(device(), 1);
  RUN(device(), shared_warp_sum, in.get(), out.get(), /*with_syncwarp=*/true);
  EXPECT_EQ(out.host()[0], std::accumulate(x.begin(), x.end(), 0));
}

TEST_P(Simt, NeighborSumWithBarrier) {
  const int blocks = 3, threads = 96;
  const std::vector<float> x = random_floats(blocks * threads, 10);
  Buffer<float> in(device(), x), out(device(), x.size());
  RUN(device(), neighbor_sum, in.get(), out.get(), blocks, threads, /*with_barrier=*/true);
  const std::vector<float> got = out.host();
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) {
      const int left = (t + threads - 1) % threads, right_of_left = (left + 1) % threads;
      const float expected = x[b * threads + right_of_left] + 0.5f * x[b * threads + left];
      ASSERT_EQ(got[b * threads + t], expected) << "block " << b << ", thread " << t;
    }
}

TEST_P(Simt, BarrierAndShuffleLoops) {
  for (const int iterations : {1, 2, 7}) {
    Buffer<int> barriers(device(), 96), shuffles(device(), 96);
    RUN(device(), barrier_loop, barriers.get(), 96, iterations);
    RUN(device(), shuffle_loop, shuffles.get(), 96, iterations);
    const std::vector<int> b = barriers.host(), s = shuffles.host();
    for (int t = 0; t < 96; ++t) {
      ASSERT_EQ(b[t], iterations);
      ASSERT_EQ(s[t], (iterations % 2 ? t ^ 1 : t) + iterations) << "thread " << t;
    }
  }
}

TEST_P(Simt, WorkspaceCounterReadWithOneCopy) {
  const std::vector<int> x = random_ints(1000, -50, 50, 18);
  Buffer<int> in(device(), x);
  const int count = RUN(device(), count_negatives, in.get(), 1000);
  EXPECT_EQ(count, std::count_if(x.begin(), x.end(), [](int v) { return v < 0; }));
}

TEST_P(Simt, FreshWorkspaceIsPoisonedOnTheEmulator) {
  if (!emulated()) GTEST_SKIP() << "a fresh GPU buffer holds whatever was there";
  Buffer<float> out(device(), 100);
  RUN(device(), fresh_workspace, out.get(), 100);
  for (const float v : out.host()) ASSERT_TRUE(std::isnan(v));
}

// Code nvcc compiles by default (-ftz=false) makes and reads subnormal float32 numbers, and so
// must the emulated GPU's blocks, whatever modes phasor's CPU kernels run with
// (set_flush_denormals) or the calling thread has: a kernel built with flush-to-zero would make
// each of these products 0.
TEST_P(Simt, SubnormalNumbersAsNvccsDefaultCode) {
  const float tiny = std::numeric_limits<float>::denorm_min() * 1000;  // subnormal
  const std::vector<float> a = {1e-20f, tiny, tiny, 3e-30f, 1.0f},
                           b = {1e-20f, 1.0f, 2.0f, 1e-10f, tiny};
  // Computed before any flushing mode is set: the product of two floats is exact in double, and
  // its one rounding to float keeps the subnormal result (gradual underflow).
  std::vector<float> expected;
  for (std::size_t i = 0; i < a.size(); ++i) {
    expected.push_back(static_cast<float>(static_cast<double>(a[i]) * static_cast<double>(b[i])));
    ASSERT_NE(expected[i], 0.f);
    ASSERT_LT(std::fabs(expected[i]), std::numeric_limits<float>::min()) << "not subnormal: " << i;
  }
  // The emulator runs blocks on the calling thread, or with `parallel` on phasor's thread pool,
  // whose threads take the CPU kernels' modes.
  phasor::set_num_threads(2);
  for (const bool parallel : {false, true})
    for (const bool flush : {true, false}) {
      SCOPED_TRACE(
          std::string(parallel ? "blocks on the thread pool, " : "blocks on the caller, ") +
          (flush ? "CPU kernels and caller flushing" : "nothing flushing"));
      phasor::emulator::Options schedule = phasor::emulator::options();
      schedule.parallel_blocks = parallel;
      const phasor::emulator::ScopedOptions scoped(schedule);
      phasor::testing::FlushDenormalsScope kernels(flush);
      std::vector<float> got;
      {
        const phasor::detail::DenormalModes caller(flush);
        Buffer<float> x(device(), a), y(device(), b), out(device(), a.size());
        RUN(device(), multiply, x.get(), y.get(), out.get(), static_cast<int>(a.size()));
        got = out.host();
      }
      for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(got[i], expected[i]) << a[i] << " · " << b[i];
    }
  phasor::set_num_threads(0);  // the default
}

INSTANTIATE_TEST_SUITE_P(Devices, Simt, ::testing::Values(Device::emulated, Device::cuda),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(phasor::to_string(info.param));
                         });

// --- planted bugs (the emulator's checks) --------------------------------------------------------
namespace emu = phasor::emulated::simt_test;

// The launch must throw a KernelFault of this kind whose message names the kernel, the block and
// the thread.
void expect_fault(const std::function<void()>& launch, FaultKind kind, const std::string& kernel,
                  bool names_thread = true, std::optional<FaultKind> alternative_kind = {}) {
  try {
    launch();
    ADD_FAILURE() << "no KernelFault from " << kernel;
  } catch (const KernelFault& fault) {
    const std::string what = fault.what();
    EXPECT_TRUE(fault.kind() == kind || fault.kind() == alternative_kind)
        << phasor::simt::to_string(fault.kind()) << ": " << what;
    EXPECT_NE(what.find("kernel '" + kernel + "'"), std::string::npos) << what;
    if (names_thread) {
      EXPECT_NE(what.find("block ("), std::string::npos) << what;
      EXPECT_NE(what.find("thread ("), std::string::npos) << what;
    }
  }
}

struct PlantedBug {
  const char* kernel;
  FaultKind kind;
  std::function<void(int* out)> launch;
  std::optional<FaultKind> alternative_kind = {};  // a second diagnosis that is also right
};

std::vector<PlantedBug> planted_bugs() {
  return {
      {"shared_warp_sum_kernel", FaultKind::race,
       [](int* out) {
         static const std::vector<int> x(64, 1);
         emu::shared_warp_sum(x.data(), out, /*with_syncwarp=*/false);
       }},
      {"divergent_barrier_kernel", FaultKind::barrier_divergence, &emu::divergent_barrier},
      {"barrier_versus_shuffle_kernel", FaultKind::barrier_divergence,
       &emu::barrier_versus_shuffle},
      {"shared_out_of_bounds_kernel", FaultKind::shared_out_of_bounds, &emu::shared_out_of_bounds},
      {"global_out_of_bounds_kernel", FaultKind::global_out_of_bounds,
       [](int*) {
         static std::vector<float> y(64);
         emu::global_out_of_bounds(TensorView::of(y.data(), {64}, Device::emulated));
       }},
      {"uninitialized_shared_kernel", FaultKind::uninitialized_shared, &emu::uninitialized_shared},
      {"shuffle_mask_omits_caller_kernel", FaultKind::warp_mask, &emu::shuffle_mask_omits_caller},
      {"shuffle_source_outside_mask_kernel", FaultKind::warp_mask,
       &emu::shuffle_source_outside_mask},
      // Half of the warp shuffles with its half-warp mask, the other half with the full mask:
      // when the half-warp rendezvous completes before the others arrive (it can: its lanes are
      // all there), the full-mask lanes then wait for lanes that exit, a deadlock.
      {"shuffle_masks_disagree_kernel", FaultKind::warp_mask, &emu::shuffle_masks_disagree,
       FaultKind::deadlock},
      {"exit_while_others_wait_kernel", FaultKind::barrier_divergence,
       &emu::exit_while_others_wait},
      {"shuffle_lane_exited_kernel", FaultKind::deadlock, &emu::shuffle_lane_exited},
      {"temp_storage_reuse_kernel", FaultKind::misuse, &emu::temp_storage_reuse},
      // A vector load whose last index is not a multiple of its 4 elements (a misaligned
      // address on a GPU), one past the row's end, and one from a view with strided channels.
      {"vector_load_at_kernel", FaultKind::global_out_of_bounds,
       [](int*) {
         static std::vector<float> x(4 * 16);
         emu::vector_load_at(TensorView::of(x.data(), {4, 16}, Device::emulated), 2);
       }},
      {"vector_load_at_kernel", FaultKind::global_out_of_bounds,
       [](int*) {
         static std::vector<float> x(4 * 16);
         emu::vector_load_at(
             TensorView::strided(x.data(), DType::float32, {4, 14}, {16, 1}, Device::emulated), 12);
       }},
      {"vector_load_at_kernel", FaultKind::misuse,
       [](int*) {
         static std::vector<float> x(4 * 16);
         emu::vector_load_at(
             TensorView::strided(x.data(), DType::float32, {4, 8}, {16, 2}, Device::emulated), 0);
       }},
      {"workspace_out_of_bounds_kernel", FaultKind::global_out_of_bounds,
       &emu::workspace_out_of_bounds},
      {"block_size_mismatch_kernel", FaultKind::misuse, &emu::block_size_mismatch},
      {"static_shared_over_limit_kernel", FaultKind::shared_memory_limit,
       &emu::static_shared_over_limit},
  };
}

TEST(SimtFaults, PlantedBugsAreCaughtUnderEverySchedule) {
  for (const char* schedule : {"forward", "reverse", "random:3"}) {
    ScopedOptions scoped(phasor::emulator::parse_schedule(schedule));
    for (const PlantedBug& bug : planted_bugs()) {
      SCOPED_TRACE(std::string(bug.kernel) + " under " + schedule);
      std::vector<int> out(64);
      expect_fault([&] { bug.launch(out.data()); }, bug.kind, bug.kernel, true,
                   bug.alternative_kind);
    }
  }
}

TEST(SimtFaults, RaceOfAMissingSyncthreads) {
  const std::vector<float> x = random_floats(2 * 96, 11);
  std::vector<float> out(x.size());
  expect_fault([&] { emu::neighbor_sum(x.data(), out.data(), 2, 96, /*with_barrier=*/false); },
               FaultKind::race, "neighbor_sum_kernel");
}

TEST(SimtFaults, MessagesNameTheCulprits) {
  ScopedOptions forward(phasor::emulator::Options{});
  std::vector<int> out(64);
  try {
    emu::exit_while_others_wait(out.data());
    FAIL() << "no fault";
  } catch (const KernelFault& fault) {
    const std::string what = fault.what();
    // Thread 5 exits (forward order: it exits after threads 0-4 wait at the barrier).
    EXPECT_NE(what.find("block (0,0,0), thread (5,0,0) (warp 0, lane 5)"), std::string::npos)
        << what;
    EXPECT_NE(what.find("syncthreads at simt_kernels.cu:"), std::string::npos) << what;
  }
  try {
    emu::shared_out_of_bounds(out.data());
    FAIL() << "no fault";
  } catch (const KernelFault& fault) {
    const std::string what = fault.what();
    EXPECT_NE(what.find("thread (63,0,0)"), std::string::npos) << what;
    EXPECT_NE(what.find("index 64 of shared array 's' (declared at simt_kernels.cu:"),
              std::string::npos)
        << what;
  }
}

TEST(SimtFaults, SharedMemoryLimitsFollowTheTargetArchitecture) {
  const std::vector<float> x = random_floats(64, 12);
  std::vector<float> out(128);
  const std::size_t extra = 200 * 1024;  // over sm_80's 163 KiB, within sm_90's 227 KiB
  phasor::emulator::Options options;
  options.target_arch = 80;
  {
    ScopedOptions scoped(options);
    expect_fault([&] { emu::dynamic_shared(x.data(), out.data(), 64, extra); },
                 FaultKind::shared_memory_limit, "dynamic_shared_kernel", /*names_thread=*/false);
  }
  options.target_arch = 90;
  ScopedOptions scoped(options);
  emu::dynamic_shared(x.data(), out.data(), 64, extra);
  EXPECT_EQ(out[0], 2.0f * x[63]);
}

TEST(SimtFaults, EachCheckCanBeTurnedOff) {
  std::vector<int> out(64);
  phasor::emulator::Options options;
  options.check_uninitialized_shared = false;
  {
    ScopedOptions scoped(options);
    emu::uninitialized_shared(out.data());  // reads the poison pattern instead of faulting
    EXPECT_EQ(out[40], static_cast<int>(0xcdcdcdcdu));
  }
  options = {};
  options.check_shared_memory_limit = false;
  {
    ScopedOptions scoped(options);
    emu::static_shared_over_limit(out.data());
  }
  options = {};
  options.check_races = false;
  {
    ScopedOptions scoped(options);
    std::vector<int> x(64, 1);
    emu::shared_warp_sum(x.data(), out.data(), /*with_syncwarp=*/false);
  }
  options = {};
  options.check_bounds = false;
  {
    ScopedOptions scoped(options);
    std::vector<float> y(65);  // one spare element: the unchecked write lands there
    emu::global_out_of_bounds(TensorView::of(y.data(), {64}, Device::emulated));
    EXPECT_EQ(y[64], 1.0f);
  }
}

TEST(SimtFaults, FaultsLeaveTheEmulatorUsable) {
  const std::vector<int> x = random_ints(64, -1000, 1000, 13);
  for (int round = 0; round < 20; ++round) {
    for (const PlantedBug& bug : planted_bugs()) {
      std::vector<int> out(64);
      EXPECT_THROW(bug.launch(out.data()), KernelFault) << bug.kernel;
    }
    int sum = 0;
    emu::shared_warp_sum(x.data(), &sum, /*with_syncwarp=*/true);
    ASSERT_EQ(sum, std::accumulate(x.begin(), x.end(), 0)) << "after faults, round " << round;
  }
}

// --- schedules -----------------------------------------------------------------------------------
// The outputs of a set of correct kernels, as bytes.
std::vector<unsigned char> correct_outputs() {
  std::vector<unsigned char> bytes;
  auto append = [&](const auto& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size() * sizeof(v[0]));
  };
  const std::vector<float> f = random_floats(4 * 96, 14);
  std::vector<float> neighbor(f.size());
  emu::neighbor_sum(f.data(), neighbor.data(), 4, 96, true);
  append(neighbor);
  const std::vector<float> r = random_floats(512 * 3, 15);
  std::vector<float> reduced(15);
  emu::block_reduce(r.data(), reduced.data(), 3, 100);
  reduced[4] = reduced[9] = reduced[14] = 0;  // the poisoned entries (NaN payloads may differ)
  append(reduced);
  const std::vector<int> s = random_ints(3 * 512, -1000, 1000, 16);
  std::vector<int> incl(s.size()), excl(s.size());
  emu::scan_tiles(s.data(), incl.data(), excl.data(), static_cast<int>(s.size()));
  append(incl);
  append(excl);
  std::vector<int> warp(9 * 64);
  emu::warp_primitives(s.data(), warp.data());
  append(warp);
  std::vector<int> dims(10 * 8 * 60);
  const unsigned grid[3] = {2, 2, 2}, block[3] = {4, 3, 5};
  emu::dimensions(dims.data(), grid, block);
  append(dims);
  return bytes;
}

TEST(SimtSchedules, CorrectKernelsAreBitIdenticalUnderEverySchedule) {
  phasor::emulator::Options reference;
  reference.thread_order = reference.block_order = Order::forward;
  std::vector<unsigned char> expected;
  {
    ScopedOptions scoped(reference);
    expected = correct_outputs();
  }
  for (const char* schedule : {"reverse", "random:1", "random:2", "threads=reverse,blocks=random:5",
                               "threads=random:9,blocks=reverse,parallel", "forward,parallel"}) {
    ScopedOptions scoped(phasor::emulator::parse_schedule(schedule));
    EXPECT_TRUE(correct_outputs() == expected) << "schedule " << schedule;
  }
}

TEST(SimtSchedules, RacyKernelDependsOnTheScheduleWhenUnchecked) {
  const std::vector<float> x = random_floats(96, 17);
  auto run = [&](Order order) {
    phasor::emulator::Options options;
    options.check_races = false;
    options.thread_order = order;
    ScopedOptions scoped(options);
    std::vector<float> out(x.size());
    emu::neighbor_sum(x.data(), out.data(), 1, 96, /*with_barrier=*/false);
    return out;
  };
  EXPECT_NE(run(Order::forward), run(Order::reverse))
      << "the schedule perturbation does not change the interleaving";
  // With the check on, every schedule reports it.
  for (const Order order : {Order::forward, Order::reverse, Order::random}) {
    phasor::emulator::Options options;
    options.thread_order = order;
    ScopedOptions scoped(options);
    std::vector<float> out(x.size());
    expect_fault([&] { emu::neighbor_sum(x.data(), out.data(), 1, 96, false); }, FaultKind::race,
                 "neighbor_sum_kernel");
  }
}

TEST(SimtSchedules, ScheduleStringsParse) {
  const auto o =
      phasor::emulator::parse_schedule("threads=reverse, blocks=random:42,parallel,sm_90");
  EXPECT_EQ(o.thread_order, Order::reverse);
  EXPECT_EQ(o.block_order, Order::random);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_TRUE(o.parallel_blocks);
  EXPECT_EQ(o.target_arch, 90);
  EXPECT_THROW(phasor::emulator::parse_schedule("backwards"), phasor::Error);
  EXPECT_THROW(phasor::emulator::parse_schedule("sm_12"), phasor::Error);
  phasor::emulator::Options bad;
  bad.target_arch = 81;
  EXPECT_THROW(phasor::emulator::set_options(bad), phasor::Error);
}

}  // namespace
