// phasor::nn rotation encodings (phasor/nn.h, "Rotation encodings"): Cayley-STRING,
// Circulant-STRING and multi-subspace GRAPE-M as learnable modules, each applied to q and k as
// RoPE(θ_t) · M (E1). The orthogonal maps M are built with differentiable ATen operations (one
// K × K solve per head and forward call); θ comes from the nd_rope_angles op (phasor/torch.h).
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "layer_util.h"
#include "nn_util.h"
#include "phasor/nn.h"

namespace phasor::nn {
namespace {

using detail::check_option;
using detail::kPi;
using torch_detail::shape_of;

void check_options(const char* layer, const RotationEncodingOptions& o) {
  check_option(o.num_heads() > 0, layer, "num_heads", "a positive number",
               std::to_string(o.num_heads()));
  check_option(o.head_dim() > 0 && o.head_dim() % 2 == 0, layer, "head_dim",
               "a positive even head dimension K (rotation pairs)", std::to_string(o.head_dim()));
  check_option(o.rope_theta() > 1.0 && std::isfinite(o.rope_theta()), layer, "rope_theta",
               "a finite base > 1", std::to_string(o.rope_theta()));
  check_option(o.init_std() >= 0.0 && std::isfinite(o.init_std()), layer, "init_std",
               "a finite standard deviation ≥ 0", std::to_string(o.init_std()));
}

// A parameter shape with the leading head dimension when per_head.
std::vector<std::int64_t> head_shape(const RotationEncodingOptions& o,
                                     std::vector<std::int64_t> inner) {
  if (o.per_head()) inner.insert(inner.begin(), o.num_heads());
  return inner;
}

// RoPE's spectrum ω_i = base^(−2i/K), i < n (float32, the modules' default dtype).
at::Tensor rope_spectrum(std::int64_t n, std::int64_t head_dim, double base) {
  at::Tensor w = torch::empty({n}, torch::kDouble);
  auto a = w.accessor<double, 1>();
  for (std::int64_t i = 0; i < n; ++i)
    a[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  return w.to(at::kFloat);
}

// ω [1, R] or [H, 1, R] (one position axis), the RoPE spectrum; a parameter with learnable_omega.
at::Tensor make_omega(torch::nn::Module& self, const RotationEncodingOptions& o) {
  const std::int64_t R = o.head_dim() / 2;
  const at::Tensor w =
      rope_spectrum(R, o.head_dim(), o.rope_theta()).reshape({1, R}).expand(head_shape(o, {1, R}));
  if (o.learnable_omega())
    return self.register_parameter("omega", w.clone(at::MemoryFormat::Contiguous));
  return self.register_buffer("omega", w.clone(at::MemoryFormat::Contiguous));
}

// A generator parameter initialised at `init` plus N(0, init_std²).
at::Tensor make_generator(torch::nn::Module& self, const char* name,
                          const RotationEncodingOptions& o, const at::Tensor& init) {
  at::Tensor g = init.clone(at::MemoryFormat::Contiguous);
  if (o.init_std() > 0) g = g + torch::randn(g.sizes()) * o.init_std();
  return self.register_parameter(name, g);
}

// (I + S)^(−1)(I − S) for S = W − Wᵀ (per leading batch index): the Cayley map, orthogonal with
// det +1 because S is skew; equal to (I − S)(I + S)^(−1) as the factors commute (STRING eq. 10,
// GRAPE §3's suggested parameterisation). A linear solve, never an explicit inverse.
at::Tensor cayley(const at::Tensor& w) {
  const at::Tensor s = w - w.transpose(-1, -2);
  const at::Tensor eye = at::eye(w.size(-1), w.options()).expand(w.sizes());
  return at::linalg_solve(eye + s, eye - s);
}

// x [B, T, HX, K] ↦ M x per head, M [H, K, K] (HX a multiple of H: a query group shares its key
// head's map) or [K, K] (shared).
at::Tensor apply_map(const at::Tensor& m, const at::Tensor& x) {
  if (m.dim() == 2) return at::matmul(x, m.t());
  // Query head hq uses key head hq / group: view the heads as [H, group] rather than copying the
  // map group times.
  const auto s = x.sizes();
  const at::Tensor xg = x.reshape({s[0], s[1], m.size(0), -1, s[3]});
  return at::einsum("bthgk,hjk->bthgj", {xg, m}).reshape(s);
}

// θ [B, T, H, R] = (offset + t) · ω through nd_rope_angles (positions [1, T, 1], one axis).
at::Tensor token_angles(const at::Tensor& omega, std::int64_t heads, std::int64_t B, std::int64_t T,
                        std::int64_t offset, at::ScalarType dtype) {
  // Positions are formed in float64 (exact), then stored in dtype: float32 holds every integer
  // position below 2^24 exactly; the kernel multiplies in float64.
  const at::Tensor pos =
      (torch::arange(T, torch::kDouble) + static_cast<double>(offset)).to(dtype).reshape({1, T, 1});
  // Every batch row has the same positions: compute one row, then broadcast it.
  at::Tensor theta = phasor::nd_rope_angles(pos, omega.to(dtype));
  const std::int64_t R = theta.size(-1);
  if (theta.dim() == 3) theta = theta.unsqueeze(2);
  return theta.expand({B, T, heads, R}).contiguous();
}

// q [B, T, HQ, K] and k [B, T, H, K] as the module expects, in the dtype of its parameters.
void check_qk(const char* layer, const RotationEncodingOptions& o, const at::Tensor& q,
              const at::Tensor& k, const at::Tensor& parameter) {
  const std::int64_t H = o.num_heads(), K = o.head_dim();
  TORCH_CHECK(k.defined() && k.dim() == 4 && k.size(2) == H && k.size(3) == K, layer,
              ": argument 'k': expected shape [B, T, H=", H, ", K=", K, "], got ",
              k.defined() ? "shape " + shape_of(k) : std::string("an undefined tensor"));
  TORCH_CHECK(q.defined() && q.dim() == 4 && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                  q.size(2) % H == 0 && q.size(2) > 0 && q.size(3) == K,
              layer, ": argument 'q': expected shape [B=", k.size(0), ", T=", k.size(1),
              ", HQ (a multiple of H=", H, "), K=", K, "], got ",
              q.defined() ? "shape " + shape_of(q) : std::string("an undefined tensor"));
  for (const auto* t : {&q, &k})
    TORCH_CHECK(t->scalar_type() == parameter.scalar_type(), layer, ": argument '",
                t == &q ? "q" : "k", "': expected dtype ", parameter.scalar_type(),
                " (the module's parameters; convert with module->to(...)), got ", t->scalar_type());
}

}  // namespace

bool is_rotation_encoding(PosEncoding pe) {
  return pe == PosEncoding::string_cayley || pe == PosEncoding::string_circulant ||
         pe == PosEncoding::grape;
}

// ---- CayleyStringEncoding -----------------------------------------------------------------------

CayleyStringEncodingImpl::CayleyStringEncodingImpl(RotationEncodingOptions options_)
    : options(std::move(options_)) {
  reset();
}

void CayleyStringEncodingImpl::reset() {
  check_options("CayleyStringEncoding", options);
  const std::int64_t K = options.head_dim();
  // A = 0: S = 0 and P = I, so the encoding starts as RoPE exactly (STRING Theorem 3.4's special
  // case). dA = G − Gᵀ is not zero there, so A = 0 is no stationary point.
  generator =
      make_generator(*this, "generator", options, torch::zeros(head_shape(options, {K, K})));
  omega = make_omega(*this, options);
}

at::Tensor CayleyStringEncodingImpl::map() {
  return cayley(generator);
}
at::Tensor CayleyStringEncodingImpl::frequencies() {
  return omega;
}
at::Tensor CayleyStringEncodingImpl::angles(std::int64_t batch, std::int64_t seq_len,
                                            std::int64_t offset, at::ScalarType dtype) {
  return token_angles(omega, options.num_heads(), batch, seq_len, offset, dtype);
}
RotatedQK CayleyStringEncodingImpl::forward(const at::Tensor& q, const at::Tensor& k,
                                            std::int64_t offset) {
  check_qk("CayleyStringEncoding", options, q, k, generator);
  const at::Tensor m = map();
  return {apply_map(m, q), apply_map(m, k), angles(k.size(0), k.size(1), offset, k.scalar_type())};
}

// ---- CirculantStringEncoding --------------------------------------------------------------------

CirculantStringEncodingImpl::CirculantStringEncodingImpl(RotationEncodingOptions options_)
    : options(std::move(options_)) {
  reset();
}

void CirculantStringEncodingImpl::reset() {
  check_options("CirculantStringEncoding", options);
  const std::int64_t K = options.head_dim(), R = K / 2;
  const double k = static_cast<double>(K);
  // The real Fourier basis of R^K in the layer's pair layout. exp(L) = F⁻¹ diag(e^{iθ}) F (L a
  // skew circulant, string_rotation.h) acts on bin m (0 < m < K/2) with coordinates
  // a = ⟨√(2/K) cos(2πmn/K), z⟩, b = ⟨√(2/K) sin(2πmn/K), z⟩ as (a, b) ↦ (a cos θ + b sin θ,
  // b cos θ − a sin θ): apply_rotary's rotation by θ of the pair (b, a). Pair i = m − 1 is
  // therefore (sine, cosine) of bin m, and the last pair holds the two real bins 0 and K/2,
  // which every skew circulant leaves fixed (θ = 0).
  at::Tensor f = torch::zeros({K, K}, torch::kDouble);
  at::Tensor sn = torch::zeros({R, K}, torch::kDouble);
  auto fa = f.accessor<double, 2>();
  auto sa = sn.accessor<double, 2>();
  const bool half = options.rotary_layout() == RotaryLayout::half_split;
  for (std::int64_t i = 0; i < R; ++i) {
    const std::int64_t first = half ? i : 2 * i, second = half ? i + R : 2 * i + 1;
    for (std::int64_t n = 0; n < K; ++n) {
      if (i + 1 < R) {
        const double phase = 2.0 * kPi * static_cast<double>((i + 1) * n % K) / k;
        fa[first][n] = std::sqrt(2.0 / k) * std::sin(phase);
        fa[second][n] = std::sqrt(2.0 / k) * std::cos(phase);
        // μ_m = 2 Im(F c)_m = −2 Σ_j c_j sin(2πjm/K) (string_rotation.h), as a product with c.
        sa[i][n] = -2.0 * std::sin(phase);
      } else {
        fa[first][n] = 1.0 / std::sqrt(k);
        fa[second][n] = (n % 2 == 0 ? 1.0 : -1.0) / std::sqrt(k);
      }
    }
  }
  // Kept in float64 (not buffers, which module->to() would round): they are constants, cast to
  // the parameters' dtype on use, so a float64 module is orthogonal to float64 precision.
  fourier = f;
  sine = sn;
  // Initial c: μ_m = RoPE's ω_{m−1} for the K/2 − 1 rotating bins. With Σ_j sin(2πjm/K)
  // sin(2πjm'/K) = (K/2) δ_mm' (0 < m, m' < K/2), c_j = −(1/K) Σ_m μ_m sin(2πjm/K) gives them.
  const at::Tensor mu = rope_spectrum(R, K, options.rope_theta()).to(at::kDouble);
  const at::Tensor c0 = (mu.reshape({1, R}).matmul(sn) / (2.0 * k)).to(at::kFloat);  // [1, K]
  c = make_generator(*this, "c", options, c0.expand(head_shape(options, {1, K})));
}

at::Tensor CirculantStringEncodingImpl::map() {
  return fourier.to(c.scalar_type());
}
at::Tensor CirculantStringEncodingImpl::frequencies() {
  return at::matmul(c, sine.to(c.scalar_type()).t());  // [(H,) 1, K/2]; fixed pair's entry 0
}
at::Tensor CirculantStringEncodingImpl::angles(std::int64_t batch, std::int64_t seq_len,
                                               std::int64_t offset, at::ScalarType dtype) {
  return token_angles(frequencies(), options.num_heads(), batch, seq_len, offset, dtype);
}
RotatedQK CirculantStringEncodingImpl::forward(const at::Tensor& q, const at::Tensor& k,
                                               std::int64_t offset) {
  check_qk("CirculantStringEncoding", options, q, k, c);
  const at::Tensor m = map();
  return {apply_map(m, q), apply_map(m, k), angles(k.size(0), k.size(1), offset, k.scalar_type())};
}

// ---- GrapeEncoding ------------------------------------------------------------------------------

GrapeEncodingImpl::GrapeEncodingImpl(RotationEncodingOptions options_)
    : options(std::move(options_)) {
  reset();
}

void GrapeEncodingImpl::reset() {
  check_options("GrapeEncoding", options);
  const std::int64_t K = options.head_dim();
  // W = 0: B = I, the canonical planes, i.e. RoPE with the log-uniform spectrum (GRAPE §3).
  weight = make_generator(*this, "weight", options, torch::zeros(head_shape(options, {K, K})));
  omega = make_omega(*this, options);
}

at::Tensor GrapeEncodingImpl::basis() {
  return cayley(weight);
}
at::Tensor GrapeEncodingImpl::map() {
  return basis().transpose(-1, -2);
}
at::Tensor GrapeEncodingImpl::frequencies() {
  return omega;
}
at::Tensor GrapeEncodingImpl::angles(std::int64_t batch, std::int64_t seq_len, std::int64_t offset,
                                     at::ScalarType dtype) {
  return token_angles(omega, options.num_heads(), batch, seq_len, offset, dtype);
}
RotatedQK GrapeEncodingImpl::forward(const at::Tensor& q, const at::Tensor& k,
                                     std::int64_t offset) {
  check_qk("GrapeEncoding", options, q, k, weight);
  const at::Tensor m = map();
  return {apply_map(m, q), apply_map(m, k), angles(k.size(0), k.size(1), offset, k.scalar_type())};
}

// ---- RotationEncodings --------------------------------------------------------------------------

void RotationEncodings::build(torch::nn::Module& layer, PosEncoding pe,
                              RotationEncodingOptions options, std::int64_t heads,
                              std::int64_t head_dim, double rope_theta, RotaryLayout layout) {
  options.num_heads(heads).head_dim(head_dim).rope_theta(rope_theta).rotary_layout(layout);
  string_cayley = nullptr, string_circulant = nullptr, grape = nullptr;
  switch (pe) {
    case PosEncoding::string_cayley:
      string_cayley = layer.register_module("string_cayley", CayleyStringEncoding(options));
      break;
    case PosEncoding::string_circulant:
      string_circulant =
          layer.register_module("string_circulant", CirculantStringEncoding(options));
      break;
    case PosEncoding::grape:
      grape = layer.register_module("grape", GrapeEncoding(options));
      break;
    case PosEncoding::none:
    case PosEncoding::rope:
    case PosEncoding::selective_rope:
      break;
  }
}

bool RotationEncodings::defined() const {
  return !string_cayley.is_empty() || !string_circulant.is_empty() || !grape.is_empty();
}

at::Tensor RotationEncodings::rotate(at::Tensor& q, at::Tensor& k, std::int64_t offset) {
  RotatedQK r;
  if (!string_cayley.is_empty())
    r = string_cayley->forward(q, k, offset);
  else if (!string_circulant.is_empty())
    r = string_circulant->forward(q, k, offset);
  else if (!grape.is_empty())
    r = grape->forward(q, k, offset);
  else
    return {};
  q = r.q, k = r.k;
  return r.theta;
}

}  // namespace phasor::nn
