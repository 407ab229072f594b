// FoX's chunk kernels on the GPU (parallel_forgetting_attn, Impl::chunk;
// cuda/forgetting_attn/forgetting_attn.h), written once for nvcc and the emulated GPU. They compute
// what src/forgetting_attn/chunk.cpp computes — flash-style tiles of Bt queries × Bt keys, the
// CPU's float64 gate sums, masks, slopes and rotation, the dominant-key rule and the crossing sums
// of dg — split into kernels the way FlashAttention-2 splits its backward:
//
//   totals   (block, query head): Σ g over each block of Bt tokens, float64 (for the gate sums
//            between two blocks, the CPU's BlockGates::total).
//   rotate   (token, head, pair), only with θ: q and k rotated once into a workspace ((R1)).
//   forward  (query block, query head): the online softmax over the visible key tiles, the
//            diagonal tile first, then downwards until a zero gate or the window hides every
//            earlier key; o = A / l, lse = m + log l.
// and for the backward (after forward into a workspace unless o and lse are both given):
//   dq       (query block, query head): walks the same key tiles (the diagonal last) with
//            P = e^{ℓ − lse}, dP = dO Vᵀ, dℓ = P ⊙ (dP − D), D_i = do_i·o_i: dq = scale Σ dℓ K,
//            da, each row's dominant key j* (P_ij* > 1/2) with dℓ_ij* = −Σ_{j≠j*} dℓ_ij, and
//            the query block's share of dg; writes D and the dominant keys for dkv.
//   dkv      (key block, key head): for each query head of the group, walks the query tiles that
//            see the block (the diagonal first, then upwards while visible), recomputing the same
//            ℓ, P, dℓ bit for bit (the dominant keys' dℓ taken from dq): dv = Σ Pᵀ dO,
//            dk = scale Σ dℓᵀ Q, db, the key block's share of dg; dθ of the key head.
//   dg       (block, query head): the shares combined.
//
// Gate bias of the pair (i, j), as on the CPU: Σ_{s ∈ (i0, i]} g_s + gap + Σ_{s ∈ (j, j1)} g_s
// with gap = Σ_{s ∈ [j1, i0]} g_s = g_{i0} + total_{bi−1} + … + total_{bj+1} (that order, in
// dq and dkv alike), or the running sum along the row in the diagonal tile; float64, plus the
// slope bias −(i − j)(a_i + b_j), before the one rounding to the compute type. −inf gates mask.
//
// dg_s = Σ_{(i, j): j < s ≤ i} dℓ_ij without row-minus-column cumulative sums of float32 values.
// For s in block b (first position b0, end b1) the pairs split into four float64 parts:
//   both in b                 the diagonal tile's crossing sums            (dq)
//   i ∈ b, j < b0             Σ_{i ≥ s, i ∈ b} R_i,  R_i = Σ_{j < b0} dℓ_ij  (dq)
//   j ∈ b, i ≥ b1             Σ_{j < s, j ∈ b} C_j,  C_j = Σ_{i ≥ b1} dℓ_ij  (dkv)
//   j < b0, i ≥ b1            X_b = Σ_{b' < b} (ΣC over block b' − ΣR over block b' + 1)  (dg)
// The last identity cancels exactly up to float64 rounding: dq and dkv form every dℓ_ij from the
// same operands with the same code, so the same float32 numbers enter both sides.
//
// Matrix products through cuda/common/gemm.h: tensor cores (operands rounded to q's 16-bit type,
// the scale applied to the float accumulator) for bfloat16 / float16, exact FMA tiles in float32 /
// float64 (q scaled first, as the CPU). On tensor cores S = q kᵀ takes q and k split into two
// 16-bit parts (three products) when they are not 16-bit values — rotated by θ, or k of another
// dtype — since the exp would amplify their rounding (split_tile). Every block writes its own rows
// only and every sum runs in a fixed order: no atomics, the same bits in every run and under every
// emulator schedule.
//
// Tiles: Bt = the params' block_size (16, 32 or 64 on a GPU device), halved (down to 8) while a
// kernel's shared memory would exceed 160 KiB (large K, V; the backward's dkv holds the most).
// K, V ≤ 256. Workspace (compute type, O(T)): rotated q and k (θ only); o and lse when recomputed;
// per token and query head D, the dominant key and its dℓ, dg's two shares (float64), dθ's q
// shares (θ only); per block and query head the gate totals and the dg share totals (float64).
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/chunks.h"
#include "common/fill.h"
#include "common/gemm.h"
#include "common/recurrent.h"
#include "common/staging.h"
#include "forgetting_attn/forgetting_attn.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND::fox {
namespace {

using ::phasor::detail::Sequence;
using ::phasor::detail::fox::Problem;
using ::phasor::detail::fox::slope_bias;
using ::phasor::detail::fox::window_start;

constexpr int kThreads = 128;  // 4 warps
constexpr int kMaxDim = 256;   // K and V
constexpr int kMinRows = 8;
constexpr std::int64_t kMaxHeads = 65535;  // gridDim.y

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// ---- blocks of rows ----------------------------------------------------------------------------

// A block of up to Bt rows (queries or keys) of one sequence.
struct Rows {
  std::int64_t c = 0;       // block index within the sequence
  std::int64_t slot = 0;    // its slot (common/chunks.h)
  std::int64_t batch = 0;   // the sequence's batch row
  std::int64_t start = 0;   // and first token in it
  std::int64_t i0 = 0;      // first position of the block in the sequence (c · Bt)
  std::int64_t length = 0;  // the sequence's length
  int len = 0;              // rows in the block

  PHASOR_DEVICE std::int64_t token(std::int64_t r) const { return start + i0 + r; }
};

PHASOR_DEVICE Rows sibling(const Rows& b, int Bt, std::int64_t c) {
  Rows out = b;
  out.c = c;
  out.slot = b.slot - b.c + c;
  out.i0 = c * Bt;
  const std::int64_t left = b.length - out.i0;
  out.len = static_cast<int>(left < Bt ? left : Bt);
  return out;
}

// The block in `slot`; false if the slot holds none.
PHASOR_DEVICE bool locate_rows(const Problem& p, int Bt, std::int64_t slot, Rows& out) {
  std::int64_t n, c;
  if (!locate_chunk(p.sequences, Bt, slot, n, c)) return false;
  const Sequence s = p.sequences[n];
  out.slot = slot - c;
  out.c = 0;
  out.batch = s.batch;
  out.start = s.start;
  out.length = s.length;
  out = sibling(out, Bt, c);
  return true;
}

// Index of (batch row, token, query head) in the per-token workspaces.
PHASOR_DEVICE std::int64_t flat(const Problem& p, std::int64_t batch, std::int64_t token,
                                std::int64_t hq) {
  return (batch * p.T + token) * p.HQ + hq;
}

// ---- gates -------------------------------------------------------------------------------------

PHASOR_DEVICE double gate(const Problem& p, const Rows& b, std::int64_t position, std::int64_t hq) {
  return simt::load<double>(p.g, b.batch, b.start + position, hq);
}

// out[r] = Σ_{s ∈ (i0, i0 + r]} g_s (one thread).
PHASOR_DEVICE void from_start(const Problem& p, const Rows& b, std::int64_t hq,
                              const simt::SharedArray<double>& out) {
  double sum = 0;
  out[0] = 0.0;
  for (int r = 1; r < b.len; ++r) {
    sum += gate(p, b, b.i0 + r, hq);
    out[r] = sum;
  }
}
// out[c] = Σ_{s ∈ (j0 + c, j1)} g_s (one thread).
PHASOR_DEVICE void to_end(const Problem& p, const Rows& b, std::int64_t hq,
                          const simt::SharedArray<double>& out) {
  double sum = 0;
  out[b.len - 1] = 0.0;
  for (int c = b.len - 2; c >= 0; --c) {
    sum += gate(p, b, b.i0 + c + 1, hq);
    out[c] = sum;
  }
}

// The total of block b' of the sequence of `b` for query head hq.
PHASOR_DEVICE double block_total(const Problem& p, const simt::Span<double>& totals, const Rows& b,
                                 std::int64_t c, std::int64_t hq) {
  return totals[(b.slot - b.c + c) * p.HQ + hq];
}

// Whether a key block ending at j1 can hold a key visible from the query block starting at i0.
PHASOR_DEVICE bool in_window(const Problem& p, std::int64_t j1, std::int64_t i0) {
  return j1 - 1 >= window_start(i0, p.window);
}

// The key blocks below the diagonal visible from query block I, downwards (thread 0's state):
// gap = Σ_{s ∈ [j1, i0]} g_s accumulated as g_{i0} + total_{bi−1} + … (the CPU's order). The walk
// ends at the first block that a −inf gap or the window hides (every lower one is hidden too).
struct KeyWalk {
  std::int64_t next;
  double gap = 0;

