// Performer FAVOR+ and the additive FoX biases (ALiBi, GRAPE-A-QK) through LibTorch:
//  - the torch ops (favor_random_matrix, favor_features, favor_attention, forgetting_attn's
//    bias_q_slope / bias_k_slope, ForgettingAttnDecoder::step's slopes) against the core ops
//    called directly, against dense float64 computations, and their autograd against central
//    finite differences in float64;
//  - FAVOR+ attention converging to exact softmax attention as the number of features m grows;
//  - the layers PerformerAttention and ForgettingAttention (additive_bias): dense float64
//    references, dtypes, gradients reaching every parameter, cached decoding against the parallel
//    forward, clear errors;
//  - the harness entries "performer", "alibi", "grape_a": tiny runs that learn, and errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "phasor/favor.h"
#include "phasor/forgetting_attn.h"
#include "phasor/nn.h"
#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"
#include "phasor/tasks/train.h"
#include "phasor/torch.h"
#include "torch_test_util.h"

namespace phasor {
namespace {

using namespace torch_test;

// Central differences (h = 1e-6) of L = Σ R ⊙ f(inputs), R random, against autograd, for every
// element of every input (the sizes here are small), in float64 (the shared check).
void expect_fd_gradients(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                         const std::vector<at::Tensor>& inputs,
                         const std::vector<std::string>& names, double tol,
                         const std::string& what) {
  SCOPED_TRACE(what);
  const at::Tensor R = at::randn(f(inputs).sizes(), f64);
  check_finite_differences([&](const std::vector<at::Tensor>& in) { return (f(in) * R).sum(); },
                           inputs, names, tol);
}

// Dense float64 softmax attention with the FoX gate sums and the additive slopes, straight from
// the logit formula ℓ_ij = scale q_i·k_j + Σ_{s∈(j,i]} g_s − (i − j)(a_i + b_j), j ≤ i (causal) or
// all j (non-causal, no gates/slopes). q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V], g [B,T,HQ] or
// undefined, a [B,T,HQ] or undefined, b [B,T,H] or undefined. Differentiable (plain ATen).
at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& g, const at::Tensor& a, const at::Tensor& b,
                           double scale, bool causal = true) {
  const std::int64_t T = q.size(1), HQ = q.size(2), group = HQ / k.size(2);
  const at::Tensor kk = k.repeat_interleave(group, 2), vv = v.repeat_interleave(group, 2);
  at::Tensor logits = at::einsum("bihd,bjhd->bhij", {q, kk}) * scale;  // [B, HQ, T, T]
  const at::Tensor pos = at::arange(T, f64);
  const at::Tensor dist = pos.unsqueeze(1) - pos.unsqueeze(0);  // i − j
  if (g.defined()) {
    const at::Tensor c = g.cumsum(1).permute({0, 2, 1});  // inclusive Σ_{s ≤ i} g_s
    logits = logits + c.unsqueeze(-1) - c.unsqueeze(-2);
  }
  if (a.defined()) logits = logits - dist * a.permute({0, 2, 1}).unsqueeze(-1);
  if (b.defined())
    logits = logits - dist * b.repeat_interleave(group, 2).permute({0, 2, 1}).unsqueeze(-2);
  if (causal) logits = logits.masked_fill(at::ones({T, T}, at::kBool).triu(1), -INFINITY);
  return at::einsum("bhij,bjhv->bihv", {at::softmax(logits, -1), vv});
}

// ==== FAVOR+ torch ops ===========================================================================

TEST(FavorTorch, RandomMatrixIsTheCoresSeededAndReproducible) {
  for (auto kind :
       {FavorMatrixKind::orthogonal_chi, FavorMatrixKind::orthogonal_fixed, FavorMatrixKind::iid}) {
    const at::Tensor w = favor_random_matrix(10, 4, 7, kind, 3, at::kDouble);
    ASSERT_EQ(w.sizes(), (std::vector<std::int64_t>{3, 10, 4}));
    EXPECT_EQ(w.scalar_type(), at::kDouble);
    EXPECT_FALSE(w.requires_grad());
    at::Tensor expected = at::empty({3, 10, 4}, f64);
    phasor::favor_random_matrix(kind, 7, core_view(expected));
    EXPECT_TRUE(at::equal(w, expected)) << to_string(kind);
    EXPECT_TRUE(at::equal(w, favor_random_matrix(10, 4, 7, kind, 3, at::kDouble)));
    EXPECT_FALSE(at::equal(w, favor_random_matrix(10, 4, 8, kind, 3, at::kDouble)));  // redraw
    const at::Tensor shared = favor_random_matrix(5, 6, 1, kind);
    EXPECT_EQ(shared.sizes(), (std::vector<std::int64_t>{5, 6}));
    EXPECT_EQ(shared.scalar_type(), at::kFloat);
  }
  // orthogonal_fixed: rows of a block are orthogonal with norm √d.
  const at::Tensor w =
      favor_random_matrix(4, 4, 3, FavorMatrixKind::orthogonal_fixed, {}, at::kDouble);
  EXPECT_LE((w.matmul(w.t()) - 4.0 * at::eye(4, f64)).abs().max().item<double>(), 1e-12);
  expect_torch_error([] { favor_random_matrix(0, 4, 1); },
                     {"favor_random_matrix", "'num_features'", "0"});
  expect_torch_error([] { favor_random_matrix(4, 0, 1); }, {"favor_random_matrix", "'head_dim'"});
  expect_torch_error([] { favor_random_matrix(4, 4, 1, FavorMatrixKind::iid, 0); },
                     {"favor_random_matrix", "'num_heads'"});
  expect_torch_error([] { favor_random_matrix(4, 4, 1, FavorMatrixKind::iid, {}, at::kHalf); },
                     {"favor_random_matrix", "'dtype'", "Half"});
}

TEST(FavorTorch, FeaturesMatchTheCoreAndFiniteDifferences) {
  torch::manual_seed(1);
  const std::int64_t B = 2, T = 5, H = 2, d = 3, m = 7;
  for (bool per_head : {false, true})
    for (auto stab : {FavorStabilizer::query, FavorStabilizer::key, FavorStabilizer::none}) {
      const std::string what = std::string(per_head ? "per-head w" : "shared w") + ", stabiliser " +
                               std::to_string(static_cast<int>(stab));
      const at::Tensor x = at::randn({B, T, H, d}, f64) * 0.7;
      const at::Tensor w = per_head ? at::randn({H, m, d}, f64) : at::randn({m, d}, f64);
      // Forward: the core's, in float64 and float32 (which computes in float32).
      const at::Tensor phi = favor_features(x, w, stab);
      at::Tensor expected = at::empty({B, T, H, m}, f64);
      FavorFeatureParams p;
      p.x = core_view(x), p.w = core_view(w), p.stabilizer = stab;
      favor_features_forward(p, Impl::reference, core_view(expected));
      EXPECT_CLOSE(phi, expected, 1e-13, what);
      const at::Tensor phi32 = favor_features(x.to(at::kFloat), w.to(at::kFloat), stab);
      EXPECT_EQ(phi32.scalar_type(), at::kFloat);
      EXPECT_CLOSE(phi32, expected, 1e-5, what + " float32");
      // Gradients: those of the returned (stabilised) features, c's dependence included.
      expect_fd_gradients(
          [&](const std::vector<at::Tensor>& in) { return favor_features(in[0], in[1], stab); },
          {x, w}, {"x", "w"}, 1e-7, what);
    }
  // The stabiliser term matters: the core's fixed-c gradient alone is not the features' gradient.
  {
    const at::Tensor x = leaf(at::randn({1, 4, 2, 3}, f64)), w = at::randn({2, 5, 3}, f64);
    const at::Tensor d_phi = at::randn({1, 4, 2, 5}, f64);
    favor_features(x, w, FavorStabilizer::query).backward(d_phi);
    FavorFeatureParams p;
    const at::Tensor xc = x.detach().contiguous();
    p.x = core_view(xc), p.w = core_view(w), p.stabilizer = FavorStabilizer::query;
    at::Tensor dx_fixed = at::empty_like(xc);
    favor_features_backward(p, Impl::reference, core_view(d_phi), core_view(dx_fixed), {});
    EXPECT_GT(rel_rms(x.grad(), dx_fixed), 1e-2);
  }
  // Key stabiliser over packed sequences (cu_seqlens, B = 1, an empty sequence included).
  const at::Tensor x = at::randn({1, 9, 2, 3}, f64), w = at::randn({2, 5, 3}, f64);
  const at::Tensor cu = torch::tensor({0, 4, 4, 9}, at::kInt);
  expect_fd_gradients(
      [&](const std::vector<at::Tensor>& in) {
        return favor_features(in[0], in[1], FavorStabilizer::key, cu);
      },
      {x, w}, {"x", "w"}, 1e-7, "key stabiliser, cu_seqlens");
  // The stabiliser is per sequence: each sequence's largest feature is exactly 1/√m.
  const at::Tensor phi = favor_features(x, w, FavorStabilizer::key, cu);
  EXPECT_NEAR(phi.narrow(1, 0, 4).select(2, 0).max().item<double>(), 1 / std::sqrt(5.0), 1e-15);
  EXPECT_NEAR(phi.narrow(1, 4, 5).select(2, 1).max().item<double>(), 1 / std::sqrt(5.0), 1e-15);
}

TEST(FavorTorch, AttentionMatchesTheCoreForwardAndBackward) {
  torch::manual_seed(2);
  const std::int64_t B = 2, T = 11, H = 3, d = 4, V = 5, m = 9;
  for (bool causal : {false, true})
    for (bool per_head : {false, true}) {
      const std::string what =
          std::string(causal ? "causal" : "non-causal") + (per_head ? ", per-head w" : "");
      const at::Tensor q = at::randn({B, T, H, d}, f64), k = at::randn({B, T, H, d}, f64),
                       v = at::randn({B, T, H, V}, f64);
      const at::Tensor w = per_head ? at::randn({H, m, d}, f64) : at::randn({m, d}, f64);
      const at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), wl = leaf(w);
      const at::Tensor o = favor_attention(ql, kl, vl, wl, causal, {}, {}, Impl::chunk, 4);
      const at::Tensor d_o = at::randn(o.sizes(), f64);
      o.backward(d_o);
      // The core directly: forward and backward of the float64 reference.
      FavorAttentionParams p;
      p.q = core_view(q), p.k = core_view(k), p.v = core_view(v), p.w = core_view(w);
      p.causal = causal;
      at::Tensor eo = at::empty({B, T, H, V}, f64), dq = at::empty_like(q), dk = at::empty_like(k),
                 dv = at::empty_like(v), dw = at::empty_like(w);
      favor_attention_forward(p, Impl::reference, core_view(eo));
      favor_attention_backward(p, Impl::reference, core_view(d_o),
                               {core_view(dq), core_view(dk), core_view(dv), core_view(dw)});
      EXPECT_CLOSE(o, eo, 1e-11, what + " o");
      EXPECT_CLOSE(ql.grad(), dq, 1e-10, what + " dq");
      EXPECT_CLOSE(kl.grad(), dk, 1e-10, what + " dk");
      EXPECT_CLOSE(vl.grad(), dv, 1e-10, what + " dv");
      EXPECT_CLOSE(wl.grad(), dw, 1e-10, what + " dw");
      // float32 inputs compute in float32; float16 returns float16 (computed in float32).
      const at::Tensor o32 = favor_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                             w.to(at::kFloat), causal);
      EXPECT_EQ(o32.scalar_type(), at::kFloat);
      EXPECT_CLOSE(o32, eo, 1e-4, what + " float32");
      const at::Tensor o16 = favor_attention(q.to(at::kHalf), k.to(at::kHalf), v.to(at::kHalf),
                                             w.to(at::kFloat), causal);
      EXPECT_EQ(o16.scalar_type(), at::kHalf);
      EXPECT_CLOSE(o16, eo, 2e-2, what + " float16");
    }
}

