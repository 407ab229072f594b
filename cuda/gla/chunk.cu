// GLA's chunk kernels on the GPU (chunk_gla; cuda/gla/gla.h), written once for nvcc and the
// emulated GPU. They compute what src/gla/chunk.cpp computes — the same chunk decomposition, the
// same sub-blocks of 16 tokens, the same stable gate factors and the same dg — split into
// kernels the way fla's chunk_gla is (see that file's comment for the equations):
//
//   states   (sequence, head, key tile, value tile), chunks in order: the state S before every
//            chunk is written to a workspace; S ← diag(P_last) S + (k ⊙ E)ᵀ v.
//   intra    (chunk, head): the chunk's lower-triangular A = scale · Σ_k q_ik k_jk D_ij,k —
//            off-diagonal strips of each 16-row query block as one matrix product
//            (q ⊙ f_q)(k ⊙ f_k)ᵀ, diagonal blocks as running products of exp(g).
//   output   (chunk, head, value tile): o = scale (q ⊙ P) S + A v.
// and for the backward (after states and intra again):
//   dstates  (sequence, head, key tile, value tile), chunks in reverse: dS after every chunk;
//            dS ← diag(P_last) dS + scale (q ⊙ P)ᵀ do; dh0 at the end.
//   dattn    (chunk, head): dA = do vᵀ.
//   dv       (chunk, head, value tile): dv = (k ⊙ E) dS + Aᵀ do.
//   dqk      (chunk, head, key tile): dq, dk, dg and dθ of the tile's channels: the inter-chunk
//            parts from S and dS, the strips' and diagonal blocks' parts from dA, and the stable
//            dg that sums only the paths through each step t, all per channel.
//
// Matrix products run through cuda/common/gemm.h: on tensor cores (mma.sync m16n8k16) with each
// operand rounded to q's 16-bit type for bfloat16 / float16 inputs, as exact FMA tiles in float32
// for float32 inputs (the CPU's 1e-5 bound) and in float64 for float64. Accumulation, the
// states, A, dA and every gate factor are float32 (float64 for float64 inputs). Each block reads
// and writes its own tiles only, and every sum runs in a fixed order: no atomics, bit-identical
// results run to run.
//
// Key tiles hold whole rotation pairs when θ is given (columns [0, BK/2) the pairs' first
// members, [BK/2, BK) their partners), so q and k are rotated on load ((R1)) and dq, dk turned
// into the inputs' gradients and dθ ((R2), (R3)) inside the tile.
//
// Chunk sizes 16, 32 and 64 (a chunk_size below 16 — a sequence shorter than the requested chunk
// — runs with 16; the result does not depend on it beyond rounding). Workspace (compute type):
// the states (and in the backward their gradients) S · H · K · V each, and A (and dA)
// S · H · C · C, with S chunk slots (Sequences::chunk_slot_count, cuda/common/chunks.h).
#include <algorithm>
#include <string>
#include <type_traits>

