// Gated DeltaNet's recurrent CUDA kernels (cuda/gated_delta_rule/recurrent.cu,
// fused_recurrent_gated_delta_rule) against the CPU recurrent kernel and the float64 reference, on
// every GPU device (Device::emulated always; Device::cuda when the machine has a GPU, otherwise
// SKIPPED): o, final_state and every gradient (dq, dk, dv, dg, dβ, dh0, dθ, with d_final_state),
// in float64, float32, bfloat16 and float16, without rotation and with θ in both layouts, with and
// without the in-kernel ℓ2 norm, β in (0, 1) and (0, 2), over realistic, strong (−20 per token)
// and exactly-zero (−inf) gates, grouped value heads (HV = 2H), varlen batches with empty and
// one-token sequences, T = 1, T not a multiple of the checkpoint interval, K ≠ V, odd sizes
// (K = 6, V = 5) and K = 48, V = 40 (crossing a warp of key rows and a tile of value columns).
// Tolerances as tests/gla_gpu_test.cpp (gpu_gtest.h). Also: decoding token by token with
// the state updated in place equals one call, bit-identical results under emulator schedules, and
// the CPU's error text for a positive gate and a bad cu_seqlens.
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "phasor/emulator.h"
#include "phasor/gated_delta_rule.h"
#include "phasor/ops.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gpu_gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Rotation;
using testing::Tensor;

enum class Gates { realistic, strong, zeros };

struct Case {
  std::string name;
  std::int64_t B, T, H, K, V;
  std::vector<std::int64_t> lengths = {};  // non-empty: packed with cu_seqlens (B = 1)
  Gates gates = Gates::realistic;
  bool initial_state = true;
  std::int64_t chunk_size = 4;
  std::int64_t group = 1;  // HV = group · H
  double beta_max = 1.0;   // β ~ U(0, beta_max)
  bool l2norm = false;
};

// float64 master copies of every input.
struct Inputs {
  Case c;
  std::int64_t B = 0, T = 0, N = 0;
  std::int64_t HV = 0;
  Tensor q, k, v, g, beta, h0, cu, theta, d_o, dht;
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.c = c;
  const testing::Batch batch = testing::batch_of(c.B, c.T, c.lengths);
  in.B = batch.B, in.T = batch.T, in.N = batch.N;
  in.cu = batch.cu_seqlens;
  in.HV = c.H * c.group;
  const std::vector<std::int64_t> qk = {in.B, in.T, c.H, c.K}, vv = {in.B, in.T, in.HV, c.V};
  in.q = testing::randn(qk, rng);
  in.k = testing::randn(qk, rng);
  in.v = testing::randn(vv, rng);
  in.g = testing::log_sigmoid_gates({in.B, in.T, in.HV}, rng, 3.0);
  for (std::int64_t i = 0; i < in.g.numel(); ++i) {
    if (c.gates == Gates::strong) in.g.set(i, -20.0);
    if (c.gates == Gates::zeros && i % 5 == 2)
      in.g.set(i, -std::numeric_limits<double>::infinity());
  }
  in.beta = testing::uniform({in.B, in.T, in.HV}, rng, 0.0, c.beta_max);
  if (c.initial_state) in.h0 = testing::randn({in.N, in.HV, c.K, c.V}, rng);
  if (c.K % 2 == 0) in.theta = testing::randn({in.B, in.T, c.H, c.K / 2}, rng, 20.0);
  in.d_o = testing::randn(vv, rng);
  in.dht = testing::randn({in.N, in.HV, c.K, c.V}, rng);
  return in;
}

struct Outputs {
  Tensor o, final_state, dq, dk, dv, dg, dbeta, dh0, dtheta;
  Tensor chunk_states;  // when kept (not among fields())
  testing::NamedTensors fields() const {
    return {{"o", &o},          {"final_state", &final_state},
            {"dq", &dq},        {"dk", &dk},
            {"dv", &dv},        {"dg", &dg},
            {"dbeta", &dbeta},  {"dh0", &dh0},
            {"dtheta", &dtheta}};
  }
};

