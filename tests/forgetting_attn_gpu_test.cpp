// FoX decoding on the GPU (cuda/forgetting_attn/recurrent.cu: ForgettingAttnCache on a GPU
// device) against the CPU cache and the float64 parallel reference, on every GPU device
// (Device::emulated always; Device::cuda when the machine has a GPU, otherwise SKIPPED): the
// outputs of token-by-token decoding in float64, float32, bfloat16 and float16, without rotation
// and with θ in both layouts, with and without additive GRAPE slopes, over realistic, strong
// (−20 per token), weak (−1e-4) and exactly-zero (−inf) gates, windows of 1, 7 and 150 tokens
// (the ring wraps), grouped query heads, K ≠ V, odd sizes, and a cache of 300 tokens (three key
// splits, combined in order). Tolerances (device_test_util.h): float64 ≤ 1e-12 and float32 ≤ 1e-5
// relative RMS against the reference and the CPU cache; 16-bit inputs: at most twice the CPU
// cache's own error on the same rounded inputs, + 1e-6. Also: reset() and a second round,
// bit-identical outputs under three emulator schedules, the CPU's error text for a positive gate
// (and the cache unchanged by the failed step), a cache kept on the device of its first step, and
// a value dimension beyond the kernel's shared memory as a clear error.
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "device_test_util.h"
#include "phasor/emulator.h"
#include "phasor/forgetting_attn.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Tensor;

enum class Gates { realistic, strong, weak, zeros };
enum class Rotation { none, half_split, interleaved };

struct Case {
  std::string name;
  std::int64_t B, T, HQ, H, K, V;
  std::optional<std::int64_t> window = std::nullopt;
  Gates gates = Gates::realistic;
  bool slopes = false;
};

// float64 master copies of every input, [B, T, ...].
struct Inputs {
  Case c;
  Tensor q, k, v, g, theta, slope_q, slope_k;
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.c = c;
  in.q = testing::randn({c.B, c.T, c.HQ, c.K}, rng);
  in.k = testing::randn({c.B, c.T, c.H, c.K}, rng);
  in.v = testing::randn({c.B, c.T, c.H, c.V}, rng);
  in.g = testing::log_sigmoid_gates({c.B, c.T, c.HQ}, rng, 2.0);
  for (std::int64_t i = 0; i < in.g.numel(); ++i) {
    switch (c.gates) {
      case Gates::realistic:
        break;
      case Gates::strong:
        in.g.set(i, -20.0);
        break;
      case Gates::weak:
        in.g.set(i, -1e-4);
        break;
      case Gates::zeros:
        if (i % 7 == 3) in.g.set(i, -std::numeric_limits<double>::infinity());
        break;
    }
  }
  if (c.K % 2 == 0) in.theta = testing::randn({c.B, c.T, c.H, c.K / 2}, rng, 20.0);
  if (c.slopes) {
    in.slope_q = testing::uniform({c.B, c.T, c.HQ}, rng, 0.0, 0.3);
    in.slope_k = testing::uniform({c.B, c.T, c.H}, rng, -0.1, 0.3);
  }
  return in;
}

// Token t of a [B, T, ...] view.
TensorView token(TensorView x, std::int64_t t) {
  if (!x.defined()) return x;
  x.data = static_cast<unsigned char*>(x.data) +
           t * x.stride(1) * static_cast<std::int64_t>(element_size(x.dtype));
  x.sizes[1] = 1;
  return x;
}

RotaryLayout layout_of(Rotation r) {
  return r == Rotation::interleaved ? RotaryLayout::interleaved : RotaryLayout::half_split;
}

// o [B, T, HQ, V] of decoding every token through one cache on `device`, inputs rounded to
// `dtype`, output in `dtype`. `rounds`: decode, reset(), decode again: both must agree.
Tensor decode(const Inputs& in, DType dtype, Device device, Rotation rotation, int rounds = 1) {
  OnDevice on(device);
  const Case& c = in.c;
  auto input = [&](const Tensor& t) { return t.defined() ? on.in(t.to(dtype)) : TensorView{}; };
  const TensorView q = input(in.q), k = input(in.k), v = input(in.v), g = input(in.g),
                   theta = rotation == Rotation::none ? TensorView{} : input(in.theta),
                   slope_q = input(in.slope_q), slope_k = input(in.slope_k);
  ForgettingAttnCache cache(c.B, c.HQ, c.H, c.K, c.V, c.window);
  Tensor first;
  for (int round = 0; round < rounds; ++round) {
    const TensorView o = on.out({c.B, c.T, c.HQ, c.V}, dtype);
    for (std::int64_t t = 0; t < c.T; ++t) {
      cache.step(token(q, t), token(k, t), token(v, t), token(g, t), token(o, t), 0.7,
                 token(theta, t), layout_of(rotation), token(slope_q, t), token(slope_k, t));
      EXPECT_EQ(cache.length(), t + 1);
    }
    const Tensor result = on.to_host(o);
    if (round == 0)
      first = result;
    else
      EXPECT_TRUE(result.bit_equal(first)) << "round " << round << " after reset() differs";
    cache.reset();
  }
  return first;
}

