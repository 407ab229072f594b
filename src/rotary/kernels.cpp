// Rotary ops: the optimized kernels. Each work item loads its slice into owned Eigen storage
// (slices.h), computes with vectorized row/array operations in the compute type, and stores the
// result. The running phase sums are kept in float64 whatever the dtype (see rotary.h).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/parallel.h"
#include "common/slices.h"
#include "rotary/kernels.h"

namespace phasor::detail::rotary {
namespace {

using RowD = Eigen::Array<double, 1, Eigen::Dynamic>;

// ω of head h as a float64 row of R values.
RowD omega_row(const PhaseProblem& p, std::int64_t h) {
  RowD w(p.R);
  for (std::int64_t i = 0; i < p.R; ++i)
    w(i) = p.omega_per_head ? get(p.omega, offset_of(p.omega, h, i))
                            : get(p.omega, offset_of(p.omega, i));
  return w;
}

// A [N, H, R] view's row (n, h) as float64 (zeros when the view is undefined).
RowD state_row(const TensorView& x, std::int64_t n, std::int64_t h, std::int64_t R) {
  RowD row = RowD::Zero(R);
  if (x.defined())
    for (std::int64_t i = 0; i < R; ++i) row(i) = get(x, offset_of(x, n, h, i));
  return row;
}
void put_state_row(const RowD& row, const TensorView& x, std::int64_t n, std::int64_t h) {
  for (std::int64_t i = 0; i < row.size(); ++i) put(x, offset_of(x, n, h, i), row(i));
}

// Tokens per apply_rotary work item: enough to amortise the per-item overhead, small enough that
// an item's matrices (64 × K values) stay far below glibc's mmap threshold (128 KiB) — larger
// blocks made every allocation an mmap/munmap pair whose page faults serialised the threads — and
// to spread a single long sequence over the threads.
constexpr std::int64_t kApplyBlock = 64;

// The work items of apply_rotary: (batch row, head, block of tokens).
struct ApplyItem {
  Sequence rows;
  std::int64_t h;
};
ApplyItem apply_item(const TensorView& x, std::int64_t item) {
  const std::int64_t T = x.size(1), H = x.size(2);
  const std::int64_t blocks = (T + kApplyBlock - 1) / kApplyBlock;
  const std::int64_t block = item % blocks, h = (item / blocks) % H, b = item / (blocks * H);
  const std::int64_t start = block * kApplyBlock;
  return {Sequence{b, start, std::min(kApplyBlock, T - start)}, h};
}
std::int64_t apply_items(const TensorView& x) {
  return x.size(0) * x.size(2) * ((x.size(1) + kApplyBlock - 1) / kApplyBlock);
}

// Splits rows of K = 2R values into the a and b members of each rotation pair.
template <class S>
void split_pairs(const Mat<S>& x, RotaryLayout layout, Mat<S>& a, Mat<S>& b) {
  const std::int64_t R = x.cols() / 2;
  if (layout == RotaryLayout::half_split) {
    a = x.leftCols(R);
    b = x.rightCols(R);
    return;
  }
  a.resize(x.rows(), R);
  b.resize(x.rows(), R);
  for (std::int64_t t = 0; t < x.rows(); ++t)
    for (std::int64_t i = 0; i < R; ++i) {
      a(t, i) = x(t, 2 * i);
      b(t, i) = x(t, 2 * i + 1);
    }
}
template <class S>
void join_pairs(const Mat<S>& a, const Mat<S>& b, RotaryLayout layout, Mat<S>& x) {
  const std::int64_t R = a.cols();
  x.resize(a.rows(), 2 * R);
  if (layout == RotaryLayout::half_split) {
    x.leftCols(R) = a;
    x.rightCols(R) = b;
    return;
  }
  for (std::int64_t t = 0; t < a.rows(); ++t)
    for (std::int64_t i = 0; i < R; ++i) {
      x(t, 2 * i) = a(t, i);
      x(t, 2 * i + 1) = b(t, i);
    }
}

// cos θ and sin θ elementwise with the C library's (correctly range-reduced) scalar functions in
// the compute type. Eigen's vectorized float sin/cos trips a GCC -Wuninitialized false positive
// inside the AVX-512 intrinsics headers, and the warning-free build matters more here than the
// vector speed-up of a step that is a small part of the op.
template <class S>
void cos_sin(const Mat<S>& angle, Mat<S>& cs, Mat<S>& sn) {
  cs.resize(angle.rows(), angle.cols());
  sn.resize(angle.rows(), angle.cols());
  for (std::int64_t t = 0; t < angle.rows(); ++t)
    for (std::int64_t i = 0; i < angle.cols(); ++i) {
      cs(t, i) = std::cos(angle(t, i));
      sn(t, i) = std::sin(angle(t, i));
    }
}

}  // namespace

// P_t = θ_0 + Σ_{s ≤ t} φ_s (float64 running sum), θ_t = ω ⊙ P_t; one (sequence, head) per item.
void phases_forward(const PhaseProblem& p, const TensorView& theta, const TensorView& final_phase) {
  dispatch_float(p.phi, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_sequences() * p.H, [&](std::int64_t item) {
      const std::int64_t n = item / p.H, h = item % p.H;
      const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
      Mat<S> phi;
      load_rows(p.phi, s, h, phi);
      const RowD w = omega_row(p, h);
      RowD phase = state_row(p.initial_phase, n, h, p.R);  // loaded before final_phase is stored
      Mat<S> out(s.length, p.R);
      for (std::int64_t t = 0; t < s.length; ++t) {
        phase += phi.row(t).array().template cast<double>();
        out.row(t) = (w * phase).template cast<S>().matrix();
      }
      store_rows(out, theta, s, h);
      if (final_phase.defined()) put_state_row(phase, final_phase, n, h);
    });
  });
}

