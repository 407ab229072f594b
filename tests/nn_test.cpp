// phasor::nn layers (phasor/nn.h): incremental decoding against the parallel forward for every
// layer × position encoding, fused against explicit rotation (values and every parameter's
// gradient), float64 central finite differences of the Selective RoPE phase path (projection →
// conv → bias → gate → cumsum → rotation, alone and through each layer), the spectra, gate tying,
// the RoPE limit of Selective RoPE, and option / input errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "phasor/nn.h"
#include "phasor/testing/finite_differences.h"
#include "phasor/torch.h"
#include "torch_test_util.h"

namespace phasor::nn {
namespace {

const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach() - b.detach()).abs().max().item<double>();
}

double abs_max(const at::Tensor& a) {
  return a.detach().abs().max().item<double>();
}

std::string name_of(PosEncoding pe) {
  switch (pe) {
    case PosEncoding::none:
      return "none";
    case PosEncoding::rope:
      return "rope";
    case PosEncoding::selective_rope:
      return "selective_rope";
    case PosEncoding::string_cayley:  // tested in rotations_torch_test.cpp
      return "string_cayley";
    case PosEncoding::string_circulant:
      return "string_circulant";
    case PosEncoding::grape:
      return "grape";
  }
  return "?";
}

const PosEncoding kAllPos[] = {PosEncoding::none, PosEncoding::rope, PosEncoding::selective_rope};

// Selective RoPE options exercising every part of the phase path.
SelectiveRoPEOptions full_phase_path(PhaseProjection projection, PhaseGate gate) {
  return SelectiveRoPEOptions(0, 0, 0)
      .projection(projection)
      .rank(3)
      .gate(gate)
      .bias(true)
      .conv_silu(true);
}

// Decoding: the parallel forward over T tokens against (a) token-by-token decoding from an empty
// cache and (b) a prefill of `prefill` tokens followed by token-by-token decoding.
template <typename Layer>
void expect_decode_matches_parallel(Layer& layer, const at::Tensor& x, std::int64_t prefill,
                                    const std::string& what) {
  torch::NoGradGuard no_grad;
  const at::Tensor y = layer->forward(x);
  const std::int64_t T = x.size(1);
  for (const std::int64_t first : {std::int64_t{1}, prefill}) {
    LayerCache cache;
    std::vector<at::Tensor> rows{layer->forward(x.narrow(1, 0, first), &cache)};
    for (std::int64_t t = first; t < T; ++t)
      rows.push_back(layer->forward(x.narrow(1, t, 1), &cache));
    EXPECT_EQ(cache.offset, T) << what;
    const at::Tensor yd = at::cat(rows, 1);
    EXPECT_LT(max_abs_diff(yd, y), 1e-10 * (1.0 + abs_max(y)))
        << what << ", first call with " << first << " tokens";
  }
}

// Gradients of every parameter of `module` for the loss Σ w ⊙ f(x).
std::vector<at::Tensor> parameter_grads(torch::nn::Module& module,
                                        const std::function<at::Tensor()>& f, const at::Tensor& w) {
  module.zero_grad();
  (f() * w).sum().backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : module.parameters())
    grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  return grads;
}

// Fused rotation (θ into the kernel) against apply_rotary + the op without θ: outputs and the
// gradient of every parameter (which tests the kernels' dθ against apply_rotary's backward).
template <typename Layer>
void expect_fused_equals_explicit(Layer& layer, const at::Tensor& x, const std::string& what) {
  const at::Tensor w = torch::randn({x.size(0), x.size(1), x.size(2)}, f64);
  layer->options.fused_rotation(true);
  const at::Tensor y_fused = layer->forward(x);
  const auto g_fused = parameter_grads(
      *layer, [&] { return layer->forward(x); }, w);
  layer->options.fused_rotation(false);
  const at::Tensor y_explicit = layer->forward(x);
  const auto g_explicit = parameter_grads(
      *layer, [&] { return layer->forward(x); }, w);
  layer->options.fused_rotation(true);
  EXPECT_LT(max_abs_diff(y_fused, y_explicit), 1e-11) << what;
  ASSERT_EQ(g_fused.size(), g_explicit.size());
  for (std::size_t i = 0; i < g_fused.size(); ++i)
    EXPECT_LT(max_abs_diff(g_fused[i], g_explicit[i]), 1e-10 * (1.0 + abs_max(g_explicit[i])))
        << what << ", parameter " << i;
}

