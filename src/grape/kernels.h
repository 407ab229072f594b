// Internal: validated problems of the GRAPE-M ops, the kernels that solve them (reference in
// reference.cpp, optimized in kernels.cpp) and the scalar functions of the Rodrigues formula
// shared by both. api.cpp validates every argument before calling.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/element_access.h"
#include "phasor/grape.h"

namespace phasor::detail::grape {

// Single plane: views already checked against z's dimensions.
struct PlaneProblem {
  TensorView z, a, b, omega, positions;
  std::int64_t B = 0, T = 0, H = 0, K = 0;
  bool ab_per_head = false;         // a, b are [H, K] (else [K])
  bool positions_per_head = false;  // positions are [B, T, H] (else [B, T])
};

void reference_plane_forward(const PlaneProblem& p, const TensorView& y);
void reference_plane_backward(const PlaneProblem& p, const TensorView& dy, const GrapeGrads& g);
void plane_forward(const PlaneProblem& p, const TensorView& y);
void plane_backward(const PlaneProblem& p, const TensorView& dy, const GrapeGrads& g);

// Multi-subspace: views checked, B orthogonal.
struct SubspaceProblem {
  TensorView z, basis, theta;
  RotaryLayout layout = RotaryLayout::half_split;
  std::int64_t B = 0, T = 0, H = 0, K = 0;
  bool basis_per_head = false;  // basis is [H, K, K] (else [K, K])
};

void reference_subspace_forward(const SubspaceProblem& p, const TensorView& y);
void reference_subspace_backward(const SubspaceProblem& p, const TensorView& dy,
                                 const GrapeSubspaceGrads& g);
void subspace_forward(const SubspaceProblem& p, const TensorView& y);
void subspace_backward(const SubspaceProblem& p, const TensorView& dy, const GrapeSubspaceGrads& g);

// a[h, k] / b[h, k] (or [k] when shared by the heads).
inline std::int64_t head_vector_offset(const TensorView& x, bool per_head, std::int64_t h,
                                       std::int64_t k) {
  return per_head ? offset_of(x, h, k) : offset_of(x, k);
}
// positions[b, t, h] (or [b, t] when shared by the heads).
inline std::int64_t position_offset(const PlaneProblem& p, const TensorView& x, std::int64_t b,
                                    std::int64_t t, std::int64_t h) {
  return p.positions_per_head ? offset_of(x, b, t, h) : offset_of(x, b, t);
}

// ---------------------------------------------------------------------------------------------
// The scalar functions of exp(η L) = I + η f1(x) L + η² f2(x) L², x = η ν (Appendix I), and of
// its derivatives with respect to Δ = ν²:
//   f1(x) = sin x / x                          A  = sin(ην)/ν         = η f1(x)
//   f2(x) = (1 − cos x) / x²                   C  = (1 − cos(ην))/ν²  = η² f2(x)
//   g1(x) = f1'(x)/x = (x cos x − sin x)/x³    ∂A/∂Δ = η³ g1(x) / 2
//   g2(x) = f2'(x)/(2x)
//         = (x sin x − 2(1 − cos x))/(2x⁴)     ∂C/∂Δ = η⁴ g2(x)
//   (∂A/∂η = cos x, ∂C/∂η = A.)
// All four are even entire functions; the closed forms lose digits to cancellation as x → 0
// (g1, g2 lose all of them), so |x| < 1 uses their Taylor series (Appendix I's "series guards"),
// summed to float64 precision (the omitted terms are < 1e-19 relative there):
//   f1 = Σ_j (−1)^j x^{2j}/(2j+1)!          f2 = Σ_j (−1)^j x^{2j}/(2j+2)!
//   g1 = Σ_j (−1)^{j+1} (2j+2) x^{2j}/(2j+3)!   g2 = Σ_j (−1)^{j+1} (j+1) x^{2j}/(2j+4)!
// For |x| ≥ 1 the closed forms lose at most ~1 digit (1 − cos x is evaluated as 2 sin²(x/2)).
struct RodriguesScalars {
  double f1, f2, g1, g2, cos_x;
};

inline RodriguesScalars rodrigues_scalars(double x) {
  RodriguesScalars r{};
  const double x2 = x * x;
  r.cos_x = std::cos(x);
  if (std::fabs(x) < 1.0) {
    // Horner over j = 0..11, term ratios from the factorials above.
    struct InverseFactorials {
      double v[28];
      InverseFactorials() {
        v[0] = 1;
        for (int n = 1; n < 28; ++n) v[n] = v[n - 1] / n;
      }
    };
    static const InverseFactorials table;
    const double* inv_fact = table.v;
    double f1 = 0, f2 = 0, g1 = 0, g2 = 0;
    for (int j = 11; j >= 0; --j) {
      const double sign = (j % 2 == 0) ? 1.0 : -1.0;
      f1 = f1 * x2 + sign * inv_fact[2 * j + 1];
      f2 = f2 * x2 + sign * inv_fact[2 * j + 2];
      g1 = g1 * x2 - sign * (2 * j + 2) * inv_fact[2 * j + 3];
      g2 = g2 * x2 - sign * (j + 1) * inv_fact[2 * j + 4];
    }
    r.f1 = f1;
    r.f2 = f2;
    r.g1 = g1;
    r.g2 = g2;
    return r;
  }
  const double s = std::sin(x), h = std::sin(0.5 * x);
  const double one_minus_cos = 2.0 * h * h;
  r.f1 = s / x;
  r.f2 = one_minus_cos / x2;
  r.g1 = (x * r.cos_x - s) / (x2 * x);
  r.g2 = (x * s - 2.0 * one_minus_cos) / (2.0 * x2 * x2);
  return r;
}

}  // namespace phasor::detail::grape