TEST(FavorTorch, AttentionGradientsMatchFiniteDifferences) {
  torch::manual_seed(3);
  const std::int64_t T = 6, H = 2, d = 3, V = 2, m = 5;
  for (bool causal : {false, true}) {
    // Two packed sequences (4 + 2 tokens), and an odd scale.
    const at::Tensor cu = torch::tensor({0, 4, 6}, at::kLong);
    expect_fd_gradients(
        [&](const std::vector<at::Tensor>& in) {
          return favor_attention(in[0], in[1], in[2], in[3], causal, 0.37, cu, Impl::chunk, 3);
        },
        {at::randn({1, T, H, d}, f64), at::randn({1, T, H, d}, f64), at::randn({1, T, H, V}, f64),
         at::randn({H, m, d}, f64)},
        {"q", "k", "v", "w"}, 1e-7, causal ? "causal varlen" : "non-causal varlen");
    // Batch of 3, T = 3, shared w, the recurrent GLA path.
    expect_fd_gradients(
        [&](const std::vector<at::Tensor>& in) {
          return favor_attention(in[0], in[1], in[2], in[3], causal, {}, {}, Impl::recurrent);
        },
        {at::randn({3, 3, H, d}, f64), at::randn({3, 3, H, d}, f64), at::randn({3, 3, H, V}, f64),
         at::randn({m, d}, f64)},
        {"q", "k", "v", "w"}, 1e-7, causal ? "causal B=3" : "non-causal B=3");
    // T = 1: one key, so o = v exactly, and q, k, w get zero gradients.
    const at::Tensor q = leaf(at::randn({2, 1, H, d}, f64)), k = leaf(at::randn({2, 1, H, d}, f64)),
                     v = leaf(at::randn({2, 1, H, V}, f64)), w = leaf(at::randn({H, m, d}, f64));
    const at::Tensor o = favor_attention(q, k, v, w, causal);
    EXPECT_LE((o - v).abs().max().item<double>(), 1e-14);
    (o * at::randn(o.sizes(), f64)).sum().backward();
    for (const at::Tensor& x : {q, k, w}) {
      ASSERT_TRUE(x.grad().defined());
      EXPECT_LE(x.grad().abs().max().item<double>(), 1e-13);
    }
  }
}

