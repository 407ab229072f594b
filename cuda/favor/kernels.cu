// Performer FAVOR+ on the GPU (favor.h; cuda/favor/favor.h), written once for nvcc and the
// emulated GPU: the feature map with its stabilisers and dW, and the causal and non-causal
// attention. They compute what src/favor/kernels.cpp computes:
//   u_t,r = w_rᵀx̂_t − |x̂_t|²/2,   φ(x̂_t)_r = exp(u_t,r − c_t)/√m,
// with c the query (row max; the |x̂_t|²/2 then cancels and is left out of u) or key (max over the
// sequence) stabiliser, or 0; the backward holds c constant: with G = dΦ ⊙ Φ,
//   dX̂ = G W − diag(Σ_r G) X̂,   dW = Σ_tokens Gᵀ X̂.
// The attention's features are stabilised per feature, as on the CPU (src/favor/kernels.cpp,
// attention_features): the keys' u_j,r − c_r with c_r their max over the sequence (or the running
// max c_t,r, causal, with the log gates g_t,r = c_{t−1},r − c_t,r), and the queries' w_rᵀq̂_i + c_r
// minus its row max (no |q̂_i|²/2: it cancels in o, and so does Σ_r G in the queries' dX̂).
// Kernels (row = one token of one head; row-local work in tiles of 16 tokens of one sequence,
// found on the device from cu_seqlens like the chunk kernels' chunks, cuda/common/chunks.h):
//   project    (tile, head): u and each row's max, W streamed through shared memory in tiles of
//              32 features.
//   stabilise  (sequence, head): the key max (one thread walks the sequence); for the attention
//              feature_stabilise (sequence, head, feature): c_r or the running c_t,r, moved from
//              the keys' exponents to the queries', and the gates; then row_shift: the queries'
//              row max.
//   features   (element): φ = exp(u − c)/√m.
//   grads      (tile, head): G and dX̂; dw_parts (256-token segment, w head, 32 × 32 block of W)
//              sums Gᵀ X̂ over the segment and dw_sum adds the segments in order.
// Non-causal attention: kv (sequence, head, 32 columns of [v | 1]) Sx = Σ_j φ(k̂_j) [v_j | 1]ᵀ,
// attend (tile, head) Ox = φ(q̂) Sx, o = num / den (and for the backward dOx and dΦ_q), dkv
// (sequence, head, columns) dSx = Σ_i φ(q̂_i)ᵀ dOx_i, kv_grads (tile, head) dΦ_k = [v | 1] dSxᵀ
// and dv. Causal attention runs GLA (phasor/gla.h, on the same device) on φ(q̂), the running-
// stabilised φ(k̂), [v | 1] and the per-feature gates, exactly as the CPU kernel does.
//
// Every product is an exact FMA tile in float32 (float64 for float64 inputs), also for 16-bit
// inputs: an error δ in u = wᵀx̂ is a relative error δ in φ, and bfloat16 operands would make it
// ~|u| · 2⁻⁸. Fixed orders everywhere: bit-identical run to run.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "common/chunks.h"
#include "common/gemm.h"
#include "common/recurrent.h"
#include "common/staging.h"
#include "favor/favor.h"
#include "phasor/gla.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::favor {
namespace {

using ::phasor::detail::Sequence;
using ::phasor::detail::Sequences;
using ::phasor::detail::favor::AttentionProblem;
using ::phasor::detail::favor::FeatureProblem;
using ::phasor::detail::favor::Shape;

constexpr int kThreads = 128;
constexpr int kRows = 16;      // tokens per tile
constexpr int kTile = 32;      // features / columns per shared tile
constexpr int kSegment = 256;  // tokens per dW partial
constexpr std::int64_t kNoShift = 0;

// How the stabiliser of a row is found.
enum class Shift : int { none = 0, row = 1, key = 2 };

// The sizes every FAVOR kernel needs, as plain data.
struct Dims {
  Sequences sequences;
  std::int64_t B = 0, T = 0, H = 0, d = 0, m = 0;
  bool w_per_head = false;

  PHASOR_HOST_DEVICE std::int64_t rows() const { return B * T * H; }
  PHASOR_HOST_DEVICE std::int64_t row(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * T + t) * H + h;
  }
};
Dims dims_of(const Shape& sh, const TensorView& x) {
  Dims d;
  d.sequences = sh.sequences;
  d.B = x.size(0);
  d.T = x.size(1);
  d.H = sh.H;
  d.d = sh.d;
  d.m = sh.m;
  d.w_per_head = sh.w_per_head;
  return d;
}

// A tile: up to kRows tokens of one sequence (chunk slots of kRows tokens).
struct Tile {
  std::int64_t n = 0, batch = 0, first = 0;
  int len = 0;
};
PHASOR_DEVICE bool tile_of(const Dims& dm, std::int64_t slot, Tile& tile) {
  std::int64_t n, c;
  if (!locate_chunk(dm.sequences, kRows, slot, n, c)) return false;
  const Sequence s = dm.sequences[n];
  tile.n = n;
  tile.batch = s.batch;
  tile.first = s.start + c * kRows;
  const std::int64_t left = s.length - c * kRows;
  tile.len = static_cast<int>(left < kRows ? left : kRows);
  return true;
}

template <class A>
PHASOR_DEVICE A w_at(const Dims& dm, const TensorView& w, std::int64_t h, std::int64_t r,
                     std::int64_t i) {
  return dm.w_per_head ? simt::load<A>(w, h, r, i) : simt::load<A>(w, r, i);
}

// out (kRows × d) = s · x rows of the tile (0 past it).
template <class A>
PHASOR_DEVICE void load_scaled_rows(const Dims& dm, const TensorView& x, A s, const Tile& tile,
                                    std::int64_t h, const simt::SharedArray<A>& out) {
  for (std::int64_t e = threadIdx.x; e < kRows * dm.d; e += kThreads) {
    const std::int64_t j = e / dm.d, i = e % dm.d;
    out[e] = j < tile.len ? s * simt::load<A>(x, tile.batch, tile.first + j, h, i) : A(0);
  }
}
// out (kTile × d) = rows [r0, r0 + kTile) of head h's W (0 past m).
template <class A>
PHASOR_DEVICE void load_w_tile(const Dims& dm, const TensorView& w, std::int64_t h, std::int64_t r0,
                               const simt::SharedArray<A>& out) {
  for (std::int64_t e = threadIdx.x; e < kTile * dm.d; e += kThreads) {
    const std::int64_t r = r0 + e / dm.d, i = e % dm.d;
    out[e] = r < dm.m ? w_at<A>(dm, w, h, r, i) : A(0);
  }
}

// ---- features -----------------------------------------------------------------------------------

