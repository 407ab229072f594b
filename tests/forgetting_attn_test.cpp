// Tests of forgetting attention (include/phasor/forgetting_attn.h): the float64 reference against
// a brute-force evaluation of the definition and against finite differences; the chunk (tiled)
// and recurrent (decode) kernels, forward and backward, float32 and float64, against the
// reference on random and adversarial inputs; a 65,536-token sequence; ForgettingAttnCache step
// by step; thread-count invariance; argument validation. The rotation by θ fused into the kernels
// (RoPE / Selective RoPE): against rotating q and k explicitly with apply_rotary, dθ against
// finite differences, invariance under θ + c, standard RoPE logits depending only on m − n,
// decoding with θ, and its errors. The additive GRAPE slopes (ALiBi, GRAPE-A-QK): every
// implementation against the reference on the adversarial cases with slopes, da and db against
// finite differences, ALiBi ≡ FoX with a constant log gate, zero slopes ≡ no slopes (bit for bit),
// the relative law (a sequence shifted to later positions gives the same outputs), decoding with
// slopes, and the errors.
#include "common/eigen.h"  // first: see there (the probabilities test inlines Eigen's exp)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "forgetting_attn/probabilities.h"
#include "phasor/forgetting_attn.h"
#include "phasor/rotary.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/layout.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Gates {
  realistic,  // log σ(x), x ~ N(2, 1): mostly ≈ −0.1
  strong,     // ≈ −20 per token
  zeros,      // realistic with 20% gates of exactly 0 (g = −inf), the first one always
  weak,       // ≈ −1e-4: nearly plain causal attention
  mixed,      // each token one of the above
};

Tensor make_gates(Gates kind, const std::vector<std::int64_t>& shape, std::mt19937_64& rng) {
  Tensor g = testing::log_sigmoid_gates(shape, rng, 2.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    Gates token_kind = kind;
    if (kind == Gates::mixed) token_kind = static_cast<Gates>(static_cast<int>(4 * unit(rng)));
    switch (token_kind) {
      case Gates::realistic:
      case Gates::mixed:
        break;
      case Gates::strong:
        g.set(i, -20.0 - unit(rng));
        break;
      case Gates::zeros:
        if (i == 0 || unit(rng) < 0.2) g.set(i, -kInf);
        break;
      case Gates::weak:
        g.set(i, -1e-4 * unit(rng));
        break;
    }
  }
  return g;
}

// An input or output tensor, either contiguous or laid out as a non-contiguous view: dims 1 and
// 2 swapped in memory and the last dimension padded.
using Arg = testing::StridedTensor;

testing::MemoryLayout memory_layout(int rank, bool strided) {
  return strided ? testing::MemoryLayout::swap_1_2(rank, 1) : testing::MemoryLayout::contiguous();
}

// The values of t (in its dtype) in the problem's layout; undefined stays undefined.
Arg arg(const Tensor& t, bool strided) {
  return Arg(t, t.dtype(), memory_layout(t.rank(), strided));
}

struct Problem {
  Tensor q, k, v, g, d_o;
  Tensor theta;  // [B, T, H, K/2] rotation angles; undefined: none
  RotaryLayout layout = RotaryLayout::half_split;
  Tensor cu;  // undefined: none
  // Additive GRAPE slopes a [B, T, HQ] and b [B, T, H]; undefined: none.
  Tensor slope_q, slope_k;
  std::optional<std::int64_t> window;
  std::optional<double> scale;
  std::int64_t block_size = 64;
  bool strided = false;

  std::int64_t B() const { return q.shape()[0]; }
  std::int64_t T() const { return q.shape()[1]; }
  std::int64_t HQ() const { return q.shape()[2]; }
  std::int64_t H() const { return k.shape()[2]; }
  std::int64_t K() const { return q.shape()[3]; }
  std::int64_t V() const { return v.shape()[3]; }

  Problem to(DType dtype) const {
    Problem p = *this;
    p.q = q.to(dtype);
    p.k = k.to(dtype);
    p.v = v.to(dtype);
    p.g = g.to(dtype);
    p.d_o = d_o.to(dtype);
    if (theta.defined()) p.theta = theta.to(dtype);
    if (slope_q.defined()) p.slope_q = slope_q.to(dtype);
    if (slope_k.defined()) p.slope_k = slope_k.to(dtype);
    return p;
  }
};

struct Shape {
  std::int64_t B, T, HQ, H, K, V;
};

Problem make_problem(const Shape& s, Gates gates, std::mt19937_64& rng, double logit_gain = 1.0) {
  Problem p;
  p.q = testing::randn({s.B, s.T, s.HQ, s.K}, rng, logit_gain);
  p.k = testing::randn({s.B, s.T, s.H, s.K}, rng);
  p.v = testing::randn({s.B, s.T, s.H, s.V}, rng);
  p.g = make_gates(gates, {s.B, s.T, s.HQ}, rng);
  p.d_o = testing::randn({s.B, s.T, s.HQ, s.V}, rng);
  return p;
}

// Views of the problem's inputs (kept alive by the Args).
struct Inputs {
  Arg q, k, v, g, d_o, theta, slope_q, slope_k;
  ForgettingAttnParams params;
  explicit Inputs(const Problem& p)
      : q(arg(p.q, p.strided)),
        k(arg(p.k, p.strided)),
        v(arg(p.v, p.strided)),
        g(arg(p.g, p.strided)),
        d_o(arg(p.d_o, p.strided)),
        theta(arg(p.theta, p.strided)),
        slope_q(arg(p.slope_q, p.strided)),
        slope_k(arg(p.slope_k, p.strided)) {
    params.theta = theta.view();
    params.bias_q_slope = slope_q.view();
    params.bias_k_slope = slope_k.view();
    params.rotary_layout = p.layout;
    params.q = q.view();
    params.k = k.view();
    params.v = v.view();
    params.g = g.view();
    params.cu_seqlens = p.cu.view();
    params.scale = p.scale;
    params.window_size = p.window;
    params.block_size = p.block_size;
  }
};

// Every element must be overwritten.
Arg nan_output(const std::vector<std::int64_t>& shape, DType dtype, bool strided) {
  return Arg::nans(shape, dtype, memory_layout(static_cast<int>(shape.size()), strided));
}

// The reference writes float64 outputs (no rounding of the trusted values); the kernels write
// outputs of the input's dtype.
DType output_dtype(const Problem& p, Impl impl) {
  return impl == Impl::reference ? DType::float64 : p.q.dtype();
}

struct Forward {
  Tensor o, lse;
};

Forward run_forward(const Problem& p, Impl impl) {
  Inputs in(p);
  const DType dt = output_dtype(p, impl);
  Arg o = nan_output({p.B(), p.T(), p.HQ(), p.V()}, dt, p.strided);
  Arg lse = nan_output({p.B(), p.T(), p.HQ()}, dt, p.strided);
  forgetting_attn_forward(in.params, impl, o.view(), lse.view());
  return {o.gather(), lse.gather()};
}

struct Grads {
  Tensor dq, dk, dv, dg, dtheta;  // dtheta: only with θ
  Tensor dslope_q, dslope_k;      // only with the slopes
};

ForgettingAttnGrads make_grads(TensorView dq, TensorView dk, TensorView dv, TensorView dg,
                               TensorView dtheta = {}) {
  ForgettingAttnGrads grads;
  grads.dq = dq;
  grads.dk = dk;
  grads.dv = dv;
  grads.dg = dg;
  grads.dtheta = dtheta;
  return grads;
}

// saved: the forward outputs to pass to the backward (null: the backward recomputes them).
Grads run_backward(const Problem& p, Impl impl, const Forward* saved) {
  Inputs in(p);
  const DType dt = output_dtype(p, impl);
  Arg dq = nan_output(p.q.shape(), dt, p.strided), dk = nan_output(p.k.shape(), dt, p.strided),
      dv = nan_output(p.v.shape(), dt, p.strided), dg = nan_output(p.g.shape(), dt, p.strided);
  Arg dtheta, dslope_q, dslope_k;
  if (p.theta.defined()) dtheta = nan_output(p.theta.shape(), dt, p.strided);
  if (p.slope_q.defined()) dslope_q = nan_output(p.slope_q.shape(), dt, p.strided);
  if (p.slope_k.defined()) dslope_k = nan_output(p.slope_k.shape(), dt, p.strided);
  Arg o, lse;
  if (saved) {
    o = arg(saved->o, p.strided);
    lse = arg(saved->lse, p.strided);
  }
  ForgettingAttnGrads grads = make_grads(dq.view(), dk.view(), dv.view(), dg.view(), dtheta.view());
  grads.dbias_q_slope = dslope_q.view();
  grads.dbias_k_slope = dslope_k.view();
  forgetting_attn_backward(in.params, impl, in.d_o.view(), saved ? o.view() : TensorView{},
                           saved ? lse.view() : TensorView{}, grads);
  return {dq.gather(),
          dk.gather(),
          dv.gather(),
          dg.gather(),
          p.theta.defined() ? dtheta.gather() : Tensor(),
          p.slope_q.defined() ? dslope_q.gather() : Tensor(),
          p.slope_k.defined() ? dslope_k.gather() : Tensor()};
}

// ---- the reference against the definition -----------------------------------------------------

// o, lse and the gradients of Σ d_o ⊙ o straight from the definition, in long double (x87
// extended precision on x86-64), with the gate sum Σ_{s ∈ (j, i]} g_s added up for every pair
// separately and dg_s = Σ_{(i, j): j < s ≤ i} dℓ_ij likewise (O(T³); independent of the
// reference's running sums).
struct BruteForce {
  Forward forward;
  Grads grads;
};

BruteForce brute_force(const Problem& p) {
  using Real = long double;
  const std::int64_t B = p.B(), T = p.T(), HQ = p.HQ(), H = p.H(), K = p.K(), V = p.V();
  BruteForce out{
      {Tensor::zeros({B, T, HQ, V}), Tensor::zeros({B, T, HQ})},
      {Tensor::zeros(p.q.shape()), Tensor::zeros(p.k.shape()), Tensor::zeros(p.v.shape()),
       Tensor::zeros(p.g.shape()), Tensor(), Tensor(), Tensor()}};
  const Real scale = p.scale.value_or(1.0 / std::sqrt(static_cast<double>(K)));
  auto idx4 = [](const Tensor& x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t c) {
    const auto& s = x.shape();
    return ((b * s[1] + t) * s[2] + h) * s[3] + c;
  };
  auto add = [](Tensor& x, std::int64_t i, Real v) { x.set(i, x.at(i) + static_cast<double>(v)); };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t hq = 0; hq < HQ; ++hq) {
      const std::int64_t h = hq / (HQ / H);
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<Real> logits(static_cast<std::size_t>(i + 1), -kInf);
        for (std::int64_t j = 0; j <= i; ++j) {
          if (p.window && i - j >= *p.window) continue;
          Real gate_sum = 0, qk = 0;
          for (std::int64_t s = j + 1; s <= i; ++s) gate_sum += p.g.at((b * T + s) * HQ + hq);
          for (std::int64_t c = 0; c < K; ++c)
            qk += static_cast<Real>(p.q.at(idx4(p.q, b, i, hq, c))) * p.k.at(idx4(p.k, b, j, h, c));
          logits[static_cast<std::size_t>(j)] = scale * qk + gate_sum;
        }
        const Real max_logit = *std::max_element(logits.begin(), logits.end());
        Real normaliser = 0;
        for (Real l : logits) normaliser += std::exp(l - max_logit);
        std::vector<Real> prob(logits.size()), dprob(logits.size());
        for (std::size_t j = 0; j < logits.size(); ++j)
          prob[j] = std::exp(logits[j] - max_logit) / normaliser;
        out.forward.lse.set((b * T + i) * HQ + hq,
                            static_cast<double>(max_logit + std::log(normaliser)));
        Real weighted = 0;  // Σ_j P_ij dP_ij
        for (std::int64_t j = 0; j <= i; ++j) {
          Real d = 0;
          for (std::int64_t c = 0; c < V; ++c)
            d += static_cast<Real>(p.d_o.at(idx4(p.d_o, b, i, hq, c))) *
                 p.v.at(idx4(p.v, b, j, h, c));
          dprob[static_cast<std::size_t>(j)] = d;
          weighted += prob[static_cast<std::size_t>(j)] * d;
        }
        for (std::int64_t c = 0; c < V; ++c) {
          Real sum = 0;
          for (std::int64_t j = 0; j <= i; ++j)
            sum += prob[static_cast<std::size_t>(j)] * p.v.at(idx4(p.v, b, j, h, c));
          out.forward.o.set(idx4(out.forward.o, b, i, hq, c), static_cast<double>(sum));
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const Real pj = prob[static_cast<std::size_t>(j)];
          const Real dlogit = pj * (dprob[static_cast<std::size_t>(j)] - weighted);
          for (std::int64_t c = 0; c < K; ++c) {
            add(out.grads.dq, idx4(p.q, b, i, hq, c),
                scale * dlogit * p.k.at(idx4(p.k, b, j, h, c)));
            add(out.grads.dk, idx4(p.k, b, j, h, c),
                scale * dlogit * p.q.at(idx4(p.q, b, i, hq, c)));
          }
          for (std::int64_t c = 0; c < V; ++c)
            add(out.grads.dv, idx4(p.v, b, j, h, c), pj * p.d_o.at(idx4(p.d_o, b, i, hq, c)));
          for (std::int64_t s = j + 1; s <= i; ++s)
            add(out.grads.dg, (b * T + s) * HQ + hq, dlogit);
        }
      }
    }
  return out;
}

