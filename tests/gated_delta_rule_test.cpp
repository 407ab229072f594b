// Tests of the Gated DeltaNet op (gated delta rule): the float64 reference against central finite
// differences, the recurrent and chunk kernels (float32 and float64) against the reference on
// random and adversarial inputs, long sequences, decoding, thread invariance and bad inputs; the
// fused rotation by θ (RoPE / Selective RoPE) against rotating q and k explicitly, its dθ against
// finite differences, and its relative-position invariance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "phasor/gated_delta_rule.h"
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

// ---------------------------------------------------------------------------------------------
// Inputs

enum class Gates {
  realistic,  // log σ(x), x ~ N(2, 1): g ≈ −0.13
  strong,     // g ∈ [−20, −15]: the state is all but erased at every token
  zero,       // realistic, but ~30 % of the tokens (and the first) have g = −inf (a gate of 0)
  weak,       // g ∈ [−1e−3, 0], a quarter exactly 0
  none,       // g = 0: no decay at all
  mixed,      // each token one of −inf, −20, realistic, weak, 0
};

// Memory layouts of the tensor arguments. Both strided layouts pad the innermost memory
// dimension, so no stride is the contiguous one.
enum class Layout {
  contiguous,
  swapped,     // dims 1 and 2 swapped in memory ([B, H, T, D]): rows contiguous, strided apart
  transposed,  // dim 1 innermost in memory ([B, H, D, T]): no dimension has stride 1
};

struct Case {
  std::string name;
  std::int64_t B = 1, T = 16, H = 1, HV = 1, K = 4, V = 4;
  std::vector<std::int64_t> lengths;  // non-empty: packed sequences (cu_seqlens), B = 1
  bool initial_state = true;
  bool l2norm = true;
  std::int64_t chunk_size = 16;
  std::optional<double> scale;
  Gates gates = Gates::realistic;
  double beta_lo = 0.0, beta_hi = 2.0;
  // Without the in-kernel normalisation, keys are drawn N(0, key_std² / K), so ‖k‖ ≈ key_std and
  // the transitions I − β k kᵀ stay (mostly) contractive, as in real models.
  double key_std = 0.7;
  Layout layout = Layout::contiguous;  // of every tensor argument and output
  std::uint64_t seed = 1;
  // Fused rotation: θ [B, T, H, K/2] drawn as theta_offset + N(0, theta_std²) (K must be even).
  bool rotation = false;
  RotaryLayout rotary_layout = RotaryLayout::half_split;
  double theta_std = 3.0, theta_offset = 0.0;
};

// The logical (contiguous float64) inputs of a case and the cotangents of its outputs.
struct Data {
  Case c;
  std::int64_t B = 0, T = 0, N = 0;
  Tensor q, k, v, g, beta, h0, cu;  // h0 / cu undefined when absent
  Tensor d_o, d_ht;
  Tensor theta;  // undefined without rotation
};

Tensor make_gates(const std::vector<std::int64_t>& shape, Gates kind, std::mt19937_64& rng) {
  Tensor g = testing::log_sigmoid_gates(shape, rng);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double x = u(rng);
    switch (kind) {
      case Gates::realistic:
        break;
      case Gates::strong:
        g.set(i, -15.0 - 5.0 * x);
        break;
      case Gates::zero:
        if (x < 0.3) g.set(i, -kInf);
        break;
      case Gates::weak:
        g.set(i, x < 0.25 ? 0.0 : -1e-3 * u(rng));
        break;
      case Gates::none:
        g.set(i, 0.0);
        break;
      case Gates::mixed: {
        const double choices[] = {-kInf, -20.0, g.at(i), -1e-3 * u(rng), 0.0};
        g.set(i, choices[std::min(4, static_cast<int>(x * 5))]);
        break;
      }
    }
  }
  if (kind == Gates::zero)  // the very first token of each row/head closes the gate too
    for (std::int64_t i = 0; i < shape.back(); ++i) g.set(i, -kInf);
  return g;
}

Data make_data(const Case& c) {
  std::mt19937_64 rng(c.seed);
  Data d;
  d.c = c;
  const testing::Batch batch = testing::batch_of(c.B, c.T, c.lengths);
  d.B = batch.B, d.T = batch.T, d.N = batch.N;
  d.q = testing::randn({d.B, d.T, c.H, c.K}, rng);
  d.k = testing::randn({d.B, d.T, c.H, c.K}, rng,
                       c.l2norm ? 1.0 : c.key_std / std::sqrt(static_cast<double>(c.K)));
  d.v = testing::randn({d.B, d.T, c.HV, c.V}, rng);
  d.g = make_gates({d.B, d.T, c.HV}, c.gates, rng);
  d.beta = testing::uniform({d.B, d.T, c.HV}, rng, c.beta_lo, c.beta_hi);
  if (c.initial_state) d.h0 = testing::randn({d.N, c.HV, c.K, c.V}, rng, 0.5);
  d.cu = batch.cu_seqlens;
  d.d_o = testing::randn({d.B, d.T, c.HV, c.V}, rng);
  d.d_ht = testing::randn({d.N, c.HV, c.K, c.V}, rng);
  if (c.rotation) {  // drawn last: the other inputs do not depend on whether θ is used
    d.theta = testing::randn({d.B, d.T, c.H, c.K / 2}, rng, c.theta_std);
    for (std::int64_t i = 0; i < d.theta.numel(); ++i)
      d.theta.set(i, d.theta.at(i) + c.theta_offset);
  }
  return d;
}

// A tensor argument as the op sees it: owned storage and a view of it, in a case's Layout. Both
// strided layouts pad the innermost memory dimension by one element (tensors of rank < 3 stay
// contiguous).
using Arg = testing::StridedTensor;

testing::MemoryLayout memory_layout(int rank, Layout layout) {
  if (layout == Layout::contiguous || rank < 3) return testing::MemoryLayout::contiguous();
  return layout == Layout::swapped ? testing::MemoryLayout::swap_1_2(rank, 1)
                                   : testing::MemoryLayout::dim_1_innermost(rank, 1);
}

Arg make_arg(const Tensor& logical, DType dtype, Layout layout) {
  return Arg(logical, dtype, memory_layout(logical.rank(), layout));
}

// An output buffer, filled with NaN so that any element the op fails to write shows.
Arg make_output(const std::vector<std::int64_t>& shape, DType dtype, Layout layout) {
  return Arg::nans(shape, dtype, memory_layout(static_cast<int>(shape.size()), layout));
}

// The logical float64 contents of an argument.
Tensor gather(const Arg& a) {
  return a.gather().to(DType::float64);
}

struct Result {
  Tensor o, ht, dq, dk, dv, dg, dbeta, dh0, dtheta;
  Tensor chunk_states;  // when run() was asked to keep them (not among fields())
  Tensor v_new;         // likewise
  testing::NamedTensors fields() const {
    return {{"o", &o},   {"final_state", &ht}, {"dq", &dq},   {"dk", &dk},        {"dv", &dv},
            {"dg", &dg}, {"dbeta", &dbeta},    {"dh0", &dh0}, {"dtheta", &dtheta}};
  }
};

GatedDeltaRuleGrads make_grads(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const TensorView& dg, const TensorView& dbeta, const TensorView& dh0,
                               const TensorView& dtheta = {}) {
  GatedDeltaRuleGrads grads;
  grads.dq = dq;
  grads.dk = dk;
  grads.dv = dv;
  grads.dg = dg;
  grads.dbeta = dbeta;
  grads.dh0 = dh0;
  grads.dtheta = dtheta;
  return grads;
}

// The case's problem over its float64 data as stored (what run() passes in float64, without the
// copy into the case's layout).
GatedDeltaRuleParams params_of(const Data& d) {
  const Case& c = d.c;
  GatedDeltaRuleParams p;
  p.q = d.q.view(), p.k = d.k.view(), p.v = d.v.view(), p.g = d.g.view(), p.beta = d.beta.view();
  p.initial_state = d.h0.view();
  p.cu_seqlens = d.cu.view();
  p.scale = c.scale;
  p.use_qk_l2norm_in_kernel = c.l2norm;
  p.chunk_size = c.chunk_size;
  p.theta = d.theta.view();
  p.rotary_layout = c.rotary_layout;
  return p;
}

// Runs forward (and backward) of `impl` on the case's inputs converted to `dtype`; outputs are
// written in `dtype` too. With chunk_states, the forward keeps them in that dtype (NaN where it
// writes nothing) and the backward reads them; with v_new as well, U_new beside them, in the same
// dtype.
Result run(const Data& d, Impl impl, DType dtype, bool backward = true,
           std::optional<DType> chunk_states = std::nullopt, bool v_new = false) {
  const Case& c = d.c;
  const Layout st = c.layout;
  const Arg q = make_arg(d.q, dtype, st), k = make_arg(d.k, dtype, st),
            v = make_arg(d.v, dtype, st);
  const Arg g = make_arg(d.g, dtype, st), beta = make_arg(d.beta, dtype, st);
  const Arg h0 = make_arg(d.h0, dtype, st);
  const Arg theta = make_arg(d.theta, dtype, st);
  GatedDeltaRuleParams p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  p.g = g.view();
  p.beta = beta.view();
  p.initial_state = h0.view();
  if (d.cu.defined()) p.cu_seqlens = d.cu.view();
  p.scale = c.scale;
  p.use_qk_l2norm_in_kernel = c.l2norm;
  p.chunk_size = c.chunk_size;
  p.theta = theta.view();
  p.rotary_layout = c.rotary_layout;
  Arg o = make_output({d.B, d.T, c.HV, c.V}, dtype, st);
  Arg ht = make_output({d.N, c.HV, c.K, c.V}, dtype, st);
  Arg kept;
  if (chunk_states)
    kept = make_output({num_chunk_states(p.q, p.cu_seqlens, c.chunk_size), c.HV, c.K, c.V},
                       *chunk_states, st);
  Arg kept_v_new;
  if (chunk_states && v_new) kept_v_new = make_output({d.B, d.T, c.HV, c.V}, *chunk_states, st);
  gated_delta_rule_forward(p, impl, o.view(), ht.view(), kept.view(), kept_v_new.view());
  Result r;
  r.o = gather(o);
  r.ht = gather(ht);
  if (kept.defined()) r.chunk_states = gather(kept);
  if (kept_v_new.defined()) r.v_new = gather(kept_v_new);
  if (!backward) return r;
  const Arg d_o = make_arg(d.d_o, dtype, st), d_ht = make_arg(d.d_ht, dtype, st);
  Arg dq = make_output({d.B, d.T, c.H, c.K}, dtype, st);
  Arg dk = make_output({d.B, d.T, c.H, c.K}, dtype, st);
  Arg dv = make_output({d.B, d.T, c.HV, c.V}, dtype, st);
  Arg dg = make_output({d.B, d.T, c.HV}, dtype, st);
  Arg dbeta = make_output({d.B, d.T, c.HV}, dtype, st);
  Arg dh0 = c.initial_state ? make_output({d.N, c.HV, c.K, c.V}, dtype, st) : Arg{};
  Arg dtheta = d.theta.defined() ? make_output(d.theta.shape(), dtype, st) : Arg{};
  gated_delta_rule_backward(p, impl, d_o.view(), d_ht.view(),
                            make_grads(dq.view(), dk.view(), dv.view(), dg.view(), dbeta.view(),
                                       dh0.view(), dtheta.view()),
                            kept.view(), kept_v_new.view());
  r.dq = gather(dq);
  r.dk = gather(dk);
  r.dv = gather(dv);
  r.dg = gather(dg);
  r.dbeta = gather(dbeta);
  r.dh0 = gather(dh0);
  r.dtheta = gather(dtheta);
  return r;
}

void expect_close(const Result& actual, const Result& expected, double tol,
                  const std::string& what) {
  testing::expect_close(actual.fields(), expected.fields(), tol, what);
}

