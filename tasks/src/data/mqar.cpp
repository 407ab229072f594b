// MQAR generator (Zoology's multiquery_ar semantics, num_passes = 1); see phasor/tasks/data.h.
#include <cmath>

#include "data/util.h"

namespace phasor::tasks {

using detail::fail;

namespace {
constexpr const char* kOp = "mqar";
}

void validate(const MqarConfig& c) {
  const std::string L = std::to_string(c.seq_len);
  if (c.seq_len < 4) fail(kOp, "seq_len", "≥ 4", L);
  // Queries sit at even offsets 2·gap after the context, so the query region must pair up.
  if (c.seq_len % 2 != 0) fail(kOp, "seq_len", "an even number", L);
  if (c.vocab_size <= c.seq_len)
    fail(kOp, "vocab_size", "> seq_len (" + L + ")", std::to_string(c.vocab_size));
  if (c.num_kv_pairs < 1) fail(kOp, "num_kv_pairs", "≥ 1", std::to_string(c.num_kv_pairs));
  // Context 2n plus n query/answer slots of 2 tokens each: 4n ≤ L, i.e. space = (L − 2n)/2 ≥ n
  // distinct gaps are available.
  if (c.num_kv_pairs > c.seq_len / 4)
    fail(kOp, "num_kv_pairs",
         "4·num_kv_pairs ≤ seq_len (" + L + "), i.e. ≤ " + std::to_string(c.seq_len / 4),
         std::to_string(c.num_kv_pairs));
  if (!(c.power_a > 0.0) || !std::isfinite(c.power_a))
    fail(kOp, "power_a", "a positive finite number", std::to_string(c.power_a));
  // With V > L ≥ 4n: V/2 − 1 ≥ 2n − 1 ≥ n keys and V − V/2 ≥ n values exist, so the draws
  // without replacement below always have enough candidates.
}

Batch mqar(const MqarConfig& c, std::int64_t batch, std::uint64_t seed) {
  validate(c);
  const std::int64_t L = c.seq_len, V = c.vocab_size, n = c.num_kv_pairs;
  Batch b = detail::make_batch(kOp, batch, L, V, 0);

  const std::int64_t half = V / 2;  // keys in [1, V/2), values in [V/2, V)

  const std::int64_t context = 2 * n;
  const std::int64_t space = (L - context) / 2;
  // p(i) ∝ a·(i+1)^(a−1), i = 0..space−1 (Zoology: power_a · arange(1, space+1)^(power_a−1)).
  // The constant factor a cancels in the normalisation but is kept to mirror the definition.
  std::vector<double> gap_weights(static_cast<std::size_t>(space));
  for (std::int64_t i = 0; i < space; ++i)
    gap_weights[static_cast<std::size_t>(i)] =
        c.power_a * std::pow(static_cast<double>(i + 1), c.power_a - 1.0);

  Rng rng(seed);
  for (std::int64_t r = 0; r < batch; ++r) {
    std::int64_t* x = b.inputs.data() + r * L;
    std::int64_t* y = b.targets.data() + r * L;
    const std::vector<std::int64_t> keys = rng.distinct_in_range(1, half, n);
    const std::vector<std::int64_t> values = rng.distinct_in_range(half, V, n);
    const std::vector<std::int64_t> gaps = rng.weighted_without_replacement(gap_weights, n);
    for (std::int64_t j = 0; j < n; ++j) {
      const auto ju = static_cast<std::size_t>(j);
      x[2 * j] = keys[ju];
      x[2 * j + 1] = values[ju];
      const std::int64_t q = context + 2 * gaps[ju];  // ≤ L − 2
      x[q] = keys[ju];
      y[q] = values[ju];
    }
    if (c.random_filler) {
      // Zoology: inputs[inputs == 0] = randint(V). Only filler is 0 (keys ≥ 1, values ≥ V/2).
      for (std::int64_t t = 0; t < L; ++t)
        if (x[t] == 0) x[t] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(V)));
    }
  }
  return b;
}

}  // namespace phasor::tasks
