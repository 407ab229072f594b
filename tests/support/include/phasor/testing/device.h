// phasor_testing — tensors in a device's memory (Device::cuda, or the emulated GPU's own host
// memory), staged from and back to host Tensors: what the GPU suites and `phasor demo --device`
// run the kernels on.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "phasor/common.h"
#include "phasor/testing/layout.h"
#include "phasor/testing/tensor.h"

namespace phasor::testing {

// A contiguous tensor in the memory of `device`, copied from or to a host Tensor. Memory of its
// own also on Device::cpu and Device::emulated, so a kernel that reads the host copy by mistake
// is caught on every backend.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(const Tensor& host, Device device);
  // An output buffer, NaN everywhere (floating dtypes; integer ones zero), so that an element a
  // kernel does not write is seen.
  static DeviceTensor nans(const Shape& shape, DType dtype, Device device);

  bool defined() const { return defined_; }
  TensorView view() const;  // contiguous
  Tensor to_host() const;
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

 private:
  Shape shape_;
  DType dtype_ = DType::float32;
  Device device_ = Device::cpu;
  bool defined_ = false;
  std::shared_ptr<void> data_;
};

// The device copies of one call's arguments, kept alive with the views given out.
class OnDevice {
 public:
  explicit OnDevice(Device device) : device_(device) {}
  // The device copy of `host` (an undefined Tensor gives an undefined view).
  TensorView in(const Tensor& host);
  // The device copy of `host` converted to `dtype` (its values rounded to it), through a strided
  // view (in_strided's default layout) if asked; undefined stays undefined.
  TensorView in(const Tensor& host, DType dtype, bool strided = false);
  // The same values through a non-contiguous view: the device buffer holds the values in
  // `layout` (NaN in its gaps), by default every element followed by a gap along the last
  // dimension — what a slice of a wider tensor looks like.
  TensorView in_strided(const Tensor& host, const MemoryLayout& layout = {{}, 0, 2});
  // A NaN-filled output buffer shaped and typed like `like` (undefined: undefined view), or of a
  // shape and dtype; fetch it back with to_host(view).
  TensorView out(const Tensor& like);
  TensorView out(const Shape& shape, DType dtype);
  // The host copy (contiguous, in the logical shape) of a view given out by in(), in_strided()
  // or out(); a phasor::Error for any other view.
  Tensor to_host(const TensorView& view) const;
  // Waits until the work queued on the device so far has finished (Device::cuda: the current
  // stream; the host devices compute synchronously).
  void synchronize();
  Device device() const { return device_; }

 private:
  Device device_;
  std::vector<DeviceTensor> tensors_;
  std::vector<TensorView> views_;  // views_[i] looks into tensors_[i]
  DeviceTensor sync_buffer_;
};

}  // namespace phasor::testing
