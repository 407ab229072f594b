// The language model of the task harness (phasor/tasks/model.h): configs, the mixer and
// position-encoding registries, and the pre-norm stack.
#include "phasor/tasks/model.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "check.h"

namespace phasor::tasks {

using detail::fail;

namespace {

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// ---- option parsing helpers for the built-in factories ------------------------------------------

nn::PhaseProjection projection_from(const std::string& op, const std::string& s) {
  if (s == "low_rank") return nn::PhaseProjection::low_rank;
  if (s == "full_rank") return nn::PhaseProjection::full_rank;
  fail(op, "projection", "'low_rank' or 'full_rank'", quoted(s));
}

nn::PhaseGate gate_from(const std::string& op, const std::string& s) {
  if (s == "none") return nn::PhaseGate::none;
  if (s == "per_head") return nn::PhaseGate::per_head;
  if (s == "per_channel") return nn::PhaseGate::per_channel;
  fail(op, "gate", "'none', 'per_head' or 'per_channel'", quoted(s));
}

nn::Spectrum spectrum_from(const std::string& op, const std::string& s) {
  if (s == "rope") return nn::Spectrum::rope;
  if (s == "tan2") return nn::Spectrum::tan2;
  fail(op, "spectrum", "'rope' or 'tan2'", quoted(s));
}

RotaryLayout layout_from(const std::string& op, const std::string& s) {
  if (s == "half_split") return RotaryLayout::half_split;
  if (s == "interleaved") return RotaryLayout::interleaved;
  fail(op, "rotary_layout", "'half_split' or 'interleaved'", quoted(s));
}

Impl impl_from(const std::string& op, const std::string& s) {
  if (s == "chunk") return Impl::chunk;
  if (s == "recurrent") return Impl::recurrent;
  fail(op, "impl", "'chunk' or 'recurrent'", quoted(s));
}

FavorMatrixKind feature_kind_from(const std::string& op, const std::string& s) {
  if (s == "orthogonal_chi") return FavorMatrixKind::orthogonal_chi;
  if (s == "orthogonal_fixed") return FavorMatrixKind::orthogonal_fixed;
  if (s == "iid") return FavorMatrixKind::iid;
  fail(op, "feature_kind", "'orthogonal_chi', 'orthogonal_fixed' or 'iid'", quoted(s));
}

// Additive biases live in the FoX kernel: a mixer that cannot apply them says so by name.
void require_no_additive_bias(const std::string& op, const PositionEncoding& pe) {
  if (pe.additive_bias != nn::AdditiveBias::none)
    fail(op, "pos_encoding",
         "a rotation encoding (the additive logit bias " + quoted(pe.name) +
             " is fused in the FoX kernel: use the mixer 'fox' or 'attention')",
         quoted(pe.name));
}

// Layer construction errors of phasor::nn are c10::Error; turn them into phasor::Error so that
// every configuration problem reaches the caller as one exception type.
template <class F>
auto build_layer(const std::string& op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw Error(op + ": invalid layer options: " + e.what_without_backtrace());
  }
}

// The harness's models are small: a layer option may not ask for a weight matrix of more than
// kMaxLayerWeights elements (rows × cols, in double so that no product overflows; a non-positive
// size passes here and is refused by the layer). Checked before the layer is built, so that no
// config makes the probe build at parse time (experiment.h) allocate a giant matrix.
void check_weights(const std::string& op, const char* key, double rows, double cols) {
  if (!(rows * cols <= static_cast<double>(kMaxLayerWeights)))
    fail(op, key, "a size giving weight matrices of at most 2^22 elements",
         "a " + std::to_string(rows) + " × " + std::to_string(cols) + " matrix");
}

// ---- built-in position encodings ----------------------------------------------------------------

PositionEncoding no_position(const ModelConfig& c) {
  OptionReader r(c.pos_options, "pos_encoding 'none'");
  r.finish();
  return {"none", nn::PosEncoding::none, 10000.0, nn::SelectiveRoPEOptions(0, 0, 0)};
}

PositionEncoding rope_position(const ModelConfig& c) {
  OptionReader r(c.pos_options, "pos_encoding 'rope'");
  PositionEncoding p{"rope", nn::PosEncoding::rope, 10000.0, nn::SelectiveRoPEOptions(0, 0, 0)};
  p.rope_theta = r.number("rope_theta", p.rope_theta);
  r.finish();
  return p;
}

PositionEncoding selective_rope_position(const ModelConfig& c) {
  const std::string op = "pos_encoding 'selective_rope'";
  OptionReader r(c.pos_options, op);
  PositionEncoding p{"selective_rope", nn::PosEncoding::selective_rope, 10000.0,
                     nn::SelectiveRoPEOptions(0, 0, 0)};
  auto& s = p.selective_rope;
  s.projection(projection_from(op, r.string("projection", "low_rank")));
  s.rank(r.integer("rank", s.rank()));
  s.conv_size(r.integer("conv_size", s.conv_size()));
  s.conv_silu(r.boolean("conv_silu", s.conv_silu()));
  s.bias(r.boolean("bias", s.bias()));
  s.gate(gate_from(op, r.string("gate", "per_head")));
  s.spectrum(spectrum_from(op, r.string("spectrum", "rope")));
  s.spectrum_base(r.number("spectrum_base", s.spectrum_base()));
  s.learnable_omega(r.boolean("learnable_omega", s.learnable_omega()));
  r.finish();
  const auto D = static_cast<double>(c.hidden_size);
  check_weights(op, "rank", D, static_cast<double>(s.rank()));
  check_weights(op, "conv_size", D, static_cast<double>(s.conv_size()));
  return p;
}

// Additive logit biases (ALiBi, GRAPE-A-QK), optionally with RoPE on q and k as well.
PositionEncoding additive_position(const ModelConfig& c, const std::string& name,
                                   nn::AdditiveBias bias) {
  OptionReader r(c.pos_options, "pos_encoding " + quoted(name));
  PositionEncoding p;
  p.name = name;
  p.additive_bias = bias;
  if (r.boolean("rope", false)) p.kind = nn::PosEncoding::rope;
  p.rope_theta = r.number("rope_theta", p.rope_theta);
  r.finish();
  return p;
}

// ---- rotation encodings: string_cayley, string_circulant, grape (phasor/nn.h) ----

PositionEncoding rotation_position(const ModelConfig& c, const std::string& name,
                                   nn::PosEncoding kind) {
  OptionReader r(c.pos_options, "pos_encoding " + quoted(name));
  PositionEncoding p;
  p.name = name;
  p.kind = kind;
  p.rope_theta = r.number("rope_theta", p.rope_theta);
  auto& o = p.rotation;
  o.per_head(r.boolean("per_head", o.per_head()));
  // Circulant-STRING's frequencies are a function of its coefficients c: no separate ω.
  if (kind != nn::PosEncoding::string_circulant)
    o.learnable_omega(r.boolean("learnable_omega", o.learnable_omega()));
  o.init_std(r.number("init_std", o.init_std()));
  r.finish();
  // Values (init_std ≥ 0, rope_theta > 1) are checked by the layer when the mixer is built.
  return p;
}

// ---- built-in mixers ----------------------------------------------------------------------------

template <class Layer>
Mixer wrap(Layer layer) {
  Mixer m;
  m.module = layer.ptr();
  m.forward = [impl = layer.ptr()](const at::Tensor& x) { return impl->forward(x); };
  return m;
}

Mixer gla_mixer(const ModelConfig& c, const PositionEncoding& pe) {
  const std::string op = "mixer 'gla'";
  require_no_additive_bias(op, pe);
  OptionReader r(c.mixer_options, op);
  auto o = nn::GatedLinearAttentionOptions(c.hidden_size, c.num_heads);
  o.expand_k(r.number("expand_k", o.expand_k()));
  o.expand_v(r.number("expand_v", o.expand_v()));
  o.use_short_conv(r.boolean("use_short_conv", o.use_short_conv()));
  o.conv_size(r.integer("conv_size", o.conv_size()));
  o.use_output_gate(r.boolean("use_output_gate", o.use_output_gate()));
  o.gate_low_rank_dim(r.integer("gate_low_rank_dim", o.gate_low_rank_dim()));
  o.gate_logit_normalizer(r.number("gate_logit_normalizer", o.gate_logit_normalizer()));
  if (const auto clamp_min = r.optional_number("clamp_min")) o.clamp_min(*clamp_min);
  o.chunk_size(r.integer("chunk_size", o.chunk_size()));
  o.tie_gate_pairs(r.boolean("tie_gate_pairs", o.tie_gate_pairs()));
  o.impl(impl_from(op, r.string("impl", "chunk")));
  o.fused_rotation(r.boolean("fused_rotation", o.fused_rotation()));
  o.rotary_layout(layout_from(op, r.string("rotary_layout", "half_split")));
  r.finish();
  const auto D = static_cast<double>(c.hidden_size), key_dim = D * o.expand_k(),
             value_dim = D * o.expand_v();
  check_weights(op, "expand_k", D, key_dim);
  check_weights(op, "expand_v", D, value_dim);
  check_weights(op, "gate_low_rank_dim", D + key_dim, static_cast<double>(o.gate_low_rank_dim()));
  if (o.use_short_conv())
    check_weights(op, "conv_size", key_dim + value_dim, static_cast<double>(o.conv_size()));
  o.norm_eps(c.norm_eps).pos_encoding(pe.kind).rope_theta(pe.rope_theta);
  o.selective_rope(pe.selective_rope);
  o.rotation(pe.rotation);
  return wrap(build_layer(op, [&] { return nn::GatedLinearAttention(o); }));
}

Mixer gated_deltanet_mixer(const ModelConfig& c, const PositionEncoding& pe) {
  const std::string op = "mixer 'gated_deltanet'";
  require_no_additive_bias(op, pe);
  OptionReader r(c.mixer_options, op);
  const std::int64_t head_dim =
      r.integer("head_dim", c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  auto o = nn::GatedDeltaNetOptions(c.hidden_size, c.num_heads, head_dim);
  if (const auto num_v_heads = r.optional_integer("num_v_heads")) o.num_v_heads(*num_v_heads);
  o.expand_v(r.number("expand_v", o.expand_v()));
  o.use_short_conv(r.boolean("use_short_conv", o.use_short_conv()));
  o.conv_size(r.integer("conv_size", o.conv_size()));
  o.use_gate(r.boolean("use_gate", o.use_gate()));
  o.chunk_size(r.integer("chunk_size", o.chunk_size()));
  o.impl(impl_from(op, r.string("impl", "chunk")));
  o.fused_rotation(r.boolean("fused_rotation", o.fused_rotation()));
  o.rotary_layout(layout_from(op, r.string("rotary_layout", "half_split")));
  r.finish();
  const auto D = static_cast<double>(c.hidden_size),
             key_dim = static_cast<double>(c.num_heads) * static_cast<double>(head_dim),
             value_dim = static_cast<double>(o.num_v_heads().value_or(c.num_heads)) *
                         static_cast<double>(head_dim) * o.expand_v();
  check_weights(op, "head_dim", D, key_dim);
  check_weights(op, "num_v_heads", D, value_dim);
  if (o.use_short_conv())
    check_weights(op, "conv_size", 2 * key_dim + value_dim, static_cast<double>(o.conv_size()));
  // β = σ(·) ∈ (0, 1), or 2σ(·) ∈ (0, 2) (allow_neg_eigval: the transition I − βkkᵀ may then
  // have the negative eigenvalue 1 − β, which state tracking needs; Grazzi et al. 2024).
  o.allow_neg_eigval(c.beta_range == 2);
  o.norm_eps(c.norm_eps).pos_encoding(pe.kind).rope_theta(pe.rope_theta);
  o.selective_rope(pe.selective_rope);
  o.rotation(pe.rotation);
  return wrap(build_layer(op, [&] { return nn::GatedDeltaNet(o); }));
}

Mixer attention_mixer(const ModelConfig& c, const PositionEncoding& pe, bool forget_gate) {
  const std::string op = forget_gate ? "mixer 'fox'" : "mixer 'attention'";
  OptionReader r(c.mixer_options, op);
  auto o = nn::ForgettingAttentionOptions(c.hidden_size, c.num_heads);
  if (const auto num_kv_heads = r.optional_integer("num_kv_heads")) o.num_kv_heads(*num_kv_heads);
  o.qk_norm(r.boolean("qk_norm", o.qk_norm()));
  o.qkv_bias(r.boolean("qkv_bias", o.qkv_bias()));
  if (const auto window_size = r.optional_integer("window_size")) o.window_size(*window_size);
  o.use_output_gate(r.boolean("use_output_gate", o.use_output_gate()));
  o.use_output_norm(r.boolean("use_output_norm", o.use_output_norm()));
  o.block_size(r.integer("block_size", o.block_size()));
  o.fused_rotation(r.boolean("fused_rotation", o.fused_rotation()));
  o.rotary_layout(layout_from(op, r.string("rotary_layout", "half_split")));
  r.finish();
  o.use_forget_gate(forget_gate);
  o.norm_eps(c.norm_eps).pos_encoding(pe.kind).rope_theta(pe.rope_theta);
  o.selective_rope(pe.selective_rope);
  o.additive_bias(pe.additive_bias);
  o.rotation(pe.rotation);
  return wrap(build_layer(op, [&] { return nn::ForgettingAttention(o); }));
}

Mixer performer_mixer(const ModelConfig& c, const PositionEncoding& pe) {
  const std::string op = "mixer 'performer'";
  require_no_additive_bias(op, pe);
  OptionReader r(c.mixer_options, op);
  auto o = nn::PerformerAttentionOptions(c.hidden_size, c.num_heads);
  o.num_features(r.integer("num_features", o.num_features()));
  o.feature_kind(feature_kind_from(op, r.string("feature_kind", "orthogonal_chi")));
  if (const auto seed = r.optional_integer("seed")) {
    if (*seed < 0) fail(op, "seed", "an integer ≥ 0", std::to_string(*seed));
    o.seed(static_cast<std::uint64_t>(*seed));
  } else {
    // From torch's generator: reproducible under torch::manual_seed, different in every layer.
    o.seed(static_cast<std::uint64_t>(
        torch::randint(0, std::int64_t{1} << 62, {1}, torch::kLong).item<std::int64_t>()));
  }
  o.per_head_features(r.boolean("per_head_features", o.per_head_features()));
  o.qkv_bias(r.boolean("qkv_bias", o.qkv_bias()));
  o.chunk_size(r.integer("chunk_size", o.chunk_size()));
  o.rotary_layout(layout_from(op, r.string("rotary_layout", "half_split")));
  r.finish();
  // The random features: num_features × head_dim per head (H·head_dim = hidden_size).
  check_weights(op, "num_features", static_cast<double>(c.hidden_size),
                static_cast<double>(o.num_features()));
  o.causal(true).pos_encoding(pe.kind).rope_theta(pe.rope_theta);
  o.selective_rope(pe.selective_rope);
  return wrap(build_layer(op, [&] { return nn::PerformerAttention(o); }));
}

// The registries, created with the built-ins on first use (no static-initialisation order issue
// in a static library), guarded by one mutex.
struct Registry {
  std::mutex mutex;
  std::map<std::string, MixerFactory> mixers;
  std::map<std::string, PositionEncodingFactory> positions;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    reg->mixers["gla"] = gla_mixer;
    reg->mixers["gated_deltanet"] = gated_deltanet_mixer;
    reg->mixers["fox"] = [](const ModelConfig& c, const PositionEncoding& pe) {
      return attention_mixer(c, pe, true);
    };
    reg->mixers["attention"] = [](const ModelConfig& c, const PositionEncoding& pe) {
      return attention_mixer(c, pe, false);
    };
    reg->positions["none"] = no_position;
    reg->positions["rope"] = rope_position;
    reg->positions["selective_rope"] = selective_rope_position;
    reg->mixers["performer"] = performer_mixer;
    reg->positions["alibi"] = [](const ModelConfig& c) {
      return additive_position(c, "alibi", nn::AdditiveBias::alibi);
    };
    reg->positions["grape_a"] = [](const ModelConfig& c) {
      return additive_position(c, "grape_a", nn::AdditiveBias::grape_a);
    };
    reg->positions["string_cayley"] = [](const ModelConfig& c) {
      return rotation_position(c, "string_cayley", nn::PosEncoding::string_cayley);
    };
    reg->positions["string_circulant"] = [](const ModelConfig& c) {
      return rotation_position(c, "string_circulant", nn::PosEncoding::string_circulant);
    };
    reg->positions["grape"] = [](const ModelConfig& c) {
      return rotation_position(c, "grape", nn::PosEncoding::grape);
    };
    return reg;
  }();
  return *r;
}

template <class Map>
std::vector<std::string> keys_of(const Map& m) {
  std::vector<std::string> out;
  for (const auto& kv : m) out.push_back(kv.first);
  return out;
}

// ---- JSON field access with phasor errors
// --------------------------------------------------------

std::string type_name(const nlohmann::json& v) {
  return std::string(v.type_name()) + " " + v.dump();
}

}  // namespace

