// Benchmark support shared by bench/<op>_bench.cpp: random inputs, the timed loop (tokens/s,
// implementation label, peak heap) and the standard argument grid.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "gemm_ceiling.h"
#include "memory.h"
#include "phasor/common.h"
#include "phasor/device.h"
#include "phasor/rotary.h"

namespace phasor::bench {

// The sizes of a benchmark's problem besides T: batch, heads and head widths.
struct Shape {
  std::int64_t B, H, K, V;
};
// One layer of the synthetic-task harness's quick suite (tasks/configs/quick: hidden 64, 2 heads,
// batch 32, sequences of 64 tokens; Gated DeltaNet doubles V, expand_v = 2): many short items,
// where per-call costs (buffers, hand-offs) weigh more than in the standard shape.
constexpr std::int64_t kHarnessT = 64;
constexpr Shape kHarnessShape{32, 2, 32, 32};

// Inputs of at least this many values (the GPU rows at fla's shapes: 67 M and 101 M a tensor;
// no CPU benchmark's, which keep the values they have always had) are drawn in parallel. One
// thread draws 67 M normals in 1.3 s here, so a GLA row's inputs took ~7 s, and Google Benchmark
// runs a row's function 2-3 times to size its iteration count: most of the ~30 s each GPU row's
// process took on the H200 machine for well under a second of GPU time, out of 15 minutes of
// device time a session.
constexpr std::size_t kParallelDrawThreshold = std::size_t{1} << 25;

// f(begin, end, block) over [0, n) in fixed blocks of 2^16 (block b = [b·2^16, (b+1)·2^16)), the
// blocks spread over the machine's threads: what a block computes never depends on the thread
// count.
template <class F>
void for_blocks(std::size_t n, const F& f) {
  constexpr std::size_t kBlock = std::size_t{1} << 16;
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  const std::size_t threads =
      std::max<std::size_t>(1, std::min<std::size_t>(blocks, std::thread::hardware_concurrency()));
  if (threads == 1) {  // one block (a small view): no thread to start
    for (std::size_t b = 0; b < blocks; ++b) f(b * kBlock, std::min(n, (b + 1) * kBlock), b);
    return;
  }
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (std::size_t b = t; b < blocks; b += threads)
        f(b * kBlock, std::min(n, (b + 1) * kBlock), b);
    });
  for (auto& thread : pool) thread.join();
}

// n values map(z) of z ~ N(0, 1). Below kParallelDrawThreshold, drawn in order from rng (the
// values every CPU benchmark has always used); from it on, block b of for_blocks draws from its
// own generator, seeded by one draw of rng and b: the same values for any thread count.
template <class Map>
std::vector<float> draw_normal(std::size_t n, std::mt19937_64& rng, const Map& map) {
  std::vector<float> x(n);
  if (n < kParallelDrawThreshold) {
    std::normal_distribution<float> dist(0.f, 1.f);
    for (auto& e : x) e = map(dist(rng));
    return x;
  }
  const std::uint64_t seed = rng();
  for_blocks(n, [&](std::size_t begin, std::size_t end, std::size_t block) {
    std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                      static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32)};
    std::mt19937_64 block_rng(seq);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (std::size_t i = begin; i < end; ++i) x[i] = map(dist(block_rng));
  });
  return x;
}

// n samples of N(0, 1).
inline std::vector<float> normal(std::size_t n, std::mt19937_64& rng) {
  return draw_normal(n, rng, [](float z) { return z; });
}

// n log forget gates log σ(mean + N(0, 1)): σ(mean) is the typical gate of a trained model.
inline std::vector<float> log_sigmoid_gates(std::size_t n, std::mt19937_64& rng, float mean) {
  return draw_normal(n, rng, [mean](float z) { return -std::log1p(std::exp(-(mean + z))); });
}

// Minor page faults of this process so far (pages the kernel mapped in on first touch).
inline std::int64_t minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_minflt);
}

