#include "common/check.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>
#include <type_traits>
#include <vector>

#include "common/element_access.h"
#include "common/parallel.h"
#include "common/view_extent.h"
#include "phasor/device.h"

namespace phasor::detail {

void fail(const std::string& op, const std::string& arg, const std::string& expected,
          const std::string& got) {
  throw Error(op + ": argument '" + arg + "': expected " + expected + ", got " + got);
}

namespace {

std::string dims_string(std::initializer_list<Dim> dims) {
  std::ostringstream s;
  s << '[';
  bool first = true;
  for (const Dim& d : dims) {
    s << (first ? "" : ", ") << d.label << '=' << d.value;
    first = false;
  }
  s << ']';
  return s.str();
}

std::string strides_string(const TensorView& x) {
  std::string s = "[";
  for (int d = 0; d < x.rank; ++d) s += (d ? ", " : "") + std::to_string(x.stride(d));
  return s + "]";
}

void check_defined_float(const std::string& op, const std::string& name, const TensorView& x,
                         Device device) {
  if (!x.defined()) fail(op, name, "a tensor", "none");
  check_view(op, name, x);
  if (x.device != device)
    fail(op, name, std::string("a tensor on ") + to_string(device) + " (the device of the call)",
         std::string("a tensor on ") + to_string(x.device));
  if (!is_floating(x.dtype))
    fail(op, name, "dtype float32, float64, bfloat16 or float16",
         std::string("dtype ") + to_string(x.dtype));
  if (x.numel() > 0 && x.data == nullptr) fail(op, name, "a non-null data pointer", "nullptr");
}

}  // namespace

void check_view(const std::string& op, const std::string& name, const TensorView& x) {
  if (!x.defined()) return;
  if (x.rank > TensorView::kMaxRank)
    fail(op, name, "a tensor of rank <= 4", "rank " + std::to_string(x.rank));
  bool empty = false;
  for (int d = 0; d < x.rank; ++d) {
    if (x.size(d) < 0) fail(op, name, "non-negative sizes", "shape " + x.shape_string());
    empty = empty || x.size(d) == 0;
  }
  // The product of the sizes, zeros counted as ones, at most 2^62: then every product of some of
  // its sizes (B·H, N·H, …, which the kernels form also for an empty view) fits in int64, with
  // room for the kernels' rounding up to whole chunks and blocks (T + C − 1 with C ≤ T).
  std::int64_t product = 1;
  for (int d = 0; d < x.rank; ++d)
    if (__builtin_mul_overflow(product, std::max<std::int64_t>(x.size(d), 1), &product) ||
        product > kMaxViewProduct)
      fail(
          op, name,
          empty ? "sizes whose product without the zeros is at most 2^62" : "at most 2^62 elements",
          "shape " + x.shape_string());
  // The offsets of the first and last index along each dimension, summed: the extremes of every
  // offset of the view. The byte offsets are those times the element size. An empty view has no
  // element, but the kernels still form offsets along its other dimensions (b·stride + h·stride
  // of a slice with no columns), so those must fit as well: a dimension of size 0 adds nothing.
  const auto element_bytes = static_cast<std::int64_t>(element_size(x.dtype));
  std::int64_t lo = 0, hi = 0, bytes;
  bool overflow = false;
  for (int d = 0; d < x.rank; ++d) {
    std::int64_t span;
    overflow =
        overflow ||
        __builtin_mul_overflow(std::max<std::int64_t>(x.size(d) - 1, 0), x.stride(d), &span) ||
        __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi);
  }
  // The bytes [lo·size, (hi + 1)·size): the end of the last element must be representable too
  // (byte_range in common/view_extent.h computes it).
  overflow = overflow || __builtin_mul_overflow(lo, element_bytes, &bytes) ||
             __builtin_add_overflow(hi, 1, &hi) ||
             __builtin_mul_overflow(hi, element_bytes, &bytes);
  if (overflow)
    fail(op, name, "sizes and strides whose element and byte offsets fit in int64",
         "shape " + x.shape_string() + " with strides " + strides_string(x));
}