// ---- OptionReader -------------------------------------------------------------------------------

OptionReader::OptionReader(const nlohmann::json& options, std::string op)
    : options_(options), op_(std::move(op)) {
  if (!options_.is_null() && !options_.is_object())
    fail(op_, "options", "a JSON object", type_name(options_));
}

bool OptionReader::has(const std::string& key) const {
  return options_.is_object() && options_.contains(key);
}

const nlohmann::json* OptionReader::find(const std::string& key, const char* type) {
  known_.insert(key);
  if (!has(key)) return nullptr;
  used_.insert(key);
  const nlohmann::json& v = options_.at(key);
  const std::string t = type;
  const bool ok = (t == "a number" && v.is_number()) ||
                  (t == "an integer" && v.is_number_integer()) ||
                  (t == "a boolean" && v.is_boolean()) || (t == "a string" && v.is_string());
  if (!ok) fail(op_, key, type, type_name(v));
  return &v;
}

double OptionReader::number(const std::string& key, double fallback) {
  const auto* v = find(key, "a number");
  return v ? v->get<double>() : fallback;
}
std::int64_t OptionReader::integer(const std::string& key, std::int64_t fallback) {
  const auto* v = find(key, "an integer");
  return v ? v->get<std::int64_t>() : fallback;
}
std::optional<double> OptionReader::optional_number(const std::string& key) {
  const auto* v = find(key, "a number");
  return v ? std::optional<double>(v->get<double>()) : std::nullopt;
}
std::optional<std::int64_t> OptionReader::optional_integer(const std::string& key) {
  const auto* v = find(key, "an integer");
  return v ? std::optional<std::int64_t>(v->get<std::int64_t>()) : std::nullopt;
}
bool OptionReader::boolean(const std::string& key, bool fallback) {
  const auto* v = find(key, "a boolean");
  return v ? v->get<bool>() : fallback;
}
std::string OptionReader::string(const std::string& key, const std::string& fallback) {
  const auto* v = find(key, "a string");
  return v ? v->get<std::string>() : fallback;
}

