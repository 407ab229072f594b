// Context-parallel forgetting attention (FoX): ring attention with the online-softmax merge.
//
// Notation. The whole sequence (every rank's slice, in rank order) has global token indices; rank
// r holds [s_r, e_r). For a query i and a key j ≤ i of the same sequence, within the window,
//   ℓ_ij = scale·q'_i·k'_j + Σ_{l=j+1}^{i} g_l − (i − j)(a_i + b_j),   o_i = Σ_j softmax_j(ℓ_ij)
//   v_j
// (q', k' rotated by θ; g per query head; a, b the GRAPE slopes; i − j the same in global and in
// sequence-local positions). Query i sees the keys j ∈ [reach(i), i] with
//   reach(i) = max(start of i's sequence, i − window + 1).                                    (1)
//
// Gate sums across ranks. For i on rank r and j on an earlier rank b (every key of b precedes every
// query of r: no causal mask inside such a cross block, only (1)), the gate sum splits as
//   Σ_{l=j+1}^{i} g_l = G_j + M_br + A_i,                                                      (2)
//   G_j  = Σ_{l=j+1}^{e_b − 1} g_l   (the key's suffix on its own rank, sent with the key),
//   M_br = Σ_{b<m<r} T_m,  T_m = Σ_{l ∈ rank m} g_l   (whole ranks between; allgathered totals),
//   A_i  = Σ_{l=s_r}^{i} g_l          (the query's prefix on its own rank).
// Each term is a sum of log gates (≤ 0) formed in float64 — never a difference of cumulative sums,
// so −inf gates give −inf, never inf − inf. (With a pair in one sequence, every rank between b and
// r lies inside that sequence, so M_br is the right sum; pairs of different sequences are masked.)
//
// Forward. Each rank runs the core kernel on its own slice (the diagonal block; cu_seqlens cut to
// the slice) for (o, lse), then merges each earlier rank's block B (its keys within reach) by
//   lse_B = log Σ_{j∈B} e^{ℓ_ij},  lse' = logaddexp(lse, lse_B),
//   o' = e^{lse − lse'} o + Σ_{j∈B} e^{ℓ_ij − lse'} v_j.                                       (3)
// The diagonal block always holds j = i, so lse is finite and (3) never forms −inf − (−inf).
//
// Backward (flash-attention style; o, lse the merged forward results). With D_i = do_i·o_i and
// for every visible pair P_ij = e^{ℓ_ij − lse_i},
//   dℓ_ij = P_ij (do_i·v_j − D_i),                                                              (4)
//   dq'_i = scale Σ_j dℓ_ij k'_j,  dk'_j = scale Σ_i dℓ_ij q'_i,  dv_j = Σ_i P_ij do_i,
//   da_i = −Σ_j (i − j) dℓ_ij,      db_j = −Σ_i (i − j) dℓ_ij,
// (dk', dv, db summed over the query heads of a key head's group). The diagonal block is the core
// backward given the MERGED o and lse: both kernels form D_i = do_i·o_i from the o passed and
// P = e^{ℓ − lse} from the lse passed (src/forgetting_attn/chunk.cpp and recurrent.cpp), so they
// return the diagonal block's share of (4) — gate gradient included, for pairs inside the slice —
// with one exception that needs the cross blocks: the kernels take the dℓ of a row's dominant key
// (P_ij* > 1/2) as −Σ_{j≠j*} dℓ_ij, the whole row summing to 0, which holds only over all keys.
// So the cross blocks run first and their row sums dA_i reach the kernel as
// ForgettingAttnParams::dlogit_sums_elsewhere. (A dominant key on another rank gets the direct
// P(dP − D) in the cross block: the kernels' cancellation-free form only for local dominants.)
// Cross blocks add, through (2):
//   dA_i = Σ_{j cross} dℓ_ij,  dG_j = Σ_{i cross} dℓ_ij,  dM_br = Σ_{i∈r, j∈b} dℓ_ij,
//   dg_l += Σ_{i ≥ l, i ∈ rank(l)} dA_i + Σ_{j < l, j ∈ rank(l)} dG_j + Σ_{b < rank(l) < r} dM_br
// (a local reverse cumulative sum, a local exclusive cumulative sum, and the whole-rank terms,
// added up by one allreduce of a [R, B, HQ] table when R ≥ 3). Key-side gradients (dk', dv, dG,
// db) of a cross block are sent back to the rank that owns the keys. θ's gradient comes from
// autograd through the rotation, which is applied (as common/rotation.h, (R1)) before the
// Function, so the kernel and the cross blocks see the same q', k'.
//
// Cross blocks are computed in query tiles of about 2^21 logits, with Eigen's GEMM for the
// products and ATen for the element-wise work (the softmax of a row uses ℓ' = ℓ − c_i, see
// cross_logits).
//
// Communication (c10d point-to-point on the group): rank b sends each later rank r the rows of its
// keys that r's queries can see, [max(s_b, reach(s_r)), e_b), as four messages (k', v, G, b);
// r receives the blocks in the order b = r − 1, r − 2, ... (the next one in flight while one is
// computed) and holds one or two at a time. The backward sends the blocks again (nothing is kept
// from the forward) and each reader returns that block's key-side gradients; the owner posts the
// receives of those returns first, so no send waits on a computation.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/eigen.h"
#include "distributed/collectives.h"
#include "phasor/context_parallel.h"
#include "phasor/forgetting_attn.h"
#include "torch/layer_util.h"

namespace phasor::cp {
namespace {

using torch_detail::AutogradContext;
using torch_detail::variable_list;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

constexpr std::int64_t kNoWindow = std::numeric_limits<std::int64_t>::max();

// Message tags: a key block's four tensors (rank b → reader r), and their gradients (r → b).
enum Tag : int {
  kKeys = 0,
  kValues,
  kGateSuffix,
  kKeySlope,
  kdKeys,
  kdValues,
  kdGateSuffix,
  kdKeySlope
};

// Everything about a call that is not a tensor: the group, the options, and the split of the
// sequence over the ranks (the same on every rank). Kept in the autograd context for backward.
struct Setup : torch::CustomClassHolder {
  distributed::ProcessGroupPtr group;
  std::string op;
  Impl impl = Impl::chunk;
  c10::optional<double> scale_arg;  // as given (the kernel resolves it the same way)
  double scale = 1.0;               // resolved
  c10::optional<std::int64_t> window_arg;
  std::int64_t window = kNoWindow;
  std::int64_t block_size = 64;
  int rank = 0, world = 1;
  std::vector<std::int64_t> start;  // world + 1 entries: rank r holds [start[r], start[r + 1])
  std::vector<std::int64_t> cu;     // the global cu_seqlens (empty: each batch row one sequence)
  at::Tensor local_cu;              // cu_seqlens of this rank's slice (undefined: none)
  at::Tensor rank_totals;           // [world, B, HQ] float64: T_m of (2) (world ≥ 3 only)
  std::int64_t B = 0, HQ = 0, H = 0, K = 0, V = 0, G = 1;
  at::ScalarType compute = at::kFloat;
  bool has_a = false, has_b = false;

