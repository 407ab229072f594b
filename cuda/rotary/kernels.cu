// The rotary ops on the GPU (cuda/rotary/rotary.h), written once for nvcc and the emulated GPU.
// Each computes what the CPU kernel of src/rotary/kernels.cpp computes, with the same compute
// types: C = double when the main input (φ, x) is float64, else float; the running phase sums of
// selective_rope_phases (and the reverse sums of its backward) in double whatever the dtype
// (rotary.h: a float32 sum over 65,536 tokens would lose most of its digits).
//
//   apply_rotary      element-wise: a block is 32 rotation pairs (threadIdx.x, coalesced along the
//                     row) × 8 rows (b, t, h) (threadIdx.y), rows grid-strided.
//   rope_angles       element-wise over (token, pair); a token's sequence by a binary search in
//                     cu_seqlens (Sequences::sequence_of).
//   selective_rope_phases
//                     a block scan over time: one block per (sequence, group of 32 columns
//                     c = h·R + i of [H, R] — coalesced across heads too), threads 32 columns ×
//                     8 warps; a tile is 64 tokens, each thread 8 consecutive tokens of its column.
//                     A thread sums its 8 tokens, the warps' totals go through shared memory, and
//                     every thread adds the totals of the warps before it to the carry of the
//                     tiles before, in warp order (a fixed order: the result does not depend on
//                     the schedule); the carry crosses tiles in registers and restarts with each
//                     sequence (one block per sequence). Eight partial sums per column are too few
//                     for a WarpScan/BlockScan to pay off, and this keeps the per-column order of
//                     the double additions explicit. The backward runs the same tiles in reverse
//                     (suffix sums Σ_{t ≥ s}); dω's per-(sequence, column) partials go to a
//                     workspace and a second kernel sums them in sequence (and head) order, as
//                     the CPU kernel does — no atomics.
//                     Parallelism is N · ⌈H·R / 32⌉ blocks (grid x: sequences, y: column groups):
//                     an H100's 132 SMs are busy from e.g. 8 sequences × 16 heads × 32 pairs on;
//                     with fewer, a long sequence runs on few SMs (a decoupled look-back scan over
//                     time would spread it over more).
#include <algorithm>

#include "rotary/rotary.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::rotary {
namespace {

using ::phasor::detail::Sequence;
using ::phasor::detail::rotary::AnglesProblem;
using ::phasor::detail::rotary::ApplyProblem;
using ::phasor::detail::rotary::pair_a;
using ::phasor::detail::rotary::pair_b;
using ::phasor::detail::rotary::PhaseProblem;

// CUDA's limit on gridDim.y; larger extents are covered by grid-stride loops.
constexpr std::int64_t kMaxGridY = 65535;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}
unsigned grid_y(std::int64_t blocks) {
  return static_cast<unsigned>(std::min(blocks, kMaxGridY));
}

// ---- apply_rotary
// ---------------------------------------------------------------------------------

constexpr int kApplyPairs = 32;  // threadIdx.x: rotation pairs i of a row
constexpr int kApplyRows = 8;    // threadIdx.y: rows (b, t, h), grid-strided

struct Row {
  std::int64_t b, t, h;
};
// Row r of the B·T·H rows. Uniform across a warp's lanes (they share the row), so the divisions
// cost once per warp and row, not per pair.
PHASOR_DEVICE Row row_of(std::int64_t r, std::int64_t T, std::int64_t H) {
  const std::int64_t bt = r / H;
  return {bt / T, bt % T, r % H};
}

// y_a = x_a cos θ − x_b sin θ, y_b = x_a sin θ + x_b cos θ (rotary.h), cos/sin in C from θ loaded
// as C. A thread reads its pair before writing it: y may be x itself (in place).
template <class C>
PHASOR_GLOBAL void apply_forward_kernel(ApplyProblem p, TensorView y) {
  const std::int64_t R = p.K / 2, rows = p.B * p.T * p.H;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kApplyPairs + threadIdx.x;
  if (i >= R) return;
  const std::int64_t a = pair_a(p.layout, i, R), b = pair_b(p.layout, i, R);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.y) * kApplyRows;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * kApplyRows + threadIdx.y; r < rows;
       r += step) {
    const Row w = row_of(r, p.T, p.H);
    C sn, cs;
    simt::sincos(simt::load<C>(p.theta, w.b, w.t, w.h, i), &sn, &cs);
    const C xa = simt::load<C>(p.x, w.b, w.t, w.h, a), xb = simt::load<C>(p.x, w.b, w.t, w.h, b);
    simt::store(y, xa * cs - xb * sn, w.b, w.t, w.h, a);
    simt::store(y, xa * sn + xb * cs, w.b, w.t, w.h, b);
  }
}

