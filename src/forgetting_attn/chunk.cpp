// Forgetting attention, Impl::chunk: tiled flash-style kernel (fla's parallel_forgetting_attn).
//
// Work item = (sequence, key/value head). The item loads its keys and values once; for each
// query head of its group and each query block I of block_size rows it walks the key blocks J
// that the causal mask, the window and the zero gates leave visible, from the diagonal block
// down, with tiles of block_size × block_size (a run of consecutive key blocks at a time, each
// product one of the run: see kKeysPerRun):
//   forward:  ℓ = (scale Q_I) K_Jᵀ + gate bias; online softmax (running max m, sum l and
//             accumulator A: A ← e^{m_old − m_new} A + e^{ℓ − m_new} V_J); o = A / l,
//             lse = m + log l.
//   backward: P = e^{ℓ − lse}, dP = dO_I V_Jᵀ, dℓ = P ⊙ (dP − D) with D_i = do_i·o_i;
//             dq_I += dℓ K_J, dk_J += dℓᵀ Q_I (both × scale), dv_J += Pᵀ dO_I.
// Memory is O(T) per item (the sequence's keys/values and their gradients, and in the backward
// the segments' sums for earlier keys, see "Segments" below) plus the tiles; never a T × T
// matrix.
//
// Gate bias of the tile (I, J), J before I (i0, j0 the first rows, j1 the end of J):
//   Σ_{s ∈ (j, i]} g_s = Σ_{s ∈ (i0, i]} g_s + Σ_{s ∈ [j1, i0]} g_s + Σ_{s ∈ (j, j1)} g_s,
// three float64 sums of same-signed terms: within I, the gap between the blocks (accumulated
// block by block while walking down from the diagonal), within J. The diagonal tile sums along
// each row. A zero gate (−inf) makes the sum −inf and so masks the pair; once the gap is −inf
// every lower key block is masked and the walk stops.
//
// Numerics of the backward pass in float32:
//  * when a row's softmax is dominated by one key j* (P_ij* > 1/2: with strong gates the diagonal,
//    with large logits any key), dℓ_ij* is not computed as P_ij* (dP_ij* − D_i) — D_i ≈ dP_ij*,
//    a cancellation that loses every digit in float32 when P_ij* ≈ 1 — but as −Σ_{j≠j*} dℓ_ij
//    (a softmax row of dℓ sums to 0), from the accurate other terms; its contributions to dq_i,
//    dk_j* and dg are added once the row is complete.
//  * dg_s = Σ_{(i, j): j < s ≤ i} dℓ_ij, the sum over the pairs whose bias contains g_s ("crossing
//    sums", accumulated in float64), instead of the reverse cumulative sum of dℓ's row minus
//    column sums, which cancels catastrophically (row sums are 0 analytically) and would carry
//    the float32 rounding of the dominant terms along the whole sequence.
//
// Additive GRAPE slopes (optional): the tile adds −(i − j)(a_i + b_j) to each logit, in float64
// together with the gate bias before the one rounding to the compute type (O(1) per logit, like
// the gates; the tiles, the walk and the memory stay as they are). The backward adds
// da_i = −Σ_j (i − j) dℓ_ij and db_j = −Σ_i (i − j) dℓ_ij tile by tile in float64 (the dominant
// key's dℓ_ij* with the rest of its row); db sums over the query heads of the group.
//
// Rotation by θ (optional, common/rotation.h): the item rotates its keys once, right after
// loading them, and each block of queries right after loading it (R1): O(T·K) work next to the
// O(T²·K) of the tiles. The cos/sin are evaluated piece by piece (a query block's, or
// kAngleRows keys at a time), never for the whole sequence at once: they would take as much
// memory as the keys themselves, and evaluating them again for each query head of a group costs
// little (O(T·K) per head). The backward takes dq, dk with respect to the rotated rows exactly
// as without θ, then turns them into dq, dk and dθ (R2, R3): each query block's dq when it is
// complete, with the cos/sin of its rotation, and dk once at the end.

#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/kept_buffers.h"
#include "common/parallel.h"
#include "common/rotation.h"
#include "common/slices.h"
#include "forgetting_attn/kernels.h"
#include "forgetting_attn/probabilities.h"

namespace phasor::detail::fox {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Block-local sums of the gates of one (sequence, query head), in float64.
struct BlockGates {
  std::int64_t block = 1;
  Vec<double> g;
  std::vector<double> from_start;  // Σ_{s ∈ (i0, i]} g_s, i0 the first position of i's block
  std::vector<double> to_end;      // Σ_{s ∈ (j, j1)} g_s, j1 the end of j's block
  std::vector<double> total;       // Σ_{s ∈ block} g_s

  void load(const Problem& p, const Sequence& seq, std::int64_t hq) {
    block = p.block_size;
    load_column(p.g, seq, hq, g);
    const std::int64_t L = g.size();
    from_start.assign(static_cast<std::size_t>(L), 0.0);
    to_end.assign(static_cast<std::size_t>(L), 0.0);
    total.assign(static_cast<std::size_t>((L + block - 1) / block), 0.0);
    for (std::int64_t b0 = 0; b0 < L; b0 += block) {
      const std::int64_t b1 = std::min(L, b0 + block);
      for (std::int64_t i = b0 + 1; i < b1; ++i) from_start[idx(i)] = from_start[idx(i - 1)] + g[i];
      for (std::int64_t j = b1 - 2; j >= b0; --j) to_end[idx(j)] = to_end[idx(j + 1)] + g[j + 1];
      double sum = 0;
      for (std::int64_t s = b0; s < b1; ++s) sum += g[s];
      total[idx(b0 / block)] = sum;
    }
  }
  static std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }
};

