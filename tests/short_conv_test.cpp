// Tests of the short convolution op (include/phasor/short_conv.h): the float64 reference against
// a hand-computed example and central finite differences, the kernel (forward and backward,
// float32 and float64) against the reference on random and adversarial inputs (varlen with empty
// and single-token sequences, W = 1, 2, 4, sequences shorter than W−1 with a cache, several
// channel blocks, strided views, 65,536 tokens), decoding token by token and chunk by chunk,
// thread-count invariance and argument validation.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "phasor/short_conv.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/layout.h"
#include "phasor/testing/random.h"
#include "phasor/testing/short_conv_case.h"

namespace phasor {
namespace {

using testing::Tensor;

using Case = testing::ShortConvCase;
using Inputs = testing::ShortConvInputs;

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  return testing::make_short_conv_inputs(c, seed);
}

ShortConvParams params_of(const Inputs& in, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, const Tensor& cache) {
  ShortConvParams p;
  p.x = x.view();
  p.weight = weight.view();
  p.bias = bias.view();
  p.initial_cache = cache.view();
  p.cu_seqlens = in.cu.view();
  p.activation = in.c.silu ? "silu" : "none";
  return p;
}

struct Forward {
  Tensor y, final_cache;
};
Forward run_forward(const Inputs& in, Impl impl, DType dtype) {
  const Tensor x = in.x.to(dtype), w = in.weight.to(dtype);
  const Tensor b = in.bias.defined() ? in.bias.to(dtype) : Tensor();
  const Tensor h = in.cache.defined() ? in.cache.to(dtype) : Tensor();
  Forward f{Tensor::nans(in.x.shape(), dtype), Tensor::nans({in.N, in.c.D, in.c.W - 1}, dtype)};
  short_conv_forward(params_of(in, x, w, b, h), impl, f.y.view(), f.final_cache.view());
  return f;
}

struct Backward {
  Tensor dx, dweight, dbias, dcache;
};
Backward run_backward(const Inputs& in, Impl impl, DType dtype, bool with_dfc = true) {
  const Tensor x = in.x.to(dtype), w = in.weight.to(dtype);
  const Tensor b = in.bias.defined() ? in.bias.to(dtype) : Tensor();
  const Tensor h = in.cache.defined() ? in.cache.to(dtype) : Tensor();
  const Tensor dy = in.dy.to(dtype), dfc = in.dfc.to(dtype);
  Backward g;
  g.dx = Tensor::nans(in.x.shape(), dtype);
  g.dweight = Tensor::nans(in.weight.shape(), dtype);
  if (in.bias.defined()) g.dbias = Tensor::nans(in.bias.shape(), dtype);
  if (in.cache.defined()) g.dcache = Tensor::nans(in.cache.shape(), dtype);
  short_conv_backward(params_of(in, x, w, b, h), impl, dy.view(),
                      with_dfc ? dfc.view() : TensorView{},
                      {g.dx.view(), g.dweight.view(), g.dbias.view(), g.dcache.view()});
  return g;
}

// ---------------------------------------------------------------------------------------------
// The reference against hand-computed values.

TEST(ShortConvReference, HandComputedExample) {
  // D = 1, W = 3, weight [a, b, c], bias β, cache [p, q], x [1, 2, 3]:
  //   y_0 = β + a·p + b·q + c·1,  y_1 = β + a·q + b·1 + c·2,  y_2 = β + a·1 + b·2 + c·3
  const double a = 0.5, b = -2, c = 3, beta = 0.25, pc = 7, qc = -1;
  Tensor x = Tensor::from({1, 3, 1}, {1, 2, 3});
  Tensor w = Tensor::from({1, 3}, {a, b, c});
  Tensor bias = Tensor::from({1}, {beta});
  Tensor cache = Tensor::from({1, 1, 2}, {pc, qc});
  for (Impl impl : {Impl::reference, Impl::chunk}) {
    Tensor y({1, 3, 1}, DType::float64), fc({1, 1, 2}, DType::float64);
    ShortConvParams p;
    p.x = x.view();
    p.weight = w.view();
    p.bias = bias.view();
    p.initial_cache = cache.view();
    short_conv_forward(p, impl, y.view(), fc.view());
    EXPECT_DOUBLE_EQ(y.at(0), beta + a * pc + b * qc + c * 1);
    EXPECT_DOUBLE_EQ(y.at(1), beta + a * qc + b * 1 + c * 2);
    EXPECT_DOUBLE_EQ(y.at(2), beta + a * 1 + b * 2 + c * 3);
    EXPECT_EQ(fc.at(0), 2);
    EXPECT_EQ(fc.at(1), 3);
    // SiLU: y = z σ(z)
    p.activation = "silu";
    short_conv_forward(p, impl, y.view(), fc.view());
    const double z0 = beta + a * pc + b * qc + c * 1;
    EXPECT_NEAR(y.at(0), z0 / (1 + std::exp(-z0)), 1e-14);
  }
}

TEST(ShortConvReference, ShortSequenceFinalCacheKeepsNewestCachedInputs) {
  // W = 4, cache [c0, c1, c2], one new token x0: final cache [c1, c2, x0]. Empty sequence: the
  // cache passes through unchanged.
  Tensor x = Tensor::from({1, 1, 1}, {9});
  Tensor w = Tensor::from({1, 4}, {1, 1, 1, 1});
  Tensor cache = Tensor::from({2, 1, 3}, {4, 5, 6, 7, 8, 10});
  Tensor cu = testing::cu_seqlens({1, 0});
  for (Impl impl : {Impl::reference, Impl::chunk}) {
    Tensor y({1, 1, 1}, DType::float64), fc({2, 1, 3}, DType::float64);
    ShortConvParams p;
    p.x = x.view();
    p.weight = w.view();
    p.initial_cache = cache.view();
    p.cu_seqlens = cu.view();
    short_conv_forward(p, impl, y.view(), fc.view());
    EXPECT_EQ(y.at(0), 4 + 5 + 6 + 9);
    EXPECT_EQ(fc.values(), (std::vector<double>{5, 6, 9, 7, 8, 10}));
  }
}

// ---------------------------------------------------------------------------------------------
// Finite differences (float64) of L = Σ y·dy + Σ final_cache·dfc.

double loss(const Inputs& in) {
  const Forward f = run_forward(in, Impl::reference, DType::float64);
  return testing::dot(f.y, in.dy) + testing::dot(f.final_cache, in.dfc);
}

void check_fd(Inputs in, Tensor Inputs::*member, const Tensor& analytic, const char* what) {
  PHASOR_EXPECT_GRADIENT(
      analytic, in.*member, [&] { return loss(in); }, 1e-7, what);
}

TEST(ShortConvReference, GradientsMatchFiniteDifferences) {
  const std::vector<Case> cases = {
      {"w4_cache", 2, 7, 3, 4, {}, true, true, false},
      {"w4_cache_silu", 2, 7, 3, 4, {}, true, true, true},
      {"w2_nocache_silu", 1, 9, 4, 2, {}, true, false, true},
      {"w1", 2, 5, 3, 1, {}, true, true, false},
      {"w1_silu", 2, 5, 3, 1, {}, false, true, true},
      {"varlen_short", 1, 0, 3, 4, {2, 0, 1, 6, 4}, true, true, true},
      {"varlen_nobias", 1, 0, 2, 3, {1, 5, 0, 2}, false, true, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, 11);
    const Backward g = run_backward(in, Impl::reference, DType::float64);
    check_fd(in, &Inputs::x, g.dx, "dx");
    check_fd(in, &Inputs::weight, g.dweight, "dweight");
    if (c.bias) check_fd(in, &Inputs::bias, g.dbias, "dbias");
    if (c.cache && c.W > 1) check_fd(in, &Inputs::cache, g.dcache, "dinitial_cache");
  }
}

// ---------------------------------------------------------------------------------------------
// The kernel against the reference.

std::vector<Case> kernel_cases() {
  return {
      {"w4", 2, 33, 5, 4},
      {"w4_silu", 2, 33, 5, 4, {}, true, true, true},
      {"w4_nocache_nobias", 3, 17, 7, 4, {}, false, false, false},
      {"w1", 2, 20, 6, 1, {}, true, true, true},
      {"w2", 2, 20, 6, 2, {}, true, false, true},
      {"varlen_empty_single", 1, 0, 9, 4, {0, 1, 3, 0, 40, 1, 2}, true, true, true},
      {"varlen_w2", 1, 0, 4, 2, {1, 0, 7, 1}, true, true, false},
      // Lengths just past the kernel's 128-token tiles: the last tile is shorter than W−1.
      {"tile_boundaries", 1, 0, 5, 4, {129, 130, 256, 257, 2}, true, true, true},
      {"many_channel_blocks", 2, 19, 150, 4, {}, true, true, true},
      {"large_inputs_silu", 2, 25, 8, 4, {}, true, true, true, 300.0},
      {"tiny_inputs", 2, 25, 8, 4, {}, true, true, true, 1e-20},
  };
}

TEST(ShortConvKernel, MatchesReference) {
  for (const Case& c : kernel_cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, 5);
    const Forward rf = run_forward(in, Impl::reference, DType::float64);
    const Backward rb = run_backward(in, Impl::reference, DType::float64);
    for (DType dtype : {DType::float64, DType::float32}) {
      for (Impl impl : {Impl::chunk, Impl::recurrent}) {
        SCOPED_TRACE(to_string(dtype));
        const double tol = dtype == DType::float64 ? 1e-13 : 1e-5;
        const Forward f = run_forward(in, impl, dtype);
        PHASOR_EXPECT_CLOSE(f.y, rf.y, tol, "y");
        PHASOR_EXPECT_CLOSE(f.final_cache, rf.final_cache, tol, "final_cache");
        const Backward b = run_backward(in, impl, dtype);
        PHASOR_EXPECT_CLOSE(b.dx, rb.dx, tol, "dx");
        PHASOR_EXPECT_CLOSE(b.dweight, rb.dweight, tol, "dweight");
        if (c.bias) PHASOR_EXPECT_CLOSE(b.dbias, rb.dbias, tol, "dbias");
        if (c.cache) PHASOR_EXPECT_CLOSE(b.dcache, rb.dcache, tol, "dinitial_cache");
      }
    }
    // Without d_final_cache.
    const Backward r0 = run_backward(in, Impl::reference, DType::float64, false);
    const Backward k0 = run_backward(in, Impl::chunk, DType::float64, false);
    PHASOR_EXPECT_CLOSE(k0.dx, r0.dx, 1e-13, "dx without d_final_cache");
    if (c.cache) PHASOR_EXPECT_CLOSE(k0.dcache, r0.dcache, 1e-13, "dcache without d_final_cache");
  }
}