// u (rows × m) and each row's max; shift = the row max (Shift::row) or 0 (Shift::none) — the key
// stabiliser is set by stabilise_kernel from the maxima. With the row max u leaves out the row's
// |x̂|²/2, which cancels in u − max_r u (in float32 it would round the exponent by eps |x̂|²/2).
template <class A>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    project_kernel(Dims dm, TensorView x, A s, TensorView w, simt::Span<A> u, simt::Span<A> rowmax,
                   simt::Span<A> shift, int shift_kind) {
  Tile tile;
  if (!tile_of(dm, blockIdx.x, tile)) return;
  const std::int64_t h = blockIdx.y;
  const int d = static_cast<int>(dm.d), tid = static_cast<int>(threadIdx.x);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int x_at = 0, w_at_ = kRows * d, u_at = w_at_ + kTile * d, half_at = u_at + kRows * kTile,
            max_at = half_at + kRows;
  load_scaled_rows<A>(dm, x, s, tile, h, sh.view(x_at, kRows * d));
  simt::syncthreads();
  if (tid < kRows) {
    A sq = 0;
    for (int i = 0; i < d; ++i) {
      const A v = sh[x_at + tid * d + i];
      sq += v * v;
    }
    sh[half_at + tid] = A(0.5) * sq;
    sh[max_at + tid] = -std::numeric_limits<A>::infinity();
  }
  for (std::int64_t r0 = 0; r0 < dm.m; r0 += kTile) {
    simt::syncthreads();
    load_w_tile<A>(dm, w, h, r0, sh.view(w_at_, kTile * d));
    simt::syncthreads();
    gemm_to_shared<A>(row_major(sh, x_at, d, tile.len, d),
                      row_major(sh, w_at_, d, kTile, d).transposed(), tile.len, kTile, d, sh, u_at,
                      kTile, false);
    simt::syncthreads();
    for (int e = tid; e < tile.len * kTile; e += kThreads) {
      const int j = e / kTile, rr = e % kTile;
      if (r0 + rr >= dm.m) continue;
      const A value = sh[u_at + e],
              half = shift_kind == static_cast<int>(Shift::row) ? A(0) : sh[half_at + j];
      const A ur = value - half;
      u[dm.row(tile.batch, tile.first + j, h) * dm.m + r0 + rr] = ur;
      sh[u_at + e] = ur;
    }
    simt::syncthreads();
    if (tid < tile.len) {
      A best = sh[max_at + tid];
      for (int rr = 0; rr < kTile && r0 + rr < dm.m; ++rr) {
        const A v = sh[u_at + tid * kTile + rr];
        best = simt::fmax(best, v);
      }
      sh[max_at + tid] = best;
    }
  }
  simt::syncthreads();
  if (tid < tile.len) {
    const std::int64_t row = dm.row(tile.batch, tile.first + tid, h);
    const A best = sh[max_at + tid];
    rowmax[row] = best;
    if (shift_kind == static_cast<int>(Shift::row)) shift[row] = best;
    if (shift_kind == static_cast<int>(Shift::none)) shift[row] = A(kNoShift);
  }
}

// Key stabiliser: shift = the sequence's max over its rows. One thread per (sequence, head).
template <class A>
PHASOR_GLOBAL void stabilise_kernel(Dims dm, simt::Span<A> rowmax, simt::Span<A> shift) {
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= dm.sequences.size() * dm.H) return;
  const std::int64_t n = item / dm.H, h = item % dm.H;
  const Sequence s = dm.sequences[n];
  A best = -std::numeric_limits<A>::infinity();
  for (std::int64_t t = 0; t < s.length; ++t)
    best = simt::fmax(best, rowmax[dm.row(s.batch, s.start + t, h)]);
  for (std::int64_t t = 0; t < s.length; ++t) shift[dm.row(s.batch, s.start + t, h)] = best;
}

// The attention's stabiliser per feature (see the top of this file), one thread per (sequence,
// head, feature r): c_r = max_t u_k[t, r] (non-causal) or the running c_t,r (causal, with the
// gates g_t,r = c_{t−1},r − c_t,r, 0 at the first token) moves from the keys' exponents u_k to the
// queries' u_q (w_rᵀq̂ without |q̂|²/2).
template <class A>
PHASOR_GLOBAL void feature_stabilise_kernel(Dims dm, simt::Span<A> u_k, simt::Span<A> u_q,
                                            simt::Span<A> gates, bool causal) {
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= dm.sequences.size() * dm.H * dm.m) return;
  const std::int64_t r = item % dm.m, h = item / dm.m % dm.H, n = item / dm.m / dm.H;
  const Sequence s = dm.sequences[n];
  A c = -std::numeric_limits<A>::infinity();
  if (!causal)
    for (std::int64_t t = 0; t < s.length; ++t)
      c = simt::fmax(c, u_k[dm.row(s.batch, s.start + t, h) * dm.m + r]);
  for (std::int64_t t = 0; t < s.length; ++t) {
    const std::int64_t e = dm.row(s.batch, s.start + t, h) * dm.m + r;
    if (causal) {
      const A next = t == 0 ? u_k[e] : simt::fmax(c, u_k[e]);
      gates[e] = t == 0 ? A(0) : c - next;
      c = next;
    }
    u_k[e] -= c;
    u_q[e] += c;
  }
}

// shift = each row's max of u.
template <class A>
PHASOR_GLOBAL void row_shift_kernel(Dims dm, simt::Span<A> u, simt::Span<A> shift) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= dm.rows()) return;
  A best = -std::numeric_limits<A>::infinity();
  for (std::int64_t r = 0; r < dm.m; ++r) best = simt::fmax(best, u[row * dm.m + r]);
  shift[row] = best;
}

// φ = exp(u − shift)/√m into a workspace (`out`) or a [B, T, H, m] view (`view`).
template <class A>
PHASOR_GLOBAL void features_kernel(Dims dm, simt::Span<A> u, simt::Span<A> shift, simt::Span<A> out,
                                   TensorView view) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= dm.rows() * dm.m) return;
  const std::int64_t row = e / dm.m, r = e % dm.m;
  const A inv_sqrt_m = A(1) / simt::sqrt(static_cast<A>(dm.m));
  const A phi = simt::exp(u[e] - shift[row]) * inv_sqrt_m;
  if (out.size > 0) out[e] = phi;
  if (view.defined()) {
    const std::int64_t h = row % dm.H, bt = row / dm.H;
    simt::store(view, phi, bt / dm.T, bt % dm.T, h, r);
  }
}

