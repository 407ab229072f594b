// FoX decoding on the GPU (cuda/forgetting_attn/forgetting_attn.h): one step of
// ForgettingAttnCache, written once for nvcc and the emulated GPU. It computes what the CPU
// cache (src/forgetting_attn/recurrent.cpp) computes, in the compute type C of q (double for
// float64 q, else float): for the new token t of each batch row and query head hq,
//   decay_p ← decay_p + g_t          (the gate sum Σ_{s ∈ (p, t]} g_s of cached token p, float64)
//   ℓ_p = scale q_t·k_p + decay_p [− (t − p)(a_t + b_p)],  decay_t = 0
//   o_t = Σ_p softmax_p(ℓ_p) v_p
// over the visible tokens p (the window, or every token since the start), t itself included, with
// q and k rotated by θ_t on load ((R1)). The bias is formed in float64 with the decay before the
// one rounding to C, as on the CPU; a −inf decay (a zero gate) masks its token for good.
//
// Three launches, no host sync:
//  1. append_kernel, one block per (batch row, key head): the token's rotated key, its value and
//     its key slope b_t go to slot slot_of(t) (the cache is slot-major; the host has grown it).
//  2. attend_kernel, one block per (batch row, query head, split of kSplit visible tokens): the
//     split-key (flash-decoding) pass. Each of the 4 warps walks every 4th token of the split: the
//     lanes share the dot product q·k_p over K (a butterfly, the same order in every run), lane 0
//     updates decay_p in place (each (slot, query head) has one owner block), and the warp keeps
//     an online softmax (running max m, sum l, and the V accumulators in shared memory, columns
//     by lane). The warps merge in warp order; a single split writes o directly, several write
//     (m, l, acc[V]) partials to a workspace.
//  3. combine_kernel (several splits only), one block per (batch row, query head): the splits'
//     partials merged in split order, o = Σ_s e^{m_s − M} acc_s / Σ_s e^{m_s − M} l_s.
// Every reduction has a fixed order: the same bits in every run and under every emulator
// schedule. The split size is a constant, so the results do not depend on the GPU either.
#include <algorithm>
#include <limits>
#include <string>

