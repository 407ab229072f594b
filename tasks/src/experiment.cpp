// The experiment runner (see phasor/tasks/experiment.h).
#include "phasor/tasks/experiment.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "check.h"
#include "phasor/common.h"
#include "phasor/tasks/blas.h"
#include "phasor/tasks/data_parallel.h"
#include "phasor/tasks/files.h"
#include "phasor/tasks/phase_probe.h"
#include "phasor/tasks/plot.h"

namespace phasor::tasks {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::fail;

constexpr const char* kOp = "experiment config";

std::string in_quotes(const std::string& s) {
  return "'" + s + "'";
}

std::string given(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + s;
}

// Reads an object's keys by path, remembering which were used so that finish() rejects the
// others (a typo must not silently fall back to a default).
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j.is_object()) fail(kOp, path_, "a JSON object", given(j));
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  std::string at(const std::string& key) const { return path_ + "." + key; }
  const json& get(const std::string& key) {
    used_.insert(key);
    return j_.at(key);
  }
  const json& required(const std::string& key) {
    if (!has(key)) fail(kOp, at(key), "a value (required)", "nothing");
    return get(key);
  }
  std::int64_t integer(const std::string& key, std::int64_t fallback, std::int64_t minimum,
                       std::int64_t maximum = kMaxSequenceLength) {
    if (!has(key)) return fallback;
    const json& v = get(key);
    if (!v.is_number_integer()) fail(kOp, at(key), "an integer", given(v));
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(maximum))
      fail(kOp, at(key), "≤ " + std::to_string(maximum), given(v));
    const auto x = v.get<std::int64_t>();
    if (x < minimum) fail(kOp, at(key), "≥ " + std::to_string(minimum), std::to_string(x));
    if (x > maximum) fail(kOp, at(key), "≤ " + std::to_string(maximum), std::to_string(x));
    return x;
  }
  double number(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    const json& v = get(key);
    if (!v.is_number()) fail(kOp, at(key), "a number", given(v));
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    const json& v = get(key);
    if (!v.is_boolean()) fail(kOp, at(key), "true or false", given(v));
    return v.get<bool>();
  }
  std::string string(const std::string& key) {
    const json& v = required(key);
    if (!v.is_string()) fail(kOp, at(key), "a string", given(v));
    return v.get<std::string>();
  }
  std::vector<std::int64_t> lengths(const std::string& key) {
    const json& v = get(key);
    if (!v.is_array() || v.empty())
      fail(kOp, at(key), "a non-empty array of positive integers", given(v));
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<std::int64_t>() < 1 ||
          v[i].get<std::int64_t>() > kMaxSequenceLength)
        fail(kOp, at(key) + "[" + std::to_string(i) + "]", "a positive integer (at most 2^20)",
             given(v[i]));
      out.push_back(v[i].get<std::int64_t>());
    }
    return out;
  }
  void finish() const {
    for (const auto& kv : j_.items())
      if (!used_.count(kv.key()))
        fail(kOp, at(kv.key()), "one of the documented keys (see tasks/experiment.h)",
             "an unknown key");
  }

 private:
  const json& j_;
  std::string path_;
  std::set<std::string> used_;
};

// Rewrites "<op>: argument '<key>': expected …" of model.h / train.h / data.h as the key path
// "<path>.<key>": expected … (or prefixes the path when the message has another form).
[[noreturn]] void rethrow_at(const std::string& path, const Error& e) {
  static const std::regex form("^([^:]*): argument '([^']*)': (expected .*)$");
  std::smatch m;
  const std::string what = e.what();
  if (std::regex_match(what, m, form)) {
    // The layer factories of model.cpp name themselves "mixer 'gla'", "pos_encoding 'rope'":
    // their keys live in mixer_options / pos_options.
    const std::string op = m[1].str(), key = m[2].str();
    const std::string options = op.rfind("mixer '", 0) == 0          ? ".mixer_options"
                                : op.rfind("pos_encoding '", 0) == 0 ? ".pos_options"
                                                                     : "";
    const std::string full = key == "config" ? path : path + options + "." + key;
    throw Error(std::string(kOp) + ": argument '" + full + "': " + m[3].str());
  }
  throw Error(std::string(kOp) + ": argument '" + path + "': " + what);
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"mqar", "copy", "parity", "s2", "a3", "s3", "s5"};
  return names;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