TEST(FavorTorch, AttentionApproachesSoftmaxAttentionAsFeaturesGrow) {
  // Relative error against exact softmax attention (dense float64), averaged over 8 feature
  // draws: it must fall with m at about the Monte Carlo rate 1/√m (×16 features ≈ ÷4 error; at
  // small m the error saturates, as the outputs are convex combinations of the values).
  torch::manual_seed(4);
  const std::int64_t B = 1, T = 24, H = 2, d = 8, V = 4;
  const at::Tensor q = at::randn({B, T, H, d}, f64) * 0.5, k = at::randn({B, T, H, d}, f64) * 0.5,
                   v = at::randn({B, T, H, V}, f64);
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  for (bool causal : {false, true}) {
    const at::Tensor exact = dense_attention(q, k, v, {}, {}, {}, scale, causal);
    std::vector<double> errors;
    for (std::int64_t m : {64, 1024, 16384}) {
      double e = 0;
      for (std::uint64_t seed = 0; seed < 8; ++seed) {
        const at::Tensor w = favor_random_matrix(m, d, 100 * m + seed,
                                                 FavorMatrixKind::orthogonal_chi, H, at::kDouble);
        e += rel_rms(favor_attention(q, k, v, w, causal), exact) / 8;
      }
      errors.push_back(e);
    }
    std::printf("FAVOR+ vs softmax (%s), m = 64, 1024, 16384: %.4f %.4f %.4f\n",
                causal ? "causal" : "non-causal", errors[0], errors[1], errors[2]);
    const std::string what = causal ? "causal" : "non-causal";
    EXPECT_LT(errors[1], errors[0] / 2.5) << what << ": " << errors[0] << " → " << errors[1];
    EXPECT_LT(errors[2], errors[1] / 2.5) << what << ": " << errors[1] << " → " << errors[2];
    EXPECT_LT(errors[2], 0.02) << what;
  }
}

TEST(FavorTorch, Errors) {
  const at::Tensor q = at::randn({1, 3, 2, 4}), v = at::randn({1, 3, 2, 5}), w = at::randn({6, 4});
  expect_torch_error(
      [&] {
        favor_attention(q, at::randn({1, 3, 2, 3}), v, w);
      },
      {"favor_attention", "'k'", "[1, 3, 2, 3]"});
  expect_torch_error([&] { favor_attention(q, q, v, at::randn({6})); },
                     {"favor_attention", "'w'", "[m, d] or [H, m, d]"});
  expect_torch_error(
      [&] {
        favor_attention(q, q, v, at::randn({6, 3}));
      },
      {"favor_attention", "'w'"});
  expect_torch_error([&] { favor_attention(q, q, v, w, false, -1.0); },
                     {"favor_attention", "'scale'"});
  expect_torch_error([&] { favor_attention(q.to(at::kInt), q, v, w); },
                     {"favor_attention", "'q'", "dtype"});
  // First-order gradients only.
  const at::Tensor ql = leaf(q.to(at::kDouble));
  const at::Tensor o = favor_attention(ql, q.to(at::kDouble), v.to(at::kDouble), w, true);
  expect_torch_error(
      [&] {
        torch::autograd::grad({o.sum()}, {ql}, {}, /*retain_graph=*/true, /*create_graph=*/true);
      },
      {"favor_attention backward", "double backward"});
  const at::Tensor phi = favor_features(ql, w);
  expect_torch_error(
      [&] {
        torch::autograd::grad({phi.sum()}, {ql}, {}, /*retain_graph=*/true, /*create_graph=*/true);
      },
      {"favor_features backward", "double backward"});
  // w for 3 heads, x with 2.
  expect_torch_error(
      [&] {
        favor_features(q, at::randn({3, 6, 4}), FavorStabilizer::query);
      },
      {"favor_features", "'w'"});
}

// ==== additive slopes in forgetting_attn =========================================================

