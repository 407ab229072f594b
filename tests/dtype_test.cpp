// bfloat16 and float16 are storage types for every op of the core: each kernel (reference,
// recurrent, chunk, and every other op's) converts them to float32 on load, computes in float32
// and rounds once when it stores. So a call on 16-bit inputs must give, bit for bit, the 16-bit
// rounding of the same call on float32 copies of those inputs (a 16-bit value converts to float32
// exactly); and with float32 outputs, the float32 call's outputs themselves. These tests hold
// every op to that, forward and backward, with 16-bit inputs and outputs throughout.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "phasor/phasor.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;
using Inputs = std::map<std::string, Tensor>;
using Views = std::map<std::string, TensorView>;
// One call of an op: views of its inputs in, its outputs (allocated in `out`) back.
using Run = std::function<std::vector<Tensor>(const Views& in, DType out)>;

Inputs cast(const Inputs& in, DType dtype) {
  Inputs out;
  for (const auto& [name, t] : in) out[name] = is_floating(t.dtype()) ? t.to(dtype) : t;
  return out;
}

Views views(const Inputs& in) {
  Views out;
  for (const auto& [name, t] : in) out[name] = t.view();
  return out;
}

// `values`: float64 inputs (integer ones, such as cu_seqlens, are passed as they are).
void expect_storage_only(const Inputs& values, const Run& run) {
  for (DType half : {DType::bfloat16, DType::float16}) {
    SCOPED_TRACE(to_string(half));
    const Inputs rounded = cast(values, half);
    const Inputs widened = cast(rounded, DType::float32);
    const std::vector<Tensor> expected = run(views(widened), DType::float32);
    const std::vector<Tensor> got = run(views(rounded), half);
    const std::vector<Tensor> got_wide = run(views(rounded), DType::float32);
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      // Every output is written and not trivially zero (an unwritten one would match itself).
      double largest = 0;
      for (double value : expected[i].values()) largest = std::max(largest, std::fabs(value));
      EXPECT_GT(largest, 0) << "output " << i;
      EXPECT_EQ(got[i].dtype(), half);
      EXPECT_TRUE(got[i].bit_equal(expected[i].to(half))) << "output " << i;
      EXPECT_TRUE(got_wide[i].bit_equal(expected[i])) << "float32 output " << i;
    }
  }
}

constexpr Impl kImpls[] = {Impl::reference, Impl::recurrent, Impl::chunk};

class StorageOnly : public ::testing::TestWithParam<Impl> {};

TEST_P(StorageOnly, Gla) {
  const Impl impl = GetParam();
  const std::int64_t T = 13, H = 2, K = 6, V = 5;
  std::mt19937_64 rng(1);
  Inputs in = {{"q", testing::randn({1, T, H, K}, rng)},
               {"k", testing::randn({1, T, H, K}, rng)},
               {"v", testing::randn({1, T, H, V}, rng)},
               {"g", testing::log_sigmoid_gates({1, T, H, K}, rng)},
               {"h0", testing::randn({2, H, K, V}, rng)},
               {"theta", testing::uniform({1, T, H, K / 2}, rng, -40, 40)},
               {"d_o", testing::randn({1, T, H, V}, rng)},
               {"dht", testing::randn({2, H, K, V}, rng)},
               {"cu", testing::cu_seqlens({5, 8})}};
  expect_storage_only(in, [&](const Views& x, DType out) {
    GlaParams p;
    p.q = x.at("q"), p.k = x.at("k"), p.v = x.at("v"), p.g = x.at("g");
    p.initial_state = x.at("h0"), p.theta = x.at("theta"), p.cu_seqlens = x.at("cu");
    p.chunk_size = 4;
    Tensor o({1, T, H, V}, out), ht({2, H, K, V}, out);
    gla_forward(p, impl, o.view(), ht.view());
    Tensor dq({1, T, H, K}, out), dk({1, T, H, K}, out), dv({1, T, H, V}, out),
        dg({1, T, H, K}, out), dh0({2, H, K, V}, out), dtheta({1, T, H, K / 2}, out);
    GlaGrads grads{dq.view(), dk.view(), dv.view(), dg.view(), dh0.view(), dtheta.view()};
    gla_backward(p, impl, x.at("d_o"), x.at("dht"), grads);
    return std::vector<Tensor>{o, ht, dq, dk, dv, dg, dh0, dtheta};
  });
}

