// GLA chunk kernel (fla's chunk_gla): chunks of C tokens, dense products through Eigen.
//
// Notation for one chunk of n ≤ C tokens with local indices 0 … n−1 (last = n−1), S_prev the
// state before the chunk, S_next the state after it, all gate sums taken per key channel:
//   P_i    = exp(Σ_{s ≤ i} g_s)          prefix from the chunk start
//   E_j    = exp(Σ_{s ∈ (j, last]} g_s)  suffix to the chunk end
//   D_ij   = exp(Σ_{s ∈ (j, i]} g_s)     decay from key j to query i (j ≤ i)
// Forward (from unrolling S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ over the chunk):
//   inter   o_i    = scale · (q_i ⊙ P_i)ᵀ S_prev
//   intra   o_i   += Σ_{j ≤ i} A_ij v_j,      A_ij = scale · Σ_k q_ik k_jk D_ij,k
//   state   S_next = diag(P_last) S_prev + Σ_j (k_j ⊙ E_j) v_jᵀ
//
// Stability. Every factor is ≤ 1 and computed as a running product of the decays exp(g_s) (each
// ≤ 1) from a nearby reference point (chunk start, chunk end, or a sub-block start), never as
// exp(+cumsum) or as the difference of two cumulative sums: with g = −20 per token the former
// overflows, and with a gate of exactly 0 (g = −inf) the latter gives −inf − (−inf) = NaN. A
// product of m factors ≤ 1 carries a relative error of at most m rounding units (m ≤ C), and it
// reaches 0 only by underflow, where the true value is below float's range too. One exp per gate
// (the decays), the rest multiplications: exps of sums for every factor took ~10% of a forward.
// Products run within one chunk only. The intra part uses sub-blocks of c = 16 tokens. For a query
// block starting at r and keys j < r, D_ij = Π_{(r, i]} exp(g) · Π_{(j, r]} exp(g) — both
// factors ≤ 1, each gate counted once — so the whole off-diagonal strip is one matrix product
// (Q_I ⊙ F_q)(K_{<r} ⊙ F_k)ᵀ. Inside a diagonal block, D_ij for j = i, i−1, … is the running
// product too (at most c − 1 factors).
//
// State recurrence: S_next = diag(P_last) S_prev + L with the chunk's own contribution
// L = (k ⊙ E)ᵀ v, so the states before the chunks are a scan of the L's (computed in parallel over
// chunks when there are few (sequence, head) items; see "Schedules" below).
// Backward: a first pass stores the state before every chunk (O(T/C · K·V) memory) — unless the
// forward kept them (chunk_states), which saves the backward one of its five K × V products per
// token; the chunks are then walked in reverse carrying dS (the gradient of the loss w.r.t.
// S_next):
//   dS_prev = diag(P_last) dS + scale · Σ_i (q_i ⊙ P_i) do_iᵀ
//   dq_i = scale · P_i ⊙ (S_prev do_i) + scale · Σ_{j ≤ i} dA_ij D_ij ⊙ k_j,   dA_ij = do_i · v_j
//   dk_j = E_j ⊙ (dS v_j)              + scale · Σ_{i ≥ j} dA_ij D_ij ⊙ q_i
//   dv_j = (k_j ⊙ E_j)ᵀ dS             + Σ_{i ≥ j} A_ij do_i
// The gate gradient. Unrolling the direct form dg_t = exp(g_t) ⊙ rowsum(S_{t−1} ⊙ dS_t) over the
// chunk, with S_prev as a key "before" the chunk and dS as a query "after" it, gives
//   dg_t = Σ over pairs (key j, query i) with j < t ≤ i of that pair's term,
// i.e. only the paths that pass through step t; every term carries the factor exp(g_t):
//   dg_t = P_last ⊙ rowsum(S_prev ⊙ dS)                               (S_prev → S_next)
//        + Σ_{i ≥ t} q_i ⊙ dq_i^inter                                  (S_prev → o_i)
//        + Σ_{j < t} k_j ⊙ dk_j^state                                  (k_j → S_next)
//        + Σ_{j < t ≤ i} M_ij,    M_ij = scale · dA_ij · q_i ⊙ k_j ⊙ D_ij  (k_j → o_i)
// This equals the familiar Σ_{i ≥ t} (q_i ⊙ dq_i − k_i ⊙ dk_i) + rowsum(S_next ⊙ dS): the pairs
// with t ≤ j ≤ i appear there once with each sign. We do not use that form: with strong gates
// the true dg is ~exp(−20) times the terms that cancel, so their rounding error would swamp it.
// Σ_{j<t≤i} M_ij is split by sub-blocks (B the block of t): pairs inside block B are summed
// directly; pairs with i in B and j in an earlier block are q_i ⊙ dq_i^off (off = from the
// off-diagonal strips); pairs with j in B and i in a later block are k_j ⊙ dk_j^off; pairs with
// i after B and j before B are whole block pairs X_IJ = Σ_{i∈I, j∈J} M_ij, summed per block.
// Every term summed is a product that passes through t: no cancellation beyond the true one.
//
// Rotation (θ given): load() rotates the chunk's q and k rows by θ (R1, common/rotation.h) once,
// and everything above runs on the rotated rows unchanged (dg, dv and the state only ever see
// q', k'). The backward's dq, dk are then with respect to q', k'; unrotate() turns them into the
// gradients of the inputs and dθ (R2, R3), reusing the cos/sin computed at load.

#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/kept_buffers.h"
#include "common/packets.h"
#include "common/parallel.h"
#include "common/slices.h"
#include "gla/kernels.h"

