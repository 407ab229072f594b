// Forgetting attention (FoX) benchmark: B = 1, HQ = H = 8, K = V = 128, float32, realistic gates,
// full causal attention.
//  - BM_FoxForward: the tiled chunk kernel (block_size 64) and, side by side, the recurrent
//    implementation (every sequence decoded token by token through a key/value cache),
//    T ∈ {1024, 4096, 16384}; the float64 reference at T = 1024 only.
//  - BM_FoxForwardBackward: the chunk kernel (the backward given the forward's o and lse), same
//    T; the reference at T = 1024.
//  - BM_FoxSlopesForward / BM_FoxSlopesForwardBackward: the chunk kernel without and with the
//    additive GRAPE-A-QK bias (per-query and per-key slopes ω·softplus(·), ω = 0.02; the backward
//    also writes da, db), T ∈ {1024, 4096}, label "chunk/no_bias" or "chunk/grape_a_qk".
//  - BM_FoxTrainingStep: the forward, the training forward (lse too) and the backward, each
//    timed alone; step_per_fwd = (training forward + backward) ÷ forward. T ∈ {1024, 4096}.
//  - BM_FoxHarnessShape: forward + backward (chunk and recurrent) of one layer of the
//    synthetic-task harness's quick suite (B = 32, H = 2, K = V = 32, T = 64).
//  - BM_FoxCacheDecode: the public ForgettingAttnCache, one step() call per token (T ≤ 4096;
//    BM_FoxForward's recurrent rows are the same decoding without the per-call overhead).
//  - BM_FoxLongSequence: one long sequence (B = H = 1, T = 16384), the chunk forward and forward
//    + backward on 1 and 2 threads (the query blocks and the backward's segments in parallel).
//  - BM_FoxCacheStep: one step() with 1k, 4k or 16k tokens already cached, on 1 and 2 threads
//    (µs per token at that context length).
//  - BM_FoxCacheDecodeDevice: the same decoding with the cache on a device: the CPU, the emulated
//    GPU (the CUDA decode kernels run thread by thread, T = 64: a cost figure, not a speed) and,
//    when the machine has one, a CUDA GPU (T ∈ {1024, 4096, 16384}, the CPU beside it); each
//    step waits for the GPU before the next one, as a generation loop that samples would.
//  - BM_FoxChunkDevice: parallel_forgetting_attn (block_size 64) forward and forward + backward
//    (given the forward's o and lse) on the CPU, the emulated GPU (the CUDA chunk kernels run
//    thread by thread, T = 64: a cost figure, not a speed) and a GPU when present (T ∈ {1024,
//    4096, 16384}, the CPU beside it).
// items_per_second is tokens per second; peak_MiB is the peak heap of one call (forward, or
// forward + backward), i.e. everything allocated on top of the caller's inputs and outputs,
// Eigen included: it grows O(T) (no T × T matrix).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bench_util.h"
#include "phasor/forgetting_attn.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kH = 8, kK = 128, kV = 128;

// Inputs, outputs and gradients of one problem size, allocated outside the timed loop.
struct Problem {
  std::int64_t T;
  phasor::bench::Shape shape;
  std::vector<float> q, k, v, g, d_o, o, lse, dq, dk, dv, dg;

  explicit Problem(std::int64_t T_, phasor::bench::Shape shape_ = {kB, kH, kK, kV})
      : T(T_), shape(shape_) {
    const auto [B, H, K, V] = shape;
    const auto qk = static_cast<std::size_t>(B * T * H * K);
    const auto vv = static_cast<std::size_t>(B * T * H * V);
    const auto gates = static_cast<std::size_t>(B * T * H);
    std::mt19937_64 rng(42);
    q = phasor::bench::normal(qk, rng);
    k = phasor::bench::normal(qk, rng);
    v = phasor::bench::normal(vv, rng);
    d_o = phasor::bench::normal(vv, rng);
    // Forget gates close to 1 (σ(5)), so attention reaches far back.
    g = phasor::bench::log_sigmoid_gates(gates, rng, 5.f);
    o.assign(vv, 0.f);
    lse.assign(gates, 0.f);
    dq.assign(qk, 0.f);
    dk.assign(qk, 0.f);
    dv.assign(vv, 0.f);
    dg.assign(gates, 0.f);
  }