TEST(FoxSlopesTorch, MatchDenseAttentionAndFiniteDifferences) {
  torch::manual_seed(5);
  const std::int64_t B = 2, T = 9, HQ = 4, H = 2, K = 4, V = 3;
  const double scale = 1 / std::sqrt(static_cast<double>(K));
  for (Impl impl : {Impl::chunk, Impl::recurrent, Impl::reference})
    for (int which = 0; which < 3; ++which) {  // a only, b only, both
      const std::string what =
          "impl " + std::to_string(static_cast<int>(impl)) + ", slopes " + std::to_string(which);
      const at::Tensor q = at::randn({B, T, HQ, K}, f64), k = at::randn({B, T, H, K}, f64),
                       v = at::randn({B, T, H, V}, f64),
                       g = at::log_sigmoid(at::randn({B, T, HQ}, f64) + 2);
      // Slopes of either sign (a softmax needs none): realistic ones are positive.
      const at::Tensor a = which != 1 ? at::randn({B, T, HQ}, f64) * 0.5 : at::Tensor();
      const at::Tensor b = which != 0 ? at::randn({B, T, H}, f64) * 0.5 : at::Tensor();
      auto opt = [](const at::Tensor& t) {
        return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
      };
      const at::Tensor o = forgetting_attn(q, k, v, g, impl, {}, {}, {}, 4, {},
                                           RotaryLayout::half_split, opt(a), opt(b));
      EXPECT_CLOSE(o, dense_attention(q, k, v, g, a, b, scale), 1e-12, what);
      // Autograd against the dense float64 computation's autograd, every input.
      std::vector<at::Tensor> in1 = {leaf(q), leaf(k), leaf(v), leaf(g)};
      std::vector<at::Tensor> in2 = {leaf(q), leaf(k), leaf(v), leaf(g)};
      at::Tensor a1, a2, b1, b2;
      if (a.defined()) a1 = leaf(a), a2 = leaf(a);
      if (b.defined()) b1 = leaf(b), b2 = leaf(b);
      const at::Tensor R = at::randn(o.sizes(), f64);
      (forgetting_attn(in1[0], in1[1], in1[2], in1[3], impl, {}, {}, {}, 4, {},
                       RotaryLayout::half_split, opt(a1), opt(b1)) *
       R)
          .sum()
          .backward();
      (dense_attention(in2[0], in2[1], in2[2], in2[3], a2, b2, scale) * R).sum().backward();
      const char* names[] = {"dq", "dk", "dv", "dg"};
      for (int n = 0; n < 4; ++n)
        if (n != 3) {
          EXPECT_CLOSE(in1[n].grad(), in2[n].grad(), 1e-10, what + " " + names[n]);
        } else {
          // The first gate of each sequence never enters a sum: compare the others.
          EXPECT_CLOSE(in1[n].grad().narrow(1, 1, T - 1), in2[n].grad().narrow(1, 1, T - 1), 1e-10,
                       what + " dg");
        }
      if (a.defined()) EXPECT_CLOSE(a1.grad(), a2.grad(), 1e-10, what + " da");
      if (b.defined()) EXPECT_CLOSE(b1.grad(), b2.grad(), 1e-10, what + " db");
    }
  // Central differences through the torch op: both slopes, GQA, a window, packed sequences.
  const at::Tensor cu = torch::tensor({0, 3, 7}, at::kInt);
  expect_fd_gradients(
      [&](const std::vector<at::Tensor>& in) {
        return parallel_forgetting_attn(in[0], in[1], in[2], in[3], {}, 3, cu, 2, {},
                                        RotaryLayout::half_split, in[4], in[5]);
      },
      {at::randn({1, 7, 4, 2}, f64), at::randn({1, 7, 2, 2}, f64), at::randn({1, 7, 2, 2}, f64),
       at::log_sigmoid(at::randn({1, 7, 4}, f64)), at::rand({1, 7, 4}, f64),
       at::rand({1, 7, 2}, f64)},
      {"q", "k", "v", "g", "bias_q_slope", "bias_k_slope"}, 1e-7, "varlen window GQA");
}

TEST(FoxSlopesTorch, AutogradMatchesTheCoreBackward) {
  torch::manual_seed(6);
  const std::int64_t B = 1, T = 13, HQ = 2, H = 1, K = 4;
  const at::Tensor q = at::randn({B, T, HQ, K}, f64), k = at::randn({B, T, H, K}, f64),
                   v = at::randn({B, T, H, K}, f64),
                   g = at::log_sigmoid(at::randn({B, T, HQ}, f64)), a = at::rand({B, T, HQ}, f64),
                   b = at::rand({B, T, H}, f64);
  const at::Tensor al = leaf(a), bl = leaf(b);
  const at::Tensor o =
      parallel_forgetting_attn(q, k, v, g, {}, {}, {}, 4, {}, RotaryLayout::half_split, al, bl);
  const at::Tensor d_o = at::randn(o.sizes(), f64);
  o.backward(d_o);
  ForgettingAttnParams p;
  p.q = core_view(q), p.k = core_view(k), p.v = core_view(v), p.g = core_view(g);
  p.bias_q_slope = core_view(a), p.bias_k_slope = core_view(b);
  at::Tensor eo = at::empty_like(o), da = at::empty_like(a), db = at::empty_like(b);
  forgetting_attn_forward(p, Impl::reference, core_view(eo));
  ForgettingAttnGrads gr;
  gr.dbias_q_slope = core_view(da), gr.dbias_k_slope = core_view(db);
  forgetting_attn_backward(p, Impl::reference, core_view(d_o), {}, {}, gr);
  EXPECT_CLOSE(o, eo, 1e-12, "o");
  EXPECT_CLOSE(al.grad(), da, 1e-10, "da");
  EXPECT_CLOSE(bl.grad(), db, 1e-10, "db");
  // Zero slopes: the same output as no slopes (old call signature).
  EXPECT_CLOSE(parallel_forgetting_attn(q, k, v, g, {}, {}, {}, 4, {}, RotaryLayout::half_split,
                                        at::zeros_like(a), at::zeros_like(b)),
               parallel_forgetting_attn(q, k, v, g), 1e-15, "zero slopes");
  // float32 and bfloat16 slopes are accepted (bfloat16 computed in float32).
  const at::Tensor o32 = parallel_forgetting_attn(
      q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), g.to(at::kFloat), {}, {}, {}, 4, {},
      RotaryLayout::half_split, a.to(at::kBFloat16), b.to(at::kFloat));
  EXPECT_CLOSE(o32,
               parallel_forgetting_attn(q, k, v, g, {}, {}, {}, 4, {}, RotaryLayout::half_split,
                                        a.to(at::kBFloat16).to(at::kDouble), b),
               1e-5, "float32");
  expect_torch_error(
      [&] {
        parallel_forgetting_attn(q, k, v, g, {}, {}, {}, 4, {}, RotaryLayout::half_split,
                                 at::rand({B, T}, f64));
      },
      {"parallel_forgetting_attn", "'bias_q_slope'", "[B, T, HQ]"});
  expect_torch_error(
      [&] {
        parallel_forgetting_attn(q, k, v, g, {}, {}, {}, 4, {}, RotaryLayout::half_split, {},
                                 at::rand({B, T, HQ}, f64));
      },
      {"parallel_forgetting_attn", "'bias_k_slope'"});
}

