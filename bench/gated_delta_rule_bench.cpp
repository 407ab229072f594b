// Gated DeltaNet benchmark: B = 1, H = HV = 8, K = V = 128, float32, keys (and queries)
// L2-normalised in the kernel (use_qk_l2norm_in_kernel), β = σ(x) ∈ (0, 1), realistic gates;
// forward and forward + backward for the recurrent and chunk kernels (reference at T = 1024
// only); BM_GatedDeltaRuleRecurrentDevice: the recurrent kernel on the CPU, on the emulated GPU
// (the CUDA kernel run thread by thread, T = 64: a cost figure, not a speed) and, when the machine
// has one, on a CUDA GPU (T ∈ {1024, 4096, 16384}, the CPU beside it). items_per_second is tokens
// per second; peak_MiB is the peak heap of one forward + backward (everything allocated on top of
// the inputs and outputs, Eigen included). BM_GatedDeltaRuleHarnessShape: forward + backward of one
// layer of the synthetic-task harness's quick suite (B = 32, H = 2, K = 32, V = 64, T = 64).
// BM_GatedDeltaRuleChunkStates: the chunk forward and forward + backward with the chunk states and
// U_new (v_new) kept by the forward for the backward (as the LibTorch layer trains) against the
// replay. BM_GatedDeltaRuleTrainingStep: the forward, the training forward (chunk states and U_new
// kept) and the backward, each timed alone; step_per_fwd = (training forward + backward) ÷ forward.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "phasor/gated_delta_rule.h"

namespace {

using phasor::Impl;
using phasor::TensorView;

constexpr std::int64_t kB = 1, kH = 8, kK = 128, kV = 128;

// Inputs, outputs and gradients of one problem size, allocated outside the timed loop.
struct Problem {
  std::int64_t T;
  phasor::bench::Shape shape;
  std::vector<float> q, k, v, g, beta, d_o, o, dq, dk, dv, dg, dbeta;

  explicit Problem(std::int64_t T_, phasor::bench::Shape shape_ = {kB, kH, kK, kV})
      : T(T_), shape(shape_) {
    const auto [B, H, K, V] = shape;
    const auto qk = static_cast<std::size_t>(B * T * H * K);
    const auto vv = static_cast<std::size_t>(B * T * H * V);
    const auto heads = static_cast<std::size_t>(B * T * H);
    std::mt19937_64 rng(42);
    q = phasor::bench::normal(qk, rng);
    k = phasor::bench::normal(qk, rng);
    v = phasor::bench::normal(vv, rng);
    d_o = phasor::bench::normal(vv, rng);
    g = phasor::bench::log_sigmoid_gates(heads, rng, 3.f);  // typical trained forget gates
    beta = phasor::bench::normal(heads, rng);               // β = σ(x), x ~ N(0, 1)
    for (auto& e : beta) e = 1.f / (1.f + std::exp(-e));
    o.assign(vv, 0.f);
    dv.assign(vv, 0.f);
    dq.assign(qk, 0.f);
    dk.assign(qk, 0.f);
    dg.assign(heads, 0.f);
    dbeta.assign(heads, 0.f);
  }

  TensorView qk_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H, shape.K});
  }
  TensorView v_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H, shape.V});
  }
  TensorView head_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {shape.B, T, shape.H});
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
  phasor::GatedDeltaRuleGrads grads() {
    phasor::GatedDeltaRuleGrads gr;
    gr.dq = qk_view(dq);
    gr.dk = qk_view(dk);
    gr.dv = v_view(dv);
    gr.dg = head_view(dg);
    gr.dbeta = head_view(dbeta);
    return gr;
  }
};

// Floating-point operations per token of chunk_gated_delta_rule at chunk size L (2 per
// multiply-add of the algorithm's products, per value head): the forward's [K; Q̃] S (4KV), state
// update (2KV), the solve with M and the gated attention on U_new (2LV on average: (L − 1)V +
// (L + 1)V) and K Kᵀ, Q̃ Kᵀ (2LK); the backward replays the states (4KV + LV + 2LK), recomputes
// the chunk (2KV + LV + 2LK) and differentiates it (12KV + 4LV + 4LK).
// With the chunk states kept by the forward (kept), the backward does not replay the states.
double gdn_chunk_flops(bool backward, bool kept = false) {
  const double K = kK, V = kV, L = 64;
  const double forward = 6 * K * V + 2 * L * V + 2 * L * K;
  const double replay = kept ? 0 : 4 * K * V + L * V + 2 * L * K;
  // With U_new kept (v_new) as well, the walk back forms no K S and solves once.
  const double walk_back = 14 * K * V + 5 * L * V + 6 * L * K - (kept ? 2 * K * V + L * V : 0);
  return kH * (backward ? forward + replay + walk_back : forward);
}