  PHASOR_DEVICE explicit KeyWalk(const Rows& I) : next(I.c - 1) {}
  // The next visible key block, or −1.
  PHASOR_DEVICE std::int64_t advance(const Problem& p, const simt::Span<double>& totals,
                                     const Rows& I, int Bt, std::int64_t hq) {
    const std::int64_t bj = next;
    if (bj < 0) return -1;
    gap = bj == I.c - 1 ? gate(p, I, I.i0, hq) : gap + block_total(p, totals, I, bj + 1, hq);
    if (gap == kNegInf || !in_window(p, (bj + 1) * Bt, I.i0)) {
      next = -1;
      return -1;
    }
    next = bj - 1;
    return bj;
  }
};

// gap between key block J and query block bi > J.c, summed as KeyWalk sums it.
PHASOR_DEVICE double gap_between(const Problem& p, const simt::Span<double>& totals, const Rows& J,
                                 std::int64_t bi, int Bt, std::int64_t hq) {
  double gap = gate(p, J, bi * Bt, hq);
  for (std::int64_t b = bi - 1; b > J.c; --b) gap += block_total(p, totals, J, b, hq);
  return gap;
}

// ---- tiles -------------------------------------------------------------------------------------

// out[r·W + c] = x[batch, token(r), head, c] · scale for the block's rows, c < W.
template <class A>
PHASOR_DEVICE void load_rows(const TensorView& x, const Rows& b, std::int64_t head, int W,
                             const simt::SharedArray<A>& out, A scale) {
  load_token_rows<A>(x, b.batch, b.token(0), b.len, b.len, head, 0, W, W, out,
                     [&](int, A value) { return A(value * scale); });
}

// The gate and slope data of a tile's rows and columns (float64, shared).
struct TileBias {
  simt::SharedArray<double> from_start;  // query rows: Σ_{s ∈ (i0, i]} g_s
  simt::SharedArray<double> gates;       // query rows: g_i (the diagonal tile)
  simt::SharedArray<double> to_end;      // key columns: Σ_{s ∈ (j, j1)} g_s
  simt::SharedArray<double> slope_q;     // query rows: a_i
  simt::SharedArray<double> slope_k;     // key columns: b_j
};

// s (nI × nJ, leading dimension Bt) holds S_ij = (scale q_i)·k_j of query block I and key block J;
// it becomes the logits ℓ_ij = S_ij + (gate sum + slope bias), −inf where j > i or i − j ≥ window
// (the CPU's tile_logits, the same sums in the same order).
template <class A>
PHASOR_DEVICE void tile_logits(const Problem& p, const Rows& I, const Rows& J, double gap,
                               const TileBias& t, const simt::SharedArray<A>& s, int Bt) {
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const bool slopes = p.has_slopes();
  const int tid = static_cast<int>(threadIdx.x), nI = I.len, nJ = J.len;
  if (J.c == I.c) {  // diagonal: the gate sum along the row, from j = i down
    for (int r = tid; r < nI; r += kThreads) {
      const std::int64_t i = I.i0 + r;
      const std::int64_t w = window_start(i, p.window) - J.i0;
      const int first = static_cast<int>(w < 0 ? 0 : w > nJ ? nJ : w);
      for (int c = 0; c < nJ; ++c)
        if (c > r || c < first) s[r * Bt + c] = neg_inf;
      const double a = slopes ? double(t.slope_q[r]) : 0.0;
      double gate_sum = 0;
      for (int c = r - 1; c >= first; --c) {
        const double g = t.gates[c + 1];
        gate_sum += g;
        double bias = gate_sum;
        if (slopes) {
          const double b = t.slope_k[c];
          bias = gate_sum + slope_bias(i, J.i0 + c, a, b);
        }
        const A x = s[r * Bt + c];
        s[r * Bt + c] = x + static_cast<A>(bias);
      }
    }
    return;
  }
  for (int e = tid; e < nI * nJ; e += kThreads) {
    const int r = e / nJ, c = e % nJ;
    const std::int64_t i = I.i0 + r, j = J.i0 + c;
    if (j < window_start(i, p.window)) {
      s[r * Bt + c] = neg_inf;
      continue;
    }
    const double from = t.from_start[r], to = t.to_end[c];
    const double row_part = from + gap;
    double bias = row_part + to;
    if (slopes) {
      const double a = t.slope_q[r], b = t.slope_k[c];
      bias = row_part + to + slope_bias(i, j, a, b);
    }
    const A x = s[r * Bt + c];
    s[r * Bt + c] = x + static_cast<A>(bias);
  }
}

// Slopes of a block's rows (0 when absent, as the CPU's load_slopes).
PHASOR_DEVICE double slope_at(const TensorView& slope, const Rows& b, std::int64_t r,
                              std::int64_t head) {
  return slope.defined() ? simt::load<double>(slope, b.batch, b.token(r), head) : 0.0;
}

// The inputs every kernel reads.
struct Inputs {
  Problem p;
  TensorView q, k;            // rotated by θ (a workspace), else p.q, p.k
  simt::Span<double> totals;  // [slot][HQ]: Σ g over each block
  int rows = 16;              // Bt
};

// The operand q of S = q kᵀ: scale · q on FMA tiles (the CPU's q_scaled); on tensor cores q itself,
// the scale going to the float accumulator (a 16-bit scale · q would add a rounding).
template <class O>
PHASOR_DEVICE Accumulator<O> q_operand_scale(const Problem& p) {
  return kTensorCores<O> ? Accumulator<O>(1) : static_cast<Accumulator<O>>(p.scale);
}
template <class O>
PHASOR_DEVICE Accumulator<O> product_scale(const Problem& p) {
  return kTensorCores<O> ? static_cast<Accumulator<O>>(p.scale) : Accumulator<O>(1);
}

// On tensor cores q and k reach the products as 16-bit values. Without θ they are the inputs
// themselves (exact); rotated by θ (or k of another dtype than q) they are not, and rounding
// them would move a logit of size L by ~L·u, which the softmax's exp turns into output errors of
// that size (beyond the tensor-core rule, which allows u once). There each operand is split into
// two 16-bit parts, x = hi + lo with lo = x − hi rounded, and
// S = lo_q hi_kᵀ + hi_q lo_kᵀ + hi_q hi_kᵀ (the lo·lo term, ~u² of a product, dropped): three
// products instead of one, S to ~u² (bfloat16 2^−16, float16 2^−22) instead of ~u. float16
// operands get gemm.h's power-of-two scaling of rows and columns (float16's range) first.
template <class O>
PHASOR_DEVICE void split_tile(Tile<float>& acc, const SharedMatrix<float>& a, int i0,
                              const SharedMatrix<float>& b, int j0, int depth) {
  const int lane = static_cast<int>(simt::lane_id()), group = lane / 4, quad = lane % 4;
  int e_lo = 0, e_hi = 0, e_column = 0;
  if constexpr (std::is_same_v<O, float16>) {  // as mma_tile_float16
    float row_lo = 0.f, row_hi = 0.f, column = 0.f;
    for (int k = quad; k < depth; k += 4) {
      row_lo = simt::fmax(row_lo, simt::fabs(a.at(i0 + group, k)));
      row_hi = simt::fmax(row_hi, simt::fabs(a.at(i0 + group + 8, k)));
      column = simt::fmax(column, simt::fabs(b.at(k, j0 + group)));
    }
    for (int offset = 1; offset < 4; offset *= 2) {
      row_lo = simt::fmax(row_lo, simt::shfl_xor_sync(simt::kFullMask, row_lo, offset));
      row_hi = simt::fmax(row_hi, simt::shfl_xor_sync(simt::kFullMask, row_hi, offset));
      column = simt::fmax(column, simt::shfl_xor_sync(simt::kFullMask, column, offset));
    }
    e_lo = binary_exponent(row_lo), e_hi = binary_exponent(row_hi);
    e_column = binary_exponent(column);
  }
  const float s_lo = power_of_two(-e_lo), s_hi = power_of_two(-e_hi),
              s_column = power_of_two(-e_column);
  simt::MmaC c;
  for (int k0 = 0; k0 < depth; k0 += 16) {
    simt::MmaA<O> a_hi, a_lo;
    simt::MmaB<O> b_hi, b_lo;
    for (int i = 0; i < 8; ++i) {
      const int row = simt::mma_a_row(lane, i), k = k0 + simt::mma_a_col(lane, i);
      const float x = k < depth ? a.at(i0 + row, k) * (row < 8 ? s_lo : s_hi) : 0.f;
      a_hi.x[i] = O::from_float(x);
      a_lo.x[i] = O::from_float(x - a_hi.x[i].to_float());
    }
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + simt::mma_b_row(lane, i);
      const float x = k < depth ? b.at(k, j0 + simt::mma_b_col(lane, i)) * s_column : 0.f;
      b_hi.x[i] = O::from_float(x);
      b_lo.x[i] = O::from_float(x - b_hi.x[i].to_float());
    }
    simt::mma_sync(c, a_lo, b_hi, c);
    simt::mma_sync(c, a_hi, b_lo, c);
    simt::mma_sync(c, a_hi, b_hi, c);
  }
  if constexpr (std::is_same_v<O, float16>) {  // element e: row group (+ 8), column 2·quad + e % 2
    const int e_even = simt::shfl_sync(simt::kFullMask, e_column, 4 * (2 * quad));
    const int e_odd = simt::shfl_sync(simt::kFullMask, e_column, 4 * (2 * quad + 1));
    for (int e = 0; e < 4; ++e) {
      const int e_row = e < 2 ? e_lo : e_hi, e_col = e % 2 == 0 ? e_even : e_odd;
      acc.x[e] += c.x[e] * power_of_two(e_row) * power_of_two(e_col);
    }
  } else {
    for (int e = 0; e < 4; ++e) acc.x[e] += c.x[e];
  }
}

