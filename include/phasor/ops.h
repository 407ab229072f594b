// phasor — the table of ops: their names, the names of their implementations (fla's where fla
// has one), and which implementations run on the GPU. One table, read by the core's error
// messages, the LibTorch layer and the `phasor op` command, so a name is spelled in one place.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "phasor/common.h"

namespace phasor {

enum class Op : std::uint8_t {
  gla,                    // phasor/gla.h
  gated_delta_rule,       // phasor/gated_delta_rule.h
  forgetting_attn,        // phasor/forgetting_attn.h
  short_conv,             // phasor/short_conv.h
  selective_rope_phases,  // phasor/rotary.h
  rope_angles,            // phasor/rotary.h
  apply_rotary,           // phasor/rotary.h
  nd_rope_angles,         // phasor/string_rotation.h
  cayley_string,          // phasor/string_rotation.h
  circulant_string,       // phasor/string_rotation.h
  grape,                  // phasor/grape.h
  grape_subspace,         // phasor/grape.h
  structured_rotation,    // phasor/structured_rotation.h
  favor_features,         // phasor/favor.h
  favor_attention,        // phasor/favor.h
};
constexpr std::size_t kNumOps = 15;

struct OpInfo {
  Op op;
  const char* name;  // the op's own name, e.g. "gla"
  // The name of each implementation, indexed by Impl (reference, recurrent, chunk): the name
  // errors report and `phasor op` accepts, e.g. "gla_reference", "fused_recurrent_gla",
  // "chunk_gla". Ops with one optimized kernel give recurrent and chunk the same name.
  std::array<const char*, 3> impl_names;
  // Which implementations run on Device::cuda and Device::emulated (the CUDA kernels), by Impl.
  // The float64 reference runs on the cpu only.
  std::array<bool, 3> on_gpu;
};

// Every op, in the order of Op.
const std::array<OpInfo, kNumOps>& all_ops();
const OpInfo& op_info(Op op);
// The name of an implementation, as errors report it.
const char* op_name(Op op, Impl impl);

// A name as a user gives it: an op's own name (no implementation implied) or the name of one of
// its implementations (which implies it; e.g. "chunk_gla" → gla, Impl::chunk). Names shared by
// two implementations ("selective_rope_phases" for recurrent and chunk) imply none.
struct OpLookup {
  Op op;
  std::optional<Impl> impl;
};
std::optional<OpLookup> find_op(const std::string& name);

}  // namespace phasor
