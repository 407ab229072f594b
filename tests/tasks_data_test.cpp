// Tests of the synthetic-task data generators and metrics (phasor/tasks/data.h): the samplers'
// distributions, MQAR's invariants and gap law, the copying format, group word problems against
// an independent permutation-composition implementation, determinism, and the metrics on
// hand-made examples.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "phasor/tasks/data.h"
#include "phasor/testing/gtest.h"

namespace phasor::tasks {
namespace {

using phasor::testing::expect_error;

// Pearson's chi-square statistic of observed counts against expected probabilities.
double chi_square(const std::vector<std::int64_t>& observed, const std::vector<double>& prob) {
  std::int64_t total = 0;
  for (auto o : observed) total += o;
  double chi2 = 0.0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double e = prob[i] * static_cast<double>(total);
    chi2 += (static_cast<double>(observed[i]) - e) * (static_cast<double>(observed[i]) - e) / e;
  }
  return chi2;
}
// A generous acceptance bound for a chi-square with `df` degrees of freedom: mean + 8 standard
// deviations (a correct sampler fails it with probability far below 1e-6; the seeds are fixed
// anyway, so the tests are deterministic). Mistakes in the law (e.g. sampling gaps uniformly,
// or with replacement) give statistics orders of magnitude above it at these sample sizes.
double chi_square_bound(std::size_t df) {
  const double d = static_cast<double>(df);
  return d + 8.0 * std::sqrt(2.0 * d);
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.rows == b.rows && a.cols == b.cols && a.vocab_size == b.vocab_size &&
         a.inputs == b.inputs && a.targets == b.targets;
}

// ------------------------------------------------------------------------------------------------
// Rng
// ------------------------------------------------------------------------------------------------

TEST(TasksRng, RawStreamIsTheStandardMt19937_64) {
  // [rand.predef]: the 10000th output of a default-constructed mt19937_64 (seed 5489) is
  // 9981545732273789042 — the stream every generator builds on is fixed by the standard.
  Rng rng(5489);
  std::uint64_t x = 0;
  for (int i = 0; i < 10000; ++i) x = rng.next();
  EXPECT_EQ(x, 9981545732273789042ULL);
}

TEST(TasksRng, BelowIsInRangeAndUniform) {
  Rng rng(1);
  EXPECT_EQ(rng.below(1), 0u);
  const std::uint64_t n = 7;
  std::vector<std::int64_t> counts(n, 0);
  for (int i = 0; i < 70000; ++i) {
    const std::uint64_t v = rng.below(n);
    ASSERT_LT(v, n);
    ++counts[v];
  }
  EXPECT_LT(chi_square(counts, std::vector<double>(n, 1.0 / n)), chi_square_bound(n - 1));
  // n just above 2^63: almost half of the raw outputs are rejected; results stay below n and
  // land in both halves.
  const std::uint64_t big = (std::uint64_t{1} << 63) + 1;
  int high = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t v = rng.below(big);
    ASSERT_LT(v, big);
    high += v >= (std::uint64_t{1} << 62) ? 1 : 0;  // upper half of [0, 2^63]
  }
  EXPECT_GT(high, 0);
  EXPECT_LT(high, 2000);
  expect_error([&] { rng.below(0); }, {"Rng::below", "argument 'n'", "≥ 1", "got 0"});
}

TEST(TasksRng, BelowMatchesItsDefinitionOnTheRawStream) {
  // below(n) = x mod n for the first raw output x ≥ 2^64 mod n: check it against a second engine
  // with the same seed (pins the algorithm, so data do not change silently between versions).
  for (std::uint64_t n : {3ULL, 10ULL, 1000003ULL, (1ULL << 63) + 12345ULL}) {
    Rng a(99), b(99);
    const std::uint64_t threshold = (0 - n) % n;
    for (int i = 0; i < 200; ++i) {
      std::uint64_t x = b.next();
      while (x < threshold) x = b.next();
      ASSERT_EQ(a.below(n), x % n) << "n = " << n << ", draw " << i;
    }
  }
}

TEST(TasksRng, UniformIntCoversBothEnds) {
  Rng rng(3);
  std::set<std::int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const std::int64_t v = rng.uniform_int(-3, 4);
    ASSERT_GE(v, -3);
    ASSERT_LE(v, 4);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(rng.uniform_int(5, 5), 5);
  // The full int64 range (hi − lo + 1 wraps to 0) is accepted.
  rng.uniform_int(std::numeric_limits<std::int64_t>::min(),
                  std::numeric_limits<std::int64_t>::max());
  expect_error([&] { rng.uniform_int(2, 1); }, {"Rng::uniform_int", "argument 'hi'", "got 1"});
}

TEST(TasksRng, UniformOpen01IsStrictlyInside) {
  Rng rng(4);
  double sum = 0.0;
  for (int i = 0; i < 20000; ++i) {
    const double u = rng.uniform_open01();
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // Mean 1/2, standard error 1/sqrt(12·20000) ≈ 0.002.
  EXPECT_NEAR(sum / 20000.0, 0.5, 0.012);
}

TEST(TasksRng, ChoiceWithoutReplacementIsUniformOverOrderedSubsets) {
  Rng rng(5);
  const std::vector<std::int64_t> pool = {10, 11, 12, 13};
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> counts;
  const int draws = 24000;
  for (int i = 0; i < draws; ++i) {
    const auto c = rng.choice_without_replacement(pool, 2);
    ASSERT_EQ(c.size(), 2u);
    ASSERT_NE(c[0], c[1]);
    ++counts[{c[0], c[1]}];
  }
  ASSERT_EQ(counts.size(), 12u);  // all 4·3 ordered pairs
  std::vector<std::int64_t> observed;
  for (const auto& kv : counts) observed.push_back(kv.second);
  EXPECT_LT(chi_square(observed, std::vector<double>(12, 1.0 / 12)), chi_square_bound(11));
  // k = size: a permutation of the pool; k = 0: empty.
  auto all = rng.choice_without_replacement(pool, 4);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, pool);
  EXPECT_TRUE(rng.choice_without_replacement(pool, 0).empty());
  expect_error([&] { rng.choice_without_replacement(pool, 5); },
               {"Rng::choice_without_replacement", "argument 'k'", "in [0, 4]", "got 5"});
}

