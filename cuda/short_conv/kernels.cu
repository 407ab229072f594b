// The short causal convolution on the GPU (cuda/short_conv/short_conv.h), written once for nvcc
// and the emulated GPU. It computes what src/short_conv/kernels.cpp computes (short_conv.h):
//   z_t = bias + Σ_{w<W} weight_w · xe_{t−(W−1)+w},   y_t = act(z_t)
// over the extended input xe = [cache (W−1 inputs, or zeros); x of the sequence], in the compute
// type C of x (double for float64 x, else float).
//
// Mapping: a thread owns one channel d (threadIdx.x: 32 consecutive channels, coalesced since x is
// channels-last) and a run of kRun consecutive tokens of the flattened token axis g = b·T + t
// (threadIdx.y: kRuns runs per block; blockIdx.x: groups of runs; blockIdx.y: groups of channels).
// A run may cross sequence boundaries: it is cut into segments, one per sequence, each found by a
// binary search in cu_seqlens (Sequences::sequence_of), and the causal window restarts at each
// segment's sequence start, reading the positions before it from that sequence's initial_cache
// (or zeros) — never from the previous sequence's tokens.
//
// Widths W ≤ kMaxW = 4 (fla's default is 4) keep the window of the last W inputs, the weights and,
// in the backward, the window of the next W gradients in registers, shifted once per token: one
// load of x (and dy) per token. Wider kernels take a general path that reads each tap from global
// memory (through L1) and, in the backward, passes dz through a workspace.
//
// Backward (z recomputed): dz_t = dy_t · act'(z_t), with silu'(z) = σ(z)(1 + z(1 − σ(z))), and
//   dxe_j = Σ_{w<W} weight_w · dz_{j−w} + [j ≥ L] d_final_cache_{j−L}      (xe index j = t + W−1),
// dx_t = dxe_{t+W−1}, dinitial_cache_i = dxe_i (i < W−1), dweight_w = Σ_t dz_t · xe_{t+w−(W−1)},
// dbias = Σ_t dz_t. A thread computes dz on its run plus W−1 tokens of look-ahead (the gradients
// its outputs need), so no thread waits for another. dweight and dbias: per-block partials (the
// block's runs added in run order through shared memory) in a workspace, then a second kernel adds
// them in block order (in double) — deterministic, no atomics.
//
// final_cache (the last W−1 inputs of the extended sequence, keeping older cached inputs for a
// sequence shorter than W−1) and dinitial_cache of empty sequences come from a small kernel over
// (sequence, channel) that runs after the main one: final_cache may alias initial_cache (decoding
// updates the cache in place). Any other overlap of an input with an output (y = x in place, dx =
// dy) is handled by first copying the input to a workspace.
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>

