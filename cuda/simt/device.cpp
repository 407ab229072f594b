// phasor/device.h: devices, memory, copies and the CUDA stream / allocator settings. The CUDA
// calls go through simt/runtime.h (real with the backend, "no backend" without).
#include "phasor/device.h"

#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "simt/runtime.h"

namespace phasor {
namespace {

struct DeviceCount {
  int count;
  std::string reason;  // why there is none
};
// Devices do not come and go while a process runs: ask CUDA once.
const DeviceCount& device_count_once() {
  static const DeviceCount answer = [] {
    DeviceCount d{0, {}};
    d.count = cuda_runtime::device_count(d.reason);
    return d;
  }();
  return answer;
}

bool is_host(Device device) {
  return device == Device::cpu || device == Device::emulated;
}

}  // namespace

bool cuda_is_built() {
  return cuda_runtime::built();
}

int cuda_device_count() {
  try {
    return device_count_once().count;
  } catch (...) {
    return 0;
  }
}

void require_device(Device device, const std::string& what) {
  if (device != Device::cuda) return;
  if (!cuda_is_built())
    throw Error(what + ": device cuda: this build of phasor has no CUDA backend");
  if (cuda_device_count() == 0)
    throw Error(what + ": device cuda: no CUDA device is available (cudaGetDeviceCount: " +
                device_count_once().reason + ")");
}

void* device_allocate(Device device, std::size_t bytes) {
  if (is_host(device)) {
    try {
      return ::operator new(bytes > 0 ? bytes : 1, std::align_val_t(64));
    } catch (const std::bad_alloc&) {
      throw Error(std::string("device_allocate: device ") + to_string(device) +
                  ": out of memory for " + std::to_string(bytes) + " bytes");
    }
  }
  require_device(device, "device_allocate");
  return cuda_runtime::malloc(bytes);
}

void device_free(Device device, void* ptr) noexcept {
  if (ptr == nullptr) return;
  if (is_host(device)) {
    ::operator delete(ptr, std::align_val_t(64));
  } else {
    cuda_runtime::free(ptr);
  }
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t bytes) {
  if (bytes == 0) return;
  if (is_host(dst_device) && is_host(src_device)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  require_device(Device::cuda, "copy_bytes");
  using cuda_runtime::CopyKind;
  const CopyKind kind = is_host(src_device)   ? CopyKind::host_to_device
                        : is_host(dst_device) ? CopyKind::device_to_host
                                              : CopyKind::device_to_device;
  const cuda::Stream stream = cuda::current_stream();
  cuda_runtime::memcpy_async(dst, src, bytes, kind, stream);
  if (kind == CopyKind::device_to_host) cuda_runtime::stream_synchronize(stream);
}

namespace cuda {
namespace {
thread_local Stream t_current_stream = nullptr;

void* default_allocate(std::size_t bytes, Stream stream, void*) {
  return cuda_runtime::malloc_async(bytes, stream);
}
void default_deallocate(void* ptr, std::size_t, Stream stream, void*) {
  cuda_runtime::free_async(ptr, stream);
}

std::mutex g_allocator_mutex;
Allocator g_allocator{&default_allocate, &default_deallocate, nullptr};
}  // namespace

Stream current_stream() {
  return t_current_stream;
}
void set_current_stream(Stream stream) {
  t_current_stream = stream;
}

Allocator default_allocator() {
  return {&default_allocate, &default_deallocate, nullptr};
}

void set_allocator(const Allocator& allocator) {
  if (allocator.allocate == nullptr || allocator.deallocate == nullptr)
    throw Error(
        "cuda::set_allocator: argument 'allocator': expected both functions (allocate and "
        "deallocate), got a null one");
  std::lock_guard<std::mutex> lock(g_allocator_mutex);
  g_allocator = allocator;
}

Allocator get_allocator() {
  std::lock_guard<std::mutex> lock(g_allocator_mutex);
  return g_allocator;
}

Timer::Timer(Stream stream) : stream_(stream) {
  require_device(Device::cuda, "cuda::Timer");
  begin_ = cuda_runtime::event_create();
  try {
    end_ = cuda_runtime::event_create();
  } catch (...) {
    cuda_runtime::event_destroy(begin_);
    throw;
  }
}
Timer::~Timer() {
  cuda_runtime::event_destroy(begin_);
  cuda_runtime::event_destroy(end_);
}
void Timer::start() {
  cuda_runtime::event_record(begin_, stream_);
}
double Timer::stop() {
  cuda_runtime::event_record(end_, stream_);
  cuda_runtime::event_synchronize(end_);
  return cuda_runtime::event_elapsed_ms(begin_, end_);
}

}  // namespace cuda
}  // namespace phasor
