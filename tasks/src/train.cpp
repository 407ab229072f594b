// Training of the task harness (phasor/tasks/train.h).
#include "phasor/tasks/train.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <zlib.h>

#include "check.h"
#include "phasor/tasks/data_parallel.h"
#include "phasor/tasks/files.h"

namespace phasor::tasks {

using detail::fail;

namespace {

constexpr const char* kFormat = "phasor.tasks.checkpoint/2";  // the payload's format tag

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

std::string first_line(const std::string& s) {
  const auto n = s.find('\n');
  return n == std::string::npos ? s : s.substr(0, n);
}

// The settings that determine the sequence of parameter updates: a checkpoint can only be
// resumed under the same ones (the rest — logging, evaluation, checkpointing — may change).
const char* const kTrajectoryKeys[] = {
    "steps",        "batch_size",      "lr",           "weight_decay", "beta1", "beta2", "adam_eps",
    "warmup_steps", "warmup_fraction", "min_lr_ratio", "grad_clip",    "seed"};

std::int64_t warmup_of(const TrainConfig& c) {
  if (c.warmup_steps >= 0) return std::min(c.warmup_steps, c.steps);
  return std::min(c.steps, static_cast<std::int64_t>(
                               std::llround(c.warmup_fraction * static_cast<double>(c.steps))));
}

at::Tensor doubles_tensor(const std::vector<double>& v) {
  return torch::from_blob(const_cast<double*>(v.data()), {static_cast<std::int64_t>(v.size())},
                          at::kDouble)
      .clone();
}

std::vector<double> doubles_of(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

at::Tensor int64_tensor(const std::vector<std::int64_t>& v, std::int64_t rows, std::int64_t cols) {
  return torch::from_blob(const_cast<std::int64_t*>(v.data()), {rows, cols}, at::kLong).clone();
}

void check_batch(const Batch& b, const ModelConfig& mc, const std::string& op) {
  const auto n = static_cast<std::size_t>(b.rows * b.cols);
  if (b.rows < 1 || b.cols < 1 || b.inputs.size() != n || b.targets.size() != n)
    fail(op, "batch", "rows, cols ≥ 1 and rows·cols inputs and targets",
         std::to_string(b.rows) + " × " + std::to_string(b.cols) + " with " +
             std::to_string(b.inputs.size()) + " inputs, " + std::to_string(b.targets.size()) +
             " targets");
  if (b.vocab_size > mc.vocab_size)
    fail(op, "batch", "token ids below the model's vocab_size = " + std::to_string(mc.vocab_size),
         "a batch of vocab_size " + std::to_string(b.vocab_size));
}

// Mean cross-entropy over the scored positions (targets ≠ −100), in the logits' dtype.
at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets) {
  const std::int64_t V = logits.size(-1);
  return at::cross_entropy_loss(logits.reshape({-1, V}), targets.reshape({-1}), {},
                                at::Reduction::Mean, kIgnoreIndex);
}

// The logits and targets a training step's loss and accuracy read: those of the scored positions
// (targets ≠ −100). The other positions add exactly zero to the loss's gradient (cross-entropy
// with ignore_index), and the accuracy does not look at their predictions, so the head — a
// [rows, V] matmul and softmax — runs on the scored rows alone (MQAR scores 4 of 64 positions).
// Row by row the same numbers as the full forward; the head's weight gradient sums fewer exact
// zeros. When every position is scored, the plain forward.
struct ScoredLogits {
  at::Tensor logits;   // [N, V] of the scored positions, or [B, T, V] when all are scored
  at::Tensor targets;  // matching int64 targets
  at::Tensor index;    // [N] flat positions b·T + t of the scored rows (undefined: all)
};

ScoredLogits scored_logits(LanguageModel& model, const at::Tensor& inputs, const Batch& batch,
                           const at::Tensor& targets) {
  ScoredLogits out;
  std::vector<std::int64_t> index;
  index.reserve(batch.targets.size());
  for (std::size_t i = 0; i < batch.targets.size(); ++i)
    if (batch.targets[i] != kIgnoreIndex) index.push_back(static_cast<std::int64_t>(i));
  if (index.size() == batch.targets.size()) {
    out.logits = model->forward(inputs);
    out.targets = targets;
    return out;
  }
  out.index =
      torch::from_blob(index.data(), {static_cast<std::int64_t>(index.size())}, at::kLong).clone();
  const at::Tensor h = model->hidden(inputs);
  out.logits = model->logits(h.reshape({-1, h.size(-1)}).index_select(0, out.index));
  out.targets = targets.reshape({-1}).index_select(0, out.index);
  return out;
}

// The argmax predictions of every position of the batch, rows × cols row-major; unscored
// positions get −100 when only the scored ones were computed (evaluate() never compares those).
std::vector<std::int64_t> predictions_of(const ScoredLogits& s, const Batch& batch) {
  const at::Tensor pred = s.logits.detach().argmax(-1).contiguous();
  const std::int64_t* p = pred.data_ptr<std::int64_t>();
  if (!s.index.defined()) return std::vector<std::int64_t>(p, p + pred.numel());
  std::vector<std::int64_t> all(batch.targets.size(), kIgnoreIndex);
  const std::int64_t* at = s.index.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < s.index.numel(); ++i) all[static_cast<std::size_t>(at[i])] = p[i];
  return all;
}

Metrics metrics_of(const ScoredLogits& s, const Batch& batch) {
  const std::vector<std::int64_t> all = predictions_of(s, batch);
  return evaluate(all.data(), batch.targets.data(), batch.rows, batch.cols);
}

double metric_of(const TrainConfig& c, double token, double sequence) {
  return c.target_metric == "sequence" ? sequence : token;
}

// AdamW with decoupled weight decay on the matrices (parameters named "*weight" with ≥ 2
// dimensions: projections, convolutions, the head); none on the embedding, norms, biases, gate
// parameters (A_log, dt_bias) and Selective RoPE's ω — decaying those towards 0 would change
// what they mean (no rotation, no forgetting), not just regularise.
std::unique_ptr<torch::optim::AdamW> make_optimizer(LanguageModel& model, const TrainConfig& c) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model->named_parameters()) {
    const std::string& name = p.key();
    const bool matrix =
        p.value().dim() >= 2 && name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
    (matrix ? decay : no_decay).push_back(p.value());
  }
  auto options = torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.adam_eps);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(options).weight_decay(c.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(options).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
}

// ---- checkpoint files ---------------------------------------------------------------------------

struct History {
  std::int64_t step = 0;
  std::vector<double> losses, train_accuracies;
  std::vector<EvalRecord> evals;
  bool stopped_early = false, diverged = false;
};

nlohmann::json model_json(const ModelConfig& c) {
  nlohmann::json j;
  to_json(j, c);
  return j;
}

nlohmann::json train_json(const TrainConfig& c) {
  nlohmann::json j;
  to_json(j, c);
  return j;
}

// The checkpoint file (format 2, train.h): a 32-byte header, then the payload.
//   bytes  0.. 7  magic "PHSRCKPT"
//   bytes  8..11  format version, 2 (little-endian, as every number of the file)
//   bytes 12..15  0 (reserved)
//   bytes 16..23  payload length in bytes
//   bytes 24..27  CRC-32 (zlib) of the payload
//   bytes 28..31  CRC-32 of bytes 0..27
// The reader checks the header against the file's size and both checksums before it reads a byte
// of the payload, so a truncated, torn or bit-flipped file is refused by name, and a length field
// claiming 10^12 bytes is compared with the file's real size, never allocated.
//
// The payload is a sequence of named entries, read by the bounds-checked parser below (not by
// LibTorch's archive loader, whose TorchScript importer crashes on some malformed archives, so
// that no file — even one whose checksums were forged — can crash, hang or exhaust the reader):
//   entry  := u32 name length (1 … 1024) · name · u8 kind · body
//   kind 1 (text):   u64 length · bytes
//   kind 2 (tensor): u8 dtype · u8 rank (≤ 8) · u64 size × rank · the elements, row-major
// dtype codes: 1 float32, 2 float64, 3 int64, 4 int32, 5 uint8, 6 bool, 7 bfloat16, 8 float16.
// Entries: "format" (text kFormat), "model_config" and "train_config" (JSON text), "step" (int64
// [1]), "flags" (int64 [2]: stopped early, diverged), "losses", "train_accuracies", "evals"
// (float64; evals [4·n]: step, loss, token and sequence accuracy), "rng" (uint8: torch's CPU
// generator state), "param/<name>" and "buffer/<name>" (the model's), and AdamW's:
// "adamw/<group>/params" (int64 [1]: the group's parameter count), "adamw/<group>/options"
// (float64 [6]: lr, beta1, beta2, eps, weight_decay, amsgrad) and, for each parameter j of the
// group with a state, "adamw/<group>/<j>/step" (int64 [1]), ".../exp_avg", ".../exp_avg_sq" and,
// with amsgrad, ".../max_exp_avg_sq".
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoints store tensors' bytes as they are in memory: little-endian");
constexpr char kMagic[8] = {'P', 'H', 'S', 'R', 'C', 'K', 'P', 'T'};
constexpr std::uint32_t kFormatVersion = 2;
constexpr std::size_t kHeaderBytes = 32;
constexpr std::size_t kMaxNameBytes = 1024;
constexpr int kMaxRank = 8;
constexpr std::uint8_t kText = 1, kTensor = 2;

