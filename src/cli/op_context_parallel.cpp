// `phasor op ... --context-parallel N` on one rank (src/cli/op_context_parallel.h).
#include "cli/op_context_parallel.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "phasor/context_parallel.h"

namespace phasor::cli {
namespace {

// The inputs laid out along tokens ([B, T, ...], T at dimension 1) and the outputs that are.
const std::set<std::string> kPerTokenInputs = {"q", "k", "v", "g", "beta", "theta", "do"};
const std::set<std::string> kWholeOutputs = {"final_state", "dh0"};

// The forward pass of the context-parallel op on this rank's slices.
OpForward context_parallel_forward(const distributed::ProcessGroupPtr& group) {
  return [group](Op op, const OpSettings& settings,
                 const NamedTensors& in) -> std::tuple<at::Tensor, c10::optional<at::Tensor>> {
    auto optional = [&](const std::string& key) -> c10::optional<at::Tensor> {
      auto it = in.find(key);
      if (it == in.end()) return c10::nullopt;
      return it->second;
    };
    switch (op) {
      case Op::gla:
        return cp::gla(in.at("q"), in.at("k"), in.at("v"), in.at("g"), settings.impl,
                       settings.scale, optional("initial_state"), settings.output_final_state,
                       optional("cu_seqlens"), settings.chunk_size, optional("theta"),
                       settings.rotary_layout, group);
      case Op::gated_delta_rule:
        return cp::gated_delta_rule(in.at("q"), in.at("k"), in.at("v"), in.at("g"), in.at("beta"),
                                    settings.impl, settings.scale, optional("initial_state"),
                                    settings.output_final_state, optional("cu_seqlens"),
                                    settings.use_qk_l2norm, settings.chunk_size, optional("theta"),
                                    settings.rotary_layout, group);
      case Op::forgetting_attn:
        return {cp::forgetting_attn(in.at("q"), in.at("k"), in.at("v"), in.at("g"), settings.impl,
                                    settings.scale, settings.window_size, optional("cu_seqlens"),
                                    settings.chunk_size, optional("theta"), settings.rotary_layout,
                                    c10::nullopt, c10::nullopt, group),
                c10::nullopt};
      default:
        throw InputError(std::string("argument 'NAME': '") + op_info(op).name +
                         "' has no context-parallel form");
    }
  };
}

// The whole tensor along T from every rank's slice (slices in rank order; lengths may differ:
// each is padded to the longest for Gloo's allgather, which needs equal shapes).
at::Tensor gather_tokens(const at::Tensor& slice, const std::vector<std::int64_t>& lengths,
                         const distributed::ProcessGroupPtr& group) {
  const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<int64_t> padded_shape = slice.sizes().vec();
  padded_shape[1] = longest;
  at::Tensor padded = at::zeros(padded_shape, slice.options());
  padded.narrow(1, 0, slice.size(1)).copy_(slice);
  std::vector<at::Tensor> input{padded};
  std::vector<std::vector<at::Tensor>> output(1);
  for (std::size_t r = 0; r < lengths.size(); ++r) output[0].push_back(at::empty_like(padded));
  group->allgather(output, input)->wait();
  std::vector<at::Tensor> pieces;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    pieces.push_back(output[0][r].narrow(1, 0, lengths[r]));
  }
  return at::cat(pieces, 1);
}

}  // namespace

std::pair<std::int64_t, std::int64_t> token_slice(std::int64_t num_tokens, int rank,
                                                  int world_size) {
  return {num_tokens * rank / world_size, num_tokens * (rank + 1) / world_size};
}

std::vector<std::pair<std::string, at::Tensor>> run_context_parallel(
    Op op, const OpSettings& settings, NamedTensors in, const std::string& source,
    const distributed::ProcessGroupPtr& group) {
  const int rank = group->getRank(), world_size = group->getSize();
  const auto q = in.find("q");
  if (q == in.end() || q->second.dim() < 2)
    throw InputError("argument 'q': expected a tensor [B, T, H, K] in '" + source + "', got " +
                     (q == in.end() ? std::string("none") : shape_of(q->second)));
  const std::int64_t num_tokens = q->second.size(1);
  for (const auto& [key, tensor] : in) {
    if (!kPerTokenInputs.count(key)) continue;
    if (tensor.dim() < 2 || tensor.size(1) != num_tokens)
      throw InputError("argument '" + key + "': expected T = " + std::to_string(num_tokens) +
                       " tokens at dimension 1 (that of q, split across the ranks), got shape " +
                       shape_of(tensor));
  }
  std::vector<std::int64_t> lengths;
  for (int r = 0; r < world_size; ++r) {
    const auto [begin, end] = token_slice(num_tokens, r, world_size);
    lengths.push_back(end - begin);
  }
  const auto [begin, end] = token_slice(num_tokens, rank, world_size);
  for (auto& [key, tensor] : in) {
    if (kPerTokenInputs.count(key)) tensor = tensor.narrow(1, begin, end - begin).contiguous();
  }
  auto outputs =
      run_on_inputs(op, settings, std::move(in), source, context_parallel_forward(group));
  for (auto& [name, tensor] : outputs) {
    if (!kWholeOutputs.count(name)) tensor = gather_tokens(tensor.detach(), lengths, group);
  }
  return outputs;
}

}  // namespace phasor::cli