void OptionReader::finish() const {
  if (!options_.is_object()) return;
  for (const auto& kv : options_.items())
    if (!used_.count(kv.key())) {
      // Every key the factory asked for, so a typo is answered with the valid spellings.
      std::string names;
      for (const auto& k : known_) names += (names.empty() ? "" : ", ") + k;
      fail(op_, kv.key(),
           known_.empty() ? std::string("no options (this one takes none)")
                          : "one of the options " + names,
           "an unknown key");
    }
}

// ---- configs ------------------------------------------------------------------------------------

void to_json(nlohmann::json& j, const ModelConfig& c) {
  j = nlohmann::json{{"vocab_size", c.vocab_size},
                     {"hidden_size", c.hidden_size},
                     {"num_layers", c.num_layers},
                     {"num_heads", c.num_heads},
                     {"mixer", c.mixer},
                     {"pos_encoding", c.pos_encoding},
                     {"beta_range", c.beta_range},
                     {"mlp", c.mlp},
                     {"mlp_activation", c.mlp_activation},
                     {"mlp_expansion", c.mlp_expansion},
                     {"norm_eps", c.norm_eps},
                     {"init_std", c.init_std},
                     {"dtype", c.dtype},
                     {"mixer_options", c.mixer_options},
                     {"pos_options", c.pos_options}};
}