std::uint32_t crc32_of(const char* data, std::size_t size) {
  const uLong initial = crc32_z(0L, Z_NULL, 0);
  return static_cast<std::uint32_t>(
      crc32_z(initial, reinterpret_cast<const Bytef*>(data), static_cast<z_size_t>(size)));
}

void put_le(std::string& s, std::size_t at, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) s[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

std::uint64_t get_le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// The dtype codes of the payload's tensors.
std::uint8_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return 1;
    case at::kDouble:
      return 2;
    case at::kLong:
      return 3;
    case at::kInt:
      return 4;
    case at::kByte:
      return 5;
    case at::kBool:
      return 6;
    case at::kBFloat16:
      return 7;
    case at::kHalf:
      return 8;
    default:
      return 0;
  }
}

std::optional<at::ScalarType> dtype_of_code(std::uint8_t code) {
  static const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kLong,     at::kInt,
                                         at::kByte,  at::kBool,   at::kBFloat16, at::kHalf};
  if (code < 1 || code > 8) return std::nullopt;
  return types[code - 1];
}

// Appends entries to a payload.
class PayloadWriter {
 public:
  explicit PayloadWriter(std::string& out) : out_(out) {}
  void text(const std::string& name, const std::string& value) {
    name_and_kind(name, kText);
    number(value.size(), 8);
    out_ += value;
  }
  void tensor(const std::string& name, const at::Tensor& t) {
    const std::uint8_t code = dtype_code(t.scalar_type());
    TORCH_CHECK(code != 0, "checkpoint entry '", name, "' has an unsupported dtype ",
                t.scalar_type());
    TORCH_CHECK(t.dim() <= kMaxRank, "checkpoint entry '", name, "' has rank ", t.dim());
    name_and_kind(name, kTensor);
    number(code, 1);
    number(static_cast<std::uint64_t>(t.dim()), 1);
    for (const std::int64_t d : t.sizes()) number(static_cast<std::uint64_t>(d), 8);
    const at::Tensor c = t.detach().cpu().contiguous();
    out_.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }

 private:
  void name_and_kind(const std::string& name, std::uint8_t kind) {
    TORCH_CHECK(!name.empty() && name.size() <= kMaxNameBytes, "checkpoint entry name '", name,
                "' is empty or longer than ", kMaxNameBytes, " bytes");
    number(name.size(), 4);
    out_ += name;
    number(kind, 1);
  }
  void number(std::uint64_t v, int bytes) {
    const std::size_t at = out_.size();
    out_.resize(at + bytes);
    put_le(out_, at, v, bytes);
  }
  std::string& out_;
};

struct Entry {
  std::uint8_t kind = 0;
  std::string text;
  at::Tensor tensor;
};
using Entries = std::map<std::string, Entry>;

// Every refusal of a checkpoint: the file and the problem.
[[noreturn]] void refuse(const std::string& path, const std::string& problem) {
  fail("checkpoint", "path", "a valid phasor task checkpoint", quoted(path) + " (" + problem + ")");
}

// Parses a payload into its entries. Every length is checked against the bytes left before
// anything is allocated, so memory stays within the payload's size.
Entries parse_payload(const std::string& path, const std::string& p) {
  Entries entries;
  std::size_t at = 0;
  const auto left = [&] { return static_cast<std::uint64_t>(p.size() - at); };
  const auto take = [&](std::uint64_t bytes, const std::string& what) {
    if (bytes > left())
      refuse(path, "corrupt contents: " + what + " runs past the payload's end at byte " +
                       std::to_string(at));
    const std::size_t from = at;
    at += static_cast<std::size_t>(bytes);
    return from;
  };
  const auto number = [&](int bytes, const std::string& what) {
    return get_le(p, take(static_cast<std::uint64_t>(bytes), what), bytes);
  };
  while (at < p.size()) {
    const std::uint64_t name_bytes = number(4, "an entry's name length");
    if (name_bytes == 0 || name_bytes > kMaxNameBytes)
      refuse(path, "corrupt contents: an entry name of " + std::to_string(name_bytes) +
                       " bytes at byte " + std::to_string(at - 4));
    const std::string name = p.substr(take(name_bytes, "an entry's name"), name_bytes);
    const std::string what = "entry '" + name + "'";
    if (entries.count(name)) refuse(path, "corrupt contents: " + what + " twice");
    Entry e;
    e.kind = static_cast<std::uint8_t>(number(1, what));
    if (e.kind == kText) {
      const std::uint64_t bytes = number(8, what);
      e.text = p.substr(take(bytes, what), static_cast<std::size_t>(bytes));
    } else if (e.kind == kTensor) {
      const auto code = static_cast<std::uint8_t>(number(1, what));
      const std::optional<at::ScalarType> dtype = dtype_of_code(code);
      if (!dtype)
        refuse(path,
               "corrupt contents: " + what + " has an unknown dtype code " + std::to_string(code));
      const auto rank = static_cast<int>(number(1, what));
      if (rank > kMaxRank)
        refuse(path, "corrupt contents: " + what + " has rank " + std::to_string(rank));
      const auto item = static_cast<std::uint64_t>(c10::elementSize(*dtype));
      std::vector<std::int64_t> sizes;
      // The product of the non-zero sizes must fit in the bytes left (even when another size is
      // 0): bounds every size and the product, without overflow, before anything is allocated.
      std::uint64_t product = 1;
      bool empty = false;
      for (int d = 0; d < rank; ++d) {
        const std::uint64_t size = number(8, what);
        if (size == 0) {
          empty = true;
        } else {
          if (size > left() / item / product)
            refuse(path, "corrupt contents: " + what + " is larger than the payload");
          product *= size;
        }
        sizes.push_back(static_cast<std::int64_t>(size));
      }
      const std::uint64_t numel = empty ? 0 : product;
      const std::size_t from = take(numel * item, what);
      e.tensor = torch::empty(sizes, at::TensorOptions().dtype(*dtype));
      if (numel > 0)
        std::memcpy(e.tensor.data_ptr(), p.data() + from, static_cast<std::size_t>(numel * item));
    } else {
      refuse(path, "corrupt contents: " + what + " of unknown kind " + std::to_string(e.kind));
    }
    entries.emplace(name, std::move(e));
  }
  return entries;
}

// CRC-32 of the bytes of the model's parameters and buffers: data parallel's check that the
// replicas are still identical.
std::int64_t model_crc32(LanguageModel& model) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  const auto add = [&crc](const at::Tensor& t) {
    const at::Tensor c = t.detach().contiguous();
    crc = crc32_z(crc, static_cast<const Bytef*>(c.data_ptr()),
                  static_cast<z_size_t>(c.numel() * c.element_size()));
  };
  for (const auto& p : model->parameters()) add(p);
  for (const auto& b : model->buffers()) add(b);
  return static_cast<std::int64_t>(crc);
}

void save_checkpoint(const std::string& path, LanguageModel& model, torch::optim::AdamW& optimizer,
                     const TrainConfig& config, const History& h) {
  std::string bytes(kHeaderBytes, '\0');  // the header's room, filled in at the end
  PayloadWriter w(bytes);
  w.text("format", kFormat);
  w.text("model_config", model_json(model->config()).dump());
  w.text("train_config", train_json(config).dump());
  w.tensor("step", torch::full({1}, h.step, at::kLong));
  w.tensor("flags", torch::tensor({static_cast<std::int64_t>(h.stopped_early),
                                   static_cast<std::int64_t>(h.diverged)},
                                  at::kLong));
  w.tensor("losses", doubles_tensor(h.losses));
  w.tensor("train_accuracies", doubles_tensor(h.train_accuracies));
  std::vector<double> evals;
  for (const auto& e : h.evals)
    evals.insert(evals.end(),
                 {static_cast<double>(e.step), e.loss, e.token_accuracy, e.sequence_accuracy});
  w.tensor("evals", doubles_tensor(evals));
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    w.tensor("rng", gen.get_state());
  }
  for (const auto& p : model->named_parameters()) w.tensor("param/" + p.key(), p.value());
  for (const auto& b : model->named_buffers()) w.tensor("buffer/" + b.key(), b.value());
  // AdamW keys its per-parameter state by the parameter's TensorImpl address, as text (what
  // LibTorch's own Optimizer::save does too); the file keys it by (group, index).
  const auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group = "adamw/" + std::to_string(g) + "/";
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(groups[g].options());
    w.tensor(group + "params",
             torch::full({1}, static_cast<std::int64_t>(groups[g].params().size()), at::kLong));
    w.tensor(group + "options",
             doubles_tensor({o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(),
                             o.weight_decay(), o.amsgrad() ? 1.0 : 0.0}));
    for (std::size_t j = 0; j < groups[g].params().size(); ++j) {
      const auto it =
          optimizer.state().find(c10::guts::to_string(groups[g].params()[j].unsafeGetTensorImpl()));
      if (it == optimizer.state().end()) continue;  // not stepped yet
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      const std::string param = group + std::to_string(j) + "/";
      w.tensor(param + "step", torch::full({1}, s.step(), at::kLong));
      w.tensor(param + "exp_avg", s.exp_avg());
      w.tensor(param + "exp_avg_sq", s.exp_avg_sq());
      if (s.max_exp_avg_sq().defined()) w.tensor(param + "max_exp_avg_sq", s.max_exp_avg_sq());
    }
  }
  const std::uint64_t payload = bytes.size() - kHeaderBytes;
  bytes.replace(0, sizeof kMagic, kMagic, sizeof kMagic);
  put_le(bytes, 8, kFormatVersion, 4);
  put_le(bytes, 16, payload, 8);
  put_le(bytes, 24, crc32_of(bytes.data() + kHeaderBytes, payload), 4);
  put_le(bytes, 28, crc32_of(bytes.data(), 28), 4);
  // Atomic and durable (files.h): a run killed mid-write keeps its previous checkpoint.
  write_file_atomically(path, bytes, "checkpoint", "checkpoint_path");
}

