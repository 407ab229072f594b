// phasor::tasks — training of the task harness's LanguageModel: AdamW with linear warmup and
// cosine decay, gradient clipping, periodic evaluation with early stopping, a progress line,
// checkpoints with exact resume, and a learning-rate × seed grid.
//
//   namespace pt = phasor::tasks;
//   pt::TrainConfig tc;  tc.steps = 2000; tc.lr = 1e-3; tc.seed = 1; tc.target_accuracy = 0.99;
//   tc.checkpoint_path = "run.ckpt"; tc.checkpoint_every = 200;
//   pt::BatchFn data = pt::make_batch_stream(
//       [cfg](std::int64_t n, std::uint64_t seed) { return pt::mqar(cfg, n, seed); },
//       tc.batch_size, tc.seed);
//   pt::Batch held_out = pt::mqar(cfg, 256, pt::batch_seed(tc.seed, -1));
//   pt::EvalFn eval = [&](pt::LanguageModel& m) { return pt::evaluate(m, held_out); };
//   torch::manual_seed(tc.seed);
//   pt::LanguageModel model(model_config);
//   pt::TrainResult r = pt::train(model, tc, data, eval, pt::stderr_progress());
//
// Determinism. Training batch i is data(i), a pure function of (seed, i) (make_batch_stream
// derives the generator's seed with batch_seed); the parameters come from torch's generator,
// seeded by the caller before building the model; the phasor kernels give the same bits for any
// thread count, and ATen's CPU ops are deterministic for a fixed number of threads (fix it with
// at::set_num_threads). So a run is a function of (configs, seed) on a given machine and thread
// count, and resuming from a checkpoint continues it bit for bit: the checkpoint holds the
// parameters and buffers, the AdamW state, the step (= the data stream position), torch's
// generator state and the history of losses and evaluations.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"

