// Internal: the emulated GPU's runtime, as seen by the portability header (simt.h) when a kernel
// source is compiled by the host compiler. Kernels never call this directly.
//
// Each CUDA thread of a block runs as a fiber; the block's scheduler (emulator.cpp) resumes a
// runnable thread, which runs until it reaches a synchronisation point (a barrier, a warp
// collective) or exits, and completes a rendezvous once every participant has arrived. The checks
// of phasor/emulator.h hook into shared-memory accesses (through SharedRef below), the global
// accessors and the rendezvous.
#pragma once

#include <cstddef>
#include <cstdint>

#include "phasor/common.h"
#include "phasor/emulator.h"
#include "simt/types.h"

namespace phasor::simt::detail {

// The running emulated thread, as the builtins (threadIdx, ...) and the checks see it.
struct ThreadContext {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
  unsigned linear = 0;                         // x + y·Dx + z·Dx·Dy
  unsigned warp = 0;                           // linear / 32
  unsigned lane = 0;                           // linear % 32
  const emulator::Options* options = nullptr;  // of the launch
};
// Set by the scheduler while a fiber runs; null outside kernels.
extern thread_local ThreadContext* tls_thread;
[[noreturn]] void outside_kernel(const char* what);
inline ThreadContext& current(const char* what = "a CUDA builtin") {
  ThreadContext* t = tls_thread;
  if (t == nullptr) outside_kernel(what);
  return *t;
}

// --- launch --------------------------------------------------------------------------------------
struct LaunchSpec {
  const char* kernel;  // the launch's text of the kernel, for messages
  Dim3 grid, block;
  std::size_t dynamic_shared_bytes;
};
// Runs every block of the grid; each thread calls invoke(closure). Rethrows the first fault.
// launch() (simt.h) returns before calling this for an empty grid, as CUDA does nothing for one;
// called directly with a zero grid dimension, it reports an invalid launch (as for a zero block).
void run_grid(const LaunchSpec& spec, void (*invoke)(const void* closure), const void* closure);

// --- shared memory -------------------------------------------------------------------------------
// One per declaration site (a static local of the kernel): names the array in messages.
struct SharedSite {
  const char* name;
  const char* file;
  int line;
};
struct Allocation;  // a block's shared-memory allocation (emulator.cpp)

// The block's allocation for `site` (created, poisoned with `poison` bytes, by the first thread of
// the block that gets here): `count` elements of `elem_size` bytes.
Allocation* shared_array(const SharedSite& site, std::size_t elem_size, std::size_t align,
                         std::int64_t count, unsigned char poison);
// The launch's dynamic shared memory; `count` receives the number of whole elements of
// `elem_size` bytes from `byte_offset` on (or is checked against that when ≥ 0).
Allocation* dynamic_shared(const SharedSite& site, std::size_t elem_size, std::size_t byte_offset,
                           std::int64_t& count);
// A block-shared object that is not element-checked (a primitive's TempStorage).
void* shared_storage(const SharedSite& site, std::size_t bytes, std::size_t align);
unsigned char* allocation_data(const Allocation* allocation);

// Checks (and records, for the race check) one access of `bytes` bytes at `byte_offset`.
void shared_read(const Allocation* allocation, std::size_t byte_offset, std::size_t bytes);
void shared_write(const Allocation* allocation, std::size_t byte_offset, std::size_t bytes);
void shared_atomic(const Allocation* allocation, std::size_t byte_offset, std::size_t bytes);
[[noreturn]] void shared_out_of_bounds(const Allocation* allocation, std::size_t byte_offset,
                                       std::size_t elem_size, std::int64_t index,
                                       std::int64_t size);
inline bool checking_bounds() {
  const ThreadContext* t = tls_thread;
  return t == nullptr || t->options->check_bounds;
}

// --- global memory -------------------------------------------------------------------------------
// An access to x[idx[0], ..., idx[count-1]] through simt::load / store: the view must be defined,
// non-null, of rank `count`, and each index within its size.
void check_global_access(const TensorView& x, const std::int64_t* idx, int count, bool write);
void check_index_dtype(const TensorView& x);  // load_index: int32 or int64
// simt::load_vector / store_vector (write) of x[idx...] (count indices), `elements` elements of
// `dtype`: the view is `loadable` (vector_loadable), the last index a multiple of `elements` and
// the whole vector in bounds.
void check_vector_access(const TensorView& x, const std::int64_t* idx, int count, DType dtype,
                         int elements, bool loadable, bool write);
[[noreturn]] void span_out_of_bounds(std::int64_t index, std::int64_t size);

// --- rendezvous ----------------------------------------------------------------------------------
// The work of a collective, run once by the scheduler when all participants have arrived: inputs[i]
// / outputs[i] are the i-th participant's (in lane or linear-thread order), `context` the first
// participant's.
using CollectiveFn = void (*)(const void* const* inputs, void* const* outputs, int count,
                              const void* context);

enum class WarpOp : std::uint8_t {
  syncwarp,
  shfl_idx,
  shfl_up,
  shfl_down,
  shfl_xor,
  ballot,
  all,
  any,
  primitive  // WarpReduce / WarpScan: `compute`
};
struct WarpCall {
  WarpOp op;
  unsigned mask;
  int width = 32;               // shuffles
  int lane_arg = 0;             // shuffles: source lane, delta or lane mask
  const void* input = nullptr;  // shuffles: the value; votes: an int predicate
  void* output = nullptr;       // shuffles: the value; ballot: unsigned; all/any: int
  std::size_t size = 0;         // bytes of a shuffled value
  CollectiveFn compute = nullptr;
  const void* context = nullptr;
  const char* name = nullptr;  // for messages ("shfl_sync", "WarpReduce::Sum", ...)
  const char* file = nullptr;
  int line = 0;
};
// Blocks the calling thread until the lanes of call.mask have all arrived.
void warp_call(WarpCall& call);

struct BlockCall {
  const char* name;  // "syncthreads", "BlockReduce::Sum", ...
  const void* input = nullptr;
  void* output = nullptr;
  CollectiveFn compute = nullptr;
  const void* context = nullptr;
  const void* temp_storage = nullptr;  // checked for reuse without a barrier in between
  bool check_reuse = true;             // false: only record the use (a primitive's second phase)
  int block_threads = 0;               // the primitive's BLOCK_THREADS (0: any)
  const char* file = nullptr;
  int line = 0;
};
// Blocks the calling thread until every thread of the block has arrived at the same call.
void block_call(BlockCall& call);

}  // namespace phasor::simt::detail
