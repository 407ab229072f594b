// Performer FAVOR+ on the GPU (cuda/favor/kernels.cu) against the CPU kernels and the float64
// reference, on every GPU device (Device::emulated always; Device::cuda when the machine has a
// GPU, otherwise SKIPPED): the features φ with the query, key and no stabiliser and their
// gradients dx, dw; the attention o and dq, dk, dv, dw, non-causal and causal (through GLA's chunk
// and recurrent GPU kernels), with W shared or per head, in float64, float32, bfloat16 and
// float16, over odd sizes (V ≠ d, m not a multiple of d, m > d) and varlen batches with empty and
// one-token sequences. Tolerances: float64 ≤ 1e-11 against the reference (the CPU suite's bound:
// exp(u) with |u| up to ~10 amplifies rounding), float32 ≤ 1e-5 against the reference and the
// CPU kernel, 16-bit inputs as accurate as the CPU kernel on the same rounded inputs (every product
// is a float32 FMA tile). Also: bit-identical results under emulator schedules, the CPU's error
// for a bad cu_seqlens, and the causal attention's GPU chunk sizes.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "phasor/emulator.h"
#include "phasor/favor.h"
#include "phasor/testing/gpu_gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Tensor;

Tensor random_w(std::uint64_t seed, const std::vector<std::int64_t>& shape) {
  Tensor w(shape, DType::float64);
  favor_random_matrix(FavorMatrixKind::orthogonal_chi, seed, w.view());
  return w;
}

void compare(const Tensor& gpu, const Tensor& cpu, const Tensor& ref, DType dtype,
             const std::string& key) {
  if (dtype == DType::float64 || dtype == DType::float32) {
    const double tol = dtype == DType::float64 ? 1e-11 : 1e-5;
    const double error = testing::rel_rms(gpu, ref), to_cpu = testing::rel_rms(gpu, cpu);
    testing::record_error(key + " vs reference " + to_string(dtype), error);
    testing::record_error(key + " vs cpu kernel " + to_string(dtype), to_cpu);
    EXPECT_TRUE(testing::all_finite(gpu)) << key << " has non-finite values";
    EXPECT_LE(error, tol) << key << " (" << to_string(dtype) << ") against the reference";
    EXPECT_LE(to_cpu, tol) << key << " (" << to_string(dtype) << ") against the CPU kernel";
  } else {
    testing::expect_as_accurate_as_cpu(gpu, cpu, ref, dtype, key);
  }
}

// ---- features
// -------------------------------------------------------------------------------------

struct FeatureInputs {
  Tensor x, w, cu, d_phi;
  FavorStabilizer stabilizer;
};
struct FeatureOutputs {
  Tensor phi, dx, dw;
};

FeatureOutputs run_features(const FeatureInputs& in, DType dtype, Device device, Impl impl) {
  OnDevice on(device);
  FavorFeatureParams p;
  p.x = on.in(in.x, dtype);
  p.w = on.in(in.w, dtype);
  p.cu_seqlens = on.in(in.cu);
  p.stabilizer = in.stabilizer;
  const TensorView phi = on.out(in.d_phi.shape(), dtype), dx = on.out(in.x.shape(), dtype),
                   dw = on.out(in.w.shape(), dtype);
  favor_features_forward(p, impl, phi);
  favor_features_backward(p, impl, on.in(in.d_phi, dtype), dx, dw);
  return {on.to_host(phi), on.to_host(dx), on.to_host(dw)};
}

class FavorGpu : public ::testing::TestWithParam<Device> {};

TEST_P(FavorGpu, FeaturesMatchCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  std::mt19937_64 rng(3);
  for (FavorStabilizer st : {FavorStabilizer::query, FavorStabilizer::key, FavorStabilizer::none})
    for (bool per_head : {false, true})
      for (bool varlen : {false, true}) {
        const std::int64_t B = varlen ? 1 : 2, T = varlen ? 21 : 9, H = 3, d = 7, m = 37;
        FeatureInputs in;
        in.x = testing::randn({B, T, H, d}, rng, 0.8);
        in.w = per_head ? random_w(9, {H, m, d}) : random_w(9, {m, d});
        if (varlen) in.cu = testing::cu_seqlens({5, 0, 1, 15});
        in.stabilizer = st;
        in.d_phi = testing::randn({B, T, H, m}, rng);
        for (DType dtype : testing::gpu_test_dtypes()) {
          SCOPED_TRACE(std::string("stabiliser ") + std::to_string(static_cast<int>(st)) +
                       (per_head ? " per head" : " shared") + (varlen ? " varlen " : " ") +
                       to_string(dtype));
          FeatureInputs exact = in;
          for (Tensor* t : {&exact.x, &exact.w, &exact.d_phi})
            *t = t->rounded_to(dtype);  // the values every implementation sees
          const FeatureOutputs ref =
              run_features(exact, DType::float64, Device::cpu, Impl::reference);
          const FeatureOutputs cpu = run_features(in, dtype, Device::cpu, Impl::chunk);
          const FeatureOutputs gpu = run_features(in, dtype, device, Impl::chunk);
          compare(gpu.phi, cpu.phi, ref.phi, dtype, "favor_features phi");
          compare(gpu.dx, cpu.dx, ref.dx, dtype, "favor_features dx");
          compare(gpu.dw, cpu.dw, ref.dw, dtype, "favor_features dw");
        }
      }
}