// Walks the key blocks visible from the query block starting at i0 (block index bi): the diagonal
// block first, then downwards while any pair can still be visible. Calls
// visit(j0, nJ, gap) with gap = Σ_{s ∈ [j0 + nJ, i0]} g_s (unused for the diagonal block).
template <class F>
void walk_key_blocks(const BlockGates& gates, std::int64_t window, std::int64_t i0, F&& visit) {
  const std::int64_t B = gates.block, L = gates.g.size(), bi = i0 / B;
  const std::int64_t first_visible = window_start(i0, window);  // row i0 sees the oldest keys
  double gap = 0;
  for (std::int64_t bj = bi; bj >= 0; --bj) {
    const std::int64_t j0 = bj * B, nJ = std::min(B, L - j0);
    if (bj < bi) {
      gap = bj == bi - 1 ? gates.g[i0] : gap + gates.total[BlockGates::idx(bj + 1)];
      if (gap == kNegInf) break;               // a zero gate between J and I: all masked
      if (j0 + nJ - 1 < first_visible) break;  // every key of J is outside the window
    }
    visit(j0, nJ, gap);
  }
}

// The additive GRAPE slopes of one (sequence, query head): a of the query head, b of its key
// head, both float64 over the sequence; `on` is false (and a, b unused) when neither is given.
struct Slopes {
  bool on = false;
  Vec<double> a, b;
};

// Adds the gate bias (and slopes, and the causal and window masks) of the tile (query rows i0..,
// key rows j0..j0 + nJ) to its products (scale q_i)·k_j, which `logits` (nI × nJ) holds:
//   ℓ_ij = (scale q_i)·k_j + Σ_{s ∈ (j, i]} g_s − (i − j)(a_i + b_j);
//   −inf where j > i or i − j ≥ window.
template <class S, class Logits>
void add_tile_bias(const BlockGates& gates, const Slopes& slopes, std::int64_t window,
                   std::int64_t i0, std::int64_t j0, std::int64_t nJ, double gap, Logits&& logits) {
  const std::int64_t nI = logits.rows();
  const S neg_inf = -std::numeric_limits<S>::infinity();
  for (std::int64_t r = 0; r < nI; ++r) {
    const std::int64_t i = i0 + r;
    // Columns before first_col are outside the window.
    const std::int64_t first_col = std::clamp<std::int64_t>(window_start(i, window) - j0, 0, nJ);
    for (std::int64_t c = 0; c < first_col; ++c) logits(r, c) = neg_inf;
    if (j0 == i0) {
      // Diagonal tile: the gate sum along the row, from j = i down.
      for (std::int64_t c = r + 1; c < nJ; ++c) logits(r, c) = neg_inf;
      double gate_sum = 0;
      if (slopes.on) {
        for (std::int64_t c = r - 1; c >= first_col; --c) {
          gate_sum += gates.g[j0 + c + 1];
          logits(r, c) +=
              static_cast<S>(gate_sum + slope_bias(i, j0 + c, slopes.a[i], slopes.b[j0 + c]));
        }
      } else {
        for (std::int64_t c = r - 1; c >= first_col; --c) {
          gate_sum += gates.g[j0 + c + 1];
          logits(r, c) += static_cast<S>(gate_sum);
        }
      }
    } else {
      const double row_part = gates.from_start[BlockGates::idx(i)] + gap;
      if (slopes.on) {
        for (std::int64_t c = first_col; c < nJ; ++c)
          logits(r, c) += static_cast<S>(row_part + gates.to_end[BlockGates::idx(j0 + c)] +
                                         slope_bias(i, j0 + c, slopes.a[i], slopes.b[j0 + c]));
      } else {
        for (std::int64_t c = first_col; c < nJ; ++c)
          logits(r, c) += static_cast<S>(row_part + gates.to_end[BlockGates::idx(j0 + c)]);
      }
    }
  }
}

// The tile's probabilities exp(min(logits − offset_r, 0)), row by row (probabilities.h: no
// subnormal numbers, masked (−inf) logits exactly 0). The offset is the row's running max
// (forward) or its lse (backward). Each row's exp runs on contiguous memory so that Eigen
// vectorises it (a column broadcast over a row-major matrix would not be).
template <class Logits, class Offsets, class Out>
void masked_exp(const Logits& logits, const Offsets& row_offset, Out& out) {
  for (Eigen::Index r = 0; r < logits.rows(); ++r)
    probabilities(out.row(r).array(), logits.row(r).array() - row_offset[r]);
}

// A visible key block of a query block: its first key, length and gate gap (walk_key_blocks).
struct KeyBlock {
  std::int64_t j0, nJ;
  double gap;
};

// A tile's storage, whose shape changes from key run to key run without reallocating it: an
// Eigen matrix resized to another size frees its memory and allocates anew, and glibc gave such
// tiles back to the system and faulted them in again, run after run (FoX's chunk backward at
// B = 1, H = 8, T = 1024 in a plain program, 2 threads: 37 ms a call with resizing tiles, 26 ms
// with the malloc trimming that did it turned off).
template <class S>
class TileBuffer {
 public:
  Eigen::Map<Mat<S>> shaped(Eigen::Index rows, Eigen::Index cols) {
    if (storage_.size() < rows * cols) storage_.resize(rows * cols);
    return {storage_.data(), rows, cols};
  }

 private:
  Vec<S> storage_;
};

// Per-thread tiles.
template <class S>
struct Scratch {
  TileBuffer<S> logits, probs, dprobs, dlogits;
  std::vector<KeyBlock> visible;
};

