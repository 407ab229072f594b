// Context-parallel GLA, Gated DeltaNet and Selective RoPE phases (phasor/context_parallel.h): the
// single-process LibTorch ops on each rank's slice, an affine scan of the carried states over the
// ranks through c10d, and a correction of each slice's outputs. No new kernel.
//
// ---- The equations ------------------------------------------------------------------------------
// Both recurrences act on the state S [K, V] (per head) column by column with the same linear map:
//   GLA:            S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,            o_t = scale · S_tᵀ q'_t
//   Gated DeltaNet: S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,  o_t = scale · S_tᵀ q'_t
// (q', k' rotated by θ_t when theta is given; the state is in the frame of zero angles.) On one
// piece of a sequence (the tokens of that sequence on one rank), starting from S_in:
//   S_t = S⁰_t + P_{≤t} S_in,   P_{≤t} = Π_{s ≤ t} (the homogeneous map of token s)    [K, K]
//   o_t = o⁰_t + S_inᵀ A_t,     A_t = scale · P_{≤t}ᵀ q'_t                             [K]
//   S_out = S⁰ + P S_in,        P = P_{≤last}
// where o⁰, S⁰ are the results from S_in = 0. Running the op on the augmented values
// v_aug = [v | 0_K] (V + K columns) from the state [0 | I_K] gives, column block by column block,
// o_aug = [o⁰ | A] and S_aug = [S⁰ | P] (the last K columns start at I and receive no values, so
// they are P_{≤t} I). A piece that starts its sequence on this rank needs neither: it runs from h0
// with the plain values (its A and P are 0 and its outputs are final). GLA's transition is
// diagonal, P_{≤t} = diag(exp(G_t)) with G_t = Σ_{s ≤ t} g_s, so for GLA A_t = scale · exp(G_t) ⊙
// q'_t comes from elementwise ops and the op always runs on the plain values.
//
// Forward scan. C_r = the state carried out of rank r's slice into the next rank (of the sequence
// that runs on past the end of the slice; 0 when none does):
//   C_r = M_r C_{r−1} + c_r,   C_{−1} = 0,
//   (M_r, c_r) = (I, 0) for an empty slice; (P, S⁰) of the slice's last piece when its sequence
//   goes on past the slice (P = 0 when that piece started its sequence here); (0, 0) otherwise.
// Rank r allgathers every (M_j, c_j) and composes those of j < r to get S_in = C_{r−1}, then
//   o_t = o⁰_t + S_inᵀ A_t   (the tokens of the first piece, when it continues a sequence)
//   final_n = S⁰_n + P_n S_in  on the rank holding the last token of sequence n (P_n = 0 unless
//   that piece is the first one and continues), the initial state for an empty sequence (rank 0),
//   then an allreduce(sum) so that every rank holds every final state.
//
// Backward (loss L; do this slice's gradient of o, dF the gradient of the replicated final state,
// the same on every rank and counted once, on the rank holding the sequence's last token).
// G_r = ∂L/∂C_r:
//   G_{r−1} = M_rᵀ G_r + Λ_r,   G_{R−1} = 0,
//   Λ_r = ∂L/∂S_in through rank r's own outputs = Σ_t A_t do_tᵀ + Σ_{n owned, continuing} P_nᵀ dF_n
// (a reverse affine scan; Λ_r is allgathered, the M_j kept from the forward scan). Then one
// backward call of the augmented op with
//   ∂L/∂o_aug = [do | S_in do_t] per token  (∂L/∂A_t = S_in do_t),
//   ∂L/∂S_aug = [G | G S_inᵀ] for the last piece when it carries on, [dF_n | dF_n S_inᵀ] for the
//   piece that ends sequence n (S_in = 0 for a piece that started its sequence here),
// gives dq, dk, dv (the first V columns), dg, dbeta, dtheta and the gradient of the h0 that entered
// here; an allreduce sums d(initial_state) over the ranks (rank 0 adds dF_n of empty sequences).
//
// Selective RoPE phases are the same scan with P = I and A_t = ω (elementwise): θ_t = θ⁰_t + ω ⊙
// S_in on the continuing piece, the carried phase C_r = (Σ φ over the last piece) + M_r C_{r−1}.
//
// Communication per call and rank: one allgather of a small header (lengths and the arguments
// that must agree), one allgather of the R maps (R·L·H·K·(K + V) numbers, R·L·H·K·(1 + V) for
// GLA's diagonal maps: O(R), where a Hillis–Steele scan of send/recv would take O(log R) rounds of
// one map each), one allreduce of the final states; backward: one allgather of the R maps Λ_r
// (R·L·H·K·V numbers) and one allreduce of d(initial_state).
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "distributed/collectives.h"
#include "phasor/context_parallel.h"
#include "phasor/ops.h"
#include "torch/layer_util.h"

namespace phasor::cp {
namespace {

using detail::AgreedField;
using detail::allgather;
using detail::allreduce_sum;
using detail::check_agreement;
using detail::double_bits;
using detail::error_of;
using detail::exchange_header;
using detail::fingerprint;
// The LibTorch layer's message helpers: "<op>: argument '<name>': expected <...>, got <...>".
using torch_detail::fail;
using torch_detail::shape_of;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- messages and checks ------------------------------------------------------------------------

std::string shape_string(const std::vector<std::int64_t>& sizes,
                         const std::vector<std::string>& names) {
  std::ostringstream s;
  s << "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) s << ", ";
    if (!names[i].empty()) s << names[i] << "=";
    s << sizes[i];
  }
  s << "]";
  return s.str();
}

bool is_float(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16;
}

// A defined, dense CPU floating tensor of the given sizes (-1: any).
void check_float(const std::string& op, const std::string& name, const at::Tensor& t,
                 const std::vector<std::int64_t>& sizes, const std::vector<std::string>& names) {
  const std::string layout = shape_string(sizes, names);
  if (!t.defined()) fail(op, name, "a tensor " + layout, "an undefined tensor");
  if (!t.device().is_cpu())
    fail(op, name, "a tensor on the cpu", "a tensor on " + t.device().str());
  if (t.layout() != at::kStrided) fail(op, name, "a dense (strided) tensor", "a sparse tensor");
  if (!is_float(t))
    fail(op, name, "a floating dtype (float32, float64, float16 or bfloat16)",
         std::string("dtype ") + c10::toString(t.scalar_type()));
  bool ok = t.dim() == static_cast<std::int64_t>(sizes.size());
  for (std::size_t d = 0; ok && d < sizes.size(); ++d)
    ok = sizes[d] < 0 || t.size(static_cast<std::int64_t>(d)) == sizes[d];
  if (!ok) fail(op, name, "shape " + layout, "shape " + shape_of(t));
}

// The global cu_seqlens as a vector, checked: 1-D int32/int64, cu[0] = 0, non-decreasing.
std::vector<std::int64_t> read_cu_seqlens(const std::string& op, const at::Tensor& cu,
                                          std::int64_t batch) {
  if (!cu.device().is_cpu())
    fail(op, "cu_seqlens", "a tensor on the cpu", "a tensor on " + cu.device().str());
  if (cu.dim() != 1 || cu.numel() < 1)
    fail(op, "cu_seqlens", "a 1-D tensor [N + 1] of global offsets", "shape " + shape_of(cu));
  if (cu.scalar_type() != at::kInt && cu.scalar_type() != at::kLong)
    fail(op, "cu_seqlens", "dtype int32 or int64",
         std::string("dtype ") + c10::toString(cu.scalar_type()));
  if (batch != 1)
    fail(op, "cu_seqlens", "a batch of B = 1 with cu_seqlens (the sequences packed along T)",
         "B = " + std::to_string(batch));
  const at::Tensor c = cu.to(at::kLong).contiguous();
  const std::int64_t* p = c.data_ptr<std::int64_t>();
  std::vector<std::int64_t> out(p, p + c.numel());
  if (out[0] != 0) fail(op, "cu_seqlens", "cu_seqlens[0] = 0", std::to_string(out[0]));
  for (std::size_t i = 1; i < out.size(); ++i)
    if (out[i] < out[i - 1])
      fail(op, "cu_seqlens", "non-decreasing offsets",
           "cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(out[i]) + " < cu_seqlens[" +
               std::to_string(i - 1) + "] = " + std::to_string(out[i - 1]));
  return out;
}

// ---- collectives --------------------------------------------------------------------------------

// After a collective that carried a failure flag: every rank throws when any failed.
void throw_if_any_failed(const std::string& op, const std::vector<int>& failed_ranks,
                         const std::string& own_error) {
  if (failed_ranks.empty()) return;
  if (!own_error.empty()) TORCH_CHECK(false, own_error);
  TORCH_CHECK(false, op, ": the single-process op failed on rank ", failed_ranks.front(),
              " (that rank's error says why)");
}

// ---- token-layout products ---------------------------------------------------------------------
// Per (lane b, head h) products on the [B, n, Hs, ·] token layout, one GEMM per pair: BLAS takes
// the strided [n, ·] slice of one head as it is (no permuted copies, as einsum would make).

// out[b, t, h, :] += A[b, t, h, :] S[b, h] (o_t += S_inᵀ A_t), in place on out (dtype of S).
void add_a_times_state(const at::Tensor& out, const at::Tensor& a, const at::Tensor& s) {
  for (std::int64_t b = 0; b < out.size(0); ++b)
    for (std::int64_t h = 0; h < out.size(2); ++h)
      out.select(0, b).select(1, h).addmm_(a.select(0, b).select(1, h), s[b][h]);
}

// Λ[b, h] = Σ_t A[b, t, h, :] do[b, t, h, :]ᵀ  [B, Hs, K, V].
at::Tensor sum_a_outer_grad(const at::Tensor& a, const at::Tensor& d_out) {
  at::Tensor lambda = at::zeros({a.size(0), a.size(2), a.size(3), d_out.size(3)}, d_out.options());
  for (std::int64_t b = 0; b < a.size(0); ++b)
    for (std::int64_t h = 0; h < a.size(2); ++h)
      lambda[b][h].addmm_(a.select(0, b).select(1, h).t(), d_out.select(0, b).select(1, h));
  return lambda;
}

// dA[b, t, h, :] = S[b, h] do[b, t, h, :]  [B, n, Hs, K].
at::Tensor state_times_grad(const at::Tensor& s, const at::Tensor& d_out) {
  at::Tensor d_a =
      at::zeros({d_out.size(0), d_out.size(1), d_out.size(2), s.size(2)}, d_out.options());
  for (std::int64_t b = 0; b < d_out.size(0); ++b)
    for (std::int64_t h = 0; h < d_out.size(2); ++h)
      d_a.select(0, b).select(1, h).addmm_(d_out.select(0, b).select(1, h), s[b][h].t());
  return d_a;
}

// Prefix sums along dimension 1 of a [B, n, ...] float32/float64 tensor (reverse: suffix sums),
// accumulated in float64 by a plain loop: ATen 1.13's cumsum over a dimension other than the
// innermost runs an order of magnitude slower than one pass over memory.
at::Tensor prefix_sum_dim1(const at::Tensor& x_in, bool reverse) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const std::int64_t B = x.size(0), n = x.size(1);
  const std::int64_t inner = B == 0 || n == 0 ? 0 : x.numel() / (B * n);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cp_prefix_sum", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    std::vector<double> acc(static_cast<std::size_t>(inner));
    for (std::int64_t b = 0; b < B; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t step = 0; step < n; ++step) {
        const std::int64_t base = (b * n + (reverse ? n - 1 - step : step)) * inner;
        for (std::int64_t i = 0; i < inner; ++i) {
          acc[static_cast<std::size_t>(i)] += static_cast<double>(src[base + i]);
          dst[base + i] = static_cast<scalar_t>(acc[static_cast<std::size_t>(i)]);
        }
      }
    }
  });
  return out;
}

