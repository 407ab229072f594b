// The parity phase probe (phase_probe.h).
#include "phasor/tasks/phase_probe.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "check.h"

namespace phasor::tasks {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr std::int64_t kContexts = 27;  // the last three tokens, each 0, 1 or BOS / before the row

// x modulo 2π, in [−π, π).
double wrap(double x) {
  return x - 2 * kPi * std::floor((x + kPi) / (2 * kPi));
}

// What every pair's probe reads of the rows, position-major within a row (index r · cols + t).
struct Rows {
  std::int64_t rows = 0, cols = 0;
  std::vector<std::int64_t> ones;                // n_t (0 at t = 0)
  std::vector<std::int64_t> context;             // the id of (x_{t−2}, x_{t−1}, x_t), base 3
  std::int64_t zero_tokens = 0, one_tokens = 0;  // over the positions t > 0

  explicit Rows(const Batch& b) : rows(b.rows), cols(b.cols) {
    const auto n = static_cast<std::size_t>(rows * cols);
    ones.assign(n, 0);
    context.assign(n, 0);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t count = 0, id = kContexts - 1;  // BOS, BOS, BOS: nothing before the row
      for (std::int64_t t = 0; t < cols; ++t) {
        const std::int64_t x = b.input(r, t);
        if (t > 0) count += x, (x == 1 ? one_tokens : zero_tokens) += 1;
        id = (id * 3 + x) % kContexts;
        ones[static_cast<std::size_t>(r * cols + t)] = count;
        context[static_cast<std::size_t>(r * cols + t)] = id;
      }
    }
  }
};

// The rows' tokens, checked: ids 0 and 1, and the BOS id at position 0 only.
void check_rows(const Batch& b, std::int64_t vocab_size) {
  const std::string op = "phase_probe";
  if (b.rows < 1 || b.cols < 1)
    detail::fail(op, "batch", "at least one row of at least one position",
                 std::to_string(b.rows) + " × " + std::to_string(b.cols));
  for (std::int64_t r = 0; r < b.rows; ++r)
    for (std::int64_t t = 0; t < b.cols; ++t) {
      const std::int64_t x = b.input(r, t);
      if (x == 0 || x == 1 || (x == kParityBos && t == 0)) continue;
      detail::fail(op, "batch", "parity rows (element ids 0 and 1, a BOS id 2 at position 0 only)",
                   "id " + std::to_string(x) + " at row " + std::to_string(r) + ", position " +
                       std::to_string(t));
    }
  const std::int64_t needed = b.input(0, 0) == kParityBos ? kParityBos + 1 : 2;
  if (vocab_size < needed)
    detail::fail(op, "model", "a vocabulary of at least " + std::to_string(needed) + " ids",
                 std::to_string(vocab_size));
}

// Solves the 3 × 3 system a x = y (symmetric positive semi-definite normal equations) by Cramer's
// rule; false when it is singular.
bool solve3(const double a[3][3], const double y[3], double x[3]) {
  const auto det = [](const double m[3][3]) {
    return m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) -
           m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
           m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
  };
  const double d = det(a);
  if (!(std::abs(d) > 0)) return false;
  for (int c = 0; c < 3; ++c) {
    double m[3][3];
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) m[i][j] = j == c ? y[i] : a[i][j];
    x[c] = det(m) / d;
  }
  return true;
}

