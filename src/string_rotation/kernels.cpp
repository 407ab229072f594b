// STRING ops: the optimized CPU kernels.
//   N-d RoPE angles:  (A1)–(A3) in float64 over blocks of tokens (C ≤ 3 in practice: plain loops).
//   Cayley-STRING:    per head, Q = (I + S)⁻¹ from one LU of I + S in float64, rounded once to the
//                     compute type and shared by all tokens of the head: products with Q per
//                     sequence (see CayleyHead for why not float32 solves); the rotation is
//                     phasor's apply_rotary.
//   Circulant-STRING: θ = (A1) with frequencies μ_c = 2 Im FFT(c_c) (computed once per call), then
//                     per token a real FFT (Eigen's FFT module, kissfft backend), the phase
//                     multiplication e^{iθ} on the half spectrum and an inverse real FFT.
// Work items write disjoint outputs; reductions over tokens (dω, dA, dc) are summed from
// per-item partials in a fixed order, so results do not depend on the thread count.
#include "common/eigen.h"  // first: see there

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <complex>
#include <unsupported/Eigen/FFT>
#include <vector>

#include "common/parallel.h"
#include "common/rotation.h"
#include "common/slices.h"
#include "phasor/rotary.h"
#include "rotary/kernels.h"
#include "string_rotation/kernels.h"