// GLA's A_t = scale · exp(G_t) ⊙ q'_t with G_t = Σ_{s ≤ t} g_s (from the piece's first token),
// and exp(G_last), for g, q' [B, n, H, K] of one dtype (float32/float64). A custom autograd node
// (a prefix sum and three vectorised passes forward, four backward) where the graph of the
// formula would make about ten. Backward, with E_t = exp(G_t):
//   ∂L/∂q'_t = scale · E_t ⊙ ∂L/∂A_t,   ∂L/∂G_t = q'_t ⊙ ∂L/∂q'_t (+ E_last ⊙ ∂L/∂E_last at the
//   last token),   ∂L/∂g_t = Σ_{s ≥ t} ∂L/∂G_s.
struct DecayedQueryFunction : torch::autograd::Function<DecayedQueryFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& g, const at::Tensor& q,
                               double scale) {
    const at::Tensor e = prefix_sum_dim1(g, false).exp_();  // E_t
    const at::Tensor a = at::mul(e, q).mul_(scale);
    const at::Tensor last = e.select(1, e.size(1) - 1).clone();
    ctx->save_for_backward({e, q});
    ctx->saved_data["scale"] = scale;
    return {a, last};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &e = saved[0], &q = saved[1];
    const double scale = ctx->saved_data["scale"].toDouble();
    at::Tensor d_q = grads[0].defined() ? at::mul(grads[0], e).mul_(scale) : at::zeros_like(q);
    at::Tensor d_decay = at::mul(d_q, q);
    if (grads[1].defined())
      d_decay.select(1, e.size(1) - 1).addcmul_(e.select(1, e.size(1) - 1), grads[1]);
    return {prefix_sum_dim1(d_decay, true), d_q, at::Tensor()};
  }
};

// ---- the slice's place in the batch -------------------------------------------------------------

// One piece: the tokens of one sequence on this rank (local offsets [begin, end)).
struct Piece {
  std::int64_t seq = 0, begin = 0, end = 0;
  bool carry_in = false;    // the sequence began on an earlier rank
  bool owns_final = false;  // the sequence's last token is on this rank
};

struct Layout {
  int world = 1, rank = 0;
  bool varlen = false;
  std::int64_t lanes = 1;  // sequences crossing a rank boundary at once: B, or 1 with cu_seqlens
  std::int64_t num_sequences = 0;
  std::int64_t begin = 0, end = 0, total = 0;  // this slice's global token range, all tokens
  std::vector<Piece> pieces;                   // in order; empty for an empty slice
  bool carry_in = false, carry_out = false;    // the first piece continues / the last goes on
  std::int64_t corrected_tokens = 0;           // tokens [0, this) of the slice take S_in
  std::vector<std::int64_t> empty_sequences;

  bool empty() const { return pieces.empty(); }
  // The piece of lane l that continues from the previous rank / that goes on to the next.
  std::int64_t first_piece(std::int64_t lane) const { return varlen ? 0 : lane; }
  std::int64_t last_piece(std::int64_t lane) const {
    return varlen ? static_cast<std::int64_t>(pieces.size()) - 1 : lane;
  }
  std::int64_t lane_of(std::int64_t piece) const { return varlen ? 0 : piece; }
};

Layout make_layout(const std::vector<std::int64_t>& lengths, int rank, std::int64_t batch,
                   const c10::optional<std::vector<std::int64_t>>& cu) {
  Layout l;
  l.world = static_cast<int>(lengths.size());
  l.rank = rank;
  for (int r = 0; r < l.world; ++r) {
    if (r < rank) l.begin += lengths[static_cast<std::size_t>(r)];
    l.total += lengths[static_cast<std::size_t>(r)];
  }
  l.end = l.begin + lengths[static_cast<std::size_t>(rank)];
  if (!cu) {
    l.varlen = false;
    l.lanes = batch;
    l.num_sequences = batch;
    if (l.end > l.begin) {
      for (std::int64_t b = 0; b < batch; ++b)
        l.pieces.push_back({b, 0, l.end - l.begin, l.begin > 0, l.end == l.total});
      l.carry_in = l.begin > 0;
      l.carry_out = l.end < l.total;
      l.corrected_tokens = l.carry_in ? l.end - l.begin : 0;
    }
    if (l.total == 0)
      for (std::int64_t b = 0; b < batch; ++b) l.empty_sequences.push_back(b);
    return l;
  }
  const auto& c = *cu;
  l.varlen = true;
  l.lanes = 1;
  l.num_sequences = static_cast<std::int64_t>(c.size()) - 1;
  for (std::int64_t n = 0; n < l.num_sequences; ++n) {
    const std::int64_t s = c[static_cast<std::size_t>(n)], e = c[static_cast<std::size_t>(n) + 1];
    if (s == e) l.empty_sequences.push_back(n);
    const std::int64_t lo = std::max(s, l.begin), hi = std::min(e, l.end);
    if (hi > lo) l.pieces.push_back({n, lo - l.begin, hi - l.begin, s < l.begin, e <= l.end});
  }
  if (!l.pieces.empty()) {
    l.carry_in = l.pieces.front().carry_in;
    l.carry_out = c[static_cast<std::size_t>(l.pieces.back().seq) + 1] > l.end;
    l.corrected_tokens = l.carry_in ? l.pieces.front().end - l.pieces.front().begin : 0;
  }
  return l;
}