TEST(TasksRng, DistinctInRangeEqualsChoiceOnTheMaterialisedPool) {
  for (auto [lo, hi, k] :
       {std::array<std::int64_t, 3>{1, 4096, 64}, std::array<std::int64_t, 3>{4096, 8192, 4096},
        std::array<std::int64_t, 3>{-5, 3, 3}}) {
    std::vector<std::int64_t> pool(static_cast<std::size_t>(hi - lo));
    std::iota(pool.begin(), pool.end(), lo);
    for (std::uint64_t seed : {0ULL, 7ULL, 123456789ULL}) {
      Rng a(seed), b(seed);
      EXPECT_EQ(a.distinct_in_range(lo, hi, k), b.choice_without_replacement(pool, k))
          << lo << " " << hi << " " << k << " seed " << seed;
      EXPECT_EQ(a.next(), b.next());  // same number of raw draws consumed
    }
  }
  Rng rng(0);
  expect_error([&] { rng.distinct_in_range(0, 3, 4); },
               {"Rng::distinct_in_range", "argument 'k'", "got 4"});
  expect_error([&] { rng.distinct_in_range(3, 0, 0); },
               {"Rng::distinct_in_range", "argument 'hi'", "got 0"});
}

// Exact law of the j-th successive weighted draw without replacement, by enumerating all
// ordered k-tuples (small cases only).
std::vector<std::vector<double>> successive_draw_marginals(const std::vector<double>& w, int k) {
  const std::size_t n = w.size();
  std::vector<std::vector<double>> marginal(static_cast<std::size_t>(k),
                                            std::vector<double>(n, 0.0));
  std::vector<bool> used(n, false);
  // Depth-first over draw sequences, carrying the probability of the prefix.
  std::function<void(int, double, double)> rec = [&](int depth, double prob, double remaining) {
    if (depth == k) return;
    for (std::size_t i = 0; i < n; ++i) {
      if (used[i]) continue;
      const double p = prob * w[i] / remaining;
      marginal[static_cast<std::size_t>(depth)][i] += p;
      used[i] = true;
      rec(depth + 1, p, remaining - w[i]);
      used[i] = false;
    }
  };
  rec(0, 1.0, std::accumulate(w.begin(), w.end(), 0.0));
  return marginal;
}

TEST(TasksRng, WeightedWithoutReplacementFollowsSuccessiveSampling) {
  // Skewed weights, so that "with replacement", "uniform" or "proportional marginals" would all
  // be rejected: the j-th draw has the successive-sampling law computed exactly above.
  const std::vector<double> w = {8.0, 4.0, 2.0, 1.0, 1.0, 0.5};
  const int k = 3;
  const auto exact = successive_draw_marginals(w, k);
  std::vector<std::vector<std::int64_t>> counts(k, std::vector<std::int64_t>(w.size(), 0));
  Rng rng(11);
  for (int i = 0; i < 30000; ++i) {
    const auto d = rng.weighted_without_replacement(w, k);
    ASSERT_EQ(d.size(), static_cast<std::size_t>(k));
    ASSERT_EQ(std::set<std::int64_t>(d.begin(), d.end()).size(), static_cast<std::size_t>(k));
    for (int j = 0; j < k; ++j)
      ++counts[static_cast<std::size_t>(j)][static_cast<std::size_t>(d[j])];
  }
  for (int j = 0; j < k; ++j)
    EXPECT_LT(chi_square(counts[static_cast<std::size_t>(j)], exact[static_cast<std::size_t>(j)]),
              chi_square_bound(w.size() - 1))
        << "draw " << j;
  expect_error(
      [&] {
        rng.weighted_without_replacement({1.0, 0.0}, 1);
      },
      {"Rng::weighted_without_replacement", "argument 'weights'", "weights[1]"});
  expect_error([&] { rng.weighted_without_replacement({1.0, NAN}, 1); }, {"weights[1]"});
  expect_error([&] { rng.weighted_without_replacement({1.0}, 2); }, {"argument 'k'", "got 2"});
}

// ------------------------------------------------------------------------------------------------
// MQAR
// ------------------------------------------------------------------------------------------------

// Checks every invariant of an MQAR batch; returns the gap of each key, in context order, per row.
std::vector<std::vector<std::int64_t>> check_mqar(const MqarConfig& c, const Batch& b) {
  const std::int64_t L = c.seq_len, V = c.vocab_size, n = c.num_kv_pairs, half = V / 2;
  EXPECT_EQ(b.cols, L);
  EXPECT_EQ(b.vocab_size, V);
  std::vector<std::vector<std::int64_t>> gaps(static_cast<std::size_t>(b.rows));
  for (std::int64_t r = 0; r < b.rows; ++r) {
    std::map<std::int64_t, std::int64_t> value_of, index_of;
    std::set<std::int64_t> values;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t k = b.input(r, 2 * j), v = b.input(r, 2 * j + 1);
      EXPECT_GE(k, 1);
      EXPECT_LT(k, half);
      EXPECT_GE(v, half);
      EXPECT_LT(v, V);
      EXPECT_TRUE(value_of.emplace(k, v).second) << "repeated key " << k << " in row " << r;
      EXPECT_TRUE(values.insert(v).second) << "repeated value " << v << " in row " << r;
      index_of[k] = j;
      EXPECT_EQ(b.target(r, 2 * j), kIgnoreIndex);
      EXPECT_EQ(b.target(r, 2 * j + 1), kIgnoreIndex);
    }
    std::vector<std::int64_t> row_gaps(static_cast<std::size_t>(n), -1);
    std::int64_t scored = 0, zeros = 0;
    for (std::int64_t t = 2 * n; t < L; ++t) {
      const std::int64_t x = b.input(r, t), y = b.target(r, t);
      EXPECT_GE(x, 0);
      EXPECT_LT(x, V);
      zeros += x == 0 ? 1 : 0;
      if (y == kIgnoreIndex) {
        if (!c.random_filler) {
          EXPECT_EQ(x, 0) << "row " << r << " t " << t;
        }
        continue;
      }
      ++scored;
      EXPECT_EQ((t - 2 * n) % 2, 0) << "query at an odd offset";
      const auto it = value_of.find(x);
      if (it == value_of.end()) {
        ADD_FAILURE() << "scored position " << t << " holds " << x << ", not a key";
        continue;
      }
      EXPECT_EQ(y, it->second) << "label of key " << x << " is not its value";
      auto& g = row_gaps[static_cast<std::size_t>(index_of[x])];
      EXPECT_EQ(g, -1) << "key " << x << " queried twice";
      g = (t - 2 * n) / 2;
    }
    EXPECT_EQ(scored, n);  // with the check above: every key queried exactly once
    // Filler: all but the 2n context tokens and the n queries (a query's answer is its target,
    // not a token).
    if (!c.random_filler) {
      EXPECT_EQ(zeros, L - 3 * n);
    }
    gaps[static_cast<std::size_t>(r)] = row_gaps;
  }
  return gaps;
}

