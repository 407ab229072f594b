// GLA benchmark: B = 1, H = 8, K = V = 128, float32, realistic gates; forward and
// forward + backward for the recurrent and chunk kernels (reference at T = 1024 only).
// items_per_second is tokens per second; peak_MiB is the peak heap of one forward + backward
// (everything allocated on top of the inputs and outputs, Eigen included).
// BM_GlaRecurrentDevice: the recurrent kernel on the CPU, on the emulated GPU (the CUDA kernel's
// source run by the CPU, as in CI; at T = 64 only: emulation costs ~10³×) and on a GPU when one is
// present (T = 1024 … 16384); label "<device>/recurrent".
// BM_GlaChunkStates: the chunk forward and forward + backward with the chunk states kept by the
// forward for the backward (as the LibTorch layer trains) against the backward's replay.
// BM_GlaTrainingStep: the forward, the training forward (chunk states kept) and the backward, each
// timed alone; step_per_fwd = (training forward + backward) ÷ forward.
// BM_GlaHarnessShape: forward + backward of one layer of the synthetic-task harness's quick suite
// (B = 32, H = 2, K = V = 32, T = 64; bench_util.h's kHarnessShape).
// BM_GlaRotation*: rotation angles θ fused into the kernel vs apply_rotary then the op (the
// public Selective RoPE code's way), and no rotation for reference; label "<impl>/<rotation>".
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "phasor/gla.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kH = 8, kK = 128, kV = 128;

// Inputs, outputs and gradients of one problem size, allocated outside the timed loop.
struct Problem {
  std::int64_t T;
  phasor::bench::Shape shape;
  std::vector<float> q, k, v, g, d_o, o, dq, dk, dv, dg;

  explicit Problem(std::int64_t T_, phasor::bench::Shape shape_ = {kB, kH, kK, kV})
      : T(T_), shape(shape_) {
    const auto [B, H, K, V] = shape;
    const auto qk = static_cast<std::size_t>(B * T * H * K);
    const auto vv = static_cast<std::size_t>(B * T * H * V);
    std::mt19937_64 rng(42);
    q = phasor::bench::normal(qk, rng);
    k = phasor::bench::normal(qk, rng);
    v = phasor::bench::normal(vv, rng);
    d_o = phasor::bench::normal(vv, rng);
    g = phasor::bench::log_sigmoid_gates(qk, rng, 3.f);  // typical trained GLA forget gates
    o.assign(vv, 0.f);
    dv.assign(vv, 0.f);
    dq.assign(qk, 0.f);
    dk.assign(qk, 0.f);
    dg.assign(qk, 0.f);
  }

  TensorView qk_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H, shape.K});
  }
  TensorView v_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H, shape.V});
  }
  phasor::GlaParams params() const {
    phasor::GlaParams p;
    p.q = qk_view(q);
    p.k = qk_view(k);
    p.v = v_view(v);
    p.g = qk_view(g);
    p.chunk_size = 64;
    return p;
  }
  phasor::GlaGrads grads() {
    phasor::GlaGrads gr;
    gr.dq = qk_view(dq);
    gr.dk = qk_view(dk);
    gr.dv = v_view(dv);
    gr.dg = qk_view(dg);
    return gr;
  }
};

// Floating-point operations per token of chunk_gla at chunk size C (2 per multiply-add of the
// algorithm's products, per head): the forward's inter-chunk output and state update (2 · 2KV) and
// its causal intra-chunk scores and weighted values ((C + 1)(K + V) on average); the backward
// replays the state (2KV), forms dq, dk, dv and dS from the states (4 · 2KV) and differentiates the
// intra-chunk part (recomputed scores, dA, dq, dk, dv: (C + 1)(3K + 2V)).
// With the chunk states kept by the forward (kept), the backward does not replay the state (8KV).
double gla_chunk_flops(bool backward, bool kept = false) {
  const double K = kK, V = kV, C = 64;
  const double forward = 4 * K * V + (C + 1) * (K + V);
  const double state_products = kept ? 8 * K * V : 10 * K * V;
  return kH * (backward ? forward + state_products + (C + 1) * (3 * K + 2 * V) : forward);
}

void BM_GlaForward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::GlaParams params = problem.params();
  const TensorView o = problem.v_view(problem.o);
  const double seconds = phasor::bench::time_calls(state, problem.T, impl,
                                                   [&] { phasor::gla_forward(params, impl, o); });
  if (impl == Impl::chunk)
    phasor::bench::report_flops(state, seconds, problem.T, gla_chunk_flops(false));
}

