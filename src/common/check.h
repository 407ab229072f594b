// Internal: argument validation shared by all ops. Every message has the form
//   "<op>: argument '<name>': expected <what>, got <what was given>"
//
// Validation comes in two parts, so that every backend says the same thing about the same call:
//  - Metadata (shapes, dtypes, strides, devices): checked here, on the host, before any backend
//    runs, identically for every device — the views' fields are host data wherever the memory is.
//  - Values (log gates ≤ 0, finite slopes, cu_seqlens starting at 0, non-decreasing and ending at
//    T): they read the data, so each backend scans its own memory — the CPU here
//    (check_values_on_host), a GPU with a validation kernel (cuda/common/validate.cu) — and
//    reports the first failure as a ValueVerdict, which raise_value_failure turns into the same
//    message everywhere. The rule each element must satisfy (value_ok) and the one for each
//    cu_seqlens offset (offset_failure) are the same functions on both sides.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/sequences.h"
#include "phasor/common.h"

namespace phasor::detail {

[[noreturn]] void fail(const std::string& op, const std::string& arg, const std::string& expected,
                       const std::string& got);

// ---- Metadata
// ------------------------------------------------------------------------------------

// A dimension that must match: its value and a label such as "B" or "K (as q)".
struct Dim {
  std::int64_t value;
  const char* label;
};

// The device of a call: that of its main input `x` (q, x, phi, ...), which every other view must
// share. Ops with CUDA kernels (gpu_capable) accept cpu, cuda and emulated; the others the cpu
// only. Device::cuda also needs the CUDA backend in this build and a GPU (an error naming the
// device otherwise).
Device call_device(const std::string& op, const std::string& name, const TensorView& x,
                   bool gpu_capable);

// A defined view must describe memory before anything indexes it: rank ≤ 4, sizes ≥ 0, a product
// of the sizes (zeros counted as ones, so also of an empty view's other sizes) of at most
// kMaxViewProduct = 2^62, and element and byte offsets ((size − 1)·stride summed over the
// dimensions of size > 0, times the element size; also for an empty view, whose slices the kernels
// still address) that fit in int64 — so that no index or count the kernels and checks compute from
// one view's sizes overflows. Every check of a tensor argument below starts with it.
inline constexpr std::int64_t kMaxViewProduct = std::int64_t{1} << 62;
void check_view(const std::string& op, const std::string& name, const TensorView& x);

// `x` must be defined, on `device`, of a floating dtype (float32, float64, bfloat16, float16), and
// have exactly these dimensions.
void check_float_tensor(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims, Device device = Device::cpu);
// Same for an output view.
inline void check_output(const std::string& op, const std::string& name, const TensorView& x,
                         std::initializer_list<Dim> dims, Device device = Device::cpu) {
  check_float_tensor(op, name, x, dims, device);
}
// An output that must also own each of its elements: a zero stride over a dimension of size > 1
// would make several results land on the same memory (check_output alone allows broadcast views).
void check_owned_output(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims, Device device = Device::cpu);
// chunk_states (phasor/common.h; GLA's and Gated DeltaNet's chunk forward and backward): only
// Impl::chunk keeps chunk states; [num_chunk_states, heads, K, V] with the slots of `sequences` at
// chunk_size (the problem's, clamped), owning its elements. Undefined: nothing to check.
void check_chunk_states(const std::string& op, const TensorView& x, Impl impl,
                        const Sequences& sequences, std::int64_t chunk_size, Dim heads,
                        std::int64_t K, std::int64_t V, Device device);
// `x` must share no memory with any defined view of `others` (an output the kernels write while
// they read or write the others: a clash would give silently wrong results).
struct NamedView {
  const char* name;
  TensorView view;
};
void check_disjoint(const std::string& op, const std::string& name, const TensorView& x,
                    std::initializer_list<NamedView> others);
// `x` must be defined, on `device`, floating, of this rank.
void check_float_rank(const std::string& op, const std::string& name, const TensorView& x, int rank,
                      const char* layout, Device device = Device::cpu);

// cu_seqlens's metadata (1-D int32/int64 with N + 1 ≥ 2 entries, on `device`; B must be 1), and
// the sequences of the call: the B rows, or the N packed sequences. Its values are checked with
// the value checks (ValueChecks::sequences).
Sequences sequences(const std::string& op, const TensorView& cu_seqlens, std::int64_t B,
                    std::int64_t T, Device device = Device::cpu);

// The softmax/attention scale: the given one, or K^-1/2. Must be finite.
double resolve_scale(const std::string& op, std::optional<double> scale, std::int64_t K);

// chunk/block sizes must be positive.
void check_positive(const std::string& op, const std::string& name, std::int64_t value);

// ---- Values
// --------------------------------------------------------------------------------------

// The rule every element of a checked tensor must satisfy.
enum class ValueRule : std::uint8_t {
  log_gate,  // ≤ 0 (−inf allowed, NaN not): natural-log forget gates
  finite,    // neither ±inf nor NaN
};
PHASOR_HOST_DEVICE inline bool value_ok(ValueRule rule, double v) {
  if (rule == ValueRule::log_gate) return v <= 0;  // false for NaN
  return v - v == 0;                               // inf − inf and NaN − NaN are NaN
}

// How a cu_seqlens offset fails its rule, if it does.
enum class OffsetFailure : std::uint8_t { none, first_not_zero, decreasing, last_not_T };
// The rule for offset i of N + 1: cu[0] = 0, cu[i] ≥ cu[i − 1], cu[N] = T (a decrease at N is
// reported before a wrong last value).
PHASOR_HOST_DEVICE inline OffsetFailure offset_failure(const Sequences& s, std::int64_t i) {
  const std::int64_t value = s.offset(i);
  if (i == 0) return value == 0 ? OffsetFailure::none : OffsetFailure::first_not_zero;
  if (value < s.offset(i - 1)) return OffsetFailure::decreasing;
  if (i == s.count && value != s.T) return OffsetFailure::last_not_T;
  return OffsetFailure::none;
}

// The value checks of one call, as plain data (a kernel argument): the sequences' offsets (when
// packed), then each tensor with its rule, in this order. `name` is read on the host only.
struct ValueChecks {
  static constexpr int kMaxItems = 4;
  struct Item {
    const char* name;
    TensorView view;
    ValueRule rule;
  };
  Sequences sequences;
  Item items[kMaxItems] = {};
  int count = 0;

  // Adds a check of `view` (skipped when the view is undefined: an absent optional argument).
  void add(const char* name, const TensorView& view, ValueRule rule);
};

// The first failure of a call's value checks: the first failing offset if any, else the first
// failing element (in row-major order) of the first failing item.
struct ValueVerdict {
  OffsetFailure offset = OffsetFailure::none;
  std::int64_t offset_index = 0, offset_value = 0, previous_offset = 0;
  int item = -1;             // index into ValueChecks::items, -1: none failed
  std::int64_t element = 0;  // row-major linear index of the failing element within the item
  double value = 0;

  PHASOR_HOST_DEVICE bool failed() const { return offset != OffsetFailure::none || item >= 0; }
};

// Scans every check on the host (the CPU backend) and raises the first failure.
void check_values_on_host(const std::string& op, const ValueChecks& checks);
// The message of a failure (thrown as phasor::Error): the same for every backend.
[[noreturn]] void raise_value_failure(const std::string& op, const ValueChecks& checks,
                                      const ValueVerdict& verdict);

}  // namespace phasor::detail
