// Element access of a float32/float64 TensorView as double, by up to four indices and the view's
// strides: what the plain reference loops (and a few small scalar paths) of the ops read and write
// through, so a reference needs no knowledge of the storage type.
#pragma once

#include <cstdint>

#include "phasor/common.h"

namespace phasor::detail {

// The element offset of x[i0, i1, i2, i3] (indices past x's rank are ignored).
inline std::int64_t offset_of(const TensorView& x, std::int64_t i0, std::int64_t i1 = 0,
                              std::int64_t i2 = 0, std::int64_t i3 = 0) {
  const std::int64_t idx[4] = {i0, i1, i2, i3};
  std::int64_t off = 0;
  for (int d = 0; d < x.rank; ++d) off += idx[d] * x.stride(d);
  return off;
}

inline double get(const TensorView& x, std::int64_t offset) {
  return x.dtype == DType::float32 ? static_cast<double>(static_cast<const float*>(x.data)[offset])
                                   : static_cast<const double*>(x.data)[offset];
}

inline void put(const TensorView& x, std::int64_t offset, double v) {
  if (x.dtype == DType::float32)
    static_cast<float*>(x.data)[offset] = static_cast<float>(v);
  else
    static_cast<double*>(x.data)[offset] = v;
}

}  // namespace phasor::detail
