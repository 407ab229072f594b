// Internal: a small persistent thread pool. Kernels call parallel_for over independent work items
// (typically (sequence, head) pairs). Each item runs start to finish on one thread, so results do
// not depend on the thread count. Nested calls run inline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace phasor::detail {

// The flush-to-zero and denormals-are-zero modes (phasor/common.h, set_flush_denormals) of the
// current thread for a scope: on (x86 MXCSR FTZ + DAZ, AArch64 FPCR FZ) with flush, off without
// (IEEE gradual underflow, whatever the thread had: a user's thread compiled with -ffast-math
// starts with them on), the thread's own modes restored on destruction. parallel_for reads the
// setting once, on the calling thread (a bad PHASOR_FLUSH_DENORMALS throws there, before any
// worker starts), and every thread of the job takes that value, so that the arithmetic does not
// depend on which thread runs an item. The emulated GPU uses DenormalModes(false) for its blocks:
// nvcc's default code keeps subnormal numbers.
class DenormalModes {
 public:
  explicit DenormalModes(bool flush);
  ~DenormalModes();
  DenormalModes(const DenormalModes&) = delete;
  DenormalModes& operator=(const DenormalModes&) = delete;

 private:
  std::uint64_t saved_;
};

// Runs fn(i) for i in [0, n). Exceptions thrown by fn are re-thrown (the first one) after all
// items have finished. Every participating thread runs its items with the flush-to-zero and
// denormals-are-zero modes of phasor/common.h's set_flush_denormals, and gets its own back after.
void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn);

// As above, for items of about `work_per_item` multiply-adds each: no more threads than the
// total work keeps busy at kWorkPerThread each, so a call too small to repay handing work to
// another thread (one decoded token of a small model) runs on the calling thread alone. The
// thread count never changes results (each item runs start to finish on one thread).
//
// 2^19 multiply-adds (~12 µs of one core's vector work on a cache-resident state): a hand-off
// costs more than the ~0.5 µs a worker takes to start. Cache-resident items run ~1.5× slower per
// item on two threads than on one on our 2-core machines (1.1–1.3 µs against 0.7 µs per GLA head
// at K = V = 128, with every head on the same thread call after call), so a GLA or Gated
// DeltaNet token of 8 such heads (2.6 · 10^5 and 5.2 · 10^5 multiply-adds) was slower on two
// threads than on one; 32 heads (10^6, states beyond one core's L2) are 1.35× faster on two.
constexpr std::int64_t kWorkPerThread = 1 << 19;
void parallel_for(std::int64_t n, std::int64_t work_per_item,
                  const std::function<void(std::int64_t)>& fn);

// Runs fn(begin, end) over runs of consecutive items [begin, end) covering [0, items), one run
// per thread (the last may be shorter), in parallel. For kernels that keep large per-thread
// buffers across the items of a run and release them after it (common/kept_buffers.h): released
// after every item, each next item faulted them back in. Which items share a run depends on the
// thread count, so each item's arithmetic must not depend on what ran before it on its thread.
void parallel_for_runs(std::int64_t items,
                       const std::function<void(std::int64_t, std::int64_t)>& fn);

// Whether a kernel whose work comes as `items` independent (sequence, head) items should also
// split each item along the sequence: the items alone cannot keep every thread busy (fewer than
// two per thread). Kernels that do so split by boundaries fixed by the problem (chunks, value
// tiles, query blocks), never by the thread count, so only their schedule depends on this.
bool split_items(std::int64_t items);

// Whether a by-item schedule would overflow the cache its threads share: each running item keeps
// `item_bytes` in use (read again for every block of it, as attention reads an item's keys and
// values for every query block), and all threads' items together exceed kSharedCacheBytes. Such
// kernels then take one item at a time, split along the sequence as for split_items, so the
// threads share one working set in cache. FoX's forward, B = 1, H = 8, K = V = 128, float32,
// 2 threads of our 2-core machines (32 MiB of L3): at T = 16,384 (16 MiB of keys and values per
// item) 1.2× faster one item at a time; at T = 4096 and 8192 the same either way.
constexpr std::int64_t kSharedCacheBytes = std::int64_t(16) << 20;
bool items_overflow_cache(std::int64_t item_bytes);

// Chunks per window of a by-chunk schedule that keeps `bytes_per_chunk` for every chunk of every
// item in flight: at most ~16 MiB in all, between 1 and 64 chunks.
std::int64_t window_chunks(std::int64_t items, std::int64_t bytes_per_chunk);

// Heads per group of a by-item walk that takes consecutive heads of a sequence chunk by chunk (a
// token's rows of consecutive heads are adjacent in [B, T, H, D] memory, where one head's rows are
// H · D apart): the most, up to `heads` and up to 256 KiB of states (`state_bytes` per head; L2
// holds them beside a chunk's rows), that still leaves at least one group per thread; a divisor of
// `heads`, so that groups never straddle sequences. A head's arithmetic must not depend on its
// group, so that the size (chosen by thread count) never shows.
std::int64_t head_group_size(std::int64_t sequences, std::int64_t heads, std::int64_t state_bytes);

// Heads per group of a backward's by-item walk (GLA, Gated DeltaNet): head_group_size's when the
// forward kept the chunk states, else 1 — replaying them keeps O(T/C · K · V) states per head,
// which a group would multiply by its size. The backward's walk replays one head only, and checks
// that it was given one (a std::logic_error: a bug in phasor, never the caller's).
std::int64_t backward_head_group_size(std::int64_t sequences, std::int64_t heads,
                                      std::int64_t state_bytes, bool states_kept);
void check_one_replayed_head(std::int64_t count);

}  // namespace phasor::detail