// For one tile and head: G = dΦ ⊙ Φ (stored to `g` for dW) and dx = s · (G W − diag(Σ_r G) X̂),
// or s · G W for the attention's queries (`half` false: their exponent has no −|q̂|²/2).
// Φ and dΦ come from workspaces (phi, d_phi: rows × m) or views (phi_view, d_phi_view).
template <class A>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    grads_kernel(Dims dm, TensorView x, A s, TensorView w, simt::Span<A> phi, TensorView phi_view,
                 simt::Span<A> d_phi, TensorView d_phi_view, simt::Span<A> g, TensorView dx,
                 bool half) {
  Tile tile;
  if (!tile_of(dm, blockIdx.x, tile)) return;
  const std::int64_t h = blockIdx.y;
  const int d = static_cast<int>(dm.d), m = static_cast<int>(dm.m),
            tid = static_cast<int>(threadIdx.x);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int x_at = 0, w_at_ = kRows * d, g_at = w_at_ + kTile * d, dx_at = g_at + kRows * m,
            sum_at = dx_at + kRows * d;
  load_scaled_rows<A>(dm, x, s, tile, h, sh.view(x_at, kRows * d));
  for (int e = tid; e < kRows * m; e += kThreads) {
    const int j = e / m, r = e % m;
    A value = 0;
    if (j < tile.len) {
      const std::int64_t row = dm.row(tile.batch, tile.first + j, h);
      const std::int64_t b = tile.batch, t = tile.first + j;
      const A f = phi.size > 0 ? phi[row * dm.m + r] : simt::load<A>(phi_view, b, t, h, r);
      const A df = d_phi.size > 0 ? d_phi[row * dm.m + r] : simt::load<A>(d_phi_view, b, t, h, r);
      value = df * f;
      if (g.size > 0) g[row * dm.m + r] = value;
    }
    sh[g_at + e] = value;
  }
  for (int e = tid; e < kRows * d; e += kThreads) sh[dx_at + e] = A(0);
  simt::syncthreads();
  if (tid < kRows) {
    A sum = 0;
    for (int r = 0; r < m; ++r) {
      const A v = sh[g_at + tid * m + r];
      sum += v;
    }
    sh[sum_at + tid] = sum;
  }
  for (std::int64_t r0 = 0; r0 < dm.m; r0 += kTile) {
    simt::syncthreads();
    load_w_tile<A>(dm, w, h, r0, sh.view(w_at_, kTile * d));
    simt::syncthreads();
    const int cols = static_cast<int>(dm.m - r0 < kTile ? dm.m - r0 : kTile);
    gemm_to_shared<A>(SharedMatrix<A>{sh, g_at + static_cast<int>(r0), m, 1, tile.len, cols},
                      row_major(sh, w_at_, d, cols, d), tile.len, d, cols, sh, dx_at, d, true);
  }
  simt::syncthreads();
  if (dx.defined())
    for (int e = tid; e < tile.len * d; e += kThreads) {
      const int j = e / d, i = e % d;
      const A acc = sh[dx_at + e], sum = sh[sum_at + j], xv = sh[x_at + e];
      simt::store(dx, half ? s * (acc - sum * xv) : s * acc, tile.batch, tile.first + j, h, i);
    }
}

// One source of dW's sum: G (rows × m) and the rows x scaled by s.
template <class A>
struct DwSource {
  simt::Span<A> g;
  TensorView x;
  A s = 1;
};

// dW partial of one 256-token segment, w head and 32 × 32 block (r, i) of W: Σ over the segment's
// tokens, the heads that use this W (all when shared), and the sources, of G_rᵀ x̂_i.
template <class A>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dw_parts_kernel(Dims dm, DwSource<A> first, DwSource<A> second, simt::Span<A> parts) {
  const std::int64_t segment = blockIdx.x, hw = blockIdx.y;
  const std::int64_t blocks_i = ceil_div(dm.d, kTile);
  const std::int64_t r0 = (blockIdx.z / blocks_i) * kTile, i0 = (blockIdx.z % blocks_i) * kTile;
  const int tid = static_cast<int>(threadIdx.x);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int acc_at = 0, g_at = kTile * kTile, x_at = g_at + kRows * kTile;
  for (int e = tid; e < kTile * kTile; e += kThreads) sh[acc_at + e] = A(0);
  const std::int64_t tokens = dm.B * dm.T, t0 = segment * kSegment;
  const std::int64_t h_first = dm.w_per_head ? hw : 0, h_end = dm.w_per_head ? hw + 1 : dm.H;
  for (int source = 0; source < 2; ++source) {
    const DwSource<A>& src = source == 0 ? first : second;
    if (src.g.size == 0) continue;
    for (std::int64_t f0 = t0; f0 < t0 + kSegment && f0 < tokens; f0 += kRows) {
      for (std::int64_t h = h_first; h < h_end; ++h) {
        simt::syncthreads();
        for (int e = tid; e < kRows * kTile; e += kThreads) {
          const int j = e / kTile, c = e % kTile;
          const std::int64_t flat = f0 + j, r = r0 + c, i = i0 + c;
          const bool token = flat < tokens && flat < t0 + kSegment;
          A gv = 0, xv = 0;
          if (token && r < dm.m) gv = src.g[(flat * dm.H + h) * dm.m + r];
          if (token && i < dm.d) xv = src.s * simt::load<A>(src.x, flat / dm.T, flat % dm.T, h, i);
          sh[g_at + e] = gv;
          sh[x_at + e] = xv;
        }
        simt::syncthreads();
        gemm_to_shared<A>(row_major(sh, g_at, kTile, kRows, kTile).transposed(),
                          row_major(sh, x_at, kTile, kRows, kTile), kTile, kTile, kRows, sh, acc_at,
                          kTile, true);
      }
    }
  }
  simt::syncthreads();
  const std::int64_t heads_w = dm.w_per_head ? dm.H : 1;
  for (int e = tid; e < kTile * kTile; e += kThreads) {
    const std::int64_t r = r0 + e / kTile, i = i0 + e % kTile;
    if (r >= dm.m || i >= dm.d) continue;
    const A v = sh[acc_at + e];
    parts[((segment * heads_w + hw) * dm.m + r) * dm.d + i] = v;
  }
}

// dW = the segments' partials added in segment order.
template <class A>
PHASOR_GLOBAL void dw_sum_kernel(Dims dm, simt::Span<A> parts, std::int64_t segments,
                                 TensorView dw) {
  const std::int64_t heads_w = dm.w_per_head ? dm.H : 1;
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= heads_w * dm.m * dm.d) return;
  A sum = 0;
  for (std::int64_t segment = 0; segment < segments; ++segment)
    sum += parts[segment * heads_w * dm.m * dm.d + e];
  const std::int64_t hw = e / (dm.m * dm.d), r = (e / dm.d) % dm.m, i = e % dm.d;
  if (dm.w_per_head)
    simt::store(dw, sum, hw, r, i);
  else
    simt::store(dw, sum, r, i);
}

