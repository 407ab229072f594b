// FoX decoding on the GPU (cuda/forgetting_attn/recurrent.cu: ForgettingAttnCache on a GPU
// device) against the CPU cache and the float64 parallel reference, on every GPU device
// (Device::emulated always; Device::cuda when the machine has a GPU, otherwise SKIPPED): the
// outputs of token-by-token decoding in float64, float32, bfloat16 and float16, without rotation
// and with θ in both layouts, with and without additive GRAPE slopes, over realistic, strong
// (−20 per token), weak (−1e-4) and exactly-zero (−inf) gates, windows of 1, 7 and 150 tokens
// (the ring wraps), grouped query heads, K ≠ V, odd sizes, and a cache of 300 tokens (three key
// splits, combined in order). Tolerances (gpu_gtest.h): float64 ≤ 1e-12 and float32 ≤ 1e-5
// relative RMS against the reference and the CPU cache; 16-bit inputs: at most twice the CPU
// cache's own error on the same rounded inputs, + 1e-6. Also: reset() and a second round,
// bit-identical outputs under three emulator schedules, the CPU's error text for a positive gate
// (and the cache unchanged by the failed step), a cache kept on the device of its first step, and
// a value dimension beyond the kernel's shared memory as a clear error.
//
// parallel_forgetting_attn (Impl::chunk, cuda/forgetting_attn/chunk.cu) on the same devices: o, lse
// and every gradient (dq, dk, dv, dg, dθ, dbias_q_slope, dbias_k_slope) in float64, float32,
// bfloat16 and float16, without rotation and with θ in both layouts, against the CPU chunk kernel
// and the float64 reference: realistic, strong (−20), weak (−1e-4), exactly-zero (−inf) and mixed
// gates, windows of 1, 5, 9, 20, 45 and 320 tokens, grouped query heads (HQ = 4, H = 2), T not a
// multiple of the tile, T shorter than one tile, K ≠ V, odd sizes, varlen batches with empty and
// one-token sequences, with and without slopes, large logits, rows dominated by a key in an earlier
// tile, tiles of 16, 32 and 64 and K = 256, V = 200 (the tile halved), a 4096-token sequence.
// Tolerances (gpu_gtest.h): float64 ≤ 1e-12 and float32 ≤ 1e-5 relative RMS against the
// reference and the CPU kernel (where rows are dominated by one key the float64 reference's plain
// adjoint is the inaccurate side: there 1e-7 against it); 16-bit inputs: the tensor-core rule
// (expect_tensor_core_accuracy). Also: the backward recomputing o and lse equals the one given them
// bit for bit, each gradient requested alone equals its value among all, mixed input dtypes,
// bit-identical results under three emulator schedules, empty problems, the CPU's error text for a
// positive gate, an infinite slope and a bad cu_seqlens, and K, V, block_size and the
// implementations without CUDA kernels as clear errors.
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "phasor/emulator.h"
#include "phasor/forgetting_attn.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gpu_gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Tensor;

using testing::Rotation;

enum class Gates { realistic, strong, weak, zeros };

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

using testing::layout_of;
using testing::token;

