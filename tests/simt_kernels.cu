// Test kernels of the portability header: correct kernels whose results tests/simt_test.cpp
// compares with plain loops (on the emulated GPU, and on a GPU when there is one), and kernels
// with planted bugs that the emulator must report. Compiled both ways by phasor_add_kernels.
#include "simt/mma.h"
#include "simt/simt.h"
#include "simt_kernels.h"

namespace phasor::PHASOR_BACKEND::simt_test {
namespace {

using simt::Dim3;
using simt::Span;

constexpr int kBugThreads = 64;

cuda::Stream stream() {
  return cuda::current_stream();
}

PHASOR_DEVICE int global_thread() {
  return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
}

// --- semantics -----------------------------------------------------------------------------------
template <class T>
PHASOR_GLOBAL void shuffle_kernel(Span<const T> in, Span<T> out, int width, int lane_arg,
                                  bool half_masks) {
  const int n = static_cast<int>(in.size), i = global_thread();
  const unsigned lane = simt::lane_id();
  const unsigned mask = half_masks ? (lane < 16 ? 0x0000ffffu : 0xffff0000u) : simt::kFullMask;
  const T value = in[i];
  out[i] = simt::shfl_sync(mask, value, lane_arg, width);
  out[n + i] = simt::shfl_up_sync(mask, value, static_cast<unsigned>(lane_arg), width);
  out[2 * n + i] = simt::shfl_down_sync(mask, value, static_cast<unsigned>(lane_arg), width);
  out[3 * n + i] = simt::shfl_xor_sync(mask, value, lane_arg, width);
}

template <class T>
void launch_shuffle(const T* in, T* out, int n, int width, int lane_arg, bool half_masks) {
  PHASOR_LAUNCH((shuffle_kernel<T>), Dim3(n / 64), Dim3(64), 0, stream(), Span<const T>{in, n},
                Span<T>{out, 4 * n}, width, lane_arg, half_masks);
}

PHASOR_GLOBAL void vote_kernel(Span<const int> predicates, Span<unsigned> out, bool half_masks) {
  const int n = static_cast<int>(predicates.size), i = global_thread();
  const unsigned lane = simt::lane_id();
  const unsigned mask = half_masks ? (lane < 16 ? 0x0000ffffu : 0xffff0000u) : simt::kFullMask;
  const int p = predicates[i];
  out[i] = simt::ballot_sync(mask, p);
  out[n + i] = static_cast<unsigned>(simt::all_sync(mask, p));
  out[2 * n + i] = static_cast<unsigned>(simt::any_sync(mask, p));
}

PHASOR_GLOBAL void atomic_kernel(Span<const int> values, Span<int> ints, Span<unsigned> u,
                                 Span<unsigned long long> ull, Span<float> f, Span<double> d,
                                 Span<int> slots, Span<int> histogram) {
  const int i = global_thread(), bins = static_cast<int>(histogram.size);
  const int v = values[i];
  simt::atomic_add(&ints[0], v);
  simt::atomic_max(&ints[1], v);
  simt::atomic_min(&ints[2], v);
  if (simt::atomic_cas(&slots[v % slots.size], 0, i + 1) == 0) simt::atomic_add(&ints[3], 1);
  simt::atomic_add(&u[0], static_cast<unsigned>(v));
  simt::atomic_add(&ull[0], static_cast<unsigned long long>(v) << 20);
  simt::atomic_add(&f[0], static_cast<float>(v));
  simt::atomic_add(&d[0], static_cast<double>(v) * 0.5);

  PHASOR_SHARED_ARRAY(int, counts, 16);
  for (int b = static_cast<int>(threadIdx.x); b < bins; b += static_cast<int>(blockDim.x))
    counts[b] = 0;
  simt::syncthreads();
  simt::atomic_add(&counts[v % bins], 1);
  simt::syncthreads();
  for (int b = static_cast<int>(threadIdx.x); b < bins; b += static_cast<int>(blockDim.x))
    simt::atomic_add(&histogram[b], static_cast<int>(counts[b]));
}

constexpr int kReduceThreads = 128;
PHASOR_GLOBAL void block_reduce_kernel(Span<const float> in, Span<float> out, int num_valid) {
  using Reduce = simt::BlockReduce<float, kReduceThreads>;
  PHASOR_SHARED_STORAGE(Reduce::TempStorage, storage);
  const int t = static_cast<int>(threadIdx.x),
            base = static_cast<int>(blockIdx.x) * 4 * kReduceThreads;
  const float x = in[base + t];
  const float sum = Reduce(storage).Sum(x);
  simt::syncthreads();
  const float max = Reduce(storage).Reduce(x, simt::Maximum());
  simt::syncthreads();
  const float partial = Reduce(storage).Sum(x, num_valid);
  simt::syncthreads();
  float items[4];
  for (int k = 0; k < 4; ++k) items[k] = in[base + 4 * t + k];
  const float all = Reduce(storage).Sum(items);
  const std::int64_t row = 5 * static_cast<std::int64_t>(blockIdx.x);
  if (t == 0) {
    out[row] = sum;
    out[row + 1] = max;
    out[row + 2] = partial;
    out[row + 3] = all;
  }
  if (t == 1) out[row + 4] = sum;  // undefined outside thread 0: NaN on the emulator
}

constexpr int kScanThreads = 128;
using Scan = simt::BlockScan<int, kScanThreads>;

PHASOR_GLOBAL void block_scan_kernel(Span<const int> in, Span<int> out) {
  PHASOR_SHARED_STORAGE(Scan::TempStorage, storage);
  const int t = static_cast<int>(threadIdx.x), n = kScanThreads;
  const int x = in[t];
  int r, aggregate;
  Scan(storage).InclusiveSum(x, r);
  out[t] = r;
  simt::syncthreads();
  Scan(storage).ExclusiveSum(x, r);
  out[n + t] = r;
  simt::syncthreads();
  Scan(storage).InclusiveScan(x, r, simt::Maximum());
  out[2 * n + t] = r;
  simt::syncthreads();
  Scan(storage).ExclusiveScan(x, r, -1000, simt::Maximum());
  out[3 * n + t] = r;
  simt::syncthreads();
  Scan(storage).InclusiveSum(x, r, aggregate);
  out[4 * n + t] = aggregate;
  simt::syncthreads();
  int items[4], scanned[4];
  for (int k = 0; k < 4; ++k) items[k] = in[4 * t + k];
  Scan(storage).InclusiveSum(items, scanned);
  for (int k = 0; k < 4; ++k) out[5 * n + 4 * t + k] = scanned[k];
  simt::syncthreads();
  Scan(storage).ExclusiveSum(items, scanned);
  for (int k = 0; k < 4; ++k) out[9 * n + 4 * t + k] = scanned[k];
}

// CUB's prefix callback: called by the first warp with each tile's aggregate; lane 0's return
// value is the tile's prefix.
struct RunningPrefix {
  int total;
  PHASOR_DEVICE int operator()(int tile_aggregate) {
    const int prefix = total;
    total += tile_aggregate;
    return prefix;
  }
};

PHASOR_GLOBAL void scan_tiles_kernel(Span<const int> in, Span<int> inclusive, Span<int> exclusive) {
  PHASOR_SHARED_STORAGE(Scan::TempStorage, storage);
  const int t = static_cast<int>(threadIdx.x);
  RunningPrefix inclusive_prefix{0}, exclusive_prefix{0};
  for (int tile = 0; tile * 4 * kScanThreads < in.size; ++tile) {
    const int base = tile * 4 * kScanThreads + 4 * t;
    int items[4], out[4];
    for (int k = 0; k < 4; ++k) items[k] = in[base + k];
    Scan(storage).InclusiveSum(items, out, inclusive_prefix);
    for (int k = 0; k < 4; ++k) inclusive[base + k] = out[k];
    simt::syncthreads();
    Scan(storage).ExclusiveSum(items, out, exclusive_prefix);
    for (int k = 0; k < 4; ++k) exclusive[base + k] = out[k];
    simt::syncthreads();
  }
}

PHASOR_GLOBAL void warp_kernel(Span<const int> in, Span<int> out) {
  using Reduce = simt::WarpReduce<int>;
  using WarpScan = simt::WarpScan<int>;
  using Reduce8 = simt::WarpReduce<int, 8>;
  using Scan8 = simt::WarpScan<int, 8>;
  // One TempStorage per (logical) warp, as CUB requires.
  struct Storage {
    Reduce::TempStorage reduce[2];
    WarpScan::TempStorage scan[2];
    Reduce8::TempStorage reduce8[8];
    Scan8::TempStorage scan8[8];
  };
  PHASOR_SHARED_STORAGE(Storage, storage);
  const int t = static_cast<int>(threadIdx.x), n = 64, w = t / 32, g = t / 8;
  const int x = in[t];
  int r;
  out[t] = Reduce(storage.reduce[w]).Sum(x);
  out[n + t] = Reduce(storage.reduce[w]).Reduce(x, simt::Maximum());
  out[2 * n + t] = Reduce(storage.reduce[w]).Sum(x, 20);
  WarpScan(storage.scan[w]).InclusiveSum(x, r);
  out[3 * n + t] = r;
  WarpScan(storage.scan[w]).ExclusiveSum(x, r);
  out[4 * n + t] = r;
  WarpScan(storage.scan[w]).InclusiveScan(x, r, simt::Maximum());
  out[5 * n + t] = r;
  WarpScan(storage.scan[w]).ExclusiveScan(x, r, 100, simt::Plus());
  out[6 * n + t] = r;
  out[7 * n + t] = Reduce8(storage.reduce8[g]).Sum(x);
  Scan8(storage.scan8[g]).InclusiveSum(x, r);
  out[8 * n + t] = r;
}

PHASOR_GLOBAL void dynamic_shared_kernel(Span<const float> in, Span<float> out) {
  const int n = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  PHASOR_DYNAMIC_SHARED(float, values);
  PHASOR_DYNAMIC_SHARED_AT(int, flags, n * sizeof(float), n);
  values[t] = in[t];
  flags[t] = t % 3;
  simt::syncthreads();
  const float v = values[n - 1 - t];
  const int flag = flags[n - 1 - t];
  out[t] = 2.0f * v + static_cast<float>(flag);
  out[n + t] = static_cast<float>(values.size());
}

PHASOR_GLOBAL void dimensions_kernel(Span<int> out) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const std::int64_t at = 10 * (static_cast<std::int64_t>(block) * threads + thread);
  const unsigned values[10] = {blockIdx.x,  blockIdx.y,  blockIdx.z,      threadIdx.x,
                               threadIdx.y, threadIdx.z, simt::lane_id(), simt::warp_id(),
                               blockDim.x,  gridDim.z};
  for (int k = 0; k < 10; ++k) out[at + k] = static_cast<int>(values[k]);
}

PHASOR_GLOBAL void convert_kernel(TensorView x, TensorView y) {
  const std::int64_t s1 = y.size(1), s2 = y.size(2), i = global_thread();
  if (i >= y.size(0) * s1 * s2) return;
  const std::int64_t a = i / (s1 * s2), b = i / s2 % s1, c = i % s2;
  simt::store(y, simt::load<double>(x, a, b, c), a, b, c);
}

// y[a, b, c] = x[a, b, c] (y float64), each thread copying one 16-byte vector of x's row.
template <class T>
PHASOR_DEVICE void vector_copy_typed(const TensorView& x, const TensorView& y) {
  constexpr int n = simt::Vector16<T>::kCount;
  const std::int64_t s1 = y.size(1), vectors = y.size(2) / n, i = global_thread();
  if (i >= y.size(0) * s1 * vectors) return;
  const std::int64_t a = i / (s1 * vectors), b = i / vectors % s1, c = i % vectors * n;
  const simt::Vector16<T> v = simt::load_vector<T>(x, a, b, c);
  for (int m = 0; m < n; ++m) simt::store(y, ::phasor::detail::to_double(v.x[m]), a, b, c + m);
}
PHASOR_GLOBAL void vector_copy_kernel(TensorView x, TensorView y) {
  ::phasor::detail::visit_float_dtype(
      x.dtype, [&](auto element) { vector_copy_typed<decltype(element)>(x, y); });
}

PHASOR_GLOBAL void gather_kernel(TensorView index, TensorView x, TensorView y) {
  const int i = global_thread();
  if (i >= y.size(0)) return;
  simt::store(y, simt::load<float>(x, simt::load_index(index, i)), i);
}

PHASOR_GLOBAL void shared_warp_sum_kernel(Span<const int> in, Span<int> out, bool with_syncwarp) {
  PHASOR_SHARED_ARRAY(int, partial, 64);
  const int t = static_cast<int>(threadIdx.x);
  partial[t] = in[t];
  simt::syncthreads();
  if (t < 32) {
    for (int offset = 32; offset > 0; offset /= 2) {
      if (t < offset) partial[t] += partial[t + offset];
      if (with_syncwarp) simt::syncwarp();
    }
    if (t == 0) out[0] = partial[0];
  }
}

PHASOR_GLOBAL void neighbor_sum_kernel(Span<const float> in, Span<float> out, bool with_barrier) {
  PHASOR_SHARED_ARRAY(float, s, 256);
  const int n = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  const int g = static_cast<int>(blockIdx.x) * n + t;
  s[t] = in[g];
  simt::syncthreads();
  const float right = s[(t + 1) % n];
  if (with_barrier) simt::syncthreads();
  s[t] = right + 0.5f * s[t];
  simt::syncthreads();
  out[g] = s[(t + n - 1) % n];
}

PHASOR_GLOBAL void barrier_loop_kernel(Span<int> out, int iterations) {
  const int t = static_cast<int>(threadIdx.x);
  int count = 0;
  for (int i = 0; i < iterations; ++i) {
    simt::syncthreads();
    count += 1;
  }
  out[t] = count;
}

PHASOR_GLOBAL void shuffle_loop_kernel(Span<int> out, int iterations) {
  const int t = static_cast<int>(threadIdx.x);
  int value = t;
  for (int i = 0; i < iterations; ++i) value = simt::shfl_xor_sync(simt::kFullMask, value, 1) + 1;
  out[t] = value;
}

PHASOR_GLOBAL void count_negatives_kernel(Span<const int> in, Span<int> count) {
  const int i = global_thread();
  if (i < in.size && in[i] < 0) simt::atomic_add(&count[0], 1);
}

PHASOR_GLOBAL void multiply_kernel(Span<const float> a, Span<const float> b, Span<float> out) {
  const int i = global_thread();
  if (i < out.size) {
    const float x = a[i], y = b[i];
    out[i] = x * y;
  }
}

PHASOR_GLOBAL void copy_kernel(Span<const float> from, Span<float> to) {
  const int i = global_thread();
  if (i < to.size) to[i] = from[i];
}

// --- planted bugs --------------------------------------------------------------------------------
PHASOR_GLOBAL void divergent_barrier_kernel(Span<int> out) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < 32) {
    simt::syncthreads();
  } else {
    simt::syncthreads();  // another barrier: the block never meets at one
  }
  out[t] = t;
}

