// Gated DeltaNet's chunk kernels on the GPU (chunk_gated_delta_rule; gated_delta_rule.h), written
// once for nvcc and the emulated GPU. They compute the WY / UT form of
// src/gated_delta_rule/chunk.cpp (see that file for equations (1)–(4)), with the solve of each
// chunk turned into the explicit unit-lower-triangular inverse T = M⁻¹ (as fla's solve_tril) so
// that the entering state enters through one product:
//   U = T diag(β) V,   W = T diag(βγ) K̂,   U_new = U − W S,                                  (2')
//   O = diag(γ) Q̃ S + lower_incl(Q̃ K̂ᵀ ⊙ Γ) U_new,   S_next = γ_last S + (diag(E) K̂)ᵀ U_new.
// Kernels (q̂, k̂: ℓ2-normalised when use_qk_l2norm_in_kernel, then rotated by θ; q̃ = scale q̂):
//   norms    (token, q/k head): ρ = (Σx² + 1e-6)^{-1/2} of q and k (with l2norm only).
//   wy       (chunk, value head): Γ, M of (1), T = M⁻¹ (forward substitution, a column per
//            thread), U, W, A = lower_incl(Q̃ K̂ᵀ ⊙ Γ) and B = K̂ K̂ᵀ ⊙ Γ.
//   states   (sequence, value head, value tile), chunks in order: S entering each chunk, U_new.
//   output   (chunk, value head, value tile): O.
// Backward (after norms, wy and states again), the CPU's backward_chunk regrouped:
//   dstates  (sequence, value head, value tile), chunks in reverse: dS after each chunk,
//            Y = Tᵀ (diag(E) K̂ dS + Aᵀ dO), dS ← γ_last dS − K̂ᵀ diag(βγ) Y + (diag(γ) Q̃)ᵀ dO;
//            dh0 at the end.
//   dvalue   (chunk, value head): dv = diag(β) Y, dβ, dg (the CPU's three gate sums, telescoping
//            pair weights included) and the pair matrices dA ⊙ Γ and ∂/∂(K̂K̂ᵀ) for dqk.
//   dqk      (chunk, q/k head, key tile), summing the group's value heads: dq̃ and dk̂ in the
//            rotated, normalised frame → finish_qk_kernel (qk_grads.h): dq, dk, dθ.
// Matrix products through cuda/common/gemm.h (tensor cores with operands rounded to q's 16-bit
// type; exact FMA tiles for float32 and float64); everything else in float32 (float64). Fixed
// orders everywhere: bit-identical run to run. Chunk sizes 16, 32, 64; any K and V.
#include <algorithm>
#include <string>
#include <type_traits>

#include "common/chunks.h"
#include "common/fill.h"
#include "common/gemm.h"
#include "common/recurrent.h"
#include "common/staging.h"
#include "gated_delta_rule/gated_delta_rule.h"
#include "gated_delta_rule/qk_grads.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::gdn {
namespace {

constexpr int kThreads = 128;

template <class O>
constexpr int kTile = std::is_same_v<O, double> ? 16 : 32;  // key / value tile width

PHASOR_DEVICE Chunk chunk_of(const Problem& p, int C, std::int64_t n, std::int64_t c) {
  return chunk_at(p.sequences, C, n, c);
}

// The workspaces of the kernels (compute type A), by chunk slot.
template <class A>
struct Space {
  simt::Span<A> rho;      // [B·T·H][2]: ρ_q, ρ_k (l2norm only)
  simt::Span<A> t_inv;    // [slot][HV][C][C]: T = M⁻¹
  simt::Span<A> attn;     // [slot][HV][C][C]: lower_incl(Q̃ K̂ᵀ ⊙ Γ)
  simt::Span<A> gram;     // [slot][HV][C][C]: K̂ K̂ᵀ ⊙ Γ (strictly lower part used)
  simt::Span<A> u;        // [slot][HV][C][V]: U, then U_new (states)
  simt::Span<A> w;        // [slot][HV][C][K]: W (channel order)
  simt::Span<A> states;   // [slot][HV][K][V]: S entering each chunk
  simt::Span<A> dstates;  // [slot][HV][K][V]: dS after each chunk (backward)
  simt::Span<A> y;        // [slot][HV][C][V]: Y (backward)
  simt::Span<A> dattn;    // [slot][HV][C][C]: dA ⊙ Γ (backward)
  simt::Span<A> dgram;    // [slot][HV][C][C]: ∂/∂(K̂ K̂ᵀ), strictly lower (backward)
  simt::Span<A> dq, dk;   // [B·T][H][K]: dq̃, dk̂ summed over the group (backward)
  int C = 64;

  PHASOR_DEVICE std::int64_t square(const Problem& p, std::int64_t slot, std::int64_t hv) const {
    return (slot * p.HV + hv) * C * C;
  }
  PHASOR_DEVICE std::int64_t rows_v(const Problem& p, std::int64_t slot, std::int64_t hv) const {
    return (slot * p.HV + hv) * C * p.V;
  }
  PHASOR_DEVICE std::int64_t rows_k(const Problem& p, std::int64_t slot, std::int64_t hv) const {
    return (slot * p.HV + hv) * C * p.K;
  }
  PHASOR_DEVICE std::int64_t state(const Problem& p, std::int64_t slot, std::int64_t hv) const {
    return (slot * p.HV + hv) * p.K * p.V;
  }
};

// ---- loads --------------------------------------------------------------------------------------

// out (C × BK) = the chunk's q̂ (which = 0; times scale: q̃) or k̂ (which = 1) rows of key tile t:
// ℓ2-normalised (ρ from the norms kernel) and rotated by θ, as the CPU's load_qk.
template <class A, int BK>
PHASOR_DEVICE void load_qk(const Problem& p, const Space<A>& sp, int which, const Chunk& ch,
                           std::int64_t h, std::int64_t t, int C, const simt::SharedArray<A>& out) {
  const TensorView& x = which == 0 ? p.q : p.k;
  const A scale = which == 0 ? static_cast<A>(p.scale) : A(1);
  const auto rho = [&](int j) {
    if (!p.l2norm) return A(1);
    const A r = sp.rho[((ch.batch * p.T + ch.first + j) * p.H + h) * 2 + which];
    return r;
  };
  const int tid = static_cast<int>(threadIdx.x);
  if (!p.theta.defined()) {  // channels t·BK + i
    load_token_rows<A, BK>(x, ch.batch, ch.first, ch.len, C, h, t * BK, p.K - t * BK, out,
                           [&](int j, A value) { return scale * (value * rho(j)); });
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
      const A r = rho(j);
      const A xa =
          simt::load<A>(x, ch.batch, ch.first + j, h, pair_a(p.rotary_layout, p.K, pair)) * r;
      const A xb =
          simt::load<A>(x, ch.batch, ch.first + j, h, pair_b(p.rotary_layout, p.K, pair)) * r;
      ya = scale * (xa * c - xb * s);  // (R1)
      yb = scale * (xa * s + xb * c);
    }
    out[j * BK + i] = ya;
    out[j * BK + R + i] = yb;
  }
}

