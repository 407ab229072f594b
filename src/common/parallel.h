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

// Whether a kernel whose work comes as `items` independent (sequence, head) items should also
// split each item along the sequence: the items alone cannot keep every thread busy (fewer than
// two per thread). Kernels that do so split by boundaries fixed by the problem (chunks, value
// tiles, query blocks), never by the thread count, so only their schedule depends on this.
bool split_items(std::int64_t items);

// Chunks per window of a by-chunk schedule that keeps `bytes_per_chunk` for every chunk of every
// item in flight: at most ~16 MiB in all, between 1 and 64 chunks.
std::int64_t window_chunks(std::int64_t items, std::int64_t bytes_per_chunk);

}  // namespace phasor::detail