#include "common/chunks.h"
#include "common/fill.h"
#include "common/gemm.h"
#include "common/recurrent.h"
#include "common/staging.h"
#include "gla/gla.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::gla {
namespace {

using ::phasor::detail::gla::Problem;

constexpr int kThreads = 128;  // 4 warps
constexpr int kSub = 16;       // the sub-block of the intra-chunk part (src/gla/chunk.cpp)

// Key and value tile width: 32 channels (16 in float64, for shared memory).
template <class O>
constexpr int kTile = std::is_same_v<O, double> ? 16 : 32;

// ---- the chunk of a block, channel tiles, loads ------------------------------------------------

PHASOR_DEVICE Chunk chunk_of(const Problem& p, int C, std::int64_t n, std::int64_t c) {
  return chunk_at(p.sequences, C, n, c);
}

// out (C × BK, row-major) = rows of q or k of the chunk for key tile t, rotated by θ when given;
// 0 past the chunk and the channels.
template <class A, int BK>
PHASOR_DEVICE void load_keys(const Problem& p, const TensorView& x, const Chunk& ch, std::int64_t h,
                             std::int64_t t, int C, const simt::SharedArray<A>& out) {
  const int tid = static_cast<int>(threadIdx.x);
  if (!p.theta.defined()) {  // channels t·BK + i
    load_token_rows<A, BK>(x, ch.batch, ch.first, ch.len, C, h, t * BK, p.K - t * BK, out);
    return;
  }
  constexpr int R = BK / 2;
  for (int e = tid; e < C * R; e += kThreads) {
    const int j = e / R, i = e % R;
    const std::int64_t pair = t * R + i;
    A ya = 0, yb = 0;
    if (j < ch.len && pair < p.K / 2) {
      A c, s;
      angle_of(p.theta, ch.batch, ch.first + j, h, pair, c, s);
      const A xa = simt::load<A>(x, ch.batch, ch.first + j, h, pair_a(p.rotary_layout, p.K, pair));
      const A xb = simt::load<A>(x, ch.batch, ch.first + j, h, pair_b(p.rotary_layout, p.K, pair));
      ya = xa * c - xb * s;  // (R1)
      yb = xa * s + xb * c;
    }
    out[j * BK + i] = ya;
    out[j * BK + R + i] = yb;
  }
}

// out (C × BK) = the chunk's log gates of key tile t (0 outside).
template <class A, int BK>
PHASOR_DEVICE void load_gates(const Problem& p, const Chunk& ch, std::int64_t h, std::int64_t t,
                              int C, const simt::SharedArray<A>& out) {
  if (!p.theta.defined()) {  // channels t·BK + i
    load_token_rows<A, BK>(p.g, ch.batch, ch.first, ch.len, C, h, t * BK, p.K - t * BK, out);
    return;
  }
  fill_shared<A>(C * BK, out, [&](int e) {
    const int j = e / BK, i = e % BK;
    const std::int64_t channel = channel_of<BK>(p, t, i);
    return j < ch.len && channel >= 0 ? simt::load<A>(p.g, ch.batch, ch.first + j, h, channel)
                                      : A(0);
  });
}

// out (C × BV) = the chunk's rows of x ([B, T, H, V]) in value tile t (0 outside).
template <class A, int BV>
PHASOR_DEVICE void load_values(const Problem& p, const TensorView& x, const Chunk& ch,
                               std::int64_t h, std::int64_t t, int C,
                               const simt::SharedArray<A>& out) {
  load_token_rows<A, BV>(x, ch.batch, ch.first, ch.len, C, h, t * BV, p.V - t * BV, out);
}

// A state-shaped tile (BK × BV) of a workspace [slot][H][K][V] (load or store).
template <class A, int BK, int BV>
PHASOR_DEVICE void load_state_tile(const Problem& p, const simt::Span<A>& states, std::int64_t slot,
                                   std::int64_t h, std::int64_t kt, std::int64_t vt,
                                   const simt::SharedArray<A>& out) {
  fill_shared<A>(BK * BV, out, [&](int e) {
    const int i = e / BV, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    return channel >= 0 && column < p.V ? states[((slot * p.H + h) * p.K + channel) * p.V + column]
                                        : A(0);
  });
}
template <class A, int BK, int BV>
PHASOR_DEVICE void store_state_tile(const Problem& p, const simt::SharedArray<A>& tile,
                                    const simt::Span<A>& states, std::int64_t slot, std::int64_t h,
                                    std::int64_t kt, std::int64_t vt) {
  for (int e = static_cast<int>(threadIdx.x); e < BK * BV; e += kThreads) {
    const int i = e / BV, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    if (channel >= 0 && column < p.V) {
      const A v = tile[e];
      states[((slot * p.H + h) * p.K + channel) * p.V + column] = v;
    }
  }
}

// ---- gate factors (per channel, one thread each; as the CPU's gate_factors / block_factors) -----

// x[j][i] *= scale · P_j (P_j = exp(Σ_{s ≤ j} g_s)) for the chunk's rows, column i.
template <class A, int BK>
PHASOR_DEVICE void times_prefix(const simt::SharedArray<A>& g, int len, int i,
                                const simt::SharedArray<A>& x, A scale) {
  A running = 0;
  for (int j = 0; j < len; ++j) {
    const A gate = g[j * BK + i];
    running = j == 0 ? gate : running + gate;
    const A v = x[j * BK + i];
    x[j * BK + i] = v * (scale * simt::exp(running));
  }
}
// x[j][i] *= E_j (E_j = exp(Σ_{s ∈ (j, last]} g_s)); returns P_last = exp(g_0 + Σ_{(0, last]} g).
template <class A, int BK>
PHASOR_DEVICE A times_suffix(const simt::SharedArray<A>& g, int len, int i,
                             const simt::SharedArray<A>* x) {
  A running = 0;
  for (int j = len - 1; j >= 0; --j) {
    if (x != nullptr) {
      const A v = (*x)[j * BK + i];
      (*x)[j * BK + i] = v * simt::exp(running);
    }
    if (j > 0) {
      const A gate = g[j * BK + i];
      running += gate;
    }
  }
  const A first = len > 0 ? A(g[i]) : A(0);
  return simt::exp(running + first);
}
// For the query block [r, r + rows): f_q[m] = exp(Σ_{s ∈ (r, r+m]} g_s) and f_k[j] =
// exp(Σ_{s ∈ (j, r]} g_s) (j < r), so that D_{r+m, j} = f_q[m] ⊙ f_k[j]. Column i of
// out_q (rows × BK) = in_q[r + m] ⊙ f_q[m] and of out_k (r × BK) = in_k[j] ⊙ f_k[j]; either
// output may be null, and `divide` multiplies an output in place instead (in_x = out_x).
template <class A, int BK>
PHASOR_DEVICE void query_factors(const simt::SharedArray<A>& g, int r, int rows, int i,
                                 const simt::SharedArray<A>& in, int in_row0,
                                 const simt::SharedArray<A>& out) {
  A running = 0;
  for (int m = 0; m < rows; ++m) {
    if (m > 0) {
      const A gate = g[(r + m) * BK + i];
      running += gate;
    }
    const A v = in[(in_row0 + m) * BK + i];
    out[m * BK + i] = v * simt::exp(running);
  }
}
template <class A, int BK>
PHASOR_DEVICE void key_factors(const simt::SharedArray<A>& g, int r, int i,
                               const simt::SharedArray<A>& in, const simt::SharedArray<A>& out) {
  A running = g[r * BK + i];
  for (int j = r - 1; j >= 0; --j) {
    if (j < r - 1) {
      const A gate = g[(j + 1) * BK + i];
      running += gate;
    }
    const A v = in[j * BK + i];
    out[j * BK + i] = v * simt::exp(running);
  }
}

// ---- forward ------------------------------------------------------------------------------------

// Dynamic shared memory of states_kernel / dstates_kernel: S (BK × BV), x (C × BK), g (C × BK),
// y (C × BV), P_last (BK).
template <class O, int BV>
std::size_t scan_shared_bytes(int C) {
  constexpr int BK = kTile<O>;
  return static_cast<std::size_t>(BK * BV + 2 * C * BK + C * BV + BK) * sizeof(Accumulator<O>);
}

template <class O, int BV>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    states_kernel(Problem p, TensorView final_state, simt::Span<Accumulator<O>> states, int C) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  const std::int64_t n = blockIdx.x / p.H, h = blockIdx.x % p.H, kt = blockIdx.y, vt = blockIdx.z;
  PHASOR_DYNAMIC_SHARED_AT(A, state_s, 0, BK * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, k_s, BK * BV * sizeof(A), C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, g_s, (BK * BV + C * BK) * sizeof(A), C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, v_s, (BK * BV + 2 * C * BK) * sizeof(A), C * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, last_s, (BK * BV + 2 * C * BK + C * BV) * sizeof(A), BK);
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < BK * BV; e += kThreads) {
    const int i = e / BV, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    state_s[e] = p.initial_state.defined() && channel >= 0 && column < p.V
                     ? simt::load<A>(p.initial_state, n, h, channel, column)
                     : A(0);
  }
  const std::int64_t chunks = ceil_div(p.sequences[n].length, C);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const Chunk ch = chunk_of(p, C, n, c);
    simt::syncthreads();
    if (states.size > 0) store_state_tile<A, BK, BV>(p, state_s, states, ch.slot, h, kt, vt);
    load_keys<A, BK>(p, p.k, ch, h, kt, C, k_s);
    load_gates<A, BK>(p, ch, h, kt, C, g_s);
    load_values<A, BV>(p, p.v, ch, h, vt, C, v_s);
    simt::syncthreads();
    if (tid < BK) last_s[tid] = times_suffix<A, BK>(g_s, ch.len, tid, &k_s);  // k ⊙ E, P_last
    simt::syncthreads();
    for (int e = tid; e < BK * BV; e += kThreads) {  // S ← diag(P_last) S
      const A s = state_s[e], last = last_s[e / BV];
      state_s[e] = s * last;
    }
    simt::syncthreads();
    // S += (k ⊙ E)ᵀ v
    gemm_to_shared<O>(row_major(k_s, 0, BK, C, BK).transposed(), row_major(v_s, 0, BV, C, BV), BK,
                      BV, ch.len, state_s, 0, BV, true);
  }
  simt::syncthreads();
  if (final_state.defined())
    for (int e = tid; e < BK * BV; e += kThreads) {
      const int i = e / BV, jj = e % BV;
      const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
      if (channel >= 0 && column < p.V)
        simt::store(final_state, A(state_s[e]), n, h, channel, column);
    }
}

