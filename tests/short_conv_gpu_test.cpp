// The short convolution's CUDA kernels (cuda/short_conv/kernels.cu) against the CPU kernel and the
// float64 reference, on every GPU device (Device::emulated always; Device::cuda when the machine
// has a GPU, otherwise SKIPPED): forward and backward (y, final_cache, dx, dweight, dbias,
// dinitial_cache, with and without d_final_cache), W = 1, 2, 3, 4 (register path) and 6 (general
// path), bias, SiLU, initial caches, varlen batches with empty, one-token and shorter-than-W−1
// sequences, lengths crossing the kernels' 32-token runs and 256-token blocks (129, 65), more
// than 32 channels, large and tiny inputs, in float64, float32, bfloat16 and float16. Tolerances
// (gpu_gtest.h): float64 ≤ 1e-12 and float32 ≤ 1e-5 relative RMS against the reference (and
// float32 within 1e-5 of the CPU kernel); 16-bit inputs: at most twice the CPU kernel's own error
// on the same rounded inputs, + 1e-6. Also: decoding token by token with the cache updated in place
// equals the parallel forward, in-place calls (y = x, dx = dy), bit-identical results under two
// emulator schedules, and a bad cu_seqlens raises the CPU's message and writes nothing.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "phasor/emulator.h"
#include "phasor/short_conv.h"
#include "phasor/testing/gpu_gtest.h"
#include "phasor/testing/random.h"
#include "phasor/testing/short_conv_case.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Tensor;

using Case = testing::ShortConvCase;
using Inputs = testing::ShortConvInputs;

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  return testing::make_short_conv_inputs(c, seed);
}

struct Outputs {
  Tensor y, final_cache, dx, dweight, dbias, dcache;
  testing::NamedTensors fields() const {
    return {{"y", &y},         {"final_cache", &final_cache}, {"dx", &dx}, {"dweight", &dweight},
            {"dbias", &dbias}, {"dinitial_cache", &dcache}};
  }
  std::vector<Tensor> all() const {
    std::vector<Tensor> v = {y, final_cache, dx, dweight};
    for (const Tensor& t : {dbias, dcache})
      if (t.defined()) v.push_back(t);
    return v;
  }
};

// Forward and backward of `impl` on `device`, every input rounded to `dtype`, outputs in `dtype`.
Outputs run(const Inputs& in, DType dtype, Device device, Impl impl, bool with_dfc = true) {
  OnDevice on(device);
  auto input = [&](const Tensor& t) { return on.in(t, dtype); };
  ShortConvParams p;
  p.x = input(in.x);
  p.weight = input(in.weight);
  p.bias = input(in.bias);
  p.initial_cache = input(in.cache);
  p.cu_seqlens = on.in(in.cu);
  p.activation = in.c.silu ? "silu" : "none";
  const std::vector<std::int64_t> cache_shape = {in.N, in.c.D, in.c.W - 1};
  const TensorView y = on.out(in.x.shape(), dtype), fc = on.out(cache_shape, dtype);
  short_conv_forward(p, impl, y, fc);
  const TensorView dx = on.out(in.x.shape(), dtype), dw = on.out(in.weight.shape(), dtype);
  const TensorView db = in.bias.defined() ? on.out(in.bias.shape(), dtype) : TensorView{};
  const TensorView dc = in.cache.defined() ? on.out(cache_shape, dtype) : TensorView{};
  short_conv_backward(p, impl, input(in.dy), with_dfc ? input(in.dfc) : TensorView{},
                      {dx, dw, db, dc});
  Outputs r;
  r.y = on.to_host(y);
  r.final_cache = on.to_host(fc);
  r.dx = on.to_host(dx);
  r.dweight = on.to_host(dw);
  if (db.defined()) r.dbias = on.to_host(db);
  if (dc.defined()) r.dcache = on.to_host(dc);
  return r;
}

