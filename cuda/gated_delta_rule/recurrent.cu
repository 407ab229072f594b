// Gated DeltaNet's recurrent kernels on the GPU (cuda/gated_delta_rule/gated_delta_rule.h),
// written once for nvcc and the emulated GPU. They compute what src/gated_delta_rule/recurrent.cpp
// computes, in the compute type C of q (double for float64 q, else float):
//   S' = a_t S_{t−1} (a_t = exp(g_t)),  S_t = S' + β_t k̂_t (v_t − S'ᵀ k̂_t)ᵀ,  o_t = S_tᵀ q̃_t,
// with q̂, k̂ = q, k (ℓ2-normalised x / sqrt(Σx² + 1e-6) when use_qk_l2norm_in_kernel), rotated by
// θ_t when given ((R1) of src/common/rotation.h, after the normalisation as on the CPU), and
// q̃ = scale · q̂. Value head hv reads q/k head hv / G (G = HV / H).
//
// Mapping (as cuda/gla/recurrent.cu): one block per (sequence n, value head hv, tile of 32 value
// columns); lane = value column, warp w owns key rows [16w, 16w + 16) of the state tile, held in
// registers (K ≤ 256, at most 16 warps). Per token the block stages q̂, k̂ (normalised by warp 0's
// sums of squares, then rotated), a, β and its slice of v in shared memory. u = S_{t−1}ᵀ k̂ is a sum
// over key rows: each warp's share goes to shared memory and every thread adds the shares in warp
// order (the same value in every thread, every run); then r = β (v − a u), S_t = a S_{t−1} + k̂ rᵀ,
// and o's shares are summed the same way.
//
// Backward, as the CPU kernel (checkpoints every min(chunk_size, 64) tokens, written by a replay of
// the forward kernel; each segment's states recomputed into a per-block workspace; dS carried back
// in a per-thread workspace tile, which keeps the kernel within 128 registers), per step:
//   dq̃_t = S_t do_t,  dS += q̃_t do_tᵀ,  w = dSᵀk̂,  r = v − a S_{t−1}ᵀ k̂,
//   dv = β w,  dβ = w·r,  dk̂ = β (dS r − a S_{t−1} w),
//   dS' = dS − β k̂ wᵀ,  dg = a Σ S_{t−1} ⊙ dS',  ∂L/∂S_{t−1} = a dS'.
// w and S_{t−1}ᵀk̂ are sums over key rows (warp shares in warp order, as u); dv is complete in the
// block. dq̃, dk̂ (per key row), dβ and dg's sum (per token) are sums over value columns: each warp
// sums its lanes with fixed butterflies of shuffles (8 key rows at once: transpose_sum) and writes
// a partial per value tile (and value head) to a workspace. Finishing kernels add them in a fixed
// order (value heads of a group, then tiles), apply scale, the ℓ2-norm backward (ρ (dx̂ − x̂ (x̂·dx̂)),
// and ερ³ dx̂ for K = 1), the un-rotation and dθ ((R2), (R3)), and a · Σ for dg. No atomics:
// bit-identical run to run.
//
// Workspace of the backward (compute type C): checkpoints (N + ⌈B·T / C⌉) · HV · K · 32·tiles
// (C = min(chunk_size, 64); Checkpoints in cuda/common/recurrent.h), segment states and dS
// N·HV·tiles · (C + 2) · K · 32, partials 2 · tiles · G · B·T·H·K (dq̃, dk̂) + 2 · tiles · B·T·HV
// (dβ, dg), only those asked for.
#include <algorithm>
#include <string>

