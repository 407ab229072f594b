// Gated DeltaNet benchmark: B = 1, H = HV = 8, K = V = 128, float32, keys (and queries)
// L2-normalised in the kernel (use_qk_l2norm_in_kernel), β = σ(x) ∈ (0, 1), realistic gates;
// forward and forward + backward for the recurrent and chunk kernels (reference at T = 1024
// only). items_per_second is tokens per second; peak_MiB is the peak heap of one forward +
// backward (everything allocated on top of the inputs and outputs, Eigen included).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "memory.h"
#include "phasor/gated_delta_rule.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kH = 8, kK = 128, kV = 128;

// Inputs, outputs and gradients of one problem size, allocated outside the timed loop.
struct Problem {
  std::int64_t T;
  std::vector<float> q, k, v, g, beta, d_o, o, dq, dk, dv, dg, dbeta;

  explicit Problem(std::int64_t T_) : T(T_) {
    const auto qk = static_cast<std::size_t>(kB * T * kH * kK);
    const auto vv = static_cast<std::size_t>(kB * T * kH * kV);
    const auto heads = static_cast<std::size_t>(kB * T * kH);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto fill = [&](std::vector<float>& x, std::size_t n) {
      x.resize(n);
      for (auto& e : x) e = normal(rng);
    };
    fill(q, qk);
    fill(k, qk);
    fill(v, vv);
    fill(d_o, vv);
    // log σ(x), x ~ N(3, 1): typical trained forget gates; β = σ(x), x ~ N(0, 1).
    g.resize(heads);
    for (auto& e : g) e = -std::log1p(std::exp(-(3.f + normal(rng))));
    beta.resize(heads);
    for (auto& e : beta) e = 1.f / (1.f + std::exp(-normal(rng)));
    o.assign(vv, 0.f);
    dv.assign(vv, 0.f);
    dq.assign(qk, 0.f);
    dk.assign(qk, 0.f);
    dg.assign(heads, 0.f);
    dbeta.assign(heads, 0.f);
  }

  TensorView qk_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {kB, T, kH, kK});
  }
  TensorView v_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {kB, T, kH, kV});
  }
  TensorView head_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {kB, T, kH});
  }
  phasor::GatedDeltaRuleParams params() const {
    phasor::GatedDeltaRuleParams p;
    p.q = qk_view(q);
    p.k = qk_view(k);
    p.v = v_view(v);
    p.g = head_view(g);
    p.beta = head_view(beta);
    p.use_qk_l2norm_in_kernel = true;
    p.chunk_size = 64;
    return p;
  }
};

void BM_GatedDeltaRuleForward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o);
  for (auto _ : state) {
    phasor::gated_delta_rule_forward(params, impl, o);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * problem.T);
  state.SetLabel(phasor::to_string(impl));
}

void BM_GatedDeltaRuleForwardBackward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GatedDeltaRuleGrads grads{
      problem.qk_view(problem.dq),   problem.qk_view(problem.dk),      problem.v_view(problem.dv),
      problem.head_view(problem.dg), problem.head_view(problem.dbeta), {}};
  std::int64_t peak = 0;
  for (auto _ : state) {
    phasor::bench::reset_peak_heap();
    phasor::gated_delta_rule_forward(params, impl, o);
    phasor::gated_delta_rule_backward(params, impl, d_o, {}, grads);
    peak = std::max(peak, phasor::bench::peak_heap_bytes());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * problem.T);
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1024.0 * 1024.0);
  state.SetLabel(phasor::to_string(impl));
}

void arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"impl", "T"});
  for (std::int64_t T : {1024, 4096, 16384})
    for (Impl impl : {Impl::recurrent, Impl::chunk}) b->Args({static_cast<std::int64_t>(impl), T});
}

void reference_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"impl", "T"});
  b->Args({static_cast<std::int64_t>(Impl::reference), 1024});
}

BENCHMARK(BM_GatedDeltaRuleForward)
    ->Apply(arguments)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();
BENCHMARK(BM_GatedDeltaRuleForwardBackward)
    ->Apply(arguments)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();
BENCHMARK(BM_GatedDeltaRuleForward)
    ->Apply(reference_arguments)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();
BENCHMARK(BM_GatedDeltaRuleForwardBackward)
    ->Apply(reference_arguments)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