void from_json(const nlohmann::json& j, ModelConfig& c) {
  const std::string op = "ModelConfig";
  if (!j.is_object()) fail(op, "config", "a JSON object", type_name(j));
  // The two layer-option objects are passed on as they are (their factories check them); every
  // other key goes through an OptionReader, which rejects unknown keys.
  nlohmann::json plain = j;
  ModelConfig out;
  for (const char* key : {"mixer_options", "pos_options"}) {
    if (!j.contains(key)) continue;
    const auto& v = j.at(key);
    if (!v.is_object()) fail(op, key, "a JSON object", type_name(v));
    (std::string(key) == "mixer_options" ? out.mixer_options : out.pos_options) = v;
    plain.erase(key);
  }
  OptionReader r(plain, op);
  out.vocab_size = r.integer("vocab_size", out.vocab_size);
  out.hidden_size = r.integer("hidden_size", out.hidden_size);
  out.num_layers = r.integer("num_layers", out.num_layers);
  out.num_heads = r.integer("num_heads", out.num_heads);
  out.mixer = r.string("mixer", out.mixer);
  out.pos_encoding = r.string("pos_encoding", out.pos_encoding);
  const std::int64_t beta_range = r.integer("beta_range", out.beta_range);
  if (beta_range != 1 && beta_range != 2)  // before narrowing: 2^32 + 1 must not pass as 1
    fail(op, "beta_range", "1 (β ∈ (0, 1)) or 2 (β ∈ (0, 2))", std::to_string(beta_range));
  out.beta_range = static_cast<int>(beta_range);
  out.mlp = r.boolean("mlp", out.mlp);
  out.mlp_activation = r.string("mlp_activation", out.mlp_activation);
  out.mlp_expansion = r.integer("mlp_expansion", out.mlp_expansion);
  out.norm_eps = r.number("norm_eps", out.norm_eps);
  out.init_std = r.number("init_std", out.init_std);
  out.dtype = r.string("dtype", out.dtype);
  r.finish();
  validate(out);
  c = std::move(out);
}