TEST(ForgettingAttnReference, MatchesTheDefinition) {
  std::mt19937_64 rng(1);
  struct Setting {
    Gates gates;
    std::optional<std::int64_t> window;
  };
  for (const Setting& s : {Setting{Gates::realistic, std::nullopt}, Setting{Gates::mixed, 3},
                           Setting{Gates::zeros, std::nullopt}, Setting{Gates::zeros, 2},
                           Setting{Gates::realistic, 1}}) {
    Problem p = make_problem({2, 11, 4, 2, 3, 5}, s.gates, rng);
    p.window = s.window;
    p.scale = 0.7;
    const BruteForce expected = brute_force(p);
    const Forward got = run_forward(p, Impl::reference);
    PHASOR_EXPECT_CLOSE(got.o, expected.forward.o, 1e-13, "o");
    PHASOR_EXPECT_CLOSE(got.lse, expected.forward.lse, 1e-13, "lse");
    const Grads grads = run_backward(p, Impl::reference, nullptr);
    PHASOR_EXPECT_CLOSE(grads.dq, expected.grads.dq, 1e-12, "dq");
    PHASOR_EXPECT_CLOSE(grads.dk, expected.grads.dk, 1e-12, "dk");
    PHASOR_EXPECT_CLOSE(grads.dv, expected.grads.dv, 1e-12, "dv");
    PHASOR_EXPECT_CLOSE(grads.dg, expected.grads.dg, 1e-12, "dg");
  }
}

// A gate of exactly 0 at position s cuts every query at or after s off from the keys before s.
TEST(ForgettingAttnReference, ZeroGateCutsThePast) {
  std::mt19937_64 rng(2);
  Problem p = make_problem({1, 8, 1, 1, 4, 3}, Gates::realistic, rng);
  p.g.set(5, -kInf);
  const Forward all = run_forward(p, Impl::reference);
  Problem tail = p;  // tokens 5.. as a sequence of their own
  tail.q = Tensor({1, 3, 1, 4}, DType::float64);
  tail.k = Tensor({1, 3, 1, 4}, DType::float64);
  tail.v = Tensor({1, 3, 1, 3}, DType::float64);
  tail.g = Tensor({1, 3, 1}, DType::float64);
  for (std::int64_t i = 0; i < 12; ++i) tail.q.set(i, p.q.at(20 + i));
  for (std::int64_t i = 0; i < 12; ++i) tail.k.set(i, p.k.at(20 + i));
  for (std::int64_t i = 0; i < 9; ++i) tail.v.set(i, p.v.at(15 + i));
  for (std::int64_t i = 0; i < 3; ++i) tail.g.set(i, p.g.at(5 + i));
  const Forward cut = run_forward(tail, Impl::reference);
  for (std::int64_t i = 0; i < 9; ++i) EXPECT_DOUBLE_EQ(all.o.at(15 + i), cut.o.at(i));
}

// ---- reference gradients against central finite differences ------------------------------------

// Σ d_o ⊙ o of an implementation (the reference unless told).
double loss(const Problem& p, Impl impl = Impl::reference) {
  return testing::dot(run_forward(p, impl).o, p.d_o);
}

// d loss / d (p.*input) by central differences (a gate of −inf, log 0, gets 0: x ± h is x there).
Tensor finite_differences(Problem p, Tensor Problem::*input, Impl impl = Impl::reference) {
  testing::FiniteDifferenceOptions options;
  options.step = 1e-5;
  options.zero_at_infinite_inputs = true;
  return testing::numerical_gradient(
      p.*input, [&] { return loss(p, impl); }, options);
}

void expect_gradients_match_finite_differences(const Problem& p) {
  const Grads g = run_backward(p, Impl::reference, nullptr);
  PHASOR_EXPECT_CLOSE(g.dq, finite_differences(p, &Problem::q), 1e-7, "dq");
  PHASOR_EXPECT_CLOSE(g.dk, finite_differences(p, &Problem::k), 1e-7, "dk");
  PHASOR_EXPECT_CLOSE(g.dv, finite_differences(p, &Problem::v), 1e-7, "dv");
  PHASOR_EXPECT_CLOSE(g.dg, finite_differences(p, &Problem::g), 1e-7, "dg");
  if (p.theta.defined())
    PHASOR_EXPECT_CLOSE(g.dtheta, finite_differences(p, &Problem::theta), 1e-7, "dtheta");
  if (p.slope_q.defined())
    PHASOR_EXPECT_CLOSE(g.dslope_q, finite_differences(p, &Problem::slope_q), 1e-7, "dslope_q");
  if (p.slope_k.defined())
    PHASOR_EXPECT_CLOSE(g.dslope_k, finite_differences(p, &Problem::slope_k), 1e-7, "dslope_k");
}

TEST(ForgettingAttnReference, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(3);
  Problem p = make_problem({2, 9, 2, 1, 3, 4}, Gates::realistic, rng);
  expect_gradients_match_finite_differences(p);
}

TEST(ForgettingAttnReference, GradientsMatchFiniteDifferencesWithWindow) {
  std::mt19937_64 rng(4);
  Problem p = make_problem({1, 11, 4, 2, 5, 3}, Gates::realistic, rng);
  p.window = 3;
  expect_gradients_match_finite_differences(p);
}

TEST(ForgettingAttnReference, GradientsMatchFiniteDifferencesWithZeroGatesAndVarlen) {
  std::mt19937_64 rng(5);
  Problem p = make_problem({1, 13, 2, 2, 4, 4}, Gates::zeros, rng);
  p.cu = testing::cu_seqlens({6, 0, 1, 6});
  p.window = 4;
  p.scale = 0.9;
  expect_gradients_match_finite_differences(p);
}

// ---- kernels against the reference -------------------------------------------------------------

struct Case {
  std::string name;
  Shape shape;
  Gates gates;
  std::int64_t block_size = 16;
  std::optional<std::int64_t> window = std::nullopt;
  double logit_gain = 1.0;
  std::vector<std::int64_t> lengths = {};  // packed sequences (B must be 1)
  bool strided = false;
  // Additive GRAPE slopes: none (0), or a = gain·softplus(N(0, 1)) per query head and token and
  // b likewise per key head (a negative gain gives negative slopes).
  double slope_gain = 0;
};

// Failure messages name the case (instead of dumping its bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::vector<Case> adversarial_cases() {
  return {
      {"random", {2, 37, 2, 2, 8, 8}, Gates::realistic},
      {"strong_gates", {2, 29, 2, 1, 8, 5}, Gates::strong, 5},
      {"strong_gates_block64", {1, 70, 1, 1, 8, 8}, Gates::strong, 64},
      {"zero_gates", {1, 40, 4, 2, 6, 6}, Gates::zeros},
      {"weak_gates", {2, 70, 2, 2, 8, 8}, Gates::weak},
      {"large_logits", {2, 33, 2, 2, 8, 8}, Gates::realistic, 16, std::nullopt, 10.0},
      {"large_logits_weak_gates", {1, 45, 2, 1, 8, 8}, Gates::weak, 5, std::nullopt, 10.0},
      {"mixed_block1", {1, 9, 2, 1, 4, 3}, Gates::mixed, 1},
      {"mixed_block5", {1, 23, 2, 1, 4, 3}, Gates::mixed, 5},
      {"mixed_block64", {1, 150, 2, 1, 8, 8}, Gates::mixed, 64},
      {"T1", {3, 1, 2, 2, 4, 4}, Gates::realistic},
      {"K1", {1, 20, 1, 1, 1, 3}, Gates::realistic, 5},
      {"K_ne_V", {1, 25, 2, 2, 3, 11}, Gates::mixed, 5},
      {"grouped_2", {2, 30, 4, 2, 8, 6}, Gates::realistic},
      {"grouped_4", {1, 30, 4, 1, 5, 6}, Gates::zeros, 5},
      {"window_1", {1, 20, 2, 1, 4, 4}, Gates::mixed, 5, 1},
      {"window_3", {2, 45, 2, 2, 6, 5}, Gates::mixed, 16, 3},
      {"window_17", {1, 45, 2, 1, 6, 5}, Gates::weak, 5, 17},
      {"window_17_block16", {1, 64, 4, 2, 6, 5}, Gates::realistic, 16, 17},
      {"window_ge_T", {1, 45, 2, 1, 6, 5}, Gates::realistic, 16, 45},
      {"window_strong_large_logits", {1, 40, 2, 1, 6, 5}, Gates::strong, 5, 7, 10.0},
      {"varlen", {1, 32, 2, 1, 5, 4}, Gates::mixed, 5, std::nullopt, 1.0, {5, 0, 1, 17, 0, 9}},
      {"varlen_window", {1, 32, 4, 2, 5, 4}, Gates::zeros, 4, 3, 1.0, {1, 12, 0, 19}},
      {"strided", {2, 21, 4, 2, 5, 6}, Gates::mixed, 8, 6, 1.0, {}, true},
      {"strided_varlen",
       {1, 26, 2, 2, 5, 6},
       Gates::realistic,
       8,
       std::nullopt,
       1.0,
       {13, 0, 13},
       true},
      // Enough query blocks for the chunk backward's segments (2–4): a dominant key far back
      // (large logits, weak gates) lands in an earlier segment's keys; a window and a group;
      // packed sequences of 1 and 2 segments.
      {"segments_strong_gates", {1, 150, 2, 1, 8, 5}, Gates::strong, 4},
      {"segments_large_logits", {1, 131, 2, 1, 8, 8}, Gates::weak, 4, std::nullopt, 10.0},
      {"segments_window_grouped", {1, 130, 4, 2, 6, 5}, Gates::realistic, 4, 37},
      {"segments_varlen", {1, 160, 2, 1, 5, 4}, Gates::mixed, 4, std::nullopt, 1.0, {70, 0, 1, 89}},
  };
}

// GRAPE-A-QK-like slopes: a = gain·softplus(x), x ~ N(0, 1), [B, T, HQ]; b likewise [B, T, H].
void add_random_slopes(Problem& p, std::mt19937_64& rng, double gain) {
  auto slopes = [&](std::vector<std::int64_t> shape) {
    Tensor x = testing::randn(shape, rng);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, gain * std::log1p(std::exp(x.at(i))));
    return x;
  };
  p.slope_q = slopes({p.B(), p.T(), p.HQ()});
  p.slope_k = slopes({p.B(), p.T(), p.H()});
}

Problem make_case(const Case& c, std::mt19937_64& rng) {
  Problem p = make_problem(c.shape, c.gates, rng, c.logit_gain);
  p.block_size = c.block_size;
  p.window = c.window;
  p.strided = c.strided;
  if (!c.lengths.empty()) p.cu = testing::cu_seqlens(c.lengths);
  if (c.slope_gain != 0) add_random_slopes(p, rng, c.slope_gain);
  return p;
}

void expect_matches_reference(const Case& c, Impl impl, DType dtype) {
  SCOPED_TRACE(c.name + " " + to_string(impl) + " " + to_string(dtype));
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  const Problem p = make_case(c, rng).to(dtype);
  const double tol = dtype == DType::float32 ? 1e-5 : 1e-11;
  // With gates of −20 the plain softmax adjoint of the reference loses ~e^20 × float64 epsilon in
  // dq and dk (P_ii ≈ 1 makes dP_ii − D_i a cancellation); the kernels avoid it and are the more
  // accurate ones here (StrongGatesFloat64GradientsAgainstExtendedPrecision).
  const double dqdk_tol = dtype == DType::float64 && c.gates == Gates::strong ? 1e-7 : tol;
  const Forward expected = run_forward(p, Impl::reference);
  const Grads expected_grads = run_backward(p, Impl::reference, nullptr);
  const Forward got = run_forward(p, impl);
  PHASOR_EXPECT_CLOSE(got.o, expected.o, tol, "o");
  PHASOR_EXPECT_CLOSE(got.lse, expected.lse, tol, "lse");
  // The backward with the forward's outputs, and recomputing them.
  for (const Forward* saved : {&got, static_cast<const Forward*>(nullptr)}) {
    SCOPED_TRACE(saved ? "with saved o, lse" : "recomputing o, lse");
    const Grads g = run_backward(p, impl, saved);
    PHASOR_EXPECT_CLOSE(g.dq, expected_grads.dq, dqdk_tol, "dq");
    PHASOR_EXPECT_CLOSE(g.dk, expected_grads.dk, dqdk_tol, "dk");
    PHASOR_EXPECT_CLOSE(g.dv, expected_grads.dv, tol, "dv");
    PHASOR_EXPECT_CLOSE(g.dg, expected_grads.dg, tol, "dg");
    if (p.slope_q.defined())
      PHASOR_EXPECT_CLOSE(g.dslope_q, expected_grads.dslope_q, tol, "dslope_q");
    if (p.slope_k.defined())
      PHASOR_EXPECT_CLOSE(g.dslope_k, expected_grads.dslope_k, tol, "dslope_k");
  }
}

// Strong gates in float64 against the extended-precision brute force: the kernels' dq, dk (with
// dℓ_ii = −Σ_{j≠i} dℓ_ij) agree with it to ~2e-12 (about the brute force's own accuracy: long
// double epsilon × e^20), the reference's plain adjoint only to ~5e-9.
TEST(ForgettingAttnKernels, StrongGatesFloat64GradientsAgainstExtendedPrecision) {
  std::mt19937_64 rng(13);
  Problem p = make_problem({1, 29, 2, 1, 8, 5}, Gates::strong, rng);
  p.block_size = 5;
  const BruteForce exact = brute_force(p);
  const Grads reference = run_backward(p, Impl::reference, nullptr);
  PHASOR_EXPECT_CLOSE(reference.dq, exact.grads.dq, 1e-7, "reference dq");
  PHASOR_EXPECT_CLOSE(reference.dk, exact.grads.dk, 1e-7, "reference dk");
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    SCOPED_TRACE(to_string(impl));
    const Grads g = run_backward(p, impl, nullptr);
    PHASOR_EXPECT_CLOSE(g.dq, exact.grads.dq, 1e-11, "dq");
    PHASOR_EXPECT_CLOSE(g.dk, exact.grads.dk, 1e-11, "dk");
    PHASOR_EXPECT_CLOSE(g.dv, exact.grads.dv, 1e-12, "dv");
    PHASOR_EXPECT_CLOSE(g.dg, exact.grads.dg, 1e-12, "dg");
  }
  std::printf(
      "strong gates, float64 dq relative RMS vs extended precision: reference %.2e, chunk %.2e\n",
      testing::rel_rms(reference.dq, exact.grads.dq),
      testing::rel_rms(run_backward(p, Impl::chunk, nullptr).dq, exact.grads.dq));
}