TaskSpec parse_task(const json& j) {
  Reader r(j, "config.task");
  TaskSpec t;
  t.name = r.string("name");
  if (std::find(task_names().begin(), task_names().end(), t.name) == task_names().end())
    fail(kOp, r.at("name"), "one of " + join(task_names()), in_quotes(t.name));
  if (t.name == "mqar") {
    t.mqar.num_kv_pairs = r.integer("num_kv_pairs", t.mqar.num_kv_pairs, 1);
    t.mqar.vocab_size = r.integer("vocab_size", t.mqar.vocab_size, 2, kMaxVocabSize);
    t.mqar.power_a = r.number("power_a", t.mqar.power_a);
    t.mqar.random_filler = r.boolean("random_filler", t.mqar.random_filler);
    if (r.has("eval_points")) {
      const json& v = r.get("eval_points");
      if (!v.is_array() || v.empty())
        fail(kOp, r.at("eval_points"), "a non-empty array of [length, num_kv_pairs] pairs",
             given(v));
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::string at = r.at("eval_points") + "[" + std::to_string(i) + "]";
        const json& e = v[i];
        if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() ||
            !e[1].is_number_integer() || e[0].get<std::int64_t>() < 1 ||
            e[1].get<std::int64_t>() < 1)
          fail(kOp, at, "a pair [length, num_kv_pairs] of positive integers", given(e));
        if (e[0].get<std::int64_t>() > kMaxSequenceLength ||
            e[1].get<std::int64_t>() > kMaxSequenceLength)
          fail(kOp, at, "a length and num_kv_pairs of at most 2^20", given(e));
        TaskSpec::MqarPoint p{e[0].get<std::int64_t>(), e[1].get<std::int64_t>()};
        MqarConfig c = t.mqar;
        c.seq_len = p.length;
        c.num_kv_pairs = p.num_kv_pairs;
        try {
          validate(c);
        } catch (const Error& err) {
          fail(kOp, at,
               "a point valid for mqar (even length ≥ 4·num_kv_pairs, < vocab_size = " +
                   std::to_string(t.mqar.vocab_size) + ")",
               given(e) + " (" + err.what() + ")");
        }
        for (const auto& q : t.mqar_eval_points)
          if (q.length == p.length && q.num_kv_pairs == p.num_kv_pairs)
            fail(kOp, at, "distinct points", given(e) + " twice");
        t.mqar_eval_points.push_back(p);
      }
    }
  } else if (t.name == "copy") {
    t.copy.context = r.integer("context", t.copy.context, 1);
    t.copy.min_len = r.integer("min_len", t.copy.min_len, 1);
    t.copy.max_len = r.integer("max_len", t.copy.max_len, 1);
    try {
      validate(t.copy);
    } catch (const Error& e) {
      rethrow_at("config.task", e);
    }
    if (r.has("train_lengths"))
      fail(kOp, r.at("train_lengths"),
           "no value for copy (training rows hold `context` tokens of strings of min_len … "
           "max_len letters)",
           given(j.at("train_lengths")));
  } else {
    t.word.group = group_from_string(t.name == "parity" ? "S2"
                                     : t.name == "s2"   ? "S2"
                                     : t.name == "a3"   ? "A3"
                                     : t.name == "s3"   ? "S3"
                                                        : "S5");
    t.word.final_only = r.boolean("final_only", false);
    t.word.bos = r.boolean("bos", false);
  }
  if (t.name != "copy") {
    if (!r.has("train_lengths")) fail(kOp, r.at("train_lengths"), "a value (required)", "nothing");
    t.train_lengths = r.lengths("train_lengths");
  }
  if (!r.has("eval_lengths")) fail(kOp, r.at("eval_lengths"), "a value (required)", "nothing");
  t.eval_lengths = r.lengths("eval_lengths");
  t.eval_batch = r.integer("eval_batch", t.eval_batch, 1, kMaxBatchTokens);
  if (r.has("early_stop_length")) {
    t.early_stop_length = r.integer("early_stop_length", 0, 1, kMaxSequenceLength);
    if (t.early_stop_length != t.reference_length() &&
        std::find(t.eval_lengths.begin(), t.eval_lengths.end(), t.early_stop_length) ==
            t.eval_lengths.end()) {
      std::vector<std::string> lengths;
      for (std::int64_t length : t.eval_lengths) lengths.push_back(std::to_string(length));
      fail(kOp, r.at("early_stop_length"),
           "one of eval_lengths (" + join(lengths) + ") or the reference length " +
               std::to_string(t.reference_length()),
           std::to_string(t.early_stop_length));
    }
  }
  r.finish();

  // Every length must be valid for the generator: try a one-row batch of each.
  const auto check_length = [&](const std::string& key, std::size_t i, std::int64_t length) {
    try {
      if (t.name == "copy")
        copy_eval(length, 1, 0);
      else if (t.name == "mqar") {
        MqarConfig c = t.mqar;
        c.seq_len = length;
        validate(c);
      }
    } catch (const Error& e) {
      const std::string expected =
          t.name == "mqar" ? "a length valid for mqar (even, ≥ 4·num_kv_pairs = " +
                                 std::to_string(4 * t.mqar.num_kv_pairs) +
                                 ", < vocab_size = " + std::to_string(t.mqar.vocab_size) + ")"
                           : "a length valid for " + t.name;
      fail(kOp, "config.task." + key + "[" + std::to_string(i) + "]", expected,
           std::to_string(length) + " (" + e.what() + ")");
    }
  };
  for (std::size_t i = 0; i < t.train_lengths.size(); ++i)
    check_length("train_lengths", i, t.train_lengths[i]);
  for (std::size_t i = 0; i < t.eval_lengths.size(); ++i)
    check_length("eval_lengths", i, t.eval_lengths[i]);
  std::set<std::int64_t> seen;
  for (std::size_t i = 0; i < t.eval_lengths.size(); ++i)
    if (!seen.insert(t.eval_lengths[i]).second)
      fail(kOp, "config.task.eval_lengths[" + std::to_string(i) + "]", "distinct lengths",
           std::to_string(t.eval_lengths[i]) + " twice");
  if (!seen.count(t.reference_length())) t.eval_lengths.push_back(t.reference_length());
  std::sort(t.eval_lengths.begin(), t.eval_lengths.end());
  // The evaluation batches: eval_batch rows of the longest evaluation row (every factor ≤ 2^26).
  std::int64_t longest = t.eval_lengths.back();
  for (const auto& p : t.mqar_eval_points) longest = std::max(longest, p.length);
  if (t.name == "copy") longest = 2 * longest + 3;
  if (t.word.bos) {  // word problems only (parsed for them alone)
    WordProblemConfig longest_row = t.word;
    longest_row.seq_len = longest;
    longest = longest_row.row_length();
  }
  if (t.eval_batch * longest > kMaxBatchTokens)
    fail(kOp, r.at("eval_batch"),
         "at most 2^26 tokens per evaluation batch (eval_batch × the longest evaluation row of " +
             std::to_string(longest) + " tokens)",
         std::to_string(t.eval_batch));
  return t;
}

// Base model JSON merged with an arm's overrides; "layers" is accepted for num_layers.
ModelConfig parse_model(json base, const json& overrides, const std::string& path,
                        std::int64_t vocab_size) {
  if (!overrides.is_object()) fail(kOp, path, "a JSON object", given(overrides));
  json patch = overrides;
  for (json* j : {&base, &patch})
    if (j->contains("layers")) {  // shorthand for num_layers, in the defaults or an arm
      (*j)["num_layers"] = (*j)["layers"];
      j->erase("layers");
    }
  base.merge_patch(patch);
  if (!base.contains("vocab_size")) base["vocab_size"] = vocab_size;
  ModelConfig c;
  try {
    from_json(base, c);
  } catch (const Error& e) {
    rethrow_at(path, e);
  }
  if (c.vocab_size < vocab_size)
    fail(kOp, path + ".vocab_size", "≥ the task's vocabulary (" + std::to_string(vocab_size) + ")",
         std::to_string(c.vocab_size));
  // Build it once: the layer factories check their options only then. One block is enough (they
  // are all alike) and bounds what parsing allocates; the model's parameter count follows from it.
  std::int64_t total = 0, block = 0;
  try {
    ModelConfig one_block = c;
    one_block.num_layers = 1;
    LanguageModel probe(one_block);
    for (const auto& p : probe->named_parameters()) {
      total += p.value().numel();
      if (p.key().rfind("block0.", 0) == 0) block += p.value().numel();
    }
  } catch (const Error& e) {
    rethrow_at(path, e);
  } catch (const c10::Error& e) {
    throw Error(std::string(kOp) + ": argument '" + path +
                "': expected a model that builds, got: " + e.what_without_backtrace());
  }
  const std::int64_t parameters = total + (c.num_layers - 1) * block;  // ≤ 2^27 + 1023 · 2^26
  if (parameters > kMaxModelParameters)
    fail(kOp, path, "a model of at most 2^27 parameters",
         std::to_string(parameters) + " (" + std::to_string(block) + " per block)");
  return c;
}

std::string lr_string(double lr) {
  return fmt::format("{:g}", lr);
}

std::string run_stem(const std::string& arm, double lr, std::uint64_t seed) {
  return fmt::format("{}.lr{}.seed{}", arm, lr_string(lr), seed);
}

// Every output file is replaced atomically and durably (files.h): a run killed at any moment
// leaves each file complete, old or new, and --resume starts from there.
void write_text(const fs::path& path, const std::string& text) {
  write_file_atomically(path.string(), text, "run_experiment", "out_dir");
}

