// Filling a block's shared tile from global memory, for the chunk kernels (cuda/<op>/chunk.cu),
// for both backends. Included by kernel files inside their own anonymous namespace. Requires
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

}  // namespace
}  // namespace phasor::PHASOR_BACKEND
