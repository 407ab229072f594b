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

}  // namespace phasor::detail