// Central differences of L = Σ w ⊙ f() in float64 against autograd for a few entries of every
// parameter of `phase_module` (the Selective RoPE submodule), f running the whole path.
void expect_phase_path_gradients(torch::nn::Module& root, torch::nn::Module& phase_module,
                                 const std::function<at::Tensor()>& f, const at::Tensor& w,
                                 const std::string& what) {
  root.zero_grad();
  (f() * w).sum().backward();
  const double h = 1e-6;
  int checked = 0;
  for (const auto& item : phase_module.named_parameters()) {
    at::Tensor p = item.value();
    ASSERT_TRUE(p.grad().defined()) << what << ": no gradient for " << item.key();
    const at::Tensor grad = p.grad().clone().reshape({-1});
    at::Tensor flat = p.detach().view({-1});
    const std::int64_t n = flat.numel();
    const std::int64_t entries[] = {0, n / 2, n - 1};
    torch::NoGradGuard no_grad;
    const std::vector<double> numeric =
        testing::central_differences(3, h, [&](std::int64_t j, double shift) {
          const std::int64_t i = entries[j];
          const double x0 = flat[i].item<double>();
          flat[i] = x0 + shift;
          const double loss = (f() * w).sum().item<double>();
          flat[i] = x0;
          return loss;
        });
    for (std::size_t j = 0; j < 3; ++j) {
      const double fd = numeric[j], ad = grad[entries[j]].item<double>();
      EXPECT_NEAR(ad, fd, 1e-6 * (1.0 + std::abs(fd)))
          << what << ": " << item.key() << "[" << entries[j] << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, 9) << what;
}

// ---- SelectiveRoPE ------------------------------------------------------------------------------

TEST(SelectiveRoPE, SpectraFollowTheirDefinitions) {
  const std::int64_t K = 16, R = K / 2;
  const at::Tensor rope = SelectiveRoPEImpl::spectrum_values(Spectrum::rope, K, 500000.0);
  const at::Tensor tan2 = SelectiveRoPEImpl::spectrum_values(Spectrum::tan2, K, 500000.0);
  ASSERT_EQ(rope.numel(), R);
  for (std::int64_t i = 0; i < R; ++i) {
    EXPECT_NEAR(rope[i].item<double>(), 1.0 / std::pow(500000.0, 2.0 * i / K), 1e-15);
    const double p = 1.0 - (i + 0.5) / R, p0 = 1.0 - 0.5 / R;
    const double expected = std::pow(std::tan(M_PI * p / 2) / std::tan(M_PI * p0 / 2), 2);
    EXPECT_NEAR(tan2[i].item<double>(), expected, 1e-15);
    if (i > 0) {
      EXPECT_LT(tan2[i].item<double>(), tan2[i - 1].item<double>());
    }
    // tan(πp/2)·tan(π(1 − p)/2) = 1: the spectrum is log-symmetric about its middle.
    EXPECT_NEAR(tan2[i].item<double>() * tan2[R - 1 - i].item<double>(), tan2[R - 1].item<double>(),
                1e-15);
  }
  EXPECT_DOUBLE_EQ(tan2[0].item<double>(), 1.0);
  // Base 1: ω ≡ 1 on every pair (the Selective RoPE code's state-tracking temp_theta 1.0).
  const at::Tensor flat = SelectiveRoPEImpl::spectrum_values(Spectrum::rope, K, 1.0);
  ASSERT_EQ(flat.numel(), R);
  EXPECT_TRUE(at::equal(flat, at::ones({R}, flat.options())));
  const SelectiveRoPE fixed(
      SelectiveRoPEOptions(8, 2, K).spectrum_base(1.0).learnable_omega(false));
  EXPECT_TRUE(at::equal(fixed->omega(), at::ones({R}, fixed->omega().options())));
}

TEST(SelectiveRoPE, ZeroInputPathIsRoPE) {
  // Projection zero, no gate, b = 0: φ_t = SiLU(0) + exp(0) = 1, so θ_t = ω·(t + 1) — RoPE with
  // frequencies ω (positions shifted by one, which leaves every relative angle unchanged).
  torch::manual_seed(1);
  SelectiveRoPE rope(SelectiveRoPEOptions(8, 2, 6).gate(PhaseGate::none).learnable_omega(false));
  rope->to(at::kDouble);
  {
    torch::NoGradGuard no_grad;
    rope->up->weight.zero_();
  }
  const at::Tensor x = torch::randn({2, 7, 8}, f64);
  const at::Tensor theta = rope->forward(x);
  // ω is RoPE's spectrum (stored in the module's initial float32, hence the tolerance).
  const at::Tensor omega = rope->omega();
  const at::Tensor angles =
      phasor::rope_angles(2, 7, 6, 500000.0, /*offset=*/1, c10::nullopt, at::kDouble);
  EXPECT_LT(max_abs_diff(omega, angles[0][0]), 1e-7);
  const at::Tensor positions = at::arange(1, 8, f64).reshape({1, 7, 1, 1});
  EXPECT_LT(max_abs_diff(theta, positions * omega), 1e-13);
}

TEST(SelectiveRoPE, InputScaleInvariantPerHead) {
  // The input is ℓ2-normalised per head: scaling each head's group of channels changes nothing.
  torch::manual_seed(2);
  SelectiveRoPE rope(SelectiveRoPEOptions(12, 3, 4).gate(PhaseGate::per_channel));
  rope->to(at::kDouble);
  const at::Tensor x = torch::randn({1, 5, 12}, f64);
  const at::Tensor s = at::tensor({0.25, 4.0, 30.0}, f64).repeat_interleave(4);
  // Up to the 1e-6 inside the norm (relative 1e-6/‖x_h‖² ~ 1e-5 for the 0.25-scaled group).
  EXPECT_LT(max_abs_diff(rope->forward(x), rope->forward(x * s)), 2e-5);
  // Scaling the whole input of one head group is invisible, but mixing groups is not.
  const at::Tensor mixed = at::cat({x.narrow(2, 4, 4), x.narrow(2, 0, 4), x.narrow(2, 8, 4)}, 2);
  EXPECT_GT(max_abs_diff(rope->forward(x), rope->forward(mixed)), 1e-3);
}

TEST(SelectiveRoPE, DecodeMatchesParallel) {
  torch::manual_seed(3);
  for (const auto projection : {PhaseProjection::low_rank, PhaseProjection::full_rank}) {
    SelectiveRoPE rope(
        SelectiveRoPEOptions(8, 2, 6).projection(projection).gate(PhaseGate::per_head));
    rope->to(at::kDouble);
    const at::Tensor x = torch::randn({2, 9, 8}, f64);
    const at::Tensor theta = rope->forward(x);
    SelectiveRoPECache cache;
    std::vector<at::Tensor> rows{rope->forward(x.narrow(1, 0, 4), &cache)};
    for (std::int64_t t = 4; t < 9; ++t) rows.push_back(rope->forward(x.narrow(1, t, 1), &cache));
    EXPECT_LT(max_abs_diff(at::cat(rows, 1), theta), 1e-12);
    EXPECT_EQ(cache.conv_state.sizes(), (std::vector<std::int64_t>{2, 6, 3}));
    EXPECT_EQ(cache.phase.sizes(), (std::vector<std::int64_t>{2, 2, 3}));
  }
}

TEST(SelectiveRoPE, PhasePathFiniteDifferences) {
  // projection → conv (+SiLU) → +exp(b) → ·σ(gate) → cumsum·ω → rotation of a fixed q.
  torch::manual_seed(4);
  for (const auto projection : {PhaseProjection::low_rank, PhaseProjection::full_rank})
    for (const auto gate : {PhaseGate::per_head, PhaseGate::per_channel}) {
      SelectiveRoPE rope(full_phase_path(projection, gate).hidden_size(8).num_heads(2).head_dim(6));
      rope->to(at::kDouble);
      const at::Tensor x = torch::randn({2, 7, 8}, f64), q = torch::randn({2, 7, 2, 6}, f64);
      const at::Tensor w = torch::randn({2, 7, 2, 6}, f64);
      expect_phase_path_gradients(
          *rope, *rope, [&] { return phasor::apply_rotary(q, rope->forward(x)); }, w,
          "SelectiveRoPE projection " + std::to_string(static_cast<int>(projection)) + " gate " +
              std::to_string(static_cast<int>(gate)));
    }
}

// ---- rms_norm
// ------------------------------------------------------------------------------------

TEST(RmsNorm, ForwardIsTheComposedExpressionAndGradientsMatchFiniteDifferences) {
  torch::manual_seed(21);
  // float32: the composed x · rsqrt(mean(x²) + eps) · weight to rounding (the CPU loop sums a
  // row's squares in its own order).
  const at::Tensor x32 = torch::randn({3, 5, 7}), w32 = torch::randn({7});
  const at::Tensor composed = x32 * at::rsqrt(x32.pow(2).mean(-1, true) + 1e-5) * w32;
  EXPECT_CLOSE(rms_norm(x32, w32, 1e-5), composed, 1e-6, "float32 y");
  // float64: autograd's gradients of the composed expression and central differences, for rows
  // of very different scales (the eps term matters for the small ones).
  const at::Tensor
      x = torch::randn({2, 4, 6}, f64) *
          torch::tensor({1e-3, 1.0, 30.0}, f64).repeat(8).narrow(0, 0, 8).reshape({2, 4, 1}),
      w = torch::randn({6}, f64), dy = torch::randn({2, 4, 6}, f64);
  const auto loss = [&](const std::vector<at::Tensor>& in) {
    return (rms_norm(in[0], in[1], 1e-4) * dy).sum();
  };
  torch_test::check_finite_differences(loss, {x, w}, {"x", "weight"}, 1e-7, true);
  const at::Tensor xl = torch_test::leaf(x), wl = torch_test::leaf(w);
  (rms_norm(xl, wl, 1e-4) * dy).sum().backward();
  const at::Tensor xc = torch_test::leaf(x), wc = torch_test::leaf(w);
  ((xc * at::rsqrt(xc.pow(2).mean(-1, true) + 1e-4) * wc) * dy).sum().backward();
  EXPECT_CLOSE(xl.grad(), xc.grad(), 1e-14, "dx");
  EXPECT_CLOSE(wl.grad(), wc.grad(), 1e-14, "dweight");
  // Only the gradients asked for.
  const at::Tensor x_only = torch_test::leaf(x);
  (rms_norm(x_only, w, 1e-4) * dy).sum().backward();
  EXPECT_CLOSE(x_only.grad(), xc.grad(), 1e-14, "dx without dweight");
}

// The composed expressions rms_norm_gated stands for, in ATen ops (autograd differentiates them).
at::Tensor composed_norm_gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& w,
                               double eps, const std::string& activation) {
  const at::Tensor normed = x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
  return normed * (activation == "sigmoid" ? at::sigmoid(gate) : at::silu(gate));
}

