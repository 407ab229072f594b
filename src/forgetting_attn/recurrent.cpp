// Forgetting attention, Impl::recurrent: decoding token by token through a key/value cache.
//
// A KvCache holds, for one (sequence, key/value head), the keys and values of the tokens seen
// (only the last window − 1 with a window, in a ring buffer) and, for each cached token p and
// each query head of the group, its log decay Σ_{s ∈ (p, t]} g_s up to the current token t. A
// new token t first decays every cached token by its gate g_t (a float64 sum from the token
// itself — never a difference of cumulative sums; a zero gate makes it −inf, which masks the
// token for good), then attends to the cache and itself:
//   o_t = Σ_p softmax_p(scale q_t·k_p + decay_p) v_p,   decay_t = 0,
// and is appended. ForgettingAttnCache is B × H such caches; forgetting_attn_forward with
// Impl::recurrent runs each sequence through one.
//
// Backward (Impl::recurrent): the exact token-by-token adjoint of those steps. Step t's softmax
// over the tokens it could see is recomputed (or taken from the saved o and lse) and its adjoint
// accumulated into dq_t and the dk, dv of the attended tokens; dg_s collects the dℓ_tp of every
// step t whose decay sum for p contains g_s (p < s ≤ t). As in the chunk kernel, the dℓ of a
// dominant token (P_tp* > 1/2) is −Σ_{p≠p*} dℓ_tp, which keeps float32 accurate when strong gates
// or large logits make P_tp* ≈ 1.
// Everything is computed in the input's precision (the gate sums in float64).
//
// Additive GRAPE slopes (optional): the cache also keeps each cached token's key slope b_p and
// its position p (a step counter that restarts with each sequence / reset and keeps counting when
// a zero gate empties the cache), and step t adds −(t − p)(a_t + b_p) to its logit against p, in
// float64 with the decay before the one rounding (as the chunk kernel does). The backward adds
// da_t = −Σ_p (t − p) dℓ_tp and db_p += −(t − p) dℓ_tp (db summed over the group).
//
// Rotation by θ (optional, common/rotation.h): each item rotates its keys and the queries of its
// group once, right after loading them (R1), so the cache only ever holds rotated keys (each key
// rotated once, in ForgettingAttnCache too). The backward computes dq, dk with respect to the
// rotated rows and turns them into dq, dk, dθ at the end of each query head / of the item
// (R2, R3), reusing the cos/sin of the forward's load.

#include "common/eigen.h"  // first: see there

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "common/rotation.h"
#include "common/slices.h"
#include "forgetting_attn/forgetting_attn.h"
#include "forgetting_attn/kernels.h"
#include "forgetting_attn/probabilities.h"
#include "phasor/device.h"
#include "phasor/forgetting_attn.h"

namespace phasor {
namespace detail::fox {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The decode cache of one (sequence, key/value head) and the query heads of its group.
template <class S>
class KvCache {
 public:
  // The slots grow with the tokens seen, up to the window's window − 1: a window far longer than
  // the sequence (any int64, e.g. 10^12) costs no more memory than no window.
  KvCache(std::int64_t K, std::int64_t V, std::int64_t group, std::int64_t window)
      : capacity_(window == kNoWindow ? -1 : window - 1),
        keys_(0, K),
        values_(0, V),
        decay_(group, 0) {}

