// STRING rotations (op family `string_rotation`): N-dimensional RoPE angles, Cayley-STRING and
// Circulant-STRING (Schenck et al., "Learning the RoPEs: Better 2D and 3D Position Encodings with
// STRING", ../shared/papers/string.txt, sections 2–3), forward and backward.
//
// Every encoding maps a token z ∈ R^K at a position r ∈ R^C (C = d_c coordinates: 1 for text, 2
// for images, 3 for points) to R(r) z with R(r) orthogonal, such that for q and k encoded with
// the same parameters the logit q_iᵀ R(r_i)ᵀ R(r_j) k_j depends on r_j − r_i only (the relative
// law; paper eq. 4 and Definition 3.1). Each token is encoded on its own (separability).
//
// Layouts (all views may be strided; float32, float64, bfloat16 or float16; CPU):
//   z, y, dz, dy:   [B, T, H, K]  vectors to encode (queries or keys) and their encodings
//   positions:      [B, T, C]     r, one C-dimensional position per token (shared by heads)
//
// Implementations (Impl) and the op names they report in errors:
//   reference            "<op>_reference"  plain float64 loops straight from the equations
//   recurrent or chunk   "<op>"            the optimized kernel (both select it)
// with <op> one of "nd_rope_angles", "cayley_string", "circulant_string". The optimized kernels
// compute in the dtype of z (angles and position sums always in float64: positions times
// frequencies may reach thousands of radians) and are deterministic for any thread count.
// Outputs are written, never accumulated into, and must not overlap the inputs.
#pragma once

#include <cstdint>

#include "phasor/common.h"