// Both passes take the visible key blocks in runs of up to kKeysPerRun consecutive keys: the
// forward one product (scale Q_I) K_runᵀ and one P V_run per run, the backward its five (ℓ, Pᵀ dO,
// dO V_runᵀ, dℓ K_run, dℓᵀ Q_I), each block of the run biased and masked as a tile of its own.
// Products of 64 × 128 by 128 × 64 spend much of their time packing operands; a run packs the
// query block once and makes the products large enough for Eigen's GEMM to run near its peak
// (the backward alone at B = 1, H = 8, T = 4096, 2 threads: 485–492 ms with 64-key tiles,
// 454–474 ms with runs). The online softmax steps once per run. 256 keys, not more: Eigen packs a
// product's right-hand side into a workspace it puts on the stack up to 128 KiB
// (EIGEN_STACK_ALLOCATION_LIMIT) and on the heap beyond; 1,024 keys × 128 channels (512 KiB) went
// to malloc on every product, which glibc serves with fresh pages unless the program's earlier
// frees raised its mmap threshold — page faults on every call in ordinary programs (ggml_compare,
// T = 1024, one thread: 43k tokens/s with runs of 1,024, 60k with 256; no difference where malloc
// keeps the blocks, as in the benchmark programs).
constexpr std::int64_t kKeysPerRun = 256;

// The key blocks visible from query block i0, in walk order (walk_key_blocks: the diagonal first,
// descending j0, each next one right below, so a run of them is a contiguous key range).
void collect_visible(const BlockGates& gates, std::int64_t window, std::int64_t i0,
                     std::vector<KeyBlock>& visible) {
  visible.clear();
  walk_key_blocks(gates, window, i0, [&](std::int64_t j0, std::int64_t nJ, double gap) {
    visible.push_back({j0, nJ, gap});
  });
}

// A run of visible key blocks, visible[first .. last]: the keys [lo, lo + n).
struct KeyRun {
  std::size_t first, last;
  std::int64_t lo, n;
};

// The run that starts at visible[first]: the following blocks while it spans at most kKeysPerRun
// keys and its keys stay on one side of the key row `boundary`, all ≥ it or all < it (the
// backward adds a segment's own keys' gradients and earlier keys' to different sums).
KeyRun key_run(const std::vector<KeyBlock>& visible, std::size_t first, std::int64_t boundary) {
  const std::int64_t end = visible[first].j0 + visible[first].nJ;
  const bool above = visible[first].j0 >= boundary;
  std::size_t last = first;
  while (last + 1 < visible.size() && end - visible[last + 1].j0 <= kKeysPerRun &&
         (visible[last + 1].j0 >= boundary) == above)
    ++last;
  return {first, last, visible[last].j0, end - visible[last].j0};
}

// The logits of the run (nI × n, in tmp.logits): one product (scale Q_I) K_runᵀ, then each block's
// bias and masks as a tile of its own (add_tile_bias).
template <class S>
Eigen::Map<Mat<S>> run_logits(const Mat<S>& q_scaled, const Mat<S>& k, const BlockGates& gates,
                              const Slopes& slopes, std::int64_t window, std::int64_t i0,
                              const KeyRun& run, Scratch<S>& tmp) {
  auto logits = tmp.logits.shaped(q_scaled.rows(), run.n);
  logits.noalias() = q_scaled * k.middleRows(run.lo, run.n).transpose();
  for (std::size_t b = run.first; b <= run.last; ++b) {
    const KeyBlock& kb = tmp.visible[b];
    add_tile_bias<S>(gates, slopes, window, i0, kb.j0, kb.nJ, kb.gap,
                     logits.middleCols(kb.j0 - run.lo, kb.nJ));
  }
  return logits;
}

// Forward of one query block: o (nI × V) and lse (nI) by the online softmax over the key runs.
template <class S>
void forward_block(const Problem& p, const Mat<S>& k, const Mat<S>& v, const BlockGates& gates,
                   const Slopes& slopes, std::int64_t i0, const Mat<S>& q_scaled, Scratch<S>& tmp,
                   Mat<S>& out, Vec<S>& out_lse) {
  const std::int64_t nI = q_scaled.rows();
  Vec<S> row_max = Vec<S>::Constant(nI, -std::numeric_limits<S>::infinity());
  Vec<S> row_sum = Vec<S>::Zero(nI), rescale(nI);
  out = Mat<S>::Zero(nI, p.V);  // the accumulator A
  collect_visible(gates, p.window, i0, tmp.visible);
  for (std::size_t first = 0; first < tmp.visible.size();) {
    const KeyRun run = key_run(tmp.visible, first, 0);
    const std::int64_t lo = run.lo, n = run.n;
    first = run.last + 1;
    auto logits = run_logits(q_scaled, k, gates, slopes, p.window, i0, run, tmp);
    for (std::int64_t r = 0; r < nI; ++r) {
      const S new_max = std::max(row_max[r], logits.row(r).maxCoeff());
      // The diagonal tile comes first and always holds j = i, so new_max is finite from then on;
      // the guard only protects against a row with nothing visible yet.
      rescale[r] = std::isinf(new_max) ? S(1) : std::exp(row_max[r] - new_max);
      row_max[r] = new_max;
    }
    auto probs = tmp.probs.shaped(nI, n);
    masked_exp(logits, row_max, probs);
    row_sum = rescale.cwiseProduct(row_sum) + probs.rowwise().sum();
    out = rescale.asDiagonal() * out;
    out.noalias() += probs * v.middleRows(lo, n);
  }
  out = row_sum.cwiseInverse().asDiagonal() * out;
  out_lse = row_max.array() + row_sum.array().log();
}

// The rows [i0, i0 + n) of a sequence, as a sequence (for loading and storing one block).
Sequence rows_of(const Sequence& seq, std::int64_t i0, std::int64_t n) {
  return {seq.batch, seq.start + i0, n};
}

// Keys are rotated (and their gradients unrotated) this many rows at a time.
constexpr std::int64_t kAngleRows = 256;

