// The rotation encodings of issue 5 through LibTorch (phasor/torch.h, phasor/nn.h) and the task
// harness: autograd of nd_rope_angles, cayley_string, circulant_string, grape, grape_subspace,
// structured_rotation and structured_cayley against the core's float64 reference (forward and
// backward) and against central finite differences in float64; the nn modules against the ops
// they stand for; the relative law, decoding with LayerCache, dtypes and gradient flow through
// GatedLinearAttention, GatedDeltaNet and ForgettingAttention; errors; and tiny harness runs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "phasor/grape.h"
#include "phasor/nn.h"
#include "phasor/string_rotation.h"
#include "phasor/structured_rotation.h"
#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"
#include "phasor/tasks/train.h"
#include "phasor/torch.h"
#include "torch/layer_util.h"
#include "torch_test_util.h"

namespace phasor {
namespace {

using namespace torch_test;

using torch_detail::view_of;

using LossFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// The shared check (torch_test_util.h), asking for a non-vacuous numerical gradient.
void check_fd(const LossFn& loss, const std::vector<at::Tensor>& values,
              const std::vector<std::string>& names, double tol = 1e-6) {
  check_finite_differences(loss, values, names, tol, /*expect_nonzero=*/true);
}

// Σ y ⊙ w with fixed random weights: a loss whose gradient dy = w is generic.
at::Tensor weighted(const at::Tensor& y, const at::Tensor& w) {
  return (y * w).sum();
}

// A random orthogonal basis (Cayley of a random skew matrix) as a differentiable function of W.
at::Tensor cayley_of(const at::Tensor& w) {
  const at::Tensor s = w - w.transpose(-1, -2);
  const at::Tensor eye = at::eye(w.size(-1), w.options()).expand(w.sizes());
  return at::linalg_solve(eye + s, eye - s);
}

// ---- nd_rope_angles -----------------------------------------------------------------------------

TEST(NdRopeAngles, MatchesTheSumAndFiniteDifferences) {
  torch::manual_seed(1);
  const at::Tensor pos = at::randn({2, 5, 3}, f64) * 10;
  for (const bool per_head : {false, true}) {
    const at::Tensor omega =
        per_head ? at::rand({2, 3, 4}, f64) : at::rand({3, 4}, f64);  // [H, C, R] or [C, R]
    const at::Tensor theta = nd_rope_angles(pos, omega);
    const at::Tensor expected = per_head ? at::einsum("btc,hci->bthi", {pos, omega})
                                         : at::einsum("btc,ci->bti", {pos, omega});
    EXPECT_CLOSE(theta, expected, 1e-14, "theta");
    const at::Tensor w = at::randn(theta.sizes(), f64);
    check_fd(
        [&](const std::vector<at::Tensor>& v) { return weighted(nd_rope_angles(v[0], v[1]), w); },
        {pos, omega}, {"positions", "omega"});
  }
  // float32 positions and frequencies: float32 angles (computed in float64 in the kernel).
  EXPECT_EQ(nd_rope_angles(pos.to(at::kFloat), at::rand({3, 4})).scalar_type(), at::kFloat);
  // The axis-split spectrum of one axis is RoPE's.
  const at::Tensor one_axis = nd_rope_axis_split_frequencies(1, 8, 10000.0, at::kDouble);
  const at::Tensor t = at::arange(6, f64).reshape({1, 6, 1});
  EXPECT_CLOSE(nd_rope_angles(t, one_axis), rope_angles(1, 6, 8, 10000.0, 0, {}, at::kDouble),
               1e-14, "1-D angles");
}

// ---- Cayley-STRING ------------------------------------------------------------------------------

TEST(CayleyString, MatchesTheCoreReferenceAndFiniteDifferences) {
  torch::manual_seed(2);
  const std::int64_t B = 2, T = 3, H = 2, K = 6, C = 2;
  for (const bool per_head : {false, true})
    for (const RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
      const at::Tensor x = at::randn({B, T, H, K}, f64), pos = at::randn({B, T, C}, f64) * 3;
      const at::Tensor omega = per_head ? at::rand({H, C, K / 2}, f64) : at::rand({C, K / 2}, f64);
      const at::Tensor a =
          per_head ? at::randn({H, K, K}, f64) * 0.4 : at::randn({K, K}, f64) * 0.4;
      const at::Tensor w = at::randn({B, T, H, K}, f64);
      // Forward and backward against the core's float64 reference.
      std::vector<at::Tensor> in = {leaf(x), leaf(pos), leaf(omega), leaf(a)};
      const at::Tensor y = cayley_string(in[0], in[1], in[2], in[3], layout);
      weighted(y, w).backward();
      const CayleyStringParams p{view_of(x), view_of(pos), view_of(omega), view_of(a), layout};
      at::Tensor y_ref = at::empty_like(x), dx = at::empty_like(x), dpos = at::empty_like(pos),
                 domega = at::empty_like(omega), da = at::empty_like(a);
      cayley_string_forward(p, Impl::reference, view_of(y_ref));
      cayley_string_backward(p, Impl::reference, view_of(w),
                             {view_of(dx), view_of(dpos), view_of(domega), view_of(da)});
      EXPECT_CLOSE(y, y_ref, 1e-13, "y");
      EXPECT_CLOSE(in[0].grad(), dx, 1e-12, "dx");
      EXPECT_CLOSE(in[1].grad(), dpos, 1e-12, "d_positions");
      EXPECT_CLOSE(in[2].grad(), domega, 1e-12, "d_omega");
      EXPECT_CLOSE(in[3].grad(), da, 1e-12, "d_generator");
      check_fd(
          [&](const std::vector<at::Tensor>& v) {
            return weighted(cayley_string(v[0], v[1], v[2], v[3], layout), w);
          },
          {x, pos, omega, a}, {"x", "positions", "omega", "generator"});
    }
}

// ---- Circulant-STRING ---------------------------------------------------------------------------

TEST(CirculantString, MatchesTheCoreReferenceAndFiniteDifferences) {
  torch::manual_seed(3);
  const std::int64_t B = 2, T = 3, H = 2, C = 2;
  for (const std::int64_t K : {5, 6})  // odd K included (FFT path)
    for (const bool per_head : {false, true}) {
      const at::Tensor x = at::randn({B, T, H, K}, f64), pos = at::randn({B, T, C}, f64) * 3;
      const at::Tensor c =
          per_head ? at::randn({H, C, K}, f64) * 0.3 : at::randn({C, K}, f64) * 0.3;
      const at::Tensor w = at::randn({B, T, H, K}, f64);
      std::vector<at::Tensor> in = {leaf(x), leaf(pos), leaf(c)};
      const at::Tensor y = circulant_string(in[0], in[1], in[2]);
      weighted(y, w).backward();
      const CirculantStringParams p{view_of(x), view_of(pos), view_of(c)};
      at::Tensor y_ref = at::empty_like(x), dx = at::empty_like(x), dpos = at::empty_like(pos),
                 dc = at::empty_like(c);
      circulant_string_forward(p, Impl::reference, view_of(y_ref));
      circulant_string_backward(p, Impl::reference, view_of(w),
                                {view_of(dx), view_of(dpos), view_of(dc)});
      EXPECT_CLOSE(y, y_ref, 1e-13, "y");
      EXPECT_CLOSE(in[0].grad(), dx, 1e-12, "dx");
      EXPECT_CLOSE(in[1].grad(), dpos, 1e-12, "d_positions");
      EXPECT_CLOSE(in[2].grad(), dc, 1e-12, "dc");
      check_fd(
          [&](const std::vector<at::Tensor>& v) {
            return weighted(circulant_string(v[0], v[1], v[2]), w);
          },
          {x, pos, c}, {"x", "positions", "c"});
    }
}

// ---- GRAPE-M ------------------------------------------------------------------------------------

TEST(Grape, MatchesTheCoreReferenceAndFiniteDifferences) {
  torch::manual_seed(4);
  const std::int64_t B = 2, T = 3, H = 2, K = 5;
  for (const bool per_head : {false, true})
    for (const bool head_positions : {false, true}) {
      const at::Tensor x = at::randn({B, T, H, K}, f64);
      const at::Tensor a = per_head ? at::randn({H, K}, f64) : at::randn({K}, f64);
      const at::Tensor b = per_head ? at::randn({H, K}, f64) : at::randn({K}, f64);
      const at::Tensor omega = at::rand({H}, f64) + 0.2;
      const at::Tensor pos =
          head_positions ? at::randn({B, T, H}, f64) * 2 : at::randn({B, T}, f64) * 2;
      const at::Tensor w = at::randn({B, T, H, K}, f64);
      std::vector<at::Tensor> in = {leaf(x), leaf(a), leaf(b), leaf(omega), leaf(pos)};
      const at::Tensor y = grape(in[0], in[1], in[2], in[3], in[4]);
      weighted(y, w).backward();
      const GrapeParams p{view_of(x), view_of(a), view_of(b), view_of(omega), view_of(pos)};
      at::Tensor y_ref = at::empty_like(x), dx = at::empty_like(x), da = at::empty_like(a),
                 db = at::empty_like(b), domega = at::empty_like(omega), dpos = at::empty_like(pos);
      grape_forward(p, Impl::reference, view_of(y_ref));
      grape_backward(p, Impl::reference, view_of(w),
                     {view_of(dx), view_of(da), view_of(db), view_of(domega), view_of(dpos)});
      EXPECT_CLOSE(y, y_ref, 1e-13, "y");
      EXPECT_CLOSE(in[0].grad(), dx, 1e-12, "dx");
      EXPECT_CLOSE(in[1].grad(), da, 1e-12, "da");
      EXPECT_CLOSE(in[2].grad(), db, 1e-12, "db");
      EXPECT_CLOSE(in[3].grad(), domega, 1e-12, "d_omega");
      EXPECT_CLOSE(in[4].grad(), dpos, 1e-12, "d_positions");
      check_fd(
          [&](const std::vector<at::Tensor>& v) {
            return weighted(grape(v[0], v[1], v[2], v[3], v[4]), w);
          },
          {x, a, b, omega, pos}, {"x", "a", "b", "omega", "positions"});
    }
}

TEST(GrapeSubspace, MatchesTheCoreReferenceAndFiniteDifferencesThroughACayleyBasis) {
  torch::manual_seed(5);
  const std::int64_t B = 2, T = 3, H = 2, K = 6;
  for (const bool per_head : {false, true})
    for (const bool shared_theta : {false, true}) {
      const at::Tensor x = at::randn({B, T, H, K}, f64);
      const at::Tensor wb =
          per_head ? at::randn({H, K, K}, f64) * 0.3 : at::randn({K, K}, f64) * 0.3;
      const at::Tensor theta =
          shared_theta ? at::randn({B, T, K / 2}, f64) : at::randn({B, T, H, K / 2}, f64);
      const at::Tensor w = at::randn({B, T, H, K}, f64);
      const RotaryLayout layout = per_head ? RotaryLayout::interleaved : RotaryLayout::half_split;
      // Against the core reference, with the basis itself the leaf.
      const at::Tensor basis = cayley_of(wb);
      std::vector<at::Tensor> in = {leaf(x), leaf(basis), leaf(theta)};
      const at::Tensor y = grape_subspace(in[0], in[1], in[2], layout);
      weighted(y, w).backward();
      const at::Tensor theta4 =
          shared_theta ? theta.unsqueeze(2).expand({B, T, H, K / 2}).contiguous() : theta;
      GrapeSubspaceParams p;
      p.z = view_of(x), p.basis = view_of(basis), p.theta = view_of(theta4), p.layout = layout;
      at::Tensor y_ref = at::empty_like(x), dx = at::empty_like(x), dbasis = at::empty_like(basis),
                 dtheta = at::empty_like(theta4);
      grape_subspace_forward(p, Impl::reference, view_of(y_ref));
      grape_subspace_backward(p, Impl::reference, view_of(w),
                              {view_of(dx), view_of(dbasis), view_of(dtheta)});
      EXPECT_CLOSE(y, y_ref, 1e-13, "y");
      EXPECT_CLOSE(in[0].grad(), dx, 1e-12, "dx");
      EXPECT_CLOSE(in[1].grad(), dbasis, 1e-12, "d_basis");
      EXPECT_CLOSE(in[2].grad(), shared_theta ? dtheta.sum(2) : dtheta, 1e-12, "d_theta");
      // Finite differences with B = Cayley(W − Wᵀ): the basis stays orthogonal under the
      // perturbations and autograd chains d_basis into W.
      check_fd(
          [&](const std::vector<at::Tensor>& v) {
            return weighted(grape_subspace(v[0], cayley_of(v[1]), v[2], layout), w);
          },
          {x, wb, theta}, {"x", "W (basis = Cayley(W − Wᵀ))", "theta"});
    }
}

// ---- structured rotations -----------------------------------------------------------------------

// C commuting skew generators [C, K, K] with m active planes in a random orthogonal basis.
at::Tensor commuting_generators(std::int64_t C, std::int64_t K, std::int64_t m) {
  const at::Tensor u = std::get<0>(at::linalg_qr(at::randn({K, K}, f64)));
  at::Tensor gens = at::zeros({C, K, K}, f64);
  for (std::int64_t c = 0; c < C; ++c) {
    at::Tensor block = at::zeros({K, K}, f64);
    for (std::int64_t p = 0; p < m; ++p) {
      const double lam = at::randn({1}, f64).item<double>() + (c == 0 ? 2.0 + p : 0.0);
      block[2 * p + 1][2 * p] = lam;
      block[2 * p][2 * p + 1] = -lam;
    }
    gens[c] = u.matmul(block).matmul(u.t());
  }
  return gens;
}

TEST(StructuredRotation, MatchesTheCoreReferenceAndFiniteDifferences) {
  torch::manual_seed(6);
  const std::int64_t B = 2, T = 3, H = 2, K = 7, C = 2, m = 2;
  const StructuredDecomposition d = structured_decomposition(commuting_generators(C, K, m));
  ASSERT_EQ(d.num_active, m);
  EXPECT_FALSE(d.basis.requires_grad());
  EXPECT_CLOSE(d.active_projector + d.null_projector, at::eye(K, f64), 1e-12, "projectors");
  const at::Tensor u_act = d.basis.narrow(1, 0, 2 * m), lam = d.coefficients.narrow(1, 0, m);
  const at::Tensor null_basis = d.basis.narrow(1, 2 * m, K - 2 * m);
  const std::int64_t n = K - 2 * m;
  for (const bool head_positions : {false, true}) {
    const at::Tensor x = at::randn({B, T, H, K}, f64);
    const at::Tensor pos =
        head_positions ? at::randn({B, T, H, C}, f64) * 2 : at::randn({B, T, C}, f64) * 2;
    const at::Tensor ws = at::randn({n, n}, f64) * 0.4;
    const at::Tensor w = at::randn({B, T, H, K}, f64);
    // P from the structured Cayley map of S = W − Wᵀ on the null space (identity on the active
    // planes): checked against the core, then the rotation with P as a leaf.
    const at::Tensor s = ws - ws.t();
    const at::Tensor post = structured_cayley(s, null_basis);
    at::Tensor post_ref = at::empty({K, K}, f64);
    structured_cayley_forward(view_of(s), view_of(null_basis), view_of(post_ref));
    EXPECT_CLOSE(post, post_ref, 1e-14, "P");
    std::vector<at::Tensor> in = {leaf(x), leaf(pos), leaf(lam), leaf(post)};
    const at::Tensor y = structured_rotation(in[0], in[1], u_act, in[2], in[3]);
    weighted(y, w).backward();
    const at::Tensor pos4 =
        head_positions ? pos : pos.unsqueeze(2).expand({B, T, H, C}).contiguous();
    StructuredRotationParams p;
    p.x = view_of(x), p.positions = view_of(pos4), p.basis = view_of(u_act);
    p.coefficients = view_of(lam), p.post_rotation = view_of(post);
    at::Tensor y_ref = at::empty_like(x), dx = at::empty_like(x), dpos = at::empty_like(pos4),
               dlam = at::empty_like(lam), dpost = at::empty_like(post);
    structured_rotation_forward(p, Impl::reference, view_of(y_ref));
    structured_rotation_backward(p, Impl::reference, view_of(w),
                                 {view_of(dx), view_of(dpos), view_of(dlam), view_of(dpost)});
    EXPECT_CLOSE(y, y_ref, 1e-13, "y");
    EXPECT_CLOSE(in[0].grad(), dx, 1e-12, "dx");
    EXPECT_CLOSE(in[1].grad(), head_positions ? dpos : dpos.sum(2), 1e-12, "d_positions");
    EXPECT_CLOSE(in[2].grad(), dlam, 1e-12, "d_coefficients");
    EXPECT_CLOSE(in[3].grad(), dpost, 1e-12, "d_post_rotation");
    check_fd(
        [&](const std::vector<at::Tensor>& v) {
          const at::Tensor pr = structured_cayley(v[3] - v[3].t(), null_basis);
          return weighted(structured_rotation(v[0], v[1], u_act, v[2], pr), w);
        },
        {x, pos, lam, ws}, {"x", "positions", "coefficients", "W (S = W − Wᵀ)"});
  }
  // Without a post-rotation: R(r) alone, and it obeys R(r)ᵀR(s) = R(s − r) on logits.
  const at::Tensor q = at::randn({1, 1, 1, K}, f64), k = at::randn({1, 1, 1, K}, f64);
  const at::Tensor r1 = at::randn({1, 1, C}, f64), r2 = at::randn({1, 1, C}, f64);
  const at::Tensor lhs =
      (structured_rotation(q, r1, u_act, lam) * structured_rotation(k, r2, u_act, lam)).sum();
  const at::Tensor rhs = (q * structured_rotation(k, r2 - r1, u_act, lam)).sum();
  EXPECT_NEAR(lhs.item<double>(), rhs.item<double>(), 1e-12);
}

// ---- dtypes and errors of the ops ---------------------------------------------------------------

TEST(RotationOps, Float32AndHalfInputs) {
  torch::manual_seed(7);
  const at::Tensor x = at::randn({1, 4, 2, 8}, f64), pos = at::randn({1, 4, 1}, f64) * 5;
  const at::Tensor omega = at::rand({1, 4}, f64), a = at::randn({8, 8}, f64) * 0.3;
  const at::Tensor y64 = cayley_string(x, pos, omega, a);
  const at::Tensor y32 =
      cayley_string(x.to(at::kFloat), pos.to(at::kFloat), omega.to(at::kFloat), a.to(at::kFloat));
  EXPECT_EQ(y32.scalar_type(), at::kFloat);
  EXPECT_CLOSE(y32, y64, 1e-5, "float32 cayley_string");
  const at::Tensor yh = circulant_string(x.to(at::kHalf), pos, at::randn({1, 8}, f64));
  EXPECT_EQ(yh.scalar_type(), at::kHalf);
  // Gradients come back in each input's dtype.
  const at::Tensor x32 = leaf(x.to(at::kFloat)), a64 = leaf(a);
  cayley_string(x32, pos, omega, a64).sum().backward();
  EXPECT_EQ(x32.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(a64.grad().scalar_type(), at::kDouble);
}

TEST(RotationOps, StridedInputsSingleTokensAndLargePositions) {
  torch::manual_seed(14);
  const std::int64_t B = 2, H = 3, K = 8;
  for (const std::int64_t T : {1, 5}) {
    // x as every other element of a wider buffer, positions transposed: non-contiguous views.
    const at::Tensor wide = at::randn({B, T, H, 2 * K}, f64);
    const at::Tensor x = wide.slice(-1, 0, 2 * K, 2);
    const at::Tensor pos = (at::randn({1, T, B}, f64) * 500).permute({2, 1, 0});  // [B, T, 1]
    ASSERT_FALSE(x.is_contiguous());
    if (T > 1) {  // (T = 1: torch calls the permuted view contiguous)
      ASSERT_FALSE(pos.is_contiguous());
    }
    const at::Tensor xc = x.contiguous(), pc = pos.contiguous();
    const at::Tensor omega = at::rand({1, K / 2}, f64), a = at::randn({H, K, K}, f64) * 0.3;
    EXPECT_CLOSE(cayley_string(x, pos, omega, a), cayley_string(xc, pc, omega, a), 1e-14,
                 "strided cayley");
    const at::Tensor c = at::randn({1, K}, f64);
    EXPECT_CLOSE(circulant_string(x, pos, c), circulant_string(xc, pc, c), 1e-14,
                 "strided circulant");
    const at::Tensor va = at::randn({K}, f64), vb = at::randn({K}, f64), w = at::rand({H}, f64);
    const at::Tensor p2 = pos.select(2, 0);
    EXPECT_CLOSE(grape(x, va, vb, w, p2), grape(xc, va, vb, w, p2.contiguous()), 1e-14,
                 "strided grape");
    // Positions up to ~10³ in float32: the angles are formed in float64, so float32 results
    // stay at float32 accuracy (RoPE's angle error would otherwise grow with the position).
    const at::Tensor y32 = circulant_string(x.to(at::kFloat), pos.to(at::kFloat), c);
    const at::Tensor y64 = circulant_string(x, pos.to(at::kFloat).to(at::kDouble), c);
    EXPECT_CLOSE(y32, y64, 1e-5, "float32 at large positions");
  }
}

TEST(RotationOps, GradientsOnlyWhereRequestedAndFirstOrderOnly) {
  const at::Tensor x = leaf(at::randn({1, 3, 2, 6}, f64));
  const at::Tensor pos = at::randn({1, 3, 1}, f64), omega = at::rand({1, 3}, f64);
  const at::Tensor a = at::randn({6, 6}, f64);
  cayley_string(x, pos, omega, a).sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(a.grad().defined());
  // Double backward would silently be wrong (the core's backward is not differentiable).
  const at::Tensor c = leaf(at::randn({1, 6}, f64));
  const at::Tensor y = circulant_string(x, pos, c).pow(2).sum();
  expect_torch_error(
      [&] { torch::autograd::grad({y}, {c}, {}, /*retain_graph=*/true, /*create_graph=*/true); },
      {"circulant_string", "double backward"});
}

TEST(RotationOps, BadInputsNameTheOpAndArgument) {
  const at::Tensor x = at::randn({1, 2, 2, 6}, f64), pos = at::randn({1, 2, 1}, f64);
  expect_torch_error(
      [&] {
        cayley_string(x[0], pos, at::rand({1, 3}, f64), at::zeros({6, 6}, f64));
      },
      {"cayley_string", "'x'", "[B, T, H, K]"});
  // A core check (omega's C must be positions'): the core's message, as a c10::Error.
  expect_torch_error(
      [&] {
        cayley_string(x, pos, at::rand({2, 3}, f64), at::zeros({6, 6}, f64));
      },
      {"cayley_string", "'omega'"});
  expect_torch_error(
      [&] {
        circulant_string(x, pos, at::rand({1, 5}, f64));
      },
      {"circulant_string", "'c'"});
  expect_torch_error(
      [&] {
        grape(x, at::rand({6}, f64), at::rand({6}, f64), at::rand({3}, f64), at::rand({1, 2}, f64));
      },
      {"grape", "'omega'"});
  // A non-orthogonal basis breaks the relative law: refused.
  expect_torch_error(
      [&] {
        grape_subspace(x, at::eye(6, f64) * 1.1, at::zeros({1, 2, 3}, f64));
      },
      {"grape_subspace", "basis"});
  expect_torch_error([&] { nd_rope_angles(pos, at::rand({3}, f64)); },
                     {"nd_rope_angles", "'omega'"});
  expect_torch_error(
      [&] {
        structured_rotation(x, pos, at::eye(6, f64).narrow(1, 0, 2).requires_grad_(true),
                            at::rand({1, 1}, f64));
      },
      {"structured_rotation", "'basis'", "requires_grad"});
  expect_torch_error([&] { nd_rope_axis_split_frequencies(0, 8); },
                     {"nd_rope_axis_split_frequencies", "'num_axes'"});
}

// ---- nn modules against the ops they stand for --------------------------------------------------

namespace pn = phasor::nn;

pn::RotationEncodingOptions rotation_options(std::int64_t H, std::int64_t K, bool per_head,
                                             RotaryLayout layout, double init_std = 0.3) {
  return pn::RotationEncodingOptions(H, K)
      .per_head(per_head)
      .rotary_layout(layout)
      .init_std(init_std)
      .learnable_omega(true);
}

// Positions offset, offset + 1, … as [B, T, 1].
at::Tensor token_positions(std::int64_t B, std::int64_t T, std::int64_t offset) {
  return (at::arange(T, f64) + static_cast<double>(offset)).reshape({1, T, 1}).expand({B, T, 1});
}

TEST(RotationModules, EqualTheOpsTheyStandFor) {
  torch::manual_seed(8);
  const std::int64_t B = 2, T = 5, H = 2, K = 8, offset = 3;
  for (const bool per_head : {false, true})
    for (const RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
      const auto o = rotation_options(H, K, per_head, layout);
      const at::Tensor q = at::randn({B, T, H, K}, f64), k = at::randn({B, T, H, K}, f64);
      const at::Tensor pos = token_positions(B, T, offset);
      {
        pn::CayleyStringEncoding m(o);
        m->to(at::kDouble);
        const pn::RotatedQK r = m->forward(q, k, offset);
        // RoPE(θ) · P · q exactly as cayley_string computes it.
        EXPECT_CLOSE(apply_rotary(r.q, r.theta, layout),
                     cayley_string(q, pos, m->omega, m->generator, layout), 1e-13, "cayley");
      }
      {
        pn::CirculantStringEncoding m(o);
        m->to(at::kDouble);
        const pn::RotatedQK r = m->forward(q, k, offset);
        // Q · RoPE(θ) · Qᵀ q = exp(t (C − Cᵀ)) q: the Fourier map undone after the RoPE step.
        const at::Tensor y = apply_rotary(r.q, r.theta, layout).matmul(m->fourier);
        EXPECT_CLOSE(y, circulant_string(q, pos, m->c), 1e-12, "circulant");
        EXPECT_CLOSE(m->fourier.matmul(m->fourier.t()), at::eye(K, f64), 1e-14, "Q orthogonal");
      }
      {
        pn::GrapeEncoding m(o);
        m->to(at::kDouble);
        const pn::RotatedQK r = m->forward(q, k, offset);
        // B · RoPE(θ) · Bᵀ q as grape_subspace computes it.
        const at::Tensor basis = m->basis();
        const at::Tensor y = apply_rotary(r.q, r.theta, layout);
        const at::Tensor by = per_head ? at::einsum("bthj,hkj->bthk", {y, basis})
                                       : at::einsum("bthj,kj->bthk", {y, basis});
        EXPECT_CLOSE(by, grape_subspace(q, basis, r.theta, layout), 1e-12, "grape");
      }
    }
}

TEST(RotationModules, StartAtRoPE) {
  torch::manual_seed(9);
  const std::int64_t B = 1, T = 6, H = 2, K = 8;
  const at::Tensor q = at::randn({B, T, H, K}, f64);
  const at::Tensor rope = apply_rotary(q, rope_angles(B, T, K, 500.0, 2, {}, at::kDouble));
  for (const bool per_head : {false, true}) {
    auto o = rotation_options(H, K, per_head, RotaryLayout::half_split, 0.0).rope_theta(500.0);
    pn::CayleyStringEncoding cay(o);
    pn::GrapeEncoding gr(o);
    cay->to(at::kDouble), gr->to(at::kDouble);
    for (const pn::RotatedQK& r : {cay->forward(q, q, 2), gr->forward(q, q, 2)})
      // (ω is stored in the module's dtype, float32 at construction: RoPE up to that rounding.)
      EXPECT_CLOSE(apply_rotary(r.q, r.theta), rope, 1e-6, "S = 0 is RoPE");
    // Circulant: RoPE's first K/2 − 1 frequencies on the Fourier bins, the fixed pair at 0.
    pn::CirculantStringEncoding circ(o);
    circ->to(at::kDouble);
    const at::Tensor mu = circ->frequencies().reshape({-1, K / 2});
    for (std::int64_t i = 0; i < K / 2; ++i)
      EXPECT_NEAR(mu[0][i].item<double>(), i + 1 < K / 2 ? std::pow(500.0, -2.0 * i / K) : 0.0,
                  1e-6);
  }
}

// ---- layers -------------------------------------------------------------------------------------

struct AnyLayer {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&, pn::LayerCache*)> forward;
};

// hidden 16 (FoX: 4 query heads on 2 key heads), K = 8 everywhere, chunk/block size 4.
AnyLayer make_layer(const std::string& kind, pn::PosEncoding pe, bool fused = true,
                    bool per_head = true) {
  const auto ro =
      pn::RotationEncodingOptions().per_head(per_head).init_std(0.3).learnable_omega(true);
  if (kind == "gla") {
    pn::GatedLinearAttention l(pn::GatedLinearAttentionOptions(16, 2)
                                   .expand_k(1.0)
                                   .chunk_size(4)
                                   .pos_encoding(pe)
                                   .rotation(ro)
                                   .fused_rotation(fused));
    return {l.ptr(),
            [p = l.ptr()](const at::Tensor& x, pn::LayerCache* c) { return p->forward(x, c); }};
  }
  if (kind == "gdn") {
    pn::GatedDeltaNet l(pn::GatedDeltaNetOptions(16, 2, 8)
                            .chunk_size(4)
                            .use_short_conv(false)
                            .pos_encoding(pe)
                            .rotation(ro)
                            .fused_rotation(fused));
    return {l.ptr(),
            [p = l.ptr()](const at::Tensor& x, pn::LayerCache* c) { return p->forward(x, c); }};
  }
  pn::ForgettingAttention l(pn::ForgettingAttentionOptions(32, 4)
                                .num_kv_heads(2)
                                .block_size(4)
                                .pos_encoding(pe)
                                .rotation(ro)
                                .fused_rotation(fused));
  return {l.ptr(),
          [p = l.ptr()](const at::Tensor& x, pn::LayerCache* c) { return p->forward(x, c); }};
}

std::int64_t hidden_of(const std::string& kind) {
  return kind == "fox" ? 32 : 16;
}

const pn::PosEncoding kRotations[] = {pn::PosEncoding::string_cayley,
                                      pn::PosEncoding::string_circulant, pn::PosEncoding::grape};
const char* kLayers[] = {"gla", "gdn", "fox"};

std::string name_of(pn::PosEncoding pe) {
  return pe == pn::PosEncoding::string_cayley      ? "string_cayley"
         : pe == pn::PosEncoding::string_circulant ? "string_circulant"
         : pe == pn::PosEncoding::grape            ? "grape"
                                                   : "rope";
}

// The encoding's parameters: generator / c / weight, and omega when learnable.
std::vector<at::Tensor> encoding_parameters(torch::nn::Module& layer, pn::PosEncoding pe) {
  std::vector<at::Tensor> out;
  for (const auto& p : layer.named_parameters())
    if (p.key().rfind(name_of(pe) + ".", 0) == 0) out.push_back(p.value());
  return out;
}

TEST(RotationLayers, DecodingEqualsTheParallelForwardAndGradientsReachTheEncoding) {
  for (const char* kind : kLayers)
    for (const pn::PosEncoding pe : kRotations) {
      const std::string what = std::string(kind) + " " + name_of(pe);
      torch::manual_seed(10);
      AnyLayer layer = make_layer(kind, pe);
      layer.module->to(at::kDouble);
      const at::Tensor x = at::randn({2, 7, hidden_of(kind)}, f64);
      const at::Tensor y = layer.forward(x, nullptr);
      // Prefill 3 tokens, then one token at a time: rows of the parallel forward.
      {
        at::NoGradGuard no_grad;
        pn::LayerCache cache;
        std::vector<at::Tensor> parts = {layer.forward(x.narrow(1, 0, 3), &cache)};
        for (std::int64_t t = 3; t < 7; ++t)
          parts.push_back(layer.forward(x.narrow(1, t, 1), &cache));
        EXPECT_CLOSE(at::cat(parts, 1), y, 1e-10, what + " decoding");
        EXPECT_EQ(cache.offset, 7) << what;
      }
      // Gradients reach every parameter of the encoding (generator and learnable ω).
      (y * y).sum().backward();
      const auto params = encoding_parameters(*layer.module, pe);
      ASSERT_EQ(params.size(), pe == pn::PosEncoding::string_circulant ? 1u : 2u) << what;
      for (const auto& p : params) {
        ASSERT_TRUE(p.grad().defined()) << what;
        EXPECT_GT(p.grad().abs().max().item<double>(), 0.0) << what;
        EXPECT_TRUE(at::isfinite(p.grad()).all().item<bool>()) << what;
      }
    }
}

TEST(RotationLayers, OutputsDependOnlyOnPositionDifferences) {
  // The relative law through the whole layer: starting the positions at 11 instead of 0 (a cache
  // whose offset says 11 tokens came before, with an empty state) must not change the outputs.
  // For GLA this needs the per-pair (tied) decays, which commute with RoPE(θ) · M; with RoPE
  // RoPE is the control; the module-level check below shows the encodings are not the identity.
  for (const char* kind : kLayers)
    for (const pn::PosEncoding pe : {pn::PosEncoding::rope, pn::PosEncoding::string_cayley,
                                     pn::PosEncoding::string_circulant, pn::PosEncoding::grape}) {
      const std::string what = std::string(kind) + " " + name_of(pe);
      torch::manual_seed(11);
      AnyLayer layer = make_layer(kind, pe);
      layer.module->to(at::kDouble);
      at::NoGradGuard no_grad;
      const at::Tensor x = at::randn({1, 6, hidden_of(kind)}, f64);
      const at::Tensor y0 = layer.forward(x, nullptr);
      pn::LayerCache shifted;
      shifted.offset = 11;
      const at::Tensor y11 = layer.forward(x, &shifted);  // once: the call advances the cache
      EXPECT_CLOSE(y11, y0, 1e-10, what);
    }
  // And on raw logits of the modules: ⟨R(t) q_t, R(s) k_s⟩ over all (t, s) is the same matrix for
  // positions starting at 0 and at 1000.
  torch::manual_seed(12);
  const auto o = rotation_options(2, 8, true, RotaryLayout::half_split, 0.5);
  const at::Tensor q = at::randn({1, 5, 2, 8}, f64), k = at::randn({1, 5, 2, 8}, f64);
  pn::CayleyStringEncoding cay(o);
  pn::CirculantStringEncoding circ(o);
  pn::GrapeEncoding gr(o);
  cay->to(at::kDouble), circ->to(at::kDouble), gr->to(at::kDouble);
  auto logits = [&](const pn::RotatedQK& r) {
    const at::Tensor rq = apply_rotary(r.q, r.theta), rk = apply_rotary(r.k, r.theta);
    return at::einsum("bthk,bshk->bhts", {rq, rk});
  };
  for (int i = 0; i < 3; ++i) {
    auto fwd = [&](std::int64_t off) {
      return i == 0   ? cay->forward(q, k, off)
             : i == 1 ? circ->forward(q, k, off)
                      : gr->forward(q, k, off);
    };
    const at::Tensor l0 = logits(fwd(0)), l1 = logits(fwd(1000));
    EXPECT_CLOSE(l1, l0, 1e-11, "relative logits " + std::to_string(i));
    // Not vacuous: the logits do depend on the position difference (they differ from plain
    // unrotated dot products).
    EXPECT_GT((l0 - at::einsum("bthk,bshk->bhts", {q, k})).abs().max().item<double>(), 1e-3);
  }
}

TEST(RotationLayers, UnfusedRotationFloat32AndSharedParameters) {
  for (const char* kind : kLayers)
    for (const pn::PosEncoding pe : kRotations) {
      const std::string what = std::string(kind) + " " + name_of(pe);
      torch::manual_seed(13);
      AnyLayer fused = make_layer(kind, pe, true);
      torch::manual_seed(13);
      AnyLayer unfused = make_layer(kind, pe, false);
      torch::manual_seed(13);
      AnyLayer single = make_layer(kind, pe, true);  // float32
      fused.module->to(at::kDouble), unfused.module->to(at::kDouble);
      at::NoGradGuard no_grad;
      const at::Tensor x = at::randn({2, 5, hidden_of(kind)}, f64);
      const at::Tensor y = fused.forward(x, nullptr);
      EXPECT_CLOSE(unfused.forward(x, nullptr), y, 1e-12, what + " unfused");
      const at::Tensor y32 = single.forward(x.to(at::kFloat), nullptr);
      EXPECT_EQ(y32.scalar_type(), at::kFloat);
      EXPECT_CLOSE(y32, y, 2e-4, what + " float32");
      // Parameters shared by the heads: [K, K] / [1, K] instead of per head.
      AnyLayer shared = make_layer(kind, pe, true, /*per_head=*/false);
      const auto params = encoding_parameters(*shared.module, pe);
      ASSERT_FALSE(params.empty());
      EXPECT_EQ(params[0].dim(), 2) << what;
      EXPECT_TRUE(at::isfinite(shared.forward(x.to(at::kFloat), nullptr)).all().item<bool>());
    }
}

TEST(RotationLayers, BadOptionsAreClearErrors) {
  // Odd K: no rotation pairs.
  expect_torch_error(
      [] {
        pn::GatedDeltaNet(
            pn::GatedDeltaNetOptions(16, 2, 5).pos_encoding(pn::PosEncoding::string_cayley));
      },
      {"GatedDeltaNet", "'pos_encoding'", "even"});
  expect_torch_error(
      [] {
        pn::GatedLinearAttention(pn::GatedLinearAttentionOptions(16, 2)
                                     .pos_encoding(pn::PosEncoding::grape)
                                     .rope_theta(0.5));
      },
      {"GatedLinearAttention", "'rope_theta'", "0.5"});
  expect_torch_error(
      [] {
        pn::ForgettingAttention(pn::ForgettingAttentionOptions(16, 2)
                                    .pos_encoding(pn::PosEncoding::string_circulant)
                                    .rotation(pn::RotationEncodingOptions().init_std(-1)));
      },
      {"CirculantStringEncoding", "'init_std'", "-1"});
  expect_torch_error([] { pn::GrapeEncoding(pn::RotationEncodingOptions(2, 7)); },
                     {"GrapeEncoding", "'head_dim'", "7"});
  pn::CayleyStringEncoding m(pn::RotationEncodingOptions(2, 8));
  expect_torch_error(
      [&] {
        m->forward(at::randn({1, 3, 2, 8}), at::randn({1, 3, 3, 8}), 0);
      },
      {"CayleyStringEncoding", "'k'", "[B, T, H=2, K=8]"});
  expect_torch_error(
      [&] {
        m->forward(at::randn({1, 3, 2, 8}, f64), at::randn({1, 3, 2, 8}, f64), 0);
      },
      {"CayleyStringEncoding", "'q'", "dtype"});
}

// ---- task harness -------------------------------------------------------------------------------

namespace pt = phasor::tasks;

template <class F>
void expect_phasor_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << *parts.begin();
  } catch (const phasor::Error& e) {
    const std::string msg = e.what();
    for (const char* part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

pt::ModelConfig tiny(const std::string& mixer, const std::string& pos) {
  pt::ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.mixer = mixer;
  c.pos_encoding = pos;
  c.dtype = "float64";
  if (mixer == "gla") c.mixer_options = {{"chunk_size", 4}};
  if (mixer == "gated_deltanet") c.mixer_options = {{"chunk_size", 4}, {"head_dim", 8}};
  if (mixer == "fox" || mixer == "attention") c.mixer_options = {{"block_size", 4}};
  return c;
}

TEST(RotationHarness, RegistryOptionsAndCausality) {
  const auto names = pt::position_encoding_names();
  for (const char* pos : {"string_cayley", "string_circulant", "grape"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), pos), names.end()) << pos;
    for (const char* mixer : {"gla", "gated_deltanet", "fox"}) {
      const std::string what = std::string(mixer) + " " + pos;
      pt::ModelConfig c = tiny(mixer, pos);
      c.pos_options = {{"init_std", 0.2}, {"per_head", false}, {"rope_theta", 100.0}};
      torch::manual_seed(3);
      pt::LanguageModel model(c);
      // The encoding is the mixer's submodule, with the options given.
      std::int64_t found = 0;
      for (const auto& p : model->named_parameters())
        found += p.key().find(std::string("mixer.") + pos + ".") != std::string::npos;
      EXPECT_EQ(found, c.num_layers) << what;  // one parameter per layer (ω is a buffer)
      // Causal: logits before t do not see tokens from t on.
      const at::Tensor a = torch::randint(0, 16, {2, 9}, at::kLong);
      at::Tensor b = a.clone();
      b.select(1, 6).copy_((a.select(1, 6) + 1) % 16);
      const at::Tensor la = model->forward(a), lb = model->forward(b);
      EXPECT_TRUE(torch::equal(la.narrow(1, 0, 6), lb.narrow(1, 0, 6))) << what;
      EXPECT_GT((la.narrow(1, 6, 3) - lb.narrow(1, 6, 3)).abs().max().item<double>(), 1e-6) << what;
    }
  }
  // Options are checked: unknown keys (ω of Circulant-STRING is not separate), types, values.
  pt::ModelConfig c = tiny("gla", "string_circulant");
  c.pos_options = {{"learnable_omega", true}};
  expect_phasor_error([&] { pt::LanguageModel m(c); },
                      {"pos_encoding 'string_circulant'", "'learnable_omega'", "unknown key"});
  c = tiny("gla", "grape");
  c.pos_options = {{"per_head", 1}};
  expect_phasor_error([&] { pt::LanguageModel m(c); },
                      {"pos_encoding 'grape'", "'per_head'", "a boolean"});
  c = tiny("fox", "string_cayley");
  c.pos_options = {{"init_std", -0.5}};
  expect_phasor_error([&] { pt::LanguageModel m(c); },
                      {"mixer 'fox'", "CayleyStringEncoding", "'init_std'"});
  // Round trip through JSON keeps the encoding and its options.
  c = tiny("gla", "grape");
  c.pos_options = {{"learnable_omega", true}};
  const pt::ModelConfig back = nlohmann::json(c).get<pt::ModelConfig>();
  EXPECT_EQ(back.pos_encoding, "grape");
  EXPECT_EQ(back.pos_options, c.pos_options);
}

TEST(RotationHarness, TinyRunsReduceTheLoss) {
  // MQAR (V = 32, L = 16, 2 pairs), one GLA or FoX layer, 40 steps: the loss must fall clearly
  // below where it started for every new encoding.
  pt::MqarConfig mq;
  mq.seq_len = 16;
  mq.num_kv_pairs = 2;
  mq.vocab_size = 32;
  int i = 0;
  for (const char* pos : {"string_cayley", "string_circulant", "grape"}) {
    const char* mixer = i++ % 2 == 0 ? "gla" : "fox";
    pt::ModelConfig mc = tiny(mixer, pos);
    mc.vocab_size = 32;
    mc.hidden_size = 32;
    mc.num_layers = 1;
    mc.dtype = "float32";
    if (std::string(pos) != "string_circulant") mc.pos_options = {{"learnable_omega", true}};
    pt::TrainConfig tc;
    tc.steps = 40;
    tc.batch_size = 16;
    tc.lr = 3e-3;
    tc.eval_every = 0;
    tc.log_every = 0;
    tc.seed = 5;
    torch::manual_seed(5);
    pt::LanguageModel model(mc);
    const pt::Batch held_out = pt::mqar(mq, 64, pt::batch_seed(5, -1));
    const double before = pt::evaluate(model, held_out).loss;
    const pt::TrainResult r =
        pt::train(model, tc,
                  pt::make_batch_stream(
                      [mq](std::int64_t n, std::uint64_t s) { return pt::mqar(mq, n, s); }, 16, 5));
    const double after = pt::evaluate(model, held_out).loss;
    EXPECT_FALSE(r.diverged) << pos;
    EXPECT_LT(after, before - 0.4) << mixer << " " << pos << ": " << before << " → " << after;
  }
}

}  // namespace
}  // namespace phasor
