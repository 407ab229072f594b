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
//  - device: CPU (and CUDA tensors when this LibTorch is built with CUDA and phasor with its CUDA
//    backend — Debian's LibTorch is not). CPU tensors of the ops with CUDA kernels (GLA, Gated
//    DeltaNet, forgetting attention and its decoder, the rotary ops, causal_conv1d) can be
//    computed on another device: see set_compute_device below.
//  - floating arguments (q, k, v, g, beta, initial_state) may be float32, float64, float16 or
//    bfloat16, with any strides; they go to the kernels without a copy, which convert 16-bit
//    values to float32 on load.
//  - the compute type: float64 for float64 q, else float32 (Impl::reference always computes in
//    float64).
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

// The device the ops with CUDA kernels compute on for CPU tensors, per host thread:
//   Device::cpu (default)  the CPU kernels;
//   Device::emulated       the CUDA kernels on the emulated GPU, on the tensors' own memory (for
//                          checking the CUDA kernels on a machine without a GPU; slow);
//   Device::cuda           the CUDA kernels on the GPU: each call copies its CPU tensors to the
//                          GPU and its results back (for running the GPU kernels from a LibTorch
//                          without CUDA, such as Debian's; the copies cost more than the kernels).
//                          Each call then fails with a c10::Error naming the device when this
//                          build of phasor or the machine has no GPU.
// Implementations without CUDA kernels fail with a c10::Error naming 'impl' on those devices
// (phasor/ops.h lists which run where). CUDA tensors always run on their own GPU.
void set_compute_device(Device device);
Device compute_device();
// Sets the compute device for a scope and restores the previous one.
class ComputeDeviceGuard {
 public:
  explicit ComputeDeviceGuard(Device device) : previous_(compute_device()) {
    set_compute_device(device);
  }
  ~ComputeDeviceGuard() { set_compute_device(previous_); }
  ComputeDeviceGuard(const ComputeDeviceGuard&) = delete;
  ComputeDeviceGuard& operator=(const ComputeDeviceGuard&) = delete;

 private:
  Device previous_;
};

// (o, final_state): final_state is present iff output_final_state was set.
using OutputAndState = std::tuple<at::Tensor, c10::optional<at::Tensor>>;

// Rotation (every attention op below): theta, optional [B, T, H, K/2] (H: the q/k heads; for
// forgetting attention the KEY heads, shared by each query group), rotates q_t and k_t by θ_t
// inside the kernel, in rotary_layout (see phasor/common.h); theta receives a gradient. Build
// theta with selective_rope_phases (Selective RoPE) or rope_angles (RoPE) below.

// ---- Gated Linear Attention ---------------------------------------------------------------------
// q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [N, H, K, V]; o: [B, T, H, V];
// final_state: [N, H, K, V]. g: log forget gates (≤ 0, −inf allowed), per token and key channel.
// chunk_size: Impl::chunk only, any positive value (16, 32 or 64 on a GPU compute device).
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
// ---- Rotation position encodings: STRING, GRAPE-M, structured rotations (issue 5) ---------------
// (phasor/string_rotation.h, phasor/grape.h, phasor/structured_rotation.h give the equations.)
// Each returns x's dtype and is differentiable in every floating input marked below (first order,
// the core's backward with Impl::chunk); parameters shared by the heads get the sum over heads.
// Floating arguments keep their own dtype (float16/bfloat16 computed in float32); angles are
// always formed in float64 inside the kernels.

// N-d RoPE angles (STRING eq. 5): θ[b, t, (h,) i] = Σ_c positions[b, t, c] · omega[(h,) c, i].
// positions: [B, T, C]; omega: [C, R] → θ [B, T, R] (shared by heads), or [H, C, R] →
// θ [B, T, H, R]. θ has the promoted dtype of positions and omega and feeds apply_rotary or the
// attention ops' theta. Differentiable in positions and omega (the per-axis frequencies).
at::Tensor nd_rope_angles(const at::Tensor& positions, const at::Tensor& omega);

