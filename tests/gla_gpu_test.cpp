// GLA's recurrent CUDA kernels (cuda/gla/recurrent.cu, fused_recurrent_gla) against the CPU
// recurrent kernel and the float64 reference, on every GPU device (Device::emulated always;
// Device::cuda when the machine has a GPU, otherwise SKIPPED): o, final_state and every gradient
// (dq, dk, dv, dg, dh0, dθ, with d_final_state), in float64, float32, bfloat16 and float16, without
// rotation and with θ in both layouts, over realistic, strong (−20 per token), weak (−1e-4),
// mixed-channel and exactly-zero (−inf) gates, varlen batches with empty and one-token sequences,
// T = 1, T not a multiple of the checkpoint interval, K ≠ V, odd sizes (K = 6, V = 5), K = 48 and
// V = 40 (crossing a warp of key rows and a tile of value columns). Tolerances
// (gpu_gtest.h): float64 ≤ 1e-12 and float32 ≤ 1e-5 relative RMS against the reference
// (and float32 within 1e-5 of the CPU kernel); 16-bit inputs: at most twice the CPU kernel's own
// error on the same rounded inputs, + 1e-6. Also: decoding token by token with the state updated
// in place equals one call, bit-identical results under two emulator schedules, the CPU's error
// text for a positive gate and a bad cu_seqlens, and K above the kernel's limit is a clear error.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "phasor/emulator.h"
#include "phasor/gla.h"
#include "phasor/ops.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gpu_gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::OnDevice;
using testing::Rotation;
using testing::Tensor;

enum class Gates { realistic, strong, weak, mixed, zeros };

struct Case {
  std::string name;
  std::int64_t B, T, H, K, V;
  std::vector<std::int64_t> lengths = {};  // non-empty: packed with cu_seqlens (B = 1)
  Gates gates = Gates::realistic;
  bool initial_state = true;
  std::int64_t chunk_size = 4;
};

// float64 master copies of every input.
struct Inputs {
  Case c;
  std::int64_t B = 0, T = 0, N = 0;
  Tensor q, k, v, g, h0, cu, theta, d_o, dht;
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.c = c;
  const testing::Batch batch = testing::batch_of(c.B, c.T, c.lengths);
  in.B = batch.B, in.T = batch.T, in.N = batch.N;
  in.cu = batch.cu_seqlens;
  const std::vector<std::int64_t> qk = {in.B, in.T, c.H, c.K}, vv = {in.B, in.T, c.H, c.V};
  in.q = testing::randn(qk, rng);
  in.k = testing::randn(qk, rng);
  in.v = testing::randn(vv, rng);
  in.g = testing::log_sigmoid_gates(qk, rng, 2.0);
  for (std::int64_t i = 0; i < in.g.numel(); ++i) {
    const std::int64_t channel = i % c.K;
    switch (c.gates) {
      case Gates::realistic:
        break;
      case Gates::strong:
        in.g.set(i, -20.0);
        break;
      case Gates::weak:
        in.g.set(i, -1e-4);
        break;
      case Gates::mixed:
        in.g.set(i, channel % 2 == 0 ? -20.0 : -1e-4);
        break;
      case Gates::zeros:
        if (i % 7 == 3) in.g.set(i, -std::numeric_limits<double>::infinity());
        break;
    }
  }
  if (c.initial_state) in.h0 = testing::randn({in.N, c.H, c.K, c.V}, rng);
  if (c.K % 2 == 0) in.theta = testing::randn({in.B, in.T, c.H, c.K / 2}, rng, 20.0);
  in.d_o = testing::randn(vv, rng);
  in.dht = testing::randn({in.N, c.H, c.K, c.V}, rng);
  return in;
}

struct Outputs {
  Tensor o, final_state, dq, dk, dv, dg, dh0, dtheta;
  Tensor chunk_states;  // when kept (not among fields())
  testing::NamedTensors fields() const {
    return {{"o", &o},     {"final_state", &final_state},
            {"dq", &dq},   {"dk", &dk},
            {"dv", &dv},   {"dg", &dg},
            {"dh0", &dh0}, {"dtheta", &dtheta}};
  }
};

// How a call keeps its chunk states (chunk_states): not at all, or in a dtype, contiguous or
// through a strided view.
struct Keep {
  bool kept = false;
  DType dtype = DType::float32;
  bool strided = false;
};

