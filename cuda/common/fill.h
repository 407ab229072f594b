// Filling a block's shared tile from global memory and writing tiles back, for the chunk kernels
// (cuda/<op>/chunk.cu), for both backends: fill_shared (any element function) and
// load_token_rows / store_token_rows (the rows of a chunk of tokens, 16 bytes a load or store
// where the view allows). Included by kernel files inside their own anonymous namespace. Requires
// simt/simt.h.
//
// A loop `for (e = tid; e < count; e += threads) tile[e] = load(e);` waits for memory once per
// element: the store to shared memory needs the loaded value, and a warp issues in order, so the
// next iteration's load is not issued until the previous one has returned. fill_shared issues
// kLoadsInFlight loads per thread before it stores the first, so a thread waits once per
// kLoadsInFlight elements. On the H200 (docs/cuda.md, 2026-11-28) this made Gated DeltaNet's
// chunk forward 1.12x faster and its forward + backward 1.06x; GLA's kernels did not change.
#pragma once

#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND {
namespace {

// Loads a thread keeps in flight in fill_shared: 8 floats (doubles) of registers, and 8 × 128
// elements per round, a 64 × 16 tile in one round.
constexpr int kLoadsInFlight = 8;
// 16-byte loads a thread keeps in flight in load_token_rows: 16 registers, and 4 × 128 vectors
// per round, a 64 × 64 bfloat16 tile (a 64 × 32 float32 one) in one round.
constexpr int kVectorsInFlight = 4;

// out[e] = value(e) for e in [0, count), over the threads of a one-dimensional block (as the
// chunk kernels launch); value(e) returns T.
template <class T, class F>
PHASOR_DEVICE void fill_shared(int count, const simt::SharedArray<T>& out, const F& value) {
  const int threads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  for (int base = tid; base < count; base += threads * kLoadsInFlight) {
    T staged[kLoadsInFlight];
    PHASOR_UNROLL
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int e = base + u * threads;
      staged[u] = e < count ? value(e) : T(0);
    }
    PHASOR_UNROLL
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int e = base + u * threads;
      if (e < count) out[e] = staged[u];
    }
  }
}

// Whether columns [column0, column0 + columns) of a W-wide tile of x's rows split into whole
// 16-byte vectors of T (W and column0 multiples of the vector; columns too, unless it covers W).
template <class T>
PHASOR_DEVICE bool vector_rows(const TensorView& x, std::int64_t column0, int columns, int W) {
  constexpr int n = simt::Vector16<T>::kCount;
  return W % n == 0 && column0 % n == 0 && (columns >= W || columns % n == 0) &&
         simt::vector_loadable<T>(x);
}

// The rows of a chunk of tokens in a [B, T, H, D] view (q, k, v, g, do, ...), as the chunk
// kernels tile them (W columns a row): out[j·W + i] = transform(j, x[batch, first + j, head,
// column0 + i]) for j < len and i < columns, 0 for the other elements of the rows × W tile (rows
// past the chunk, columns past the channels). transform(int j, A value) returns A (a row's scale
// factor, say); it is applied to the loaded elements only.
//
// Where x allows 16-byte loads (simt::vector_loadable: contiguous channels, aligned rows; W,
// column0 and, unless the tile is whole, columns multiples of the vector's elements), each thread
// keeps kVectorsInFlight such loads in flight (8 bfloat16 elements each: a 64 × 64 bfloat16 tile in
// 4 per thread) and the index arithmetic is done once a vector; other views take one element a
// load. Both give the same values. On the H200 (docs/cuda.md, 2026-11-28, third session) the
// element loads were half of the scans' stalls and their index arithmetic 70 % of the scans'
// instructions; with vectors GLA's states scan ran 10.8 → 4.3 ms and chunk_gla's forward +
// backward 100 → 68.5 ms.
template <class A, class T, class F>
PHASOR_DEVICE bool load_token_rows_vectors(const TensorView& x, std::int64_t batch,
                                           std::int64_t first, int len, int rows, std::int64_t head,
                                           std::int64_t column0, int columns, int W,
                                           const simt::SharedArray<A>& out, const F& transform) {
  constexpr int n = simt::Vector16<T>::kCount;
  if (!vector_rows<T>(x, column0, columns, W)) return false;
  const int per_row = W / n;
  const int count = rows * per_row;
  const int threads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  for (int base = tid; base < count; base += threads * kVectorsInFlight) {
    simt::Vector16<T> staged[kVectorsInFlight]{};
    PHASOR_UNROLL
    for (int u = 0; u < kVectorsInFlight; ++u) {
      const int e = base + u * threads, j = e / per_row, i = (e % per_row) * n;
      if (e < count && j < len && i < columns)
        staged[u] = simt::load_vector<T>(x, batch, first + j, head, column0 + i);
    }
    PHASOR_UNROLL
    for (int u = 0; u < kVectorsInFlight; ++u) {
      const int e = base + u * threads, j = e / per_row, i = (e % per_row) * n;
      if (e >= count) continue;
      const bool loaded = j < len && i < columns;
      PHASOR_UNROLL
      for (int m = 0; m < n; ++m)
        out[j * W + i + m] =
            loaded ? transform(j, static_cast<A>(::phasor::detail::to_double(staged[u].x[m])))
                   : A(0);
    }
  }
  return true;
}