PHASOR_GLOBAL void barrier_versus_shuffle_kernel(Span<int> out) {
  const int t = static_cast<int>(threadIdx.x);
  if (simt::lane_id() < 16) {
    simt::syncthreads();
    out[t] = t;
  } else {
    out[t] = simt::shfl_sync(simt::kFullMask, t, 0);  // waits for lanes that wait at the barrier
  }
}

PHASOR_GLOBAL void shared_out_of_bounds_kernel(Span<int> out) {
  PHASOR_SHARED_ARRAY(int, s, kBugThreads);
  const int t = static_cast<int>(threadIdx.x);
  s[t + 1] = t;  // thread 63 writes s[64]
  simt::syncthreads();
  out[t] = s[t];
}

PHASOR_GLOBAL void global_out_of_bounds_kernel(TensorView out) {
  const int t = static_cast<int>(threadIdx.x);
  simt::store(out, 1.0f, t + 1);  // thread 63 writes out[64]
}

// y[a, b, c] = x[a, b, c] (x float64), each thread storing one 16-byte vector of y's row.
template <class T>
PHASOR_DEVICE void vector_store_typed(const TensorView& x, const TensorView& y) {
  constexpr int n = simt::Vector16<T>::kCount;
  const std::int64_t s1 = x.size(1), vectors = x.size(2) / n, i = global_thread();
  if (i >= x.size(0) * s1 * vectors) return;
  const std::int64_t a = i / (s1 * vectors), b = i / vectors % s1, c = i % vectors * n;
  simt::Vector16<T> v;
  for (int m = 0; m < n; ++m)
    v.x[m] = ::phasor::detail::from_double<T>(simt::load<double>(x, a, b, c + m));
  simt::store_vector<T>(y, v, a, b, c);
}
PHASOR_GLOBAL void vector_store_kernel(TensorView x, TensorView y) {
  ::phasor::detail::visit_float_dtype(
      y.dtype, [&](auto element) { vector_store_typed<decltype(element)>(x, y); });
}

