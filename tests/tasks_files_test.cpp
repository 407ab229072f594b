// phasor::tasks crash-safe files (phasor/tasks/files.h): write_file_atomically replaces a file
// whole — a reader during the write, and a writer killed with SIGKILL in the middle of it, leave
// the previous complete file — its errors name the path, and remove_stale_temp_files removes
// exactly the temporary files of dead writers.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "phasor/common.h"
#include "phasor/tasks/files.h"

namespace phasor::tasks {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("phasor_tasks_files_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string contents(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The pid of a process that existed and is gone (a child that exited and was reaped).
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

// Sets PHASOR_TASKS_WRITE_DELAY_MS for the scope.
struct WriteDelay {
  explicit WriteDelay(int ms) {
    ::setenv("PHASOR_TASKS_WRITE_DELAY_MS", std::to_string(ms).c_str(), 1);
  }
  ~WriteDelay() { ::unsetenv("PHASOR_TASKS_WRITE_DELAY_MS"); }
};

// Waits (up to 10 s) until `path` holds exactly `expected`. A writer's temporary file exists from
// its open on, before its bytes are written, so existence alone is no sign the write is complete
// (a writer killed then leaves an empty temporary file: CI saw that under AddressSanitizer).
bool comes_to_hold(const fs::path& path, const std::string& expected) {
  for (int i = 0; i < 10000; ++i) {
    if (fs::exists(path) && contents(path) == expected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST(TasksFiles, WritesAndReplacesWholeFiles) {
  const fs::path dir = fresh_dir("replace");
  const fs::path path = dir / "out.json";
  write_file_atomically(path.string(), "first");
  EXPECT_EQ(contents(path), "first");
  const std::string big(3 << 20, 'x');  // several write() calls' worth
  write_file_atomically(path.string(), big);
  EXPECT_EQ(contents(path), big);
  write_file_atomically(path.string(), "");
  EXPECT_EQ(contents(path), "");
  write_file_atomically(path.string(), std::string("a\0b", 3));
  EXPECT_EQ(contents(path), std::string("a\0b", 3));
  EXPECT_EQ(names_in(dir), std::set<std::string>{"out.json"});  // no temporary file left
  EXPECT_EQ(temp_path_of(path.string()), path.string() + ".tmp." + std::to_string(::getpid()));
}

// While a write sleeps between its complete temporary file and the rename (the test hook), a
// reader sees the old file, and the temporary file already holds all the new bytes.
TEST(TasksFiles, ReadersSeeTheOldFileUntilTheRename) {
  const fs::path dir = fresh_dir("reader");
  const fs::path path = dir / "results.csv";
  write_file_atomically(path.string(), "old");
  const WriteDelay delay(2000);
  std::thread writer([&] { write_file_atomically(path.string(), "new contents"); });
  const fs::path tmp = temp_path_of(path.string());
  const bool complete = comes_to_hold(tmp, "new contents");
  EXPECT_EQ(contents(path), "old");
  writer.join();
  ASSERT_TRUE(complete);
  EXPECT_EQ(contents(path), "new contents");
  EXPECT_FALSE(fs::exists(tmp));
}

// A writer killed with SIGKILL in the middle of a write leaves the previous file whole and its
// temporary file behind; remove_stale_temp_files removes that one and nothing else.
TEST(TasksFiles, AWriterKilledMidWriteLeavesThePreviousFile) {
  const fs::path dir = fresh_dir("killed");
  const fs::path path = dir / "run.ckpt";
  write_file_atomically(path.string(), "checkpoint of step 10");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setenv("PHASOR_TASKS_WRITE_DELAY_MS", "10000", 1);
    try {
      write_file_atomically(path.string(), "checkpoint of step 20");
    } catch (...) {
    }
    ::_exit(0);
  }
  const fs::path tmp = path.string() + ".tmp." + std::to_string(child);
  const bool complete = comes_to_hold(tmp, "checkpoint of step 20");
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(complete);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(contents(path), "checkpoint of step 10");
  EXPECT_EQ(contents(tmp), "checkpoint of step 20");
  // A live process's temporary file (this one's, and pid 1's) and names that only look alike
  // stay; the killed writer's goes.
  const std::string own = temp_path_of((dir / "results.json").string());
  std::ofstream(own) << "in progress";
  std::ofstream((dir / "table.txt.tmp.1").string()) << "init's";
  std::ofstream((dir / "loss.png.tmp.").string()) << "no pid";
  std::ofstream((dir / "loss.png.tmp.12ab").string()) << "not a pid";
  std::ofstream((dir / "notes.tmp").string()) << "no pid";
  EXPECT_EQ(remove_stale_temp_files(dir.string()), 1u);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(own));
  EXPECT_EQ(names_in(dir).size(), 6u);
  // Another dead writer's file; a missing folder has none.
  std::ofstream((dir / ("x.json.tmp." + std::to_string(dead_pid()))).string()) << "stale";
  EXPECT_EQ(remove_stale_temp_files(dir.string()), 1u);
  EXPECT_EQ(remove_stale_temp_files((dir / "missing").string()), 0u);
}

TEST(TasksFiles, ErrorsNameThePathAndLeaveNothingBehind) {
  const fs::path dir = fresh_dir("errors");
  const std::string missing = (dir / "no_such_folder" / "results.json").string();
  const std::string e1 = error_of([&] { write_file_atomically(missing, "x"); });
  EXPECT_NE(e1.find("write_file_atomically: argument 'path': expected a writable file path, got '" +
                    missing + "' (cannot create"),
            std::string::npos)
      << e1;
  EXPECT_NE(e1.find("No such file or directory"), std::string::npos) << e1;
  // The caller's op and argument.
  const std::string e2 =
      error_of([&] { write_file_atomically(missing, "x", "checkpoint", "checkpoint_path"); });
  EXPECT_EQ(
      e2.rfind("checkpoint: argument 'checkpoint_path': expected a writable file path, got '" +
                   missing + "'",
               0),
      0u)
      << e2;
  // A folder in the way: the rename fails, the temporary file is removed again.
  const fs::path folder = dir / "plot.png";
  fs::create_directories(folder / "inside");
  const std::string e3 = error_of([&] { write_file_atomically(folder.string(), "png"); });
  EXPECT_NE(e3.find("'" + folder.string() + "' (cannot rename"), std::string::npos) << e3;
  EXPECT_EQ(names_in(dir), std::set<std::string>{"plot.png"});
  EXPECT_NE(error_of([] { write_file_atomically("", "x"); }).find("expected a file path"),
            std::string::npos);
  // A bare file name is written in the current folder.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  write_file_atomically("bare.txt", "here");
  fs::current_path(cwd);
  EXPECT_EQ(contents(dir / "bare.txt"), "here");
}

}  // namespace
}  // namespace phasor::tasks
