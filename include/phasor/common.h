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

#include "phasor/half.h"  // bfloat16, float16 and PHASOR_HOST_DEVICE

namespace phasor {

// Every error phasor raises for bad input: the message names the op and the argument, what was
// expected and what was given.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Storage types. bfloat16 and float16 (phasor/half.h) are storage only: every kernel converts
// them to float32 on load and computes in float32; outputs take the dtype of the view they are
// written to.
enum class DType : std::uint8_t { float32, float64, int32, int64, bfloat16, float16 };

// Where a view's memory lives and which backend computes on it:
//   cpu       host memory; the CPU kernels (src/).
//   cuda      memory of the current CUDA device; the CUDA kernels (cuda/), on the current stream
//             (phasor/device.h). A phasor::Error naming the device if this build has no CUDA
//             backend or the machine no GPU.
//   emulated  host memory; the same CUDA kernels compiled for the host and executed thread by
//             thread by the emulated GPU (cuda/simt/), with its checks. For testing the CUDA
//             kernels without a GPU: always available, slow.
enum class Device : std::uint8_t { cpu, cuda, emulated };

const char* to_string(DType dtype);
const char* to_string(Device device);
std::size_t element_size(DType dtype);
// float32, float64, bfloat16 or float16.
constexpr bool is_floating(DType dtype) {
  return dtype == DType::float32 || dtype == DType::float64 || dtype == DType::bfloat16 ||
         dtype == DType::float16;
}

template <class T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
                    std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>,
                "phasor tensors hold float, double, int32, int64, bfloat16 or float16");
  if constexpr (std::is_same_v<T, float>) return DType::float32;
  if constexpr (std::is_same_v<T, double>) return DType::float64;
  if constexpr (std::is_same_v<T, std::int32_t>) return DType::int32;
  if constexpr (std::is_same_v<T, bfloat16>) return DType::bfloat16;
  if constexpr (std::is_same_v<T, float16>) return DType::float16;
  return DType::int64;
}

// A non-owning, strided view of a tensor of rank ≤ 4. Strides are in elements (not bytes), as in
// PyTorch. A default-constructed view is "undefined" and stands for an absent optional argument.
// Views carry the device; every view of one call must be on the same device, which selects the
// backend (see Device). A view is plain data (trivially copyable): it is passed to CUDA kernels
// by value, inside each op's problem description.
struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::float32;
  Device device = Device::cpu;
  int rank = -1;  // -1: undefined (absent optional argument)
  std::array<std::int64_t, kMaxRank> sizes{};
  std::array<std::int64_t, kMaxRank> strides{};

  PHASOR_HOST_DEVICE bool defined() const { return rank >= 0; }
  PHASOR_HOST_DEVICE std::int64_t size(int dim) const {
    return sizes[static_cast<std::size_t>(dim)];
  }
  PHASOR_HOST_DEVICE std::int64_t stride(int dim) const {
    return strides[static_cast<std::size_t>(dim)];
  }
  PHASOR_HOST_DEVICE std::int64_t numel() const {
    if (!defined()) return 0;
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= size(d);
    return n;
  }
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

// Which implementation of an op runs. The same meaning for every op (phasor/ops.h names each op's
// implementations, fla's names where fla has them; each op's header says what they do for it):
//  - reference: plain loops in float64 straight from the op's equations; obviously correct, slow;
//               what the tests trust. CPU only.
//  - recurrent: token by token (streaming): the decode path ("fused_recurrent_*"; FoX: the
//               key/value cache); its backward replays the recurrence from state checkpoints.
//  - chunk:     the parallel form for training and prefill ("chunk_*": chunks with dense products;
//               FoX: flash-style tiles).
// Ops with no recurrence (the rotary ops, the short convolution, the STRING / GRAPE / structured
// rotations, FAVOR+) have one optimized kernel, which recurrent and chunk both select. On
// Device::cuda and Device::emulated only the implementations with CUDA kernels run
// (OpInfo::on_gpu in phasor/ops.h); the others raise a phasor::Error naming 'impl'.
enum class Impl : std::uint8_t { reference, recurrent, chunk };
const char* to_string(Impl impl);
Impl impl_from_string(const std::string& name);  // "reference" | "recurrent" | "chunk"