TEST(FoxSlopesTorch, DecoderStepsEqualTheParallelForward) {
  torch::manual_seed(7);
  const std::int64_t B = 2, T = 10, HQ = 4, H = 2, K = 4;
  const at::Tensor q = at::randn({B, T, HQ, K}, f64), k = at::randn({B, T, H, K}, f64),
                   v = at::randn({B, T, H, K}, f64),
                   g = at::log_sigmoid(at::randn({B, T, HQ}, f64)), a = at::rand({B, T, HQ}, f64),
                   b = at::rand({B, T, H}, f64);
  for (c10::optional<std::int64_t> window :
       {c10::optional<std::int64_t>(), c10::optional<std::int64_t>(3)}) {
    const at::Tensor full =
        parallel_forgetting_attn(q, k, v, g, {}, window, {}, 4, {}, RotaryLayout::half_split, a, b);
    ForgettingAttnDecoder dec(B, HQ, H, K, K, window);
    for (std::int64_t t = 0; t < T; ++t) {
      const at::Tensor o =
          dec.step(q.narrow(1, t, 1), k.narrow(1, t, 1), v.narrow(1, t, 1), g.narrow(1, t, 1), {},
                   RotaryLayout::half_split, a.narrow(1, t, 1), b.narrow(1, t, 1));
      EXPECT_CLOSE(o, full.narrow(1, t, 1), 1e-12, "token " + std::to_string(t));
    }
  }
  ForgettingAttnDecoder dec(B, HQ, H, K, K);
  expect_torch_error(
      [&] {
        dec.step(q.narrow(1, 0, 1), k.narrow(1, 0, 1), v.narrow(1, 0, 1), g.narrow(1, 0, 1), {},
                 RotaryLayout::half_split, a.narrow(1, 0, 1).squeeze(1));
      },
      {"ForgettingAttnDecoder::step", "'bias_q_slope'"});
}

// ==== ForgettingAttention with an additive bias =================================================

TEST(AlibiSlopes, GeometricSequenceOfThePaper) {
  const at::Tensor s8 = nn::alibi_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(s8[h].item<double>(), std::pow(2.0, -(h + 1)));
  // 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope 2^-1, 2^-3.
  const std::vector<double> six = {0.25, 1.0 / 16, 1.0 / 64, 1.0 / 256, 0.5, 0.125};
  const at::Tensor s6 = nn::alibi_slopes(6);
  ASSERT_EQ(s6.numel(), 6);
  for (int h = 0; h < 6; ++h)
    EXPECT_DOUBLE_EQ(s6[h].item<double>(), six[static_cast<std::size_t>(h)]);
  EXPECT_DOUBLE_EQ(nn::alibi_slopes(1)[0].item<double>(), 1.0 / 256);
  expect_torch_error([] { nn::alibi_slopes(0); }, {"alibi_slopes", "'num_heads'"});
}

// q, k, v, f of a ForgettingAttention layer computed by hand (float64, no qk_norm / rotation).
struct FoxParts {
  at::Tensor q, k, v, f;
};
FoxParts fox_parts(nn::ForgettingAttention& layer, const at::Tensor& x) {
  const std::int64_t B = x.size(0), T = x.size(1), HQ = layer->options.num_heads(),
                     H = layer->num_kv_heads, K = layer->head_dim;
  FoxParts p;
  p.q = at::linear(x, layer->q_proj->weight).reshape({B, T, HQ, K});
  p.k = at::linear(x, layer->k_proj->weight).reshape({B, T, H, K});
  p.v = at::linear(x, layer->v_proj->weight).reshape({B, T, H, K});
  if (layer->f_proj)
    p.f = at::log_sigmoid(at::linear(x, layer->f_proj->weight, layer->f_proj->bias));
  return p;
}

TEST(ForgettingAttentionBias, AlibiAndGrapeEqualDenseFloat64Attention) {
  for (bool gate : {false, true})
    for (auto bias : {nn::AdditiveBias::alibi, nn::AdditiveBias::grape_a}) {
      const std::string what = std::string(gate ? "FoX" : "softmax") +
                               (bias == nn::AdditiveBias::alibi ? " + ALiBi" : " + GRAPE-A-QK");
      torch::manual_seed(8);
      nn::ForgettingAttention layer(nn::ForgettingAttentionOptions(24, 4)
                                        .num_kv_heads(2)
                                        .use_forget_gate(gate)
                                        .block_size(4)
                                        .additive_bias(bias));
      layer->to(at::kDouble);
      const std::int64_t B = 2, T = 9, K = 6;
      const at::Tensor x = at::randn({B, T, 24}, f64);
      const at::Tensor y = layer->forward(x);
      torch::NoGradGuard no_grad;
      const FoxParts p = fox_parts(layer, x);
      at::Tensor a, b;
      if (bias == nn::AdditiveBias::alibi) {
        a = nn::alibi_slopes(4).to(at::kFloat).to(at::kDouble).view({1, 1, 4}).expand({B, T, 4});
      } else {
        // a_i = ω softplus(vᵀq_i/√K), b_j = ω softplus(uᵀk_j/√K), ω per key head (Eq. 4.6).
        const at::Tensor omega = layer->grape_log_omega.exp();  // [2]
        const at::Tensor omega_q = at::stack({omega[0], omega[0], omega[1], omega[1]});
        a = omega_q *
            at::log1p(at::exp(at::einsum("bthk,hk->bth", {p.q, layer->grape_v}) / std::sqrt(6.0)));
        b = omega *
            at::log1p(at::exp(at::einsum("bthk,hk->bth", {p.k, layer->grape_u}) / std::sqrt(6.0)));
      }
      const at::Tensor o = dense_attention(p.q, p.k, p.v, p.f, a, b, 1 / std::sqrt(6.0));
      const at::Tensor expected = at::linear(o.reshape({B, T, 4 * K}), layer->o_proj->weight);
      EXPECT_CLOSE(y, expected, 1e-12, what);
      // The bias matters: without it the output differs.
      const at::Tensor plain = at::linear(
          dense_attention(p.q, p.k, p.v, p.f, {}, {}, 1 / std::sqrt(6.0)).reshape({B, T, 4 * K}),
          layer->o_proj->weight);
      EXPECT_GT(rel_rms(y, plain), 1e-3) << what;
    }
}