#include "common/recurrent.h"
#include "common/staging.h"
#include "gated_delta_rule/gated_delta_rule.h"
#include "gated_delta_rule/qk_grads.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::gdn {
namespace {

using ::phasor::detail::Sequence;
using ::phasor::detail::gdn::Problem;

constexpr int kColumns = 32;         // value columns per block: threadIdx.x
constexpr int kRows = 16;            // key rows per thread
constexpr int kMaxWarps = 16;        // threadIdx.y: ≤ 512 threads, so ≤ 128 registers each
constexpr std::int64_t kMaxK = 256;  // kRows × kMaxWarps
constexpr std::int64_t kMaxTiles = 65535;
constexpr std::int64_t kMaxSegment = 64;  // the backward's checkpoint interval, at most

// Dynamic shared memory: q̂[K], k̂[K], v[32], do[32], two arrays of warp shares [warps · 32],
// and 4 scalars (a, β, ρ_q, ρ_k).
std::size_t shared_bytes(const Problem& p, int warps, std::size_t element) {
  return static_cast<std::size_t>(2 * p.K + 2 * kColumns + 2 * warps * kColumns + 4) * element;
}

struct SharedLayout {
  std::size_t q, k, v, d_o, shares, shares2, scalars;
};
template <class C>
PHASOR_DEVICE SharedLayout layout_of(const Problem& p, int warps) {
  const std::size_t K = static_cast<std::size_t>(p.K), e = sizeof(C),
                    W = static_cast<std::size_t>(warps) * kColumns;
  return {0,
          K * e,
          2 * K * e,
          (2 * K + kColumns) * e,
          (2 * K + 2 * kColumns) * e,
          (2 * K + 2 * kColumns + W) * e,
          (2 * K + 2 * kColumns + 2 * W) * e};
}

// The shared arrays of a kernel and the staging of one token.
template <class C>
struct Token {
  simt::SharedArray<C> q, k, v, d_o, shares, shares2, scalars;

  // Stages token t (position `pos` of batch row b) of value head hv: q̂ (if with_q), k̂, a, β,
  // v's column j (0 outside V) and, if with_do, do's. Ends with a barrier.
  PHASOR_DEVICE void stage(const Problem& p, std::int64_t b, std::int64_t pos, std::int64_t hv,
                           std::int64_t j, bool with_q, const TensorView& d_o_view) const {
    const std::int64_t h = hv / p.group;
    const std::int64_t tid = threadIdx.y * kColumns + threadIdx.x,
                       threads = static_cast<std::int64_t>(blockDim.x) * blockDim.y;
    const bool column = j < p.V;
    if (tid == 0) {
      scalars[0] = simt::exp(simt::load<C>(p.g, b, pos, hv));
      scalars[1] = simt::load<C>(p.beta, b, pos, hv);
      if (p.l2norm) {
        scalars[2] = with_q ? inverse_norm<C>(p, p.q, b, pos, h) : C(1);
        scalars[3] = inverse_norm<C>(p, p.k, b, pos, h);
      }
    }
    if (threadIdx.y == 0) {
      v[threadIdx.x] = column ? simt::load<C>(p.v, b, pos, hv, j) : C(0);
      if (d_o_view.defined())
        d_o[threadIdx.x] = column ? simt::load<C>(d_o_view, b, pos, hv, j) : C(0);
    }
    if (p.l2norm) simt::syncthreads();  // ρ_q, ρ_k
    const C rho_q = p.l2norm ? C(scalars[2]) : C(1), rho_k = p.l2norm ? C(scalars[3]) : C(1);
    const auto normalised = [&](const TensorView& x, std::int64_t a, C rho) {
      const C value = simt::load<C>(x, b, pos, h, a);
      return p.l2norm ? value * rho : value;
    };
    if (!p.theta.defined()) {
      for (std::int64_t a = tid; a < p.K; a += threads) {
        if (with_q) q[a] = normalised(p.q, a, rho_q);
        k[a] = normalised(p.k, a, rho_k);
      }
    } else {
      for (std::int64_t i = tid; i < p.K / 2; i += threads) {
        C c, s;
        angle_of(p.theta, b, pos, h, i, c, s);
        const std::int64_t ia = pair_a(p.rotary_layout, p.K, i),
                           ib = pair_b(p.rotary_layout, p.K, i);
        if (with_q) {
          const C xa = normalised(p.q, ia, rho_q), xb = normalised(p.q, ib, rho_q);
          q[ia] = xa * c - xb * s;  // (R1)
          q[ib] = xa * s + xb * c;
        }
        const C xa = normalised(p.k, ia, rho_k), xb = normalised(p.k, ib, rho_k);
        k[ia] = xa * c - xb * s;
        k[ib] = xa * s + xb * c;
      }
    }
    simt::syncthreads();
  }

