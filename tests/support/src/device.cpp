#include "phasor/testing/device.h"

#include <algorithm>
#include <limits>
#include <string>

#include "phasor/device.h"

namespace phasor::testing {
DeviceTensor::DeviceTensor(const Tensor& host, Device device)
    : shape_(host.shape()), dtype_(host.dtype()), device_(device), defined_(host.defined()) {
  if (!defined_) return;
  // At least one byte, so that a zero-size tensor still has a distinct non-null pointer.
  data_ = std::shared_ptr<void>(device_allocate(device, std::max<std::size_t>(host.nbytes(), 1)),
                                [device](void* p) { device_free(device, p); });
  if (host.nbytes() > 0) copy_bytes(data_.get(), device_, host.data(), Device::cpu, host.nbytes());
}

DeviceTensor DeviceTensor::nans(const Shape& shape, DType dtype, Device device) {
  Tensor poison(shape, dtype);
  if (is_floating(dtype)) poison.fill(std::numeric_limits<double>::quiet_NaN());
  return DeviceTensor(poison, device);
}

TensorView DeviceTensor::view() const {
  if (!defined_) return {};
  return contiguous_view(data_.get(), dtype_, shape_, device_);
}

Tensor DeviceTensor::to_host() const {
  if (!defined_) return {};
  Tensor host(shape_, dtype_);
  if (host.nbytes() > 0) copy_bytes(host.data(), Device::cpu, data_.get(), device_, host.nbytes());
  return host;
}

TensorView OnDevice::in(const Tensor& host) {
  if (!host.defined()) return {};
  tensors_.emplace_back(host, device_);
  views_.push_back(tensors_.back().view());
  return views_.back();
}

TensorView OnDevice::in(const Tensor& host, DType dtype, bool strided) {
  if (!host.defined()) return {};
  return strided ? in_strided(host.to(dtype)) : in(host.to(dtype));
}

TensorView OnDevice::in_strided(const Tensor& host, const MemoryLayout& layout) {
  if (!host.defined()) return {};
  const StridedTensor strided(host, host.dtype(), layout);
  tensors_.emplace_back(strided.storage(), device_);
  TensorView view = strided.view();
  view.data = tensors_.back().view().data;
  view.device = device_;
  views_.push_back(view);
  return view;
}

TensorView OnDevice::out(const Tensor& like) {
  if (!like.defined()) return {};
  return out(like.shape(), like.dtype());
}

TensorView OnDevice::out(const Shape& shape, DType dtype) {
  tensors_.push_back(DeviceTensor::nans(shape, dtype, device_));
  views_.push_back(tensors_.back().view());
  return views_.back();
}

Tensor OnDevice::to_host(const TensorView& view) const {
  for (std::size_t i = 0; i < views_.size(); ++i) {
    if (views_[i].data != view.data) continue;
    const Tensor storage = tensors_[i].to_host();
    TensorView host_view = views_[i];
    host_view.data = const_cast<void*>(storage.data());
    host_view.device = Device::cpu;
    return Tensor::copy_of(host_view);
  }
  throw Error("phasor::testing::OnDevice::to_host: the view " + view.shape_string() +
              " was not given out by this OnDevice");
}

void OnDevice::synchronize() {
  if (device_ != Device::cuda) return;
  // A copy to host memory waits for the current stream, after the work queued before it.
  if (!sync_buffer_.defined()) sync_buffer_ = DeviceTensor(Tensor({1}, DType::float32), device_);
  float value = 0;
  copy_bytes(&value, Device::cpu, sync_buffer_.view().data, device_, sizeof value);
}

}  // namespace phasor::testing
