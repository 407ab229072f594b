#include "memory.h"

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);
}

namespace {
std::atomic<std::int64_t> g_in_use{0};
std::atomic<std::int64_t> g_peak{0};
std::atomic<std::int64_t> g_base{0};

inline void on_alloc(void* p) {
  if (!p) return;
  const auto n = static_cast<std::int64_t>(malloc_usable_size(p));
  const std::int64_t now = g_in_use.fetch_add(n, std::memory_order_relaxed) + n;
  std::int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
inline void on_free(void* p) {
  if (!p) return;
  g_in_use.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
}
}  // namespace

extern "C" {
void* malloc(std::size_t n) {
  void* p = __libc_malloc(n);
  on_alloc(p);
  return p;
}
void* calloc(std::size_t a, std::size_t b) {
  void* p = __libc_calloc(a, b);
  on_alloc(p);
  return p;
}
void* realloc(void* old, std::size_t n) {
  on_free(old);
  void* p = __libc_realloc(old, n);
  on_alloc(p ? p : (n ? nullptr : nullptr));
  if (!p && n && old) on_alloc(old);  // realloc failed: the old block is still live
  return p;
}
void free(void* p) {
  on_free(p);
  __libc_free(p);
}
void* memalign(std::size_t alignment, std::size_t n) {
  void* p = __libc_memalign(alignment, n);
  on_alloc(p);
  return p;
}
void* aligned_alloc(std::size_t alignment, std::size_t n) {
  return memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  void* p = memalign(alignment, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}

namespace phasor::bench {
std::int64_t heap_bytes_in_use() {
  return g_in_use.load();
}
void reset_peak_heap() {
  const std::int64_t now = g_in_use.load();
  g_base.store(now);
  g_peak.store(now);
}
std::int64_t peak_heap_bytes() {
  return g_peak.load() - g_base.load();
}
}  // namespace phasor::bench
