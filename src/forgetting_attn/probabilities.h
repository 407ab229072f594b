// Internal: FoX's softmax probabilities without subnormal numbers, shared by the chunk and the
// recurrent kernels so that both drop the same terms.
//
// p = exp(min(x, 0)) for a logit minus its row's max or lse (x ≤ 0 exactly; the clamp keeps p ≤ 1
// when a saved lse comes from other arithmetic: logits of 1e9 in float32 differ by hundreds
// between two summation orders, and e^{ℓ − lse} would overflow to inf). Probabilities below
// √(smallest normal number) — 2^−63 in float32 (e^{x} < e^−43.7: keys ~870 tokens back under
// gates σ(3) ≈ 0.95), 2^−511 in float64 — are set to 0, and x is clamped just below log of that
// first, so that no subnormal number is made: not by the exp, nor by P·V with values down to the
// same 2^−63. Each costs Intel cores a microcode assist per instruction: FoX's chunk forward at
// B = 1, H = 8, T = 2,048 on one thread of an Emerald Rapids Xeon ran at 8.3–8.8k tokens/s with
// them, 14.5–15.5k with the CPU's denormals-are-zero mode; the recurrent forward at T = 4,096,
// 1.36–1.42k against 1.52–1.70k. A row's probabilities sum to ≥ 1 (its max is e^0), so the
// dropped terms change an output by less than T · 2^−63 relative (float32's rounding is 2^−24).
// A masked (−inf) logit is clamped and dropped the same way: exactly 0 (Eigen's vectorised exp
// alone only flushes it to the smallest normal number in float64).
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <type_traits>

namespace phasor::detail::fox {

// √(smallest normal number): the smallest probability kept.
template <class S>
S probability_cutoff() {
  static const S cutoff = std::sqrt(std::numeric_limits<S>::min());
  return cutoff;
}

// out = the probabilities exp(min(x, 0)) of `shifted` (x: logits minus their row's max or lse),
// with those below probability_cutoff() exactly 0. `out` is a contiguous vector expression (a
// row of a row-major matrix or a Vec, as .array()): the exp runs on it as one vectorised expression
// (a select() in the same expression is not vectorised by Eigen), the cut-off after.
template <class Out, class Shifted>
void probabilities(Out&& out, const Shifted& shifted) {
  using S = typename std::decay_t<Out>::Scalar;
  static const S floor = std::log(probability_cutoff<S>()) - S(1);  // exp(floor) = cutoff / e
  const S cutoff = probability_cutoff<S>();
  out = shifted.min(S(0)).max(floor).exp();
  for (Eigen::Index i = 0; i < out.size(); ++i)
    if (out.coeff(i) < cutoff) out.coeffRef(i) = S(0);
}

}  // namespace phasor::detail::fox
