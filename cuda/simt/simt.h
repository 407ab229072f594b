// phasor's portability header: every CUDA kernel of phasor is written once against this API.
//
// Under nvcc (__CUDACC__) it maps to CUDA and CUB; under the host compiler it maps to the
// emulated GPU (simt/emulator.h), which runs each CUDA thread as a fiber and checks what a GPU
// does not (see phasor/emulator.h). A kernel source `cuda/<op>/<name>.cu` includes only this
// header and phasor's plain-data headers, and wraps everything in
//   namespace phasor::PHASOR_BACKEND::<op> { ... }
// so that its two compilations (phasor_add_kernels in cuda/CMakeLists.txt) link side by side as
// phasor::cuda::<op>::... and phasor::emulated::<op>::....
//
// Rules for kernel code, so that both compilations mean the same thing:
//  - CUDA's builtins threadIdx, blockIdx, blockDim, gridDim; the functions of phasor::simt below
//    instead of CUDA's intrinsics and CUB (simt::syncthreads(), simt::shfl_sync, simt::BlockScan).
//  - Global memory only through simt::load / simt::store (TensorView) and simt::Span (workspace).
//  - Shared memory only through PHASOR_SHARED_ARRAY / PHASOR_DYNAMIC_SHARED (element-checked) and
//    PHASOR_SHARED_STORAGE (a primitive's TempStorage). Read an element into a named value with
//    its type (`float v = tile[i];`), not `auto`: on the emulator `tile[i]` is a checked proxy
//    that records the read or write when it happens, and a proxy kept in a variable does not
//    compile there (it is usable only as a temporary).
//  - Kernel arguments by value, trivially copyable (checked on both sides).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/element_access.h"
#include "phasor/common.h"
#include "phasor/device.h"
#include "simt/types.h"

#define PHASOR_SIMT_CONCAT_(a, b) a##b
#define PHASOR_SIMT_CONCAT(a, b) PHASOR_SIMT_CONCAT_(a, b)

#if defined(__CUDACC__)
#define PHASOR_SIMT_CUDA 1
#define PHASOR_BACKEND cuda
#define PHASOR_GLOBAL __global__
// After PHASOR_GLOBAL void: the most threads a block of the kernel has, so that ptxas fits its
// registers (65536 per SM / threads) instead of failing the launch.
#define PHASOR_LAUNCH_BOUNDS(threads) __launch_bounds__(threads, 1)
// Before a loop with a constant trip count: unrolled on the GPU (so that arrays it indexes stay
// in registers); nothing on the host.
#define PHASOR_UNROLL _Pragma("unroll")
// Before a loop that must stay a loop on the GPU (its body indexes memory, not register arrays):
// unrolling it would hold every iteration's temporaries in registers at once.
#define PHASOR_NO_UNROLL _Pragma("unroll 1")
#define PHASOR_DEVICE __device__ __forceinline__
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cub/warp/warp_scan.cuh>
#else
#define PHASOR_SIMT_EMULATED 1
#define PHASOR_BACKEND emulated
#define PHASOR_GLOBAL
#define PHASOR_LAUNCH_BOUNDS(threads)
#define PHASOR_UNROLL
#define PHASOR_NO_UNROLL
#define PHASOR_DEVICE inline
#include "simt/emulator.h"
#endif

namespace phasor::simt {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Reduction / scan operators usable on both sides.
struct Plus {
  template <class T>
  PHASOR_HOST_DEVICE T operator()(const T& a, const T& b) const {
    return a + b;
  }
};
struct Maximum {
  template <class T>
  PHASOR_HOST_DEVICE T operator()(const T& a, const T& b) const {
    return a < b ? b : a;
  }
};
struct Minimum {
  template <class T>
  PHASOR_HOST_DEVICE T operator()(const T& a, const T& b) const {
    return b < a ? b : a;
  }
};

// A typed workspace buffer in global memory (simt::Workspace::span). Indexing is bounds-checked
// on the emulator.
template <class T>
struct Span {
  T* data = nullptr;
  std::int64_t size = 0;

  PHASOR_HOST_DEVICE T& operator[](std::int64_t i) const {
#if defined(PHASOR_SIMT_EMULATED)
    if ((i < 0 || i >= size) && detail::checking_bounds()) detail::span_out_of_bounds(i, size);
#endif
    return data[i];
  }
};

// --- global memory accessors ---------------------------------------------------------------------
namespace detail {
template <bool kWrite, class... I>
PHASOR_DEVICE std::int64_t offset_of(const TensorView& x, I... idx) {
  static_assert(sizeof...(I) >= 1 && sizeof...(I) <= TensorView::kMaxRank,
                "simt::load / store: 1 to 4 indices");
  static_assert((std::is_integral_v<I> && ...), "simt::load / store: indices must be integers");
  const std::int64_t i[] = {static_cast<std::int64_t>(idx)...};
#if defined(PHASOR_SIMT_EMULATED)
  if (checking_bounds()) check_global_access(x, i, static_cast<int>(sizeof...(I)), kWrite);
#endif
  std::int64_t offset = 0;
  for (int d = 0; d < static_cast<int>(sizeof...(I)); ++d) offset += i[d] * x.stride(d);
  return offset;
}
}  // namespace detail

// x[idx...] converted to C (float or double) from x's dtype (bfloat16 / float16 through
// phasor/half.h; int32 / int64 converted as numbers).
template <class C, class... I>
PHASOR_DEVICE C load(const TensorView& x, I... idx) {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, double>,
                "simt::load<C>: C is float or double");
  const std::int64_t o = detail::offset_of<false>(x, idx...);
  switch (x.dtype) {
    case DType::float32:
      return static_cast<C>(static_cast<const float*>(x.data)[o]);
    case DType::float64:
      return static_cast<C>(static_cast<const double*>(x.data)[o]);
    case DType::bfloat16:
      return static_cast<C>(static_cast<const bfloat16*>(x.data)[o].to_float());
    case DType::float16:
      return static_cast<C>(static_cast<const float16*>(x.data)[o].to_float());
    case DType::int32:
      return static_cast<C>(static_cast<const std::int32_t*>(x.data)[o]);
    case DType::int64:
      return static_cast<C>(static_cast<const std::int64_t*>(x.data)[o]);
  }
  return C(0);
}

// An index tensor's element (int32 or int64) as int64, e.g. cu_seqlens.
template <class... I>
PHASOR_DEVICE std::int64_t load_index(const TensorView& x, I... idx) {
#if defined(PHASOR_SIMT_EMULATED)
  if (detail::checking_bounds()) detail::check_index_dtype(x);
#endif
  const std::int64_t o = detail::offset_of<false>(x, idx...);
  if (x.dtype == DType::int32) return static_cast<const std::int32_t*>(x.data)[o];
  return static_cast<const std::int64_t*>(x.data)[o];
}

// x[idx...] = value, rounded to x's dtype (bfloat16 / float16: from_float(float(value))).
template <class C, class... I>
PHASOR_DEVICE void store(const TensorView& x, C value, I... idx) {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, double>,
                "simt::store: the value is float or double");
  const std::int64_t o = detail::offset_of<true>(x, idx...);
  switch (x.dtype) {
    case DType::float32:
      static_cast<float*>(x.data)[o] = static_cast<float>(value);
      return;
    case DType::float64:
      static_cast<double*>(x.data)[o] = static_cast<double>(value);
      return;
    case DType::bfloat16:
      static_cast<bfloat16*>(x.data)[o] = bfloat16::from_float(static_cast<float>(value));
      return;
    case DType::float16:
      static_cast<float16*>(x.data)[o] = float16::from_float(static_cast<float>(value));
      return;
    case DType::int32:
      static_cast<std::int32_t*>(x.data)[o] = static_cast<std::int32_t>(value);
      return;
    case DType::int64:
      static_cast<std::int64_t*>(x.data)[o] = static_cast<std::int64_t>(value);
      return;
  }
}

// --- 16-byte vector loads -----------------------------------------------------------------------
// A tile loader that reads one element per load waits for memory once per element and spends most
// of its instructions on index arithmetic (Nsight Compute on the H200, 2026-11-28: 70 % of the
// scans' executed instructions were integer, half of their stalls on the loads). Where a view
// allows it, the loaders of cuda/common/fill.h read 16 bytes a load instead.

// 16 bytes of elements of type T (bfloat16, float16, float or double), the unit of load_vector.
template <class T>
struct alignas(16) Vector16 {
  static_assert(is_floating(dtype_of<T>()), "simt::Vector16: bfloat16, float16, float or double");
  static constexpr int kCount = static_cast<int>(16 / sizeof(T));
  T x[kCount];
};