// The float64 reference on the inputs rounded to `dtype`.
Outputs reference(const Inputs& in, DType dtype, bool with_dfc = true) {
  Inputs rounded = in;
  for (Tensor* t :
       {&rounded.x, &rounded.weight, &rounded.bias, &rounded.cache, &rounded.dy, &rounded.dfc})
    *t = t->rounded_to(dtype);
  return run(rounded, DType::float64, Device::cpu, Impl::reference, with_dfc);
}

void compare_all(const Outputs& gpu, const Outputs& cpu, const Outputs& ref, DType dtype) {
  testing::expect_gpu_results(gpu.fields(), cpu.fields(), ref.fields(), dtype, "causal_conv1d");
}

class ShortConvGpu : public ::testing::TestWithParam<Device> {};

TEST_P(ShortConvGpu, MatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::vector<Case> cases = {
      {"w4", 2, 33, 5, 4},
      {"w4_silu_varlen_empty_single", 1, 0, 9, 4, {0, 1, 3, 0, 40, 1, 2}, true, true, true},
      {"w1_silu", 2, 20, 6, 1, {}, true, true, true},
      {"w2_nocache", 2, 20, 6, 2, {}, true, false, true},
      {"w3_nobias_varlen", 1, 0, 4, 3, {1, 0, 7, 1}, false, true, false},
      // Runs of 32 tokens and blocks of 8 runs: sequences cross both, one ends 1 token into a run.
      {"run_boundaries", 1, 0, 3, 4, {129, 2, 65, 0, 33}, true, true, true},
      {"channels_40", 2, 7, 40, 4, {}, true, true, true},
      {"one_token", 1, 1, 3, 4, {}, true, true, true},
      {"large_inputs_silu", 2, 25, 8, 4, {}, true, true, true, 300.0},
      {"tiny_inputs", 2, 25, 8, 4, {}, true, true, true, 1e-20},
      // The general path (W > 4): sequences shorter than W − 1 keep older cached inputs.
      {"w6_general_varlen", 1, 0, 5, 6, {5, 0, 2, 40, 1}, true, true, true},
      {"w6_general_nocache", 2, 12, 3, 6, {}, false, false, false},
  };
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, 5);
    for (DType dtype : testing::gpu_test_dtypes()) {
      SCOPED_TRACE(c.name + " " + to_string(dtype));
      const Outputs ref = reference(in, dtype);
      const Outputs cpu = run(in, dtype, Device::cpu, Impl::chunk);
      const Outputs gpu = run(in, dtype, device, Impl::chunk);
      compare_all(gpu, cpu, ref, dtype);
    }
    // Without d_final_cache (float64), and the recurrent name selecting the same kernels.
    SCOPED_TRACE(c.name + " without d_final_cache");
    const Outputs ref0 = reference(in, DType::float64, false);
    const Outputs gpu0 = run(in, DType::float64, device, Impl::recurrent, false);
    testing::expect_close_to_reference(gpu0.dx, ref0.dx, DType::float64, "causal_conv1d dx");
    if (c.cache)
      testing::expect_close_to_reference(gpu0.dcache, ref0.dcache, DType::float64,
                                         "causal_conv1d dinitial_cache");
  }
}