// A float32 vector load of x[t, last .. last + 4) by every thread t.
PHASOR_GLOBAL void vector_load_at_kernel(TensorView x, std::int64_t last) {
  const simt::Vector16<float> v = simt::load_vector<float>(x, threadIdx.x, last);
  if (v.x[0] == 12345.f) simt::store(x, 0.f, threadIdx.x, last);  // keeps the load
}

PHASOR_GLOBAL void uninitialized_shared_kernel(Span<int> out) {
  PHASOR_SHARED_ARRAY(int, s, kBugThreads);
  const int t = static_cast<int>(threadIdx.x);
  if (t < 32) s[t] = t;  // the second warp's elements are never written
  simt::syncthreads();
  out[t] = s[t];
}

PHASOR_GLOBAL void shuffle_mask_omits_caller_kernel(Span<int> out) {
  const int t = static_cast<int>(threadIdx.x);
  out[t] = simt::shfl_sync(0x0000ffffu, t, 0);  // lanes 16-31 are not in the mask they pass
}

PHASOR_GLOBAL void shuffle_source_outside_mask_kernel(Span<int> out) {
  const int t = static_cast<int>(threadIdx.x);
  out[t] = t;
  if (simt::lane_id() < 16) out[t] = simt::shfl_sync(0x0000ffffu, t, 20);  // lane 20 is outside
}