  // Token t: q (group × K) for the query heads of the group, k (1 × K), v (1 × V), g (group)
  // the log gates of t. Writes o (group × V) and lse (group), then caches the token.
  // slopes: whether this token has additive GRAPE slopes, a (group) its query slopes and b its key
  // slope (zeros where absent). Once any token had slopes, every later step adds the bias.
  void step(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Vec<double>& g, double scale,
            Mat<S>& o, Vec<S>& lse, bool slopes = false, const Vec<double>& a = {}, double b = 0) {
    biased_ = biased_ || slopes;
    // A zero gate on every query head hides everything cached from all of them: drop it.
    if ((g.array() == kNegInf).all()) cached_ = next_ = 0;
    const std::int64_t n = cached_, G = q.rows();
    const Mat<S> q_scaled = q * static_cast<S>(scale);
    // logits (group × n): ℓ_tp = scale q_t·k_p + decay_p; the token itself: scale q_t·k_t.
    logits_.resize(G, n);
    logits_.noalias() = q_scaled * keys_.topRows(n).transpose();
    const Vec<S> self = q_scaled * k.transpose();
    Vec<S> max_logit = self;
    probs_.resize(G, n);
    for (std::int64_t h = 0; h < G; ++h) {
      // decay_p ← decay_p + g_t: the sum of the gates in (p, t].
      decay_.row(h).head(n).array() += g[h];
      if (biased_) {
        // −(t − p)(a_t + b_p) with the decay, in float64; −inf decays stay −inf.
        const double a_h = a.size() > 0 ? a[h] : 0.0;
        for (std::int64_t p = 0; p < n; ++p) {
          const auto slot = static_cast<std::size_t>(p);
          logits_(h, p) += static_cast<S>(
              decay_(h, p) + slope_bias(position_now_, position_[slot], a_h, slope_k_[slot]));
        }
      } else {
        logits_.row(h) += decay_.row(h).head(n).template cast<S>();
      }
      if (n > 0) max_logit[h] = std::max(max_logit[h], logits_.row(h).maxCoeff());
      // Masked (−inf) tokens exactly 0, and no subnormal numbers (probabilities.h).
      probabilities(probs_.row(h).array(), logits_.row(h).array() - max_logit[h]);
    }
    Vec<S> self_prob(G);
    probabilities(self_prob.array(), (self - max_logit).array());
    const Vec<S> sum = probs_.rowwise().sum() + self_prob;
    o.resize(G, v.cols());
    o.noalias() = probs_ * values_.topRows(n);
    o.noalias() += self_prob * v;
    o = sum.cwiseInverse().asDiagonal() * o;
    lse = max_logit.array() + sum.array().log();
    append(k, v, b);
    ++position_now_;
  }

  std::int64_t cached() const { return cached_; }

 private:
  void append(const Mat<S>& k, const Mat<S>& v, double b) {
    if (capacity_ == 0) return;  // window 1: a token only ever sees itself
    std::int64_t slot;
    if (capacity_ < 0 || cached_ < capacity_) {  // room left: grow by doubling, up to the window
      slot = cached_++;
      if (slot == keys_.rows()) {
        std::int64_t rows = std::max<std::int64_t>(16, 2 * keys_.rows());
        if (capacity_ > 0) rows = std::min(rows, capacity_);
        keys_.conservativeResize(rows, keys_.cols());
        values_.conservativeResize(rows, values_.cols());
        decay_.conservativeResize(decay_.rows(), rows);
        slope_k_.resize(static_cast<std::size_t>(rows));
        position_.resize(static_cast<std::size_t>(rows));
      }
    } else {  // full ring: overwrite the oldest token (it leaves the window)
      slot = next_;
      next_ = (next_ + 1) % capacity_;
    }
    keys_.row(slot) = k.row(0);
    values_.row(slot) = v.row(0);
    decay_.col(slot).setZero();
    slope_k_[static_cast<std::size_t>(slot)] = b;
    position_[static_cast<std::size_t>(slot)] = position_now_;
  }

