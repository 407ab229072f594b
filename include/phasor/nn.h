// phasor::nn — LibTorch layers (torch::nn::Module) built on the ops of phasor/torch.h:
//
//   ShortConvolution      fla's ShortConvolution: causal depthwise conv with optional SiLU.
//   SelectiveRoPE         input-dependent rotation angles θ (Selective RoPE) for q and k.
//   CayleyStringEncoding, CirculantStringEncoding, GrapeEncoding
//                         learnable relative rotations of q and k (STRING, GRAPE-M).
//   GatedLinearAttention  fla's GLA layer.
//   GatedDeltaNet         fla's Gated DeltaNet layer.
//   ForgettingAttention   fla's Forgetting Transformer (FoX) attention layer.
//   PerformerAttention    Performer FAVOR+ linear attention (positive orthogonal random features).
//
// The three attention layers take a position encoding, PosEncoding::{none, rope, selective_rope,
// string_cayley, string_circulant, grape}, whose angles θ [B, T, H, K/2] the op applies to q and k
// (fused in the kernel, or explicitly with apply_rotary when fused_rotation is off — the same
// function); the learnable rotations first apply their orthogonal map (see "Rotation encodings").
//
//   #include <phasor/nn.h>          // CMake: target_link_libraries(app PRIVATE phasor::torch)
//   namespace pn = phasor::nn;
//   pn::GatedLinearAttention gla(pn::GatedLinearAttentionOptions(/*hidden_size=*/256,
//                                                                /*num_heads=*/4)
//                                    .pos_encoding(pn::PosEncoding::selective_rope));
//   at::Tensor y = gla->forward(x);              // x, y: [B, T, 256]; training / prefill
//   pn::LayerCache cache;                        // incremental decoding:
//   for (int64_t t = 0; t < T; ++t)              // y_t equals row t of the parallel forward
//     at::Tensor y_t = gla->forward(x.narrow(1, t, 1), &cache);
//
// Conventions for every layer:
//  - x: [B, T, hidden_size], CPU, float32 or float64 matching the module's parameters (use
//    module->to(at::kDouble) for float64). The output has x's shape and dtype.
//  - forward(x, cache): with cache == nullptr the whole sequence is processed in parallel from
//    an empty state. With a cache the call continues the sequence stored in it (empty at first)
//    and updates it, for any T ≥ 1 (prefill with T > 1, then T = 1 per token); the outputs equal
//    the corresponding rows of one parallel forward over everything fed so far. A cache belongs
//    to one layer and one batch size; reset() empties it.
//  - gradients: everything is differentiable through autograd (the core's backward passes),
//    except ForgettingAttention with a cache (its key/value decoder is inference only).
//  - parameters are initialised like PyTorch's nn.Linear / nn.Conv1d unless stated otherwise.
//  - bad options or inputs raise c10::Error (TORCH_CHECK) naming the layer and the argument,
//    e.g. "GatedLinearAttention: option 'num_heads': expected a positive number, got 0".
#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "phasor/common.h"
#include "phasor/torch.h"

namespace phasor::nn {

// RMSNorm over the last dimension (fla's RMSNorm without bias):
//   y = x · rsqrt(mean(x², last dim) + eps) · weight
// x [..., D] and weight [D] of one float dtype, on any device; computed in that dtype. One autograd
// node with a fused backward (dx and dweight; first-order only): the layers' output and q/k norms
// and the task harness's pre-norm blocks use it. Bad arguments raise c10::Error naming them.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// RMSNorm times an activated gate, fla's FusedRMSNormGated (without bias):
//   y = x · rsqrt(mean(x²) + eps) · weight · act(gate),   act = "silu" (also "swish") or "sigmoid"
// gate: x's shape, dtype and device. One autograd node (dx, dgate, dweight; first-order only): the
// GLA and Gated DeltaNet layers' output norm with their SiLU output gate, FoX's with its sigmoid
// gate. rms_norm and rms_norm_gated run one loop over the rows on CPU float32/float64 tensors
// (phasor's threads; the same bits for any thread count) and ATen ops elsewhere; both agree with
// the composed expressions to rounding (tests/nn_test.cpp RmsNorm.*).
at::Tensor rms_norm_gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight,
                          double eps, const std::string& activation = "silu");

// Position encoding of an attention layer's q and k.
//  none:           no rotation (NoPE).
//  rope:           standard RoPE, θ[t, i] = (position t) · rope_theta^(−2i/K), shared by heads.
//  selective_rope: θ from a SelectiveRoPE submodule (input-dependent, learnable).
//  string_cayley, string_circulant, grape: learnable rotations (see "Rotation encodings" below).
enum class PosEncoding {
  none,
  rope,
  selective_rope,
  string_cayley,     // Cayley-STRING (nn_rotations.cpp)
  string_circulant,  // Circulant-STRING
  grape,             // multi-subspace GRAPE-M
};

