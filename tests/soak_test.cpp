// Numerical soak of every op of the core (issue 14): random extreme problems drawn from a seeded
// generator — log gates down to −1e4 and −inf (whole rows of −inf, mixed with 0 and tiny ones),
// gates of exactly 0 and exactly 1, |q|, |k| up to 1e4, β at 0 and at the edges of [0, 2],
// K = 1, V = 1, one-token and empty sequences, T not a multiple of the chunk, T = 65,536 — run
// through every implementation (reference, recurrent, chunk; forward and backward; initial and
// final states, cu_seqlens, the fused rotation) in float64, float32 and with bfloat16 / float16
// inputs. Each problem must either raise a phasor::Error that names an argument (only planted
// invalid values are expected to), or give finite outputs and gradients that agree with the float64
// reference computed from the same (rounded) inputs.
//
// Brief in CI, longer on demand (README, "Tests and benchmarks"):
//   PHASOR_SOAK_ITERATIONS  random problems per op (default kDefaultIterations)
//   PHASOR_SOAK_SEED        the seed every problem's own seed is derived from (default fixed)
//   PHASOR_SOAK_FIRST       index of the first problem (to replay one problem: FIRST = its index,
//                           ITERATIONS = 1; a failure prints the command)
//   PHASOR_SOAK_DUMP        set: a result out of bounds is printed element by element
//
// Agreement bounds: 1e-10 (float64) and 1e-5 (float32 compute) relative RMS, as the op tests, on
// well-conditioned problems. Where the inputs make the result itself ill-conditioned the bound is
// loosened by the problem's condition, and the reason is given where the bound is computed:
//   - softmax attention (FoX): rounding a logit ℓ to the compute type moves it by up to eps·|ℓ|,
//     which changes the softmax weights by that much in relative terms, so the bound grows with
//     eps·max|ℓ| (logits of 1e8 in float32 leave only finiteness to check);
//   - products of many large factors accumulated in float32 (the delta rule's solves, FAVOR+'s
//     exponentials) are bounded by eps times the measured growth, as noted at each op.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "phasor/favor.h"
#include "phasor/forgetting_attn.h"
#include "phasor/gated_delta_rule.h"
#include "phasor/gla.h"
#include "phasor/grape.h"
#include "phasor/rotary.h"
#include "phasor/short_conv.h"
#include "phasor/string_rotation.h"
#include "phasor/structured_rotation.h"
#include "phasor/testing/compare.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/random.h"
#include "phasor/testing/tensor.h"

namespace phasor {
namespace {

using testing::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------------------------
// Configuration and the problem loop.

constexpr std::int64_t kDefaultIterations = 12;
constexpr std::uint64_t kDefaultSeed = 20240614;

std::int64_t env_integer(const char* name, std::int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  return std::stoll(text, nullptr, 0);
}

struct Config {
  std::int64_t iterations = env_integer("PHASOR_SOAK_ITERATIONS", kDefaultIterations);
  std::uint64_t seed = static_cast<std::uint64_t>(
      env_integer("PHASOR_SOAK_SEED", static_cast<std::int64_t>(kDefaultSeed)));
  std::int64_t first = env_integer("PHASOR_SOAK_FIRST", 0);
};

const Config& config() {
  static const Config c;
  return c;
}

// splitmix64: decorrelates the problem seeds of consecutive indices and of different ops.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t problem_seed(const std::string& soak_name, std::int64_t index) {
  std::uint64_t h = config().seed;
  for (char c : soak_name) h = mix(h ^ static_cast<unsigned char>(c));
  return mix(h ^ static_cast<std::uint64_t>(index));
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(gen_);
  }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen_);
  }
  bool chance(double p) { return uniform(0.0, 1.0) < p; }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen_); }
  template <class T>
  T pick(std::initializer_list<T> choices) {
    return *(choices.begin() + integer(0, static_cast<std::int64_t>(choices.size()) - 1));
  }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// What one soak test reports at its end.
struct Stats {
  std::int64_t problems = 0, runs = 0, planted_errors = 0;
  // The worst error against the reference, as a fraction of its bound: float64, float32, 16-bit.
  double worst[3] = {0, 0, 0};
  double seconds = 0;
};

int dtype_slot(DType dtype) {
  return dtype == DType::float64 ? 0 : dtype == DType::float32 ? 1 : 2;
}

// One problem being checked: failures carry its description and the replay command.
class Context {
 public:
  Context(std::string soak_name, std::int64_t index, Stats& stats)
      : soak_name_(std::move(soak_name)), index_(index), stats_(stats) {}
  std::ostringstream& describe() { return description_; }
  Stats& stats() { return stats_; }
  bool failed() const { return failed_; }

  ::testing::AssertionResult header() const {
    return ::testing::AssertionFailure()
           << soak_name_ << " problem " << index_ << " (PHASOR_SOAK_SEED=" << config().seed
           << "): " << description_.str() << "\n  replay: PHASOR_SOAK_SEED=" << config().seed
           << " PHASOR_SOAK_FIRST=" << index_
           << " PHASOR_SOAK_ITERATIONS=1 ./soak_test --gtest_filter=Soak." << soak_name_ << "\n  ";
  }
  template <class... Parts>
  void fail(const Parts&... parts) {
    failed_ = true;
    auto message = header();
    (message << ... << parts);
    ADD_FAILURE() << message.message();
  }

 private:
  std::string soak_name_;
  std::int64_t index_;
  Stats& stats_;
  std::ostringstream description_;
  bool failed_ = false;
};

// Runs config().iterations problems of `check(Context&, Rng&)`, stopping after a few failing ones
// (one bug usually fails many problems), and prints a summary.
template <class Check>
void soak(const std::string& soak_name, Check&& check, std::int64_t iterations = -1) {
  if (iterations < 0) iterations = config().iterations;
  Stats stats;
  const auto start = std::chrono::steady_clock::now();
  int failing = 0;
  for (std::int64_t i = config().first; i < config().first + iterations; ++i) {
    Rng rng(problem_seed(soak_name, i));
    Context context(soak_name, i, stats);
    check(context, rng);
    ++stats.problems;
    if (context.failed() && ++failing >= 3) {
      ADD_FAILURE() << soak_name << ": stopped after 3 failing problems";
      break;
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[ soak ] %s: %lld problems (seed %llu, first %lld), %lld runs, %lld planted errors named; "
      "worst error / bound: float64 %.2g, float32 %.2g, 16-bit inputs %.2g; %.2f s\n",
      soak_name.c_str(), static_cast<long long>(stats.problems),
      static_cast<unsigned long long>(config().seed), static_cast<long long>(config().first),
      static_cast<long long>(stats.runs), static_cast<long long>(stats.planted_errors),
      stats.worst[0], stats.worst[1], stats.worst[2], stats.seconds);
}

// The long sequence: 65,536 tokens, or 4,096 with PHASOR_TEST_SIZE=small (scripts/sanitize.sh:
// instrumented builds run 5–20× slower; 4,096 tokens still span 64 chunks).
std::int64_t long_length() {
  static const std::int64_t length = [] {
    const char* size = std::getenv("PHASOR_TEST_SIZE");
    if (size == nullptr || *size == '\0') return std::int64_t{65536};
    if (std::string(size) == "small") return std::int64_t{4096};
    ADD_FAILURE() << "PHASOR_TEST_SIZE must be unset or 'small', not '" << size << "'";
    return std::int64_t{65536};
  }();
  return length;
}

// The long sequence packed as sequences of 0, 1, about half, 0 and the rest of its tokens.
std::vector<std::int64_t> long_packed_lengths() {
  const std::int64_t L = long_length(), half = L / 2;
  return {0, 1, half, 0, L - 1 - half};
}

// The long-sequence problems: one in CI, one per eight problems on demand.
std::int64_t long_iterations() {
  return std::max<std::int64_t>(1, config().iterations / 8);
}

// ---------------------------------------------------------------------------------------------
// Extreme inputs.

// A magnitude for a tensor of inputs: mostly moderate, often extreme.
double draw_magnitude(Rng& r, double largest = 1e4) {
  const double m = r.pick({1.0, 1.0, 1e-3, 1e2, largest, largest});
  return std::min(m, largest);
}

// Values of magnitude ~m in one of several patterns. Gaussians are clipped to ±4σ, so that 1e4
// stays below float16's largest finite value (65,504).
Tensor extreme_values(const std::vector<std::int64_t>& shape, Rng& r, double m) {
  Tensor t(shape, DType::float64);
  const int pattern = static_cast<int>(r.integer(0, 9));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = std::max(-4.0, std::min(4.0, r.normal()));
    double value = m * x;
    switch (pattern) {
      case 0:  // spikes: unit values with 5% of magnitude m
        value = r.chance(0.05) ? m * x : x;
        break;
      case 1:  // one sign: no cancellation, the largest growth of sums
        value = m * std::fabs(x);
        break;
      case 2:  // a third exact zeros
        value = r.chance(0.33) ? 0.0 : m * x;
        break;
      case 3:  // ±m exactly
        value = x < 0 ? -m : m;
        break;
      default:
        break;
    }
    t.set(i, value);
  }
  if (r.chance(0.03)) t.fill(0.0);  // an all-zero input
  return t;
}

// Natural-log forget gates (≤ 0) of `shape`; `row` consecutive elements form one token's row
// (K channels for GLA, 1 for the scalar gates).
enum class GateKind : int {
  realistic,  // log σ(x), x ~ N(2, 1.5)
  strong,     // −20
  huge,       // −1e4
  all_zero,   // −inf everywhere: every gate exactly 0
  no_decay,   // 0: every gate exactly 1
  tiny,       // −1e-8 … −1e-30
  inf_rows,   // realistic, with 20% of the rows −inf throughout
  mixed,      // each element one of 0, −inf, −1e4, −20, −1e-8, realistic
  count
};
const char* to_string(GateKind kind) {
  static const char* names[] = {"realistic", "strong", "huge",     "all_zero",
                                "no_decay",  "tiny",   "inf_rows", "mixed"};
  return names[static_cast<int>(kind)];
}

Tensor extreme_gates(const std::vector<std::int64_t>& shape, std::int64_t row, GateKind kind,
                     Rng& r) {
  Tensor g(shape, DType::float64);
  const auto realistic = [&] {
    const double x = 2.0 + 1.5 * r.normal();
    return -std::log1p(std::exp(-x));
  };
  bool row_inf = false;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    if (i % row == 0) row_inf = r.chance(0.2);
    double value = 0;
    switch (kind) {
      case GateKind::realistic:
        value = realistic();
        break;
      case GateKind::strong:
        value = -20.0;
        break;
      case GateKind::huge:
        value = -1e4 * r.uniform(0.5, 1.0);
        break;
      case GateKind::all_zero:
        value = -kInf;
        break;
      case GateKind::no_decay:
        value = 0.0;
        break;
      case GateKind::tiny:
        value = -std::pow(10.0, -r.uniform(8.0, 30.0));
        break;
      case GateKind::inf_rows:
        value = row_inf ? -kInf : realistic();
        break;
      case GateKind::mixed:
      case GateKind::count:
        value = r.pick({0.0, -kInf, -1e4, -20.0, -1e-8, realistic()});
        break;
    }
    g.set(i, value);
  }
  return g;
}

GateKind draw_gate_kind(Rng& r) {
  return static_cast<GateKind>(r.integer(0, static_cast<std::int64_t>(GateKind::count) - 1));
}

// Packed sequence lengths with empty and one-token sequences.
std::vector<std::int64_t> draw_lengths(Rng& r, std::int64_t longest) {
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(r.integer(1, 5)));
  for (auto& l : lengths) l = r.pick<std::int64_t>({0, 1, r.integer(2, longest)});
  return lengths;
}

std::int64_t draw_length(Rng& r, std::int64_t chunk) {
  return r.pick<std::int64_t>({1, 2, r.integer(3, 80), std::max<std::int64_t>(1, chunk + 1),
                               std::max<std::int64_t>(1, 2 * chunk - 1), 0});
}

std::string join(const std::vector<std::int64_t>& xs) {
  std::string s = "[";
  for (std::size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + std::to_string(xs[i]);
  return s + "]";
}

// x rounded to `dtype` (and held in float64 again): the values a run in `dtype` sees. float16
// inputs are first clamped to its largest finite value, 65,504 (larger magnitudes would be inf).
Tensor rounded(const Tensor& x, DType dtype) {
  if (!x.defined()) return x;
  if (dtype != DType::float16) return x.to(dtype).to(DType::float64);
  Tensor y = x;
  for (std::int64_t i = 0; i < y.numel(); ++i)
    if (std::isfinite(y.at(i))) y.set(i, std::max(-65504.0, std::min(65504.0, y.at(i))));
  return y.to(dtype).to(DType::float64);
}

// An output buffer of NaN: an element a kernel forgets to write fails the finiteness check.
Tensor nan_buffer(const std::vector<std::int64_t>& shape, DType dtype) {
  Tensor t(shape, dtype);
  t.fill(kNaN);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Checking results.

struct Named {
  std::string name;
  Tensor value;
};
using Results = std::vector<Named>;

// Every element finite; else a failure naming the first bad element.
bool check_finite(Context& ctx, const Results& results, const std::string& what) {
  bool ok = true;
  for (const auto& [name, value] : results) {
    if (!value.defined()) continue;
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = 0; i < value.numel(); ++i)
      if (!std::isfinite(value.at(i))) {
        if (first < 0) first = i;
        ++bad;
      }
    if (bad > 0) {
      ctx.fail(what, ": ", name, " has ", bad, " non-finite of ", value.numel(),
               " elements, first [", first, "] = ", value.at(first));
      ok = false;
    }
  }
  return ok;
}

// sqrt(Σ(a − e)² / Σ(e² + floor² + underflow²)): the relative RMS error, measured against the
// magnitude of the terms that make up each element where `floor` is given. A sum of products
// computed in floating point is accurate relative to Σ|terms| (the classic bound
// |fl(Σ xᵢyᵢ) − Σ xᵢyᵢ| ≤ γₙ Σ|xᵢyᵢ|), not relative to the sum itself, which may cancel: random
// extreme problems are full of such cancellations (a 2-channel dq that happens to be tiny; a
// rotation angle's gradient, the sum of the parts through q and through k, cancels exactly when
// a token's q and k turn together). For the ops that are sums of products with non-negative
// weights (the linear attentions' decays), Σ|terms| is the reference run on |inputs|.
// `underflow` is the absolute error a result may carry from intermediates below the compute
// type's range (flushed to zero or subnormal) that later get multiplied by large factors.
double relative_error(const Tensor& a, const Tensor& e, const Tensor& floor, double underflow) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < e.numel(); ++i) {
    const double d = a.at(i) - e.at(i), f = floor.defined() ? floor.at(i) : 0.0;
    num += d * d;
    den += e.at(i) * e.at(i) + f * f + underflow * underflow;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// float32's smallest normal value is 1.2e-38: an intermediate below it loses its digits, and the
// ops multiply intermediates by up to |q|·|k|·|v| ≈ 1e12 afterwards. float64's is 2.2e-308.
double underflow_floor(DType in) {
  return in == DType::float64 ? 1e-290 : 1e-25;
}

// actual against expected (same names, in order) to relative error ≤ tol; floors: for each
// expected result, a tensor of the magnitudes of its terms, or undefined.
void check_close(Context& ctx, const Results& actual, const Results& expected,
                 const std::vector<Tensor>& floors, double tol, DType dtype,
                 const std::string& what) {
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (!expected[i].value.defined()) continue;
    if (!testing::all_finite(expected[i].value)) {
      ctx.fail(what, ": the reference's ", expected[i].name, " is not finite");
      continue;
    }
    EXPECT_EQ(actual[i].value.numel(), expected[i].value.numel());
    const Tensor floor = i < floors.size() ? floors[i] : Tensor();
    const double err =
        relative_error(actual[i].value, expected[i].value, floor, underflow_floor(dtype));
    double& worst = ctx.stats().worst[dtype_slot(dtype)];
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && std::getenv("PHASOR_SOAK_DUMP")) {  // element by element, for a replay
      std::printf("%s: index, %s, reference\n", what.c_str(), expected[i].name.c_str());
      for (std::int64_t j = 0; j < expected[i].value.numel(); ++j)
        std::printf("%s[%lld] %.17g %.17g\n", expected[i].name.c_str(), static_cast<long long>(j),
                    actual[i].value.at(j), expected[i].value.at(j));
    }
    if (!(err <= tol))
      ctx.fail(what, ": ", expected[i].name, " relative ", floor.defined() ? "(to its terms) " : "",
               "RMS error ", err, " > ", tol, " against the reference");
  }
}

// Runs `fn` (which returns Results). An error is expected exactly when `planted` names the
// argument holding a planted invalid value; then it must name it. Returns the results, or
// nothing when it threw.
template <class F>
std::optional<Results> attempt(Context& ctx, const std::string& planted, const std::string& what,
                               F&& fn) {
  ++ctx.stats().runs;
  try {
    Results r = fn();
    if (!planted.empty()) ctx.fail(what, ": no error for the invalid '", planted, "'");
    return r;
  } catch (const Error& e) {
    const std::string message = e.what();
    if (planted.empty()) {
      ctx.fail(what, ": unexpected error on valid input: ", message);
    } else if (message.find("argument '" + planted + "'") == std::string::npos) {
      ctx.fail(what, ": the error for the invalid '", planted, "' does not name it: ", message);
    } else {
      ++ctx.stats().planted_errors;
    }
  }
  return std::nullopt;
}

// Plants an invalid value (NaN, or a positive log gate when `log_gate`) in x, with probability p;
// returns whether it did.
bool maybe_plant(Rng& r, Tensor& x, double p, bool log_gate) {
  if (x.numel() == 0 || !r.chance(p)) return false;
  x.set(r.integer(0, x.numel() - 1), log_gate ? r.pick({kNaN, 0.5, kInf}) : r.pick({kNaN, kInf}));
  return true;
}

std::string label(Impl impl, DType in, DType out) {
  return std::string(to_string(impl)) + " " + to_string(in) +
         (in == out ? "" : std::string(" -> ") + to_string(out));
}

// The dtypes of one problem's runs: float64, float32, and one 16-bit type for the inputs (outputs
// in float32).
struct DtypeRun {
  DType in, out;
};
std::vector<DtypeRun> dtype_runs(Rng& r) {
  return {{DType::float64, DType::float64},
          {DType::float32, DType::float32},
          {r.pick({DType::bfloat16, DType::float16}), DType::float32}};
}

double base_tolerance(DType in) {
  return in == DType::float64 ? 1e-10 : 1e-5;
}

// The generic check of a problem: for each dtype, the reference on the inputs rounded to that
// dtype, then every fast implementation, finite and within `tolerance(problem, dtype)` of it.
// run(problem, impl, in, out) → Results; problem.rounded(dtype) → the problem with every floating
// input rounded; problem.planted names an argument holding an invalid value ("" for none);
// floors(problem, expected, dtype) → the magnitudes of the terms of each result (see
// relative_error) for a run in dtype;
// also_check(problem, actual, what): an op's own checks of a fast implementation's results.
struct NoMoreChecks {
  template <class... Args>
  void operator()(Args&&...) const {}
};
template <class Problem, class Run, class Tolerance, class Floors, class Also = NoMoreChecks>
void check_implementations(Context& ctx, Rng& r, const Problem& p, Run&& run,
                           std::initializer_list<Impl> fast, Tolerance&& tolerance, Floors&& floors,
                           Also&& also_check = {}) {
  for (const DtypeRun d : dtype_runs(r)) {
    const Problem pr = p.rounded(d.in);
    const std::optional<Results> expected =
        attempt(ctx, p.planted, std::string("reference on ") + to_string(d.in) + "-rounded inputs",
                [&] { return run(pr, Impl::reference, DType::float64, DType::float64); });
    if (expected && !check_finite(ctx, *expected, "reference")) return;
    const std::vector<Tensor> expected_floors =
        expected ? floors(pr, *expected, d.in) : std::vector<Tensor>();
    for (Impl impl : fast) {
      const std::string what = label(impl, d.in, d.out);
      const std::optional<Results> actual =
          attempt(ctx, p.planted, what, [&] { return run(pr, impl, d.in, d.out); });
      if (!actual || !check_finite(ctx, *actual, what) || !expected) continue;
      check_close(ctx, *actual, *expected, expected_floors, tolerance(pr, d.in), d.in, what);
      also_check(pr, *actual, what);
    }
    if (ctx.failed() || !p.planted.empty()) return;
  }
}