// S = q kᵀ (nI × nJ into s, leading dimension Bt); dq and dkv call it alike, so both get the
// same bits for every element.
template <class O>
PHASOR_DEVICE void scores(const Problem& p, const simt::SharedArray<Accumulator<O>>& q, int nI,
                          const simt::SharedArray<Accumulator<O>>& k, int nJ,
                          const simt::SharedArray<Accumulator<O>>& s, int Bt) {
  const int K = static_cast<int>(p.K);
  const SharedMatrix<Accumulator<O>> a = row_major(q, 0, K, nI, K),
                                     b = row_major(k, 0, K, nJ, K).transposed();
  if constexpr (kTensorCores<O>) {
    if (p.theta.defined() || p.k.dtype != p.q.dtype) {  // gemm_to_shared with split operands
      const int lane = static_cast<int>(simt::lane_id()), warp = static_cast<int>(simt::warp_id());
      const int tiles_n = (nJ + 7) / 8, tiles = ((nI + 15) / 16) * tiles_n;
      const float alpha = product_scale<O>(p);
      for (int t = warp; t < tiles; t += kThreads / simt::kWarpSize) {
        const int i0 = (t / tiles_n) * 16, j0 = (t % tiles_n) * 8;
        Tile<float> acc;
        split_tile<O>(acc, a, i0, b, j0, K);
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + tile_row(lane, e), j = j0 + tile_col(lane, e);
          if (i < nI && j < nJ) s[i * Bt + j] = alpha * acc.x[e];
        }
      }
      return;
    }
  }
  gemm_to_shared<O>(a, b, nI, nJ, K, s, 0, Bt, false, product_scale<O>(p));
}
// dP = dO vᵀ (nI × nJ into dp).
template <class O>
PHASOR_DEVICE void value_products(const Problem& p, const simt::SharedArray<Accumulator<O>>& d_o,
                                  int nI, const simt::SharedArray<Accumulator<O>>& v, int nJ,
                                  const simt::SharedArray<Accumulator<O>>& dp, int Bt) {
  const int V = static_cast<int>(p.V);
  gemm_to_shared<O>(row_major(d_o, 0, V, nI, V), row_major(v, 0, V, nJ, V).transposed(), nI, nJ, V,
                    dp, 0, Bt, false);
}

// ---- shared memory layouts ----------------------------------------------------------------------

// Element offsets of a kernel's arrays in three regions of its dynamic shared memory: float64
// values, then int64 values, then values of the compute type A.
struct Region {
  int count = 0;
  PHASOR_HOST_DEVICE int take(int n) {
    const int at = count;
    count += n;
    return at;
  }
};
struct Layout {
  Region d, i, a;
  template <class A>
  PHASOR_HOST_DEVICE std::size_t bytes() const {
    return static_cast<std::size_t>(d.count + i.count) * sizeof(double) +
           static_cast<std::size_t>(a.count) * sizeof(A);
  }
  PHASOR_HOST_DEVICE std::size_t int_offset() const { return d.count * sizeof(double); }
  PHASOR_HOST_DEVICE std::size_t value_offset() const {
    return static_cast<std::size_t>(d.count + i.count) * sizeof(double);
  }
};

struct ForwardLayout : Layout {
  int from_start, gates, to_end, slope_q, slope_k, gap;  // d
  int block;                                             // i
  int q, kv, acc, s, max, sum;                           // a
  PHASOR_HOST_DEVICE ForwardLayout(int Bt, int K, int V) {
    from_start = d.take(Bt), gates = d.take(Bt), to_end = d.take(Bt);
    slope_q = d.take(Bt), slope_k = d.take(Bt), gap = d.take(1);
    block = i.take(1);
    q = a.take(Bt * K), kv = a.take(Bt * (K > V ? K : V)), acc = a.take(Bt * V);
    s = a.take(Bt * Bt), max = a.take(Bt), sum = a.take(Bt);
  }
};

struct DqLayout : Layout {
  int from_start, gates, to_end, slope_q, slope_k, others, da, row_off, crossing, gap;  // d
  int block, dominant;                                                                  // i
  int q, d_o, kv, dq, s, dp, lse, delta, dominant_value;                                // a
  PHASOR_HOST_DEVICE DqLayout(int Bt, int K, int V) {
    from_start = d.take(Bt), gates = d.take(Bt), to_end = d.take(Bt);
    slope_q = d.take(Bt), slope_k = d.take(Bt), others = d.take(Bt), da = d.take(Bt);
    row_off = d.take(Bt), crossing = d.take(Bt), gap = d.take(1);
    block = i.take(1), dominant = i.take(Bt);
    q = a.take(Bt * K), d_o = a.take(Bt * V), kv = a.take(Bt * (K > V ? K : V));
    dq = a.take(Bt * K), s = a.take(Bt * Bt), dp = a.take(Bt * Bt);
    lse = a.take(Bt), delta = a.take(Bt), dominant_value = a.take(Bt);
  }
};

