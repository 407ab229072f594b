// phasor::tasks — the experiment runner: a grid of model arms × learning rates × seeds on one
// synthetic task, trained (tasks/train.h), evaluated at several lengths, summarised in
// results.json / results.csv / PNG plots / a table. `phasor tasks run CONFIG.json` calls it.
//
// Config (JSON; every key optional unless marked, unknown keys are errors):
// clang-format off
//   {
//     "name": "mqar_quick",                       required; [A-Za-z0-9_.-]+, the default out dir
//     "task": {                                   required
//       "name": "mqar",                           required: mqar | copy | parity | s2 | a3 |
//                                                 s3 | s5
//       generator options (data.h), by task:
//         mqar:   "num_kv_pairs" 8, "vocab_size" 8192, "power_a" 0.01, "random_filler" true,
//                 "eval_points": [[256, 16], [256, 32]]  further evaluations at (length,
//                                                 num_kv_pairs) pairs other than the training's
//                                                 (Zoology's test grid); distinct, each valid
//                                                 for the generator. eval_lengths keep
//                                                 num_kv_pairs.
//         copy:   "context" 256, "min_len" 1, "max_len" 50   (training rows)
//         parity, s2, a3, s3, s5: "final_only" false, "bos" false (rows start with a BOS
//                 token, so a length counts the elements after it)
//       "train_lengths": [64],                    sequence lengths of the training batches, used
//                                                 in turn (step s uses train_lengths[(s−1) mod n]);
//                                                 not for copy (its rows have `context` tokens)
//       "eval_lengths": [64, 128, 256],           required; sequence lengths (copy: string
//                                                 lengths, rows of 2·len + 3 tokens)
//       "eval_batch": 256,                        rows per evaluation
//       "early_stop_length": 512                  the length of the training's periodic
//                                                 evaluation (early stopping at
//                                                 train.target_accuracy); one of eval_lengths
//                                                 or the reference length;
//                                                 default the reference length. The official
//                                                 Selective RoPE state-tracking code stops on its
//                                                 test length (512 after training at 128)
//     },
//     "model": {...},                             ModelConfig defaults of every arm (model.h);
//                                                 vocab_size defaults to the task's
//     "arms": [{"name": "gla_rope",               required, ≥ 1 arm, distinct names
//               "model": {"mixer": "gla", "pos_encoding": "rope", ...}}],  merged into "model"
//                                                 (JSON merge patch); "layers" = num_layers
//     "train": {...},                             TrainConfig (train.h) without lr, seed,
//                                                 checkpoint_path, resume_from (the runner's)
//     "lr_grid": [1e-3, 3e-3],                    required, positive
//     "seeds": [0, 1]                             required, distinct non-negative integers
//   }
// The reference length is max(train_lengths) (copy: max_len): it is always evaluated, the
// training's periodic evaluation (early stopping) uses it unless early_stop_length names another
// evaluation length, and the best learning rate of an arm is
// the one with the highest sequence accuracy at that length after training, averaged over the
// seeds (the first such lr on ties).
//
// Determinism: run (arm, lr, seed) seeds torch with `seed` before building the model and trains
// on the stream batch_seed(seed, step); the evaluation batches depend on (seed, length) only
// (MQAR eval points: on (seed, length, num_kv_pairs)), so every arm and lr of a seed is scored on
// the same rows.
//
// clang-format on
// Output folder:
//   results.json    the config, the machine (threads; data parallel: processes), every run (losses,
//   periodic
//                   evaluations with their length "evals_length", per-length token / sequence
//                   accuracy, loss and cumulative sequence-accuracy curve, copy: char_accuracy;
//                   parity runs of Selective RoPE arms: "phase_probe", phase_probe.h's probe of the
//                   longest evaluation's rows, with its "eval_length") and the summary (best lr per
//                   arm; means over seeds, data.h's correct_prefix_length among them). No
//                   clock readings: for a config, seeds and thread counts its bytes are the
//                   same whether the grid ran in one go or was killed and resumed any number
//                   of times (tests/tasks_kill_resume_test.py)
//   results.csv     one row per arm × lr × seed × eval length (and MQAR eval point); the column
//                   num_kv_pairs is empty for the other tasks; the last, correct_prefix_length,
//                   is data.h's correct_prefix_length of the row's curve. Bit-identical likewise
//   timings.json    the clock: this invocation's wall time, the training time, and per run
//                   whether it was resumed, its wall time, tokens_per_s and time_breakdown
//                   (train.h's TimeBreakdown) — of the invocation that finished the run —
//                   and finished_earlier: true for a run read back by a --resume invocation
//                   (the table then says its wall time is this invocation's)
//   table.txt       the result table (format_result_table), as `phasor tasks run` prints it
//   accuracy_vs_length.png, token_accuracy_vs_length.png   per arm: best lr, mean over seeds
//   loss.png        training loss (smoothed) per arm: best lr, mean over seeds
//   checkpoints/    <arm>.lr<lr>.seed<seed>.ckpt while a run trains, .json once it finished;
//                   with resume, finished runs are read back (an error if they were made with
//                   other task / model / train settings) and unfinished ones continue from
//                   their checkpoint (train.h checks its settings). A run cut short by
//                   train.stop_at_step is reported but stays unfinished.
// Crash safety: every file is replaced atomically and durably (files.h: temporary file
// "<name>.tmp.<pid>", fsync, rename), checkpoints carry checksums (train.h), so a kill at any
// moment leaves complete files only; --resume continues from there, removing the temporary files
// of killed writers, and gives the same results.json and results.csv as an uninterrupted run.
// Evaluations run at most 2^24 logits per forward pass (long MQAR lengths with V = 8192).
//
// Errors: phasor::Error "experiment config: argument 'config.arms[2].model.mixer': expected one of
// attention, fox, gated_deltanet, gla, got 'glaa'" (the key path names the offending value).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"
#include "phasor/tasks/train.h"

