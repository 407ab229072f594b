// phasor beyond one machine: process groups of LibTorch's c10d (Gloo on CPUs), launched the way
// torchrun launches. The context-parallel ops that run on them are in phasor/context_parallel.h;
// the task harness's data-parallel training uses them too.
//
//   #include <phasor/distributed.h>   // CMake: target_link_libraries(app PRIVATE
//   phasor::distributed) auto group = phasor::distributed::init_process_group();   // RANK,
//   WORLD_SIZE, MASTER_ADDR/PORT std::vector<at::Tensor> t{x}; group->allreduce(t)->wait();
//
// phasor does not carry messages itself: every collective is c10d's (ProcessGroupGloo here, any
// c10d::ProcessGroup — NCCL on GPUs, MPI — where LibTorch has it).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace phasor::distributed {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// How long a collective (and the rendezvous) waits before it fails with an error naming the
// operation: a rank that died makes the others fail within this time instead of hanging.
inline constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

// torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK is optional).
struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int local_rank = 0;
};

// The launch environment of this process, or nullopt when none of RANK and WORLD_SIZE is set.
// Throws phasor::Error naming the variable when one is set without the other, or when a value is
// malformed (not an integer, 0 ≤ RANK < WORLD_SIZE, 1 ≤ MASTER_PORT ≤ 65535).
std::optional<LaunchEnvironment> launch_environment();

// A Gloo process group over the rendezvous store `store` (ranks must use the same store or
// stores reaching the same server). Gloo's sockets bind to the interface of `hostname`; an empty
// hostname means the interface GLOO_SOCKET_IFNAME names, else the one this machine's hostname
// resolves to.
ProcessGroupPtr gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                           std::chrono::milliseconds timeout = kDefaultTimeout,
                           const std::string& hostname = "127.0.0.1");

// The process group of this process's launch environment: a c10d::TCPStore served by rank 0 at
// MASTER_ADDR:MASTER_PORT (by torchrun's agent when TORCHELASTIC_USE_AGENT_STORE=True) and a Gloo
// group on it (on the loopback when MASTER_ADDR is 127.0.0.1 or localhost, else as gloo_group with
// an empty hostname). Without a launch environment, a group of one rank (every collective a no-op
// copy), so single-process code runs unchanged.
ProcessGroupPtr init_process_group(std::chrono::milliseconds timeout = kDefaultTimeout);

// A TCP port free on the loopback now (for a local launch).
int free_port();

// Runs `argv` (argv[0] a program path) as `nproc` local processes, ranks 0 … nproc − 1, each
// with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free port) set in
// its environment, like `torchrun --standalone --nproc-per-node nproc`. Each rank leads a process
// group of its own, and stopping a rank means signalling its group, so whatever it started (a
// shell's children, a script's workers) stops with it, as under torchrun. Waits for all; when one
// exits with a failure, every rank's group is terminated (SIGTERM, then SIGKILL after `grace`).
// Returns 0 when every rank succeeded, else the first failing rank's exit status (128 + signal for
// a signal). While it waits, SIGINT, SIGTERM and SIGHUP sent to the calling process (Ctrl-C
// included: the ranks are not in the terminal's foreground group) are forwarded to every rank's
// group the same way; once the ranks have ended, the caller's own handling of that signal is
// restored and the signal raised again (by default the caller then ends of it). A signal the
// caller ignores stays ignored. The ranks end with the launcher: each gets SIGTERM when the
// calling thread ends (Linux's PR_SET_PDEATHSIG), so killing the launcher, even with SIGKILL,
// leaves no rank running (what a rank started is then the rank's to stop). Ranks should not read
// the terminal (a background group doing so is stopped by SIGTTIN). Throws phasor::Error when a
// process cannot be started.
int launch_local(int nproc, const std::vector<std::string>& argv,
                 std::chrono::milliseconds grace = std::chrono::seconds(10));

}  // namespace phasor::distributed