// Dynamic shared memory of intra_kernel: A (C × C), q, k, g, exp(g) (C × BK each), q ⊙ f_q
// (16 × BK), k ⊙ f_k (C × BK).
template <class O>
std::size_t intra_shared_bytes(int C) {
  constexpr int BK = kTile<O>;
  return static_cast<std::size_t>(C * C + 5 * C * BK + kSub * BK) * sizeof(Accumulator<O>);
}

template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    intra_kernel(Problem p, simt::Span<Accumulator<O>> attn, int C) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t h = blockIdx.y;
  const Chunk ch = chunk_of(p, C, n, c);
  const std::size_t e = sizeof(A);
  PHASOR_DYNAMIC_SHARED_AT(A, attn_s, 0, C * C);
  PHASOR_DYNAMIC_SHARED_AT(A, q_s, C * C * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, k_s, (C * C + C * BK) * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, g_s, (C * C + 2 * C * BK) * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, decay_s, (C * C + 3 * C * BK) * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, kf_s, (C * C + 4 * C * BK) * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, qf_s, (C * C + 5 * C * BK) * e, kSub * BK);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  const A scale = static_cast<A>(p.scale);
  for (int x = tid; x < C * C; x += kThreads) attn_s[x] = A(0);
  const std::int64_t tiles = key_tiles<BK>(p);
  for (std::int64_t kt = 0; kt < tiles; ++kt) {
    simt::syncthreads();
    load_keys<A, BK>(p, p.q, ch, h, kt, C, q_s);
    load_keys<A, BK>(p, p.k, ch, h, kt, C, k_s);
    load_gates<A, BK>(p, ch, h, kt, C, g_s);
    simt::syncthreads();
    for (int x = tid; x < C * BK; x += kThreads) {
      const A gate = g_s[x];
      decay_s[x] = simt::exp(gate);
    }
    // Off-diagonal strips: queries [r, r + rows), keys [0, r): scale (q ⊙ f_q)(k ⊙ f_k)ᵀ.
    for (int r = kSub; r < len; r += kSub) {
      const int rows = len - r < kSub ? len - r : kSub;
      simt::syncthreads();
      if (tid < BK) {
        query_factors<A, BK>(g_s, r, rows, tid, q_s, r, qf_s);
        key_factors<A, BK>(g_s, r, tid, k_s, kf_s);
      }
      simt::syncthreads();
      gemm_to_shared<O>(row_major(qf_s, 0, BK, rows, BK),
                        row_major(kf_s, 0, BK, r, BK).transposed(), rows, r, BK, attn_s, r * C, C,
                        true, scale);
    }
    simt::syncthreads();
    // Diagonal blocks: A_ij += scale Σ_k q_ik k_jk D_ij,k for r ≤ j ≤ i < r + 16, D_ij as the
    // running product exp(g_i) exp(g_{i−1}) ⋯ exp(g_{j+1}) (the CPU's order); one thread a pair.
    for (int x = tid; x < len * kSub; x += kThreads) {
      const int i = x / kSub, j = (i / kSub) * kSub + x % kSub;
      if (j > i) continue;
      A sum = 0;
      for (int a = 0; a < BK; ++a) {
        A qd = q_s[i * BK + a];
        for (int s = i; s > j; --s) {
          const A d = decay_s[s * BK + a];
          qd *= d;
        }
        const A k_a = k_s[j * BK + a];
        sum += qd * k_a;
      }
      const A old = attn_s[i * C + j];
      attn_s[i * C + j] = old + scale * sum;
    }
  }
  simt::syncthreads();
  for (int x = tid; x < C * C; x += kThreads) {
    const A v = attn_s[x];
    attn[(ch.slot * p.H + h) * C * C + x] = v;
  }
}

// Dynamic shared memory of output_kernel: o (C × BV), q (C × BK), g (C × BK), S (BK × BV),
// A (C × C), v (C × BV).
template <class O, int BV>
std::size_t output_shared_bytes(int C) {
  constexpr int BK = kTile<O>;
  return static_cast<std::size_t>(2 * C * BV + 2 * C * BK + BK * BV + C * C) *
         sizeof(Accumulator<O>);
}

template <class O, int BV>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    output_kernel(Problem p, TensorView o, simt::Span<Accumulator<O>> states,
                  simt::Span<Accumulator<O>> attn, int C) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t h = blockIdx.y, vt = blockIdx.z;
  const Chunk ch = chunk_of(p, C, n, c);
  const std::size_t e = sizeof(A);
  PHASOR_DYNAMIC_SHARED_AT(A, out_s, 0, C * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, q_s, C * BV * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, g_s, (C * BV + C * BK) * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, state_s, (C * BV + 2 * C * BK) * e, BK * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, attn_s, (C * BV + 2 * C * BK + BK * BV) * e, C * C);
  PHASOR_DYNAMIC_SHARED_AT(A, v_s, (C * BV + 2 * C * BK + BK * BV + C * C) * e, C * BV);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  const A scale = static_cast<A>(p.scale);
  for (int x = tid; x < C * BV; x += kThreads) out_s[x] = A(0);
  const std::int64_t tiles = key_tiles<BK>(p);
  for (std::int64_t kt = 0; kt < tiles; ++kt) {
    simt::syncthreads();
    load_keys<A, BK>(p, p.q, ch, h, kt, C, q_s);
    load_gates<A, BK>(p, ch, h, kt, C, g_s);
    load_state_tile<A, BK, BV>(p, states, ch.slot, h, kt, vt, state_s);
    simt::syncthreads();
    if (tid < BK) times_prefix<A, BK>(g_s, len, tid, q_s, scale);  // scale q ⊙ P
    simt::syncthreads();
    gemm_to_shared<O>(row_major(q_s, 0, BK, len, BK), row_major(state_s, 0, BV, BK, BV), len, BV,
                      BK, out_s, 0, BV, true);
  }
  fill_shared<A>(C * C, attn_s, [&](int x) { return A(attn[(ch.slot * p.H + h) * C * C + x]); });
  load_values<A, BV>(p, p.v, ch, h, vt, C, v_s);
  simt::syncthreads();
  gemm_to_shared<O>(row_major(attn_s, 0, C, len, C), row_major(v_s, 0, BV, C, BV), len, BV, len,
                    out_s, 0, BV, true);
  simt::syncthreads();
  store_token_rows<A, BV>(o, ch.batch, ch.first, len, h, vt * BV, p.V - vt * BV,
                          [&](int j, int i) { return A(out_s[j * BV + i]); });
}

