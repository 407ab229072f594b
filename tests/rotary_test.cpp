// Tests of the rotary ops: Selective RoPE phases, RoPE angles and apply_rotary. Every optimized
// kernel is checked against the float64 reference (random and adversarial inputs, float32 and
// float64), gradients against central finite differences in float64, plus the algebraic
// properties of rotations (relative positions, inverse, layout permutation).
#include "phasor/rotary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "phasor/testing/cases.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;

constexpr Impl kFast = Impl::chunk;  // the optimized kernel (recurrent selects the same one)

// ---------------------------------------------------------------------------------------------
// Selective RoPE phases.

struct PhaseCase {
  Tensor phi, omega, initial_phase, cu_seqlens;
  std::int64_t N = 0;
  RotaryPhaseParams params() const {
    return {phi.view(), omega.view(), initial_phase.view(), cu_seqlens.view()};
  }
};

struct PhaseResult {
  Tensor theta, final_phase, d_phi, d_omega, d_initial_phase;
};

// A case with B rows of T tokens (or, with lengths, one packed row), H heads, R pairs.
PhaseCase make_phase_case(std::mt19937_64& rng, std::int64_t B, std::int64_t T, std::int64_t H,
                          std::int64_t R, bool omega_per_head, bool with_initial,
                          const std::vector<std::int64_t>& lengths = {}, double phi_std = 1.0,
                          DType dtype = DType::float64) {
  PhaseCase c;
  const testing::Batch batch = testing::batch_of(B, T, lengths);
  B = batch.B, T = batch.T, c.N = batch.N;
  c.cu_seqlens = batch.cu_seqlens;
  c.phi = testing::randn({B, T, H, R}, rng, phi_std, dtype);
  // ω: a RoPE-like exponentially decaying spectrum times a random temperature.
  c.omega = omega_per_head ? Tensor({H, R}, dtype) : Tensor({R}, dtype);
  std::uniform_real_distribution<double> temp(0.5, 2.0);
  for (std::int64_t i = 0; i < c.omega.numel(); ++i)
    c.omega.set(
        i, std::pow(10000.0, -static_cast<double>(i % R) / static_cast<double>(R)) * temp(rng));
  if (with_initial) c.initial_phase = testing::randn({c.N, H, R}, rng, 3.0, dtype);
  return c;
}

PhaseResult run_phases(const PhaseCase& c, Impl impl, const Tensor& d_theta, const Tensor& d_final,
                       DType out_dtype = DType::float64) {
  const auto B = c.phi.shape()[0], T = c.phi.shape()[1], H = c.phi.shape()[2], R = c.phi.shape()[3];
  PhaseResult r;
  r.theta = Tensor::nans({B, T, H, R}, out_dtype);
  r.final_phase = Tensor::nans({c.N, H, R}, out_dtype);
  selective_rope_phases_forward(c.params(), impl, r.theta.view(), r.final_phase.view());
  r.d_phi = Tensor::nans({B, T, H, R}, out_dtype);
  r.d_omega = Tensor::nans(c.omega.shape(), out_dtype);
  if (c.initial_phase.defined()) r.d_initial_phase = Tensor::nans({c.N, H, R}, out_dtype);
  selective_rope_phases_backward(c.params(), impl, d_theta.view(), d_final.view(),
                                 {r.d_phi.view(), r.d_omega.view(), r.d_initial_phase.view()});
  return r;
}

void expect_phases_close(const PhaseResult& a, const PhaseResult& ref, double tol) {
  PHASOR_EXPECT_CLOSE(a.theta, ref.theta, tol, "theta");
  PHASOR_EXPECT_CLOSE(a.final_phase, ref.final_phase, tol, "final_phase");
  PHASOR_EXPECT_CLOSE(a.d_phi, ref.d_phi, tol, "d_phi");
  PHASOR_EXPECT_CLOSE(a.d_omega, ref.d_omega, tol, "d_omega");
  if (ref.d_initial_phase.defined())
    PHASOR_EXPECT_CLOSE(a.d_initial_phase, ref.d_initial_phase, tol, "d_initial_phase");
}

