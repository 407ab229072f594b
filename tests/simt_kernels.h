// Test kernels of the portability header (tests/simt_kernels.cu), compiled for the emulated GPU
// (phasor::emulated::simt_test) and, with the CUDA backend, by nvcc (phasor::cuda::simt_test).
// Pointers are memory of the backend's device (device_allocate); each call launches on the
// current stream and returns (read the results back with copy_bytes, which syncs the stream).
#pragma once

#include <cstddef>
#include <cstdint>

#include "phasor/common.h"

// The same launchers in both namespaces.
#define PHASOR_SIMT_TEST_KERNELS                                                                  \
  /* Shuffles of n values (blocks of 64 threads): out = [idx | up | down | xor] (4n values), with \
     lane_arg as the source lane / delta / lane mask; half_masks: lanes 0-15 and 16-31 use        \
     their half-warp masks (for width ≤ 16). */                                                 \
  void shuffle_int(const int* in, int* out, int n, int width, int lane_arg, bool half_masks);     \
  void shuffle_double(const double* in, double* out, int n, int width, int lane_arg,              \
                      bool half_masks);                                                           \
  void shuffle_int64(const long long* in, long long* out, int n, int width, int lane_arg,         \
                     bool half_masks);                                                            \
  /* Votes of n predicates: out = [ballot | all | any] (3n). */                                   \
  void votes(const int* predicates, unsigned* out, int n, bool half_masks);                       \
  /* Atomics of n values (blocks of 64): ints = [add, max, min, claimed slots] (ints[1] and       \
     ints[2] start at INT_MIN / INT_MAX), u / ull / f / d: one sum each (of v, v << 20, v,        \
     v / 2), slots: one CAS winner (index + 1) per key v % slot_count, histogram of v % bins      \
     (bins ≤ 16) through shared-memory atomics. Everything starts at 0 except ints[1], [2]. */  \
  void atomics(const int* values, int n, int* ints, unsigned* u, unsigned long long* ull,         \
               float* f, double* d, int* slots, int slot_count, int* histogram, int bins);        \
  /* BlockReduce<float, 128>, one block per 512 inputs: out[5 b + ...] = Sum (of the first 128),  \
     Reduce(max), Sum(num_valid), Sum of 4 items per thread (all 512), thread 1's Sum. */         \
  void block_reduce(const float* in, float* out, int blocks, int num_valid);                      \
  /* BlockScan<int, 128>, one block: in has 512 values; out (13 · 128) = InclusiveSum,           \
     ExclusiveSum, InclusiveScan(max), ExclusiveScan(-1000, max), the aggregate of InclusiveSum   \
     (128 copies), InclusiveSum and ExclusiveSum of 4 items per thread (512 each). */             \
  void block_scan(const int* in, int* out);                                                       \
  /* BlockScan<int, 128> with a running-prefix callback over tiles of 512 (4 items per thread):   \
     the inclusive and exclusive sums of all n values (n a multiple of 512). */                   \
  void scan_tiles(const int* in, int* inclusive, int* exclusive, int n);                          \
  /* Warp primitives on 64 inputs (one block of 64): out (9 · 64) = WarpReduce Sum, Reduce(max), \
     Sum(20 valid), WarpScan InclusiveSum, ExclusiveSum, InclusiveScan(max),                      \
     ExclusiveScan(100, +), WarpReduce<8> Sum, WarpScan<8> InclusiveSum. */                       \
  void warp_primitives(const int* in, int* out);                                                  \
  /* One block of n threads: values (floats) and flags (ints) in dynamic shared memory, plus      \
     extra_bytes; out[t] = 2 · in[n-1-t] + (n-1-t) % 3, out[n + t] = the float view's size. */   \
  void dynamic_shared(const float* in, float* out, int n, std::size_t extra_bytes);               \
  /* Each thread of grid × block writes 10 ints: blockIdx.xyz, threadIdx.xyz, lane_id, warp_id,  \
     blockDim.x, gridDim.z (at 10 · (block linear · threads + thread linear)). */               \
  void dimensions(int* out, const unsigned grid[3], const unsigned block[3]);                     \
  /* y[i, j, k] = x[i, j, k] through simt::load<double> / simt::store (rank-3 views). */          \
  void convert(const TensorView& x, const TensorView& y);                                         \
  void vector_copy(const TensorView& x, const TensorView& y);                                     \
  void vector_store(const TensorView& x, const TensorView& y);                                    \
  /* y[i] = x[index[i]] (simt::load_index). */                                                    \
  void gather(const TensorView& index, const TensorView& x, const TensorView& y);                 \
  /* out[0] = the sum of 64 ints by a shared-memory tree in warp 0: with syncwarp between steps   \
     (correct), or relying on implicit lock-step (a planted race). */                             \
  void shared_warp_sum(const int* in, int* out, bool with_syncwarp);                              \
  /* Blocks of `threads` threads: s[t] = in; out = the left neighbour of s[t] = s[t + 1] +        \
     s[t] / 2, with or without the syncthreads between reading s[t + 1] and writing s[t]. */      \
  void neighbor_sum(const float* in, float* out, int blocks, int threads, bool with_barrier);     \
  /* For the emulator's cost (bench/simt_bench.cpp): one block of `threads` threads passing       \
     `iterations` syncthreads, or `iterations` shfl_xor_sync of a value; out[t] = the result. */  \
  void barrier_loop(int* out, int threads, int iterations);                                       \
  /* Host-side helpers: counts the negative values through a Workspace counter (memset_async,     \
     atomics, one copy_to_host); copies a fresh (never written) Workspace of n floats to out. */  \
  int count_negatives(const int* in, int n);                                                      \
  void fresh_workspace(float* out, int n);                                                        \
  /* out[i] = a[i] · b[i] in float32 (blocks of 2 threads). */                                   \
  void multiply(const float* a, const float* b, float* out, int n);                               \
  void shuffle_loop(int* out, int threads, int iterations);                                       \
  /* One warp: d (16×8, row-major) = a (16×16) · b (16×8) + c with simt::mma_sync, a and b    \
     rounded to bfloat16 (half = false) or float16. mode 0: fragments loaded with the PTX ISA's   \
     formulas written out in the kernel; 1: with mma_a_row & co (mma.h); 2: a planted layout bug  \
     (B's fragment loaded as if B were stored transposed), which must give wrong results. */      \
  void mma(const float* a, const float* b, const float* c, float* d, bool half, int mode);        \
  /* Planted bugs (one block of 64 threads; out: 64 values). */                                   \
  void divergent_barrier(int* out);                                                               \
  void barrier_versus_shuffle(int* out);                                                          \
  void shared_out_of_bounds(int* out);                                                            \
  void global_out_of_bounds(const TensorView& out);                                               \
  void vector_load_at(const TensorView& x, std::int64_t last);                                    \
  void uninitialized_shared(int* out);                                                            \
  void shuffle_mask_omits_caller(int* out);                                                       \
  void shuffle_source_outside_mask(int* out);                                                     \
  void shuffle_masks_disagree(int* out);                                                          \
  void exit_while_others_wait(int* out);                                                          \
  void shuffle_lane_exited(int* out);                                                             \
  void temp_storage_reuse(int* out);                                                              \
  void workspace_out_of_bounds(int* out);                                                         \
  void block_size_mismatch(int* out);

namespace phasor::emulated::simt_test {
PHASOR_SIMT_TEST_KERNELS
// 52 KiB of static shared memory: over every architecture's 48 KiB (nvcc would refuse it, so this
// one exists on the emulator only).
void static_shared_over_limit(int* out);
}  // namespace phasor::emulated::simt_test

#if PHASOR_HAS_CUDA
namespace phasor::cuda::simt_test {
PHASOR_SIMT_TEST_KERNELS
}  // namespace phasor::cuda::simt_test
#endif
