// phasor_testing — views of a Tensor's values in other memory layouts: a non-contiguous copy
// (dimensions permuted in memory, rows padded, elements spread apart), a copy at a chosen
// alignment, and slices of a view along one dimension.
#pragma once

#include <cstdint>
#include <vector>

#include "phasor/common.h"
#include "phasor/testing/tensor.h"

namespace phasor::testing {

// How the elements of a tensor lie in memory, relative to its logical (row-major) shape.
//   order: order[m] is the logical dimension stored as memory dimension m (outermost first);
//          empty is the identity. E.g. {0, 2, 1, 3}: a [B, T, H, D] tensor stored as
//          [B, H, T, D].
//   pad:   elements of padding after each row of the innermost memory dimension.
//   step:  elements from one element of the innermost memory dimension to the next (2: every
//          element is followed by a gap).
// Padding and gaps hold NaN, so a kernel that reads them is seen.
struct MemoryLayout {
  std::vector<int> order;
  std::int64_t pad = 0;
  std::int64_t step = 1;

  static MemoryLayout contiguous() { return {}; }
  // Dimensions 1 and 2 swapped in memory ([B, T, H, D] stored as [B, H, T, D]) when the rank is
  // at least 3, with `pad` elements after each innermost row and `step` between elements.
  static MemoryLayout swap_1_2(int rank, std::int64_t pad = 0, std::int64_t step = 1);
  // Dimension 1 innermost in memory ([B, T, H, D] stored as [B, H, D, T]: no dimension has
  // stride 1 once padded) when the rank is at least 3.
  static MemoryLayout dim_1_innermost(int rank, std::int64_t pad = 0, std::int64_t step = 1);
};

// A tensor's values held in a MemoryLayout: the storage and the (non-contiguous) view onto it.
// Default-constructed: undefined (an absent argument).
class StridedTensor {
 public:
  StridedTensor() = default;
  // The values of `logical` (any dtype), converted to `dtype`, laid out as `layout`.
  StridedTensor(const Tensor& logical, DType dtype, const MemoryLayout& layout);
  // An output buffer of the shape: NaN everywhere.
  static StridedTensor nans(const Shape& shape, DType dtype, const MemoryLayout& layout);

  bool defined() const { return view_.defined(); }
  const TensorView& view() const { return view_; }
  // The storage behind view() (with its padding and gaps).
  const Tensor& storage() const { return storage_; }
  // The values in the logical shape, contiguous, in the storage dtype (undefined: undefined).
  Tensor gather() const { return Tensor::copy_of(view_); }

 private:
  Tensor storage_;
  TensorView view_;
};

// A copy of `x` at a chosen alignment: on a 64-byte boundary (the recurrent forward then keeps the
// state in it, in place) or one element off it (it keeps an owned copy and stores at the end).
struct AlignedCopy {
  std::vector<unsigned char> storage;
  TensorView view;
  AlignedCopy(const Tensor& x, bool aligned);
  Tensor tensor() const { return Tensor::copy_of(view); }
};

// Elements [start, start + length) of dimension `dim` of a view (any device, dtype and strides).
TensorView narrow(TensorView x, int dim, std::int64_t start, std::int64_t length);
// Token t of a [B, T, ...] view: its [B, 1, ...] slice (an undefined view, an absent optional
// argument, stays undefined).
inline TensorView token(const TensorView& x, std::int64_t t) {
  return x.defined() ? narrow(x, 1, t, 1) : x;
}

// Calls f(flat, offset) for every element of a view: its row-major index in the logical shape
// and its offset (in elements) from view.data.
template <class F>
void for_each_element(const TensorView& v, F&& f) {
  const std::int64_t n = v.numel();
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t rest = flat, offset = 0;
    for (int d = v.rank - 1; d >= 0; --d) {
      offset += rest % v.size(d) * v.stride(d);
      rest /= v.size(d);
    }
    f(flat, offset);
  }
}

}  // namespace phasor::testing
