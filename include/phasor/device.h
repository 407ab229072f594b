// phasor — devices, memory and CUDA streams.
//
// Links and answers in every build: without the CUDA backend (PHASOR_CUDA=OFF, or no nvcc when
// phasor was built), or on a machine without a GPU or driver, cuda_device_count() is 0 and any
// use of Device::cuda is a phasor::Error naming the device. Device::cpu and Device::emulated are
// host memory and always work.
//
// phasor never synchronises the whole device (no cudaDeviceSynchronize): its CUDA work runs on
// the calling thread's current stream, and the only host waits are the stream syncs documented
// here and in the ops (a copy to host memory; reading a validation kernel's verdict).
#pragma once

#include <cstddef>
#include <string>

#include "phasor/common.h"

namespace phasor {

// This build of phasor has the CUDA backend (compiled with nvcc).
bool cuda_is_built();
// The number of CUDA devices: 0 without the backend, a driver or a GPU. Never throws.
int cuda_device_count();

// Memory for views on `device`: cpu and emulated get 64-byte-aligned host memory, cuda gets
// cudaMalloc on the current CUDA device. A phasor::Error naming the device when it is unavailable.
// device_free(device, nullptr) does nothing.
void* device_allocate(Device device, std::size_t bytes);
void device_free(Device device, void* ptr) noexcept;

// Copies `bytes` between any two devices. Host to host is a memcpy; a copy involving cuda memory
// is a cudaMemcpyAsync on the current stream, followed by a sync of that stream when the
// destination is host memory (so the data is there on return). A copy from host to cuda memory
// returns once the source may be reused (CUDA stages pageable memory).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t bytes);

// Throws the Error that using `device` would raise, prefixed with `what` (the op or function),
// when the device is unusable: "<what>: device cuda: this build of phasor has no CUDA backend" or
// "<what>: device cuda: no CUDA device is available (cudaGetDeviceCount: <CUDA's message>)".
void require_device(Device device, const std::string& what);

namespace cuda {

// A cudaStream_t (void* here so that this header needs no CUDA headers). nullptr is the legacy
// default stream.
using Stream = void*;

// The stream phasor's CUDA work of this host thread runs on: the last set_current_stream of this
// thread, nullptr (the legacy default stream) until then.
Stream current_stream();
void set_current_stream(Stream stream);

// Sets the current stream for a scope and restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream) : previous_(current_stream()) { set_current_stream(stream); }
  ~StreamGuard() { set_current_stream(previous_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// How the CUDA kernels get their workspace (temporary device buffers): stream-ordered, so a
// buffer freed on a stream may be reused by later work on that stream without a host sync. The
// LibTorch layer plugs in its caching allocator here when LibTorch has CUDA.
struct Allocator {
  void* (*allocate)(std::size_t bytes, Stream stream, void* context);
  void (*deallocate)(void* ptr, std::size_t bytes, Stream stream, void* context);
  void* context;
};
// Process-wide. The default is cudaMallocAsync / cudaFreeAsync (CUDA's stream-ordered pool).
// Both functions must be set.
void set_allocator(const Allocator& allocator);
Allocator get_allocator();
Allocator default_allocator();

// GPU time of the work queued on a stream between start() and stop(), from two CUDA events (for
// benchmarks): stop() records the second event, waits for it (a sync of that event only) and
// returns the milliseconds between them. A phasor::Error naming the device without a GPU.
class Timer {
 public:
  explicit Timer(Stream stream = current_stream());
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start();
  double stop();

 private:
  Stream stream_;
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

}  // namespace cuda
}  // namespace phasor