// ---- non-causal attention
// -------------------------------------------------------------------------

// Sx (m × (V + 1), columns [c0, c0 + 32)) of one sequence and head: Σ_j φ_jᵀ [v_j | 1], or with
// `dsx` (dOx rows given instead of [v | 1]) dSx = Σ_i φ_iᵀ dOx_i.
template <class A>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    kv_kernel(Dims dm, std::int64_t V, simt::Span<A> phi, TensorView v, simt::Span<A> rows_in,
              simt::Span<A> out) {
  const std::int64_t n = blockIdx.x / dm.H, h = blockIdx.x % dm.H, c0 = blockIdx.y * kTile;
  const Sequence s = dm.sequences[n];
  const int m = static_cast<int>(dm.m), tid = static_cast<int>(threadIdx.x);
  const std::int64_t cols = V + 1;
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int acc_at = 0, f_at = m * kTile, y_at = f_at + kRows * m;
  for (int e = tid; e < m * kTile; e += kThreads) sh[acc_at + e] = A(0);
  for (std::int64_t t0 = 0; t0 < s.length; t0 += kRows) {
    const int len = static_cast<int>(s.length - t0 < kRows ? s.length - t0 : kRows);
    simt::syncthreads();
    for (int e = tid; e < kRows * m; e += kThreads) {
      const int j = e / m, r = e % m;
      sh[f_at + e] = j < len ? A(phi[dm.row(s.batch, s.start + t0 + j, h) * dm.m + r]) : A(0);
    }
    for (int e = tid; e < kRows * kTile; e += kThreads) {
      const int j = e / kTile;
      const std::int64_t c = c0 + e % kTile;
      A value = 0;
      if (j < len && c < cols) {
        const std::int64_t row = dm.row(s.batch, s.start + t0 + j, h);
        if (rows_in.size > 0)
          value = rows_in[row * cols + c];
        else
          value = c < V ? simt::load<A>(v, s.batch, s.start + t0 + j, h, c) : A(1);
      }
      sh[y_at + e] = value;
    }
    simt::syncthreads();
    gemm_to_shared<A>(row_major(sh, f_at, m, len, m).transposed(),
                      row_major(sh, y_at, kTile, len, kTile), m, kTile, len, sh, acc_at, kTile,
                      true);
  }
  simt::syncthreads();
  for (int e = tid; e < m * kTile; e += kThreads) {
    const std::int64_t r = e / kTile, c = c0 + e % kTile;
    const A value = sh[acc_at + e];
    if (c < cols) out[((n * dm.H + h) * dm.m + r) * cols + c] = value;
  }
}

// One tile and head: Ox = φ(q̂) Sx and o = num / den; with d_o (backward) also
// dOx = [d_o / den | −(d_o · o) / den] (stored) and dΦ_q = dOx Sxᵀ (stored).
template <class A>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    attend_kernel(Dims dm, std::int64_t V, simt::Span<A> phi_q, simt::Span<A> sx, TensorView o,
                  TensorView d_o, simt::Span<A> d_ox, simt::Span<A> d_phi_q) {
  Tile tile;
  if (!tile_of(dm, blockIdx.x, tile)) return;
  const std::int64_t h = blockIdx.y;
  const int m = static_cast<int>(dm.m), cols = static_cast<int>(V + 1),
            tid = static_cast<int>(threadIdx.x);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int f_at = 0, s_at = kRows * m, ox_at = s_at + m * kTile, df_at = ox_at + kRows * cols;
  const std::int64_t base = (tile.n * dm.H + h) * dm.m * cols;
  for (int e = tid; e < kRows * m; e += kThreads) {
    const int j = e / m, r = e % m;
    sh[f_at + e] = j < tile.len ? A(phi_q[dm.row(tile.batch, tile.first + j, h) * dm.m + r]) : A(0);
  }
  const auto load_sx = [&](int c0) {
    for (int e = tid; e < m * kTile; e += kThreads) {
      const int r = e / kTile, c = c0 + e % kTile;
      sh[s_at + e] = c < cols ? A(sx[base + r * cols + c]) : A(0);
    }
  };
  for (int c0 = 0; c0 < cols; c0 += kTile) {
    simt::syncthreads();
    load_sx(c0);
    simt::syncthreads();
    const int width = cols - c0 < kTile ? cols - c0 : kTile;
    gemm_to_shared<A>(row_major(sh, f_at, m, tile.len, m), row_major(sh, s_at, kTile, m, kTile),
                      tile.len, width, m, sh, ox_at + c0, cols, false);
  }
  simt::syncthreads();
  const bool backward = d_o.defined();
  for (int e = tid; e < tile.len * (backward ? cols : V); e += kThreads) {
    const int j = backward ? e / cols : static_cast<int>(e / V);
    const int c = backward ? e % cols : static_cast<int>(e % V);
    const A den = sh[ox_at + j * cols + static_cast<int>(V)];
    const std::int64_t t = tile.first + j;
    if (!backward) {
      const A num = sh[ox_at + j * cols + c];
      simt::store(o, num / den, tile.batch, t, h, c);
      continue;
    }
    // dOx_j: d_o / den in the V columns, −(d_o · o) / den in the last.
    A value;
    if (c < V) {
      value = simt::load<A>(d_o, tile.batch, t, h, c) / den;
    } else {
      A dot = 0;
      for (std::int64_t cc = 0; cc < V; ++cc) {
        const A num = sh[ox_at + j * cols + static_cast<int>(cc)];
        dot += simt::load<A>(d_o, tile.batch, t, h, cc) * (num / den);
      }
      value = -dot / den;
    }
    d_ox[dm.row(tile.batch, t, h) * cols + c] = value;
  }
  if (!backward) return;
  // dΦ_q = dOx Sxᵀ, the dOx rows read back from the workspace.
  simt::syncthreads();
  for (int e = tid; e < kRows * cols; e += kThreads) {
    const int j = e / cols, c = e % cols;
    sh[ox_at + e] = j < tile.len ? A(d_ox[dm.row(tile.batch, tile.first + j, h) * cols + c]) : A(0);
  }
  for (int e = tid; e < kRows * m; e += kThreads) sh[df_at + e] = A(0);
  for (int c0 = 0; c0 < cols; c0 += kTile) {
    simt::syncthreads();
    load_sx(c0);
    simt::syncthreads();
    const int width = cols - c0 < kTile ? cols - c0 : kTile;
    gemm_to_shared<A>(SharedMatrix<A>{sh, ox_at + c0, cols, 1, tile.len, width},
                      row_major(sh, s_at, kTile, m, width).transposed(), tile.len, m, width, sh,
                      df_at, m, true);
  }
  simt::syncthreads();
  for (int e = tid; e < tile.len * m; e += kThreads) {
    const int j = e / m, r = e % m;
    const A value = sh[df_at + e];
    d_phi_q[dm.row(tile.batch, tile.first + j, h) * dm.m + r] = value;
  }
}