// The magnitude of the terms of a rotation angle's gradient [B, T, Hθ, R]: per rotation pair,
// |x_pair|·|dx_pair| (the pair's part of dθ, x_a dx_b − x_b dx_a in the rotated frame, is at most
// that) summed over the rows of x [B, T, Hx, K] that use the angle (Hx / Hθ heads per angle head).
void add_rotation_terms(Tensor& floor, const Tensor& x, const Tensor& dx, RotaryLayout layout) {
  const auto& s = x.shape();
  const std::int64_t rows = s[0] * s[1], Hx = s[2], K = s[3], R = K / 2;
  const std::int64_t Ht = floor.shape()[2], group = Hx / Ht;
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t h = 0; h < Hx; ++h)
      for (std::int64_t i = 0; i < R; ++i) {
        const std::int64_t a = layout == RotaryLayout::half_split ? i : 2 * i,
                           b = layout == RotaryLayout::half_split ? i + R : 2 * i + 1,
                           base = (row * Hx + h) * K;
        const double norm_x = std::hypot(x.at(base + a), x.at(base + b)),
                     norm_dx = std::hypot(dx.at(base + a), dx.at(base + b));
        const std::int64_t f = (row * Ht + h / group) * R + i;
        floor.set(f, floor.at(f) + norm_x * norm_dx);
      }
}

Tensor rotation_floor(const Tensor& theta, const Tensor& q, const Tensor& dq, const Tensor& k,
                      const Tensor& dk, RotaryLayout layout) {
  Tensor floor = Tensor::zeros(theta.shape());
  add_rotation_terms(floor, q, dq, layout);
  add_rotation_terms(floor, k, dk, layout);
  return floor;
}

// x [B, T, Hx, K] rotated by θ [B, T, Hθ, K/2] (row h of x by angle head h / (Hx / Hθ)), in
// float64 from the equations: the explicit rotation, for the magnitude of the terms.
Tensor rotated(const Tensor& x, const Tensor& theta, RotaryLayout layout) {
  Tensor y = x;
  const auto& s = x.shape();
  const std::int64_t rows = s[0] * s[1], Hx = s[2], K = s[3], R = K / 2;
  const std::int64_t Ht = theta.shape()[2], group = Hx / Ht;
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t h = 0; h < Hx; ++h)
      for (std::int64_t i = 0; i < R; ++i) {
        const std::int64_t a = layout == RotaryLayout::half_split ? i : 2 * i,
                           b = layout == RotaryLayout::half_split ? i + R : 2 * i + 1,
                           base = (row * Hx + h) * K;
        const double angle = theta.at((row * Ht + h / group) * R + i);
        const double xa = x.at(base + a), xb = x.at(base + b);
        y.set(base + a, xa * std::cos(angle) - xb * std::sin(angle));
        y.set(base + b, xa * std::sin(angle) + xb * std::cos(angle));
      }
  return y;
}

// |x| elementwise (undefined stays undefined).
Tensor absolute(const Tensor& x) {
  if (!x.defined()) return x;
  Tensor y = x;
  for (std::int64_t i = 0; i < y.numel(); ++i) y.set(i, std::fabs(y.at(i)));
  return y;
}

// A gradient's terms for the unrotated input, from those for the rotated one: the rotation turns
// each pair, so each element's terms are bounded by its pair's norm.
Tensor pair_norms(const Tensor& x, RotaryLayout layout) {
  Tensor y = x;
  const std::int64_t K = x.shape().back(), R = K / 2;
  for (std::int64_t base = 0; base < x.numel(); base += K)
    for (std::int64_t i = 0; i < R; ++i) {
      const std::int64_t a = layout == RotaryLayout::half_split ? i : 2 * i,
                         b = layout == RotaryLayout::half_split ? i + R : 2 * i + 1;
      const double n = std::hypot(x.at(base + a), x.at(base + b));
      y.set(base + a, n);
      y.set(base + b, n);
    }
  return y;
}

// No floors: plain relative RMS for every result.
template <class Problem>
std::vector<Tensor> no_floors(const Problem&, const Results& results, DType) {
  return std::vector<Tensor>(results.size());
}

// ---------------------------------------------------------------------------------------------
// GLA (phasor/gla.h).

struct GlaProblem {
  std::int64_t B = 1, T = 1, H = 1, K = 1, V = 1, chunk_size = 64;
  std::vector<std::int64_t> lengths;
  std::optional<double> scale;
  RotaryLayout layout = RotaryLayout::half_split;
  Tensor q, k, v, g, h0, cu, d_o, dht, theta;
  std::string planted;

  std::int64_t N() const { return lengths.empty() ? B : static_cast<std::int64_t>(lengths.size()); }
  GlaProblem rounded(DType dtype) const {
    GlaProblem p = *this;
    for (Tensor* x : {&p.q, &p.k, &p.v, &p.g, &p.h0, &p.d_o, &p.dht, &p.theta})
      *x = phasor::rounded(*x, dtype);
    return p;
  }
};

GlaProblem draw_gla(Context& ctx, Rng& r, bool long_sequence) {
  GlaProblem p;
  p.chunk_size = r.pick<std::int64_t>({1, 3, 7, 16, 64, 100});
  if (long_sequence) {
    p.T = long_length();
    p.K = r.pick<std::int64_t>({1, 2});
    p.V = r.pick<std::int64_t>({1, 2});
    p.chunk_size = r.pick<std::int64_t>({16, 64, 100, 1000});
    if (r.chance(0.5)) p.lengths = long_packed_lengths();
  } else {
    if (r.chance(0.3)) {
      p.lengths = draw_lengths(r, 70);
      p.T = 0;
      for (auto l : p.lengths) p.T += l;
    } else {
      p.B = r.integer(1, 2);
      p.T = draw_length(r, p.chunk_size);
    }
    p.H = r.integer(1, 2);
    p.K = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
    p.V = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
  }
  const bool rotate = p.K % 2 == 0 && r.chance(0.35);
  if (r.chance(0.2)) p.scale = r.pick({1e-4, 1.0, 30.0});
  const double mq = draw_magnitude(r), mk = draw_magnitude(r), mv = draw_magnitude(r);
  const GateKind gates = draw_gate_kind(r);
  p.q = extreme_values({p.B, p.T, p.H, p.K}, r, mq);
  p.k = extreme_values({p.B, p.T, p.H, p.K}, r, mk);
  p.v = extreme_values({p.B, p.T, p.H, p.V}, r, mv);
  p.g = extreme_gates({p.B, p.T, p.H, p.K}, p.K, gates, r);
  if (r.chance(0.5)) p.h0 = extreme_values({p.N(), p.H, p.K, p.V}, r, draw_magnitude(r));
  if (!p.lengths.empty()) p.cu = testing::cu_seqlens(p.lengths);
  p.d_o = extreme_values({p.B, p.T, p.H, p.V}, r, draw_magnitude(r, 1e2));
  if (r.chance(0.5)) p.dht = extreme_values({p.N(), p.H, p.K, p.V}, r, draw_magnitude(r, 1e2));
  if (rotate) {
    p.layout = r.pick({RotaryLayout::half_split, RotaryLayout::interleaved});
    p.theta = extreme_values({p.B, p.T, p.H, p.K / 2}, r, r.pick({3.0, 1e4, 1e8}));
  }
  if (maybe_plant(r, p.g, long_sequence ? 0.0 : 0.08, true)) p.planted = "g";
  ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " K=" << p.K << " V=" << p.V
                 << " chunk=" << p.chunk_size
                 << (p.lengths.empty() ? "" : " lengths=" + join(p.lengths))
                 << (p.scale ? " scale=" + std::to_string(*p.scale) : "")
                 << " gates=" << to_string(gates) << " |q|~" << mq << " |k|~" << mk << " |v|~" << mv
                 << (p.h0.defined() ? " h0" : "") << (p.dht.defined() ? " dht" : "")
                 << (rotate ? std::string(" theta ") + to_string(p.layout) : "")
                 << (p.planted.empty() ? "" : " planted invalid " + p.planted);
  return p;
}

Results run_gla(const GlaProblem& p, Impl impl, DType in, DType out) {
  const Tensor q = p.q.to(in), k = p.k.to(in), v = p.v.to(in), g = p.g.to(in),
               h0 = p.h0.defined() ? p.h0.to(in) : Tensor(), d_o = p.d_o.to(in),
               dht = p.dht.defined() ? p.dht.to(in) : Tensor(),
               theta = p.theta.defined() ? p.theta.to(in) : Tensor();
  GlaParams params;
  params.q = q.view();
  params.k = k.view();
  params.v = v.view();
  params.g = g.view();
  params.initial_state = h0.view();
  params.cu_seqlens = p.cu.view();
  params.scale = p.scale;
  params.chunk_size = p.chunk_size;
  params.theta = theta.view();
  params.rotary_layout = p.layout;
  Tensor o = nan_buffer({p.B, p.T, p.H, p.V}, out), ht = nan_buffer({p.N(), p.H, p.K, p.V}, out);
  gla_forward(params, impl, o.view(), ht.view());
  Tensor dq = nan_buffer(p.q.shape(), out), dk = nan_buffer(p.k.shape(), out),
         dv = nan_buffer(p.v.shape(), out), dg = nan_buffer(p.g.shape(), out), dh0, dtheta;
  if (p.h0.defined()) dh0 = nan_buffer(p.h0.shape(), out);
  if (p.theta.defined()) dtheta = nan_buffer(p.theta.shape(), out);
  GlaGrads grads;
  grads.dq = dq.view();
  grads.dk = dk.view();
  grads.dv = dv.view();
  grads.dg = dg.view();
  grads.dh0 = dh0.view();
  grads.dtheta = dtheta.view();
  gla_backward(params, impl, d_o.view(), dht.view(), grads);
  return {{"o", o},   {"final_state", ht}, {"dq", dq},   {"dk", dk},
          {"dv", dv}, {"dg", dg},          {"dh0", dh0}, {"dtheta", dtheta}};
}

// The magnitude of every result's terms: GLA is a sum of products weighted by decays ≥ 0, so the
// reference on |q'|, |k'|, |v|, |h0|, |do|, |dht| (q', k' rotated explicitly) sums |terms|.
std::vector<Tensor> gla_terms(const GlaProblem& p, const Results&, DType) {
  GlaProblem a = p;
  if (p.theta.defined()) {
    a.q = rotated(p.q, p.theta, p.layout);
    a.k = rotated(p.k, p.theta, p.layout);
    a.theta = Tensor();
  }
  for (Tensor* x : {&a.q, &a.k, &a.v, &a.h0, &a.d_o, &a.dht}) *x = absolute(*x);
  Results terms = run_gla(a, Impl::reference, DType::float64, DType::float64);
  std::vector<Tensor> floors;
  for (auto& t : terms) floors.push_back(t.value);
  if (p.theta.defined()) {  // dq, dk are [2], [3]; dtheta the last
    floors.back() = rotation_floor(p.theta, a.q, terms[2].value, a.k, terms[3].value, p.layout);
    floors[2] = pair_norms(terms[2].value, p.layout);
    floors[3] = pair_norms(terms[3].value, p.layout);
  }
  return floors;
}

void soak_gla(Context& ctx, Rng& r, bool long_sequence) {
  const GlaProblem p = draw_gla(ctx, r, long_sequence);
  check_implementations(
      ctx, r, p, run_gla, {Impl::recurrent, Impl::chunk},
      [](const GlaProblem&, DType in) { return base_tolerance(in); }, gla_terms);
}

TEST(Soak, Gla) {
  soak("Gla", [](Context& ctx, Rng& r) { soak_gla(ctx, r, false); });
}

TEST(Soak, GlaLongSequence) {
  soak(
      "GlaLongSequence", [](Context& ctx, Rng& r) { soak_gla(ctx, r, true); }, long_iterations());
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet (phasor/gated_delta_rule.h).

struct GdnProblem {
  std::int64_t B = 1, T = 1, H = 1, HV = 1, K = 1, V = 1, chunk_size = 64;
  std::vector<std::int64_t> lengths;
  std::optional<double> scale;
  bool l2norm = false;
  RotaryLayout layout = RotaryLayout::half_split;
  Tensor q, k, v, g, beta, h0, cu, d_o, dht, theta;
  std::string planted;

  std::int64_t N() const { return lengths.empty() ? B : static_cast<std::int64_t>(lengths.size()); }
  GdnProblem rounded(DType dtype) const {
    GdnProblem p = *this;
    for (Tensor* x : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.h0, &p.d_o, &p.dht, &p.theta})
      *x = phasor::rounded(*x, dtype);
    return p;
  }
};

GdnProblem draw_gdn(Context& ctx, Rng& r, bool long_sequence) {
  GdnProblem p;
  p.chunk_size = r.pick<std::int64_t>({1, 3, 7, 16, 64, 100});
  if (long_sequence) {
    p.T = long_length();
    p.K = r.pick<std::int64_t>({1, 2});
    p.V = r.pick<std::int64_t>({1, 2});
    p.chunk_size = r.pick<std::int64_t>({16, 64, 100});
    if (r.chance(0.5)) p.lengths = long_packed_lengths();
  } else {
    if (r.chance(0.3)) {
      p.lengths = draw_lengths(r, 70);
      p.T = 0;
      for (auto l : p.lengths) p.T += l;
    } else {
      p.B = r.integer(1, 2);
      p.T = draw_length(r, p.chunk_size);
    }
    p.H = r.integer(1, 2);
    p.HV = p.H * r.pick<std::int64_t>({1, 1, 2, 4});
    p.K = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
    p.V = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
  }
  p.l2norm = r.chance(0.6);
  const bool rotate = p.K % 2 == 0 && r.chance(0.35);
  if (r.chance(0.2)) p.scale = r.pick({1e-4, 1.0, 30.0});
  const GateKind gates = draw_gate_kind(r);
  // β: 0, 1, 2 exactly, uniform in [0, 2], or each token at an edge.
  const int beta_kind = static_cast<int>(r.integer(0, 4));
  p.beta = Tensor({p.B, p.T, p.HV}, DType::float64);
  for (std::int64_t i = 0; i < p.beta.numel(); ++i)
    p.beta.set(i, beta_kind == 0   ? 0.0
                  : beta_kind == 1 ? 1.0
                  : beta_kind == 2 ? 2.0
                  : beta_kind == 3 ? r.uniform(0.0, 2.0)
                                   : r.pick({0.0, 1e-8, 1.0, 2.0 - 1e-7, 2.0}));
  const double mq = draw_magnitude(r), mv = draw_magnitude(r);
  // Without the in-kernel normalisation the header asks for β‖k‖² ≤ 2 (else the state grows
  // without bound, as the model's would): each key row gets a norm up to sqrt(2 / max β) of the
  // value heads reading it, at the edge half the time (the transition is then a reflection).
  const double mk = p.l2norm ? draw_magnitude(r) : 1.0;
  p.q = extreme_values({p.B, p.T, p.H, p.K}, r, mq);
  p.k = extreme_values({p.B, p.T, p.H, p.K}, r, mk);
  if (!p.l2norm) {
    const std::int64_t group = p.HV / p.H;
    for (std::int64_t row = 0; row < p.B * p.T; ++row)
      for (std::int64_t h = 0; h < p.H; ++h) {
        double beta_max = 0, norm2 = 0;
        for (std::int64_t j = 0; j < group; ++j)
          beta_max = std::max(beta_max, p.beta.at(row * p.HV + h * group + j));
        const std::int64_t base = (row * p.H + h) * p.K;
        for (std::int64_t c = 0; c < p.K; ++c) norm2 += p.k.at(base + c) * p.k.at(base + c);
        if (norm2 == 0) continue;
        const double limit = std::sqrt(2.0 / std::max(beta_max, 1e-300)),
                     norm = std::min(limit, 1e4) * (r.chance(0.5) ? 1.0 : r.uniform(0.0, 1.0));
        for (std::int64_t c = 0; c < p.K; ++c)
          p.k.set(base + c, p.k.at(base + c) * norm / std::sqrt(norm2));
      }
  }
  p.v = extreme_values({p.B, p.T, p.HV, p.V}, r, mv);
  p.g = extreme_gates({p.B, p.T, p.HV}, 1, gates, r);
  if (r.chance(0.5)) p.h0 = extreme_values({p.N(), p.HV, p.K, p.V}, r, draw_magnitude(r));
  if (!p.lengths.empty()) p.cu = testing::cu_seqlens(p.lengths);
  p.d_o = extreme_values({p.B, p.T, p.HV, p.V}, r, draw_magnitude(r, 1e2));
  if (r.chance(0.5)) p.dht = extreme_values({p.N(), p.HV, p.K, p.V}, r, draw_magnitude(r, 1e2));
  if (rotate) {
    p.layout = r.pick({RotaryLayout::half_split, RotaryLayout::interleaved});
    p.theta = extreme_values({p.B, p.T, p.H, p.K / 2}, r, r.pick({3.0, 1e4, 1e8}));
  }
  if (maybe_plant(r, p.g, long_sequence ? 0.0 : 0.08, true)) p.planted = "g";
  ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " HV=" << p.HV << " K=" << p.K
                 << " V=" << p.V << " chunk=" << p.chunk_size
                 << (p.lengths.empty() ? "" : " lengths=" + join(p.lengths))
                 << (p.scale ? " scale=" + std::to_string(*p.scale) : "")
                 << (p.l2norm ? " l2norm" : " no-l2norm") << " gates=" << to_string(gates)
                 << " beta_kind=" << beta_kind << " |q|~" << mq << " |k|~" << mk << " |v|~" << mv
                 << (p.h0.defined() ? " h0" : "") << (p.dht.defined() ? " dht" : "")
                 << (rotate ? std::string(" theta ") + to_string(p.layout) : "")
                 << (p.planted.empty() ? "" : " planted invalid " + p.planted);
  return p;
}

