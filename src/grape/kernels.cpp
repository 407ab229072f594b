// GRAPE-M ops: the optimized CPU kernels.
//
// Single plane: per head, the plane is orthogonalised once, (a, b⊥) with b⊥ = b − (γ/α) a (same
// generator L = a b⊥ᵀ − b⊥ aᵀ), so every token costs four dot products and a rank-2 update of
// its row — O(K), no L, no cancellation when a ∥ b (see grape.h). Work items are
// (batch row, head, block of tokens); a block's rows are loaded into owned Eigen storage and
// handled with matrix-vector products.
//
// Multi-subspace: per (batch row, head, block): X1 = Z B, the middle RoPE by apply_rotary on the
// block (in place), Y = X2 Bᵀ.
#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/parallel.h"
#include "common/slices.h"
#include "grape/kernels.h"
#include "phasor/rotary.h"

namespace phasor::detail::grape {
namespace {

using VecD = Eigen::VectorXd;

// Tokens per work item (as apply_rotary: small enough to spread one sequence over the threads and
// keep an item's matrices far below the mmap threshold).
constexpr std::int64_t kBlock = 64;

struct Item {
  Sequence rows;  // batch row, first token, number of tokens
  std::int64_t h;
};
std::int64_t item_count(std::int64_t B, std::int64_t T, std::int64_t H) {
  return B * H * ((T + kBlock - 1) / kBlock);
}
Item item_at(std::int64_t T, std::int64_t H, std::int64_t item) {
  const std::int64_t blocks = (T + kBlock - 1) / kBlock;
  const std::int64_t block = item % blocks, h = (item / blocks) % H, b = item / (blocks * H);
  const std::int64_t start = block * kBlock;
  return {Sequence{b, start, std::min(kBlock, T - start)}, h};
}

// The orthogonalised plane of one head, in float64: a, b⊥ = b − c a (c = γ/α), α = |a|²,
// β⊥ = |b⊥|², ν = √(α β⊥).
struct Plane {
  VecD a, b_perp;
  double alpha = 0, beta_perp = 0, c = 0, nu = 0;
};
Plane make_plane(const PlaneProblem& p, std::int64_t h) {
  Plane pl;
  pl.a.resize(p.K);
  VecD b(p.K);
  for (std::int64_t k = 0; k < p.K; ++k) {
    pl.a(k) = get(p.a, head_vector_offset(p.a, p.ab_per_head, h, k));
    b(k) = get(p.b, head_vector_offset(p.b, p.ab_per_head, h, k));
  }
  pl.alpha = pl.a.squaredNorm();
  pl.c = pl.alpha > 0 ? pl.a.dot(b) / pl.alpha : 0.0;
  pl.b_perp = b - pl.c * pl.a;
  // Twice (Gram–Schmidt's "twice is enough"): after one pass a·b⊥ is the rounding of a·b, which is
  // not small next to |a||b⊥| when b is nearly parallel to a, and the Rodrigues terms assume
  // a ⊥ b⊥ (L² z = −(β⊥ (a·z) a + α (b⊥·z) b⊥)). b = b⊥ + c a still holds for the gradients.
  if (pl.alpha > 0) {
    const double again = pl.a.dot(pl.b_perp) / pl.alpha;
    pl.b_perp -= again * pl.a;
    pl.c += again;
  }
  // b parallel to a to working precision (always so for K = 1: R¹ has no plane): what is left of
  // b⊥ is rounding, which would rotate by ν = |a||b⊥| ≈ eps |a||b| per unit of η — with η of 1e4
  // and |a|, |b| of 1e4, a visible turn of a plane that does not exist. There is no plane: G = I.
  const double noise = 8 * static_cast<double>(p.K) * std::numeric_limits<double>::epsilon();
  if (pl.b_perp.squaredNorm() <= noise * noise * b.squaredNorm()) pl.b_perp.setZero();
  pl.beta_perp = pl.b_perp.squaredNorm();
  pl.nu = std::sqrt(pl.alpha * pl.beta_perp);
  return pl;
}

// η of the tokens of an item: positions × ω_h (float64).
VecD etas(const PlaneProblem& p, const Item& it) {
  const double w = get(p.omega, offset_of(p.omega, it.h));
  VecD eta(it.rows.length);
  for (std::int64_t t = 0; t < it.rows.length; ++t)
    eta(t) =
        get(p.positions, position_offset(p, p.positions, it.rows.batch, it.rows.start + t, it.h)) *
        w;
  return eta;
}

}  // namespace

// y = z + a (A v − C β⊥ u) + b⊥ (−A u − C α v),  u = a·z, v = b⊥·z.
void plane_forward(const PlaneProblem& p, const TensorView& y) {
  std::vector<Plane> planes;
  for (std::int64_t h = 0; h < p.H; ++h) planes.push_back(make_plane(p, h));
  dispatch_float(p.z, [&](auto zero) {
    using S = decltype(zero);
    std::vector<Vec<S>> as, bs;
    for (const Plane& pl : planes) {
      as.push_back(pl.a.cast<S>());
      bs.push_back(pl.b_perp.cast<S>());
    }
    parallel_for(item_count(p.B, p.T, p.H), [&](std::int64_t item) {
      const Item it = item_at(p.T, p.H, item);
      const Plane& pl = planes[static_cast<std::size_t>(it.h)];
      const auto& a = as[static_cast<std::size_t>(it.h)];
      const auto& bp = bs[static_cast<std::size_t>(it.h)];
      Mat<S> z;
      load_rows(p.z, it.rows, it.h, z);
      const Vec<S> u = z * a, v = z * bp;
      const VecD eta = etas(p, it);
      Vec<S> ca(it.rows.length), cb(it.rows.length);
      for (std::int64_t t = 0; t < it.rows.length; ++t) {
        const RodriguesScalars r = rodrigues_scalars(eta(t) * pl.nu);
        const double A = eta(t) * r.f1, C = eta(t) * eta(t) * r.f2;
        const double ut = static_cast<double>(u(t)), vt = static_cast<double>(v(t));
        ca(t) = static_cast<S>(A * vt - C * pl.beta_perp * ut);
        cb(t) = static_cast<S>(-A * ut - C * pl.alpha * vt);
      }
      z.noalias() += ca * a.transpose();
      z.noalias() += cb * bp.transpose();
      store_rows(z, y, it.rows, it.h);
    });
  });
}

// Per token (g = dy, u = a·z, v = b⊥·z, ga = a·g, gb = b⊥·g; A, C as in the forward):
//   dz = g + a (−A gb − C β⊥ ga) + b⊥ (A ga − C α gb)                       (= G(−η) g)
//   P1 = gᵀ L z = ga v − gb u,   P2 = gᵀ L² z = −(α gb v + β⊥ ga u)
//   dη = cos(ην) P1 + A P2,      dΔ = η³ g1 P1 / 2 + η⁴ g2 P2
// and with W = M − Mᵀ (M = ∂(gᵀy)/∂L, see reference.cpp) applied to a and b⊥:
//   W a  = g [A u + C α v] + z [−A ga + C α gb] + a [−C (ga v + gb u)] + b⊥ [2 C ga u − 2 dΔ α]
//   W b⊥ = g [A v − C β⊥ u] + z [−A gb − C β⊥ ga] + a [2 dΔ β⊥ − 2 C gb v] + b⊥ [C (gb u + ga v)]
// da = W b = W b⊥ + c W a,  db = −W a  (b = b⊥ + c a). Token sums of the g and z terms are
// matrix-vector products over the block; the a and b⊥ terms are scalar sums.
void plane_backward(const PlaneProblem& p, const TensorView& dy, const GrapeGrads& g) {
  std::vector<Plane> planes;
  for (std::int64_t h = 0; h < p.H; ++h) planes.push_back(make_plane(p, h));
  const std::int64_t items = item_count(p.B, p.T, p.H);
  const bool want_ab = g.da.defined() || g.db.defined();
  // Per item: W a and W b⊥ partial sums (float64), reduced below in item order.
  std::vector<VecD> wa_parts(static_cast<std::size_t>(want_ab ? items : 0)),
      wb_parts(static_cast<std::size_t>(want_ab ? items : 0));
  std::vector<double> d_eta(static_cast<std::size_t>(p.B * p.T * p.H), 0.0);  // [B, T, H]
  dispatch_float(p.z, [&](auto zero) {
    using S = decltype(zero);
    std::vector<Vec<S>> as, bs;
    for (const Plane& pl : planes) {
      as.push_back(pl.a.cast<S>());
      bs.push_back(pl.b_perp.cast<S>());
    }
    parallel_for(items, [&](std::int64_t item) {
      const Item it = item_at(p.T, p.H, item);
      const Plane& pl = planes[static_cast<std::size_t>(it.h)];
      const auto& a = as[static_cast<std::size_t>(it.h)];
      const auto& bp = bs[static_cast<std::size_t>(it.h)];
      const std::int64_t L = it.rows.length;
      Mat<S> z, gm;
      load_rows(p.z, it.rows, it.h, z);
      load_rows(dy, it.rows, it.h, gm);
      const Vec<S> u = z * a, v = z * bp, ga = gm * a, gb = gm * bp;
      const VecD eta = etas(p, it);
      Vec<S> dza(L), dzb(L), wa_g(L), wa_z(L), wb_g(L), wb_z(L);
      double wa_a = 0, wa_b = 0, wb_a = 0, wb_b = 0;
      const double al = pl.alpha, be = pl.beta_perp;
      for (std::int64_t t = 0; t < L; ++t) {
        const double e = eta(t);
        const RodriguesScalars r = rodrigues_scalars(e * pl.nu);
        const double A = e * r.f1, C = e * e * r.f2;
        const double ut = static_cast<double>(u(t)), vt = static_cast<double>(v(t));
        const double gat = static_cast<double>(ga(t)), gbt = static_cast<double>(gb(t));
        dza(t) = static_cast<S>(-A * gbt - C * be * gat);
        dzb(t) = static_cast<S>(A * gat - C * al * gbt);
        const double P1 = gat * vt - gbt * ut, P2 = -(al * gbt * vt + be * gat * ut);
        d_eta[static_cast<std::size_t>(((it.rows.batch * p.T) + it.rows.start + t) * p.H + it.h)] =
            r.cos_x * P1 + A * P2;
        if (!want_ab) continue;
        const double dD = 0.5 * e * e * e * r.g1 * P1 + e * e * e * e * r.g2 * P2;
        wa_g(t) = static_cast<S>(A * ut + C * al * vt);
        wa_z(t) = static_cast<S>(-A * gat + C * al * gbt);
        wa_a += -C * (gat * vt + gbt * ut);
        wa_b += 2 * C * gat * ut - 2 * dD * al;
        wb_g(t) = static_cast<S>(A * vt - C * be * ut);
        wb_z(t) = static_cast<S>(-A * gbt - C * be * gat);
        wb_a += 2 * dD * be - 2 * C * gbt * vt;
        wb_b += C * (gbt * ut + gat * vt);
      }
      if (want_ab) {
        const Vec<S> wa = gm.transpose() * wa_g + z.transpose() * wa_z;
        const Vec<S> wb = gm.transpose() * wb_g + z.transpose() * wb_z;
        wa_parts[static_cast<std::size_t>(item)] =
            wa.template cast<double>() + wa_a * pl.a + wa_b * pl.b_perp;
        wb_parts[static_cast<std::size_t>(item)] =
            wb.template cast<double>() + wb_a * pl.a + wb_b * pl.b_perp;
      }
      if (g.dz.defined()) {
        gm.noalias() += dza * a.transpose();
        gm.noalias() += dzb * bp.transpose();
        store_rows(gm, g.dz, it.rows, it.h);
      }
    });
  });
  if (want_ab) {
    const std::int64_t rows = p.ab_per_head ? p.H : 1;
    std::vector<VecD> da(static_cast<std::size_t>(rows), VecD::Zero(p.K)), db = da;
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t h = item_at(p.T, p.H, item).h;
      const Plane& pl = planes[static_cast<std::size_t>(h)];
      const VecD& wa = wa_parts[static_cast<std::size_t>(item)];
      const VecD& wb = wb_parts[static_cast<std::size_t>(item)];
      const auto r = static_cast<std::size_t>(p.ab_per_head ? h : 0);
      da[r] += wb + pl.c * wa;
      db[r] -= wa;
    }
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t k = 0; k < p.K; ++k) {
        if (g.da.defined())
          put(g.da, head_vector_offset(g.da, p.ab_per_head, r, k),
              da[static_cast<std::size_t>(r)](k));
        if (g.db.defined())
          put(g.db, head_vector_offset(g.db, p.ab_per_head, r, k),
              db[static_cast<std::size_t>(r)](k));
      }
  }
  // dω_h = Σ dη · position, d_positions = dη · ω (summed over the heads when shared): serial,
  // fixed order.
  if (g.d_omega.defined() || g.d_positions.defined()) {
    std::vector<double> d_omega(static_cast<std::size_t>(p.H), 0.0);
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t t = 0; t < p.T; ++t) {
        double shared = 0;
        for (std::int64_t h = 0; h < p.H; ++h) {
          const double de = d_eta[static_cast<std::size_t>((b * p.T + t) * p.H + h)];
          const double w = get(p.omega, offset_of(p.omega, h));
          d_omega[static_cast<std::size_t>(h)] +=
              de * get(p.positions, position_offset(p, p.positions, b, t, h));
          if (p.positions_per_head) {
            if (g.d_positions.defined())
              put(g.d_positions, offset_of(g.d_positions, b, t, h), de * w);
          } else {
            shared += de * w;
          }
        }
        if (!p.positions_per_head && g.d_positions.defined())
          put(g.d_positions, offset_of(g.d_positions, b, t), shared);
      }
    if (g.d_omega.defined())
      for (std::int64_t h = 0; h < p.H; ++h)
        put(g.d_omega, offset_of(g.d_omega, h), d_omega[static_cast<std::size_t>(h)]);
  }
}

