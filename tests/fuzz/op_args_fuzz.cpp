// Fuzz target: the argument validation of the core ops (phasor/*.h; no LibTorch).
//
// Each input decodes into one call of one entry point (GLA, Gated DeltaNet, forgetting attention
// and its decoding cache, the rotary ops, the short convolution, FAVOR+, GRAPE, STRING and the
// structured rotations; forward and backward; every implementation; cpu, emulated or cuda
// device) with fuzzed scalar arguments and views. Each view starts from the shape the op expects
// (from fuzzed dimensions: mostly 0…4, sometimes values at the edges of int64) and may then be
// mutated: undefined, another rank (up to 6), one size or stride replaced (0, negative, huge,
// near INT64_MAX, …), another dtype or device, transposed / padded / reversed strides, a null
// data pointer. cu_seqlens hold sorted offsets or broken ones.
//
// The views' memory: the core takes raw pointers, so a view larger than its buffer is the
// caller's bug, not the library's. A view therefore gets a real buffer, filled with fuzzed values,
// when it is well-formed and small (≤ 4096 elements, ≤ 1 MiB of span, every size ≤ 64); the op
// then really runs. Well-formed views too large to back with memory make the call be skipped, and
// so do empty ones with a size above 64 (an empty q of B = 2^40 rows still asks for a state per
// row: work and memory the caller asked for, not a validation bug), whatever the other views. A
// malformed view —
// rank above 4, a negative size, sizes whose product (zeros counted as ones) exceeds 2^62, sizes
// and strides whose offsets overflow int64, a null pointer to elements — gets a small dummy buffer,
// and the call must then fail with a phasor::Error: the library has to reject it before touching
// memory (no overflow, no out-of-bounds access).
//
// Seed corpus (corpus/op_args_fuzz/): per op choice, files of 384 equal bytes b (b < 160, b ≡ op
// mod 19, b mod 5 ≠ 0: nominal views of sizes b mod 5, no mutation), and 8 random files.
//
// Every call must end in success or a phasor::Error whose message names an argument and says
// what was expected; any other exception, a malformed view accepted, a crash or a sanitizer
// report is a finding (abort()).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "phasor/phasor.h"