TEST(RmsNormGated, MatchesTheComposedExpressionAndFiniteDifferences) {
  torch::manual_seed(22);
  // Rows of very different scales (eps matters for the small ones) and gates from strongly
  // negative to strongly positive (σ near 0 and 1).
  const at::Tensor
      x = torch::randn({2, 4, 6}, f64) *
          torch::tensor({1e-3, 1.0, 30.0}, f64).repeat(8).narrow(0, 0, 8).reshape({2, 4, 1}),
      gate = torch::randn({2, 4, 6}, f64) * 4, w = torch::randn({6}, f64),
      dy = torch::randn({2, 4, 6}, f64);
  for (const std::string activation : {"silu", "sigmoid"}) {
    SCOPED_TRACE(activation);
    EXPECT_CLOSE(rms_norm_gated(x, gate, w, 1e-4, activation),
                 composed_norm_gated(x, gate, w, 1e-4, activation), 1e-15, "y");
    const auto loss = [&](const std::vector<at::Tensor>& in) {
      return (rms_norm_gated(in[0], in[1], in[2], 1e-4, activation) * dy).sum();
    };
    torch_test::check_finite_differences(loss, {x, gate, w}, {"x", "gate", "weight"}, 1e-7, true);
    const at::Tensor xl = torch_test::leaf(x), gl = torch_test::leaf(gate),
                     wl = torch_test::leaf(w);
    (rms_norm_gated(xl, gl, wl, 1e-4, activation) * dy).sum().backward();
    const at::Tensor xc = torch_test::leaf(x), gc = torch_test::leaf(gate),
                     wc = torch_test::leaf(w);
    (composed_norm_gated(xc, gc, wc, 1e-4, activation) * dy).sum().backward();
    EXPECT_CLOSE(xl.grad(), xc.grad(), 1e-14, "dx");
    EXPECT_CLOSE(gl.grad(), gc.grad(), 1e-14, "dgate");
    EXPECT_CLOSE(wl.grad(), wc.grad(), 1e-14, "dweight");
    // Only the gradient asked for: the gate's alone.
    const at::Tensor g_only = torch_test::leaf(gate);
    (rms_norm_gated(x, g_only, w, 1e-4, activation) * dy).sum().backward();
    EXPECT_CLOSE(g_only.grad(), gc.grad(), 1e-14, "dgate alone");
  }
  // "swish" is fla's name for SiLU.
  EXPECT_TRUE(at::equal(rms_norm_gated(x, gate, w, 1e-4, "swish"),
                        rms_norm_gated(x, gate, w, 1e-4, "silu")));
}