// dx = rotation of dy by −θ; dθ = dy_b · y_a − dy_a · y_b with y recomputed from x (rotary.h).
template <class C>
PHASOR_GLOBAL void apply_backward_kernel(ApplyProblem p, TensorView dy, TensorView dx,
                                         TensorView d_theta) {
  const std::int64_t R = p.K / 2, rows = p.B * p.T * p.H;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kApplyPairs + threadIdx.x;
  if (i >= R) return;
  const std::int64_t a = pair_a(p.layout, i, R), b = pair_b(p.layout, i, R);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.y) * kApplyRows;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * kApplyRows + threadIdx.y; r < rows;
       r += step) {
    const Row w = row_of(r, p.T, p.H);
    C sn, cs;
    simt::sincos(simt::load<C>(p.theta, w.b, w.t, w.h, i), &sn, &cs);
    const C da = simt::load<C>(dy, w.b, w.t, w.h, a), db = simt::load<C>(dy, w.b, w.t, w.h, b);
    if (d_theta.defined()) {
      const C xa = simt::load<C>(p.x, w.b, w.t, w.h, a), xb = simt::load<C>(p.x, w.b, w.t, w.h, b);
      const C ya = xa * cs - xb * sn, yb = xa * sn + xb * cs;
      simt::store(d_theta, db * ya - da * yb, w.b, w.t, w.h, i);
    }
    if (dx.defined()) {
      simt::store(dx, da * cs + db * sn, w.b, w.t, w.h, a);
      simt::store(dx, db * cs - da * sn, w.b, w.t, w.h, b);
    }
  }
}

// ---- rope_angles
// ----------------------------------------------------------------------------------

constexpr int kAnglePairs = 32;  // threadIdx.x: pairs i
constexpr int kAngleTokens = 8;  // threadIdx.y: tokens of the flattened B·T axis, grid-strided

// base^e in double: CUDA's pow on the GPU (within 2 ulp), the C library's on the emulator (as the
// CPU kernel).
PHASOR_DEVICE double power(double base, double exponent) {
#if defined(PHASOR_SIMT_CUDA)
  return ::pow(base, exponent);
#else
  return std::pow(base, exponent);
#endif
}

// θ[b, t, i] = (offset + t − start of t's sequence) · base^(−2i/K), in float64, rounded once to
// theta's dtype (rotary.h).
PHASOR_GLOBAL void angles_kernel(AnglesProblem p, TensorView theta) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kAnglePairs + threadIdx.x;
  if (i >= p.R) return;
  const double frequency =
      power(p.base, -2.0 * static_cast<double>(i) / static_cast<double>(p.head_dim));
  const std::int64_t tokens = p.B * p.T, step = static_cast<std::int64_t>(gridDim.y) * kAngleTokens;
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.y) * kAngleTokens + threadIdx.y;
       g < tokens; g += step) {
    const Sequence s = p.sequences[p.sequences.sequence_of(g)];
    const std::int64_t t = g - s.batch * p.T;  // the token's index in its batch row
    const double position = static_cast<double>(p.offset + (t - s.start));
    simt::store(theta, position * frequency, s.batch, t, i);
  }
}

// ---- selective_rope_phases
// ------------------------------------------------------------------------

constexpr int kLanes = 32;                       // threadIdx.x: columns c = h·R + i
constexpr int kWarps = 8;                        // threadIdx.y: runs of tokens within a tile
constexpr int kItems = 8;                        // consecutive tokens per thread and tile
constexpr std::int64_t kTile = kWarps * kItems;  // tokens per tile

// The column of this thread in group `group` of 32 columns of [H, R].
struct Column {
  bool active;  // c < H·R (the other lanes take part in the barriers only)
  std::int64_t h, i;
  double omega;  // ω[h, i] or ω[i], as the CPU kernel's float64 row
};
PHASOR_DEVICE Column column_of(const PhaseProblem& p, std::int64_t group) {
  Column col{false, 0, 0, 0.0};
  const std::int64_t c = group * kLanes + threadIdx.x;
  if (c >= p.H * p.R) return col;
  col.active = true;
  col.h = c / p.R;
  col.i = c % p.R;
  col.omega = p.omega_per_head ? simt::load<double>(p.omega, col.h, col.i)
                               : simt::load<double>(p.omega, col.i);
  return col;
}