  TensorView qk_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H, shape.K});
  }
  TensorView v_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H, shape.V});
  }
  TensorView gate_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H});
  }
  phasor::ForgettingAttnParams params() const {
    phasor::ForgettingAttnParams p;
    p.q = qk_view(q);
    p.k = qk_view(k);
    p.v = v_view(v);
    p.g = gate_view(g);
    p.block_size = 64;
    return p;
  }
  phasor::ForgettingAttnGrads grads() {
    phasor::ForgettingAttnGrads gr;
    gr.dq = qk_view(dq);
    gr.dk = qk_view(dk);
    gr.dv = v_view(dv);
    gr.dg = gate_view(dg);
    return gr;
  }
};

double mib(std::int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// Floating-point operations per token of parallel_forgetting_attn over T causal tokens (2 per
// multiply-add, per head; the gate bias and exp not counted): the forward's scores and weighted
// values, (T + 1)(K + V) on average; the backward recomputes the scores and forms dV, dP, dQ, dK,
// (T + 1)(3K + 2V) — as flash attention's.
double fox_chunk_flops(std::int64_t T, bool backward) {
  const double K = kK, V = kV, n = static_cast<double>(T) + 1;
  return kH * (backward ? n * (4 * K + 3 * V) : n * (K + V));
}

void BM_FoxForward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::ForgettingAttnParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse);
  const double seconds = phasor::bench::time_calls(
      state, problem.T, impl, [&] { phasor::forgetting_attn_forward(params, impl, o, lse); });
  if (impl == Impl::chunk)
    phasor::bench::report_flops(state, seconds, problem.T, fox_chunk_flops(problem.T, false));
}

void BM_FoxForwardBackward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::ForgettingAttnParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse),
                   d_o = problem.v_view(problem.d_o);
  const phasor::ForgettingAttnGrads grads = problem.grads();
  const double seconds = phasor::bench::time_calls(state, problem.T, impl, [&] {
    phasor::forgetting_attn_forward(params, impl, o, lse);
    phasor::forgetting_attn_backward(params, impl, d_o, o, lse, grads);
  });
  if (impl == Impl::chunk)
    phasor::bench::report_flops(state, seconds, problem.T, fox_chunk_flops(problem.T, true));
}

// A training step against the inference forward (bench_util.h: time_training_step): the forward
// (o only), the forward that also writes lse, and the backward given o and lse.
void BM_FoxTrainingStep(benchmark::State& state) {
  Problem problem(state.range(0));
  const phasor::ForgettingAttnParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse),
                   d_o = problem.v_view(problem.d_o);
  const phasor::ForgettingAttnGrads grads = problem.grads();
  phasor::bench::time_training_step(
      state, problem.T, {fox_chunk_flops(problem.T, false), fox_chunk_flops(problem.T, true)},
      [&] { phasor::forgetting_attn_forward(params, Impl::chunk, o); },
      [&] { phasor::forgetting_attn_forward(params, Impl::chunk, o, lse); },
      [&] { phasor::forgetting_attn_backward(params, Impl::chunk, d_o, o, lse, grads); });
}

// Forward + backward at the harness's layer shape (bench_util.h: kHarnessShape, T = 64).
void BM_FoxHarnessShape(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(phasor::bench::kHarnessT, phasor::bench::kHarnessShape);
  const phasor::ForgettingAttnParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse),
                   d_o = problem.v_view(problem.d_o);
  const phasor::ForgettingAttnGrads grads = problem.grads();
  phasor::bench::time_calls(state, problem.shape.B * problem.T, impl, [&] {
    phasor::forgetting_attn_forward(params, impl, o, lse);
    phasor::forgetting_attn_backward(params, impl, d_o, o, lse, grads);
  });
}