at::Tensor local_cu_seqlens(const Layout& l) {
  std::vector<std::int64_t> cu;
  for (const auto& p : l.pieces) cu.push_back(p.begin);
  cu.push_back(l.end - l.begin);
  return at::tensor(cu, at::kLong);
}

at::Tensor piece_sequences(const Layout& l) {
  std::vector<std::int64_t> seqs;
  for (const auto& p : l.pieces) seqs.push_back(p.seq);
  return at::tensor(seqs, at::kLong);
}

// Pieces that continue a sequence from an earlier rank (1) or start it here (0), as [P, 1, 1, 1].
at::Tensor carry_in_mask(const Layout& l, at::ScalarType dtype) {
  std::vector<double> m;
  for (const auto& p : l.pieces) m.push_back(p.carry_in ? 1.0 : 0.0);
  return at::tensor(m, at::kDouble).to(dtype).view({-1, 1, 1, 1});
}

void check_total(const std::string& op, const std::vector<std::int64_t>& lengths,
                 const c10::optional<std::vector<std::int64_t>>& cu) {
  if (!cu) return;
  std::int64_t total = 0;
  for (auto n : lengths) total += n;
  if (cu->back() != total)
    fail(op, "cu_seqlens",
         "cu_seqlens[N] = " + std::to_string(total) + " (the sum of the ranks' slice lengths)",
         std::to_string(cu->back()));
}

at::ScalarType state_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// This slice's results, connected to the leaves by autograd when gradients are needed.
struct LocalResult {
  at::Tensor o0;  // [B, T_r, Hs, V]: outputs from S_in = 0 (from h0 where a sequence starts here)
  at::Tensor a;   // [B, n, Hs, K]: A_t of the n tokens that continue a sequence (n > 0 only)
  at::Tensor x;   // [P, Hs, K, V]: each piece's final state from S_in = 0 (or from its h0)
  at::Tensor y;   // the transition P of each lane's continuing piece (n > 0 only): [L, Hs, K, K],
                  // or its diagonal [L, Hs, K] when `diagonal` (GLA)
  bool diagonal = false;
};

// The transitions P [.., K, K] (or their diagonals [.., K]) applied to states S [.., K, V]:
// P S, Pᵀ S, and the gradient of P in S_out = P S_in given dS_out: dS_out S_inᵀ (its diagonal).
at::Tensor transition_times(const at::Tensor& p, const at::Tensor& s, bool diagonal) {
  return diagonal ? p.unsqueeze(-1) * s : at::matmul(p, s);
}
at::Tensor transition_transposed_times(const at::Tensor& p, const at::Tensor& s, bool diagonal) {
  return diagonal ? p.unsqueeze(-1) * s : at::matmul(p.transpose(-1, -2), s);
}
at::Tensor transition_grad(const at::Tensor& d_out, const at::Tensor& s_in, bool diagonal) {
  return diagonal ? (d_out * s_in).sum(-1) : at::matmul(d_out, s_in.transpose(-1, -2));
}

// What a forward pass leaves for its backward pass.
struct Saved : torch::CustomClassHolder {
  distributed::ProcessGroupPtr group;
  Layout layout;
  std::string op;
  // The augmented call's leaves (detached inputs) and its outputs, with their autograd graph.
  std::vector<at::Tensor> leaves;  // q, k, v, g, beta, h0, theta (undefined when absent)
  at::Tensor out_aug, state_aug;   // phases: θ⁰ [B, T_r, H, R] and the pieces' final phases
  at::Tensor s_in;                 // [L, Hs, K, V]: the state carried into this slice
  at::Tensor later_maps;           // [R, L, Hs, K, K] (or [R, L]): every rank's M_j
  at::Tensor omega;                // phases: ω (for the correction's gradient)
  LocalResult local;               // GLA / Gated DeltaNet: this slice's results
  bool diagonal = false;           // the maps M_j are diagonals (GLA)
  bool output_final = false;
  std::int64_t value_dim = 0;
};

c10::intrusive_ptr<Saved> saved_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<Saved>(ctx->saved_data["saved"].toCapsule());
}

at::Tensor leaf(const at::Tensor& t, bool grad) {
  if (!t.defined()) return t;
  at::Tensor x = t.detach();
  if (grad && t.requires_grad()) x.requires_grad_(true);
  return x;
}

