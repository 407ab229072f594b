// GLA's recurrent kernels on the GPU (cuda/gla/gla.h), written once for nvcc and the emulated GPU.
// They compute what src/gla/recurrent.cpp computes, in the compute type C of q (double for float64
// q, else float):
//   S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,      o_t = S_tᵀ (scale · q_t)
// with q and k rotated by θ on load when given ((R1) of src/common/rotation.h).
//
// Mapping: one block per (sequence n, head h, tile of kColumns = 32 value columns): blockIdx.x =
// n·H + h, blockIdx.y = the tile. threadIdx.x is the lane = value column j of the tile,
// threadIdx.y the warp w, which owns key rows [kRows·w, kRows·w + kRows): the forward's K × 32
// state tile lives in registers, kRows = 16 per thread and at most 16 warps (512 threads, so ptxas
// may use up to 128 registers per thread), so K ≤ kMaxK = 256. Per token the block stages q_t, k_t
// (rotated), exp(g_t) and its slice of v_t in shared memory; each thread updates its kRows state
// entries and adds their share of o_t; the warps' shares are summed through shared memory in warp
// order (a fixed order: deterministic, bit-identical under every schedule).
//
// Backward, as the CPU kernel: a forward replay (forward_kernel without o) writes the state at the
// start of every segment of chunk_size tokens (checkpoints), then backward_kernel walks the
// segments in reverse, recomputes each segment's states from its checkpoint into a per-block
// workspace, and carries the adjoint dS back token by token:
//   dS_t += scale q_t do_tᵀ;  dq'_t = scale S_t do_t;  dk'_t = dS_t v_t;  dv_t = dS_tᵀ k_t;
//   dg_t = exp(g_t) ⊙ rowsum(S_{t−1} ⊙ dS_t)   (the direct form: a sum of products, no
//   cancellation for strong gates);             dS_{t−1} = diag(exp(g_t)) dS_t.
// dS lives in a per-thread tile of the workspace rather than in registers, and the states are
// read back from the workspace by the thread that wrote them: the backward then stays within the
// 128 registers of a 512-thread block without spilling (scripts/cuda-resources.sh).
// dv is complete within a block (summed over the warps' rows in warp order). dq', dk' and the row
// sums of dg are sums over value columns: a warp sums its 32 lanes for 8 rows at once
// (transpose_sum, cuda/common/recurrent.h: a fixed butterfly, the same order in every run) and
// writes one partial per value tile to a workspace; a finishing kernel adds the tiles in tile
// order, multiplies dg by exp(g), turns dq', dk' (rotated frame) into dq, dk and dθ ((R2), (R3))
// and stores them. No atomics.
//
// Workspace of the backward (compute type C): checkpoints (N + ⌈B·T / C⌉) · H · K · 32·tiles —
// segment i of sequence n (first token at flat index f) uses slot n + ⌊f / C⌋ + i, distinct for
// all (n, i) without reading cu_seqlens on the host — plus the recomputed segment states and dS,
// N·H·tiles · (C + 2) · K · 32, with C = min(chunk_size, 64), plus the partials
// 3 · tiles · B·T·H·K (only those asked for).
#include <algorithm>
#include <string>
#include <type_traits>

