// Tests of the shared machinery: views, argument checks, cu_seqlens, threads.
#include <algorithm>
#include <atomic>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/parallel.h"
#include "common/slices.h"
#include "phasor/ops.h"
#include "phasor/testing/cases.h"
#include "phasor/testing/gtest.h"
#include "phasor/testing/random.h"

namespace phasor {
namespace {

using testing::Tensor;

TEST(TensorView, ContiguousStridesAndShapeString) {
  float data[24];
  TensorView v = TensorView::of(data, {2, 3, 4});
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.shape_string(), "[2, 3, 4]");
  EXPECT_EQ(v.dtype, DType::float32);
  EXPECT_FALSE(TensorView{}.defined());
  EXPECT_EQ(TensorView{}.shape_string(), "undefined");
  TensorView t = TensorView::strided(data, DType::float32, {3, 2}, {1, 3});
  EXPECT_FALSE(t.is_contiguous());
}

// The nearest 16-bit value to x among `finite` (every finite value of the format, ascending, as
// double, with its bits), ties to the even bit pattern; beyond the largest finite value by half
// an ulp or more: inf. The slow, obviously-correct rounding the conversions are checked against.
std::uint16_t nearest_bits(double x, const std::vector<std::pair<double, std::uint16_t>>& finite,
                           double overflow_threshold, std::uint16_t inf_bits) {
  if (std::fabs(x) >= overflow_threshold)
    return static_cast<std::uint16_t>(inf_bits | (x < 0 ? 0x8000u : 0u));
  auto hi = std::lower_bound(finite.begin(), finite.end(), std::make_pair(x, std::uint16_t{0}));
  auto lo = hi == finite.begin() ? hi : hi - 1;
  if (hi == finite.end()) hi = lo;
  const double dlo = std::fabs(x - lo->first), dhi = std::fabs(hi->first - x);
  std::uint16_t bits;
  if (dlo < dhi)
    bits = lo->second;
  else if (dhi < dlo)
    bits = hi->second;
  else
    bits = (lo->second & 1u) == 0 ? lo->second : hi->second;
  // ±0: the sign follows x.
  if ((bits & 0x7fffu) == 0) bits = static_cast<std::uint16_t>(std::signbit(x) ? 0x8000u : 0u);
  return bits;
}

template <class Half>
void check_half_conversions(double overflow_threshold, std::uint16_t inf_bits) {
  std::vector<std::pair<double, std::uint16_t>> finite;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = Half::from_bits(static_cast<std::uint16_t>(b));
    const float f = h.to_float();
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Half::from_float(f).to_float())) << b;
      continue;
    }
    // Every 16-bit value converts to float exactly and back to the same bits.
    EXPECT_EQ(Half::from_float(f).bits, b) << "bits " << b;
    if (std::isfinite(f) && b != 0x8000u) finite.push_back({static_cast<double>(f), b});
  }
  std::sort(finite.begin(), finite.end());
  std::vector<float> probes;
  // Midpoints between neighbours (ties), and the floats just beside them.
  for (std::size_t i = 0; i + 1 < finite.size(); i += 7) {
    const float mid = static_cast<float>((finite[i].first + finite[i + 1].first) / 2);
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, 0.0f));
    probes.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity()));
  }
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t u = any_bits(rng);
    float f;
    std::memcpy(&f, &u, sizeof f);
    if (!std::isnan(f)) probes.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 1e-30f, -1e-30f, 65504.0f, 65519.99f, 65520.0f, 3.0e38f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min()})
    probes.push_back(f);
  for (float f : probes) {
    const std::uint16_t expected = nearest_bits(f, finite, overflow_threshold, inf_bits);
    EXPECT_EQ(Half::from_float(f).bits, expected) << "float " << f;
  }
}

TEST(HalfTypes, Float16RoundsToNearestEvenWithSubnormalsAndOverflow) {
  check_half_conversions<float16>(65520.0, 0x7c00u);
}

TEST(HalfTypes, BFloat16RoundsToNearestEven) {
  // Past the largest bfloat16 (0x7f7f = (2 − 2^-7)·2^127) by half an ulp: inf.
  check_half_conversions<bfloat16>((2.0 - std::ldexp(1.0, -8)) * std::ldexp(1.0, 127), 0x7f80u);
}

