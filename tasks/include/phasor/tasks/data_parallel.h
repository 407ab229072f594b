// phasor::tasks data-parallel training: the harness's train() and evaluate() on N processes joined
// in a c10d process group (phasor/distributed.h: Gloo on CPUs), one model replica per rank.
//
//   auto group = phasor::distributed::init_process_group();   // torchrun's RANK, WORLD_SIZE, ...
//   auto dp = std::make_shared<phasor::tasks::DataParallel>(group);
//   pt::TrainResult r = pt::train(model, tc, data, eval, progress, dp.get());
//
// What each rank does (train.cpp):
// - every rank draws the whole global batch of a step, data(step) (the single-process batch), and
//   trains on its rows [r·b/N, (r+1)·b/N) (shard): b must be divisible by N;
// - its loss is the sum of its scored positions' cross-entropies divided by the global batch's
//   number of scored positions, so that the SUM of the ranks' gradients (the all-reduce) is the
//   gradient of the single-process mean loss, whatever the split of the scored positions — up to
//   the order in which the floating-point sums are taken;
// - the gradients are summed in buckets (GradientReducer): flat buffers of about bucket_bytes of
//   gradients each, in reverse parameter order (the order backward produces them); a bucket's
//   asynchronous all-reduce is launched from the backward pass, by hooks on the parameters'
//   gradient accumulators, as soon as all its gradients are in, so that the communication of the
//   late layers overlaps the backward of the early ones (on Gloo's own threads);
// - parameters and buffers are broadcast from rank 0 at the start (and after a resume), and every
//   rank applies the same summed gradient with the same AdamW, so they stay identical;
// - the training loss and accuracy of a step are those of the global batch (one more all-reduce
//   of the loss and the predictions); evaluation (evaluate with a DataParallel) hands the forward
//   passes of rows_per_pass rows out to the ranks round-robin and sums the predictions and the
//   per-pass losses, giving the single-process result bit for bit;
// - only rank 0 (writer) writes checkpoints and results; every rank resumes from the same
//   checkpoint file.
// Any failed or timed-out collective (a rank died, the network broke) raises phasor::Error naming
// the operation and the timeout, instead of hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phasor/distributed.h"
#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"

namespace phasor::tasks {

struct DataParallelOptions {
  // Bytes of gradients per all-reduce bucket (≥ 1; a parameter larger than this is a bucket of
  // its own). Fewer, larger buckets cost fewer collectives; smaller ones start the communication
  // earlier in the backward pass. 25 MiB as PyTorch's DistributedDataParallel.
  std::int64_t bucket_bytes = std::int64_t{25} << 20;
  // Launch each bucket's all-reduce from the backward pass as soon as its gradients are ready
  // (false: all buckets after the backward pass, for comparison).
  bool overlap = true;
  // The timeout the process group was made with, for the error messages.
  std::chrono::milliseconds timeout = distributed::kDefaultTimeout;
};

// A process group used for data parallelism: the rank, the world, the collectives the harness
// needs with errors that say what failed.
class DataParallel {
 public:
  // group: the ranks training together (phasor::distributed::init_process_group(timeout)).
  explicit DataParallel(distributed::ProcessGroupPtr group, DataParallelOptions options = {});

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool writer() const { return rank_ == 0; }  // the one rank that writes files
  const distributed::ProcessGroupPtr& group() const { return group_; }
  const DataParallelOptions& options() const { return options_; }

  // The rows of this rank in a global batch of `rows` rows: [begin, begin + count). Throws
  // phasor::Error "<op>: argument '<name>': expected a multiple of the 2 data-parallel processes
  // ..., got <rows>" when rows is not divisible by the world size.
  struct Rows {
    std::int64_t begin = 0, count = 0;
  };
  Rows shard_rows(std::int64_t rows, const std::string& op,
                  const std::string& name = "batch_size") const;
  // The rows of this rank of `global` (shard_rows), as a Batch.
  Batch shard(const Batch& global, const std::string& op) const;

  // Collectives, blocking; a failure raises phasor::Error naming `what`.
  // Every tensor (CPU, any dtype, any layout) set to rank 0's values, in place.
  void broadcast(const std::vector<at::Tensor>& tensors, const std::string& what);
  // The model's parameters and buffers set to rank 0's.
  void broadcast_model(LanguageModel& model);
  // In place: the element-wise sum over the ranks of a contiguous CPU tensor.
  void allreduce_sum(at::Tensor& tensor, const std::string& what);
  // Raises phasor::Error "<op>: argument '<name>': expected the same value on every rank, got
  // <min> … <max>" unless every rank passed the same value.
  void check_same(std::int64_t value, const std::string& op, const std::string& name,
                  const std::string& meaning);
  void barrier(const std::string& what);

  // Waits for `work`; a failure (a peer gone, the timeout) becomes phasor::Error naming `what`.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;

 private:
  distributed::ProcessGroupPtr group_;
  DataParallelOptions options_;
  int rank_ = 0, world_size_ = 1;
};

// Sums the gradients of `parameters` over the ranks of a DataParallel, in buckets, for as long as
// it lives. Construction registers a post-hook on each parameter's gradient accumulator (the
// autograd node that writes .grad); after backward(), finish() launches the buckets not launched
// yet, waits for all and writes the sums back into .grad. The buckets are launched in a fixed
// order (a bucket only after all earlier ones), the same on every rank, as c10d requires.
// A parameter without a gradient on every rank (unused in the step) keeps none; one with a
// gradient on some ranks only is an error (the ranks' graphs differ).
class GradientReducer {
 public:
  GradientReducer(DataParallel& dp, const std::vector<at::Tensor>& parameters);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // After loss.backward(): every bucket reduced, .grad holds the sums. `step` names the step in
  // errors.
  void finish(std::int64_t step);
  std::size_t num_buckets() const;
  // Buckets of the last finish() whose all-reduce was launched during the backward pass.
  std::size_t launched_in_backward() const;

  struct State;  // train.cpp's hooks reach it

 private:
  std::unique_ptr<State> state_;
};

}  // namespace phasor::tasks