// The chunk forward and backward keep each thread's buffers across calls, and release the O(T)
// ones after an item where they exceed 8 MiB: a small call, a large one (T = 140, K = V = 4,096 in
// float64: keys and values 8.75 MiB; short and wide, so that the float64 reference stays quick
// under the sanitizers), the small one again and the large one again, on 1 thread (one item per
// thread) and 2 (the blocks of each item in parallel): each as the reference computes it, and the
// same bits when repeated.
TEST(ForgettingAttnKernels, BuffersKeptAcrossCallsOfChangingSize) {
  std::mt19937_64 rng(29);
  Problem small = make_problem({2, 50, 2, 1, 8, 8}, Gates::realistic, rng);
  Problem large = make_problem({1, 140, 1, 1, 4096, 4096}, Gates::realistic, rng);
  large.block_size = 64;
  const Forward small_ref = run_forward(small, Impl::reference);
  const Forward large_ref = run_forward(large, Impl::reference);
  const Grads small_grads = run_backward(small, Impl::reference, nullptr);
  const Grads large_grads = run_backward(large, Impl::reference, nullptr);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    set_num_threads(threads);
    const Forward s1 = run_forward(small, Impl::chunk), l1 = run_forward(large, Impl::chunk);
    const Forward s2 = run_forward(small, Impl::chunk), l2 = run_forward(large, Impl::chunk);
    PHASOR_EXPECT_CLOSE(s1.o, small_ref.o, 1e-12, "small o");
    PHASOR_EXPECT_CLOSE(s1.lse, small_ref.lse, 1e-12, "small lse");
    PHASOR_EXPECT_CLOSE(l1.o, large_ref.o, 1e-12, "large o");
    PHASOR_EXPECT_CLOSE(l1.lse, large_ref.lse, 1e-12, "large lse");
    EXPECT_TRUE(s2.o.bit_equal(s1.o) && s2.lse.bit_equal(s1.lse));
    EXPECT_TRUE(l2.o.bit_equal(l1.o) && l2.lse.bit_equal(l1.lse));
    // The backward keeps its buffers likewise (k, v, dk, dv: 17.5 MiB for the large item).
    const Grads gs1 = run_backward(small, Impl::chunk, nullptr);
    const Grads gl1 = run_backward(large, Impl::chunk, nullptr);
    const Grads gs2 = run_backward(small, Impl::chunk, nullptr);
    const Grads gl2 = run_backward(large, Impl::chunk, nullptr);
    for (const auto& [got, want, what] :
         {std::tuple{&gs1, &small_grads, "small"}, std::tuple{&gl1, &large_grads, "large"}}) {
      SCOPED_TRACE(what);
      PHASOR_EXPECT_CLOSE(got->dq, want->dq, 1e-11, "dq");
      PHASOR_EXPECT_CLOSE(got->dk, want->dk, 1e-11, "dk");
      PHASOR_EXPECT_CLOSE(got->dv, want->dv, 1e-11, "dv");
      PHASOR_EXPECT_CLOSE(got->dg, want->dg, 1e-11, "dg");
    }
    for (const auto& [again, first] : {std::pair{&gs2, &gs1}, std::pair{&gl2, &gl1}})
      EXPECT_TRUE(again->dq.bit_equal(first->dq) && again->dk.bit_equal(first->dk) &&
                  again->dv.bit_equal(first->dv) && again->dg.bit_equal(first->dg));
  }
  set_num_threads(0);
}

class ForgettingAttnKernels : public ::testing::TestWithParam<Case> {};

TEST_P(ForgettingAttnKernels, ChunkFloat64MatchesReference) {
  expect_matches_reference(GetParam(), Impl::chunk, DType::float64);
}
TEST_P(ForgettingAttnKernels, ChunkFloat32MatchesReference) {
  expect_matches_reference(GetParam(), Impl::chunk, DType::float32);
}
TEST_P(ForgettingAttnKernels, RecurrentFloat64MatchesReference) {
  expect_matches_reference(GetParam(), Impl::recurrent, DType::float64);
}
TEST_P(ForgettingAttnKernels, RecurrentFloat32MatchesReference) {
  expect_matches_reference(GetParam(), Impl::recurrent, DType::float32);
}

INSTANTIATE_TEST_SUITE_P(Adversarial, ForgettingAttnKernels,
                         ::testing::ValuesIn(adversarial_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Only dv requested (no dℓ needed), only dg, and so on: each gradient alone equals its value when
// all are computed, and nothing else is written.
TEST(ForgettingAttnKernels, GradientsRequestedAlone) {
  std::mt19937_64 rng(6);
  Problem p = make_problem({1, 30, 2, 1, 4, 4}, Gates::mixed, rng);
  p.block_size = 8;
  for (Impl impl : {Impl::chunk, Impl::recurrent, Impl::reference}) {
    SCOPED_TRACE(to_string(impl));
    const Grads all = run_backward(p, impl, nullptr);
    Inputs in(p);
    for (int which = 0; which < 4; ++which) {
      Tensor alone[4] = {Tensor(p.q.shape(), DType::float64), Tensor(p.k.shape(), DType::float64),
                         Tensor(p.v.shape(), DType::float64), Tensor(p.g.shape(), DType::float64)};
      alone[which].fill(kNaN);
      ForgettingAttnGrads grads;
      TensorView* slot[4] = {&grads.dq, &grads.dk, &grads.dv, &grads.dg};
      *slot[which] = alone[which].view();
      forgetting_attn_backward(in.params, impl, in.d_o.view(), {}, {}, grads);
      const Tensor* expected[4] = {&all.dq, &all.dk, &all.dv, &all.dg};
      EXPECT_TRUE(alone[which].bit_equal(*expected[which])) << "gradient " << which;
    }
  }
}

// Every floating argument may have its own dtype; the compute type is q's. A float32 q with
// float64 k, v, g, d_o and outputs equals the all-float32 call on the same (rounded) values.
TEST(ForgettingAttnKernels, MixedDtypes) {
  std::mt19937_64 rng(14);
  Problem p = make_problem({1, 21, 4, 2, 5, 3}, Gates::mixed, rng);
  p.block_size = 8;
  p.window = 9;
  const Problem f32 = p.to(DType::float32);
  Problem mixed = f32.to(DType::float64);  // the float32-rounded values, stored as float64
  mixed.q = f32.q;
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    SCOPED_TRACE(to_string(impl));
    const Forward expected = run_forward(f32, impl);
    const Grads expected_grads = run_backward(f32, impl, &expected);
    Inputs in(mixed);
    Tensor o(expected.o.shape(), DType::float64), lse(expected.lse.shape(), DType::float64);
    forgetting_attn_forward(in.params, impl, o.view(), lse.view());
    EXPECT_TRUE(o.bit_equal(expected.o.to(DType::float64)));
    EXPECT_TRUE(lse.bit_equal(expected.lse.to(DType::float64)));
    Tensor dq(p.q.shape(), DType::float64), dk(p.k.shape(), DType::float64),
        dv(p.v.shape(), DType::float64), dg(p.g.shape(), DType::float64);
    forgetting_attn_backward(in.params, impl, in.d_o.view(), expected.o.view(), expected.lse.view(),
                             make_grads(dq.view(), dk.view(), dv.view(), dg.view()));
    EXPECT_TRUE(dq.bit_equal(expected_grads.dq.to(DType::float64)));
    EXPECT_TRUE(dk.bit_equal(expected_grads.dk.to(DType::float64)));
    EXPECT_TRUE(dv.bit_equal(expected_grads.dv.to(DType::float64)));
    // dg is accumulated in float64 whatever the compute type: equal once rounded to float32.
    EXPECT_TRUE(dg.to(DType::float32).bit_equal(expected_grads.dg));
  }
}

// Zero-sized problems (T = 0, B = 0, HQ = H = 0) are valid and write nothing.
TEST(ForgettingAttnKernels, EmptyProblems) {
  std::mt19937_64 rng(15);
  for (const Shape& shape :
       {Shape{2, 0, 2, 1, 3, 4}, Shape{0, 5, 2, 1, 3, 4}, Shape{1, 5, 0, 1, 3, 4}}) {
    const Problem p = make_problem(shape, Gates::realistic, rng);
    for (Impl impl : {Impl::chunk, Impl::recurrent, Impl::reference}) {
      SCOPED_TRACE(to_string(impl));
      EXPECT_NO_THROW(run_forward(p, impl));
      EXPECT_NO_THROW(run_backward(p, impl, nullptr));
    }
  }
  // And with θ (even K).
  for (const Shape& shape :
       {Shape{2, 0, 2, 1, 4, 4}, Shape{0, 5, 2, 1, 4, 4}, Shape{1, 5, 0, 1, 4, 4}}) {
    Problem p = make_problem(shape, Gates::realistic, rng);
    p.theta = Tensor::zeros({shape.B, shape.T, shape.H, shape.K / 2});
    for (Impl impl : {Impl::chunk, Impl::recurrent, Impl::reference}) {
      SCOPED_TRACE(std::string("theta ") + to_string(impl));
      EXPECT_NO_THROW(run_forward(p, impl));
      EXPECT_NO_THROW(run_backward(p, impl, nullptr));
    }
  }
}

// ---- huge logits in float32 (found by the numerical soak, tests/soak_test.cpp) -----------------

// Logits of ~1e9 (|q|, |k| ≈ 1e4 on all of K = 15 channels) are rounded by hundreds in float32, and
// two summation orders of the same dot product differ by that much. A backward given the lse of
// a forward that summed otherwise (the recurrent forward decodes through the cache; the chunk
// forward takes its keys in runs) recomputed e^{ℓ − lse} with ℓ − lse up to +hundreds: weights far
// above 1 (gradients off by 1e14) and then inf. Exactly, ℓ ≤ lse: the backward clamps the exponent
// at 0, so every weight is ≤ 1 and each dv_j is at most Σ_i |do_i| over the rows that see key j.
TEST(ForgettingAttnNumerics, HugeLogitsWithSavedLseGiveBoundedGradients) {
  std::mt19937_64 rng(31);
  const std::int64_t T = 64, K = 15, V = 4;
  Problem p = make_problem({1, T, 1, 1, K, V}, Gates::weak, rng);
  p.q = testing::uniform({1, T, 1, K}, rng, 1e4, 1.01e4);
  p.k = testing::uniform({1, T, 1, K}, rng, 1e4, 1.01e4);
  p = p.to(DType::float32);
  double bound = 0;  // Σ_i |do_i|: every dv_j is at most that
  for (std::int64_t i = 0; i < p.d_o.numel(); ++i) bound += std::fabs(p.d_o.at(i));
  for (Impl forward_impl : {Impl::recurrent, Impl::chunk}) {
    const Forward saved = run_forward(p, forward_impl);
    for (Impl impl : {Impl::recurrent, Impl::chunk}) {
      SCOPED_TRACE(std::string("lse of ") + to_string(forward_impl) + ", backward " +
                   to_string(impl));
      const Grads grads = run_backward(p, impl, &saved);
      for (const Tensor* x : {&grads.dq, &grads.dk, &grads.dv, &grads.dg})
        EXPECT_TRUE(testing::all_finite(*x));
      double largest = 0;
      for (std::int64_t i = 0; i < grads.dv.numel(); ++i)
        largest = std::max(largest, std::fabs(grads.dv.at(i)));
      EXPECT_LE(largest, bound * (1 + 1e-5)) << "max |dv|";
    }
  }
}

// The probabilities of both kernels (src/forgetting_attn/probabilities.h) make no subnormal
// number, whose every use costs Intel cores a microcode assist (FoX at T = 4,096 ran up to 2×
// slower): each is exactly 0 (below √(smallest normal), masked) or a normal number equal to
// exp(min(x, 0)), for x from +inf (clamped to 1) down through every subnormal-making exponent to
// −inf, in float32 and float64. The kernels' outputs cannot show this (the dropped terms are below
// T · 2^−63 relative), so the helper is tested directly.
template <class S>
void expect_no_subnormal_probabilities() {
  const S cutoff = std::sqrt(std::numeric_limits<S>::min());
  std::vector<S> shifted;
  for (double x = 1; x > -1000; x -= 0.37) shifted.push_back(static_cast<S>(x));
  for (double x : {kInf, -kInf, std::log(static_cast<double>(cutoff)),
                   std::log(static_cast<double>(cutoff)) + 1e-3})
    shifted.push_back(static_cast<S>(x));
  const Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>> in(
      shifted.data(), static_cast<Eigen::Index>(shifted.size()));
  Eigen::Array<S, Eigen::Dynamic, 1> out(in.size());
  detail::fox::probabilities(out, in);
  for (Eigen::Index i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "x = " << in[i]);
    const int kind = std::fpclassify(out[i]);
    ASSERT_TRUE(kind == FP_ZERO || kind == FP_NORMAL) << "p = " << out[i];
    const S exact = std::exp(std::min(in[i], S(0)));
    if (exact >= cutoff * S(1.001)) {
      EXPECT_NEAR(out[i], exact, 4 * std::numeric_limits<S>::epsilon() * exact);
    } else if (exact < cutoff * S(0.999)) {
      EXPECT_EQ(out[i], S(0));
    }
  }
}
TEST(ForgettingAttnNumerics, ProbabilitiesMakeNoSubnormalNumbers) {
  expect_no_subnormal_probabilities<float>();
  expect_no_subnormal_probabilities<double>();
}

