// Internal: a small persistent thread pool. Kernels call parallel_for over independent work items
// (typically (sequence, head) pairs). Each item runs start to finish on one thread, so results do
// not depend on the thread count. Nested calls run inline.
#pragma once

#include <cstdint>
#include <functional>

namespace phasor::detail {

// Runs fn(i) for i in [0, n). Exceptions thrown by fn are re-thrown (the first one) after all
// items have finished.
void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn);

// As above, for items of about `work_per_item` multiply-adds each: no more threads than the
// total work keeps busy at kWorkPerThread each, so a call too small to repay handing work to
// another thread (one decoded token of a small model) runs on the calling thread alone. The
// thread count never changes results (each item runs start to finish on one thread).
constexpr std::int64_t kWorkPerThread = 1 << 14;  // ~1 µs of vector work: one hand-off's cost
void parallel_for(std::int64_t n, std::int64_t work_per_item,
                  const std::function<void(std::int64_t)>& fn);

}  // namespace phasor::detail