// (R1) on the keys k (the whole sequence) of key head h.
template <class S>
void rotate_keys(const Problem& p, const Sequence& seq, std::int64_t h, Mat<S>& k,
                 PairAngles<S>& angles) {
  for (std::int64_t j0 = 0; j0 < k.rows(); j0 += kAngleRows) {
    const std::int64_t n = std::min(kAngleRows, k.rows() - j0);
    angles.load(p.theta, rows_of(seq, j0, n), h);
    rotate_rows(k.middleRows(j0, n), angles, p.rotary_layout);
  }
}

// The query rows `rows` of query head hq (key head h), rotated by θ (R1) when given, with the
// cos/sin left in `angles` (the backward unrotates the block's dq with them).
template <class S>
void load_query_block(const Problem& p, const Sequence& rows, std::int64_t h, std::int64_t hq,
                      Mat<S>& q, PairAngles<S>& angles) {
  load_rows(p.q, rows, hq, q);
  if (p.theta.defined()) {
    angles.load(p.theta, rows, h);
    rotate_rows(q, angles, p.rotary_layout);
  }
}

// What a work item (sequence, key head) shares among its query heads and query blocks: its keys
// (rotated, with θ) and values, and the key slopes.
template <class S>
struct ItemKeys {
  Mat<S> k, v;
  Slopes slopes;  // b only; a is per query head

  void load(const Problem& p, const Sequence& seq, std::int64_t h, PairAngles<S>& angles) {
    load_rows(p.k, seq, h, k);
    load_rows(p.v, seq, h, v);
    slopes.on = p.has_slopes();
    if (slopes.on) load_slopes(p.slope_k, seq, h, slopes.b);
    if (p.theta.defined()) rotate_keys(p, seq, h, k, angles);
  }

  // The forward keeps an ItemKeys per thread across calls (forward_typed); a long sequence's
  // keys and values (16 MiB at T = 16,384, K = V = 128, float32) are released after use instead
  // (common/kept_buffers.h).
  void release_if_large() { detail::release_if_large(k, v); }
};

// Per-thread buffers of one query block's forward.
template <class S>
struct BlockWork {
  Mat<S> q, out;
  Vec<S> out_lse;
  Scratch<S> tmp;
  PairAngles<S> angles;
};

// The forward of query block i0 of query head hq (key head h): o and lse rows stored. A block's
// result depends on nothing but its inputs, so any schedule of the blocks gives the same bits.
template <class S>
void forward_query_block(const Problem& p, const Sequence& seq, std::int64_t h, std::int64_t hq,
                         std::int64_t i0, const ItemKeys<S>& keys, const BlockGates& gates,
                         const Slopes& slopes, const TensorView& o, const TensorView& lse,
                         BlockWork<S>& w) {
  const Sequence rows = rows_of(seq, i0, std::min(p.block_size, seq.length - i0));
  load_query_block(p, rows, h, hq, w.q, w.angles);
  w.q *= static_cast<S>(p.scale);
  forward_block(p, keys.k, keys.v, gates, slopes, i0, w.q, w.tmp, w.out, w.out_lse);
  store_rows(w.out, o, rows, hq);
  if (lse.defined()) store_column(w.out_lse, lse, rows, hq);
}

// Two schedules, the same blocks: one item per thread while the items keep every thread busy and
// their keys and values fit the cache beside each other; otherwise item after item, its (query
// head, query block) pairs in parallel — a long single sequence (B = H = 1) or a few key heads
// shared by many query heads use every thread, and long sequences share one item's keys and
// values in cache (common/parallel.h's items_overflow_cache). Blocks are handed out from the last
// (the most key blocks to visit) to the first, which balances the causal triangle's uneven work.
template <class S>
void forward_typed(const Problem& p, const TensorView& o, const TensorView& lse) {
  const std::int64_t key_bytes =
      p.sequences.longest() * (p.K + p.V) * static_cast<std::int64_t>(sizeof(S));
  if (split_items(p.num_items()) || items_overflow_cache(key_bytes)) {
    // The calling thread's buffers, kept across calls (see below). Named through references:
    // the blocks' lambda runs on other threads, where the thread_local names would mean theirs.
    thread_local ItemKeys<S> kept_keys;
    thread_local PairAngles<S> kept_angles;
    thread_local std::vector<BlockGates> kept_gates;
    thread_local std::vector<Slopes> kept_slopes;
    ItemKeys<S>& keys = kept_keys;
    PairAngles<S>& angles = kept_angles;
    std::vector<BlockGates>& gates = kept_gates;
    std::vector<Slopes>& slopes = kept_slopes;
    gates.resize(static_cast<std::size_t>(p.group()));
    slopes.resize(gates.size());
    for (std::int64_t item = 0; item < p.num_items(); ++item) {
      const Sequence& seq = p.sequences[static_cast<std::size_t>(item / p.H)];
      const std::int64_t h = item % p.H, G = p.group();
      const std::int64_t blocks = (seq.length + p.block_size - 1) / p.block_size;
      keys.load(p, seq, h, angles);
      for (std::int64_t r = 0; r < G; ++r) {
        gates[static_cast<std::size_t>(r)].load(p, seq, h * G + r);
        Slopes& sl = slopes[static_cast<std::size_t>(r)];
        sl.on = keys.slopes.on;
        if (sl.on) {
          load_slopes(p.slope_q, seq, h * G + r, sl.a);
          sl.b = keys.slopes.b;
        }
      }
      parallel_for(G * blocks, [&](std::int64_t u) {
        const std::int64_t r = u % G, block = blocks - 1 - u / G;
        thread_local BlockWork<S> work;
        forward_query_block(p, seq, h, h * G + r, block * p.block_size, keys,
                            gates[static_cast<std::size_t>(r)], slopes[static_cast<std::size_t>(r)],
                            o, lse, work);
      });
    }
    keys.release_if_large();
    return;
  }
  parallel_for(p.num_items(), [&](std::int64_t item) {
    const Sequence& seq = p.sequences[static_cast<std::size_t>(item / p.H)];
    const std::int64_t h = item % p.H;
    // Kept per thread across calls: an item's keys and values are O(T·K), and blocks of that
    // size allocated afresh each call came back from the kernel as new pages, faulted in on every
    // call (B = 1, H = 8, K = V = 128, T = 1024, one thread: 11% of the call in page faults).
    thread_local ItemKeys<S> keys;
    thread_local BlockWork<S> work;
    thread_local BlockGates gates;
    keys.load(p, seq, h, work.angles);
    Slopes slopes = keys.slopes;
    for (std::int64_t hq = h * p.group(); hq < (h + 1) * p.group(); ++hq) {
      gates.load(p, seq, hq);
      if (slopes.on) load_slopes(p.slope_q, seq, hq, slopes.a);
      for (std::int64_t i0 = 0; i0 < seq.length; i0 += p.block_size)
        forward_query_block(p, seq, h, hq, i0, keys, gates, slopes, o, lse, work);
    }
    keys.release_if_large();
  });
}