PHASOR_GLOBAL void shuffle_masks_disagree_kernel(Span<int> out) {
  const int t = static_cast<int>(threadIdx.x);
  if (simt::lane_id() < 16) {
    out[t] = simt::shfl_sync(0x0000ffffu, t, 0);
  } else {
    out[t] = simt::shfl_sync(simt::kFullMask, t, 0);
  }
}

PHASOR_GLOBAL void exit_while_others_wait_kernel(Span<int> out) {
  const int t = static_cast<int>(threadIdx.x);
  if (t == 5) return;  // never reaches the barrier the others wait at
  simt::syncthreads();
  out[t] = t;
}

PHASOR_GLOBAL void shuffle_lane_exited_kernel(Span<int> out) {
  const int t = static_cast<int>(threadIdx.x);
  if (simt::lane_id() == 3) return;
  out[t] = simt::shfl_sync(simt::kFullMask, t, 0);  // lane 3 of the mask has exited
}

PHASOR_GLOBAL void temp_storage_reuse_kernel(Span<int> out) {
  using Reduce = simt::BlockReduce<int, kBugThreads>;
  PHASOR_SHARED_STORAGE(Reduce::TempStorage, storage);
  const int t = static_cast<int>(threadIdx.x);
  const int a = Reduce(storage).Sum(t);
  const int b = Reduce(storage).Sum(2 * t);  // no syncthreads before reusing the storage
  if (t == 0) out[0] = a + b;
}