at::Tensor opt(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

c10::optional<at::Tensor> as_optional(const at::Tensor& t) {
  if (!t.defined()) return c10::nullopt;
  return t;
}

// ---- GLA and Gated DeltaNet ---------------------------------------------------------------------

enum class Family : std::int64_t { gla = 0, gated_delta_rule = 1 };

struct LinearOptions {
  Family family;
  Impl impl;
  c10::optional<double> scale;
  bool output_final_state;
  bool use_qk_l2norm_in_kernel;
  std::int64_t chunk_size;
  RotaryLayout rotary_layout;
  bool needs_grad;
  distributed::ProcessGroupPtr group;
};

std::string linear_op_name(Family family, Impl impl) {
  return std::string("cp::") +
         op_name(family == Family::gla ? Op::gla : Op::gated_delta_rule, impl);
}

// Header fields of the linear ops.
enum LinearField : std::size_t {
  kLength,
  kBatch,
  kHeads,
  kKeyDim,
  kValueDim,
  kValueHeads,
  kDtype,
  kHasH0,
  kHasCu,
  kNumSeq,
  kCuPrint,
  kHasTheta,
  kOutputFinal,
  kNeedsGrad,
  kChunkSize,
  kL2Norm,
  kScale,
  kRotary,
  kImpl,
  kNumLinearFields
};

// The local checks of one rank's arguments (the single-process op checks the rest).
void check_linear_local(const std::string& op, Family family, const at::Tensor& q,
                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                        const at::Tensor& beta, const at::Tensor& h0, const at::Tensor& theta,
                        const at::Tensor& cu, c10::optional<std::vector<std::int64_t>>& cu_values) {
  check_float(op, "q", q, {-1, -1, -1, -1}, {"B", "T", "H", "K"});
  const std::int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  check_float(op, "k", k, {B, T, H, K}, {"B", "T", "H", "K"});
  check_float(op, "v", v, {B, T, -1, -1}, {"B", "T", family == Family::gla ? "H" : "HV", "V"});
  const std::int64_t Hs = v.size(2), V = v.size(3);
  if (family == Family::gla) {
    if (Hs != H) fail(op, "v", "H = " + std::to_string(H) + " heads", shape_of(v));
    check_float(op, "g", g, {B, T, H, K}, {"B", "T", "H", "K"});
  } else {
    if (H == 0 || Hs % H != 0)
      fail(op, "v", "HV a multiple of H = " + std::to_string(H), "HV = " + std::to_string(Hs));
    check_float(op, "g", g, {B, T, Hs}, {"B", "T", "HV"});
    check_float(op, "beta", beta, {B, T, Hs}, {"B", "T", "HV"});
  }
  if (theta.defined()) check_float(op, "theta", theta, {B, T, H, K / 2}, {"B", "T", "H", "K/2"});
  if (cu.defined()) cu_values = read_cu_seqlens(op, cu, B);
  const std::int64_t N = cu_values ? static_cast<std::int64_t>(cu_values->size()) - 1 : B;
  if (h0.defined())
    check_float(op, "initial_state", h0, {N, Hs, K, V},
                {"N", family == Family::gla ? "H" : "HV", "K", "V"});
}

// The initial states of the pieces: h0[n] (or 0) for a piece that starts its sequence here, 0 for
// one that continues a sequence from an earlier rank ([P, Hs, K, V], differentiable in h0).
at::Tensor piece_initial_states(const Layout& layout, const at::Tensor& h0, std::int64_t Hs,
                                std::int64_t K, std::int64_t V, const at::TensorOptions& options) {
  const auto P = static_cast<std::int64_t>(layout.pieces.size());
  const auto sd = options.dtype().toScalarType();
  if (!h0.defined()) return at::zeros({P, Hs, K, V}, options);
  return h0.to(sd).index_select(0, piece_sequences(layout)) * (1 - carry_in_mask(layout, sd));
}

// One call of the single-process op on tokens [begin, begin + length) of the slice.
OutputAndState call_op(const std::vector<at::Tensor>& lv, const at::Tensor& values,
                       const at::Tensor& initial, const c10::optional<at::Tensor>& cu,
                       std::int64_t begin, std::int64_t length, const LinearOptions& o) {
  auto part = [&](const at::Tensor& t) {
    return !t.defined() || (begin == 0 && length == t.size(1)) ? t : t.narrow(1, begin, length);
  };
  if (o.family == Family::gla)
    return phasor::gla(part(lv[0]), part(lv[1]), values, part(lv[3]), o.impl, o.scale, initial,
                       true, cu, o.chunk_size, as_optional(part(lv[6])), o.rotary_layout);
  return phasor::gated_delta_rule(part(lv[0]), part(lv[1]), values, part(lv[3]), part(lv[4]),
                                  o.impl, o.scale, initial, true, cu, o.use_qk_l2norm_in_kernel,
                                  o.chunk_size, as_optional(part(lv[6])), o.rotary_layout);
}

// Any family: the continuing piece(s) by one call of the op with v_aug = [v | 0_K] from
// [0 | I_K] (o_aug = [o⁰ | A], S_aug = [S⁰ | P]); the pieces that start their sequence here by a
// plain call from [h0 | …] (their A and P are 0), so a slice without a continuing sequence costs
// no more than the single-process op.
LocalResult local_by_augmentation(const Layout& layout, const std::vector<at::Tensor>& lv,
                                  const LinearOptions& o) {
  const at::Tensor &q = lv[0], &v = lv[2];
  const std::int64_t B = q.size(0), T = q.size(1), Hs = v.size(2), K = q.size(3), V = v.size(3),
                     P = static_cast<std::int64_t>(layout.pieces.size()),
                     n = layout.corrected_tokens;
  const auto options = q.options().dtype(state_dtype(q));
  const at::Tensor starts = piece_initial_states(layout, lv[5], Hs, K, V, options);
  LocalResult r;
  if (n == 0) {  // every piece starts its sequence here
    const auto local_cu =
        layout.varlen ? c10::optional<at::Tensor>(local_cu_seqlens(layout)) : c10::nullopt;
    const auto out = call_op(lv, v, starts, local_cu, 0, T, o);
    r.o0 = std::get<0>(out);
    r.x = *std::get<1>(out);
    return r;
  }
  // The continuing pieces: every row without cu_seqlens, else the first piece (tokens [0, n)).
  const std::int64_t first_rows = layout.varlen ? 1 : B;
  const at::Tensor v_aug =
      at::cat({layout.varlen ? v.narrow(1, 0, n) : v, at::zeros({B, n, Hs, K}, v.options())}, -1);
  const at::Tensor h0_aug = at::cat({at::zeros({first_rows, Hs, K, V}, options),
                                     at::eye(K, options).expand({first_rows, Hs, K, K})},
                                    -1);
  const auto first = call_op(lv, v_aug, h0_aug, c10::nullopt, 0, n, o);
  const at::Tensor o_aug = std::get<0>(first), s_aug = *std::get<1>(first);
  r.a = o_aug.narrow(-1, V, K);
  r.y = s_aug.narrow(-1, V, K);  // [L, Hs, K, K]: lane l's continuing piece is row l
  r.o0 = o_aug.narrow(-1, 0, V);
  r.x = s_aug.narrow(-1, 0, V);
  if (layout.varlen && P > 1) {  // the pieces after the first, from their own initial states
    std::vector<std::int64_t> cu;
    for (std::size_t p = 1; p < layout.pieces.size(); ++p) cu.push_back(layout.pieces[p].begin - n);
    cu.push_back(T - n);
    const auto rest = call_op(lv, v.narrow(1, n, T - n), starts.narrow(0, 1, P - 1),
                              at::tensor(cu, at::kLong), n, T - n, o);
    r.o0 = at::cat({r.o0, std::get<0>(rest)}, 1);
    r.x = at::cat({r.x, *std::get<1>(rest)}, 0);
  }
  return r;
}

// GLA: the transition is diagonal, P_{≤t} = diag(exp(G_t)) with G_t = Σ_{s ≤ t} g_s from the
// piece's first token, so A_t = scale · exp(G_t) ⊙ q'_t comes from elementwise torch ops and the
// op runs on the V value columns only (half the work of the augmented call for K = V).
LocalResult local_gla(const Layout& layout, const std::vector<at::Tensor>& lv,
                      const LinearOptions& o) {
  const at::Tensor &q = lv[0], &g = lv[3], &theta = lv[6];
  const std::int64_t Hs = lv[2].size(2), K = q.size(3), V = lv[2].size(3),
                     n = layout.corrected_tokens;
  const auto sd = state_dtype(q);
  const auto options = q.options().dtype(sd);
  const auto local_cu =
      layout.varlen ? c10::optional<at::Tensor>(local_cu_seqlens(layout)) : c10::nullopt;
  const auto out = phasor::gla(q, lv[1], lv[2], g, o.impl, o.scale,
                               piece_initial_states(layout, lv[5], Hs, K, V, options), true,
                               local_cu, o.chunk_size, as_optional(theta), o.rotary_layout);
  LocalResult r;
  r.diagonal = true;
  r.o0 = std::get<0>(out);
  r.x = *std::get<1>(out);
  if (n > 0) {
    const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(K));
    // The first n tokens (all of them without cu_seqlens: no narrow, whose backward would write
    // a zero-filled gradient of the whole slice).
    auto head = [&](const at::Tensor& t) { return n == t.size(1) ? t : t.narrow(1, 0, n); };
    at::Tensor qn = head(q);
    if (theta.defined()) qn = phasor::apply_rotary(qn, head(theta), o.rotary_layout);
    const auto decayed = DecayedQueryFunction::apply(head(g).to(sd), qn.to(sd), scale);
    r.a = decayed[0];
    r.y = decayed[1];  // diag(P) = exp(G_last) [L = B, H, K]
  }
  return r;
}

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g,
                               const c10::optional<at::Tensor>& beta_in,
                               const c10::optional<at::Tensor>& initial_state,
                               const c10::optional<at::Tensor>& theta_in,
                               const c10::optional<at::Tensor>& cu_seqlens,
                               const LinearOptions& o) {
    const std::string op = linear_op_name(o.family, o.impl);
    const auto& group = o.group;
    const at::Tensor beta = opt(beta_in), h0 = opt(initial_state), theta = opt(theta_in),
                     cu = opt(cu_seqlens);

    // 1. Local checks, then the header: lengths and everything that must agree.
    c10::optional<std::vector<std::int64_t>> cu_values;
    const std::string local_error = error_of(
        [&] { check_linear_local(op, o.family, q, k, v, g, beta, h0, theta, cu, cu_values); });
    std::vector<std::int64_t> fields(kNumLinearFields, 0);
    if (local_error.empty()) {
      fields[kLength] = q.size(1), fields[kBatch] = q.size(0), fields[kHeads] = q.size(2);
      fields[kKeyDim] = q.size(3), fields[kValueDim] = v.size(3), fields[kValueHeads] = v.size(2);
      fields[kDtype] = static_cast<std::int64_t>(q.scalar_type());
      fields[kHasH0] = h0.defined(), fields[kHasCu] = cu.defined();
      fields[kNumSeq] = cu_values ? static_cast<std::int64_t>(cu_values->size()) - 1 : -1;
      fields[kCuPrint] = fingerprint(cu_values ? &*cu_values : nullptr),
      fields[kHasTheta] = theta.defined();
      fields[kOutputFinal] = o.output_final_state, fields[kNeedsGrad] = o.needs_grad;
      fields[kChunkSize] = o.chunk_size, fields[kL2Norm] = o.use_qk_l2norm_in_kernel;
      fields[kScale] = double_bits(o.scale);
      fields[kRotary] = static_cast<std::int64_t>(o.rotary_layout);
      fields[kImpl] = static_cast<std::int64_t>(o.impl);
    }
    const auto all = exchange_header(group, fields, local_error);
    check_agreement(
        op, all,
        {{kBatch, "q", "batch size B"},
         {kHeads, "q", "number of heads H"},
         {kKeyDim, "q", "key dimension K"},
         {kValueDim, "v", "value dimension V"},
         {kValueHeads, "v", "number of value heads"},
         {kDtype, "q", "dtype (as a number)"},
         {kHasH0, "initial_state", "presence (1: given)"},
         {kHasCu, "cu_seqlens", "presence (1: given)"},
         {kNumSeq, "cu_seqlens", "number of sequences N"},
         {kCuPrint, "cu_seqlens", "global offsets (fingerprint)"},
         {kHasTheta, "theta", "presence (1: given)"},
         {kOutputFinal, "output_final_state", "value"},
         {kNeedsGrad, "requires_grad", "need for gradients (1: some input requires grad)"},
         {kChunkSize, "chunk_size", "value"},
         {kL2Norm, "use_qk_l2norm_in_kernel", "value"},
         {kScale, "scale", "value (bits)"},
         {kRotary, "rotary_layout", "value"},
         {kImpl, "impl", "value"}});
    std::vector<std::int64_t> lengths;
    for (const auto& f : all) lengths.push_back(f[kLength]);
    check_total(op, lengths, cu_values);
    const Layout layout = make_layout(lengths, group->getRank(), q.size(0), cu_values);

    const std::int64_t B = q.size(0), T = q.size(1), Hs = v.size(2), K = q.size(3), V = v.size(3),
                       L = layout.lanes, R = layout.world;
    const at::ScalarType sd = state_dtype(q);
    const auto state_options = q.options().dtype(sd);

    // 2. This slice's results: o⁰, A of the continuing tokens, S⁰ and P.
    auto saved = c10::make_intrusive<Saved>();
    saved->group = group, saved->op = op, saved->output_final = o.output_final_state;
    saved->value_dim = V;
    saved->leaves = {leaf(q, o.needs_grad),    leaf(k, o.needs_grad),    leaf(v, o.needs_grad),
                     leaf(g, o.needs_grad),    leaf(beta, o.needs_grad), leaf(h0, o.needs_grad),
                     leaf(theta, o.needs_grad)};
    LocalResult& local = saved->local;
    std::string call_error;
    if (!layout.empty()) {
      call_error = error_of([&] {
        at::AutoGradMode grad_mode(o.needs_grad);
        local = o.family == Family::gla ? local_gla(layout, saved->leaves, o)
                                        : local_by_augmentation(layout, saved->leaves, o);
      });
    }
    const at::Tensor o0 = local.o0.defined() ? local.o0.detach() : at::Tensor();
    const at::Tensor a = local.a.defined() ? local.a.detach().to(sd) : at::Tensor();
    const at::Tensor x = local.x.defined() ? local.x.detach() : at::Tensor();
    const at::Tensor y = local.y.defined() ? local.y.detach() : at::Tensor();

    // 3. Every rank's map (M_r, c_r) and a failure flag, allgathered. GLA's M_r are diagonal
    //    and travel as [L, Hs, K].
    const bool diagonal = o.family == Family::gla;
    const std::vector<std::int64_t> m_shape =
        diagonal ? std::vector<std::int64_t>{L, Hs, K} : std::vector<std::int64_t>{L, Hs, K, K};
    const std::int64_t m_numel = diagonal ? L * Hs * K : L * Hs * K * K;
    at::Tensor map_m, map_c;
    if (layout.empty()) {
      map_m = diagonal ? at::ones(m_shape, state_options)
                       : at::eye(K, state_options).expand(m_shape).contiguous();
      map_c = at::zeros({L, Hs, K, V}, state_options);
    } else if (layout.carry_out && call_error.empty()) {
      std::vector<at::Tensor> ms, cs;
      for (std::int64_t lane = 0; lane < L; ++lane) {
        const std::int64_t p = layout.last_piece(lane);
        cs.push_back(x[p]);
        ms.push_back(layout.pieces[static_cast<std::size_t>(p)].carry_in
                         ? y[lane]
                         : at::zeros(at::IntArrayRef(m_shape).slice(1), state_options));
      }
      map_m = at::stack(ms), map_c = at::stack(cs);
    } else {
      map_m = at::zeros(m_shape, state_options);
      map_c = at::zeros({L, Hs, K, V}, state_options);
    }
    const at::Tensor flag = at::full({1}, call_error.empty() ? 0.0 : 1.0, state_options);
    const auto maps = allgather(group, at::cat({flag, map_m.flatten(), map_c.flatten()}));
    std::vector<int> failed;
    std::vector<at::Tensor> all_m, all_c;
    for (std::int64_t r = 0; r < R; ++r) {
      const at::Tensor& buf = maps[static_cast<std::size_t>(r)];
      if (buf[0].item<double>() != 0) failed.push_back(static_cast<int>(r));
      all_m.push_back(buf.narrow(0, 1, m_numel).view(m_shape));
      all_c.push_back(buf.narrow(0, 1 + m_numel, L * Hs * K * V).view({L, Hs, K, V}));
    }
    throw_if_any_failed(op, failed, call_error);

    // 4. S_in = C_{r−1}: the maps of the earlier ranks composed, C_j = M_j C_{j−1} + c_j.
    at::Tensor s_in = at::zeros({L, Hs, K, V}, state_options);
    for (int j = 0; j < layout.rank; ++j)
      s_in = transition_times(all_m[static_cast<std::size_t>(j)], s_in, diagonal) +
             all_c[static_cast<std::size_t>(j)];
    saved->s_in = s_in;
    saved->later_maps = at::stack(all_m);
    saved->diagonal = diagonal;
    saved->layout = layout;

    // 5. o_t = o⁰_t + S_inᵀ A_t on the tokens that continue a sequence.
    at::Tensor out;
    if (layout.empty()) {
      out = at::empty({B, T, Hs, V}, q.options());
    } else {
      // o⁰ is corrected in place when no graph refers to it.
      out = o.needs_grad ? o0.clone() : o0;
      const std::int64_t n = layout.corrected_tokens;
      if (n > 0) {
        const at::Tensor target = out.narrow(1, 0, n);
        const at::Tensor work = target.scalar_type() == sd ? target : target.to(sd);
        add_a_times_state(work, a, s_in);
        if (!work.is_same(target)) target.copy_(work);
      }
    }

    // 6. Final states: S⁰_n + P_n S_in on the rank holding sequence n's last token, summed.
    at::Tensor final_state;
    if (o.output_final_state) {
      final_state = at::zeros({layout.num_sequences, Hs, K, V}, state_options);
      for (std::size_t p = 0; p < layout.pieces.size(); ++p) {
        const Piece& piece = layout.pieces[p];
        if (!piece.owns_final) continue;
        at::Tensor f = x[static_cast<std::int64_t>(p)];
        if (piece.carry_in) {
          const std::int64_t lane = layout.lane_of(static_cast<std::int64_t>(p));
          f = f + transition_times(y[lane], s_in[lane], diagonal);
        }
        final_state[piece.seq].copy_(f);
      }
      if (layout.rank == 0 && h0.defined())
        for (auto seq : layout.empty_sequences) final_state[seq].copy_(h0[seq]);
      allreduce_sum(group, final_state);
    }

    ctx->saved_data["saved"] = c10::IValue::make_capsule(saved);
    ctx->set_materialize_grads(false);
    if (final_state.defined()) return {out, final_state};
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "cp: the backward pass of the context-parallel ops is first order only");
    const auto saved = saved_of(ctx);
    const Layout& layout = saved->layout;
    const auto& group = saved->group;
    const auto& lv = saved->leaves;
    const LocalResult& local = saved->local;
    const at::Tensor& q = lv[0];
    const std::int64_t B = q.size(0), T = q.size(1), Hs = saved->s_in.size(1), K = q.size(3),
                       V = saved->value_dim, L = layout.lanes, R = layout.world;
    const at::Tensor& s_in = saved->s_in;
    const auto state_options = s_in.options();
    const at::ScalarType sd = s_in.scalar_type();
    const std::int64_t n = layout.corrected_tokens;

    at::Tensor d_out = grads.size() > 0 ? grads[0] : at::Tensor();
    at::Tensor d_final = saved->output_final && grads.size() > 1 ? grads[1] : at::Tensor();
    if (!d_out.defined()) d_out = at::zeros({B, T, Hs, V}, q.options());
    if (!d_final.defined()) d_final = at::zeros({layout.num_sequences, Hs, K, V}, state_options);
    d_final = d_final.to(sd);
    const at::Tensor d_out_n = n > 0 ? d_out.narrow(1, 0, n).to(sd) : at::Tensor();

    // 1. Λ_r = Σ_t A_t do_tᵀ + Σ_{n owned, continuing} P_nᵀ dF_n: ∂L/∂S_in through this slice.
    at::Tensor lambda = at::zeros({L, Hs, K, V}, state_options);
    if (n > 0) {
      lambda = sum_a_outer_grad(local.a.detach().to(sd), d_out_n);
      for (std::size_t p = 0; p < layout.pieces.size(); ++p) {
        const Piece& piece = layout.pieces[p];
        if (!piece.owns_final || !piece.carry_in) continue;
        const std::int64_t lane = layout.lane_of(static_cast<std::int64_t>(p));
        lambda[lane] +=
            transition_transposed_times(local.y.detach()[lane], d_final[piece.seq], local.diagonal);
      }
    }

    // 2. The reverse scan: G_{j−1} = M_jᵀ G_j + Λ_j from G_{R−1} = 0 down to this rank's G_r.
    const auto lambdas = allgather(group, lambda.flatten());
    at::Tensor g_out = at::zeros({L, Hs, K, V}, state_options);
    for (std::int64_t j = R - 1; j > layout.rank; --j)
      g_out = transition_transposed_times(saved->later_maps[j], g_out, saved->diagonal) +
              lambdas[static_cast<std::size_t>(j)].view({L, Hs, K, V});

    // 3. The backward pass of this slice's results:
    //    ∂L/∂o⁰ = do, ∂L/∂A_t = S_in do_t, and for S = S⁰ + P S_in (S_in = 0 for a piece that
    //    starts its sequence here): ∂L/∂S⁰ = dS, ∂L/∂P = dS S_inᵀ, with dS = G_r for the piece
    //    that goes on to the next rank and dS = dF_n for the piece that ends sequence n.
    std::vector<at::Tensor> result(lv.size());
    std::string call_error;
    if (!layout.empty()) {
      call_error = error_of([&] {
        std::vector<at::Tensor> outputs{local.o0, local.x}, output_grads{d_out, {}};
        at::Tensor d_x = at::zeros(local.x.sizes(), state_options);
        at::Tensor d_y = n > 0 ? at::zeros(local.y.sizes(), state_options) : at::Tensor();
        auto add = [&](std::int64_t p, const at::Tensor& d_state) {
          d_x[p] += d_state;
          if (layout.pieces[static_cast<std::size_t>(p)].carry_in) {
            const std::int64_t lane = layout.lane_of(p);
            d_y[lane] += transition_grad(d_state, s_in[lane], local.diagonal);
          }
        };
        if (layout.carry_out)
          for (std::int64_t lane = 0; lane < L; ++lane) add(layout.last_piece(lane), g_out[lane]);
        if (saved->output_final)
          for (std::size_t p = 0; p < layout.pieces.size(); ++p)
            if (layout.pieces[p].owns_final)
              add(static_cast<std::int64_t>(p), d_final[layout.pieces[p].seq]);
        output_grads[1] = d_x.to(local.x.scalar_type());
        if (n > 0) {
          outputs.push_back(local.a);
          output_grads.push_back(state_times_grad(s_in, d_out_n).to(local.a.scalar_type()));
          outputs.push_back(local.y);
          output_grads.push_back(d_y.to(local.y.scalar_type()));
        }
        std::vector<at::Tensor> inputs;
        std::vector<std::size_t> which;
        for (std::size_t i = 0; i < lv.size(); ++i)
          if (lv[i].defined() && lv[i].requires_grad()) inputs.push_back(lv[i]), which.push_back(i);
        if (inputs.empty()) return;
        const auto d = torch::autograd::grad(outputs, inputs, output_grads,
                                             /*retain_graph=*/false, /*create_graph=*/false,
                                             /*allow_unused=*/true);
        for (std::size_t i = 0; i < which.size(); ++i) result[which[i]] = d[i];
      });
    }
    for (std::size_t i = 0; i < lv.size(); ++i)
      if (lv[i].defined() && lv[i].requires_grad() && !result[i].defined())
        result[i] = at::zeros_like(lv[i]);

    // 4. d(initial_state): the h0 that entered on each rank, dF_n of empty sequences on rank 0,
    //    summed over the ranks (with the failure flags).
    const at::Tensor& h0 = lv[5];
    const bool want_h0 = h0.defined() && h0.requires_grad();
    at::Tensor dh0 = want_h0 ? result[5].to(sd) : at::zeros({0}, state_options);
    if (want_h0 && layout.rank == 0 && saved->output_final)
      for (auto seq : layout.empty_sequences) dh0[seq] += d_final[seq];
    at::Tensor reduced =
        at::cat({dh0.flatten(), at::full({1}, call_error.empty() ? 0.0 : 1.0, state_options)});
    allreduce_sum(group, reduced);
    if (reduced[-1].item<double>() != 0) {
      if (!call_error.empty()) TORCH_CHECK(false, call_error);
      TORCH_CHECK(false, saved->op,
                  ": the backward pass of the single-process op failed on another rank");
    }
    if (want_h0)
      result[5] = reduced.narrow(0, 0, dh0.numel()).view(h0.sizes()).to(h0.scalar_type());
    return {result[0], result[1], result[2],    result[3],   result[4],
            result[5], result[6], at::Tensor(), at::Tensor()};
  }
};