// Rows per forward pass of an evaluation: the logits of a pass, rows × T × V floats, stay under
// 2^24 elements (64 MiB in float32; cross-entropy makes one more such tensor), so that long
// evaluation lengths with a large vocabulary (MQAR: V = 8192, T = 4096 would be 8.6 GB for 64
// rows) do not exhaust memory. At least one row, at most 64.
std::int64_t rows_per_pass(const Batch& b, std::int64_t vocab_size) {
  const std::int64_t per_row = std::max<std::int64_t>(1, b.cols * vocab_size);
  return std::clamp<std::int64_t>((std::int64_t{1} << 24) / per_row, 1, 64);
}

json eval_json(std::int64_t length, const EvalResult& r) {
  return {{"length", length},
          {"loss", r.loss},
          {"token_accuracy", r.metrics.token_accuracy},
          {"sequence_accuracy", r.metrics.sequence_accuracy},
          {"cumulative_sequence_accuracy", r.metrics.prefix_sequence_accuracy}};
}

// NaN is not JSON: nlohmann writes null. Read back null as NaN.
double num(const json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// data.h's correct_prefix_length of an evaluation's cumulative curve (eval_json). Computed from
// the curve rather than stored beside it, so that records written before it existed (--resume)
// are summarised the same way.
std::int64_t prefix_length_of(const json& e) {
  std::vector<double> curve;
  for (const json& v : e.at("cumulative_sequence_accuracy")) curve.push_back(num(v));
  return correct_prefix_length(curve);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : s / static_cast<double>(v.size());
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::int64_t TaskSpec::early_stop_length_or_reference() const {
  return early_stop_length > 0 ? early_stop_length : reference_length();
}

std::int64_t TaskSpec::reference_length() const {
  if (name == "copy") return copy.max_len;
  return *std::max_element(train_lengths.begin(), train_lengths.end());
}

std::int64_t TaskSpec::vocab_size() const {
  if (name == "mqar") return mqar.vocab_size;
  if (name == "copy") return kCopyVocabSize;
  return word.vocab_size();
}

Batch TaskSpec::train_batch(std::int64_t step, std::int64_t rows, std::uint64_t seed) const {
  if (name == "copy") return copy_train(copy, rows, seed);
  const std::int64_t length = train_lengths[static_cast<std::size_t>(
      (step - 1) % static_cast<std::int64_t>(train_lengths.size()))];
  if (name == "mqar") {
    MqarConfig c = mqar;
    c.seq_len = length;
    return tasks::mqar(c, rows, seed);
  }
  WordProblemConfig c = word;
  c.seq_len = length;
  return word_problem(c, rows, seed);
}

Batch TaskSpec::eval_batch_at(const MqarPoint& point, std::int64_t rows, std::uint64_t seed) const {
  if (name != "mqar")
    fail("TaskSpec::eval_batch_at", "point", "an mqar task", "task '" + name + "'");
  MqarConfig c = mqar;
  c.seq_len = point.length;
  c.num_kv_pairs = point.num_kv_pairs;
  return tasks::mqar(c, rows, seed);
}

Batch TaskSpec::eval_batch_at(std::int64_t length, std::int64_t rows, std::uint64_t seed) const {
  if (name == "copy") return copy_eval(length, rows, seed);
  if (name == "mqar") {
    MqarConfig c = mqar;
    c.seq_len = length;
    return tasks::mqar(c, rows, seed);
  }
  WordProblemConfig c = word;
  c.seq_len = length;
  return word_problem(c, rows, seed);
}

ExperimentConfig parse_experiment_config(const json& j) {
  ExperimentConfig x;
  x.source = j;
  Reader r(j, "config");
  x.name = r.string("name");
  static const std::regex name_form("[A-Za-z0-9_.-]+");
  if (!std::regex_match(x.name, name_form) || x.name == "." || x.name == "..")
    fail(kOp, "config.name", "a non-empty name of letters, digits, '_', '.', '-'",
         in_quotes(x.name));
  x.task = parse_task(r.required("task"));

  const json base = r.has("model") ? r.get("model") : json::object();
  if (!base.is_object()) fail(kOp, "config.model", "a JSON object", given(base));
  const json& arms = r.required("arms");
  if (!arms.is_array() || arms.empty()) fail(kOp, "config.arms", "a non-empty array", given(arms));
  std::set<std::string> names;
  for (std::size_t i = 0; i < arms.size(); ++i) {
    const std::string path = "config.arms[" + std::to_string(i) + "]";
    Reader a(arms[i], path);
    Arm arm;
    arm.name = a.string("name");
    if (!std::regex_match(arm.name, name_form))
      fail(kOp, path + ".name", "a non-empty name of letters, digits, '_', '.', '-'",
           in_quotes(arm.name));
    if (!names.insert(arm.name).second)
      fail(kOp, path + ".name", "a name no other arm has", in_quotes(arm.name));
    const json overrides = a.has("model") ? a.get("model") : json::object();
    a.finish();
    arm.model = parse_model(base, overrides, path + ".model", x.task.vocab_size());
    x.arms.push_back(std::move(arm));
  }

  const json train = r.has("train") ? r.get("train") : json::object();
  if (!train.is_object()) fail(kOp, "config.train", "a JSON object", given(train));
  for (const char* key : {"lr", "seed", "checkpoint_path", "resume_from"})
    if (train.contains(key))
      fail(kOp, std::string("config.train.") + key,
           "no value (the runner sets it: lr_grid, seeds, the output folder)",
           given(train.at(key)));
  try {
    // TrainConfig requires a checkpoint path with checkpoint_every; the runner sets it per run.
    json with_path = train;
    with_path["checkpoint_path"] = "(set per run)";
    from_json(with_path, x.train);
    x.train.checkpoint_path.clear();
  } catch (const Error& e) {
    rethrow_at("config.train", e);
  }
  // The training batches: batch_size rows of the longest training row (copy: `context` tokens).
  const std::int64_t longest_row =
      x.task.name == "copy" ? x.task.copy.context : x.task.reference_length();
  if (x.train.batch_size * longest_row > kMaxBatchTokens)
    fail(kOp, "config.train.batch_size",
         "at most 2^26 tokens per training batch (batch_size × the longest training row of " +
             std::to_string(longest_row) + " tokens)",
         std::to_string(x.train.batch_size));

  const json& lrs = r.required("lr_grid");
  if (!lrs.is_array() || lrs.empty())
    fail(kOp, "config.lr_grid", "a non-empty array of learning rates", given(lrs));
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    const std::string path = "config.lr_grid[" + std::to_string(i) + "]";
    if (!lrs[i].is_number() || !(lrs[i].get<double>() > 0) || !std::isfinite(lrs[i].get<double>()))
      fail(kOp, path, "a positive finite number", given(lrs[i]));
    const double lr = lrs[i].get<double>();
    for (double other : x.lrs)
      if (lr_string(other) == lr_string(lr))
        fail(kOp, path, "distinct learning rates", lr_string(lr) + " twice");
    x.lrs.push_back(lr);
  }
  const json& seeds = r.required("seeds");
  if (!seeds.is_array() || seeds.empty())
    fail(kOp, "config.seeds", "a non-empty array of seeds", given(seeds));
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = "config.seeds[" + std::to_string(i) + "]";
    if (!seeds[i].is_number_unsigned() &&
        !(seeds[i].is_number_integer() && seeds[i].get<std::int64_t>() >= 0))
      fail(kOp, path, "a non-negative integer", given(seeds[i]));
    const auto seed = seeds[i].get<std::uint64_t>();
    if (std::find(x.seeds.begin(), x.seeds.end(), seed) != x.seeds.end())
      fail(kOp, path, "distinct seeds", std::to_string(seed) + " twice");
    x.seeds.push_back(seed);
  }
  r.finish();
  return x;
}

