// Gated DeltaNet, chunked (fla's chunk_gated_delta_rule): the WY / UT-transform form of a chunk of
// L ≤ C tokens, built on dense matrix products.
//
// Derivation. Write u_t = β_t (v_t − a_t S_{t−1}ᵀ k_t), so that S_t = a_t S_{t−1} + k_t u_tᵀ.
// Inside a chunk entered with state S, with γ_i = exp(Σ_{s≤i} g_s) and
// Γ_ij = exp(Σ_{s∈(j,i]} g_s) (i ≥ j; Γ_ii = 1):
//   a_t S_{t−1} = γ_t S + Σ_{j<t} Γ_tj k_j u_jᵀ
//   ⇒ u_t + β_t Σ_{j<t} Γ_tj (k_tᵀk_j) u_j = β_t v_t − β_t γ_t Sᵀ k_t,
// i.e., with the unit lower triangular
//   M = I + diag(β) · strictly_lower(K Kᵀ ⊙ Γ)                                               (1)
// and T = M⁻¹ (applied by triangular solves, never formed):
//   U_new = T (diag(β) V − diag(βγ) K S)  [= U − W S, U = T diag(β) V, W = T diag(βγ) K],     (2)
//   O = diag(γ) Q̃ S + lower_incl(Q̃ Kᵀ ⊙ Γ) U_new,                                          (3)
//   S_next = γ_{L−1} S + (diag(E) K)ᵀ U_new,     E_j = exp(Σ_{s∈(j,L−1]} g_s).             (4)
// Applying T to the V columns of diag(β) V − diag(βγ) K S, rather than forming U and W (V + K
// columns) and then W S, is the same product regrouped and saves the K-column half of the solve
// (and of its adjoint). K S is formed by the same product in the forward and in the backward's
// replay (solve_u_new), so a state the forward keeps for the backward (chunk_states) has the bits
// the replay would give it; one product [K; Q̃] S for both halves ran no faster (K = V = 128) and
// rounds K S differently at small sizes, where Eigen evaluates it coefficient by coefficient.
//
// Stability: g is a scalar per token, so every decay factor is built elementwise as exp of a sum
// accumulated from a nearby token (γ from the chunk start, E from the chunk end, Γ_ij from i back
// to j) — never a difference of cumulative sums — hence every factor is in [0, 1], zero gates
// (g = −inf) give exact zeros and sums never span more than one chunk.
//
// Inputs are loaded one chunk at a time; K Kᵀ, Q̃ Kᵀ and [K; Q̃] are formed once per chunk for
// all the value heads of a q/k head. With θ, the chunk's q and k are rotated once as they are
// loaded (load_qk, kernels.h), so K, Q̃ above are the rotated ones and (1)–(4) are unchanged;
// the backward unrotates each chunk's dQ̃, dK with the angles it loaded (store_qk_grads) and
// writes dθ.
//
// Backward: the forward is replayed keeping the state at every chunk boundary (O(T/C · K · V) per
// value head) — unless the forward kept them (chunk_states), which saves the replay's solve and
// its two K × V products per token; chunks are then walked in reverse carrying dS = ∂L/∂S_next,
// each chunk's M and U_new are recomputed and every dense operation of (1)–(4) is differentiated in
// reverse order. The adjoint of the solve M U_new = R is Mᵀ Y = dU_new (a second triangular solve):
// dR = Y and dM = −Y U_newᵀ on the strictly lower part. Given v_new as well (the forward's U_new,
// kept beside its states), the walk back reads U_new instead of solving for it — its K S product
// and its first solve, 2KV + LV of its 14KV + 5LV + 6LK flops per token — and never
// needs K S: the terms of dβ and dγ that read it take (K S)_i · Y_i = k_i · (Y Sᵀ)_i, Y Sᵀ being
// a product the walk back forms anyway (for dK).

#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "common/kept_buffers.h"
#include "common/parallel.h"
#include "gated_delta_rule/kernels.h"

namespace phasor::detail::gdn {
namespace {

using Eigen::Lower;
using Eigen::UnitLower;
using Eigen::UnitUpper;

// Eigen's triangular products and solvers take a reference to each operand's first element, which
// an empty matrix (K = 0 or V = 0: no key or value columns) does not have. These do the same work
// without touching an empty operand: a product with one adds nothing or is zero, a system with no
// right-hand-side columns has nothing to solve.
template <class Dst, class Tri, class Rhs>
void add_triangular_product(Dst& dst, const Tri& tri, const Rhs& rhs) {
  if (tri.rows() > 0 && rhs.size() > 0) dst.noalias() += tri * rhs;
}
template <class Tri, class A, class B>
void assign_product(Tri&& triangle, const A& a, const B& b) {
  if (a.size() > 0 && b.size() > 0)
    triangle = a * b;
  else
    triangle.setZero();
}
template <class Tri, class X>
void solve_in_place(const Tri& triangle, X& x) {
  if (x.size() > 0) triangle.solveInPlace(x);
}

// What one chunk shares among the value heads of a q/k head: [K; Q̃] (2L × K) and the lower
// triangles of K Kᵀ and Q̃ Kᵀ (the rest of those is never read).
template <class S>
struct ChunkGram {
  Mat<S> kq, kk, qk;

  void compute(const QKInputs<S>& in) {
    const Eigen::Index L = in.k.rows(), K = in.k.cols();
    kq.resize(2 * L, K);
    kq.topRows(L) = in.k;
    kq.bottomRows(L) = in.q;
    kk.resize(L, L);
    qk.resize(L, L);
    assign_product(kk.template triangularView<Lower>(), in.k, in.k.transpose());
    assign_product(qk.template triangularView<Lower>(), in.q, in.k.transpose());
  }
};

// The quantities of one chunk of one value head, recomputed from its inputs. Buffers are reused
// across chunks (resized only when the chunk length changes, i.e. for the last chunk).
template <class S>
struct ChunkState {
  std::int64_t L = 0;
  Vec<S> gamma;   // γ_i
  Vec<S> tail;    // E_j
  Mat<S> pair;    // Γ_ij, lower triangle including the diagonal
  Mat<S> m;       // strictly lower part of M (its unit diagonal is implicit)
  Mat<S> attn;    // Q̃ Kᵀ ⊙ Γ, lower triangle including the diagonal
  Mat<S> k_tail;  // diag(E) K

  // Decay factors of the chunk from its gates g (see the stability note above).
  void compute_gates(const Vec<S>& g) {
    gamma.resize(L);
    tail.resize(L);
    pair.resize(L, L);
    S acc = 0;
    for (std::int64_t i = 0; i < L; ++i) {
      acc += g(i);
      gamma(i) = std::exp(acc);
    }
    acc = 0;
    for (std::int64_t j = L - 1; j >= 0; --j) {
      tail(j) = std::exp(acc);
      acc += g(j);
    }
    for (std::int64_t i = 0; i < L; ++i) {
      pair(i, i) = S(1);
      acc = 0;
      for (std::int64_t j = i - 1; j >= 0; --j) {
        acc += g(j + 1);  // Σ_{s∈(j,i]} g_s, grown one token at a time away from i
        pair(i, j) = std::exp(acc);
      }
    }
  }

