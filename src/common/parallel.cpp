#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "phasor/common.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace phasor {
namespace {

// The value of the environment variable `name`, a decimal integer in [lo, hi], or `fallback` when
// it is unset; anything else is a phasor::Error naming the variable, the range and the value.
long environment_integer(const char* name, long lo, long hi, long fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr) return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(env, &end, 10);
  if (end != env && *end == '\0' && errno == 0 && n >= lo && n <= hi) return n;
  throw Error(std::string("environment variable ") + name + ": expected an integer in [" +
              std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + env + "'");
}

// Read on every call that has no set_num_threads (the environment is cheap to read, ~13 ns), but
// the hardware count once: std::thread::hardware_concurrency() asks the kernel each time, ~5 µs
// here, which every parallel_for paid (a one-token decoding call takes 10–40 µs).
int default_num_threads() {
  static const long hardware = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(environment_integer("PHASOR_NUM_THREADS", 1, 4096, hardware));
}

std::atomic<int> g_requested{0};  // 0: default

bool default_flush_denormals() {
  static const bool flush = environment_integer("PHASOR_FLUSH_DENORMALS", 0, 1, 1) == 1;
  return flush;
}

std::atomic<int> g_flush{-1};  // −1: default

// Workers wait for a job; the calling thread takes part too. One job runs at a time (a mutex
// serialises callers from different user threads). A job's items are split into one contiguous
// range per participant (the caller first, then worker 0, 1, ...); each takes its own range
// first, then helps with the others' (a worker that wakes late, descheduled on a busy machine,
// finds its range taken). So a call repeated on the same data (decoding, token after token, with
// the state updated in place) gives every item to the same thread, whose core's cache still holds
// the item's state: handed out first come, first served, the heads' states moved between the
// cores' caches on every call, and two threads decoded one GLA token slower than one. Between jobs
// a worker first spins on the job counter for a while (spin_time), then sleeps on a condition
// variable; the caller likewise spins for the workers' completion before sleeping. Decoding calls
// one op per token, a few microseconds apart: a sleeping worker takes 10–20 µs to wake (futex,
// scheduler), more than the work it would share, while a spinning one starts at once. The spin (50
// µs) bounds the CPU burnt when no job follows; PHASOR_SPIN_US (read once; 0 disables spinning)
// changes it, for programs whose other thread pools need the cores between phasor's calls.
std::chrono::microseconds spin_time() {
  static const std::chrono::microseconds time(
      environment_integer("PHASOR_SPIN_US", 0, 1000000, 50));
  return time;
}