TEST(ShortConvKernel, StridedViewsAndMixedDtypes) {
  // x and y as every other channel of a wider buffer; weight given in float64 with x in float32.
  const Case c{"strided", 2, 13, 5, 4, {}, true, true, true};
  const Inputs in = make_inputs(c, 9);
  const Forward rf = run_forward(in, Impl::reference, DType::float64);
  const testing::MemoryLayout every_other{{}, 0, 2};
  const testing::StridedTensor x(in.x, DType::float32, every_other),
      y_strided = testing::StridedTensor::nans({2, 13, 5}, DType::float32, every_other);
  ASSERT_EQ(x.view().stride(0), 130);
  ShortConvParams p;
  p.x = x.view();
  p.weight = in.weight.view();
  p.bias = in.bias.view();
  p.initial_cache = in.cache.view();
  p.activation = "swish";
  short_conv_forward(p, Impl::chunk, y_strided.view());
  PHASOR_EXPECT_CLOSE(y_strided.gather(), rf.y, 1e-5, "strided y");
  const Tensor& ywide = y_strided.storage();
  for (std::int64_t i = 0; i < rf.y.numel(); ++i) EXPECT_TRUE(std::isnan(ywide.at(2 * i + 1)));
}

TEST(ShortConvKernel, LongSequence) {
  const Case c{"long", 1, testing::long_sequence_length(), 16, 4, {}, true, true, true};
  const Inputs in = make_inputs(c, 3);
  const Forward rf = run_forward(in, Impl::reference, DType::float64);
  const Backward rb = run_backward(in, Impl::reference, DType::float64);
  const Forward f = run_forward(in, Impl::chunk, DType::float32);
  const Backward b = run_backward(in, Impl::chunk, DType::float32);
  PHASOR_EXPECT_CLOSE(f.y, rf.y, 1e-5, "y");
  PHASOR_EXPECT_CLOSE(f.final_cache, rf.final_cache, 1e-5, "final_cache");
  PHASOR_EXPECT_CLOSE(b.dx, rb.dx, 1e-5, "dx");
  PHASOR_EXPECT_CLOSE(b.dweight, rb.dweight, 1e-5, "dweight");
  PHASOR_EXPECT_CLOSE(b.dbias, rb.dbias, 1e-5, "dbias");
  PHASOR_EXPECT_CLOSE(b.dcache, rb.dcache, 1e-5, "dinitial_cache");
}

