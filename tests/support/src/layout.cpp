#include "phasor/testing/layout.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

namespace phasor::testing {
namespace {

std::vector<int> identity(int rank) {
  std::vector<int> order(static_cast<std::size_t>(rank));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

// A storage tensor of `dtype` for the values of `shape` in `layout`, and the view onto it.
TensorView lay_out(const Shape& shape, DType dtype, const MemoryLayout& layout, Tensor& storage) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> order = layout.order.empty() ? identity(rank) : layout.order;
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != identity(rank))
    throw Error("phasor::testing::MemoryLayout: 'order' must be a permutation of the " +
                std::to_string(rank) + " dimensions");
  if (layout.pad < 0 || layout.step < 1)
    throw Error("phasor::testing::MemoryLayout: 'pad' must be >= 0 and 'step' >= 1, got pad " +
                std::to_string(layout.pad) + ", step " + std::to_string(layout.step));
  TensorView view;
  view.dtype = dtype;
  view.rank = rank;
  std::int64_t stride = layout.step, elements = 1;
  for (int m = rank - 1; m >= 0; --m) {  // memory dimensions, innermost first
    const auto logical = static_cast<std::size_t>(order[static_cast<std::size_t>(m)]);
    view.sizes[logical] = shape[logical];
    view.strides[logical] = stride;
    // The innermost memory dimension's rows take step·size + pad elements.
    const std::int64_t extent =
        m == rank - 1 ? layout.step * shape[logical] + layout.pad : shape[logical];
    stride = m == rank - 1 ? extent : stride * extent;
    elements *= extent;
  }
  storage = Tensor({elements}, dtype);
  if (is_floating(dtype)) storage.fill(std::numeric_limits<double>::quiet_NaN());
  view.data = storage.data();
  return view;
}

}  // namespace

MemoryLayout MemoryLayout::swap_1_2(int rank, std::int64_t pad, std::int64_t step) {
  MemoryLayout layout{identity(rank), pad, step};
  if (rank >= 3) std::swap(layout.order[1], layout.order[2]);
  return layout;
}

MemoryLayout MemoryLayout::dim_1_innermost(int rank, std::int64_t pad, std::int64_t step) {
  MemoryLayout layout{identity(rank), pad, step};
  if (rank >= 3)
    std::rotate(layout.order.begin() + 1, layout.order.begin() + 2, layout.order.end());
  return layout;
}

StridedTensor::StridedTensor(const Tensor& logical, DType dtype, const MemoryLayout& layout) {
  if (!logical.defined()) return;
  view_ = lay_out(logical.shape(), dtype, layout, storage_);
  for_each_element(view_, [&](std::int64_t flat, std::int64_t offset) {
    storage_.set(offset, logical.at(flat));
  });
}

StridedTensor StridedTensor::nans(const Shape& shape, DType dtype, const MemoryLayout& layout) {
  StridedTensor t;
  t.view_ = lay_out(shape, dtype, layout, t.storage_);
  return t;
}

AlignedCopy::AlignedCopy(const Tensor& x, bool aligned) {
  const std::size_t size = x.nbytes();
  storage.resize(size + 128);
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  const std::size_t offset = (64 - address % 64) % 64 + (aligned ? 0 : element_size(x.dtype()));
  view = x.view();
  view.data = storage.data() + offset;
  if (size > 0) std::memcpy(view.data, x.data(), size);
}

TensorView narrow(TensorView x, int dim, std::int64_t start, std::int64_t length) {
  if (!x.defined() || dim < 0 || dim >= x.rank)
    throw Error("phasor::testing::narrow: dimension " + std::to_string(dim) + " of a view " +
                x.shape_string());
  if (start < 0 || length < 0 || start + length > x.size(dim))
    throw Error("phasor::testing::narrow: elements [" + std::to_string(start) + ", " +
                std::to_string(start + length) + ") of dimension " + std::to_string(dim) +
                " of a view " + x.shape_string());
  x.data = static_cast<unsigned char*>(x.data) +
           start * x.stride(dim) * static_cast<std::int64_t>(element_size(x.dtype));
  x.sizes[static_cast<std::size_t>(dim)] = length;
  return x;
}

}  // namespace phasor::testing
