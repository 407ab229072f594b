// phasor::tasks experiment runner: a tiny grid end to end (files, their contents and their
// consistency), determinism, --resume after an interruption (bit-identical to an uninterrupted
// run), and the config errors with their key paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "phasor/common.h"
#include "phasor/tasks/experiment.h"
#include "phasor/tasks/phase_probe.h"

#ifndef PHASOR_CONFIG_DIR
#error "PHASOR_CONFIG_DIR must name tasks/configs (set by tests/CMakeLists.txt)"
#endif

namespace phasor::tasks {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "phasor_tasks_experiment_test" / name;
  fs::remove_all(dir);
  return dir;
}

// Two arms × two learning rates × two seeds of a 1-layer, 16-wide model on parity: seconds.
json tiny_config() {
  return json::parse(R"({
    "name": "tiny",
    "task": {"name": "parity", "train_lengths": [8, 6], "eval_lengths": [4, 16], "eval_batch": 16},
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 1, "mlp_expansion": 1},
    "arms": [{"name": "gla", "model": {"mixer": "gla"}},
             {"name": "gdn", "model": {"mixer": "gated_deltanet", "beta_range": 2, "layers": 1}}],
    "train": {"steps": 12, "batch_size": 4, "eval_every": 4, "log_every": 0},
    "lr_grid": [0.003, 0.03],
    "seeds": [0, 1]
  })");
}

// Width and height from the PNG's IHDR chunk (bytes 16..23, big-endian), 0 if not a PNG.
std::pair<std::uint32_t, std::uint32_t> png_size(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char b[24] = {};
  in.read(reinterpret_cast<char*>(b), 24);
  if (!in || b[0] != 0x89 || b[1] != 'P' || b[2] != 'N' || b[3] != 'G') return {0, 0};
  const auto be = [&](int i) {
    return (std::uint32_t{b[i]} << 24) | (std::uint32_t{b[i + 1]} << 16) |
           (std::uint32_t{b[i + 2]} << 8) | b[i + 3];
  };
  return {be(16), be(20)};
}

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

double num(const json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// data.h's correct_prefix_length of an evaluation's cumulative sequence-accuracy curve.
std::int64_t prefix_length(const json& e) {
  std::vector<double> curve;
  for (const json& v : e["cumulative_sequence_accuracy"]) curve.push_back(num(v));
  return correct_prefix_length(curve);
}

// Parity runs of Selective RoPE arms carry the phase probe (phase_probe.h) of the longest
// evaluation's rows, and the table shows it beside the correct prefix; other arms carry none.
TEST(TasksExperiment, ParitySelectiveRopeRunsCarryThePhaseProbe) {
  json c = tiny_config();
  c["name"] = "tiny_probe";
  c["task"]["bos"] = true;
  c["model"]["num_heads"] = 2;
  c["arms"] = json::parse(R"([{"name": "gla_srope", "model": {"mixer": "gla",
                                "pos_encoding": "selective_rope"}},
                              {"name": "gla", "model": {"mixer": "gla"}}])");
  c["lr_grid"] = {0.003};
  c["seeds"] = {0};
  ExperimentOptions options;
  options.out_dir = fresh_dir("tiny_probe").string();
  options.progress = false;
  const ExperimentOutput output = run_experiment(parse_experiment_config(c), options);
  const json& runs = output.results["runs"];
  ASSERT_EQ(runs.size(), 2u);
  ASSERT_EQ(runs[0]["arm"], "gla_srope");
  ASSERT_TRUE(runs[0].contains("phase_probe"));
  EXPECT_FALSE(runs[1].contains("phase_probe"));
  const json& probe = runs[0]["phase_probe"];
  EXPECT_EQ(probe["eval_length"].get<std::int64_t>(), 16);
  EXPECT_EQ(probe["length"].get<std::int64_t>(), 17);  // the BOS and 16 elements
  ASSERT_EQ(probe["heads"].size(), 2u);                // 1 layer × 2 heads
  for (std::size_t h = 0; h < 2; ++h) {
    const json& p = probe["heads"][h];
    EXPECT_EQ(p["layer"].get<std::int64_t>(), 0);
    EXPECT_EQ(p["head"].get<std::int64_t>(), static_cast<std::int64_t>(h));
    EXPECT_GE(p["pair"].get<std::int64_t>(), 0);
    const auto pairs = static_cast<std::int64_t>(p["pair_horizons"].size());
    EXPECT_GE(pairs, 1);
    EXPECT_LT(p["pair"].get<std::int64_t>(), pairs);
    EXPECT_EQ(p["pair_horizons"][p["pair"].get<std::size_t>()], p["horizon"]);
    EXPECT_GE(p["harmonic"].get<int>(), 1);
    EXPECT_LE(p["harmonic"].get<int>(), kMaxHarmonic);
    EXPECT_GE(p["horizon"].get<std::int64_t>(), 1);
    EXPECT_LE(p["horizon"].get<std::int64_t>(), 17);
    EXPECT_TRUE(std::isfinite(p["drift_one"].get<double>()));
    EXPECT_TRUE(std::isfinite(p["drift_zero"].get<double>()));
    EXPECT_GE(p["jitter"].get<double>(), 0.0);
  }
  const std::string table = format_result_table(output.results, output.timings);
  EXPECT_NE(table.find("phase probe (parity, Selective RoPE;"), std::string::npos) << table;
  EXPECT_NE(table.find("gla_srope"), std::string::npos);
}

