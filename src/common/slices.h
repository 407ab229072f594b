// Internal: moving one (sequence, head) slice between strided views of any float dtype and
// Eigen matrices of the compute type. Kernels load what they need into owned, aligned Eigen
// storage (so alignment, and with it Eigen's summation order, is the same on every run), compute,
// and store the results back. This is also where strides and dtype conversion are handled, so the
// kernels themselves only ever see dense matrices.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "common/element_access.h"
#include "common/view_extent.h"
#include "phasor/common.h"

namespace phasor::detail {

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;

namespace slices_impl {
template <class From, class F>
inline void for_rows(const TensorView& x, std::int64_t base, std::int64_t rows,
                     std::int64_t row_stride, std::int64_t cols, std::int64_t col_stride, F&& f) {
  auto* p = static_cast<From*>(x.data);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) f(r, c, p[base + r * row_stride + c * col_stride]);
}
template <class S>
inline void load_2d(const TensorView& x, std::int64_t base, std::int64_t rows, std::int64_t rs,
                    std::int64_t cols, std::int64_t cs, Mat<S>& out) {
  out.resize(rows, cols);
  // An empty block reads nothing; its view's data may be null (a zero-sized tensor), and
  // null + base is undefined behaviour even when nothing is dereferenced.
  if (rows == 0 || cols == 0) return;
  if (x.dtype == dtype_of<S>() &&
      (cs == 1 || cols == 1)) {  // same type, rows contiguous: copy rows
    const S* p = static_cast<const S*>(x.data) + base;
    for (std::int64_t r = 0; r < rows; ++r)
      std::memcpy(out.data() + r * cols, p + r * rs, static_cast<std::size_t>(cols) * sizeof(S));
    return;
  }
  if (x.dtype == DType::bfloat16 && (cs == 1 || cols == 1)) {
    // bfloat16 rows: a bfloat16 is the top half of a float32 (exact), converted with a shift in
    // a loop that vectorises.
    const std::uint16_t* p = static_cast<const std::uint16_t*>(x.data) + base;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::uint16_t* in = p + r * rs;
      S* dst = out.data() + r * cols;
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::uint32_t bits = static_cast<std::uint32_t>(in[c]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        dst[c] = static_cast<S>(f);
      }
    }
    return;
  }
  // Any other storage type (float16 included) is converted element by element; a 16-bit value
  // converts to float exactly.
  visit_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for_rows<const T>(x, base, rows, rs, cols, cs, [&](std::int64_t r, std::int64_t c, T v) {
      if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
        out(r, c) = S(v.to_float());
      else
        out(r, c) = S(v);
    });
  });
}
template <class M>
inline void store_2d(const M& in, const TensorView& x, std::int64_t base, std::int64_t rs,
                     std::int64_t cs) {
  const std::int64_t rows = in.rows(), cols = in.cols();
  if (rows == 0 || cols == 0) return;  // writes nothing; x.data may be null (see load_2d)
  using Scalar = typename M::Scalar;
  // Row-major storage with contiguous rows (a matrix, or a block of rows of one): copy rows.
  if constexpr ((static_cast<int>(M::Flags) & Eigen::DirectAccessBit) &&
                (static_cast<int>(M::Flags) & Eigen::RowMajorBit) &&
                M::InnerStrideAtCompileTime == 1) {
    if (x.dtype == dtype_of<Scalar>() && (cs == 1 || cols == 1)) {
      Scalar* p = static_cast<Scalar*>(x.data) + base;
      for (std::int64_t r = 0; r < rows; ++r)
        std::memcpy(p + r * rs, in.data() + r * in.outerStride(),
                    static_cast<std::size_t>(cols) * sizeof(Scalar));
      return;
    }
  }
  // bfloat16 / float16 outputs round once, from the compute type's value (through float).
  visit_float_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* p = static_cast<T*>(x.data);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
          p[base + r * rs + c * cs] = T::from_float(static_cast<float>(in(r, c)));
        else
          p[base + r * rs + c * cs] = static_cast<T>(in(r, c));
      }
  });
}
}  // namespace slices_impl

// x: [B, T, H, D]. out (length × D) = x[s.batch, s.start : s.start + s.length, h, :].
template <class S>
void load_rows(const TensorView& x, const Sequence& s, std::int64_t h, Mat<S>& out) {
  const std::int64_t base = s.batch * x.stride(0) + s.start * x.stride(1) + h * x.stride(2);
  slices_impl::load_2d(x, base, s.length, x.stride(1), x.size(3), x.stride(3), out);
}
// x[s.batch, s.start : s.start + s.length, h, :] = in (length × D).
template <class M>
void store_rows(const M& in, const TensorView& x, const Sequence& s, std::int64_t h) {
  const std::int64_t base = s.batch * x.stride(0) + s.start * x.stride(1) + h * x.stride(2);
  slices_impl::store_2d(in, x, base, x.stride(1), x.stride(3));
}