void validate(const ModelConfig& c) {
  const std::string op = "ModelConfig";
  auto positive = [&](const char* name, std::int64_t v) {
    if (v <= 0) fail(op, name, "a positive integer", std::to_string(v));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_layers", c.num_layers);
  positive("num_heads", c.num_heads);
  if (c.hidden_size % c.num_heads != 0)
    fail(op, "hidden_size", "a multiple of num_heads = " + std::to_string(c.num_heads),
         std::to_string(c.hidden_size));
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    if (!reg.mixers.count(c.mixer))
      fail(op, "mixer", "one of " + join(keys_of(reg.mixers)), quoted(c.mixer));
    if (!reg.positions.count(c.pos_encoding))
      fail(op, "pos_encoding", "one of " + join(keys_of(reg.positions)), quoted(c.pos_encoding));
  }
  if (c.beta_range != 1 && c.beta_range != 2)
    fail(op, "beta_range", "1 (β ∈ (0, 1)) or 2 (β ∈ (0, 2))", std::to_string(c.beta_range));
  if (c.mlp_activation != "swiglu" && c.mlp_activation != "gelu")
    fail(op, "mlp_activation", "'swiglu' or 'gelu'", quoted(c.mlp_activation));
  if (c.mlp) positive("mlp_expansion", c.mlp_expansion);
  auto at_most = [&](const char* name, std::int64_t v, std::int64_t limit, const char* limit_text) {
    if (v > limit) fail(op, name, std::string("at most ") + limit_text, std::to_string(v));
  };
  at_most("vocab_size", c.vocab_size, kMaxVocabSize, "2^24");
  at_most("hidden_size", c.hidden_size, kMaxHiddenSize, "2^16");
  at_most("num_layers", c.num_layers, kMaxLayers, "1024");
  if (c.mlp) at_most("mlp_expansion", c.mlp_expansion, kMaxMlpExpansion, "64");
  // Each factor is bounded above, so these products fit in int64.
  const std::int64_t D = c.hidden_size,
                     mlp = c.mlp ? (c.mlp_activation == "swiglu" ? 3 : 2) * c.mlp_expansion * D * D
                                 : 0,
                     parameters = 2 * c.vocab_size * D + c.num_layers * (mlp + 4 * D * D);
  if (parameters > kMaxModelParameters)
    fail(op, "config",
         "at most 2^27 parameters in the embedding, head, MLP and mixer projections "
         "(2·vocab_size·hidden_size + num_layers·(MLP + 4·hidden_size²))",
         std::to_string(parameters) + " (vocab_size " + std::to_string(c.vocab_size) +
             ", hidden_size " + std::to_string(D) + ", num_layers " + std::to_string(c.num_layers) +
             ")");
  if (!(c.norm_eps > 0.0) || !std::isfinite(c.norm_eps))
    fail(op, "norm_eps", "a positive finite number", std::to_string(c.norm_eps));
  if (!(c.init_std > 0.0) || !std::isfinite(c.init_std))
    fail(op, "init_std", "a positive finite number", std::to_string(c.init_std));
  if (c.dtype != "float32" && c.dtype != "float64")
    fail(op, "dtype", "'float32' or 'float64'", quoted(c.dtype));
  if (!c.mixer_options.is_object())
    fail(op, "mixer_options", "a JSON object", type_name(c.mixer_options));
  if (!c.pos_options.is_object())
    fail(op, "pos_options", "a JSON object", type_name(c.pos_options));
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("read_json_file", "path", "a readable JSON file", quoted(path) + " (cannot open)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_json_text(buffer.str(), path);
}

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  const auto not_too_deep = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth)
      fail("read_json_file", "path",
           "JSON nested at most " + std::to_string(kMaxJsonDepth) + " levels deep",
           quoted(source) + " (deeper)");
    return true;
  };
  try {
    return nlohmann::json::parse(text, not_too_deep);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e99999
    fail("read_json_file", "path", "a valid JSON file",
         quoted(source) + " (" + std::string(e.what()) + ")");
  }
}