// Spins until ready() or spin_time() has passed; true if ready.
template <class Ready>
bool spin_until(Ready&& ready) {
  const auto deadline = std::chrono::steady_clock::now() + spin_time();
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  void run(std::int64_t n, int threads, bool flush, const std::function<void(std::int64_t)>& fn) {
    std::lock_guard<std::mutex> serial(submit_mutex_);
    spin_time();  // a bad PHASOR_SPIN_US throws here, on the caller's thread, before any worker
    ensure_workers(threads - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      flush_ = flush;
      participants_ = threads;
      for (int t = 0; t < threads; ++t) {
        ranges_[static_cast<std::size_t>(t)].next.store(n * t / threads, std::memory_order_relaxed);
        ranges_[static_cast<std::size_t>(t)].end = n * (t + 1) / threads;
      }
      active_workers_.store(threads - 1);
      left_.store(0);
      error_ = nullptr;
      gate_.store(kOpen, std::memory_order_release);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    work(0);
    // Every item is taken. Close the job to latecomers and wait only for the workers that
    // entered it (some may still be running an item): a worker that has not woken up by now —
    // descheduled on a busy machine — is not waited for; it finds the job closed when it runs.
    const std::int64_t entered = gate_.fetch_and(~kOpen, std::memory_order_acq_rel) & ~kOpen;
    const auto all_left = [&] { return left_.load(std::memory_order_acquire) == entered; };
    if (!spin_until(all_left)) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, all_left);
    }
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      stop_flag_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void ensure_workers(int count) {
    if (ranges_.size() < static_cast<std::size_t>(count) + 1)  // between jobs: no one reads them
      ranges_ = std::vector<Range>(static_cast<std::size_t>(count) + 1);
    while (static_cast<int>(workers_.size()) < count) {
      int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { loop(index); });
    }
  }

  void loop(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      // A new job for this worker (jobs with fewer threads leave it out).
      const auto mine = [&] {
        return generation_.load(std::memory_order_acquire) != seen &&
               index < active_workers_.load(std::memory_order_relaxed);
      };
      if (!spin_until([&] { return mine() || stop_flag_.load(std::memory_order_relaxed); })) {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || mine(); });
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) return;
        seen = generation_.load();
      }
      if (!enter()) continue;  // closed: the caller and the others took every item
      work(index + 1);
      left_.fetch_add(1, std::memory_order_acq_rel);
      {
        std::lock_guard<std::mutex> lock(mutex_);  // no lost wake-up: the caller waits under it
      }
      done_cv_.notify_all();
    }
  }

  // Joins the current job if it is still open (counted in gate_, so the caller waits for this
  // worker to leave).
  bool enter() {
    std::int64_t gate = gate_.load(std::memory_order_acquire);
    while (gate & kOpen)
      if (gate_.compare_exchange_weak(gate, gate + 1, std::memory_order_acq_rel)) return true;
    return false;
  }

  // Runs items of the current job as participant `self`: its own range, then the others'.
  void work(int self) {
    const detail::DenormalModes modes(flush_);
    in_pool() = true;
    for (int r = 0; r < participants_; ++r) {
      Range& range = ranges_[static_cast<std::size_t>((self + r) % participants_)];
      for (;;) {
        const std::int64_t i = range.next.fetch_add(1, std::memory_order_relaxed);
        if (i >= range.end) break;
        try {
          (*fn_)(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex_);
          if (!error_) error_ = std::current_exception();
        }
      }
    }
    in_pool() = false;
  }

 public:
  static bool& in_pool() {
    thread_local bool flag = false;
    return flag;
  }

 private:
  std::mutex submit_mutex_, mutex_, error_mutex_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  // One range of the job's items per participant: the next item to take and the range's end (on
  // separate cache lines, so that participants taking from their own ranges do not share one).
  struct alignas(64) Range {
    std::atomic<std::int64_t> next{0};
    std::int64_t end = 0;
  };
  std::vector<Range> ranges_;
  int participants_ = 0;
  bool flush_ = true;  // the job's set_flush_denormals
  std::atomic<int> active_workers_{0};
  // gate_: kOpen while the job takes new workers, plus the number that entered it; left_: how
  // many of those have finished.
  static constexpr std::int64_t kOpen = std::int64_t(1) << 40;
  std::atomic<std::int64_t> gate_{0};
  std::atomic<std::int64_t> left_{0};
  std::atomic<std::uint64_t> generation_{0};
  bool stop_ = false;
  std::atomic<bool> stop_flag_{false};
  std::exception_ptr error_;
};

}  // namespace

void set_num_threads(int n) {
  if (n < 0 || n > 4096)
    throw Error("set_num_threads: argument 'num_threads': expected 0 (default) or 1..4096, got " +
                std::to_string(n));
  g_requested.store(n);
}

int num_threads() {
  int n = g_requested.load();
  return n > 0 ? n : default_num_threads();
}

void set_flush_denormals(bool flush) {
  g_flush.store(flush ? 1 : 0);
}

bool flush_denormals() {
  const int flush = g_flush.load();
  return flush >= 0 ? flush == 1 : default_flush_denormals();
}

