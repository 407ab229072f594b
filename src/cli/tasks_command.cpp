// `phasor tasks ...`: the synthetic-task harness from the command line.
//   phasor tasks sample TASK [options] --out batch.pt   one batch of a generator, for torch.load
//   phasor tasks run CONFIG.json [--out DIR] [...]      the experiment runner (tasks/experiment.h)
//   phasor tasks probe CHECKPOINT [--length L] [...]    the parity phase probe of a trained model
//                                                       (tasks/phase_probe.h)
#include <malloc.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/input_error.h"
#include "phasor/common.h"
#include "phasor/distributed.h"
#include "phasor/tasks/data.h"
#include "phasor/tasks/data_parallel.h"
#include "phasor/tasks/experiment.h"
#include "phasor/tasks/phase_probe.h"
#include "phasor/tasks/train.h"

namespace phasor::cli {
namespace {

// ---- phasor tasks sample
// -------------------------------------------------------------------------

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"mqar", "copy", "copy_eval", "parity",
                                                 "s2",   "a3",   "s3",        "s5"};
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The options each task reads (besides --out, --batch, --seed). Any other option given is an
// error rather than silently ignored, so a typo such as `copy --length 5` (copy_eval's option)
// does not produce data of another configuration than the one asked for.
const std::set<std::string>& task_options(const std::string& task) {
  static const std::map<std::string, std::set<std::string>> options = {
      {"mqar", {"--seq-len", "--num-kv-pairs", "--vocab-size", "--power-a", "--zero-filler"}},
      {"copy", {"--seq-len", "--min-len", "--max-len"}},
      {"copy_eval", {"--length"}},
      {"parity", {"--seq-len", "--final-only", "--bos"}},
      {"s2", {"--seq-len", "--final-only", "--bos"}},
      {"a3", {"--seq-len", "--final-only", "--bos"}},
      {"s3", {"--seq-len", "--final-only", "--bos"}},
      {"s5", {"--seq-len", "--final-only", "--bos"}},
  };
  return options.at(task);
}

// The generators name their arguments as in their config structs ("seq_len", "context", ...);
// the command line's user knows them as options. Maps the generator's name to the option.
std::string option_of(const std::string& generator_argument) {
  static const std::map<std::string, std::string> names = {
      {"seq_len", "--seq-len"},           {"context", "--seq-len"}, {"vocab_size", "--vocab-size"},
      {"num_kv_pairs", "--num-kv-pairs"}, {"power_a", "--power-a"}, {"min_len", "--min-len"},
      {"max_len", "--max-len"},           {"length", "--length"},   {"batch", "--batch"},
  };
  const auto it = names.find(generator_argument);
  return it == names.end() ? std::string() : it->second;
}

// Appends "(option --x)" to a generator's error "<op>: argument '<name>': ...".
std::string with_option(const std::string& message) {
  const std::string marker = "argument '";
  const auto begin = message.find(marker);
  if (begin == std::string::npos) return message;
  const auto end = message.find('\'', begin + marker.size());
  if (end == std::string::npos) return message;
  const std::string option =
      option_of(message.substr(begin + marker.size(), end - begin - marker.size()));
  return option.empty() ? message : message + " (option " + option + ")";
}

struct SampleOptions {
  std::string task;
  std::string out_path;
  std::int64_t batch = 4;
  std::uint64_t seed = 0;
  std::optional<std::int64_t> seq_len;  // default per task: mqar 64, copy 256, word problems 64
  std::int64_t num_kv_pairs = 8;
  std::int64_t vocab_size = 8192;
  double power_a = 0.01;
  bool zero_filler = false;
  std::int64_t min_len = 1;
  std::int64_t max_len = 50;
  std::int64_t length = 10;
  bool final_only = false;
  bool bos = false;
};

tasks::Batch generate(const SampleOptions& o) {
  if (o.batch < 1)
    throw InputError("argument '--batch': expected ≥ 1, got " + std::to_string(o.batch));
  const std::string& t = o.task;
  const bool word_problem = t != "mqar" && t != "copy" && t != "copy_eval";
  tasks::WordProblemConfig word;
  if (word_problem) {
    word.group = tasks::group_from_string(t == "parity" ? "S2"
                                          : t == "a3"   ? "A3"
                                          : t == "s2"   ? "S2"
                                          : t == "s3"   ? "S3"
                                                        : "S5");
    word.seq_len = o.seq_len.value_or(64);
    if (word.seq_len < 1)
      throw InputError("argument '--seq-len': expected ≥ 1, got " + std::to_string(word.seq_len));
    word.final_only = o.final_only;
    word.bos = o.bos;
  }
  // A file for torch.load, not a data set: cap the batch at 2^27 tokens (2 GiB of int64 inputs
  // and targets) so that a typo does not exhaust memory.
  const std::int64_t cols = t == "copy_eval" ? 2 * o.length + 3
                            : t == "copy"    ? o.seq_len.value_or(256)
                            : t == "mqar"    ? o.seq_len.value_or(64)
                                             : word.row_length();
  constexpr std::int64_t kMaxTokens = std::int64_t{1} << 27;
  if (cols > 0 && o.batch > kMaxTokens / cols)
    throw InputError("argument '--batch': expected batch · row length ≤ 2^27 tokens, got " +
                     std::to_string(o.batch) + " rows of " + std::to_string(cols) + " tokens");
  if (t == "mqar") {
    tasks::MqarConfig c;
    c.seq_len = o.seq_len.value_or(64);
    c.num_kv_pairs = o.num_kv_pairs;
    c.vocab_size = o.vocab_size;
    c.power_a = o.power_a;
    c.random_filler = !o.zero_filler;
    return tasks::mqar(c, o.batch, o.seed);
  }
  if (t == "copy") {
    tasks::CopyTrainConfig c;
    c.context = o.seq_len.value_or(256);
    c.min_len = o.min_len;
    c.max_len = o.max_len;
    return tasks::copy_train(c, o.batch, o.seed);
  }
  if (t == "copy_eval") return tasks::copy_eval(o.length, o.batch, o.seed);
  return tasks::word_problem(word, o.batch, o.seed);
}

// Writes {"inputs": int64 [B, T], "targets": int64 [B, T], "vocab_size": int64 scalar} with
// torch::pickle_save (the format of Python's torch.save; torch.load reads it).
void write_batch(const tasks::Batch& b, const std::string& path) {
  const auto opts = torch::TensorOptions().dtype(torch::kInt64);
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("inputs", torch::tensor(b.inputs, opts).reshape({b.rows, b.cols}));
  dict.insert("targets", torch::tensor(b.targets, opts).reshape({b.rows, b.cols}));
  dict.insert("vocab_size", torch::tensor(b.vocab_size, opts));
  const std::vector<char> bytes = torch::pickle_save(dict);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out)
    throw InputError("argument '--out': expected a writable path, got '" + path +
                     "' (cannot be written)");
}

