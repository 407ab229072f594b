// Tests of the shared machinery: views, argument checks, cu_seqlens, threads.
#include <atomic>
#include <vector>

#include "common/check.h"
#include "common/parallel.h"
#include "common/slices.h"
#include "test_util.h"

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
                        {"'q'", "float32 or float64", "int32"});
  testing::expect_error(
      [&] { detail::check_float_rank("op", "q", TensorView{}, 4, "[B, T, H, K]"); },
      {"'q'", "none"});
}

TEST(Check, CuSeqlensValidation) {
  Tensor ok = testing::cu_seqlens({3, 0, 1, 4});
  auto seqs = detail::sequences("op", ok.view(), 1, 8);
  ASSERT_EQ(seqs.size(), 4u);
  EXPECT_EQ(seqs[1].length, 0);
  EXPECT_EQ(seqs[3].start, 4);
  testing::expect_error([&] { detail::sequences("op", ok.view(), 2, 8); },
                        {"'cu_seqlens'", "B = 2"});
  testing::expect_error([&] { detail::sequences("op", ok.view(), 1, 9); },
                        {"'cu_seqlens'", "T = 9"});
  Tensor bad = Tensor::from({3}, {0, 5, 3}, DType::int64);
  testing::expect_error([&] { detail::sequences("op", bad.view(), 1, 3); },
                        {"non-decreasing", "cu_seqlens[2] = 3"});
  Tensor start = Tensor::from({2}, {1, 3}, DType::int64);
  testing::expect_error([&] { detail::sequences("op", start.view(), 1, 3); },
                        {"cu_seqlens[0] = 0"});
  Tensor fl = Tensor::from({2}, {0, 3}, DType::float32);
  testing::expect_error([&] { detail::sequences("op", fl.view(), 1, 3); }, {"int32 or int64"});
}

TEST(Check, LogGatesMustBeNonPositive) {
  Tensor g = Tensor::from({1, 2, 2}, {-1, 0, -INFINITY, 0.25});
  testing::expect_error([&] { detail::check_log_gates("op", "g", g.view()); },
                        {"'g'", "g[0, 1, 1] = 0.25"});
  Tensor nan = Tensor::from({2}, {-1, NAN});
  testing::expect_error([&] { detail::check_log_gates("op", "g", nan.view()); }, {"g[1]"});
  Tensor fine = Tensor::from({3}, {-1, 0, -INFINITY});
  EXPECT_NO_THROW(detail::check_log_gates("op", "g", fine.view()));
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

}  // namespace
}  // namespace phasor