// Forward and backward of `impl` on `device`, every input rounded to `dtype`, outputs in `dtype`
// (states and dh0 in float32, or float64 for float64 inputs).
// strided: every input through a strided view (OnDevice::in_strided).
// keep: the forward keeps its chunk states in that dtype, and the backward is given them.
Outputs run(const Inputs& in, DType dtype, Device device, Impl impl, Rotation rotation,
            bool strided = false, std::optional<DType> keep = std::nullopt) {
  OnDevice on(device);
  auto input = [&](const Tensor& t) { return on.in(t, dtype, strided); };
  const DType state_dtype = testing::compute_dtype(dtype);
  GatedDeltaRuleParams p;
  p.q = input(in.q);
  p.k = input(in.k);
  p.v = input(in.v);
  p.g = input(in.g);
  p.beta = input(in.beta);
  p.use_qk_l2norm_in_kernel = in.c.l2norm;
  p.initial_state = on.in(in.h0, state_dtype);
  p.cu_seqlens = on.in(in.cu);
  p.chunk_size = in.c.chunk_size;
  if (rotation != Rotation::none) {
    p.theta = input(in.theta);
    p.rotary_layout = testing::layout_of(rotation);
  }
  const TensorView o = on.out(in.v.shape(), dtype),
                   fs = on.out({in.N, in.HV, in.c.K, in.c.V}, state_dtype);
  const TensorView kept =
      keep ? on.out({num_chunk_states(p.q, p.cu_seqlens, p.chunk_size), in.HV, in.c.K, in.c.V},
                    *keep)
           : TensorView{};
  gated_delta_rule_forward(p, impl, o, fs, kept);
  GatedDeltaRuleGrads grads;
  grads.dq = on.out(in.q.shape(), dtype);
  grads.dk = on.out(in.q.shape(), dtype);
  grads.dv = on.out(in.v.shape(), dtype);
  grads.dg = on.out(in.g.shape(), dtype);
  grads.dbeta = on.out(in.beta.shape(), dtype);
  if (in.h0.defined()) grads.dh0 = on.out(in.h0.shape(), state_dtype);
  if (rotation != Rotation::none) grads.dtheta = on.out(in.theta.shape(), dtype);
  gated_delta_rule_backward(p, impl, input(in.d_o), on.in(in.dht, state_dtype), grads, kept);
  Outputs r;
  if (kept.defined()) r.chunk_states = on.to_host(kept);
  r.o = on.to_host(o);
  r.final_state = on.to_host(fs);
  r.dq = on.to_host(grads.dq);
  r.dk = on.to_host(grads.dk);
  r.dv = on.to_host(grads.dv);
  r.dg = on.to_host(grads.dg);
  r.dbeta = on.to_host(grads.dbeta);
  if (grads.dh0.defined()) r.dh0 = on.to_host(grads.dh0);
  if (grads.dtheta.defined()) r.dtheta = on.to_host(grads.dtheta);
  return r;
}

// The float64 reference on the inputs rounded to `dtype` (states rounded to their dtype).
Outputs reference(const Inputs& in, DType dtype, Rotation rotation) {
  Inputs rounded = in;
  for (Tensor* t : {&rounded.q, &rounded.k, &rounded.v, &rounded.g, &rounded.beta, &rounded.theta,
                    &rounded.d_o})
    *t = t->rounded_to(dtype);
  for (Tensor* t : {&rounded.h0, &rounded.dht}) *t = t->rounded_to(testing::compute_dtype(dtype));
  return run(rounded, DType::float64, Device::cpu, Impl::reference, rotation);
}