// The timed loop of every benchmark: runs `call` once per iteration and reports tokens/s
// (items_per_second), the implementation as the label, the peak heap of one call as
// "peak_MiB" (everything allocated on top of the caller's inputs and outputs, Eigen included)
// and the minor page faults per call as "faults" (a kernel that keeps its buffers has none once
// warm; buffers freed and allocated again each call show here, as malloc returns them to the
// system and takes them back — these programs run with glibc's default malloc settings, as a
// user's program does). Returns the wall time of the timed loop, in seconds (for report_flops).
template <class F>
double time_calls(benchmark::State& state, std::int64_t tokens, Impl impl, F&& call) {
  std::int64_t peak = 0;
  const std::int64_t faults_before = minor_page_faults();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    reset_peak_heap();
    call();
    peak = std::max(peak, peak_heap_bytes());
    benchmark::ClobberMemory();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::int64_t faults = minor_page_faults() - faults_before;
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1024.0 * 1024.0);
  state.counters["faults"] =
      benchmark::Counter(static_cast<double>(faults), benchmark::Counter::kAvgIterations);
  state.SetLabel(to_string(impl));
  return seconds;
}

// Reports the arithmetic rate of calls that do `flops_per_token` floating-point operations per
// token (each op's count of the algorithm's products, stated beside it), timed by time_calls
// (`seconds`): GFLOP/s, and of_gemm, that rate as a fraction of Eigen's float32 GEMM on as many
// threads (gemm_ceiling.h). The timed loop's wall time includes the heap accounting (negligible
// against a call of a millisecond or more).
inline void report_flops(benchmark::State& state, double seconds, std::int64_t tokens_per_call,
                         double flops_per_token) {
  const double gflops = static_cast<double>(state.iterations()) *
                        static_cast<double>(tokens_per_call) * flops_per_token / seconds / 1e9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["of_gemm"] = gflops / gemm_ceiling_gflops(phasor::num_threads());
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

// ---- Chunk states kept by the forward for the backward ----------------------------------------
// Arguments (kept, backward, T): the chunk forward, alone and with its backward, with the chunk
// states kept by the forward and read by the backward (kept:1, what the LibTorch layer does when
// it trains) and without them (kept:0: the backward replays the state recurrence), side by side at
// T ∈ {1024, 4096, 16384}; labelled by chunk_state_label.
inline void register_chunk_state_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kept", "backward", "T"});
  for (std::int64_t T : {1024, 4096, 16384})
    for (std::int64_t backward : {0, 1})
      for (std::int64_t kept : {0, 1}) b->Args({kept, backward, T});
  b->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();
}
inline const char* chunk_state_label(bool kept) {
  return kept ? "chunk/states kept" : "chunk/states replayed";
}
// The float32 chunk states of a call with q [B, T, ·, K] and v [B, T, heads, V], no cu_seqlens:
// [num_chunk_states, heads, K, V]; none (an undefined view) when not kept.
struct ChunkStates {
  std::vector<float> storage;
  TensorView view;
  ChunkStates(bool kept, const TensorView& q, const TensorView& v, std::int64_t chunk_size) {
    if (!kept) return;
    const std::int64_t count = num_chunk_states(q, {}, chunk_size), heads = v.size(2),
                       K = q.size(3), V = v.size(3);
    storage.resize(static_cast<std::size_t>(count * heads * K * V));
    view = TensorView::of(storage.data(), {count, heads, K, V});
  }
};

// ---- A training step against the forward (issue 13's forward + backward ÷ forward) -------------
// Arguments (T): T in `lengths`, at least `min_time` seconds each (enough for a median of 3 or
// more iterations at the longest).
inline void register_training_step_grid(benchmark::internal::Benchmark* b,
                                        std::initializer_list<std::int64_t> lengths,
                                        double min_time = 2.0) {
  b->ArgNames({"T"});
  for (std::int64_t T : lengths) b->Arg(T);
  b->Unit(benchmark::kMillisecond)->MinTime(min_time)->UseRealTime();
}