struct DkvLayout : Layout {
  int to_end, slope_k, db, col_off, from_start, gates, slope_q, gap;  // d
  int stop, dominant;                                                 // i
  int k, v, dk, dv, q, d_o, s, dp, lse, delta, dominant_value;        // a
  PHASOR_HOST_DEVICE DkvLayout(int Bt, int K, int V) {
    to_end = d.take(Bt), slope_k = d.take(Bt), db = d.take(Bt), col_off = d.take(Bt);
    from_start = d.take(Bt), gates = d.take(Bt), slope_q = d.take(Bt), gap = d.take(1);
    stop = i.take(1), dominant = i.take(Bt);
    k = a.take(Bt * K), v = a.take(Bt * V), dk = a.take(Bt * K), dv = a.take(Bt * V);
    q = a.take(Bt * K), d_o = a.take(Bt * V), s = a.take(Bt * Bt), dp = a.take(Bt * Bt);
    lse = a.take(Bt), delta = a.take(Bt), dominant_value = a.take(Bt);
  }
};

// ---- small kernels -----------------------------------------------------------------------------

// totals[slot][hq] = Σ g over the block in `slot`, in order (the CPU's BlockGates::total).
PHASOR_GLOBAL void totals_kernel(Problem p, int Bt, std::int64_t slots, simt::Span<double> totals) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= slots * p.HQ) return;
  const std::int64_t hq = e % p.HQ;
  Rows b;
  if (!locate_rows(p, Bt, e / p.HQ, b)) return;
  double sum = 0;
  for (int r = 0; r < b.len; ++r) sum += gate(p, b, b.i0 + r, hq);
  totals[e] = sum;
}

// out [B, T, heads, K] = x rotated by θ of key head head / group ((R1), the CPU's rotate_rows).
template <class A>
PHASOR_GLOBAL void rotate_kernel(Problem p, TensorView x, TensorView out, std::int64_t heads,
                                 std::int64_t group) {
  const std::int64_t R = p.K / 2;
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.B * p.T * heads * R) return;
  const std::int64_t pair = e % R, head = (e / R) % heads, t = (e / R / heads) % p.T,
                     b = e / R / heads / p.T;
  A c, s;
  angle_of(p.theta, b, t, head / group, pair, c, s);
  const std::int64_t ia = pair_a(p.rotary_layout, p.K, pair),
                     ib = pair_b(p.rotary_layout, p.K, pair);
  const A xa = simt::load<A>(x, b, t, head, ia), xb = simt::load<A>(x, b, t, head, ib);
  simt::store(out, xa * c - xb * s, b, t, head, ia);
  simt::store(out, xa * s + xb * c, b, t, head, ib);
}

// ---- forward -----------------------------------------------------------------------------------

template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    forward_kernel(Inputs in, TensorView o, TensorView lse) {
  using A = Accumulator<O>;
  const Problem& p = in.p;
  const int Bt = in.rows, K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  Rows I;
  if (!locate_rows(p, Bt, blockIdx.x, I)) return;
  const std::int64_t hq = blockIdx.y, h = hq / p.group();
  const ForwardLayout l(Bt, K, V);
  PHASOR_DYNAMIC_SHARED_AT(double, dsh, 0, l.d.count);
  PHASOR_DYNAMIC_SHARED_AT(std::int64_t, ish, l.int_offset(), l.i.count);
  PHASOR_DYNAMIC_SHARED_AT(A, ash, l.value_offset(), l.a.count);
  const TileBias bias{dsh.view(l.from_start, Bt), dsh.view(l.gates, Bt), dsh.view(l.to_end, Bt),
                      dsh.view(l.slope_q, Bt), dsh.view(l.slope_k, Bt)};
  const simt::SharedArray<A> q_s = ash.view(l.q, Bt * K),
                             kv_s = ash.view(l.kv, Bt * (K > V ? K : V)),
                             acc_s = ash.view(l.acc, Bt * V), s_s = ash.view(l.s, Bt * Bt),
                             max_s = ash.view(l.max, Bt), sum_s = ash.view(l.sum, Bt);
  const int tid = static_cast<int>(threadIdx.x), nI = I.len;
  const A neg_inf = -std::numeric_limits<A>::infinity();

  load_rows(in.q, I, hq, K, q_s, q_operand_scale<O>(p));
  for (int e = tid; e < nI * V; e += kThreads) acc_s[e] = A(0);
  for (int r = tid; r < nI; r += kThreads) {
    max_s[r] = neg_inf;
    sum_s[r] = A(0);
    bias.gates[r] = gate(p, I, I.i0 + r, hq);
    if (p.has_slopes()) bias.slope_q[r] = slope_at(p.slope_q, I, r, hq);
  }
  if (tid == 0) from_start(p, I, hq, bias.from_start);

  // The diagonal tile first (it holds j = i: the running max is finite from then on), then down.
  KeyWalk walk(I);
  for (int step = 0;; ++step) {
    simt::syncthreads();
    if (tid == 0) {
      ish[l.block] = step == 0 ? I.c : walk.advance(p, in.totals, I, Bt, hq);
      dsh[l.gap] = walk.gap;
    }
    simt::syncthreads();
    const std::int64_t bj = ish[l.block];
    if (bj < 0) break;
    const Rows J = sibling(I, Bt, bj);
    const int nJ = J.len;
    const double gap = dsh[l.gap];
    load_rows(in.k, J, h, K, kv_s, A(1));
    if (bj != I.c && tid == kThreads - 1) to_end(p, J, hq, bias.to_end);
    if (p.has_slopes())
      for (int c = tid; c < nJ; c += kThreads) bias.slope_k[c] = slope_at(p.slope_k, J, c, h);
    simt::syncthreads();
    scores<O>(p, q_s, nI, kv_s, nJ, s_s, Bt);
    simt::syncthreads();
    tile_logits(p, I, J, gap, bias, s_s, Bt);
    simt::syncthreads();
    // The online softmax, one thread per row; meanwhile the values replace the keys.
    for (int r = tid; r < nI; r += kThreads) {
      const A old_max = max_s[r];
      A new_max = old_max;
      for (int c = 0; c < nJ; ++c) {
        const A x = s_s[r * Bt + c];
        new_max = simt::fmax(new_max, x);
      }
      const A rescale = new_max == neg_inf ? A(1) : simt::exp(old_max - new_max);
      max_s[r] = new_max;
      A row_sum = 0;
      for (int c = 0; c < nJ; ++c) {
        const A x = s_s[r * Bt + c];
        const A prob = x == neg_inf ? A(0) : simt::exp(x - new_max);
        s_s[r * Bt + c] = prob;
        row_sum += prob;
      }
      const A old_sum = sum_s[r];
      sum_s[r] = rescale * old_sum + row_sum;
      for (int c = 0; c < V; ++c) {
        const A x = acc_s[r * V + c];
        acc_s[r * V + c] = rescale * x;
      }
    }
    load_rows(p.v, J, h, V, kv_s, A(1));
    simt::syncthreads();
    gemm_to_shared<O>(row_major(s_s, 0, Bt, nI, nJ), row_major(kv_s, 0, V, nJ, V), nI, V, nJ, acc_s,
                      0, V, true);
  }
  // o = A · (1 / l), lse = m + log l (the last product is complete: the loop ended on a barrier).
  store_token_rows<A>(o, I.batch, I.token(0), nI, hq, 0, V, V, [&](int r, int c) {
    const A x = acc_s[r * V + c], sum = sum_s[r];
    return x * (A(1) / sum);
  });
  if (lse.defined())
    for (int r = tid; r < nI; r += kThreads) {
      const A m = max_s[r], sum = sum_s[r];
      simt::store(lse, m + simt::log(sum), I.batch, I.token(r), hq);
    }
}

// ---- backward ----------------------------------------------------------------------------------