#include "common/recurrent.h"
#include "common/staging.h"
#include "gla/gla.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::gla {
namespace {

using ::phasor::detail::Sequence;
using ::phasor::detail::gla::Problem;

constexpr int kColumns = 32;         // value columns per block: threadIdx.x
constexpr int kRows = 16;            // key rows per thread
constexpr int kMaxWarps = 16;        // threadIdx.y: ≤ 512 threads, so ≤ 128 registers each
constexpr std::int64_t kMaxK = 256;  // kRows × kMaxWarps
constexpr std::int64_t kMaxTiles = 65535;
// The backward's checkpoint interval: chunk_size, at most kMaxSegment (the states of a segment
// are stored per block; the results do not depend on the interval, only memory and time do).
constexpr std::int64_t kMaxSegment = 64;

// Stages token (b, t) of head h: k_t (and q_t when `with_q`) for every key row, rotated by θ_t
// when given (one cos/sin per pair serves both).
template <class C>
PHASOR_DEVICE void stage_rotated(const Problem& p, bool with_q, std::int64_t b, std::int64_t t,
                                 std::int64_t h, const simt::SharedArray<C>& q,
                                 const simt::SharedArray<C>& k) {
  const std::int64_t tid = threadIdx.y * kColumns + threadIdx.x,
                     threads = static_cast<std::int64_t>(blockDim.x) * blockDim.y;
  if (!p.theta.defined()) {
    for (std::int64_t a = tid; a < p.K; a += threads) {
      if (with_q) q[a] = simt::load<C>(p.q, b, t, h, a);
      k[a] = simt::load<C>(p.k, b, t, h, a);
    }
    return;
  }
  for (std::int64_t i = tid; i < p.K / 2; i += threads) {
    C c, s;
    angle_of(p.theta, b, t, h, i, c, s);
    const std::int64_t ia = pair_a(p.rotary_layout, p.K, i), ib = pair_b(p.rotary_layout, p.K, i);
    for (int which = with_q ? 0 : 1; which < 2; ++which) {
      const TensorView& view = which == 0 ? p.q : p.k;
      const simt::SharedArray<C>& x = which == 0 ? q : k;
      const C xa = simt::load<C>(view, b, t, h, ia), xb = simt::load<C>(view, b, t, h, ib);
      x[ia] = xa * c - xb * s;  // (R1)
      x[ib] = xa * s + xb * c;
    }
  }
}

// Stages exp(g_t) for every key row.
template <class C>
PHASOR_DEVICE void stage_decay(const Problem& p, std::int64_t b, std::int64_t t, std::int64_t h,
                               const simt::SharedArray<C>& decay) {
  const std::int64_t tid = threadIdx.y * kColumns + threadIdx.x,
                     threads = static_cast<std::int64_t>(blockDim.x) * blockDim.y;
  for (std::int64_t a = tid; a < p.K; a += threads)
    decay[a] = simt::exp(simt::load<C>(p.g, b, t, h, a));
}

// Dynamic shared memory: q[K], k[K], decay[K], v[32], do[32], the warps' partials [warps · 32].
std::size_t shared_bytes(const Problem& p, int warps, std::size_t element) {
  return static_cast<std::size_t>(3 * p.K + 2 * kColumns + warps * kColumns) * element;
}

struct SharedLayout {
  std::size_t q, k, decay, v, d_o, partial;
};
template <class C>
PHASOR_DEVICE SharedLayout layout_of(const Problem& p) {
  const std::size_t K = static_cast<std::size_t>(p.K), e = sizeof(C);
  return {0, K * e, 2 * K * e, 3 * K * e, (3 * K + kColumns) * e, (3 * K + 2 * kColumns) * e};
}

// ---- forward ------------------------------------------------------------------------------------

// The forward recurrence; o is written when defined (the backward's replay runs it without o,
// to write the checkpoints).
template <class C>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kMaxWarps* kColumns)
    forward_kernel(Problem p, TensorView o, TensorView final_state, Checkpoints<C> checkpoints) {
  const std::int64_t n = blockIdx.x / p.H, h = blockIdx.x % p.H, tile = blockIdx.y;
  const int lane = threadIdx.x, warp = threadIdx.y, warps = blockDim.y;
  const std::int64_t j = tile * kColumns + lane;
  const bool column = j < p.V;
  const SharedLayout at = layout_of<C>(p);
  PHASOR_DYNAMIC_SHARED_AT(C, q_s, at.q, p.K);
  PHASOR_DYNAMIC_SHARED_AT(C, k_s, at.k, p.K);
  PHASOR_DYNAMIC_SHARED_AT(C, decay_s, at.decay, p.K);
  PHASOR_DYNAMIC_SHARED_AT(C, v_s, at.v, kColumns);
  PHASOR_DYNAMIC_SHARED_AT(C, partial_s, at.partial, warps * kColumns);
  const C scale = static_cast<C>(p.scale);
  const Sequence s = p.sequences[n];
  const bool output = o.defined();
  const std::int64_t first = s.batch * p.T + s.start;  // flat index of the sequence's first token

  C state[kRows];
  PHASOR_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
    state[r] = column && a < p.K && p.initial_state.defined()
                   ? simt::load<C>(p.initial_state, n, h, a, j)
                   : C(0);
  }
  // The next token whose incoming state is a checkpoint, and its slot (none without checkpoints).
  std::int64_t next_checkpoint = checkpoints.states.size > 0 ? 0 : -1;
  std::int64_t slot = checkpoints.states.size > 0 ? checkpoints.first_slot(n, first) : 0;
  for (std::int64_t t = 0; t < s.length; ++t) {
    if (t == next_checkpoint) {
      PHASOR_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
        if (a < p.K) checkpoints.states[checkpoints.element(slot, h, tile, a, lane)] = state[r];
      }
      ++slot;
      next_checkpoint += checkpoints.interval;
    }
    stage_rotated<C>(p, output, s.batch, s.start + t, h, q_s, k_s);
    stage_decay<C>(p, s.batch, s.start + t, h, decay_s);
    if (warp == 0) v_s[lane] = column ? simt::load<C>(p.v, s.batch, s.start + t, h, j) : C(0);
    simt::syncthreads();
    const C v_j = v_s[lane];
    C share = 0;
    PHASOR_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
      if (a >= p.K) continue;
      const C d = decay_s[a], k_a = k_s[a];
      state[r] = d * state[r] + k_a * v_j;
      if (output) {
        const C q_a = q_s[a];
        share += (scale * q_a) * state[r];
      }
    }
    if (output) {
      partial_s[warp * kColumns + lane] = share;
      simt::syncthreads();
      if (warp == 0 && column) {
        C sum = 0;
        for (int w = 0; w < warps; ++w) {
          const C part = partial_s[w * kColumns + lane];
          sum += part;
        }
        simt::store(o, sum, s.batch, s.start + t, h, j);
      }
    }
    simt::syncthreads();  // the staged token is replaced by the next one
  }
  if (final_state.defined() && column) PHASOR_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
    if (a < p.K) simt::store(final_state, state[r], n, h, a, j);
  }
}