bool requires_grad(const at::Tensor& t) {
  return t.defined() && t.requires_grad();
}
bool requires_grad(const c10::optional<at::Tensor>& t) {
  return t.has_value() && requires_grad(*t);
}

OutputAndState run_linear(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& g, const c10::optional<at::Tensor>& beta,
                          const c10::optional<at::Tensor>& initial_state,
                          const c10::optional<at::Tensor>& theta,
                          const c10::optional<at::Tensor>& cu_seqlens, LinearOptions o) {
  TORCH_CHECK(o.group, linear_op_name(o.family, o.impl),
              ": argument 'group': expected a process group, got none");
  o.needs_grad = at::GradMode::is_enabled() &&
                 (requires_grad(q) || requires_grad(k) || requires_grad(v) || requires_grad(g) ||
                  requires_grad(beta) || requires_grad(initial_state) || requires_grad(theta));
  const variable_list out =
      LinearFunction::apply(q, k, v, g, beta, initial_state, theta, cu_seqlens, o);
  c10::optional<at::Tensor> final_state;
  if (o.output_final_state) final_state = out[1];
  return {out[0], final_state};
}

// ---- Selective RoPE phases ----------------------------------------------------------------------

struct PhaseOptions {
  bool output_final_phase;
  bool needs_grad;
  distributed::ProcessGroupPtr group;
};