// Adds the tile's part of dg_s = Σ_{(i, j): j < s ≤ i} dℓ_ij, the pairs whose bias contains g_s.
// For keys J = [j0, j1) before I (j1 ≤ i0: any run of whole key blocks below the diagonal), with
// column sums C_j and row sums R_i of the tile:
//   s ∈ (j0, j1):  Σ_{j0 ≤ j < s} C_j      (every row of I is ≥ s)
//   s ∈ [j1, i0]:  the tile's total         (added to `spans` as a difference array)
//   s ∈ (i0, i1):  Σ_{s ≤ i < i1} R_i       (every column of J is < s)
// (Dominant entries are zero here; the caller adds them.)
template <class Tile, class RowSums>
void add_gate_grads(const Tile& dlogits, const RowSums& row_sums, std::int64_t i0, std::int64_t j0,
                    Vec<double>& dg, Vec<double>& spans) {
  const std::int64_t nI = dlogits.rows(), nJ = dlogits.cols();
  using S = typename Tile::Scalar;
  const Eigen::Matrix<S, 1, Eigen::Dynamic> col_sums = dlogits.colwise().sum();
  double run = 0, total = 0;
  for (std::int64_t c = 0; c + 1 < nJ; ++c) {
    run += static_cast<double>(col_sums[c]);
    dg[j0 + c + 1] += run;
  }
  for (std::int64_t r = 0; r < nI; ++r) total += static_cast<double>(row_sums[r]);
  spans[j0 + nJ] += total;
  spans[i0 + 1] -= total;
  run = 0;
  for (std::int64_t r = nI - 1; r >= 1; --r) {
    run += static_cast<double>(row_sums[r]);
    dg[i0 + r] += run;
  }
}

// The same for the diagonal tile (keys and queries from i0): for each row, the running sum of its
// entries left of the diagonal. (Dominant entries are zero here; the caller adds them.)
template <class Tile>
void add_diagonal_gate_grads(const Tile& dlogits, std::int64_t i0, Vec<double>& dg) {
  for (std::int64_t r = 1; r < dlogits.rows(); ++r) {
    double run = 0;
    for (std::int64_t c = 0; c < r; ++c) {
      run += static_cast<double>(dlogits(r, c));
      dg[i0 + c + 1] += run;
    }
  }
}

// Adds the tile's part of the slope gradients: ℓ_ij contains −(i − j)(a_i + b_j), so
// da_i += −(i − j) dℓ_ij and db_j += −(i − j) dℓ_ij, in float64. (Dominant entries are zero here;
// the caller adds them.)
template <class Tile>
void add_slope_grads(const Tile& dlogits, std::int64_t i0, std::int64_t j0, Vec<double>& da,
                     Vec<double>& db) {
  for (Eigen::Index r = 0; r < dlogits.rows(); ++r) {
    double row = 0;
    for (Eigen::Index c = 0; c < dlogits.cols(); ++c) {
      const double d = -static_cast<double>(i0 + r - (j0 + c)) * static_cast<double>(dlogits(r, c));
      row += d;
      db[j0 + c] += d;
    }
    da[i0 + r] += row;
  }
}

// ---- backward --------------------------------------------------------------------------------
//
// Segments. An item's query blocks are cut into segments of consecutive blocks with about the
// same number of tiles (the causal triangle's later blocks visit more key blocks), at most
// kMaxSegments of at least kBlocksPerSegment blocks each; the cut depends on the sequence length,
// the block size and the window only. A segment walks its query blocks as a whole item did and
// completes their dq, da, dθ rows and the query side of dg. What its tiles add to the keys of its
// own rows goes straight into the item's dk and dv; what they add to earlier keys (and to db and
// dg) goes into sums of its own, added in segment order once every segment is done. One thread
// walks the segments one after another; with fewer items than threads (a long single sequence)
// the segments run in parallel. The sums are the same either way, so the results do not depend
// on the thread count.
constexpr std::int64_t kMaxSegments = 4, kBlocksPerSegment = 8;