// ---- registries ---------------------------------------------------------------------------------

void register_mixer(const std::string& name, MixerFactory factory) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (name.empty() || reg.mixers.count(name) || !factory)
    fail("register_mixer", "name", "a new, non-empty name and a factory", quoted(name));
  reg.mixers[name] = std::move(factory);
}

void register_position_encoding(const std::string& name, PositionEncodingFactory factory) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (name.empty() || reg.positions.count(name) || !factory)
    fail("register_position_encoding", "name", "a new, non-empty name and a factory", quoted(name));
  reg.positions[name] = std::move(factory);
}

std::vector<std::string> mixer_names() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return keys_of(reg.mixers);
}

std::vector<std::string> position_encoding_names() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return keys_of(reg.positions);
}

// ---- the model ----------------------------------------------------------------------------------

namespace detail {

// One pre-norm block: x + mixer(RMSNorm(x)), then x + MLP(RMSNorm(x)) when the MLP is on.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& c, const PositionEncoding& pe, const MixerFactory& factory)
      : eps_(c.norm_eps), swiglu_(c.mlp_activation == "swiglu") {
    const std::int64_t D = c.hidden_size;
    mixer_norm = register_parameter("mixer_norm_weight", torch::ones({D}));
    Mixer m = factory(c, pe);
    if (!m.module || !m.forward)
      fail("LanguageModel", "mixer", "a factory returning a module and a forward",
           quoted(c.mixer) + " returned an empty Mixer");
    mixer_forward_ = std::move(m.forward);
    register_module("mixer", m.module);
    if (c.mlp) {
      const std::int64_t F = c.mlp_expansion * D;
      mlp_norm = register_parameter("mlp_norm_weight", torch::ones({D}));
      auto linear = [](std::int64_t in, std::int64_t out) {
        return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
      };
      w1 = register_module("w1", linear(D, F));
      if (swiglu_) w3 = register_module("w3", linear(D, F));
      w2 = register_module("w2", linear(F, D));
    }
  }