// A checkpoint whose header, checksums, format tag and entry structure were verified.
struct CheckpointFile {
  CheckpointInfo info;
  Entries entries;
};

// The payload of the checkpoint at `path`, after the checks of the header and of the checksums.
std::string verified_payload(const std::string& path, CheckpointInfo& info) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) refuse(path, "no such file");
  if (fs::is_directory(status)) refuse(path, "a directory, not a checkpoint file");
  if (!fs::is_regular_file(status)) refuse(path, "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse(path, std::string("cannot open it: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0, std::ios::beg);
  if (!in || end < 0) refuse(path, "cannot read its size");
  const auto size = static_cast<std::uint64_t>(end);
  if (size == 0) refuse(path, "an empty file");
  std::string header(static_cast<std::size_t>(std::min<std::uint64_t>(size, kHeaderBytes)), '\0');
  if (!in.read(&header[0], static_cast<std::streamsize>(header.size())))
    refuse(path, "cannot read its header");
  // Format 1 was a bare LibTorch archive, a zip file.
  if (header.compare(0, 4, std::string("PK\x03\x04", 4)) == 0)
    refuse(path,
           "a checkpoint of the old format 1 without checksum: the checkpoint format changed to " +
               std::to_string(kFormatVersion) +
               "; train the run again (without --resume, or into a new folder)");
  // (A file shorter than the magic but starting like it is a truncated checkpoint.)
  const std::size_t magic_bytes = std::min(header.size(), sizeof kMagic);
  if (header.compare(0, magic_bytes, kMagic, magic_bytes) != 0)
    refuse(path, "not a phasor task checkpoint: it does not start with \"PHSRCKPT\"");
  if (size < kHeaderBytes)
    refuse(path, "truncated: " + std::to_string(size) + " bytes, less than the " +
                     std::to_string(kHeaderBytes) + "-byte header");
  const auto header_crc = static_cast<std::uint32_t>(get_le(header, 28, 4));
  if (crc32_of(header.data(), 28) != header_crc)
    refuse(path, "corrupt header: its checksum does not match");
  info.format_version = static_cast<std::uint32_t>(get_le(header, 8, 4));
  if (info.format_version != kFormatVersion)
    refuse(path, "format version " + std::to_string(info.format_version) +
                     "; this build reads version " + std::to_string(kFormatVersion));
  info.payload_bytes = get_le(header, 16, 8);
  info.payload_crc32 = static_cast<std::uint32_t>(get_le(header, 24, 4));
  const std::uint64_t present = size - kHeaderBytes;
  if (info.payload_bytes > present)
    refuse(path, "truncated: " + std::to_string(present) + " of the " +
                     std::to_string(info.payload_bytes) + " payload bytes its header announces");
  if (info.payload_bytes < present)
    refuse(path, std::to_string(present - info.payload_bytes) +
                     " unexpected bytes after the payload of " +
                     std::to_string(info.payload_bytes) + " bytes");
  std::string payload(static_cast<std::size_t>(present), '\0');
  if (present > 0 && !in.read(&payload[0], static_cast<std::streamsize>(present)))
    refuse(path, "cannot read its payload");
  const std::uint32_t crc = crc32_of(payload.data(), payload.size());
  if (crc != info.payload_crc32)
    refuse(path, "corrupt: the payload's checksum " + hex32(crc) + " does not match the stored " +
                     hex32(info.payload_crc32));
  return payload;
}

// Opens a checkpoint: verified payload, its entries, the format tag.
CheckpointFile open_checkpoint(const std::string& path) {
  CheckpointFile f;
  f.entries = parse_payload(path, verified_payload(path, f.info));
  const auto it = f.entries.find("format");
  if (it == f.entries.end() || it->second.kind != kText)
    refuse(path, "corrupt contents: no text entry 'format'");
  if (it->second.text != kFormat)
    refuse(path, "format tag " + quoted(it->second.text.substr(0, 64)) + "; this build reads '" +
                     kFormat + "'");
  return f;
}

const std::string& text_entry(const CheckpointFile& f, const std::string& path,
                              const std::string& name) {
  const auto it = f.entries.find(name);
  if (it == f.entries.end()) refuse(path, "corrupt contents: no entry '" + name + "'");
  if (it->second.kind != kText) refuse(path, "corrupt contents: entry '" + name + "' is no text");
  return it->second.text;
}

// A tensor entry of the given dtype and rank (−1: any rank).
const at::Tensor& tensor_entry(const CheckpointFile& f, const std::string& path,
                               const std::string& name, at::ScalarType dtype, int rank = 1) {
  const auto it = f.entries.find(name);
  if (it == f.entries.end()) refuse(path, "corrupt contents: no entry '" + name + "'");
  const at::Tensor& t = it->second.tensor;
  if (it->second.kind != kTensor || t.scalar_type() != dtype || (rank >= 0 && t.dim() != rank))
    refuse(path, "corrupt contents: entry '" + name + "' is not a " +
                     (rank >= 0 ? std::to_string(rank) + "-d " : std::string()) + "tensor of " +
                     c10::toString(dtype));
  return t;
}

std::int64_t int64_entry(const CheckpointFile& f, const std::string& path,
                         const std::string& name) {
  const at::Tensor& t = tensor_entry(f, path, name, at::kLong);
  if (t.numel() != 1) refuse(path, "corrupt contents: entry '" + name + "' is not one number");
  return t.item<std::int64_t>();
}

