// Internal: running a call on its device — the one place per op entry point where the backend is
// chosen. Each op's api.cpp checks the metadata (common/check.h), builds its problem description
// and calls run_on_device with the call's value checks and its CPU and GPU paths:
//   cpu              the value checks on the host, then the CPU implementation selected by Impl;
//   cuda, emulated   the implementation must have CUDA kernels (phasor/ops.h: OpInfo::on_gpu); the
//                    value checks run on the device (cuda/common/validate.h: a validation kernel
//                    and one host sync to read its verdict), then the GPU path, which calls the
//                    backend's entry points through PHASOR_ON_GPU.
#pragma once

#include <string>

#include "common/check.h"
#include "common/validate.h"
#include "phasor/ops.h"

// PHASOR_ON_GPU(device, call): `phasor::cuda::call` on Device::cuda, `phasor::emulated::call` on
// Device::emulated — the same kernel source compiled by nvcc and by the host compiler. Without
// the CUDA backend in this build, Device::cuda never gets here (call_device refuses it).
#if PHASOR_HAS_CUDA
#define PHASOR_ON_GPU(device, call) \
  ((device) == ::phasor::Device::cuda ? ::phasor::cuda::call : ::phasor::emulated::call)
#else
// (device is still evaluated, so that a build without CUDA has no unused-parameter warnings.)
#define PHASOR_ON_GPU(device, call) (static_cast<void>(device), ::phasor::emulated::call)
#endif

namespace phasor::detail {

// A phasor::Error naming 'impl' when `impl` of `op` has no CUDA kernels.
inline void require_gpu_impl(const std::string& op, Op which, Impl impl, Device device) {
  const OpInfo& info = op_info(which);
  if (info.on_gpu[static_cast<std::size_t>(impl)]) return;
  std::string available;
  for (std::size_t i = 0; i < info.on_gpu.size(); ++i)
    if (info.on_gpu[i])
      available += std::string(available.empty() ? "" : " or ") + to_string(static_cast<Impl>(i)) +
                   " (" + info.impl_names[i] + ")";
  fail(op, "impl",
       available.empty() ? std::string("a device with an implementation of ") + info.name +
                               " (it has no CUDA kernel yet: run it on the cpu)"
                         : "an implementation with CUDA kernels on device " +
                               std::string(to_string(device)) + ": " + available,
       to_string(impl));
}

// The value checks on a GPU device; raises the CPU's message for the first failure.
inline void check_values_on_gpu(const std::string& op, Device device, const ValueChecks& checks) {
  if (!checks.sequences.packed() && checks.count == 0) return;  // nothing to read: no sync
  const ValueVerdict verdict = PHASOR_ON_GPU(device, find_value_failure(checks));
  if (verdict.failed()) raise_value_failure(op, checks, verdict);
}

template <class Cpu, class Gpu>
void run_on_device(const std::string& op, Op which, Impl impl, Device device,
                   const ValueChecks& checks, Cpu&& cpu, Gpu&& gpu) {
  if (device == Device::cpu) {
    check_values_on_host(op, checks);
    cpu();
    return;
  }
  require_gpu_impl(op, which, impl, device);
  check_values_on_gpu(op, device, checks);
  gpu();
}

}  // namespace phasor::detail
