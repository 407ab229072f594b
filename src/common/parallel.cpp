#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phasor/common.h"

namespace phasor {
namespace {

int default_num_threads() {
  if (const char* env = std::getenv("PHASOR_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n >= 1 && n <= 4096) return static_cast<int>(n);
    throw Error(std::string("environment variable PHASOR_NUM_THREADS: expected an integer in "
                            "[1, 4096], got '") +
                env + "'");
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::atomic<int> g_requested{0};  // 0: default

// Workers wait for a job; the calling thread takes part too. One job runs at a time (a mutex
// serialises callers from different user threads).
class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  void run(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn) {
    std::lock_guard<std::mutex> serial(submit_mutex_);
    ensure_workers(threads - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      active_workers_ = threads - 1;
      pending_ = threads - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work(/*participate=*/true);
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void ensure_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { loop(index); });
    }
  }

  void loop(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && index < active_workers_); });
        if (stop_) return;
        seen = generation_;
      }
      work(false);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  void work(bool /*participate*/) {
    in_pool() = true;
    for (;;) {
      std::int64_t i = next_.fetch_add(1);
      if (i >= n_) break;
      try {
        (*fn_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
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
  std::int64_t n_ = 0;
  std::atomic<std::int64_t> next_{0};
  int active_workers_ = 0;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
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

namespace detail {

void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  int threads = static_cast<int>(std::min<std::int64_t>(num_threads(), n));
  if (threads <= 1 || Pool::in_pool()) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Pool::instance().run(n, threads, fn);
}

}  // namespace detail
}  // namespace phasor