void BM_GlaForwardBackward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::GlaParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GlaGrads grads = problem.grads();
  const double seconds = phasor::bench::time_calls(state, problem.T, impl, [&] {
    phasor::gla_forward(params, impl, o);
    phasor::gla_backward(params, impl, d_o, {}, grads);
  });
  if (impl == Impl::chunk)
    phasor::bench::report_flops(state, seconds, problem.T, gla_chunk_flops(true));
}

// The chunk forward (+ backward) with the chunk states kept for the backward, or replayed by it
// (bench_util.h: register_chunk_state_grid).
void BM_GlaChunkStates(benchmark::State& state) {
  const bool kept = state.range(0) != 0, backward = state.range(1) != 0;
  Problem problem(state.range(2));
  const phasor::GlaParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GlaGrads grads = problem.grads();
  const phasor::bench::ChunkStates kept_states(kept, params.q, params.v, params.chunk_size);
  const TensorView& chunk_states = kept_states.view;
  const double seconds = phasor::bench::time_calls(state, problem.T, Impl::chunk, [&] {
    phasor::gla_forward(params, Impl::chunk, o, {}, chunk_states);
    if (backward) phasor::gla_backward(params, Impl::chunk, d_o, {}, grads, chunk_states);
  });
  phasor::bench::report_flops(state, seconds, problem.T, gla_chunk_flops(backward, kept));
  state.SetLabel(phasor::bench::chunk_state_label(kept));
}

// A training step against the inference forward (bench_util.h: time_training_step): the chunk
// forward, the forward keeping the chunk states, and the backward reading them.
void BM_GlaTrainingStep(benchmark::State& state) {
  Problem problem(state.range(0));
  const phasor::GlaParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GlaGrads grads = problem.grads();
  const phasor::bench::ChunkStates kept(true, params.q, params.v, params.chunk_size);
  phasor::bench::time_training_step(
      state, problem.T, {gla_chunk_flops(false), gla_chunk_flops(true, true)},
      [&] { phasor::gla_forward(params, Impl::chunk, o); },
      [&] { phasor::gla_forward(params, Impl::chunk, o, {}, kept.view); },
      [&] { phasor::gla_backward(params, Impl::chunk, d_o, {}, grads, kept.view); });
}

// Forward + backward at the harness's layer shape (bench_util.h: kHarnessShape, T = 64).
void BM_GlaHarnessShape(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(phasor::bench::kHarnessT, phasor::bench::kHarnessShape);
  const phasor::GlaParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GlaGrads grads = problem.grads();
  phasor::bench::time_calls(state, problem.shape.B * problem.T, impl, [&] {
    phasor::gla_forward(params, impl, o);
    phasor::gla_backward(params, impl, d_o, {}, grads);
  });
}

void BM_GlaRecurrentDevice(benchmark::State& state) {
  const auto device = static_cast<phasor::Device>(state.range(0));
  const bool backward = state.range(1) != 0;
  Problem problem(state.range(2));
  const std::int64_t T = problem.T;
  phasor::bench::DeviceBuffers on(device);
  phasor::GlaParams params = problem.params();
  params.q = on.view(problem.q, {kB, T, kH, kK});
  params.k = on.view(problem.k, {kB, T, kH, kK});
  params.v = on.view(problem.v, {kB, T, kH, kV});
  params.g = on.view(problem.g, {kB, T, kH, kK});
  const TensorView o = on.view(problem.o, {kB, T, kH, kV}),
                   d_o = on.view(problem.d_o, {kB, T, kH, kV});
  phasor::GlaGrads grads;
  grads.dq = on.view(problem.dq, {kB, T, kH, kK});
  grads.dk = on.view(problem.dk, {kB, T, kH, kK});
  grads.dv = on.view(problem.dv, {kB, T, kH, kV});
  grads.dg = on.view(problem.dg, {kB, T, kH, kK});
  phasor::bench::time_calls(state, T, Impl::recurrent, [&] {
    phasor::gla_forward(params, Impl::recurrent, o);
    if (backward) phasor::gla_backward(params, Impl::recurrent, d_o, {}, grads);
    phasor::bench::DeviceBuffers::wait_for(backward ? grads.dq : o);
  });
  state.SetLabel(std::string(phasor::to_string(device)) + "/recurrent" +
                 (backward ? "/fwd+bwd" : "/fwd"));
}

