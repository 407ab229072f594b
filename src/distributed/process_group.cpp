// Process groups from torchrun's environment, and the local launcher (phasor/distributed.h).
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "phasor/common.h"
#include "phasor/distributed.h"

namespace phasor::distributed {
namespace {

// The integer value of environment variable `name` in [lo, hi], or nullopt when it is unset.
std::optional<int> int_variable(const char* name, long lo, long hi) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno != 0 || value < lo || value > hi) {
    throw Error("phasor::distributed: environment variable " + std::string(name) +
                ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got '" + text + "'");
  }
  return static_cast<int>(value);
}

}  // namespace

std::optional<LaunchEnvironment> launch_environment() {
  const auto world_size = int_variable("WORLD_SIZE", 1, 1 << 20);
  const auto rank = int_variable("RANK", 0, (1 << 20) - 1);
  if (!rank && !world_size) return std::nullopt;
  if (!rank || !world_size) {
    throw Error(std::string("phasor::distributed: environment variable ") +
                (rank ? "WORLD_SIZE" : "RANK") + ": expected it set beside " +
                (rank ? "RANK" : "WORLD_SIZE") + " (torchrun's launch environment), got it unset");
  }
  if (*rank >= *world_size) {
    throw Error(
        "phasor::distributed: environment variable RANK: expected a rank below "
        "WORLD_SIZE = " +
        std::to_string(*world_size) + ", got " + std::to_string(*rank));
  }
  LaunchEnvironment env;
  env.rank = *rank;
  env.world_size = *world_size;
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    env.master_addr = addr;
  }
  env.master_port = int_variable("MASTER_PORT", 1, 65535).value_or(env.master_port);
  env.local_rank = int_variable("LOCAL_RANK", 0, (1 << 20) - 1).value_or(env.rank);
  return env;
}