namespace phasor::detail::gla {
namespace {

template <class S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

// Sub-block size c of the intra-chunk part.
constexpr std::int64_t kSubBlock = 16;

// The diagonal blocks' float32 kernels for K = 16 · NP ≤ 128, defined with AVX-512 only: the
// callers reach them through with_float_packets_of_16, which calls nothing otherwise.
template <int NP>
void diagonal_block_pairs(std::int64_t r, std::int64_t rows, std::int64_t ld, float scale,
                          const float* q, const float* k, const float* decay, const float* d_attn,
                          float* attn, float* dq, float* dk, float* pair, float* cross);
template <int NP>
void diagonal_block_scores(std::int64_t r, std::int64_t rows, std::int64_t ld, float scale,
                           const float* q, const float* k, const float* decay, float* attn);

#if defined(__AVX512F__)
// The backward's pairs r ≤ j ≤ i < r + rows of one diagonal block in float32, K = 16 · NP
// (K ≤ 128), with the same terms as the generic loop in ChunkWork::backward: for every query row
// i and j = i, i − 1, …, r, D_ij (the running product of decays), A_ij = scale · q_i · (D_ij ⊙
// k_j), dq_i += w (D_ij ⊙ k_j), dk_j += w (D_ij ⊙ q_i) and M_ij = w q_i ⊙ D_ij ⊙ k_j with
// w = scale · dA_ij; then cross[t] += Σ_{r ≤ j < t} M_ij for r < t ≤ i. q_i, D_ij and dq_i stay in
// registers across the pairs of a row: the generic loop makes seven passes over rows in memory
// per pair (~19% of a GLA backward in a profile). All row pointers have a stride of K floats;
// attn and d_attn have a stride of ld; pair holds kSubBlock rows of K.
template <int NP>
void diagonal_block_pairs(std::int64_t r, std::int64_t rows, std::int64_t ld, float scale,
                          const float* q, const float* k, const float* decay, const float* d_attn,
                          float* attn, float* dq, float* dk, float* pair, float* cross) {
  constexpr std::int64_t K = 16 * NP;
  for (std::int64_t i = r; i < r + rows; ++i) {
    __m512 qi[NP], d[NP], dqi[NP];
    for (int u = 0; u < NP; ++u) {
      qi[u] = _mm512_loadu_ps(q + i * K + 16 * u);
      d[u] = _mm512_set1_ps(1.0f);
      dqi[u] = _mm512_setzero_ps();
    }
    for (std::int64_t j = i; j >= r; --j) {
      if (j < i)
        for (int u = 0; u < NP; ++u)
          d[u] = _mm512_mul_ps(d[u], _mm512_loadu_ps(decay + (j + 1) * K + 16 * u));
      const __m512 w = _mm512_set1_ps(scale * d_attn[i * ld + j]);
      __m512 kd[NP], qk[NP];
      __m512 dot = _mm512_setzero_ps();
      for (int u = 0; u < NP; ++u) {
        kd[u] = _mm512_mul_ps(_mm512_loadu_ps(k + j * K + 16 * u), d[u]);  // D_ij ⊙ k_j
        qk[u] = _mm512_mul_ps(qi[u], kd[u]);                               // q_i ⊙ D_ij ⊙ k_j
        dot = _mm512_add_ps(dot, qk[u]);
        dqi[u] = _mm512_fmadd_ps(w, kd[u], dqi[u]);
        float* dk_row = dk + j * K + 16 * u;
        _mm512_storeu_ps(dk_row,
                         _mm512_fmadd_ps(w, _mm512_mul_ps(qi[u], d[u]), _mm512_loadu_ps(dk_row)));
      }
      attn[i * ld + j] = scale * _mm512_reduce_add_ps(dot);
      if (j < i)
        for (int u = 0; u < NP; ++u)
          _mm512_storeu_ps(pair + (j - r) * K + 16 * u, _mm512_mul_ps(w, qk[u]));
    }
    for (int u = 0; u < NP; ++u) _mm512_storeu_ps(dq + i * K + 16 * u, dqi[u]);
    // cross[t] += Σ_{r ≤ j < t} M_ij for r < t ≤ i (dqi reused as the running sum). The terms
    // were made with j descending (D_ij is a running product from j = i down) and are summed with
    // j ascending, hence the store and reload through pair (at most 16 rows of K floats: L1);
    // summing as they are made would need Σ_{j<t} = Σ_j − Σ_{j≥t}, the cancelling form the file
    // comment rules out.
    for (int u = 0; u < NP; ++u) dqi[u] = _mm512_setzero_ps();
    for (std::int64_t j = r; j < i; ++j)
      for (int u = 0; u < NP; ++u) {
        dqi[u] = _mm512_add_ps(dqi[u], _mm512_loadu_ps(pair + (j - r) * K + 16 * u));
        float* cross_row = cross + (j + 1) * K + 16 * u;
        _mm512_storeu_ps(cross_row, _mm512_add_ps(_mm512_loadu_ps(cross_row), dqi[u]));
      }
  }
}
// The forward's A_ij = scale · (q_i ⊙ D_ij) · k_j for the pairs r ≤ j ≤ i < r + rows of one
// diagonal block in float32, K = 16 · NP ≤ 128, as the generic loop in intra_attention: q_i ⊙ D_ij
// stays in registers while j steps down from i. attn has a stride of ld, the rows of K.
template <int NP>
void diagonal_block_scores(std::int64_t r, std::int64_t rows, std::int64_t ld, float scale,
                           const float* q, const float* k, const float* decay, float* attn) {
  constexpr std::int64_t K = 16 * NP;
  for (std::int64_t i = r; i < r + rows; ++i) {
    __m512 qd[NP];
    for (int u = 0; u < NP; ++u) qd[u] = _mm512_loadu_ps(q + i * K + 16 * u);
    for (std::int64_t j = i; j >= r; --j) {
      if (j < i)
        for (int u = 0; u < NP; ++u)
          qd[u] = _mm512_mul_ps(qd[u], _mm512_loadu_ps(decay + (j + 1) * K + 16 * u));
      __m512 dot = _mm512_mul_ps(qd[0], _mm512_loadu_ps(k + j * K));
      for (int u = 1; u < NP; ++u)
        dot = _mm512_fmadd_ps(qd[u], _mm512_loadu_ps(k + j * K + 16 * u), dot);
      attn[i * ld + j] = scale * _mm512_reduce_add_ps(dot);
    }
  }
}
#endif

// Buffers for one chunk of one (sequence, head) pair, reused from chunk to chunk.
template <class S>
struct ChunkWork {
  std::int64_t n = 0;  // tokens in the chunk
  S scale = 1;
  Mat<S> q, k, v, g, d_out;   // the chunk's inputs
  Mat<S> decay;               // exp(g_t)
  Mat<S> prefix;              // P_i
  Mat<S> suffix;              // E_j
  RowVec<S> p_last;           // P_last = exp(Σ of the chunk's gates)
  Mat<S> q_p;                 // scale · q ⊙ P
  Mat<S> k_e;                 // k ⊙ E
  Mat<S> attn;                // A, n × n, lower triangular (zero above the diagonal)
  Mat<S> f_q, f_k, q_f, k_f;  // sub-block factors and the scaled rows they multiply
  Mat<S> out;
  // Backward only.
  Mat<S> d_attn;                     // dA_ij = do_i · v_j
  Mat<S> dq_inter, dq_off, dq_diag;  // parts of dq (see the file comment)
  Mat<S> dk_state, dk_off, dk_diag;  // parts of dk
  Mat<S> dq, dk, dv, dg;             // full gradients of the chunk
  Mat<S> key_grad, key_terms;        // one strip's dk contribution, and k ⊙ it
  Mat<S> pair_terms;                 // M_ij for one query row of a diagonal block
  Mat<S> cross_diag;                 // Σ of M_ij over in-block pairs j < t ≤ i
  Mat<S> cross_blocks;               // Σ of X_IJ over blocks J < B < I, one row per B
  RowVec<S> qd, kd, acc;
  // Rotation only.
  PairAngles<S> angles;  // cos θ, sin θ of the chunk's tokens
  Mat<S> dtheta;         // n × K/2

