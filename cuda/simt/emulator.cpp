// The emulated GPU: fibers, the block scheduler, shared memory and the checks.
//
// A block runs on one OS thread. Each CUDA thread is a Boost.Context fiber on a pooled stack; the
// scheduler runs rounds: it resumes every runnable thread once (in the order of
// Options::thread_order), and each runs until it reaches a barrier or a warp collective, or exits.
// A rendezvous completes as soon as its last participant arrives: the scheduler does the
// collective's work (shuffles, votes, a primitive's reduction) and makes the participants
// runnable for the next round. Arrivals and exits are checked at once against the threads that
// wait (divergent barriers, masks, exits while others wait), so a bug is reported where it is made
// rather than as a hang.
//
// Shared memory has a shadow per granule (the element for arrays, 2 bytes of dynamic shared
// memory): whether it was written in this block (the uninitialised-read check), and for the race
// check the last plain write and the reads / atomic updates since, each with the barrier epoch it
// happened in and the thread's warp clock. Two accesses of different threads, one of them a write,
// race unless a block barrier lies between them (different epochs) or, within one warp, a warp
// rendezvous of both (vector clocks over the warp's lanes). This decides races from the
// synchronisation structure alone, so it does not depend on the schedule that happened to run.
#include "simt/emulator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

// Under AddressSanitizer, Boost's ucontext fibers tell ASan about each stack switch.
#if defined(BOOST_USE_UCONTEXT) && defined(__SANITIZE_ADDRESS__) && !defined(BOOST_USE_ASAN)
#define BOOST_USE_ASAN
#endif
#include <boost/context/fiber.hpp>

#include "common/parallel.h"

#if defined(BOOST_USE_UCONTEXT)
// Debian's libboost_context is Boost's fcontext build; the ucontext build's fibers need one
// function from the library's ucontext build (libs/context/src/fiber.cpp): the record of the
// context running on this OS thread, starting with the thread's own.
namespace boost::context::detail {
fiber_activation_record*& fiber_activation_record::current() noexcept {
  thread_local fiber_activation_record toplevel;
  thread_local fiber_activation_record* running = &toplevel;
  return running;
}
}  // namespace boost::context::detail
#endif

#ifndef PHASOR_EMULATOR_DEFAULT_ARCH
#define PHASOR_EMULATOR_DEFAULT_ARCH 80
#endif

namespace phasor {

// -------------------------------------------------------------------------------------------------
// Options
// -------------------------------------------------------------------------------------------------
namespace {

struct SharedLimits {
  std::size_t static_bytes;  // per block without opt-in
  std::size_t total_bytes;   // static + dynamic, with cudaFuncAttributeMaxDynamicSharedMemorySize
};

// cudaDevAttrMaxSharedMemoryPerBlock / ...PerBlockOptin of each architecture.
bool shared_limits(int arch, SharedLimits& limits) {
  switch (arch) {
    case 70:
      limits = {48 * 1024, 96 * 1024};
      return true;
    case 75:
      limits = {48 * 1024, 64 * 1024};
      return true;
    case 80:
      limits = {48 * 1024, 163 * 1024};
      return true;
    case 86:
    case 89:
      limits = {48 * 1024, 99 * 1024};
      return true;
    case 90:
      limits = {48 * 1024, 227 * 1024};
      return true;
    default:
      return false;
  }
}

}  // namespace

namespace emulator {
namespace {

void check_arch(int arch, const std::string& what) {
  SharedLimits unused;
  if (arch != 0 && !shared_limits(arch, unused))
    throw Error(what +
                ": expected a compute capability of 70, 75, 80, 86, 89 or 90 (or 0: the "
                "smallest built one), got " +
                std::to_string(arch));
}

bool parse_order(const std::string& text, Order& order, std::uint64_t& seed, bool& seeded) {
  if (text == "forward") {
    order = Order::forward;
  } else if (text == "reverse") {
    order = Order::reverse;
  } else if (text == "random") {
    order = Order::random;
  } else if (text.rfind("random:", 0) == 0 && text.size() > 7) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text.c_str() + 7, &end, 10);
    if (*end != '\0' || text[7] == '-') return false;
    order = Order::random;
    seed = value;
    seeded = true;
  } else {
    return false;
  }
  return true;
}

std::mutex g_options_mutex;
bool g_options_ready = false;
Options g_options;

// The process default: the defaults, changed by PHASOR_EMULATOR_SCHEDULE (read once).
void ensure_options_locked() {
  if (g_options_ready) return;
  Options initial;
  if (const char* env = std::getenv("PHASOR_EMULATOR_SCHEDULE")) {
    try {
      initial = parse_schedule(env, initial);
    } catch (const Error& e) {
      throw Error(std::string("environment variable PHASOR_EMULATOR_SCHEDULE: ") + e.what());
    }
  }
  g_options = initial;
  g_options_ready = true;
}

}  // namespace

const char* to_string(Order order) {
  switch (order) {
    case Order::forward:
      return "forward";
    case Order::reverse:
      return "reverse";
    case Order::random:
      return "random";
  }
  return "?";
}

Options parse_schedule(const std::string& text, Options base) {
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    bool seeded = false;
    std::uint64_t seed = base.seed;
    Order order;
    bool ok = true;
    if (item == "parallel") {
      base.parallel_blocks = true;
    } else if (item == "sequential") {
      base.parallel_blocks = false;
    } else if (item.rfind("sm_", 0) == 0) {
      char* end = nullptr;
      const long arch = std::strtol(item.c_str() + 3, &end, 10);
      SharedLimits unused;
      ok = *end == '\0' && shared_limits(static_cast<int>(arch), unused);
      if (ok) base.target_arch = static_cast<int>(arch);
    } else if (item.rfind("threads=", 0) == 0) {
      ok = parse_order(item.substr(8), order, seed, seeded);
      if (ok) base.thread_order = order;
    } else if (item.rfind("blocks=", 0) == 0) {
      ok = parse_order(item.substr(7), order, seed, seeded);
      if (ok) base.block_order = order;
    } else {
      ok = parse_order(item, order, seed, seeded);
      if (ok) base.thread_order = base.block_order = order;
    }
    if (!ok)
      throw Error("emulator schedule '" + text +
                  "': expected comma-separated items forward, "
                  "reverse, random[:SEED], threads=ORDER, blocks=ORDER, parallel, sequential or "
                  "sm_70|75|80|86|89|90, got '" +
                  item + "'");
    if (seeded) base.seed = seed;
  }
  return base;
}