TEST(RmsNormGated, SaturatedGatesAndStridedInputs) {
  torch::manual_seed(23);
  // Gates far in the tails: σ(−200) = 0 and σ(200) = 1 exactly in float32, finite gradients.
  const at::Tensor x = torch::randn({3, 16}), w = torch::randn({16});
  const at::Tensor gate =
      torch::tensor({-200.0f, 200.0f, 0.0f, -30.0f}).repeat(12).reshape({3, 16});
  for (const std::string activation : {"silu", "sigmoid"}) {
    SCOPED_TRACE(activation);
    const at::Tensor xl = torch_test::leaf(x), gl = torch_test::leaf(gate),
                     wl = torch_test::leaf(w);
    const at::Tensor y = rms_norm_gated(xl, gl, wl, 1e-5, activation);
    EXPECT_CLOSE(y, composed_norm_gated(x, gate, w, 1e-5, activation), 1e-6, "y");
    y.sum().backward();
    for (const at::Tensor& g : {xl.grad(), gl.grad(), wl.grad()})
      EXPECT_TRUE(at::isfinite(g).all().item<bool>());
  }
  // A transposed (non-contiguous) x and gate give the values of their contiguous copies.
  const at::Tensor xt = torch::randn({16, 5}, f64).t(), gt = torch::randn({16, 5}, f64).t();
  const at::Tensor w64 = torch::randn({16}, f64);
  ASSERT_FALSE(xt.is_contiguous());
  EXPECT_TRUE(at::equal(rms_norm_gated(xt, gt, w64, 1e-5),
                        rms_norm_gated(xt.contiguous(), gt.contiguous(), w64, 1e-5)));
  EXPECT_TRUE(at::equal(rms_norm(xt, w64, 1e-5), rms_norm(xt.contiguous(), w64, 1e-5)));
}

// bfloat16 runs the node's ATen expressions (the CPU loops take float32 and float64), as every
// type off the CPU does: the same function, to bfloat16's rounding. (float16 would too, but this
// LibTorch's CPU rsqrt has no float16 kernel.)
TEST(RmsNormGated, BFloat16RunsTheAtenExpressions) {
  torch::manual_seed(24);
  const at::Tensor x = torch::randn({4, 3, 32}, f64), gate = torch::randn({4, 3, 32}, f64) * 2,
                   w = torch::randn({32}, f64), dy = torch::randn({4, 3, 32}, f64);
  const at::ScalarType type = at::kBFloat16;
  for (const std::string activation : {"silu", "sigmoid"}) {
    SCOPED_TRACE(activation);
    const at::Tensor xl = torch_test::leaf(x.to(type)), gl = torch_test::leaf(gate.to(type)),
                     wl = torch_test::leaf(w.to(type));
    const at::Tensor y = rms_norm_gated(xl, gl, wl, 1e-5, activation);
    ASSERT_EQ(y.scalar_type(), type);
    (y * dy.to(type)).sum().backward();
    const at::Tensor xc = torch_test::leaf(x), gc = torch_test::leaf(gate),
                     wc = torch_test::leaf(w);
    const at::Tensor yc = composed_norm_gated(xc, gc, wc, 1e-5, activation);
    (yc * dy).sum().backward();
    EXPECT_CLOSE(y, yc, 2e-2, "y");
    EXPECT_CLOSE(xl.grad(), xc.grad(), 3e-2, "dx");
    EXPECT_CLOSE(gl.grad(), gc.grad(), 3e-2, "dgate");
    EXPECT_CLOSE(wl.grad(), wc.grad(), 3e-2, "dweight");
    const at::Tensor xn = torch_test::leaf(x.to(type)), wn = torch_test::leaf(w.to(type));
    (rms_norm(xn, wn, 1e-5) * dy.to(type)).sum().backward();
    const at::Tensor xd = torch_test::leaf(x), wd = torch_test::leaf(w);
    ((xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-5) * wd) * dy).sum().backward();
    EXPECT_CLOSE(xn.grad(), xd.grad(), 3e-2, "rms_norm dx");
    EXPECT_CLOSE(wn.grad(), wd.grad(), 3e-2, "rms_norm dweight");
  }
}

// More rows than one block of the CPU loop (256 rows): every result is the same on 1 and 2 of
// phasor's threads, dweight included (fixed blocks summed in order).
TEST(RmsNormGated, SameBitsForAnyThreadCount) {
  torch::manual_seed(25);
  const at::Tensor x = torch::randn({3, 700, 64}), gate = torch::randn({3, 700, 64}),
                   w = torch::randn({64}), dy = torch::randn({3, 700, 64});
  std::vector<at::Tensor> results[2];
  for (const int threads : {1, 2}) {
    phasor::set_num_threads(threads);
    const at::Tensor xl = torch_test::leaf(x), gl = torch_test::leaf(gate),
                     wl = torch_test::leaf(w);
    const at::Tensor y = rms_norm_gated(xl, gl, wl, 1e-5) + rms_norm(xl, wl, 1e-5);
    (y * dy).sum().backward();
    results[threads - 1] = {y, xl.grad(), gl.grad(), wl.grad()};
  }
  phasor::set_num_threads(0);
  for (std::size_t i = 0; i < results[0].size(); ++i)
    EXPECT_TRUE(at::equal(results[0][i], results[1][i])) << "result " << i;
  EXPECT_CLOSE(results[0][3],
               ((x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-5)) * dy * (at::silu(gate) + 1))
                   .sum(at::IntArrayRef{0, 1}),
               1e-5, "dweight");
}

TEST(RmsNormGated, ErrorsNameTheArgument) {
  const at::Tensor x = torch::randn({2, 3, 4}), w = torch::ones({4});
  torch_test::expect_torch_error(
      [&] {
        rms_norm_gated(x, torch::randn({2, 3, 5}), w, 1e-5);
      },
      {"rms_norm_gated", "'gate'", "[2, 3, 4]", "[2, 3, 5]"});
  torch_test::expect_torch_error([&] { rms_norm_gated(x, at::Tensor(), w, 1e-5); },
                                 {"rms_norm_gated", "'gate'", "undefined"});
  torch_test::expect_torch_error(
      [&] {
        rms_norm_gated(x, torch::randn({2, 3, 4}, f64), w, 1e-5);
      },
      {"rms_norm_gated", "'gate'", "dtype", "Double"});
  torch_test::expect_torch_error([&] { rms_norm_gated(x, x, w, 1e-5, "relu"); },
                                 {"rms_norm_gated", "'activation'", "'relu'"});
  torch_test::expect_torch_error([&] { rms_norm_gated(x, x, torch::ones({3}), 1e-5); },
                                 {"rms_norm_gated", "'weight'", "[4]", "[3]"});
  torch_test::expect_torch_error([&] { rms_norm_gated(x, x, w, -2.0); },
                                 {"rms_norm_gated", "'eps'", "-2"});
}