// out (C × BV) = the chunk's rows of x ([B, T, HV, V]) in value tile t; `factor` (C, optional)
// multiplies row j.
template <class A, int BV>
PHASOR_DEVICE void load_values(const Problem& p, const TensorView& x, const Chunk& ch,
                               std::int64_t hv, std::int64_t t, int C,
                               const simt::SharedArray<A>& out) {
  load_token_rows<A, BV>(x, ch.batch, ch.first, ch.len, C, hv, t * BV, p.V - t * BV, out);
}
// out (C × BV) = rows of a [slot][HV][C][V] workspace in value tile t.
template <class A, int BV>
PHASOR_DEVICE void load_rows_v(const Problem& p, const simt::Span<A>& from, std::int64_t base,
                               std::int64_t t, int C, const simt::SharedArray<A>& out) {
  fill_shared<A>(C * BV, out, [&](int e) {
    const int j = e / BV, jj = e % BV;
    const std::int64_t column = t * BV + jj;
    return column < p.V ? A(from[base + j * p.V + column]) : A(0);
  });
}
template <class A, int BV>
PHASOR_DEVICE void store_rows_v(const Problem& p, const simt::SharedArray<A>& from, int len,
                                const simt::Span<A>& to, std::int64_t base, std::int64_t t, int C) {
  for (int e = static_cast<int>(threadIdx.x); e < C * BV; e += kThreads) {
    const int j = e / BV, jj = e % BV;
    const std::int64_t column = t * BV + jj;
    if (column >= p.V) continue;
    A v = 0;
    if (j < len) v = from[e];  // rows past the chunk are not written by the products
    to[base + j * p.V + column] = v;
  }
}
// A (BK × BV) tile of a [slot][HV][K][V] workspace, rows by channel (load or store).
template <class A, int BK, int BV>
PHASOR_DEVICE void load_state_tile(const Problem& p, const simt::Span<A>& from, std::int64_t base,
                                   std::int64_t kt, std::int64_t vt,
                                   const simt::SharedArray<A>& out, int out_offset) {
  fill_shared<A>(BK * BV, out.view(out_offset, BK * BV), [&](int e) {
    const int i = e / BV, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    return channel >= 0 && column < p.V ? A(from[base + channel * p.V + column]) : A(0);
  });
}
template <class A, int BK, int BV>
PHASOR_DEVICE void store_state_tile(const Problem& p, const simt::SharedArray<A>& from,
                                    int from_offset, const simt::Span<A>& to, std::int64_t base,
                                    std::int64_t kt, std::int64_t vt) {
  for (int e = static_cast<int>(threadIdx.x); e < BK * BV; e += kThreads) {
    const int i = e / BV, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    const A v = from[from_offset + e];
    if (channel >= 0 && column < p.V) to[base + channel * p.V + column] = v;
  }
}

// A scan's whole state tile (K' × BV in key-tile order, at `at`) of sequence n, value head hv,
// value tile vt, from / to a [N, HV, K, V] tensor (zeros when `from` is undefined; nothing
// stored when `to` is).
template <class A, int BK, int BV>
PHASOR_DEVICE void load_scan_state(const Problem& p, const TensorView& from, std::int64_t n,
                                   std::int64_t hv, std::int64_t vt, int rows,
                                   const simt::SharedArray<A>& sh, int at) {
  for (int e = static_cast<int>(threadIdx.x); e < rows * BV; e += kThreads) {
    const int kt = e / (BK * BV), i = (e / BV) % BK, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    sh[at + e] = from.defined() && channel >= 0 && column < p.V
                     ? simt::load<A>(from, n, hv, channel, column)
                     : A(0);
  }
}
template <class A, int BK, int BV>
PHASOR_DEVICE void store_scan_state(const Problem& p, const simt::SharedArray<A>& sh, int at,
                                    int rows, const TensorView& to, std::int64_t n, std::int64_t hv,
                                    std::int64_t vt) {
  if (!to.defined()) return;
  for (int e = static_cast<int>(threadIdx.x); e < rows * BV; e += kThreads) {
    const int kt = e / (BK * BV), i = (e / BV) % BK, jj = e % BV;
    const std::int64_t channel = channel_of<BK>(p, kt, i), column = vt * BV + jj;
    if (channel >= 0 && column < p.V) simt::store(to, A(sh[at + e]), n, hv, channel, column);
  }
}

// The chunk's gate factors of value head hv into shared arrays of C: g, β, γ_i = exp(Σ_{s≤i} g),
// E_j = exp(Σ_{s∈(j,last]} g) (the CPU's compute_gates, one thread), and optionally Γ (C × C,
// row i: exp(Σ_{s∈(j,i]} g) for j ≤ i, 0 above the diagonal; a row per thread).
template <class A>
PHASOR_DEVICE void load_gates(const Problem& p, const Chunk& ch, std::int64_t hv, int C,
                              const simt::SharedArray<A>& g, const simt::SharedArray<A>& beta,
                              const simt::SharedArray<A>& gamma, const simt::SharedArray<A>& tail) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int j = tid; j < C; j += kThreads) {
    g[j] = j < ch.len ? simt::load<A>(p.g, ch.batch, ch.first + j, hv) : A(0);
    beta[j] = j < ch.len ? simt::load<A>(p.beta, ch.batch, ch.first + j, hv) : A(0);
  }
  simt::syncthreads();
  if (tid == 0) {
    A acc = 0;
    for (int i = 0; i < C; ++i) {
      const A gi = g[i];
      acc += gi;
      gamma[i] = i < ch.len ? simt::exp(acc) : A(0);
    }
    acc = 0;
    for (int j = ch.len - 1; j >= 0; --j) {
      tail[j] = simt::exp(acc);
      const A gj = g[j];
      acc += gj;
    }
    for (int j = ch.len; j < C; ++j) tail[j] = A(0);
  }
  simt::syncthreads();
}
template <class A>
PHASOR_DEVICE void pair_factors(const simt::SharedArray<A>& g, int len, int C,
                                const simt::SharedArray<A>& pair) {
  for (int i = static_cast<int>(threadIdx.x); i < C; i += kThreads) {
    A acc = 0;
    for (int j = C - 1; j > i; --j) pair[i * C + j] = A(0);
    if (i >= len) {
      for (int j = 0; j <= i; ++j) pair[i * C + j] = A(0);
      continue;
    }
    pair[i * C + i] = A(1);
    for (int j = i - 1; j >= 0; --j) {
      const A gate = g[j + 1];
      acc += gate;  // Σ_{s∈(j,i]} g_s, grown one token at a time away from i
      pair[i * C + j] = simt::exp(acc);
    }
  }
}

// ---- forward ------------------------------------------------------------------------------------

template <class O>
PHASOR_GLOBAL void norms_kernel(Problem p, simt::Span<Accumulator<O>> rho) {
  using A = Accumulator<O>;
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.B * p.T * p.H) return;
  const std::int64_t h = e % p.H, flat = e / p.H, b = flat / p.T, t = flat % p.T;
  rho[2 * e] = inverse_norm<A>(p, p.q, b, t, h);
  rho[2 * e + 1] = inverse_norm<A>(p, p.k, b, t, h);
}

// Shared memory of wy_kernel: Γ, KK, QK, T (C × C each), q, k tiles (C × BK each), a value
// tile (C × BV), g, β, γ, E (C each).
template <class O>
std::size_t wy_shared_bytes(int C) {
  constexpr int B = kTile<O>;
  return static_cast<std::size_t>(4 * C * C + 3 * C * B + 4 * C) * sizeof(Accumulator<O>);
}

