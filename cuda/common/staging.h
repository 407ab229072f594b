// Staging of inputs that overlap outputs, for the GPU kernels of every op (included by kernel
// files, inside their own anonymous namespace, for both backends).
//
// A CPU kernel may read an input after writing an output that shares its memory (o = v in place,
// final_state = initial_state) when one thread owns both; on the GPU other blocks may still read
// what a block has written. A kernel whose inputs may overlap its outputs copies each such input
// to a contiguous workspace first: Staging(stream)(input, {outputs...}) returns the input itself or
// its copy. Exact for every dtype (the copy goes through double). Also zero_views, for the outputs
// of a call with nothing to compute that are not empty (the gradients of q and k when V = 0).
// Requires simt/simt.h.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "common/view_extent.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND {
namespace {

// The row-major multi-index of element `e` of `view` (the indices past its rank are 0).
struct ElementIndex {
  std::int64_t i[TensorView::kMaxRank] = {0, 0, 0, 0};
};
PHASOR_DEVICE ElementIndex element_index(const TensorView& view, std::int64_t e) {
  ElementIndex at;
  for (int k = view.rank - 1; k >= 0; --k) {
    at.i[k] = e % view.size(k);
    e /= view.size(k);
  }
  return at;
}
PHASOR_DEVICE double load_element(const TensorView& view, const ElementIndex& at) {
  switch (view.rank) {
    case 1:
      return simt::load<double>(view, at.i[0]);
    case 2:
      return simt::load<double>(view, at.i[0], at.i[1]);
    case 3:
      return simt::load<double>(view, at.i[0], at.i[1], at.i[2]);
    default:
      return simt::load<double>(view, at.i[0], at.i[1], at.i[2], at.i[3]);
  }
}
PHASOR_DEVICE void store_element(const TensorView& view, double value, const ElementIndex& at) {
  switch (view.rank) {
    case 1:
      return simt::store(view, value, at.i[0]);
    case 2:
      return simt::store(view, value, at.i[0], at.i[1]);
    case 3:
      return simt::store(view, value, at.i[0], at.i[1], at.i[2]);
    default:
      return simt::store(view, value, at.i[0], at.i[1], at.i[2], at.i[3]);
  }
}

// A copy of `from` (any rank ≤ 4, any strides) into `to` of the same shape (any strides); values
// go through double, which holds every value of every floating dtype: exact between views of one
// dtype, rounded once (as simt::store rounds) into a narrower one.
PHASOR_GLOBAL void copy_kernel(TensorView from, TensorView to) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= from.numel()) return;
  const ElementIndex at = element_index(from, e);
  store_element(to, load_element(from, at), at);
}

// Zeros every element of `to` (any rank ≤ 4, any strides).
PHASOR_GLOBAL void zero_kernel(TensorView to) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= to.numel()) return;
  store_element(to, 0.0, element_index(to, e));
}

constexpr int kElementwiseThreads = 256;
inline simt::Dim3 elementwise_grid(std::int64_t count) {
  return simt::Dim3(static_cast<unsigned>((count + kElementwiseThreads - 1) / kElementwiseThreads));
}

// Queues copy_kernel(from, to) on `stream`.
inline void copy_view(const TensorView& from, const TensorView& to, cuda::Stream stream) {
  const std::int64_t count = from.numel();
  if (count == 0) return;
  PHASOR_LAUNCH(copy_kernel, elementwise_grid(count), simt::Dim3(kElementwiseThreads), 0, stream,
                from, to);
}

// Queues zero_kernel on `stream` for each of `views` that is defined and not empty.
inline void zero_views(std::initializer_list<TensorView> views, cuda::Stream stream) {
  for (const TensorView& to : views)
    if (to.defined() && to.numel() > 0)
      PHASOR_LAUNCH(zero_kernel, elementwise_grid(to.numel()), simt::Dim3(kElementwiseThreads), 0,
                    stream, to);
}

// Inputs staged into workspace copies, kept for the call.
class Staging {
 public:
  explicit Staging(cuda::Stream stream) : stream_(stream) {}
  // `input`, or a contiguous copy of it when it overlaps one of `outputs`.
  TensorView operator()(const TensorView& input, std::initializer_list<TensorView> outputs) {
    bool clash = false;
    for (const TensorView& out : outputs)
      clash = clash || (input.defined() && detail::overlaps(input, out));
    if (!clash) return input;
    const std::int64_t count = input.numel();
    buffers_.push_back(std::make_unique<simt::Workspace>(
        static_cast<std::size_t>(count) * element_size(input.dtype), stream_));
    TensorView copy = input;
    copy.data = buffers_.back()->data();
    std::int64_t stride = 1;
    for (int k = input.rank - 1; k >= 0; --k) {
      copy.strides[static_cast<std::size_t>(k)] = stride;
      stride *= input.size(k);
    }
    copy_view(input, copy, stream_);
    return copy;
  }

 private:
  cuda::Stream stream_;
  std::vector<std::unique_ptr<simt::Workspace>> buffers_;
};

}  // namespace
}  // namespace phasor::PHASOR_BACKEND
