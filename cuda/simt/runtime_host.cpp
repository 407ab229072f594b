// The CUDA runtime calls when phasor is built without the CUDA backend: there is no device.
#include <string>

#include "phasor/common.h"
#include "simt/runtime.h"

namespace phasor::cuda_runtime {
namespace {
[[noreturn]] void unavailable(const char* call) {
  throw Error(std::string(call) + ": device cuda: this build of phasor has no CUDA backend");
}
}  // namespace

bool built() {
  return false;
}
int device_count(std::string& reason) {
  reason = "this build of phasor has no CUDA backend";
  return 0;
}
void* malloc(std::size_t) {
  unavailable("cudaMalloc");
}
void free(void*) noexcept {}
void memcpy_async(void*, const void*, std::size_t, CopyKind, void*) {
  unavailable("cudaMemcpyAsync");
}
void stream_synchronize(void*) {
  unavailable("cudaStreamSynchronize");
}
void* malloc_async(std::size_t, void*) {
  unavailable("cudaMallocAsync");
}
void free_async(void*, void*) noexcept {}
void* event_create() {
  unavailable("cudaEventCreate");
}
void event_record(void*, void*) {
  unavailable("cudaEventRecord");
}
void event_synchronize(void*) {
  unavailable("cudaEventSynchronize");
}
float event_elapsed_ms(void*, void*) {
  unavailable("cudaEventElapsedTime");
}
void event_destroy(void*) noexcept {}

}  // namespace phasor::cuda_runtime
