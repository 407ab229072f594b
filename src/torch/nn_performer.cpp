// phasor::nn::PerformerAttention (phasor/nn.h): FAVOR+ linear attention on phasor's favor ops.
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "layer_util.h"
#include "nn_util.h"
#include "phasor/nn.h"

namespace phasor::nn {
namespace {

using torch_detail::shape_of;

constexpr const char* kLayer = "PerformerAttention";

void check_option(bool ok, const char* name, const std::string& expected, const std::string& got) {
  detail::check_option(ok, kLayer, name, expected, got);
}

}  // namespace

PerformerAttentionImpl::PerformerAttentionImpl(PerformerAttentionOptions options_)
    : options(std::move(options_)) {
  reset();
}

void PerformerAttentionImpl::reset() {
  const auto& o = options;
  check_option(o.hidden_size() > 0, "hidden_size", "a positive number",
               std::to_string(o.hidden_size()));
  check_option(o.num_heads() > 0, "num_heads", "a positive number", std::to_string(o.num_heads()));
  const std::int64_t D = o.hidden_size(), H = o.num_heads();
  check_option(D % H == 0, "hidden_size", "a multiple of num_heads = " + std::to_string(H),
               std::to_string(D));
  check_option(o.num_features() > 0, "num_features", "a positive number of random features m",
               std::to_string(o.num_features()));
  check_option(o.chunk_size() > 0, "chunk_size", "a positive number",
               std::to_string(o.chunk_size()));
  head_dim = D / H;
  const std::int64_t K = head_dim;
  // The learnable rotation encodings (string_cayley, string_circulant, grape) live in the
  // attention layers' RotationEncodings; this layer applies only RoPE and Selective RoPE.
  check_option(o.pos_encoding() == PosEncoding::none || o.pos_encoding() == PosEncoding::rope ||
                   o.pos_encoding() == PosEncoding::selective_rope,
               "pos_encoding", "none, rope or selective_rope",
               "another encoding (the learnable rotations are not supported by this layer)");
  if (o.pos_encoding() != PosEncoding::none)
    check_option(K % 2 == 0, "pos_encoding", "an even head dimension K (rotation acts on pairs)",
                 "K = " + std::to_string(K));
  if (o.pos_encoding() == PosEncoding::rope)
    check_option(o.rope_theta() > 1.0, "rope_theta", "a base > 1", std::to_string(o.rope_theta()));

  auto linear = [](std::int64_t in, std::int64_t out, bool bias) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", linear(D, D, o.qkv_bias()));
  k_proj = register_module("k_proj", linear(D, D, o.qkv_bias()));
  v_proj = register_module("v_proj", linear(D, D, o.qkv_bias()));
  o_proj = register_module("o_proj", linear(D, D, false));
  features = register_buffer(
      "features", phasor::favor_random_matrix(
                      o.num_features(), K, o.seed(), o.feature_kind(),
                      o.per_head_features() ? c10::optional<std::int64_t>(H) : c10::nullopt));
  if (o.pos_encoding() == PosEncoding::selective_rope) {
    auto ro = o.selective_rope();
    ro.hidden_size(D).num_heads(H).head_dim(K);
    rope = register_module("rope", SelectiveRoPE(ro));
  }
}

void PerformerAttentionImpl::redraw_features(std::uint64_t seed) {
  options.seed(seed);
  torch::NoGradGuard no_grad;
  const auto& o = options;
  features.copy_(phasor::favor_random_matrix(
      o.num_features(), head_dim, seed, o.feature_kind(),
      o.per_head_features() ? c10::optional<std::int64_t>(o.num_heads()) : c10::nullopt,
      features.scalar_type()));
}

at::Tensor PerformerAttentionImpl::forward(const at::Tensor& x, LayerCache* cache) {
  const auto& o = options;
  const std::int64_t D = o.hidden_size(), H = o.num_heads(), K = head_dim, m = o.num_features();
  TORCH_CHECK(x.defined() && x.dim() == 3 && x.size(2) == D && x.size(1) >= 1, kLayer,
              ": argument 'x': expected shape [B, T ≥ 1, ", D, "], got ",
              x.defined() ? "shape " + shape_of(x) : std::string("an undefined tensor"));
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, kLayer,
              ": argument 'x': expected dtype float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), kLayer, ": argument 'x': expected a CPU tensor, got device ",
              x.device());
  TORCH_CHECK(x.scalar_type() == q_proj->weight.scalar_type(), kLayer,
              ": argument 'x': expected dtype ", q_proj->weight.scalar_type(),
              " (the module's parameters; convert with module->to(...)), got ", x.scalar_type());
  TORCH_CHECK(!o.context_parallel(), kLayer,
              ": option 'context_parallel': not supported (FAVOR+ attention has no "
              "context-parallel path); use GatedLinearAttention, GatedDeltaNet or "
              "ForgettingAttention, or run this layer on the whole sequence");
  TORCH_CHECK(cache == nullptr || o.causal(), kLayer,
              ": argument 'cache': expected no cache for a non-causal layer (incremental "
              "decoding needs causal = true), got a cache");
  const std::int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = q_proj->forward(x).reshape({B, T, H, K});
  at::Tensor k = k_proj->forward(x).reshape({B, T, H, K});
  const at::Tensor v = v_proj->forward(x).reshape({B, T, H, K});

