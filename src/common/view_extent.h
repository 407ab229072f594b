// Internal: the memory a tensor view can touch, for aliasing decisions of the CPU kernels
// (states in place, slices.h) and of the GPU kernels (staging of inputs that overlap outputs,
// cuda/common/staging.h). Host code only; no Eigen.
#pragma once

#include <cstdint>
#include <utility>

#include "phasor/common.h"

namespace phasor::detail {

// The byte range [first, last) a view can touch (empty for an empty or undefined view).
inline std::pair<const unsigned char*, const unsigned char*> byte_range(const TensorView& x) {
  const auto* base = static_cast<const unsigned char*>(x.data);
  if (!x.defined() || x.numel() == 0) return {base, base};
  std::int64_t lo = 0, hi = 0;
  for (int d = 0; d < x.rank; ++d) {
    const std::int64_t span = (x.size(d) - 1) * x.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  const auto size = static_cast<std::int64_t>(element_size(x.dtype));
  return {base + lo * size, base + (hi + 1) * size};
}

// Whether two views' byte ranges intersect (an empty view overlaps nothing).
inline bool overlaps(const TensorView& a, const TensorView& b) {
  const auto [a0, a1] = byte_range(a);
  const auto [b0, b1] = byte_range(b);
  return a0 < b1 && b0 < a1;
}

// The same elements in the same layout (data, dtype, sizes and strides).
inline bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d)
    if (a.size(d) != b.size(d) || a.stride(d) != b.stride(d)) return false;
  return true;
}

}  // namespace phasor::detail
