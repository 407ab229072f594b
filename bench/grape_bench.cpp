// Multiplicative GRAPE benchmark: cost per token of single-plane GRAPE-M (Rodrigues, O(K)) and
// multi-subspace GRAPE-M (B · RoPE · Bᵀ, O(K²)) against plain RoPE (apply_rotary, O(K)), one
// vector tensor z [B = 1, T = 4096, H = 4, K] in float32, K ∈ {64, 128, 256}, forward and
// forward + backward (all gradients: dz and every parameter's), optimized kernels.
// items_per_second is tokens per second; compare encodings at the same K (ratios).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bench_util.h"
#include "phasor/grape.h"
#include "phasor/rotary.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kT = 4096, kH = 4;
constexpr Impl kImpl = Impl::chunk;

enum Encoding : std::int64_t { kRope = 0, kGrapePlane = 1, kGrapeSubspace = 2 };
const char* encoding_name(std::int64_t e) {
  return e == kRope ? "rope" : e == kGrapePlane ? "grape_plane" : "grape_subspace";
}

struct Problem {
  std::int64_t K;
  std::vector<float> z, dy, y, dz, theta, d_theta, a, b, omega, positions, da, db, d_omega,
      d_positions, basis, d_basis;

  explicit Problem(std::int64_t K_) : K(K_) {
    std::mt19937_64 rng(42);
    const auto n = static_cast<std::size_t>(kB * kT * kH * K);
    z = phasor::bench::normal(n, rng);
    dy = phasor::bench::normal(n, rng);
    y.assign(n, 0.f);
    dz.assign(n, 0.f);
    const std::int64_t R = K / 2;
    theta.assign(static_cast<std::size_t>(kB * kT * kH * R), 0.f);
    for (std::int64_t t = 0; t < kT; ++t)
      for (std::int64_t h = 0; h < kH; ++h)
        for (std::int64_t i = 0; i < R; ++i)
          theta[static_cast<std::size_t>((t * kH + h) * R + i)] =
              static_cast<float>(t * std::pow(10000.0, -2.0 * i / K));
    d_theta.assign(theta.size(), 0.f);
    a = phasor::bench::normal(static_cast<std::size_t>(kH * K), rng);
    b = phasor::bench::normal(static_cast<std::size_t>(kH * K), rng);
    omega.assign(kH, 0.01f);
    positions.resize(static_cast<std::size_t>(kB * kT));
    for (std::int64_t t = 0; t < kT; ++t) positions[static_cast<std::size_t>(t)] = float(t);
    da.assign(a.size(), 0.f);
    db.assign(b.size(), 0.f);
    d_omega.assign(kH, 0.f);
    d_positions.assign(positions.size(), 0.f);
    // Per-head orthogonal bases: permutations with sign flips (exactly orthogonal in float32;
    // the cost does not depend on the values).
    basis.assign(static_cast<std::size_t>(kH * K * K), 0.f);
    for (std::int64_t h = 0; h < kH; ++h)
      for (std::int64_t i = 0; i < K; ++i)
        basis[static_cast<std::size_t>((h * K + i) * K + (i * 7 + h) % K)] =
            (i % 3 == 0) ? -1.f : 1.f;
    d_basis.assign(basis.size(), 0.f);
  }
  TensorView x(std::vector<float>& v) const { return TensorView::of(v.data(), {kB, kT, kH, K}); }
  TensorView angles(std::vector<float>& v) const {
    return TensorView::of(v.data(), {kB, kT, kH, K / 2});
  }
  phasor::GrapeParams plane() {
    return {x(z), TensorView::of(a.data(), {kH, K}), TensorView::of(b.data(), {kH, K}),
            TensorView::of(omega.data(), {kH}), TensorView::of(positions.data(), {kB, kT})};
  }
  phasor::GrapeSubspaceParams subspace() {
    phasor::GrapeSubspaceParams p;
    p.z = x(z);
    p.basis = TensorView::of(basis.data(), {kH, K, K});
    p.theta = angles(theta);
    return p;
  }
};

void BM_Encoding(benchmark::State& state) {
  const std::int64_t encoding = state.range(0), K = state.range(1);
  const bool backward = state.range(2) != 0;
  Problem pr(K);
  const auto rope = phasor::RotaryLayout::half_split;
  auto call = [&] {
    if (encoding == kRope) {
      phasor::apply_rotary_forward(pr.x(pr.z), pr.angles(pr.theta), rope, kImpl, pr.x(pr.y));
      if (backward)
        phasor::apply_rotary_backward(pr.x(pr.z), pr.angles(pr.theta), rope, kImpl, pr.x(pr.dy),
                                      pr.x(pr.dz), pr.angles(pr.d_theta));
    } else if (encoding == kGrapePlane) {
      const phasor::GrapeParams p = pr.plane();
      phasor::grape_forward(p, kImpl, pr.x(pr.y));
      if (backward)
        phasor::grape_backward(
            p, kImpl, pr.x(pr.dy),
            {pr.x(pr.dz), TensorView::of(pr.da.data(), {kH, K}),
             TensorView::of(pr.db.data(), {kH, K}), TensorView::of(pr.d_omega.data(), {kH}),
             TensorView::of(pr.d_positions.data(), {kB, kT})});
    } else {
      const phasor::GrapeSubspaceParams p = pr.subspace();
      phasor::grape_subspace_forward(p, kImpl, pr.x(pr.y));
      if (backward)
        phasor::grape_subspace_backward(
            p, kImpl, pr.x(pr.dy),
            {pr.x(pr.dz), TensorView::of(pr.d_basis.data(), {kH, K, K}), pr.angles(pr.d_theta)});
    }
  };
  phasor::bench::time_calls(state, kT, kImpl, call);
  state.SetLabel(std::string(encoding_name(encoding)) + (backward ? "/fwd+bwd" : "/fwd"));
}

const bool registered = [] {
  auto* b = benchmark::RegisterBenchmark("BM_Encoding", BM_Encoding);
  b->ArgNames({"enc", "K", "bwd"});
  for (std::int64_t bwd : {0, 1})
    for (std::int64_t K : {64, 128, 256})
      for (std::int64_t e : {kRope, kGrapePlane, kGrapeSubspace}) b->Args({e, K, bwd});
  b->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
