// Context parallelism: one sequence split across the ranks of a c10d process group, each rank
// holding a contiguous slice of the tokens (rank r the r-th slice; slices may differ in length,
// and may be empty). Every function is the phasor/torch.h op of the same name with one more
// argument, the group, and gives each rank the outputs of its own slice — equal to the slice of
// the single-process result — with autograd through the communication (backward included).
//
//   #include <phasor/context_parallel.h>  // CMake: target_link_libraries(app PRIVATE
//   phasor::distributed) auto group = phasor::distributed::init_process_group(); auto [o,
//   final_state] = phasor::cp::chunk_gla(q_slice, k_slice, v_slice, g_slice, group);
//
// Every collective is c10d's, on the group given (Gloo on CPUs).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <memory>
#include <string>
#include <tuple>

#include "phasor/distributed.h"
#include "phasor/torch.h"

namespace phasor::nn {
struct ContextParallel;  // phasor/nn.h
}  // namespace phasor::nn

namespace phasor::cp {

// ---- GLA, Gated DeltaNet and Selective RoPE phases ----------------------------------------------
// Arguments are those of the phasor/torch.h op of the same name, with these differences:
//  - q, k, v, g, beta, theta (and phi): THIS rank's slice [B, T_r, ...] of the tokens; T_r may
//    differ between ranks and may be 0. Every other dimension, the dtypes and every option (scale,
//    chunk_size, rotary_layout, impl, use_qk_l2norm_in_kernel, output_final_state, which optional
//    arguments are given) must agree across ranks; a rank's offset in the sequence is the sum of
//    the lengths of the slices before it (an allgather of the lengths).
//  - cu_seqlens: the GLOBAL packed offsets [N + 1] of the whole batch (the same on every rank,
//    cu_seqlens[N] = Σ_r T_r; B must be 1). Sequences may straddle any number of rank boundaries,
//    start exactly at one, or be empty. Without cu_seqlens each of the B rows is one sequence
//    running through every rank.
//  - initial_state: [N, H, K, V] (GLA) or [N, HV, K, V] (Gated DeltaNet), the same on every rank
//    (it enters where each sequence starts). final_state [N, ..., K, V] is returned identical on
//    every rank.
//  - theta: this rank's slice of the GLOBAL rotation angles (e.g. cp::selective_rope_phases
//    below). The states are kept in the frame of zero angles, so no phase crosses a rank boundary
//    inside the attention op itself.
//  - group: the process group whose ranks hold the slices (rank r the r-th slice).
// Returns (o of this slice [B, T_r, H or HV, V], final_state).
//
// Method (exact up to floating-point rounding; no new kernel). Both recurrences are affine in
// the state S_in a piece of a sequence starts from: o_t = o⁰_t + S_inᵀ A_t and
// S_out = S⁰ + P S_in, where o⁰, S⁰ are the results from a zero state, P [K, K] (per head) the
// piece's state transition and A_t = scale · P_{≤t}ᵀ q'_t. One call of the single-process op with
// the values augmented to [v | 0_K] and the initial state [0 | I_K] gives [o⁰ | A] and [S⁰ | P].
// The incoming state of each rank is then a scan over the ranks of the affine maps
// C_r = P_r C_{r−1} + S⁰_r (one allgather of the maps: O(R) bytes and O(R·H·K²V) work per rank
// for R ranks, where a Hillis–Steele scan of send/recv would take O(log R) rounds), and each rank
// corrects its outputs with one GEMM per head. The backward pass is the
// reverse scan of the state gradients (G_{r−1} = P_rᵀ G_r + Σ_t A_t do_tᵀ) and one backward call
// of the augmented op. GLA's transition is diagonal (P_{≤t} = diag(exp(Σ_{s≤t} g_s))), so for GLA
// A_t = scale · exp(Σ g) ⊙ q'_t comes from elementwise torch ops and the op runs on V columns
// only. Cost per rank: the single-process op on T_r tokens (Gated DeltaNet: with V + K value
// columns, twice the work for K = V), the correction (2·K·V multiply-adds per continuing token
// and head), plus the exchange of R maps of H·K·(K + V) numbers.
//
// Autograd: every input that requires grad gets its gradient (q, k, v, g, beta, theta,
// initial_state). final_state is replicated: its incoming gradient must be the same on every rank
// (the gradient of one loss) and is counted once; initial_state's gradient is returned whole and
// identical on every rank. The backward pass runs collectives, so every rank must run it (as with
// any distributed autograd): a rank whose loss does not use the outputs still calls backward on
// a zero multiple of them. First order only.
//
// Errors: c10::Error naming the op ("cp::chunk_gla", ...), the argument and, for arguments that
// disagree across ranks, the ranks, raised on EVERY rank (the checks are exchanged before any
// work), e.g. "cp::chunk_gla: argument 'cu_seqlens': expected cu_seqlens[N] = 30 (the sum of the
// ranks' slice lengths), got 28". A value that only the single-process op checks (e.g. a positive
// log gate) fails on its rank with the op's own error, and on the other ranks with an error
// naming that rank.

OutputAndState gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& g, Impl impl, c10::optional<double> scale,
                   const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                   const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size,
                   const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                   const distributed::ProcessGroupPtr& group);