template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads) wy_kernel(Problem p, Space<Accumulator<O>> sp) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>, BV = kTile<O>;
  const int C = sp.C;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t hv = blockIdx.y, h = hv / p.group;
  const Chunk ch = chunk_of(p, C, n, c);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int pair_at = 0, kk_at = C * C, qk_at = 2 * C * C, t_at = 3 * C * C, q_at = 4 * C * C,
            k_at = q_at + C * BK, x_at = k_at + C * BK, g_at = x_at + C * BV, beta_at = g_at + C,
            gamma_at = beta_at + C, tail_at = gamma_at + C;
  const simt::SharedArray<A> g = sh.view(g_at, C), beta = sh.view(beta_at, C),
                             gamma = sh.view(gamma_at, C), tail = sh.view(tail_at, C);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  load_gates<A>(p, ch, hv, C, g, beta, gamma, tail);
  pair_factors<A>(g, len, C, sh.view(pair_at, C * C));
  for (int x = tid; x < 2 * C * C; x += kThreads) sh[kk_at + x] = A(0);
  // K̂ K̂ᵀ and Q̃ K̂ᵀ over the key tiles.
  for (std::int64_t kt = 0; kt < key_tiles<BK>(p); ++kt) {
    simt::syncthreads();
    load_qk<A, BK>(p, sp, 0, ch, h, kt, C, sh.view(q_at, C * BK));
    load_qk<A, BK>(p, sp, 1, ch, h, kt, C, sh.view(k_at, C * BK));
    simt::syncthreads();
    const SharedMatrix<A> kmat = row_major(sh, k_at, BK, len, BK);
    gemm_to_shared<O>(kmat, kmat.transposed(), len, len, BK, sh, kk_at, C, true);
    gemm_to_shared<O>(row_major(sh, q_at, BK, len, BK), kmat.transposed(), len, len, BK, sh, qk_at,
                      C, true);
  }
  simt::syncthreads();
  // M (strictly lower, in kk's place: β_i KK_ij Γ_ij), A = QK ⊙ Γ (lower incl.), B = KK ⊙ Γ.
  const std::int64_t square = sp.square(p, ch.slot, hv);
  for (int x = tid; x < C * C; x += kThreads) {
    const int i = x / C, j = x % C;
    const A pair = sh[pair_at + x], kk = sh[kk_at + x], qk = sh[qk_at + x], b_i = beta[i];
    sp.attn[square + x] = j <= i ? qk * pair : A(0);
    sp.gram[square + x] = j < i ? kk * pair : A(0);
    sh[kk_at + x] = j < i ? b_i * kk * pair : A(0);
  }
  simt::syncthreads();
  // T = M⁻¹ (unit lower triangular) by forward substitution, one column per thread:
  // T_ic = δ_ic − Σ_{c ≤ j < i} M_ij T_jc.
  for (int col = tid; col < C; col += kThreads) {
    for (int i = 0; i < C; ++i) {
      A value = i == col ? A(1) : A(0);
      if (i > col)
        for (int j = col; j < i; ++j) {
          const A m = sh[kk_at + i * C + j], t = sh[t_at + j * C + col];
          value -= m * t;
        }
      sh[t_at + i * C + col] = value;
    }
  }
  simt::syncthreads();
  for (int x = tid; x < C * C; x += kThreads) {
    const A t = sh[t_at + x];
    sp.t_inv[square + x] = t;
  }
  // U = T diag(β) V, tile by tile.
  const SharedMatrix<A> tmat = row_major(sh, t_at, C, len, len);
  const std::int64_t rows_v = sp.rows_v(p, ch.slot, hv), rows_k = sp.rows_k(p, ch.slot, hv);
  for (std::int64_t vt = 0; vt < ceil_div(p.V, BV); ++vt) {
    simt::syncthreads();
    load_values<A, BV>(p, p.v, ch, hv, vt, C, sh.view(x_at, C * BV));
    simt::syncthreads();
    for (int x = tid; x < C * BV; x += kThreads) {
      const A v = sh[x_at + x], b = beta[x / BV];
      sh[x_at + x] = b * v;
    }
    simt::syncthreads();
    gemm_to_shared<O>(tmat, row_major(sh, x_at, BV, len, BV), len, BV, len, sh, q_at, BV, false);
    simt::syncthreads();
    store_rows_v<A, BV>(p, sh.view(q_at, C * BV), len, sp.u, rows_v, vt, C);
  }
  // W = T diag(βγ) K̂, tile by tile, stored by channel.
  for (std::int64_t kt = 0; kt < key_tiles<BK>(p); ++kt) {
    simt::syncthreads();
    load_qk<A, BK>(p, sp, 1, ch, h, kt, C, sh.view(k_at, C * BK));
    simt::syncthreads();
    for (int x = tid; x < C * BK; x += kThreads) {
      const A k = sh[k_at + x], b = beta[x / BK], gm = gamma[x / BK];
      sh[k_at + x] = b * gm * k;
    }
    simt::syncthreads();
    gemm_to_shared<O>(tmat, row_major(sh, k_at, BK, len, BK), len, BK, len, sh, q_at, BK, false);
    simt::syncthreads();
    for (int x = tid; x < C * BK; x += kThreads) {
      const int j = x / BK, i = x % BK;
      const std::int64_t channel = channel_of<BK>(p, kt, i);
      const A v = sh[q_at + x];
      if (channel >= 0) sp.w[rows_k + j * p.K + channel] = j < len ? v : A(0);
    }
  }
}

// Shared memory of states_kernel: S (K' × BV, K' = key_tiles · BK, tile order), U_new (C × BV),
// a key tile (C × BK), g, β, γ and E (C each).
template <class O, int BV>
std::size_t states_shared_bytes(const Problem& p, int C) {
  constexpr int BK = kTile<O>;
  return static_cast<std::size_t>(key_tiles<BK>(p) * BK * BV + C * BV + C * BK + 4 * C) *
         sizeof(Accumulator<O>);
}

template <class O, int BV>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    states_kernel(Problem p, TensorView final_state, Space<Accumulator<O>> sp) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  const int C = sp.C;
  const std::int64_t n = blockIdx.x / p.HV, hv = blockIdx.x % p.HV, h = hv / p.group,
                     vt = blockIdx.y;
  const int tiles = static_cast<int>(key_tiles<BK>(p)), rows = tiles * BK;
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int s_at = 0, u_at = rows * BV, k_at = u_at + C * BV, g_at = k_at + C * BK,
            beta_at = g_at + C, gamma_at = beta_at + C, tail_at = gamma_at + C;
  const simt::SharedArray<A> g = sh.view(g_at, C), beta = sh.view(beta_at, C),
                             gamma = sh.view(gamma_at, C), tail = sh.view(tail_at, C);
  const int tid = static_cast<int>(threadIdx.x);
  load_scan_state<A, BK, BV>(p, p.initial_state, n, hv, vt, rows, sh, s_at);
  const std::int64_t chunks = ceil_div(p.sequences[n].length, C);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const Chunk ch = chunk_of(p, C, n, c);
    const int len = ch.len;
    simt::syncthreads();
    const std::int64_t state_base = sp.state(p, ch.slot, hv), rows_v = sp.rows_v(p, ch.slot, hv),
                       rows_k = sp.rows_k(p, ch.slot, hv);
    for (int kt = 0; kt < tiles; ++kt)
      store_state_tile<A, BK, BV>(p, sh, s_at + kt * BK * BV, sp.states, state_base, kt, vt);
    load_gates<A>(p, ch, hv, C, g, beta, gamma, tail);
    load_rows_v<A, BV>(p, sp.u, rows_v, vt, C, sh.view(u_at, C * BV));
    // U_new = U − W S over the key tiles.
    for (int kt = 0; kt < tiles; ++kt) {
      simt::syncthreads();
      fill_shared<A>(C * BK, sh.view(k_at, C * BK), [&](int e) {
        const int j = e / BK, i = e % BK;
        const std::int64_t channel = channel_of<BK>(p, kt, i);
        return channel >= 0 && j < len ? A(sp.w[rows_k + j * p.K + channel]) : A(0);
      });
      simt::syncthreads();
      gemm_to_shared<O>(row_major(sh, k_at, BK, len, BK),
                        row_major(sh, s_at + kt * BK * BV, BV, BK, BV), len, BV, BK, sh, u_at, BV,
                        true, A(-1));
    }
    simt::syncthreads();
    store_rows_v<A, BV>(p, sh.view(u_at, C * BV), len, sp.u, rows_v, vt, C);
    // S ← γ_last S + (diag(E) K̂)ᵀ U_new.
    const A last = gamma[len - 1];
    for (int e = tid; e < rows * BV; e += kThreads) {
      const A s = sh[s_at + e];
      sh[s_at + e] = last * s;
    }
    for (int kt = 0; kt < tiles; ++kt) {
      simt::syncthreads();
      load_qk<A, BK>(p, sp, 1, ch, h, kt, C, sh.view(k_at, C * BK));
      simt::syncthreads();
      for (int e = tid; e < C * BK; e += kThreads) {
        const A k = sh[k_at + e], t = tail[e / BK];
        sh[k_at + e] = t * k;
      }
      simt::syncthreads();
      gemm_to_shared<O>(row_major(sh, k_at, BK, len, BK).transposed(),
                        row_major(sh, u_at, BV, len, BV), BK, BV, len, sh, s_at + kt * BK * BV, BV,
                        true);
    }
  }
  simt::syncthreads();
  store_scan_state<A, BK, BV>(p, sh, s_at, rows, final_state, n, hv, vt);
}

