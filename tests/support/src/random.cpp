#include "phasor/testing/random.h"

#include <cmath>
#include <string>

namespace phasor::testing {

Tensor randn(const Shape& shape, std::mt19937_64& rng, double stddev, DType dtype) {
  Tensor t(shape, dtype);
  std::normal_distribution<double> dist(0.0, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

Tensor uniform(const Shape& shape, std::mt19937_64& rng, double lo, double hi, DType dtype) {
  Tensor t(shape, dtype);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

Tensor log_sigmoid_gates(const Shape& shape, std::mt19937_64& rng, double mean, double stddev,
                         DType dtype) {
  Tensor t(shape, dtype);
  std::normal_distribution<double> dist(mean, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, -std::log1p(std::exp(-dist(rng))));
  return t;
}

Tensor cu_seqlens(const std::vector<std::int64_t>& lengths, DType dtype) {
  Tensor t({static_cast<std::int64_t>(lengths.size()) + 1}, dtype);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0)
      throw Error("phasor::testing::cu_seqlens: negative length " + std::to_string(lengths[i]));
    offset += lengths[i];
    t.set(static_cast<std::int64_t>(i) + 1, static_cast<double>(offset));
  }
  return t;
}

Tensor cumulative_sum(const Tensor& x, int dim) {
  const int rank = x.rank();
  if (dim < 0 || dim >= rank)
    throw Error("phasor::testing::cumulative_sum: dimension " + std::to_string(dim) +
                " of a rank-" + std::to_string(rank) + " tensor");
  // Row-major: dimension `dim` has `inner` elements between consecutive entries and `outer`
  // independent runs of it.
  std::int64_t inner = 1, outer = 1;
  for (int d = dim + 1; d < rank; ++d) inner *= x.size(d);
  for (int d = 0; d < dim; ++d) outer *= x.size(d);
  const std::int64_t n = x.size(dim);
  Tensor y(x.shape(), x.dtype());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      double sum = 0;
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t e = (o * n + t) * inner + i;
        sum += x.at(e);
        y.set(e, sum);
      }
    }
  return y;
}

Batch batch_of(std::int64_t B, std::int64_t T, const std::vector<std::int64_t>& lengths) {
  Batch batch;
  if (lengths.empty()) {
    batch.B = B;
    batch.T = T;
    batch.N = B;
    return batch;
  }
  batch.B = 1;
  for (std::int64_t l : lengths) batch.T += l;
  batch.N = static_cast<std::int64_t>(lengths.size());
  batch.cu_seqlens = cu_seqlens(lengths);
  return batch;
}

}  // namespace phasor::testing
