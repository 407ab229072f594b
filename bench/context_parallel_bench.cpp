// Context parallelism against one process (issue 15's benchmark): chunk GLA, Gated DeltaNet or
// FoX (parallel_forgetting_attn, HQ = H) at T tokens (default 65,536; FoX, quadratic in T: 8,192),
// B = 1, H = 8, K = V = 128, float32, each process on one thread.
//
//   context_parallel_bench [gla|gdn|fox] [T] [ranks]  launches 1 process, then `ranks` processes
//                                                  (phasor::distributed::launch_local, Gloo on
//                                                  the loopback), and prints one line per rank
//   context_parallel_bench run OP T                one rank (RANK/WORLD_SIZE from the launcher)
//
// Per rank: the forward time (o and the final state), the forward + backward time (loss Σ o·do,
// every gradient), the peak heap on top of the inputs (bench/memory.h: every malloc of the
// process, LibTorch's included), the peak resident set, and the bytes this rank's slice puts on
// the wire (the payload of its collectives, computed from the tensors exchanged).
#include <ATen/ATen.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "memory.h"
#include "phasor/common.h"
#include "phasor/context_parallel.h"
#include "phasor/distributed.h"
#include "phasor/torch.h"

namespace {

constexpr std::int64_t kHeads = 8, kKeyDim = 128, kValueDim = 128;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CPU seconds this process has used (user + system, every thread): unlike the wall time, not
// inflated when other processes share the cores.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Payload bytes one rank sends in the collectives of one forward (and one backward) call with R
// ranks: the header allgather (116 int64 fields, each rank's own sent to each peer in Gloo's
// ring), the maps allgather (1 + H·K·(K + V) numbers; GLA's transitions are diagonal:
// 1 + H·K·(1 + V)), the final-state allreduce (a ring: 2·(R − 1)/R of the N·H·K·V numbers), and
// in the backward pass the Λ allgather (H·K·V numbers) and the d(initial_state) allreduce (here:
// no initial state, only the failure flag).
struct Traffic {
  double forward = 0, backward = 0;
};
Traffic traffic(int ranks, std::int64_t value_heads, bool diagonal) {
  if (ranks == 1) return {};
  const double peers = ranks - 1, f32 = 4, header = 116 * 8;
  const double transition = diagonal ? kKeyDim : static_cast<double>(kKeyDim) * kKeyDim;
  const double map = (1 + static_cast<double>(value_heads) *
                              (transition + static_cast<double>(kKeyDim) * kValueDim)) *
                     f32;
  const double state = static_cast<double>(value_heads) * kKeyDim * kValueDim * f32;
  Traffic t;
  t.forward = peers * (header + map) + 2.0 * peers / ranks * state;
  t.backward = peers * state + 2.0 * peers / ranks * f32;
  return t;
}

int run_rank(const std::string& op, std::int64_t total) {
  phasor::set_num_threads(1);
  at::set_num_threads(1);
  at::set_num_interop_threads(1);
  const auto group = phasor::distributed::init_process_group();
  const int rank = group->getRank(), world = group->getSize();
  const std::int64_t begin = total * rank / world, end = total * (rank + 1) / world;
  const std::int64_t T = end - begin, H = kHeads, K = kKeyDim, V = kValueDim;

  torch::manual_seed(1234 + static_cast<std::uint64_t>(rank));
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor q = at::randn({1, T, H, K}, f32).requires_grad_(true),
                   k = (at::randn({1, T, H, K}, f32) * 0.1).requires_grad_(true),
                   v = at::randn({1, T, H, V}, f32).requires_grad_(true),
                   d_o = at::randn({1, T, H, V}, f32);
  const bool gla = op == "gla", fox = op == "fox";
  const at::Tensor g = gla ? at::log_sigmoid(at::randn({1, T, H, K}, f32) + 4).requires_grad_(true)
                           : at::log_sigmoid(at::randn({1, T, H}, f32) + 4).requires_grad_(true);
  const at::Tensor beta = at::sigmoid(at::randn({1, T, H}, f32)).requires_grad_(true);

  auto forward = [&]() -> phasor::OutputAndState {
    if (fox) {
      if (world == 1) return {phasor::parallel_forgetting_attn(q, k, v, g), c10::nullopt};
      return {phasor::cp::parallel_forgetting_attn(
                  q, k, v, g, c10::nullopt, c10::nullopt, c10::nullopt, 64, c10::nullopt,
                  phasor::RotaryLayout::half_split, c10::nullopt, c10::nullopt, group),
              c10::nullopt};
    }
    if (world == 1) {
      if (gla) return phasor::chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, true);
      return phasor::chunk_gated_delta_rule(q, k, v, g, beta, c10::nullopt, c10::nullopt, true,
                                            c10::nullopt, true);
    }
    if (gla)
      return phasor::cp::chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, true, c10::nullopt, 64,
                                   c10::nullopt, phasor::RotaryLayout::half_split, group);
    return phasor::cp::chunk_gated_delta_rule(q, k, v, g, beta, c10::nullopt, c10::nullopt, true,
                                              c10::nullopt, true, 64, c10::nullopt,
                                              phasor::RotaryLayout::half_split, group);
  };

  group->barrier()->wait();
  phasor::bench::reset_peak_heap();
  auto start = std::chrono::steady_clock::now();
  double cpu_start = cpu_seconds();
  {
    at::NoGradGuard no_grad;
    auto out = forward();
  }
  const double forward_s = seconds_since(start), forward_cpu = cpu_seconds() - cpu_start;
  const double forward_heap = static_cast<double>(phasor::bench::peak_heap_bytes());

  group->barrier()->wait();
  phasor::bench::reset_peak_heap();
  start = std::chrono::steady_clock::now();
  cpu_start = cpu_seconds();
  {
    auto [o, final_state] = forward();
    (o * d_o).sum().backward();
  }
  const double both_s = seconds_since(start), both_cpu = cpu_seconds() - cpu_start;
  const double both_heap = static_cast<double>(phasor::bench::peak_heap_bytes());
  Traffic bytes = traffic(world, H, gla);
  if (fox && world > 1) {
    // FoX sends its keys' rows (k', v in float32, the key-side gate sums in float64) to every
    // later rank in the forward pass; the backward pass sends them again and returns dk, dv and
    // the gate gradient of every earlier rank's rows it received (as many bytes as those rows).
    const double per_token = static_cast<double>(H * K * 4 + H * V * 4 + H * 8);
    const double later = static_cast<double>(world - 1 - rank),
                 earlier_tokens = static_cast<double>(begin);
    bytes.forward = per_token * static_cast<double>(T) * later;
    bytes.backward = bytes.forward + per_token * earlier_tokens;
  }
  group->barrier()->wait();
  std::printf(
      "%s T=%lld ranks=%d rank=%d slice=%lld: forward %.3f s (cpu %.3f s), forward+backward %.3f s "
      "(cpu %.3f s), peak heap "
      "(above inputs) forward %.1f MiB, forward+backward %.1f MiB, peak RSS %.1f MiB, bytes sent "
      "forward %.0f, backward %.0f\n",
      op.c_str(), static_cast<long long>(total), world, rank, static_cast<long long>(T), forward_s,
      forward_cpu, both_s, both_cpu, forward_heap / (1 << 20), both_heap / (1 << 20),
      peak_rss_mib(), bytes.forward, bytes.backward);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string first = argc > 1 ? argv[1] : "gla";
    if (first == "run") {
      if (argc < 4) {
        std::fprintf(stderr, "usage: %s run gla|gdn|fox T\n", argv[0]);
        return 2;
      }
      return run_rank(argv[2], std::atoll(argv[3]));
    }
    const std::string op = first;
    if (op != "gla" && op != "gdn" && op != "fox") {
      std::fprintf(stderr, "usage: %s [gla|gdn|fox] [T] [ranks]\n", argv[0]);
      return 2;
    }
    const std::string total = argc > 2 ? argv[2] : op == "fox" ? "8192" : "65536";
    const int ranks = argc > 3 ? std::atoi(argv[3]) : 2;
    for (int n : {1, ranks}) {
      const int status = phasor::distributed::launch_local(n, {argv[0], "run", op, total});
      if (status != 0) return status;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "context_parallel_bench: %s\n", e.what());
    return 1;
  }
}
