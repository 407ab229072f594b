// phasor/distributed.h: the launch environment, Gloo groups on the loopback, the local launcher.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "phasor/common.h"
#include "phasor/distributed.h"
#include "phasor/testing/distributed.h"

namespace {

using phasor::distributed::launch_environment;

// Sets environment variables for one test and restores them.
class ScopedEnvironment {
 public:
  ScopedEnvironment(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (auto [name, value] : values) ::setenv(name, value, 1);
  }
  ~ScopedEnvironment() {
    for (auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const phasor::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LaunchEnvironment, AbsentWhenUnset) {
  ScopedEnvironment env({});
  EXPECT_FALSE(launch_environment().has_value());
}

TEST(LaunchEnvironment, ReadsTorchrunVariables) {
  ScopedEnvironment env({{"RANK", "2"},
                         {"WORLD_SIZE", "4"},
                         {"MASTER_ADDR", "10.0.0.7"},
                         {"MASTER_PORT", "1234"},
                         {"LOCAL_RANK", "0"}});
  const auto e = launch_environment();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->master_addr, "10.0.0.7");
  EXPECT_EQ(e->master_port, 1234);
  EXPECT_EQ(e->local_rank, 0);
}

TEST(LaunchEnvironment, MalformedValuesNameTheVariable) {
  {
    ScopedEnvironment env({{"RANK", "1"}});
    EXPECT_NE(error_of([] { launch_environment(); }).find("WORLD_SIZE"), std::string::npos);
  }
  {
    ScopedEnvironment env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
    EXPECT_NE(error_of([] { launch_environment(); }).find("RANK"), std::string::npos);
  }
  {
    ScopedEnvironment env({{"RANK", "0"}, {"WORLD_SIZE", "2x"}});
    EXPECT_NE(error_of([] { launch_environment(); }).find("got '2x'"), std::string::npos);
  }
  {
    ScopedEnvironment env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
    EXPECT_NE(error_of([] { launch_environment(); }).find("MASTER_PORT"), std::string::npos);
  }
}

TEST(GlooGroup, AllReduceOverThreeRanks) {
  phasor::testing::run_ranks(3, [](int rank, const phasor::distributed::ProcessGroupPtr& group) {
    EXPECT_EQ(group->getRank(), rank);
    EXPECT_EQ(group->getSize(), 3);
    std::vector<at::Tensor> t{torch::full({4}, static_cast<double>(rank + 1), torch::kFloat64)};
    group->allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t[0], torch::full({4}, 6.0, torch::kFloat64)));
  });
}

TEST(GlooGroup, SingleProcessWithoutEnvironment) {
  ScopedEnvironment env({});
  auto group = phasor::distributed::init_process_group();
  EXPECT_EQ(group->getSize(), 1);
  std::vector<at::Tensor> t{torch::arange(3, torch::kFloat64)};
  group->allreduce(t)->wait();
  EXPECT_TRUE(torch::equal(t[0], torch::arange(3, torch::kFloat64)));
}

TEST(GlooGroup, DeadRankMakesOthersFailWithinTimeout) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(phasor::testing::run_ranks(
                   2,
                   [](int rank, const phasor::distributed::ProcessGroupPtr& group) {
                     if (rank == 1) throw std::runtime_error("rank 1 dies");
                     std::vector<at::Tensor> t{torch::ones({2})};
                     group->allreduce(t)->wait();
                   },
                   std::chrono::seconds(3)),
               std::runtime_error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(LaunchLocal, EveryRankSeesItsEnvironment) {
  // Each rank checks its variables and exits 0 only if they are right.
  const int status = phasor::distributed::launch_local(
      3, {"/bin/sh", "-c",
          "[ \"$WORLD_SIZE\" = 3 ] && [ \"$RANK\" -ge 0 ] && [ \"$RANK\" -lt 3 ] && "
          "[ \"$LOCAL_RANK\" = \"$RANK\" ] && [ \"$MASTER_ADDR\" = 127.0.0.1 ] && "
          "[ \"$MASTER_PORT\" -gt 0 ]"});
  EXPECT_EQ(status, 0);
}

// Whether process `pid` has ended: gone, or a zombie not yet reaped (its new parent may be slow).
bool process_ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const std::size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'Z' ||
         line[close + 2] == 'X';
}

// A folder of its own for one test's files, removed at the end.
class TempFolder {
 public:
  explicit TempFolder(const std::string& name)
      : path_(testing::TempDir() + name + "_" + std::to_string(::getpid())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempFolder() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Shell text that writes the pid `pid` (a shell expression: $$, $!) to <dir>/<name><RANK>, whole
// (written aside, then renamed), so that a test reads either nothing or the complete pid.
std::string record_pid(const std::string& dir, const std::string& name, const std::string& pid) {
  const std::string file = dir + "/" + name + "$RANK";
  return "echo " + pid + " > " + file + ".tmp && mv " + file + ".tmp " + file;
}

// The pids recorded by record_pid under `name` for ranks 0 … nproc − 1 (those written by now).
std::vector<pid_t> recorded_pids(const std::string& dir, const std::string& name, int nproc) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nproc; ++rank) {
    std::ifstream file(dir + "/" + name + std::to_string(rank));
    pid_t pid = 0;
    if (file >> pid) pids.push_back(pid);
  }
  return pids;
}