// The first row of each segment, then L.
std::vector<std::int64_t> segment_starts(std::int64_t L, std::int64_t block, std::int64_t window) {
  const std::int64_t blocks = (L + block - 1) / block;
  const std::int64_t n = std::clamp<std::int64_t>(blocks / kBlocksPerSegment, 1, kMaxSegments);
  // tiles[b]: the tiles of query blocks 0 .. b − 1 (causal and window masks; gates ignored).
  std::vector<std::int64_t> tiles(static_cast<std::size_t>(blocks + 1), 0);
  for (std::int64_t b = 0; b < blocks; ++b)
    tiles[static_cast<std::size_t>(b + 1)] =
        tiles[static_cast<std::size_t>(b)] + b - window_start(b * block, window) / block + 1;
  std::vector<std::int64_t> starts{0};
  for (std::int64_t s = 1; s < n; ++s) {
    const std::int64_t target = tiles.back() * s / n;
    auto b = static_cast<std::int64_t>(std::lower_bound(tiles.begin(), tiles.end(), target) -
                                       tiles.begin());
    b = std::clamp(b, starts.back() / block + 1, blocks - (n - s));
    starts.push_back(b * block);
  }
  starts.push_back(L);
  return starts;
}

// Which gradients a call wants.
struct Wanted {
  bool dq, dk, dv, dg, da, db, dtheta;
  bool dslopes() const { return da || db; }
  bool dlogits() const { return dq || dk || dg || dslopes(); }
};

// Per-thread buffers of one query block's backward.
template <class S>
struct QueryBlockWork {
  Mat<S> q, q_scaled, dout, out, dq;
  Vec<S> block_lse, other_sums, row_sums;
  std::vector<std::int64_t> dominant;
  Scratch<S> tmp;
  PairAngles<S> angles;
};

// What the backward of an item (sequence, key head) keeps while its query heads and segments run.
// The O(L·K) buffers are released after an item above kKeptBytes, as the forward's keys are.
template <class S>
struct ItemBackward {
  ItemKeys<S> keys;  // with θ, rotated: dk, dq are first taken with respect to the rotated rows
  PairAngles<S> angles;   // θ of key head h, for a piece of the sequence
  BlockGates gates;       // of the current query head
  Slopes slopes;          // b of key head h; a of the current query head
  Vec<S> row_lse, delta;  // lse_i and D_i = do_i·o_i of the current query head
  // dθ of key head h: the group's q contributions and the k contribution (also accumulated,
  // unused, when only dq or dk is requested: (R2) and (R3) come together).
  Mat<S> dtheta, dk, dv;
  Vec<double> da, dg_out;            // da of the current query head
  std::vector<std::int64_t> starts;  // segment_starts
  // Per segment s: dk, dv of the keys before it (rows [0, starts[s])), db of key head h (summed
  // over the group), and dg's terms and span differences (add_gate_grads) of the query head.
  std::vector<Mat<S>> part_dk, part_dv;
  std::vector<Vec<double>> part_db, part_dg, part_spans;

  void release_if_large() {
    detail::release_if_large(keys.k, keys.v, dtheta, dk, dv, part_dk, part_dv);
  }
};

// Pass 1 of query block i0: lse and D for its rows (o and lse from the forward, or recomputed).
template <class S>
void backward_row_terms(const Problem& p, const TensorView& d_o, const TensorView& o,
                        const TensorView& lse, const Sequence& seq, std::int64_t h, std::int64_t hq,
                        std::int64_t i0, ItemBackward<S>& item, QueryBlockWork<S>& w) {
  const std::int64_t nI = std::min(p.block_size, seq.length - i0);
  const Sequence rows = rows_of(seq, i0, nI);
  load_rows(d_o, rows, hq, w.dout);
  if (o.defined() && lse.defined()) {
    load_rows(o, rows, hq, w.out);
    load_column(lse, rows, hq, w.block_lse);
  } else {
    load_query_block(p, rows, h, hq, w.q_scaled, w.angles);
    w.q_scaled *= static_cast<S>(p.scale);
    forward_block(p, item.keys.k, item.keys.v, item.gates, item.slopes, i0, w.q_scaled, w.tmp,
                  w.out, w.block_lse);
  }
  item.row_lse.segment(i0, nI) = w.block_lse;
  item.delta.segment(i0, nI) = w.dout.cwiseProduct(w.out).rowwise().sum();
}

