// The inputs of `phasor op` and the op's run on them (see cli/op_inputs.h).
#include "cli/op_inputs.h"

#include <torch/csrc/autograd/autograd.h>

#include <ATen/Functions.h>

#include <sstream>
#include <tuple>

#include "cli/pt_file.h"
#include "phasor/torch.h"

namespace phasor::cli {

bool runs(Op op) {
  return op == Op::gla || op == Op::gated_delta_rule || op == Op::forgetting_attn;
}

std::string joined_op_names(bool implementation_names_only) {
  std::string s;
  for (const OpInfo& info : all_ops()) {
    if (!runs(info.op)) continue;
    if (!implementation_names_only) s += (s.empty() ? "" : ", ") + std::string(info.name);
    for (const char* name : info.impl_names) s += (s.empty() ? "" : ", ") + std::string(name);
  }
  return s;
}

std::set<std::string> allowed_keys(Op op) {
  switch (op) {
    case Op::gla:
      return {"q", "k", "v", "g", "initial_state", "cu_seqlens", "theta", "do", "dht"};
    case Op::gated_delta_rule:
      return {"q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "theta", "do", "dht"};
    case Op::forgetting_attn:
      return {"q", "k", "v", "g", "cu_seqlens", "theta", "do"};
    default:  // not run by `phasor op` (runs() is false)
      return {};
  }
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

NamedTensors read_inputs(const std::vector<char>& bytes, Op op, const std::string& source) {
  PtValue value;
  try {
    value = read_pt_file(bytes);
  } catch (const c10::Error& e) {  // a view LibTorch refuses (as_strided)
    throw InputError("argument '--in': expected a file written by torch.save, got '" + source +
                     "', which cannot be read: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw InputError("argument '--in': expected a file written by torch.save, got '" + source +
                     "', which cannot be read: " + e.what());
  }
  if (value.kind != PtValue::Kind::dict)
    throw InputError("argument '--in': expected a dict of named tensors, got a " +
                     value.kind_name() + " in '" + source + "'");
  const std::set<std::string> allowed = allowed_keys(op);
  NamedTensors tensors;
  for (const auto& [key_value, entry] : value.entries) {
    if (key_value.kind != PtValue::Kind::string)
      throw InputError("argument '--in': expected string keys, got a key of type " +
                       key_value.kind_name());
    const std::string key = printable(key_value.string);  // as it appears in messages
    if (!allowed.count(key)) {
      std::string names;
      for (const auto& k : allowed) names += (names.empty() ? "" : ", ") + k;
      throw InputError("argument '" + key + "': expected one of the keys " + names +
                       ", got an unknown key '" + key + "' in '" + source + "'");
    }
    if (entry.kind != PtValue::Kind::tensor)
      throw InputError("argument '" + key + "': expected a tensor, got a " + entry.kind_name());
    const at::Tensor& tensor = entry.tensor;
    // A saved tensor may claim any shape over its storage (zero strides, as after expand()): one
    // with more elements than the file has bytes would make the op compute, and allocate its
    // outputs, at a size nothing in the file backs (10^12 elements from a few bytes).
    if (tensor.numel() > static_cast<std::int64_t>(bytes.size()))
      throw InputError("argument '" + key + "': expected a tensor whose elements are stored in '" +
                       source + "' (at most " + std::to_string(bytes.size()) +
                       " elements: its size in bytes; save expanded tensors with .contiguous()), "
                       "got shape " +
                       shape_of(tensor));
    tensors[key_value.string] = tensor;
  }
  return tensors;
}

std::tuple<at::Tensor, c10::optional<at::Tensor>> forward_on_one_process(Op op,
                                                                         const OpSettings& settings,
                                                                         const NamedTensors& in) {
  auto optional = [&](const std::string& key) -> c10::optional<at::Tensor> {
    auto it = in.find(key);
    if (it == in.end()) return c10::nullopt;
    return it->second;
  };
  at::Tensor o;
  c10::optional<at::Tensor> final_state;
  switch (op) {
    case Op::gla:
      std::tie(o, final_state) = phasor::gla(
          in.at("q"), in.at("k"), in.at("v"), in.at("g"), settings.impl, settings.scale,
          optional("initial_state"), settings.output_final_state, optional("cu_seqlens"),
          settings.chunk_size, optional("theta"), settings.rotary_layout);
      break;
    case Op::gated_delta_rule:
      std::tie(o, final_state) = phasor::gated_delta_rule(
          in.at("q"), in.at("k"), in.at("v"), in.at("g"), in.at("beta"), settings.impl,
          settings.scale, optional("initial_state"), settings.output_final_state,
          optional("cu_seqlens"), settings.use_qk_l2norm, settings.chunk_size, optional("theta"),
          settings.rotary_layout);
      break;
    case Op::forgetting_attn:
      o = phasor::forgetting_attn(in.at("q"), in.at("k"), in.at("v"), in.at("g"), settings.impl,
                                  settings.scale, settings.window_size, optional("cu_seqlens"),
                                  settings.chunk_size, optional("theta"), settings.rotary_layout);
      break;
    default:  // runs() admits only the ops above
      throw InputError(std::string("argument 'NAME': '") + op_info(op).name +
                       "' is not run by phasor op");
  }

  return {o, final_state};
}

std::vector<std::pair<std::string, at::Tensor>> run_on_inputs(Op op, const OpSettings& settings,
                                                              NamedTensors in,
                                                              const std::string& source,
                                                              const OpForward& forward) {
  auto required = [&](const std::string& key) -> at::Tensor& {
    auto it = in.find(key);
    if (it == in.end())
      throw InputError("argument '" + key + "': expected a tensor under key '" + key + "' in '" +
                       source + "', got none");
    return it->second;
  };
  // Differentiable inputs: with `do`, each floating one becomes a leaf that requires grad, and
  // its gradient is written as "d" + its name (initial_state → dh0).
  const bool backward = in.count("do") > 0;
  if (in.count("dht") && !backward)
    throw InputError(
        "argument 'dht': expected together with 'do' (the backward pass), got 'dht' "
        "alone");
  if (in.count("dht") && !settings.output_final_state)
    throw InputError(
        "argument 'dht': expected only with --output-final-state (it is the "
        "gradient of final_state), got it without");
  std::vector<std::pair<std::string, std::string>> differentiable = {
      {"q", "dq"}, {"k", "dk"}, {"v", "dv"}, {"g", "dg"}};
  if (op == Op::gated_delta_rule) differentiable.push_back({"beta", "dbeta"});
  if (op != Op::forgetting_attn) differentiable.push_back({"initial_state", "dh0"});
  differentiable.push_back({"theta", "dtheta"});
  if (settings.rotary_layout == RotaryLayout::interleaved && !in.count("theta"))
    throw InputError(
        "argument '--rotary-interleaved': expected together with 'theta' in the input (it selects "
        "how theta rotates q and k), got it without");
  for (const char* key : {"q", "k", "v", "g"}) required(key);
  if (op == Op::gated_delta_rule) required("beta");
  if (backward)
    for (const auto& differentiable_input : differentiable) {
      auto it = in.find(differentiable_input.first);
      // Non-floating inputs are left alone: the op rejects them, naming the argument.
      if (it != in.end() && it->second.is_floating_point())
        it->second = it->second.detach().requires_grad_(true);
    }

  const auto [o, final_state] =
      forward ? forward(op, settings, in) : forward_on_one_process(op, settings, in);
  std::vector<std::pair<std::string, at::Tensor>> outputs = {{"o", o}};
  if (final_state) outputs.push_back({"final_state", *final_state});

  if (backward) {
    // The incoming gradients must match the outputs they belong to.
    auto incoming = [&](const std::string& key, const at::Tensor& output, const char* output_name) {
      const at::Tensor& grad = in.at(key);
      if (!grad.is_floating_point())
        throw InputError("argument '" + key + "': expected a floating dtype, got " +
                         std::string(c10::toString(grad.scalar_type())));
      if (grad.sizes() != output.sizes())
        throw InputError("argument '" + key + "': expected shape " + shape_of(output) +
                         " (that of " + output_name + "), got " + shape_of(grad));
      return grad.to(output.scalar_type());
    };
    std::vector<at::Tensor> roots = {o}, root_grads = {incoming("do", o, "o")};
    if (in.count("dht")) {
      roots.push_back(*final_state);
      root_grads.push_back(incoming("dht", *final_state, "final_state"));
    }
    torch::autograd::backward(roots, root_grads);
    for (const auto& [key, grad_name] : differentiable) {
      auto it = in.find(key);
      if (it == in.end()) continue;
      const at::Tensor grad = it->second.grad();
      // A gradient no path reached is zero (autograd leaves it undefined).
      outputs.push_back({grad_name, grad.defined() ? grad : at::zeros_like(it->second)});
    }
  }
  return outputs;
}

}  // namespace phasor::cli