// Checks the options given against the task, generates the batch and writes it; bad input throws.
int write_sample(CLI::App& app, const SampleOptions& o) {
  // Options given that the task does not read.
  for (const auto* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (opt->count() == 0 || name.rfind("--", 0) != 0) continue;
    if (name == "--out" || name == "--batch" || name == "--seed" || name == "--help") continue;
    if (!task_options(o.task).count(name)) {
      std::string accepted;
      for (const auto& n : task_options(o.task)) accepted += (accepted.empty() ? "" : ", ") + n;
      throw InputError("argument '" + name + "': expected one of the options of task " + o.task +
                       " (" + accepted + ", --batch, --seed, --out), got " + name);
    }
  }
  const tasks::Batch batch = generate(o);
  write_batch(batch, o.out_path);
  std::printf("%s: %s inputs and targets [%lld, %lld], vocab_size %lld, seed %llu\n",
              o.out_path.c_str(), o.task.c_str(), static_cast<long long>(batch.rows),
              static_cast<long long>(batch.cols), static_cast<long long>(batch.vocab_size),
              static_cast<unsigned long long>(o.seed));
  return 0;
}

int run_sample(CLI::App& app, const SampleOptions& o) {
  // The generators' argument checks name their arguments: with_option adds the option's name.
  return with_bad_input_status(
      "phasor tasks sample: ", [&] { return write_sample(app, o); }, with_option);
}

