// `phasor`: dispatches to the subcommands declared in cli/commands.h.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "cli/commands.h"

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
    "                                         seeds); see `phasor tasks run --help`\n";

}  // namespace

// LibTorch's OpenMP threads (and OpenBLAS's) busy-wait after each parallel region by default,
// stealing the cores phasor's own thread pool needs a moment later: training a small model with
// two threads ran 12x slower than with one on a 2-core machine. OMP_WAIT_POLICY=PASSIVE makes them
// sleep instead, but libgomp reads it only when it is loaded, before main() runs, so the process
// re-executes itself once with the variable set (unless the user chose a policy).
static void ensure_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: then run with the default policy
}

int main(int argc, char** argv) {
  ensure_passive_openmp_wait(argv);
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