  std::int64_t length(int r) const { return start[r + 1] - start[r]; }
  std::int64_t local_length() const { return length(rank); }

  // The start of the sequence holding global token i.
  std::int64_t sequence_start(std::int64_t i) const {
    if (cu.empty()) return 0;
    const auto it = std::upper_bound(cu.begin(), cu.end(), i);  // cu[n] ≤ i < cu[n + 1]
    return *(it - 1);
  }
  // (1): the first key query i sees.
  std::int64_t reach(std::int64_t i) const {
    const std::int64_t first = sequence_start(i);
    if (window == kNoWindow || i - first < window) return first;
    return i - window + 1;
  }
  // The rows [first, end) of rank b's keys that rank r > b reads (first == end: none): those some
  // query of r can see. reach() grows with i, so r's first query sees the most.
  std::pair<std::int64_t, std::int64_t> rows(int b, int r) const {
    const std::int64_t end = start[b + 1];
    if (B == 0 || length(r) == 0 || length(b) == 0) return {end, end};
    return {std::min(end, std::max(start[b], reach(start[r]))), end};
  }
  // M_br of (2): [B, HQ] float64.
  at::Tensor between_totals(int b, int r) const {
    at::Tensor m = at::zeros({B, HQ}, at::TensorOptions().dtype(at::kDouble));
    for (int x = b + 1; x < r; ++x) m += rank_totals[x];
    return m;
  }
};

void wait_all(std::vector<WorkPtr>& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

WorkPtr send(const Setup& s, const at::Tensor& t, int peer, Tag tag) {
  std::vector<at::Tensor> list{t};
  return s.group->send(list, peer, tag);
}
WorkPtr recv(const Setup& s, const at::Tensor& t, int peer, Tag tag) {
  std::vector<at::Tensor> list{t};
  return s.group->recv(list, peer, tag);
}

// ---- batched products ---------------------------------------------------------------------------
// The cross blocks' matrix products, by Eigen's GEMM (ATen's CPU matmul in Debian's LibTorch goes
// to a BLAS that is about half as fast at these shapes, single-threaded). a, b: [..., rows, cols]
// with the same leading dimensions, float or double, unit stride along the last dimension
// (anything else is copied first). Returns a contiguous [..., m, n] tensor.
enum class Product { nn, nt, tn };  // a·b, a·bᵀ, aᵀ·b

template <class S>
void batched_product(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, Product op) {
  using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using In = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  using Out = Eigen::Map<Mat>;
  const std::int64_t batch = a.size(0);
  const S* pa = a.data_ptr<S>();
  const S* pb = b.data_ptr<S>();
  S* pc = c.data_ptr<S>();
  for (std::int64_t i = 0; i < batch; ++i) {
    const In A(pa + i * a.stride(0), a.size(1), a.size(2), Eigen::OuterStride<>(a.stride(1)));
    const In Bm(pb + i * b.stride(0), b.size(1), b.size(2), Eigen::OuterStride<>(b.stride(1)));
    Out C(pc + i * c.stride(0), c.size(1), c.size(2));
    if (op == Product::nn) C.noalias() = A * Bm;
    if (op == Product::nt) C.noalias() = A * Bm.transpose();
    if (op == Product::tn) C.noalias() = A.transpose() * Bm;
  }
}

at::Tensor product(const at::Tensor& a, const at::Tensor& b, Product op) {
  auto as_3d = [](const at::Tensor& x) {
    at::Tensor y = x.reshape({-1, x.size(-2), x.size(-1)});
    return y.stride(2) == 1 && y.stride(1) >= y.size(2) ? y : y.contiguous();
  };
  const at::Tensor a3 = as_3d(a), b3 = as_3d(b);
  const std::int64_t m = op == Product::tn ? a3.size(2) : a3.size(1);
  const std::int64_t n = op == Product::nt ? b3.size(1) : b3.size(2);
  at::Tensor c = at::empty({a3.size(0), m, n}, a3.options());
  if (a3.scalar_type() == at::kDouble)
    batched_product<double>(a3, b3, c, op);
  else
    batched_product<float>(a3, b3, c, op);
  std::vector<std::int64_t> sizes(a.sizes().begin(), a.sizes().end() - 2);
  sizes.push_back(m);
  sizes.push_back(n);
  return c.view(sizes);
}

// This rank's keys in the message layout, token-major so that a run of rows is contiguous:
// k' [T_r, B, H, K], v [T_r, B, H, V] (compute type), G [T_r, B, HQ] and b [T_r, B, H] (float64).
struct OwnKeys {
  at::Tensor k, v, gate_suffix, key_slope;
};

OwnKeys pack_own_keys(const Setup& s, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                      const at::Tensor& b) {
  OwnKeys own;
  own.k = k.permute({1, 0, 2, 3}).contiguous();
  own.v = v.permute({1, 0, 2, 3}).contiguous();
  // G_j = Σ_{l > j} g_l over this rank: a reverse inclusive sum of the gates shifted by one.
  const at::Tensor gd = g.to(at::kDouble).permute({1, 0, 2});  // [T_r, B, HQ]
  at::Tensor shifted = at::zeros_like(gd);
  if (s.local_length() > 1)
    shifted.narrow(0, 0, s.local_length() - 1).copy_(gd.narrow(0, 1, s.local_length() - 1));
  own.gate_suffix = shifted.flip({0}).cumsum(0).flip({0}).contiguous();
  if (b.defined()) own.key_slope = b.to(at::kDouble).permute({1, 0, 2}).contiguous();
  return own;
}

// Posts the sends of this rank's visible rows to every later rank.
std::vector<WorkPtr> send_own_keys(const Setup& s, const OwnKeys& own) {
  std::vector<WorkPtr> works;
  for (int r = s.rank + 1; r < s.world; ++r) {
    const auto [first, end] = s.rows(s.rank, r);
    if (first == end) continue;
    const std::int64_t off = first - s.start[s.rank], n = end - first;
    works.push_back(send(s, own.k.narrow(0, off, n), r, kKeys));
    works.push_back(send(s, own.v.narrow(0, off, n), r, kValues));
    works.push_back(send(s, own.gate_suffix.narrow(0, off, n), r, kGateSuffix));
    if (s.has_b) works.push_back(send(s, own.key_slope.narrow(0, off, n), r, kKeySlope));
  }
  return works;
}

// A block of an earlier rank's keys, received: rows [first, first + n) of the sequence.
struct KeyBlock {
  int owner = 0;
  std::int64_t first = 0, n = 0;
  at::Tensor k, v, gate_suffix, key_slope;  // message layout, as OwnKeys
  std::vector<WorkPtr> pending;

  void wait() { wait_all(pending); }
};

// The blocks this rank reads, nearest first.
std::vector<int> blocks_to_read(const Setup& s) {
  std::vector<int> owners;
  for (int b = s.rank - 1; b >= 0; --b) {
    const auto [first, end] = s.rows(b, s.rank);
    if (first != end) owners.push_back(b);
  }
  return owners;
}

KeyBlock post_receive(const Setup& s, int b) {
  KeyBlock kb;
  kb.owner = b;
  const auto [first, end] = s.rows(b, s.rank);
  kb.first = first, kb.n = end - first;
  const auto opt = at::TensorOptions().dtype(s.compute);
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  kb.k = at::empty({kb.n, s.B, s.H, s.K}, opt);
  kb.v = at::empty({kb.n, s.B, s.H, s.V}, opt);
  kb.gate_suffix = at::empty({kb.n, s.B, s.HQ}, dbl);
  kb.pending.push_back(recv(s, kb.k, b, kKeys));
  kb.pending.push_back(recv(s, kb.v, b, kValues));
  kb.pending.push_back(recv(s, kb.gate_suffix, b, kGateSuffix));
  if (s.has_b) {
    kb.key_slope = at::empty({kb.n, s.B, s.H}, dbl);
    kb.pending.push_back(recv(s, kb.key_slope, b, kKeySlope));
  }
  return kb;
}

// A received block in the compute layout: heads first, the group of a key head as its own axis.
struct BlockView {
  at::Tensor k;           // [B, H, n, K]
  at::Tensor v;           // [B, H, n, V]
  at::Tensor gate_col;    // [B, H, G, 1, n] float64: G_j of (2)
  at::Tensor gate_col_c;  // the same in the compute type
  at::Tensor between;     // [B, H, G, 1] float64: M_br of (2)
  at::Tensor key_slope;   // [B, H, 1, 1, n] float64, or undefined
  at::Tensor position;    // [n] int64: global key indices
  std::int64_t first = 0;
};

BlockView view_block(const Setup& s, const KeyBlock& kb) {
  BlockView bv;
  bv.k = kb.k.permute({1, 2, 0, 3}).contiguous();
  bv.v = kb.v.permute({1, 2, 0, 3}).contiguous();
  bv.between = s.between_totals(kb.owner, s.rank).view({s.B, s.H, s.G, 1});
  bv.gate_col =
      kb.gate_suffix.view({kb.n, s.B, s.H, s.G}).permute({1, 2, 3, 0}).unsqueeze(3).contiguous();
  bv.gate_col_c = bv.gate_col.to(s.compute);
  if (s.has_b) bv.key_slope = kb.key_slope.permute({1, 2, 0}).reshape({s.B, s.H, 1, 1, kb.n});
  bv.position = at::arange(kb.first, kb.first + kb.n, at::TensorOptions().dtype(at::kLong));
  bv.first = kb.first;
  return bv;
}

// The query side of this rank in the compute layout.
struct Queries {
  at::Tensor q;         // [B, H, G, T_r, K], times scale
  at::Tensor prefix;    // [B, H, G, T_r] float64: A_i of (2)
  at::Tensor slope;     // [B, H, G, T_r] float64, or undefined
  at::Tensor position;  // [T_r] int64: global query indices
  at::Tensor reach;     // [T_r] int64: (1)
  std::vector<std::int64_t> reach_host;
};

Queries make_queries(const Setup& s, const at::Tensor& q, const at::Tensor& g,
                     const at::Tensor& a) {
  const std::int64_t T = s.local_length();
  Queries qs;
  // scale q_i (as the kernels do): then dk'_j = Σ_i dℓ_ij (scale q'_i).
  qs.q = (q.reshape({s.B, T, s.H, s.G, s.K}) * s.scale).permute({0, 2, 3, 1, 4}).contiguous();
  qs.prefix =
      g.to(at::kDouble).cumsum(1).view({s.B, T, s.H, s.G}).permute({0, 2, 3, 1}).contiguous();
  if (a.defined())
    qs.slope = a.to(at::kDouble).reshape({s.B, T, s.H, s.G}).permute({0, 2, 3, 1}).contiguous();
  qs.position =
      at::arange(s.start[s.rank], s.start[s.rank + 1], at::TensorOptions().dtype(at::kLong));
  std::vector<std::int64_t> reach(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t)
    reach[static_cast<std::size_t>(t)] = s.reach(s.start[s.rank] + t);
  qs.reach = at::tensor(reach, at::TensorOptions().dtype(at::kLong));
  qs.reach_host = std::move(reach);
  return qs;
}

// Query tiles bound the logits of a cross block to about 2^21 elements per tile.
std::int64_t query_tile(const Setup& s, std::int64_t n) {
  const std::int64_t per_row = std::max<std::int64_t>(1, s.B * s.HQ * n);
  return std::max<std::int64_t>(16, (std::int64_t{1} << 21) / per_row);
}

// The logits of query rows [i0, i0 + tq) against a block, split by (2) into a part that varies
// along the row and a row constant:
//   ℓ_ij = ℓ'_ij + c_i,  ℓ'_ij = scale q'_i·k'_j + G_j − (i − j)(a_i + b_j),  c_i = A_i + M_br,
// ℓ' [B, H, G, tq, n] in the compute type (−inf where (1) hides the key; with slopes the pair term
// is formed with G_j in float64 and rounded once), c [B, H, G, tq] in float64. The softmax of a
// row is that of ℓ'; c only shifts its log-sum-exp. The gate terms are all ≤ 0, so rounding G_j
// and c_i apart costs what the kernels' one rounding of their sum costs.
struct Logits {
  at::Tensor logits;    // ℓ' [B, H, G, tq, n]
  at::Tensor row;       // c [B, H, G, tq] float64
  at::Tensor distance;  // [tq, n] compute type: i − j (slopes only)
};

Logits cross_logits(const Setup& s, const Queries& qs, const BlockView& bv, std::int64_t i0,
                    std::int64_t tq) {
  const std::int64_t n = bv.k.size(2);
  const at::Tensor qt = qs.q.narrow(3, i0, tq).reshape({s.B, s.H, s.G * tq, s.K});
  Logits out;
  out.logits = product(qt, bv.k, Product::nt).view({s.B, s.H, s.G, tq, n});
  out.row = qs.prefix.narrow(3, i0, tq) + bv.between;
  if (s.has_a || s.has_b) {
    const at::Tensor qpos = qs.position.narrow(0, i0, tq);
    const at::Tensor distance = (qpos.unsqueeze(1) - bv.position.unsqueeze(0)).to(at::kDouble);
    at::Tensor slopes;  // a_i + b_j
    if (s.has_a) slopes = qs.slope.narrow(3, i0, tq).unsqueeze(-1);
    if (s.has_b) slopes = slopes.defined() ? slopes + bv.key_slope : bv.key_slope;
    out.logits.add_((bv.gate_col - distance * slopes).to(s.compute));
    out.distance = distance.to(s.compute);
  } else {
    out.logits.add_(bv.gate_col_c);
  }
  // reach() grows along the rows: unless the tile's last query reaches past the block's first
  // key, every query of the tile sees every key of the block.
  if (qs.reach_host[static_cast<std::size_t>(i0 + tq - 1)] > bv.first) {
    const at::Tensor hidden = bv.position.unsqueeze(0) < qs.reach.narrow(0, i0, tq).unsqueeze(1);
    out.logits.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
  }
  return out;
}

at::Tensor to_work(const Setup& s, const at::Tensor& x) {  // [B, T, HQ, D] → [B, H, G, T, D]
  return x.reshape({s.B, x.size(1), s.H, s.G, x.size(3)}).permute({0, 2, 3, 1, 4}).contiguous();
}
at::Tensor from_work(const Setup& s, const at::Tensor& x) {  // [B, H, G, T, D] → [B, T, HQ, D]
  return x.permute({0, 3, 1, 2, 4}).reshape({s.B, x.size(3), s.HQ, x.size(4)});
}
at::Tensor rows_to_work(const Setup& s, const at::Tensor& x) {  // [B, T, HQ] → [B, H, G, T]
  return x.reshape({s.B, x.size(1), s.H, s.G}).permute({0, 2, 3, 1}).contiguous();
}
at::Tensor rows_from_work(const Setup& s, const at::Tensor& x) {  // [B, H, G, T] → [B, T, HQ]
  return x.permute({0, 3, 1, 2}).reshape({s.B, x.size(3), s.HQ});
}

ForgettingAttnParams kernel_params(const Setup& s, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& g, const at::Tensor& a,
                                   const at::Tensor& b) {
  using torch_detail::compute_view_of;
  ForgettingAttnParams p;
  p.q = compute_view_of(q), p.k = compute_view_of(k), p.v = compute_view_of(v);
  p.g = compute_view_of(g);
  p.cu_seqlens = compute_view_of(s.local_cu);
  if (s.scale_arg) p.scale = *s.scale_arg;
  if (s.window_arg) p.window_size = *s.window_arg;
  p.block_size = s.block_size;
  p.bias_q_slope = compute_view_of(a);
  p.bias_k_slope = compute_view_of(b);
  return p;
}

struct CrossForgettingAttn : torch::autograd::Function<CrossForgettingAttn> {
  // q, k: rotated, and with v in the compute type; a, b: the slopes (may be undefined).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g,
                               const c10::optional<at::Tensor>& a_in,
                               const c10::optional<at::Tensor>& b_in,
                               const c10::intrusive_ptr<Setup>& setup) {
    const Setup& s = *setup;
    const at::Tensor a = torch_detail::value_or_undefined(a_in);
    const at::Tensor b = torch_detail::value_or_undefined(b_in);
    const std::int64_t T = s.local_length();
    const auto opt = q.options().dtype(s.compute);
    at::Tensor o = at::zeros({s.B, T, s.HQ, s.V}, opt);
    at::Tensor lse = at::zeros({s.B, T, s.HQ}, opt);
    if (T > 0 && s.B > 0) {
      torch_detail::rethrow_as_torch([&] {
        forgetting_attn_forward(kernel_params(s, q, k, v, g, a, b), s.impl,
                                torch_detail::compute_out_view_of(o),
                                torch_detail::compute_out_view_of(lse));
      });
    }
    OwnKeys own;  // alive until its sends are done
    std::vector<WorkPtr> sends;
    if (s.rank + 1 < s.world) own = pack_own_keys(s, k, v, g, b), sends = send_own_keys(s, own);

    const std::vector<int> owners = blocks_to_read(s);
    if (!owners.empty()) {
      const Queries qs = make_queries(s, q, g, a);
      at::Tensor ow = to_work(s, o), lw = rows_to_work(s, lse);
      KeyBlock next = post_receive(s, owners[0]);
      for (std::size_t idx = 0; idx < owners.size(); ++idx) {
        KeyBlock block = std::move(next);
        block.wait();
        if (idx + 1 < owners.size()) next = post_receive(s, owners[idx + 1]);
        const BlockView bv = view_block(s, block);
        const std::int64_t tile = query_tile(s, block.n);
        for (std::int64_t i0 = 0; i0 < T; i0 += tile) {
          const std::int64_t tq = std::min(tile, T - i0);
          const Logits lg = cross_logits(s, qs, bv, i0, tq);
          // (3) with ℓ = ℓ' + c: m = max_j ℓ', E = e^{ℓ' − m}, lse_B = m + c + log Σ_j E,
          // lse' = logaddexp(lse, lse_B), o' = e^{lse − lse'} o + e^{m + c − lse'} E V.
          at::Tensor e = lg.logits;
          at::Tensor m = std::get<0>(e.max(-1));
          m.masked_fill_(at::isinf(m), 0);  // a row without a visible key: E = 0
          e.sub_(m.unsqueeze(-1)).exp_();
          const at::Tensor shift = m.to(at::kDouble) + lg.row;  // m + c
          const at::Tensor lse_block = e.sum(-1).log().to(at::kDouble) + shift;
          at::Tensor lse_rows = lw.narrow(3, i0, tq), o_rows = ow.narrow(3, i0, tq);
          const at::Tensor lse_prev = lse_rows.to(at::kDouble);
          const at::Tensor merged = at::logaddexp(lse_prev, lse_block);
          const at::Tensor ev = product(e.view({s.B, s.H, s.G * tq, block.n}), bv.v, Product::nn)
                                    .view({s.B, s.H, s.G, tq, s.V});
          o_rows.mul_((lse_prev - merged).exp().to(s.compute).unsqueeze(-1))
              .add_(ev.mul_((shift - merged).exp().to(s.compute).unsqueeze(-1)));
          lse_rows.copy_(merged);
        }
      }
      o = from_work(s, ow);
      lse = rows_from_work(s, lw);
    }
    wait_all(sends);

    ctx->save_for_backward({q, k, v, g, a, b, o, lse});
    ctx->saved_data["setup"] = c10::IValue::make_capsule(setup);
    ctx->set_materialize_grads(false);
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto setup =
        c10::static_intrusive_pointer_cast<Setup>(ctx->saved_data["setup"].toCapsule());
    const Setup& s = *setup;
    torch_detail::check_first_order(s.op);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &a = saved[4],
                     &b = saved[5], &o = saved[6], &lse = saved[7];
    const std::int64_t T = s.local_length();
    at::Tensor d_o = torch_detail::incoming_grad(grads, 0);
    if (!d_o.defined()) d_o = at::zeros_like(o);
    d_o = d_o.to(s.compute);

    const auto dbl = at::TensorOptions().dtype(at::kDouble);
    at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    at::Tensor dg = at::zeros({s.B, T, s.HQ}, dbl);
    at::Tensor da = s.has_a ? at::zeros({s.B, T, s.HQ}, dbl) : at::Tensor();
    at::Tensor db = s.has_b ? at::zeros({s.B, T, s.H}, dbl) : at::Tensor();
    // The returns of this rank's key-side gradients, posted before anything waits.
    struct Return {
      std::int64_t first, n;
      at::Tensor dk, dv, dgate, dslope;
    };
    std::vector<Return> returns;
    std::vector<WorkPtr> return_recvs;
    for (int r = s.rank + 1; r < s.world; ++r) {
      const auto [first, end] = s.rows(s.rank, r);
      if (first == end) continue;
      Return ret{first,
                 end - first,
                 at::empty({end - first, s.B, s.H, s.K}, k.options()),
                 at::empty({end - first, s.B, s.H, s.V}, v.options()),
                 at::empty({end - first, s.B, s.HQ}, dbl),
                 at::Tensor()};
      return_recvs.push_back(recv(s, ret.dk, r, kdKeys));
      return_recvs.push_back(recv(s, ret.dv, r, kdValues));
      return_recvs.push_back(recv(s, ret.dgate, r, kdGateSuffix));
      if (s.has_b) {
        ret.dslope = at::empty({end - first, s.B, s.H}, dbl);
        return_recvs.push_back(recv(s, ret.dslope, r, kdKeySlope));
      }
      returns.push_back(std::move(ret));
    }
    OwnKeys own;  // alive until its sends are done
    std::vector<WorkPtr> sends;
    if (s.rank + 1 < s.world) own = pack_own_keys(s, k, v, g, b), sends = send_own_keys(s, own);

    at::Tensor cross_dq, cross_row_sums, cross_da;  // [B, T_r, ...]: the cross blocks' shares
    // dM_br summed into the whole-rank table: row m gets dM_br for b < m < r (= this rank).
    at::Tensor rank_table = at::zeros({s.world, s.B, s.HQ}, dbl);
    const std::vector<int> owners = blocks_to_read(s);
    if (!owners.empty()) {
      const Queries qs = make_queries(s, q, g, a);
      const at::Tensor do_w = to_work(s, d_o);
      // D_i = do_i·o_i with the merged o.
      const at::Tensor delta = (do_w * to_work(s, o)).sum(-1);
      const at::Tensor lse_w = rows_to_work(s, lse);
      at::Tensor dq_w = at::zeros_like(qs.q);
      at::Tensor dprefix = at::zeros({s.B, s.H, s.G, T}, dbl);
      at::Tensor dslope_q = s.has_a ? at::zeros({s.B, s.H, s.G, T}, dbl) : at::Tensor();
      std::vector<WorkPtr> grad_sends;
      std::vector<at::Tensor> grad_buffers;
      KeyBlock next = post_receive(s, owners[0]);
      for (std::size_t idx = 0; idx < owners.size(); ++idx) {
        KeyBlock block = std::move(next);
        block.wait();
        if (idx + 1 < owners.size()) next = post_receive(s, owners[idx + 1]);
        const BlockView bv = view_block(s, block);
        const std::int64_t n = block.n;
        at::Tensor dk_b = at::zeros({s.B, s.H, n, s.K}, bv.k.options());
        at::Tensor dv_b = at::zeros({s.B, s.H, n, s.V}, bv.v.options());
        at::Tensor dgate_b = at::zeros({s.B, s.H, s.G, n}, dbl);
        at::Tensor dslope_b = s.has_b ? at::zeros({s.B, s.H, n}, dbl) : at::Tensor();
        at::Tensor dm = at::zeros({s.B, s.H, s.G}, dbl);
        const std::int64_t tile = query_tile(s, n);
        for (std::int64_t i0 = 0; i0 < T; i0 += tile) {
          const std::int64_t tq = std::min(tile, T - i0);
          const Logits lg = cross_logits(s, qs, bv, i0, tq);
          // P = e^{ℓ' − (lse − c)} (clamped at 1 like the kernels: exactly, ℓ ≤ lse).
          const at::Tensor offset =
              (lse_w.narrow(3, i0, tq).to(at::kDouble) - lg.row).to(s.compute);
          const at::Tensor p = lg.logits.sub_(offset.unsqueeze(-1)).clamp_max_(0).exp_();
          const at::Tensor do_t = do_w.narrow(3, i0, tq).reshape({s.B, s.H, s.G * tq, s.V});
          // (4): dℓ = P (do·v − D), in the storage of do·v.
          const at::Tensor dl = product(do_t, bv.v, Product::nt)
                                    .view({s.B, s.H, s.G, tq, n})
                                    .sub_(delta.narrow(3, i0, tq).unsqueeze(-1))
                                    .mul_(p);
          const at::Tensor dl_flat = dl.view({s.B, s.H, s.G * tq, n});
          const at::Tensor q_t = qs.q.narrow(3, i0, tq).reshape({s.B, s.H, s.G * tq, s.K});
          dq_w.narrow(3, i0, tq).add_(
              product(dl_flat, bv.k, Product::nn).view({s.B, s.H, s.G, tq, s.K}), s.scale);
          dk_b.add_(product(dl_flat, q_t, Product::tn));  // q_t holds scale q'
          dv_b.add_(product(p.view({s.B, s.H, s.G * tq, n}), do_t, Product::tn));
          const at::Tensor row_sums = at::sum(dl, {-1}, false, at::kDouble);  // dA_i
          dprefix.narrow(3, i0, tq).add_(row_sums);
          dgate_b.add_(at::sum(dl, {-2}, false, at::kDouble));  // dG_j
          dm.add_(row_sums.sum(-1));                            // dM_br
          if (s.has_a || s.has_b) {
            const at::Tensor weighted = dl * lg.distance;  // (i − j) dℓ_ij
            if (s.has_a)
              dslope_q.narrow(3, i0, tq).sub_(at::sum(weighted, {-1}, false, at::kDouble));
            if (s.has_b) dslope_b.sub_(at::sum(weighted, {2, 3}, false, at::kDouble));
          }
        }
        for (int m = block.owner + 1; m < s.rank; ++m) rank_table[m].add_(dm.view({s.B, s.HQ}));
        // Key-side gradients back to the owner, in the message layout.
        wait_all(grad_sends);  // at most one block's returns in flight
        grad_buffers.clear();
        grad_buffers.push_back(dk_b.permute({2, 0, 1, 3}).contiguous());
        grad_buffers.push_back(dv_b.permute({2, 0, 1, 3}).contiguous());
        grad_buffers.push_back(dgate_b.permute({3, 0, 1, 2}).reshape({n, s.B, s.HQ}).contiguous());
        grad_sends.push_back(send(s, grad_buffers[0], block.owner, kdKeys));
        grad_sends.push_back(send(s, grad_buffers[1], block.owner, kdValues));
        grad_sends.push_back(send(s, grad_buffers[2], block.owner, kdGateSuffix));
        if (s.has_b) {
          grad_buffers.push_back(dslope_b.permute({2, 0, 1}).contiguous());
          grad_sends.push_back(send(s, grad_buffers[3], block.owner, kdKeySlope));
        }
      }
      wait_all(grad_sends);
      cross_dq = from_work(s, dq_w);
      cross_row_sums = rows_from_work(s, dprefix);
      if (s.has_a) cross_da = rows_from_work(s, dslope_q);
    }
    // The diagonal block, normalised by the merged lse; a dominant key's dℓ there is formed from
    // the rest of its row, the cross blocks' dA_i included (phasor/forgetting_attn.h).
    if (T > 0 && s.B > 0) {
      torch_detail::rethrow_as_torch([&] {
        ForgettingAttnParams params = kernel_params(s, q, k, v, g, a, b);
        params.dlogit_sums_elsewhere = torch_detail::compute_view_of(cross_row_sums);
        ForgettingAttnGrads out;
        out.dq = torch_detail::compute_out_view_of(dq);
        out.dk = torch_detail::compute_out_view_of(dk);
        out.dv = torch_detail::compute_out_view_of(dv);
        out.dg = torch_detail::compute_out_view_of(dg);
        out.dbias_q_slope = torch_detail::compute_out_view_of(da);
        out.dbias_k_slope = torch_detail::compute_out_view_of(db);
        forgetting_attn_backward(params, s.impl, torch_detail::compute_view_of(d_o),
                                 torch_detail::compute_view_of(o),
                                 torch_detail::compute_view_of(lse), out);
      });
    }
    if (cross_dq.defined()) {
      dq.add_(cross_dq);
      // dg_l += Σ_{i ≥ l} dA_i (this rank's queries).
      dg.add_(cross_row_sums.flip({1}).cumsum(1).flip({1}));
      if (s.has_a) da.add_(cross_da);
    }
    wait_all(sends);
    wait_all(return_recvs);
    if (!returns.empty()) {
      // Key-side gradients from the readers of this rank's keys; dG_j summed over them.
      at::Tensor dgate = at::zeros({T, s.B, s.HQ}, dbl);
      for (const Return& ret : returns) {
        const std::int64_t off = ret.first - s.start[s.rank];
        dk.narrow(1, off, ret.n).add_(ret.dk.permute({1, 0, 2, 3}));
        dv.narrow(1, off, ret.n).add_(ret.dv.permute({1, 0, 2, 3}));
        dgate.narrow(0, off, ret.n).add_(ret.dgate);
        if (s.has_b) db.narrow(1, off, ret.n).add_(ret.dslope.permute({1, 0, 2}));
      }
      // dg_l += Σ_{j < l} dG_j (this rank's keys): an exclusive cumulative sum.
      at::Tensor before = at::zeros_like(dgate);
      if (T > 1) before.narrow(0, 1, T - 1).copy_(dgate.narrow(0, 0, T - 1));
      dg.add_(before.cumsum(0).permute({1, 0, 2}));
    }
    if (s.world >= 3) {  // dg_l += Σ_{b < rank(l) < r} dM_br
      std::vector<at::Tensor> table{rank_table};
      s.group->allreduce(table)->wait();
      if (T > 0) dg.add_(rank_table[s.rank].unsqueeze(1));
    }
    return {dq,
            dk,
            dv,
            dg.to(g.scalar_type()),
            s.has_a ? da.to(a.scalar_type()) : at::Tensor(),
            s.has_b ? db.to(b.scalar_type()) : at::Tensor(),
            at::Tensor()};
  }
};

// ---- argument checks ----------------------------------------------------------------------------

void check_shape(const std::string& op, const char* name, const at::Tensor& t,
                 std::vector<std::int64_t> expected, const char* layout) {
  if (t.sizes() != at::IntArrayRef(expected))
    torch_detail::fail(
        op, name, std::string("shape ") + layout + " = " + torch_detail::shape_string(expected),
        "shape " + torch_detail::shape_of(t));
}

// The checks one rank can make alone; each failure is a c10::Error naming the argument.
void check_local(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, const at::Tensor& g, Impl impl,
                 c10::optional<std::int64_t> window_size, const at::Tensor& cu,
                 std::int64_t block_size, const at::Tensor& theta, const at::Tensor& a,
                 const at::Tensor& b) {
  using torch_detail::check_float;
  if (impl != Impl::chunk && impl != Impl::recurrent)
    torch_detail::fail(
        op, "impl", "Impl::chunk or Impl::recurrent (the diagonal block's kernel)",
        "Impl::reference (its backward recomputes o and lse from its own keys only)");
  if (compute_device() != Device::cpu)
    torch_detail::fail(op, "compute device",
                       "Device::cpu (phasor::set_compute_device; the cross blocks run on the cpu)",
                       std::string("Device::") + to_string(compute_device()));
  check_float(op, "q", q, 4, "[B, T, HQ, K]");
  check_float(op, "k", k, 4, "[B, T, H, K]");
  check_float(op, "v", v, 4, "[B, T, H, V]");
  check_float(op, "g", g, 3, "[B, T, HQ]");
  const std::int64_t B = q.size(0), T = q.size(1), HQ = q.size(2), K = q.size(3), H = k.size(2);
  if (H < 1 || HQ % H != 0)
    torch_detail::fail(op, "k",
                       "a number of key/value heads H >= 1 that divides HQ = " + std::to_string(HQ),
                       "H = " + std::to_string(H));
  check_shape(op, "k", k, {B, T, H, K}, "[B, T, H, K]");
  check_shape(op, "v", v, {B, T, H, v.size(3)}, "[B, T, H, V]");
  check_shape(op, "g", g, {B, T, HQ}, "[B, T, HQ]");
  if (theta.defined()) {
    check_float(op, "theta", theta, 4, "[B, T, H, K/2]");
    if (K % 2 != 0)
      torch_detail::fail(op, "theta", "an even head dimension K when theta is given",
                         "K = " + std::to_string(K));
    check_shape(op, "theta", theta, {B, T, H, K / 2}, "[B, T, H, K/2]");
  }
  if (a.defined()) {
    check_float(op, "bias_q_slope", a, 3, "[B, T, HQ]");
    check_shape(op, "bias_q_slope", a, {B, T, HQ}, "[B, T, HQ]");
    if (!at::isfinite(a).all().item<bool>())
      torch_detail::fail(op, "bias_q_slope", "finite values", "a non-finite value");
  }
  if (b.defined()) {
    check_float(op, "bias_k_slope", b, 3, "[B, T, H]");
    check_shape(op, "bias_k_slope", b, {B, T, H}, "[B, T, H]");
    if (!at::isfinite(b).all().item<bool>())
      torch_detail::fail(op, "bias_k_slope", "finite values", "a non-finite value");
  }
  if (g.numel() > 0 && !(g <= 0).all().item<bool>())
    torch_detail::fail(op, "g", "log forget gates <= 0 (-inf allowed)", "a value > 0 or NaN");
  if (window_size && *window_size < 1)
    torch_detail::fail(op, "window_size", "none (full causal attention) or an integer >= 1",
                       std::to_string(*window_size));
  if (impl == Impl::chunk && block_size < 1)
    torch_detail::fail(op, "block_size", "a positive integer", std::to_string(block_size));
  if (cu.defined()) {
    torch_detail::check_cu_seqlens(op, cu);
    if (B != 1)
      torch_detail::fail(op, "cu_seqlens", "B = 1 with cu_seqlens (packed sequences)",
                         "B = " + std::to_string(B));
    if (cu.numel() < 1)
      torch_detail::fail(op, "cu_seqlens", "at least one offset [N + 1]", "an empty tensor");
    const at::Tensor c = cu.to(at::kLong);
    if (c[0].item<std::int64_t>() != 0)
      torch_detail::fail(op, "cu_seqlens", "cu_seqlens[0] = 0",
                         "cu_seqlens[0] = " + std::to_string(c[0].item<std::int64_t>()));
    if (cu.numel() > 1 &&
        !(c.narrow(0, 1, cu.numel() - 1) >= c.narrow(0, 0, cu.numel() - 1)).all().item<bool>())
      torch_detail::fail(op, "cu_seqlens", "non-decreasing offsets", "a decreasing step");
  }
}

// What every rank sends in the header exchange (collectives.h): its slice length T_r, and what
// all ranks must agree on.
enum Header : int {
  kLength = 0,
  kBatch,
  kQHeads,
  kKHeads,
  kKeyDim,
  kValueDim,
  kDouble,
  kTheta,
  kSlopeQ,
  kSlopeK,
  kCuCount,
  kCuHash,
  kWindow,
  kImpl,
  kLayout,
  kScale,
  kBlock,
  kHeaderSize
};

// RoPE-style rotation (common/rotation.h, (R1)) with LibTorch ops, so autograd gives dθ and the
// kernel and the cross blocks see the same rotated rows. θ [B, T, H, K/2] per key head; `heads`
// rows of x share the θ of their key head (x: [B, T, heads, K], heads a multiple of H). cos θ and
// sin θ as the kernels evaluate them: in float64 and rounded, except float32 compute with
// non-float64 angles (float sin/cos).
at::Tensor rotate(const at::Tensor& x, const at::Tensor& theta, RotaryLayout layout) {
  const std::int64_t group = x.size(2) / theta.size(2), half = x.size(3) / 2;
  at::Tensor angles = theta;
  if (group > 1) angles = angles.repeat_interleave(group, 2);
  const bool float_trig = x.scalar_type() == at::kFloat && theta.scalar_type() != at::kDouble;
  angles = angles.to(float_trig ? at::kFloat : at::kDouble);
  const at::Tensor c = angles.cos().to(x.scalar_type()), sn = angles.sin().to(x.scalar_type());
  at::Tensor xa, xb;
  if (layout == RotaryLayout::half_split) {
    xa = x.narrow(3, 0, half), xb = x.narrow(3, half, half);
  } else {
    const at::Tensor pairs = x.view({x.size(0), x.size(1), x.size(2), half, 2});
    xa = pairs.select(4, 0), xb = pairs.select(4, 1);
  }
  const at::Tensor ya = xa * c - xb * sn, yb = xa * sn + xb * c;
  if (layout == RotaryLayout::half_split) return at::cat({ya, yb}, 3);
  return at::stack({ya, yb}, 4).view(x.sizes());
}

}  // namespace

at::Tensor forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& g, Impl impl, c10::optional<double> scale,
                           c10::optional<std::int64_t> window_size,
                           const c10::optional<at::Tensor>& cu_seqlens, std::int64_t block_size,
                           const c10::optional<at::Tensor>& theta_in, RotaryLayout rotary_layout,
                           const c10::optional<at::Tensor>& bias_q_slope,
                           const c10::optional<at::Tensor>& bias_k_slope,
                           const distributed::ProcessGroupPtr& group) {
  const std::string op = "cp::" + torch_detail::forgetting_attn_op_name(impl);
  TORCH_CHECK(group, op, ": argument 'group': expected a process group, got none");
  const at::Tensor cu = torch_detail::value_or_undefined(cu_seqlens);
  const at::Tensor theta = torch_detail::value_or_undefined(theta_in);
  const at::Tensor a = torch_detail::value_or_undefined(bias_q_slope);
  const at::Tensor b = torch_detail::value_or_undefined(bias_k_slope);
  const int rank = group->getRank(), world = group->getSize();

  // Every rank checks its own input, then all exchange what they must agree on, so bad input on
  // one rank stops every rank with an error (none is left waiting in a collective).
  std::string local_error;
  try {
    check_local(op, q, k, v, g, impl, window_size, cu, block_size, theta, a, b);
  } catch (const c10::Error& e) {
    local_error = e.what_without_backtrace();
  }
  // The global offsets, read once: the header's fingerprint and the setup both use them.
  at::Tensor cu_long;
  std::vector<std::int64_t> offsets;
  if (local_error.empty() && cu.defined()) {
    cu_long = cu.to(at::kLong).contiguous();
    offsets.assign(cu_long.data_ptr<std::int64_t>(),
                   cu_long.data_ptr<std::int64_t>() + cu_long.numel());
  }
  std::vector<std::int64_t> fields(kHeaderSize, 0);
  if (local_error.empty()) {
    fields[kLength] = q.size(1);
    fields[kBatch] = q.size(0), fields[kQHeads] = q.size(2), fields[kKHeads] = k.size(2);
    fields[kKeyDim] = q.size(3), fields[kValueDim] = v.size(3);
    fields[kDouble] = q.scalar_type() == at::kDouble;
    fields[kTheta] = theta.defined(), fields[kSlopeQ] = a.defined(), fields[kSlopeK] = b.defined();
    fields[kCuCount] = cu.defined() ? cu.numel() : -1;
    if (cu.defined()) fields[kCuHash] = detail::fingerprint(&offsets);
    fields[kWindow] = window_size ? *window_size : -1;
    fields[kImpl] = static_cast<std::int64_t>(impl);
    fields[kLayout] = static_cast<std::int64_t>(rotary_layout);
    fields[kScale] = detail::double_bits(scale);
    fields[kBlock] = block_size;
  }
  const auto all = detail::exchange_header(group, fields, local_error);
  detail::check_agreement(op, all,
                          {{kBatch, "q", "batch size B"},
                           {kQHeads, "q", "number of query heads HQ"},
                           {kKHeads, "k", "number of key heads H"},
                           {kKeyDim, "q", "key dimension K"},
                           {kValueDim, "v", "value dimension V"},
                           {kDouble, "q", "compute type (1: float64)"},
                           {kTheta, "theta", "presence (1: given)"},
                           {kSlopeQ, "bias_q_slope", "presence (1: given)"},
                           {kSlopeK, "bias_k_slope", "presence (1: given)"},
                           {kCuCount, "cu_seqlens", "number of offsets (-1: none)"},
                           {kCuHash, "cu_seqlens", "global offsets (fingerprint)"},
                           {kWindow, "window_size", "value (-1: none)"},
                           {kImpl, "impl", "value (as a number)"},
                           {kLayout, "rotary_layout", "value (as a number)"},
                           {kScale, "scale", "value (its bits; -1: default)"},
                           {kBlock, "block_size", "value"}});

  auto setup = c10::make_intrusive<Setup>();
  Setup& s = *setup;
  s.group = group, s.op = op, s.impl = impl;
  s.scale_arg = scale, s.window_arg = window_size, s.block_size = block_size;
  s.window = window_size ? *window_size : kNoWindow;
  s.rank = rank, s.world = world;
  s.start.assign(static_cast<std::size_t>(world) + 1, 0);
  for (int r = 0; r < world; ++r)
    s.start[r + 1] = s.start[r] + all[static_cast<std::size_t>(r)][kLength];
  s.B = q.size(0), s.HQ = q.size(2), s.H = k.size(2), s.K = q.size(3), s.V = v.size(3);
  s.G = s.HQ / s.H;
  s.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(s.K));
  s.compute = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  s.has_a = a.defined(), s.has_b = b.defined();
  if (cu.defined()) {
    s.cu = std::move(offsets);
    if (s.cu.back() != s.start[world])
      torch_detail::fail(
          op, "cu_seqlens",
          "cu_seqlens[N] = the total length over the ranks, " + std::to_string(s.start[world]),
          std::to_string(s.cu.back()));
    s.local_cu = (cu_long - s.start[rank]).clamp(0, s.local_length());
  }
  if (world >= 3) {  // T_m of (2): every rank's gate totals
    const at::Tensor total = g.to(at::kDouble).sum(1).contiguous();  // [B, HQ]
    s.rank_totals = at::stack(detail::allgather(group, total));
  }

  // Rotation, then the compute type, by differentiable ops: their gradients reach q, k, θ.
  at::Tensor qc = q.to(s.compute), kc = k.to(s.compute);
  if (theta.defined()) qc = rotate(qc, theta, rotary_layout), kc = rotate(kc, theta, rotary_layout);
  const variable_list out =
      CrossForgettingAttn::apply(qc, kc, v.to(s.compute), g, bias_q_slope, bias_k_slope, setup);
  return torch_detail::in_dtype_of(out[0], q);
}

at::Tensor parallel_forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, c10::optional<double> scale,
                                    c10::optional<std::int64_t> window_size,
                                    const c10::optional<at::Tensor>& cu_seqlens,
                                    std::int64_t block_size, const c10::optional<at::Tensor>& theta,
                                    RotaryLayout rotary_layout,
                                    const c10::optional<at::Tensor>& bias_q_slope,
                                    const c10::optional<at::Tensor>& bias_k_slope,
                                    const distributed::ProcessGroupPtr& group) {
  return forgetting_attn(q, k, v, g, Impl::chunk, scale, window_size, cu_seqlens, block_size, theta,
                         rotary_layout, bias_q_slope, bias_k_slope, group);
}

}  // namespace phasor::cp
