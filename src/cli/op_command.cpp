// `phasor op NAME --in in.pt --out out.pt [...]`: runs one op through the LibTorch layer on a
// dict of named tensors saved with Python's torch.save, and writes a dict of results loadable with
// torch.load. With `do` (and optionally `dht`) in the input it also runs the backward pass through
// autograd and writes the gradients. This is how phasor is checked against PyTorch or fla.
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "phasor/device.h"
#include "phasor/ops.h"
#include "phasor/torch.h"

namespace phasor::cli {
namespace {

// Bad input given by the user: printed as is, exit status 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The ops `phasor op` runs. Names come from the core's table (phasor/ops.h): an op's own name, or
// the name of one of its implementations (fla's, e.g. chunk_gla), which implies the impl.
bool runs(Op op) {
  return op == Op::gla || op == Op::gated_delta_rule || op == Op::forgetting_attn;
}

// The accepted names: all of them, or only those that imply the implementation.
std::string joined_op_names(bool implementation_names_only = false) {
  std::string s;
  for (const OpInfo& info : all_ops()) {
    if (!runs(info.op)) continue;
    if (!implementation_names_only) s += (s.empty() ? "" : ", ") + std::string(info.name);
    for (const char* name : info.impl_names) s += (s.empty() ? "" : ", ") + std::string(name);
  }
  return s;
}

// The keys each op reads from the input dict. `do`/`dht` request the backward pass.
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

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError("argument '--in': expected a readable file, got '" + path +
                     "' (cannot be opened)");
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Loads the dict of named tensors written by Python's torch.save (zip format, the default since
// torch 1.6; torch::pickle_load reads it).
std::map<std::string, at::Tensor> read_inputs(const std::string& path, Op op) {
  const std::vector<char> bytes = read_file(path);
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    // LibTorch 1.13's C++ unpickler lacks the SETITEM opcode ('s', 0x73), which Python's pickle
    // uses for a dict of exactly one entry; every op needs several tensors anyway.
    if (why.find("0x73") != std::string::npos)
      why +=
          " (a dict with a single entry cannot be read by LibTorch 1.13; give all the op's "
          "inputs)";
    throw InputError("argument '--in': expected a file written by torch.save, got '" + path +
                     "', which cannot be read: " + why);
  }
  if (!value.isGenericDict())
    throw InputError("argument '--in': expected a dict of named tensors, got a " + value.tagKind() +
                     " in '" + path + "'");
  const std::set<std::string> allowed = allowed_keys(op);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString())
      throw InputError("argument '--in': expected string keys, got a key of type " +
                       entry.key().tagKind());
    const std::string key = entry.key().toStringRef();
    if (!allowed.count(key)) {
      std::string names;
      for (const auto& k : allowed) names += (names.empty() ? "" : ", ") + k;
      throw InputError("argument '" + key + "': expected one of the keys " + names +
                       ", got an unknown key '" + key + "' in '" + path + "'");
    }
    if (!entry.value().isTensor())
      throw InputError("argument '" + key + "': expected a tensor, got a " +
                       entry.value().tagKind());
    tensors[key] = entry.value().toTensor();
  }
  return tensors;
}

void write_outputs(const std::string& path,
                   const std::vector<std::pair<std::string, at::Tensor>>& outputs) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : outputs) dict.insert(name, tensor.detach());
  const std::vector<char> bytes = torch::pickle_save(dict);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out)
    throw InputError("argument '--out': expected a writable path, got '" + path +
                     "' (cannot be written)");
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// The options of one run.
struct Options {
  std::string name, in_path, out_path;
  std::string impl_name;
  std::optional<double> scale;
  std::optional<std::int64_t> chunk_size, window_size;
  bool output_final_state = false, use_qk_l2norm = false, rotary_interleaved = false;
  int threads = 0;
  std::string device = "cpu";
};