void expect_bit_equal(const Result& a, const Result& b, const std::string& what) {
  testing::expect_bit_equal(a.fields(), b.fields(), what);
}

// ---------------------------------------------------------------------------------------------
// The reference against finite differences

// Σ o·d_o + Σ final_state·d_final_state of `impl` (the reference unless told), in float64.
double loss(const Data& d, Impl impl = Impl::reference) {
  const Result r = run(d, impl, DType::float64, /*backward=*/false);
  return testing::dot(r.o, d.d_o) + testing::dot(r.ht, d.d_ht);
}

void check_reference_gradients(const Case& c) {
  Data d = make_data(c);
  const Result analytic = run(d, Impl::reference, DType::float64);
  const std::pair<const char*, std::pair<Tensor Data::*, const Tensor Result::*>> inputs[] = {
      {"q", {&Data::q, &Result::dq}},
      {"k", {&Data::k, &Result::dk}},
      {"v", {&Data::v, &Result::dv}},
      {"g", {&Data::g, &Result::dg}},
      {"beta", {&Data::beta, &Result::dbeta}},
      {"initial_state", {&Data::h0, &Result::dh0}},
      {"theta", {&Data::theta, &Result::dtheta}}};
  testing::FiniteDifferenceOptions options;
  options.step = 1e-5;
  for (const auto& [name, members] : inputs) {
    Tensor& x = d.*(members.first);
    if (!x.defined()) continue;
    PHASOR_EXPECT_GRADIENT(
        analytic.*(members.second), x, [&] { return loss(d); }, 1e-7,
        c.name + ": d" + name + " vs finite differences", options);
  }
}

TEST(GatedDeltaRuleReference, GradientsMatchFiniteDifferences) {
  Case c;
  c.B = 2, c.T = 7, c.H = 1, c.HV = 2, c.K = 3, c.V = 4;
  c.beta_lo = 0.2, c.beta_hi = 1.8;
  c.name = "plain";
  c.l2norm = false;
  check_reference_gradients(c);
  c.name = "l2norm";
  c.l2norm = true;
  c.seed = 2;
  check_reference_gradients(c);
}

TEST(GatedDeltaRuleReference, GradientsMatchFiniteDifferencesVarlenGroupedHeads) {
  Case c;
  c.name = "varlen";
  c.lengths = {3, 0, 6, 1};
  c.H = 2, c.HV = 4, c.K = 3, c.V = 3;
  c.l2norm = true;
  c.scale = 0.8;
  c.beta_lo = 0.0, c.beta_hi = 2.0;
  c.seed = 3;
  check_reference_gradients(c);
}

// The fused rotation: dθ (and every other gradient, through the rotated q and k) against finite
// differences of the reference, for both pair layouts, with and without the normalisation,
// grouped value heads (dθ sums over them) and packed sequences.
TEST(GatedDeltaRuleReference, GradientsMatchFiniteDifferencesWithRotation) {
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    Case c;
    c.rotation = true;
    c.rotary_layout = layout;
    c.B = 2, c.T = 6, c.H = 1, c.HV = 2, c.K = 4, c.V = 3;
    c.beta_lo = 0.2, c.beta_hi = 1.8;
    c.name = std::string("rotation plain ") + to_string(layout);
    c.l2norm = false;
    check_reference_gradients(c);
    c = Case{};
    c.rotation = true;
    c.rotary_layout = layout;
    c.name = std::string("rotation varlen l2norm ") + to_string(layout);
    c.lengths = {3, 0, 5};
    c.H = 2, c.HV = 4, c.K = 4, c.V = 2;
    c.scale = 0.8;
    c.seed = 4;
    check_reference_gradients(c);
  }
}

// With use_qk_l2norm_in_kernel the op equals the plain op on inputs normalised beforehand.
TEST(GatedDeltaRuleReference, L2NormIsNormalisationOfQAndK) {
  Case c;
  c.B = 2, c.T = 9, c.H = 2, c.HV = 2, c.K = 5, c.V = 3;
  Data d = make_data(c);
  const Result with_norm = run(d, Impl::reference, DType::float64, false);
  for (Tensor* x : {&d.q, &d.k}) {
    for (std::int64_t row = 0; row < x->numel() / c.K; ++row) {
      double sq = 0;
      for (std::int64_t i = 0; i < c.K; ++i) sq += x->at(row * c.K + i) * x->at(row * c.K + i);
      for (std::int64_t i = 0; i < c.K; ++i)
        x->set(row * c.K + i, x->at(row * c.K + i) / std::sqrt(sq + 1e-6));
    }
  }
  d.c.l2norm = false;
  const Result prenormalised = run(d, Impl::reference, DType::float64, false);
  PHASOR_EXPECT_CLOSE(with_norm.o, prenormalised.o, 1e-14, "o");
  PHASOR_EXPECT_CLOSE(with_norm.ht, prenormalised.ht, 1e-14, "final_state");
}

// A single step by hand: S_1 = e^g S_0 + β k (v − e^g S_0ᵀ k)ᵀ, o = S_1ᵀ (scale q).
TEST(GatedDeltaRuleReference, OneStepByHand) {
  const double q[] = {1.0, -2.0}, k[] = {0.5, 0.25}, v[] = {3.0}, g = std::log(0.5), beta = 1.5;
  const double S0[] = {2.0, -1.0}, scale = 0.7;  // K = 2, V = 1
  double kS = 0.5 * (k[0] * S0[0] + k[1] * S0[1]);
  double S1[2], o = 0;
  for (int i = 0; i < 2; ++i) S1[i] = 0.5 * S0[i] + beta * k[i] * (v[0] - kS);
  for (int i = 0; i < 2; ++i) o += S1[i] * scale * q[i];
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    Tensor tq = Tensor::from({1, 1, 1, 2}, {q[0], q[1]}),
           tk = Tensor::from({1, 1, 1, 2}, {k[0], k[1]});
    Tensor tv = Tensor::from({1, 1, 1, 1}, {v[0]}), tg = Tensor::from({1, 1, 1}, {g});
    Tensor tb = Tensor::from({1, 1, 1}, {beta}), th = Tensor::from({1, 1, 2, 1}, {S0[0], S0[1]});
    Tensor to({1, 1, 1, 1}, DType::float64), tht({1, 1, 2, 1}, DType::float64);
    GatedDeltaRuleParams p;
    p.q = tq.view(), p.k = tk.view(), p.v = tv.view(), p.g = tg.view(), p.beta = tb.view();
    p.initial_state = th.view();
    p.scale = scale;
    gated_delta_rule_forward(p, impl, to.view(), tht.view());
    EXPECT_NEAR(to.at(0), o, 1e-14) << to_string(impl);
    EXPECT_NEAR(tht.at(0), S1[0], 1e-14) << to_string(impl);
    EXPECT_NEAR(tht.at(1), S1[1], 1e-14) << to_string(impl);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels against the reference

std::vector<Case> adversarial_cases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& name, auto&& edit) {
    Case c;
    c.name = name;
    c.seed = cases.size() + 10;
    edit(c);
    cases.push_back(c);
  };
  add("random", [](Case& c) { c.B = 2, c.T = 37, c.H = 2, c.HV = 2, c.K = 8, c.V = 6; });
  add("strong_gates", [](Case& c) { c.T = 29, c.gates = Gates::strong, c.chunk_size = 7; });
  add("zero_gates", [](Case& c) { c.B = 2, c.T = 29, c.gates = Gates::zero, c.chunk_size = 7; });
  add("weak_gates", [](Case& c) { c.T = 40, c.gates = Gates::weak; });
  add("no_decay", [](Case& c) { c.T = 21, c.gates = Gates::none, c.chunk_size = 8; });
  add("mixed_gates", [](Case& c) { c.T = 45, c.H = 2, c.HV = 4, c.gates = Gates::mixed; });
  add("beta_zero", [](Case& c) { c.T = 19, c.beta_lo = c.beta_hi = 0.0, c.chunk_size = 8; });
  add("beta_one", [](Case& c) { c.T = 19, c.beta_lo = c.beta_hi = 1.0, c.chunk_size = 8; });
  add("beta_two", [](Case& c) { c.T = 19, c.beta_lo = c.beta_hi = 2.0, c.chunk_size = 8; });
  add("beta_high_no_decay", [](Case& c) {
    c.T = 33, c.beta_lo = 1.5, c.beta_hi = 2.0, c.gates = Gates::none, c.chunk_size = 16;
  });
  add("chunk_1", [](Case& c) { c.T = 9, c.chunk_size = 1; });
  add("chunk_7", [](Case& c) { c.T = 23, c.chunk_size = 7; });
  add("chunk_16", [](Case& c) { c.T = 50, c.chunk_size = 16, c.K = 6, c.V = 5; });
  add("chunk_64", [](Case& c) { c.T = 150, c.chunk_size = 64, c.K = 16, c.V = 16; });
  add("chunk_longer_than_sequence", [](Case& c) { c.T = 20, c.chunk_size = 64; });
  add("T_1", [](Case& c) { c.B = 3, c.T = 1; });
  add("K_1", [](Case& c) { c.T = 17, c.K = 1, c.V = 5, c.chunk_size = 8; });
  add("K_less_than_V", [](Case& c) { c.T = 17, c.K = 3, c.V = 9, c.chunk_size = 8; });
  add("K_more_than_V", [](Case& c) { c.T = 17, c.K = 9, c.V = 3, c.chunk_size = 8; });
  add("grouped_2", [](Case& c) { c.B = 2, c.T = 21, c.H = 2, c.HV = 4, c.chunk_size = 8; });
  add("grouped_4", [](Case& c) { c.T = 21, c.H = 1, c.HV = 4, c.chunk_size = 8; });
  add("varlen", [](Case& c) { c.lengths = {5, 0, 1, 17, 0, 9}, c.HV = 2, c.chunk_size = 4; });
  add("varlen_no_initial_state", [](Case& c) {
    c.lengths = {0, 3, 12, 1}, c.initial_state = false, c.chunk_size = 4;
  });
  add("no_initial_state",
      [](Case& c) { c.B = 2, c.T = 13, c.initial_state = false, c.chunk_size = 4; });
  add("no_l2norm", [](Case& c) { c.B = 2, c.T = 30, c.l2norm = false, c.chunk_size = 8; });
  add("no_l2norm_scale_beta_two", [](Case& c) {
    c.T = 30, c.l2norm = false, c.scale = 0.3, c.beta_lo = c.beta_hi = 2.0, c.key_std = 0.9;
  });
  add("T_0", [](Case& c) { c.B = 2, c.T = 0; });
  // V = 16, 48, 128: the recurrent forward's float32 step in registers (AVX-512).
  add("V_48_beta_two", [](Case& c) {
    c.T = 33, c.K = 7, c.V = 48, c.HV = 2, c.H = 1, c.l2norm = false, c.beta_lo = c.beta_hi = 2.0;
  });
  add("V_128_mixed_gates",
      [](Case& c) { c.B = 2, c.T = 12, c.K = 5, c.V = 128, c.gates = Gates::mixed; });
  add("V_16_varlen", [](Case& c) { c.lengths = {9, 0, 1, 14}, c.K = 16, c.V = 16; });
  // Few value heads with V wider than a value tile (64): the chunk forward and backward run in
  // value tiles (three here, the last 22 wide).
  add("value_tiles_varlen_grouped", [](Case& c) {
    c.lengths = {30, 0, 45}, c.H = 1, c.HV = 2, c.K = 6, c.V = 150, c.chunk_size = 8;
    c.gates = Gates::mixed;
  });
  add("value_tiles_no_initial_state", [](Case& c) {
    c.T = 21, c.K = 5, c.V = 65, c.chunk_size = 4, c.initial_state = false;
    c.layout = Layout::transposed;
  });
  add("swapped_layout", [](Case& c) {
    c.B = 2, c.T = 19, c.H = 2, c.HV = 4, c.layout = Layout::swapped, c.chunk_size = 8;
  });
  add("transposed_layout", [](Case& c) {
    c.B = 2, c.T = 19, c.H = 2, c.HV = 4, c.layout = Layout::transposed, c.chunk_size = 8;
  });
  add("strided_varlen_mixed_gates", [](Case& c) {
    c.lengths = {7, 0, 12}, c.H = 1, c.HV = 2, c.layout = Layout::swapped, c.gates = Gates::mixed;
    c.chunk_size = 5;
  });
  // Fused rotation by θ (the reference rotates with its own plain loops).
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    const std::string suffix = layout == RotaryLayout::half_split ? "_half_split" : "_interleaved";
    auto add_rotation = [&](const std::string& name, auto&& edit) {
      add(name + suffix, [&](Case& c) {
        c.rotation = true;
        c.rotary_layout = layout;
        edit(c);
      });
    };
    add_rotation("rotation", [](Case& c) {
      c.B = 2, c.T = 29, c.H = 2, c.HV = 4, c.K = 8, c.V = 6, c.chunk_size = 8;
    });
    add_rotation("rotation_no_l2norm", [](Case& c) {
      c.B = 2, c.T = 30, c.l2norm = false, c.chunk_size = 8, c.K = 6, c.V = 3;
    });
    add_rotation("rotation_varlen", [](Case& c) {
      c.lengths = {5, 0, 13, 1}, c.HV = 2, c.K = 6, c.V = 3, c.chunk_size = 4;
    });
    add_rotation("rotation_chunk_1", [](Case& c) { c.T = 9, c.chunk_size = 1; });
    add_rotation("rotation_chunk_longer_than_sequence",
                 [](Case& c) { c.T = 20, c.chunk_size = 64, c.K = 2, c.V = 5; });
    add_rotation("rotation_mixed_gates",
                 [](Case& c) { c.T = 45, c.H = 2, c.HV = 4, c.gates = Gates::mixed; });
    // Running phases of thousands of radians, as Selective RoPE produces on long sequences.
    add_rotation("rotation_large_angles", [](Case& c) {
      c.T = 23, c.theta_offset = 3000.0, c.theta_std = 500.0, c.chunk_size = 8;
    });
    add_rotation("rotation_value_tiles",
                 [](Case& c) { c.T = 26, c.K = 8, c.V = 130, c.chunk_size = 8; });
    add_rotation("rotation_transposed_layout", [](Case& c) {
      c.B = 2, c.T = 19, c.H = 2, c.HV = 4, c.layout = Layout::transposed, c.chunk_size = 8;
    });
  }
  return cases;
}