  at::Tensor forward(at::Tensor x) {
    x = x + mixer_forward_(mixer_input(x));
    if (w1) {
      const at::Tensor h = nn::rms_norm(x, mlp_norm, eps_);
      const at::Tensor a =
          swiglu_ ? at::silu(w1->forward(h)) * w3->forward(h) : at::gelu(w1->forward(h));
      x = x + w2->forward(a);
    }
    return x;
  }

  // The mixer's input: x after the block's RMSNorm (LanguageModelImpl::mixer_inputs).
  at::Tensor mixer_input(const at::Tensor& x) const { return nn::rms_norm(x, mixer_norm, eps_); }

  at::Tensor mixer_norm, mlp_norm;
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};

 private:
  double eps_;
  bool swiglu_;
  std::function<at::Tensor(const at::Tensor&)> mixer_forward_;
};

}  // namespace detail

LanguageModelImpl::LanguageModelImpl(ModelConfig config) : config_(std::move(config)) {
  validate(config_);
  const auto& c = config_;
  MixerFactory mixer;
  PositionEncodingFactory position;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    mixer = reg.mixers.at(c.mixer);
    position = reg.positions.at(c.pos_encoding);
  }
  const PositionEncoding pe = position(c);
  const std::int64_t V = c.vocab_size, D = c.hidden_size;
  // Parameters are drawn in a fixed order (embedding, blocks, head) from torch's generator.
  embedding = register_parameter("embedding", torch::randn({V, D}) * c.init_std);
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    auto block = std::make_shared<detail::BlockImpl>(c, pe, mixer);
    blocks.push_back(register_module("block" + std::to_string(l), block));
  }
  norm_weight = register_parameter("norm_weight", torch::ones({D}));
  head_weight = register_parameter("head_weight", torch::randn({V, D}) * c.init_std);
  if (c.dtype == "float64") to(at::kDouble);
}