namespace detail {

namespace {
#if defined(__SSE__) || defined(__x86_64__)
constexpr std::uint64_t kFlushBits = 0x8040;  // MXCSR: FTZ (bit 15), DAZ (bit 6)
std::uint64_t read_modes() {
  return _mm_getcsr();
}
void write_modes(std::uint64_t modes) {
  _mm_setcsr(static_cast<unsigned>(modes));
}
#elif defined(__aarch64__)
constexpr std::uint64_t kFlushBits = std::uint64_t(1) << 24;  // FPCR: FZ
std::uint64_t read_modes() {
  std::uint64_t modes;
  asm volatile("mrs %0, fpcr" : "=r"(modes));
  return modes;
}
void write_modes(std::uint64_t modes) {
  asm volatile("msr fpcr, %0" : : "r"(modes));
}
#else  // no such modes known here: IEEE gradual underflow
constexpr std::uint64_t kFlushBits = 0;
std::uint64_t read_modes() {
  return 0;
}
void write_modes(std::uint64_t) {}
#endif
}  // namespace

// Only the mode bits change, there and back: the register also holds the sticky exception flags
// (x86's MXCSR, bits 0–5), which the work may raise and a caller may test (fetestexcept), and the
// exception masks.
DenormalModes::DenormalModes(bool flush) {
  const std::uint64_t now = read_modes();
  saved_ = now & kFlushBits;
  const std::uint64_t modes = flush ? now | kFlushBits : now & ~kFlushBits;
  if (modes != now) write_modes(modes);
}
DenormalModes::~DenormalModes() {
  const std::uint64_t now = read_modes();
  const std::uint64_t modes = (now & ~kFlushBits) | saved_;
  if (modes != now) write_modes(modes);
}

namespace {
// fn(i) for i in [0, n) on up to `threads` threads: on the calling thread alone when one suffices
// or when it is itself one of the pool's (a nested call), else through the pool.
void run_items(std::int64_t n, std::int64_t threads, const std::function<void(std::int64_t)>& fn) {
  const bool flush = flush_denormals();
  if (threads <= 1 || Pool::in_pool()) {
    const DenormalModes modes(flush);
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Pool::instance().run(n, static_cast<int>(threads), flush, fn);
}
}  // namespace

void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  run_items(n, std::min<std::int64_t>(num_threads(), n), fn);
}

void parallel_for_runs(std::int64_t items,
                       const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (items <= 0) return;
  const std::int64_t threads = std::max(1, num_threads());
  const std::int64_t run = (items + threads - 1) / threads;
  parallel_for((items + run - 1) / run,
               [&](std::int64_t index) { fn(index * run, std::min(items, (index + 1) * run)); });
}

void parallel_for(std::int64_t n, std::int64_t work_per_item,
                  const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  const std::int64_t total = n * std::max<std::int64_t>(work_per_item, 1);
  const std::int64_t useful = std::max<std::int64_t>(1, total / kWorkPerThread);
  run_items(n, std::min<std::int64_t>({num_threads(), n, useful}), fn);
}

bool split_items(std::int64_t items) {
  const int threads = num_threads();
  return threads > 1 && items < 2 * static_cast<std::int64_t>(threads);
}

bool items_overflow_cache(std::int64_t item_bytes) {
  const int threads = num_threads();
  return threads > 1 && item_bytes > kSharedCacheBytes / threads;
}

std::int64_t window_chunks(std::int64_t items, std::int64_t bytes_per_chunk) {
  constexpr std::int64_t kWindowBytes = std::int64_t(16) << 20, kMaxWindow = 64;
  const std::int64_t per_window =
      std::max<std::int64_t>(1, items) * std::max<std::int64_t>(1, bytes_per_chunk);
  return std::clamp<std::int64_t>(kWindowBytes / per_window, 1, kMaxWindow);
}

std::int64_t head_group_size(std::int64_t sequences, std::int64_t heads, std::int64_t state_bytes) {
  const std::int64_t threads = num_threads();
  const std::int64_t by_cache =
      std::max<std::int64_t>(1, (std::int64_t(256) << 10) / std::max<std::int64_t>(1, state_bytes));
  std::int64_t best = 1;
  for (std::int64_t g = 1; g <= std::min(heads, by_cache); ++g)
    if (heads % g == 0 && sequences * (heads / g) >= threads) best = g;
  return best;
}

std::int64_t backward_head_group_size(std::int64_t sequences, std::int64_t heads,
                                      std::int64_t state_bytes, bool states_kept) {
  return states_kept ? head_group_size(sequences, heads, state_bytes) : 1;
}

void check_one_replayed_head(std::int64_t count) {
  if (count != 1)
    throw std::logic_error("phasor internal error: a backward replaying its chunk states got " +
                           std::to_string(count) + " heads in a group, expected 1");
}

}  // namespace detail
}  // namespace phasor
