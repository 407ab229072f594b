// Internal: the packed sequences of a call, as plain data shared by the CPU kernels and the CUDA
// kernels (host and device code).
//
// A batch is either B rows of [B, T, ...] tensors, each one sequence, or — with cu_seqlens (B must
// be 1) — the N sequences [cu[n], cu[n+1]) packed along T. Each op's problem description holds a
// Sequences: the cu_seqlens pointer, its integer type and stride, N and T. Sequence n is looked
// up from cu_seqlens when it is needed, by the same function on either side, so no list of
// sequences is ever built (nor copied to a GPU). The pointer is read only on the device that
// holds it, and only after the offsets have been validated (check.h: value checks).
#pragma once

#include <cstdint>

#include "phasor/common.h"

namespace phasor::detail {

// One sequence: the batch row it lives in, its first token in the T dimension, its length.
struct Sequence {
  std::int64_t batch;
  std::int64_t start;
  std::int64_t length;
};

struct Sequences {
  const void* cu_seqlens = nullptr;  // null: the B batch rows are the sequences
  bool cu_int32 = false;             // int32 offsets (else int64)
  std::int64_t cu_stride = 1;        // in elements
  std::int64_t count = 0;            // N
  std::int64_t T = 0;                // tokens per batch row

  PHASOR_HOST_DEVICE bool packed() const { return cu_seqlens != nullptr; }
  PHASOR_HOST_DEVICE std::int64_t size() const { return count; }
  // cu_seqlens[i], 0 ≤ i ≤ N (packed batches only).
  PHASOR_HOST_DEVICE std::int64_t offset(std::int64_t i) const {
    return cu_int32 ? static_cast<const std::int32_t*>(cu_seqlens)[i * cu_stride]
                    : static_cast<const std::int64_t*>(cu_seqlens)[i * cu_stride];
  }
  PHASOR_HOST_DEVICE Sequence operator[](std::int64_t n) const {
    if (!packed()) return {n, 0, T};
    const std::int64_t start = offset(n);
    return {0, start, offset(n + 1) - start};
  }

  // The sequence that holds token `g` of the flattened token axis (g = b·T + t over the B rows;
  // packed: g = t, B = 1), for kernels that map threads to tokens rather than to sequences.
  // Packed: a binary search for the last n with cu[n] ≤ g, which skips empty sequences
  // (cu[n] = cu[n + 1]) and, since cu[N] = T > g, has g < cu[n + 1]. Requires 0 ≤ g < B·T and
  // validated offsets (check.h: value checks), so every offset read is in bounds.
  PHASOR_HOST_DEVICE std::int64_t sequence_of(std::int64_t g) const {
    if (!packed()) return g / T;
    std::int64_t lo = 0, hi = count - 1;  // the answer lies in [lo, hi]
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo + 1) / 2;
      if (offset(mid) <= g)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  // Chunk slots: where the per-chunk results of chunk c of sequence n go, for chunks of C tokens
  // (the chunk states of phasor/common.h's num_chunk_states; the GPU kernels' workspaces):
  //   B rows, no cu_seqlens:  n·⌈T/C⌉ + c          B·⌈T/C⌉ slots, every one a chunk's;
  //   packed:                 n + ⌊cu[n] / C⌋ + c   fewer than N + ⌈T/C⌉ slots.
  // Packed slots are distinct: sequence n has ⌈len/C⌉ ≤ ⌊(cu[n] mod C + len)/C⌋ + 1 chunks, so
  // its last slot stays below the next sequence's first; a slot between two sequences' chunks
  // (or of an empty sequence) holds no chunk. Both are increasing in n and need only the offsets
  // of sequence n, never a sum over the sequences before it (which a GPU would have to scan).
  PHASOR_HOST_DEVICE std::int64_t chunk_slot(std::int64_t C, std::int64_t n, std::int64_t c) const {
    if (!packed()) return n * ((T + C - 1) / C) + c;
    return n + offset(n) / C + c;
  }
  PHASOR_HOST_DEVICE std::int64_t chunk_slot_count(std::int64_t C) const {
    return packed() ? count + (T + C - 1) / C : count * ((T + C - 1) / C);
  }

  // Host-side iteration: `for (const Sequence& s : sequences)`.
  struct Iterator {
    const Sequences* table;
    std::int64_t n;
    Sequence operator*() const { return (*table)[n]; }
    Iterator& operator++() {
      ++n;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return n != other.n; }
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, count}; }

  // The length of the longest sequence (0 for none; host side).
  std::int64_t longest() const {
    std::int64_t length = 0;
    for (const Sequence& s : *this) length = length < s.length ? s.length : length;
    return length;
  }
};

}  // namespace phasor::detail
