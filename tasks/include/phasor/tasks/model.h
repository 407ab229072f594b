// phasor::tasks — the small language model of the synthetic-task harness (LibTorch).
//
//   tokens [B, T] int64 → embedding → N × block → RMSNorm → head → logits [B, T, V]
//   block:  x ← x + mixer(RMSNorm(x));  with mlp:  x ← x + MLP(RMSNorm(x))      (pre-norm)
//
// The mixer and the position encoding of q and k are looked up by name in two open registries
// (string → factory), so later work adds entries (other encodings, Performer features, …) with
// register_mixer / register_position_encoding and no change to the model:
//   mixers:             "gla"             phasor::nn::GatedLinearAttention
//                       "gated_deltanet"  phasor::nn::GatedDeltaNet (β ∈ (0, beta_range))
//                       "fox"             phasor::nn::ForgettingAttention (Forgetting Transformer)
//                       "attention"       the same layer without forget gate: causal softmax
//                                         attention, the control arm
//                       "performer"       phasor::nn::PerformerAttention (causal FAVOR+ linear
//                                         attention with positive orthogonal random features)
//   position encodings: "none", "rope", "selective_rope"   (phasor::nn::PosEncoding)
//                       "alibi", "grape_a"  additive logit biases fused in the FoX kernel
//                                         (phasor::nn::AdditiveBias): ALiBi's fixed per-head
//                                         slopes, GRAPE-A-QK's learnable content-gated slopes.
//                                         Only with the mixers "fox" and "attention" (softmax
//                                         attention + ALiBi); any other mixer raises an error
//                                         naming itself.
//                       "string_cayley"     Cayley-STRING: RoPE · (I − S)(I + S)^(−1), S learnable
//                       "string_circulant"  Circulant-STRING: exp(t (C − Cᵀ)), C circulant
//                       "grape"             multi-subspace GRAPE-M: RoPE in a learned basis
//                       (learnable rotations, RoPE or RoPE-equivalent at init; phasor/nn.h)
//
//   #include <phasor/tasks/model.h>      // CMake: target_link_libraries(app PRIVATE phasor_tasks)
//   phasor::tasks::ModelConfig cfg;
//   cfg.vocab_size = 8192; cfg.mixer = "gla"; cfg.pos_encoding = "selective_rope";
//   torch::manual_seed(seed);            // parameters are drawn from torch's default generator
//   phasor::tasks::LanguageModel model(cfg);
//   at::Tensor logits = model->forward(tokens);   // [B, T] int64 → [B, T, V]
//
// Configs convert to and from JSON (nlohmann::json); unknown keys, wrong types and invalid
// values raise phasor::Error "<op>: argument '<key>': expected <what>, got <given>".
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "phasor/common.h"
#include "phasor/nn.h"