// ---- long sequences ----------------------------------------------------------------------------

TEST(ForgettingAttnLong, Sequence65536WithWindow) {  // 4,096 with PHASOR_TEST_SIZE=small
  std::mt19937_64 rng(7);
  Problem p = make_problem({1, testing::long_sequence_length(), 1, 1, 16, 16}, Gates::mixed, rng);
  p.window = 256;
  p = p.to(DType::float32);
  const Forward chunk = run_forward(p, Impl::chunk);
  const Forward recurrent = run_forward(p, Impl::recurrent);
  const Forward reference = run_forward(p, Impl::reference);
  PHASOR_EXPECT_CLOSE(chunk.o, reference.o, 1e-5, "chunk o");
  PHASOR_EXPECT_CLOSE(chunk.lse, reference.lse, 1e-5, "chunk lse");
  PHASOR_EXPECT_CLOSE(recurrent.o, chunk.o, 1e-5, "recurrent o");
  PHASOR_EXPECT_CLOSE(recurrent.lse, chunk.lse, 1e-5, "recurrent lse");
  const Grads chunk_grads = run_backward(p, Impl::chunk, &chunk);
  const Grads recurrent_grads = run_backward(p, Impl::recurrent, &recurrent);
  PHASOR_EXPECT_CLOSE(chunk_grads.dq, recurrent_grads.dq, 1e-5, "dq");
  PHASOR_EXPECT_CLOSE(chunk_grads.dk, recurrent_grads.dk, 1e-5, "dk");
  PHASOR_EXPECT_CLOSE(chunk_grads.dv, recurrent_grads.dv, 1e-5, "dv");
  PHASOR_EXPECT_CLOSE(chunk_grads.dg, recurrent_grads.dg, 1e-5, "dg");
}

TEST(ForgettingAttnLong, Sequence8192FullCausal) {
  std::mt19937_64 rng(8);
  Problem p = make_problem({1, 8192, 1, 1, 16, 16}, Gates::weak, rng);
  p = p.to(DType::float32);
  const Forward chunk = run_forward(p, Impl::chunk);
  const Forward recurrent = run_forward(p, Impl::recurrent);
  PHASOR_EXPECT_CLOSE(recurrent.o, chunk.o, 1e-5, "o");
  PHASOR_EXPECT_CLOSE(recurrent.lse, chunk.lse, 1e-5, "lse");
  const Grads grads = run_backward(p, Impl::chunk, &chunk);
  EXPECT_TRUE(testing::all_finite(grads.dq) && testing::all_finite(grads.dk) &&
              testing::all_finite(grads.dv) && testing::all_finite(grads.dg));
}

// ---- rotation by θ fused into the kernels -------------------------------------------------------

// θ [B, T, H, K/2] ~ offset + N(0, std²) for p's key heads.
Tensor random_theta(const Problem& p, std::mt19937_64& rng, double stddev = 3.0,
                    double offset = 0.0) {
  Tensor theta = testing::randn({p.B(), p.T(), p.H(), p.K() / 2}, rng, stddev);
  for (std::int64_t i = 0; i < theta.numel(); ++i) theta.set(i, theta.at(i) + offset);
  return theta;
}

// The explicit path, in float64: q rotated by the angles of its key head (θ repeated over the
// query group) and k by θ, both with apply_rotary (its reference), the op called on them without
// θ, and the gradients taken back through apply_rotary_backward; dθ is the sum of q's over the
// group plus k's.
struct Explicit {
  Forward forward;
  Grads grads;
};

Explicit explicit_rotation(const Problem& p, Impl impl) {
  const std::int64_t B = p.B(), T = p.T(), HQ = p.HQ(), H = p.H(), R = p.K() / 2, G = HQ / H;
  const Tensor theta = p.theta.to(DType::float64), q = p.q.to(DType::float64),
               k = p.k.to(DType::float64);
  Tensor theta_q({B, T, HQ, R}, DType::float64);
  for (std::int64_t bt = 0; bt < B * T; ++bt)
    for (std::int64_t hq = 0; hq < HQ; ++hq)
      for (std::int64_t i = 0; i < R; ++i)
        theta_q.set((bt * HQ + hq) * R + i, theta.at((bt * H + hq / G) * R + i));
  Problem e = p.to(DType::float64);
  e.theta = Tensor();
  apply_rotary_forward(q.view(), theta_q.view(), p.layout, Impl::reference, e.q.view());
  apply_rotary_forward(k.view(), theta.view(), p.layout, Impl::reference, e.k.view());
  Explicit out{run_forward(e, impl), run_backward(e, impl, nullptr)};
  Tensor dq(q.shape(), DType::float64), dk(k.shape(), DType::float64),
      dtheta_q(theta_q.shape(), DType::float64), dtheta_k(theta.shape(), DType::float64);
  apply_rotary_backward(q.view(), theta_q.view(), p.layout, Impl::reference,
                        out.grads.dq.to(DType::float64).view(), dq.view(), dtheta_q.view());
  apply_rotary_backward(k.view(), theta.view(), p.layout, Impl::reference,
                        out.grads.dk.to(DType::float64).view(), dk.view(), dtheta_k.view());
  out.grads.dq = dq;
  out.grads.dk = dk;
  out.grads.dtheta = dtheta_k;
  for (std::int64_t bt = 0; bt < B * T; ++bt)
    for (std::int64_t hq = 0; hq < HQ; ++hq)
      for (std::int64_t i = 0; i < R; ++i) {
        const std::int64_t at = (bt * H + hq / G) * R + i;
        out.grads.dtheta.set(at, out.grads.dtheta.at(at) + dtheta_q.at((bt * HQ + hq) * R + i));
      }
  return out;
}

struct RotationCase {
  Case c;
  double theta_std = 3.0, theta_offset = 0.0;
};
void PrintTo(const RotationCase& rc, std::ostream* os) {
  *os << rc.c.name;
}

std::vector<RotationCase> rotation_cases() {
  return {
      {{"random", {2, 37, 4, 2, 8, 8}, Gates::realistic}},
      {{"strong_gates", {2, 29, 2, 1, 8, 5}, Gates::strong, 5}},
      {{"zero_gates", {1, 40, 4, 2, 6, 6}, Gates::zeros}},
      {{"weak_gates", {1, 50, 2, 2, 8, 8}, Gates::weak}},
      {{"large_logits", {2, 33, 2, 2, 8, 8}, Gates::realistic, 16, std::nullopt, 10.0}},
      {{"K_ne_V", {1, 25, 2, 2, 4, 11}, Gates::mixed, 5}},
      {{"K2", {1, 20, 1, 1, 2, 3}, Gates::realistic, 5}},
      {{"mixed_block1", {1, 9, 2, 1, 4, 3}, Gates::mixed, 1}},
      {{"grouped_4_window_7", {1, 30, 4, 1, 6, 6}, Gates::mixed, 5, 7}},
      {{"window_1", {1, 20, 2, 1, 4, 4}, Gates::mixed, 5, 1}},
      {{"varlen", {1, 32, 2, 1, 6, 4}, Gates::mixed, 5, std::nullopt, 1.0, {5, 0, 1, 17, 0, 9}}},
      {{"varlen_window", {1, 32, 4, 2, 6, 4}, Gates::zeros, 4, 3, 1.0, {1, 12, 0, 19}}},
      {{"strided_varlen",
        {1, 26, 2, 2, 6, 6},
        Gates::realistic,
        8,
        std::nullopt,
        1.0,
        {13, 0, 13},
        true}},
      // Longer than the chunk kernel's pieces of 256 rotated keys, with packed sequences.
      {{"T300_varlen", {1, 300, 2, 1, 4, 4}, Gates::weak, 64, std::nullopt, 1.0, {270, 30}}},
      // Selective-RoPE-like running phases of thousands of radians.
      {{"large_angles", {1, 23, 2, 1, 8, 4}, Gates::realistic, 8}, 500.0, 3000.0},
  };
}

Problem make_rotation_case(const RotationCase& rc, RotaryLayout layout) {
  std::mt19937_64 rng(std::hash<std::string>{}(rc.c.name));
  Problem p = make_case(rc.c, rng);
  p.theta = random_theta(p, rng, rc.theta_std, rc.theta_offset);
  p.layout = layout;
  return p;
}

constexpr RotaryLayout kLayouts[] = {RotaryLayout::half_split, RotaryLayout::interleaved};
constexpr Impl kImpls[] = {Impl::reference, Impl::recurrent, Impl::chunk};

void expect_all_close(const Forward& fwd, const Grads& g, const Forward& expected_fwd,
                      const Grads& expected, double tol, double dqdk_tol) {
  PHASOR_EXPECT_CLOSE(fwd.o, expected_fwd.o, tol, "o");
  PHASOR_EXPECT_CLOSE(fwd.lse, expected_fwd.lse, tol, "lse");
  PHASOR_EXPECT_CLOSE(g.dq, expected.dq, dqdk_tol, "dq");
  PHASOR_EXPECT_CLOSE(g.dk, expected.dk, dqdk_tol, "dk");
  PHASOR_EXPECT_CLOSE(g.dv, expected.dv, tol, "dv");
  PHASOR_EXPECT_CLOSE(g.dg, expected.dg, tol, "dg");
  PHASOR_EXPECT_CLOSE(g.dtheta, expected.dtheta, dqdk_tol, "dtheta");
}

class ForgettingAttnRotation : public ::testing::TestWithParam<RotationCase> {};

// Fused rotation == explicit rotation + op, every impl, both layouts, forward and all gradients.
// float64: against the explicit path through the same impl. float32 (θ float32 or float64):
// against the explicit path in float64 through the reference, on the float32-rounded inputs.
TEST_P(ForgettingAttnRotation, FusedEqualsExplicitRotation) {
  const RotationCase& rc = GetParam();
  for (RotaryLayout layout : kLayouts) {
    const Problem p = make_rotation_case(rc, layout);
    const Problem rounded = p.to(DType::float32).to(DType::float64);
    // As in expect_matches_reference: with gates of −20 the plain softmax adjoint of the
    // reference amplifies input rounding by ~e^20 in dq and dk (and so dθ).
    const bool strong = rc.c.gates == Gates::strong;
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      {
        SCOPED_TRACE("float64");
        const Explicit expected = explicit_rotation(p, impl);
        const Forward got = run_forward(p, impl);
        for (const Forward* saved : {&got, static_cast<const Forward*>(nullptr)})
          expect_all_close(got, run_backward(p, impl, saved), expected.forward, expected.grads,
                           1e-10, strong && impl == Impl::reference ? 1e-7 : 1e-10);
      }
      if (impl == Impl::reference) continue;  // the reference computes in float64 anyway
      const Explicit expected = explicit_rotation(rounded, Impl::reference);
      for (DType theta_dtype : {DType::float32, DType::float64}) {
        SCOPED_TRACE(std::string("float32, theta ") + to_string(theta_dtype));
        Problem f32 = rounded.to(DType::float32);
        f32.theta = rounded.theta.to(theta_dtype);
        const Forward got = run_forward(f32, impl);
        expect_all_close(got, run_backward(f32, impl, &got), expected.forward, expected.grads, 1e-5,
                         1e-5);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ForgettingAttnRotation, ::testing::ValuesIn(rotation_cases()),
                         [](const ::testing::TestParamInfo<RotationCase>& info) {
                           return info.param.c.name;
                         });

// The reference with θ: every gradient (dθ included) against central finite differences of its
// own forward.
TEST(ForgettingAttnRotation, ReferenceGradientsMatchFiniteDifferences) {
  for (RotaryLayout layout : kLayouts) {
    SCOPED_TRACE(to_string(layout));
    std::mt19937_64 rng(21);
    Problem p = make_problem({1, 11, 4, 2, 4, 3}, Gates::zeros, rng);  // (weak gates + h > 0)
    p.cu = testing::cu_seqlens({5, 0, 6});
    p.window = 4;
    p.theta = random_theta(p, rng);
    p.layout = layout;
    expect_gradients_match_finite_differences(p);
  }
}

// dθ of every implementation against central finite differences of the same implementation's
// forward (float64), grouped queries, a window, packed sequences, blocks that do not divide T.
TEST(ForgettingAttnRotation, DthetaMatchesFiniteDifferencesInEveryImpl) {
  for (RotaryLayout layout : kLayouts) {
    std::mt19937_64 rng(22);
    Problem p = make_problem({1, 13, 4, 2, 6, 3}, Gates::realistic, rng);
    p.cu = testing::cu_seqlens({6, 7});
    p.window = 5;
    p.block_size = 4;
    p.theta = random_theta(p, rng);
    p.layout = layout;
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      PHASOR_EXPECT_CLOSE(run_backward(p, impl, nullptr).dtheta,
                          finite_differences(p, &Problem::theta, impl), 1e-7, "dtheta");
    }
  }
}

// q_i'·k_j' = q_iᵀ R(θ_j − θ_i) k_j: logits depend on θ only through θ_i − θ_j (per pair), so
// adding the same constant to every θ leaves o, lse and every gradient (dθ included) unchanged.
// FoX has no recurrent state output; the cache's keys, which are in the rotated frame, do change
// but are not observable. A shift that grows with t (θ + c·t) is not a constant and does change
// o: the test can fail.
TEST(ForgettingAttnRotation, ConstantShiftOfThetaLeavesOutputsUnchanged) {
  for (RotaryLayout layout : kLayouts) {
    std::mt19937_64 rng(23);
    Problem p = make_problem({2, 21, 4, 2, 6, 5}, Gates::mixed, rng);
    p.block_size = 8;
    p.window = 11;
    p.theta = random_theta(p, rng);
    p.layout = layout;
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      const Forward base = run_forward(p, impl);
      const Grads base_grads = run_backward(p, impl, nullptr);
      for (double shift : {2.5, -1000.0}) {
        SCOPED_TRACE("shift " + std::to_string(shift));
        Problem shifted = p;
        for (std::int64_t i = 0; i < p.theta.numel(); ++i)
          shifted.theta.set(i, p.theta.at(i) + shift);
        expect_all_close(run_forward(shifted, impl), run_backward(shifted, impl, nullptr), base,
                         base_grads, 1e-10, 1e-10);
      }
      Problem growing = p;  // θ_t + 0.3 t: not relative-position invariant
      const std::int64_t per_token = p.H() * (p.K() / 2);
      for (std::int64_t i = 0; i < p.theta.numel(); ++i)
        growing.theta.set(i, p.theta.at(i) + 0.3 * static_cast<double>((i / per_token) % p.T()));
      EXPECT_GT(testing::rel_rms(run_forward(growing, impl).o, base.o), 1e-3);
    }
  }
}