ProcessGroupPtr gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                           std::chrono::milliseconds timeout, const std::string& hostname) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(
        "phasor::distributed::gloo_group: argument 'rank': expected 0 ≤ rank < world_size "
        "= " +
        std::to_string(world_size) + ", got " + std::to_string(rank));
  }
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  if (!hostname.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  } else if (const char* name = std::getenv("GLOO_SOCKET_IFNAME"); name != nullptr && *name) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  store->setTimeout(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

ProcessGroupPtr init_process_group(std::chrono::milliseconds timeout) {
  const auto env = launch_environment();
  if (!env) return gloo_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, timeout);
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env->master_port);
  // Rank 0 serves the store, except under torchrun's agent, which serves it itself and says so
  // (TORCHELASTIC_USE_AGENT_STORE=True, as Python's env:// rendezvous reads it).
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  options.isServer =
      env->rank == 0 && !(agent_store != nullptr && std::string(agent_store) == "True");
  options.numWorkers = static_cast<std::size_t>(env->world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(env->master_addr, options);
  // Gloo's sockets: on the loopback for a run on one machine; otherwise on the interface
  // GLOO_SOCKET_IFNAME names, or the one this machine's hostname resolves to (Gloo's default).
  const bool local = env->master_addr == "127.0.0.1" || env->master_addr == "localhost";
  return gloo_group(store, env->rank, env->world_size, timeout, local ? "127.0.0.1" : "");
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    throw Error(std::string("phasor::distributed::free_port: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string message = std::strerror(errno);
    ::close(fd);
    throw Error("phasor::distributed::free_port: bind on 127.0.0.1: " + message);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

namespace {

// The signal that asked the launcher to stop while launch_local waits (0: none). A handler may
// only store to a volatile sig_atomic_t; the waiting loop forwards it to the ranks.
volatile std::sig_atomic_t pending_signal = 0;
extern "C" void record_signal(int signal) {
  pending_signal = signal;
}

// Sends `signal` to every process of each rank's process group: the rank and whatever it started
// (a shell's children, a training script's workers), as torchrun's agent does (os.killpg on
// processes started with start_new_session). A group with no process left gives ESRCH, ignored.
void signal_groups(const std::vector<pid_t>& groups, int signal) {
  for (pid_t group : groups) ::kill(-group, signal);
}

// Whether any of `groups` has a process that has not ended. kill(-group, 0) cannot say: it
// succeeds on a zombie, and an orphan's zombie waits for its new parent to reap it, which need
// not be prompt (a container's first process). So /proc: field 3 of /proc/<pid>/stat is the
// state (Z, X: ended), field 5 the process group.
bool any_live_process(const std::vector<pid_t>& groups) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return false;
  bool live = false;
  while (const dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const std::size_t close = line.rfind(')');  // the name may hold spaces and parentheses
    if (close == std::string::npos) continue;
    std::istringstream fields(line.substr(close + 1));
    char state = 0;
    long parent = 0, group = 0;
    if (!(fields >> state >> parent >> group) || state == 'Z' || state == 'X') continue;
    if (std::find(groups.begin(), groups.end(), static_cast<pid_t>(group)) != groups.end()) {
      live = true;
      break;
    }
  }
  ::closedir(proc);
  return live;
}

}  // namespace

int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace) {
  if (nproc < 1) {
    throw Error("phasor::distributed::launch_local: argument 'nproc': expected ≥ 1, got " +
                std::to_string(nproc));
  }
  if (argv.empty()) {
    throw Error("phasor::distributed::launch_local: argument 'argv': expected a program, got none");
  }
  const std::string port = std::to_string(free_port());
  const pid_t launcher = ::getpid();
  // While the ranks run, SIGINT / SIGTERM / SIGHUP sent to the launcher (Ctrl-C reaches only the
  // terminal's foreground group, which the ranks have left) are forwarded to every rank's group;
  // once the ranks have ended, the launcher's own dispositions come back and the signal is raised
  // again, so the caller ends (or handles it) as it would have without the launch.
  const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction previous[3];
  struct sigaction record {};
  record.sa_handler = record_signal;
  sigemptyset(&record.sa_mask);
  pending_signal = 0;
  for (int i = 0; i < 3; ++i) {
    ::sigaction(forwarded[i], nullptr, &previous[i]);
    // A signal the launcher ignores (nohup's SIGHUP) stays ignored, and the ranks inherit that.
    if (previous[i].sa_handler != SIG_IGN) ::sigaction(forwarded[i], &record, nullptr);
  }
  auto restore = [&] {
    for (int i = 0; i < 3; ++i) ::sigaction(forwarded[i], &previous[i], nullptr);
  };
  std::vector<pid_t> children;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      const std::string message = std::strerror(errno);
      signal_groups(children, SIGKILL);
      for (pid_t child : children) ::waitpid(child, nullptr, 0);
      restore();
      throw Error("phasor::distributed::launch_local: fork of rank " + std::to_string(rank) + ": " +
                  message);
    }
    if (pid == 0) {
      // Each rank leads a process group of its own, so that stopping it stops everything it
      // started. Set by both sides (here and in the launcher) so that the group exists before
      // either one goes on.
      ::setpgid(0, 0);
      for (int i = 0; i < 3; ++i) ::sigaction(forwarded[i], &previous[i], nullptr);
      // The rank ends with the launcher, whatever ends it (SIGKILL included), so that no rank is
      // left computing and writing without it: SIGTERM when the thread that forked it exits
      // (this call waits for every rank, so that is the launcher's end). It survives exec.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(128 + SIGTERM);  // it ended before the prctl
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "phasor::distributed::launch_local: cannot run '%s': %s\n", args[0],
                   std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // EACCES once the rank has exec'd: it has then set its group itself
    children.push_back(pid);
  }
  // Wait for every rank; on the first failure (or a forwarded signal), terminate the rest: they
  // would otherwise wait on their collectives until the timeout.
  int first_failure = 0;
  int stopping_signal = 0;
  std::vector<bool> done(children.size(), false);
  std::size_t remaining = children.size();
  auto deadline = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  while (remaining > 0) {
    if (pending_signal != 0 && stopping_signal == 0) {
      stopping_signal = pending_signal;
      signal_groups(children, stopping_signal);
      deadline = std::min(deadline, std::chrono::steady_clock::now() + grace);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t i = 0; i < children.size(); ++i) {
        if (children[i] != pid || done[i]) continue;
        done[i] = true;
        --remaining;
        const int code = WIFEXITED(status)     ? WEXITSTATUS(status)
                         : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                               : 1;
        if (code != 0 && first_failure == 0) {
          first_failure = code;
          if (stopping_signal == 0) {
            std::fprintf(stderr,
                         "phasor: rank %zu of %d failed (exit status %d); stopping the "
                         "others\n",
                         i, nproc, code);
            // Every group, the failed rank's too: what it started must not outlive it.
            signal_groups(children, SIGTERM);
            deadline = std::min(deadline, std::chrono::steady_clock::now() + grace);
          }
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (!killed && std::chrono::steady_clock::now() > deadline) {
      signal_groups(children, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // After a failure or a signal, what the ranks started ends too: their leaders are gone, the
  // groups' other processes got the same signal; they have until the grace period's end, then
  // SIGKILL.
  if (first_failure != 0 || stopping_signal != 0) {
    while (any_live_process(children) && std::chrono::steady_clock::now() <= deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    signal_groups(children, SIGKILL);
  }
  restore();
  if (stopping_signal != 0) ::raise(stopping_signal);
  return first_failure;
}

}  // namespace phasor::distributed
