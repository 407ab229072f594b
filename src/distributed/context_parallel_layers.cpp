// Context-parallel short convolution (cp::causal_conv1d) and the c10d implementation of the layers'
// phasor::nn::ContextParallel interface (cp::layer_context), phasor/context_parallel.h.
//
// ---- causal_conv1d across ranks -----------------------------------------------------------------
// y_t = act(bias + Σ_{j<W} weight[:, j] ⊙ x_{t−W+1+j}) only reads the W−1 inputs before token t,
// so a rank needs, for the piece of a sequence its slice starts with, the W−1 inputs before its
// slice (the halo). Every input at a global position p of the halo of rank r lies in the last W−1
// tokens of the rank q < r that owns it (q's slice ends at or before r's begins, so
// end_q − p ≤ begin_r − p ≤ W−1). Hence one allgather of every rank's last min(T_q, W−1) inputs
// (its tail, padded to W−1: [B, W−1, D] per rank) gives every halo, however short the slices.
// Each local piece of a sequence n (global range [s_n, e_n)) then runs the single-process op from
// the cache columns j = 0 … W−2 of positions p = begin − (W−1) + j:
//   x_p                                   (p ≥ s_n, from the owner's tail),
//   initial_state[n][:, W−1 − (s_n − p)]  (p < s_n: the cache before the sequence, or 0),
// which is exact: the op with that cache sees exactly the inputs of the single-process call.
// final_state[n] is the final cache of the piece holding the sequence's last token (the op's
// own, which handles sequences shorter than W−1 through the cache), initial_state[n] (or 0) for
// an empty sequence (rank 0); the contributions are summed by one allreduce.
// Backward: the local op's backward through the same construction gives dx, dweight, dbias,
// d initial_state and the gradient of every gathered tail; one allreduce of
// [d tails | dweight | dbias | d initial_state] returns each tail's gradient to its owner (which
// adds it to dx of its last tokens) and the replicated arguments' gradients whole on every rank.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/collectives.h"
#include "phasor/context_parallel.h"
#include "phasor/nn.h"
#include "torch/layer_util.h"

namespace phasor::cp {
namespace {

using detail::allgather;
using detail::allreduce_sum;
using detail::check_agreement;
using detail::error_of;
using detail::exchange_header;
using detail::fingerprint;
using torch_detail::shape_of;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const char* const kConvOp = "cp::causal_conv1d";

// ---- the layout of the convolution --------------------------------------------------------------

struct ConvPiece {
  std::int64_t seq = 0, begin = 0, end = 0;  // sequence, local token range [begin, end)
};

struct ConvLayout : torch::CustomClassHolder {
  distributed::ProcessGroupPtr group;
  int world = 1, rank = 0;
  bool varlen = false;
  std::int64_t batch = 1, channels = 0, halo = 0;  // B, D, W − 1
  std::vector<std::int64_t> offsets;               // [R + 1] global slice offsets
  std::vector<std::int64_t> starts, ends;          // per sequence, global [s_n, e_n)
  std::vector<ConvPiece> pieces;                   // this slice's pieces (nonempty), in order
  std::string activation;
  bool output_final = false;
  // Saved for the backward pass (detached).
  at::Tensor x, weight, bias, initial_state, tails;