// Standard RoPE (θ_t = t ω from rope_angles, shared by the heads through a zero stride): the
// logit of query position m and key position n depends only on m − n. With the same q and k at
// every position, g = 0 (no forgetting) and one-hot values v_j = e_j, o_i[j] = P_ij, so
// ℓ_ij = log o_i[j] + lse_i is read back from the fused kernel for every pair.
TEST(ForgettingAttnRotation, StandardRopeLogitsDependOnlyOnDistance) {
  const std::int64_t T = 12, H = 2, HQ = 4, K = 8, R = K / 2;
  std::mt19937_64 rng(24);
  const Tensor q_row = testing::randn({HQ, K}, rng), k_row = testing::randn({H, K}, rng);
  Problem p;
  p.q = Tensor({1, T, HQ, K}, DType::float64);
  p.k = Tensor({1, T, H, K}, DType::float64);
  p.v = Tensor::zeros({1, T, H, T});
  p.g = Tensor::zeros({1, T, HQ});
  p.d_o = Tensor::zeros({1, T, HQ, T});
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < HQ * K; ++i) p.q.set(t * HQ * K + i, q_row.at(i));
    for (std::int64_t i = 0; i < H * K; ++i) p.k.set(t * H * K + i, k_row.at(i));
    for (std::int64_t h = 0; h < H; ++h) p.v.set((t * H + h) * T + t, 1.0);
  }
  p.block_size = 5;
  RopeAnglesParams rp;
  rp.B = 1, rp.T = T, rp.head_dim = K, rp.offset = 7;
  Tensor angles({1, T, R}, DType::float64);
  rope_angles(rp, Impl::reference, angles.view());
  for (RotaryLayout layout : kLayouts)
    for (Impl impl : kImpls) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + to_string(impl));
      Inputs in(p);
      in.params.theta =
          TensorView::strided(angles.view().data, DType::float64, {1, T, H, R}, {T * R, R, 0, 1});
      in.params.rotary_layout = layout;
      Tensor o({1, T, HQ, T}, DType::float64), lse({1, T, HQ}, DType::float64);
      forgetting_attn_forward(in.params, impl, o.view(), lse.view());
      auto logit = [&](std::int64_t hq, std::int64_t m, std::int64_t n) {
        return std::log(o.at((m * HQ + hq) * T + n)) + lse.at(m * HQ + hq);
      };
      for (std::int64_t hq = 0; hq < HQ; ++hq) {
        for (std::int64_t m = 0; m < T; ++m)
          for (std::int64_t n = 0; n <= m; ++n)
            for (std::int64_t d = 1; m + d < T; ++d)
              EXPECT_NEAR(logit(hq, m + d, n + d), logit(hq, m, n), 1e-10)
                  << "hq " << hq << " (m, n) = (" << m << ", " << n << "), d = " << d;
        // And the logits do vary with the distance (the rotation is applied).
        EXPECT_GT(std::fabs(logit(hq, T - 1, 0) - logit(hq, T - 1, T - 1)), 1e-3);
      }
    }
}

// Each gradient requested alone with θ (dθ alone needs dq and dk internally) equals its value
// when all are computed, bit for bit.
TEST(ForgettingAttnRotation, GradientsRequestedAlone) {
  std::mt19937_64 rng(25);
  Problem p = make_problem({1, 30, 4, 2, 4, 4}, Gates::mixed, rng);
  p.block_size = 8;
  p.theta = random_theta(p, rng);
  p.layout = RotaryLayout::interleaved;
  for (Impl impl : kImpls) {
    SCOPED_TRACE(to_string(impl));
    const Grads all = run_backward(p, impl, nullptr);
    const Tensor* expected[5] = {&all.dq, &all.dk, &all.dv, &all.dg, &all.dtheta};
    Inputs in(p);
    for (int which = 0; which < 5; ++which) {
      Tensor alone(expected[which]->shape(), DType::float64);
      alone.fill(kNaN);
      ForgettingAttnGrads grads;
      TensorView* slot[5] = {&grads.dq, &grads.dk, &grads.dv, &grads.dg, &grads.dtheta};
      *slot[which] = alone.view();
      forgetting_attn_backward(in.params, impl, in.d_o.view(), {}, {}, grads);
      EXPECT_TRUE(alone.bit_equal(*expected[which])) << "gradient " << which;
    }
  }
}

// With θ, results are bit-identical for any thread count too.
TEST(ForgettingAttnRotation, BitIdenticalForAnyThreadCount) {
  std::mt19937_64 rng(26);
  Problem p = make_problem({2, 40, 6, 3, 8, 8}, Gates::mixed, rng);
  p.block_size = 16;
  p.window = 30;
  p.theta = random_theta(p, rng);
  p = p.to(DType::float32);
  for (Impl impl : kImpls) {
    SCOPED_TRACE(to_string(impl));
    std::vector<Forward> forwards;
    std::vector<Grads> backwards;
    for (int threads : {1, 3, 2}) {
      set_num_threads(threads);
      forwards.push_back(run_forward(p, impl));
      backwards.push_back(run_backward(p, impl, nullptr));
    }
    for (std::size_t r = 1; r < forwards.size(); ++r) {
      EXPECT_TRUE(forwards[r].o.bit_equal(forwards[0].o));
      EXPECT_TRUE(backwards[r].dq.bit_equal(backwards[0].dq));
      EXPECT_TRUE(backwards[r].dk.bit_equal(backwards[0].dk));
      EXPECT_TRUE(backwards[r].dtheta.bit_equal(backwards[0].dtheta));
    }
  }
  set_num_threads(0);
}

// ---- decoding ----------------------------------------------------------------------------------

// A [B, 1, ...] view of token t of a [B, T, ...] tensor.
TensorView token_view(const Tensor& x, std::int64_t t) {
  return testing::token(x.view(), t);
}

// rotation: θ given at every step (with this layout), or none.
// slopes: additive GRAPE slopes given at every step.
void expect_decode_matches_forward(const Shape& s, std::optional<std::int64_t> window, DType dtype,
                                   std::optional<RotaryLayout> rotation = std::nullopt,
                                   bool slopes = false) {
  SCOPED_TRACE(
      std::string(to_string(dtype)) + (window ? " window " + std::to_string(*window) : "") +
      (rotation ? std::string(" theta ") + to_string(*rotation) : "") + (slopes ? " slopes" : ""));
  std::mt19937_64 rng(9);
  Problem p = make_problem(s, Gates::mixed, rng);
  if (rotation) {
    p.theta = random_theta(p, rng);
    p.layout = *rotation;
  }
  if (slopes) add_random_slopes(p, rng, 0.3);
  p = p.to(dtype);
  p.window = window;
  p.scale = 0.6;
  const Forward expected = run_forward(p, Impl::chunk);
  ForgettingAttnCache cache(s.B, s.HQ, s.H, s.K, s.V, window);
  for (int round = 0; round < 2; ++round) {  // the second round after reset()
    Tensor o({s.B, s.T, s.HQ, s.V}, dtype);
    o.fill(kNaN);
    for (std::int64_t t = 0; t < s.T; ++t) {
      cache.step(token_view(p.q, t), token_view(p.k, t), token_view(p.v, t), token_view(p.g, t),
                 token_view(o, t), 0.6, p.theta.defined() ? token_view(p.theta, t) : TensorView{},
                 p.layout, slopes ? token_view(p.slope_q, t) : TensorView{},
                 slopes ? token_view(p.slope_k, t) : TensorView{});
      EXPECT_EQ(cache.length(), t + 1);
    }
    PHASOR_EXPECT_CLOSE(o, expected.o, dtype == DType::float32 ? 1e-5 : 1e-12, "o");
    cache.reset();
    EXPECT_EQ(cache.length(), 0);
  }
}

TEST(ForgettingAttnCache, StepByStepEqualsParallelForward) {
  for (DType dtype : {DType::float64, DType::float32}) {
    expect_decode_matches_forward({2, 40, 4, 2, 5, 6}, std::nullopt, dtype);
    expect_decode_matches_forward({2, 40, 4, 2, 5, 6}, 7, dtype);
    expect_decode_matches_forward({3, 20, 2, 2, 3, 4}, 1, dtype);
    expect_decode_matches_forward({1, 50, 4, 1, 4, 4}, 64, dtype);
  }
}

// Decoding with θ (each key rotated once, when cached; the queries of the group by the token's θ
// of their key head) equals the parallel forward with θ; windows and grouped queries included.
TEST(ForgettingAttnCache, StepByStepWithThetaEqualsParallelForward) {
  for (DType dtype : {DType::float64, DType::float32})
    for (RotaryLayout layout : kLayouts) {
      expect_decode_matches_forward({2, 40, 4, 2, 6, 5}, std::nullopt, dtype, layout);
      expect_decode_matches_forward({2, 40, 4, 2, 6, 5}, 7, dtype, layout);
      expect_decode_matches_forward({1, 30, 4, 1, 2, 4}, 1, dtype, layout);
    }
}

// Decoding with additive GRAPE slopes (the cache keeps each key's b_p and position p) equals the
// parallel forward with them: windows (ring buffer), grouped queries, zero gates that empty the
// cache (positions keep counting), with θ as well; reset() restarts the positions at 0.
TEST(ForgettingAttnCache, StepByStepWithSlopesEqualsParallelForward) {
  for (DType dtype : {DType::float64, DType::float32}) {
    expect_decode_matches_forward({2, 40, 4, 2, 5, 6}, std::nullopt, dtype, std::nullopt, true);
    expect_decode_matches_forward({2, 40, 4, 2, 5, 6}, 7, dtype, std::nullopt, true);
    expect_decode_matches_forward({3, 20, 2, 2, 3, 4}, 1, dtype, std::nullopt, true);
    expect_decode_matches_forward({1, 50, 4, 1, 4, 4}, 64, dtype, std::nullopt, true);
    expect_decode_matches_forward({2, 30, 4, 2, 6, 5}, 9, dtype, RotaryLayout::interleaved, true);
  }
}

// A step without slopes counts as slopes 0: a cache fed a only on some steps and b only on others
// equals the parallel forward with zeros in the missing places.
TEST(ForgettingAttnCache, MissingSlopesAreZero) {
  std::mt19937_64 rng(31);
  const Shape s{2, 24, 4, 2, 4, 3};
  Problem p = make_problem(s, Gates::realistic, rng);
  add_random_slopes(p, rng, 0.5);
  for (std::int64_t t = 0; t < s.T; ++t) {
    if (t % 3 == 0)  // no a at this step
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t h = 0; h < s.HQ; ++h) p.slope_q.set((b * s.T + t) * s.HQ + h, 0.0);
    if (t % 4 == 1)  // no b at this step
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t h = 0; h < s.H; ++h) p.slope_k.set((b * s.T + t) * s.H + h, 0.0);
  }
  const Forward expected = run_forward(p, Impl::reference);
  ForgettingAttnCache cache(s.B, s.HQ, s.H, s.K, s.V);
  Tensor o({s.B, s.T, s.HQ, s.V}, DType::float64);
  o.fill(kNaN);
  for (std::int64_t t = 0; t < s.T; ++t)
    cache.step(token_view(p.q, t), token_view(p.k, t), token_view(p.v, t), token_view(p.g, t),
               token_view(o, t), std::nullopt, {}, RotaryLayout::half_split,
               t % 3 == 0 ? TensorView{} : token_view(p.slope_q, t),
               t % 4 == 1 ? TensorView{} : token_view(p.slope_k, t));
  PHASOR_EXPECT_CLOSE(o, expected.o, 1e-12, "o");
}

