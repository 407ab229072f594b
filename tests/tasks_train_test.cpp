// phasor::tasks model and training (phasor/tasks/model.h, train.h): configs and their errors, the
// registries, causality of the model for every mixer × position encoding, the schedule, tiny
// end-to-end training runs that must learn, early stopping, the learning-rate grid, and exact
// checkpoint resume (parameters, optimizer state, step, history, RNG state) in float64.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <unistd.h>
#include <zlib.h>

#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"
#include "phasor/tasks/train.h"

namespace phasor::tasks {
namespace {

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const phasor::Error& e) {
    const std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("phasor_tasks_train_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

ModelConfig tiny(const std::string& mixer, const std::string& pos = "none") {
  ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.mixer = mixer;
  c.pos_encoding = pos;
  c.dtype = "float64";
  if (mixer == "gla") c.mixer_options = {{"chunk_size", 4}};
  if (mixer == "gated_deltanet") c.mixer_options = {{"chunk_size", 4}, {"head_dim", 8}};
  if (mixer == "fox" || mixer == "attention") c.mixer_options = {{"block_size", 4}};
  return c;
}

// MQAR rows small enough for a few-second run: V = 32, L = 16, 2 key-value pairs.
MqarConfig small_mqar() {
  MqarConfig m;
  m.seq_len = 16;
  m.num_kv_pairs = 2;
  m.vocab_size = 32;
  return m;
}

BatchFn mqar_stream(std::int64_t batch, std::uint64_t seed) {
  const MqarConfig m = small_mqar();
  return make_batch_stream([m](std::int64_t n, std::uint64_t s) { return mqar(m, n, s); }, batch,
                           seed);
}

// ---- configs ------------------------------------------------------------------------------------

TEST(ModelConfig, JsonRoundTripAndErrors) {
  ModelConfig c = tiny("gated_deltanet", "selective_rope");
  c.beta_range = 2;
  c.mlp_activation = "gelu";
  c.pos_options = {{"rank", 4}, {"gate", "per_channel"}};
  nlohmann::json j = c;
  const ModelConfig back = j.get<ModelConfig>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(back.beta_range, 2);
  EXPECT_EQ(back.pos_options.at("gate"), "per_channel");

  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json k = j;
    k[key] = std::move(value);
    return k;
  };
  expect_error([&] { (void)with("mixer", "mamba").get<ModelConfig>(); },
               {"ModelConfig", "'mixer'", "attention, fox, gated_deltanet, gla", "'mamba'"});
  expect_error([&] { (void)with("pos_encoding", "xpos").get<ModelConfig>(); },
               {"ModelConfig", "'pos_encoding'", "none, rope, selective_rope", "'xpos'"});
  expect_error([&] { (void)with("hidden_sise", 8).get<ModelConfig>(); },
               {"ModelConfig", "'hidden_sise'", "unknown key"});
  expect_error([&] { (void)with("num_layers", "2").get<ModelConfig>(); },
               {"ModelConfig", "'num_layers'", "an integer", "string"});
  expect_error([&] { (void)with("beta_range", 3).get<ModelConfig>(); },
               {"ModelConfig", "'beta_range'", "got 3"});
  expect_error([&] { (void)with("hidden_size", 15).get<ModelConfig>(); },
               {"ModelConfig", "'hidden_size'", "multiple of num_heads = 2", "got 15"});
  expect_error([&] { (void)with("vocab_size", 0).get<ModelConfig>(); },
               {"ModelConfig", "'vocab_size'", "got 0"});
  expect_error([&] { (void)with("dtype", "half").get<ModelConfig>(); },
               {"ModelConfig", "'dtype'", "'half'"});
  expect_error([&] { (void)with("mixer_options", 3).get<ModelConfig>(); },
               {"ModelConfig", "'mixer_options'", "a JSON object"});
  // Layer options: unknown keys, wrong types, invalid values (from phasor::nn) all name the key.
  ModelConfig bad = tiny("gla");
  bad.mixer_options = {{"expand_q", 1.0}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'gla'", "'expand_q'", "unknown key"});
  bad.mixer_options = {{"use_short_conv", 1}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'gla'", "'use_short_conv'", "a boolean"});
  bad.mixer_options = {{"expand_k", 0.3}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'gla'", "'expand_k'"});
  bad.mixer_options = {{"clamp_min", 0.5}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'gla'", "'clamp_min'", "≤ 0", "0.5"});
  bad.mixer_options = {{"clamp_min", "none"}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'gla'", "'clamp_min'", "a number"});
  // A misspelt key is answered with the valid spellings, the optional ones (absent: "not set")
  // among them.
  bad.mixer_options = {{"clamp", 0.0}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'gla'", "'clamp'", "clamp_min"});
  bad = tiny("gated_deltanet");
  bad.mixer_options = {{"num_v_head", 4}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'gated_deltanet'", "num_v_heads"});
  bad = tiny("fox");
  bad.mixer_options = {{"window", 4}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'fox'", "num_kv_heads", "window_size"});
  bad = tiny("performer");
  bad.mixer_options = {{"sed", 4}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'performer'", "'sed'", "seed"});
  bad.mixer_options = {{"seed", -1}};
  expect_error([&] { LanguageModel m(bad); }, {"mixer 'performer'", "'seed'", "≥ 0", "-1"});
  bad = tiny("fox", "rope");
  bad.pos_options = {{"rank", 2}};
  expect_error([&] { LanguageModel m(bad); }, {"pos_encoding 'rope'", "'rank'", "unknown key"});
  bad.pos_encoding = "selective_rope";
  bad.pos_options = {{"gate", "sometimes"}};
  expect_error([&] { LanguageModel m(bad); },
               {"pos_encoding 'selective_rope'", "'gate'", "'sometimes'"});
}

TEST(ModelConfig, JsonFiles) {
  const std::string path = temp_path("config.json");
  expect_error([&] { read_json_file(path); }, {"'path'", path, "cannot open"});
  std::ofstream(path) << "{\"vocab_size\": 12, \"mixer\": \"fox\",";
  expect_error([&] { read_json_file(path); }, {"'path'", "valid JSON", path});
  std::ofstream(path) << R"({"vocab_size": 12, "mixer": "fox", "pos_encoding": "rope"})";
  const ModelConfig c = read_json_file(path).get<ModelConfig>();
  EXPECT_EQ(c.vocab_size, 12);
  EXPECT_EQ(c.mixer, "fox");
  EXPECT_EQ(c.hidden_size, ModelConfig().hidden_size);
  std::filesystem::remove(path);

  TrainConfig t;
  t.steps = 7;
  t.seed = 18446744073709551615ULL;  // the largest seed survives the round trip
  t.target_metric = "sequence";
  const TrainConfig back = nlohmann::json(t).get<TrainConfig>();
  EXPECT_EQ(nlohmann::json(back), nlohmann::json(t));
  EXPECT_EQ(back.seed, t.seed);
  nlohmann::json j = t;
  j["lr"] = -1.0;
  expect_error([&] { (void)j.get<TrainConfig>(); }, {"TrainConfig", "'lr'", "-1"});
  j = t;
  j["warmup"] = 3;
  expect_error([&] { (void)j.get<TrainConfig>(); }, {"TrainConfig", "'warmup'", "unknown key"});
  j = t;
  j["checkpoint_every"] = 5;
  expect_error([&] { (void)j.get<TrainConfig>(); }, {"TrainConfig", "'checkpoint_path'"});
}

// ---- registries ---------------------------------------------------------------------------------

TEST(Registry, BuiltinsAndNewEntries) {
  const auto mixers = mixer_names();
  for (const char* m : {"gla", "gated_deltanet", "fox", "attention"})
    EXPECT_NE(std::find(mixers.begin(), mixers.end(), m), mixers.end()) << m;
  const auto positions = position_encoding_names();
  EXPECT_EQ(positions.size() >= 3, true);
  expect_error(
      [] {
        register_mixer("gla", [](const ModelConfig&, const PositionEncoding&) { return Mixer{}; });
      },
      {"register_mixer", "'gla'"});
  // A new mixer (a causal token shift followed by a linear map) and a new position encoding
  // ("rope" with a small base) plug in without touching the model.
  // (Registered once per process, so that --gtest_repeat works.)
  const auto names = mixer_names();
  if (std::find(names.begin(), names.end(), "test_shift") == names.end()) {
    register_mixer("test_shift", [](const ModelConfig& c, const PositionEncoding& pe) {
      EXPECT_EQ(pe.name, "test_rope_small");
      auto lin = std::make_shared<torch::nn::LinearImpl>(c.hidden_size, c.hidden_size);
      Mixer m;
      m.module = lin;
      m.forward = [lin](const at::Tensor& x) {
        return lin->forward(at::constant_pad_nd(x, {0, 0, 1, 0}).narrow(1, 0, x.size(1)));
      };
      return m;
    });
    register_position_encoding("test_rope_small", [](const ModelConfig&) {
      PositionEncoding p;
      p.name = "test_rope_small";
      p.kind = nn::PosEncoding::rope;
      p.rope_theta = 100.0;
      return p;
    });
  }
  ModelConfig c = tiny("test_shift", "test_rope_small");
  LanguageModel model(c);
  const at::Tensor tokens = torch::randint(0, 16, {2, 5}, at::kLong);
  EXPECT_EQ(model->forward(tokens).sizes(), (std::vector<std::int64_t>{2, 5, 16}));
  // The registered module's parameters are the model's.
  std::int64_t found = 0;
  for (const auto& p : model->named_parameters())
    found += p.key().find("mixer.weight") != std::string::npos;
  EXPECT_EQ(found, c.num_layers);
}

// ---- the model ----------------------------------------------------------------------------------

TEST(LanguageModel, CausalForEveryMixerAndEncoding) {
  // Logits at t must not depend on tokens after t: change the suffix and compare the prefix, for
  // every mixer × position encoding, with T = 11 (not a multiple of the chunk/block size 4).
  for (const char* mixer : {"gla", "gated_deltanet", "fox", "attention"})
    for (const char* pos : {"none", "rope", "selective_rope"}) {
      torch::manual_seed(3);
      LanguageModel model(tiny(mixer, pos));
      const at::Tensor a = torch::randint(0, 16, {2, 11}, at::kLong);
      at::Tensor b = a.clone();
      b.narrow(1, 7, 4).random_(0, 16);
      b.select(1, 7).copy_((a.select(1, 7) + 1) % 16);  // position 7 surely differs
      const at::Tensor la = model->forward(a), lb = model->forward(b);
      EXPECT_EQ(la.scalar_type(), at::kDouble);
      EXPECT_EQ(la.sizes(), (std::vector<std::int64_t>{2, 11, 16}));
      const std::string what = std::string(mixer) + " " + pos;
      EXPECT_TRUE(torch::equal(la.narrow(1, 0, 7), lb.narrow(1, 0, 7))) << what;
      EXPECT_GT((la.narrow(1, 7, 4) - lb.narrow(1, 7, 4)).abs().max().item<double>(), 1e-6) << what;
    }
}

TEST(LanguageModel, StructureFollowsTheConfig) {
  ModelConfig c = tiny("gated_deltanet");
  c.beta_range = 2;
  torch::manual_seed(1);
  LanguageModel m2(c);
  auto gdn = std::dynamic_pointer_cast<nn::GatedDeltaNetImpl>(m2->named_modules()["block0.mixer"]);
  ASSERT_TRUE(gdn);
  EXPECT_TRUE(gdn->options.allow_neg_eigval());
  c.beta_range = 1;
  LanguageModel m1(c);
  EXPECT_FALSE(std::dynamic_pointer_cast<nn::GatedDeltaNetImpl>(m1->named_modules()["block0.mixer"])
                   ->options.allow_neg_eigval());
  // GLA's clamp_min reaches the layer when given, and stays unset otherwise.
  c = tiny("gla");
  const auto gla_of = [](const LanguageModel& m) {
    return std::dynamic_pointer_cast<nn::GatedLinearAttentionImpl>(
        m->named_modules()["block0.mixer"]);
  };
  ASSERT_TRUE(gla_of(LanguageModel(c)));
  EXPECT_FALSE(gla_of(LanguageModel(c))->options.clamp_min().has_value());
  c.mixer_options["clamp_min"] = -0.25;
  EXPECT_EQ(gla_of(LanguageModel(c))->options.clamp_min(), c10::optional<double>(-0.25));
  // MLP sizes: SwiGLU 3·D·F, GELU 2·D·F, none 0 (F = expansion · D).
  c = tiny("attention");
  c.mlp = false;
  const std::int64_t base = LanguageModel(c)->num_parameters();
  c.mlp = true;
  c.mlp_expansion = 2;
  const std::int64_t D = 16, F = 32, L = 2;
  EXPECT_EQ(LanguageModel(c)->num_parameters() - base, L * (3 * D * F + D));
  c.mlp_activation = "gelu";
  EXPECT_EQ(LanguageModel(c)->num_parameters() - base, L * (2 * D * F + D));
  // The control arm has no forget gate; FoX has one per layer.
  auto count_f = [](const LanguageModel& m) {
    std::int64_t n = 0;
    for (const auto& p : m->named_parameters()) n += p.key().find("f_proj") != std::string::npos;
    return n;
  };
  EXPECT_EQ(count_f(LanguageModel(tiny("attention"))), 0);
  EXPECT_EQ(count_f(LanguageModel(tiny("fox"))), 2 * 2);  // weight + bias, 2 layers
  // float32 by default.
  c.dtype = "float32";
  EXPECT_EQ(LanguageModel(c)->forward(torch::zeros({1, 3}, at::kLong)).scalar_type(), at::kFloat);
}

TEST(LanguageModel, TokenErrors) {
  LanguageModel m(tiny("gla"));
  expect_error(
      [&] {
        m->forward(torch::full({1, 4}, 16, at::kLong));
      },
      {"LanguageModel", "'tokens'", "[0, 16)", "[16, 16]"});
  expect_error(
      [&] {
        m->forward(torch::zeros({1, 4}, at::kInt));
      },
      {"LanguageModel", "'tokens'", "int64", "Int"});
  expect_error([&] { m->forward(torch::zeros({4}, at::kLong)); },
               {"LanguageModel", "'tokens'", "[B ≥ 1, T ≥ 1]", "[4]"});
}

// ---- schedule and data --------------------------------------------------------------------------

TEST(Training, WarmupCosineSchedule) {
  TrainConfig c;
  c.steps = 110;
  c.lr = 2e-3;
  c.warmup_steps = 10;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 2e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 5), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 2e-3);
  EXPECT_NEAR(learning_rate(c, 60), 2e-3 * (0.1 + 0.9 * 0.5), 1e-15);  // halfway: cos = 0
  EXPECT_NEAR(learning_rate(c, 110), 2e-4, 1e-15);
  for (std::int64_t s = 11; s <= 110; ++s) EXPECT_LT(learning_rate(c, s), learning_rate(c, s - 1));
  c.warmup_steps = -1;
  c.warmup_fraction = 0.2;  // 22 steps
  EXPECT_DOUBLE_EQ(learning_rate(c, 11), 1e-3);
  c.warmup_fraction = 0.0;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), c.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 110))));
}

TEST(Training, BatchStreamIsAFunctionOfSeedAndStep) {
  const BatchFn a = mqar_stream(4, 7), b = mqar_stream(4, 7), c = mqar_stream(4, 8);
  EXPECT_EQ(a(3).inputs, b(3).inputs);
  EXPECT_EQ(a(3).inputs, a(3).inputs);
  EXPECT_NE(a(3).inputs, a(4).inputs);
  EXPECT_NE(a(3).inputs, c(3).inputs);
  EXPECT_NE(batch_seed(7, 3), batch_seed(7, 4));
  EXPECT_NE(batch_seed(7, 3), batch_seed(8, 3));
  EXPECT_NE(batch_seed(0, 0), batch_seed(0, -1));
}

// ---- training runs ------------------------------------------------------------------------------

TEST(Training, TinyRunsReduceTheLossForEveryMixer) {
  // MQAR, 1 layer, hidden 32, 60 steps of 16 rows: the loss must fall well below ln V (the loss
  // of uniform predictions), and below where it started, for every mixer.
  for (const char* mixer : {"gla", "gated_deltanet", "fox", "attention"}) {
    ModelConfig mc = tiny(mixer, "rope");
    mc.vocab_size = 32;
    mc.hidden_size = 32;
    mc.num_layers = 1;
    mc.dtype = "float32";
    TrainConfig tc;
    tc.steps = 60;
    tc.batch_size = 16;
    tc.lr = 3e-3;
    tc.eval_every = 0;
    tc.seed = 5;
    torch::manual_seed(5);
    LanguageModel model(mc);
    const Batch held_out = mqar(small_mqar(), 64, batch_seed(5, -1));
    const double before = evaluate(model, held_out).loss;
    std::vector<ProgressInfo> reports;
    tc.log_every = 20;
    const TrainResult r = train(model, tc, mqar_stream(16, 5), {},
                                [&](const ProgressInfo& p) { reports.push_back(p); });
    const double after = evaluate(model, held_out).loss;
    EXPECT_EQ(r.final_step, 60) << mixer;
    EXPECT_EQ(r.losses.size(), 60u);
    EXPECT_FALSE(r.diverged);
    EXPECT_NEAR(before, std::log(32.0), 0.3) << mixer;
    EXPECT_LT(after, std::log(32.0) - 0.5) << mixer << ": " << before << " → " << after;
    ASSERT_EQ(reports.size(), 3u);
    EXPECT_EQ(reports.back().step, 60);
    EXPECT_TRUE(reports.back().final);
    EXPECT_GT(r.tokens_per_s, 0.0);
    ASSERT_EQ(r.evals.size(), 1u);  // at the last step
    EXPECT_EQ(r.evals[0].step, 60);
  }
}

TEST(Training, EarlyStoppingAndGrid) {
  // Echo task (target = input token): learnable in a few dozen steps. Early stopping must end the
  // run at the first evaluation at or above the target.
  auto echo = [](std::uint64_t seed) {
    return make_batch_stream(
        [](std::int64_t n, std::uint64_t s) {
          Batch b;
          b.rows = n;
          b.cols = 8;
          b.vocab_size = 16;
          Rng rng(s);
          for (std::int64_t i = 0; i < n * 8; ++i) {
            b.inputs.push_back(rng.uniform_int(0, 15));
            b.targets.push_back(b.inputs.back());
          }
          return b;
        },
        16, seed);
  };
  ModelConfig mc = tiny("gla");
  mc.num_layers = 1;
  mc.dtype = "float32";
  TrainConfig tc;
  tc.steps = 400;
  tc.lr = 1e-2;
  tc.eval_every = 10;
  tc.target_accuracy = 0.95;
  tc.log_every = 0;
  torch::manual_seed(2);
  LanguageModel model(mc);
  const TrainResult r = train(model, tc, echo(2));
  EXPECT_TRUE(r.stopped_early);
  EXPECT_LT(r.final_step, 400);
  EXPECT_EQ(r.final_step % 10, 0);
  EXPECT_GE(r.final_accuracy, 0.95);
  for (std::size_t i = 0; i + 1 < r.evals.size(); ++i) EXPECT_LT(r.evals[i].token_accuracy, 0.95);

  // Grid: a hopeless learning rate against a good one, two seeds each.
  tc.steps = 60;
  tc.target_accuracy = 0;
  const GridResult g = lr_grid(mc, tc, {1e-6, 1e-2}, {1, 2}, echo);
  ASSERT_EQ(g.runs.size(), 4u);
  EXPECT_EQ(g.best_lr, 1e-2);
  EXPECT_GE(g.best_run, 2u);
  EXPECT_GT(g.mean_accuracy[1], g.mean_accuracy[0] + 0.3);
  EXPECT_EQ(g.runs[3].lr, 1e-2);
  EXPECT_EQ(g.runs[3].seed, 2u);
}

// The tensors of a checkpoint whose names start with `prefix`.
std::map<std::string, at::Tensor> entries_of(const std::string& path, const std::string& prefix) {
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : checkpoint_tensors(path))
    if (kv.first.rfind(prefix, 0) == 0) out.insert(kv);
  return out;
}

TEST(Training, CheckpointResumeReproducesTheUninterruptedRun) {
  // float64, every mixer: 12 steps in one go against 5 steps, a fresh process-like restart (new
  // model with other initial parameters, new optimizer), and 7 more from the checkpoint. The
  // parameters, AdamW's moments and step counts, the history and torch's generator must be
  // bitwise equal.
  for (const char* mixer : {"gla", "gated_deltanet", "fox", "attention"}) {
    ModelConfig mc = tiny(mixer, "selective_rope");
    mc.vocab_size = 32;
    TrainConfig tc;
    tc.steps = 12;
    tc.batch_size = 4;
    tc.warmup_steps = 3;
    tc.eval_every = 4;
    tc.log_every = 0;
    tc.seed = 9;
    const Batch held_out = mqar(small_mqar(), 8, batch_seed(9, -1));
    const EvalFn eval = [&](LanguageModel& m) { return evaluate(m, held_out); };
    const std::string full_path = temp_path(std::string(mixer) + "_full.ckpt");
    const std::string part_path = temp_path(std::string(mixer) + "_part.ckpt");

    torch::manual_seed(1);
    LanguageModel full(mc);
    tc.checkpoint_path = full_path;
    const TrainResult a = train(full, tc, mqar_stream(4, 9), eval);
    const at::Tensor rng_after_full = at::detail::getDefaultCPUGenerator().get_state();

    torch::manual_seed(1);
    LanguageModel first(mc);
    tc.checkpoint_path = part_path;
    tc.stop_at_step = 5;
    const TrainResult p = train(first, tc, mqar_stream(4, 9), eval);
    EXPECT_EQ(p.final_step, 5);
    EXPECT_EQ(checkpoint_step(part_path), 5);
    torch::manual_seed(77);  // a different initialisation and generator state, overwritten
    LanguageModel second(mc);
    (void)torch::randn({3});
    tc.stop_at_step = 0;
    tc.resume_from = part_path;
    tc.checkpoint_every = 4;
    const TrainResult b = train(second, tc, mqar_stream(4, 9), eval);

    EXPECT_EQ(b.final_step, 12);
    EXPECT_EQ(a.losses, b.losses) << mixer;
    EXPECT_EQ(a.train_accuracies, b.train_accuracies) << mixer;
    ASSERT_EQ(a.evals.size(), 3u);
    ASSERT_EQ(b.evals.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(a.evals[i].step, b.evals[i].step);
      EXPECT_EQ(a.evals[i].loss, b.evals[i].loss) << mixer;
    }
    const auto pa = full->named_parameters(), pb = second->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (const auto& kv : pa)
      EXPECT_TRUE(torch::equal(kv.value(), pb[kv.key()])) << mixer << " " << kv.key();
    // AdamW's options (lr of the last step, betas, decay), step counts and moments, and the
    // stored parameters, of the two runs' last checkpoints.
    const auto ta = entries_of(full_path, "adamw/"), tb = entries_of(part_path, "adamw/");
    EXPECT_GE(ta.size(), 3 * pa.size());  // step, exp_avg and exp_avg_sq of every parameter
    ASSERT_EQ(ta.size(), tb.size());
    for (const auto& kv : ta) {
      ASSERT_TRUE(tb.count(kv.first)) << kv.first;
      EXPECT_TRUE(torch::equal(kv.second, tb.at(kv.first))) << mixer << " " << kv.first;
    }
    const auto ca = entries_of(full_path, "param/"), cb = entries_of(part_path, "param/");
    ASSERT_EQ(ca.size(), pa.size());
    for (const auto& kv : ca)
      EXPECT_TRUE(torch::equal(kv.second, cb.at(kv.first))) << mixer << " " << kv.first;
    EXPECT_TRUE(torch::equal(rng_after_full, at::detail::getDefaultCPUGenerator().get_state()));
    // A reloaded model predicts like the trained one.
    LanguageModel reloaded = load_model(part_path);
    const at::Tensor tokens = inputs_tensor(held_out);
    EXPECT_TRUE(torch::equal(reloaded->forward(tokens), second->forward(tokens)));
    std::filesystem::remove(full_path);
    std::filesystem::remove(part_path);
  }
}

TEST(Training, WeightDecayOnMatricesOnly) {
  // AdamW's first group (decay 0.1) holds exactly the "*weight" matrices; the second (no decay)
  // the embedding, norms, biases, A_log / dt_bias and Selective RoPE's ω.
  ModelConfig mc = tiny("gated_deltanet", "selective_rope");
  mc.vocab_size = 32;
  LanguageModel model(mc);
  std::int64_t matrices = 0, others = 0;
  for (const auto& p : model->named_parameters()) {
    const std::string& k = p.key();
    const bool matrix = p.value().dim() >= 2 && k.size() >= 6 && k.substr(k.size() - 6) == "weight";
    (matrix ? matrices : others) += 1;
    if (k.find("embedding") != std::string::npos || k.find("omega") != std::string::npos ||
        k.find("norm") != std::string::npos || k.find("A_log") != std::string::npos) {
      EXPECT_FALSE(matrix) << k;
    }
  }
  EXPECT_GT(matrices, 10);
  EXPECT_GT(others, 10);
  TrainConfig tc;
  tc.steps = 1;
  tc.batch_size = 2;
  tc.log_every = 0;
  tc.checkpoint_path = temp_path("decay.ckpt");
  train(model, tc, mqar_stream(2, 1));
  const auto tensors = entries_of(tc.checkpoint_path, "adamw/");
  ASSERT_TRUE(tensors.count("adamw/0/params"));
  EXPECT_FALSE(tensors.count("adamw/2/params"));
  EXPECT_EQ(tensors.at("adamw/0/params").item<std::int64_t>(), matrices);
  EXPECT_EQ(tensors.at("adamw/1/params").item<std::int64_t>(), others);
  // options: lr, beta1, beta2, eps, weight_decay, amsgrad
  EXPECT_EQ(tensors.at("adamw/0/options")[4].item<double>(), 0.1);
  EXPECT_EQ(tensors.at("adamw/1/options")[4].item<double>(), 0.0);
  std::filesystem::remove(tc.checkpoint_path);
}

TEST(Training, TheHeadRunsOnTheScoredPositionsOnly) {
  // train() applies the final norm and the head to the scored positions alone (MQAR: 4 of 16
  // here). Its first step must be that of the full forward: the same loss, and AdamW's first
  // update p − lr·g / (|g| + eps) from the same gradient g (float64; the gradient sums differ
  // only in order).
  ModelConfig mc = tiny("gla", "selective_rope");
  mc.vocab_size = 32;
  torch::manual_seed(11);
  LanguageModel full(mc);
  torch::manual_seed(11);
  LanguageModel trained(mc);
  const Batch batch = mqar_stream(8, 4)(1);
  const at::Tensor x = inputs_tensor(batch);
  ASSERT_LT(std::count_if(batch.targets.begin(), batch.targets.end(),
                          [](std::int64_t t) { return t != kIgnoreIndex; }),
            static_cast<std::ptrdiff_t>(batch.targets.size() / 2));
  EXPECT_TRUE(at::equal(full->forward(x), full->logits(full->hidden(x))));

  const at::Tensor logits = full->forward(x);
  const at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, mc.vocab_size}),
                                                 targets_tensor(batch).reshape({-1}), {},
                                                 at::Reduction::Mean, kIgnoreIndex);
  loss.backward();

