// GRAPE-M ops: the float64 reference, plain loops straight from the equations in grape.h. It
// reads and writes views element by element and forms the dense generator L = a bᵀ − b aᵀ of
// every token (O(K²)); the tests trust it.
#include <cmath>
#include <vector>

#include "grape/kernels.h"
#include "phasor/rotary.h"

namespace phasor::detail::grape {
namespace {

using Vector = std::vector<double>;
using Matrix = std::vector<double>;  // K × K, row-major

// L = a bᵀ − b aᵀ (§2.1).
// L = a bᵀ − b aᵀ, skew by construction: L_ii = 0 and L_ji = −L_ij exactly. Computed entry by
// entry, a_i b_i − b_i a_i is not 0 when the compiler contracts it into an FMA (it is then the
// rounding error of the product): for K = 1, or a ∥ b, L would rotate by that noise.
Matrix generator(const Vector& a, const Vector& b) {
  const std::size_t K = a.size();
  Matrix L(K * K, 0.0);
  for (std::size_t i = 0; i < K; ++i)
    for (std::size_t j = i + 1; j < K; ++j) {
      L[i * K + j] = a[i] * b[j] - b[i] * a[j];
      L[j * K + i] = -L[i * K + j];
    }
  return L;
}
Vector times(const Matrix& L, const Vector& x) {
  const std::size_t K = x.size();
  Vector y(K, 0.0);
  for (std::size_t i = 0; i < K; ++i)
    for (std::size_t j = 0; j < K; ++j) y[i] += L[i * K + j] * x[j];
  return y;
}
double dot(const Vector& x, const Vector& y) {
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

struct PlaneInputs {
  Vector a, b;
  Matrix L;
  double nu = 0;  // ν = √Δ, Δ = αβ − γ² = ½ ‖L‖_F²
};
PlaneInputs plane_inputs(const PlaneProblem& p, std::int64_t h) {
  PlaneInputs in;
  in.a.resize(static_cast<std::size_t>(p.K));
  in.b.resize(static_cast<std::size_t>(p.K));
  for (std::int64_t k = 0; k < p.K; ++k) {
    in.a[static_cast<std::size_t>(k)] = get(p.a, head_vector_offset(p.a, p.ab_per_head, h, k));
    in.b[static_cast<std::size_t>(k)] = get(p.b, head_vector_offset(p.b, p.ab_per_head, h, k));
  }
  in.L = generator(in.a, in.b);
  double delta = 0;
  for (double l : in.L) delta += 0.5 * l * l;
  in.nu = std::sqrt(delta);
  return in;
}
Vector load_vector(const TensorView& x, std::int64_t b, std::int64_t t, std::int64_t h,
                   std::int64_t K) {
  Vector v(static_cast<std::size_t>(K));
  for (std::int64_t k = 0; k < K; ++k)
    v[static_cast<std::size_t>(k)] = get(x, offset_of(x, b, t, h, k));
  return v;
}
void store_vector(const Vector& v, const TensorView& x, std::int64_t b, std::int64_t t,
                  std::int64_t h) {
  for (std::size_t k = 0; k < v.size(); ++k)
    put(x, offset_of(x, b, t, h, static_cast<std::int64_t>(k)), v[k]);
}

}  // namespace

// y = z + A L z + C L² z,  A = sin(ην)/ν = η f1(ην),  C = (1 − cos ην)/ν² = η² f2(ην).
void reference_plane_forward(const PlaneProblem& p, const TensorView& y) {
  for (std::int64_t h = 0; h < p.H; ++h) {
    const PlaneInputs in = plane_inputs(p, h);
    const double w = get(p.omega, offset_of(p.omega, h));
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t t = 0; t < p.T; ++t) {
        const double eta = get(p.positions, position_offset(p, p.positions, b, t, h)) * w;
        const RodriguesScalars r = rodrigues_scalars(eta * in.nu);
        const Vector z = load_vector(p.z, b, t, h, p.K);
        const Vector Lz = times(in.L, z), L2z = times(in.L, Lz);
        Vector out(z.size());
        for (std::size_t k = 0; k < z.size(); ++k)
          out[k] = z[k] + eta * r.f1 * Lz[k] + eta * eta * r.f2 * L2z[k];
        store_vector(out, y, b, t, h);
      }
  }
}

// With g = dy, P1 = gᵀ L z, P2 = gᵀ L² z (so that gᵀ y = gᵀ z + A P1 + C P2):
//   dz = G(−η) g = g − A L g + C L² g
//   dη = (∂A/∂η) P1 + (∂C/∂η) P2 = cos(ην) P1 + A P2
//   dΔ = (∂A/∂Δ) P1 + (∂C/∂Δ) P2 = η³ g1 / 2 · P1 + η⁴ g2 · P2
//   ∂/∂L (L free): M = A g zᵀ + C (g (L z)ᵀ + (Lᵀ g) zᵀ) + dΔ L     (∂Δ/∂L = L as Δ = ½‖L‖_F²)
//   and from L = a bᵀ − b aᵀ:  da = (M − Mᵀ) b,  db = −(M − Mᵀ) a.
void reference_plane_backward(const PlaneProblem& p, const TensorView& dy, const GrapeGrads& g) {
  const std::size_t K = static_cast<std::size_t>(p.K);
  const std::int64_t vec_rows = p.ab_per_head ? p.H : 1;
  std::vector<Vector> da(static_cast<std::size_t>(vec_rows), Vector(K, 0.0)), db = da;
  Vector d_omega(static_cast<std::size_t>(p.H), 0.0);
  std::vector<double> d_pos(static_cast<std::size_t>(p.B * p.T * (p.positions_per_head ? p.H : 1)),
                            0.0);
  for (std::int64_t h = 0; h < p.H; ++h) {
    const PlaneInputs in = plane_inputs(p, h);
    const double w = get(p.omega, offset_of(p.omega, h));
    Vector& da_h = da[static_cast<std::size_t>(p.ab_per_head ? h : 0)];
    Vector& db_h = db[static_cast<std::size_t>(p.ab_per_head ? h : 0)];
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t t = 0; t < p.T; ++t) {
        const double pos = get(p.positions, position_offset(p, p.positions, b, t, h));
        const double eta = pos * w;
        const RodriguesScalars r = rodrigues_scalars(eta * in.nu);
        const double A = eta * r.f1, C = eta * eta * r.f2;
        const Vector z = load_vector(p.z, b, t, h, p.K), gv = load_vector(dy, b, t, h, p.K);
        const Vector Lz = times(in.L, z), L2z = times(in.L, Lz);
        const Vector Lg = times(in.L, gv), L2g = times(in.L, Lg);
        if (g.dz.defined()) {
          Vector dz(K);
          for (std::size_t k = 0; k < K; ++k) dz[k] = gv[k] - A * Lg[k] + C * L2g[k];
          store_vector(dz, g.dz, b, t, h);
        }
        const double P1 = dot(gv, Lz), P2 = dot(gv, L2z);
        const double d_eta = r.cos_x * P1 + A * P2;
        d_omega[static_cast<std::size_t>(h)] += d_eta * pos;
        const std::int64_t pos_index = p.positions_per_head ? (b * p.T + t) * p.H + h : b * p.T + t;
        d_pos[static_cast<std::size_t>(pos_index)] += d_eta * w;
        if (!g.da.defined() && !g.db.defined()) continue;
        const double d_delta =
            0.5 * eta * eta * eta * r.g1 * P1 + eta * eta * eta * eta * r.g2 * P2;
        // Lᵀ g = −L g.
        Matrix M(K * K);
        for (std::size_t i = 0; i < K; ++i)
          for (std::size_t j = 0; j < K; ++j)
            M[i * K + j] =
                A * gv[i] * z[j] + C * (gv[i] * Lz[j] - Lg[i] * z[j]) + d_delta * in.L[i * K + j];
        for (std::size_t i = 0; i < K; ++i)
          for (std::size_t j = 0; j < K; ++j) {
            const double W = M[i * K + j] - M[j * K + i];
            da_h[i] += W * in.b[j];
            db_h[i] -= W * in.a[j];
          }
      }
  }
  for (std::int64_t r = 0; r < vec_rows; ++r)
    for (std::int64_t k = 0; k < p.K; ++k) {
      if (g.da.defined())
        put(g.da, head_vector_offset(g.da, p.ab_per_head, r, k),
            da[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)]);
      if (g.db.defined())
        put(g.db, head_vector_offset(g.db, p.ab_per_head, r, k),
            db[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)]);
    }
  if (g.d_omega.defined())
    for (std::int64_t h = 0; h < p.H; ++h)
      put(g.d_omega, offset_of(g.d_omega, h), d_omega[static_cast<std::size_t>(h)]);
  if (g.d_positions.defined())
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t t = 0; t < p.T; ++t)
        for (std::int64_t h = 0; h < (p.positions_per_head ? p.H : 1); ++h) {
          const std::int64_t index = p.positions_per_head ? (b * p.T + t) * p.H + h : b * p.T + t;
          put(g.d_positions, position_offset(p, g.d_positions, b, t, h),
              d_pos[static_cast<std::size_t>(index)]);
        }
}

