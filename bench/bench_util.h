// Benchmark support shared by bench/<op>_bench.cpp: random inputs, the timed loop (tokens/s,
// implementation label, peak heap) and the standard argument grid.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "memory.h"
#include "phasor/common.h"

namespace phasor::bench {

// n samples of N(0, 1).
inline std::vector<float> normal(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

// n log forget gates log σ(mean + N(0, 1)): σ(mean) is the typical gate of a trained model.
inline std::vector<float> log_sigmoid_gates(std::size_t n, std::mt19937_64& rng, float mean) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> g(n);
  for (auto& e : g) e = -std::log1p(std::exp(-(mean + dist(rng))));
  return g;
}

// The timed loop of every benchmark: runs `call` once per iteration and reports tokens/s
// (items_per_second), the implementation as the label, and the peak heap of one call as
// "peak_MiB" (everything allocated on top of the caller's inputs and outputs, Eigen included).
template <class F>
void time_calls(benchmark::State& state, std::int64_t tokens, Impl impl, F&& call) {
  std::int64_t peak = 0;
  for (auto _ : state) {
    reset_peak_heap();
    call();
    peak = std::max(peak, peak_heap_bytes());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1024.0 * 1024.0);
  state.SetLabel(to_string(impl));
}

// Arguments (impl, T) for every impl in `impls` at every T in `lengths`.
inline void impl_and_length(benchmark::internal::Benchmark* b, std::initializer_list<Impl> impls,
                            std::initializer_list<std::int64_t> lengths) {
  b->ArgNames({"impl", "T"});
  for (std::int64_t T : lengths)
    for (Impl impl : impls) b->Args({static_cast<std::int64_t>(impl), T});
}

// The standard grid of the recurrent-state ops: recurrent and chunk side by side at
// T ∈ {1024, 4096, 16384} (at least 0.2 s each), the float64 reference once at T = 1024.
inline void register_standard_grid(benchmark::internal::Benchmark* fast,
                                   benchmark::internal::Benchmark* reference) {
  fast->Apply([](benchmark::internal::Benchmark* b) {
        impl_and_length(b, {Impl::recurrent, Impl::chunk}, {1024, 4096, 16384});
      })
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.2)
      ->UseRealTime();
  reference
      ->Apply(
          [](benchmark::internal::Benchmark* b) { impl_and_length(b, {Impl::reference}, {1024}); })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1)
      ->UseRealTime();
}

}  // namespace phasor::bench
