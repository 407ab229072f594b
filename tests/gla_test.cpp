// Tests of the GLA op (include/phasor/gla.h): the float64 reference against finite differences,
// the recurrent and chunk kernels (forward and backward, float32 and float64) against the
// reference on random and adversarial inputs, a 65,536-token sequence, decoding one token at a
// time, thread-count invariance and argument validation; and the fused rotation by θ (RoPE /
// Selective RoPE) against explicit rotation, finite differences, shift invariance with tied and
// untied gates, the complex-valued recurrence, and RoPE's relative-position property.
#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "phasor/gla.h"
#include "phasor/rotary.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/layout.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Gates {
  realistic,       // log σ(x), x ~ N(2, 1.5): mostly ≈ −0.1, some ≈ −3
  strong,          // −20 everywhere
  mixed_channels,  // −20 on even key channels, ≈ −1e-3 … 0 on odd ones
  zeros,           // realistic with 15% gates of exactly 0 (g = −inf)
  weak,            // ≈ −1e-4
};

Tensor make_gates(Gates kind, const std::vector<std::int64_t>& shape, std::mt19937_64& rng) {
  Tensor g = testing::log_sigmoid_gates(shape, rng, 2.0, 1.5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::int64_t K = shape.back();
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    switch (kind) {
      case Gates::realistic:
        break;
      case Gates::strong:
        g.set(i, -20.0);
        break;
      case Gates::mixed_channels:
        g.set(i, (i % K) % 2 == 0 ? -20.0 : -1e-3 * unit(rng));
        break;
      case Gates::zeros:
        if (unit(rng) < 0.15) g.set(i, -kInf);
        break;
      case Gates::weak:
        g.set(i, -2e-4 * unit(rng));
        break;
    }
  }
  return g;
}

struct Case {
  std::string name;
  std::int64_t B, T, H, K, V;
  Gates gates;
  std::int64_t chunk_size;
  std::vector<std::int64_t> lengths = {};  // non-empty: packed with cu_seqlens (B = 1)
  bool initial_state = true;
  bool d_final_state = true;
  bool strided = false;  // inputs and outputs as non-contiguous views
  // Fused rotation: θ [B, T, H, K/2] given, in this layout. With running_phase, θ is a running
  // sum of per-token phases (Selective RoPE-like, hundreds of radians), else uniform in [−π, π].
  bool rotate = false;
  RotaryLayout layout = RotaryLayout::half_split;
  bool running_phase = false;
};

// GlaGrads without brace initialisation (which would leave members implicit).
GlaGrads make_grads(TensorView dq, TensorView dk, TensorView dv, TensorView dg, TensorView dh0,
                    TensorView dtheta = {}) {
  GlaGrads grads;
  grads.dq = dq;
  grads.dk = dk;
  grads.dv = dv;
  grads.dg = dg;
  grads.dh0 = dh0;
  grads.dtheta = dtheta;
  return grads;
}

// float64 master copies of every input.
struct Inputs {
  Case c;
  std::int64_t N = 0;
  Tensor q, k, v, g, h0, cu, d_o, dht, theta;
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.c = c;
  const testing::Batch batch = testing::batch_of(c.B, c.T, c.lengths);
  in.N = batch.N;
  in.q = testing::randn({c.B, c.T, c.H, c.K}, rng);
  in.k = testing::randn({c.B, c.T, c.H, c.K}, rng);
  in.v = testing::randn({c.B, c.T, c.H, c.V}, rng);
  in.g = make_gates(c.gates, {c.B, c.T, c.H, c.K}, rng);
  if (c.initial_state) in.h0 = testing::randn({in.N, c.H, c.K, c.V}, rng);
  in.cu = batch.cu_seqlens;
  in.d_o = testing::randn({c.B, c.T, c.H, c.V}, rng);
  if (c.d_final_state) in.dht = testing::randn({in.N, c.H, c.K, c.V}, rng);
  if (c.rotate) {
    const double pi = std::acos(-1.0);
    in.theta = testing::uniform({c.B, c.T, c.H, c.K / 2}, rng, c.running_phase ? 0.0 : -pi, pi);
    // Running phase: θ_t = Σ_{s ≤ t} φ_s along T, per (b, h, pair).
    if (c.running_phase) in.theta = testing::cumulative_sum(in.theta, 1);
    // float32-representable angles, so float32 runs see exactly the same θ.
    in.theta = in.theta.to(DType::float32).to(DType::float64);
  }
  return in;
}

// An argument or result in the layout a case asks for: contiguous, or (strided, rank 4) dims 1
// and 2 swapped in memory with every element followed by a gap, so that the view has no unit
// stride and is not contiguous.
testing::MemoryLayout layout_of(const std::vector<std::int64_t>& shape, bool strided) {
  return strided && shape.size() == 4 ? testing::MemoryLayout::swap_1_2(4, 0, 2)
                                      : testing::MemoryLayout::contiguous();
}

testing::StridedTensor make_arg(const Tensor& x, DType dtype, bool strided) {
  return testing::StridedTensor(x, dtype, layout_of(x.shape(), strided));
}

// Outputs start as NaN, so an element a kernel forgets to write fails the comparison.
testing::StridedTensor make_output(const std::vector<std::int64_t>& shape, DType dtype,
                                   bool strided) {
  return testing::StridedTensor::nans(shape, dtype, layout_of(shape, strided));
}

struct Result {
  Tensor o, final_state, dq, dk, dv, dg, dh0, dtheta;
  Tensor chunk_states;  // when run() was asked to keep them (not among fields())
  testing::NamedTensors fields() const {
    return {{"o", &o},     {"final_state", &final_state},
            {"dq", &dq},   {"dk", &dk},
            {"dv", &dv},   {"dg", &dg},
            {"dh0", &dh0}, {"dtheta", &dtheta}};
  }
};

// Runs forward (o, final_state) and backward (every gradient) of one implementation.
// in_dtype: the dtype of every floating input; out_dtype: of every output. With chunk_states, the
// forward keeps them in that dtype (NaN where it writes nothing) and the backward reads them.
Result run(const Inputs& in, Impl impl, DType in_dtype, DType out_dtype,
           std::optional<DType> chunk_states = std::nullopt) {
  const Case& c = in.c;
  const bool s = c.strided;
  using testing::StridedTensor;
  StridedTensor q = make_arg(in.q, in_dtype, s), k = make_arg(in.k, in_dtype, s),
                v = make_arg(in.v, in_dtype, s), g = make_arg(in.g, in_dtype, s),
                h0 = make_arg(in.h0, in_dtype, s), d_o = make_arg(in.d_o, in_dtype, s),
                dht = make_arg(in.dht, in_dtype, s), theta = make_arg(in.theta, in_dtype, s);
  GlaParams params;
  params.q = q.view();
  params.k = k.view();
  params.v = v.view();
  params.g = g.view();
  params.initial_state = h0.view();
  params.cu_seqlens = in.cu.view();
  params.chunk_size = c.chunk_size;
  params.theta = theta.view();
  params.rotary_layout = c.layout;

  const std::vector<std::int64_t> qk_shape{c.B, c.T, c.H, c.K}, v_shape{c.B, c.T, c.H, c.V},
      state_shape{in.N, c.H, c.K, c.V};
  StridedTensor o = make_output(v_shape, out_dtype, s),
                final_state = make_output(state_shape, out_dtype, s);
  StridedTensor kept;
  if (chunk_states)
    kept = make_output({num_chunk_states(params.q, params.cu_seqlens, c.chunk_size), c.H, c.K, c.V},
                       *chunk_states, s);
  gla_forward(params, impl, o.view(), final_state.view(), kept.view());

  StridedTensor dq = make_output(qk_shape, out_dtype, s), dk = make_output(qk_shape, out_dtype, s),
                dv = make_output(v_shape, out_dtype, s), dg = make_output(qk_shape, out_dtype, s);
  StridedTensor dh0, dtheta;
  if (c.initial_state) dh0 = make_output(state_shape, out_dtype, s);
  if (in.theta.defined()) dtheta = make_output(in.theta.shape(), out_dtype, s);
  gla_backward(params, impl, d_o.view(), dht.view(),
               make_grads(dq.view(), dk.view(), dv.view(), dg.view(), dh0.view(), dtheta.view()),
               kept.view());
  Result r;
  r.chunk_states = kept.gather();
  r.o = o.gather();
  r.final_state = final_state.gather();
  r.dq = dq.gather();
  r.dk = dk.gather();
  r.dv = dv.gather();
  r.dg = dg.gather();
  r.dh0 = dh0.gather();
  r.dtheta = dtheta.gather();
  return r;
}

// The largest relative RMS error of a comparison, for the test log.
double worst_error(const Result& actual, const Result& expected) {
  return testing::worst_rel_rms(actual.fields(), expected.fields());
}

void expect_close(const Result& actual, const Result& expected, double tol) {
  testing::expect_close(actual.fields(), expected.fields(), tol);
}

void expect_bit_equal(const Result& a, const Result& b, const std::string& what) {
  testing::expect_bit_equal(a.fields(), b.fields(), what);
}

// ---------------------------------------------------------------------------------------------
// Reference against central finite differences (float64).

// Plain float64 params of a case's master inputs (contiguous views).
GlaParams plain_params(const Inputs& in) {
  GlaParams params;
  params.q = in.q.view();
  params.k = in.k.view();
  params.v = in.v.view();
  params.g = in.g.view();
  params.initial_state = in.h0.view();
  params.cu_seqlens = in.cu.view();
  params.chunk_size = in.c.chunk_size;
  params.theta = in.theta.view();
  params.rotary_layout = in.c.layout;
  return params;
}

// loss = Σ o · do + Σ final_state · dht, computed by `impl` in float64 (the reference unless
// told otherwise).
double reference_loss(const Inputs& in, Impl impl = Impl::reference) {
  const Case& c = in.c;
  const GlaParams params = plain_params(in);
  Tensor o({c.B, c.T, c.H, c.V}, DType::float64), fin({in.N, c.H, c.K, c.V}, DType::float64);
  gla_forward(params, impl, o.view(), fin.view());
  double loss = testing::dot(o, in.d_o);
  if (in.dht.defined()) loss += testing::dot(fin, in.dht);
  return loss;
}