TEST_P(StorageOnly, GatedDeltaRule) {
  const Impl impl = GetParam();
  const std::int64_t B = 2, T = 11, H = 1, HV = 2, K = 6, V = 4;
  std::mt19937_64 rng(2);
  Inputs in = {{"q", testing::randn({B, T, H, K}, rng)},
               {"k", testing::randn({B, T, H, K}, rng)},
               {"v", testing::randn({B, T, HV, V}, rng)},
               {"g", testing::log_sigmoid_gates({B, T, HV}, rng)},
               {"beta", testing::uniform({B, T, HV}, rng, 0, 2)},
               {"h0", testing::randn({B, HV, K, V}, rng)},
               {"theta", testing::uniform({B, T, H, K / 2}, rng, -40, 40)},
               {"d_o", testing::randn({B, T, HV, V}, rng)}};
  expect_storage_only(in, [&](const Views& x, DType out) {
    GatedDeltaRuleParams p;
    p.q = x.at("q"), p.k = x.at("k"), p.v = x.at("v"), p.g = x.at("g"), p.beta = x.at("beta");
    p.initial_state = x.at("h0"), p.theta = x.at("theta");
    p.use_qk_l2norm_in_kernel = true;
    p.chunk_size = 4;
    Tensor o({B, T, HV, V}, out), ht({B, HV, K, V}, out);
    gated_delta_rule_forward(p, impl, o.view(), ht.view());
    Tensor dq({B, T, H, K}, out), dk({B, T, H, K}, out), dv({B, T, HV, V}, out),
        dg({B, T, HV}, out), dbeta({B, T, HV}, out), dh0({B, HV, K, V}, out),
        dtheta({B, T, H, K / 2}, out);
    GatedDeltaRuleGrads grads{dq.view(),    dk.view(),  dv.view(),    dg.view(),
                              dbeta.view(), dh0.view(), dtheta.view()};
    gated_delta_rule_backward(p, impl, x.at("d_o"), {}, grads);
    return std::vector<Tensor>{o, ht, dq, dk, dv, dg, dbeta, dh0, dtheta};
  });
}

TEST_P(StorageOnly, ForgettingAttn) {
  const Impl impl = GetParam();
  const std::int64_t T = 12, HQ = 4, H = 2, K = 6, V = 5;
  std::mt19937_64 rng(3);
  Inputs in = {{"q", testing::randn({1, T, HQ, K}, rng)},
               {"k", testing::randn({1, T, H, K}, rng)},
               {"v", testing::randn({1, T, H, V}, rng)},
               {"g", testing::log_sigmoid_gates({1, T, HQ}, rng)},
               {"theta", testing::uniform({1, T, H, K / 2}, rng, -40, 40)},
               {"sq", testing::uniform({1, T, HQ}, rng, 0, 0.5)},
               {"sk", testing::uniform({1, T, H}, rng, 0, 0.5)},
               {"d_o", testing::randn({1, T, HQ, V}, rng)},
               {"cu", testing::cu_seqlens({7, 5})}};
  expect_storage_only(in, [&](const Views& x, DType out) {
    ForgettingAttnParams p;
    p.q = x.at("q"), p.k = x.at("k"), p.v = x.at("v"), p.g = x.at("g");
    p.theta = x.at("theta"), p.cu_seqlens = x.at("cu");
    p.bias_q_slope = x.at("sq"), p.bias_k_slope = x.at("sk");
    p.window_size = 5;
    p.block_size = 4;
    Tensor o({1, T, HQ, V}, out), lse({1, T, HQ}, out);
    forgetting_attn_forward(p, impl, o.view(), lse.view());
    Tensor dq({1, T, HQ, K}, out), dk({1, T, H, K}, out), dv({1, T, H, V}, out),
        dg({1, T, HQ}, out), dtheta({1, T, H, K / 2}, out), dsq({1, T, HQ}, out),
        dsk({1, T, H}, out);
    ForgettingAttnGrads grads{dq.view(),     dk.view(),  dv.view(), dg.view(),
                              dtheta.view(), dsq.view(), dsk.view()};
    // Without o and lse: the backward recomputes them in the compute type (a 16-bit o would
    // carry its rounding into the backward).
    forgetting_attn_backward(p, impl, x.at("d_o"), {}, {}, grads);
    return std::vector<Tensor>{o, lse, dq, dk, dv, dg, dtheta, dsq, dsk};
  });
}