Device call_device(const std::string& op, const std::string& name, const TensorView& x,
                   bool gpu_capable) {
  if (!x.defined()) fail(op, name, "a tensor", "none");
  if (!gpu_capable && x.device != Device::cpu)
    fail(op, name, "a tensor on the cpu (" + op + " has no CUDA kernel)",
         std::string("a tensor on ") + to_string(x.device));
  if (x.device == Device::cuda && (!cuda_is_built() || cuda_device_count() == 0))
    fail(op, name,
         "a tensor on a device this process can compute on (cuda needs the CUDA backend and a GPU)",
         std::string("a tensor on device cuda (") +
             (cuda_is_built() ? "no CUDA device is available"
                              : "this build of phasor has no CUDA backend") +
             ")");
  return x.device;
}

void check_float_rank(const std::string& op, const std::string& name, const TensorView& x, int rank,
                      const char* layout, Device device) {
  check_defined_float(op, name, x, device);
  if (x.rank != rank)
    fail(op, name, std::to_string(rank) + "-D tensor " + layout,
         std::to_string(x.rank) + "-D tensor of shape " + x.shape_string());
}

void check_float_tensor(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims, Device device) {
  check_defined_float(op, name, x, device);
  bool ok = x.rank == static_cast<int>(dims.size());
  int d = 0;
  for (const Dim& dim : dims) {
    if (ok && x.size(d) != dim.value) ok = false;
    ++d;
  }
  if (!ok) fail(op, name, "shape " + dims_string(dims), "shape " + x.shape_string());
}

void check_owned_output(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims, Device device) {
  check_output(op, name, x, dims, device);
  if (x.numel() == 0) return;  // nothing to overlap (contiguous empty views have zero strides)
  for (int d = 0; d < x.rank; ++d)
    if (x.size(d) > 1 && x.stride(d) == 0)
      fail(op, name, "an output view without zero (broadcast) strides",
           "stride 0 in dimension " + std::to_string(d) + " of " + x.shape_string());
}

void check_chunk_states(const std::string& op, const TensorView& x, Impl impl,
                        const Sequences& sequences, std::int64_t chunk_size, Dim heads,
                        std::int64_t K, std::int64_t V, Device device) {
  if (!x.defined()) return;
  if (impl != Impl::chunk)
    fail(op, "chunk_states", "no chunk states (only Impl::chunk keeps them)",
         std::string("chunk states with Impl::") + to_string(impl));
  check_owned_output(
      op, "chunk_states", x,
      {{sequences.chunk_slot_count(chunk_size), "num_chunk_states"}, heads, {K, "K"}, {V, "V"}},
      device);
}

void check_disjoint(const std::string& op, const std::string& name, const TensorView& x,
                    std::initializer_list<NamedView> others) {
  for (const NamedView& other : others)
    if (other.view.defined() && overlaps(x, other.view))
      fail(op, name, std::string("memory of its own (no overlap with '") + other.name + "')",
           std::string("a view overlapping '") + other.name + "'");
}

Sequences sequences(const std::string& op, const TensorView& cu, std::int64_t B, std::int64_t T,
                    Device device) {
  Sequences s;
  s.T = T;
  if (!cu.defined()) {
    s.count = B;
    return s;
  }
  if (cu.device != device)
    fail(op, "cu_seqlens",
         std::string("a tensor on ") + to_string(device) + " (the device of the call)",
         std::string("a tensor on ") + to_string(cu.device));
  check_view(op, "cu_seqlens", cu);
  if (cu.dtype != DType::int32 && cu.dtype != DType::int64)
    fail(op, "cu_seqlens", "dtype int32 or int64", std::string("dtype ") + to_string(cu.dtype));
  if (cu.rank != 1 || cu.size(0) < 2)
    fail(op, "cu_seqlens", "a 1-D tensor [N + 1] with N >= 1", "shape " + cu.shape_string());
  if (cu.data == nullptr) fail(op, "cu_seqlens", "a non-null data pointer", "nullptr");
  if (B != 1)
    fail(op, "cu_seqlens",
         "batch size B = 1 when cu_seqlens is given (sequences are packed along T)",
         "B = " + std::to_string(B));
  s.cu_seqlens = cu.data;
  s.cu_int32 = cu.dtype == DType::int32;
  s.cu_stride = cu.stride(0);
  s.count = cu.size(0) - 1;
  return s;
}

double resolve_scale(const std::string& op, std::optional<double> scale, std::int64_t K) {
  if (!scale) return K > 0 ? 1.0 / std::sqrt(static_cast<double>(K)) : 1.0;
  if (!std::isfinite(*scale)) fail(op, "scale", "a finite number", std::to_string(*scale));
  return *scale;
}

