// phasor/tasks/data_parallel.h: the bucketed gradient all-reduce, evaluation and training over the
// ranks of a Gloo group — ranks as threads of this process (phasor::testing::run_ranks), checked
// against the single-process computation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "phasor/common.h"
#include "phasor/tasks/data.h"
#include "phasor/tasks/data_parallel.h"
#include "phasor/tasks/model.h"
#include "phasor/tasks/train.h"
#include "phasor/testing/distributed.h"

namespace {

namespace pt = phasor::tasks;
using phasor::distributed::ProcessGroupPtr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const phasor::Error& e) {
    return e.what();
  }
  return "(no error)";
}

pt::ModelConfig tiny_model(const std::string& mixer) {
  pt::ModelConfig c;
  c.vocab_size = 2;
  c.hidden_size = 16;
  c.num_layers = 1;
  c.num_heads = 1;
  c.mlp_expansion = 1;
  c.mixer = mixer;
  c.dtype = "float64";
  return c;
}

// The gradients of leaves with rank-dependent losses, summed by the reducer in buckets of 16 bytes
// (every parameter a bucket, launched from the backward pass), equal the sums computed by hand;
// a parameter no rank used keeps no gradient; the next step starts afresh.
TEST(GradientReducer, SumsTheRanksGradientsInBuckets) {
  constexpr int kWorld = 3;
  phasor::testing::run_ranks(kWorld, [](int rank, const ProcessGroupPtr& group) {
    pt::DataParallelOptions options;
    options.bucket_bytes = 16;
    pt::DataParallel dp(group, options);
    auto opts = torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true);
    at::Tensor a = torch::arange(12, opts.requires_grad(false)).reshape({3, 4}).requires_grad_();
    at::Tensor b = torch::ones({5}, opts);
    at::Tensor unused = torch::ones({2, 2}, opts);
    at::Tensor c = torch::full({7}, 2.0, opts);
    pt::GradientReducer reducer(dp, {a, b, unused, c});
    EXPECT_GE(reducer.num_buckets(), 3u);
    for (int step = 1; step <= 2; ++step) {
      for (at::Tensor* p : {&a, &b, &c})
        if (p->grad().defined()) p->mutable_grad().zero_();
      const double r = rank + 1;
      // d/da = 2 r² a · step, d/db = r · step, d/dc = 3 c² r
      const at::Tensor loss = step * ((r * a).pow(2).sum() + r * b.sum()) + r * c.pow(3).sum();
      loss.backward();
      reducer.finish(step);
      const double sum_r2 = 1 + 4 + 9, sum_r = 1 + 2 + 3;
      EXPECT_TRUE(torch::allclose(a.grad(), 2 * sum_r2 * step * a.detach(), 1e-14, 0));
      EXPECT_TRUE(
          torch::allclose(b.grad(), torch::full({5}, sum_r * step, torch::kFloat64), 1e-14, 0));
      EXPECT_TRUE(torch::allclose(c.grad(), 3 * c.detach().pow(2) * sum_r, 1e-14, 0));
      EXPECT_FALSE(unused.grad().defined());
      // The unused parameter's bucket, and those after it, wait for finish().
      EXPECT_LT(reducer.launched_in_backward(), reducer.num_buckets());
      EXPECT_GE(reducer.launched_in_backward(), 1u);
    }
  });
}