  // Σ over the warps' shares of this lane's column, in warp order: the same in every thread.
  PHASOR_DEVICE C sum_shares(const simt::SharedArray<C>& array, int warps) const {
    C sum = 0;
    for (int w = 0; w < warps; ++w) {
      const C share = array[w * kColumns + threadIdx.x];
      sum += share;
    }
    return sum;
  }
};

#define PHASOR_GDN_SHARED(C, p, warps)                                  \
  const SharedLayout at = layout_of<C>(p, warps);                       \
  PHASOR_DYNAMIC_SHARED_AT(C, q_s, at.q, p.K);                          \
  PHASOR_DYNAMIC_SHARED_AT(C, k_s, at.k, p.K);                          \
  PHASOR_DYNAMIC_SHARED_AT(C, v_s, at.v, kColumns);                     \
  PHASOR_DYNAMIC_SHARED_AT(C, do_s, at.d_o, kColumns);                  \
  PHASOR_DYNAMIC_SHARED_AT(C, shares_s, at.shares, (warps)*kColumns);   \
  PHASOR_DYNAMIC_SHARED_AT(C, shares2_s, at.shares2, (warps)*kColumns); \
  PHASOR_DYNAMIC_SHARED_AT(C, scalars_s, at.scalars, 4);                \
  const Token<C> token {                                                \
    q_s, k_s, v_s, do_s, shares_s, shares2_s, scalars_s                 \
  }

// Runs body(r) for this thread's rows r < kRows: unrolled when the rows live in a register array
// (kInRegisters), as a loop when they live in memory (unrolling would only hold every row's
// temporaries in registers at once).
template <bool kInRegisters, class Body>
PHASOR_DEVICE void for_each_row(Body&& body) {
  if constexpr (kInRegisters) {
    PHASOR_UNROLL
    for (int r = 0; r < kRows; ++r) body(r);
  } else {
    PHASOR_NO_UNROLL
    for (int r = 0; r < kRows; ++r) body(r);
  }
}

// One step of the recurrence for this thread's rows: S ← a S + k̂ rᵀ with r = β (v − a S_{t−1}ᵀk̂);
// returns this lane's o_t when with_q. `previous(r)` is row r's S_{t−1} and `next(r)` where its
// S_t goes: the same register for the forward (kInRegisters), consecutive workspace states for
// the backward's recomputation. Contains barriers: every thread of the block calls it.
template <class C, bool kInRegisters, class Previous, class Next>
PHASOR_DEVICE C advance(const Problem& p, const Token<C>& token, Previous&& previous, Next&& next,
                        C scale, bool with_q) {
  const int warp = threadIdx.y, warps = blockDim.y;
  const C a = token.scalars[0], beta = token.scalars[1], v_j = token.v[threadIdx.x];
  C share = 0;
  for_each_row<kInRegisters>([&](int r) {
    const std::int64_t row = static_cast<std::int64_t>(warp) * kRows + r;
    if (row >= p.K) return;
    const C k_a = token.k[row];
    share += k_a * previous(r);
  });
  token.shares[warp * kColumns + threadIdx.x] = share;
  simt::syncthreads();
  const C u = token.sum_shares(token.shares, warps);  // S_{t−1}ᵀ k̂
  const C rb = beta * (v_j - a * u);                  // β r
  C out = 0;
  for_each_row<kInRegisters>([&](int r) {
    const std::int64_t row = static_cast<std::int64_t>(warp) * kRows + r;
    if (row >= p.K) return;
    const C k_a = token.k[row];
    const C updated = a * previous(r) + k_a * rb;
    next(r) = updated;
    if (with_q) {
      const C q_a = token.q[row];
      out += (scale * q_a) * updated;
    }
  });
  return out;
}

// ---- forward ------------------------------------------------------------------------------------

// The forward recurrence; o is written when defined (the backward's replay runs it without o,
// to write the checkpoints).
template <class C>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kMaxWarps* kColumns)
    forward_kernel(Problem p, TensorView o, TensorView final_state, Checkpoints<C> checkpoints) {
  const std::int64_t n = blockIdx.x / p.HV, hv = blockIdx.x % p.HV, tile = blockIdx.y;
  const int lane = threadIdx.x, warp = threadIdx.y, warps = blockDim.y;
  const std::int64_t j = tile * kColumns + lane;
  const bool column = j < p.V, output = o.defined();
  PHASOR_GDN_SHARED(C, p, warps);
  const C scale = static_cast<C>(p.scale);
  const Sequence s = p.sequences[n];
  C state[kRows];
  PHASOR_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
    state[r] = column && a < p.K && p.initial_state.defined()
                   ? simt::load<C>(p.initial_state, n, hv, a, j)
                   : C(0);
  }
  const auto row = [&](int r) -> C& { return state[r]; };
  // The next token whose incoming state is a checkpoint, and its slot (none without checkpoints).
  std::int64_t next_checkpoint = checkpoints.states.size > 0 ? 0 : -1;
  std::int64_t slot =
      checkpoints.states.size > 0 ? checkpoints.first_slot(n, s.batch * p.T + s.start) : 0;
  for (std::int64_t t = 0; t < s.length; ++t) {
    if (t == next_checkpoint) {
      PHASOR_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
        if (a < p.K) checkpoints.states[checkpoints.element(slot, hv, tile, a, lane)] = state[r];
      }
      ++slot;
      next_checkpoint += checkpoints.interval;
    }
    token.stage(p, s.batch, s.start + t, hv, j, output, TensorView{});
    const C share = advance<C, true>(p, token, row, row, scale, output);
    if (output) {
      shares2_s[warp * kColumns + lane] = share;
      simt::syncthreads();
      if (warp == 0 && column)
        simt::store(o, token.sum_shares(shares2_s, warps), s.batch, s.start + t, hv, j);
    }
    simt::syncthreads();  // the shares and the staged token are reused by the next token
  }
  if (final_state.defined() && column) PHASOR_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = static_cast<std::int64_t>(warp) * kRows + r;
    if (a < p.K) simt::store(final_state, state[r], n, hv, a, j);
  }
}

