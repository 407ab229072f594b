// The inputs of `phasor op` and the op's run on them, apart from the files: the dict of named
// tensors parsed from the bytes of a torch.save file, the checks of its keys for the op, and the
// forward (and, with `do`, backward) pass through the LibTorch layer. src/cli/op_command.cpp reads
// the file and writes the results; tests/fuzz/op_inputs_fuzz.cpp feeds it arbitrary bytes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/input_error.h"
#include "phasor/common.h"
#include "phasor/ops.h"

namespace phasor::cli {

// The ops `phasor op` runs (gla, gated_delta_rule, forgetting_attn).
bool runs(Op op);
// Their accepted names: all of them, or only those that imply the implementation (chunk_gla, …).
std::string joined_op_names(bool implementation_names_only = false);
// The keys `op` reads from the input dict. `do`/`dht` request the backward pass.
std::set<std::string> allowed_keys(Op op);

using NamedTensors = std::map<std::string, at::Tensor>;

// A tensor's shape as messages print it, e.g. "[1, 10, 4, 32]".
std::string shape_of(const at::Tensor& t);

// The dict of named tensors in `bytes`, a file written by Python's torch.save (zip format, the
// default since torch 1.6; read by cli/pt_file.h, not by LibTorch's unsafe pickle_load) called
// `source` in messages: string keys allowed for `op`, tensor values, each with at most as many
// elements as the file has bytes (an expanded tensor claiming 10^12 elements over a few bytes of
// storage is refused before anything computes on it). Anything else — not a torch.save file, not
// a dict, other keys or values — raises InputError naming '--in' or the key.
NamedTensors read_inputs(const std::vector<char>& bytes, Op op, const std::string& source);

// How `phasor op` runs the op (its command-line options).
struct OpSettings {
  Impl impl = Impl::chunk;
  c10::optional<double> scale;
  std::int64_t chunk_size = 64;
  c10::optional<std::int64_t> window_size;  // forgetting_attn only
  bool output_final_state = false;          // gla, gated_delta_rule
  bool use_qk_l2norm = false;               // gated_delta_rule
  RotaryLayout rotary_layout = RotaryLayout::half_split;
};

// The forward pass of `op` on the tensors of `in` (already marked as requiring grad when the
// backward pass follows): (o, final_state), final_state present iff settings.output_final_state.
// forward_on_one_process calls the LibTorch layer (phasor/torch.h); `phasor op
// --context-parallel` gives the context-parallel ops (phasor/context_parallel.h) on each rank's
// slice.
using OpForward = std::function<std::tuple<at::Tensor, c10::optional<at::Tensor>>(
    Op op, const OpSettings& settings, const NamedTensors& in)>;
std::tuple<at::Tensor, c10::optional<at::Tensor>> forward_on_one_process(Op op,
                                                                         const OpSettings& settings,
                                                                         const NamedTensors& in);

// Runs `op` on `in` (from read_inputs of `source`): the forward pass (`forward`, by default
// forward_on_one_process), and with `do` (and `dht`) the backward pass through autograd. Returns o,
// final_state (with output_final_state) and the gradients ("d" + the input's name; initial_state →
// dh0) in that order. Missing or inconsistent keys raise InputError; the ops' own argument checks
// raise c10::Error (or phasor::Error).
std::vector<std::pair<std::string, at::Tensor>> run_on_inputs(Op op, const OpSettings& settings,
                                                              NamedTensors in,
                                                              const std::string& source,
                                                              const OpForward& forward = {});

}  // namespace phasor::cli