TEST(RotaryPhases, KernelMatchesReference) {
  std::mt19937_64 rng(1);
  for (DType dtype : {DType::float64, DType::float32})
    for (bool per_head : {true, false})
      for (bool with_initial : {true, false}) {
        SCOPED_TRACE(std::string(to_string(dtype)) + (per_head ? " omega[H,R]" : " omega[R]") +
                     (with_initial ? " with initial_phase" : ""));
        // Adversarial: large increments (phases in the hundreds), empty and one-token sequences.
        const PhaseCase c = make_phase_case(rng, 1, 0, 3, 5, per_head, with_initial,
                                            {7, 0, 1, 40, 0, 13}, 20.0, dtype);
        const auto& s = c.phi.shape();
        const Tensor d_theta = testing::randn(s, rng, 1.0, dtype);
        const Tensor d_final = testing::randn({c.N, s[2], s[3]}, rng, 1.0, dtype);
        const PhaseResult ref = run_phases(c, Impl::reference, d_theta, d_final);
        const PhaseResult fast = run_phases(c, kFast, d_theta, d_final, dtype);
        expect_phases_close(fast, ref, dtype == DType::float32 ? 1e-5 : 1e-13);
        const PhaseResult recurrent = run_phases(c, Impl::recurrent, d_theta, d_final, dtype);
        EXPECT_TRUE(recurrent.theta.bit_equal(fast.theta));
      }
}

// The reference against a direct evaluation of θ_t = ω ⊙ (θ_0 + Σ_{s ≤ t} φ_s) on a tiny case.
TEST(RotaryPhases, ReferenceMatchesDefinition) {
  const Tensor phi = Tensor::from({1, 3, 1, 2}, {1, 2, 3, 4, 5, 6});
  const Tensor omega = Tensor::from({2}, {0.5, 2});
  const Tensor theta0 = Tensor::from({1, 1, 2}, {10, 20});
  Tensor theta = Tensor::nans({1, 3, 1, 2}), final_phase = Tensor::nans({1, 1, 2});
  selective_rope_phases_forward({phi.view(), omega.view(), theta0.view(), {}}, Impl::reference,
                                theta.view(), final_phase.view());
  const std::vector<double> expected = {0.5 * 11, 2 * 22, 0.5 * 14, 2 * 26, 0.5 * 19, 2 * 32};
  EXPECT_EQ(theta.values(), expected);
  EXPECT_EQ(final_phase.values(), (std::vector<double>{19, 32}));
}

// Gradients of L = <θ, W> + <final_phase, W_f> by central differences, for every input.
TEST(RotaryPhases, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(2);
  for (bool per_head : {true, false})
    for (Impl impl : {Impl::reference, kFast}) {
      SCOPED_TRACE(std::string(to_string(impl)) + (per_head ? " omega[H,R]" : " omega[R]"));
      PhaseCase c = make_phase_case(rng, 1, 0, 2, 3, per_head, true, {5, 0, 1, 6});
      const auto& s = c.phi.shape();
      const Tensor w = testing::randn(s, rng), wf = testing::randn({c.N, s[2], s[3]}, rng);
      const PhaseResult r = run_phases(c, impl, w, wf);
      auto loss = [&]() {
        Tensor theta = Tensor::nans(s), fin = Tensor::nans({c.N, s[2], s[3]});
        selective_rope_phases_forward(c.params(), Impl::reference, theta.view(), fin.view());
        return testing::dot(theta, w) + testing::dot(fin, wf);
      };
      PHASOR_EXPECT_GRADIENT(r.d_phi, c.phi, loss, 1e-7, "d_phi");
      PHASOR_EXPECT_GRADIENT(r.d_omega, c.omega, loss, 1e-7, "d_omega");
      PHASOR_EXPECT_GRADIENT(r.d_initial_phase, c.initial_phase, loss, 1e-7, "d_initial_phase");
    }
}