// ---------------------------------------------------------------------------------------------
// Multi-subspace.
namespace {

// B_h as a K × K matrix of the compute type.
template <class S>
Mat<S> load_basis(const SubspaceProblem& p, std::int64_t h) {
  Mat<S> m(p.K, p.K);
  for (std::int64_t i = 0; i < p.K; ++i)
    for (std::int64_t j = 0; j < p.K; ++j)
      m(i, j) = static_cast<S>(
          get(p.basis, p.basis_per_head ? offset_of(p.basis, h, i, j) : offset_of(p.basis, i, j)));
  return m;
}

// A [1, L, 1, ·] view of x's tokens it.rows of head it.h (x: [B, T, H, D]), same strides.
TensorView slice_view(const TensorView& x, const Item& it) {
  const std::int64_t off =
      it.rows.batch * x.stride(0) + it.rows.start * x.stride(1) + it.h * x.stride(2);
  void* data = static_cast<char*>(x.data) + off * static_cast<std::int64_t>(element_size(x.dtype));
  return TensorView::strided(data, x.dtype, {1, it.rows.length, 1, x.size(3)},
                             {x.stride(0), x.stride(1), x.stride(2), x.stride(3)}, x.device);
}
template <class S>
TensorView matrix_view(Mat<S>& m) {
  return TensorView::of(m.data(), {1, m.rows(), 1, m.cols()});
}

}  // namespace