enum PhaseField : std::size_t {
  pLength,
  pBatch,
  pHeads,
  pRank,
  pDtype,
  pOmegaDim,
  pHasH0,
  pHasCu,
  pNumSeq,
  pCuPrint,
  pOutputFinal,
  pNeedsGrad,
  kNumPhaseFields
};

// ω as [1, 1, H or 1, R], in dtype.
at::Tensor omega_4d(const at::Tensor& omega, at::ScalarType dtype) {
  const at::Tensor w = omega.to(dtype);
  return omega.dim() == 2 ? w.view({1, 1, w.size(0), w.size(1)}) : w.view({1, 1, 1, w.size(0)});
}

struct PhaseFunction : torch::autograd::Function<PhaseFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& phi, const at::Tensor& omega,
                               const c10::optional<at::Tensor>& initial_phase,
                               const c10::optional<at::Tensor>& cu_seqlens, const PhaseOptions& o) {
    const std::string op = "cp::selective_rope_phases";
    const auto& group = o.group;
    const at::Tensor h0 = opt(initial_phase), cu = opt(cu_seqlens);

    c10::optional<std::vector<std::int64_t>> cu_values;
    const std::string local_error = error_of([&] {
      check_float(op, "phi", phi, {-1, -1, -1, -1}, {"B", "T", "H", "R"});
      const std::int64_t H = phi.size(2), R = phi.size(3);
      if (omega.defined() && omega.dim() == 1)
        check_float(op, "omega", omega, {R}, {"R"});
      else
        check_float(op, "omega", omega, {H, R}, {"H", "R"});
      if (cu.defined()) cu_values = read_cu_seqlens(op, cu, phi.size(0));
      const std::int64_t N =
          cu_values ? static_cast<std::int64_t>(cu_values->size()) - 1 : phi.size(0);
      if (h0.defined()) check_float(op, "initial_phase", h0, {N, H, R}, {"N", "H", "R"});
    });
    std::vector<std::int64_t> fields(kNumPhaseFields, 0);
    if (local_error.empty()) {
      fields[pLength] = phi.size(1), fields[pBatch] = phi.size(0), fields[pHeads] = phi.size(2);
      fields[pRank] = phi.size(3), fields[pDtype] = static_cast<std::int64_t>(phi.scalar_type());
      fields[pOmegaDim] = omega.dim(), fields[pHasH0] = h0.defined();
      fields[pHasCu] = cu.defined();
      fields[pNumSeq] = cu_values ? static_cast<std::int64_t>(cu_values->size()) - 1 : -1;
      fields[pCuPrint] = fingerprint(cu_values ? &*cu_values : nullptr),
      fields[pOutputFinal] = o.output_final_phase;
      fields[pNeedsGrad] = o.needs_grad;
    }
    const auto all = exchange_header(group, fields, local_error);
    check_agreement(
        op, all,
        {{pBatch, "phi", "batch size B"},
         {pHeads, "phi", "number of heads H"},
         {pRank, "phi", "number of angles R"},
         {pDtype, "phi", "dtype (as a number)"},
         {pOmegaDim, "omega", "number of dimensions"},
         {pHasH0, "initial_phase", "presence (1: given)"},
         {pHasCu, "cu_seqlens", "presence (1: given)"},
         {pNumSeq, "cu_seqlens", "number of sequences N"},
         {pCuPrint, "cu_seqlens", "global offsets (fingerprint)"},
         {pOutputFinal, "output_final_phase", "value"},
         {pNeedsGrad, "requires_grad", "need for gradients (1: some input requires grad)"}});
    std::vector<std::int64_t> lengths;
    for (const auto& f : all) lengths.push_back(f[pLength]);
    check_total(op, lengths, cu_values);
    const Layout layout = make_layout(lengths, group->getRank(), phi.size(0), cu_values);
    const std::int64_t B = phi.size(0), T = phi.size(1), H = phi.size(2), R = phi.size(3),
                       L = layout.lanes, W = layout.world;
    const at::ScalarType sd = state_dtype(phi);
    const auto state_options = phi.options().dtype(sd);

    auto saved = c10::make_intrusive<Saved>();
    saved->group = group, saved->op = op, saved->output_final = o.output_final_phase;
    saved->leaves = {leaf(phi, o.needs_grad), leaf(omega, o.needs_grad), leaf(h0, o.needs_grad)};
    saved->omega = omega.detach();
    std::string call_error;
    if (!layout.empty()) {
      call_error = error_of([&] {
        at::AutoGradMode grad_mode(o.needs_grad);
        const auto& lv = saved->leaves;
        const std::int64_t P = static_cast<std::int64_t>(layout.pieces.size());
        const at::Tensor carry = carry_in_mask(layout, sd).view({-1, 1, 1});
        at::Tensor start = lv[2].defined() ? lv[2].to(sd).index_select(0, piece_sequences(layout))
                                           : at::zeros({P, H, R}, state_options);
        start = start * (1 - carry);
        const auto local_cu =
            layout.varlen ? c10::optional<at::Tensor>(local_cu_seqlens(layout)) : c10::nullopt;
        auto out = phasor::selective_rope_phases(lv[0], lv[1], start, true, local_cu);
        saved->out_aug = std::get<0>(out);
        saved->state_aug = *std::get<1>(out);
      });
    }

    // The map of this rank: C_r = M_r C_{r−1} + c_r, M_r ∈ {0, 1} per lane.
    at::Tensor map_m, map_c;
    if (layout.empty()) {
      map_m = at::ones({L}, state_options), map_c = at::zeros({L, H, R}, state_options);
    } else if (layout.carry_out && call_error.empty()) {
      std::vector<at::Tensor> cs;
      std::vector<double> ms;
      for (std::int64_t lane = 0; lane < L; ++lane) {
        const std::int64_t p = layout.last_piece(lane);
        cs.push_back(saved->state_aug.detach()[p]);
        ms.push_back(layout.pieces[static_cast<std::size_t>(p)].carry_in ? 1.0 : 0.0);
      }
      map_m = at::tensor(ms, at::kDouble).to(sd), map_c = at::stack(cs);
    } else {
      map_m = at::zeros({L}, state_options), map_c = at::zeros({L, H, R}, state_options);
    }
    const at::Tensor flag = at::full({1}, call_error.empty() ? 0.0 : 1.0, state_options);
    const auto maps = allgather(group, at::cat({flag, map_m, map_c.flatten()}));
    std::vector<int> failed;
    std::vector<at::Tensor> all_m;
    at::Tensor s_in = at::zeros({L, H, R}, state_options);
    for (std::int64_t r = 0; r < W; ++r) {
      const at::Tensor& buf = maps[static_cast<std::size_t>(r)];
      if (buf[0].item<double>() != 0) failed.push_back(static_cast<int>(r));
      all_m.push_back(buf.narrow(0, 1, L));
      if (r < layout.rank)
        s_in = buf.narrow(0, 1, L).view({L, 1, 1}) * s_in +
               buf.narrow(0, 1 + L, L * H * R).view({L, H, R});
    }
    throw_if_any_failed(op, failed, call_error);
    saved->s_in = s_in;
    saved->later_maps = at::stack(all_m);
    saved->layout = layout;

    // θ_t = θ⁰_t + ω ⊙ S_in on the continuing tokens.
    at::Tensor theta;
    if (layout.empty()) {
      theta = at::empty({B, T, H, R}, phi.options());
    } else {
      theta = saved->out_aug.detach().clone();
      const std::int64_t n = layout.corrected_tokens;
      if (n > 0)
        theta.narrow(1, 0, n).copy_(theta.narrow(1, 0, n).to(sd) +
                                    omega_4d(omega, sd) * s_in.unsqueeze(1));
    }
    at::Tensor final_phase;
    if (o.output_final_phase) {
      final_phase = at::zeros({layout.num_sequences, H, R}, state_options);
      for (std::size_t p = 0; p < layout.pieces.size(); ++p) {
        const Piece& piece = layout.pieces[p];
        if (!piece.owns_final) continue;
        at::Tensor f = saved->state_aug.detach()[static_cast<std::int64_t>(p)];
        if (piece.carry_in) f = f + s_in[layout.lane_of(static_cast<std::int64_t>(p))];
        final_phase[piece.seq].copy_(f);
      }
      if (layout.rank == 0 && h0.defined())
        for (auto n : layout.empty_sequences) final_phase[n].copy_(h0[n]);
      allreduce_sum(group, final_phase);
    }
    ctx->saved_data["saved"] = c10::IValue::make_capsule(saved);
    ctx->set_materialize_grads(false);
    if (final_phase.defined()) return {theta, final_phase};
    return {theta};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "cp::selective_rope_phases: the backward pass is first order only");
    const auto saved = saved_of(ctx);
    const Layout& layout = saved->layout;
    const auto& group = saved->group;
    const auto& lv = saved->leaves;
    const at::Tensor& phi = lv[0];
    const std::int64_t B = phi.size(0), T = phi.size(1), H = phi.size(2), R = phi.size(3),
                       L = layout.lanes, W = layout.world;
    const at::Tensor& s_in = saved->s_in;
    const auto state_options = s_in.options();
    const at::ScalarType sd = s_in.scalar_type();
    at::Tensor d_theta = grads.size() > 0 ? grads[0] : at::Tensor();
    at::Tensor d_final = saved->output_final && grads.size() > 1 ? grads[1] : at::Tensor();
    if (!d_theta.defined()) d_theta = at::zeros({B, T, H, R}, phi.options());
    if (!d_final.defined()) d_final = at::zeros({layout.num_sequences, H, R}, state_options);
    d_final = d_final.to(sd);
    const at::Tensor w = omega_4d(saved->omega, sd);

    // Λ_r = Σ_t ω ⊙ dθ_t over the continuing tokens + dF_n of a continuing sequence ending here.
    at::Tensor lambda = at::zeros({L, H, R}, state_options);
    const std::int64_t n = layout.corrected_tokens;
    if (n > 0) lambda = lambda + (d_theta.narrow(1, 0, n).to(sd) * w).sum(1);
    for (std::size_t p = 0; p < layout.pieces.size(); ++p) {
      const Piece& piece = layout.pieces[p];
      if (piece.owns_final && piece.carry_in)
        lambda[layout.lane_of(static_cast<std::int64_t>(p))] += d_final[piece.seq];
    }
    const auto lambdas = allgather(group, lambda.flatten());
    at::Tensor g_out = at::zeros({L, H, R}, state_options);
    for (std::int64_t j = W - 1; j > layout.rank; --j)
      g_out = saved->later_maps[j].view({L, 1, 1}) * g_out +
              lambdas[static_cast<std::size_t>(j)].view({L, H, R});

    std::vector<at::Tensor> result(lv.size());
    std::string call_error;
    if (!layout.empty()) {
      call_error = error_of([&] {
        at::Tensor d_state = at::zeros(saved->state_aug.sizes(), state_options);
        if (layout.carry_out)
          for (std::int64_t lane = 0; lane < L; ++lane)
            d_state[layout.last_piece(lane)] += g_out[lane];
        if (saved->output_final)
          for (std::size_t p = 0; p < layout.pieces.size(); ++p)
            if (layout.pieces[p].owns_final)
              d_state[static_cast<std::int64_t>(p)] += d_final[layout.pieces[p].seq];
        std::vector<at::Tensor> inputs;
        std::vector<std::size_t> which;
        for (std::size_t i = 0; i < lv.size(); ++i)
          if (lv[i].defined() && lv[i].requires_grad()) inputs.push_back(lv[i]), which.push_back(i);
        if (inputs.empty()) return;
        const auto d = torch::autograd::grad({saved->out_aug, saved->state_aug}, inputs,
                                             {d_theta.to(saved->out_aug.scalar_type()), d_state},
                                             false, false, true);
        for (std::size_t i = 0; i < which.size(); ++i) result[which[i]] = d[i];
      });
    }
    for (std::size_t i = 0; i < lv.size(); ++i)
      if (lv[i].defined() && lv[i].requires_grad() && !result[i].defined())
        result[i] = at::zeros_like(lv[i]);

    // ω and initial_phase are shared by the ranks: their gradients are summed over the ranks. The
    // correction θ_t += ω ⊙ S_in adds Σ_t dθ_t ⊙ S_in to ω's.
    const at::Tensor& omega = lv[1];
    const at::Tensor& h0 = lv[2];
    const bool want_omega = omega.requires_grad(), want_h0 = h0.defined() && h0.requires_grad();
    at::Tensor d_omega = want_omega ? result[1].to(sd) : at::zeros({0}, state_options);
    if (want_omega && n > 0) {
      at::Tensor c = (d_theta.narrow(1, 0, n).to(sd) * s_in.unsqueeze(1))
                         .sum(at::IntArrayRef{0, 1});  // [H, R]
      if (omega.dim() == 1) c = c.sum(0);
      d_omega = d_omega + c;
    }
    at::Tensor dh0 = want_h0 ? result[2].to(sd) : at::zeros({0}, state_options);
    if (want_h0 && layout.rank == 0 && saved->output_final)
      for (auto seq : layout.empty_sequences) dh0[seq] += d_final[seq];
    at::Tensor reduced = at::cat({d_omega.flatten(), dh0.flatten(),
                                  at::full({1}, call_error.empty() ? 0.0 : 1.0, state_options)});
    allreduce_sum(group, reduced);
    if (reduced[-1].item<double>() != 0) {
      if (!call_error.empty()) TORCH_CHECK(false, call_error);
      TORCH_CHECK(false, saved->op, ": the backward pass failed on another rank");
    }
    if (want_omega)
      result[1] = reduced.narrow(0, 0, d_omega.numel()).view(omega.sizes()).to(omega.scalar_type());
    if (want_h0)
      result[2] =
          reduced.narrow(0, d_omega.numel(), dh0.numel()).view(h0.sizes()).to(h0.scalar_type());
    return {result[0], result[1], result[2], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// ---- public entry points ------------------------------------------------------------------------

OutputAndState gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& g, Impl impl, c10::optional<double> scale,
                   const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                   const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size,
                   const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                   const distributed::ProcessGroupPtr& group) {
  return run_linear(q, k, v, g, c10::nullopt, initial_state, theta, cu_seqlens,
                    LinearOptions{Family::gla, impl, scale, output_final_state, false, chunk_size,
                                  rotary_layout, false, group});
}

