// Structured rotation benchmark: cost per token of the encoding y = R(r) x applied through the
// joint block decomposition (O(K·m) per token and head: two [T, K] × [K, 2m] products and m 2×2
// rotations) against plain RoPE (apply_rotary, O(K)), at K = 64, 128, 256, T = 4096 tokens,
// B = 1, H = 8, float32, forward and forward + backward, optimized kernels. The structured
// rotation uses a dense random basis (the worst case: every plane mixes all K coordinates) with
// m = K/2 planes (as many as RoPE) and C = 2 generators (2-D positions). items_per_second is
// tokens per second (each token: H heads).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bench_util.h"
#include "phasor/rotary.h"
#include "phasor/structured_rotation.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kH = 8, kC = 2;

struct Problem {
  std::int64_t T, K, m;
  std::vector<float> x, dy, y, dx, theta, dtheta, pos, dpos, basis, lambda, dlambda;

  Problem(std::int64_t T_, std::int64_t K_) : T(T_), K(K_), m(K_ / 2) {
    std::mt19937_64 rng(42);
    const auto n = static_cast<std::size_t>(kB * T * kH * K);
    x = phasor::bench::normal(n, rng);
    dy = phasor::bench::normal(n, rng);
    y.assign(n, 0.f);
    dx.assign(n, 0.f);
    theta.assign(static_cast<std::size_t>(kB * T * kH * K / 2), 0.f);
    dtheta = theta;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < kH; ++h)
        for (std::int64_t i = 0; i < K / 2; ++i)
          theta[static_cast<std::size_t>((t * kH + h) * (K / 2) + i)] =
              static_cast<float>(t * std::pow(10000.0, -2.0 * i / K));
    pos.assign(static_cast<std::size_t>(kB * T * kH * kC), 0.f);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < kH; ++h) {
        pos[static_cast<std::size_t>((t * kH + h) * kC)] = static_cast<float>(t % 64);
        pos[static_cast<std::size_t>((t * kH + h) * kC + 1)] = static_cast<float>(t / 64);
      }
    dpos = pos;
    // U_act: 2m orthonormal columns by Gram–Schmidt of Gaussian vectors (a dense random basis).
    std::normal_distribution<double> normal(0, 1);
    std::vector<std::vector<double>> cols;
    for (std::int64_t j = 0; j < 2 * m; ++j) {
      std::vector<double> v(static_cast<std::size_t>(K));
      for (auto& e : v) e = normal(rng);
      for (int pass = 0; pass < 2; ++pass)
        for (const auto& c : cols) {
          double d = 0;
          for (std::size_t i = 0; i < v.size(); ++i) d += c[i] * v[i];
          for (std::size_t i = 0; i < v.size(); ++i) v[i] -= d * c[i];
        }
      double nrm = 0;
      for (double e : v) nrm += e * e;
      for (auto& e : v) e /= std::sqrt(nrm);
      cols.push_back(v);
    }
    basis.resize(static_cast<std::size_t>(K * 2 * m));
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t j = 0; j < 2 * m; ++j)
        basis[static_cast<std::size_t>(i * 2 * m + j)] =
            static_cast<float>(cols[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)]);
    lambda.resize(static_cast<std::size_t>(kC * m));
    for (auto& v : lambda) v = static_cast<float>(0.1 * normal(rng));
    dlambda = lambda;
  }
  TensorView xv(const std::vector<float>& v) const {
    return TensorView::of(v.data(), {kB, T, kH, K});
  }
  TensorView tv(const std::vector<float>& v) const {
    return TensorView::of(v.data(), {kB, T, kH, K / 2});
  }
  phasor::StructuredRotationParams params() const {
    return {xv(x),
            TensorView::of(pos.data(), {kB, T, kH, kC}),
            TensorView::of(basis.data(), {K, 2 * m}),
            TensorView::of(lambda.data(), {kC, m}),
            {}};
  }
};

// Args: (K, structured?): 0 = RoPE (apply_rotary), 1 = structured rotation.
void BM_Forward(benchmark::State& state) {
  Problem p(4096, state.range(0));
  const bool structured = state.range(1) == 1;
  const auto params = p.params();
  phasor::bench::time_calls(state, p.T, Impl::chunk, [&] {
    if (structured)
      phasor::structured_rotation_forward(params, Impl::chunk, p.xv(p.y));
    else
      phasor::apply_rotary_forward(p.xv(p.x), p.tv(p.theta), phasor::RotaryLayout::half_split,
                                   Impl::chunk, p.xv(p.y));
  });
  state.SetLabel(structured ? "structured" : "rope");
}

void BM_ForwardBackward(benchmark::State& state) {
  Problem p(4096, state.range(0));
  const bool structured = state.range(1) == 1;
  const auto params = p.params();
  const phasor::StructuredRotationGrads grads{p.xv(p.dx),
                                              TensorView::of(p.dpos.data(), {kB, p.T, kH, kC}),
                                              TensorView::of(p.dlambda.data(), {kC, p.m}),
                                              {}};
  phasor::bench::time_calls(state, p.T, Impl::chunk, [&] {
    if (structured) {
      phasor::structured_rotation_forward(params, Impl::chunk, p.xv(p.y));
      phasor::structured_rotation_backward(params, Impl::chunk, p.xv(p.dy), grads);
    } else {
      phasor::apply_rotary_forward(p.xv(p.x), p.tv(p.theta), phasor::RotaryLayout::half_split,
                                   Impl::chunk, p.xv(p.y));
      phasor::apply_rotary_backward(p.xv(p.x), p.tv(p.theta), phasor::RotaryLayout::half_split,
                                    Impl::chunk, p.xv(p.dy), p.xv(p.dx), p.tv(p.dtheta));
    }
  });
  state.SetLabel(structured ? "structured" : "rope");
}

void grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"K", "structured"});
  for (std::int64_t K : {64, 128, 256})
    for (std::int64_t s : {0, 1}) b->Args({K, s});
  b->Unit(benchmark::kMicrosecond)->MinTime(0.2)->UseRealTime();
}
BENCHMARK(BM_Forward)->Apply(grid);
BENCHMARK(BM_ForwardBackward)->Apply(grid);

}  // namespace

BENCHMARK_MAIN();