TEST(Check, ShapeMismatchNamesArgumentExpectedAndGiven) {
  Tensor k({1, 10, 4, 16}, DType::float32);
  testing::expect_error(
      [&] {
        detail::check_float_tensor("chunk_gla", "k", k.view(),
                                   {{1, "B"}, {10, "T"}, {4, "H"}, {32, "K"}});
      },
      {"chunk_gla", "'k'", "[B=1, T=10, H=4, K=32]", "[1, 10, 4, 16]"});
}

TEST(Check, RejectsIntegerDtypeAndMissingTensor) {
  Tensor q({1, 2, 1, 4}, DType::int32);
  testing::expect_error([&] { detail::check_float_rank("op", "q", q.view(), 4, "[B, T, H, K]"); },
                        {"'q'", "float32, float64, bfloat16 or float16", "int32"});
  testing::expect_error(
      [&] { detail::check_float_rank("op", "q", TensorView{}, 4, "[B, T, H, K]"); },
      {"'q'", "none"});
}

TEST(Check, ViewsMustShareTheCallsDevice) {
  Tensor q({1, 2, 1, 4}, DType::float32);
  TensorView on_emulated = q.view();
  on_emulated.device = Device::emulated;
  testing::expect_error(
      [&] { detail::check_float_rank("op", "k", on_emulated, 4, "[B, T, H, K]", Device::cpu); },
      {"'k'", "a tensor on cpu (the device of the call)", "a tensor on emulated"});
  // Ops without CUDA kernels accept the cpu only, and say so.
  testing::expect_error([&] { detail::call_device("grape", "z", on_emulated, false); },
                        {"grape: argument 'z'", "has no CUDA kernel", "a tensor on emulated"});
  EXPECT_EQ(detail::call_device("gla", "q", on_emulated, true), Device::emulated);
}

// cu_seqlens: metadata (detail::sequences) and values (the host value checks), as a CPU call
// runs them.
detail::Sequences checked_sequences(const Tensor& cu, std::int64_t B, std::int64_t T) {
  const detail::Sequences s = detail::sequences("op", cu.view(), B, T);
  detail::ValueChecks checks;
  checks.sequences = s;
  detail::check_values_on_host("op", checks);
  return s;
}

TEST(Check, CuSeqlensValidation) {
  Tensor ok = testing::cu_seqlens({3, 0, 1, 4});
  auto seqs = checked_sequences(ok, 1, 8);
  ASSERT_EQ(seqs.size(), 4);
  EXPECT_EQ(seqs[1].length, 0);
  EXPECT_EQ(seqs[3].start, 4);
  std::int64_t total = 0;
  for (const detail::Sequence& s : seqs) total += s.length;
  EXPECT_EQ(total, 8);
  testing::expect_error([&] { checked_sequences(ok, 2, 8); }, {"'cu_seqlens'", "B = 2"});
  testing::expect_error([&] { checked_sequences(ok, 1, 9); }, {"'cu_seqlens'", "T = 9"});
  Tensor bad = Tensor::from({3}, {0, 5, 3}, DType::int64);
  testing::expect_error([&] { checked_sequences(bad, 1, 3); },
                        {"non-decreasing", "cu_seqlens[2] = 3 < cu_seqlens[1] = 5"});
  // A decrease at the last offset is reported before its mismatch with T.
  testing::expect_error([&] { checked_sequences(bad, 1, 4); }, {"non-decreasing"});
  Tensor start = Tensor::from({2}, {1, 3}, DType::int64);
  testing::expect_error([&] { checked_sequences(start, 1, 3); }, {"cu_seqlens[0] = 0"});
  Tensor fl = Tensor::from({2}, {0, 3}, DType::float32);
  testing::expect_error([&] { checked_sequences(fl, 1, 3); }, {"int32 or int64"});
  // Without cu_seqlens the B rows are the sequences.
  const detail::Sequences rows = detail::sequences("op", TensorView{}, 3, 5);
  EXPECT_FALSE(rows.packed());
  EXPECT_EQ(rows[2].batch, 2);
  EXPECT_EQ(rows[2].length, 5);
}

void check_gates(const TensorView& g) {
  detail::ValueChecks checks;
  checks.add("g", g, detail::ValueRule::log_gate);
  detail::check_values_on_host("op", checks);
}