// The operations of time_training_step's calls, per token, as the benchmarks' FLOP counts give
// them (report_flops): the backward's alone is their difference.
struct StepOperations {
  double forward = 0;           // the inference forward's (and the training forward's)
  double forward_backward = 0;  // the training forward's and the backward's reading what it kept
};

// Each iteration runs, in this order and each timed alone: `forward` (inference: keeps nothing),
// `training_forward` (what a training step's forward does: keeps what the backward reads, as the
// LibTorch layer does under autograd) and `backward` (reading what training_forward kept). Reports
// the medians over the iterations of each call's time, fwd_ms, train_fwd_ms and bwd_ms, and
// step_per_fwd = (train_fwd_ms + bwd_ms) ÷ fwd_ms: a training step's time in forwards. Each call
// is timed by itself, so the ratio does not include a loop's setup or page faults, and the three
// calls of an iteration meet the same machine load; medians keep one slow iteration out.
// items_per_second counts the tokens of a training step.
//
// Given the operations each call does (`operations`, per token), it also splits step_per_fwd into
// what the algorithm asks and how fast it runs: bwd_ops_per_fwd, the backward's operations ÷ the
// forward's, and bwd_rate_per_fwd, the backward's operations per second ÷ the forward's. Then
//   step_per_fwd = train_fwd_ms ÷ fwd_ms + bwd_ops_per_fwd ÷ bwd_rate_per_fwd,
// so with keeping free and both calls at the same rate, step_per_fwd = 1 + bwd_ops_per_fwd: the
// ratio's floor for that algorithm (issue 13's goal of 3.0 asks bwd_ops_per_fwd ≤ 2 at equal
// rates).
template <class Forward, class TrainingForward, class Backward>
void time_training_step(benchmark::State& state, std::int64_t tokens, StepOperations operations,
                        Forward&& forward, TrainingForward&& training_forward,
                        Backward&& backward) {
  std::vector<double> fwd, train_fwd, bwd;
  const auto timed = [](auto&& call, std::vector<double>& into) {
    const auto start = std::chrono::steady_clock::now();
    call();
    benchmark::ClobberMemory();
    into.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  };
  for (auto _ : state) {
    timed(forward, fwd);
    timed(training_forward, train_fwd);
    timed(backward, bwd);
  }
  const auto median = [](std::vector<double> x) {
    if (x.empty()) return 0.0;
    const auto mid = x.begin() + static_cast<std::ptrdiff_t>(x.size() / 2);
    std::nth_element(x.begin(), mid, x.end());
    if (x.size() % 2 == 1) return *mid;
    return (*mid + *std::max_element(x.begin(), mid)) / 2;
  };
  const double f = median(fwd), tf = median(train_fwd), b = median(bwd);
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["fwd_ms"] = f;
  state.counters["train_fwd_ms"] = tf;
  state.counters["bwd_ms"] = b;
  state.counters["step_per_fwd"] = f > 0 ? (tf + b) / f : 0.0;
  const double bwd_ops_per_fwd =
      operations.forward > 0 ? operations.forward_backward / operations.forward - 1 : 0.0;
  state.counters["bwd_ops_per_fwd"] = bwd_ops_per_fwd;
  state.counters["bwd_rate_per_fwd"] = b > 0 ? bwd_ops_per_fwd * f / b : 0.0;
  state.SetLabel("chunk");
}

// ---- Input dtype: float32 against bfloat16 ----------------------------------------------------
// A bfloat16 copy (rounded to nearest even) of the contiguous float32 tensor x, held in
// `storage`: a view of the same shape.
inline TensorView bfloat16_copy(const TensorView& x, std::vector<bfloat16>& storage) {
  const auto n = static_cast<std::size_t>(x.numel());
  const float* data = static_cast<const float*>(x.data);
  storage.resize(n);
  for (std::size_t i = 0; i < n; ++i) storage[i] = bfloat16::from_float(data[i]);
  TensorView copy = x;
  copy.data = storage.data();
  copy.dtype = DType::bfloat16;
  return copy;
}