TEST(RmsNorm, ErrorsNameTheArgument) {
  const at::Tensor x = torch::randn({2, 3, 4});
  torch_test::expect_torch_error([&] { rms_norm(x, torch::ones({3}), 1e-5); },
                                 {"rms_norm", "'weight'", "[4]", "[3]"});
  torch_test::expect_torch_error([&] { rms_norm(x, torch::ones({4}, f64), 1e-5); },
                                 {"rms_norm", "'weight'", "dtype"});
  torch_test::expect_torch_error([&] { rms_norm(x, torch::ones({4}), -1.0); },
                                 {"rms_norm", "'eps'", "-1"});
  torch_test::expect_torch_error([&] { rms_norm(at::Tensor(), torch::ones({4}), 1e-5); },
                                 {"rms_norm", "'x'", "undefined"});
}

// ---- layers: small float64 configurations -------------------------------------------------------

GatedLinearAttention make_gla(PosEncoding pe, bool tied = true,
                              RotaryLayout layout = RotaryLayout::half_split) {
  auto opt = GatedLinearAttentionOptions(12, 2)
                 .expand_k(1.0)
                 .expand_v(0.5)
                 .use_short_conv(true)
                 .gate_low_rank_dim(4)
                 .gate_logit_normalizer(2.0)  // strong decays, so the gates matter
                 .chunk_size(4)
                 .pos_encoding(pe)
                 .tie_gate_pairs(tied)
                 .rotary_layout(layout)
                 .selective_rope(full_phase_path(PhaseProjection::low_rank, PhaseGate::per_head));
  GatedLinearAttention layer(opt);
  layer->to(at::kDouble);
  return layer;
}

GatedDeltaNet make_gdn(PosEncoding pe) {
  auto opt =
      GatedDeltaNetOptions(12, 2, 6)
          .num_v_heads(4)
          .expand_v(1.5)
          .chunk_size(4)
          .pos_encoding(pe)
          .selective_rope(full_phase_path(PhaseProjection::full_rank, PhaseGate::per_channel));
  GatedDeltaNet layer(opt);
  layer->to(at::kDouble);
  return layer;
}

ForgettingAttention make_fox(PosEncoding pe) {
  auto opt =
      ForgettingAttentionOptions(16, 4)
          .num_kv_heads(2)
          .qk_norm(true)
          .use_output_gate(true)
          .use_output_norm(true)
          .block_size(4)
          .pos_encoding(pe)
          .selective_rope(full_phase_path(PhaseProjection::low_rank, PhaseGate::per_channel));
  ForgettingAttention layer(opt);
  layer->to(at::kDouble);
  return layer;
}

TEST(GatedLinearAttention, DecodeMatchesParallel) {
  torch::manual_seed(10);
  const at::Tensor x = torch::randn({2, 11, 12}, f64);
  for (const auto pe : kAllPos)
    for (const bool tied : {true, false}) {
      auto layer = make_gla(pe, tied);
      expect_decode_matches_parallel(layer, x, 6, "GLA " + name_of(pe) + (tied ? " tied" : ""));
    }
  GatedLinearAttention plain(GatedLinearAttentionOptions(12, 3)
                                 .use_output_gate(false)
                                 .impl(Impl::recurrent)
                                 .pos_encoding(PosEncoding::rope));
  plain->to(at::kDouble);
  expect_decode_matches_parallel(plain, x, 4, "GLA recurrent, no output gate, rope");
}

// The layers compute their projections of x as one product with the weights stacked: the output
// is that of the layer's equations with each projection on its own (float64, to rounding), so a
// projection split off at the wrong place or in the wrong order fails.
TEST(GatedLinearAttention, StackedProjectionsAreTheSeparateOnes) {
  torch::manual_seed(31);
  GatedLinearAttention layer(GatedLinearAttentionOptions(12, 2)
                                 .expand_k(1.0)
                                 .expand_v(0.5)
                                 .gate_low_rank_dim(4)
                                 .gate_logit_normalizer(2.0)
                                 .chunk_size(4));
  layer->to(at::kDouble);
  const at::Tensor x = torch::randn({2, 9, 12}, f64);
  const std::int64_t B = 2, T = 9, H = 2;
  const auto linear = [&](const torch::nn::Linear& p) { return at::linear(x, p->weight); };
  const at::Tensor q = linear(layer->q_proj).reshape({B, T, H, layer->head_k}),
                   k = linear(layer->k_proj).reshape({B, T, H, layer->head_k}),
                   v = linear(layer->v_proj).reshape({B, T, H, layer->head_v});
  const at::Tensor g = layer->forget_gates(x);  // gk_down on its own
  const at::Tensor out = std::get<0>(
      phasor::gla(q, k, v, g, Impl::chunk, c10::nullopt, c10::nullopt, false, c10::nullopt, 4));
  const at::Tensor y = rms_norm_gated(out, linear(layer->g_proj).reshape({B, T, H, layer->head_v}),
                                      layer->o_norm_weight, layer->options.norm_eps(), "silu");
  const at::Tensor expected = at::linear(y.reshape({B, T, -1}), layer->o_proj->weight);
  EXPECT_CLOSE(layer->forward(x), expected, 1e-13, "GLA layer");
}