TEST(Check, LogGatesMustBeNonPositive) {
  for (DType dtype : {DType::float64, DType::float32, DType::bfloat16, DType::float16}) {
    Tensor g = Tensor::from({1, 2, 2}, {-1, 0, -INFINITY, 0.25}, dtype);
    testing::expect_error([&] { check_gates(g.view()); }, {"'g'", "g[0, 1, 1] = 0.25"});
    Tensor nan = Tensor::from({2}, {-1, NAN}, dtype);
    testing::expect_error([&] { check_gates(nan.view()); }, {"g[1]"});
    Tensor fine = Tensor::from({3}, {-1, 0, -INFINITY}, dtype);
    EXPECT_NO_THROW(check_gates(fine.view()));
  }
  // Strided: the reported index is the element's (row-major order), not its memory offset:
  // [1, 0] is mem[1], the second element in memory.
  std::vector<double> mem = {-1, 5, -2, -3, -4, 0.5};
  const TensorView transposed = TensorView::strided(mem.data(), DType::float64, {3, 2}, {1, 3});
  testing::expect_error([&] { check_gates(transposed); }, {"g[1, 0] = 5"});
}

// The host scan checks contiguous float32/float64 rows on the values' bits (a vectorised loop):
// every special value must get the verdict of the plain comparison (value_ok), and in a large
// tensor scanned in parallel blocks the first failing element in row-major order is reported.
template <class T>
void expect_bit_scan_matches_comparisons() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T specials[] = {T(0),
                        -T(0),
                        -inf,
                        inf,
                        nan,
                        -nan,
                        std::numeric_limits<T>::denorm_min(),
                        -std::numeric_limits<T>::denorm_min(),
                        std::numeric_limits<T>::max(),
                        -std::numeric_limits<T>::max(),
                        T(-1),
                        T(1e-30)};
  for (const detail::ValueRule rule : {detail::ValueRule::log_gate, detail::ValueRule::finite})
    for (const T value : specials) {
      SCOPED_TRACE(std::to_string(static_cast<double>(value)));
      std::vector<T> row(37, T(-0.5));  // not a multiple of the vector width
      row[29] = value;
      detail::ValueChecks checks;
      checks.add("x", TensorView::of(row.data(), {37}), rule);
      const bool ok = detail::value_ok(rule, static_cast<double>(value));
      if (ok)
        EXPECT_NO_THROW(detail::check_values_on_host("op", checks));
      else
        testing::expect_error([&] { detail::check_values_on_host("op", checks); }, {"x[29]"});
    }
  std::vector<T> big(static_cast<std::size_t>(2000 * 3 * 64), T(-0.25));
  const TensorView view = TensorView::of(big.data(), {1, 2000, 3, 64});
  big[5000 * 64 + 7] = inf;  // row 5000, a later block
  big[1300 * 64 + 63] = -nan;
  big[1300 * 64 + 62] = T(-3);
  detail::ValueChecks checks;
  checks.add("g", view, detail::ValueRule::log_gate);
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    testing::expect_error([&] { detail::check_values_on_host("op", checks); },
                          {"g[0, 433, 1, 63]"});  // row 1300 = (433, 1)
  }
  set_num_threads(0);
}

// Every one of the 65,536 bit patterns of a 16-bit storage type, inside a vectorised row: the
// bit-level scan's verdict must be value_ok's on the converted value.
template <class T>
void expect_every_16_bit_pattern_checked(DType dtype) {
  const T fill = T::from_float(-0.5f);
  for (const detail::ValueRule rule : {detail::ValueRule::log_gate, detail::ValueRule::finite})
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      std::vector<T> row(70, fill);
      row[40] = T::from_bits(static_cast<std::uint16_t>(bits));
      TensorView view = TensorView::of(row.data(), {70});
      ASSERT_EQ(view.dtype, dtype);
      detail::ValueChecks checks;
      checks.add("x", view, rule);
      const bool ok = detail::value_ok(rule, static_cast<double>(row[40].to_float()));
      bool passed = true;
      try {
        detail::check_values_on_host("op", checks);
      } catch (const Error&) {
        passed = false;
      }
      ASSERT_EQ(passed, ok) << "bits 0x" << std::hex << bits << ", rule " << static_cast<int>(rule);
    }
}