// parallel_forgetting_attn forward with the benchmark's inputs in float32 or rounded to bfloat16
// (computing in float32 either way; o and lse float32).
void BM_FoxInputDtype(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  Problem problem(state.range(1));
  phasor::ForgettingAttnParams params = problem.params();
  std::vector<phasor::bfloat16> q16, k16, v16, g16;  // the bfloat16 copies
  if (bf16) {
    params.q = phasor::bench::bfloat16_copy(params.q, q16);
    params.k = phasor::bench::bfloat16_copy(params.k, k16);
    params.v = phasor::bench::bfloat16_copy(params.v, v16);
    params.g = phasor::bench::bfloat16_copy(params.g, g16);
  }
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse);
  phasor::bench::time_dtype(state, bf16, problem.T,
                            [&] { phasor::forgetting_attn_forward(params, Impl::chunk, o, lse); });
}

// One long sequence: B = H = 1 (parallel_forgetting_attn forward, 1 and 2 threads). T = 16,384
// (attention is quadratic: 65,536 tokens would take ~10 s a call on one thread).
void BM_FoxLongSequence(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const bool backward = state.range(1) != 0;
  Problem problem(16384, {1, 1, kK, kV});
  const phasor::ForgettingAttnParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse),
                   d_o = problem.v_view(problem.d_o);
  const phasor::ForgettingAttnGrads grads = problem.grads();
  phasor::bench::time_long_sequence(state, threads, backward, problem.T, [&] {
    phasor::forgetting_attn_forward(params, Impl::chunk, o, lse);
    if (backward) phasor::forgetting_attn_backward(params, Impl::chunk, d_o, o, lse, grads);
  });
}

// Rotation by Selective-RoPE-like angles: none / fused into the kernel / apply_rotary + op
// (bench_util.h, Rotation), chunk kernel; label "chunk/<rotation>". Gradients include dθ.
void BM_FoxRotationForward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(1));
  Problem problem(state.range(2));
  std::mt19937_64 rng(7);
  phasor::bench::RotationBuffers rot(kB, problem.T, kH, kK, rng);
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse);
  phasor::bench::time_rotation_forward(
      state, problem.T, impl, static_cast<phasor::bench::Rotation>(state.range(0)), rot,
      problem.params(), [&](const phasor::ForgettingAttnParams& p) {
        phasor::forgetting_attn_forward(p, impl, o, lse);
      });
}

void BM_FoxRotationForwardBackward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(1));
  Problem problem(state.range(2));
  std::mt19937_64 rng(7);
  phasor::bench::RotationBuffers rot(kB, problem.T, kH, kK, rng);
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse),
                   d_o = problem.v_view(problem.d_o);
  phasor::bench::time_rotation_forward_backward(
      state, problem.T, impl, static_cast<phasor::bench::Rotation>(state.range(0)), rot,
      problem.params(), problem.grads(),
      [&](const phasor::ForgettingAttnParams& p, const phasor::ForgettingAttnGrads& gr) {
        phasor::forgetting_attn_forward(p, impl, o, lse);
        phasor::forgetting_attn_backward(p, impl, d_o, o, lse, gr);
      });
}

// GRAPE-A-QK slopes a [B, T, HQ], b [B, T, H]: ω·softplus(x), x ~ N(0, 1), ω = 0.02 (the
// projections vᵀq/√d, uᵀk/√d are the caller's, outside the kernel).
struct Slopes {
  std::vector<float> a, b, da, db;
  explicit Slopes(std::int64_t T) {
    std::mt19937_64 rng(11);
    const auto n = static_cast<std::size_t>(kB * T * kH);
    a = phasor::bench::normal(n, rng);
    b = phasor::bench::normal(n, rng);
    for (float* x : {a.data(), b.data()})
      for (std::size_t i = 0; i < n; ++i) x[i] = 0.02f * std::log1p(std::exp(x[i]));
    da.assign(n, 0.f);
    db.assign(n, 0.f);
  }
};

