// Internal: argument validation shared by all ops. Every message has the form
//   "<op>: argument '<name>': expected <what>, got <what was given>"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "phasor/common.h"

namespace phasor::detail {

[[noreturn]] void fail(const std::string& op, const std::string& arg, const std::string& expected,
                       const std::string& got);

// A dimension that must match: its value and a label such as "B" or "K (as q)".
struct Dim {
  std::int64_t value;
  const char* label;
};

// `x` must be defined, on the CPU, of a floating dtype, and have exactly these dimensions.
void check_float_tensor(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims);
// Same for an output view (float32 or float64, CPU, these dimensions).
inline void check_output(const std::string& op, const std::string& name, const TensorView& x,
                         std::initializer_list<Dim> dims) {
  check_float_tensor(op, name, x, dims);
}
// An output that must also own each of its elements: a zero stride over a dimension of size > 1
// would make several results land on the same memory (check_output alone allows broadcast views).
void check_owned_output(const std::string& op, const std::string& name, const TensorView& x,
                        std::initializer_list<Dim> dims);
// "<op>_reference" for Impl::reference, "<op>" for the optimized kernels: the op named in errors.
inline std::string op_name(const char* op, Impl impl) {
  return impl == Impl::reference ? std::string(op) + "_reference" : std::string(op);
}
// `x` must be defined, CPU, floating, of this rank; returns nothing but fails with a clear message.
void check_float_rank(const std::string& op, const std::string& name, const TensorView& x, int rank,
                      const char* layout);

// The packed sequences of a batch: either the B rows of a [B, T, ...] tensor, or, with
// cu_seqlens (B must be 1), the N packed sequences [cu[n], cu[n+1]) of row 0.
struct Sequence {
  std::int64_t batch;  // row in the B dimension
  std::int64_t start;  // first token in the T dimension
  std::int64_t length;
};
// Validates cu_seqlens (1-D int32/int64 on the CPU, starts at 0, non-decreasing, ends at T;
// requires B == 1) and returns the sequences.
std::vector<Sequence> sequences(const std::string& op, const TensorView& cu_seqlens, std::int64_t B,
                                std::int64_t T);

// The softmax/attention scale: the given one, or K^-1/2. Must be finite.
double resolve_scale(const std::string& op, std::optional<double> scale, std::int64_t K);

// chunk/block sizes must be positive.
void check_positive(const std::string& op, const std::string& name, std::int64_t value);

}  // namespace phasor::detail

namespace phasor::detail {
// Every element of `g` (a float view of any rank) must be ≤ 0 (−inf allowed; NaN and positive
// values are rejected, naming the first offending index).
void check_log_gates(const std::string& op, const std::string& name, const TensorView& g);
}  // namespace phasor::detail