  // Everything of the chunk that does not depend on the entering state: the gates, M of eq. (1)
  // and the gated intra-chunk attention matrix of eq. (3).
  void prepare(const ChunkGram<S>& gram, const ValueInputs<S>& in) {
    L = in.g.size();
    compute_gates(in.g);
    m.setZero(L, L);  // only the strictly lower part is read (by the unit-triangular solves)
    attn.resize(L, L);
    for (std::int64_t i = 0; i < L; ++i) {
      for (std::int64_t j = 0; j < i; ++j) m(i, j) = in.beta(i) * gram.kk(i, j) * pair(i, j);
      for (std::int64_t j = 0; j <= i; ++j) attn(i, j) = gram.qk(i, j) * pair(i, j);
    }
  }
};

// ---- The forward, value tile by value tile --------------------------------------------------
// Columns of the state (and of v, U_new, O) never mix in (2)–(4): the forward runs them in value
// tiles, each with its own K × width state — all V columns in one tile when the problem has
// kFewValueHeads (sequence, value head) pairs or more, tiles of kValueTile columns when it has
// fewer (then the tiles are what runs in parallel). The tiling depends on the problem alone and
// every tile runs the same code whichever schedule calls it, so the two schedules below give
// bit-identical results and the choice between them (by thread count) never shows:
//  * by item: one (sequence, q/k head) item per thread, chunk by chunk, every value head and tile
//    of the chunk in turn; used when the items alone keep every thread busy.
//  * by tile: for few items (B = H = 1 at T = 65,536), a window of chunks at a time: first every
//    chunk's state-independent part (K Kᵀ, Q̃ Kᵀ, the gates, M, diag(E) K) in parallel over
//    chunks, then the recurrence in parallel over (item, value head, tile).
constexpr std::int64_t kValueTile = 64, kFewValueHeads = 8;

struct ValueTile {
  std::int64_t first, width;
};
// Columns per value tile: splitting the products costs a few per cent (operands packed once per
// tile), worth it only when the tiles are needed for parallelism.
inline std::int64_t value_tile_width(const Problem& p) {
  const bool few = p.num_items() * p.group < kFewValueHeads;
  return std::max<std::int64_t>(1, few ? std::min(kValueTile, p.V) : p.V);
}
inline std::int64_t num_value_tiles(const Problem& p) {
  const std::int64_t width = value_tile_width(p);
  return std::max<std::int64_t>(1, (p.V + width - 1) / width);
}
inline ValueTile value_tile(const Problem& p, std::int64_t i) {
  const std::int64_t width = value_tile_width(p);
  return {i * width, std::min(width, p.V - i * width)};
}
// Columns [first, first + width) of x's last dimension: the same tensor, narrowed.
inline TensorView value_columns(const TensorView& x, const ValueTile& tile) {
  TensorView t = x;
  if (!t.defined()) return t;
  const int last = x.rank - 1;
  t.data = static_cast<unsigned char*>(x.data) +
           tile.first * x.stride(last) * static_cast<std::int64_t>(element_size(x.dtype));
  t.sizes[static_cast<std::size_t>(last)] = tile.width;
  return t;
}

// One chunk's state-independent part for one value head: ChunkState's gates, M and the gated
// attention (prepare) and diag(E) K.
template <class S>
void prepare_chunk(const Problem& p, const Sequence& block, std::int64_t hv, const QKInputs<S>& qk,
                   const ChunkGram<S>& gram, ValueInputs<S>& in, ChunkState<S>& chunk) {
  load_column(p.g, block, hv, in.g);
  load_column(p.beta, block, hv, in.beta);
  chunk.prepare(gram, in);
  chunk.k_tail = chunk.tail.asDiagonal() * qk.k;
}

// Buffers of one value tile's step.
template <class S>
struct TileWork {
  Mat<S> v, ks, u_new, out;
};

// Where a chunk lies in its sequence, for the products the forward and backward may skip as exact
// zeros (fla's kernels drop them the same way, USE_INITIAL_STATE / STORE_FINAL_STATE): the state
// entering the first chunk is zero without an initial state, the state after the last is needed
// only for a final state, and the gradient entering the last chunk's walk back is zero without
// d_final_state, the one leaving the first needed only for dh0. A sequence of one chunk (the task
// harness's T = 64 at C = 64) needs none of the state products. The values are those of the full
// computation: only products of a zero matrix, and sums into nothing that is read, are left out.
struct ChunkPlace {
  bool state_zero;      // S entering the chunk is zero
  bool next_needed;     // S after the chunk is read (forward: a later chunk or final_state)
  bool ds_zero;         // ∂L/∂S after the chunk is zero (backward)
  bool ds_prev_needed;  // ∂L/∂S entering the chunk is read (backward: an earlier chunk or dh0)

  // Chunk c of num_chunks in the forward; the backward's fields ask for everything.
  static ChunkPlace forward(const Problem& p, std::int64_t c, std::int64_t num_chunks,
                            const TensorView& final_state) {
    return {first_without_initial_state(p, c), c + 1 < num_chunks || final_state.defined(), false,
            true};
  }
  // Chunk c of num_chunks in the backward; the forward's field asks for everything.
  static ChunkPlace backward(const Problem& p, std::int64_t c, std::int64_t num_chunks,
                             const TensorView& d_final_state, const TensorView& dh0) {
    return {first_without_initial_state(p, c), true,
            c + 1 == num_chunks && !d_final_state.defined(), c > 0 || dh0.defined()};
  }

