// phasor/device.h: answers in every build, errors naming the device, host copies, streams and the
// workspace allocator setting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "phasor/device.h"

namespace {

using phasor::Device;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const phasor::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Device, CudaWithoutAGpuIsAnErrorNamingTheDevice) {
  if (!phasor::cuda_is_built()) {
    EXPECT_EQ(phasor::cuda_device_count(), 0);
    const std::string what = error_of([] { phasor::device_allocate(Device::cuda, 64); });
    EXPECT_EQ(what, "device_allocate: device cuda: this build of phasor has no CUDA backend");
    return;
  }
  if (phasor::cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  const std::string what = error_of([] { phasor::device_allocate(Device::cuda, 64); });
  EXPECT_EQ(what.rfind("device_allocate: device cuda: no CUDA device is available "
                       "(cudaGetDeviceCount: ",
                       0),
            0u)
      << what;
  std::vector<float> host(4);
  EXPECT_NE(error_of([&] {
              phasor::copy_bytes(host.data(), Device::cpu, host.data(), Device::cuda, 16);
            }).find("copy_bytes: device cuda:"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { phasor::require_device(Device::cuda, "my_op"); }).find("my_op: device cuda:"),
      std::string::npos);
  EXPECT_NE(error_of([] { phasor::cuda::Timer timer; }).find("cuda::Timer: device cuda:"),
            std::string::npos);
}

// With a GPU: the timer measures the GPU time of queued work (a copy), positive and finite.
TEST(Device, TimerMeasuresQueuedWork) {
  if (phasor::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  std::vector<float> host(1 << 20, 1.f);
  void* device = phasor::device_allocate(Device::cuda, host.size() * sizeof(float));
  phasor::cuda::Timer timer;
  timer.start();
  phasor::copy_bytes(device, Device::cuda, host.data(), Device::cpu, host.size() * sizeof(float));
  const double ms = timer.stop();
  phasor::device_free(Device::cuda, device);
  EXPECT_GT(ms, 0.0);
  EXPECT_TRUE(std::isfinite(ms));
}

TEST(Device, CudaDeviceCountNeverThrowsAndIsStable) {
  const int count = phasor::cuda_device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(phasor::cuda_device_count(), count);
  if (!phasor::cuda_is_built()) {
    EXPECT_EQ(count, 0);
  }
}

TEST(Device, HostDevicesAllocateAndCopy) {
  const std::vector<double> source = {1.5, -2.25, 3.0, 1e300, -0.0};
  const std::size_t bytes = source.size() * sizeof(double);
  void* cpu = phasor::device_allocate(Device::cpu, bytes);
  void* emulated = phasor::device_allocate(Device::emulated, bytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cpu) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(emulated) % 64, 0u);
  phasor::copy_bytes(cpu, Device::cpu, source.data(), Device::cpu, bytes);
  phasor::copy_bytes(emulated, Device::emulated, cpu, Device::cpu, bytes);
  std::vector<double> back(source.size());
  phasor::copy_bytes(back.data(), Device::cpu, emulated, Device::emulated, bytes);
  EXPECT_EQ(std::memcmp(back.data(), source.data(), bytes), 0);
  phasor::device_free(Device::cpu, cpu);
  phasor::device_free(Device::emulated, emulated);
  phasor::device_free(Device::cpu, nullptr);
  phasor::require_device(Device::cpu, "op");
  phasor::require_device(Device::emulated, "op");
}

TEST(Device, StreamGuardSetsAndRestoresThisThreadsStream) {
  EXPECT_EQ(phasor::cuda::current_stream(), nullptr);
  int a = 0, b = 0;
  {
    phasor::cuda::StreamGuard outer(&a);
    EXPECT_EQ(phasor::cuda::current_stream(), &a);
    {
      phasor::cuda::StreamGuard inner(&b);
      EXPECT_EQ(phasor::cuda::current_stream(), &b);
    }
    EXPECT_EQ(phasor::cuda::current_stream(), &a);
  }
  EXPECT_EQ(phasor::cuda::current_stream(), nullptr);
}

TEST(Device, AllocatorIsSettable) {
  const phasor::cuda::Allocator initial = phasor::cuda::get_allocator();
  const phasor::cuda::Allocator fallback = phasor::cuda::default_allocator();
  EXPECT_EQ(initial.allocate, fallback.allocate);
  EXPECT_EQ(initial.deallocate, fallback.deallocate);
  int a_context = 0;
  phasor::cuda::Allocator custom{
      [](std::size_t, phasor::cuda::Stream, void*) -> void* { return nullptr; },
      [](void*, std::size_t, phasor::cuda::Stream, void*) {}, &a_context};
  phasor::cuda::set_allocator(custom);
  EXPECT_EQ(phasor::cuda::get_allocator().allocate, custom.allocate);
  EXPECT_EQ(phasor::cuda::get_allocator().context, &a_context);
  phasor::cuda::set_allocator(initial);
  phasor::cuda::Allocator broken = initial;
  broken.deallocate = nullptr;
  EXPECT_NE(error_of([&] { phasor::cuda::set_allocator(broken); }).find("argument 'allocator'"),
            std::string::npos);
}

}  // namespace