void check_reference_against_finite_differences(const Case& c) {
  SCOPED_TRACE(c.name);
  Inputs in = make_inputs(c, 11);
  // Central differences need g ± h ≤ 0 (and finite): keep gates in [−3, −0.01].
  for (std::int64_t i = 0; i < in.g.numel(); ++i)
    in.g.set(i, std::min(-0.01, std::max(-3.0, in.g.at(i))));
  const Result analytic = run(in, Impl::reference, DType::float64, DType::float64);
  const double tol = 1e-7;
  const auto loss = [&] { return reference_loss(in); };
  PHASOR_EXPECT_GRADIENT(analytic.dq, in.q, loss, tol, "dq");
  PHASOR_EXPECT_GRADIENT(analytic.dk, in.k, loss, tol, "dk");
  PHASOR_EXPECT_GRADIENT(analytic.dv, in.v, loss, tol, "dv");
  PHASOR_EXPECT_GRADIENT(analytic.dg, in.g, loss, tol, "dg");
  if (c.initial_state) PHASOR_EXPECT_GRADIENT(analytic.dh0, in.h0, loss, tol, "dh0");
}

TEST(GlaReference, GradientsMatchFiniteDifferences) {
  check_reference_against_finite_differences({"batch", 2, 7, 2, 3, 4, Gates::realistic, 64});
}

TEST(GlaReference, GradientsMatchFiniteDifferencesVarlen) {
  check_reference_against_finite_differences(
      {"varlen", 1, 11, 2, 4, 3, Gates::realistic, 64, {3, 0, 6, 1, 0, 1}});
}

TEST(GlaReference, GradientsMatchFiniteDifferencesWithoutStateGradient) {
  Case c{"no dht", 1, 9, 1, 5, 3, Gates::realistic, 64};
  c.d_final_state = false;
  check_reference_against_finite_differences(c);
}

// A hand-computed instance of the recurrence (K = V = 1, scale 1): guards the reference itself
// against a convention error that finite differences would not reveal.
TEST(GlaReference, MatchesHandComputedRecurrence) {
  Tensor q = Tensor::from({1, 3, 1, 1}, {1, 2, -1}), k = Tensor::from({1, 3, 1, 1}, {0.5, 1, 2}),
         v = Tensor::from({1, 3, 1, 1}, {2, -1, 3}),
         g = Tensor::from({1, 3, 1, 1}, {std::log(0.5), -kInf, std::log(0.25)}),
         h0 = Tensor::from({1, 1, 1, 1}, {4});
  GlaParams params;
  params.q = q.view();
  params.k = k.view();
  params.v = v.view();
  params.g = g.view();
  params.initial_state = h0.view();
  params.scale = 1.0;
  Tensor o({1, 3, 1, 1}, DType::float64), fin({1, 1, 1, 1}, DType::float64);
  gla_forward(params, Impl::reference, o.view(), fin.view());
  // S1 = 0.5·4 + 0.5·2 = 3, o1 = 3; S2 = 0·3 + 1·(−1) = −1, o2 = −2; S3 = −0.25 + 6 = 5.75, o3 =
  // −5.75.
  EXPECT_DOUBLE_EQ(o.at(0), 3.0);
  EXPECT_DOUBLE_EQ(o.at(1), -2.0);
  EXPECT_DOUBLE_EQ(o.at(2), -5.75);
  EXPECT_DOUBLE_EQ(fin.at(0), 5.75);
}

// ---------------------------------------------------------------------------------------------
// Recurrent and chunk against the reference.

std::vector<Case> kernel_cases() {
  std::vector<Case> cases = {
      {"random", 2, 37, 2, 8, 6, Gates::realistic, 16},
      {"random_chunk64", 1, 150, 2, 8, 8, Gates::realistic, 64},
      {"strong_gates", 1, 70, 2, 5, 7, Gates::strong, 64},
      {"strong_gates_chunk7", 2, 30, 1, 4, 4, Gates::strong, 7},
      {"mixed_channels", 1, 75, 2, 6, 5, Gates::mixed_channels, 64},
      {"mixed_channels_chunk128", 1, 150, 1, 8, 8, Gates::mixed_channels, 128},
      {"zero_gates", 2, 69, 1, 5, 6, Gates::zeros, 64},
      {"zero_gates_chunk7", 1, 45, 2, 4, 3, Gates::zeros, 7},
      {"weak_gates", 1, 90, 2, 6, 6, Gates::weak, 64},
      {"chunk1", 1, 23, 2, 4, 5, Gates::realistic, 1},
      {"chunk7", 1, 67, 1, 4, 5, Gates::realistic, 7},
      {"chunk16", 1, 67, 1, 4, 5, Gates::zeros, 16},
      {"chunk64_partial", 1, 67, 1, 4, 5, Gates::realistic, 64},
      {"chunk40_partial_subblocks", 1, 100, 1, 8, 8, Gates::realistic, 40},
      {"chunk_longer_than_T", 2, 20, 1, 4, 4, Gates::realistic, 64},
      {"chunk_huge", 1, 20, 1, 4, 4, Gates::realistic, std::numeric_limits<std::int64_t>::max()},
      {"T1", 2, 1, 2, 4, 3, Gates::realistic, 64},
      {"K1", 1, 33, 2, 1, 4, Gates::realistic, 16},
      {"K_less_than_V", 1, 40, 1, 3, 9, Gates::realistic, 16},
      {"V_less_than_K", 1, 40, 1, 9, 2, Gates::zeros, 16},
      {"varlen", 1, 53, 2, 4, 5, Gates::realistic, 16, {5, 0, 1, 17, 0, 30}},
      {"varlen_strong", 1, 53, 1, 4, 5, Gates::strong, 16, {1, 0, 40, 12}},
      {"varlen_trailing_empty", 1, 19, 1, 3, 3, Gates::zeros, 8, {19, 0}},
      // V = 16, 48, 128: the recurrent forward's float32 step with o in registers (AVX-512).
      {"V16_strong", 1, 40, 2, 5, 16, Gates::strong, 16},
      {"V48_mixed_channels", 1, 33, 1, 7, 48, Gates::mixed_channels, 8, {20, 0, 13}},
      {"V128_T1", 2, 1, 1, 3, 128, Gates::realistic, 64},
      {"V128", 1, 21, 2, 9, 128, Gates::zeros, 16},
      // K = 16, 48, 64, 128: the chunk backward's float32 diagonal blocks in registers (AVX-512),
      // with partial sub-blocks (chunk 40, T not a multiple of 16) and a one-token sub-block.
      {"K16_strong", 1, 45, 2, 16, 5, Gates::strong, 16},
      {"K48_mixed_channels_chunk40", 1, 100, 1, 48, 7, Gates::mixed_channels, 40},
      {"K64_zero_gates_varlen", 1, 53, 1, 64, 3, Gates::zeros, 64, {5, 0, 1, 17, 0, 30}},
      {"K128_weak_gates", 1, 81, 1, 128, 6, Gates::weak, 64},
  };
  Case no_state{"no_initial_state", 2, 29, 2, 5, 4, Gates::realistic, 8};
  no_state.initial_state = false;
  no_state.d_final_state = false;
  cases.push_back(no_state);
  Case varlen_no_state{"varlen_no_state", 1, 26, 1, 4, 4, Gates::mixed_channels, 8, {0, 9, 1, 16}};
  varlen_no_state.initial_state = false;
  cases.push_back(varlen_no_state);
  Case strided{"strided", 2, 45, 3, 6, 5, Gates::realistic, 16};
  strided.strided = true;
  cases.push_back(strided);
  Case strided_varlen{"strided_varlen", 1, 45, 2, 5, 6, Gates::zeros, 16, {20, 0, 25}};
  strided_varlen.strided = true;
  cases.push_back(strided_varlen);
  return cases;
}

TEST(GlaKernels, MatchReferenceOnRandomAndAdversarialInputs) {
  std::uint64_t seed = 100;
  double worst[2][2] = {};  // [float32, float64][recurrent, chunk]
  for (const Case& c : kernel_cases()) {
    const Inputs in = make_inputs(c, seed++);
    for (DType dtype : {DType::float32, DType::float64}) {
      const Result expected = run(in, Impl::reference, dtype, DType::float64);
      const double tol = dtype == DType::float32 ? 1e-5 : 1e-10;
      // With the kernels' subnormals flushed (the default) and with gradual underflow: strong
      // gates' decay factors go subnormal, and the bound holds either way.
      for (bool flush : testing::kFlushDenormalModes) {
        const testing::FlushDenormalsScope modes(flush);
        for (Impl impl : {Impl::recurrent, Impl::chunk}) {
          SCOPED_TRACE(c.name + " " + to_string(impl) + " " + to_string(dtype) +
                       (flush ? " flushing subnormals" : " gradual underflow"));
          const Result actual = run(in, impl, dtype, dtype);
          expect_close(actual, expected, tol);
          double& w = worst[dtype == DType::float64][impl == Impl::chunk];
          w = std::max(w, worst_error(actual, expected));
        }
      }
    }
  }
  std::printf(
      "worst relative RMS error vs reference: float32 recurrent %.2g, chunk %.2g; "
      "float64 recurrent %.2g, chunk %.2g\n",
      worst[0][0], worst[0][1], worst[1][0], worst[1][1]);
}

// Degenerate sizes: no tokens at all (T = 0, or only empty packed sequences), and K = 0 or
// V = 0. Outputs are zero-sized or zero; final_state = initial_state; dh0 = d_final_state.
TEST(GlaKernels, EmptySequencesAndZeroSizedHeads) {
  std::vector<Case> cases = {{"T0", 2, 0, 2, 3, 4, Gates::realistic, 16},
                             {"all_empty", 1, 0, 2, 3, 4, Gates::realistic, 16, {0, 0, 0}},
                             {"K0", 1, 9, 1, 0, 3, Gates::realistic, 4},
                             {"V0", 1, 9, 1, 3, 0, Gates::realistic, 4}};
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, 1);
    const Result expected = run(in, Impl::reference, DType::float64, DType::float64);
    if (c.T == 0) {
      EXPECT_TRUE(expected.final_state.bit_equal(in.h0)) << c.name;
      EXPECT_TRUE(expected.dh0.bit_equal(in.dht)) << c.name;
    }
    for (Impl impl : {Impl::recurrent, Impl::chunk})
      for (DType dtype : {DType::float32, DType::float64}) {
        SCOPED_TRACE(c.name + " " + to_string(impl) + " " + to_string(dtype));
        expect_close(run(in, impl, dtype, dtype), expected, dtype == DType::float32 ? 1e-6 : 1e-12);
      }
  }
}