Results run_gdn(const GdnProblem& p, Impl impl, DType in, DType out) {
  const auto cast = [&](const Tensor& x) { return x.defined() ? x.to(in) : Tensor(); };
  const Tensor q = cast(p.q), k = cast(p.k), v = cast(p.v), g = cast(p.g), beta = cast(p.beta),
               h0 = cast(p.h0), d_o = cast(p.d_o), dht = cast(p.dht), theta = cast(p.theta);
  GatedDeltaRuleParams params;
  params.q = q.view();
  params.k = k.view();
  params.v = v.view();
  params.g = g.view();
  params.beta = beta.view();
  params.initial_state = h0.view();
  params.cu_seqlens = p.cu.view();
  params.scale = p.scale;
  params.use_qk_l2norm_in_kernel = p.l2norm;
  params.chunk_size = p.chunk_size;
  params.theta = theta.view();
  params.rotary_layout = p.layout;
  Tensor o = nan_buffer({p.B, p.T, p.HV, p.V}, out), ht = nan_buffer({p.N(), p.HV, p.K, p.V}, out);
  gated_delta_rule_forward(params, impl, o.view(), ht.view());
  Tensor dq = nan_buffer(p.q.shape(), out), dk = nan_buffer(p.k.shape(), out),
         dv = nan_buffer(p.v.shape(), out), dg = nan_buffer(p.g.shape(), out),
         dbeta = nan_buffer(p.beta.shape(), out), dh0, dtheta;
  if (p.h0.defined()) dh0 = nan_buffer(p.h0.shape(), out);
  if (p.theta.defined()) dtheta = nan_buffer(p.theta.shape(), out);
  GatedDeltaRuleGrads grads;
  grads.dq = dq.view();
  grads.dk = dk.view();
  grads.dv = dv.view();
  grads.dg = dg.view();
  grads.dbeta = dbeta.view();
  grads.dh0 = dh0.view();
  grads.dtheta = dtheta.view();
  gated_delta_rule_backward(params, impl, d_o.view(), dht.view(), grads);
  return {{"o", o},   {"final_state", ht}, {"dq", dq},   {"dk", dk},        {"dv", dv},
          {"dg", dg}, {"dbeta", dbeta},    {"dh0", dh0}, {"dtheta", dtheta}};
}

// x [B, T, H, K] divided by sqrt(Σx² + 1e-6) per row, as use_qk_l2norm_in_kernel does; norms
// receives each row's divisor.
Tensor l2_normalised(const Tensor& x, std::vector<double>& norms) {
  Tensor y = x;
  const std::int64_t K = x.shape().back();
  norms.clear();
  for (std::int64_t base = 0; base < x.numel(); base += K) {
    double sum = 0;
    for (std::int64_t c = 0; c < K; ++c) sum += x.at(base + c) * x.at(base + c);
    const double n = std::sqrt(sum + 1e-6);
    norms.push_back(n);
    for (std::int64_t c = 0; c < K; ++c) y.set(base + c, x.at(base + c) / n);
  }
  return y;
}

// The terms of the gradient of x from those of x̂ = x / n (the normalisation's Jacobian is
// (I − x̂x̂ᵀ) / n): per element (|dx̂| + |x̂| Σ|x̂||dx̂|) / n.
Tensor through_l2_norm(const Tensor& x_hat, const Tensor& d_hat, const std::vector<double>& norms) {
  Tensor y = d_hat;
  const std::int64_t K = x_hat.shape().back();
  for (std::int64_t base = 0, row = 0; base < x_hat.numel(); base += K, ++row) {
    double projection = 0;
    for (std::int64_t c = 0; c < K; ++c)
      projection += std::fabs(x_hat.at(base + c)) * std::fabs(d_hat.at(base + c));
    const double n = norms[static_cast<std::size_t>(row)];
    for (std::int64_t c = 0; c < K; ++c)
      y.set(base + c,
            (std::fabs(d_hat.at(base + c)) + std::fabs(x_hat.at(base + c)) * projection) / n);
  }
  return y;
}

// The scale of the rounding errors of every result, from a model of the recurrence's errors.
// (The sums of |terms| that bound GLA's errors do not suit the delta rule: expanded, its state is
// a polynomial whose monomials carry the signs of −β k kᵀ S', and their |terms| grow like
// (1 + β‖k‖²)ᵀ, while the recurrence itself is non-expansive — ‖I − β k kᵀ‖ ≤ 1 for β‖k‖² ≤ 2 —
// and its errors do not grow so.) The model: each token's step rounds terms of size
//   ‖S'‖ (1 + β‖k‖²) + β‖k‖‖v‖     (S' = exp(g) S_{t−1}, the true state, computed here)
// and earlier errors decay with exp(g); independent roundings add in quadrature, so the state's
// error scale is M_t = sqrt((exp(g) M_{t−1})² + step_t²), M_0 = ‖S_0‖. The same for the adjoint
// dS_t (the gradient with respect to S_t, from o's and the final state's gradients), with its
// true norm, giving E_t. Each result's scale follows from the formula that produces it (o_t =
// scale S_tᵀq, dq = scale S_t do, dv = β dS kᵀ, …), spread evenly over its elements; the gradients
// of q and k then go back through the normalisation and the rotation by their own terms.
std::vector<Tensor> gdn_terms(const GdnProblem& p, const Results&, DType) {
  const std::int64_t K = p.K, V = p.V, H = p.H, HV = p.HV, group = p.HV / p.H, T = p.T;
  const Tensor q_rot = p.theta.defined() ? rotated(p.q, p.theta, p.layout) : p.q,
               k_rot = p.theta.defined() ? rotated(p.k, p.theta, p.layout) : p.k;
  std::vector<double> q_norms, k_norms;
  const Tensor q_hat = p.l2norm ? l2_normalised(q_rot, q_norms) : q_rot,
               k_hat = p.l2norm ? l2_normalised(k_rot, k_norms) : k_rot;
  if (!p.l2norm)
    q_norms = k_norms = std::vector<double>(static_cast<std::size_t>(p.B * T * H), 1.0);
  const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(K));
  Tensor f_o = Tensor::zeros({p.B, T, HV, V}), f_ht = Tensor::zeros({p.N(), HV, K, V}),
         f_dq = Tensor::zeros({p.B, T, H, K}), f_dk = Tensor::zeros({p.B, T, H, K}),
         f_dv = Tensor::zeros({p.B, T, HV, V}), f_dg = Tensor::zeros({p.B, T, HV}),
         f_dbeta = Tensor::zeros({p.B, T, HV}), f_dh0 = Tensor::zeros({p.N(), HV, K, V});
  const auto norm = [](const Tensor& x, std::int64_t base, std::int64_t n) {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += x.at(base + i) * x.at(base + i);
    return std::sqrt(s);
  };
  // Adds `value` spread over n elements from base (in quadrature with what is there).
  const auto spread = [](Tensor& f, std::int64_t base, std::int64_t n, double value) {
    for (std::int64_t i = 0; i < n; ++i)
      f.set(base + i, std::hypot(f.at(base + i), value / std::sqrt(static_cast<double>(n))));
  };
  for (std::int64_t n = 0; n < p.N(); ++n) {
    const std::int64_t b = p.lengths.empty() ? n : 0;
    std::int64_t start = 0, L = T;
    if (!p.lengths.empty()) {
      start = static_cast<std::int64_t>(p.cu.at(n));
      L = static_cast<std::int64_t>(p.cu.at(n + 1)) - start;
    }
    for (std::int64_t hv = 0; hv < HV; ++hv) {
      const std::int64_t h = hv / group;
      const auto qk_base = [&](std::int64_t t) { return ((b * T + start + t) * H + h) * K; };
      const auto v_base = [&](std::int64_t t) { return ((b * T + start + t) * HV + hv) * V; };
      const auto gate = [&](std::int64_t t) {
        return std::exp(p.g.at((b * T + start + t) * HV + hv));
      };
      const auto beta = [&](std::int64_t t) { return p.beta.at((b * T + start + t) * HV + hv); };
      const std::int64_t state_base = (n * HV + hv) * K * V;
      std::vector<double> S(static_cast<std::size_t>(K * V), 0.0), s_decayed(L), M_decayed(L), M(L);
      if (p.h0.defined())
        for (std::int64_t i = 0; i < K * V; ++i)
          S[static_cast<std::size_t>(i)] = p.h0.at(state_base + i);
      double m = 0;
      for (double x : S) m += x * x;
      m = std::sqrt(m);
      for (std::int64_t t = 0; t < L; ++t) {  // forward: true states and error scales
        const double e = gate(t), bt = beta(t), kk = norm(k_hat, qk_base(t), K),
                     vv = norm(p.v, v_base(t), V);
        double sd = 0;
        for (auto& x : S) {
          x *= e;
          sd += x * x;
        }
        sd = std::sqrt(sd);
        for (std::int64_t c = 0; c < V; ++c) {  // S = S' + β k (v − S'ᵀk)ᵀ
          double sk = 0;
          for (std::int64_t r = 0; r < K; ++r)
            sk += S[static_cast<std::size_t>(r * V + c)] * k_hat.at(qk_base(t) + r);
          const double u = bt * (p.v.at(v_base(t) + c) - sk);
          for (std::int64_t r = 0; r < K; ++r)
            S[static_cast<std::size_t>(r * V + c)] += k_hat.at(qk_base(t) + r) * u;
        }
        s_decayed[static_cast<std::size_t>(t)] = sd;
        M_decayed[static_cast<std::size_t>(t)] = e * m;
        m = std::hypot(e * m, sd * (1 + bt * kk * kk) + bt * kk * vv);
        M[static_cast<std::size_t>(t)] = m;
        spread(f_o, v_base(t), V, scale * norm(q_hat, qk_base(t), K) * m);
      }
      spread(f_ht, state_base, K * V, m);
      std::vector<double> dS(static_cast<std::size_t>(K * V), 0.0);
      if (p.dht.defined())
        for (std::int64_t i = 0; i < K * V; ++i)
          dS[static_cast<std::size_t>(i)] = p.dht.at(state_base + i);
      double err = norm(p.dht.defined() ? p.dht : Tensor::zeros({1}),
                        p.dht.defined() ? state_base : 0, p.dht.defined() ? K * V : 1);
      for (std::int64_t t = L - 1; t >= 0; --t) {  // backward: true adjoints and error scales
        const double e = gate(t), bt = beta(t), kk = norm(k_hat, qk_base(t), K),
                     vv = norm(p.v, v_base(t), V), qq = norm(q_hat, qk_base(t), K),
                     oo = norm(p.d_o, v_base(t), V);
        for (std::int64_t r = 0; r < K; ++r)  // dS_t += scale q do_tᵀ
          for (std::int64_t c = 0; c < V; ++c)
            dS[static_cast<std::size_t>(r * V + c)] +=
                scale * q_hat.at(qk_base(t) + r) * p.d_o.at(v_base(t) + c);
        double d = 0;
        for (double x : dS) d += x * x;
        d = std::sqrt(d);
        err = std::hypot(err, scale * qq * oo);
        const double G = std::max(err, d), Md = M_decayed[static_cast<std::size_t>(t)],
                     sd = s_decayed[static_cast<std::size_t>(t)];
        spread(f_dq, qk_base(t), K, scale * M[static_cast<std::size_t>(t)] * oo);
        spread(f_dk, qk_base(t), K, bt * G * (vv + 2 * kk * std::max(Md, sd)));
        spread(f_dv, v_base(t), V, bt * G * kk);
        spread(f_dbeta, (b * T + start + t) * HV + hv, 1, kk * G * (vv + kk * std::max(Md, sd)));
        spread(f_dg, (b * T + start + t) * HV + hv, 1, G * (1 + bt * kk * kk) * std::max(Md, sd));
        for (std::int64_t c = 0; c < V; ++c) {  // dS' = (I − β k kᵀ) dS, then × exp(g)
          double kd = 0;
          for (std::int64_t r = 0; r < K; ++r)
            kd += k_hat.at(qk_base(t) + r) * dS[static_cast<std::size_t>(r * V + c)];
          for (std::int64_t r = 0; r < K; ++r)
            dS[static_cast<std::size_t>(r * V + c)] -= bt * k_hat.at(qk_base(t) + r) * kd;
        }
        for (auto& x : dS) x *= e;
        err = e * std::hypot(err, d * (1 + bt * kk * kk));
      }
      if (p.h0.defined()) spread(f_dh0, state_base, K * V, err);
    }
  }
  std::vector<Tensor> floors{f_o, f_ht, f_dq, f_dk, f_dv, f_dg, f_dbeta, f_dh0, Tensor()};
  if (!p.h0.defined()) floors[7] = Tensor();
  const Tensor dq_rot = through_l2_norm(q_hat, floors[2], q_norms),
               dk_rot = through_l2_norm(k_hat, floors[3], k_norms);
  floors[2] = p.theta.defined() ? pair_norms(dq_rot, p.layout) : dq_rot;
  floors[3] = p.theta.defined() ? pair_norms(dk_rot, p.layout) : dk_rot;
  if (p.theta.defined())
    floors.back() =
        rotation_floor(p.theta, absolute(q_rot), dq_rot, absolute(k_rot), dk_rot, p.layout);
  return floors;
}

void soak_gdn(Context& ctx, Rng& r, bool long_sequence) {
  const GdnProblem p = draw_gdn(ctx, r, long_sequence);
  check_implementations(
      ctx, r, p, run_gdn, {Impl::recurrent, Impl::chunk},
      [](const GdnProblem&, DType in) { return base_tolerance(in); }, gdn_terms);
}

TEST(Soak, GatedDeltaRule) {
  soak("GatedDeltaRule", [](Context& ctx, Rng& r) { soak_gdn(ctx, r, false); });
}

TEST(Soak, GatedDeltaRuleLongSequence) {
  soak(
      "GatedDeltaRuleLongSequence", [](Context& ctx, Rng& r) { soak_gdn(ctx, r, true); },
      long_iterations());
}

// ---------------------------------------------------------------------------------------------
// Forgetting attention (phasor/forgetting_attn.h), its key/value cache included.

struct FoxProblem {
  std::int64_t B = 1, T = 1, HQ = 1, H = 1, K = 1, V = 1, block_size = 64;
  std::vector<std::int64_t> lengths;
  std::optional<double> scale;
  std::optional<std::int64_t> window;
  RotaryLayout layout = RotaryLayout::half_split;
  bool pass_forward = false;  // give the backward the forward's o and lse
  Tensor q, k, v, g, a, b, cu, d_o, theta;
  std::string planted;

  std::int64_t N() const { return lengths.empty() ? B : static_cast<std::int64_t>(lengths.size()); }
  double resolved_scale() const { return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(K)); }
  FoxProblem rounded(DType dtype) const {
    FoxProblem p = *this;
    for (Tensor* x : {&p.q, &p.k, &p.v, &p.g, &p.a, &p.b, &p.d_o, &p.theta})
      *x = phasor::rounded(*x, dtype);
    return p;
  }
};

FoxProblem draw_fox(Context& ctx, Rng& r, bool long_sequence) {
  FoxProblem p;
  p.block_size = r.pick<std::int64_t>({1, 3, 8, 16, 64});
  if (long_sequence) {
    p.T = long_length();
    p.K = r.pick<std::int64_t>({1, 2});
    p.V = r.pick<std::int64_t>({1, 2});
    p.block_size = r.pick<std::int64_t>({16, 64});
    p.window = r.pick<std::int64_t>({1, 16, 64});
    if (r.chance(0.5)) p.lengths = long_packed_lengths();
  } else {
    if (r.chance(0.3)) {
      p.lengths = draw_lengths(r, 70);
      p.T = 0;
      for (auto l : p.lengths) p.T += l;
    } else {
      p.B = r.integer(1, 2);
      p.T = draw_length(r, p.block_size);
    }
    p.H = r.integer(1, 2);
    p.HQ = p.H * r.pick<std::int64_t>({1, 1, 2, 3});
    p.K = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
    p.V = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
    if (r.chance(0.3)) p.window = r.pick<std::int64_t>({1, 2, r.integer(3, 40)});
  }
  const bool rotate = p.K % 2 == 0 && r.chance(0.35);
  if (r.chance(0.2)) p.scale = r.pick({1e-4, 1.0, 30.0});
  p.pass_forward = r.chance(0.5);
  const double mq = draw_magnitude(r), mk = draw_magnitude(r), mv = draw_magnitude(r);
  const GateKind gates = draw_gate_kind(r);
  p.q = extreme_values({p.B, p.T, p.HQ, p.K}, r, mq);
  p.k = extreme_values({p.B, p.T, p.H, p.K}, r, mk);
  p.v = extreme_values({p.B, p.T, p.H, p.V}, r, mv);
  p.g = extreme_gates({p.B, p.T, p.HQ}, 1, gates, r);
  // Additive slopes of either sign (ALiBi, GRAPE-A): none, a, b or both.
  const int slopes = static_cast<int>(r.integer(0, 3));
  const double ms = r.pick({1e-2, 1.0, 1e2, 1e4});
  if (slopes & 1) p.a = extreme_values({p.B, p.T, p.HQ}, r, ms);
  if (slopes & 2) p.b = extreme_values({p.B, p.T, p.H}, r, ms);
  if (!p.lengths.empty()) p.cu = testing::cu_seqlens(p.lengths);
  p.d_o = extreme_values({p.B, p.T, p.HQ, p.V}, r, draw_magnitude(r, 1e2));
  if (rotate) {
    p.layout = r.pick({RotaryLayout::half_split, RotaryLayout::interleaved});
    p.theta = extreme_values({p.B, p.T, p.H, p.K / 2}, r, r.pick({3.0, 1e4, 1e8}));
  }
  if (!long_sequence) {
    if (maybe_plant(r, p.g, 0.06, true))
      p.planted = "g";
    else if (p.a.defined() && maybe_plant(r, p.a, 0.1, false))
      p.planted = "bias_q_slope";
  }
  ctx.describe() << "B=" << p.B << " T=" << p.T << " HQ=" << p.HQ << " H=" << p.H << " K=" << p.K
                 << " V=" << p.V << " block=" << p.block_size
                 << (p.window ? " window=" + std::to_string(*p.window) : "")
                 << (p.lengths.empty() ? "" : " lengths=" + join(p.lengths))
                 << (p.scale ? " scale=" + std::to_string(*p.scale) : "")
                 << " gates=" << to_string(gates) << " |q|~" << mq << " |k|~" << mk << " |v|~" << mv
                 << (slopes ? " slopes" + std::string(slopes & 1 ? " a" : "") +
                                  (slopes & 2 ? " b" : "") + " ~" + std::to_string(ms)
                            : "")
                 << (rotate ? std::string(" theta ") + to_string(p.layout) : "")
                 << (p.pass_forward ? " o,lse given to backward" : "")
                 << (p.planted.empty() ? "" : " planted invalid " + p.planted);
  return p;
}

ForgettingAttnParams fox_params(const FoxProblem& p, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& g, const Tensor& a, const Tensor& b,
                                const Tensor& theta) {
  ForgettingAttnParams params;
  params.q = q.view();
  params.k = k.view();
  params.v = v.view();
  params.g = g.view();
  params.cu_seqlens = p.cu.view();
  params.scale = p.scale;
  params.window_size = p.window;
  params.block_size = p.block_size;
  params.theta = theta.view();
  params.rotary_layout = p.layout;
  params.bias_q_slope = a.view();
  params.bias_k_slope = b.view();
  return params;
}

Results run_fox(const FoxProblem& p, Impl impl, DType in, DType out) {
  const auto cast = [&](const Tensor& x) { return x.defined() ? x.to(in) : Tensor(); };
  const Tensor q = cast(p.q), k = cast(p.k), v = cast(p.v), g = cast(p.g), a = cast(p.a),
               b = cast(p.b), d_o = cast(p.d_o), theta = cast(p.theta);
  const ForgettingAttnParams params = fox_params(p, q, k, v, g, a, b, theta);
  Tensor o = nan_buffer({p.B, p.T, p.HQ, p.V}, out), lse = nan_buffer({p.B, p.T, p.HQ}, out);
  forgetting_attn_forward(params, impl, o.view(), lse.view());
  Tensor dq = nan_buffer(p.q.shape(), out), dk = nan_buffer(p.k.shape(), out),
         dv = nan_buffer(p.v.shape(), out), dg = nan_buffer(p.g.shape(), out), dtheta, da, db;
  if (p.theta.defined()) dtheta = nan_buffer(p.theta.shape(), out);
  if (p.a.defined()) da = nan_buffer(p.a.shape(), out);
  if (p.b.defined()) db = nan_buffer(p.b.shape(), out);
  ForgettingAttnGrads grads;
  grads.dq = dq.view();
  grads.dk = dk.view();
  grads.dv = dv.view();
  grads.dg = dg.view();
  grads.dtheta = dtheta.view();
  grads.dbias_q_slope = da.view();
  grads.dbias_k_slope = db.view();
  forgetting_attn_backward(params, impl, d_o.view(), p.pass_forward ? o.view() : TensorView{},
                           p.pass_forward ? lse.view() : TensorView{}, grads);
  return {{"o", o},
          {"lse", lse},
          {"dq", dq},
          {"dk", dk},
          {"dv", dv},
          {"dg", dg},
          {"dtheta", dtheta},
          {"dbias_q_slope", da},
          {"dbias_k_slope", db}};
}