void BM_GatedDeltaRuleForward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o);
  const double seconds = phasor::bench::time_calls(
      state, problem.T, impl, [&] { phasor::gated_delta_rule_forward(params, impl, o); });
  if (impl == Impl::chunk)
    phasor::bench::report_flops(state, seconds, problem.T, gdn_chunk_flops(false));
}

void BM_GatedDeltaRuleForwardBackward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  Problem problem(state.range(1));
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GatedDeltaRuleGrads grads = problem.grads();
  const double seconds = phasor::bench::time_calls(state, problem.T, impl, [&] {
    phasor::gated_delta_rule_forward(params, impl, o);
    phasor::gated_delta_rule_backward(params, impl, d_o, {}, grads);
  });
  if (impl == Impl::chunk)
    phasor::bench::report_flops(state, seconds, problem.T, gdn_chunk_flops(true));
}

// The chunk forward (+ backward) with the chunk states kept for the backward, or replayed by it
// (bench_util.h: register_chunk_state_grid).
void BM_GatedDeltaRuleChunkStates(benchmark::State& state) {
  const bool kept = state.range(0) != 0, backward = state.range(1) != 0;
  Problem problem(state.range(2));
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GatedDeltaRuleGrads grads = problem.grads();
  const phasor::bench::ChunkStates kept_states(kept, params.q, params.v, params.chunk_size);
  const TensorView& chunk_states = kept_states.view;
  // U_new beside the states, as the LibTorch layer keeps it (phasor/gated_delta_rule.h, v_new).
  std::vector<float> kept_v_new(kept ? problem.v.size() : 0);
  const TensorView v_new = kept ? problem.v_view(kept_v_new) : TensorView{};
  const double seconds = phasor::bench::time_calls(state, problem.T, Impl::chunk, [&] {
    phasor::gated_delta_rule_forward(params, Impl::chunk, o, {}, chunk_states, v_new);
    if (backward)
      phasor::gated_delta_rule_backward(params, Impl::chunk, d_o, {}, grads, chunk_states, v_new);
  });
  phasor::bench::report_flops(state, seconds, problem.T, gdn_chunk_flops(backward, kept));
  state.SetLabel(phasor::bench::chunk_state_label(kept));
}

// A training step against the inference forward (bench_util.h: time_training_step): the chunk
// forward, the forward keeping the chunk states and U_new, and the backward reading them.
void BM_GatedDeltaRuleTrainingStep(benchmark::State& state) {
  Problem problem(state.range(0));
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GatedDeltaRuleGrads grads = problem.grads();
  const phasor::bench::ChunkStates kept(true, params.q, params.v, params.chunk_size);
  std::vector<float> kept_v_new(problem.v.size());
  const TensorView v_new = problem.v_view(kept_v_new);
  phasor::bench::time_training_step(
      state, problem.T, {gdn_chunk_flops(false), gdn_chunk_flops(true, true)},
      [&] { phasor::gated_delta_rule_forward(params, Impl::chunk, o); },
      [&] { phasor::gated_delta_rule_forward(params, Impl::chunk, o, {}, kept.view, v_new); },
      [&] {
        phasor::gated_delta_rule_backward(params, Impl::chunk, d_o, {}, grads, kept.view, v_new);
      });
}

// Forward + backward at the harness's layer shape (bench_util.h: kHarnessShape with V doubled,
// the layer's expand_v = 2; T = 64).
void BM_GatedDeltaRuleHarnessShape(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(0));
  phasor::bench::Shape shape = phasor::bench::kHarnessShape;
  shape.V *= 2;
  Problem problem(phasor::bench::kHarnessT, shape);
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::GatedDeltaRuleGrads grads = problem.grads();
  phasor::bench::time_calls(state, shape.B * problem.T, impl, [&] {
    phasor::gated_delta_rule_forward(params, impl, o);
    phasor::gated_delta_rule_backward(params, impl, d_o, {}, grads);
  });
}

