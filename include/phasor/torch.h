// phasor LibTorch layer: fla-named entry points on at::Tensor, differentiable through autograd.
//
//   #include <phasor/torch.h>        // CMake: target_link_libraries(app PRIVATE phasor::torch)
//   auto [o, final_state] = phasor::chunk_gla(q, k, v, g, /*scale=*/{}, h0, true);
//   (o * o).sum().backward();        // fills q.grad(), k.grad(), v.grad(), g.grad(), h0.grad()
//
// Semantics, argument names and layouts are fla's and those of the core headers
// (phasor/gla.h, phasor/gated_delta_rule.h, phasor/forgetting_attn.h), which give the equations.
//
// Tensors, for every function below:
//  - device: CPU only.
//  - floating arguments (q, k, v, g, beta, initial_state) may be float32, float64, float16 or
//    bfloat16, with any strides (they go to the kernels without a copy when float32/float64).
//    float16/bfloat16 arguments are first converted to float32 (differentiably) and computed in
//    float32; o is then cast back to q's dtype.
//  - the compute type is q's dtype after that conversion: float32 computes and accumulates in
//    float32, float64 in float64 (Impl::reference always computes in float64).
//  - o has q's dtype. final_state is float64 when q is float64, else float32.
//  - cu_seqlens: int32 or int64 [N + 1], packed variable-length sequences (B must be 1); N is the
//    number of sequences. Without it, N = B.
//  - scale: defaults to K^-1/2.
//
// Autograd: every floating input that requires grad gets its gradient (q, k, v, g, beta,
// initial_state). The gradient flowing into final_state (fla's dht) is used when final_state
// takes part in the loss; gradients of unused outputs count as zero. The backward pass runs the
// core *_backward with the same Impl as the forward. Gradients are first order only (the
// backward pass itself is not differentiable).
//
// Errors: bad input raises c10::Error (as TORCH_CHECK does) whose message names the op, the
// argument, what was expected and what was given, e.g.
//   "chunk_gla: argument 'k': expected shape [B=1, T=10, H=4, K=32], got shape [1, 10, 4, 16]".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "phasor/common.h"
#include "phasor/favor.h"
#include "phasor/forgetting_attn.h"

namespace phasor {

// (o, final_state): final_state is present iff output_final_state was set.
using OutputAndState = std::tuple<at::Tensor, c10::optional<at::Tensor>>;

// Rotation (every attention op below): theta, optional [B, T, H, K/2] (H: the q/k heads; for
// forgetting attention the KEY heads, shared by each query group), rotates q_t and k_t by θ_t
// inside the kernel, in rotary_layout (see phasor/common.h); theta receives a gradient. Build
// theta with selective_rope_phases (Selective RoPE) or rope_angles (RoPE) below.

// ---- Gated Linear Attention ---------------------------------------------------------------------
// q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [N, H, K, V]; o: [B, T, H, V];
// final_state: [N, H, K, V]. g: log forget gates (≤ 0, −inf allowed), per token and key channel.
// chunk_size: Impl::chunk only, any positive value.
OutputAndState gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& g, Impl impl, c10::optional<double> scale = c10::nullopt,
                   const c10::optional<at::Tensor>& initial_state = c10::nullopt,
                   bool output_final_state = false,
                   const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                   std::int64_t chunk_size = 64,
                   const c10::optional<at::Tensor>& theta = c10::nullopt,
                   RotaryLayout rotary_layout = RotaryLayout::half_split);

// gla(..., Impl::chunk, ...).
OutputAndState chunk_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& g, c10::optional<double> scale = c10::nullopt,
                         const c10::optional<at::Tensor>& initial_state = c10::nullopt,
                         bool output_final_state = false,
                         const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                         std::int64_t chunk_size = 64,
                         const c10::optional<at::Tensor>& theta = c10::nullopt,
                         RotaryLayout rotary_layout = RotaryLayout::half_split);

