// phasor::tasks — crash-safe output files. Every file the harness writes (checkpoints, run
// records, results.json / .csv, the result table, the PNG plots) goes through
// write_file_atomically, so that a reader — or a run resumed with --resume after a crash, a
// SIGKILL or a power loss — finds either the previous complete file or the new complete one,
// never a torn one.
//
//   phasor::tasks::write_file_atomically("out/results.json", results.dump(1));
//
// Plain C++17 and POSIX (no LibTorch).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace phasor::tasks {

// Replaces `path` with `bytes`, atomically and durably: the bytes go to "<path>.tmp.<pid>" in the
// same folder (same file system, so that the rename is atomic), which is flushed to the disk
// (fsync), renamed over `path` (POSIX rename: readers see the old or the new file), and then the
// folder is fsync'ed so that the rename itself survives a power loss. On any failure the
// temporary file is removed and phasor::Error names `path` and the cause, as an argument
// `argument` of `op` ("write_file_atomically: argument 'path': expected a writable file path, got
// 'out/x.json' (cannot create 'out/x.json.tmp.123': No such file or directory)").
//
// Test hook: with the environment variable PHASOR_TASKS_WRITE_DELAY_MS=n (n ≥ 0 milliseconds),
// every write sleeps n ms after the temporary file is complete and before the rename, so that a
// test can kill the process in the middle of a write with certainty (tests/
// tasks_kill_resume_test.py).
void write_file_atomically(const std::string& path, std::string_view bytes,
                           const std::string& op = "write_file_atomically",
                           const std::string& argument = "path");

// The name of the temporary file of a write by this process: "<path>.tmp.<pid>".
std::string temp_path_of(const std::string& path);

// Removes the temporary files "<name>.tmp.<pid>" that writers killed mid-write left in `folder`
// (not recursive): those whose process <pid> no longer exists. Files of live processes (another
// writer, this one) are left alone. Returns how many were removed; a missing folder has none.
// Readers never look at these files, so leaving them is harmless; this only tidies up.
std::size_t remove_stale_temp_files(const std::string& folder);

}  // namespace phasor::tasks