std::string to_string(const Options& o) {
  std::string s = std::string("threads=") + to_string(o.thread_order) +
                  ",blocks=" + to_string(o.block_order) + ",seed=" + std::to_string(o.seed) +
                  (o.parallel_blocks ? ",parallel" : ",sequential") + ",sm_" +
                  std::to_string(o.target_arch ? o.target_arch : PHASOR_EMULATOR_DEFAULT_ARCH);
  if (!o.check_races) s += ",no-race-check";
  if (!o.check_uninitialized_shared) s += ",no-uninitialized-check";
  if (!o.check_bounds) s += ",no-bounds-check";
  if (!o.check_shared_memory_limit) s += ",no-shared-limit-check";
  return s;
}

void set_options(const Options& options) {
  check_arch(options.target_arch, "emulator::set_options: argument 'target_arch'");
  std::lock_guard<std::mutex> lock(g_options_mutex);
  g_options = options;
  g_options_ready = true;
}

Options options() {
  std::lock_guard<std::mutex> lock(g_options_mutex);
  ensure_options_locked();
  return g_options;
}

}  // namespace emulator

namespace simt {

const char* to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::barrier_divergence:
      return "barrier divergence";
    case FaultKind::warp_mask:
      return "warp mask";
    case FaultKind::deadlock:
      return "deadlock";
    case FaultKind::shared_memory_limit:
      return "shared memory limit";
    case FaultKind::uninitialized_shared:
      return "uninitialized shared memory";
    case FaultKind::shared_out_of_bounds:
      return "shared memory out of bounds";
    case FaultKind::global_out_of_bounds:
      return "global memory out of bounds";
    case FaultKind::race:
      return "data race";
    case FaultKind::invalid_launch:
      return "invalid launch";
    case FaultKind::misuse:
      return "misuse";
  }
  return "?";
}

namespace detail {

thread_local ThreadContext* tls_thread = nullptr;

namespace {

namespace ctx = boost::context;
using emulator::Options;
using emulator::Order;

constexpr unsigned kWarp = 32;
constexpr std::uint16_t kSeveralWarps = 0xffff;
// Dynamic shared memory is tracked in 2-byte units: the smallest element a view may have.
constexpr std::size_t kDynamicGranule = 2;

// Kernel frames are small, but sanitizer builds grow them several times.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kStackBytes = 512 * 1024;
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif

// -------------------------------------------------------------------------------------------------
// Fiber stacks: mmap'ed with a guard page below (a stack overflow faults instead of corrupting a
// neighbour), kept in a pool per OS thread and reused by every block that thread runs.
// -------------------------------------------------------------------------------------------------
class StackPool {
 public:
  explicit StackPool(std::size_t usable) {
    page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    size_ = (usable + page_ - 1) / page_ * page_ + page_;
  }
  ~StackPool() {
    for (void* base : all_) munmap(base, size_);
  }
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  ctx::stack_context allocate() {
    void* base;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
                  -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      if (mprotect(base, page_, PROT_NONE) != 0) {
        munmap(base, size_);
        throw std::bad_alloc();
      }
      all_.push_back(base);
    }
    ctx::stack_context stack;
    stack.size = size_;
    stack.sp = static_cast<char*>(base) + size_;
    return stack;
  }
  void deallocate(ctx::stack_context& stack) noexcept {
    free_.push_back(static_cast<char*>(stack.sp) - stack.size);
  }

 private:
  std::size_t page_, size_;
  std::vector<void*> free_, all_;
};

// The stack allocator handed to each fiber: a handle to the OS thread's pool.
struct PooledStack {
  StackPool* pool;
  ctx::stack_context allocate() { return pool->allocate(); }
  void deallocate(ctx::stack_context& stack) noexcept { pool->deallocate(stack); }
};

// -------------------------------------------------------------------------------------------------
// Launch, block, thread, shared allocations
// -------------------------------------------------------------------------------------------------
struct Launch {
  LaunchSpec spec;
  Options options;
  int arch = 0;
  SharedLimits limits{};
  unsigned threads_per_block = 0;
  void (*invoke)(const void*) = nullptr;
  const void* closure = nullptr;
  std::atomic<bool> failed{false};  // parallel blocks: stop starting new ones
};

enum class State : std::uint8_t { runnable, at_warp, at_block, done };

struct Block;

struct Thread : ThreadContext {
  Block* block = nullptr;
  ctx::fiber fiber;      // this thread, while it is suspended
  ctx::fiber scheduler;  // the scheduler, while this thread runs
  State state = State::runnable;
  WarpCall* warp_call = nullptr;  // at_warp
  // What identifies its rendezvous, copied from *warp_call so that the checks of each arrival
  // compare the warp's Thread records rather than chase pointers into 32 fiber stacks.
  struct Signature {
    unsigned mask = 0;
    WarpOp op = WarpOp::syncwarp;
    int width = 0;
    std::size_t size = 0;
    CollectiveFn compute = nullptr;
    bool operator==(const Signature& o) const {
      return mask == o.mask && op == o.op && width == o.width && size == o.size &&
             compute == o.compute;
    }
  } signature;
  BlockCall* block_call = nullptr;  // at_block
  // Vector clock over the lanes of the warp, advanced by warp rendezvous: vc[lane] is this
  // thread's own clock; vc[u] the latest clock of lane u that a rendezvous made it see.
  std::uint32_t vc[kWarp] = {};
  std::exception_ptr error;
};

// Per granule of a shared allocation (see the file comment).
struct Shadow {
  std::uint32_t generation = 0;    // the block it belongs to; another one: not yet touched
  std::uint32_t write_epoch = 0;   // barrier epoch of the last plain write (0: none)
  std::uint32_t writer_clock = 0;  // the writer's own warp clock then
  std::uint32_t access_epoch = 0;  // epoch of the reads / atomics below
  std::uint32_t read_lanes = 0;    // lanes of access_warp that read since the last write
  std::uint32_t atomic_lanes = 0;  // ... that updated it atomically
  std::uint16_t writer = 0;        // linear id of the last plain writer
  std::uint16_t access_warp = 0;   // kSeveralWarps: accesses from two warps or more
  bool initialized = false;
  bool several_read = false, several_atomic = false;  // with kSeveralWarps
};

}  // namespace

// Declared in emulator.h (the header's handles point to it).
struct Allocation {
  const SharedSite* site = nullptr;  // null: the launch's dynamic shared memory
  std::size_t bytes = 0, granule = 1;
  unsigned char* data = nullptr;
  Shadow* shadow = nullptr;
  std::uint32_t* clocks = nullptr;  // [granule][lane]: the clock of the lane's last access