OutputAndState chunk_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& g, c10::optional<double> scale,
                         const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                         const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size,
                         const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                         const distributed::ProcessGroupPtr& group) {
  return gla(q, k, v, g, Impl::chunk, scale, initial_state, output_final_state, cu_seqlens,
             chunk_size, theta, rotary_layout, group);
}

OutputAndState fused_recurrent_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, c10::optional<double> scale,
                                   const c10::optional<at::Tensor>& initial_state,
                                   bool output_final_state,
                                   const c10::optional<at::Tensor>& cu_seqlens,
                                   const c10::optional<at::Tensor>& theta,
                                   RotaryLayout rotary_layout,
                                   const distributed::ProcessGroupPtr& group) {
  return gla(q, k, v, g, Impl::recurrent, scale, initial_state, output_final_state, cu_seqlens, 64,
             theta, rotary_layout, group);
}

OutputAndState gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& g, const at::Tensor& beta, Impl impl,
                                c10::optional<double> scale,
                                const c10::optional<at::Tensor>& initial_state,
                                bool output_final_state,
                                const c10::optional<at::Tensor>& cu_seqlens,
                                bool use_qk_l2norm_in_kernel, std::int64_t chunk_size,
                                const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                                const distributed::ProcessGroupPtr& group) {
  return run_linear(
      q, k, v, g, beta, initial_state, theta, cu_seqlens,
      LinearOptions{Family::gated_delta_rule, impl, scale, output_final_state,
                    use_qk_l2norm_in_kernel, chunk_size, rotary_layout, false, group});
}