// Empty sequences: final_phase = initial_phase (or 0), d_initial_phase = d_final_phase.
// Packed sequences equal separate calls: the running sum restarts at each sequence.
TEST(RotaryPhases, VarlenRestartsAndEmptySequences) {
  std::mt19937_64 rng(3);
  const std::vector<std::int64_t> lengths = {0, 4, 1, 0, 6};
  const PhaseCase packed = make_phase_case(rng, 1, 0, 2, 3, true, true, lengths);
  const auto H = packed.phi.shape()[2], R = packed.phi.shape()[3];
  const Tensor d_theta = testing::randn(packed.phi.shape(), rng);
  const Tensor d_final = testing::randn({packed.N, H, R}, rng);
  for (Impl impl : {Impl::reference, kFast}) {
    SCOPED_TRACE(to_string(impl));
    const PhaseResult r = run_phases(packed, impl, d_theta, d_final);
    std::int64_t start = 0;
    for (std::int64_t n = 0; n < packed.N; ++n) {
      const std::int64_t len = lengths[static_cast<std::size_t>(n)];
      PhaseCase one;
      one.N = 1;
      one.omega = packed.omega;
      one.phi = Tensor({1, len, H, R}, DType::float64);
      Tensor dth({1, len, H, R}, DType::float64);
      for (std::int64_t i = 0; i < len * H * R; ++i) {
        one.phi.set(i, packed.phi.at(start * H * R + i));
        dth.set(i, d_theta.at(start * H * R + i));
      }
      one.initial_phase = Tensor({1, H, R}, DType::float64);
      Tensor dfin({1, H, R}, DType::float64);
      for (std::int64_t i = 0; i < H * R; ++i) {
        one.initial_phase.set(i, packed.initial_phase.at(n * H * R + i));
        dfin.set(i, d_final.at(n * H * R + i));
      }
      const PhaseResult single = run_phases(one, impl, dth, dfin);
      for (std::int64_t i = 0; i < len * H * R; ++i) {
        EXPECT_NEAR(r.theta.at(start * H * R + i), single.theta.at(i), 1e-12);
        EXPECT_NEAR(r.d_phi.at(start * H * R + i), single.d_phi.at(i), 1e-12);
      }
      for (std::int64_t i = 0; i < H * R; ++i) {
        EXPECT_NEAR(r.final_phase.at(n * H * R + i), single.final_phase.at(i), 1e-12);
        EXPECT_NEAR(r.d_initial_phase.at(n * H * R + i), single.d_initial_phase.at(i), 1e-12);
        if (len == 0) {
          EXPECT_EQ(r.final_phase.at(n * H * R + i), packed.initial_phase.at(n * H * R + i));
          EXPECT_EQ(r.d_initial_phase.at(n * H * R + i), d_final.at(n * H * R + i));
        }
      }
      start += len;
    }
  }
  // Without initial_phase an empty sequence's final phase is 0.
  PhaseCase no_init = packed;
  no_init.initial_phase = Tensor();
  Tensor theta = Tensor::nans(packed.phi.shape()), fin = Tensor::nans({packed.N, H, R});
  selective_rope_phases_forward(no_init.params(), kFast, theta.view(), fin.view());
  for (std::int64_t i = 0; i < H * R; ++i) EXPECT_EQ(fin.at(i), 0.0);
}

// Decoding: the phases of a sequence computed in two pieces, the second starting from the
// first's final_phase, equal the phases of the whole sequence.
TEST(RotaryPhases, DecodingContinuation) {
  std::mt19937_64 rng(4);
  for (Impl impl : {Impl::reference, kFast}) {
    const PhaseCase whole = make_phase_case(rng, 2, 11, 2, 4, true, true);
    const auto B = 2, T = 11, H = 2, R = 4, T1 = 7;
    Tensor theta = Tensor::nans({B, T, H, R}), fin = Tensor::nans({B, H, R});
    selective_rope_phases_forward(whole.params(), impl, theta.view(), fin.view());
    PhaseCase first = whole, second = whole;
    first.phi = Tensor({B, T1, H, R}, DType::float64);
    second.phi = Tensor({B, T - T1, H, R}, DType::float64);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < H * R; ++i) {
          const double v = whole.phi.at((b * T + t) * H * R + i);
          if (t < T1)
            first.phi.set((b * T1 + t) * H * R + i, v);
          else
            second.phi.set((b * (T - T1) + t - T1) * H * R + i, v);
        }
    Tensor theta1 = Tensor::nans({B, T1, H, R}), fin1 = Tensor::nans({B, H, R});
    selective_rope_phases_forward(first.params(), impl, theta1.view(), fin1.view());
    second.initial_phase = fin1;
    Tensor theta2 = Tensor::nans({B, T - T1, H, R}), fin2 = Tensor::nans({B, H, R});
    selective_rope_phases_forward(second.params(), impl, theta2.view(), fin2.view());
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < H * R; ++i) {
          const double piece = t < T1 ? theta1.at((b * T1 + t) * H * R + i)
                                      : theta2.at((b * (T - T1) + t - T1) * H * R + i);
          EXPECT_NEAR(piece, theta.at((b * T + t) * H * R + i), 1e-12);
        }
    PHASOR_EXPECT_CLOSE(fin2, fin, 1e-14, "final_phase after two pieces");
  }
}