// o [B, T, HQ, V] of decoding every token through one cache on `device`, inputs rounded to
// `dtype`, output in `dtype`. `rounds`: decode, reset(), decode again: both must agree.
Tensor decode(const Inputs& in, DType dtype, Device device, Rotation rotation, int rounds = 1) {
  OnDevice on(device);
  const Case& c = in.c;
  auto input = [&](const Tensor& t) { return on.in(t, dtype); };
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
  auto rounded = [&](const Tensor& t) { return t.rounded_to(dtype); };
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

void compare(const Tensor& gpu, const Tensor& cpu, const Tensor& ref, DType dtype) {
  testing::expect_gpu_result(gpu, cpu, ref, dtype, "ForgettingAttnCache::step o");
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
        SCOPED_TRACE(c.name + " " + testing::to_string(rotation) + " " + to_string(dtype));
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
  testing::expect_bit_identical_under_schedules(device, testing::kSchedules, [&] {
    return decode(in, DType::float32, device, Rotation::half_split);
  });
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

// ---- parallel_forgetting_attn (Impl::chunk) on the GPU: cuda/forgetting_attn/chunk.cu ----------

enum class ChunkGates { realistic, strong, weak, zeros, mixed };

struct ChunkCase {
  std::string name;
  std::int64_t B, T, HQ, H, K, V;
  std::int64_t block_size = 16;
  std::optional<std::int64_t> window = std::nullopt;
  ChunkGates gates = ChunkGates::realistic;
  bool slopes = false;
  std::vector<std::int64_t> lengths = {};  // non-empty: packed with cu_seqlens (B = 1)
  double logit_gain = 1.0;                 // q scaled by it: large logits, dominant keys anywhere
  // > 0: q_t = logit_gain · k_{t − lag} (k_0 for t < lag) for every query head, so that every row
  // is dominated by one key (P ≈ 1 − e^{−20}), most of them in an earlier tile. Without θ only (a
  // rotation would misalign q_t and k_{t − lag}).
  std::int64_t dominant_lag = 0;
};

// float64 master copies of every input, [B, T, ...].
struct ChunkInputs {
  ChunkCase c;
  std::int64_t B = 0, T = 0;
  Tensor q, k, v, g, theta, slope_q, slope_k, cu, d_o;
};

ChunkInputs make_chunk_inputs(const ChunkCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  ChunkInputs in;
  in.c = c;
  const testing::Batch batch = testing::batch_of(c.B, c.T, c.lengths);
  in.B = batch.B, in.T = batch.T;
  in.cu = batch.cu_seqlens;
  const std::int64_t B = in.B, T = in.T;
  in.q = testing::randn({B, T, c.HQ, c.K}, rng, c.logit_gain);
  in.k = testing::randn({B, T, c.H, c.K}, rng);
  if (c.dominant_lag > 0)
    for (std::int64_t i = 0; i < in.q.numel(); ++i) {
      const std::int64_t a = i % c.K, hq = i / c.K % c.HQ, t = i / c.K / c.HQ % T,
                         b = i / c.K / c.HQ / T;
      const std::int64_t source = t >= c.dominant_lag ? t - c.dominant_lag : 0;
      in.q.set(i, c.logit_gain * in.k.at(((b * T + source) * c.H + hq / (c.HQ / c.H)) * c.K + a));
    }
  in.v = testing::randn({B, T, c.H, c.V}, rng);
  in.g = testing::log_sigmoid_gates({B, T, c.HQ}, rng, 2.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::int64_t i = 0; i < in.g.numel(); ++i) {
    ChunkGates kind = c.gates;
    if (kind == ChunkGates::mixed) kind = static_cast<ChunkGates>(static_cast<int>(4 * unit(rng)));
    switch (kind) {
      case ChunkGates::realistic:
      case ChunkGates::mixed:
        break;
      case ChunkGates::strong:
        in.g.set(i, -20.0);
        break;
      case ChunkGates::weak:
        in.g.set(i, -1e-4);
        break;
      case ChunkGates::zeros:
        if (unit(rng) < 0.15) in.g.set(i, -std::numeric_limits<double>::infinity());
        break;
    }
  }
  if (c.K % 2 == 0) in.theta = testing::randn({B, T, c.H, c.K / 2}, rng, 20.0);
  if (c.slopes) {
    in.slope_q = testing::uniform({B, T, c.HQ}, rng, 0.0, 0.3);
    in.slope_k = testing::uniform({B, T, c.H}, rng, -0.1, 0.3);
  }
  in.d_o = testing::randn({B, T, c.HQ, c.V}, rng);
  return in;
}

struct ChunkOutputs {
  Tensor o, lse, dq, dk, dv, dg, dtheta, dslope_q, dslope_k;
  testing::NamedTensors fields() const {
    return {{"o", &o},
            {"lse", &lse},
            {"dq", &dq},
            {"dk", &dk},
            {"dv", &dv},
            {"dg", &dg},
            {"dtheta", &dtheta},
            {"dbias_q_slope", &dslope_q},
            {"dbias_k_slope", &dslope_k}};
  }
};

// Forward and backward of `impl` on `device`, every input rounded to `dtype`, outputs in `dtype`.
// The backward takes the forward's o and lse (`saved`) or recomputes them.
ChunkOutputs run_chunk(const ChunkInputs& in, DType dtype, Device device, Impl impl,
                       Rotation rotation, bool saved = true) {
  OnDevice on(device);
  auto input = [&](const Tensor& t) { return on.in(t, dtype); };
  const ChunkCase& c = in.c;
  ForgettingAttnParams p;
  p.q = input(in.q);
  p.k = input(in.k);
  p.v = input(in.v);
  p.g = input(in.g);
  p.cu_seqlens = on.in(in.cu);
  p.scale = 0.7;
  p.window_size = c.window;
  p.block_size = c.block_size;
  if (rotation != Rotation::none) {
    p.theta = input(in.theta);
    p.rotary_layout = layout_of(rotation);
  }
  p.bias_q_slope = input(in.slope_q);
  p.bias_k_slope = input(in.slope_k);
  // lse in the compute type (as fla keeps it in float32): a 16-bit lse of logits ~±30 would move
  // every P = e^{ℓ − lse} of the backward by up to 10%, for the CPU and the GPU alike.
  const DType lse_dtype = testing::compute_dtype(dtype);
  const TensorView o = on.out({in.B, in.T, c.HQ, c.V}, dtype),
                   lse = on.out({in.B, in.T, c.HQ}, lse_dtype);
  forgetting_attn_forward(p, impl, o, impl == Impl::reference ? TensorView{} : lse);
  ForgettingAttnGrads grads;
  grads.dq = on.out(in.q.shape(), dtype);
  grads.dk = on.out(in.k.shape(), dtype);
  grads.dv = on.out(in.v.shape(), dtype);
  grads.dg = on.out(in.g.shape(), dtype);
  if (rotation != Rotation::none) grads.dtheta = on.out(in.theta.shape(), dtype);
  if (c.slopes) {
    grads.dbias_q_slope = on.out(in.slope_q.shape(), dtype);
    grads.dbias_k_slope = on.out(in.slope_k.shape(), dtype);
  }
  const bool with_saved = saved && impl != Impl::reference;
  forgetting_attn_backward(p, impl, input(in.d_o), with_saved ? o : TensorView{},
                           with_saved ? lse : TensorView{}, grads);
  ChunkOutputs r;
  r.o = on.to_host(o);
  if (impl != Impl::reference) r.lse = on.to_host(lse);
  r.dq = on.to_host(grads.dq);
  r.dk = on.to_host(grads.dk);
  r.dv = on.to_host(grads.dv);
  r.dg = on.to_host(grads.dg);
  if (grads.dtheta.defined()) r.dtheta = on.to_host(grads.dtheta);
  if (c.slopes) {
    r.dslope_q = on.to_host(grads.dbias_q_slope);
    r.dslope_k = on.to_host(grads.dbias_k_slope);
  }
  return r;
}

// The float64 reference on the inputs rounded to `dtype`; its lse is the CPU chunk kernel's in
// float64 (the reference has none).
ChunkOutputs chunk_reference(const ChunkInputs& in, DType dtype, Rotation rotation) {
  ChunkInputs rounded = in;
  for (Tensor* t : {&rounded.q, &rounded.k, &rounded.v, &rounded.g, &rounded.theta,
                    &rounded.slope_q, &rounded.slope_k, &rounded.d_o})
    *t = t->rounded_to(dtype);
  ChunkOutputs ref = run_chunk(rounded, DType::float64, Device::cpu, Impl::reference, rotation);
  ref.lse = run_chunk(rounded, DType::float64, Device::cpu, Impl::chunk, rotation).lse;
  return ref;
}

// `gpu` against the reference and the CPU chunk kernel. float64 / float32: within 1e-12 / 1e-5 of
// both (gpu_gtest.h), except where the reference itself is less accurate (`ref_tolerance`);
// 16-bit inputs: the tensor-core rule (expect_tensor_core_accuracy).
void compare_chunk(const Tensor& gpu, const Tensor& cpu, const Tensor& ref, DType dtype,
                   const std::string& what, double ref_tolerance = 0) {
  const std::string key = std::string("parallel_forgetting_attn ") + what;
  if (ref_tolerance == 0 || !(dtype == DType::float64 || dtype == DType::float32)) {
    testing::GpuArithmetic tensor_cores;
    tensor_cores.tensor_cores = true;
    testing::expect_gpu_result(gpu, cpu, ref, dtype, key, tensor_cores);
    return;
  }
  const double error = testing::rel_rms(gpu, ref);
  testing::record_error(key + " vs reference (dominated rows) " + to_string(dtype), error);
  EXPECT_LE(error, ref_tolerance) << key << " against the reference";
  const double to_cpu = testing::rel_rms(gpu, cpu);
  testing::record_error(key + " vs cpu kernel " + to_string(dtype), to_cpu);
  EXPECT_LE(to_cpu, testing::reference_tolerance(dtype)) << key << " against the CPU kernel";
}

// Where the float64 reference is the less accurate side: its plain softmax adjoint
// dℓ_ij* = P_ij* (dP_ij* − D_i) of a row dominated by one key (P_ij* ≈ 1 − e^{−20}) loses ~e^20 ×
// float64 epsilon to cancellation (tests/forgetting_attn_test.cpp: against extended precision the
// kernels' −Σ_{j≠j*} dℓ_ij is the accurate one). With strong gates j* = i, which dq, dk (and dθ,
// made of them) see; with dominant keys below the diagonal also dg and the slope gradients.
enum class ReferenceLoses { nothing, dq_dk, every_dlogit };

void compare_chunk_all(const ChunkOutputs& gpu, const ChunkOutputs& cpu, const ChunkOutputs& ref,
                       DType dtype, ReferenceLoses loses = ReferenceLoses::nothing) {
  // There the float64 kernels are held to the CPU kernel (1e-12), the reference to 1e-7.
  const bool f64 = dtype == DType::float64;
  const double dqdk = f64 && loses != ReferenceLoses::nothing ? 1e-7 : 0,
               rest = f64 && loses == ReferenceLoses::every_dlogit ? 1e-7 : 0;
  compare_chunk(gpu.o, cpu.o, ref.o, dtype, "o");
  compare_chunk(gpu.lse, cpu.lse, ref.lse, dtype, "lse");
  compare_chunk(gpu.dq, cpu.dq, ref.dq, dtype, "dq", dqdk);
  compare_chunk(gpu.dk, cpu.dk, ref.dk, dtype, "dk", dqdk);
  compare_chunk(gpu.dv, cpu.dv, ref.dv, dtype, "dv");
  compare_chunk(gpu.dg, cpu.dg, ref.dg, dtype, "dg", rest);
  if (ref.dtheta.defined())
    compare_chunk(gpu.dtheta, cpu.dtheta, ref.dtheta, dtype, "dtheta", dqdk);
  if (ref.dslope_q.defined()) {
    compare_chunk(gpu.dslope_q, cpu.dslope_q, ref.dslope_q, dtype, "dbias_q_slope", rest);
    compare_chunk(gpu.dslope_k, cpu.dslope_k, ref.dslope_k, dtype, "dbias_k_slope", rest);
  }
}

class ForgettingAttnChunkGpu : public ::testing::TestWithParam<Device> {};

TEST_P(ForgettingAttnChunkGpu, MatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  using G = ChunkGates;
  // Tiles of 16 unless noted: several query and key tiles per sequence, the last one partial.
  const std::vector<ChunkCase> cases = {
      {"realistic_grouped", 2, 37, 4, 2, 8, 6},
      {"strong", 1, 40, 2, 1, 8, 8, 16, std::nullopt, G::strong},
      {"weak_slopes", 1, 45, 2, 2, 6, 5, 16, std::nullopt, G::weak, true},
      {"zeros_slopes", 2, 33, 2, 1, 8, 5, 16, std::nullopt, G::zeros, true},
      {"window1_slopes", 1, 20, 2, 1, 4, 4, 16, 1, G::realistic, true},
      {"window5_grouped", 1, 50, 4, 2, 6, 5, 16, 5, G::mixed},
      {"T_below_block64", 2, 9, 2, 1, 6, 7, 64},
      {"odd_sizes", 1, 23, 3, 1, 5, 3, 16},
      {"varlen_slopes", 1, 0, 2, 1, 6, 5, 16, std::nullopt, G::mixed, true, {5, 0, 1, 40, 0, 17}},
      {"large_logits", 1, 40, 2, 1, 8, 8, 16, std::nullopt, G::weak, false, {}, 10.0},
      {"dominant_keys_below", 2, 45, 2, 1, 32, 6, 16, std::nullopt, G::weak, true, {}, 3.0, 19},
      {"block32", 1, 100, 1, 1, 8, 8, 32, 45, G::weak},
      {"K0_slopes", 1, 37, 2, 1, 0, 5, 16, std::nullopt, G::mixed, true},  // logits: bias only
      {"V0_slopes", 1, 37, 2, 1, 4, 0, 16, std::nullopt, G::mixed, true},  // o empty, dq = dk = 0
  };
  for (const ChunkCase& c : cases) {
    const ChunkInputs in = make_chunk_inputs(c, 7);
    for (Rotation rotation : {Rotation::none, Rotation::half_split, Rotation::interleaved}) {
      if (rotation != Rotation::none && (c.K % 2 != 0 || c.dominant_lag > 0)) continue;
      for (DType dtype : testing::gpu_test_dtypes()) {
        SCOPED_TRACE(c.name + " " + testing::to_string(rotation) + " " + to_string(dtype));
        const ChunkOutputs ref = chunk_reference(in, dtype, rotation);
        const ChunkOutputs cpu = run_chunk(in, dtype, Device::cpu, Impl::chunk, rotation);
        const ChunkOutputs gpu = run_chunk(in, dtype, device, Impl::chunk, rotation);
        compare_chunk_all(gpu, cpu, ref, dtype,
                          c.dominant_lag > 0     ? ReferenceLoses::every_dlogit
                          : c.gates == G::strong ? ReferenceLoses::dq_dk
                                                 : ReferenceLoses::nothing);
      }
    }
  }
}

// A long sequence (T = 4096, one head, 64 query blocks of 64) with a window of 320 tokens (five
// key tiles per query block, the oldest partly masked; dg's X_b accumulated over 64 blocks) and
// slopes: every output and gradient against the CPU chunk kernel and the reference, float32.
TEST_P(ForgettingAttnChunkGpu, LongSequence) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const ChunkInputs in =
      make_chunk_inputs({"long", 1, 4096, 1, 1, 16, 16, 64, 320, ChunkGates::realistic, true}, 23);
  const ChunkOutputs ref = chunk_reference(in, DType::float32, Rotation::half_split);
  const ChunkOutputs cpu =
      run_chunk(in, DType::float32, Device::cpu, Impl::chunk, Rotation::half_split);
  const ChunkOutputs gpu = run_chunk(in, DType::float32, device, Impl::chunk, Rotation::half_split);
  compare_chunk_all(gpu, cpu, ref, DType::float32);
}

// K = 256 and V = 200 with block_size 64: the kernels halve the tile while its shared memory would
// exceed the budget (float32: forward 32 rows, backward 16; float64: 16 and 8).
TEST_P(ForgettingAttnChunkGpu, WideHeadsHalveTheTile) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const ChunkInputs in = make_chunk_inputs(
      {"wide", 1, 40, 2, 1, 256, 200, 64, std::nullopt, ChunkGates::mixed, true}, 29);
  for (DType dtype : testing::gpu_test_dtypes()) {
    SCOPED_TRACE(to_string(dtype));
    const ChunkOutputs ref = chunk_reference(in, dtype, Rotation::interleaved);
    const ChunkOutputs cpu = run_chunk(in, dtype, Device::cpu, Impl::chunk, Rotation::interleaved);
    const ChunkOutputs gpu = run_chunk(in, dtype, device, Impl::chunk, Rotation::interleaved);
    compare_chunk_all(gpu, cpu, ref, dtype);
  }
}