PHASOR_GLOBAL void workspace_out_of_bounds_kernel(Span<int> scratch) {
  const int t = static_cast<int>(threadIdx.x);
  scratch[t + 1] = t;  // thread 63 writes element 64 of 64
}

PHASOR_GLOBAL void block_size_mismatch_kernel(Span<int> out) {
  using Reduce = simt::BlockReduce<int, 2 * kBugThreads>;  // launched with kBugThreads
  PHASOR_SHARED_STORAGE(Reduce::TempStorage, storage);
  const int t = static_cast<int>(threadIdx.x);
  const int sum = Reduce(storage).Sum(t);
  if (t == 0) out[0] = sum;
}

// --- tensor cores
// ---------------------------------------------------------------------------------
template <class Half>
PHASOR_GLOBAL void mma_kernel(Span<const float> a, Span<const float> b, Span<const float> c,
                              Span<float> d, int mode) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, q = lane % 4;
  simt::MmaA<Half> fa;
  simt::MmaB<Half> fb;
  simt::MmaC fc;
  const auto half = [](float x) { return Half::from_float(x); };
  if (mode == 0) {  // the PTX ISA's table, written out
    const int a_rows[8] = {g, g, g + 8, g + 8, g, g, g + 8, g + 8};
    const int a_cols[8] = {2 * q,     2 * q + 1, 2 * q,     2 * q + 1,
                           2 * q + 8, 2 * q + 9, 2 * q + 8, 2 * q + 9};
    for (int i = 0; i < 8; ++i) fa.x[i] = half(a[a_rows[i] * 16 + a_cols[i]]);
    const int b_rows[4] = {2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9};
    for (int i = 0; i < 4; ++i) fb.x[i] = half(b[b_rows[i] * 8 + g]);
    const int c_rows[4] = {g, g, g + 8, g + 8}, c_cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
    for (int i = 0; i < 4; ++i) fc.x[i] = c[c_rows[i] * 8 + c_cols[i]];
  } else {
    for (int i = 0; i < 8; ++i)
      fa.x[i] = half(a[simt::mma_a_row(lane, i) * 16 + simt::mma_a_col(lane, i)]);
    for (int i = 0; i < 4; ++i) {
      const int row = simt::mma_b_row(lane, i), col = simt::mma_b_col(lane, i);
      // mode 2: B read as if stored transposed (element (row, col) of an 8 × 16 matrix) — the
      // planted layout mistake.
      fb.x[i] = half(mode == 2 ? b[(col * 16 + row) % 128] : b[row * 8 + col]);
    }
    for (int i = 0; i < 4; ++i)
      fc.x[i] = c[simt::mma_c_row(lane, i) * 8 + simt::mma_c_col(lane, i)];
  }
  simt::MmaC fd;
  simt::mma_sync(fd, fa, fb, fc);
  for (int i = 0; i < 4; ++i) d[simt::mma_c_row(lane, i) * 8 + simt::mma_c_col(lane, i)] = fd.x[i];
}