TEST(ForgettingAttentionBias, GrapeStartsAsAlibiWhenItsVectorsAreZero) {
  // ω_h = slope_h / (2 ln 2) and softplus(0) = ln 2: with v = u = 0 the bias is ALiBi's (one key
  // head per query head here, so the slopes are per head in both).
  torch::manual_seed(9);
  nn::ForgettingAttention grape(
      nn::ForgettingAttentionOptions(16, 4).additive_bias(nn::AdditiveBias::grape_a));
  torch::manual_seed(9);
  nn::ForgettingAttention alibi(
      nn::ForgettingAttentionOptions(16, 4).additive_bias(nn::AdditiveBias::alibi));
  grape->to(at::kDouble), alibi->to(at::kDouble);
  {
    torch::NoGradGuard no_grad;
    grape->grape_v.zero_(), grape->grape_u.zero_();
    alibi->q_proj->weight.copy_(grape->q_proj->weight);
    alibi->k_proj->weight.copy_(grape->k_proj->weight);
    alibi->v_proj->weight.copy_(grape->v_proj->weight);
    alibi->f_proj->weight.copy_(grape->f_proj->weight);
    alibi->f_proj->bias.copy_(grape->f_proj->bias);
    alibi->o_proj->weight.copy_(grape->o_proj->weight);
  }
  const at::Tensor x = at::randn({1, 12, 16}, f64);
  // The ALiBi buffer is float32 (converted with the module): compare at float32 precision.
  EXPECT_CLOSE(grape->forward(x), alibi->forward(x), 1e-6, "GRAPE-A at v = u = 0");
}

TEST(ForgettingAttentionBias, GradientsDtypesAndDecoding) {
  for (auto bias : {nn::AdditiveBias::alibi, nn::AdditiveBias::grape_a})
    for (bool gate : {false, true}) {
      const std::string what = std::string(bias == nn::AdditiveBias::alibi ? "alibi" : "grape_a") +
                               (gate ? " fox" : " softmax");
      torch::manual_seed(10);
      nn::ForgettingAttention layer(nn::ForgettingAttentionOptions(16, 4)
                                        .num_kv_heads(2)
                                        .use_forget_gate(gate)
                                        .qk_norm(true)
                                        .block_size(4)
                                        .pos_encoding(nn::PosEncoding::rope)
                                        .additive_bias(bias));
      // float32: shapes, every parameter gets a finite non-zero gradient.
      const at::Tensor x32 = at::randn({2, 7, 16});
      const at::Tensor y32 = layer->forward(x32);
      EXPECT_EQ(y32.sizes(), x32.sizes());
      EXPECT_EQ(y32.scalar_type(), at::kFloat);
      y32.pow(2).sum().backward();
      for (const auto& item : layer->named_parameters()) {
        ASSERT_TRUE(item.value().grad().defined()) << what << ": " << item.key();
        EXPECT_TRUE(at::isfinite(item.value().grad()).all().item<bool>()) << what;
        EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0) << what << ": " << item.key();
      }
      if (bias == nn::AdditiveBias::grape_a) {
        EXPECT_TRUE(layer->grape_log_omega.grad().defined());
        EXPECT_EQ(layer->grape_v.sizes(), (std::vector<std::int64_t>{4, 4}));
        EXPECT_EQ(layer->grape_u.sizes(), (std::vector<std::int64_t>{2, 4}));
      }
      // float64: cached decoding (prefill 3, then one token at a time) equals the parallel run.
      layer->to(at::kDouble);
      const at::Tensor x = at::randn({2, 9, 16}, f64);
      const at::Tensor full = layer->forward(x);
      nn::LayerCache cache;
      std::vector<at::Tensor> parts = {layer->forward(x.narrow(1, 0, 3), &cache)};
      for (std::int64_t t = 3; t < 9; ++t)
        parts.push_back(layer->forward(x.narrow(1, t, 1), &cache));
      EXPECT_CLOSE(at::cat(parts, 1), full, 1e-12, what + " decoding");
    }
}

// ==== PerformerAttention =========================================================================

TEST(PerformerAttentionLayer, ForwardIsFavorAttentionOfTheProjections) {
  for (bool causal : {false, true})
    for (bool per_head : {false, true}) {
      torch::manual_seed(11);
      nn::PerformerAttention layer(nn::PerformerAttentionOptions(12, 3)
                                       .num_features(10)
                                       .causal(causal)
                                       .per_head_features(per_head)
                                       .qkv_bias(true)
                                       .seed(5));
      layer->to(at::kDouble);
      const at::Tensor x = at::randn({2, 6, 12}, f64);
      const at::Tensor y = layer->forward(x);
      const std::vector<std::int64_t> w_shape =
          per_head ? std::vector<std::int64_t>{3, 10, 4} : std::vector<std::int64_t>{10, 4};
      EXPECT_EQ(layer->features.sizes(), w_shape);
      // The features are favor_random_matrix(m, K, seed) (drawn in float32, then converted).
      EXPECT_TRUE(
          at::equal(layer->features,
                    favor_random_matrix(10, 4, 5, FavorMatrixKind::orthogonal_chi,
                                        per_head ? c10::optional<std::int64_t>(3) : c10::nullopt)
                        .to(at::kDouble)));
      torch::NoGradGuard no_grad;
      auto proj = [&](torch::nn::Linear& l) {
        return at::linear(x, l->weight, l->bias).reshape({2, 6, 3, 4});
      };
      // The core reference on the projections.
      const at::Tensor q = proj(layer->q_proj), k = proj(layer->k_proj), v = proj(layer->v_proj);
      const at::Tensor w = layer->features.contiguous();
      FavorAttentionParams p;
      p.q = core_view(q), p.k = core_view(k), p.v = core_view(v), p.w = core_view(w);
      p.causal = causal;
      at::Tensor o = at::empty({2, 6, 3, 4}, f64);
      favor_attention_forward(p, Impl::reference, core_view(o));
      EXPECT_CLOSE(y, at::linear(o.reshape({2, 6, 12}), layer->o_proj->weight), 1e-12,
                   causal ? "causal" : "non-causal");
    }
}

TEST(PerformerAttentionLayer, ApproachesSoftmaxAttentionWithManyFeatures) {
  // With m = 4096 features the layer is close to the same projections under exact softmax
  // attention (dense float64); with m = 8 it is not as close.
  torch::manual_seed(12);
  auto error = [](std::int64_t m) {
    torch::manual_seed(12);
    nn::PerformerAttention layer(nn::PerformerAttentionOptions(16, 2).num_features(m).seed(1));
    layer->to(at::kDouble);
    const at::Tensor x = at::randn({1, 10, 16}, f64) * 0.5;
    torch::NoGradGuard no_grad;
    const at::Tensor q = at::linear(x, layer->q_proj->weight).reshape({1, 10, 2, 8}),
                     k = at::linear(x, layer->k_proj->weight).reshape({1, 10, 2, 8}),
                     v = at::linear(x, layer->v_proj->weight).reshape({1, 10, 2, 8});
    const at::Tensor exact =
        at::linear(dense_attention(q, k, v, {}, {}, {}, 1 / std::sqrt(8.0)).reshape({1, 10, 16}),
                   layer->o_proj->weight);
    return rel_rms(layer->forward(x), exact);
  };
  const double coarse = error(8), fine = error(4096);
  EXPECT_LT(fine, 0.02);
  EXPECT_LT(fine, coarse / 4) << coarse << " → " << fine;
}

