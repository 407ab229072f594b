// The `phasor` command's subcommands. Each takes the arguments after the program name (argv[0]
// is the subcommand's own name, e.g. "op"), prints its own errors, and returns the process exit
// status: 0 on success, 2 for bad input (usage, arguments, input files), 1 for anything else.
#pragma once

namespace phasor::cli {

// `phasor op NAME --in in.pt --out out.pt [...]`: runs one op on tensors saved with torch.save
// (src/cli/op_command.cpp).
int run_op(int argc, char** argv);

// `phasor demo [...]`: every op through every implementation against the float64 reference
// (src/cli/demo_command.cpp).
int run_demo(int argc, char** argv);

// `phasor tasks sample TASK [...] --out batch.pt`: one batch of a synthetic-task generator;
// `phasor tasks run CONFIG.json [...]`: the experiment runner (src/cli/tasks_command.cpp).
int run_tasks(int argc, char** argv);

}  // namespace phasor::cli