 private:
  static bool first_without_initial_state(const Problem& p, std::int64_t c) {
    return c == 0 && !p.initial_state.defined();
  }
};

// Eqs. (2)–(4) for the value columns of `tile` of one chunk and value head: O's columns stored
// (and U_new's, into v_new when given), the tile's state advanced. Expects prepare_chunk.
template <class S>
void forward_tile(const Problem& p, const Sequence& block, std::int64_t hv, const ValueTile& tile,
                  const ChunkGram<S>& gram, const ChunkState<S>& chunk, const Vec<S>& beta,
                  const TensorView& o, const TensorView& v_new, Mat<S>& state, TileWork<S>& w,
                  const ChunkPlace& place) {
  const std::int64_t L = chunk.L;
  load_rows(value_columns(p.v, tile), block, hv, w.v);
  if (place.state_zero) {  // K S = Q̃ S = 0
    w.u_new = beta.asDiagonal() * w.v;
    w.out.setZero(L, w.v.cols());
  } else {
    // K S as the backward's solve_u_new forms it (the same product, so the same bits: the
    // states a forward keeps for the backward are those its replay would compute), then Q̃ S.
    w.ks.noalias() = gram.kq.topRows(L) * state;
    w.u_new = beta.asDiagonal() * (w.v - chunk.gamma.asDiagonal() * w.ks);
    w.out.noalias() = gram.kq.bottomRows(L) * state;
    w.out = chunk.gamma.asDiagonal() * w.out;
  }
  solve_in_place(chunk.m.template triangularView<UnitLower>(), w.u_new);
  if (v_new.defined()) store_rows(w.u_new, value_columns(v_new, tile), block, hv);
  add_triangular_product(w.out, chunk.attn.template triangularView<Lower>(), w.u_new);
  store_rows(w.out, value_columns(o, tile), block, hv);
  if (!place.next_needed) return;
  state *= chunk.gamma(L - 1);
  state.noalias() += chunk.k_tail.transpose() * w.u_new;
}

// Tile i's columns of every value head r of sequence n, q/k head h, from a [N, HV, K, V] tensor:
// blocks[r · tiles + i] is K × width (zeros when `source` is undefined).
template <class S>
void load_tile_blocks(const Problem& p, const TensorView& source, std::int64_t n, std::int64_t h,
                      std::vector<Mat<S>>& blocks) {
  const std::int64_t tiles = num_value_tiles(p);
  blocks.resize(static_cast<std::size_t>(p.group * tiles));
  for (std::int64_t r = 0; r < p.group; ++r)
    for (std::int64_t i = 0; i < tiles; ++i) {
      const ValueTile tile = value_tile(p, i);
      Mat<S>& block = blocks[static_cast<std::size_t>(r * tiles + i)];
      if (source.defined())
        load_state(value_columns(source, tile), n, h * p.group + r, block);
      else
        block.setZero(p.K, tile.width);
    }
}
// The states of an item's value heads, tile by tile.
template <class S>
void load_tile_states(const Problem& p, std::int64_t n, std::int64_t h,
                      std::vector<Mat<S>>& states) {
  load_tile_blocks(p, p.initial_state, n, h, states);
}
template <class S>
void store_tile_states(const Problem& p, std::int64_t n, std::int64_t h,
                       const std::vector<Mat<S>>& states, const TensorView& final_state) {
  if (!final_state.defined()) return;
  const std::int64_t tiles = num_value_tiles(p);
  for (std::int64_t r = 0; r < p.group; ++r)
    for (std::int64_t i = 0; i < tiles; ++i)
      store_state(states[static_cast<std::size_t>(r * tiles + i)],
                  value_columns(final_state, value_tile(p, i)), n, h * p.group + r);
}

// Tile `tile`'s columns of value head hv's state entering chunk c of sequence n, in chunk_states
// ([num_chunk_states, HV, K, V]; phasor/common.h's layout): kept by the forward, read by the
// backward in place of its replay.
template <class S>
void keep_tile_state(const Problem& p, const Mat<S>& state, const TensorView& chunk_states,
                     std::int64_t n, std::int64_t c, std::int64_t hv, const ValueTile& tile) {
  store_state(state, value_columns(chunk_states, tile), p.sequences.chunk_slot(p.chunk_size, n, c),
              hv);
}
template <class S>
void load_kept_tile_state(const Problem& p, const TensorView& chunk_states, std::int64_t n,
                          std::int64_t c, std::int64_t hv, const ValueTile& tile, Mat<S>& state) {
  load_state(value_columns(chunk_states, tile), p.sequences.chunk_slot(p.chunk_size, n, c), hv,
             state);
}

// The q/k heads [h0, h0 + count) of sequence n, walked chunk by chunk and, within a chunk, head by
// head (as GLA's forward_heads: a token's rows of consecutive heads are adjacent in memory, where
// one head's rows are H · K apart). Each head's arithmetic is that of a walk of its own: its own
// states and chunks, in order, so the grouping (common/parallel.h's head_group_size) never shows.
template <class S>
struct ForwardWork {
  std::vector<std::vector<Mat<S>>> states;  // per head of the group: its value tiles' states
  QKInputs<S> qk;
  ValueInputs<S> in;
  ChunkGram<S> gram;
  ChunkState<S> chunk;
  TileWork<S> work;

  // The C × C matrices, should a very long chunk (C ≳ 700) make them large.
  void release_if_large() {
    detail::release_if_large(gram.kk, gram.qk, chunk.pair, chunk.m, chunk.attn);
  }
};

template <class S>
void forward_heads(const Problem& p, std::int64_t n, std::int64_t h0, std::int64_t count,
                   const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states, const TensorView& v_new) {
  const std::int64_t G = p.group, tiles = num_value_tiles(p);
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  // Kept per thread across calls, as the backward's (BackwardWork): a group's buffers (~150 KiB
  // at C = 64, K = 32, V = 64) freed after every group were trimmed from malloc's heap and faulted
  // back in by the next, with a TLB shoot-down per trim on two threads: B = 32, H = 2, T = 64 took
  // 20 ms a forward at C = 64 against 1.1 ms at C = 32. All are O(C² + C·(K + V) + K·V) per head,
  // none O(T), so they stay (the C × C ones unless C is very large).
  thread_local ForwardWork<S> fw;
  // Every initial state of the heads is read before any final state is stored (they may alias).
  std::vector<std::vector<Mat<S>>>& states = fw.states;
  if (static_cast<std::int64_t>(states.size()) < count)
    states.resize(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    load_tile_states<S>(p, n, h0 + i, states[static_cast<std::size_t>(i)]);
  QKInputs<S>& qk = fw.qk;
  ValueInputs<S>& in = fw.in;
  ChunkGram<S>& gram = fw.gram;
  ChunkState<S>& chunk = fw.chunk;
  TileWork<S>& work = fw.work;
  const std::int64_t num_chunks = (s.length + p.chunk_size - 1) / p.chunk_size;
  for (std::int64_t t0 = 0; t0 < s.length; t0 += p.chunk_size) {
    const Sequence block = block_of(s, t0, std::min(p.chunk_size, s.length - t0));
    const ChunkPlace place = ChunkPlace::forward(p, t0 / p.chunk_size, num_chunks, final_state);
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t h = h0 + i;
      load_qk(p, block, h, qk);
      gram.compute(qk);
      for (std::int64_t r = 0; r < G; ++r) {
        prepare_chunk(p, block, h * G + r, qk, gram, in, chunk);
        for (std::int64_t t = 0; t < tiles; ++t) {
          Mat<S>& state =
              states[static_cast<std::size_t>(i)][static_cast<std::size_t>(r * tiles + t)];
          if (chunk_states.defined())
            keep_tile_state(p, state, chunk_states, n, t0 / p.chunk_size, h * G + r,
                            value_tile(p, t));
          forward_tile(p, block, h * G + r, value_tile(p, t), gram, chunk, in.beta, o, v_new, state,
                       work, place);
        }
      }
    }
  }
  for (std::int64_t i = 0; i < count; ++i)
    store_tile_states(p, n, h0 + i, states[static_cast<std::size_t>(i)], final_state);
  fw.release_if_large();
}

// The by-tile schedules' window of chunks (forward_by_tile, backward_by_tile): chunks
// [first, first + window) of every item, with per (item, chunk) its q/k rows and gram and per
// (item, chunk, value head) its ChunkState and β, prepared in parallel over the window's chunks.
// The window is sized so that these stay bounded (~16 MiB).
template <class S>
struct ChunkWindow {
  const Problem& p;
  std::int64_t items, G, window, max_chunks = 0, first = 0;
  std::vector<std::array<std::int64_t, 2>> units;  // the window's (item, chunk) pairs
  std::vector<QKInputs<S>> qks;                    // per slot (item, chunk of the window)
  std::vector<ChunkGram<S>> grams;
  std::vector<ChunkState<S>> chunks;  // per (slot, value head)
  std::vector<Vec<S>> betas;