// The entries of the model and of the optimizer, without a model at hand: at least one
// "param/" tensor; for every AdamW group its parameter count and 6 options; every per-parameter
// state of a parameter index within its group, with its step and its moments (of one dtype and
// shape each).
void check_model_and_optimizer_entries(const CheckpointFile& f, const std::string& path) {
  const auto bad = [&](const std::string& name, const std::string& problem) {
    refuse(path, "corrupt contents: entry '" + name + "' " + problem);
  };
  bool any_parameter = false;
  for (const auto& kv : f.entries) {
    const std::string& name = kv.first;
    const bool param = name.rfind("param/", 0) == 0;
    if (param || name.rfind("buffer/", 0) == 0) {
      if (kv.second.kind != kTensor) bad(name, "is no tensor");
      any_parameter = any_parameter || param;
      continue;
    }
    if (name.rfind("adamw/", 0) != 0) continue;
    // adamw/<g>/params, adamw/<g>/options, adamw/<g>/<j>/<field>
    std::vector<std::string> parts;
    for (std::size_t from = 0;;) {
      const auto slash = name.find('/', from);
      parts.push_back(
          name.substr(from, slash == std::string::npos ? std::string::npos : slash - from));
      if (slash == std::string::npos) break;
      from = slash + 1;
    }
    const auto is_index = [](const std::string& s) {
      return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (parts.size() < 3 || !is_index(parts[1])) bad(name, "is not an AdamW entry");
    const std::string group = "adamw/" + parts[1] + "/";
    const std::int64_t size = int64_entry(f, path, group + "params");
    if (tensor_entry(f, path, group + "options", at::kDouble).numel() != 6)
      bad(group + "options", "does not hold 6 options");
    if (parts.size() == 3 && (parts[2] == "params" || parts[2] == "options")) continue;
    static const std::set<std::string> fields = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    if (parts.size() != 4 || !is_index(parts[2]) || !fields.count(parts[3]))
      bad(name, "is not an AdamW entry");
    if (std::stoll(parts[2]) >= size)
      bad(name, "is beyond its group's " + std::to_string(size) + " parameters");
    const std::string state = group + parts[2] + "/";
    (void)int64_entry(f, path, state + "step");
    const auto moment = [&](const std::string& field) -> const at::Tensor& {
      const auto it = f.entries.find(state + field);
      if (it == f.entries.end()) refuse(path, "corrupt contents: no entry '" + state + field + "'");
      if (it->second.kind != kTensor || !it->second.tensor.is_floating_point())
        bad(state + field, "is not a floating-point tensor");
      return it->second.tensor;
    };
    const at::Tensor& m = moment("exp_avg");
    for (const char* other : {"exp_avg_sq", "max_exp_avg_sq"}) {
      if (std::string(other) == "max_exp_avg_sq" && !f.entries.count(state + other)) continue;
      const at::Tensor& v = moment(other);
      if (v.sizes() != m.sizes() || v.scalar_type() != m.scalar_type())
        bad(state + other, "differs in shape or dtype from '" + state + "exp_avg'");
    }
  }
  if (!any_parameter) refuse(path, "corrupt contents: no model parameter ('param/...' entries)");
}

// Everything of a checkpoint but the model's parameters and the optimizer's state, read and
// checked for consistency (those are checked for structure).
struct Contents {
  nlohmann::json model_config, train_config;
  History history;
  at::Tensor rng;
};

Contents read_contents(const CheckpointFile& f, const std::string& path) {
  Contents c;
  try {
    c.model_config = nlohmann::json::parse(text_entry(f, path, "model_config"));
    c.train_config = nlohmann::json::parse(text_entry(f, path, "train_config"));
  } catch (const nlohmann::json::exception& e) {
    refuse(path, std::string("corrupt config: ") + e.what());
  }
  if (!c.model_config.is_object() || !c.train_config.is_object())
    refuse(path, "corrupt config: not a JSON object");
  History& h = c.history;
  h.step = int64_entry(f, path, "step");
  const at::Tensor& flags = tensor_entry(f, path, "flags", at::kLong);
  if (flags.numel() != 2) refuse(path, "corrupt contents: entry 'flags' has not 2 values");
  h.stopped_early = flags[0].item<std::int64_t>() != 0;
  h.diverged = flags[1].item<std::int64_t>() != 0;
  h.losses = doubles_of(tensor_entry(f, path, "losses", at::kDouble));
  h.train_accuracies = doubles_of(tensor_entry(f, path, "train_accuracies", at::kDouble));
  const auto evals = doubles_of(tensor_entry(f, path, "evals", at::kDouble));
  if (evals.size() % 4 != 0)
    refuse(path, "corrupt contents: entry 'evals' has " + std::to_string(evals.size()) +
                     " values, not a multiple of 4");
  if (h.step < 0 || h.losses.size() != static_cast<std::size_t>(h.step) ||
      h.train_accuracies.size() != h.losses.size())
    refuse(path, "corrupt contents: step " + std::to_string(h.step) + " with a history of " +
                     std::to_string(h.losses.size()) + " losses and " +
                     std::to_string(h.train_accuracies.size()) + " accuracies");
  for (std::size_t i = 0; i < evals.size(); i += 4) {
    // An evaluation's step is a whole number in [1, step] (checked before the conversion, which
    // is undefined for values outside int64's range).
    if (!(evals[i] >= 1 && evals[i] <= static_cast<double>(h.step)) ||
        evals[i] != std::floor(evals[i]))
      refuse(path, "corrupt contents: an evaluation at step " + std::to_string(evals[i]) +
                       " of a history of " + std::to_string(h.step) + " steps");
    h.evals.push_back(
        {static_cast<std::int64_t>(evals[i]), evals[i + 1], evals[i + 2], evals[i + 3]});
  }
  c.rng = tensor_entry(f, path, "rng", at::kByte);
  check_model_and_optimizer_entries(f, path);
  return c;
}

// The entry of a model tensor, which must have the model's dtype and shape.
const at::Tensor& model_entry(const CheckpointFile& f, const std::string& path,
                              const std::string& name, const at::Tensor& like) {
  const auto it = f.entries.find(name);
  if (it == f.entries.end())
    refuse(path, "no entry '" + name + "' for the model's " + name.substr(0, name.find('/')));
  const at::Tensor& t = it->second.tensor;
  if (t.scalar_type() != like.scalar_type() || t.sizes() != like.sizes())
    refuse(path, "entry '" + name + "' is " + c10::toString(t.scalar_type()) + " " +
                     c10::str(t.sizes()) + ", the model's " + c10::toString(like.scalar_type()) +
                     " " + c10::str(like.sizes()));
  return t;
}

// Copies the parameters and buffers into `model` (in place: the optimizer's keys stay valid).
// The file must hold exactly the model's tensors.
void load_parameters(const CheckpointFile& f, const std::string& path, LanguageModel& model) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  for (const auto& p : model->named_parameters()) {
    const std::string name = "param/" + p.key();
    p.value().copy_(model_entry(f, path, name, p.value()));
    used.insert(name);
  }
  for (const auto& b : model->named_buffers()) {
    const std::string name = "buffer/" + b.key();
    b.value().copy_(model_entry(f, path, name, b.value()));
    used.insert(name);
  }
  for (const auto& kv : f.entries)
    if ((kv.first.rfind("param/", 0) == 0 || kv.first.rfind("buffer/", 0) == 0) &&
        !used.count(kv.first))
      refuse(path, "entry '" + kv.first + "' is not a tensor of the model");
}

// Restores AdamW's options and per-parameter states (as Optimizer::load would).
void load_optimizer(const CheckpointFile& f, const std::string& path,
                    torch::optim::AdamW& optimizer) {
  auto& groups = optimizer.param_groups();
  if (f.entries.count("adamw/" + std::to_string(groups.size()) + "/params"))
    refuse(path,
           "more AdamW parameter groups than the optimizer's " + std::to_string(groups.size()));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group = "adamw/" + std::to_string(g) + "/";
    const auto& params = groups[g].params();
    const std::int64_t size = int64_entry(f, path, group + "params");
    if (size != static_cast<std::int64_t>(params.size()))
      refuse(path, "AdamW group " + std::to_string(g) + " of " + std::to_string(size) +
                       " parameters, the optimizer's has " + std::to_string(params.size()));
    const std::vector<double> o = doubles_of(tensor_entry(f, path, group + "options", at::kDouble));
    auto& options = static_cast<torch::optim::AdamWOptions&>(groups[g].options());
    options.lr(o[0]).betas({o[1], o[2]}).eps(o[3]).weight_decay(o[4]).amsgrad(o[5] != 0.0);
    for (std::size_t j = 0; j < params.size(); ++j) {
      const std::string state = group + std::to_string(j) + "/";
      if (!f.entries.count(state + "step")) continue;  // not stepped yet
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(int64_entry(f, path, state + "step"));
      s->exp_avg(model_entry(f, path, state + "exp_avg", params[j]).clone());
      s->exp_avg_sq(model_entry(f, path, state + "exp_avg_sq", params[j]).clone());
      if (f.entries.count(state + "max_exp_avg_sq"))
        s->max_exp_avg_sq(model_entry(f, path, state + "max_exp_avg_sq", params[j]).clone());
      optimizer.state()[c10::guts::to_string(params[j].unsafeGetTensorImpl())] = std::move(s);
    }
  }
}

// The model config of a checkpoint, refused by name if it is not a valid one.
ModelConfig model_config_of(const Contents& c, const std::string& path) {
  try {
    return c.model_config.get<ModelConfig>();
  } catch (const Error& e) {
    refuse(path, std::string("its model config is invalid: ") + e.what());
  } catch (const nlohmann::json::exception& e) {
    refuse(path, std::string("its model config is invalid: ") + e.what());
  }
}

// Keys whose values differ between two JSON objects, "a, b".
std::string differing_keys(const nlohmann::json& a, const nlohmann::json& b) {
  std::string out;
  std::set<std::string> keys;
  for (const auto& kv : a.items()) keys.insert(kv.key());
  for (const auto& kv : b.items()) keys.insert(kv.key());
  for (const auto& k : keys) {
    const bool same = a.contains(k) && b.contains(k) && a.at(k) == b.at(k);
    if (!same)
      out += (out.empty() ? "" : ", ") + k + " (" + (a.contains(k) ? a.at(k).dump() : "absent") +
             " vs " + (b.contains(k) ? b.at(k).dump() : "absent") + ")";
  }
  return out;
}

