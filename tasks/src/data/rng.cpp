// Portable samplers on std::mt19937_64's raw output (see "Determinism" in phasor/tasks/data.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "data/util.h"

namespace phasor::tasks {

using detail::fail;

std::uint64_t Rng::below(std::uint64_t n) {
  if (n == 0) fail("Rng::below", "n", "≥ 1", "0");
  // 2^64 mod n, computed in 64-bit arithmetic as (2^64 − n) mod n. The outputs in
  // [threshold, 2^64) are a whole number of blocks of n consecutive values, so x mod n is exactly
  // uniform on them; the (< n) outputs below the threshold are redrawn.
  const std::uint64_t threshold = (std::uint64_t{0} - n) % n;
  for (;;) {
    const std::uint64_t x = engine_();
    if (x >= threshold) return x % n;
  }
}

std::int64_t Rng::uniform_int(std::int64_t lo, std::int64_t hi) {
  if (lo > hi)
    fail("Rng::uniform_int", "hi", "≥ lo (" + std::to_string(lo) + ")", std::to_string(hi));
  // hi − lo + 1 in unsigned arithmetic (wraps to 0 for the full 64-bit range).
  const std::uint64_t range = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) + 1;
  const std::uint64_t offset = range == 0 ? engine_() : below(range);
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(lo) + offset);
}

double Rng::uniform_open01() {
  // The top 53 bits as an integer m in [0, 2^53); (m + 1/2) / 2^53 is exactly representable and
  // lies in (0, 1), so log() of it is finite.
  const std::uint64_t m = engine_() >> 11;
  return (static_cast<double>(m) + 0.5) * 0x1.0p-53;
}

std::vector<std::int64_t> Rng::choice_without_replacement(std::vector<std::int64_t> pool,
                                                          std::int64_t k) {
  const auto size = static_cast<std::int64_t>(pool.size());
  if (k < 0 || k > size)
    fail("Rng::choice_without_replacement", "k", "in [0, " + std::to_string(size) + "]",
         std::to_string(k));
  // Partial Fisher–Yates: after step i, pool[0..i] is a uniform ordered (i+1)-subset.
  for (std::int64_t i = 0; i < k; ++i) {
    const auto j = i + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(size - i)));
    std::swap(pool[static_cast<std::size_t>(i)], pool[static_cast<std::size_t>(j)]);
  }
  pool.resize(static_cast<std::size_t>(k));
  return pool;
}

std::vector<std::int64_t> Rng::distinct_in_range(std::int64_t lo, std::int64_t hi, std::int64_t k) {
  const std::string op = "Rng::distinct_in_range";
  if (hi < lo) fail(op, "hi", "≥ lo (" + std::to_string(lo) + ")", std::to_string(hi));
  const std::int64_t size = hi - lo;
  if (k < 0 || k > size) fail(op, "k", "in [0, " + std::to_string(size) + "]", std::to_string(k));
  // The same partial Fisher–Yates as choice_without_replacement on the virtual pool
  // pool[i] = lo + i; `moved` holds only the entries a swap has changed.
  std::unordered_map<std::int64_t, std::int64_t> moved;
  const auto at = [&](std::int64_t i) {
    const auto it = moved.find(i);
    return it == moved.end() ? lo + i : it->second;
  };
  std::vector<std::int64_t> out(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < k; ++i) {
    const auto j = i + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(size - i)));
    const std::int64_t vi = at(i), vj = at(j);
    out[static_cast<std::size_t>(i)] = vj;
    moved[j] = vi;  // position i is never read again
  }
  return out;
}

std::vector<std::int64_t> Rng::weighted_without_replacement(const std::vector<double>& weights,
                                                            std::int64_t k) {
  const auto size = static_cast<std::int64_t>(weights.size());
  const std::string op = "Rng::weighted_without_replacement";
  if (k < 0 || k > size) fail(op, "k", "in [0, " + std::to_string(size) + "]", std::to_string(k));
  std::vector<double> key(weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double w = weights[i];
    if (!(w > 0.0) || !std::isfinite(w))
      fail(op, "weights", "positive finite weights",
           "weights[" + std::to_string(i) + "] = " + std::to_string(w));
    // Efraimidis & Spirakis (2006): with u uniform in (0,1), P(u_i^{1/w_i} is the largest) =
    // w_i / Σw, and conditioned on that the rest are again of this form, so the order of the keys
    // is the successive-sampling order. log(u)/w is a monotone transform of u^{1/w} that does not
    // underflow for small weights.
    key[i] = std::log(uniform_open01()) / w;
  }
  std::vector<std::int64_t> order(weights.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  // A strict total order (key descending, then index ascending), so the selected prefix does not
  // depend on the standard library's partial_sort algorithm.
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](std::int64_t a, std::int64_t b) {
                      const double ka = key[static_cast<std::size_t>(a)];
                      const double kb = key[static_cast<std::size_t>(b)];
                      return ka > kb || (ka == kb && a < b);
                    });
  order.resize(static_cast<std::size_t>(k));
  return order;
}

}  // namespace phasor::tasks