class GatedDeltaRuleKernels : public ::testing::TestWithParam<Case> {};

// With the kernels' subnormals flushed (the default) and with gradual underflow: strong gates'
// decay factors go subnormal, and the bound holds either way.
TEST_P(GatedDeltaRuleKernels, MatchReference) {
  const Data d = make_data(GetParam());
  for (DType dtype : {DType::float64, DType::float32}) {
    // The reference computes in float64 from the same (possibly float32-rounded) inputs.
    const Result expected = run(d, Impl::reference, dtype);
    const double tol = dtype == DType::float64 ? 1e-10 : 1e-5;
    for (bool flush : testing::kFlushDenormalModes) {
      const testing::FlushDenormalsScope modes(flush);
      for (Impl impl : {Impl::recurrent, Impl::chunk}) {
        const Result actual = run(d, impl, dtype);
        expect_close(actual, expected, tol,
                     std::string(to_string(impl)) + " " + to_string(dtype) +
                         (flush ? " flushing subnormals" : " gradual underflow"));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Adversarial, GatedDeltaRuleKernels,
                         ::testing::ValuesIn(adversarial_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Chunk backward against recurrent backward on a longer input, several chunk sizes.
TEST(GatedDeltaRuleKernels, ChunkMatchesRecurrent) {
  Case c;
  c.B = 1, c.T = 300, c.H = 2, c.HV = 2, c.K = 32, c.V = 24, c.gates = Gates::mixed, c.seed = 7;
  const Data base = make_data(c);
  for (DType dtype : {DType::float64, DType::float32}) {
    const Result recurrent = run(base, Impl::recurrent, dtype);
    for (std::int64_t chunk : {1, 7, 16, 64}) {
      Data d = base;
      d.c.chunk_size = chunk;
      expect_close(run(d, Impl::chunk, dtype), recurrent, dtype == DType::float64 ? 1e-10 : 1e-5,
                   "chunk_size " + std::to_string(chunk) + " " + to_string(dtype));
    }
  }
}

// Requesting only some gradients, or no d_final_state, gives the same values as the full call.
TEST(GatedDeltaRuleKernels, OptionalGradientsAndFinalStateGradient) {
  Case c;
  c.B = 2, c.T = 11, c.H = 1, c.HV = 2, c.chunk_size = 4;
  Data d = make_data(c);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    const Result full = run(d, impl, DType::float64);
    const GatedDeltaRuleParams p = params_of(d);
    Tensor dq = Tensor::zeros(d.q.shape()), dbeta = Tensor::zeros(d.beta.shape());
    dq.fill(kNaN);
    dbeta.fill(kNaN);
    gated_delta_rule_backward(p, impl, d.d_o.view(), d.d_ht.view(),
                              make_grads(dq.view(), {}, {}, {}, dbeta.view(), {}));
    EXPECT_TRUE(dq.bit_equal(full.dq)) << to_string(impl);
    EXPECT_TRUE(dbeta.bit_equal(full.dbeta)) << to_string(impl);

    // No d_final_state: as if it were zero.
    Data zero_dht = d;
    zero_dht.d_ht.fill(0.0);
    const Result expected = run(zero_dht, impl, DType::float64);
    Tensor dv = Tensor::zeros(d.v.shape()), dh0 = Tensor::zeros(d.h0.shape());
    gated_delta_rule_backward(p, impl, d.d_o.view(), {},
                              make_grads({}, {}, dv.view(), {}, {}, dh0.view()));
    EXPECT_TRUE(dv.bit_equal(expected.dv)) << to_string(impl);
    EXPECT_TRUE(dh0.bit_equal(expected.dh0)) << to_string(impl);
  }
}

// The chunk kernel leaves out the products of a state known to be zero (no initial state: the
// first chunk's), of a gradient known to be zero (no d_final_state: the last chunk's) and those
// nothing reads (no final state, no dh0). The same bits as with those zeros given explicitly and
// every output asked for: one chunk (the task harness's case) and several, on one thread (by
// item) and eight (by tile for these few items).
TEST(GatedDeltaRuleKernels, KnownZeroStatesGiveTheBitsOfExplicitZeros) {
  for (std::int64_t T : {16, 40})
    for (int threads : {1, 8}) {
      set_num_threads(threads);
      Case c;
      c.B = 2, c.T = T, c.H = 1, c.HV = 2, c.K = 6, c.V = 20, c.chunk_size = 16;
      c.initial_state = false;
      const Data d = make_data(c);
      const std::string what =
          "T = " + std::to_string(T) + ", " + std::to_string(threads) + " thread(s)";
      GatedDeltaRuleParams p;
      p.q = d.q.view(), p.k = d.k.view(), p.v = d.v.view(), p.g = d.g.view();
      p.beta = d.beta.view();
      p.use_qk_l2norm_in_kernel = c.l2norm;
      p.chunk_size = c.chunk_size;
      const auto outputs = [&] {
        return std::vector<Tensor>{Tensor::zeros(d.q.shape()), Tensor::zeros(d.k.shape()),
                                   Tensor::zeros(d.v.shape()), Tensor::zeros(d.g.shape()),
                                   Tensor::zeros(d.beta.shape())};
      };
      // Everything known: no initial state, final state, d_final_state or dh0.
      Tensor o = Tensor::zeros(d.v.shape());
      gated_delta_rule_forward(p, Impl::chunk, o.view());
      std::vector<Tensor> g = outputs();
      gated_delta_rule_backward(
          p, Impl::chunk, d.d_o.view(), {},
          make_grads(g[0].view(), g[1].view(), g[2].view(), g[3].view(), g[4].view(), {}));
      // The same zeros given: an initial state of zeros, d_final_state zeros, every output.
      const Tensor zero_state = Tensor::zeros({d.N, c.HV, c.K, c.V});
      GatedDeltaRuleParams explicit_p = p;
      explicit_p.initial_state = zero_state.view();
      Tensor o_full = Tensor::zeros(d.v.shape()), ht = Tensor::zeros(zero_state.shape()),
             dh0 = Tensor::zeros(zero_state.shape());
      gated_delta_rule_forward(explicit_p, Impl::chunk, o_full.view(), ht.view());
      std::vector<Tensor> full = outputs();
      gated_delta_rule_backward(explicit_p, Impl::chunk, d.d_o.view(), zero_state.view(),
                                make_grads(full[0].view(), full[1].view(), full[2].view(),
                                           full[3].view(), full[4].view(), dh0.view()));
      EXPECT_TRUE(o.bit_equal(o_full)) << what << ": o";
      const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
      for (std::size_t i = 0; i < g.size(); ++i)
        EXPECT_TRUE(g[i].bit_equal(full[i])) << what << ": " << names[i];
      // Not vacuous: the gradients are not all zero.
      EXPECT_GT(testing::dot(g[2], g[2]), 0.0) << what;
    }
  set_num_threads(0);
}

// Empty sequences: final state = initial state (or 0), dh0 = d_final_state; q, k, v, g and β of
// another dtype than the outputs.
TEST(GatedDeltaRuleKernels, EmptySequencesPassStatesThrough) {
  for (bool with_h0 : {true, false}) {
    Case c;
    c.lengths = {0, 4, 0}, c.HV = 2, c.K = 3, c.V = 2, c.initial_state = with_h0, c.chunk_size = 2;
    const Data d = make_data(c);
    for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
      const Result r = run(d, impl, DType::float32);
      const std::int64_t per_seq = c.HV * c.K * c.V;
      for (std::int64_t n : {0, 2}) {
        for (std::int64_t i = n * per_seq; i < (n + 1) * per_seq; ++i) {
          EXPECT_EQ(r.ht.at(i), with_h0 ? static_cast<float>(d.h0.at(i)) : 0.0) << to_string(impl);
          if (with_h0) {
            EXPECT_EQ(r.dh0.at(i), static_cast<float>(d.d_ht.at(i))) << to_string(impl);
          }
        }
      }
    }
  }
}

// The compute type follows q; other arguments may have another dtype.
TEST(GatedDeltaRuleKernels, MixedDtypes) {
  Case c;
  c.B = 1, c.T = 20, c.H = 1, c.HV = 2, c.K = 4, c.V = 3, c.chunk_size = 8;
  const Data d = make_data(c);
  const Result expected = run(d, Impl::reference, DType::float64);
  for (Impl impl : {Impl::recurrent, Impl::chunk}) {
    const Tensor q = d.q.to(DType::float32), k = d.k.to(DType::float32);
    GatedDeltaRuleParams p;
    p.q = q.view(), p.k = k.view(), p.v = d.v.view(), p.g = d.g.view(), p.beta = d.beta.view();
    p.initial_state = d.h0.view();
    p.use_qk_l2norm_in_kernel = true;
    p.chunk_size = c.chunk_size;
    Tensor o = Tensor::zeros({1, c.T, c.HV, c.V}), ht({1, c.HV, c.K, c.V}, DType::float32);
    gated_delta_rule_forward(p, impl, o.view(), ht.view());
    // q and k are rounded to float32 on input: compare loosely with the all-float64 reference.
    PHASOR_EXPECT_CLOSE(o, expected.o, 1e-6, std::string(to_string(impl)) + " o");
    PHASOR_EXPECT_CLOSE(ht, expected.ht, 1e-6, std::string(to_string(impl)) + " final_state");
  }
}

// ---------------------------------------------------------------------------------------------
// Long sequences

TEST(GatedDeltaRuleKernels, LongSequence) {
  Case c;
  c.T = testing::long_sequence_length(), c.H = 1, c.HV = 1, c.K = 16, c.V = 16, c.chunk_size = 64;
  c.gates = Gates::realistic;
  const auto start = std::chrono::steady_clock::now();
  Data d = make_data(c);
  // Slow decay (g ≈ −0.02) so that memory spans many chunks, with gates of −20 and 0 here and
  // there.
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::int64_t t = 0; t < c.T; ++t) {
    const double x = u(rng);
    d.g.set(t, x < 0.001 ? -kInf : x < 0.002 ? -20.0 : -0.04 * u(rng));
  }
  const Result truth = run(d, Impl::recurrent, DType::float64);
  const Result chunk64 = run(d, Impl::chunk, DType::float64);
  expect_close(chunk64, truth, 1e-10, "chunk float64");
  const Result chunk32 = run(d, Impl::chunk, DType::float32);
  const Result recurrent32 = run(d, Impl::recurrent, DType::float32);
  expect_close(chunk32, truth, 1e-5, "chunk float32");
  expect_close(recurrent32, truth, 1e-5, "recurrent float32");
  std::cout << "[ long ] T = " << c.T << " relative RMS vs recurrent float64: chunk float64 o "
            << testing::rel_rms(chunk64.o, truth.o) << ", dk "
            << testing::rel_rms(chunk64.dk, truth.dk) << ", dg "
            << testing::rel_rms(chunk64.dg, truth.dg) << "; chunk float32 o "
            << testing::rel_rms(chunk32.o, truth.o) << ", dk "
            << testing::rel_rms(chunk32.dk, truth.dk) << ", dg "
            << testing::rel_rms(chunk32.dg, truth.dg) << "; recurrent float32 o "
            << testing::rel_rms(recurrent32.o, truth.o) << ", dk "
            << testing::rel_rms(recurrent32.dk, truth.dk) << ", dg "
            << testing::rel_rms(recurrent32.dg, truth.dg) << " ("
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
            << " s)\n";
  // Against the reference forward too (its backward would keep 65,537 states).
  const Result reference = run(d, Impl::reference, DType::float64, false);
  PHASOR_EXPECT_CLOSE(truth.o, reference.o, 1e-10, "recurrent vs reference o");
  PHASOR_EXPECT_CLOSE(truth.ht, reference.ht, 1e-10, "recurrent vs reference final_state");
}

// ---------------------------------------------------------------------------------------------
// Decoding token by token

// A view of time step t of a [B, T, ...] tensor, as a [B, 1, ...] tensor.
TensorView step_view(const Tensor& x, std::int64_t t) {
  return testing::token(x.view(), t);
}

TEST(GatedDeltaRuleKernels, DecodingTokenByTokenEqualsChunkForward) {
  Case c;
  c.B = 2, c.T = 20, c.H = 2, c.HV = 4, c.K = 5, c.V = 6, c.chunk_size = 8, c.gates = Gates::mixed;
  const Data base = make_data(c);
  for (DType dtype : {DType::float64, DType::float32}) {
    const Result full = run(base, Impl::chunk, dtype, false);
    const Tensor q = base.q.to(dtype), k = base.k.to(dtype), v = base.v.to(dtype);
    const Tensor g = base.g.to(dtype), beta = base.beta.to(dtype);
    for (bool in_place : {true, false}) {
      Tensor state = base.h0.to(dtype), other = base.h0.to(dtype);
      Tensor o({base.B, c.T, c.HV, c.V}, dtype);
      for (std::int64_t t = 0; t < c.T; ++t) {
        GatedDeltaRuleParams p;
        p.q = step_view(q, t), p.k = step_view(k, t), p.v = step_view(v, t);
        p.g = step_view(g, t), p.beta = step_view(beta, t);
        p.initial_state = state.view();
        p.use_qk_l2norm_in_kernel = true;
        gated_delta_rule_forward(p, Impl::recurrent, step_view(o, t),
                                 in_place ? state.view() : other.view());
        if (!in_place) std::swap(state, other);
      }
      const double tol = dtype == DType::float64 ? 1e-12 : 1e-5;
      const std::string what = std::string(to_string(dtype)) + (in_place ? " in place" : "");
      PHASOR_EXPECT_CLOSE(o.to(DType::float64), full.o, tol, what + " o");
      PHASOR_EXPECT_CLOSE(state.to(DType::float64), full.ht, tol, what + " final_state");
    }
  }
}

// Decoding with the state kept in final_state (aligned, in place) equals decoding through an owned
// copy (misaligned), bit for bit, with final_state = initial_state and with separate buffers.
TEST(GatedDeltaRuleKernels, StatesInPlaceEqualOwnedCopies) {
  for (auto [K, V] : {std::pair<std::int64_t, std::int64_t>{16, 16}, {5, 3}}) {
    Case c;
    c.B = 2, c.T = 12, c.H = 2, c.HV = 4, c.K = K, c.V = V, c.gates = Gates::mixed;
    const Data base = make_data(c);
    for (DType dtype : {DType::float64, DType::float32}) {
      const Tensor q = base.q.to(dtype), k = base.k.to(dtype), v = base.v.to(dtype);
      const Tensor g = base.g.to(dtype), beta = base.beta.to(dtype);
      std::vector<Tensor> outputs, states;
      for (int mode = 0; mode < 4; ++mode) {  // {aligned, misaligned} × {aliased, separate}
        const bool aligned = mode % 2 == 0, aliased = mode < 2;
        testing::AlignedCopy state(base.h0.to(dtype), aligned), other(base.h0.to(dtype), aligned);
        Tensor o({base.B, c.T, c.HV, c.V}, dtype);
        for (std::int64_t t = 0; t < c.T; ++t) {
          GatedDeltaRuleParams p;
          p.q = step_view(q, t), p.k = step_view(k, t), p.v = step_view(v, t);
          p.g = step_view(g, t), p.beta = step_view(beta, t);
          p.initial_state = state.view;
          p.use_qk_l2norm_in_kernel = true;
          gated_delta_rule_forward(p, Impl::recurrent, step_view(o, t),
                                   aliased ? state.view : other.view);
          if (!aliased) std::swap(state.view, other.view);
        }
        outputs.push_back(o);
        states.push_back(state.tensor());
      }
      testing::expect_in_place_runs_bit_equal(outputs, states, dtype, K);
    }
  }
}

// final_state may alias initial_state in every implementation (several value heads per item,
// several sequences).
TEST(GatedDeltaRuleKernels, FinalStateMayAliasInitialState) {
  Case c;
  c.lengths = {9, 0, 14}, c.H = 2, c.HV = 4, c.K = 5, c.V = 3, c.chunk_size = 4;
  const Data d = make_data(c);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    const Result expected = run(d, impl, DType::float64, false);
    Tensor state = d.h0;
    Tensor o(d.d_o.shape(), DType::float64);
    GatedDeltaRuleParams p;
    p.q = d.q.view(), p.k = d.k.view(), p.v = d.v.view(), p.g = d.g.view(), p.beta = d.beta.view();
    p.initial_state = state.view();
    p.cu_seqlens = d.cu.view();
    p.use_qk_l2norm_in_kernel = true;
    p.chunk_size = c.chunk_size;
    gated_delta_rule_forward(p, impl, o.view(), state.view());
    EXPECT_TRUE(o.bit_equal(expected.o)) << to_string(impl);
    EXPECT_TRUE(state.bit_equal(expected.ht)) << to_string(impl);
  }
}

TEST(GatedDeltaRuleKernels, DefaultScaleIsInverseSqrtK) {
  Case c;
  c.T = 6, c.K = 9, c.V = 2;
  Data d = make_data(c);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    d.c.scale.reset();
    const Result by_default = run(d, impl, DType::float64);
    d.c.scale = 1.0 / 3.0;
    const Result explicit_scale = run(d, impl, DType::float64);
    expect_bit_equal(by_default, explicit_scale, to_string(impl));
    d.c.scale = 0.5;
    EXPECT_FALSE(run(d, impl, DType::float64, false).o.bit_equal(by_default.o)) << to_string(impl);
  }
}

