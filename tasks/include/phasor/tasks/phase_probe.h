// phasor::tasks — the phases a trained model's Selective RoPE layers give parity rows, measured
// against the phases that track parity exactly (issue 16; docs/claims.md).
//
// The construction (tests/claims_construction_test.cpp) turns one rotation pair by π per 1-token
// and by 0 (mod 2π) per 0-token: the rotation between positions 0 and t is π times the number of
// 1-tokens in (0, t], and its cosine is that stretch's parity. A trained model has more ways to
// the same end, and the probe accepts each of them:
//  * a harmonic k: a pair that turns by π/k per 1-token (and by a multiple of 2π/k per 0-token)
//    counts the 1-tokens mod 2k, which gives their parity through cos kθ, sin kθ — a readout the
//    layer's MLP can form (trained GLA models use k = 2: quarter turns);
//  * an offset that depends on the last tokens: Selective RoPE's short convolution spreads a
//    token's increment over the next conv_size − 1 positions, so θ_t lags the full count by an
//    amount that depends on the last tokens, which the layer's own short convolutions on q and k
//    can undo.
// A phase that is off by δ per token drifts instead: its error grows by δ per token and, once it
// nears π/2, the rotation points at the wrong parity, however well the rest of the model reads it.
// For every (layer with Selective RoPE, head, rotation pair, harmonic k = 1 … 4), on rows of the
// harness's parity encoding (element ids 0 and 1, with or without a leading BOS, id 2):
//   Δθ_t  = ω ⊙ φ_t      the increment of position t (SelectiveRoPE's φ and ω; float64 from here)
//   e_t   = wrap(k·Σ_{0<s≤t} Δθ_s − π·n_t),  n_t = the number of 1-tokens at positions (0, t],
//           wrap(x) ∈ [−π, π) the angle x modulo 2π: the phase error at t against position 0
//   ê_t   = wrap(e_t − c(x_{t−2}, x_{t−1}, x_t)), c = the circular mean of e over the positions
//           t ≤ kCalibrationPositions with the same last three tokens (tokens before the row
//           count as a BOS): the error with the context's offset taken out, calibrated where no
//           drift has built up yet
// and reports
//   horizon     for a row, F = its first position with |ê_t| ≥ π/2 (the row length if none); the
//               largest m with F ≥ m for at least half of the rows. In positions, as data.h's
//               correct_prefix_length counts the positions a model gets right: the two compare
//               directly
//   drift_zero, drift_one  the slopes of the error path E_t (ê_t unwrapped: the sum of its
//               wrapped steps) in the number of 0-tokens and of 1-tokens (least squares with an
//               intercept, over every row and position): radians per token
//   jitter      the RMS residual of that fit: how far the error wanders about its drift
//   drift_horizon  (π/2) / |mean drift per position| (the two drifts weighted by how often 0 and
//               1 occur in the rows): how far the drift alone would carry; +inf without drift
// Per pair, the harmonic with the longest horizon (ties: the lower k); per head, the pair with the
// longest horizon (ties: the longer drift_horizon).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "phasor/tasks/data.h"
#include "phasor/tasks/model.h"

