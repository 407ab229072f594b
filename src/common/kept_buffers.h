// Internal: per-thread buffers kept across calls, and the limit above which they are released.
//
// Kernels keep their per-item buffers in thread_local work structs, since a block freed after
// every call comes back from the system as new pages on the next (page faults in every call:
// 11% of a FoX forward at T = 1024, 9% of a Gated DeltaNet forward + backward at T = 4096). An
// item whose O(T) buffers exceed kKeptBytes releases them afterwards, so that one long call does
// not hold them for the thread's life.
#pragma once

#include <cstddef>
#include <vector>

namespace phasor::detail {

// The most bytes of O(T) buffers a kernel keeps per thread across calls.
constexpr std::size_t kKeptBytes = std::size_t(8) << 20;

namespace kept_impl {
template <class M>
std::size_t bytes(const M& m) {  // an Eigen matrix or vector
  return static_cast<std::size_t>(m.size()) * sizeof(typename M::Scalar);
}
template <class M>
std::size_t bytes(const std::vector<M>& ms) {
  std::size_t sum = 0;
  for (const M& m : ms) sum += bytes(m);
  return sum;
}
template <class M>
void release(M& m) {
  M().swap(m);
}
template <class M>
void release(std::vector<M>& ms) {
  std::vector<M>().swap(ms);
}
}  // namespace kept_impl

// Releases every buffer given (Eigen matrices and vectors, or std::vectors of them) when together
// they hold more than kKeptBytes; keeps them all otherwise.
template <class... Buffers>
void release_if_large(Buffers&... buffers) {
  if ((kept_impl::bytes(buffers) + ...) > kKeptBytes) (kept_impl::release(buffers), ...);
}

}  // namespace phasor::detail