// ---- attention
// ------------------------------------------------------------------------------------

struct AttnInputs {
  Tensor q, k, v, w, cu, d_o;
  bool causal = false;
};
struct AttnOutputs {
  Tensor o, dq, dk, dv, dw;
  testing::NamedTensors fields() const {
    return {{"o", &o}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dw", &dw}};
  }
};

AttnOutputs run_attn(const AttnInputs& in, DType dtype, Device device, Impl impl) {
  OnDevice on(device);
  FavorAttentionParams p;
  p.q = on.in(in.q, dtype);
  p.k = on.in(in.k, dtype);
  p.v = on.in(in.v, dtype);
  p.w = on.in(in.w, dtype);
  p.cu_seqlens = on.in(in.cu);
  p.causal = in.causal;
  p.chunk_size = 16;
  const TensorView o = on.out(in.v.shape(), dtype);
  favor_attention_forward(p, impl, o);
  FavorAttentionGrads g;
  g.dq = on.out(in.q.shape(), dtype);
  g.dk = on.out(in.k.shape(), dtype);
  g.dv = on.out(in.v.shape(), dtype);
  g.dw = on.out(in.w.shape(), dtype);
  favor_attention_backward(p, impl, on.in(in.d_o, dtype), g);
  return {on.to_host(o), on.to_host(g.dq), on.to_host(g.dk), on.to_host(g.dv), on.to_host(g.dw)};
}

AttnInputs make_attn(std::mt19937_64& rng, std::int64_t B, std::int64_t T, std::int64_t H,
                     std::int64_t d, std::int64_t V, std::int64_t m, bool per_head, bool causal,
                     const std::vector<std::int64_t>& lengths = {}) {
  AttnInputs in;
  const testing::Batch batch = testing::batch_of(B, T, lengths);
  B = batch.B, T = batch.T;
  in.cu = batch.cu_seqlens;
  in.q = testing::randn({B, T, H, d}, rng);
  in.k = testing::randn({B, T, H, d}, rng);
  in.v = testing::randn({B, T, H, V}, rng);
  in.w = per_head ? random_w(17, {H, m, d}) : random_w(17, {m, d});
  in.d_o = testing::randn({B, T, H, V}, rng);
  in.causal = causal;
  return in;
}

TEST_P(FavorGpu, AttentionMatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  std::mt19937_64 rng(6);
  struct Shape {
    std::int64_t B, T, H, d, V, m;
    std::vector<std::int64_t> lengths;
  };
  const std::vector<Shape> shapes = {
      {2, 9, 2, 5, 3, 7, {}},             // odd sizes, V ≠ d, m not a multiple of d
      {1, 0, 2, 4, 4, 6, {4, 0, 20, 1}},  // varlen with an empty and a 1-token sequence
      {1, 37, 1, 3, 6, 40, {}},           // m > d (several orthogonal blocks), m > 32, V + 1 > 6
  };
  for (const Shape& sh : shapes)
    for (bool causal : {false, true})
      for (bool per_head : {false, true}) {
        const AttnInputs in =
            make_attn(rng, sh.B, sh.T, sh.H, sh.d, sh.V, sh.m, per_head, causal, sh.lengths);
        for (Impl impl : {Impl::chunk, Impl::recurrent}) {
          if (!causal && impl == Impl::recurrent) continue;  // the same kernels
          for (DType dtype : testing::gpu_test_dtypes()) {
            SCOPED_TRACE(std::string("T ") + std::to_string(sh.T) + (causal ? " causal " : " ") +
                         (per_head ? "per head " : "shared ") + to_string(impl) + " " +
                         to_string(dtype));
            AttnInputs exact = in;
            for (Tensor* t : {&exact.q, &exact.k, &exact.v, &exact.w, &exact.d_o})
              *t = t->rounded_to(dtype);  // the values every implementation sees
            const AttnOutputs ref = run_attn(exact, DType::float64, Device::cpu, Impl::reference);
            const AttnOutputs cpu = run_attn(in, dtype, Device::cpu, impl);
            const AttnOutputs gpu = run_attn(in, dtype, device, impl);
            compare(gpu.o, cpu.o, ref.o, dtype, "favor_attention o");
            compare(gpu.dq, cpu.dq, ref.dq, dtype, "favor_attention dq");
            compare(gpu.dk, cpu.dk, ref.dk, dtype, "favor_attention dk");
            compare(gpu.dv, cpu.dv, ref.dv, dtype, "favor_attention dv");
            compare(gpu.dw, cpu.dw, ref.dw, dtype, "favor_attention dw");
          }
        }
      }
}

// Queries whose features miss the keys' (d = 1, w's rows ±1, q̂ = ±400 and k̂ = ∓400 and 350: the
// query's and the key's largest features are e^{−1600} apart): the per-feature stabiliser keeps the
// normaliser ≥ 1 (o = v for T = 1), where one key stabiliser gave 0/0 (found by the numerical
// soak, tests/soak_test.cpp; the CPU test is
// FavorAttention.QueriesMissingTheKeysFeaturesStayFinite).
TEST_P(FavorGpu, QueriesMissingTheKeysFeaturesStayFinite) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (bool causal : {false, true})
    for (std::int64_t T : {1, 4})
      for (DType dtype : {DType::float64, DType::float32}) {
        SCOPED_TRACE(std::string(causal ? "causal " : "") + "T = " + std::to_string(T) + " " +
                     to_string(dtype));
        std::mt19937_64 rng(13);
        AttnInputs in = make_attn(rng, 1, T, 1, 1, 3, 2, false, causal);
        in.w = Tensor::from({2, 1}, {1.0, -1.0});
        for (std::int64_t t = 0; t < T; ++t) {
          in.q.set(t, t % 2 == 0 ? 400.0 : -300.0);
          in.k.set(t, t % 3 == 0 ? -400.0 : 350.0);
        }
        const AttnOutputs ref = run_attn(in, DType::float64, Device::cpu, Impl::reference);
        const AttnOutputs cpu = run_attn(in, dtype, Device::cpu, Impl::chunk);
        const AttnOutputs gpu = run_attn(in, dtype, device, Impl::chunk);
        compare(gpu.o, cpu.o, ref.o, dtype, "favor_attention o, missing features");
        compare(gpu.dv, cpu.dv, ref.dv, dtype, "favor_attention dv, missing features");
        for (const Tensor* g : {&gpu.dq, &gpu.dk, &gpu.dw}) EXPECT_TRUE(testing::all_finite(*g));
      }
}