// ---- phasor tasks run
// ----------------------------------------------------------------------------

struct RunOptions {
  std::string config_path;
  std::string out_dir;
  bool resume = false;
  int threads = 0;
  int kernel_threads = -1;
  int matmul_threads = -1;
  bool quiet = false;
  std::int64_t stop_at_step = 0;
  bool profile = false;
  // Data parallel: --nproc N launches N local ranks of this command (the arguments without
  // --nproc); under a launch environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a rank of
  // --nproc, or set by hand / by a scheduler on several machines) this process is one rank.
  std::optional<int> nproc;
  double timeout_s = 300;  // of every collective and of the rendezvous
  double bucket_mb = 25;   // gradient all-reduce buckets (MiB)
  bool no_overlap = false;
  std::vector<std::string> argv;  // the command line as given, for --nproc's ranks
};

// Training allocates and frees the same tensors of a few hundred KiB every step. By default
// glibc's malloc gives such blocks back to the kernel (mmap above its dynamic threshold, heap top
// trimmed above M_TRIM_THRESHOLD), so every step faulted fresh zero pages back in: ~4,000 page
// faults per step of the quick suite's models, 443k → 58k for a 100-step A3 run, system time
// 1.3 → 0.7 s. Blocks up to 32 MiB (glibc's largest mmap threshold) now stay in the heap and the
// heap is trimmed only above 512 MiB free; the cost is that the peak stays reserved. Where the
// environment sets either (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), it is left alone.
void keep_freed_memory() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