// Arguments (bf16, T): the chunk forward at T = 4096 with float32 inputs and with the same
// inputs in bfloat16 (outputs float32 in both), labelled by time_dtype.
inline void register_dtype_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bf16", "T"})->Args({0, 4096})->Args({1, 4096});
  b->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
}
template <class F>
void time_dtype(benchmark::State& state, bool bf16, std::int64_t T, F&& call) {
  time_calls(state, T, Impl::chunk, call);
  state.SetLabel(bf16 ? "chunk/bfloat16 inputs" : "chunk/float32 inputs");
}

// ---- Long single sequences ----------------------------------------------------------------------
// B = H = 1, T = 65,536, K = V = 128: one (sequence, head) item, so threads help only by splitting
// it (the chunk kernels' by-chunk schedules). Arguments (threads, backward).
// with_kept: the forward + backward rows also with the chunk states kept by the forward for the
// backward (a third argument, kept).
inline void register_long_sequence_grid(benchmark::internal::Benchmark* b, bool with_backward,
                                        bool with_kept = false) {
  if (with_kept)
    b->ArgNames({"threads", "bwd", "kept"});
  else
    b->ArgNames({"threads", "bwd"});
  for (std::int64_t backward : {0, 1}) {
    if (backward && !with_backward) continue;
    for (std::int64_t kept : {0, 1}) {
      if (kept && !(with_kept && backward)) continue;
      for (std::int64_t threads : {1, 2}) {
        if (with_kept)
          b->Args({threads, backward, kept});
        else
          b->Args({threads, backward});
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
}

// Runs time_calls on `threads` threads, labelled "chunk/<threads> thread(s)[/fwd+bwd][/states
// kept]".
template <class F>
void time_long_sequence(benchmark::State& state, int threads, bool backward, std::int64_t T,
                        F&& call, bool kept = false) {
  phasor::set_num_threads(threads);
  time_calls(state, T, Impl::chunk, call);
  phasor::set_num_threads(0);
  state.SetLabel("chunk/" + std::to_string(threads) + " thread" + (threads > 1 ? "s" : "") +
                 (backward ? "/fwd+bwd" : "/fwd") + (kept ? "/states kept" : ""));
}

// ---- Decoding: one token per call, the state updated in place ---------------------------------
// A zeroed float buffer of `count` elements on a 64-byte boundary, as LibTorch's tensors are (the
// recurrent kernels then update the state in place).
inline std::unique_ptr<float, decltype(&std::free)> aligned_state(std::size_t count) {
  const std::size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
  std::unique_ptr<float, decltype(&std::free)> p(static_cast<float*>(std::aligned_alloc(64, bytes)),
                                                 &std::free);
  std::memset(p.get(), 0, bytes);
  return p;
}

// Times `step()` (one decoded token) on `threads` threads, labelled "recurrent/<threads>";
// K = V = 2 rows are labelled "/overhead" (almost no arithmetic: the per-call cost).
template <class F>
void time_decode(benchmark::State& state, int threads, std::int64_t dim, F&& step) {
  phasor::set_num_threads(threads);
  for (auto _ : state) {
    step();
    benchmark::ClobberMemory();
  }
  phasor::set_num_threads(0);
  state.SetLabel("recurrent/" + std::to_string(threads) + " thread" + (threads > 1 ? "s" : "") +
                 (dim == 2 ? "/overhead" : ""));
}

// Arguments (threads, K = V) of the decoding benchmarks: the model's K = V = 128 and the
// overhead probe K = V = 2, on 1 and 2 threads.
inline void register_decode_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "K"})
      ->Args({1, 128})
      ->Args({2, 128})
      ->Args({1, 2})
      ->Args({2, 2})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

// Arguments (impl) of the harness-shape benchmarks (kHarnessShape): `impls` side by side.
inline void register_harness_grid(benchmark::internal::Benchmark* b,
                                  std::initializer_list<Impl> impls) {
  b->ArgNames({"impl"});
  for (Impl impl : impls) b->Arg(static_cast<std::int64_t>(impl));
  b->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();
}

// ---- Rotation: fused into the kernel vs rotate-then-call ---------------------------------------
// How a benchmark applies rotation angles θ to q and k.
//  none:     no rotation at all (the cost of the op alone, for reference)
//  fused:    θ passed to the op, which rotates on load and returns dθ from its backward
//  separate: what the public Selective RoPE code does: apply_rotary writes rotated copies of q and
//            k, the op runs on them, and apply_rotary_backward turns dq', dk' into dq, dk and dθ
//            (two dθ halves, summed).
enum class Rotation : std::int64_t { none = 0, fused = 1, separate = 2 };
inline const char* to_string(Rotation r) {
  return r == Rotation::none ? "none" : r == Rotation::fused ? "fused" : "separate";
}

// Angles and the scratch buffers of the separate path for q, k: [B, T, H, K] (float32).
// θ is a Selective-RoPE-like running phase: cumulative sums of positive increments times a
// RoPE-like spectrum, so angles grow to thousands of radians as in a trained model.
struct RotationBuffers {
  std::int64_t B = 0, T = 0, H = 0, K = 0;
  std::vector<float> theta, q_rot, k_rot, dq_rot, dk_rot, dtheta, dtheta_k;

  RotationBuffers(std::int64_t B_, std::int64_t T_, std::int64_t H_, std::int64_t K_,
                  std::mt19937_64& rng)
      : B(B_), T(T_), H(H_), K(K_) {
    const std::int64_t R = K / 2;
    std::uniform_real_distribution<float> step(0.f, 2.f);
    theta.assign(static_cast<std::size_t>(B * T * H * R), 0.f);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < R; ++i) {
          const double omega = std::pow(10000.0, -2.0 * static_cast<double>(i) / K);
          double phase = 0.0;
          for (std::int64_t t = 0; t < T; ++t) {
            phase += step(rng);
            theta[static_cast<std::size_t>(((b * T + t) * H + h) * R + i)] =
                static_cast<float>(omega * phase);
          }
        }
    const auto n = static_cast<std::size_t>(B * T * H * K);
    q_rot.assign(n, 0.f);
    k_rot.assign(n, 0.f);
    dq_rot.assign(n, 0.f);
    dk_rot.assign(n, 0.f);
    dtheta.assign(theta.size(), 0.f);
    dtheta_k.assign(theta.size(), 0.f);
  }
  TensorView x_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {B, T, H, K});
  }
  TensorView theta_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {B, T, H, K / 2});
  }
  // separate path, forward: q_rot, k_rot = R(θ) q, R(θ) k.
  void rotate(const TensorView& q, const TensorView& k) {
    apply_rotary_forward(q, theta_view(theta), RotaryLayout::half_split, Impl::chunk,
                         x_view(q_rot));
    apply_rotary_forward(k, theta_view(theta), RotaryLayout::half_split, Impl::chunk,
                         x_view(k_rot));
  }
  // separate path, backward: given dq_rot, dk_rot from the op, writes dq, dk and dθ.
  void unrotate(const TensorView& q, const TensorView& k, const TensorView& dq,
                const TensorView& dk) {
    apply_rotary_backward(q, theta_view(theta), RotaryLayout::half_split, Impl::chunk,
                          x_view(dq_rot), dq, theta_view(dtheta));
    apply_rotary_backward(k, theta_view(theta), RotaryLayout::half_split, Impl::chunk,
                          x_view(dk_rot), dk, theta_view(dtheta_k));
    for (std::size_t i = 0; i < dtheta.size(); ++i) dtheta[i] += dtheta_k[i];
  }
};