// ---- backward -----------------------------------------------------------------------------------

template <class C>
struct BackwardSpace {
  Checkpoints<C> checkpoints;  // written by forward_kernel
  simt::Span<C> states;        // [block][chunk + 1][K][32]
  simt::Span<C> adjoint;       // [block][K][32]: dS
  simt::Span<C> dq, dk;        // [tile][G][B·T][H][K]: dq̃, dk̂ partials
  simt::Span<C> dbeta, dg;     // [tile][B·T][HV]: dβ and Σ S_{t−1} ⊙ dS' partials
  std::int64_t tiles = 0;
};

template <class C>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kMaxWarps* kColumns)
    backward_kernel(Problem p, TensorView d_o, TensorView d_final_state, TensorView dv,
                    TensorView dh0, BackwardSpace<C> space) {
  const std::int64_t n = blockIdx.x / p.HV, hv = blockIdx.x % p.HV, tile = blockIdx.y;
  const std::int64_t h = hv / p.group, member = hv % p.group;
  const int lane = threadIdx.x, warp = threadIdx.y, warps = blockDim.y;
  const std::int64_t j = tile * kColumns + lane;
  const bool column = j < p.V;
  PHASOR_GDN_SHARED(C, p, warps);
  const C scale = static_cast<C>(p.scale);
  const Sequence s = p.sequences[n];
  const std::int64_t CS = p.chunk_size, K = p.K, BT = p.B * p.T;
  const std::int64_t segments = ceil_div(s.length, CS);
  const std::int64_t first = s.batch * p.T + s.start;
  const std::int64_t block = static_cast<std::int64_t>(blockIdx.x) * space.tiles + tile;
  const std::int64_t row0 = static_cast<std::int64_t>(warp) * kRows;  // this warp's first row
  const auto element = [&](std::int64_t base, std::int64_t a) {
    return (base + a) * kColumns + lane;
  };
  const auto state_base = [&](std::int64_t t) { return (block * (CS + 1) + t) * K; };
  // dS of this thread's rows lives in its own tile of the workspace, not in registers, and the
  // segment's states are read back by the thread that wrote them: with a 16-row register tile
  // beside the staged token and the column sums, the kernel would need more than the 128
  // registers a 512-thread block allows (ptxas then spills). Only this thread touches these
  // elements, so no synchronisation is needed; they stay in L1.
  const auto ds = [&](int r) -> C& { return space.adjoint[element(block * K, row0 + r)]; };
  const auto state = [&](std::int64_t t, int r) -> C& {
    return space.states[element(state_base(t), row0 + r)];
  };

  // Segments in reverse; ds holds dS, the gradient of the state after the token at hand.
  PHASOR_NO_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = row0 + r;
    if (a < K)
      ds(r) = column && d_final_state.defined() ? simt::load<C>(d_final_state, n, hv, a, j) : C(0);
  }
  for (std::int64_t i = segments - 1; i >= 0; --i) {
    const std::int64_t L = std::min(CS, s.length - i * CS);
    // The segment's states: states[0] = its checkpoint, states[t + 1] = the state after token t.
    const std::int64_t slot = space.checkpoints.first_slot(n, first) + i;
    PHASOR_NO_UNROLL
    for (int r = 0; r < kRows; ++r)
      if (row0 + r < K)
        state(0, r) =
            space.checkpoints.states[space.checkpoints.element(slot, hv, tile, row0 + r, lane)];
    for (std::int64_t t = 0; t < L; ++t) {
      token.stage(p, s.batch, s.start + i * CS + t, hv, j, false, TensorView{});
      advance<C, false>(
          p, token, [&](int r) -> C& { return state(t, r); },
          [&](int r) -> C& { return state(t + 1, r); }, C(0), false);
      simt::syncthreads();
    }
    for (std::int64_t t = L - 1; t >= 0; --t) {
      const std::int64_t pos = s.start + i * CS + t, flat = s.batch * p.T + pos;
      token.stage(p, s.batch, pos, hv, j, true, d_o);
      const C a = scalars_s[0], beta = scalars_s[1], v_j = v_s[lane], do_j = do_s[lane];
      const std::int64_t qk_part = (((tile * p.group + member) * BT + flat) * p.H + h) * K + row0;
      // The sums over value columns of kSumRows rows of the warp at once (transpose_sum); the
      // first lane of each row's group stores its partial.
      constexpr int kSumRows = 8, kLanesPerRow = kColumns / kSumRows;
      const int sum_row = row_of_lane<kSumRows>(lane);
      const auto store_sums = [&](const simt::Span<C>& partials, auto&& value) {
        PHASOR_NO_UNROLL
        for (int part = 0; part < kRows / kSumRows; ++part) {
          C x[kSumRows];
          PHASOR_UNROLL
          for (int r = 0; r < kSumRows; ++r)
            x[r] = row0 + part * kSumRows + r < K ? value(part * kSumRows + r) : C(0);
          const C sum = transpose_sum(x, lane);
          if (lane % kLanesPerRow == 0 && row0 + part * kSumRows + sum_row < K)
            partials[qk_part + part * kSumRows + sum_row] = sum;
        }
      };
      // dS += q̃ doᵀ; the warps' shares of w = dSᵀk̂ and S_{t−1}ᵀk̂; dq̃ = S_t do.
      C w_share = 0, kS_share = 0;
      PHASOR_NO_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t row = row0 + r;
        if (row >= K) continue;  // uniform across the warp
        const C q_a = q_s[row], k_a = k_s[row];
        ds(r) += (scale * q_a) * do_j;
        w_share += k_a * ds(r);
        kS_share += k_a * state(t, r);
      }
      if (space.dq.size > 0)
        store_sums(space.dq, [&](int r) { return column ? state(t + 1, r) * do_j : C(0); });
      shares_s[warp * kColumns + lane] = w_share;
      shares2_s[warp * kColumns + lane] = kS_share;
      simt::syncthreads();
      const C w = column ? token.sum_shares(shares_s, warps) : C(0);
      const C r_j = column ? v_j - a * token.sum_shares(shares2_s, warps) : C(0);
      // dk̂ = β (dS r − a S_{t−1} w); dS' = dS − β k̂ wᵀ; Σ S_{t−1} ⊙ dS'; dS ← a dS'.
      if (space.dk.size > 0)
        store_sums(space.dk, [&](int r) { return beta * (ds(r) * r_j - a * state(t, r) * w); });
      C dg_share = 0;
      PHASOR_NO_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t row = row0 + r;
        if (row >= K) continue;
        const C k_a = k_s[row];
        ds(r) -= (beta * k_a) * w;  // dS'
        dg_share += state(t, r) * ds(r);
        ds(r) *= a;
      }
      if (column && warp == 0 && dv.defined()) simt::store(dv, beta * w, s.batch, pos, hv, j);
      const C dbeta_lane = lane_sum<C>(w * r_j), dg_lane = lane_sum<C>(dg_share);
      simt::syncthreads();  // shares read by every thread above
      if (lane == 0) shares_s[warp * kColumns] = dg_lane;
      simt::syncthreads();
      if (warp == 0 && lane == 0) {
        const std::int64_t v_part = (tile * BT + flat) * p.HV + hv;
        if (space.dbeta.size > 0) space.dbeta[v_part] = dbeta_lane;
        if (space.dg.size > 0) {
          C sum = 0;
          for (int w2 = 0; w2 < warps; ++w2) {
            const C part = shares_s[w2 * kColumns];
            sum += part;
          }
          space.dg[v_part] = sum;
        }
      }
      simt::syncthreads();
    }
  }
  if (dh0.defined() && column) PHASOR_NO_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t a = row0 + r;
    if (a < K) simt::store(dh0, ds(r), n, hv, a, j);
  }
}