void check_positive(const std::string& op, const std::string& name, std::int64_t value) {
  if (value <= 0) fail(op, name, "a positive integer", std::to_string(value));
}

// ---- Values
// --------------------------------------------------------------------------------------

void ValueChecks::add(const char* name, const TensorView& view, ValueRule rule) {
  if (!view.defined()) return;
  if (count == kMaxItems) throw Error("ValueChecks: more than 4 checked tensors in one call");
  items[count++] = Item{name, view, rule};
}

namespace {

// The bit patterns of a storage type: the sign bit and +inf (exponent all ones, mantissa 0).
template <class T>
struct FloatBits;
template <>
struct FloatBits<float> {
  using Bits = std::uint32_t;
  static constexpr Bits sign = 0x80000000u, inf = 0x7F800000u;
};
template <>
struct FloatBits<double> {
  using Bits = std::uint64_t;
  static constexpr Bits sign = 0x8000000000000000ull, inf = 0x7FF0000000000000ull;
};
template <>
struct FloatBits<bfloat16> {
  using Bits = std::uint16_t;
  static constexpr Bits sign = 0x8000u, inf = 0x7F80u;
};
template <>
struct FloatBits<float16> {
  using Bits = std::uint16_t;
  static constexpr Bits sign = 0x8000u, inf = 0x7C00u;
};

// Whether every element of a row of n elements (stride `stride`) passes `rule`. A row with unit
// stride is checked on the values' bits, without early exit, so the loop vectorises (GCC does not
// vectorise IEEE comparisons here, and 16-bit values need no conversion); the caller looks for the
// failing element only if this says false. With sign = the sign bit and inf = the bits of +inf:
//   log_gate: x ≤ 0 and not NaN  ⟺  bits = 0 (+0), or sign set and bits − sign ≤ inf (−0 … −inf)
//   finite:   the exponent field is not all ones
template <class T>
bool row_ok(const T* row, std::int64_t n, std::int64_t stride, ValueRule rule) {
  if (stride == 1) {
    using Bits = typename FloatBits<T>::Bits;
    constexpr Bits sign = FloatBits<T>::sign, inf = FloatBits<T>::inf;
    static_assert(sizeof(Bits) == sizeof(T), "a storage type's bits");
    std::uint32_t bad = 0;
    for (std::int64_t e = 0; e < n; ++e) {
      Bits u;
      std::memcpy(&u, row + e, sizeof(T));
      if (rule == ValueRule::log_gate)
        bad |= std::uint32_t(u != 0) & std::uint32_t(Bits(u - sign) > inf);
      else
        bad |= std::uint32_t((u & inf) == inf);
    }
    return bad == 0;
  }
  for (std::int64_t e = 0; e < n; ++e)
    if (!value_ok(rule, to_double(row[e * stride]))) return false;
  return true;
}

// Row-major scan of a view of rank ≤ 4, finding the first element (in row-major order) that fails
// `rule`. T is the storage type. Rows are checked in parallel blocks (a large input is read at
// the memory's speed rather than one core's); the first failing row of all is the one reported.
template <class T>
bool scan(const TensorView& x, ValueRule rule, ValueVerdict& verdict, int item) {
  std::array<std::int64_t, 4> size{1, 1, 1, 1}, stride{0, 0, 0, 0};
  const int pad = TensorView::kMaxRank - x.rank;
  for (int d = 0; d < x.rank; ++d) {
    size[static_cast<std::size_t>(d + pad)] = x.size(d);
    stride[static_cast<std::size_t>(d + pad)] = x.stride(d);
  }
  const T* data = static_cast<const T*>(x.data);
  const std::int64_t rows = size[0] * size[1] * size[2], n = size[3];
  if (rows == 0 || n == 0) return true;
  auto row_at = [&](std::int64_t r) {
    const std::int64_t c = r % size[2], b = r / size[2] % size[1], a = r / (size[2] * size[1]);
    return data + a * stride[0] + b * stride[1] + c * stride[2];
  };
  constexpr std::int64_t kRowsPerBlock = 256;
  const std::int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<std::int64_t> first_bad(static_cast<std::size_t>(blocks), rows);
  // The work estimate counts elements: checking one (a load and a compare) costs about what a
  // multiply-add does, the unit parallel_for expects.
  parallel_for(blocks, kRowsPerBlock * n, [&](std::int64_t block) {
    const std::int64_t end = std::min(rows, (block + 1) * kRowsPerBlock);
    for (std::int64_t r = block * kRowsPerBlock; r < end; ++r)
      if (!row_ok(row_at(r), n, stride[3], rule)) {
        first_bad[static_cast<std::size_t>(block)] = r;
        return;
      }
  });
  for (const std::int64_t r : first_bad) {
    if (r == rows) continue;
    const T* row = row_at(r);
    for (std::int64_t e = 0; e < n; ++e) {
      const double v = to_double(row[e * stride[3]]);
      if (value_ok(rule, v)) continue;
      verdict.item = item;
      verdict.element = r * n + e;
      verdict.value = v;
      return false;
    }
  }
  return true;
}

}  // namespace