// ---------------------------------------------------------------------------------------------
// Threads

TEST(GatedDeltaRuleKernels, BitIdenticalForAnyThreadCount) {
  for (bool rotation : {false, true}) {
    Case c;
    c.B = 2, c.T = 50, c.H = 3, c.HV = 3, c.K = 8, c.V = 8, c.chunk_size = 16;
    c.gates = Gates::mixed, c.rotation = rotation;
    const Data d = make_data(c);
    for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
      set_num_threads(1);
      const Result one = run(d, impl, DType::float32);
      for (int threads : {2, 3, 2}) {
        set_num_threads(threads);
        expect_bit_equal(run(d, impl, DType::float32), one,
                         std::string(to_string(impl)) + " with " + std::to_string(threads) +
                             " threads" + (rotation ? ", rotation" : ""));
      }
      set_num_threads(0);
    }
  }
}

// The chunk forward walks one item per thread when the items keep every thread busy, and
// otherwise runs the chunks' state-independent parts in parallel and the recurrence in parallel
// over (item, value head, value tile of 64 columns): one thread runs the former on these cases,
// 2–8 threads the latter. Both must give the same bits: one item with V = 150 (three tiles, the
// last 22 wide) over 130 chunks of 2 (windows of 64), grouped value heads with a varlen batch and
// strided views, rotation. The backward likewise: one item per thread, each walking its value
// tiles in turn, on one thread; the replay, the tiles' walks back and the chunks' finish in
// parallel on 2–8.
TEST(GatedDeltaRuleKernels, ChunkParallelScheduleIsBitIdentical) {
  Case one_item;
  one_item.T = 260, one_item.K = 6, one_item.V = 150, one_item.chunk_size = 2;
  one_item.gates = Gates::mixed, one_item.rotation = true;
  Case grouped;
  grouped.T = 90, grouped.H = 1, grouped.HV = 2, grouped.K = 8, grouped.V = 70;
  grouped.lengths = {30, 0, 1, 59}, grouped.layout = Layout::swapped, grouped.l2norm = false;
  Case no_state = grouped;
  no_state.initial_state = false, no_state.lengths = {}, no_state.layout = Layout::transposed;
  for (const Case& c : {one_item, grouped, no_state}) {
    const Data d = make_data(c);
    for (DType dtype : {DType::float32, DType::float64}) {
      set_num_threads(1);
      const Result by_item = run(d, Impl::chunk, dtype);
      for (int threads : {2, 3, 8}) {
        set_num_threads(threads);
        expect_bit_equal(run(d, Impl::chunk, dtype), by_item,
                         "V = " + std::to_string(c.V) + ", " + to_string(dtype) + ", " +
                             std::to_string(threads) + " threads");
      }
    }
  }
  set_num_threads(0);
}