#include "common/staging.h"
#include "short_conv/short_conv.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::short_conv {
namespace {

using ::phasor::detail::Sequence;
using ::phasor::detail::short_conv::Problem;

constexpr int kChannels = 32;                      // threadIdx.x: channels d
constexpr int kRuns = 8;                           // threadIdx.y: runs of tokens per block
constexpr int kRun = 32;                           // consecutive tokens per thread
constexpr int kMaxW = 4;                           // the widest kernel of the register path
constexpr std::int64_t kMaxChannelGroups = 65535;  // gridDim.y

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// ---- device helpers
// -------------------------------------------------------------------------------

struct Segment {
  std::int64_t n;       // sequence
  Sequence s;           // its batch row, start and length
  std::int64_t qa, qb;  // positions [qa, qb) of the sequence in this run
  std::int64_t end;     // the flattened token after the segment
};
// The segment of the run [g, g1) that starts at flattened token g.
PHASOR_DEVICE Segment segment_at(const Problem& p, std::int64_t g, std::int64_t g1) {
  Segment seg;
  seg.n = p.sequences.sequence_of(g);
  seg.s = p.sequences[seg.n];
  const std::int64_t first = seg.s.batch * p.T + seg.s.start;  // flattened start of the sequence
  seg.qa = g - first;
  seg.end = std::min(g1, first + seg.s.length);
  seg.qb = seg.end - first;
  return seg;
}

PHASOR_DEVICE std::int64_t channel() {
  return static_cast<std::int64_t>(blockIdx.y) * kChannels + threadIdx.x;
}
PHASOR_DEVICE std::int64_t run() {
  return static_cast<std::int64_t>(blockIdx.x) * kRuns + threadIdx.y;
}

// xe at position q ≥ −(W−1) of the sequence: x for q ≥ 0, else the cache (zeros without one).
template <class C>
PHASOR_DEVICE C input_at(const Problem& p, const Segment& seg, std::int64_t d, std::int64_t q) {
  if (q >= 0) return simt::load<C>(p.x, seg.s.batch, seg.s.start + q, d);
  if (!p.initial_cache.defined()) return C(0);
  return simt::load<C>(p.initial_cache, seg.n, d, p.W - 1 + q);
}

template <class C>
PHASOR_DEVICE C bias_of(const Problem& p, std::int64_t d) {
  return p.bias.defined() ? simt::load<C>(p.bias, d) : C(0);
}

// σ(z) = 1 / (1 + e^−z): exactly 0 (never NaN) when e^−z overflows, as the CPU kernel.
template <class C>
PHASOR_DEVICE C sigmoid(C z) {
  return C(1) / (C(1) + simt::exp(-z));
}
template <class C>
PHASOR_DEVICE C activate(const Problem& p, C z) {
  return p.silu ? z * sigmoid(z) : z;
}
// dz = dy · act'(z).
template <class C>
PHASOR_DEVICE C activation_grad(const Problem& p, C z, C dy) {
  if (!p.silu) return dy;
  const C sg = sigmoid(z);
  return dy * (sg * (C(1) + z * (C(1) - sg)));
}

// z at position q (general path): every tap read from global memory, in w order.
template <class C>
PHASOR_DEVICE C pre_activation(const Problem& p, const Segment& seg, std::int64_t d, std::int64_t q,
                               C bias) {
  C z = bias;
  for (std::int64_t w = 0; w < p.W; ++w)
    z += input_at<C>(p, seg, d, q - (p.W - 1) + w) * simt::load<C>(p.weight, d, w);
  return z;
}

// The register path's weights, twice with static indices: by window slot (slot j holds tap
// j − (kMaxW − W) of the input window, for j ≥ kMaxW − W) and by tap (w < W).
template <class C>
struct Weights {
  C by_slot[kMaxW];
  C by_tap[kMaxW];
};
template <class C>
PHASOR_DEVICE Weights<C> load_weights(const Problem& p, std::int64_t d) {
  Weights<C> r;
  const int W = static_cast<int>(p.W);
  PHASOR_UNROLL
  for (int j = 0; j < kMaxW; ++j) {
    r.by_slot[j] = j >= kMaxW - W ? simt::load<C>(p.weight, d, j - (kMaxW - W)) : C(0);
    r.by_tap[j] = j < W ? simt::load<C>(p.weight, d, j) : C(0);
  }
  return r;
}

// The input window before position qa: slot j holds xe(qa − kMaxW + j), for the slots that the
// next shift keeps in use (j > kMaxW − W); the others are never read.
template <class C>
PHASOR_DEVICE void fill_window(const Problem& p, const Segment& seg, std::int64_t d,
                               C (&window)[kMaxW]) {
  const int W = static_cast<int>(p.W);
  PHASOR_UNROLL
  for (int j = 0; j < kMaxW; ++j)
    window[j] = j > kMaxW - W ? input_at<C>(p, seg, d, seg.qa - kMaxW + j) : C(0);
}
// Shifts `value` in as the newest element of a window.
template <class C>
PHASOR_DEVICE void shift_in(C (&window)[kMaxW], C value) {
  PHASOR_UNROLL
  for (int j = 0; j < kMaxW - 1; ++j) window[j] = window[j + 1];
  window[kMaxW - 1] = value;
}
// z over the window (its newest slot: the current token), taps in w order as the CPU kernel.
template <class C>
PHASOR_DEVICE C window_pre_activation(C z, const Weights<C>& weights, const C (&window)[kMaxW],
                                      int W) {
  PHASOR_UNROLL
  for (int j = 0; j < kMaxW; ++j)
    if (j >= kMaxW - W) z += window[j] * weights.by_slot[j];
  return z;
}

// ---- forward
// --------------------------------------------------------------------------------------

// y_t = act(z_t) for the tokens of this thread's run. kWindow: the register path (W ≤ kMaxW);
// otherwise the general path.
template <class C, bool kWindow>
PHASOR_GLOBAL void forward_kernel(Problem p, TensorView y) {
  const std::int64_t d = channel(), tokens = p.B * p.T;
  const std::int64_t g0 = run() * kRun, g1 = std::min(g0 + kRun, tokens);
  if (d >= p.D || g0 >= tokens) return;
  const C bias = bias_of<C>(p, d);
  [[maybe_unused]] const int W = static_cast<int>(p.W);
  [[maybe_unused]] Weights<C> weights{};
  if constexpr (kWindow) weights = load_weights<C>(p, d);
  for (std::int64_t g = g0; g < g1;) {
    const Segment seg = segment_at(p, g, g1);
    if constexpr (kWindow) {
      C window[kMaxW];
      fill_window(p, seg, d, window);
      for (std::int64_t q = seg.qa; q < seg.qb; ++q) {
        shift_in(window, simt::load<C>(p.x, seg.s.batch, seg.s.start + q, d));
        const C z = window_pre_activation(bias, weights, window, W);
        simt::store(y, activate(p, z), seg.s.batch, seg.s.start + q, d);
      }
    } else {
      for (std::int64_t q = seg.qa; q < seg.qb; ++q)
        simt::store(y, activate(p, pre_activation(p, seg, d, q, bias)), seg.s.batch,
                    seg.s.start + q, d);
    }
    g = seg.end;
  }
}

// final_cache[n, d, i] = xe_{L+i}: the cache for L + i < W − 1, else x at position L + i − (W − 1).
// In increasing i, element i is written after element L + i ≥ i was read, so final_cache may be
// initial_cache itself.
template <class C>
PHASOR_GLOBAL void final_cache_kernel(Problem p, TensorView final_cache) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.num_sequences() * p.D) return;
  const std::int64_t n = e / p.D, d = e % p.D;
  const Segment seg{n, p.sequences[n], 0, 0, 0};
  for (std::int64_t i = 0; i < p.W - 1; ++i)
    simt::store(final_cache, input_at<C>(p, seg, d, seg.s.length + i - (p.W - 1)), n, d, i);
}