// Whether load_vector<T> may read x at any index whose last index is a multiple of
// Vector16<T>::kCount: x has T's dtype, its last dimension is contiguous, every other stride is a
// multiple of kCount and its data 16-byte aligned (so every such element starts 16 aligned bytes).
template <class T>
PHASOR_HOST_DEVICE bool vector_loadable(const TensorView& x) {
  constexpr int n = Vector16<T>::kCount;
  if (!x.defined() || x.rank < 1 || x.dtype != dtype_of<T>() || x.data == nullptr ||
      reinterpret_cast<std::uintptr_t>(x.data) % 16 != 0)
    return false;
  bool ok = true;
  // Over every possible dimension, so that the strides are read at constant indices (a runtime
  // index would put the kernel's view in local memory).
  for (int d = 0; d < TensorView::kMaxRank; ++d) {
    const std::int64_t stride = x.stride(d);
    if (d + 1 == x.rank) ok = ok && stride == 1;
    if (d + 1 < x.rank) ok = ok && stride % n == 0;
  }
  return ok;
}

// x[idx..., last .. last + kCount) as one 16-byte load, in a view for which vector_loadable<T>
// holds, with the last index a multiple of kCount and the whole vector inside x's last dimension
// (the emulator checks all three).
template <class T, class... I>
PHASOR_DEVICE Vector16<T> load_vector(const TensorView& x, I... idx) {
  const std::int64_t o = detail::offset_of<false>(x, idx...);
  const T* at = static_cast<const T*>(x.data) + o;
#if defined(PHASOR_SIMT_EMULATED)
  if (detail::checking_bounds()) {
    const std::int64_t i[] = {static_cast<std::int64_t>(idx)...};
    detail::check_vector_access(x, i, static_cast<int>(sizeof...(I)), dtype_of<T>(),
                                Vector16<T>::kCount, vector_loadable<T>(x), false);
  }
  Vector16<T> v;
  std::memcpy(static_cast<void*>(&v), static_cast<const void*>(at), sizeof(v));
  return v;
#else
  return *reinterpret_cast<const Vector16<T>*>(at);
#endif
}

// x[idx..., last .. last + kCount) = v as one 16-byte store, under load_vector's conditions.
template <class T, class... I>
PHASOR_DEVICE void store_vector(const TensorView& x, const Vector16<T>& v, I... idx) {
  const std::int64_t o = detail::offset_of<true>(x, idx...);
  T* at = static_cast<T*>(x.data) + o;
#if defined(PHASOR_SIMT_EMULATED)
  if (detail::checking_bounds()) {
    const std::int64_t i[] = {static_cast<std::int64_t>(idx)...};
    detail::check_vector_access(x, i, static_cast<int>(sizeof...(I)), dtype_of<T>(),
                                Vector16<T>::kCount, vector_loadable<T>(x), true);
  }
  std::memcpy(static_cast<void*>(at), static_cast<const void*>(&v), sizeof(v));
#else
  *reinterpret_cast<Vector16<T>*>(at) = v;  // one st.global.v4, as load_vector's load
#endif
}

}  // namespace phasor::simt

#if defined(PHASOR_SIMT_CUDA)
// =================================================================================================
// GPU: CUDA and CUB
// =================================================================================================
namespace phasor::simt {

PHASOR_DEVICE unsigned lane_id() {
  unsigned lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}
PHASOR_DEVICE unsigned warp_id() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) / kWarpSize;
}

PHASOR_DEVICE void syncthreads() {
  __syncthreads();
}
PHASOR_DEVICE int syncthreads_count(int predicate) {
  return __syncthreads_count(predicate);
}
PHASOR_DEVICE int syncthreads_and(int predicate) {
  return __syncthreads_and(predicate);
}
PHASOR_DEVICE int syncthreads_or(int predicate) {
  return __syncthreads_or(predicate);
}
PHASOR_DEVICE void syncwarp(unsigned mask = kFullMask) {
  __syncwarp(mask);
}
PHASOR_DEVICE void threadfence() {
  __threadfence();
}

namespace detail {
// Shuffles any trivially copyable value as 32-bit words (what __shfl_sync does for 64-bit types).
template <class T, class Shuffle>
PHASOR_DEVICE T shuffle_words(const T& value, Shuffle shuffle) {
  static_assert(std::is_trivially_copyable_v<T>, "shuffled values must be trivially copyable");
  constexpr int kWords = (sizeof(T) + 3) / 4;
  unsigned words[kWords] = {};
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int w = 0; w < kWords; ++w) words[w] = shuffle(words[w]);
  T result;
  memcpy(&result, words, sizeof(T));
  return result;
}
}  // namespace detail

template <class T>
PHASOR_DEVICE T shfl_sync(unsigned mask, const T& value, int src_lane, int width = kWarpSize) {
  return detail::shuffle_words(value,
                               [&](unsigned w) { return __shfl_sync(mask, w, src_lane, width); });
}
template <class T>
PHASOR_DEVICE T shfl_up_sync(unsigned mask, const T& value, unsigned delta, int width = kWarpSize) {
  return detail::shuffle_words(value,
                               [&](unsigned w) { return __shfl_up_sync(mask, w, delta, width); });
}
template <class T>
PHASOR_DEVICE T shfl_down_sync(unsigned mask, const T& value, unsigned delta,
                               int width = kWarpSize) {
  return detail::shuffle_words(value,
                               [&](unsigned w) { return __shfl_down_sync(mask, w, delta, width); });
}
template <class T>
PHASOR_DEVICE T shfl_xor_sync(unsigned mask, const T& value, int lane_mask, int width = kWarpSize) {
  return detail::shuffle_words(
      value, [&](unsigned w) { return __shfl_xor_sync(mask, w, lane_mask, width); });
}
PHASOR_DEVICE unsigned ballot_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate);
}
PHASOR_DEVICE int all_sync(unsigned mask, int predicate) {
  return __all_sync(mask, predicate);
}
PHASOR_DEVICE int any_sync(unsigned mask, int predicate) {
  return __any_sync(mask, predicate);
}

PHASOR_DEVICE int atomic_add(int* address, int value) {
  return atomicAdd(address, value);
}
PHASOR_DEVICE unsigned atomic_add(unsigned* address, unsigned value) {
  return atomicAdd(address, value);
}
PHASOR_DEVICE unsigned long long atomic_add(unsigned long long* address, unsigned long long value) {
  return atomicAdd(address, value);
}
PHASOR_DEVICE float atomic_add(float* address, float value) {
  return atomicAdd(address, value);
}
PHASOR_DEVICE double atomic_add(double* address, double value) {
  return atomicAdd(address, value);
}
PHASOR_DEVICE int atomic_max(int* address, int value) {
  return atomicMax(address, value);
}
PHASOR_DEVICE int atomic_min(int* address, int value) {
  return atomicMin(address, value);
}
PHASOR_DEVICE int atomic_cas(int* address, int compare, int value) {
  return atomicCAS(address, compare, value);
}
PHASOR_DEVICE unsigned long long atomic_cas(unsigned long long* address, unsigned long long compare,
                                            unsigned long long value) {
  return atomicCAS(address, compare, value);
}

// Math: CUDA's functions (e.g. expf: within 2 ulp, not correctly rounded like the host's).
PHASOR_DEVICE float exp(float x) {
  return ::expf(x);
}
PHASOR_DEVICE double exp(double x) {
  return ::exp(x);
}
PHASOR_DEVICE float log(float x) {
  return ::logf(x);
}
PHASOR_DEVICE double log(double x) {
  return ::log(x);
}
PHASOR_DEVICE float log1p(float x) {
  return ::log1pf(x);
}
PHASOR_DEVICE double log1p(double x) {
  return ::log1p(x);
}
PHASOR_DEVICE float expm1(float x) {
  return ::expm1f(x);
}
PHASOR_DEVICE double expm1(double x) {
  return ::expm1(x);
}
PHASOR_DEVICE float sqrt(float x) {
  return ::sqrtf(x);
}
PHASOR_DEVICE double sqrt(double x) {
  return ::sqrt(x);
}
PHASOR_DEVICE float rsqrt(float x) {
  return ::rsqrtf(x);
}
PHASOR_DEVICE double rsqrt(double x) {
  return ::rsqrt(x);
}
PHASOR_DEVICE float sin(float x) {
  return ::sinf(x);
}
PHASOR_DEVICE double sin(double x) {
  return ::sin(x);
}
PHASOR_DEVICE float cos(float x) {
  return ::cosf(x);
}
PHASOR_DEVICE double cos(double x) {
  return ::cos(x);
}
PHASOR_DEVICE void sincos(float x, float* s, float* c) {
  ::sincosf(x, s, c);
}
PHASOR_DEVICE void sincos(double x, double* s, double* c) {
  ::sincos(x, s, c);
}
PHASOR_DEVICE float fabs(float x) {
  return ::fabsf(x);
}
PHASOR_DEVICE double fabs(double x) {
  return ::fabs(x);
}
PHASOR_DEVICE float fmax(float a, float b) {
  return ::fmaxf(a, b);
}
PHASOR_DEVICE double fmax(double a, double b) {
  return ::fmax(a, b);
}
PHASOR_DEVICE float fmin(float a, float b) {
  return ::fminf(a, b);
}
PHASOR_DEVICE double fmin(double a, double b) {
  return ::fmin(a, b);
}
PHASOR_DEVICE float fma(float a, float b, float c) {
  return ::fmaf(a, b, c);
}
PHASOR_DEVICE double fma(double a, double b, double c) {
  return ::fma(a, b, c);
}
PHASOR_DEVICE bool isfinite(float x) {
  return ::isfinite(x);
}
PHASOR_DEVICE bool isfinite(double x) {
  return ::isfinite(x);
}
PHASOR_DEVICE bool isnan(float x) {
  return ::isnan(x);
}
PHASOR_DEVICE bool isnan(double x) {
  return ::isnan(x);
}