// The ranks of `phasor tasks run ... --nproc N`: this executable with the same arguments but
// --nproc, each with torchrun's variables (phasor::distributed::launch_local).
int launch_ranks(const RunOptions& o) {
  std::vector<std::string> argv;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  argv.push_back(ec ? std::string("/proc/self/exe") : self.string());
  argv.push_back("tasks");
  for (std::size_t i = 1; i < o.argv.size(); ++i) {
    const std::string& a = o.argv[i];
    if (a == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    argv.push_back(a);
  }
  if (!o.quiet)
    std::fprintf(stderr,
                 "phasor tasks run: %d processes × %d thread(s) of LibTorch's ops, on the "
                 "loopback (Gloo)\n",
                 *o.nproc, o.threads > 0 ? o.threads : 1);
  // The ranks end with this launcher, whatever ends it (launch_local).
  const int status = distributed::launch_local(*o.nproc, argv);
  if (status != 0)
    std::fprintf(stderr,
                 "phasor tasks run: data-parallel run failed: a rank exited with status %d\n",
                 status);
  return status;
}

// A run's checked input: its experiment config, and the launch environment when this process is
// one rank of a launched run. Bad input throws InputError (or phasor::Error from the config).
struct RunInput {
  tasks::ExperimentConfig config;
  std::optional<distributed::LaunchEnvironment> env;
};

RunInput checked_run_input(const RunOptions& o) {
  if (o.threads < 0)
    throw InputError("argument '--threads': expected ≥ 0, got " + std::to_string(o.threads));
  if (o.kernel_threads < -1)
    throw InputError("argument '--kernel-threads': expected ≥ 0, got " +
                     std::to_string(o.kernel_threads));
  if (o.matmul_threads < -1 || o.matmul_threads == 0)
    throw InputError("argument '--matmul-threads': expected ≥ 1, got " +
                     std::to_string(o.matmul_threads));
  if (o.stop_at_step < 0)
    throw InputError("argument '--stop-at-step': expected ≥ 0, got " +
                     std::to_string(o.stop_at_step));
  if (o.nproc && *o.nproc < 1)
    throw InputError("argument '--nproc': expected a number of processes ≥ 1, got " +
                     std::to_string(*o.nproc));
  if (!(o.timeout_s > 0) || !std::isfinite(o.timeout_s) || o.timeout_s > 1e6)
    throw InputError("argument '--timeout-s': expected seconds in (0, 10^6], got " +
                     std::to_string(o.timeout_s));
  if (!(o.bucket_mb > 0) || !std::isfinite(o.bucket_mb) || o.bucket_mb > 1e6)
    throw InputError("argument '--bucket-mb': expected MiB in (0, 10^6], got " +
                     std::to_string(o.bucket_mb));
  RunInput input;
  input.env = distributed::launch_environment();
  if (o.nproc && input.env)
    throw InputError(
        "argument '--nproc': expected no launch environment (this process already is rank " +
        std::to_string(input.env->rank) + " of " + std::to_string(input.env->world_size) +
        ": RANK and WORLD_SIZE are set), got --nproc " + std::to_string(*o.nproc));
  input.config = tasks::load_experiment_config(o.config_path);
  const int world = o.nproc ? *o.nproc : input.env ? input.env->world_size : 1;
  if (input.config.train.batch_size % world != 0)
    throw InputError(
        (o.nproc ? std::string("argument '--nproc'") : std::string("environment WORLD_SIZE")) +
        ": expected a number of processes dividing config.train.batch_size = " +
        std::to_string(input.config.train.batch_size) +
        " (data parallel: each process trains on batch_size / processes rows of every batch), "
        "got " +
        std::to_string(world));
  return input;
}

int run_run(const RunOptions& o) {
  std::string prefix = "phasor tasks run: ";
  RunInput input;
  // A bad config is bad input (exit 2); failures while running are not (exit 1).
  const int input_status = with_bad_input_status(prefix, [&] {
    input = checked_run_input(o);
    return 0;
  });
  if (input_status != 0) return input_status;
  const auto& [config, env] = input;
  if (o.nproc && *o.nproc > 1) return launch_ranks(o);
  tasks::ExperimentOptions options;
  bool writer = true;
  try {
    if (env && env->world_size > 1) {
      prefix = "phasor tasks run (rank " + std::to_string(env->rank) + " of " +
               std::to_string(env->world_size) + "): ";
      const auto timeout = std::chrono::milliseconds(std::llround(o.timeout_s * 1e3));
      tasks::DataParallelOptions dp;
      dp.bucket_bytes = std::max<std::int64_t>(1, std::llround(o.bucket_mb * (1 << 20)));
      dp.overlap = !o.no_overlap;
      dp.timeout = timeout;
      options.data_parallel =
          std::make_shared<tasks::DataParallel>(distributed::init_process_group(timeout), dp);
      writer = options.data_parallel->writer();
    }
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::fprintf(stderr, "%sjoining the process group at %s:%d failed: %s\n", prefix.c_str(),
                 env->master_addr.c_str(), env->master_port,
                 c10_error ? c10_error->what_without_backtrace() : e.what());
    return 1;
  }
  options.out_dir = o.out_dir.empty() ? config.name : o.out_dir;
  options.resume = o.resume;
  options.threads = o.threads;
  options.kernel_threads = o.kernel_threads;
  options.matmul_threads = o.matmul_threads;
  options.progress = !o.quiet;
  options.stop_at_step = o.stop_at_step;
  options.profile = o.profile;
  keep_freed_memory();
  try {
    const tasks::ExperimentOutput output = tasks::run_experiment(config, options);
    if (!writer) return 0;  // rank 0 prints
    std::fputs(tasks::format_result_table(output.results, output.timings).c_str(), stdout);
    if (o.profile) std::fputs(("\n" + tasks::format_time_table(output.timings)).c_str(), stdout);
    std::printf(
        "results: %s/results.json, results.csv, timings.json, table.txt, accuracy_vs_length.png, "
        "loss.png\n",
        options.out_dir.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what());
    return 1;
  } catch (const c10::Error& e) {  // a collective failing inside LibTorch (data parallel)
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what_without_backtrace());
    return 1;
  }
}