// T = 65,536 in float32: the running sums are float64, so the kernel stays within 1e-5 of the
// float64 reference (a float32 running sum of O(1) increments drifts far beyond that).
TEST(RotaryPhases, LongSequenceFloat32) {
  std::mt19937_64 rng(5);
  const std::int64_t T = testing::long_sequence_length(), H = 1, R = 8;
  PhaseCase c = make_phase_case(rng, 1, T, H, R, false, true, {}, 1.0, DType::float32);
  // Increments with a positive mean, as positions: the phase grows to ~6·10⁴.
  for (std::int64_t i = 0; i < c.phi.numel(); ++i) c.phi.set(i, 1.0 + 0.37 * c.phi.at(i));
  const Tensor d_theta = testing::randn({1, T, H, R}, rng, 1.0, DType::float32);
  const Tensor d_final = testing::randn({1, H, R}, rng, 1.0, DType::float32);
  const PhaseResult ref = run_phases(c, Impl::reference, d_theta, d_final);
  const PhaseResult fast = run_phases(c, kFast, d_theta, d_final, DType::float32);
  expect_phases_close(fast, ref, 1e-5);
  // The last phase equals the float64 sum computed here independently.
  double sum = c.initial_phase.at(0);
  for (std::int64_t t = 0; t < T; ++t) sum += c.phi.at(t * R);
  EXPECT_NEAR(fast.final_phase.at(0), sum, 1e-6 * std::fabs(sum));
}

// ---------------------------------------------------------------------------------------------
// RoPE angles.

TEST(RopeAngles, MatchFormulaWithOffsetAndVarlen) {
  const std::vector<std::int64_t> lengths = {3, 0, 1, 5};
  const Tensor cu = testing::cu_seqlens(lengths);
  const std::int64_t K = 8, R = 4, T = 9, offset = 5;
  const double base = 500.0;
  for (Impl impl : {Impl::reference, kFast})
    for (DType dtype : {DType::float64, DType::float32}) {
      Tensor theta = Tensor::nans({1, T, R}, dtype);
      rope_angles({1, T, K, base, offset, cu.view()}, impl, theta.view());
      std::int64_t t = 0;
      for (std::int64_t len : lengths)
        for (std::int64_t j = 0; j < len; ++j, ++t)
          for (std::int64_t i = 0; i < R; ++i) {
            const double expected = static_cast<double>(offset + j) * std::pow(base, -2.0 * i / K);
            EXPECT_NEAR(theta.at(t * R + i), expected, 1e-6 * std::max(1.0, expected));
          }
    }
  // Without cu_seqlens every batch row starts at offset; the kernel equals the reference exactly.
  Tensor a = Tensor::nans({3, 6, 2}), b = Tensor::nans({3, 6, 2});
  rope_angles({3, 6, 4, 10000.0, 2, {}}, Impl::reference, a.view());
  rope_angles({3, 6, 4, 10000.0, 2, {}}, kFast, b.view());
  EXPECT_TRUE(a.bit_equal(b));
  EXPECT_EQ(a.at(2 * 12 + 0), 2.0);
}

// Standard RoPE is Selective RoPE with φ = 1, θ_0 = offset − 1... here: θ_0 = offset − 1 so that
// the first token's phase is offset, and ω_i = base^(−2i/K).
TEST(RopeAngles, SpecialCaseOfSelectivePhases) {
  const std::int64_t T = 10, K = 6, R = 3, offset = 4;
  Tensor angles = Tensor::nans({1, T, R});
  rope_angles({1, T, K, 10000.0, offset, {}}, kFast, angles.view());
  Tensor phi({1, T, 1, R}, DType::float64), omega({R}, DType::float64),
      init({1, 1, R}, DType::float64);
  phi.fill(1.0);
  init.fill(offset - 1.0);
  for (std::int64_t i = 0; i < R; ++i) omega.set(i, std::pow(10000.0, -2.0 * i / K));
  Tensor theta = Tensor::nans({1, T, 1, R});
  selective_rope_phases_forward({phi.view(), omega.view(), init.view(), {}}, kFast, theta.view());
  PHASOR_EXPECT_CLOSE(theta, angles, 1e-14, "selective phases with phi = 1");
}