// A cache holds rotated keys or unrotated ones, in one layout: a step that does not match the
// first step since construction or reset() is an error (and changes nothing); reset() clears
// the mode.
TEST(ForgettingAttnCache, ThetaModeIsFixedUntilReset) {
  const std::string op = "ForgettingAttnCache::step";
  ForgettingAttnCache cache(1, 2, 1, 4, 3);
  Tensor q({1, 1, 2, 4}, DType::float64), k({1, 1, 1, 4}, DType::float64),
      v({1, 1, 1, 3}, DType::float64), g({1, 1, 2}, DType::float64),
      o({1, 1, 2, 3}, DType::float64), theta({1, 1, 1, 2}, DType::float64),
      theta_bad({1, 1, 2, 2}, DType::float64), theta_k({1, 1, 1, 4}, DType::float64);
  testing::expect_error(
      [&] { cache.step(q.view(), k.view(), v.view(), g.view(), o.view(), {}, theta_bad.view()); },
      {op.c_str(), "'theta'", "num_kv_heads=1", "[1, 1, 2, 2]"});
  testing::expect_error(
      [&] { cache.step(q.view(), k.view(), v.view(), g.view(), o.view(), {}, theta_k.view()); },
      {op.c_str(), "'theta'", "K/2=2", "[1, 1, 1, 4]"});
  EXPECT_EQ(cache.length(), 0);
  cache.step(q.view(), k.view(), v.view(), g.view(), o.view(), {}, theta.view());
  testing::expect_error([&] { cache.step(q.view(), k.view(), v.view(), g.view(), o.view()); },
                        {op.c_str(), "'theta'", "theta at every step", "no theta"});
  testing::expect_error(
      [&] {
        cache.step(q.view(), k.view(), v.view(), g.view(), o.view(), {}, theta.view(),
                   RotaryLayout::interleaved);
      },
      {op.c_str(), "'rotary_layout'", "half_split", "interleaved"});
  EXPECT_EQ(cache.length(), 1);
  cache.reset();
  cache.step(q.view(), k.view(), v.view(), g.view(), o.view());  // now without θ
  testing::expect_error(
      [&] { cache.step(q.view(), k.view(), v.view(), g.view(), o.view(), {}, theta.view()); },
      {op.c_str(), "'theta'", "no theta at any step", "theta given"});
  EXPECT_EQ(cache.length(), 1);
  // Odd head_dim: no rotation pairs.
  ForgettingAttnCache odd(1, 1, 1, 3, 3);
  Tensor q3({1, 1, 1, 3}, DType::float64), k3({1, 1, 1, 3}, DType::float64),
      v3({1, 1, 1, 3}, DType::float64), g1({1, 1, 1}, DType::float64),
      o3({1, 1, 1, 3}, DType::float64), theta1({1, 1, 1, 1}, DType::float64);
  testing::expect_error(
      [&] { odd.step(q3.view(), k3.view(), v3.view(), g1.view(), o3.view(), {}, theta1.view()); },
      {op.c_str(), "'theta'", "even", "K = 3"});
}

TEST(ForgettingAttnCache, MovedCacheKeepsItsState) {
  std::mt19937_64 rng(10);
  Problem p = make_problem({1, 6, 2, 1, 3, 3}, Gates::realistic, rng);
  const Forward expected = run_forward(p, Impl::reference);
  ForgettingAttnCache first(1, 2, 1, 3, 3);
  Tensor o({1, 6, 2, 3}, DType::float64);
  for (std::int64_t t = 0; t < 3; ++t)
    first.step(token_view(p.q, t), token_view(p.k, t), token_view(p.v, t), token_view(p.g, t),
               token_view(o, t));
  ForgettingAttnCache second = std::move(first);
  for (std::int64_t t = 3; t < 6; ++t)
    second.step(token_view(p.q, t), token_view(p.k, t), token_view(p.v, t), token_view(p.g, t),
                token_view(o, t));
  EXPECT_EQ(second.length(), 6);
  PHASOR_EXPECT_CLOSE(o, expected.o, 1e-12, "o");
}

// ---- additive GRAPE slopes (ALiBi, GRAPE-A-QK) -------------------------------------------------

std::vector<Case> slope_cases() {
  std::vector<Case> cases;
  // Every adversarial case with GRAPE-A-QK-like slopes...
  for (Case c : adversarial_cases()) {
    c.name += "_slopes";
    c.slope_gain = 0.3;
    cases.push_back(c);
  }
  // ...strong slopes (the diagonal dominates, as with strong gates; T not a multiple of the
  // block), negative slopes (logits grow with the distance), slopes with weak gates over long
  // distances (the bias, not the gates, decides), and with a window.
  cases.push_back({"strong_slopes", {2, 29, 2, 1, 8, 5}, Gates::weak, 5, {}, 1.0, {}, false, 6.0});
  cases.push_back(
      {"strong_slopes_block64", {1, 70, 2, 1, 8, 8}, Gates::realistic, 64, {}, 1.0, {}, false, 4});
  cases.push_back(
      {"negative_slopes", {1, 53, 4, 2, 6, 5}, Gates::weak, 16, {}, 1.0, {}, false, -0.03});
  cases.push_back(
      {"long_weak_gates_slopes", {1, 150, 2, 2, 8, 8}, Gates::weak, 16, {}, 1.0, {}, false, 0.05});
  cases.push_back({"window_slopes_varlen",
                   {1, 60, 4, 2, 5, 4},
                   Gates::mixed,
                   8,
                   11,
                   1.0,
                   {23, 0, 1, 36},
                   false,
                   0.4});
  return cases;
}

class ForgettingAttnSlopes : public ::testing::TestWithParam<Case> {};

TEST_P(ForgettingAttnSlopes, ChunkFloat64MatchesReference) {
  expect_matches_reference(GetParam(), Impl::chunk, DType::float64);
}
TEST_P(ForgettingAttnSlopes, ChunkFloat32MatchesReference) {
  expect_matches_reference(GetParam(), Impl::chunk, DType::float32);
}
TEST_P(ForgettingAttnSlopes, RecurrentFloat64MatchesReference) {
  expect_matches_reference(GetParam(), Impl::recurrent, DType::float64);
}
TEST_P(ForgettingAttnSlopes, RecurrentFloat32MatchesReference) {
  expect_matches_reference(GetParam(), Impl::recurrent, DType::float32);
}

INSTANTIATE_TEST_SUITE_P(Adversarial, ForgettingAttnSlopes, ::testing::ValuesIn(slope_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// The reference's da, db (and every other gradient) against central finite differences of its
// forward: grouped queries (db sums over the group), a window, packed sequences, zero gates.
TEST(ForgettingAttnSlopes, ReferenceGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(21);
  Problem p = make_problem({2, 9, 4, 2, 3, 4}, Gates::realistic, rng);
  add_random_slopes(p, rng, 0.5);
  expect_gradients_match_finite_differences(p);
  Problem varlen = make_problem({1, 14, 4, 2, 4, 3}, Gates::zeros, rng);
  varlen.cu = testing::cu_seqlens({6, 0, 1, 7});
  varlen.window = 4;
  add_random_slopes(varlen, rng, -0.4);  // negative slopes too
  expect_gradients_match_finite_differences(varlen);
}

// da and db of each optimized implementation against central finite differences of that
// implementation's own forward (float64), blocks that do not divide T.
TEST(ForgettingAttnSlopes, SlopeGradientsMatchFiniteDifferencesInEveryImpl) {
  std::mt19937_64 rng(22);
  Problem p = make_problem({1, 13, 4, 2, 3, 4}, Gates::mixed, rng);
  add_random_slopes(p, rng, 0.7);
  p.block_size = 4;
  p.window = 9;
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    SCOPED_TRACE(to_string(impl));
    const Grads g = run_backward(p, impl, nullptr);
    PHASOR_EXPECT_CLOSE(g.dslope_q, finite_differences(p, &Problem::slope_q, impl), 1e-7, "da");
    PHASOR_EXPECT_CLOSE(g.dslope_k, finite_differences(p, &Problem::slope_k, impl), 1e-7, "db");
  }
}

// GRAPE Sec. 4.2 / App. C: FoX with a constant log gate g = −m is exactly ALiBi with slope m:
// Σ_{s ∈ (j, i]} (−m) = −m (i − j). Same o and lse, same dq, dk, dv; and since a constant gate
// and a constant slope are one parameter m seen two ways, d loss/dm agrees: Σ_i da_i = −Σ_s dg_s
// (each pair (i, j) holds i − j gates). m differs per query head. More generally the two
// compose: gates g with slope a_i = m equal gates g − m without slopes.
TEST(ForgettingAttnSlopes, AlibiEqualsFoxWithConstantLogGates) {
  std::mt19937_64 rng(23);
  Problem fox = make_problem({2, 37, 4, 2, 6, 5}, Gates::realistic, rng);
  fox.block_size = 8;
  const std::vector<double> m = {0.5, 0.125, 1.0 / 32, 2.0};  // ALiBi-like, per query head
  Problem alibi = fox;
  alibi.slope_q = Tensor::zeros(fox.g.shape());
  for (std::int64_t i = 0; i < fox.g.numel(); ++i) {
    const double slope = m[static_cast<std::size_t>(i % 4)];
    fox.g.set(i, -slope);
    alibi.g.set(i, 0.0);  // no forgetting: only the slope
    alibi.slope_q.set(i, slope);
  }
  for (DType dtype : {DType::float64, DType::float32})
    for (Impl impl : {Impl::reference, Impl::chunk, Impl::recurrent}) {
      SCOPED_TRACE(std::string(to_string(impl)) + " " + to_string(dtype));
      const Problem f = fox.to(dtype), a = alibi.to(dtype);
      const double tol = dtype == DType::float64 ? 1e-13 : 1e-6;
      const Forward fox_out = run_forward(f, impl), alibi_out = run_forward(a, impl);
      PHASOR_EXPECT_CLOSE(alibi_out.o, fox_out.o, tol, "o");
      PHASOR_EXPECT_CLOSE(alibi_out.lse, fox_out.lse, tol, "lse");
      const Grads fg = run_backward(f, impl, nullptr), ag = run_backward(a, impl, nullptr);
      PHASOR_EXPECT_CLOSE(ag.dq, fg.dq, tol, "dq");
      PHASOR_EXPECT_CLOSE(ag.dk, fg.dk, tol, "dk");
      PHASOR_EXPECT_CLOSE(ag.dv, fg.dv, tol, "dv");
      // Per (sequence, query head): Σ_t da_t = −Σ_t dg_t.
      for (std::int64_t b = 0; b < fox.B(); ++b)
        for (std::int64_t h = 0; h < fox.HQ(); ++h) {
          double sum_da = 0, sum_dg = 0;
          for (std::int64_t t = 0; t < fox.T(); ++t) {
            sum_da += ag.dslope_q.at((b * fox.T() + t) * fox.HQ() + h);
            sum_dg += fg.dg.at((b * fox.T() + t) * fox.HQ() + h);
          }
          EXPECT_NEAR(sum_da, -sum_dg,
                      (dtype == DType::float64 ? 1e-11 : 1e-4) * (1 + std::abs(sum_dg)))
              << "b " << b << " head " << h;
        }
    }
  // Composition: realistic gates g plus slope m equal gates g − m.
  Problem gates = make_problem({1, 41, 4, 2, 6, 5}, Gates::realistic, rng);
  gates.block_size = 16;
  gates.window = 30;
  Problem composed = gates, shifted = gates;
  composed.slope_q = Tensor::zeros(gates.g.shape());
  for (std::int64_t i = 0; i < gates.g.numel(); ++i) {
    const double slope = m[static_cast<std::size_t>(i % 4)];
    composed.slope_q.set(i, slope);
    shifted.g.set(i, gates.g.at(i) - slope);
  }
  for (Impl impl : {Impl::reference, Impl::chunk, Impl::recurrent}) {
    SCOPED_TRACE(std::string("composed ") + to_string(impl));
    PHASOR_EXPECT_CLOSE(run_forward(composed, impl).o, run_forward(shifted, impl).o, 1e-13, "o");
  }
}

// Slopes of exactly 0 add −(i − j)·0 = −0 to each logit: the outputs and all the other gradients
// are bit-identical to the call without slopes, in every implementation and dtype.
TEST(ForgettingAttnSlopes, ZeroSlopesAreBitIdenticalToNoSlopes) {
  std::mt19937_64 rng(24);
  Problem plain = make_problem({2, 45, 4, 2, 6, 5}, Gates::mixed, rng);
  plain.block_size = 16;
  plain.window = 20;
  Problem zero = plain;
  zero.slope_q = Tensor::zeros(plain.g.shape());
  zero.slope_k = Tensor::zeros({plain.B(), plain.T(), plain.H()});
  for (DType dtype : {DType::float64, DType::float32})
    for (Impl impl : {Impl::reference, Impl::chunk, Impl::recurrent}) {
      SCOPED_TRACE(std::string(to_string(impl)) + " " + to_string(dtype));
      const Problem p = plain.to(dtype), z = zero.to(dtype);
      const Forward fp = run_forward(p, impl), fz = run_forward(z, impl);
      EXPECT_TRUE(fz.o.bit_equal(fp.o));
      EXPECT_TRUE(fz.lse.bit_equal(fp.lse));
      const Grads gp = run_backward(p, impl, &fp), gz = run_backward(z, impl, &fz);
      EXPECT_TRUE(gz.dq.bit_equal(gp.dq));
      EXPECT_TRUE(gz.dk.bit_equal(gp.dk));
      EXPECT_TRUE(gz.dv.bit_equal(gp.dv));
      EXPECT_TRUE(gz.dg.bit_equal(gp.dg));
      EXPECT_TRUE(testing::all_finite(gz.dslope_q) && testing::all_finite(gz.dslope_k));
    }
}

// The relative law (GRAPE Eq. 4.3): the bias depends on i − j only. A sequence moved to later
// positions — s random tokens put in front of it and cut off by a zero gate at its first token,
// so that nothing of them is visible — gives the same outputs and gradients as the sequence on
// its own, although every absolute position grew by s (and the chunk tiles now fall elsewhere).
// For the cache too, where the zero gate empties the cache but the positions keep counting.
TEST(ForgettingAttnSlopes, RelativeLawShiftedSequenceIsUnchanged) {
  std::mt19937_64 rng(25);
  const std::int64_t L = 29, HQ = 4, H = 2, K = 6, V = 5;
  for (std::int64_t shift : {1, 7, 100}) {
    SCOPED_TRACE("shift " + std::to_string(shift));
    Problem alone = make_problem({1, L, HQ, H, K, V}, Gates::realistic, rng);
    add_random_slopes(alone, rng, 0.4);
    alone.block_size = 8;
    alone.window = 12;
    Problem shifted = make_problem({1, shift + L, HQ, H, K, V}, Gates::realistic, rng);
    add_random_slopes(shifted, rng, 0.4);
    shifted.block_size = 8;
    shifted.window = 12;
    // Copy the sequence into tokens shift..; its first gate (which never enters) becomes −inf.
    auto copy = [&](const Tensor& from, Tensor& to, std::int64_t per_token) {
      for (std::int64_t t = 0; t < L; ++t)
        for (std::int64_t e = 0; e < per_token; ++e)
          to.set((shift + t) * per_token + e, from.at(t * per_token + e));
    };
    copy(alone.q, shifted.q, HQ * K);
    copy(alone.k, shifted.k, H * K);
    copy(alone.v, shifted.v, H * V);
    copy(alone.g, shifted.g, HQ);
    copy(alone.d_o, shifted.d_o, HQ * V);
    copy(alone.slope_q, shifted.slope_q, HQ);
    copy(alone.slope_k, shifted.slope_k, H);
    for (std::int64_t h = 0; h < HQ; ++h) shifted.g.set(shift * HQ + h, -kInf);
    // The shifted run's values at tokens shift.. (per_token values each).
    auto tail = [&](const Tensor& x, std::int64_t per_token) {
      Tensor out = Tensor::zeros({L * per_token});
      for (std::int64_t i = 0; i < L * per_token; ++i) out.set(i, x.at(shift * per_token + i));
      return out;
    };
    auto flat = [](const Tensor& x) {
      Tensor out = Tensor::zeros({x.numel()});
      for (std::int64_t i = 0; i < x.numel(); ++i) out.set(i, x.at(i));
      return out;
    };
    for (Impl impl : {Impl::reference, Impl::chunk, Impl::recurrent}) {
      SCOPED_TRACE(to_string(impl));
      const Forward fa = run_forward(alone, impl), fs = run_forward(shifted, impl);
      PHASOR_EXPECT_CLOSE(tail(fs.o, HQ * V), flat(fa.o), 1e-13, "o");
      PHASOR_EXPECT_CLOSE(tail(fs.lse, HQ), flat(fa.lse), 1e-13, "lse");
      const Grads ga = run_backward(alone, impl, nullptr),
                  gs = run_backward(shifted, impl, nullptr);
      PHASOR_EXPECT_CLOSE(tail(gs.dq, HQ * K), flat(ga.dq), 1e-12, "dq");
      PHASOR_EXPECT_CLOSE(tail(gs.dk, H * K), flat(ga.dk), 1e-12, "dk");
      PHASOR_EXPECT_CLOSE(tail(gs.dslope_q, HQ), flat(ga.dslope_q), 1e-12, "da");
      PHASOR_EXPECT_CLOSE(tail(gs.dslope_k, H), flat(ga.dslope_k), 1e-12, "db");
    }
    // Decoding the shifted sequence: the last L outputs equal the sequence's own.
    const Forward fa = run_forward(alone, Impl::reference);
    ForgettingAttnCache cache(1, HQ, H, K, V, 12);
    Tensor o({1, shift + L, HQ, V}, DType::float64);
    for (std::int64_t t = 0; t < shift + L; ++t)
      cache.step(token_view(shifted.q, t), token_view(shifted.k, t), token_view(shifted.v, t),
                 token_view(shifted.g, t), token_view(o, t), std::nullopt, {},
                 RotaryLayout::half_split, token_view(shifted.slope_q, t),
                 token_view(shifted.slope_k, t));
    PHASOR_EXPECT_CLOSE(tail(o, HQ * V), flat(fa.o), 1e-13, "cache o");
  }
}

// Each slope gradient requested alone equals its value when everything is computed.
TEST(ForgettingAttnSlopes, SlopeGradientsRequestedAlone) {
  std::mt19937_64 rng(26);
  Problem p = make_problem({1, 30, 4, 2, 4, 4}, Gates::mixed, rng);
  add_random_slopes(p, rng, 0.3);
  p.block_size = 8;
  for (Impl impl : {Impl::chunk, Impl::recurrent, Impl::reference}) {
    SCOPED_TRACE(to_string(impl));
    const Grads all = run_backward(p, impl, nullptr);
    Inputs in(p);
    Tensor da(p.slope_q.shape(), DType::float64), db(p.slope_k.shape(), DType::float64);
    da.fill(kNaN);
    db.fill(kNaN);
    ForgettingAttnGrads only_da, only_db;
    only_da.dbias_q_slope = da.view();
    only_db.dbias_k_slope = db.view();
    forgetting_attn_backward(in.params, impl, in.d_o.view(), {}, {}, only_da);
    forgetting_attn_backward(in.params, impl, in.d_o.view(), {}, {}, only_db);
    EXPECT_TRUE(da.bit_equal(all.dslope_q));
    EXPECT_TRUE(db.bit_equal(all.dslope_k));
  }
}

// GRAPE App. C writes the FoX bias as a difference of per-time potentials, b(t, j) =
// Σ_{ℓ=j+1}^{t} a_ℓ = U_t − U_j with U_u := Σ_{ℓ<u} a_ℓ. That U is exclusive, and with it
// U_t − U_j = Σ_{ℓ=j}^{t−1} a_ℓ: the gates of [j, t), not (j, t]. The mathematics needs the
// inclusive U_u = Σ_{ℓ≤u} a_ℓ. Brute-force softmax attention with each potential: the inclusive
// one reproduces the op (and the paper's own Σ_{ℓ=j+1}^{t}); the printed exclusive one does not.
TEST(ForgettingAttnSlopes, GrapeAppendixCPotentialMustBeInclusive) {
  std::mt19937_64 rng(28);
  const Problem p = make_problem({1, 16, 1, 1, 4, 3}, Gates::realistic, rng);
  const std::int64_t T = p.T(), K = p.K(), V = p.V();
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  std::vector<double> inclusive(static_cast<std::size_t>(T)), exclusive(inclusive);
  double run = 0;
  for (std::int64_t u = 0; u < T; ++u) {
    exclusive[static_cast<std::size_t>(u)] = run;  // Σ_{ℓ<u}, as printed
    run += p.g.at(u);
    inclusive[static_cast<std::size_t>(u)] = run;  // Σ_{ℓ≤u}
  }
  auto attention = [&](const std::vector<double>& U) {
    Tensor o = Tensor::zeros({1, T, 1, V});
    for (std::int64_t i = 0; i < T; ++i) {
      std::vector<double> logit(static_cast<std::size_t>(i + 1));
      double max_logit = -kInf, sum = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        double qk = 0;
        for (std::int64_t c = 0; c < K; ++c) qk += p.q.at(i * K + c) * p.k.at(j * K + c);
        logit[static_cast<std::size_t>(j)] =
            scale * qk + U[static_cast<std::size_t>(i)] - U[static_cast<std::size_t>(j)];
        max_logit = std::max(max_logit, logit[static_cast<std::size_t>(j)]);
      }
      for (double& l : logit) sum += (l = std::exp(l - max_logit));
      for (std::int64_t j = 0; j <= i; ++j)
        for (std::int64_t c = 0; c < V; ++c)
          o.set(i * V + c,
                o.at(i * V + c) + logit[static_cast<std::size_t>(j)] / sum * p.v.at(j * V + c));
    }
    return o;
  };
  const Forward op = run_forward(p, Impl::reference);
  PHASOR_EXPECT_CLOSE(attention(inclusive), op.o, 1e-13, "inclusive potential");
  EXPECT_GT(testing::rel_rms(attention(exclusive), op.o), 1e-3) << "the printed U_u = Σ_{ℓ<u}";
}