// Decoding through ForgettingAttnCache, token by token (batch rows only: the cache has no
// cu_seqlens). Results: o.
Results run_fox_cache(const FoxProblem& p, DType in, DType out) {
  const auto cast = [&](const Tensor& x) { return x.defined() ? x.to(in) : Tensor(); };
  const Tensor q = cast(p.q), k = cast(p.k), v = cast(p.v), g = cast(p.g), a = cast(p.a),
               b = cast(p.b), theta = cast(p.theta);
  Tensor o = nan_buffer({p.B, p.T, p.HQ, p.V}, out);
  const auto token = [](const Tensor& x, std::int64_t t) {
    if (!x.defined()) return TensorView{};
    TensorView view = x.view();
    view.data = static_cast<unsigned char*>(view.data) +
                t * view.stride(1) * static_cast<std::int64_t>(element_size(x.dtype()));
    view.sizes[1] = 1;
    return view;
  };
  ForgettingAttnCache cache(p.B, p.HQ, p.H, p.K, p.V, p.window);
  for (std::int64_t t = 0; t < p.T; ++t)
    cache.step(token(q, t), token(k, t), token(v, t), token(g, t), token(o, t), p.scale,
               token(theta, t), p.layout, token(a, t), token(b, t));
  return {{"o", o}};
}

// The attention of every row in float64 from the definition, for the scale of the errors: a logit
// ℓ_ij = scale q_i·k_j + (gate sum) + (slope term) reaches the kernels with an error of up to
// eps (scale Σ|q_i,c k_j,c| + |gate sum + slope term|) (a dot product in the compute type, the
// rest in float64 rounded once), which moves the softmax weights by that much relative to
// themselves; kappa is the largest such magnitude among the keys that carry weight (within 50 of
// the row's largest logit). The floors are the magnitudes of each result's terms given the
// weights P: o_i = Σ P_ij v_j; dℓ_ij = P_ij (dP_ij − D_i) is bounded by w_ij = P_ij (|dP_ij| +
// |D_i|), with |dP_ij| = Σ|do_i||v_j| and |D_i| = Σ_j P_ij |dP_ij|; dq, dk, dg and the slopes'
// gradients are sums of w with the factors of their formulas.
struct FoxTerms {
  std::vector<Tensor> floors;
  double kappa = 0;
};

FoxTerms fox_terms(const FoxProblem& p) {
  const std::int64_t B = p.B, T = p.T, HQ = p.HQ, H = p.H, K = p.K, V = p.V, group = HQ / H;
  const double scale = p.resolved_scale();
  const Tensor q = p.theta.defined() ? rotated(p.q, p.theta, p.layout) : p.q,
               k = p.theta.defined() ? rotated(p.k, p.theta, p.layout) : p.k;
  Tensor f_o = Tensor::zeros({B, T, HQ, V}), f_lse = Tensor::zeros({B, T, HQ}),
         f_dq = Tensor::zeros({B, T, HQ, K}), f_dk = Tensor::zeros({B, T, H, K}),
         f_dv = Tensor::zeros({B, T, H, V}), f_dg = Tensor::zeros({B, T, HQ}),
         f_da = Tensor::zeros({B, T, HQ}), f_db = Tensor::zeros({B, T, H});
  FoxTerms terms;
  std::vector<double> logit, magnitude, weight;
  for (std::int64_t n = 0; n < p.N(); ++n) {
    const std::int64_t b = p.lengths.empty() ? n : 0;
    std::int64_t start = 0, L = T;
    if (!p.lengths.empty()) {
      start = static_cast<std::int64_t>(p.cu.at(n));
      L = static_cast<std::int64_t>(p.cu.at(n + 1)) - start;
    }
    const auto row = [&](std::int64_t t) { return b * T + start + t; };
    for (std::int64_t hq = 0; hq < HQ; ++hq) {
      const std::int64_t h = hq / group;
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t first = p.window && *p.window <= i ? i - *p.window + 1 : 0;
        const std::int64_t count = i - first + 1;
        logit.assign(static_cast<std::size_t>(count), -kInf);
        magnitude.assign(static_cast<std::size_t>(count), 0.0);
        double gate_sum = 0, max_logit = -kInf;
        for (std::int64_t j = i; j >= first; --j) {
          if (j < i) gate_sum += p.g.at(row(j + 1) * HQ + hq);
          if (gate_sum == -kInf) break;
          double qk = 0, qk_abs = 0;
          for (std::int64_t c = 0; c < K; ++c) {
            const double x = q.at((row(i) * HQ + hq) * K + c) * k.at((row(j) * H + h) * K + c);
            qk += x;
            qk_abs += std::fabs(x);
          }
          const double slopes = (p.a.defined() ? p.a.at(row(i) * HQ + hq) : 0.0) +
                                (p.b.defined() ? p.b.at(row(j) * H + h) : 0.0);
          const double rest = gate_sum - static_cast<double>(i - j) * slopes;
          const auto idx = static_cast<std::size_t>(j - first);
          logit[idx] = scale * qk + rest;
          magnitude[idx] = scale * qk_abs + std::fabs(rest);
          max_logit = std::max(max_logit, logit[idx]);
        }
        double sum = 0;
        for (double l : logit) sum += std::exp(l - max_logit);
        const double lse = max_logit + std::log(sum);
        double row_kappa = 0, D = 0;
        weight.assign(static_cast<std::size_t>(count), 0.0);
        for (std::int64_t j = first; j <= i; ++j) {
          const auto idx = static_cast<std::size_t>(j - first);
          const double P = std::exp(logit[idx] - lse);
          if (logit[idx] >= max_logit - 50) row_kappa = std::max(row_kappa, magnitude[idx]);
          double dP = 0;
          for (std::int64_t c = 0; c < V; ++c) {
            const double pv = P * std::fabs(p.v.at((row(j) * H + h) * V + c));
            f_o.set((row(i) * HQ + hq) * V + c, f_o.at((row(i) * HQ + hq) * V + c) + pv);
            dP += std::fabs(p.d_o.at((row(i) * HQ + hq) * V + c)) *
                  std::fabs(p.v.at((row(j) * H + h) * V + c));
            f_dv.set((row(j) * H + h) * V + c,
                     f_dv.at((row(j) * H + h) * V + c) +
                         P * std::fabs(p.d_o.at((row(i) * HQ + hq) * V + c)));
          }
          weight[idx] = P * dP;  // |dP| for now
          D += P * dP;
        }
        terms.kappa = std::max(terms.kappa, row_kappa);
        f_lse.set(row(i) * HQ + hq, row_kappa + std::fabs(lse));
        double spanning = 0;  // Σ_{j < s} w_ij, for the gates s from first + 1 up to i
        for (std::int64_t j = first; j <= i; ++j) {
          const auto idx = static_cast<std::size_t>(j - first);
          const double P = std::exp(logit[idx] - lse), w = weight[idx] + P * D;
          for (std::int64_t c = 0; c < K; ++c) {
            const std::int64_t iq = (row(i) * HQ + hq) * K + c, jk = (row(j) * H + h) * K + c;
            f_dq.set(iq, f_dq.at(iq) + scale * w * std::fabs(k.at(jk)));
            f_dk.set(jk, f_dk.at(jk) + scale * w * std::fabs(q.at(iq)));
          }
          const double distance = static_cast<double>(i - j);
          f_da.set(row(i) * HQ + hq, f_da.at(row(i) * HQ + hq) + distance * w);
          f_db.set(row(j) * H + h, f_db.at(row(j) * H + h) + distance * w);
          if (j > first) f_dg.set(row(j) * HQ + hq, f_dg.at(row(j) * HQ + hq) + spanning);
          spanning += w;
        }
      }
    }
  }
  terms.floors = {f_o, f_lse, f_dq, f_dk, f_dv, f_dg, Tensor(), Tensor(), Tensor()};
  if (p.theta.defined()) {
    terms.floors[6] = rotation_floor(p.theta, absolute(q), f_dq, absolute(k), f_dk, p.layout);
    terms.floors[2] = pair_norms(f_dq, p.layout);
    terms.floors[3] = pair_norms(f_dk, p.layout);
  }
  if (p.a.defined()) terms.floors[7] = f_da;
  if (p.b.defined()) terms.floors[8] = f_db;
  return terms;
}

// The bound: the base bound plus the weights' relative error e^{c·eps·kappa} − 1 (a few roundings
// of each logit: c = 4; the backward given a saved lse also carries lse's rounding, of the same
// size). Past eps·kappa ≈ 1 (float32 logits beyond ~1e7) the softmax weights themselves are not
// determined by the inputs in the compute type and only finiteness and boundedness are checked.
double fox_tolerance(DType in, double kappa) {
  return base_tolerance(in) + std::expm1(4 * (in == DType::float64 ? 1.1e-16 : 6e-8) * kappa);
}

// Bounds that hold whatever the rounding (softmax-like attention: the weights are in [0, 1] and
// sum to 1, so o is a convex combination of v): per value head h and its `group` query heads,
// |o| ≤ max |v| and |dv| ≤ Σ |do| over the group, with a little slack. o, d_o: [.., H·group, V];
// v, dv: [.., H, V].
void check_convex_bounds(Context& ctx, std::int64_t H, std::int64_t group, std::int64_t V,
                         const Tensor& v, const Tensor& d_o, const Tensor& o, const Tensor& dv,
                         const std::string& what) {
  const std::int64_t rows = v.numel() / std::max<std::int64_t>(1, H * V), HQ = H * group;
  for (std::int64_t h = 0; h < H; ++h) {
    double v_max = 0, do_sum = 0, o_max = 0, dv_max = 0;
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t c = 0; c < V; ++c) {
        v_max = std::max(v_max, std::fabs(v.at((row * H + h) * V + c)));
        dv_max = std::max(dv_max, std::fabs(dv.at((row * H + h) * V + c)));
        for (std::int64_t hq = h * group; hq < (h + 1) * group; ++hq) {
          do_sum += std::fabs(d_o.at((row * HQ + hq) * V + c));
          o_max = std::max(o_max, std::fabs(o.at((row * HQ + hq) * V + c)));
        }
      }
    if (o_max > v_max * (1 + 1e-4))
      ctx.fail(what, ": head ", h, ": max |o| = ", o_max, " exceeds max |v| = ", v_max);
    if (dv_max > do_sum * (1 + 1e-4))
      ctx.fail(what, ": head ", h, ": max |dv| = ", dv_max, " exceeds sum |do| = ", do_sum);
  }
}

// FoX's results in the order of run_fox: o, lse, dq, dk, dv, ...
void check_fox_bounds(Context& ctx, const FoxProblem& p, const Results& r,
                      const std::string& what) {
  const Tensor dv = r.size() > 4 ? r[4].value : Tensor::zeros(p.v.shape());
  check_convex_bounds(ctx, p.H, p.HQ / p.H, p.V, p.v, p.d_o, r[0].value, dv, what);
}

void soak_fox(Context& ctx, Rng& r, bool long_sequence) {
  const FoxProblem p = draw_fox(ctx, r, long_sequence);
  double kappa = 0;
  check_implementations(
      ctx, r, p, run_fox, {Impl::recurrent, Impl::chunk},
      [&](const FoxProblem&, DType in) { return fox_tolerance(in, kappa); },
      [&](const FoxProblem& pr, const Results&, DType) {
        FoxTerms terms = fox_terms(pr);
        kappa = terms.kappa;
        return terms.floors;
      },
      [&](const FoxProblem& pr, const Results& actual, const std::string& what) {
        check_fox_bounds(ctx, pr, actual, what);
      });
  if (ctx.failed() || !p.planted.empty() || !p.lengths.empty() || long_sequence) return;
  // The key/value cache, token by token, against the reference forward.
  for (const DtypeRun d : dtype_runs(r)) {
    const FoxProblem pr = p.rounded(d.in);
    const std::string what = "ForgettingAttnCache " + label(Impl::recurrent, d.in, d.out);
    const std::optional<Results> actual =
        attempt(ctx, "", what, [&] { return run_fox_cache(pr, d.in, d.out); });
    if (!actual || !check_finite(ctx, *actual, what)) return;
    const Results reference = run_fox(pr, Impl::reference, DType::float64, DType::float64);
    const FoxTerms terms = fox_terms(pr);
    check_close(ctx, *actual, {reference[0]}, {terms.floors[0]}, fox_tolerance(d.in, terms.kappa),
                d.in, what);
    check_fox_bounds(ctx, pr, *actual, what);
  }
}

TEST(Soak, ForgettingAttn) {
  soak("ForgettingAttn", [](Context& ctx, Rng& r) { soak_fox(ctx, r, false); });
}

TEST(Soak, ForgettingAttnLongSequence) {
  soak(
      "ForgettingAttnLongSequence", [](Context& ctx, Rng& r) { soak_fox(ctx, r, true); },
      long_iterations());
}

// ---------------------------------------------------------------------------------------------
// Short convolution (phasor/short_conv.h).

struct ShortConvProblem {
  std::int64_t B = 1, T = 1, D = 1, W = 1;
  std::vector<std::int64_t> lengths;
  std::string activation = "none";
  Tensor x, weight, bias, h0, cu, dy, dht;
  std::string planted;

  std::int64_t N() const { return lengths.empty() ? B : static_cast<std::int64_t>(lengths.size()); }
  ShortConvProblem rounded(DType dtype) const {
    ShortConvProblem p = *this;
    for (Tensor* t : {&p.x, &p.weight, &p.bias, &p.h0, &p.dy, &p.dht})
      *t = phasor::rounded(*t, dtype);
    return p;
  }
};

ShortConvProblem draw_short_conv(Context& ctx, Rng& r, bool long_sequence) {
  ShortConvProblem p;
  p.W = r.pick<std::int64_t>({1, 2, 4, r.integer(3, 8)});
  if (long_sequence) {
    p.T = long_length();
    p.D = r.pick<std::int64_t>({1, 3});
    if (r.chance(0.5)) p.lengths = long_packed_lengths();
  } else {
    if (r.chance(0.3)) {
      p.lengths = draw_lengths(r, 40);
      p.T = 0;
      for (auto l : p.lengths) p.T += l;
    } else {
      p.B = r.integer(1, 2);
      p.T = draw_length(r, p.W);
    }
    p.D = r.pick<std::int64_t>({1, 2, r.integer(3, 70)});
  }
  p.activation = r.pick<std::string>({"none", "silu", "swish", "identity", ""});
  const double mx = draw_magnitude(r), mw = draw_magnitude(r);
  p.x = extreme_values({p.B, p.T, p.D}, r, mx);
  p.weight = extreme_values({p.D, p.W}, r, mw);
  if (r.chance(0.5)) p.bias = extreme_values({p.D}, r, draw_magnitude(r));
  if (p.W > 1 && r.chance(0.5)) p.h0 = extreme_values({p.N(), p.D, p.W - 1}, r, mx);
  if (!p.lengths.empty()) p.cu = testing::cu_seqlens(p.lengths);
  p.dy = extreme_values({p.B, p.T, p.D}, r, draw_magnitude(r, 1e2));
  if (p.W > 1 && r.chance(0.5)) p.dht = extreme_values({p.N(), p.D, p.W - 1}, r, 1.0);
  ctx.describe() << "B=" << p.B << " T=" << p.T << " D=" << p.D << " W=" << p.W
                 << (p.lengths.empty() ? "" : " lengths=" + join(p.lengths)) << " activation='"
                 << p.activation << "' |x|~" << mx << " |w|~" << mw
                 << (p.bias.defined() ? " bias" : "") << (p.h0.defined() ? " initial_cache" : "")
                 << (p.dht.defined() ? " d_final_cache" : "");
  return p;
}

Results run_short_conv(const ShortConvProblem& p, Impl impl, DType in, DType out) {
  const auto cast = [&](const Tensor& t) { return t.defined() ? t.to(in) : Tensor(); };
  const Tensor x = cast(p.x), weight = cast(p.weight), bias = cast(p.bias), h0 = cast(p.h0),
               dy = cast(p.dy), dht = cast(p.dht);
  ShortConvParams params;
  params.x = x.view();
  params.weight = weight.view();
  params.bias = bias.view();
  params.initial_cache = h0.view();
  params.cu_seqlens = p.cu.view();
  params.activation = p.activation;
  const bool cache = p.W > 1;
  Tensor y = nan_buffer(p.x.shape(), out), ht;
  if (cache) ht = nan_buffer({p.N(), p.D, p.W - 1}, out);
  short_conv_forward(params, impl, y.view(), ht.view());
  Tensor dx = nan_buffer(p.x.shape(), out), dw = nan_buffer(p.weight.shape(), out), db, dh0;
  if (p.bias.defined()) db = nan_buffer(p.bias.shape(), out);
  if (p.h0.defined()) dh0 = nan_buffer(p.h0.shape(), out);
  ShortConvGrads grads;
  grads.dx = dx.view();
  grads.dweight = dw.view();
  grads.dbias = db.view();
  grads.dinitial_cache = dh0.view();
  short_conv_backward(params, impl, dy.view(), dht.view(), grads);
  return {{"y", y},        {"final_cache", ht}, {"dx", dx},
          {"dweight", dw}, {"dbias", db},       {"dinitial_cache", dh0}};
}

bool is_silu(const std::string& activation) {
  return activation == "silu" || activation == "swish";
}

// The terms: without the activation the convolution is a sum of products, so the reference on
// |inputs| sums |terms|; SiLU's slope is within [−0.1, 1.1], so ×1.1 covers it (y and the
// gradients). The float32 pre-activation z is off by eps·|z|'s terms, which moves SiLU's slope by
// up to 0.5 of that (|silu''| ≤ 0.5): the bound adds eps·max Σ|terms of z| (silu_kappa).
std::vector<Tensor> short_conv_terms(const ShortConvProblem& p, double& silu_kappa) {
  ShortConvProblem a = p;
  a.activation = "none";
  for (Tensor* t : {&a.x, &a.weight, &a.bias, &a.h0, &a.dy, &a.dht}) *t = absolute(*t);
  Results terms = run_short_conv(a, Impl::reference, DType::float64, DType::float64);
  std::vector<Tensor> floors;
  for (auto& t : terms) {
    Tensor f = t.value;
    if (is_silu(p.activation) && f.defined())
      for (std::int64_t i = 0; i < f.numel(); ++i) f.set(i, 1.1 * f.at(i));
    floors.push_back(f);
  }
  silu_kappa = 0;
  if (is_silu(p.activation))
    for (std::int64_t i = 0; i < terms[0].value.numel(); ++i)
      silu_kappa = std::max(silu_kappa, terms[0].value.at(i));
  return floors;
}

void soak_short_conv(Context& ctx, Rng& r, bool long_sequence) {
  const ShortConvProblem p = draw_short_conv(ctx, r, long_sequence);
  double kappa = 0;
  check_implementations(
      ctx, r, p, run_short_conv, {Impl::recurrent, Impl::chunk},
      [&](const ShortConvProblem&, DType in) {
        return base_tolerance(in) + (in == DType::float64 ? 1.1e-16 : 6e-8) * kappa;
      },
      [&](const ShortConvProblem& pr, const Results&, DType) {
        return short_conv_terms(pr, kappa);
      });
}