// Chunk states kept by the forward for the backward (chunk_states), and U_new beside them (v_new).
// In the compute dtype they change no bit: the forward's outputs and the backward's gradients are
// those of the calls without them, on every adversarial case (varlen, grouped heads, value tiles,
// strided layouts, rotation, chunk sizes 1 … 64) by item (one thread) and by tile (8 threads for
// few items), and on one item of 130 chunks in value tiles (windows).
TEST(GatedDeltaRuleChunkStates, KeptStatesChangeNoBit) {
  std::vector<Case> cases = adversarial_cases();
  Case one_item;
  one_item.name = "one_item_130_chunks";
  one_item.T = 260, one_item.K = 6, one_item.V = 150, one_item.chunk_size = 2;
  one_item.gates = Gates::mixed, one_item.rotation = true;
  cases.push_back(one_item);
  for (const Case& c : cases) {
    const Data d = make_data(c);
    for (DType dtype : {DType::float32, DType::float64}) {
      for (int threads : {1, 8}) {
        set_num_threads(threads);
        const std::string what =
            c.name + " " + to_string(dtype) + " on " + std::to_string(threads) + " threads";
        const Result plain = run(d, Impl::chunk, dtype);
        expect_bit_equal(run(d, Impl::chunk, dtype, true, dtype), plain, what);
        expect_bit_equal(run(d, Impl::chunk, dtype, true, dtype, true), plain, what + ", v_new");
      }
    }
  }
  set_num_threads(0);
}

// Each kept state is the state entering its chunk: the reference's final state after the
// sequence's tokens before that chunk (float64), at the documented index (phasor/common.h), for
// every value head; a packed batch's indices between sequences stay untouched (NaN here).
TEST(GatedDeltaRuleChunkStates, AreTheStatesEnteringEachChunk) {
  Case rows;
  rows.name = "rows_grouped";
  rows.B = 2, rows.T = 37, rows.H = 2, rows.HV = 4, rows.K = 5, rows.V = 4, rows.chunk_size = 8;
  Case packed;
  packed.name = "packed_value_tiles";
  packed.lengths = {30, 0, 1, 45}, packed.H = 1, packed.HV = 2, packed.K = 6, packed.V = 70;
  packed.chunk_size = 8, packed.gates = Gates::mixed;
  Case rotated;
  rotated.name = "rotated_no_state";
  rotated.B = 2, rotated.T = 29, rotated.K = 6, rotated.V = 3, rotated.chunk_size = 16;
  rotated.rotation = true, rotated.initial_state = false;
  for (const Case& c : {rows, packed, rotated}) {
    const Data d = make_data(c);
    for (int threads : {1, 8}) {
      set_num_threads(threads);
      SCOPED_TRACE(c.name + " on " + std::to_string(threads) + " threads");
      const Result r = run(d, Impl::chunk, DType::float64, false, DType::float64);
      const testing::BatchChunks chunks = testing::batch_chunks(d.B, d.T, d.cu, c.chunk_size);
      testing::expect_chunk_states(
          r.chunk_states, chunks, [&](const testing::BatchChunk& chunk, const Tensor& kept) {
            const auto before = [&](const Tensor& x) {
              return x.defined() ? testing::narrow(testing::narrow(x.view(), 0, chunk.batch, 1), 1,
                                                   chunk.start, chunk.before)
                                 : TensorView{};
            };
            GatedDeltaRuleParams p;
            p.q = before(d.q), p.k = before(d.k), p.v = before(d.v);
            p.g = before(d.g), p.beta = before(d.beta), p.theta = before(d.theta);
            p.scale = c.scale;
            p.use_qk_l2norm_in_kernel = c.l2norm;
            p.rotary_layout = c.rotary_layout;
            if (d.h0.defined()) p.initial_state = testing::narrow(d.h0.view(), 0, chunk.n, 1);
            Tensor o({1, chunk.before, c.HV, c.V}, DType::float64),
                state({1, c.HV, c.K, c.V}, DType::float64);
            gated_delta_rule_forward(p, Impl::reference, o.view(), state.view());
            PHASOR_EXPECT_CLOSE(
                kept, state, 1e-12,
                "sequence " + std::to_string(chunk.n) + ", slot " + std::to_string(chunk.slot));
          });
    }
  }
  set_num_threads(0);
}

// In a 16-bit dtype each state is rounded once: the forward is unchanged and the gradients stay
// close to the float64 reference.
TEST(GatedDeltaRuleChunkStates, SixteenBitStates) {
  Case c;
  c.B = 2, c.T = 100, c.H = 2, c.HV = 2, c.K = 8, c.V = 8, c.chunk_size = 16;
  const Data d = make_data(c);
  const Result expected = run(d, Impl::reference, DType::float64);
  const Result plain = run(d, Impl::chunk, DType::float32);
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    const Result kept = run(d, Impl::chunk, DType::float32, true, dtype);
    EXPECT_TRUE(kept.o.bit_equal(plain.o)) << to_string(dtype);
    EXPECT_TRUE(kept.ht.bit_equal(plain.ht)) << to_string(dtype);
    // Within one unit roundoff of the states' dtype (2^-8, 2^-11).
    expect_close(kept, expected, dtype == DType::bfloat16 ? 0x1p-8 : 0x1p-11, to_string(dtype));
    std::printf("chunk states in %s: worst relative RMS error vs reference %.2g (float32: %.2g)\n",
                to_string(dtype), testing::worst_rel_rms(kept.fields(), expected.fields()),
                testing::worst_rel_rms(plain.fields(), expected.fields()));
  }
}

// The backward reads the kept states rather than replaying its own: given those of a forward
// from another initial state h0′, it returns that problem's gradients (bit for bit), which differ
// from its own — by item and by tile.
TEST(GatedDeltaRuleChunkStates, BackwardReadsThem) {
  Case c;
  c.B = 2, c.T = 50, c.H = 1, c.HV = 2, c.K = 6, c.V = 70, c.chunk_size = 16;  // two value tiles
  const Data mine = make_data(c);
  Data theirs = mine;
  std::mt19937_64 rng(901);
  theirs.h0 = testing::randn(mine.h0.shape(), rng, 0.5);
  for (int threads : {1, 8}) {
    set_num_threads(threads);
    const std::string on = " on " + std::to_string(threads) + " threads";
    for (const bool v_new : {false, true}) {
      const std::string what = on + (v_new ? ", with v_new" : "");
      // The backward of `mine` with the chunk states (and U_new) of `theirs`' forward.
      Result read = run(theirs, Impl::chunk, DType::float64, true, DType::float64, v_new);
      {
        Tensor dq(mine.q.shape(), DType::float64), dk(mine.k.shape(), DType::float64),
            dv(mine.v.shape(), DType::float64), dg(mine.g.shape(), DType::float64),
            dbeta(mine.beta.shape(), DType::float64), dh0(mine.h0.shape(), DType::float64);
        gated_delta_rule_backward(
            params_of(mine), Impl::chunk, mine.d_o.view(), mine.d_ht.view(),
            make_grads(dq.view(), dk.view(), dv.view(), dg.view(), dbeta.view(), dh0.view()),
            read.chunk_states.view(), read.v_new.view());
        read.dq = dq, read.dk = dk, read.dv = dv, read.dg = dg, read.dbeta = dbeta, read.dh0 = dh0;
      }
      const Result replayed = run(theirs, Impl::chunk, DType::float64),
                   own = run(mine, Impl::chunk, DType::float64);
      for (const auto& [a, b] : {std::pair{&read.dq, &replayed.dq},
                                 {&read.dk, &replayed.dk},
                                 {&read.dv, &replayed.dv},
                                 {&read.dg, &replayed.dg},
                                 {&read.dbeta, &replayed.dbeta},
                                 {&read.dh0, &replayed.dh0}})
        EXPECT_TRUE(a->bit_equal(*b)) << what;
      EXPECT_FALSE(read.dq.bit_equal(own.dq)) << what;
      EXPECT_FALSE(read.dbeta.bit_equal(own.dbeta)) << what;
    }
    // And it reads U_new rather than solving for it: `theirs`' states with `mine`'s U_new give
    // gradients of neither problem.
    const Result own_kept = run(mine, Impl::chunk, DType::float64, false, DType::float64, true),
                 their_kept = run(theirs, Impl::chunk, DType::float64, false, DType::float64, true);
    Tensor dq(mine.q.shape(), DType::float64), dbeta(mine.beta.shape(), DType::float64);
    GatedDeltaRuleGrads grads;
    grads.dq = dq.view(), grads.dbeta = dbeta.view();
    gated_delta_rule_backward(params_of(theirs), Impl::chunk, theirs.d_o.view(), theirs.d_ht.view(),
                              grads, their_kept.chunk_states.view(), own_kept.v_new.view());
    const Result replayed = run(theirs, Impl::chunk, DType::float64);
    EXPECT_FALSE(dq.bit_equal(replayed.dq)) << on;
    EXPECT_FALSE(dbeta.bit_equal(replayed.dbeta)) << on;
  }
  set_num_threads(0);
}

// v_new holds U_new: u_t = β_t (v_t − a_t S_{t−1}ᵀ k_t) of the recurrence S_t = a_t S_{t−1} +
// k_t u_tᵀ, walked here token by token in float64 (packed sequences, grouped value heads, value
// tiles, strong and closed gates), by item and by tile.
TEST(GatedDeltaRuleChunkStates, VNewIsTheDeltaRuleUpdate) {
  Case c;
  c.lengths = {30, 0, 1, 45}, c.H = 1, c.HV = 2, c.K = 6, c.V = 70, c.chunk_size = 8;
  c.gates = Gates::mixed, c.l2norm = false;
  const Data d = make_data(c);
  for (int threads : {1, 8}) {
    set_num_threads(threads);
    const Result r = run(d, Impl::chunk, DType::float64, false, DType::float64, true);
    std::int64_t start = 0;
    for (std::size_t n = 0; n < c.lengths.size(); ++n) {
      for (std::int64_t hv = 0; hv < c.HV; ++hv) {
        const std::int64_t h = hv / (c.HV / c.H);
        std::vector<double> S(static_cast<std::size_t>(c.K * c.V));
        for (std::int64_t e = 0; e < c.K * c.V; ++e)
          S[static_cast<std::size_t>(e)] =
              d.h0.at((static_cast<std::int64_t>(n) * c.HV + hv) * c.K * c.V + e);
        for (std::int64_t t = start; t < start + c.lengths[n]; ++t) {
          const double a = std::exp(d.g.at(t * c.HV + hv)), beta = d.beta.at(t * c.HV + hv);
          std::vector<double> u(static_cast<std::size_t>(c.V));
          for (std::int64_t j = 0; j < c.V; ++j) {
            double sk = 0;  // (S_{t−1}ᵀ k_t)_j
            for (std::int64_t i = 0; i < c.K; ++i)
              sk += S[static_cast<std::size_t>(i * c.V + j)] * d.k.at((t * c.H + h) * c.K + i);
            u[static_cast<std::size_t>(j)] = beta * (d.v.at((t * c.HV + hv) * c.V + j) - a * sk);
          }
          for (std::int64_t i = 0; i < c.K; ++i)
            for (std::int64_t j = 0; j < c.V; ++j) {
              double& e = S[static_cast<std::size_t>(i * c.V + j)];
              e = a * e + d.k.at((t * c.H + h) * c.K + i) * u[static_cast<std::size_t>(j)];
            }
          for (std::int64_t j = 0; j < c.V; ++j) {
            const double kept = r.v_new.at((t * c.HV + hv) * c.V + j),
                         want = u[static_cast<std::size_t>(j)];
            EXPECT_NEAR(kept, want, 1e-12 * (1 + std::abs(want)))
                << "token " << t << ", value head " << hv << ", column " << j << " on " << threads
                << " threads";
          }
        }
      }
      start += c.lengths[n];
    }
  }
  set_num_threads(0);
}

// U_new in a 16-bit dtype (beside 16-bit states) is rounded once: the forward is unchanged and
// the gradients stay close to the float64 reference.
TEST(GatedDeltaRuleChunkStates, SixteenBitVNew) {
  Case c;
  c.B = 2, c.T = 100, c.H = 2, c.HV = 2, c.K = 8, c.V = 8, c.chunk_size = 16;
  const Data d = make_data(c);
  const Result expected = run(d, Impl::reference, DType::float64);
  const Result plain = run(d, Impl::chunk, DType::float32);
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    const Result kept = run(d, Impl::chunk, DType::float32, true, dtype, true);
    EXPECT_TRUE(kept.o.bit_equal(plain.o)) << to_string(dtype);
    EXPECT_TRUE(kept.ht.bit_equal(plain.ht)) << to_string(dtype);
    expect_close(kept, expected, dtype == DType::bfloat16 ? 0x1p-7 : 0x1p-10, to_string(dtype));
    std::printf("chunk states and v_new in %s: worst relative RMS error vs reference %.2g\n",
                to_string(dtype), testing::worst_rel_rms(kept.fields(), expected.fields()));
  }
}