  // head_bytes: what the caller keeps beside each (chunk, value head), in bytes.
  ChunkWindow(const Problem& problem, std::int64_t head_bytes)
      : p(problem), items(problem.num_items()), G(problem.group) {
    const std::int64_t C = p.chunk_size, K = p.K;
    const std::int64_t chunk_bytes =
        static_cast<std::int64_t>(sizeof(S)) * (5 * C * K + 2 * C * C + G * (3 * C * C + C * K)) +
        G * head_bytes;
    window = window_chunks(items, chunk_bytes);
    for (std::int64_t item = 0; item < items; ++item)
      max_chunks = std::max(max_chunks, chunks_of(item));
    qks.resize(static_cast<std::size_t>(items * window));
    grams.resize(qks.size());
    chunks.resize(qks.size() * static_cast<std::size_t>(G));
    betas.resize(chunks.size());
  }
  std::int64_t chunks_of(std::int64_t item) const {
    return (p.sequences[p.item_sequence(item)].length + p.chunk_size - 1) / p.chunk_size;
  }
  // One past the item's last chunk in the current window.
  std::int64_t end_of(std::int64_t item) const { return std::min(chunks_of(item), first + window); }
  Sequence block_at(std::int64_t item, std::int64_t c) const {
    const Sequence& s = p.sequences[p.item_sequence(item)];
    return block_of(s, c * p.chunk_size, std::min(p.chunk_size, s.length - c * p.chunk_size));
  }
  std::size_t slot(std::int64_t item, std::int64_t c) const {
    return static_cast<std::size_t>(item * window + c - first);
  }
  std::size_t at(std::int64_t item, std::int64_t c, std::int64_t r) const {
    return slot(item, c) * static_cast<std::size_t>(G) + static_cast<std::size_t>(r);
  }

  // Moves to the window starting at chunk `start` and prepares its chunks: q/k, gram,
  // prepare_chunk and β of every value head, then head_done(index of the value head's ChunkState).
  template <class HeadDone>
  void prepare(std::int64_t start, HeadDone&& head_done) {
    first = start;
    units.clear();
    for (std::int64_t item = 0; item < items; ++item)
      for (std::int64_t c = first; c < end_of(item); ++c) units.push_back({item, c});
    parallel_for(static_cast<std::int64_t>(units.size()), [&](std::int64_t index) {
      const auto [item, c] = units[static_cast<std::size_t>(index)];
      const std::int64_t h = p.item_head(item);
      thread_local ValueInputs<S> in;
      const Sequence block = block_at(item, c);
      QKInputs<S>& qk = qks[slot(item, c)];
      load_qk(p, block, h, qk);
      ChunkGram<S>& gram = grams[slot(item, c)];
      gram.compute(qk);
      for (std::int64_t r = 0; r < G; ++r) {
        const std::size_t i = at(item, c, r);
        prepare_chunk(p, block, h * G + r, qk, gram, in, chunks[i]);
        betas[i] = in.beta;
        head_done(i);
      }
    });
  }
};

// The by-tile forward (see above), a window of chunks at a time.
template <class S>
void forward_by_tile(const Problem& p, const TensorView& o, const TensorView& final_state,
                     const TensorView& chunk_states, const TensorView& v_new) {
  const std::int64_t items = p.num_items(), G = p.group, tiles = num_value_tiles(p);
  ChunkWindow<S> w(p, 0);
  std::vector<std::vector<Mat<S>>> states(static_cast<std::size_t>(items));
  for (std::int64_t item = 0; item < items; ++item)
    load_tile_states<S>(p, p.item_sequence(item), p.item_head(item),
                        states[static_cast<std::size_t>(item)]);
  for (std::int64_t first = 0; first < w.max_chunks; first += w.window) {
    w.prepare(first, [](std::size_t) {});
    parallel_for(items * G * tiles, [&](std::int64_t u) {
      const std::int64_t item = u / (G * tiles), r = u / tiles % G, i = u % tiles;
      const std::int64_t h = p.item_head(item);
      thread_local TileWork<S> work;
      Mat<S>& state =
          states[static_cast<std::size_t>(item)][static_cast<std::size_t>(r * tiles + i)];
      for (std::int64_t c = first; c < w.end_of(item); ++c) {
        const std::size_t at = w.at(item, c, r);
        if (chunk_states.defined())
          keep_tile_state(p, state, chunk_states, p.item_sequence(item), c, h * G + r,
                          value_tile(p, i));
        forward_tile(p, w.block_at(item, c), h * G + r, value_tile(p, i), w.grams[w.slot(item, c)],
                     w.chunks[at], w.betas[at], o, v_new, state, work,
                     ChunkPlace::forward(p, c, w.chunks_of(item), final_state));
      }
    });
  }
  for (std::int64_t item = 0; item < items; ++item)
    store_tile_states(p, p.item_sequence(item), p.item_head(item),
                      states[static_cast<std::size_t>(item)], final_state);
}

// ---- The backward, value tile by value tile ------------------------------------------------
// Columns of the state never mix in the walk back either: with Y = M⁻ᵀ ∂/∂U_new,
//   ∂/∂U_new = diag(E) K dS + lower(Q̃Kᵀ⊙Γ)ᵀ dO,  ∂/∂(K S) = −diag(βγ) Y,
//   ∂L/∂S = γ_{L−1} dS + Kᵀ ∂/∂(K S) + (diag(γ) Q̃)ᵀ dO
// take column j of dS_next, dO and S to column j of ∂L/∂S. So each value tile walks its own
// columns (backward_tile) and leaves the chunk its share of the gradients that sum over columns
// (dq̃, dk̂, dβ, the gates' factors, and the L × L matrices dO U_newᵀ and Y U_newᵀ); the chunk adds
// the tiles' shares in tile order and finishes (finish_chunk). The tiles are value_tile's, fixed
// by the problem, so the schedules below (by item, by tile) give the same bits.

// One value tile's share of a chunk's gradients (one value head): sums over the tile's columns.
template <class S>
struct TileGrads {
  Mat<S> dq, dk;                // L × K: the tile's terms of dq̃, dk̂ that need its columns
  Mat<S> dattn, dm;             // lower triangles of dO U_newᵀ and Y U_newᵀ
  Vec<S> dgamma, dtail, dbeta;  // the tile's terms of dγ, dE and dβ

