// Test support for the GPU backends (as ggml's test-backend-ops checks every backend against the
// CPU): tensors in a device's memory, the devices to test, and the tolerance rules of the
// CPU-vs-GPU comparisons, with a record of the worst errors measured.
//
// Every CUDA kernel is tested on Device::emulated (always) and on Device::cuda (when the machine
// has a GPU; otherwise GoogleTest reports those instances as SKIPPED, never as passed).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "phasor/device.h"
#include "phasor/emulator.h"
#include "test_util.h"

namespace phasor::testing {

// The devices the CUDA kernels are tested on.
inline std::vector<Device> gpu_devices() {
  return {Device::emulated, Device::cuda};
}
inline std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return to_string(info.param);
}

// Skips (GTEST_SKIP) a test instance for Device::cuda on a machine without a GPU.
#define PHASOR_SKIP_WITHOUT_GPU(device)                                                     \
  do {                                                                                      \
    if ((device) == ::phasor::Device::cuda && ::phasor::cuda_device_count() == 0)           \
      GTEST_SKIP() << "no CUDA device on this machine: the same kernels are tested on the " \
                      "emulated GPU";                                                       \
  } while (0)

// A tensor in the memory of `device`, copied from or to a host Tensor. Separate memory also for
// the emulated device (host memory of its own), so a kernel that reads the host copy by mistake
// is caught on every backend.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(const Tensor& host, Device device)
      : shape_(host.shape()), dtype_(host.dtype()), device_(device) {
    allocate();
    if (bytes() > 0) copy_bytes(data_.get(), device_, host.view().data, Device::cpu, bytes());
  }
  // An output buffer, filled with NaN (floating dtypes) so that an element a kernel does not
  // write is seen.
  static DeviceTensor output(std::vector<std::int64_t> shape, DType dtype, Device device) {
    Tensor poison(std::move(shape), dtype);
    if (is_floating(dtype)) poison.fill(std::numeric_limits<double>::quiet_NaN());
    return DeviceTensor(poison, device);
  }
  // An output shaped and typed like `like`.
  static DeviceTensor output_like(const Tensor& like, Device device) {
    return output(like.shape(), like.dtype(), device);
  }

  bool defined() const { return static_cast<bool>(data_) || !shape_.empty(); }
  TensorView view() const {
    if (!defined()) return {};
    TensorView v = Tensor(shape_, dtype_).view();  // contiguous strides for the shape
    v.data = data_.get();
    v.device = device_;
    return v;
  }
  Tensor to_host() const {
    Tensor host(shape_, dtype_);
    if (bytes() > 0) copy_bytes(host.view().data, Device::cpu, data_.get(), device_, bytes());
    return host;
  }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }

 private:
  std::size_t bytes() const {
    std::int64_t n = 1;
    for (auto s : shape_) n *= s;
    return static_cast<std::size_t>(n) * element_size(dtype_);
  }
  void allocate() {
    const Device device = device_;
    // At least one byte, so that a zero-size tensor still has a distinct non-null pointer.
    data_ = std::shared_ptr<void>(device_allocate(device, std::max<std::size_t>(bytes(), 1)),
                                  [device](void* p) { device_free(device, p); });
  }

  std::vector<std::int64_t> shape_;
  DType dtype_ = DType::float32;
  Device device_ = Device::cpu;
  std::shared_ptr<void> data_;
};

// Host tensors of a test, uploaded to a device on demand and kept alive with the views given out.
class OnDevice {
 public:
  explicit OnDevice(Device device) : device_(device) {}
  // The device copy of `host` (an undefined Tensor gives an undefined view).
  TensorView in(const Tensor& host) {
    if (!host.defined()) return {};
    tensors_.emplace_back(host, device_);
    return tensors_.back().view();
  }
  // The same values through a strided view: the device buffer holds every element twice along the
  // last dimension (strides doubled there and scaled in the others), and the view reads every
  // other one — what a slice of a wider tensor looks like.
  TensorView in_strided(const Tensor& host) {
    if (!host.defined()) return {};
    std::vector<std::int64_t> wide_shape = host.shape();
    wide_shape.back() *= 2;
    Tensor wide(wide_shape, host.dtype());
    for (std::int64_t e = 0; e < host.numel(); ++e) {
      wide.set(2 * e, host.at(e));
      wide.set(2 * e + 1, std::numeric_limits<double>::quiet_NaN());  // never read
    }
    TensorView v = in(wide);
    v.sizes[static_cast<std::size_t>(v.rank - 1)] /= 2;
    for (int d = 0; d < v.rank - 1; ++d)
      v.strides[static_cast<std::size_t>(d)] = 2 * host.view().stride(d);
    v.strides[static_cast<std::size_t>(v.rank - 1)] = 2;
    return v;
  }
  // A NaN-filled output buffer shaped and typed like `like`; fetch it back with to_host(view).
  TensorView out(const Tensor& like) {
    if (!like.defined()) return {};
    tensors_.push_back(DeviceTensor::output_like(like, device_));
    return tensors_.back().view();
  }
  TensorView out(std::vector<std::int64_t> shape, DType dtype) {
    tensors_.push_back(DeviceTensor::output(std::move(shape), dtype, device_));
    return tensors_.back().view();
  }
  // The host copy of a view given out by in() or out().
  Tensor to_host(const TensorView& view) const {
    for (const DeviceTensor& t : tensors_)
      if (t.view().data == view.data) return t.to_host();
    ADD_FAILURE() << "OnDevice::to_host: not a view of this OnDevice";
    return {};
  }
  Device device() const { return device_; }

