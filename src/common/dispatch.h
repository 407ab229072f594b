// Internal: running a call on its device — the one place per op entry point where the backend is
// chosen. Each op's api.cpp checks the metadata (common/check.h), builds its problem description
// and calls run_on_device with the call's value checks and its CPU and GPU paths:
//   cpu              the value checks on the host, then the CPU implementation selected by Impl;
//   cuda, emulated   the implementation must have CUDA kernels (phasor/ops.h: OpInfo::on_gpu);
//                    then the GPU path, which runs the value checks on its device and the kernels.
#pragma once

#include <string>

#include "common/check.h"
#include "phasor/ops.h"

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

template <class Cpu, class Gpu>
void run_on_device(const std::string& op, Op which, Impl impl, Device device,
                   const ValueChecks& checks, Cpu&& cpu, Gpu&& gpu) {
  if (device == Device::cpu) {
    check_values_on_host(op, checks);
    cpu();
    return;
  }
  require_gpu_impl(op, which, impl, device);
  gpu();
}

}  // namespace phasor::detail