  // With θ, q and k hold the rotated rows R(θ_i) q_i, R(θ_i) k_i.
  void load(const Problem& p, const Sequence& part, std::int64_t h, bool with_q,
            const TensorView& d_o) {
    n = part.length;
    scale = static_cast<S>(p.scale);
    if (with_q) load_rows(p.q, part, h, q);
    load_rows(p.k, part, h, k);
    load_rows(p.v, part, h, v);
    load_rows(p.g, part, h, g);
    if (d_o.defined()) load_rows(d_o, part, h, d_out);
    if (p.theta.defined()) {
      angles.load(p.theta, part, h);
      if (with_q) rotate_rows(q, angles, p.rotary_layout);
      rotate_rows(k, angles, p.rotary_layout);
    }
  }

  // After backward(): dq, dk (w.r.t. the rotated q', k') become the gradients w.r.t. the inputs,
  // and dθ = the sum of both rows' contributions (R2, R3).
  void unrotate(RotaryLayout layout) {
    dtheta.setZero(n, q.cols() / 2);
    unrotate_gradient_rows(dq, q, angles, layout, dtheta);
    unrotate_gradient_rows(dk, k, angles, layout, dtheta);
  }

  // decay, E (suffix) and P_last; with with_prefix also P (prefix). Every factor is a running
  // product of exp(g_s) from its reference point (see the file comment): one exp per gate, the
  // rest multiplications. P_last = E_0 ⊙ exp(g_0) is formed from the suffix so the state update
  // uses the same value in the forward and in the backward's state pass (which skips the prefix).
  void gate_factors(bool with_prefix = true) {
    const std::int64_t K = g.cols();
    decay = g.array().exp().matrix();
    suffix.resize(n, K);
    suffix.row(n - 1).setOnes();
    for (std::int64_t j = n - 2; j >= 0; --j)
      suffix.row(j) = suffix.row(j + 1).cwiseProduct(decay.row(j + 1));
    p_last = suffix.row(0).cwiseProduct(decay.row(0));
    if (!with_prefix) return;
    prefix.resize(n, K);
    prefix.row(0) = decay.row(0);
    for (std::int64_t i = 1; i < n; ++i)
      prefix.row(i) = prefix.row(i - 1).cwiseProduct(decay.row(i));
  }

  // For the query block [r, r + rows) and the keys [0, r):
  //   f_q[m] = Π_{s ∈ (r, r+m]} exp(g_s),  f_k[j] = Π_{s ∈ (j, r]} exp(g_s)
  // so that D_{r+m, j} = f_q[m] ⊙ f_k[j]; q_f = q ⊙ f_q and k_f = k ⊙ f_k. Expects decay.
  void block_factors(std::int64_t r, std::int64_t rows) {
    const std::int64_t K = g.cols();
    f_q.resize(rows, K);
    f_q.row(0).setOnes();
    for (std::int64_t m = 1; m < rows; ++m)
      f_q.row(m) = f_q.row(m - 1).cwiseProduct(decay.row(r + m));
    f_k.resize(r, K);
    f_k.row(r - 1) = decay.row(r);
    for (std::int64_t j = r - 2; j >= 0; --j)
      f_k.row(j) = f_k.row(j + 1).cwiseProduct(decay.row(j + 1));
    q_f = (q.middleRows(r, rows).array() * f_q.array()).matrix();
    k_f = (k.topRows(r).array() * f_k.array()).matrix();
  }

  // A (scale included), lower triangular.
  void intra_attention() {
    attn.setZero(n, n);
    for (std::int64_t r = 0; r < n; r += kSubBlock) {
      const std::int64_t rows = std::min(kSubBlock, n - r);
      if (r > 0) {
        block_factors(r, rows);
        attn.block(r, 0, rows, r).noalias() = scale * (q_f * k_f.transpose());
      }
      // The diagonal block by diagonal_block_scores where it applies (float32, K = 16 · NP ≤ 128,
      // AVX-512), else by the loop below. Every row is contiguous (Mat).
      if (with_float_packets_of_16<S>(q.cols(), [&](auto packets) {
            diagonal_block_scores<decltype(packets)::value>(r, rows, n, scale, q.data(), k.data(),
                                                            decay.data(), attn.data());
          }))
        continue;
      for (std::int64_t i = r; i < r + rows; ++i) {
        qd = q.row(i);  // q_i ⊙ D_ij, for j = i, i − 1, …, r
        attn(i, i) = scale * qd.dot(k.row(i));
        for (std::int64_t j = i - 1; j >= r; --j) {
          qd.array() *= decay.row(j + 1).array();
          attn(i, j) = scale * qd.dot(k.row(j));
        }
      }
    }
  }

