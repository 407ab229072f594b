// Matrix-product tiles for the chunk kernels (cuda/<op>/chunk.cu), for both backends: a warp
// accumulates 16 × 8 output tiles, reading its operands from shared memory through strided
// views, on tensor cores (simt::mma_sync) for 16-bit inputs and with fused multiply-adds for
// float32 and float64. Included by kernel files inside their own anonymous namespace.
//
// One kernel source serves every dtype through the operand type O:
//   O = bfloat16 / float16  tensor cores: each operand element is rounded to O when its fragment
//                           is loaded (the shared tiles hold float), accumulation in float;
//   O = float / double      FMA tiles: exact products, accumulation in O (the CPU's arithmetic).
// The accumulators use the mma.sync fragment layout in both cases (tile_row / tile_col), so the
// code that reads them back is the same.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/element_access.h"  // visit_float_dtype
#include "simt/mma.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND {
namespace {

// Operand type O → accumulator type: double for double, else float.
template <class O>
using Accumulator = std::conditional_t<std::is_same_v<O, double>, double, float>;
template <class O>
constexpr bool kTensorCores = std::is_same_v<O, bfloat16> || std::is_same_v<O, float16>;

// Calls f(O{}) with the operand type of a call whose compute dtype is `dtype` (q's): its 16-bit
// type (tensor cores), float or double (FMA tiles) — the storage type, as the CPU readers visit it.
template <class F>
void dispatch_operand(DType dtype, F&& f) {
  ::phasor::detail::visit_float_dtype(dtype, std::forward<F>(f));
}

// A 16 × 8 accumulator tile; lane's x[e] holds element (tile_row(lane, e), tile_col(lane, e)).
template <class A>
struct Tile {
  A x[4] = {A(0), A(0), A(0), A(0)};
};
PHASOR_DEVICE int tile_row(int lane, int e) {
  return simt::mma_c_row(lane, e);
}
PHASOR_DEVICE int tile_col(int lane, int e) {
  return simt::mma_c_col(lane, e);
}

// A matrix in shared memory: element (i, j) at data[offset + i·row_stride + j·col_stride] for
// i < rows and j < cols, 0 outside (so tiles may overhang the matrix).
template <class T>
struct SharedMatrix {
  simt::SharedArray<T> data;
  int offset, row_stride, col_stride, rows, cols;