// The timed loop of a rotation benchmark, forward only. `params` holds the op's inputs without
// θ; forward(p) runs the op on params p. The label is "<impl>/<rotation>".
template <class Params, class Forward>
void time_rotation_forward(benchmark::State& state, std::int64_t tokens, Impl impl,
                           Rotation rotation, RotationBuffers& rot, Params params,
                           Forward&& forward) {
  Params rotated = params;
  rotated.q = rot.x_view(rot.q_rot);
  rotated.k = rot.x_view(rot.k_rot);
  if (rotation == Rotation::fused) params.theta = rot.theta_view(rot.theta);
  time_calls(state, tokens, impl, [&] {
    if (rotation == Rotation::separate) {
      rot.rotate(params.q, params.k);
      forward(rotated);
    } else {
      forward(params);
    }
  });
  state.SetLabel(std::string(to_string(impl)) + "/" + to_string(rotation));
}

// Same for forward + backward: step(p, grads) runs the op's forward and backward on params p,
// writing the gradients `grads` (which include dq and dk; dθ is added for the rotated modes).
template <class Params, class Grads, class Step>
void time_rotation_forward_backward(benchmark::State& state, std::int64_t tokens, Impl impl,
                                    Rotation rotation, RotationBuffers& rot, Params params,
                                    Grads grads, Step&& step) {
  Params rotated = params;
  rotated.q = rot.x_view(rot.q_rot);
  rotated.k = rot.x_view(rot.k_rot);
  Grads rotated_grads = grads;
  rotated_grads.dq = rot.x_view(rot.dq_rot);
  rotated_grads.dk = rot.x_view(rot.dk_rot);
  if (rotation == Rotation::fused) {
    params.theta = rot.theta_view(rot.theta);
    grads.dtheta = rot.theta_view(rot.dtheta);
  }
  time_calls(state, tokens, impl, [&] {
    if (rotation == Rotation::separate) {
      rot.rotate(params.q, params.k);
      step(rotated, rotated_grads);
      rot.unrotate(params.q, params.k, grads.dq, grads.dk);
    } else {
      step(params, grads);
    }
  });
  state.SetLabel(std::string(to_string(impl)) + "/" + to_string(rotation));
}

