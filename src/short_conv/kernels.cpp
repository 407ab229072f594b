// Short convolution, optimized kernel. Work items are (sequence n, block of kChannelBlock
// channels), processed in tiles of kTile tokens over the extended input xe = [cache (W−1 rows,
// or zeros); x of the sequence], vectorized over channels (rows = tokens, see short_conv.h):
//   z = bias + Σ_w diag(weight[:, w]) · xe[w : w+L],      y = act(z)
// The backward recomputes z, forms dz = dy ⊙ act'(z) and scatters
//   dxe[w : w+L] += dz · diag(weight[:, w]),   dweight[:, w] = Σ_t dz_t ⊙ xe_{t+w},
//   dbias = Σ_t dz_t,   plus d_final_cache into the last W−1 rows of dxe.
// dweight/dbias partials are kept per item and summed over sequences in sequence order
// afterwards, so results do not depend on the thread count.

#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/parallel.h"
#include "common/slices.h"
#include "short_conv/kernels.h"

namespace phasor::detail::short_conv {
namespace {

constexpr std::int64_t kChannelBlock = 64;
// Tokens per tile: an item's tile (inputs, outputs, gradients) stays in the L1/L2 cache.
constexpr std::int64_t kTile = 128;

std::int64_t num_blocks(const Problem& p) {
  return (p.D + kChannelBlock - 1) / kChannelBlock;
}

struct Item {
  std::int64_t n, d0, nb;  // sequence, first channel, channels in the block
};
Item item_of(const Problem& p, std::int64_t i) {
  const std::int64_t blocks = num_blocks(p);
  Item it{i / blocks, (i % blocks) * kChannelBlock, 0};
  it.nb = std::min(kChannelBlock, p.D - it.d0);
  return it;
}

// A cache view [N, D, W−1] block of item `it` as an (nb × (W−1)) matrix, and back.
template <class S>
void load_cache(const TensorView& c, const Item& it, Mat<S>& out) {
  slices_impl::load_2d(c, it.n * c.stride(0) + it.d0 * c.stride(1), it.nb, c.stride(1), c.size(2),
                       c.stride(2), out);
}
template <class S>
void store_cache(const Mat<S>& in, const TensorView& c, const Item& it) {
  slices_impl::store_2d(in, c, it.n * c.stride(0) + it.d0 * c.stride(1), c.stride(1), c.stride(2));
}
// Rows of sequence s, channels of the item, of a [B, T, D] view, as an (L × nb) matrix, and back.
template <class S>
void load_tokens(const TensorView& v, const Sequence& s, const Item& it, Mat<S>& out) {
  slices_impl::load_2d(v, s.batch * v.stride(0) + s.start * v.stride(1) + it.d0 * v.stride(2),
                       s.length, v.stride(1), it.nb, v.stride(2), out);
}
template <class S>
void store_tokens(const Mat<S>& in, const TensorView& v, const Sequence& s, const Item& it) {
  slices_impl::store_2d(in, v, s.batch * v.stride(0) + s.start * v.stride(1) + it.d0 * v.stride(2),
                        v.stride(1), v.stride(2));
}

// The block's weights as W × nb (row w: weight[:, w] of its channels) and bias as 1 × nb (zeros
// without bias), so that every product below broadcasts one row over the tokens.
template <class S>
void load_parameters(const Problem& p, const Item& it, Mat<S>& weight, Mat<S>& bias) {
  Mat<S> w;
  slices_impl::load_2d(p.weight, it.d0 * p.weight.stride(0), it.nb, p.weight.stride(0), p.W,
                       p.weight.stride(1), w);
  weight = w.transpose();
  if (p.bias.defined())
    slices_impl::load_2d(p.bias, it.d0 * p.bias.stride(0), 1, 0, it.nb, p.bias.stride(0), bias);
  else
    bias = Mat<S>::Zero(1, it.nb);
}

// The first W−1 rows of the extended input: the cache (transposed to rows = positions) or zeros.
template <class S>
void load_cache_rows(const Problem& p, const Item& it, Mat<S>& xe) {
  const std::int64_t C = p.W - 1;
  if (C == 0) return;
  if (p.initial_cache.defined()) {
    Mat<S> cache;
    load_cache(p.initial_cache, it, cache);
    xe.topRows(C) = cache.transpose();
  } else {
    xe.topRows(C).setZero();
  }
}

// z = bias + Σ_w xe[w : w+len] ⊙ weight[w] (rows broadcast), accumulated in w order, where xe
// holds the W−1 inputs before the tile followed by the tile's len inputs.
template <class S>
void pre_activation(const Mat<S>& xe, const Mat<S>& weight, const Mat<S>& bias, std::int64_t len,
                    Mat<S>& z) {
  // Row by row: Eigen's replicate() of a dynamic row evaluated element by element (an integer
  // division per element: three quarters of the forward's time).
  z.resize(len, bias.cols());
  for (std::int64_t t = 0; t < len; ++t) z.row(t) = bias;
  for (std::int64_t w = 0; w < weight.rows(); ++w)
    z.array() += xe.middleRows(w, len).array().rowwise() * weight.row(w).array();
}

// σ(z) = 1 / (1 + exp(−z)), vectorized. For very negative z, exp(−z) overflows to +inf and σ is
// exactly 0 (never NaN), which is its correctly rounded value there.
template <class S>
Eigen::Array<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> sigmoid(const Mat<S>& z) {
  return (S(1) + (-z.array()).exp()).inverse();
}

// Work is done in tiles of kTile tokens so the working set of an item stays in cache; xe keeps
// the W−1 inputs before the tile in its first rows (the cache for the first tile).
template <class S>
void forward_item(const Problem& p, const Item& it, const TensorView& y,
                  const TensorView& final_cache) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(it.n)];
  const std::int64_t C = p.W - 1;
  Mat<S> weight, bias;
  load_parameters(p, it, weight, bias);
  Mat<S> xe(C + kTile, it.nb), tokens, z, tail;
  load_cache_rows(p, it, xe);  // initial_cache is read here, before final_cache (may alias it)
  for (std::int64_t t0 = 0; t0 < s.length; t0 += kTile) {
    const std::int64_t len = std::min(kTile, s.length - t0);
    const Sequence tile{s.batch, s.start + t0, len};
    load_tokens(p.x, tile, it, tokens);
    xe.middleRows(C, len) = tokens;
    pre_activation(xe, weight, bias, len, z);
    if (p.silu) z.array() *= sigmoid(z);  // silu(z) = z σ(z)
    store_tokens(z, y, tile, it);
    if (C > 0) {  // the newest W−1 inputs become the head of the next tile
      tail = xe.middleRows(len, C);
      xe.topRows(C) = tail;
    }
  }
  if (final_cache.defined() && C > 0) {
    const Mat<S> last = xe.topRows(C).transpose();  // newest W−1 inputs, oldest first
    store_cache(last, final_cache, it);
  }
}

