// phasor — common types of the core API: errors, tensor views, implementation choice, threads.
//
// The core API takes non-owning views of caller-owned memory (pointer + dtype + device + shape +
// strides) and writes results into views the caller allocated. It has no dependency on LibTorch;
// `phasor/torch.h` adds at::Tensor entry points with autograd on top.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace phasor {

// Every error phasor raises for bad input: the message names the op and the argument, what was
// expected and what was given.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

enum class DType : std::uint8_t { float32, float64, int32, int64 };
enum class Device : std::uint8_t { cpu, cuda };

const char* to_string(DType dtype);
const char* to_string(Device device);
std::size_t element_size(DType dtype);

template <class T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>,
                "phasor tensors hold float, double, int32 or int64");
  if constexpr (std::is_same_v<T, float>) return DType::float32;
  if constexpr (std::is_same_v<T, double>) return DType::float64;
  if constexpr (std::is_same_v<T, std::int32_t>) return DType::int32;
  return DType::int64;
}

// A non-owning, strided view of a tensor of rank ≤ 4. Strides are in elements (not bytes), as in
// PyTorch. A default-constructed view is "undefined" and stands for an absent optional argument.
// Views carry the device: the CPU kernels accept Device::cpu only; a CUDA backend slots in behind
// the same calls for Device::cuda.
struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::float32;
  Device device = Device::cpu;
  int rank = -1;  // -1: undefined (absent optional argument)
  std::array<std::int64_t, kMaxRank> sizes{};
  std::array<std::int64_t, kMaxRank> strides{};

  bool defined() const { return rank >= 0; }
  std::int64_t size(int dim) const { return sizes[static_cast<std::size_t>(dim)]; }
  std::int64_t stride(int dim) const { return strides[static_cast<std::size_t>(dim)]; }
  std::int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_string() const;  // "[2, 16, 4, 32]", or "undefined"

  // A view of contiguous (row-major) memory.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> sizes,
                               Device device = Device::cpu);
  template <class T>
  static TensorView of(T* data, std::initializer_list<std::int64_t> sizes,
                       Device device = Device::cpu) {
    return contiguous(const_cast<std::remove_const_t<T>*>(data), dtype_of<std::remove_const_t<T>>(),
                      sizes, device);
  }
  // A view with explicit strides (in elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> sizes,
                            std::initializer_list<std::int64_t> strides,
                            Device device = Device::cpu);
};

// Which implementation of an op runs.
//  - reference: plain loops in float64, obviously correct, slow; what the tests trust.
//  - recurrent: token-by-token (streaming) kernel; also the single-step decode path.
//  - chunk:     chunk-parallel kernel built on dense matrix products (Eigen); for training and
//               prefill. For forgetting attention, the tiled flash-style kernel.
enum class Impl : std::uint8_t { reference, recurrent, chunk };
const char* to_string(Impl impl);
Impl impl_from_string(const std::string& name);  // "reference" | "recurrent" | "chunk"

// Where the two members of each rotation pair sit within a row of K = 2R values, for RoPE-style
// rotations (apply_rotary and the rotation fused into the attention kernels):
//   half_split   pairs (i, i + R)    GPT-NeoX, fla and the public Selective RoPE code (default)
//   interleaved  pairs (2i, 2i + 1)  GPT-J
enum class RotaryLayout : std::uint8_t { half_split, interleaved };
const char* to_string(RotaryLayout layout);  // "half_split" | "interleaved"

// Threads. Kernels split work over (sequence, head) pairs; every pair is computed by one thread
// in a fixed order, so results are bit-identical from run to run and for any thread count.
// The default is the PHASOR_NUM_THREADS environment variable if set, else the number of hardware
// threads. set_num_threads(0) restores the default.
void set_num_threads(int num_threads);
int num_threads();

}  // namespace phasor