namespace phasor {

// ---------------------------------------------------------------------------------------------
// 1. N-dimensional RoPE (paper eq. 5): RoPE(r) = Π_c RoPE_c(r_c), i.e. pair i is rotated by
//   θ[b, t, (h,) i] = Σ_c r[b, t, c] · ω[(h,) c, i]                                     (A1)
// omega: [C, R] (shared by all heads; theta is then [B, T, R]) or [H, C, R] (per head; theta is
// [B, T, H, R]). R = K/2 rotation pairs. θ feeds apply_rotary (phasor/rotary.h): a shared
// [B, T, R] θ broadcasts over heads with a zero stride,
//   TensorView::strided(data, dtype, {B, T, H, R}, {T·R, R, 0, 1}).
// Backward from dθ (theta's shape):
//   dr[b, t, c] = Σ_{(h,) i} dθ[b, t, (h,) i] ω[(h,) c, i]                              (A2)
//   dω[(h,) c, i] = Σ_{b, t} dθ[b, t, (h,) i] r[b, t, c]                                (A3)
// Angles and sums are computed in float64 and rounded to the output dtype.
void nd_rope_angles_forward(const TensorView& positions, const TensorView& omega, Impl impl,
                            const TensorView& theta);
// d_positions [B, T, C] and d_omega (omega's shape) are optional (undefined = not computed).
void nd_rope_angles_backward(const TensorView& positions, const TensorView& omega, Impl impl,
                             const TensorView& d_theta, const TensorView& d_positions,
                             const TensorView& d_omega);

// The standard axis-split frequency choice (axial 2-D/3-D RoPE, one way to fill ω; any ω works):
// the R pairs are split into C contiguous slices, axis c owning n_c = ⌊R/C⌋ pairs (the first
// R mod C axes one more), and within its slice axis c gets the 1-D RoPE spectrum of its own
// n_c pairs, ω[c, start_c + j] = base^(−j / n_c), j < n_c; ω[c, i] = 0 outside the slice.
// So each pair rotates with exactly one coordinate. omega: [C, R] float32/float64 output.
void nd_rope_axis_split_frequencies(std::int64_t num_axes, std::int64_t head_dim, double base,
                                    const TensorView& omega);

// ---------------------------------------------------------------------------------------------
// 2. Cayley-STRING (paper eq. 10 and Theorem 3.4):  y = R(r) z = RoPE(r) · P · z  with
//   P = (I − S)(I + S)^(−1),   S = A − Aᵀ  (skew-symmetric; A is the learnable parameter).
// P is orthogonal with det P = +1 (S skew ⇒ I + S invertible, its eigenvalues are 1 + iλ).
// P z is applied through Q = (I + S)^(−1), formed once per head in float64 (an LU of I + S) and
// rounded once to the compute type:  w = Q z,  u = (I − S) w = 2 w − z = P z,  y = RoPE(r) u
// (apply_rotary with θ from (A1), in the given layout). I + S has a condition number of about |S|:
// solving with it in float32 would lose that many digits, while |Q| ≤ 1 and products with it lose
// none.
// Parameterisation choice: we take a general matrix A and form S = A − Aᵀ, so every A is valid
// (no skew check) and S = 0 (e.g. A = 0 or A symmetric) recovers N-d RoPE exactly.
// Note: R(r_i)ᵀ R(r_j) = Pᵀ RoPE(r_j − r_i) P is NOT R(r_j − r_i) = RoPE(r_j − r_i) P; only the
// logits q_iᵀ R(r_i)ᵀ R(r_j) k_j = (P q_i)ᵀ RoPE(r_j − r_i) (P k_j) are relative, because q and k
// share P (it cancels between them, not inside R alone).
struct CayleyStringParams {
  TensorView z;          // [B, T, H, K], K even
  TensorView positions;  // [B, T, C]
  TensorView omega;      // [C, K/2] or [H, C, K/2]: RoPE frequencies, (A1)
  TensorView generator;  // A: [K, K] (shared by heads) or [H, K, K]; S = A − Aᵀ
  RotaryLayout layout = RotaryLayout::half_split;
};
// Adjoint (derivation, with du = RoPE(r)ᵀ dy and dθ from apply_rotary_backward):
//   u = (I − S) w        ⇒  dw = (I − S)ᵀ du = (I + S) du,   ∂L/∂S ∋ −du wᵀ
//   (I + S) w = z        ⇒  dz = (I + S)^(−T) dw  (a solve with (I + S)ᵀ = I − S, same LU)
//                            ∂L/∂S ∋ −dz wᵀ          (d(M⁻¹) = −M⁻¹ dM M⁻¹)
//   so dz = Pᵀ du,  G = ∂L/∂S = −Σ_tokens (du + dz) wᵀ,  dA = G − Gᵀ   (S = A − Aᵀ),
// and dr, dω from dθ by (A2), (A3). Each gradient output is optional. Computed as v = Qᵀ du,
// dz = 2 v − du and du + dz = 2 v ((I + S)ᵀ + (I + S) = 2I), never as the sum du + dz, which
// cancels for large S (P ≈ −I away from S's small eigenvalues).
struct CayleyStringGrads {
  TensorView dz;           // [B, T, H, K]
  TensorView d_positions;  // [B, T, C]
  TensorView d_omega;      // omega's shape
  TensorView d_generator;  // generator's shape (dA, summed over heads when A is shared)
};
void cayley_string_forward(const CayleyStringParams& params, Impl impl, const TensorView& y);
void cayley_string_backward(const CayleyStringParams& params, Impl impl, const TensorView& dy,
                            const CayleyStringGrads& grads);

// ---------------------------------------------------------------------------------------------
// 3. Circulant-STRING (paper section 3.2, Example 2 and Theorem 3.5):
//   y = exp(L(r)) z,   L(r) = Σ_c r_c (C_c − C_cᵀ),   C_c circulant with FIRST COLUMN c_c,
// i.e. (C_c x)_n = Σ_j c_c[(n − j) mod K] x_j. L(r) is a real skew-symmetric circulant, so the DFT
// F (F_{mn} = e^{−2πi mn/K}) diagonalises it with purely imaginary eigenvalues:
//   L(r) = F⁻¹ diag(i θ) F,  θ_m = Σ_c r_c μ_c[m],  μ_c[m] = 2 Im(F c_c)_m = −2 Σ_j c_c[j]
//   sin(2πjm/K) y = IFFT(e^{iθ} ⊙ FFT(z))                                             O(K log K)
//   per token.
// θ is exactly (A1) with frequencies μ: Circulant-STRING is N-d RoPE in the real Fourier basis
// (pairs (Re, Im) of bins m = 1 … ⌈K/2⌉ − 1; bin 0 and, for even K, bin K/2 are fixed points).
// Supported: any K ≥ 1, odd K included (Eigen's FFT module, kissfft backend).
// Backward (Y = e^{iθ} FFT(z), DY = FFT(dy), bins m of the half spectrum 0 < m < K/2):
//   dz = exp(L)ᵀ dy = exp(−L) dy = IFFT(e^{−iθ} ⊙ DY)
//   dθ_m = −(2/K) Im(Y_m · conj(DY_m))      (bins m and K − m together; 0 for m = 0, K/2)
//   dr, dμ from dθ by (A2), (A3);  dc_c[j] = −2 Σ_m dμ_c[m] sin(2πjm/K).
struct CirculantStringParams {
  TensorView z;          // [B, T, H, K], any K ≥ 1
  TensorView positions;  // [B, T, C]
  TensorView c;          // first columns c_c: [C, K] (shared by heads) or [H, C, K]
};
struct CirculantStringGrads {
  TensorView dz;           // [B, T, H, K]
  TensorView d_positions;  // [B, T, C]
  TensorView dc;           // c's shape (summed over heads when c is shared)
};
void circulant_string_forward(const CirculantStringParams& params, Impl impl, const TensorView& y);
void circulant_string_backward(const CirculantStringParams& params, Impl impl, const TensorView& dy,
                               const CirculantStringGrads& grads);

}  // namespace phasor
