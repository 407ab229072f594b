#include "common/check.h"

#include <cmath>
#include <sstream>

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

void check_defined_cpu_float(const std::string& op, const std::string& name, const TensorView& x) {
  if (!x.defined()) fail(op, name, "a tensor", "none");
  if (x.device != Device::cpu)
    fail(op, name, "a tensor on the cpu (this build has no CUDA backend for it)",
         std::string("a tensor on ") + to_string(x.device));
  if (x.dtype != DType::float32 && x.dtype != DType::float64)
    fail(op, name, "dtype float32 or float64", std::string("dtype ") + to_string(x.dtype));
  if (x.numel() > 0 && x.data == nullptr) fail(op, name, "a non-null data pointer", "nullptr");
}

}  // namespace

void check_float_rank(const std::string& op, const std::string& name, const TensorView& x, int rank,
                      const char* layout) {
  check_defined_cpu_float(op, name, x);
  if (x.rank != rank)
    fail(op, name, std::to_string(rank) + "-D tensor " + layout,
         std::to_string(x.rank) + "-D tensor of shape " + x.shape_string());
}

void check_float_tensor(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims) {
  check_defined_cpu_float(op, name, x);
  bool ok = x.rank == static_cast<int>(dims.size());
  int d = 0;
  for (const Dim& dim : dims) {
    if (ok && x.size(d) != dim.value) ok = false;
    ++d;
  }
  if (!ok) fail(op, name, "shape " + dims_string(dims), "shape " + x.shape_string());
}

std::vector<Sequence> sequences(const std::string& op, const TensorView& cu, std::int64_t B,
                                std::int64_t T) {
  std::vector<Sequence> out;
  if (!cu.defined()) {
    for (std::int64_t b = 0; b < B; ++b) out.push_back({b, 0, T});
    return out;
  }
  if (cu.device != Device::cpu)
    fail(op, "cu_seqlens", "a tensor on the cpu",
         std::string("a tensor on ") + to_string(cu.device));
  if (cu.dtype != DType::int32 && cu.dtype != DType::int64)
    fail(op, "cu_seqlens", "dtype int32 or int64", std::string("dtype ") + to_string(cu.dtype));
  if (cu.rank != 1 || cu.size(0) < 2)
    fail(op, "cu_seqlens", "a 1-D tensor [N + 1] with N >= 1", "shape " + cu.shape_string());
  if (B != 1)
    fail(op, "cu_seqlens",
         "batch size B = 1 when cu_seqlens is given (sequences are packed along T)",
         "B = " + std::to_string(B));
  const std::int64_t n = cu.size(0);
  auto at = [&](std::int64_t i) -> std::int64_t {
    const std::int64_t off = i * cu.stride(0);
    return cu.dtype == DType::int32 ? static_cast<const std::int32_t*>(cu.data)[off]
                                    : static_cast<const std::int64_t*>(cu.data)[off];
  };
  if (at(0) != 0)
    fail(op, "cu_seqlens", "cu_seqlens[0] = 0", "cu_seqlens[0] = " + std::to_string(at(0)));
  for (std::int64_t i = 1; i < n; ++i) {
    const std::int64_t a = at(i - 1), b = at(i);
    if (b < a)
      fail(op, "cu_seqlens", "non-decreasing offsets",
           "cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(b) + " < cu_seqlens[" +
               std::to_string(i - 1) + "] = " + std::to_string(a));
    out.push_back({0, a, b - a});
  }
  if (at(n - 1) != T)
    fail(op, "cu_seqlens", "last offset equal to T = " + std::to_string(T),
         "cu_seqlens[" + std::to_string(n - 1) + "] = " + std::to_string(at(n - 1)));
  return out;
}

double resolve_scale(const std::string& op, std::optional<double> scale, std::int64_t K) {
  if (!scale) return K > 0 ? 1.0 / std::sqrt(static_cast<double>(K)) : 1.0;
  if (!std::isfinite(*scale)) fail(op, "scale", "a finite number", std::to_string(*scale));
  return *scale;
}

void check_positive(const std::string& op, const std::string& name, std::int64_t value) {
  if (value <= 0) fail(op, name, "a positive integer", std::to_string(value));
}

}  // namespace phasor::detail

namespace phasor::detail {

namespace {
// Calls f(offset, index) for every element of a rank ≤ 4 view, innermost dimension fastest,
// stopping when f returns false. Plain nested loops: no per-element index arithmetic.
template <class F>
void for_each_offset(const TensorView& x, F&& f) {
  std::array<std::int64_t, TensorView::kMaxRank> size{1, 1, 1, 1}, stride{0, 0, 0, 0};
  const int pad = TensorView::kMaxRank - x.rank;
  for (int d = 0; d < x.rank; ++d) {
    size[static_cast<std::size_t>(d + pad)] = x.size(d);
    stride[static_cast<std::size_t>(d + pad)] = x.stride(d);
  }
  for (std::int64_t a = 0; a < size[0]; ++a)
    for (std::int64_t b = 0; b < size[1]; ++b)
      for (std::int64_t c = 0; c < size[2]; ++c) {
        const std::int64_t base = a * stride[0] + b * stride[1] + c * stride[2];
        for (std::int64_t e = 0; e < size[3]; ++e)
          if (!f(base + e * stride[3], std::array<std::int64_t, 4>{a, b, c, e})) return;
      }
}
}  // namespace

void check_log_gates(const std::string& op, const std::string& name, const TensorView& g) {
  bool ok = true;
  double bad_value = 0;
  std::array<std::int64_t, 4> bad_index{};
  auto visit = [&](auto* p) {
    for_each_offset(g, [&](std::int64_t off, const std::array<std::int64_t, 4>& idx) {
      if (p[off] <= 0) return true;  // also false for NaN
      ok = false;
      bad_value = static_cast<double>(p[off]);
      bad_index = idx;
      return false;
    });
  };
  if (g.dtype == DType::float32)
    visit(static_cast<const float*>(g.data));
  else
    visit(static_cast<const double*>(g.data));
  if (ok) return;
  std::ostringstream where;
  where << name << '[';
  const int pad = TensorView::kMaxRank - g.rank;
  for (int d = 0; d < g.rank; ++d)
    where << (d ? ", " : "") << bad_index[static_cast<std::size_t>(d + pad)];
  where << "] = " << bad_value;
  fail(op, name, "natural-log forget gates <= 0 (-inf allowed)", where.str());
}

void check_owned_output(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims) {
  check_output(op, name, x, dims);
  if (x.numel() == 0) return;  // nothing to overlap (contiguous empty views have zero strides)
  for (int d = 0; d < x.rank; ++d)
    if (x.size(d) > 1 && x.stride(d) == 0)
      fail(op, name, "an output view without zero (broadcast) strides",
           "stride 0 in dimension " + std::to_string(d) + " of " + x.shape_string());
}

}  // namespace phasor::detail
