// Runs a function on every rank of a Gloo process group inside this process, one thread per rank
// (an in-memory c10d::HashStore for the rendezvous, sockets on the loopback): the distributed
// tests' way of checking many ranks without launching processes. Header-only; needs
// phasor::distributed (LibTorch).
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phasor/distributed.h"

namespace phasor::testing {

// Calls body(rank, group) on world_size threads, each with its own group of the same world.
// Rethrows the first exception any rank threw (after every thread has finished), prefixed with
// the rank. The timeout bounds every collective, so a rank that throws before a collective makes
// the others fail instead of hanging.
inline void run_ranks(
    int world_size, const std::function<void(int rank, const distributed::ProcessGroupPtr&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mutex;
  std::exception_ptr first;
  int first_rank = -1;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto group = distributed::gloo_group(store, rank, world_size, timeout);
        body(rank, group);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) {
          first = std::current_exception();
          first_rank = rank;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first) {
    try {
      std::rethrow_exception(first);
    } catch (const std::exception& e) {
      throw std::runtime_error("rank " + std::to_string(first_rank) + " of " +
                               std::to_string(world_size) + ": " + e.what());
    }
  }
}

}  // namespace phasor::testing