// dφ_s = Σ_{t ≥ s} ω dθ_t + dP_final (float64 reverse sum); dθ_0 = that sum at the first token;
// dω: each item writes its partial Σ_t dθ_t P_t to its own slot, reduced serially in item order
// afterwards, so no two items write the same memory and the result is thread-count independent.
void phases_backward(const PhaseProblem& p, const TensorView& d_theta,
                     const TensorView& d_final_phase, const RotaryPhaseGrads& grads) {
  const std::int64_t items = p.num_sequences() * p.H;
  std::vector<RowD> d_omega_parts(static_cast<std::size_t>(grads.d_omega.defined() ? items : 0));
  dispatch_float(p.phi, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(items, [&](std::int64_t item) {
      const std::int64_t n = item / p.H, h = item % p.H;
      const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
      Mat<S> dth;
      load_rows(d_theta, s, h, dth);
      const RowD w = omega_row(p, h);
      if (grads.d_omega.defined()) {
        Mat<S> phi;
        load_rows(p.phi, s, h, phi);
        RowD phase = state_row(p.initial_phase, n, h, p.R);
        RowD part = RowD::Zero(p.R);
        for (std::int64_t t = 0; t < s.length; ++t) {
          phase += phi.row(t).array().template cast<double>();
          part += dth.row(t).array().template cast<double>() * phase;
        }
        d_omega_parts[static_cast<std::size_t>(item)] = part;
      }
      if (!grads.d_phi.defined() && !grads.d_initial_phase.defined()) return;
      RowD acc = state_row(d_final_phase, n, h, p.R);
      Mat<S> d_phi(s.length, p.R);
      for (std::int64_t t = s.length - 1; t >= 0; --t) {
        acc += w * dth.row(t).array().template cast<double>();
        d_phi.row(t) = acc.template cast<S>().matrix();
      }
      if (grads.d_phi.defined()) store_rows(d_phi, grads.d_phi, s, h);
      if (grads.d_initial_phase.defined()) put_state_row(acc, grads.d_initial_phase, n, h);
    });
  });
  if (!grads.d_omega.defined()) return;
  const std::int64_t rows = p.omega_per_head ? p.H : 1;
  std::vector<RowD> d_omega(static_cast<std::size_t>(rows), RowD::Zero(p.R));
  for (std::int64_t item = 0; item < items; ++item)
    d_omega[static_cast<std::size_t>(p.omega_per_head ? item % p.H : 0)] +=
        d_omega_parts[static_cast<std::size_t>(item)];
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < p.R; ++i)
      put(grads.d_omega,
          p.omega_per_head ? offset_of(grads.d_omega, r, i) : offset_of(grads.d_omega, i),
          d_omega[static_cast<std::size_t>(r)](i));
}