  // o = scale (q ⊙ P) S_prev + A v.
  void forward_output(const Mat<S>& state) {
    q_p = scale * (q.array() * prefix.array()).matrix();
    out.noalias() = q_p * state;
    intra_attention();
    // Eigen's triangular product reads element (0, 0) of its operands even when the product is
    // empty (V = 0): a null reference, undefined behaviour (found by UBSan). Nothing to add then.
    if (v.cols() > 0) out.noalias() += attn.template triangularView<Eigen::Lower>() * v;
  }

  // The chunk's own contribution to the state, L = (k ⊙ E)ᵀ v (K × V): S_next = diag(P_last)
  // S_prev + L (carry_state). Expects gate_factors (E, P_last).
  template <class Local>
  void state_contribution(Local&& local) {
    k_e = (k.array() * suffix.array()).matrix();
    local.noalias() = k_e.transpose() * v;
  }

  // The chunk's own contribution to the state gradient, scale · Σ_i (q_i ⊙ P_i) do_iᵀ (K × V):
  // dS_prev = diag(P_last) dS + it (carry_state). Expects load(…, d_o) and gate_factors().
  template <class Local>
  void state_gradient_contribution(Local&& local) {
    q_p = scale * (q.array() * prefix.array()).matrix();
    local.noalias() = q_p.transpose() * d_out;
  }

  // Gradients of the chunk given S_prev and dS (the gradient w.r.t. S_next). Expects load(…, d_o)
  // and gate_factors() done.
  template <class State, class StateGrad>
  void backward(const State& state_prev, const StateGrad& d_state) {
    const std::int64_t K = q.cols();
    k_e = (k.array() * suffix.array()).matrix();

    d_attn.noalias() = d_out * v.transpose();
    dq_inter.noalias() = d_out * state_prev.transpose();
    dq_inter.array() *= scale * prefix.array();
    dk_state.noalias() = v * d_state.transpose();
    dk_state.array() *= suffix.array();
    dv.noalias() = k_e * d_state;

    const std::int64_t num_blocks = (n + kSubBlock - 1) / kSubBlock;
    attn.setZero(n, n);
    dq_off.setZero(n, K);
    dk_off.setZero(n, K);
    dq_diag.setZero(n, K);
    dk_diag.setZero(n, K);
    cross_diag.setZero(n, K);
    cross_blocks.setZero(num_blocks, K);
    pair_terms.resize(kSubBlock, K);
    for (std::int64_t block = 0; block < num_blocks; ++block) {
      const std::int64_t r = block * kSubBlock, rows = std::min(kSubBlock, n - r);
      if (r > 0) {
        // Off-diagonal strip: queries [r, r + rows), keys [0, r).
        block_factors(r, rows);
        attn.block(r, 0, rows, r).noalias() = scale * (q_f * k_f.transpose());
        const auto d_strip = d_attn.block(r, 0, rows, r);
        dq_off.middleRows(r, rows).noalias() = scale * (d_strip * k_f);
        dq_off.middleRows(r, rows).array() *= f_q.array();
        key_grad.noalias() = scale * (d_strip.transpose() * q_f);
        key_grad.array() *= f_k.array();
        dk_off.topRows(r) += key_grad;
        // X_{block, J} for each earlier key block J; cross_blocks[B] collects Σ_{J<B} X_{block,J}
        // for every B strictly between J and this query block.
        key_terms = (k.topRows(r).array() * key_grad.array()).matrix();
        acc.setZero(K);
        for (std::int64_t key_block = 0; key_block < block; ++key_block) {
          cross_blocks.row(key_block) += acc;
          acc += key_terms.middleRows(key_block * kSubBlock, kSubBlock).colwise().sum();
        }
      }
      // Diagonal block: pairs r ≤ j ≤ i < r + rows, D_ij as a running product; by
      // diagonal_block_pairs where it applies (float32, K = 16 · NP ≤ 128, AVX-512), else by the
      // loop below.
      if (with_float_packets_of_16<S>(K, [&](auto packets) {
            diagonal_block_pairs<decltype(packets)::value>(
                r, rows, n, scale, q.data(), k.data(), decay.data(), d_attn.data(), attn.data(),
                dq_diag.data(), dk_diag.data(), pair_terms.data(), cross_diag.data());
          }))
        continue;
      for (std::int64_t i = r; i < r + rows; ++i) {
        acc.setOnes(K);  // D_ij
        for (std::int64_t j = i; j >= r; --j) {
          if (j < i) acc.array() *= decay.row(j + 1).array();
          kd = (k.row(j).array() * acc.array()).matrix();  // D_ij ⊙ k_j
          qd = (q.row(i).array() * acc.array()).matrix();  // D_ij ⊙ q_i
          attn(i, j) = scale * q.row(i).dot(kd);
          const S w = scale * d_attn(i, j);
          dq_diag.row(i) += w * kd;
          dk_diag.row(j) += w * qd;
          if (j < i) pair_terms.row(j - r) = w * (q.row(i).array() * kd.array()).matrix();
        }
        // dg_t += Σ_{r ≤ j < t} M_ij for r < t ≤ i.
        acc.setZero(K);
        for (std::int64_t j = r; j < i; ++j) {
          acc += pair_terms.row(j - r);
          cross_diag.row(j + 1) += acc;
        }
      }
    }
    if (d_out.cols() > 0)  // V = 0: nothing to add (see forward_output)
      dv.noalias() += attn.template triangularView<Eigen::Lower>().transpose() * d_out;
    dq = dq_inter + dq_off + dq_diag;
    dk = dk_state + dk_off + dk_diag;

    // dg (see the file comment). Chunk-wide parts first.
    dg.resize(n, K);
    acc.setZero(K);
    for (std::int64_t t = n - 1; t >= 0; --t) {  // Σ_{i ≥ t} q_i ⊙ dq_i^inter
      acc += (q.row(t).array() * dq_inter.row(t).array()).matrix();
      dg.row(t) = acc;
    }
    acc.setZero(K);
    for (std::int64_t t = 0; t < n; ++t) {  // Σ_{j < t} k_j ⊙ dk_j^state
      dg.row(t) += acc;
      acc += (k.row(t).array() * dk_state.row(t).array()).matrix();
    }
    // S_prev → S_next: P_last ⊙ rowsum(S_prev ⊙ dS), the same for every t.
    acc = (p_last.array() * (state_prev.array() * d_state.array()).rowwise().sum().transpose())
              .matrix();
    dg.rowwise() += acc;
    dg += cross_diag;
    for (std::int64_t block = 0; block < num_blocks; ++block) {
      const std::int64_t r = block * kSubBlock, rows = std::min(kSubBlock, n - r);
      dg.middleRows(r, rows).rowwise() += cross_blocks.row(block);
      acc.setZero(K);
      for (std::int64_t t = r; t < r + rows; ++t) {  // Σ_{j ∈ B, j < t} k_j ⊙ dk_j^off
        dg.row(t) += acc;
        acc += (k.row(t).array() * dk_off.row(t).array()).matrix();
      }
      acc.setZero(K);
      for (std::int64_t t = r + rows - 1; t >= r; --t) {  // Σ_{i ∈ B, i ≥ t} q_i ⊙ dq_i^off
        acc += (q.row(t).array() * dq_off.row(t).array()).matrix();
        dg.row(t) += acc;
      }
    }
  }
};

// Asks for the rows that ChunkWork::load(p, part, h, with_q, d_o) will read to be brought into
// cache: by-item walks call it for the next chunk while computing the current one.
void prefetch_chunk(const Problem& p, const Sequence& part, std::int64_t h, bool with_q,
                    const TensorView& d_o) {
  if (with_q) prefetch_block(p.q, part, h);
  prefetch_block(p.k, part, h);
  prefetch_block(p.v, part, h);
  prefetch_block(p.g, part, h);
  prefetch_block(p.theta, part, h);
  prefetch_block(d_o, part, h);
}

// S ← diag(P_last) S + L, one rounding per element (fma): the state recurrence across chunks
// (L = state_contribution) and, in reverse, the state gradient's (L =
// state_gradient_contribution). With `previous`, previous ← the S it was called with; `local` may
// be `previous` (the scans below keep each chunk's entering state where its L was).
template <class S, class State, class Local, class Previous>
void carry_state(State&& state, const RowVec<S>& p_last, const Local& local, Previous* previous) {
  for (Eigen::Index i = 0; i < state.rows(); ++i) {
    S* row = state.row(i).data();
    const S* add = local.row(i).data();
    S* keep = previous ? previous->row(i).data() : nullptr;
    const S p = p_last(i);
    for (Eigen::Index j = 0; j < state.cols(); ++j) {
      const S l = add[j];
      if (keep) keep[j] = row[j];
      row[j] = std::fma(p, row[j], l);
    }
  }
}
template <class S, class State, class Local>
void carry_state(State&& state, const RowVec<S>& p_last, const Local& local) {
  carry_state<S>(state, p_last, local, static_cast<Mat<S>*>(nullptr));
}

// ---- Schedules ---------------------------------------------------------------------------------
// Every chunk runs the same arithmetic in either schedule — its output from the state entering it,
// its contribution L (K × V, a product into zeros) and the carry S ← diag(P_last) S + L — so the
// two give bit-identical results and the choice between them (by thread count) never shows:
//  * by item: each (sequence, head) pair is walked chunk by chunk on one thread (the state stays
//    in cache); used when the items alone keep every thread busy.
//  * by chunk: for few items (B = H = 1 at T = 65,536), the chunks of a window run in parallel in
//    three phases — every chunk's L; per item and tile of value columns, the scan of the carries,
//    leaving each chunk's entering state where its L was; every chunk's output. The backward
//    first replays the forward's carries window by window, keeping only the state entering each
//    window, then walks the windows back from the last: every chunk's L and dS contribution, the
//    scans of the states and (in reverse) of dS, every chunk's gradients.

// The i-th chunk of a sequence as a Sequence, and the number of chunks.
inline Sequence chunk_of(const Sequence& s, std::int64_t C, std::int64_t c) {
  return subsequence(s, c * C, std::min(C, s.length - c * C));
}
inline std::int64_t num_chunks(const Sequence& s, std::int64_t C) {
  return (s.length + C - 1) / C;
}

// (item, chunk) pairs: for every item, its chunks in [first, first + count) that exist.
struct ChunkUnit {
  std::int64_t item, chunk;