// recorded_pids once every rank has written its pid, or what there is after 20 s.
std::vector<pid_t> await_recorded_pids(const std::string& dir, const std::string& name, int nproc) {
  std::vector<pid_t> pids;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pids.size() < static_cast<std::size_t>(nproc) &&
         std::chrono::steady_clock::now() < deadline) {
    pids = recorded_pids(dir, name, nproc);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pids;
}

// A rank's shell command that starts `sleep 60` in the background and records its pid as
// <dir>/child<RANK>, so a test can check it ended with the rank.
std::string start_background_sleep(const std::string& dir) {
  return "sleep 60 & " + record_pid(dir, "child", "$!");
}

TEST(LaunchLocal, AFailingRankStopsTheOthers) {
  const auto start = std::chrono::steady_clock::now();
  const int status = phasor::distributed::launch_local(
      3, {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60"},
      std::chrono::milliseconds(500));
  EXPECT_EQ(status, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// Stopping a rank stops what it started: each rank leads a process group and the launcher
// signals the groups (as torchrun does), so a shell's background child ends with it — the
// failed rank's too — instead of outliving the launch (and holding its output pipe open).
TEST(LaunchLocal, AFailingRankStopsWhatEveryRankStarted) {
  const TempFolder dir("launch_local_children");
  const std::string d = dir.path();
  // Rank 1 fails once all three have started their child, so that there is something to stop.
  const std::string command =
      start_background_sleep(d) + "; if [ \"$RANK\" = 1 ]; then while [ ! -f " + d +
      "/child0 ] || [ ! -f " + d + "/child2 ]; do sleep 0.05; done; exit 3; fi; wait";
  const auto start = std::chrono::steady_clock::now();
  const int status =
      phasor::distributed::launch_local(3, {"/bin/sh", "-c", command}, std::chrono::seconds(5));
  EXPECT_EQ(status, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  const std::vector<pid_t> children = recorded_pids(d, "child", 3);
  ASSERT_EQ(children.size(), 3u) << "the ranks did not start their children";
  for (pid_t pid : children) {
    EXPECT_TRUE(process_ended(pid)) << "a rank's child " << pid << " outlived the launch";
    ::kill(pid, SIGKILL);  // in case it did not end: no stray sleep
  }
}

// SIGTERM (or SIGINT, SIGHUP) sent to the launcher reaches every rank's group, and the launcher
// then ends of that signal as it would have without the launch.
TEST(LaunchLocal, ASignalToTheLauncherReachesEveryRankAndItsChildren) {
  const TempFolder dir("launch_local_signal");
  const std::string d = dir.path();
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const int status = phasor::distributed::launch_local(
        2, {"/bin/sh", "-c", start_background_sleep(d) + "; wait"}, std::chrono::seconds(5));
    ::_exit(status == 0 ? 0 : 100 + status % 100);  // reached only if the signal was lost
  }
  const std::vector<pid_t> children = await_recorded_pids(d, "child", 2);
  ::kill(launcher, SIGTERM);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  ASSERT_EQ(children.size(), 2u) << "the ranks did not start their children";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)
      << "the launcher should end of the SIGTERM it forwarded; wait status " << status;
  for (pid_t pid : children) {
    EXPECT_TRUE(process_ended(pid)) << "a rank's child " << pid << " outlived the launcher";
    ::kill(pid, SIGKILL);
  }
}

TEST(LaunchLocal, KillingTheLauncherEndsItsRanks) {
  const TempFolder folder("launch_local");
  const std::string& dir = folder.path();
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {  // each rank writes its pid (exec: the sleep keeps it) and sleeps
    phasor::distributed::launch_local(
        2, {"/bin/sh", "-c", record_pid(dir, "rank", "$$") + " && exec sleep 60"});
    ::_exit(0);
  }
  const std::vector<pid_t> ranks = await_recorded_pids(dir, "rank", 2);
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  ASSERT_EQ(ranks.size(), 2u) << "the ranks did not start";
  const auto start = std::chrono::steady_clock::now();
  for (pid_t pid : ranks) {
    while (!process_ended(pid) &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(process_ended(pid)) << "rank process " << pid << " outlived its launcher";
    ::kill(pid, SIGKILL);  // in case it did not end: no stray sleep
  }
}

TEST(LaunchLocal, BadArgumentsAreNamed) {
  EXPECT_NE(error_of([] { phasor::distributed::launch_local(0, {"true"}); }).find("'nproc'"),
            std::string::npos);
  EXPECT_NE(error_of([] { phasor::distributed::launch_local(2, {}); }).find("'argv'"),
            std::string::npos);
}

}  // namespace