namespace phasor::tasks {

// Size limits of a config, checked when it is parsed (before anything is generated or built):
// every sequence length (train_lengths, eval_lengths, eval_points, copy's context and string
// lengths) at most kMaxSequenceLength tokens, the MQAR vocabulary at most kMaxVocabSize
// (model.h), and a batch — train.batch_size rows of the longest training row, eval_batch rows of
// the longest evaluation row (copy: 2·length + 3 tokens) — at most kMaxBatchTokens tokens.
inline constexpr std::int64_t kMaxSequenceLength = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxBatchTokens = std::int64_t{1} << 26;

struct TaskSpec {
  std::string name;  // mqar | copy | parity | s2 | a3 | s3 | s5
  MqarConfig mqar;
  CopyTrainConfig copy;
  WordProblemConfig word;
  std::vector<std::int64_t> train_lengths;  // empty for copy
  std::vector<std::int64_t> eval_lengths;   // includes the reference length (appended if absent)
  std::int64_t eval_batch = 256;
  std::int64_t early_stop_length = 0;  // the periodic evaluation's length; 0: the reference length
  // MQAR only: evaluations at other (length, num_kv_pairs) than the training's; results.json
  // reports them per run as "eval_points" and in the summary as "points".
  struct MqarPoint {
    std::int64_t length = 0;
    std::int64_t num_kv_pairs = 0;
  };
  std::vector<MqarPoint> mqar_eval_points;