namespace phasor::tasks {

// Positions 1 … this many calibrate the context offsets c (see above).
inline constexpr std::int64_t kCalibrationPositions = 16;
inline constexpr int kMaxHarmonic = 4;

struct PhasePairProbe {
  std::int64_t layer = 0, head = 0, pair = 0;
  int harmonic = 1;  // k
  std::int64_t horizon = 0;
  double drift_zero = 0, drift_one = 0, jitter = 0, drift_horizon = 0;
};

struct PhaseProbe {
  std::int64_t length = 0;            // positions per row (the batch's cols)
  std::vector<PhasePairProbe> pairs;  // every (layer, head, pair) at its best harmonic;
                                      // layer-, head-, pair-major
  std::vector<PhasePairProbe> heads;  // per (layer, head) with Selective RoPE: its best pair
};

// The BOS id of parity rows (data.h's S2 word problem: |G| = 2).
inline constexpr std::int64_t kParityBos = 2;

// Whether `model`'s vocabulary holds the BOS id (more than two ids): the harness trains parity
// with a BOS exactly then, so a checkpoint's rows are made, and its BOS's phase kept, by this.
bool parity_vocabulary_has_bos(const LanguageModel& model);

// The probe of `model` on the parity rows `batch` (Batch::inputs: element ids 0 and 1, a BOS id 2
// allowed at position 0 only). Empty (no pairs, no heads) when the model has no Selective RoPE
// layer. phasor::Error (op "phase_probe") when the rows hold other ids or the model's vocabulary
// cannot read them. Runs without gradients; φ in the model's dtype.
PhaseProbe parity_phase_probe(LanguageModel& model, const Batch& batch);

// ---- Removing the drift -----------------------------------------------------------------------
// What extrapolation would be without the drift: an edit of a trained model's first layer that
// takes the drift out of chosen rotation pairs and leaves everything else as trained (issue 16's
// repair experiment; docs/claims.md "Drift and decay: what limits extrapolation").
//
// In layer 0 the mixer input x depends on the token alone, and with a linear phase path (low-rank
// projection, no SiLU after the convolution, no phase gate) every position holding token a adds,
// over the positions its convolution reaches, exactly
//   A_a = ω ⊙ (exp(b) + c + (Σ_j w_j) ⊙ p_a),   p_a = up(down(x̂_a))
// to the cumulative phase (w_j the convolution's taps, c its bias if any; A_a is read from the
// layer itself: its φ at the last of conv_size positions of token a). At the pair's harmonic k
// tracking parity exactly means k·A_0 ≡ 0 and k·A_1 ≡ π (mod 2π), so the drift per token is
// d_0 = wrap(k·A_0)/k and d_1 = wrap(k·A_1 − π)/k (wrap to [−π, π)). The edit moves the pair's
// row of `up` within the span dual to the inputs' rank-space vectors down(x̂_a), so that p_0 and
// p_1 change by −d_a / (ω Σ_j w_j) and the BOS's p (id 2, when the vocabulary has one) does not:
// afterwards k·A_0 ≡ 0 and k·A_1 ≡ π exactly (checked on the edited layer; ids above 2, which
// parity rows do not hold, may move).
struct PhaseDriftEdit {
  std::int64_t head = 0, pair = 0;
  int harmonic = 1;                      // k, as the probe entry gave it
  double drift_zero = 0, drift_one = 0;  // d_0, d_1 before the edit: radians per token
};

// Removes the drift of each of `pairs` (entries of parity_phase_probe(model, …).pairs, all of
// layer 0, each (head, pair) once) from `model` in place, as above; returns the drifts removed in
// the order given. phasor::Error (op "remove_parity_phase_drift") naming the argument when a pair
// is not in layer 0 or out of range, layer 0 has not exactly one Selective RoPE or its phase path
// is not linear (projection full_rank, conv_silu, a phase gate), the inputs' rank-space vectors
// are not linearly independent (rank < the number of ids), or a pair's convolution taps sum to 0
// (all before any edit); phasor::Error, with the model restored, should the edited layer's own
// increments still drift (a phase path this edit does not know).
std::vector<PhaseDriftEdit> remove_parity_phase_drift(LanguageModel& model,
                                                      const std::vector<PhasePairProbe>& pairs);

// ---- Removing the decay -----------------------------------------------------------------------
// The repair experiment's other edit: the forget gate of chosen rotation pairs set to 1, so that
// those pairs keep every token's phase however far back (the construction's gate 1), everything
// else as trained. Layer 0's mixer must be the GatedLinearAttention that owns its Selective RoPE.
// The edit zeroes the pair's rows of the gate's up-projection gk_up — one row with
// tie_gate_pairs, else the rows of the pair's two key channels, (i, i + K/2) half-split or
// (2i, 2i + 1) interleaved — and sets their biases to 40, so every token gets
//   log g = logsigmoid(40) / gate_logit_normalizer ≈ −4·10⁻¹⁸ / gate_logit_normalizer,
// a decay exp(log g) that is 1 in float and double (checked on the edited layer). A clamp_min
// floor (≤ 0) cannot lower it. With the drift edit as well, the pairs carry the construction's
// exact phases at gate 1 (docs/claims.md, "Drift and decay").
struct GateDecayEdit {
  std::int64_t head = 0, pair = 0;
  // The pair's log forget gate before the edit for a 0- and a 1-token (the lower of its two
  // channels when untied): the decay per token that the edit removes.
  double log_gate_zero = 0, log_gate_one = 0;
};

// Sets the forget gate of each of `pairs` (entries of parity_phase_probe(model, …).pairs, all of
// layer 0, each (head, pair) once) to 1 in `model`, as above; returns the gates removed in the
// order given. phasor::Error (op "remove_parity_gate_decay") naming the argument when a pair is
// not in layer 0 or out of range, or layer 0 has not exactly one Selective RoPE, owned by a
// GatedLinearAttention (all before any edit); phasor::Error, with the model restored, should the
// edited layer's gates for those pairs not be 0 (a gate path this edit does not know).
std::vector<GateDecayEdit> remove_parity_gate_decay(LanguageModel& model,
                                                    const std::vector<PhasePairProbe>& pairs);

// {"length", "heads": [{"layer", "head", "pair", "harmonic", "horizon", "drift_zero",
// "drift_one", "jitter", "drift_horizon" (null when infinite), "pair_horizons": [the horizon of
// every pair of the head, at its best harmonic]}, …]}.
nlohmann::json to_json(const PhaseProbe& probe);

}  // namespace phasor::tasks