namespace phasor::tasks {

class DataParallel;  // phasor/tasks/data_parallel.h

// Size limits of a TrainConfig (validate): the history keeps a loss and an accuracy per step.
inline constexpr std::int64_t kMaxSteps = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxBatchSize = std::int64_t{1} << 20;

struct TrainConfig {
  std::int64_t steps = 1000;     // total optimizer steps (the schedule's length), ≤ kMaxSteps
  std::int64_t batch_size = 32;  // ≤ kMaxBatchSize
  double lr = 1e-3;              // peak learning rate
  double weight_decay = 0.1;     // AdamW decoupled decay, on matrices only (see train.cpp)
  double beta1 = 0.9, beta2 = 0.98, adam_eps = 1e-8;
  // Linear warmup over warmup_steps (if ≥ 0) or else warmup_fraction · steps, then cosine decay
  // from lr to min_lr_ratio · lr at the last step.
  std::int64_t warmup_steps = -1;
  double warmup_fraction = 0.1;
  double min_lr_ratio = 0.1;
  double grad_clip = 1.0;         // max global ℓ2 norm of the gradient; 0 disables clipping
  std::uint64_t seed = 0;         // data stream seed (and the default model seed of lr_grid)
  std::int64_t eval_every = 100;  // evaluate every n steps and at the end (0: only at the end)
  // Stop after an evaluation whose metric reaches target_accuracy (≤ 0: never stop early).
  double target_accuracy = 0.0;
  std::string target_metric = "token";  // "token" | "sequence" accuracy
  std::int64_t log_every = 10;          // progress every n steps (0: never)
  std::int64_t checkpoint_every = 0;    // save every n steps (0: never; also saved at the end
                                        // whenever checkpoint_path is set)
  std::string checkpoint_path;          // where checkpoints are written (atomically, checksummed)
  std::string resume_from;              // a checkpoint to continue from (must exist)
  // Stop after this step as if interrupted (0: run to `steps`); the schedule still spans `steps`.
  // For time-sliced runs, and for the resume test.
  std::int64_t stop_at_step = 0;
};
void to_json(nlohmann::json& j, const TrainConfig& config);
void from_json(const nlohmann::json& j, TrainConfig& config);  // throws phasor::Error
void validate(const TrainConfig& config);
// The learning rate of step s ∈ [1, steps] (the s-th optimizer update):
//   warmup W: lr · s / W for s ≤ W;
//   then lr · (m + (1 − m) · ½ (1 + cos(π (s − W) / (steps − W)))), m = min_lr_ratio,
// which is lr right after warmup and m · lr at s = steps.
double learning_rate(const TrainConfig& config, std::int64_t step);

// ---- data ---------------------------------------------------------------------------------------
// The training batch of a step (steps count from 1); must depend on the step only.
using BatchFn = std::function<Batch(std::int64_t step)>;
// A generator seed for (seed, step): splitmix64 of both, so nearby seeds/steps give unrelated
// streams. Step −1 (or any negative) is free for held-out data.
std::uint64_t batch_seed(std::uint64_t seed, std::int64_t step);
// step ↦ generate(batch_size, batch_seed(seed, step)).
BatchFn make_batch_stream(std::function<Batch(std::int64_t batch, std::uint64_t seed)> generate,
                          std::int64_t batch_size, std::uint64_t seed);
// inputs / targets of a Batch as int64 tensors [rows, cols].
at::Tensor inputs_tensor(const Batch& batch);
at::Tensor targets_tensor(const Batch& batch);

// ---- evaluation ---------------------------------------------------------------------------------
struct EvalResult {
  double loss = std::numeric_limits<double>::quiet_NaN();  // mean cross-entropy, scored tokens
  Metrics metrics;  // token / sequence accuracy of the argmax predictions (tasks::evaluate)
  // The argmax predictions, rows × cols row-major like Batch::targets (for other metrics, e.g.
  // copy_metrics).
  std::vector<std::int64_t> predictions;
};
// Teacher-forced evaluation in eval mode without gradients, rows_per_pass rows per forward pass
// (bounding memory for large held-out sets; the result does not depend on it up to rounding of
// the loss sum). With a DataParallel of N ranks (every rank must call it, with the same batch):
// forward pass p runs on rank p mod N, the predictions and the passes' loss sums are summed over
// the ranks, and every rank gets the single-process result, bit for bit.
EvalResult evaluate(LanguageModel& model, const Batch& batch, std::int64_t rows_per_pass = 64,
                    DataParallel* data_parallel = nullptr);
using EvalFn = std::function<EvalResult(LanguageModel& model)>;

// ---- progress -----------------------------------------------------------------------------------
struct ProgressInfo {
  std::int64_t step = 0, total_steps = 0;
  double loss = 0.0;            // this step's training loss
  double lr = 0.0;              // this step's learning rate
  double train_accuracy = 0.0;  // token accuracy on this step's batch
  double eval_accuracy = std::numeric_limits<double>::quiet_NaN();  // last evaluation, if any
  double tokens_per_s = 0.0;  // training tokens (B·T) per second in this run so far
  double elapsed_s = 0.0, eta_s = 0.0;
  bool final = false;  // the last report of the run
};
using ProgressFn = std::function<void(const ProgressInfo&)>;
// "step 120/1000  loss 2.3104  acc 0.412  eval 0.388  lr 9.5e-04  12.3k tok/s  ETA 1m12s".
std::string format_progress(const ProgressInfo& info, const std::string& label = "");
// Writes format_progress to stderr: overwriting one line with '\r' when stderr is a terminal,
// one line per report otherwise.
ProgressFn stderr_progress(const std::string& label = "");

// ---- training -----------------------------------------------------------------------------------
struct EvalRecord {
  std::int64_t step = 0;
  double loss = 0.0, token_accuracy = 0.0, sequence_accuracy = 0.0;
};
// Where the wall time of a train() call went, summed over its steps (seconds). The phases
// partition the call: their sum is wall_time_s up to the set-up before the first step.
// One op's share of the training steps (TimeBreakdown::ops).
struct OpTime {
  std::string name;  // the op's or autograd node's name, as LibTorch's profiler shows it
  std::int64_t calls = 0;
  double s = 0.0;
};
void to_json(nlohmann::json& j, const OpTime& t);

struct TimeBreakdown {
  std::int64_t steps = 0;     // steps taken by this call
  double data_s = 0.0;        // the batch: generation, checks, input and target tensors
  double forward_s = 0.0;     // the model's forward pass and the loss
  double backward_s = 0.0;    // loss.backward()
  double optimizer_s = 0.0;   // zero_grad, gradient clipping, the AdamW step
  double metrics_s = 0.0;     // the step's training accuracy (argmax) and history
  double eval_s = 0.0;        // periodic evaluations
  double checkpoint_s = 0.0;  // checkpoint writes
  double other_s = 0.0;       // progress reports and the rest of the loop
  // Data parallel only (else 0): waiting, after the backward pass, for the all-reduce of the
  // gradients and of the step's loss and predictions (the communication not hidden behind the
  // backward pass).
  double sync_s = 0.0;
  // Data parallel only (else 0): the gradient all-reduce buckets of a step, and how many of all
  // the steps' bucket all-reduces were launched during the backward pass (overlapping it).
  std::int64_t buckets = 0, buckets_launched_in_backward = 0;
  // Only while an OpTimer is alive on the training thread (else false and zeros): how much of
  // forward_s and backward_s ran inside phasor's kernels ("phasor::kernel" scopes of the LibTorch
  // layer) and inside the other LibTorch ops (outermost dispatched ops and autograd nodes, minus
  // the kernels). The rest of those phases is the C++ between ops (autograd graph bookkeeping,
  // the layers' own code). The timing itself adds about a microsecond per op.
  bool ops_timed = false;
  double forward_kernels_s = 0.0, forward_ops_s = 0.0;
  double backward_kernels_s = 0.0, backward_ops_s = 0.0;
  // Only while an OpTimer is alive: the outermost ops and autograd nodes of the training steps
  // (forward, loss, backward, optimizer) by name, slowest first, each with its calls and seconds
  // including what ran inside it; phasor's kernels as one entry, "phasor::kernel".
  std::vector<OpTime> ops;
};
void to_json(nlohmann::json& j, const TimeBreakdown& t);

// Times the LibTorch ops and phasor kernels run on the thread that creates it (a RecordFunction
// observer, as LibTorch's profiler uses), for TimeBreakdown's kernel / op split; removed again by
// the destructor. One at a time per thread.
class OpTimer {
 public:
  OpTimer();
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;
  // Seconds so far on this thread in outermost ops and in phasor kernels (any depth).
  static double ops_s();
  static double kernels_s();
  static bool active();  // an OpTimer is alive on this thread
  // The calls and seconds of each outermost op on this thread, and of phasor's kernel scopes
  // ("phasor::kernel", at any depth), by name, summed while time_by_name(true) (train() turns it
  // on for the forward pass, backward pass and optimizer step of each step).
  static void time_by_name(bool on);
  static std::vector<OpTime> by_name();

