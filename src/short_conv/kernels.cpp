// Short convolution, optimized kernel. Work items are (sequence n, block of kChannelBlock
// channels); each item loads its extended input xe = [cache (W−1 rows, or zeros); x of the
// sequence] ((W−1+L) × channels, owned Eigen storage) and computes, vectorized over channels,
//   z = bias + Σ_w diag(weight[:, w]) · xe[w : w+L]          (rows = tokens, short_conv.h)
//   y = act(z)
// The backward recomputes z, forms dz = dy ⊙ act'(z) and scatters
//   dxe[w : w+L] += dz · diag(weight[:, w]),  dweight[:, w] = Σ_t dz_t ⊙ xe_{t+w},  dbias = Σ_t
//   dz_t
// plus d_final_cache into the last W−1 rows of dxe. dweight/dbias partials are kept per item and
// summed over sequences in sequence order afterwards, so results do not depend on the threads.
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
// Token sums (dweight, dbias) are accumulated per span of this many tokens, then added up, which
// keeps float32 rounding error growing with T/kSumSpan instead of T.
constexpr std::int64_t kSumSpan = 256;

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

// What every item needs: the extended input and the transposed weights/bias of its channels.
template <class S>
struct ItemInputs {
  Mat<S> xe;      // (W−1+L) × nb
  Mat<S> weight;  // W × nb (row w: weight[:, w] of the block's channels)
  Mat<S> bias;    // 1 × nb (zeros without bias)
};

template <class S>
void load_item(const Problem& p, const Item& it, ItemInputs<S>& in) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(it.n)];
  const std::int64_t C = p.W - 1;
  in.xe.resize(C + s.length, it.nb);
  if (C > 0) {
    if (p.initial_cache.defined()) {
      Mat<S> cache;
      load_cache(p.initial_cache, it, cache);
      in.xe.topRows(C) = cache.transpose();
    } else {
      in.xe.topRows(C).setZero();
    }
  }
  Mat<S> tokens;
  load_tokens(p.x, s, it, tokens);
  in.xe.bottomRows(s.length) = tokens;
  Mat<S> w;
  slices_impl::load_2d(p.weight, it.d0 * p.weight.stride(0), it.nb, p.weight.stride(0), p.W,
                       p.weight.stride(1), w);
  in.weight = w.transpose();
  if (p.bias.defined()) {
    Mat<S> b;
    slices_impl::load_2d(p.bias, it.d0 * p.bias.stride(0), 1, 0, it.nb, p.bias.stride(0), b);
    in.bias = b;
  } else {
    in.bias = Mat<S>::Zero(1, it.nb);
  }
}

// z = bias + Σ_w xe[w : w+L] ⊙ weight[w] (rows broadcast), accumulated in w order.
template <class S>
Mat<S> pre_activation(const ItemInputs<S>& in, std::int64_t W) {
  const std::int64_t L = in.xe.rows() - (W - 1);
  Mat<S> z = in.bias.replicate(L, 1);
  for (std::int64_t w = 0; w < W; ++w)
    z.array() += in.xe.middleRows(w, L).array().rowwise() * in.weight.row(w).array();
  return z;
}

// σ(z) without overflow: exp is only taken of −|z|.
template <class S>
S sigmoid(S z) {
  if (z >= S(0)) return S(1) / (S(1) + std::exp(-z));
  const S e = std::exp(z);
  return e / (S(1) + e);
}

template <class S>
void forward_item(const Problem& p, const Item& it, const TensorView& y,
                  const TensorView& final_cache) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(it.n)];
  ItemInputs<S> in;
  load_item(p, it, in);  // initial_cache is read here, before final_cache (which may alias it)
  Mat<S> z = pre_activation(in, p.W);
  if (p.silu)
    for (std::int64_t i = 0; i < z.size(); ++i) z.data()[i] *= sigmoid(z.data()[i]);
  store_tokens(z, y, s, it);
  if (final_cache.defined() && p.W > 1) {
    const Mat<S> last = in.xe.bottomRows(p.W - 1).transpose();  // newest W−1 inputs
    store_cache(last, final_cache, it);
  }
}

template <class S>
void backward_item(const Problem& p, const Item& it, const TensorView& dy,
                   const TensorView& d_final_cache, const ShortConvGrads& grads, Mat<S>& dweight,
                   Mat<S>& dbias) {
  const Sequence& s = p.sequences[static_cast<std::size_t>(it.n)];
  const std::int64_t L = s.length, C = p.W - 1;
  ItemInputs<S> in;
  load_item(p, it, in);
  Mat<S> dz;
  load_tokens(dy, s, it, dz);
  if (p.silu) {
    // silu'(z) = σ(z)(1 + z(1 − σ(z)))
    const Mat<S> z = pre_activation(in, p.W);
    for (std::int64_t i = 0; i < z.size(); ++i) {
      const S zi = z.data()[i], sg = sigmoid(zi);
      dz.data()[i] *= sg * (S(1) + zi * (S(1) - sg));
    }
  }
  if (grads.dx.defined() || grads.dinitial_cache.defined()) {
    Mat<S> dxe = Mat<S>::Zero(C + L, it.nb);
    for (std::int64_t w = 0; w < p.W; ++w)
      dxe.middleRows(w, L).array() += dz.array().rowwise() * in.weight.row(w).array();
    if (d_final_cache.defined() && C > 0) {  // final_cache = the last W−1 rows of xe
      Mat<S> dfc;
      load_cache(d_final_cache, it, dfc);
      dxe.bottomRows(C) += dfc.transpose();
    }
    if (grads.dx.defined()) {
      const Mat<S> dx = dxe.bottomRows(L);
      store_tokens(dx, grads.dx, s, it);
    }
    if (grads.dinitial_cache.defined() && C > 0) {
      const Mat<S> dcache = dxe.topRows(C).transpose();
      store_cache(dcache, grads.dinitial_cache, it);
    }
  }
  dweight = Mat<S>::Zero(p.W, it.nb);
  dbias = Mat<S>::Zero(1, it.nb);
  if (grads.dweight.defined() || grads.dbias.defined()) {
    for (std::int64_t t0 = 0; t0 < L; t0 += kSumSpan) {
      const std::int64_t len = std::min(kSumSpan, L - t0);
      const auto dz_span = dz.middleRows(t0, len).array();
      for (std::int64_t w = 0; w < p.W; ++w)
        dweight.row(w) +=
            (dz_span * in.xe.middleRows(t0 + w, len).array()).colwise().sum().matrix();
      dbias += dz_span.colwise().sum().matrix();
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