// clamp_min is fla's floor on the log forget gate: g = max(logsigmoid(·)/normalizer, clamp_min),
// entry by entry, with the gradient of the clamped entries cut; 0 pins the gate to 1, so the
// layer is the same layer with g ≡ 0 given to the op, and its gate weights get no gradient.
TEST(GatedLinearAttention, ClampMinIsAFloorOnTheLogGate) {
  torch::manual_seed(33);
  const at::Tensor x = torch::randn({2, 9, 12}, f64);
  GatedLinearAttention free_gate = make_gla(PosEncoding::selective_rope);
  const auto with_floor = [&](double floor) {
    auto options = free_gate->options;
    GatedLinearAttention layer(options.clamp_min(floor));
    layer->to(at::kDouble);
    torch::NoGradGuard no_grad;
    const auto source = free_gate->named_parameters();
    for (auto& p : layer->named_parameters()) p.value().copy_(source[p.key()]);
    return layer;
  };
  const at::Tensor g = free_gate->forget_gates(x);
  // A floor inside the gates' range, so that some entries are clamped and some are not.
  const double floor = -0.3;
  ASSERT_TRUE(g.lt(floor).any().item<bool>() && g.gt(floor).any().item<bool>());
  GatedLinearAttention floored = with_floor(floor);
  EXPECT_TRUE(at::equal(floored->forget_gates(x), at::clamp_min(g, floor)));
  expect_decode_matches_parallel(floored, x, 6, "GLA clamp_min -0.3");

  GatedLinearAttention pinned = with_floor(0.0);
  EXPECT_TRUE(at::equal(pinned->forget_gates(x), at::zeros_like(g)));
  // The same weights with the gate's logits driven to +40: log g = logsigmoid(40)/2 ≈ −2e-18.
  GatedLinearAttention open_gate = with_floor(-1.0);
  {
    torch::NoGradGuard no_grad;
    open_gate->gk_up->weight.zero_();
    open_gate->gk_up->bias.fill_(40.0);
  }
  const at::Tensor y = pinned->forward(x);
  EXPECT_CLOSE(y, open_gate->forward(x), 1e-13, "GLA clamp_min 0 against an open gate");
  EXPECT_GT((y - free_gate->forward(x)).abs().max().item<double>(), 1e-3);  // the gate mattered
  y.square().sum().backward();
  EXPECT_TRUE(at::equal(pinned->gk_up->weight.grad(), at::zeros_like(pinned->gk_up->weight)));
  EXPECT_GT(pinned->q_proj->weight.grad().abs().max().item<double>(), 0.0);
  floored->forward(x).square().sum().backward();
  EXPECT_GT(floored->gk_up->weight.grad().abs().max().item<double>(), 0.0);
}

TEST(GatedDeltaNet, StackedProjectionsAreTheSeparateOnes) {
  torch::manual_seed(32);
  GatedDeltaNet layer(GatedDeltaNetOptions(12, 2, 6)
                          .num_v_heads(4)
                          .expand_v(1.5)
                          .chunk_size(4)
                          .use_short_conv(false)
                          .allow_neg_eigval(true));
  layer->to(at::kDouble);
  const at::Tensor x = torch::randn({2, 9, 12}, f64);
  const std::int64_t B = 2, T = 9, H = 2, HV = 4, K = 6;
  const auto linear = [&](const torch::nn::Linear& p) { return at::linear(x, p->weight); };
  const at::Tensor q = at::silu(linear(layer->q_proj)).reshape({B, T, H, K}),
                   k = at::silu(linear(layer->k_proj)).reshape({B, T, H, K}),
                   v = at::silu(linear(layer->v_proj)).reshape({B, T, HV, layer->head_v});
  const at::Tensor beta = at::sigmoid(linear(layer->b_proj)) * 2.0;
  const at::Tensor g = -layer->A_log.exp() * at::softplus(linear(layer->a_proj) + layer->dt_bias);
  const at::Tensor out = std::get<0>(phasor::gated_delta_rule(
      q, k, v, g, beta, Impl::chunk, c10::nullopt, c10::nullopt, false, c10::nullopt, true, 4));
  const at::Tensor y = rms_norm_gated(out, linear(layer->g_proj).reshape({B, T, HV, layer->head_v}),
                                      layer->o_norm_weight, layer->options.norm_eps(), "silu");
  const at::Tensor expected = at::linear(y.reshape({B, T, -1}), layer->o_proj->weight);
  EXPECT_CLOSE(layer->forward(x), expected, 1e-13, "Gated DeltaNet layer");
}

TEST(Layers, CloneCopiesEverySubmodule) {
  torch::manual_seed(21);
  const at::Tensor x = torch::randn({1, 6, 16}, f64);
  GatedDeltaNet gdn(GatedDeltaNetOptions(16, 2, 4).pos_encoding(PosEncoding::selective_rope));
  gdn->to(at::kDouble);
  auto copy = std::dynamic_pointer_cast<GatedDeltaNetImpl>(gdn->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->parameters().size(), gdn->parameters().size());
  EXPECT_TRUE(at::equal(copy->forward(x), gdn->forward(x)));
  {
    torch::NoGradGuard no_grad;
    copy->rope->bias.fill_(1.0);  // the copy owns its parameters
  }
  EXPECT_GT(max_abs_diff(copy->forward(x), gdn->forward(x)), 1e-6);
}

TEST(GatedDeltaNet, DecodeMatchesParallel) {
  torch::manual_seed(11);
  const at::Tensor x = torch::randn({2, 11, 12}, f64);
  for (const auto pe : kAllPos) {
    auto layer = make_gdn(pe);
    expect_decode_matches_parallel(layer, x, 6, "GDN " + name_of(pe));
  }
  // The other branches: SiLU without short convolutions, β ∈ (0, 2), no output gate, and a
  // fixed tan² spectrum.
  GatedDeltaNet other(GatedDeltaNetOptions(12, 3, 4)
                          .expand_v(1.0)
                          .use_short_conv(false)
                          .allow_neg_eigval(true)
                          .use_gate(false)
                          .chunk_size(4)
                          .pos_encoding(PosEncoding::selective_rope)
                          .selective_rope(SelectiveRoPEOptions(0, 0, 0)
                                              .spectrum(Spectrum::tan2)
                                              .learnable_omega(false)
                                              .gate(PhaseGate::none)
                                              .conv_silu(false)));
  other->to(at::kDouble);
  EXPECT_EQ(other->rope->omega().dim(), 1);
  expect_decode_matches_parallel(other, x, 5, "GDN without convs / gate, tan2");
}

TEST(ForgettingAttention, DecodeMatchesParallel) {
  torch::manual_seed(12);
  const at::Tensor x = torch::randn({2, 11, 16}, f64);
  for (const auto pe : kAllPos) {
    auto layer = make_fox(pe);
    expect_decode_matches_parallel(layer, x, 6, "FoX " + name_of(pe));
  }
  auto windowed = ForgettingAttention(
      ForgettingAttentionOptions(16, 2).window_size(3).pos_encoding(PosEncoding::selective_rope));
  windowed->to(at::kDouble);
  expect_decode_matches_parallel(windowed, x, 5, "FoX window 3");
}