// ---- backward -----------------------------------------------------------------------------------

template <class O, int BV>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dstates_kernel(Problem p, TensorView d_o, TensorView d_final_state, TensorView dh0,
                   simt::Span<Accumulator<O>> dstates, int C) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  const std::int64_t n = blockIdx.x / p.H, h = blockIdx.x % p.H, kt = blockIdx.y, vt = blockIdx.z;
  PHASOR_DYNAMIC_SHARED_AT(A, ds_s, 0, BK * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, q_s, BK * BV * sizeof(A), C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, g_s, (BK * BV + C * BK) * sizeof(A), C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, do_s, (BK * BV + 2 * C * BK) * sizeof(A), C * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, last_s, (BK * BV + 2 * C * BK + C * BV) * sizeof(A), BK);
  const int tid = static_cast<int>(threadIdx.x);
  const A scale = static_cast<A>(p.scale);
  for (int e = tid; e < BK * BV; e += kThreads) {
    const int i = e / BV, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    ds_s[e] = d_final_state.defined() && channel >= 0 && column < p.V
                  ? simt::load<A>(d_final_state, n, h, channel, column)
                  : A(0);
  }
  const std::int64_t chunks = ceil_div(p.sequences[n].length, C);
  for (std::int64_t c = chunks - 1; c >= 0; --c) {
    const Chunk ch = chunk_of(p, C, n, c);
    simt::syncthreads();
    store_state_tile<A, BK, BV>(p, ds_s, dstates, ch.slot, h, kt, vt);  // dS after chunk c
    load_keys<A, BK>(p, p.q, ch, h, kt, C, q_s);
    load_gates<A, BK>(p, ch, h, kt, C, g_s);
    load_values<A, BV>(p, d_o, ch, h, vt, C, do_s);
    simt::syncthreads();
    if (tid < BK) {
      last_s[tid] = times_suffix<A, BK>(g_s, ch.len, tid, nullptr);
      times_prefix<A, BK>(g_s, ch.len, tid, q_s, scale);  // scale q ⊙ P
    }
    simt::syncthreads();
    for (int e = tid; e < BK * BV; e += kThreads) {  // dS ← diag(P_last) dS
      const A s = ds_s[e], last = last_s[e / BV];
      ds_s[e] = s * last;
    }
    simt::syncthreads();
    // dS += scale (q ⊙ P)ᵀ do
    gemm_to_shared<O>(row_major(q_s, 0, BK, C, BK).transposed(), row_major(do_s, 0, BV, C, BV), BK,
                      BV, ch.len, ds_s, 0, BV, true);
  }
  simt::syncthreads();
  if (dh0.defined())
    for (int e = tid; e < BK * BV; e += kThreads) {
      const int i = e / BV, jj = e % BV;
      const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
      if (channel >= 0 && column < p.V) simt::store(dh0, A(ds_s[e]), n, h, channel, column);
    }
}

// dA = do vᵀ of one chunk (C × C), over the value tiles.
template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dattn_kernel(Problem p, TensorView d_o, simt::Span<Accumulator<O>> dattn, int C) {
  using A = Accumulator<O>;
  constexpr int BV = kTile<O>;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t h = blockIdx.y;
  const Chunk ch = chunk_of(p, C, n, c);
  PHASOR_DYNAMIC_SHARED_AT(A, da_s, 0, C * C);
  PHASOR_DYNAMIC_SHARED_AT(A, do_s, C * C * sizeof(A), C * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, v_s, (C * C + C * BV) * sizeof(A), C * BV);
  const int tid = static_cast<int>(threadIdx.x);
  for (int x = tid; x < C * C; x += kThreads) da_s[x] = A(0);
  for (std::int64_t vt = 0; vt < ceil_div(p.V, BV); ++vt) {
    simt::syncthreads();
    load_values<A, BV>(p, d_o, ch, h, vt, C, do_s);
    load_values<A, BV>(p, p.v, ch, h, vt, C, v_s);
    simt::syncthreads();
    gemm_to_shared<O>(row_major(do_s, 0, BV, ch.len, BV),
                      row_major(v_s, 0, BV, ch.len, BV).transposed(), ch.len, ch.len, BV, da_s, 0,
                      C, true);
  }
  simt::syncthreads();
  for (int x = tid; x < C * C; x += kThreads) {
    const A v = da_s[x];
    dattn[(ch.slot * p.H + h) * C * C + x] = v;
  }
}

// dv = (k ⊙ E) dS + Aᵀ do of one chunk and value tile. Shared memory as output_kernel's.
template <class O, int BV>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dv_kernel(Problem p, TensorView d_o, TensorView dv, simt::Span<Accumulator<O>> dstates,
              simt::Span<Accumulator<O>> attn, int C) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t h = blockIdx.y, vt = blockIdx.z;
  const Chunk ch = chunk_of(p, C, n, c);
  const std::size_t e = sizeof(A);
  PHASOR_DYNAMIC_SHARED_AT(A, out_s, 0, C * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, k_s, C * BV * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, g_s, (C * BV + C * BK) * e, C * BK);
  PHASOR_DYNAMIC_SHARED_AT(A, ds_s, (C * BV + 2 * C * BK) * e, BK * BV);
  PHASOR_DYNAMIC_SHARED_AT(A, attn_s, (C * BV + 2 * C * BK + BK * BV) * e, C * C);
  PHASOR_DYNAMIC_SHARED_AT(A, do_s, (C * BV + 2 * C * BK + BK * BV + C * C) * e, C * BV);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  for (int x = tid; x < C * BV; x += kThreads) out_s[x] = A(0);
  const std::int64_t tiles = key_tiles<BK>(p);
  for (std::int64_t kt = 0; kt < tiles; ++kt) {
    simt::syncthreads();
    load_keys<A, BK>(p, p.k, ch, h, kt, C, k_s);
    load_gates<A, BK>(p, ch, h, kt, C, g_s);
    load_state_tile<A, BK, BV>(p, dstates, ch.slot, h, kt, vt, ds_s);
    simt::syncthreads();
    if (tid < BK) times_suffix<A, BK>(g_s, len, tid, &k_s);  // k ⊙ E
    simt::syncthreads();
    gemm_to_shared<O>(row_major(k_s, 0, BK, len, BK), row_major(ds_s, 0, BV, BK, BV), len, BV, BK,
                      out_s, 0, BV, true);
  }
  fill_shared<A>(C * C, attn_s, [&](int x) { return A(attn[(ch.slot * p.H + h) * C * C + x]); });
  load_values<A, BV>(p, d_o, ch, h, vt, C, do_s);
  simt::syncthreads();
  gemm_to_shared<O>(row_major(attn_s, 0, C, len, len).transposed(), row_major(do_s, 0, BV, C, BV),
                    len, BV, len, out_s, 0, BV, true);
  simt::syncthreads();
  store_token_rows<A, BV>(dv, ch.batch, ch.first, len, h, vt * BV, p.V - vt * BV,
                          [&](int j, int i) { return A(out_s[j * BV + i]); });
}