// An [N, H, R] state (initial_phase, d_final_phase) as double; 0 when undefined.
PHASOR_DEVICE double state_of(const TensorView& x, std::int64_t n, const Column& col) {
  return col.active && x.defined() ? simt::load<double>(x, n, col.h, col.i) : 0.0;
}

// The warps' totals of one tile through shared memory: `before` = carry + the totals of the warps
// before this one, `after` = carry + all the totals (the carry of the next tile). Every thread of a
// column adds the same values in the same order (forward: warp 0 up; reverse: warp 7 down), so
// `after` is the same double in every warp. Two barriers: the totals are complete before they are
// read, and read before the next tile overwrites them.
struct Carry {
  double before, after;
};
PHASOR_DEVICE Carry combine_tile(const simt::SharedArray<double>& totals, double running,
                                 double carry, bool reverse) {
  const int lane = static_cast<int>(threadIdx.x), warp = static_cast<int>(threadIdx.y);
  totals[warp * kLanes + lane] = running;
  simt::syncthreads();
  Carry c{carry, 0.0};
  if (!reverse) {
    for (int w = 0; w < warp; ++w) {
      const double v = totals[w * kLanes + lane];
      c.before += v;
    }
  } else {
    for (int w = kWarps - 1; w > warp; --w) {
      const double v = totals[w * kLanes + lane];
      c.before += v;
    }
  }
  c.after = c.before;
  if (!reverse) {
    for (int w = warp; w < kWarps; ++w) {
      const double v = totals[w * kLanes + lane];
      c.after += v;
    }
  } else {
    for (int w = warp; w >= 0; --w) {
      const double v = totals[w * kLanes + lane];
      c.after += v;
    }
  }
  simt::syncthreads();
  return c;
}

// One tile of the forward scan for this thread: running sums of its kItems tokens of φ (double),
// local[k] = Σ of its tokens up to k; returns its total.
template <class C>
PHASOR_DEVICE double sum_phi(const PhaseProblem& p, const Sequence& s, const Column& col,
                             std::int64_t first, double (&local)[kItems]) {
  double running = 0.0;
  PHASOR_UNROLL
  for (int k = 0; k < kItems; ++k) {
    const std::int64_t t = first + k;
    if (col.active && t < s.length)
      running += static_cast<double>(simt::load<C>(p.phi, s.batch, s.start + t, col.h, col.i));
    local[k] = running;
  }
  return running;
}

// P_t = θ_0 + Σ_{s ≤ t} φ_s (double), θ_t = ω ⊙ P_t rounded to C then to theta's dtype, and the
// final phase P at the last token (rotary.h), as the CPU kernel. Grid: x = sequences, y = column
// groups (grid-strided). A thread reads its φ before writing its θ (θ may be φ itself).
template <class C>
PHASOR_GLOBAL void phases_forward_kernel(PhaseProblem p, TensorView theta, TensorView final_phase) {
  PHASOR_SHARED_ARRAY(double, totals, kWarps* kLanes);
  const std::int64_t n = blockIdx.x;
  const Sequence s = p.sequences[n];
  const std::int64_t groups = (p.H * p.R + kLanes - 1) / kLanes;
  for (std::int64_t group = blockIdx.y; group < groups; group += gridDim.y) {
    const Column col = column_of(p, group);
    // final_phase may alias initial_phase (decoding): every thread reads its θ_0 before the first
    // tile's barriers, after which warp 0 writes; an empty sequence (no barrier) writes back the
    // very value it read.
    double carry = state_of(p.initial_phase, n, col);
    for (std::int64_t t0 = 0; t0 < s.length; t0 += kTile) {
      const std::int64_t first = t0 + static_cast<std::int64_t>(threadIdx.y) * kItems;
      double local[kItems];
      const double running = sum_phi<C>(p, s, col, first, local);
      const Carry c = combine_tile(totals, running, carry, /*reverse=*/false);
      PHASOR_UNROLL
      for (int k = 0; k < kItems; ++k) {
        const std::int64_t t = first + k;
        if (col.active && t < s.length)
          simt::store(theta, static_cast<C>(col.omega * (c.before + local[k])), s.batch,
                      s.start + t, col.h, col.i);
      }
      carry = c.after;
    }
    if (threadIdx.y == 0 && col.active && final_phase.defined())
      simt::store(final_phase, carry, n, col.h, col.i);
  }
}