// The compute type is q's dtype; every other argument may have its own.
TEST(GlaKernels, MixedDtypes) {
  const Inputs in = make_inputs({"mixed", 1, 40, 2, 6, 5, Gates::zeros, 16}, 7);
  const Result expected = run(in, Impl::reference, DType::float64, DType::float64);
  for (Impl impl : {Impl::recurrent, Impl::chunk}) {
    SCOPED_TRACE(to_string(impl));
    Tensor q = in.q.to(DType::float32), k = in.k, v = in.v.to(DType::float32), g = in.g,
           h0 = in.h0.to(DType::float32), d_o = in.d_o, dht = in.dht.to(DType::float32);
    GlaParams params;
    params.q = q.view();
    params.k = k.view();
    params.v = v.view();
    params.g = g.view();
    params.initial_state = h0.view();
    params.chunk_size = 16;
    Result r;
    r.o = Tensor({1, 40, 2, 5}, DType::float64);
    r.final_state = Tensor({1, 2, 6, 5}, DType::float32);
    gla_forward(params, impl, r.o.view(), r.final_state.view());
    r.dq = Tensor({1, 40, 2, 6}, DType::float32);
    r.dk = Tensor({1, 40, 2, 6}, DType::float64);
    r.dv = Tensor({1, 40, 2, 5}, DType::float32);
    r.dg = Tensor({1, 40, 2, 6}, DType::float64);
    r.dh0 = Tensor({1, 2, 6, 5}, DType::float64);
    gla_backward(params, impl, d_o.view(), dht.view(),
                 make_grads(r.dq.view(), r.dk.view(), r.dv.view(), r.dg.view(), r.dh0.view()));
    // float32 compute on float64-rounded-to-float32 inputs: compare with the float64 reference
    // on the original inputs, so the input rounding (~3e-8) is included.
    expect_close(r, expected, 1e-5);
  }
}

// Requesting a subset of the gradients gives the same values, and no other output is touched.
TEST(GlaKernels, PartialGradientsAndOptionalOutputs) {
  const Inputs in = make_inputs({"partial", 1, 50, 2, 4, 4, Gates::realistic, 16}, 9);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    SCOPED_TRACE(to_string(impl));
    const Result full = run(in, impl, DType::float64, DType::float64);
    GlaParams params;
    params.q = in.q.view();
    params.k = in.k.view();
    params.v = in.v.view();
    params.g = in.g.view();
    params.initial_state = in.h0.view();
    params.chunk_size = 16;
    Tensor o({1, 50, 2, 4}, DType::float64);
    gla_forward(params, impl, o.view());  // no final_state
    EXPECT_TRUE(o.bit_equal(full.o));
    Tensor dg({1, 50, 2, 4}, DType::float64), dh0({1, 2, 4, 4}, DType::float64);
    gla_backward(params, impl, in.d_o.view(), in.dht.view(), make_grads({}, {}, {}, dg.view(), {}));
    EXPECT_TRUE(dg.bit_equal(full.dg));
    gla_backward(params, impl, in.d_o.view(), in.dht.view(),
                 make_grads({}, {}, {}, {}, dh0.view()));
    EXPECT_TRUE(dh0.bit_equal(full.dh0));
  }
}

// ---------------------------------------------------------------------------------------------
// A long sequence: T = 65,536 with realistic gates plus strong and zero ones.

TEST(GlaKernels, LongSequenceChunkMatchesRecurrent) {
  const std::int64_t T = testing::long_sequence_length(), K = 16, V = 16;
  Case c{"long", 1, T, 1, K, V, Gates::realistic, 64};
  Inputs in = make_inputs(c, 2024);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::int64_t i = 0; i < in.g.numel(); ++i) {
    const double u = unit(rng);
    if (u < 0.01)
      in.g.set(i, -20.0);
    else if (u < 0.02)
      in.g.set(i, -kInf);
  }
  // float64: the two algorithms agree to rounding.
  const Result recurrent64 = run(in, Impl::recurrent, DType::float64, DType::float64);
  const Result chunk64 = run(in, Impl::chunk, DType::float64, DType::float64);
  expect_close(chunk64, recurrent64, 1e-10);
  std::printf("T = %lld, float64 chunk vs recurrent: worst relative RMS %.2g\n",
              static_cast<long long>(T), worst_error(chunk64, recurrent64));
  // The reference forward (cheap) confirms the recurrent one.
  GlaParams params;
  params.q = in.q.view();
  params.k = in.k.view();
  params.v = in.v.view();
  params.g = in.g.view();
  params.initial_state = in.h0.view();
  Tensor o({1, T, 1, V}, DType::float64), fin({1, 1, K, V}, DType::float64);
  gla_forward(params, Impl::reference, o.view(), fin.view());
  PHASOR_EXPECT_CLOSE(recurrent64.o, o, 1e-12, "recurrent o vs reference");
  PHASOR_EXPECT_CLOSE(recurrent64.final_state, fin, 1e-12, "recurrent final vs reference");
  // float32 kernels against the float64 results.
  for (Impl impl : {Impl::recurrent, Impl::chunk}) {
    SCOPED_TRACE(std::string("float32 ") + to_string(impl));
    const Result r32 = run(in, impl, DType::float32, DType::float32);
    expect_close(r32, recurrent64, 1e-5);
    std::printf("T = %lld, float32 %s vs float64: worst relative RMS %.2g\n",
                static_cast<long long>(T), to_string(impl), worst_error(r32, recurrent64));
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding: the recurrent kernel one token at a time, the state fed back.

// The [B, 1, H, D] slice of token t of a [B, T, H, D] tensor.
TensorView token(const Tensor& x, std::int64_t t) {
  return testing::token(x.view(), t);
}

TEST(GlaKernels, DecodingOneTokenAtATimeMatchesChunkForward) {
  const std::int64_t B = 2, T = 20, H = 2, K = 4, V = 5;
  for (DType dtype : {DType::float64, DType::float32}) {
    for (bool in_place : {true, false}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + (in_place ? " in place" : " ping-pong"));
      Inputs in64 = make_inputs({"decode", B, T, H, K, V, Gates::zeros, 64}, 3);
      Tensor q = in64.q.to(dtype), k = in64.k.to(dtype), v = in64.v.to(dtype), g = in64.g.to(dtype),
             h0 = in64.h0.to(dtype);
      GlaParams full;
      full.q = q.view();
      full.k = k.view();
      full.v = v.view();
      full.g = g.view();
      full.initial_state = h0.view();
      full.chunk_size = 8;
      Tensor o_chunk({B, T, H, V}, dtype), fin_chunk({B, H, K, V}, dtype);
      gla_forward(full, Impl::chunk, o_chunk.view(), fin_chunk.view());

      Tensor o_steps({B, T, H, V}, dtype);
      Tensor state = h0, other = h0;
      for (std::int64_t t = 0; t < T; ++t) {
        GlaParams step = full;
        step.q = token(q, t);
        step.k = token(k, t);
        step.v = token(v, t);
        step.g = token(g, t);
        step.initial_state = state.view();
        gla_forward(step, Impl::recurrent, token(o_steps, t),
                    in_place ? state.view() : other.view());
        if (!in_place) std::swap(state, other);
      }
      const double tol = dtype == DType::float64 ? 1e-12 : 1e-5;
      PHASOR_EXPECT_CLOSE(o_steps, o_chunk, tol, "o");
      PHASOR_EXPECT_CLOSE(state, fin_chunk, tol, "final state");
    }
  }
}

// Decoding with the state kept in final_state (aligned, in place) equals decoding through an owned
// copy (misaligned), bit for bit, with final_state = initial_state and with separate buffers.
TEST(GlaKernels, StatesInPlaceEqualOwnedCopies) {
  for (auto [K, V] : {std::pair<std::int64_t, std::int64_t>{16, 16}, {5, 3}}) {
    const std::int64_t B = 2, T = 12, H = 2;
    const Inputs in64 = make_inputs({"in_place", B, T, H, K, V, Gates::realistic, 64}, 8);
    for (DType dtype : {DType::float64, DType::float32}) {
      const Tensor q = in64.q.to(dtype), k = in64.k.to(dtype), v = in64.v.to(dtype),
                   g = in64.g.to(dtype);
      std::vector<Tensor> outputs, states;
      for (int mode = 0; mode < 4; ++mode) {  // {aligned, misaligned} × {aliased, separate}
        const bool aligned = mode % 2 == 0, aliased = mode < 2;
        testing::AlignedCopy state(in64.h0.to(dtype), aligned), other(in64.h0.to(dtype), aligned);
        Tensor o({B, T, H, V}, dtype);
        for (std::int64_t t = 0; t < T; ++t) {
          GlaParams step;
          step.q = token(q, t);
          step.k = token(k, t);
          step.v = token(v, t);
          step.g = token(g, t);
          step.initial_state = state.view;
          gla_forward(step, Impl::recurrent, token(o, t), aliased ? state.view : other.view);
          if (!aliased) std::swap(state.view, other.view);
        }
        outputs.push_back(o);
        states.push_back(state.tensor());
      }
      testing::expect_in_place_runs_bit_equal(outputs, states, dtype, K);
    }
  }
}

// final_state aliasing initial_state for a whole sequence, in every implementation.
TEST(GlaKernels, FinalStateMayAliasInitialState) {
  const Inputs in = make_inputs({"alias", 2, 30, 2, 4, 4, Gates::realistic, 8}, 4);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    SCOPED_TRACE(to_string(impl));
    const Result separate = run(in, impl, DType::float64, DType::float64);
    Tensor state = in.h0;
    GlaParams params;
    params.q = in.q.view();
    params.k = in.k.view();
    params.v = in.v.view();
    params.g = in.g.view();
    params.initial_state = state.view();
    params.chunk_size = 8;
    Tensor o({2, 30, 2, 4}, DType::float64);
    gla_forward(params, impl, o.view(), state.view());
    EXPECT_TRUE(o.bit_equal(separate.o));
    EXPECT_TRUE(state.bit_equal(separate.final_state));
  }
}

// ---------------------------------------------------------------------------------------------
// Threads: bit-identical for 1, 2 and 3 threads and from run to run.

TEST(GlaKernels, ThreadCountInvariance) {
  const Inputs in = make_inputs({"threads", 2, 77, 3, 8, 8, Gates::zeros, 16}, 8);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    for (DType dtype : {DType::float32, DType::float64}) {
      SCOPED_TRACE(std::string(to_string(impl)) + " " + to_string(dtype));
      set_num_threads(1);
      const Result one = run(in, impl, dtype, dtype);
      for (int threads : {2, 3}) {
        set_num_threads(threads);
        expect_bit_equal(run(in, impl, dtype, dtype), one, std::to_string(threads) + " threads");
      }
      expect_bit_equal(run(in, impl, dtype, dtype), one, "second run with 3 threads");
    }
  }
  set_num_threads(0);
}

