// Short convolution, reference: float64 loops straight from the equation of short_conv.h,
//   z_t,d = bias_d + Σ_w weight_{d,w} · xe_{t+w, d},   y_t,d = act(z_t,d),
// where xe = [initial_cache (W−1 rows, or zeros); x of the sequence] is the extended input, so
// xe_{t+w} is the input at sequence position t−(W−1)+w. Obviously correct, slow; tests trust it.
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/element_access.h"
#include "short_conv/kernels.h"

namespace phasor::detail::short_conv {
namespace {

double sigmoid(double z) {
  return 1.0 / (1.0 + std::exp(-z));
}

// The extended input xe (length W−1+L) of channel d of sequence n: the cache (or zeros), then x.
std::vector<double> extended_input(const Problem& p, std::int64_t n, std::int64_t d) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
  std::vector<double> xe(static_cast<std::size_t>(p.W - 1 + s.length), 0.0);
  if (p.initial_cache.defined())
    for (std::int64_t i = 0; i < p.W - 1; ++i)
      xe[static_cast<std::size_t>(i)] =
          get(p.initial_cache, n * p.initial_cache.stride(0) + d * p.initial_cache.stride(1) +
                                   i * p.initial_cache.stride(2));
  for (std::int64_t t = 0; t < s.length; ++t)
    xe[static_cast<std::size_t>(p.W - 1 + t)] =
        get(p.x, s.batch * p.x.stride(0) + (s.start + t) * p.x.stride(1) + d * p.x.stride(2));
  return xe;
}

double weight(const Problem& p, std::int64_t d, std::int64_t w) {
  return get(p.weight, d * p.weight.stride(0) + w * p.weight.stride(1));
}

// z_t (pre-activation) for t in [0, L).
std::vector<double> pre_activation(const Problem& p, std::int64_t d,
                                   const std::vector<double>& xe) {
  const std::int64_t L = static_cast<std::int64_t>(xe.size()) - (p.W - 1);
  std::vector<double> z(static_cast<std::size_t>(L));
  const double b = p.bias.defined() ? get(p.bias, d * p.bias.stride(0)) : 0.0;
  for (std::int64_t t = 0; t < L; ++t) {
    double acc = b;
    for (std::int64_t w = 0; w < p.W; ++w)
      acc += weight(p, d, w) * xe[static_cast<std::size_t>(t + w)];
    z[static_cast<std::size_t>(t)] = acc;
  }
  return z;
}

}  // namespace

void reference_forward(const Problem& p, const TensorView& y, const TensorView& final_cache) {
  for (std::int64_t n = 0; n < p.num_sequences(); ++n) {
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    for (std::int64_t d = 0; d < p.D; ++d) {
      // Read everything (initial_cache included) before writing: final_cache may alias it.
      const std::vector<double> xe = extended_input(p, n, d);
      const std::vector<double> z = pre_activation(p, d, xe);
      for (std::int64_t t = 0; t < s.length; ++t) {
        const double zt = z[static_cast<std::size_t>(t)];
        put(y, s.batch * y.stride(0) + (s.start + t) * y.stride(1) + d * y.stride(2),
            p.silu ? zt * sigmoid(zt) : zt);
      }
      // The last W−1 entries of xe: the newest W−1 inputs, cached ones first if L < W−1.
      if (final_cache.defined())
        for (std::int64_t i = 0; i < p.W - 1; ++i)
          put(final_cache,
              n * final_cache.stride(0) + d * final_cache.stride(1) + i * final_cache.stride(2),
              xe[static_cast<std::size_t>(s.length + i)]);
    }
  }
}

void reference_backward(const Problem& p, const TensorView& dy, const TensorView& d_final_cache,
                        const ShortConvGrads& grads) {
  std::vector<double> dweight(static_cast<std::size_t>(p.D * p.W), 0.0);
  std::vector<double> dbias(static_cast<std::size_t>(p.D), 0.0);
  for (std::int64_t n = 0; n < p.num_sequences(); ++n) {
    const Sequence& s = p.sequences[static_cast<std::size_t>(n)];
    for (std::int64_t d = 0; d < p.D; ++d) {
      const std::vector<double> xe = extended_input(p, n, d);
      const std::vector<double> z = pre_activation(p, d, xe);
      // dz_t = dy_t · act'(z_t), with silu'(z) = σ(z)(1 + z(1 − σ(z))).
      std::vector<double> dxe(xe.size(), 0.0);
      for (std::int64_t t = 0; t < s.length; ++t) {
        double dz =
            get(dy, s.batch * dy.stride(0) + (s.start + t) * dy.stride(1) + d * dy.stride(2));
        if (p.silu) {
          const double zt = z[static_cast<std::size_t>(t)], sg = sigmoid(zt);
          dz *= sg * (1.0 + zt * (1.0 - sg));
        }
        dbias[static_cast<std::size_t>(d)] += dz;
        for (std::int64_t w = 0; w < p.W; ++w) {
          // z_t = … + weight_{d,w} · xe_{t+w}
          dweight[static_cast<std::size_t>(d * p.W + w)] +=
              dz * xe[static_cast<std::size_t>(t + w)];
          dxe[static_cast<std::size_t>(t + w)] += dz * weight(p, d, w);
        }
      }
      // final_cache_i = xe_{L+i}
      if (d_final_cache.defined())
        for (std::int64_t i = 0; i < p.W - 1; ++i)
          dxe[static_cast<std::size_t>(s.length + i)] +=
              get(d_final_cache, n * d_final_cache.stride(0) + d * d_final_cache.stride(1) +
                                     i * d_final_cache.stride(2));
      if (grads.dx.defined())
        for (std::int64_t t = 0; t < s.length; ++t)
          put(grads.dx,
              s.batch * grads.dx.stride(0) + (s.start + t) * grads.dx.stride(1) +
                  d * grads.dx.stride(2),
              dxe[static_cast<std::size_t>(p.W - 1 + t)]);
      if (grads.dinitial_cache.defined())
        for (std::int64_t i = 0; i < p.W - 1; ++i)
          put(grads.dinitial_cache,
              n * grads.dinitial_cache.stride(0) + d * grads.dinitial_cache.stride(1) +
                  i * grads.dinitial_cache.stride(2),
              dxe[static_cast<std::size_t>(i)]);
    }
  }
  if (grads.dweight.defined())
    for (std::int64_t d = 0; d < p.D; ++d)
      for (std::int64_t w = 0; w < p.W; ++w)
        put(grads.dweight, d * grads.dweight.stride(0) + w * grads.dweight.stride(1),
            dweight[static_cast<std::size_t>(d * p.W + w)]);
  if (grads.dbias.defined())
    for (std::int64_t d = 0; d < p.D; ++d)
      put(grads.dbias, d * grads.dbias.stride(0), dbias[static_cast<std::size_t>(d)]);
}

}  // namespace phasor::detail::short_conv