 private:
  std::uint64_t handle_ = 0;
};

// While alive, LibTorch's matrix products run on `threads` threads and its other ops on as many
// as before (at::set_num_threads), on the thread that creates it: the ops aten::mm, addmm, bmm,
// baddbmm, matmul and linear, and the autograd nodes of their backward (MmBackward0,
// AddmmBackward0, BmmBackward0, BaddbmmBackward0). Why: at the harness's sizes (2,048 tokens of
// 64 to 256 channels a step) a matmul gains from a second core (Debian's OpenBLAS, 1 → 2
// threads: 250 → 160 µs a projection) while the elementwise ops lose more in the hand-off than
// they gain. A RecordFunction observer sets OpenMP's thread count (which OpenBLAS's OpenMP build
// and ATen's parallel loops follow) when the outermost such op starts and restores it when it
// ends, for this thread only (at::set_num_threads would rebuild LibTorch's thread pool every
// time). OpenBLAS's products round differently on different thread counts (its blocking
// follows them), so a run's losses depend on this count as they do on the others; results.json
// records it (machine.matmul_threads). Without OpenMP in the process (a LibTorch built without
// it) it does nothing. One at a time per thread.
class MatmulThreads {
 public:
  explicit MatmulThreads(int threads);
  ~MatmulThreads();
  MatmulThreads(const MatmulThreads&) = delete;
  MatmulThreads& operator=(const MatmulThreads&) = delete;