TEST(Check, BitLevelScanMatchesComparisons) {
  expect_bit_scan_matches_comparisons<float>();
  expect_bit_scan_matches_comparisons<double>();
  expect_every_16_bit_pattern_checked<bfloat16>(DType::bfloat16);
  expect_every_16_bit_pattern_checked<float16>(DType::float16);
}

TEST(Check, FiniteValues) {
  Tensor slopes = Tensor::from({1, 3, 1}, {0.5, -2, INFINITY});
  detail::ValueChecks checks;
  checks.add("bias_q_slope", slopes.view(), detail::ValueRule::finite);
  testing::expect_error([&] { detail::check_values_on_host("op", checks); },
                        {"'bias_q_slope'", "finite values", "bias_q_slope[0, 2, 0] = inf"});
}

TEST(Ops, OneTableOfNames) {
  EXPECT_STREQ(op_name(Op::gla, Impl::chunk), "chunk_gla");
  EXPECT_STREQ(op_name(Op::gated_delta_rule, Impl::recurrent), "fused_recurrent_gated_delta_rule");
  EXPECT_STREQ(op_name(Op::forgetting_attn, Impl::reference), "forgetting_attn_reference");
  EXPECT_STREQ(op_name(Op::short_conv, Impl::chunk), "causal_conv1d");
  auto found = find_op("chunk_gated_delta_rule");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->op, Op::gated_delta_rule);
  EXPECT_EQ(found->impl, Impl::chunk);
  found = find_op("gla");
  ASSERT_TRUE(found);
  EXPECT_FALSE(found->impl);
  // One optimized kernel under one name implies no implementation.
  found = find_op("selective_rope_phases");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->op, Op::selective_rope_phases);
  EXPECT_FALSE(found->impl);
  EXPECT_FALSE(find_op("chunk_glaa"));
  for (const OpInfo& info : all_ops()) {
    EXPECT_EQ(&op_info(info.op), &info);
    EXPECT_FALSE(info.on_gpu[static_cast<std::size_t>(Impl::reference)]) << info.name;
  }
}

TEST(Slices, LoadAndStoreStridedRows) {
  // x: [1, 3, 2, 2] stored with T and H swapped in memory (a transposed, non-contiguous view).
  std::vector<double> mem(12);
  for (int i = 0; i < 12; ++i) mem[static_cast<std::size_t>(i)] = i;
  TensorView x = TensorView::strided(mem.data(), DType::float64, {1, 3, 2, 2}, {12, 2, 6, 1});
  detail::Mat<float> m;
  detail::load_rows(x, detail::Sequence{0, 1, 2}, 1, m);
  ASSERT_EQ(m.rows(), 2);
  EXPECT_EQ(m(0, 0), 8.0f);  // t=1, h=1: offset 1*2 + 1*6
  EXPECT_EQ(m(1, 1), 11.0f);
  m *= 2;
  detail::store_rows(m, x, detail::Sequence{0, 1, 2}, 1);
  EXPECT_EQ(mem[8], 16.0);
}

TEST(Threads, ParallelForRunsEveryItemOnceAndPropagatesErrors) {
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    std::vector<std::atomic<int>> hits(100);
    detail::parallel_for(100, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)]++; });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    EXPECT_THROW(detail::parallel_for(10,
                                      [&](std::int64_t i) {
                                        if (i == 7) throw Error("boom");
                                      }),
                 Error);
  }
  set_num_threads(0);
  EXPECT_GE(num_threads(), 1);
  EXPECT_THROW(set_num_threads(-1), Error);
}

// parallel_for_runs: runs of consecutive items that cover [0, items) once each, no more runs than
// threads, all of one length but the last (the kernels keep buffers across a run's items).
TEST(Threads, ParallelForRunsCoversTheItemsInConsecutiveRuns) {
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    for (std::int64_t items : {0, 1, 2, 7, 8, 100}) {
      std::mutex mutex;
      std::vector<std::pair<std::int64_t, std::int64_t>> runs;
      detail::parallel_for_runs(items, [&](std::int64_t begin, std::int64_t end) {
        const std::lock_guard<std::mutex> lock(mutex);
        runs.emplace_back(begin, end);
      });
      std::sort(runs.begin(), runs.end());
      SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(items) + " items");
      EXPECT_LE(static_cast<std::int64_t>(runs.size()), threads);
      std::int64_t next = 0;
      for (std::size_t r = 0; r < runs.size(); ++r) {
        EXPECT_EQ(runs[r].first, next);
        EXPECT_LT(runs[r].first, runs[r].second);
        if (r + 1 < runs.size()) {
          EXPECT_EQ(runs[r].second - runs[r].first, runs[0].second - runs[0].first);
        }
        next = runs[r].second;
      }
      EXPECT_EQ(next, items);
    }
  }
  set_num_threads(0);
}