// chunk_gla at K = V = 128 in bfloat16 on a device: the CPU and the emulated GPU at T = 64 (the
// emulation's cost), fla's shapes on a GPU (B = 2, T = 16384, H = 16 and B = 1, T = 8192, H = 96;
// fla publishes 1.445 ms forward, 5.984 ms forward + backward for the first on a GB200).
void BM_GlaChunkDevice(benchmark::State& state) {
  const auto device = static_cast<phasor::Device>(state.range(0));
  const bool backward = state.range(1) != 0;
  const std::int64_t B = state.range(2), T = state.range(3), H = state.range(4), K = 128, V = 128;
  std::mt19937_64 rng(5);
  const auto qk = static_cast<std::size_t>(B * T * H * K),
             vv = static_cast<std::size_t>(B * T * H * V);
  const std::vector<float> q = phasor::bench::normal(qk, rng), k = phasor::bench::normal(qk, rng),
                           v = phasor::bench::normal(vv, rng), d_o = phasor::bench::normal(vv, rng),
                           g = phasor::bench::log_sigmoid_gates(qk, rng, 3.f);
  const phasor::DType bf16 = phasor::DType::bfloat16;
  phasor::bench::DeviceBuffers on(device);
  phasor::GlaParams p;
  p.q = on.view(q, {B, T, H, K}, bf16);
  p.k = on.view(k, {B, T, H, K}, bf16);
  p.v = on.view(v, {B, T, H, V}, bf16);
  p.g = on.view(g, {B, T, H, K}, bf16);
  p.chunk_size = 64;
  const std::vector<float> zeros(vv, 0.f), zeros_k(qk, 0.f);
  const TensorView o = on.view(zeros, {B, T, H, V}, bf16), dout = on.view(d_o, {B, T, H, V}, bf16);
  phasor::GlaGrads grads;
  grads.dq = on.view(zeros_k, {B, T, H, K}, bf16);
  grads.dk = on.view(zeros_k, {B, T, H, K}, bf16);
  grads.dv = on.view(zeros, {B, T, H, V}, bf16);
  grads.dg = on.view(zeros_k, {B, T, H, K}, bf16);
  phasor::bench::time_device_calls(state, device, B * T, [&] {
    phasor::gla_forward(p, Impl::chunk, o);
    if (backward) phasor::gla_backward(p, Impl::chunk, dout, {}, grads);
  });
  state.SetLabel(std::string(phasor::to_string(device)) + "/chunk/bf16" +
                 (backward ? "/fwd+bwd" : "/fwd"));
}

// Decoding: one token (B = 1, T = 1, H = 8, float32) through fused_recurrent_gla with the state
// updated in place (final_state = initial_state, 64-byte aligned as LibTorch's tensors are), as a
// serving loop calls it, on `threads` threads (phasor::set_num_threads); time per call. K = V =
// 128 is the model's shape; K = V = 2 leaves almost no arithmetic, so its time is the per-call
// overhead (checks, dispatch, thread hand-off).
void BM_GlaDecode(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const std::int64_t D = state.range(1);
  std::mt19937_64 rng(3);
  const auto n = static_cast<std::size_t>(kB * kH * D);
  const std::vector<float> q = phasor::bench::normal(n, rng), k = phasor::bench::normal(n, rng),
                           v = phasor::bench::normal(n, rng),
                           g = phasor::bench::log_sigmoid_gates(n, rng, 3.f);
  std::vector<float> o(n, 0.f);
  const auto h = phasor::bench::aligned_state(static_cast<std::size_t>(kB * kH * D * D));
  phasor::GlaParams params;
  params.q = TensorView::of(q.data(), {kB, 1, kH, D});
  params.k = TensorView::of(k.data(), {kB, 1, kH, D});
  params.v = TensorView::of(v.data(), {kB, 1, kH, D});
  params.g = TensorView::of(g.data(), {kB, 1, kH, D});
  params.initial_state = TensorView::of(h.get(), {kB, kH, D, D});
  const TensorView out = TensorView::of(o.data(), {kB, 1, kH, D});
  phasor::bench::time_decode(state, threads, D, [&] {
    phasor::gla_forward(params, Impl::recurrent, out, params.initial_state);
  });
}

// chunk_gla forward with the benchmark's inputs in float32 or rounded to bfloat16 (computing in
// float32 either way; o float32).
void BM_GlaInputDtype(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  Problem problem(state.range(1));
  phasor::GlaParams params = problem.params();
  std::vector<phasor::bfloat16> q16, k16, v16, g16;  // the bfloat16 copies
  if (bf16) {
    params.q = phasor::bench::bfloat16_copy(params.q, q16);
    params.k = phasor::bench::bfloat16_copy(params.k, k16);
    params.v = phasor::bench::bfloat16_copy(params.v, v16);
    params.g = phasor::bench::bfloat16_copy(params.g, g16);
  }
  const TensorView o = problem.v_view(problem.o);
  phasor::bench::time_dtype(state, bf16, problem.T,
                            [&] { phasor::gla_forward(params, Impl::chunk, o); });
}