int run(const Options& opt) {
  const std::optional<OpLookup> found = find_op(opt.name);
  if (!found || !runs(found->op))
    throw InputError("argument 'NAME': expected one of " + joined_op_names() + ", got '" +
                     opt.name + "'");
  const Op op = found->op;
  Impl impl = Impl::chunk;
  if (!opt.impl_name.empty()) {
    if (opt.impl_name != "reference" && opt.impl_name != "recurrent" && opt.impl_name != "chunk")
      throw InputError("argument '--impl': expected reference, recurrent or chunk, got '" +
                       opt.impl_name + "'");
    impl = impl_from_string(opt.impl_name);
  }
  if (const auto implied = found->impl) {
    if (!opt.impl_name.empty() && impl != *implied)
      throw InputError("argument '--impl': expected " + std::string(to_string(*implied)) +
                       " (implied by " + opt.name + ") or nothing, got " + opt.impl_name);
    impl = *implied;
  }
  // Flags that do not apply to the op are mistakes, not silently ignored.
  if (op != Op::forgetting_attn && opt.window_size)
    throw InputError("argument '--window-size': expected only with forgetting_attn, got it with " +
                     opt.name);
  if (op != Op::gated_delta_rule && opt.use_qk_l2norm)
    throw InputError(
        "argument '--use-qk-l2norm': expected only with gated_delta_rule, got it with " + opt.name);
  if (op == Op::forgetting_attn && opt.output_final_state)
    throw InputError(
        "argument '--output-final-state': expected only with gla or gated_delta_rule (forgetting "
        "attention has no recurrent state), got it with " +
        opt.name);
  if (opt.threads < 0)
    throw InputError("argument '--threads': expected a count ≥ 0, got " +
                     std::to_string(opt.threads));
  set_num_threads(opt.threads);
  // The device the op computes on; the .pt tensors stay on the cpu (phasor/torch.h:
  // set_compute_device copies them to a GPU and back, or runs the emulated GPU on them).
  Device device = Device::cpu;
  if (opt.device == "cuda")
    device = Device::cuda;
  else if (opt.device == "emulated")
    device = Device::emulated;
  else if (opt.device != "cpu")
    throw InputError("argument '--device': expected cpu, cuda or emulated, got '" + opt.device +
                     "'");
  require_device(device, "argument '--device'");
  const ComputeDeviceGuard on_device(device);

  std::map<std::string, at::Tensor> in = read_inputs(opt.in_path, op);
  auto required = [&](const std::string& key) -> at::Tensor& {
    auto it = in.find(key);
    if (it == in.end())
      throw InputError("argument '" + key + "': expected a tensor under key '" + key + "' in '" +
                       opt.in_path + "', got none");
    return it->second;
  };
  auto optional = [&](const std::string& key) -> c10::optional<at::Tensor> {
    auto it = in.find(key);
    if (it == in.end()) return c10::nullopt;
    return it->second;
  };

  // Differentiable inputs: with `do`, each floating one becomes a leaf that requires grad, and
  // its gradient is written as "d" + its name (initial_state → dh0).
  const bool backward = in.count("do") > 0;
  if (in.count("dht") && !backward)
    throw InputError(
        "argument 'dht': expected together with 'do' (the backward pass), got 'dht' "
        "alone");
  if (in.count("dht") && !opt.output_final_state)
    throw InputError(
        "argument 'dht': expected only with --output-final-state (it is the "
        "gradient of final_state), got it without");
  std::vector<std::pair<std::string, std::string>> differentiable = {
      {"q", "dq"}, {"k", "dk"}, {"v", "dv"}, {"g", "dg"}};
  if (op == Op::gated_delta_rule) differentiable.push_back({"beta", "dbeta"});
  if (op != Op::forgetting_attn) differentiable.push_back({"initial_state", "dh0"});
  differentiable.push_back({"theta", "dtheta"});
  if (opt.rotary_interleaved && !in.count("theta"))
    throw InputError(
        "argument '--rotary-interleaved': expected together with 'theta' in the input (it selects "
        "how theta rotates q and k), got it without");
  const RotaryLayout layout =
      opt.rotary_interleaved ? RotaryLayout::interleaved : RotaryLayout::half_split;
  for (const char* key : {"q", "k", "v", "g"}) required(key);
  if (op == Op::gated_delta_rule) required("beta");
  if (backward)
    for (const auto& differentiable_input : differentiable) {
      auto it = in.find(differentiable_input.first);
      // Non-floating inputs are left alone: the op rejects them, naming the argument.
      if (it != in.end() && it->second.is_floating_point())
        it->second = it->second.detach().requires_grad_(true);
    }

  const std::int64_t chunk_size = opt.chunk_size.value_or(64);
  c10::optional<double> scale;
  if (opt.scale) scale = *opt.scale;
  at::Tensor o;
  c10::optional<at::Tensor> final_state;
  switch (op) {
    case Op::gla:
      std::tie(o, final_state) = phasor::gla(
          in["q"], in["k"], in["v"], in["g"], impl, scale, optional("initial_state"),
          opt.output_final_state, optional("cu_seqlens"), chunk_size, optional("theta"), layout);
      break;
    case Op::gated_delta_rule:
      std::tie(o, final_state) = phasor::gated_delta_rule(
          in["q"], in["k"], in["v"], in["g"], in["beta"], impl, scale, optional("initial_state"),
          opt.output_final_state, optional("cu_seqlens"), opt.use_qk_l2norm, chunk_size,
          optional("theta"), layout);
      break;
    case Op::forgetting_attn: {
      c10::optional<std::int64_t> window;
      if (opt.window_size) window = *opt.window_size;
      o = phasor::forgetting_attn(in["q"], in["k"], in["v"], in["g"], impl, scale, window,
                                  optional("cu_seqlens"), chunk_size, optional("theta"), layout);
      break;
    }
    default:  // runs() admitted only the ops above
      throw InputError("argument 'NAME': '" + opt.name + "' is not run by phasor op");
  }

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
  write_outputs(opt.out_path, outputs);
  return 0;
}

}  // namespace