// ---- backward
// -------------------------------------------------------------------------------------

// Register path (W ≤ kMaxW). For each segment of its run, the thread walks u over its positions
// plus W − 1 of look-ahead: dz_u (0 past the sequence's end) enters the gradient window, and the
// output at q = u − (W − 1) is complete — dx for q ≥ qa, and, when the segment starts its sequence,
// dinitial_cache for −(W−1) ≤ q < 0. dweight / dbias accumulate over the run's own positions; the
// block's kRuns partials are added in run order and written to parts[blockIdx.x][w][d] (w = W:
// dbias) when they are requested (parts.size > 0).
template <class C>
PHASOR_GLOBAL void backward_kernel(Problem p, TensorView dy, TensorView d_final_cache,
                                   TensorView dx, TensorView dinitial_cache, simt::Span<C> parts) {
  PHASOR_SHARED_ARRAY(C, sums, (kMaxW + 1) * kRuns * kChannels);
  const std::int64_t d = channel(), tokens = p.B * p.T;
  const std::int64_t g0 = run() * kRun, g1 = std::min(g0 + kRun, tokens);
  const int W = static_cast<int>(p.W);
  const bool active = d < p.D;
  C acc[kMaxW + 1];  // dweight by window slot, then dbias
  PHASOR_UNROLL
  for (int j = 0; j <= kMaxW; ++j) acc[j] = C(0);
  if (active) {
    const C bias = bias_of<C>(p, d);
    const Weights<C> weights = load_weights<C>(p, d);
    for (std::int64_t g = g0; g < g1;) {
      const Segment seg = segment_at(p, g, g1);
      const std::int64_t L = seg.s.length;
      C window[kMaxW], grads[kMaxW];  // grads[j] = dz at u − (kMaxW − 1) + j
      fill_window(p, seg, d, window);
      PHASOR_UNROLL
      for (int j = 0; j < kMaxW; ++j) grads[j] = C(0);
      const std::int64_t first_output = seg.qa == 0 ? -(p.W - 1) : seg.qa;
      for (std::int64_t u = seg.qa; u < seg.qb + p.W - 1; ++u) {
        C dz = C(0);
        if (u < L) {
          shift_in(window, simt::load<C>(p.x, seg.s.batch, seg.s.start + u, d));
          const C z = window_pre_activation(bias, weights, window, W);
          dz = activation_grad(p, z, simt::load<C>(dy, seg.s.batch, seg.s.start + u, d));
          if (u < seg.qb) {
            PHASOR_UNROLL
            for (int j = 0; j < kMaxW; ++j)
              if (j >= kMaxW - W) acc[j] += dz * window[j];
            acc[kMaxW] += dz;
          }
        }
        shift_in(grads, dz);
        const std::int64_t q = u - (p.W - 1);
        if (q < first_output) continue;
        // dxe_{q+W−1} = Σ_w weight_w dz_{u−w}, taps in w order.
        C v = C(0);
        PHASOR_UNROLL
        for (int w = 0; w < kMaxW; ++w)
          if (w < W) v += weights.by_tap[w] * grads[kMaxW - 1 - w];
        if (u >= L && d_final_cache.defined()) v += simt::load<C>(d_final_cache, seg.n, d, u - L);
        if (q >= 0) {
          if (dx.defined()) simt::store(dx, v, seg.s.batch, seg.s.start + q, d);
        } else if (dinitial_cache.defined()) {
          simt::store(dinitial_cache, v, seg.n, d, u);
        }
      }
      g = seg.end;
    }
  }
  if (parts.size == 0) return;  // the same for the whole grid
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  PHASOR_UNROLL
  for (int j = 0; j <= kMaxW; ++j) sums[(j * kRuns + r) * kChannels + lane] = acc[j];
  simt::syncthreads();
  if (r != 0 || !active) return;
  for (int j = 0; j <= kMaxW; ++j) {
    if (j < kMaxW - W) continue;  // slots of no tap
    C sum = C(0);
    for (int k = 0; k < kRuns; ++k) {
      const C v = sums[(j * kRuns + k) * kChannels + lane];
      sum += v;
    }
    const std::int64_t slot = j == kMaxW ? p.W : j - (kMaxW - W);
    parts[(static_cast<std::int64_t>(blockIdx.x) * (p.W + 1) + slot) * p.D + d] = sum;
  }
}