  // += another tile's share (only the lower triangles of dattn, dm are defined).
  void add(const TileGrads& t) {
    dq += t.dq;
    dk += t.dk;
    dattn.template triangularView<Lower>() += t.dattn;
    dm.template triangularView<Lower>() += t.dm;
    dgamma += t.dgamma;
    dtail += t.dtail;
    dbeta += t.dbeta;
  }
};

// Scratch of backward_tile.
template <class S>
struct TileScratch {
  Mat<S> ks;       // K S
  Mat<S> u_new;    // U_new, L × width
  Mat<S> d_kt;     // ∂/∂(diag(E) K)
  Mat<S> du;       // ∂/∂U_new, then Y = M⁻ᵀ ∂/∂U_new = ∂/∂R
  Mat<S> dz;       // [Y; dO], 2L × width
  Mat<S> dz_s;     // [Y Sᵀ; dO Sᵀ], 2L × K
  Mat<S> dS_prev;  // ∂L/∂S (entering state)
};

// U_new of one value tile, eq. (2): R = diag(β) (V − diag(γ) K S), then M U_new = R; leaves
// U_new in w.u_new and, unless the state is zero, K S in w.ks (the backward's replay and walk
// back).
template <class S>
void solve_u_new(const ChunkGram<S>& gram, const ChunkState<S>& c, const Vec<S>& beta,
                 const Mat<S>& v, const Mat<S>& state, TileScratch<S>& w, bool state_zero) {
  if (state_zero) {
    w.u_new = beta.asDiagonal() * v;
  } else {
    w.ks.noalias() = gram.kq.topRows(c.L) * state;
    w.u_new = beta.asDiagonal() * (v - c.gamma.asDiagonal() * w.ks);
  }
  solve_in_place(c.m.template triangularView<UnitLower>(), w.u_new);
}

// What backward_tile needs of a chunk and value head beyond prepare_chunk: [−diag(βγ) K; diag(γ) Q̃]
// (2L × K), for the products with [Y; dO], and Mᵀ stored as a matrix of its own (a solve with the
// transposed view of M ran 2.5× slower, and a value tile solves once per chunk).
template <class S>
struct BackwardFactors {
  Mat<S> kqg, m_t;