// One tile and head of the backward: dΦ_k = [v | 1] dSxᵀ (stored) and dv = Φ_k dSx[:, :V].
template <class A>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    kv_grads_kernel(Dims dm, std::int64_t V, TensorView v, simt::Span<A> phi_k, simt::Span<A> dsx,
                    simt::Span<A> d_phi_k, TensorView dv) {
  Tile tile;
  if (!tile_of(dm, blockIdx.x, tile)) return;
  const std::int64_t h = blockIdx.y;
  const int m = static_cast<int>(dm.m), cols = static_cast<int>(V + 1),
            tid = static_cast<int>(threadIdx.x);
  PHASOR_DYNAMIC_SHARED(A, sh);
  const int f_at = 0, s_at = kRows * m, y_at = s_at + m * kTile, df_at = y_at + kRows * kTile,
            dv_at = df_at + kRows * m;
  const std::int64_t base = (tile.n * dm.H + h) * dm.m * cols;
  for (int e = tid; e < kRows * m; e += kThreads) {
    const int j = e / m, r = e % m;
    sh[f_at + e] = j < tile.len ? A(phi_k[dm.row(tile.batch, tile.first + j, h) * dm.m + r]) : A(0);
    sh[df_at + e] = A(0);
  }
  for (int c0 = 0; c0 < cols; c0 += kTile) {
    const int width = cols - c0 < kTile ? cols - c0 : kTile;
    simt::syncthreads();
    for (int e = tid; e < m * kTile; e += kThreads) {
      const int r = e / kTile, c = c0 + e % kTile;
      sh[s_at + e] = c < cols ? A(dsx[base + r * cols + c]) : A(0);
    }
    for (int e = tid; e < kRows * kTile; e += kThreads) {
      const int j = e / kTile, c = c0 + e % kTile;
      A value = 0;
      if (j < tile.len && c < cols)
        value = c < V ? simt::load<A>(v, tile.batch, tile.first + j, h, c) : A(1);
      sh[y_at + e] = value;
    }
    simt::syncthreads();
    gemm_to_shared<A>(row_major(sh, y_at, kTile, tile.len, width),
                      row_major(sh, s_at, kTile, m, width).transposed(), tile.len, m, width, sh,
                      df_at, m, true);
    if (dv.defined() && c0 < V) {  // dv columns [c0, c0 + width) ∩ [0, V)
      const int value_width = static_cast<int>(V - c0 < width ? V - c0 : width);
      gemm_to_shared<A>(row_major(sh, f_at, m, tile.len, m), row_major(sh, s_at, kTile, m, kTile),
                        tile.len, value_width, m, sh, dv_at, kTile, false);
      simt::syncthreads();
      for (int e = tid; e < tile.len * value_width; e += kThreads) {
        const int j = e / value_width, c = e % value_width;
        const A value = sh[dv_at + j * kTile + c];
        simt::store(dv, value, tile.batch, tile.first + j, h, c0 + c);
      }
    }
  }
  simt::syncthreads();
  for (int e = tid; e < tile.len * m; e += kThreads) {
    const int j = e / m, r = e % m;
    const A value = sh[df_at + e];
    d_phi_k[dm.row(tile.batch, tile.first + j, h) * dm.m + r] = value;
  }
}

// [v | 1] and o = num / den for the causal path (element kernels on [B, T, H, ·] views).
template <class A>
PHASOR_GLOBAL void extend_kernel(Dims dm, std::int64_t V, TensorView v, TensorView v_ext) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= dm.rows() * (V + 1)) return;
  const std::int64_t c = e % (V + 1), row = e / (V + 1), h = row % dm.H, bt = row / dm.H;
  const std::int64_t b = bt / dm.T, t = bt % dm.T;
  simt::store(v_ext, c < V ? simt::load<A>(v, b, t, h, c) : A(1), b, t, h, c);
}
template <class A>
PHASOR_GLOBAL void divide_kernel(Dims dm, std::int64_t V, TensorView o_ext, TensorView d_o,
                                 TensorView o, TensorView d_o_ext) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= dm.rows()) return;
  const std::int64_t h = e % dm.H, bt = e / dm.H, b = bt / dm.T, t = bt % dm.T;
  const A den = simt::load<A>(o_ext, b, t, h, V);
  if (!d_o.defined()) {
    for (std::int64_t c = 0; c < V; ++c)
      simt::store(o, simt::load<A>(o_ext, b, t, h, c) / den, b, t, h, c);
    return;
  }
  A dot = 0;
  for (std::int64_t c = 0; c < V; ++c) {
    const A dov = simt::load<A>(d_o, b, t, h, c);
    dot += dov * (simt::load<A>(o_ext, b, t, h, c) / den);
    simt::store(d_o_ext, dov / den, b, t, h, c);
  }
  simt::store(d_o_ext, -dot / den, b, t, h, V);
}
template <class A>
PHASOR_GLOBAL void copy_columns_kernel(Dims dm, std::int64_t V, TensorView from, TensorView to) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= dm.rows() * V) return;
  const std::int64_t c = e % V, row = e / V, h = row % dm.H, bt = row / dm.H;
  simt::store(to, simt::load<A>(from, bt / dm.T, bt % dm.T, h, c), bt / dm.T, bt % dm.T, h, c);
}

// ---- host ---------------------------------------------------------------------------------------

unsigned blocks_for(std::int64_t count, int threads = kThreads) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, ceil_div(count, threads)));
}

template <class A>
struct Runner {
  Dims dm;
  cuda::Stream stream;
  std::int64_t slots;

  Runner(const Dims& dims, cuda::Stream s)
      : dm(dims), stream(s), slots(dims.sequences.chunk_slot_count(kRows)) {}