// A block-shared array: __shared__ storage behind a wrapper that costs nothing once inlined.
template <class T>
class SharedArray {
 public:
  PHASOR_DEVICE SharedArray(T* data, int size) : data_(data), size_(size) {}
  PHASOR_DEVICE T& operator[](std::int64_t i) const { return data_[i]; }
  PHASOR_DEVICE int size() const { return size_; }
  // The elements [offset, offset + count) as an array of their own.
  PHASOR_DEVICE SharedArray view(std::int64_t offset, int count) const {
    return SharedArray(data_ + offset, count);
  }

 private:
  T* data_;
  int size_;
};

namespace detail {
PHASOR_DEVICE unsigned dynamic_shared_bytes() {
  unsigned bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}
template <class T>
PHASOR_DEVICE SharedArray<T> dynamic_view(unsigned char* base, std::size_t byte_offset, int count) {
  if (count < 0) count = static_cast<int>((dynamic_shared_bytes() - byte_offset) / sizeof(T));
  return SharedArray<T>(reinterpret_cast<T*>(base + byte_offset), count);
}
}  // namespace detail

// Storage is declared as bytes so that element types with constructors (bfloat16) are allowed.
#define PHASOR_SHARED_ARRAY(T, name, N)                                                     \
  static_assert((N) > 0, "PHASOR_SHARED_ARRAY: the size must be a positive constant");      \
  __shared__ __align__(alignof(T)) unsigned char PHASOR_SIMT_CONCAT(phasor_shared_,         \
                                                                    name)[sizeof(T) * (N)]; \
  const ::phasor::simt::SharedArray<T> name(                                                \
      reinterpret_cast<T*>(PHASOR_SIMT_CONCAT(phasor_shared_, name)), (N))
#define PHASOR_DYNAMIC_SHARED_AT(T, name, byte_offset, count)            \
  extern __shared__ __align__(16) unsigned char phasor_dynamic_shared[]; \
  const ::phasor::simt::SharedArray<T> name =                            \
      ::phasor::simt::detail::dynamic_view<T>(phasor_dynamic_shared, (byte_offset), (count))
#define PHASOR_SHARED_STORAGE(T, name)                                                \
  __shared__ __align__(alignof(T)) unsigned char PHASOR_SIMT_CONCAT(phasor_storage_,  \
                                                                    name)[sizeof(T)]; \
  T& name = *reinterpret_cast<T*>(PHASOR_SIMT_CONCAT(phasor_storage_, name))

// --- CUB primitives ------------------------------------------------------------------------------
template <class T, int BLOCK_THREADS>
class BlockReduce {
  using Cub = cub::BlockReduce<T, BLOCK_THREADS>;

 public:
  using TempStorage = typename Cub::TempStorage;
  PHASOR_DEVICE explicit BlockReduce(TempStorage& storage) : cub_(storage) {}
  PHASOR_DEVICE T Sum(T x) { return cub_.Sum(x); }
  PHASOR_DEVICE T Sum(T x, int num_valid) { return cub_.Sum(x, num_valid); }
  template <int N>
  PHASOR_DEVICE T Sum(T (&items)[N]) {
    return cub_.Sum(items);
  }
  template <class Op>
  PHASOR_DEVICE T Reduce(T x, Op op) {
    return cub_.Reduce(x, op);
  }
  template <class Op>
  PHASOR_DEVICE T Reduce(T x, Op op, int num_valid) {
    return cub_.Reduce(x, op, num_valid);
  }
  template <int N, class Op>
  PHASOR_DEVICE T Reduce(T (&items)[N], Op op) {
    return cub_.Reduce(items, op);
  }

 private:
  Cub cub_;
};

template <class T, int BLOCK_THREADS>
class BlockScan {
  using Cub = cub::BlockScan<T, BLOCK_THREADS>;

 public:
  using TempStorage = typename Cub::TempStorage;
  PHASOR_DEVICE explicit BlockScan(TempStorage& storage) : cub_(storage) {}

  PHASOR_DEVICE void InclusiveSum(T x, T& out) { cub_.InclusiveSum(x, out); }
  PHASOR_DEVICE void InclusiveSum(T x, T& out, T& aggregate) {
    cub_.InclusiveSum(x, out, aggregate);
  }
  template <class Callback>
  PHASOR_DEVICE void InclusiveSum(T x, T& out, Callback& prefix) {
    cub_.InclusiveSum(x, out, prefix);
  }
  PHASOR_DEVICE void ExclusiveSum(T x, T& out) { cub_.ExclusiveSum(x, out); }
  PHASOR_DEVICE void ExclusiveSum(T x, T& out, T& aggregate) {
    cub_.ExclusiveSum(x, out, aggregate);
  }
  template <class Callback>
  PHASOR_DEVICE void ExclusiveSum(T x, T& out, Callback& prefix) {
    cub_.ExclusiveSum(x, out, prefix);
  }
  template <class Op>
  PHASOR_DEVICE void InclusiveScan(T x, T& out, Op op) {
    cub_.InclusiveScan(x, out, op);
  }
  template <class Op>
  PHASOR_DEVICE void InclusiveScan(T x, T& out, Op op, T& aggregate) {
    cub_.InclusiveScan(x, out, op, aggregate);
  }
  template <class Op, class Callback>
  PHASOR_DEVICE void InclusiveScan(T x, T& out, Op op, Callback& prefix) {
    cub_.InclusiveScan(x, out, op, prefix);
  }
  template <class Op>
  PHASOR_DEVICE void ExclusiveScan(T x, T& out, T init, Op op) {
    cub_.ExclusiveScan(x, out, init, op);
  }
  template <class Op, class Callback>
  PHASOR_DEVICE void ExclusiveScan(T x, T& out, Op op, Callback& prefix) {
    cub_.ExclusiveScan(x, out, op, prefix);
  }
  // ITEMS_PER_THREAD: thread i holds items [i·N, i·N + N) of the tile.
  template <int N>
  PHASOR_DEVICE void InclusiveSum(T (&in)[N], T (&out)[N]) {
    cub_.InclusiveSum(in, out);
  }
  template <int N, class Callback>
  PHASOR_DEVICE void InclusiveSum(T (&in)[N], T (&out)[N], Callback& prefix) {
    cub_.InclusiveSum(in, out, prefix);
  }
  template <int N>
  PHASOR_DEVICE void ExclusiveSum(T (&in)[N], T (&out)[N]) {
    cub_.ExclusiveSum(in, out);
  }
  template <int N, class Callback>
  PHASOR_DEVICE void ExclusiveSum(T (&in)[N], T (&out)[N], Callback& prefix) {
    cub_.ExclusiveSum(in, out, prefix);
  }
  template <int N, class Op>
  PHASOR_DEVICE void InclusiveScan(T (&in)[N], T (&out)[N], Op op) {
    cub_.InclusiveScan(in, out, op);
  }
  template <int N, class Op>
  PHASOR_DEVICE void ExclusiveScan(T (&in)[N], T (&out)[N], T init, Op op) {
    cub_.ExclusiveScan(in, out, init, op);
  }

 private:
  Cub cub_;
};

template <class T, int LOGICAL_WARP_THREADS = kWarpSize>
class WarpReduce {
  using Cub = cub::WarpReduce<T, LOGICAL_WARP_THREADS>;

 public:
  using TempStorage = typename Cub::TempStorage;
  PHASOR_DEVICE explicit WarpReduce(TempStorage& storage) : cub_(storage) {}
  PHASOR_DEVICE T Sum(T x) { return cub_.Sum(x); }
  PHASOR_DEVICE T Sum(T x, int valid_items) { return cub_.Sum(x, valid_items); }
  template <class Op>
  PHASOR_DEVICE T Reduce(T x, Op op) {
    return cub_.Reduce(x, op);
  }
  template <class Op>
  PHASOR_DEVICE T Reduce(T x, Op op, int valid_items) {
    return cub_.Reduce(x, op, valid_items);
  }

 private:
  Cub cub_;
};

template <class T, int LOGICAL_WARP_THREADS = kWarpSize>
class WarpScan {
  using Cub = cub::WarpScan<T, LOGICAL_WARP_THREADS>;