// ---- Context parallelism (the option context_parallel of the layers) ----------------------------
// One sequence split across the ranks of a process group, each rank holding a contiguous slice of
// the tokens (rank r the r-th slice). A layer whose options carry a ContextParallel runs its
// forward on this rank's slice x [B, T_r, hidden] and returns the slice of the single-process
// output: the token-mixing ops (the attention op, the short convolutions, the Selective RoPE
// phases) go through this interface, which exchanges the state across the ranks; the rest of the
// layer is per token. RoPE and the rotation encodings (string_cayley, string_circulant, grape)
// take the global positions (token_offset). phasor::cp::layer_context(group)
// (phasor/context_parallel.h, target phasor::distributed) gives the c10d implementation; this
// header depends on no c10d header.
//   - every rank must call forward (and backward) together, with the same batch size B (each row
//     one sequence running through every rank) and T_r ≥ 1;
//   - gradients: each rank's parameter gradients are its share; their sum over the ranks (an
//     allreduce, as data-parallel training does anyway) is the single-process gradient;
//   - training and prefill only: a decoding cache (LayerCache, SelectiveRoPECache, a
//     ShortConvolution state) with context_parallel set is refused with an error naming the
//     option;
//   - PerformerAttention refuses the option (its FAVOR+ form has no context-parallel path here).
// The methods are the phasor/torch.h ops of the same name on this rank's slice, with cu_seqlens
// the GLOBAL offsets (see phasor/context_parallel.h for every argument); they are collectives.
struct ContextParallel {
  virtual ~ContextParallel() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The global position of this rank's first token: the sum of the earlier ranks' slice_length
  // (a collective: every rank passes its own T_r).
  virtual std::int64_t token_offset(std::int64_t slice_length) = 0;
  virtual OutputAndState gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& g, Impl impl, c10::optional<double> scale,
                             const c10::optional<at::Tensor>& initial_state,
                             bool output_final_state, const c10::optional<at::Tensor>& cu_seqlens,
                             std::int64_t chunk_size, const c10::optional<at::Tensor>& theta,
                             RotaryLayout rotary_layout) = 0;
  virtual OutputAndState gated_delta_rule(
      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
      const at::Tensor& beta, Impl impl, c10::optional<double> scale,
      const c10::optional<at::Tensor>& initial_state, bool output_final_state,
      const c10::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
      std::int64_t chunk_size, const c10::optional<at::Tensor>& theta,
      RotaryLayout rotary_layout) = 0;
  virtual at::Tensor forgetting_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& g, Impl impl, c10::optional<double> scale,
                                     c10::optional<std::int64_t> window_size,
                                     const c10::optional<at::Tensor>& cu_seqlens,
                                     std::int64_t block_size,
                                     const c10::optional<at::Tensor>& theta,
                                     RotaryLayout rotary_layout,
                                     const c10::optional<at::Tensor>& bias_q_slope,
                                     const c10::optional<at::Tensor>& bias_k_slope) = 0;
  // omega's gradient: this rank's share (see above).
  virtual std::tuple<at::Tensor, c10::optional<at::Tensor>> selective_rope_phases(
      const at::Tensor& phi, const at::Tensor& omega,
      const c10::optional<at::Tensor>& initial_phase, bool output_final_phase,
      const c10::optional<at::Tensor>& cu_seqlens) = 0;
  // weight's and bias's gradients: this rank's share (see above).
  virtual std::tuple<at::Tensor, c10::optional<at::Tensor>> causal_conv1d(
      const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
      const std::string& activation, const c10::optional<at::Tensor>& initial_state,
      bool output_final_state, const c10::optional<at::Tensor>& cu_seqlens) = 0;
};

// ---- ShortConvolution ---------------------------------------------------------------------------
// y[t, d] = act(bias[d] + Σ_{j<W} weight[d, j] · x[t − W + 1 + j, d]) (causal_conv1d), with act
// SiLU or identity; inputs before the start of the sequence are the cache (zeros when absent).
struct ShortConvolutionOptions {
  ShortConvolutionOptions(std::int64_t hidden_size, std::int64_t kernel_size = 4)
      : hidden_size_(hidden_size), kernel_size_(kernel_size) {}
  TORCH_ARG(std::int64_t, hidden_size);  // channels D (> 0)
  TORCH_ARG(std::int64_t, kernel_size);  // width W (≥ 1), default 4
  TORCH_ARG(bool, bias) = false;         // learnable bias [D], default off (as fla)
  TORCH_ARG(bool, silu) = true;          // SiLU activation after the convolution, default on
  // Context parallelism (see "Context parallelism" above): x is this rank's slice. Set by the
  // layers that own the convolution from their own option.
  TORCH_ARG(std::shared_ptr<ContextParallel>, context_parallel) = nullptr;
};

class ShortConvolutionImpl : public torch::nn::Cloneable<ShortConvolutionImpl> {
 public:
  explicit ShortConvolutionImpl(ShortConvolutionOptions options);
  void reset() override;
  // x: [B, T, D]. state: optional conv cache [B, D, W−1] (the last W−1 inputs); when given, an
  // undefined *state means zeros, and *state is replaced by the cache after this call.
  at::Tensor forward(const at::Tensor& x, at::Tensor* state = nullptr);

  ShortConvolutionOptions options;
  at::Tensor weight;  // [D, W], U(−1/√W, 1/√W) as nn.Conv1d (depthwise)
  at::Tensor bias;    // [D], present iff options.bias()
};
TORCH_MODULE(ShortConvolution);