TEST(Soak, ShortConv) {
  soak("ShortConv", [](Context& ctx, Rng& r) { soak_short_conv(ctx, r, false); });
}

TEST(Soak, ShortConvLongSequence) {
  soak(
      "ShortConvLongSequence", [](Context& ctx, Rng& r) { soak_short_conv(ctx, r, true); },
      long_iterations());
}

// ---------------------------------------------------------------------------------------------
// Rotary building blocks (phasor/rotary.h): Selective RoPE phases, RoPE angles, apply_rotary.

struct PhasesProblem {
  std::int64_t B = 1, T = 1, H = 1, R = 1;
  std::vector<std::int64_t> lengths;
  bool shared_omega = false;
  Tensor phi, omega, theta0, cu, d_theta, d_final;
  std::string planted;

  std::int64_t N() const { return lengths.empty() ? B : static_cast<std::int64_t>(lengths.size()); }
  PhasesProblem rounded(DType dtype) const {
    PhasesProblem p = *this;
    for (Tensor* t : {&p.phi, &p.omega, &p.theta0, &p.d_theta, &p.d_final})
      *t = phasor::rounded(*t, dtype);
    return p;
  }
};

PhasesProblem draw_phases(Context& ctx, Rng& r, bool long_sequence) {
  PhasesProblem p;
  if (long_sequence) {
    p.T = long_length();
    p.R = r.pick<std::int64_t>({1, 4});
    if (r.chance(0.5)) p.lengths = long_packed_lengths();
  } else {
    if (r.chance(0.3)) {
      p.lengths = draw_lengths(r, 70);
      p.T = 0;
      for (auto l : p.lengths) p.T += l;
    } else {
      p.B = r.integer(1, 2);
      p.T = draw_length(r, 64);
    }
    p.H = r.integer(1, 3);
    p.R = r.pick<std::int64_t>({1, 2, r.integer(3, 40)});
  }
  p.shared_omega = r.chance(0.5);
  const double mphi = draw_magnitude(r), momega = r.pick({1e-4, 1.0, 1e2});
  p.phi = extreme_values({p.B, p.T, p.H, p.R}, r, mphi);
  p.omega =
      p.shared_omega ? extreme_values({p.R}, r, momega) : extreme_values({p.H, p.R}, r, momega);
  if (r.chance(0.5)) p.theta0 = extreme_values({p.N(), p.H, p.R}, r, draw_magnitude(r));
  if (!p.lengths.empty()) p.cu = testing::cu_seqlens(p.lengths);
  p.d_theta = extreme_values({p.B, p.T, p.H, p.R}, r, draw_magnitude(r, 1e2));
  if (r.chance(0.5)) p.d_final = extreme_values({p.N(), p.H, p.R}, r, 1.0);
  ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " R=" << p.R
                 << (p.lengths.empty() ? "" : " lengths=" + join(p.lengths)) << " |phi|~" << mphi
                 << " |omega|~" << momega << (p.shared_omega ? " shared omega" : "")
                 << (p.theta0.defined() ? " initial_phase" : "")
                 << (p.d_final.defined() ? " d_final_phase" : "");
  return p;
}

Results run_phases(const PhasesProblem& p, Impl impl, DType in, DType out) {
  const auto cast = [&](const Tensor& t) { return t.defined() ? t.to(in) : Tensor(); };
  const Tensor phi = cast(p.phi), omega = cast(p.omega), theta0 = cast(p.theta0),
               d_theta = cast(p.d_theta), d_final = cast(p.d_final);
  RotaryPhaseParams params;
  params.phi = phi.view();
  params.omega = omega.view();
  params.initial_phase = theta0.view();
  params.cu_seqlens = p.cu.view();
  Tensor theta = nan_buffer(p.phi.shape(), out), final_phase = nan_buffer({p.N(), p.H, p.R}, out);
  selective_rope_phases_forward(params, impl, theta.view(), final_phase.view());
  Tensor d_phi = nan_buffer(p.phi.shape(), out), d_omega = nan_buffer(p.omega.shape(), out),
         d_theta0;
  if (p.theta0.defined()) d_theta0 = nan_buffer(p.theta0.shape(), out);
  RotaryPhaseGrads grads;
  grads.d_phi = d_phi.view();
  grads.d_omega = d_omega.view();
  grads.d_initial_phase = d_theta0.view();
  selective_rope_phases_backward(params, impl, d_theta.view(), d_final.view(), grads);
  return {{"theta", theta},
          {"final_phase", final_phase},
          {"d_phi", d_phi},
          {"d_omega", d_omega},
          {"d_initial_phase", d_theta0}};
}

// Sums of products: the reference on |inputs| sums |terms|.
std::vector<Tensor> phases_terms(const PhasesProblem& p, const Results&, DType) {
  PhasesProblem a = p;
  for (Tensor* t : {&a.phi, &a.omega, &a.theta0, &a.d_theta, &a.d_final}) *t = absolute(*t);
  std::vector<Tensor> floors;
  for (auto& t : run_phases(a, Impl::reference, DType::float64, DType::float64))
    floors.push_back(t.value);
  return floors;
}

TEST(Soak, SelectiveRopePhases) {
  soak("SelectiveRopePhases", [](Context& ctx, Rng& r) {
    const PhasesProblem p = draw_phases(ctx, r, false);
    check_implementations(
        ctx, r, p, run_phases, {Impl::recurrent, Impl::chunk},
        [](const PhasesProblem&, DType in) { return base_tolerance(in); }, phases_terms);
  });
}

TEST(Soak, SelectiveRopePhasesLongSequence) {
  soak(
      "SelectiveRopePhasesLongSequence",
      [](Context& ctx, Rng& r) {
        const PhasesProblem p = draw_phases(ctx, r, true);
        check_implementations(
            ctx, r, p, run_phases, {Impl::recurrent, Impl::chunk},
            [](const PhasesProblem&, DType in) { return base_tolerance(in); }, phases_terms);
      },
      long_iterations());
}

// RoPE angles from positions: no floating inputs; extreme offsets, bases and lengths. Each angle
// is formed in float64 and rounded once to theta's dtype, so it is compared to the reference
// within that dtype's rounding.
TEST(Soak, RopeAngles) {
  soak("RopeAngles", [](Context& ctx, Rng& r) {
    RopeAnglesParams params;
    std::vector<std::int64_t> lengths;
    Tensor cu;
    if (r.chance(0.3)) {
      lengths = draw_lengths(r, 70);
      params.T = 0;
      for (auto l : lengths) params.T += l;
      cu = testing::cu_seqlens(lengths);
      params.cu_seqlens = cu.view();
    } else {
      params.B = r.integer(1, 2);
      params.T = r.chance(0.1) ? long_length() : draw_length(r, 64);
    }
    params.head_dim = r.pick<std::int64_t>({2, 4, 2 * r.integer(3, 64)});
    params.base = r.pick({10000.0, 1.0, 1e-3, 1e30, 500000.0});
    params.offset = r.pick<std::int64_t>({0, 1, r.integer(2, 100000), std::int64_t{1} << 40});
    ctx.describe() << "B=" << params.B << " T=" << params.T << " head_dim=" << params.head_dim
                   << " base=" << params.base << " offset=" << params.offset
                   << (lengths.empty() ? "" : " lengths=" + join(lengths));
    const std::vector<std::int64_t> shape{params.B, params.T, params.head_dim / 2};
    Tensor expected = nan_buffer(shape, DType::float64);
    rope_angles(params, Impl::reference, expected.view());
    if (!check_finite(ctx, {{"theta", expected}}, "reference")) return;
    for (Impl impl : {Impl::recurrent, Impl::chunk})
      for (DType out : {DType::float64, DType::float32, DType::bfloat16, DType::float16}) {
        const std::string what = label(impl, out, out);
        ++ctx.stats().runs;
        Tensor theta = nan_buffer(shape, out);
        rope_angles(params, impl, theta.view());
        // float16 cannot hold angles of 65,520 and beyond (65,504 is its largest value; 65,520 is
        // the midpoint, rounded to even: inf): those are inf, as IEEE rounding makes them; every
        // other angle must be the rounded reference. Just below 65,520 either is right: 16-bit
        // outputs are rounded float64 → float32 → 16 bits (as torch's .to()), and 65519.99… is
        // 65,520 in float32.
        const double overflow = out == DType::float16 ? 65520.0 : kInf;
        const double either = out == DType::float16 ? 65520.0 * (1 - 6e-8) : kInf;
        const double bound = out == DType::float64    ? 1e-15
                             : out == DType::float32  ? 6e-8
                             : out == DType::bfloat16 ? 4e-3
                                                      : 5e-4;
        // Below the dtype's normal range the rounding is absolute: half its smallest subnormal.
        const double tiny = out == DType::float64   ? 0.0
                            : out == DType::float16 ? 3e-8
                                                    : 1e-45 * (out == DType::bfloat16 ? 1e5 : 1.0);
        for (std::int64_t i = 0; i < theta.numel(); ++i) {
          const double e = expected.at(i), a = theta.at(i);
          const bool rounded = std::fabs(a - e) <= bound * std::fabs(e) + tiny;
          const bool ok = std::fabs(e) >= overflow ? std::isinf(a)
                          : std::fabs(e) >= either ? std::isinf(a) || rounded
                                                   : rounded;
          if (!ok) {
            ctx.fail(what, ": theta[", i, "] = ", a, ", the reference ", e);
            break;
          }
        }
      }
  });
}

struct RotaryProblem {
  std::int64_t B = 1, T = 1, H = 1, K = 2;
  RotaryLayout layout = RotaryLayout::half_split;
  bool shared_theta = false, in_place = false;
  Tensor x, theta, dy;
  std::string planted;

  RotaryProblem rounded(DType dtype) const {
    RotaryProblem p = *this;
    for (Tensor* t : {&p.x, &p.theta, &p.dy}) *t = phasor::rounded(*t, dtype);
    return p;
  }
};

RotaryProblem draw_rotary(Context& ctx, Rng& r, bool long_sequence) {
  RotaryProblem p;
  p.T = long_sequence ? long_length() : r.pick<std::int64_t>({0, 1, 2, r.integer(3, 80)});
  p.B = long_sequence ? 1 : r.integer(1, 2);
  p.H = long_sequence ? 1 : r.integer(1, 3);
  p.K = 2 * r.pick<std::int64_t>({1, 2, r.integer(3, long_sequence ? 4 : 40)});
  p.layout = r.pick({RotaryLayout::half_split, RotaryLayout::interleaved});
  p.shared_theta = r.chance(0.3);
  p.in_place = r.chance(0.3);
  const double mx = draw_magnitude(r), mtheta = r.pick({3.0, 1e4, 1e8, 1e15});
  p.x = extreme_values({p.B, p.T, p.H, p.K}, r, mx);
  p.theta = extreme_values({p.B, p.T, p.shared_theta ? 1 : p.H, p.K / 2}, r, mtheta);
  p.dy = extreme_values({p.B, p.T, p.H, p.K}, r, draw_magnitude(r, 1e2));
  ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " K=" << p.K << " "
                 << to_string(p.layout) << " |x|~" << mx << " |theta|~" << mtheta
                 << (p.shared_theta ? " theta shared by heads (stride 0)" : "")
                 << (p.in_place ? " in place" : "");
  return p;
}

Results run_rotary(const RotaryProblem& p, Impl impl, DType in, DType out) {
  Tensor x = p.x.to(in), theta = p.theta.to(in), dy = p.dy.to(in);
  TensorView theta_view = theta.view();
  if (p.shared_theta) {  // [B, T, 1, R] seen as [B, T, H, R] with a zero stride over H
    theta_view.sizes[2] = p.H;
    theta_view.strides[2] = 0;
  }
  // In place: y is x itself (then of x's dtype), and dx is dy.
  const bool in_place = p.in_place && in == out;
  Tensor y = in_place ? x : nan_buffer(p.x.shape(), out);
  apply_rotary_forward(x.view(), theta_view, p.layout, impl, in_place ? x.view() : y.view());
  if (in_place) y = x, x = p.x.to(in);
  Tensor dx = in_place ? dy : nan_buffer(p.x.shape(), out),
         d_theta = nan_buffer({p.B, p.T, p.H, p.K / 2}, out);
  apply_rotary_backward(x.view(), theta_view, p.layout, impl, dy.view(),
                        in_place ? dy.view() : dx.view(), d_theta.view());
  if (in_place) dx = dy;
  return {{"y", y}, {"dx", dx}, {"d_theta", d_theta}};
}

// y and dx are rotations: each element's terms are bounded by its pair's norm; dθ = dy_b y_a −
// dy_a y_b by the product of the pairs' norms.
std::vector<Tensor> rotary_terms(const RotaryProblem& p, const Results&, DType) {
  Tensor theta = Tensor::zeros({p.B, p.T, p.H, p.K / 2});  // the heads' angles, for the shapes
  return {pair_norms(p.x, p.layout), pair_norms(p.dy, p.layout),
          rotation_floor(theta, p.x, p.dy, Tensor::zeros({p.B, p.T, p.H, p.K}),
                         Tensor::zeros({p.B, p.T, p.H, p.K}), p.layout)};
}

void soak_rotary(Context& ctx, Rng& r, bool long_sequence) {
  const RotaryProblem p = draw_rotary(ctx, r, long_sequence);
  check_implementations(
      ctx, r, p, run_rotary, {Impl::recurrent, Impl::chunk},
      [](const RotaryProblem&, DType in) { return base_tolerance(in); }, rotary_terms);
}

TEST(Soak, ApplyRotary) {
  soak("ApplyRotary", [](Context& ctx, Rng& r) { soak_rotary(ctx, r, false); });
}

TEST(Soak, ApplyRotaryLongSequence) {
  soak(
      "ApplyRotaryLongSequence", [](Context& ctx, Rng& r) { soak_rotary(ctx, r, true); },
      long_iterations());
}

// ---------------------------------------------------------------------------------------------
// The rotation encodings and FAVOR+: the scale of the errors from the results' sensitivity.
//
// Their results are not sums of products with a sign-free form, and a model of each formula's
// errors would be as long as the kernels. Instead the scale is measured: the float64 reference is
// run again on the inputs perturbed by a relative 1e-6 in random directions, and |Δresult| / 1e-6
// is each result's sensitivity to a relative change of its inputs — the forward error that any
// algorithm with an input-sized backward error makes, times 1/eps (Higham, "Accuracy and Stability
// of Numerical Algorithms", §1.6). A kernel that loses more than its inputs' rounding (an
// unstable formula: 1 − cos x for small x, a cancelling difference of intermediates) fails the
// bound; a problem that is itself ill-conditioned (angles of 1e15 radians, nearly parallel planes)
// gets the large scale it deserves.

// Problems here list their floating inputs (pointers into themselves) with inputs().
template <class Problem>
Problem rounded_inputs(const Problem& p, DType dtype) {
  Problem q = p;
  for (Tensor* t : q.inputs()) *t = rounded(*t, dtype);
  return q;
}

// The perturbation is 1e-13 for float64 runs and 1e-6 for the others: a few hundred times the
// rounding of each, so that the finite difference is not the reference's own noise, and not much
// more (a strongly nonlinear result saturates: beyond some size a perturbation changes it by
// no more than its own magnitude, and the ratio would understate the sensitivity to rounding).
template <class Problem, class Run>
std::vector<Tensor> sensitivity(const Problem& p, Run&& run, const Results& expected, DType in) {
  const double kDelta = in == DType::float64 ? 1e-13 : 1e-6;
  std::vector<Tensor> floors(expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (expected[i].value.defined()) floors[i] = Tensor::zeros(expected[i].value.shape());
  for (std::uint64_t draw = 1; draw <= 2; ++draw) {
    Problem q = p;
    std::mt19937_64 rng(draw);
    std::uniform_real_distribution<double> unit(-1.0, 1.0);
    for (Tensor* t : q.inputs())
      if (t->defined())
        for (std::int64_t i = 0; i < t->numel(); ++i)
          t->set(i, t->at(i) * (1 + kDelta * unit(rng)));
    const Results moved = run(q, Impl::reference, DType::float64, DType::float64);
    for (std::size_t i = 0; i < expected.size(); ++i)
      for (std::int64_t e = 0; floors[i].defined() && e < floors[i].numel(); ++e) {
        const double change = std::fabs(moved[i].value.at(e) - expected[i].value.at(e)) / kDelta;
        floors[i].set(e, std::max(floors[i].at(e), std::isfinite(change) ? change : kInf));
      }
  }
  return floors;
}

// ---------------------------------------------------------------------------------------------
// Multiplicative GRAPE (phasor/grape.h): the single plane and the learned subspace basis.

struct GrapeProblem {
  std::int64_t B = 1, T = 1, H = 1, K = 1;
  bool ab_per_head = false, positions_per_head = false;
  Tensor z, a, b, omega, positions, dy;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&z, &a, &b, &omega, &positions, &dy}; }
  GrapeProblem rounded(DType dtype) const { return rounded_inputs(*this, dtype); }
};

GrapeProblem draw_grape(Context& ctx, Rng& r, bool long_sequence) {
  GrapeProblem p;
  p.T = long_sequence ? long_length() : r.pick<std::int64_t>({0, 1, 2, r.integer(3, 80)});
  p.B = long_sequence ? 1 : r.integer(1, 2);
  p.H = long_sequence ? 1 : r.integer(1, 3);
  p.K = r.pick<std::int64_t>({1, 2, 3, r.integer(4, long_sequence ? 4 : 40)});
  p.ab_per_head = r.chance(0.5);
  p.positions_per_head = r.chance(0.5);
  const std::vector<std::int64_t> ab_shape =
      p.ab_per_head ? std::vector<std::int64_t>{p.H, p.K} : std::vector<std::int64_t>{p.K};
  const double mz = draw_magnitude(r), ma = r.pick({1e-4, 1.0, 1e4}), mb = r.pick({1e-4, 1.0, 1e4});
  const double mpos = r.pick({1.0, 1e4, long_sequence ? 65536.0 : 80.0}),
               momega = r.pick({1e-3, 1.0, 1e2});
  p.z = extreme_values({p.B, p.T, p.H, p.K}, r, mz);
  p.a = extreme_values(ab_shape, r, ma);
  p.b = extreme_values(ab_shape, r, mb);
  // Degenerate planes: b parallel to a (ν = 0 exactly, G = I), nearly parallel, or a = 0.
  const int plane = static_cast<int>(r.integer(0, 5));
  if (plane == 0 || plane == 1)
    for (std::int64_t i = 0; i < p.b.numel(); ++i)
      p.b.set(i, 3.0 * p.a.at(i) + (plane == 1 ? 1e-7 * ma * r.normal() : 0.0));
  if (plane == 2) p.a.fill(0.0);
  p.omega = extreme_values({p.H}, r, momega);
  p.positions = extreme_values(p.positions_per_head ? std::vector<std::int64_t>{p.B, p.T, p.H}
                                                    : std::vector<std::int64_t>{p.B, p.T},
                               r, mpos);
  p.dy = extreme_values({p.B, p.T, p.H, p.K}, r, draw_magnitude(r, 1e2));
  ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " K=" << p.K
                 << (p.ab_per_head ? " a,b per head" : " a,b shared")
                 << (p.positions_per_head ? " positions per head" : "") << " |z|~" << mz << " |a|~"
                 << ma << " |b|~" << mb << " plane=" << plane << " |positions|~" << mpos
                 << " |omega|~" << momega;
  return p;
}

