// Internal: dispatch on a row width counted in 16-float packets (one AVX-512 register each), for
// kernels that keep a whole row of the state's width in registers.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace phasor::detail {

// Calls f(std::integral_constant<int, NP>{}) when width = 16 · NP with 1 ≤ NP ≤ 8 (a row of at
// most 128 floats, eight of the 32 vector registers) and returns true; returns false otherwise.
template <class F>
bool with_packets_of_16(std::int64_t width, F&& f) {
  if (width <= 0 || width > 128 || width % 16 != 0) return false;
  switch (width / 16) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 5:
      f(std::integral_constant<int, 5>{});
      break;
    case 6:
      f(std::integral_constant<int, 6>{});
      break;
    case 7:
      f(std::integral_constant<int, 7>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
  return true;
}

// with_packets_of_16 for kernels written for float32 on AVX-512 only: with S = float on a CPU
// build with AVX-512, as with_packets_of_16; otherwise false without calling f, so f's body (a
// generic lambda naming such a kernel) is never instantiated and the kernel need only be declared
// there. The callers' generic code runs when it returns false.
template <class S, class F>
bool with_float_packets_of_16([[maybe_unused]] std::int64_t width, [[maybe_unused]] F&& f) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float>) return with_packets_of_16(width, std::forward<F>(f));
#endif
  return false;
}

}  // namespace phasor::detail