// ---- SelectiveRoPE ------------------------------------------------------------------------------
// The phase path (H heads, R = K/2 rotation pairs per head):
//   x̂_t   = x_t with each of its H groups of D/H channels scaled to unit ℓ2 norm (eps 1e-6),
//   p_t   = P x̂_t ∈ R^{H·R}            (projection: low-rank or weight-normalised full rank),
//   c_t   = conv(p)_t                  (short causal conv, width conv_size, no bias, + SiLU),
//   φ_t   = (c_t + exp(b)) · σ(G x̂_t + g)   (bias and phase gate, each optional),
//   θ_t   = ω ⊙ (θ_0 + Σ_{s≤t} φ_s)    (selective_rope_phases; θ_0 the cached running phase),
// and q_t, k_t are rotated by θ_t, so that q_t·k_s sees the rotation ω ⊙ Σ_{s<u≤t} φ_u — the
// paper's input-dependent R_{s+1:t} (Selective RoPE, eq. "o_t = Σ v_τ k_τᵀ R_{1:τ}ᵀ R_{1:t} q_t").
// With b = 0 (the initial value), no gate and φ ≡ 1 this is exactly RoPE with frequencies ω.
enum class PhaseProjection {
  low_rank,  // P = U·D: D → rank → H·R, two bias-free linear maps (fla's gate style)
  full_rank,  // P_h = s_h · V_h / ‖V_h‖_F per head h (V_h: [R, D]; s_h learnable, init ‖V_h‖_F)
};
enum class PhaseGate {
  none,         // φ not gated
  per_head,     // σ(G x̂ + g), G: [H, D] — one gate per head, shared by its R pairs
  per_channel,  // σ(G x̂ + g), G: [H·R, D] — one gate per rotation pair
};
// The temperature spectrum ω_i, i = 0 … R−1 (the frequencies of the R pairs of a head).
enum class Spectrum {
  // ω_i = spectrum_base^(−2i/K) (RoPE's, with base 500000 by default; base 1 gives ω ≡ 1, the
  // Selective RoPE code's state-tracking setting).
  rope,
  // The paper's optimal temperature τ(α) = tan²(α/2) for a query–key angle α ~ U[0, 2π],
  // sampled at R evenly spaced levels: ω_i is τ's quantile at level 1 − (i + ½)/R, i.e.
  // tan²(π/2 · (1 − (i + ½)/R)), divided by the i = 0 value so that ω_0 = 1 like RoPE (the raw
  // quantiles reach cot²(π/4R) ≈ (4R/π)² rad per token). Decreasing and log-symmetric
  // (ω_i·ω_{R−1−i} = ω_{R−1}); for K = 64 it spans 6.4 decades (RoPE, base 500000: 5.5) and
  // falls faster at both ends (ω_1 = 0.11 against RoPE's 0.66). The paper derives the shape,
  // not a discretisation: this sampling and normalisation are phasor's reading of it.
  tan2,
};

struct SelectiveRoPEOptions {
  SelectiveRoPEOptions(std::int64_t hidden_size, std::int64_t num_heads, std::int64_t head_dim)
      : hidden_size_(hidden_size), num_heads_(num_heads), head_dim_(head_dim) {}
  TORCH_ARG(std::int64_t, hidden_size);  // D: input width, a multiple of num_heads
  TORCH_ARG(std::int64_t, num_heads);    // H: heads rotated (for FoX: the key/value heads)
  TORCH_ARG(std::int64_t, head_dim);     // K: rotated head dimension, even; R = K/2
  TORCH_ARG(PhaseProjection, projection) = PhaseProjection::low_rank;  // default low rank
  TORCH_ARG(std::int64_t, rank) = 16;                // rank of the low-rank projection (≥ 1)
  TORCH_ARG(std::int64_t, conv_size) = 4;            // short convolution width (≥ 1)
  TORCH_ARG(bool, conv_silu) = true;                 // SiLU after the convolution, default on
  TORCH_ARG(bool, bias) = true;                      // add exp(b), b: [H·R] init 0, default on
  TORCH_ARG(PhaseGate, gate) = PhaseGate::per_head;  // sigmoid phase gate, default per head
  TORCH_ARG(Spectrum, spectrum) = Spectrum::rope;    // initial (or fixed) ω
  TORCH_ARG(double, spectrum_base) = 500000.0;       // base of Spectrum::rope (≥ 1)
  TORCH_ARG(bool, learnable_omega) = true;  // ω a parameter [H, R] (per head), else buffer [R]
  // Context parallelism (see "Context parallelism" above): the phases continue across the ranks.
  // Set by the layers that own the SelectiveRoPE from their own option.
  TORCH_ARG(std::shared_ptr<ContextParallel>, context_parallel) = nullptr;
};

// Decode cache of a SelectiveRoPE: the conv state [B, H·R, W−1] and the running phase θ_0
// [B, H, R] (Σφ so far, un-multiplied by ω). Undefined tensors mean an empty sequence.
struct SelectiveRoPECache {
  at::Tensor conv_state;
  at::Tensor phase;
  void reset() { conv_state = at::Tensor(), phase = at::Tensor(); }
};

class SelectiveRoPEImpl : public torch::nn::Cloneable<SelectiveRoPEImpl> {
 public:
  explicit SelectiveRoPEImpl(SelectiveRoPEOptions options);
  void reset() override;
  // x: [B, T, D] → θ: [B, T, H, R] in x's dtype (cache: see SelectiveRoPECache).
  at::Tensor forward(const at::Tensor& x, SelectiveRoPECache* cache = nullptr);
  // The phase increments φ: [B, T, H, R] (everything above before the cumulative sum).
  at::Tensor phase_increments(const at::Tensor& x, at::Tensor* conv_state = nullptr);
  // x̂: x [..., D] ℓ2-normalised per head, x_h / sqrt(|x_h|² + 10⁻⁶) (the paper's stabiliser (i)),
  // the input of the phase projection and of the gate.
  at::Tensor normalized_input(const at::Tensor& x) const;
  // ω: [H, R] when learnable, else [R].
  const at::Tensor& omega() const { return omega_; }
  // The spectrum of `spectrum` for head_dim K (R = K/2 values, float64), as defined above.
  static at::Tensor spectrum_values(Spectrum spectrum, std::int64_t head_dim, double base);

  SelectiveRoPEOptions options;
  torch::nn::Linear down{nullptr}, up{nullptr};  // low rank: D → rank → H·R
  at::Tensor proj_weight, proj_scale;            // full rank: V [H·R, D], s [H]
  ShortConvolution conv{nullptr};                // H·R channels
  at::Tensor bias;                               // b [H·R]
  torch::nn::Linear gate{nullptr};               // D → H or H·R, with bias

 private:
  at::Tensor omega_;
};
TORCH_MODULE(SelectiveRoPE);