TEST(GatedDeltaRuleChunkStates, BadChunkStatesNameTheArgument) {
  Case c;
  c.T = 20, c.H = 1, c.HV = 2, c.K = 4, c.V = 3, c.chunk_size = 8;  // 3 chunks
  const Data d = make_data(c);
  GatedDeltaRuleParams p;
  p.q = d.q.view(), p.k = d.k.view(), p.v = d.v.view(), p.g = d.g.view(), p.beta = d.beta.view();
  p.chunk_size = 8;
  Tensor o({1, 20, 2, 3}, DType::float64), kept({3, 2, 4, 3}, DType::float64),
      dq({1, 20, 1, 4}, DType::float64), bad({3, 1, 4, 3}, DType::float64);
  GatedDeltaRuleGrads grads;
  grads.dq = dq.view();
  using testing::expect_error;
  for (Impl impl : {Impl::reference, Impl::recurrent}) {
    expect_error([&] { gated_delta_rule_forward(p, impl, o.view(), {}, kept.view()); },
                 {"'chunk_states'", "only Impl::chunk", to_string(impl)});
    expect_error([&] { gated_delta_rule_backward(p, impl, o.view(), {}, grads, kept.view()); },
                 {"'chunk_states'", "only Impl::chunk", to_string(impl)});
  }
  expect_error([&] { gated_delta_rule_forward(p, Impl::chunk, o.view(), {}, bad.view()); },
               {"chunk_gated_delta_rule", "'chunk_states'", "HV=2", "[3, 1, 4, 3]"});
  const TensorView in_v = TensorView::of(static_cast<const double*>(d.v.data()), {3, 2, 4, 3});
  expect_error([&] { gated_delta_rule_forward(p, Impl::chunk, o.view(), {}, in_v); },
               {"'chunk_states'", "overlapping 'v'"});
  const TensorView in_dq = TensorView::of(static_cast<double*>(dq.data()), {3, 2, 4, 3});
  expect_error([&] { gated_delta_rule_backward(p, Impl::chunk, o.view(), {}, grads, in_dq); },
               {"'chunk_states'", "overlapping 'dq'"});

  // v_new: Impl::chunk, with chunk_states, v's shape, memory of its own.
  Tensor v_new({1, 20, 2, 3}, DType::float64), v_new_bad({1, 20, 2, 4}, DType::float64);
  for (Impl impl : {Impl::reference, Impl::recurrent})
    expect_error([&] { gated_delta_rule_forward(p, impl, o.view(), {}, {}, v_new.view()); },
                 {"'v_new'", "only Impl::chunk", to_string(impl)});
  expect_error([&] { gated_delta_rule_forward(p, Impl::chunk, o.view(), {}, {}, v_new.view()); },
               {"'v_new'", "chunk_states to be given as well"});
  expect_error(
      [&] { gated_delta_rule_backward(p, Impl::chunk, o.view(), {}, grads, {}, v_new.view()); },
      {"'v_new'", "chunk_states to be given as well"});
  expect_error(
      [&] {
        gated_delta_rule_forward(p, Impl::chunk, o.view(), {}, kept.view(), v_new_bad.view());
      },
      {"chunk_gated_delta_rule", "'v_new'", "V=3", "[1, 20, 2, 4]"});
  const TensorView v_new_in_v =
      TensorView::of(static_cast<const double*>(d.v.data()), {1, 20, 2, 3});
  expect_error(
      [&] { gated_delta_rule_forward(p, Impl::chunk, o.view(), {}, kept.view(), v_new_in_v); },
      {"'v_new'", "overlapping 'v'"});
  Tensor shared({1, 20, 2, 3}, DType::float64);  // holds both: chunk_states in its first 72
  const TensorView states_in_shared =
      TensorView::of(static_cast<double*>(shared.data()), {3, 2, 4, 3});
  expect_error(
      [&] {
        gated_delta_rule_forward(p, Impl::chunk, o.view(), {}, states_in_shared, shared.view());
      },
      {"'v_new'", "overlapping 'chunk_states'"});
  GatedDeltaRuleGrads grads_in_shared;  // dq in shared's first 80
  grads_in_shared.dq = TensorView::of(static_cast<double*>(shared.data()), {1, 20, 1, 4});
  expect_error(
      [&] {
        gated_delta_rule_backward(p, Impl::chunk, o.view(), {}, grads_in_shared, kept.view(),
                                  shared.view());
      },
      {"'v_new'", "overlapping 'dq'"});
}

// The chunk forward walks groups of consecutive q/k heads chunk by chunk (forward_heads), as many
// per group as still leave a group per thread, and so does the backward when the forward kept the
// chunk states (backward_heads; without them it walks single heads): here 12 items (4 sequences ×
// 3 heads) give groups of 3 heads on 1 and 4 threads and single heads on 5. Same bits either way,
// kept states or not, with varlen sequences (one empty, one shorter than a chunk), two value heads
// per q/k head, initial states, rotation and strided views; and the reference agrees (the groups
// compute every head, not only the first).
TEST(GatedDeltaRuleKernels, ChunkHeadGroupsAreBitIdentical) {
  Case c;
  c.T = 61, c.H = 3, c.HV = 6, c.K = 12, c.V = 10, c.chunk_size = 8;
  c.lengths = {37, 0, 5, 19}, c.layout = Layout::swapped;
  c.gates = Gates::mixed, c.rotation = true;
  const Data d = make_data(c);
  const Result expected = run(d, Impl::reference, DType::float64, /*backward=*/false);
  for (DType dtype : {DType::float32, DType::float64}) {
    SCOPED_TRACE(to_string(dtype));
    set_num_threads(1);
    const Result groups_of_three = run(d, Impl::chunk, dtype, /*backward=*/false);
    for (int threads : {4, 5}) {
      set_num_threads(threads);
      expect_bit_equal(run(d, Impl::chunk, dtype, /*backward=*/false), groups_of_three,
                       std::to_string(threads) + " threads");
    }
    expect_close(groups_of_three, expected, dtype == DType::float32 ? 1e-5 : 1e-10, "reference");
    // The backward: by single heads without kept states, by groups with them.
    const Result expected_grads = run(d, Impl::reference, DType::float64);
    set_num_threads(1);
    const Result single_heads = run(d, Impl::chunk, dtype);
    for (int threads : {1, 4, 5}) {
      set_num_threads(threads);
      expect_bit_equal(run(d, Impl::chunk, dtype, /*backward=*/true, dtype), single_heads,
                       std::to_string(threads) + " threads, chunk states kept");
    }
    expect_close(single_heads, expected_grads, dtype == DType::float32 ? 1e-5 : 1e-10,
                 "reference, backward");
  }
  set_num_threads(0);
}

// The chunk backward keeps each thread's buffers (the boundary states) across calls, and releases
// them after an item where they exceed 8 MiB: a small call, a large one (T = 600, K = V = 192 in
// float64: 38 boundary states of 288 KiB, 11 MiB), the small one again and the large one again,
// on 1 and 2 threads: each as the reference computes it, and the same bits when repeated.
TEST(GatedDeltaRuleKernels, BuffersKeptAcrossCallsOfChangingSize) {
  Case small;
  small.B = 2, small.T = 50, small.H = 2, small.HV = 2, small.K = 8, small.V = 8;
  small.chunk_size = 16, small.gates = Gates::mixed;
  Case large;
  large.T = 600, large.K = 192, large.V = 192, large.chunk_size = 16;
  const Data small_data = make_data(small), large_data = make_data(large);
  const Result small_ref = run(small_data, Impl::reference, DType::float64);
  const Result large_ref = run(large_data, Impl::reference, DType::float64);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    set_num_threads(threads);
    const Result s1 = run(small_data, Impl::chunk, DType::float64);
    const Result l1 = run(large_data, Impl::chunk, DType::float64);
    const Result s2 = run(small_data, Impl::chunk, DType::float64);
    const Result l2 = run(large_data, Impl::chunk, DType::float64);
    expect_close(s1, small_ref, 1e-10, "small");
    expect_close(l1, large_ref, 1e-10, "large");
    expect_bit_equal(s2, s1, "small again");
    expect_bit_equal(l2, l1, "large again");
  }
  set_num_threads(0);
}

// ---------------------------------------------------------------------------------------------
// Fused rotation

// The explicit path: q and k rotated by apply_rotary (float64, its reference implementation),
// the op called on them without θ, and the gradients taken back through apply_rotary_backward.
// dθ is the sum of the rotation's dθ for q and for k.
Result run_explicitly_rotated(const Data& d, Impl impl, DType dtype) {
  const RotaryLayout layout = d.c.rotary_layout;
  Data e = d;
  e.c.rotation = false;
  e.theta = Tensor();
  apply_rotary_forward(d.q.view(), d.theta.view(), layout, Impl::reference, e.q.view());
  apply_rotary_forward(d.k.view(), d.theta.view(), layout, Impl::reference, e.k.view());
  Result r = run(e, impl, dtype);
  Tensor dq(d.q.shape(), DType::float64), dk(d.k.shape(), DType::float64);
  Tensor dtheta_q(d.theta.shape(), DType::float64), dtheta_k(d.theta.shape(), DType::float64);
  apply_rotary_backward(d.q.view(), d.theta.view(), layout, Impl::reference, r.dq.view(), dq.view(),
                        dtheta_q.view());
  apply_rotary_backward(d.k.view(), d.theta.view(), layout, Impl::reference, r.dk.view(), dk.view(),
                        dtheta_k.view());
  r.dq = dq;
  r.dk = dk;
  r.dtheta = dtheta_q;
  for (std::int64_t i = 0; i < dtheta_k.numel(); ++i)
    r.dtheta.set(i, dtheta_q.at(i) + dtheta_k.at(i));
  return r;
}

// Fused rotation == rotating q and k explicitly and calling the op: o, final state and all
// gradients (dθ included), every implementation, both layouts, float64 and float32; with initial
// states, packed sequences, grouped value heads, K != V and T not a multiple of the chunk.
TEST(GatedDeltaRuleRotation, FusedEqualsExplicitRotation) {
  std::vector<Case> cases;
  {
    Case c;
    c.name = "varlen";
    c.lengths = {7, 0, 13, 2}, c.H = 2, c.HV = 4, c.K = 6, c.V = 4, c.chunk_size = 5;
    cases.push_back(c);
    c.name = "varlen_no_l2norm";
    c.l2norm = false, c.seed = 2;
    cases.push_back(c);
    c = Case{};
    c.name = "batch_chunk_1";
    c.B = 2, c.T = 11, c.H = 1, c.HV = 2, c.K = 8, c.V = 3, c.chunk_size = 1, c.seed = 3;
    cases.push_back(c);
    c.name = "batch_chunk_longer_than_sequence";
    c.chunk_size = 64, c.seed = 4, c.gates = Gates::mixed;
    cases.push_back(c);
  }
  for (Case c : cases) {
    for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
      c.rotation = true;
      c.rotary_layout = layout;
      const Data d = make_data(c);
      for (DType dtype : {DType::float64, DType::float32}) {
        const double tol = dtype == DType::float64 ? 1e-10 : 1e-5;
        for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
          const std::string what =
              c.name + " " + to_string(layout) + " " + to_string(impl) + " " + to_string(dtype);
          expect_close(run(d, impl, dtype), run_explicitly_rotated(d, impl, dtype), tol, what);
        }
      }
    }
  }
}