// Pass 2 of segment s of query head hq: the tiles again, now with the gradients.
template <class S>
void backward_segment(const Problem& p, const Wanted& want, const TensorView& d_o,
                      const ForgettingAttnGrads& grads, const Sequence& seq, std::int64_t h,
                      std::int64_t hq, std::size_t s, ItemBackward<S>& item, QueryBlockWork<S>& w) {
  const std::int64_t first = item.starts[s], end = item.starts[s + 1], B = p.block_size;
  const Mat<S>&k = item.keys.k, &v = item.keys.v;
  // Keys of the segment's own rows take their sums in the item's dk, dv; earlier ones in its own.
  auto key_rows = [&](Mat<S>& own, Mat<S>& part, std::int64_t j0, std::int64_t n) {
    return j0 >= first ? own.middleRows(j0, n) : part.middleRows(j0, n);
  };
  Mat<S>&part_dk = item.part_dk[s], &part_dv = item.part_dv[s];
  Vec<double>&part_db = item.part_db[s], &part_dg = item.part_dg[s],
  &part_spans = item.part_spans[s];
  Scratch<S>& tmp = w.tmp;
  for (std::int64_t i0 = first; i0 < end; i0 += B) {
    const std::int64_t nI = std::min(B, end - i0);
    const Sequence rows = rows_of(seq, i0, nI);
    load_query_block(p, rows, h, hq, w.q, w.angles);  // w.angles also unrotate dq below
    w.q_scaled = w.q * static_cast<S>(p.scale);
    load_rows(d_o, rows, hq, w.dout);
    const Vec<S> lse_rows = item.row_lse.segment(i0, nI), delta_rows = item.delta.segment(i0, nI);
    w.dq.setZero(want.dq ? nI : 0, p.K);
    w.other_sums.setZero(nI);               // Σ_{j≠j*} dℓ_ij
    if (p.dlogit_sums_elsewhere.defined())  // the keys of the rows outside this call
      load_column(p.dlogit_sums_elsewhere, rows, hq, w.other_sums);
    w.dominant.assign(static_cast<std::size_t>(nI), -1);  // j* of each row, or −1
    // The visible key blocks in runs of consecutive keys, as in the forward (kKeysPerRun): each
    // of the run's five products (logits, Pᵀ dO, dO Vᵀ, dℓ K, dℓᵀ Q) is one product of the run.
    collect_visible(item.gates, p.window, i0, tmp.visible);
    for (std::size_t first_block = 0; first_block < tmp.visible.size();) {
      const KeyRun run = key_run(tmp.visible, first_block, first);
      const std::int64_t lo = run.lo, n = run.n;
      first_block = run.last + 1;
      auto logits = run_logits(w.q_scaled, k, item.gates, item.slopes, p.window, i0, run, tmp);
      auto probs = tmp.probs.shaped(nI, n);
      masked_exp(logits, lse_rows, probs);
      if (want.dv) key_rows(item.dv, part_dv, lo, n).noalias() += probs.transpose() * w.dout;
      if (!want.dlogits()) continue;
      auto dprobs = tmp.dprobs.shaped(nI, n), dlogits = tmp.dlogits.shaped(nI, n);
      dprobs.noalias() = w.dout * v.middleRows(lo, n).transpose();
      for (std::int64_t r = 0; r < nI; ++r)
        dlogits.row(r).array() = probs.row(r).array() * (dprobs.row(r).array() - delta_rows[r]);
      // A dominant key's dℓ is left out here and added below as −(the rest of its row).
      for (std::int64_t r = 0; r < nI; ++r) {
        Eigen::Index c;
        if (w.dominant[static_cast<std::size_t>(r)] < 0 && probs.row(r).maxCoeff(&c) > S(0.5)) {
          w.dominant[static_cast<std::size_t>(r)] = lo + c;
          dlogits(r, c) = 0;
        }
      }
      if (want.dq) w.dq.noalias() += dlogits * k.middleRows(lo, n);
      if (want.dk) key_rows(item.dk, part_dk, lo, n).noalias() += dlogits.transpose() * w.q;
      if (want.dslopes()) add_slope_grads(dlogits, i0, lo, item.da, part_db);
      // dg: the diagonal block (the run's last columns, when the run holds it) on its own, the
      // keys below it as one tile.
      const std::int64_t below = std::min(n, i0 - lo);  // columns of keys before i0
      if (below < n && want.dg) add_diagonal_gate_grads(dlogits.rightCols(n - below), i0, part_dg);
      if (below > 0) {
        w.row_sums = dlogits.leftCols(below).rowwise().sum();
        w.other_sums += w.row_sums;
        if (want.dg)
          add_gate_grads(dlogits.leftCols(below), w.row_sums, i0, lo, part_dg, part_spans);
      }
      if (below < n) w.other_sums += dlogits.rightCols(n - below).rowwise().sum();
    }
    // dℓ_ij* = −Σ_{j≠j*} dℓ_ij: dq_i += dℓ_ij* k_j*, dk_j* += dℓ_ij* q_i, and g_s for
    // s ∈ (j*, i] gets dℓ_ij* (a range of the difference array).
    for (std::int64_t r = 0; r < nI && want.dlogits(); ++r) {
      const std::int64_t j_star = w.dominant[static_cast<std::size_t>(r)];
      if (j_star < 0) continue;
      const S dlogit = -w.other_sums[r];
      if (want.dq) w.dq.row(r) += dlogit * k.row(j_star);
      if (want.dk) key_rows(item.dk, part_dk, j_star, 1) += dlogit * w.q.row(r);
      if (want.dg && j_star < i0 + r) {
        part_spans[j_star + 1] += static_cast<double>(dlogit);
        part_spans[i0 + r + 1] -= static_cast<double>(dlogit);
      }
      if (want.dslopes()) {
        const double d = -static_cast<double>(i0 + r - j_star) * static_cast<double>(dlogit);
        item.da[i0 + r] += d;
        part_db[j_star] += d;
      }
    }
    if (want.dq) {
      w.dq *= static_cast<S>(p.scale);
      if (p.theta.defined())
        unrotate_gradient_rows(w.dq, w.q, w.angles, p.rotary_layout,
                               item.dtheta.middleRows(i0, nI));
      if (grads.dq.defined()) store_rows(w.dq, grads.dq, rows, hq);
    }
  }
}