// Every output against the CPU kernel's and the reference's (device_test rules: 16-bit inputs
// through the chunk kernels' tensor cores). dg and dβ are per-token sums over K × V (and over the
// chunk's pairs) of products much larger than the result: the operands' 16-bit rounding reaches
// them amplified by that cancellation (measured ≤ 3.4 unit roundoffs, K = 48, V = 40); the other
// outputs ≤ 1.9.
void compare_all(const Outputs& gpu, const Outputs& cpu, const Outputs& ref, DType dtype,
                 Impl impl = Impl::recurrent) {
  testing::GpuArithmetic arithmetic;
  arithmetic.tensor_cores = impl == Impl::chunk;
  arithmetic.cancelling = {{"dg", 4}, {"dbeta", 4}};
  testing::expect_gpu_results(gpu.fields(), cpu.fields(), ref.fields(), dtype,
                              op_name(Op::gated_delta_rule, impl), arithmetic);
}

// Every output of a and b bit for bit.
void expect_bit_equal(const Outputs& a, const Outputs& b, const std::string& when) {
  testing::expect_bit_equal(a.fields(), b.fields(), when);
}

class GatedDeltaRuleGpu : public ::testing::TestWithParam<Device> {};

TEST_P(GatedDeltaRuleGpu, MatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::vector<Case> cases = {
      {"realistic", 2, 11, 2, 8, 6},
      {"strong_l2norm_beta2", 1, 9, 1, 8, 8, {}, Gates::strong, true, 4, 1, 2.0, true},
      {"zeros_grouped", 2, 7, 1, 8, 5, {}, Gates::zeros, true, 3, 2},
      {"varlen_empty_single_l2norm",
       1,
       0,
       2,
       6,
       5,
       {3, 0, 1, 9, 0},
       Gates::realistic,
       true,
       4,
       1,
       2.0,
       true},
      {"one_token_grouped_l2norm", 2, 1, 1, 4, 4, {}, Gates::realistic, true, 4, 2, 1.0, true},
      {"odd_sizes_no_state", 1, 6, 1, 6, 5, {}, Gates::realistic, false, 5},
      {"K48_V40_l2norm", 1, 5, 1, 48, 40, {}, Gates::realistic, true, 2, 1, 2.0, true},
      {"K0_grouped_l2norm", 1, 6, 2, 0, 5, {}, Gates::realistic, true, 4, 2, 1.0, true},  // o = 0
      // no values: o and the state are empty, dq = dk = dg = dβ = 0
      {"V0_grouped_l2norm", 1, 6, 2, 4, 0, {}, Gates::realistic, true, 4, 2, 1.0, true},
  };
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, 7);
    for (Rotation rotation : {Rotation::none, Rotation::half_split, Rotation::interleaved}) {
      for (DType dtype : testing::gpu_test_dtypes()) {
        SCOPED_TRACE(c.name + " " + testing::to_string(rotation) + " " + to_string(dtype));
        const Outputs ref = reference(in, dtype, rotation);
        const Outputs cpu = run(in, dtype, Device::cpu, Impl::recurrent, rotation);
        const Outputs gpu = run(in, dtype, device, Impl::recurrent, rotation);
        compare_all(gpu, cpu, ref, dtype);
      }
    }
  }
}