// ---- Rotation encodings: Cayley-STRING, Circulant-STRING, GRAPE-M (src/torch/nn_rotations.cpp) --
// Learnable position encodings that keep RoPE's relative law (STRING, ../shared/papers/string.txt;
// GRAPE, grape.txt). Each is a rotation R(t) = exp(t·L)-like map of the token index t (continuing
// across LayerCache calls), and each can be written as RoPE composed with a learned orthogonal
// K × K map M, which is how the layers apply it:
//   q_t ↦ RoPE(θ_t) · M · q_t,   k_s ↦ RoPE(θ_s) · M · k_s,   θ_t = t · ω            (E1)
// The M step is a (per key head) matrix product; the RoPE step is the attention kernel's fused
// rotation (fused_rotation, default) or apply_rotary (the same function).
//  string_cayley     Cayley-STRING (eq. 10): M = P = (I − S)(I + S)^(−1), S = A − Aᵀ, A
//                    learnable (init 0, so P = I: RoPE exactly). (E1) gives exactly the vectors
//                    of cayley_string(x, positions, omega, A).
//  string_circulant  Circulant-STRING (§3.2): exp(t (C − Cᵀ)) = Q · RoPE(t μ) · Qᵀ with Q the
//                    real Fourier basis and μ_m = −2 Σ_j c_j sin(2πjm/K) (c the circulant's
//                    first column, learnable). The layers use M = Qᵀ (fixed; pair m of the layout
//                    = (sine, cosine) of Fourier bin m, the last pair the fixed bins 0 and K/2)
//                    and ω = μ(c); logits equal circulant_string's (Q cancels between q and k).
//                    Init: c chosen so that μ is RoPE's first K/2 − 1 frequencies (RoPE in the
//                    Fourier basis; the paper's generator family contains RoPE this way).
//  grape             multi-subspace GRAPE-M (§3, Prop. 3.1): B · RoPE(θ) · Bᵀ with a learned
//                    orthogonal basis B = (I − S)(I + S)^(−1), S = W − Wᵀ (init W = 0: B = I,
//                    RoPE exactly). The layers use M = Bᵀ; logits equal grape_subspace's.
// Why RoPE·M rather than the rotation itself: the attention logits (qᵀ R(t)ᵀ R(s) k) are the same,
// and FoX and Gated DeltaNet are invariant under a common orthogonal map of q and k, so their
// outputs are the same too; for GLA the per-key-channel decays then act in the rotation's own
// planes, where tie_gate_pairs makes them commute with it (the Λ_t R_t transition), so the
// relative law holds with the decays as well. Frequencies ω: the RoPE spectrum
// rope_theta^(−2i/K) (a buffer), or a parameter with learnable_omega (GRAPE learns them).
struct RotationEncodingOptions {
  RotationEncodingOptions(std::int64_t num_heads = 0, std::int64_t head_dim = 0)
      : num_heads_(num_heads), head_dim_(head_dim) {}
  TORCH_ARG(std::int64_t, num_heads);       // H: heads rotated (FoX: key heads); set by the layers
  TORCH_ARG(std::int64_t, head_dim);        // K, even; set by the layers
  TORCH_ARG(double, rope_theta) = 10000.0;  // base of the initial spectrum (layers: rope_theta)
  TORCH_ARG(RotaryLayout, rotary_layout) = RotaryLayout::half_split;  // layers: their layout
  TORCH_ARG(bool, per_head) = true;          // parameters per head [H, …], else shared by heads
  TORCH_ARG(bool, learnable_omega) = false;  // ω a parameter (string_cayley, grape)
  // Standard deviation of a N(0, init_std²) perturbation of the generator (A, c or W) at init;
  // 0 (default) starts exactly at RoPE (string_cayley, grape) or RoPE in the Fourier basis.
  TORCH_ARG(double, init_std) = 0.0;
};

// A rotation's output for the layers: q, k after M (E1), and θ [B, T, H, K/2] of the RoPE step.
struct RotatedQK {
  at::Tensor q, k, theta;
};

// The three modules below share one interface. forward's q: [B, T, HQ, K] with HQ a multiple of
// H (a query group shares its key head's rotation), k: [B, T, H, K]; token t has position
// offset + t.
class CayleyStringEncodingImpl : public torch::nn::Cloneable<CayleyStringEncodingImpl> {
 public:
  explicit CayleyStringEncodingImpl(RotationEncodingOptions options);
  void reset() override;
  // M: [H, K, K] (per_head) or [K, K].
  at::Tensor map();
  // ω: [H, 1, K/2] (per_head) or [1, K/2], the frequencies of the one position axis.
  at::Tensor frequencies();
  // θ = (offset + t) · ω: [B, T, H, K/2] in dtype.
  at::Tensor angles(std::int64_t batch, std::int64_t seq_len, std::int64_t offset,
                    at::ScalarType dtype);
  // (E1) up to the RoPE step: (M q, M k, θ); see RotatedQK.
  RotatedQK forward(const at::Tensor& q, const at::Tensor& k, std::int64_t offset);
  RotationEncodingOptions options;
  at::Tensor generator;  // A: [H, K, K] or [K, K], S = A − Aᵀ
  at::Tensor omega;      // [H, 1, K/2] or [1, K/2] (parameter with learnable_omega, else buffer)
};
TORCH_MODULE(CayleyStringEncoding);

class CirculantStringEncodingImpl : public torch::nn::Cloneable<CirculantStringEncodingImpl> {
 public:
  explicit CirculantStringEncodingImpl(RotationEncodingOptions options);
  void reset() override;
  // M: [H, K, K] (per_head) or [K, K].
  at::Tensor map();
  // ω: [H, 1, K/2] (per_head) or [1, K/2], the frequencies of the one position axis.
  at::Tensor frequencies();
  // θ = (offset + t) · ω: [B, T, H, K/2] in dtype.
  at::Tensor angles(std::int64_t batch, std::int64_t seq_len, std::int64_t offset,
                    at::ScalarType dtype);
  // (E1) up to the RoPE step: (M q, M k, θ); see RotatedQK.
  RotatedQK forward(const at::Tensor& q, const at::Tensor& k, std::int64_t offset);
  RotationEncodingOptions options;
  at::Tensor c;        // first columns: [H, 1, K] or [1, K] (circulant_string's c, C = 1)
  at::Tensor fourier;  // Qᵀ [K, K] float64 constant in the pair layout (rows: sin/cos of bins)
  at::Tensor sine;     // [K/2, K] float64 constant: μ = c · sineᵀ (last row 0: the fixed pair)
};
TORCH_MODULE(CirculantStringEncoding);

