// The synthetic-task harness from the installed phasor package: an MQAR batch from the generators
// (phasor::tasks_data, no LibTorch), then a tiny experiment — one GLA arm trained for a few steps
// on parity — through the runner (phasor::tasks_experiment), which writes results.json,
// results.csv, timings.json and the PNG plots into a temporary folder and returns the results
// and timings, printed here as the result table.
// Exit status 1 if a query's label is not the value its key was paired with.
#include <phasor/tasks/data.h>
#include <phasor/tasks/experiment.h>

#include <cstdio>
#include <filesystem>
#include <map>

int main() {
  phasor::tasks::MqarConfig mqar;
  mqar.seq_len = 64;
  mqar.num_kv_pairs = 4;
  mqar.vocab_size = 128;
  const phasor::tasks::Batch b = phasor::tasks::mqar(mqar, 8, /*seed=*/1);
  for (std::int64_t r = 0; r < b.rows; ++r) {
    std::map<std::int64_t, std::int64_t> value_of;  // key → value, from the context k1 v1 … kn vn
    for (std::int64_t i = 0; i < mqar.num_kv_pairs; ++i)
      value_of[b.input(r, 2 * i)] = b.input(r, 2 * i + 1);
    for (std::int64_t t = 0; t < b.cols; ++t)
      if (b.target(r, t) != phasor::tasks::kIgnoreIndex &&
          value_of.at(b.input(r, t)) != b.target(r, t)) {
        std::fprintf(stderr, "row %lld position %lld: label is not the key's value\n",
                     static_cast<long long>(r), static_cast<long long>(t));
        return 1;
      }
  }
  std::printf("mqar: %lld rows of %lld tokens, every query labelled with its key's value\n",
              static_cast<long long>(b.rows), static_cast<long long>(b.cols));

  const auto config = phasor::tasks::parse_experiment_config(nlohmann::json::parse(R"({
    "name": "example",
    "task": {"name": "parity", "train_lengths": [16], "eval_lengths": [16, 32], "eval_batch": 32},
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 1},
    "arms": [{"name": "gla_selective_rope",
              "model": {"mixer": "gla", "pos_encoding": "selective_rope"}}],
    "train": {"steps": 20, "batch_size": 8, "log_every": 0},
    "lr_grid": [0.003],
    "seeds": [0]
  })"));
  phasor::tasks::ExperimentOptions options;
  options.out_dir =
      (std::filesystem::temp_directory_path() / "phasor_example_task_harness").string();
  options.threads = 1;
  options.progress = false;
  const phasor::tasks::ExperimentOutput output = phasor::tasks::run_experiment(config, options);
  std::printf("%s", phasor::tasks::format_result_table(output.results, output.timings).c_str());
  std::filesystem::remove_all(options.out_dir);
  return 0;
}
