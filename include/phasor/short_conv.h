// Short causal depthwise convolution, forward and backward, as in fla's `ShortConvolution` /
// `causal_conv1d` (and `causal_conv1d_update` for decoding through a cache).
//
// For each sequence, channel d and token t (0-based within the sequence), with kernel width W:
//   z_t,d = bias_d + Σ_{w=0}^{W−1} weight_{d,w} · x_{t−(W−1)+w, d},      y_t,d = act(z_t,d)
// where act is the identity ("none") or SiLU (z·σ(z)), and an input at a position before the
// sequence start (t−(W−1)+w < 0) is read from the cache: initial_cache[n, d, W−1+(t−(W−1)+w)]
// (the last W−1 inputs of the sequence so far, oldest first), or 0 without a cache.
// final_cache[n, d, :] holds the last W−1 inputs of the extended sequence [initial_cache, x]:
// for a sequence shorter than W−1 it keeps the newest cached inputs, followed by the new tokens.
// So running the op token by token (or chunk by chunk), feeding final_cache back as
// initial_cache, gives exactly the outputs of one call over the whole sequence.
//
// Implementations (Impl) and the op name they report in errors:
//   reference  "short_conv_reference"  float64 loops straight from the equation above.
//   chunk      "causal_conv1d"         work items (sequence, block of channels) in parallel.
//   recurrent  "causal_conv1d_update"  the same kernel (a short convolution has no recurrent
//                                      state beyond the cache); the name for decoding calls.
// Each work item runs on one thread in a fixed order; dweight and dbias are reduced from
// per-item partials in a fixed order, so every result is bit-identical for any thread count.
//
// Layouts (any strides; float32, float64, bfloat16 or float16 for every floating argument, and they
// may differ; 16-bit values are converted to float32 on load):
//   x:             [B, T, D]  (channels last)
//   weight:        [D, W]     W ≥ 1
//   bias:          [D]        optional
//   initial_cache: [N, D, W−1] optional
//   cu_seqlens:    [N + 1] int32/int64, optional; packed variable-length batch (B must be 1);
//                  the causal window restarts at each sequence start. Without it N = B.
// The compute type is x's dtype (float32 accumulates in float32, float64 in float64), except for
// Impl::reference, which always computes in float64 (16-bit inputs compute in float32). All views
// on one device (phasor/common.h: Device); phasor/ops.h lists the implementations with CUDA
// kernels.
#pragma once

#include <string>

#include "phasor/common.h"

namespace phasor {

struct ShortConvParams {
  TensorView x;              // [B, T, D]
  TensorView weight;         // [D, W]
  TensorView bias;           // optional [D]
  TensorView initial_cache;  // optional [N, D, W−1]
  TensorView cu_seqlens;     // optional [N + 1]
  // "none" (also "identity" or "") or "silu" (also "swish"), as fla's `activation`.
  std::string activation = "none";
};

// Gradients. Each view is optional: an undefined view is not computed. dinitial_cache requires
// initial_cache (else phasor::Error). Shapes are those of the matching input; any float dtype.
// Every element of a requested view is written (overwritten, never accumulated into).
struct ShortConvGrads {
  TensorView dx, dweight, dbias, dinitial_cache;
};

// y: [B, T, D]; final_cache: [N, D, W−1], optional (undefined: not computed). final_cache may
// alias initial_cache (in-place cache update for decoding).
void short_conv_forward(const ShortConvParams& params, Impl impl, const TensorView& y,
                        const TensorView& final_cache = {});

// Backward of short_conv_forward. dy: [B, T, D]; d_final_cache: [N, D, W−1], optional, the
// gradient of the loss with respect to final_cache.
void short_conv_backward(const ShortConvParams& params, Impl impl, const TensorView& dy,
                         const TensorView& d_final_cache, const ShortConvGrads& grads);

}  // namespace phasor