namespace phasor::tasks {

// Size limits of a ModelConfig (validate): a config asking for more is refused with a
// phasor::Error before anything is allocated. The embedding, the head, the MLP weights and the
// mixers' four D × D projections — 2·V·D + num_layers·((3 or 2)·mlp_expansion + 4)·D² — count
// against kMaxModelParameters (2^27: 512 MiB in float32); the experiment runner also counts the
// parameters of a one-block probe model against it (experiment.h).
inline constexpr std::int64_t kMaxVocabSize = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxHiddenSize = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxLayers = 1024;
inline constexpr std::int64_t kMaxMlpExpansion = 64;
inline constexpr std::int64_t kMaxModelParameters = std::int64_t{1} << 27;
// A layer option (expand_k, head_dim, num_features, rank, conv_size, …) may not make one weight
// matrix of a mixer or position encoding exceed this many elements (checked when it is built).
inline constexpr std::int64_t kMaxLayerWeights = std::int64_t{1} << 22;

struct ModelConfig {
  std::int64_t vocab_size = 0;  // V (> 0; no default: it is the task's)
  std::int64_t hidden_size = 128;
  std::int64_t num_layers = 2;
  std::int64_t num_heads = 2;
  std::string mixer = "gla";          // a registered mixer (see above)
  std::string pos_encoding = "none";  // a registered position encoding
  int beta_range = 1;  // Gated DeltaNet: β ∈ (0, 1) or (0, 2) (negative eigenvalues)
  bool mlp = true;     // an MLP sub-block after each mixer
  std::string mlp_activation = "swiglu";  // "swiglu": W2 (SiLU(W1 x) ⊙ W3 x); "gelu": W2 GELU(W1 x)
  std::int64_t mlp_expansion = 2;         // MLP width = mlp_expansion · hidden_size
  double norm_eps = 1e-5;                 // RMSNorm epsilon (blocks and final norm)
  double init_std = 0.02;                 // N(0, init_std²) for the embedding and the head
  std::string dtype = "float32";          // "float32" | "float64" (parameters and logits)
  // Layer options, passed to the mixer / position-encoding factory, which rejects keys it does
  // not know. Built-in keys:
  //  gla:             expand_k, expand_v, use_short_conv, conv_size, use_output_gate,
  //                   gate_low_rank_dim, gate_logit_normalizer, clamp_min, chunk_size,
  //                   tie_gate_pairs, impl
  //  gated_deltanet:  head_dim (default hidden/heads), num_v_heads, expand_v, use_short_conv,
  //                   conv_size, use_gate, chunk_size, impl
  //  fox, attention:  num_kv_heads, qk_norm, qkv_bias, window_size, use_output_gate,
  //                   use_output_norm, block_size
  //  performer:       num_features (m, default 64), feature_kind ("orthogonal_chi" |
  //                   "orthogonal_fixed" | "iid"), seed (≥ 0; default: drawn from torch's
  //                   generator, so each layer gets its own features), per_head_features,
  //                   qkv_bias, chunk_size, rotary_layout (no fused_rotation: FAVOR+ rotates
  //                   q and k before the features)
  //  every other mixer: fused_rotation, rotary_layout ("half_split" | "interleaved")
  nlohmann::json mixer_options = nlohmann::json::object();
  //  rope:            rope_theta
  //  selective_rope:  projection ("low_rank" | "full_rank"), rank, conv_size, conv_silu, bias,
  //                   gate ("none" | "per_head" | "per_channel"), spectrum ("rope" | "tan2"),
  //                   spectrum_base, learnable_omega
  //  alibi, grape_a:  rope (boolean, default false: also rotate q, k by RoPE), rope_theta
  //  string_cayley, grape:  rope_theta (base of the initial spectrum), per_head (default true:
  //                   generator per key head, else shared), learnable_omega (default false),
  //                   init_std (default 0: start exactly at RoPE)
  //  string_circulant:      rope_theta, per_head, init_std (its frequencies come from c)
  nlohmann::json pos_options = nlohmann::json::object();
};

void to_json(nlohmann::json& j, const ModelConfig& config);
void from_json(const nlohmann::json& j, ModelConfig& config);  // throws phasor::Error
// Checks everything but the layer options (those are checked when the layers are built).
void validate(const ModelConfig& config);
// The parsed contents of a JSON file; a missing or unparsable file raises phasor::Error naming
// the path (and, for a parse error, the byte where it failed).
nlohmann::json read_json_file(const std::string& path);
// The same for JSON text named `source` in messages. Text nested deeper than kMaxJsonDepth
// arrays / objects is refused too (the checks that print or compare values recurse).
inline constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

// Reads the keys of a JSON options object for `op`, remembering which were used, so that
// finish() can reject the others (typos must not silently fall back to defaults).
class OptionReader {
 public:
  OptionReader(const nlohmann::json& options, std::string op);
  double number(const std::string& key, double fallback);
  std::int64_t integer(const std::string& key, std::int64_t fallback);
  // For options whose absence means something other than any value ("not set"): nullopt when the
  // key is absent. Like every read, the key is then one that finish()'s error lists as valid.
  std::optional<double> optional_number(const std::string& key);
  std::optional<std::int64_t> optional_integer(const std::string& key);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback);
  // Throws phasor::Error naming the first key that was never read.
  void finish() const;