OutputAndState chunk_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& g, c10::optional<double> scale,
                         const c10::optional<at::Tensor>& initial_state, bool output_final_state,
                         const c10::optional<at::Tensor>& cu_seqlens, std::int64_t chunk_size,
                         const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                         const distributed::ProcessGroupPtr& group);

OutputAndState fused_recurrent_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, c10::optional<double> scale,
                                   const c10::optional<at::Tensor>& initial_state,
                                   bool output_final_state,
                                   const c10::optional<at::Tensor>& cu_seqlens,
                                   const c10::optional<at::Tensor>& theta,
                                   RotaryLayout rotary_layout,
                                   const distributed::ProcessGroupPtr& group);

// Gated DeltaNet: v [B, T_r, HV, V] with HV a multiple of H; g, beta [B, T_r, HV].
OutputAndState gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& g, const at::Tensor& beta, Impl impl,
                                c10::optional<double> scale,
                                const c10::optional<at::Tensor>& initial_state,
                                bool output_final_state,
                                const c10::optional<at::Tensor>& cu_seqlens,
                                bool use_qk_l2norm_in_kernel, std::int64_t chunk_size,
                                const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                                const distributed::ProcessGroupPtr& group);

OutputAndState chunk_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, c10::optional<double> scale,
    const c10::optional<at::Tensor>& initial_state, bool output_final_state,
    const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
    std::int64_t chunk_size, const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
    const distributed::ProcessGroupPtr& group);

OutputAndState fused_recurrent_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, c10::optional<double> scale,
    const c10::optional<at::Tensor>& initial_state, bool output_final_state,
    const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
    const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
    const distributed::ProcessGroupPtr& group);

// Selective RoPE phases θ_t = ω ⊙ (θ_0 + Σ_{s ≤ t} φ_s) with the running phase continued across
// the ranks: rank r starts each sequence that began before its slice from θ_0 plus the φ summed
// over the earlier ranks' pieces of it (an additive scan over ranks, exchanged by one allgather).
// phi: this rank's slice [B, T_r, H, R]; omega [H, R] or [R] and initial_phase [N, H, R]: the
// same on every rank; cu_seqlens: the global offsets as above. Returns (theta of this slice
// [B, T_r, H, R], final_phase [N, H, R] identical on every rank). Differentiable in phi, omega
// and initial_phase (their gradients summed over ranks: omega's and initial_phase's are returned
// whole on every rank; final_phase's incoming gradient counted once, as above).
std::tuple<at::Tensor, c10::optional<at::Tensor>> selective_rope_phases(
    const at::Tensor& phi, const at::Tensor& omega, const c10::optional<at::Tensor>& initial_phase,
    bool output_final_phase, const c10::optional<at::Tensor>& cu_seqlens,
    const distributed::ProcessGroupPtr& group);

// ---- Forgetting attention (FoX) -----------------------------------------------------------------
// phasor::forgetting_attn (phasor/torch.h, phasor/forgetting_attn.h for the equations) on a
// sequence split across the ranks of `group`: rank r passes its contiguous slice [B, T_r, ...] of
// every per-token tensor (q, k, v, g, theta, bias_q_slope, bias_k_slope; T_r may differ between
// ranks and may be 0) and gets its slice of o, [B, T_r, HQ, V], equal to the slice of the
// single-process result; autograd gives each rank the gradients of its slices of q, k, v, g,
// theta and the slopes. Every rank must call it (and run backward) together, with the same B,
// heads, K, V, dtypes, scale, window_size, impl, rotary_layout, cu_seqlens and the same optional
// arguments given: a mismatch, or bad input on any rank, raises a c10::Error on every rank (naming
// "cp::<op>", the argument and the rank) instead of leaving the others waiting.
//   cu_seqlens: optional GLOBAL packed offsets [N + 1] of the whole concatenated sequence (the
//               same tensor on every rank; B must be 1); sequences may straddle rank boundaries,
//               span several ranks, or be empty. Without it each batch row is one sequence of
//               length Σ_r T_r.
//   impl:       Impl::chunk or Impl::recurrent: the kernel of each rank's own (diagonal) block;
//               Impl::reference is refused (its backward cannot take the merged o and lse).
// Method (ring attention with the online-softmax merge; src/distributed/
// context_parallel_forgetting_attn.cpp has the equations): each rank computes its diagonal block
// with the core kernel (o and lse), receives from each earlier rank the keys its queries can see
// (k', v, the key-side gate sums, the key slopes; with a window only the last window_size − 1
// positions before its slice) one block at a time, and merges each block's softmax into (o, lse).
// Backward: the diagonal block by the core backward given the merged o and lse, the cross blocks
// recomputed from the same messages; key-side gradients go back to the rank that owns the keys.
// Exchanged per call (forward; the backward sends the keys again plus their gradients): rank b
// sends to each later rank r the rows of its keys r can see — without a window all of them — so
// per rank at most (R − 1) slices of k, v and the gate and slope columns; a receiver holds at
// most two blocks at a time (the one computed, the next in flight); in the backward a rank also
// holds the buffers of the gradients its readers return (up to (R − 1) slices for rank 0). The
// gates of a key block's own positions are sent as suffix sums, so the logits never subtract two
// cumulative sums (exact for −inf gates). CPU tensors (the cross blocks run on the CPU).
at::Tensor forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& g, Impl impl, c10::optional<double> scale,
                           c10::optional<std::int64_t> window_size,
                           const c10::optional<at::Tensor>& cu_seqlens, std::int64_t block_size,
                           const c10::optional<at::Tensor>& theta, RotaryLayout rotary_layout,
                           const c10::optional<at::Tensor>& bias_q_slope,
                           const c10::optional<at::Tensor>& bias_k_slope,
                           const distributed::ProcessGroupPtr& group);