// gla(..., Impl::recurrent, ...).
OutputAndState fused_recurrent_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, c10::optional<double> scale = c10::nullopt,
                                   const c10::optional<at::Tensor>& initial_state = c10::nullopt,
                                   bool output_final_state = false,
                                   const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                                   const c10::optional<at::Tensor>& theta = c10::nullopt,
                                   RotaryLayout rotary_layout = RotaryLayout::half_split);

// ---- Gated DeltaNet -----------------------------------------------------------------------------
// q, k: [B, T, H, K]; v: [B, T, HV, V] (HV a multiple of H; value head hv reads q/k head
// hv / (HV / H)); g, beta: [B, T, HV]; initial_state: [N, HV, K, V]; o: [B, T, HV, V];
// final_state: [N, HV, K, V]. g: scalar log decay per token and head (≤ 0); beta ∈ [0, 2].
// use_qk_l2norm_in_kernel: divide q and k by sqrt(Σx² + 1e-6) first (differentiated through).
OutputAndState gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& g, const at::Tensor& beta, Impl impl,
                                c10::optional<double> scale = c10::nullopt,
                                const c10::optional<at::Tensor>& initial_state = c10::nullopt,
                                bool output_final_state = false,
                                const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                                bool use_qk_l2norm_in_kernel = false, std::int64_t chunk_size = 64,
                                const c10::optional<at::Tensor>& theta = c10::nullopt,
                                RotaryLayout rotary_layout = RotaryLayout::half_split);

// gated_delta_rule(..., Impl::chunk, ...).
OutputAndState chunk_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta,
                                      c10::optional<double> scale = c10::nullopt,
                                      const c10::optional<at::Tensor>& initial_state = c10::nullopt,
                                      bool output_final_state = false,
                                      const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                                      bool use_qk_l2norm_in_kernel = false,
                                      std::int64_t chunk_size = 64,
                                      const c10::optional<at::Tensor>& theta = c10::nullopt,
                                      RotaryLayout rotary_layout = RotaryLayout::half_split);

// gated_delta_rule(..., Impl::recurrent, ...).
OutputAndState fused_recurrent_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, c10::optional<double> scale = c10::nullopt,
    const c10::optional<at::Tensor>& initial_state = c10::nullopt, bool output_final_state = false,
    const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
    bool use_qk_l2norm_in_kernel = false, const c10::optional<at::Tensor>& theta = c10::nullopt,
    RotaryLayout rotary_layout = RotaryLayout::half_split);

// ---- Forgetting attention (FoX) -----------------------------------------------------------------
// q: [B, T, HQ, K]; k: [B, T, H, K]; v: [B, T, H, V] (HQ a multiple of H); g: [B, T, HQ], log
// forget gates (≤ 0); o: [B, T, HQ, V]. window_size: attend to the last window_size tokens
// (≥ 1), or to the whole causal prefix when absent. block_size: Impl::chunk tile size.
// Impl::chunk is the tiled flash-style kernel, Impl::recurrent the token-by-token decode path.
// Additive GRAPE slopes (phasor/forgetting_attn.h), optional and differentiable: the logit of
// query i and key j (positions within the sequence) gets −(i − j)(a_i + b_j), with
// bias_q_slope a: [B, T, HQ] and bias_k_slope b: [B, T, H] (key/value head, shared by its query
// group). ALiBi: a = the head's slope m_h at every token. GRAPE-A-QK (GRAPE Eq. 4.6):
// a_i = ω·softplus(vᵀq_i/√K), b_j = ω·softplus(uᵀk_j/√K), computed by the caller with autograd.
at::Tensor forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& g, Impl impl,
                           c10::optional<double> scale = c10::nullopt,
                           c10::optional<std::int64_t> window_size = c10::nullopt,
                           const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                           std::int64_t block_size = 64,
                           const c10::optional<at::Tensor>& theta = c10::nullopt,
                           RotaryLayout rotary_layout = RotaryLayout::half_split,
                           const c10::optional<at::Tensor>& bias_q_slope = c10::nullopt,
                           const c10::optional<at::Tensor>& bias_k_slope = c10::nullopt);

