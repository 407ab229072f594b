// phasor_testing — the cases of the short convolution's suites (short_conv_test on the CPU,
// short_conv_gpu_test on the GPU devices): one description and the same seeded inputs for both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "phasor/testing/tensor.h"

namespace phasor::testing {

struct ShortConvCase {
  std::string name;
  std::int64_t B, T, D, W;
  std::vector<std::int64_t> lengths = {};  // non-empty: packed with cu_seqlens (B = 1)
  bool bias = true;
  bool cache = true;
  bool silu = false;
  double x_scale = 1.0;
};

// float64 master copies of every input, and the cotangents dy, d_final_cache.
struct ShortConvInputs {
  ShortConvCase c;
  std::int64_t N = 0;
  Tensor x, weight, bias, cache, cu, dy, dfc;
};

// x ~ N(0, x_scale²) [B, T, D], weight ~ N(0, 0.25) [D, W], bias ~ N(0, 0.25) [D], the cache
// ~ N(0, x_scale²) [N, D, W − 1], dy and dfc ~ N(0, 1), drawn in that order from `seed`.
ShortConvInputs make_short_conv_inputs(const ShortConvCase& c, std::uint64_t seed);

}  // namespace phasor::testing