// What the backward kernels read and write besides Inputs.
template <class A>
struct Backward {
  TensorView d_o, o, lse;  // o, lse: the caller's, or recomputed into a workspace
  ForgettingAttnGrads out;
  simt::Span<A> delta;            // [B·T·HQ] D_i = do_i·o_i
  simt::Span<std::int64_t> star;  // [B·T·HQ] each row's dominant key (position), or −1
  simt::Span<A> star_dlogit;      // [B·T·HQ] its dℓ
  simt::Span<A> dtheta_q;         // [B·T·HQ][K/2] dθ's share of query head hq
  simt::Span<double> dg_rows;     // [B·T·HQ] dg's parts from dq (diagonal + R_i)
  simt::Span<double> dg_cols;     // [B·T·HQ] from dkv (C_j)
  simt::Span<double> row_totals;  // [slot][HQ] Σ R_i over the block
  simt::Span<double> col_totals;  // [slot][HQ] Σ C_j over the block
  // Requested (dq and dk also for dθ).
  bool dq = false, dk = false, dv = false, dg = false, da = false, db = false, dtheta = false;
};

template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads) dq_kernel(Inputs in, Backward<Accumulator<O>> g) {
  using A = Accumulator<O>;
  const Problem& p = in.p;
  const int Bt = in.rows, K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  Rows I;
  if (!locate_rows(p, Bt, blockIdx.x, I)) return;
  const std::int64_t hq = blockIdx.y, h = hq / p.group();
  const DqLayout l(Bt, K, V);
  PHASOR_DYNAMIC_SHARED_AT(double, dsh, 0, l.d.count);
  PHASOR_DYNAMIC_SHARED_AT(std::int64_t, ish, l.int_offset(), l.i.count);
  PHASOR_DYNAMIC_SHARED_AT(A, ash, l.value_offset(), l.a.count);
  const TileBias bias{dsh.view(l.from_start, Bt), dsh.view(l.gates, Bt), dsh.view(l.to_end, Bt),
                      dsh.view(l.slope_q, Bt), dsh.view(l.slope_k, Bt)};
  const simt::SharedArray<double> others = dsh.view(l.others, Bt), da_s = dsh.view(l.da, Bt),
                                  row_off = dsh.view(l.row_off, Bt),
                                  crossing = dsh.view(l.crossing, Bt);
  const simt::SharedArray<std::int64_t> star_s = ish.view(l.dominant, Bt);
  const simt::SharedArray<A> q_s = ash.view(l.q, Bt * K), do_s = ash.view(l.d_o, Bt * V),
                             kv_s = ash.view(l.kv, Bt * (K > V ? K : V)),
                             dq_s = ash.view(l.dq, Bt * K), s_s = ash.view(l.s, Bt * Bt),
                             dp_s = ash.view(l.dp, Bt * Bt), lse_s = ash.view(l.lse, Bt),
                             delta_s = ash.view(l.delta, Bt),
                             star_value = ash.view(l.dominant_value, Bt);
  const int tid = static_cast<int>(threadIdx.x), nI = I.len;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const A scale = static_cast<A>(p.scale);

  // 1. The block's rows: q (operand), do, lse, D (also to the workspace), gates, slopes.
  load_rows(in.q, I, hq, K, q_s, q_operand_scale<O>(p));
  load_rows(g.d_o, I, hq, V, do_s, A(1));
  if (g.dq)
    for (int e = tid; e < nI * K; e += kThreads) dq_s[e] = A(0);
  for (int r = tid; r < nI; r += kThreads) {
    const std::int64_t t = I.token(r), x = flat(p, I.batch, t, hq);
    lse_s[r] = simt::load<A>(g.lse, I.batch, t, hq);
    A d = 0;
    for (int c = 0; c < V; ++c)
      d += simt::load<A>(g.d_o, I.batch, t, hq, c) * simt::load<A>(g.o, I.batch, t, hq, c);
    delta_s[r] = d;
    g.delta[x] = d;
    others[r] = 0.0;
    da_s[r] = 0.0;
    row_off[r] = 0.0;
    star_s[r] = -1;
    bias.gates[r] = gate(p, I, I.i0 + r, hq);
    if (p.has_slopes()) bias.slope_q[r] = slope_at(p.slope_q, I, r, hq);
  }
  if (tid == 0) from_start(p, I, hq, bias.from_start);

  // 2. The key tiles below the diagonal, downwards, then the diagonal tile: once a row's every
  //    other dℓ is known, its dominant key's dℓ is.
  KeyWalk walk(I);
  bool walking = true, diagonal_done = false;  // thread 0's
  for (;;) {
    simt::syncthreads();
    if (tid == 0) {
      std::int64_t bj = -1;
      if (walking) {
        bj = walk.advance(p, in.totals, I, Bt, hq);
        walking = bj >= 0;
      }
      if (!walking && !diagonal_done) {
        bj = I.c;
        diagonal_done = true;
      }
      ish[l.block] = bj;
      dsh[l.gap] = walk.gap;
    }
    simt::syncthreads();
    const std::int64_t bj = ish[l.block];
    if (bj < 0) break;
    const bool diagonal = bj == I.c;
    const Rows J = sibling(I, Bt, bj);
    const int nJ = J.len;
    const double gap = dsh[l.gap];
    load_rows(p.v, J, h, V, kv_s, A(1));
    if (!diagonal && tid == kThreads - 1) to_end(p, J, hq, bias.to_end);
    if (p.has_slopes())
      for (int c = tid; c < nJ; c += kThreads) bias.slope_k[c] = slope_at(p.slope_k, J, c, h);
    simt::syncthreads();
    value_products<O>(p, do_s, nI, kv_s, nJ, dp_s, Bt);
    simt::syncthreads();
    load_rows(in.k, J, h, K, kv_s, A(1));
    simt::syncthreads();
    scores<O>(p, q_s, nI, kv_s, nJ, s_s, Bt);
    simt::syncthreads();
    tile_logits(p, I, J, gap, bias, s_s, Bt);
    simt::syncthreads();
    // P = e^{min(ℓ − lse, 0)} (exactly 0 where masked), dℓ = P ⊙ (dP − D). Exactly, ℓ ≤ lse; the
    // clamp keeps P ≤ 1 when a saved lse comes from other arithmetic (logits of 1e9 in float32
    // differ by hundreds between two summation orders: e^{ℓ − lse} would overflow), as the CPU.
    for (int e = tid; e < nI * nJ; e += kThreads) {
      const int r = e / nJ, at = r * Bt + e % nJ;
      const A x = s_s[at], row_lse = lse_s[r], d = delta_s[r], dpv = dp_s[at];
      const A prob = x == neg_inf ? A(0) : simt::exp(simt::fmin(x - row_lse, A(0)));
      s_s[at] = prob;
      dp_s[at] = prob * (dpv - d);
    }
    simt::syncthreads();
    // Per row: the dominant key (its dℓ left out of the tile for now), the float64 row sums.
    for (int r = tid; r < nI; r += kThreads) {
      const std::int64_t i = I.i0 + r;
      std::int64_t star = star_s[r];
      if (star < 0) {
        int best = 0;
        A best_prob = s_s[r * Bt];
        for (int c = 1; c < nJ; ++c) {
          const A prob = s_s[r * Bt + c];
          if (prob > best_prob) {
            best_prob = prob;
            best = c;
          }
        }
        if (best_prob > A(0.5)) {
          star = J.i0 + best;
          star_s[r] = star;
          dp_s[r * Bt + best] = A(0);
        }
      }
      double sum = 0, slope_sum = 0;
      for (int c = 0; c < nJ; ++c) {
        const A v = dp_s[r * Bt + c];
        sum += static_cast<double>(v);
        slope_sum += -static_cast<double>(i - (J.i0 + c)) * static_cast<double>(v);
      }
      const double before = others[r], da_before = da_s[r];
      others[r] = before + sum;
      da_s[r] = da_before + slope_sum;
      if (!diagonal) {
        const double off = row_off[r];
        row_off[r] = off + sum;
      } else {
        // The row is complete: dℓ_ij* = −Σ_{j≠j*} dℓ_ij. In the diagonal tile it joins the tile
        // (the product and the crossing sums below); elsewhere dq gets it after the walk.
        A value = A(0);
        if (star >= 0) {
          value = static_cast<A>(-(before + sum));
          if (star >= I.i0) {
            dp_s[r * Bt + (star - I.i0)] = value;
          } else {
            const double off = row_off[r];
            row_off[r] = off + static_cast<double>(value);
          }
          const double da_now = da_s[r];
          da_s[r] = da_now - static_cast<double>(i - star) * static_cast<double>(value);
        }
        star_value[r] = value;
        const std::int64_t x = flat(p, I.batch, I.token(r), hq);
        g.star[x] = star;
        g.star_dlogit[x] = value;
      }
    }
    simt::syncthreads();
    // dq += dℓ K_J; in the diagonal tile also its crossing sums Σ_{i ≥ s} Σ_{j < s} dℓ_ij.
    if (g.dq)
      gemm_to_shared<O>(row_major(dp_s, 0, Bt, nI, nJ), row_major(kv_s, 0, K, nJ, K), nI, K, nJ,
                        dq_s, 0, K, true);
    if (diagonal && g.dg)
      for (int x = tid; x < nI; x += kThreads) {
        double sum = 0;
        for (int r = x; r < nI; ++r)
          for (int c = 0; c < x; ++c) {
            const A v = dp_s[r * Bt + c];
            sum += static_cast<double>(v);
          }
        crossing[x] = sum;
      }
  }

  // 3. dq = scale (Σ_tiles dℓ K + dℓ_ij* k_j* for a dominant key below the diagonal), then
  //    unrotated with dθ's share ((R2), (R3)).
  const auto dq_at = [&](int r, int c) {
    A v = dq_s[r * K + c];
    const std::int64_t star = star_s[r];
    if (star >= 0 && star < I.i0) {
      const A value = star_value[r];
      v += value * simt::load<A>(in.k, I.batch, I.start + star, h, c);
    }
    return v * scale;
  };
  if (g.dq) {
    if (!p.theta.defined()) {
      if (g.out.dq.defined())
        store_token_rows<A>(g.out.dq, I.batch, I.token(0), nI, hq, 0, K, K,
                            [&](int r, int c) { return dq_at(r, c); });
    } else {
      const int R = K / 2;
      for (int e = tid; e < nI * R; e += kThreads) {
        const int r = e / R, pair = e % R;
        const std::int64_t t = I.token(r);
        const int ia = static_cast<int>(pair_a(p.rotary_layout, p.K, pair)),
                  ib = static_cast<int>(pair_b(p.rotary_layout, p.K, pair));
        const A dya = dq_at(r, ia), dyb = dq_at(r, ib);
        const A ya = simt::load<A>(in.q, I.batch, t, hq, ia),
                yb = simt::load<A>(in.q, I.batch, t, hq, ib);
        if (g.dtheta) g.dtheta_q[flat(p, I.batch, t, hq) * R + pair] = dyb * ya - dya * yb;
        if (g.out.dq.defined()) {
          A cs, sn;
          angle_of(p.theta, I.batch, t, h, pair, cs, sn);
          simt::store(g.out.dq, dya * cs + dyb * sn, I.batch, t, hq, ia);
          simt::store(g.out.dq, dyb * cs - dya * sn, I.batch, t, hq, ib);
        }
      }
    }
  }
  if (g.da)
    for (int r = tid; r < nI; r += kThreads) {
      const double v = da_s[r];
      simt::store(g.out.dbias_q_slope, v, I.batch, I.token(r), hq);
    }
  // dg's share: the crossing sums plus Σ_{i ≥ s} R_i; the block's Σ R_i.
  if (g.dg && tid == 0) {
    double suffix = 0;
    for (int r = nI - 1; r >= 0; --r) {
      const double off = row_off[r], cross = r == 0 ? 0.0 : double(crossing[r]);
      suffix += off;
      g.dg_rows[flat(p, I.batch, I.token(r), hq)] = cross + suffix;
    }
    g.row_totals[I.slot * p.HQ + hq] = suffix;
  }
}