// Every output bit-identical under the forward, a reversed and a seeded random order of threads
// and blocks.
TEST_P(FavorGpu, BitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  if (device != Device::emulated) GTEST_SKIP() << "schedules are an option of the emulated GPU";
  std::mt19937_64 rng(8);
  for (bool causal : {false, true}) {
    const AttnInputs in = make_attn(rng, 1, 0, 2, 5, 4, 9, true, causal, {7, 0, 26});
    testing::expect_bit_identical_under_schedules(device, testing::kSchedules, [&] {
      return run_attn(in, DType::float32, device, Impl::chunk);
    });
  }
}

// A bad cu_seqlens gives the CPU's message before any kernel runs; the causal attention on a GPU
// device takes GLA's GPU chunk sizes.
TEST_P(FavorGpu, ErrorsAreTheCpuOnesOrNameTheArgument) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  std::mt19937_64 rng(9);
  AttnInputs in = make_attn(rng, 1, 0, 1, 4, 3, 6, false, true, {3, 4});
  const auto message = [&](Device d, const Tensor& cu, std::int64_t chunk_size) {
    OnDevice on(d);
    FavorAttentionParams p;
    p.q = on.in(in.q);
    p.k = on.in(in.k);
    p.v = on.in(in.v);
    p.w = on.in(in.w);
    p.cu_seqlens = on.in(cu);
    p.causal = true;
    p.chunk_size = chunk_size;
    const TensorView o = on.out(in.v.shape(), DType::float64);
    std::string what;
    try {
      favor_attention_forward(p, Impl::chunk, o);
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_TRUE(std::isnan(on.to_host(o).at(0))) << "o was written";
    return what;
  };
  const Tensor bad_cu = testing::cu_seqlens({3, 5});  // ends at 8, T = 7
  const std::string cpu = message(Device::cpu, bad_cu, 16);
  EXPECT_NE(cpu.find("cu_seqlens"), std::string::npos) << cpu;
  EXPECT_EQ(message(device, bad_cu, 16), cpu);
  const std::string chunk = message(device, in.cu, 8);
  EXPECT_NE(chunk.find("'chunk_size'"), std::string::npos) << chunk;
  EXPECT_NE(chunk.find("16, 32 or 64"), std::string::npos) << chunk;
}

INSTANTIATE_TEST_SUITE_P(Devices, FavorGpu, ::testing::ValuesIn(testing::gpu_devices()),
                         testing::device_param_name);

}  // namespace
}  // namespace phasor