  // Reused by later blocks of the same OS thread.
  struct AlignedFree {
    void operator()(unsigned char* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<unsigned char, AlignedFree> data_buffer;
  std::size_t data_capacity = 0;
  std::vector<Shadow> shadow_buffer;
  std::vector<std::uint32_t> clock_buffer;
};

namespace {

struct Block {
  // The lanes of one warp by state (a lane in none of them is runnable), for the rendezvous
  // checks of each arrival.
  struct WarpLanes {
    unsigned at_warp = 0, at_block = 0, done = 0;
  };

  Launch* launch = nullptr;
  Dim3 idx;
  std::uint64_t linear = 0;
  std::vector<Thread> threads;
  std::vector<WarpLanes> warps;
  std::uint32_t epoch = 1;  // advanced by every completed block barrier
  std::uint32_t generation = 0;
  std::vector<Allocation*> allocations;
  Allocation* dynamic = nullptr;
  std::size_t static_bytes = 0;
  unsigned at_barrier = 0, done = 0;
  bool discarding = false;  // a fault ended the block: its fibers are being unwound
  // A primitive's TempStorage → the epoch after its last use, and which primitive that was.
  struct StorageUse {
    const void* storage;
    std::uint32_t epoch;
    const char* name;
  };
  std::vector<StorageUse> storage_uses;
  std::vector<Thread*> released;  // made runnable for the next round
};

// What each OS thread keeps between blocks: fiber stacks and shared-memory buffers.
struct Worker {
  StackPool stacks{kStackBytes};
  std::vector<std::unique_ptr<Allocation>> allocations;
  std::size_t used = 0;
  std::uint32_t generation = 0;