// ---- phasor tasks probe -------------------------------------------------------------------------

struct ProbeOptions {
  std::string checkpoint;
  std::int64_t length = 1024;
  std::int64_t rows = 256;
  std::uint64_t seed = 0;
  std::string json_path;
  bool pairs = false;
  // --remove-drift, --remove-decay: the smallest horizon (positions) of a pair whose drift /
  // forget-gate decay is removed
  std::optional<std::int64_t> remove_drift, remove_decay;
};

// Scores `model` on `rows`: its correct prefix (positions) and sequence accuracy.
std::pair<std::int64_t, double> parity_score(tasks::LanguageModel& model,
                                             const tasks::Batch& rows) {
  const tasks::EvalResult eval = tasks::evaluate(model, rows, 16);
  return {tasks::correct_prefix_length(eval.metrics.prefix_sequence_accuracy),
          eval.metrics.sequence_accuracy};
}

// Layer 0's pairs whose horizon is ≥ min_horizon.
std::vector<tasks::PhasePairProbe> pairs_from(const tasks::PhaseProbe& probe,
                                              std::int64_t min_horizon) {
  std::vector<tasks::PhasePairProbe> chosen;
  for (const tasks::PhasePairProbe& p : probe.pairs)
    if (p.layer == 0 && p.horizon >= min_horizon) chosen.push_back(p);
  return chosen;
}

// --remove-drift / --remove-decay: removes the drift (tasks::remove_parity_phase_drift) and the
// forget-gate decay (tasks::remove_parity_gate_decay) of layer 0's pairs whose horizon is at least
// the option's value, each where given, and scores the edited model on the probe's rows and on
// as many held-out rows (seed + 1), beside the model as trained. Returns the JSON of it.
nlohmann::json edit_and_score(tasks::LanguageModel& model, const tasks::PhaseProbe& probe,
                              const tasks::WordProblemConfig& c, const tasks::Batch& rows,
                              const ProbeOptions& o) {
  const std::uint64_t heldout_seed = o.seed + 1;
  const tasks::Batch heldout = tasks::word_problem(c, o.rows, heldout_seed);
  const auto heldout_before = parity_score(model, heldout);
  nlohmann::json j;
  if (o.remove_drift) {
    const std::vector<tasks::PhaseDriftEdit> edits =
        tasks::remove_parity_phase_drift(model, pairs_from(probe, *o.remove_drift));
    std::printf(
        "\nthe drift of %zu rotation pairs of layer 0 (horizon ≥ %lld) removed "
        "(tasks::remove_parity_phase_drift):\n%5s %4s %8s %16s %16s\n",
        edits.size(), static_cast<long long>(*o.remove_drift), "head", "pair", "harmonic",
        "drift_zero rad", "drift_one rad");
    nlohmann::json pairs = nlohmann::json::array();
    for (const tasks::PhaseDriftEdit& e : edits) {
      std::printf("%5lld %4lld %8d %16.6f %16.6f\n", static_cast<long long>(e.head),
                  static_cast<long long>(e.pair), e.harmonic, e.drift_zero, e.drift_one);
      pairs.push_back({{"head", e.head},
                       {"pair", e.pair},
                       {"harmonic", e.harmonic},
                       {"drift_zero", e.drift_zero},
                       {"drift_one", e.drift_one}});
    }
    j["drift"] = {{"min_horizon", *o.remove_drift}, {"pairs", pairs}};
  }
  if (o.remove_decay) {
    const std::vector<tasks::GateDecayEdit> edits =
        tasks::remove_parity_gate_decay(model, pairs_from(probe, *o.remove_decay));
    std::printf(
        "\nthe forget-gate decay of %zu rotation pairs of layer 0 (horizon ≥ %lld) removed "
        "(tasks::remove_parity_gate_decay):\n%5s %4s %16s %16s\n",
        edits.size(), static_cast<long long>(*o.remove_decay), "head", "pair", "log_gate_zero",
        "log_gate_one");
    nlohmann::json pairs = nlohmann::json::array();
    for (const tasks::GateDecayEdit& e : edits) {
      std::printf("%5lld %4lld %16.3e %16.3e\n", static_cast<long long>(e.head),
                  static_cast<long long>(e.pair), e.log_gate_zero, e.log_gate_one);
      pairs.push_back({{"head", e.head},
                       {"pair", e.pair},
                       {"log_gate_zero", e.log_gate_zero},
                       {"log_gate_one", e.log_gate_one}});
    }
    j["decay"] = {{"min_horizon", *o.remove_decay}, {"pairs", pairs}};
  }
  const auto after = parity_score(model, rows), heldout_after = parity_score(model, heldout);
  std::printf(
      "after: correct prefix %lld positions, sequence accuracy %.3f; held-out rows (seed %llu): "
      "%lld positions, %.3f as trained → %lld positions, %.3f after\n",
      static_cast<long long>(after.first), after.second,
      static_cast<unsigned long long>(heldout_seed), static_cast<long long>(heldout_before.first),
      heldout_before.second, static_cast<long long>(heldout_after.first), heldout_after.second);
  j["correct_prefix_length"] = after.first;
  j["sequence_accuracy"] = after.second;
  j["heldout_seed"] = heldout_seed;
  j["heldout_as_trained"] = {{"correct_prefix_length", heldout_before.first},
                             {"sequence_accuracy", heldout_before.second}};
  j["heldout_after"] = {{"correct_prefix_length", heldout_after.first},
                        {"sequence_accuracy", heldout_after.second}};
  return j;
}