class GrapeEncodingImpl : public torch::nn::Cloneable<GrapeEncodingImpl> {
 public:
  explicit GrapeEncodingImpl(RotationEncodingOptions options);
  void reset() override;
  // M: [H, K, K] (per_head) or [K, K].
  at::Tensor map();
  // ω: [H, 1, K/2] (per_head) or [1, K/2], the frequencies of the one position axis.
  at::Tensor frequencies();
  // θ = (offset + t) · ω: [B, T, H, K/2] in dtype.
  at::Tensor angles(std::int64_t batch, std::int64_t seq_len, std::int64_t offset,
                    at::ScalarType dtype);
  // (E1) up to the RoPE step: (M q, M k, θ); see RotatedQK.
  RotatedQK forward(const at::Tensor& q, const at::Tensor& k, std::int64_t offset);
  // B = (I − S)(I + S)^(−1), S = W − Wᵀ: [H, K, K] or [K, K] (map() is its transpose).
  at::Tensor basis();
  RotationEncodingOptions options;
  at::Tensor weight;  // W: [H, K, K] or [K, K]
  at::Tensor omega;   // [H, 1, K/2] or [1, K/2]
};
TORCH_MODULE(GrapeEncoding);

// The rotation encoding of an attention layer: the holder of its pos_encoding is set (registered
// as the layer's submodule "string_cayley", "string_circulant" or "grape"), the others are empty.
struct RotationEncodings {
  CayleyStringEncoding string_cayley{nullptr};
  CirculantStringEncoding string_circulant{nullptr};
  GrapeEncoding grape{nullptr};
  // Registers the module of `pe` (no-op for the other encodings) with `options`, its sizes,
  // spectrum base and pair layout set to the layer's.
  void build(torch::nn::Module& layer, PosEncoding pe, RotationEncodingOptions options,
             std::int64_t heads, std::int64_t head_dim, double rope_theta, RotaryLayout layout);
  bool defined() const;
  // q, k ← M q, M k (E1) and returns θ [B, T, H, K/2] for the RoPE step.
  at::Tensor rotate(at::Tensor& q, at::Tensor& k, std::int64_t offset);
};
bool is_rotation_encoding(PosEncoding pe);  // string_cayley, string_circulant or grape

// ---- decode cache of the attention layers -------------------------------------------------------
struct LayerCache {
  at::Tensor q_conv, k_conv, v_conv;  // short-conv states [B, D, W−1] (when the layer has them)
  at::Tensor state;                   // GLA / GDN recurrent state [B, H(V), K, V]
  std::shared_ptr<ForgettingAttnDecoder> fox;  // FoX key/value cache
  SelectiveRoPECache rope;                     // PosEncoding::selective_rope
  std::int64_t offset = 0;                     // tokens consumed so far (RoPE positions)
  // PerformerAttention (causal FAVOR+): S = Σ φ(k_j) v_jᵀ [B, H, m, V], z = Σ φ(k_j) [B, H, m] and
  // their running key stabiliser c [B, H] (float64; S and z are kept scaled by exp(−c)).
  at::Tensor favor_state, favor_norm, favor_max;
  void reset() {
    q_conv = k_conv = v_conv = state = at::Tensor();
    fox.reset();
    rope.reset();
    offset = 0;
    favor_state = favor_norm = favor_max = at::Tensor();
  }
};

// ---- GatedLinearAttention -----------------------------------------------------------------------
// fla's GLA layer (H heads, K = hidden·expand_k/H, V = hidden·expand_v/H):
//   q, k = W_q x, W_k x (optional short conv + SiLU), v = W_v x (idem),
//   g    = logsigmoid(W_up W_down x + b) / gate_logit_normalizer   (low-rank log forget gate),
//          then max(g, clamp_min) when clamp_min is set (fla's clamp_min: a floor on log g),
//   o    = GLA(q, k, v, g) with q, k rotated by θ (pos_encoding),
//   y    = W_o [RMSNorm(o) ⊙ swish(W_g x)]   (or W_o RMSNorm(o) without the output gate).
// Gate tying (pos_encoding ≠ none): with tie_gate_pairs the low-rank gate has H·K/2 outputs and
// both channels of every rotation pair get the same decay, so the state transition of a pair is
// the complex scalar λ·e^{iθ} (the paper's A_t = Λ_t R̄_t); untied (as the public code) the pair's
// two channels decay independently. Without rotation the gate is never tied.
struct GatedLinearAttentionOptions {
  GatedLinearAttentionOptions(std::int64_t hidden_size, std::int64_t num_heads)
      : hidden_size_(hidden_size), num_heads_(num_heads) {}
  TORCH_ARG(std::int64_t, hidden_size);  // D: input and output width (> 0)
  TORCH_ARG(std::int64_t, num_heads);    // H (> 0)
  TORCH_ARG(double, expand_k) = 0.5;  // key width D·expand_k, a multiple of H; K = D·expand_k/H
  TORCH_ARG(double, expand_v) = 1.0;  // value width D·expand_v, a multiple of H; V = D·expand_v/H
  TORCH_ARG(bool, use_short_conv) = false;  // SiLU short convolutions on q, k, v (default off)
  TORCH_ARG(std::int64_t, conv_size) = 4;   // their width
  TORCH_ARG(bool, use_output_gate) = true;  // the swish output gate W_g (default on)
  TORCH_ARG(std::int64_t, gate_low_rank_dim) = 16;  // rank of the forget-gate projection
  TORCH_ARG(double, gate_logit_normalizer) = 16.0;  // divides logsigmoid(·) (> 0)
  // Floor on the log forget gate, a number ≤ 0 (fla's clamp_min; default none): every token
  // keeps at least e^clamp_min of the state. 0 pins the gate to 1 (no decay: linear attention,
  // with rotation when pos_encoding is set) — the gate then gets no gradient. Unlike
  // gate_logit_normalizer, which only slows the gate's learning, a floor bounds the decay
  // whatever the weights learn (docs/claims.md, "Drift and decay").
  TORCH_ARG(c10::optional<double>, clamp_min) = c10::nullopt;
  TORCH_ARG(double, norm_eps) = 1e-5;  // RMSNorm epsilon
  // Kernel for T > 1 (chunk or recurrent); one token with a cache always runs the recurrent one.
  TORCH_ARG(Impl, impl) = Impl::chunk;
  TORCH_ARG(std::int64_t, chunk_size) = 64;                  // Impl::chunk tile length
  TORCH_ARG(PosEncoding, pos_encoding) = PosEncoding::none;  // K must be even unless none
  TORCH_ARG(double, rope_theta) = 10000.0;                   // PosEncoding::rope base (> 1)
  TORCH_ARG(bool, tie_gate_pairs) = true;  // one decay per rotation pair (see above), default on
  TORCH_ARG(RotaryLayout, rotary_layout) = RotaryLayout::half_split;  // pairing (common.h)
  // Rotate inside the kernel by θ (default), or apply_rotary to q and k first (same function).
  TORCH_ARG(bool, fused_rotation) = true;
  // Options of the SelectiveRoPE submodule; its sizes are set by the layer (D, H, K).
  TORCH_ARG(SelectiveRoPEOptions, selective_rope) = SelectiveRoPEOptions(0, 0, 0);
  // Options of the rotation encodings (string_cayley, string_circulant, grape); the layer sets
  // num_heads, head_dim, rope_theta and rotary_layout.
  TORCH_ARG(RotationEncodingOptions, rotation) = RotationEncodingOptions();
  // Context parallelism (see "Context parallelism" above): forward(x) on this rank's slice of the
  // tokens; passed on to the short convolutions and the SelectiveRoPE at every forward.
  TORCH_ARG(std::shared_ptr<ContextParallel>, context_parallel) = nullptr;
};