// Each argument its own dtype (x bfloat16, weight float64, bias float32, cache float16, dy
// float32, outputs float32 and float16): the GPU computes what the CPU kernel computes, in the
// compute type of x (float32).
TEST_P(ShortConvGpu, MixedDtypes) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (std::int64_t W : {4, 6}) {
    SCOPED_TRACE("W=" + std::to_string(W));
    const Inputs in = make_inputs({"mixed", 1, 0, 7, W, {3, 0, 50, 2}, true, true, true}, 31);
    std::vector<Outputs> results;
    for (Device d : {Device::cpu, device}) {
      OnDevice on(d);
      ShortConvParams p;
      p.x = on.in(in.x.to(DType::bfloat16));
      p.weight = on.in(in.weight);
      p.bias = on.in(in.bias.to(DType::float32));
      p.initial_cache = on.in(in.cache.to(DType::float16));
      p.cu_seqlens = on.in(in.cu);
      p.activation = "silu";
      const TensorView y = on.out(in.x.shape(), DType::float32),
                       fc = on.out(in.cache.shape(), DType::float16);
      short_conv_forward(p, Impl::chunk, y, fc);
      const TensorView dx = on.out(in.x.shape(), DType::float16),
                       dw = on.out(in.weight.shape(), DType::float32),
                       db = on.out(in.bias.shape(), DType::float64),
                       dc = on.out(in.cache.shape(), DType::bfloat16);
      short_conv_backward(p, Impl::chunk, on.in(in.dy.to(DType::float32)),
                          on.in(in.dfc.to(DType::bfloat16)), {dx, dw, db, dc});
      results.push_back({on.to_host(y), on.to_host(fc), on.to_host(dx), on.to_host(dw),
                         on.to_host(db), on.to_host(dc)});
    }
    const Outputs &cpu = results[0], &gpu = results[1];
    const char* names[] = {"y", "final_cache", "dx", "dweight", "dbias", "dinitial_cache"};
    const std::vector<Tensor> a = gpu.all(), b = cpu.all();
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(testing::all_finite(a[i])) << names[i];
      // Rounding to 16-bit outputs may differ by one unit in the last place where the float32
      // values differ in their last bits.
      EXPECT_LE(testing::rel_rms(a[i], b[i]),
                a[i].dtype() == DType::float32 || a[i].dtype() == DType::float64 ? 1e-6 : 1e-3)
          << names[i];
    }
  }
}

// Decoding: T = 1 steps (causal_conv1d_update), the cache updated in place (final_cache is
// initial_cache), give the outputs and the final cache of one call over the whole sequence.
TEST_P(ShortConvGpu, DecodingTokenByTokenEqualsParallelForward) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (std::int64_t W : {1, 4, 6}) {
    for (bool silu : {false, true}) {
      SCOPED_TRACE("W=" + std::to_string(W) + (silu ? " silu" : ""));
      const Case c{"decode", 2, 9, 6, W, {}, true, true, silu};
      const Inputs in = make_inputs(c, 21);
      OnDevice on(device);
      ShortConvParams p;
      p.x = on.in(in.x);
      p.weight = on.in(in.weight);
      p.bias = on.in(in.bias);
      p.initial_cache = on.in(in.cache);
      p.activation = silu ? "silu" : "none";
      const TensorView y = on.out({2, 9, 6}, DType::float64),
                       fc = on.out({2, 6, W - 1}, DType::float64);
      short_conv_forward(p, Impl::chunk, y, fc);
      const TensorView cache = on.in(in.cache), stepped = on.out({2, 9, 6}, DType::float64);
      for (std::int64_t t = 0; t < 9; ++t) {
        auto step = [&](TensorView v) {  // token t of a [B, T, D] view
          v.data = static_cast<double*>(v.data) + t * v.stride(1);
          v.sizes[1] = 1;
          return v;
        };
        ShortConvParams s = p;
        s.x = step(p.x);
        s.initial_cache = cache;
        short_conv_forward(s, Impl::recurrent, step(stepped), cache);
      }
      PHASOR_EXPECT_CLOSE(on.to_host(stepped), on.to_host(y), 1e-15, "decoded y");
      EXPECT_TRUE(on.to_host(cache).bit_equal(on.to_host(fc))) << "decoded final cache";
    }
  }
}

// In place: y = x in the forward and dx = dy in the backward give the out-of-place results.
TEST_P(ShortConvGpu, InPlaceCalls) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (std::int64_t W : {4, 6}) {
    SCOPED_TRACE("W=" + std::to_string(W));
    const Case c{"in_place", 1, 0, 5, W, {40, 0, 30}, true, true, true};
    const Inputs in = make_inputs(c, 17);
    const Outputs expected = run(in, DType::float32, device, Impl::chunk);
    OnDevice on(device);
    ShortConvParams p;
    p.x = on.in(in.x.to(DType::float32));
    p.weight = on.in(in.weight.to(DType::float32));
    p.bias = on.in(in.bias.to(DType::float32));
    p.initial_cache = on.in(in.cache.to(DType::float32));
    p.cu_seqlens = on.in(in.cu);
    p.activation = "silu";
    const TensorView dy = on.in(in.dy.to(DType::float32));
    const TensorView dw = on.out(in.weight.shape(), DType::float32);
    // The backward first (it reads x), then the forward over x.
    short_conv_backward(p, Impl::chunk, dy, on.in(in.dfc.to(DType::float32)), {dy, dw, {}, {}});
    EXPECT_TRUE(on.to_host(dy).bit_equal(expected.dx)) << "dx written over dy";
    EXPECT_TRUE(on.to_host(dw).bit_equal(expected.dweight));
    short_conv_forward(p, Impl::chunk, p.x);
    EXPECT_TRUE(on.to_host(p.x).bit_equal(expected.y)) << "y written over x";
  }
}

