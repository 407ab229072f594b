// The value checks of a call on the GPU (cuda/common/validate.h).
//
// A bad cu_seqlens must never lead a kernel out of bounds, and a positive gate must give the same
// phasor::Error as on the CPU; both need the data, which lives on the device. So before any kernel
// of a call runs, three small kernels find the first failure:
//   offsets   every offset i ∈ [0, N] against its rule (detail::offset_failure, shared with the
//             host scan); the smallest failing i wins (an integer atomic minimum: the result does
//             not depend on the order of the threads);
//   elements  every element of every checked tensor against its rule (detail::value_ok); per
//             tensor the smallest failing row-major index wins;
//   verdict   one thread turns the minima into a detail::ValueVerdict, reading the failing values,
// and the host copies the verdict back: the call's one host sync, documented in README.
#include "common/validate.h"

#include <algorithm>

#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND {
namespace {

using ::phasor::detail::OffsetFailure;
using ::phasor::detail::ValueChecks;
using ::phasor::detail::ValueVerdict;

constexpr unsigned long long kNone = ~0ull;
constexpr int kThreads = 256;

// The minima the scans agree on, in device memory.
struct Minima {
  unsigned long long offset;                           // smallest failing offset index
  unsigned long long element[ValueChecks::kMaxItems];  // per item: smallest failing element
};

// atomicMin on a 64-bit unsigned value, through compare-and-swap.
PHASOR_DEVICE void atomic_min(unsigned long long* address, unsigned long long value) {
  unsigned long long seen = *address;
  while (value < seen) {
    const unsigned long long previous = simt::atomic_cas(address, seen, value);
    if (previous == seen) return;
    seen = previous;
  }
}

PHASOR_DEVICE std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
PHASOR_DEVICE std::int64_t grid_threads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

PHASOR_GLOBAL void reset_kernel(simt::Span<Minima> minima) {
  if (threadIdx.x != 0) return;
  minima[0].offset = kNone;
  for (int i = 0; i < ValueChecks::kMaxItems; ++i) minima[0].element[i] = kNone;
}

PHASOR_GLOBAL void offsets_kernel(ValueChecks checks, simt::Span<Minima> minima) {
  for (std::int64_t i = global_thread(); i <= checks.sequences.count; i += grid_threads())
    if (::phasor::detail::offset_failure(checks.sequences, i) != OffsetFailure::none)
      atomic_min(&minima[0].offset, static_cast<unsigned long long>(i));
}

// Element `linear` (row-major) of x, as double. A rank-1 view (every contiguous tensor, see
// flattened) is read at `linear` directly: the multi-index costs a 64-bit division and remainder
// per dimension and element, which made the element scan of a chunk_gla call at fla's shape take
// 1.17 ms on an H200 (docs/cuda.md).
PHASOR_DEVICE double element(const TensorView& x, std::int64_t linear) {
  if (x.rank == 1) return simt::load<double>(x, linear);
  std::int64_t index[TensorView::kMaxRank] = {0, 0, 0, 0};
  for (int d = x.rank - 1; d >= 0; --d) {
    index[d] = linear % x.size(d);
    linear /= x.size(d);
  }
  switch (x.rank) {
    case 1:
      return simt::load<double>(x, index[0]);
    case 2:
      return simt::load<double>(x, index[0], index[1]);
    case 3:
      return simt::load<double>(x, index[0], index[1], index[2]);
    default:
      return simt::load<double>(x, index[0], index[1], index[2], index[3]);
  }
}

PHASOR_GLOBAL void elements_kernel(ValueChecks checks, simt::Span<Minima> minima) {
  for (int item = 0; item < checks.count; ++item) {
    const ValueChecks::Item& check = checks.items[item];
    const std::int64_t n = check.view.numel();
    for (std::int64_t i = global_thread(); i < n; i += grid_threads())
      if (!::phasor::detail::value_ok(check.rule, element(check.view, i)))
        atomic_min(&minima[0].element[item], static_cast<unsigned long long>(i));
  }
}

PHASOR_GLOBAL void verdict_kernel(ValueChecks checks, simt::Span<Minima> minima,
                                  simt::Span<ValueVerdict> verdict) {
  if (threadIdx.x != 0) return;
  ValueVerdict v;
  const Minima m = minima[0];
  if (m.offset != kNone) {
    const auto i = static_cast<std::int64_t>(m.offset);
    v.offset = ::phasor::detail::offset_failure(checks.sequences, i);
    v.offset_index = i;
    v.offset_value = checks.sequences.offset(i);
    v.previous_offset = i > 0 ? checks.sequences.offset(i - 1) : 0;
  } else {
    for (int item = 0; item < checks.count; ++item) {
      if (m.element[item] == kNone) continue;
      v.item = item;
      v.element = static_cast<std::int64_t>(m.element[item]);
      v.value = element(checks.items[item].view, v.element);
      break;
    }
  }
  verdict[0] = v;
}

// The checks with every contiguous tensor seen as one row of numel elements: the same elements in
// the same row-major order, so the same smallest failing index, read without a multi-index.
ValueChecks flattened(ValueChecks checks) {
  for (int item = 0; item < checks.count; ++item) {
    TensorView& view = checks.items[item].view;
    if (view.rank <= 1 || !view.is_contiguous()) continue;
    const std::int64_t n = view.numel();
    view.rank = 1;
    view.sizes = {n, 0, 0, 0};
    view.strides = {1, 0, 0, 0};
  }
  return checks;
}

}  // namespace

::phasor::detail::ValueVerdict find_value_failure(const ValueChecks& unflattened) {
  const ValueChecks checks = flattened(unflattened);
  const cuda::Stream stream = cuda::current_stream();
  simt::Workspace minima_buffer(sizeof(Minima), stream),
      verdict_buffer(sizeof(ValueVerdict), stream);
  const simt::Span<Minima> minima = minima_buffer.span<Minima>(1);
  const simt::Span<ValueVerdict> verdict = verdict_buffer.span<ValueVerdict>(1);
  PHASOR_LAUNCH(reset_kernel, simt::Dim3(1), simt::Dim3(1), 0, stream, minima);
  // Enough blocks to cover the largest scan, at most 1,024 (a grid-stride loop does the rest).
  std::int64_t largest = checks.sequences.packed() ? checks.sequences.count + 1 : 0;
  for (int item = 0; item < checks.count; ++item)
    largest = std::max(largest, checks.items[item].view.numel());
  const auto blocks = static_cast<unsigned>(
      std::min<std::int64_t>(1024, std::max<std::int64_t>(1, (largest + kThreads - 1) / kThreads)));
  if (checks.sequences.packed())
    PHASOR_LAUNCH(offsets_kernel, simt::Dim3(blocks), simt::Dim3(kThreads), 0, stream, checks,
                  minima);
  if (checks.count > 0)
    PHASOR_LAUNCH(elements_kernel, simt::Dim3(blocks), simt::Dim3(kThreads), 0, stream, checks,
                  minima);
  PHASOR_LAUNCH(verdict_kernel, simt::Dim3(1), simt::Dim3(1), 0, stream, checks, minima, verdict);
  ValueVerdict result;
  simt::copy_to_host(&result, verdict_buffer.data(), sizeof result, stream);
  return result;
}

}  // namespace phasor::PHASOR_BACKEND