class GatedLinearAttentionImpl : public torch::nn::Cloneable<GatedLinearAttentionImpl> {
 public:
  explicit GatedLinearAttentionImpl(GatedLinearAttentionOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, LayerCache* cache = nullptr);
  // The log forget gates g [B, T, H, K] as given to the op (tied pairs already expanded).
  at::Tensor forget_gates(const at::Tensor& x);
  // The same from gk_down's output [B, T, gate_low_rank_dim].
  at::Tensor forget_gates_from_low_rank(const at::Tensor& low_rank);

  GatedLinearAttentionOptions options;
  std::int64_t head_k = 0, head_v = 0;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, g_proj{nullptr},
      gk_down{nullptr}, gk_up{nullptr}, o_proj{nullptr};
  ShortConvolution q_conv{nullptr}, k_conv{nullptr}, v_conv{nullptr};
  at::Tensor o_norm_weight;  // [V]
  SelectiveRoPE rope{nullptr};
  RotationEncodings rotations;  // string_cayley, string_circulant, grape
};
TORCH_MODULE(GatedLinearAttention);

// ---- GatedDeltaNet ------------------------------------------------------------------------------
// fla's Gated DeltaNet layer (H q/k heads of width K = head_dim, HV value heads of width
// V = head_dim·expand_v):
//   q, k, v = SiLU(conv(W x))  (short convs, on by default), ℓ2-normalised q, k (in the kernel),
//   g    = −exp(A_log) · softplus(W_a x + dt_bias)   (per value head; A ~ U[0, 16],
//          dt = exp(U[ln 0.001, ln 0.1]) clamped ≥ 1e-4, dt_bias = softplus⁻¹(dt), as fla),
//   β    = σ(W_b x) (× 2 with allow_neg_eigval),
//   o    = GatedDeltaRule(q, k, v, g, β) with q, k rotated by θ (pos_encoding),
//   y    = W_o [RMSNorm(o) ⊙ SiLU(W_g x)]   (or W_o RMSNorm(o) without use_gate).
struct GatedDeltaNetOptions {
  GatedDeltaNetOptions(std::int64_t hidden_size, std::int64_t num_heads, std::int64_t head_dim)
      : hidden_size_(hidden_size), num_heads_(num_heads), head_dim_(head_dim) {}
  TORCH_ARG(std::int64_t, hidden_size);  // D: input and output width (> 0)
  TORCH_ARG(std::int64_t, num_heads);    // H: q/k heads (> 0)
  TORCH_ARG(std::int64_t, head_dim);     // K: q/k head width (> 0)
  // HV: value heads, a multiple of H (grouped value heads); default H.
  TORCH_ARG(c10::optional<std::int64_t>, num_v_heads) = c10::nullopt;
  TORCH_ARG(double, expand_v) = 2.0;          // V = K·expand_v, a positive integer
  TORCH_ARG(bool, use_short_conv) = true;     // SiLU short convs on q, k, v (else plain SiLU)
  TORCH_ARG(std::int64_t, conv_size) = 4;     // their width
  TORCH_ARG(bool, use_gate) = true;           // the SiLU output gate W_g (default on)
  TORCH_ARG(bool, allow_neg_eigval) = false;  // β ∈ (0, 2) instead of (0, 1)
  TORCH_ARG(double, norm_eps) = 1e-5;         // RMSNorm epsilon
  TORCH_ARG(Impl, impl) = Impl::chunk;        // as GatedLinearAttentionOptions::impl
  TORCH_ARG(std::int64_t, chunk_size) = 64;   // Impl::chunk tile length
  TORCH_ARG(PosEncoding, pos_encoding) = PosEncoding::none;  // K must be even unless none
  TORCH_ARG(double, rope_theta) = 10000.0;                   // PosEncoding::rope base (> 1)
  TORCH_ARG(RotaryLayout, rotary_layout) = RotaryLayout::half_split;
  TORCH_ARG(bool, fused_rotation) = true;  // as GatedLinearAttentionOptions::fused_rotation
  // SelectiveRoPE submodule options (sizes set by the layer: D, H, K).
  TORCH_ARG(SelectiveRoPEOptions, selective_rope) = SelectiveRoPEOptions(0, 0, 0);
  // Rotation-encoding options (as GatedLinearAttentionOptions::rotation).
  TORCH_ARG(RotationEncodingOptions, rotation) = RotationEncodingOptions();
  // Context parallelism (see "Context parallelism" above): forward(x) on this rank's slice of the
  // tokens; passed on to the short convolutions and the SelectiveRoPE at every forward.
  TORCH_ARG(std::shared_ptr<ContextParallel>, context_parallel) = nullptr;
};

