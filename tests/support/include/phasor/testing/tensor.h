// phasor_testing — the owning host tensor of the test suites and of `phasor demo`: any phasor
// dtype, a shape, contiguous storage, values read and written as double, and TensorViews onto it
// (contiguous; other memory layouts in phasor/testing/layout.h). No GoogleTest here: the demo
// links this library too (the EXPECT adapters are in phasor/testing/gtest.h).
#pragma once

#include <cstdint>
#include <vector>

#include "phasor/common.h"

namespace phasor::testing {

using Shape = std::vector<std::int64_t>;

// An owning, contiguous (row-major) host tensor of any phasor dtype, values accessed as double.
// A default-constructed Tensor is undefined (an absent optional argument): no elements, and an
// undefined view.
class Tensor {
 public:
  Tensor() = default;
  // Zero-filled.
  Tensor(Shape shape, DType dtype);

  static Tensor zeros(Shape shape, DType dtype = DType::float64);
  static Tensor full(Shape shape, double value, DType dtype = DType::float64);
  // NaN everywhere (a floating dtype): an output buffer, so an element a kernel forgets to write
  // fails every comparison.
  static Tensor nans(Shape shape, DType dtype = DType::float64);
  // The values in row-major order; a phasor::Error if their count is not the shape's.
  static Tensor from(const Shape& shape, const std::vector<double>& values,
                     DType dtype = DType::float64);
  // A contiguous copy of a host view of any strides (undefined view: undefined Tensor).
  static Tensor copy_of(const TensorView& view);

  bool defined() const { return defined_; }
  std::int64_t numel() const { return numel_; }
  const Shape& shape() const { return shape_; }
  std::int64_t size(int dim) const;  // dim < 0 counts from the end
  int rank() const { return static_cast<int>(shape_.size()); }
  DType dtype() const { return dtype_; }
  std::size_t nbytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  // Element i in row-major order (no bounds check: the hot loops of the tests go through these).
  double at(std::int64_t i) const {
    const unsigned char* p = bytes_.data();
    switch (dtype_) {
      case DType::float32:
        return reinterpret_cast<const float*>(p)[i];
      case DType::float64:
        return reinterpret_cast<const double*>(p)[i];
      case DType::int32:
        return reinterpret_cast<const std::int32_t*>(p)[i];
      case DType::int64:
        return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
      case DType::bfloat16:
        return reinterpret_cast<const bfloat16*>(p)[i].to_float();
      case DType::float16:
        return reinterpret_cast<const float16*>(p)[i].to_float();
    }
    return 0;
  }
  void set(std::int64_t i, double v) {
    unsigned char* p = bytes_.data();
    switch (dtype_) {
      case DType::float32:
        reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
        return;
      case DType::float64:
        reinterpret_cast<double*>(p)[i] = v;
        return;
      case DType::int32:
        reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
        return;
      case DType::int64:
        reinterpret_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v);
        return;
      case DType::bfloat16:  // double → float → bfloat16: two roundings, as torch's .to() does
        reinterpret_cast<bfloat16*>(p)[i] = bfloat16::from_float(static_cast<float>(v));
        return;
      case DType::float16:
        reinterpret_cast<float16*>(p)[i] = float16::from_float(static_cast<float>(v));
        return;
    }
  }

  // A copy in another dtype (values rounded as set() rounds them).
  Tensor to(DType dtype) const;
  // The values rounded to `dtype` and back to float64: what a kernel fed `dtype` inputs sees,
  // for a float64 reference on the same inputs. Undefined stays undefined.
  Tensor rounded_to(DType dtype) const;
  std::vector<double> values() const;
  void fill(double v);
  // Same dtype, shape and bytes.
  bool bit_equal(const Tensor& other) const;

  // A contiguous view; an undefined Tensor gives an undefined view.
  TensorView view() const;

 private:
  Shape shape_;
  DType dtype_ = DType::float64;
  bool defined_ = false;
  std::int64_t numel_ = 0;
  std::vector<unsigned char> bytes_;
};

// The contiguous (row-major) view of `shape` at `data`: strides from the shape. A phasor::Error
// for a rank above TensorView::kMaxRank.
TensorView contiguous_view(void* data, DType dtype, const Shape& shape,
                           Device device = Device::cpu);

// The dtype a kernel computes in for inputs of `dtype`: float64 for float64, float32 otherwise
// (bfloat16 and float16 are storage types). States and accumulators are kept in it.
constexpr DType compute_dtype(DType dtype) {
  return dtype == DType::float64 ? DType::float64 : DType::float32;
}

}  // namespace phasor::testing
