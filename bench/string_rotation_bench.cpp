// STRING benchmark: cost per token of N-d RoPE (C = 2), Cayley-STRING and Circulant-STRING
// against plain RoPE (apply_rotary with precomputed angles) at K = 64, 128, 256, B·T = 4096 tokens
// (B = 1, T = 4096), H = 4, float32, forward and forward + backward, all in one run.
// Counters: ns_per_token (wall time / B·T tokens, each with H = 4 head vectors) and vs_rope, the
// ratio to plain RoPE's ns_per_token at the same K and mode (RoPE runs first for each K and mode).
//   rope       apply_rotary_forward (+ apply_rotary_backward: dz and dθ)
//   nd_rope    nd_rope_angles_forward + apply_rotary_forward (+ both backwards: dz, dr, dω)
//   cayley     cayley_string_forward (+ backward: dz, dr, dω, dA), A shared by heads
//   circulant  circulant_string_forward (+ backward: dz, dr, dc), c shared by heads
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "phasor/rotary.h"
#include "phasor/string_rotation.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kT = 4096, kH = 4, kC = 2;
enum Encoding : std::int64_t { kRope = 0, kNdRope = 1, kCayley = 2, kCirculant = 3 };
const char* name(std::int64_t e) {
  return e == kRope ? "rope" : e == kNdRope ? "nd_rope" : e == kCayley ? "cayley" : "circulant";
}

std::map<std::pair<std::int64_t, std::int64_t>, double>& rope_ns() {
  static std::map<std::pair<std::int64_t, std::int64_t>, double> m;
  return m;
}

struct Problem {
  std::int64_t K, R;
  std::vector<float> z, dy, y, dz, pos, dpos, omega, domega, A, dA, c, dc, theta, dtheta,
      dtheta_sum;
  explicit Problem(std::int64_t K_) : K(K_), R(K_ / 2) {
    std::mt19937_64 rng(7);
    const auto n = static_cast<std::size_t>(kB * kT * kH * K);
    z = phasor::bench::normal(n, rng);
    dy = phasor::bench::normal(n, rng);
    y.assign(n, 0.f);
    dz.assign(n, 0.f);
    pos.resize(static_cast<std::size_t>(kB * kT * kC));
    for (std::int64_t t = 0; t < kT; ++t) {  // a 64 × 64 image grid
      pos[static_cast<std::size_t>(2 * t)] = static_cast<float>(t / 64);
      pos[static_cast<std::size_t>(2 * t + 1)] = static_cast<float>(t % 64);
    }
    dpos.assign(pos.size(), 0.f);
    omega.assign(static_cast<std::size_t>(kC * R), 0.f);
    phasor::nd_rope_axis_split_frequencies(kC, K, 100.0, TensorView::of(omega.data(), {kC, R}));
    domega.assign(omega.size(), 0.f);
    A = phasor::bench::normal(static_cast<std::size_t>(K * K), rng);
    for (auto& a : A) a *= 0.1f;
    dA.assign(A.size(), 0.f);
    c = phasor::bench::normal(static_cast<std::size_t>(kC * K), rng);
    for (auto& v : c) v *= 0.1f;
    dc.assign(c.size(), 0.f);
    theta.assign(static_cast<std::size_t>(kB * kT * R), 0.f);
    phasor::nd_rope_angles_forward(pos_view(), omega_view(), Impl::chunk,
                                   TensorView::of(theta.data(), {kB, kT, R}));
    dtheta.assign(static_cast<std::size_t>(kB * kT * kH * R), 0.f);
    dtheta_sum.assign(static_cast<std::size_t>(kB * kT * R), 0.f);
  }
  TensorView zv(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {kB, kT, kH, K});
  }
  TensorView pos_view() const { return TensorView::of(pos.data(), {kB, kT, kC}); }
  TensorView omega_view() const { return TensorView::of(omega.data(), {kC, R}); }
  TensorView theta_heads() const {
    return TensorView::strided(const_cast<float*>(theta.data()), phasor::DType::float32,
                               {kB, kT, kH, R}, {kT * R, R, 0, 1});
  }
};