 public:
  using TempStorage = typename Cub::TempStorage;
  PHASOR_DEVICE explicit WarpScan(TempStorage& storage) : cub_(storage) {}
  PHASOR_DEVICE void InclusiveSum(T x, T& out) { cub_.InclusiveSum(x, out); }
  PHASOR_DEVICE void InclusiveSum(T x, T& out, T& aggregate) {
    cub_.InclusiveSum(x, out, aggregate);
  }
  PHASOR_DEVICE void ExclusiveSum(T x, T& out) { cub_.ExclusiveSum(x, out); }
  PHASOR_DEVICE void ExclusiveSum(T x, T& out, T& aggregate) {
    cub_.ExclusiveSum(x, out, aggregate);
  }
  template <class Op>
  PHASOR_DEVICE void InclusiveScan(T x, T& out, Op op) {
    cub_.InclusiveScan(x, out, op);
  }
  template <class Op>
  PHASOR_DEVICE void InclusiveScan(T x, T& out, Op op, T& aggregate) {
    cub_.InclusiveScan(x, out, op, aggregate);
  }
  // Lane 0's output is undefined (CUB), as on the emulator, which poisons it.
  template <class Op>
  PHASOR_DEVICE void ExclusiveScan(T x, T& out, Op op) {
    cub_.ExclusiveScan(x, out, op);
  }
  template <class Op>
  PHASOR_DEVICE void ExclusiveScan(T x, T& out, T init, Op op) {
    cub_.ExclusiveScan(x, out, init, op);
  }

 private:
  Cub cub_;
};

// --- launch --------------------------------------------------------------------------------------
namespace detail {
inline void check_cuda(cudaError_t status, const char* kernel, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string("kernel '") + kernel + "': " + what + ": " +
                cudaGetErrorString(status));
}

template <class... Params, class... Args>
void launch(const char* name, Dim3 grid, Dim3 block, std::size_t dynamic_shared_bytes,
            cuda::Stream stream, void (*kernel)(Params...), Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "PHASOR_LAUNCH: wrong number of arguments");
  static_assert(((std::is_trivially_copyable_v<Params> && !std::is_reference_v<Params>)&&...),
                "PHASOR_LAUNCH: kernel arguments are passed by value and must be trivially "
                "copyable");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // an empty grid: see PHASOR_LAUNCH
  // Above 48 KiB, dynamic shared memory must be opted into per kernel.
  if (dynamic_shared_bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(dynamic_shared_bytes)),
               name, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  kernel<<<dim3(grid.x, grid.y, grid.z), dim3(block.x, block.y, block.z), dynamic_shared_bytes,
           static_cast<cudaStream_t>(stream)>>>(static_cast<Params>(std::forward<Args>(args))...);
  check_cuda(cudaGetLastError(), name, "launch");
}

inline void* workspace_allocate(std::size_t bytes, cuda::Stream stream) {
  const cuda::Allocator allocator = cuda::get_allocator();
  void* ptr = allocator.allocate(bytes, stream, allocator.context);
  if (ptr == nullptr)
    throw Error("simt::Workspace: the allocator returned no memory for " + std::to_string(bytes) +
                " bytes");
  return ptr;
}
inline void workspace_free(void* ptr, std::size_t bytes, cuda::Stream stream) noexcept {
  const cuda::Allocator allocator = cuda::get_allocator();
  allocator.deallocate(ptr, bytes, stream, allocator.context);
}
}  // namespace detail

inline void copy_to_host(void* dst, const void* src, std::size_t bytes, cuda::Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  detail::check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy_to_host",
                     "cudaMemcpyAsync");
  detail::check_cuda(cudaStreamSynchronize(s), "copy_to_host", "cudaStreamSynchronize");
}
inline void memset_async(void* dst, int value, std::size_t bytes, cuda::Stream stream) {
  detail::check_cuda(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)),
                     "memset_async", "cudaMemsetAsync");
}

}  // namespace phasor::simt

#else
// =================================================================================================
// Emulated GPU
// =================================================================================================

// CUDA's builtins read the running fiber's state.
#define threadIdx (::phasor::simt::detail::current("threadIdx").thread_idx)
#define blockIdx (::phasor::simt::detail::current("blockIdx").block_idx)
#define blockDim (::phasor::simt::detail::current("blockDim").block_dim)
#define gridDim (::phasor::simt::detail::current("gridDim").grid_dim)

namespace phasor::simt {

inline unsigned lane_id() {
  return detail::current("simt::lane_id").lane;
}
inline unsigned warp_id() {
  return detail::current("simt::warp_id").warp;
}

// The source position of each synchronisation call is recorded for the messages (GCC and Clang
// evaluate __builtin_FILE / __builtin_LINE in a default argument at the call site).
inline void syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  detail::BlockCall call{"syncthreads"};
  call.file = file;
  call.line = line;
  detail::block_call(call);
}

namespace detail {
// syncthreads_count / and / or: the predicates of all threads, combined in thread order.
template <int kMode>  // 0: count, 1: and, 2: or
void combine_predicates(const void* const* in, void* const* out, int count, const void*) {
  int result = kMode == 1 ? 1 : 0;
  for (int i = 0; i < count; ++i) {
    const int p = *static_cast<const int*>(in[i]) != 0;
    if (kMode == 0) result += p;
    if (kMode == 1) result = result && p;
    if (kMode == 2) result = result || p;
  }
  for (int i = 0; i < count; ++i) *static_cast<int*>(out[i]) = result;
}
template <int kMode>
int syncthreads_predicate(const char* name, int predicate, const char* file, int line) {
  int result = 0;
  BlockCall call{name};
  call.input = &predicate;
  call.output = &result;
  call.compute = &combine_predicates<kMode>;
  call.file = file;
  call.line = line;
  block_call(call);
  return result;
}
}  // namespace detail

inline int syncthreads_count(int predicate, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  return detail::syncthreads_predicate<0>("syncthreads_count", predicate, file, line);
}
inline int syncthreads_and(int predicate, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
  return detail::syncthreads_predicate<1>("syncthreads_and", predicate, file, line);
}
inline int syncthreads_or(int predicate, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  return detail::syncthreads_predicate<2>("syncthreads_or", predicate, file, line);
}

inline void syncwarp(unsigned mask = kFullMask, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  detail::WarpCall call{detail::WarpOp::syncwarp, mask};
  call.name = "syncwarp";
  call.file = file;
  call.line = line;
  detail::warp_call(call);
}

// Blocks of one launch may run on several OS threads (Options::parallel_blocks).
inline void threadfence() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

namespace detail {
template <class T>
T shuffle(WarpOp op, const char* name, unsigned mask, const T& value, int lane_arg, int width,
          const char* file, int line) {
  static_assert(std::is_trivially_copyable_v<T>, "shuffled values must be trivially copyable");
  T result;
  WarpCall call{op, mask};
  call.width = width;
  call.lane_arg = lane_arg;
  call.input = &value;
  call.output = &result;
  call.size = sizeof(T);
  call.name = name;
  call.file = file;
  call.line = line;
  warp_call(call);
  return result;
}
template <class T>
T vote(WarpOp op, const char* name, unsigned mask, int predicate, const char* file, int line) {
  T result;
  WarpCall call{op, mask};
  call.input = &predicate;
  call.output = &result;
  call.name = name;
  call.file = file;
  call.line = line;
  warp_call(call);
  return result;
}
}  // namespace detail

template <class T>
T shfl_sync(unsigned mask, const T& value, int src_lane, int width = kWarpSize,
            const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shuffle(detail::WarpOp::shfl_idx, "shfl_sync", mask, value, src_lane, width, file,
                         line);
}
template <class T>
T shfl_up_sync(unsigned mask, const T& value, unsigned delta, int width = kWarpSize,
               const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shuffle(detail::WarpOp::shfl_up, "shfl_up_sync", mask, value,
                         static_cast<int>(delta), width, file, line);
}
template <class T>
T shfl_down_sync(unsigned mask, const T& value, unsigned delta, int width = kWarpSize,
                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shuffle(detail::WarpOp::shfl_down, "shfl_down_sync", mask, value,
                         static_cast<int>(delta), width, file, line);
}
template <class T>
T shfl_xor_sync(unsigned mask, const T& value, int lane_mask, int width = kWarpSize,
                const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shuffle(detail::WarpOp::shfl_xor, "shfl_xor_sync", mask, value, lane_mask, width,
                         file, line);
}
inline unsigned ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return detail::vote<unsigned>(detail::WarpOp::ballot, "ballot_sync", mask, predicate, file, line);
}
inline int all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
  return detail::vote<int>(detail::WarpOp::all, "all_sync", mask, predicate, file, line);
}
inline int any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
  return detail::vote<int>(detail::WarpOp::any, "any_sync", mask, predicate, file, line);
}

// --- shared memory -------------------------------------------------------------------------------
template <class T>
class SharedPointer;

