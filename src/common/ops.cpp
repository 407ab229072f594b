// The table of ops (include/phasor/ops.h).
#include "phasor/ops.h"

#include <cstring>

namespace phasor {
namespace {

// Ops whose optimized kernel has no fla name: "<op>_reference" for the reference, "<op>" for
// recurrent and chunk, which select the same kernel.
constexpr OpInfo plain(Op op, const char* name, const char* reference_name, bool on_gpu = false) {
  return {op, name, {reference_name, name, name}, {false, on_gpu, on_gpu}};
}

constexpr std::array<OpInfo, kNumOps> kOps = {{
    {Op::gla, "gla", {"gla_reference", "fused_recurrent_gla", "chunk_gla"}, {false, true, true}},
    {Op::gated_delta_rule,
     "gated_delta_rule",
     {"gated_delta_rule_reference", "fused_recurrent_gated_delta_rule", "chunk_gated_delta_rule"},
     {false, true, true}},
    {Op::forgetting_attn,
     "forgetting_attn",
     {"forgetting_attn_reference", "forgetting_attn_recurrent", "parallel_forgetting_attn"},
     {false, false, true}},
    {Op::short_conv,
     "short_conv",
     {"short_conv_reference", "causal_conv1d_update", "causal_conv1d"},
     {false, true, true}},
    plain(Op::selective_rope_phases, "selective_rope_phases", "selective_rope_phases_reference",
          true),
    plain(Op::rope_angles, "rope_angles", "rope_angles_reference", true),
    plain(Op::apply_rotary, "apply_rotary", "apply_rotary_reference", true),
    plain(Op::nd_rope_angles, "nd_rope_angles", "nd_rope_angles_reference"),
    plain(Op::cayley_string, "cayley_string", "cayley_string_reference"),
    plain(Op::circulant_string, "circulant_string", "circulant_string_reference"),
    plain(Op::grape, "grape", "grape_reference"),
    plain(Op::grape_subspace, "grape_subspace", "grape_subspace_reference"),
    plain(Op::structured_rotation, "structured_rotation", "structured_rotation_reference"),
    plain(Op::favor_features, "favor_features", "favor_features_reference", true),
    plain(Op::favor_attention, "favor_attention", "favor_attention_reference", true),
}};

constexpr bool in_op_order() {
  for (std::size_t i = 0; i < kOps.size(); ++i)
    if (static_cast<std::size_t>(kOps[i].op) != i) return false;
  return true;
}
static_assert(in_op_order(), "kOps must list the ops in the order of enum Op");

}  // namespace

const std::array<OpInfo, kNumOps>& all_ops() {
  return kOps;
}

const OpInfo& op_info(Op op) {
  return kOps[static_cast<std::size_t>(op)];
}

const char* op_name(Op op, Impl impl) {
  return op_info(op).impl_names[static_cast<std::size_t>(impl)];
}

std::optional<OpLookup> find_op(const std::string& name) {
  for (const OpInfo& info : kOps) {
    if (name == info.name) return OpLookup{info.op, std::nullopt};
    int matches = 0;
    Impl implied = Impl::reference;
    for (std::size_t i = 0; i < info.impl_names.size(); ++i)
      if (name == info.impl_names[i]) {
        ++matches;
        implied = static_cast<Impl>(i);
      }
    if (matches == 1) return OpLookup{info.op, implied};
    if (matches > 1) return OpLookup{info.op, std::nullopt};
  }
  return std::nullopt;
}

}  // namespace phasor