TEST(PerformerAttentionLayer, DtypesGradientsDecodingRedrawAndErrors) {
  for (auto pe : {nn::PosEncoding::none, nn::PosEncoding::rope, nn::PosEncoding::selective_rope}) {
    const std::string what = "pos_encoding " + std::to_string(static_cast<int>(pe));
    torch::manual_seed(13);
    nn::PerformerAttention layer(
        nn::PerformerAttentionOptions(16, 2).num_features(12).chunk_size(4).pos_encoding(pe));
    const at::Tensor x32 = at::randn({2, 7, 16});
    const at::Tensor y32 = layer->forward(x32);
    EXPECT_EQ(y32.sizes(), x32.sizes());
    EXPECT_EQ(y32.scalar_type(), at::kFloat);
    y32.pow(2).sum().backward();
    for (const auto& item : layer->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << what << ": " << item.key();
      EXPECT_TRUE(at::isfinite(item.value().grad()).all().item<bool>()) << what;
      EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0) << what << ": " << item.key();
    }
    // The features are a buffer, not a parameter.
    for (const auto& item : layer->named_parameters()) EXPECT_NE(item.key(), "features");
    {
      // float32 decoding (state kept in float64) against the float32 parallel forward.
      torch::NoGradGuard no_grad;
      const at::Tensor full32 = layer->forward(x32);
      nn::LayerCache cache32;
      std::vector<at::Tensor> rows;
      for (std::int64_t t = 0; t < 7; ++t)
        rows.push_back(layer->forward(x32.narrow(1, t, 1), &cache32));
      const at::Tensor decoded = at::cat(rows, 1);
      EXPECT_EQ(decoded.scalar_type(), at::kFloat);
      EXPECT_CLOSE(decoded, full32, 1e-5, what + " float32 decoding");
    }
    layer->to(at::kDouble);
    EXPECT_EQ(layer->features.scalar_type(), at::kDouble);
    // Decoding: prefill 4, then one token at a time, equals the parallel forward (float64), and
    // gradients flow through the cached path too.
    const at::Tensor x = at::randn({2, 11, 16}, f64) * 2;  // large inputs: the stabiliser moves
    const at::Tensor full = layer->forward(x);
    nn::LayerCache cache;
    std::vector<at::Tensor> parts = {layer->forward(x.narrow(1, 0, 4), &cache)};
    for (std::int64_t t = 4; t < 11; ++t)
      parts.push_back(layer->forward(x.narrow(1, t, 1), &cache));
    EXPECT_CLOSE(at::cat(parts, 1), full, 1e-11, what + " decoding");
    EXPECT_EQ(cache.offset, 11);
    cache.reset();
    const at::Tensor again = layer->forward(x.narrow(1, 0, 2), &cache);
    EXPECT_CLOSE(again, full.narrow(1, 0, 2), 1e-11, what + " after reset");
  }
  // Redraw: in place, reproducible, and a fresh layer with that seed has the same features.
  torch::manual_seed(14);
  nn::PerformerAttention layer(nn::PerformerAttentionOptions(8, 2).num_features(6).seed(1));
  const at::Tensor before = layer->features.clone();
  layer->redraw_features(2);
  EXPECT_FALSE(at::equal(before, layer->features));
  EXPECT_EQ(layer->options.seed(), 2u);
  nn::PerformerAttention fresh(nn::PerformerAttentionOptions(8, 2).num_features(6).seed(2));
  EXPECT_TRUE(at::equal(fresh->features, layer->features));
  layer->redraw_features(1);
  EXPECT_TRUE(at::equal(before, layer->features));
  // Errors.
  expect_torch_error(
      [] { nn::PerformerAttention(nn::PerformerAttentionOptions(8, 2).num_features(0)); },
      {"PerformerAttention", "'num_features'", "0"});
  expect_torch_error([] { nn::PerformerAttention(nn::PerformerAttentionOptions(10, 4)); },
                     {"PerformerAttention", "'hidden_size'", "10"});
  expect_torch_error(
      [] {
        nn::PerformerAttention(
            nn::PerformerAttentionOptions(6, 2).pos_encoding(nn::PosEncoding::rope));
      },
      {"PerformerAttention", "'pos_encoding'", "K = 3"});
  nn::PerformerAttention bidir(nn::PerformerAttentionOptions(8, 2).causal(false));
  nn::LayerCache cache;
  expect_torch_error(
      [&] {
        bidir->forward(at::randn({1, 3, 8}), &cache);
      },
      {"PerformerAttention", "'cache'", "causal"});
  expect_torch_error(
      [&] {
        bidir->forward(at::randn({1, 3, 9}));
      },
      {"PerformerAttention", "'x'", "[1, 3, 9]"});
  expect_torch_error(
      [&] {
        bidir->forward(at::randn({1, 3, 8}, f64));
      },
      {"PerformerAttention", "'x'", "dtype"});
}

// ==== harness ====================================================================================

