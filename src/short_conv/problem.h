// Internal: the short-convolution problem description — what the reference, the CPU kernel and
// the CUDA kernels all take. Plain data: trivially copyable to a kernel argument.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/sequences.h"
#include "phasor/common.h"

namespace phasor::detail::short_conv {

struct Problem {
  TensorView x;              // [B, T, D]
  TensorView weight;         // [D, W]
  TensorView bias;           // [D]; undefined: 0
  TensorView initial_cache;  // [N, D, W−1]; undefined: zeros
  Sequences sequences;
  std::int64_t B = 0, T = 0, D = 0, W = 1;
  bool silu = false;  // activation: SiLU (else the identity)
  Device device = Device::cpu;
  PHASOR_HOST_DEVICE std::int64_t num_sequences() const { return sequences.size(); }
};
static_assert(std::is_trivially_copyable_v<Problem>, "a kernel argument");

}  // namespace phasor::detail::short_conv