// ---- backward -----------------------------------------------------------------------------------

// Workspace views of the backward.
template <class C>
struct BackwardSpace {
  Checkpoints<C> checkpoints;  // written by forward_kernel
  simt::Span<C> states;        // [block][C + 1][K][32]
  simt::Span<C> adjoint;       // [block][K][32]: dS
  simt::Span<C> dq, dk, dg;    // [tile][B·T][H][K], each empty when not needed
  std::int64_t tiles = 0;
};

template <class C>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kMaxWarps* kColumns)
    backward_kernel(Problem p, TensorView d_o, TensorView d_final_state, TensorView dv,
                    TensorView dh0, BackwardSpace<C> space) {
  const std::int64_t n = blockIdx.x / p.H, h = blockIdx.x % p.H, tile = blockIdx.y;
  const int lane = threadIdx.x, warp = threadIdx.y, warps = blockDim.y;
  const std::int64_t j = tile * kColumns + lane;
  const bool column = j < p.V;
  const SharedLayout at = layout_of<C>(p);
  PHASOR_DYNAMIC_SHARED_AT(C, q_s, at.q, p.K);
  PHASOR_DYNAMIC_SHARED_AT(C, k_s, at.k, p.K);
  PHASOR_DYNAMIC_SHARED_AT(C, decay_s, at.decay, p.K);
  PHASOR_DYNAMIC_SHARED_AT(C, v_s, at.v, kColumns);
  PHASOR_DYNAMIC_SHARED_AT(C, do_s, at.d_o, kColumns);
  PHASOR_DYNAMIC_SHARED_AT(C, partial_s, at.partial, warps * kColumns);
  const C scale = static_cast<C>(p.scale);
  const Sequence s = p.sequences[n];
  const std::int64_t CS = p.chunk_size, K = p.K;
  const std::int64_t segments = ceil_div(s.length, CS);
  const std::int64_t first = s.batch * p.T + s.start;  // flat index of the sequence's first token
  const std::int64_t block = static_cast<std::int64_t>(blockIdx.x) * space.tiles + tile;
  // Element (a, lane) of a K × 32 state tile stored at `base`.
  const auto element = [&](std::int64_t base, std::int64_t a) {
    return (base + a) * kColumns + lane;
  };
  const auto state_base = [&](std::int64_t t) { return (block * (CS + 1) + t) * K; };
  // Stages k_t, exp(g_t), v_t (and q_t, do_t) of token t of the sequence.
  const auto stage = [&](std::int64_t t, bool with_q) {
    stage_rotated<C>(p, with_q, s.batch, s.start + t, h, q_s, k_s);
    stage_decay<C>(p, s.batch, s.start + t, h, decay_s);
    if (warp == 0) {
      v_s[lane] = column ? simt::load<C>(p.v, s.batch, s.start + t, h, j) : C(0);
      if (with_q) do_s[lane] = column ? simt::load<C>(d_o, s.batch, s.start + t, h, j) : C(0);
    }
  };

  // dS of this thread's rows lives in its own tile of the workspace, not in registers: beside
  // the staged token, the state reads and the column sums, a 16-row register tile would push the
  // kernel past the 128 registers a 512-thread block allows (ptxas then spills). Only this thread
  // reads and writes its elements, so no synchronisation is needed, and they stay in L1.
  const std::int64_t adjoint_base = block * K;
  const auto ds = [&](int r) -> C& {
    return space.adjoint[element(adjoint_base, static_cast<std::int64_t>(warp) * kRows + r)];
  };

  // Segments in reverse; ds holds dS, the gradient of the state after the token at hand.
  PHASOR_NO_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
    if (a < K)
      ds(r) = column && d_final_state.defined() ? simt::load<C>(d_final_state, n, h, a, j) : C(0);
  }
  for (std::int64_t i = segments - 1; i >= 0; --i) {
    const std::int64_t L = std::min(CS, s.length - i * CS);
    // The segment's states: states[0] = its checkpoint, states[t + 1] = the state after token t.
    // Each thread reads back only what it wrote itself: no state array in registers beside dS.
    PHASOR_NO_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
      if (a < K)
        space.states[element(state_base(0), a)] =
            space.checkpoints.states[space.checkpoints.element(
                space.checkpoints.first_slot(n, first) + i, h, tile, a, lane)];
    }
    for (std::int64_t t = 0; t < L; ++t) {
      stage(i * CS + t, false);
      simt::syncthreads();
      const C v_j = v_s[lane];
      PHASOR_NO_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
        if (a >= K) continue;
        const C d = decay_s[a], k_a = k_s[a], previous = space.states[element(state_base(t), a)];
        space.states[element(state_base(t + 1), a)] = d * previous + k_a * v_j;
      }
      simt::syncthreads();
    }
    for (std::int64_t t = L - 1; t >= 0; --t) {
      const std::int64_t token = s.start + i * CS + t, flat = s.batch * p.T + token;
      stage(i * CS + t, true);
      simt::syncthreads();
      const C v_j = v_s[lane], do_j = do_s[lane];
      const std::int64_t row0 = static_cast<std::int64_t>(warp) * kRows;  // this warp's first row
      PHASOR_NO_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t a = row0 + r;
        if (a >= K) continue;  // uniform across the warp: a depends on the warp only
        const C q_a = q_s[a];
        ds(r) += (scale * q_a) * do_j;  // o_t = S_tᵀ (scale q_t)
      }
      // The sums over value columns, kSumRows rows of the warp at once (transpose_sum); the first
      // lane of each row's group stores its partial.
      const std::int64_t part = ((tile * p.B * p.T + flat) * p.H + h) * K + row0;
      constexpr int kSumRows = 8, kParts = kRows / kSumRows, kLanesPerRow = kColumns / kSumRows;
      const int row = row_of_lane<kSumRows>(lane);
      const bool stores = lane % kLanesPerRow == 0;
      const auto store_sums = [&](const simt::Span<C>& partials, auto&& value) {
        PHASOR_NO_UNROLL
        for (int group = 0; group < kParts; ++group) {
          C x[kSumRows];
          PHASOR_UNROLL
          for (int r = 0; r < kSumRows; ++r)
            x[r] = row0 + group * kSumRows + r < K ? value(group * kSumRows + r) : C(0);
          const C sum = transpose_sum(x, lane);
          if (stores && row0 + group * kSumRows + row < K)
            partials[part + group * kSumRows + row] = sum;
        }
      };
      if (space.dq.size > 0)  // dq'_t = scale S_t do_t
        store_sums(space.dq, [&](int r) {
          return column ? scale * space.states[element(state_base(t + 1), row0 + r)] * do_j : C(0);
        });
      if (space.dk.size > 0)  // dk'_t = dS_t v_t
        store_sums(space.dk, [&](int r) { return ds(r) * v_j; });
      if (space.dg.size > 0)  // rowsum(S_{t−1} ⊙ dS_t)
        store_sums(space.dg,
                   [&](int r) { return space.states[element(state_base(t), row0 + r)] * ds(r); });
      C dv_share = 0;
      PHASOR_NO_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t a = row0 + r;
        if (a >= K) continue;
        const C k_a = k_s[a], d = decay_s[a];
        dv_share += k_a * ds(r);  // dv_t = dS_tᵀ k_t
        ds(r) *= d;               // dS_{t−1} = diag(exp(g_t)) dS_t
      }
      partial_s[warp * kColumns + lane] = dv_share;
      simt::syncthreads();
      if (warp == 0 && column && dv.defined()) {
        C sum = 0;
        for (int w = 0; w < warps; ++w) {
          const C share = partial_s[w * kColumns + lane];
          sum += share;
        }
        simt::store(dv, sum, s.batch, token, h, j);
      }
    }
  }
  if (dh0.defined() && column) PHASOR_NO_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
    if (a < K) simt::store(dh0, ds(r), n, h, a, j);
  }
}