// chunk_gated_delta_rule on the GPU (cuda/gated_delta_rule/chunk.cu): chunks of 16, 32 and 64
// with partial last chunks and T shorter than a chunk, the in-kernel ℓ2 norm, β up to 2, grouped
// value heads, several key and value tiles (K = 48 with rotation pairs across tiles, K = 33,
// V = 40), strong and exactly-zero gates, varlen batches with empty and one-token sequences;
// against the CPU chunk kernel and the reference.
TEST_P(GatedDeltaRuleGpu, ChunkMatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::vector<Case> cases = {
      {"realistic_c32", 2, 45, 2, 8, 6, {}, Gates::realistic, true, 32},
      {"realistic_l2norm_c32", 2, 45, 2, 8, 6, {}, Gates::realistic, true, 32, 1, 1.0, true},
      {"zeros_grouped_l2norm_c32", 1, 40, 1, 8, 5, {}, Gates::zeros, true, 32, 2, 2.0, true},
      {"strong_l2norm_beta2_c64", 1, 70, 1, 8, 8, {}, Gates::strong, true, 64, 1, 2.0, true},
      {"zeros_grouped_c16", 2, 37, 1, 8, 5, {}, Gates::zeros, true, 16, 2},
      {"varlen_empty_single_l2norm_c16",
       1,
       0,
       2,
       6,
       5,
       {3, 0, 1, 40, 0},
       Gates::realistic,
       true,
       16,
       1,
       2.0,
       true},
      {"one_token_grouped_l2norm_c64", 2, 1, 1, 4, 4, {}, Gates::realistic, true, 64, 2, 1.0, true},
      {"odd_sizes_no_state_c32", 1, 34, 1, 6, 5, {}, Gates::realistic, false, 32},
      {"K48_V40_l2norm_c32", 1, 40, 1, 48, 40, {}, Gates::realistic, true, 32, 1, 2.0, true},
      {"K33_c16", 1, 20, 1, 33, 9, {}, Gates::realistic, true, 16},
      // two value tiles of 64 (the second partial) in the states, output and dstates kernels
      {"K40_V70_l2norm_c32", 1, 36, 1, 40, 70, {}, Gates::realistic, true, 32, 1, 2.0, true},
      {"K0_l2norm_c16", 1, 20, 2, 0, 5, {}, Gates::realistic, true, 16, 1, 1.0, true},  // o = 0
      {"V0_grouped_l2norm_c16", 1, 20, 2, 4, 0, {}, Gates::realistic, true, 16, 2, 1.0, true},
  };
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, 5);
    for (Rotation rotation : {Rotation::none, Rotation::half_split, Rotation::interleaved}) {
      if (rotation != Rotation::none && c.K % 2 != 0) continue;
      for (DType dtype : testing::gpu_test_dtypes()) {
        // Unnormalised keys make the chunk's M = I + diag(β) (K Kᵀ ⊙ Γ) ill-conditioned, and its
        // inverse amplifies the 16-bit rounding of the tensor cores' operands (as in fla, whose
        // layers always normalise): the 16-bit bound is held on ℓ2-normalised inputs.
        if (!c.l2norm && (dtype == DType::bfloat16 || dtype == DType::float16)) continue;
        SCOPED_TRACE(c.name + " " + testing::to_string(rotation) + " " + to_string(dtype));
        const Outputs ref = reference(in, dtype, rotation);
        const Outputs cpu = run(in, dtype, Device::cpu, Impl::chunk, rotation);
        const Outputs gpu = run(in, dtype, device, Impl::chunk, rotation);
        compare_all(gpu, cpu, ref, dtype, Impl::chunk);
      }
    }
  }
}

// Chunk states kept by the forward (chunk_states) on the GPU: the forward copies its states
// there (float32, bfloat16), and they are the CPU chunk kernel's to float32 rounding (grouped
// value heads, two value tiles, several chunks with a partial last one); the GPU backward, whose
// state kernel also forms U_new, recomputes them, so its gradients are those of a call without.
TEST_P(GatedDeltaRuleGpu, ChunkStatesKept) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  for (const Case& c :
       {Case{"grouped_c16", 2, 40, 1, 8, 6, {}, Gates::realistic, true, 16, 2, 1.0, true},
        Case{"tiles_c32", 1, 75, 1, 8, 70, {}, Gates::zeros, false, 32}}) {
    const Inputs in = make_inputs(c, 43);
    const Outputs plain = run(in, DType::float32, device, Impl::chunk, Rotation::half_split);
    const Outputs cpu = run(in, DType::float32, Device::cpu, Impl::chunk, Rotation::half_split,
                            false, DType::float32);
    for (DType keep : {DType::float32, DType::bfloat16}) {
      SCOPED_TRACE(c.name + " chunk states in " + to_string(keep));
      const Outputs kept =
          run(in, DType::float32, device, Impl::chunk, Rotation::half_split, false, keep);
      expect_bit_equal(kept, plain, "with chunk states");
      PHASOR_EXPECT_CLOSE(kept.chunk_states, cpu.chunk_states, keep == DType::float32 ? 1e-5 : 1e-2,
                          "chunk states");
    }
  }
}