// The backward that recomputes o and lse gives the same bits as the one given the forward's o
// and lse (float32 and float64: both hold the compute type's values), in every combination of
// window, slopes, grouped heads and θ of the case.
TEST_P(ForgettingAttnChunkGpu, RecomputedForwardEqualsSavedForward) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const ChunkInputs in =
      make_chunk_inputs({"recompute", 2, 30, 4, 2, 6, 5, 16, 9, ChunkGates::mixed, true}, 31);
  for (DType dtype : {DType::float64, DType::float32}) {
    SCOPED_TRACE(to_string(dtype));
    const ChunkOutputs saved =
        run_chunk(in, dtype, device, Impl::chunk, Rotation::half_split, true);
    const ChunkOutputs again =
        run_chunk(in, dtype, device, Impl::chunk, Rotation::half_split, false);
    // The gradients (o and lse come from the same forward in both).
    const testing::NamedTensors a = saved.fields(), b = again.fields();
    testing::expect_bit_equal({a.begin() + 2, a.end()}, {b.begin() + 2, b.end()},
                              "recomputing o and lse");
  }
}

// Logits of ~1e9 in float32 (|q|, |k| ≈ 1e4, K = 15) with the lse of the CPU's recurrent forward
// (another summation order: it differs from the tiles' logits by hundreds): the backward clamps
// e^{ℓ − lse} at 1, so the gradients stay finite and each dv_j ≤ Σ_i |do_i| (found by the
// numerical soak, tests/soak_test.cpp; unclamped, dv reached 1e14 and inf on the CPU).
TEST_P(ForgettingAttnChunkGpu, HugeLogitsWithForeignLseGiveBoundedGradients) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  std::mt19937_64 rng(31);
  const std::int64_t T = 64, K = 15, V = 4;
  const Tensor q = testing::uniform({1, T, 1, K}, rng, 1e4, 1.01e4, DType::float32),
               k = testing::uniform({1, T, 1, K}, rng, 1e4, 1.01e4, DType::float32),
               v = testing::randn({1, T, 1, V}, rng, 1.0, DType::float32),
               g = Tensor::zeros({1, T, 1}, DType::float32),
               d_o = testing::randn({1, T, 1, V}, rng, 1.0, DType::float32);
  ForgettingAttnParams host;
  host.q = q.view();
  host.k = k.view();
  host.v = v.view();
  host.g = g.view();
  Tensor o({1, T, 1, V}, DType::float32), lse({1, T, 1}, DType::float32);
  forgetting_attn_forward(host, Impl::recurrent, o.view(), lse.view());
  OnDevice on(device);
  ForgettingAttnParams p = host;
  p.q = on.in(q);
  p.k = on.in(k);
  p.v = on.in(v);
  p.g = on.in(g);
  p.block_size = 16;
  ForgettingAttnGrads grads;
  grads.dq = on.out(q.shape(), DType::float32);
  grads.dk = on.out(k.shape(), DType::float32);
  grads.dv = on.out(v.shape(), DType::float32);
  grads.dg = on.out(g.shape(), DType::float32);
  forgetting_attn_backward(p, Impl::chunk, on.in(d_o), on.in(o), on.in(lse), grads);
  for (const TensorView& x : {grads.dq, grads.dk, grads.dv, grads.dg})
    EXPECT_TRUE(testing::all_finite(on.to_host(x)));
  double bound = 0, largest = 0;
  for (std::int64_t i = 0; i < d_o.numel(); ++i) bound += std::fabs(d_o.at(i));
  const Tensor dv = on.to_host(grads.dv);
  for (std::int64_t i = 0; i < dv.numel(); ++i) largest = std::max(largest, std::fabs(dv.at(i)));
  EXPECT_LE(largest, bound * (1 + 1e-5)) << "max |dv|";
}