// The parity phase probe (phase_probe.h) of a checkpoint's model on `rows` random parity rows of
// `length` elements (with a BOS when the model's vocabulary has one), printed per head (per pair
// with --pairs) beside the model's own correct prefix on the same rows.
int probe_checkpoint(const ProbeOptions& o) {
  if (o.length < 1 || o.length > tasks::kMaxSequenceLength)
    throw InputError("--length: expected 1 … 2^20 elements, got " + std::to_string(o.length));
  if (o.rows < 1 || o.rows > tasks::kMaxBatchTokens / (o.length + 1))
    throw InputError("--rows: expected ≥ 1 rows of at most 2^26 tokens in all, got " +
                     std::to_string(o.rows));
  for (const auto& [flag, value] :
       {std::pair{"--remove-drift", o.remove_drift}, std::pair{"--remove-decay", o.remove_decay}})
    if (value && *value < 0)
      throw InputError(std::string(flag) + ": expected a horizon ≥ 0 positions, got " +
                       std::to_string(*value));
  tasks::LanguageModel model = tasks::load_model(o.checkpoint);
  model->eval();
  tasks::WordProblemConfig c;
  c.group = tasks::Group::S2;
  c.seq_len = o.length;
  c.bos = tasks::parity_vocabulary_has_bos(model);
  const tasks::Batch rows = tasks::word_problem(c, o.rows, o.seed);
  const tasks::PhaseProbe probe = tasks::parity_phase_probe(model, rows);
  if (probe.heads.empty())
    throw InputError("the checkpoint's model has no Selective RoPE layer: nothing to probe");
  const auto [correct, sequence_accuracy] = parity_score(model, rows);
  std::printf(
      "%s: parity rows of %lld elements%s (%lld rows, seed %llu): the model's correct prefix "
      "%lld positions, sequence accuracy %.3f\n",
      o.checkpoint.c_str(), static_cast<long long>(o.length), c.bos ? " after a BOS" : "",
      static_cast<long long>(o.rows), static_cast<unsigned long long>(o.seed),
      static_cast<long long>(correct), sequence_accuracy);
  std::printf("%5s %4s %4s %8s %7s %11s %11s %8s %13s\n", "layer", "head", "pair", "harmonic",
              "horizon", "drift_zero", "drift_one", "jitter", "drift_horizon");
  for (const tasks::PhasePairProbe& p : o.pairs ? probe.pairs : probe.heads)
    std::printf("%5lld %4lld %4lld %8d %7lld %11.6f %11.6f %8.4f %13.1f\n",
                static_cast<long long>(p.layer), static_cast<long long>(p.head),
                static_cast<long long>(p.pair), p.harmonic, static_cast<long long>(p.horizon),
                p.drift_zero, p.drift_one, p.jitter, p.drift_horizon);
  const std::optional<nlohmann::json> edited =
      o.remove_drift || o.remove_decay ? std::optional(edit_and_score(model, probe, c, rows, o))
                                       : std::nullopt;
  if (!o.json_path.empty()) {
    nlohmann::json j = tasks::to_json(probe);
    if (edited) j["edited"] = *edited;
    j["checkpoint"] = o.checkpoint;
    j["rows"] = o.rows;
    j["seed"] = o.seed;
    j["correct_prefix_length"] = correct;
    j["sequence_accuracy"] = sequence_accuracy;
    std::ofstream out(o.json_path);
    out << j.dump(1) << "\n";
    if (!out) throw InputError("--json: cannot write '" + o.json_path + "'");
  }
  return 0;
}