// W: the tile's width (a template argument for the chunk kernels' constant tiles; see below).
template <class A, class F>
PHASOR_DEVICE void load_token_rows(const TensorView& x, std::int64_t batch, std::int64_t first,
                                   int len, int rows, std::int64_t head, std::int64_t column0,
                                   std::int64_t columns, int W, const simt::SharedArray<A>& out,
                                   const F& transform) {
  const int valid = static_cast<int>(columns < 0 ? 0 : columns < W ? columns : W);
  // (an index dtype visits float: not vector_loadable, so the element path)
  const bool done = ::phasor::detail::visit_float_dtype(x.dtype, [&](auto element) {
    return load_token_rows_vectors<A, decltype(element)>(x, batch, first, len, rows, head, column0,
                                                         valid, W, out, transform);
  });
  if (done) return;
  fill_shared<A>(rows * W, out, [&](int e) {
    const int j = e / W, i = e % W;
    return j < len && i < valid
               ? transform(j, simt::load<A>(x, batch, first + j, head, column0 + i))
               : A(0);
  });
}
// The chunk kernels' forms: a constant tile width W (inlined, so the divisions by W fold), with
// or without a transform.
template <class A, int W, class F>
PHASOR_DEVICE void load_token_rows(const TensorView& x, std::int64_t batch, std::int64_t first,
                                   int len, int rows, std::int64_t head, std::int64_t column0,
                                   std::int64_t columns, const simt::SharedArray<A>& out,
                                   const F& transform) {
  load_token_rows<A>(x, batch, first, len, rows, head, column0, columns, W, out, transform);
}
template <class A, int W>
PHASOR_DEVICE void load_token_rows(const TensorView& x, std::int64_t batch, std::int64_t first,
                                   int len, int rows, std::int64_t head, std::int64_t column0,
                                   std::int64_t columns, const simt::SharedArray<A>& out) {
  load_token_rows<A>(x, batch, first, len, rows, head, column0, columns, W, out,
                     [](int, A value) { return value; });
}

// The inverse: x[batch, first + j, head, column0 + i] = value(j, i) for j < len and
// i < min(columns, W), value(int j, int i) returning A (an element of a shared tile, a sum of
// several), rounded to x's dtype as simt::store rounds. With 16-byte stores where x allows them
// (as load_token_rows), one element a store otherwise; the same values either way.
template <class A, class T, class F>
PHASOR_DEVICE bool store_token_rows_vectors(const TensorView& x, std::int64_t batch,
                                            std::int64_t first, int len, std::int64_t head,
                                            std::int64_t column0, int columns, int W,
                                            const F& value) {
  constexpr int n = simt::Vector16<T>::kCount;
  if (!vector_rows<T>(x, column0, columns, W)) return false;
  const int per_row = W / n;
  const int count = len * per_row;
  for (int e = static_cast<int>(threadIdx.x); e < count; e += static_cast<int>(blockDim.x)) {
    const int j = e / per_row, i = (e % per_row) * n;
    if (i >= columns) continue;
    simt::Vector16<T> v;
    PHASOR_UNROLL
    for (int m = 0; m < n; ++m) v.x[m] = ::phasor::detail::from_double<T>(value(j, i + m));
    simt::store_vector<T>(x, v, batch, first + j, head, column0 + i);
  }
  return true;
}

template <class A, class F>
PHASOR_DEVICE void store_token_rows(const TensorView& x, std::int64_t batch, std::int64_t first,
                                    int len, std::int64_t head, std::int64_t column0,
                                    std::int64_t columns, int W, const F& value) {
  const int valid = static_cast<int>(columns < 0 ? 0 : columns < W ? columns : W);
  const bool done = ::phasor::detail::visit_float_dtype(x.dtype, [&](auto element) {
    return store_token_rows_vectors<A, decltype(element)>(x, batch, first, len, head, column0,
                                                          valid, W, value);
  });
  if (done) return;
  for (int e = static_cast<int>(threadIdx.x); e < len * W; e += static_cast<int>(blockDim.x)) {
    const int j = e / W, i = e % W;
    if (i < valid) simt::store(x, value(j, i), batch, first + j, head, column0 + i);
  }
}

template <class A, int W, class F>
PHASOR_DEVICE void store_token_rows(const TensorView& x, std::int64_t batch, std::int64_t first,
                                    int len, std::int64_t head, std::int64_t column0,
                                    std::int64_t columns, const F& value) {
  store_token_rows<A>(x, batch, first, len, head, column0, columns, W, value);
}

}  // namespace
}  // namespace phasor::PHASOR_BACKEND