// The arrays of dqk_kernel, each C × BK unless noted. The value-tile operands of step 2 (do, v,
// S, dS) are dead once step 2 ends, and kf, key_grad and qf are first written in step 4, so the
// two sets share one region: in float32 the block then takes 113 KiB of shared memory instead
// of 130, and two blocks (8 warps) fit on an SM of 228 KiB where one did (the H200 profile of
// 2026-11-27: one block per SM, 6 % occupancy, the kernel stalled on shared-memory latency).
struct DqkLayout {
  int q, k, g, decay, dq_inter, dk_state, dq_off, dk_off, dg;  // C × BK
  int dattn;                                                   // C × C
  int rowsum, last;                                            // BK
  int cross;                                                   // (C / 16) × BK
  // Step 2 only:
  int do_t, v_t;      // C × BV
  int state, dstate;  // BK × BV
  // Step 4 on, over the same region:
  int kf, key_grad;  // C × BK
  int qf;            // 16 × BK
  int total;
};
template <class O>
PHASOR_HOST_DEVICE DqkLayout dqk_layout(int C) {
  constexpr int B = kTile<O>;
  DqkLayout l;
  int at = 0;
  const auto take = [&](int count) {
    const int here = at;
    at += count;
    return here;
  };
  l.q = take(C * B), l.k = take(C * B), l.g = take(C * B), l.decay = take(C * B);
  l.dq_inter = take(C * B), l.dk_state = take(C * B), l.dq_off = take(C * B);
  l.dk_off = take(C * B), l.dg = take(C * B);
  l.dattn = take(C * C);
  l.rowsum = take(B), l.last = take(B);
  l.cross = take((C / kSub) * B);
  const int shared_region = at;
  l.do_t = take(C * B), l.v_t = take(C * B);
  l.state = take(B * B), l.dstate = take(B * B);
  const int step2_end = at;
  at = shared_region;
  l.kf = take(C * B), l.key_grad = take(C * B);
  l.qf = take(kSub * B);
  l.total = at > step2_end ? at : step2_end;
  return l;
}

