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
  // Backward only, optional [B, T, HQ]: Σ_j dℓ_ij over keys outside the call (see
  // ForgettingAttnParams::dlogit_sums_elsewhere); added to a dominant key's "rest of the row".
  TensorView dlogit_sums_elsewhere;
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

// One decoding step of ForgettingAttnCache on a GPU device (Device::cuda or Device::emulated):
// this token's inputs and the cache's device buffers, as the kernels of
// cuda/forgetting_attn/recurrent.cu take them. The cache is slot-major, so growing it copies one
// contiguous prefix. The token at sequence position p (0, 1, ... since construction or reset())
// sits in slot p % ring, or slot p without a window (ring = 0); with a window w, ring = w and the
// w slots hold exactly the tokens a query can see (itself included).
struct DecodeStep {
  TensorView q;      // [B, 1, HQ, K]
  TensorView k, v;   // [B, 1, H, K], [B, 1, H, V]
  TensorView g;      // [B, 1, HQ]
  TensorView theta;  // [B, 1, H, K/2], optional: q and k rotated on load ((R1), per key head)
  RotaryLayout rotary_layout = RotaryLayout::half_split;
  TensorView slope_q, slope_k;  // [B, 1, HQ], [B, 1, H], optional additive GRAPE slopes a_t, b_t
  // The cache, in the compute type (float32, or float64 for float64 q) except the float64 sums:
  TensorView keys;    // [capacity, B, H, K]: keys, already rotated
  TensorView values;  // [capacity, B, H, V]
  TensorView decay;  // [capacity, B, HQ]: Σ_{s ∈ (p, position − 1]} g_s of the token in a slot
  TensorView key_slopes;      // [capacity, B, H] float64: b_p (0 for a token given none)
  std::int64_t ring = 0;      // slots of the ring (the window), 0: unbounded
  std::int64_t position = 0;  // this token's position: tokens fed before it
  // Whether any step so far (this one included) had slopes: the bias −(t − p)(a_t + b_p) is then
  // added to every logit (it is exactly 0 until then, so skipping it changes nothing).
  bool biased = false;
  double scale = 1.0;
  std::int64_t B = 0, HQ = 0, H = 0, K = 0, V = 0;
  std::int64_t window = kNoWindow;
  Device device = Device::cpu;

  PHASOR_HOST_DEVICE std::int64_t group() const { return HQ / H; }
  PHASOR_HOST_DEVICE std::int64_t slot_of(std::int64_t p) const { return ring > 0 ? p % ring : p; }
  // The tokens this one attends to, itself included: positions [position + 1 − visible, position].
  PHASOR_HOST_DEVICE std::int64_t visible() const {
    return window > position ? position + 1 : window;
  }
};
static_assert(std::is_trivially_copyable_v<DecodeStep>, "a kernel argument");

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