TEST(TasksExperiment, TinyGridEndToEnd) {
  const ExperimentConfig config = parse_experiment_config(tiny_config());
  // The reference length max(train_lengths) = 8 is added to the evaluation lengths, sorted.
  EXPECT_EQ(config.task.eval_lengths, (std::vector<std::int64_t>{4, 8, 16}));
  EXPECT_EQ(config.arms[1].model.num_layers, 1);
  EXPECT_EQ(config.arms[1].model.beta_range, 2);
  json layers = tiny_config();
  layers["model"]["layers"] = 3;
  EXPECT_EQ(parse_experiment_config(layers).arms[0].model.num_layers, 3);
  EXPECT_EQ(parse_experiment_config(layers).arms[1].model.num_layers, 1);  // the arm's override
  EXPECT_EQ(config.arms[0].model.vocab_size, 2);                           // the task's

  ExperimentOptions options;
  options.out_dir = fresh_dir("tiny").string();
  options.threads = 2;
  options.progress = false;
  const ExperimentOutput output = run_experiment(config, options);
  const json& results = output.results;
  const fs::path out = options.out_dir;

  // results.json: what was returned, with the config, the machine and every run; no clock
  // readings (they are in timings.json).
  std::ifstream in(out / "results.json");
  const json file = json::parse(in);
  EXPECT_EQ(file, results);
  EXPECT_EQ(file["config"], tiny_config());
  EXPECT_EQ(file["machine"]["threads"].get<int>(), 2);
  EXPECT_FALSE(file.contains("wall_time_s"));
  EXPECT_FALSE(file.contains("train_time_s"));
  ASSERT_EQ(file["runs"].size(), 8u);
  for (const json& run : file["runs"])
    for (const char* key : {"wall_time_s", "tokens_per_s", "time_breakdown", "resumed", "timing"})
      EXPECT_FALSE(run.contains(key)) << key;
  // timings.json: the clock, per run in the same order.
  const json timings = json::parse(std::ifstream(out / "timings.json"));
  EXPECT_EQ(timings, output.timings);
  EXPECT_GT(timings["wall_time_s"].get<double>(), 0.0);
  EXPECT_GT(timings["train_time_s"].get<double>(), 0.0);
  EXPECT_LE(timings["train_time_s"].get<double>(), timings["wall_time_s"].get<double>());
  ASSERT_EQ(timings["runs"].size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    const json& t = timings["runs"][i];
    EXPECT_EQ(t["arm"], file["runs"][i]["arm"]);
    EXPECT_EQ(t["lr"], file["runs"][i]["lr"]);
    EXPECT_EQ(t["seed"], file["runs"][i]["seed"]);
    EXPECT_FALSE(t["resumed"].get<bool>());
    EXPECT_GT(t["wall_time_s"].get<double>(), 0.0);
    EXPECT_EQ(t["time_breakdown"]["steps"].get<std::int64_t>(), 12);
  }
  for (const json& run : file["runs"]) {
    EXPECT_EQ(run["final_step"].get<std::int64_t>(), 12);
    EXPECT_TRUE(run["complete"].get<bool>());
    EXPECT_EQ(run["losses"].size(), 12u);
    EXPECT_EQ(run["evals"].size(), 3u);  // steps 4, 8, 12
    ASSERT_EQ(run["eval_by_length"].size(), 3u);
    for (const json& e : run["eval_by_length"]) {
      const auto length = e["length"].get<std::int64_t>();
      const auto& curve = e["cumulative_sequence_accuracy"];
      ASSERT_EQ(curve.size(), static_cast<std::size_t>(length));
      for (std::size_t t = 1; t < curve.size(); ++t)
        EXPECT_LE(num(curve[t]), num(curve[t - 1]));  // non-increasing
      EXPECT_DOUBLE_EQ(num(curve.back()), num(e["sequence_accuracy"]));
      EXPECT_GE(num(e["token_accuracy"]), num(e["sequence_accuracy"]) - 1e-12);
      EXPECT_TRUE(std::isfinite(num(e["loss"])));
    }
    EXPECT_TRUE(fs::exists(out / "checkpoints" /
                           (run["arm"].get<std::string>() + ".lr" +
                            (num(run["lr"]) == 0.003 ? "0.003" : "0.03") + ".seed" +
                            std::to_string(run["seed"].get<int>()) + ".ckpt")));
  }

  // The best lr of each arm is the one with the highest mean sequence accuracy at length 8,
  // recomputed here from the runs.
  ASSERT_EQ(file["summary"].size(), 2u);
  std::map<std::string, double> best_lr;
  for (const json& a : file["summary"]) {
    const std::string arm = a["arm"].get<std::string>();
    double best = -1, lr_of_best = 0;
    for (double lr : {0.003, 0.03}) {
      double sum = 0;
      int n = 0;
      for (const json& run : file["runs"])
        if (run["arm"] == arm && num(run["lr"]) == lr)
          for (const json& e : run["eval_by_length"])
            if (e["length"] == 8) {
              sum += num(e["sequence_accuracy"]);
              ++n;
            }
      ASSERT_EQ(n, 2);
      if (sum / n > best) {
        best = sum / n;
        lr_of_best = lr;
      }
    }
    EXPECT_EQ(num(a["best_lr"]), lr_of_best) << arm;
    best_lr[arm] = lr_of_best;
  }

  // results.csv: a header and one row per arm × lr × seed × length, best_lr flags consistent.
  const auto csv = lines_of(out / "results.csv");
  ASSERT_EQ(csv.size(), 1u + 8u * 3u);
  EXPECT_EQ(csv[0],
            "arm,lr,seed,length,token_accuracy,sequence_accuracy,loss,final_step,stopped_early,"
            "diverged,best_lr,num_kv_pairs,correct_prefix_length");
  for (std::size_t i = 1; i < csv.size(); ++i) {
    std::vector<std::string> f;
    std::stringstream ss(csv[i]);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    ASSERT_EQ(f.size(), 13u) << csv[i];  // num_kv_pairs empty for parity
    EXPECT_EQ(f[10] == "1", std::stod(f[1]) == best_lr[f[0]]) << csv[i];
    EXPECT_EQ(f[7], "12");
    EXPECT_EQ(f[11], "");
    // The correct prefix of the run's curve at that length (data.h: correct_prefix_length).
    bool found = false;
    for (const json& run : file["runs"])
      if (run["arm"] == f[0] && num(run["lr"]) == std::stod(f[1]) &&
          std::to_string(run["seed"].get<int>()) == f[2])
        for (const json& e : run["eval_by_length"])
          if (std::to_string(e["length"].get<std::int64_t>()) == f[3]) {
            found = true;
            EXPECT_EQ(f[12], std::to_string(prefix_length(e))) << csv[i];
          }
    EXPECT_TRUE(found) << csv[i];
  }
  // The summary's correct prefix: the mean over seeds of the runs' at each length.
  for (const json& a : file["summary"])
    for (const json& l : a["lrs"])
      for (const json& len : l["lengths"]) {
        double sum = 0;
        int n = 0;
        for (const json& run : file["runs"])
          if (run["arm"] == a["arm"] && num(run["lr"]) == num(l["lr"]))
            for (const json& e : run["eval_by_length"])
              if (e["length"] == len["length"]) {
                sum += static_cast<double>(prefix_length(e));
                ++n;
              }
        ASSERT_EQ(n, 2);
        EXPECT_DOUBLE_EQ(num(len["correct_prefix_length"]), sum / n);
        if (len["length"] == 8) {
          EXPECT_DOUBLE_EQ(num(l["reference_correct_prefix_length"]), sum / n);
        }
      }

  for (const char* png : {"accuracy_vs_length.png", "token_accuracy_vs_length.png", "loss.png"})
    EXPECT_EQ(png_size(out / png), std::make_pair(800u, 500u)) << png;

  const std::string table = format_result_table(results, output.timings);
  EXPECT_NE(table.find("gla"), std::string::npos) << table;
  EXPECT_NE(table.find("gdn"), std::string::npos) << table;
  EXPECT_NE(table.find("8*"), std::string::npos) << table;
  EXPECT_NE(table.find("8 runs ("), std::string::npos) << table;
  EXPECT_NE(table.find("correct prefix at length 8 per learning rate"), std::string::npos) << table;
  std::ifstream table_file(out / "table.txt");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(table_file), {}), table);
  EXPECT_NE(format_result_table(results).find("8 runs on 2 threads"), std::string::npos);
  const std::string times = format_time_table(output.timings);
  EXPECT_NE(times.find("gdn.lr0.03.seed1"), std::string::npos) << times;
  // Nothing but the outputs: no temporary files.
  for (const auto& dir : {out, out / "checkpoints"})
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// The --profile table: phases per step, then each run's slowest ops by short name.
TEST(TasksExperiment, TimeTableNamesTheSlowestOps) {
  json ops = json::array();
  ops.push_back(
      {{"name", "autograd::engine::evaluate_function: MmBackward0"}, {"calls", 20}, {"s", 0.04}});
  ops.push_back({{"name",
                  "phasor::kernel in autograd::engine::evaluate_function: "
                  "torch::autograd::CppNode<phasor::(anonymous namespace)::GlaFunction>"},
                 {"calls", 2},
                 {"s", 0.02}});
  ops.push_back({{"name", "aten::matmul"}, {"calls", 10}, {"s", 0.01}});
  for (int i = 0; i < 8; ++i)
    ops.push_back({{"name", "aten::op" + std::to_string(i)}, {"calls", 2}, {"s", 0.001}});
  const json breakdown = {{"steps", 2},
                          {"data_s", 0.0},
                          {"forward_s", 0.1},
                          {"backward_s", 0.2},
                          {"optimizer_s", 0.0},
                          {"metrics_s", 0.0},
                          {"eval_s", 0.0},
                          {"checkpoint_s", 0.0},
                          {"other_s", 0.0},
                          {"forward_kernels_s", 0.01},
                          {"forward_ops_s", 0.05},
                          {"backward_kernels_s", 0.02},
                          {"backward_ops_s", 0.1},
                          {"ops", ops}};
  const json timings = {{"name", "t"},
                        {"runs", json::array({{{"arm", "gla"},
                                               {"lr", 0.01},
                                               {"seed", 0},
                                               {"tokens_per_s", 1000.0},
                                               {"time_breakdown", breakdown}}})}};
  const std::string table = format_time_table(timings);
  EXPECT_NE(table.find("gla.lr0.01.seed0: slowest ops, ms per step (calls per step): "
                       "MmBackward0 20.00 (10); GlaFunction (backward): kernel 10.00 (1); "
                       "aten::matmul 5.00 (5); aten::op0 0.50 (1)"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("aten::op4"), std::string::npos) << table;  // eight shown
  EXPECT_EQ(table.find("aten::op5"), std::string::npos) << table;
}

// An interrupted grid (every run stopped at step 6 by train.stop_at_step, as a kill after the
// checkpoint would leave it) resumed with --resume gives the same results.json and results.csv,
// byte for byte, as an uninterrupted grid; a finished grid resumed trains nothing. (Kills at
// random moments: tests/tasks_kill_resume_test.py.)
TEST(TasksExperiment, ResumeContinuesInterruptedGrid) {
  json c = tiny_config();
  c["arms"].erase(1);
  c["seeds"] = json::array({3});
  c["train"]["checkpoint_every"] = 3;
  ExperimentOptions options;
  options.threads = 1;
  options.progress = false;

  options.out_dir = fresh_dir("uninterrupted").string();
  const json straight = run_experiment(parse_experiment_config(c), options).results;
  const fs::path straight_dir = options.out_dir;

  options.out_dir = fresh_dir("interrupted").string();
  json cut = c;
  cut["train"]["stop_at_step"] = 6;
  const json partial = run_experiment(parse_experiment_config(cut), options).results;
  for (const json& run : partial["runs"]) {
    EXPECT_EQ(run["final_step"].get<std::int64_t>(), 6);
    EXPECT_FALSE(run["complete"].get<bool>());
  }
  // A stale temporary file of a killed writer is removed by the next invocation.
  const fs::path stale = fs::path(options.out_dir) / "results.json.tmp.999999999";
  std::ofstream(stale) << "{";
  options.resume = true;
  const ExperimentOutput resumed = run_experiment(parse_experiment_config(c), options);
  EXPECT_FALSE(fs::exists(stale));
  ASSERT_EQ(resumed.results["runs"].size(), straight["runs"].size());
  for (std::size_t i = 0; i < straight["runs"].size(); ++i) {
    const json& a = straight["runs"][i];
    const json& b = resumed.results["runs"][i];
    EXPECT_TRUE(resumed.timings["runs"][i]["resumed"].get<bool>());
    EXPECT_EQ(a["losses"], b["losses"]);
    EXPECT_EQ(a["evals"], b["evals"]);
    EXPECT_EQ(a["eval_by_length"], b["eval_by_length"]);
  }
  const auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const char* name : {"results.json", "results.csv", "accuracy_vs_length.png", "loss.png"}) {
    EXPECT_FALSE(bytes(straight_dir / name).empty()) << name;
    EXPECT_EQ(bytes(straight_dir / name), bytes(fs::path(options.out_dir) / name)) << name;
  }

  // Finished runs are read back, not retrained: a record marked here survives the resume.
  const fs::path record = fs::path(options.out_dir) / "checkpoints" / "gla.lr0.003.seed3.json";
  json r = json::parse(std::ifstream(record));
  r["marker"] = true;
  std::ofstream(record) << r.dump();
  const ExperimentOutput again_output = run_experiment(parse_experiment_config(c), options);
  const json& again = again_output.results;
  EXPECT_TRUE(again["runs"][0].value("marker", false));
  EXPECT_EQ(again["runs"][0]["losses"], straight["runs"][0]["losses"]);
  // Its table says that the wall time is this invocation's, which trained nothing: both runs
  // were read back.
  for (const json& t : again_output.timings["runs"])
    EXPECT_TRUE(t.value("finished_earlier", false));
  const std::string again_table = format_result_table(again, again_output.timings);
  EXPECT_NE(again_table.find("(this invocation; 2 of the runs finished in earlier ones)"),
            std::string::npos)
      << again_table;
  EXPECT_EQ(format_result_table(resumed.results, resumed.timings).find("finished in earlier"),
            std::string::npos);

  // A finished run of other settings is not silently mixed in.
  json changed = c;
  changed["train"]["steps"] = 13;
  try {
    run_experiment(parse_experiment_config(changed), options);
    ADD_FAILURE() << "resumed a grid of other settings";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'resume'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("differs in train"), std::string::npos) << e.what();
  }
}