// Shared memory of output_kernel: O (C × BV), q̃ tile (C × BK), S tile (BK × BV), A (C × C),
// U_new (C × BV), g, β, γ, E.
template <class O, int BV>
std::size_t output_shared_bytes(int C) {
  constexpr int BK = kTile<O>;
  return static_cast<std::size_t>(2 * C * BV + C * BK + BK * BV + C * C + 4 * C) *
         sizeof(Accumulator<O>);
}

template <class O, int BV>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    output_kernel(Problem p, TensorView o, Space<Accumulator<O>> sp) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  const int C = sp.C;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t hv = blockIdx.y, h = hv / p.group, vt = blockIdx.z;
  const Chunk ch = chunk_of(p, C, n, c);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int o_at = 0, q_at = C * BV, s_at = q_at + C * BK, a_at = s_at + BK * BV,
            u_at = a_at + C * C, g_at = u_at + C * BV, beta_at = g_at + C, gamma_at = beta_at + C,
            tail_at = gamma_at + C;
  const simt::SharedArray<A> gamma = sh.view(gamma_at, C);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  load_gates<A>(p, ch, hv, C, sh.view(g_at, C), sh.view(beta_at, C), gamma, sh.view(tail_at, C));
  for (int x = tid; x < C * BV; x += kThreads) sh[o_at + x] = A(0);
  const std::int64_t state_base = sp.state(p, ch.slot, hv);
  for (std::int64_t kt = 0; kt < key_tiles<BK>(p); ++kt) {
    simt::syncthreads();
    load_qk<A, BK>(p, sp, 0, ch, h, kt, C, sh.view(q_at, C * BK));
    load_state_tile<A, BK, BV>(p, sp.states, state_base, kt, vt, sh, s_at);
    simt::syncthreads();
    gemm_to_shared<O>(row_major(sh, q_at, BK, len, BK), row_major(sh, s_at, BV, BK, BV), len, BV,
                      BK, sh, o_at, BV, true);
  }
  simt::syncthreads();
  for (int x = tid; x < C * BV; x += kThreads) {  // diag(γ) Q̃ S
    const A v = sh[o_at + x], gm = gamma[x / BV];
    sh[o_at + x] = gm * v;
  }
  const std::int64_t square = sp.square(p, ch.slot, hv);
  fill_shared<A>(C * C, sh.view(a_at, C * C), [&](int x) { return A(sp.attn[square + x]); });
  load_rows_v<A, BV>(p, sp.u, sp.rows_v(p, ch.slot, hv), vt, C, sh.view(u_at, C * BV));
  simt::syncthreads();
  gemm_to_shared<O>(row_major(sh, a_at, C, len, len), row_major(sh, u_at, BV, len, BV), len, BV,
                    len, sh, o_at, BV, true);
  simt::syncthreads();
  store_token_rows<A, BV>(o, ch.batch, ch.first, len, hv, vt * BV, p.V - vt * BV,
                          [&](int j, int i) { return A(sh[o_at + j * BV + i]); });
}

// ---- backward -----------------------------------------------------------------------------------

// Shared memory of dstates_kernel: dS (K' × BV), dU then Y (C × BV), dO (C × BV), −βγY (C × BV),
// a key tile and a query tile (C × BK each), Aᵀ / T (C × C), g, β, γ, E.
template <class O, int BV>
std::size_t dstates_shared_bytes(const Problem& p, int C) {
  constexpr int BK = kTile<O>;
  return static_cast<std::size_t>(key_tiles<BK>(p) * BK * BV + 3 * C * BV + 2 * C * BK + C * C +
                                  4 * C) *
         sizeof(Accumulator<O>);
}

template <class O, int BV>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dstates_kernel(Problem p, TensorView d_o, TensorView d_final_state, TensorView dh0,
                   Space<Accumulator<O>> sp) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>;
  const int C = sp.C;
  const std::int64_t n = blockIdx.x / p.HV, hv = blockIdx.x % p.HV, h = hv / p.group,
                     vt = blockIdx.y;
  const int tiles = static_cast<int>(key_tiles<BK>(p)), rows = tiles * BK;
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int ds_at = 0, y_at = rows * BV, do_at = y_at + C * BV, z_at = do_at + C * BV,
            k_at = z_at + C * BV, q_at = k_at + C * BK, m_at = q_at + C * BK, g_at = m_at + C * C,
            beta_at = g_at + C, gamma_at = beta_at + C, tail_at = gamma_at + C;
  const simt::SharedArray<A> g = sh.view(g_at, C), beta = sh.view(beta_at, C),
                             gamma = sh.view(gamma_at, C), tail = sh.view(tail_at, C);
  const int tid = static_cast<int>(threadIdx.x);
  load_scan_state<A, BK, BV>(p, d_final_state, n, hv, vt, rows, sh, ds_at);
  const std::int64_t chunks = ceil_div(p.sequences[n].length, C);
  for (std::int64_t c = chunks - 1; c >= 0; --c) {
    const Chunk ch = chunk_of(p, C, n, c);
    const int len = ch.len;
    simt::syncthreads();
    const std::int64_t state_base = sp.state(p, ch.slot, hv), square = sp.square(p, ch.slot, hv),
                       rows_v = sp.rows_v(p, ch.slot, hv);
    for (int kt = 0; kt < tiles; ++kt)
      store_state_tile<A, BK, BV>(p, sh, ds_at + kt * BK * BV, sp.dstates, state_base, kt, vt);
    load_gates<A>(p, ch, hv, C, g, beta, gamma, tail);
    load_values<A, BV>(p, d_o, ch, hv, vt, C, sh.view(do_at, C * BV));
    for (int x = tid; x < C * BV; x += kThreads) sh[y_at + x] = A(0);
    // dU = diag(E) K̂ dS + Aᵀ dO.
    for (int kt = 0; kt < tiles; ++kt) {
      simt::syncthreads();
      load_qk<A, BK>(p, sp, 1, ch, h, kt, C, sh.view(k_at, C * BK));
      simt::syncthreads();
      for (int e = tid; e < C * BK; e += kThreads) {
        const A k = sh[k_at + e], t = tail[e / BK];
        sh[k_at + e] = t * k;
      }
      simt::syncthreads();
      gemm_to_shared<O>(row_major(sh, k_at, BK, len, BK),
                        row_major(sh, ds_at + kt * BK * BV, BV, BK, BV), len, BV, BK, sh, y_at, BV,
                        true);
    }
    fill_shared<A>(C * C, sh.view(m_at, C * C), [&](int x) { return A(sp.attn[square + x]); });
    simt::syncthreads();
    gemm_to_shared<O>(row_major(sh, m_at, C, len, len).transposed(),
                      row_major(sh, do_at, BV, len, BV), len, BV, len, sh, y_at, BV, true);
    simt::syncthreads();
    // Y = Tᵀ dU (into z, then −βγY back into z after Y is stored).
    fill_shared<A>(C * C, sh.view(m_at, C * C), [&](int x) { return A(sp.t_inv[square + x]); });
    simt::syncthreads();
    gemm_to_shared<O>(row_major(sh, m_at, C, len, len).transposed(),
                      row_major(sh, y_at, BV, len, BV), len, BV, len, sh, z_at, BV, false);
    simt::syncthreads();
    store_rows_v<A, BV>(p, sh.view(z_at, C * BV), len, sp.y, rows_v, vt, C);
    for (int x = tid; x < len * BV; x += kThreads) {
      const A y = sh[z_at + x], b = beta[x / BV], gm = gamma[x / BV];
      sh[z_at + x] = -(b * gm) * y;
    }
    // dS ← γ_last dS + K̂ᵀ (−diag(βγ) Y) + (diag(γ) Q̃)ᵀ dO.
    const A last = gamma[len - 1];
    for (int e = tid; e < rows * BV; e += kThreads) {
      const A s = sh[ds_at + e];
      sh[ds_at + e] = last * s;
    }
    for (int kt = 0; kt < tiles; ++kt) {
      simt::syncthreads();
      load_qk<A, BK>(p, sp, 1, ch, h, kt, C, sh.view(k_at, C * BK));
      load_qk<A, BK>(p, sp, 0, ch, h, kt, C, sh.view(q_at, C * BK));
      simt::syncthreads();
      for (int e = tid; e < C * BK; e += kThreads) {
        const A q = sh[q_at + e], gm = gamma[e / BK];
        sh[q_at + e] = gm * q;
      }
      simt::syncthreads();
      gemm_to_shared<O>(row_major(sh, k_at, BK, len, BK).transposed(),
                        row_major(sh, z_at, BV, len, BV), BK, BV, len, sh, ds_at + kt * BK * BV, BV,
                        true);
      gemm_to_shared<O>(row_major(sh, q_at, BK, len, BK).transposed(),
                        row_major(sh, do_at, BV, len, BV), BK, BV, len, sh, ds_at + kt * BK * BV,
                        BV, true);
    }
  }
  simt::syncthreads();
  store_scan_state<A, BK, BV>(p, sh, ds_at, rows, dh0, n, hv, vt);
}