  TrainConfig tc;
  tc.steps = 1;
  tc.batch_size = batch.rows;
  tc.log_every = 0;
  tc.grad_clip = 0;
  tc.weight_decay = 0;
  const TrainResult r = train(trained, tc, [&batch](std::int64_t) { return batch; });
  ASSERT_EQ(r.losses.size(), 1u);
  EXPECT_NEAR(r.losses[0], loss.item<double>(), 1e-12);
  const double lr = learning_rate(tc, 1);
  const auto before = full->named_parameters(), after = trained->named_parameters();
  std::int64_t moved = 0;
  for (const auto& p : before) {
    const at::Tensor g = p.value().grad();
    ASSERT_TRUE(g.defined()) << p.key();
    const at::Tensor expected = p.value().detach() - lr * g / (g.abs() + tc.adam_eps);
    EXPECT_TRUE(at::allclose(after[p.key()], expected, 1e-9, 1e-12)) << p.key();
    moved += g.ne(0).sum().item<std::int64_t>();
  }
  EXPECT_GT(moved, 100);
}

TEST(Training, TimeBreakdown) {
  ModelConfig mc = tiny("gla");
  mc.vocab_size = 32;
  TrainConfig tc;
  tc.steps = 3;
  tc.batch_size = 2;
  tc.log_every = 0;
  tc.eval_every = 2;
  // Without an OpTimer: the phases only.
  LanguageModel plain(mc);
  EXPECT_FALSE(OpTimer::active());
  const TrainResult a = train(plain, tc, mqar_stream(2, 1));
  EXPECT_EQ(a.time.steps, 3);
  EXPECT_FALSE(a.time.ops_timed);
  EXPECT_EQ(a.time.forward_kernels_s, 0.0);
  EXPECT_EQ(a.time.backward_ops_s, 0.0);
  // With one: the forward and backward passes split into phasor kernels and other ops.
  LanguageModel timed(mc);
  TrainResult b;
  {
    OpTimer timer;
    EXPECT_TRUE(OpTimer::active());
    expect_error([] { OpTimer second; }, {"OpTimer", "one OpTimer per thread"});
    b = train(timed, tc, mqar_stream(2, 1));
  }
  EXPECT_FALSE(OpTimer::active());
  const TimeBreakdown& t = b.time;
  EXPECT_EQ(t.steps, 3);
  EXPECT_TRUE(t.ops_timed);
  for (double s :
       {t.data_s, t.forward_s, t.backward_s, t.optimizer_s, t.metrics_s, t.eval_s, t.other_s,
        t.forward_kernels_s, t.forward_ops_s, t.backward_kernels_s, t.backward_ops_s})
    EXPECT_GE(s, 0.0);
  EXPECT_GT(t.forward_kernels_s, 0.0);
  EXPECT_GT(t.backward_kernels_s, 0.0);
  EXPECT_GT(t.forward_ops_s, 0.0);
  EXPECT_GT(t.eval_s, 0.0);
  EXPECT_LE(t.forward_kernels_s + t.forward_ops_s, t.forward_s);
  EXPECT_LE(t.backward_kernels_s + t.backward_ops_s, t.backward_s);
  const double sum = t.data_s + t.forward_s + t.backward_s + t.optimizer_s + t.metrics_s +
                     t.eval_s + t.checkpoint_s + t.other_s;
  EXPECT_LE(sum, b.wall_time_s);
  EXPECT_GT(sum, 0.5 * b.wall_time_s);
  nlohmann::json j = t;
  EXPECT_EQ(j.at("steps"), 3);
  EXPECT_TRUE(j.contains("forward_kernels_s"));
  EXPECT_FALSE(nlohmann::json(a.time).contains("forward_kernels_s"));
  EXPECT_FALSE(nlohmann::json(a.time).contains("ops"));
  // By name: slowest first; the GLA layer's kernel in its autograd node; the outermost ops
  // (kernel scopes inside a node excluded) add up to the ops and kernels of the three phases.
  ASSERT_FALSE(t.ops.empty());
  EXPECT_EQ(j.at("ops").size(), t.ops.size());
  double outermost = 0.0;
  bool gla_backward = false, matmul = false;
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const OpTime& op = t.ops[i];
    EXPECT_GT(op.calls, 0) << op.name;
    EXPECT_GE(op.s, 0.0) << op.name;
    if (i > 0) {
      EXPECT_GE(t.ops[i - 1].s, op.s);
    }
    if (op.name.find("phasor::kernel in ") == 0) {
      gla_backward = gla_backward || op.name.find("GlaFunction") != std::string::npos;
      continue;
    }
    outermost += op.s;
    matmul = matmul || op.name == "aten::matmul" || op.name == "aten::linear";
  }
  EXPECT_TRUE(gla_backward);
  EXPECT_TRUE(matmul);
  const double phases =
      t.forward_kernels_s + t.forward_ops_s + t.backward_kernels_s + t.backward_ops_s;
  EXPECT_GE(outermost, phases);  // plus the optimizer's ops
  EXPECT_LE(outermost, t.forward_s + t.backward_s + t.optimizer_s);
}

