// The experiment behind docs/claims.md "Drift and decay: what limits extrapolation" (2026-12-06).
// Not built by CMake: compiled by hand against build/ (the flags and link line of
// build/tests/claims_construction_test, linked without gtest_main), run as
//   repair_experiment CHECKPOINT LENGTH MIN_HORIZON [ROWS_SEED]
// on a 1-layer GLA + Selective RoPE parity model with a BOS (the gate-near-1 claims configs).
//
// The tracking pairs are the rotation pairs whose parity phase probe (phase_probe.h) horizon on
// 256 rows of LENGTH elements (seed 0, the rows of `phasor tasks probe --length LENGTH`) is
// ≥ MIN_HORIZON. The model is scored (correct prefix, token accuracy, the cumulative sequence
// accuracy at some positions) on 256 rows of seed ROWS_SEED (default 0) as trained and with
// each edit of its tracking pairs, every edit on a freshly loaded model:
//   drift: the phase path is linear here (no SiLU, no phase gate) and the mixer input takes three
//          values (BOS, 0, 1), so a pair advances by fixed A_tok = ω·(exp b + Σ conv taps · p_tok)
//          per 0- and 1-token. At the harmonic k that fits best, the drifts are A₀ and A₁ − π/k
//          wrapped to (−π/k, π/k]; the pair's row of the up-projection moves within the span
//          dual to the three inputs' rank-space vectors, so that p₀ and p₁ change by
//          −drift/(ω·Σ taps) and BOS's p does not.
//   decay: the pair's (tied) GLA forget gate set to log g ≈ 0 (its gk_up row zeroed, bias 40).
//   both:  the two together.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <utility>

#include "phasor/nn.h"
#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"
#include "phasor/tasks/phase_probe.h"
#include "phasor/tasks/train.h"

using namespace phasor::tasks;
using Pairs = std::set<std::pair<long, long>>;  // (head, pair)

double wrap(double a) {
  return std::remainder(a, 2 * M_PI);
}

WordProblemConfig parity_rows(long length) {
  WordProblemConfig c;
  c.group = Group::S2;
  c.seq_len = length;
  c.bos = true;
  return c;
}

void score(LanguageModel& m, const Batch& rows, const char* name) {
  const EvalResult e = evaluate(m, rows, 16);
  const auto& cv = e.metrics.prefix_sequence_accuracy;
  std::printf("%-8s prefix %4ld tokacc %.3f curve:", name, (long)correct_prefix_length(cv),
              e.metrics.token_accuracy);
  for (long p : {4, 64, 128, 256, 320, 384, 448, 512, 640, 768, 896, 1023})
    if (p < (long)cv.size()) std::printf(" %ld:%.2f", p, cv[p]);
  std::printf("\n");
}

phasor::nn::GatedLinearAttention mixer(LanguageModel& m) {
  return phasor::nn::GatedLinearAttention(
      std::dynamic_pointer_cast<phasor::nn::GatedLinearAttentionImpl>(
          m->named_modules()["block0.mixer"]));
}