// One long sequence: B = H = 1, T = 65,536 (chunk_gla, forward and forward + backward, 1 and 2
// threads).
void BM_GlaLongSequence(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const bool backward = state.range(1) != 0, kept = state.range(2) != 0;
  Problem problem(65536, {1, 1, kK, kV});
  const phasor::GlaParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::bench::ChunkStates kept_states(kept, params.q, params.v, params.chunk_size);
  const TensorView& chunk_states = kept_states.view;
  const phasor::GlaGrads grads = problem.grads();
  phasor::bench::time_long_sequence(
      state, threads, backward, problem.T,
      [&] {
        phasor::gla_forward(params, Impl::chunk, o, {}, chunk_states);
        if (backward) phasor::gla_backward(params, Impl::chunk, d_o, {}, grads, chunk_states);
      },
      kept);
}

// Rotation by Selective-RoPE-like angles: none / fused into the kernel / apply_rotary + op
// (bench_util.h, Rotation). Same inputs as above; gradients include dθ.
void BM_GlaRotationForward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(1));
  Problem problem(state.range(2));
  std::mt19937_64 rng(7);
  phasor::bench::RotationBuffers rot(kB, problem.T, kH, kK, rng);
  const TensorView o = problem.v_view(problem.o);
  phasor::bench::time_rotation_forward(
      state, problem.T, impl, static_cast<phasor::bench::Rotation>(state.range(0)), rot,
      problem.params(), [&](const phasor::GlaParams& p) { phasor::gla_forward(p, impl, o); });
}

void BM_GlaRotationForwardBackward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(1));
  Problem problem(state.range(2));
  std::mt19937_64 rng(7);
  phasor::bench::RotationBuffers rot(kB, problem.T, kH, kK, rng);
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  phasor::bench::time_rotation_forward_backward(
      state, problem.T, impl, static_cast<phasor::bench::Rotation>(state.range(0)), rot,
      problem.params(), problem.grads(),
      [&](const phasor::GlaParams& p, const phasor::GlaGrads& gr) {
        phasor::gla_forward(p, impl, o);
        phasor::gla_backward(p, impl, d_o, {}, gr);
      });
}

const bool registered = [] {
  using benchmark::RegisterBenchmark;
  phasor::bench::register_standard_grid(RegisterBenchmark("BM_GlaForward", BM_GlaForward),
                                        RegisterBenchmark("BM_GlaForward", BM_GlaForward));
  phasor::bench::register_standard_grid(
      RegisterBenchmark("BM_GlaForwardBackward", BM_GlaForwardBackward),
      RegisterBenchmark("BM_GlaForwardBackward", BM_GlaForwardBackward));
  phasor::bench::register_chunk_state_grid(
      RegisterBenchmark("BM_GlaChunkStates", BM_GlaChunkStates));
  phasor::bench::register_training_step_grid(
      RegisterBenchmark("BM_GlaTrainingStep", BM_GlaTrainingStep), {1024, 4096, 16384});
  phasor::bench::register_device_grid(
      RegisterBenchmark("BM_GlaRecurrentDevice", BM_GlaRecurrentDevice));
  phasor::bench::register_chunk_device_grid(
      RegisterBenchmark("BM_GlaChunkDevice", BM_GlaChunkDevice));
  phasor::bench::register_decode_grid(RegisterBenchmark("BM_GlaDecode", BM_GlaDecode));
  phasor::bench::register_harness_grid(RegisterBenchmark("BM_GlaHarnessShape", BM_GlaHarnessShape),
                                       {Impl::recurrent, Impl::chunk});
  phasor::bench::register_long_sequence_grid(
      RegisterBenchmark("BM_GlaLongSequence", BM_GlaLongSequence), true, true);
  phasor::bench::register_dtype_grid(RegisterBenchmark("BM_GlaInputDtype", BM_GlaInputDtype));
  phasor::bench::register_rotation_grid(
      RegisterBenchmark("BM_GlaRotationForward", BM_GlaRotationForward),
      {Impl::recurrent, Impl::chunk});
  phasor::bench::register_rotation_grid(
      RegisterBenchmark("BM_GlaRotationForwardBackward", BM_GlaRotationForwardBackward),
      {Impl::recurrent, Impl::chunk});
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