#if defined(PHASOR_SIMT_EMULATED)
PHASOR_GLOBAL void static_shared_over_limit_kernel(Span<int> out) {
  PHASOR_SHARED_ARRAY(float, big, 13 * 1024);  // 52 KiB
  const int t = static_cast<int>(threadIdx.x);
  big[t] = 1.0f;
  out[t] = t;
}
#endif

}  // namespace

void shuffle_int(const int* in, int* out, int n, int width, int lane_arg, bool half_masks) {
  launch_shuffle(in, out, n, width, lane_arg, half_masks);
}
void shuffle_double(const double* in, double* out, int n, int width, int lane_arg,
                    bool half_masks) {
  launch_shuffle(in, out, n, width, lane_arg, half_masks);
}
void shuffle_int64(const long long* in, long long* out, int n, int width, int lane_arg,
                   bool half_masks) {
  launch_shuffle(in, out, n, width, lane_arg, half_masks);
}

void votes(const int* predicates, unsigned* out, int n, bool half_masks) {
  PHASOR_LAUNCH(vote_kernel, Dim3(n / 64), Dim3(64), 0, stream(), Span<const int>{predicates, n},
                Span<unsigned>{out, 3 * n}, half_masks);
}

void atomics(const int* values, int n, int* ints, unsigned* u, unsigned long long* ull, float* f,
             double* d, int* slots, int slot_count, int* histogram, int bins) {
  PHASOR_LAUNCH(atomic_kernel, Dim3(n / 64), Dim3(64), 0, stream(), Span<const int>{values, n},
                Span<int>{ints, 4}, Span<unsigned>{u, 1}, Span<unsigned long long>{ull, 1},
                Span<float>{f, 1}, Span<double>{d, 1}, Span<int>{slots, slot_count},
                Span<int>{histogram, bins});
}