// ---------------------------------------------------------------------------------------------
// apply_rotary.

struct ApplyResult {
  Tensor y, dx, d_theta;
};

ApplyResult run_apply(const Tensor& x, const Tensor& theta, const Tensor& dy, RotaryLayout layout,
                      Impl impl, DType out_dtype = DType::float64) {
  ApplyResult r;
  r.y = Tensor::nans(x.shape(), out_dtype);
  r.dx = Tensor::nans(x.shape(), out_dtype);
  r.d_theta = Tensor::nans(theta.shape(), out_dtype);
  apply_rotary_forward(x.view(), theta.view(), layout, impl, r.y.view());
  apply_rotary_backward(x.view(), theta.view(), layout, impl, dy.view(), r.dx.view(),
                        r.d_theta.view());
  return r;
}

const char* name(RotaryLayout layout) {
  return layout == RotaryLayout::half_split ? "half_split" : "interleaved";
}

TEST(ApplyRotary, KernelMatchesReference) {
  std::mt19937_64 rng(6);
  for (DType dtype : {DType::float64, DType::float32})
    for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " " + name(layout));
      // T > the kernel's token block; angles up to ~6.5·10⁴ (long-context positions) and x
      // spanning several orders of magnitude.
      const std::int64_t B = 2, T = 700, H = 3, K = 10;
      Tensor x = testing::randn({B, T, H, K}, rng, 1.0, dtype);
      for (std::int64_t i = 0; i < x.numel(); i += 7) x.set(i, x.at(i) * 1e3);
      const Tensor theta = testing::uniform({B, T, H, K / 2}, rng, -65536.0, 65536.0, dtype);
      const Tensor dy = testing::randn({B, T, H, K}, rng, 1.0, dtype);
      const ApplyResult ref = run_apply(x, theta, dy, layout, Impl::reference);
      const ApplyResult fast = run_apply(x, theta, dy, layout, kFast, dtype);
      const double tol = dtype == DType::float32 ? 1e-5 : 1e-13;
      PHASOR_EXPECT_CLOSE(fast.y, ref.y, tol, "y");
      PHASOR_EXPECT_CLOSE(fast.dx, ref.dx, tol, "dx");
      PHASOR_EXPECT_CLOSE(fast.d_theta, ref.d_theta, tol, "d_theta");
    }
}

TEST(ApplyRotary, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(7);
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved})
    for (Impl impl : {Impl::reference, kFast}) {
      SCOPED_TRACE(std::string(name(layout)) + " " + to_string(impl));
      Tensor x = testing::randn({1, 5, 2, 6}, rng), theta = testing::randn({1, 5, 2, 3}, rng, 2.0);
      const Tensor w = testing::randn(x.shape(), rng);
      const ApplyResult r = run_apply(x, theta, w, layout, impl);
      auto loss = [&]() {
        Tensor y = Tensor::nans(x.shape());
        apply_rotary_forward(x.view(), theta.view(), layout, Impl::reference, y.view());
        return testing::dot(y, w);
      };
      PHASOR_EXPECT_GRADIENT(r.dx, x, loss, 1e-7, "dx");
      PHASOR_EXPECT_GRADIENT(r.d_theta, theta, loss, 1e-7, "d_theta");
    }
}

