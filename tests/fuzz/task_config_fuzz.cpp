// Fuzz target: the task-config parser (phasor/tasks/experiment.h, parse_experiment_config_text):
// JSON text → ExperimentConfig — the task and its generator options, the model of every arm
// (ModelConfig and the layer options, each arm's model built once), the TrainConfig, the
// learning-rate grid and the seeds.
//
// Every input must end in a config or a phasor::Error whose message names the offending key and
// says what was expected; any other exception, a crash or a sanitizer report is a finding. Sizes
// (lengths, vocabularies, widths, layers, steps, …) at the edges of int64 must be refused at parse
// time: a config asking for a giant model or batch must not allocate it (libFuzzer's
// -malloc_limit_mb, by default the -rss_limit_mb that scripts/fuzz.sh sets, reports any single
// allocation above it).
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "phasor/common.h"
#include "phasor/tasks/experiment.h"

namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "task_config_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);  // LibTorch's own threads only slow a fuzzer down
  phasor::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  torch::manual_seed(0);  // the probe models draw their parameters: the same for every run
  try {
    const phasor::tasks::ExperimentConfig config =
        phasor::tasks::parse_experiment_config_text(text, "fuzz.json");
    // What the runner relies on, for a config that parses.
    if (config.arms.empty() || config.lrs.empty() || config.seeds.empty() ||
        config.task.eval_lengths.empty())
      finding("a parsed config without arms, learning rates, seeds or evaluation lengths");
    for (const auto& arm : config.arms)
      if (arm.model.vocab_size < config.task.vocab_size())
        finding("arm '" + arm.name + "' has a vocabulary smaller than the task's");
  } catch (const phasor::Error& e) {
    const std::string what = e.what();
    if (what.find("argument '") == std::string::npos || what.find("expected") == std::string::npos)
      finding("a phasor::Error without \"argument '<key>'\" and \"expected\": " + what);
  } catch (const std::exception& e) {
    finding(std::string("an exception other than phasor::Error: ") + e.what());
  }
  return 0;
}