// The arrays of dvalue_kernel.
struct DvalueLayout {
  int dattn, dm, pair;                      // C × C
  int ks, qs, kds;                          // C × BV accumulators: K̂S, Q̃S, K̂dS
  int u, y, d_o, v;                         // C × BV tiles
  int k, q;                                 // C × BK tiles
  int s, ds;                                // BK × BV tiles
  int g, beta, gamma, tail;                 // C
  int vy, ksy, qsdo, dtail, dgamma, dbeta;  // C: per-token sums
  int sds;                                  // 1
  int total;
};
template <class O>
PHASOR_HOST_DEVICE DvalueLayout dvalue_layout(int C) {
  constexpr int B = kTile<O>;
  DvalueLayout l;
  int at = 0;
  const auto take = [&](int count) {
    const int here = at;
    at += count;
    return here;
  };
  l.dattn = take(C * C), l.dm = take(C * C);
  l.ks = take(C * B), l.qs = take(C * B), l.kds = take(C * B);
  l.u = take(C * B), l.y = take(C * B), l.d_o = take(C * B), l.v = take(C * B);
  l.k = take(C * B), l.q = take(C * B);
  l.s = take(B * B), l.ds = take(B * B);
  l.g = take(C), l.beta = take(C), l.gamma = take(C), l.tail = take(C);
  l.vy = take(C), l.ksy = take(C), l.qsdo = take(C), l.dtail = take(C), l.dgamma = take(C),
  l.dbeta = take(C);
  l.sds = take(2);
  l.total = at;
  return l;
}