// Forward and backward of `impl` on `device`, every input rounded to `dtype`, outputs in `dtype`
// (states and dh0 in float32, or float64 for float64 inputs).
// strided: every input through a strided view (OnDevice::in_strided).
Outputs run(const Inputs& in, DType dtype, Device device, Impl impl, Rotation rotation,
            bool strided = false, Keep keep = {}) {
  OnDevice on(device);
  auto input = [&](const Tensor& t) { return on.in(t, dtype, strided); };
  const DType state_dtype = testing::compute_dtype(dtype);
  GlaParams p;
  p.q = input(in.q);
  p.k = input(in.k);
  p.v = input(in.v);
  p.g = input(in.g);
  p.initial_state = on.in(in.h0, state_dtype);
  p.cu_seqlens = on.in(in.cu);
  p.chunk_size = in.c.chunk_size;
  if (rotation != Rotation::none) {
    p.theta = input(in.theta);
    p.rotary_layout = testing::layout_of(rotation);
  }
  const TensorView o = on.out(in.v.shape(), dtype),
                   fs = on.out({in.N, in.c.H, in.c.K, in.c.V}, state_dtype);
  TensorView kept;
  if (keep.kept) {
    const Tensor nans = Tensor::nans(
        {num_chunk_states(p.q, p.cu_seqlens, p.chunk_size), in.c.H, in.c.K, in.c.V}, keep.dtype);
    kept = keep.strided ? on.in_strided(nans) : on.out(nans);
  }
  gla_forward(p, impl, o, fs, kept);
  GlaGrads grads;
  grads.dq = on.out(in.q.shape(), dtype);
  grads.dk = on.out(in.q.shape(), dtype);
  grads.dv = on.out(in.v.shape(), dtype);
  grads.dg = on.out(in.q.shape(), dtype);
  if (in.h0.defined()) grads.dh0 = on.out(in.h0.shape(), state_dtype);
  if (rotation != Rotation::none) grads.dtheta = on.out(in.theta.shape(), dtype);
  gla_backward(p, impl, input(in.d_o), on.in(in.dht, state_dtype), grads, kept);
  Outputs r;
  if (kept.defined()) r.chunk_states = on.to_host(kept);
  r.o = on.to_host(o);
  r.final_state = on.to_host(fs);
  r.dq = on.to_host(grads.dq);
  r.dk = on.to_host(grads.dk);
  r.dv = on.to_host(grads.dv);
  r.dg = on.to_host(grads.dg);
  if (grads.dh0.defined()) r.dh0 = on.to_host(grads.dh0);
  if (grads.dtheta.defined()) r.dtheta = on.to_host(grads.dtheta);
  return r;
}

// The float64 reference on the inputs rounded to `dtype` (states rounded to their dtype).
Outputs reference(const Inputs& in, DType dtype, Rotation rotation) {
  Inputs rounded = in;
  for (Tensor* t : {&rounded.q, &rounded.k, &rounded.v, &rounded.g, &rounded.theta, &rounded.d_o})
    *t = t->rounded_to(dtype);
  for (Tensor* t : {&rounded.h0, &rounded.dht}) *t = t->rounded_to(testing::compute_dtype(dtype));
  return run(rounded, DType::float64, Device::cpu, Impl::reference, rotation);
}

// Every output against the CPU kernel's and the reference's (device_test rules: 16-bit inputs
// through the chunk kernels' tensor cores).
void compare_all(const Outputs& gpu, const Outputs& cpu, const Outputs& ref, DType dtype,
                 Impl impl = Impl::recurrent) {
  testing::GpuArithmetic arithmetic;
  arithmetic.tensor_cores = impl == Impl::chunk;
  testing::expect_gpu_results(gpu.fields(), cpu.fields(), ref.fields(), dtype,
                              op_name(Op::gla, impl), arithmetic);
}

class GlaGpu : public ::testing::TestWithParam<Device> {};