// The float64 parallel reference on the inputs rounded to `dtype`.
Tensor reference(const Inputs& in, DType dtype, Rotation rotation) {
  auto rounded = [&](const Tensor& t) {
    return t.defined() ? t.to(dtype).to(DType::float64) : Tensor();
  };
  const Tensor q = rounded(in.q), k = rounded(in.k), v = rounded(in.v), g = rounded(in.g),
               theta = rotation == Rotation::none ? Tensor() : rounded(in.theta),
               slope_q = rounded(in.slope_q), slope_k = rounded(in.slope_k);
  ForgettingAttnParams p;
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.g = g.view();
  if (theta.defined()) p.theta = theta.view();
  p.rotary_layout = layout_of(rotation);
  if (slope_q.defined()) p.bias_q_slope = slope_q.view(), p.bias_k_slope = slope_k.view();
  p.scale = 0.7;
  p.window_size = in.c.window;
  Tensor o({in.c.B, in.c.T, in.c.HQ, in.c.V}, DType::float64);
  forgetting_attn_forward(p, Impl::reference, o.view());
  return o;
}

const char* name_of(Rotation r) {
  return r == Rotation::none         ? "no theta"
         : r == Rotation::half_split ? "half_split"
                                     : "interleaved";
}

void compare(const Tensor& gpu, const Tensor& cpu, const Tensor& ref, DType dtype) {
  const std::string key = "ForgettingAttnCache::step o";
  if (dtype == DType::float64 || dtype == DType::float32) {
    testing::expect_close_to_reference(gpu, ref, dtype, key);
    const double error = testing::rel_rms(gpu, cpu);
    testing::record_error(key + " vs cpu kernel " + to_string(dtype), error);
    EXPECT_LE(error, testing::reference_tolerance(dtype)) << key << " against the CPU cache";
  } else {
    testing::expect_as_accurate_as_cpu(gpu, cpu, ref, dtype, key);
  }
}

class ForgettingAttnGpu : public ::testing::TestWithParam<Device> {};

TEST_P(ForgettingAttnGpu, DecodingMatchesCpuCacheAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::vector<Case> cases = {
      {"realistic_grouped", 2, 12, 4, 2, 8, 6},
      {"strong", 1, 9, 2, 1, 8, 8, std::nullopt, Gates::strong},
      {"weak_window7", 1, 14, 2, 2, 4, 3, 7, Gates::weak},
      {"zeros_slopes", 2, 11, 2, 1, 6, 5, std::nullopt, Gates::zeros, true},
      {"window1_slopes", 1, 6, 2, 2, 4, 4, 1, Gates::realistic, true},
      {"window7_slopes", 1, 15, 3, 1, 6, 7, 7, Gates::realistic, true},
      {"odd_sizes", 1, 5, 1, 1, 5, 33},
      {"K64_V40", 1, 4, 2, 1, 64, 40},
  };
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, 7);
    for (Rotation rotation : {Rotation::none, Rotation::half_split, Rotation::interleaved}) {
      if (rotation != Rotation::none && c.K % 2 != 0) continue;
      for (DType dtype : testing::gpu_test_dtypes()) {
        SCOPED_TRACE(c.name + " " + name_of(rotation) + " " + to_string(dtype));
        const Tensor ref = reference(in, dtype, rotation);
        const Tensor cpu = decode(in, dtype, Device::cpu, rotation);
        const Tensor gpu = decode(in, dtype, device, rotation, dtype == DType::float32 ? 2 : 1);
        compare(gpu, cpu, ref, dtype);
      }
    }
  }
}

// A cache of 300 tokens is attended in three splits of 128 and combined in split order; with a
// window of 150 the ring wraps twice and the visible tokens span two splits.
TEST_P(ForgettingAttnGpu, LongCachesSplitOverTheKeys) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (const Case& c : {Case{"long", 1, 300, 2, 1, 4, 3, std::nullopt, Gates::weak, true},
                        Case{"long_window150", 1, 300, 1, 1, 4, 3, 150, Gates::weak}}) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, 21);
    for (DType dtype : {DType::float64, DType::float32}) {
      const Tensor ref = reference(in, dtype, Rotation::interleaved);
      const Tensor cpu = decode(in, dtype, Device::cpu, Rotation::interleaved);
      const Tensor gpu = decode(in, dtype, device, Rotation::interleaved);
      compare(gpu, cpu, ref, dtype);
    }
  }
}