// One pair at harmonic k from its cumulative phases (phase[r · cols + t] = Σ_{0<s≤t} Δθ_s);
// `error` is scratch of rows · cols values.
PhasePairProbe probe_pair(const Rows& rows, const std::vector<double>& phase, int k,
                          std::vector<double>& error) {
  const std::int64_t R = rows.rows, T = rows.cols;
  const auto at = [T](std::int64_t r, std::int64_t t) {
    return static_cast<std::size_t>(r * T + t);
  };
  // e_t, and the context offsets from the first kCalibrationPositions positions.
  double cos_sum[kContexts] = {}, sin_sum[kContexts] = {};
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t t = 1; t < T; ++t) {
      const std::size_t i = at(r, t);
      error[i] = wrap(k * phase[i] - kPi * static_cast<double>(rows.ones[i]));
      if (t <= kCalibrationPositions) {
        cos_sum[rows.context[i]] += std::cos(error[i]);
        sin_sum[rows.context[i]] += std::sin(error[i]);
      }
    }
  double offset[kContexts];
  for (std::int64_t c = 0; c < kContexts; ++c)
    offset[c] = cos_sum[c] == 0 && sin_sum[c] == 0 ? 0.0 : std::atan2(sin_sum[c], cos_sum[c]);

  // ê_t, the horizon, and the error path E_t (ê unwrapped) in place of e.
  PhasePairProbe p;
  p.harmonic = k;
  std::vector<std::int64_t> first_wrong(static_cast<std::size_t>(R), T);
  double normal[3][3] = {}, moment[3] = {};
  for (std::int64_t r = 0; r < R; ++r) {
    double previous = 0, path = 0;
    for (std::int64_t t = 1; t < T; ++t) {
      const std::size_t i = at(r, t);
      const double e = wrap(error[i] - offset[rows.context[i]]);
      if (first_wrong[static_cast<std::size_t>(r)] == T && std::abs(e) >= kPi / 2)
        first_wrong[static_cast<std::size_t>(r)] = t;
      path += t == 1 ? e : wrap(e - previous);
      previous = e;
      error[i] = path;
      const double n1 = static_cast<double>(rows.ones[i]), n0 = static_cast<double>(t) - n1;
      const double basis[3] = {1.0, n0, n1};
      for (int a = 0; a < 3; ++a) {
        moment[a] += basis[a] * path;
        for (int b = 0; b < 3; ++b) normal[a][b] += basis[a] * basis[b];
      }
    }
  }
  // The largest m with F ≥ m for at least half of the rows: the (R − ⌈R/2⌉)-th smallest F.
  std::sort(first_wrong.begin(), first_wrong.end());
  p.horizon = first_wrong[static_cast<std::size_t>(R - (R + 1) / 2)];

  // E ≈ β + drift_zero · n0 + drift_one · n1, and the RMS of what is left.
  double beta[3] = {0, 0, 0};
  if (solve3(normal, moment, beta)) {
    p.drift_zero = beta[1], p.drift_one = beta[2];
    double sum_sq = 0;
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t t = 1; t < T; ++t) {
        const std::size_t i = at(r, t);
        const double n1 = static_cast<double>(rows.ones[i]), n0 = static_cast<double>(t) - n1;
        const double residual = error[i] - (beta[0] + beta[1] * n0 + beta[2] * n1);
        sum_sq += residual * residual;
      }
    p.jitter = std::sqrt(sum_sq / normal[0][0]);
  }
  const double tokens = static_cast<double>(rows.zero_tokens + rows.one_tokens);
  const double mean_drift = tokens > 0 ? (p.drift_zero * static_cast<double>(rows.zero_tokens) +
                                          p.drift_one * static_cast<double>(rows.one_tokens)) /
                                             tokens
                                       : 0.0;
  p.drift_horizon =
      mean_drift != 0 ? (kPi / 2) / std::abs(mean_drift) : std::numeric_limits<double>::infinity();
  return p;
}

// Longer horizon first; then the lower harmonic, then the longer drift horizon.
bool better(const PhasePairProbe& a, const PhasePairProbe& b) {
  if (a.horizon != b.horizon) return a.horizon > b.horizon;
  if (a.harmonic != b.harmonic) return a.harmonic < b.harmonic;
  return a.drift_horizon > b.drift_horizon;
}

}  // namespace

PhaseProbe parity_phase_probe(LanguageModel& model, const Batch& batch) {
  check_rows(batch, model->config().vocab_size);
  torch::NoGradGuard no_grad;
  PhaseProbe probe;
  probe.length = batch.cols;
  const Rows rows(batch);
  const at::Tensor tokens = torch::from_blob(const_cast<std::int64_t*>(batch.inputs.data()),
                                             {batch.rows, batch.cols}, at::kLong)
                                .clone();
  const std::vector<at::Tensor> inputs = model->mixer_inputs(tokens);
  std::vector<double> phase(static_cast<std::size_t>(batch.rows * batch.cols)), error(phase.size());
  for (std::int64_t layer = 0; layer < static_cast<std::int64_t>(inputs.size()); ++layer)
    for (auto& rope : model->selective_ropes(layer)) {
      // Δθ = ω ⊙ φ: [B, T, H, R] (ω is [H, R] when learnable, else [R]; both broadcast).
      const at::Tensor dtheta =
          (rope->phase_increments(inputs[static_cast<std::size_t>(layer)]).to(at::kDouble) *
           rope->omega().to(at::kDouble))
              .contiguous();
      const auto a = dtheta.accessor<double, 4>();
      const std::int64_t H = dtheta.size(2), R = dtheta.size(3);
      for (std::int64_t h = 0; h < H; ++h) {
        PhasePairProbe head_best;
        for (std::int64_t i = 0; i < R; ++i) {
          for (std::int64_t r = 0; r < batch.rows; ++r) {
            double sum = 0;  // Σ_{0<s≤t} Δθ_s
            for (std::int64_t t = 0; t < batch.cols; ++t) {
              if (t > 0) sum += a[r][t][h][i];
              phase[static_cast<std::size_t>(r * batch.cols + t)] = sum;
            }
          }
          PhasePairProbe best;
          for (int k = 1; k <= kMaxHarmonic; ++k) {
            const PhasePairProbe p = probe_pair(rows, phase, k, error);
            if (k == 1 || better(p, best)) best = p;
          }
          best.layer = layer, best.head = h, best.pair = i;
          probe.pairs.push_back(best);
          if (i == 0 || better(best, head_best)) head_best = best;
        }
        probe.heads.push_back(head_best);
      }
    }
  return probe;
}