// Backward, in the same tiles. dxe (gradient of the extended input, index j = position + W−1)
// is scattered from each tile's dz: z_t uses xe_{t+w}, so dz_t reaches j ∈ [t, t+W−1]. After a
// tile starting at t0 with len tokens, rows j < t0+len are final; rows [t0+len, t0+len+W−1) are
// carried into the next tile, and after the last one receive d_final_cache (final_cache_i =
// xe_{L+i}). Final rows j < W−1 are dinitial_cache, the others dx.
template <class S>
void backward_item(const Problem& p, const Item& it, const TensorView& dy,
                   const TensorView& d_final_cache, const ShortConvGrads& grads, Mat<S>& dweight,
                   Mat<S>& dbias) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(it.n)];
  const std::int64_t L = s.length, C = p.W - 1;
  Mat<S> weight, bias;
  load_parameters(p, it, weight, bias);
  Mat<S> xe(C + kTile, it.nb), tokens, z, dz, tail;
  load_cache_rows(p, it, xe);
  dweight = Mat<S>::Zero(p.W, it.nb);
  dbias = Mat<S>::Zero(1, it.nb);
  const bool need_dxe = grads.dx.defined() || grads.dinitial_cache.defined();
  Mat<S> dxe = Mat<S>::Zero(C + kTile, it.nb), dcache_rows = Mat<S>::Zero(C, it.nb);
  // Hands over the final rows [j0, j0 + rows.rows()) of dxe.
  auto emit = [&](const auto& rows, std::int64_t j0) {
    const std::int64_t j1 = j0 + rows.rows();
    for (std::int64_t j = j0; j < std::min(j1, C); ++j) dcache_rows.row(j) = rows.row(j - j0);
    const std::int64_t first = std::max(j0, C);
    if (grads.dx.defined() && first < j1) {
      const Mat<S> part = rows.middleRows(first - j0, j1 - first);
      store_tokens(part, grads.dx, Sequence{s.batch, s.start + first - C, j1 - first}, it);
    }
  };
  for (std::int64_t t0 = 0; t0 < L; t0 += kTile) {
    const std::int64_t len = std::min(kTile, L - t0);
    const Sequence tile{s.batch, s.start + t0, len};
    load_tokens(p.x, tile, it, tokens);
    xe.middleRows(C, len) = tokens;
    load_tokens(dy, tile, it, dz);
    if (p.silu) {  // silu'(z) = σ(z)(1 + z(1 − σ(z)))
      pre_activation(xe, weight, bias, len, z);
      const auto sg = sigmoid(z);
      dz.array() *= sg * (S(1) + z.array() * (S(1) - sg));
    }
    // Per-tile sums, then added up: float32 rounding grows with L/kTile rather than L.
    dbias += dz.colwise().sum();
    for (std::int64_t w = 0; w < p.W; ++w)
      dweight.row(w) += (dz.array() * xe.middleRows(w, len).array()).colwise().sum().matrix();
    if (need_dxe) {
      dxe.middleRows(C, len).setZero();  // rows [0, C) hold the carry
      for (std::int64_t w = 0; w < p.W; ++w)
        dxe.middleRows(w, len).array() += dz.array().rowwise() * weight.row(w).array();
      emit(dxe.topRows(len), t0);
      if (C > 0) {
        tail = dxe.middleRows(len, C);
        dxe.topRows(C) = tail;
      }
    }
    if (C > 0) {
      tail = xe.middleRows(len, C);
      xe.topRows(C) = tail;
    }
  }
  if (need_dxe) {
    if (d_final_cache.defined() && C > 0) {
      Mat<S> dfc;
      load_cache(d_final_cache, it, dfc);
      dxe.topRows(C) += dfc.transpose();
    }
    emit(dxe.topRows(C), L);
    if (grads.dinitial_cache.defined() && C > 0) {
      const Mat<S> dcache = dcache_rows.transpose();
      store_cache(dcache, grads.dinitial_cache, it);
    }
  }
}

}  // namespace