// chunk_gated_delta_rule forward with the benchmark's inputs in float32 or rounded to bfloat16
// (computing in float32 either way; o float32).
void BM_GatedDeltaRuleInputDtype(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  Problem problem(state.range(1));
  phasor::GatedDeltaRuleParams params = problem.params();
  std::vector<phasor::bfloat16> q16, k16, v16, g16, beta16;  // the bfloat16 copies
  if (bf16) {
    params.q = phasor::bench::bfloat16_copy(params.q, q16);
    params.k = phasor::bench::bfloat16_copy(params.k, k16);
    params.v = phasor::bench::bfloat16_copy(params.v, v16);
    params.g = phasor::bench::bfloat16_copy(params.g, g16);
    params.beta = phasor::bench::bfloat16_copy(params.beta, beta16);
  }
  const TensorView o = problem.v_view(problem.o);
  phasor::bench::time_dtype(state, bf16, problem.T,
                            [&] { phasor::gated_delta_rule_forward(params, Impl::chunk, o); });
}

// One long sequence: B = H = 1, T = 65,536 (chunk_gated_delta_rule, forward and forward +
// backward, 1 and 2 threads).
void BM_GatedDeltaRuleLongSequence(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const bool backward = state.range(1) != 0, kept = state.range(2) != 0;
  Problem problem(65536, {1, 1, kK, kV});
  const phasor::GatedDeltaRuleParams params = problem.params();
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  const phasor::bench::ChunkStates kept_states(kept, params.q, params.v, params.chunk_size);
  const TensorView& chunk_states = kept_states.view;
  const phasor::GatedDeltaRuleGrads grads = problem.grads();
  phasor::bench::time_long_sequence(
      state, threads, backward, problem.T,
      [&] {
        phasor::gated_delta_rule_forward(params, Impl::chunk, o, {}, chunk_states);
        if (backward)
          phasor::gated_delta_rule_backward(params, Impl::chunk, d_o, {}, grads, chunk_states);
      },
      kept);
}

// Rotation by Selective-RoPE-like angles: none / fused into the kernel / apply_rotary + op
// (bench_util.h, Rotation); label "<impl>/<rotation>". Gradients include dθ.
void BM_GatedDeltaRuleRotationForward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(1));
  Problem problem(state.range(2));
  std::mt19937_64 rng(7);
  phasor::bench::RotationBuffers rot(kB, problem.T, kH, kK, rng);
  const TensorView o = problem.v_view(problem.o);
  phasor::bench::time_rotation_forward(
      state, problem.T, impl, static_cast<phasor::bench::Rotation>(state.range(0)), rot,
      problem.params(),
      [&](const phasor::GatedDeltaRuleParams& p) { phasor::gated_delta_rule_forward(p, impl, o); });
}

void BM_GatedDeltaRuleRotationForwardBackward(benchmark::State& state) {
  const auto impl = static_cast<Impl>(state.range(1));
  Problem problem(state.range(2));
  std::mt19937_64 rng(7);
  phasor::bench::RotationBuffers rot(kB, problem.T, kH, kK, rng);
  const TensorView o = problem.v_view(problem.o), d_o = problem.v_view(problem.d_o);
  phasor::bench::time_rotation_forward_backward(
      state, problem.T, impl, static_cast<phasor::bench::Rotation>(state.range(0)), rot,
      problem.params(), problem.grads(),
      [&](const phasor::GatedDeltaRuleParams& p, const phasor::GatedDeltaRuleGrads& gr) {
        phasor::gated_delta_rule_forward(p, impl, o);
        phasor::gated_delta_rule_backward(p, impl, d_o, {}, gr);
      });
}