History resume(const std::string& path, LanguageModel& model, torch::optim::AdamW& optimizer,
               const TrainConfig& config) {
  const CheckpointFile f = open_checkpoint(path);
  Contents c = read_contents(f, path);
  const auto current_model = nlohmann::json::parse(model_json(model->config()).dump());
  if (c.model_config != current_model)
    fail("train", "resume_from", "a checkpoint of the same model config",
         quoted(path) + " differing in " + differing_keys(c.model_config, current_model));
  const auto current_train = nlohmann::json::parse(train_json(config).dump());
  nlohmann::json a = nlohmann::json::object(), b = nlohmann::json::object();
  for (const char* k : kTrajectoryKeys) {
    if (c.train_config.contains(k)) a[k] = c.train_config.at(k);
    b[k] = current_train.at(k);
  }
  if (a != b)
    fail("train", "resume_from", "a checkpoint with the same training trajectory settings",
         quoted(path) + " differing in " + differing_keys(a, b));
  if (c.history.step > config.steps)
    refuse(path, "step " + std::to_string(c.history.step) + " beyond the run's " +
                     std::to_string(config.steps) + " steps");
  load_parameters(f, path, model);
  load_optimizer(f, path, optimizer);
  try {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(c.rng);
  } catch (const c10::Error& e) {
    refuse(path, "corrupt contents: entry 'rng' is no generator state (" +
                     first_line(e.what_without_backtrace()) + ")");
  }
  return std::move(c.history);
}

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<std::int64_t>(std::llround(s));
  std::ostringstream out;
  if (total >= 3600) out << total / 3600 << "h" << std::setw(2) << std::setfill('0');
  if (total >= 60) out << (total / 60) % 60 << "m" << std::setw(2) << std::setfill('0');
  out << total % 60 << "s";
  return out.str();
}

}  // namespace

// ---- configs ------------------------------------------------------------------------------------

void to_json(nlohmann::json& j, const TrainConfig& c) {
  j = nlohmann::json{{"steps", c.steps},
                     {"batch_size", c.batch_size},
                     {"lr", c.lr},
                     {"weight_decay", c.weight_decay},
                     {"beta1", c.beta1},
                     {"beta2", c.beta2},
                     {"adam_eps", c.adam_eps},
                     {"warmup_steps", c.warmup_steps},
                     {"warmup_fraction", c.warmup_fraction},
                     {"min_lr_ratio", c.min_lr_ratio},
                     {"grad_clip", c.grad_clip},
                     {"seed", c.seed},
                     {"eval_every", c.eval_every},
                     {"target_accuracy", c.target_accuracy},
                     {"target_metric", c.target_metric},
                     {"log_every", c.log_every},
                     {"checkpoint_every", c.checkpoint_every},
                     {"checkpoint_path", c.checkpoint_path},
                     {"resume_from", c.resume_from},
                     {"stop_at_step", c.stop_at_step}};
}

void from_json(const nlohmann::json& j, TrainConfig& c) {
  const std::string op = "TrainConfig";
  if (!j.is_object()) fail(op, "config", "a JSON object", std::string(j.type_name()));
  TrainConfig out;
  OptionReader r(j, op);
  out.steps = r.integer("steps", out.steps);
  out.batch_size = r.integer("batch_size", out.batch_size);
  out.lr = r.number("lr", out.lr);
  out.weight_decay = r.number("weight_decay", out.weight_decay);
  out.beta1 = r.number("beta1", out.beta1);
  out.beta2 = r.number("beta2", out.beta2);
  out.adam_eps = r.number("adam_eps", out.adam_eps);
  out.warmup_steps = r.integer("warmup_steps", out.warmup_steps);
  out.warmup_fraction = r.number("warmup_fraction", out.warmup_fraction);
  out.min_lr_ratio = r.number("min_lr_ratio", out.min_lr_ratio);
  out.grad_clip = r.number("grad_clip", out.grad_clip);
  const std::int64_t seed = r.integer("seed", 0);
  if (j.contains("seed") && j.at("seed").is_number_unsigned())
    out.seed = j.at("seed").get<std::uint64_t>();
  else if (seed < 0)
    fail(op, "seed", "a non-negative integer", std::to_string(seed));
  else
    out.seed = static_cast<std::uint64_t>(seed);
  out.eval_every = r.integer("eval_every", out.eval_every);
  out.target_accuracy = r.number("target_accuracy", out.target_accuracy);
  out.target_metric = r.string("target_metric", out.target_metric);
  out.log_every = r.integer("log_every", out.log_every);
  out.checkpoint_every = r.integer("checkpoint_every", out.checkpoint_every);
  out.checkpoint_path = r.string("checkpoint_path", out.checkpoint_path);
  out.resume_from = r.string("resume_from", out.resume_from);
  out.stop_at_step = r.integer("stop_at_step", out.stop_at_step);
  r.finish();
  validate(out);
  c = std::move(out);
}

void validate(const TrainConfig& c) {
  const std::string op = "TrainConfig";
  auto check = [&](bool ok, const char* name, const char* expected, const std::string& got) {
    if (!ok) fail(op, name, expected, got);
  };
  auto num = [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  check(c.steps >= 1 && c.steps <= kMaxSteps, "steps", "in [1, 2^24]", std::to_string(c.steps));
  check(c.batch_size >= 1 && c.batch_size <= kMaxBatchSize, "batch_size", "in [1, 2^20]",
        std::to_string(c.batch_size));
  check(c.lr > 0 && std::isfinite(c.lr), "lr", "a positive finite number", num(c.lr));
  check(c.weight_decay >= 0 && std::isfinite(c.weight_decay), "weight_decay", "≥ 0",
        num(c.weight_decay));
  check(c.beta1 >= 0 && c.beta1 < 1, "beta1", "in [0, 1)", num(c.beta1));
  check(c.beta2 >= 0 && c.beta2 < 1, "beta2", "in [0, 1)", num(c.beta2));
  check(c.adam_eps > 0, "adam_eps", "> 0", num(c.adam_eps));
  check(c.warmup_fraction >= 0 && c.warmup_fraction <= 1, "warmup_fraction", "in [0, 1]",
        num(c.warmup_fraction));
  check(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1, "min_lr_ratio", "in [0, 1]",
        num(c.min_lr_ratio));
  check(c.grad_clip >= 0 && std::isfinite(c.grad_clip), "grad_clip", "≥ 0 (0: no clipping)",
        num(c.grad_clip));
  check(c.eval_every >= 0, "eval_every", "≥ 0", std::to_string(c.eval_every));
  check(c.log_every >= 0, "log_every", "≥ 0", std::to_string(c.log_every));
  check(c.checkpoint_every >= 0, "checkpoint_every", "≥ 0", std::to_string(c.checkpoint_every));
  check(c.checkpoint_every == 0 || !c.checkpoint_path.empty(), "checkpoint_path",
        "a path when checkpoint_every > 0", "an empty path");
  check(c.stop_at_step >= 0, "stop_at_step", "≥ 0", std::to_string(c.stop_at_step));
  check(c.target_metric == "token" || c.target_metric == "sequence", "target_metric",
        "'token' or 'sequence'", quoted(c.target_metric));
  check(c.target_accuracy <= 1, "target_accuracy", "≤ 1", num(c.target_accuracy));
}

double learning_rate(const TrainConfig& c, std::int64_t step) {
  const std::int64_t W = warmup_of(c);
  if (step <= W) return c.lr * static_cast<double>(step) / static_cast<double>(W);
  if (c.steps == W) return c.lr;
  constexpr double kPi = 3.14159265358979323846;
  const double progress = static_cast<double>(step - W) / static_cast<double>(c.steps - W);
  return c.lr * (c.min_lr_ratio + (1.0 - c.min_lr_ratio) * 0.5 * (1.0 + std::cos(kPi * progress)));
}

// ---- data ---------------------------------------------------------------------------------------

std::uint64_t batch_seed(std::uint64_t seed, std::int64_t step) {
  // splitmix64 (Steele, Lea, Flood 2014) finaliser, applied to the seed and then to the mix.
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(seed) ^ static_cast<std::uint64_t>(step));
}

BatchFn make_batch_stream(std::function<Batch(std::int64_t batch, std::uint64_t seed)> generate,
                          std::int64_t batch_size, std::uint64_t seed) {
  if (!generate) fail("make_batch_stream", "generate", "a generator", "an empty function");
  if (batch_size < 1) fail("make_batch_stream", "batch_size", "≥ 1", std::to_string(batch_size));
  return [generate = std::move(generate), batch_size, seed](std::int64_t step) {
    return generate(batch_size, batch_seed(seed, step));
  };
}

at::Tensor inputs_tensor(const Batch& b) {
  return int64_tensor(b.inputs, b.rows, b.cols);
}
at::Tensor targets_tensor(const Batch& b) {
  return int64_tensor(b.targets, b.rows, b.cols);
}

// ---- evaluation ---------------------------------------------------------------------------------