  std::int64_t num_sequences() const { return static_cast<std::int64_t>(starts.size()); }
  std::int64_t begin() const { return offsets[static_cast<std::size_t>(rank)]; }
  std::int64_t length() const { return offsets[static_cast<std::size_t>(rank) + 1] - begin(); }
};

// The input at global position p of sequence n (batch row `row`) as a [D] vector, for p before
// this slice: from the owner's gathered tail, the initial state, or zeros (see the top).
at::Tensor halo_input(const ConvLayout& l, const at::Tensor& tails, const at::Tensor& init,
                      std::int64_t n, std::int64_t row, std::int64_t p, const at::Tensor& zero) {
  const std::int64_t s = l.starts[static_cast<std::size_t>(n)];
  if (p >= s) {
    int q = 0;
    while (l.offsets[static_cast<std::size_t>(q) + 1] <= p) ++q;
    const std::int64_t j = p - (l.offsets[static_cast<std::size_t>(q) + 1] - l.halo);
    return tails.select(0, q).select(0, row).select(0, j);
  }
  const std::int64_t j = l.halo - (s - p);
  if (init.defined() && j >= 0) return init.select(0, n).select(1, j);
  return zero;
}

// This rank's outputs and final-state contributions [N, D, W−1] from its inputs and every tail
// [R, B, W−1, D]; differentiable (the backward pass runs it with autograd).
std::pair<at::Tensor, at::Tensor> local_forward(const ConvLayout& l, const at::Tensor& x,
                                                const at::Tensor& weight, const at::Tensor& bias,
                                                const at::Tensor& init, const at::Tensor& tails) {
  const std::int64_t N = l.num_sequences(), D = l.channels, Wm = l.halo;
  const auto opts = x.options();
  const at::Tensor zero = at::zeros({D}, opts);
  const at::Tensor init_x = init.defined() ? init.to(x.scalar_type()) : init;
  c10::optional<at::Tensor> bias_opt;
  if (bias.defined()) bias_opt = bias;
  at::Tensor y;
  std::vector<at::Tensor> finals(static_cast<std::size_t>(N));
  if (l.pieces.empty()) {
    y = x * 0;  // an empty slice: [B, 0, D]
  } else if (Wm == 0) {
    at::Tensor cu;
    if (l.varlen) {
      std::vector<std::int64_t> c;
      for (const auto& pc : l.pieces) c.push_back(pc.begin);
      c.push_back(l.length());
      cu = at::tensor(c, at::kLong);
    }
    y = std::get<0>(phasor::causal_conv1d(x, weight, bias_opt, l.activation, c10::nullopt, false,
                                          l.varlen ? c10::optional<at::Tensor>(cu) : c10::nullopt));
  } else {
    std::vector<at::Tensor> caches;
    std::vector<std::int64_t> cu;
    for (std::size_t m = 0; m < l.pieces.size(); ++m) {
      const ConvPiece& pc = l.pieces[m];
      const std::int64_t row = l.varlen ? 0 : pc.seq, gbegin = l.begin() + pc.begin;
      std::vector<at::Tensor> cols;
      for (std::int64_t j = 0; j < Wm; ++j)
        cols.push_back(halo_input(l, tails, init_x, pc.seq, row, gbegin - Wm + j, zero));
      caches.push_back(at::stack(cols, 1));  // [D, W−1]
      cu.push_back(pc.begin);
    }
    cu.push_back(l.length());
    c10::optional<at::Tensor> cu_local;
    if (l.varlen) cu_local = at::tensor(cu, at::kLong);
    auto [out, fin] = phasor::causal_conv1d(x, weight, bias_opt, l.activation, at::stack(caches, 0),
                                            true, cu_local);
    y = out;
    for (std::size_t m = 0; m < l.pieces.size(); ++m) {
      const ConvPiece& pc = l.pieces[m];
      if (l.begin() + pc.end == l.ends[static_cast<std::size_t>(pc.seq)])
        finals[static_cast<std::size_t>(pc.seq)] = fin->select(0, static_cast<std::int64_t>(m));
    }
  }
  // An empty sequence keeps its initial cache; rank 0 contributes it (counted once).
  for (std::int64_t n = 0; n < N; ++n) {
    auto& f = finals[static_cast<std::size_t>(n)];
    if (l.rank == 0 && l.starts[static_cast<std::size_t>(n)] == l.ends[static_cast<std::size_t>(n)])
      f = init_x.defined() ? init_x.select(0, n) : at::zeros({D, Wm}, opts);
    if (!f.defined()) f = at::zeros({D, Wm}, opts);
  }
  return {y, at::stack(finals, 0)};
}

// The last min(T_r, W−1) inputs of this slice, right-aligned in [B, W−1, D] (zeros before).
at::Tensor own_tail(const ConvLayout& l, const at::Tensor& x) {
  at::Tensor tail = at::zeros({l.batch, l.halo, l.channels}, x.options());
  const std::int64_t n = std::min(l.length(), l.halo);
  if (n > 0) tail.narrow(1, l.halo - n, n).copy_(x.narrow(1, l.length() - n, n));
  return tail;
}

c10::intrusive_ptr<ConvLayout> layout_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<ConvLayout>(ctx->saved_data["layout"].toCapsule());
}

struct ConvFunction : torch::autograd::Function<ConvFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const c10::optional<at::Tensor>& bias_opt,
                               const c10::optional<at::Tensor>& init_opt,
                               c10::intrusive_ptr<ConvLayout> l) {
    const at::Tensor bias = bias_opt ? *bias_opt : at::Tensor();
    const at::Tensor init = init_opt ? *init_opt : at::Tensor();
    at::Tensor tails;
    if (l->halo > 0) tails = at::stack(allgather(l->group, own_tail(*l, x)), 0);
    auto [y, contributions] = local_forward(*l, x, weight, bias, init, tails);
    at::Tensor final_state = contributions.contiguous();
    if (final_state.numel() > 0) allreduce_sum(l->group, final_state);
    l->x = x.detach(), l->weight = weight.detach();
    l->bias = bias.defined() ? bias.detach() : bias;
    l->initial_state = init.defined() ? init.detach() : init;
    l->tails = tails;
    ctx->saved_data["layout"] = c10::IValue::make_capsule(l);
    return {y, final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto l = layout_of(ctx);
    at::Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(l->x);
    at::Tensor dfinal = grads[1];
    // Recompute this rank's part with autograd from detached leaves.
    auto leaf = [](const at::Tensor& t) {
      return t.defined() ? t.detach().requires_grad_(true) : t;
    };
    at::Tensor x = leaf(l->x), weight = leaf(l->weight), bias = leaf(l->bias),
               init = leaf(l->initial_state), tails = leaf(l->tails);
    std::vector<at::Tensor> inputs, outputs, grad_outputs;
    {
      at::AutoGradMode enable(true);
      auto [y, contributions] = local_forward(*l, x, weight, bias, init, tails);
      if (y.requires_grad()) outputs.push_back(y), grad_outputs.push_back(dy);
      if (dfinal.defined() && contributions.requires_grad())
        outputs.push_back(contributions), grad_outputs.push_back(dfinal);
    }
    std::vector<at::Tensor*> wanted{&x, &weight, &bias, &init, &tails};
    std::vector<at::Tensor> result(wanted.size());
    for (auto* t : wanted)
      if (t->defined()) inputs.push_back(*t);
    if (!outputs.empty()) {
      const auto g = torch::autograd::grad(outputs, inputs, grad_outputs, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
      std::size_t i = 0;
      for (std::size_t w = 0; w < wanted.size(); ++w)
        if (wanted[w]->defined()) result[w] = g[i++];
    }
    for (std::size_t w = 0; w < wanted.size(); ++w)
      if (wanted[w]->defined() && !result[w].defined()) result[w] = at::zeros_like(*wanted[w]);
    // One allreduce (float64) of the tails' and the replicated arguments' gradients.
    std::vector<at::Tensor> parts;
    for (std::size_t w = 1; w < wanted.size(); ++w)
      if (result[w].defined()) parts.push_back(result[w].to(at::kDouble).flatten());
    at::Tensor reduced = at::cat(parts).contiguous();
    allreduce_sum(l->group, reduced);
    std::int64_t at_ = 0;
    for (std::size_t w = 1; w < wanted.size(); ++w) {
      if (!result[w].defined()) continue;
      const std::int64_t n = result[w].numel();
      result[w] = reduced.narrow(0, at_, n).view(result[w].sizes()).to(result[w].scalar_type());
      at_ += n;
    }
    at::Tensor dx = result[0];
    const std::int64_t n = std::min(l->length(), l->halo);
    if (n > 0)
      dx.narrow(1, l->length() - n, n).add_(result[4].select(0, l->rank).narrow(1, l->halo - n, n));
    return {dx, result[1], result[2], result[3], at::Tensor()};
  }
};

// ---- the layers' interface ----------------------------------------------------------------------

// Identity forward; backward keeps the gradient on rank 0 only. For an argument whose cp:: op
// returns its gradient whole on every rank, this makes the ranks' gradients shares that sum to it
// (nn.h: "gradients ... their sum over the ranks").
struct RankZeroShareFunction : torch::autograd::Function<RankZeroShareFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, std::int64_t rank) {
    ctx->saved_data["rank"] = rank;
    return t.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool keep = ctx->saved_data["rank"].toInt() == 0;
    return {keep ? grads[0] : at::zeros_like(grads[0]), at::Tensor()};
  }
};