TEST(TasksMqar, InvariantsOverConfigurations) {
  std::vector<MqarConfig> configs;
  for (bool filler : {false, true}) {
    MqarConfig c;  // defaults: L 64, n 8, V 8192, a 0.01
    c.random_filler = filler;
    configs.push_back(c);
    c.seq_len = 16;  // 4n = L: every query slot used, space = n
    c.num_kv_pairs = 4;
    c.vocab_size = 17;  // odd V, the smallest allowed (V > L): keys [1, 8), values [8, 17)
    configs.push_back(c);
    c.seq_len = 30;
    c.num_kv_pairs = 3;
    c.vocab_size = 101;
    c.power_a = 1.0;  // uniform gaps
    configs.push_back(c);
    c.seq_len = 4;  // the smallest: one pair, one query slot
    c.num_kv_pairs = 1;
    c.vocab_size = 5;
    configs.push_back(c);
  }
  std::uint64_t seed = 100;
  for (const auto& c : configs) {
    SCOPED_TRACE("L " + std::to_string(c.seq_len) + " n " + std::to_string(c.num_kv_pairs) + " V " +
                 std::to_string(c.vocab_size) + " filler " + std::to_string(c.random_filler));
    const Batch b = mqar(c, 64, ++seed);
    EXPECT_EQ(b.rows, 64);
    check_mqar(c, b);
  }
}

TEST(TasksMqar, ZeroFillerReproducesTheHeaderExample) {
  // The example row documented in data.h (L 16, n 2, V 20, zero filler, seed 2026).
  MqarConfig c;
  c.seq_len = 16;
  c.num_kv_pairs = 2;
  c.vocab_size = 20;
  c.random_filler = false;
  const Batch one = mqar(c, 1, 2026);
  const std::int64_t I = kIgnoreIndex;
  EXPECT_EQ(one.inputs,
            (std::vector<std::int64_t>{9, 11, 2, 19, 0, 0, 2, 0, 0, 0, 9, 0, 0, 0, 0, 0}));
  EXPECT_EQ(one.targets,
            (std::vector<std::int64_t>{I, I, I, I, I, I, 19, I, I, I, 11, I, I, I, I, I}));
  // Over many rows every gap of {0, …, space − 1} occurs, space = (16 − 4)/2 = 6.
  const auto gaps = check_mqar(c, mqar(c, 200, 5));
  std::set<std::int64_t> seen;
  for (const auto& g : gaps) seen.insert(g.begin(), g.end());
  EXPECT_EQ(seen, (std::set<std::int64_t>{0, 1, 2, 3, 4, 5}));
  c.vocab_size = 12;  // the Zoology docstring's V, rejected by its own assert V > L
  expect_error([&] { validate(c); }, {"mqar: argument 'vocab_size'", "> seq_len (16)", "got 12"});
}

TEST(TasksMqar, RandomFillerReplacesOnlyTheFiller) {
  // The filler draws come after the keys, values and gaps of a row — but rows share one stream,
  // so only the first row is comparable between the two settings.
  MqarConfig c;
  c.seq_len = 128;
  c.num_kv_pairs = 16;
  c.vocab_size = 300;
  c.random_filler = false;
  const Batch zero = mqar(c, 1, 77);
  c.random_filler = true;
  const Batch rnd = mqar(c, 1, 77);
  EXPECT_EQ(zero.targets, rnd.targets);
  std::int64_t filler = 0, changed = 0;
  for (std::int64_t t = 0; t < c.seq_len; ++t) {
    if (zero.input(0, t) != 0) {
      EXPECT_EQ(rnd.input(0, t), zero.input(0, t)) << "non-filler position " << t << " changed";
    } else {
      ++filler;
      changed += rnd.input(0, t) != 0 ? 1 : 0;
    }
  }
  EXPECT_EQ(filler, 128 - 3 * 16);
  EXPECT_GT(changed, filler - 5);  // P(a filler draw is 0) = 1/300

  // The filler is uniform over the whole vocabulary [0, V), 0 and V − 1 included (Zoology:
  // randint(V)): 4 buckets of 75 ids, and the two end ids (expected ≈ 107 times each).
  c.vocab_size = 300;
  const Batch many = mqar(c, 400, 78);
  std::vector<std::int64_t> buckets(4, 0);
  std::int64_t zeros = 0, lasts = 0;
  for (std::int64_t r = 0; r < many.rows; ++r) {
    for (std::int64_t t = 2 * c.num_kv_pairs; t < c.seq_len; ++t) {
      if (many.target(r, t) != kIgnoreIndex) continue;
      const std::int64_t x = many.input(r, t);
      ++buckets[static_cast<std::size_t>(x / 75)];
      zeros += x == 0 ? 1 : 0;
      lasts += x == 299 ? 1 : 0;
    }
  }
  EXPECT_GT(zeros, 50);
  EXPECT_GT(lasts, 50);
  EXPECT_LT(chi_square(buckets, {0.25, 0.25, 0.25, 0.25}), chi_square_bound(3));
}