EvalResult evaluate(LanguageModel& model, const Batch& batch, std::int64_t rows_per_pass,
                    DataParallel* data_parallel) {
  check_batch(batch, model->config(), "evaluate");
  if (rows_per_pass < 1) fail("evaluate", "rows_per_pass", "≥ 1", std::to_string(rows_per_pass));
  DataParallel* const dp =
      data_parallel != nullptr && data_parallel->world_size() > 1 ? data_parallel : nullptr;
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor inputs = inputs_tensor(batch), targets = targets_tensor(batch);
  EvalResult r;
  // Each pass's predictions go to their rows' place and its loss sum to its slot; data parallel,
  // pass p runs on rank p mod N and the other ranks contribute zeros to the sums (exact).
  const std::int64_t passes = (batch.rows + rows_per_pass - 1) / rows_per_pass;
  at::Tensor predictions = torch::zeros({batch.rows * batch.cols}, at::kLong);
  at::Tensor pass_loss = torch::zeros({passes}, at::kDouble);
  for (std::int64_t pass = 0; pass < passes; ++pass) {
    if (dp && pass % dp->world_size() != dp->rank()) continue;
    const std::int64_t row = pass * rows_per_pass;
    const std::int64_t n = std::min(rows_per_pass, batch.rows - row);
    const at::Tensor logits = model->forward(inputs.narrow(0, row, n));
    const std::int64_t V = logits.size(-1);
    pass_loss.data_ptr<double>()[pass] =
        at::cross_entropy_loss(logits.reshape({-1, V}), targets.narrow(0, row, n).reshape({-1}), {},
                               at::Reduction::Sum, kIgnoreIndex)
            .item<double>();
    predictions.narrow(0, row * batch.cols, n * batch.cols).copy_(logits.argmax(-1).reshape({-1}));
  }
  model->train(was_training);
  if (dp) {
    std::vector<at::Tensor> p{predictions}, l{pass_loss};
    auto predictions_work = dp->group()->allreduce(p);
    auto loss_work = dp->group()->allreduce(l);
    dp->wait(predictions_work, "the all-reduce of an evaluation's predictions");
    dp->wait(loss_work, "the all-reduce of an evaluation's losses");
  }
  // The single-process order of the loss sum: pass by pass from 0.
  double loss_sum = 0.0;
  const double* per_pass = pass_loss.data_ptr<double>();
  for (std::int64_t pass = 0; pass < passes; ++pass) loss_sum += per_pass[pass];
  r.predictions.assign(predictions.data_ptr<std::int64_t>(),
                       predictions.data_ptr<std::int64_t>() + predictions.numel());
  r.metrics = tasks::evaluate(r.predictions, batch.targets, batch.rows, batch.cols);
  r.loss = loss_sum / static_cast<double>(r.metrics.scored_tokens);  // NaN if nothing is scored
  return r;
}

// ---- progress -----------------------------------------------------------------------------------

std::string format_progress(const ProgressInfo& p, const std::string& label) {
  std::ostringstream s;
  if (!label.empty()) s << label << "  ";
  s << "step " << p.step << "/" << p.total_steps << "  loss " << std::fixed << std::setprecision(4)
    << p.loss << "  acc " << std::setprecision(3) << p.train_accuracy;
  if (std::isfinite(p.eval_accuracy)) s << "  eval " << p.eval_accuracy;
  s << "  lr " << std::scientific << std::setprecision(1) << p.lr << std::fixed;
  if (p.tokens_per_s >= 1e4)
    s << "  " << std::setprecision(1) << p.tokens_per_s / 1e3 << "k tok/s";
  else
    s << "  " << std::setprecision(0) << p.tokens_per_s << " tok/s";
  s << (p.final ? "  took " + duration(p.elapsed_s) : "  ETA " + duration(p.eta_s));
  return s.str();
}

ProgressFn stderr_progress(const std::string& label) {
  const bool tty = isatty(fileno(stderr)) != 0;
  return [label, tty](const ProgressInfo& p) {
    const std::string line = format_progress(p, label);
    if (tty)
      std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), p.final ? "\n" : "");
    else
      std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  };
}

// ---- time breakdown -----------------------------------------------------------------------------

void to_json(nlohmann::json& j, const OpTime& t) {
  j = nlohmann::json{{"name", t.name}, {"calls", t.calls}, {"s", t.s}};
}

void to_json(nlohmann::json& j, const TimeBreakdown& t) {
  j = nlohmann::json{{"steps", t.steps},
                     {"data_s", t.data_s},
                     {"forward_s", t.forward_s},
                     {"backward_s", t.backward_s},
                     {"optimizer_s", t.optimizer_s},
                     {"metrics_s", t.metrics_s},
                     {"eval_s", t.eval_s},
                     {"checkpoint_s", t.checkpoint_s},
                     {"other_s", t.other_s},
                     {"sync_s", t.sync_s}};
  if (t.buckets > 0) {
    j["buckets"] = t.buckets;
    j["buckets_launched_in_backward"] = t.buckets_launched_in_backward;
  }
  if (t.ops_timed) {
    j["forward_kernels_s"] = t.forward_kernels_s;
    j["forward_ops_s"] = t.forward_ops_s;
    j["backward_kernels_s"] = t.backward_kernels_s;
    j["backward_ops_s"] = t.backward_ops_s;
    j["ops"] = t.ops;
  }
}

namespace {

// The OpTimer's state on its thread: nesting depth of the recorded ranges and the time summed in
// outermost ranges and in phasor's kernel scopes. Other threads (ATen's intra-op workers) are not
// observed: their work lies inside an outermost op of this thread.
struct OpTimerState {
  bool active = false;
  int depth = 0;
  double ops_s = 0.0, kernels_s = 0.0;
  // While by_name_on: the outermost ops, and the kernel scopes, by name.
  bool by_name_on = false;
  std::map<std::string, OpTime> by_name;
  std::string outermost;  // name of the outermost op running now
};
thread_local OpTimerState op_timer_state;

// The scope name of phasor's kernel calls in the LibTorch layer (src/torch/layer_util.h).
constexpr const char* kKernelScope = "phasor::kernel";

struct OpSpan : at::ObserverContext {
  std::chrono::steady_clock::time_point start;
  bool outermost = false, kernel = false;
};

std::unique_ptr<at::ObserverContext> op_start(const at::RecordFunction& fn) {
  OpTimerState& st = op_timer_state;
  if (!st.active) return nullptr;
  auto span = std::make_unique<OpSpan>();
  span->outermost = st.depth++ == 0;
  span->kernel = std::strcmp(fn.name(), kKernelScope) == 0;
  if (span->outermost && st.by_name_on) st.outermost = fn.name();
  span->start = std::chrono::steady_clock::now();
  return span;
}

void op_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!ctx) return;
  const auto* span = static_cast<const OpSpan*>(ctx);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - span->start).count();
  OpTimerState& st = op_timer_state;
  --st.depth;
  if (span->outermost) st.ops_s += s;
  if (span->kernel) st.kernels_s += s;
  if (st.by_name_on && (span->outermost || span->kernel)) {
    // A kernel scope is named after the op it runs in (an autograd node for a backward pass).
    OpTime& t = st.by_name[span->kernel && !span->outermost
                               ? std::string(kKernelScope) + " in " + st.outermost
                               : std::string(fn.name())];
    ++t.calls;
    t.s += s;
  }
}

}  // namespace

OpTimer::OpTimer() {
  if (op_timer_state.active) fail("OpTimer", "this", "one OpTimer per thread", "a second one");
  op_timer_state = OpTimerState{};
  op_timer_state.active = true;
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(op_start, op_end)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
}

OpTimer::~OpTimer() {
  at::removeCallback(handle_);
  op_timer_state.active = false;
}

double OpTimer::ops_s() {
  return op_timer_state.ops_s;
}
double OpTimer::kernels_s() {
  return op_timer_state.kernels_s;
}
bool OpTimer::active() {
  return op_timer_state.active;
}
void OpTimer::time_by_name(bool on) {
  op_timer_state.by_name_on = on;
}
std::vector<OpTime> OpTimer::by_name() {
  std::vector<OpTime> out;
  for (const auto& [name, t] : op_timer_state.by_name) out.push_back({name, t.calls, t.s});
  return out;
}

namespace {

// The ops timed by name since `before` (an earlier OpTimer::by_name()), slowest first.
std::vector<OpTime> ops_since(const std::vector<OpTime>& before) {
  std::vector<OpTime> out = OpTimer::by_name();
  for (OpTime& t : out)
    for (const OpTime& b : before)
      if (b.name == t.name) t.calls -= b.calls, t.s -= b.s;
  out.erase(std::remove_if(out.begin(), out.end(), [](const OpTime& t) { return t.calls == 0; }),
            out.end());
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.s > b.s; });
  return out;
}

}  // namespace

// ---- matmul threads -----------------------------------------------------------------------------