// ---------------------------------------------------------------------------------------------
// Decoding through the cache equals the parallel forward.

TEST(ShortConvKernel, DecodingTokenByTokenAndInChunksMatchesParallelForward) {
  for (std::int64_t W : {1, 2, 4}) {
    for (bool silu : {false, true}) {
      SCOPED_TRACE("W=" + std::to_string(W) + (silu ? " silu" : ""));
      const Case c{"decode", 2, 11, 6, W, {}, true, true, silu};
      const Inputs in = make_inputs(c, 21);
      const Forward full = run_forward(in, Impl::reference, DType::float64);
      for (std::int64_t step : {1, 2, 3, 11}) {
        SCOPED_TRACE("step=" + std::to_string(step));
        Tensor cache = in.cache;  // updated in place: final_cache aliases initial_cache
        Tensor y({2, 11, 6}, DType::float64);
        for (std::int64_t t0 = 0; t0 < 11; t0 += step) {
          const std::int64_t len = std::min<std::int64_t>(step, 11 - t0);
          Tensor xs({2, len, 6}, DType::float64), ys({2, len, 6}, DType::float64);
          for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t t = 0; t < len; ++t)
              for (std::int64_t d = 0; d < 6; ++d)
                xs.set((b * len + t) * 6 + d, in.x.at((b * 11 + t0 + t) * 6 + d));
          ShortConvParams p;
          p.x = xs.view();
          p.weight = in.weight.view();
          p.bias = in.bias.view();
          p.initial_cache = cache.view();
          p.activation = silu ? "silu" : "none";
          short_conv_forward(p, step == 1 ? Impl::recurrent : Impl::chunk, ys.view(), cache.view());
          for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t t = 0; t < len; ++t)
              for (std::int64_t d = 0; d < 6; ++d)
                y.set((b * 11 + t0 + t) * 6 + d, ys.at((b * len + t) * 6 + d));
        }
        PHASOR_EXPECT_CLOSE(y, full.y, 1e-14, "decoded y");
        PHASOR_EXPECT_CLOSE(cache, full.final_cache, 0.0, "decoded final cache");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bit-identical results for any thread count.

TEST(ShortConvKernel, ThreadCountInvariance) {
  const Case c{"threads", 1, 0, 150, 4, {30, 0, 1, 700, 5, 64}, true, true, true};
  const Inputs in = make_inputs(c, 77);
  for (DType dtype : {DType::float32, DType::float64}) {
    set_num_threads(1);
    const Forward f1 = run_forward(in, Impl::chunk, dtype);
    const Backward b1 = run_backward(in, Impl::chunk, dtype);
    for (int threads : {2, 3, 7}) {
      set_num_threads(threads);
      const Forward f = run_forward(in, Impl::chunk, dtype);
      const Backward b = run_backward(in, Impl::chunk, dtype);
      EXPECT_TRUE(f.y.bit_equal(f1.y)) << threads;
      EXPECT_TRUE(f.final_cache.bit_equal(f1.final_cache)) << threads;
      EXPECT_TRUE(b.dx.bit_equal(b1.dx)) << threads;
      EXPECT_TRUE(b.dweight.bit_equal(b1.dweight)) << threads;
      EXPECT_TRUE(b.dbias.bit_equal(b1.dbias)) << threads;
      EXPECT_TRUE(b.dcache.bit_equal(b1.dcache)) << threads;
    }
  }
  set_num_threads(0);
}

// ---------------------------------------------------------------------------------------------
// Argument validation.

TEST(ShortConvApi, RejectsBadInputs) {
  const Case c{"bad", 2, 5, 3, 4};
  const Inputs in = make_inputs(c, 1);
  Tensor y({2, 5, 3}, DType::float64), fc({2, 3, 3}, DType::float64);
  auto base = [&] { return params_of(in, in.x, in.weight, in.bias, in.cache); };
  using testing::expect_error;

  Tensor x2({2, 5}, DType::float64);
  expect_error(
      [&] {
        auto p = base();
        p.x = x2.view();
        short_conv_forward(p, Impl::chunk, y.view());
      },
      {"causal_conv1d", "'x'", "3-D tensor [B, T, D]"});
  Tensor w_bad({4, 4}, DType::float64);
  expect_error(
      [&] {
        auto p = base();
        p.weight = w_bad.view();
        short_conv_forward(p, Impl::chunk, y.view());
      },
      {"causal_conv1d", "'weight'", "D (as x)=3", "[4, 4]"});
  Tensor w0({3, 0}, DType::float64);
  expect_error(
      [&] {
        auto p = base();
        p.weight = w0.view();
        short_conv_forward(p, Impl::reference, y.view());
      },
      {"short_conv_reference", "'weight'", "W = weight.size(1) >= 1", "W = 0"});
  Tensor b_bad({2}, DType::float64);
  expect_error(
      [&] {
        auto p = base();
        p.bias = b_bad.view();
        short_conv_forward(p, Impl::chunk, y.view());
      },
      {"'bias'", "D (as x)=3"});
  expect_error(
      [&] {
        auto p = base();
        p.activation = "gelu";
        short_conv_forward(p, Impl::recurrent, y.view());
      },
      {"causal_conv1d_update", "'activation'", "\"silu\"", "\"gelu\""});
  Tensor cache_bad({2, 3, 4}, DType::float64);
  expect_error(
      [&] {
        auto p = base();
        p.initial_cache = cache_bad.view();
        short_conv_forward(p, Impl::chunk, y.view());
      },
      {"'initial_cache'", "W-1=3", "[2, 3, 4]"});
  Tensor cu = testing::cu_seqlens({2, 3});
  expect_error(
      [&] {
        auto p = base();
        p.cu_seqlens = cu.view();
        short_conv_forward(p, Impl::chunk, y.view());
      },
      {"causal_conv1d", "cu_seqlens"});
  Tensor xi({2, 5, 3}, DType::int32);
  expect_error(
      [&] {
        auto p = base();
        p.x = xi.view();
        short_conv_forward(p, Impl::chunk, y.view());
      },
      {"'x'", "float32, float64, bfloat16 or float16", "int32"});
  Tensor y_bad({2, 4, 3}, DType::float64);
  expect_error([&] { short_conv_forward(base(), Impl::chunk, y_bad.view()); }, {"'y'", "T=5"});
  Tensor fc_bad({1, 3, 3}, DType::float64);
  expect_error([&] { short_conv_forward(base(), Impl::chunk, y.view(), fc_bad.view()); },
               {"'final_cache'", "N=2"});
  // Backward.
  Tensor dx({2, 5, 3}, DType::float64), dw({3, 4}, DType::float64), dc({2, 3, 3}, DType::float64);
  expect_error(
      [&] {
        short_conv_backward(base(), Impl::chunk, y_bad.view(), {}, {dx.view(), {}, {}, {}});
      },
      {"'dy'", "T=5"});
  expect_error(
      [&] {
        short_conv_backward(base(), Impl::chunk, y.view(), fc_bad.view(), {dx.view(), {}, {}, {}});
      },
      {"'d_final_cache'", "N=2"});
  expect_error(
      [&] {
        short_conv_backward(base(), Impl::chunk, y.view(), {}, {{}, w_bad.view(), {}, {}});
      },
      {"'dweight'", "D=3"});
  expect_error(
      [&] {
        auto p = base();
        p.initial_cache = {};
        short_conv_backward(p, Impl::chunk, y.view(), {}, {{}, {}, {}, dc.view()});
      },
      {"'dinitial_cache'", "initial_cache to be given"});
  expect_error(
      [&] {
        auto p = base();
        p.bias = {};
        short_conv_backward(p, Impl::chunk, y.view(), {}, {{}, {}, b_bad.view(), {}});
      },
      {"'dbias'", "bias to be given"});
}

}  // namespace
}  // namespace phasor
