// phasor — options of the emulated GPU (Device::emulated) and the faults it reports.
//
// The emulated GPU runs phasor's CUDA kernels on the CPU: each CUDA thread is a fiber, warps are
// 32 threads, blocks run one after another (or spread over phasor's thread pool). Besides
// computing what the GPU computes, it checks what a GPU does not: barriers reached by only part
// of a block, warp collectives whose masks do not match the lanes that take part, shared memory
// over the architecture's limit, reads of shared memory never written, out-of-bounds shared and
// global accesses, and data races on shared memory. Each finding is a KernelFault.
#pragma once

#include <cstdint>
#include <string>

#include "phasor/common.h"

namespace phasor::emulator {

// The order in which the emulator runs the runnable threads of a block between synchronisation
// points, or the blocks of a grid. A correct kernel gives bit-identical results under every
// order; one that depends on the order has a race (which the race check also reports).
enum class Order : std::uint8_t { forward, reverse, random };
const char* to_string(Order order);

struct Options {
  Order thread_order = Order::forward;
  Order block_order = Order::forward;
  std::uint64_t seed = 0;        // of the random orders (with the block index, for threads)
  bool parallel_blocks = false;  // spread blocks over phasor's thread pool (set_num_threads)
  // Compute capability whose per-block shared-memory limits apply (80: 48 KiB static, 163 KiB
  // with dynamic; 86 and 89: 48 / 99 KiB; 90: 48 / 227 KiB). 0: the smallest architecture of
  // CMAKE_CUDA_ARCHITECTURES (80 by default).
  int target_arch = 0;
  // The checks, all on by default; turning one off only makes emulation faster.
  bool check_races = true;                 // shared-memory data races
  bool check_uninitialized_shared = true;  // reads of shared memory never written in the block
  bool check_bounds = true;                // shared, global (accessors) and workspace bounds
  bool check_shared_memory_limit = true;   // the target architecture's per-block limits
};

// The options of launches from now on (process-wide). The process starts with the defaults
// above, changed by the environment variable PHASOR_EMULATOR_SCHEDULE when it is set (read once):
// comma-separated items
//   forward | reverse | random[:SEED]         both orders (and the seed)
//   threads=ORDER, blocks=ORDER               one of them (ORDER as above)
//   parallel | sequential                     parallel_blocks
//   sm_80 | sm_90 | ...                       target_arch
// e.g. PHASOR_EMULATOR_SCHEDULE=reverse or PHASOR_EMULATOR_SCHEDULE=random:42,parallel.
// set_options throws phasor::Error for an unknown target_arch.
void set_options(const Options& options);
Options options();
// Parses a PHASOR_EMULATOR_SCHEDULE string on top of `base`; a phasor::Error naming the item
// it cannot read.
Options parse_schedule(const std::string& text, Options base = Options());
std::string to_string(const Options& options);  // "threads=reverse,blocks=random:42,sm_80,..."

// Sets options for a scope and restores the previous ones.
class ScopedOptions {
 public:
  explicit ScopedOptions(const Options& options) : previous_(emulator::options()) {
    set_options(options);
  }
  ~ScopedOptions() { set_options(previous_); }
  ScopedOptions(const ScopedOptions&) = delete;
  ScopedOptions& operator=(const ScopedOptions&) = delete;

 private:
  Options previous_;
};

}  // namespace phasor::emulator

namespace phasor::simt {

// What the emulator found.
enum class FaultKind : std::uint8_t {
  barrier_divergence,  // threads of a block at different barriers / collectives, or one exited
  warp_mask,           // a warp collective's mask does not match the lanes that take part
  deadlock,            // threads wait for one that never arrives
  shared_memory_limit,
  uninitialized_shared,
  shared_out_of_bounds,
  global_out_of_bounds,  // a global-memory accessor, or a workspace span
  race,
  invalid_launch,  // grid / block dimensions CUDA would reject
  misuse,          // a primitive used against its contract (wrong block size, storage reuse)
};
const char* to_string(FaultKind kind);

// A finding of the emulated GPU, thrown from the kernel launch. what() names the kernel, the
// block and the thread (and the source line where known), e.g.
//   "kernel 'racy_sum': block (0,0,0), thread (33,0,0) (warp 1, lane 1): data race on shared
//    array 'buf' (declared at simt_kernels.cu:120) element 34: ..."
class KernelFault : public Error {
 public:
  KernelFault(FaultKind kind, const std::string& what) : Error(what), kind_(kind) {}
  FaultKind kind() const { return kind_; }

 private:
  FaultKind kind_;
};

}  // namespace phasor::simt