template <class O>
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dkv_kernel(Inputs in, Backward<Accumulator<O>> g) {
  using A = Accumulator<O>;
  const Problem& p = in.p;
  const int Bt = in.rows, K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  Rows J;
  if (!locate_rows(p, Bt, blockIdx.x, J)) return;
  const std::int64_t h = blockIdx.y;
  const DkvLayout l(Bt, K, V);
  PHASOR_DYNAMIC_SHARED_AT(double, dsh, 0, l.d.count);
  PHASOR_DYNAMIC_SHARED_AT(std::int64_t, ish, l.int_offset(), l.i.count);
  PHASOR_DYNAMIC_SHARED_AT(A, ash, l.value_offset(), l.a.count);
  const TileBias bias{dsh.view(l.from_start, Bt), dsh.view(l.gates, Bt), dsh.view(l.to_end, Bt),
                      dsh.view(l.slope_q, Bt), dsh.view(l.slope_k, Bt)};
  const simt::SharedArray<double> db_s = dsh.view(l.db, Bt), col_off = dsh.view(l.col_off, Bt);
  const simt::SharedArray<std::int64_t> star_s = ish.view(l.dominant, Bt);
  const simt::SharedArray<A> k_s = ash.view(l.k, Bt * K), v_s = ash.view(l.v, Bt * V),
                             dk_s = ash.view(l.dk, Bt * K), dv_s = ash.view(l.dv, Bt * V),
                             q_s = ash.view(l.q, Bt * K), do_s = ash.view(l.d_o, Bt * V),
                             s_s = ash.view(l.s, Bt * Bt), dp_s = ash.view(l.dp, Bt * Bt),
                             lse_s = ash.view(l.lse, Bt), delta_s = ash.view(l.delta, Bt),
                             star_value = ash.view(l.dominant_value, Bt);
  const int tid = static_cast<int>(threadIdx.x), nJ = J.len;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const A scale = static_cast<A>(p.scale);
  const bool dlogits = g.dk || g.dg || g.db;

  load_rows(in.k, J, h, K, k_s, A(1));
  load_rows(p.v, J, h, V, v_s, A(1));
  if (g.dk)
    for (int e = tid; e < nJ * K; e += kThreads) dk_s[e] = A(0);
  if (g.dv)
    for (int e = tid; e < nJ * V; e += kThreads) dv_s[e] = A(0);
  for (int c = tid; c < nJ; c += kThreads) {
    db_s[c] = 0.0;
    if (p.has_slopes()) bias.slope_k[c] = slope_at(p.slope_k, J, c, h);
  }

  for (std::int64_t hq = h * p.group(); hq < (h + 1) * p.group(); ++hq) {
    simt::syncthreads();
    if (tid == 0) to_end(p, J, hq, bias.to_end);
    for (int c = tid; c < nJ; c += kThreads) col_off[c] = 0.0;
    // The query blocks that see J: the diagonal, then upwards while a pair can be visible.
    for (std::int64_t bi = J.c;; ++bi) {
      simt::syncthreads();
      if (tid == 0) {
        bool visible = bi * Bt < J.length;
        double gap = 0;
        if (visible && bi > J.c) {
          gap = gap_between(p, in.totals, J, bi, Bt, hq);
          visible = gap != kNegInf && in_window(p, (J.c + 1) * Bt, bi * Bt);
        }
        ish[l.stop] = visible ? 0 : 1;
        dsh[l.gap] = gap;
      }
      simt::syncthreads();
      const std::int64_t stop = ish[l.stop];
      if (stop != 0) break;
      const bool diagonal = bi == J.c;
      const Rows I = sibling(J, Bt, bi);
      const int nI = I.len;
      const double gap = dsh[l.gap];
      load_rows(in.q, I, hq, K, q_s, q_operand_scale<O>(p));
      load_rows(g.d_o, I, hq, V, do_s, A(1));
      for (int r = tid; r < nI; r += kThreads) {
        const std::int64_t t = I.token(r), x = flat(p, I.batch, t, hq);
        lse_s[r] = simt::load<A>(g.lse, I.batch, t, hq);
        if (dlogits) {
          const A d = g.delta[x], value = g.star_dlogit[x];
          delta_s[r] = d;
          star_s[r] = g.star[x];
          star_value[r] = value;
        }
        bias.gates[r] = gate(p, I, I.i0 + r, hq);
        if (p.has_slopes()) bias.slope_q[r] = slope_at(p.slope_q, I, r, hq);
      }
      if (!diagonal && tid == kThreads - 1) from_start(p, I, hq, bias.from_start);
      simt::syncthreads();
      scores<O>(p, q_s, nI, k_s, nJ, s_s, Bt);
      if (dlogits) value_products<O>(p, do_s, nI, v_s, nJ, dp_s, Bt);
      simt::syncthreads();
      tile_logits(p, I, J, gap, bias, s_s, Bt);
      simt::syncthreads();
      // P and dℓ as in dq_kernel; a dominant key's dℓ is dq_kernel's.
      for (int e = tid; e < nI * nJ; e += kThreads) {
        const int r = e / nJ, c = e % nJ, at = r * Bt + c;
        const A x = s_s[at], row_lse = lse_s[r];
        const A prob = x == neg_inf ? A(0) : simt::exp(simt::fmin(x - row_lse, A(0)));
        s_s[at] = prob;
        if (dlogits) {
          const std::int64_t star = star_s[r];
          const A d = delta_s[r], dpv = dp_s[at], value = star_value[r];
          dp_s[at] = star == J.i0 + c ? value : prob * (dpv - d);
        }
      }
      // dk takes the unscaled q (the CPU's); FMA tiles had scale · q for S.
      if (g.dk && !kTensorCores<O>) load_rows(in.q, I, hq, K, q_s, A(1));
      simt::syncthreads();
      if (g.dv)
        gemm_to_shared<O>(row_major(s_s, 0, Bt, nI, nJ).transposed(), row_major(do_s, 0, V, nI, V),
                          nJ, V, nI, dv_s, 0, V, true);
      if (g.dk)
        gemm_to_shared<O>(row_major(dp_s, 0, Bt, nI, nJ).transposed(), row_major(q_s, 0, K, nI, K),
                          nJ, K, nI, dk_s, 0, K, true);
      if (g.db || (g.dg && !diagonal))
        for (int c = tid; c < nJ; c += kThreads) {
          const std::int64_t j = J.i0 + c;
          double sum = 0, slope_sum = 0;
          for (int r = 0; r < nI; ++r) {
            const A v = dp_s[r * Bt + c];
            sum += static_cast<double>(v);
            slope_sum += -static_cast<double>(I.i0 + r - j) * static_cast<double>(v);
          }
          if (g.db) {
            const double db = db_s[c];
            db_s[c] = db + slope_sum;
          }
          if (g.dg && !diagonal) {
            const double off = col_off[c];
            col_off[c] = off + sum;
          }
        }
    }
    // dg's share of query head hq: Σ_{j < s} C_j within the block; the block's Σ C_j.
    if (g.dg && tid == 0) {
      double prefix = 0;
      for (int c = 0; c < nJ; ++c) {
        g.dg_cols[flat(p, J.batch, J.token(c), hq)] = prefix;
        const double off = col_off[c];
        prefix += off;
      }
      g.col_totals[J.slot * p.HQ + hq] = prefix;
    }
  }
  simt::syncthreads();

  if (g.dv)
    store_token_rows<A>(g.out.dv, J.batch, J.token(0), nJ, h, 0, V, V, [&](int r, int c) {
      const A v = dv_s[r * V + c];
      return v;
    });
  if (g.db)
    for (int c = tid; c < nJ; c += kThreads) {
      const double v = db_s[c];
      simt::store(g.out.dbias_k_slope, v, J.batch, J.token(c), h);
    }
  if (!g.dk) return;
  if (!p.theta.defined()) {
    if (g.out.dk.defined())
      store_token_rows<A>(g.out.dk, J.batch, J.token(0), nJ, h, 0, K, K, [&](int r, int c) {
        const A v = dk_s[r * K + c];
        return v * scale;
      });
    return;
  }
  // dk unrotated; dθ = the query heads' shares in head order, then the key's ((R2), (R3)).
  const int R = K / 2;
  for (int e = tid; e < nJ * R; e += kThreads) {
    const int c = e / R, pair = e % R;
    const std::int64_t t = J.token(c);
    const int ia = static_cast<int>(pair_a(p.rotary_layout, p.K, pair)),
              ib = static_cast<int>(pair_b(p.rotary_layout, p.K, pair));
    const A dka = dk_s[c * K + ia], dkb = dk_s[c * K + ib];
    const A dya = dka * scale, dyb = dkb * scale;
    const A ya = simt::load<A>(in.k, J.batch, t, h, ia),
            yb = simt::load<A>(in.k, J.batch, t, h, ib);
    if (g.dtheta) {
      A dtheta = 0;
      for (std::int64_t hq = h * p.group(); hq < (h + 1) * p.group(); ++hq) {
        const A share = g.dtheta_q[flat(p, J.batch, t, hq) * R + pair];
        dtheta = hq == h * p.group() ? share : dtheta + share;
      }
      simt::store(g.out.dtheta, dtheta + (dyb * ya - dya * yb), J.batch, t, h, pair);
    }
    if (g.out.dk.defined()) {
      A cs, sn;
      angle_of(p.theta, J.batch, t, h, pair, cs, sn);
      simt::store(g.out.dk, dya * cs + dyb * sn, J.batch, t, h, ia);
      simt::store(g.out.dk, dyb * cs - dya * sn, J.batch, t, h, ib);
    }
  }
}