// A long sequence (T = 4096, one head, 64 chunks of 64) through chunk_gated_delta_rule on the
// GPU, with the ℓ2 norm and β up to 2: every output and gradient against the CPU chunk kernel and
// the reference, float32.
TEST_P(GatedDeltaRuleGpu, ChunkLongSequence) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in =
      make_inputs({"long", 1, 4096, 1, 16, 16, {}, Gates::realistic, true, 64, 1, 2.0, true}, 23);
  const Outputs ref = reference(in, DType::float32, Rotation::half_split);
  const Outputs cpu = run(in, DType::float32, Device::cpu, Impl::chunk, Rotation::half_split);
  const Outputs gpu = run(in, DType::float32, device, Impl::chunk, Rotation::half_split);
  compare_all(gpu, cpu, ref, DType::float32, Impl::chunk);
}

// Decoding: T = 1 calls with the state updated in place (final_state is initial_state) give the
// outputs and the final state of one call over the whole sequence.
TEST_P(GatedDeltaRuleGpu, DecodingTokenByTokenEqualsOneCall) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in =
      make_inputs({"decode", 2, 7, 1, 6, 5, {}, Gates::realistic, true, 4, 2, 2.0, true}, 11);
  OnDevice on(device);
  GatedDeltaRuleParams p;
  p.q = on.in(in.q);
  p.k = on.in(in.k);
  p.v = on.in(in.v);
  p.g = on.in(in.g);
  p.beta = on.in(in.beta);
  p.use_qk_l2norm_in_kernel = true;
  p.initial_state = on.in(in.h0);
  p.theta = on.in(in.theta);
  const TensorView o = on.out(in.v.shape(), DType::float64),
                   fs = on.out(in.h0.shape(), DType::float64);
  gated_delta_rule_forward(p, Impl::recurrent, o, fs);
  const TensorView state = on.in(in.h0), stepped = on.out(in.v.shape(), DType::float64);
  for (std::int64_t t = 0; t < in.T; ++t) {
    auto step = [&](const TensorView& x) { return testing::token(x, t); };
    GatedDeltaRuleParams s = p;
    s.q = step(p.q);
    s.k = step(p.k);
    s.v = step(p.v);
    s.g = step(p.g);
    s.beta = step(p.beta);
    s.theta = step(p.theta);
    s.initial_state = state;
    gated_delta_rule_forward(s, Impl::recurrent, step(stepped), state);
  }
  EXPECT_TRUE(on.to_host(stepped).bit_equal(on.to_host(o))) << "decoded o";
  EXPECT_TRUE(on.to_host(state).bit_equal(on.to_host(fs))) << "decoded final state";
}

// Every output bit-identical under the forward and a reversed (and a seeded random) order of
// threads and blocks: no race, no order-dependent reduction.
TEST_P(GatedDeltaRuleGpu, BitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  if (device != Device::emulated) GTEST_SKIP() << "schedules are an option of the emulated GPU";
  const Inputs in = make_inputs(
      {"schedules", 1, 0, 1, 10, 37, {5, 0, 8}, Gates::realistic, true, 4, 2, 2.0, true}, 13);
  testing::expect_bit_identical_under_schedules(device, testing::kSchedules, [&] {
    return run(in, DType::float32, device, Impl::recurrent, Rotation::interleaved);
  });
}