// OpenMP's thread count (LibTorch loads libgomp).
int omp_threads() {
  using Get = int (*)();
  static const auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return get();
}

// Records OpenMP's thread count as each op of interest starts (registered after MatmulThreads'
// observer, so it sees what that one set).
struct ThreadsSeen {
  static std::vector<std::pair<std::string, int>>& log() {
    static std::vector<std::pair<std::string, int>> l;
    return l;
  }
  at::CallbackHandle handle;
  ThreadsSeen() {
    log().clear();
    handle = at::addGlobalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                       -> std::unique_ptr<at::ObserverContext> {
          const std::string name = fn.name();
          if (name == "aten::mm" || name == "aten::add" ||
              name.find("MmBackward0") != std::string::npos)
            log().emplace_back(name.find("MmBackward0") != std::string::npos ? "MmBackward0" : name,
                               omp_threads());
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
  ~ThreadsSeen() { at::removeCallback(handle); }
  int threads_of(const std::string& name) const {
    for (const auto& [n, t] : log())
      if (n == name) return t;
    return -1;
  }
};

TEST(MatmulThreads, ProductsAndTheirBackwardOnItsThreadsOtherOpsOnTheirs) {
  ASSERT_NE(dlsym(RTLD_DEFAULT, "omp_set_num_threads"), nullptr) << "LibTorch without OpenMP";
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor x = torch::randn({8, 4}, torch::requires_grad()), w = torch::randn({4, 5});
  {
    MatmulThreads matmul(3);
    expect_error([] { MatmulThreads second(2); },
                 {"MatmulThreads", "one MatmulThreads per thread"});
    ThreadsSeen seen;
    at::Tensor y = at::mm(x, w) + 1.0;
    y.sum().backward();
    EXPECT_EQ(seen.threads_of("aten::mm"), 3);
    EXPECT_EQ(seen.threads_of("MmBackward0"), 3);
    EXPECT_EQ(seen.threads_of("aten::add"), 1);
    EXPECT_EQ(omp_threads(), 1);  // restored after each product
  }
  ThreadsSeen seen;
  (void)at::mm(x, w);
  EXPECT_EQ(seen.threads_of("aten::mm"), 1);  // the observer is gone
  expect_error([] { MatmulThreads zero(0); }, {"MatmulThreads", "threads", "positive"});
  at::set_num_threads(before);
}

TEST(Training, EvaluateInPassesAndBatchesWithoutTargets) {
  ModelConfig mc = tiny("fox", "rope");
  mc.vocab_size = 32;
  torch::manual_seed(4);
  LanguageModel model(mc);
  const Batch held_out = mqar(small_mqar(), 10, 3);
  const EvalResult one = evaluate(model, held_out, 64), three = evaluate(model, held_out, 3);
  EXPECT_EQ(one.predictions, three.predictions);
  EXPECT_EQ(one.predictions.size(), held_out.inputs.size());
  EXPECT_NEAR(one.loss, three.loss, 1e-12);
  EXPECT_EQ(one.metrics.correct_tokens, three.metrics.correct_tokens);
  // The loss is the mean cross-entropy over the scored positions only.
  const at::Tensor logits = model->forward(inputs_tensor(held_out));
  const at::Tensor lp = logits.log_softmax(-1);
  double sum = 0;
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < held_out.rows; ++r)
    for (std::int64_t t = 0; t < held_out.cols; ++t)
      if (held_out.target(r, t) != kIgnoreIndex) {
        sum -= lp[r][t][held_out.target(r, t)].item<double>();
        ++n;
      }
  EXPECT_NEAR(one.loss, sum / double(n), 1e-12);
  EXPECT_EQ(one.metrics.scored_tokens, n);
  expect_error([&] { evaluate(model, held_out, 0); }, {"evaluate", "'rows_per_pass'"});
  // Training on a batch with nothing to score is an error, not a divergence.
  TrainConfig tc;
  tc.steps = 2;
  tc.log_every = 0;
  const BatchFn empty = [](std::int64_t) {
    Batch b = mqar(small_mqar(), 2, 1);
    std::fill(b.targets.begin(), b.targets.end(), kIgnoreIndex);
    return b;
  };
  expect_error([&] { train(model, tc, empty); },
               {"train", "'batch'", "at least one scored target", "step 1"});
}

// Parameters of a model, copied.
std::vector<at::Tensor> snapshot(LanguageModel& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_change(const std::vector<at::Tensor>& before, LanguageModel& m) {
  double d = 0;
  const auto now = m->parameters();
  for (std::size_t i = 0; i < before.size(); ++i)
    d = std::max(d, (now[i] - before[i]).abs().max().item<double>());
  return d;
}

TEST(Training, GradientClipping) {
  // One AdamW step moves a parameter by about lr (Adam's m/√v ≈ ±1). Clipping the gradient to a
  // norm of 1e-12 makes it ~1e-13 per entry, below Adam's eps = 1e-8, so the step shrinks to
  // about lr · 1e-5: the clipping must have been applied before the update.
  ModelConfig mc = tiny("gla");
  mc.vocab_size = 32;
  TrainConfig tc;
  tc.steps = 1;
  tc.batch_size = 4;
  tc.lr = 1e-2;
  tc.warmup_steps = 0;
  tc.min_lr_ratio = 1.0;  // the single step runs at lr
  tc.weight_decay = 0;
  tc.log_every = 0;
  for (const double clip : {0.0, 1e-12}) {
    torch::manual_seed(6);
    LanguageModel model(mc);
    const auto before = snapshot(model);
    tc.grad_clip = clip;
    train(model, tc, mqar_stream(4, 2));
    const double moved = max_change(before, model);
    if (clip == 0.0)
      EXPECT_GT(moved, 0.5 * tc.lr);
    else
      EXPECT_LT(moved, 1e-3 * tc.lr);
  }
}

TEST(Training, DivergenceStopsWithoutUpdating) {
  // A mixer that turns its output into NaN from the 4th forward pass on: the run must stop at
  // step 3 marked diverged, with the parameters of step 3 (no update from the NaN loss).
  static int calls = 0;
  calls = 0;
  const auto names = mixer_names();
  if (std::find(names.begin(), names.end(), "test_nan_after_3") == names.end())
    register_mixer("test_nan_after_3", [](const ModelConfig& c, const PositionEncoding&) {
      auto lin = std::make_shared<torch::nn::LinearImpl>(c.hidden_size, c.hidden_size);
      Mixer m;
      m.module = lin;
      m.forward = [lin](const at::Tensor& x) {
        const at::Tensor y = lin->forward(x);
        return ++calls > 3 ? y * std::nan("") : y;
      };
      return m;
    });
  ModelConfig mc = tiny("test_nan_after_3");
  mc.num_layers = 1;
  mc.vocab_size = 32;
  TrainConfig tc;
  tc.steps = 10;
  tc.batch_size = 2;
  tc.log_every = 0;
  tc.stop_at_step = 3;
  LanguageModel model(mc);
  train(model, tc, mqar_stream(2, 1));
  const auto after3 = snapshot(model);
  tc.stop_at_step = 0;
  tc.checkpoint_path = temp_path("nan.ckpt");
  calls = 3;
  LanguageModel again(mc);
  for (std::size_t i = 0; i < after3.size(); ++i) again->parameters()[i].detach().copy_(after3[i]);
  const TrainResult r = train(again, tc, mqar_stream(2, 1));
  EXPECT_TRUE(r.diverged);
  EXPECT_EQ(r.final_step, 0);
  EXPECT_EQ(r.final_accuracy, 0.0);
  EXPECT_EQ(max_change(after3, again), 0.0);
  EXPECT_EQ(checkpoint_step(tc.checkpoint_path), 0);
  std::filesystem::remove(tc.checkpoint_path);
}

TEST(Training, ProgressOnStderr) {
  // Not a terminal here (tests capture stderr): one plain line per report, the last one final.
  ModelConfig mc = tiny("attention");
  mc.vocab_size = 32;
  TrainConfig tc;
  tc.steps = 5;
  tc.batch_size = 2;
  tc.log_every = 2;
  LanguageModel model(mc);
  testing::internal::CaptureStderr();
  train(model, tc, mqar_stream(2, 1), {}, stderr_progress("arm"));
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3);  // steps 2, 4, 5
  EXPECT_EQ(out.rfind("arm  step 2/5  loss ", 0), 0u) << out;
  EXPECT_NE(out.find("arm  step 5/5"), std::string::npos);
  EXPECT_NE(out.find("took"), std::string::npos);
  EXPECT_NE(out.find("ETA"), std::string::npos);
}

TEST(Training, CheckpointErrors) {
  ModelConfig mc = tiny("gla");
  TrainConfig tc;
  tc.steps = 3;
  tc.batch_size = 2;
  tc.log_every = 0;
  const std::string path = temp_path("errors.ckpt");
  std::filesystem::remove(path);
  LanguageModel model(mc);
  tc.resume_from = path;
  expect_error([&] { train(model, tc, mqar_stream(2, 1)); },
               {"checkpoint", "'path'", path, "no such file"});
  std::ofstream(path) << "not a checkpoint";
  expect_error([&] { train(model, tc, mqar_stream(2, 1)); },
               {"checkpoint", "'path'", path, "not a phasor task checkpoint"});
  expect_error([&] { load_model(path); }, {"checkpoint", path, "not a phasor task checkpoint"});
  // A real checkpoint, then a truncated copy of it.
  mc.vocab_size = 32;
  LanguageModel m32(mc);
  tc.resume_from.clear();
  tc.checkpoint_path = path;
  train(m32, tc, mqar_stream(2, 1));
  EXPECT_EQ(checkpoint_step(path), 3);
  EXPECT_EQ(nlohmann::json(checkpoint_model_config(path)), nlohmann::json(mc));
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  expect_error([&] { checkpoint_step(path); }, {"checkpoint", path, "truncated"});
  train(m32, tc, mqar_stream(2, 1));
  // Another model config or another trajectory: named differences.
  ModelConfig other = mc;
  other.hidden_size = 32;
  LanguageModel m_other(other);
  tc.resume_from = path;
  expect_error([&] { train(m_other, tc, mqar_stream(2, 1)); },
               {"train", "'resume_from'", "same model config", "hidden_size (16 vs 32)"});
  TrainConfig tc2 = tc;
  tc2.lr = 5e-4;
  expect_error([&] { train(m32, tc2, mqar_stream(2, 1)); },
               {"train", "'resume_from'", "trajectory", "lr"});
  // Logging settings may change; a finished run resumes to nothing more.
  tc.log_every = 1;
  EXPECT_EQ(train(m32, tc, mqar_stream(2, 1)).final_step, 3);
  // Batches with ids beyond the model's vocabulary.
  LanguageModel small(tiny("gla"));
  tc.resume_from.clear();
  tc.checkpoint_path.clear();
  expect_error([&] { train(small, tc, mqar_stream(2, 1)); },
               {"train", "'batch'", "vocab_size = 16", "vocab_size 32"});
  std::filesystem::remove(path);
}

// ---- checkpoint files ---------------------------------------------------------------------------

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void put_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::uint32_t crc(const std::string& s, std::size_t from, std::size_t n) {
  return static_cast<std::uint32_t>(
      crc32_z(crc32_z(0, Z_NULL, 0), reinterpret_cast<const Bytef*>(s.data() + from), n));
}

void put_le(std::string& s, std::size_t at, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// A checkpoint container as train.h describes it, written here independently of train.cpp: the
// 32-byte header (magic, version, reserved, payload length, payload CRC-32, header CRC-32) with
// valid checksums around any payload, and any claimed length and version.
std::string container(const std::string& payload, std::uint32_t version = 2,
                      std::uint64_t claimed_length = ~std::uint64_t{0}) {
  std::string b(32, '\0');
  b.replace(0, 8, "PHSRCKPT");
  put_le(b, 8, version, 4);
  put_le(b, 16, claimed_length == ~std::uint64_t{0} ? payload.size() : claimed_length, 8);
  b += payload;
  put_le(b, 24, crc(b, 32, payload.size()), 4);
  put_le(b, 28, crc(b, 0, 28), 4);
  return b;
}

// Payload entries as train.cpp documents them, encoded here independently: a text, and a tensor
// of any dtype code, sizes and element bytes.
std::string text_entry(const std::string& name, const std::string& value) {
  std::string e(4, '\0');
  put_le(e, 0, name.size(), 4);
  e += name + '\x01' + std::string(8, '\0');
  put_le(e, e.size() - 8, value.size(), 8);
  return e + value;
}

std::string tensor_entry(const std::string& name, std::uint8_t dtype,
                         const std::vector<std::uint64_t>& sizes, const std::string& data) {
  std::string e(4, '\0');
  put_le(e, 0, name.size(), 4);
  e += name + '\x02' + static_cast<char>(dtype) + static_cast<char>(sizes.size());
  for (const std::uint64_t s : sizes) {
    e += std::string(8, '\0');
    put_le(e, e.size() - 8, s, 8);
  }
  return e + data;
}

// What verify_checkpoint says about `bytes` written to `path` ("ok" when it accepts them).
std::string verdict(const std::string& path, const std::string& bytes) {
  put_file(path, bytes);
  try {
    verify_checkpoint(path);
    return "ok";
  } catch (const phasor::Error& e) {
    return e.what();
  }
}

// verify_checkpoint and every reader refuse truncated, bit-flipped, empty, foreign, old-format,
// forged and misplaced files with the file named and the problem said; the container is what
// train.h documents (a container built here around the same payload is accepted).
TEST(Training, CheckpointVerification) {
  ModelConfig mc = tiny("gla");
  mc.vocab_size = 32;
  TrainConfig tc;
  tc.steps = 3;
  tc.batch_size = 2;
  tc.log_every = 0;
  const std::string path = temp_path("verify.ckpt");
  tc.checkpoint_path = path;
  LanguageModel model(mc);
  train(model, tc, mqar_stream(2, 1));
  const std::string good = file_bytes(path);
  ASSERT_GT(good.size(), 1000u);

  const CheckpointInfo info = verify_checkpoint(path);
  EXPECT_EQ(info.format_version, 2u);
  EXPECT_EQ(info.payload_bytes, good.size() - 32);
  EXPECT_EQ(info.payload_crc32, crc(good, 32, good.size() - 32));
  EXPECT_EQ(info.step, 3);
  EXPECT_EQ(nlohmann::json(info.model_config), nlohmann::json(mc));
  EXPECT_EQ(info.train_config.steps, 3);
  EXPECT_EQ(info.train_config.checkpoint_path, path);
  EXPECT_EQ(good.compare(0, 8, "PHSRCKPT"), 0);
  EXPECT_EQ(container(good.substr(32)), good);  // the documented layout, byte for byte
  EXPECT_EQ(file_bytes(path + ".tmp." + std::to_string(::getpid())), "");  // none left

  const std::string named =
      "checkpoint: argument 'path': expected a valid phasor task "
      "checkpoint, got '" +
      path + "' (";
  const auto expect_refused = [&](const std::string& bytes, const std::string& problem,
                                  const std::string& what) {
    const std::string v = verdict(path, bytes);
    EXPECT_EQ(v.rfind(named, 0), 0u) << what << ": " << v;
    EXPECT_NE(v.find(problem), std::string::npos) << what << ": " << v;
  };

  // Truncated anywhere: in the magic, the header, right after it, in the payload, one byte short.
  for (const std::size_t keep :
       {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{20}, std::size_t{31},
        std::size_t{32}, std::size_t{33}, good.size() / 2, good.size() - 1})
    expect_refused(good.substr(0, keep), "truncated", "truncated to " + std::to_string(keep));
  expect_refused("", "an empty file", "empty");
  expect_refused(good + "x", "1 unexpected bytes after the payload", "one byte appended");

  // One flipped byte anywhere: the magic, each header field, the payload's start, middle, end.
  const std::vector<std::pair<std::size_t, std::string>> flips = {
      {0, "does not start with \"PHSRCKPT\""},
      {7, "does not start with"},
      {8, "corrupt header"},
      {13, "corrupt header"},
      {17, "corrupt header"},
      {23, "corrupt header"},
      {25, "corrupt header"},
      {31, "corrupt header"},
      {32, "checksum"},
      {100, "checksum"},
      {good.size() / 2, "checksum"},
      {good.size() - 1, "checksum"}};
  for (const auto& [at, problem] : flips) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    expect_refused(bad, problem, "byte " + std::to_string(at) + " flipped");
  }
  expect_refused("GARBAGE!" + std::string(100, '\0'), "not a phasor task checkpoint",
                 "wrong magic");
  // Format 1 was a bare LibTorch archive (a zip file).
  torch::serialize::OutputArchive format1;
  format1.write("format", c10::IValue(std::string("phasor.tasks.checkpoint/1")));
  std::ostringstream format1_bytes;
  format1.save_to(format1_bytes);
  expect_refused(format1_bytes.str(), "old format 1 without checksum", "format 1");
  expect_refused(format1_bytes.str(), "checkpoint format changed", "format 1");

  // Forged headers with valid checksums: a length of 10^12 bytes (compared with the file's size,
  // not allocated), another version, payloads LibTorch cannot read or that lack entries.
  expect_refused(container(good.substr(32), 2, 1000000000000ULL),
                 "of the 1000000000000 payload bytes its header announces", "huge length");
  expect_refused(container(good.substr(32), 3), "format version 3; this build reads version 2",
                 "version 3");
  expect_refused(container(std::string(500, 'z')), "corrupt contents: an entry name of",
                 "not entries");
  const std::string tag = text_entry("format", "phasor.tasks.checkpoint/2");
  expect_refused(container(tag), "no entry 'model_config'", "a tag and nothing else");
  expect_refused(container(text_entry("format", "phasor.tasks.checkpoint/1")),
                 "format tag 'phasor.tasks.checkpoint/1'", "old tag");
  expect_refused(container(text_entry("x", "y")), "no text entry 'format'", "no tag");
  expect_refused(container(tag + tag), "entry 'format' twice", "an entry twice");
  expect_refused(container(tag.substr(0, tag.size() - 3)), "entry 'format' runs past", "cut tag");
  expect_refused(container(tag + tensor_entry("x", 9, {1}, "z")), "unknown dtype code 9",
                 "unknown dtype");
  expect_refused(container(tag + tensor_entry("x", 1, {1, 1, 1, 1, 1, 1, 1, 1, 1}, "")), "rank 9",
                 "rank 9");
  // Sizes claiming 2^40 × 2^40 floats, also with a zero size: refused before any allocation.
  expect_refused(container(tag + tensor_entry("x", 1, {1ULL << 40, 1ULL << 40}, "abcd")),
                 "entry 'x' is larger than the payload", "huge tensor");
  expect_refused(container(tag + tensor_entry("x", 1, {1ULL << 62, 1ULL << 62, 0}, "")),
                 "entry 'x' is larger than the payload", "huge empty tensor");
  expect_refused(container(tag + tensor_entry("x", 1, {3}, "abcd")),
                 "entry 'x' is larger than the payload", "short tensor data");
  expect_refused(container(tag + text_entry("x", "abcd").substr(0, 16)), "entry 'x' runs past",
                 "short text");
  // The good file's entries with one of them altered.
  const std::string entries = good.substr(32);
  const std::string step_key = std::string("\x04\0\0\0step\x02", 9);
  const std::size_t step_at = entries.find(step_key);
  ASSERT_NE(step_at, std::string::npos);
  std::string bad_step = entries;
  bad_step[step_at + step_key.size()] = 2;  // dtype int64 → float64
  expect_refused(container(bad_step), "entry 'step' is not a 1-d tensor of Long", "step dtype");
  std::string renamed = entries;
  renamed[step_at + 4] = 'x';  // "step" → "xtep": no step any more
  expect_refused(container(renamed), "no entry 'step'", "no step");
  std::string no_param = entries;
  for (std::size_t at = 0; (at = no_param.find("param/", at)) != std::string::npos; ++at)
    no_param[at] = 'q';  // every "param/<name>" → "qaram/<name>"
  expect_refused(container(no_param), "no model parameter", "no parameters");

  // A directory or nothing where the file should be.
  const std::string folder = temp_path("folder.ckpt");
  std::filesystem::create_directories(folder);
  expect_error([&] { verify_checkpoint(folder); }, {named.substr(0, 60), folder, "a directory"});
  std::filesystem::remove(folder);
  expect_error([&] { verify_checkpoint(folder); }, {folder, "no such file"});

  // Every reader verifies: resuming, the step, the config, loading the model.
  std::string flipped = good;
  flipped[good.size() / 3] = static_cast<char>(flipped[good.size() / 3] ^ 1);
  put_file(path, flipped);
  tc.checkpoint_path.clear();
  tc.resume_from = path;
  LanguageModel other(mc);
  expect_error([&] { train(other, tc, mqar_stream(2, 1)); }, {path, "checksum"});
  expect_error([&] { checkpoint_step(path); }, {path, "checksum"});
  expect_error([&] { checkpoint_model_config(path); }, {path, "checksum"});
  expect_error([&] { load_model(path); }, {path, "checksum"});
  put_file(path, good);
  EXPECT_EQ(train(other, tc, mqar_stream(2, 1)).final_step, 3);
  std::filesystem::remove(path);
}

TEST(Training, ProgressLine) {
  ProgressInfo p;
  p.step = 120;
  p.total_steps = 1000;
  p.loss = 2.31044;
  p.train_accuracy = 0.4123;
  p.eval_accuracy = 0.388;
  p.lr = 9.5e-4;
  p.tokens_per_s = 12345;
  p.eta_s = 72;
  EXPECT_EQ(format_progress(p, "gla"),
            "gla  step 120/1000  loss 2.3104  acc 0.412  eval 0.388  lr 9.5e-04  12.3k tok/s  "
            "ETA 1m12s");
  p.final = true;
  p.elapsed_s = 3725;
  p.eval_accuracy = std::nan("");
  p.tokens_per_s = 950;
  EXPECT_EQ(format_progress(p),
            "step 120/1000  loss 2.3104  acc 0.412  lr 9.5e-04  950 tok/s  took 1h02m05s");
}

}  // namespace
}  // namespace phasor::tasks