// The backward of item (sequence, key head): its query heads one after another, each in two
// passes over its query blocks (pass 1 by block, pass 2 by segment, both through parallel_for,
// which runs them in parallel when called outside the pool and inline within an item of it).
template <class S>
void backward_item(const Problem& p, const Wanted& want, const TensorView& d_o, const TensorView& o,
                   const TensorView& lse, const ForgettingAttnGrads& grads, std::int64_t index,
                   ItemBackward<S>& item) {
  const Sequence& seq = p.sequences[static_cast<std::size_t>(index / p.H)];
  const std::int64_t h = index % p.H, L = seq.length, B = p.block_size;
  item.keys.load(p, seq, h, item.angles);
  item.slopes = item.keys.slopes;
  item.starts = segment_starts(L, B, p.window);
  const std::size_t segments = item.starts.size() - 1;
  item.part_dk.resize(segments);
  item.part_dv.resize(segments);
  item.part_db.resize(segments);
  item.part_dg.resize(segments);
  item.part_spans.resize(segments);
  for (std::size_t s = 0; s < segments; ++s) {
    item.part_dk[s].setZero(want.dk ? item.starts[s] : 0, p.K);
    item.part_dv[s].setZero(want.dv ? item.starts[s] : 0, p.V);
    item.part_db[s].setZero(want.dslopes() ? L : 0);
  }
  item.dtheta.setZero(p.theta.defined() ? L : 0, p.K / 2);
  item.dk.setZero(want.dk ? L : 0, p.K);
  item.dv.setZero(want.dv ? L : 0, p.V);
  item.row_lse.resize(L);
  item.delta.resize(L);
  for (std::int64_t hq = h * p.group(); hq < (h + 1) * p.group(); ++hq) {
    item.gates.load(p, seq, hq);
    if (item.slopes.on) load_slopes(p.slope_q, seq, hq, item.slopes.a);
    item.da.setZero(want.dslopes() ? L : 0);
    parallel_for((L + B - 1) / B, [&](std::int64_t block) {
      thread_local QueryBlockWork<S> work;
      backward_row_terms(p, d_o, o, lse, seq, h, hq, block * B, item, work);
    });
    for (std::size_t s = 0; s < segments; ++s) {
      item.part_dg[s].setZero(want.dg ? L : 0);
      item.part_spans[s].setZero(want.dg ? L + 1 : 0);
    }
    parallel_for(static_cast<std::int64_t>(segments), [&](std::int64_t s) {
      thread_local QueryBlockWork<S> work;
      backward_segment(p, want, d_o, grads, seq, h, hq, static_cast<std::size_t>(s), item, work);
    });
    if (want.dg) {
      // dg_s = the terms at s plus the running sum of the span differences, each summed over
      // the segments in order.
      item.dg_out.resize(L);
      double span_sum = 0;
      for (std::int64_t t = 0; t < L; ++t) {
        double term = 0;
        for (std::size_t s = 0; s < segments; ++s) {
          span_sum += item.part_spans[s][t];
          term += item.part_dg[s][t];
        }
        item.dg_out[t] = term + span_sum;
      }
      store_column(item.dg_out, grads.dg, seq, hq);
    }
    if (want.da) store_column(item.da, grads.dbias_q_slope, seq, hq);
  }
  // The segments' sums of earlier keys, in segment order.
  for (std::size_t s = 1; s < segments; ++s) {
    if (want.dk) item.dk.topRows(item.starts[s]) += item.part_dk[s];
    if (want.dv) item.dv.topRows(item.starts[s]) += item.part_dv[s];
    if (want.dslopes()) item.part_db[0] += item.part_db[s];
  }
  if (want.db) store_column(item.part_db[0], grads.dbias_k_slope, seq, h);
  if (want.dk) {
    item.dk *= static_cast<S>(p.scale);
    if (p.theta.defined())
      for (std::int64_t j0 = 0; j0 < L; j0 += kAngleRows) {
        const std::int64_t n = std::min(kAngleRows, L - j0);
        item.angles.load(p.theta, rows_of(seq, j0, n), h);
        unrotate_gradient_rows(item.dk.middleRows(j0, n), item.keys.k.middleRows(j0, n),
                               item.angles, p.rotary_layout, item.dtheta.middleRows(j0, n));
      }
    if (want.dtheta) store_rows(item.dtheta, grads.dtheta, seq, h);
    if (grads.dk.defined()) store_rows(item.dk, grads.dk, seq, h);
  }
  if (want.dv) store_rows(item.dv, grads.dv, seq, h);
}

template <class S>
void backward_typed(const Problem& p, const TensorView& d_o, const TensorView& o,
                    const TensorView& lse, const ForgettingAttnGrads& grads) {
  // dθ is made of the gradients with respect to the rotated q and k: it needs both.
  Wanted want{};
  want.dtheta = grads.dtheta.defined();
  want.dq = grads.dq.defined() || want.dtheta;
  want.dk = grads.dk.defined() || want.dtheta;
  want.dv = grads.dv.defined();
  want.dg = grads.dg.defined();
  want.da = grads.dbias_q_slope.defined();
  want.db = grads.dbias_k_slope.defined();
  if (!want.dlogits() && !want.dv) return;
  if (split_items(p.num_items())) {
    // Item after item on the calling thread, each one's blocks and segments in parallel. Its
    // buffers are the calling thread's, named through a reference (see forward_typed).
    thread_local ItemBackward<S> kept;
    ItemBackward<S>& item = kept;
    for (std::int64_t index = 0; index < p.num_items(); ++index)
      backward_item(p, want, d_o, o, lse, grads, index, item);
    item.release_if_large();
    return;
  }
  // Kept per thread across calls, like the forward's (an item runs start to finish on one
  // thread): O(L·K) buffers allocated afresh each call come back as new pages. Large ones (the
  // segments' sums, ~13 MiB at T = 4096) are released only after a run of consecutive items, one
  // run per thread: released after every item, each next item faulted them back in and zeroed
  // them (~17% of a forward + backward in a fresh process, perf). Which items share a run depends
  // on the thread count; each item's arithmetic does not (its buffers are set before use).
  parallel_for_runs(p.num_items(), [&](std::int64_t begin, std::int64_t end) {
    thread_local ItemBackward<S> item;
    for (std::int64_t index = begin; index < end; ++index)
      backward_item(p, want, d_o, o, lse, grads, index, item);
    item.release_if_large();
  });
}

}  // namespace

void chunk_forward(const Problem& p, const TensorView& o, const TensorView& lse) {
  dispatch_float(p.q, [&](auto s) { forward_typed<decltype(s)>(p, o, lse); });
}

void chunk_backward(const Problem& p, const TensorView& d_o, const TensorView& o,
                    const TensorView& lse, const ForgettingAttnGrads& grads) {
  dispatch_float(p.q, [&](auto s) { backward_typed<decltype(s)>(p, d_o, o, lse, grads); });
}

}  // namespace phasor::detail::fox
