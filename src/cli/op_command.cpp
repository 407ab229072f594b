// `phasor op NAME --in in.pt --out out.pt [...]`: runs one op through the LibTorch layer on a
// dict of named tensors saved with Python's torch.save, and writes a dict of results loadable with
// torch.load. With `do` (and optionally `dht`) in the input it also runs the backward pass through
// autograd and writes the gradients. This is how phasor is checked against PyTorch or fla.
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/op_context_parallel.h"
#include "cli/op_inputs.h"
#include "phasor/device.h"
#include "phasor/distributed.h"
#include "phasor/ops.h"
#include "phasor/torch.h"

namespace phasor::cli {
namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError("argument '--in': expected a readable file, got '" + path +
                     "' (cannot be opened)");
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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

// The options of one run.
struct Options {
  std::string name, in_path, out_path;
  std::string impl_name;
  std::optional<double> scale;
  std::optional<std::int64_t> chunk_size, window_size;
  bool output_final_state = false, use_qk_l2norm = false, rotary_interleaved = false;
  int threads = 0;
  std::string device = "cpu";
  int context_parallel = 1;       // ranks the op is split across (--context-parallel)
  std::vector<std::string> args;  // the command line after the program name, to relaunch it
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

  OpSettings settings;
  settings.impl = impl;
  if (opt.scale) settings.scale = *opt.scale;
  settings.chunk_size = opt.chunk_size.value_or(64);
  if (opt.window_size) settings.window_size = *opt.window_size;
  settings.output_final_state = opt.output_final_state;
  settings.use_qk_l2norm = opt.use_qk_l2norm;
  settings.rotary_layout =
      opt.rotary_interleaved ? RotaryLayout::interleaved : RotaryLayout::half_split;
  if (opt.context_parallel < 1)
    throw InputError("argument '--context-parallel': expected a number of ranks ≥ 1, got " +
                     std::to_string(opt.context_parallel));
  if (opt.context_parallel == 1) {
    const auto outputs = run_on_inputs(
        op, settings, read_inputs(read_file(opt.in_path), op, opt.in_path), opt.in_path);
    write_outputs(opt.out_path, outputs);
    return 0;
  }
  // Context parallel: without torchrun's environment, this process launches the ranks on this
  // machine (this same command line, one process per rank) and returns the first failing
  // rank's exit status; with it (a launched rank, or torchrun across machines), it is one rank.
  if (device != Device::cpu)
    throw InputError(
        "argument '--context-parallel': expected with --device cpu (the process "
        "group is Gloo's, on CPU tensors), got --device " +
        opt.device);
  const auto env = distributed::launch_environment();
  if (!env) {
    std::vector<std::string> argv = {"/proc/self/exe"};
    argv.insert(argv.end(), opt.args.begin(), opt.args.end());
    return distributed::launch_local(opt.context_parallel, argv);
  }
  if (env->world_size != opt.context_parallel)
    throw InputError(
        "argument '--context-parallel': expected the launch environment's "
        "WORLD_SIZE (" +
        std::to_string(env->world_size) + "), got " + std::to_string(opt.context_parallel));
  const auto group = distributed::init_process_group();
  const auto outputs = run_context_parallel(
      op, settings, read_inputs(read_file(opt.in_path), op, opt.in_path), opt.in_path, group);
  if (group->getRank() == 0) write_outputs(opt.out_path, outputs);
  // No rank exits before the file is written (a launcher may read it when the first rank ends).
  group->barrier()->wait();
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
  app.add_option("--context-parallel", opt.context_parallel,
                 "split the tokens across N ranks (gla, gated_delta_rule, forgetting_attn; "
                 "contiguous slices, the context-parallel ops of phasor/context_parallel.h over "
                 "c10d/Gloo): launches N local processes on the loopback, or runs as one rank "
                 "under torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; writes the same "
                 "outputs and gradients as one process. Default 1");
  for (int i = 0; i < argc; ++i) opt.args.emplace_back(argv[i]);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (scale_opt->count()) opt.scale = scale;
  if (chunk_opt->count()) opt.chunk_size = chunk_size;
  if (window_opt->count()) opt.window_size = window_size;

  const std::string prefix = "phasor op " + opt.name + ": ";
  return with_bad_input_status(prefix, [&] { return run(opt); });
}

}  // namespace phasor::cli