// Sums the value tiles' partials of one (token, head) row in tile order and stores dq, dk, dg
// and dθ: one thread per row a (no θ) or per rotation pair i (θ), over the flat token axis.
template <class C>
PHASOR_GLOBAL void finish_kernel(Problem p, BackwardSpace<C> space, GlaGrads grads) {
  const std::int64_t units = p.theta.defined() ? p.K / 2 : p.K;
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.B * p.T * p.H * units) return;
  const std::int64_t unit = e % units, row = e / units;  // row = flat · H + h
  const std::int64_t h = row % p.H, flat = row / p.H, b = flat / p.T, t = flat % p.T;
  const std::int64_t stride = p.B * p.T * p.H * p.K;  // one tile's partials
  const auto total = [&](const simt::Span<C>& parts, std::int64_t a) {
    C sum = 0;
    for (std::int64_t tile = 0; tile < space.tiles; ++tile)
      sum += parts[tile * stride + row * p.K + a];
    return sum;
  };
  const std::int64_t rows[2] = {p.theta.defined() ? pair_a(p.rotary_layout, p.K, unit) : unit,
                                p.theta.defined() ? pair_b(p.rotary_layout, p.K, unit) : unit};
  const int count = p.theta.defined() ? 2 : 1;
  if (grads.dg.defined())
    for (int r = 0; r < count; ++r) {
      const std::int64_t a = rows[r];
      simt::store(grads.dg, simt::exp(simt::load<C>(p.g, b, t, h, a)) * total(space.dg, a), b, t, h,
                  a);
    }
  if (!p.theta.defined()) {
    if (grads.dq.defined()) simt::store(grads.dq, total(space.dq, unit), b, t, h, unit);
    if (grads.dk.defined()) simt::store(grads.dk, total(space.dk, unit), b, t, h, unit);
    return;
  }
  if (space.dq.size == 0) return;  // only dg asked for: nothing to unrotate
  // (R2), (R3): dy = the gradient of the rotated pair y = R(θ) x.
  C c, s;
  angle_of(p.theta, b, t, h, unit, c, s);
  const std::int64_t ia = rows[0], ib = rows[1];
  C dtheta = 0;
  const auto unrotate = [&](const TensorView& x, const simt::Span<C>& parts, const TensorView& dx) {
    const C xa = simt::load<C>(x, b, t, h, ia), xb = simt::load<C>(x, b, t, h, ib);
    const C ya = xa * c - xb * s, yb = xa * s + xb * c;
    const C dya = total(parts, ia), dyb = total(parts, ib);
    dtheta += dyb * ya - dya * yb;
    if (dx.defined()) {
      simt::store(dx, dya * c + dyb * s, b, t, h, ia);
      simt::store(dx, dyb * c - dya * s, b, t, h, ib);
    }
  };
  unrotate(p.q, space.dq, grads.dq);
  unrotate(p.k, space.dk, grads.dk);
  if (grads.dtheta.defined()) simt::store(grads.dtheta, dtheta, b, t, h, unit);
}