INSTANTIATE_TEST_SUITE_P(AllImpls, StorageOnly, ::testing::ValuesIn(kImpls),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(StorageOnlyOps, ForgettingAttnCache) {
  const std::int64_t B = 2, steps = 4, HQ = 2, H = 1, K = 4, V = 3;
  std::mt19937_64 rng(4);
  Inputs in;
  for (std::int64_t t = 0; t < steps; ++t) {
    const std::string s = std::to_string(t);
    in["q" + s] = testing::randn({B, 1, HQ, K}, rng);
    in["k" + s] = testing::randn({B, 1, H, K}, rng);
    in["v" + s] = testing::randn({B, 1, H, V}, rng);
    in["g" + s] = testing::log_sigmoid_gates({B, 1, HQ}, rng);
    in["theta" + s] = testing::uniform({B, 1, H, K / 2}, rng, -40, 40);
  }
  expect_storage_only(in, [&](const Views& x, DType out) {
    ForgettingAttnCache cache(B, HQ, H, K, V, /*window_size=*/3);
    std::vector<Tensor> outputs;
    for (std::int64_t t = 0; t < steps; ++t) {
      const std::string s = std::to_string(t);
      Tensor o({B, 1, HQ, V}, out);
      cache.step(x.at("q" + s), x.at("k" + s), x.at("v" + s), x.at("g" + s), o.view(), std::nullopt,
                 x.at("theta" + s));
      outputs.push_back(o);
    }
    return outputs;
  });
}

TEST(StorageOnlyOps, ShortConv) {
  const std::int64_t T = 10, D = 5, W = 4;
  std::mt19937_64 rng(5);
  Inputs in = {{"x", testing::randn({1, T, D}, rng)},  {"w", testing::randn({D, W}, rng)},
               {"b", testing::randn({D}, rng)},        {"c0", testing::randn({2, D, W - 1}, rng)},
               {"dy", testing::randn({1, T, D}, rng)}, {"dc", testing::randn({2, D, W - 1}, rng)},
               {"cu", testing::cu_seqlens({2, 8})}};
  for (Impl impl : {Impl::reference, Impl::chunk}) {
    SCOPED_TRACE(to_string(impl));
    expect_storage_only(in, [&](const Views& x, DType out) {
      ShortConvParams p;
      p.x = x.at("x"), p.weight = x.at("w"), p.bias = x.at("b");
      p.initial_cache = x.at("c0"), p.cu_seqlens = x.at("cu");
      p.activation = "silu";
      Tensor y({1, T, D}, out), cache({2, D, W - 1}, out);
      short_conv_forward(p, impl, y.view(), cache.view());
      Tensor dx({1, T, D}, out), dw({D, W}, out), db({D}, out), dc0({2, D, W - 1}, out);
      short_conv_backward(p, impl, x.at("dy"), x.at("dc"),
                          ShortConvGrads{dx.view(), dw.view(), db.view(), dc0.view()});
      return std::vector<Tensor>{y, cache, dx, dw, db, dc0};
    });
  }
}

TEST(StorageOnlyOps, RotaryOps) {
  const std::int64_t B = 2, T = 9, H = 2, R = 3;
  std::mt19937_64 rng(6);
  Inputs in = {{"phi", testing::uniform({B, T, H, R}, rng, -2, 2)},
               {"omega", testing::uniform({H, R}, rng, 0.1, 1)},
               {"p0", testing::uniform({B, H, R}, rng, -5, 5)},
               {"dth", testing::randn({B, T, H, R}, rng)},
               {"dp", testing::randn({B, H, R}, rng)},
               {"x", testing::randn({B, T, H, 2 * R}, rng)},
               {"theta", testing::uniform({B, T, H, R}, rng, -60, 60)},
               {"dy", testing::randn({B, T, H, 2 * R}, rng)}};
  for (Impl impl : {Impl::reference, Impl::chunk}) {
    SCOPED_TRACE(to_string(impl));
    expect_storage_only(in, [&](const Views& x, DType out) {
      RotaryPhaseParams p{x.at("phi"), x.at("omega"), x.at("p0"), {}};
      Tensor theta({B, T, H, R}, out), final_phase({B, H, R}, out);
      selective_rope_phases_forward(p, impl, theta.view(), final_phase.view());
      Tensor dphi({B, T, H, R}, out), domega({H, R}, out), dp0({B, H, R}, out);
      selective_rope_phases_backward(p, impl, x.at("dth"), x.at("dp"),
                                     RotaryPhaseGrads{dphi.view(), domega.view(), dp0.view()});
      Tensor y({B, T, H, 2 * R}, out), dx({B, T, H, 2 * R}, out), dtheta({B, T, H, R}, out);
      for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
        apply_rotary_forward(x.at("x"), x.at("theta"), layout, impl, y.view());
        apply_rotary_backward(x.at("x"), x.at("theta"), layout, impl, x.at("dy"), dx.view(),
                              dtheta.view());
      }
      RopeAnglesParams angles;
      angles.B = B, angles.T = T, angles.head_dim = 2 * R, angles.offset = 3;
      Tensor rope({B, T, R}, out);
      rope_angles(angles, impl, rope.view());
      return std::vector<Tensor>{theta, final_phase, dphi, domega, dp0, y, dx, dtheta, rope};
    });
  }
}