  std::size_t project_bytes() const {
    return static_cast<std::size_t>(kRows * dm.d + kTile * dm.d + kRows * kTile + 2 * kRows) *
           sizeof(A);
  }
  // u (and its row maxima) of x̂ = s·x; shift = 0, the row max or the key max.
  void project(const TensorView& x, A s, const TensorView& w, Shift kind, simt::Span<A> u,
               simt::Span<A> rowmax, simt::Span<A> shift) const {
    PHASOR_LAUNCH((project_kernel<A>),
                  simt::Dim3(static_cast<unsigned>(slots), static_cast<unsigned>(dm.H)),
                  simt::Dim3(kThreads), project_bytes(), stream, dm, x, s, w, u, rowmax, shift,
                  static_cast<int>(kind));
    if (kind == Shift::key)
      PHASOR_LAUNCH((stabilise_kernel<A>), simt::Dim3(blocks_for(dm.sequences.size() * dm.H)),
                    simt::Dim3(kThreads), 0, stream, dm, rowmax, shift);
  }
  // The features of x̂ = s·x with one of favor.h's stabilisers.
  void features(const TensorView& x, A s, const TensorView& w, Shift kind, simt::Span<A> u,
                simt::Span<A> rowmax, simt::Span<A> shift, simt::Span<A> out,
                const TensorView& view) const {
    if (dm.rows() == 0) return;
    project(x, s, w, kind, u, rowmax, shift);
    PHASOR_LAUNCH((features_kernel<A>), simt::Dim3(blocks_for(dm.rows() * dm.m)),
                  simt::Dim3(kThreads), 0, stream, dm, u, shift, out, view);
  }
  // The attention's features of q̂ = s·q and k̂ = s·k, stabilised per feature (and the causal
  // gates, rows × m, when `gates` is given).
  void attention_features(const AttentionProblem& p, A s, simt::Span<A> u_q, simt::Span<A> u_k,
                          simt::Span<A> rowmax, simt::Span<A> shift_q, simt::Span<A> shift_k,
                          simt::Span<A> gates, simt::Span<A> phi_q, simt::Span<A> phi_k) const {
    if (dm.rows() == 0) return;
    project(p.q, s, p.w, Shift::row, u_q, rowmax, shift_q);  // w_rᵀq̂: no |q̂|²/2
    project(p.k, s, p.w, Shift::none, u_k, rowmax, shift_k);
    PHASOR_LAUNCH((feature_stabilise_kernel<A>),
                  simt::Dim3(blocks_for(dm.sequences.size() * dm.H * dm.m)), simt::Dim3(kThreads),
                  0, stream, dm, u_k, u_q, gates, p.causal);
    PHASOR_LAUNCH((row_shift_kernel<A>), simt::Dim3(blocks_for(dm.rows())), simt::Dim3(kThreads), 0,
                  stream, dm, u_q, shift_q);
    PHASOR_LAUNCH((features_kernel<A>), simt::Dim3(blocks_for(dm.rows() * dm.m)),
                  simt::Dim3(kThreads), 0, stream, dm, u_q, shift_q, phi_q, TensorView{});
    PHASOR_LAUNCH((features_kernel<A>), simt::Dim3(blocks_for(dm.rows() * dm.m)),
                  simt::Dim3(kThreads), 0, stream, dm, u_k, shift_k, phi_k, TensorView{});
  }
  std::size_t grads_bytes() const {
    return static_cast<std::size_t>(kRows * dm.d + kTile * dm.d + kRows * dm.m + kRows * dm.d +
                                    kRows) *
           sizeof(A);
  }
  void grads(const TensorView& x, A s, const TensorView& w, simt::Span<A> phi,
             const TensorView& phi_view, simt::Span<A> d_phi, const TensorView& d_phi_view,
             simt::Span<A> g, const TensorView& dx, bool half = true) const {
    if (dm.rows() == 0) return;
    PHASOR_LAUNCH((grads_kernel<A>),
                  simt::Dim3(static_cast<unsigned>(slots), static_cast<unsigned>(dm.H)),
                  simt::Dim3(kThreads), grads_bytes(), stream, dm, x, s, w, phi, phi_view, d_phi,
                  d_phi_view, g, dx, half);
  }
  void dw(const DwSource<A>& first, const DwSource<A>& second, const TensorView& dw) const {
    const std::int64_t heads_w = dm.w_per_head ? dm.H : 1;
    // An empty dw (per-head w with H = 0) has nothing to write: a launch would have a grid of 0.
    if (heads_w * dm.m * dm.d == 0) return;
    const std::int64_t segments = std::max<std::int64_t>(1, ceil_div(dm.B * dm.T, kSegment));
    const std::int64_t count = segments * heads_w * dm.m * dm.d;
    simt::Workspace work(static_cast<std::size_t>(count) * sizeof(A), stream);
    const simt::Span<A> parts = work.span<A>(count);
    const std::int64_t blocks = ceil_div(dm.m, kTile) * ceil_div(dm.d, kTile);
    PHASOR_LAUNCH((dw_parts_kernel<A>),
                  simt::Dim3(static_cast<unsigned>(segments), static_cast<unsigned>(heads_w),
                             static_cast<unsigned>(blocks)),
                  simt::Dim3(kThreads),
                  static_cast<std::size_t>(kTile * kTile + 2 * kRows * kTile) * sizeof(A), stream,
                  dm, first, second, parts);
    PHASOR_LAUNCH((dw_sum_kernel<A>), simt::Dim3(blocks_for(heads_w * dm.m * dm.d)),
                  simt::Dim3(kThreads), 0, stream, dm, parts, segments, dw);
  }
};

// A contiguous [B, T, H, n] view of workspace memory on the call's device.
TensorView scratch_view(void* data, DType dtype, const Dims& dm, std::int64_t n, Device device) {
  return TensorView::contiguous(data, dtype, {dm.B, dm.T, dm.H, n}, device);
}

template <class A>
struct Carve {  // consecutive spans of one workspace
  A* at;
  simt::Span<A> take(std::int64_t count) {
    const simt::Span<A> span{at, count};
    at += count;
    return span;
  }
};

template <class A>
void features_forward_typed(const FeatureProblem& p, const TensorView& phi, cuda::Stream stream) {
  const Dims dm = dims_of(p.shape, p.x);
  const Runner<A> run(dm, stream);
  const std::int64_t rows = dm.rows();
  simt::Workspace work(static_cast<std::size_t>(rows * dm.m + 2 * rows) * sizeof(A), stream);
  Carve<A> carve{static_cast<A*>(work.data())};
  const simt::Span<A> u = carve.take(rows * dm.m), rowmax = carve.take(rows),
                      shift = carve.take(rows);
  const Shift kind = p.stabilizer == FavorStabilizer::query ? Shift::row
                     : p.stabilizer == FavorStabilizer::key ? Shift::key
                                                            : Shift::none;
  run.features(p.x, A(1), p.w, kind, u, rowmax, shift, {}, phi);
}

template <class A>
void features_backward_typed(const FeatureProblem& p, const TensorView& d_phi, const TensorView& dx,
                             const TensorView& dw, cuda::Stream stream) {
  const Dims dm = dims_of(p.shape, p.x);
  const Runner<A> run(dm, stream);
  const std::int64_t rows = dm.rows();
  simt::Workspace work(static_cast<std::size_t>(3 * rows * dm.m + 2 * rows) * sizeof(A), stream);
  Carve<A> carve{static_cast<A*>(work.data())};
  const simt::Span<A> u = carve.take(rows * dm.m), phi = carve.take(rows * dm.m),
                      g = carve.take(dw.defined() ? rows * dm.m : 0), rowmax = carve.take(rows),
                      shift = carve.take(rows);
  const Shift kind = p.stabilizer == FavorStabilizer::query ? Shift::row
                     : p.stabilizer == FavorStabilizer::key ? Shift::key
                                                            : Shift::none;
  run.features(p.x, A(1), p.w, kind, u, rowmax, shift, phi, {});
  run.grads(p.x, A(1), p.w, phi, {}, {}, d_phi, g, dx);
  if (dw.defined()) run.dw({g, p.x, A(1)}, {}, dw);
}