  std::int64_t capacity_;    // −1: unbounded
  std::int64_t cached_ = 0;  // valid slots: the first `cached_` rows
  std::int64_t next_ = 0;    // full ring: the slot of the oldest token
  Mat<S> keys_, values_;
  Mat<double> decay_;  // query head of the group × slot
  // Additive GRAPE slopes: each slot's key slope b_p and position p; the current token's position.
  bool biased_ = false;
  std::vector<double> slope_k_;
  std::vector<std::int64_t> position_;
  std::int64_t position_now_ = 0;
  Mat<S> logits_, probs_;
};

template <class S>
void forward_typed(const Problem& p, const TensorView& o, const TensorView& lse) {
  parallel_for(p.num_items(), [&](std::int64_t item) {
    const Sequence& seq = p.sequences[static_cast<std::size_t>(item / p.H)];
    const std::int64_t h = item % p.H, L = seq.length, G = p.group();
    // An empty sequence has no output rows; and Eigen's col(r) of an empty matrix offsets a null
    // pointer (undefined behaviour, found by UBSan).
    if (L == 0) return;
    Mat<S> k, v;
    load_rows(p.k, seq, h, k);
    load_rows(p.v, seq, h, v);
    PairAngles<S> angles;
    if (p.theta.defined()) {
      angles.load(p.theta, seq, h);
      rotate_rows(k, angles, p.rotary_layout);
    }
    std::vector<Mat<S>> q(static_cast<std::size_t>(G)), out(static_cast<std::size_t>(G));
    Mat<double> gates(L, G), slopes_q(p.has_slopes() ? L : 0, G);
    Vec<double> column, slopes_k, a_t = Vec<double>::Zero(G);
    if (p.has_slopes()) load_slopes(p.slope_k, seq, h, slopes_k);
    for (std::int64_t r = 0; r < G; ++r) {
      if (p.has_slopes()) {
        load_slopes(p.slope_q, seq, h * G + r, column);
        slopes_q.col(r) = column;
      }
      load_rows(p.q, seq, h * G + r, q[static_cast<std::size_t>(r)]);
      if (p.theta.defined()) rotate_rows(q[static_cast<std::size_t>(r)], angles, p.rotary_layout);
      load_column(p.g, seq, h * G + r, column);
      gates.col(r) = column;
      out[static_cast<std::size_t>(r)].resize(L, p.V);
    }
    Mat<S> out_lse(L, G), q_t(G, p.K), k_t, v_t, o_t;
    Vec<S> lse_t;
    KvCache<S> cache(p.K, p.V, G, p.window);
    for (std::int64_t t = 0; t < L; ++t) {
      for (std::int64_t r = 0; r < G; ++r) q_t.row(r) = q[static_cast<std::size_t>(r)].row(t);
      k_t = k.row(t);
      v_t = v.row(t);
      if (p.has_slopes()) {
        a_t = slopes_q.row(t).transpose();
        cache.step(q_t, k_t, v_t, gates.row(t).transpose(), p.scale, o_t, lse_t, true, a_t,
                   slopes_k[t]);
      } else {
        cache.step(q_t, k_t, v_t, gates.row(t).transpose(), p.scale, o_t, lse_t);
      }
      for (std::int64_t r = 0; r < G; ++r) out[static_cast<std::size_t>(r)].row(t) = o_t.row(r);
      out_lse.row(t) = lse_t.transpose();
    }
    for (std::int64_t r = 0; r < G; ++r) {
      store_rows(out[static_cast<std::size_t>(r)], o, seq, h * G + r);
      if (lse.defined()) store_column(out_lse.col(r), lse, seq, h * G + r);
    }
  });
}

template <class S>
void backward_typed(const Problem& p, const TensorView& d_o, const TensorView& o,
                    const TensorView& lse, const ForgettingAttnGrads& grads) {
  const bool saved = o.defined() && lse.defined();
  parallel_for(p.num_items(), [&](std::int64_t item) {
    const Sequence& seq = p.sequences[static_cast<std::size_t>(item / p.H)];
    const std::int64_t h = item % p.H, L = seq.length;
    if (L == 0) return;  // no row of any gradient belongs to an empty sequence
    Mat<S> k, v, q, dout, out;
    Vec<S> saved_lse, logits, probs, dlogits, elsewhere;
    Vec<double> g, a, b;
    load_rows(p.k, seq, h, k);
    load_rows(p.v, seq, h, v);
    const bool slopes = p.has_slopes();
    if (slopes) load_slopes(p.slope_k, seq, h, b);
    Vec<double> db = Vec<double>::Zero(L);  // summed over the group
    // With θ, k and q are the rotated rows and dk, dq are first taken with respect to them.
    const bool rotated = p.theta.defined();
    PairAngles<S> angles;
    if (rotated) {
      angles.load(p.theta, seq, h);
      rotate_rows(k, angles, p.rotary_layout);
    }
    Mat<S> dtheta = Mat<S>::Zero(rotated ? L : 0, p.K / 2);  // the group's q and k contributions
    Mat<S> dk = Mat<S>::Zero(L, p.K), dv = Mat<S>::Zero(L, p.V);
    std::vector<double> gate_sums;  // gate_sums[t − j] = Σ_{s ∈ (j, t]} g_s
    for (std::int64_t hq = h * p.group(); hq < (h + 1) * p.group(); ++hq) {
      load_rows(p.q, seq, hq, q);
      if (rotated) rotate_rows(q, angles, p.rotary_layout);
      load_rows(d_o, seq, hq, dout);
      load_column(p.g, seq, hq, g);
      if (slopes) load_slopes(p.slope_q, seq, hq, a);
      Vec<double> da = Vec<double>::Zero(L);
      if (saved) {
        load_rows(o, seq, hq, out);
        load_column(lse, seq, hq, saved_lse);
      }
      if (p.dlogit_sums_elsewhere.defined())
        load_column(p.dlogit_sums_elsewhere, seq, hq, elsewhere);
      else
        elsewhere = Vec<S>::Zero(L);
      Mat<S> dq = Mat<S>::Zero(L, p.K);
      Vec<double> dg = Vec<double>::Zero(L);
      for (std::int64_t t = 0; t < L; ++t) {
        // The tokens step t attended to: back to the window start or the last zero gate.
        gate_sums.assign(1, 0.0);
        for (std::int64_t j = t - 1; j >= window_start(t, p.window); --j) {
          const double sum = gate_sums.back() + g[j + 1];
          if (sum == kNegInf) break;
          gate_sums.push_back(sum);
        }
        const auto n = static_cast<std::int64_t>(gate_sums.size());
        const std::int64_t first = t - n + 1;
        const Vec<S> q_scaled = q.row(t).transpose() * static_cast<S>(p.scale);
        logits.noalias() = k.middleRows(first, n) * q_scaled;
        if (slopes) {
          for (std::int64_t j = first; j <= t; ++j)
            logits[j - first] += static_cast<S>(gate_sums[static_cast<std::size_t>(t - j)] +
                                                slope_bias(t, j, a[t], b[j]));
        } else {
          for (std::int64_t j = first; j <= t; ++j)
            logits[j - first] += static_cast<S>(gate_sums[static_cast<std::size_t>(t - j)]);
        }
        // Step t's forward: lse_t and o_t, saved or recomputed.
        S lse_t;
        Vec<S> o_t;
        if (saved) {
          lse_t = saved_lse[t];
          o_t = out.row(t).transpose();
        } else {
          const S max_logit = logits.maxCoeff();
          probs.resize(n);
          probabilities(probs.array(), logits.array() - max_logit);
          const S sum = probs.sum();
          lse_t = max_logit + std::log(sum);
          o_t = v.middleRows(first, n).transpose() * probs / sum;
        }
        // Clamped at 1 (probabilities.h): a saved lse_t comes from the decoding path's
        // arithmetic, and logits of 1e9 in float32 differ from it by hundreds (e^{ℓ − lse} would
        // overflow; exactly, ℓ ≤ lse).
        probs.resize(n);
        probabilities(probs.array(), logits.array() - lse_t);
        // Adjoint of the softmax: dℓ_tj = P_tj (do_t·v_j − do_t·o_t); a dominant token's from the
        // others.
        const Vec<S> do_t = dout.row(t).transpose();
        const S delta = do_t.dot(o_t);
        dlogits = probs.cwiseProduct(((v.middleRows(first, n) * do_t).array() - delta).matrix());
        Eigen::Index dominant;
        if (probs.maxCoeff(&dominant) > S(0.5)) {
          dlogits[dominant] = 0;
          dlogits[dominant] = -dlogits.sum() - elsewhere[t];  // the row's keys outside the call
        }
        dq.row(t) =
            static_cast<S>(p.scale) * (k.middleRows(first, n).transpose() * dlogits).transpose();
        dk.middleRows(first, n).noalias() += dlogits * q.row(t);
        dv.middleRows(first, n).noalias() += probs * dout.row(t);
        // ℓ_tj contains g_s for s ∈ (j, t]: dg_s += Σ_{first ≤ j < s} dℓ_tj.
        double run = 0;
        for (std::int64_t j = first; j < t; ++j) {
          run += static_cast<double>(dlogits[j - first]);
          dg[j + 1] += run;
        }
        // ℓ_tj contains −(t − j)(a_t + b_j).
        if (slopes)
          for (std::int64_t j = first; j < t; ++j) {
            const double d = -static_cast<double>(t - j) * static_cast<double>(dlogits[j - first]);
            da[t] += d;
            db[j] += d;
          }
      }
      if (rotated) unrotate_gradient_rows(dq, q, angles, p.rotary_layout, dtheta);
      if (grads.dq.defined()) store_rows(dq, grads.dq, seq, hq);
      if (grads.dg.defined()) store_column(dg, grads.dg, seq, hq);
      if (grads.dbias_q_slope.defined()) store_column(da, grads.dbias_q_slope, seq, hq);
    }
    if (grads.dbias_k_slope.defined()) store_column(db, grads.dbias_k_slope, seq, h);
    dk *= static_cast<S>(p.scale);
    if (rotated) {
      unrotate_gradient_rows(dk, k, angles, p.rotary_layout, dtheta);
      if (grads.dtheta.defined()) store_rows(dtheta, grads.dtheta, seq, h);
    }
    if (grads.dk.defined()) store_rows(dk, grads.dk, seq, h);
    if (grads.dv.defined()) store_rows(dv, grads.dv, seq, h);
  });
}

}  // namespace

void recurrent_forward(const Problem& p, const TensorView& o, const TensorView& lse) {
  dispatch_float(p.q, [&](auto s) { forward_typed<decltype(s)>(p, o, lse); });
}

void recurrent_backward(const Problem& p, const TensorView& d_o, const TensorView& o,
                        const TensorView& lse, const ForgettingAttnGrads& grads) {
  dispatch_float(p.q, [&](auto s) { backward_typed<decltype(s)>(p, d_o, o, lse, grads); });
}

}  // namespace detail::fox