TEST(StorageOnlyOps, StringAndGrape) {
  const std::int64_t B = 1, T = 7, H = 2, K = 6, C = 2;
  std::mt19937_64 rng(7);
  Tensor identity({K, K}, DType::float64);
  for (std::int64_t i = 0; i < K; ++i) identity.set(i * K + i, 1.0);
  Inputs in = {{"z", testing::randn({B, T, H, K}, rng)},
               {"r", testing::uniform({B, T, C}, rng, 0, 8)},
               {"omega", testing::uniform({C, K / 2}, rng, 0.1, 1)},
               {"A", testing::randn({K, K}, rng, 0.3)},
               {"c", testing::randn({C, K}, rng, 0.3)},
               {"a", testing::randn({K}, rng)},
               {"b", testing::randn({K}, rng)},
               {"w", testing::uniform({H}, rng, 0.1, 1)},
               {"pos", testing::uniform({B, T}, rng, 0, 8)},
               {"basis", identity},
               {"theta", testing::uniform({B, T, H, K / 2}, rng, -9, 9)},
               {"dy", testing::randn({B, T, H, K}, rng)}};
  for (Impl impl : {Impl::reference, Impl::chunk}) {
    SCOPED_TRACE(to_string(impl));
    expect_storage_only(in, [&](const Views& x, DType out) {
      std::vector<Tensor> outs;
      auto output = [&](std::vector<std::int64_t> shape) {
        outs.emplace_back(std::move(shape), out);
        return outs.back().view();
      };
      const CayleyStringParams cayley{x.at("z"), x.at("r"), x.at("omega"), x.at("A"),
                                      RotaryLayout::half_split};
      cayley_string_forward(cayley, impl, output({B, T, H, K}));
      cayley_string_backward(cayley, impl, x.at("dy"),
                             CayleyStringGrads{output({B, T, H, K}), output({B, T, C}),
                                               output({C, K / 2}), output({K, K})});
      const CirculantStringParams circulant{x.at("z"), x.at("r"), x.at("c")};
      circulant_string_forward(circulant, impl, output({B, T, H, K}));
      circulant_string_backward(
          circulant, impl, x.at("dy"),
          CirculantStringGrads{output({B, T, H, K}), output({B, T, C}), output({C, K})});
      nd_rope_angles_forward(x.at("r"), x.at("omega"), impl, output({B, T, K / 2}));
      const GrapeParams grape{x.at("z"), x.at("a"), x.at("b"), x.at("w"), x.at("pos")};
      grape_forward(grape, impl, output({B, T, H, K}));
      grape_backward(
          grape, impl, x.at("dy"),
          GrapeGrads{output({B, T, H, K}), output({K}), output({K}), output({H}), output({B, T})});
      GrapeSubspaceParams subspace;
      subspace.z = x.at("z"), subspace.basis = x.at("basis"), subspace.theta = x.at("theta");
      grape_subspace_forward(subspace, impl, output({B, T, H, K}));
      grape_subspace_backward(
          subspace, impl, x.at("dy"),
          GrapeSubspaceGrads{output({B, T, H, K}), output({K, K}), output({B, T, H, K / 2})});
      return outs;
    });
  }
}