// Each gradient requested alone equals its value when all are requested, bit for bit, and the
// others are not written (the kernels skip what is not asked for: dq alone runs no dkv kernel, dv
// alone no dq kernel and no dℓ).
TEST_P(ForgettingAttnChunkGpu, GradientsRequestedAlone) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const ChunkInputs in = make_chunk_inputs(
      {"alone", 1, 0, 2, 1, 6, 5, 16, std::nullopt, ChunkGates::mixed, true, {20, 0, 17}}, 37);
  const ChunkOutputs all =
      run_chunk(in, DType::float32, device, Impl::chunk, Rotation::interleaved);
  OnDevice on(device);
  auto input = [&](const Tensor& t) { return on.in(t, DType::float32); };
  ForgettingAttnParams p;
  p.q = input(in.q);
  p.k = input(in.k);
  p.v = input(in.v);
  p.g = input(in.g);
  p.cu_seqlens = on.in(in.cu);
  p.scale = 0.7;
  p.block_size = in.c.block_size;
  p.theta = input(in.theta);
  p.rotary_layout = RotaryLayout::interleaved;
  p.bias_q_slope = input(in.slope_q);
  p.bias_k_slope = input(in.slope_k);
  const TensorView d_o = input(in.d_o);
  const std::vector<std::pair<TensorView ForgettingAttnGrads::*, const Tensor*>> each = {
      {&ForgettingAttnGrads::dq, &all.dq},
      {&ForgettingAttnGrads::dk, &all.dk},
      {&ForgettingAttnGrads::dv, &all.dv},
      {&ForgettingAttnGrads::dg, &all.dg},
      {&ForgettingAttnGrads::dtheta, &all.dtheta},
      {&ForgettingAttnGrads::dbias_q_slope, &all.dslope_q},
      {&ForgettingAttnGrads::dbias_k_slope, &all.dslope_k}};
  for (std::size_t i = 0; i < each.size(); ++i) {
    SCOPED_TRACE("gradient " + std::to_string(i));
    ForgettingAttnGrads grads;
    const TensorView out = on.out(each[i].second->shape(), DType::float32);
    grads.*(each[i].first) = out;
    forgetting_attn_backward(p, Impl::chunk, d_o, {}, {}, grads);
    EXPECT_TRUE(on.to_host(out).bit_equal(*each[i].second));
  }
}