// items_overflow_cache: on one thread never (nothing to share); on n threads once an item's bytes
// exceed an n-th of kSharedCacheBytes.
TEST(Threads, ItemsOverflowCacheAtAThreadsShare) {
  set_num_threads(1);
  EXPECT_FALSE(detail::items_overflow_cache(std::int64_t(1) << 40));
  for (int threads : {2, 4}) {
    set_num_threads(threads);
    const std::int64_t share = detail::kSharedCacheBytes / threads;
    EXPECT_FALSE(detail::items_overflow_cache(0)) << threads;
    EXPECT_FALSE(detail::items_overflow_cache(share)) << threads;
    EXPECT_TRUE(detail::items_overflow_cache(share + 1)) << threads;
  }
  set_num_threads(0);
}

// The work-aware overload: every item once, and work too small for a hand-off stays on the
// calling thread; many back-to-back jobs (the decoding pattern: workers still spinning from the
// previous one) each run every item exactly once.
TEST(Threads, ParallelForWithWorkEstimate) {
  set_num_threads(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  std::vector<std::atomic<int>> hits(8);
  detail::parallel_for(8, 16, [&](std::int64_t i) {  // 128 multiply-adds in all: one thread
    hits[static_cast<std::size_t>(i)]++;
    if (std::this_thread::get_id() != caller) elsewhere++;
  });
  EXPECT_EQ(elsewhere.load(), 0);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  for (int job = 0; job < 2000; ++job) {
    std::vector<std::atomic<int>> count(5);
    detail::parallel_for(5, detail::kWorkPerThread,
                         [&](std::int64_t i) { count[static_cast<std::size_t>(i)]++; });
    for (auto& c : count) ASSERT_EQ(c.load(), 1) << "job " << job;
  }
  set_num_threads(0);
}

// More threads than cores and jobs of varying width back to back: workers often wake after the
// caller has taken every item (the job is then closed to them) or while a later job runs (they
// join that one). Every item of every job still runs exactly once.
TEST(Threads, LateWorkersJoinTheCurrentJobOrNone) {
  set_num_threads(8);
  for (int job = 0; job < 3000; ++job) {
    const int items = 1 + job % 9;
    if (job % 3 == 0) set_num_threads(2 + job % 7);
    std::vector<std::atomic<int>> count(static_cast<std::size_t>(items));
    detail::parallel_for(items, detail::kWorkPerThread * 4,
                         [&](std::int64_t i) { count[static_cast<std::size_t>(i)]++; });
    for (auto& c : count) ASSERT_EQ(c.load(), 1) << "job " << job;
  }
  // Items that take long enough for every worker to join: each runs once, on several threads.
  set_num_threads(4);
  std::vector<std::atomic<int>> count(64);
  detail::parallel_for(64, [&](std::int64_t i) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    count[static_cast<std::size_t>(i)]++;
  });
  for (auto& c : count) EXPECT_EQ(c.load(), 1);
  set_num_threads(0);
}