// The chunk kernels likewise (several chunks, sub-blocks, key and value tiles).
TEST_P(GatedDeltaRuleGpu, ChunkBitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  if (device != Device::emulated) GTEST_SKIP() << "schedules are an option of the emulated GPU";
  const Inputs in = make_inputs(
      {"schedules", 1, 0, 1, 10, 37, {5, 0, 40}, Gates::realistic, true, 32, 2, 2.0, true}, 13);
  testing::expect_bit_identical_under_schedules(device, testing::kSchedules, [&] {
    return run(in, DType::float32, device, Impl::chunk, Rotation::interleaved);
  });
}

// Strided inputs (every input a slice of a wider tensor) give bit-identical results to contiguous
// ones through the chunk kernels: the kernels read through the views' strides.
TEST_P(GatedDeltaRuleGpu, ChunkStridedInputsEqualContiguous) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in = make_inputs(
      {"strided", 1, 0, 1, 10, 9, {5, 0, 40}, Gates::realistic, true, 32, 2, 2.0, true}, 29);
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    SCOPED_TRACE(to_string(dtype));
    const Outputs a = run(in, dtype, device, Impl::chunk, Rotation::half_split);
    const Outputs b = run(in, dtype, device, Impl::chunk, Rotation::half_split, true);
    expect_bit_equal(a, b, "with strided inputs");
  }
}

// The first n columns of the last dimension.
Tensor first_columns(const Tensor& t, std::int64_t n) {
  if (!t.defined()) return t;
  std::vector<std::int64_t> shape = t.shape();
  const std::int64_t width = shape.back();
  shape.back() = n;
  Tensor out(shape, t.dtype());
  for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, t.at(i / n * width + i % n));
  return out;
}

// The output kernel takes value tiles of 64 columns when V > 32, the scans (states, dstates) when
// the grid of (sequence, value head, 64-column tile) still has 128 blocks; 32 otherwise. Value
// columns do not interact in Gated DeltaNet (S evolves column by column), so the first 32 columns
// of o, final_state, dv and dh0 of a V = 70 call over 32 sequences × 2 value heads (every kernel
// on tiles of 64) must equal, bit for bit, those of a call on its first 32 value columns (tiles of
// 32); the wide call also matches the CPU kernel and the reference in float32.
TEST_P(GatedDeltaRuleGpu, ChunkValueTileWidthDoesNotChangeResults) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  std::vector<std::int64_t> lengths;
  for (int n = 0; n < 32; ++n) lengths.push_back(n % 5 == 3 ? 0 : 1 + (n * 7) % 5);
  const Inputs wide =
      make_inputs({"wide", 1, 0, 1, 16, 70, lengths, Gates::realistic, true, 16, 2, 2.0, true}, 31);
  Inputs narrow = wide;
  narrow.c.V = 32;
  for (Tensor* t : {&narrow.v, &narrow.d_o, &narrow.h0, &narrow.dht}) *t = first_columns(*t, 32);
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    SCOPED_TRACE(to_string(dtype));
    const Outputs a = run(wide, dtype, device, Impl::chunk, Rotation::half_split);
    const Outputs b = run(narrow, dtype, device, Impl::chunk, Rotation::half_split);
    for (auto [x, y, name] : {std::tuple{&a.o, &b.o, "o"},
                              {&a.final_state, &b.final_state, "hT"},
                              {&a.dv, &b.dv, "dv"},
                              {&a.dh0, &b.dh0, "dh0"}})
      EXPECT_TRUE(first_columns(*x, 32).bit_equal(*y)) << name << " depends on the value tile";
    if (dtype == DType::float32)
      compare_all(a, run(wide, dtype, Device::cpu, Impl::chunk, Rotation::half_split),
                  reference(wide, dtype, Rotation::half_split), dtype, Impl::chunk);
  }
}