// Every output bit-identical under the forward, a reversed and a seeded random order of threads
// and blocks (float32 FMA tiles and bfloat16 tensor cores): no race, no order-dependent sum.
TEST_P(ForgettingAttnChunkGpu, BitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  if (device != Device::emulated) GTEST_SKIP() << "schedules are an option of the emulated GPU";
  const ChunkInputs in = make_chunk_inputs(
      {"schedules", 1, 0, 4, 2, 6, 5, 16, 20, ChunkGates::mixed, true, {3, 0, 37, 1, 20}}, 41);
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    SCOPED_TRACE(to_string(dtype));
    testing::expect_bit_identical_under_schedules(device, testing::kSchedules, [&] {
      return run_chunk(in, dtype, device, Impl::chunk, Rotation::interleaved);
    });
  }
}

// Bad values give the CPU's message on the GPU device before any kernel runs (o not written).
TEST_P(ForgettingAttnChunkGpu, BadValuesGiveTheCpuErrorAndWriteNothing) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const ChunkInputs in = make_chunk_inputs(
      {"bad", 1, 0, 2, 1, 4, 3, 16, std::nullopt, ChunkGates::realistic, true, {2, 3}}, 43);
  const auto message = [&](Device d, const Tensor& g, const Tensor& slope_q, const Tensor& cu) {
    OnDevice on(d);
    ForgettingAttnParams p;
    p.q = on.in(in.q);
    p.k = on.in(in.k);
    p.v = on.in(in.v);
    p.g = on.in(g);
    p.bias_q_slope = on.in(slope_q);
    p.cu_seqlens = on.in(cu);
    const TensorView o = on.out({1, 5, 2, 3}, DType::float64);
    std::string what;
    try {
      forgetting_attn_forward(p, Impl::chunk, o);
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_TRUE(std::isnan(on.to_host(o).at(0))) << "o was written";
    return what;
  };
  Tensor positive = in.g, infinite = in.slope_q;
  positive.set(5, 0.25);
  infinite.set(3, std::numeric_limits<double>::infinity());
  const Tensor bad_cu = testing::cu_seqlens({3, 3});  // ends at 6, T = 5
  for (const auto& [g, slope, cu, name] : {std::tuple{positive, in.slope_q, in.cu, "'g'"},
                                           std::tuple{in.g, infinite, in.cu, "'bias_q_slope'"},
                                           std::tuple{in.g, in.slope_q, bad_cu, "cu_seqlens"}}) {
    const std::string cpu = message(Device::cpu, g, slope, cu);
    EXPECT_NE(cpu.find(name), std::string::npos) << cpu;
    EXPECT_EQ(message(device, g, slope, cu), cpu);
  }
}