// set_flush_denormals: every thread of a parallel_for makes no subnormal number and reads one as
// 0 when flushing (the default), keeps IEEE gradual underflow when not, and the calling thread
// has its own modes back after the call either way.
#if defined(__SSE__) || defined(__x86_64__) || defined(__aarch64__)
TEST(Threads, ParallelForSetsTheSubnormalModesOfEveryThread) {
  const float smallest_normal = std::numeric_limits<float>::min();
  const float subnormal = std::numeric_limits<float>::denorm_min() * 1024;
  volatile float operand = smallest_normal, stored = subnormal;  // volatile: computed at run time
  const auto made = [&] { return operand * 0.5f; };              // subnormal under IEEE
  const auto read = [&] { return stored * 2.0f; };               // 0 if the input counts as 0
  ASSERT_EQ(made(), smallest_normal * 0.5f) << "this test's own thread flushes subnormals";
  EXPECT_TRUE(flush_denormals());  // the default
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (bool flush : testing::kFlushDenormalModes) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, flush " << flush);
      const testing::FlushDenormalsScope modes(flush);
      std::vector<float> made_by(64), read_by(64);
      detail::parallel_for(64, [&](std::int64_t i) {
        made_by[static_cast<std::size_t>(i)] = made();
        read_by[static_cast<std::size_t>(i)] = read();
      });
      for (std::size_t i = 0; i < made_by.size(); ++i) {
        EXPECT_EQ(made_by[i], flush ? 0.f : smallest_normal * 0.5f) << "item " << i;
        EXPECT_EQ(read_by[i], flush ? 0.f : subnormal * 2.0f) << "item " << i;
      }
      EXPECT_EQ(made(), smallest_normal * 0.5f) << "the caller's modes after the call";
      EXPECT_EQ(read(), subnormal * 2.0f) << "the caller's modes after the call";
    }
  }
  set_num_threads(0);
  EXPECT_TRUE(flush_denormals());  // FlushDenormalsScope restored it
}

// A calling thread that flushes already (a program built with -ffast-math starts so):
// set_flush_denormals(false) still gives every thread of the call gradual underflow, so that the
// arithmetic does not depend on which thread runs an item, and the caller gets its modes back.
TEST(Threads, GradualUnderflowWhateverTheCallerHad) {
  const float smallest_normal = std::numeric_limits<float>::min();
  volatile float operand = smallest_normal;
  const auto made = [&] { return operand * 0.5f; };
  const detail::DenormalModes callers_own(/*flush=*/true);
  ASSERT_EQ(made(), 0.f);
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    set_num_threads(threads);
    const testing::FlushDenormalsScope modes(false);
    std::vector<float> made_by(64);
    detail::parallel_for(64,
                         [&](std::int64_t i) { made_by[static_cast<std::size_t>(i)] = made(); });
    for (std::size_t i = 0; i < made_by.size(); ++i)
      EXPECT_EQ(made_by[i], smallest_normal * 0.5f) << "item " << i;
    EXPECT_EQ(made(), 0.f) << "the caller's modes after the call";
  }
  set_num_threads(0);
}
#endif

// Only the modes change: a floating-point exception flag that an item raises on the calling
// thread (one thread: every item runs there) is still raised after the call, as without phasor's
// modes.
TEST(Threads, ParallelForKeepsTheCallersExceptionFlags) {
  set_num_threads(1);
  volatile float three = 3.f;
  for (bool flush : testing::kFlushDenormalModes) {
    SCOPED_TRACE(::testing::Message() << "flush " << flush);
    const testing::FlushDenormalsScope modes(flush);
    std::feclearexcept(FE_ALL_EXCEPT);
    detail::parallel_for(1, [&](std::int64_t) {
      volatile float third = 1.f / three;  // inexact
      (void)third;
    });
    EXPECT_TRUE(std::fetestexcept(FE_INEXACT));
  }
  set_num_threads(0);
}

// In a fresh process (each variable is read once): with `name` set to `value`, a parallel_for on
// two threads throws a phasor::Error on the calling thread that names the variable and quotes the
// value.
void expect_environment_error(const char* name, const char* value) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv(name, value, 1);
        try {
          if (std::string(name) != "PHASOR_NUM_THREADS") set_num_threads(2);
          detail::parallel_for(4, [](std::int64_t) {});
        } catch (const Error& e) {
          const std::string what = e.what();
          std::exit(what.find(name) != std::string::npos &&
                            what.find(std::string("'") + value + "'") != std::string::npos
                        ? 0
                        : 2);
        }
        std::exit(3);
      },
      ::testing::ExitedWithCode(0), "")
      << name << "=" << value;
}

TEST(ThreadsDeathTest, BadEnvironmentIsAClearError) {
  expect_environment_error("PHASOR_NUM_THREADS", "many");
  expect_environment_error("PHASOR_NUM_THREADS", "0");
  expect_environment_error("PHASOR_NUM_THREADS", "99999999999999999999");
  expect_environment_error("PHASOR_FLUSH_DENORMALS", "yes");
  expect_environment_error("PHASOR_FLUSH_DENORMALS", "2");
  expect_environment_error("PHASOR_SPIN_US", "soon");
  expect_environment_error("PHASOR_SPIN_US", "-1");
}

}  // namespace
}  // namespace phasor