// ---- ForgettingAttnCache ---------------------------------------------------------------------

namespace detail::fox {

// Memory of a GPU device (Device::cuda or Device::emulated), freed with the owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device device, std::size_t bytes)
      : device_(device), data_(device_allocate(device, std::max<std::size_t>(bytes, 1))) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : device_(other.device_), data_(std::exchange(other.data_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(data_, other.data_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { device_free(device_, data_); }
  void* data() const { return data_; }

 private:
  Device device_ = Device::cpu;
  void* data_ = nullptr;
};

// The cache on a GPU device (cuda/forgetting_attn/recurrent.cu): slot-major buffers (a slot
// holds one token of every batch row and head; see DecodeStep) of `capacity` slots, grown by
// doubling up to the window, so that growing copies one contiguous prefix per buffer (on the
// device, queued on the current stream). Which slot holds which token, and so every position,
// follows from the number of tokens seen: the host never reads the cache back. Unlike the CPU
// cache it keeps the tokens a zero gate has masked (their decay stays −inf, their weight 0):
// emptying it would need the gate values on the host, a sync per step.
struct GpuCache {
  std::int64_t capacity = 0;
  DeviceBuffer keys, values, decay, key_slopes;
  bool biased = false;  // some step had slopes

  struct Sizes {
    std::int64_t B, HQ, H, K, V;
    DType compute;
  };
  // Per-slot bytes of each buffer.
  static std::array<std::size_t, 4> slot_bytes(const Sizes& z) {
    const std::size_t c = element_size(z.compute), d = sizeof(double);
    return {static_cast<std::size_t>(z.B * z.H * z.K) * c,
            static_cast<std::size_t>(z.B * z.H * z.V) * c, static_cast<std::size_t>(z.B * z.HQ) * d,
            static_cast<std::size_t>(z.B * z.H) * d};
  }
  // Room for `needed` slots (≤ the window).
  void reserve(Device device, const Sizes& z, std::int64_t needed, std::int64_t window) {
    if (needed <= capacity) return;
    const std::int64_t grown =
        std::min<std::int64_t>(window == kNoWindow ? INT64_MAX : window,
                               std::max<std::int64_t>({needed, 2 * capacity, std::int64_t{16}}));
    const auto bytes = slot_bytes(z);
    DeviceBuffer* buffers[4] = {&keys, &values, &decay, &key_slopes};
    for (std::size_t i = 0; i < 4; ++i) {
      DeviceBuffer bigger(device, bytes[i] * static_cast<std::size_t>(grown));
      if (capacity > 0)
        copy_bytes(bigger.data(), device, buffers[i]->data(), device,
                   bytes[i] * static_cast<std::size_t>(capacity));
      *buffers[i] = std::move(bigger);
    }
    capacity = grown;
  }
  TensorView view(const DeviceBuffer& buffer, DType dtype, std::initializer_list<std::int64_t> rest,
                  Device device) const {
    std::array<std::int64_t, 4> sizes{capacity, 0, 0, 0};
    int rank = 1;
    for (std::int64_t r : rest) sizes[static_cast<std::size_t>(rank++)] = r;
    switch (rank) {
      case 3:
        return TensorView::contiguous(buffer.data(), dtype, {sizes[0], sizes[1], sizes[2]}, device);
      default:
        return TensorView::contiguous(buffer.data(), dtype,
                                      {sizes[0], sizes[1], sizes[2], sizes[3]}, device);
    }
  }
};

}  // namespace detail::fox

struct ForgettingAttnCache::State {
  std::int64_t batch, HQ, H, K, V, window;
  std::int64_t length = 0;
  // The compute type is q's dtype at the first step after construction or reset(), and the
  // device that of its views.
  bool started = false;
  DType compute = DType::float32;
  Device device = Device::cpu;
  // Rotation, also set by the first step since construction or reset(): the cached keys are
  // rotated (with this layout) or not, and every later step must agree, or the logits of new
  // queries against old keys would mix frames.
  bool rotated = false;
  RotaryLayout layout = RotaryLayout::half_split;
  std::vector<detail::fox::KvCache<float>> f32;  // [batch × H], on the cpu
  std::vector<detail::fox::KvCache<double>> f64;
  detail::fox::GpuCache gpu;  // on a GPU device

  template <class S>
  std::vector<detail::fox::KvCache<S>>& caches() {
    if constexpr (std::is_same_v<S, float>)
      return f32;
    else
      return f64;
  }
};

ForgettingAttnCache::ForgettingAttnCache(std::int64_t batch, std::int64_t num_q_heads,
                                         std::int64_t num_kv_heads, std::int64_t head_dim,
                                         std::int64_t value_dim,
                                         std::optional<std::int64_t> window_size)
    : state_(std::make_unique<State>()) {
  const std::string op = "ForgettingAttnCache";
  detail::check_positive(op, "batch", batch);
  detail::check_positive(op, "num_kv_heads", num_kv_heads);
  if (num_q_heads < 1 || num_q_heads % num_kv_heads != 0)
    detail::fail(op, "num_q_heads",
                 "a positive multiple of num_kv_heads = " + std::to_string(num_kv_heads),
                 std::to_string(num_q_heads));
  detail::check_positive(op, "head_dim", head_dim);
  detail::check_positive(op, "value_dim", value_dim);
  if (window_size && *window_size < 1)
    detail::fail(op, "window_size", "none (full causal attention) or an integer >= 1",
                 std::to_string(*window_size));
  State& s = *state_;
  s.batch = batch;
  s.HQ = num_q_heads;
  s.H = num_kv_heads;
  s.K = head_dim;
  s.V = value_dim;
  s.window = window_size ? *window_size : detail::fox::kNoWindow;
}

ForgettingAttnCache::~ForgettingAttnCache() = default;
ForgettingAttnCache::ForgettingAttnCache(ForgettingAttnCache&&) noexcept = default;
ForgettingAttnCache& ForgettingAttnCache::operator=(ForgettingAttnCache&&) noexcept = default;

std::int64_t ForgettingAttnCache::length() const {
  return state_ ? state_->length : 0;
}

void ForgettingAttnCache::reset() {
  if (!state_) return;
  state_->length = 0;
  state_->started = false;
  state_->f32.clear();
  state_->f64.clear();
  state_->gpu = detail::fox::GpuCache();
}

void ForgettingAttnCache::step(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& g, const TensorView& o,
                               std::optional<double> scale, const TensorView& theta,
                               RotaryLayout rotary_layout, const TensorView& bias_q_slope,
                               const TensorView& bias_k_slope) {
  const std::string op = "ForgettingAttnCache::step";
  if (!state_) throw Error(op + ": the cache was moved from");
  State& s = *state_;
  const Device device = detail::call_device(op, "q", q, /*gpu_capable=*/true);
  if (s.started && device != s.device)
    detail::fail(op, "q",
                 std::string("a tensor on ") + to_string(s.device) +
                     " (the cache's device, set by the first step since construction or reset())",
                 std::string("a tensor on ") + to_string(device));
  detail::check_float_tensor(
      op, "q", q,
      {{s.batch, "batch"}, {1, "1 (one token)"}, {s.HQ, "num_q_heads"}, {s.K, "head_dim"}}, device);
  detail::check_float_tensor(
      op, "k", k,
      {{s.batch, "batch"}, {1, "1 (one token)"}, {s.H, "num_kv_heads"}, {s.K, "head_dim"}}, device);
  detail::check_float_tensor(
      op, "v", v,
      {{s.batch, "batch"}, {1, "1 (one token)"}, {s.H, "num_kv_heads"}, {s.V, "value_dim"}},
      device);
  detail::check_float_tensor(
      op, "g", g, {{s.batch, "batch"}, {1, "1 (one token)"}, {s.HQ, "num_q_heads"}}, device);
  detail::check_output(
      op, "o", o,
      {{s.batch, "batch"}, {1, "1 (one token)"}, {s.HQ, "num_q_heads"}, {s.V, "value_dim"}},
      device);
  const double resolved_scale = detail::resolve_scale(op, scale, s.K);
  if (s.started && detail::compute_dtype(q.dtype) != s.compute)
    detail::fail(op, "q",
                 std::string("a dtype computed in ") + to_string(s.compute) +
                     " (the cache's compute type, set by the first step since construction or "
                     "reset())",
                 std::string("dtype ") + to_string(q.dtype));
  if (bias_q_slope.defined())
    detail::check_float_tensor(op, "bias_q_slope", bias_q_slope,
                               {{s.batch, "batch"}, {1, "1 (one token)"}, {s.HQ, "num_q_heads"}},
                               device);
  if (bias_k_slope.defined())
    detail::check_float_tensor(op, "bias_k_slope", bias_k_slope,
                               {{s.batch, "batch"}, {1, "1 (one token)"}, {s.H, "num_kv_heads"}},
                               device);
  const bool slopes = bias_q_slope.defined() || bias_k_slope.defined();
  detail::check_theta(op, theta, s.batch, 1, s.H, s.K, "num_kv_heads", device);
  if (s.started && theta.defined() != s.rotated)
    detail::fail(op, "theta",
                 std::string(s.rotated ? "theta at every step" : "no theta at any step") +
                     " (the cache's keys are " + (s.rotated ? "" : "not ") +
                     "rotated: set by the first step since construction or reset())",
                 theta.defined() ? "theta given" : "no theta");
  if (s.started && s.rotated && rotary_layout != s.layout)
    detail::fail(op, "rotary_layout",
                 std::string(to_string(s.layout)) +
                     " (the layout of the cached keys, set by the first step since construction "
                     "or reset())",
                 to_string(rotary_layout));
  // Values: gates ≤ 0, finite slopes (an infinite one would give 0·inf = NaN at the own token);
  // on a GPU device by a validation kernel (one host sync).
  detail::ValueChecks checks;
  checks.add("g", g, detail::ValueRule::log_gate);
  checks.add("bias_q_slope", bias_q_slope, detail::ValueRule::finite);
  checks.add("bias_k_slope", bias_k_slope, detail::ValueRule::finite);
  if (device == Device::cpu)
    detail::check_values_on_host(op, checks);
  else
    detail::check_values_on_gpu(op, device, checks);

  if (device != Device::cpu) {
    // Everything that can fail is checked before the cache changes (a failed step changes
    // nothing); growing it copies what it holds.
    detail::fox::GpuCache& cache = s.gpu;
    const DType compute = s.started ? s.compute : detail::compute_dtype(q.dtype);
    const detail::fox::GpuCache::Sizes sizes{s.batch, s.HQ, s.H, s.K, s.V, compute};
    detail::fox::DecodeStep step;
    step.q = q, step.k = k, step.v = v, step.g = g, step.theta = theta;
    step.rotary_layout = rotary_layout;
    step.slope_q = bias_q_slope, step.slope_k = bias_k_slope;
    step.position = s.length;
    step.window = s.window;
    step.ring = s.window == detail::fox::kNoWindow ? 0 : s.window;
    step.scale = resolved_scale;
    step.B = s.batch, step.HQ = s.HQ, step.H = s.H, step.K = s.K, step.V = s.V;
    step.device = device;
    step.keys.dtype = compute;  // what the kernels' limits depend on; the views come below
    PHASOR_ON_GPU(device, fox::check_decode_step(step));
    cache.reserve(device, sizes, step.visible(), s.window);
    cache.biased = cache.biased || slopes;
    step.biased = cache.biased;
    step.keys = cache.view(cache.keys, compute, {s.batch, s.H, s.K}, device);
    step.values = cache.view(cache.values, compute, {s.batch, s.H, s.V}, device);
    step.decay = cache.view(cache.decay, DType::float64, {s.batch, s.HQ}, device);
    step.key_slopes = cache.view(cache.key_slopes, DType::float64, {s.batch, s.H}, device);
    if (!s.started) {
      s.compute = compute;
      s.device = device;
      s.rotated = theta.defined();
      s.layout = rotary_layout;
      s.started = true;
    }
    PHASOR_ON_GPU(device, fox::decode_step(step, o));
    ++s.length;
    return;
  }

  const std::int64_t G = s.HQ / s.H;
  detail::dispatch_float(q, [&](auto type_tag) {
    using S = decltype(type_tag);
    auto& caches = s.template caches<S>();
    if (!s.started) {
      caches.clear();
      for (std::int64_t i = 0; i < s.batch * s.H; ++i) caches.emplace_back(s.K, s.V, G, s.window);
      s.compute = detail::compute_dtype(q.dtype);
      s.device = Device::cpu;
      s.rotated = theta.defined();
      s.layout = rotary_layout;
      s.started = true;
    }
    auto step_item = [&](std::int64_t item) {
      const std::int64_t b = item / s.H, h = item % s.H;
      const detail::Sequence token{b, 0, 1};
      detail::Mat<S> q_t(G, s.K), row, k_t, v_t, o_t;
      detail::Vec<double> gates(G), column, a_t = detail::Vec<double>::Zero(G);
      detail::Vec<S> lse_t;
      for (std::int64_t r = 0; r < G; ++r) {
        detail::load_rows(q, token, h * G + r, row);
        q_t.row(r) = row.row(0);
        detail::load_column(g, token, h * G + r, column);
        gates[r] = column[0];
        if (bias_q_slope.defined()) {
          detail::load_column(bias_q_slope, token, h * G + r, column);
          a_t[r] = column[0];
        }
      }
      double b_t = 0;
      if (bias_k_slope.defined()) {
        detail::load_column(bias_k_slope, token, h, column);
        b_t = column[0];
      }
      detail::load_rows(k, token, h, k_t);
      detail::load_rows(v, token, h, v_t);
      if (theta.defined()) {
        // This token's angles of key head h rotate its key (cached rotated) and the queries of
        // the group.
        detail::PairAngles<S> angles;
        angles.load(theta, token, h);
        detail::rotate_rows(k_t, angles, rotary_layout);
        for (std::int64_t r = 0; r < G; ++r)
          detail::rotate_rows(q_t.middleRows(r, 1), angles, rotary_layout);
      }
      caches[static_cast<std::size_t>(item)].step(q_t, k_t, v_t, gates, resolved_scale, o_t, lse_t,
                                                  slopes, a_t, b_t);
      for (std::int64_t r = 0; r < G; ++r) detail::store_rows(o_t.row(r), o, token, h * G + r);
    };
    // An item (a key head and its G query heads) scores and weighs every cached token: a short
    // step runs on the calling thread (parallel_for's work estimate; each item is computed the
    // same way either way).
    const std::int64_t work_per_item = G * (caches.front().cached() + 1) * (s.K + s.V);
    detail::parallel_for(s.batch * s.H, work_per_item, step_item);
  });
  ++s.length;
}

}  // namespace phasor