// state.range(0): 0 = no bias, 1 = GRAPE-A-QK slopes; state.range(1) = T.
void BM_FoxSlopesForward(benchmark::State& state) {
  const bool biased = state.range(0) != 0;
  Problem problem(state.range(1));
  Slopes slopes(problem.T);
  phasor::ForgettingAttnParams params = problem.params();
  if (biased) {
    params.bias_q_slope = problem.gate_view(slopes.a);
    params.bias_k_slope = problem.gate_view(slopes.b);
  }
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse);
  phasor::bench::time_calls(state, problem.T, Impl::chunk,
                            [&] { phasor::forgetting_attn_forward(params, Impl::chunk, o, lse); });
  state.SetLabel(biased ? "chunk/grape_a_qk" : "chunk/no_bias");
}

void BM_FoxSlopesForwardBackward(benchmark::State& state) {
  const bool biased = state.range(0) != 0;
  Problem problem(state.range(1));
  Slopes slopes(problem.T);
  phasor::ForgettingAttnParams params = problem.params();
  phasor::ForgettingAttnGrads grads = problem.grads();
  if (biased) {
    params.bias_q_slope = problem.gate_view(slopes.a);
    params.bias_k_slope = problem.gate_view(slopes.b);
    grads.dbias_q_slope = problem.gate_view(slopes.da);
    grads.dbias_k_slope = problem.gate_view(slopes.db);
  }
  const TensorView o = problem.v_view(problem.o), lse = problem.gate_view(problem.lse),
                   d_o = problem.v_view(problem.d_o);
  phasor::bench::time_calls(state, problem.T, Impl::chunk, [&] {
    phasor::forgetting_attn_forward(params, Impl::chunk, o, lse);
    phasor::forgetting_attn_backward(params, Impl::chunk, d_o, o, lse, grads);
  });
  state.SetLabel(biased ? "chunk/grape_a_qk" : "chunk/no_bias");
}

void slope_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bias", "T"});
  for (std::int64_t T : {1024, 4096})
    for (std::int64_t biased : {0, 1}) b->Args({biased, T});
}

// Decoding through the public cache: T calls of step(), each with views of token t.
void BM_FoxCacheDecode(benchmark::State& state) {
  Problem problem(state.range(0));
  const std::int64_t T = problem.T;
  auto token = [&](const std::vector<float>& x, std::int64_t width, std::int64_t t) {
    TensorView view = width > 0 ? TensorView::of(x.data() + t * kH * width, {kB, 1, kH, width})
                                : TensorView::of(x.data() + t * kH, {kB, 1, kH});
    // Batch stride of the full [B, T, ...] tensor (B = 1 here, so only for completeness).
    view.strides[0] = T * kH * std::max<std::int64_t>(width, 1);
    return view;
  };
  std::int64_t peak = 0;
  for (auto _ : state) {
    phasor::bench::reset_peak_heap();
    phasor::ForgettingAttnCache cache(kB, kH, kH, kK, kV);
    for (std::int64_t t = 0; t < T; ++t)
      cache.step(token(problem.q, kK, t), token(problem.k, kK, t), token(problem.v, kV, t),
                 token(problem.g, 0, t), token(problem.o, kV, t));
    peak = std::max(peak, phasor::bench::peak_heap_bytes());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * T);
  state.counters["peak_MiB"] = mib(peak);
}