  // Rotation (explicit: the features are taken of the rotated q, k).
  at::Tensor theta;
  if (o.pos_encoding() == PosEncoding::rope) {
    theta = phasor::rope_angles(B, T, K, o.rope_theta(), cache ? cache->offset : 0, c10::nullopt,
                                x.scalar_type());  // [B, T, K/2], shared by the heads
  } else if (o.pos_encoding() == PosEncoding::selective_rope) {
    theta = rope->forward(x, cache ? &cache->rope : nullptr);
  }
  if (theta.defined()) {
    q = phasor::apply_rotary(q, theta, o.rotary_layout());
    k = phasor::apply_rotary(k, theta, o.rotary_layout());
  }
  const at::Tensor w = features.to(x.scalar_type());

  at::Tensor out;
  if (!cache) {
    out = phasor::favor_attention(q, k, v, w, o.causal(), c10::nullopt, c10::nullopt, Impl::chunk,
                                  o.chunk_size());
  } else {
    // Causal decoding with running sums in float64. With u_r(x) = w_rᵀx − |x|²/2 (x scaled by
    // K^{−1/4}, as favor_attention), the state holds S = Σ_j exp(u(k_j) − c) v_jᵀ/√m and
    // z = Σ_j exp(u(k_j) − c)/√m for the running key stabiliser c = max_j,r u_r(k_j): a larger
    // key rescales S and z by exp(c_old − c_new). c cancels in o_t = φ(q_t)ᵀS / φ(q_t)ᵀz, as the
    // same running stabiliser does in the parallel causal forward (phasor/favor.h), so both give
    // the same o.
    const double s = std::pow(static_cast<double>(K), -0.25), inv_sqrt_m = 1.0 / std::sqrt(m);
    const at::Tensor wd = w.to(at::kDouble);
    auto logits = [&](const at::Tensor& y) {  // y: [B, H, K] → u: [B, H, m]
      const at::Tensor ys = y.to(at::kDouble) * s;
      const at::Tensor proj = wd.dim() == 3 ? at::einsum("bhd,hmd->bhm", {ys, wd})
                                            : at::einsum("bhd,md->bhm", {ys, wd});
      return proj - 0.5 * ys.pow(2).sum(-1, /*keepdim=*/true);
    };
    if (!cache->favor_state.defined()) {
      const auto opt = x.options().dtype(at::kDouble);
      cache->favor_state = at::zeros({B, H, m, K}, opt);
      cache->favor_norm = at::zeros({B, H, m}, opt);
      cache->favor_max = at::full({B, H}, -std::numeric_limits<double>::infinity(), opt);
    }
    std::vector<at::Tensor> rows;
    rows.reserve(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) {
      const at::Tensor uk = logits(k.select(1, t));
      const at::Tensor c_new = at::maximum(cache->favor_max, std::get<0>(uk.max(-1)));
      const at::Tensor decay = (cache->favor_max - c_new).exp();  // 0 for the first token
      const at::Tensor phik = (uk - c_new.unsqueeze(-1)).exp() * inv_sqrt_m;  // [B, H, m]
      cache->favor_state = cache->favor_state * decay.unsqueeze(-1).unsqueeze(-1) +
                           phik.unsqueeze(-1) * v.select(1, t).to(at::kDouble).unsqueeze(2);
      cache->favor_norm = cache->favor_norm * decay.unsqueeze(-1) + phik;
      cache->favor_max = c_new;
      const at::Tensor uq = logits(q.select(1, t));
      const at::Tensor phiq = (uq - std::get<0>(uq.max(-1, /*keepdim=*/true))).exp();
      const at::Tensor num = at::einsum("bhm,bhmv->bhv", {phiq, cache->favor_state});
      const at::Tensor den = (phiq * cache->favor_norm).sum(-1, /*keepdim=*/true);
      rows.push_back((num / den).to(x.scalar_type()).unsqueeze(1));
    }
    out = at::cat(rows, 1);
    cache->offset += T;
  }
  return o_proj->forward(out.reshape({B, T, H * K}));
}

}  // namespace phasor::nn