namespace phasor::detail::string_rotation {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr std::int64_t kTokenBlock = 256;  // tokens per angles work item

// An owning scratch tensor of the compute type S.
template <class S>
struct Scratch {
  std::vector<S> data;
  TensorView view;
  Scratch(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d)
      : data(static_cast<std::size_t>(a * b * c * d)),
        view(TensorView::of(data.data(), {a, b, c, d})) {}
};

struct TokenBlock {
  std::int64_t b, t0, t1;
};
std::int64_t token_blocks(std::int64_t B, std::int64_t T) {
  return B * ((T + kTokenBlock - 1) / kTokenBlock);
}
TokenBlock token_block(std::int64_t T, std::int64_t item) {
  const std::int64_t per_row = (T + kTokenBlock - 1) / kTokenBlock;
  const std::int64_t b = item / per_row, t0 = (item % per_row) * kTokenBlock;
  return {b, t0, std::min(T, t0 + kTokenBlock)};
}

// ω [Hw, C, R] as float64, contiguous.
std::vector<double> load3(const TensorView& x) {
  std::vector<double> out(static_cast<std::size_t>(x.size(0) * x.size(1) * x.size(2)));
  std::size_t n = 0;
  for (std::int64_t a = 0; a < x.size(0); ++a)
    for (std::int64_t b = 0; b < x.size(1); ++b)
      for (std::int64_t c = 0; c < x.size(2); ++c) out[n++] = get(x, offset_of(x, a, b, c));
  return out;
}

// The angles with ω given as contiguous float64 [Hw, C, R].
void angles_forward_dense(const TensorView& positions, const std::vector<double>& w,
                          std::int64_t Hw, std::int64_t R, const TensorView& theta) {
  const std::int64_t B = theta.size(0), T = theta.size(1), Ht = theta.size(2),
                     C = positions.size(2);
  parallel_for(token_blocks(B, T), [&](std::int64_t item) {
    const TokenBlock blk = token_block(T, item);
    std::vector<double> r(static_cast<std::size_t>(C)), row(static_cast<std::size_t>(R));
    for (std::int64_t t = blk.t0; t < blk.t1; ++t) {
      for (std::int64_t c = 0; c < C; ++c)
        r[static_cast<std::size_t>(c)] = get(positions, offset_of(positions, blk.b, t, c));
      for (std::int64_t h = 0; h < Ht; ++h) {
        const double* wh = w.data() + (Hw == 1 ? 0 : h) * C * R;
        std::fill(row.begin(), row.end(), 0.0);
        for (std::int64_t c = 0; c < C; ++c) {
          const double rc = r[static_cast<std::size_t>(c)];
          for (std::int64_t i = 0; i < R; ++i)
            row[static_cast<std::size_t>(i)] += rc * wh[c * R + i];
        }
        const std::int64_t base =
            blk.b * theta.stride(0) + t * theta.stride(1) + h * theta.stride(2);
        if (theta.dtype == DType::float64 && theta.stride(3) == 1)
          std::copy(row.begin(), row.end(), static_cast<double*>(theta.data) + base);
        else
          for (std::int64_t i = 0; i < R; ++i)
            put(theta, base + i * theta.stride(3), row[static_cast<std::size_t>(i)]);
      }
    }
  });
}

// (A2), (A3) with ω contiguous float64; dω returned as float64 [Hw, C, R] (summed in item order).
std::vector<double> angles_backward_dense(const TensorView& positions, const std::vector<double>& w,
                                          std::int64_t Hw, std::int64_t R,
                                          const TensorView& d_theta, const TensorView& d_positions,
                                          bool want_domega) {
  const std::int64_t B = d_theta.size(0), T = d_theta.size(1), Ht = d_theta.size(2),
                     C = positions.size(2);
  const std::int64_t items = token_blocks(B, T);
  const auto wsize = static_cast<std::size_t>(Hw * C * R);
  std::vector<std::vector<double>> partial(static_cast<std::size_t>(items));
  parallel_for(items, [&](std::int64_t item) {
    const TokenBlock blk = token_block(T, item);
    std::vector<double>& dw = partial[static_cast<std::size_t>(item)];
    if (want_domega) dw.assign(wsize, 0.0);
    std::vector<double> r(static_cast<std::size_t>(C)), dr(static_cast<std::size_t>(C)),
        dth(static_cast<std::size_t>(R));
    for (std::int64_t t = blk.t0; t < blk.t1; ++t) {
      for (std::int64_t c = 0; c < C; ++c)
        r[static_cast<std::size_t>(c)] = get(positions, offset_of(positions, blk.b, t, c));
      std::fill(dr.begin(), dr.end(), 0.0);
      for (std::int64_t h = 0; h < Ht; ++h) {
        const std::int64_t hw = Hw == 1 ? 0 : h;
        const std::int64_t base =
            blk.b * d_theta.stride(0) + t * d_theta.stride(1) + h * d_theta.stride(2);
        for (std::int64_t i = 0; i < R; ++i)
          dth[static_cast<std::size_t>(i)] = get(d_theta, base + i * d_theta.stride(3));
        for (std::int64_t c = 0; c < C; ++c) {
          const double* wh = w.data() + (hw * C + c) * R;
          double s = 0;
          for (std::int64_t i = 0; i < R; ++i) s += dth[static_cast<std::size_t>(i)] * wh[i];
          dr[static_cast<std::size_t>(c)] += s;
          if (want_domega) {
            double* g = dw.data() + (hw * C + c) * R;
            const double rc = r[static_cast<std::size_t>(c)];
            for (std::int64_t i = 0; i < R; ++i) g[i] += dth[static_cast<std::size_t>(i)] * rc;
          }
        }
      }
      if (d_positions.defined())
        for (std::int64_t c = 0; c < C; ++c)
          put(d_positions, offset_of(d_positions, blk.b, t, c), dr[static_cast<std::size_t>(c)]);
    }
  });
  std::vector<double> total(want_domega ? wsize : 0, 0.0);
  if (want_domega)
    for (const auto& part : partial)
      for (std::size_t n = 0; n < wsize; ++n) total[n] += part[n];
  return total;
}

void store3(const std::vector<double>& v, const TensorView& x) {
  std::size_t n = 0;
  for (std::int64_t a = 0; a < x.size(0); ++a)
    for (std::int64_t b = 0; b < x.size(1); ++b)
      for (std::int64_t c = 0; c < x.size(2); ++c) put(x, offset_of(x, a, b, c), v[n++]);
}

}  // namespace

void angles_forward(const TensorView& positions, const TensorView& omega, const TensorView& theta) {
  angles_forward_dense(positions, load3(omega), omega.size(0), omega.size(2), theta);
}