// dφ_s = Σ_{t ≥ s} ω dθ_t + dP_final (double reverse sums), dθ_0 = that sum before the first token,
// and dω's partials Σ_t dθ_t P_t per (sequence, column) into parts[n · H·R + c] (rotary.h), as
// the CPU kernel: a forward scan recomputes P_t for dω, then a reverse scan gives dφ.
template <class C>
PHASOR_GLOBAL void phases_backward_kernel(PhaseProblem p, TensorView d_theta,
                                          TensorView d_final_phase, TensorView d_phi,
                                          TensorView d_initial_phase, simt::Span<double> parts) {
  PHASOR_SHARED_ARRAY(double, totals, kWarps* kLanes);
  const std::int64_t n = blockIdx.x, columns = p.H * p.R;
  const Sequence s = p.sequences[n];
  const std::int64_t groups = (columns + kLanes - 1) / kLanes;
  const int lane = static_cast<int>(threadIdx.x), warp = static_cast<int>(threadIdx.y);
  for (std::int64_t group = blockIdx.y; group < groups; group += gridDim.y) {
    const Column col = column_of(p, group);
    if (parts.size > 0) {
      double carry = state_of(p.initial_phase, n, col), part = 0.0;
      for (std::int64_t t0 = 0; t0 < s.length; t0 += kTile) {
        const std::int64_t first = t0 + static_cast<std::int64_t>(warp) * kItems;
        double local[kItems];
        const double running = sum_phi<C>(p, s, col, first, local);
        const Carry c = combine_tile(totals, running, carry, /*reverse=*/false);
        PHASOR_UNROLL
        for (int k = 0; k < kItems; ++k) {
          const std::int64_t t = first + k;
          if (col.active && t < s.length)
            part +=
                static_cast<double>(simt::load<C>(d_theta, s.batch, s.start + t, col.h, col.i)) *
                (c.before + local[k]);
        }
        carry = c.after;
      }
      // The column's partial: the warps' sums added in warp order by warp 0.
      totals[warp * kLanes + lane] = part;
      simt::syncthreads();
      if (warp == 0 && col.active) {
        double sum = 0.0;
        for (int w = 0; w < kWarps; ++w) {
          const double v = totals[w * kLanes + lane];
          sum += v;
        }
        parts[n * columns + group * kLanes + lane] = sum;
      }
      simt::syncthreads();
    }
    if (!d_phi.defined() && !d_initial_phase.defined()) continue;
    double carry = state_of(d_final_phase, n, col);  // may alias d_initial_phase, as in the forward
    for (std::int64_t tile = (s.length + kTile - 1) / kTile - 1; tile >= 0; --tile) {
      const std::int64_t first = tile * kTile + static_cast<std::int64_t>(warp) * kItems;
      double local[kItems], running = 0.0;
      PHASOR_UNROLL
      for (int k = kItems - 1; k >= 0; --k) {
        const std::int64_t t = first + k;
        if (col.active && t < s.length)
          running += col.omega * static_cast<double>(
                                     simt::load<C>(d_theta, s.batch, s.start + t, col.h, col.i));
        local[k] = running;
      }
      const Carry c = combine_tile(totals, running, carry, /*reverse=*/true);
      if (d_phi.defined()) {
        PHASOR_UNROLL
        for (int k = 0; k < kItems; ++k) {
          const std::int64_t t = first + k;
          if (col.active && t < s.length)
            simt::store(d_phi, static_cast<C>(c.before + local[k]), s.batch, s.start + t, col.h,
                        col.i);
        }
      }
      carry = c.after;
    }
    if (warp == 0 && col.active && d_initial_phase.defined())
      simt::store(d_initial_phase, carry, n, col.h, col.i);
  }
}

// dω = Σ_n parts[n] (per head), or Σ_n Σ_h parts[n, h] for a shared [R] ω: the CPU kernel's order
// (items n-major, h-minor), one thread per element of dω.
PHASOR_GLOBAL void d_omega_kernel(PhaseProblem p, simt::Span<double> parts, TensorView d_omega) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t N = p.num_sequences(), columns = p.H * p.R;
  double sum = 0.0;
  if (p.omega_per_head) {
    if (e >= columns) return;
    for (std::int64_t n = 0; n < N; ++n) sum += parts[n * columns + e];
    simt::store(d_omega, sum, e / p.R, e % p.R);
  } else {
    if (e >= p.R) return;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < p.H; ++h) sum += parts[n * columns + h * p.R + e];
    simt::store(d_omega, sum, e);
  }
}

}  // namespace

// ---- entry points
// ---------------------------------------------------------------------------------

