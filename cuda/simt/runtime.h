// Internal: the CUDA runtime calls behind phasor/device.h. runtime_cuda.cu implements them with
// CUDA when the backend is built; runtime_host.cpp otherwise (no device: every call that would
// need one reports that the backend is missing). device.cpp checks availability before calling
// anything but built() and device_count().
#pragma once

#include <cstddef>
#include <string>

namespace phasor::cuda_runtime {

bool built();
// cudaGetDeviceCount; 0 and `reason` (CUDA's message) when it fails or finds none.
int device_count(std::string& reason);
void* malloc(std::size_t bytes);  // cudaMalloc; a phasor::Error with CUDA's message
void free(void* ptr) noexcept;    // cudaFree
enum class CopyKind { host_to_device, device_to_host, device_to_device };
void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, void* stream);
void stream_synchronize(void* stream);
void* malloc_async(std::size_t bytes, void* stream);  // cudaMallocAsync
void free_async(void* ptr, void* stream) noexcept;    // cudaFreeAsync
// CUDA events for timing: create, record on a stream, wait for, the milliseconds between two
// recorded events, destroy.
void* event_create();
void event_record(void* event, void* stream);
void event_synchronize(void* event);
float event_elapsed_ms(void* start, void* stop);
void event_destroy(void* event) noexcept;

}  // namespace phasor::cuda_runtime