namespace {

// A_a / ω (phase_probe.h) for each of the inputs x [ids, D]: the layer's own φ at the last of
// conv_size positions of one token, where the convolution has seen it with every tap.
// [ids, H·R], float64.
at::Tensor phase_per_token(nn::SelectiveRoPEImpl& rope, const at::Tensor& x) {
  const std::int64_t W = rope.options.conv_size();
  const at::Tensor rows = x.unsqueeze(1).expand({x.size(0), W, x.size(1)}).contiguous();
  return rope.phase_increments(rows).select(1, W - 1).reshape({x.size(0), -1}).to(at::kDouble);
}

// phasor::Error (op) unless every entry of `pairs` is a pair of layer 0 in range (H heads of R
// pairs), each (head, pair) once: what both edits ask of their argument.
void check_layer0_pairs(const std::string& op, const std::vector<PhasePairProbe>& pairs,
                        std::int64_t H, std::int64_t R) {
  std::set<std::pair<std::int64_t, std::int64_t>> seen;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const PhasePairProbe& p = pairs[i];
    const std::string entry = " (entry " + std::to_string(i) + ")";
    if (p.layer != 0)
      detail::fail(op, "pairs", "pairs of layer 0", "layer " + std::to_string(p.layer) + entry);
    if (p.head < 0 || p.head >= H || p.pair < 0 || p.pair >= R)
      detail::fail(
          op, "pairs",
          "heads in [0, " + std::to_string(H) + ") and pairs in [0, " + std::to_string(R) + ")",
          "head " + std::to_string(p.head) + ", pair " + std::to_string(p.pair) + entry);
    if (!seen.insert({p.head, p.pair}).second)
      detail::fail(
          op, "pairs", "each (head, pair) once",
          "head " + std::to_string(p.head) + ", pair " + std::to_string(p.pair) + " again" + entry);
  }
}

// The one Selective RoPE of layer 0, or phasor::Error (op) naming `model`.
nn::SelectiveRoPEImpl& layer0_selective_rope(const std::string& op, LanguageModel& model) {
  std::vector<nn::SelectiveRoPE> ropes = model->selective_ropes(0);
  if (ropes.size() != 1)
    detail::fail(op, "model", "one Selective RoPE in layer 0", std::to_string(ropes.size()));
  return *ropes[0];
}

}  // namespace

