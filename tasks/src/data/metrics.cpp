// Accuracy metrics over predictions and targets (−100 ignored); see phasor/tasks/data.h.
#include <limits>

#include "data/util.h"

namespace phasor::tasks {

using detail::fail;

namespace {

constexpr const char* kOp = "metrics";

void check_shape(std::int64_t rows, std::int64_t cols) {
  detail::check_at_least(kOp, "rows", rows, 0);
  detail::check_at_least(kOp, "cols", cols, 0);
}

void check_sizes(const std::vector<std::int64_t>& predictions,
                 const std::vector<std::int64_t>& targets, std::int64_t rows, std::int64_t cols) {
  check_shape(rows, cols);
  const std::string want = std::to_string(rows) + " × " + std::to_string(cols) + " = " +
                           std::to_string(rows * cols) + " elements";
  if (static_cast<std::int64_t>(predictions.size()) != rows * cols)
    fail(kOp, "predictions", want, std::to_string(predictions.size()) + " elements");
  if (static_cast<std::int64_t>(targets.size()) != rows * cols)
    fail(kOp, "targets", want, std::to_string(targets.size()) + " elements");
}

void check_target(std::int64_t target, std::int64_t r, std::int64_t t) {
  if (target < 0 && target != kIgnoreIndex)
    fail(kOp, "targets", "token ids ≥ 0 or −100",
         std::to_string(target) + " at (" + std::to_string(r) + ", " + std::to_string(t) + ")");
}

}  // namespace

Metrics evaluate(const std::int64_t* predictions, const std::int64_t* targets, std::int64_t rows,
                 std::int64_t cols) {
  check_shape(rows, cols);
  Metrics m;
  m.rows = rows;
  // still_correct[t] counts the rows that are correct on all scored positions ≤ t.
  std::vector<std::int64_t> still_correct(static_cast<std::size_t>(cols), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    bool ok = true;
    for (std::int64_t t = 0; t < cols; ++t) {
      const std::int64_t target = targets[r * cols + t];
      check_target(target, r, t);
      if (target != kIgnoreIndex) {
        ++m.scored_tokens;
        if (predictions[r * cols + t] == target)
          ++m.correct_tokens;
        else
          ok = false;
      }
      if (ok) ++still_correct[static_cast<std::size_t>(t)];
    }
    if (ok) ++m.correct_rows;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  m.token_accuracy = m.scored_tokens > 0 ? static_cast<double>(m.correct_tokens) /
                                               static_cast<double>(m.scored_tokens)
                                         : nan;
  m.sequence_accuracy =
      rows > 0 ? static_cast<double>(m.correct_rows) / static_cast<double>(rows) : nan;
  m.prefix_sequence_accuracy.resize(static_cast<std::size_t>(cols));
  for (std::size_t t = 0; t < still_correct.size(); ++t)
    m.prefix_sequence_accuracy[t] =
        rows > 0 ? static_cast<double>(still_correct[t]) / static_cast<double>(rows) : nan;
  return m;
}

Metrics evaluate(const std::vector<std::int64_t>& predictions,
                 const std::vector<std::int64_t>& targets, std::int64_t rows, std::int64_t cols) {
  check_sizes(predictions, targets, rows, cols);
  return evaluate(predictions.data(), targets.data(), rows, cols);
}

double token_accuracy(const std::vector<std::int64_t>& predictions,
                      const std::vector<std::int64_t>& targets, std::int64_t rows,
                      std::int64_t cols) {
  return evaluate(predictions, targets, rows, cols).token_accuracy;
}

double sequence_accuracy(const std::vector<std::int64_t>& predictions,
                         const std::vector<std::int64_t>& targets, std::int64_t rows,
                         std::int64_t cols) {
  return evaluate(predictions, targets, rows, cols).sequence_accuracy;
}

std::vector<double> cumulative_sequence_accuracy(const std::vector<std::int64_t>& predictions,
                                                 const std::vector<std::int64_t>& targets,
                                                 std::int64_t rows, std::int64_t cols) {
  return evaluate(predictions, targets, rows, cols).prefix_sequence_accuracy;
}

std::int64_t correct_prefix_length(const std::vector<double>& prefix_sequence_accuracy) {
  std::int64_t length = 0;
  for (double a : prefix_sequence_accuracy) {
    if (!(a >= 0.5)) break;  // NaN too
    ++length;
  }
  return length;
}

CopyMetrics copy_metrics(const std::int64_t* predictions, const std::int64_t* targets,
                         std::int64_t rows, std::int64_t cols) {
  const Metrics m = evaluate(predictions, targets, rows, cols);
  std::int64_t letters = 0, correct_letters = 0;
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    if (targets[i] >= 0 && targets[i] < kCopyLetters) {
      ++letters;
      correct_letters += predictions[i] == targets[i] ? 1 : 0;
    }
  }
  CopyMetrics c;
  c.exact_match = m.sequence_accuracy;
  c.char_accuracy = letters > 0
                        ? static_cast<double>(correct_letters) / static_cast<double>(letters)
                        : std::numeric_limits<double>::quiet_NaN();
  return c;
}

CopyMetrics copy_metrics(const std::vector<std::int64_t>& predictions,
                         const std::vector<std::int64_t>& targets, std::int64_t rows,
                         std::int64_t cols) {
  check_sizes(predictions, targets, rows, cols);
  return copy_metrics(predictions.data(), targets.data(), rows, cols);
}

}  // namespace phasor::tasks
