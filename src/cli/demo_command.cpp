// `phasor demo`: runs every op through every implementation on one random problem and prints how
// far each result is from the float64 reference, and how long it took. Core API only (no torch):
// this is also the smallest complete example of calling the core with TensorViews. Its tensors,
// random inputs, device staging and error measure are the test suites' (tests/support,
// phasor_testing), so the demo and the tests measure agreement the same way.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/input_error.h"
#include "phasor/device.h"
#include "phasor/ops.h"
#include "phasor/phasor.h"
#include "phasor/testing/compare.h"
#include "phasor/testing/device.h"
#include "phasor/testing/random.h"
#include "phasor/testing/tensor.h"

namespace phasor::cli {
namespace {

using testing::Tensor;

// float32 inputs (every implementation reads the same values; the reference computes in float64).
Tensor randn(const testing::Shape& shape, std::mt19937_64& rng, double stddev = 1.0) {
  return testing::randn(shape, rng, stddev, DType::float32);
}

// log σ(x), x ~ N(mean, 1): forget gates around σ(mean).
Tensor log_gates(const testing::Shape& shape, std::mt19937_64& rng, double mean) {
  return testing::log_sigmoid_gates(shape, rng, mean, 1.0, DType::float32);
}

Tensor uniform01(const testing::Shape& shape, std::mt19937_64& rng) {
  return testing::uniform(shape, rng, 0.0, 1.0, DType::float32);
}

// Selective-RoPE-like rotation angles [B, T, H, K/2]: running sums of random positive phase
// increments times a RoPE spectrum ω_i = 10000^(−2i/K), so angles reach thousands of radians.
Tensor cumulative_phases(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t K,
                         std::mt19937_64& rng) {
  const std::int64_t R = K / 2;
  Tensor theta({B, T, H, R}, DType::float32);
  std::uniform_real_distribution<double> increment(0.0, 2.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < R; ++i) {
        const double omega = std::pow(10000.0, -2.0 * static_cast<double>(i) / K);
        double phase = 0.0;
        for (std::int64_t t = 0; t < T; ++t) {
          phase += increment(rng);
          theta.set(((b * T + t) * H + h) * R + i, omega * phase);
        }
      }
  return theta;
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

// The host copies of a call's outputs, after it ran (an absent output: an undefined Tensor).
std::vector<Tensor> fetch(const testing::OnDevice& at, std::initializer_list<TensorView> outputs) {
  std::vector<Tensor> host;
  for (const TensorView& view : outputs)
    host.push_back(view.defined() ? at.to_host(view) : Tensor());
  return host;
}

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
  // The message names the command and the option itself, so no prefix.
  const int device_status = with_bad_input_status("", [&] {
    require_device(device, "phasor demo: argument '--device'");
    return 0;
  });
  if (device_status != 0) return device_status;

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
  // reference. The inputs are staged on the device before the clock starts; the timings include
  // waiting for the device (a GPU's work is asynchronous), not copying the outputs back.
  auto compare = [&](Op which, const std::string& op, auto&& run) {
    Row ref_row{op, "reference", 0, 0, 0, 0};
    auto ref = run(Impl::reference, DType::float64, 1, ref_row, Device::cpu);
    report(ref_row);
    for (Impl impl : {Impl::recurrent, Impl::chunk}) {
      if (device != Device::cpu && !op_info(which).on_gpu[static_cast<std::size_t>(impl)]) {
        std::printf("%-24s %-10s (no CUDA kernel)\n", op.c_str(), to_string(impl));
        continue;
      }
      Row row{op, to_string(impl), 0, 0, 0, 0};
      auto out = run(impl, DType::float32, repeats, row, device);
      row.err_out = testing::rel_rms(out[0], ref[0]);
      for (std::size_t i = 1; i < out.size(); ++i)
        row.err_grad = std::max(row.err_grad, testing::rel_rms(out[i], ref[i]));
      report(row);
    }
  };
  // Every op runs without rotation and with Selective-RoPE-like angles θ fused into the kernel
  // (rows "<op>+theta"; their gradients include dθ).
  const std::int64_t R = K / 2;
  const Tensor theta = cumulative_phases(B, T, H, K, rng);
  if (K % 2 != 0) std::printf("(K is odd: the rotated rows are skipped)\n");
  const std::vector<bool> rotations =
      K % 2 == 0 ? std::vector<bool>{false, true} : std::vector<bool>{false};

  // ---- GLA -----------------------------------------------------------------------------------
  for (bool rotate : rotations) {
    const Tensor q = randn({B, T, H, K}, rng), k = randn({B, T, H, K}, rng),
                 v = randn({B, T, H, V}, rng);
    const Tensor g = log_gates({B, T, H, K}, rng, 3.0), h0 = randn({B, H, K, V}, rng, 0.1);
    const Tensor d_o = randn({B, T, H, V}, rng), dht = randn({B, H, K, V}, rng, 0.1);
    auto run = [&](Impl impl, DType out, int reps, Row& row, Device on) {
      testing::OnDevice at(on);
      GlaParams p;
      p.q = at.in(q), p.k = at.in(k), p.v = at.in(v), p.g = at.in(g);
      p.initial_state = at.in(h0);
      if (rotate) p.theta = at.in(theta);
      const TensorView o = at.out({B, T, H, V}, out), ht = at.out({B, H, K, V}, out),
                       do_d = at.in(d_o), dht_d = at.in(dht);
      GlaGrads grads;
      grads.dq = at.out({B, T, H, K}, out), grads.dk = at.out({B, T, H, K}, out);
      grads.dv = at.out({B, T, H, V}, out), grads.dg = at.out({B, T, H, K}, out);
      grads.dh0 = at.out({B, H, K, V}, out);
      if (rotate) grads.dtheta = at.out({B, T, H, R}, out);
      row.fwd_ms = 1e3 * seconds(
                             [&] {
                               gla_forward(p, impl, o, ht);
                               at.synchronize();
                             },
                             reps);
      row.fwd_bwd_ms = 1e3 * seconds(
                                 [&] {
                                   gla_forward(p, impl, o, ht);
                                   gla_backward(p, impl, do_d, dht_d, grads);
                                   at.synchronize();
                                 },
                                 reps);
      return fetch(at, {o, ht, grads.dq, grads.dk, grads.dv, grads.dg, grads.dh0, grads.dtheta});
    };
    compare(Op::gla, rotate ? "gla+theta" : "gla", run);
  }

  // ---- Gated DeltaNet ------------------------------------------------------------------------
  for (bool rotate : rotations) {
    const Tensor q = randn({B, T, H, K}, rng), k = randn({B, T, H, K}, rng),
                 v = randn({B, T, H, V}, rng);
    const Tensor g = log_gates({B, T, H}, rng, 4.0), beta = uniform01({B, T, H}, rng);
    const Tensor h0 = randn({B, H, K, V}, rng, 0.1), d_o = randn({B, T, H, V}, rng),
                 dht = randn({B, H, K, V}, rng, 0.1);
    auto run = [&](Impl impl, DType out, int reps, Row& row, Device on) {
      testing::OnDevice at(on);
      GatedDeltaRuleParams p;
      p.q = at.in(q), p.k = at.in(k), p.v = at.in(v), p.g = at.in(g), p.beta = at.in(beta);
      p.initial_state = at.in(h0);
      p.use_qk_l2norm_in_kernel = true;
      if (rotate) p.theta = at.in(theta);
      const TensorView o = at.out({B, T, H, V}, out), ht = at.out({B, H, K, V}, out),
                       do_d = at.in(d_o), dht_d = at.in(dht);
      GatedDeltaRuleGrads grads;
      grads.dq = at.out({B, T, H, K}, out), grads.dk = at.out({B, T, H, K}, out);
      grads.dv = at.out({B, T, H, V}, out), grads.dg = at.out({B, T, H}, out);
      grads.dbeta = at.out({B, T, H}, out), grads.dh0 = at.out({B, H, K, V}, out);
      if (rotate) grads.dtheta = at.out({B, T, H, R}, out);
      row.fwd_ms = 1e3 * seconds(
                             [&] {
                               gated_delta_rule_forward(p, impl, o, ht);
                               at.synchronize();
                             },
                             reps);
      row.fwd_bwd_ms = 1e3 * seconds(
                                 [&] {
                                   gated_delta_rule_forward(p, impl, o, ht);
                                   gated_delta_rule_backward(p, impl, do_d, dht_d, grads);
                                   at.synchronize();
                                 },
                                 reps);
      return fetch(at, {o, ht, grads.dq, grads.dk, grads.dv, grads.dg, grads.dbeta, grads.dh0,
                        grads.dtheta});
    };
    compare(Op::gated_delta_rule, rotate ? "gated_delta_rule+theta" : "gated_delta_rule", run);
  }

  // ---- FoX (forgetting attention) -------------------------------------------------------------
  for (bool rotate : rotations) {
    const Tensor q = randn({B, T, H, K}, rng), k = randn({B, T, H, K}, rng),
                 v = randn({B, T, H, V}, rng);
    const Tensor g = log_gates({B, T, H}, rng, 4.0), d_o = randn({B, T, H, V}, rng);
    auto run = [&](Impl impl, DType out, int reps, Row& row, Device on) {
      testing::OnDevice at(on);
      ForgettingAttnParams p;
      p.q = at.in(q), p.k = at.in(k), p.v = at.in(v), p.g = at.in(g);
      if (rotate) p.theta = at.in(theta);
      const TensorView o = at.out({B, T, H, V}, out), lse = at.out({B, T, H}, out),
                       do_d = at.in(d_o);
      ForgettingAttnGrads grads;
      grads.dq = at.out({B, T, H, K}, out), grads.dk = at.out({B, T, H, K}, out);
      grads.dv = at.out({B, T, H, V}, out), grads.dg = at.out({B, T, H}, out);
      if (rotate) grads.dtheta = at.out({B, T, H, R}, out);
      row.fwd_ms = 1e3 * seconds(
                             [&] {
                               forgetting_attn_forward(p, impl, o, lse);
                               at.synchronize();
                             },
                             reps);
      row.fwd_bwd_ms = 1e3 * seconds(
                                 [&] {
                                   forgetting_attn_forward(p, impl, o, lse);
                                   forgetting_attn_backward(p, impl, do_d, o, lse, grads);
                                   at.synchronize();
                                 },
                                 reps);
      return fetch(at, {o, grads.dq, grads.dk, grads.dv, grads.dg, grads.dtheta});
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