// The axis-split frequencies (axial 2-D/3-D RoPE): omega [num_axes, head_dim/2], each axis owning
// a contiguous slice of the pairs with the 1-D RoPE spectrum base^(−j/n) of its n pairs.
at::Tensor nd_rope_axis_split_frequencies(std::int64_t num_axes, std::int64_t head_dim,
                                          double base = 10000.0, at::ScalarType dtype = at::kFloat);

// Cayley-STRING (STRING eq. 10): y = RoPE(θ) · P · x, P = (I − S)(I + S)^(−1), S = A − Aᵀ with
// A = generator ([K, K] shared, or [H, K, K]); θ = nd_rope_angles(positions, omega) with
// positions [B, T, C], omega [C, K/2] or [H, C, K/2]. x: [B, T, H, K], K even. A = 0 (or any
// symmetric A) is N-d RoPE. Differentiable in x, positions, omega and generator.
at::Tensor cayley_string(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& omega,
                         const at::Tensor& generator,
                         RotaryLayout rotary_layout = RotaryLayout::half_split);

// Circulant-STRING (STRING §3.2): y = exp(Σ_c r_c (C_c − C_cᵀ)) x by FFT, C_c circulant with first
// column c[(h,) c, :]. x: [B, T, H, K] (any K ≥ 1); positions: [B, T, C]; c: [C, K] or [H, C, K].
// Differentiable in x, positions and c.
at::Tensor circulant_string(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& c);

// Single-plane GRAPE-M (GRAPE §2, Rodrigues): y = exp(η L) x, L = a bᵀ − b aᵀ, η = position · ω_h.
// x: [B, T, H, K]; a, b: [H, K] or [K]; omega: [H]; positions: [B, T] or [B, T, H].
// Differentiable in x, a, b, omega and positions.
at::Tensor grape(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                 const at::Tensor& omega, const at::Tensor& positions);

// Multi-subspace GRAPE-M (GRAPE §3): y = B · RoPE(θ) · Bᵀ x with an orthogonal basis B
// ([K, K] or [H, K, K]; max |BᵀB − I| ≤ orthogonality_tol is checked, +inf disables) and
// θ [B, T, H, K/2] or [B, T, K/2] (shared by heads). Differentiable in x, basis and theta (chain
// the basis' gradient through its parameterisation, e.g. a Cayley map built with torch ops).
at::Tensor grape_subspace(const at::Tensor& x, const at::Tensor& basis, const at::Tensor& theta,
                          RotaryLayout rotary_layout = RotaryLayout::half_split,
                          double orthogonality_tol = 1e-4);

// Equivariant structured rotations (structured_rotation.h). The joint block decomposition of a
// commuting family of skew generators [C, K, K] (not differentiable: outputs are detached):
// basis U [K, K], coefficients Λ [C, K/2] (zero beyond the num_active planes), the projectors
// [K, K]. U's first 2·num_active columns and Λ's first num_active columns feed
// structured_rotation.
struct StructuredDecomposition {
  at::Tensor basis, coefficients, active_projector, null_projector;
  std::int64_t num_active = 0;
};
StructuredDecomposition structured_decomposition(const at::Tensor& generators,
                                                 double tolerance = 1e-8,
                                                 std::uint64_t seed = 0x5eedULL);

// y = R(r) · P · x (eq. 11, 19): x [B, T, H, K]; positions [B, T, H, C] or [B, T, C] (shared by
// heads); basis U_act [K, 2m] (must not require grad: it receives none); coefficients Λ [C, m];
// post_rotation P [K, K] optional (e.g. structured_cayley). Differentiable in x, positions,
// coefficients and post_rotation.
at::Tensor structured_rotation(const at::Tensor& x, const at::Tensor& positions,
                               const at::Tensor& basis, const at::Tensor& coefficients,
                               const c10::optional<at::Tensor>& post_rotation = c10::nullopt);

// The structured Cayley post-rotation (eq. 14): P = I − N Nᵀ + N (I − S)(I + S)^(−1) Nᵀ [K, K]
// with null_basis N [K, n] (must not require grad), or (I − S)(I + S)^(−1) without it. s: [n, n].
// Differentiable in s (every entry independent; for S = W − Wᵀ autograd chains to W).
at::Tensor structured_cayley(const at::Tensor& s,
                             const c10::optional<at::Tensor>& null_basis = c10::nullopt);

}  // namespace phasor