// A key dimension whose state tile does not fit in shared memory is a phasor::Error naming 'k'
// and the largest K that fits; that K runs and matches the CPU kernel.
TEST_P(GatedDeltaRuleGpu, ChunkKeyDimensionLimitIsAClearError) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const auto message = [&](std::int64_t K) {
    const Inputs in = make_inputs({"limit", 1, 3, 1, K, 3, {}, Gates::realistic, true, 64}, 37);
    std::string what;
    try {
      run(in, DType::float32, device, Impl::chunk, Rotation::none);
    } catch (const Error& e) {
      what = e.what();
    }
    return what;
  };
  const std::string what = message(2048);
  EXPECT_NE(what.find("argument 'k'"), std::string::npos) << what;
  EXPECT_NE(what.find("got K = 2048"), std::string::npos) << what;
  const std::size_t at = what.find("K ≤ ");
  ASSERT_NE(at, std::string::npos) << what;
  const std::int64_t largest = std::stoll(what.substr(at + std::string("K ≤ ").size()));
  // dstates holds the most: (K'·32 + 5·C·32 + C² + 4C) floats with K' = K rounded up to a key
  // tile of 32, within 160 KiB at C = 64 (the figure the README gives).
  EXPECT_EQ(largest, 800) << what;
  EXPECT_NE(message(largest + 1).find("argument 'k'"), std::string::npos);
  const Inputs in =
      make_inputs({"largest", 1, 3, 1, largest, 3, {}, Gates::realistic, true, 64}, 37);
  const Outputs cpu = run(in, DType::float32, Device::cpu, Impl::chunk, Rotation::none);
  const Outputs gpu = run(in, DType::float32, device, Impl::chunk, Rotation::none);
  EXPECT_LE(testing::rel_rms(gpu.o, cpu.o), 1e-5);
  EXPECT_LE(testing::rel_rms(gpu.final_state, cpu.final_state), 1e-5);
  EXPECT_LE(testing::rel_rms(gpu.dk, cpu.dk), 1e-5);
}

// Bad values give the CPU's message on the GPU device, before any kernel runs (nothing written).
TEST_P(GatedDeltaRuleGpu, BadValuesGiveTheCpuErrorAndWriteNothing) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  Inputs in = make_inputs({"bad", 1, 0, 1, 4, 3, {2, 3}}, 17);
  const auto message = [&](Device d, const Tensor& g, const Tensor& cu) {
    OnDevice on(d);
    GatedDeltaRuleParams p;
    p.q = on.in(in.q);
    p.k = on.in(in.k);
    p.v = on.in(in.v);
    p.g = on.in(g);
    p.beta = on.in(in.beta);
    p.cu_seqlens = on.in(cu);
    const TensorView o = on.out(in.v.shape(), DType::float64);
    std::string what;
    try {
      gated_delta_rule_forward(p, Impl::recurrent, o);
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_TRUE(std::isnan(on.to_host(o).at(0))) << "o was written";
    return what;
  };
  Tensor positive = in.g;
  positive.set(2, 0.25);
  const std::string cpu_gate = message(Device::cpu, positive, in.cu);
  EXPECT_NE(cpu_gate.find("'g'"), std::string::npos) << cpu_gate;
  EXPECT_EQ(message(device, positive, in.cu), cpu_gate);
  const Tensor bad_cu = testing::cu_seqlens({3, 3});  // ends at 6, T = 5
  const std::string cpu_cu = message(Device::cpu, in.g, bad_cu);
  EXPECT_NE(cpu_cu.find("cu_seqlens"), std::string::npos) << cpu_cu;
  EXPECT_EQ(message(device, in.g, bad_cu), cpu_cu);
}

INSTANTIATE_TEST_SUITE_P(Devices, GatedDeltaRuleGpu, ::testing::ValuesIn(testing::gpu_devices()),
                         testing::device_param_name);

}  // namespace
}  // namespace phasor