// The chunk kernels walk one (sequence, head) item per thread when the items keep every thread
// busy, and parallelise over chunks when they do not (scans over chunks between the phases): one
// thread runs the former on these cases, 2–8 threads the latter. Both must give the same bits,
// with one item (T = 300 at chunk 2: 150 chunks, windows of at most 64: three windows for the
// forward and for the backward's replay and walk back), a varlen batch with empty and one-token
// sequences, rotation and strided views, and V = 150 (the scans' three tiles of value columns, the
// last partial) with sequences of different window counts.
TEST(GlaKernels, ChunkParallelScheduleIsBitIdentical) {
  Case one_item{"one_item_150_chunks", 1, 300, 1, 6, 5, Gates::realistic, 2};
  one_item.rotate = true;
  one_item.running_phase = true;
  Case varlen{"varlen", 1, 97, 1, 8, 4, Gates::mixed_channels, 8, {40, 0, 1, 56}};
  varlen.strided = true;
  Case two_heads{"two_heads_no_states", 1, 130, 2, 4, 7, Gates::strong, 16};
  two_heads.initial_state = false;
  two_heads.d_final_state = false;
  Case tiles{"value_tiles_windows_varlen", 1, 301,          1, 5, 150,
             Gates::mixed_channels,        2, {140, 0, 161}};
  for (const Case& c : {one_item, varlen, two_heads, tiles}) {
    const Inputs in = make_inputs(c, 31);
    for (DType dtype : {DType::float32, DType::float64}) {
      SCOPED_TRACE(c.name + " " + to_string(dtype));
      set_num_threads(1);
      const Result by_item = run(in, Impl::chunk, dtype, dtype);
      for (int threads : {2, 3, 8}) {
        set_num_threads(threads);
        expect_bit_equal(run(in, Impl::chunk, dtype, dtype), by_item,
                         std::to_string(threads) + " threads");
      }
    }
  }
  set_num_threads(0);
}

// The chunk forward walks groups of consecutive heads chunk by chunk (forward_heads), as many per
// group as still leave a group per thread, and so does the backward when the forward kept the
// chunk states (backward_heads; without them it walks single heads): here 9 items (3 sequences ×
// 3 heads) give groups of 3 heads on 1 and 2 threads and single heads on 4. Same bits either way,
// kept states or not, with varlen sequences (one empty, one shorter than a chunk), initial states,
// rotation and strided views.
TEST(GlaKernels, ChunkHeadGroupsAreBitIdentical) {
  Case c{"head_groups", 1, 61, 3, 12, 10, Gates::mixed_channels, 8, {37, 0, 5, 19}};
  c.strided = true;
  c.rotate = true;
  const Inputs in = make_inputs(c, 47);
  const Result expected = run(in, Impl::reference, DType::float64, DType::float64);
  for (DType dtype : {DType::float32, DType::float64}) {
    SCOPED_TRACE(to_string(dtype));
    set_num_threads(1);
    const Result groups_of_three = run(in, Impl::chunk, dtype, dtype);
    for (int threads : {1, 2, 4}) {
      set_num_threads(threads);
      if (threads > 1)
        expect_bit_equal(run(in, Impl::chunk, dtype, dtype), groups_of_three,
                         std::to_string(threads) + " threads");
      expect_bit_equal(run(in, Impl::chunk, dtype, dtype, dtype), groups_of_three,
                       std::to_string(threads) + " threads, chunk states kept");
    }
    // And the reference agrees (the groups compute every head, not only the first of each).
    expect_close(groups_of_three, expected, dtype == DType::float32 ? 1e-6 : 1e-12);
  }
  set_num_threads(0);
}

// The chunk backward keeps each thread's buffers (the states before every chunk) across calls,
// and releases them after an item where they exceed 8 MiB: a small call, a large one (T = 600,
// K = V = 192 in float64: 38 states of 288 KiB, 11 MiB), the small one again and the large one
// again, on 1 and 2 threads: each as the reference computes it, and the same bits when repeated.
TEST(GlaKernels, BuffersKeptAcrossCallsOfChangingSize) {
  const Inputs small = make_inputs({"small", 2, 50, 2, 8, 8, Gates::mixed_channels, 16}, 53);
  const Inputs large = make_inputs({"large", 1, 600, 1, 192, 192, Gates::mixed_channels, 16}, 59);
  const Result small_ref = run(small, Impl::reference, DType::float64, DType::float64);
  const Result large_ref = run(large, Impl::reference, DType::float64, DType::float64);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const std::string on = " on " + std::to_string(threads) + " threads";
    const Result s1 = run(small, Impl::chunk, DType::float64, DType::float64);
    const Result l1 = run(large, Impl::chunk, DType::float64, DType::float64);
    const Result s2 = run(small, Impl::chunk, DType::float64, DType::float64);
    const Result l2 = run(large, Impl::chunk, DType::float64, DType::float64);
    SCOPED_TRACE(on);
    expect_close(s1, small_ref, 1e-12);
    expect_close(l1, large_ref, 1e-12);
    expect_bit_equal(s2, s1, "small again" + on);
    expect_bit_equal(l2, l1, "large again" + on);
  }
  set_num_threads(0);
}

// ---------------------------------------------------------------------------------------------
// Chunk states kept by the forward for the backward (chunk_states).

// Kept in the compute dtype, they change no bit: the forward's o and final state and the
// backward's gradients are those of the calls without them, on every kernel case (varlen, strided,
// partial chunks, chunk sizes 1 … 128, strong and zero gates), with rotation, and with one item
// of 150 chunks, both by item (one thread) and by chunk (8 threads for few items: three windows).
TEST(GlaChunkStates, KeptStatesChangeNoBit) {
  std::vector<Case> cases = kernel_cases();
  Case rotated{"rotated", 1, 130, 2, 6, 5, Gates::mixed_channels, 16};
  rotated.rotate = true;
  rotated.running_phase = true;
  cases.push_back(rotated);
  cases.push_back({"one_item_150_chunks", 1, 300, 1, 6, 5, Gates::realistic, 2});
  std::uint64_t seed = 500;
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, seed++);
    for (DType dtype : {DType::float32, DType::float64}) {
      for (int threads : {1, 8}) {
        set_num_threads(threads);
        SCOPED_TRACE(c.name + " " + to_string(dtype) + " on " + std::to_string(threads) +
                     " threads");
        expect_bit_equal(run(in, Impl::chunk, dtype, dtype, dtype),
                         run(in, Impl::chunk, dtype, dtype), "with chunk states");
      }
    }
  }
  set_num_threads(0);
}

// Each kept state is the state entering its chunk: the reference's final state after the tokens
// of the sequence before that chunk (float64), at the documented index (phasor/common.h); a packed
// batch leaves the indices between two sequences' chunks unwritten (NaN here). Batch rows, packed
// sequences (empty, one token, several chunks), no initial state, rotation, a chunk longer than
// T, both schedules.
TEST(GlaChunkStates, AreTheStatesEnteringEachChunk) {
  Case rows{"rows", 2, 37, 2, 5, 4, Gates::realistic, 8};
  Case packed{"packed", 1, 53, 2, 4, 5, Gates::zeros, 16, {5, 0, 1, 17, 0, 30}};
  Case no_state{"packed_no_state", 1, 26, 1, 4, 4, Gates::mixed_channels, 8, {0, 9, 1, 16}};
  no_state.initial_state = false;
  Case rotated{"rotated_rows", 2, 40, 1, 6, 3, Gates::strong, 16};
  rotated.rotate = true;
  Case longer{"chunk_longer_than_T", 2, 20, 1, 4, 4, Gates::realistic, 64};
  std::uint64_t seed = 600;
  for (const Case& c : {rows, packed, no_state, rotated, longer}) {
    const Inputs in = make_inputs(c, seed++);
    for (int threads : {1, 8}) {
      set_num_threads(threads);
      SCOPED_TRACE(c.name + " on " + std::to_string(threads) + " threads");
      const Result r = run(in, Impl::chunk, DType::float64, DType::float64, DType::float64);
      const testing::BatchChunks chunks = testing::batch_chunks(c.B, c.T, in.cu, c.chunk_size);
      testing::expect_chunk_states(
          r.chunk_states, chunks, [&](const testing::BatchChunk& chunk, const Tensor& kept) {
            // The sequence's tokens before the chunk alone, from its initial state.
            const auto before = [&](const Tensor& x) {
              return x.defined() ? testing::narrow(testing::narrow(x.view(), 0, chunk.batch, 1), 1,
                                                   chunk.start, chunk.before)
                                 : TensorView{};
            };
            GlaParams p;
            p.q = before(in.q);
            p.k = before(in.k);
            p.v = before(in.v);
            p.g = before(in.g);
            p.theta = before(in.theta);
            p.rotary_layout = c.layout;
            if (in.h0.defined()) p.initial_state = testing::narrow(in.h0.view(), 0, chunk.n, 1);
            Tensor o({1, chunk.before, c.H, c.V}, DType::float64),
                state({1, c.H, c.K, c.V}, DType::float64);
            gla_forward(p, Impl::reference, o.view(), state.view());
            PHASOR_EXPECT_CLOSE(
                kept, state, 1e-12,
                "sequence " + std::to_string(chunk.n) + ", slot " + std::to_string(chunk.slot));
          });
    }
  }
  set_num_threads(0);
}

// In a 16-bit dtype each state is rounded once: the forward is unchanged (bit for bit) and the
// gradients stay close to the float64 reference, within the rounding of that dtype.
TEST(GlaChunkStates, SixteenBitStates) {
  Case c{"sixteen_bit", 2, 100, 2, 8, 8, Gates::realistic, 16};
  const Inputs in = make_inputs(c, 700);
  const Result expected = run(in, Impl::reference, DType::float64, DType::float64);
  const Result plain = run(in, Impl::chunk, DType::float32, DType::float32);
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    SCOPED_TRACE(to_string(dtype));
    const Result kept = run(in, Impl::chunk, DType::float32, DType::float32, dtype);
    EXPECT_TRUE(kept.o.bit_equal(plain.o));
    EXPECT_TRUE(kept.final_state.bit_equal(plain.final_state));
    // Within one unit roundoff of the states' dtype (2^-8, 2^-11).
    expect_close(kept, expected, dtype == DType::bfloat16 ? 0x1p-8 : 0x1p-11);
    std::printf("chunk states in %s: worst relative RMS error vs reference %.2g (float32: %.2g)\n",
                to_string(dtype), worst_error(kept, expected), worst_error(plain, expected));
  }
}