// Chunk states: the state entering every chunk, which Impl::chunk's forward of GLA and Gated
// DeltaNet can keep for its backward (phasor/gla.h, phasor/gated_delta_rule.h: chunk_states; fla's
// h), laid out [num_chunk_states(q, cu_seqlens, chunk_size), H, K, V]. With C = chunk_size clamped
// to T (as the kernels clamp it) the count is B·⌈T/C⌉ without cu_seqlens and N + ⌈T/C⌉ with N
// packed sequences; the state entering chunk c of sequence n is at index n·⌈T/C⌉ + c, or
// n + ⌊cu_seqlens[n] / C⌋ + c in a packed batch, whose indices between two sequences' chunks hold
// no chunk's state (the CPU kernels leave them untouched). Only q's sizes B, T and cu_seqlens' size
// are read (never its values, which may live on a GPU). q: [B, T, ...] as the op's q; cu_seqlens
// optional, [N + 1].
std::int64_t num_chunk_states(const TensorView& q, const TensorView& cu_seqlens,
                              std::int64_t chunk_size);

// Where the two members of each rotation pair sit within a row of K = 2R values, for RoPE-style
// rotations (apply_rotary and the rotation fused into the attention kernels):
//   half_split   pairs (i, i + R)    GPT-NeoX, fla and the public Selective RoPE code (default)
//   interleaved  pairs (2i, 2i + 1)  GPT-J
enum class RotaryLayout : std::uint8_t { half_split, interleaved };
const char* to_string(RotaryLayout layout);  // "half_split" | "interleaved"

// Threads. Kernels split work over (sequence, head) pairs; every pair is computed by one thread
// in a fixed order, so results are bit-identical from run to run and for any thread count. With
// fewer pairs than twice the threads, the chunk kernels also split a pair along the sequence, by
// boundaries that do not depend on the thread count (chunks, value tiles, query blocks), so the
// results stay bit-identical.
// The default is the PHASOR_NUM_THREADS environment variable if set, else the number of hardware
// threads. set_num_threads(0) restores the default. Calls too small to repay handing work to
// another thread run on the calling thread; between calls the workers spin for up to 50 µs
// before sleeping (the PHASOR_SPIN_US environment variable, read once; 0 sleeps at once).
void set_num_threads(int num_threads);
int num_threads();

// Subnormal numbers. The CPU kernels run with the processor's flush-to-zero and
// denormals-are-zero modes on (x86: MXCSR's FTZ and DAZ; AArch64: FPCR's FZ), set on every thread
// for the duration of a kernel's work and restored after, as TensorFlow and XLA run their CPU
// kernels: a result or operand below the smallest normal number (1.2e-38 in float32, 2.2e-308 in
// float64) counts as 0. Intel cores take a microcode assist of ~100 cycles on every instruction
// that makes or reads a subnormal number, and decays over strong gates make them by the
// thousand: with gates log σ(−1 + N(0, 1)) and log σ(−2 + N(0, 1)), the chunk forwards ran 6.6×
// and 13× (GLA), 4.5× and 6.0× (Gated DeltaNet) slower without the modes on an Intel Xeon
// (docs/performance.md). Every thread of a call uses the same modes, so results stay
// bit-identical for any thread count. set_flush_denormals(false) keeps IEEE gradual underflow
// (the default is the PHASOR_FLUSH_DENORMALS environment variable, 0 or 1, if set, else true);
// the setting applies to calls started after it.
void set_flush_denormals(bool flush);
bool flush_denormals();

}  // namespace phasor