// dv, dβ, dg of one chunk and value head, and its pair matrices for dqk (the CPU's
// backward_chunk, the parts that need sums over the value dimension).
template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dvalue_kernel(Problem p, TensorView d_o, GatedDeltaRuleGrads grads, Space<Accumulator<O>> sp) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>, BV = kTile<O>;
  const int C = sp.C;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t hv = blockIdx.y, h = hv / p.group;
  const Chunk ch = chunk_of(p, C, n, c);
  const DvalueLayout l = dvalue_layout<O>(C);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const simt::SharedArray<A> g = sh.view(l.g, C), beta = sh.view(l.beta, C),
                             gamma = sh.view(l.gamma, C), tail = sh.view(l.tail, C);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  load_gates<A>(p, ch, hv, C, g, beta, gamma, tail);
  for (int x = tid; x < 2 * C * C; x += kThreads) sh[l.dattn + x] = A(0);
  for (int x = tid; x < 6 * C; x += kThreads) sh[l.vy + x] = A(0);
  if (tid == 0) sh[l.sds] = A(0);
  const std::int64_t state_base = sp.state(p, ch.slot, hv), rows_v = sp.rows_v(p, ch.slot, hv);
  const int tiles = static_cast<int>(key_tiles<BK>(p));
  for (std::int64_t vt = 0; vt < ceil_div(p.V, BV); ++vt) {
    simt::syncthreads();
    for (int x = tid; x < 3 * C * BV; x += kThreads) sh[l.ks + x] = A(0);
    load_rows_v<A, BV>(p, sp.u, rows_v, vt, C, sh.view(l.u, C * BV));
    load_rows_v<A, BV>(p, sp.y, rows_v, vt, C, sh.view(l.y, C * BV));
    load_values<A, BV>(p, d_o, ch, hv, vt, C, sh.view(l.d_o, C * BV));
    load_values<A, BV>(p, p.v, ch, hv, vt, C, sh.view(l.v, C * BV));
    // K̂S, Q̃S, K̂dS over the key tiles; Σ S ⊙ dS.
    for (int kt = 0; kt < tiles; ++kt) {
      simt::syncthreads();
      load_qk<A, BK>(p, sp, 1, ch, h, kt, C, sh.view(l.k, C * BK));
      load_qk<A, BK>(p, sp, 0, ch, h, kt, C, sh.view(l.q, C * BK));
      load_state_tile<A, BK, BV>(p, sp.states, state_base, kt, vt, sh, l.s);
      load_state_tile<A, BK, BV>(p, sp.dstates, state_base, kt, vt, sh, l.ds);
      simt::syncthreads();
      const SharedMatrix<A> kmat = row_major(sh, l.k, BK, len, BK);
      gemm_to_shared<O>(kmat, row_major(sh, l.s, BV, BK, BV), len, BV, BK, sh, l.ks, BV, true);
      gemm_to_shared<O>(row_major(sh, l.q, BK, len, BK), row_major(sh, l.s, BV, BK, BV), len, BV,
                        BK, sh, l.qs, BV, true);
      gemm_to_shared<O>(kmat, row_major(sh, l.ds, BV, BK, BV), len, BV, BK, sh, l.kds, BV, true);
      if (tid == 0) {
        A sum = sh[l.sds];
        for (int e = 0; e < BK * BV; ++e) {
          const A s = sh[l.s + e], d = sh[l.ds + e];
          sum += s * d;
        }
        sh[l.sds] = sum;
      }
    }
    simt::syncthreads();
    // Per token: v·Y, (K̂S)·Y, dO·(Q̃S), U_new·(K̂dS); dv = β Y.
    for (int j = tid; j < len; j += kThreads) {
      A vy = sh[l.vy + j], ksy = sh[l.ksy + j], qsdo = sh[l.qsdo + j], dt = sh[l.dtail + j];
      for (int jj = 0; jj < BV; ++jj) {
        const A v = sh[l.v + j * BV + jj], y = sh[l.y + j * BV + jj], ks = sh[l.ks + j * BV + jj],
                qs = sh[l.qs + j * BV + jj], dov = sh[l.d_o + j * BV + jj],
                u = sh[l.u + j * BV + jj], kds = sh[l.kds + j * BV + jj];
        vy += v * y;
        ksy += ks * y;
        qsdo += qs * dov;
        dt += u * kds;
      }
      sh[l.vy + j] = vy;
      sh[l.ksy + j] = ksy;
      sh[l.qsdo + j] = qsdo;
      sh[l.dtail + j] = dt;
    }
    if (grads.dv.defined())
      store_token_rows<A, BV>(grads.dv, ch.batch, ch.first, len, hv, vt * BV, p.V - vt * BV,
                              [&](int j, int i) {
                                const A y = sh[l.y + j * BV + i], b = beta[j];
                                return b * y;
                              });
    // dA = dO U_newᵀ and dm = Y U_newᵀ (lower parts read later).
    gemm_to_shared<O>(row_major(sh, l.d_o, BV, len, BV),
                      row_major(sh, l.u, BV, len, BV).transposed(), len, len, BV, sh, l.dattn, C,
                      true);
    gemm_to_shared<O>(row_major(sh, l.y, BV, len, BV), row_major(sh, l.u, BV, len, BV).transposed(),
                      len, len, BV, sh, l.dm, C, true);
  }
  simt::syncthreads();
  // Pairs (one row per thread): weight_ij = dA_ij A_ij + dM_ij β_i B_ij (i > j), dβ_i's M part,
  // dA ⊙ Γ and ∂/∂(K̂K̂ᵀ)_ij = dM_ij β_i Γ_ij stored for dqk (dM = −dm). The weights go to the
  // k-tile arrays (no longer needed): row sums into l.k, column sums below.
  const std::int64_t square = sp.square(p, ch.slot, hv);
  for (int i = tid; i < C; i += kThreads) {
    A dbeta = 0, row_weight = 0, sum = 0;  // sum: Σ_{s∈(j,i]} g_s, grown from i backwards
    const A b_i = beta[i];
    for (int j = C - 1; j >= 0; --j) {
      const A da = sh[l.dattn + i * C + j];
      const A dm = -A(sh[l.dm + i * C + j]);
      A dattn_pair = 0, dgram = 0, weight = 0;
      if (i < len && j <= i) {
        A pair = 1;  // Γ_ij, as pair_factors
        if (j < i) {
          const A gate = g[j + 1];
          sum += gate;
          pair = simt::exp(sum);
        }
        const A attn = sp.attn[square + i * C + j];
        dattn_pair = da * pair;
        if (j < i) {
          const A gram = sp.gram[square + i * C + j];
          dbeta += dm * gram;
          weight = da * attn + dm * b_i * gram;
          row_weight += weight;
          dgram = dm * b_i * pair;
        }
      }
      sh[l.dm + i * C + j] = weight;  // weight_ij in dm's place (this thread's row)
      sp.dattn[square + i * C + j] = dattn_pair;
      sp.dgram[square + i * C + j] = dgram;
    }
    sh[l.dbeta + i] = dbeta;
    sh[l.k + i] = row_weight;
  }
  simt::syncthreads();
  // dβ_i = v·Y − γ_i (K̂S)·Y + the M part; dγ_i = −β_i (K̂S)·Y + dO·(Q̃S), dγ_last += Σ S ⊙ dS;
  // then the gates (one thread, the CPU's order): dg_s = Σ_{i≥s} dγ_i γ_i + Σ_{j<s} dtail_j E_j
  // + Σ_{i≥s} Σ_{j<s} W_ij (telescoping: F(s+1) = F(s) + Σ_{i>s} W_is − Σ_{j<s} W_sj).
  if (tid == 0) {
    for (int i = 0; i < len; ++i) {
      const A ksy = sh[l.ksy + i], b = beta[i], gm = gamma[i];
      const A vy = sh[l.vy + i], qsdo = sh[l.qsdo + i], dbeta_m = sh[l.dbeta + i];
      sh[l.dbeta + i] = vy - gm * ksy + dbeta_m;
      sh[l.dgamma + i] = qsdo - b * ksy;
    }
    const A sds = sh[l.sds], last = sh[l.dgamma + len - 1];
    sh[l.dgamma + len - 1] = last + sds;
    A acc = 0;
    for (int s = len - 1; s >= 0; --s) {
      const A dgm = sh[l.dgamma + s], gm = gamma[s];
      acc += dgm * gm;
      sh[l.q + s] = acc;  // dg (the q tile is free)
    }
    acc = 0;
    for (int s = 0; s < len; ++s) {
      const A dg = sh[l.q + s];
      sh[l.q + s] = dg + acc;
      const A dt = sh[l.dtail + s], t = tail[s];
      acc += dt * t;
    }
    acc = 0;
    for (int s = 0; s < len; ++s) {
      const A dg = sh[l.q + s];
      sh[l.q + s] = dg + acc;
      A column = 0;
      for (int i = s + 1; i < len; ++i) {
        const A w = sh[l.dm + i * C + s];
        column += w;
      }
      const A row = sh[l.k + s];
      acc += column - row;
    }
  }
  simt::syncthreads();
  for (int j = tid; j < len; j += kThreads) {
    if (grads.dbeta.defined())
      simt::store(grads.dbeta, A(sh[l.dbeta + j]), ch.batch, ch.first + j, hv);
    if (grads.dg.defined()) simt::store(grads.dg, A(sh[l.q + j]), ch.batch, ch.first + j, hv);
  }
}

// The arrays of dqk_kernel.
struct DqkLayout {
  int q, k, dq, dk, da, dgr;  // C × BK (q, k, dq, dk), C × C (dA ⊙ Γ, ∂/∂KK)
  int u, y, d_o;              // C × BV
  int s, ds;                  // BK × BV
  int x;                      // C × BK scratch
  int g, beta, gamma, tail;   // C
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
  l.q = take(C * B), l.k = take(C * B), l.dq = take(C * B), l.dk = take(C * B);
  l.da = take(C * C), l.dgr = take(C * C);
  l.u = take(C * B), l.y = take(C * B), l.d_o = take(C * B);
  l.s = take(B * B), l.ds = take(B * B);
  l.x = take(C * B);
  l.g = take(C), l.beta = take(C), l.gamma = take(C), l.tail = take(C);
  l.total = at;
  return l;
}

