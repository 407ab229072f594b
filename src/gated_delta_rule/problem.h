// Internal: the Gated DeltaNet problem description — what the reference, the CPU kernels and the
// CUDA kernels all take. Plain data (views, sizes, scalars, the cu_seqlens pointer): trivially
// copyable to a kernel argument. api.cpp builds it after the metadata checks; the value checks
// (gates ≤ 0, cu_seqlens) run on the call's device before any kernel reads it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/sequences.h"
#include "phasor/common.h"

namespace phasor::detail::gdn {

struct Problem {
  TensorView q, k;           // [B, T, H, K]
  TensorView v;              // [B, T, HV, V]
  TensorView g, beta;        // [B, T, HV]
  TensorView initial_state;  // [N, HV, K, V]; undefined: S_0 = 0
  TensorView theta;          // [B, T, H, K/2]; undefined: no rotation
  RotaryLayout rotary_layout = RotaryLayout::half_split;
  Sequences sequences;
  std::int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  std::int64_t group = 1;  // G = HV / H value heads per q/k head
  double scale = 1.0;
  bool l2norm = false;  // use_qk_l2norm_in_kernel
  // chunk: the chunk length; recurrent backward: the state checkpoint interval.
  std::int64_t chunk_size = 64;
  Device device = Device::cpu;

  PHASOR_HOST_DEVICE std::int64_t num_sequences() const { return sequences.size(); }
  // Work items of the CPU kernels: one sequence and one q/k head with its G value heads.
  PHASOR_HOST_DEVICE std::int64_t num_items() const { return num_sequences() * H; }
  // Work item i: sequence i / H (its index n in the state tensors) and q/k head i % H.
  PHASOR_HOST_DEVICE std::int64_t item_sequence(std::int64_t i) const { return i / H; }
  PHASOR_HOST_DEVICE std::int64_t item_head(std::int64_t i) const { return i % H; }
};
static_assert(std::is_trivially_copyable_v<Problem>, "a kernel argument");

}  // namespace phasor::detail::gdn