  Allocation* take(std::size_t bytes, std::size_t granule, unsigned char poison) {
    if (used == allocations.size()) allocations.push_back(std::make_unique<Allocation>());
    Allocation& a = *allocations[used++];
    if (a.data_capacity < bytes) {
      a.data_buffer.reset(static_cast<unsigned char*>(::operator new(bytes, std::align_val_t(64))));
      a.data_capacity = bytes;
    }
    const std::size_t granules = (bytes + granule - 1) / granule;
    if (a.shadow_buffer.size() < granules) {
      a.shadow_buffer.resize(granules);
      a.clock_buffer.resize(granules * kWarp);
    }
    a.site = nullptr;
    a.bytes = bytes;
    a.granule = granule;
    a.data = a.data_buffer.get();
    a.shadow = a.shadow_buffer.data();
    a.clocks = a.clock_buffer.data();
    if (bytes > 0) std::memset(a.data, poison, bytes);
    return &a;
  }
};

Worker& worker() {
  thread_local Worker w;
  return w;
}

Thread& running(const char* what) {
  return static_cast<Thread&>(current(what));
}

// -------------------------------------------------------------------------------------------------
// Messages
// -------------------------------------------------------------------------------------------------
std::string dim3_string(const Dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}
std::string site_string(const char* file, int line) {
  if (file == nullptr) return "?";
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}
std::string hex(unsigned mask) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "0x%08x", mask);
  return buffer;
}
std::string thread_string(const Thread& t) {
  return "thread " + dim3_string(t.thread_idx) + " (warp " + std::to_string(t.warp) + ", lane " +
         std::to_string(t.lane) + ")";
}
std::string prefix(const Thread& t) {
  return "kernel '" + std::string(t.block->launch->spec.kernel) + "': block " +
         dim3_string(t.block->idx) + ", " + thread_string(t) + ": ";
}
std::string describe(const WarpCall& c) {
  return std::string(c.name) + "(mask " + hex(c.mask) + ") at " + site_string(c.file, c.line);
}
std::string describe(const BlockCall& c) {
  return std::string(c.name) + " at " + site_string(c.file, c.line);
}
std::string describe_site(const SharedSite* site) {
  if (site == nullptr) return "dynamic shared memory";
  return "shared array '" + std::string(site->name) + "' (declared at " +
         site_string(site->file, site->line) + ")";
}
std::string describe_array(const Allocation& a) {
  return describe_site(a.site);
}
std::string describe_element(const Allocation& a, std::size_t granule_index) {
  if (a.site == nullptr)
    return describe_array(a) + " at byte " + std::to_string(granule_index * a.granule);
  return describe_array(a) + " element " + std::to_string(granule_index);
}

[[noreturn]] void fault(const Thread& t, FaultKind kind, const std::string& what) {
  throw KernelFault(kind, prefix(t) + what);
}
// From the header's checks: inside a kernel with its context, else (host code) without.
[[noreturn]] void fault_here(FaultKind kind, const std::string& what) {
  if (tls_thread != nullptr) fault(static_cast<const Thread&>(*tls_thread), kind, what);
  throw KernelFault(kind, "simt: " + what);
}

// -------------------------------------------------------------------------------------------------
// Shared-memory checks
// -------------------------------------------------------------------------------------------------
enum class Access : std::uint8_t { read, write, atomic };

const char* verb(Access access) {
  switch (access) {
    case Access::read:
      return "reads";
    case Access::write:
      return "writes";
    case Access::atomic:
      return "updates atomically";
  }
  return "?";
}

// Within one barrier epoch: is the other thread's access (made at its warp clock `clock`)
// ordered before now by a warp rendezvous of both?
bool ordered_after(const Thread& t, unsigned other, std::uint32_t clock) {
  return other / kWarp == t.warp && t.vc[other % kWarp] > clock;
}

[[noreturn]] void report_race(const Thread& t, const Allocation& a, std::size_t g, Access access,
                              const std::string& other, const char* other_verb, bool same_warp) {
  fault(t, FaultKind::race,
        "data race on " + describe_element(a, g) + ": this thread " + verb(access) + " it after " +
            other + " " + other_verb + " it, with no syncthreads between them" +
            (same_warp ? " and no syncwarp or warp collective of both since"
                       : " (they are in different warps)"));
}

void check_lanes(const Thread& t, const Allocation& a, std::size_t g, Access access,
                 const Shadow& s, std::uint32_t lanes, const char* other_verb) {
  for (unsigned u = 0; u < kWarp; ++u) {
    if (!((lanes >> u) & 1u)) continue;
    const unsigned other = s.access_warp * kWarp + u;
    if (other == t.linear) continue;
    if (!ordered_after(t, other, a.clocks[g * kWarp + u]))
      report_race(t, a, g, access, thread_string(t.block->threads[other]), other_verb,
                  s.access_warp == t.warp);
  }
}

void check_granule(Thread& t, Allocation& a, std::size_t g, Access access) {
  Shadow& s = a.shadow[g];
  const Block& b = *t.block;
  if (s.generation != b.generation) {
    s = Shadow();
    s.generation = b.generation;
  }
  const Options& o = *t.options;
  if (access != Access::write && o.check_uninitialized_shared && !s.initialized)
    fault(t, FaultKind::uninitialized_shared,
          "this thread " + std::string(verb(access)) + " " + describe_element(a, g) +
              ", which no thread of this block has written (it holds a poison pattern)");
  if (access == Access::write) s.initialized = true;
  if (!o.check_races) return;

  const std::uint32_t epoch = b.epoch;
  // Against the last plain write (a write after a write, or a read or atomic after one).
  if (s.write_epoch == epoch && s.writer != t.linear && !ordered_after(t, s.writer, s.writer_clock))
    report_race(t, a, g, access, thread_string(b.threads[s.writer]), "wrote",
                s.writer / kWarp == t.warp);
  // Against the reads and atomic updates since (atomics do not race with each other).
  if (s.access_epoch == epoch) {
    const bool against_reads = access != Access::read;
    const bool against_atomics = access != Access::atomic;
    if (s.access_warp == kSeveralWarps) {
      if ((against_reads && s.several_read) || (against_atomics && s.several_atomic))
        fault(t, FaultKind::race,
              "data race on " + describe_element(a, g) + ": this thread " + verb(access) +
                  " it after threads of several warps " + (s.several_read ? "read" : "updated") +
                  " it, with no syncthreads between them");
    } else {
      if (against_reads) check_lanes(t, a, g, access, s, s.read_lanes, "read");
      if (against_atomics) check_lanes(t, a, g, access, s, s.atomic_lanes, "updated");
    }
  }

  // Record this access.
  if (access == Access::write) {
    s.write_epoch = epoch;
    s.writer = static_cast<std::uint16_t>(t.linear);
    s.writer_clock = t.vc[t.lane];
    s.access_epoch = epoch;
    s.read_lanes = s.atomic_lanes = 0;
    s.several_read = s.several_atomic = false;
    s.access_warp = static_cast<std::uint16_t>(t.warp);
    return;
  }
  const bool empty = s.access_epoch != epoch ||
                     (s.read_lanes == 0 && s.atomic_lanes == 0 && s.access_warp != kSeveralWarps);
  if (empty) {
    s.access_epoch = epoch;
    s.access_warp = static_cast<std::uint16_t>(t.warp);
    s.read_lanes = s.atomic_lanes = 0;
    s.several_read = s.several_atomic = false;
  } else if (s.access_warp != kSeveralWarps && s.access_warp != t.warp) {
    // From here on only "some warps" is kept: any later conflicting access is a race, since at
    // least one of these threads is in another warp than it.
    s.several_read = s.read_lanes != 0;
    s.several_atomic = s.atomic_lanes != 0;
    s.access_warp = kSeveralWarps;
    s.read_lanes = s.atomic_lanes = 0;
  }
  if (s.access_warp == kSeveralWarps) {
    (access == Access::read ? s.several_read : s.several_atomic) = true;
  } else {
    (access == Access::read ? s.read_lanes : s.atomic_lanes) |= 1u << t.lane;
    a.clocks[g * kWarp + t.lane] = t.vc[t.lane];
  }
}

void check_shared(const Allocation* allocation, std::size_t byte_offset, std::size_t bytes,
                  Access access) {
  Thread& t = running("a shared-memory access");
  Allocation& a = const_cast<Allocation&>(*allocation);
  const Options& o = *t.options;
  if (!o.check_races && !o.check_uninitialized_shared) return;
  const std::size_t first = byte_offset / a.granule, last = (byte_offset + bytes - 1) / a.granule;
  for (std::size_t g = first; g <= last; ++g) check_granule(t, a, g, access);
}

// -------------------------------------------------------------------------------------------------
// The scheduler
// -------------------------------------------------------------------------------------------------
void yield(Thread& t) {
  t.scheduler = std::move(t.scheduler).resume();
}

void release(Block& b, Thread& t) {
  Block::WarpLanes& w = b.warps[t.warp];
  w.at_warp &= ~(1u << t.lane);
  w.at_block &= ~(1u << t.lane);
  t.state = State::runnable;
  t.warp_call = nullptr;
  t.block_call = nullptr;
  b.released.push_back(&t);
}

bool same_call(const BlockCall& a, const BlockCall& b) {
  auto same = [](const char* x, const char* y) {
    return x == y || (x != nullptr && y != nullptr && std::strcmp(x, y) == 0);
  };
  return same(a.name, b.name) && same(a.file, b.file) && a.line == b.line;
}

unsigned lanes_in_warp(const Block& b, unsigned warp) {
  const unsigned n = static_cast<unsigned>(b.threads.size());
  return std::min(kWarp, n - warp * kWarp);
}

// The lane a shuffle reads for `lane` (PTX shfl.sync: the source j and whether it is in the
// lane's segment of `width` lanes; outside it, the lane keeps its own value).
unsigned shuffle_source(const WarpCall& c, unsigned lane) {
  const int segment_mask = (kWarp - c.width) & 31;  // the bits that select the segment
  const int first = static_cast<int>(lane) & segment_mask;
  const int last = first | (31 & ~segment_mask);
  const int b = c.lane_arg & 31;
  const int self = static_cast<int>(lane);
  int j = self;
  bool valid = true;
  switch (c.op) {
    case WarpOp::shfl_idx:
      j = first | (b & ~segment_mask);
      break;
    case WarpOp::shfl_up:
      j = self - b;
      valid = j >= first;
      break;
    case WarpOp::shfl_down:
      j = self + b;
      valid = j <= last;
      break;
    case WarpOp::shfl_xor:
      j = self ^ b;
      valid = j <= last;
      break;
    default:
      break;
  }
  return valid ? static_cast<unsigned>(j) : lane;
}

bool is_shuffle(WarpOp op) {
  return op == WarpOp::shfl_idx || op == WarpOp::shfl_up || op == WarpOp::shfl_down ||
         op == WarpOp::shfl_xor;
}

void complete_warp(Block& b, Thread& t) {
  const WarpCall& c = *t.warp_call;
  const unsigned base = t.warp * kWarp;
  Thread* lanes[kWarp];
  int count = 0;
  for (unsigned u = 0; u < kWarp; ++u)
    if ((c.mask >> u) & 1u) lanes[count++] = &b.threads[base + u];

  if (is_shuffle(c.op)) {
    for (int i = 0; i < count; ++i) {
      Thread& p = *lanes[i];
      const unsigned j = shuffle_source(*p.warp_call, p.lane);
      if (j != p.lane && !((c.mask >> j) & 1u))
        fault(p, FaultKind::warp_mask,
              describe(*p.warp_call) + " reads lane " + std::to_string(j) +
                  ", which is not in the mask");
    }
    // Every output is written after all sources were read: outputs and inputs are distinct
    // variables of the suspended threads.
    for (int i = 0; i < count; ++i) {
      Thread& p = *lanes[i];
      const unsigned j = shuffle_source(*p.warp_call, p.lane);
      std::memcpy(p.warp_call->output, b.threads[base + j].warp_call->input, c.size);
    }
  } else if (c.op == WarpOp::ballot || c.op == WarpOp::all || c.op == WarpOp::any) {
    unsigned ballot = 0;
    for (int i = 0; i < count; ++i)
      if (*static_cast<const int*>(lanes[i]->warp_call->input) != 0) ballot |= 1u << lanes[i]->lane;
    for (int i = 0; i < count; ++i) {
      void* out = lanes[i]->warp_call->output;
      if (c.op == WarpOp::ballot) {
        *static_cast<unsigned*>(out) = ballot;
      } else if (c.op == WarpOp::all) {
        *static_cast<int*>(out) = ballot == c.mask;
      } else {
        *static_cast<int*>(out) = ballot != 0;
      }
    }
  } else if (c.op == WarpOp::primitive) {
    const void* inputs[kWarp];
    void* outputs[kWarp];
    for (int i = 0; i < count; ++i) {
      inputs[i] = lanes[i]->warp_call->input;
      outputs[i] = lanes[i]->warp_call->output;
    }
    c.compute(inputs, outputs, count, lanes[0]->warp_call->context);
  }

  // The rendezvous orders what each participant did before it before what any does after it
  // (only the race check reads the clocks).
  if (!t.options->check_races) {
    for (int i = 0; i < count; ++i) release(b, *lanes[i]);
    return;
  }
  std::uint32_t joined[kWarp] = {};
  for (int i = 0; i < count; ++i) {
    Thread& p = *lanes[i];
    ++p.vc[p.lane];
    for (unsigned u = 0; u < kWarp; ++u) joined[u] = std::max(joined[u], p.vc[u]);
  }
  for (int i = 0; i < count; ++i) {
    std::memcpy(lanes[i]->vc, joined, sizeof joined);
    release(b, *lanes[i]);
  }
}

void warp_arrival(Block& b, Thread& t) {
  const WarpCall& c = *t.warp_call;
  const bool shuffle = is_shuffle(c.op);
  t.signature = {c.mask, c.op, shuffle ? c.width : 0, shuffle ? c.size : 0, c.compute};
  Block::WarpLanes& w = b.warps[t.warp];
  w.at_warp |= 1u << t.lane;
  const unsigned base = t.warp * kWarp, lanes = lanes_in_warp(b, t.warp);
  // Lanes already waiting for this one must be in the same rendezvous.
  for (unsigned others = w.at_warp & ~(1u << t.lane); others != 0; others &= others - 1) {
    const Thread& other = b.threads[base + static_cast<unsigned>(__builtin_ctz(others))];
    if (((other.signature.mask >> t.lane) & 1u) && !(other.signature == t.signature))
      fault(t, FaultKind::warp_mask,
            "lanes of one warp rendezvous disagree: this lane calls " + describe(c) + ", lane " +
                std::to_string(other.lane) + " waits for it at " + describe(*other.warp_call));
  }
  const unsigned existing = lanes == kWarp ? ~0u : (1u << lanes) - 1u;
  auto lowest = [](unsigned bits) { return std::to_string(__builtin_ctz(bits)); };
  if (c.mask & ~existing)
    fault(t, FaultKind::warp_mask,
          describe(c) + " names lane " + lowest(c.mask & ~existing) +
              ", which does not exist (warp " + std::to_string(t.warp) + " of this block has " +
              std::to_string(lanes) + " threads)");
  if (c.mask & w.done)
    fault(t, FaultKind::deadlock,
          describe(c) + " waits for lane " + lowest(c.mask & w.done) +
              ", which has exited: it never arrives");
  if (c.mask & w.at_block) {
    const Thread& other =
        b.threads[base + static_cast<unsigned>(__builtin_ctz(c.mask & w.at_block))];
    fault(t, FaultKind::barrier_divergence,
          describe(c) + " waits for lane " + std::to_string(other.lane) + ", which waits at " +
              describe(*other.block_call));
  }
  if ((c.mask & w.at_warp) != c.mask) return;  // not all there yet
  for (unsigned lane_bits = c.mask; lane_bits != 0; lane_bits &= lane_bits - 1) {
    const Thread& other = b.threads[base + static_cast<unsigned>(__builtin_ctz(lane_bits))];
    if (!(other.signature == t.signature))
      fault(t, FaultKind::warp_mask,
            "lanes of one warp rendezvous disagree: this lane calls " + describe(c) + ", lane " +
                std::to_string(other.lane) + " calls " + describe(*other.warp_call));
  }
  complete_warp(b, t);
}

void complete_barrier(Block& b) {
  const unsigned n = static_cast<unsigned>(b.threads.size());
  Thread& first = b.threads[0];
  const BlockCall& c = *first.block_call;
  for (unsigned i = 1; i < n; ++i)
    if (!same_call(*b.threads[i].block_call, c))
      fault(b.threads[i], FaultKind::barrier_divergence,
            "threads of the block wait at different barriers: this thread at " +
                describe(*b.threads[i].block_call) + ", " + thread_string(first) + " at " +
                describe(c));
  if (c.block_threads != 0 && static_cast<unsigned>(c.block_threads) != n)
    fault(first, FaultKind::misuse,
          describe(c) + " is instantiated for " + std::to_string(c.block_threads) +
              " threads, the block has " + std::to_string(n));
  Block::StorageUse* use = nullptr;
  if (c.temp_storage != nullptr) {
    for (auto& u : b.storage_uses)
      if (u.storage == c.temp_storage) use = &u;
    if (c.check_reuse && use != nullptr && use->epoch == b.epoch)
      fault(first, FaultKind::misuse,
            describe(c) + " reuses the TempStorage of the " + use->name +
                " before it with no syncthreads in between (CUB requires a barrier before a "
                "primitive's storage is reused)");
  }
  if (c.compute != nullptr) {
    std::vector<const void*> inputs(n);
    std::vector<void*> outputs(n);
    for (unsigned i = 0; i < n; ++i) {
      inputs[i] = b.threads[i].block_call->input;
      outputs[i] = b.threads[i].block_call->output;
    }
    c.compute(inputs.data(), outputs.data(), static_cast<int>(n), c.context);
  }
  ++b.epoch;
  if (c.temp_storage != nullptr) {
    if (use == nullptr) {
      b.storage_uses.push_back({c.temp_storage, b.epoch, c.name});
    } else {
      use->epoch = b.epoch;
      use->name = c.name;
    }
  }
  b.at_barrier = 0;
  for (auto& t : b.threads) release(b, t);
}

const Thread* first_in_state(const Block& b, State state) {
  for (const auto& t : b.threads)
    if (t.state == state) return &t;
  return nullptr;
}

// A lane of t's warp that waits at a warp collective whose mask names t.
const Thread* lane_waiting_for(const Block& b, const Thread& t) {
  const unsigned base = t.warp * kWarp;
  for (unsigned waiting = b.warps[t.warp].at_warp; waiting != 0; waiting &= waiting - 1) {
    const Thread& other = b.threads[base + static_cast<unsigned>(__builtin_ctz(waiting))];
    if ((other.signature.mask >> t.lane) & 1u) return &other;
  }
  return nullptr;
}

void barrier_arrival(Block& b, Thread& t) {
  ++b.at_barrier;
  b.warps[t.warp].at_block |= 1u << t.lane;
  if (b.done > 0)
    fault(t, FaultKind::barrier_divergence,
          "waits at " + describe(*t.block_call) + ", but " +
              thread_string(*first_in_state(b, State::done)) + " has exited: it never arrives");
  if (const Thread* other = lane_waiting_for(b, t))
    fault(t, FaultKind::barrier_divergence,
          "waits at " + describe(*t.block_call) + " while lane " + std::to_string(other->lane) +
              " waits for it at " + describe(*other->warp_call));
  if (b.at_barrier == b.threads.size()) complete_barrier(b);
}

void thread_exit(Block& b, Thread& t) {
  ++b.done;
  b.warps[t.warp].done |= 1u << t.lane;
  if (b.at_barrier > 0) {
    const Thread& waiting = *first_in_state(b, State::at_block);
    fault(t, FaultKind::barrier_divergence,
          "exits while " + thread_string(waiting) + " waits at " + describe(*waiting.block_call) +
              ": it never arrives there");
  }
  if (const Thread* other = lane_waiting_for(b, t))
    fault(t, FaultKind::deadlock,
          "exits while lane " + std::to_string(other->lane) + " waits for it at " +
              describe(*other->warp_call));
}

[[noreturn]] void deadlock(const Block& b) {
  for (const auto& t : b.threads) {
    if (t.state == State::at_warp)
      fault(t, FaultKind::deadlock,
            "waits forever at " + describe(*t.warp_call) +
                ": the lanes of its mask are waiting elsewhere");
    if (t.state == State::at_block)
      fault(t, FaultKind::deadlock, "waits forever at " + describe(*t.block_call));
  }
  throw KernelFault(FaultKind::deadlock, "kernel '" + std::string(b.launch->spec.kernel) +
                                             "': block " + dim3_string(b.idx) + ": deadlock");
}

Dim3 unflatten(std::uint64_t linear, const Dim3& dims) {
  return Dim3(static_cast<unsigned>(linear % dims.x),
              static_cast<unsigned>(linear / dims.x % dims.y),
              static_cast<unsigned>(linear / (static_cast<std::uint64_t>(dims.x) * dims.y)));
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64: one seed per block from (seed, block)
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
void arrange(std::vector<T>& items, Order order, std::mt19937_64& rng) {
  switch (order) {
    case Order::forward:
      std::sort(items.begin(), items.end());
      break;
    case Order::reverse:
      std::sort(items.begin(), items.end(), [](const T& a, const T& b) { return b < a; });
      break;
    case Order::random:
      std::shuffle(items.begin(), items.end(), rng);
      break;
  }
}

void thread_main(Thread& t) {
  try {
    t.block->launch->invoke(t.block->launch->closure);
  } catch (const ctx::detail::forced_unwind&) {
    throw;  // the block is being discarded: let Boost unwind this fiber
  } catch (...) {
    t.error = std::current_exception();
  }
  t.state = State::done;
}

void schedule(Block& b, std::vector<Thread*>& runnable, std::mt19937_64& rng);

void run_block(Launch& launch, std::uint64_t block_linear) {
  Worker& w = worker();
  w.used = 0;
  const Options& o = launch.options;
  const unsigned n = launch.threads_per_block;

  Block b;
  b.launch = &launch;
  b.linear = block_linear;
  b.idx = unflatten(block_linear, launch.spec.grid);
  b.generation = ++w.generation;
  if (launch.spec.dynamic_shared_bytes > 0)
    b.dynamic = w.take(launch.spec.dynamic_shared_bytes, kDynamicGranule, 0xFF);
  b.threads.resize(n);
  b.warps.resize((n + kWarp - 1) / kWarp);
  b.released.reserve(n);
  for (unsigned i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.thread_idx = unflatten(i, launch.spec.block);
    t.block_idx = b.idx;
    t.block_dim = launch.spec.block;
    t.grid_dim = launch.spec.grid;
    t.linear = i;
    t.warp = i / kWarp;
    t.lane = i % kWarp;
    t.options = &launch.options;
    t.block = &b;
    t.fiber = ctx::fiber(std::allocator_arg, PooledStack{&w.stacks}, [&t](ctx::fiber&& scheduler) {
      t.scheduler = std::move(scheduler);
      // Boost's ucontext build enters a fiber that never ran to unwind it: skip the kernel then.
      if (!t.block->discarding) thread_main(t);
      return std::move(t.scheduler);
    });
  }

  std::mt19937_64 rng(mix(o.seed ^ mix(block_linear)));
  std::vector<Thread*> runnable(n);
  for (unsigned i = 0; i < n; ++i) runnable[i] = &b.threads[i];
  // If a check throws, the suspended fibers are unwound (their stacks go back to the pool) while
  // the block is still whole, so the next launch starts clean.
  try {
    schedule(b, runnable, rng);
  } catch (...) {
    b.discarding = true;
    for (auto& t : b.threads) ctx::fiber discarded = std::move(t.fiber);  // unwound here
    throw;
  }
}

void schedule(Block& b, std::vector<Thread*>& runnable, std::mt19937_64& rng) {
  const unsigned n = static_cast<unsigned>(b.threads.size());
  const Order order = b.launch->options.thread_order;
  while (b.done < n) {
    if (runnable.empty()) deadlock(b);
    arrange(runnable, order, rng);
    for (Thread* t : runnable) {
      tls_thread = t;
      t->fiber = std::move(t->fiber).resume();
      tls_thread = nullptr;
      if (t->error) std::rethrow_exception(t->error);
      switch (t->state) {
        case State::done:
          thread_exit(b, *t);
          break;
        case State::at_warp:
          warp_arrival(b, *t);
          break;
        case State::at_block:
          barrier_arrival(b, *t);
          break;
        case State::runnable:
          break;
      }
    }
    runnable.swap(b.released);
    b.released.clear();
  }
}

[[noreturn]] void launch_fault(const LaunchSpec& spec, FaultKind kind, const std::string& what) {
  throw KernelFault(kind, "kernel '" + std::string(spec.kernel) + "': launch: " + what);
}

}  // namespace

// -------------------------------------------------------------------------------------------------
// The interface of emulator.h
// -------------------------------------------------------------------------------------------------
void outside_kernel(const char* what) {
  throw Error(std::string(what) + ": used outside an emulated kernel (not in a PHASOR_LAUNCH)");
}

void run_grid(const LaunchSpec& spec, void (*invoke)(const void*), const void* closure) {
  if (tls_thread != nullptr)
    fault_here(FaultKind::invalid_launch,
               "launching kernel '" + std::string(spec.kernel) +
                   "' from a kernel (dynamic parallelism) is not supported by the emulator");
  Launch launch;
  launch.spec = spec;
  launch.options = emulator::options();
  launch.arch =
      launch.options.target_arch ? launch.options.target_arch : PHASOR_EMULATOR_DEFAULT_ARCH;
  launch.options.target_arch = launch.arch;
  shared_limits(launch.arch, launch.limits);
  launch.invoke = invoke;
  launch.closure = closure;

  const Dim3 g = spec.grid, bl = spec.block;
  const std::uint64_t threads = static_cast<std::uint64_t>(bl.x) * bl.y * bl.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0)
    launch_fault(spec, FaultKind::invalid_launch,
                 "grid " + dim3_string(g) + " and block " + dim3_string(bl) +
                     " must have every dimension ≥ 1");
  if (threads > 1024 || bl.z > 64)
    launch_fault(spec, FaultKind::invalid_launch,
                 "block " + dim3_string(bl) +
                     ": expected at most 1024 threads and block.z ≤ 64, got " +
                     std::to_string(threads) + " threads");
  if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    launch_fault(spec, FaultKind::invalid_launch,
                 "grid " + dim3_string(g) + ": expected x < 2^31, y and z ≤ 65535");
  if (launch.options.check_shared_memory_limit &&
      spec.dynamic_shared_bytes > launch.limits.total_bytes)
    launch_fault(spec, FaultKind::shared_memory_limit,
                 std::to_string(spec.dynamic_shared_bytes) +
                     " bytes of dynamic shared memory: over the " +
                     std::to_string(launch.limits.total_bytes) + " bytes a block of sm_" +
                     std::to_string(launch.arch) + " may have");
  launch.threads_per_block = static_cast<unsigned>(threads);

