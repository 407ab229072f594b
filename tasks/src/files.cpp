// Crash-safe output files (phasor/tasks/files.h): temporary file, fsync, rename, fsync of the
// folder.
#include "phasor/tasks/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "check.h"

namespace phasor::tasks {
namespace {

namespace fs = std::filesystem;
using detail::fail;

constexpr const char* kTempInfix = ".tmp.";

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

// The caller's op and argument name the failing path ("checkpoint: argument 'checkpoint_path'").
struct Naming {
  const std::string& op;
  const std::string& argument;
};

[[noreturn]] void fail_at(const Naming& naming, const std::string& path, const std::string& what,
                          int error) {
  fail(naming.op, naming.argument, "a writable file path",
       quoted(path) + " (" + what + ": " + std::strerror(error) + ")");
}

// The folder holding `path` ("." for a bare name).
std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// The test hook's delay (files.h): PHASOR_TASKS_WRITE_DELAY_MS, 0 when unset or not a number.
long write_delay_ms() {
  const char* v = std::getenv("PHASOR_TASKS_WRITE_DELAY_MS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long ms = std::strtol(v, &end, 10);
  return (*end == '\0' && ms > 0) ? ms : 0;
}

// Removes the temporary file when the write does not get to its rename.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  int fd_ = -1;
  bool renamed_ = false;

 private:
  std::string path_;
};

}  // namespace

std::string temp_path_of(const std::string& path) {
  return path + kTempInfix + std::to_string(::getpid());
}

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& op,
                           const std::string& argument) {
  const Naming naming{op, argument};
  if (path.empty()) fail(op, argument, "a file path", "an empty path");
  TempFile tmp(temp_path_of(path));
  tmp.fd_ = ::open(tmp.path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd_ < 0) {
    const int error = errno;
    tmp.renamed_ = true;  // nothing was created: nothing to remove (and never someone else's)
    fail_at(naming, path, "cannot create " + quoted(tmp.path()), error);
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(tmp.fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      fail_at(naming, path, "cannot write " + quoted(tmp.path()), error);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(tmp.fd_) != 0) {
    const int error = errno;
    fail_at(naming, path, "cannot flush " + quoted(tmp.path()), error);
  }
  const int fd = tmp.fd_;
  tmp.fd_ = -1;
  if (::close(fd) != 0) {
    const int error = errno;
    fail_at(naming, path, "cannot close " + quoted(tmp.path()), error);
  }
  if (const long ms = write_delay_ms()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (::rename(tmp.path().c_str(), path.c_str()) != 0) {
    const int error = errno;
    fail_at(naming, path, "cannot rename " + quoted(tmp.path()) + " to it", error);
  }
  tmp.renamed_ = true;
  // The rename is an entry of the folder: durable only once the folder is flushed too. File
  // systems that cannot fsync a folder say EINVAL (or ENOTSUP); the rename is then as durable
  // as they make it.
  const std::string folder = folder_of(path);
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    const int error = errno;
    fail_at(naming, path, "cannot open its folder " + quoted(folder), error);
  }
  const int synced = ::fsync(dir);
  const int error = errno;
  ::close(dir);
  if (synced != 0 && error != EINVAL && error != ENOTSUP)
    fail_at(naming, path, "cannot flush its folder " + quoted(folder), error);
}

std::size_t remove_stale_temp_files(const std::string& folder) {
  std::error_code ec;
  std::size_t removed = 0;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto at = name.rfind(kTempInfix);
    if (at == std::string::npos || at == 0) continue;
    const std::string digits = name.substr(at + std::strlen(kTempInfix));
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const long long pid = std::stoll(digits);
    if (pid <= 0) continue;
    // Signal 0 only asks whether the process exists; EPERM: it does (another user's).
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (it->is_regular_file(rm) && fs::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

}  // namespace phasor::tasks
