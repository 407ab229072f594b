// See rms_norm_rows.h.
#include "common/eigen.h"  // first: see there

#include "rms_norm_rows.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/parallel.h"

namespace phasor::nn::detail {
namespace {

template <class S>
using Row = Eigen::Array<S, 1, Eigen::Dynamic>;
template <class S>
using RowMap = Eigen::Map<Row<S>>;
template <class S>
using ConstRowMap = Eigen::Map<const Row<S>>;

// Rows per work item: a fixed split (not by thread count), so dweight's partial sums, one per
// block, are the same for any number of threads.
constexpr std::int64_t kRowsPerBlock = 256;

std::int64_t num_blocks(std::int64_t rows) {
  return (rows + kRowsPerBlock - 1) / kRowsPerBlock;
}

// Runs fn(first_row, end_row) for every block of rows, in parallel.
template <class Fn>
void for_each_block(std::int64_t rows, std::int64_t D, Fn&& fn) {
  // ~16 operations per element: phasor's threads only where the rows repay a hand-off.
  phasor::detail::parallel_for(num_blocks(rows), kRowsPerBlock * D * 16, [&](std::int64_t b) {
    fn(b * kRowsPerBlock, std::min(rows, (b + 1) * kRowsPerBlock));
  });
}

// σ(z) = 1 / (1 + e^(−z)): 0 or 1 at the ends (e^(−z) = inf or 0), never NaN for finite z.
template <class S, class Z>
auto sigmoid(const Z& z) {
  return (S(1) + (-z).exp()).inverse();
}

}  // namespace

template <class S>
void rms_norm_rows_forward(const S* x, const S* gate, GateActivation act, const S* weight,
                           std::int64_t rows, std::int64_t D, double eps, S* y, S* r) {
  const ConstRowMap<S> w(weight, D);
  for_each_block(rows, D, [&](std::int64_t first, std::int64_t end) {
    for (std::int64_t i = first; i < end; ++i) {
      const ConstRowMap<S> xi(x + i * D, D);
      const S ri = S(1) / std::sqrt(xi.square().mean() + static_cast<S>(eps));
      r[i] = ri;
      RowMap<S> yi(y + i * D, D);
      if (gate == nullptr) {
        yi = (xi * ri) * w;
      } else {
        const ConstRowMap<S> gi(gate + i * D, D);
        if (act == GateActivation::silu)
          yi = (xi * ri) * w * (gi * sigmoid<S>(gi));
        else
          yi = (xi * ri) * w * sigmoid<S>(gi);
      }
    }
  });
}

template <class S>
void rms_norm_rows_backward(const S* x, const S* gate, GateActivation act, const S* weight,
                            const S* r, const S* dy, std::int64_t rows, std::int64_t D, S* dx,
                            S* dgate, S* dweight) {
  const ConstRowMap<S> w(weight, D);
  std::vector<Row<S>> partials(static_cast<std::size_t>(dweight ? num_blocks(rows) : 0));
  for_each_block(rows, D, [&](std::int64_t first, std::int64_t end) {
    Row<S> n(D), dn(D), a(D), slope(D), part;
    if (dweight) part.setZero(D);
    for (std::int64_t i = first; i < end; ++i) {
      const ConstRowMap<S> xi(x + i * D, D), dyi(dy + i * D, D);
      n = xi * r[i];
      if (gate == nullptr) {
        dn = dyi * w;
        if (dweight) part += dyi * n;
      } else {
        const ConstRowMap<S> gi(gate + i * D, D);
        const Row<S> s = sigmoid<S>(gi);
        if (act == GateActivation::silu) {
          a = gi * s;
          slope = s * (S(1) + gi * (S(1) - s));
        } else {
          a = s;
          slope = s * (S(1) - s);
        }
        if (dgate) RowMap<S>(dgate + i * D, D) = dyi * n * w * slope;
        dn = dyi * w * a;
        if (dweight) part += dyi * n * a;
      }
      if (dx) RowMap<S>(dx + i * D, D) = r[i] * (dn - n * (dn * n).mean());
    }
    if (dweight) partials[static_cast<std::size_t>(first / kRowsPerBlock)] = std::move(part);
  });
  if (!dweight) return;
  RowMap<S> dw(dweight, D);
  dw.setZero();
  for (const Row<S>& part : partials) dw += part;
}

template void rms_norm_rows_forward<float>(const float*, const float*, GateActivation, const float*,
                                           std::int64_t, std::int64_t, double, float*, float*);
template void rms_norm_rows_forward<double>(const double*, const double*, GateActivation,
                                            const double*, std::int64_t, std::int64_t, double,
                                            double*, double*);
template void rms_norm_rows_backward<float>(const float*, const float*, GateActivation,
                                            const float*, const float*, const float*, std::int64_t,
                                            std::int64_t, float*, float*, float*);
template void rms_norm_rows_backward<double>(const double*, const double*, GateActivation,
                                             const double*, const double*, const double*,
                                             std::int64_t, std::int64_t, double*, double*, double*);

}  // namespace phasor::nn::detail
