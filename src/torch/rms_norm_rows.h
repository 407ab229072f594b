// CPU loops of phasor::nn::rms_norm and rms_norm_gated (phasor/nn.h) over contiguous rows of
// float32 or float64: one pass over a row where the ATen expression takes one pass per operation
// (with a temporary each), which at the task harness's 64 channels was most of a norm's time.
// Plain C++ (Eigen for the row arithmetic), no LibTorch: nn.cpp hands it the tensors' data.
#pragma once

#include <cstdint>

namespace phasor::nn::detail {

// The gate's activation act in y = RMSNorm(x) · weight · act(gate): SiLU (z·σ(z), fla's "swish")
// or σ(z).
enum class GateActivation { silu, sigmoid };

// For each row i of x [rows, D] (row-major, contiguous), with weight [D] and, when gate is not
// null, gate [rows, D]:
//   r_i = (mean_j x_ij² + eps)^(−1/2),   y_ij = x_ij · r_i · weight_j [· act(gate_ij)].
// Writes y [rows, D] and r [rows]. Rows run in parallel (phasor's threads); each row's result
// does not depend on the thread count.
template <class S>
void rms_norm_rows_forward(const S* x, const S* gate, GateActivation act, const S* weight,
                           std::int64_t rows, std::int64_t D, double eps, S* y, S* r);

// The gradients, given dy [rows, D] and the forward's r, with n = x · r and a = act(gate) (1
// without a gate):
//   dn = dy ⊙ weight ⊙ a,   dx = r ⊙ (dn − n ⊙ mean(dn ⊙ n)),
//   dgate = dy ⊙ n ⊙ weight ⊙ act'(gate),   dweight = Σ_rows dy ⊙ n ⊙ a
// (∂r/∂x_j = −r³ x_j / D; silu' = σ (1 + z (1 − σ)), σ' = σ (1 − σ)). A null output is not
// computed (dgate needs a gate). dweight sums fixed blocks of rows, then the blocks in order:
// the same bits for any thread count.
template <class S>
void rms_norm_rows_backward(const S* x, const S* gate, GateActivation act, const S* weight,
                            const S* r, const S* dy, std::int64_t rows, std::int64_t D, S* dx,
                            S* dgate, S* dweight);

}  // namespace phasor::nn::detail