// dθ of the recurrent and chunk kernels against central finite differences of their own forward
// (float64), both layouts; chunk size 3 so that chunks and checkpoint segments are crossed.
TEST(GatedDeltaRuleRotation, DthetaMatchesFiniteDifferencesInEveryImpl) {
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    Case c;
    c.lengths = {4, 0, 7}, c.H = 1, c.HV = 2, c.K = 4, c.V = 3, c.chunk_size = 3;
    c.rotation = true;
    c.rotary_layout = layout;
    c.seed = 5;
    Data d = make_data(c);
    for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
      const Tensor analytic = run(d, impl, DType::float64).dtheta;
      testing::FiniteDifferenceOptions options;
      options.step = 1e-5;
      PHASOR_EXPECT_GRADIENT(
          analytic, d.theta, [&] { return loss(d, impl); }, 1e-7,
          std::string(to_string(layout)) + " " + to_string(impl) + " dtheta", options);
    }
  }
}

// dθ alone (no dq, dk requested), or dq alone with θ, gives the same values as the full call:
// dθ needs both the q and the k gradient internally whether or not they are stored.
TEST(GatedDeltaRuleRotation, OptionalGradientsWithRotation) {
  Case c;
  c.lengths = {5, 0, 8}, c.H = 2, c.HV = 4, c.K = 4, c.V = 3, c.chunk_size = 3;
  c.rotation = true, c.rotary_layout = RotaryLayout::interleaved;
  const Data d = make_data(c);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    const Result full = run(d, impl, DType::float64);
    const GatedDeltaRuleParams p = params_of(d);
    Tensor dtheta = Tensor::zeros(d.theta.shape()), dq = Tensor::zeros(d.q.shape());
    dtheta.fill(kNaN);
    dq.fill(kNaN);
    gated_delta_rule_backward(p, impl, d.d_o.view(), d.d_ht.view(),
                              make_grads({}, {}, {}, {}, {}, {}, dtheta.view()));
    EXPECT_TRUE(dtheta.bit_equal(full.dtheta)) << to_string(impl);
    gated_delta_rule_backward(p, impl, d.d_o.view(), d.d_ht.view(),
                              make_grads(dq.view(), {}, {}, {}, {}, {}));
    EXPECT_TRUE(dq.bit_equal(full.dq)) << to_string(impl);
  }
}

// θ may have another dtype than q: float32 θ with float64 q (converted on load), and float64 θ
// with float32 q (cos/sin evaluated in float64, then rounded).
TEST(GatedDeltaRuleRotation, ThetaOfAnotherDtype) {
  Case c;
  c.B = 2, c.T = 13, c.H = 1, c.HV = 2, c.K = 6, c.V = 3, c.chunk_size = 4, c.rotation = true;
  Data d = make_data(c);
  d.theta = d.theta.to(DType::float32).to(DType::float64);  // exactly representable in both
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    for (DType q_dtype : {DType::float64, DType::float32}) {
      const DType theta_dtype = q_dtype == DType::float64 ? DType::float32 : DType::float64;
      const Result expected = run(d, impl, q_dtype);  // θ of q's dtype
      const Tensor q = d.q.to(q_dtype), k = d.k.to(q_dtype), theta = d.theta.to(theta_dtype);
      GatedDeltaRuleParams p;
      p.q = q.view(), p.k = k.view(), p.v = d.v.view(), p.g = d.g.view(), p.beta = d.beta.view();
      p.initial_state = d.h0.view();
      p.use_qk_l2norm_in_kernel = c.l2norm;
      p.chunk_size = c.chunk_size;
      p.theta = theta.view();
      Tensor o = Tensor::zeros(d.d_o.shape()), dtheta = Tensor::zeros(d.theta.shape());
      gated_delta_rule_forward(p, impl, o.view());
      gated_delta_rule_backward(p, impl, d.d_o.view(), d.d_ht.view(),
                                make_grads({}, {}, {}, {}, {}, {}, dtheta.view()));
      const double tol = q_dtype == DType::float64 ? 1e-14 : 1e-6;
      const std::string what = std::string(to_string(impl)) + " q " + to_string(q_dtype);
      PHASOR_EXPECT_CLOSE(o, expected.o, tol, what + " o");
      PHASOR_EXPECT_CLOSE(dtheta, expected.dtheta, tol, what + " dtheta");
    }
  }
}

// R(c) applied to every column of states [N, HV, K, V] (the K index holds the rotation pairs).
Tensor rotate_states(const Tensor& states, double c, RotaryLayout layout) {
  Tensor out = states;
  const std::int64_t K = states.shape()[2], V = states.shape()[3], R = K / 2;
  for (std::int64_t m = 0; m < states.numel() / (K * V); ++m)
    for (std::int64_t i = 0; i < R; ++i) {
      const std::int64_t a = layout == RotaryLayout::half_split ? i : 2 * i;
      const std::int64_t b = layout == RotaryLayout::half_split ? i + R : 2 * i + 1;
      for (std::int64_t j = 0; j < V; ++j) {
        const double xa = states.at((m * K + a) * V + j), xb = states.at((m * K + b) * V + j);
        out.set((m * K + a) * V + j, xa * std::cos(c) - xb * std::sin(c));
        out.set((m * K + b) * V + j, xa * std::sin(c) + xb * std::cos(c));
      }
    }
  return out;
}

// The decay is a scalar, so q'_tᵀ k'_s = q_tᵀ R(θ_t − θ_s) k_s and every product of the delta rule
// depends on θ only through differences: adding a constant c to every θ leaves o unchanged. The
// state is NOT invariant: it accumulates the rotated k'_s, so it lives in the rotated frame and
// becomes R(c) S. Hence, exactly: (θ + c, R(c) S_0) gives (o, R(c) S_T), the same o, dq, dk, dv,
// dg, dβ, dθ and R(c) dh0; with no initial state o is invariant as is, and then (d_final_state =
// 0) Σ_t dθ_t = 0 for every sequence, head and pair. With an unrotated S_0, o changes.
TEST(GatedDeltaRuleRotation, ConstantShiftOfThetaLeavesOutputsUnchanged) {
  const double shift = 1.234;
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    Case c;
    c.lengths = {9, 0, 6}, c.H = 2, c.HV = 4, c.K = 6, c.V = 3, c.chunk_size = 4;
    c.rotation = true;
    c.rotary_layout = layout;
    const Data d = make_data(c);
    Data shifted = d;
    for (std::int64_t i = 0; i < d.theta.numel(); ++i) shifted.theta.set(i, d.theta.at(i) + shift);
    shifted.h0 = rotate_states(d.h0, shift, layout);
    shifted.d_ht = rotate_states(d.d_ht, shift, layout);  // the same loss of the rotated state
    for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
      const std::string what = std::string(to_string(layout)) + " " + to_string(impl);
      const Result base = run(d, impl, DType::float64);
      const Result moved = run(shifted, impl, DType::float64);
      Result expected = base;
      expected.ht = rotate_states(base.ht, shift, layout);
      expected.dh0 = rotate_states(base.dh0, shift, layout);
      expect_close(moved, expected, 1e-12, what + " shifted with rotated states");
      // The state does change, and an unrotated initial state changes o.
      EXPECT_GT(testing::rel_rms(moved.ht, base.ht), 0.1) << what;
      Data unrotated_h0 = shifted;
      unrotated_h0.h0 = d.h0;
      EXPECT_GT(testing::rel_rms(run(unrotated_h0, impl, DType::float64, false).o, base.o), 1e-3)
          << what;

      // No initial state: o invariant as is; Σ_t dθ_t = 0 when the loss depends on o only.
      Data fresh = d, fresh_shifted = shifted;
      for (Data* x : {&fresh, &fresh_shifted}) {
        x->c.initial_state = false;
        x->h0 = Tensor();
        x->d_ht.fill(0.0);
      }
      const Result a = run(fresh, impl, DType::float64),
                   b = run(fresh_shifted, impl, DType::float64);
      PHASOR_EXPECT_CLOSE(b.o, a.o, 1e-12, what + " o without initial state");
      PHASOR_EXPECT_CLOSE(b.dtheta, a.dtheta, 1e-12, what + " dtheta without initial state");
      const std::int64_t R = c.K / 2;
      double worst = 0, scale = 0;
      for (std::size_t n = 0; n < c.lengths.size(); ++n) {
        const std::int64_t start = d.cu.at(static_cast<std::int64_t>(n));
        const std::int64_t end = d.cu.at(static_cast<std::int64_t>(n) + 1);
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t i = 0; i < R; ++i) {
            double sum = 0;
            for (std::int64_t t = start; t < end; ++t) {
              const double x = a.dtheta.at((t * c.H + h) * R + i);
              sum += x;
              scale = std::max(scale, std::fabs(x));
            }
            worst = std::max(worst, std::fabs(sum));
          }
      }
      EXPECT_GT(scale, 1e-3) << what;
      EXPECT_LE(worst, 1e-12 * scale) << what << ": Σ_t dθ_t";
    }
  }
}

