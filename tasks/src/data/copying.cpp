// Copying task `$ s | s .` (training rows packed into a context, evaluation rows of one length).
#include "data/util.h"

namespace phasor::tasks {

using detail::fail;

namespace {

// Writes `$ s | s .` (len random letters) at x[0..2·len+2] and its targets at y: the next token
// from the '|' (position len+1) to the last copied letter (position 2·len+1), which predicts '.'.
void write_example(Rng& rng, std::int64_t len, std::int64_t* x, std::int64_t* y) {
  x[0] = kCopyStart;
  for (std::int64_t i = 0; i < len; ++i)
    x[1 + i] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(kCopyLetters)));
  x[len + 1] = kCopySep;
  for (std::int64_t i = 0; i < len; ++i) x[len + 2 + i] = x[1 + i];
  x[2 * len + 2] = kCopyEnd;
  for (std::int64_t t = len + 1; t <= 2 * len + 1; ++t) y[t] = x[t + 1];
}

}  // namespace

std::string copy_to_string(const std::int64_t* tokens, std::int64_t count) {
  std::string s;
  s.reserve(static_cast<std::size_t>(count > 0 ? count : 0));
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t t = tokens[i];
    if (t >= 0 && t < kCopyLetters)
      s.push_back(static_cast<char>('a' + t));
    else if (t == kCopyStart)
      s.push_back('$');
    else if (t == kCopySep)
      s.push_back('|');
    else if (t == kCopyEnd)
      s.push_back('.');
    else if (t == kCopyPad)
      s.push_back('_');
    else
      s.push_back('?');
  }
  return s;
}

void validate(const CopyTrainConfig& c) {
  const std::string op = "copy_train";
  detail::check_at_least(op, "min_len", c.min_len, 1);
  if (c.max_len < c.min_len)
    fail(op, "max_len", "≥ min_len (" + std::to_string(c.min_len) + ")", std::to_string(c.max_len));
  // The longest example, 2·max_len + 3 tokens, must fit (written to avoid overflow).
  if (c.context < 3 || c.max_len > (c.context - 3) / 2)
    fail(op, "context", "≥ 2·max_len + 3 (max_len = " + std::to_string(c.max_len) + ")",
         std::to_string(c.context));
}

Batch copy_train(const CopyTrainConfig& c, std::int64_t batch, std::uint64_t seed) {
  validate(c);
  Batch b = detail::make_batch("copy_train", batch, c.context, kCopyVocabSize, kCopyPad);
  Rng rng(seed);
  for (std::int64_t r = 0; r < batch; ++r) {
    std::int64_t* x = b.inputs.data() + r * c.context;
    std::int64_t* y = b.targets.data() + r * c.context;
    std::int64_t pos = 0;
    for (;;) {
      const std::int64_t len = rng.uniform_int(c.min_len, c.max_len);
      if (2 * len + 3 > c.context - pos) break;  // discarded; the rest of the row stays pad
      write_example(rng, len, x + pos, y + pos);
      pos += 2 * len + 3;
    }
  }
  return b;
}

Batch copy_eval(std::int64_t length, std::int64_t batch, std::uint64_t seed) {
  const std::string op = "copy_eval";
  detail::check_at_least(op, "length", length, 1);
  if (length > (std::int64_t{1} << 40)) fail(op, "length", "≤ 2^40", std::to_string(length));
  Batch b = detail::make_batch(op, batch, 2 * length + 3, kCopyVocabSize, kCopyPad);
  Rng rng(seed);
  for (std::int64_t r = 0; r < batch; ++r)
    write_example(rng, length, b.inputs.data() + r * b.cols, b.targets.data() + r * b.cols);
  return b;
}

}  // namespace phasor::tasks