// One element of a shared array, as a temporary: reading converts to T, assigning writes; each is
// checked and recorded when it happens. Usable only as a temporary (the operators are
// &&-qualified), so `auto v = tile[i];` followed by a use of v does not compile.
template <class T>
class SharedRef {
 public:
  SharedRef(const detail::Allocation* allocation, std::size_t byte_offset, std::int64_t index,
            std::int64_t size)
      : allocation_(allocation), byte_offset_(byte_offset), index_(index), size_(size) {}

  operator T() && {
    detail::shared_read(allocation_, byte_offset_, sizeof(T));
    T value;
    std::memcpy(&value, address(), sizeof(T));
    return value;
  }
  SharedRef&& operator=(const T& value) && {
    detail::shared_write(allocation_, byte_offset_, sizeof(T));
    std::memcpy(address(), &value, sizeof(T));
    return std::move(*this);
  }
  SharedRef&& operator=(SharedRef&& other) && {
    return std::move(*this) = static_cast<T>(std::move(other));
  }
  SharedRef(const SharedRef&) = default;
  SharedRef& operator=(const SharedRef&) = delete;

  SharedRef&& operator+=(const T& v) && { return std::move(*this) = read() + v; }
  SharedRef&& operator-=(const T& v) && { return std::move(*this) = read() - v; }
  SharedRef&& operator*=(const T& v) && { return std::move(*this) = read() * v; }
  SharedRef&& operator/=(const T& v) && { return std::move(*this) = read() / v; }
  SharedRef&& operator%=(const T& v) && { return std::move(*this) = read() % v; }
  SharedRef&& operator&=(const T& v) && { return std::move(*this) = read() & v; }
  SharedRef&& operator|=(const T& v) && { return std::move(*this) = read() | v; }
  SharedRef&& operator^=(const T& v) && { return std::move(*this) = read() ^ v; }
  SharedRef&& operator<<=(int v) && { return std::move(*this) = read() << v; }
  SharedRef&& operator>>=(int v) && { return std::move(*this) = read() >> v; }
  SharedRef&& operator++() && { return std::move(*this) = read() + T(1); }
  SharedRef&& operator--() && { return std::move(*this) = read() - T(1); }
  T operator++(int) && {
    const T old = read();
    std::move(*this) = old + T(1);
    return old;
  }
  T operator--(int) && {
    const T old = read();
    std::move(*this) = old - T(1);
    return old;
  }
  // &tile[i]: a checked pointer (for atomics, or to walk a row).
  SharedPointer<T> operator&() const&&;

  // For the atomics: the element's raw address after the atomic access was checked.
  T* atomic_address() const {
    detail::shared_atomic(allocation_, byte_offset_, sizeof(T));
    return static_cast<T*>(address());
  }

 private:
  template <class>
  friend class SharedPointer;
  void* address() const { return detail::allocation_data(allocation_) + byte_offset_; }
  T read() const {
    detail::shared_read(allocation_, byte_offset_, sizeof(T));
    T value;
    std::memcpy(&value, address(), sizeof(T));
    return value;
  }

  const detail::Allocation* allocation_;
  std::size_t byte_offset_;  // in the allocation
  std::int64_t index_;       // in the array (messages)
  std::int64_t size_;
};

// A block-shared array: a handle to the block's allocation for the declaration site. operator[]
// checks the index; the element proxy checks and records each access.
template <class T>
class SharedArray {
 public:
  SharedArray(const detail::Allocation* allocation, std::size_t byte_offset, std::int64_t size)
      : allocation_(allocation), byte_offset_(byte_offset), size_(size) {}
  SharedRef<T> operator[](std::int64_t i) const {
    if ((i < 0 || i >= size_) && detail::checking_bounds())
      detail::shared_out_of_bounds(allocation_, byte_offset_, sizeof(T), i, size_);
    return SharedRef<T>(allocation_, byte_offset_ + static_cast<std::size_t>(i) * sizeof(T), i,
                        size_);
  }
  int size() const { return static_cast<int>(size_); }
  // The elements [offset, offset + count) as an array of their own (bounds-checked against this
  // one; accesses through it are checked and recorded like any other).
  SharedArray view(std::int64_t offset, std::int64_t count) const {
    if ((offset < 0 || count < 0 || offset + count > size_) && detail::checking_bounds())
      detail::shared_out_of_bounds(allocation_, byte_offset_, sizeof(T),
                                   offset < 0 ? offset : offset + count - 1, size_);
    return SharedArray(allocation_, byte_offset_ + static_cast<std::size_t>(offset) * sizeof(T),
                       count);
  }

 private:
  template <class>
  friend class SharedPointer;
  const detail::Allocation* allocation_;
  std::size_t byte_offset_;
  std::int64_t size_;
};

// A pointer into a shared array that keeps the checks: *p, p[i], p + n, p - q.
template <class T>
class SharedPointer {
 public:
  SharedPointer(SharedArray<T> array, std::int64_t index) : array_(array), index_(index) {}
  SharedRef<T> operator*() const { return array_[index_]; }
  SharedRef<T> operator[](std::int64_t i) const { return array_[index_ + i]; }
  SharedPointer operator+(std::int64_t n) const { return SharedPointer(array_, index_ + n); }
  SharedPointer operator-(std::int64_t n) const { return SharedPointer(array_, index_ - n); }
  std::int64_t operator-(const SharedPointer& other) const { return index_ - other.index_; }
  SharedPointer& operator+=(std::int64_t n) {
    index_ += n;
    return *this;
  }
  SharedPointer& operator++() { return *this += 1; }

 private:
  SharedArray<T> array_;
  std::int64_t index_;
};

template <class T>
SharedPointer<T> SharedRef<T>::operator&() const&& {
  const std::size_t base = byte_offset_ - static_cast<std::size_t>(index_) * sizeof(T);
  return SharedPointer<T>(SharedArray<T>(allocation_, base, size_), index_);
}

namespace detail {
template <class T>
constexpr unsigned char poison_byte() {
  // 0xFF bytes are a NaN in float, double, bfloat16 and float16.
  return std::is_floating_point_v<T> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>
             ? 0xFF
             : 0xCD;
}
template <class T>
SharedArray<T> make_shared_array(const SharedSite& site, std::int64_t count) {
  return SharedArray<T>(shared_array(site, sizeof(T), alignof(T), count, poison_byte<T>()), 0,
                        count);
}
template <class T>
SharedArray<T> make_dynamic_view(const SharedSite& site, std::size_t byte_offset,
                                 std::int64_t count) {
  static_assert(sizeof(T) % 2 == 0,
                "PHASOR_DYNAMIC_SHARED: element types of an even size (the emulator tracks "
                "dynamic shared memory in 2-byte units); use PHASOR_SHARED_ARRAY for bytes");
  const Allocation* allocation = dynamic_shared(site, sizeof(T), byte_offset, count);
  return SharedArray<T>(allocation, byte_offset, count);
}
}  // namespace detail