TEST(TasksMqar, GapsFollowThePowerLaw) {
  // L 40, n 4: space 16. The gap of the j-th key (context order) is the j-th successive draw
  // without replacement with p(i) ∝ a·(i+1)^(a−1); its exact law is enumerated and compared by
  // chi-square, for the default a = 0.01 (strongly favours short gaps) and a = 1 (uniform).
  for (double a : {0.01, 1.0}) {
    MqarConfig c;
    c.seq_len = 40;
    c.num_kv_pairs = 4;
    c.vocab_size = 64;
    c.power_a = a;
    const std::int64_t space = (c.seq_len - 2 * c.num_kv_pairs) / 2;
    std::vector<double> p(static_cast<std::size_t>(space));
    for (std::int64_t i = 0; i < space; ++i)
      p[static_cast<std::size_t>(i)] = a * std::pow(static_cast<double>(i + 1), a - 1.0);
    const auto exact = successive_draw_marginals(p, static_cast<int>(c.num_kv_pairs));
    const auto gaps = check_mqar(c, mqar(c, 20000, 2024));
    for (std::int64_t j = 0; j < c.num_kv_pairs; ++j) {
      std::vector<std::int64_t> hist(static_cast<std::size_t>(space), 0);
      for (const auto& g : gaps) ++hist[static_cast<std::size_t>(g[static_cast<std::size_t>(j)])];
      const double chi2 = chi_square(hist, exact[static_cast<std::size_t>(j)]);
      EXPECT_LT(chi2, chi_square_bound(static_cast<std::size_t>(space - 1)))
          << "a " << a << ", key " << j;
    }
    // The first key's gap is distributed as p itself: p(0) = 1/Σ(i+1)^(a−1).
    double z = 0.0;
    for (double v : p) z += v;
    std::int64_t first_at_zero = 0;
    for (const auto& g : gaps) first_at_zero += g[0] == 0 ? 1 : 0;
    EXPECT_NEAR(static_cast<double>(first_at_zero) / 20000.0, p[0] / z, 0.015) << "a " << a;
  }
}

TEST(TasksMqar, RejectsInvalidConfigurations) {
  MqarConfig c;
  c.seq_len = 63;
  expect_error([&] { mqar(c, 1, 0); }, {"mqar: argument 'seq_len'", "even", "got 63"});
  c.seq_len = 2;
  expect_error([&] { mqar(c, 1, 0); }, {"mqar: argument 'seq_len'", "≥ 4", "got 2"});
  c = MqarConfig();
  c.vocab_size = 64;
  expect_error([&] { mqar(c, 1, 0); }, {"mqar: argument 'vocab_size'", "> seq_len (64)", "got 64"});
  c = MqarConfig();
  c.num_kv_pairs = 17;
  expect_error([&] { mqar(c, 1, 0); },
               {"mqar: argument 'num_kv_pairs'", "4·num_kv_pairs ≤ seq_len (64)", "got 17"});
  c.num_kv_pairs = 0;
  expect_error([&] { mqar(c, 1, 0); }, {"mqar: argument 'num_kv_pairs'", "≥ 1", "got 0"});
  c = MqarConfig();
  c.power_a = 0.0;
  expect_error([&] { mqar(c, 1, 0); }, {"mqar: argument 'power_a'", "positive"});
  c.power_a = NAN;
  expect_error([&] { validate(c); }, {"mqar: argument 'power_a'"});
  c = MqarConfig();
  expect_error([&] { mqar(c, 0, 0); }, {"mqar: argument 'batch'", "≥ 1", "got 0"});
  c.num_kv_pairs = 16;  // 4n = L is valid
  EXPECT_NO_THROW(validate(c));
}

// ------------------------------------------------------------------------------------------------
// Copying
// ------------------------------------------------------------------------------------------------

// Parses one copying row: a sequence of `$ s | s .` examples then pad; checks the copies and the
// targets; returns the string lengths.
std::vector<std::int64_t> check_copy_row(const Batch& b, std::int64_t r) {
  std::vector<std::int64_t> lengths;
  std::int64_t t = 0;
  const std::int64_t C = b.cols;
  while (t < C && b.input(r, t) == kCopyStart) {
    EXPECT_EQ(b.target(r, t), kIgnoreIndex);
    std::int64_t s = t + 1;
    std::vector<std::int64_t> str;
    while (s < C && b.input(r, s) >= 0 && b.input(r, s) < kCopyLetters) {
      EXPECT_EQ(b.target(r, s), kIgnoreIndex) << "target on the source string at " << s;
      str.push_back(b.input(r, s++));
    }
    const auto n = static_cast<std::int64_t>(str.size());
    if (s + n + 1 >= C) {  // '|', the copy and '.' must fit
      ADD_FAILURE() << "truncated example in row " << r;
      return lengths;
    }
    EXPECT_GE(n, 1);
    EXPECT_EQ(b.input(r, s), kCopySep);
    // From the '|' to the last copied letter: target = next token = the copy, then '.'.
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(b.input(r, s + 1 + i), str[static_cast<std::size_t>(i)]) << "copy differs";
      EXPECT_EQ(b.target(r, s + i), str[static_cast<std::size_t>(i)]);
    }
    EXPECT_EQ(b.input(r, s + n + 1), kCopyEnd);
    EXPECT_EQ(b.target(r, s + n), kCopyEnd);
    EXPECT_EQ(b.target(r, s + n + 1), kIgnoreIndex);  // after '.' comes the next example
    lengths.push_back(n);
    t = s + n + 2;
  }
  for (; t < C; ++t) {
    EXPECT_EQ(b.input(r, t), kCopyPad) << "row " << r << " position " << t;
    EXPECT_EQ(b.target(r, t), kIgnoreIndex);
  }
  return lengths;
}

