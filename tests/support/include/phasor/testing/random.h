// phasor_testing — seeded random inputs (std::mt19937_64, whose output sequence the C++ standard
// fixes, so a seed gives the same tensors on every platform), and the packed-batch description of
// a test case.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "phasor/testing/tensor.h"

namespace phasor::testing {

// x ~ N(0, stddev²), element by element in row-major order.
Tensor randn(const Shape& shape, std::mt19937_64& rng, double stddev = 1.0,
             DType dtype = DType::float64);
// x ~ U[lo, hi).
Tensor uniform(const Shape& shape, std::mt19937_64& rng, double lo, double hi,
               DType dtype = DType::float64);
// log(sigmoid(x)) with x ~ N(mean, stddev²): realistic log forget gates (≤ 0), around
// log σ(mean).
Tensor log_sigmoid_gates(const Shape& shape, std::mt19937_64& rng, double mean = 2.0,
                         double stddev = 1.0, DType dtype = DType::float64);

// The offsets [0, l0, l0 + l1, ...] of packed sequences of the given lengths.
Tensor cu_seqlens(const std::vector<std::int64_t>& lengths, DType dtype = DType::int32);

// Running sums along dimension `dim`: y[..., t, ...] = Σ_{s ≤ t} x[..., s, ...] (in float64,
// stored in x's dtype). E.g. the angles θ_t = Σ_{s ≤ t} φ_s of per-token phase increments.
Tensor cumulative_sum(const Tensor& x, int dim);

// The batch of a test case: B rows of T tokens, or, with sequence lengths, those sequences packed
// into one row (B = 1, T = their sum) with their cu_seqlens. N: the number of sequences (the
// leading size of states).
struct Batch {
  std::int64_t B = 0, T = 0, N = 0;
  Tensor cu_seqlens;  // undefined without lengths
};
Batch batch_of(std::int64_t B, std::int64_t T, const std::vector<std::int64_t>& lengths);

}  // namespace phasor::testing