void angles_backward(const TensorView& positions, const TensorView& omega,
                     const TensorView& d_theta, const TensorView& d_positions,
                     const TensorView& d_omega) {
  const std::vector<double> dw =
      angles_backward_dense(positions, load3(omega), omega.size(0), omega.size(2), d_theta,
                            d_positions, d_omega.defined());
  if (d_omega.defined()) store3(dw, d_omega);
}

// ---------------------------------------------------------------------------------------------
// Cayley-STRING.

namespace {

template <class S>
using ColMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;

template <class S>
ColMat<S> skew_matrix(const TensorView& generator, std::int64_t h) {
  const std::int64_t K = generator.size(1), g = generator.size(0) == 1 ? 0 : h;
  ColMat<double> A(K, K);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < K; ++j) A(i, j) = get(generator, offset_of(generator, g, i, j));
  return (A - A.transpose()).template cast<S>();
}

// Per head: Q = (I + S)⁻¹, formed in float64 (one LU of I + S and K solves, O(K³) once per call)
// and rounded once to the compute type. Every token then needs products with Q only:
//   w = Q z,   u = P z = (I − S) w = 2 w − z   (I − S = 2I − (I + S)),
// and in the backward v = Qᵀ du, dz = Pᵀ du = 2 v − du, G = −Σ (du + dz) wᵀ = −2 Σ v wᵀ.
// For large S, (I + S) has a condition number of about |S|: a solve in float32 loses that many
// digits (u, dz and dA off by ~1e-4 at |A| ≈ 1e4), while Q in float64 is exact to float32's
// rounding, and |Q| ≤ 1 (S is skew), so the products lose nothing. The forms 2 w − z, 2 v − du
// and 2 v wᵀ also avoid the cancellations of (I − S) w (terms of |S||w| summing to |z|) and of
// du + dz (P ≈ −I away from S's small eigenvalues, so dz ≈ −du).
template <class S>
struct CayleyHead {
  ColMat<S> Q;
};

// Wᵀ = Q Zᵀ (K × T, tokens as columns) for the tokens Z (rows) of one sequence and head.
template <class S>
ColMat<S> w_of_tokens(const CayleyHead<S>& head, const Mat<S>& Z) {
  return head.Q * Z.transpose();
}

template <class S>
std::vector<CayleyHead<S>> cayley_heads(const CayleyProblem& p) {
  const std::int64_t K = p.z.size(3);
  std::vector<CayleyHead<S>> heads(static_cast<std::size_t>(p.generator.size(0)));
  parallel_for(p.generator.size(0), [&](std::int64_t h) {
    const ColMat<double> I = ColMat<double>::Identity(K, K);
    const Eigen::PartialPivLU<ColMat<double>> lu(I + skew_matrix<double>(p.generator, h));
    heads[static_cast<std::size_t>(h)].Q = lu.solve(I).template cast<S>();
  });
  return heads;
}

// u = P z for every token into `u` ([B, T, H, K], compute type).
template <class S>
void cayley_apply_P(const CayleyProblem& p, const std::vector<CayleyHead<S>>& heads,
                    const TensorView& u) {
  const std::int64_t B = p.z.size(0), H = p.z.size(2);
  parallel_for(B * H, [&](std::int64_t item) {
    const std::int64_t b = item / H, h = item % H;
    const auto& hd = heads[static_cast<std::size_t>(heads.size() == 1 ? 0 : h)];
    Mat<S> Z;
    load_rows(p.z, Sequence{b, 0, p.z.size(1)}, h, Z);
    const Mat<S> U = (S(2) * w_of_tokens(hd, Z)).transpose() - Z;  // u = 2 w − z
    store_rows(U, u, Sequence{b, 0, p.z.size(1)}, h);
  });
}

template <class S>
void cayley_forward_t(const CayleyProblem& p, const TensorView& y) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3);
  const std::vector<CayleyHead<S>> heads = cayley_heads<S>(p);
  Scratch<S> u(B, T, H, K);
  Scratch<double> theta(B, T, p.omega.size(0), K / 2);
  cayley_apply_P(p, heads, u.view);
  angles_forward(p.positions, p.omega, theta.view);
  const TensorView th = theta.view.size(2) == 1 ? broadcast_heads(theta.view, H) : theta.view;
  apply_rotary_forward(u.view, th, p.layout, Impl::chunk, y);
}