TEST(GradientReducer, AGradientOnSomeRanksOnlyIsAnError) {
  std::vector<std::string> errors(2);
  phasor::testing::run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
    pt::DataParallel dp(group);
    at::Tensor a =
        torch::ones({3}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
    at::Tensor b =
        torch::ones({3}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
    pt::GradientReducer reducer(dp, {a, b});
    (rank == 0 ? a.sum() + b.sum() : a.sum()).backward();
    errors[static_cast<std::size_t>(rank)] = error_of([&] { reducer.finish(7); });
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("train: argument 'model': expected a gradient for the same parameters on "
                     "every rank"),
              std::string::npos)
        << e;
  EXPECT_NE(errors[0].find("with a gradient on 1 of 2 ranks at step 7"), std::string::npos)
      << errors[0];
}

TEST(DataParallel, ShardsRowsAndNamesBadBatches) {
  phasor::testing::run_ranks(2, [](int rank, const ProcessGroupPtr& group) {
    pt::DataParallel dp(group);
    const pt::Batch global = pt::parity(6, false, 4, 11);
    const pt::Batch mine = dp.shard(global, "train");
    EXPECT_EQ(mine.rows, 2);
    EXPECT_EQ(std::vector<std::int64_t>(global.inputs.begin() + rank * 12,
                                        global.inputs.begin() + rank * 12 + 12),
              mine.inputs);
    const std::string e = error_of([&] { (void)dp.shard_rows(5, "train"); });
    EXPECT_NE(e.find("train: argument 'batch_size': expected a multiple of the 2 data-parallel "
                     "processes"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("got 5"), std::string::npos) << e;
    const std::string same = error_of([&] { dp.check_same(rank * 10, "train", "x", "step"); });
    EXPECT_NE(same.find("expected the same step on every rank, got values from 0 to 10"),
              std::string::npos)
        << same;
  });
}

// Passes of 3 rows over 3 ranks (4 passes, the last short): the same predictions and loss bits as
// one process.
TEST(DataParallel, EvaluationEqualsTheSingleProcessBitForBit) {
  torch::manual_seed(5);
  pt::LanguageModel reference(tiny_model("gla"));
  const pt::Batch batch = pt::parity(12, false, 10, 3);
  const pt::EvalResult expected = pt::evaluate(reference, batch, 3);
  std::vector<pt::LanguageModel> models;
  for (int r = 0; r < 3; ++r) {
    torch::manual_seed(5);
    models.emplace_back(tiny_model("gla"));
  }
  phasor::testing::run_ranks(3, [&](int rank, const ProcessGroupPtr& group) {
    pt::DataParallel dp(group);
    const pt::EvalResult got = pt::evaluate(models[static_cast<std::size_t>(rank)], batch, 3, &dp);
    EXPECT_EQ(got.predictions, expected.predictions);
    EXPECT_EQ(got.loss, expected.loss);
    EXPECT_EQ(got.metrics.token_accuracy, expected.metrics.token_accuracy);
    EXPECT_EQ(got.metrics.sequence_accuracy, expected.metrics.sequence_accuracy);
  });
}

// train() on 2 ranks (the replicas start from different parameters: rank 0's are broadcast) equals
// train() on one process: losses, accuracies, evaluations, and the final parameters to float64
// summation order.
TEST(DataParallel, TrainingEqualsTheSingleProcess) {
  pt::TrainConfig tc;
  tc.steps = 12;
  tc.batch_size = 6;
  tc.lr = 1e-2;
  tc.seed = 2;
  tc.eval_every = 4;
  tc.log_every = 0;
  const pt::BatchFn data = pt::make_batch_stream(
      [](std::int64_t rows, std::uint64_t seed) { return pt::parity(10, false, rows, seed); },
      tc.batch_size, tc.seed);
  const pt::Batch held_out = pt::parity(10, false, 8, pt::batch_seed(tc.seed, -1));
  torch::manual_seed(1);
  pt::LanguageModel reference(tiny_model("gated_deltanet"));
  const pt::TrainResult expected = pt::train(
      reference, tc, data, [&](pt::LanguageModel& m) { return pt::evaluate(m, held_out, 3); });
  std::vector<pt::LanguageModel> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(r == 0 ? 1 : 99);  // rank 1's own initialisation is overwritten
    models.emplace_back(tiny_model("gated_deltanet"));
  }
  std::vector<pt::TrainResult> results(2);
  phasor::testing::run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
    pt::DataParallelOptions options;
    options.bucket_bytes = 1024;
    pt::DataParallel dp(group, options);
    pt::LanguageModel& model = models[static_cast<std::size_t>(rank)];
    results[static_cast<std::size_t>(rank)] = pt::train(
        model, tc, data, [&](pt::LanguageModel& m) { return pt::evaluate(m, held_out, 3, &dp); },
        {}, &dp);
  });
  for (const pt::TrainResult& got : results) {
    ASSERT_EQ(got.losses.size(), expected.losses.size());
    for (std::size_t i = 0; i < got.losses.size(); ++i)
      EXPECT_NEAR(got.losses[i], expected.losses[i], 1e-11 * std::abs(expected.losses[i])) << i;
    EXPECT_EQ(got.train_accuracies, expected.train_accuracies);
    ASSERT_EQ(got.evals.size(), expected.evals.size());
    for (std::size_t i = 0; i < got.evals.size(); ++i) {
      EXPECT_EQ(got.evals[i].token_accuracy, expected.evals[i].token_accuracy);
      EXPECT_NEAR(got.evals[i].loss, expected.evals[i].loss, 1e-11);
    }
    EXPECT_GT(got.time.buckets, 1);
  }
  const auto ref = reference->parameters();
  const auto p0 = models[0]->parameters(), p1 = models[1]->parameters();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(torch::equal(p0[i], p1[i])) << "replicas differ at parameter " << i;
    EXPECT_TRUE(torch::allclose(p0[i], ref[i], 1e-10, 1e-12)) << "parameter " << i;
  }
}

}  // namespace