namespace {

// OpenMP's thread count of the calling thread, looked up in the process (LibTorch loads libgomp)
// rather than linked, as blas.cpp looks up OpenBLAS.
using SetThreads = void (*)(int);
using GetThreads = int (*)();
SetThreads omp_set_threads() {
  static const auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return f;
}
GetThreads omp_get_threads() {
  static const auto f = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return f;
}

struct MatmulThreadsState {
  bool active = false;
  int threads = 1;
  int depth = 0;  // matrix products entered and not yet left (nested: matmul → mm)
};
thread_local MatmulThreadsState matmul_threads_state;

// Called at every op's start on the training thread: the prefix picks the one list to compare
// with, and the lists compare exact names.
bool is_matrix_product(const char* name) {
  static constexpr char kOp[] = "aten::";
  static constexpr char kNode[] = "autograd::engine::evaluate_function: ";
  static const char* const kOps[] = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"};
  static const char* const kNodes[] = {"MmBackward0", "AddmmBackward0", "BmmBackward0",
                                       "BaddbmmBackward0"};
  auto any_of = [](const char* rest, const auto& names) {
    for (const char* n : names)
      if (std::strcmp(rest, n) == 0) return true;
    return false;
  };
  if (std::strncmp(name, kOp, sizeof kOp - 1) == 0) return any_of(name + sizeof kOp - 1, kOps);
  if (std::strncmp(name, kNode, sizeof kNode - 1) == 0)
    return any_of(name + sizeof kNode - 1, kNodes);
  return false;
}

// The thread count to restore when the outermost product ends.
struct ProductSpan : at::ObserverContext {
  int previous = 1;
};

std::unique_ptr<at::ObserverContext> product_start(const at::RecordFunction& fn) {
  MatmulThreadsState& st = matmul_threads_state;
  if (!st.active || !is_matrix_product(fn.name())) return nullptr;
  auto span = std::make_unique<ProductSpan>();
  if (st.depth++ == 0) {
    span->previous = omp_get_threads()();
    omp_set_threads()(st.threads);
  } else {
    span->previous = 0;  // nested: the outermost one restores
  }
  return span;
}

void product_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (!ctx) return;
  MatmulThreadsState& st = matmul_threads_state;
  --st.depth;
  const int previous = static_cast<const ProductSpan*>(ctx)->previous;
  if (previous > 0) omp_set_threads()(previous);
}

}  // namespace