  void compute(const QKInputs<S>& qk, const ChunkState<S>& c, const Vec<S>& beta) {
    const std::int64_t L = c.L;
    kqg.resize(2 * L, qk.k.cols());
    kqg.topRows(L) = (-beta.cwiseProduct(c.gamma)).asDiagonal() * qk.k;
    kqg.bottomRows(L) = c.gamma.asDiagonal() * qk.q;
    m_t = c.m.transpose();
  }
};

// The walk back through one chunk for the value columns of one tile: given the tile's entering
// state, its v and dO columns, and dS = its columns of ∂L/∂S_next, writes the tile's dv and its
// share t of the chunk's gradients, and replaces dS by its columns of ∂L/∂S. Expects
// prepare_chunk (gates, M, the gated attention, diag(E) K) and f = BackwardFactors; with
// u_new_given, w.u_new holding the tile's columns of U_new (the forward's v_new), else solves for
// them (solve_u_new) — the same bits either way, the forward's U_new being solve_u_new's.
template <class S>
void backward_tile(const QKInputs<S>& qk, const ChunkGram<S>& gram, const ChunkState<S>& c,
                   const BackwardFactors<S>& f, const Vec<S>& beta, const Mat<S>& v,
                   const Mat<S>& d_out, const Mat<S>& state, Mat<S>& dS, Mat<S>& dv,
                   TileGrads<S>& t, TileScratch<S>& w, const ChunkPlace& place, bool u_new_given) {
  const std::int64_t L = c.L, width = state.cols();
  const Mat<S>& Kc = qk.k;
  const Mat<S>& Qc = qk.q;
  if (!u_new_given) solve_u_new(gram, c, beta, v, state, w, place.state_zero);

  // (4) S_next = γ_{L−1} S + (diag(E) K)ᵀ U_new.
  t.dgamma.setZero(L);
  t.dtail.resize(L);
  t.dgamma(L - 1) = state.cwiseProduct(dS).sum();
  if (place.ds_prev_needed) w.dS_prev = c.gamma(L - 1) * dS;
  if (place.ds_zero) {  // dS = 0: its products are zero
    t.dtail.setZero();
    t.dk.setZero(L, Kc.cols());
    w.du.setZero(L, width);
  } else {
    w.d_kt.noalias() = w.u_new * dS.transpose();
    for (std::int64_t j = 0; j < L; ++j) t.dtail(j) = Kc.row(j).dot(w.d_kt.row(j));
    t.dk.noalias() = c.tail.asDiagonal() * w.d_kt;
    w.du.noalias() = c.k_tail * dS;
  }

  // (3) O = diag(γ) Q̃ S + lower_incl(Q̃ Kᵀ ⊙ Γ) U_new. The Q̃ S term is handled with the K S
  // term below, through [K; diag(γ) Q̃] and [∂/∂(K S); dO].
  add_triangular_product(w.du, c.attn.template triangularView<Lower>().transpose(), d_out);
  t.dattn.resize(L, L);
  assign_product(t.dattn.template triangularView<Lower>(), d_out, w.u_new.transpose());

  // (2) M U_new = R: Y = M⁻ᵀ dU_new = dR, −dM = Y U_newᵀ (strictly lower part, finish_chunk).
  solve_in_place(f.m_t.template triangularView<UnitUpper>(), w.du);
  const Mat<S>& Y = w.du;
  t.dm.resize(L, L);
  assign_product(t.dm.template triangularView<Lower>(), Y, w.u_new.transpose());
  // R = diag(β) (V − diag(γ) K S): dV = diag(β) Y, dβ_i = (V − γ K S)_i · Y_i,
  // dγ_i = −β_i (K S)_i · Y_i, ∂/∂(K S) = −diag(βγ) Y. K S is not read (with v_new it is never
  // formed): (K S)_i · Y_i = k_i · (Y Sᵀ)_i, and Y Sᵀ is the product below.
  dv = beta.asDiagonal() * Y;
  t.dbeta.resize(L);
  w.dz.resize(2 * L, width);
  for (std::int64_t i = 0; i < L; ++i) t.dbeta(i) = v.row(i).dot(Y.row(i));
  w.dz.topRows(L) = Y;
  w.dz.bottomRows(L) = d_out;

  // [K S; diag(γ) Q̃ S] = [K; diag(γ) Q̃] S, one product each way, with ∂/∂(K S) = −diag(βγ) Y:
  //   ∂L/∂S += [−diag(βγ) K; diag(γ) Q̃]ᵀ [Y; dO],  [Y; dO] Sᵀ → dK, dQ̃, dβ and dγ.
  if (place.ds_prev_needed) w.dS_prev.noalias() += f.kqg.transpose() * w.dz;
  if (place.state_zero) {  // S = 0: [Y; dO] Sᵀ = 0
    t.dq.setZero(L, Kc.cols());
  } else {
    w.dz_s.noalias() = w.dz * state.transpose();
    const auto y_s = w.dz_s.topRows(L);
    for (std::int64_t i = 0; i < L; ++i) {
      const S ks_y = Kc.row(i).dot(y_s.row(i));  // (K S)_i · Y_i
      t.dbeta(i) -= c.gamma(i) * ks_y;
      t.dgamma(i) -= beta(i) * ks_y;
    }
    t.dk.noalias() -= (beta.cwiseProduct(c.gamma)).asDiagonal() * y_s;
    const auto do_s = w.dz_s.bottomRows(L);
    for (std::int64_t i = 0; i < L; ++i) t.dgamma(i) += Qc.row(i).dot(do_s.row(i));
    t.dq.noalias() = c.gamma.asDiagonal() * do_s;
  }
  if (place.ds_prev_needed) dS.swap(w.dS_prev);
}

// Scratch of finish_chunk.
template <class S>
struct FinishScratch {
  Mat<S> weight;  // W_ij = dΓ_ij Γ_ij (i > j): what each pairwise factor passes to its gates
  Vec<S> column_sums, row_sums;
};

// The rest of one chunk's backward for one value head, from t = the sum of its tiles' shares
// (consumed): adds dq̃, dk̂ into dq, dk and writes dg, dβ into d.
template <class S>
void finish_chunk(const QKInputs<S>& qk, const ChunkGram<S>& gram, const ChunkState<S>& c,
                  const Vec<S>& beta, TileGrads<S>& t, Mat<S>& dq, Mat<S>& dk, ValueGrads<S>& d,
                  FinishScratch<S>& w) {
  const std::int64_t L = c.L;
  const Mat<S>& Kc = qk.k;
  const Mat<S>& Qc = qk.q;
  dq += t.dq;
  dk += t.dk;
  // (3): dO U_newᵀ is ∂/∂(Q̃ Kᵀ ⊙ Γ); times Γ, ∂/∂(Q̃ Kᵀ).
  w.weight.setZero(L, L);
  Mat<S>& dattn = t.dattn;
  for (std::int64_t i = 0; i < L; ++i) {
    for (std::int64_t j = 0; j < i; ++j) w.weight(i, j) = dattn(i, j) * c.attn(i, j);
    for (std::int64_t j = 0; j <= i; ++j) dattn(i, j) *= c.pair(i, j);
  }
  add_triangular_product(dq, dattn.template triangularView<Lower>(), Kc);
  add_triangular_product(dk, dattn.template triangularView<Lower>().transpose(), Qc);

  // (1) M = I + diag(β) strictly_lower(K Kᵀ ⊙ Γ), with −dM = Y U_newᵀ.
  Mat<S>& dm = t.dm;
  for (std::int64_t i = 0; i < L; ++i) {
    S dbeta = 0;
    for (std::int64_t j = 0; j < i; ++j) {
      const S dM = -dm(i, j);
      const S kk_pair = gram.kk(i, j) * c.pair(i, j);
      dbeta += dM * kk_pair;
      w.weight(i, j) += dM * beta(i) * kk_pair;
      dm(i, j) = dM * beta(i) * c.pair(i, j);  // ∂/∂(K Kᵀ)_ij
    }
    d.dbeta(i) = t.dbeta(i) + dbeta;
    dm(i, i) = 0;
  }
  // K Kᵀ: dK += (dA + dAᵀ) K with dA strictly lower.
  add_triangular_product(dk, dm.template triangularView<Lower>(), Kc);
  add_triangular_product(dk, dm.template triangularView<Lower>().transpose(), Kc);

  // Gates. g_s enters γ_i for i ≥ s, E_j for j < s and Γ_ij for j < s ≤ i; each factor passes
  // (its gradient × its value) to every gate of its segment. All sums stay within the chunk.
  S acc = 0;
  for (std::int64_t s = L - 1; s >= 0; --s) {
    acc += t.dgamma(s) * c.gamma(s);
    d.dg(s) = acc;
  }
  acc = 0;
  for (std::int64_t s = 0; s < L; ++s) {
    d.dg(s) += acc;
    acc += t.dtail(s) * c.tail(s);
  }
  // F(s) = Σ_{i≥s} Σ_{j<s} W_ij telescopes: F(0) = 0, F(s+1) = F(s) + Σ_{i>s} W_is − Σ_{j<s} W_sj.
  w.column_sums = w.weight.colwise().sum().transpose();  // W is zero on/above diag
  w.row_sums = w.weight.rowwise().sum();
  acc = 0;
  for (std::int64_t s = 0; s < L; ++s) {
    d.dg(s) += acc;
    acc += w.column_sums(s) - w.row_sums(s);
  }
}

// Eqs. (2) and (4) for the value columns of one tile: S ← S_next (the backward's replay of the
// forward, which needs the entering states only). Expects prepare_chunk.
template <class S>
void replay_tile(const ChunkGram<S>& gram, const ChunkState<S>& c, const Vec<S>& beta,
                 const Mat<S>& v, Mat<S>& state, TileScratch<S>& w, bool state_zero) {
  solve_u_new(gram, c, beta, v, state, w, state_zero);
  state *= c.gamma(c.L - 1);
  state.noalias() += c.k_tail.transpose() * w.u_new;
}

// One value head's tile shares → its dg, dβ (stored) and dq̃, dk̂ (added into dq, dk): the shares
// added in tile order into the first (parts[0 .. tiles), consumed).
template <class S>
void finish_value_head(const Problem& p, const Sequence& block, std::int64_t hv,
                       const QKInputs<S>& qk, const ChunkGram<S>& gram, const ChunkState<S>& c,
                       const Vec<S>& beta, TileGrads<S>* parts, Mat<S>& dq, Mat<S>& dk,
                       ValueGrads<S>& d, FinishScratch<S>& w, const GatedDeltaRuleGrads& grads) {
  for (std::int64_t i = 1; i < num_value_tiles(p); ++i) parts[0].add(parts[i]);
  d.dg.resize(c.L);
  d.dbeta.resize(c.L);
  finish_chunk(qk, gram, c, beta, parts[0], dq, dk, d, w);
  if (grads.dg.defined()) store_column(d.dg, grads.dg, block, hv);
  if (grads.dbeta.defined()) store_column(d.dbeta, grads.dbeta, block, hv);
}

// Per-thread buffers of backward_heads.
template <class S>
struct BackwardWork {
  QKInputs<S> qk;
  ValueInputs<S> in;
  ChunkGram<S> gram;
  ChunkState<S> chunk;
  std::vector<Mat<S>> states, boundary;
  std::vector<std::vector<Mat<S>>> dS;  // per head of the group, its tiles' dS
  std::vector<TileGrads<S>> parts;
  TileScratch<S> scratch;
  FinishScratch<S> finish;
  ValueGrads<S> d;
  BackwardFactors<S> factors;
  Mat<S> v, d_out, dv, dq, dk;
  Mat<S> kept;  // a tile's entering state, read from chunk_states

