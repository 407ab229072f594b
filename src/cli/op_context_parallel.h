// `phasor op NAME ... --context-parallel N`: the op split across the ranks of a process group,
// each rank holding a contiguous slice of the tokens (phasor/context_parallel.h), with the
// outputs and gradients gathered back into whole tensors — the same results as the
// single-process run, so any .pt case can be checked both ways.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/op_inputs.h"
#include "phasor/distributed.h"

namespace phasor::cli {

// The token range [begin, end) of `rank` among `world_size` ranks for T tokens: contiguous
// slices whose lengths differ by at most one, in rank order.
std::pair<std::int64_t, std::int64_t> token_slice(std::int64_t num_tokens, int rank,
                                                  int world_size);

// On every rank of `group`: slices the per-token tensors of `in` (q, k, v, g, beta, theta and the
// incoming gradient do, along T) to this rank's range, runs the context-parallel op on them (with
// the backward pass when `do` is given, as run_on_inputs) and returns the whole outputs — o and
// the per-token gradients gathered from every rank; final_state and dh0, which every rank holds
// whole — in run_on_inputs' order. Collective: every rank of the group must call it.
std::vector<std::pair<std::string, at::Tensor>> run_context_parallel(
    Op op, const OpSettings& settings, NamedTensors in, const std::string& source,
    const distributed::ProcessGroupPtr& group);

}  // namespace phasor::cli