// x: [B, T, H] (per-head scalars such as g or beta). out (length) = x[s.batch, s.start:, h].
template <class S>
void load_column(const TensorView& x, const Sequence& s, std::int64_t h, Vec<S>& out) {
  Mat<S> tmp;
  const std::int64_t base = s.batch * x.stride(0) + s.start * x.stride(1) + h * x.stride(2);
  slices_impl::load_2d(x, base, s.length, x.stride(1), 1, 0, tmp);
  out = tmp.col(0);
}
template <class V>
void store_column(const V& in, const TensorView& x, const Sequence& s, std::int64_t h) {
  const std::int64_t base = s.batch * x.stride(0) + s.start * x.stride(1) + h * x.stride(2);
  slices_impl::store_2d(in, x, base, x.stride(1), 0);
}

// x: [N, H, K, V] (recurrent states). out (K × V) = x[n, h].
template <class S>
void load_state(const TensorView& x, std::int64_t n, std::int64_t h, Mat<S>& out) {
  const std::int64_t base = n * x.stride(0) + h * x.stride(1);
  slices_impl::load_2d(x, base, x.size(2), x.stride(2), x.size(3), x.stride(3), out);
}
template <class M>
void store_state(const M& in, const TensorView& x, std::int64_t n, std::int64_t h) {
  const std::int64_t base = n * x.stride(0) + h * x.stride(1);
  slices_impl::store_2d(in, x, base, x.stride(2), x.stride(3));
}

// ---- states updated in place ----------------------------------------------------------------
// A recurrent kernel may keep a (K × V) state in the caller's final_state instead of an owned
// copy (decoding then reads and writes the state once rather than copying it in and out), when
// the slice is laid out exactly as an owned Mat<S> is: compute dtype, contiguous rows, a start
// aligned as Eigen aligns its own storage. Eigen then runs the same packet and scalar operations
// on it as on owned storage, so results are bit-identical either way.
template <class S>
using StateMap = Eigen::Map<Mat<S>, Eigen::Unaligned>;
// The same, read only (a chunk backward reading a kept state where the forward left it).
template <class S>
using ConstStateMap = Eigen::Map<const Mat<S>, Eigen::Unaligned>;

// True when a kernel may keep its states in `final_state` while it runs: final_state overlaps
// none of `inputs` (read while states are written) and initial_state is either the same view
// (decoding in place) or disjoint from it.
inline bool states_in_place_allowed(const TensorView& final_state, const TensorView& initial_state,
                                    std::initializer_list<TensorView> inputs) {
  if (!final_state.defined()) return false;
  for (const TensorView& x : inputs)
    if (x.defined() && overlaps(final_state, x)) return false;
  return !initial_state.defined() || same_view(initial_state, final_state) ||
         !overlaps(initial_state, final_state);
}

// x[n, h] as a StateMap when its layout allows the in-place update above, else null.
template <class S>
S* state_in_place(const TensorView& x, std::int64_t n, std::int64_t h) {
  // (An empty state, K = 0 or V = 0: its tensor may have no data pointer to offset.)
  if (x.dtype != dtype_of<S>() || x.stride(3) != 1 || (x.size(2) > 1 && x.stride(2) != x.size(3)) ||
      x.size(2) * x.size(3) == 0)
    return nullptr;
  S* p = static_cast<S*>(x.data) + n * x.stride(0) + h * x.stride(1);
  return reinterpret_cast<std::uintptr_t>(p) % EIGEN_MAX_ALIGN_BYTES == 0 ? p : nullptr;
}

// The compute type of a floating storage dtype: float64 for float64, float32 for the others.
inline DType compute_dtype(DType storage) {
  return storage == DType::float64 ? DType::float64 : DType::float32;
}

// Runs f(S{}) with S = float or double, the compute type chosen by `x`: float64 inputs compute
// and accumulate in float64, float32, bfloat16 and float16 inputs in float32.
template <class F>
decltype(auto) dispatch_float(const TensorView& x, F&& f) {
  if (x.dtype == DType::float64) return f(double{});
  return f(float{});
}

// Asks for the rows of the tokens of s in x[:, :, h, :] to be brought into cache. Rows of one head
// are usually a whole token apart in memory (H · D elements, often a page or more), a pattern the
// hardware prefetchers do not follow; kernels call this for the next block while they compute
// the current one.
inline void prefetch_block(const TensorView& x, const Sequence& s, std::int64_t h) {
  if (!x.defined() || s.length <= 0 || x.size(3) <= 0) return;
  const std::int64_t item = static_cast<std::int64_t>(element_size(x.dtype));
  const char* base = static_cast<const char*>(x.data) +
                     (s.batch * x.stride(0) + s.start * x.stride(1) + h * x.stride(2)) * item;
  const std::int64_t row_bytes = ((x.size(3) - 1) * x.stride(3) + 1) * item;
  for (std::int64_t t = 0; t < s.length; ++t)
    for (std::int64_t byte = 0; byte < row_bytes; byte += 64)
      __builtin_prefetch(base + t * x.stride(1) * item + byte);
}

}  // namespace phasor::detail