TEST_P(GlaGpu, MatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::vector<Case> cases = {
      {"realistic", 2, 11, 2, 8, 6},
      {"strong", 1, 9, 1, 8, 8, {}, Gates::strong},
      {"weak", 1, 9, 2, 4, 3, {}, Gates::weak},
      {"mixed_channels", 1, 10, 1, 6, 7, {}, Gates::mixed},
      {"zeros", 2, 7, 1, 8, 5, {}, Gates::zeros},
      {"varlen_empty_single", 1, 0, 2, 6, 5, {3, 0, 1, 9, 0}, Gates::realistic, true, 4},
      {"one_token", 2, 1, 1, 4, 4},
      {"odd_sizes_no_state", 1, 6, 1, 6, 5, {}, Gates::realistic, false, 5},
      {"K48_V40", 1, 5, 1, 48, 40, {}, Gates::realistic, true, 2},
      {"K0", 1, 6, 2, 0, 5},  // no state: o = 0 (every launch of an empty grid runs nothing)
      {"V0", 1, 6, 2, 4, 0},  // no values: o and the state are empty, dq = dk = dg = dθ = 0
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

// chunk_gla on the GPU (cuda/gla/chunk.cu): chunks of 16, 32 and 64 tokens with partial last
// chunks, T shorter than a chunk, several 16-token sub-blocks per chunk (the off-diagonal
// strips), several key and value tiles (K = 48 with rotation pairs across tiles, K = 33, V = 40,
// V = 140: three value tiles of 64), K = 0 (no key tiles: found by op_args_fuzz, whose launch of
// zero key tiles was an error), the same gate and varlen cases as above; against the CPU chunk
// kernel and the reference.
TEST_P(GlaGpu, ChunkMatchesCpuAndReference) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::vector<Case> cases = {
      {"realistic_c32", 2, 70, 2, 8, 6, {}, Gates::realistic, true, 32},
      {"strong_c64", 1, 70, 1, 8, 8, {}, Gates::strong, true, 64},
      {"weak_c16", 1, 37, 2, 4, 3, {}, Gates::weak, true, 16},
      {"mixed_channels_c64", 1, 50, 1, 6, 7, {}, Gates::mixed, true, 64},
      {"zeros_c32", 2, 45, 1, 8, 5, {}, Gates::zeros, true, 32},
      {"varlen_empty_single_c16", 1, 0, 2, 6, 5, {3, 0, 1, 40, 0}, Gates::realistic, true, 16},
      {"one_token_c64", 2, 1, 1, 4, 4, {}, Gates::realistic, true, 64},
      {"odd_sizes_no_state_c32", 1, 34, 1, 6, 5, {}, Gates::realistic, false, 32},
      {"K48_V40_c32", 1, 40, 1, 48, 40, {}, Gates::realistic, true, 32},
      {"K33_c16", 1, 20, 1, 33, 9, {}, Gates::realistic, true, 16},
      {"V140_c32", 1, 40, 1, 8, 140, {}, Gates::realistic, true, 32},  // three value tiles of 64
      {"K0_c16", 1, 20, 2, 0, 5, {}, Gates::realistic, true, 16},      // no state: o = 0, dv = 0
      {"V0_c16", 1, 20, 2, 4, 0, {}, Gates::realistic, true, 16},  // no values: dq = dk = dg = 0
  };
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, 5);
    for (Rotation rotation : {Rotation::none, Rotation::half_split, Rotation::interleaved}) {
      if (rotation != Rotation::none && c.K % 2 != 0) continue;
      for (DType dtype : testing::gpu_test_dtypes()) {
        SCOPED_TRACE(c.name + " " + testing::to_string(rotation) + " " + to_string(dtype));
        const Outputs ref = reference(in, dtype, rotation);
        const Outputs cpu = run(in, dtype, Device::cpu, Impl::chunk, rotation);
        const Outputs gpu = run(in, dtype, device, Impl::chunk, rotation);
        compare_all(gpu, cpu, ref, dtype, Impl::chunk);
      }
    }
  }
}

