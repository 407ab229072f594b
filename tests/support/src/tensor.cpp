#include "phasor/testing/tensor.h"

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "phasor/testing/layout.h"

namespace phasor::testing {
namespace {

std::int64_t count_of(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) {
    if (s < 0) throw Error("phasor::testing::Tensor: negative size " + std::to_string(s));
    n *= s;
  }
  return n;
}

}  // namespace

Tensor::Tensor(Shape shape, DType dtype)
    : shape_(std::move(shape)), dtype_(dtype), defined_(true), numel_(count_of(shape_)) {
  bytes_.assign(static_cast<std::size_t>(numel_) * element_size(dtype_), 0);
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  return Tensor(std::move(shape), dtype);
}

Tensor Tensor::full(Shape shape, double value, DType dtype) {
  Tensor t(std::move(shape), dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::nans(Shape shape, DType dtype) {
  if (!is_floating(dtype))
    throw Error(std::string("phasor::testing::Tensor::nans: a floating dtype expected, got ") +
                to_string(dtype));
  return full(std::move(shape), std::numeric_limits<double>::quiet_NaN(), dtype);
}

Tensor Tensor::from(const Shape& shape, const std::vector<double>& values, DType dtype) {
  Tensor t(shape, dtype);
  if (static_cast<std::int64_t>(values.size()) != t.numel())
    throw Error("phasor::testing::Tensor::from: " + std::to_string(values.size()) +
                " values for a shape of " + std::to_string(t.numel()) + " elements");
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, values[static_cast<std::size_t>(i)]);
  return t;
}

Tensor Tensor::copy_of(const TensorView& view) {
  if (!view.defined()) return {};
  if (view.device == Device::cuda)
    throw Error(
        "phasor::testing::Tensor::copy_of: a host view expected (cpu or emulated), got "
        "one on cuda");
  Tensor t(Shape(view.sizes.begin(), view.sizes.begin() + view.rank), view.dtype);
  const std::size_t size = element_size(view.dtype);
  const auto* source = static_cast<const unsigned char*>(view.data);
  for_each_element(view, [&](std::int64_t flat, std::int64_t offset) {
    std::memcpy(t.bytes_.data() + static_cast<std::size_t>(flat) * size,
                source + static_cast<std::ptrdiff_t>(offset) * static_cast<std::ptrdiff_t>(size),
                size);
  });
  return t;
}

std::int64_t Tensor::size(int dim) const {
  const int r = rank();
  if (dim < -r || dim >= r)
    throw Error("phasor::testing::Tensor::size: dimension " + std::to_string(dim) + " of a rank-" +
                std::to_string(r) + " tensor");
  return shape_[static_cast<std::size_t>(dim < 0 ? dim + r : dim)];
}

Tensor Tensor::to(DType dtype) const {
  if (!defined_) return {};
  Tensor t(shape_, dtype);
  for (std::int64_t i = 0; i < numel_; ++i) t.set(i, at(i));
  return t;
}

Tensor Tensor::rounded_to(DType dtype) const {
  if (!defined_) return {};
  return to(dtype).to(DType::float64);
}

std::vector<double> Tensor::values() const {
  std::vector<double> out(static_cast<std::size_t>(numel_));
  for (std::int64_t i = 0; i < numel_; ++i) out[static_cast<std::size_t>(i)] = at(i);
  return out;
}

void Tensor::fill(double v) {
  for (std::int64_t i = 0; i < numel_; ++i) set(i, v);
}

bool Tensor::bit_equal(const Tensor& other) const {
  return defined_ == other.defined_ && dtype_ == other.dtype_ && shape_ == other.shape_ &&
         bytes_ == other.bytes_;
}

TensorView Tensor::view() const {
  if (!defined_) return {};
  return contiguous_view(const_cast<unsigned char*>(bytes_.data()), dtype_, shape_);
}

TensorView contiguous_view(void* data, DType dtype, const Shape& shape, Device device) {
  if (shape.size() > static_cast<std::size_t>(TensorView::kMaxRank))
    throw Error("phasor::testing: a view of rank " + std::to_string(shape.size()) +
                " exceeds a TensorView's " + std::to_string(TensorView::kMaxRank));
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    const auto du = static_cast<std::size_t>(d);
    v.sizes[du] = shape[du];
    v.strides[du] = stride;
    stride *= shape[du];
  }
  return v;
}

}  // namespace phasor::testing