// dg_s = dq's share + dkv's share + X_b (the pairs from before block b to after it), X_b summed
// over the earlier blocks of the sequence in a fixed tree (BlockReduce).
PHASOR_GLOBAL void PHASOR_LAUNCH_BOUNDS(kThreads)
    dg_kernel(Problem p, int Bt, simt::Span<double> dg_rows, simt::Span<double> dg_cols,
              simt::Span<double> row_totals, simt::Span<double> col_totals, TensorView dg) {
  using Reduce = simt::BlockReduce<double, kThreads>;
  PHASOR_SHARED_STORAGE(Reduce::TempStorage, storage);
  PHASOR_SHARED_ARRAY(double, span_s, 1);
  Rows b;
  if (!locate_rows(p, Bt, blockIdx.x, b)) return;
  const std::int64_t hq = blockIdx.y, first_slot = b.slot - b.c;
  const int tid = static_cast<int>(threadIdx.x);
  double part = 0;
  for (std::int64_t c = tid; c < b.c; c += kThreads)
    part += col_totals[(first_slot + c) * p.HQ + hq] - row_totals[(first_slot + c + 1) * p.HQ + hq];
  const double total = Reduce(storage).Sum(part);
  if (tid == 0) span_s[0] = total;
  simt::syncthreads();
  const double span = span_s[0];
  for (int r = tid; r < b.len; r += kThreads) {
    const std::int64_t x = flat(p, b.batch, b.token(r), hq);
    simt::store(dg, dg_rows[x] + dg_cols[x] + span, b.batch, b.token(r), hq);
  }
}

// ---- host --------------------------------------------------------------------------------------

void check_limits(const Problem& p) {
  const std::string op = "parallel_forgetting_attn on the GPU";
  if (p.K > kMaxDim)
    throw Error(op + ": argument 'q': expected a head dimension K ≤ " + std::to_string(kMaxDim) +
                ", got K = " + std::to_string(p.K));
  if (p.HQ > kMaxHeads)
    throw Error(op + ": argument 'q': expected at most " + std::to_string(kMaxHeads) +
                " query heads, got HQ = " + std::to_string(p.HQ));
  if (p.V > kMaxDim)
    throw Error(op + ": argument 'v': expected a value dimension V ≤ " + std::to_string(kMaxDim) +
                ", got V = " + std::to_string(p.V));
}