// Arguments (rotation, impl, T) of the rotation benchmarks: every rotation mode side by side for
// each impl, at T ∈ {1024, 4096}.
inline void register_rotation_grid(benchmark::internal::Benchmark* b,
                                   std::initializer_list<Impl> impls) {
  b->ArgNames({"rotation", "impl", "T"});
  for (std::int64_t T : {1024, 4096})
    for (Impl impl : impls)
      for (Rotation r : {Rotation::none, Rotation::fused, Rotation::separate})
        b->Args({static_cast<std::int64_t>(r), static_cast<std::int64_t>(impl), T});
  b->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();
}

// ---- Devices: the same call on the CPU, the emulated GPU and a GPU
// -------------------------------- Copies of host buffers in the memory of a device (for
// Device::cpu the host buffers themselves), for benchmarks that time one op on several devices.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(Device device) : device_(device) {}
  Device device() const { return device_; }
  // A view of `host` (float32, contiguous `shape`) in the device's memory, holding a copy of it.
  TensorView view(const std::vector<float>& host, std::initializer_list<std::int64_t> shape) {
    TensorView v = TensorView::of(host.data(), shape);
    if (device_ == Device::cpu) return v;
    const std::size_t bytes = host.size() * sizeof(float);
    void* data = device_allocate(device_, bytes);
    owned_.emplace_back(data, Free{device_});
    copy_bytes(data, device_, host.data(), Device::cpu, bytes);
    v.data = data;
    v.device = device_;
    return v;
  }
  // The same in `dtype` (bfloat16 or float16: rounded on the host; float32: as view()), in memory
  // of its own on every device.
  TensorView view(const std::vector<float>& host, std::initializer_list<std::int64_t> shape,
                  DType dtype) {
    if (dtype == DType::float32) return view(host, shape);
    std::vector<std::uint16_t> bits(host.size());
    for_blocks(host.size(), [&](std::size_t begin, std::size_t end, std::size_t) {
      for (std::size_t i = begin; i < end; ++i)
        bits[i] = dtype == DType::bfloat16 ? bfloat16::from_float(host[i]).bits
                                           : float16::from_float(host[i]).bits;
    });
    const std::size_t bytes = std::max<std::size_t>(1, bits.size() * sizeof(std::uint16_t));
    void* data = device_allocate(device_, bytes);
    owned_.emplace_back(data, Free{device_});
    copy_bytes(data, device_, bits.data(), Device::cpu, bits.size() * sizeof(std::uint16_t));
    return TensorView::contiguous(data, dtype, shape, device_);
  }
  // Waits for the device's work on the current stream to finish (a copy of one element of `x` to
  // the host syncs the stream; the CPU and the emulated GPU finish before the call returns).
  static void wait_for(const TensorView& x) {
    float element = 0.f;
    if (x.device == Device::cuda)
      copy_bytes(&element, Device::cpu, x.data, x.device, sizeof(float));
    benchmark::DoNotOptimize(element);
  }

 private:
  struct Free {
    Device device;
    void operator()(void* p) const { device_free(device, p); }
  };
  Device device_;
  std::vector<std::unique_ptr<void, Free>> owned_;
};