// One decoding step with `cached` tokens already in the cache (filled untimed, token by token),
// on `threads` threads: what a serving loop pays per generated token at that context length.
// Each timed step appends its token, so the cache grows by the 128 timed steps (the reported
// cached_tokens is the mean over them).
void BM_FoxCacheStep(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const std::int64_t cached = state.range(1), steps = 128;
  Problem problem(cached + steps);
  auto token = [&](const std::vector<float>& x, std::int64_t width, std::int64_t t) {
    return width > 0 ? TensorView::of(x.data() + t * kH * width, {kB, 1, kH, width})
                     : TensorView::of(x.data() + t * kH, {kB, 1, kH});
  };
  phasor::ForgettingAttnCache cache(kB, kH, kH, kK, kV);
  auto step = [&](std::int64_t t) {
    cache.step(token(problem.q, kK, t), token(problem.k, kK, t), token(problem.v, kV, t),
               token(problem.g, 0, t), token(problem.o, kV, t));
  };
  phasor::set_num_threads(threads);
  for (std::int64_t t = 0; t < cached; ++t) step(t);
  std::int64_t t = cached;
  for (auto _ : state) {
    step(t++);
    benchmark::ClobberMemory();
  }
  phasor::set_num_threads(0);
  state.counters["cached_tokens"] = static_cast<double>(cached + state.iterations() / 2);
  state.SetLabel("cache/" + std::to_string(threads) + " thread" + (threads > 1 ? "s" : ""));
}

void BM_FoxCacheDecodeDevice(benchmark::State& state) {
  const auto device = static_cast<phasor::Device>(state.range(0));
  Problem problem(state.range(1));
  const std::int64_t T = problem.T;
  phasor::bench::DeviceBuffers on(device);
  const TensorView q = on.view(problem.q, {kB, T, kH, kK}), k = on.view(problem.k, {kB, T, kH, kK}),
                   v = on.view(problem.v, {kB, T, kH, kV}), g = on.view(problem.g, {kB, T, kH}),
                   o = on.view(problem.o, {kB, T, kH, kV});
  auto token = [](TensorView x, std::int64_t t) {
    x.data = static_cast<float*>(x.data) + t * x.stride(1);
    x.sizes[1] = 1;
    return x;
  };
  for (auto _ : state) {
    phasor::ForgettingAttnCache cache(kB, kH, kH, kK, kV);
    for (std::int64_t t = 0; t < T; ++t) {
      cache.step(token(q, t), token(k, t), token(v, t), token(g, t), token(o, t));
      phasor::bench::DeviceBuffers::wait_for(token(o, t));
    }
  }
  state.SetItemsProcessed(state.iterations() * T);
  state.SetLabel(std::string(phasor::to_string(device)) + "/cache");
}

void BM_FoxChunkDevice(benchmark::State& state) {
  const auto device = static_cast<phasor::Device>(state.range(0));
  const bool backward = state.range(1) != 0;
  Problem problem(state.range(2));
  const std::int64_t T = problem.T;
  phasor::bench::DeviceBuffers on(device);
  phasor::ForgettingAttnParams params = problem.params();
  params.q = on.view(problem.q, {kB, T, kH, kK});
  params.k = on.view(problem.k, {kB, T, kH, kK});
  params.v = on.view(problem.v, {kB, T, kH, kV});
  params.g = on.view(problem.g, {kB, T, kH});
  const TensorView o = on.view(problem.o, {kB, T, kH, kV}), lse = on.view(problem.lse, {kB, T, kH}),
                   d_o = on.view(problem.d_o, {kB, T, kH, kV});
  phasor::ForgettingAttnGrads grads;
  grads.dq = on.view(problem.dq, {kB, T, kH, kK});
  grads.dk = on.view(problem.dk, {kB, T, kH, kK});
  grads.dv = on.view(problem.dv, {kB, T, kH, kV});
  grads.dg = on.view(problem.dg, {kB, T, kH});
  phasor::bench::time_calls(state, T, Impl::chunk, [&] {
    phasor::forgetting_attn_forward(params, Impl::chunk, o, lse);
    if (backward) phasor::forgetting_attn_backward(params, Impl::chunk, d_o, o, lse, grads);
    phasor::bench::DeviceBuffers::wait_for(backward ? grads.dq : o);
  });
  state.SetLabel(std::string(phasor::to_string(device)) + "/chunk" +
                 (backward ? "/fwd+bwd" : "/fwd"));
}