// ---- threads -----------------------------------------------------------------------------------

TEST(ForgettingAttnThreads, BitIdenticalForAnyThreadCount) {
  std::mt19937_64 rng(11);
  Problem p = make_problem({2, 70, 6, 3, 8, 8}, Gates::mixed, rng);
  add_random_slopes(p, rng, 0.2);
  p = p.to(DType::float32);
  p.block_size = 16;
  p.window = 40;
  for (Impl impl : {Impl::chunk, Impl::recurrent, Impl::reference}) {
    SCOPED_TRACE(to_string(impl));
    std::vector<Forward> forwards;
    std::vector<Grads> backwards;
    for (int threads : {1, 2, 3, 2}) {
      set_num_threads(threads);
      forwards.push_back(run_forward(p, impl));
      backwards.push_back(run_backward(p, impl, nullptr));
    }
    for (std::size_t r = 1; r < forwards.size(); ++r) {
      EXPECT_TRUE(forwards[r].o.bit_equal(forwards[0].o));
      EXPECT_TRUE(forwards[r].lse.bit_equal(forwards[0].lse));
      EXPECT_TRUE(backwards[r].dq.bit_equal(backwards[0].dq));
      EXPECT_TRUE(backwards[r].dk.bit_equal(backwards[0].dk));
      EXPECT_TRUE(backwards[r].dv.bit_equal(backwards[0].dv));
      EXPECT_TRUE(backwards[r].dg.bit_equal(backwards[0].dg));
      EXPECT_TRUE(backwards[r].dslope_q.bit_equal(backwards[0].dslope_q));
      EXPECT_TRUE(backwards[r].dslope_k.bit_equal(backwards[0].dslope_k));
    }
  }
  set_num_threads(0);
}

// With fewer items (sequence, key head) than twice the threads, the chunk forward runs the query
// blocks of one item in parallel and the backward its segments, instead of one item per thread:
// one thread (the by-item walk) and 2–8 threads must give the same bits — one key head shared by
// three query heads, a varlen batch, a window, slopes, rotation, the backward with and without
// the forward's o and lse. Blocks of 4 rows give 2–4 segments per sequence.
TEST(ForgettingAttnThreads, BlockParallelScheduleIsBitIdentical) {
  std::mt19937_64 rng(12);
  Problem p = make_problem({1, 150, 3, 1, 8, 6}, Gates::mixed, rng, 3.0);
  add_random_slopes(p, rng, 0.2);
  p.theta = random_theta(p, rng);
  p = p.to(DType::float32);
  p.block_size = 4;
  for (std::optional<std::int64_t> window : {std::optional<std::int64_t>{}, {50}}) {
    p.window = window;
    for (const std::vector<std::int64_t>& lengths :
         {std::vector<std::int64_t>{}, std::vector<std::int64_t>{70, 0, 1, 79}}) {
      p.cu = lengths.empty() ? Tensor() : testing::cu_seqlens(lengths);
      set_num_threads(1);
      const Forward one = run_forward(p, Impl::chunk);
      const Grads one_saved = run_backward(p, Impl::chunk, &one);
      const Grads one_recomputed = run_backward(p, Impl::chunk, nullptr);
      for (int threads : {2, 3, 8}) {
        SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(lengths.size()) +
                     " packed sequences");
        set_num_threads(threads);
        const Forward f = run_forward(p, Impl::chunk);
        EXPECT_TRUE(f.o.bit_equal(one.o) && f.lse.bit_equal(one.lse));
        for (const auto& [saved, expected] :
             {std::pair{&f, &one_saved},
              std::pair{static_cast<const Forward*>(nullptr), &one_recomputed}}) {
          const Grads g = run_backward(p, Impl::chunk, saved);
          EXPECT_TRUE(g.dq.bit_equal(expected->dq));
          EXPECT_TRUE(g.dk.bit_equal(expected->dk));
          EXPECT_TRUE(g.dv.bit_equal(expected->dv));
          EXPECT_TRUE(g.dg.bit_equal(expected->dg));
          EXPECT_TRUE(g.dtheta.bit_equal(expected->dtheta));
          EXPECT_TRUE(g.dslope_q.bit_equal(expected->dslope_q));
          EXPECT_TRUE(g.dslope_k.bit_equal(expected->dslope_k));
        }
      }
    }
  }
  set_num_threads(0);
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(ForgettingAttnErrors, BadSlopeArgumentsNameTheArgument) {
  std::mt19937_64 rng(27);
  const Problem p = make_problem({1, 6, 4, 2, 3, 5}, Gates::realistic, rng);
  Tensor o({1, 6, 4, 5}, DType::float64), slope_q = Tensor::zeros({1, 6, 4}),
                                          slope_k = Tensor::zeros({1, 6, 2});
  Tensor bad_q = Tensor::zeros({1, 6, 2}), bad_k = Tensor::zeros({1, 6, 4}), inf_q = slope_q,
         nan_k = slope_k;
  inf_q.set(5, kInf);
  nan_k.set(3, kNaN);
  for (Impl impl : {Impl::reference, Impl::chunk, Impl::recurrent}) {
    const std::string op = impl == Impl::chunk       ? "parallel_forgetting_attn"
                           : impl == Impl::recurrent ? "forgetting_attn_recurrent"
                                                     : "forgetting_attn_reference";
    auto forward = [&](const Tensor& a, const Tensor& b) {
      Inputs in(p);
      in.params.bias_q_slope = a.view();
      in.params.bias_k_slope = b.view();
      forgetting_attn_forward(in.params, impl, o.view());
    };
    testing::expect_error([&] { forward(bad_q, slope_k); },
                          {op.c_str(), "'bias_q_slope'", "HQ (as q)=4", "[1, 6, 2]"});
    testing::expect_error([&] { forward(slope_q, bad_k); },
                          {op.c_str(), "'bias_k_slope'", "H (as k)=2", "[1, 6, 4]"});
    testing::expect_error([&] { forward(inf_q, slope_k); },
                          {op.c_str(), "'bias_q_slope'", "finite", "bias_q_slope[0, 1, 1]"});
    testing::expect_error([&] { forward(slope_q, nan_k); },
                          {op.c_str(), "'bias_k_slope'", "finite", "bias_k_slope[0, 1, 1]"});
    // A slope gradient needs its slope, its shape, and its own elements.
    Inputs in(p);
    Tensor da = Tensor::zeros({1, 6, 4}), db = Tensor::zeros({1, 6, 2}),
           db_bad = Tensor::zeros({1, 5, 2});
    ForgettingAttnGrads grads;
    grads.dbias_q_slope = da.view();
    testing::expect_error(
        [&] { forgetting_attn_backward(in.params, impl, in.d_o.view(), {}, {}, grads); },
        {op.c_str(), "'dbias_q_slope'", "bias_q_slope to be given"});
    in.params.bias_q_slope = slope_q.view();
    in.params.bias_k_slope = slope_k.view();
    grads.dbias_k_slope = db_bad.view();
    testing::expect_error(
        [&] { forgetting_attn_backward(in.params, impl, in.d_o.view(), {}, {}, grads); },
        {op.c_str(), "'dbias_k_slope'", "T=6"});
    grads.dbias_k_slope =
        TensorView::strided(db.view().data, DType::float64, {1, 6, 2}, {12, 0, 1});
    testing::expect_error(
        [&] { forgetting_attn_backward(in.params, impl, in.d_o.view(), {}, {}, grads); },
        {op.c_str(), "'dbias_k_slope'", "without zero (broadcast) strides"});
  }
  // The cache: one token's slopes.
  ForgettingAttnCache cache(2, 4, 2, 3, 5);
  Tensor q({2, 1, 4, 3}, DType::float64), k({2, 1, 2, 3}, DType::float64),
      v({2, 1, 2, 5}, DType::float64),
      g = Tensor::zeros({2, 1, 4}), out({2, 1, 4, 5}, DType::float64), a = Tensor::zeros({2, 1, 4}),
      b = Tensor::zeros({2, 1, 2});
  Tensor a_bad = Tensor::zeros({2, 1, 2}), b_inf = b;
  b_inf.set(1, -kInf);
  const std::string op = "ForgettingAttnCache::step";
  testing::expect_error(
      [&] {
        cache.step(q.view(), k.view(), v.view(), g.view(), out.view(), std::nullopt, {},
                   RotaryLayout::half_split, a_bad.view(), b.view());
      },
      {op.c_str(), "'bias_q_slope'", "num_q_heads=4"});
  testing::expect_error(
      [&] {
        cache.step(q.view(), k.view(), v.view(), g.view(), out.view(), std::nullopt, {},
                   RotaryLayout::half_split, a.view(), b_inf.view());
      },
      {op.c_str(), "'bias_k_slope'", "finite"});
  EXPECT_EQ(cache.length(), 0);
}