void apply_forward(const ApplyProblem& p, const TensorView& y) {
  const std::int64_t R = p.K / 2, rows = p.B * p.T * p.H;
  if (R == 0 || rows == 0) return;
  const simt::Dim3 grid(static_cast<unsigned>(ceil_div(R, kApplyPairs)),
                        grid_y(ceil_div(rows, kApplyRows)));
  const simt::Dim3 block(kApplyPairs, kApplyRows);
  const cuda::Stream stream = cuda::current_stream();
  if (p.x.dtype == DType::float64)
    PHASOR_LAUNCH((apply_forward_kernel<double>), grid, block, 0, stream, p, y);
  else
    PHASOR_LAUNCH((apply_forward_kernel<float>), grid, block, 0, stream, p, y);
}

void apply_backward(const ApplyProblem& p, const TensorView& dy, const TensorView& dx,
                    const TensorView& d_theta) {
  const std::int64_t R = p.K / 2, rows = p.B * p.T * p.H;
  if (R == 0 || rows == 0 || (!dx.defined() && !d_theta.defined())) return;
  const simt::Dim3 grid(static_cast<unsigned>(ceil_div(R, kApplyPairs)),
                        grid_y(ceil_div(rows, kApplyRows)));
  const simt::Dim3 block(kApplyPairs, kApplyRows);
  const cuda::Stream stream = cuda::current_stream();
  if (p.x.dtype == DType::float64)
    PHASOR_LAUNCH((apply_backward_kernel<double>), grid, block, 0, stream, p, dy, dx, d_theta);
  else
    PHASOR_LAUNCH((apply_backward_kernel<float>), grid, block, 0, stream, p, dy, dx, d_theta);
}

void angles(const AnglesProblem& p, const TensorView& theta) {
  const std::int64_t tokens = p.B * p.T;
  if (p.R == 0 || tokens == 0) return;
  const simt::Dim3 grid(static_cast<unsigned>(ceil_div(p.R, kAnglePairs)),
                        grid_y(ceil_div(tokens, kAngleTokens)));
  PHASOR_LAUNCH(angles_kernel, grid, simt::Dim3(kAnglePairs, kAngleTokens), 0,
                cuda::current_stream(), p, theta);
}

void phases_forward(const PhaseProblem& p, const TensorView& theta, const TensorView& final_phase) {
  const std::int64_t N = p.num_sequences(), groups = ceil_div(p.H * p.R, kLanes);
  if (N == 0 || groups == 0) return;
  const simt::Dim3 grid(static_cast<unsigned>(N), grid_y(groups)), block(kLanes, kWarps);
  const cuda::Stream stream = cuda::current_stream();
  if (p.phi.dtype == DType::float64)
    PHASOR_LAUNCH((phases_forward_kernel<double>), grid, block, 0, stream, p, theta, final_phase);
  else
    PHASOR_LAUNCH((phases_forward_kernel<float>), grid, block, 0, stream, p, theta, final_phase);
}

void phases_backward(const PhaseProblem& p, const TensorView& d_theta,
                     const TensorView& d_final_phase, const RotaryPhaseGrads& grads) {
  const std::int64_t N = p.num_sequences(), columns = p.H * p.R;
  const std::int64_t groups = ceil_div(columns, kLanes);
  const bool want_omega = grads.d_omega.defined();
  const cuda::Stream stream = cuda::current_stream();
  // dω's partials, one double per (sequence, column): N · H · R · 8 bytes.
  const std::int64_t part_count = want_omega ? N * columns : 0;
  simt::Workspace workspace(static_cast<std::size_t>(part_count) * sizeof(double), stream);
  const simt::Span<double> parts = workspace.span<double>(part_count);
  if (N > 0 && groups > 0 &&
      (want_omega || grads.d_phi.defined() || grads.d_initial_phase.defined())) {
    const simt::Dim3 grid(static_cast<unsigned>(N), grid_y(groups)), block(kLanes, kWarps);
    if (p.phi.dtype == DType::float64)
      PHASOR_LAUNCH((phases_backward_kernel<double>), grid, block, 0, stream, p, d_theta,
                    d_final_phase, grads.d_phi, grads.d_initial_phase, parts);
    else
      PHASOR_LAUNCH((phases_backward_kernel<float>), grid, block, 0, stream, p, d_theta,
                    d_final_phase, grads.d_phi, grads.d_initial_phase, parts);
  }
  const std::int64_t outputs = grads.d_omega.numel();
  if (want_omega && outputs > 0) {
    constexpr int kThreads = 128;
    PHASOR_LAUNCH(d_omega_kernel, simt::Dim3(static_cast<unsigned>(ceil_div(outputs, kThreads))),
                  simt::Dim3(kThreads), 0, stream, p, parts, grads.d_omega);
  }
}

}  // namespace phasor::PHASOR_BACKEND::rotary