  Sequence part(const Problem& p) const {
    return chunk_of(p.sequences[item / p.H], p.chunk_size, chunk);
  }
  std::int64_t head(const Problem& p) const { return item % p.H; }
  // Its index in chunk_states.
  std::int64_t slot(const Problem& p) const {
    return p.sequences.chunk_slot(p.chunk_size, item / p.H, chunk);
  }
};
std::vector<ChunkUnit> chunk_units(const Problem& p, std::int64_t first, std::int64_t count) {
  std::vector<ChunkUnit> units;
  for (std::int64_t item = 0; item < p.num_work_items(); ++item) {
    const std::int64_t chunks = num_chunks(p.sequences[item / p.H], p.chunk_size);
    for (std::int64_t c = first; c < std::min(chunks, first + count); ++c)
      units.push_back({item, c});
  }
  return units;
}

// The chunks [first, first + window) of every item in a by-chunk schedule, with `blocks_per_chunk`
// K × V blocks per (item, chunk) (the states; the backward's dS beside them) and its P_last. The
// window is sized so that the blocks stay within ~16 MiB (common/parallel.h's window_chunks). The
// backward used to keep two blocks for every chunk of the sequence: 128 MiB at T = 65,536, faulted
// in fresh from the system on every call (33k page faults; its first phase took 62 ms on two
// threads with them, 42 ms with the same buffers already mapped).
template <class S>
struct StateWindow {
  const Problem& p;
  std::int64_t items, window, max_chunks = 0, first = 0;
  std::vector<ChunkUnit> units;
  Mat<S> states, d_states, p_lasts;  // d_states: only with two blocks per chunk