TEST(ForgettingAttnErrors, BadArgumentsNameTheArgument) {
  std::mt19937_64 rng(12);
  const Problem p = make_problem({1, 6, 4, 2, 3, 5}, Gates::realistic, rng);
  Tensor o({1, 6, 4, 5}, DType::float64), lse({1, 6, 4}, DType::float64);
  auto forward = [&](ForgettingAttnParams params, Impl impl = Impl::chunk,
                     TensorView out = TensorView{}, TensorView out_lse = TensorView{}) {
    forgetting_attn_forward(params, impl, out.defined() ? out : o.view(), out_lse);
  };
  const Inputs in(p);
  const ForgettingAttnParams good = in.params;
  EXPECT_NO_THROW(forward(good));

  Tensor q3({1, 6, 4}, DType::float64), k_bad_h({1, 6, 3, 3}, DType::float64),
      k_bad_k({1, 6, 2, 4}, DType::float64), v_bad_t({1, 5, 2, 5}, DType::float64),
      g_bad({1, 6, 2}, DType::float64), q_int({1, 6, 4, 3}, DType::int32),
      g_pos = p.g, o_bad({1, 6, 4, 4}, DType::float64), lse_bad({1, 6, 3}, DType::float64);
  g_pos.set(7, 0.5);
  auto with = [&](auto field, const Tensor& t) {
    ForgettingAttnParams params = good;
    params.*field = t.view();
    return params;
  };
  using P = ForgettingAttnParams;
  testing::expect_error([&] { forward(with(&P::q, q3)); },
                        {"parallel_forgetting_attn", "'q'", "4-D", "[1, 6, 4]"});
  testing::expect_error([&] { forward(with(&P::q, q_int)); },
                        {"'q'", "float32, float64, bfloat16 or float16", "int32"});
  testing::expect_error([&] { forward(with(&P::k, k_bad_h)); }, {"'k'", "HQ = 4", "H = 3"});
  testing::expect_error([&] { forward(with(&P::k, k_bad_k)); },
                        {"'k'", "K (as q)=3", "[1, 6, 2, 4]"});
  testing::expect_error([&] { forward(with(&P::v, v_bad_t)); }, {"'v'", "T=6", "[1, 5, 2, 5]"});
  testing::expect_error([&] { forward(with(&P::g, g_bad)); }, {"'g'", "HQ (as q)=4", "[1, 6, 2]"});
  testing::expect_error([&] { forward(with(&P::g, g_pos), Impl::recurrent); },
                        {"forgetting_attn_recurrent", "'g'", "<= 0", "0.5"});
  {
    ForgettingAttnParams params = good;
    params.window_size = 0;
    testing::expect_error([&] { forward(params, Impl::reference); },
                          {"forgetting_attn_reference", "'window_size'", ">= 1", "got 0"});
    params = good;
    params.block_size = 0;
    testing::expect_error([&] { forward(params); }, {"'block_size'", "positive", "got 0"});
    params = good;
    params.scale = kInf;
    testing::expect_error([&] { forward(params); }, {"'scale'", "finite"});
  }
  // cu_seqlens: wrong end, decreasing, with B > 1, wrong dtype.
  {
    ForgettingAttnParams params = good;
    Tensor cu_end = testing::cu_seqlens({2, 3}),
           cu_down = Tensor::from({3}, {0, 4, 2}, DType::int64);
    Tensor cu_float = Tensor::from({3}, {0, 2, 6}, DType::float64);
    params.cu_seqlens = cu_end.view();
    testing::expect_error([&] { forward(params); }, {"'cu_seqlens'", "T = 6"});
    params.cu_seqlens = cu_down.view();
    testing::expect_error([&] { forward(params); }, {"'cu_seqlens'", "non-decreasing"});
    params.cu_seqlens = cu_float.view();
    testing::expect_error([&] { forward(params); }, {"'cu_seqlens'", "int32 or int64"});
    Problem two = make_problem({2, 6, 4, 2, 3, 5}, Gates::realistic, rng);
    Inputs two_in(two);
    Tensor o2({2, 6, 4, 5}, DType::float64), cu = testing::cu_seqlens({3, 3});
    two_in.params.cu_seqlens = cu.view();
    testing::expect_error([&] { forgetting_attn_forward(two_in.params, Impl::chunk, o2.view()); },
                          {"'cu_seqlens'", "B = 1", "B = 2"});
  }
  // Outputs.
  testing::expect_error([&] { forward(good, Impl::chunk, o_bad.view()); }, {"'o'", "V=5"});
  testing::expect_error([&] { forward(good, Impl::chunk, o.view(), lse_bad.view()); },
                        {"'lse'", "HQ=4"});
  // Backward: d_o, o, lse and gradient shapes.
  Tensor dq_bad({1, 6, 2, 3}, DType::float64), dg_bad({1, 6, 4, 1}, DType::float64),
      d_o({1, 6, 4, 5}, DType::float64);
  testing::expect_error(
      [&] { forgetting_attn_backward(good, Impl::chunk, o_bad.view(), {}, {}, {}); },
      {"'d_o'", "V=5"});
  testing::expect_error(
      [&] { forgetting_attn_backward(good, Impl::chunk, d_o.view(), o_bad.view(), {}, {}); },
      {"'o'", "V=5"});
  testing::expect_error(
      [&] { forgetting_attn_backward(good, Impl::chunk, d_o.view(), {}, lse_bad.view(), {}); },
      {"'lse'", "HQ=4"});
  testing::expect_error(
      [&] {
        forgetting_attn_backward(good, Impl::recurrent, d_o.view(), {}, {},
                                 make_grads(dq_bad.view(), {}, {}, {}));
      },
      {"forgetting_attn_recurrent", "'dq'", "HQ=4"});
  testing::expect_error(
      [&] {
        forgetting_attn_backward(good, Impl::chunk, d_o.view(), {}, {},
                                 make_grads({}, {}, {}, dg_bad.view()));
      },
      {"'dg'", "HQ=4", "[1, 6, 4, 1]"});
}

// θ with the query heads' count, θ with odd K, dθ without θ, dθ of the wrong shape or with a zero
// stride (would make work items race): phasor::Error naming 'theta' / 'dtheta'.
TEST(ForgettingAttnErrors, BadRotationArgumentsNameThetaOrDtheta) {
  std::mt19937_64 rng(27);
  const Problem p = make_problem({1, 6, 4, 2, 4, 5}, Gates::realistic, rng);
  const Inputs in(p);
  Tensor o({1, 6, 4, 5}, DType::float64), theta({1, 6, 2, 2}, DType::float64),
      theta_hq({1, 6, 4, 2}, DType::float64), theta_k({1, 6, 2, 4}, DType::float64),
      dtheta_bad({1, 6, 2, 3}, DType::float64), dtheta(theta.shape(), DType::float64);
  for (Impl impl : kImpls) {
    SCOPED_TRACE(to_string(impl));
    ForgettingAttnParams params = in.params;
    params.theta = theta_hq.view();
    testing::expect_error([&] { forgetting_attn_forward(params, impl, o.view()); },
                          {"argument 'theta'", "H (key heads)=2", "[1, 6, 4, 2]"});
    params.theta = theta_k.view();
    testing::expect_error([&] { forgetting_attn_forward(params, impl, o.view()); },
                          {"argument 'theta'", "K/2=2", "[1, 6, 2, 4]"});
    params.theta = {};
    testing::expect_error(
        [&] {
          forgetting_attn_backward(params, impl, in.d_o.view(), {}, {},
                                   make_grads({}, {}, {}, {}, dtheta.view()));
        },
        {"argument 'dtheta'", "theta to be given", "without theta"});
    params.theta = theta.view();
    testing::expect_error(
        [&] {
          forgetting_attn_backward(params, impl, in.d_o.view(), {}, {},
                                   make_grads({}, {}, {}, {}, dtheta_bad.view()));
        },
        {"argument 'dtheta'", "K/2=2", "[1, 6, 2, 3]"});
    const TensorView broadcast =
        TensorView::strided(dtheta.view().data, DType::float64, {1, 6, 2, 2}, {24, 4, 0, 1});
    testing::expect_error(
        [&] {
          forgetting_attn_backward(params, impl, in.d_o.view(), {}, {},
                                   make_grads({}, {}, {}, {}, broadcast));
        },
        {"argument 'dtheta'", "no zero strides", "dimension 2"});
    EXPECT_NO_THROW(forgetting_attn_backward(params, impl, in.d_o.view(), {}, {},
                                             make_grads({}, {}, {}, {}, dtheta.view())));
  }
  // Odd K (3): no rotation pairs.
  const Problem odd = make_problem({1, 6, 4, 2, 3, 5}, Gates::realistic, rng);
  Inputs odd_in(odd);
  Tensor theta1({1, 6, 2, 1}, DType::float64);
  odd_in.params.theta = theta1.view();
  testing::expect_error(
      [&] { forgetting_attn_forward(odd_in.params, Impl::chunk, o.view()); },
      {"parallel_forgetting_attn", "argument 'theta'", "even head dimension", "K = 3"});
}

TEST(ForgettingAttnErrors, CacheBadArguments) {
  testing::expect_error([] { ForgettingAttnCache(1, 3, 2, 4, 4); },
                        {"ForgettingAttnCache", "'num_q_heads'", "multiple of num_kv_heads = 2"});
  testing::expect_error([] { ForgettingAttnCache(1, 2, 2, 4, 4, 0); },
                        {"ForgettingAttnCache", "'window_size'"});
  testing::expect_error([] { ForgettingAttnCache(0, 2, 2, 4, 4); }, {"'batch'"});

  ForgettingAttnCache cache(2, 4, 2, 3, 5);
  Tensor q({2, 1, 4, 3}, DType::float32), k({2, 1, 2, 3}, DType::float32),
      v({2, 1, 2, 5}, DType::float32), g({2, 1, 4}, DType::float32),
      o({2, 1, 4, 5}, DType::float32);
  Tensor q_two_tokens({2, 2, 4, 3}, DType::float32), k_bad({2, 1, 2, 4}, DType::float32),
      v_bad({2, 1, 1, 5}, DType::float32), g_bad({2, 1, 2}, DType::float32),
      o_bad({2, 1, 4, 4}, DType::float32), q64({2, 1, 4, 3}, DType::float64), g_pos = g;
  g_pos.set(3, 1.0);
  const std::string op = "ForgettingAttnCache::step";
  testing::expect_error(
      [&] { cache.step(q_two_tokens.view(), k.view(), v.view(), g.view(), o.view()); },
      {op.c_str(), "'q'", "1 (one token)=1", "[2, 2, 4, 3]"});
  testing::expect_error([&] { cache.step(q.view(), k_bad.view(), v.view(), g.view(), o.view()); },
                        {op.c_str(), "'k'", "head_dim=3"});
  testing::expect_error([&] { cache.step(q.view(), k.view(), v_bad.view(), g.view(), o.view()); },
                        {op.c_str(), "'v'", "num_kv_heads=2"});
  testing::expect_error([&] { cache.step(q.view(), k.view(), v.view(), g_bad.view(), o.view()); },
                        {op.c_str(), "'g'", "num_q_heads=4"});
  testing::expect_error([&] { cache.step(q.view(), k.view(), v.view(), g.view(), o_bad.view()); },
                        {op.c_str(), "'o'", "value_dim=5"});
  testing::expect_error([&] { cache.step(q.view(), k.view(), v.view(), g_pos.view(), o.view()); },
                        {op.c_str(), "'g'", "<= 0"});
  EXPECT_EQ(cache.length(), 0);  // nothing was appended by a failed step
  cache.step(q.view(), k.view(), v.view(), g.view(), o.view());
  testing::expect_error([&] { cache.step(q64.view(), k.view(), v.view(), g.view(), o.view()); },
                        {op.c_str(), "'q'", "computed in float32", "dtype float64"});
  EXPECT_EQ(cache.length(), 1);
}

}  // namespace
}  // namespace phasor
