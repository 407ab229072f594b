#include "phasor/testing/short_conv_case.h"

#include <random>

#include "phasor/testing/random.h"

namespace phasor::testing {

ShortConvInputs make_short_conv_inputs(const ShortConvCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  ShortConvInputs in;
  in.c = c;
  const Batch batch = batch_of(c.B, c.T, c.lengths);
  const std::int64_t B = batch.B, T = batch.T;
  in.N = batch.N;
  in.cu = batch.cu_seqlens;
  in.x = randn({B, T, c.D}, rng, c.x_scale);
  in.weight = randn({c.D, c.W}, rng, 0.5);
  if (c.bias) in.bias = randn({c.D}, rng, 0.5);
  if (c.cache) in.cache = randn({in.N, c.D, c.W - 1}, rng, c.x_scale);
  in.dy = randn({B, T, c.D}, rng);
  in.dfc = randn({in.N, c.D, c.W - 1}, rng);
  return in;
}

}  // namespace phasor::testing