 private:
  Device device_;
  std::vector<DeviceTensor> tensors_;
};

// ---- tolerances and the record of measured errors ----------------------------------------------

// The worst relative RMS errors measured by the GPU tests, per (kernel, comparison, dtype). Printed
// by every test binary at exit (a GoogleTest environment), one line per key: the README's table of
// CPU-vs-GPU errors is built from these lines.
class ErrorRecord {
 public:
  static ErrorRecord& instance() {
    static ErrorRecord record;
    return record;
  }
  void add(const std::string& key, double error) {
    std::lock_guard<std::mutex> lock(mutex_);
    double& worst = worst_[key];
    worst = std::max(worst, error);
  }
  void print() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, error] : worst_)
      std::printf("[phasor-gpu-error] %s worst relative RMS %.3e\n", key.c_str(), error);
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, double> worst_;
};

struct ErrorRecordPrinter : ::testing::Environment {
  void TearDown() override { ErrorRecord::instance().print(); }
};
// Registered once per test binary that includes this header.
inline ::testing::Environment* const error_record_printer =
    ::testing::AddGlobalTestEnvironment(new ErrorRecordPrinter);

// "<kernel> <comparison> <dtype>", e.g. "fused_recurrent_gla dq vs reference float32".
inline void record_error(const std::string& key, double error) {
  ErrorRecord::instance().add(key, error);
}

// The tolerance of a GPU result against the float64 reference by dtype: float64 ≤ 1e-12 (the
// algorithm is exact), float32 ≤ 1e-5 (the CPU kernels' bound). 16-bit dtypes have no fixed
// bound: use expect_as_accurate_as_cpu.
inline double reference_tolerance(DType dtype) {
  return dtype == DType::float64 ? 1e-12 : 1e-5;
}

// `gpu` against the float64 reference `reference`, within reference_tolerance(dtype); records
// the error under `key`.
inline void expect_close_to_reference(const Tensor& gpu, const Tensor& reference, DType dtype,
                                      const std::string& key) {
  const double error = rel_rms(gpu, reference);
  record_error(key + " vs reference " + to_string(dtype), error);
  EXPECT_TRUE(all_finite(gpu)) << key << " has non-finite values";
  EXPECT_LE(error, reference_tolerance(dtype))
      << key << " (" << to_string(dtype) << "): relative RMS error against the reference";
}

// 16-bit inputs: the CPU kernel and the GPU kernel were fed the same rounded inputs, and
// `reference` is the float64 reference on those inputs. The GPU must be as accurate as the CPU:
// its relative RMS error at most twice the CPU kernel's own, plus 1e-6 (when the CPU's error is
// tiny). Records both errors under `key`.
inline void expect_as_accurate_as_cpu(const Tensor& gpu, const Tensor& cpu, const Tensor& reference,
                                      DType dtype, const std::string& key) {
  const double gpu_error = rel_rms(gpu, reference), cpu_error = rel_rms(cpu, reference);
  record_error(key + " vs reference " + to_string(dtype), gpu_error);
  record_error(key + " (cpu kernel) vs reference " + to_string(dtype), cpu_error);
  EXPECT_TRUE(all_finite(gpu)) << key << " has non-finite values";
  EXPECT_LE(gpu_error, 2 * cpu_error + 1e-6)
      << key << " (" << to_string(dtype) << "): GPU relative RMS error " << gpu_error
      << " against the CPU kernel's " << cpu_error;
}

// The unit roundoff of a 16-bit type: 2^−8 for bfloat16 (8 significant bits), 2^−11 for float16.
inline double unit_roundoff(DType dtype) {
  return dtype == DType::bfloat16 ? 0x1p-8 : 0x1p-11;
}

// 16-bit inputs through a tensor-core kernel, which rounds every operand of its matrix products to
// the 16-bit type (as fla's kernels do), where the CPU kernel computes in float32: the GPU's error
// against the reference (on the same rounded inputs) may exceed twice the CPU kernel's by twice
// the unit roundoff of the type — an output passes through up to two rounded products in series
// (e.g. a chunk's state, then the output computed from it; measured: ≤ 1.9 unit roundoffs). This
// matters for outputs stored in float32 (final states, dh0), whose CPU error is ~1e-7; a 16-bit
// output's own rounding dominates both kernels. Algorithmic errors are caught at float32 and
// float64, where the same kernels use exact FMA tiles. Records both errors.
// `roundoffs`: the allowance in unit roundoffs (2 by default; more for outputs whose terms cancel,
// stated where a test asks for it).
inline void expect_tensor_core_accuracy(const Tensor& gpu, const Tensor& cpu,
                                        const Tensor& reference, DType dtype,
                                        const std::string& key, double roundoffs = 2) {
  const double gpu_error = rel_rms(gpu, reference), cpu_error = rel_rms(cpu, reference);
  record_error(key + " vs reference " + to_string(dtype), gpu_error);
  record_error(key + " (cpu kernel) vs reference " + to_string(dtype), cpu_error);
  EXPECT_TRUE(all_finite(gpu)) << key << " has non-finite values";
  EXPECT_LE(gpu_error, 2 * cpu_error + roundoffs * unit_roundoff(dtype))
      << key << " (" << to_string(dtype) << "): GPU relative RMS error " << gpu_error
      << " against the CPU kernel's " << cpu_error << " + " << roundoffs << " unit roundoffs of "
      << unit_roundoff(dtype);
}

// The dtypes the GPU kernels are tested with.
inline std::vector<DType> gpu_test_dtypes() {
  return {DType::float64, DType::float32, DType::bfloat16, DType::float16};
}

}  // namespace phasor::testing