class GatedDeltaNetImpl : public torch::nn::Cloneable<GatedDeltaNetImpl> {
 public:
  explicit GatedDeltaNetImpl(GatedDeltaNetOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, LayerCache* cache = nullptr);

  GatedDeltaNetOptions options;
  std::int64_t num_v_heads = 0, head_v = 0;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, a_proj{nullptr},
      b_proj{nullptr}, g_proj{nullptr}, o_proj{nullptr};
  ShortConvolution q_conv{nullptr}, k_conv{nullptr}, v_conv{nullptr};
  at::Tensor A_log, dt_bias;  // [HV]
  at::Tensor o_norm_weight;   // [V]
  SelectiveRoPE rope{nullptr};
  RotationEncodings rotations;  // string_cayley, string_circulant, grape
};
TORCH_MODULE(GatedDeltaNet);

// ---- ForgettingAttention ------------------------------------------------------------------------
// fla's FoX layer (HQ query heads, H key/value heads, head width K = hidden / HQ):
//   q, k, v = W x (bias with qkv_bias), optionally RMSNorm(q), RMSNorm(k) per head (qk_norm),
//   f    = logsigmoid(W_f x + b_f)  per query head (f ≡ 0 without use_forget_gate: plain causal
//          softmax attention, the control arm of the synthetic tasks; no W_f then),
//   o    = softmax attention with the forget-gate bias Σ f (parallel_forgetting_attn), q, k
//          rotated by θ (pos_encoding; θ per key head, shared by its query group),
//   o    = RMSNorm(o) per head (use_output_norm), o ⊙ σ(W_g x) (use_output_gate),
//   y    = W_o o.
// With a cache, tokens go through ForgettingAttnDecoder one at a time (inference only).
//
// Additive position bias (additive_bias, GRAPE paper Sec. 4; fused in the kernel through
// bias_q_slope / bias_k_slope, so it works with or without the forget gate and with a cache):
// the logit of query i and key j gets −(i − j)(a_i + b_j):
//   AdditiveBias::alibi    a_i = m_h, the fixed ALiBi slopes alibi_slopes(HQ) (Press et al. 2022:
//                          the geometric sequence 2^(−8h/n), h = 1 … n), b = 0.
//   AdditiveBias::grape_a  GRAPE-A-QK (Eq. 4.6): a_i = ω·softplus(vᵀq_i/√K),
//                          b_j = ω·softplus(uᵀk_j/√K), with learnable v [HQ, K] (grape_v),
//                          u [H, K] (grape_u) and ω = exp(grape_log_omega) > 0 per key/value head
//                          [H] (shared by its query group, since b_j is per key head). q, k are the
//                          projected (and qk-normed) vectors before rotation. Init: v, u ~
//                          U(±1/√K) and ω_h = alibi_slopes(H)_h / (2 ln 2), so that at v = u = 0
//                          (softplus(0) = ln 2) the bias is ALiBi's.
enum class AdditiveBias { none, alibi, grape_a };

// The ALiBi slopes of n heads (Press et al. 2022, their reference code): for n a power of two,
// 2^(−8h/n), h = 1 … n; otherwise those of the nearest lower power of two p, followed by every
// other slope of 2p heads. float64 [n].
at::Tensor alibi_slopes(std::int64_t num_heads);

struct ForgettingAttentionOptions {
  ForgettingAttentionOptions(std::int64_t hidden_size, std::int64_t num_heads)
      : hidden_size_(hidden_size), num_heads_(num_heads) {}
  TORCH_ARG(std::int64_t, hidden_size);                                 // a multiple of num_heads
  TORCH_ARG(std::int64_t, num_heads);                                   // HQ
  TORCH_ARG(c10::optional<std::int64_t>, num_kv_heads) = c10::nullopt;  // H, default HQ
  TORCH_ARG(bool, use_forget_gate) = true;  // false: f ≡ 0 (softmax attention), no f_proj
  TORCH_ARG(bool, qkv_bias) = false;        // biases in W_q, W_k, W_v
  TORCH_ARG(bool, qk_norm) = false;         // RMSNorm of q and k per head (weights [K])
  // Attend to the last window_size tokens (≥ 1); default the whole causal prefix.
  TORCH_ARG(c10::optional<std::int64_t>, window_size) = c10::nullopt;
  TORCH_ARG(bool, use_output_gate) = false;                  // σ(W_g x) output gate
  TORCH_ARG(bool, use_output_norm) = false;                  // RMSNorm of o per head (weight [K])
  TORCH_ARG(double, norm_eps) = 1e-5;                        // RMSNorm epsilon
  TORCH_ARG(std::int64_t, block_size) = 64;                  // parallel_forgetting_attn tile size
  TORCH_ARG(PosEncoding, pos_encoding) = PosEncoding::none;  // K must be even unless none
  TORCH_ARG(double, rope_theta) = 10000.0;                   // PosEncoding::rope base (> 1)
  TORCH_ARG(RotaryLayout, rotary_layout) = RotaryLayout::half_split;
  TORCH_ARG(bool, fused_rotation) = true;  // as GatedLinearAttentionOptions::fused_rotation
  // SelectiveRoPE submodule options (sizes set by the layer: D, H, K).
  TORCH_ARG(SelectiveRoPEOptions, selective_rope) = SelectiveRoPEOptions(0, 0, 0);
  // Additive logit bias (see above); composes with pos_encoding and with the forget gate.
  TORCH_ARG(AdditiveBias, additive_bias) = AdditiveBias::none;
  // Rotation-encoding options (as GatedLinearAttentionOptions::rotation).
  TORCH_ARG(RotationEncodingOptions, rotation) = RotationEncodingOptions();
  // Context parallelism (see "Context parallelism" above): forward(x) on this rank's slice of the
  // tokens; passed on to the short convolutions and the SelectiveRoPE at every forward.
  TORCH_ARG(std::shared_ptr<ContextParallel>, context_parallel) = nullptr;
};