class LayerContext final : public nn::ContextParallel {
 public:
  explicit LayerContext(distributed::ProcessGroupPtr group) : group_(std::move(group)) {}
  int rank() const override { return group_->getRank(); }
  int world_size() const override { return group_->getSize(); }

  std::int64_t token_offset(std::int64_t slice_length) override {
    const auto all = allgather(group_, at::full({1}, slice_length, at::kLong));
    std::int64_t offset = 0;
    for (int r = 0; r < rank(); ++r)
      offset += all[static_cast<std::size_t>(r)].item<std::int64_t>();
    return offset;
  }

  OutputAndState gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& g, Impl impl, c10::optional<double> scale,
                     const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                     const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size,
                     const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout) override {
    return cp::gla(q, k, v, g, impl, scale, share(initial_state), output_final_state, cu_seqlens,
                   chunk_size, theta, rotary_layout, group_);
  }

  OutputAndState gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& g, const at::Tensor& beta, Impl impl,
                                  c10::optional<double> scale,
                                  const c10::optional<at::Tensor>& initial_state,
                                  bool output_final_state,
                                  const c10::optional<at::Tensor>& cu_seqlens,
                                  bool use_qk_l2norm_in_kernel, std::int64_t chunk_size,
                                  const c10::optional<at::Tensor>& theta,
                                  RotaryLayout rotary_layout) override {
    return cp::gated_delta_rule(q, k, v, g, beta, impl, scale, share(initial_state),
                                output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, chunk_size,
                                theta, rotary_layout, group_);
  }

  at::Tensor forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& g, Impl impl, c10::optional<double> scale,
                             c10::optional<std::int64_t> window_size,
                             const c10::optional<at::Tensor>& cu_seqlens, std::int64_t block_size,
                             const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                             const c10::optional<at::Tensor>& bias_q_slope,
                             const c10::optional<at::Tensor>& bias_k_slope) override {
    return cp::forgetting_attn(q, k, v, g, impl, scale, window_size, cu_seqlens, block_size, theta,
                               rotary_layout, bias_q_slope, bias_k_slope, group_);
  }

  std::tuple<at::Tensor, c10::optional<at::Tensor>> selective_rope_phases(
      const at::Tensor& phi, const at::Tensor& omega,
      const c10::optional<at::Tensor>& initial_phase, bool output_final_phase,
      const c10::optional<at::Tensor>& cu_seqlens) override {
    return cp::selective_rope_phases(phi, share(omega), share(initial_phase), output_final_phase,
                                     cu_seqlens, group_);
  }

  std::tuple<at::Tensor, c10::optional<at::Tensor>> causal_conv1d(
      const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
      const std::string& activation, const c10::optional<at::Tensor>& initial_state,
      bool output_final_state, const c10::optional<at::Tensor>& cu_seqlens) override {
    return cp::causal_conv1d(x, share(weight), share(bias), activation, share(initial_state),
                             output_final_state, cu_seqlens, group_);
  }

 private:
  // Replicated arguments whose cp:: gradient is whole on every rank become shares (see above).
  at::Tensor share(const at::Tensor& t) const {
    if (!t.defined() || !t.requires_grad() || !at::GradMode::is_enabled()) return t;
    return RankZeroShareFunction::apply(t, static_cast<std::int64_t>(rank()));
  }
  c10::optional<at::Tensor> share(const c10::optional<at::Tensor>& t) const {
    if (!t) return t;
    return share(*t);
  }

  distributed::ProcessGroupPtr group_;
};

}  // namespace