 private:
  std::uint64_t handle_ = 0;
};

struct TrainResult {
  std::int64_t final_step = 0;           // last completed step
  std::vector<double> losses;            // training loss of steps 1 … final_step
  std::vector<double> train_accuracies;  // token accuracy on each step's batch
  std::vector<EvalRecord> evals;
  bool stopped_early = false;  // target_accuracy reached
  bool diverged = false;       // a non-finite loss stopped the run
  double wall_time_s = 0.0;    // of this call (not of earlier, resumed-from runs)
  double tokens_per_s = 0.0;   // training tokens per second of this call
  // The metric the target is about (target_metric): of the last evaluation, else the last
  // training batch's token accuracy; and the best over the evaluations.
  double final_accuracy = 0.0, best_accuracy = 0.0;
  TimeBreakdown time;  // where wall_time_s went
};
// Trains `model` (already built, e.g. after torch::manual_seed) for config.steps steps, or until
// early stopping / divergence / stop_at_step. With resume_from, the model's parameters, the
// optimizer, the step and the history come from that checkpoint (its model config must equal
// model->config(), its training trajectory settings must equal config's).
//
// With a DataParallel of N > 1 ranks (phasor/tasks/data_parallel.h), every rank calls train() with
// the same arguments (data: the global batch stream; eval: one that evaluates with the same
// DataParallel, or none) and trains its replica on its batch_size / N rows of each global batch
// (batch_size must be divisible by N), with the gradients summed over the ranks in buckets; the
// losses, accuracies and evaluations of the result are those of the global batch, the same on
// every rank and equal to the single-process run's up to floating-point summation order. Only
// rank 0 writes the checkpoint; with resume_from, every rank reads it (a path every rank sees)
// and must be at the same step; the parameters are broadcast from rank 0 before the first step.
TrainResult train(LanguageModel& model, const TrainConfig& config, const BatchFn& data,
                  const EvalFn& eval = {}, const ProgressFn& progress = {},
                  DataParallel* data_parallel = nullptr);

// ---- checkpoints --------------------------------------------------------------------------------
// A checkpoint file (format 2) is a 32-byte header — the magic "PHSRCKPT", the format version 2,
// the payload's length and its CRC-32 (zlib), and the CRC-32 of the header itself — followed by
// the payload: named entries (texts and tensors; layout in train.cpp) with the format tag
// "phasor.tasks.checkpoint/2", the model and train configs, the step, the history, torch's
// generator state, the model's parameters and buffers, and AdamW's options and state. train()
// writes it atomically and durably (files.h: temporary file, fsync, rename), so a run killed while
// saving keeps its previous checkpoint. Every reader below verifies the header against the file's
// size and both checksums before it parses the payload, and parses it with bounds checks (no
// LibTorch archive loader), so no file can crash the reader or make it allocate more than the
// file's size.
struct CheckpointInfo {
  std::uint32_t format_version = 0;  // 2
  std::uint64_t payload_bytes = 0;   // the entries after the header
  std::uint32_t payload_crc32 = 0;
  std::int64_t step = 0;  // the last completed training step
  ModelConfig model_config;
  TrainConfig train_config;
};
// Reads and checks a whole checkpoint without loading it into a model: the header, the size, both
// checksums, the format tag, every entry's presence and type, the configs and the history's
// consistency with the step. Anything else raises phasor::Error "checkpoint: argument 'path':
// expected a valid phasor task checkpoint, got '<path>' (<problem>)", the problem being: no such
// file, a directory, an empty file, truncated, unexpected bytes after the payload, not a phasor
// task checkpoint (magic), corrupt header / payload (checksum mismatch), another format version
// or tag (format 1, a bare LibTorch archive without checksum, is refused as "the old format 1"),
// corrupt contents (a missing or mistyped entry), an invalid config. Memory is bounded by the
// file's real size whatever its header claims.
CheckpointInfo verify_checkpoint(const std::string& path);
// The model config stored in a checkpoint, its step, and the model rebuilt from it with its
// parameters; the same checks and errors as verify_checkpoint.
ModelConfig checkpoint_model_config(const std::string& path);
std::int64_t checkpoint_step(const std::string& path);
LanguageModel load_model(const std::string& path);
// Every tensor entry of a checkpoint by name, after verify_checkpoint's checks: "step", "flags",
// "losses", "train_accuracies", "evals", "rng", "param/<name>", "buffer/<name>" (the model's, as
// named_parameters / named_buffers name them), "adamw/<group>/params" (the group's parameter
// count), "adamw/<group>/options" (lr, beta1, beta2, eps, weight_decay, amsgrad) and
// "adamw/<group>/<index>/{step,exp_avg,exp_avg_sq[,max_exp_avg_sq]}" (the state of the group's
// index-th parameter, once stepped).
std::map<std::string, at::Tensor> checkpoint_tensors(const std::string& path);

// ---- learning-rate grid -------------------------------------------------------------------------
struct GridRun {
  double lr = 0.0;
  std::uint64_t seed = 0;
  TrainResult result;
};
struct GridResult {
  std::vector<GridRun> runs;          // lr-major: every seed of lrs[0], then of lrs[1], …
  std::vector<double> mean_accuracy;  // per lr: mean final_accuracy over the seeds
  double best_lr = 0.0;               // the lr of the highest mean (first one on ties)
  std::size_t best_run = 0;           // index in runs of the best single run (highest final
                                      // accuracy, then lowest last loss)
};
// For every lr and seed: torch::manual_seed(seed), build the model, train with config.lr = lr and
// config.seed = seed on data(seed), evaluated by eval(seed) (may return an empty EvalFn). With a
// checkpoint_path, each run writes "<path>.lr<lr>.seed<seed>".
GridResult lr_grid(const ModelConfig& model_config, const TrainConfig& config,
                   const std::vector<double>& lrs, const std::vector<std::uint64_t>& seeds,
                   const std::function<BatchFn(std::uint64_t seed)>& data,
                   const std::function<EvalFn(std::uint64_t seed)>& eval = {},
                   const ProgressFn& progress = {});

}  // namespace phasor::tasks