#include "common/recurrent.h"
#include "common/staging.h"
#include "forgetting_attn/forgetting_attn.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::fox {
namespace {

using ::phasor::detail::fox::DecodeStep;

constexpr int kWarps = 4;  // warps of an attend block
constexpr int kThreads = kWarps * simt::kWarpSize;
constexpr std::int64_t kSplit = 128;        // visible tokens per attend block
constexpr std::int64_t kMaxSplits = 65535;  // gridDim.y
// attend_kernel's shared memory (q, the warps' accumulators): within every architecture's
// default 48 KiB, so no launch needs the opt-in.
constexpr std::size_t kMaxSharedBytes = 48 * 1024;

// The key row of head h of batch row b in the token's slot: k_t rotated by θ_t when given.
template <class C>
PHASOR_GLOBAL void append_kernel(DecodeStep step) {
  const std::int64_t b = blockIdx.x / step.H, h = blockIdx.x % step.H;
  const std::int64_t slot = step.slot_of(step.position);
  const std::int64_t K = step.K;
  if (!step.theta.defined()) {
    for (std::int64_t a = threadIdx.x; a < K; a += blockDim.x)
      simt::store(step.keys, simt::load<C>(step.k, b, 0, h, a), slot, b, h, a);
  } else {
    for (std::int64_t i = threadIdx.x; i < K / 2; i += blockDim.x) {
      C c, s;
      angle_of(step.theta, b, 0, h, i, c, s);
      const std::int64_t ia = pair_a(step.rotary_layout, K, i),
                         ib = pair_b(step.rotary_layout, K, i);
      const C xa = simt::load<C>(step.k, b, 0, h, ia), xb = simt::load<C>(step.k, b, 0, h, ib);
      simt::store(step.keys, xa * c - xb * s, slot, b, h, ia);  // (R1)
      simt::store(step.keys, xa * s + xb * c, slot, b, h, ib);
    }
  }
  for (std::int64_t j = threadIdx.x; j < step.V; j += blockDim.x)
    simt::store(step.values, simt::load<C>(step.v, b, 0, h, j), slot, b, h, j);
  if (threadIdx.x == 0)
    simt::store(step.key_slopes,
                step.slope_k.defined() ? simt::load<double>(step.slope_k, b, 0, h) : 0.0, slot, b,
                h);
}

// The online softmax of one warp (or of the merged warps of a block): running max m and sum l;
// the accumulators Σ e^{ℓ − m} v live in shared memory.
template <class C>
struct Softmax {
  C max = -std::numeric_limits<C>::infinity();
  C sum = 0;
};

// Dynamic shared memory of attend_kernel: q[K] (rotated, times scale), acc[kWarps][V], and the
// warps' (m, l) [kWarps][2].
std::size_t attend_shared_bytes(const DecodeStep& step, std::size_t element) {
  return static_cast<std::size_t>(step.K + kWarps * step.V + 2 * kWarps) * element;
}

// Partials of the splits: [B·HQ][splits] maxima and sums, [B·HQ][splits][V] accumulators.
template <class C>
struct Partials {
  simt::Span<C> max, sum, acc;
  std::int64_t splits = 1;
};

template <class C>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    attend_kernel(DecodeStep step, TensorView o, Partials<C> partials) {
  const std::int64_t row = blockIdx.x, b = row / step.HQ, hq = row % step.HQ;
  const std::int64_t h = hq / step.group(), split = blockIdx.y;
  const int lane = static_cast<int>(threadIdx.x % simt::kWarpSize),
            warp = static_cast<int>(threadIdx.x / simt::kWarpSize);
  const std::int64_t K = step.K, V = step.V;
  const std::size_t e = sizeof(C);
  PHASOR_DYNAMIC_SHARED_AT(C, q_s, 0, K);
  PHASOR_DYNAMIC_SHARED_AT(C, acc_s, K * e, kWarps * V);
  PHASOR_DYNAMIC_SHARED_AT(C, stats_s, (K + kWarps * V) * e, 2 * kWarps);

  // q_t of head hq, rotated by its key head's θ_t, times scale (the CPU's q_scaled).
  const C scale = static_cast<C>(step.scale);
  if (!step.theta.defined()) {
    for (std::int64_t a = threadIdx.x; a < K; a += kThreads)
      q_s[a] = simt::load<C>(step.q, b, 0, hq, a) * scale;
  } else {
    for (std::int64_t i = threadIdx.x; i < K / 2; i += kThreads) {
      C c, s;
      angle_of(step.theta, b, 0, h, i, c, s);
      const std::int64_t ia = pair_a(step.rotary_layout, K, i),
                         ib = pair_b(step.rotary_layout, K, i);
      const C xa = simt::load<C>(step.q, b, 0, hq, ia), xb = simt::load<C>(step.q, b, 0, hq, ib);
      q_s[ia] = (xa * c - xb * s) * scale;  // (R1)
      q_s[ib] = (xa * s + xb * c) * scale;
    }
  }
  for (std::int64_t j = lane; j < V; j += simt::kWarpSize) acc_s[warp * V + j] = C(0);
  simt::syncthreads();

  const double gate = simt::load<double>(step.g, b, 0, hq);
  const double slope_q =
      step.biased && step.slope_q.defined() ? simt::load<double>(step.slope_q, b, 0, hq) : 0.0;
  const std::int64_t first = step.position + 1 - step.visible();
  const std::int64_t begin = first + split * kSplit,
                     end = std::min(step.position + 1, begin + kSplit);
  Softmax<C> mine;
  for (std::int64_t p = begin + warp; p < end; p += kWarps) {
    const std::int64_t slot = step.slot_of(p);
    C dot = 0;
    for (std::int64_t a = lane; a < K; a += simt::kWarpSize) {
      const C q_a = q_s[a];
      dot += q_a * simt::load<C>(step.keys, slot, b, h, a);
    }
    dot = lane_sum(dot);
    // decay_p: the new token starts at 0; every older one adds g_t (lane 0 owns the element and
    // hands the value to the warp).
    double decay = 0.0;
    if (lane == 0) {
      decay = p == step.position ? 0.0 : simt::load<double>(step.decay, slot, b, hq) + gate;
      simt::store(step.decay, decay, slot, b, hq);
    }
    decay = simt::shfl_sync(simt::kFullMask, decay, 0);
    double bias = decay;
    if (step.biased)
      bias += ::phasor::detail::fox::slope_bias(step.position, p, slope_q,
                                                simt::load<double>(step.key_slopes, slot, b, h));
    const C logit = dot + static_cast<C>(bias);
    if (logit == -std::numeric_limits<C>::infinity()) continue;  // masked: weight exactly 0
    const C max = simt::fmax(mine.max, logit);
    const C rescale = simt::exp(mine.max - max), weight = simt::exp(logit - max);
    mine.max = max;
    mine.sum = mine.sum * rescale + weight;
    for (std::int64_t j = lane; j < V; j += simt::kWarpSize) {
      const C acc = acc_s[warp * V + j];
      acc_s[warp * V + j] = acc * rescale + weight * simt::load<C>(step.values, slot, b, h, j);
    }
  }
  if (lane == 0) {
    stats_s[2 * warp] = mine.max;
    stats_s[2 * warp + 1] = mine.sum;
  }
  simt::syncthreads();

  // The warps merged in warp order: M = max m_w, L = Σ e^{m_w − M} l_w, acc = Σ e^{m_w − M} acc_w.
  // Every thread computes M and L the same way; warps that saw only masked tokens (m = −inf)
  // contribute nothing.
  C block_max = -std::numeric_limits<C>::infinity();
  for (int w = 0; w < kWarps; ++w) {
    const C m = stats_s[2 * w];
    block_max = simt::fmax(block_max, m);
  }
  C block_sum = 0;
  C factor[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    const C m = stats_s[2 * w], l = stats_s[2 * w + 1];
    factor[w] = m == -std::numeric_limits<C>::infinity() ? C(0) : simt::exp(m - block_max);
    block_sum += factor[w] * l;
  }
  const bool direct = partials.splits == 1;
  for (std::int64_t j = threadIdx.x; j < V; j += kThreads) {
    C acc = 0;
    for (int w = 0; w < kWarps; ++w) {
      const C part = acc_s[w * V + j];
      acc += factor[w] * part;
    }
    if (direct)
      simt::store(o, acc / block_sum, b, 0, hq, j);  // the token itself is visible: block_sum > 0
    else
      partials.acc[(row * partials.splits + split) * V + j] = acc;
  }
  if (!direct && threadIdx.x == 0) {
    partials.max[row * partials.splits + split] = block_max;
    partials.sum[row * partials.splits + split] = block_sum;
  }
}

// o of one (batch row, query head) from the splits' partials, merged in split order.
template <class C>
PHASOR_GLOBAL void combine_kernel(DecodeStep step, TensorView o, Partials<C> partials) {
  const std::int64_t row = blockIdx.x, b = row / step.HQ, hq = row % step.HQ;
  const std::int64_t S = partials.splits, V = step.V;
  C max = -std::numeric_limits<C>::infinity();
  for (std::int64_t s = 0; s < S; ++s) max = simt::fmax(max, partials.max[row * S + s]);
  C sum = 0;
  for (std::int64_t s = 0; s < S; ++s) {
    const C m = partials.max[row * S + s];
    if (m != -std::numeric_limits<C>::infinity())
      sum += simt::exp(m - max) * partials.sum[row * S + s];
  }
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    C acc = 0;
    for (std::int64_t s = 0; s < S; ++s) {
      const C m = partials.max[row * S + s];
      if (m != -std::numeric_limits<C>::infinity())
        acc += simt::exp(m - max) * partials.acc[(row * S + s) * V + j];
    }
    simt::store(o, acc / sum, b, 0, hq, j);
  }
}

}  // namespace

