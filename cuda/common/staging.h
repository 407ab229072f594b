// Staging of inputs that overlap outputs, for the GPU kernels of every op (included by kernel
// files, inside their own anonymous namespace, for both backends).
//
// A CPU kernel may read an input after writing an output that shares its memory (o = v in place,
// final_state = initial_state) when one thread owns both; on the GPU other blocks may still read
// what a block has written. A kernel whose inputs may overlap its outputs copies each such input
// to a contiguous workspace first: Staging(stream)(input, {outputs...}) returns the input itself or
// its copy. Exact for every dtype (the copy goes through double). Requires simt/simt.h.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "common/view_extent.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND {
namespace {

// A copy of `from` (any rank ≤ 4, any strides) into `to` of the same shape (any strides); values
// go through double, which holds every value of every floating dtype: exact between views of one
// dtype, rounded once (as simt::store rounds) into a narrower one.
PHASOR_GLOBAL void copy_kernel(TensorView from, TensorView to) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= from.numel()) return;
  std::int64_t i[TensorView::kMaxRank] = {0, 0, 0, 0}, rest = e;
  for (int k = from.rank - 1; k >= 0; --k) {
    i[k] = rest % from.size(k);
    rest /= from.size(k);
  }
  switch (from.rank) {
    case 1:
      simt::store(to, simt::load<double>(from, i[0]), i[0]);
      return;
    case 2:
      simt::store(to, simt::load<double>(from, i[0], i[1]), i[0], i[1]);
      return;
    case 3:
      simt::store(to, simt::load<double>(from, i[0], i[1], i[2]), i[0], i[1], i[2]);
      return;
    default:
      simt::store(to, simt::load<double>(from, i[0], i[1], i[2], i[3]), i[0], i[1], i[2], i[3]);
  }
}

// Queues copy_kernel(from, to) on `stream`.
inline void copy_view(const TensorView& from, const TensorView& to, cuda::Stream stream) {
  constexpr int kThreads = 256;
  const std::int64_t count = from.numel();
  if (count == 0) return;
  PHASOR_LAUNCH(copy_kernel, simt::Dim3(static_cast<unsigned>((count + kThreads - 1) / kThreads)),
                simt::Dim3(kThreads), 0, stream, from, to);
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