// forgetting_attn(..., Impl::chunk, ..., group).
at::Tensor parallel_forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, c10::optional<double> scale,
                                    c10::optional<std::int64_t> window_size,
                                    const c10::optional<at::Tensor>& cu_seqlens,
                                    std::int64_t block_size, const c10::optional<at::Tensor>& theta,
                                    RotaryLayout rotary_layout,
                                    const c10::optional<at::Tensor>& bias_q_slope,
                                    const c10::optional<at::Tensor>& bias_k_slope,
                                    const distributed::ProcessGroupPtr& group);

// ---- Short convolution and layers --------------------------------------------------------------
// phasor::causal_conv1d (phasor/torch.h: y_t = act(bias + Σ_{j<W} weight[:, j] ⊙ x_{t−W+1+j})) on a
// sequence split across the ranks of `group`:
//   x:             THIS rank's slice [B, T_r, D] (T_r may differ between ranks and may be 0).
//   weight [D, W], bias [D] (optional), activation ("none" or "silu"), output_final_state: the
//                  same on every rank.
//   initial_state: optional [N, D, W−1], the cache of the inputs before each sequence, the same on
//                  every rank.
//   cu_seqlens:    optional GLOBAL packed offsets [N + 1] (the same on every rank, B = 1);
//                  sequences may straddle rank boundaries. Without it each row is one sequence.
// Returns (y of this slice [B, T_r, D], final_state [N, D, W−1] — the last W−1 inputs of each
// whole sequence — identical on every rank, present iff output_final_state).
// Method: a halo exchange. The W−1 inputs before a slice always lie in the last W−1 tokens of the
// ranks that own them, so one allgather of every rank's last min(T_r, W−1) inputs ([B, W−1, D]
// per rank) gives each rank the cache its first piece continues from (several ranks' tokens when
// slices are shorter than W−1; the initial state before a sequence's start); the single-process
// op then runs from that cache. final_state comes from the rank holding each sequence's end (one
// allreduce). Backward: the op's backward on each rank and one allreduce that returns each halo
// input's gradient to its owner. Exact (the same arithmetic as one process).
// Autograd: x gets its slice's gradient; weight, bias and initial_state get their gradients whole
// and identical on every rank; final_state's incoming gradient must be the same on every rank and
// is counted once. Every rank must run backward (it is a collective). First order only.
// Errors: c10::Error naming "cp::causal_conv1d" and the argument, raised on every rank.
std::tuple<at::Tensor, c10::optional<at::Tensor>> causal_conv1d(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const std::string& activation, const c10::optional<at::Tensor>& initial_state,
    bool output_final_state, const c10::optional<at::Tensor>& cu_seqlens,
    const distributed::ProcessGroupPtr& group);

// The context of the phasor::nn layers' option context_parallel (phasor/nn.h, "Context
// parallelism") on `group`: its methods are the cp:: ops above on that group, with the gradients
// of replicated arguments (conv weight and bias, Selective RoPE's ω, initial states) kept on rank
// 0 only, so that every parameter gradient of a layer is a per-rank share whose sum over the ranks
// (an allreduce, as data-parallel training does) is the single-process gradient.
//   auto group = phasor::distributed::init_process_group();
//   phasor::nn::GatedDeltaNet layer(phasor::nn::GatedDeltaNetOptions(256, 4, 64)
//                                       .context_parallel(phasor::cp::layer_context(group)));
//   at::Tensor y_slice = layer->forward(x_slice);  // x_slice: this rank's [B, T_r, 256]
std::shared_ptr<nn::ContextParallel> layer_context(const distributed::ProcessGroupPtr& group);

}  // namespace phasor::cp