// Forward: chunk and recurrent side by side; forward + backward: chunk.
using phasor::bench::impl_and_length;
void forward_arguments(benchmark::internal::Benchmark* b, std::initializer_list<std::int64_t> Ts) {
  impl_and_length(b, {Impl::chunk, Impl::recurrent}, Ts);
}
void chunk_arguments(benchmark::internal::Benchmark* b, std::initializer_list<std::int64_t> Ts) {
  impl_and_length(b, {Impl::chunk}, Ts);
}
void reference_arguments(benchmark::internal::Benchmark* b) {
  impl_and_length(b, {Impl::reference}, {1024});
}

// T = 16384 (full causal attention over 16k tokens) runs once.
BENCHMARK(BM_FoxForward)->Apply([](auto* b) {
                          forward_arguments(b, {1024, 4096});
                        }) -> Unit(benchmark::kMillisecond) -> MinTime(0.2) -> UseRealTime();
BENCHMARK(BM_FoxForward)->Apply([](auto* b) {
                          forward_arguments(b, {16384});
                        }) -> Unit(benchmark::kMillisecond) -> Iterations(1) -> UseRealTime();
BENCHMARK(BM_FoxForward)
    ->Apply(reference_arguments)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();
BENCHMARK(BM_FoxForwardBackward)
    ->Apply([](auto* b) {
      chunk_arguments(b, {1024, 4096});
    }) -> Unit(benchmark::kMillisecond) -> MinTime(0.2) -> UseRealTime();
BENCHMARK(BM_FoxForwardBackward)
    ->Apply([](auto* b) { chunk_arguments(b, {16384}); }) -> Unit(benchmark::kMillisecond)
        -> Iterations(1) -> UseRealTime();
BENCHMARK(BM_FoxForwardBackward)
    ->Apply(reference_arguments)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();
BENCHMARK(BM_FoxRotationForward)->Apply([](auto* b) {
  phasor::bench::register_rotation_grid(b, {Impl::chunk});
});
BENCHMARK(BM_FoxRotationForwardBackward)->Apply([](auto* b) {
  phasor::bench::register_rotation_grid(b, {Impl::chunk});
});
BENCHMARK(BM_FoxSlopesForward)
    ->Apply(slope_arguments)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();
BENCHMARK(BM_FoxSlopesForwardBackward)
    ->Apply(slope_arguments)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();
BENCHMARK(BM_FoxCacheDecode)
    ->ArgName("T")
    ->Arg(1024)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();
// T = 16384 would take ~20 s an iteration (a forward alone takes ~4 s); T = 4096 ~1 s.
BENCHMARK(BM_FoxTrainingStep)->Apply([](auto* b) {
  phasor::bench::register_training_step_grid(b, {1024, 4096}, 4.0);
});
BENCHMARK(BM_FoxInputDtype)->Apply(phasor::bench::register_dtype_grid);
BENCHMARK(BM_FoxHarnessShape)->Apply([](auto* b) {
  phasor::bench::register_harness_grid(b, {Impl::recurrent, Impl::chunk});
});
BENCHMARK(BM_FoxLongSequence)->Apply([](auto* b) {
  phasor::bench::register_long_sequence_grid(b, true);
});
BENCHMARK(BM_FoxCacheStep)->Apply([](auto* b) {
  b->ArgNames({"threads", "cached"});
  for (std::int64_t cached : {1024, 4096, 16384})
    for (std::int64_t threads : {1, 2}) b->Args({threads, cached});
  b->Iterations(128)->Unit(benchmark::kMicrosecond)->UseRealTime();
});
BENCHMARK(BM_FoxChunkDevice)->Apply(phasor::bench::register_device_grid);
BENCHMARK(BM_FoxCacheDecodeDevice)->Apply([](auto* b) {
  b->ArgNames({"device", "T"});
  for (phasor::Device device : {phasor::Device::cpu, phasor::Device::emulated})
    b->Args({static_cast<std::int64_t>(device), 64});
  if (phasor::cuda_device_count() > 0)
    for (std::int64_t T : {1024, 4096, 16384})
      for (phasor::Device device : {phasor::Device::cpu, phasor::Device::cuda})
        b->Args({static_cast<std::int64_t>(device), T});
  b->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();
});

}  // namespace

BENCHMARK_MAIN();