  const std::uint64_t blocks = static_cast<std::uint64_t>(g.x) * g.y * g.z;
  std::vector<std::uint64_t> order(blocks);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  std::mt19937_64 rng(mix(launch.options.seed));
  arrange(order, launch.options.block_order, rng);
  // A device computes with subnormal numbers (nvcc's default, -ftz=false), whatever modes
  // phasor's CPU kernels run with (set_flush_denormals) or the calling thread has.
  if (launch.options.parallel_blocks && blocks > 1) {
    ::phasor::detail::parallel_for(static_cast<std::int64_t>(blocks), [&](std::int64_t i) {
      if (launch.failed.load(std::memory_order_relaxed)) return;
      const ::phasor::detail::DenormalModes device_arithmetic(/*flush=*/false);
      try {
        run_block(launch, order[static_cast<std::size_t>(i)]);
      } catch (...) {
        launch.failed.store(true, std::memory_order_relaxed);
        throw;
      }
    });
  } else {
    const ::phasor::detail::DenormalModes device_arithmetic(/*flush=*/false);
    for (const std::uint64_t block : order) run_block(launch, block);
  }
}

Allocation* shared_array(const SharedSite& site, std::size_t elem_size, std::size_t align,
                         std::int64_t count, unsigned char poison) {
  Thread& t = running("PHASOR_SHARED_ARRAY");
  Block& b = *t.block;
  for (Allocation* a : b.allocations)
    if (a->site == &site) return a;
  const std::size_t bytes = elem_size * static_cast<std::size_t>(count);
  const std::size_t start = (b.static_bytes + align - 1) / align * align;
  const Launch& launch = *b.launch;
  if (launch.options.check_shared_memory_limit) {
    const std::string what = "static shared memory of " + std::to_string(start + bytes) +
                             " bytes with " + describe_site(&site) + " (" + std::to_string(bytes) +
                             " bytes)";
    if (start + bytes > launch.limits.static_bytes)
      fault(t, FaultKind::shared_memory_limit,
            what + ": over the " + std::to_string(launch.limits.static_bytes) +
                " bytes of static shared memory a block of sm_" + std::to_string(launch.arch) +
                " may have");
    if (start + bytes + launch.spec.dynamic_shared_bytes > launch.limits.total_bytes)
      fault(t, FaultKind::shared_memory_limit,
            what + " and " + std::to_string(launch.spec.dynamic_shared_bytes) +
                " bytes of dynamic shared memory: over the " +
                std::to_string(launch.limits.total_bytes) + " bytes a block of sm_" +
                std::to_string(launch.arch) + " may have");
  }
  b.static_bytes = start + bytes;
  Allocation* a = worker().take(bytes, elem_size, poison);
  a->site = &site;
  b.allocations.push_back(a);
  return a;
}