// Removes the drift of `tracking` (see the top); prints each pair's harmonic and drifts when
// `report`.
void remove_drift(LanguageModel& m, const Pairs& tracking, bool report) {
  auto rope = m->selective_ropes(0)[0];
  const long H = rope->options.num_heads(), R = rope->options.head_dim() / 2,
             D = rope->options.hidden_size();
  // The mixer's three inputs, from one row BOS (id 2), 0, 1: a 1-layer model without positions.
  const at::Tensor x = m->mixer_inputs(torch::tensor({{2L, 0L, 1L}}))[0][0];  // [3, D]
  // x̂: SelectiveRoPEImpl::phase_increments' per-head ℓ2 normalisation (src/torch/nn.cpp).
  const at::Tensor xg = x.reshape({3, H, D / H});
  const at::Tensor xn = (xg * at::rsqrt(xg.pow(2).sum(-1, true) + 1e-6)).reshape({3, D});
  const at::Tensor r_f = rope->down->forward(xn);  // [3, rank]
  const at::Tensor r = r_f.to(at::kDouble);
  const at::Tensor p = rope->up->forward(r_f).to(at::kDouble);        // [3, H·R]
  const at::Tensor taps = rope->conv->weight.to(at::kDouble).sum(1);  // [H·R]
  const at::Tensor eb = rope->bias.to(at::kDouble).exp();             // [H·R]
  at::Tensor om = rope->omega().to(at::kDouble);
  om = (om.dim() == 1 ? om.unsqueeze(0).expand({H, R}) : om).reshape({H * R});
  // Z's columns z_j satisfy r_iᵀ z_j = δ_ij: adding c·z_j to a row of `up` moves input j's p only.
  const at::Tensor Z = r.t().matmul(torch::inverse(r.matmul(r.t())));  // [rank, 3]
  at::Tensor up = rope->up->weight;                                    // [H·R, rank]
  for (const auto& [h, i] : tracking) {
    const long ch = h * R + i;
    const double o = om[ch].item<double>(), w = o * taps[ch].item<double>();
    const double A0 = o * eb[ch].item<double>() + w * p[1][ch].item<double>();
    const double A1 = o * eb[ch].item<double>() + w * p[2][ch].item<double>();
    int k = 1;
    for (int c = 2; c <= 4; ++c)
      if (std::abs(wrap(c * A0)) + std::abs(wrap(c * A1 - M_PI)) <
          std::abs(wrap(k * A0)) + std::abs(wrap(k * A1 - M_PI)))
        k = c;
    const double d0 = wrap(k * A0) / k, d1 = wrap(k * A1 - M_PI) / k;
    if (report)
      std::printf(
          "  h%ld p%-2ld k=%d  A0 %+.4f A1 %+.4f  drift per 0 / 1-token %+.5f / %+.5f rad\n", h, i,
          k, A0, A1, d0, d1);
    up[ch] += (Z.select(1, 1) * (-d0 / w) + Z.select(1, 2) * (-d1 / w)).to(up.scalar_type());
  }
  const at::Tensor p_after = rope->up->forward(r_f).to(at::kDouble);
  if (report)
    std::printf("  BOS's p moved by at most %.1e\n",
                (p_after[0] - p[0]).abs().max().item<double>());
}

// Sets the forget gate of `tracking` to log g ≈ 0; prints the gates before when `report`.
void remove_decay(LanguageModel& m, const Pairs& tracking, bool report) {
  auto gla = mixer(m);
  const long R = gla->head_k / 2;
  if (report) {
    const at::Tensor x = m->mixer_inputs(torch::tensor({{2L, 0L, 1L}}))[0];  // [1, 3, D]
    const at::Tensor g = gla->forget_gates(x)[0].to(at::kDouble);            // [3, H, K]
    for (const auto& [h, i] : tracking)
      std::printf("  h%ld p%-2ld log gate BOS %.2e  0: %.2e  1: %.2e\n", h, i,
                  g[0][h][i].item<double>(), g[1][h][i].item<double>(), g[2][h][i].item<double>());
  }
  for (const auto& [h, i] : tracking) {
    gla->gk_up->weight.index_put_({h * R + i}, 0.0);
    gla->gk_up->bias.index_put_({h * R + i}, 40.0);
  }
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s CHECKPOINT LENGTH MIN_HORIZON [ROWS_SEED]\n", argv[0]);
    return 2;
  }
  const std::string checkpoint = argv[1];
  const long length = std::atol(argv[2]), min_horizon = std::atol(argv[3]);
  const long rows_seed = argc > 4 ? std::atol(argv[4]) : 0;
  torch::NoGradGuard no_grad;
  const WordProblemConfig c = parity_rows(length);
  const Batch selection = word_problem(c, 256, 0);
  const Batch rows = rows_seed == 0 ? selection : word_problem(c, 256, rows_seed);

  LanguageModel trained = load_model(checkpoint);
  trained->eval();
  Pairs tracking;
  for (const PhasePairProbe& q : parity_phase_probe(trained, selection).pairs)
    if (q.horizon >= min_horizon) tracking.insert({q.head, q.pair});
  std::printf("%s: %zu tracking pairs (horizon >= %ld on seed 0's rows), scored on seed %ld's\n",
              checkpoint.c_str(), tracking.size(), min_horizon, rows_seed);
  score(trained, rows, "trained");
  for (const char* edit : {"drift", "decay", "both"}) {
    LanguageModel m = load_model(checkpoint);
    m->eval();
    const std::string e = edit;
    const bool report = e != "both";  // "both" repeats what the other two printed
    if (e != "decay") remove_drift(m, tracking, report);
    if (e != "drift") remove_decay(m, tracking, report);
    score(m, rows, edit);
  }
}