// The other task families through the runner: MQAR (vocabulary from the task, evaluation at a
// longer length) and copying (string lengths; the reference length is max_len; char accuracy).
TEST(TasksExperiment, MqarAndCopyTasks) {
  ExperimentOptions options;
  options.threads = 1;
  options.progress = false;
  json c = tiny_config();
  c["arms"].erase(1);
  c["seeds"] = json::array({0});
  c["lr_grid"] = json::array({0.01});
  c["train"]["steps"] = 3;
  c["task"] = {{"name", "mqar"},           {"vocab_size", 40},         {"num_kv_pairs", 2},
               {"train_lengths", {8, 16}}, {"eval_lengths", {16, 32}}, {"eval_batch", 8}};
  options.out_dir = fresh_dir("mqar").string();
  const json m = run_experiment(parse_experiment_config(c), options).results;
  EXPECT_EQ(m["runs"][0]["model"]["vocab_size"].get<int>(), 40);
  EXPECT_EQ(m["eval_lengths"], json::array({16, 32}));
  EXPECT_EQ(m["runs"][0]["eval_by_length"][1]["cumulative_sequence_accuracy"].size(), 32u);
  EXPECT_FALSE(m["runs"][0].contains("eval_points"));

  // Eval points: other (length, num_kv_pairs) than the training's, reported per run, in the
  // summary, the csv (with their num_kv_pairs; the length rows carry the task's) and the table.
  c["task"]["eval_points"] = {{32, 8}, {16, 2}};
  options.out_dir = fresh_dir("mqar_points").string();
  const json q = run_experiment(parse_experiment_config(c), options).results;
  const json& points = q["runs"][0]["eval_points"];
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0]["length"].get<int>(), 32);
  EXPECT_EQ(points[0]["num_kv_pairs"].get<int>(), 8);
  EXPECT_EQ(points[0]["cumulative_sequence_accuracy"].size(), 32u);
  EXPECT_EQ(points[1]["num_kv_pairs"].get<int>(), 2);
  const json& summary_points = q["summary"][0]["lrs"][0]["points"];
  ASSERT_EQ(summary_points.size(), 2u);
  EXPECT_EQ(num(summary_points[0]["sequence_accuracy"]), num(points[0]["sequence_accuracy"]));
  EXPECT_EQ(num(summary_points[1]["token_accuracy"]), num(points[1]["token_accuracy"]));
  const auto csv = lines_of(fs::path(options.out_dir) / "results.csv");
  ASSERT_EQ(csv.size(), 1u + 2u + 2u);
  // num_kv_pairs, then correct_prefix_length: the last two fields.
  const auto last_two = [](const std::string& line) {
    const std::size_t last = line.rfind(',');
    return line.substr(line.rfind(',', last - 1) + 1);
  };
  const auto prefix_of = [](const json& e) { return std::to_string(prefix_length(e)); };
  // Length 16, the task's num_kv_pairs.
  EXPECT_EQ(last_two(csv[1]), "2," + prefix_of(q["runs"][0]["eval_by_length"][0])) << csv[1];
  EXPECT_EQ(csv[3].rfind("gla,0.01,0,32,", 0), 0u) << csv[3];  // the point (32, 8)
  EXPECT_EQ(last_two(csv[3]), "8," + prefix_of(points[0])) << csv[3];
  const std::string table = format_result_table(q);
  EXPECT_NE(table.find("32/kv8"), std::string::npos) << table;
  EXPECT_NE(table.find("16/kv2"), std::string::npos) << table;
  c["task"].erase("eval_points");

  c["task"] = {{"name", "copy"}, {"context", 32},          {"min_len", 1},
               {"max_len", 4},   {"eval_lengths", {2, 8}}, {"eval_batch", 8}};
  options.out_dir = fresh_dir("copy").string();
  options.threads = 0;  // LibTorch's ops on one thread, phasor's kernels on every core
  const json k = run_experiment(parse_experiment_config(c), options).results;
  EXPECT_EQ(k["machine"]["threads"].get<unsigned>(), 1u);
  if (std::getenv("PHASOR_NUM_THREADS") == nullptr) {
    EXPECT_EQ(k["machine"]["kernel_threads"].get<unsigned>(),
              std::max(1u, std::thread::hardware_concurrency()));
  }
  EXPECT_EQ(k["reference_length"].get<int>(), 4);
  ASSERT_EQ(k["runs"][0]["eval_by_length"].size(), 3u);
  for (const json& e : k["runs"][0]["eval_by_length"]) {
    const double ch = num(e["char_accuracy"]);
    EXPECT_GE(ch, 0.0);
    EXPECT_LE(ch, 1.0);
    EXPECT_EQ(e["cumulative_sequence_accuracy"].size(),
              static_cast<std::size_t>(2 * e["length"].get<int>() + 3));
  }
}