TEST(TasksCopy, TrainingRowsArePackedExamples) {
  CopyTrainConfig c;
  c.context = 64;
  c.min_len = 2;
  c.max_len = 9;
  const Batch b = copy_train(c, 200, 31);
  EXPECT_EQ(b.cols, 64);
  EXPECT_EQ(b.vocab_size, kCopyVocabSize);
  std::set<std::int64_t> lengths;
  std::int64_t examples = 0;
  for (std::int64_t r = 0; r < b.rows; ++r) {
    const auto ls = check_copy_row(b, r);
    EXPECT_GE(ls.size(), 1u);
    examples += static_cast<std::int64_t>(ls.size());
    for (auto n : ls) {
      EXPECT_GE(n, c.min_len);
      EXPECT_LE(n, c.max_len);
      lengths.insert(n);
    }
  }
  EXPECT_EQ(lengths.size(), 8u);    // every length in [2, 9] occurs
  EXPECT_GT(examples, 2 * b.rows);  // packing: mean example 14 tokens in a 64-token row
  // The tightest context: exactly one longest example fits.
  c.context = 2 * c.max_len + 3;
  c.min_len = c.max_len;
  const Batch tight = copy_train(c, 5, 1);
  for (std::int64_t r = 0; r < tight.rows; ++r)
    EXPECT_EQ(check_copy_row(tight, r), std::vector<std::int64_t>{c.max_len});
}

TEST(TasksCopy, EvaluationRowsHaveOneStringOfTheGivenLength) {
  for (std::int64_t n : {1, 7, 40}) {
    const Batch b = copy_eval(n, 16, 9);
    EXPECT_EQ(b.cols, 2 * n + 3);
    for (std::int64_t r = 0; r < b.rows; ++r)
      EXPECT_EQ(check_copy_row(b, r), std::vector<std::int64_t>{n});
  }
  // Letters are uniform over the alphabet.
  const Batch b = copy_eval(50, 200, 10);
  std::vector<std::int64_t> counts(kCopyLetters, 0);
  for (std::int64_t r = 0; r < b.rows; ++r)
    for (std::int64_t t = 1; t <= 50; ++t) ++counts[static_cast<std::size_t>(b.input(r, t))];
  EXPECT_LT(chi_square(counts, std::vector<double>(kCopyLetters, 1.0 / kCopyLetters)),
            chi_square_bound(kCopyLetters - 1));
}

TEST(TasksCopy, ToStringAndTheDocumentedExample) {
  const std::vector<std::int64_t> row = {kCopyStart, 0, 1, kCopySep, 0, 1, kCopyEnd, kCopyPad, 99};
  EXPECT_EQ(copy_to_string(row.data(), 9), "$ab|ab._?");
  const Batch b = copy_eval(3, 1, 0);
  const std::string s = copy_to_string(b.inputs.data(), b.cols);
  ASSERT_EQ(s.size(), 9u);
  EXPECT_EQ(s[0], '$');
  EXPECT_EQ(s.substr(1, 3), s.substr(5, 3));
  EXPECT_EQ(s[4], '|');
  EXPECT_EQ(s[8], '.');
}

TEST(TasksCopy, RejectsInvalidConfigurations) {
  CopyTrainConfig c;
  c.min_len = 0;
  expect_error([&] { copy_train(c, 1, 0); }, {"copy_train: argument 'min_len'", "≥ 1", "got 0"});
  c = CopyTrainConfig();
  c.min_len = 10;
  c.max_len = 9;
  expect_error([&] { copy_train(c, 1, 0); },
               {"copy_train: argument 'max_len'", "≥ min_len (10)", "got 9"});
  c = CopyTrainConfig();
  c.context = 102;  // 2·50 + 3 = 103 needed
  expect_error([&] { validate(c); },
               {"copy_train: argument 'context'", "2·max_len + 3 (max_len = 50)", "got 102"});
  c.context = 103;
  EXPECT_NO_THROW(validate(c));
  expect_error([&] { copy_train(c, 0, 0); }, {"copy_train: argument 'batch'"});
  expect_error([&] { copy_eval(0, 1, 0); }, {"copy_eval: argument 'length'", "≥ 1", "got 0"});
}

// ------------------------------------------------------------------------------------------------
// Group word problems, against an independent implementation: permutations as std::array,
// composed directly.
// ------------------------------------------------------------------------------------------------

using Perm = std::array<int, 5>;  // the first `n` entries are used