TEST(ForgettingAttention, WithoutForgetGateIsCausalSoftmaxAttention) {
  // use_forget_gate(false): f ≡ 0, so o_t = Σ_{s≤t} softmax_s(q_t·k_s / √K) v_s — checked against
  // that formula in float64 with grouped heads (HQ = 4, H = 2) and T = 11 (not a multiple of the
  // block size 4), then decoding against the parallel forward for every position encoding.
  torch::manual_seed(21);
  const at::Tensor x = torch::randn({2, 11, 16}, f64);
  ForgettingAttention layer(
      ForgettingAttentionOptions(16, 4).num_kv_heads(2).block_size(4).use_forget_gate(false));
  layer->to(at::kDouble);
  EXPECT_FALSE(layer->f_proj);
  for (const auto& p : layer->named_parameters())
    EXPECT_EQ(p.key().find("f_proj"), std::string::npos);
  const std::int64_t B = 2, T = 11, HQ = 4, H = 2, K = 4;
  const at::Tensor q = layer->q_proj->forward(x).reshape({B, T, HQ, K}).transpose(1, 2);
  const at::Tensor k =
      layer->k_proj->forward(x).reshape({B, T, H, K}).transpose(1, 2).repeat_interleave(HQ / H, 1);
  const at::Tensor v =
      layer->v_proj->forward(x).reshape({B, T, H, K}).transpose(1, 2).repeat_interleave(HQ / H, 1);
  const at::Tensor mask = torch::ones({T, T}, at::kBool).triu(1);
  const at::Tensor scores =
      (q.matmul(k.transpose(-1, -2)) / std::sqrt(double(K))).masked_fill(mask, -INFINITY);
  const at::Tensor o = scores.softmax(-1).matmul(v).transpose(1, 2).reshape({B, T, HQ * K});
  const at::Tensor expected = layer->o_proj->forward(o);
  EXPECT_LT(max_abs_diff(layer->forward(x), expected), 1e-12);
  // A forget gate changes the output (the test would notice a gate left in by mistake).
  ForgettingAttention gated(ForgettingAttentionOptions(16, 4).num_kv_heads(2).block_size(4));
  gated->to(at::kDouble);
  gated->q_proj->weight.data().copy_(layer->q_proj->weight);
  gated->k_proj->weight.data().copy_(layer->k_proj->weight);
  gated->v_proj->weight.data().copy_(layer->v_proj->weight);
  gated->o_proj->weight.data().copy_(layer->o_proj->weight);
  EXPECT_GT(max_abs_diff(gated->forward(x), expected), 1e-3);
  for (const auto pe : kAllPos) {
    ForgettingAttention control(
        ForgettingAttentionOptions(16, 2).use_forget_gate(false).block_size(4).pos_encoding(pe));
    control->to(at::kDouble);
    expect_decode_matches_parallel(control, x, 6, "softmax attention " + name_of(pe));
  }
}

TEST(GatedLinearAttention, FusedRotationEqualsExplicit) {
  torch::manual_seed(13);
  const at::Tensor x = torch::randn({2, 9, 12}, f64);
  for (const auto pe : {PosEncoding::rope, PosEncoding::selective_rope})
    for (const auto layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
      auto layer = make_gla(pe, true, layout);
      expect_fused_equals_explicit(layer, x, "GLA " + name_of(pe) + " " + to_string(layout));
    }
}

TEST(GatedDeltaNet, FusedRotationEqualsExplicit) {
  torch::manual_seed(14);
  const at::Tensor x = torch::randn({2, 9, 12}, f64);
  for (const auto pe : {PosEncoding::rope, PosEncoding::selective_rope}) {
    auto layer = make_gdn(pe);
    expect_fused_equals_explicit(layer, x, "GDN " + name_of(pe));
  }
}

TEST(ForgettingAttention, FusedRotationEqualsExplicit) {
  torch::manual_seed(15);
  const at::Tensor x = torch::randn({2, 9, 16}, f64);
  for (const auto pe : {PosEncoding::rope, PosEncoding::selective_rope}) {
    auto layer = make_fox(pe);
    expect_fused_equals_explicit(layer, x, "FoX " + name_of(pe));
  }
}

TEST(GatedLinearAttention, PhasePathFiniteDifferences) {
  torch::manual_seed(16);
  const at::Tensor x = torch::randn({2, 9, 12}, f64), w = torch::randn({2, 9, 12}, f64);
  auto layer = make_gla(PosEncoding::selective_rope);
  expect_phase_path_gradients(
      *layer, *layer->rope, [&] { return layer->forward(x); }, w, "GLA");
}

TEST(GatedDeltaNet, PhasePathFiniteDifferences) {
  torch::manual_seed(17);
  const at::Tensor x = torch::randn({2, 9, 12}, f64), w = torch::randn({2, 9, 12}, f64);
  auto layer = make_gdn(PosEncoding::selective_rope);
  expect_phase_path_gradients(
      *layer, *layer->rope, [&] { return layer->forward(x); }, w, "GDN");
}

TEST(ForgettingAttention, PhasePathFiniteDifferences) {
  torch::manual_seed(18);
  const at::Tensor x = torch::randn({2, 9, 16}, f64), w = torch::randn({2, 9, 16}, f64);
  auto layer = make_fox(PosEncoding::selective_rope);
  expect_phase_path_gradients(
      *layer, *layer->rope, [&] { return layer->forward(x); }, w, "FoX");
}

TEST(GatedLinearAttention, GateTyingAcrossRotationPairs) {
  torch::manual_seed(19);
  const at::Tensor x = torch::randn({2, 5, 12}, f64);
  const std::int64_t K = 6;
  for (const auto layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    auto tied = make_gla(PosEncoding::selective_rope, true, layout);
    EXPECT_EQ(tied->gk_up->weight.size(0), 2 * K / 2);  // H·K/2 gate outputs
    const at::Tensor g = tied->forget_gates(x);
    ASSERT_EQ(g.sizes(), (std::vector<std::int64_t>{2, 5, 2, K}));
    for (std::int64_t i = 0; i < K / 2; ++i) {
      const std::int64_t a = layout == RotaryLayout::half_split ? i : 2 * i;
      const std::int64_t b = layout == RotaryLayout::half_split ? i + K / 2 : 2 * i + 1;
      EXPECT_TRUE(at::equal(g.select(-1, a), g.select(-1, b)))
          << to_string(layout) << " pair " << i;
    }
    EXPECT_LT(g.max().item<double>(), 0.0);
  }
  auto untied = make_gla(PosEncoding::selective_rope, false);
  EXPECT_EQ(untied->gk_up->weight.size(0), 2 * K);
  const at::Tensor g = untied->forget_gates(x);
  EXPECT_GT(max_abs_diff(g.narrow(-1, 0, K / 2), g.narrow(-1, K / 2, K / 2)), 1e-3);
  // Without rotation there are no pairs to tie.
  EXPECT_EQ(make_gla(PosEncoding::none, true)->gk_up->weight.size(0), 2 * K);
}

