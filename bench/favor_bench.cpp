// Performer FAVOR+ benchmark: causal FAVOR+ attention against exact causal softmax attention in
// the same run. B = 1, H = 4, d = V = 64, float32, T ∈ {1024, 4096}.
//  - BM_FavorCausal/m:T          causal FAVOR+ (features + GLA chunk kernel, chunk 64, whose log
//                                gates carry the running key stabiliser), m ∈ {64, 128, 256}
//                                features shared by the heads.
//  - BM_SoftmaxCausal/T          exact causal softmax attention: phasor's FoX tiled kernel
//                                (forgetting_attn, Impl::chunk, block 64) with all gates g = 0.
// Each in two modes: forward only, and forward + backward (mode 0 / 1 in the name).
// items_per_second is tokens per second; the ratio FAVOR+/softmax at equal T is the speed-up.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bench_util.h"
#include "phasor/favor.h"
#include "phasor/forgetting_attn.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kH = 4, kD = 64;  // value width V = d

struct Problem {
  std::int64_t T, m;
  std::vector<float> q, k, v, w, g, d_o, o, lse, dq, dk, dv, dw, dg;
  Problem(std::int64_t T_, std::int64_t m_) : T(T_), m(m_) {
    const auto n = static_cast<std::size_t>(kB * T * kH * kD);
    std::mt19937_64 rng(42);
    q = phasor::bench::normal(n, rng);
    k = phasor::bench::normal(n, rng);
    v = phasor::bench::normal(n, rng);
    d_o = phasor::bench::normal(n, rng);
    o.assign(n, 0.f);
    dq.assign(n, 0.f);
    dk.assign(n, 0.f);
    dv.assign(n, 0.f);
    g.assign(static_cast<std::size_t>(kB * T * kH), 0.f);
    dg = g;
    lse = g;
    w.assign(static_cast<std::size_t>(std::max<std::int64_t>(m, 1) * kD), 0.f);
    dw = w;
    if (m > 0) phasor::favor_random_matrix(phasor::FavorMatrixKind::orthogonal_chi, 7, w_view(w));
  }
  TensorView x(const std::vector<float>& a) const {
    return TensorView::of(a.data(), {kB, T, kH, kD});
  }
  TensorView w_view(const std::vector<float>& a) const { return TensorView::of(a.data(), {m, kD}); }
  phasor::FavorAttentionParams favor() const {
    phasor::FavorAttentionParams p;
    p.q = x(q);
    p.k = x(k);
    p.v = x(v);
    p.w = w_view(w);
    p.causal = true;
    p.chunk_size = 64;
    return p;
  }
  phasor::ForgettingAttnParams softmax() const {
    phasor::ForgettingAttnParams p;
    p.q = x(q);
    p.k = x(k);
    p.v = x(v);
    p.g = TensorView::of(g.data(), {kB, T, kH});
    p.block_size = 64;
    return p;
  }
};

void BM_FavorCausal(benchmark::State& state) {
  const bool backward = state.range(0) != 0;
  Problem p(state.range(2), state.range(1));
  phasor::bench::time_calls(state, p.T, Impl::chunk, [&] {
    phasor::favor_attention_forward(p.favor(), Impl::chunk, p.x(p.o));
    if (backward)
      phasor::favor_attention_backward(p.favor(), Impl::chunk, p.x(p.d_o),
                                       {p.x(p.dq), p.x(p.dk), p.x(p.dv), p.w_view(p.dw)});
  });
}
BENCHMARK(BM_FavorCausal)
    ->ArgNames({"bwd", "m", "T"})
    ->ArgsProduct({{0, 1}, {64, 128, 256}, {1024, 4096}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

void BM_SoftmaxCausal(benchmark::State& state) {
  const bool backward = state.range(0) != 0;
  Problem p(state.range(1), 0);
  phasor::bench::time_calls(state, p.T, Impl::chunk, [&] {
    phasor::forgetting_attn_forward(p.softmax(), Impl::chunk, p.x(p.o),
                                    TensorView::of(p.lse.data(), {kB, p.T, kH}));
    if (backward) {
      phasor::ForgettingAttnGrads gr;
      gr.dq = p.x(p.dq);
      gr.dk = p.x(p.dk);
      gr.dv = p.x(p.dv);
      gr.dg = TensorView::of(p.dg.data(), {kB, p.T, kH});
      phasor::forgetting_attn_backward(p.softmax(), Impl::chunk, p.x(p.d_o), p.x(p.o),
                                       TensorView::of(p.lse.data(), {kB, p.T, kH}), gr);
    }
  });
}
BENCHMARK(BM_SoftmaxCausal)
    ->ArgNames({"bwd", "T"})
    ->ArgsProduct({{0, 1}, {1024, 4096}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