// Arguments (device, backward, T) of a device benchmark: forward and forward + backward on the
// CPU and the emulated GPU at T = 64 (emulation is ~10³× slower than the CPU kernel), and on a GPU
// when present at T ∈ {1024, 4096, 16384} (with the CPU at the same sizes, in the same run).
inline void register_device_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"device", "backward", "T"});
  const bool gpu = cuda_device_count() > 0;
  for (std::int64_t backward : {0, 1}) {
    for (Device device : {Device::cpu, Device::emulated})
      b->Args({static_cast<std::int64_t>(device), backward, 64});
    if (gpu)
      for (std::int64_t T : {1024, 4096, 16384})
        for (Device device : {Device::cpu, Device::cuda})
          b->Args({static_cast<std::int64_t>(device), backward, T});
  }
  b->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();
}

// fla's benchmark shapes (B, T, H) at K = V = 128 in bfloat16: B = 2, T = 16384, H = 16 (its
// published chunk GLA / Gated DeltaNet figures) and B = 1, T = 8192, H = 96.
struct GpuShape {
  std::int64_t B, T, H;
};
inline std::vector<GpuShape> fla_shapes() {
  return {{2, 16384, 16}, {1, 8192, 96}};
}

// Arguments (device, backward, B, T, H) of a chunk-kernel device benchmark (K = V = 128,
// bfloat16): the CPU and the emulated GPU at B = 1, T = 64, H = 1 (the emulation's cost, not a
// speed), and with a GPU fla's shapes on it. Manual time (time_device_calls).
inline void register_chunk_device_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"device", "backward", "B", "T", "H"});
  for (std::int64_t backward : {0, 1}) {
    for (Device device : {Device::cpu, Device::emulated})
      b->Args({static_cast<std::int64_t>(device), backward, 1, 64, 1});
    if (cuda_device_count() > 0)
      for (const GpuShape& s : fla_shapes())
        b->Args({static_cast<std::int64_t>(Device::cuda), backward, s.B, s.T, s.H});
  }
  b->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseManualTime();
}

// The timed loop of the device benchmarks: each iteration's GPU time from CUDA events
// (cuda::Timer) on Device::cuda, its wall time elsewhere (the CPU and the emulated GPU finish
// before the call returns); tokens/s as items_per_second.
template <class F>
void time_device_calls(benchmark::State& state, Device device, std::int64_t tokens, F&& call) {
  for (auto _ : state) {
    if (device == Device::cuda) {
      cuda::Timer timer;
      timer.start();
      call();
      state.SetIterationTime(timer.stop() / 1e3);
    } else {
      const auto begin = std::chrono::steady_clock::now();
      call();
      state.SetIterationTime(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}

}  // namespace phasor::bench