// General path, pass 1: dz_t into dz[g · D + d] for the tokens of this thread's run.
template <class C>
PHASOR_GLOBAL void dz_kernel(Problem p, TensorView dy, simt::Span<C> dz) {
  const std::int64_t d = channel(), tokens = p.B * p.T;
  const std::int64_t g0 = run() * kRun, g1 = std::min(g0 + kRun, tokens);
  if (d >= p.D || g0 >= tokens) return;
  const C bias = bias_of<C>(p, d);
  for (std::int64_t g = g0; g < g1;) {
    const Segment seg = segment_at(p, g, g1);
    for (std::int64_t q = seg.qa; q < seg.qb; ++q)
      dz[(g - seg.qa + q) * p.D + d] =
          activation_grad(p, pre_activation(p, seg, d, q, bias),
                          simt::load<C>(dy, seg.s.batch, seg.s.start + q, d));
    g = seg.end;
  }
}

// General path, pass 2: dx / dinitial_cache from dz (the outputs of this thread's run, as the
// register path), and the run's partials of dweight and dbias into parts[run][w][d].
template <class C>
PHASOR_GLOBAL void general_backward_kernel(Problem p, TensorView d_final_cache, TensorView dx,
                                           TensorView dinitial_cache, simt::Span<C> dz,
                                           simt::Span<C> parts) {
  const std::int64_t d = channel(), tokens = p.B * p.T;
  const std::int64_t g0 = run() * kRun, g1 = std::min(g0 + kRun, tokens);
  if (d >= p.D || g0 >= tokens) return;
  const std::int64_t W = p.W;
  if (dx.defined() || dinitial_cache.defined()) {
    for (std::int64_t g = g0; g < g1;) {
      const Segment seg = segment_at(p, g, g1);
      const std::int64_t L = seg.s.length, first = g - seg.qa;  // flattened start
      for (std::int64_t q = seg.qa == 0 ? -(W - 1) : seg.qa; q < seg.qb; ++q) {
        const std::int64_t u = q + W - 1;  // xe index
        C v = C(0);
        for (std::int64_t w = 0; w < W; ++w)
          if (u - w >= 0 && u - w < L)
            v += simt::load<C>(p.weight, d, w) * dz[(first + u - w) * p.D + d];
        if (u >= L && d_final_cache.defined()) v += simt::load<C>(d_final_cache, seg.n, d, u - L);
        if (q >= 0) {
          if (dx.defined()) simt::store(dx, v, seg.s.batch, seg.s.start + q, d);
        } else if (dinitial_cache.defined()) {
          simt::store(dinitial_cache, v, seg.n, d, u);
        }
      }
      g = seg.end;
    }
  }
  if (parts.size == 0) return;
  for (std::int64_t slot = 0; slot <= W; ++slot) {  // slot W: dbias
    C acc = C(0);
    for (std::int64_t g = g0; g < g1;) {
      const Segment seg = segment_at(p, g, g1);
      const std::int64_t first = g - seg.qa;
      for (std::int64_t q = seg.qa; q < seg.qb; ++q) {
        const C grad = dz[(first + q) * p.D + d];
        acc += slot == W ? grad : grad * input_at<C>(p, seg, d, q - (W - 1) + slot);
      }
      g = seg.end;
    }
    parts[(run() * (W + 1) + slot) * p.D + d] = acc;
  }
}