// The causal path's scratch tensors on the device and the GLA problem over them.
template <class A>
struct Causal {
  simt::Workspace work;
  TensorView phi_q, phi_k, gates, v_ext, o_ext;
  simt::Span<A> phi_q_span, phi_k_span;
  GlaParams gla;

  Causal(const AttentionProblem& p, const Dims& dm, const Runner<A>& run, cuda::Stream stream)
      : work(bytes(p, dm), stream) {
    const std::int64_t rows = dm.rows(), V = p.V;
    Carve<A> carve{static_cast<A*>(work.data())};
    const DType dtype = dtype_of<A>();
    const Device device = p.q.device;
    phi_q_span = carve.take(rows * dm.m);
    phi_k_span = carve.take(rows * dm.m);
    const simt::Span<A> gate_span = carve.take(rows * dm.m), v_span = carve.take(rows * (V + 1)),
                        o_span = carve.take(rows * (V + 1)), u_q = carve.take(rows * dm.m),
                        u_k = carve.take(rows * dm.m), rowmax = carve.take(rows),
                        shift_q = carve.take(rows), shift_k = carve.take(rows);
    phi_q = scratch_view(phi_q_span.data, dtype, dm, dm.m, device);
    phi_k = scratch_view(phi_k_span.data, dtype, dm, dm.m, device);
    gates = scratch_view(gate_span.data, dtype, dm, dm.m, device);
    v_ext = scratch_view(v_span.data, dtype, dm, V + 1, device);
    o_ext = scratch_view(o_span.data, dtype, dm, V + 1, device);
    const A s = static_cast<A>(p.input_scale);
    run.attention_features(p, s, u_q, u_k, rowmax, shift_q, shift_k, gate_span, phi_q_span,
                           phi_k_span);
    if (rows > 0)
      PHASOR_LAUNCH((extend_kernel<A>), simt::Dim3(blocks_for(rows * (V + 1))),
                    simt::Dim3(kThreads), 0, stream, dm, V, p.v, v_ext);
    gla.q = phi_q;
    gla.k = phi_k;
    gla.v = v_ext;
    gla.g = gates;  // one log gate per token and feature
    gla.cu_seqlens = p.cu_seqlens;
    gla.scale = 1.0;
    gla.chunk_size = p.chunk_size;
    gla_forward(gla, p.impl, o_ext);
  }
  static std::size_t bytes(const AttentionProblem& p, const Dims& dm) {
    const std::int64_t rows = dm.rows();
    return static_cast<std::size_t>(5 * rows * dm.m + 3 * rows + 2 * rows * (p.V + 1)) * sizeof(A);
  }
};

template <class A>
void attention_forward_typed(const AttentionProblem& p, const TensorView& o, cuda::Stream stream) {
  const Dims dm = dims_of(p.shape, p.q);
  const Runner<A> run(dm, stream);
  const std::int64_t rows = dm.rows(), V = p.V;
  if (p.causal) {
    Causal<A> causal(p, dm, run, stream);
    if (rows > 0)
      PHASOR_LAUNCH((divide_kernel<A>), simt::Dim3(blocks_for(rows)), simt::Dim3(kThreads), 0,
                    stream, dm, V, causal.o_ext, TensorView{}, o, TensorView{});
    return;
  }
  const std::int64_t N = dm.sequences.size();
  const std::int64_t total = 4 * rows * dm.m + 3 * rows + N * dm.H * dm.m * (V + 1);
  simt::Workspace work(static_cast<std::size_t>(total) * sizeof(A), stream);
  Carve<A> carve{static_cast<A*>(work.data())};
  const simt::Span<A> u_q = carve.take(rows * dm.m), u_k = carve.take(rows * dm.m),
                      phi_q = carve.take(rows * dm.m), phi_k = carve.take(rows * dm.m),
                      rowmax = carve.take(rows), shift_q = carve.take(rows),
                      shift_k = carve.take(rows), sx = carve.take(N * dm.H * dm.m * (V + 1));
  const A s = static_cast<A>(p.input_scale);
  run.attention_features(p, s, u_q, u_k, rowmax, shift_q, shift_k, {}, phi_q, phi_k);
  if (rows == 0) return;
  PHASOR_LAUNCH(
      (kv_kernel<A>),
      simt::Dim3(static_cast<unsigned>(N * dm.H), static_cast<unsigned>(ceil_div(V + 1, kTile))),
      simt::Dim3(kThreads),
      static_cast<std::size_t>(dm.m * kTile + kRows * dm.m + kRows * kTile) * sizeof(A), stream, dm,
      V, phi_k, p.v, simt::Span<A>{}, sx);
  PHASOR_LAUNCH(
      (attend_kernel<A>), simt::Dim3(static_cast<unsigned>(run.slots), static_cast<unsigned>(dm.H)),
      simt::Dim3(kThreads),
      static_cast<std::size_t>(kRows * dm.m + dm.m * kTile + kRows * (V + 1) + kRows * dm.m) *
          sizeof(A),
      stream, dm, V, phi_q, sx, o, TensorView{}, simt::Span<A>{}, simt::Span<A>{});
}

