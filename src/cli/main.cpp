// `phasor`: dispatches to the subcommands declared in cli/commands.h.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "phasor/tasks/blas.h"

namespace {

constexpr const char* kUsage =
    "usage: phasor <command> [options]\n"
    "\n"
    "commands:\n"
    "  op NAME --in in.pt --out out.pt [...]  run one op on tensors saved with torch.save\n"
    "                                         (NAME: gla, gated_delta_rule, forgetting_attn or an\n"
    "                                         fla name such as chunk_gla); see `phasor op --help`\n"
    "  demo [...]                             every op through every implementation against the\n"
    "                                         float64 reference, with timings; see `phasor demo "
    "--help`\n"
    "  tasks sample TASK --out batch.pt [...]  one batch of a synthetic task (mqar, copy,\n"
    "                                         copy_eval, parity, s2, a3, s3, s5) for torch.load;\n"
    "                                         see `phasor tasks sample --help`\n"
    "  tasks run CONFIG.json [--out DIR]      train and evaluate an experiment grid (arms x lr x\n"
    "                                         seeds); see `phasor tasks run --help`\n"
    "  tasks probe CHECKPOINT [--length L]    the parity phase probe of a trained Selective RoPE\n"
    "                                         model; see `phasor tasks probe --help`\n";

}  // namespace

// Settings that the libraries read only when they are loaded, before main() runs, so the process
// re-executes itself once with them set (each only where the user has not set it):
//  * OMP_WAIT_POLICY=PASSIVE. LibTorch's OpenMP threads (and OpenBLAS's) busy-wait after each
//    parallel region by default, stealing the cores phasor's own thread pool needs a moment
//    later: training a small model with two threads ran 12x slower than with one on a 2-core
//    machine. PASSIVE makes them sleep instead.
//  * OPENBLAS_CORETYPE, where OpenBLAS did not recognise the CPU and fell back to its generic
//    kernels (phasor/tasks/blas.h): the quick suite trains 1.84x faster on an Emerald Rapids Xeon
//    with its AVX-512 kernels.
// Only the commands that train or time (`tasks run`, `demo`) need them: `op` and `tasks sample`
// make one call each, where neither setting changes a result and a second start of LibTorch
// (~0.6 s) would be most of the command's time (the CLI tests run `phasor op` ~100 times).
static void reexecute_with_load_time_settings(int argc, char** argv) {
  const bool trains_or_times =
      argc >= 2 &&
      (std::strcmp(argv[1], "demo") == 0 ||
       (argc >= 3 && std::strcmp(argv[1], "tasks") == 0 && std::strcmp(argv[2], "run") == 0));
  if (!trains_or_times) return;
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && setenv("OMP_WAIT_POLICY", "PASSIVE", 1) == 0)
    changed = true;
  if (const char* core = phasor::tasks::suggested_openblas_core())
    if (setenv("OPENBLAS_CORETYPE", core, 1) == 0) changed = true;
  // execv returns only on failure: then run with the libraries' defaults.
  if (changed) execv("/proc/self/exe", argv);
}

int main(int argc, char** argv) {
  reexecute_with_load_time_settings(argc, argv);
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  try {
    // The subcommand sees its own name as argv[0].
    if (command == "op") return phasor::cli::run_op(argc - 1, argv + 1);
    if (command == "demo") return phasor::cli::run_demo(argc - 1, argv + 1);
    if (command == "tasks") return phasor::cli::run_tasks(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phasor %s: %s\n", command.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "phasor: unknown command '%s'; expected one of: op, demo, tasks\n\n%s",
               command.c_str(), kUsage);
  return 2;
}