ExperimentConfig load_experiment_config(const std::string& path) {
  return parse_experiment_config(read_json_file(path));
}

ExperimentConfig parse_experiment_config_text(const std::string& text, const std::string& source) {
  return parse_experiment_config(parse_json_text(text, source));
}

ExperimentOutput run_experiment(const ExperimentConfig& config, const ExperimentOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.out_dir.empty()) fail("run_experiment", "out_dir", "a folder", "an empty path");
  // Data parallel over more than one rank: rank 0 alone writes (and reports progress).
  DataParallel* const dp = options.data_parallel && options.data_parallel->world_size() > 1
                               ? options.data_parallel.get()
                               : nullptr;
  if (dp) (void)dp->shard_rows(config.train.batch_size, kOp, "config.train.batch_size");
  const bool writer = dp == nullptr || dp->writer();
  const bool progress = options.progress && writer;
  const fs::path out = options.out_dir;
  const fs::path ckpt_dir = out / "checkpoints";
  if (writer) {
    std::error_code ec;
    fs::create_directories(ckpt_dir, ec);
    if (ec || !fs::is_directory(ckpt_dir))
      fail("run_experiment", "out_dir", "a folder that can be created",
           in_quotes(out.string()) + " (" + ec.message() + ")");
    // Temporary files of an earlier invocation killed mid-write: never read, removed here.
    remove_stale_temp_files(out.string());
    remove_stale_temp_files(ckpt_dir.string());
  }
  // threads = 0: LibTorch's ops on the calling thread, phasor's kernels on every core. The ops of
  // these small models (hidden 64, 2,048 tokens a step) are too short to gain from a second
  // thread — handing them out cost more than it saved — while the kernels split well over
  // (sequence, head) pairs: on 2 cores this split trained every arm of the quick suite as fast as
  // or faster than two threads for both (1.2x geometric mean; README, "Training speed"). ATen's
  // count is set explicitly either way (its default differs between builds).
  at::set_num_threads(options.threads > 0 ? options.threads : 1);
  phasor::set_num_threads(options.kernel_threads >= 0 ? options.kernel_threads : options.threads);
  // Matrix products, unlike the other ops, gain from a second thread at these sizes
  // (MatmulThreads, train.h). Two by default, whatever the machine: OpenBLAS rounds differently on
  // different thread counts, and a run's results must not depend on how many cores it found
  // (phasor's kernels give the same bits on any number).
  const int matmul_threads = options.matmul_threads > 0 ? options.matmul_threads
                             : options.threads > 0      ? options.threads
                                                        : kDefaultMatmulThreads;
  std::optional<MatmulThreads> matmul;
  if (matmul_threads != at::get_num_threads()) matmul.emplace(matmul_threads);
  const TaskSpec& task = config.task;
  const std::int64_t ref = task.reference_length();

  json runs = json::array();
  json run_timings = json::array();
  const std::size_t total_runs = config.arms.size() * config.lrs.size() * config.seeds.size();
  std::size_t run_index = 0;
  for (const Arm& arm : config.arms)
    for (double lr : config.lrs)
      for (std::uint64_t seed : config.seeds) {
        const std::string stem = run_stem(arm.name, lr, seed);
        const std::string label = fmt::format("[{}/{}] {}", ++run_index, total_runs, stem);
        const fs::path record_path = ckpt_dir / (stem + ".json");
        const fs::path ckpt_path = ckpt_dir / (stem + ".ckpt");
        // What a finished run's record must match to be reused by --resume (the lr and the seed
        // are in its file name).
        const json setup = {{"task", config.source.at("task")},
                            {"model", arm.model},
                            {"train", config.train},
                            {"eval_lengths", task.eval_lengths}};
        const bool finished = options.resume && fs::exists(record_path);
        const bool resumed = !finished && options.resume && fs::exists(ckpt_path);
        // Data parallel: every rank must take the same path (skip, continue, start), or the
        // collectives would not match.
        if (dp)
          dp->check_same((finished ? 2 : 0) + (resumed ? 1 : 0), "run_experiment", "resume",
                         "view of run " + stem +
                             " in the output folder (finished: 2, checkpoint: 1, none: 0; the "
                             "ranks must share the folder)");
        if (finished) {
          json record = read_json_file(record_path.string());
          if (!record.contains("setup") || record["setup"] != setup) {
            std::string differing;
            for (const auto& kv : setup.items())
              if (!record.contains("setup") || !record["setup"].contains(kv.key()) ||
                  record["setup"][kv.key()] != kv.value())
                differing += (differing.empty() ? "" : ", ") + kv.key();
            fail("run_experiment", "resume",
                 "finished runs of the same task, model and train settings in the output folder",
                 in_quotes(record_path.string()) + ", which differs in " + differing +
                     " (use another --out, or run without --resume to start over)");
          }
          // The record file holds the run's results and, under "timing", its wall-clock figures
          // (timings.json), which results.json leaves out.
          json timing = record.contains("timing") ? record["timing"] : json::object();
          record.erase("timing");
          // Records written before timings.json held these among the results.
          for (const char* key : {"resumed", "wall_time_s", "tokens_per_s", "time_breakdown"})
            if (record.contains(key)) {
              timing[key] = record[key];
              record.erase(key);
            }
          timing["arm"] = arm.name;
          timing["lr"] = lr;
          timing["seed"] = seed;
          // Read back, not trained here: the table must not pass this invocation's wall time
          // off as the grid's.
          timing["finished_earlier"] = true;
          runs.push_back(std::move(record));
          run_timings.push_back(std::move(timing));
          if (progress) std::fprintf(stderr, "%s: finished earlier\n", label.c_str());
          continue;
        }
        TrainConfig tc = config.train;
        tc.lr = lr;
        tc.seed = seed;
        tc.checkpoint_path = ckpt_path.string();
        if (tc.checkpoint_every == 0)
          tc.checkpoint_every = std::max<std::int64_t>(1, tc.steps / 10);
        if (options.stop_at_step > 0) tc.stop_at_step = options.stop_at_step;
        if (resumed) tc.resume_from = ckpt_path.string();

        const BatchFn data = [&task, seed, rows = tc.batch_size](std::int64_t step) {
          return task.train_batch(step, rows, batch_seed(seed, step));
        };
        // The periodic evaluation: held-out rows at the reference length, or early_stop_length
        // (stream position −1).
        const Batch held_out = task.eval_batch_at(task.early_stop_length_or_reference(),
                                                  task.eval_batch, batch_seed(seed, -1));
        const EvalFn eval = [&held_out, dp](LanguageModel& m) {
          return evaluate(m, held_out, rows_per_pass(held_out, m->config().vocab_size), dp);
        };
        torch::manual_seed(seed);
        LanguageModel model(arm.model);
        std::optional<OpTimer> op_timer;
        if (options.profile) op_timer.emplace();
        const TrainResult result =
            train(model, tc, data, eval, progress ? stderr_progress(label) : ProgressFn{}, dp);
        op_timer.reset();

        // Results only: a function of the config, the seed and the thread counts, the same bits
        // whether the run went through in one go or was killed and resumed any number of times.
        // What the clock says (and whether this invocation resumed) goes to timings.json.
        json record = {{"arm", arm.name},
                       {"setup", setup},
                       {"lr", lr},
                       {"seed", seed},
                       {"model", arm.model},
                       {"parameters", model->num_parameters()},
                       {"final_step", result.final_step},
                       {"stopped_early", result.stopped_early},
                       {"diverged", result.diverged},
                       {"losses", result.losses},
                       {"train_accuracies", result.train_accuracies}};
        const json timing = {{"arm", arm.name},
                             {"lr", lr},
                             {"seed", seed},
                             {"resumed", resumed},
                             {"wall_time_s", result.wall_time_s},
                             {"tokens_per_s", result.tokens_per_s},
                             {"time_breakdown", result.time}};
        json evals = json::array();
        for (const EvalRecord& e : result.evals)
          evals.push_back({{"step", e.step},
                           {"loss", e.loss},
                           {"token_accuracy", e.token_accuracy},
                           {"sequence_accuracy", e.sequence_accuracy}});
        record["evals"] = evals;
        record["evals_length"] = task.early_stop_length_or_reference();
        // The final evaluation at every length, on rows that depend on (seed, length) only:
        // stream positions −2 − length, away from the training steps (≥ 1) and held_out (−1).
        // Parity with Selective RoPE: the phase probe (phase_probe.h) on the rows of the longest
        // evaluation, so that each run's phase horizon sits beside its correct prefix lengths.
        const bool probe_phases = (task.name == "parity" || task.name == "s2") &&
                                  arm.model.pos_encoding == "selective_rope";
        const std::int64_t longest =
            *std::max_element(task.eval_lengths.begin(), task.eval_lengths.end());
        json by_length = json::array();
        for (std::int64_t length : task.eval_lengths) {
          const Batch b =
              task.eval_batch_at(length, task.eval_batch, batch_seed(seed, -2 - length));
          const EvalResult r = evaluate(model, b, rows_per_pass(b, arm.model.vocab_size), dp);
          json e = eval_json(length, r);
          if (task.name == "copy")  // letters only, without the '.' (data.h's copy_metrics)
            e["char_accuracy"] =
                copy_metrics(r.predictions, b.targets, b.rows, b.cols).char_accuracy;
          by_length.push_back(std::move(e));
          if (probe_phases && length == longest) {
            json probe = to_json(parity_phase_probe(model, b));
            probe["eval_length"] = longest;  // the evaluation whose rows these are
            record["phase_probe"] = std::move(probe);
          }
        }
        record["eval_by_length"] = by_length;
        if (!task.mqar_eval_points.empty()) {
          // Rows that depend on (seed, length, num_kv_pairs) only, at stream positions below
          // every −2 − length of the length sweep.
          json points = json::array();
          for (const TaskSpec::MqarPoint& p : task.mqar_eval_points) {
            const Batch b = task.eval_batch_at(
                p, task.eval_batch,
                batch_seed(seed, -(std::int64_t{1} << 40) - (p.length << 20) - p.num_kv_pairs));
            json e =
                eval_json(p.length, evaluate(model, b, rows_per_pass(b, arm.model.vocab_size), dp));
            e["num_kv_pairs"] = p.num_kv_pairs;
            points.push_back(std::move(e));
          }
          record["eval_points"] = points;
        }
        // A run cut short by train.stop_at_step (time slicing) is reported but not recorded as
        // finished, so that --resume continues it from its checkpoint.
        const bool complete =
            result.final_step >= tc.steps || result.stopped_early || result.diverged;
        record["complete"] = complete;
        if (complete && writer) {
          json file = record;
          file["timing"] = timing;
          write_text(record_path, file.dump(1));
        }
        runs.push_back(std::move(record));
        run_timings.push_back(timing);
      }

  // Summary: per arm and lr, the mean over seeds at every length; the best lr per arm.
  json arms_summary = json::array();
  for (const Arm& arm : config.arms) {
    json per_lr = json::array();
    double best_acc = -1;
    double best_lr = config.lrs.front();
    for (double lr : config.lrs) {
      json lengths = json::array();
      double ref_acc = std::numeric_limits<double>::quiet_NaN(), ref_prefix = ref_acc;
      for (std::int64_t length : task.eval_lengths) {
        std::vector<double> seq, tok, prefix;
        for (const json& run : runs)
          if (run["arm"] == arm.name && lr_string(num(run["lr"])) == lr_string(lr))
            for (const json& e : run["eval_by_length"])
              if (e["length"] == length) {
                seq.push_back(num(e["sequence_accuracy"]));
                tok.push_back(num(e["token_accuracy"]));
                prefix.push_back(static_cast<double>(prefix_length_of(e)));
              }
        lengths.push_back({{"length", length},
                           {"sequence_accuracy", mean(seq)},
                           {"token_accuracy", mean(tok)},
                           {"correct_prefix_length", mean(prefix)}});
        if (length == ref) {
          ref_acc = mean(seq);
          ref_prefix = mean(prefix);
        }
      }
      // NaN (a diverged run) never wins; the first lr wins ties.
      if (ref_acc > best_acc) {
        best_acc = ref_acc;
        best_lr = lr;
      }
      json summary = {{"lr", lr},
                      {"reference_sequence_accuracy", ref_acc},
                      {"reference_correct_prefix_length", ref_prefix},
                      {"lengths", lengths}};
      if (!task.mqar_eval_points.empty()) {
        json points = json::array();
        for (const TaskSpec::MqarPoint& p : task.mqar_eval_points) {
          std::vector<double> seq, tok;
          for (const json& run : runs)
            if (run["arm"] == arm.name && lr_string(num(run["lr"])) == lr_string(lr))
              for (const json& e : run["eval_points"])
                if (e["length"] == p.length && e["num_kv_pairs"] == p.num_kv_pairs) {
                  seq.push_back(num(e["sequence_accuracy"]));
                  tok.push_back(num(e["token_accuracy"]));
                }
          points.push_back({{"length", p.length},
                            {"num_kv_pairs", p.num_kv_pairs},
                            {"sequence_accuracy", mean(seq)},
                            {"token_accuracy", mean(tok)}});
        }
        summary["points"] = points;
      }
      per_lr.push_back(std::move(summary));
    }
    arms_summary.push_back({{"arm", arm.name}, {"best_lr", best_lr}, {"lrs", per_lr}});
  }

  json results = {{"name", config.name},
                  {"config", config.source},
                  {"reference_length", ref},
                  {"eval_lengths", task.eval_lengths},
                  {"machine",
                   {{"threads", at::get_num_threads()},
                    {"kernel_threads", phasor::num_threads()},
                    {"matmul_threads", matmul_threads},
                    {"hardware_concurrency", std::thread::hardware_concurrency()},
                    {"blas_core", blas_core()}}},
                  {"summary", arms_summary},
                  {"runs", runs}};
  if (dp) results["machine"]["processes"] = dp->world_size();
  if (writer) write_text(out / "results.json", results.dump(1));

  // results.csv: one row per arm × lr × seed × eval length.
  std::ostringstream csv;
  csv << "arm,lr,seed,length,token_accuracy,sequence_accuracy,loss,final_step,stopped_early,"
         "diverged,best_lr,num_kv_pairs,correct_prefix_length\n";
  for (const json& run : runs) {
    const double lr = num(run["lr"]);
    bool best = false;
    for (const json& a : arms_summary)
      if (a["arm"] == run["arm"]) best = lr_string(num(a["best_lr"])) == lr_string(lr);
    const auto row = [&](const json& e, const std::string& num_kv_pairs) {
      csv << csv_field(run["arm"].get<std::string>()) << ',' << lr_string(lr) << ','
          << run["seed"].get<std::uint64_t>() << ',' << e["length"].get<std::int64_t>() << ','
          << fmt::format("{:.6g},{:.6g},{:.6g}", num(e["token_accuracy"]),
                         num(e["sequence_accuracy"]), num(e["loss"]))
          << ',' << run["final_step"].get<std::int64_t>() << ','
          << (run["stopped_early"].get<bool>() ? 1 : 0) << ','
          << (run["diverged"].get<bool>() ? 1 : 0) << ',' << (best ? 1 : 0) << ',' << num_kv_pairs
          << ',' << prefix_length_of(e) << '\n';
    };
    const std::string task_kv =
        task.name == "mqar" ? std::to_string(task.mqar.num_kv_pairs) : std::string();
    for (const json& e : run["eval_by_length"]) row(e, task_kv);
    if (run.contains("eval_points"))
      for (const json& e : run["eval_points"])
        row(e, std::to_string(e["num_kv_pairs"].get<std::int64_t>()));
  }
  if (writer) write_text(out / "results.csv", csv.str());

  // Plots: per arm at its best lr, means over seeds.
  const bool log_x =
      task.eval_lengths.size() > 1 && task.eval_lengths.back() >= 4 * task.eval_lengths.front();
  const std::string length_label =
      task.name == "copy" ? "string length (copy)" : "evaluation sequence length";
  for (const char* metric : {"sequence_accuracy", "token_accuracy"}) {
    PlotSpec spec;
    spec.title =
        fmt::format("{}: {} vs length (best lr per arm, mean over seeds: {}; trained at {})",
                    config.name, metric, config.seeds.size(), ref);
    spec.x_label = length_label;
    spec.y_label = metric;
    spec.y_range = std::make_pair(0.0, 1.0);
    spec.log_x = log_x;
    for (std::int64_t length : task.eval_lengths)
      spec.x_ticks.push_back(static_cast<double>(length));
    for (const json& a : arms_summary) {
      Series s;
      s.label =
          fmt::format("{} (lr {})", a["arm"].get<std::string>(), lr_string(num(a["best_lr"])));
      for (const json& l : a["lrs"])
        if (lr_string(num(l["lr"])) == lr_string(num(a["best_lr"])))
          for (const json& e : l["lengths"]) {
            s.x.push_back(static_cast<double>(e["length"].get<std::int64_t>()));
            s.y.push_back(num(e[metric]));
          }
      spec.series.push_back(std::move(s));
    }
    if (writer)
      write_line_plot_png(spec, (out / (std::string(metric) == "sequence_accuracy"
                                            ? "accuracy_vs_length.png"
                                            : "token_accuracy_vs_length.png"))
                                    .string());
  }
  {
    PlotSpec spec;
    spec.title = fmt::format("{}: training loss (best lr per arm, mean of seeds)", config.name);
    spec.x_label = "step";
    spec.y_label = "cross-entropy (running mean)";
    for (const json& a : arms_summary) {
      const std::string best = lr_string(num(a["best_lr"]));
      std::vector<std::vector<double>> curves;
      for (const json& run : runs)
        if (run["arm"] == a["arm"] && lr_string(num(run["lr"])) == best) {
          std::vector<double> c;
          for (const json& v : run["losses"]) c.push_back(num(v));
          curves.push_back(std::move(c));
        }
      // Mean over the seeds still running at each step (early stopping shortens runs), then a
      // trailing running mean over ~2 % of the steps to make the trend readable.
      std::size_t longest = 0;
      for (const auto& c : curves) longest = std::max(longest, c.size());
      std::vector<double> m(longest);
      for (std::size_t i = 0; i < longest; ++i) {
        std::vector<double> v;
        for (const auto& c : curves)
          if (i < c.size()) v.push_back(c[i]);
        m[i] = mean(v);
      }
      const std::size_t window = std::max<std::size_t>(1, longest / 50);
      Series s;
      s.label = fmt::format("{} (lr {})", a["arm"].get<std::string>(), best);
      double sum = 0;
      std::size_t count = 0;
      for (std::size_t i = 0; i < longest; ++i) {
        sum += m[i];
        ++count;
        if (i >= window) {
          sum -= m[i - window];
          --count;
        }
        // One point per window (markers every point would hide the line on long runs).
        if ((i + 1) % window == 0 || i + 1 == longest) {
          s.x.push_back(static_cast<double>(i + 1));
          s.y.push_back(sum / static_cast<double>(count));
        }
      }
      if (s.x.empty()) {  // no step trained (cannot happen with steps ≥ 1): keep the legend
        s.x.push_back(0);
        s.y.push_back(std::numeric_limits<double>::quiet_NaN());
      }
      spec.series.push_back(std::move(s));
    }
    if (writer) write_line_plot_png(spec, (out / "loss.png").string());
  }

  // timings.json: the clock's figures, apart so that results.json stays bit-identical across
  // kills and resumes. Training time of the runs, including those finished by earlier (resumed)
  // invocations, but only the last part of a run continued from a checkpoint (train.h:
  // wall_time_s of a call).
  double train_time = 0;
  for (const json& t : run_timings)
    if (t.contains("wall_time_s")) train_time += num(t["wall_time_s"]);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  json timings = {{"name", config.name},
                  {"threads", at::get_num_threads()},
                  {"wall_time_s", wall},
                  {"train_time_s", train_time},
                  {"runs", run_timings}};
  if (dp) timings["processes"] = dp->world_size();
  if (writer) {
    write_text(out / "timings.json", timings.dump(1));
    write_text(out / "table.txt", format_result_table(results, timings));
  }
  return {std::move(results), std::move(timings)};
}