// The backward reads the kept states rather than replaying its own: given those of a forward
// from another initial state h0′, it returns that problem's gradients (bit for bit), which differ
// from its own — by item and by chunk.
TEST(GlaChunkStates, BackwardReadsThem) {
  const Case c{"reads", 2, 50, 2, 6, 5, Gates::realistic, 16};
  const Inputs in = make_inputs(c, 800);
  Inputs other = in;
  std::mt19937_64 rng(801);
  other.h0 = testing::randn(in.h0.shape(), rng);
  const GlaParams mine = plain_params(in), theirs = plain_params(other);
  const std::int64_t count = num_chunk_states(mine.q, {}, c.chunk_size);
  struct Grads {
    Tensor dq, dk, dv, dg, dh0;
  };
  const auto backward = [&](const GlaParams& p, const TensorView& kept) {
    Grads g{Tensor(in.q.shape(), DType::float64), Tensor(in.k.shape(), DType::float64),
            Tensor(in.v.shape(), DType::float64), Tensor(in.g.shape(), DType::float64),
            Tensor(in.h0.shape(), DType::float64)};
    gla_backward(p, Impl::chunk, in.d_o.view(), in.dht.view(),
                 make_grads(g.dq.view(), g.dk.view(), g.dv.view(), g.dg.view(), g.dh0.view()),
                 kept);
    return g;
  };
  for (int threads : {1, 8}) {
    set_num_threads(threads);
    SCOPED_TRACE(std::to_string(threads) + " threads");
    Tensor o(in.v.shape(), DType::float64), kept({count, c.H, c.K, c.V}, DType::float64);
    gla_forward(theirs, Impl::chunk, o.view(), {}, kept.view());
    const Grads read = backward(mine, kept.view()), replayed = backward(theirs, {}),
                own = backward(mine, {});
    EXPECT_TRUE(read.dq.bit_equal(replayed.dq));
    EXPECT_TRUE(read.dk.bit_equal(replayed.dk));
    EXPECT_TRUE(read.dv.bit_equal(replayed.dv));
    EXPECT_TRUE(read.dg.bit_equal(replayed.dg));
    EXPECT_TRUE(read.dh0.bit_equal(replayed.dh0));
    EXPECT_FALSE(read.dq.bit_equal(own.dq));
    EXPECT_FALSE(read.dg.bit_equal(own.dg));
  }
  set_num_threads(0);
}

TEST(GlaChunkStates, Count) {
  Tensor rows({3, 100, 2, 4}, DType::float32), row({1, 53, 2, 4}, DType::float32);
  EXPECT_EQ(num_chunk_states(rows.view(), {}, 16), 3 * 7);
  EXPECT_EQ(num_chunk_states(rows.view(), {}, 100), 3);
  EXPECT_EQ(num_chunk_states(rows.view(), {}, 1000), 3);  // a chunk is at most the sequence
  EXPECT_EQ(num_chunk_states(rows.view(), {}, 1), 300);
  Tensor cu = Tensor::from({7}, {0, 5, 5, 6, 23, 23, 53}, DType::int32);
  EXPECT_EQ(num_chunk_states(row.view(), cu.view(), 16), 6 + 4);
  Tensor empty({2, 0, 2, 4}, DType::float32);
  EXPECT_EQ(num_chunk_states(empty.view(), {}, 64), 0);
  using testing::expect_error;
  expect_error([&] { num_chunk_states(rows.view(), {}, 0); },
               {"num_chunk_states", "'chunk_size'", "positive", "0"});
  expect_error([&] { num_chunk_states(TensorView{}, {}, 16); },
               {"num_chunk_states", "'q'", "none"});
  Tensor flat({5}, DType::float32);
  expect_error([&] { num_chunk_states(flat.view(), {}, 16); }, {"'q'", "[B, T, ...]", "[5]"});
  expect_error([&] { num_chunk_states(rows.view(), cu.view(), 16); }, {"'cu_seqlens'", "B = 3"});
}

// ---------------------------------------------------------------------------------------------
// Fused rotation by θ (GlaParams::theta).

// Columns (a, b) of rotation pair i, written out here independently of the library.
std::int64_t pair_a(RotaryLayout layout, std::int64_t i) {
  return layout == RotaryLayout::half_split ? i : 2 * i;
}
std::int64_t pair_b(RotaryLayout layout, std::int64_t i, std::int64_t R) {
  return layout == RotaryLayout::half_split ? i + R : 2 * i + 1;
}

// The same inputs with q' = R(θ) q and k' = R(θ) k materialised by apply_rotary (float64
// reference) and no θ: the explicit path that the fused rotation must reproduce.
Inputs explicitly_rotated(const Inputs& in) {
  Inputs out = in;
  out.theta = Tensor();
  out.c.rotate = false;
  out.q = Tensor(in.q.shape(), DType::float64);
  out.k = Tensor(in.k.shape(), DType::float64);
  apply_rotary_forward(in.q.view(), in.theta.view(), in.c.layout, Impl::reference, out.q.view());
  apply_rotary_forward(in.k.view(), in.theta.view(), in.c.layout, Impl::reference, out.k.view());
  return out;
}

// Explicit rotation, then `impl` without θ (float64); the gradients with respect to q', k' are
// taken back through apply_rotary_backward: dq, dk of the unrotated inputs, and
// dθ = dθ (through q) + dθ (through k).
Result explicit_rotation_result(const Inputs& in, Impl impl) {
  Result r = run(explicitly_rotated(in), impl, DType::float64, DType::float64);
  Tensor dq(in.q.shape(), DType::float64), dk(in.k.shape(), DType::float64),
      dtheta_q(in.theta.shape(), DType::float64), dtheta_k(in.theta.shape(), DType::float64);
  apply_rotary_backward(in.q.view(), in.theta.view(), in.c.layout, Impl::reference, r.dq.view(),
                        dq.view(), dtheta_q.view());
  apply_rotary_backward(in.k.view(), in.theta.view(), in.c.layout, Impl::reference, r.dk.view(),
                        dk.view(), dtheta_k.view());
  r.dq = dq;
  r.dk = dk;
  r.dtheta = Tensor(in.theta.shape(), DType::float64);
  for (std::int64_t i = 0; i < r.dtheta.numel(); ++i)
    r.dtheta.set(i, dtheta_q.at(i) + dtheta_k.at(i));
  return r;
}

std::vector<Case> rotation_cases() {
  std::vector<Case> cases = {
      {"random", 2, 37, 2, 8, 6, Gates::realistic, 16},
      {"varlen", 1, 53, 2, 6, 5, Gates::realistic, 16, {5, 0, 1, 17, 0, 30}},
      {"strong_gates_chunk7", 1, 40, 1, 4, 6, Gates::strong, 7},
      {"zero_gates_chunk1", 1, 23, 2, 4, 5, Gates::zeros, 1},
      {"weak_gates_K_greater_than_V", 1, 45, 1, 10, 3, Gates::weak, 16},
      {"K2_mixed_channels", 1, 30, 2, 2, 7, Gates::mixed_channels, 8},
      {"chunk_longer_than_T", 2, 20, 1, 4, 4, Gates::realistic, 64},
      {"T1", 2, 1, 2, 4, 3, Gates::realistic, 64},
  };
  Case running{"running_phase_chunk40", 1, 100, 1, 8, 8, Gates::realistic, 40};
  running.running_phase = true;
  cases.push_back(running);
  Case no_state{"no_initial_state", 2, 29, 2, 6, 4, Gates::realistic, 8};
  no_state.initial_state = false;
  no_state.d_final_state = false;
  cases.push_back(no_state);
  Case strided{"strided_varlen", 1, 45, 2, 6, 5, Gates::zeros, 16, {20, 0, 25}};
  strided.strided = true;
  cases.push_back(strided);
  for (Case& c : cases) c.rotate = true;
  return cases;
}

constexpr std::array<RotaryLayout, 2> kLayouts = {RotaryLayout::half_split,
                                                  RotaryLayout::interleaved};
constexpr std::array<Impl, 3> kImpls = {Impl::reference, Impl::recurrent, Impl::chunk};

// Fused rotation == explicit rotation (apply_rotary) + the op, for o, final_state and every
// gradient including dθ: float64 against the same implementation on explicitly rotated inputs
// and against the reference; float32 against the float64 explicit reference.
TEST(GlaRotation, FusedMatchesExplicitRotation) {
  std::uint64_t seed = 300;
  double worst[2][3] = {};  // [float32, float64][impl]
  for (Case c : rotation_cases())
    for (RotaryLayout layout : kLayouts) {
      c.layout = layout;
      const Inputs in = make_inputs(c, seed++);
      const Result expected = explicit_rotation_result(in, Impl::reference);
      for (Impl impl : kImpls) {
        SCOPED_TRACE(c.name + " " + to_string(layout) + " " + to_string(impl));
        const Result fused64 = run(in, impl, DType::float64, DType::float64);
        {
          SCOPED_TRACE("float64 vs explicit rotation + same impl");
          expect_close(fused64, explicit_rotation_result(in, impl), 1e-12);
        }
        {
          SCOPED_TRACE("float64 vs explicit rotation + reference");
          expect_close(fused64, expected, 1e-10);
        }
        const Result fused32 = run(in, impl, DType::float32, DType::float32);
        {
          SCOPED_TRACE("float32 vs explicit rotation + reference");
          expect_close(fused32, expected, 1e-5);
        }
        const auto i = static_cast<std::size_t>(impl);
        worst[1][i] = std::max(worst[1][i], worst_error(fused64, expected));
        worst[0][i] = std::max(worst[0][i], worst_error(fused32, expected));
      }
    }
  std::printf(
      "fused rotation, worst relative RMS vs explicit rotation + reference: float64 reference "
      "%.2g, recurrent %.2g, chunk %.2g; float32 reference %.2g, recurrent %.2g, chunk %.2g\n",
      worst[1][0], worst[1][1], worst[1][2], worst[0][0], worst[0][1], worst[0][2]);
}