// dq, dk, dg, dθ of one chunk and key tile. See src/gla/chunk.cpp for the terms of dg.
template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dqk_kernel(Problem p, TensorView d_o, GlaGrads grads, simt::Span<Accumulator<O>> states,
               simt::Span<Accumulator<O>> dstates, simt::Span<Accumulator<O>> dattn, int C) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>, BV = kTile<O>;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t h = blockIdx.y, kt = blockIdx.z;
  const Chunk ch = chunk_of(p, C, n, c);
  const DqkLayout l = dqk_layout<O>(C);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  const int blocks = (len + kSub - 1) / kSub;
  const A scale = static_cast<A>(p.scale);
  // Element (j, i) of a C × BK array at `base`.
  const auto rc = [](int base, int j, int i) { return base + j * BK + i; };

  // 1. q, k (rotated), g, exp(g), dA; zero the accumulators.
  load_keys<A, BK>(p, p.q, ch, h, kt, C, sh.view(l.q, C * BK));
  load_keys<A, BK>(p, p.k, ch, h, kt, C, sh.view(l.k, C * BK));
  load_gates<A, BK>(p, ch, h, kt, C, sh.view(l.g, C * BK));
  fill_shared<A>(C * C, sh.view(l.dattn, C * C),
                 [&](int x) { return A(dattn[(ch.slot * p.H + h) * C * C + x]); });
  for (int x = tid; x < C * BK; x += kThreads) {
    sh[l.dq_inter + x] = A(0);
    sh[l.dk_state + x] = A(0);
    sh[l.dq_off + x] = A(0);
    sh[l.dk_off + x] = A(0);
  }
  for (int x = tid; x < BK; x += kThreads) sh[l.rowsum + x] = A(0);
  for (int x = tid; x < (C / kSub) * BK; x += kThreads) sh[l.cross + x] = A(0);
  simt::syncthreads();
  for (int x = tid; x < C * BK; x += kThreads) {
    const A gate = sh[l.g + x];
    sh[l.decay + x] = simt::exp(gate);
  }

  // 2. Over the value tiles: dq_inter += do Sᵀ, dk_state += v dSᵀ, rowsum += Σ_v S ⊙ dS.
  for (std::int64_t vt = 0; vt < ceil_div(p.V, BV); ++vt) {
    simt::syncthreads();
    load_values<A, BV>(p, d_o, ch, h, vt, C, sh.view(l.do_t, C * BV));
    load_values<A, BV>(p, p.v, ch, h, vt, C, sh.view(l.v_t, C * BV));
    load_state_tile<A, BK, BV>(p, states, ch.slot, h, kt, vt, sh.view(l.state, BK * BV));
    load_state_tile<A, BK, BV>(p, dstates, ch.slot, h, kt, vt, sh.view(l.dstate, BK * BV));
    simt::syncthreads();
    gemm_to_shared<O>(row_major(sh, l.do_t, BV, len, BV),
                      row_major(sh, l.state, BV, BK, BV).transposed(), len, BK, BV, sh, l.dq_inter,
                      BK, true);
    gemm_to_shared<O>(row_major(sh, l.v_t, BV, len, BV),
                      row_major(sh, l.dstate, BV, BK, BV).transposed(), len, BK, BV, sh, l.dk_state,
                      BK, true);
    if (tid < BK) {
      A sum = sh[l.rowsum + tid];
      for (int jj = 0; jj < BV; ++jj) {
        const A s = sh[l.state + tid * BV + jj], d = sh[l.dstate + tid * BV + jj];
        sum += s * d;
      }
      sh[l.rowsum + tid] = sum;
    }
  }
  simt::syncthreads();

  // 3. Per channel: dq_inter *= scale P, dk_state *= E, P_last; dg's chunk-wide parts:
  //    dg_t = Σ_{i ≥ t} q_i dq_inter_i + Σ_{j < t} k_j dk_state_j + P_last Σ_v S ⊙ dS.
  if (tid < BK) {
    const int i = tid;
    times_prefix<A, BK>(sh.view(l.g, C * BK), len, i, sh.view(l.dq_inter, C * BK), scale);
    const simt::SharedArray<A> dk_state = sh.view(l.dk_state, C * BK);
    const A last = times_suffix<A, BK>(sh.view(l.g, C * BK), len, i, &dk_state);
    sh[l.last + i] = last;
    A acc = 0;
    for (int t = len - 1; t >= 0; --t) {
      const A q = sh[rc(l.q, t, i)], d = sh[rc(l.dq_inter, t, i)];
      acc += q * d;
      sh[rc(l.dg, t, i)] = acc;
    }
    acc = 0;
    const A chunk_term = last * A(sh[l.rowsum + i]);
    for (int t = 0; t < len; ++t) {
      const A k = sh[rc(l.k, t, i)], d = sh[rc(l.dk_state, t, i)];
      const A g = sh[rc(l.dg, t, i)];
      sh[rc(l.dg, t, i)] = g + acc + chunk_term;
      acc += k * d;
    }
  }

  // 4. Off-diagonal strips, query block b (rows [r, r + rows)) against keys [0, r):
  //    dq_off = scale (dA_strip (k ⊙ f_k)) ⊙ f_q, key_grad = scale (dA_stripᵀ (q ⊙ f_q)) ⊙ f_k,
  //    dk_off += key_grad, and the block pairs X_{b,J} = Σ_{j ∈ J} k_j ⊙ key_grad_j into
  //    cross[B] for the blocks J < B < b.
  for (int b = 1; b < blocks; ++b) {
    const int r = b * kSub, rows = len - r < kSub ? len - r : kSub;
    simt::syncthreads();
    if (tid < BK) {
      query_factors<A, BK>(sh.view(l.g, C * BK), r, rows, tid, sh.view(l.q, C * BK), r,
                           sh.view(l.qf, kSub * BK));
      key_factors<A, BK>(sh.view(l.g, C * BK), r, tid, sh.view(l.k, C * BK), sh.view(l.kf, C * BK));
    }
    simt::syncthreads();
    const SharedMatrix<A> strip = {sh, l.dattn + r * C, C, 1, rows, r};
    gemm_to_shared<O>(strip, row_major(sh, l.kf, BK, r, BK), rows, BK, r, sh, l.dq_off + r * BK, BK,
                      false, scale);
    gemm_to_shared<O>(strip.transposed(), row_major(sh, l.qf, BK, rows, BK), r, BK, rows, sh,
                      l.key_grad, BK, false, scale);
    simt::syncthreads();
    if (tid < BK) {
      const int i = tid;
      // dq_off rows of the block ⊙ f_q, key_grad ⊙ f_k (the factors recomputed in place).
      query_factors<A, BK>(sh.view(l.g, C * BK), r, rows, i, sh.view(l.dq_off, C * BK), r,
                           sh.view(l.dq_off, C * BK).view(r * BK, rows * BK));
      key_factors<A, BK>(sh.view(l.g, C * BK), r, i, sh.view(l.key_grad, C * BK),
                         sh.view(l.key_grad, C * BK));
      A acc = 0;
      for (int key_block = 0; key_block < b; ++key_block) {
        const A cross = sh[l.cross + key_block * BK + i];
        sh[l.cross + key_block * BK + i] = cross + acc;
        for (int j = key_block * kSub; j < (key_block + 1) * kSub; ++j) {
          const A grad = sh[rc(l.key_grad, j, i)], k = sh[rc(l.k, j, i)];
          const A off = sh[rc(l.dk_off, j, i)];
          sh[rc(l.dk_off, j, i)] = off + grad;
          acc += k * grad;
        }
      }
    }
  }
  simt::syncthreads();

  // 5. dg's block parts, per channel: cross[B], Σ_{j ∈ B, j < t} k_j dk_off_j,
  //    Σ_{i ∈ B, i ≥ t} q_i dq_off_i.
  if (tid < BK) {
    const int i = tid;
    for (int b = 0; b < blocks; ++b) {
      const int r = b * kSub, end = r + kSub < len ? r + kSub : len;
      const A cross = sh[l.cross + b * BK + i];
      A acc = 0;
      for (int t = r; t < end; ++t) {
        const A g = sh[rc(l.dg, t, i)];
        sh[rc(l.dg, t, i)] = g + cross + acc;
        const A k = sh[rc(l.k, t, i)], d = sh[rc(l.dk_off, t, i)];
        acc += k * d;
      }
      acc = 0;
      for (int t = end - 1; t >= r; --t) {
        const A q = sh[rc(l.q, t, i)], d = sh[rc(l.dq_off, t, i)];
        acc += q * d;
        const A g = sh[rc(l.dg, t, i)];
        sh[rc(l.dg, t, i)] = g + acc;
      }
    }
  }
  simt::syncthreads();

  // 6. Diagonal blocks, one thread per (row, channel): the pairs r ≤ j ≤ i < r + 16 with
  //    M_ij = scale dA_ij q_i ⊙ k_j ⊙ D_ij:
  //    dq_i += Σ_j scale dA_ij D_ij k_j, dk_j += Σ_i scale dA_ij D_ij q_i,
  //    dg_t += Σ_{j < t ≤ i} M_ij with D_ij = L_j R_i, L_j = Π_{(j, t]} exp(g), R_i = Π_{(t, i]}.
  //    Results go to the dq_off / dk_off arrays (now the whole intra part) after all reads.
  for (int x = tid; x < len * BK; x += kThreads) {
    const int t = x / BK, i = x % BK, r = (t / kSub) * kSub;
    const int end = r + kSub < len ? r + kSub : len;
    A dq = 0, running = 1;  // running: D_{t, j} for j = t, t − 1, …
    for (int j = t; j >= r; --j) {
      if (j < t) {
        const A d = sh[rc(l.decay, j + 1, i)];
        running *= d;
      }
      const A da = sh[l.dattn + t * C + j], k = sh[rc(l.k, j, i)];
      dq += scale * da * running * k;
    }
    A dk = 0;
    running = 1;  // D_{i, t} for i = t, t + 1, …
    for (int row = t; row < end; ++row) {
      if (row > t) {
        const A d = sh[rc(l.decay, row, i)];
        running *= d;
      }
      const A da = sh[l.dattn + row * C + t], q = sh[rc(l.q, row, i)];
      dk += scale * da * running * q;
    }
    // Σ_{j < t ≤ i} M_ij = scale Σ_i (q_i R_i) Σ_j dA_ij (k_j L_j).
    A cross = 0, right = 1;
    for (int row = t; row < end; ++row) {
      if (row > t) {
        const A d = sh[rc(l.decay, row, i)];
        right *= d;
      }
      const A q = sh[rc(l.q, row, i)];
      A inner = 0, left = 1;
      for (int j = t - 1; j >= r; --j) {
        const A d = sh[rc(l.decay, j + 1, i)];
        left *= d;
        const A da = sh[l.dattn + row * C + j], k = sh[rc(l.k, j, i)];
        inner += da * k * left;
      }
      cross += q * right * inner;
    }
    const A g = sh[rc(l.dg, t, i)];
    sh[rc(l.dg, t, i)] = g + scale * cross;
    sh[rc(l.kf, t, i)] = dq;        // dq_diag (kf is free now)
    sh[rc(l.key_grad, t, i)] = dk;  // dk_diag
  }
  simt::syncthreads();

  // 7. dq, dk (rotated frame) = inter + off + diag; with θ turned into the inputs' gradients and
  //    dθ ((R2), (R3)); dg stored as is.
  const auto total = [&](int inter, int off, int diag, int t, int i) {
    const A a = sh[rc(inter, t, i)], b = sh[rc(off, t, i)], d = sh[rc(diag, t, i)];
    return a + b + d;
  };
  if (!p.theta.defined()) {  // channels kt·BK + i
    const std::int64_t column0 = kt * BK, columns = p.K - kt * BK;
    if (grads.dq.defined())
      store_token_rows<A, BK>(
          grads.dq, ch.batch, ch.first, len, h, column0, columns,
          [&](int t, int i) { return total(l.dq_inter, l.dq_off, l.kf, t, i); });
    if (grads.dk.defined())
      store_token_rows<A, BK>(
          grads.dk, ch.batch, ch.first, len, h, column0, columns,
          [&](int t, int i) { return total(l.dk_state, l.dk_off, l.key_grad, t, i); });
    if (grads.dg.defined())
      store_token_rows<A, BK>(grads.dg, ch.batch, ch.first, len, h, column0, columns,
                              [&](int t, int i) { return A(sh[rc(l.dg, t, i)]); });
    return;
  }
  constexpr int R = BK / 2;
  for (int x = tid; x < len * R; x += kThreads) {
    const int t = x / R, i = x % R;
    const std::int64_t pair = kt * R + i;
    if (pair >= p.K / 2) continue;
    const std::int64_t token = ch.first + t;
    const std::int64_t ia = pair_a(p.rotary_layout, p.K, pair),
                       ib = pair_b(p.rotary_layout, p.K, pair);
    if (grads.dg.defined()) {
      simt::store(grads.dg, A(sh[rc(l.dg, t, i)]), ch.batch, token, h, ia);
      simt::store(grads.dg, A(sh[rc(l.dg, t, R + i)]), ch.batch, token, h, ib);
    }
    A cs, sn;
    angle_of(p.theta, ch.batch, token, h, pair, cs, sn);
    A dtheta = 0;
    const auto unrotate = [&](int rows, int inter, int off, int diag, const TensorView& dx) {
      const A ya = sh[rc(rows, t, i)], yb = sh[rc(rows, t, R + i)];
      const A dya = total(inter, off, diag, t, i), dyb = total(inter, off, diag, t, R + i);
      dtheta += dyb * ya - dya * yb;  // (R3)
      if (dx.defined()) {             // (R2)
        simt::store(dx, dya * cs + dyb * sn, ch.batch, token, h, ia);
        simt::store(dx, dyb * cs - dya * sn, ch.batch, token, h, ib);
      }
    };
    unrotate(l.q, l.dq_inter, l.dq_off, l.kf, grads.dq);
    unrotate(l.k, l.dk_state, l.dk_off, l.key_grad, grads.dk);
    if (grads.dtheta.defined()) simt::store(grads.dtheta, dtheta, ch.batch, token, h, pair);
  }
}