std::string format_result_table(const json& results, const json& timings) {
  std::string t;
  const auto& lengths = results["eval_lengths"];
  const std::int64_t ref = results["reference_length"].get<std::int64_t>();
  std::size_t w = 3;
  for (const json& a : results["summary"]) w = std::max(w, a["arm"].get<std::string>().size());
  t += fmt::format(
      "{}: sequence accuracy at the best lr per arm (mean over seeds; * = the "
      "reference length {})\n",
      results["name"].get<std::string>(), ref);
  t += fmt::format("{:<{}}  {:>8}", "arm", w, "best lr");
  for (const json& l : lengths) {
    const auto len = l.get<std::int64_t>();
    t += fmt::format("  {:>7}", std::to_string(len) + (len == ref ? "*" : ""));
  }
  // MQAR eval points: a column "L/kvN" each.
  const json& first_lr = results["summary"][0]["lrs"][0];
  const json no_points = json::array();
  const json& points = first_lr.contains("points") ? first_lr["points"] : no_points;
  const auto point_label = [](const json& p) {
    return fmt::format("{}/kv{}", p["length"].get<std::int64_t>(),
                       p["num_kv_pairs"].get<std::int64_t>());
  };
  for (const json& p : points) t += fmt::format("  {:>9}", point_label(p));
  t += "\n";
  for (const json& a : results["summary"]) {
    const std::string best = lr_string(num(a["best_lr"]));
    t += fmt::format("{:<{}}  {:>8}", a["arm"].get<std::string>(), w, best);
    for (const json& l : a["lrs"])
      if (lr_string(num(l["lr"])) == best) {
        for (const json& e : l["lengths"])
          t += fmt::format("  {:>7.3f}", num(e["sequence_accuracy"]));
        if (l.contains("points"))
          for (const json& e : l["points"])
            t += fmt::format("  {:>9.3f}", num(e["sequence_accuracy"]));
      }
    t += "\n";
  }
  t += fmt::format("\nsequence accuracy at length {} per learning rate (mean over seeds)\n", ref);
  t += fmt::format("{:<{}}", "arm", w);
  const json& first = results["summary"][0]["lrs"];
  for (const json& l : first) t += fmt::format("  {:>8}", lr_string(num(l["lr"])));
  t += "\n";
  for (const json& a : results["summary"]) {
    t += fmt::format("{:<{}}", a["arm"].get<std::string>(), w);
    for (const json& l : a["lrs"])
      t += fmt::format("  {:>8.3f}", num(l["reference_sequence_accuracy"]));
    t += "\n";
  }
  // How far the rows stay right where few are right to their end (data.h: correct_prefix_length).
  t += fmt::format(
      "\ncorrect prefix at length {} per learning rate (positions that half the rows get "
      "entirely right; mean over seeds)\n",
      ref);
  t += fmt::format("{:<{}}", "arm", w);
  for (const json& l : first) t += fmt::format("  {:>8}", lr_string(num(l["lr"])));
  t += "\n";
  for (const json& a : results["summary"]) {
    t += fmt::format("{:<{}}", a["arm"].get<std::string>(), w);
    for (const json& l : a["lrs"])
      t += fmt::format("  {:>8.1f}", l.contains("reference_correct_prefix_length")
                                         ? num(l["reference_correct_prefix_length"])
                                         : std::numeric_limits<double>::quiet_NaN());
    t += "\n";
  }
  // The parity phase probe of the Selective RoPE runs (phase_probe.h), beside their correct prefix
  // at the same length: a phase horizon beyond the correct prefix means the phases are not what
  // fails first.
  bool probed = false;
  for (const json& run : results["runs"]) {
    if (!run.contains("phase_probe") || run["phase_probe"]["heads"].empty()) continue;
    const json& probe = run["phase_probe"];
    if (!probed) {
      t +=
          "\nphase probe (parity, Selective RoPE; phase_probe.h): per run, the head whose rotation "
          "pair tracks parity longest (horizon, in positions; k its harmonic) beside the run's "
          "correct prefix on the same rows; drifts in rad/token\n";
      t += fmt::format("{:<{}}  {:>8}  {:>4}  {:>6}  {:>7}  {:>7}  {:>1}  {:>10}  {:>10}  {:>7}\n",
                       "arm", w, "lr", "seed", "length", "horizon", "correct", "k", "drift_zero",
                       "drift_one", "jitter");
      probed = true;
    }
    std::int64_t correct = -1;
    for (const json& e : run["eval_by_length"])
      if (e["length"] == probe["eval_length"] && e.contains("cumulative_sequence_accuracy"))
        correct = prefix_length_of(e);
    const json* best = nullptr;
    for (const json& h : probe["heads"])
      if (!best || h["horizon"].get<std::int64_t>() > (*best)["horizon"].get<std::int64_t>())
        best = &h;
    const json& p = *best;
    t += fmt::format(
        "{:<{}}  {:>8}  {:>4}  {:>6}  {:>7}  {:>7}  {:>1}  {:>10.5f}  {:>10.5f}  {:>7.4f}\n",
        run["arm"].get<std::string>(), w, lr_string(num(run["lr"])),
        run["seed"].get<std::int64_t>(), probe["length"].get<std::int64_t>(),
        p["horizon"].get<std::int64_t>(), correct >= 0 ? std::to_string(correct) : "-",
        p["harmonic"].get<int>(), num(p["drift_zero"]), num(p["drift_one"]), num(p["jitter"]));
  }
  // The training's periodic evaluations (held-out rows at evals_length, the rows early stopping
  // reads): the best of them is what a protocol that keeps the best checkpoint reports — the
  // Selective RoPE paper's official code logs val/best_sequence_accuracy so, on its length-512
  // set — while the tables above score the final model on other rows.
  bool periodic = false;
  for (const json& run : results["runs"]) {
    if (!run.contains("evals") || run["evals"].empty() || !run.contains("evals_length")) continue;
    if (!periodic) {
      t +=
          "\nperiodic evaluations (held-out rows of the early-stopping length): per run, the best "
          "sequence accuracy (token accuracy at that step; the first step that reached it) and the "
          "last, as a best-checkpoint protocol would report them\n";
      t += fmt::format("{:<{}}  {:>8}  {:>4}  {:>6}  {:>5}  {:>8}  {:>8}  {:>6}  {:>8}\n", "arm", w,
                       "lr", "seed", "length", "evals", "best_seq", "tok", "step", "last_seq");
      periodic = true;
    }
    const json* best = nullptr;
    for (const json& e : run["evals"])
      if (!best || num(e["sequence_accuracy"]) > num((*best)["sequence_accuracy"])) best = &e;
    t += fmt::format("{:<{}}  {:>8}  {:>4}  {:>6}  {:>5}  {:>8.3f}  {:>8.3f}  {:>6}  {:>8.3f}\n",
                     run["arm"].get<std::string>(), w, lr_string(num(run["lr"])),
                     run["seed"].get<std::int64_t>(), run["evals_length"].get<std::int64_t>(),
                     run["evals"].size(), num((*best)["sequence_accuracy"]),
                     num((*best)["token_accuracy"]), (*best)["step"].get<std::int64_t>(),
                     num(run["evals"].back()["sequence_accuracy"]));
  }
  const json& machine = results["machine"];
  t += fmt::format("\n{} runs", results["runs"].size());
  if (timings.is_object() && timings.contains("wall_time_s")) {
    t += fmt::format(" ({:.1f} s of training) in {:.1f} s", num(timings["train_time_s"]),
                     num(timings["wall_time_s"]));
    // A --resume invocation reads finished runs back: its wall time is its own, not the grid's.
    std::size_t earlier = 0;
    if (timings.contains("runs"))
      for (const json& r : timings["runs"])
        if (r.value("finished_earlier", false)) ++earlier;
    if (earlier > 0)
      t += fmt::format(" (this invocation; {} of the runs finished in earlier ones)", earlier);
  }
  if (machine.contains("processes"))
    t += fmt::format(" on {} processes × {} threads", machine["processes"].get<int>(),
                     machine["threads"].get<int>());
  else
    t += fmt::format(" on {} threads", machine["threads"].get<int>());
  if (machine.contains("kernel_threads") && machine.contains("matmul_threads") &&
      machine["matmul_threads"] != machine["threads"])
    t += fmt::format(" ({} for phasor's kernels, {} for matrix products)",
                     machine["kernel_threads"].get<int>(), machine["matmul_threads"].get<int>());
  else if (machine.contains("kernel_threads"))
    t += fmt::format(" ({} for phasor's kernels)", machine["kernel_threads"].get<int>());
  if (machine.contains("blas_core") && !machine["blas_core"].get<std::string>().empty())
    t += fmt::format("; OpenBLAS kernels: {}", machine["blas_core"].get<std::string>());
  t += "\n";
  return t;
}