// The outputs are bit-identical under the forward, a reversed and a seeded random order of
// threads and blocks: no race, no order-dependent reduction (several splits included).
TEST_P(ForgettingAttnGpu, BitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  if (device != Device::emulated) GTEST_SKIP() << "schedules are an option of the emulated GPU";
  const Inputs in =
      make_inputs({"schedules", 2, 140, 2, 1, 6, 5, std::nullopt, Gates::realistic, true}, 13);
  std::vector<Tensor> results;
  for (const char* schedule : {"forward", "reverse", "threads=random:3,blocks=random:4"}) {
    SCOPED_TRACE(schedule);
    emulator::ScopedOptions options(emulator::parse_schedule(schedule));
    results.push_back(decode(in, DType::float32, device, Rotation::half_split));
  }
  for (std::size_t i = 1; i < results.size(); ++i)
    EXPECT_TRUE(results[i].bit_equal(results[0])) << "o differs under schedule " << i;
}

// A positive gate gives the CPU's message before any kernel runs: o is not written, the cache
// does not advance, and the next good step continues as if the bad one had not happened.
TEST_P(ForgettingAttnGpu, BadValuesGiveTheCpuErrorAndChangeNothing) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in = make_inputs({"bad", 1, 3, 2, 1, 4, 3}, 17);
  Tensor bad_g = in.g;
  bad_g.set(2, 0.25);  // token 1, head 0
  const auto run = [&](Device d, std::string& what) {
    OnDevice on(d);
    const TensorView q = on.in(in.q), k = on.in(in.k), v = on.in(in.v), g = on.in(in.g),
                     bad = on.in(bad_g), o = on.out({1, 3, 2, 3}, DType::float64);
    ForgettingAttnCache cache(1, 2, 1, 4, 3);
    cache.step(token(q, 0), token(k, 0), token(v, 0), token(g, 0), token(o, 0));
    try {
      cache.step(token(q, 1), token(k, 1), token(v, 1), token(bad, 1), token(o, 1));
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_EQ(cache.length(), 1);
    EXPECT_TRUE(std::isnan(on.to_host(o).at(1 * 2 * 3))) << "o of the failed step was written";
    for (std::int64_t t = 1; t < 3; ++t)
      cache.step(token(q, t), token(k, t), token(v, t), token(g, t), token(o, t));
    return on.to_host(o);
  };
  std::string cpu_error, gpu_error;
  const Tensor cpu = run(Device::cpu, cpu_error), gpu = run(device, gpu_error);
  EXPECT_NE(cpu_error.find("'g'"), std::string::npos) << cpu_error;
  EXPECT_EQ(gpu_error, cpu_error);
  EXPECT_LE(testing::rel_rms(gpu, cpu), 1e-12);
}

// The first step fixes the cache's device until reset(); V beyond the kernel's shared memory is
// a clear error naming 'v'.
TEST_P(ForgettingAttnGpu, UnsupportedCallsAreClearErrors) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in = make_inputs({"devices", 1, 2, 1, 1, 4, 3}, 19);
  OnDevice on(device);
  const TensorView o = on.out({1, 2, 1, 3}, DType::float64);
  ForgettingAttnCache cache(1, 1, 1, 4, 3);
  cache.step(token(on.in(in.q), 0), token(on.in(in.k), 0), token(on.in(in.v), 0),
             token(on.in(in.g), 0), token(o, 0));
  Tensor o_cpu({1, 1, 1, 3}, DType::float64);
  testing::expect_error(
      [&] {
        cache.step(token(in.q.view(), 1), token(in.k.view(), 1), token(in.v.view(), 1),
                   token(in.g.view(), 1), o_cpu.view());
      },
      {"ForgettingAttnCache::step", "'q'", to_string(device), "cpu"});
  EXPECT_EQ(cache.length(), 1);
  cache.reset();  // a new start may choose another device
  cache.step(token(in.q.view(), 0), token(in.k.view(), 0), token(in.v.view(), 0),
             token(in.g.view(), 0), o_cpu.view());
  EXPECT_EQ(cache.length(), 1);

  const std::int64_t V = 4000;  // float32: 4 · (4 + 4·4000 + 8) bytes > 48 KiB
  std::mt19937_64 rng(3);
  ForgettingAttnCache wide(1, 1, 1, 4, V);
  testing::expect_error(
      [&] {
        wide.step(on.in(testing::randn({1, 1, 1, 4}, rng, 1.0, DType::float32)),
                  on.in(testing::randn({1, 1, 1, 4}, rng, 1.0, DType::float32)),
                  on.in(testing::randn({1, 1, 1, V}, rng, 1.0, DType::float32)),
                  on.in(Tensor::zeros({1, 1, 1}, DType::float32)),
                  on.out({1, 1, 1, V}, DType::float32));
      },
      {"ForgettingAttnCache::step", "'v'", "V = 4000"});
  EXPECT_EQ(wide.length(), 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, ForgettingAttnGpu, ::testing::ValuesIn(testing::gpu_devices()),
                         testing::device_param_name);

}  // namespace
}  // namespace phasor