// Chunk states kept by the forward (chunk_states) on the GPU: the kernels' own workspace when
// they are float32 and contiguous, a copy in and out otherwise (bfloat16, a strided view). The
// outputs and gradients are those of the calls without them (bit for bit in the compute dtype),
// and the kept states are the CPU chunk kernel's (to float32 rounding), with several chunks, a
// partial last chunk, two key and value tiles, rotation, and a packed batch (whose gradients are
// checked; its states between sequences hold nothing to compare). Empty states (K = 0 or V = 0)
// are copied too: their shape is the call's, never divided out of an element count (found by
// op_args_fuzz: a division by zero).
TEST_P(GlaGpu, ChunkStatesKept) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const std::vector<Case> cases = {
      {"rows_c16", 2, 70, 2, 8, 6, {}, Gates::realistic, true, 16},
      {"tiles_c32", 1, 75, 1, 40, 70, {}, Gates::mixed, false, 32},
      {"packed_c16", 1, 0, 2, 6, 5, {3, 0, 1, 40, 0, 20}, Gates::zeros, true, 16},
      {"K0_c16", 1, 20, 2, 0, 5, {}, Gates::realistic, true, 16},
      {"V0_c16", 1, 20, 2, 4, 0, {}, Gates::realistic, true, 16},
  };
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, 41);
    const Rotation rotation = Rotation::half_split;
    const Outputs plain = run(in, DType::float32, device, Impl::chunk, rotation);
    const Outputs cpu = run(in, DType::float32, Device::cpu, Impl::chunk, rotation, false,
                            Keep{true, DType::float32, false});
    for (const Keep keep : {Keep{true, DType::float32, false}, Keep{true, DType::float32, true},
                            Keep{true, DType::bfloat16, false}}) {
      SCOPED_TRACE(c.name + " chunk states in " + to_string(keep.dtype) +
                   (keep.strided ? ", strided" : ""));
      const Outputs kept = run(in, DType::float32, device, Impl::chunk, rotation, false, keep);
      if (keep.dtype == DType::float32)
        testing::expect_bit_equal(kept.fields(), plain.fields(), "with chunk states");
      else
        testing::expect_close(kept.fields(), plain.fields(), 1e-2, "with bfloat16 chunk states");
      if (c.lengths.empty())
        PHASOR_EXPECT_CLOSE(kept.chunk_states, cpu.chunk_states,
                            keep.dtype == DType::float32 ? 1e-5 : 1e-2, "chunk states");
    }
  }
}

// A long sequence (T = 4096, one head, 64 chunks of 64) through chunk_gla on the GPU: every
// output and gradient against the CPU chunk kernel and the reference, float32.
TEST_P(GlaGpu, ChunkLongSequence) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in = make_inputs({"long", 1, 4096, 1, 16, 16, {}, Gates::realistic, true, 64}, 23);
  const Outputs ref = reference(in, DType::float32, Rotation::half_split);
  const Outputs cpu = run(in, DType::float32, Device::cpu, Impl::chunk, Rotation::half_split);
  const Outputs gpu = run(in, DType::float32, device, Impl::chunk, Rotation::half_split);
  compare_all(gpu, cpu, ref, DType::float32, Impl::chunk);
}

// Decoding: T = 1 calls with the state updated in place (final_state is initial_state) give the
// outputs and the final state of one call over the whole sequence.
TEST_P(GlaGpu, DecodingTokenByTokenEqualsOneCall) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in = make_inputs({"decode", 2, 7, 2, 6, 5}, 11);
  OnDevice on(device);
  GlaParams p;
  p.q = on.in(in.q);
  p.k = on.in(in.k);
  p.v = on.in(in.v);
  p.g = on.in(in.g);
  p.initial_state = on.in(in.h0);
  p.theta = on.in(in.theta);
  const TensorView o = on.out(in.v.shape(), DType::float64),
                   fs = on.out(in.h0.shape(), DType::float64);
  gla_forward(p, Impl::recurrent, o, fs);
  const TensorView state = on.in(in.h0), stepped = on.out(in.v.shape(), DType::float64);
  for (std::int64_t t = 0; t < in.T; ++t) {
    auto step = [&](const TensorView& x) { return testing::token(x, t); };
    GlaParams s = p;
    s.q = step(p.q);
    s.k = step(p.k);
    s.v = step(p.v);
    s.g = step(p.g);
    s.theta = step(p.theta);
    s.initial_state = state;
    gla_forward(s, Impl::recurrent, step(stepped), state);
  }
  EXPECT_TRUE(on.to_host(stepped).bit_equal(on.to_host(o))) << "decoded o";
  EXPECT_TRUE(on.to_host(state).bit_equal(on.to_host(fs))) << "decoded final state";
}

// Every output bit-identical under the forward and a reversed (and a seeded random) order of
// threads and blocks: no race, no order-dependent reduction.
TEST_P(GlaGpu, BitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  if (device != Device::emulated) GTEST_SKIP() << "schedules are an option of the emulated GPU";
  const Inputs in = make_inputs({"schedules", 1, 0, 2, 10, 37, {5, 0, 8}}, 13);
  testing::expect_bit_identical_under_schedules(device, testing::kSchedules, [&] {
    return run(in, DType::float32, device, Impl::recurrent, Rotation::interleaved);
  });
}