namespace {

// An op's name as the time table prints it: autograd nodes as "<name> (backward)" without their
// engine prefix and namespaces, phasor's kernel scopes inside them as "<node>: kernel".
std::string short_op_name(std::string name) {
  const std::string kernel_in = "phasor::kernel in ";
  const bool kernel = name.rfind(kernel_in, 0) == 0;
  if (kernel) name = name.substr(kernel_in.size());
  const std::string node = "autograd::engine::evaluate_function: ";
  const bool backward = name.rfind(node, 0) == 0;
  if (backward) name = name.substr(node.size());
  // torch::autograd::CppNode<phasor::(anonymous namespace)::GlaFunction> → GlaFunction
  if (name.rfind("torch::autograd::CppNode<", 0) == 0 && name.back() == '>') {
    name.pop_back();
    const std::size_t colons = name.rfind("::");
    if (colons != std::string::npos) name = name.substr(colons + 2);
  }
  const std::string suffix = "Backward0";  // ATen's nodes say it themselves
  if (backward && !(name.size() > suffix.size() &&
                    name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0))
    name += " (backward)";
  if (kernel) name += ": kernel";
  return name;
}

}  // namespace

std::string format_time_table(const json& timings) {
  std::size_t w = 3;
  for (const json& run : timings["runs"])
    w = std::max(
        w, run_stem(run["arm"].get<std::string>(), num(run["lr"]), run["seed"].get<std::uint64_t>())
               .size());
  std::string t = fmt::format(
      "{}: training time per step in ms; forward and backward split into phasor kernels / other "
      "LibTorch ops / the rest when timed (--profile)\n",
      timings["name"].get<std::string>());
  t += fmt::format(
      "{:<{}}  {:>6}  {:>8}  {:>7}  {:>6}  {:>6} {:>17}  {:>6} {:>17}  {:>6}  {:>7}  {:>6}\n",
      "run", w, "steps", "tok/s", "ms/step", "data", "fwd", "kern/ops/rest", "bwd", "kern/ops/rest",
      "optim", "metrics", "other");
  for (const json& run : timings["runs"]) {
    if (!run.contains("time_breakdown")) continue;
    const json& b = run["time_breakdown"];
    const double steps = num(b["steps"]);
    if (!(steps > 0)) continue;
    const auto ms = [&](const char* key) { return 1e3 * num(b[key]) / steps; };
    const double fwd = ms("forward_s"), bwd = ms("backward_s");
    const auto split = [&](double total, const char* kernels, const char* ops) {
      if (!b.contains(kernels)) return std::string("-");
      const double k = ms(kernels), o = ms(ops);
      return fmt::format("{:.2f}/{:.2f}/{:.2f}", k, o, total - k - o);
    };
    // sync_s: data parallel's wait for the all-reduces (absent from older timings.json).
    const double sync = b.contains("sync_s") ? ms("sync_s") : 0.0;
    const double per_step = ms("data_s") + fwd + bwd + ms("optimizer_s") + ms("metrics_s") +
                            ms("eval_s") + ms("checkpoint_s") + ms("other_s") + sync;
    t += fmt::format(
        "{:<{}}  {:>6}  {:>8.0f}  {:>7.2f}  {:>6.2f}  {:>6.2f} {:>17}  {:>6.2f} {:>17}  {:>6.2f}  "
        "{:>7.2f}  {:>6.2f}\n",
        run_stem(run["arm"].get<std::string>(), num(run["lr"]), run["seed"].get<std::uint64_t>()),
        w, static_cast<std::int64_t>(steps), num(run["tokens_per_s"]), per_step, ms("data_s"), fwd,
        split(fwd, "forward_kernels_s", "forward_ops_s"), bwd,
        split(bwd, "backward_kernels_s", "backward_ops_s"), ms("optimizer_s"), ms("metrics_s"),
        ms("eval_s") + ms("checkpoint_s") + ms("other_s") + sync);
  }
  // The slowest ops of each run (time_breakdown.ops, with --profile), ms per step.
  constexpr std::size_t kTopOps = 8;
  for (const json& run : timings["runs"]) {
    if (!run.contains("time_breakdown") || !run["time_breakdown"].contains("ops")) continue;
    const json& b = run["time_breakdown"];
    const double steps = num(b["steps"]);
    if (!(steps > 0) || b["ops"].empty()) continue;
    t += fmt::format(
        "{}: slowest ops, ms per step (calls per step):",
        run_stem(run["arm"].get<std::string>(), num(run["lr"]), run["seed"].get<std::uint64_t>()));
    std::size_t shown = 0;
    for (const json& op : b["ops"]) {
      if (shown++ == kTopOps) break;
      t += fmt::format("{} {} {:.2f} ({:g})", shown == 1 ? "" : ";",
                       short_op_name(op["name"].get<std::string>()), 1e3 * num(op["s"]) / steps,
                       num(op["calls"]) / steps);
    }
    t += "\n";
  }
  return t;
}

}  // namespace phasor::tasks