// dβ and dg of one (token, value head): the tiles' partials in tile order.
template <class C>
PHASOR_GLOBAL void finish_value_kernel(Problem p, BackwardSpace<C> space, TensorView dbeta,
                                       TensorView dg) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t BT = p.B * p.T;
  if (e >= BT * p.HV) return;
  const std::int64_t hv = e % p.HV, flat = e / p.HV, b = flat / p.T, t = flat % p.T;
  C beta_sum = 0, dg_sum = 0;
  for (std::int64_t tile = 0; tile < space.tiles; ++tile) {
    if (dbeta.defined()) beta_sum += space.dbeta[tile * BT * p.HV + e];
    if (dg.defined()) dg_sum += space.dg[tile * BT * p.HV + e];
  }
  if (dbeta.defined()) simt::store(dbeta, beta_sum, b, t, hv);
  if (dg.defined()) simt::store(dg, simt::exp(simt::load<C>(p.g, b, t, hv)) * dg_sum, b, t, hv);
}

struct Shape {
  simt::Dim3 grid, block;
  std::int64_t tiles;
  int warps;
};
Shape shape_of(const Problem& p) {
  const char* op = "fused_recurrent_gated_delta_rule";
  if (p.K > kMaxK)
    throw Error(std::string(op) + " on the GPU: argument 'q': expected a head dimension K ≤ " +
                std::to_string(kMaxK) + ", got K = " + std::to_string(p.K));
  const std::int64_t tiles = ceil_div(p.V, kColumns);
  if (tiles > kMaxTiles)
    throw Error(std::string(op) + " on the GPU: argument 'v': expected V ≤ " +
                std::to_string(kMaxTiles * kColumns) + ", got V = " + std::to_string(p.V));
  const int warps = static_cast<int>(std::max<std::int64_t>(1, ceil_div(p.K, kRows)));
  return {simt::Dim3(static_cast<unsigned>(p.num_sequences() * p.HV), static_cast<unsigned>(tiles)),
          simt::Dim3(kColumns, static_cast<unsigned>(warps)), tiles, warps};
}

}  // namespace