void check_values_on_host(const std::string& op, const ValueChecks& checks) {
  ValueVerdict verdict;
  const Sequences& s = checks.sequences;
  if (s.packed())
    for (std::int64_t i = 0; i <= s.count; ++i) {
      const OffsetFailure failure = offset_failure(s, i);
      if (failure == OffsetFailure::none) continue;
      verdict.offset = failure;
      verdict.offset_index = i;
      verdict.offset_value = s.offset(i);
      verdict.previous_offset = i > 0 ? s.offset(i - 1) : 0;
      raise_value_failure(op, checks, verdict);
    }
  for (int i = 0; i < checks.count; ++i) {
    const ValueChecks::Item& item = checks.items[i];
    const bool ok = visit_float_dtype(item.view.dtype, [&](auto tag) {
      return scan<decltype(tag)>(item.view, item.rule, verdict, i);
    });
    if (!ok) raise_value_failure(op, checks, verdict);
  }
}

void raise_value_failure(const std::string& op, const ValueChecks& checks,
                         const ValueVerdict& verdict) {
  const auto cu = [](std::int64_t i, std::int64_t v) {
    return "cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(v);
  };
  switch (verdict.offset) {
    case OffsetFailure::none:
      break;
    case OffsetFailure::first_not_zero:
      fail(op, "cu_seqlens", "cu_seqlens[0] = 0", cu(0, verdict.offset_value));
    case OffsetFailure::decreasing:
      fail(op, "cu_seqlens", "non-decreasing offsets",
           cu(verdict.offset_index, verdict.offset_value) + " < " +
               cu(verdict.offset_index - 1, verdict.previous_offset));
    case OffsetFailure::last_not_T:
      fail(op, "cu_seqlens", "last offset equal to T = " + std::to_string(checks.sequences.T),
           cu(verdict.offset_index, verdict.offset_value));
  }
  if (verdict.item < 0 || verdict.item >= checks.count)
    throw Error(op + ": raise_value_failure called without a failure");
  const ValueChecks::Item& item = checks.items[verdict.item];
  // The multi-index of the failing element, from its row-major linear index.
  std::array<std::int64_t, 4> index{};
  std::int64_t rest = verdict.element;
  for (int d = item.view.rank - 1; d >= 0; --d) {
    index[static_cast<std::size_t>(d)] = rest % item.view.size(d);
    rest /= item.view.size(d);
  }
  std::ostringstream where;
  where << item.name << '[';
  for (int d = 0; d < item.view.rank; ++d)
    where << (d ? ", " : "") << index[static_cast<std::size_t>(d)];
  where << "] = " << verdict.value;
  fail(op, item.name,
       item.rule == ValueRule::log_gate ? "natural-log forget gates <= 0 (-inf allowed)"
                                        : "finite values",
       where.str());
}

}  // namespace phasor::detail

namespace phasor {

std::int64_t num_chunk_states(const TensorView& q, const TensorView& cu_seqlens,
                              std::int64_t chunk_size) {
  const std::string op = "num_chunk_states";
  if (!q.defined()) detail::fail(op, "q", "a tensor [B, T, ...]", "none");
  detail::check_view(op, "q", q);
  if (q.rank < 2)
    detail::fail(op, "q", "a tensor [B, T, ...]",
                 std::to_string(q.rank) + "-D tensor of shape " + q.shape_string());
  detail::check_positive(op, "chunk_size", chunk_size);
  const std::int64_t T = q.size(1);
  const detail::Sequences s = detail::sequences(
      op, cu_seqlens, q.size(0), T, cu_seqlens.defined() ? cu_seqlens.device : q.device);
  return s.chunk_slot_count(std::max<std::int64_t>(1, std::min(chunk_size, T)));
}

}  // namespace phasor