namespace {

using namespace phasor;

constexpr std::int64_t kMaxElements = 4096;      // per view backed by memory
constexpr std::int64_t kMaxSpanBytes = 1 << 20;  // 1 MiB
constexpr std::int64_t kMaxSize = 64;            // per dimension of a view that runs
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
// The library's limit on a view's product of sizes, zeros counted as ones (common/check.h).
constexpr std::int64_t kMaxProduct = std::int64_t{1} << 62;

// Sizes and strides at the edges: products of two of them overflow int64 in many ways.
constexpr std::int64_t kEdges[] = {0,
                                   1,
                                   2,
                                   3,
                                   5,
                                   7,
                                   8,
                                   15,
                                   16,
                                   17,
                                   31,
                                   33,
                                   63,
                                   64,
                                   65,
                                   127,
                                   255,
                                   257,
                                   -1,
                                   -2,
                                   -3,
                                   -64,
                                   std::numeric_limits<std::int32_t>::max(),
                                   std::numeric_limits<std::int32_t>::min(),
                                   std::int64_t{1} << 31,
                                   std::int64_t{1} << 32,
                                   (std::int64_t{1} << 32) + 1,
                                   3037000499,  // ⌊√INT64_MAX⌋
                                   3037000500,
                                   std::int64_t{1} << 40,
                                   1000000000000,
                                   std::int64_t{1} << 61,
                                   std::int64_t{1} << 62,
                                   (std::int64_t{1} << 62) + 1,
                                   kI64Max / 2,
                                   kI64Max / 2 + 1,
                                   kI64Max / 3,
                                   kI64Max - 1,
                                   kI64Max,
                                   kI64Min,
                                   kI64Min + 1,
                                   -(std::int64_t{1} << 62),
                                   -(std::int64_t{1} << 32),
                                   -1000000000000};
constexpr std::size_t kNumEdges = sizeof(kEdges) / sizeof(kEdges[0]);

// The fuzzer's own shape arithmetic (N + 1, W − 1, H·G, …) wraps instead of overflowing.
std::int64_t wrap_add(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}
std::int64_t wrap_mul(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "op_args_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// The decoder of one input: bytes from the front for the structure (0 once exhausted), and a
// generator seeded from the input for the values that fill the buffers.
class Decoder {
 public:
  Decoder(const std::uint8_t* data, std::size_t size) : fdp_(data, size) {
    state_ = fdp_.ConsumeIntegral<std::uint64_t>() ^ 0x9e3779b97f4a7c15ULL;
  }
  std::uint8_t byte() { return fdp_.ConsumeIntegral<std::uint8_t>(); }
  bool chance(unsigned num, unsigned den) { return byte() % den < num; }
  std::int64_t edge() { return kEdges[byte() % kNumEdges]; }
  // A dimension: mostly 0…4, sometimes an edge value.
  std::int64_t dim() {
    const std::uint8_t b = byte();
    return b < 216 ? b % 5 : kEdges[b % kNumEdges];
  }
  // A head dimension: mostly 2 or 4 (even), sometimes anything dim() gives.
  std::int64_t even_dim() {
    const std::uint8_t b = byte();
    if (b < 160) return b % 2 ? 4 : 2;
    return b < 216 ? b % 6 : kEdges[b % kNumEdges];
  }
  // A positive parameter (chunk size, block size, window): mostly small, sometimes an edge.
  std::int64_t count() {
    const std::uint8_t b = byte();
    if (b < 64) return 1 + b % 4;
    if (b < 128) return b % 2 ? 16 : 64;
    return kEdges[b % kNumEdges];
  }
  // A real-valued scalar argument: mostly ordinary, sometimes 0, negative, huge, inf or NaN.
  double real(double ordinary) {
    switch (byte() % 16) {
      case 0:
        return 0.0;
      case 1:
        return -ordinary;
      case 2:
        return std::numeric_limits<double>::infinity();
      case 3:
        return -std::numeric_limits<double>::infinity();
      case 4:
        return std::numeric_limits<double>::quiet_NaN();
      case 5:
        return 1e300;
      case 6:
        return 1e-300;
      default:
        return ordinary;
    }
  }
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  FuzzedDataProvider fdp_;
  std::uint64_t state_;
};

// What fills a view's memory.
enum class Fill : std::uint8_t {
  values,    // uniform in [−2, 2]
  gates,     // natural-log forget gates ≤ 0
  identity,  // 1 on the diagonal of the last two dimensions, else 0 (orthogonal bases)
  output,    // NaN (every element of an output must be written)
};

// The memory of views: aligned buffers kept until the call returns, and a small dummy buffer for
// views that must never be read.
struct Buffers {
  std::vector<std::unique_ptr<double[]>> owned;
  alignas(64) static inline unsigned char dummy[256] = {};
  void* allocate(std::int64_t bytes) {
    owned.emplace_back(new double[static_cast<std::size_t>((bytes + 7) / 8 + 1)]);
    return owned.back().get();
  }
};

// Sum of x·y with overflow detection.
bool mul_add(std::int64_t& acc, std::int64_t x, std::int64_t y) {
  std::int64_t product;
  if (__builtin_mul_overflow(x, y, &product)) return false;
  return !__builtin_add_overflow(acc, product, &acc);
}

void store(const TensorView& v, std::int64_t offset, double value) {
  switch (v.dtype) {
    case DType::float32:
      static_cast<float*>(v.data)[offset] = static_cast<float>(value);
      break;
    case DType::float64:
      static_cast<double*>(v.data)[offset] = value;
      break;
    case DType::bfloat16:
      static_cast<bfloat16*>(v.data)[offset] = bfloat16::from_float(static_cast<float>(value));
      break;
    case DType::float16:
      static_cast<float16*>(v.data)[offset] = float16::from_float(static_cast<float>(value));
      break;
    case DType::int32:
      static_cast<std::int32_t*>(v.data)[offset] =
          static_cast<std::int32_t>(std::isfinite(value) ? std::fmod(value, 1e9) : 0);
      break;
    case DType::int64:
      static_cast<std::int64_t*>(v.data)[offset] =
          static_cast<std::int64_t>(std::isfinite(value) ? std::fmod(value, 1e18) : 0);
      break;
  }
}

// One call being built: its device, views and whether they can be run.
class Call {
 public:
  explicit Call(Decoder& in) : in_(in) {
    const std::uint8_t b = in_.byte();
    device_ = b < 224 ? Device::cpu : b < 252 ? Device::emulated : Device::cuda;
  }
  Device device() const { return device_; }
  bool malformed() const { return !malformed_.empty(); }
  // The classification so far, to undo that of views then left out of the call.
  struct Flags {
    std::string malformed;
    bool too_large;
  };
  Flags flags() const { return {malformed_, too_large_}; }
  void set_flags(const Flags& f) { malformed_ = f.malformed, too_large_ = f.too_large; }
  const std::string& why_malformed() const { return malformed_; }
  bool too_large() const { return too_large_; }

  // A view the op expects with shape `dims` (any rank ≤ 4) and a floating dtype, possibly mutated.
  TensorView view(std::initializer_list<std::int64_t> dims, Fill fill, bool optional = false) {
    if (optional && in_.chance(1, 2)) return {};
    TensorView v;
    v.dtype = float_dtype();
    v.device = device_;
    v.rank = static_cast<int>(dims.size());
    int d = 0;
    for (std::int64_t s : dims) v.sizes[static_cast<std::size_t>(d++)] = s;
    contiguous_strides(v);
    mutate(v);
    back(v, fill);
    return v;
  }
  TensorView output(std::initializer_list<std::int64_t> dims, bool optional = false) {
    return view(dims, Fill::output, optional);
  }
  // cu_seqlens for `n` packed sequences over `T` tokens: sorted offsets 0 = cu[0] ≤ … ≤ cu[n] = T,
  // or broken ones (and mutated metadata).
  TensorView cu_seqlens(std::int64_t n, std::int64_t T) {
    TensorView v;
    v.dtype = in_.chance(1, 2) ? DType::int32 : DType::int64;
    v.device = device_;
    v.rank = 1;
    v.sizes[0] = wrap_add(n, 1);
    v.strides[0] = 1;
    mutate(v);
    back(v, Fill::values);
    if (v.data == nullptr || v.data == Buffers::dummy || !v.defined() || v.rank != 1 ||
        is_floating(v.dtype))
      return v;
    // Sorted offsets in [0, T], then maybe broken in one place.
    const std::int64_t entries = v.sizes[0];
    std::vector<std::int64_t> cu(static_cast<std::size_t>(entries));
    const std::int64_t top = std::max<std::int64_t>(0, std::min<std::int64_t>(T, 1 << 20));
    for (auto& c : cu) c = top > 0 ? static_cast<std::int64_t>(in_.next() % (top + 1)) : 0;
    std::sort(cu.begin(), cu.end());
    if (!cu.empty()) cu.front() = 0, cu.back() = T;
    if (in_.chance(1, 4) && !cu.empty()) {
      const std::size_t at = in_.byte() % cu.size();
      cu[at] = in_.chance(1, 2) ? in_.edge() : wrap_add(cu[at], in_.chance(1, 2) ? 1 : -1);
    }
    for (std::int64_t i = 0; i < entries; ++i) {
      const std::int64_t offset = i * v.strides[0];
      if (v.dtype == DType::int32)
        static_cast<std::int32_t*>(v.data)[offset] = static_cast<std::int32_t>(cu[i]);
      else
        static_cast<std::int64_t*>(v.data)[offset] = cu[i];
    }
    return v;
  }

  // final_state = initial_state, in place (allowed by GLA and Gated DeltaNet).
  static TensorView same(const TensorView& v) { return v; }

 private:
  DType float_dtype() {
    const std::uint8_t b = in_.byte();
    return b < 128   ? DType::float32
           : b < 176 ? DType::float64
           : b < 216 ? DType::bfloat16
                     : DType::float16;
  }

  static void contiguous_strides(TensorView& v) {
    std::int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.strides[static_cast<std::size_t>(d)] = stride;
      stride = wrap_mul(stride, v.sizes[static_cast<std::size_t>(d)]);
    }
  }

  void mutate(TensorView& v) {
    const std::uint8_t b = in_.byte();
    if (b < 160) return;
    const int rank = std::max(v.rank, 1);
    const std::size_t d = in_.byte() % static_cast<std::size_t>(rank);
    switch ((b - 160) / 12) {
      case 0:  // absent
        v = TensorView{};
        return;
      case 1:  // one size replaced
        v.sizes[d] = in_.chance(1, 2) ? in_.edge() : in_.dim();
        contiguous_strides(v);
        return;
      case 2:  // one stride replaced
        v.strides[d] = in_.chance(1, 2) ? in_.edge() : static_cast<std::int64_t>(in_.byte()) - 128;
        return;
      case 3:  // another dtype, any of the six
        v.dtype = static_cast<DType>(in_.byte() % 6);
        return;
      case 4: {  // another rank: -1 … 6 (above 4 is malformed)
        const int old = v.rank;
        v.rank = static_cast<int>(in_.byte() % 8) - 1;
        for (int i = std::max(old, 0); i < std::min(v.rank, TensorView::kMaxRank); ++i)
          v.sizes[static_cast<std::size_t>(i)] = in_.dim();
        if (v.rank <= TensorView::kMaxRank) contiguous_strides(v);
        return;
      }
      case 5:  // another device
        v.device = static_cast<Device>(in_.byte() % 3);
        return;
      case 6: {  // another layout of the same elements
        const std::uint8_t how = in_.byte() % 3;
        if (how == 0 && v.rank >= 2) {  // the last two dimensions stored transposed
          const std::size_t a = static_cast<std::size_t>(v.rank - 2), c = a + 1;
          v.strides[c] = v.sizes[a];
          v.strides[a] = 1;
        } else if (how == 1) {  // padded rows
          for (int i = 0; i + 1 < v.rank; ++i)
            v.strides[static_cast<std::size_t>(i)] =
                wrap_mul(v.strides[static_cast<std::size_t>(i)], 2);
        } else if (v.rank >= 1) {  // one dimension reversed
          v.strides[d] = wrap_mul(v.strides[d], -1);
        }
        return;
      }
      case 7:  // a null data pointer (marked, applied in back())
        null_data_ = true;
        return;
      default: {  // two mutations
        mutate(v);
        mutate(v);
        return;
      }
    }
  }

  void mark_malformed(const TensorView& v, const std::string& why) {
    if (malformed_.empty()) malformed_ = why + " in a view of shape " + shape_of(v);
  }
  static std::string shape_of(const TensorView& v) {
    std::string s = "[";
    for (int d = 0; d < std::min(v.rank, TensorView::kMaxRank); ++d)
      s += (d ? ", " : "") + std::to_string(v.sizes[static_cast<std::size_t>(d)]) + ":" +
           std::to_string(v.strides[static_cast<std::size_t>(d)]);
    return s + (v.rank > TensorView::kMaxRank ? ", ...]" : "]");
  }

  // Classifies the view and gives it memory when it can have some.
  void back(TensorView& v, Fill fill) {
    const bool null_data = null_data_;
    null_data_ = false;
    if (!v.defined()) return;
    v.data = Buffers::dummy;
    if (v.rank > TensorView::kMaxRank) return mark_malformed(v, "rank " + std::to_string(v.rank));
    // The product of the sizes with zeros counted as ones must fit (the kernels form products of
    // an empty view's other sizes too); then so does the element count.
    std::int64_t product = 1, numel = 1, max_size = 0;
    for (int d = 0; d < v.rank; ++d) {
      const std::int64_t s = v.sizes[static_cast<std::size_t>(d)];
      max_size = std::max(max_size, s);
      if (s < 0) return mark_malformed(v, "a negative size");
      if (__builtin_mul_overflow(product, std::max<std::int64_t>(s, 1), &product) ||
          product > kMaxProduct)
        return mark_malformed(v, "a product of sizes above 2^62");
      numel *= s;
    }
    // The span of element offsets [lo, hi] (a dimension of size 0 adds nothing: an empty view's
    // other offsets are still formed by the kernels) and its bytes.
    std::int64_t lo = 0, hi = 0;
    for (int d = 0; d < v.rank; ++d) {
      const std::int64_t s = std::max<std::int64_t>(v.sizes[static_cast<std::size_t>(d)] - 1, 0),
                         st = v.strides[static_cast<std::size_t>(d)];
      if (!mul_add(st < 0 ? lo : hi, s, st))
        return mark_malformed(v, "element offsets beyond int64");
    }
    // The bytes [lo·size, (hi + 1)·size) relative to the data pointer must be representable;
    // the span between them (for the buffer) may still exceed int64, then it is too large.
    const auto element_bytes = static_cast<std::int64_t>(element_size(v.dtype));
    std::int64_t first = 0, end = 0, bytes = 0;
    if (__builtin_mul_overflow(lo, element_bytes, &first) || __builtin_add_overflow(hi, 1, &end) ||
        __builtin_mul_overflow(end, element_bytes, &end))
      return mark_malformed(v, "byte offsets beyond int64");
    if (__builtin_sub_overflow(end, first, &bytes)) bytes = kI64Max;
    if (numel == 0) {
      if (null_data) v.data = nullptr;  // allowed: nothing to read
      // An empty view with a huge other size still makes the op loop over, or allocate a state
      // for, every (sequence, head) it implies: work the caller asked for, not a finding.
      if (max_size > kMaxSize) too_large_ = true;
      return;
    }
    if (null_data) {
      v.data = nullptr;
      return mark_malformed(v, "a null data pointer");
    }
    if (numel > kMaxElements || bytes > kMaxSpanBytes || max_size > kMaxSize) {
      too_large_ = true;
      return;
    }
    auto* base = static_cast<unsigned char*>(buffers_.allocate(bytes));
    v.data = base - lo * static_cast<std::int64_t>(element_size(v.dtype));
    // Every element of the span (also those the view skips), then the logical pattern.
    for (std::int64_t e = lo; e <= hi; ++e) store(v, e, value(fill));
    if (fill == Fill::identity && v.rank >= 2) {
      std::array<std::int64_t, 4> index{};
      for (std::int64_t i = 0; i < numel; ++i) {
        std::int64_t rest = i, offset = 0;
        for (int d = v.rank - 1; d >= 0; --d) {
          const std::size_t u = static_cast<std::size_t>(d);
          index[u] = rest % v.sizes[u];
          rest /= v.sizes[u];
          offset += index[u] * v.strides[u];
        }
        const std::size_t r = static_cast<std::size_t>(v.rank);
        store(v, offset, index[r - 2] == index[r - 1] ? 1.0 : 0.0);
      }
    }
  }

  double value(Fill fill) {
    if (fill == Fill::output) return std::numeric_limits<double>::quiet_NaN();
    if (special_ && in_.next() % 8 == 0) {
      static constexpr double kSpecial[] = {std::numeric_limits<double>::quiet_NaN(),
                                            std::numeric_limits<double>::infinity(),
                                            -std::numeric_limits<double>::infinity(),
                                            1e30,
                                            -1e30,
                                            1e-40,
                                            -0.0,
                                            0.0,
                                            65504.0,
                                            3.0e38};
      return kSpecial[in_.next() % (sizeof(kSpecial) / sizeof(kSpecial[0]))];
    }
    const double u = in_.uniform();
    if (fill == Fill::gates) return -3.0 * u;
    if (fill == Fill::identity) return 0.0;
    return 4.0 * u - 2.0;
  }

 public:
  // Special values (NaN, ±inf, huge, subnormal) among the filled ones.
  void set_special(bool special) { special_ = special; }

 private:
  Decoder& in_;
  Device device_ = Device::cpu;
  Buffers buffers_;
  std::string malformed_;
  bool too_large_ = false, null_data_ = false, special_ = false;
};

// ---- the calls ----------------------------------------------------------------------------------

Impl any_impl(Decoder& in) {
  return static_cast<Impl>(in.byte() % 3);
}
RotaryLayout any_layout(Decoder& in) {
  return in.chance(1, 2) ? RotaryLayout::interleaved : RotaryLayout::half_split;
}
std::optional<double> any_scale(Decoder& in) {
  if (in.chance(1, 2)) return std::nullopt;
  return in.real(0.5);
}

// The batch of a call: B rows of T tokens, or N sequences packed along T (B = 1).
struct Batch {
  std::int64_t B, T, N;
  TensorView cu;
};
Batch any_batch(Decoder& in, Call& call) {
  Batch b{};
  b.T = in.dim();
  if (in.chance(1, 3)) {
    b.B = in.chance(7, 8) ? 1 : in.dim();
    b.N = in.dim();
    b.cu = call.cu_seqlens(b.N, b.T);
  } else {
    b.B = in.dim();
    b.N = b.B;
  }
  return b;
}

// The number of chunk states a call of GLA or Gated DeltaNet expects (phasor/common.h:
// num_chunk_states), in the fuzzer's own wrapping arithmetic since the sizes may be anything; a
// fuzzed dimension where the formula has none (T or chunk_size ≤ 0).
std::int64_t chunk_state_count(Decoder& in, const Batch& b, std::int64_t chunk_size) {
  if (b.T <= 0 || chunk_size <= 0) return in.dim();
  const std::int64_t C = std::min(chunk_size, b.T), per_sequence = b.T / C + (b.T % C != 0);
  return b.cu.defined() ? wrap_add(b.N, per_sequence) : wrap_mul(b.B, per_sequence);
}

// Each returns the function that makes the call (after the views are built). The optional views
// added after the committed corpus was written (the kept chunk states, Gated DeltaNet's v_new) are
// decoded last, so that its inputs decode as they did: an exhausted input reads 0, which leaves an
// optional view out.
using Run = std::function<void()>;

Run gla_call(Decoder& in, Call& c, bool backward) {
  const Batch b = any_batch(in, c);
  const std::int64_t H = in.dim(), K = in.even_dim(), V = in.dim(), R = K / 2;
  const Impl impl = any_impl(in);
  GlaParams p;
  p.q = c.view({b.B, b.T, H, K}, Fill::values);
  p.k = c.view({b.B, b.T, H, K}, Fill::values);
  p.v = c.view({b.B, b.T, H, V}, Fill::values);
  p.g = c.view({b.B, b.T, H, K}, Fill::gates);
  p.initial_state = c.view({b.N, H, K, V}, Fill::values, true);
  p.cu_seqlens = b.cu;
  p.scale = any_scale(in);
  p.chunk_size = in.count();
  p.theta = c.view({b.B, b.T, H, R}, Fill::values, true);
  p.rotary_layout = any_layout(in);
  if (!backward) {
    const TensorView o = c.output({b.B, b.T, H, V});
    const TensorView final_state = p.initial_state.defined() && in.chance(1, 4)
                                       ? Call::same(p.initial_state)
                                       : c.output({b.N, H, K, V}, true);
    const TensorView chunk_states =
        c.output({chunk_state_count(in, b, p.chunk_size), H, K, V}, true);
    return [=] { gla_forward(p, impl, o, final_state, chunk_states); };
  }
  const TensorView d_o = c.view({b.B, b.T, H, V}, Fill::values);
  const TensorView dht = c.view({b.N, H, K, V}, Fill::values, true);
  GlaGrads g;
  g.dq = c.output({b.B, b.T, H, K}, true);
  g.dk = c.output({b.B, b.T, H, K}, true);
  g.dv = c.output({b.B, b.T, H, V}, true);
  g.dg = c.output({b.B, b.T, H, K}, true);
  g.dh0 = c.output({b.N, H, K, V}, true);
  g.dtheta = c.output({b.B, b.T, H, R}, true);
  const TensorView chunk_states =
      c.view({chunk_state_count(in, b, p.chunk_size), H, K, V}, Fill::values, true);
  return [=] { gla_backward(p, impl, d_o, dht, g, chunk_states); };
}

Run gated_delta_rule_call(Decoder& in, Call& c, bool backward) {
  const Batch b = any_batch(in, c);
  const std::int64_t H = in.dim(), HV = wrap_mul(H, in.chance(3, 4) ? 1 : in.dim()),
                     K = in.even_dim(), V = in.dim(), R = K / 2;
  const Impl impl = any_impl(in);
  GatedDeltaRuleParams p;
  p.q = c.view({b.B, b.T, H, K}, Fill::values);
  p.k = c.view({b.B, b.T, H, K}, Fill::values);
  p.v = c.view({b.B, b.T, HV, V}, Fill::values);
  p.g = c.view({b.B, b.T, HV}, Fill::gates);
  p.beta = c.view({b.B, b.T, HV}, Fill::values);
  p.initial_state = c.view({b.N, HV, K, V}, Fill::values, true);
  p.cu_seqlens = b.cu;
  p.scale = any_scale(in);
  p.use_qk_l2norm_in_kernel = in.chance(1, 2);
  p.chunk_size = in.count();
  p.theta = c.view({b.B, b.T, H, R}, Fill::values, true);
  p.rotary_layout = any_layout(in);
  if (!backward) {
    const TensorView o = c.output({b.B, b.T, HV, V});
    const TensorView final_state = p.initial_state.defined() && in.chance(1, 4)
                                       ? Call::same(p.initial_state)
                                       : c.output({b.N, HV, K, V}, true);
    const TensorView chunk_states =
        c.output({chunk_state_count(in, b, p.chunk_size), HV, K, V}, true);
    const TensorView v_new = c.output({b.B, b.T, HV, V}, true);
    return [=] { gated_delta_rule_forward(p, impl, o, final_state, chunk_states, v_new); };
  }
  const TensorView d_o = c.view({b.B, b.T, HV, V}, Fill::values);
  const TensorView dht = c.view({b.N, HV, K, V}, Fill::values, true);
  GatedDeltaRuleGrads g;
  g.dq = c.output({b.B, b.T, H, K}, true);
  g.dk = c.output({b.B, b.T, H, K}, true);
  g.dv = c.output({b.B, b.T, HV, V}, true);
  g.dg = c.output({b.B, b.T, HV}, true);
  g.dbeta = c.output({b.B, b.T, HV}, true);
  g.dh0 = c.output({b.N, HV, K, V}, true);
  g.dtheta = c.output({b.B, b.T, H, R}, true);
  const TensorView chunk_states =
      c.view({chunk_state_count(in, b, p.chunk_size), HV, K, V}, Fill::values, true);
  const TensorView v_new = c.view({b.B, b.T, HV, V}, Fill::values, true);
  return [=] { gated_delta_rule_backward(p, impl, d_o, dht, g, chunk_states, v_new); };
}

Run forgetting_attn_call(Decoder& in, Call& c, bool backward) {
  const Batch b = any_batch(in, c);
  const std::int64_t H = in.dim(), HQ = wrap_mul(H, in.chance(3, 4) ? 1 : in.dim()),
                     K = in.even_dim(), V = in.dim(), R = K / 2;
  const Impl impl = any_impl(in);
  ForgettingAttnParams p;
  p.q = c.view({b.B, b.T, HQ, K}, Fill::values);
  p.k = c.view({b.B, b.T, H, K}, Fill::values);
  p.v = c.view({b.B, b.T, H, V}, Fill::values);
  p.g = c.view({b.B, b.T, HQ}, Fill::gates);
  p.cu_seqlens = b.cu;
  p.scale = any_scale(in);
  if (in.chance(1, 3)) p.window_size = in.count();
  p.block_size = in.count();
  p.theta = c.view({b.B, b.T, H, R}, Fill::values, true);
  p.rotary_layout = any_layout(in);
  p.bias_q_slope = c.view({b.B, b.T, HQ}, Fill::values, true);
  p.bias_k_slope = c.view({b.B, b.T, H}, Fill::values, true);
  if (!backward) {
    const TensorView o = c.output({b.B, b.T, HQ, V});
    const TensorView lse = c.output({b.B, b.T, HQ}, true);
    return [=] { forgetting_attn_forward(p, impl, o, lse); };
  }
  const TensorView d_o = c.view({b.B, b.T, HQ, V}, Fill::values);
  const TensorView o = c.view({b.B, b.T, HQ, V}, Fill::values, true);
  const TensorView lse = c.view({b.B, b.T, HQ}, Fill::values, true);
  ForgettingAttnGrads g;
  g.dq = c.output({b.B, b.T, HQ, K}, true);
  g.dk = c.output({b.B, b.T, H, K}, true);
  g.dv = c.output({b.B, b.T, H, V}, true);
  g.dg = c.output({b.B, b.T, HQ}, true);
  g.dtheta = c.output({b.B, b.T, H, R}, true);
  g.dbias_q_slope = c.output({b.B, b.T, HQ}, true);
  g.dbias_k_slope = c.output({b.B, b.T, H}, true);
  return [=] { forgetting_attn_backward(p, impl, d_o, o, lse, g); };
}

// The decoding cache: construction with fuzzed sizes, then up to three steps.
Run forgetting_attn_cache_call(Decoder& in, Call& c) {
  const std::int64_t B = in.dim(), H = in.dim(), HQ = wrap_mul(H, in.chance(3, 4) ? 1 : in.dim()),
                     K = in.even_dim(), V = in.dim();
  std::optional<std::int64_t> window;
  if (in.chance(1, 3)) window = in.count();
  struct Step {
    TensorView q, k, v, g, o, theta, slope_q, slope_k;
    std::optional<double> scale;
    RotaryLayout layout;
  };
  // The steps run in order, so the call's rule applies step by step: the sequence ends before a
  // step with a view too large to back (it cannot run), and with a step with a malformed view
  // (which must fail).
  std::vector<Step> steps;
  const int count = 1 + in.byte() % 3;
  for (int i = 0; i < count; ++i) {
    const Call::Flags before = c.flags();
    Step s;
    s.q = c.view({B, 1, HQ, K}, Fill::values);
    s.k = c.view({B, 1, H, K}, Fill::values);
    s.v = c.view({B, 1, H, V}, Fill::values);
    s.g = c.view({B, 1, HQ}, Fill::gates);
    s.o = c.output({B, 1, HQ, V});
    s.theta = c.view({B, 1, H, K / 2}, Fill::values, true);
    s.slope_q = c.view({B, 1, HQ}, Fill::values, true);
    s.slope_k = c.view({B, 1, H}, Fill::values, true);
    s.scale = any_scale(in);
    s.layout = any_layout(in);
    if (c.too_large() && !c.malformed()) {
      c.set_flags(before);
      break;
    }
    steps.push_back(s);
    if (c.malformed()) break;
  }
  return [=] {
    ForgettingAttnCache cache(B, HQ, H, K, V, window);
    for (const Step& s : steps)
      cache.step(s.q, s.k, s.v, s.g, s.o, s.scale, s.theta, s.layout, s.slope_q, s.slope_k);
  };
}

Run short_conv_call(Decoder& in, Call& c, bool backward) {
  const Batch b = any_batch(in, c);
  const std::int64_t D = in.dim(), W = in.dim(), W1 = wrap_add(W, -1);
  const Impl impl = any_impl(in);
  static const char* const kActivations[] = {"none", "silu", "swish", "identity", "", "relu"};
  ShortConvParams p;
  p.x = c.view({b.B, b.T, D}, Fill::values);
  p.weight = c.view({D, W}, Fill::values);
  p.bias = c.view({D}, Fill::values, true);
  p.initial_cache = c.view({b.N, D, W1}, Fill::values, true);
  p.cu_seqlens = b.cu;
  p.activation = kActivations[in.byte() % 6];
  if (!backward) {
    const TensorView y = c.output({b.B, b.T, D});
    const TensorView final_cache = c.output({b.N, D, W1}, true);
    return [=] { short_conv_forward(p, impl, y, final_cache); };
  }
  const TensorView dy = c.view({b.B, b.T, D}, Fill::values);
  const TensorView d_final_cache = c.view({b.N, D, W1}, Fill::values, true);
  ShortConvGrads g;
  g.dx = c.output({b.B, b.T, D}, true);
  g.dweight = c.output({D, W}, true);
  g.dbias = c.output({D}, true);
  g.dinitial_cache = c.output({b.N, D, W1}, true);
  return [=] { short_conv_backward(p, impl, dy, d_final_cache, g); };
}

Run selective_rope_phases_call(Decoder& in, Call& c, bool backward) {
  const Batch b = any_batch(in, c);
  const std::int64_t H = in.dim(), R = in.dim();
  const Impl impl = any_impl(in);
  const bool per_head = in.chance(1, 2);
  RotaryPhaseParams p;
  p.phi = c.view({b.B, b.T, H, R}, Fill::values);
  p.omega = per_head ? c.view({H, R}, Fill::values) : c.view({R}, Fill::values);
  p.initial_phase = c.view({b.N, H, R}, Fill::values, true);
  p.cu_seqlens = b.cu;
  if (!backward) {
    const TensorView theta = c.output({b.B, b.T, H, R});
    const TensorView final_phase = c.output({b.N, H, R}, true);
    return [=] { selective_rope_phases_forward(p, impl, theta, final_phase); };
  }
  const TensorView d_theta = c.view({b.B, b.T, H, R}, Fill::values);
  const TensorView d_final_phase = c.view({b.N, H, R}, Fill::values, true);
  RotaryPhaseGrads g;
  g.d_phi = c.output({b.B, b.T, H, R}, true);
  g.d_omega = per_head ? c.output({H, R}, true) : c.output({R}, true);
  g.d_initial_phase = c.output({b.N, H, R}, true);
  return [=] { selective_rope_phases_backward(p, impl, d_theta, d_final_phase, g); };
}

Run rope_angles_call(Decoder& in, Call& c) {
  const Batch b = any_batch(in, c);
  RopeAnglesParams p;
  p.B = b.B;
  p.T = b.T;
  p.head_dim = in.even_dim();
  p.base = in.real(10000.0);
  p.offset = in.chance(3, 4) ? in.dim() : in.edge();
  p.cu_seqlens = b.cu;
  const Impl impl = any_impl(in);
  const TensorView theta = c.output({b.B, b.T, p.head_dim / 2});
  return [=] { rope_angles(p, impl, theta); };
}

Run apply_rotary_call(Decoder& in, Call& c, bool backward) {
  const std::int64_t B = in.dim(), T = in.dim(), H = in.dim(), K = in.even_dim(), R = K / 2;
  const Impl impl = any_impl(in);
  const RotaryLayout layout = any_layout(in);
  const TensorView x = c.view({B, T, H, K}, Fill::values);
  const TensorView theta = c.view({B, T, H, R}, Fill::values);
  if (!backward) {
    const TensorView y = c.output({B, T, H, K});
    return [=] { apply_rotary_forward(x, theta, layout, impl, y); };
  }
  const TensorView dy = c.view({B, T, H, K}, Fill::values);
  const TensorView dx = c.output({B, T, H, K}, true);
  const TensorView d_theta = c.output({B, T, H, R}, true);
  return [=] { apply_rotary_backward(x, theta, layout, impl, dy, dx, d_theta); };
}

Run favor_call(Decoder& in, Call& c, int which, bool backward) {
  const bool per_head = in.chance(1, 2);
  if (which == 0) {  // the random feature matrix
    const std::int64_t H = in.dim(), m = in.dim(), d = in.dim();
    const auto kind = static_cast<FavorMatrixKind>(in.byte() % 3);
    const std::uint64_t seed = in.byte();
    const TensorView out = per_head ? c.output({H, m, d}) : c.output({m, d});
    return [=] { favor_random_matrix(kind, seed, out); };
  }
  const Batch b = any_batch(in, c);
  const std::int64_t H = in.dim(), d = in.dim(), m = in.dim(), V = in.dim();
  const Impl impl = any_impl(in);
  // (Every view built must be passed to the call: a malformed one must make it fail.)
  const TensorView w = per_head ? c.view({H, m, d}, Fill::values) : c.view({m, d}, Fill::values);
  if (which == 1) {  // the features
    FavorFeatureParams p;
    p.x = c.view({b.B, b.T, H, d}, Fill::values);
    p.w = w;
    p.stabilizer = static_cast<FavorStabilizer>(in.byte() % 3);
    p.cu_seqlens = b.cu;
    if (!backward) {
      const TensorView phi = c.output({b.B, b.T, H, m});
      return [=] { favor_features_forward(p, impl, phi); };
    }
    const TensorView d_phi = c.view({b.B, b.T, H, m}, Fill::values);
    const TensorView dx = c.output({b.B, b.T, H, d}, true);
    const TensorView dw = per_head ? c.output({H, m, d}, true) : c.output({m, d}, true);
    return [=] { favor_features_backward(p, impl, d_phi, dx, dw); };
  }
  FavorAttentionParams p;  // the attention
  p.q = c.view({b.B, b.T, H, d}, Fill::values);
  p.k = c.view({b.B, b.T, H, d}, Fill::values);
  p.v = c.view({b.B, b.T, H, V}, Fill::values);
  p.w = w;
  p.cu_seqlens = b.cu;
  p.causal = in.chance(1, 2);
  p.scale = any_scale(in);
  p.chunk_size = in.count();
  if (!backward) {
    const TensorView o = c.output({b.B, b.T, H, V});
    return [=] { favor_attention_forward(p, impl, o); };
  }
  const TensorView d_o = c.view({b.B, b.T, H, V}, Fill::values);
  FavorAttentionGrads g;
  g.dq = c.output({b.B, b.T, H, d}, true);
  g.dk = c.output({b.B, b.T, H, d}, true);
  g.dv = c.output({b.B, b.T, H, V}, true);
  g.dw = per_head ? c.output({H, m, d}, true) : c.output({m, d}, true);
  return [=] { favor_attention_backward(p, impl, d_o, g); };
}

Run grape_call(Decoder& in, Call& c, bool backward) {
  const std::int64_t B = in.dim(), T = in.dim(), H = in.dim(), K = in.dim();
  const Impl impl = any_impl(in);
  const bool ab_per_head = in.chance(1, 2), positions_per_head = in.chance(1, 2);
  GrapeParams p;
  p.z = c.view({B, T, H, K}, Fill::values);
  p.a = ab_per_head ? c.view({H, K}, Fill::values) : c.view({K}, Fill::values);
  p.b = ab_per_head ? c.view({H, K}, Fill::values) : c.view({K}, Fill::values);
  p.omega = c.view({H}, Fill::values);
  p.positions = positions_per_head ? c.view({B, T, H}, Fill::values) : c.view({B, T}, Fill::values);
  if (!backward) {
    const TensorView y = c.output({B, T, H, K});
    return [=] { grape_forward(p, impl, y); };
  }
  const TensorView dy = c.view({B, T, H, K}, Fill::values);
  GrapeGrads g;
  g.dz = c.output({B, T, H, K}, true);
  g.da = ab_per_head ? c.output({H, K}, true) : c.output({K}, true);
  g.db = ab_per_head ? c.output({H, K}, true) : c.output({K}, true);
  g.d_omega = c.output({H}, true);
  g.d_positions = positions_per_head ? c.output({B, T, H}, true) : c.output({B, T}, true);
  return [=] { grape_backward(p, impl, dy, g); };
}

Run grape_subspace_call(Decoder& in, Call& c, bool backward) {
  const std::int64_t B = in.dim(), T = in.dim(), H = in.dim(), K = in.even_dim(), R = K / 2;
  const Impl impl = any_impl(in);
  const bool per_head = in.chance(1, 2);
  GrapeSubspaceParams p;
  p.z = c.view({B, T, H, K}, Fill::values);
  const Fill basis_fill = in.chance(3, 4) ? Fill::identity : Fill::values;
  p.basis = per_head ? c.view({H, K, K}, basis_fill) : c.view({K, K}, basis_fill);
  p.theta = c.view({B, T, H, R}, Fill::values);
  p.layout = any_layout(in);
  p.orthogonality_tol = in.real(1e-4);
  if (!backward) {
    const TensorView y = c.output({B, T, H, K});
    return [=] { grape_subspace_forward(p, impl, y); };
  }
  const TensorView dy = c.view({B, T, H, K}, Fill::values);
  GrapeSubspaceGrads g;
  g.dz = c.output({B, T, H, K}, true);
  g.d_basis = per_head ? c.output({H, K, K}, true) : c.output({K, K}, true);
  g.d_theta = c.output({B, T, H, R}, true);
  return [=] { grape_subspace_backward(p, impl, dy, g); };
}

Run nd_rope_call(Decoder& in, Call& c, bool backward) {
  const std::int64_t B = in.dim(), T = in.dim(), C = in.dim(), R = in.dim(), H = in.dim();
  const Impl impl = any_impl(in);
  const bool per_head = in.chance(1, 2);
  const TensorView positions = c.view({B, T, C}, Fill::values);
  const TensorView omega =
      per_head ? c.view({H, C, R}, Fill::values) : c.view({C, R}, Fill::values);
  if (!backward) {
    const TensorView theta = per_head ? c.output({B, T, H, R}) : c.output({B, T, R});
    return [=] { nd_rope_angles_forward(positions, omega, impl, theta); };
  }
  const TensorView d_theta =
      per_head ? c.view({B, T, H, R}, Fill::values) : c.view({B, T, R}, Fill::values);
  const TensorView d_positions = c.output({B, T, C}, true);
  const TensorView d_omega = per_head ? c.output({H, C, R}, true) : c.output({C, R}, true);
  return [=] { nd_rope_angles_backward(positions, omega, impl, d_theta, d_positions, d_omega); };
}

Run axis_split_call(Decoder& in, Call& c) {
  const std::int64_t C = in.chance(3, 4) ? in.dim() : in.edge(), K = in.even_dim();
  const double base = in.real(100.0);
  const TensorView omega = c.output({C, K / 2});
  return [=] { nd_rope_axis_split_frequencies(C, K, base, omega); };
}

Run string_call(Decoder& in, Call& c, bool cayley, bool backward) {
  const std::int64_t B = in.dim(), T = in.dim(), H = in.dim(),
                     K = cayley ? in.even_dim() : in.dim(), C = in.dim(), R = K / 2;
  const Impl impl = any_impl(in);
  const bool per_head = in.chance(1, 2);
  const TensorView z = c.view({B, T, H, K}, Fill::values);
  const TensorView positions = c.view({B, T, C}, Fill::values);
  const TensorView dy = backward ? c.view({B, T, H, K}, Fill::values) : TensorView{};
  const TensorView dz = backward ? c.output({B, T, H, K}, true) : TensorView{};
  const TensorView d_positions = backward ? c.output({B, T, C}, true) : TensorView{};
  const TensorView y = backward ? TensorView{} : c.output({B, T, H, K});
  if (cayley) {
    CayleyStringParams p;
    p.z = z;
    p.positions = positions;
    p.omega = per_head ? c.view({H, C, R}, Fill::values) : c.view({C, R}, Fill::values);
    p.generator = per_head ? c.view({H, K, K}, Fill::values) : c.view({K, K}, Fill::values);
    p.layout = any_layout(in);
    if (!backward) return [=] { cayley_string_forward(p, impl, y); };
    CayleyStringGrads g;
    g.dz = dz;
    g.d_positions = d_positions;
    g.d_omega = per_head ? c.output({H, C, R}, true) : c.output({C, R}, true);
    g.d_generator = per_head ? c.output({H, K, K}, true) : c.output({K, K}, true);
    return [=] { cayley_string_backward(p, impl, dy, g); };
  }
  CirculantStringParams p;
  p.z = z;
  p.positions = positions;
  p.c = per_head ? c.view({H, C, K}, Fill::values) : c.view({C, K}, Fill::values);
  if (!backward) return [=] { circulant_string_forward(p, impl, y); };
  CirculantStringGrads g;
  g.dz = dz;
  g.d_positions = d_positions;
  g.dc = per_head ? c.output({H, C, K}, true) : c.output({C, K}, true);
  return [=] { circulant_string_backward(p, impl, dy, g); };
}

Run structured_call(Decoder& in, Call& c, int which, bool backward) {
  if (which == 0) {  // the decomposition of generators
    const std::int64_t C = in.dim(), K = in.dim();
    StructuredDecompositionParams p;
    p.generators = c.view({C, K, K}, Fill::values);
    p.tolerance = in.real(1e-8);
    p.seed = in.byte();
    StructuredDecompositionOutputs o;
    o.basis = c.output({K, K});
    o.coefficients = c.output({C, K / 2});
    o.active_projector = c.output({K, K}, true);
    o.null_projector = c.output({K, K}, true);
    return [=] { structured_decomposition(p, o); };
  }
  if (which == 1) {  // the rotation
    const std::int64_t B = in.dim(), T = in.dim(), H = in.dim(), K = in.even_dim(), C = in.dim(),
                       m = in.chance(3, 4) ? K / 2 : in.dim(), M2 = wrap_mul(2, m);
    const Impl impl = any_impl(in);
    StructuredRotationParams p;
    p.x = c.view({B, T, H, K}, Fill::values);
    p.positions = c.view({B, T, H, C}, Fill::values);
    p.basis = c.view({K, M2}, in.chance(3, 4) ? Fill::identity : Fill::values);
    p.coefficients = c.view({C, m}, Fill::values);
    p.post_rotation = c.view({K, K}, Fill::values, true);
    if (!backward) {
      const TensorView y = c.output({B, T, H, K});
      return [=] { structured_rotation_forward(p, impl, y); };
    }
    const TensorView dy = c.view({B, T, H, K}, Fill::values);
    StructuredRotationGrads g;
    g.dx = c.output({B, T, H, K}, true);
    g.d_positions = c.output({B, T, H, C}, true);
    g.d_coefficients = c.output({C, m}, true);
    g.d_post_rotation = c.output({K, K}, true);
    return [=] { structured_rotation_backward(p, impl, dy, g); };
  }
  // The Cayley map of a skew block, embedded by an optional null basis.
  const std::int64_t n = in.dim(), K = in.chance(1, 2) ? n : wrap_add(n, in.dim());
  const TensorView s = c.view({n, n}, Fill::values);
  const TensorView null_basis =
      c.view({K, n}, in.chance(3, 4) ? Fill::identity : Fill::values, /*optional=*/true);
  const std::int64_t P = null_basis.defined() ? K : n;
  if (!backward) {
    const TensorView out = c.output({P, P});
    return [=] { structured_cayley_forward(s, null_basis, out); };
  }
  const TensorView dp = c.view({P, P}, Fill::values);
  const TensorView ds = c.output({n, n});
  return [=] { structured_cayley_backward(s, null_basis, dp, ds); };
}

// A phasor::Error must say which argument and what was expected.
void check_message(const std::string& what) {
  if (what.find("argument '") == std::string::npos || what.find("expected") == std::string::npos)
    finding("a phasor::Error without \"argument '<name>'\" and \"expected\": " + what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Decoder in(data, size);
  const std::uint8_t op = in.byte();
  const bool backward = in.chance(1, 2);
  set_num_threads(in.chance(1, 4) ? 2 : 1);
  Call call(in);
  call.set_special(in.chance(1, 8));
  Run run;
  switch (op % 19) {
    case 0:
      run = gla_call(in, call, backward);
      break;
    case 1:
      run = gated_delta_rule_call(in, call, backward);
      break;
    case 2:
      run = forgetting_attn_call(in, call, backward);
      break;
    case 3:
      run = forgetting_attn_cache_call(in, call);
      break;
    case 4:
      run = short_conv_call(in, call, backward);
      break;
    case 5:
      run = selective_rope_phases_call(in, call, backward);
      break;
    case 6:
      run = rope_angles_call(in, call);
      break;
    case 7:
      run = apply_rotary_call(in, call, backward);
      break;
    case 8:
    case 9:
    case 10:
      run = favor_call(in, call, op % 19 - 8, backward);
      break;
    case 11:
      run = grape_call(in, call, backward);
      break;
    case 12:
      run = grape_subspace_call(in, call, backward);
      break;
    case 13:
      run = nd_rope_call(in, call, backward);
      break;
    case 14:
      run = axis_split_call(in, call);
      break;
    case 15:
    case 16:
      run = string_call(in, call, op % 19 == 15, backward);
      break;
    default:
      run = structured_call(in, call, op % 19 - 17 + (in.chance(1, 2) ? 1 : 0), backward);
      break;
  }
  // Well-formed views too large to back with memory: the call would be the caller's bug. (Also
  // beside a malformed view: some checks read a well-formed view's values, e.g. GRAPE's basis
  // orthogonality, before the other views' metadata.)
  if (call.too_large()) return 0;
  try {
    run();
  } catch (const Error& e) {
    check_message(e.what());
    return 0;
  } catch (const std::exception& e) {
    finding(std::string("an exception other than phasor::Error: ") + e.what());
  }
  if (call.malformed()) finding("a malformed view accepted: " + call.why_malformed());
  return 0;
}