  StateWindow(const Problem& problem, std::int64_t blocks_per_chunk)
      : p(problem), items(problem.num_work_items()) {
    const std::int64_t K = p.K, V = p.V;
    window = window_chunks(items, blocks_per_chunk * K * V * static_cast<std::int64_t>(sizeof(S)));
    for (std::int64_t item = 0; item < items; ++item)
      max_chunks = std::max(max_chunks, num_chunks(p.sequences[item / p.H], p.chunk_size));
    states.resize(items * window * K, V);
    if (blocks_per_chunk > 1) d_states.resize(items * window * K, V);
    p_lasts.resize(items * window, K);
  }
  // One K × V block per item, from `blocks` ([N, H, K, V]) or zero where it is undefined.
  std::vector<Mat<S>> item_blocks(const TensorView& blocks) const {
    std::vector<Mat<S>> result(static_cast<std::size_t>(items));
    for (std::int64_t item = 0; item < items; ++item) {
      Mat<S>& block = result[static_cast<std::size_t>(item)];
      block.setZero(p.K, p.V);
      if (blocks.defined()) load_state(blocks, item / p.H, item % p.H, block);
    }
    return result;
  }
  std::int64_t num_windows() const { return (max_chunks + window - 1) / window; }
  void move_to(std::int64_t window_index) {
    first = window_index * window;
    units = chunk_units(p, first, window);
  }
  std::int64_t slot(std::int64_t item, std::int64_t c) const { return item * window + c - first; }
  auto state(std::int64_t item, std::int64_t c) {
    return states.middleRows(slot(item, c) * p.K, p.K);
  }
  auto d_state(std::int64_t item, std::int64_t c) {
    return d_states.middleRows(slot(item, c) * p.K, p.K);
  }
  auto p_last(std::int64_t item, std::int64_t c) { return p_lasts.row(slot(item, c)); }
  std::int64_t end_of(std::int64_t item) const {
    return std::min(num_chunks(p.sequences[item / p.H], p.chunk_size), first + window);
  }

  // Every chunk's L (into its state block) and P_last, from one load of its k, v, g each.
  void contributions() {
    parallel_for(static_cast<std::int64_t>(units.size()), [&](std::int64_t u) {
      const ChunkUnit unit = units[static_cast<std::size_t>(u)];
      thread_local ChunkWork<S> work;
      work.load(p, unit.part(p), unit.head(p), /*with_q=*/false, TensorView{});
      work.gate_factors(/*with_prefix=*/false);
      work.state_contribution(state(unit.item, unit.chunk));
      p_last(unit.item, unit.chunk) = work.p_last;
    });
  }

  // The scans, in parallel over (item, tile of kScanColumns value columns) — carry_state mixes no
  // columns, so a tile's carries are the whole state's, element by element. fn(item, columns)
  // scans the given columns of the item.
  static constexpr std::int64_t kScanColumns = 64;
  template <class Fn>
  void for_each_column_tile(Fn&& fn) const {
    const std::int64_t tiles = (p.V + kScanColumns - 1) / kScanColumns;
    parallel_for(items * tiles, [&](std::int64_t u) {
      const std::int64_t item = u / tiles, j = u % tiles * kScanColumns;
      fn(item, std::pair<std::int64_t, std::int64_t>{j, std::min(kScanColumns, p.V - j)});
    });
  }
  // running[item] carried through the window's chunks (S ← diag(P_last) S + L); with
  // keep_entering, each chunk's block is left holding the state entering it instead of its L.
  void carry_states(std::vector<Mat<S>>& running, bool keep_entering) {
    for_each_column_tile([&](std::int64_t item, std::pair<std::int64_t, std::int64_t> cols) {
      auto state_cols = running[static_cast<std::size_t>(item)].middleCols(cols.first, cols.second);
      for (std::int64_t c = first; c < end_of(item); ++c) {
        auto block = state(item, c).middleCols(cols.first, cols.second);
        const RowVec<S> pl = p_last(item, c);
        if (keep_entering)
          carry_state<S>(state_cols, pl, block, &block);
        else
          carry_state<S>(state_cols, pl, block);
      }
    });
  }
  // The reverse scan: running[item] (dS leaving the window) carried back through the window's
  // chunks (dS_prev = diag(P_last) dS + the chunk's dS contribution), each chunk's d_state block
  // left holding the dS leaving its chunk.
  void carry_d_states(std::vector<Mat<S>>& running) {
    for_each_column_tile([&](std::int64_t item, std::pair<std::int64_t, std::int64_t> cols) {
      auto d_cols = running[static_cast<std::size_t>(item)].middleCols(cols.first, cols.second);
      for (std::int64_t c = end_of(item) - 1; c >= first; --c) {
        auto leaving = d_state(item, c).middleCols(cols.first, cols.second);
        const RowVec<S> pl = p_last(item, c);
        carry_state<S>(d_cols, pl, leaving, &leaving);
      }
    });
  }
};

// Heads [h0, h0 + count) of sequence n, walked chunk by chunk and, within a chunk, head by head:
// chunk c of every head, then chunk c + 1. A token's rows of consecutive heads are adjacent in
// [B, T, H, D] memory, so a group loads whole runs of count·D values per token where one head
// alone loads D values 4 KiB apart (H·D floats at H = 8, D = 128) — a stride at which every row
// lands on a new page and in the same few cache sets (one thread, K = V = 128, T = 4096: 6% less
// time with groups of 4). Each head's arithmetic is the same in any grouping (its own state and
// chunks, in order), so the grouping, chosen by thread count (common/parallel.h's
// head_group_size), never shows.
// (A software prefetch of the next head's or chunk's rows changed nothing measurable here: the
// hardware prefetchers follow the runs.)
template <class S>
void forward_heads(const Problem& p, std::int64_t n, std::int64_t h0, std::int64_t count,
                   const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  std::vector<Mat<S>> states(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    Mat<S>& state = states[static_cast<std::size_t>(i)];
    state.setZero(p.K, p.V);
    if (p.initial_state.defined()) load_state(p.initial_state, n, h0 + i, state);
  }
  Mat<S> local(p.K, p.V);
  thread_local ChunkWork<S> work;
  const std::int64_t chunks = num_chunks(s, p.chunk_size);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const Sequence part = chunk_of(s, p.chunk_size, c);
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t h = h0 + i;
      work.load(p, part, h, /*with_q=*/true, TensorView{});
      Mat<S>& state = states[static_cast<std::size_t>(i)];
      if (chunk_states.defined())
        store_state(state, chunk_states, p.sequences.chunk_slot(p.chunk_size, n, c), h);
      work.gate_factors();
      work.forward_output(state);
      store_rows(work.out, o, part, h);
      work.state_contribution(local);
      carry_state(state, work.p_last, local);
    }
  }
  if (final_state.defined())
    for (std::int64_t i = 0; i < count; ++i)
      store_state(states[static_cast<std::size_t>(i)], final_state, n, h0 + i);
}