Results run_grape(const GrapeProblem& p, Impl impl, DType in, DType out) {
  const Tensor z = p.z.to(in), a = p.a.to(in), b = p.b.to(in), omega = p.omega.to(in),
               positions = p.positions.to(in), dy = p.dy.to(in);
  GrapeParams params;
  params.z = z.view();
  params.a = a.view();
  params.b = b.view();
  params.omega = omega.view();
  params.positions = positions.view();
  Tensor y = nan_buffer(p.z.shape(), out);
  grape_forward(params, impl, y.view());
  Tensor dz = nan_buffer(p.z.shape(), out), da = nan_buffer(p.a.shape(), out),
         db = nan_buffer(p.b.shape(), out), d_omega = nan_buffer(p.omega.shape(), out),
         d_positions = nan_buffer(p.positions.shape(), out);
  GrapeGrads grads;
  grads.dz = dz.view();
  grads.da = da.view();
  grads.db = db.view();
  grads.d_omega = d_omega.view();
  grads.d_positions = d_positions.view();
  grape_backward(params, impl, dy.view(), grads);
  return {{"y", y},   {"dz", dz},           {"da", da},
          {"db", db}, {"d_omega", d_omega}, {"d_positions", d_positions}};
}

// The larger of two scales per element: `floors` and `more` (undefined: none).
void take_larger(std::vector<Tensor>& floors, const std::vector<Tensor>& more) {
  for (std::size_t i = 0; i < floors.size() && i < more.size(); ++i) {
    if (!more[i].defined()) continue;
    if (!floors[i].defined()) {
      floors[i] = more[i];
      continue;
    }
    for (std::int64_t e = 0; e < floors[i].numel(); ++e)
      floors[i].set(e, std::max(floors[i].at(e), more[i].at(e)));
  }
}

// The terms of GRAPE's formulas, for results that vanish identically (K = 1 has no plane: y = z
// and the gradients of a, b, ω and the positions are 0 for every input, so their sensitivity is 0
// while a kernel's rounding is not). With the orthogonalised plane the Rodrigues terms of y and dz
// are at most a few |z| and |dy| (A ν ≤ 1, C ν² ≤ 2); dη's at most 4 ν |dy||z| ≤ 4 |a||b||dy||z|;
// the generator's gradient M = ∂(dyᵀy)/∂L at most a few |η||dy||z|, so da = (M − Mᵀ) b and db by
// 8 |η||dy||z||b| and |a|. Each row's bound is spread evenly over its elements.
std::vector<Tensor> grape_terms(const GrapeProblem& p) {
  const std::int64_t B = p.B, T = p.T, H = p.H, K = p.K;
  Tensor f_y = Tensor::zeros(p.z.shape()), f_dz = Tensor::zeros(p.z.shape()),
         f_da = Tensor::zeros(p.a.shape()), f_db = Tensor::zeros(p.b.shape()),
         f_omega = Tensor::zeros(p.omega.shape()), f_pos = Tensor::zeros(p.positions.shape());
  const auto norm = [&](const Tensor& x, std::int64_t base) {
    double s = 0;
    for (std::int64_t c = 0; c < K; ++c) s += x.at(base + c) * x.at(base + c);
    return std::sqrt(s);
  };
  const double root_k = std::sqrt(static_cast<double>(K));
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t ab = p.ab_per_head ? h * K : 0;
    const double na = norm(p.a, ab), nb = norm(p.b, ab), w = p.omega.at(h);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t row = ((b * T + t) * H + h) * K,
                           pos = p.positions_per_head ? (b * T + t) * H + h : b * T + t;
        const double eta = p.positions.at(pos) * w, nz = norm(p.z, row), ng = norm(p.dy, row);
        const double d_eta = 4 * na * nb * ng * nz, m = 8 * std::fabs(eta) * ng * nz;
        for (std::int64_t c = 0; c < K; ++c) {
          f_y.set(row + c, nz / root_k);
          f_dz.set(row + c, ng / root_k);
          f_da.set(ab + c, f_da.at(ab + c) + m * nb / root_k);
          f_db.set(ab + c, f_db.at(ab + c) + m * na / root_k);
        }
        f_omega.set(h, f_omega.at(h) + d_eta * std::fabs(p.positions.at(pos)));
        f_pos.set(pos, f_pos.at(pos) + d_eta * std::fabs(w));
      }
  }
  return {f_y, f_dz, f_da, f_db, f_omega, f_pos};
}

void soak_grape(Context& ctx, Rng& r, bool long_sequence) {
  const GrapeProblem p = draw_grape(ctx, r, long_sequence);
  check_implementations(
      ctx, r, p, run_grape, {Impl::recurrent, Impl::chunk},
      [](const GrapeProblem&, DType in) { return base_tolerance(in); },
      [](const GrapeProblem& pr, const Results& expected, DType in) {
        std::vector<Tensor> floors = sensitivity(pr, run_grape, expected, in);
        take_larger(floors, grape_terms(pr));
        return floors;
      });
}

TEST(Soak, Grape) {
  soak("Grape", [](Context& ctx, Rng& r) { soak_grape(ctx, r, false); });
}

TEST(Soak, GrapeLongSequence) {
  soak(
      "GrapeLongSequence", [](Context& ctx, Rng& r) { soak_grape(ctx, r, true); },
      long_iterations());
}

// A random orthogonal K × K matrix (rows of `m` from offset), by Gram–Schmidt twice over Gaussian
// columns, in float64.
void random_orthogonal(Tensor& m, std::int64_t offset, std::int64_t K, Rng& r) {
  std::vector<double> q(static_cast<std::size_t>(K * K));
  for (auto& x : q) x = r.normal();
  for (int pass = 0; pass < 2; ++pass)
    for (std::int64_t j = 0; j < K; ++j) {
      for (std::int64_t i = 0; i < j; ++i) {
        double d = 0;
        for (std::int64_t row = 0; row < K; ++row)
          d += q[static_cast<std::size_t>(row * K + i)] * q[static_cast<std::size_t>(row * K + j)];
        for (std::int64_t row = 0; row < K; ++row)
          q[static_cast<std::size_t>(row * K + j)] -= d * q[static_cast<std::size_t>(row * K + i)];
      }
      double n = 0;
      for (std::int64_t row = 0; row < K; ++row)
        n += q[static_cast<std::size_t>(row * K + j)] * q[static_cast<std::size_t>(row * K + j)];
      n = std::sqrt(n);
      for (std::int64_t row = 0; row < K; ++row) q[static_cast<std::size_t>(row * K + j)] /= n;
    }
  for (std::int64_t i = 0; i < K * K; ++i) m.set(offset + i, q[static_cast<std::size_t>(i)]);
}

struct GrapeSubspaceProblem {
  std::int64_t B = 1, T = 1, H = 1, K = 2;
  bool per_head = false;
  RotaryLayout layout = RotaryLayout::half_split;
  double orthogonality_tol = 1e-4;
  Tensor z, basis, theta, dy;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&z, &basis, &theta, &dy}; }
  // A 16-bit basis is orthogonal only to its rounding (~1e-3): checked to 1e-2 there.
  GrapeSubspaceProblem rounded(DType dtype) const {
    GrapeSubspaceProblem p = rounded_inputs(*this, dtype);
    if (planted.empty() && (dtype == DType::bfloat16 || dtype == DType::float16))
      p.orthogonality_tol = 1e-2;
    return p;
  }
};

GrapeSubspaceProblem draw_grape_subspace(Context& ctx, Rng& r) {
  GrapeSubspaceProblem p;
  p.T = r.pick<std::int64_t>({0, 1, 2, r.integer(3, 80)});
  p.B = r.integer(1, 2);
  p.H = r.integer(1, 3);
  p.K = 2 * r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
  p.per_head = r.chance(0.5);
  p.layout = r.pick({RotaryLayout::half_split, RotaryLayout::interleaved});
  const double mz = draw_magnitude(r), mtheta = r.pick({3.0, 1e4, 1e8});
  p.z = extreme_values({p.B, p.T, p.H, p.K}, r, mz);
  p.basis =
      p.per_head ? Tensor({p.H, p.K, p.K}, DType::float64) : Tensor({p.K, p.K}, DType::float64);
  for (std::int64_t h = 0; h < (p.per_head ? p.H : 1); ++h)
    random_orthogonal(p.basis, h * p.K * p.K, p.K, r);
  p.theta = extreme_values({p.B, p.T, p.H, p.K / 2}, r, mtheta);
  p.dy = extreme_values({p.B, p.T, p.H, p.K}, r, draw_magnitude(r, 1e2));
  // A basis off the orthogonal group must be refused, naming it.
  if (r.chance(0.08)) {
    p.basis.set(0, p.basis.at(0) + 0.01);
    p.planted = "basis";
  }
  ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " K=" << p.K
                 << (p.per_head ? " basis per head" : " shared basis") << " " << to_string(p.layout)
                 << " |z|~" << mz << " |theta|~" << mtheta
                 << (p.planted.empty() ? "" : " planted invalid " + p.planted);
  return p;
}

Results run_grape_subspace(const GrapeSubspaceProblem& p, Impl impl, DType in, DType out) {
  const Tensor z = p.z.to(in), basis = p.basis.to(in), theta = p.theta.to(in), dy = p.dy.to(in);
  GrapeSubspaceParams params;
  params.z = z.view();
  params.basis = basis.view();
  params.theta = theta.view();
  params.layout = p.layout;
  params.orthogonality_tol = p.orthogonality_tol;
  Tensor y = nan_buffer(p.z.shape(), out);
  grape_subspace_forward(params, impl, y.view());
  Tensor dz = nan_buffer(p.z.shape(), out), d_basis = nan_buffer(p.basis.shape(), out),
         d_theta = nan_buffer(p.theta.shape(), out);
  GrapeSubspaceGrads grads;
  grads.dz = dz.view();
  grads.d_basis = d_basis.view();
  grads.d_theta = d_theta.view();
  grape_subspace_backward(params, impl, dy.view(), grads);
  return {{"y", y}, {"dz", dz}, {"d_basis", d_basis}, {"d_theta", d_theta}};
}

TEST(Soak, GrapeSubspace) {
  soak("GrapeSubspace", [](Context& ctx, Rng& r) {
    const GrapeSubspaceProblem p = draw_grape_subspace(ctx, r);
    check_implementations(
        ctx, r, p, run_grape_subspace, {Impl::recurrent, Impl::chunk},
        [](const GrapeSubspaceProblem&, DType in) { return base_tolerance(in); },
        [](const GrapeSubspaceProblem& pr, const Results& expected, DType in) {
          return sensitivity(pr, run_grape_subspace, expected, in);
        });
  });
}

// ---------------------------------------------------------------------------------------------
// STRING (phasor/string_rotation.h): N-d RoPE angles, Cayley-STRING, Circulant-STRING.

struct NdRopeProblem {
  std::int64_t B = 1, T = 1, H = 1, C = 1, R = 1;
  bool per_head = false;
  Tensor positions, omega, d_theta;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&positions, &omega, &d_theta}; }
  NdRopeProblem rounded(DType dtype) const { return rounded_inputs(*this, dtype); }
  std::vector<std::int64_t> theta_shape() const {
    return per_head ? std::vector<std::int64_t>{B, T, H, R} : std::vector<std::int64_t>{B, T, R};
  }
};

Results run_nd_rope(const NdRopeProblem& p, Impl impl, DType in, DType out) {
  const Tensor positions = p.positions.to(in), omega = p.omega.to(in), d_theta = p.d_theta.to(in);
  Tensor theta = nan_buffer(p.theta_shape(), out);
  nd_rope_angles_forward(positions.view(), omega.view(), impl, theta.view());
  Tensor d_positions = nan_buffer(p.positions.shape(), out),
         d_omega = nan_buffer(p.omega.shape(), out);
  nd_rope_angles_backward(positions.view(), omega.view(), impl, d_theta.view(), d_positions.view(),
                          d_omega.view());
  return {{"theta", theta}, {"d_positions", d_positions}, {"d_omega", d_omega}};
}

TEST(Soak, NdRopeAngles) {
  soak("NdRopeAngles", [](Context& ctx, Rng& r) {
    NdRopeProblem p;
    p.T = r.chance(0.05) ? long_length() : r.pick<std::int64_t>({0, 1, 2, r.integer(3, 80)});
    p.B = p.T == long_length() ? 1 : r.integer(1, 2);
    p.H = r.integer(1, 3);
    p.C = r.pick<std::int64_t>({1, 2, 3});
    p.R = r.pick<std::int64_t>({1, 2, r.integer(3, p.T == long_length() ? 4 : 32)});
    p.per_head = r.chance(0.5);
    const double mpos = r.pick({1.0, 1e4, 1e6}), momega = r.pick({1e-4, 1.0, 1e2});
    p.positions = extreme_values({p.B, p.T, p.C}, r, mpos);
    p.omega = p.per_head ? extreme_values({p.H, p.C, p.R}, r, momega)
                         : extreme_values({p.C, p.R}, r, momega);
    p.d_theta = extreme_values(p.theta_shape(), r, draw_magnitude(r, 1e2));
    ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " C=" << p.C << " R=" << p.R
                   << (p.per_head ? " omega per head" : " shared omega") << " |positions|~" << mpos
                   << " |omega|~" << momega;
    // Sums of products: the reference on |inputs| sums |terms|.
    check_implementations(
        ctx, r, p, run_nd_rope, {Impl::recurrent, Impl::chunk},
        [](const NdRopeProblem&, DType in) { return base_tolerance(in); },
        [](const NdRopeProblem& pr, const Results&, DType) {
          NdRopeProblem a = pr;
          for (Tensor* t : a.inputs()) *t = absolute(*t);
          std::vector<Tensor> floors;
          for (auto& t : run_nd_rope(a, Impl::reference, DType::float64, DType::float64))
            floors.push_back(t.value);
          return floors;
        });
  });
}

struct CayleyStringProblem {
  std::int64_t B = 1, T = 1, H = 1, C = 1, K = 2;
  bool omega_per_head = false, generator_per_head = false;
  RotaryLayout layout = RotaryLayout::half_split;
  Tensor z, positions, omega, generator, dy;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&z, &positions, &omega, &generator, &dy}; }
  CayleyStringProblem rounded(DType dtype) const { return rounded_inputs(*this, dtype); }
};

Results run_cayley_string(const CayleyStringProblem& p, Impl impl, DType in, DType out) {
  const Tensor z = p.z.to(in), positions = p.positions.to(in), omega = p.omega.to(in),
               generator = p.generator.to(in), dy = p.dy.to(in);
  CayleyStringParams params;
  params.z = z.view();
  params.positions = positions.view();
  params.omega = omega.view();
  params.generator = generator.view();
  params.layout = p.layout;
  Tensor y = nan_buffer(p.z.shape(), out);
  cayley_string_forward(params, impl, y.view());
  Tensor dz = nan_buffer(p.z.shape(), out), d_positions = nan_buffer(p.positions.shape(), out),
         d_omega = nan_buffer(p.omega.shape(), out),
         d_generator = nan_buffer(p.generator.shape(), out);
  CayleyStringGrads grads;
  grads.dz = dz.view();
  grads.d_positions = d_positions.view();
  grads.d_omega = d_omega.view();
  grads.d_generator = d_generator.view();
  cayley_string_backward(params, impl, dy.view(), grads);
  return {{"y", y},
          {"dz", dz},
          {"d_positions", d_positions},
          {"d_omega", d_omega},
          {"d_generator", d_generator}};
}

TEST(Soak, CayleyString) {
  soak("CayleyString", [](Context& ctx, Rng& r) {
    CayleyStringProblem p;
    p.T = r.pick<std::int64_t>({0, 1, 2, r.integer(3, 60)});
    p.B = r.integer(1, 2);
    p.H = r.integer(1, 3);
    p.C = r.pick<std::int64_t>({1, 2, 3});
    p.K = 2 * r.pick<std::int64_t>({1, 2, r.integer(3, 12)});
    p.omega_per_head = r.chance(0.5);
    p.generator_per_head = r.chance(0.5);
    p.layout = r.pick({RotaryLayout::half_split, RotaryLayout::interleaved});
    const double mz = draw_magnitude(r), mpos = r.pick({1.0, 1e4}),
                 momega = r.pick({1e-4, 1.0, 1e2}), mgen = r.pick({0.0, 1e-4, 1.0, 1e4});
    p.z = extreme_values({p.B, p.T, p.H, p.K}, r, mz);
    p.positions = extreme_values({p.B, p.T, p.C}, r, mpos);
    p.omega = p.omega_per_head ? extreme_values({p.H, p.C, p.K / 2}, r, momega)
                               : extreme_values({p.C, p.K / 2}, r, momega);
    p.generator = p.generator_per_head ? extreme_values({p.H, p.K, p.K}, r, mgen)
                                       : extreme_values({p.K, p.K}, r, mgen);
    p.dy = extreme_values({p.B, p.T, p.H, p.K}, r, draw_magnitude(r, 1e2));
    ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " C=" << p.C << " K=" << p.K
                   << " " << to_string(p.layout) << (p.omega_per_head ? " omega per head" : "")
                   << (p.generator_per_head ? " generator per head" : "") << " |z|~" << mz
                   << " |positions|~" << mpos << " |omega|~" << momega << " |A|~" << mgen;
    check_implementations(
        ctx, r, p, run_cayley_string, {Impl::recurrent, Impl::chunk},
        [](const CayleyStringProblem&, DType in) { return base_tolerance(in); },
        [](const CayleyStringProblem& pr, const Results& expected, DType in) {
          return sensitivity(pr, run_cayley_string, expected, in);
        });
  });
}

struct CirculantStringProblem {
  std::int64_t B = 1, T = 1, H = 1, C = 1, K = 1;
  bool per_head = false;
  Tensor z, positions, c, dy;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&z, &positions, &c, &dy}; }
  CirculantStringProblem rounded(DType dtype) const { return rounded_inputs(*this, dtype); }
};

Results run_circulant_string(const CirculantStringProblem& p, Impl impl, DType in, DType out) {
  const Tensor z = p.z.to(in), positions = p.positions.to(in), c = p.c.to(in), dy = p.dy.to(in);
  CirculantStringParams params;
  params.z = z.view();
  params.positions = positions.view();
  params.c = c.view();
  Tensor y = nan_buffer(p.z.shape(), out);
  circulant_string_forward(params, impl, y.view());
  Tensor dz = nan_buffer(p.z.shape(), out), d_positions = nan_buffer(p.positions.shape(), out),
         dc = nan_buffer(p.c.shape(), out);
  CirculantStringGrads grads;
  grads.dz = dz.view();
  grads.d_positions = d_positions.view();
  grads.dc = dc.view();
  circulant_string_backward(params, impl, dy.view(), grads);
  return {{"y", y}, {"dz", dz}, {"d_positions", d_positions}, {"dc", dc}};
}

TEST(Soak, CirculantString) {
  soak("CirculantString", [](Context& ctx, Rng& r) {
    CirculantStringProblem p;
    p.T = r.pick<std::int64_t>({0, 1, 2, r.integer(3, 60)});
    p.B = r.integer(1, 2);
    p.H = r.integer(1, 3);
    p.C = r.pick<std::int64_t>({1, 2, 3});
    p.K = r.pick<std::int64_t>({1, 2, 3, r.integer(4, 33)});
    p.per_head = r.chance(0.5);
    const double mz = draw_magnitude(r), mpos = r.pick({1.0, 1e4}),
                 mc = r.pick({0.0, 1e-4, 1.0, 1e2});
    p.z = extreme_values({p.B, p.T, p.H, p.K}, r, mz);
    p.positions = extreme_values({p.B, p.T, p.C}, r, mpos);
    p.c = p.per_head ? extreme_values({p.H, p.C, p.K}, r, mc) : extreme_values({p.C, p.K}, r, mc);
    p.dy = extreme_values({p.B, p.T, p.H, p.K}, r, draw_magnitude(r, 1e2));
    ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " C=" << p.C << " K=" << p.K
                   << (p.per_head ? " c per head" : " shared c") << " |z|~" << mz << " |positions|~"
                   << mpos << " |c|~" << mc;
    check_implementations(
        ctx, r, p, run_circulant_string, {Impl::recurrent, Impl::chunk},
        [](const CirculantStringProblem&, DType in) { return base_tolerance(in); },
        [](const CirculantStringProblem& pr, const Results& expected, DType in) {
          return sensitivity(pr, run_circulant_string, expected, in);
        });
  });
}