// dq̃ and dk̂ of one chunk, q/k head and key tile, summed over the group's value heads, into the
// dq / dk workspaces (by channel, rotated and normalised frame).
template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dqk_kernel(Problem p, TensorView d_o, Space<Accumulator<O>> sp) {
  using A = Accumulator<O>;
  constexpr int BK = kTile<O>, BV = kTile<O>;
  const int C = sp.C;
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, C, blockIdx.x, n, c)) return;
  const std::int64_t h = blockIdx.y, kt = blockIdx.z;
  const Chunk ch = chunk_of(p, C, n, c);
  const DqkLayout l = dqk_layout<O>(C);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const simt::SharedArray<A> g = sh.view(l.g, C), beta = sh.view(l.beta, C),
                             gamma = sh.view(l.gamma, C), tail = sh.view(l.tail, C);
  const int tid = static_cast<int>(threadIdx.x), len = ch.len;
  load_qk<A, BK>(p, sp, 0, ch, h, kt, C, sh.view(l.q, C * BK));
  load_qk<A, BK>(p, sp, 1, ch, h, kt, C, sh.view(l.k, C * BK));
  for (int x = tid; x < 2 * C * BK; x += kThreads) sh[l.dq + x] = A(0);
  const SharedMatrix<A> qmat = row_major(sh, l.q, BK, len, BK),
                        kmat = row_major(sh, l.k, BK, len, BK);
  for (std::int64_t r = 0; r < p.group; ++r) {
    const std::int64_t hv = h * p.group + r;
    simt::syncthreads();
    load_gates<A>(p, ch, hv, C, g, beta, gamma, tail);
    const std::int64_t square = sp.square(p, ch.slot, hv), rows_v = sp.rows_v(p, ch.slot, hv),
                       state_base = sp.state(p, ch.slot, hv);
    fill_shared<A>(C * C, sh.view(l.da, C * C), [&](int x) { return A(sp.dattn[square + x]); });
    fill_shared<A>(C * C, sh.view(l.dgr, C * C), [&](int x) { return A(sp.dgram[square + x]); });
    // Over the value tiles: x = U_new dSᵀ (for dk via E), dk += (−βγY) Sᵀ, x2 = dO Sᵀ (for dq via
    // γ).
    for (int x = tid; x < C * BK; x += kThreads) sh[l.x + x] = A(0);
    for (std::int64_t vt = 0; vt < ceil_div(p.V, BV); ++vt) {
      simt::syncthreads();
      load_rows_v<A, BV>(p, sp.u, rows_v, vt, C, sh.view(l.u, C * BV));
      load_rows_v<A, BV>(p, sp.y, rows_v, vt, C, sh.view(l.y, C * BV));
      load_values<A, BV>(p, d_o, ch, hv, vt, C, sh.view(l.d_o, C * BV));
      load_state_tile<A, BK, BV>(p, sp.states, state_base, kt, vt, sh, l.s);
      load_state_tile<A, BK, BV>(p, sp.dstates, state_base, kt, vt, sh, l.ds);
      simt::syncthreads();
      for (int x = tid; x < C * BV; x += kThreads) {
        const A y = sh[l.y + x], b = beta[x / BV], gm = gamma[x / BV];
        sh[l.y + x] = -(b * gm) * y;
      }
      simt::syncthreads();
      // x += U_new dSᵀ (dk gets diag(E) x after the loop); dk += (−βγY) Sᵀ; dq += diag(γ) dO Sᵀ
      // (γ applied below, through the d_o tile).
      gemm_to_shared<O>(row_major(sh, l.u, BV, len, BV),
                        row_major(sh, l.ds, BV, BK, BV).transposed(), len, BK, BV, sh, l.x, BK,
                        true);
      gemm_to_shared<O>(row_major(sh, l.y, BV, len, BV),
                        row_major(sh, l.s, BV, BK, BV).transposed(), len, BK, BV, sh, l.dk, BK,
                        true);
      for (int x = tid; x < C * BV; x += kThreads) {
        const A dov = sh[l.d_o + x], gm = gamma[x / BV];
        sh[l.d_o + x] = gm * dov;
      }
      simt::syncthreads();
      gemm_to_shared<O>(row_major(sh, l.d_o, BV, len, BV),
                        row_major(sh, l.s, BV, BK, BV).transposed(), len, BK, BV, sh, l.dq, BK,
                        true);
    }
    simt::syncthreads();
    for (int x = tid; x < C * BK; x += kThreads) {  // dk += diag(E) U_new dSᵀ
      const A v = sh[l.x + x], t = tail[x / BK], dk = sh[l.dk + x];
      sh[l.dk + x] = dk + t * v;
    }
    simt::syncthreads();
    // dq += (dA ⊙ Γ) K̂, dk += (dA ⊙ Γ)ᵀ Q̃, dk += (∂KK + ∂KKᵀ) K̂.
    const SharedMatrix<A> da = row_major(sh, l.da, C, len, len),
                          dgr = row_major(sh, l.dgr, C, len, len);
    gemm_to_shared<O>(da, kmat, len, BK, len, sh, l.dq, BK, true);
    gemm_to_shared<O>(da.transposed(), qmat, len, BK, len, sh, l.dk, BK, true);
    simt::syncthreads();
    gemm_to_shared<O>(dgr, kmat, len, BK, len, sh, l.dk, BK, true);
    simt::syncthreads();
    gemm_to_shared<O>(dgr.transposed(), kmat, len, BK, len, sh, l.dk, BK, true);
  }
  simt::syncthreads();
  for (int x = tid; x < len * BK; x += kThreads) {
    const int j = x / BK, i = x % BK;
    const std::int64_t channel = channel_of<BK>(p, kt, i);
    if (channel < 0) continue;
    const std::int64_t row = ((ch.batch * p.T + ch.first + j) * p.H + h) * p.K + channel;
    const A dq = sh[l.dq + x], dk = sh[l.dk + x];
    if (sp.dq.size > 0) sp.dq[row] = dq;
    if (sp.dk.size > 0) sp.dk[row] = dk;
  }
}

// ---- host ---------------------------------------------------------------------------------------

// Value tiles. The output kernel takes 64 value columns per block when V > 32 (q and the
// gates are then read once per 64 columns rather than per 32; scripts/roofline.py: a quarter
// fewer bytes in that kernel). The scans (states, dstates) are sequential over chunks, so their
// only parallelism is the grid of (sequence, value head, value tile): they take 64-column tiles
// only while that grid keeps kScanBlocks blocks (one per SM on an H100's 132 or an A100's 108),
// otherwise 32 (B = 2, H = 16, V = 128, fla's benchmark shape: 128 blocks of 32 columns rather
// than 64 of 64). float64 keeps kTile (16) everywhere. Results do not depend on the tiles: every
// output element sums over the same key and token tiles in the same order (tested). A K whose
// K × kTile state tile does not fit the shared-memory budget is a clear error (K ≤ 256 always
// fits).
constexpr std::int64_t kScanBlocks = 128;

struct ValueTiles {
  int scan, output;
};
template <class O, int BV>
bool scan_fits(const Problem& p, int C) {
  return std::max(states_shared_bytes<O, BV>(p, C), dstates_shared_bytes<O, BV>(p, C)) <=
         kSharedBudget;
}
template <class O>
ValueTiles value_tiles(const Problem& p) {
  const int C = kernel_chunk_size(p.chunk_size);
  if (!scan_fits<O, kTile<O>>(p, C)) {
    Problem largest = p;
    while (largest.K > 0 && !scan_fits<O, kTile<O>>(largest, C)) --largest.K;
    throw Error("chunk_gated_delta_rule on the GPU: argument 'k': expected a key dimension K ≤ " +
                std::to_string(largest.K) + " (at chunk_size " + std::to_string(C) + " in " +
                phasor::to_string(p.q.dtype) + ", a K × " + std::to_string(kTile<O>) +
                " state tile must fit in " + std::to_string(kSharedBudget / 1024) +
                " KiB of shared memory), got K = " + std::to_string(p.K));
  }
  ValueTiles tiles{kTile<O>, kTile<O>};
  if constexpr (!std::is_same_v<O, double>) {
    if (p.V > kTile<O>) tiles.output = 64;
    if (p.V > kTile<O> && p.num_sequences() * p.HV * ceil_div(p.V, 64) >= kScanBlocks &&
        scan_fits<O, 64>(p, C))
      tiles.scan = 64;
  }
  return tiles;
}

// Calls f(std::integral_constant<int, BV>{}) for a value tile of 64 or kTile<O>.
template <class O, class F>
void with_value_tile(int tile, F&& f) {
  if constexpr (!std::is_same_v<O, double>)
    if (tile == 64) return f(std::integral_constant<int, 64>{});
  f(std::integral_constant<int, kTile<O>>{});
}

// A clear error for a call the kernels cannot take, before anything runs.
void check_limits(const Problem& p) {
  dispatch_operand(p.q.dtype, [&](auto operand) { value_tiles<decltype(operand)>(p); });
}

template <class O>
struct Run {
  using A = Accumulator<O>;
  const Problem& p;
  cuda::Stream stream;
  int C;
  std::int64_t slots;
  ValueTiles tiles = value_tiles<O>(p);

