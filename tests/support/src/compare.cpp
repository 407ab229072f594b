#include "phasor/testing/compare.h"

#include <algorithm>
#include <cmath>

namespace phasor::testing {
namespace {

void require_same_count(const Tensor& actual, const Tensor& expected, const char* measure) {
  if (actual.defined() != expected.defined() || actual.numel() != expected.numel())
    throw Error(std::string("phasor::testing::") + measure + ": 'actual' has " +
                (actual.defined() ? std::to_string(actual.numel()) + " elements" : "none") +
                ", 'expected' " +
                (expected.defined() ? std::to_string(expected.numel()) + " elements" : "none"));
}

}  // namespace

double rel_rms(const Tensor& actual, const Tensor& expected) {
  require_same_count(actual, expected, "rel_rms");
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    const double e = expected.at(i), d = actual.at(i) - e;
    num += d * d;
    den += e * e;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

double max_abs_diff(const Tensor& actual, const Tensor& expected) {
  require_same_count(actual, expected, "max_abs_diff");
  double m = 0;
  for (std::int64_t i = 0; i < expected.numel(); ++i)
    m = std::max(m, std::fabs(actual.at(i) - expected.at(i)));
  return m;
}

bool all_finite(const Tensor& x) {
  for (std::int64_t i = 0; i < x.numel(); ++i)
    if (!std::isfinite(x.at(i))) return false;
  return true;
}

double dot(const Tensor& a, const Tensor& b) {
  require_same_count(a, b, "dot");
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.at(i) * b.at(i);
  return s;
}

WorstElement worst_element(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  require_same_count(actual, expected, "worst_element");
  WorstElement worst;
  worst.excess = -HUGE_VAL;
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    const double a = actual.at(i), e = expected.at(i);
    const double allowed = atol + (rtol == 0 ? 0.0 : rtol * std::fabs(e));
    double excess = a == e ? -allowed : std::fabs(a - e) - allowed;  // a == e: equal infinities
    if (std::isnan(excess)) excess = HUGE_VAL;  // a NaN, or mismatched infinities
    if (excess > worst.excess) worst = {excess, i, a, e};
  }
  if (worst.index < 0) worst.excess = 0;
  return worst;
}

double worst_rel_rms(const NamedTensors& actual, const NamedTensors& expected) {
  if (actual.size() != expected.size())
    throw Error("phasor::testing::worst_rel_rms: " + std::to_string(actual.size()) +
                " fields against " + std::to_string(expected.size()));
  double worst = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (actual[i].first != expected[i].first)
      throw Error("phasor::testing::worst_rel_rms: field '" + actual[i].first + "' against '" +
                  expected[i].first + "'");
    if (expected[i].second->defined())
      worst = std::max(worst, rel_rms(*actual[i].second, *expected[i].second));
  }
  return worst;
}

}  // namespace phasor::testing