int run_op(int argc, char** argv) {
  CLI::App app{
      "Run one op on a dict of named tensors saved with Python's torch.save (keys: q, k, v, g, "
      "beta, initial_state, cu_seqlens, theta (rotation angles [B, T, H, K/2] applied to q and k "
      "inside the kernel); with `do` and optionally `dht`, also the backward pass) and write a "
      "dict with o, final_state and the gradients dq, dk, dv, dg, dbeta, dh0, dtheta that apply, "
      "loadable with torch.load.",
      "phasor op"};
  Options opt;
  double scale = 0;
  std::int64_t chunk_size = 0, window_size = 0;
  app.add_option("NAME", opt.name,
                 "gla, gated_delta_rule, forgetting_attn, or an fla name, which implies the "
                 "implementation: " +
                     joined_op_names(/*implementation_names_only=*/true))
      ->required();
  app.add_option("--in", opt.in_path, "input .pt file (dict of tensors, from torch.save)")
      ->required();
  app.add_option("--out", opt.out_path, "output .pt file (dict of tensors, for torch.load)")
      ->required();
  app.add_option("--impl", opt.impl_name,
                 "reference | recurrent | chunk (default chunk). For forgetting_attn, chunk is "
                 "the tiled kernel and recurrent the token-by-token decode path");
  auto* scale_opt = app.add_option("--scale", scale, "query scale (default K^-1/2)");
  auto* chunk_opt = app.add_option("--chunk-size", chunk_size,
                                   "chunk size (forgetting_attn: block size); default 64");
  auto* window_opt = app.add_option("--window-size", window_size,
                                    "forgetting_attn: attend to the last W tokens only");
  app.add_flag("--output-final-state", opt.output_final_state,
               "also write final_state (gla, gated_delta_rule)");
  app.add_flag("--use-qk-l2norm", opt.use_qk_l2norm,
               "gated_delta_rule: l2-normalise q and k in the kernel");
  app.add_flag("--rotary-interleaved", opt.rotary_interleaved,
               "theta rotates the pairs (2i, 2i+1) (GPT-J) instead of (i, i+K/2) (GPT-NeoX, "
               "default)");
  app.add_option("--threads", opt.threads, "threads (default 0: PHASOR_NUM_THREADS or all cores)");
  app.add_option(
      "--device", opt.device,
      "cpu (default), cuda (the CUDA kernels on the GPU: inputs copied there and results "
      "back) or emulated (the CUDA kernels on the emulated GPU); see `phasor op --help` "
      "and README 'CUDA backend' for which implementations run where");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (scale_opt->count()) opt.scale = scale;
  if (chunk_opt->count()) opt.chunk_size = chunk_size;
  if (window_opt->count()) opt.window_size = window_size;

  const std::string prefix = "phasor op " + opt.name + ": ";
  try {
    return run(opt);
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what());
    return 2;
  } catch (const Error& e) {  // phasor::Error from the core (normally already a c10::Error)
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what());
    return 2;
  } catch (const c10::Error& e) {  // argument checks of the LibTorch layer and the core
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what_without_backtrace());
    return 2;
  }
}

}  // namespace phasor::cli