// The launch shape shared by both directions; checks K and the tile count.
struct Shape {
  simt::Dim3 grid, block;
  std::int64_t tiles;
  int warps;
};
Shape shape_of(const Problem& p, const char* op) {
  if (p.K > kMaxK)
    throw Error(std::string(op) + " on the GPU: argument 'q': expected a head dimension K ≤ " +
                std::to_string(kMaxK) + ", got K = " + std::to_string(p.K));
  const std::int64_t tiles = ceil_div(p.V, kColumns);
  if (tiles > kMaxTiles)
    throw Error(std::string(op) + " on the GPU: argument 'v': expected V ≤ " +
                std::to_string(kMaxTiles * kColumns) + ", got V = " + std::to_string(p.V));
  const int warps = static_cast<int>(std::max<std::int64_t>(1, ceil_div(p.K, kRows)));
  return {simt::Dim3(static_cast<unsigned>(p.num_work_items()), static_cast<unsigned>(tiles)),
          simt::Dim3(kColumns, static_cast<unsigned>(warps)), tiles, warps};
}

}  // namespace

void recurrent_forward(const Problem& problem, const TensorView& o, const TensorView& final_state) {
  const Shape shape = shape_of(problem, "fused_recurrent_gla");
  if (problem.num_work_items() == 0 || problem.V == 0) return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.theta, &p.initial_state})
    *input = stage(*input, {o});
  const bool f64 = p.q.dtype == DType::float64;
  const std::size_t bytes = shared_bytes(p, shape.warps, f64 ? sizeof(double) : sizeof(float));
  if (f64)
    PHASOR_LAUNCH((forward_kernel<double>), shape.grid, shape.block, bytes, stream, p, o,
                  final_state, Checkpoints<double>{});
  else
    PHASOR_LAUNCH((forward_kernel<float>), shape.grid, shape.block, bytes, stream, p, o,
                  final_state, Checkpoints<float>{});
}