void* shared_storage(const SharedSite& site, std::size_t bytes, std::size_t align) {
  // Accessed as a plain T& (CUB's TempStorage): counted against the limit, not element-checked.
  return shared_array(site, bytes, align, 1, 0xCD)->data;
}

Allocation* dynamic_shared(const SharedSite& site, std::size_t elem_size, std::size_t byte_offset,
                           std::int64_t& count) {
  Thread& t = running("PHASOR_DYNAMIC_SHARED");
  Block& b = *t.block;
  const std::size_t total = b.launch->spec.dynamic_shared_bytes;
  const std::string what = "'" + std::string(site.name) + "' (declared at " +
                           site_string(site.file, site.line) + ", " + std::to_string(elem_size) +
                           "-byte elements from byte " + std::to_string(byte_offset) + ")";
  // The GPU needs each element aligned to its size's largest power of two (up to 16 bytes).
  const std::size_t alignment = std::min<std::size_t>(elem_size & (~elem_size + 1), 16);
  if (byte_offset % alignment != 0)
    fault(t, FaultKind::misuse,
          "dynamic shared memory view " + what + ": the offset is not a multiple of " +
              std::to_string(alignment) + " bytes");
  if (count < 0) {
    count = byte_offset <= total ? static_cast<std::int64_t>((total - byte_offset) / elem_size) : 0;
  } else if (byte_offset + static_cast<std::size_t>(count) * elem_size > total &&
             t.options->check_bounds) {
    fault(t, FaultKind::shared_out_of_bounds,
          "dynamic shared memory view " + what + " of " + std::to_string(count) +
              " elements: beyond the launch's " + std::to_string(total) + " bytes");
  }
  if (b.dynamic == nullptr) {  // no dynamic shared memory: an empty view over nothing
    b.dynamic = worker().take(0, kDynamicGranule, 0xFF);
  }
  return b.dynamic;
}