void recurrent_forward(const Problem& problem, const TensorView& o, const TensorView& final_state) {
  const Shape shape = shape_of(problem);
  if (problem.num_sequences() * problem.HV == 0 || problem.V == 0) return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.theta, &p.initial_state})
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
                        const TensorView& d_final_state, const GatedDeltaRuleGrads& grads) {
  const Shape shape = shape_of(problem);
  if (problem.num_sequences() * problem.HV == 0) return;
  if (problem.V == 0) {  // no values: o and the state are empty, the other gradients are zero
    zero_views({grads.dq, grads.dk, grads.dg, grads.dbeta, grads.dtheta}, cuda::current_stream());
    return;
  }
  if (!grads.dq.defined() && !grads.dk.defined() && !grads.dv.defined() && !grads.dg.defined() &&
      !grads.dbeta.defined() && !grads.dh0.defined() && !grads.dtheta.defined())
    return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  p.chunk_size = std::min(p.chunk_size, kMaxSegment);
  const std::initializer_list<TensorView> outputs = {grads.dq,    grads.dk,  grads.dv,    grads.dg,
                                                     grads.dbeta, grads.dh0, grads.dtheta};
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.theta, &p.initial_state})
    *input = stage(*input, outputs);
  const TensorView d_o_in = stage(d_o, outputs), d_final_in = stage(d_final_state, outputs);

  const auto run = [&](auto zero) {
    using C = decltype(zero);
    const std::int64_t K = p.K, tiles = shape.tiles, CS = p.chunk_size, BT = p.B * p.T;
    const std::int64_t tile_elements = K * kColumns;
    const std::int64_t slots = p.num_sequences() + ceil_div(BT, CS);
    const std::int64_t checkpoints = slots * p.HV * tiles * tile_elements;
    const std::int64_t states = p.num_sequences() * p.HV * tiles * (CS + 1) * tile_elements;
    const std::int64_t adjoint = p.num_sequences() * p.HV * tiles * tile_elements;
    const bool want_dtheta = p.theta.defined() && grads.dtheta.defined();
    const std::int64_t qk_parts = tiles * p.group * BT * p.H * K, v_parts = tiles * BT * p.HV;
    const std::int64_t dq = grads.dq.defined() || want_dtheta ? qk_parts : 0,
                       dk = grads.dk.defined() || want_dtheta ? qk_parts : 0,
                       dbeta = grads.dbeta.defined() ? v_parts : 0,
                       dg = grads.dg.defined() ? v_parts : 0;
    const std::int64_t total = checkpoints + states + adjoint + dq + dk + dbeta + dg;
    simt::Workspace workspace(static_cast<std::size_t>(total) * sizeof(C), stream);
    const simt::Span<C> all = workspace.span<C>(total);
    std::int64_t offset = 0;
    const auto take = [&](std::int64_t count) {
      const simt::Span<C> part{all.data + offset, count};
      offset += count;
      return part;
    };
    BackwardSpace<C> space;
    space.checkpoints = {take(checkpoints), CS, p.HV, K, tiles};
    space.states = take(states);
    space.adjoint = take(adjoint);
    space.dq = take(dq);
    space.dk = take(dk);
    space.dbeta = take(dbeta);
    space.dg = take(dg);
    space.tiles = tiles;
    const std::size_t bytes = shared_bytes(p, shape.warps, sizeof(C));
    // The replay: the forward recurrence writes the checkpoints (no o, no final state).
    PHASOR_LAUNCH((forward_kernel<C>), shape.grid, shape.block, bytes, stream, p, TensorView{},
                  TensorView{}, space.checkpoints);
    PHASOR_LAUNCH((backward_kernel<C>), shape.grid, shape.block, bytes, stream, p, d_o_in,
                  d_final_in, grads.dv, grads.dh0, space);
    constexpr int kThreads = 256;
    if ((dbeta > 0 || dg > 0) && BT * p.HV > 0)
      PHASOR_LAUNCH((finish_value_kernel<C>),
                    simt::Dim3(static_cast<unsigned>(ceil_div(BT * p.HV, kThreads))),
                    simt::Dim3(kThreads), 0, stream, p, space, grads.dbeta, grads.dg);
    if ((dq > 0 || dk > 0) && BT * p.H > 0)
      PHASOR_LAUNCH((finish_qk_kernel<C>),
                    simt::Dim3(static_cast<unsigned>(ceil_div(BT * p.H, kThreads))),
                    simt::Dim3(kThreads), 0, stream, p,
                    QkPartials<C>{space.dq, space.dk, space.tiles, p.group}, grads);
  };
  if (p.q.dtype == DType::float64)
    run(double{});
  else
    run(float{});
}

}  // namespace phasor::PHASOR_BACKEND::gdn
