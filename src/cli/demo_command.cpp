// `phasor demo`: runs every op through every implementation on one random problem and prints how
// far each result is from the float64 reference, and how long it took. Core API only (no torch):
// this is also the smallest complete example of calling the core with TensorViews.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "phasor/device.h"
#include "phasor/ops.h"
#include "phasor/phasor.h"

namespace phasor::cli {
namespace {

// An owning contiguous buffer of float or double with its view.
template <class T>
struct Buffer {
  std::vector<T> data;
  std::vector<std::int64_t> shape;
  Buffer() = default;
  explicit Buffer(std::vector<std::int64_t> s) : shape(std::move(s)) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    data.assign(static_cast<std::size_t>(n), T(0));
  }
  TensorView view() const {
    TensorView v;
    v.data = const_cast<T*>(data.data());
    v.dtype = dtype_of<T>();
    v.rank = static_cast<int>(shape.size());
    std::int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.sizes[static_cast<std::size_t>(d)] = shape[static_cast<std::size_t>(d)];
      v.strides[static_cast<std::size_t>(d)] = stride;
      stride *= shape[static_cast<std::size_t>(d)];
    }
    return v;
  }
};

using F = Buffer<float>;

F randn(std::vector<std::int64_t> shape, std::mt19937_64& rng, double stddev = 1.0) {
  F b(std::move(shape));
  std::normal_distribution<double> dist(0.0, stddev);
  for (auto& x : b.data) x = static_cast<float>(dist(rng));
  return b;
}

// log σ(x), x ~ N(mean, 1): forget gates around σ(mean).
F log_gates(std::vector<std::int64_t> shape, std::mt19937_64& rng, double mean) {
  F b(std::move(shape));
  std::normal_distribution<double> dist(mean, 1.0);
  for (auto& x : b.data) x = static_cast<float>(-std::log1p(std::exp(-dist(rng))));
  return b;
}

F uniform01(std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  F b(std::move(shape));
  std::uniform_real_distribution<double> dist(0.0, 1.0);
  for (auto& x : b.data) x = static_cast<float>(dist(rng));
  return b;
}

// Selective-RoPE-like rotation angles [B, T, H, K/2]: running sums of random positive phase
// increments times a RoPE spectrum ω_i = 10000^(−2i/K), so angles reach thousands of radians.
F cumulative_phases(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t K,
                    std::mt19937_64& rng) {
  const std::int64_t R = K / 2;
  F theta({B, T, H, R});
  std::uniform_real_distribution<double> increment(0.0, 2.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < R; ++i) {
        const double omega = std::pow(10000.0, -2.0 * static_cast<double>(i) / K);
        double phase = 0.0;
        for (std::int64_t t = 0; t < T; ++t) {
          phase += increment(rng);
          theta.data[static_cast<std::size_t>(((b * T + t) * H + h) * R + i)] =
              static_cast<float>(omega * phase);
        }
      }
  return theta;
}