  PHASOR_DEVICE T at(int i, int j) const {
    if (i >= rows || j >= cols) return T(0);
    const T v = data[offset + i * row_stride + j * col_stride];
    return v;
  }
  PHASOR_DEVICE SharedMatrix transposed() const {
    return {data, offset, col_stride, row_stride, cols, rows};
  }
  // The view of rows [i0, i0 + count) (count clipped to the matrix).
  PHASOR_DEVICE SharedMatrix rows_from(int i0, int count) const {
    const int left = rows - i0 < 0 ? 0 : rows - i0;
    return {data,       offset + i0 * row_stride,    row_stride,
            col_stride, count < left ? count : left, cols};
  }
};
// A row-major rows × cols matrix at element `offset` of `data` (leading dimension `ld`).
template <class T>
PHASOR_DEVICE SharedMatrix<T> row_major(const simt::SharedArray<T>& data, int offset, int ld,
                                        int rows, int cols) {
  return {data, offset, ld, 1, rows, cols};
}

// 2^n for −125 ≤ n ≤ 125 (exact), and the exponent e of x with |x| 2^−e in [0.5, 1) (0 for 0,
// −126 for subnormals), clamped to that range.
PHASOR_DEVICE float power_of_two(int n) {
  return half_detail::bits_float(static_cast<std::uint32_t>(n + 127) << 23);
}
PHASOR_DEVICE int binary_exponent(float x) {
  const int biased = static_cast<int>((half_detail::float_bits(x) >> 23) & 0xffu);
  if (x == 0.f) return 0;
  const int e = biased == 0 ? -126 : biased - 126;
  return e < -125 ? -125 : e > 125 ? 125 : e;
}

// float16 operands have float16's range (6e-8 to 65504): gate factors such as exp(−20 · t)
// would underflow to 0. The float16 tiles therefore scale each row of A and each column of B by a
// power of two that brings its largest element into [0.5, 1) before rounding, and the product's
// element (i, j) back by 2^(e_i + e_j) in float: exact scalings, so only the 16-bit rounding of
// the scaled values remains. (bfloat16 has float32's range and needs none.)
template <class T>
PHASOR_DEVICE void mma_tile_float16(Tile<float>& acc, const SharedMatrix<T>& a, int i0,
                                    const SharedMatrix<T>& b, int j0, int depth) {
  const int lane = static_cast<int>(simt::lane_id()), group = lane / 4, quad = lane % 4;
  // Row maxima of this lane's A rows (group, group + 8) and column maximum of its B column
  // (group), each over the depth split among the group's 4 lanes, then combined in the group.
  float row_lo = 0.f, row_hi = 0.f, column = 0.f;
  for (int k = quad; k < depth; k += 4) {
    row_lo = simt::fmax(row_lo, simt::fabs(static_cast<float>(a.at(i0 + group, k))));
    row_hi = simt::fmax(row_hi, simt::fabs(static_cast<float>(a.at(i0 + group + 8, k))));
    column = simt::fmax(column, simt::fabs(static_cast<float>(b.at(k, j0 + group))));
  }
  for (int offset = 1; offset < 4; offset *= 2) {
    row_lo = simt::fmax(row_lo, simt::shfl_xor_sync(simt::kFullMask, row_lo, offset));
    row_hi = simt::fmax(row_hi, simt::shfl_xor_sync(simt::kFullMask, row_hi, offset));
    column = simt::fmax(column, simt::shfl_xor_sync(simt::kFullMask, column, offset));
  }
  const int e_lo = binary_exponent(row_lo), e_hi = binary_exponent(row_hi),
            e_column = binary_exponent(column);
  const float s_lo = power_of_two(-e_lo), s_hi = power_of_two(-e_hi),
              s_column = power_of_two(-e_column);
  simt::MmaC c;  // the product of the scaled operands
  for (int k0 = 0; k0 < depth; k0 += 16) {
    simt::MmaA<float16> fa;
    simt::MmaB<float16> fb;
    for (int i = 0; i < 8; ++i) {
      const int row = simt::mma_a_row(lane, i), k = k0 + simt::mma_a_col(lane, i);
      const float x = k < depth ? static_cast<float>(a.at(i0 + row, k)) : 0.f;
      fa.x[i] = float16::from_float(x * (row < 8 ? s_lo : s_hi));
    }
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + simt::mma_b_row(lane, i);
      const float x = k < depth ? static_cast<float>(b.at(k, j0 + simt::mma_b_col(lane, i))) : 0.f;
      fb.x[i] = float16::from_float(x * s_column);
    }
    simt::mma_sync(c, fa, fb, c);
  }
  // Element e of this lane sits at row group (+ 8) and column 2·quad + e % 2, whose column
  // exponent the lanes of group 2·quad + e % 2 hold.
  const int e_even = simt::shfl_sync(simt::kFullMask, e_column, 4 * (2 * quad));
  const int e_odd = simt::shfl_sync(simt::kFullMask, e_column, 4 * (2 * quad + 1));
  for (int e = 0; e < 4; ++e) {
    const int e_row = e < 2 ? e_lo : e_hi, e_col = e % 2 == 0 ? e_even : e_odd;
    acc.x[e] += c.x[e] * power_of_two(e_row) * power_of_two(e_col);
  }
}