MatmulThreads::MatmulThreads(int threads) {
  if (threads < 1) fail("MatmulThreads", "threads", "a positive number", std::to_string(threads));
  if (matmul_threads_state.active)
    fail("MatmulThreads", "this", "one MatmulThreads per thread", "a second one");
  if (omp_set_threads() == nullptr || omp_get_threads() == nullptr) return;  // no OpenMP
  matmul_threads_state = MatmulThreadsState{true, threads, 0};
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(product_start, product_end)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

MatmulThreads::~MatmulThreads() {
  if (!matmul_threads_state.active) return;
  at::removeCallback(handle_);
  matmul_threads_state.active = false;
}

// ---- training -----------------------------------------------------------------------------------

TrainResult train(LanguageModel& model, const TrainConfig& config, const BatchFn& data,
                  const EvalFn& eval, const ProgressFn& progress, DataParallel* data_parallel) {
  validate(config);
  if (!data) fail("train", "data", "a batch function", "an empty function");
  // Data parallel over more than one rank; a group of one trains as a single process.
  DataParallel* const dp =
      data_parallel != nullptr && data_parallel->world_size() > 1 ? data_parallel : nullptr;
  if (dp) (void)dp->shard_rows(config.batch_size, "train");
  const bool writer = dp == nullptr || dp->writer();
  const auto start_time = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  };
  auto optimizer = make_optimizer(model, config);
  History h;
  if (!config.resume_from.empty()) h = resume(config.resume_from, model, *optimizer, config);
  if (dp) {
    // Every rank starts from the same step (the same checkpoint, or none) and from rank 0's
    // parameters (the optimizer states, read from the same checkpoint, agree then too).
    dp->check_same(h.step, "train", "resume_from",
                   "step to start from (every rank must read the same checkpoint, or none)");
    dp->broadcast_model(model);
  }
  model->train();

  const std::int64_t last =
      config.stop_at_step > 0 ? std::min(config.stop_at_step, config.steps) : config.steps;
  const std::int64_t first = h.step + 1;
  std::int64_t tokens = 0;
  double last_eval_metric = std::numeric_limits<double>::quiet_NaN();
  if (!h.evals.empty())
    last_eval_metric =
        metric_of(config, h.evals.back().token_accuracy, h.evals.back().sequence_accuracy);
  const auto params = model->parameters();
  bool done = h.stopped_early || h.diverged;
  std::optional<GradientReducer> reducer;
  if (dp) reducer.emplace(*dp, params);

  // The time breakdown: each phase's wall time is added to its field (lap), and with an OpTimer
  // the time of ops and kernels inside the forward and backward phases (op_lap).
  TimeBreakdown tb;
  tb.ops_timed = OpTimer::active();
  const std::vector<OpTime> ops_before = tb.ops_timed ? OpTimer::by_name() : std::vector<OpTime>{};
  auto mark = std::chrono::steady_clock::now();
  auto lap = [&mark](double& phase) {
    const auto now = std::chrono::steady_clock::now();
    phase += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  double ops_mark = 0.0, kernels_mark = 0.0;
  auto op_lap = [&](double& ops, double& kernels) {
    if (!tb.ops_timed) return;
    const double o = OpTimer::ops_s(), k = OpTimer::kernels_s();
    ops += (o - ops_mark) - (k - kernels_mark);
    kernels += k - kernels_mark;
    ops_mark = o, kernels_mark = k;
  };
  double unused_ops = 0.0, unused_kernels = 0.0;

  for (std::int64_t step = first; step <= last && !done; ++step) {
    lap(tb.other_s);
    op_lap(unused_ops, unused_kernels);
    const Batch global = data(step);
    check_batch(global, model->config(), "train");
    // A batch without targets has no loss (the mean over nothing is NaN), which must not be
    // mistaken for divergence.
    const auto scored_total = static_cast<std::int64_t>(
        global.targets.size() -
        static_cast<std::size_t>(std::count(global.targets.begin(), global.targets.end(),
                                            static_cast<std::int64_t>(kIgnoreIndex))));
    if (scored_total == 0)
      fail("train", "batch", "at least one scored target (≠ −100)",
           "a batch of step " + std::to_string(step) + " without any");
    // Data parallel: this rank's rows of the global batch.
    const Batch local = dp ? dp->shard(global, "train") : Batch{};
    const Batch& batch = dp ? local : global;
    const at::Tensor inputs = inputs_tensor(batch), targets = targets_tensor(batch);
    lap(tb.data_s);
    op_lap(unused_ops, unused_kernels);
    if (tb.ops_timed) OpTimer::time_by_name(true);

    const ScoredLogits scored = scored_logits(model, inputs, batch, targets);
    // Data parallel: this rank's share of the global batch's mean loss, Σ_rank CE / scored_total,
    // so that the sum over the ranks of the loss and of its gradient is the single-process one.
    const at::Tensor loss =
        dp ? at::cross_entropy_loss(scored.logits.reshape({-1, scored.logits.size(-1)}),
                                    scored.targets.reshape({-1}), {}, at::Reduction::Sum,
                                    kIgnoreIndex) /
                 static_cast<double>(scored_total)
           : loss_of(scored.logits, scored.targets);
    double loss_value = loss.item<double>();
    // Data parallel: the global loss and predictions, summed over the ranks while the backward
    // pass runs — [loss, predictions of the global batch's positions] in float64 (the token ids
    // are exact), each rank filling its own rows.
    at::Tensor stats;
    c10::intrusive_ptr<c10d::Work> stats_work;
    if (dp) {
      stats = torch::zeros({1 + global.rows * global.cols}, at::kDouble);
      double* s = stats.data_ptr<double>();
      s[0] = loss_value;
      const std::vector<std::int64_t> pred = predictions_of(scored, batch);
      double* own = s + 1 + dp->shard_rows(global.rows, "train").begin * global.cols;
      for (std::size_t i = 0; i < pred.size(); ++i) own[i] = static_cast<double>(pred[i]);
      std::vector<at::Tensor> t{stats};
      stats_work = dp->group()->allreduce(t);
    }
    lap(tb.forward_s);
    op_lap(tb.forward_ops_s, tb.forward_kernels_s);
    if (!dp && !std::isfinite(loss_value)) {
      // No update from a non-finite loss: the parameters stay those of the last good step.
      h.diverged = true;
      break;
    }
    optimizer->zero_grad();
    lap(tb.optimizer_s);
    op_lap(unused_ops, unused_kernels);
    loss.backward();
    lap(tb.backward_s);
    op_lap(tb.backward_ops_s, tb.backward_kernels_s);
    Metrics global_metrics;
    if (dp) {
      // Every rank takes the same decision from the summed loss.
      reducer->finish(step);
      tb.buckets = static_cast<std::int64_t>(reducer->num_buckets());
      tb.buckets_launched_in_backward += static_cast<std::int64_t>(reducer->launched_in_backward());
      dp->wait(stats_work,
               "the all-reduce of the loss and predictions of step " + std::to_string(step));
      const double* s = stats.data_ptr<double>();
      loss_value = s[0];
      std::vector<std::int64_t> pred(static_cast<std::size_t>(global.rows * global.cols));
      for (std::size_t i = 0; i < pred.size(); ++i) pred[i] = static_cast<std::int64_t>(s[1 + i]);
      global_metrics = evaluate(pred.data(), global.targets.data(), global.rows, global.cols);
      lap(tb.sync_s);
      if (!std::isfinite(loss_value)) {
        h.diverged = true;
        break;
      }
    }
    if (config.grad_clip > 0) torch::nn::utils::clip_grad_norm_(params, config.grad_clip);
    const double lr = learning_rate(config, step);
    for (auto& group : optimizer->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    optimizer->step();
    lap(tb.optimizer_s);
    if (tb.ops_timed) OpTimer::time_by_name(false);

    const Metrics m = dp ? std::move(global_metrics) : metrics_of(scored, batch);
    h.step = step;
    h.losses.push_back(loss_value);
    h.train_accuracies.push_back(m.token_accuracy);
    tokens += global.rows * global.cols;
    ++tb.steps;
    lap(tb.metrics_s);

    const bool eval_now =
        step == config.steps || (config.eval_every > 0 && step % config.eval_every == 0);
    if (eval_now) {
      EvalRecord rec;
      rec.step = step;
      if (eval) {
        const EvalResult e = eval(model);
        rec.loss = e.loss;
        rec.token_accuracy = e.metrics.token_accuracy;
        rec.sequence_accuracy = e.metrics.sequence_accuracy;
      } else {
        // Without held-out data, this step's batch: fresh data the model had not seen when it
        // predicted it (the update came after), so still an unbiased estimate.
        rec.loss = loss_value;
        rec.token_accuracy = m.token_accuracy;
        rec.sequence_accuracy = m.sequence_accuracy;
      }
      h.evals.push_back(rec);
      last_eval_metric = metric_of(config, rec.token_accuracy, rec.sequence_accuracy);
      if (config.target_accuracy > 0 && last_eval_metric >= config.target_accuracy) {
        h.stopped_early = step < config.steps;
        done = true;
      }
      lap(tb.eval_s);
    }
    const bool checkpoint_now =
        !config.checkpoint_path.empty() &&
        ((config.checkpoint_every > 0 && step % config.checkpoint_every == 0) || step == last ||
         done);
    // Data parallel: the replicas must still be the same bits (the same summed gradient, the
    // same AdamW on every rank), checked wherever rank 0 writes them down.
    if (dp && (checkpoint_now || step == last || done))
      dp->check_same(
          model_crc32(model), "train", "model",
          "parameters (CRC-32; the replicas must stay identical), at step " + std::to_string(step));
    if (checkpoint_now && writer) {
      save_checkpoint(config.checkpoint_path, model, *optimizer, config, h);
      lap(tb.checkpoint_s);
    }

    if (progress && config.log_every > 0 &&
        (step % config.log_every == 0 || step == last || done)) {
      ProgressInfo p;
      p.step = step;
      p.total_steps = config.steps;
      p.loss = loss_value;
      p.lr = lr;
      p.train_accuracy = m.token_accuracy;
      p.eval_accuracy = last_eval_metric;
      p.elapsed_s = elapsed();
      p.tokens_per_s = static_cast<double>(tokens) / std::max(p.elapsed_s, 1e-9);
      const double per_step = p.elapsed_s / static_cast<double>(step - first + 1);
      p.eta_s = per_step * static_cast<double>(last - step);
      p.final = step == last || done;
      progress(p);
    }
  }
  lap(tb.other_s);
  if (tb.ops_timed) {
    OpTimer::time_by_name(false);
    tb.ops = ops_since(ops_before);
  }
  if (h.diverged && !config.checkpoint_path.empty() && writer) {
    save_checkpoint(config.checkpoint_path, model, *optimizer, config, h);
    lap(tb.checkpoint_s);
  }

  TrainResult r;
  r.time = tb;
  r.final_step = h.step;
  r.losses = std::move(h.losses);
  r.train_accuracies = std::move(h.train_accuracies);
  r.evals = std::move(h.evals);
  r.stopped_early = h.stopped_early;
  r.diverged = h.diverged;
  r.wall_time_s = elapsed();
  r.tokens_per_s = static_cast<double>(tokens) / std::max(r.wall_time_s, 1e-9);
  if (!r.evals.empty()) {
    r.final_accuracy =
        metric_of(config, r.evals.back().token_accuracy, r.evals.back().sequence_accuracy);
    r.best_accuracy = r.final_accuracy;
    for (const auto& e : r.evals)
      r.best_accuracy =
          std::max(r.best_accuracy, metric_of(config, e.token_accuracy, e.sequence_accuracy));
  } else if (!r.train_accuracies.empty()) {
    r.final_accuracy = r.best_accuracy = r.train_accuracies.back();
  }
  if (r.diverged) r.final_accuracy = 0.0;
  return r;
}

// ---- checkpoints --------------------------------------------------------------------------------

CheckpointInfo verify_checkpoint(const std::string& path) {
  const CheckpointFile f = open_checkpoint(path);
  const Contents c = read_contents(f, path);
  CheckpointInfo info = f.info;
  info.step = c.history.step;
  info.model_config = model_config_of(c, path);
  try {
    info.train_config = c.train_config.get<TrainConfig>();
  } catch (const Error& e) {
    refuse(path, std::string("its train config is invalid: ") + e.what());
  } catch (const nlohmann::json::exception& e) {
    refuse(path, std::string("its train config is invalid: ") + e.what());
  }
  if (info.step > info.train_config.steps)
    refuse(path, "step " + std::to_string(info.step) + " beyond the run's " +
                     std::to_string(info.train_config.steps) + " steps");
  return info;
}

std::map<std::string, at::Tensor> checkpoint_tensors(const std::string& path) {
  const CheckpointFile f = open_checkpoint(path);
  (void)read_contents(f, path);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& kv : f.entries)
    if (kv.second.kind == kTensor) tensors.emplace(kv.first, kv.second.tensor);
  return tensors;
}

ModelConfig checkpoint_model_config(const std::string& path) {
  return verify_checkpoint(path).model_config;
}

std::int64_t checkpoint_step(const std::string& path) {
  return verify_checkpoint(path).step;
}

LanguageModel load_model(const std::string& path) {
  const CheckpointFile f = open_checkpoint(path);
  const Contents c = read_contents(f, path);
  // The layer options are checked only when the layers are built: an error then is still about
  // this file (found by tests/fuzz/checkpoint_fuzz: an unknown mixer option in the stored config).
  LanguageModel model{nullptr};
  try {
    model = LanguageModel(model_config_of(c, path));
  } catch (const Error& e) {
    refuse(path, std::string("its model config does not build: ") + e.what());
  } catch (const c10::Error& e) {
    refuse(path, std::string("its model config does not build: ") + e.what_without_backtrace());
  }
  load_parameters(f, path, model);
  return model;
}

// ---- learning-rate grid -------------------------------------------------------------------------

GridResult lr_grid(const ModelConfig& model_config, const TrainConfig& config,
                   const std::vector<double>& lrs, const std::vector<std::uint64_t>& seeds,
                   const std::function<BatchFn(std::uint64_t seed)>& data,
                   const std::function<EvalFn(std::uint64_t seed)>& eval,
                   const ProgressFn& progress) {
  if (lrs.empty()) fail("lr_grid", "lrs", "at least one learning rate", "none");
  if (seeds.empty()) fail("lr_grid", "seeds", "at least one seed", "none");
  if (!data) fail("lr_grid", "data", "a data factory", "an empty function");
  GridResult g;
  for (const double lr : lrs) {
    double sum = 0.0;
    for (const std::uint64_t seed : seeds) {
      TrainConfig c = config;
      c.lr = lr;
      c.seed = seed;
      if (!c.checkpoint_path.empty()) {
        std::ostringstream p;
        p << config.checkpoint_path << ".lr" << lr << ".seed" << seed;
        c.checkpoint_path = p.str();
      }
      torch::manual_seed(seed);
      LanguageModel model(model_config);
      GridRun run;
      run.lr = lr;
      run.seed = seed;
      run.result = train(model, c, data(seed), eval ? eval(seed) : EvalFn{}, progress);
      sum += run.result.final_accuracy;
      g.runs.push_back(std::move(run));
    }
    g.mean_accuracy.push_back(sum / static_cast<double>(seeds.size()));
  }
  std::size_t best_lr = 0;
  for (std::size_t i = 1; i < lrs.size(); ++i)
    if (g.mean_accuracy[i] > g.mean_accuracy[best_lr]) best_lr = i;
  g.best_lr = lrs[best_lr];
  auto last_loss = [](const GridRun& r) {
    return r.result.losses.empty() || r.result.diverged ? std::numeric_limits<double>::infinity()
                                                        : r.result.losses.back();
  };
  for (std::size_t i = 1; i < g.runs.size(); ++i) {
    const auto& a = g.runs[i].result;
    const auto& b = g.runs[g.best_run].result;
    if (a.final_accuracy > b.final_accuracy ||
        (a.final_accuracy == b.final_accuracy &&
         last_loss(g.runs[i]) < last_loss(g.runs[g.best_run])))
      g.best_run = i;
  }
  return g;
}

}  // namespace phasor::tasks
