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

#include "phasor/distributed.h"
#include "phasor/torch.h"

namespace phasor::cp {

// ---- GLA, Gated DeltaNet and Selective RoPE phases ----------------------------------------------

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

}  // namespace phasor::cp