// acc += a[i0 : i0 + 16, 0 : depth] · b[0 : depth, j0 : j0 + 8]. Every lane of the warp calls it
// with the same arguments (on tensor cores it is a warp collective).
template <class O, class T>
PHASOR_DEVICE void mma_tile(Tile<Accumulator<O>>& acc, const SharedMatrix<T>& a, int i0,
                            const SharedMatrix<T>& b, int j0, int depth) {
  using A = Accumulator<O>;
  const int lane = static_cast<int>(simt::lane_id());
  if constexpr (std::is_same_v<O, float16>) {
    mma_tile_float16(acc, a, i0, b, j0, depth);
  } else if constexpr (kTensorCores<O>) {
    for (int k0 = 0; k0 < depth; k0 += 16) {
      simt::MmaA<O> fa;
      simt::MmaB<O> fb;
      for (int i = 0; i < 8; ++i) {
        const int k = k0 + simt::mma_a_col(lane, i);
        fa.x[i] = O::from_float(
            k < depth ? static_cast<float>(a.at(i0 + simt::mma_a_row(lane, i), k)) : 0.f);
      }
      for (int i = 0; i < 4; ++i) {
        const int k = k0 + simt::mma_b_row(lane, i);
        fb.x[i] = O::from_float(
            k < depth ? static_cast<float>(b.at(k, j0 + simt::mma_b_col(lane, i))) : 0.f);
      }
      simt::MmaC c;
      for (int e = 0; e < 4; ++e) c.x[e] = acc.x[e];
      simt::mma_sync(c, fa, fb, c);
      for (int e = 0; e < 4; ++e) acc.x[e] = c.x[e];
    }
  } else {
    const int r0 = i0 + tile_row(lane, 0), r1 = i0 + tile_row(lane, 2);
    const int c0 = j0 + tile_col(lane, 0), c1 = j0 + tile_col(lane, 1);
    for (int k = 0; k < depth; ++k) {
      const A a0 = static_cast<A>(a.at(r0, k)), a1 = static_cast<A>(a.at(r1, k));
      const A b0 = static_cast<A>(b.at(k, c0)), b1 = static_cast<A>(b.at(k, c1));
      acc.x[0] = simt::fma(a0, b0, acc.x[0]);
      acc.x[1] = simt::fma(a0, b1, acc.x[1]);
      acc.x[2] = simt::fma(a1, b0, acc.x[2]);
      acc.x[3] = simt::fma(a1, b1, acc.x[3]);
    }
  }
}

// out[i][j] = (accumulate ? out[i][j] : 0) + alpha · Σ_k a(i, k) b(k, j) for i < M, j < N, with
// out row-major in shared memory (element (i, j) at out_offset + i·ld + j). The 16 × 8 tiles of
// the product are spread over the block's warps (tile w, w + warps, ...); each element is written
// by one lane. The caller puts a barrier before (operands written) and after (out read).
template <class O, class T>
PHASOR_DEVICE void gemm_to_shared(const SharedMatrix<T>& a, const SharedMatrix<T>& b, int M, int N,
                                  int depth, const simt::SharedArray<T>& out, int out_offset,
                                  int ld, bool accumulate, T alpha = T(1)) {
  const int lane = static_cast<int>(simt::lane_id()), warp = static_cast<int>(simt::warp_id());
  const int warps = static_cast<int>(blockDim.x * blockDim.y * blockDim.z) / simt::kWarpSize;
  const int tiles_m = (M + 15) / 16, tiles_n = (N + 7) / 8;
  for (int t = warp; t < tiles_m * tiles_n; t += warps) {
    const int i0 = (t / tiles_n) * 16, j0 = (t % tiles_n) * 8;
    Tile<Accumulator<O>> acc;
    mma_tile<O>(acc, a, i0, b, j0, depth);
    for (int e = 0; e < 4; ++e) {
      const int i = i0 + tile_row(lane, e), j = j0 + tile_col(lane, e);
      if (i >= M || j >= N) continue;
      const int at = out_offset + i * ld + j;
      T value = alpha * static_cast<T>(acc.x[e]);
      if (accumulate) {
        const T old = out[at];
        value = old + value;
      }
      out[at] = value;
    }
  }
}

}  // namespace
}  // namespace phasor::PHASOR_BACKEND
