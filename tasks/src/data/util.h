// Internal helpers shared by the generators: argument checks and batch allocation.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "check.h"
#include "phasor/tasks/data.h"

namespace phasor::tasks::detail {

inline void check_at_least(const std::string& op, const std::string& name, std::int64_t value,
                           std::int64_t minimum) {
  if (value < minimum) fail(op, name, "≥ " + std::to_string(minimum), std::to_string(value));
}

// A batch of rows × cols tokens, inputs and targets filled with `fill` and −100. rows ≥ 1,
// cols ≥ 1 and rows·cols must fit in memory sizes (checked).
inline Batch make_batch(const std::string& op, std::int64_t rows, std::int64_t cols,
                        std::int64_t vocab_size, std::int64_t fill) {
  check_at_least(op, "batch", rows, 1);
  constexpr std::int64_t kMaxElements = std::int64_t{1} << 40;
  if (cols > kMaxElements / rows)
    fail(op, "batch", "batch · row length ≤ 2^40 tokens",
         std::to_string(rows) + " rows of " + std::to_string(cols) + " tokens");
  Batch b;
  b.rows = rows;
  b.cols = cols;
  b.vocab_size = vocab_size;
  const auto n = static_cast<std::size_t>(rows * cols);
  b.inputs.assign(n, fill);
  b.targets.assign(n, kIgnoreIndex);
  return b;
}

}  // namespace phasor::tasks::detail