void BM_GatedDeltaRuleRecurrentDevice(benchmark::State& state) {
  const auto device = static_cast<phasor::Device>(state.range(0));
  const bool backward = state.range(1) != 0;
  Problem problem(state.range(2));
  const std::int64_t T = problem.T;
  phasor::bench::DeviceBuffers on(device);
  phasor::GatedDeltaRuleParams params = problem.params();
  params.q = on.view(problem.q, {kB, T, kH, kK});
  params.k = on.view(problem.k, {kB, T, kH, kK});
  params.v = on.view(problem.v, {kB, T, kH, kV});
  params.g = on.view(problem.g, {kB, T, kH});
  params.beta = on.view(problem.beta, {kB, T, kH});
  const TensorView o = on.view(problem.o, {kB, T, kH, kV}),
                   d_o = on.view(problem.d_o, {kB, T, kH, kV});
  phasor::GatedDeltaRuleGrads grads;
  grads.dq = on.view(problem.dq, {kB, T, kH, kK});
  grads.dk = on.view(problem.dk, {kB, T, kH, kK});
  grads.dv = on.view(problem.dv, {kB, T, kH, kV});
  grads.dg = on.view(problem.dg, {kB, T, kH});
  grads.dbeta = on.view(problem.dbeta, {kB, T, kH});
  phasor::bench::time_calls(state, T, Impl::recurrent, [&] {
    phasor::gated_delta_rule_forward(params, Impl::recurrent, o);
    if (backward) phasor::gated_delta_rule_backward(params, Impl::recurrent, d_o, {}, grads);
    phasor::bench::DeviceBuffers::wait_for(backward ? grads.dq : o);
  });
  state.SetLabel(std::string(phasor::to_string(device)) + "/recurrent" +
                 (backward ? "/fwd+bwd" : "/fwd"));
}

// chunk_gated_delta_rule at K = V = 128 in bfloat16 with the in-kernel ℓ2 norm on a device: the
// CPU and the emulated GPU at T = 64 (the emulation's cost), fla's shapes on a GPU (fla publishes
// 1.029 ms forward, 3.616 ms forward + backward for B = 2, T = 16384, H = 16 on a GB200).
void BM_GatedDeltaRuleChunkDevice(benchmark::State& state) {
  const auto device = static_cast<phasor::Device>(state.range(0));
  const bool backward = state.range(1) != 0;
  const std::int64_t B = state.range(2), T = state.range(3), H = state.range(4), K = 128, V = 128;
  std::mt19937_64 rng(5);
  const auto qk = static_cast<std::size_t>(B * T * H * K),
             vv = static_cast<std::size_t>(B * T * H * V),
             heads = static_cast<std::size_t>(B * T * H);
  const std::vector<float> q = phasor::bench::normal(qk, rng), k = phasor::bench::normal(qk, rng),
                           v = phasor::bench::normal(vv, rng), d_o = phasor::bench::normal(vv, rng),
                           g = phasor::bench::log_sigmoid_gates(heads, rng, 3.f);
  std::vector<float> beta = phasor::bench::normal(heads, rng);
  for (auto& e : beta) e = 1.f / (1.f + std::exp(-e));
  const phasor::DType bf16 = phasor::DType::bfloat16;
  phasor::bench::DeviceBuffers on(device);
  phasor::GatedDeltaRuleParams p;
  p.q = on.view(q, {B, T, H, K}, bf16);
  p.k = on.view(k, {B, T, H, K}, bf16);
  p.v = on.view(v, {B, T, H, V}, bf16);
  p.g = on.view(g, {B, T, H}, bf16);
  p.beta = on.view(beta, {B, T, H}, bf16);
  p.use_qk_l2norm_in_kernel = true;
  p.chunk_size = 64;
  const std::vector<float> zeros(vv, 0.f), zeros_k(qk, 0.f), zeros_h(heads, 0.f);
  const TensorView o = on.view(zeros, {B, T, H, V}, bf16), dout = on.view(d_o, {B, T, H, V}, bf16);
  phasor::GatedDeltaRuleGrads grads;
  grads.dq = on.view(zeros_k, {B, T, H, K}, bf16);
  grads.dk = on.view(zeros_k, {B, T, H, K}, bf16);
  grads.dv = on.view(zeros, {B, T, H, V}, bf16);
  grads.dg = on.view(zeros_h, {B, T, H}, bf16);
  grads.dbeta = on.view(zeros_h, {B, T, H}, bf16);
  phasor::bench::time_device_calls(state, device, B * T, [&] {
    phasor::gated_delta_rule_forward(p, Impl::chunk, o);
    if (backward) phasor::gated_delta_rule_backward(p, Impl::chunk, dout, {}, grads);
  });
  state.SetLabel(std::string(phasor::to_string(device)) + "/chunk/bf16" +
                 (backward ? "/fwd+bwd" : "/fwd"));
}