unsigned char* allocation_data(const Allocation* allocation) {
  return allocation->data;
}

void shared_read(const Allocation* a, std::size_t byte_offset, std::size_t bytes) {
  check_shared(a, byte_offset, bytes, Access::read);
}
void shared_write(const Allocation* a, std::size_t byte_offset, std::size_t bytes) {
  check_shared(a, byte_offset, bytes, Access::write);
}
void shared_atomic(const Allocation* a, std::size_t byte_offset, std::size_t bytes) {
  check_shared(a, byte_offset, bytes, Access::atomic);
}

void shared_out_of_bounds(const Allocation* allocation, std::size_t byte_offset,
                          std::size_t elem_size, std::int64_t index, std::int64_t size) {
  const Allocation& a = *allocation;
  std::string what = describe_array(a);
  if (a.site == nullptr)
    what += " (" + std::to_string(elem_size) + "-byte elements from byte " +
            std::to_string(byte_offset) + ")";
  fault_here(FaultKind::shared_out_of_bounds, "index " + std::to_string(index) + " of " + what +
                                                  ": out of bounds (size " + std::to_string(size) +
                                                  ")");
}

void check_global_access(const TensorView& x, const std::int64_t* idx, int count, bool write) {
  const char* access = write ? "a write to" : "a read of";
  if (!x.defined())
    fault_here(FaultKind::global_out_of_bounds,
               std::string(access) + " an undefined (absent) view");
  if (x.data == nullptr)
    fault_here(FaultKind::global_out_of_bounds, std::string(access) + " a view of shape " +
                                                    x.shape_string() + " with a null data pointer");
  std::string element = "[";
  for (int d = 0; d < count; ++d) element += (d ? ", " : "") + std::to_string(idx[d]);
  element += "]";
  if (count != x.rank)
    fault_here(FaultKind::global_out_of_bounds, std::string(access) + " element " + element +
                                                    " of a view of rank " + std::to_string(x.rank) +
                                                    " (shape " + x.shape_string() + ")");
  for (int d = 0; d < count; ++d)
    if (idx[d] < 0 || idx[d] >= x.size(d))
      fault_here(FaultKind::global_out_of_bounds,
                 std::string(access) + " element " + element + " of a view of shape " +
                     x.shape_string() + ": index " + std::to_string(idx[d]) + " of dimension " +
                     std::to_string(d) + " is out of bounds");
}

