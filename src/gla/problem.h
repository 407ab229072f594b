// Internal: the GLA problem description — what the reference, the CPU kernels and the CUDA kernels
// all take. Plain data (views, sizes, scalars, the cu_seqlens pointer): no std::vector, no
// std::string, trivially copyable to a kernel argument. api.cpp builds it from GlaParams after the
// metadata checks; the value checks (gates ≤ 0, cu_seqlens) run on the call's device before any
// kernel reads it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/sequences.h"
#include "phasor/common.h"

namespace phasor::detail::gla {

struct Problem {
  TensorView q, k, v, g;     // [B, T, H, K], [B, T, H, K], [B, T, H, V], [B, T, H, K]
  TensorView initial_state;  // [N, H, K, V]; undefined: S_0 = 0
  TensorView theta;          // [B, T, H, K/2]; undefined: no rotation
  RotaryLayout rotary_layout = RotaryLayout::half_split;
  Sequences sequences;
  std::int64_t B = 0, T = 0, H = 0, K = 0, V = 0;
  double scale = 1.0;
  // chunk: tokens per chunk; recurrent backward: tokens between two state checkpoints. Clamped to
  // [1, T].
  std::int64_t chunk_size = 64;
  Device device = Device::cpu;

  PHASOR_HOST_DEVICE std::int64_t num_sequences() const { return sequences.size(); }
  PHASOR_HOST_DEVICE std::int64_t num_work_items() const { return num_sequences() * H; }
};
static_assert(std::is_trivially_copyable_v<Problem>, "a kernel argument");

}  // namespace phasor::detail::gla
