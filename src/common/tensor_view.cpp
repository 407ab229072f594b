#include <cstdlib>
#include <sstream>

#include "phasor/common.h"

namespace phasor {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::bfloat16:
      return "bfloat16";
    case DType::float16:
      return "float16";
  }
  return "unknown";
}

const char* to_string(Device device) {
  switch (device) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
    case Device::emulated:
      return "emulated";
  }
  return "unknown";
}

std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::float32:
    case DType::int32:
      return 4;
    case DType::float64:
    case DType::int64:
      return 8;
    case DType::bfloat16:
    case DType::float16:
      return 2;
  }
  return 0;
}

const char* to_string(Impl impl) {
  switch (impl) {
    case Impl::reference:
      return "reference";
    case Impl::recurrent:
      return "recurrent";
    case Impl::chunk:
      return "chunk";
  }
  return "unknown";
}

const char* to_string(RotaryLayout layout) {
  return layout == RotaryLayout::interleaved ? "interleaved" : "half_split";
}

Impl impl_from_string(const std::string& name) {
  if (name == "reference") return Impl::reference;
  if (name == "recurrent") return Impl::recurrent;
  if (name == "chunk") return Impl::chunk;
  throw Error("argument 'impl': expected one of reference, recurrent, chunk; got '" + name + "'");
}

bool TensorView::is_contiguous() const {
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (size(d) != 1 && stride(d) != expected) return false;
    expected *= size(d);
  }
  return true;
}

std::string TensorView::shape_string() const {
  if (!defined()) return "undefined";
  if (rank > kMaxRank) return "rank " + std::to_string(rank);  // malformed: no sizes past 4
  std::ostringstream s;
  s << '[';
  for (int d = 0; d < rank; ++d) s << (d ? ", " : "") << size(d);
  s << ']';
  return s.str();
}

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> sizes, Device device) {
  if (sizes.size() > static_cast<std::size_t>(kMaxRank))
    throw Error("TensorView: rank " + std::to_string(sizes.size()) + " exceeds the maximum of 4");
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(sizes.size());
  int d = 0;
  for (std::int64_t s : sizes) v.sizes[static_cast<std::size_t>(d++)] = s;
  std::int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.strides[static_cast<std::size_t>(i)] = stride;
    stride *= v.sizes[static_cast<std::size_t>(i)];
  }
  return v;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> sizes,
                               std::initializer_list<std::int64_t> strides, Device device) {
  if (sizes.size() != strides.size())
    throw Error("TensorView: " + std::to_string(sizes.size()) + " sizes but " +
                std::to_string(strides.size()) + " strides");
  TensorView v = contiguous(data, dtype, sizes, device);
  int d = 0;
  for (std::int64_t s : strides) v.strides[static_cast<std::size_t>(d++)] = s;
  return v;
}

}  // namespace phasor