TEST(Layers, FloatParametersRun) {
  // float32 end to end (the default dtype), with a backward pass.
  torch::manual_seed(20);
  GatedLinearAttention gla(
      GatedLinearAttentionOptions(16, 2).pos_encoding(PosEncoding::selective_rope));
  const at::Tensor x = torch::randn({1, 70, 16}, at::requires_grad());
  const at::Tensor y = gla->forward(x);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.pow(2).sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::isfinite(x.grad()).all().item<bool>());
  EXPECT_TRUE(gla->rope->omega().grad().defined());
}

// ---- errors -------------------------------------------------------------------------------------

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

TEST(Layers, OptionErrorsNameTheOption) {
  expect_error([] { GatedLinearAttention(GatedLinearAttentionOptions(16, 0)); },
               {"GatedLinearAttention", "'num_heads'", "got 0"});
  expect_error([] { GatedLinearAttention(GatedLinearAttentionOptions(16, 3)); },
               {"GatedLinearAttention", "'expand_k'", "8"});
  expect_error(
      [] {
        GatedLinearAttention(GatedLinearAttentionOptions(12, 2).expand_k(0.5).pos_encoding(
            PosEncoding::rope));  // K = 3: odd
      },
      {"GatedLinearAttention", "'pos_encoding'", "even", "K = 3"});
  expect_error([] { GatedLinearAttention(GatedLinearAttentionOptions(16, 2).clamp_min(0.5)); },
               {"GatedLinearAttention", "'clamp_min'", "≤ 0", "0.5"});
  expect_error(
      [] { GatedLinearAttention(GatedLinearAttentionOptions(16, 2).clamp_min(std::nan(""))); },
      {"GatedLinearAttention", "'clamp_min'", "≤ 0"});
  expect_error([] { GatedDeltaNet(GatedDeltaNetOptions(16, 2, 8).num_v_heads(3)); },
               {"GatedDeltaNet", "'num_v_heads'", "multiple of num_heads = 2", "got 3"});
  expect_error([] { GatedDeltaNet(GatedDeltaNetOptions(16, 2, 8).expand_v(0.3)); },
               {"GatedDeltaNet", "'expand_v'"});
  expect_error([] { ForgettingAttention(ForgettingAttentionOptions(16, 4).num_kv_heads(3)); },
               {"ForgettingAttention", "'num_kv_heads'", "divisor", "got 3"});
  expect_error([] { ForgettingAttention(ForgettingAttentionOptions(18, 4)); },
               {"ForgettingAttention", "'hidden_size'", "got 18"});
  expect_error([] { ForgettingAttention(ForgettingAttentionOptions(16, 2).window_size(0)); },
               {"ForgettingAttention", "'window_size'", "got 0"});
  expect_error([] { SelectiveRoPE(SelectiveRoPEOptions(8, 2, 5)); },
               {"SelectiveRoPE", "'head_dim'", "even", "got 5"});
  expect_error([] { SelectiveRoPE(SelectiveRoPEOptions(9, 2, 4)); },
               {"SelectiveRoPE", "'hidden_size'", "num_heads = 2", "got 9"});
  expect_error([] { SelectiveRoPE(SelectiveRoPEOptions(8, 2, 4).rank(0)); },
               {"SelectiveRoPE", "'rank'", "got 0"});
  expect_error([] { SelectiveRoPE(SelectiveRoPEOptions(8, 2, 4).spectrum_base(0.5)); },
               {"SelectiveRoPE", "'spectrum_base'", "≥ 1", "got 0.5"});
  expect_error([] { SelectiveRoPE(SelectiveRoPEOptions(8, 2, 4).spectrum_base(std::nan(""))); },
               {"SelectiveRoPE", "'spectrum_base'", "≥ 1"});
  expect_error([] { ShortConvolution(ShortConvolutionOptions(8, 0)); },
               {"ShortConvolution", "'kernel_size'", "got 0"});
  // The sub-options' sizes are the layer's: an odd K is caught before the submodule is built.
  expect_error(
      [] {
        GatedDeltaNet(GatedDeltaNetOptions(16, 2, 5).pos_encoding(PosEncoding::selective_rope));
      },
      {"GatedDeltaNet", "'pos_encoding'", "K = 5"});
}

TEST(Layers, InputErrorsNameTheArgument) {
  GatedLinearAttention gla(GatedLinearAttentionOptions(16, 2));
  expect_error(
      [&] {
        gla->forward(torch::randn({2, 5, 15}));
      },
      {"GatedLinearAttention", "'x'", "[B, T ≥ 1, 16]", "[2, 5, 15]"});
  expect_error([&] { gla->forward(torch::randn({5, 16})); }, {"GatedLinearAttention", "'x'"});
  expect_error(
      [&] {
        gla->forward(torch::randn({1, 5, 16}).to(at::kHalf));
      },
      {"GatedLinearAttention", "'x'", "float32 or float64"});
  expect_error(
      [&] {
        gla->forward(torch::randn({1, 5, 16}, f64));
      },
      {"GatedLinearAttention", "'x'", "expected dtype Float", "module->to", "got Double"});
  GatedDeltaNet gdn(GatedDeltaNetOptions(16, 2, 8));
  expect_error([&] { gdn->forward(torch::randn({1, 0, 16})); }, {"GatedDeltaNet", "'x'"});
  ForgettingAttention fox(ForgettingAttentionOptions(16, 2));
  fox->to(at::kDouble);
  expect_error(
      [&] {
        fox->forward(torch::randn({1, 3, 16}));
      },
      {"ForgettingAttention", "'x'", "expected dtype Double", "got Float"});
  SelectiveRoPE rope(SelectiveRoPEOptions(8, 2, 4));
  expect_error([&] { rope->forward(torch::randn({1, 3, 4})); }, {"SelectiveRoPE", "'x'"});
}

}  // namespace
}  // namespace phasor::nn