  std::int64_t reference_length() const;  // max(train_lengths), copy: copy.max_len
  // The length of the training's periodic evaluation: early_stop_length, else the reference one.
  std::int64_t early_stop_length_or_reference() const;
  std::int64_t vocab_size() const;
  // A training batch of `rows` rows at the training length of `step` (≥ 1).
  Batch train_batch(std::int64_t step, std::int64_t rows, std::uint64_t seed) const;
  // An evaluation batch at `length` (copy: copy_eval rows of strings of that length).
  Batch eval_batch_at(std::int64_t length, std::int64_t rows, std::uint64_t seed) const;
  Batch eval_batch_at(const MqarPoint& point, std::int64_t rows, std::uint64_t seed) const;
};

struct Arm {
  std::string name;
  ModelConfig model;
};

struct ExperimentConfig {
  std::string name;
  TaskSpec task;
  std::vector<Arm> arms;
  TrainConfig train;
  std::vector<double> lrs;
  std::vector<std::uint64_t> seeds;
  nlohmann::json source;  // the config as given
};

// Parses and validates (including building each arm's model once, so that bad layer options are
// reported before anything trains). Throws phasor::Error with the key path.
ExperimentConfig parse_experiment_config(const nlohmann::json& config);
ExperimentConfig load_experiment_config(const std::string& path);
// From JSON text (`source` names it in messages): also a phasor::Error for text that is not JSON.
ExperimentConfig parse_experiment_config_text(const std::string& text,
                                              const std::string& source = "config");

// LibTorch's matrix products' threads when neither ExperimentOptions::threads nor matmul_threads
// is set: a constant, not the machine's core count, so that a run gives the same bits on any
// machine (with the same OpenBLAS kernels), as phasor's kernels do for any thread count.
constexpr int kDefaultMatmulThreads = 2;

struct ExperimentOptions {
  std::string out_dir;  // created if missing
  bool resume = false;  // skip finished runs, continue interrupted ones
  // Threads of LibTorch's ops (at::set_num_threads) and, unless kernel_threads ≥ 0, of phasor's
  // kernels (phasor::set_num_threads). 0: LibTorch 1, phasor's default (every core, or
  // PHASOR_NUM_THREADS) — the fastest split for the harness's small models (experiment.cpp).
  int threads = 0;
  int kernel_threads = -1;  // phasor's kernel threads; −1: as `threads`; 0: phasor's default
  // Threads of LibTorch's matrix products (a MatmulThreads, train.h); −1: as `threads` when it
  // is set (> 0), else kDefaultMatmulThreads.
  int matmul_threads = -1;
  bool progress = true;  // per-run progress lines on stderr
  // Stop every run after this step as if interrupted (train.stop_at_step; 0: the config's), e.g.
  // to measure speed on a short run; --resume continues such runs later.
  std::int64_t stop_at_step = 0;
  // Time LibTorch ops and phasor kernels during training (an OpTimer), so that each run's
  // "time_breakdown" in timings.json splits its forward and backward passes (format_time_table).
  bool profile = false;
  // Data parallel (phasor/tasks/data_parallel.h): every rank of the group calls run_experiment
  // with the same config and options; each run trains on all of them (train.batch_size must be
  // divisible by the number of ranks) and evaluates with them; only rank 0 writes into out_dir
  // (and prints progress). With resume, every rank reads out_dir (a folder all of them see) and
  // they must find the same finished runs and checkpoints. results.json's "machine" and
  // timings.json gain "processes"; the results equal the single-process run's up to
  // floating-point summation order. Null, or a group of one: one process.
  std::shared_ptr<DataParallel> data_parallel;
};

struct ExperimentOutput {
  nlohmann::json results;  // results.json's contents
  nlohmann::json timings;  // timings.json's contents
};
// Runs the grid, writes the output folder, returns results.json's and timings.json's contents.
ExperimentOutput run_experiment(const ExperimentConfig& config, const ExperimentOptions& options);

// The result table printed by `phasor tasks run` (and table.txt): one line per arm with its best
// lr and the mean sequence accuracy at each evaluation length, then the mean accuracy at the
// reference length for every lr of every arm, then the mean correct prefix there for every lr
// (data.h: correct_prefix_length; how far half the rows stay right), then the number of runs
// and, with timings, the training and wall time.
std::string format_result_table(const nlohmann::json& results,
                                const nlohmann::json& timings = nlohmann::json());

// The training-speed table printed by `phasor tasks run --profile`: per run of timings.json,
// training tokens/s and the milliseconds per step of each phase of its "time_breakdown" (train.h's
// TimeBreakdown; forward and backward split into phasor kernels, other LibTorch ops and the rest
// when timed; data parallel's wait for the all-reduces, sync_s, counts as "other"), then, where
// timed by name (time_breakdown.ops), each run's eight slowest ops in ms per step.
std::string format_time_table(const nlohmann::json& timings);

}  // namespace phasor::tasks
