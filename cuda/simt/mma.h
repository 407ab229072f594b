// Warp-level matrix multiply-accumulate on tensor cores, for both backends: PTX
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 on the GPU (sm_80 and later),
// and on the emulated GPU a warp collective that gathers the 32 lanes' fragments, rebuilds the
// matrices from the PTX fragment layout and multiplies them. Kernels never write the asm: they
// call simt::mma_sync.
//
//   D (16×8, float) = A (16×16, 16-bit) · B (16×8, 16-bit) + C (16×8, float)
//
// Each lane holds a fragment of every matrix. With lane = 4·g + c (g = lane / 4, the "group",
// c = lane % 4, the thread in the group), the PTX ISA ("Matrix Fragments for mma.m16n8k16 with
// floating point type") places
//   A: x[0], x[1] = A[g][2c], A[g][2c+1]        x[2], x[3] = A[g+8][2c], A[g+8][2c+1]
//      x[4], x[5] = A[g][2c+8], A[g][2c+9]      x[6], x[7] = A[g+8][2c+8], A[g+8][2c+9]
//   B: x[0], x[1] = B[2c][g], B[2c+1][g]        x[2], x[3] = B[2c+8][g], B[2c+9][g]
//   C, D: x[0], x[1] = C[g][2c], C[g][2c+1]    x[2], x[3] = C[g+8][2c], C[g+8][2c+1]
// (two 16-bit elements per 32-bit register, the lower-numbered in the low half). mma_a_row /
// mma_a_col / mma_b_row / mma_b_col / mma_c_row / mma_c_col give these positions to kernels
// that load fragments; the emulator decodes fragments with its own copy of the table above, so a
// kernel whose loads disagree with the hardware's layout computes wrong results on the CPU too
// (tests/simt_test.cpp checks both against plain loops).
//
// Precision. The GPU multiplies the 16-bit values exactly and accumulates in float (the order
// and intermediate rounding of the tensor core's sums are not specified by NVIDIA); the emulator
// adds the 16 exact products and C in double and rounds once to float. Results agree to float
// rounding, not bit for bit: tests compare them with tolerances.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasor/half.h"
#include "simt/simt.h"

namespace phasor::simt {

template <class Half>
struct MmaA {
  static_assert(std::is_same_v<Half, bfloat16> || std::is_same_v<Half, float16>,
                "tensor-core operands are bfloat16 or float16");
  Half x[8];
};
template <class Half>
struct MmaB {
  Half x[4];
};
struct MmaC {
  float x[4] = {0.f, 0.f, 0.f, 0.f};
};

// Positions of fragment element i of `lane` (see the table above).
PHASOR_HOST_DEVICE inline int mma_a_row(int lane, int i) {
  return lane / 4 + ((i / 2) % 2) * 8;
}
PHASOR_HOST_DEVICE inline int mma_a_col(int lane, int i) {
  return (lane % 4) * 2 + i % 2 + (i / 4) * 8;
}
PHASOR_HOST_DEVICE inline int mma_b_row(int lane, int i) {
  return (lane % 4) * 2 + i % 2 + (i / 2) * 8;
}
PHASOR_HOST_DEVICE inline int mma_b_col(int lane, int /*i*/) {
  return lane / 4;
}
PHASOR_HOST_DEVICE inline int mma_c_row(int lane, int i) {
  return lane / 4 + (i / 2) * 8;
}
PHASOR_HOST_DEVICE inline int mma_c_col(int lane, int i) {
  return (lane % 4) * 2 + i % 2;
}

#if defined(PHASOR_SIMT_CUDA)

namespace detail {
template <class Half>
PHASOR_DEVICE std::uint32_t pack(Half low, Half high) {
  return static_cast<std::uint32_t>(low.bits) | (static_cast<std::uint32_t>(high.bits) << 16);
}
}  // namespace detail

// d = a · b + c for the warp (every lane of the warp must call it, converged).
template <class Half>
PHASOR_DEVICE void mma_sync(MmaC& d, const MmaA<Half>& a, const MmaB<Half>& b, const MmaC& c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const std::uint32_t a0 = detail::pack(a.x[0], a.x[1]), a1 = detail::pack(a.x[2], a.x[3]),
                      a2 = detail::pack(a.x[4], a.x[5]), a3 = detail::pack(a.x[6], a.x[7]);
  const std::uint32_t b0 = detail::pack(b.x[0], b.x[1]), b1 = detail::pack(b.x[2], b.x[3]);
  if constexpr (std::is_same_v<Half, bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c.x[0]), "f"(c.x[1]),
          "f"(c.x[2]), "f"(c.x[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c.x[0]), "f"(c.x[1]),
          "f"(c.x[2]), "f"(c.x[3]));
  }
#elif defined(__CUDA_ARCH__)
  static_assert(sizeof(Half) == 0, "mma_sync needs sm_80 or later");
#endif  // the host pass of nvcc compiles no device code
}

#else  // the emulated GPU

namespace detail {
template <class Half>
struct MmaOperands {
  MmaA<Half> a;
  MmaB<Half> b;
  MmaC c;
};

// The warp's collective: rebuild A (16×16) and B (16×8) from the 32 lanes' fragments — this
// table is written out again here from the PTX ISA on purpose, independent of mma_a_row & co.
template <class Half>
void mma_compute(const void* const* inputs, void* const* outputs, int count, const void*) {
  double a[16][16], b[16][8];
  for (int lane = 0; lane < count; ++lane) {
    const auto& in = *static_cast<const MmaOperands<Half>*>(inputs[lane]);
    const int g = lane >> 2, c = lane & 3;
    a[g][2 * c] = in.a.x[0].to_float();
    a[g][2 * c + 1] = in.a.x[1].to_float();
    a[g + 8][2 * c] = in.a.x[2].to_float();
    a[g + 8][2 * c + 1] = in.a.x[3].to_float();
    a[g][2 * c + 8] = in.a.x[4].to_float();
    a[g][2 * c + 9] = in.a.x[5].to_float();
    a[g + 8][2 * c + 8] = in.a.x[6].to_float();
    a[g + 8][2 * c + 9] = in.a.x[7].to_float();
    b[2 * c][g] = in.b.x[0].to_float();
    b[2 * c + 1][g] = in.b.x[1].to_float();
    b[2 * c + 8][g] = in.b.x[2].to_float();
    b[2 * c + 9][g] = in.b.x[3].to_float();
  }
  for (int lane = 0; lane < count; ++lane) {
    const auto& in = *static_cast<const MmaOperands<Half>*>(inputs[lane]);
    auto& out = *static_cast<MmaC*>(outputs[lane]);
    const int g = lane >> 2, c = lane & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * c, 2 * c + 1, 2 * c, 2 * c + 1};
    for (int e = 0; e < 4; ++e) {
      double sum = in.c.x[e];
      for (int k = 0; k < 16; ++k) sum += a[rows[e]][k] * b[k][cols[e]];
      out.x[e] = static_cast<float>(sum);
    }
  }
}
}  // namespace detail

template <class Half>
void mma_sync(MmaC& d, const MmaA<Half>& a, const MmaB<Half>& b, const MmaC& c,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const detail::MmaOperands<Half> operands{a, b, c};
  MmaC result;
  detail::WarpCall call{detail::WarpOp::primitive, kFullMask};
  call.input = &operands;
  call.output = &result;
  call.compute = &detail::mma_compute<Half>;
  call.name = "mma_sync";
  call.file = file;
  call.line = line;
  detail::warp_call(call);
  d = result;
}

#endif

}  // namespace phasor::simt