// RoPE logits depend only on m − n: <rot(q, θ_m), rot(k, θ_n)> is unchanged when both positions
// shift by the same amount.
TEST(ApplyRotary, LogitsDependOnlyOnRelativePosition) {
  std::mt19937_64 rng(8);
  const std::int64_t T = 64, K = 8, R = 4;
  Tensor angles = Tensor::nans({1, T, R});
  rope_angles({1, T, K, 10000.0, 0, {}}, kFast, angles.view());
  const TensorView shared =
      TensorView::strided(angles.view().data, DType::float64, {1, T, 1, R}, {T * R, R, 0, 1});
  // The same q (and the same k) at every position.
  const Tensor q1 = testing::randn({K}, rng), k1 = testing::randn({K}, rng);
  Tensor q({1, T, 1, K}, DType::float64), k({1, T, 1, K}, DType::float64);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < K; ++i) {
      q.set(t * K + i, q1.at(i));
      k.set(t * K + i, k1.at(i));
    }
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    Tensor qr = Tensor::nans(q.shape()), kr = Tensor::nans(k.shape());
    apply_rotary_forward(q.view(), shared, layout, kFast, qr.view());
    apply_rotary_forward(k.view(), shared, layout, kFast, kr.view());
    auto logit = [&](std::int64_t m, std::int64_t n) {
      double s = 0;
      for (std::int64_t i = 0; i < K; ++i) s += qr.at(m * K + i) * kr.at(n * K + i);
      return s;
    };
    for (std::int64_t d : {0, 1, 5, 17}) {
      const double at_zero = logit(d, 0);
      for (std::int64_t n : {3, 20, 40}) EXPECT_NEAR(logit(n + d, n), at_zero, 1e-11) << d;
    }
    EXPECT_GT(std::fabs(logit(5, 0) - logit(0, 0)), 1e-3);  // and it does depend on m − n
  }
}

// Rotating by θ then by −θ is the identity; the backward's dx is that inverse rotation.
TEST(ApplyRotary, InverseRotationIsIdentity) {
  std::mt19937_64 rng(9);
  const Tensor x = testing::randn({2, 9, 2, 6}, rng),
               theta = testing::randn({2, 9, 2, 3}, rng, 5.0);
  Tensor minus(theta.shape(), DType::float64);
  for (std::int64_t i = 0; i < theta.numel(); ++i) minus.set(i, -theta.at(i));
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved}) {
    Tensor y = Tensor::nans(x.shape()), back = Tensor::nans(x.shape()),
           dx = Tensor::nans(x.shape());
    apply_rotary_forward(x.view(), theta.view(), layout, kFast, y.view());
    apply_rotary_forward(y.view(), minus.view(), layout, kFast, back.view());
    PHASOR_EXPECT_CLOSE(back, x, 1e-14, "rotate by theta then -theta");
    apply_rotary_backward(x.view(), theta.view(), layout, kFast, y.view(), dx.view(), {});
    PHASOR_EXPECT_CLOSE(dx, x, 1e-14, "backward of y is x");
    EXPECT_GT(testing::rel_rms(y, x), 0.1);
  }
}

// interleaved(P x) = P half_split(x), with P moving column i → 2i and i + R → 2i + 1.
TEST(ApplyRotary, InterleavedIsPermutedHalfSplit) {
  std::mt19937_64 rng(10);
  const std::int64_t rows = 2 * 4 * 3, K = 8, R = 4;
  const Tensor x = testing::randn({2, 4, 3, K}, rng),
               theta = testing::randn({2, 4, 3, R}, rng, 3.0);
  auto permute = [&](const Tensor& half) {
    Tensor inter(half.shape(), DType::float64);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < R; ++i) {
        inter.set(r * K + 2 * i, half.at(r * K + i));
        inter.set(r * K + 2 * i + 1, half.at(r * K + i + R));
      }
    return inter;
  };
  const Tensor dy = testing::randn(x.shape(), rng);
  for (Impl impl : {Impl::reference, kFast}) {
    const ApplyResult half = run_apply(x, theta, dy, RotaryLayout::half_split, impl);
    const ApplyResult inter =
        run_apply(permute(x), theta, permute(dy), RotaryLayout::interleaved, impl);
    PHASOR_EXPECT_CLOSE(inter.y, permute(half.y), 1e-15, "y");
    PHASOR_EXPECT_CLOSE(inter.dx, permute(half.dx), 1e-15, "dx");
    PHASOR_EXPECT_CLOSE(inter.d_theta, half.d_theta, 1e-15, "d_theta");
  }
}