// dweight[d, w] and dbias[d]: the `count` partials added in order, in double.
template <class C>
PHASOR_GLOBAL void params_kernel(Problem p, simt::Span<C> parts, std::int64_t count,
                                 TensorView dweight, TensorView dbias) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= (p.W + 1) * p.D) return;
  const std::int64_t slot = e / p.D, d = e % p.D;
  double sum = 0.0;
  for (std::int64_t k = 0; k < count; ++k)
    sum += static_cast<double>(parts[(k * (p.W + 1) + slot) * p.D + d]);
  if (slot < p.W) {
    if (dweight.defined()) simt::store(dweight, static_cast<C>(sum), d, slot);
  } else if (dbias.defined()) {
    simt::store(dbias, static_cast<C>(sum), d);
  }
}

// dinitial_cache of the empty sequences: dxe_i = d_final_cache_i (or 0); the other sequences'
// come from the backward kernels.
template <class C>
PHASOR_GLOBAL void empty_dcache_kernel(Problem p, TensorView d_final_cache,
                                       TensorView dinitial_cache) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.num_sequences() * p.D) return;
  const std::int64_t n = e / p.D, d = e % p.D;
  if (p.sequences[n].length > 0) return;
  for (std::int64_t i = 0; i < p.W - 1; ++i)
    simt::store(dinitial_cache,
                d_final_cache.defined() ? simt::load<C>(d_final_cache, n, d, i) : C(0), n, d, i);
}

std::int64_t channel_groups(const Problem& p) {
  const std::int64_t groups = ceil_div(p.D, kChannels);
  if (groups > kMaxChannelGroups)
    throw Error("causal_conv1d on the GPU: argument 'x': expected at most " +
                std::to_string(kMaxChannelGroups * kChannels) +
                " channels D, got D = " + std::to_string(p.D));
  return groups;
}

}  // namespace

// ---- entry points
// ---------------------------------------------------------------------------------

void kernel_forward(const Problem& problem, const TensorView& y, const TensorView& final_cache) {
  const cuda::Stream stream = cuda::current_stream();
  if (problem.D == 0) return;
  const std::int64_t groups = channel_groups(problem);
  Staging stage(stream);
  Problem p = problem;
  // final_cache may alias initial_cache exactly (final_cache_kernel runs last and reads each
  // element before it overwrites it); any other overlap is staged.
  const bool cache_in_place = final_cache.defined() && p.initial_cache.defined() &&
                              final_cache.data == p.initial_cache.data &&
                              final_cache.dtype == p.initial_cache.dtype &&
                              final_cache.strides == p.initial_cache.strides;
  p.x = stage(p.x, {y, final_cache});
  p.weight = stage(p.weight, {y, final_cache});
  p.bias = stage(p.bias, {y, final_cache});
  p.initial_cache = stage(p.initial_cache, {y, cache_in_place ? TensorView{} : final_cache});
  const std::int64_t tokens = p.B * p.T;
  if (tokens > 0) {
    const std::int64_t blocks = ceil_div(ceil_div(tokens, kRun), kRuns);
    const simt::Dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(groups));
    const simt::Dim3 block(kChannels, kRuns);
    const bool window = p.W <= kMaxW;
    if (p.x.dtype == DType::float64) {
      if (window)
        PHASOR_LAUNCH((forward_kernel<double, true>), grid, block, 0, stream, p, y);
      else
        PHASOR_LAUNCH((forward_kernel<double, false>), grid, block, 0, stream, p, y);
    } else {
      if (window)
        PHASOR_LAUNCH((forward_kernel<float, true>), grid, block, 0, stream, p, y);
      else
        PHASOR_LAUNCH((forward_kernel<float, false>), grid, block, 0, stream, p, y);
    }
  }
  const std::int64_t items = p.num_sequences() * p.D;
  if (final_cache.defined() && p.W > 1 && items > 0) {
    constexpr int kThreads = 128;
    const simt::Dim3 grid(static_cast<unsigned>(ceil_div(items, kThreads)));
    if (p.x.dtype == DType::float64)
      PHASOR_LAUNCH((final_cache_kernel<double>), grid, simt::Dim3(kThreads), 0, stream, p,
                    final_cache);
    else
      PHASOR_LAUNCH((final_cache_kernel<float>), grid, simt::Dim3(kThreads), 0, stream, p,
                    final_cache);
  }
}

