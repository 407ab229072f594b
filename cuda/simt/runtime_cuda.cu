// The CUDA runtime calls behind phasor/device.h, for builds with the CUDA backend.
#include <cuda_runtime.h>

#include <string>

#include "phasor/common.h"
#include "simt/runtime.h"

namespace phasor::cuda_runtime {
namespace {
void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw Error(std::string(call) + ": device cuda: " + cudaGetErrorString(status));
}
cudaMemcpyKind kind_of(CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device:
      return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host:
      return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device:
      break;
  }
  return cudaMemcpyDeviceToDevice;
}
}  // namespace

bool built() {
  return true;
}

int device_count(std::string& reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    reason = cudaGetErrorString(status);
    cudaGetLastError();  // clear it: the failure is an answer here, not an error of later calls
    return 0;
  }
  if (count == 0) reason = "it reports 0 devices";
  return count;
}

void* malloc(std::size_t bytes) {
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, bytes), "cudaMalloc");
  return ptr;
}
void free(void* ptr) noexcept {
  cudaFree(ptr);
}

void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, kind_of(kind), static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}
void stream_synchronize(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}
void* malloc_async(std::size_t bytes, void* stream) {
  void* ptr = nullptr;
  check(cudaMallocAsync(&ptr, bytes, static_cast<cudaStream_t>(stream)), "cudaMallocAsync");
  return ptr;
}
void free_async(void* ptr, void* stream) noexcept {
  cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
}
void* event_create() {
  cudaEvent_t event = nullptr;
  check(cudaEventCreate(&event), "cudaEventCreate");
  return event;
}
void event_record(void* event, void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}
void event_synchronize(void* event) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}
float event_elapsed_ms(void* start, void* stop) {
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)),
        "cudaEventElapsedTime");
  return ms;
}
void event_destroy(void* event) noexcept {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

}  // namespace phasor::cuda_runtime
