// The LibTorch layer's compute device (phasor/torch.h: set_compute_device) and the staging of CPU
// tensors on a GPU for it; with a LibTorch built with CUDA, its stream and caching allocator.
#include <vector>

#include "layer_util.h"
#include "phasor/device.h"

#if PHASOR_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace phasor {
namespace {

thread_local Device g_compute_device = Device::cpu;

// A CPU tensor's memory copied to the GPU for one core call.
struct Staged {
  void* device_data;
  void* host_data;
  std::size_t bytes;
  bool output;  // copied back to the host when the call succeeds
};
thread_local std::vector<Staged> g_staged;

}  // namespace

void set_compute_device(Device device) {
  g_compute_device = device;
}

Device compute_device() {
  return g_compute_device;
}

namespace torch_detail {

void check_compute_device(const std::string& op) {
  if (g_compute_device == Device::cuda) rethrow_as_torch([&] { require_device(Device::cuda, op); });
}

TensorView compute_view(const at::Tensor& t, bool output) {
  TensorView v = view_of(t);
  if (!t.defined() || !t.device().is_cpu() || g_compute_device == Device::cpu) return v;
  v.device = g_compute_device;
  if (g_compute_device == Device::emulated) return v;  // host memory: the tensor's own
  // Device::cuda: a device copy of the memory the view spans (strides kept; zero strides of
  // expanded tensors span little).
  std::int64_t extent = 1;
  for (int d = 0; d < v.rank; ++d) extent += (v.size(d) - 1) * v.stride(d);
  const std::size_t bytes =
      v.numel() == 0 ? 1 : static_cast<std::size_t>(extent) * element_size(v.dtype);
  try {
    void* device_data = device_allocate(Device::cuda, bytes);
    g_staged.push_back({device_data, v.data, bytes, output});
    if (!output && v.numel() > 0) copy_bytes(device_data, Device::cuda, v.data, Device::cpu, bytes);
    v.data = device_data;
  } catch (const Error& e) {
    settle_staged(/*copy_outputs_back=*/false);
    TORCH_CHECK(false, e.what());
  }
  return v;
}

void settle_staged(bool copy_outputs_back) {
  std::vector<Staged> staged;
  staged.swap(g_staged);
  try {
    if (copy_outputs_back)
      for (const Staged& s : staged)
        if (s.output) copy_bytes(s.host_data, Device::cpu, s.device_data, Device::cuda, s.bytes);
  } catch (...) {
    for (const Staged& s : staged) device_free(Device::cuda, s.device_data);
    throw;
  }
  for (const Staged& s : staged) device_free(Device::cuda, s.device_data);
}

#if PHASOR_TORCH_CUDA
namespace {
// The CUDA kernels' workspace from LibTorch's caching allocator, on the call's stream.
void* caching_allocate(std::size_t bytes, cuda::Stream stream, void*) {
  return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes,
                                                                static_cast<cudaStream_t>(stream));
}
void caching_free(void* ptr, std::size_t, cuda::Stream, void*) {
  c10::cuda::CUDACachingAllocator::raw_delete(ptr);
}
}  // namespace

cuda::Stream current_torch_stream() {
  static const bool allocator_set = [] {
    cuda::set_allocator({caching_allocate, caching_free, nullptr});
    return true;
  }();
  (void)allocator_set;
  return at::cuda::getCurrentCUDAStream().stream();
}
#endif

}  // namespace torch_detail
}  // namespace phasor
