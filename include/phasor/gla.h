// Gated Linear Attention (GLA), forward and backward, as in fla's `chunk_gla` /
// `fused_recurrent_gla`.
//
// For each sequence and head, with state S ∈ R^{K×V}:
//   S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,      o_t = S_tᵀ (scale · q_t),      S_0 = initial_state.
// g holds natural-log forget gates (≤ 0, per token and key channel); g = −inf (a gate of exactly 0)
// is allowed. Strong gates are handled without exp(+big) factorisations: the chunked kernel only
// ever exponentiates non-positive cumulative sums, and sums gates within a chunk, never over the
// whole sequence.
//
// Layouts (any strides; float32 or float64 for every floating argument, and they may differ):
//   q, k:          [B, T, H, K]
//   v:             [B, T, H, V]
//   g:             [B, T, H, K]
//   initial_state: [N, H, K, V]  optional
//   cu_seqlens:    [N + 1] int32/int64, optional; packed variable-length batch. B must be 1, the
//                  sequences [cu[n], cu[n+1]) are independent (empty ones are allowed). Without
//                  it N = B.
// The compute type is q's dtype (float32 accumulates in float32, float64 in float64), except for
// Impl::reference, which always computes in float64. All views must be on the CPU.
#pragma once

#include <cstdint>
#include <optional>

#include "phasor/common.h"

namespace phasor {

struct GlaParams {
  TensorView q, k, v, g;
  TensorView initial_state;    // optional [N, H, K, V]
  TensorView cu_seqlens;       // optional [N + 1]
  std::optional<double> scale;  // default K^-1/2
  std::int64_t chunk_size = 64;  // Impl::chunk only; any positive value
};

// Gradients. Each view is optional: an undefined view is not computed. dh0 requires
// initial_state. Shapes are those of the matching input; any float dtype.
struct GlaGrads {
  TensorView dq, dk, dv, dg, dh0;
};

// o: [B, T, H, V]; final_state: [N, H, K, V], optional (undefined: not computed).
// final_state may alias initial_state (in-place state update, e.g. for decoding one token at a
// time with Impl::recurrent and T = 1).
void gla_forward(const GlaParams& params, Impl impl, const TensorView& o,
                 const TensorView& final_state = {});

// Backward of gla_forward. d_o: [B, T, H, V], the gradient of the loss with respect to o;
// d_final_state: [N, H, K, V], optional, the gradient with respect to final_state (dht in fla).
void gla_backward(const GlaParams& params, Impl impl, const TensorView& d_o,
                  const TensorView& d_final_state, const GlaGrads& grads);

}  // namespace phasor