void recurrent_backward(const Problem& problem, const TensorView& d_o,
                        const TensorView& d_final_state, const GlaGrads& grads) {
  const Shape shape = shape_of(problem, "fused_recurrent_gla");
  if (problem.num_work_items() == 0) return;
  if (problem.V == 0) {  // no values: o and the state are empty, the other gradients are zero
    zero_views({grads.dq, grads.dk, grads.dg, grads.dtheta}, cuda::current_stream());
    return;
  }
  if (!grads.dq.defined() && !grads.dk.defined() && !grads.dv.defined() && !grads.dg.defined() &&
      !grads.dh0.defined() && !grads.dtheta.defined())
    return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  p.chunk_size = std::min(p.chunk_size, kMaxSegment);
  const std::initializer_list<TensorView> outputs = {grads.dq, grads.dk,  grads.dv,
                                                     grads.dg, grads.dh0, grads.dtheta};
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.theta, &p.initial_state})
    *input = stage(*input, outputs);
  const TensorView d_o_in = stage(d_o, outputs), d_final_in = stage(d_final_state, outputs);

  const auto run = [&](auto zero) {
    using C = decltype(zero);
    const std::int64_t K = p.K, tiles = shape.tiles, CS = p.chunk_size;
    const std::int64_t tile_elements = K * kColumns;
    const std::int64_t slots = p.num_sequences() + ceil_div(p.B * p.T, CS);
    const std::int64_t checkpoints = slots * p.H * tiles * tile_elements;
    const std::int64_t states = p.num_work_items() * tiles * (CS + 1) * tile_elements;
    const bool rotate =
        p.theta.defined() && (grads.dq.defined() || grads.dk.defined() || grads.dtheta.defined());
    const std::int64_t partials = tiles * p.B * p.T * p.H * K;
    const std::int64_t dq = grads.dq.defined() || rotate ? partials : 0,
                       dk = grads.dk.defined() || rotate ? partials : 0,
                       dg = grads.dg.defined() ? partials : 0;
    const std::int64_t adjoint = p.num_work_items() * tiles * tile_elements;
    const std::int64_t total = checkpoints + states + adjoint + dq + dk + dg;
    simt::Workspace workspace(static_cast<std::size_t>(total) * sizeof(C), stream);
    const simt::Span<C> all = workspace.span<C>(total);
    BackwardSpace<C> space;
    std::int64_t offset = 0;
    const auto take = [&](std::int64_t count) {
      const simt::Span<C> part{all.data + offset, count};
      offset += count;
      return part;
    };
    space.checkpoints = {take(checkpoints), CS, p.H, K, tiles};
    space.states = take(states);
    space.adjoint = take(adjoint);
    space.dq = take(dq);
    space.dk = take(dk);
    space.dg = take(dg);
    space.tiles = tiles;
    const std::size_t bytes = shared_bytes(p, shape.warps, sizeof(C));
    // The replay: the forward recurrence writes the checkpoints (no o, no final state).
    PHASOR_LAUNCH((forward_kernel<C>), shape.grid, shape.block, bytes, stream, p, TensorView{},
                  TensorView{}, space.checkpoints);
    PHASOR_LAUNCH((backward_kernel<C>), shape.grid, shape.block, bytes, stream, p, d_o_in,
                  d_final_in, grads.dv, grads.dh0, space);
    const std::int64_t units = (p.theta.defined() ? K / 2 : K) * p.B * p.T * p.H;
    if (units > 0 && (dq > 0 || dk > 0 || dg > 0)) {
      constexpr int kThreads = 256;
      PHASOR_LAUNCH((finish_kernel<C>),
                    simt::Dim3(static_cast<unsigned>(ceil_div(units, kThreads))),
                    simt::Dim3(kThreads), 0, stream, p, space, grads);
    }
  };
  if (p.q.dtype == DType::float64)
    run(double{});
  else
    run(float{});
}

}  // namespace phasor::PHASOR_BACKEND::gla