TEST(StorageOnlyOps, StructuredRotationAndFavor) {
  const std::int64_t B = 1, T = 8, H = 2, K = 6, C = 2, m = 2, M = 5;
  std::mt19937_64 rng(8);
  // The first 2m columns of the identity: orthonormal in every dtype.
  Tensor basis({K, 2 * m}, DType::float64);
  for (std::int64_t i = 0; i < 2 * m; ++i) basis.set(i * 2 * m + i, 1.0);
  Inputs in = {{"x", testing::randn({B, T, H, K}, rng)},
               {"r", testing::uniform({B, T, H, C}, rng, 0, 8)},
               {"basis", basis},
               {"lambda", testing::uniform({C, m}, rng, 0.1, 1)},
               {"dy", testing::randn({B, T, H, K}, rng)},
               {"q", testing::randn({B, T, H, K}, rng, 0.5)},
               {"k", testing::randn({B, T, H, K}, rng, 0.5)},
               {"v", testing::randn({B, T, H, 3}, rng)},
               {"w", testing::randn({M, K}, rng)},
               {"dphi", testing::randn({B, T, H, M}, rng)},
               {"d_o", testing::randn({B, T, H, 3}, rng)}};
  for (Impl impl : {Impl::reference, Impl::chunk}) {
    SCOPED_TRACE(to_string(impl));
    expect_storage_only(in, [&](const Views& x, DType out) {
      std::vector<Tensor> outs;
      auto output = [&](std::vector<std::int64_t> shape) {
        outs.emplace_back(std::move(shape), out);
        return outs.back().view();
      };
      const StructuredRotationParams structured{
          x.at("x"), x.at("r"), x.at("basis"), x.at("lambda"), {}};
      structured_rotation_forward(structured, impl, output({B, T, H, K}));
      structured_rotation_backward(
          structured, impl, x.at("dy"),
          StructuredRotationGrads{output({B, T, H, K}), output({B, T, H, C}), output({C, m}), {}});
      const FavorFeatureParams features{x.at("x"), x.at("w"), FavorStabilizer::key, {}};
      favor_features_forward(features, impl, output({B, T, H, M}));
      favor_features_backward(features, impl, x.at("dphi"), output({B, T, H, K}), output({M, K}));
      for (bool causal : {false, true}) {
        FavorAttentionParams attention;
        attention.q = x.at("q"), attention.k = x.at("k"), attention.v = x.at("v");
        attention.w = x.at("w");
        attention.causal = causal;
        attention.chunk_size = 3;
        favor_attention_forward(attention, impl, output({B, T, H, 3}));
        favor_attention_backward(attention, impl, x.at("d_o"),
                                 FavorAttentionGrads{output({B, T, H, K}), output({B, T, H, K}),
                                                     output({B, T, H, 3}), output({M, K})});
      }
      return outs;
    });
  }
}

}  // namespace
}  // namespace phasor