// forgetting_attn(..., Impl::chunk, ...).
at::Tensor parallel_forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, c10::optional<double> scale = c10::nullopt,
                                    c10::optional<std::int64_t> window_size = c10::nullopt,
                                    const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                                    std::int64_t block_size = 64,
                                    const c10::optional<at::Tensor>& theta = c10::nullopt,
                                    RotaryLayout rotary_layout = RotaryLayout::half_split,
                                    const c10::optional<at::Tensor>& bias_q_slope = c10::nullopt,
                                    const c10::optional<at::Tensor>& bias_k_slope = c10::nullopt);

// ---- Rotary position embeddings and short convolution (phasor/rotary.h, phasor/short_conv.h) ----
// Selective RoPE cumulative phases θ_t = ω ⊙ (θ_0 + Σ_{s ≤ t} φ_s), restarting per sequence.
// phi: [B, T, H, R]; omega: [H, R] or [R]; initial_phase: [N, H, R]. Returns (theta [B, T, H, R]
// in phi's dtype, final_phase [N, H, R] un-multiplied by ω, present iff output_final_phase).
// Differentiable in phi, omega and initial_phase (final_phase included).
std::tuple<at::Tensor, c10::optional<at::Tensor>> selective_rope_phases(
    const at::Tensor& phi, const at::Tensor& omega,
    const c10::optional<at::Tensor>& initial_phase = c10::nullopt, bool output_final_phase = false,
    const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt);

// Standard RoPE angles θ[b, t, i] = (offset + position in its sequence) · base^(−2i/K), shape
// [B, T, K/2] (shared by heads), dtype float32 or float64.
at::Tensor rope_angles(std::int64_t batch, std::int64_t seq_len, std::int64_t head_dim,
                       double base = 10000.0, std::int64_t offset = 0,
                       const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                       at::ScalarType dtype = at::kFloat);

// x: [B, T, H, K] rotated by theta: [B, T, H, K/2], or [B, T, K/2] shared by all heads.
// Differentiable in x and theta. Returns x's dtype (float16/bfloat16 computed in float32).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& theta,
                        RotaryLayout rotary_layout = RotaryLayout::half_split);

// Short causal depthwise convolution (fla's causal_conv1d): x [B, T, D], weight [D, W], bias [D],
// activation "none" or "silu", initial_state: the cache [N, D, W−1] of the last inputs. Returns
// (y [B, T, D], final_state [N, D, W−1] present iff output_final_state). Differentiable in x,
// weight, bias and initial_state.
std::tuple<at::Tensor, c10::optional<at::Tensor>> causal_conv1d(
    const at::Tensor& x, const at::Tensor& weight,
    const c10::optional<at::Tensor>& bias = c10::nullopt, const std::string& activation = "none",
    const c10::optional<at::Tensor>& initial_state = c10::nullopt, bool output_final_state = false,
    const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt);

// FoX decoding with a key/value cache (wraps phasor::ForgettingAttnCache): feed one token per
// batch row at a time; o equals the corresponding row of parallel_forgetting_attn over all tokens
// fed so far. Inference only: step() records no autograd graph.
class ForgettingAttnDecoder {
 public:
  // batch B, query heads HQ, key/value heads H (HQ a multiple of H), key dim K, value dim V.
  ForgettingAttnDecoder(std::int64_t batch, std::int64_t num_q_heads, std::int64_t num_kv_heads,
                        std::int64_t head_dim, std::int64_t value_dim,
                        c10::optional<std::int64_t> window_size = c10::nullopt,
                        c10::optional<double> scale = c10::nullopt);