// dθ (and dq, dk through the rotation) against central differences of each implementation's own
// float64 loss.
TEST(GlaRotation, GradientsMatchFiniteDifferences) {
  for (RotaryLayout layout : kLayouts)
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      Case c{"fd", 1, 11, 2, 4, 3, Gates::realistic, 4, {4, 0, 7}};
      c.rotate = true;
      c.layout = layout;
      Inputs in = make_inputs(c, 21);
      const Result analytic = run(in, impl, DType::float64, DType::float64);
      const auto loss = [&] { return reference_loss(in, impl); };
      PHASOR_EXPECT_GRADIENT(analytic.dtheta, in.theta, loss, 1e-7, "dtheta");
      PHASOR_EXPECT_GRADIENT(analytic.dq, in.q, loss, 1e-7, "dq");
      PHASOR_EXPECT_GRADIENT(analytic.dk, in.k, loss, 1e-7, "dk");
    }
}

// g_b = g_a for every rotation pair (a, b) of the layout.
void tie_gates(Inputs& in) {
  const std::int64_t K = in.c.K, R = K / 2, rows = in.g.numel() / K;
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t i = 0; i < R; ++i)
      in.g.set(row * K + pair_b(in.c.layout, i, R), in.g.at(row * K + pair_a(in.c.layout, i)));
}

// A [N, H, K, V] state with every pair of rows (a, b) turned by the angle c (as R1, per column).
Tensor turn_state(const Tensor& state, double c, RotaryLayout layout) {
  Tensor out = state;
  const std::int64_t K = state.shape()[2], V = state.shape()[3], R = K / 2;
  const std::int64_t blocks = state.numel() / (K * V);
  for (std::int64_t n = 0; n < blocks; ++n)
    for (std::int64_t i = 0; i < R; ++i)
      for (std::int64_t col = 0; col < V; ++col) {
        const std::int64_t a = (n * K + pair_a(layout, i)) * V + col,
                           b = (n * K + pair_b(layout, i, R)) * V + col;
        out.set(a, state.at(a) * std::cos(c) - state.at(b) * std::sin(c));
        out.set(b, state.at(a) * std::sin(c) + state.at(b) * std::cos(c));
      }
  return out;
}

// dg_a + dg_b per rotation pair: [.., K] → [.., K/2], the derivative along tied gates.
Tensor pair_sums(const Tensor& dg, RotaryLayout layout) {
  std::vector<std::int64_t> shape = dg.shape();
  const std::int64_t K = shape.back(), R = K / 2, rows = dg.numel() / K;
  shape.back() = R;
  Tensor out(shape, DType::float64);
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t i = 0; i < R; ++i)
      out.set(row * R + i,
              dg.at(row * K + pair_a(layout, i)) + dg.at(row * K + pair_b(layout, i, R)));
  return out;
}

// θ rounded to multiples of 2^−10 (so that θ + c for c = 0.75 is exact, in float32 too: the
// shift is then exactly the same constant everywhere), and the shifted copy.
std::pair<Inputs, Inputs> shifted_angles(const Inputs& in, double c) {
  std::pair<Inputs, Inputs> out{in, in};
  for (std::int64_t i = 0; i < in.theta.numel(); ++i) {
    const double grid = std::round(in.theta.at(i) * 1024.0) / 1024.0;
    out.first.theta.set(i, grid);
    out.second.theta.set(i, grid + c);
  }
  return out;
}

// Relative-position invariance: with the gate tied across each rotation pair, θ + c gives the
// same o (and, without d_final_state, the same dq, dk, dv, dθ). dg is the derivative with respect
// to each gate channel on its own, which leaves the tied set where the invariance holds, so only
// its tied direction dg_a + dg_b is invariant (the entries themselves do change). The states are
// expressed in the frame of θ = 0 (the rotated keys are summed into them), so the final state
// turns by c, and an initial state must be turned by c as well for o to stay unchanged.
TEST(GlaRotation, ShiftInvarianceWithTiedGates) {
  const double shift = 0.75;
  for (bool with_state : {false, true})
    for (RotaryLayout layout : kLayouts) {
      Case c{"shift", 2, 37, 2, 6, 5, Gates::realistic, 16, {}, with_state, false};
      c.rotate = true;
      c.layout = layout;
      Inputs raw = make_inputs(c, 41);
      tie_gates(raw);
      auto [in, moved] = shifted_angles(raw, shift);
      if (with_state) moved.h0 = turn_state(in.h0, shift, layout);
      for (Impl impl : kImpls)
        for (DType dtype : {DType::float64, DType::float32}) {
          SCOPED_TRACE(std::string(with_state ? "initial state " : "") + to_string(layout) + " " +
                       to_string(impl) + " " + to_string(dtype));
          const double tol = dtype == DType::float64 ? 1e-12 : 1e-5;
          const Result a = run(in, impl, dtype, DType::float64);
          const Result b = run(moved, impl, dtype, DType::float64);
          PHASOR_EXPECT_CLOSE(b.o, a.o, tol, "o");
          PHASOR_EXPECT_CLOSE(b.dq, a.dq, tol, "dq");
          PHASOR_EXPECT_CLOSE(b.dk, a.dk, tol, "dk");
          PHASOR_EXPECT_CLOSE(b.dv, a.dv, tol, "dv");
          PHASOR_EXPECT_CLOSE(pair_sums(b.dg, layout), pair_sums(a.dg, layout), tol, "dg_a + dg_b");
          EXPECT_GT(testing::rel_rms(b.dg, a.dg), 1e-2) << "dg entries are not invariant";
          PHASOR_EXPECT_CLOSE(b.dtheta, a.dtheta, tol, "dtheta");
          PHASOR_EXPECT_CLOSE(b.final_state, turn_state(a.final_state, shift, layout), tol,
                              "final_state turned by the shift");
          EXPECT_GT(testing::rel_rms(b.final_state, a.final_state), 0.1)
              << "the final state itself is not invariant";
        }
    }
}

// With untied gates (g_a ≠ g_b) the invariance fails: the same shift changes o by far more than
// rounding.
TEST(GlaRotation, ShiftChangesOutputWithUntiedGates) {
  for (RotaryLayout layout : kLayouts) {
    Case c{"untied", 2, 37, 2, 6, 5, Gates::realistic, 16, {}, false, false};
    c.rotate = true;
    c.layout = layout;
    const auto [in, moved] = shifted_angles(make_inputs(c, 41), 0.75);
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      const Result a = run(in, impl, DType::float64, DType::float64);
      const Result b = run(moved, impl, DType::float64, DType::float64);
      const double change = testing::rel_rms(b.o, a.o);
      EXPECT_GT(change, 1e-2) << "o moved by only " << change;
    }
  }
}

// GLA with rotation and a tied gate is the complex-valued recurrence of Selective RoPE. Per
// rotation pair i write x̂_i = x_a + i·x_b (a complex channel) and λ_t,i = exp(g_t,a) = exp(g_t,b).
// Rotating by θ multiplies x̂ by e^{iθ}, and a real inner product over a pair is
// Re(conj(x̂) ŷ). With W_t = e^{−iθ_t} Z_t, Z_t = S_t[a, :] + i S_t[b, :] (the state in the frame
// of the current token), the op is, written directly with complex numbers,
//   W_t = λ_t e^{−i(θ_t − θ_{t−1})} W_{t−1} + k̂_t v_tᵀ,    (S_t = S_{t−1} Λ_t R_t + k_t v_tᵀ)
//   o_t = scale · Σ_i Re(conj(q̂_t,i) W_t,i),
// with θ_{−1} = 0 and W_{−1} = the initial state; the final state is Z = e^{iθ_last} W.
TEST(GlaRotation, TiedGatesEqualComplexRecurrence) {
  using Complex = std::complex<double>;
  for (RotaryLayout layout : kLayouts) {
    Case c{"complex", 1, 41, 2, 6, 3, Gates::realistic, 8, {17, 0, 24}};
    c.rotate = true;
    c.running_phase = true;
    c.layout = layout;
    Inputs in = make_inputs(c, 51);
    tie_gates(in);
    const std::int64_t T = c.T, H = c.H, K = c.K, V = c.V, R = K / 2;
    const double scale = 1 / std::sqrt(static_cast<double>(K));
    auto row = [&](std::int64_t t, std::int64_t h) { return (t * H + h); };  // B = 1
    Tensor o_expected({1, T, H, V}, DType::float64), fin_expected({in.N, H, K, V}, DType::float64);
    std::int64_t start = 0;
    for (std::int64_t n = 0; n < in.N; ++n) {
      const std::int64_t length = c.lengths[static_cast<std::size_t>(n)];
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t state0 = (n * H + h) * K * V;
        std::vector<Complex> W(static_cast<std::size_t>(R * V));
        std::vector<double> previous_theta(static_cast<std::size_t>(R), 0.0);
        for (std::int64_t i = 0; i < R; ++i)
          for (std::int64_t col = 0; col < V; ++col)
            W[static_cast<std::size_t>(i * V + col)] =
                Complex(in.h0.at(state0 + pair_a(layout, i) * V + col),
                        in.h0.at(state0 + pair_b(layout, i, R) * V + col));
        for (std::int64_t t = start; t < start + length; ++t) {
          const std::int64_t qk = row(t, h) * K, vr = row(t, h) * V, tr = row(t, h) * R;
          for (std::int64_t col = 0; col < V; ++col) o_expected.set(vr + col, 0.0);
          for (std::int64_t i = 0; i < R; ++i) {
            const std::int64_t a = pair_a(layout, i), b = pair_b(layout, i, R);
            const double theta = in.theta.at(tr + i);
            const Complex step = std::exp(in.g.at(qk + a)) *
                                 std::polar(1.0, -(theta - previous_theta[std::size_t(i)]));
            previous_theta[static_cast<std::size_t>(i)] = theta;
            const Complex k_hat(in.k.at(qk + a), in.k.at(qk + b)),
                q_hat(in.q.at(qk + a), in.q.at(qk + b));
            for (std::int64_t col = 0; col < V; ++col) {
              Complex& w = W[static_cast<std::size_t>(i * V + col)];
              w = step * w + k_hat * in.v.at(vr + col);
              o_expected.set(vr + col,
                             o_expected.at(vr + col) + scale * std::real(std::conj(q_hat) * w));
            }
          }
        }
        for (std::int64_t i = 0; i < R; ++i)
          for (std::int64_t col = 0; col < V; ++col) {
            const Complex z = std::polar(1.0, previous_theta[static_cast<std::size_t>(i)]) *
                              W[static_cast<std::size_t>(i * V + col)];
            fin_expected.set(state0 + pair_a(layout, i) * V + col, z.real());
            fin_expected.set(state0 + pair_b(layout, i, R) * V + col, z.imag());
          }
      }
      start += length;
    }
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      const Result r = run(in, impl, DType::float64, DType::float64);
      PHASOR_EXPECT_CLOSE(r.o, o_expected, 1e-12, "o vs complex recurrence");
      PHASOR_EXPECT_CLOSE(r.final_state, fin_expected, 1e-12, "final_state vs complex recurrence");
    }
  }
}