  simt::Dim3 chunk_grid(std::int64_t y, std::int64_t z = 1) const {
    return simt::Dim3(static_cast<unsigned>(slots), static_cast<unsigned>(y),
                      static_cast<unsigned>(z));
  }
  simt::Dim3 scan_grid() const {
    return simt::Dim3(static_cast<unsigned>(p.num_sequences() * p.HV),
                      static_cast<unsigned>(ceil_div(p.V, tiles.scan)));
  }
  // norms, wy and states: everything the output and the backward need.
  void prepare(Space<A>& sp, const TensorView& final_state) const {
    if (p.l2norm && p.B * p.T * p.H > 0)
      PHASOR_LAUNCH((norms_kernel<O>),
                    simt::Dim3(static_cast<unsigned>(ceil_div(p.B * p.T * p.H, kThreads))),
                    simt::Dim3(kThreads), 0, stream, p, sp.rho);
    PHASOR_LAUNCH((wy_kernel<O>), chunk_grid(p.HV), simt::Dim3(kThreads), wy_shared_bytes<O>(C),
                  stream, p, sp);
    with_value_tile<O>(tiles.scan, [&](auto tile) {
      constexpr int BV = decltype(tile)::value;
      PHASOR_LAUNCH((states_kernel<O, BV>), scan_grid(), simt::Dim3(kThreads),
                    (states_shared_bytes<O, BV>(p, C)), stream, p, final_state, sp);
    });
  }
};

// Lays the workspace out (what `backward` needs too when set).
template <class A>
struct Workspaces {
  simt::Workspace memory;
  Space<A> space;
  Workspaces(const Problem& p, int C, std::int64_t slots, bool backward, bool qk_grads,
             cuda::Stream stream)
      : memory(bytes(p, C, slots, backward, qk_grads), stream) {
    space.C = C;
    A* at = static_cast<A*>(memory.data());
    const auto take = [&](std::int64_t count) {
      const simt::Span<A> span{at, count};
      at += count;
      return span;
    };
    const Counts n = counts(p, C, slots, backward, qk_grads);
    space.rho = take(n.rho);
    space.t_inv = take(n.square), space.attn = take(n.square), space.gram = take(n.square);
    space.u = take(n.rows_v), space.w = take(n.rows_k), space.states = take(n.state);
    if (backward) {
      space.dstates = take(n.state), space.y = take(n.rows_v);
      space.dattn = take(n.square), space.dgram = take(n.square);
      space.dq = take(n.qk), space.dk = take(n.qk);
    }
  }
  struct Counts {
    std::int64_t rho, square, rows_v, rows_k, state, qk;
  };
  static Counts counts(const Problem& p, int C, std::int64_t slots, bool, bool qk_grads) {
    const std::int64_t heads = slots * p.HV;
    return {p.l2norm ? 2 * p.B * p.T * p.H : 0,
            heads * C * C,
            heads * C * p.V,
            heads * C * p.K,
            heads * p.K * p.V,
            qk_grads ? p.B * p.T * p.H * p.K : 0};
  }
  static std::size_t bytes(const Problem& p, int C, std::int64_t slots, bool backward,
                           bool qk_grads) {
    const Counts n = counts(p, C, slots, backward, qk_grads);
    std::int64_t total = n.rho + 3 * n.square + n.rows_v + n.rows_k + n.state;
    if (backward) total += n.state + n.rows_v + 2 * n.square + 2 * n.qk;
    return static_cast<std::size_t>(total) * sizeof(A);
  }
};

template <class O>
void forward_typed(const Problem& p, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states, cuda::Stream stream) {
  using A = Accumulator<O>;
  const int C = kernel_chunk_size(p.chunk_size);
  const std::int64_t slots = p.sequences.chunk_slot_count(C);
  const Run<O> run{p, stream, C, slots};
  Workspaces<A> work(p, C, slots, false, false, stream);
  run.prepare(work.space, final_state);
  // The states entering the chunks, [slot][HV][K][V] as chunk_states (api.cpp checked its shape:
  // the slots of its chunk_size are the kernels'; phasor/common.h).
  if (chunk_states.defined())
    copy_view(TensorView::contiguous(work.space.states.data, dtype_of<A>(), {slots, p.HV, p.K, p.V},
                                     p.device),
              chunk_states, stream);
  with_value_tile<O>(run.tiles.output, [&](auto tile) {
    constexpr int BV = decltype(tile)::value;
    PHASOR_LAUNCH((output_kernel<O, BV>), run.chunk_grid(p.HV, ceil_div(p.V, BV)),
                  simt::Dim3(kThreads), (output_shared_bytes<O, BV>(C)), stream, p, o, work.space);
  });
}

template <class O>
void backward_typed(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                    const GatedDeltaRuleGrads& grads, cuda::Stream stream) {
  using A = Accumulator<O>;
  const int C = kernel_chunk_size(p.chunk_size);
  const std::int64_t slots = p.sequences.chunk_slot_count(C);
  const Run<O> run{p, stream, C, slots};
  const bool qk_grads =
      grads.dq.defined() || grads.dk.defined() || (p.theta.defined() && grads.dtheta.defined());
  Workspaces<A> work(p, C, slots, true, qk_grads, stream);
  Space<A>& sp = work.space;
  run.prepare(sp, TensorView{});
  with_value_tile<O>(run.tiles.scan, [&](auto tile) {
    constexpr int BV = decltype(tile)::value;
    PHASOR_LAUNCH((dstates_kernel<O, BV>), run.scan_grid(), simt::Dim3(kThreads),
                  (dstates_shared_bytes<O, BV>(p, C)), stream, p, d_o, d_final_state, grads.dh0,
                  sp);
  });
  PHASOR_LAUNCH((dvalue_kernel<O>), run.chunk_grid(p.HV), simt::Dim3(kThreads),
                static_cast<std::size_t>(dvalue_layout<O>(C).total) * sizeof(A), stream, p, d_o,
                grads, sp);
  if (!qk_grads) return;
  PHASOR_LAUNCH((dqk_kernel<O>), run.chunk_grid(p.H, key_tiles<kTile<O>>(p)), simt::Dim3(kThreads),
                static_cast<std::size_t>(dqk_layout<O>(C).total) * sizeof(A), stream, p, d_o, sp);
  const std::int64_t rows = p.B * p.T * p.H;
  if (rows > 0)
    PHASOR_LAUNCH((finish_qk_kernel<A>), simt::Dim3(static_cast<unsigned>(ceil_div(rows, 256))),
                  simt::Dim3(256), 0, stream, p, QkPartials<A>{sp.dq, sp.dk, 1, 1}, grads);
}

}  // namespace

void chunk_forward(const Problem& problem, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states) {
  check_limits(problem);
  if (problem.num_sequences() * problem.HV == 0 || problem.V == 0) return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.theta, &p.initial_state})
    *input = stage(*input, {o, final_state});
  dispatch_operand(p.q.dtype, [&](auto operand) {
    forward_typed<decltype(operand)>(p, o, final_state, chunk_states, stream);
  });
}

void chunk_backward(const Problem& problem, const TensorView& d_o, const TensorView& d_final_state,
                    const GatedDeltaRuleGrads& grads) {
  check_limits(problem);
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
  const std::initializer_list<TensorView> outputs = {grads.dq,    grads.dk,  grads.dv,    grads.dg,
                                                     grads.dbeta, grads.dh0, grads.dtheta};
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.theta, &p.initial_state})
    *input = stage(*input, outputs);
  const TensorView d_o_in = stage(d_o, outputs), d_final_in = stage(d_final_state, outputs);
  dispatch_operand(p.q.dtype, [&](auto operand) {
    backward_typed<decltype(operand)>(p, d_o_in, d_final_in, grads, stream);
  });
}

}  // namespace phasor::PHASOR_BACKEND::gdn