void check_decode_step(const DecodeStep& step) {
  const std::string op = "ForgettingAttnCache::step on the GPU: ";
  const std::size_t element = step.keys.dtype == DType::float64 ? sizeof(double) : sizeof(float);
  if (attend_shared_bytes(step, element) > kMaxSharedBytes)
    throw Error(op + "argument 'v': expected a value dimension V ≤ " +
                std::to_string((kMaxSharedBytes / element - step.K - 2 * kWarps) / kWarps) +
                " (with K = " + std::to_string(step.K) + ", " +
                (element == sizeof(double) ? "float64" : "float32") +
                " compute), got V = " + std::to_string(step.V));
  if (ceil_div(step.visible(), kSplit) > kMaxSplits)
    throw Error(op + "the cache: expected at most " + std::to_string(kMaxSplits * kSplit) +
                " visible tokens (use a window), got " + std::to_string(step.visible()));
}

void decode_step(const DecodeStep& problem, const TensorView& o) {
  check_decode_step(problem);
  if (problem.B == 0 || problem.HQ == 0 || problem.V == 0) return;
  const std::int64_t splits = ceil_div(problem.visible(), kSplit);
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  DecodeStep step = problem;
  for (TensorView* input :
       {&step.q, &step.k, &step.v, &step.g, &step.theta, &step.slope_q, &step.slope_k})
    *input = stage(*input, {o});
  const auto run = [&](auto zero) {
    using C = decltype(zero);
    PHASOR_LAUNCH((append_kernel<C>), simt::Dim3(static_cast<unsigned>(step.B * step.H)),
                  simt::Dim3(kThreads), 0, stream, step);
    Partials<C> partials;
    partials.splits = splits;
    const std::int64_t rows = step.B * step.HQ;
    const std::int64_t stats = splits > 1 ? rows * splits : 0, accs = stats * step.V;
    simt::Workspace workspace(static_cast<std::size_t>(2 * stats + accs) * sizeof(C), stream);
    if (splits > 1) {
      const simt::Span<C> all = workspace.span<C>(2 * stats + accs);
      partials.max = {all.data, stats};
      partials.sum = {all.data + stats, stats};
      partials.acc = {all.data + 2 * stats, accs};
    }
    PHASOR_LAUNCH(
        (attend_kernel<C>), simt::Dim3(static_cast<unsigned>(rows), static_cast<unsigned>(splits)),
        simt::Dim3(kThreads), attend_shared_bytes(step, sizeof(C)), stream, step, o, partials);
    if (splits > 1)
      PHASOR_LAUNCH((combine_kernel<C>), simt::Dim3(static_cast<unsigned>(rows)),
                    simt::Dim3(kThreads), 0, stream, step, o, partials);
  };
  if (step.keys.dtype == DType::float64)
    run(double{});
  else
    run(float{});
}

}  // namespace phasor::PHASOR_BACKEND::fox