// θ[b, t, i] = (offset + t − start) · ω_i; ω computed once, one sequence per work item.
void angles(const AnglesProblem& p, const TensorView& theta) {
  RowD frequency(p.R);
  for (std::int64_t i = 0; i < p.R; ++i)
    frequency(i) =
        std::pow(p.base, -2.0 * static_cast<double>(i) / static_cast<double>(p.head_dim));
  parallel_for(static_cast<std::int64_t>(p.sequences.size()), [&](std::int64_t n) {
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    Mat<double> out(s.length, p.R);
    for (std::int64_t t = 0; t < s.length; ++t)
      out.row(t) = (static_cast<double>(p.offset + t) * frequency).matrix();
    const std::int64_t base = s.batch * theta.stride(0) + s.start * theta.stride(1);
    slices_impl::store_2d(out, theta, base, theta.stride(1), theta.stride(2));
  });
}

// y_a = x_a cos θ − x_b sin θ, y_b = x_a sin θ + x_b cos θ on (row, head, token block) items,
// rotating the loaded rows in place (one pass, no pair matrices).
void apply_forward(const ApplyProblem& p, const TensorView& y) {
  const TensorView &x = p.x, &theta = p.theta;
  const RotaryLayout layout = p.layout;
  dispatch_float(x, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(apply_items(x), [&](std::int64_t item) {
      const ApplyItem it = apply_item(x, item);
      Mat<S> xs, th;
      load_rows(x, it.rows, it.h, xs);
      load_rows(theta, it.rows, it.h, th);
      const std::int64_t R = th.cols();
      const std::int64_t a0 = 0, b0 = layout == RotaryLayout::half_split ? R : 1;
      const std::int64_t step = layout == RotaryLayout::half_split ? 1 : 2;
      for (std::int64_t t = 0; t < xs.rows(); ++t) {
        S* row = xs.data() + t * xs.cols();
        const S* angle = th.data() + t * R;
        for (std::int64_t i = 0; i < R; ++i) {
          const S cs = std::cos(angle[i]), sn = std::sin(angle[i]);
          const S xa = row[a0 + step * i], xb = row[b0 + step * i];
          row[a0 + step * i] = xa * cs - xb * sn;
          row[b0 + step * i] = xa * sn + xb * cs;
        }
      }
      store_rows(xs, y, it.rows, it.h);
    });
  });
}

// dx = rotation of dy by −θ; dθ = dy_b (x_a cos θ − x_b sin θ) − dy_a (x_a sin θ + x_b cos θ).
void apply_backward(const ApplyProblem& p, const TensorView& dy, const TensorView& dx,
                    const TensorView& d_theta) {
  const TensorView &x = p.x, &theta = p.theta;
  const RotaryLayout layout = p.layout;
  dispatch_float(x, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(apply_items(x), [&](std::int64_t item) {
      const ApplyItem it = apply_item(x, item);
      Mat<S> xs, th, dys, a, b, da, db, out;
      load_rows(x, it.rows, it.h, xs);
      load_rows(theta, it.rows, it.h, th);
      load_rows(dy, it.rows, it.h, dys);
      split_pairs(xs, layout, a, b);
      split_pairs(dys, layout, da, db);
      Mat<S> cs, sn;
      cos_sin(th, cs, sn);
      if (d_theta.defined()) {
        const Mat<S> ya = (a.array() * cs.array() - b.array() * sn.array()).matrix();
        const Mat<S> yb = (a.array() * sn.array() + b.array() * cs.array()).matrix();
        const Mat<S> dth = (db.array() * ya.array() - da.array() * yb.array()).matrix();
        store_rows(dth, d_theta, it.rows, it.h);
      }
      if (dx.defined()) {
        const Mat<S> dxa = (da.array() * cs.array() + db.array() * sn.array()).matrix();
        const Mat<S> dxb = (db.array() * cs.array() - da.array() * sn.array()).matrix();
        join_pairs(dxa, dxb, layout, out);
        store_rows(out, dx, it.rows, it.h);
      }
    });
  });
}

}  // namespace phasor::detail::rotary