void block_reduce(const float* in, float* out, int blocks, int num_valid) {
  PHASOR_LAUNCH(block_reduce_kernel, Dim3(blocks), Dim3(kReduceThreads), 0, stream(),
                Span<const float>{in, 4 * kReduceThreads * blocks}, Span<float>{out, 5 * blocks},
                num_valid);
}

void block_scan(const int* in, int* out) {
  PHASOR_LAUNCH(block_scan_kernel, Dim3(1), Dim3(kScanThreads), 0, stream(),
                Span<const int>{in, 4 * kScanThreads}, Span<int>{out, 13 * kScanThreads});
}

void scan_tiles(const int* in, int* inclusive, int* exclusive, int n) {
  PHASOR_LAUNCH(scan_tiles_kernel, Dim3(1), Dim3(kScanThreads), 0, stream(), Span<const int>{in, n},
                Span<int>{inclusive, n}, Span<int>{exclusive, n});
}

void warp_primitives(const int* in, int* out) {
  PHASOR_LAUNCH(warp_kernel, Dim3(1), Dim3(64), 0, stream(), Span<const int>{in, 64},
                Span<int>{out, 9 * 64});
}

void dynamic_shared(const float* in, float* out, int n, std::size_t extra_bytes) {
  const std::size_t bytes =
      static_cast<std::size_t>(n) * (sizeof(float) + sizeof(int)) + extra_bytes;
  PHASOR_LAUNCH(dynamic_shared_kernel, Dim3(1), Dim3(n), bytes, stream(), Span<const float>{in, n},
                Span<float>{out, 2 * n});
}

void dimensions(int* out, const unsigned grid[3], const unsigned block[3]) {
  const std::int64_t count = 10LL * grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2];
  PHASOR_LAUNCH(dimensions_kernel, Dim3(grid[0], grid[1], grid[2]),
                Dim3(block[0], block[1], block[2]), 0, stream(), Span<int>{out, count});
}

void convert(const TensorView& x, const TensorView& y) {
  const std::int64_t n = y.size(0) * y.size(1) * y.size(2);
  PHASOR_LAUNCH(convert_kernel, Dim3(static_cast<unsigned>((n + 127) / 128)), Dim3(128), 0,
                stream(), x, y);
}

void vector_copy(const TensorView& x, const TensorView& y) {
  const std::int64_t n = y.size(0) * y.size(1) * y.size(2);  // at most this many vectors
  PHASOR_LAUNCH(vector_copy_kernel, Dim3(static_cast<unsigned>((n + 127) / 128)), Dim3(128), 0,
                stream(), x, y);
}

void vector_store(const TensorView& x, const TensorView& y) {
  const std::int64_t n = x.size(0) * x.size(1) * x.size(2);
  PHASOR_LAUNCH(vector_store_kernel, Dim3(static_cast<unsigned>((n + 127) / 128)), Dim3(128), 0,
                stream(), x, y);
}

void gather(const TensorView& index, const TensorView& x, const TensorView& y) {
  PHASOR_LAUNCH(gather_kernel, Dim3(static_cast<unsigned>((y.size(0) + 63) / 64)), Dim3(64), 0,
                stream(), index, x, y);
}

void shared_warp_sum(const int* in, int* out, bool with_syncwarp) {
  PHASOR_LAUNCH(shared_warp_sum_kernel, Dim3(1), Dim3(64), 0, stream(), Span<const int>{in, 64},
                Span<int>{out, 1}, with_syncwarp);
}

void neighbor_sum(const float* in, float* out, int blocks, int threads, bool with_barrier) {
  PHASOR_LAUNCH(neighbor_sum_kernel, Dim3(blocks), Dim3(threads), 0, stream(),
                Span<const float>{in, blocks * threads}, Span<float>{out, blocks * threads},
                with_barrier);
}

void barrier_loop(int* out, int threads, int iterations) {
  PHASOR_LAUNCH(barrier_loop_kernel, Dim3(1), Dim3(threads), 0, stream(), Span<int>{out, threads},
                iterations);
}
void shuffle_loop(int* out, int threads, int iterations) {
  PHASOR_LAUNCH(shuffle_loop_kernel, Dim3(1), Dim3(threads), 0, stream(), Span<int>{out, threads},
                iterations);
}