// The chunk kernels likewise (several chunks, sub-blocks, key and value tiles).
TEST_P(GlaGpu, ChunkBitIdenticalUnderEmulatorSchedules) {
  const Device device = GetParam();
  if (device != Device::emulated) GTEST_SKIP() << "schedules are an option of the emulated GPU";
  const Inputs in =
      make_inputs({"schedules", 1, 0, 2, 10, 37, {5, 0, 40}, Gates::realistic, true, 32}, 13);
  testing::expect_bit_identical_under_schedules(device, testing::kSchedules, [&] {
    return run(in, DType::float32, device, Impl::chunk, Rotation::interleaved);
  });
}

// Strided inputs (every input a slice of a wider tensor) give bit-identical results to contiguous
// ones through the chunk kernels: the kernels read through the views' strides.
TEST_P(GlaGpu, ChunkStridedInputsEqualContiguous) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in =
      make_inputs({"strided", 1, 0, 2, 10, 9, {5, 0, 40}, Gates::realistic, true, 32}, 29);
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    SCOPED_TRACE(to_string(dtype));
    const Outputs a = run(in, dtype, device, Impl::chunk, Rotation::half_split);
    const Outputs b = run(in, dtype, device, Impl::chunk, Rotation::half_split, true);
    testing::expect_bit_equal(b.fields(), a.fields(), "with strided inputs");
  }
}

// Bad values give the CPU's message on the GPU device, before any kernel runs (nothing written).
TEST_P(GlaGpu, BadValuesGiveTheCpuErrorAndWriteNothing) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  Inputs in = make_inputs({"bad", 1, 0, 1, 4, 3, {2, 3}}, 17);
  const auto message = [&](Device d, const Tensor& g, const Tensor& cu) {
    OnDevice on(d);
    GlaParams p;
    p.q = on.in(in.q);
    p.k = on.in(in.k);
    p.v = on.in(in.v);
    p.g = on.in(g);
    p.cu_seqlens = on.in(cu);
    const TensorView o = on.out(in.v.shape(), DType::float64);
    std::string what;
    try {
      gla_forward(p, Impl::recurrent, o);
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_TRUE(std::isnan(on.to_host(o).at(0))) << "o was written";
    return what;
  };
  Tensor positive = in.g;
  positive.set(5, 0.25);
  const std::string cpu_gate = message(Device::cpu, positive, in.cu);
  EXPECT_NE(cpu_gate.find("'g'"), std::string::npos) << cpu_gate;
  EXPECT_EQ(message(device, positive, in.cu), cpu_gate);
  const Tensor bad_cu = testing::cu_seqlens({3, 3});  // ends at 6, T = 5
  const std::string cpu_cu = message(Device::cpu, in.g, bad_cu);
  EXPECT_NE(cpu_cu.find("cu_seqlens"), std::string::npos) << cpu_cu;
  EXPECT_EQ(message(device, in.g, bad_cu), cpu_cu);
}

// K above the recurrent kernel's register tile is a phasor::Error naming q and the range; the
// reference names the implementation, a chunk size the GPU kernels are not built for names
// chunk_size.
TEST_P(GlaGpu, UnsupportedCallsAreClearErrors) {
  const Device device = GetParam();
  PHASOR_SKIP_WITHOUT_GPU(device);
  const Inputs in = make_inputs({"wide", 1, 2, 1, 258, 2, {}, Gates::realistic, false}, 19);
  OnDevice on(device);
  GlaParams p;
  p.q = on.in(in.q);
  p.k = on.in(in.k);
  p.v = on.in(in.v);
  p.g = on.in(in.g);
  const TensorView o = on.out(in.v.shape(), DType::float64);
  try {
    gla_forward(p, Impl::recurrent, o);
    ADD_FAILURE() << "K = 258 accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'q'"), std::string::npos) << what;
    EXPECT_NE(what.find("K = 258"), std::string::npos) << what;
  }
  // The float64 reference runs on the cpu only; the GPU chunk kernels take chunks of 16, 32, 64.
  testing::expect_error([&] { gla_forward(p, Impl::reference, o); },
                        {"gla_reference", "'impl'", "fused_recurrent_gla", "chunk_gla"});
  p.chunk_size = 8;
  testing::expect_error([&] { gla_forward(p, Impl::chunk, o); },
                        {"chunk_gla", "'chunk_size'", "16, 32 or 64", "got 8"});
}

INSTANTIATE_TEST_SUITE_P(Devices, GlaGpu, ::testing::ValuesIn(testing::gpu_devices()),
                         testing::device_param_name);

}  // namespace
}  // namespace phasor