// The elements of S_n in lexicographic order of one-line notation (optionally only the even
// ones), written without the library's tables.
std::vector<Perm> enumerate(int n, bool even_only) {
  std::vector<Perm> out;
  Perm p{};
  for (int i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = i;
  do {
    // Parity by counting cycles: sign = (−1)^(n − #cycles).
    std::array<bool, 5> seen{};
    int cycles = 0;
    for (int i = 0; i < n; ++i) {
      if (seen[static_cast<std::size_t>(i)]) continue;
      ++cycles;
      for (int j = i; !seen[static_cast<std::size_t>(j)]; j = p[static_cast<std::size_t>(j)])
        seen[static_cast<std::size_t>(j)] = true;
    }
    if (!even_only || (n - cycles) % 2 == 0) out.push_back(p);
  } while (std::next_permutation(p.begin(), p.begin() + n));
  return out;
}

// a then b.
Perm compose(const Perm& a, const Perm& b, int n) {
  Perm c{};
  for (int i = 0; i < n; ++i)
    c[static_cast<std::size_t>(i)] = b[static_cast<std::size_t>(a[static_cast<std::size_t>(i)])];
  return c;
}

struct GroupCase {
  Group group;
  int n;
  bool even_only;
  std::int64_t order;
};
const GroupCase kGroups[] = {{Group::S2, 2, false, 2},
                             {Group::A3, 3, true, 3},
                             {Group::S3, 3, false, 6},
                             {Group::S5, 5, false, 120}};

std::int64_t id_of(const std::vector<Perm>& elements, const Perm& p) {
  const auto it = std::find(elements.begin(), elements.end(), p);
  return it == elements.end() ? -1 : static_cast<std::int64_t>(it - elements.begin());
}

TEST(TasksGroups, TablesMatchDirectComposition) {
  for (const auto& gc : kGroups) {
    SCOPED_TRACE(to_string(gc.group));
    const PermutationGroup& g = PermutationGroup::get(gc.group);
    const auto elements = enumerate(gc.n, gc.even_only);
    ASSERT_EQ(g.order(), gc.order);
    ASSERT_EQ(static_cast<std::int64_t>(elements.size()), gc.order);
    EXPECT_EQ(g.degree(), gc.n);
    for (std::int64_t id = 0; id < g.order(); ++id) {
      const auto& e = g.element(id);
      ASSERT_EQ(e.size(), static_cast<std::size_t>(gc.n));
      for (int i = 0; i < gc.n; ++i)
        EXPECT_EQ(e[static_cast<std::size_t>(i)],
                  elements[static_cast<std::size_t>(id)][static_cast<std::size_t>(i)]);
    }
    for (std::int64_t a = 0; a < g.order(); ++a) {
      EXPECT_EQ(g.multiply(0, a), a);  // identity = 0
      EXPECT_EQ(g.multiply(a, 0), a);
      EXPECT_EQ(g.multiply(a, g.inverse(a)), 0);
      for (std::int64_t b = 0; b < g.order(); ++b)
        ASSERT_EQ(g.multiply(a, b),
                  id_of(elements, compose(elements[static_cast<std::size_t>(a)],
                                          elements[static_cast<std::size_t>(b)], gc.n)))
            << a << "·" << b;
    }
  }
  // A3: the documented ids, cyclic of order 3; S3 is not commutative.
  const PermutationGroup& a3 = PermutationGroup::get(Group::A3);
  EXPECT_EQ(a3.element(1), (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(a3.element(2), (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(a3.multiply(1, 1), 2);
  EXPECT_EQ(a3.multiply(1, 2), 0);
  const PermutationGroup& s3 = PermutationGroup::get(Group::S3);
  EXPECT_NE(s3.multiply(1, 2), s3.multiply(2, 1));
  EXPECT_EQ(group_from_string("S5"), Group::S5);
  expect_error([] { group_from_string("Z7"); },
               {"group_from_string: argument 'name'", "S2, A3, S3, S5", "'Z7'"});
}

TEST(TasksGroups, WordProblemTargetsAreRunningProducts) {
  for (const auto& gc : kGroups) {
    SCOPED_TRACE(to_string(gc.group));
    const auto elements = enumerate(gc.n, gc.even_only);
    for (bool final_only : {false, true}) {
      WordProblemConfig c;
      c.group = gc.group;
      c.seq_len = 37;
      c.final_only = final_only;
      const Batch b = word_problem(c, 20, 8);
      EXPECT_EQ(b.cols, 37);
      EXPECT_EQ(b.vocab_size, gc.order);
      for (std::int64_t r = 0; r < b.rows; ++r) {
        Perm prefix = elements[0];  // identity
        for (std::int64_t t = 0; t < c.seq_len; ++t) {
          const std::int64_t x = b.input(r, t);
          ASSERT_GE(x, 0);
          ASSERT_LT(x, gc.order);
          prefix = compose(prefix, elements[static_cast<std::size_t>(x)], gc.n);
          if (!final_only || t == c.seq_len - 1)
            EXPECT_EQ(b.target(r, t), id_of(elements, prefix)) << "row " << r << " t " << t;
          else
            EXPECT_EQ(b.target(r, t), kIgnoreIndex);
        }
      }
    }
  }
}

TEST(TasksGroups, WordProblemBosPrependsOneUnscoredToken) {
  for (const auto& gc : kGroups) {
    SCOPED_TRACE(to_string(gc.group));
    for (bool final_only : {false, true}) {
      WordProblemConfig c;
      c.group = gc.group;
      c.seq_len = 23;
      c.final_only = final_only;
      const Batch plain = word_problem(c, 9, 4);
      EXPECT_EQ(plain.cols, c.row_length());
      EXPECT_EQ(plain.vocab_size, c.vocab_size());
      c.bos = true;
      const Batch b = word_problem(c, 9, 4);
      ASSERT_EQ(b.rows, 9);
      ASSERT_EQ(b.cols, 24);
      EXPECT_EQ(b.vocab_size, gc.order + 1);
      // The helpers the experiment runner and the CLI size their buffers with say the same.
      EXPECT_EQ(c.row_length(), 24);
      EXPECT_EQ(c.vocab_size(), gc.order + 1);
      for (std::int64_t r = 0; r < b.rows; ++r) {
        EXPECT_EQ(b.input(r, 0), gc.order) << "row " << r;  // the BOS id, |G|
        EXPECT_EQ(b.target(r, 0), kIgnoreIndex) << "row " << r;
        // The same draws and targets as without bos, one position later.
        for (std::int64_t t = 0; t < c.seq_len; ++t) {
          ASSERT_EQ(b.input(r, t + 1), plain.input(r, t)) << "row " << r << " t " << t;
          ASSERT_EQ(b.target(r, t + 1), plain.target(r, t)) << "row " << r << " t " << t;
        }
      }
    }
  }
}

TEST(TasksGroups, ParityIsCumulativeXorAndTokensAreUniform) {
  const Batch p = parity(50, false, 40, 12);
  for (std::int64_t r = 0; r < p.rows; ++r) {
    std::int64_t acc = 0;
    for (std::int64_t t = 0; t < p.cols; ++t) {
      acc ^= p.input(r, t);
      EXPECT_EQ(p.target(r, t), acc);
    }
  }
  const Batch f = parity(50, true, 40, 12);
  EXPECT_EQ(f.inputs, p.inputs);  // same draws, only the targets differ
  for (std::int64_t r = 0; r < f.rows; ++r) EXPECT_EQ(f.target(r, 49), p.target(r, 49));
  // S5 tokens are uniform over the 120 elements.
  WordProblemConfig c;
  c.group = Group::S5;
  c.seq_len = 100;
  const Batch s5 = word_problem(c, 120, 13);
  std::vector<std::int64_t> counts(120, 0);
  for (auto x : s5.inputs) ++counts[static_cast<std::size_t>(x)];
  EXPECT_LT(chi_square(counts, std::vector<double>(120, 1.0 / 120)), chi_square_bound(119));
  expect_error([] { parity(0, false, 1, 0); }, {"word_problem: argument 'seq_len'", "got 0"});
}

// ------------------------------------------------------------------------------------------------
// Determinism
// ------------------------------------------------------------------------------------------------

TEST(TasksData, SameSeedSameBatchDifferentSeedDifferentBatch) {
  MqarConfig m;
  CopyTrainConfig ct;
  ct.context = 64;
  ct.max_len = 10;
  WordProblemConfig w;
  const std::vector<std::function<Batch(std::int64_t, std::uint64_t)>> gens = {
      [&](std::int64_t n, std::uint64_t s) { return mqar(m, n, s); },
      [&](std::int64_t n, std::uint64_t s) { return copy_train(ct, n, s); },
      [&](std::int64_t n, std::uint64_t s) { return copy_eval(12, n, s); },
      [&](std::int64_t n, std::uint64_t s) { return word_problem(w, n, s); },
      [&](std::int64_t n, std::uint64_t s) { return parity(30, true, n, s); },
  };
  for (std::size_t i = 0; i < gens.size(); ++i) {
    SCOPED_TRACE("generator " + std::to_string(i));
    const Batch a = gens[i](6, 42), b = gens[i](6, 42), c = gens[i](6, 43), big = gens[i](9, 42);
    EXPECT_TRUE(same_batch(a, b));
    EXPECT_NE(a.inputs, c.inputs);
    // The first rows of a larger batch are the smaller batch.
    ASSERT_EQ(big.rows, 9);
    EXPECT_TRUE(std::equal(a.inputs.begin(), a.inputs.end(), big.inputs.begin()));
    EXPECT_TRUE(std::equal(a.targets.begin(), a.targets.end(), big.targets.begin()));
  }
}

TEST(TasksData, GoldenValuesPinTheStream) {
  // Pinned outputs: they change only if the samplers or a generator's draw order change, which
  // would silently change every data set (see "Determinism" in data.h).
  const Batch p = parity(16, false, 1, 2026);
  const Batch s3 = copy_eval(4, 1, 2026);
  MqarConfig c;
  c.seq_len = 16;
  c.num_kv_pairs = 2;
  c.vocab_size = 20;
  const Batch m = mqar(c, 1, 2026);
  EXPECT_EQ(p.inputs, (std::vector<std::int64_t>{1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1, 0, 1}));
  EXPECT_EQ(s3.inputs, (std::vector<std::int64_t>{26, 5, 14, 13, 24, 27, 5, 14, 13, 24, 28}));
  EXPECT_EQ(m.inputs,
            (std::vector<std::int64_t>{9, 11, 2, 19, 17, 13, 2, 3, 7, 12, 9, 13, 3, 14, 19, 0}));
}

// ------------------------------------------------------------------------------------------------
// Metrics
// ------------------------------------------------------------------------------------------------

TEST(TasksMetrics, HandMadeExample) {
  const std::int64_t I = kIgnoreIndex;
  // Row 0: both scored positions right. Row 1: position 2 wrong (position 1 is ignored, so its
  // wrong prediction does not count).
  const std::vector<std::int64_t> targets = {I, 1, 2, I, /**/ 3, I, 4, 5};
  const std::vector<std::int64_t> preds = {9, 1, 2, 9, /**/ 3, 0, 0, 5};
  const Metrics m = evaluate(preds, targets, 2, 4);
  EXPECT_EQ(m.scored_tokens, 5);
  EXPECT_EQ(m.correct_tokens, 4);
  EXPECT_EQ(m.rows, 2);
  EXPECT_EQ(m.correct_rows, 1);
  EXPECT_DOUBLE_EQ(m.token_accuracy, 0.8);
  EXPECT_DOUBLE_EQ(m.sequence_accuracy, 0.5);
  EXPECT_EQ(m.prefix_sequence_accuracy, (std::vector<double>{1.0, 1.0, 0.5, 0.5}));
  EXPECT_DOUBLE_EQ(token_accuracy(preds, targets, 2, 4), 0.8);
  EXPECT_DOUBLE_EQ(sequence_accuracy(preds, targets, 2, 4), 0.5);
  EXPECT_EQ(cumulative_sequence_accuracy(preds, targets, 2, 4), m.prefix_sequence_accuracy);
  // A row transposed: the error now comes first, at position 0 of row 1.
  const std::vector<std::int64_t> t2 = {I, 1, I, 7, /**/ 3, 1, I, I, /**/ I, I, I, I};
  const std::vector<std::int64_t> p2 = {0, 1, 0, 7, /**/ 2, 1, 0, 0, /**/ 0, 0, 0, 0};
  EXPECT_EQ(cumulative_sequence_accuracy(p2, t2, 3, 4),
            (std::vector<double>{2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3}));
  EXPECT_DOUBLE_EQ(sequence_accuracy(p2, t2, 3, 4), 2.0 / 3);  // the unscored row counts correct
  EXPECT_DOUBLE_EQ(token_accuracy(p2, t2, 3, 4), 0.75);
  // Nothing scored: token accuracy is NaN.
  EXPECT_TRUE(std::isnan(token_accuracy({0, 0}, {I, I}, 1, 2)));
}

TEST(TasksMetrics, CorrectPrefixLengthIsTheMedianFirstError) {
  const std::int64_t I = kIgnoreIndex;
  // Four rows of 6 positions whose first errors are at 1, 3, 4 and never (6): at least half of
  // the rows are right through position 3 (rows 2 and 3), not through position 4 (row 3 only).
  const std::vector<std::int64_t> targets(24, 1);
  std::vector<std::int64_t> preds(24, 1);
  preds[0 * 6 + 1] = preds[0 * 6 + 5] = 0;
  preds[1 * 6 + 3] = 0;
  preds[2 * 6 + 4] = 0;
  const Metrics m = evaluate(preds, targets, 4, 6);
  EXPECT_EQ(m.prefix_sequence_accuracy, (std::vector<double>{1, 0.75, 0.75, 0.5, 0.25, 0.25}));
  EXPECT_EQ(correct_prefix_length(m.prefix_sequence_accuracy), 4);
  // Brute force over random predictions: the count equals the upper median of the first errors.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 9);
    const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 12);
    std::vector<std::int64_t> t(static_cast<std::size_t>(rows * cols)), p(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) {
      t[i] = rng() % 5 == 0 ? I : 1;                                      // some positions unscored
      p[i] = rng() % static_cast<unsigned>(4 + trial % 30) == 0 ? 0 : 1;  // rare errors
    }
    std::vector<std::int64_t> first_error;
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t f = cols;
      for (std::int64_t c = cols - 1; c >= 0; --c) {
        const auto i = static_cast<std::size_t>(r * cols + c);
        if (t[i] != I && p[i] != t[i]) f = c;
      }
      first_error.push_back(f);
    }
    std::sort(first_error.begin(), first_error.end());
    // The largest m with F ≥ m for at least half of the rows: the ⌈rows/2⌉-th largest F.
    const std::int64_t expected = first_error[static_cast<std::size_t>(rows - (rows + 1) / 2)];
    EXPECT_EQ(correct_prefix_length(evaluate(p, t, rows, cols).prefix_sequence_accuracy), expected)
        << "rows " << rows << " cols " << cols << " trial " << trial;
  }
  EXPECT_EQ(correct_prefix_length({}), 0);
  EXPECT_EQ(correct_prefix_length({0.4, 0.4}), 0);
  EXPECT_EQ(correct_prefix_length({1.0, std::numeric_limits<double>::quiet_NaN(), 1.0}), 1);
}

TEST(TasksMetrics, PerfectPredictionsOnGeneratedBatches) {
  MqarConfig c;
  const Batch b = mqar(c, 8, 1);
  std::vector<std::int64_t> preds = b.targets;
  for (auto& p : preds) p = p == kIgnoreIndex ? 0 : p;
  const Metrics m = evaluate(preds, b.targets, b.rows, b.cols);
  EXPECT_EQ(m.scored_tokens, 8 * c.num_kv_pairs);
  EXPECT_DOUBLE_EQ(m.token_accuracy, 1.0);
  EXPECT_DOUBLE_EQ(m.sequence_accuracy, 1.0);
  // Break one query of row 3: its sequence fails from that position on.
  std::int64_t t_bad = -1;
  for (std::int64_t t = 0; t < b.cols && t_bad < 0; ++t)
    if (b.target(3, t) != kIgnoreIndex) t_bad = t;
  preds[static_cast<std::size_t>(3 * b.cols + t_bad)] += 1;
  const Metrics m2 = evaluate(preds, b.targets, b.rows, b.cols);
  EXPECT_DOUBLE_EQ(m2.sequence_accuracy, 7.0 / 8);
  EXPECT_DOUBLE_EQ(m2.prefix_sequence_accuracy[static_cast<std::size_t>(t_bad - 1)], 1.0);
  EXPECT_DOUBLE_EQ(m2.prefix_sequence_accuracy[static_cast<std::size_t>(t_bad)], 7.0 / 8);
}

TEST(TasksMetrics, CopyMetrics) {
  // Two eval rows of length 2 ("$ab|ab."): targets at positions 3, 4 (letters) and 5 ('.').
  const Batch b = copy_eval(2, 2, 4);
  std::vector<std::int64_t> preds(b.targets.size(), 0);
  for (std::size_t i = 0; i < preds.size(); ++i)
    preds[i] = b.targets[i] == kIgnoreIndex ? kCopyPad : b.targets[i];
  CopyMetrics m = copy_metrics(preds, b.targets, b.rows, b.cols);
  EXPECT_DOUBLE_EQ(m.exact_match, 1.0);
  EXPECT_DOUBLE_EQ(m.char_accuracy, 1.0);
  // Row 0: a wrong letter; row 1: right letters but no '.' (string not terminated).
  preds[3] = (preds[3] + 1) % kCopyLetters;
  preds[static_cast<std::size_t>(b.cols + 5)] = kCopyPad;
  m = copy_metrics(preds, b.targets, b.rows, b.cols);
  EXPECT_DOUBLE_EQ(m.exact_match, 0.0);
  EXPECT_DOUBLE_EQ(m.char_accuracy, 3.0 / 4);
}

TEST(TasksMetrics, RejectsBadInput) {
  expect_error(
      [] {
        evaluate({0, 0, 0}, {0, 0}, 1, 2);
      },
      {"metrics: argument 'predictions'", "1 × 2 = 2 elements", "got 3 elements"});
  expect_error([] { evaluate({0, 0}, {0}, 1, 2); }, {"metrics: argument 'targets'"});
  expect_error(
      [] {
        evaluate({0, 0}, {0, -5}, 1, 2);
      },
      {"metrics: argument 'targets'", "≥ 0 or −100", "-5 at (0, 1)"});
  expect_error([] { copy_metrics({0}, {0}, -1, -1); }, {"metrics: argument 'rows'"});
}

}  // namespace
}  // namespace phasor::tasks