int count_negatives(const int* in, int n) {
  simt::Workspace workspace(sizeof(int));
  const Span<int> count = workspace.span<int>(1);
  simt::memset_async(count.data, 0, sizeof(int), stream());
  PHASOR_LAUNCH(count_negatives_kernel, Dim3(static_cast<unsigned>((n + 63) / 64)), Dim3(64), 0,
                stream(), Span<const int>{in, n}, count);
  int result = -1;
  simt::copy_to_host(&result, count.data, sizeof(int), stream());
  return result;
}

void mma(const float* a, const float* b, const float* c, float* d, bool half, int mode) {
  const Span<const float> sa{a, 256}, sb{b, 128}, sc{c, 128};
  if (half)
    PHASOR_LAUNCH((mma_kernel<float16>), Dim3(1), Dim3(32), 0, stream(), sa, sb, sc,
                  Span<float>{d, 128}, mode);
  else
    PHASOR_LAUNCH((mma_kernel<bfloat16>), Dim3(1), Dim3(32), 0, stream(), sa, sb, sc,
                  Span<float>{d, 128}, mode);
}

void multiply(const float* a, const float* b, float* out, int n) {
  PHASOR_LAUNCH(multiply_kernel, Dim3(static_cast<unsigned>((n + 1) / 2)), Dim3(2), 0, stream(),
                Span<const float>{a, n}, Span<const float>{b, n}, Span<float>{out, n});
}

void fresh_workspace(float* out, int n) {
  simt::Workspace workspace(static_cast<std::size_t>(n) * sizeof(float));
  PHASOR_LAUNCH(copy_kernel, Dim3(static_cast<unsigned>((n + 63) / 64)), Dim3(64), 0, stream(),
                Span<const float>{workspace.span<float>().data, n}, Span<float>{out, n});
}

void divergent_barrier(int* out) {
  PHASOR_LAUNCH(divergent_barrier_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void barrier_versus_shuffle(int* out) {
  PHASOR_LAUNCH(barrier_versus_shuffle_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void shared_out_of_bounds(int* out) {
  PHASOR_LAUNCH(shared_out_of_bounds_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void global_out_of_bounds(const TensorView& out) {
  PHASOR_LAUNCH(global_out_of_bounds_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(), out);
}
void vector_load_at(const TensorView& x, std::int64_t last) {
  PHASOR_LAUNCH(vector_load_at_kernel, Dim3(1), Dim3(static_cast<unsigned>(x.size(0))), 0, stream(),
                x, last);
}
void uninitialized_shared(int* out) {
  PHASOR_LAUNCH(uninitialized_shared_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void shuffle_mask_omits_caller(int* out) {
  PHASOR_LAUNCH(shuffle_mask_omits_caller_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void shuffle_source_outside_mask(int* out) {
  PHASOR_LAUNCH(shuffle_source_outside_mask_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void shuffle_masks_disagree(int* out) {
  PHASOR_LAUNCH(shuffle_masks_disagree_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void exit_while_others_wait(int* out) {
  PHASOR_LAUNCH(exit_while_others_wait_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void shuffle_lane_exited(int* out) {
  PHASOR_LAUNCH(shuffle_lane_exited_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void temp_storage_reuse(int* out) {
  PHASOR_LAUNCH(temp_storage_reuse_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
void workspace_out_of_bounds(int*) {
  simt::Workspace workspace(kBugThreads * sizeof(int));
  PHASOR_LAUNCH(workspace_out_of_bounds_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                workspace.span<int>());
}
void block_size_mismatch(int* out) {
  PHASOR_LAUNCH(block_size_mismatch_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
#if defined(PHASOR_SIMT_EMULATED)
void static_shared_over_limit(int* out) {
  PHASOR_LAUNCH(static_shared_over_limit_kernel, Dim3(1), Dim3(kBugThreads), 0, stream(),
                Span<int>{out, kBugThreads});
}
#endif

}  // namespace phasor::PHASOR_BACKEND::simt_test
