// Internal: the forgetting-attention (FoX) problem description — what the reference, the CPU
// kernels and the CUDA kernels all take — and the small pieces of arithmetic every implementation
// shares (host and device code). Plain data: trivially copyable to a kernel argument.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/sequences.h"
#include "phasor/common.h"

namespace phasor::detail::fox {

// window_size = none: every causal pair is in the window.
constexpr std::int64_t kNoWindow = INT64_MAX;

struct Problem {
  TensorView q;     // [B, T, HQ, K]
  TensorView k, v;  // [B, T, H, K], [B, T, H, V]
  TensorView g;     // [B, T, HQ]
  // Optional rotation angles θ [B, T, H, K/2], per key head: the kernels rotate k_t and the q_t
  // of the key head's query group by θ_t right after loading them (common/rotation.h, (R1)), and
  // in the backward turn the gradients with respect to the rotated rows into dq, dk and dθ
  // ((R2), (R3)). Undefined: no rotation, and nothing of it runs.
  TensorView theta;
  RotaryLayout rotary_layout = RotaryLayout::half_split;
  // Optional additive GRAPE slopes: a = slope_q [B, T, HQ], b = slope_k [B, T, H]; the logit of
  // (i, j) gets −(i − j)(a_i + b_j) (slope_bias below), i, j sequence-local positions. Undefined:
  // 0. The kernels load them as float64 columns (zeros when absent) and skip every bias loop when
  // neither is given (has_slopes()).
  TensorView slope_q, slope_k;
  Sequences sequences;
  double scale = 1.0;
  std::int64_t window = kNoWindow;  // ≥ 1
  std::int64_t block_size = 64;     // Impl::chunk tile size
  std::int64_t B = 0, T = 0, HQ = 0, H = 0, K = 0, V = 0;
  Device device = Device::cpu;

  PHASOR_HOST_DEVICE bool has_slopes() const { return slope_q.defined() || slope_k.defined(); }
  PHASOR_HOST_DEVICE std::int64_t group() const { return HQ / H; }  // query heads per key head
  PHASOR_HOST_DEVICE std::int64_t num_items() const { return sequences.size() * H; }
};
static_assert(std::is_trivially_copyable_v<Problem>, "a kernel argument");

// The first key visible from query i through the window (i − j < window), in sequence-local
// positions.
PHASOR_HOST_DEVICE inline std::int64_t window_start(std::int64_t i, std::int64_t window) {
  return window > i ? 0 : i - window + 1;
}

// The additive GRAPE bias of the pair (query at position i, key at position j ≤ i), in float64:
// −(i − j)(a_i + b_j) (GRAPE Eq. 4.6 with a_i, b_j the caller's ω-scaled gates; ALiBi: a_i = m).
// Its derivative with respect to a_i and to b_j is −(i − j).
PHASOR_HOST_DEVICE inline double slope_bias(std::int64_t i, std::int64_t j, double a_i,
                                            double b_j) {
  return -static_cast<double>(i - j) * (a_i + b_j);
}

}  // namespace phasor::detail::fox
