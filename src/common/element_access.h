// Element access of floating TensorViews (float32, float64, bfloat16, float16) as double, by up to
// four indices and the view's strides: what the plain reference loops (and a few small scalar
// paths) of the ops read and write through, so a reference needs no knowledge of the storage
// type. Also the storage-type dispatch (visit_float_dtype) and the conversions to and from double
// that the other readers share, the CUDA kernels' 16-byte tile loads and stores included
// (cuda/common/fill.h): those are host-device.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasor/common.h"

namespace phasor::detail {

PHASOR_HOST_DEVICE inline double to_double(float v) {
  return static_cast<double>(v);
}
PHASOR_HOST_DEVICE inline double to_double(double v) {
  return v;
}
PHASOR_HOST_DEVICE inline double to_double(bfloat16 v) {
  return static_cast<double>(v.to_float());
}
PHASOR_HOST_DEVICE inline double to_double(float16 v) {
  return static_cast<double>(v.to_float());
}

// Rounds a double to the storage type T (bfloat16 / float16 through float, as torch does).
template <class T>
PHASOR_HOST_DEVICE T from_double(double v) {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
    return T::from_float(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// Calls f(T{}) with T the storage type of a floating dtype, and returns its result.
template <class F>
PHASOR_HOST_DEVICE decltype(auto) visit_float_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float64:
      return f(double{});
    case DType::bfloat16:
      return f(bfloat16{});
    case DType::float16:
      return f(float16{});
    default:
      return f(float{});
  }
}

// The element offset of x[i0, i1, i2, i3] (indices past x's rank are ignored).
inline std::int64_t offset_of(const TensorView& x, std::int64_t i0, std::int64_t i1 = 0,
                              std::int64_t i2 = 0, std::int64_t i3 = 0) {
  const std::int64_t idx[4] = {i0, i1, i2, i3};
  std::int64_t off = 0;
  for (int d = 0; d < x.rank; ++d) off += idx[d] * x.stride(d);
  return off;
}

inline double get(const TensorView& x, std::int64_t offset) {
  switch (x.dtype) {
    case DType::float64:
      return static_cast<const double*>(x.data)[offset];
    case DType::bfloat16:
      return to_double(static_cast<const bfloat16*>(x.data)[offset]);
    case DType::float16:
      return to_double(static_cast<const float16*>(x.data)[offset]);
    default:
      return static_cast<double>(static_cast<const float*>(x.data)[offset]);
  }
}

inline void put(const TensorView& x, std::int64_t offset, double v) {
  switch (x.dtype) {
    case DType::float64:
      static_cast<double*>(x.data)[offset] = v;
      return;
    case DType::bfloat16:
      static_cast<bfloat16*>(x.data)[offset] = from_double<bfloat16>(v);
      return;
    case DType::float16:
      static_cast<float16*>(x.data)[offset] = from_double<float16>(v);
      return;
    default:
      static_cast<float*>(x.data)[offset] = static_cast<float>(v);
  }
}

}  // namespace phasor::detail
