// Benchmark support: the machine's dense float32 GEMM speed, the ceiling the chunk kernels
// (built on products of 64 × 128 blocks) are measured against.
#pragma once

namespace phasor::bench {

// GFLOP/s of Eigen's float32 512 × 512 × 512 product run on `threads` threads at once (each its
// own matrices, ~0.3 s), measured once per process and thread count. Eigen's GEMM is what the
// chunk kernels' products run on, so this is the speed they would reach if all their work were
// large products.
double gemm_ceiling_gflops(int threads);

}  // namespace phasor::bench
