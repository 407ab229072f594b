// Gated DeltaNet (gated delta rule), forward and backward, as in fla's `chunk_gated_delta_rule` /
// `fused_recurrent_gated_delta_rule`.
//
// For each sequence and value head (state S ∈ R^{K×V}), decay first, then the delta correction:
//   S'  = exp(g_t) S_{t−1}
//   S_t = S' + β_t k_t (v_t − S'ᵀ k_t)ᵀ
//   o_t = S_tᵀ (scale · q_t)
// g is a scalar log-decay per token and value head (≤ 0; −inf allowed), β ∈ [0, 2] (β > 1 gives
// the transition negative eigenvalues). With use_qk_l2norm_in_kernel, q and k are first divided
// by sqrt(Σx² + 1e-6) (and the backward differentiates through that normalisation).
// Grouped value heads: HV is a multiple of H, and value head hv reads q/k head hv / (HV / H).
// The chunked kernel uses the WY / UT-transform representation of the product of the chunk's
// generalised Householder transitions.
//
// Layouts (any strides; float32 or float64):
//   q, k:          [B, T, H, K]
//   v:             [B, T, HV, V]
//   g, beta:       [B, T, HV]
//   initial_state: [N, HV, K, V]  optional
//   cu_seqlens:    [N + 1] int32/int64, optional (B must be 1; see gla.h)
#pragma once

#include <cstdint>
#include <optional>

#include "phasor/common.h"

namespace phasor {

struct GatedDeltaRuleParams {
  TensorView q, k, v, g, beta;
  TensorView initial_state;    // optional [N, HV, K, V]
  TensorView cu_seqlens;       // optional [N + 1]
  std::optional<double> scale;  // default K^-1/2
  bool use_qk_l2norm_in_kernel = false;
  std::int64_t chunk_size = 64;  // Impl::chunk only
};

// Each view optional (undefined: not computed); dh0 requires initial_state.
struct GatedDeltaRuleGrads {
  TensorView dq, dk, dv, dg, dbeta, dh0;
};

// o: [B, T, HV, V]; final_state: [N, HV, K, V], optional; may alias initial_state.
void gated_delta_rule_forward(const GatedDeltaRuleParams& params, Impl impl, const TensorView& o,
                              const TensorView& final_state = {});

// d_o: [B, T, HV, V]; d_final_state: [N, HV, K, V], optional.
void gated_delta_rule_backward(const GatedDeltaRuleParams& params, Impl impl,
                               const TensorView& d_o, const TensorView& d_final_state,
                               const GatedDeltaRuleGrads& grads);

}  // namespace phasor