// ---------------------------------------------------------------------------------------------
// Equivariant structured rotations (phasor/structured_rotation.h).

// m orthonormal columns of a random orthogonal K × K matrix, as [K, m].
Tensor orthonormal_columns(std::int64_t K, std::int64_t m, Rng& r) {
  Tensor full({K, K}, DType::float64);
  random_orthogonal(full, 0, K, r);
  Tensor cols({K, m}, DType::float64);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < m; ++j) cols.set(i * m + j, full.at(i * K + j));
  return cols;
}

struct StructuredProblem {
  std::int64_t B = 1, T = 1, H = 1, K = 1, C = 1, m = 0;
  bool shared_positions = false;
  Tensor x, positions, basis, coefficients, post_rotation, dy;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&x, &positions, &coefficients, &dy}; }
  // The basis (and P) stay float32 for 16-bit runs: their orthonormality is checked to 1e-4, which
  // a 16-bit rounding would break (the op takes mixed dtypes).
  StructuredProblem rounded(DType dtype) const {
    StructuredProblem p = rounded_inputs(*this, dtype);
    const DType matrices = dtype == DType::float64 ? DType::float64 : DType::float32;
    p.basis = phasor::rounded(basis, matrices);
    p.post_rotation = phasor::rounded(post_rotation, matrices);
    return p;
  }
};

Results run_structured(const StructuredProblem& p, Impl impl, DType in, DType out) {
  const DType matrices = in == DType::float64 ? DType::float64 : DType::float32;
  const Tensor x = p.x.to(in), positions = p.positions.to(in), basis = p.basis.to(matrices),
               coefficients = p.coefficients.to(in), dy = p.dy.to(in),
               post = p.post_rotation.defined() ? p.post_rotation.to(matrices) : Tensor();
  StructuredRotationParams params;
  params.x = x.view();
  params.positions = positions.view();
  if (p.shared_positions) {  // [B, T, 1, C] seen as [B, T, H, C] with a zero stride over H
    params.positions.sizes[2] = p.H;
    params.positions.strides[2] = 0;
  }
  params.basis = basis.view();
  params.coefficients = coefficients.view();
  params.post_rotation = post.view();
  Tensor y = nan_buffer(p.x.shape(), out);
  structured_rotation_forward(params, impl, y.view());
  Tensor dx = nan_buffer(p.x.shape(), out), d_positions = nan_buffer({p.B, p.T, p.H, p.C}, out),
         d_coefficients = nan_buffer(p.coefficients.shape(), out), d_post;
  if (post.defined()) d_post = nan_buffer({p.K, p.K}, out);
  StructuredRotationGrads grads;
  grads.dx = dx.view();
  grads.d_positions = d_positions.view();
  grads.d_coefficients = d_coefficients.view();
  grads.d_post_rotation = d_post.view();
  structured_rotation_backward(params, impl, dy.view(), grads);
  return {{"y", y},
          {"dx", dx},
          {"d_positions", d_positions},
          {"d_coefficients", d_coefficients},
          {"d_post_rotation", d_post}};
}

TEST(Soak, StructuredRotation) {
  soak("StructuredRotation", [](Context& ctx, Rng& r) {
    StructuredProblem p;
    p.T = r.chance(0.05) ? long_length() : r.pick<std::int64_t>({0, 1, 2, r.integer(3, 80)});
    p.B = p.T == long_length() ? 1 : r.integer(1, 2);
    p.H = p.T == long_length() ? 1 : r.integer(1, 3);
    p.K = r.pick<std::int64_t>({1, 2, 3, r.integer(4, p.T == long_length() ? 4 : 16)});
    p.C = r.pick<std::int64_t>({1, 2, 3});
    p.m = r.integer(0, p.K / 2);
    p.shared_positions = r.chance(0.3);
    const double mx = draw_magnitude(r), mpos = r.pick({1.0, 1e4}),
                 mcoef = r.pick({0.0, 1e-4, 1.0, 1e4});
    p.x = extreme_values({p.B, p.T, p.H, p.K}, r, mx);
    p.positions = extreme_values({p.B, p.T, p.shared_positions ? 1 : p.H, p.C}, r, mpos);
    p.basis = orthonormal_columns(p.K, 2 * p.m, r);
    p.coefficients = extreme_values({p.C, p.m}, r, mcoef);
    if (r.chance(0.5)) {
      p.post_rotation = Tensor({p.K, p.K}, DType::float64);
      random_orthogonal(p.post_rotation, 0, p.K, r);
    }
    p.dy = extreme_values({p.B, p.T, p.H, p.K}, r, draw_magnitude(r, 1e2));
    if (p.m > 0 && r.chance(0.08)) {  // columns off orthonormal must be refused, naming the basis
      p.basis.set(0, p.basis.at(0) + 0.01);
      p.planted = "basis";
    }
    ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " K=" << p.K << " C=" << p.C
                   << " m=" << p.m << (p.shared_positions ? " positions shared (stride 0)" : "")
                   << " |x|~" << mx << " |positions|~" << mpos << " |coefficients|~" << mcoef
                   << (p.post_rotation.defined() ? " post_rotation" : "")
                   << (p.planted.empty() ? "" : " planted invalid " + p.planted);
    // With shared positions d_positions is per head (the caller sums): compare as it is.
    check_implementations(
        ctx, r, p, run_structured, {Impl::recurrent, Impl::chunk},
        [](const StructuredProblem&, DType in) { return base_tolerance(in); },
        [](const StructuredProblem& pr, const Results& expected, DType in) {
          return sensitivity(pr, run_structured, expected, in);
        });
  });
}

// The decomposition of commuting generators L_k = U (⊕_p λ_kp J ⊕ 0) Uᵀ built from a random U and
// extreme λ (tiny, huge, zero planes, repeated planes): it succeeds with finite outputs that
// reconstruct every L_k, an orthogonal U and m = the number of planes with a λ above the
// tolerance; or it names 'generators'. Non-commuting generators must be refused, naming them.
TEST(Soak, StructuredDecomposition) {
  soak("StructuredDecomposition", [](Context& ctx, Rng& r) {
    const std::int64_t K = r.pick<std::int64_t>({1, 2, 3, r.integer(4, 12)}),
                       C = r.pick<std::int64_t>({1, 2, 3});
    const std::int64_t planes = r.integer(0, K / 2);
    const double scale = r.pick({1e-6, 1.0, 1e6});
    Tensor U({K, K}, DType::float64);
    random_orthogonal(U, 0, K, r);
    std::vector<double> lambda(static_cast<std::size_t>(C * planes));
    const int kind = static_cast<int>(r.integer(0, 3));
    for (std::int64_t k = 0; k < C; ++k)
      for (std::int64_t q = 0; q < planes; ++q) {
        double v = scale * r.normal();
        if (kind == 1 && q > 0) v = lambda[static_cast<std::size_t>(k * planes)];  // repeated
        if (kind == 2 && q == planes - 1) v = 0;                                   // a zero plane
        if (kind == 3) v *= std::pow(10.0, r.uniform(-4, 4));                      // spread
        lambda[static_cast<std::size_t>(k * planes + q)] = v;
      }
    Tensor L = Tensor::zeros({C, K, K});
    for (std::int64_t k = 0; k < C; ++k)
      for (std::int64_t q = 0; q < planes; ++q) {
        const double l = lambda[static_cast<std::size_t>(k * planes + q)];
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < K; ++j) {
            const double ua_i = U.at(i * K + 2 * q), ub_i = U.at(i * K + 2 * q + 1),
                         ua_j = U.at(j * K + 2 * q), ub_j = U.at(j * K + 2 * q + 1);
            // λ (u_b u_aᵀ − u_a u_bᵀ): the plane's J = [[0, −1], [1, 0]] in the basis U.
            L.set((k * K + i) * K + j, L.at((k * K + i) * K + j) + l * (ub_i * ua_j - ua_i * ub_j));
          }
      }
    std::string planted;
    if (K >= 3 && r.chance(0.1)) {  // a non-commuting pair
      L.set(0 * K * K + 0 * K + 1, L.at(1) + scale);
      L.set(0 * K * K + 1 * K + 0, L.at(K) - scale);
      L.set(((C > 1 ? 1 : 0) * K + 1) * K + 2, L.at(((C > 1 ? 1 : 0) * K + 1) * K + 2) + 2 * scale);
      L.set(((C > 1 ? 1 : 0) * K + 2) * K + 1, L.at(((C > 1 ? 1 : 0) * K + 2) * K + 1) - 2 * scale);
      if (C > 1) planted = "generators";
    }
    ctx.describe() << "K=" << K << " C=" << C << " planes=" << planes << " scale=" << scale
                   << " kind=" << kind << (planted.empty() ? "" : " planted invalid " + planted);
    for (DType dtype : {DType::float64, DType::float32}) {
      const Tensor gens = L.to(dtype);
      Tensor basis = nan_buffer({K, K}, dtype), coefficients = nan_buffer({C, K / 2}, dtype),
             active = nan_buffer({K, K}, dtype), null = nan_buffer({K, K}, dtype);
      StructuredDecompositionParams params;
      params.generators = gens.view();
      if (dtype == DType::float32) params.tolerance = 1e-5;
      StructuredDecompositionOutputs outputs;
      outputs.basis = basis.view();
      outputs.coefficients = coefficients.view();
      outputs.active_projector = active.view();
      outputs.null_projector = null.view();
      std::int64_t m = -1;
      const std::string what = std::string("structured_decomposition ") + to_string(dtype);
      ++ctx.stats().runs;
      try {
        m = structured_decomposition(params, outputs);
        if (!planted.empty()) ctx.fail(what, ": no error for the invalid '", planted, "'");
      } catch (const Error& e) {
        const std::string message = e.what();
        if (message.find("argument '") == std::string::npos)
          ctx.fail(what, ": the error names no argument: ", message);
        else if (!planted.empty() && message.find("'" + planted + "'") != std::string::npos)
          ++ctx.stats().planted_errors;
        else if (planted.empty())
          ctx.fail(what, ": unexpected error on commuting generators: ", message);
        continue;
      }
      if (!check_finite(ctx,
                        {{"basis", basis},
                         {"coefficients", coefficients},
                         {"active_projector", active},
                         {"null_projector", null}},
                        what) ||
          !planted.empty())
        continue;
      // Reconstruction: L_k = U (⊕ λ_kp J) Uᵀ to the tolerance the op promises (relative to s).
      double s_norm = 0, worst = 0, orth = 0;
      for (std::int64_t k = 0; k < C; ++k) {
        double f = 0;
        for (std::int64_t i = 0; i < K * K; ++i)
          f += gens.at(k * K * K + i) * gens.at(k * K * K + i);
        s_norm = std::max(s_norm, std::sqrt(f));
      }
      for (std::int64_t k = 0; k < C; ++k) {
        double err = 0;
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < K; ++j) {
            double rec = 0;
            for (std::int64_t q = 0; q < m; ++q) {
              const double l = coefficients.at(k * (K / 2) + q);
              rec += l * (basis.at(i * K + 2 * q + 1) * basis.at(j * K + 2 * q) -
                          basis.at(i * K + 2 * q) * basis.at(j * K + 2 * q + 1));
            }
            const double d = rec - gens.at((k * K + i) * K + j);
            err += d * d;
          }
        worst = std::max(worst, std::sqrt(err));
      }
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < K; ++j) {
          double d = i == j ? -1.0 : 0.0;
          for (std::int64_t row = 0; row < K; ++row)
            d += basis.at(row * K + i) * basis.at(row * K + j);
          orth = std::max(orth, std::fabs(d));
        }
      const double tol = dtype == DType::float64 ? 1e-7 : 1e-3;
      if (!(worst <= tol * s_norm) && s_norm > 0)
        ctx.fail(what, ": reconstruction error ", worst, " > ", tol, " × ", s_norm, " (m = ", m,
                 ")");
      if (!(orth <= (dtype == DType::float64 ? 1e-12 : 1e-5)))
        ctx.fail(what, ": max |UᵀU − I| = ", orth);
    }
  });
}

// The Cayley post-rotation P = (I − S)(I + S)⁻¹ of a skew S with extreme entries, on all of R^K or
// on the null space of a basis: P finite and orthogonal (it is exactly, for skew S), and its
// backward finite.
TEST(Soak, StructuredCayley) {
  soak("StructuredCayley", [](Context& ctx, Rng& r) {
    const std::int64_t K = r.pick<std::int64_t>({1, 2, 3, r.integer(4, 16)});
    const std::int64_t n = r.chance(0.5) ? K : r.integer(0, K);
    const double ms = r.pick({0.0, 1e-6, 1.0, 1e4, 1e8});
    Tensor W = extreme_values({n, n}, r, ms), S = Tensor::zeros({n, n});
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) S.set(i * n + j, W.at(i * n + j) - W.at(j * n + i));
    const Tensor null_basis = n < K ? orthonormal_columns(K, n, r) : Tensor();
    const Tensor dP = extreme_values({K, K}, r, draw_magnitude(r, 1e2));
    ctx.describe() << "K=" << K << " n=" << n << " |S|~" << ms
                   << (null_basis.defined() ? " null_basis" : "");
    for (DType dtype : {DType::float64, DType::float32}) {
      const std::string what = std::string("structured_cayley ") + to_string(dtype);
      const Tensor s = S.to(dtype), nb = null_basis.defined() ? null_basis.to(dtype) : Tensor(),
                   dp = dP.to(dtype);
      Tensor P = nan_buffer({K, K}, dtype), ds = nan_buffer({n, n}, dtype);
      ctx.stats().runs += 2;
      const auto attempt_call = [&](auto&& call) {
        try {
          call();
          return true;
        } catch (const Error& e) {
          ctx.fail(what, ": unexpected error: ", e.what());
          return false;
        }
      };
      if (!attempt_call([&] { structured_cayley_forward(s.view(), nb.view(), P.view()); }) ||
          !attempt_call(
              [&] { structured_cayley_backward(s.view(), nb.view(), dp.view(), ds.view()); }))
        continue;
      if (!check_finite(ctx, {{"p", P}, {"ds", ds}}, what)) continue;
      double orth = 0;
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < K; ++j) {
          double d = i == j ? -1.0 : 0.0;
          for (std::int64_t row = 0; row < K; ++row) d += P.at(row * K + i) * P.at(row * K + j);
          orth = std::max(orth, std::fabs(d));
        }
      // A solve with I + S loses up to its condition number, about 1 + |S|, of the compute type.
      double s_max = 0;
      for (std::int64_t i = 0; i < S.numel(); ++i) s_max = std::max(s_max, std::fabs(S.at(i)));
      const double bound = (dtype == DType::float64 ? 1e-14 : 1e-5) * (1 + s_max) * K;
      if (!(orth <= std::max(bound, dtype == DType::float64 ? 1e-12 : 1e-5)))
        ctx.fail(what, ": P is not orthogonal: max |PᵀP − I| = ", orth, " > ", bound);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Performer FAVOR+ (phasor/favor.h).

TEST(Soak, FavorRandomMatrix) {
  soak("FavorRandomMatrix", [](Context& ctx, Rng& r) {
    const FavorMatrixKind kind = r.pick(
        {FavorMatrixKind::orthogonal_chi, FavorMatrixKind::orthogonal_fixed, FavorMatrixKind::iid});
    const std::int64_t m = r.pick<std::int64_t>({1, 2, r.integer(3, 300)}),
                       d = r.pick<std::int64_t>({1, 2, r.integer(3, 64)}),
                       H = r.pick<std::int64_t>({0, 1, 3});
    const std::uint64_t seed = r.engine()();
    ctx.describe() << to_string(kind) << " m=" << m << " d=" << d << " H=" << H << " seed=" << seed;
    for (DType dtype : {DType::float64, DType::float32}) {
      Tensor w = nan_buffer(
          H == 0 ? std::vector<std::int64_t>{m, d} : std::vector<std::int64_t>{H, m, d}, dtype);
      ++ctx.stats().runs;
      favor_random_matrix(kind, seed, w.view());
      if (!check_finite(ctx, {{"w", w}}, std::string("favor_random_matrix ") + to_string(dtype)))
        continue;
      if (kind == FavorMatrixKind::orthogonal_fixed)  // every row of norm √d
        for (std::int64_t row = 0; row < w.numel() / d; ++row) {
          double n2 = 0;
          for (std::int64_t c = 0; c < d; ++c) n2 += w.at(row * d + c) * w.at(row * d + c);
          if (std::fabs(std::sqrt(n2) - std::sqrt(static_cast<double>(d))) >
              1e-5 * std::sqrt(double(d))) {
            ctx.fail("orthogonal_fixed row ", row, " has norm ", std::sqrt(n2));
            break;
          }
        }
    }
  });
}

struct FavorFeatureProblem {
  std::int64_t B = 1, T = 1, H = 1, d = 1, m = 1;
  bool w_per_head = false;
  FavorStabilizer stabilizer = FavorStabilizer::query;
  std::vector<std::int64_t> lengths;
  Tensor x, w, cu, d_phi;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&x, &w, &d_phi}; }
  FavorFeatureProblem rounded(DType dtype) const { return rounded_inputs(*this, dtype); }
};

Results run_favor_features(const FavorFeatureProblem& p, Impl impl, DType in, DType out) {
  const Tensor x = p.x.to(in), w = p.w.to(in), d_phi = p.d_phi.to(in);
  FavorFeatureParams params;
  params.x = x.view();
  params.w = w.view();
  params.stabilizer = p.stabilizer;
  params.cu_seqlens = p.cu.view();
  Tensor phi = nan_buffer({p.B, p.T, p.H, p.m}, out);
  favor_features_forward(params, impl, phi.view());
  Tensor dx = nan_buffer(p.x.shape(), out), dw = nan_buffer(p.w.shape(), out);
  favor_features_backward(params, impl, d_phi.view(), dx.view(), dw.view());
  return {{"phi", phi}, {"dx", dx}, {"dw", dw}};
}

// W for FAVOR+: the op's own random matrix (float64), scaled, or extreme values.
Tensor draw_favor_w(Rng& r, std::int64_t H, std::int64_t m, std::int64_t d, bool per_head) {
  Tensor w(per_head ? std::vector<std::int64_t>{H, m, d} : std::vector<std::int64_t>{m, d},
           DType::float64);
  if (r.chance(0.7)) {
    favor_random_matrix(r.pick({FavorMatrixKind::orthogonal_chi, FavorMatrixKind::iid}),
                        r.engine()(), w.view());
    const double gain = r.pick({1.0, 1.0, 1e-3, 30.0});
    for (std::int64_t i = 0; i < w.numel(); ++i) w.set(i, gain * w.at(i));
    return w;
  }
  return extreme_values(w.shape(), r, draw_magnitude(r, 1e2));
}

// The bound where results are exponentials of sums the compute type rounds: an error δ in an
// exponent is a relative error e^δ − 1 of the result, and δ is up to a few roundings of the
// exponent's terms, eps·kappa (c = 4, as for FoX's logits).
double exponent_tolerance(DType in, double kappa) {
  return base_tolerance(in) + std::expm1(4 * (in == DType::float64 ? 1.1e-16 : 6e-8) * kappa);
}