// Each argument its own dtype (q bfloat16: tensor cores; k float32, so S takes split operands; v
// float16; g float64; slopes and do float32), outputs in q's bfloat16: against the reference on
// the same values and the CPU kernel, by the tensor-core rule of bfloat16. (With float32 outputs
// the rule's premise — the outputs' own rounding dominating both kernels — does not hold: dq = dℓ
// k then shows the two operands rounded to bfloat16, measured 4.5e-3 = 1.1 u.)
TEST_P(ForgettingAttnChunkGpu, MixedDtypes) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const ChunkInputs in = make_chunk_inputs(
      {"mixed_dtypes", 1, 0, 4, 2, 8, 6, 16, 12, ChunkGates::mixed, true, {19, 1, 26}}, 59);
  const DType q_dtype = DType::bfloat16, k_dtype = DType::float32, v_dtype = DType::float16;
  const auto run = [&](Device d, Impl impl, bool rounded_to_float64) {
    OnDevice on(d);
    const auto input = [&](const Tensor& t, DType dtype) {
      return on.in(rounded_to_float64 ? t.rounded_to(dtype) : t.to(dtype));
    };
    ForgettingAttnParams p;
    p.q = input(in.q, q_dtype);
    p.k = input(in.k, k_dtype);
    p.v = input(in.v, v_dtype);
    p.g = input(in.g, DType::float64);
    p.bias_q_slope = input(in.slope_q, DType::float32);
    p.bias_k_slope = input(in.slope_k, DType::float32);
    p.cu_seqlens = on.in(in.cu);
    p.scale = 0.7;
    p.window_size = in.c.window;
    p.block_size = in.c.block_size;
    const DType out = rounded_to_float64 ? DType::float64 : q_dtype;
    const TensorView o = on.out({in.B, in.T, in.c.HQ, in.c.V}, out);
    forgetting_attn_forward(p, impl, o);
    ForgettingAttnGrads grads;
    grads.dq = on.out(in.q.shape(), out);
    grads.dk = on.out(in.k.shape(), out);
    grads.dv = on.out(in.v.shape(), out);
    grads.dg = on.out(in.g.shape(), out);
    grads.dbias_q_slope = on.out(in.slope_q.shape(), out);
    grads.dbias_k_slope = on.out(in.slope_k.shape(), out);
    forgetting_attn_backward(p, impl, input(in.d_o, DType::float32), {}, {}, grads);
    return std::vector<Tensor>{on.to_host(o),
                               on.to_host(grads.dq),
                               on.to_host(grads.dk),
                               on.to_host(grads.dv),
                               on.to_host(grads.dg),
                               on.to_host(grads.dbias_q_slope),
                               on.to_host(grads.dbias_k_slope)};
  };
  const std::vector<Tensor> ref = run(Device::cpu, Impl::reference, true),
                            cpu = run(Device::cpu, Impl::chunk, false),
                            gpu = run(device, Impl::chunk, false);
  const char* names[] = {"o", "dq", "dk", "dv", "dg", "dbias_q_slope", "dbias_k_slope"};
  for (std::size_t i = 0; i < ref.size(); ++i)
    testing::expect_tensor_core_accuracy(
        gpu[i], cpu[i], ref[i], DType::bfloat16,
        std::string("parallel_forgetting_attn (mixed dtypes) ") + names[i]);
}