// The chunk-parallel forward, a window of chunks at a time (bounded memory: one K × V block per
// chunk of the window).
template <class S>
void forward_by_chunk(const Problem& p, const TensorView& o, const TensorView& final_state,
                      const TensorView& chunk_states) {
  StateWindow<S> w(p, 1);
  std::vector<Mat<S>> states = w.item_blocks(p.initial_state);
  for (std::int64_t index = 0; index < w.num_windows(); ++index) {
    w.move_to(index);
    w.contributions();
    w.carry_states(states, /*keep_entering=*/true);
    parallel_for(static_cast<std::int64_t>(w.units.size()), [&](std::int64_t u) {
      const ChunkUnit unit = w.units[static_cast<std::size_t>(u)];
      thread_local ChunkWork<S> work;
      work.load(p, unit.part(p), unit.head(p), /*with_q=*/true, TensorView{});
      work.gate_factors();
      work.forward_output(w.state(unit.item, unit.chunk));
      store_rows(work.out, o, unit.part(p), unit.head(p));
      if (chunk_states.defined())
        store_state(w.state(unit.item, unit.chunk), chunk_states, unit.slot(p), unit.head(p));
    });
  }
  if (final_state.defined())
    for (std::int64_t item = 0; item < w.items; ++item)
      store_state(states[static_cast<std::size_t>(item)], final_state, item / p.H, item % p.H);
}

// Gradients of one chunk from its entering state and dS (w.r.t. its leaving state), stored.
template <class S, class State, class StateGrad>
void chunk_gradients(const Problem& p, const Sequence& part, std::int64_t h, const GlaGrads& grads,
                     const State& state_prev, const StateGrad& d_state, ChunkWork<S>& work) {
  // dq', dk' (rotated frame) need turning back only if dq, dk or dθ is requested.
  const bool unrotate =
      p.theta.defined() && (grads.dq.defined() || grads.dk.defined() || grads.dtheta.defined());
  work.backward(state_prev, d_state);
  if (unrotate) {
    work.unrotate(p.rotary_layout);
    if (grads.dtheta.defined()) store_rows(work.dtheta, grads.dtheta, part, h);
  }
  if (grads.dq.defined()) store_rows(work.dq, grads.dq, part, h);
  if (grads.dk.defined()) store_rows(work.dk, grads.dk, part, h);
  if (grads.dv.defined()) store_rows(work.dv, grads.dv, part, h);
  if (grads.dg.defined()) store_rows(work.dg, grads.dg, part, h);
}

// Per-thread buffers of backward_heads, kept across calls and across a thread's run of items
// (common/kept_buffers.h): the replay's states before every chunk are O(T/C · K · V) per item
// (16 MiB at T = 16384, K = V = 128, float32), and a block freed after every item came back as
// new pages on the next. Every element is written before it is read.
template <class S>
struct BackwardItemWork {
  ChunkWork<S> chunk;
  Mat<S> states, entering;
  std::vector<Mat<S>> d_states;  // dS of each head of the group

  void release_if_large() { detail::release_if_large(states); }
};

// Heads [h0, h0 + count) of sequence n, their chunks walked in reverse and, within a chunk, head
// by head, as forward_heads walks them (the rows of a group's heads are adjacent in memory; see
// docs/performance.md). Each head carries its own dS through the same arithmetic in any
// grouping. Without chunk_states a head's states are replayed first, which needs
// O(T/C · K · V) per head: count is 1 then (backward_head_group_size).
template <class S>
void backward_heads(const Problem& p, std::int64_t n, std::int64_t h0, std::int64_t count,
                    const TensorView& d_o, const TensorView& d_final_state, const GlaGrads& grads,
                    const TensorView& chunk_states, BackwardItemWork<S>& buffers) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  const std::int64_t C = p.chunk_size, K = p.K, V = p.V, chunks = num_chunks(s, C);
  ChunkWork<S>& work = buffers.chunk;
  Mat<S>& states = buffers.states;
  Mat<S>& entering = buffers.entering;
  Mat<S> local(K, V);

  // Pass 1: states[c] = the state before chunk c (the forward kept them in chunk_states if given).
  if (!chunk_states.defined()) {
    check_one_replayed_head(count);
    states.resize(chunks * K, V);
    Mat<S> state = Mat<S>::Zero(K, V);
    if (p.initial_state.defined()) load_state(p.initial_state, n, h0, state);
    for (std::int64_t c = 0; c < chunks; ++c) {
      states.middleRows(c * K, K) = state;
      if (c + 1 == chunks) break;  // pass 2 needs no state after the last chunk
      work.load(p, chunk_of(s, C, c), h0, /*with_q=*/false, TensorView{});
      prefetch_chunk(p, chunk_of(s, C, c + 1), h0, false, TensorView{});
      work.gate_factors(/*with_prefix=*/false);
      work.state_contribution(local);
      carry_state(state, work.p_last, local);
    }
  }

  // Pass 2: chunks in reverse, each head carrying its dS.
  std::vector<Mat<S>>& d_states = buffers.d_states;
  d_states.resize(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    Mat<S>& d_state = d_states[static_cast<std::size_t>(i)];
    d_state.setZero(K, V);
    if (d_final_state.defined()) load_state(d_final_state, n, h0 + i, d_state);
  }
  for (std::int64_t c = chunks - 1; c >= 0; --c) {
    const Sequence part = chunk_of(s, C, c);
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t h = h0 + i;
      Mat<S>& d_state = d_states[static_cast<std::size_t>(i)];
      work.load(p, part, h, /*with_q=*/true, d_o);
      if (c > 0) prefetch_chunk(p, chunk_of(s, C, c - 1), h, true, d_o);
      work.gate_factors();
      // The entering state where the forward kept it when its layout is a Mat's (no copy), else
      // a copy in `entering`; the replay's in `states`.
      const S* state_prev = nullptr;
      if (chunk_states.defined()) {
        const std::int64_t slot = p.sequences.chunk_slot(C, n, c);
        state_prev = state_in_place<S>(chunk_states, slot, h);
        if (!state_prev) {
          load_state(chunk_states, slot, h, entering);
          state_prev = entering.data();
        }
      } else {
        state_prev = states.data() + c * K * V;
      }
      // One state type for all three sources: one instantiation of ChunkWork::backward.
      chunk_gradients(p, part, h, grads, ConstStateMap<S>(state_prev, K, V), d_state, work);
      work.state_gradient_contribution(local);
      carry_state(d_state, work.p_last, local);
    }
  }
  if (grads.dh0.defined())
    for (std::int64_t i = 0; i < count; ++i)
      store_state(d_states[static_cast<std::size_t>(i)], grads.dh0, n, h0 + i);
}