// ---------------------------------------------------------------------------------------------
// Multi-subspace: x1 = Bᵀ z, x2 = RoPE(θ) x1 (apply_rotary's reference), y = B x2.
namespace {

double basis_at(const SubspaceProblem& p, std::int64_t h, std::int64_t i, std::int64_t j) {
  return get(p.basis, p.basis_per_head ? offset_of(p.basis, h, i, j) : offset_of(p.basis, i, j));
}

// out[b, t, h, :] = Bᵀ x (transpose) or B x, for every token; x, out: contiguous float64 buffers
// or views [B, T, H, K].
void multiply(const SubspaceProblem& p, const TensorView& x, bool transpose,
              const TensorView& out) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t t = 0; t < p.T; ++t)
      for (std::int64_t h = 0; h < p.H; ++h)
        for (std::int64_t i = 0; i < p.K; ++i) {
          double s = 0;
          for (std::int64_t j = 0; j < p.K; ++j)
            s += (transpose ? basis_at(p, h, j, i) : basis_at(p, h, i, j)) *
                 get(x, offset_of(x, b, t, h, j));
          put(out, offset_of(out, b, t, h, i), s);
        }
}

struct Buffer {
  std::vector<double> data;
  TensorView view;
  explicit Buffer(const SubspaceProblem& p)
      : data(static_cast<std::size_t>(p.B * p.T * p.H * p.K), 0.0),
        view(TensorView::of(data.data(), {p.B, p.T, p.H, p.K})) {}
};

}  // namespace

