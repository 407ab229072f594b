// phasor::cp::forgetting_attn (phasor/context_parallel.h): each rank's slice of o and of every
// gradient equals the slice of the single-process phasor::forgetting_attn on the whole sequence
// (float64 to 1e-12 relative RMS, float32 to 1e-5), over 2, 3 and 4 ranks as threads of this
// process (Gloo on the loopback); bad input stops every rank with an error naming the argument.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "phasor/context_parallel.h"
#include "phasor/testing/distributed.h"
#include "phasor/torch.h"
#include "torch/layer_util.h"  // torch_detail::view_of

namespace {

using phasor::Impl;
using phasor::RotaryLayout;

struct Case {
  std::vector<std::int64_t> lengths;  // per rank; the world size is their count
  std::int64_t B = 1, HQ = 2, H = 2, K = 8, V = 8;
  c10::optional<std::int64_t> window;
  std::vector<std::int64_t> cu;  // global cu_seqlens (empty: none)
  bool theta = false, slope_q = false, slope_k = false;
  RotaryLayout layout = RotaryLayout::half_split;
  double gate_min = -1.0;            // g uniform in [gate_min, 0]
  double q_gain = 1.0;               // sharper softmax rows: dominant keys (P > 1/2) anywhere
  std::int64_t minus_inf_gate = -1;  // a token whose gates are −inf (−1: none)
  at::ScalarType dtype = at::kDouble;
  Impl impl = Impl::chunk;
  std::int64_t block_size = 4;
  bool strided = false;  // each rank's q, k, v, g as non-contiguous views (heads-major storage)
};

double relative_rms(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  if (w.numel() == 0) return g.numel() == 0 ? 0.0 : 1.0;
  const double denom = w.pow(2).mean().sqrt().item<double>();
  const double err = (g - w).pow(2).mean().sqrt().item<double>();
  if (!std::isfinite(err)) return std::numeric_limits<double>::infinity();
  return denom > 0 ? err / denom : err;
}

struct Inputs {
  at::Tensor q, k, v, g, theta, a, b, d_o;
};

Inputs make_inputs(const Case& c, std::int64_t T) {
  at::manual_seed(1234);
  const auto opt = at::TensorOptions().dtype(c.dtype);
  Inputs in;
  in.q = at::randn({c.B, T, c.HQ, c.K}, opt) * c.q_gain;
  in.k = at::randn({c.B, T, c.H, c.K}, opt);
  in.v = at::randn({c.B, T, c.H, c.V}, opt);
  in.g = at::rand({c.B, T, c.HQ}, opt) * c.gate_min;
  if (c.minus_inf_gate >= 0)
    in.g.select(1, c.minus_inf_gate).fill_(-std::numeric_limits<double>::infinity());
  if (c.theta) in.theta = at::randn({c.B, T, c.H, c.K / 2}, opt) * 2.0;
  if (c.slope_q) in.a = at::randn({c.B, T, c.HQ}, opt) * 0.2;
  if (c.slope_k) in.b = at::randn({c.B, T, c.H}, opt) * 0.2;
  in.d_o = at::randn({c.B, T, c.HQ, c.V}, opt);
  return in;
}

c10::optional<at::Tensor> opt_of(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// The tensors of a forward + backward: o, then the gradients of q, k, v, g, θ, a, b.
const char* const kNames[] = {
    "o", "dq", "dk", "dv", "dg", "dtheta", "dbias_q_slope", "dbias_k_slope"};

std::vector<at::Tensor> leaves(const Inputs& in) {
  std::vector<at::Tensor> out;
  for (const at::Tensor* t : {&in.q, &in.k, &in.v, &in.g, &in.theta, &in.a, &in.b})
    out.push_back(t->defined() ? t->detach().clone().requires_grad_(true) : at::Tensor());
  return out;
}

// Runs forward and backward; returns o and the gradients (undefined where absent).
template <class Op>
std::vector<at::Tensor> run(const std::vector<at::Tensor>& x, const at::Tensor& d_o, Op&& op) {
  const at::Tensor o = op(x[0], x[1], x[2], x[3], opt_of(x[4]), opt_of(x[5]), opt_of(x[6]));
  (o * d_o).sum().backward();
  std::vector<at::Tensor> out{o.detach()};
  for (const at::Tensor& t : x) out.push_back(t.defined() ? t.grad() : at::Tensor());
  return out;
}

void check_case(const Case& c) {
  const int world = static_cast<int>(c.lengths.size());
  const std::int64_t T = std::accumulate(c.lengths.begin(), c.lengths.end(), std::int64_t{0});
  const Inputs in = make_inputs(c, T);
  c10::optional<at::Tensor> cu;
  if (!c.cu.empty()) cu = at::tensor(c.cu, at::TensorOptions().dtype(at::kLong));

  const std::vector<at::Tensor> want =
      run(leaves(in), in.d_o, [&](auto q, auto k, auto v, auto g, auto th, auto a, auto b) {
        return phasor::forgetting_attn(q, k, v, g, c.impl, c10::nullopt, c.window, cu, c.block_size,
                                       th, c.layout, a, b);
      });

  const double tol = c.dtype == at::kDouble ? 1e-12 : 1e-5;
  std::mutex mutex;
  std::vector<std::string> failures;
  phasor::testing::run_ranks(
      world, [&](int rank, const phasor::distributed::ProcessGroupPtr& group) {
        const std::int64_t start =
            std::accumulate(c.lengths.begin(), c.lengths.begin() + rank, std::int64_t{0});
        const std::int64_t len = c.lengths[static_cast<std::size_t>(rank)];
        auto slice = [&](const at::Tensor& t) {
          return t.defined() ? t.narrow(1, start, len).contiguous() : at::Tensor();
        };
        Inputs mine{slice(in.q),     slice(in.k), slice(in.v), slice(in.g),
                    slice(in.theta), slice(in.a), slice(in.b), slice(in.d_o)};
        if (c.strided)
          for (at::Tensor* t : {&mine.q, &mine.k, &mine.v, &mine.g})
            *t = t->transpose(1, 2).contiguous().transpose(1, 2);
        const std::vector<at::Tensor> got = run(
            leaves(mine), mine.d_o, [&](auto q, auto k, auto v, auto g, auto th, auto a, auto b) {
              return phasor::cp::forgetting_attn(q, k, v, g, c.impl, c10::nullopt, c.window, cu,
                                                 c.block_size, th, c.layout, a, b, group);
            });
        for (std::size_t i = 0; i < want.size(); ++i) {
          if (!want[i].defined()) continue;
          std::string problem;
          if (!got[i].defined()) {
            problem = "missing";
          } else {
            const double err = relative_rms(got[i], slice(want[i]));
            if (!(err <= tol)) problem = "relative RMS error " + std::to_string(err);
          }
          if (!problem.empty()) {
            std::lock_guard<std::mutex> lock(mutex);
            failures.push_back("rank " + std::to_string(rank) + " " + kNames[i] + ": " + problem);
          }
        }
      });
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

TEST(ContextParallelFox, TwoRanksEqualSlices) {
  Case c;
  c.lengths = {6, 6};
  check_case(c);
}

TEST(ContextParallelFox, UnequalSlicesThreeRanks) {
  Case c;
  c.lengths = {5, 1, 9};
  check_case(c);
}

TEST(ContextParallelFox, EmptySlices) {
  Case c;
  c.lengths = {7, 0, 6};
  check_case(c);
  c.lengths = {0, 5, 0, 6};
  check_case(c);
}

TEST(ContextParallelFox, GroupedQueriesAndKDifferentFromV) {
  Case c;
  c.lengths = {4, 6, 5};
  c.HQ = 4, c.H = 2, c.K = 6, c.V = 10;
  check_case(c);
  c.strided = true;
  check_case(c);
}

TEST(ContextParallelFox, WindowSmallerThanASlice) {
  Case c;
  c.lengths = {8, 8, 8};
  c.window = 3;
  check_case(c);
}

TEST(ContextParallelFox, WindowLargerThanASlice) {
  Case c;
  c.lengths = {8, 5, 8};
  c.window = 11;
  check_case(c);
}

TEST(ContextParallelFox, WindowSpanningSeveralRanks) {
  Case c;
  c.lengths = {5, 3, 5, 6};
  c.window = 13;
  check_case(c);
  c.window = 1;  // only the diagonal
  check_case(c);
}

TEST(ContextParallelFox, StrongGates) {
  Case c;
  c.lengths = {6, 4, 7};
  c.gate_min = -20;
  check_case(c);
}

// Sharp rows put a dominant key (P_ij* > 1/2, whose dℓ the kernels form from the rest of the row)
// in the diagonal block or on an earlier rank; the row's cross-block sums must reach the kernel.
TEST(ContextParallelFox, DominantKeysOnEitherSide) {
  Case c;
  c.lengths = {6, 5, 7};
  c.q_gain = 6;
  c.gate_min = -0.05;
  check_case(c);
  c.impl = Impl::recurrent;
  check_case(c);
  c.dtype = at::kFloat;
  check_case(c);
}

TEST(ContextParallelFox, MinusInfinityGate) {
  Case c;
  c.lengths = {6, 4, 7};
  c.minus_inf_gate = 8;  // on rank 1: cuts every later query off from the keys before it
  check_case(c);
}

TEST(ContextParallelFox, RotationBothLayouts) {
  Case c;
  c.lengths = {5, 7, 4};
  c.HQ = 4, c.H = 2;
  c.theta = true;
  check_case(c);
  c.layout = RotaryLayout::interleaved;
  check_case(c);
}

TEST(ContextParallelFox, GrapeSlopes) {
  Case c;
  c.lengths = {5, 6, 4};
  c.HQ = 4, c.H = 2;
  c.slope_q = c.slope_k = true;
  check_case(c);
  c.slope_k = false;  // a only
  check_case(c);
  c.slope_q = false, c.slope_k = true;  // b only
  check_case(c);
}

TEST(ContextParallelFox, VarlenAcrossRanks) {
  Case c;
  // Sequences [0,3) [3,3) (empty) [3,14) (spans ranks 0–2) [14,20) (straddles 2|3) [20,27).
  c.lengths = {5, 7, 4, 11};
  c.cu = {0, 3, 3, 14, 20, 27};
  check_case(c);
  c.window = 4;
  c.HQ = 4, c.H = 2;
  c.theta = c.slope_q = c.slope_k = true;
  check_case(c);
  // A sequence boundary exactly at a rank boundary, and an empty rank inside a sequence.
  c.lengths = {5, 0, 4, 6};
  c.cu = {0, 5, 12, 15};
  c.window.reset();
  check_case(c);
}

TEST(ContextParallelFox, BatchOfRowsWithoutCuSeqlens) {
  Case c;
  c.lengths = {4, 5, 3};
  c.B = 2;
  c.slope_q = true;
  check_case(c);
}

TEST(ContextParallelFox, RecurrentDiagonalBlock) {
  Case c;
  c.lengths = {5, 0, 6, 4};
  c.impl = Impl::recurrent;
  c.HQ = 4, c.H = 2;
  c.window = 6;
  c.theta = c.slope_q = c.slope_k = true;
  check_case(c);
}

TEST(ContextParallelFox, Float32EverythingTogether) {
  Case c;
  c.dtype = at::kFloat;
  c.lengths = {21, 9, 0, 30};
  c.HQ = 4, c.H = 2, c.K = 16, c.V = 12;
  c.cu = {0, 11, 11, 40, 60};
  c.window = 17;
  c.theta = c.slope_q = c.slope_k = true;
  c.gate_min = -20;
  c.block_size = 8;
  check_case(c);
  c.impl = Impl::recurrent;
  check_case(c);
}

TEST(ContextParallelFox, Float32LongerSlices) {
  Case c;
  c.dtype = at::kFloat;
  c.lengths = {150, 90, 200};
  c.HQ = 4, c.H = 2, c.K = 32, c.V = 16;
  c.block_size = 32;
  c.slope_q = true;
  check_case(c);
}

// ---- errors -------------------------------------------------------------------------------------

// Runs body on every rank and returns each rank's error message ("" for none).
std::vector<std::string> errors_of(
    int world, const std::function<void(int, const phasor::distributed::ProcessGroupPtr&)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  phasor::testing::run_ranks(
      world, [&](int rank, const phasor::distributed::ProcessGroupPtr& group) {
        try {
          body(rank, group);
        } catch (const c10::Error& e) {
          errors[static_cast<std::size_t>(rank)] = e.what_without_backtrace();
        }
      });
  return errors;
}

at::Tensor randn(std::vector<std::int64_t> sizes) {
  return at::randn(sizes, at::TensorOptions().dtype(at::kDouble));
}

TEST(ContextParallelFoxErrors, BadInputOnOneRankStopsEveryRank) {
  const auto errors = errors_of(2, [](int rank, const auto& group) {
    at::Tensor g = -at::rand({1, 4, 2}, at::TensorOptions().dtype(at::kDouble));
    if (rank == 1) g[0][2][1] = 0.5;  // a positive log gate
    phasor::cp::parallel_forgetting_attn(randn({1, 4, 2, 8}), randn({1, 4, 2, 8}),
                                         randn({1, 4, 2, 8}), g, c10::nullopt, c10::nullopt,
                                         c10::nullopt, 64, c10::nullopt, RotaryLayout::half_split,
                                         c10::nullopt, c10::nullopt, group);
  });
  EXPECT_NE(errors[1].find("cp::parallel_forgetting_attn: argument 'g'"), std::string::npos)
      << errors[1];
  // The other rank names the rank and carries its message, so both name the argument.
  EXPECT_NE(errors[0].find("rank 1 refused its arguments"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("argument 'g'"), std::string::npos) << errors[0];
}

TEST(ContextParallelFoxErrors, ShapesAndOptionsMustAgreeAcrossRanks) {
  auto errors = errors_of(2, [](int rank, const auto& group) {
    const std::int64_t HQ = rank == 0 ? 2 : 4;
    phasor::cp::parallel_forgetting_attn(
        randn({1, 4, HQ, 8}), randn({1, 4, 2, 8}), randn({1, 4, 2, 8}),
        -at::rand({1, 4, HQ}, at::TensorOptions().dtype(at::kDouble)), c10::nullopt, c10::nullopt,
        c10::nullopt, 64, c10::nullopt, RotaryLayout::half_split, c10::nullopt, c10::nullopt,
        group);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("argument 'q': expected the same number of query heads HQ on every rank, got "
                     "2 on rank 0 and 4 on rank 1"),
              std::string::npos)
        << e;

  errors = errors_of(2, [](int rank, const auto& group) {
    phasor::cp::parallel_forgetting_attn(
        randn({1, 4, 2, 8}), randn({1, 4, 2, 8}), randn({1, 4, 2, 8}),
        -at::rand({1, 4, 2}, at::TensorOptions().dtype(at::kDouble)), c10::nullopt,
        rank == 0 ? c10::optional<std::int64_t>(3) : c10::nullopt, c10::nullopt, 64, c10::nullopt,
        RotaryLayout::half_split, c10::nullopt, c10::nullopt, group);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("argument 'window_size'"), std::string::npos) << e;
}

TEST(ContextParallelFoxErrors, ArgumentsNamed) {
  auto call = [](Impl impl, c10::optional<std::int64_t> window, c10::optional<at::Tensor> cu,
                 at::Tensor k) {
    return errors_of(2, [=](int, const auto& group) {
      phasor::cp::forgetting_attn(randn({1, 4, 2, 8}), k, randn({1, 4, 2, 8}),
                                  -at::rand({1, 4, 2}, at::TensorOptions().dtype(at::kDouble)),
                                  impl, c10::nullopt, window, cu, 64, c10::nullopt,
                                  RotaryLayout::half_split, c10::nullopt, c10::nullopt, group);
    });
  };
  const at::Tensor k = randn({1, 4, 2, 8});
  for (const auto& e : call(Impl::reference, c10::nullopt, c10::nullopt, k))
    EXPECT_NE(e.find("argument 'impl'"), std::string::npos) << e;
  for (const auto& e : call(Impl::chunk, 0, c10::nullopt, k))
    EXPECT_NE(e.find("cp::parallel_forgetting_attn: argument 'window_size'"), std::string::npos)
        << e;
  // cu_seqlens must cover the 8 tokens of both ranks.
  const at::Tensor short_cu = at::tensor(std::vector<std::int64_t>{0, 3, 6});
  for (const auto& e : call(Impl::chunk, c10::nullopt, short_cu, k))
    EXPECT_NE(e.find("argument 'cu_seqlens'"), std::string::npos) << e;
  for (const auto& e : call(Impl::recurrent, c10::nullopt, c10::nullopt, randn({1, 4, 2, 6})))
    EXPECT_NE(e.find("cp::forgetting_attn_recurrent: argument 'k'"), std::string::npos) << e;
  EXPECT_THROW(phasor::cp::parallel_forgetting_attn(
                   randn({1, 4, 2, 8}), k, randn({1, 4, 2, 8}),
                   -at::rand({1, 4, 2}, at::TensorOptions().dtype(at::kDouble)), c10::nullopt,
                   c10::nullopt, c10::nullopt, 64, c10::nullopt, RotaryLayout::half_split,
                   c10::nullopt, c10::nullopt, phasor::distributed::ProcessGroupPtr()),
               c10::Error);
}

TEST(ContextParallelFoxErrors, CpuComputeDeviceOnly) {
  const auto errors = errors_of(2, [](int, const auto& group) {
    phasor::ComputeDeviceGuard device(phasor::Device::emulated);
    phasor::cp::parallel_forgetting_attn(
        randn({1, 4, 2, 8}), randn({1, 4, 2, 8}), randn({1, 4, 2, 8}),
        -at::rand({1, 4, 2}, at::TensorOptions().dtype(at::kDouble)), c10::nullopt, c10::nullopt,
        c10::nullopt, 64, c10::nullopt, RotaryLayout::half_split, c10::nullopt, c10::nullopt,
        group);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("argument 'compute device'"), std::string::npos) << e;
}

// The core's dlogit_sums_elsewhere needs a kernel that takes the merged o and lse.
TEST(ContextParallelFoxErrors, DlogitSumsElsewhereNeedsChunkOrRecurrent) {
  const at::Tensor q = randn({1, 4, 2, 8}), g = -at::rand({1, 4, 2}, at::kDouble);
  const at::Tensor d_o = randn({1, 4, 2, 8}), sums = randn({1, 4, 2}), dq = at::empty_like(q);
  phasor::ForgettingAttnParams p;
  p.q = phasor::torch_detail::view_of(q), p.k = p.q, p.v = p.q;
  p.g = phasor::torch_detail::view_of(g);
  p.dlogit_sums_elsewhere = phasor::torch_detail::view_of(sums);
  phasor::ForgettingAttnGrads grads;
  grads.dq = phasor::torch_detail::view_of(dq);
  try {
    phasor::forgetting_attn_backward(p, Impl::reference, phasor::torch_detail::view_of(d_o), {}, {},
                                     grads);
    ADD_FAILURE() << "no error";
  } catch (const phasor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'dlogit_sums_elsewhere'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