template <class S>
void cayley_backward_t(const CayleyProblem& p, const TensorView& dy, const CayleyStringGrads& g) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3);
  const std::vector<CayleyHead<S>> heads = cayley_heads<S>(p);
  Scratch<S> u(B, T, H, K), du(B, T, H, K);
  Scratch<double> theta(B, T, p.omega.size(0), K / 2), dtheta(B, T, H, K / 2);
  cayley_apply_P(p, heads, u.view);
  angles_forward(p.positions, p.omega, theta.view);
  const TensorView th = theta.view.size(2) == 1 ? broadcast_heads(theta.view, H) : theta.view;
  // du = RoPE(θ)ᵀ dy, dθ (phasor's apply_rotary backward), then dr, dω by (A2), (A3).
  apply_rotary_backward(u.view, th, p.layout, Impl::chunk, dy, du.view, dtheta.view);
  if (g.d_positions.defined() || g.d_omega.defined())
    angles_backward(p.positions, p.omega, dtheta.view, g.d_positions, g.d_omega);
  // dz = 2 v − du and G_h = −2 Σ v wᵀ with v = Qᵀ du (see CayleyHead; float64 accumulation per
  // (b, h) item).
  const bool want_dA = g.d_generator.defined();
  std::vector<ColMat<double>> G(static_cast<std::size_t>(B * H));
  parallel_for(B * H, [&](std::int64_t item) {
    const std::int64_t b = item / H, h = item % H;
    const auto& hd = heads[static_cast<std::size_t>(heads.size() == 1 ? 0 : h)];
    Mat<S> DU;
    load_rows(du.view, Sequence{b, 0, T}, h, DU);
    const ColMat<S> Vt = hd.Q.transpose() * DU.transpose();  // v = Qᵀ du
    if (g.dz.defined()) store_rows(Mat<S>(S(2) * Vt.transpose() - DU), g.dz, Sequence{b, 0, T}, h);
    if (want_dA) {
      Mat<S> Z;
      load_rows(p.z, Sequence{b, 0, T}, h, Z);
      G[static_cast<std::size_t>(item)] =
          -(S(2) * Vt * w_of_tokens(hd, Z).transpose()).template cast<double>();
    }
  });
  if (!want_dA) return;
  const std::int64_t Ha = p.generator.size(0);
  for (std::int64_t ha = 0; ha < Ha; ++ha) {
    ColMat<double> Gh = ColMat<double>::Zero(K, K);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        if (Ha == 1 || h == ha) Gh += G[static_cast<std::size_t>(b * H + h)];
    const ColMat<double> dA = Gh - Gh.transpose();  // S = A − Aᵀ
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t j = 0; j < K; ++j)
        put(g.d_generator, offset_of(g.d_generator, ha, i, j), dA(i, j));
  }
}

}  // namespace

void cayley_forward(const CayleyProblem& p, const TensorView& y) {
  dispatch_float(p.z, [&](auto s) { cayley_forward_t<decltype(s)>(p, y); });
}
void cayley_backward(const CayleyProblem& p, const TensorView& dy, const CayleyStringGrads& grads) {
  dispatch_float(p.z, [&](auto s) { cayley_backward_t<decltype(s)>(p, dy, grads); });
}

// ---------------------------------------------------------------------------------------------
// Circulant-STRING.