void reference_subspace_forward(const SubspaceProblem& p, const TensorView& y) {
  Buffer x1(p), x2(p);
  multiply(p, p.z, /*transpose=*/true, x1.view);
  apply_rotary_forward(x1.view, p.theta, p.layout, Impl::reference, x2.view);
  multiply(p, x2.view, /*transpose=*/false, y);
}

// dx2 = Bᵀ dy; (dx1, dθ) from apply_rotary's reference backward; dz = B dx1;
// dB = Σ_tokens dy x2ᵀ + z dx1ᵀ.
void reference_subspace_backward(const SubspaceProblem& p, const TensorView& dy,
                                 const GrapeSubspaceGrads& g) {
  Buffer x1(p), x2(p), dx2(p), dx1(p);
  multiply(p, p.z, true, x1.view);
  apply_rotary_forward(x1.view, p.theta, p.layout, Impl::reference, x2.view);
  multiply(p, dy, true, dx2.view);
  apply_rotary_backward(x1.view, p.theta, p.layout, Impl::reference, dx2.view, dx1.view, g.d_theta);
  if (g.d_basis.defined()) {
    const std::int64_t heads = p.basis_per_head ? p.H : 1;
    std::vector<double> dB(static_cast<std::size_t>(heads * p.K * p.K), 0.0);
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t t = 0; t < p.T; ++t)
        for (std::int64_t h = 0; h < p.H; ++h)
          for (std::int64_t i = 0; i < p.K; ++i)
            for (std::int64_t j = 0; j < p.K; ++j)
              dB[static_cast<std::size_t>(((p.basis_per_head ? h : 0) * p.K + i) * p.K + j)] +=
                  get(dy, offset_of(dy, b, t, h, i)) *
                      get(x2.view, offset_of(x2.view, b, t, h, j)) +
                  get(p.z, offset_of(p.z, b, t, h, i)) *
                      get(dx1.view, offset_of(dx1.view, b, t, h, j));
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < p.K; ++i)
        for (std::int64_t j = 0; j < p.K; ++j)
          put(g.d_basis,
              p.basis_per_head ? offset_of(g.d_basis, h, i, j) : offset_of(g.d_basis, i, j),
              dB[static_cast<std::size_t>((h * p.K + i) * p.K + j)]);
  }
  if (g.dz.defined()) multiply(p, dx1.view, false, g.dz);
}

}  // namespace phasor::detail::grape