void kernel_forward(const Problem& p, const TensorView& y, const TensorView& final_cache) {
  dispatch_float(p.x, [&](auto zero) {
    using S = decltype(zero);
    parallel_for(p.num_sequences() * num_blocks(p),
                 [&](std::int64_t i) { forward_item<S>(p, item_of(p, i), y, final_cache); });
  });
}

void kernel_backward(const Problem& p, const TensorView& dy, const TensorView& d_final_cache,
                     const ShortConvGrads& grads) {
  dispatch_float(p.x, [&](auto zero) {
    using S = decltype(zero);
    const std::int64_t N = p.num_sequences(), blocks = num_blocks(p);
    std::vector<Mat<S>> dweight(static_cast<std::size_t>(N * blocks)), dbias(dweight.size());
    parallel_for(N * blocks, [&](std::int64_t i) {
      backward_item<S>(p, item_of(p, i), dy, d_final_cache, grads,
                       dweight[static_cast<std::size_t>(i)], dbias[static_cast<std::size_t>(i)]);
    });
    if (!grads.dweight.defined() && !grads.dbias.defined()) return;
    // Reduce the per-sequence partials of each channel block in sequence order.
    parallel_for(blocks, [&](std::int64_t blk) {
      const Item it = item_of(p, blk);  // sequence 0 of block blk
      Mat<S> dw = Mat<S>::Zero(p.W, it.nb), db = Mat<S>::Zero(1, it.nb);
      for (std::int64_t n = 0; n < N; ++n) {
        dw += dweight[static_cast<std::size_t>(n * blocks + blk)];
        db += dbias[static_cast<std::size_t>(n * blocks + blk)];
      }
      if (grads.dweight.defined()) {
        const Mat<S> dw_t = dw.transpose();  // nb × W, as weight
        slices_impl::store_2d(dw_t, grads.dweight, it.d0 * grads.dweight.stride(0),
                              grads.dweight.stride(0), grads.dweight.stride(1));
      }
      if (grads.dbias.defined())
        slices_impl::store_2d(db, grads.dbias, it.d0 * grads.dbias.stride(0), 0,
                              grads.dbias.stride(0));
    });
  });
}

}  // namespace phasor::detail::short_conv
