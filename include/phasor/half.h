// phasor — 16-bit floating-point storage types: bfloat16 and float16 (IEEE 754 binary16).
//
// phasor stores tensors in these types but never computes in them: kernels convert each value to
// float32 on load, compute and accumulate in float32, and round once when they store (round to
// nearest, ties to even, as PyTorch and CUDA's __float2bfloat16_rn / __float2half_rn do). The
// conversions below are plain integer arithmetic shared by the CPU kernels, the emulated GPU and
// the CUDA kernels, so all three round a given float to the same 16 bits.
#pragma once

#include <cstdint>
#include <cstring>

// Marks a function callable from CPU code and from CUDA device code (PyTorch's C10_HOST_DEVICE).
#ifndef PHASOR_HOST_DEVICE
#if defined(__CUDACC__)
#define PHASOR_HOST_DEVICE __host__ __device__
#else
#define PHASOR_HOST_DEVICE
#endif
#endif

namespace phasor {

namespace half_detail {
PHASOR_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
PHASOR_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
}  // namespace half_detail

// bfloat16: the top 16 bits of a float32 (8 exponent bits, 7 mantissa bits).
struct bfloat16 {
  std::uint16_t bits = 0;

  PHASOR_HOST_DEVICE static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  // Round to nearest, ties to even; NaN stays a (quiet) NaN, ±inf and overflow give ±inf.
  PHASOR_HOST_DEVICE static bfloat16 from_float(float f) {
    const std::uint32_t u = half_detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
    // Adding 0x7fff plus the lowest kept bit rounds the dropped 16 bits to nearest even; a carry
    // into the exponent is the correct rounding up (and reaches inf past the largest bfloat16).
    return from_bits(static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
  }
  PHASOR_HOST_DEVICE float to_float() const {
    return half_detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
};

// float16: IEEE 754 binary16 (5 exponent bits, 10 mantissa bits, subnormals below 2^-14).
struct float16 {
  std::uint16_t bits = 0;

  PHASOR_HOST_DEVICE static float16 from_bits(std::uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }
  // Round to nearest, ties to even, with gradual underflow; |f| ≥ 65520 (the midpoint between
  // the largest float16, 65504, and the next power of two) gives ±inf.
  PHASOR_HOST_DEVICE static float16 from_float(float f) {
    std::uint32_t x = half_detail::float_bits(f);
    const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return from_bits(sign | 0x7e00u);   // NaN
    if (x >= 0x477ff000u) return from_bits(sign | 0x7c00u);  // overflow (and inf) to inf
    if (x >= 0x38800000u) {
      // Normal float16 (|f| ≥ 2^-14): rebias the exponent (127 → 15) and round the mantissa's
      // 13 dropped bits to nearest even; a carry into the exponent is the correct rounding up.
      const std::uint32_t rebiased = x - 0x38000000u;
      const std::uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);
      return from_bits(static_cast<std::uint16_t>(sign | (rounded >> 13)));
    }
    if (x <= 0x33000000u) return from_bits(sign);  // |f| ≤ 2^-25 rounds to ±0 (the tie to even)
    // Subnormal float16: m · 2^-24 with m = round(|f| · 2^24). |f| = significand · 2^(e − 150)
    // with the 24-bit significand, so m = significand / 2^(126 − e), rounded to nearest even.
    const std::uint32_t e = x >> 23;  // 102 … 112 here
    const std::uint32_t significand = (x & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14 … 24
    std::uint32_t m = significand >> shift;
    const std::uint32_t remainder = significand & ((1u << shift) - 1u),
                        halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (m & 1u))) ++m;
    return from_bits(static_cast<std::uint16_t>(sign | m));
  }
  PHASOR_HOST_DEVICE float to_float() const {
    const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000u) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu) return half_detail::bits_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
      // ±0 or a subnormal m · 2^-24 (exact in float32).
      const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
      return sign ? -magnitude : magnitude;
    }
    return half_detail::bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
};

}  // namespace phasor