template <class A>
void attention_backward_typed(const AttentionProblem& p, const TensorView& d_o,
                              const FavorAttentionGrads& grads, cuda::Stream stream) {
  const Dims dm = dims_of(p.shape, p.q);
  const Runner<A> run(dm, stream);
  const std::int64_t rows = dm.rows(), V = p.V, N = dm.sequences.size();
  const A s = static_cast<A>(p.input_scale);
  const bool want_w = grads.dw.defined();
  if (p.causal) {
    Causal<A> causal(p, dm, run, stream);
    const std::int64_t total =
        2 * rows * (V + 1) + 2 * rows * dm.m + (want_w ? 2 * rows * dm.m : 0);
    simt::Workspace work(static_cast<std::size_t>(total) * sizeof(A), stream);
    Carve<A> carve{static_cast<A*>(work.data())};
    const DType dtype = dtype_of<A>();
    const TensorView d_o_ext =
        scratch_view(carve.take(rows * (V + 1)).data, dtype, dm, V + 1, p.q.device);
    const simt::Span<A> d_phi_q = carve.take(rows * dm.m), d_phi_k = carve.take(rows * dm.m);
    const TensorView d_v_ext =
        scratch_view(carve.take(rows * (V + 1)).data, dtype, dm, V + 1, p.q.device);
    const simt::Span<A> g_q = carve.take(want_w ? rows * dm.m : 0),
                        g_k = carve.take(want_w ? rows * dm.m : 0);
    if (rows > 0)
      PHASOR_LAUNCH((divide_kernel<A>), simt::Dim3(blocks_for(rows)), simt::Dim3(kThreads), 0,
                    stream, dm, V, causal.o_ext, d_o, TensorView{}, d_o_ext);
    GlaGrads gg;
    gg.dq = scratch_view(d_phi_q.data, dtype, dm, dm.m, p.q.device);
    gg.dk = scratch_view(d_phi_k.data, dtype, dm, dm.m, p.q.device);
    gg.dv = d_v_ext;
    gla_backward(causal.gla, p.impl, d_o_ext, {}, gg);
    run.grads(p.q, s, p.w, causal.phi_q_span, {}, d_phi_q, {}, g_q, grads.dq, /*half=*/false);
    run.grads(p.k, s, p.w, causal.phi_k_span, {}, d_phi_k, {}, g_k, grads.dk);
    if (grads.dv.defined() && rows > 0)
      PHASOR_LAUNCH((copy_columns_kernel<A>), simt::Dim3(blocks_for(rows * V)),
                    simt::Dim3(kThreads), 0, stream, dm, V, d_v_ext, grads.dv);
    if (want_w) run.dw({g_q, p.q, s}, {g_k, p.k, s}, grads.dw);
    return;
  }
  const std::int64_t state = N * dm.H * dm.m * (V + 1);
  const std::int64_t total =
      6 * rows * dm.m + 3 * rows + 2 * state + rows * (V + 1) + (want_w ? 2 * rows * dm.m : 0);
  simt::Workspace work(static_cast<std::size_t>(total) * sizeof(A), stream);
  Carve<A> carve{static_cast<A*>(work.data())};
  const simt::Span<A> u_q = carve.take(rows * dm.m), u_k = carve.take(rows * dm.m),
                      phi_q = carve.take(rows * dm.m), phi_k = carve.take(rows * dm.m),
                      d_phi_q = carve.take(rows * dm.m), d_phi_k = carve.take(rows * dm.m),
                      rowmax = carve.take(rows), shift_q = carve.take(rows),
                      shift_k = carve.take(rows), sx = carve.take(state), dsx = carve.take(state),
                      d_ox = carve.take(rows * (V + 1)), g_q = carve.take(want_w ? rows * dm.m : 0),
                      g_k = carve.take(want_w ? rows * dm.m : 0);
  run.attention_features(p, s, u_q, u_k, rowmax, shift_q, shift_k, {}, phi_q, phi_k);
  if (rows == 0) return;
  const simt::Dim3 kv_grid(static_cast<unsigned>(N * dm.H),
                           static_cast<unsigned>(ceil_div(V + 1, kTile)));
  const std::size_t kv_bytes =
      static_cast<std::size_t>(dm.m * kTile + kRows * dm.m + kRows * kTile) * sizeof(A);
  const simt::Dim3 tile_grid(static_cast<unsigned>(run.slots), static_cast<unsigned>(dm.H));
  PHASOR_LAUNCH((kv_kernel<A>), kv_grid, simt::Dim3(kThreads), kv_bytes, stream, dm, V, phi_k, p.v,
                simt::Span<A>{}, sx);
  PHASOR_LAUNCH(
      (attend_kernel<A>), tile_grid, simt::Dim3(kThreads),
      static_cast<std::size_t>(kRows * dm.m + dm.m * kTile + kRows * (V + 1) + kRows * dm.m) *
          sizeof(A),
      stream, dm, V, phi_q, sx, TensorView{}, d_o, d_ox, d_phi_q);
  PHASOR_LAUNCH((kv_kernel<A>), kv_grid, simt::Dim3(kThreads), kv_bytes, stream, dm, V, phi_q,
                TensorView{}, d_ox, dsx);
  PHASOR_LAUNCH((kv_grads_kernel<A>), tile_grid, simt::Dim3(kThreads),
                static_cast<std::size_t>(kRows * dm.m + dm.m * kTile + kRows * kTile +
                                         kRows * dm.m + kRows * kTile) *
                    sizeof(A),
                stream, dm, V, p.v, phi_k, dsx, d_phi_k, grads.dv);
  run.grads(p.q, s, p.w, phi_q, {}, d_phi_q, {}, g_q, grads.dq, /*half=*/false);
  run.grads(p.k, s, p.w, phi_k, {}, d_phi_k, {}, g_k, grads.dk);
  if (want_w) run.dw({g_q, p.q, s}, {g_k, p.k, s}, grads.dw);
}

}  // namespace

void features_forward(const FeatureProblem& problem, const TensorView& phi) {
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  FeatureProblem p = problem;
  for (TensorView* input : {&p.x, &p.w}) *input = stage(*input, {phi});
  if (p.x.dtype == DType::float64)
    features_forward_typed<double>(p, phi, stream);
  else
    features_forward_typed<float>(p, phi, stream);
}
void features_backward(const FeatureProblem& problem, const TensorView& d_phi_in,
                       const TensorView& dx, const TensorView& dw) {
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  FeatureProblem p = problem;
  for (TensorView* input : {&p.x, &p.w}) *input = stage(*input, {dx, dw});
  const TensorView d_phi = stage(d_phi_in, {dx, dw});
  if (p.x.dtype == DType::float64)
    features_backward_typed<double>(p, d_phi, dx, dw, stream);
  else
    features_backward_typed<float>(p, d_phi, dx, dw, stream);
}
void attention_forward(const AttentionProblem& problem, const TensorView& o) {
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  AttentionProblem p = problem;
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.w}) *input = stage(*input, {o});
  if (p.q.dtype == DType::float64)
    attention_forward_typed<double>(p, o, stream);
  else
    attention_forward_typed<float>(p, o, stream);
}
void attention_backward(const AttentionProblem& problem, const TensorView& d_o_in,
                        const FavorAttentionGrads& grads) {
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  AttentionProblem p = problem;
  const std::initializer_list<TensorView> outputs = {grads.dq, grads.dk, grads.dv, grads.dw};
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.w}) *input = stage(*input, outputs);
  const TensorView d_o = stage(d_o_in, outputs);
  if (p.q.dtype == DType::float64)
    attention_backward_typed<double>(p, d_o, grads, stream);
  else
    attention_backward_typed<float>(p, d_o, grads, stream);
}

}  // namespace phasor::PHASOR_BACKEND::favor