// ---- host ---------------------------------------------------------------------------------------

template <class O, int BV>
struct Run {
  using A = Accumulator<O>;
  static constexpr int BK = kTile<O>;
  const Problem& p;
  cuda::Stream stream;
  int C;
  std::int64_t slots;

  simt::Dim3 scan_grid() const {
    return simt::Dim3(static_cast<unsigned>(p.num_work_items()),
                      static_cast<unsigned>(key_tiles<BK>(p)),
                      static_cast<unsigned>(ceil_div(p.V, BV)));
  }
  simt::Dim3 chunk_grid(std::int64_t z) const {
    return simt::Dim3(static_cast<unsigned>(slots), static_cast<unsigned>(p.H),
                      static_cast<unsigned>(z));
  }
  // With K = 0 there is no state (S is 0 × V): the grid has no key tile and runs nothing
  // (PHASOR_LAUNCH), and o's inter part, the final state and dh0 are zero or empty.
  void states(const TensorView& final_state, const simt::Span<A>& out) const {
    PHASOR_LAUNCH((states_kernel<O, BV>), scan_grid(), simt::Dim3(kThreads),
                  (scan_shared_bytes<O, BV>(C)), stream, p, final_state, out, C);
  }
  void intra(const simt::Span<A>& attn) const {
    PHASOR_LAUNCH((intra_kernel<O>), chunk_grid(1), simt::Dim3(kThreads), intra_shared_bytes<O>(C),
                  stream, p, attn, C);
  }
};

// The chunk states (the state entering every chunk, [slot][H][K][V] in the compute type A) live
// in the caller's chunk_states when it is laid out so (dtype A, contiguous; api.cpp checked its
// shape: the slots of api.cpp's chunk_size are the kernels', see phasor/common.h), else in a
// workspace of their own that copy_view moves to (forward) or from (backward) chunk_states.
template <class A>
bool states_in_chunk_states(const TensorView& chunk_states) {
  return chunk_states.defined() && chunk_states.dtype == dtype_of<A>() &&
         chunk_states.is_contiguous();
}
template <class A>
TensorView state_view(const simt::Span<A>& states, std::int64_t slots, const Problem& p) {
  // The shape is given, never divided out of states.size: K, V or H may be 0 (an empty problem).
  return TensorView::contiguous(states.data, dtype_of<A>(), {slots, p.H, p.K, p.V}, p.device);
}