// Standard RoPE (θ_t = position_t · ω): the logits q'_mᵀ k'_n depend on m − n only, so starting
// the positions at another offset leaves o unchanged (no initial state). The angles are shared by
// the heads: passed once as a view with a zero stride over H.
TEST(GatedDeltaRuleRotation, StandardRopeDependsOnlyOnDistance) {
  Case c;
  c.B = 2, c.T = 23, c.H = 2, c.HV = 4, c.K = 8, c.V = 4, c.chunk_size = 8;
  c.initial_state = false;
  const Data d = make_data(c);
  const std::int64_t R = c.K / 2;
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
      std::vector<Tensor> outputs;
      for (std::int64_t offset : {0, 1000}) {
        RopeAnglesParams rp;
        rp.B = c.B, rp.T = c.T, rp.head_dim = c.K, rp.offset = offset;
        Tensor angles({c.B, c.T, R}, DType::float64);
        rope_angles(rp, Impl::reference, angles.view());
        GatedDeltaRuleParams p;
        p.q = d.q.view(), p.k = d.k.view(), p.v = d.v.view(), p.g = d.g.view();
        p.beta = d.beta.view();
        p.use_qk_l2norm_in_kernel = true;
        p.chunk_size = c.chunk_size;
        p.theta = TensorView::strided(angles.view().data, DType::float64, {c.B, c.T, c.H, R},
                                      {c.T * R, R, 0, 1});
        p.rotary_layout = layout;
        Tensor o(d.d_o.shape(), DType::float64);
        gated_delta_rule_forward(p, impl, o.view());
        outputs.push_back(o);
      }
      const std::string what = std::string(to_string(layout)) + " " + to_string(impl);
      PHASOR_EXPECT_CLOSE(outputs[1], outputs[0], 1e-11, what + " o at offset 1000 vs 0");
      // It does rotate: o differs from the unrotated op.
      EXPECT_GT(testing::rel_rms(run(d, impl, DType::float64, false).o, outputs[0]), 1e-3) << what;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad inputs

GatedDeltaRuleGrads grads_with_dq(const TensorView& dq) {
  return make_grads(dq, {}, {}, {}, {}, {});
}

struct ValidCall {
  Tensor q{{1, 6, 2, 3}, DType::float32}, k{{1, 6, 2, 3}, DType::float32};
  Tensor v{{1, 6, 4, 2}, DType::float32}, g{{1, 6, 4}, DType::float32};
  Tensor beta{{1, 6, 4}, DType::float32}, h0{{1, 4, 3, 2}, DType::float32};
  Tensor o{{1, 6, 4, 2}, DType::float32}, ht{{1, 4, 3, 2}, DType::float32};
  GatedDeltaRuleParams params() const {
    GatedDeltaRuleParams p;
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.g = g.view(), p.beta = beta.view();
    return p;
  }
};

TEST(GatedDeltaRuleErrors, BadInputsNameTheArgument) {
  ValidCall c;
  const Tensor wrong_rank({1, 6, 2}, DType::float32), wrong_k({1, 6, 2, 4}, DType::float32);
  const Tensor v_hv3({1, 6, 3, 2}, DType::float32), v_b2({2, 6, 4, 2}, DType::float32);
  const Tensor g_h({1, 6, 2}, DType::float32), ints({1, 6, 2, 3}, DType::int32);
  const Tensor h0_bad({1, 4, 2, 3}, DType::float32), o_bad({1, 6, 2, 2}, DType::float32);
  const std::string chunk_op = "chunk_gated_delta_rule";
  auto forward = [&](const GatedDeltaRuleParams& p, const TensorView& o, const TensorView& ht = {},
                     Impl impl = Impl::chunk) { gated_delta_rule_forward(p, impl, o, ht); };
  auto expect = [&](const std::function<void(GatedDeltaRuleParams&)>& edit,
                    std::initializer_list<const char*> fragments, Impl impl = Impl::chunk) {
    GatedDeltaRuleParams p = c.params();
    edit(p);
    testing::expect_error([&] { forward(p, c.o.view(), {}, impl); }, fragments);
  };
  expect([&](auto& p) { p.q = wrong_rank.view(); },
         {"chunk_gated_delta_rule", "argument 'q'", "4-D"});
  expect([&](auto& p) { p.q = ints.view(); },
         {"argument 'q'", "float32, float64, bfloat16 or float16", "int32"});
  expect([&](auto& p) { p.k = wrong_k.view(); }, {"argument 'k'", "K=3", "[1, 6, 2, 4]"});
  expect([&](auto& p) { p.k = {}; }, {"argument 'k'", "none"});
  expect([&](auto& p) { p.v = wrong_rank.view(); }, {"argument 'v'", "4-D"});
  expect([&](auto& p) { p.v = v_b2.view(); }, {"argument 'v'", "B=1"});
  expect([&](auto& p) { p.v = v_hv3.view(); }, {"argument 'v'", "multiple", "H = 2", "HV = 3"});
  expect([&](auto& p) { p.g = g_h.view(); }, {"argument 'g'", "HV=4"});
  expect([&](auto& p) { p.beta = g_h.view(); }, {"argument 'beta'", "HV=4"});
  expect([&](auto& p) { p.initial_state = h0_bad.view(); }, {"argument 'initial_state'", "K=3"});
  expect([&](auto& p) { p.chunk_size = 0; }, {"argument 'chunk_size'", "positive", "0"});
  expect([&](auto& p) { p.scale = kNaN; }, {"argument 'scale'", "finite"});
  // Op names of the other implementations.
  expect([&](auto& p) { p.q = wrong_rank.view(); }, {"fused_recurrent_gated_delta_rule", "'q'"},
         Impl::recurrent);
  expect([&](auto& p) { p.q = wrong_rank.view(); }, {"gated_delta_rule_reference", "'q'"},
         Impl::reference);

  // Gates must be ≤ 0 (−inf allowed).
  {
    Tensor g = c.g;
    g.set(13, 0.5);
    expect([&](auto& p) { p.g = g.view(); }, {"argument 'g'", "<= 0", "g[0, 3, 1] = 0.5"});
    g.set(13, kNaN);
    expect([&](auto& p) { p.g = g.view(); }, {"argument 'g'", "<= 0"});
    g.set(13, -kInf);
    GatedDeltaRuleParams p = c.params();
    p.g = g.view();
    EXPECT_NO_THROW(forward(p, c.o.view()));
  }

  // cu_seqlens.
  {
    const Tensor cu_ok = testing::cu_seqlens({2, 4}), cu_short = testing::cu_seqlens({2, 3});
    const Tensor cu_float = testing::cu_seqlens({2, 4}).to(DType::float32);
    const Tensor cu_decr = Tensor::from({4}, {0, 4, 3, 6}, DType::int64);
    expect([&](auto& p) { p.cu_seqlens = cu_short.view(); }, {"argument 'cu_seqlens'", "T = 6"});
    expect([&](auto& p) { p.cu_seqlens = cu_float.view(); }, {"argument 'cu_seqlens'", "int32"});
    expect([&](auto& p) { p.cu_seqlens = cu_decr.view(); },
           {"argument 'cu_seqlens'", "non-decreasing"});
    // With cu_seqlens, initial_state has N = 2 rows, not B = 1.
    expect([&](auto& p) { p.cu_seqlens = cu_ok.view(), p.initial_state = c.h0.view(); },
           {"argument 'initial_state'", "N=2"});
    const Tensor q2({2, 6, 2, 3}, DType::float32), k2({2, 6, 2, 3}, DType::float32);
    const Tensor v2({2, 6, 4, 2}, DType::float32), g2({2, 6, 4}, DType::float32);
    expect(
        [&](auto& p) {
          p.q = q2.view(), p.k = k2.view(), p.v = v2.view(), p.g = g2.view(), p.beta = g2.view();
          p.cu_seqlens = cu_ok.view();
        },
        {"argument 'cu_seqlens'", "B = 1"});
  }

  // Outputs.
  {
    const GatedDeltaRuleParams p = c.params();
    testing::expect_error([&] { forward(p, o_bad.view()); }, {"argument 'o'", "HV=4"});
    testing::expect_error([&] { forward(p, c.o.view(), h0_bad.view()); },
                          {"argument 'final_state'", "K=3"});
  }

  // Backward arguments.
  {
    GatedDeltaRuleParams p = c.params();
    Tensor dq({1, 6, 2, 3}, DType::float32), dg({1, 6, 4}, DType::float32);
    Tensor dh0({1, 4, 3, 2}, DType::float32);
    testing::expect_error(
        [&] {
          gated_delta_rule_backward(p, Impl::chunk, c.o.view(), {},
                                    make_grads({}, {}, {}, {}, {}, dh0.view()));
        },
        {"chunk_gated_delta_rule", "argument 'dh0'", "initial_state"});
    testing::expect_error(
        [&] {
          gated_delta_rule_backward(p, Impl::recurrent, o_bad.view(), {}, grads_with_dq(dq.view()));
        },
        {"fused_recurrent_gated_delta_rule", "argument 'd_o'"});
    testing::expect_error(
        [&] {
          gated_delta_rule_backward(p, Impl::chunk, c.o.view(), h0_bad.view(),
                                    grads_with_dq(dq.view()));
        },
        {"argument 'd_final_state'"});
    testing::expect_error(
        [&] {
          gated_delta_rule_backward(p, Impl::chunk, c.o.view(), {}, grads_with_dq(dg.view()));
        },
        {"argument 'dq'", "K=3"});
    testing::expect_error(
        [&] {
          gated_delta_rule_backward(p, Impl::chunk, c.o.view(), {},
                                    make_grads({}, {}, {}, dq.view(), {}, {}));
        },
        {"argument 'dg'", "HV=4"});
    // The recurrent backward recomputes from checkpoints every chunk_size tokens.
    p.chunk_size = -1;
    testing::expect_error(
        [&] {
          gated_delta_rule_backward(p, Impl::recurrent, c.o.view(), {}, grads_with_dq(dq.view()));
        },
        {"fused_recurrent_gated_delta_rule", "argument 'chunk_size'"});
    p.initial_state = c.h0.view();
    p.chunk_size = 4;
    EXPECT_NO_THROW(
        gated_delta_rule_backward(p, Impl::chunk, c.o.view(), c.ht.view(),
                                  make_grads(dq.view(), {}, {}, dg.view(), {}, dh0.view())));
  }
}

// θ and dθ: shape (per q/k head), even K, dθ only with θ, dθ's shape, each implementation's name.
TEST(GatedDeltaRuleErrors, BadRotationArgumentsNameThetaOrDtheta) {
  ValidCall odd;  // K = 3
  const Tensor theta_odd({1, 6, 2, 1}, DType::float32);
  for (Impl impl : {Impl::reference, Impl::recurrent, Impl::chunk}) {
    GatedDeltaRuleParams p = odd.params();
    p.theta = theta_odd.view();
    testing::expect_error([&] { gated_delta_rule_forward(p, impl, odd.o.view()); },
                          {"argument 'theta'", "even", "K = 3"});
  }
  // K = 4, H = 2 q/k heads, HV = 4 value heads.
  const Tensor q({1, 6, 2, 4}, DType::float32), k({1, 6, 2, 4}, DType::float32);
  const Tensor v({1, 6, 4, 2}, DType::float32), g({1, 6, 4}, DType::float32);
  const Tensor o({1, 6, 4, 2}, DType::float32), dq({1, 6, 2, 4}, DType::float32);
  const Tensor theta({1, 6, 2, 2}, DType::float32), theta_hv({1, 6, 4, 2}, DType::float32);
  const Tensor theta_k({1, 6, 2, 4}, DType::float32), theta_int({1, 6, 2, 2}, DType::int32);
  const Tensor dtheta_bad({1, 6, 2, 3}, DType::float32), dtheta({1, 6, 2, 2}, DType::float32);
  GatedDeltaRuleParams p;
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.g = g.view(), p.beta = g.view();
  auto forward_with = [&](const Tensor& t, Impl impl = Impl::chunk) {
    GatedDeltaRuleParams pt = p;
    pt.theta = t.view();
    gated_delta_rule_forward(pt, impl, o.view());
  };
  testing::expect_error(
      [&] { forward_with(theta_hv); },
      {"chunk_gated_delta_rule", "argument 'theta'", "H (q/k heads)=2", "[1, 6, 4, 2]"});
  testing::expect_error([&] { forward_with(theta_k, Impl::recurrent); },
                        {"fused_recurrent_gated_delta_rule", "argument 'theta'", "K/2=2"});
  testing::expect_error([&] { forward_with(theta_int, Impl::reference); },
                        {"gated_delta_rule_reference", "argument 'theta'", "int32"});
  EXPECT_NO_THROW(forward_with(theta));
  // dθ without θ, and of the wrong shape; the backward validates θ too.
  testing::expect_error(
      [&] {
        gated_delta_rule_backward(p, Impl::chunk, o.view(), {},
                                  make_grads(dq.view(), {}, {}, {}, {}, {}, dtheta.view()));
      },
      {"chunk_gated_delta_rule", "argument 'dtheta'", "theta"});
  GatedDeltaRuleParams pt = p;
  pt.theta = theta.view();
  testing::expect_error(
      [&] {
        gated_delta_rule_backward(pt, Impl::recurrent, o.view(), {},
                                  make_grads({}, {}, {}, {}, {}, {}, dtheta_bad.view()));
      },
      {"argument 'dtheta'", "K/2=2", "[1, 6, 2, 3]"});
  pt.theta = theta_hv.view();
  testing::expect_error(
      [&] {
        gated_delta_rule_backward(pt, Impl::reference, o.view(), {},
                                  make_grads(dq.view(), {}, {}, {}, {}, {}));
      },
      {"argument 'theta'", "H (q/k heads)=2"});
  pt.theta = theta.view();
  const TensorView dtheta_broadcast =
      TensorView::strided(dtheta.view().data, DType::float32, {1, 6, 2, 2}, {12, 2, 0, 1});
  testing::expect_error(
      [&] {
        gated_delta_rule_backward(pt, Impl::chunk, o.view(), {},
                                  make_grads({}, {}, {}, {}, {}, {}, dtheta_broadcast));
      },
      {"argument 'dtheta'", "no zero strides", "dimension 2"});
  EXPECT_NO_THROW(gated_delta_rule_backward(pt, Impl::chunk, o.view(), {},
                                            make_grads({}, {}, {}, {}, {}, {}, dtheta.view())));
}

}  // namespace
}  // namespace phasor