namespace {
template <class C>
void backward(const Problem& p, const TensorView& dy, const TensorView& d_final_cache,
              const ShortConvGrads& grads, std::int64_t groups, cuda::Stream stream) {
  const std::int64_t tokens = p.B * p.T, runs = ceil_div(tokens, kRun);
  const std::int64_t blocks = ceil_div(runs, kRuns);
  const bool want_params = grads.dweight.defined() || grads.dbias.defined();
  const bool window = p.W <= kMaxW;
  // Partials of dweight and dbias: per block (register path) or per run (general path), each
  // (W + 1) · D values of C. The general path also keeps dz: B · T · D values of C.
  const std::int64_t part_count = want_params ? (window ? blocks : runs) : 0;
  const std::int64_t part_size = part_count * (p.W + 1) * p.D;
  const std::int64_t dz_size = window ? 0 : tokens * p.D;
  simt::Workspace part_buffer(static_cast<std::size_t>(part_size) * sizeof(C), stream);
  simt::Workspace dz_buffer(static_cast<std::size_t>(dz_size) * sizeof(C), stream);
  const simt::Span<C> parts = part_buffer.span<C>(part_size);
  const simt::Span<C> dz = dz_buffer.span<C>(dz_size);
  if (tokens > 0) {
    const simt::Dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(groups));
    const simt::Dim3 block(kChannels, kRuns);
    if (window) {
      PHASOR_LAUNCH((backward_kernel<C>), grid, block, 0, stream, p, dy, d_final_cache, grads.dx,
                    grads.dinitial_cache, parts);
    } else {
      PHASOR_LAUNCH((dz_kernel<C>), grid, block, 0, stream, p, dy, dz);
      PHASOR_LAUNCH((general_backward_kernel<C>), grid, block, 0, stream, p, d_final_cache,
                    grads.dx, grads.dinitial_cache, dz, parts);
    }
  }
  constexpr int kThreads = 128;
  const std::int64_t params = (p.W + 1) * p.D;
  if (want_params)
    PHASOR_LAUNCH((params_kernel<C>), simt::Dim3(static_cast<unsigned>(ceil_div(params, kThreads))),
                  simt::Dim3(kThreads), 0, stream, p, parts, part_count, grads.dweight,
                  grads.dbias);
  const std::int64_t items = p.num_sequences() * p.D;
  if (grads.dinitial_cache.defined() && p.W > 1 && items > 0)
    PHASOR_LAUNCH((empty_dcache_kernel<C>),
                  simt::Dim3(static_cast<unsigned>(ceil_div(items, kThreads))),
                  simt::Dim3(kThreads), 0, stream, p, d_final_cache, grads.dinitial_cache);
}
}  // namespace

void kernel_backward(const Problem& problem, const TensorView& dy, const TensorView& d_final_cache,
                     const ShortConvGrads& grads) {
  const cuda::Stream stream = cuda::current_stream();
  if (problem.D == 0) return;
  if (!grads.dx.defined() && !grads.dweight.defined() && !grads.dbias.defined() &&
      !grads.dinitial_cache.defined())
    return;
  const std::int64_t groups = channel_groups(problem);
  Staging stage(stream);
  Problem p = problem;
  const std::initializer_list<TensorView> outputs = {grads.dx, grads.dweight, grads.dbias,
                                                     grads.dinitial_cache};
  p.x = stage(p.x, outputs);
  p.weight = stage(p.weight, outputs);
  p.bias = stage(p.bias, outputs);
  p.initial_cache = stage(p.initial_cache, outputs);
  const TensorView dy_in = stage(dy, outputs), dfc_in = stage(d_final_cache, outputs);
  if (p.x.dtype == DType::float64)
    backward<double>(p, dy_in, dfc_in, grads, groups, stream);
  else
    backward<float>(p, dy_in, dfc_in, grads, groups, stream);
}

}  // namespace phasor::PHASOR_BACKEND::short_conv