std::vector<PhaseDriftEdit> remove_parity_phase_drift(LanguageModel& model,
                                                      const std::vector<PhasePairProbe>& pairs) {
  const std::string op = "remove_parity_phase_drift";
  nn::SelectiveRoPEImpl& rope = layer0_selective_rope(op, model);
  const nn::SelectiveRoPEOptions& o = rope.options;
  std::string nonlinear;
  const auto add = [&nonlinear](const char* what) {
    nonlinear += (nonlinear.empty() ? "" : ", ") + std::string(what);
  };
  if (o.projection() != nn::PhaseProjection::low_rank) add("projection full_rank");
  if (o.conv_silu()) add("conv_silu true");
  if (o.gate() != nn::PhaseGate::none) add("a phase gate");
  if (!nonlinear.empty())
    detail::fail(op, "model",
                 "a linear phase path in layer 0's Selective RoPE (projection low_rank, conv_silu "
                 "false, gate none)",
                 nonlinear);
  const std::int64_t H = o.num_heads(), R = o.head_dim() / 2;
  check_layer0_pairs(op, pairs, H, R);
  for (std::size_t i = 0; i < pairs.size(); ++i)
    if (pairs[i].harmonic < 1 || pairs[i].harmonic > kMaxHarmonic)
      detail::fail(op, "pairs", "harmonics 1 … " + std::to_string(kMaxHarmonic),
                   std::to_string(pairs[i].harmonic) + " (entry " + std::to_string(i) + ")");
  torch::NoGradGuard no_grad;
  // Ids 0 and 1, and the BOS when the vocabulary has one: one row of the three (layer 0's mixer
  // input depends on the token alone).
  const std::int64_t ids = parity_vocabulary_has_bos(model) ? kParityBos + 1 : 2;
  const at::Tensor x = model->mixer_inputs(torch::arange(ids, at::kLong).unsqueeze(0))[0][0];
  // r_a = down(x̂_a), the rank-space vectors of the ids; the drifts before and after come from the
  // layer itself, and the check below refuses an edit that missed.
  const at::Tensor r = rope.down->forward(rope.normalized_input(x)).to(at::kDouble);  // [ids, rank]
  const at::Tensor gram = r.matmul(r.t());
  const at::Tensor eigenvalues = at::linalg_eigvalsh(gram);
  if (!(eigenvalues.min().item<double>() > 1e-12 * eigenvalues.max().item<double>()))
    detail::fail(op, "model",
                 "linearly independent rank-space vectors down(x̂) of the ids 0 … " +
                     std::to_string(ids - 1) + " in layer 0's Selective RoPE",
                 "a singular set (rank " + std::to_string(o.rank()) + ")");
  const at::Tensor dual = r.t().matmul(at::linalg_inv(gram));  // [rank, ids]: r_aᵀ z_b = δ_ab
  const at::Tensor taps = rope.conv->weight.to(at::kDouble).sum(1);  // [H·R]
  at::Tensor omega = rope.omega().to(at::kDouble);
  omega = (omega.dim() == 1 ? omega.unsqueeze(0).expand({H, R}) : omega).reshape({H * R});
  const at::Tensor before = phase_per_token(rope, x) * omega;  // A: [ids, H·R]
  at::Tensor up = rope.up->weight;                             // [H·R, rank], edited in place
  const at::Tensor as_trained = up.clone();                    // restored if the check fails
  std::vector<PhaseDriftEdit> edits;
  for (const PhasePairProbe& p : pairs) {
    const std::int64_t ch = p.head * R + p.pair;
    const int k = p.harmonic;
    PhaseDriftEdit e;
    e.head = p.head, e.pair = p.pair, e.harmonic = k;
    e.drift_zero = wrap(k * before[0][ch].item<double>()) / k;
    e.drift_one = wrap(k * before[1][ch].item<double>() - kPi) / k;
    const double scale = omega[ch].item<double>() * taps[ch].item<double>();
    if (!(std::abs(scale) > 0))
      detail::fail(op, "pairs", "pairs whose phase depends on the token (ω · Σ taps ≠ 0)",
                   "0 for head " + std::to_string(p.head) + ", pair " + std::to_string(p.pair));
    up[ch] +=
        (dual.select(1, 0) * (-e.drift_zero / scale) + dual.select(1, 1) * (-e.drift_one / scale))
            .to(up.scalar_type());
    edits.push_back(e);
  }
  // The edited layer's own increments: no drift left, the BOS's unmoved (to rounding).
  const at::Tensor after = phase_per_token(rope, x) * omega;
  const double eps = up.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                                                     : std::numeric_limits<float>::epsilon();
  for (const PhaseDriftEdit& e : edits) {
    const std::int64_t ch = e.head * R + e.pair;
    const int k = e.harmonic;
    const double tolerance = 4096 * eps * (1 + before.select(1, ch).abs().max().item<double>());
    double left = std::max(std::abs(wrap(k * after[0][ch].item<double>())),
                           std::abs(wrap(k * after[1][ch].item<double>() - kPi)));
    if (ids > kParityBos)
      left = std::max(left, std::abs(after[kParityBos][ch].item<double>() -
                                     before[kParityBos][ch].item<double>()));
    if (!(left <= tolerance)) {
      up.copy_(as_trained);
      throw Error(op + ": the edit of head " + std::to_string(e.head) + ", pair " +
                  std::to_string(e.pair) + " left " + std::to_string(left) +
                  " rad per token (tolerance " + std::to_string(tolerance) +
                  "): layer 0's phase path is not the one this edit assumes (phase_probe.h); "
                  "the model is left as it was");
    }
  }
  return edits;
}

