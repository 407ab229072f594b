// The experiment behind docs/claims.md "Drift and decay: what limits extrapolation" (2026-12-06).
// Not built by CMake: compiled by hand against build/ (the flags and link line of
// build/tests/claims_construction_test), run as `repair_experiment CKPT 1024 100 DRIFT "" GATES`
// with DRIFT 0 or 1 and GATES empty or "tracking" (and an optional 7th argument, the rows
// seed; default 0); output in repair.txt beside it.
// Drift surgery (an experiment): make chosen rotation pairs' per-token phase
// increments exact multiples of π/k (0-token ≡ 0, 1-token ≡ π/k at harmonic k) by editing the
// Selective RoPE's up-projection rows, then measure the correct prefix.
// args: ckpt T minhorizon(pairs whose probe horizon ≥ this are fixed; "none" = print only) [scale]
#include <torch/torch.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include "phasor/nn.h"
#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"
#include "phasor/tasks/train.h"
using namespace phasor::tasks;
double wrap(double a) {
  return std::remainder(a, 2 * M_PI);
}
void curve(LanguageModel& m, const Batch& b, const char* name) {
  auto e = evaluate(m, b, 16);
  const auto& cv = e.metrics.prefix_sequence_accuracy;
  std::printf("%-12s prefix %4ld tokacc %.3f curve:", name, (long)correct_prefix_length(cv),
              e.metrics.token_accuracy);
  for (long p : {4, 64, 128, 256, 320, 384, 448, 512, 640, 768, 896, 1023})
    if (p < (long)cv.size()) std::printf(" %ld:%.2f", p, cv[p]);
  std::printf("\n");
}
int main(int argc, char** argv) {
  const std::string ck = argv[1];
  const long T = std::atol(argv[2]);
  const long minh = std::atol(argv[3]);
  const double scale = argc > 4 ? std::atof(argv[4]) : 1.0;  // 1 = remove drift fully; 0 = none
  const std::string keys = argc > 5 ? argv[5] : "";  // "bos_tracking", "bos_all", "zero_other"
  WordProblemConfig c;
  c.group = Group::S2;
  c.seq_len = T;
  c.bos = true;
  const Batch b = word_problem(c, 256, argc > 7 ? std::atol(argv[7]) : 0);  // rows seed
  torch::NoGradGuard ng;
  LanguageModel m = load_model(ck);
  m->eval();
  curve(m, b, "baseline");
  std::ifstream pf(ck.substr(0, ck.size() - 5) + ".probe.json");
  nlohmann::json probe = nlohmann::json::parse(pf);
  at::Tensor tokens = torch::from_blob((void*)b.inputs.data(), {b.rows, b.cols}, at::kLong).clone();
  at::Tensor x = m->mixer_inputs(tokens)[0];
  at::Tensor row = tokens[0];
  at::Tensor xb = x[0][0], x0, x1;
  for (long t = 1; t < T; ++t) {
    long tok = row[t].item<long>();
    if (tok == 0 && !x0.defined()) x0 = x[0][t];
    if (tok == 1 && !x1.defined()) x1 = x[0][t];
  }
  auto rope = m->selective_ropes(0)[0];
  const long H = rope->options.num_heads(), R = rope->options.head_dim() / 2,
             D = rope->options.hidden_size();
  at::Tensor X = torch::stack({xb, x0, x1}, 0);  // [3, D]
  at::Tensor xg = X.reshape({3, H, D / H});
  at::Tensor xn = (xg * at::rsqrt(xg.pow(2).sum(-1, true) + 1e-6)).reshape({3, D});
  at::Tensor r = rope->down->forward(xn).to(at::kDouble);                     // [3, rank]
  at::Tensor p = rope->up->forward(rope->down->forward(xn)).to(at::kDouble);  // [3, H·R]
  at::Tensor sw = rope->conv->weight.to(at::kDouble).sum(1);                  // [H·R]
  at::Tensor eb = rope->bias.to(at::kDouble).exp();
  at::Tensor om = rope->omega().to(at::kDouble);
  if (om.dim() == 1) om = om.unsqueeze(0).expand({H, R});
  om = om.reshape({H * R});
  at::Tensor Rm = r.t();                                        // [rank, 3]
  at::Tensor Z = Rm.matmul(torch::inverse(Rm.t().matmul(Rm)));  // [rank, 3] duals
  at::Tensor upw = rope->up->weight;                            // [H·R, rank]
  for (long h = 0; h < H; ++h) {
    const auto& ph = probe["heads"][h]["pair_horizons"];
    for (long i = 0; i < R; ++i) {
      const long ch = h * R + i;
      const double w = om[ch].item<double>() * sw[ch].item<double>();
      const double A0 = om[ch].item<double>() * eb[ch].item<double>() + w * p[1][ch].item<double>();
      const double A1 = om[ch].item<double>() * eb[ch].item<double>() + w * p[2][ch].item<double>();
      int bk = 1;
      double best = 1e9;
      for (int k = 1; k <= 4; ++k) {
        double e = std::abs(wrap(k * A0)) + std::abs(wrap(k * A1 - M_PI));
        if (e < best) best = e, bk = k;
      }
      const long hor = ph[i].get<long>();
      const double d0 = wrap(bk * A0) / bk, d1 = wrap(bk * A1 - M_PI) / bk;
      std::printf(
          "h%ld p%2ld horizon %4ld  k=%d  A0 %+.4f A1 %+.4f  drift0 %+.5f drift1 %+.5f (rad/token, "
          "harmonic-1)\n",
          h, i, hor, bk, A0, A1, d0, d1);
      if (minh > 0 && hor >= minh) {
        // p_tok must move by −d/w for tokens 0 and 1; BOS unchanged.
        at::Tensor delta = (Z.select(1, 1) * (-scale * d0 / w) + Z.select(1, 2) * (-scale * d1 / w))
                               .to(at::kFloat);
        upw[ch] += delta;
      }
    }
  }
  if (!keys.empty()) {
    auto gla = std::dynamic_pointer_cast<phasor::nn::GatedLinearAttentionImpl>(
        m->named_modules()["block0.mixer"]);
    const long K = gla->head_k;
    at::Tensor XD = torch::stack({xb, x0, x1}, 1).to(at::kDouble);  // [D,3]
    at::Tensor zb = XD.matmul(torch::inverse(XD.t().matmul(XD))).select(1, 0);
    int n = 0;
    for (long h = 0; h < H; ++h)
      for (long i = 0; i < R; ++i) {
        const bool tracking = probe["heads"][h]["pair_horizons"][i].get<long>() >= minh;
        if (keys == "bos_tracking" && !tracking) continue;
        if (keys == "zero_other" && tracking) continue;
        const bool pure = keys == "pure";  // tracking: BOS only; others: zero
        ++n;
        for (long ch : {h * K + i, h * K + i + R}) {
          at::Tensor w = gla->k_proj->weight[ch].to(at::kDouble);
          at::Tensor nw = (keys == "zero_other" || (pure && !tracking))
                              ? torch::zeros_like(w)
                              : w.dot(xb.to(at::kDouble)) * zb;
          gla->k_proj->weight.index_put_({ch}, nw.to(at::kFloat));
        }
      }
    {
      at::Tensor g = gla->forget_gates(X.unsqueeze(0)).to(at::kDouble);  // [1,3,H,K]
      for (long tk = 0; tk < 3; ++tk)
        std::printf("log gate tok%ld: min %.3e max %.3e mean %.3e\n", tk,
                    g[0][tk].min().item<double>(), g[0][tk].max().item<double>(),
                    g[0][tk].mean().item<double>());
    }
    std::printf("key surgery %s on %d pairs\n", keys.c_str(), n);
  }
  const std::string gates = argc > 6 ? argv[6] : "";
  {
    auto gla = std::dynamic_pointer_cast<phasor::nn::GatedLinearAttentionImpl>(
        m->named_modules()["block0.mixer"]);
    at::Tensor g = gla->forget_gates(X.unsqueeze(0)).to(at::kDouble);  // [1,3,H,K]
    for (long h = 0; h < H; ++h)
      for (long i = 0; i < R; ++i) {
        const bool tracking =
            probe["heads"][h]["pair_horizons"][i].get<long>() >= std::max(minh, 1L);
        if (tracking)
          std::printf("tracking h%ld p%ld log gate BOS %.2e  0: %.2e  1: %.2e\n", h, i,
                      g[0][0][h][i].item<double>(), g[0][1][h][i].item<double>(),
                      g[0][2][h][i].item<double>());
        if (gates == "all" || (gates == "tracking" && tracking)) {
          gla->gk_up->weight.index_put_({h * R + i}, 0.0);
          gla->gk_up->bias.index_put_({h * R + i}, 40.0);
        }
      }
    if (!gates.empty()) std::printf("gate surgery %s\n", gates.c_str());
  }
  if (minh > 0) {
    // check
    at::Tensor p2 = rope->up->forward(rope->down->forward(xn)).to(at::kDouble);
    std::printf("max change of BOS p: %.2e\n", (p2[0] - p[0]).abs().max().item<double>());
    curve(m, b, "fixed");
  }
}