int run_probe(const ProbeOptions& o) {
  return with_bad_input_status("phasor tasks probe: ", [&] { return probe_checkpoint(o); });
}

}  // namespace

int run_tasks(int argc, char** argv) {
  CLI::App app{"The synthetic-task harness: sample a generator's batch, or run an experiment grid.",
               "phasor tasks"};
  app.require_subcommand(1, 1);

  SampleOptions s;
  CLI::App* sample = app.add_subcommand(
      "sample",
      "Write one batch of a task's generator as a dict {inputs: int64 [B, T], targets: int64 "
      "[B, T], vocab_size: int64} for torch.load (targets −100 where nothing is scored).");
  sample->add_option("TASK", s.task, "one of " + joined(task_names()))
      ->required()
      ->check(CLI::IsMember(task_names()));
  sample->add_option("--out", s.out_path, "output .pt file")->required();
  sample->add_option("--batch", s.batch, "rows (default 4)");
  sample->add_option("--seed", s.seed, "generator seed (default 0)");
  sample->add_option("--seq-len", s.seq_len,
                     "row length: mqar (default 64), copy (context, default 256), parity/s2/a3/"
                     "s3/s5 (default 64)");
  sample->add_option("--num-kv-pairs", s.num_kv_pairs, "mqar: key-value pairs (default 8)");
  sample->add_option("--vocab-size", s.vocab_size, "mqar: vocabulary (default 8192)");
  sample->add_option("--power-a", s.power_a, "mqar: gap distribution exponent (default 0.01)");
  sample->add_flag("--zero-filler", s.zero_filler, "mqar: filler 0 instead of random tokens");
  sample->add_option("--min-len", s.min_len, "copy: shortest string (default 1)");
  sample->add_option("--max-len", s.max_len, "copy: longest string (default 50)");
  sample->add_option("--length", s.length, "copy_eval: string length (default 10)");
  sample->add_flag("--final-only", s.final_only,
                   "parity/s2/a3/s3/s5: score only the last position");
  sample->add_flag("--bos", s.bos,
                   "parity/s2/a3/s3/s5: start every row with a BOS token (id |G|, no target)");

  RunOptions r;
  CLI::App* run = app.add_subcommand(
      "run",
      "Train and evaluate every arm × learning rate × seed of an experiment config (JSON, see "
      "tasks/include/phasor/tasks/experiment.h) and write results.json, results.csv and PNG plots "
      "into the output folder; print the result table.");
  run->add_option("CONFIG", r.config_path, "experiment config (.json)")->required();
  run->add_option("--out", r.out_dir, "output folder (default: the config's name)");
  run->add_flag("--resume", r.resume,
                "skip the runs finished in the output folder, continue interrupted ones from "
                "their checkpoints (results.json and results.csv come out the same as without "
                "the interruption)");
  run->add_option("--threads", r.threads,
                  "threads of LibTorch's ops and phasor's kernels (default 0: LibTorch 1, phasor "
                  "all cores)");
  run->add_option("--kernel-threads", r.kernel_threads,
                  "phasor's kernel threads, overriding --threads (0: all cores)");
  run->add_option("--matmul-threads", r.matmul_threads,
                  "threads of LibTorch's matrix products (and their backward), overriding "
                  "--threads (default: as --threads when given, else 2 on any machine, so that "
                  "results do not depend on its core count)");
  run->add_flag("--quiet", r.quiet, "no progress lines on stderr");
  run->add_option("--stop-at-step", r.stop_at_step,
                  "stop every run after this step, as train.stop_at_step (default 0: the "
                  "config's); for speed measurements");
  run->add_option("--nproc", r.nproc,
                  "data parallel: train on N local processes (ranks on the loopback, c10d/Gloo), "
                  "each on batch_size / N rows of every batch, gradients all-reduced; each uses "
                  "--threads / --kernel-threads. Several machines: run this command (without "
                  "--nproc) once per rank with torchrun's variables RANK, WORLD_SIZE, "
                  "MASTER_ADDR (rank 0's machine), MASTER_PORT set");
  run->add_option("--timeout-s", r.timeout_s,
                  "data parallel: seconds a collective (and the rendezvous) may wait for the "
                  "other ranks before failing (default 300)");
  run->add_option("--bucket-mb", r.bucket_mb,
                  "data parallel: MiB of gradients per all-reduce bucket (default 25)");
  run->add_flag("--no-overlap", r.no_overlap,
                "data parallel: all-reduce the gradients after the backward pass instead of "
                "launching each bucket from it as soon as its gradients are ready");
  run->add_flag("--profile", r.profile,
                "time phasor's kernels and LibTorch's ops during training and print each run's "
                "time per step by phase (also timings.json: runs[].time_breakdown)");

  ProbeOptions pr;
  CLI::App* probe = app.add_subcommand(
      "probe",
      "The parity phase probe (tasks/include/phasor/tasks/phase_probe.h) of a trained model: for "
      "each head of its Selective RoPE layers, the rotation pair whose phase tracks the parity of "
      "random parity rows longest (horizon, in positions), its harmonic and drift, beside the "
      "model's own correct prefix on the same rows.");
  probe
      ->add_option("CHECKPOINT", pr.checkpoint,
                   "a checkpoint of `phasor tasks run` (<out>/checkpoints/*.ckpt)")
      ->required();
  probe->add_option("--length", pr.length, "elements per row (default 1024)");
  probe->add_option("--rows", pr.rows, "rows (default 256)");
  probe->add_option("--seed", pr.seed, "the rows' generator seed (default 0)");
  probe->add_option("--json", pr.json_path, "also write the probe as JSON to this file");
  probe->add_flag("--pairs", pr.pairs, "print every rotation pair, not only each head's best");
  probe->add_option(
      "--remove-drift", pr.remove_drift,
      "then remove the drift of layer 0's rotation pairs whose horizon is at least this many "
      "positions (tasks::remove_parity_phase_drift: needs a linear phase path, i.e. conv_silu "
      "false and no phase gate) and score the edited model on the same rows and on held-out rows "
      "(seed + 1)");
  probe->add_option(
      "--remove-decay", pr.remove_decay,
      "then set the GLA forget gate of layer 0's rotation pairs whose horizon is at least this "
      "many positions to 1 (tasks::remove_parity_gate_decay), after the drift edit when both are "
      "given, and score the edited model as --remove-drift does");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (probe->parsed()) return run_probe(pr);
  if (run->parsed()) {
    r.argv.assign(argv, argv + argc);
    return run_run(r);
  }
  return run_sample(*sample, s);
}

}  // namespace phasor::cli