std::vector<GateDecayEdit> remove_parity_gate_decay(LanguageModel& model,
                                                    const std::vector<PhasePairProbe>& pairs) {
  const std::string op = "remove_parity_gate_decay";
  nn::SelectiveRoPEImpl& rope = layer0_selective_rope(op, model);
  // The mixer that owns it: the layer's GatedLinearAttention (a Selective RoPE of another mixer
  // has no forget gate of this form).
  nn::GatedLinearAttentionImpl* gla = nullptr;
  for (const auto& m : model->modules(/*include_self=*/false))
    if (auto mixer = std::dynamic_pointer_cast<nn::GatedLinearAttentionImpl>(m))
      if (mixer->rope.get() == &rope) gla = mixer.get();
  if (!gla)
    detail::fail(op, "model", "layer 0's Selective RoPE in a GatedLinearAttention mixer",
                 "another mixer (" + model->config().mixer + ")");
  const nn::GatedLinearAttentionOptions& o = gla->options;
  const std::int64_t H = o.num_heads(), K = gla->head_k, R = K / 2;
  check_layer0_pairs(op, pairs, H, R);
  // A pair's two key channels, and its gk_up rows: one per pair when tied, else its channels'.
  const bool tied = o.pos_encoding() != nn::PosEncoding::none && o.tie_gate_pairs();
  const auto channels_of = [&](const PhasePairProbe& p) -> std::vector<std::int64_t> {
    if (o.rotary_layout() == RotaryLayout::half_split) return {p.pair, p.pair + R};
    return {2 * p.pair, 2 * p.pair + 1};
  };
  const auto rows_of = [&](const PhasePairProbe& p) -> std::vector<std::int64_t> {
    if (tied) return {p.head * R + p.pair};
    std::vector<std::int64_t> rows = channels_of(p);
    for (std::int64_t& row : rows) row += p.head * K;
    return rows;
  };
  torch::NoGradGuard no_grad;
  // One row of the ids 0, 1 (and the BOS): layer 0's gate depends on the token alone.
  const std::int64_t ids = parity_vocabulary_has_bos(model) ? kParityBos + 1 : 2;
  const at::Tensor x = model->mixer_inputs(torch::arange(ids, at::kLong).unsqueeze(0))[0];
  const at::Tensor before = gla->forget_gates(x)[0].to(at::kDouble);  // [ids, H, K]
  at::Tensor weight = gla->gk_up->weight, bias = gla->gk_up->bias;    // edited in place
  const at::Tensor weight_as_trained = weight.clone(), bias_as_trained = bias.clone();
  std::vector<GateDecayEdit> edits;
  for (const PhasePairProbe& p : pairs) {
    GateDecayEdit e;
    e.head = p.head, e.pair = p.pair;  // log gates from 0 (the struct's default) down
    for (const std::int64_t c : channels_of(p)) {
      e.log_gate_zero = std::min(e.log_gate_zero, before[0][p.head][c].item<double>());
      e.log_gate_one = std::min(e.log_gate_one, before[1][p.head][c].item<double>());
    }
    for (const std::int64_t row : rows_of(p)) {
      weight[row].zero_();
      bias[row].fill_(40.0);  // logsigmoid(40) ≈ −4·10⁻¹⁸
    }
    edits.push_back(e);
  }
  // The edited layer's own gates: a decay of exactly 1 for every id in the edited channels.
  const at::Tensor after = gla->forget_gates(x)[0].to(at::kDouble);
  for (const PhasePairProbe& p : pairs)
    for (const std::int64_t c : channels_of(p)) {
      const double decay = at::exp(after.select(1, p.head).select(1, c)).min().item<double>();
      if (!(decay == 1.0)) {
        weight.copy_(weight_as_trained);
        bias.copy_(bias_as_trained);
        throw Error(op + ": the edit of head " + std::to_string(p.head) + ", pair " +
                    std::to_string(p.pair) + " left a decay of " + std::to_string(decay) +
                    " per token (expected 1): layer 0's gate path is not the one this edit "
                    "assumes (phase_probe.h); the model is left as it was");
      }
    }
  return edits;
}

bool parity_vocabulary_has_bos(const LanguageModel& model) {
  return model->config().vocab_size > kParityBos;
}

nlohmann::json to_json(const PhaseProbe& probe) {
  nlohmann::json heads = nlohmann::json::array();
  for (const PhasePairProbe& p : probe.heads) {
    nlohmann::json horizons = nlohmann::json::array();
    for (const PhasePairProbe& q : probe.pairs)
      if (q.layer == p.layer && q.head == p.head) horizons.push_back(q.horizon);
    heads.push_back(
        {{"layer", p.layer},
         {"head", p.head},
         {"pair", p.pair},
         {"harmonic", p.harmonic},
         {"horizon", p.horizon},
         {"drift_zero", p.drift_zero},
         {"drift_one", p.drift_one},
         {"jitter", p.jitter},
         {"drift_horizon", std::isfinite(p.drift_horizon) ? nlohmann::json(p.drift_horizon)
                                                          : nlohmann::json(nullptr)},
         {"pair_horizons", horizons}});
  }
  return {{"length", probe.length}, {"heads", heads}};
}

}  // namespace phasor::tasks