TEST_P(ShortConvGpu, BitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (std::int64_t W : {4, 6}) {
    SCOPED_TRACE("W=" + std::to_string(W));
    const Case c{"schedules", 1, 0, 37, W, {0, 70, 1, 200, 3}, true, true, true};
    const Inputs in = make_inputs(c, 77);
    // Reversed and seeded random orders of threads and blocks (on cuda: a second run).
    testing::expect_bit_identical_under_schedules(device, {"forward", "reverse", "random:99"}, [&] {
      return run(in, DType::float32, device, Impl::chunk);
    });
  }
}

// A bad cu_seqlens: the CPU's message on the device, and no output written.
TEST_P(ShortConvGpu, BadCuSeqlensGivesTheCpuErrorAndWritesNothing) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in = make_inputs({"bad", 1, 0, 3, 4, {2, 4}}, 1);
  for (const std::vector<double>& offsets :
       {std::vector<double>{0, 2, 5}, std::vector<double>{0, 5, 4, 6}, std::vector<double>{2, 6}}) {
    const Tensor cu =
        Tensor::from({static_cast<std::int64_t>(offsets.size())}, offsets, DType::int32);
    const std::int64_t N = static_cast<std::int64_t>(offsets.size()) - 1;
    std::mt19937_64 rng(3);
    const Tensor cache = testing::randn({N, 3, 3}, rng);
    auto message = [](const std::function<void()>& f) {
      try {
        f();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    Tensor y({1, 6, 3}, DType::float64), fc({N, 3, 3}, DType::float64),
        dx({1, 6, 3}, DType::float64);
    ShortConvParams host;
    host.x = in.x.view();
    host.weight = in.weight.view();
    host.initial_cache = cache.view();
    host.cu_seqlens = cu.view();
    const std::string cpu =
        message([&] { short_conv_forward(host, Impl::chunk, y.view(), fc.view()); });
    const std::string cpu_backward = message([&] {
      short_conv_backward(host, Impl::chunk, in.dy.view(), {}, {dx.view(), {}, {}, {}});
    });
    EXPECT_NE(cpu.find("cu_seqlens"), std::string::npos) << cpu;
    OnDevice on(device);
    ShortConvParams p;
    p.x = on.in(in.x);
    p.weight = on.in(in.weight);
    p.initial_cache = on.in(cache);
    p.cu_seqlens = on.in(cu);
    const TensorView y_dev = on.out({1, 6, 3}, DType::float64),
                     fc_dev = on.out({N, 3, 3}, DType::float64),
                     dx_dev = on.out({1, 6, 3}, DType::float64);
    EXPECT_EQ(message([&] { short_conv_forward(p, Impl::chunk, y_dev, fc_dev); }), cpu);
    EXPECT_EQ(message([&] {
                short_conv_backward(p, Impl::chunk, on.in(in.dy), {}, {dx_dev, {}, {}, {}});
              }),
              cpu_backward);
    for (const Tensor& out : {on.to_host(y_dev), on.to_host(fc_dev), on.to_host(dx_dev)})
      for (std::int64_t i = 0; i < out.numel(); ++i) EXPECT_TRUE(std::isnan(out.at(i)));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ShortConvGpu, ::testing::ValuesIn(testing::gpu_devices()),
                         testing::device_param_name);

}  // namespace
}  // namespace phasor