// Angles shared by heads through a zero stride equal the materialised per-head angles; strided
// (non-contiguous) x and y work.
TEST(ApplyRotary, BroadcastAndStridedViews) {
  std::mt19937_64 rng(11);
  const std::int64_t B = 2, T = 5, H = 3, K = 4, R = 2;
  const Tensor shared = testing::randn({B, T, R}, rng, 2.0);
  Tensor full({B, T, H, R}, DType::float64);
  for (std::int64_t bt = 0; bt < B * T; ++bt)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < R; ++i) full.set((bt * H + h) * R + i, shared.at(bt * R + i));
  const TensorView broadcast =
      TensorView::strided(shared.view().data, DType::float64, {B, T, H, R}, {T * R, R, 0, 1});
  // x stored as [B, H, T, K], viewed as [B, T, H, K].
  const Tensor x_bhtk = testing::randn({B, H, T, K}, rng);
  const TensorView x = TensorView::strided(x_bhtk.view().data, DType::float64, {B, T, H, K},
                                           {H * T * K, K, T * K, 1});
  Tensor x_dense({B, T, H, K}, DType::float64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t k = 0; k < K; ++k)
          x_dense.set(((b * T + t) * H + h) * K + k, x_bhtk.at(((b * H + h) * T + t) * K + k));
  for (Impl impl : {Impl::reference, kFast}) {
    Tensor expected = Tensor::nans({B, T, H, K}), y = Tensor::nans({B, T, H, K});
    apply_rotary_forward(x_dense.view(), full.view(), RotaryLayout::half_split, Impl::reference,
                         expected.view());
    apply_rotary_forward(x, broadcast, RotaryLayout::half_split, impl, y.view());
    PHASOR_EXPECT_CLOSE(y, expected, 1e-15, "broadcast angles, strided x");
  }
}

// ---------------------------------------------------------------------------------------------
// Threads and bad inputs.

TEST(Rotary, BitIdenticalForAnyThreadCount) {
  std::mt19937_64 rng(12);
  const PhaseCase c =
      make_phase_case(rng, 1, 0, 3, 4, false, true, {300, 0, 1, 900, 57}, 1.0, DType::float32);
  const auto& s = c.phi.shape();
  const Tensor d_theta = testing::randn(s, rng, 1.0, DType::float32);
  const Tensor d_final = testing::randn({c.N, s[2], s[3]}, rng, 1.0, DType::float32);
  const Tensor x = testing::randn({2, 1500, 3, 8}, rng, 1.0, DType::float32);
  const Tensor theta = testing::randn({2, 1500, 3, 4}, rng, 100.0, DType::float32);
  const Tensor dy = testing::randn(x.shape(), rng, 1.0, DType::float32);
  std::vector<PhaseResult> phases;
  std::vector<ApplyResult> applied;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    phases.push_back(run_phases(c, kFast, d_theta, d_final, DType::float32));
    applied.push_back(run_apply(x, theta, dy, RotaryLayout::interleaved, kFast, DType::float32));
  }
  set_num_threads(0);
  for (std::size_t i = 1; i < phases.size(); ++i) {
    EXPECT_TRUE(phases[i].theta.bit_equal(phases[0].theta));
    EXPECT_TRUE(phases[i].final_phase.bit_equal(phases[0].final_phase));
    EXPECT_TRUE(phases[i].d_phi.bit_equal(phases[0].d_phi));
    EXPECT_TRUE(phases[i].d_omega.bit_equal(phases[0].d_omega));
    EXPECT_TRUE(phases[i].d_initial_phase.bit_equal(phases[0].d_initial_phase));
    EXPECT_TRUE(applied[i].y.bit_equal(applied[0].y));
    EXPECT_TRUE(applied[i].dx.bit_equal(applied[0].dx));
    EXPECT_TRUE(applied[i].d_theta.bit_equal(applied[0].d_theta));
  }
}

