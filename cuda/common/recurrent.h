// Device helpers shared by the recurrent kernels (cuda/gla/recurrent.cu,
// cuda/gated_delta_rule/recurrent.cu, cuda/forgetting_attn/recurrent.cu): the rotation pairs and
// their angles, and the warp sums of the register state tiles. Included by kernel files inside
// their own anonymous namespace, for both backends. Requires simt/simt.h.
#pragma once

#include <cstdint>

#include "rotary/problem.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND {
namespace {

PHASOR_HOST_DEVICE inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The columns of rotation pair i in a row of K values: (i, i + K/2) half-split, (2i, 2i + 1)
// interleaved (the CPU's pairs, src/rotary/problem.h).
PHASOR_DEVICE std::int64_t pair_a(RotaryLayout layout, std::int64_t K, std::int64_t i) {
  return ::phasor::detail::rotary::pair_a(layout, i, K / 2);
}
PHASOR_DEVICE std::int64_t pair_b(RotaryLayout layout, std::int64_t K, std::int64_t i) {
  return ::phasor::detail::rotary::pair_b(layout, i, K / 2);
}

// cos θ, sin θ of theta[b, t, h, i], evaluated in double (θ may be a phase sum of thousands of
// radians) and rounded to C — as the CPU's PairAngles.
template <class C>
PHASOR_DEVICE void angle_of(const TensorView& theta, std::int64_t b, std::int64_t t, std::int64_t h,
                            std::int64_t i, C& c, C& s) {
  double sd = 0.0, cd = 0.0;
  simt::sincos(simt::load<double>(theta, b, t, h, i), &sd, &cd);
  c = static_cast<C>(cd);
  s = static_cast<C>(sd);
}

// The sum over the 32 lanes of a warp, the same butterfly in every run; every lane gets it.
template <class C>
PHASOR_DEVICE C lane_sum(C x) {
  for (int offset = simt::kWarpSize / 2; offset > 0; offset /= 2)
    x += simt::shfl_xor_sync(simt::kFullMask, x, offset);
  return x;
}

// Sums each of the N values x[r] of every lane (N a power of two, 2 ≤ N ≤ 32) over the 32 lanes of
// the warp at once: the sum of row r ends in the 32 / N lanes whose top log2(N) bits are r
// (row_of_lane<N>), in N − 1 + log2(32 / N) shuffles where one lane_sum per row takes 5 N. At each
// halving step a lane keeps the half of its rows that its lane bit selects and adds its partner's
// copy of that half (offsets 16, 8, ...: row bit log2(N) − 1 − s = lane bit 4 − s), then the
// lanes of a row add theirs (a butterfly). A fixed tree: the same sum in every run and in every
// lane of the row (each level adds the same two numbers, a + b = b + a exactly). Overwrites x.
template <int N>
PHASOR_DEVICE int row_of_lane(int lane) {
  static_assert(N >= 2 && N <= simt::kWarpSize && (N & (N - 1)) == 0, "N: a power of two ≤ 32");
  int shift = 5;
  for (int n = N; n > 1; n /= 2) --shift;
  return lane >> shift;
}
template <int N, class C>
PHASOR_DEVICE C transpose_sum(C (&x)[N], int lane) {
  static_assert(N >= 2 && N <= simt::kWarpSize && (N & (N - 1)) == 0, "N: a power of two ≤ 32");
  int offset = simt::kWarpSize / 2;
  PHASOR_UNROLL
  for (int width = N / 2; width >= 1; width /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;
    PHASOR_UNROLL
    for (int i = 0; i < width; ++i) {
      const C keep = upper ? x[i + width] : x[i], send = upper ? x[i] : x[i + width];
      x[i] = keep + simt::shfl_xor_sync(simt::kFullMask, send, offset);
    }
  }
  C sum = x[0];
  for (; offset > 0; offset /= 2) sum += simt::shfl_xor_sync(simt::kFullMask, sum, offset);
  return sum;
}

// The recurrent backward's checkpoints, written by the forward kernel's replay: the state tile
// (K rows × 32 value columns, per head and value tile) at the start of every segment of `interval`
// tokens, [slot][heads][tiles][K][32]. Segment i of sequence n (first token at flat index f)
// uses slot n + ⌊(f + i·interval) / interval⌋ = n + ⌊f / interval⌋ + i: distinct for all (n, i)
// (slots N + ⌈B·T / interval⌉ in all), without reading cu_seqlens on the host. Empty: none.
template <class C>
struct Checkpoints {
  static constexpr int kColumns = simt::kWarpSize;
  simt::Span<C> states;
  std::int64_t interval = 1, heads = 1, K = 1, tiles = 1;

  // The slot of segment 0 of sequence n, whose first token has flat index `first`.
  PHASOR_DEVICE std::int64_t first_slot(std::int64_t n, std::int64_t first) const {
    return n + first / interval;
  }
  // Index of element (row a, lane) of head h's, value tile `tile`'s checkpoint in `slot`.
  PHASOR_DEVICE std::int64_t element(std::int64_t slot, std::int64_t h, std::int64_t tile,
                                     std::int64_t a, int lane) const {
    return (((slot * heads + h) * tiles + tile) * K + a) * kColumns + lane;
  }
};

}  // namespace
}  // namespace phasor::PHASOR_BACKEND