// Standard RoPE (θ_t = t·ω from rope_angles, shared by heads through a zero stride): with no
// decay (g = 0) and a single key k at position n (v_n = 1, V = 1, every other k and v zero),
// o_m = scale · (R(θ_m) q)·(R(θ_n) k) is the attention logit, which depends only on m − n.
TEST(GlaRotation, RopeLogitsDependOnlyOnDistance) {
  const std::int64_t T = 24, H = 2, K = 8, R = K / 2;
  std::mt19937_64 rng(61);
  const Tensor q_head = testing::randn({H, K}, rng), k_head = testing::randn({H, K}, rng);
  Tensor angles({1, T, R}, DType::float64);
  RopeAnglesParams rope;
  rope.T = T;
  rope.head_dim = K;
  rope_angles(rope, Impl::reference, angles.view());
  const TensorView theta =
      TensorView::strided(angles.view().data, DType::float64, {1, T, H, R}, {T * R, R, 0, 1});
  // logits[m] for the key at position n, from one forward call.
  auto logits = [&](Impl impl, RotaryLayout layout, std::int64_t n) {
    Tensor q({1, T, H, K}, DType::float64), k({1, T, H, K}, DType::float64),
        v({1, T, H, 1}, DType::float64), g({1, T, H, K}, DType::float64),
        o({1, T, H, 1}, DType::float64);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < K; ++d) {
          q.set((t * H + h) * K + d, q_head.at(h * K + d));
          if (t == n) k.set((t * H + h) * K + d, k_head.at(h * K + d));
        }
    for (std::int64_t h = 0; h < H; ++h) v.set(n * H + h, 1.0);
    GlaParams params;
    params.q = q.view();
    params.k = k.view();
    params.v = v.view();
    params.g = g.view();
    params.theta = theta;
    params.rotary_layout = layout;
    params.chunk_size = 5;
    gla_forward(params, impl, o.view());
    return o;
  };
  for (RotaryLayout layout : kLayouts)
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      const Tensor from0 = logits(impl, layout, 0), from9 = logits(impl, layout, 9);
      double spread = 0;
      for (std::int64_t d = 0; d + 9 < T; ++d)
        for (std::int64_t h = 0; h < H; ++h) {
          const double expected = from0.at(d * H + h), actual = from9.at((d + 9) * H + h);
          EXPECT_NEAR(actual, expected, 1e-12 * (1 + std::fabs(expected))) << "m − n = " << d;
          spread = std::max(spread, std::fabs(expected - from0.at(h)));
        }
      EXPECT_GT(spread, 0.1) << "logits should vary with the distance";
    }
}

// θ may have another dtype than q (the compute type): float32 θ with float64 q, and float64 θ
// (e.g. a long running phase) with float32 q, whose cos/sin are then taken in float64.
TEST(GlaRotation, ThetaOfAnotherDtypeThanQ) {
  Case c{"theta_dtype", 1, 60, 2, 6, 5, Gates::realistic, 16, {25, 35}};
  c.rotate = true;
  c.running_phase = true;
  std::uint64_t seed = 91;
  for (RotaryLayout layout : kLayouts) {
    c.layout = layout;
    const Inputs in = make_inputs(c, seed++);
    const Result expected = explicit_rotation_result(in, Impl::reference);
    for (DType dtype : {DType::float32, DType::float64}) {
      const DType theta_dtype = dtype == DType::float32 ? DType::float64 : DType::float32;
      Inputs cast = in;
      for (Tensor* x : {&cast.q, &cast.k, &cast.v, &cast.g, &cast.h0, &cast.d_o, &cast.dht})
        *x = x->to(dtype);
      cast.theta = in.theta.to(theta_dtype);  // exact: the angles are float32-representable
      for (Impl impl : kImpls) {
        SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl) + " q " +
                     to_string(dtype) + ", theta " + to_string(theta_dtype));
        const GlaParams params = plain_params(cast);
        Result r;
        r.o = Tensor({1, c.T, c.H, c.V}, DType::float64);
        r.final_state = Tensor({in.N, c.H, c.K, c.V}, DType::float64);
        gla_forward(params, impl, r.o.view(), r.final_state.view());
        r.dq = Tensor(in.q.shape(), DType::float64);
        r.dk = Tensor(in.k.shape(), DType::float64);
        r.dv = Tensor(in.v.shape(), DType::float64);
        r.dg = Tensor(in.g.shape(), DType::float64);
        r.dh0 = Tensor(in.h0.shape(), DType::float64);
        r.dtheta = Tensor(in.theta.shape(), DType::float64);
        gla_backward(params, impl, cast.d_o.view(), cast.dht.view(),
                     make_grads(r.dq.view(), r.dk.view(), r.dv.view(), r.dg.view(), r.dh0.view(),
                                r.dtheta.view()));
        expect_close(r, expected, dtype == DType::float64 ? 1e-10 : 1e-5);
      }
    }
  }
}

// Requesting a subset of the gradients (dθ alone, dq alone, dv and dg alone) gives the same
// values as requesting every gradient, and results are bit-identical for any thread count.
TEST(GlaRotation, PartialGradientsAndThreadInvariance) {
  Case c{"partial", 1, 50, 3, 6, 4, Gates::zeros, 16, {22, 0, 28}};
  c.rotate = true;
  c.layout = RotaryLayout::interleaved;
  const Inputs in = make_inputs(c, 71);
  for (Impl impl : kImpls) {
    SCOPED_TRACE(to_string(impl));
    const Result full = run(in, impl, DType::float64, DType::float64);
    const GlaParams params = plain_params(in);
    Tensor dtheta(in.theta.shape(), DType::float64), dq(in.q.shape(), DType::float64);
    gla_backward(params, impl, in.d_o.view(), in.dht.view(),
                 make_grads({}, {}, {}, {}, {}, dtheta.view()));
    EXPECT_TRUE(dtheta.bit_equal(full.dtheta));
    gla_backward(params, impl, in.d_o.view(), in.dht.view(), make_grads(dq.view(), {}, {}, {}, {}));
    EXPECT_TRUE(dq.bit_equal(full.dq));
    // Without dq, dk, dθ the rotated-frame dq', dk' are not turned back; dv, dg are unaffected.
    Tensor dv(in.v.shape(), DType::float64), dg(in.g.shape(), DType::float64);
    gla_backward(params, impl, in.d_o.view(), in.dht.view(),
                 make_grads({}, {}, dv.view(), dg.view(), {}));
    EXPECT_TRUE(dv.bit_equal(full.dv));
    EXPECT_TRUE(dg.bit_equal(full.dg));
    for (DType dtype : {DType::float32, DType::float64}) {
      set_num_threads(1);
      const Result one = run(in, impl, dtype, dtype);
      set_num_threads(3);
      expect_bit_equal(run(in, impl, dtype, dtype), one,
                       std::string("3 threads ") + to_string(dtype));
    }
    set_num_threads(0);
  }
}

// Decoding with rotation: the recurrent kernel one token at a time, each call given that token's
// θ and the previous state, continues exactly (the state carries the θ = 0 frame across calls).
TEST(GlaRotation, DecodingOneTokenAtATimeMatchesChunkForward) {
  const std::int64_t B = 2, T = 20, H = 2, K = 6, V = 5;
  Case c{"decode", B, T, H, K, V, Gates::zeros, 8};
  c.rotate = true;
  c.running_phase = true;
  for (RotaryLayout layout : kLayouts) {
    SCOPED_TRACE(to_string(layout));
    c.layout = layout;
    const Inputs in = make_inputs(c, 81);
    const GlaParams full = plain_params(in);
    Tensor o_chunk({B, T, H, V}, DType::float64), fin_chunk({B, H, K, V}, DType::float64);
    gla_forward(full, Impl::chunk, o_chunk.view(), fin_chunk.view());
    Tensor o_steps({B, T, H, V}, DType::float64), state = in.h0;
    for (std::int64_t t = 0; t < T; ++t) {
      GlaParams step = full;
      step.q = token(in.q, t);
      step.k = token(in.k, t);
      step.v = token(in.v, t);
      step.g = token(in.g, t);
      step.theta = token(in.theta, t);
      step.initial_state = state.view();
      gla_forward(step, Impl::recurrent, token(o_steps, t), state.view());
    }
    PHASOR_EXPECT_CLOSE(o_steps, o_chunk, 1e-12, "o");
    PHASOR_EXPECT_CLOSE(state, fin_chunk, 1e-12, "final state");
  }
}

// ---------------------------------------------------------------------------------------------
// Argument validation.

struct BadInputs {
  Tensor q{{1, 6, 2, 4}, DType::float32}, k{{1, 6, 2, 4}, DType::float32},
      v{{1, 6, 2, 3}, DType::float32}, g{{1, 6, 2, 4}, DType::float32},
      h0{{1, 2, 4, 3}, DType::float32}, o{{1, 6, 2, 3}, DType::float32},
      fin{{1, 2, 4, 3}, DType::float32};
  GlaParams params() const {
    GlaParams p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    p.g = g.view();
    p.initial_state = h0.view();
    return p;
  }
};