TEST(Rotary, BadInputsNameTheArgument) {
  using testing::expect_error;
  std::mt19937_64 rng(13);
  const Tensor phi = testing::randn({1, 6, 2, 3}, rng), omega = testing::randn({2, 3}, rng);
  Tensor theta = Tensor::nans({1, 6, 2, 3}), fin = Tensor::nans({2, 2, 3});
  const Tensor cu = testing::cu_seqlens({2, 4}), bad_cu = testing::cu_seqlens({2, 3});
  const Tensor omega_bad = testing::randn({4}, rng), omega_3d = testing::randn({1, 2, 3}, rng);
  const Tensor init_bad = testing::randn({1, 2, 3}, rng);
  for (Impl impl : {Impl::reference, kFast}) {
    const std::string op =
        impl == Impl::reference ? "selective_rope_phases_reference" : "selective_rope_phases";
    expect_error(
        [&] {
          selective_rope_phases_forward({phi.view(), omega_bad.view(), {}, {}}, impl, theta.view());
        },
        {op.c_str(), "'omega'", "R (as phi)"});
    expect_error(
        [&] {
          selective_rope_phases_forward({phi.view(), omega_3d.view(), {}, {}}, impl, theta.view());
        },
        {op.c_str(), "'omega'", "[1, 2, 3]"});
    expect_error(
        [&] {
          selective_rope_phases_forward({phi.view(), {}, {}, {}}, impl, theta.view());
        },
        {op.c_str(), "'omega'"});
    expect_error(
        [&] {
          selective_rope_phases_forward({phi.view(), omega.view(), {}, bad_cu.view()}, impl,
                                        theta.view());
        },
        {op.c_str(), "cu_seqlens"});
    expect_error(
        [&] {
          selective_rope_phases_forward({phi.view(), omega.view(), init_bad.view(), cu.view()},
                                        impl, theta.view(), fin.view());
        },
        {op.c_str(), "'initial_phase'"});
    expect_error(
        [&] {
          selective_rope_phases_forward({phi.view(), omega.view(), {}, {}}, impl, fin.view());
        },
        {op.c_str(), "'theta'"});
    Tensor d_init = Tensor::nans({1, 2, 3});
    expect_error(
        [&] {
          selective_rope_phases_backward({phi.view(), omega.view(), {}, {}}, impl, theta.view(), {},
                                         {{}, {}, d_init.view()});
        },
        {op.c_str(), "'d_initial_phase'", "without initial_phase"});
    Tensor d_omega_bad = Tensor::nans({3});
    expect_error(
        [&] {
          selective_rope_phases_backward({phi.view(), omega.view(), {}, {}}, impl, theta.view(), {},
                                         {{}, d_omega_bad.view(), {}});
        },
        {op.c_str(), "'d_omega'"});

    const std::string ap = impl == Impl::reference ? "apply_rotary_reference" : "apply_rotary";
    const Tensor x_odd = testing::randn({1, 6, 2, 5}, rng), x = testing::randn({1, 6, 2, 6}, rng);
    Tensor y = Tensor::nans({1, 6, 2, 6});
    expect_error(
        [&] {
          apply_rotary_forward(x_odd.view(), theta.view(), RotaryLayout::half_split, impl,
                               y.view());
        },
        {ap.c_str(), "'x'", "even", "K = 5"});
    const Tensor theta_bad = testing::randn({1, 6, 2, 2}, rng);
    expect_error(
        [&] {
          apply_rotary_forward(x.view(), theta_bad.view(), RotaryLayout::half_split, impl,
                               y.view());
        },
        {ap.c_str(), "'theta'", "K/2"});
    expect_error(
        [&] {
          apply_rotary_forward(x.view(), theta.view(), RotaryLayout::half_split, impl,
                               theta.view());
        },
        {ap.c_str(), "'y'"});
    const TensorView theta_broadcast =
        TensorView::strided(theta.view().data, DType::float64, {1, 6, 2, 3}, {18, 3, 0, 1});
    expect_error(
        [&] {
          apply_rotary_backward(x.view(), theta.view(), RotaryLayout::half_split, impl, y.view(),
                                {}, theta_broadcast);
        },
        {ap.c_str(), "'d_theta'", "stride 0"});

    const std::string rp = impl == Impl::reference ? "rope_angles_reference" : "rope_angles";
    Tensor angles = Tensor::nans({1, 6, 3});
    expect_error(
        [&] {
          rope_angles({1, 6, 7, 10000.0, 0, {}}, impl, angles.view());
        },
        {rp.c_str(), "'head_dim'", "even"});
    expect_error(
        [&] {
          rope_angles({1, 6, 6, -1.0, 0, {}}, impl, angles.view());
        },
        {rp.c_str(), "'base'"});
    expect_error(
        [&] {
          rope_angles({1, 6, 6, 10000.0, -3, {}}, impl, angles.view());
        },
        {rp.c_str(), "'offset'"});
    expect_error(
        [&] {
          rope_angles({1, 6, 8, 10000.0, 0, {}}, impl, angles.view());
        },
        {rp.c_str(), "'theta'"});
    expect_error(
        [&] {
          rope_angles({2, 6, 6, 10000.0, 0, cu.view()}, impl, angles.view());
        },
        {rp.c_str(), "cu_seqlens"});
  }
}

}  // namespace
}  // namespace phasor