std::string config_error(const json& config) {
  try {
    parse_experiment_config(config);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// tiny_config() cut to one run: its GLA arm, lr 0.003, seed 0.
json one_run_config(const std::string& name) {
  json c = tiny_config();
  c["name"] = name;
  c["arms"].erase(1);
  c["lr_grid"] = {0.003};
  c["seeds"] = {0};
  return c;
}

// early_stop_length moves the training's periodic evaluation (and its early stopping) from the
// reference length to another evaluation length, as the official Selective RoPE code stops on its
// test length.
TEST(TasksExperiment, EarlyStopLengthMovesThePeriodicEvaluation) {
  json c = one_run_config("tiny_early_stop_length");
  c["train"]["target_accuracy"] = 0.01;  // reached at the first evaluation (step 4)
  ExperimentOptions options;
  options.progress = false;
  for (const std::int64_t length : {std::int64_t{0}, std::int64_t{16}}) {
    if (length > 0) c["task"]["early_stop_length"] = length;
    options.out_dir = fresh_dir("tiny_early_stop_length_" + std::to_string(length)).string();
    const ExperimentOutput output = run_experiment(parse_experiment_config(c), options);
    const json& run = output.results["runs"][0];
    EXPECT_EQ(run["evals_length"].get<std::int64_t>(), length > 0 ? 16 : 8);  // reference: 8
    EXPECT_TRUE(run["stopped_early"].get<bool>());
    EXPECT_EQ(run["final_step"].get<std::int64_t>(), 4);
  }
}

// The table lists each run's periodic evaluations: the best sequence accuracy (the first step that
// reached it, the token accuracy there) and the last — what a best-checkpoint protocol reports.
TEST(TasksExperiment, TableReportsTheBestPeriodicEvaluation) {
  json c = one_run_config("tiny_periodic");
  c["task"]["early_stop_length"] = 16;
  ExperimentOptions options;
  options.progress = false;
  options.out_dir = fresh_dir("tiny_periodic").string();
  ExperimentOutput output = run_experiment(parse_experiment_config(c), options);
  json& run = output.results["runs"][0];
  ASSERT_EQ(run["evals"].size(), 3u);  // steps 4, 8, 12
  // Known values in place of the trained ones: the best is the first of two equal maxima.
  const double seq[] = {0.25, 0.5, 0.5};
  const double tok[] = {0.6, 0.7, 0.8};
  for (std::size_t i = 0; i < 3; ++i) {
    run["evals"][i]["sequence_accuracy"] = seq[i];
    run["evals"][i]["token_accuracy"] = tok[i];
  }
  run["evals"][2]["sequence_accuracy"] = 0.125;  // the last falls back below the best
  const std::string table = format_result_table(output.results, output.timings);
  const auto header = table.find("periodic evaluations (held-out rows of the early-stopping");
  ASSERT_NE(header, std::string::npos) << table;
  const std::string rest = table.substr(header);
  std::istringstream lines(rest);
  std::string line;
  std::getline(lines, line);  // the title
  std::getline(lines, line);  // the column names
  EXPECT_NE(line.find("best_seq"), std::string::npos) << line;
  std::getline(lines, line);
  std::istringstream fields(line);
  std::string arm, lr;
  std::int64_t seed = -1, length = -1, evals = -1, step = -1;
  double best_seq = -1, best_tok = -1, last_seq = -1;
  fields >> arm >> lr >> seed >> length >> evals >> best_seq >> best_tok >> step >> last_seq;
  ASSERT_FALSE(fields.fail()) << line;
  EXPECT_EQ(arm, "gla");
  EXPECT_EQ(seed, 0);
  EXPECT_EQ(length, 16);
  EXPECT_EQ(evals, 3);
  EXPECT_DOUBLE_EQ(best_seq, 0.5);
  EXPECT_DOUBLE_EQ(best_tok, 0.7);
  EXPECT_EQ(step, 8);
  EXPECT_DOUBLE_EQ(last_seq, 0.125);
  // Runs without periodic evaluations (eval_every 0) print no such section.
  run["evals"] = json::array();
  EXPECT_EQ(format_result_table(output.results, output.timings).find("periodic evaluations"),
            std::string::npos);
}

TEST(TasksExperiment, ConfigErrorsNameTheKeyPath) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"misspelt mixer",
       [](json& c) { c["arms"][1]["model"]["mixer"] = "glaa"; },
       {"experiment config: argument 'config.arms[1].model.mixer': expected one of", "gla",
        "got 'glaa'"}},
      {"no name", [](json& c) { c.erase("name"); }, {"'config.name': expected a value"}},
      {"bad name", [](json& c) { c["name"] = "a/b"; }, {"'config.name'", "got 'a/b'"}},
      {"unknown task",
       [](json& c) { c["task"]["name"] = "s4"; },
       {"'config.task.name': expected one of mqar, copy", "got 's4'"}},
      {"unknown key",
       [](json& c) { c["trian"] = json::object(); },
       {"'config.trian': expected one of the documented keys"}},
      {"unknown task key",
       [](json& c) { c["task"]["num_kv_pairs"] = 4; },
       {"'config.task.num_kv_pairs'"}},
      {"early stop length not evaluated",
       [](json& c) { c["task"]["early_stop_length"] = 32; },
       {"'config.task.early_stop_length': expected one of eval_lengths (4, 16) or the reference "
        "length 8",
        "got 32"}},
      {"lr in train",
       [](json& c) { c["train"]["lr"] = 0.1; },
       {"'config.train.lr': expected no value"}},
      {"zero steps", [](json& c) { c["train"]["steps"] = 0; }, {"'config.train.steps'"}},
      {"unknown train key", [](json& c) { c["train"]["stpes"] = 3; }, {"'config.train.stpes'"}},
      {"negative lr",
       [](json& c) { c["lr_grid"][1] = -0.1; },
       {"'config.lr_grid[1]': expected a positive finite number"}},
      {"no lr grid", [](json& c) { c.erase("lr_grid"); }, {"'config.lr_grid'"}},
      {"repeated seed",
       [](json& c) {
         c["seeds"] = json::array({1, 1});
       },
       {"'config.seeds[1]': expected distinct seeds"}},
      {"negative seed", [](json& c) { c["seeds"] = json::array({-1}); }, {"'config.seeds[0]'"}},
      {"repeated arm",
       [](json& c) { c["arms"][1]["name"] = "gla"; },
       {"'config.arms[1].name': expected a name no other arm has"}},
      {"no arms",
       [](json& c) { c["arms"] = json::array(); },
       {"'config.arms': expected a non-empty array"}},
      {"heads",
       [](json& c) { c["arms"][0]["model"]["num_heads"] = 3; },
       {"'config.arms[0].model.hidden_size': expected a multiple of num_heads"}},
      {"layer option",
       [](json& c) {
         c["model"]["mixer_options"] = {{"bogus", 1}};
       },
       {"'config.arms[0].model.mixer_options.bogus': expected one of the options"}},
      {"position option",
       [](json& c) {
         c["arms"][0]["model"]["pos_encoding"] = "rope";
         c["arms"][0]["model"]["pos_options"] = {{"rope_thta", 1}};
       },
       {"'config.arms[0].model.pos_options.rope_thta': expected one of the options"}},
      {"beta range",
       [](json& c) { c["arms"][1]["model"]["beta_range"] = 3; },
       {"'config.arms[1].model.beta_range'"}},
      {"zero length",
       [](json& c) { c["task"]["eval_lengths"][1] = 0; },
       {"'config.task.eval_lengths[1]': expected a positive integer"}},
      {"repeated length",
       [](json& c) {
         c["task"]["eval_lengths"] = json::array({4, 4});
       },
       {"'config.task.eval_lengths[1]': expected distinct lengths"}},
      {"no train lengths",
       [](json& c) { c["task"].erase("train_lengths"); },
       {"'config.task.train_lengths': expected a value"}},
      {"mqar odd length",
       [](json& c) {
         c["task"] = {{"name", "mqar"},
                      {"vocab_size", 64},
                      {"num_kv_pairs", 2},
                      {"train_lengths", {16}},
                      {"eval_lengths", {16, 17}}};
       },
       {"'config.task.eval_lengths[1]': expected a length valid for mqar (even, ≥ "
        "4·num_kv_pairs = 8, < vocab_size = 64), got 17 (mqar: argument 'seq_len': expected an "
        "even number, got 17)"}},
      {"mqar vocabulary",
       [](json& c) {
         c["task"] = {{"name", "mqar"},
                      {"vocab_size", 20},
                      {"num_kv_pairs", 2},
                      {"train_lengths", {16}},
                      {"eval_lengths", {32}}};
       },
       {"'config.task.eval_lengths[0]': expected a length valid for mqar", "got 32 (",
        "argument 'vocab_size': expected > seq_len (32), got 20)"}},
      {"mqar point too dense",
       [](json& c) {
         c["task"] = {{"name", "mqar"},       {"vocab_size", 64},
                      {"num_kv_pairs", 2},    {"train_lengths", {16}},
                      {"eval_lengths", {16}}, {"eval_points", {{32, 4}, {32, 9}}}};
       },
       {"'config.task.eval_points[1]': expected a point valid for mqar", "got array [32,9] ("}},
      {"mqar repeated point",
       [](json& c) {
         c["task"] = {{"name", "mqar"},       {"vocab_size", 64},
                      {"num_kv_pairs", 2},    {"train_lengths", {16}},
                      {"eval_lengths", {16}}, {"eval_points", {{32, 4}, {32, 4}}}};
       },
       {"'config.task.eval_points[1]': expected distinct points, got array [32,4] twice"}},
      {"mqar point shape",
       [](json& c) {
         c["task"] = {{"name", "mqar"},        {"vocab_size", 64},     {"num_kv_pairs", 2},
                      {"train_lengths", {16}}, {"eval_lengths", {16}}, {"eval_points", {32}}};
       },
       {"'config.task.eval_points[0]': expected a pair [length, num_kv_pairs] of positive "
        "integers, got number 32"}},
      {"eval points of parity",
       [](json& c) {
         c["task"]["eval_points"] = {{32, 4}};
       },
       {"'config.task.eval_points': expected one of the documented keys"}},
      {"copy train lengths",
       [](json& c) {
         c["task"] = {{"name", "copy"},
                      {"context", 64},
                      {"max_len", 10},
                      {"train_lengths", {8}},
                      {"eval_lengths", {10}}};
       },
       {"'config.task.train_lengths': expected no value for copy"}},
      {"copy context",
       [](json& c) {
         c["task"] = {{"name", "copy"}, {"context", 16}, {"max_len", 10}, {"eval_lengths", {10}}};
       },
       {"'config.task.context': expected ≥ 2·max_len + 3"}},
      {"small vocabulary",
       [](json& c) { c["model"]["vocab_size"] = 1; },
       {"'config.arms[0].model.vocab_size'"}},
  };
  for (const Case& k : cases) {
    json c = tiny_config();
    k.edit(c);
    const std::string e = config_error(c);
    for (const auto& needle : k.needles)
      EXPECT_NE(e.find(needle), std::string::npos) << k.what << ": " << e;
  }
  // A valid copy and mqar config parse, with the reference length added to the eval lengths.
  json copy = tiny_config();
  copy["task"] = {{"name", "copy"}, {"context", 64}, {"max_len", 10}, {"eval_lengths", {5, 20}}};
  EXPECT_EQ(parse_experiment_config(copy).task.eval_lengths,
            (std::vector<std::int64_t>{5, 10, 20}));
  EXPECT_EQ(parse_experiment_config(copy).arms[0].model.vocab_size, kCopyVocabSize);
  // A word problem with "bos": one more token id (the BOS), rows one token longer, lengths
  // still counting the elements.
  json bos = tiny_config();
  bos["task"]["bos"] = true;
  const ExperimentConfig with_bos = parse_experiment_config(bos);
  EXPECT_EQ(with_bos.arms[0].model.vocab_size, 3);
  EXPECT_EQ(parse_experiment_config(tiny_config()).arms[0].model.vocab_size, 2);
  EXPECT_EQ(with_bos.task.reference_length(), 8);
  const Batch train = with_bos.task.train_batch(1, 2, 0),
              eval = with_bos.task.eval_batch_at(16, 2, 0);
  EXPECT_EQ(train.cols, 9);
  EXPECT_EQ(eval.cols, 17);
  EXPECT_EQ(eval.input(1, 0), 2);
  EXPECT_EQ(eval.target(1, 0), kIgnoreIndex);
  bos["task"]["bos"] = 1;
  EXPECT_NE(config_error(bos).find("'config.task.bos'"), std::string::npos) << config_error(bos);

  const std::string missing = (fs::temp_directory_path() / "no_such_config_phasor.json").string();
  try {
    load_experiment_config(missing);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

// Every config the repository ships (tasks/configs/<suite>/*.json: quick, full, diagnostics,
// encodings, claims, …) parses and validates — keys, values, size limits and each arm's layers,
// which load_experiment_config builds once — and no two share a name (the default output folder).
// The claims suite (docs/claims.md, "Reproduction by training") must hold its small and full
// configs, each with at least 3 seeds.
TEST(TasksExperiment, ShippedConfigsParse) {
  const fs::path root = PHASOR_CONFIG_DIR;
  ASSERT_TRUE(fs::is_directory(root)) << root;
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << "no configs under " << root;
  std::map<std::string, fs::path> names;
  std::vector<std::string> claims;
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    ExperimentConfig config;
    try {
      config = load_experiment_config(file.string());
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    const auto [it, inserted] = names.emplace(config.name, file);
    EXPECT_TRUE(inserted) << "name '" << config.name << "' also in " << it->second;
    if (file.parent_path().filename() == "claims") {
      claims.push_back(file.stem().string());
      EXPECT_GE(config.seeds.size(), 3u) << "a claim's config runs at least 3 seeds";
      EXPECT_EQ(config.name, "claims_" + file.stem().string());
    }
  }
  const std::vector<std::string> expected_claims = {
      "copy_small",
      "mqar_L128_kv8_full",
      "mqar_L256_kv16_full",
      "mqar_L64_kv4_full",
      "mqar_d128_small",
      "mqar_d128_small_selective_rope",
      "mqar_small",
      "state_tracking_full",
      "state_tracking_long",
      "state_tracking_mixed_lengths",
      "state_tracking_mixed_lengths_official_bos",
      "state_tracking_mixed_lengths_official_bos_gate_1",
      "state_tracking_small"};
  EXPECT_EQ(claims, expected_claims);
}

}  // namespace
}  // namespace phasor::tasks