void check_vector_access(const TensorView& x, const std::int64_t* idx, int count, DType dtype,
                         int elements, bool loadable, bool write) {
  const std::string what = write ? "simt::store_vector" : "simt::load_vector";
  if (!loadable)
    fault_here(FaultKind::misuse,
               what + " of a view of shape " + x.shape_string() + " and dtype " +
                   phasor::to_string(x.dtype) + ": expected dtype " + phasor::to_string(dtype) +
                   ", the last dimension contiguous, the other strides multiples of " +
                   std::to_string(elements) + " and 16-byte aligned data");
  const std::int64_t last = idx[count - 1];
  if (last % elements != 0 || last + elements > x.size(count - 1))
    fault_here(FaultKind::global_out_of_bounds,
               what + " at last index " + std::to_string(last) + " of a view of shape " +
                   x.shape_string() + ": " + std::to_string(elements) +
                   " elements from a multiple of " + std::to_string(elements) +
                   " inside the last dimension expected");
}

void check_index_dtype(const TensorView& x) {
  if (x.dtype != DType::int32 && x.dtype != DType::int64)
    fault_here(FaultKind::misuse, std::string("simt::load_index of a view of dtype ") +
                                      phasor::to_string(x.dtype) + ": expected int32 or int64");
}

void span_out_of_bounds(std::int64_t index, std::int64_t size) {
  fault_here(FaultKind::global_out_of_bounds, "workspace span index " + std::to_string(index) +
                                                  ": out of bounds (size " + std::to_string(size) +
                                                  ")");
}

void warp_call(WarpCall& call) {
  Thread& t = running(call.name);
  if (!((call.mask >> t.lane) & 1u))
    fault(t, FaultKind::warp_mask,
          describe(call) + ": the calling lane " + std::to_string(t.lane) +
              " is not in its own mask");
  if (is_shuffle(call.op) &&
      (call.width < 1 || call.width > static_cast<int>(kWarp) || (call.width & (call.width - 1))))
    fault(t, FaultKind::misuse,
          describe(call) + ": width " + std::to_string(call.width) +
              ", expected a power of two from 1 to 32");
  t.warp_call = &call;
  t.state = State::at_warp;
  yield(t);
}

void block_call(BlockCall& call) {
  Thread& t = running(call.name);
  t.block_call = &call;
  t.state = State::at_block;
  yield(t);
}

}  // namespace detail
}  // namespace simt
}  // namespace phasor