TEST(GlaValidation, ShapesRanksAndDtypes) {
  BadInputs b;
  using testing::expect_error;
  Tensor q3({1, 6, 8}, DType::float32);
  GlaParams p = b.params();
  p.q = q3.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"chunk_gla", "'q'", "4-D", "[1, 6, 8]"});
  Tensor k_bad({1, 6, 2, 5}, DType::float32);
  p = b.params();
  p.k = k_bad.view();
  expect_error([&] { gla_forward(p, Impl::recurrent, b.o.view()); },
               {"fused_recurrent_gla", "'k'", "K=4", "[1, 6, 2, 5]"});
  Tensor v_bad({1, 7, 2, 3}, DType::float32);
  p = b.params();
  p.v = v_bad.view();
  expect_error([&] { gla_forward(p, Impl::reference, b.o.view()); },
               {"gla_reference", "'v'", "T=6", "[1, 7, 2, 3]"});
  Tensor g_bad({1, 6, 2, 3}, DType::float32);
  p = b.params();
  p.g = g_bad.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); }, {"'g'", "K=4", "[1, 6, 2, 3]"});
  Tensor q_int({1, 6, 2, 4}, DType::int32);
  p = b.params();
  p.q = q_int.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"'q'", "float32, float64, bfloat16 or float16", "int32"});
  Tensor h0_bad({2, 2, 4, 3}, DType::float32);
  p = b.params();
  p.initial_state = h0_bad.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"'initial_state'", "N=1", "[2, 2, 4, 3]"});
  Tensor o_bad({1, 6, 2, 4}, DType::float32);
  expect_error([&] { gla_forward(b.params(), Impl::chunk, o_bad.view()); }, {"'o'", "V=3"});
  Tensor fin_bad({1, 2, 3, 4}, DType::float32);
  expect_error([&] { gla_forward(b.params(), Impl::chunk, b.o.view(), fin_bad.view()); },
               {"'final_state'", "K=4"});
  expect_error([&] { gla_forward(b.params(), Impl::chunk, TensorView{}); }, {"'o'", "none"});
}

TEST(GlaValidation, ChunkStates) {
  BadInputs b;  // T = 6 at chunk_size 64: one chunk a sequence
  using testing::expect_error;
  Tensor kept({1, 2, 4, 3}, DType::float32), dq({1, 6, 2, 4}, DType::float32);
  GlaGrads grads;
  grads.dq = dq.view();
  for (Impl impl : {Impl::reference, Impl::recurrent}) {
    expect_error([&] { gla_forward(b.params(), impl, b.o.view(), {}, kept.view()); },
                 {"'chunk_states'", "only Impl::chunk", to_string(impl)});
    expect_error([&] { gla_backward(b.params(), impl, b.o.view(), {}, grads, kept.view()); },
                 {"'chunk_states'", "only Impl::chunk", to_string(impl)});
  }
  Tensor two({2, 2, 4, 3}, DType::float32);
  expect_error([&] { gla_forward(b.params(), Impl::chunk, b.o.view(), {}, two.view()); },
               {"chunk_gla", "'chunk_states'", "num_chunk_states=1", "[2, 2, 4, 3]"});
  expect_error([&] { gla_backward(b.params(), Impl::chunk, b.o.view(), {}, grads, two.view()); },
               {"'chunk_states'", "num_chunk_states=1"});
  Tensor ints({1, 2, 4, 3}, DType::int32);
  expect_error([&] { gla_forward(b.params(), Impl::chunk, b.o.view(), {}, ints.view()); },
               {"'chunk_states'", "int32"});
  const TensorView broadcast =
      TensorView::strided(kept.data(), DType::float32, {1, 2, 4, 3}, {24, 0, 3, 1});
  expect_error([&] { gla_forward(b.params(), Impl::chunk, b.o.view(), {}, broadcast); },
               {"'chunk_states'", "zero (broadcast) strides"});
  // Memory shared with another argument: written by the forward, read while the backward writes.
  const TensorView in_o = TensorView::of(static_cast<float*>(b.o.data()), {1, 2, 4, 3});
  expect_error([&] { gla_forward(b.params(), Impl::chunk, b.o.view(), {}, in_o); },
               {"'chunk_states'", "overlapping 'o'"});
  const TensorView in_k = TensorView::of(static_cast<const float*>(b.k.data()), {1, 2, 4, 3});
  expect_error([&] { gla_forward(b.params(), Impl::chunk, b.o.view(), {}, in_k); },
               {"'chunk_states'", "overlapping 'k'"});
  const TensorView in_dq = TensorView::of(static_cast<float*>(dq.data()), {1, 2, 4, 3});
  expect_error([&] { gla_backward(b.params(), Impl::chunk, b.o.view(), {}, grads, in_dq); },
               {"'chunk_states'", "overlapping 'dq'"});
}

TEST(GlaValidation, CuSeqlens) {
  BadInputs b;
  using testing::expect_error;
  GlaParams p = b.params();
  Tensor decreasing = Tensor::from({3}, {0, 4, 2}, DType::int32);
  p.cu_seqlens = decreasing.view();
  p.initial_state = {};
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"chunk_gla", "'cu_seqlens'", "non-decreasing"});
  Tensor short_end = Tensor::from({3}, {0, 2, 5}, DType::int64);
  p.cu_seqlens = short_end.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); }, {"'cu_seqlens'", "T = 6"});
  Tensor q2({2, 6, 2, 4}, DType::float32), k2({2, 6, 2, 4}, DType::float32),
      v2({2, 6, 2, 3}, DType::float32), g2({2, 6, 2, 4}, DType::float32),
      o2({2, 6, 2, 3}, DType::float32);
  Tensor ok = Tensor::from({3}, {0, 2, 6}, DType::int64);
  GlaParams p2;
  p2.q = q2.view();
  p2.k = k2.view();
  p2.v = v2.view();
  p2.g = g2.view();
  p2.cu_seqlens = ok.view();
  expect_error([&] { gla_forward(p2, Impl::recurrent, o2.view()); }, {"'cu_seqlens'", "B = 2"});
  // With cu_seqlens, states have N = number of sequences rows.
  p = b.params();
  p.cu_seqlens = ok.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); }, {"'initial_state'", "N=2"});
}

TEST(GlaValidation, GatesChunkSizeScaleAndGradients) {
  BadInputs b;
  using testing::expect_error;
  Tensor g_pos = b.g;
  g_pos.set(13, 0.5);
  GlaParams p = b.params();
  p.g = g_pos.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"chunk_gla", "'g'", "<= 0", "0.5"});
  p = b.params();
  p.chunk_size = 0;
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"chunk_gla", "'chunk_size'", "positive", "0"});
  expect_error([&] { gla_backward(p, Impl::recurrent, b.o.view(), {}, GlaGrads{}); },
               {"fused_recurrent_gla", "'chunk_size'"});
  p = b.params();
  p.scale = std::nan("");
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); }, {"'scale'", "finite"});

  Tensor dh0({1, 2, 4, 3}, DType::float32);
  p = b.params();
  p.initial_state = {};
  expect_error(
      [&] { gla_backward(p, Impl::chunk, b.o.view(), {}, make_grads({}, {}, {}, {}, dh0.view())); },
      {"chunk_gla", "'dh0'", "initial_state"});
  Tensor do_bad({1, 6, 2, 4}, DType::float32);
  expect_error([&] { gla_backward(b.params(), Impl::chunk, do_bad.view(), {}, GlaGrads{}); },
               {"'d_o'", "V=3"});
  Tensor dht_bad({1, 2, 4, 4}, DType::float32);
  expect_error(
      [&] { gla_backward(b.params(), Impl::chunk, b.o.view(), dht_bad.view(), GlaGrads{}); },
      {"'d_final_state'", "V=3"});
  Tensor dq_bad({1, 6, 2, 3}, DType::float32);
  expect_error(
      [&] {
        gla_backward(b.params(), Impl::chunk, b.o.view(), {},
                     make_grads(dq_bad.view(), {}, {}, {}, {}));
      },
      {"'dq'", "K=4"});
  Tensor dg_int({1, 6, 2, 4}, DType::int64);
  expect_error(
      [&] {
        gla_backward(b.params(), Impl::chunk, b.o.view(), {},
                     make_grads({}, {}, {}, dg_int.view(), {}));
      },
      {"'dg'", "int64"});
}

TEST(GlaValidation, RotationAngles) {
  BadInputs b;  // K = 4: θ is [1, 6, 2, 2]
  using testing::expect_error;
  Tensor theta({1, 6, 2, 2}, DType::float32);
  GlaParams p = b.params();
  Tensor theta_wide({1, 6, 2, 4}, DType::float32);
  p.theta = theta_wide.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"chunk_gla", "'theta'", "K/2=2", "[1, 6, 2, 4]"});
  Tensor theta_heads({1, 6, 1, 2}, DType::float32);
  p.theta = theta_heads.view();
  expect_error([&] { gla_forward(p, Impl::recurrent, b.o.view()); },
               {"fused_recurrent_gla", "'theta'", "H=2", "[1, 6, 1, 2]"});
  Tensor theta_int({1, 6, 2, 2}, DType::int32);
  p.theta = theta_int.view();
  expect_error([&] { gla_forward(p, Impl::reference, b.o.view()); },
               {"gla_reference", "'theta'", "int32"});
  // Odd K: no rotation pairs.
  Tensor q3({1, 6, 2, 3}, DType::float32), g3({1, 6, 2, 3}, DType::float32),
      theta1({1, 6, 2, 1}, DType::float32);
  p = b.params();
  p.q = q3.view();
  p.k = q3.view();
  p.g = g3.view();
  p.initial_state = {};
  p.theta = theta1.view();
  expect_error([&] { gla_forward(p, Impl::chunk, b.o.view()); },
               {"chunk_gla", "'theta'", "even", "K = 3"});

  Tensor dtheta({1, 6, 2, 2}, DType::float32);
  p = b.params();
  expect_error(
      [&] {
        gla_backward(p, Impl::chunk, b.o.view(), {}, make_grads({}, {}, {}, {}, {}, dtheta.view()));
      },
      {"chunk_gla", "'dtheta'", "theta to be given"});
  p.theta = theta.view();
  Tensor dtheta_bad({1, 6, 2, 3}, DType::float32);
  expect_error(
      [&] {
        gla_backward(p, Impl::recurrent, b.o.view(), {},
                     make_grads({}, {}, {}, {}, {}, dtheta_bad.view()));
      },
      {"fused_recurrent_gla", "'dtheta'", "K/2=2", "[1, 6, 2, 3]"});
  // Angles shared by the heads (zero stride over H) are fine as θ, but their gradient must own
  // each element: sum the [B, T, H, K/2] dθ over H instead.
  Tensor shared({1, 6, 2}, DType::float32);
  const TensorView broadcast =
      TensorView::strided(shared.view().data, DType::float32, {1, 6, 2, 2}, {12, 2, 0, 1});
  p.theta = broadcast;
  Tensor o({1, 6, 2, 3}, DType::float32);
  gla_forward(p, Impl::chunk, o.view());
  expect_error(
      [&] {
        gla_backward(p, Impl::chunk, b.o.view(), {}, make_grads({}, {}, {}, {}, {}, broadcast));
      },
      {"chunk_gla", "'dtheta'", "no zero strides", "dimension 2"});
}

}  // namespace
}  // namespace phasor