#define PHASOR_SHARED_ARRAY(T, name, N)                                                   \
  static_assert((N) > 0, "PHASOR_SHARED_ARRAY: the size must be a positive constant");    \
  static const ::phasor::simt::detail::SharedSite PHASOR_SIMT_CONCAT(phasor_site_, name){ \
      #name, __FILE__, __LINE__};                                                         \
  const ::phasor::simt::SharedArray<T> name =                                             \
      ::phasor::simt::detail::make_shared_array<T>(PHASOR_SIMT_CONCAT(phasor_site_, name), (N))
#define PHASOR_DYNAMIC_SHARED_AT(T, name, byte_offset, count)                               \
  static const ::phasor::simt::detail::SharedSite PHASOR_SIMT_CONCAT(phasor_site_, name){   \
      #name, __FILE__, __LINE__};                                                           \
  const ::phasor::simt::SharedArray<T> name = ::phasor::simt::detail::make_dynamic_view<T>( \
      PHASOR_SIMT_CONCAT(phasor_site_, name), (byte_offset), (count))
#define PHASOR_SHARED_STORAGE(T, name)                                                    \
  static const ::phasor::simt::detail::SharedSite PHASOR_SIMT_CONCAT(phasor_site_, name){ \
      #name, __FILE__, __LINE__};                                                         \
  T& name = *static_cast<T*>(::phasor::simt::detail::shared_storage(                      \
      PHASOR_SIMT_CONCAT(phasor_site_, name), sizeof(T), alignof(T)))

// --- atomics -------------------------------------------------------------------------------------
namespace detail {
template <class T>
struct identity {
  using type = T;
};
template <class T, class Update>
T atomic_update(T* address, Update update) {
  T old;
  __atomic_load(address, &old, __ATOMIC_SEQ_CST);
  T desired = update(old);
  while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
    desired = update(old);
  return old;
}
template <class T>
T atomic_add(T* address, T value) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
  } else {
    return atomic_update(address, [&](T old) { return old + value; });
  }
}
template <class T>
T atomic_cas(T* address, T compare, T value) {
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;  // the old value either way
}
}  // namespace detail

inline int atomic_add(int* address, int value) {
  return detail::atomic_add(address, value);
}
inline unsigned atomic_add(unsigned* address, unsigned value) {
  return detail::atomic_add(address, value);
}
inline unsigned long long atomic_add(unsigned long long* address, unsigned long long value) {
  return detail::atomic_add(address, value);
}
inline float atomic_add(float* address, float value) {
  return detail::atomic_add(address, value);
}
inline double atomic_add(double* address, double value) {
  return detail::atomic_add(address, value);
}
inline int atomic_max(int* address, int value) {
  return detail::atomic_update(address, [&](int old) { return old < value ? value : old; });
}
inline int atomic_min(int* address, int value) {
  return detail::atomic_update(address, [&](int old) { return value < old ? value : old; });
}
inline int atomic_cas(int* address, int compare, int value) {
  return detail::atomic_cas(address, compare, value);
}
inline unsigned long long atomic_cas(unsigned long long* address, unsigned long long compare,
                                     unsigned long long value) {
  return detail::atomic_cas(address, compare, value);
}
// Atomics on shared memory (&tile[i]): checked as atomic accesses (never a race with each other).
template <class T>
T atomic_add(SharedPointer<T> p, typename detail::identity<T>::type value) {
  return atomic_add((*p).atomic_address(), value);
}
inline int atomic_max(SharedPointer<int> p, int value) {
  return atomic_max((*p).atomic_address(), value);
}
inline int atomic_min(SharedPointer<int> p, int value) {
  return atomic_min((*p).atomic_address(), value);
}
template <class T>
T atomic_cas(SharedPointer<T> p, typename detail::identity<T>::type compare,
             typename detail::identity<T>::type value) {
  return atomic_cas((*p).atomic_address(), compare, value);
}

// --- math (the host's std:: functions) -----------------------------------------------------------
inline float exp(float x) {
  return std::exp(x);
}
inline double exp(double x) {
  return std::exp(x);
}
inline float log(float x) {
  return std::log(x);
}
inline double log(double x) {
  return std::log(x);
}
inline float log1p(float x) {
  return std::log1p(x);
}
inline double log1p(double x) {
  return std::log1p(x);
}
inline float expm1(float x) {
  return std::expm1(x);
}
inline double expm1(double x) {
  return std::expm1(x);
}
inline float sqrt(float x) {
  return std::sqrt(x);
}
inline double sqrt(double x) {
  return std::sqrt(x);
}
inline float rsqrt(float x) {
  return 1.0f / std::sqrt(x);
}
inline double rsqrt(double x) {
  return 1.0 / std::sqrt(x);
}
inline float sin(float x) {
  return std::sin(x);
}
inline double sin(double x) {
  return std::sin(x);
}
inline float cos(float x) {
  return std::cos(x);
}
inline double cos(double x) {
  return std::cos(x);
}
inline void sincos(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline void sincos(double x, double* s, double* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline float fabs(float x) {
  return std::fabs(x);
}
inline double fabs(double x) {
  return std::fabs(x);
}
inline float fmax(float a, float b) {
  return std::fmax(a, b);
}
inline double fmax(double a, double b) {
  return std::fmax(a, b);
}
inline float fmin(float a, float b) {
  return std::fmin(a, b);
}
inline double fmin(double a, double b) {
  return std::fmin(a, b);
}
inline float fma(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline double fma(double a, double b, double c) {
  return std::fma(a, b, c);
}
inline bool isfinite(float x) {
  return std::isfinite(x);
}
inline bool isfinite(double x) {
  return std::isfinite(x);
}
inline bool isnan(float x) {
  return std::isnan(x);
}
inline bool isnan(double x) {
  return std::isnan(x);
}

// --- CUB's primitives, emulated ------------------------------------------------------------------
// Each is one rendezvous of the emulator (so divergence and mask checks apply), computed by the
// scheduler in a fixed order: reductions in CUB's order (a shuffle-down tree within each warp, then
// the warp aggregates from warp 0 up), scans sequentially in thread order. Results that CUB leaves
// undefined are poisoned (NaN, or 0xCD bytes) so that a use of them shows.
namespace detail {
template <class T>
void poison(T& x) {
  if constexpr (std::is_floating_point_v<T>) {
    x = std::numeric_limits<T>::quiet_NaN();
  } else {
    std::memset(static_cast<void*>(&x), 0xCD, sizeof(T));
  }
}

// Lane 0 of a warp's shuffle-down tree over v[0, count): v[i] ⊕= v[i + offset] for offset =
// 1, 2, 4, ... (updating in increasing i reads each v[i + offset] before it changes, as the
// simultaneous shuffles do).
template <class T, class Op>
T tree_reduce(T* v, int count, const Op& op) {
  for (int offset = 1; offset < count; offset *= 2)
    for (int i = 0; i + offset < count; ++i) v[i] = op(v[i], v[i + offset]);
  return v[0];
}

template <class T, class Op>
struct ReduceContext {
  const Op* op;
  int num_valid;
};
// Block reduction: warps of the first num_valid threads by their tree, then warp aggregates in
// order. Thread 0 gets the result, the others poison.
template <class T, class Op>
void block_reduce(const void* const* in, void* const* out, int count, const void* context) {
  const auto& ctx = *static_cast<const ReduceContext<T, Op>*>(context);
  const int valid = ctx.num_valid < count ? ctx.num_valid : count;
  T total{};
  T lanes[kWarpSize];
  for (int base = 0; base < valid; base += kWarpSize) {
    const int n = valid - base < kWarpSize ? valid - base : kWarpSize;
    for (int i = 0; i < n; ++i) lanes[i] = *static_cast<const T*>(in[base + i]);
    const T warp_total = tree_reduce(lanes, n, *ctx.op);
    total = base == 0 ? warp_total : (*ctx.op)(total, warp_total);
  }
  for (int i = 0; i < count; ++i) {
    T& result = *static_cast<T*>(out[i]);
    if (i == 0) {
      result = total;
    } else {
      poison(result);
    }
  }
}

// A scan's raw result for one thread's N items: running ⊕ of all items up to each one, the one
// just before its first item (if any), and the aggregate of the tile.
template <class T, int N>
struct ScanPartial {
  T inclusive[N];
  T before;
  bool has_before;
  T aggregate;
};
template <class T, class Op, int N>
void scan(const void* const* in, void* const* out, int count, const void* context) {
  const Op& op = *static_cast<const Op*>(context);
  T running{};
  bool have = false;
  for (int t = 0; t < count; ++t) {
    const T* items = static_cast<const T*>(in[t]);
    auto& r = *static_cast<ScanPartial<T, N>*>(out[t]);
    r.has_before = have;
    if (have) {
      r.before = running;
    } else {
      poison(r.before);
    }
    for (int k = 0; k < N; ++k) {
      running = have ? op(running, items[k]) : items[k];
      have = true;
      r.inclusive[k] = running;
    }
  }
  for (int t = 0; t < count; ++t) static_cast<ScanPartial<T, N>*>(out[t])->aggregate = running;
}
template <class T>
void broadcast_first(const void* const* in, void* const* out, int count, const void*) {
  const T value = *static_cast<const T*>(in[0]);
  for (int t = 0; t < count; ++t) *static_cast<T*>(out[t]) = value;
}
// Warp reduction over the first num_valid lanes of the logical warp; lane 0 gets the result.
template <class T, class Op>
void warp_reduce(const void* const* in, void* const* out, int count, const void* context) {
  const auto& ctx = *static_cast<const ReduceContext<T, Op>*>(context);
  const int valid = ctx.num_valid < count ? ctx.num_valid : count;
  T lanes[kWarpSize];
  for (int i = 0; i < valid; ++i) lanes[i] = *static_cast<const T*>(in[i]);
  const T total = tree_reduce(lanes, valid, *ctx.op);
  for (int i = 0; i < count; ++i) {
    if (i == 0) {
      *static_cast<T*>(out[i]) = total;
    } else {
      poison(*static_cast<T*>(out[i]));
    }
  }
}
}  // namespace detail

template <class T, int BLOCK_THREADS>
class BlockReduce {
  static_assert(BLOCK_THREADS >= 1 && BLOCK_THREADS <= 1024, "BlockReduce: 1 to 1024 threads");
  static constexpr int kWarps = (BLOCK_THREADS + kWarpSize - 1) / kWarpSize;

 public:
  // The size of CUB's (its default algorithm, warp reductions: ptxas reports 32 bytes for
  // <float, 128>), so that the shared-memory limit check counts it.
  struct TempStorage {
    T warp_aggregates[2 * kWarps];
  };
  explicit BlockReduce(TempStorage& storage) : storage_(&storage) {}

  T Sum(T x, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(x, Plus(), BLOCK_THREADS, "BlockReduce::Sum", file, line);
  }
  T Sum(T x, int num_valid, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(x, Plus(), num_valid, "BlockReduce::Sum", file, line);
  }
  template <int N>
  T Sum(T (&items)[N], const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return Reduce(items, Plus(), file, line);
  }
  template <class Op>
  T Reduce(T x, Op op, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(x, op, BLOCK_THREADS, "BlockReduce::Reduce", file, line);
  }
  template <class Op>
  T Reduce(T x, Op op, int num_valid, const char* file = __builtin_FILE(),
           int line = __builtin_LINE()) {
    return reduce(x, op, num_valid, "BlockReduce::Reduce", file, line);
  }
  // CUB reduces a thread's items in order first.
  template <int N, class Op>
  T Reduce(T (&items)[N], Op op, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    T partial = items[0];
    for (int k = 1; k < N; ++k) partial = op(partial, items[k]);
    return reduce(partial, op, BLOCK_THREADS, "BlockReduce::Reduce", file, line);
  }

 private:
  template <class Op>
  T reduce(T x, const Op& op, int num_valid, const char* name, const char* file, int line) {
    const detail::ReduceContext<T, Op> context{&op, num_valid};
    T result;
    detail::BlockCall call{name};
    call.input = &x;
    call.output = &result;
    call.compute = &detail::block_reduce<T, Op>;
    call.context = &context;
    call.temp_storage = storage_;
    call.block_threads = BLOCK_THREADS;
    call.file = file;
    call.line = line;
    detail::block_call(call);
    return result;
  }

  TempStorage* storage_;
};

template <class T, int BLOCK_THREADS>
class BlockScan {
  static_assert(BLOCK_THREADS >= 1 && BLOCK_THREADS <= 1024, "BlockScan: 1 to 1024 threads");
  static constexpr int kWarps = (BLOCK_THREADS + kWarpSize - 1) / kWarpSize;

 public:
  // The size of CUB's (its default algorithm, raking over 32 threads with a padded grid:
  // ptxas reports 672 bytes for <int, 128>), so that the shared-memory limit check counts it.
  struct TempStorage {
    T raking_grid[kWarpSize * (kWarps + 1) + 8];
  };
  explicit BlockScan(TempStorage& storage) : storage_(&storage) {}

  // One item per thread.
  void InclusiveSum(T x, T& out, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    InclusiveScan(in, o, Plus(), file, line);
    out = o[0];
  }
  void InclusiveSum(T x, T& out, T& aggregate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    T in[1] = {x};
    const auto r = scan(in, Plus(), "BlockScan::InclusiveSum", file, line);
    out = r.inclusive[0];
    aggregate = r.aggregate;
  }
  template <class Callback>
  void InclusiveSum(T x, T& out, Callback& prefix, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    InclusiveScan(in, o, Plus(), prefix, file, line);
    out = o[0];
  }
  void ExclusiveSum(T x, T& out, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    ExclusiveSum(in, o, file, line);
    out = o[0];
  }
  void ExclusiveSum(T x, T& out, T& aggregate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    T in[1] = {x};
    const auto r = scan(in, Plus(), "BlockScan::ExclusiveSum", file, line);
    out = r.has_before ? r.before : T(0);
    aggregate = r.aggregate;
  }
  template <class Callback>
  void ExclusiveSum(T x, T& out, Callback& prefix, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    ExclusiveSum(in, o, prefix, file, line);
    out = o[0];
  }
  template <class Op>
  void InclusiveScan(T x, T& out, Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    InclusiveScan(in, o, op, file, line);
    out = o[0];
  }
  template <class Op>
  void InclusiveScan(T x, T& out, Op op, T& aggregate, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    T in[1] = {x};
    const auto r = scan(in, op, "BlockScan::InclusiveScan", file, line);
    out = r.inclusive[0];
    aggregate = r.aggregate;
  }
  template <class Op, class Callback>
  void InclusiveScan(T x, T& out, Op op, Callback& prefix, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    InclusiveScan(in, o, op, prefix, file, line);
    out = o[0];
  }
  template <class Op>
  void ExclusiveScan(T x, T& out, T init, Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    ExclusiveScan(in, o, init, op, file, line);
    out = o[0];
  }
  template <class Op, class Callback>
  void ExclusiveScan(T x, T& out, Op op, Callback& prefix, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    T in[1] = {x}, o[1];
    ExclusiveScan(in, o, op, prefix, file, line);
    out = o[0];
  }

  // ITEMS_PER_THREAD: thread i holds items [i·N, i·N + N) of the tile.
  template <int N>
  void InclusiveSum(T (&in)[N], T (&out)[N], const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    InclusiveScan(in, out, Plus(), file, line);
  }
  template <int N, class Callback>
  void InclusiveSum(T (&in)[N], T (&out)[N], Callback& prefix, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    InclusiveScan(in, out, Plus(), prefix, file, line);
  }
  template <int N>
  void ExclusiveSum(T (&in)[N], T (&out)[N], const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    const auto r = scan(in, Plus(), "BlockScan::ExclusiveSum", file, line);
    out[0] = r.has_before ? r.before : T(0);
    for (int k = 1; k < N; ++k) out[k] = r.inclusive[k - 1];
  }
  template <int N, class Callback>
  void ExclusiveSum(T (&in)[N], T (&out)[N], Callback& prefix, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    ExclusiveScan(in, out, Plus(), prefix, file, line);
  }
  template <int N, class Op>
  void InclusiveScan(T (&in)[N], T (&out)[N], Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    const auto r = scan(in, op, "BlockScan::InclusiveScan", file, line);
    for (int k = 0; k < N; ++k) out[k] = r.inclusive[k];
  }
  template <int N, class Op, class Callback>
  void InclusiveScan(T (&in)[N], T (&out)[N], Op op, Callback& prefix,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const auto r = scan(in, op, "BlockScan::InclusiveScan", file, line);
    const T p = block_prefix(prefix, r.aggregate, file, line);
    for (int k = 0; k < N; ++k) out[k] = op(p, r.inclusive[k]);
  }
  template <int N, class Op>
  void ExclusiveScan(T (&in)[N], T (&out)[N], T init, Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    const auto r = scan(in, op, "BlockScan::ExclusiveScan", file, line);
    out[0] = r.has_before ? op(init, r.before) : init;
    for (int k = 1; k < N; ++k) out[k] = op(init, r.inclusive[k - 1]);
  }
  template <int N, class Op, class Callback>
  void ExclusiveScan(T (&in)[N], T (&out)[N], Op op, Callback& prefix,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const auto r = scan(in, op, "BlockScan::ExclusiveScan", file, line);
    const T p = block_prefix(prefix, r.aggregate, file, line);
    out[0] = r.has_before ? op(p, r.before) : p;
    for (int k = 1; k < N; ++k) out[k] = op(p, r.inclusive[k - 1]);
  }

 private:
  template <int N, class Op>
  detail::ScanPartial<T, N> scan(T (&in)[N], const Op& op, const char* name, const char* file,
                                 int line) {
    detail::ScanPartial<T, N> result;
    detail::BlockCall call{name};
    call.input = in;
    call.output = &result;
    call.compute = &detail::scan<T, Op, N>;
    call.context = &op;
    call.temp_storage = storage_;
    call.block_threads = BLOCK_THREADS;
    call.file = file;
    call.line = line;
    detail::block_call(call);
    return result;
  }
  // As CUB: the threads of the first warp call the callback with the tile's aggregate, and the
  // first thread's return value, shared through a second barrier, is the prefix of the tile.
  template <class Callback>
  T block_prefix(Callback& callback, const T& aggregate, const char* file, int line) {
    T mine;
    if (warp_id() == 0) mine = callback(aggregate);
    T prefix;
    detail::BlockCall call{"BlockScan (prefix callback)"};
    call.input = &mine;
    call.output = &prefix;
    call.compute = &detail::broadcast_first<T>;
    call.temp_storage = storage_;
    call.check_reuse = false;
    call.block_threads = BLOCK_THREADS;
    call.file = file;
    call.line = line;
    detail::block_call(call);
    return prefix;
  }

  TempStorage* storage_;
};

namespace detail {
template <int LOGICAL_WARP_THREADS>
unsigned logical_warp_mask() {
  static_assert(LOGICAL_WARP_THREADS >= 1 && LOGICAL_WARP_THREADS <= kWarpSize &&
                    (LOGICAL_WARP_THREADS & (LOGICAL_WARP_THREADS - 1)) == 0,
                "logical warps of 1, 2, 4, 8, 16 or 32 threads");
  if constexpr (LOGICAL_WARP_THREADS == kWarpSize) {
    return kFullMask;
  } else {
    const unsigned first = lane_id() / LOGICAL_WARP_THREADS * LOGICAL_WARP_THREADS;
    return ((1u << LOGICAL_WARP_THREADS) - 1u) << first;
  }
}
}  // namespace detail

template <class T, int LOGICAL_WARP_THREADS = kWarpSize>
class WarpReduce {
 public:
  struct TempStorage {  // CUB's shuffle-based warp reduction needs none
    unsigned char unused;
  };
  explicit WarpReduce(TempStorage&) {}

  T Sum(T x, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(x, Plus(), LOGICAL_WARP_THREADS, "WarpReduce::Sum", file, line);
  }
  T Sum(T x, int valid_items, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(x, Plus(), valid_items, "WarpReduce::Sum", file, line);
  }
  template <class Op>
  T Reduce(T x, Op op, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(x, op, LOGICAL_WARP_THREADS, "WarpReduce::Reduce", file, line);
  }
  template <class Op>
  T Reduce(T x, Op op, int valid_items, const char* file = __builtin_FILE(),
           int line = __builtin_LINE()) {
    return reduce(x, op, valid_items, "WarpReduce::Reduce", file, line);
  }

 private:
  template <class Op>
  T reduce(T x, const Op& op, int valid, const char* name, const char* file, int line) {
    const detail::ReduceContext<T, Op> context{&op, valid};
    T result;
    detail::WarpCall call{detail::WarpOp::primitive,
                          detail::logical_warp_mask<LOGICAL_WARP_THREADS>()};
    call.input = &x;
    call.output = &result;
    call.compute = &detail::warp_reduce<T, Op>;
    call.context = &context;
    call.name = name;
    call.file = file;
    call.line = line;
    detail::warp_call(call);
    return result;
  }
};

template <class T, int LOGICAL_WARP_THREADS = kWarpSize>
class WarpScan {
 public:
  struct TempStorage {  // CUB's shuffle-based warp scan needs none
    unsigned char unused;
  };
  explicit WarpScan(TempStorage&) {}

  void InclusiveSum(T x, T& out, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    out = scan(x, Plus(), "WarpScan::InclusiveSum", file, line).inclusive[0];
  }
  void InclusiveSum(T x, T& out, T& aggregate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    const auto r = scan(x, Plus(), "WarpScan::InclusiveSum", file, line);
    out = r.inclusive[0];
    aggregate = r.aggregate;
  }
  void ExclusiveSum(T x, T& out, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const auto r = scan(x, Plus(), "WarpScan::ExclusiveSum", file, line);
    out = r.has_before ? r.before : T(0);
  }
  void ExclusiveSum(T x, T& out, T& aggregate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    const auto r = scan(x, Plus(), "WarpScan::ExclusiveSum", file, line);
    out = r.has_before ? r.before : T(0);
    aggregate = r.aggregate;
  }
  template <class Op>
  void InclusiveScan(T x, T& out, Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    out = scan(x, op, "WarpScan::InclusiveScan", file, line).inclusive[0];
  }
  template <class Op>
  void InclusiveScan(T x, T& out, Op op, T& aggregate, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    const auto r = scan(x, op, "WarpScan::InclusiveScan", file, line);
    out = r.inclusive[0];
    aggregate = r.aggregate;
  }
  // Lane 0's output is undefined in CUB: poisoned here.
  template <class Op>
  void ExclusiveScan(T x, T& out, Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    out = scan(x, op, "WarpScan::ExclusiveScan", file, line).before;
  }
  template <class Op>
  void ExclusiveScan(T x, T& out, T init, Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    const auto r = scan(x, op, "WarpScan::ExclusiveScan", file, line);
    out = r.has_before ? op(init, r.before) : init;
  }

 private:
  template <class Op>
  detail::ScanPartial<T, 1> scan(T x, const Op& op, const char* name, const char* file, int line) {
    detail::ScanPartial<T, 1> result;
    detail::WarpCall call{detail::WarpOp::primitive,
                          detail::logical_warp_mask<LOGICAL_WARP_THREADS>()};
    call.input = &x;
    call.output = &result;
    call.compute = &detail::scan<T, Op, 1>;
    call.context = &op;
    call.name = name;
    call.file = file;
    call.line = line;
    detail::warp_call(call);
    return result;
  }
};

// --- launch --------------------------------------------------------------------------------------
namespace detail {
template <class Kernel, class Args>
struct Closure {
  Kernel kernel;
  Args args;
};
template <class... Params, class... Args>
void launch(const char* name, Dim3 grid, Dim3 block, std::size_t dynamic_shared_bytes,
            cuda::Stream /*stream: the emulator runs the grid before returning*/,
            void (*kernel)(Params...), Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "PHASOR_LAUNCH: wrong number of arguments");
  static_assert(((std::is_trivially_copyable_v<Params> && !std::is_reference_v<Params>)&&...),
                "PHASOR_LAUNCH: kernel arguments are passed by value and must be trivially "
                "copyable");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // an empty grid: see PHASOR_LAUNCH
  using Bound = Closure<void (*)(Params...), std::tuple<Params...>>;
  const Bound closure{kernel,
                      std::tuple<Params...>(static_cast<Params>(std::forward<Args>(args))...)};
  // Each thread gets its own copy of the arguments, as on the GPU (std::apply copies each
  // element into the kernel's by-value parameters).
  run_grid(
      LaunchSpec{name, grid, block, dynamic_shared_bytes},
      [](const void* c) {
        const Bound& bound = *static_cast<const Bound*>(c);
        std::apply(bound.kernel, bound.args);
      },
      &closure);
}

inline void* workspace_allocate(std::size_t bytes, cuda::Stream) {
  void* ptr = ::operator new(bytes, std::align_val_t(64));
  std::memset(ptr, 0xFF, bytes);
  return ptr;
}
inline void workspace_free(void* ptr, std::size_t, cuda::Stream) noexcept {
  ::operator delete(ptr, std::align_val_t(64));
}
}  // namespace detail

inline void copy_to_host(void* dst, const void* src, std::size_t bytes, cuda::Stream) {
  std::memcpy(dst, src, bytes);
}
inline void memset_async(void* dst, int value, std::size_t bytes, cuda::Stream) {
  std::memset(dst, value, bytes);
}

}  // namespace phasor::simt

#endif

namespace phasor::simt {

// A temporary device buffer for one call, released when it goes out of scope. On the GPU it
// comes from phasor::cuda's allocator on `stream` (stream-ordered: freeing it while kernels that
// use it are queued on that stream is safe); on the emulator it is host memory filled with 0xFF
// bytes (NaN in every floating type, -1 in integers), so reading an element no kernel wrote shows.
class Workspace {
 public:
  explicit Workspace(std::size_t bytes, cuda::Stream stream = cuda::current_stream())
      : bytes_(bytes), stream_(stream) {
    if (bytes_ > 0) data_ = detail::workspace_allocate(bytes_, stream_);
  }
  ~Workspace() {
    if (data_ != nullptr) detail::workspace_free(data_, bytes_, stream_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // The buffer as `count` elements of T (default: as many as fit).
  template <class T>
  Span<T> span(std::int64_t count = -1) const {
    const auto fit = static_cast<std::int64_t>(bytes_ / sizeof(T));
    if (count > fit)
      throw Error("simt::Workspace::span: " + std::to_string(count) + " elements of " +
                  std::to_string(sizeof(T)) + " bytes do not fit in " + std::to_string(bytes_) +
                  " bytes");
    return Span<T>{static_cast<T*>(data_), count < 0 ? fit : count};
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
  cuda::Stream stream_;
};

// Declared in both branches above:
//   copy_to_host(dst, src, bytes, stream): copies device memory to host memory and waits for it
//     (a sync of `stream`, the only host sync a call makes: how a validation kernel's verdict is
//     read);
//   memset_async(dst, value, bytes, stream): sets device memory, queued on `stream`.

}  // namespace phasor::simt

// PHASOR_LAUNCH(kernel, grid, block, dynamic_shared_bytes, stream, args...): `kernel` may be a
// template-id in parentheses, e.g. PHASOR_LAUNCH((scan_kernel<float, 256>), ...). GPU: <<<>>> on
// `stream` (a cudaStream_t as void*), then cudaGetLastError() as a phasor::Error naming the
// kernel; emulator: runs the grid (the text of `kernel` names it in diagnostics). A grid with a
// zero dimension runs nothing and returns, on both (CUDA would report an invalid configuration):
// a problem with an empty extent (K = 0, no value tile) is a loop of zero iterations, and every
// launch site gets that right without a guard of its own (op_args_fuzz found GLA's K = 0 chunk
// backward launching zero key tiles). A block with a zero dimension is still an error.
#define PHASOR_LAUNCH(kernel, grid, block, dynamic_shared_bytes, stream, ...)                \
  ::phasor::simt::detail::launch(#kernel, (grid), (block), (dynamic_shared_bytes), (stream), \
                                 kernel, ##__VA_ARGS__)
#define PHASOR_DYNAMIC_SHARED(T, name) PHASOR_DYNAMIC_SHARED_AT(T, name, 0, -1)