  // q: [B, 1, HQ, K], k: [B, 1, H, K], v: [B, 1, H, V], g: [B, 1, HQ] (CPU, any float dtype);
  // theta: [B, 1, H, K/2], optional rotation angles of this token (give them at every step or
  // at none). bias_q_slope: [B, 1, HQ], bias_k_slope: [B, 1, H], optional additive GRAPE slopes
  // of this token (as forgetting_attn; a missing one counts as 0; positions are the number of
  // tokens fed since construction or reset()). Returns o: [B, 1, HQ, V] in q's dtype.
  at::Tensor step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& g, const c10::optional<at::Tensor>& theta = c10::nullopt,
                  RotaryLayout rotary_layout = RotaryLayout::half_split,
                  const c10::optional<at::Tensor>& bias_q_slope = c10::nullopt,
                  const c10::optional<at::Tensor>& bias_k_slope = c10::nullopt);
  std::int64_t length() const;  // tokens fed so far
  void reset();                 // forget every token

 private:
  ForgettingAttnCache cache_;
  std::int64_t num_q_heads_, value_dim_;
  c10::optional<double> scale_;
};

// ---- Performer FAVOR+ (phasor/favor.h) ----------------------------------------------------------
// Positive orthogonal random features for softmax attention (Choromanski et al. 2021): with m
// feature rows w_r, φ(x)_r = exp(w_rᵀx − |x|²/2 − c)/√m estimates exp(xᵀy) by φ(x)ᵀφ(y), and FAVOR+
// attention is o_i = φ(q̂_i)ᵀ Σ_j φ(k̂_j) v_jᵀ / φ(q̂_i)ᵀ Σ_j φ(k̂_j) over all j (non-causal) or j ≤ i
// (causal), q̂ = q·scale^{1/2}, k̂ = k·scale^{1/2} (default scale d^{−1/2}), in O(T·m·(d + V)).

// The random feature matrix w: [m, d], or [H, m, d] (one matrix per head) when num_heads is given,
// drawn from seed (the same seed gives the same matrix on every platform; another redraws).
// kind: orthogonal_chi (default; orthogonal blocks, rows with chi(d) norms: unbiased),
// orthogonal_fixed (rows of norm √d) or iid (Gaussian rows). dtype float32 or float64. A plain
// tensor (requires_grad false): a buffer to redraw, or a parameter if the caller wants to learn it.
at::Tensor favor_random_matrix(std::int64_t num_features, std::int64_t head_dim, std::uint64_t seed,
                               FavorMatrixKind kind = FavorMatrixKind::orthogonal_chi,
                               c10::optional<std::int64_t> num_heads = c10::nullopt,
                               at::ScalarType dtype = at::kFloat);

// The positive features φ: [B, T, H, m] of x: [B, T, H, d] (w: [m, d] or [H, m, d]), with the
// stabiliser c: FavorStabilizer::query (per token: the row max, largest feature 1/√m),
// ::key (one per sequence and head, for features summed over tokens) or ::none (c = 0).
// cu_seqlens (B = 1) delimits the key stabiliser's sequences. Differentiable in x and w. The
// gradient is that of the returned (stabilised) features, c's dependence on x and w included
// (the core's backward holds c fixed, which is exact only inside attention, where c cancels;
// the c term is added here). Impl::reference runs the float64 loops.
at::Tensor favor_features(const at::Tensor& x, const at::Tensor& w,
                          FavorStabilizer stabilizer = FavorStabilizer::query,
                          const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                          Impl impl = Impl::chunk);

// FAVOR+ attention with its normaliser: q, k: [B, T, H, d], v: [B, T, H, V], w: [m, d] or
// [H, m, d] → o: [B, T, H, V] in q's dtype. causal: prefix sums j ≤ i (phasor's GLA kernel with
// zero gates; chunk_size is its chunk length). Queries use the per-row stabiliser and keys one per
// (sequence, head); both cancel in o. Differentiable in q, k, v and w.
at::Tensor favor_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& w, bool causal = false,
                           c10::optional<double> scale = c10::nullopt,
                           const c10::optional<at::Tensor>& cu_seqlens = c10::nullopt,
                           Impl impl = Impl::chunk, std::int64_t chunk_size = 64);

}  // namespace phasor