 private:
  bool has(const std::string& key) const;
  const nlohmann::json* find(const std::string& key, const char* type);
  const nlohmann::json& options_;
  std::string op_;
  std::set<std::string> used_;   // keys given and read
  std::set<std::string> known_;  // keys the factory asked for (given or not)
};

// ---- registries ---------------------------------------------------------------------------------

// How q and k are rotated: what a position-encoding factory returns and a mixer factory consumes.
// (An encoding that is not a rotation would add its own fields here and be honoured by the
// mixers that support it.)
struct PositionEncoding {
  std::string name;
  nn::PosEncoding kind = nn::PosEncoding::none;
  double rope_theta = 10000.0;
  nn::SelectiveRoPEOptions selective_rope = nn::SelectiveRoPEOptions(0, 0, 0);
  // ---- additive logit bias ("alibi", "grape_a"): not a rotation; composes with the one above.
  // Honoured by the mixers "fox" and "attention" (ForgettingAttentionOptions::additive_bias);
  // every other mixer must reject anything but AdditiveBias::none.
  nn::AdditiveBias additive_bias = nn::AdditiveBias::none;
  // ---- rotation encodings "string_cayley", "string_circulant", "grape" (phasor::nn's
  // RotationEncodingOptions; sizes, base and layout are set by the layer) ----
  nn::RotationEncodingOptions rotation = nn::RotationEncodingOptions();
};
using PositionEncodingFactory = std::function<PositionEncoding(const ModelConfig&)>;

// A built mixer: the module (registered as the block's submodule "mixer") and its forward
// x [B, T, D] → [B, T, D].
struct Mixer {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
};
using MixerFactory = std::function<Mixer(const ModelConfig&, const PositionEncoding&)>;

// Add an entry (phasor::Error if the name is taken or empty). Built-ins are always present.
void register_mixer(const std::string& name, MixerFactory factory);
void register_position_encoding(const std::string& name, PositionEncodingFactory factory);
std::vector<std::string> mixer_names();              // sorted
std::vector<std::string> position_encoding_names();  // sorted

// ---- the model ----------------------------------------------------------------------------------

namespace detail {
class BlockImpl;
}

class LanguageModelImpl : public torch::nn::Module {
 public:
  // Draws the parameters from torch's default generator (seed it first for reproducibility).
  explicit LanguageModelImpl(ModelConfig config);
  // tokens: [B, T ≥ 1] int64 on the CPU, ids in [0, V) → logits [B, T, V] in the config's dtype.
  at::Tensor forward(const at::Tensor& tokens);
  // forward in two parts, forward(t) = logits(hidden(t)): the blocks' output [B, T, D], and the
  // final RMSNorm and head applied row by row to hidden states [..., D] → [..., V]. Training
  // applies the head to the scored positions only.
  at::Tensor hidden(const at::Tensor& tokens);
  at::Tensor logits(const at::Tensor& hidden);
  // For probes of what the layers compute (phase_probe.h): the input each block's mixer sees —
  // the block's input after its RMSNorm — per layer, [B, T, D] each, from the same pass as
  // hidden(tokens); and the Selective RoPE modules of layer `layer`'s mixer (empty without one).
  std::vector<at::Tensor> mixer_inputs(const at::Tensor& tokens);
  std::vector<nn::SelectiveRoPE> selective_ropes(std::int64_t layer);

  const ModelConfig& config() const { return config_; }
  std::int64_t num_parameters() const;

  at::Tensor embedding;    // [V, D]
  at::Tensor norm_weight;  // [D], final RMSNorm
  at::Tensor head_weight;  // [V, D]
  std::vector<std::shared_ptr<detail::BlockImpl>> blocks;

 private:
  // phasor::Error unless tokens is an int64 CPU tensor [B ≥ 1, T ≥ 1] of ids in [0, V).
  void check_tokens(const at::Tensor& tokens) const;
  ModelConfig config_;
};
TORCH_MODULE(LanguageModel);

}  // namespace phasor::tasks