  void release_if_large() { detail::release_if_large(boundary); }
};

// The backward of the items [first, first + count) (consecutive heads of one sequence), chunk by
// chunk from the last and, within a chunk, head by head as forward_heads walks them, each head's
// value heads and tiles in turn (the by-item schedule). Each head carries its own dS through the
// same arithmetic in any grouping. Without chunk_states the item's states are replayed first
// (O(T/C · K · V) per head): count is 1 then (backward_head_group_size).
template <class S>
void backward_heads(const Problem& p, std::int64_t first, std::int64_t count, const TensorView& d_o,
                    const TensorView& d_final_state, const GatedDeltaRuleGrads& grads,
                    const TensorView& chunk_states, const TensorView& v_new) {
  const std::int64_t n = p.item_sequence(first), G = p.group;
  const std::int64_t tiles = num_value_tiles(p);
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  const std::int64_t C = p.chunk_size, num_chunks = (s.length + C - 1) / C;
  auto chunk_block = [&](std::int64_t c) {
    return block_of(s, c * C, std::min(C, s.length - c * C));
  };
  // Kept per thread across calls (an item runs start to finish on one thread): the boundary
  // states are O(T/C · K · V) per item, and freed after every item they came back from the
  // system as new pages on the next (T = 4096, K = V = 128: 1,024 page faults per item, ~9% of a
  // forward + backward). Above kKeptBytes they are released after the item.
  thread_local BackwardWork<S> work;
  QKInputs<S>& qk = work.qk;
  ValueInputs<S>& in = work.in;
  ChunkGram<S>& gram = work.gram;
  ChunkState<S>& chunk = work.chunk;
  TileScratch<S>& scratch = work.scratch;
  // Forward again, keeping boundary[(r · tiles + i) · num_chunks + c] = tile i's columns of the
  // state of value head r entering chunk c — unless the forward kept them (chunk_states).
  std::vector<Mat<S>>& states = work.states;
  std::vector<Mat<S>>& boundary = work.boundary;
  const bool replay = !chunk_states.defined();
  if (replay) check_one_replayed_head(count);
  const std::int64_t h_replayed = p.item_head(first);
  if (replay) load_tile_states<S>(p, n, h_replayed, states);
  if (replay) boundary.resize(static_cast<std::size_t>(G * tiles * num_chunks));
  for (std::int64_t c = 0; replay && c < num_chunks; ++c) {
    for (std::int64_t u = 0; u < G * tiles; ++u)
      boundary[static_cast<std::size_t>(u * num_chunks + c)] = states[static_cast<std::size_t>(u)];
    // The walk back needs no state after the last chunk: stop at its entering states (a
    // sequence of one chunk, as in short training sequences, replays nothing).
    if (c + 1 == num_chunks) break;
    const Sequence block = chunk_block(c);
    load_qk(p, block, h_replayed, qk);
    prefetch_inputs(p, chunk_block(c + 1), h_replayed);
    gram.compute(qk);
    for (std::int64_t r = 0; r < G; ++r) {
      prepare_chunk(p, block, h_replayed * G + r, qk, gram, in, chunk);
      for (std::int64_t i = 0; i < tiles; ++i) {
        load_rows(value_columns(p.v, value_tile(p, i)), block, h_replayed * G + r, work.v);
        replay_tile(gram, chunk, in.beta, work.v, states[static_cast<std::size_t>(r * tiles + i)],
                    scratch, c == 0 && !p.initial_state.defined());
      }
    }
  }
  // Walk the chunks backwards, recomputing each one from its entering states.
  work.dS.resize(static_cast<std::size_t>(count));
  for (std::int64_t j = 0; j < count; ++j)
    load_tile_blocks<S>(p, d_final_state, n, p.item_head(first + j),
                        work.dS[static_cast<std::size_t>(j)]);
  work.parts.resize(static_cast<std::size_t>(tiles));
  Mat<S>&dq = work.dq, &dk = work.dk;
  for (std::int64_t c = num_chunks - 1; c >= 0; --c) {
    const Sequence block = chunk_block(c);
    for (std::int64_t j = 0; j < count; ++j) {
      const std::int64_t h = p.item_head(first + j);
      std::vector<Mat<S>>& dS = work.dS[static_cast<std::size_t>(j)];
      load_qk(p, block, h, qk);
      if (c > 0) prefetch_inputs(p, chunk_block(c - 1), h, d_o);
      gram.compute(qk);
      dq.setZero(block.length, p.K);
      dk.setZero(block.length, p.K);
      const ChunkPlace place = ChunkPlace::backward(p, c, num_chunks, d_final_state, grads.dh0);
      for (std::int64_t r = 0; r < G; ++r) {
        const std::int64_t hv = h * G + r;
        prepare_chunk(p, block, hv, qk, gram, in, chunk);
        work.factors.compute(qk, chunk, in.beta);
        for (std::int64_t i = 0; i < tiles; ++i) {
          const ValueTile tile = value_tile(p, i);
          const auto u = static_cast<std::size_t>(r * tiles + i);
          load_rows(value_columns(p.v, tile), block, hv, work.v);
          load_rows(value_columns(d_o, tile), block, hv, work.d_out);
          Mat<S>& entering =
              replay
                  ? boundary[u * static_cast<std::size_t>(num_chunks) + static_cast<std::size_t>(c)]
                  : work.kept;
          if (!replay) load_kept_tile_state(p, chunk_states, n, c, hv, tile, entering);
          if (v_new.defined()) load_rows(value_columns(v_new, tile), block, hv, scratch.u_new);
          backward_tile(qk, gram, chunk, work.factors, in.beta, work.v, work.d_out, entering, dS[u],
                        work.dv, work.parts[static_cast<std::size_t>(i)], scratch, place,
                        v_new.defined());
          if (grads.dv.defined()) store_rows(work.dv, value_columns(grads.dv, tile), block, hv);
        }
        finish_value_head(p, block, hv, qk, gram, chunk, in.beta, work.parts.data(), dq, dk, work.d,
                          work.finish, grads);
      }
      store_qk_grads(p, block, h, qk, dq, dk, grads);
    }
  }
  for (std::int64_t j = 0; j < count; ++j)
    store_tile_states(p, n, p.item_head(first + j), work.dS[static_cast<std::size_t>(j)],
                      grads.dh0);
  work.release_if_large();
}

// The by-tile backward for few items (B = H = 1 at T = 65,536): the replay of the forward a window
// of chunks at a time as forward_by_tile (the chunks' state-independent parts in parallel over
// chunks, then the tiles' recurrences in parallel), keeping every tile's entering states; then
// the walk back a window at a time from the last: the state-independent parts in parallel over
// chunks, the tiles' walks back (backward_tile) in parallel over (item, value head, tile), and the
// chunks' finish (finish_value_head, store_qk_grads) in parallel over chunks. Each piece runs the
// arithmetic of backward_heads', so the bits are the same.
template <class S>
void backward_by_tile(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                      const GatedDeltaRuleGrads& grads, const TensorView& chunk_states,
                      const TensorView& v_new) {
  const std::int64_t items = p.num_items(), G = p.group, C = p.chunk_size, K = p.K;
  const std::int64_t tiles = num_value_tiles(p);
  // Beside each (chunk, value head) of the window: its BackwardFactors (C² + 2 C K) and its
  // tiles' shares (2 C K + 2 C² each).
  ChunkWindow<S> w(p, static_cast<std::int64_t>(sizeof(S)) *
                          (C * C + 2 * C * K + tiles * (2 * C * K + 2 * C * C)));
  std::vector<BackwardFactors<S>> factors(w.chunks.size());
  std::vector<TileGrads<S>> parts(w.chunks.size() * static_cast<std::size_t>(tiles));
  // Replay: boundary[(item · G + r) · tiles + i][c] = tile i's columns of the state of value head
  // r entering chunk c.
  // (None with chunk_states: each tile's walk back reads its entering states from there.)
  const bool replay = !chunk_states.defined();
  std::vector<std::vector<Mat<S>>> boundary(
      static_cast<std::size_t>(replay ? items * G * tiles : 0));
  if (replay) {
    std::vector<std::vector<Mat<S>>> states(static_cast<std::size_t>(items));
    for (std::int64_t item = 0; item < items; ++item) {
      load_tile_states<S>(p, p.item_sequence(item), p.item_head(item),
                          states[static_cast<std::size_t>(item)]);
      for (std::int64_t u = 0; u < G * tiles; ++u)
        boundary[static_cast<std::size_t>(item * G * tiles + u)].resize(
            static_cast<std::size_t>(w.chunks_of(item)));
    }
    for (std::int64_t first = 0; first < w.max_chunks; first += w.window) {
      w.prepare(first, [](std::size_t) {});
      parallel_for(items * G * tiles, [&](std::int64_t u) {
        const std::int64_t item = u / (G * tiles), r = u / tiles % G, i = u % tiles;
        const std::int64_t hv = p.item_head(item) * G + r;
        thread_local TileScratch<S> scratch;
        thread_local Mat<S> v;
        Mat<S>& state =
            states[static_cast<std::size_t>(item)][static_cast<std::size_t>(r * tiles + i)];
        for (std::int64_t c = first; c < w.end_of(item); ++c) {
          boundary[static_cast<std::size_t>(u)][static_cast<std::size_t>(c)] = state;
          // The walk back needs no state after the last chunk.
          if (c + 1 == w.chunks_of(item)) break;
          const std::size_t at = w.at(item, c, r);
          load_rows(value_columns(p.v, value_tile(p, i)), w.block_at(item, c), hv, v);
          replay_tile(w.grams[w.slot(item, c)], w.chunks[at], w.betas[at], v, state, scratch,
                      c == 0 && !p.initial_state.defined());
        }
      });
    }
  }
  // The walk back, a window at a time from the last.
  std::vector<std::vector<Mat<S>>> dS(static_cast<std::size_t>(items));
  for (std::int64_t item = 0; item < items; ++item)
    load_tile_blocks<S>(p, d_final_state, p.item_sequence(item), p.item_head(item),
                        dS[static_cast<std::size_t>(item)]);
  for (std::int64_t first = (w.max_chunks - 1) / w.window * w.window; first >= 0;
       first -= w.window) {
    w.prepare(first, [&](std::size_t at) {
      const std::size_t s = at / static_cast<std::size_t>(G);
      factors[at].compute(w.qks[s], w.chunks[at], w.betas[at]);
    });
    parallel_for(items * G * tiles, [&](std::int64_t u) {
      const std::int64_t item = u / (G * tiles), r = u / tiles % G, i = u % tiles;
      const std::int64_t hv = p.item_head(item) * G + r;
      const ValueTile tile = value_tile(p, i);
      thread_local TileScratch<S> scratch;
      thread_local Mat<S> v, d_out, dv, kept;
      for (std::int64_t c = w.end_of(item) - 1; c >= first; --c) {
        const std::size_t s = w.slot(item, c), at = w.at(item, c, r);
        const Sequence block = w.block_at(item, c);
        load_rows(value_columns(p.v, tile), block, hv, v);
        load_rows(value_columns(d_o, tile), block, hv, d_out);
        if (!replay)
          load_kept_tile_state(p, chunk_states, p.item_sequence(item), c, hv, tile, kept);
        if (v_new.defined()) load_rows(value_columns(v_new, tile), block, hv, scratch.u_new);
        backward_tile(
            w.qks[s], w.grams[s], w.chunks[at], factors[at], w.betas[at], v, d_out,
            replay ? boundary[static_cast<std::size_t>(u)][static_cast<std::size_t>(c)] : kept,
            dS[static_cast<std::size_t>(item)][static_cast<std::size_t>(r * tiles + i)], dv,
            parts[at * static_cast<std::size_t>(tiles) + static_cast<std::size_t>(i)], scratch,
            ChunkPlace::backward(p, c, w.chunks_of(item), d_final_state, grads.dh0),
            v_new.defined());
        if (grads.dv.defined()) store_rows(dv, value_columns(grads.dv, tile), block, hv);
      }
    });
    parallel_for(static_cast<std::int64_t>(w.units.size()), [&](std::int64_t index) {
      const auto [item, c] = w.units[static_cast<std::size_t>(index)];
      const std::int64_t h = p.item_head(item);
      const std::size_t s = w.slot(item, c);
      thread_local FinishScratch<S> finish;
      thread_local ValueGrads<S> d;
      thread_local Mat<S> dq, dk;
      const Sequence block = w.block_at(item, c);
      dq.setZero(block.length, K);
      dk.setZero(block.length, K);
      for (std::int64_t r = 0; r < G; ++r) {
        const std::size_t at = w.at(item, c, r);
        finish_value_head(p, block, h * G + r, w.qks[s], w.grams[s], w.chunks[at], w.betas[at],
                          &parts[at * static_cast<std::size_t>(tiles)], dq, dk, d, finish, grads);
      }
      store_qk_grads(p, block, h, w.qks[s], dq, dk, grads);
    });
  }
  for (std::int64_t item = 0; item < items; ++item)
    store_tile_states(p, p.item_sequence(item), p.item_head(item),
                      dS[static_cast<std::size_t>(item)], grads.dh0);
}

}  // namespace

void chunk_forward(const Problem& p, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states, const TensorView& v_new) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    if (split_items(p.num_items() * p.group))
      return forward_by_tile<S>(p, o, final_state, chunk_states, v_new);
    const std::int64_t heads = head_group_size(
        p.num_sequences(), p.H, p.group * p.K * p.V * static_cast<std::int64_t>(sizeof(S)));
    parallel_for(p.num_items() / heads, [&](std::int64_t index) {
      const std::int64_t first = index * heads;
      forward_heads<S>(p, p.item_sequence(first), p.item_head(first), heads, o, final_state,
                       chunk_states, v_new);
    });
  });
}

void chunk_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                    const GatedDeltaRuleGrads& grads, const TensorView& chunk_states,
                    const TensorView& v_new) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    if (split_items(p.num_items() * p.group))
      return backward_by_tile<S>(p, d_o, d_final_state, grads, chunk_states, v_new);
    const std::int64_t heads = backward_head_group_size(
        p.num_sequences(), p.H, p.group * p.K * p.V * static_cast<std::int64_t>(sizeof(S)),
        chunk_states.defined());
    parallel_for(p.num_items() / heads, [&](std::int64_t index) {
      backward_heads<S>(p, index * heads, heads, d_o, d_final_state, grads, chunk_states, v_new);
    });
  });
}

}  // namespace phasor::detail::gdn