// ---- causal_conv1d ------------------------------------------------------------------------------

std::tuple<at::Tensor, c10::optional<at::Tensor>> causal_conv1d(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const std::string& activation, const c10::optional<at::Tensor>& initial_state,
    bool output_final_state, const c10::optional<at::Tensor>& cu_seqlens,
    const distributed::ProcessGroupPtr& group) {
  TORCH_CHECK(group, kConvOp, ": argument 'group': expected a process group, got none");
  // Local checks; their failure is exchanged so that every rank raises.
  std::vector<std::int64_t> cu;
  std::int64_t N = 0;
  const std::string error = error_of([&] {
    auto check = [](bool ok, const char* name, const std::string& expected,
                    const std::string& got) {
      TORCH_CHECK(ok, kConvOp, ": argument '", name, "': expected ", expected, ", got ", got);
    };
    check(x.defined() && x.dim() == 3, "x", "a tensor [B, T_r, D]",
          x.defined() ? "shape " + shape_of(x) : "an undefined tensor");
    check(x.device().is_cpu(), "x", "a CPU tensor", "device " + x.device().str());
    check(
        weight.defined() && weight.dim() == 2 && weight.size(0) == x.size(2) && weight.size(1) >= 1,
        "weight", "a tensor [D = " + std::to_string(x.size(2)) + ", W ≥ 1]",
        weight.defined() ? "shape " + shape_of(weight) : "an undefined tensor");
    if (bias)
      check(bias->dim() == 1 && bias->size(0) == x.size(2), "bias",
            "a tensor [D = " + std::to_string(x.size(2)) + "]", "shape " + shape_of(*bias));
    check(activation == "none" || activation == "silu", "activation", "\"none\" or \"silu\"",
          "\"" + activation + "\"");
    if (cu_seqlens) {
      const at::Tensor& c = *cu_seqlens;
      check(c.dim() == 1 && c.numel() >= 1 &&
                (c.scalar_type() == at::kInt || c.scalar_type() == at::kLong),
            "cu_seqlens", "a 1-D int32/int64 tensor [N + 1] of global offsets",
            "shape " + shape_of(c) + " of dtype " + c10::toString(c.scalar_type()));
      check(x.size(0) == 1, "cu_seqlens", "a batch of B = 1 with cu_seqlens",
            "B = " + std::to_string(x.size(0)));
      const at::Tensor cl = c.to(at::kLong).contiguous();
      cu.assign(cl.data_ptr<std::int64_t>(), cl.data_ptr<std::int64_t>() + cl.numel());
      check(cu[0] == 0, "cu_seqlens", "cu_seqlens[0] = 0", std::to_string(cu[0]));
      for (std::size_t i = 1; i < cu.size(); ++i)
        check(cu[i] >= cu[i - 1], "cu_seqlens", "non-decreasing offsets",
              "cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(cu[i]));
      N = static_cast<std::int64_t>(cu.size()) - 1;
    } else {
      N = x.size(0);
    }
    if (initial_state)
      check(initial_state->dim() == 3 && initial_state->size(0) == N &&
                initial_state->size(1) == x.size(2) && initial_state->size(2) == weight.size(1) - 1,
            "initial_state",
            "a tensor [N = " + std::to_string(N) + ", D = " + std::to_string(x.size(2)) +
                ", W − 1 = " + std::to_string(weight.size(1) - 1) + "]",
            "shape " + shape_of(*initial_state));
  });
  const bool ok = error.empty();
  const std::vector<std::int64_t> fields{ok ? x.size(1) : 0,
                                         ok ? x.size(0) : 0,
                                         ok ? x.size(2) : 0,
                                         ok ? weight.size(1) : 0,
                                         ok ? static_cast<std::int64_t>(x.scalar_type()) : 0,
                                         activation == "silu",
                                         bias.has_value(),
                                         initial_state.has_value(),
                                         output_final_state,
                                         fingerprint(cu.empty() ? nullptr : &cu),
                                         N};
  const auto all = exchange_header(group, fields, error);
  check_agreement(kConvOp, all,
                  {{1, "x", "batch size B"},
                   {2, "x", "channels D"},
                   {3, "weight", "kernel width W"},
                   {4, "x", "dtype"},
                   {5, "activation", "activation"},
                   {6, "bias", "presence"},
                   {7, "initial_state", "presence"},
                   {8, "output_final_state", "flag"},
                   {9, "cu_seqlens", "global offsets"},
                   {10, "cu_seqlens", "number of sequences"}});

  auto l = c10::make_intrusive<ConvLayout>();
  l->group = group;
  l->world = group->getSize();
  l->rank = group->getRank();
  l->varlen = cu_seqlens.has_value();
  l->batch = x.size(0), l->channels = x.size(2), l->halo = weight.size(1) - 1;
  l->activation = activation;
  l->output_final = output_final_state;
  l->offsets.push_back(0);
  for (const auto& f : all) l->offsets.push_back(l->offsets.back() + f[0]);
  const std::int64_t total = l->offsets.back();
  if (l->varlen) {
    TORCH_CHECK(cu.back() == total, kConvOp,
                ": argument 'cu_seqlens': expected cu_seqlens[N] = ", total,
                " (the sum of the ranks' slice lengths), got ", cu.back());
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t s = cu[static_cast<std::size_t>(n)],
                         e = cu[static_cast<std::size_t>(n) + 1];
      l->starts.push_back(s), l->ends.push_back(e);
      const std::int64_t lo = std::max(s, l->begin()), hi = std::min(e, l->begin() + l->length());
      if (hi > lo) l->pieces.push_back({n, lo - l->begin(), hi - l->begin()});
    }
  } else {
    for (std::int64_t b = 0; b < N; ++b) {
      l->starts.push_back(0), l->ends.push_back(total);
      if (l->length() > 0) l->pieces.push_back({b, 0, l->length()});
    }
  }
  const variable_list out = ConvFunction::apply(x, weight, bias, initial_state, l);
  c10::optional<at::Tensor> final_state;
  if (output_final_state) final_state = out[1];
  return {out[0], final_state};
}

// ---- Layers -------------------------------------------------------------------------------------

std::shared_ptr<nn::ContextParallel> layer_context(const distributed::ProcessGroupPtr& group) {
  TORCH_CHECK(group, "cp::layer_context: argument 'group': expected a process group, got none");
  return std::make_shared<LayerContext>(group);
}

}  // namespace phasor::cp