template <class A, class B>
double rel_rms(const A& actual, const B& trusted) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < trusted.data.size(); ++i) {
    const double d = double(actual.data[i]) - double(trusted.data[i]);
    num += d * d;
    den += double(trusted.data[i]) * double(trusted.data[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double seconds(const std::function<void()>& fn, int repeats) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Views of host buffers for a call on `device`: the buffers themselves on the cpu; otherwise
// copies in the device's memory (inputs copied there by in(), outputs copied back by finish()).
class Staging {
 public:
  explicit Staging(Device device) : device_(device) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    for (const Copy& c : copies_) device_free(device_, c.device_data);
  }
  TensorView in(const TensorView& host) { return stage(host, false); }
  TensorView out(const TensorView& host) { return stage(host, true); }
  // Copies every output back to its host buffer (and waits for the device: a GPU's work is
  // asynchronous, so timings include this wait).
  void finish() {
    for (const Copy& c : copies_)
      if (c.output) copy_bytes(c.host_data, Device::cpu, c.device_data, device_, c.bytes);
  }

 private:
  struct Copy {
    void* device_data;
    void* host_data;
    std::size_t bytes;
    bool output;
  };
  TensorView stage(const TensorView& host, bool output) {
    if (device_ == Device::cpu || !host.defined()) return host;
    const std::size_t bytes =
        std::max<std::size_t>(1, static_cast<std::size_t>(host.numel()) * element_size(host.dtype));
    TensorView view = host;  // contiguous host buffers: the same strides on the device
    view.device = device_;
    view.data = device_allocate(device_, bytes);
    copies_.push_back({view.data, host.data, bytes, output});
    if (!output && host.numel() > 0) copy_bytes(view.data, device_, host.data, Device::cpu, bytes);
    return view;
  }
  Device device_;
  std::vector<Copy> copies_;
};

struct Row {
  std::string op, impl;
  double fwd_ms, fwd_bwd_ms, err_out, err_grad;
};

void print_row(const Row& r, std::int64_t tokens) {
  std::printf("%-24s %-10s %10.2f %12.2f %12.0f %12.2e %12.2e\n", r.op.c_str(), r.impl.c_str(),
              r.fwd_ms, r.fwd_bwd_ms, tokens / (r.fwd_bwd_ms / 1e3), r.err_out, r.err_grad);
}

}  // namespace

int run_demo(int argc, char** argv) {
  CLI::App app{
      "Run every op through every implementation; print agreement with the float64 "
      "reference and timing."};
  std::int64_t T = 2048, H = 4, K = 64, V = 64, B = 2;
  int threads = 0, repeats = 2;
  std::uint64_t seed = 0;
  app.add_option("--batch", B, "batch size B")->check(CLI::PositiveNumber);
  app.add_option("--seq-len", T, "tokens per sequence T")->check(CLI::PositiveNumber);
  app.add_option("--heads", H, "heads H")->check(CLI::PositiveNumber);
  app.add_option("--key-dim", K, "key dimension K")->check(CLI::PositiveNumber);
  app.add_option("--value-dim", V, "value dimension V")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "threads (0: PHASOR_NUM_THREADS or all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", repeats, "timing repeats (best is shown)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "random seed");
  std::string device_name = "cpu";
  app.add_option("--device", device_name,
                 "where the recurrent and chunk implementations run: cpu (default), cuda, or "
                 "emulated (the CUDA kernels on the emulated GPU: slow, use small sizes, e.g. "
                 "--seq-len 64 --heads 2 --key-dim 32 --value-dim 32). Implementations without "
                 "CUDA kernels are skipped on cuda and emulated. The reference runs on the cpu.")
      ->check(CLI::IsMember({"cpu", "cuda", "emulated"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  set_num_threads(threads);
  const Device device = device_name == "cuda"       ? Device::cuda
                        : device_name == "emulated" ? Device::emulated
                                                    : Device::cpu;
  try {
    require_device(device, "phasor demo: argument '--device'");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }

  std::mt19937_64 rng(seed);
  const std::int64_t tokens = B * T;
  std::printf(
      "phasor demo: B=%lld T=%lld H=%lld K=%lld V=%lld, float32 kernels on %s vs float64 "
      "reference on cpu, %d thread(s)\n",
      static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
      static_cast<long long>(K), static_cast<long long>(V), to_string(device), num_threads());
  std::printf("%-24s %-10s %10s %12s %12s %12s %12s\n", "op", "impl", "fwd ms", "fwd+bwd ms",
              "tokens/s", "err(o)", "err(grads)");
  int failures = 0;
  const double tolerance = 1e-4;  // float32 kernels vs float64 reference, relative RMS
  auto report = [&](const Row& r) {
    print_row(r, tokens);
    if (!(r.err_out <= tolerance && r.err_grad <= tolerance)) ++failures;
  };

  // Runs `run` (which returns o, then every gradient) for the reference in float64 on the cpu
  // and the recurrent and chunk kernels in float32 on the device, and reports each against the
  // reference.
  auto compare = [&](Op which, const std::string& op, auto&& run) {
    Row ref_row{op, "reference", 0, 0, 0, 0};
    auto ref = run(Impl::reference, double{}, 1, ref_row, Device::cpu);
    report(ref_row);
    for (Impl impl : {Impl::recurrent, Impl::chunk}) {
      if (device != Device::cpu && !op_info(which).on_gpu[static_cast<std::size_t>(impl)]) {
        std::printf("%-24s %-10s (no CUDA kernel)\n", op.c_str(), to_string(impl));
        continue;
      }
      Row row{op, to_string(impl), 0, 0, 0, 0};
      auto out = run(impl, float{}, repeats, row, device);
      row.err_out = rel_rms(out[0], ref[0]);
      for (std::size_t i = 1; i < out.size(); ++i)
        row.err_grad = std::max(row.err_grad, rel_rms(out[i], ref[i]));
      report(row);
    }
  };
  // Every op runs without rotation and with Selective-RoPE-like angles θ fused into the kernel
  // (rows "<op>+theta"; their gradients include dθ).
  const std::int64_t R = K / 2;
  const F theta = cumulative_phases(B, T, H, K, rng);
  if (K % 2 != 0) std::printf("(K is odd: the rotated rows are skipped)\n");
  const std::vector<bool> rotations =
      K % 2 == 0 ? std::vector<bool>{false, true} : std::vector<bool>{false};

  // ---- GLA -----------------------------------------------------------------------------------
  for (bool rotate : rotations) {
    F q = randn({B, T, H, K}, rng), k = randn({B, T, H, K}, rng), v = randn({B, T, H, V}, rng);
    F g = log_gates({B, T, H, K}, rng, 3.0), h0 = randn({B, H, K, V}, rng, 0.1);
    F d_o = randn({B, T, H, V}, rng), dht = randn({B, H, K, V}, rng, 0.1);
    GlaParams p;
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.g = g.view(), p.initial_state = h0.view();
    if (rotate) p.theta = theta.view();
    auto run = [&](Impl impl, auto scalar, int reps, Row& row, Device on) {
      using S = decltype(scalar);
      Buffer<S> o({B, T, H, V}), ht({B, H, K, V});
      Buffer<S> dq({B, T, H, K}), dk({B, T, H, K}), dv({B, T, H, V}), dg({B, T, H, K}),
          dh0({B, H, K, V}), dtheta({B, T, H, rotate ? R : 0});
      Staging at(on);
      GlaParams pd = p;
      pd.q = at.in(p.q), pd.k = at.in(p.k), pd.v = at.in(p.v), pd.g = at.in(p.g);
      pd.initial_state = at.in(p.initial_state), pd.theta = at.in(p.theta);
      const TensorView o_d = at.out(o.view()), ht_d = at.out(ht.view()), do_d = at.in(d_o.view()),
                       dht_d = at.in(dht.view());
      GlaGrads grads;
      grads.dq = at.out(dq.view()), grads.dk = at.out(dk.view()), grads.dv = at.out(dv.view());
      grads.dg = at.out(dg.view()), grads.dh0 = at.out(dh0.view());
      if (rotate) grads.dtheta = at.out(dtheta.view());
      row.fwd_ms = 1e3 * seconds(
                             [&] {
                               gla_forward(pd, impl, o_d, ht_d);
                               at.finish();
                             },
                             reps);
      row.fwd_bwd_ms = 1e3 * seconds(
                                 [&] {
                                   gla_forward(pd, impl, o_d, ht_d);
                                   gla_backward(pd, impl, do_d, dht_d, grads);
                                   at.finish();
                                 },
                                 reps);
      return std::vector<Buffer<S>>{o, ht, dq, dk, dv, dg, dh0, dtheta};
    };
    compare(Op::gla, rotate ? "gla+theta" : "gla", run);
  }

  // ---- Gated DeltaNet ------------------------------------------------------------------------
  for (bool rotate : rotations) {
    F q = randn({B, T, H, K}, rng), k = randn({B, T, H, K}, rng), v = randn({B, T, H, V}, rng);
    F g = log_gates({B, T, H}, rng, 4.0), beta = uniform01({B, T, H}, rng);
    F h0 = randn({B, H, K, V}, rng, 0.1), d_o = randn({B, T, H, V}, rng),
      dht = randn({B, H, K, V}, rng, 0.1);
    GatedDeltaRuleParams p;
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.g = g.view(), p.beta = beta.view();
    p.initial_state = h0.view();
    p.use_qk_l2norm_in_kernel = true;
    if (rotate) p.theta = theta.view();
    auto run = [&](Impl impl, auto scalar, int reps, Row& row, Device on) {
      using S = decltype(scalar);
      Buffer<S> o({B, T, H, V}), ht({B, H, K, V});
      Buffer<S> dq({B, T, H, K}), dk({B, T, H, K}), dv({B, T, H, V}), dg({B, T, H}), db({B, T, H}),
          dh0({B, H, K, V}), dtheta({B, T, H, rotate ? R : 0});
      Staging at(on);
      GatedDeltaRuleParams pd = p;
      pd.q = at.in(p.q), pd.k = at.in(p.k), pd.v = at.in(p.v), pd.g = at.in(p.g);
      pd.beta = at.in(p.beta), pd.initial_state = at.in(p.initial_state);
      pd.theta = at.in(p.theta);
      const TensorView o_d = at.out(o.view()), ht_d = at.out(ht.view()), do_d = at.in(d_o.view()),
                       dht_d = at.in(dht.view());
      GatedDeltaRuleGrads grads;
      grads.dq = at.out(dq.view()), grads.dk = at.out(dk.view()), grads.dv = at.out(dv.view());
      grads.dg = at.out(dg.view()), grads.dbeta = at.out(db.view());
      grads.dh0 = at.out(dh0.view());
      if (rotate) grads.dtheta = at.out(dtheta.view());
      row.fwd_ms = 1e3 * seconds(
                             [&] {
                               gated_delta_rule_forward(pd, impl, o_d, ht_d);
                               at.finish();
                             },
                             reps);
      row.fwd_bwd_ms = 1e3 * seconds(
                                 [&] {
                                   gated_delta_rule_forward(pd, impl, o_d, ht_d);
                                   gated_delta_rule_backward(pd, impl, do_d, dht_d, grads);
                                   at.finish();
                                 },
                                 reps);
      return std::vector<Buffer<S>>{o, ht, dq, dk, dv, dg, db, dh0, dtheta};
    };
    compare(Op::gated_delta_rule, rotate ? "gated_delta_rule+theta" : "gated_delta_rule", run);
  }

  // ---- FoX (forgetting attention) -------------------------------------------------------------
  for (bool rotate : rotations) {
    F q = randn({B, T, H, K}, rng), k = randn({B, T, H, K}, rng), v = randn({B, T, H, V}, rng);
    F g = log_gates({B, T, H}, rng, 4.0), d_o = randn({B, T, H, V}, rng);
    ForgettingAttnParams p;
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.g = g.view();
    if (rotate) p.theta = theta.view();
    auto run = [&](Impl impl, auto scalar, int reps, Row& row, Device on) {
      using S = decltype(scalar);
      Buffer<S> o({B, T, H, V}), lse({B, T, H});
      Buffer<S> dq({B, T, H, K}), dk({B, T, H, K}), dv({B, T, H, V}), dg({B, T, H}),
          dtheta({B, T, H, rotate ? R : 0});
      Staging at(on);
      ForgettingAttnParams pd = p;
      pd.q = at.in(p.q), pd.k = at.in(p.k), pd.v = at.in(p.v), pd.g = at.in(p.g);
      pd.theta = at.in(p.theta);
      const TensorView o_d = at.out(o.view()), lse_d = at.out(lse.view()), do_d = at.in(d_o.view());
      ForgettingAttnGrads grads;
      grads.dq = at.out(dq.view()), grads.dk = at.out(dk.view()), grads.dv = at.out(dv.view());
      grads.dg = at.out(dg.view());
      if (rotate) grads.dtheta = at.out(dtheta.view());
      row.fwd_ms = 1e3 * seconds(
                             [&] {
                               forgetting_attn_forward(pd, impl, o_d, lse_d);
                               at.finish();
                             },
                             reps);
      row.fwd_bwd_ms = 1e3 * seconds(
                                 [&] {
                                   forgetting_attn_forward(pd, impl, o_d, lse_d);
                                   forgetting_attn_backward(pd, impl, do_d, o_d, lse_d, grads);
                                   at.finish();
                                 },
                                 reps);
      return std::vector<Buffer<S>>{o, dq, dk, dv, dg, dtheta};
    };
    compare(Op::forgetting_attn, rotate ? "forgetting_attn+theta" : "forgetting_attn", run);
  }

  std::printf(
      "err: relative RMS error against the float64 reference (worst over o and final "
      "state / all gradients).\n%s\n",
      failures ? "Some implementation disagrees with the reference."
               : "All implementations agree with the reference.");
  return failures ? 1 : 0;
}

}  // namespace phasor::cli
