// Short convolution benchmark (causal depthwise, width W = 4, SiLU, with bias, float32), forward
// and forward + backward (dx, dweight, dbias), the optimized kernel beside the float64 reference:
//  - BM_ShortConv: a model's shape, B = 1, T ∈ {1024, 4096, 16384}, D = 2048 channels (fla's
//    GatedDeltaNet at hidden 1024: q, k and v each go through one); reference at T = 1024 only.
//  - BM_ShortConvHarnessShape: the synthetic-task harness's quick suite (B = 32, T = 64,
//    D = 64 for q and k, 128 for Gated DeltaNet's v), where each layer runs three of them.
// items_per_second is tokens per second; GB/s is the rate of the bytes a call must move at least
// (forward: read x, write y; forward + backward: also read dy and x again, write dx), the figure
// to hold against the machine's memory bandwidth: a short convolution does W multiply-adds a value.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "bench_util.h"
#include "phasor/short_conv.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kW = 4;

// Inputs, outputs and gradients of one problem, allocated outside the timed loop.
struct Problem {
  std::int64_t B, T, D;
  std::vector<float> x, weight, bias, y, dy, dx, dweight, dbias;

  Problem(std::int64_t B_, std::int64_t T_, std::int64_t D_) : B(B_), T(T_), D(D_) {
    const auto n = static_cast<std::size_t>(B * T * D);
    std::mt19937_64 rng(42);
    x = phasor::bench::normal(n, rng);
    dy = phasor::bench::normal(n, rng);
    // fla initialises the depthwise weights as nn.Conv1d does: U(−1/√W, 1/√W).
    weight = phasor::bench::normal(static_cast<std::size_t>(D * kW), rng);
    for (float& w : weight) w *= 0.5f / std::sqrt(static_cast<float>(kW));
    bias = phasor::bench::normal(static_cast<std::size_t>(D), rng);
    y.assign(n, 0.f);
    dx.assign(n, 0.f);
    dweight.assign(weight.size(), 0.f);
    dbias.assign(bias.size(), 0.f);
  }
  TensorView tokens(const std::vector<float>& a) const {
    return TensorView::of(a.data(), {B, T, D});
  }
  phasor::ShortConvParams params() const {
    phasor::ShortConvParams p;
    p.x = tokens(x);
    p.weight = TensorView::of(weight.data(), {D, kW});
    p.bias = TensorView::of(bias.data(), {D});
    p.activation = "silu";
    return p;
  }
  phasor::ShortConvGrads grads() const {
    return {
        tokens(dx), TensorView::of(dweight.data(), {D, kW}), TensorView::of(dbias.data(), {D}), {}};
  }
};

// One call: forward, or forward + backward; reports tokens/s and GB/s.
void run(benchmark::State& state, Problem& problem, Impl impl, bool backward) {
  const phasor::ShortConvParams params = problem.params();
  const TensorView y = problem.tokens(problem.y), dy = problem.tokens(problem.dy);
  const phasor::ShortConvGrads grads = problem.grads();
  const double seconds = phasor::bench::time_calls(state, problem.B * problem.T, impl, [&] {
    phasor::short_conv_forward(params, impl, y);
    if (backward) phasor::short_conv_backward(params, impl, dy, {}, grads);
  });
  // Bytes a call moves at least: 2 tensors of B·T·D floats forward, 4 more backward.
  const double tensors = backward ? 6.0 : 2.0;
  const double bytes = tensors * 4.0 * static_cast<double>(problem.B * problem.T * problem.D);
  state.counters["GB/s"] = static_cast<double>(state.iterations()) * bytes / seconds / 1e9;
  if (backward) state.SetLabel(std::string(phasor::to_string(impl)) + "/fwd+bwd");
}

// Arguments (impl, backward, T) at B = 1, D = 2048.
void BM_ShortConv(benchmark::State& state) {
  Problem problem(1, state.range(2), 2048);
  run(state, problem, static_cast<Impl>(state.range(0)), state.range(1) != 0);
}

// Arguments (impl, backward, D) at B = 32, T = 64.
void BM_ShortConvHarnessShape(benchmark::State& state) {
  Problem problem(phasor::bench::kHarnessShape.B, phasor::bench::kHarnessT, state.range(2));
  run(state, problem, static_cast<Impl>(state.range(0)), state.range(1) != 0);
}

constexpr auto kChunk = static_cast<std::int64_t>(Impl::chunk);
constexpr auto kReference = static_cast<std::int64_t>(Impl::reference);

BENCHMARK(BM_ShortConv)
    ->ArgNames({"impl", "backward", "T"})
    ->ArgsProduct({{kChunk}, {0, 1}, {1024, 4096, 16384}})
    ->ArgsProduct({{kReference}, {0, 1}, {1024}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

BENCHMARK(BM_ShortConvHarnessShape)
    ->ArgNames({"impl", "backward", "D"})
    ->ArgsProduct({{kChunk, kReference}, {0, 1}, {64, 128}})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.2)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