// The chunk-parallel backward. A replay of the forward's carries, window by window, keeps the
// state entering each window (one K × V block per window of an item, where keeping every chunk's
// would be O(T)); then the windows from the last: every chunk's L, P_last and dS contribution
// from one load; the scans — from the window's entering state, each chunk's block left holding
// the state entering it, and in reverse from the dS leaving the window, each dS block left
// holding the gradient w.r.t. the state leaving its chunk; every chunk's gradients. Each L is
// computed twice, in the replay and in the walk back (~8% more products than the backward's),
// for memory bounded by the window instead of two K × V blocks per chunk of the sequence.
// With chunk_states (kept by the forward) there is no replay and no scan of the states: each
// chunk's gradients read its entering state from there.
template <class S>
void backward_by_chunk(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                       const GlaGrads& grads, const TensorView& chunk_states) {
  const bool replay = !chunk_states.defined();
  StateWindow<S> w(p, 2);
  const std::int64_t items = w.items, windows = w.num_windows();
  // entering[item · windows + index]: the state entering window `index` of the item.
  std::vector<Mat<S>> entering(static_cast<std::size_t>(replay ? items * windows : 0));
  std::vector<Mat<S>> states = replay ? w.item_blocks(p.initial_state) : std::vector<Mat<S>>{};
  for (std::int64_t index = 0; replay && index < windows; ++index) {
    for (std::int64_t item = 0; item < items; ++item)
      entering[static_cast<std::size_t>(item * windows + index)] =
          states[static_cast<std::size_t>(item)];
    if (index + 1 == windows) break;  // the walk back needs no state after the last window
    w.move_to(index);
    w.contributions();
    w.carry_states(states, /*keep_entering=*/false);
  }

  std::vector<Mat<S>> d_states = w.item_blocks(d_final_state);  // dS leaving the window
  for (std::int64_t index = windows - 1; index >= 0; --index) {
    w.move_to(index);
    parallel_for(static_cast<std::int64_t>(w.units.size()), [&](std::int64_t u) {
      const ChunkUnit unit = w.units[static_cast<std::size_t>(u)];
      thread_local ChunkWork<S> work;
      work.load(p, unit.part(p), unit.head(p), /*with_q=*/true, d_o);
      work.gate_factors();
      if (replay) work.state_contribution(w.state(unit.item, unit.chunk));
      work.state_gradient_contribution(w.d_state(unit.item, unit.chunk));
      w.p_last(unit.item, unit.chunk) = work.p_last;
    });
    if (replay) {
      for (std::int64_t item = 0; item < items; ++item)
        states[static_cast<std::size_t>(item)] =
            entering[static_cast<std::size_t>(item * windows + index)];
      w.carry_states(states, /*keep_entering=*/true);
    }
    w.carry_d_states(d_states);
    parallel_for(static_cast<std::int64_t>(w.units.size()), [&](std::int64_t u) {
      const ChunkUnit unit = w.units[static_cast<std::size_t>(u)];
      thread_local ChunkWork<S> work;
      thread_local Mat<S> kept;
      work.load(p, unit.part(p), unit.head(p), /*with_q=*/true, d_o);
      work.gate_factors();
      if (replay) {
        chunk_gradients(p, unit.part(p), unit.head(p), grads, w.state(unit.item, unit.chunk),
                        w.d_state(unit.item, unit.chunk), work);
      } else {
        load_state(chunk_states, unit.slot(p), unit.head(p), kept);
        chunk_gradients(p, unit.part(p), unit.head(p), grads, kept,
                        w.d_state(unit.item, unit.chunk), work);
      }
    });
  }
  if (grads.dh0.defined())
    for (std::int64_t item = 0; item < items; ++item)
      store_state(d_states[static_cast<std::size_t>(item)], grads.dh0, item / p.H, item % p.H);
}

}  // namespace

void chunk_forward(const Problem& p, const TensorView& o, const TensorView& final_state,
                   const TensorView& chunk_states) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    if (split_items(p.num_work_items()))
      return forward_by_chunk<S>(p, o, final_state, chunk_states);
    const std::int64_t group =
        head_group_size(p.num_sequences(), p.H, p.K * p.V * static_cast<std::int64_t>(sizeof(S)));
    parallel_for(p.num_work_items() / group, [&](std::int64_t index) {
      const std::int64_t first = index * group;
      forward_heads<S>(p, first / p.H, first % p.H, group, o, final_state, chunk_states);
    });
  });
}

void chunk_backward(const Problem& p, const TensorView& d_o, const TensorView& d_final_state,
                    const GlaGrads& grads, const TensorView& chunk_states) {
  dispatch_float(p.q, [&](auto zero) {
    using S = decltype(zero);
    if (split_items(p.num_work_items()))
      return backward_by_chunk<S>(p, d_o, d_final_state, grads, chunk_states);
    const std::int64_t group = backward_head_group_size(
        p.num_sequences(), p.H, p.K * p.V * static_cast<std::int64_t>(sizeof(S)),
        chunk_states.defined());
    parallel_for_runs(p.num_work_items() / group, [&](std::int64_t begin, std::int64_t end) {
      thread_local BackwardItemWork<S> buffers;
      for (std::int64_t index = begin; index < end; ++index) {
        const std::int64_t first = index * group;
        backward_heads<S>(p, first / p.H, first % p.H, group, d_o, d_final_state, grads,
                          chunk_states, buffers);
      }
      buffers.release_if_large();
    });
  });
}

}  // namespace phasor::detail::gla