// The terms of the features' results: φ itself; with g_r = dφ_r φ_r, dx = Σ_r g_r (w_r − x) and
// dw_r = Σ_t g_r x by Σ |g_r| (|w_r| + |x|) and Σ |g_r||x|. kappa: the largest exponent's terms,
// Σ|w_r,i x_i| + |x|²/2 + |c| (the query stabiliser's exponent w_rᵀx − max_r w_rᵀx has no |x|²).
std::vector<Tensor> favor_feature_terms(const FavorFeatureProblem& p, const Results& expected,
                                        double& kappa) {
  const std::int64_t rows = p.B * p.T * p.H, d = p.d, m = p.m;
  Tensor f_dx = Tensor::zeros(p.x.shape()), f_dw = Tensor::zeros(p.w.shape());
  const Tensor& phi = expected[0].value;
  kappa = 0;
  double c_max = 0;
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t h = row % p.H, wbase = p.w_per_head ? h * m * d : 0;
    double sq = 0;
    for (std::int64_t i = 0; i < d; ++i) sq += p.x.at(row * d + i) * p.x.at(row * d + i);
    for (std::int64_t r = 0; r < m; ++r) {
      double wx = 0, wx_abs = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        wx += p.w.at(wbase + r * d + i) * p.x.at(row * d + i);
        wx_abs += std::fabs(p.w.at(wbase + r * d + i) * p.x.at(row * d + i));
      }
      const double half = p.stabilizer == FavorStabilizer::query ? 0.0 : sq / 2;
      kappa = std::max(kappa, wx_abs + half);
      c_max = std::max(c_max, std::fabs(wx - half));
      const double g = std::fabs(p.d_phi.at(row * m + r) * phi.at(row * m + r));
      for (std::int64_t i = 0; i < d; ++i) {
        const double x = std::fabs(p.x.at(row * d + i)), w = std::fabs(p.w.at(wbase + r * d + i));
        f_dx.set(row * d + i, f_dx.at(row * d + i) + g * (w + x));
        f_dw.set(wbase + r * d + i, f_dw.at(wbase + r * d + i) + g * x);
      }
    }
  }
  kappa += c_max;
  return {absolute(phi), f_dx, f_dw};
}

TEST(Soak, FavorFeatures) {
  soak("FavorFeatures", [](Context& ctx, Rng& r) {
    FavorFeatureProblem p;
    if (r.chance(0.3)) {
      p.lengths = draw_lengths(r, 40);
      p.T = 0;
      for (auto l : p.lengths) p.T += l;
      p.cu = testing::cu_seqlens(p.lengths);
    } else {
      p.B = r.integer(1, 2);
      p.T = r.pick<std::int64_t>({0, 1, 2, r.integer(3, 60)});
    }
    p.H = r.integer(1, 3);
    p.d = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
    p.m = r.pick<std::int64_t>({1, 2, r.integer(3, 40)});
    p.w_per_head = r.chance(0.5);
    p.stabilizer = r.pick({FavorStabilizer::query, FavorStabilizer::key, FavorStabilizer::none});
    const double mx = draw_magnitude(r);
    p.x = extreme_values({p.B, p.T, p.H, p.d}, r, mx);
    p.w = draw_favor_w(r, p.H, p.m, p.d, p.w_per_head);
    p.d_phi = extreme_values({p.B, p.T, p.H, p.m}, r, draw_magnitude(r, 1e2));
    const char* stabilizers[] = {"query", "key", "none"};
    ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " d=" << p.d << " m=" << p.m
                   << (p.lengths.empty() ? "" : " lengths=" + join(p.lengths))
                   << (p.w_per_head ? " w per head" : " shared w")
                   << " stabilizer=" << stabilizers[static_cast<int>(p.stabilizer)] << " |x|~"
                   << mx;
    if (p.stabilizer == FavorStabilizer::none) {
      // Without a stabiliser the features are exp(wᵀx − |x|²/2)/√m as they are (favor.h: "overflows
      // for large |x|"). Where a true result (or, for the gradients, a term of one) leaves the
      // compute type's range the contract is the README's: φ is +inf there, and gradients built
      // from inf features are not meaningful (inf − inf). Such problems check φ only; the others
      // are checked like the stabilised ones below.
      bool overflows = false;
      for (DType in : {DType::float64, DType::float32}) {
        const FavorFeatureProblem pr = p.rounded(in);
        const Results expected =
            run_favor_features(pr, Impl::reference, DType::float64, DType::float64);
        const double largest = in == DType::float64 ? 1e300 : 1e36;
        double biggest = 0;
        for (const auto& e : expected)
          for (std::int64_t i = 0; i < e.value.numel(); ++i)
            biggest = std::max(biggest, std::fabs(e.value.at(i)));
        if (!(biggest < largest)) overflows = true;
        if (!overflows) continue;
        for (Impl impl : {Impl::recurrent, Impl::chunk}) {
          ++ctx.stats().runs;
          const Results actual = run_favor_features(pr, impl, in, in);
          const double range = in == DType::float64 ? 1.7e308 : 3.4e38;
          for (std::int64_t e = 0; e < expected[0].value.numel(); ++e) {
            const double want = expected[0].value.at(e), got = actual[0].value.at(e);
            // Near the top of the range inf is allowed too: exp(u)/√m overflows in exp(u) first,
            // and a vectorised float exp saturates a little below ln(FLT_MAX) ≈ 88.72.
            const bool ok = want >= range / (2 * std::sqrt(static_cast<double>(p.m)))
                                ? got == kInf || (std::isfinite(got) && want < range)
                                : std::isfinite(got);
            if (!ok) {
              ctx.fail(label(impl, in, in), ": phi[", e, "] = ", got, ", the reference ", want);
              return;
            }
          }
        }
      }
      if (overflows) return;
    }
    double kappa = 0;
    check_implementations(
        ctx, r, p, run_favor_features, {Impl::recurrent, Impl::chunk},
        [&](const FavorFeatureProblem&, DType in) { return exponent_tolerance(in, kappa); },
        [&](const FavorFeatureProblem& pr, const Results& expected, DType) {
          return favor_feature_terms(pr, expected, kappa);
        });
  });
}

struct FavorAttentionProblem {
  std::int64_t B = 1, T = 1, H = 1, d = 1, m = 1, V = 1, chunk_size = 64;
  bool causal = false, w_per_head = false;
  std::optional<double> scale;
  std::vector<std::int64_t> lengths;
  Tensor q, k, v, w, cu, d_o;
  std::string planted;

  std::vector<Tensor*> inputs() { return {&q, &k, &v, &w, &d_o}; }
  FavorAttentionProblem rounded(DType dtype) const { return rounded_inputs(*this, dtype); }
};

Results run_favor_attention(const FavorAttentionProblem& p, Impl impl, DType in, DType out) {
  const Tensor q = p.q.to(in), k = p.k.to(in), v = p.v.to(in), w = p.w.to(in), d_o = p.d_o.to(in);
  FavorAttentionParams params;
  params.q = q.view();
  params.k = k.view();
  params.v = v.view();
  params.w = w.view();
  params.cu_seqlens = p.cu.view();
  params.causal = p.causal;
  params.scale = p.scale;
  params.chunk_size = p.chunk_size;
  Tensor o = nan_buffer(p.v.shape(), out);
  favor_attention_forward(params, impl, o.view());
  Tensor dq = nan_buffer(p.q.shape(), out), dk = nan_buffer(p.k.shape(), out),
         dv = nan_buffer(p.v.shape(), out), dw = nan_buffer(p.w.shape(), out);
  FavorAttentionGrads grads;
  grads.dq = dq.view();
  grads.dk = dk.view();
  grads.dv = dv.view();
  grads.dw = dw.view();
  favor_attention_backward(params, impl, d_o.view(), grads);
  return {{"o", o}, {"dq", dq}, {"dk", dk}, {"dv", dv}, {"dw", dw}};
}

// The terms of the attention's results, from its softmax form (src/favor/reference.cpp): with the
// exponents e(x̂, r) = w_rᵀx̂ − |x̂|²/2, logits ℓ_ij = log Σ_r exp(e(q̂_i, r) + e(k̂_j, r)), weights
// P_ij and feature shares ρ_ijr: o_i = Σ_j P_ij v_j by Σ_j P_ij |v_j|; dv_j = Σ_i P_ij do_i by
// Σ_i P_ij |do_i|; dℓ_ij = P_ij (do_i·v_j − do_i·o_i) by U_ij = P_ij (|do_i||v_j| + |D|_i) (|D|_i =
// Σ_j P_ij |do_i||v_j|; the difference cancels when the values agree); dq̂_i = Σ_j dℓ_ij Σ_r ρ_ijr
// (w_r − q̂_i) by Σ_j U_ij Σ_r ρ_ijr (|w_r| + |q̂_i|), dk̂ and dw alike. kappa: the largest terms
// of an exponent of a pair that carries weight (ℓ_ij within 50 of its row's largest),
// Σ|w_r,c q̂_i,c| + |q̂_i|²/2 + Σ|w_r,c k̂_j,c| + |k̂_j|²/2.
struct FavorTerms {
  std::vector<Tensor> floors;
  double kappa = 0;
};

FavorTerms favor_attention_terms(const FavorAttentionProblem& p) {
  const std::int64_t T = p.T, H = p.H, d = p.d, m = p.m, V = p.V;
  const double s = std::sqrt(p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(d)));
  Tensor f_o = Tensor::zeros(p.v.shape()), f_dq = Tensor::zeros(p.q.shape()),
         f_dk = Tensor::zeros(p.k.shape()), f_dv = Tensor::zeros(p.v.shape()),
         f_dw = Tensor::zeros(p.w.shape());
  FavorTerms terms;
  const std::int64_t N = p.lengths.empty() ? p.B : static_cast<std::int64_t>(p.lengths.size());
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t b = p.lengths.empty() ? n : 0;
    const std::int64_t start = p.lengths.empty() ? 0 : static_cast<std::int64_t>(p.cu.at(n)),
                       L = p.lengths.empty() ? T
                                             : static_cast<std::int64_t>(p.cu.at(n + 1)) - start;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t wbase = p.w_per_head ? h * m * d : 0;
      const auto row = [&](std::int64_t t) { return (b * T + start + t) * H + h; };
      // e and its terms' size per token and feature, for q̂ and k̂.
      std::vector<double> eq(static_cast<std::size_t>(L * m)), ek(eq.size()), aq(eq.size()),
          ak(eq.size());
      for (std::int64_t t = 0; t < L; ++t) {
        double sq_q = 0, sq_k = 0;
        for (std::int64_t c = 0; c < d; ++c) {
          sq_q += std::pow(s * p.q.at(row(t) * d + c), 2);
          sq_k += std::pow(s * p.k.at(row(t) * d + c), 2);
        }
        for (std::int64_t r = 0; r < m; ++r) {
          double uq = 0, uk = 0, uq_abs = 0, uk_abs = 0;
          for (std::int64_t c = 0; c < d; ++c) {
            const double w = p.w.at(wbase + r * d + c);
            uq += w * s * p.q.at(row(t) * d + c);
            uk += w * s * p.k.at(row(t) * d + c);
            uq_abs += std::fabs(w * s * p.q.at(row(t) * d + c));
            uk_abs += std::fabs(w * s * p.k.at(row(t) * d + c));
          }
          const auto at = static_cast<std::size_t>(t * m + r);
          eq[at] = uq - sq_q / 2;
          ek[at] = uk - sq_k / 2;
          aq[at] = uq_abs + sq_q / 2;
          ak[at] = uk_abs + sq_k / 2;
        }
      }
      std::vector<double> logit(static_cast<std::size_t>(L)), rho(static_cast<std::size_t>(L * m));
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t end = p.causal ? i + 1 : L;
        double top = -kInf;
        for (std::int64_t j = 0; j < end; ++j) {
          double mx = -kInf, sum = 0;
          for (std::int64_t r = 0; r < m; ++r)
            mx = std::max(mx, eq[static_cast<std::size_t>(i * m + r)] +
                                  ek[static_cast<std::size_t>(j * m + r)]);
          for (std::int64_t r = 0; r < m; ++r)
            sum += std::exp(eq[static_cast<std::size_t>(i * m + r)] +
                            ek[static_cast<std::size_t>(j * m + r)] - mx);
          logit[static_cast<std::size_t>(j)] = mx + std::log(sum);
          for (std::int64_t r = 0; r < m; ++r)
            rho[static_cast<std::size_t>(j * m + r)] = std::exp(
                eq[static_cast<std::size_t>(i * m + r)] + ek[static_cast<std::size_t>(j * m + r)] -
                logit[static_cast<std::size_t>(j)]);
          top = std::max(top, logit[static_cast<std::size_t>(j)]);
        }
        double total = 0;
        for (std::int64_t j = 0; j < end; ++j)
          total += std::exp(logit[static_cast<std::size_t>(j)] - top);
        const double lse = top + std::log(total);
        double D = 0;
        std::vector<double> P(static_cast<std::size_t>(end)), dP(static_cast<std::size_t>(end));
        for (std::int64_t j = 0; j < end; ++j) {
          P[static_cast<std::size_t>(j)] = std::exp(logit[static_cast<std::size_t>(j)] - lse);
          double dot = 0;
          for (std::int64_t c = 0; c < V; ++c) {
            dot += std::fabs(p.d_o.at(row(i) * V + c) * p.v.at(row(j) * V + c));
            f_o.set(row(i) * V + c, f_o.at(row(i) * V + c) + P[static_cast<std::size_t>(j)] *
                                                                 std::fabs(p.v.at(row(j) * V + c)));
            f_dv.set(row(j) * V + c,
                     f_dv.at(row(j) * V + c) +
                         P[static_cast<std::size_t>(j)] * std::fabs(p.d_o.at(row(i) * V + c)));
          }
          dP[static_cast<std::size_t>(j)] = dot;
          D += P[static_cast<std::size_t>(j)] * dot;
          if (logit[static_cast<std::size_t>(j)] >= top - 50)
            for (std::int64_t r = 0; r < m; ++r)
              terms.kappa = std::max(terms.kappa, aq[static_cast<std::size_t>(i * m + r)] +
                                                      ak[static_cast<std::size_t>(j * m + r)]);
        }
        for (std::int64_t j = 0; j < end; ++j) {
          const double U = P[static_cast<std::size_t>(j)] * (dP[static_cast<std::size_t>(j)] + D);
          for (std::int64_t r = 0; r < m; ++r) {
            const double g = U * rho[static_cast<std::size_t>(j * m + r)];
            for (std::int64_t c = 0; c < d; ++c) {
              const double w = std::fabs(p.w.at(wbase + r * d + c)),
                           qh = std::fabs(s * p.q.at(row(i) * d + c)),
                           kh = std::fabs(s * p.k.at(row(j) * d + c));
              f_dq.set(row(i) * d + c, f_dq.at(row(i) * d + c) + s * g * (w + qh));
              f_dk.set(row(j) * d + c, f_dk.at(row(j) * d + c) + s * g * (w + kh));
              f_dw.set(wbase + r * d + c, f_dw.at(wbase + r * d + c) + g * (qh + kh));
            }
          }
        }
      }
    }
  }
  terms.floors = {f_o, f_dq, f_dk, f_dv, f_dw};
  return terms;
}

void soak_favor_attention(Context& ctx, Rng& r, bool long_sequence) {
  FavorAttentionProblem p;
  p.chunk_size = r.pick<std::int64_t>({1, 7, 16, 64});
  if (long_sequence) {
    p.T = long_length();
    p.d = r.pick<std::int64_t>({1, 2});
    p.m = r.pick<std::int64_t>({1, 4});
    p.V = r.pick<std::int64_t>({1, 2});
    p.chunk_size = 64;
    if (r.chance(0.5)) {
      p.lengths = long_packed_lengths();
      p.cu = testing::cu_seqlens(p.lengths);
    }
  } else {
    if (r.chance(0.3)) {
      p.lengths = draw_lengths(r, 40);
      p.T = 0;
      for (auto l : p.lengths) p.T += l;
      p.cu = testing::cu_seqlens(p.lengths);
    } else {
      p.B = r.integer(1, 2);
      p.T = draw_length(r, p.chunk_size);
    }
    p.H = r.integer(1, 2);
    p.d = r.pick<std::int64_t>({1, 2, r.integer(3, 16)});
    p.m = r.pick<std::int64_t>({1, 2, r.integer(3, 32)});
    p.V = r.pick<std::int64_t>({1, 2, r.integer(3, 8)});
  }
  p.causal = r.chance(0.5);
  p.w_per_head = r.chance(0.5);
  if (r.chance(0.2)) p.scale = r.pick({1e-4, 1.0, 30.0});
  const double mq = draw_magnitude(r), mk = draw_magnitude(r), mv = draw_magnitude(r);
  p.q = extreme_values({p.B, p.T, p.H, p.d}, r, mq);
  p.k = extreme_values({p.B, p.T, p.H, p.d}, r, mk);
  p.v = extreme_values({p.B, p.T, p.H, p.V}, r, mv);
  p.w = draw_favor_w(r, p.H, p.m, p.d, p.w_per_head);
  p.d_o = extreme_values({p.B, p.T, p.H, p.V}, r, draw_magnitude(r, 1e2));
  ctx.describe() << "B=" << p.B << " T=" << p.T << " H=" << p.H << " d=" << p.d << " m=" << p.m
                 << " V=" << p.V << " chunk=" << p.chunk_size
                 << (p.lengths.empty() ? "" : " lengths=" + join(p.lengths))
                 << (p.causal ? " causal" : " non-causal") << (p.w_per_head ? " w per head" : "")
                 << (p.scale ? " scale=" + std::to_string(*p.scale) : "") << " |q|~" << mq
                 << " |k|~" << mk << " |v|~" << mv;
  if (long_sequence) {
    // The reference is quadratic in T: at 65,536 tokens finiteness and the convex bounds only.
    for (const DtypeRun dr : dtype_runs(r)) {
      const FavorAttentionProblem pr = p.rounded(dr.in);
      for (Impl impl : {Impl::recurrent, Impl::chunk}) {
        const std::string what = label(impl, dr.in, dr.out);
        const std::optional<Results> actual =
            attempt(ctx, "", what, [&] { return run_favor_attention(pr, impl, dr.in, dr.out); });
        if (!actual || !check_finite(ctx, *actual, what)) return;
        check_convex_bounds(ctx, p.H, 1, p.V, pr.v, pr.d_o, (*actual)[0].value, (*actual)[3].value,
                            what);
      }
    }
    return;
  }
  double kappa = 0;
  check_implementations(
      ctx, r, p, run_favor_attention, {Impl::recurrent, Impl::chunk},
      [&](const FavorAttentionProblem&, DType in) { return exponent_tolerance(in, kappa); },
      [&](const FavorAttentionProblem& pr, const Results&, DType) {
        FavorTerms terms = favor_attention_terms(pr);
        kappa = terms.kappa;
        return terms.floors;
      },
      [&](const FavorAttentionProblem& pr, const Results& actual, const std::string& what) {
        check_convex_bounds(ctx, pr.H, 1, pr.V, pr.v, pr.d_o, actual[0].value, actual[3].value,
                            what);
      });
}

TEST(Soak, FavorAttention) {
  soak("FavorAttention", [](Context& ctx, Rng& r) { soak_favor_attention(ctx, r, false); });
}

TEST(Soak, FavorAttentionLongSequence) {
  soak(
      "FavorAttentionLongSequence",
      [](Context& ctx, Rng& r) { soak_favor_attention(ctx, r, true); }, long_iterations());
}

}  // namespace
}  // namespace phasor