OutputAndState chunk_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, c10::optional<double> scale,
    const c10::optional<at::Tensor>& initial_state, bool output_final_state,
    const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
    std::int64_t chunk_size, const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
    const distributed::ProcessGroupPtr& group) {
  return gated_delta_rule(q, k, v, g, beta, Impl::chunk, scale, initial_state, output_final_state,
                          cu_seqlens, use_qk_l2norm_in_kernel, chunk_size, theta, rotary_layout,
                          group);
}

OutputAndState fused_recurrent_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, c10::optional<double> scale,
    const c10::optional<at::Tensor>& initial_state, bool output_final_state,
    const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
    const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
    const distributed::ProcessGroupPtr& group) {
  return gated_delta_rule(q, k, v, g, beta, Impl::recurrent, scale, initial_state,
                          output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, 64, theta,
                          rotary_layout, group);
}

std::tuple<at::Tensor, c10::optional<at::Tensor>> selective_rope_phases(
    const at::Tensor& phi, const at::Tensor& omega, const c10::optional<at::Tensor>& initial_phase,
    bool output_final_phase, const c10::optional<at::Tensor>& cu_seqlens,
    const distributed::ProcessGroupPtr& group) {
  TORCH_CHECK(group,
              "cp::selective_rope_phases: argument 'group': expected a process group, got none");
  TORCH_CHECK(phi.defined() && omega.defined(), "cp::selective_rope_phases: argument '",
              phi.defined() ? "omega" : "phi", "': expected a tensor, got an undefined tensor");
  const bool needs_grad =
      at::GradMode::is_enabled() &&
      (requires_grad(phi) || requires_grad(omega) || requires_grad(initial_phase));
  const variable_list out = PhaseFunction::apply(
      phi, omega, initial_phase, cu_seqlens, PhaseOptions{output_final_phase, needs_grad, group});
  c10::optional<at::Tensor> final_phase;
  if (output_final_phase) final_phase = out[1];
  return {out[0], final_phase};
}

}  // namespace phasor::cp