at::Tensor LanguageModelImpl::forward(const at::Tensor& tokens) {
  return logits(hidden(tokens));
}

at::Tensor LanguageModelImpl::logits(const at::Tensor& hidden) {
  return at::linear(nn::rms_norm(hidden, norm_weight, config_.norm_eps), head_weight);
}

void LanguageModelImpl::check_tokens(const at::Tensor& tokens) const {
  const std::string op = "LanguageModel";
  if (!tokens.defined()) fail(op, "tokens", "an int64 tensor [B, T]", "an undefined tensor");
  std::ostringstream shape;
  shape << tokens.sizes();
  if (tokens.dim() != 2 || tokens.size(1) < 1 || tokens.size(0) < 1)
    fail(op, "tokens", "shape [B ≥ 1, T ≥ 1]", shape.str());
  if (tokens.scalar_type() != at::kLong)
    fail(op, "tokens", "dtype int64", std::string(c10::toString(tokens.scalar_type())));
  if (!tokens.device().is_cpu()) fail(op, "tokens", "a CPU tensor", tokens.device().str());
  const std::int64_t lo = tokens.min().item<std::int64_t>(), hi = tokens.max().item<std::int64_t>();
  if (lo < 0 || hi >= config_.vocab_size)
    fail(op, "tokens", "ids in [0, " + std::to_string(config_.vocab_size) + ")",
         "ids in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

at::Tensor LanguageModelImpl::hidden(const at::Tensor& tokens) {
  check_tokens(tokens);
  at::Tensor x = at::embedding(embedding, tokens);
  for (auto& block : blocks) x = block->forward(x);
  return x;
}

std::vector<at::Tensor> LanguageModelImpl::mixer_inputs(const at::Tensor& tokens) {
  check_tokens(tokens);
  std::vector<at::Tensor> inputs;
  at::Tensor x = at::embedding(embedding, tokens);
  for (auto& block : blocks) {
    inputs.push_back(block->mixer_input(x));
    x = block->forward(x);
  }
  return inputs;
}

std::vector<nn::SelectiveRoPE> LanguageModelImpl::selective_ropes(std::int64_t layer) {
  if (layer < 0 || layer >= static_cast<std::int64_t>(blocks.size()))
    fail("LanguageModel", "layer", "a layer in [0, " + std::to_string(blocks.size()) + ")",
         std::to_string(layer));
  std::vector<nn::SelectiveRoPE> ropes;
  for (const auto& m : blocks[static_cast<std::size_t>(layer)]->modules(/*include_self=*/false))
    if (auto rope = std::dynamic_pointer_cast<nn::SelectiveRoPEImpl>(m))
      ropes.emplace_back(std::move(rope));
  return ropes;
}

std::int64_t LanguageModelImpl::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace phasor::tasks