void expect_phasor_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const phasor::Error& e) {
    const std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

tasks::ModelConfig tiny(const std::string& mixer, const std::string& pos) {
  tasks::ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 32;
  c.num_layers = 1;
  c.num_heads = 2;
  c.mixer = mixer;
  c.pos_encoding = pos;
  if (mixer == "fox" || mixer == "attention") c.mixer_options = {{"block_size", 8}};
  if (mixer == "performer") c.mixer_options = {{"num_features", 32}, {"chunk_size", 8}};
  return c;
}

TEST(Harness, RegistryEntriesAndErrors) {
  const auto mixers = tasks::mixer_names();
  EXPECT_NE(std::find(mixers.begin(), mixers.end(), "performer"), mixers.end());
  const auto positions = tasks::position_encoding_names();
  for (const char* p : {"alibi", "grape_a"})
    EXPECT_NE(std::find(positions.begin(), positions.end(), p), positions.end()) << p;
  // Additive biases only with the FoX-kernel mixers: the error names the mixer.
  for (const char* mixer : {"gla", "gated_deltanet", "performer"})
    for (const char* pos : {"alibi", "grape_a"})
      expect_phasor_error([&] { tasks::LanguageModel m(tiny(mixer, pos)); },
                          {std::string("mixer '") + mixer + "'", "'pos_encoding'",
                           std::string("'") + pos + "'", "'fox' or 'attention'"});
  tasks::ModelConfig c = tiny("performer", "none");
  c.mixer_options["feature_kind"] = "gaussian";
  expect_phasor_error([&] { tasks::LanguageModel m(c); },
                      {"mixer 'performer'", "'feature_kind'", "'gaussian'"});
  c = tiny("performer", "none");
  c.mixer_options["fused_rotation"] = true;
  expect_phasor_error([&] { tasks::LanguageModel m(c); },
                      {"mixer 'performer'", "'fused_rotation'"});
  c = tiny("performer", "none");
  c.mixer_options["num_features"] = 0;
  expect_phasor_error([&] { tasks::LanguageModel m(c); }, {"mixer 'performer'", "'num_features'"});
  c = tiny("fox", "alibi");
  c.pos_options = {{"slope", 1}};
  expect_phasor_error([&] { tasks::LanguageModel m(c); }, {"pos_encoding 'alibi'", "'slope'"});
  // The options reach the layers.
  c = tiny("performer", "rope");
  c.mixer_options = {{"num_features", 20}, {"seed", 3}, {"per_head_features", false}};
  c.num_layers = 2;
  tasks::LanguageModel perf(c);
  std::vector<at::Tensor> feats;
  for (const auto& b : perf->named_buffers())
    if (b.key().find("features") != std::string::npos) feats.push_back(b.value());
  ASSERT_EQ(feats.size(), 2u);
  EXPECT_EQ(feats[0].sizes(), (std::vector<std::int64_t>{20, 16}));
  EXPECT_TRUE(at::equal(feats[0], feats[1]));  // an explicit seed: the same in every layer
  c.mixer_options = {{"num_features", 20}};
  tasks::LanguageModel drawn(c);
  feats.clear();
  for (const auto& b : drawn->named_buffers())
    if (b.key().find("features") != std::string::npos) feats.push_back(b.value());
  ASSERT_EQ(feats.size(), 2u);
  EXPECT_FALSE(at::equal(feats[0], feats[1]));  // drawn from torch's generator: per layer
  c = tiny("attention", "grape_a");
  c.pos_options = {{"rope", true}};
  tasks::LanguageModel ga(c);
  std::int64_t grape_params = 0;
  for (const auto& p : ga->named_parameters())
    grape_params += p.key().find("grape_") != std::string::npos;
  EXPECT_EQ(grape_params, 3);
}

TEST(Harness, SavedPerformerModelsKeepTheirFeatures) {
  // The features are buffers: Module::save / load carries them, so a reloaded model (built with
  // other random draws) computes the same logits.
  tasks::ModelConfig c = tiny("performer", "rope");
  c.dtype = "float64";
  torch::manual_seed(1);
  tasks::LanguageModel a(c);
  torch::manual_seed(2);
  tasks::LanguageModel b(c);
  const at::Tensor tokens = torch::randint(0, 32, {2, 9}, at::kLong);
  EXPECT_GT((a->forward(tokens) - b->forward(tokens)).abs().max().item<double>(), 1e-6);
  torch::serialize::OutputArchive out;
  a->save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  b->load(in);
  EXPECT_TRUE(at::equal(a->forward(tokens), b->forward(tokens)));
}

TEST(Harness, CausalModels) {
  for (auto [mixer, pos] :
       std::vector<std::pair<std::string, std::string>>{{"performer", "none"},
                                                        {"performer", "rope"},
                                                        {"fox", "alibi"},
                                                        {"attention", "grape_a"}}) {
    torch::manual_seed(3);
    tasks::ModelConfig c = tiny(mixer, pos);
    c.dtype = "float64";
    tasks::LanguageModel model(c);
    const at::Tensor a = torch::randint(0, 32, {2, 11}, at::kLong);
    at::Tensor b = a.clone();
    b.select(1, 7).copy_((a.select(1, 7) + 1) % 32);
    const at::Tensor la = model->forward(a), lb = model->forward(b);
    const std::string what = mixer + " " + pos;
    EXPECT_LE((la.narrow(1, 0, 7) - lb.narrow(1, 0, 7)).abs().max().item<double>(), 1e-12) << what;
    EXPECT_GT((la.narrow(1, 7, 4) - lb.narrow(1, 7, 4)).abs().max().item<double>(), 1e-6) << what;
  }
}

TEST(Harness, TinyRunsReduceTheLoss) {
  // MQAR (V = 32, L = 16, 2 pairs), 1 layer, hidden 32, 60 steps of 16 rows: the held-out loss
  // must fall well below ln V, the loss of uniform predictions.
  tasks::MqarConfig mq;
  mq.seq_len = 16;
  mq.num_kv_pairs = 2;
  mq.vocab_size = 32;
  for (auto [mixer, pos] : std::vector<std::pair<std::string, std::string>>{
           {"performer", "rope"}, {"fox", "alibi"}, {"fox", "grape_a"}, {"attention", "alibi"}}) {
    tasks::ModelConfig mc = tiny(mixer, pos);
    tasks::TrainConfig tc;
    tc.steps = 60;
    tc.batch_size = 16;
    tc.lr = 3e-3;
    tc.eval_every = 0;
    tc.seed = 5;
    torch::manual_seed(5);
    tasks::LanguageModel model(mc);
    const tasks::Batch held_out = tasks::mqar(mq, 64, tasks::batch_seed(5, -1));
    const double before = tasks::evaluate(model, held_out).loss;
    const tasks::TrainResult r = tasks::train(
        model, tc,
        tasks::make_batch_stream(
            [mq](std::int64_t n, std::uint64_t s) { return tasks::mqar(mq, n, s); }, 16, 5));
    const double after = tasks::evaluate(model, held_out).loss;
    const std::string what = mixer + " + " + pos;
    std::printf("%s: held-out loss %.3f → %.3f (ln V = %.3f)\n", what.c_str(), before, after,
                std::log(32.0));
    EXPECT_EQ(r.losses.size(), 60u) << what;
    EXPECT_FALSE(r.diverged) << what;
    EXPECT_NEAR(before, std::log(32.0), 0.3) << what;
    EXPECT_LT(after, std::log(32.0) - 0.5) << what << ": " << before << " → " << after;
  }
}

}  // namespace
}  // namespace phasor