// Outputs written over inputs (o over v; dq, dk, dv, dg over q, k, v, g): the kernels stage the
// overlapped inputs first, so the results equal those of separate buffers bit for bit.
TEST_P(ForgettingAttnChunkGpu, OutputsOverInputs) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const ChunkInputs in = make_chunk_inputs(
      {"in_place", 1, 0, 2, 2, 6, 6, 16, 7, ChunkGates::mixed, true, {21, 14}}, 61);
  const ChunkOutputs separate =
      run_chunk(in, DType::float32, device, Impl::chunk, Rotation::half_split, false);
  OnDevice on(device);
  auto input = [&](const Tensor& t) { return on.in(t, DType::float32); };
  ForgettingAttnParams p;
  p.q = input(in.q);
  p.k = input(in.k);
  p.v = input(in.v);
  p.g = input(in.g);
  p.cu_seqlens = on.in(in.cu);
  p.scale = 0.7;
  p.window_size = in.c.window;
  p.block_size = in.c.block_size;
  p.theta = input(in.theta);
  p.bias_q_slope = input(in.slope_q);
  p.bias_k_slope = input(in.slope_k);
  const TensorView v_copy = input(in.v);  // o goes over this one
  ForgettingAttnParams forward = p;
  forward.v = v_copy;
  forgetting_attn_forward(forward, Impl::chunk, v_copy);
  EXPECT_TRUE(on.to_host(v_copy).bit_equal(separate.o)) << "o over v";
  ForgettingAttnGrads grads;
  grads.dq = p.q;
  grads.dk = p.k;
  grads.dv = p.v;
  grads.dg = p.g;
  grads.dbias_q_slope = p.bias_q_slope;
  grads.dbias_k_slope = p.bias_k_slope;
  grads.dtheta = p.theta;
  forgetting_attn_backward(p, Impl::chunk, input(in.d_o), {}, {}, grads);
  EXPECT_TRUE(on.to_host(p.q).bit_equal(separate.dq)) << "dq over q";
  EXPECT_TRUE(on.to_host(p.k).bit_equal(separate.dk)) << "dk over k";
  EXPECT_TRUE(on.to_host(p.v).bit_equal(separate.dv)) << "dv over v";
  EXPECT_TRUE(on.to_host(p.g).bit_equal(separate.dg)) << "dg over g";
  EXPECT_TRUE(on.to_host(p.theta).bit_equal(separate.dtheta)) << "dθ over θ";
  EXPECT_TRUE(on.to_host(p.bias_q_slope).bit_equal(separate.dslope_q)) << "da over a";
  EXPECT_TRUE(on.to_host(p.bias_k_slope).bit_equal(separate.dslope_k)) << "db over b";
}

