// Data-parallel training's collectives and the bucketed gradient all-reduce
// (phasor/tasks/data_parallel.h).
#include "phasor/tasks/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <map>
#include <utility>

#include "check.h"

namespace phasor::tasks {

using detail::fail;

namespace {

std::string first_line(const std::string& s) {
  const auto n = s.find('\n');
  return n == std::string::npos ? s : s.substr(0, n);
}

std::string seconds(std::chrono::milliseconds t) {
  const auto ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace

// ---- DataParallel -------------------------------------------------------------------------------

DataParallel::DataParallel(distributed::ProcessGroupPtr group, DataParallelOptions options)
    : group_(std::move(group)), options_(options) {
  if (!group_) fail("DataParallel", "group", "a process group", "none");
  if (options_.bucket_bytes < 1)
    fail("DataParallel", "bucket_bytes", "≥ 1", std::to_string(options_.bucket_bytes));
  rank_ = group_->getRank();
  world_size_ = group_->getSize();
}

void DataParallel::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const {
  try {
    work->wait();
  } catch (const std::exception& e) {
    const std::string message = dynamic_cast<const c10::Error*>(&e) != nullptr
                                    ? static_cast<const c10::Error&>(e).what_without_backtrace()
                                    : e.what();
    throw Error("data parallel: " + what + " failed on rank " + std::to_string(rank_) + " of " +
                std::to_string(world_size_) +
                " (another rank stopped, or did not answer within the timeout of " +
                seconds(options_.timeout) + "): " + first_line(message));
  }
}

DataParallel::Rows DataParallel::shard_rows(std::int64_t rows, const std::string& op,
                                            const std::string& name) const {
  if (rows < 1 || rows % world_size_ != 0)
    fail(op, name,
         "a multiple of the " + std::to_string(world_size_) +
             " data-parallel processes (each trains on batch_size / processes rows of the "
             "global batch)",
         std::to_string(rows));
  const std::int64_t count = rows / world_size_;
  return {count * rank_, count};
}

Batch DataParallel::shard(const Batch& global, const std::string& op) const {
  const Rows r = shard_rows(global.rows, op);
  Batch b;
  b.rows = r.count;
  b.cols = global.cols;
  b.vocab_size = global.vocab_size;
  const auto from = static_cast<std::ptrdiff_t>(r.begin * global.cols);
  const auto to = static_cast<std::ptrdiff_t>((r.begin + r.count) * global.cols);
  if (static_cast<std::ptrdiff_t>(global.inputs.size()) < to ||
      static_cast<std::ptrdiff_t>(global.targets.size()) < to)
    fail(op, "batch", "rows · cols inputs and targets",
         std::to_string(global.inputs.size()) + " inputs, " +
             std::to_string(global.targets.size()) + " targets for " + std::to_string(global.rows) +
             " × " + std::to_string(global.cols));
  b.inputs.assign(global.inputs.begin() + from, global.inputs.begin() + to);
  b.targets.assign(global.targets.begin() + from, global.targets.begin() + to);
  return b;
}

void DataParallel::broadcast(const std::vector<at::Tensor>& tensors, const std::string& what) {
  if (world_size_ == 1) return;
  at::NoGradGuard no_grad;
  // One flat buffer per dtype (c10d's Gloo broadcast takes one dense tensor per call).
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (!t.device().is_cpu())
      fail("DataParallel::broadcast", "tensors", "CPU tensors", t.device().str());
    by_dtype[t.scalar_type()].push_back(t);
  }
  for (auto& [dtype, list] : by_dtype) {
    std::vector<at::Tensor> flat_views;
    for (const at::Tensor& t : list) flat_views.push_back(t.detach().reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flat_views)};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    wait(group_->broadcast(flat, options), what);
    std::int64_t offset = 0;
    for (const at::Tensor& t : list) {
      t.detach().copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void DataParallel::broadcast_model(LanguageModel& model) {
  std::vector<at::Tensor> tensors;
  for (const auto& p : model->parameters()) tensors.push_back(p);
  for (const auto& b : model->buffers()) tensors.push_back(b);
  broadcast(tensors, "the broadcast of the model's parameters from rank 0");
}

void DataParallel::allreduce_sum(at::Tensor& tensor, const std::string& what) {
  if (world_size_ == 1) return;
  std::vector<at::Tensor> t{tensor};
  wait(group_->allreduce(t), what);
}

void DataParallel::check_same(std::int64_t value, const std::string& op, const std::string& name,
                              const std::string& meaning) {
  if (world_size_ == 1) return;
  std::vector<at::Tensor> t{at::tensor(std::vector<std::int64_t>{value, -value}, at::kLong)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  wait(group_->allreduce(t, options), "the comparison of " + meaning + " across ranks");
  const std::int64_t high = t[0][0].item<std::int64_t>(), low = -t[0][1].item<std::int64_t>();
  if (low != high)
    fail(op, name, "the same " + meaning + " on every rank",
         "values from " + std::to_string(low) + " to " + std::to_string(high) + " (this rank, " +
             std::to_string(rank_) + ": " + std::to_string(value) + ")");
}

void DataParallel::barrier(const std::string& what) {
  if (world_size_ == 1) return;
  wait(group_->barrier(), what);
}

// ---- GradientReducer ----------------------------------------------------------------------------

struct GradientReducer::State {
  struct Bucket {
    std::vector<std::size_t> params;    // indices into `params`, in launch order
    std::vector<std::int64_t> offsets;  // where each one's gradient starts in `flat`
    std::int64_t values = 0;            // gradient elements; then one flag per parameter
    at::Tensor flat;                    // [values + params.size()]
    std::size_t pending = 0;            // gradients not in yet this step
    c10::intrusive_ptr<c10d::Work> work;
    bool in_backward = false;  // launched from a hook
  };

  DataParallel& dp;
  std::vector<at::Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<std::size_t> bucket_of;
  std::vector<bool> ready;
  std::size_t next = 0;  // the next bucket to launch (launch order = bucket order)
  std::int64_t step = 0;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<std::uintptr_t> hooks;
  std::size_t launched_in_backward = 0;

  explicit State(DataParallel& d) : dp(d) {}

  void reset() {
    for (Bucket& b : buckets) {
      b.pending = b.params.size();
      b.work.reset();
      b.in_backward = false;
    }
    std::fill(ready.begin(), ready.end(), false);
    next = 0;
  }

  // Copies the bucket's gradients (zeros and flag 0 where a parameter has none) into its buffer
  // and starts the all-reduce.
  void launch(std::size_t index, bool in_backward) {
    Bucket& b = buckets[index];
    at::NoGradGuard no_grad;
    for (std::size_t j = 0; j < b.params.size(); ++j) {
      const at::Tensor& p = params[b.params[j]];
      at::Tensor slice = b.flat.narrow(0, b.offsets[j], p.numel());
      const at::Tensor& g = p.grad();
      const bool has = g.defined();
      if (has)
        slice.copy_(g.reshape({-1}));
      else
        slice.zero_();
      b.flat.narrow(0, b.values + static_cast<std::int64_t>(j), 1).fill_(has ? 1 : 0);
    }
    std::vector<at::Tensor> t{b.flat};
    b.work = dp.group()->allreduce(t);
    b.in_backward = in_backward;
  }

  // A parameter's gradient accumulator has run: its .grad is final for this backward pass.
  void on_ready(std::size_t param) {
    if (ready[param]) return;
    ready[param] = true;
    --buckets[bucket_of[param]].pending;
    while (next < buckets.size() && buckets[next].pending == 0) launch(next++, true);
  }
};

namespace {

// Calls State::on_ready after a parameter's AccumulateGrad node (post-hooks run after the node:
// .grad is written).
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(GradientReducer::State* s, std::size_t i) : state(s), index(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    state->on_ready(index);
    return outputs;
  }
  GradientReducer::State* state;
  std::size_t index;
};

}  // namespace

GradientReducer::GradientReducer(DataParallel& dp, const std::vector<at::Tensor>& parameters)
    : state_(std::make_unique<State>(dp)) {
  State& s = *state_;
  for (const at::Tensor& p : parameters)
    if (p.requires_grad()) {
      if (!p.device().is_cpu() || p.is_sparse())
        fail("GradientReducer", "parameters", "dense CPU tensors", p.toString());
      s.params.push_back(p);
    }
  s.bucket_of.assign(s.params.size(), 0);
  s.ready.assign(s.params.size(), false);
  // Buckets in reverse parameter order (backward produces the last layers' gradients first), cut
  // at bucket_bytes and wherever the dtype changes.
  const std::int64_t limit = dp.options().bucket_bytes;
  std::int64_t bytes = 0;
  for (std::size_t k = s.params.size(); k-- > 0;) {
    const at::Tensor& p = s.params[k];
    if (s.buckets.empty() || bytes >= limit ||
        s.params[s.buckets.back().params.front()].scalar_type() != p.scalar_type()) {
      s.buckets.emplace_back();
      bytes = 0;
    }
    State::Bucket& b = s.buckets.back();
    b.params.push_back(k);
    b.offsets.push_back(b.values);
    b.values += p.numel();
    bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
    s.bucket_of[k] = s.buckets.size() - 1;
  }
  for (State::Bucket& b : s.buckets)
    b.flat = at::zeros({b.values + static_cast<std::int64_t>(b.params.size())},
                       s.params[b.params.front()].options().requires_grad(false));
  s.reset();
  if (dp.options().overlap && dp.world_size() > 1)
    for (std::size_t k = 0; k < s.params.size(); ++k) {
      // The accumulator is held (the parameter keeps only a weak reference), so that the node the
      // hook sits on is the one backward uses.
      auto accumulator = torch::autograd::impl::grad_accumulator(s.params[k]);
      s.hooks.push_back(accumulator->add_post_hook(std::make_unique<ReadyHook>(&s, k)));
      s.accumulators.push_back(std::move(accumulator));
    }
}

GradientReducer::~GradientReducer() {
  State& s = *state_;
  for (std::size_t k = 0; k < s.accumulators.size(); ++k)
    s.accumulators[k]->del_post_hook(s.hooks[k]);
  // Collectives still in flight (an exception between backward and finish) must end before their
  // buffers go.
  for (State::Bucket& b : s.buckets)
    if (b.work) try {
        b.work->wait();
      } catch (...) {
      }
}

std::size_t GradientReducer::num_buckets() const {
  return state_->buckets.size();
}

std::size_t GradientReducer::launched_in_backward() const {
  return state_->launched_in_backward;
}

void GradientReducer::finish(std::int64_t step) {
  State& s = *state_;
  if (s.dp.world_size() == 1) {
    s.reset();
    s.launched_in_backward = 0;
    return;
  }
  while (s.next < s.buckets.size()) s.launch(s.next++, false);
  at::NoGradGuard no_grad;
  const double world = s.dp.world_size();
  std::size_t in_backward = 0;
  for (State::Bucket& b : s.buckets) {
    s.dp.wait(b.work, "the all-reduce of the gradients of step " + std::to_string(step));
    in_backward += b.in_backward ? 1 : 0;
    const at::Tensor flags = b.flat.narrow(0, b.values, static_cast<std::int64_t>(b.params.size()))
                                 .to(at::kDouble)
                                 .contiguous();
    const double* flag = flags.data_ptr<double>();
    for (std::size_t j = 0; j < b.params.size(); ++j) {
      at::Tensor& p = s.params[b.params[j]];
      if (flag[j] == 0) continue;  // no rank has a gradient: none here either
      if (flag[j] != world || !p.grad().defined())
        fail("train", "model",
             "a gradient for the same parameters on every rank (the same model and code)",
             "parameter " + std::to_string(b.params[j]) + " with a gradient on " +
                 std::to_string(static_cast<std::int64_t>(flag[j])) + " of " +
                 std::to_string(s.dp.world_size()) + " ranks at step " + std::to_string(step));
      p.mutable_grad().copy_(b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes()));
    }
  }
  s.launched_in_backward = in_backward;
  s.reset();
}

}  // namespace phasor::tasks