template <class O, int BV>
void forward_typed(const Problem& p, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states, cuda::Stream stream) {
  using A = Accumulator<O>;
  const int C = kernel_chunk_size(p.chunk_size);
  const std::int64_t slots = p.sequences.chunk_slot_count(C);
  const Run<O, BV> run{p, stream, C, slots};
  const std::int64_t state_elements = slots * p.H * p.K * p.V, attn_elements = slots * p.H * C * C;
  const bool in_place = states_in_chunk_states<A>(chunk_states);
  const std::int64_t own = (in_place ? 0 : state_elements) + attn_elements;
  simt::Workspace workspace(static_cast<std::size_t>(own) * sizeof(A), stream);
  const simt::Span<A> all = workspace.span<A>(own);
  const simt::Span<A> states{in_place ? static_cast<A*>(chunk_states.data) : all.data,
                             state_elements},
      attn{all.data + (in_place ? 0 : state_elements), attn_elements};
  run.states(final_state, states);
  if (chunk_states.defined() && !in_place)
    copy_view(state_view(states, slots, p), chunk_states, stream);
  run.intra(attn);
  PHASOR_LAUNCH((output_kernel<O, BV>), run.chunk_grid(ceil_div(p.V, BV)), simt::Dim3(kThreads),
                (output_shared_bytes<O, BV>(C)), stream, p, o, states, attn, C);
}

template <class O, int BV>
void backward_typed(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                    const GlaGrads& grads, const TensorView& chunk_states, cuda::Stream stream) {
  using A = Accumulator<O>;
  const int C = kernel_chunk_size(p.chunk_size);
  const std::int64_t slots = p.sequences.chunk_slot_count(C);
  const Run<O, BV> run{p, stream, C, slots};
  const std::int64_t state_elements = slots * p.H * p.K * p.V, attn_elements = slots * p.H * C * C;
  // The states: chunk_states read in place (never written: an input here), or a workspace.
  const bool in_place = states_in_chunk_states<A>(chunk_states);
  const std::int64_t own = (in_place ? 1 : 2) * state_elements + 2 * attn_elements;
  simt::Workspace workspace(static_cast<std::size_t>(own) * sizeof(A), stream);
  const simt::Span<A> all = workspace.span<A>(own);
  A* at = all.data;
  const auto take = [&](std::int64_t count) {
    const simt::Span<A> span{at, count};
    at += count;
    return span;
  };
  const simt::Span<A> states =
      in_place ? simt::Span<A>{static_cast<A*>(chunk_states.data), state_elements}
               : take(state_elements);
  const simt::Span<A> dstates = take(state_elements), attn = take(attn_elements),
                      dattn = take(attn_elements);
  if (!chunk_states.defined())
    run.states(TensorView{}, states);  // the forward's scan, replayed
  else if (!in_place)
    copy_view(chunk_states, state_view(states, slots, p), stream);
  PHASOR_LAUNCH((dstates_kernel<O, BV>), run.scan_grid(), simt::Dim3(kThreads),
                (scan_shared_bytes<O, BV>(C)), stream, p, d_o, d_final_state, grads.dh0, dstates,
                C);
  run.intra(attn);
  PHASOR_LAUNCH((dattn_kernel<O>), run.chunk_grid(1), simt::Dim3(kThreads),
                static_cast<std::size_t>(C * C + 2 * C * kTile<O>) * sizeof(A), stream, p, d_o,
                dattn, C);
  if (grads.dv.defined())
    PHASOR_LAUNCH((dv_kernel<O, BV>), run.chunk_grid(ceil_div(p.V, BV)), simt::Dim3(kThreads),
                  (output_shared_bytes<O, BV>(C)), stream, p, d_o, grads.dv, dstates, attn, C);
  // dq, dk, dg, dθ have K (or K/2) columns: with K = 0 the grid has no key tile.
  if (grads.dq.defined() || grads.dk.defined() || grads.dg.defined() || grads.dtheta.defined())
    PHASOR_LAUNCH((dqk_kernel<O>), run.chunk_grid(key_tiles<kTile<O>>(p)), simt::Dim3(kThreads),
                  static_cast<std::size_t>(dqk_layout<O>(C).total) * sizeof(A), stream, p, d_o,
                  grads, states, dstates, dattn, C);
}

// The value-tile width of the states, output, dstates and dv kernels: 64 (32 when V ≤ 32), so
// that those kernels read q, k and the gates once per 64 value columns rather than per 32 (the
// bytes of a forward fall by a quarter in scripts/roofline.py's model). 128 would cut them by 40 %
// but needs 115 KiB of shared memory per output block (one block, 4 warps, per SM): a trade to
// measure on a GPU. Calls f(std::integral_constant<int, BV>{}).
template <class F>
void dispatch_value_tile(std::int64_t V, F&& f) {
  if (V <= 32) return f(std::integral_constant<int, 32>{});
  return f(std::integral_constant<int, 64>{});
}

}  // namespace

void chunk_forward(const Problem& problem, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states) {
  if (problem.num_work_items() == 0 || problem.V == 0) return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.theta, &p.initial_state})
    *input = stage(*input, {o, final_state});
  dispatch_operand(p.q.dtype, [&](auto operand) {
    using O = decltype(operand);
    dispatch_value_tile(p.V, [&](auto tile) {
      forward_typed<O, tile.value>(p, o, final_state, chunk_states, stream);
    });
  });
}

void chunk_backward(const Problem& problem, const TensorView& d_o, const TensorView& d_final_state,
                    const GlaGrads& grads, const TensorView& chunk_states) {
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
  const std::initializer_list<TensorView> outputs = {grads.dq, grads.dk,  grads.dv,
                                                     grads.dg, grads.dh0, grads.dtheta};
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.theta, &p.initial_state})
    *input = stage(*input, outputs);
  const TensorView d_o_in = stage(d_o, outputs), d_final_in = stage(d_final_state, outputs);
  dispatch_operand(p.q.dtype, [&](auto operand) {
    using O = decltype(operand);
    dispatch_value_tile(p.V, [&](auto tile) {
      backward_typed<O, tile.value>(p, d_o_in, d_final_in, grads, chunk_states, stream);
    });
  });
}

}  // namespace phasor::PHASOR_BACKEND::gla