// Decoding: one token (B = 1, T = 1, H = HV = 8, float32, ℓ2 norm in the kernel) through
// fused_recurrent_gated_delta_rule with the state updated in place (64-byte aligned, as
// LibTorch's tensors are), on `threads` threads; time per call. K = V = 2: the per-call overhead.
void BM_GatedDeltaRuleDecode(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const std::int64_t D = state.range(1);
  std::mt19937_64 rng(3);
  const auto n = static_cast<std::size_t>(kB * kH * D), heads = static_cast<std::size_t>(kB * kH);
  const std::vector<float> q = phasor::bench::normal(n, rng), k = phasor::bench::normal(n, rng),
                           v = phasor::bench::normal(n, rng),
                           g = phasor::bench::log_sigmoid_gates(heads, rng, 3.f), beta(heads, 0.5f);
  std::vector<float> o(n, 0.f);
  const auto h = phasor::bench::aligned_state(static_cast<std::size_t>(kB * kH * D * D));
  phasor::GatedDeltaRuleParams params;
  params.q = TensorView::of(q.data(), {kB, 1, kH, D});
  params.k = TensorView::of(k.data(), {kB, 1, kH, D});
  params.v = TensorView::of(v.data(), {kB, 1, kH, D});
  params.g = TensorView::of(g.data(), {kB, 1, kH});
  params.beta = TensorView::of(beta.data(), {kB, 1, kH});
  params.use_qk_l2norm_in_kernel = true;
  params.initial_state = TensorView::of(h.get(), {kB, kH, D, D});
  const TensorView out = TensorView::of(o.data(), {kB, 1, kH, D});
  phasor::bench::time_decode(state, threads, D, [&] {
    phasor::gated_delta_rule_forward(params, Impl::recurrent, out, params.initial_state);
  });
}

const bool registered = [] {
  using benchmark::RegisterBenchmark;
  phasor::bench::register_long_sequence_grid(
      RegisterBenchmark("BM_GatedDeltaRuleLongSequence", BM_GatedDeltaRuleLongSequence), true,
      true);
  phasor::bench::register_dtype_grid(
      RegisterBenchmark("BM_GatedDeltaRuleInputDtype", BM_GatedDeltaRuleInputDtype));
  phasor::bench::register_decode_grid(
      RegisterBenchmark("BM_GatedDeltaRuleDecode", BM_GatedDeltaRuleDecode));
  phasor::bench::register_harness_grid(
      RegisterBenchmark("BM_GatedDeltaRuleHarnessShape", BM_GatedDeltaRuleHarnessShape),
      {Impl::recurrent, Impl::chunk});
  phasor::bench::register_standard_grid(
      RegisterBenchmark("BM_GatedDeltaRuleForward", BM_GatedDeltaRuleForward),
      RegisterBenchmark("BM_GatedDeltaRuleForward", BM_GatedDeltaRuleForward));
  phasor::bench::register_standard_grid(
      RegisterBenchmark("BM_GatedDeltaRuleForwardBackward", BM_GatedDeltaRuleForwardBackward),
      RegisterBenchmark("BM_GatedDeltaRuleForwardBackward", BM_GatedDeltaRuleForwardBackward));
  phasor::bench::register_chunk_state_grid(
      RegisterBenchmark("BM_GatedDeltaRuleChunkStates", BM_GatedDeltaRuleChunkStates));
  phasor::bench::register_training_step_grid(
      RegisterBenchmark("BM_GatedDeltaRuleTrainingStep", BM_GatedDeltaRuleTrainingStep),
      {1024, 4096, 16384});
  phasor::bench::register_device_grid(
      RegisterBenchmark("BM_GatedDeltaRuleRecurrentDevice", BM_GatedDeltaRuleRecurrentDevice));
  phasor::bench::register_chunk_device_grid(
      RegisterBenchmark("BM_GatedDeltaRuleChunkDevice", BM_GatedDeltaRuleChunkDevice));
  phasor::bench::register_rotation_grid(
      RegisterBenchmark("BM_GatedDeltaRuleRotationForward", BM_GatedDeltaRuleRotationForward),
      {Impl::recurrent, Impl::chunk});
  phasor::bench::register_rotation_grid(
      RegisterBenchmark("BM_GatedDeltaRuleRotationForwardBackward",
                        BM_GatedDeltaRuleRotationForwardBackward),
      {Impl::recurrent, Impl::chunk});
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