namespace {

// sin(2π n/K) for n ∈ [0, K), exactly 0 at n = 0 and n = K/2 (where the half-spectrum bins are
// real: μ there is identically 0, and no gradient may flow into it).
std::vector<double> sin_table(std::int64_t K) {
  std::vector<double> s(static_cast<std::size_t>(K));
  for (std::int64_t n = 0; n < K; ++n)
    s[static_cast<std::size_t>(n)] =
        (n == 0 || 2 * n == K)
            ? 0.0
            : std::sin(2.0 * kPi * static_cast<double>(n) / static_cast<double>(K));
  return s;
}

// μ[h, c, m] = −2 Σ_j c[h, c, j] sin(2π jm/K) for the half spectrum m < M = ⌊K/2⌋ + 1.
std::vector<double> spectrum(const TensorView& c, const std::vector<double>& sn) {
  const std::int64_t Hc = c.size(0), C = c.size(1), K = c.size(2), M = K / 2 + 1;
  const std::vector<double> cv = load3(c);
  std::vector<double> mu(static_cast<std::size_t>(Hc * C * M), 0.0);
  for (std::int64_t hc = 0; hc < Hc * C; ++hc)
    for (std::int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (std::int64_t j = 0; j < K; ++j)
        s += cv[static_cast<std::size_t>(hc * K + j)] * sn[static_cast<std::size_t>((j * m) % K)];
      mu[static_cast<std::size_t>(hc * M + m)] = -2.0 * s;
    }
  return mu;
}

// dst[b, t, h, :] = src[b, t, h, :] for every token.
template <class S>
void copy_tokens(const TensorView& src, const TensorView& dst) {
  for (std::int64_t b = 0; b < src.size(0); ++b)
    for (std::int64_t h = 0; h < src.size(2); ++h) {
      Mat<S> X;
      load_rows(src, Sequence{b, 0, src.size(1)}, h, X);
      store_rows(X, dst, Sequence{b, 0, src.size(1)}, h);
    }
}

// cos/sin of the phases of every (row, coefficient head), computed once: with c shared by the
// heads (Hc = 1) every head reuses them.
template <class S>
std::vector<PairAngles<S>> phase_table(const TensorView& theta) {
  const std::int64_t B = theta.size(0), T = theta.size(1), Hc = theta.size(2);
  std::vector<PairAngles<S>> table(static_cast<std::size_t>(B * Hc));
  parallel_for(B * Hc, [&](std::int64_t i) {
    table[static_cast<std::size_t>(i)].load(theta, Sequence{i / Hc, 0, T}, i % Hc);
  });
  return table;
}

template <class S>
void circulant_forward_t(const CirculantProblem& p, const TensorView& y) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3),
                     M = K / 2 + 1, Hc = p.c.size(0);
  if (K == 1) {  // L(r) = 0 (a 1 × 1 skew matrix): y = z (kissfft has no size-1 plan)
    copy_tokens<S>(p.z, y);
    return;
  }
  const std::vector<double> mu = spectrum(p.c, sin_table(K));
  Scratch<double> theta(B, T, Hc, M);
  angles_forward_dense(p.positions, mu, Hc, M, theta.view);
  const std::vector<PairAngles<S>> table = phase_table<S>(theta.view);
  parallel_for(B * H, [&](std::int64_t item) {
    const std::int64_t b = item / H, h = item % H;
    const PairAngles<S>& e = table[static_cast<std::size_t>(b * Hc + (Hc == 1 ? 0 : h))];
    Mat<S> Z, Y(T, K);
    load_rows(p.z, Sequence{b, 0, T}, h, Z);
    Eigen::FFT<S> fft;
    fft.SetFlag(Eigen::FFT<S>::HalfSpectrum);
    std::vector<std::complex<S>> spec(static_cast<std::size_t>(M));
    for (std::int64_t t = 0; t < T; ++t) {
      fft.fwd(spec.data(), Z.data() + t * K, K);
      for (std::int64_t m = 0; m < M; ++m)
        spec[static_cast<std::size_t>(m)] *= std::complex<S>(e.cos(t, m), e.sin(t, m));
      fft.inv(Y.data() + t * K, spec.data(), K);
    }
    store_rows(Y, y, Sequence{b, 0, T}, h);
  });
}