// Empty problems (T = 0, B = 0, no query heads) run and write what the CPU writes: with HQ = 0,
// dk, dv and dθ are sums over an empty group, zeros.
TEST_P(ForgettingAttnChunkGpu, EmptyProblems) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (const ChunkCase& c : {ChunkCase{"T0", 2, 0, 2, 1, 4, 4}, ChunkCase{"B0", 0, 5, 2, 1, 4, 4},
                             ChunkCase{"HQ0", 1, 5, 0, 1, 4, 4}}) {
    SCOPED_TRACE(c.name);
    const ChunkInputs in = make_chunk_inputs(c, 53);
    const ChunkOutputs cpu =
        run_chunk(in, DType::float32, Device::cpu, Impl::chunk, Rotation::half_split);
    const ChunkOutputs gpu =
        run_chunk(in, DType::float32, device, Impl::chunk, Rotation::half_split);
    testing::expect_bit_equal(gpu.fields(), cpu.fields(), "GPU against CPU");
  }
}

// K or V beyond 256, a block size the GPU kernels are not built for, and the implementations
// without CUDA kernels are phasor::Errors naming the argument.
TEST_P(ForgettingAttnChunkGpu, UnsupportedCallsAreClearErrors) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const auto call = [&](std::int64_t K, std::int64_t V, std::int64_t block_size, Impl impl) {
    const ChunkInputs in = make_chunk_inputs({"limits", 1, 2, 1, 1, K, V}, 47);
    OnDevice on(device);
    ForgettingAttnParams p;
    p.q = on.in(in.q);
    p.k = on.in(in.k);
    p.v = on.in(in.v);
    p.g = on.in(in.g);
    p.block_size = block_size;
    forgetting_attn_forward(p, impl, on.out({1, 2, 1, V}, DType::float64));
  };
  testing::expect_error([&] { call(258, 4, 16, Impl::chunk); },
                        {"parallel_forgetting_attn", "'q'", "K ≤ 256", "K = 258"});
  testing::expect_error([&] { call(4, 300, 16, Impl::chunk); },
                        {"parallel_forgetting_attn", "'v'", "V ≤ 256", "V = 300"});
  testing::expect_error([&] { call(4, 4, 8, Impl::chunk); },
                        {"parallel_forgetting_attn", "'block_size'", "16, 32 or 64", "got 8"});
  testing::expect_error([&] { call(4, 4, 16, Impl::recurrent); },
                        {"forgetting_attn_recurrent", "'impl'", "parallel_forgetting_attn"});
  testing::expect_error([&] { call(4, 4, 16, Impl::reference); },
                        {"forgetting_attn_reference", "'impl'", "parallel_forgetting_attn"});
}

INSTANTIATE_TEST_SUITE_P(Devices, ForgettingAttnChunkGpu,
                         ::testing::ValuesIn(testing::gpu_devices()), testing::device_param_name);

}  // namespace
}  // namespace phasor