// The tile: block_size (16, 32 or 64; a power of two from 8 to 64 otherwise), halved while the
// layout's shared memory exceeds the budget.
template <class A, class L>
int tile_rows(const Problem& p) {
  int Bt = 64;
  while (Bt > kMinRows && Bt > p.block_size) Bt /= 2;
  const int K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  while (Bt > kMinRows && L(Bt, K, V).template bytes<A>() > kSharedBudget) Bt /= 2;
  return Bt;
}
template <class A>
int backward_rows(const Problem& p) {
  return std::min(tile_rows<A, DqLayout>(p), tile_rows<A, DkvLayout>(p));
}

template <class O>
struct Run {
  using A = Accumulator<O>;
  const Problem& p;
  cuda::Stream stream;
  std::vector<std::unique_ptr<simt::Workspace>> buffers;
  TensorView q, k;  // rotated (workspace) or p.q, p.k

  Run(const Problem& problem, cuda::Stream s) : p(problem), stream(s), q(problem.q), k(problem.k) {
    if (!p.theta.defined()) return;
    q = view({p.B, p.T, p.HQ, p.K});
    k = view({p.B, p.T, p.H, p.K});
    rotate(p.q, q, p.HQ, p.group());
    rotate(p.k, k, p.H, 1);
  }
  template <class T>
  simt::Span<T> span(std::int64_t count) {
    buffers.push_back(
        std::make_unique<simt::Workspace>(static_cast<std::size_t>(count) * sizeof(T), stream));
    return buffers.back()->template span<T>(count);
  }
  // A contiguous workspace view of the compute type.
  TensorView view(std::initializer_list<std::int64_t> sizes) {
    std::int64_t count = 1;
    for (std::int64_t s : sizes) count *= s;
    const simt::Span<A> memory = span<A>(count);
    return TensorView::contiguous(memory.data, dtype_of<A>(), sizes, p.device);
  }
  void rotate(const TensorView& x, const TensorView& out, std::int64_t heads, std::int64_t group) {
    const std::int64_t count = p.B * p.T * heads * (p.K / 2);
    if (count == 0) return;
    constexpr int threads = 256;
    PHASOR_LAUNCH((rotate_kernel<A>), simt::Dim3(static_cast<unsigned>(ceil_div(count, threads))),
                  simt::Dim3(threads), 0, stream, p, x, out, heads, group);
  }
  std::int64_t slots(int Bt) const { return p.sequences.chunk_slot_count(Bt); }
  // The inputs of the kernels with tiles of Bt rows (the gate totals of those blocks computed).
  Inputs inputs(int Bt) {
    Inputs in{p, q, k, span<double>(slots(Bt) * p.HQ), Bt};
    const std::int64_t count = slots(Bt) * p.HQ;
    if (count > 0)
      PHASOR_LAUNCH(totals_kernel, simt::Dim3(static_cast<unsigned>(ceil_div(count, kThreads))),
                    simt::Dim3(kThreads), 0, stream, p, Bt, slots(Bt), in.totals);
    return in;
  }
  simt::Dim3 grid(int Bt, std::int64_t heads) const {
    return simt::Dim3(static_cast<unsigned>(slots(Bt)), static_cast<unsigned>(heads));
  }
  void forward(const TensorView& o, const TensorView& lse) {
    if (p.HQ == 0) return;  // no query head: nothing to write
    const int Bt = tile_rows<A, ForwardLayout>(p);
    const int K = static_cast<int>(p.K), V = static_cast<int>(p.V);
    PHASOR_LAUNCH((forward_kernel<O>), grid(Bt, p.HQ), simt::Dim3(kThreads),
                  ForwardLayout(Bt, K, V).bytes<A>(), stream, inputs(Bt), o, lse);
  }
};

template <class O>
void forward_typed(const Problem& p, const TensorView& o, const TensorView& lse,
                   cuda::Stream stream) {
  Run<O> run(p, stream);
  run.forward(o, lse);
}

template <class O>
void backward_typed(const Problem& p, const TensorView& d_o, const TensorView& o,
                    const TensorView& lse, const ForgettingAttnGrads& grads, cuda::Stream stream) {
  using A = Accumulator<O>;
  Backward<A> g;
  g.out = grads;
  g.dtheta = grads.dtheta.defined();
  g.dq = grads.dq.defined() || g.dtheta;
  g.dk = grads.dk.defined() || g.dtheta;
  g.dv = grads.dv.defined();
  g.dg = grads.dg.defined();
  g.da = grads.dbias_q_slope.defined();
  g.db = grads.dbias_k_slope.defined();
  const bool dlogits = g.dq || g.dk || g.dg || g.da || g.db;
  if (!dlogits && !g.dv) return;
  Run<O> run(p, stream);
  g.d_o = d_o;
  g.o = o;
  g.lse = lse;
  if (!o.defined() || !lse.defined()) {  // recompute both
    g.o = run.view({p.B, p.T, p.HQ, p.V});
    g.lse = run.view({p.B, p.T, p.HQ});
    run.forward(g.o, g.lse);
  }
  const int Bt = backward_rows<A>(p);
  const Inputs in = run.inputs(Bt);
  const std::int64_t tokens = p.B * p.T * p.HQ, blocks = run.slots(Bt) * p.HQ;
  const int K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  if (dlogits) {
    g.delta = run.template span<A>(tokens);
    g.star = run.template span<std::int64_t>(tokens);
    g.star_dlogit = run.template span<A>(tokens);
  }
  if (g.dtheta) g.dtheta_q = run.template span<A>(tokens * (p.K / 2));
  if (g.dg) {
    g.dg_rows = run.template span<double>(tokens);
    g.dg_cols = run.template span<double>(tokens);
    g.row_totals = run.template span<double>(blocks);
    g.col_totals = run.template span<double>(blocks);
  }
  // Without query heads (HQ = 0) only dkv runs: dk, dv, db, dθ are sums over an empty group, 0.
  if (dlogits && p.HQ > 0)
    PHASOR_LAUNCH((dq_kernel<O>), run.grid(Bt, p.HQ), simt::Dim3(kThreads),
                  DqLayout(Bt, K, V).bytes<A>(), stream, in, g);
  if (g.dk || g.dv || g.dg || g.db)
    PHASOR_LAUNCH((dkv_kernel<O>), run.grid(Bt, p.H), simt::Dim3(kThreads),
                  DkvLayout(Bt, K, V).bytes<A>(), stream, in, g);
  if (g.dg && p.HQ > 0)
    PHASOR_LAUNCH(dg_kernel, run.grid(Bt, p.HQ), simt::Dim3(kThreads), 0, stream, p, Bt, g.dg_rows,
                  g.dg_cols, g.row_totals, g.col_totals, grads.dg);
}

}  // namespace

void chunk_forward(const Problem& problem, const TensorView& o, const TensorView& lse) {
  check_limits(problem);
  if (problem.num_items() == 0) return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.theta, &p.slope_q, &p.slope_k})
    *input = stage(*input, {o, lse});
  dispatch_operand(p.q.dtype,
                   [&](auto operand) { forward_typed<decltype(operand)>(p, o, lse, stream); });
}

void chunk_backward(const Problem& problem, const TensorView& d_o, const TensorView& o,
                    const TensorView& lse, const ForgettingAttnGrads& grads) {
  check_limits(problem);
  if (problem.num_items() == 0) return;
  const cuda::Stream stream = cuda::current_stream();
  Staging stage(stream);
  Problem p = problem;
  const std::initializer_list<TensorView> outputs = {
      grads.dq,           grads.dk, grads.dv, grads.dg, grads.dtheta, grads.dbias_q_slope,
      grads.dbias_k_slope};
  for (TensorView* input : {&p.q, &p.k, &p.v, &p.g, &p.theta, &p.slope_q, &p.slope_k})
    *input = stage(*input, outputs);
  const TensorView d_o_in = stage(d_o, outputs), o_in = stage(o, outputs),
                   lse_in = stage(lse, outputs);
  dispatch_operand(p.q.dtype, [&](auto operand) {
    backward_typed<decltype(operand)>(p, d_o_in, o_in, lse_in, grads, stream);
  });
}

}  // namespace phasor::PHASOR_BACKEND::fox