void subspace_forward(const SubspaceProblem& p, const TensorView& y) {
  dispatch_float(p.z, [&](auto zero) {
    using S = decltype(zero);
    std::vector<Mat<S>> basis;
    for (std::int64_t h = 0; h < (p.basis_per_head ? p.H : 1); ++h)
      basis.push_back(load_basis<S>(p, h));
    parallel_for(item_count(p.B, p.T, p.H), [&](std::int64_t item) {
      const Item it = item_at(p.T, p.H, item);
      const Mat<S>& Bm = basis[static_cast<std::size_t>(p.basis_per_head ? it.h : 0)];
      Mat<S> z;
      load_rows(p.z, it.rows, it.h, z);
      Mat<S> x(z.rows(), p.K);
      x.noalias() = z * Bm;  // rows: (Bᵀ z_t)ᵀ
      const TensorView xv = matrix_view(x);
      apply_rotary_forward(xv, slice_view(p.theta, it), p.layout, Impl::chunk, xv);
      z.noalias() = x * Bm.transpose();  // rows: (B x2_t)ᵀ
      store_rows(z, y, it.rows, it.h);
    });
  });
}

// Items are (batch row, head) so that each accumulates its own d_basis partial over its blocks.
void subspace_backward(const SubspaceProblem& p, const TensorView& dy,
                       const GrapeSubspaceGrads& g) {
  const std::int64_t items = p.B * p.H;
  std::vector<Mat<double>> dB_parts(static_cast<std::size_t>(g.d_basis.defined() ? items : 0));
  dispatch_float(p.z, [&](auto zero) {
    using S = decltype(zero);
    std::vector<Mat<S>> basis;
    for (std::int64_t h = 0; h < (p.basis_per_head ? p.H : 1); ++h)
      basis.push_back(load_basis<S>(p, h));
    parallel_for(items, [&](std::int64_t item) {
      const std::int64_t b = item / p.H, h = item % p.H;
      const Mat<S>& Bm = basis[static_cast<std::size_t>(p.basis_per_head ? h : 0)];
      Mat<double> dB;
      if (g.d_basis.defined()) dB = Mat<double>::Zero(p.K, p.K);
      for (std::int64_t start = 0; start < p.T; start += kBlock) {
        const Item it{Sequence{b, start, std::min(kBlock, p.T - start)}, h};
        Mat<S> z, gy;
        load_rows(p.z, it.rows, h, z);
        load_rows(dy, it.rows, h, gy);
        Mat<S> x1(z.rows(), p.K), x2, dx2(z.rows(), p.K), dx1(z.rows(), p.K);
        x1.noalias() = z * Bm;
        dx2.noalias() = gy * Bm;  // rows: (Bᵀ dy_t)ᵀ
        const TensorView theta = slice_view(p.theta, it);
        const TensorView d_theta = g.d_theta.defined() ? slice_view(g.d_theta, it) : TensorView{};
        apply_rotary_backward(matrix_view(x1), theta, p.layout, Impl::chunk, matrix_view(dx2),
                              matrix_view(dx1), d_theta);
        if (g.d_basis.defined()) {
          x2.resize(z.rows(), p.K);
          apply_rotary_forward(matrix_view(x1), theta, p.layout, Impl::chunk, matrix_view(x2));
          Mat<S> part(p.K, p.K);
          part.noalias() = gy.transpose() * x2;
          part.noalias() += z.transpose() * dx1;
          dB += part.template cast<double>();
        }
        if (g.dz.defined()) {
          z.noalias() = dx1 * Bm.transpose();
          store_rows(z, g.dz, it.rows, h);
        }
      }
      if (g.d_basis.defined()) dB_parts[static_cast<std::size_t>(item)] = std::move(dB);
    });
  });
  if (!g.d_basis.defined()) return;
  const std::int64_t heads = p.basis_per_head ? p.H : 1;
  for (std::int64_t hh = 0; hh < heads; ++hh) {
    Mat<double> sum = Mat<double>::Zero(p.K, p.K);
    for (std::int64_t item = 0; item < items; ++item)
      if (!p.basis_per_head || item % p.H == hh) sum += dB_parts[static_cast<std::size_t>(item)];
    for (std::int64_t i = 0; i < p.K; ++i)
      for (std::int64_t j = 0; j < p.K; ++j)
        put(g.d_basis,
            p.basis_per_head ? offset_of(g.d_basis, hh, i, j) : offset_of(g.d_basis, i, j),
            sum(i, j));
  }
}

}  // namespace phasor::detail::grape