template <class S>
void circulant_backward_t(const CirculantProblem& p, const TensorView& dy,
                          const CirculantStringGrads& g) {
  const std::int64_t B = p.z.size(0), T = p.z.size(1), H = p.z.size(2), K = p.z.size(3),
                     M = K / 2 + 1, Hc = p.c.size(0), C = p.c.size(1);
  if (K == 1) {  // L(r) = 0: dz = dy, and r and c do not change the output
    if (g.dz.defined()) copy_tokens<S>(dy, g.dz);
    if (g.d_positions.defined())
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t c = 0; c < C; ++c)
            put(g.d_positions, offset_of(g.d_positions, b, t, c), 0.0);
    if (g.dc.defined()) store3(std::vector<double>(static_cast<std::size_t>(Hc * C), 0.0), g.dc);
    return;
  }
  const std::vector<double> sn = sin_table(K);
  const std::vector<double> mu = spectrum(p.c, sn);
  Scratch<double> theta(B, T, Hc, M), dtheta(B, T, H, M);
  angles_forward_dense(p.positions, mu, Hc, M, theta.view);
  const std::vector<PairAngles<S>> table = phase_table<S>(theta.view);
  const S scale = S(-2.0 / static_cast<double>(K));
  parallel_for(B * H, [&](std::int64_t item) {
    const std::int64_t b = item / H, h = item % H;
    const PairAngles<S>& e = table[static_cast<std::size_t>(b * Hc + (Hc == 1 ? 0 : h))];
    Mat<S> Z, DY, DZ(T, K);
    Mat<double> DT(T, M);
    load_rows(p.z, Sequence{b, 0, T}, h, Z);
    load_rows(dy, Sequence{b, 0, T}, h, DY);
    Eigen::FFT<S> fft;
    fft.SetFlag(Eigen::FFT<S>::HalfSpectrum);
    std::vector<std::complex<S>> zs(static_cast<std::size_t>(M)), ds(static_cast<std::size_t>(M));
    for (std::int64_t t = 0; t < T; ++t) {
      fft.fwd(zs.data(), Z.data() + t * K, K);
      fft.fwd(ds.data(), DY.data() + t * K, K);
      for (std::int64_t m = 0; m < M; ++m) {
        const auto mi = static_cast<std::size_t>(m);
        const std::complex<S> ph(e.cos(t, m), e.sin(t, m));
        const std::complex<S> Ym = ph * zs[mi];
        // dθ_m = −(2/K) Im(Y_m conj(DY_m)): bins m and K − m together; 0 at the real bins.
        DT(t, m) = (m == 0 || 2 * m == K)
                       ? 0.0
                       : static_cast<double>(scale * std::imag(Ym * std::conj(ds[mi])));
        ds[mi] *= std::conj(ph);  // e^{−iθ} DY
      }
      if (g.dz.defined()) fft.inv(DZ.data() + t * K, ds.data(), K);
    }
    if (g.dz.defined()) store_rows(DZ, g.dz, Sequence{b, 0, T}, h);
    store_rows(DT, dtheta.view, Sequence{b, 0, T}, h);
  });
  const std::vector<double> dmu =
      angles_backward_dense(p.positions, mu, Hc, M, dtheta.view, g.d_positions, g.dc.defined());
  if (!g.dc.defined()) return;
  // dc[h, c, j] = −2 Σ_m dμ[h, c, m] sin(2π jm/K).
  for (std::int64_t hc = 0; hc < Hc; ++hc)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t j = 0; j < K; ++j) {
        double s = 0;
        for (std::int64_t m = 0; m < M; ++m)
          s += dmu[static_cast<std::size_t>((hc * C + c) * M + m)] *
               sn[static_cast<std::size_t>((j * m) % K)];
        put(g.dc, offset_of(g.dc, hc, c, j), -2.0 * s);
      }
}

}  // namespace

void circulant_forward(const CirculantProblem& p, const TensorView& y) {
  dispatch_float(p.z, [&](auto s) { circulant_forward_t<decltype(s)>(p, y); });
}
void circulant_backward(const CirculantProblem& p, const TensorView& dy,
                        const CirculantStringGrads& grads) {
  dispatch_float(p.z, [&](auto s) { circulant_backward_t<decltype(s)>(p, dy, grads); });
}

}  // namespace phasor::detail::string_rotation