class ForgettingAttentionImpl : public torch::nn::Cloneable<ForgettingAttentionImpl> {
 public:
  explicit ForgettingAttentionImpl(ForgettingAttentionOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, LayerCache* cache = nullptr);

  ForgettingAttentionOptions options;
  std::int64_t num_kv_heads = 0, head_dim = 0;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, f_proj{nullptr},
      g_proj{nullptr}, o_proj{nullptr};
  at::Tensor q_norm_weight, k_norm_weight, o_norm_weight;  // [K] each, when enabled
  SelectiveRoPE rope{nullptr};
  // Additive bias (additive_bias): the ALiBi buffer "alibi_slopes" [HQ], or GRAPE-A-QK's
  // parameters grape_v [HQ, K], grape_u [H, K], grape_log_omega [H].
  at::Tensor alibi, grape_v, grape_u, grape_log_omega;
  // The slopes (a [B, T, HQ], b [B, T, H]) given q [B, T, HQ, K] and k [B, T, H, K]; undefined
  // tensors where the bias has none.
  std::pair<at::Tensor, at::Tensor> bias_slopes(const at::Tensor& q, const at::Tensor& k);
  RotationEncodings rotations;  // string_cayley, string_circulant, grape
};
TORCH_MODULE(ForgettingAttention);

// ---- PerformerAttention -------------------------------------------------------------------------
// Performer FAVOR+ attention (Choromanski et al. 2021; phasor/favor.h), H heads of width
// K = hidden / H:
//   q, k, v = W x (bias with qkv_bias), q and k rotated by θ (pos_encoding, explicitly with
//             apply_rotary: FAVOR+ has no fused rotation),
//   o    = favor_attention(q, k, v, w): softmax attention exp(qᵀk/√K) estimated with m positive
//          random features, with its normaliser; causal (prefix sums) or not,
//   y    = W_o o.
// w is the buffer "features", [H, m, K] (per_head_features: one matrix per head, drawn one after
// the other from the seed) or [m, K], drawn by favor_random_matrix(feature_kind, seed). It is not
// learned; redraw_features(seed) draws a new one in place (the Performer's periodic redraw).
// With a cache (causal only) the layer keeps S = Σ φ(k_j) v_jᵀ and z = Σ φ(k_j) with a running key
// stabiliser (float64), so decoding costs O(m·(K + V)) per token and equals the parallel forward;
// it is differentiable too. Do not redraw the features in the middle of a cached sequence.
struct PerformerAttentionOptions {
  PerformerAttentionOptions(std::int64_t hidden_size, std::int64_t num_heads)
      : hidden_size_(hidden_size), num_heads_(num_heads) {}
  TORCH_ARG(std::int64_t, hidden_size);        // D: a multiple of num_heads
  TORCH_ARG(std::int64_t, num_heads);          // H (> 0)
  TORCH_ARG(std::int64_t, num_features) = 64;  // m (≥ 1) random features per head
  TORCH_ARG(bool, causal) = true;              // causal (language model) or bidirectional
  TORCH_ARG(FavorMatrixKind, feature_kind) = FavorMatrixKind::orthogonal_chi;
  TORCH_ARG(std::uint64_t, seed) = 0;         // seed of the feature matrix
  TORCH_ARG(bool, per_head_features) = true;  // w [H, m, K] (default) or [m, K] shared
  TORCH_ARG(bool, qkv_bias) = false;          // biases in W_q, W_k, W_v
  TORCH_ARG(std::int64_t, chunk_size) = 64;   // the causal prefix-sum kernel's chunk length
  TORCH_ARG(PosEncoding, pos_encoding) = PosEncoding::none;  // K must be even unless none
  TORCH_ARG(double, rope_theta) = 10000.0;                   // PosEncoding::rope base (> 1)
  TORCH_ARG(RotaryLayout, rotary_layout) = RotaryLayout::half_split;
  // SelectiveRoPE submodule options (sizes set by the layer: D, H, K).
  TORCH_ARG(SelectiveRoPEOptions, selective_rope) = SelectiveRoPEOptions(0, 0, 0);
  // Refused when set (FAVOR+ has no context-parallel path here): an error names the option.
  TORCH_ARG(std::shared_ptr<ContextParallel>, context_parallel) = nullptr;
};

class PerformerAttentionImpl : public torch::nn::Cloneable<PerformerAttentionImpl> {
 public:
  explicit PerformerAttentionImpl(PerformerAttentionOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, LayerCache* cache = nullptr);
  // Draw the feature matrix anew from `seed` (kept in options.seed), in place, in its dtype.
  void redraw_features(std::uint64_t seed);

  PerformerAttentionOptions options;
  std::int64_t head_dim = 0;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  at::Tensor features;  // buffer w: [H, m, K] or [m, K]
  SelectiveRoPE rope{nullptr};
};
TORCH_MODULE(PerformerAttention);

}  // namespace phasor::nn