void BM_String(benchmark::State& state) {
  const std::int64_t enc = state.range(0), K = state.range(1), mode = state.range(2);
  Problem p(K);
  const bool bwd = mode == 1;
  auto z = p.zv(p.z), y = p.zv(p.y), dy = p.zv(p.dy), dz = p.zv(p.dz);
  const TensorView theta_own = TensorView::of(p.theta.data(), {kB, kT, p.R});
  const TensorView dtheta = TensorView::of(p.dtheta.data(), {kB, kT, kH, p.R});
  const TensorView dtheta_shared = TensorView::of(p.dtheta_sum.data(), {kB, kT, p.R});
  const phasor::CayleyStringParams cp{z, p.pos_view(), p.omega_view(),
                                      TensorView::of(p.A.data(), {K, K})};
  const phasor::CirculantStringParams ccp{z, p.pos_view(), TensorView::of(p.c.data(), {kC, K})};
  const auto start = std::chrono::steady_clock::now();
  phasor::bench::time_calls(state, kB * kT, Impl::chunk, [&] {
    switch (enc) {
      case kRope:
        phasor::apply_rotary_forward(z, p.theta_heads(), phasor::RotaryLayout::half_split,
                                     Impl::chunk, y);
        if (bwd)
          phasor::apply_rotary_backward(z, p.theta_heads(), phasor::RotaryLayout::half_split,
                                        Impl::chunk, dy, dz, dtheta);
        break;
      case kNdRope:
        phasor::nd_rope_angles_forward(p.pos_view(), p.omega_view(), Impl::chunk, theta_own);
        phasor::apply_rotary_forward(z, p.theta_heads(), phasor::RotaryLayout::half_split,
                                     Impl::chunk, y);
        if (bwd) {
          phasor::apply_rotary_backward(z, p.theta_heads(), phasor::RotaryLayout::half_split,
                                        Impl::chunk, dy, dz, dtheta);
          // θ is shared by heads, so its gradient is dθ summed over H (timed: part of the cost).
          for (std::int64_t bt = 0; bt < kB * kT; ++bt)
            for (std::int64_t i = 0; i < p.R; ++i) {
              float s = 0.f;
              for (std::int64_t h = 0; h < kH; ++h)
                s += p.dtheta[static_cast<std::size_t>((bt * kH + h) * p.R + i)];
              p.dtheta_sum[static_cast<std::size_t>(bt * p.R + i)] = s;
            }
          phasor::nd_rope_angles_backward(p.pos_view(), p.omega_view(), Impl::chunk, dtheta_shared,
                                          TensorView::of(p.dpos.data(), {kB, kT, kC}),
                                          TensorView::of(p.domega.data(), {kC, p.R}));
        }
        break;
      case kCayley:
        phasor::cayley_string_forward(cp, Impl::chunk, y);
        if (bwd)
          phasor::cayley_string_backward(
              cp, Impl::chunk, dy,
              {dz, TensorView::of(p.dpos.data(), {kB, kT, kC}),
               TensorView::of(p.domega.data(), {kC, p.R}), TensorView::of(p.dA.data(), {K, K})});
        break;
      default:
        phasor::circulant_string_forward(ccp, Impl::chunk, y);
        if (bwd)
          phasor::circulant_string_backward(ccp, Impl::chunk, dy,
                                            {dz, TensorView::of(p.dpos.data(), {kB, kT, kC}),
                                             TensorView::of(p.dc.data(), {kC, K})});
    }
  });
  const double elapsed =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  const double ns =
      elapsed / static_cast<double>(std::max<std::int64_t>(1, state.iterations()) * kB * kT);
  state.counters["ns_per_token"] = ns;
  if (enc == kRope) rope_ns()[{K, mode}] = ns;
  const auto it = rope_ns().find({K, mode});
  if (it != rope_ns().end()) state.counters["vs_rope"] = ns / it->second;
  state.SetLabel(std::string(name(enc)) + (bwd ? "/fwd+bwd" : "/fwd"));
}

}  // namespace

BENCHMARK(BM_String)
    ->ArgNames({"enc", "K", "bwd"})
    ->ArgsProduct({{kRope, kNdRope, kCayley, kCirculant}, {64, 128, 256}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

BENCHMARK_MAIN();
