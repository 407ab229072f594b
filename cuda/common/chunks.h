// The chunks of a call, for the chunk kernels (cuda/<op>/chunk.cu), for both backends: which
// sequence and chunk a block works on, found on the device from cu_seqlens (the host never reads
// it), and where each chunk's per-chunk results go. Included by kernel files inside their own
// anonymous namespace. Requires simt/simt.h.
//
// Chunk c of sequence n has the slot sequences.chunk_slot(C, n, c) (common/sequences.h):
// distinct for all (n, c), fewer than N + ⌈B·T / C⌉ in all, so workspaces of per-chunk results
// (states, attention tiles) are sized without knowing the sequences. A grid of one block per slot
// finds its (n, c) by a binary search over n (the slot is increasing in n); slots that fall
// between two sequences' chunks have no chunk, and their blocks return at once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/recurrent.h"
#include "common/sequences.h"
#include "simt/simt.h"

namespace phasor::PHASOR_BACKEND {
namespace {

// The dynamic shared memory a chunk kernel may ask for: under sm_80's 163 KiB per block, and the
// same on every GPU, so that tile choices (and with them the results) do not depend on the device.
constexpr std::size_t kSharedBudget = 160 * 1024;

// The chunk in `slot`: its sequence n and index c; false if the slot holds none.
PHASOR_DEVICE bool locate_chunk(const ::phasor::detail::Sequences& s, std::int64_t C,
                                std::int64_t slot, std::int64_t& n, std::int64_t& c) {
  if (s.size() == 0) return false;
  std::int64_t lo = 0, hi = s.size() - 1;  // the last n with chunk_slot(n, 0) ≤ slot
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (s.chunk_slot(C, mid, 0) <= slot)
      lo = mid;
    else
      hi = mid - 1;
  }
  n = lo;
  c = slot - s.chunk_slot(C, n, 0);
  return c >= 0 && c * C < s[n].length;
}

// The chunk a block works on: its sequence n and index c, its workspace slot, its batch row and
// first token there, and its length (C, or less for a sequence's last chunk).
struct Chunk {
  std::int64_t n = 0, c = 0, slot = 0, batch = 0, first = 0;
  int len = 0;
};
PHASOR_DEVICE Chunk chunk_at(const ::phasor::detail::Sequences& sequences, int C, std::int64_t n,
                             std::int64_t c) {
  const ::phasor::detail::Sequence s = sequences[n];
  Chunk ch;
  ch.n = n;
  ch.c = c;
  ch.slot = sequences.chunk_slot(C, n, c);
  ch.batch = s.batch;
  ch.first = s.start + c * C;
  const std::int64_t left = s.length - c * C;
  ch.len = static_cast<int>(left < C ? left : C);
  return ch;
}
// The kernels' chunk size for a problem's (clamped) chunk_size: 16, 32 or 64, the smallest at
// least that (api.cpp requires 16, 32 or 64 on GPU devices; a shorter sequence clamps it).
inline int kernel_chunk_size(std::int64_t chunk_size) {
  return chunk_size <= 16 ? 16 : chunk_size <= 32 ? 32 : 64;
}

// Key tiles of BK channels. Channel of column i of key tile t (−1 if none): contiguous channels,
// or with θ (p.theta defined) whole rotation pairs — columns [0, BK/2) the pairs' first members,
// [BK/2, BK) their partners — so that a tile rotates its rows on load and unrotates their
// gradients by itself. P: an op's Problem (K, theta, rotary_layout). Needs common/recurrent.h.
template <int BK, class P>
PHASOR_DEVICE std::int64_t channel_of(const P& p, std::int64_t t, int i) {
  if (!p.theta.defined()) {
    const std::int64_t c = t * BK + i;
    return c < p.K ? c : -1;
  }
  const std::int64_t pair = t * (BK / 2) + i % (BK / 2);
  if (pair >= p.K / 2) return -1;
  return i < BK / 2 ? pair_a(p.rotary_layout, p.K, pair) : pair_b(p.rotary_layout, p.K, pair);
}
template <int BK, class P>
PHASOR_HOST_DEVICE std::int64_t key_tiles(const P& p) {
  return p.theta.defined() ? ceil_div(p.K / 2, BK / 2) : ceil_div(p.K, BK);
}

}  // namespace
}  // namespace phasor::PHASOR_BACKEND
