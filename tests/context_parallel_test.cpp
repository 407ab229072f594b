// phasor/context_parallel.h, GLA / Gated DeltaNet / Selective RoPE phases: every rank runs the op
// on its slice over a Gloo group on the loopback (ranks as threads, phasor::testing::run_ranks);
// outputs, final states and every gradient must equal the single-process op on the whole batch
// (float64 to 1e-12, float32 to 1e-5 relative RMS).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "phasor/common.h"
#include "phasor/context_parallel.h"
#include "phasor/testing/distributed.h"
#include "phasor/torch.h"

namespace {

using phasor::Impl;
using phasor::OutputAndState;
using phasor::distributed::ProcessGroupPtr;
using phasor::testing::run_ranks;

double rel_rms(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  EXPECT_EQ(a.sizes(), e.sizes());
  if (a.sizes() != e.sizes()) return 1e300;
  const double norm = e.norm().item<double>(), diff = (a - e).norm().item<double>();
  if (e.numel() == 0) return 0.0;
  return norm == 0.0 ? diff : diff / norm;
}

enum class Family { gla, gdn };

struct Case {
  std::vector<std::int64_t> lengths;  // slice length of each rank
  std::int64_t B = 1;
  std::vector<std::int64_t> cu;  // global cu_seqlens; empty: none
  std::int64_t H = 2, HV = 2, K = 8, V = 6;
  bool initial_state = true, final_state = true, theta = false, l2norm = false;
  bool loss_on_output = true;  // false: the loss uses the final state only
  bool plain_sums = false;  // loss Σ o + Σ final: gradients arrive as expanded (stride 0) views
  Impl impl = Impl::chunk;
  std::int64_t chunk_size = 4;
  phasor::RotaryLayout rotary_layout = phasor::RotaryLayout::half_split;
  at::ScalarType dtype = at::kDouble;
};

// The per-token inputs (dimension 1 is T) and the shared ones; names as the gradients'.
struct Inputs {
  std::map<std::string, at::Tensor> tokens;  // q, k, v, g, (beta), (theta), and do
  at::Tensor h0, d_final, cu;
};

Inputs make_inputs(Family family, const Case& c, std::uint64_t seed) {
  torch::manual_seed(seed);
  std::int64_t T = 0;
  for (auto n : c.lengths) T += n;
  const auto opt = at::TensorOptions().dtype(c.dtype);
  const std::int64_t Hs = family == Family::gla ? c.H : c.HV;
  const std::int64_t N = c.cu.empty() ? c.B : static_cast<std::int64_t>(c.cu.size()) - 1;
  Inputs in;
  in.tokens["q"] = at::randn({c.B, T, c.H, c.K}, opt);
  in.tokens["k"] = at::randn({c.B, T, c.H, c.K}, opt) * 0.5;
  in.tokens["v"] = at::randn({c.B, T, Hs, c.V}, opt);
  if (family == Family::gla) {
    in.tokens["g"] = at::log_sigmoid(at::randn({c.B, T, c.H, c.K}, opt) + 2.0);
  } else {
    in.tokens["g"] = at::log_sigmoid(at::randn({c.B, T, Hs}, opt) + 2.0);
    in.tokens["beta"] = at::sigmoid(at::randn({c.B, T, Hs}, opt));
  }
  if (c.theta) in.tokens["theta"] = at::randn({c.B, T, c.H, c.K / 2}, opt);
  in.tokens["do"] = at::randn({c.B, T, Hs, c.V}, opt);
  if (c.initial_state) in.h0 = at::randn({N, Hs, c.K, c.V}, opt);
  in.d_final =
      at::randn({N, Hs, c.K, c.V}, opt.dtype(c.dtype == at::kDouble ? at::kDouble : at::kFloat));
  if (!c.cu.empty()) in.cu = at::tensor(c.cu, at::kLong);
  return in;
}

c10::optional<at::Tensor> maybe(const at::Tensor& t) {
  if (!t.defined()) return c10::nullopt;
  return t;
}

// Leaves that require grad: the per-token tensors of [begin, end) and the initial state.
struct Leaves {
  std::map<std::string, at::Tensor> t;
  at::Tensor h0;
};

Leaves make_leaves(const Inputs& in, std::int64_t begin, std::int64_t end) {
  Leaves l;
  for (const auto& [name, x] : in.tokens) {
    if (name == "do") continue;
    l.t[name] = x.narrow(1, begin, end - begin).clone().requires_grad_(true);
  }
  if (in.h0.defined()) l.h0 = in.h0.clone().requires_grad_(true);
  return l;
}

OutputAndState call(Family family, const Case& c, const Leaves& l, const at::Tensor& cu,
                    const ProcessGroupPtr* group) {
  auto t = [&](const char* name) {
    auto it = l.t.find(name);
    return it == l.t.end() ? at::Tensor() : it->second;
  };
  const auto theta = maybe(t("theta"));
  if (family == Family::gla) {
    if (group)
      return phasor::cp::gla(t("q"), t("k"), t("v"), t("g"), c.impl, c10::nullopt, maybe(l.h0),
                             c.final_state, maybe(cu), c.chunk_size, theta, c.rotary_layout,
                             *group);
    return phasor::gla(t("q"), t("k"), t("v"), t("g"), c.impl, c10::nullopt, maybe(l.h0),
                       c.final_state, maybe(cu), c.chunk_size, theta, c.rotary_layout);
  }
  if (group)
    return phasor::cp::gated_delta_rule(
        t("q"), t("k"), t("v"), t("g"), t("beta"), c.impl, c10::nullopt, maybe(l.h0), c.final_state,
        maybe(cu), c.l2norm, c.chunk_size, theta, phasor::RotaryLayout::half_split, *group);
  return phasor::gated_delta_rule(t("q"), t("k"), t("v"), t("g"), t("beta"), c.impl, c10::nullopt,
                                  maybe(l.h0), c.final_state, maybe(cu), c.l2norm, c.chunk_size,
                                  theta);
}

// Σ o·do + Σ final·dF, backward; the results and gradients by name.
std::map<std::string, at::Tensor> run_and_differentiate(Family family, const Case& c,
                                                        const Inputs& in, std::int64_t begin,
                                                        std::int64_t end,
                                                        const ProcessGroupPtr* group) {
  const Leaves l = make_leaves(in, begin, end);
  auto [o, final_state] = call(family, c, l, in.cu, group);
  at::Tensor loss = c.loss_on_output ? (o * in.tokens.at("do").narrow(1, begin, end - begin)).sum()
                                     : at::zeros({}, o.options());
  if (final_state) loss = loss + (*final_state * in.d_final).sum();
  if (c.plain_sums)
    loss = o.sum() + (final_state ? final_state->sum() : at::zeros({}, o.options()));
  loss.backward();
  std::map<std::string, at::Tensor> out;
  out["o"] = o.detach();
  if (final_state) out["final_state"] = final_state->detach();
  for (const auto& [name, x] : l.t) out["d" + name] = x.grad();
  if (l.h0.defined()) out["dh0"] = l.h0.grad();
  return out;
}

// float64 to 1e-12, float32 to 1e-5; bfloat16 (rounded to 8 significant bits on input and
// output, computed in float32) to 2e-2.
double tolerance(const Case& c) {
  if (c.dtype == at::kDouble) return 1e-12;
  return c.dtype == at::kFloat ? 1e-5 : 2e-2;
}

// Runs the case single-process and on len(lengths) ranks; returns the worst relative RMS error
// over every output and gradient of every rank (and checks each is present).
double worst_error(Family family, const Case& c, std::uint64_t seed = 1) {
  const Inputs in = make_inputs(family, c, seed);
  const std::int64_t T = in.tokens.at("q").size(1);
  const auto expected = run_and_differentiate(family, c, in, 0, T, nullptr);
  const int world = static_cast<int>(c.lengths.size());
  std::mutex mutex;
  double worst = 0;
  std::vector<std::string> problems;
  run_ranks(world, [&](int rank, const ProcessGroupPtr& group) {
    std::int64_t begin = 0;
    for (int r = 0; r < rank; ++r) begin += c.lengths[static_cast<std::size_t>(r)];
    const std::int64_t end = begin + c.lengths[static_cast<std::size_t>(rank)];
    const auto actual = run_and_differentiate(family, c, in, begin, end, &group);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, e] : expected) {
      auto it = actual.find(name);
      if (it == actual.end() || !it->second.defined()) {
        problems.push_back("rank " + std::to_string(rank) + ": " + name + " missing");
        continue;
      }
      const bool shared = name == "final_state" || name == "dh0";
      const double err = rel_rms(it->second, shared ? e : e.narrow(1, begin, end - begin));
      if (err > worst) worst = err;
      if (!(err < tolerance(c)))
        problems.push_back("rank " + std::to_string(rank) + ": " + name + " rel RMS " +
                           std::to_string(err));
    }
  });
  for (const auto& p : problems) ADD_FAILURE() << p;
  EXPECT_FALSE(expected.empty());
  return worst;
}

class ContextParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    phasor::set_num_threads(1);
  }
};

// ---- GLA ----------------------------------------------------------------------------------------

TEST_F(ContextParallel, GlaFixedLengthUnequalSlicesBothImpls) {
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    Case c;
    c.lengths = {5, 9, 3};  // T = 17, not a multiple of the chunk size 4
    c.B = 2;
    c.impl = impl;
    EXPECT_LT(worst_error(Family::gla, c), tolerance(c)) << phasor::to_string(impl);
  }
}

TEST_F(ContextParallel, GlaEmptySlicesAndNoInitialState) {
  Case c;
  c.lengths = {0, 6, 0, 7};  // empty first and third slices
  c.B = 2;
  c.initial_state = false;
  EXPECT_LT(worst_error(Family::gla, c), tolerance(c));
  c.lengths = {6, 7, 0};  // empty last slice
  c.initial_state = true;
  c.final_state = false;
  EXPECT_LT(worst_error(Family::gla, c), tolerance(c));
}

TEST_F(ContextParallel, TinySlicesAndNoTokensAtAll) {
  for (Family family : {Family::gla, Family::gdn}) {
    Case c;
    c.lengths = {1, 1, 2, 1};  // slices shorter than a chunk
    c.HV = family == Family::gdn ? 4 : 2;
    EXPECT_LT(worst_error(family, c), tolerance(c));
    c.lengths = {9};  // a group of one rank: the single-process op
    EXPECT_LT(worst_error(family, c), tolerance(c));
    c.lengths = {0, 0, 0};  // no tokens: the final states are the initial ones
    c.B = 2;
    EXPECT_LT(worst_error(family, c), tolerance(c));
    c.B = 1;
    c.cu = {0, 0, 0};
    EXPECT_LT(worst_error(family, c), tolerance(c));
  }
}

TEST_F(ContextParallel, GlaVarlenSequencesStraddlingBoundaries) {
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    Case c;
    c.impl = impl;
    // Boundaries at 5 and 12: [0,3), an empty sequence, [3,12) crossing 5 and ending exactly at
    // 12, [12,13) starting exactly at 12, [13,20).
    c.lengths = {5, 7, 8};
    c.cu = {0, 3, 3, 12, 13, 20};
    EXPECT_LT(worst_error(Family::gla, c), tolerance(c)) << phasor::to_string(impl);
    // [2,18) spans ranks 0, 1, the empty rank 2 and rank 3.
    c.lengths = {6, 5, 0, 9};
    c.cu = {0, 2, 18, 20};
    EXPECT_LT(worst_error(Family::gla, c), tolerance(c)) << phasor::to_string(impl);
  }
}

TEST_F(ContextParallel, GlaVarlenWithRotationAndEmptyTrailingSequence) {
  Case c;
  c.lengths = {4, 9, 7};
  c.cu = {0, 11, 17, 20, 20};
  c.theta = true;
  c.K = 8;
  c.V = 10;
  EXPECT_LT(worst_error(Family::gla, c), tolerance(c));
  c.initial_state = false;
  EXPECT_LT(worst_error(Family::gla, c, 2), tolerance(c));
  c.rotary_layout = phasor::RotaryLayout::interleaved;
  EXPECT_LT(worst_error(Family::gla, c, 3), tolerance(c));
  EXPECT_LT(worst_error(Family::gdn, c, 3), tolerance(c));
}

TEST_F(ContextParallel, GlaFloat32) {
  Case c;
  c.dtype = at::kFloat;
  c.lengths = {7, 0, 10};
  c.cu = {0, 5, 15, 17};
  c.theta = true;
  EXPECT_LT(worst_error(Family::gla, c), tolerance(c));
}

// ---- Gated DeltaNet -----------------------------------------------------------------------------

TEST_F(ContextParallel, GatedDeltaRuleFixedLengthMoreValueHeadsBothImpls) {
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    Case c;
    c.lengths = {6, 3, 8, 0};
    c.B = 2;
    c.H = 2;
    c.HV = 4;  // HV > H
    c.impl = impl;
    EXPECT_LT(worst_error(Family::gdn, c), tolerance(c)) << phasor::to_string(impl);
    c.loss_on_output = false;  // gradients from the final state alone
    EXPECT_LT(worst_error(Family::gdn, c), tolerance(c)) << phasor::to_string(impl);
  }
}

TEST_F(ContextParallel, GatedDeltaRuleVarlenL2NormRotation) {
  for (Impl impl : {Impl::chunk, Impl::recurrent}) {
    Case c;
    c.impl = impl;
    c.HV = 4;
    c.l2norm = true;
    c.theta = true;
    c.lengths = {5, 7, 8};
    c.cu = {0, 3, 3, 12, 13, 20};
    EXPECT_LT(worst_error(Family::gdn, c), tolerance(c)) << phasor::to_string(impl);
    c.lengths = {6, 5, 0, 9};
    c.cu = {0, 2, 18, 20};
    c.initial_state = false;
    EXPECT_LT(worst_error(Family::gdn, c), tolerance(c)) << phasor::to_string(impl);
  }
}

TEST_F(ContextParallel, ExpandedIncomingGradients) {
  for (Family family : {Family::gla, Family::gdn}) {
    Case c;
    c.plain_sums = true;
    c.lengths = {5, 7, 8};
    c.cu = {0, 3, 3, 12, 13, 20};
    c.HV = family == Family::gdn ? 4 : 2;
    EXPECT_LT(worst_error(family, c), tolerance(c));
  }
}

TEST_F(ContextParallel, GatedDeltaRuleFloat32) {
  Case c;
  c.dtype = at::kFloat;
  c.HV = 4;
  c.l2norm = true;
  c.lengths = {9, 11};
  c.B = 2;
  EXPECT_LT(worst_error(Family::gdn, c), tolerance(c));
}

TEST_F(ContextParallel, Bfloat16Inputs) {
  for (Family family : {Family::gla, Family::gdn}) {
    Case c;
    c.dtype = at::kBFloat16;
    c.lengths = {6, 0, 9};
    c.cu = {0, 4, 13, 15};
    c.HV = family == Family::gdn ? 4 : 2;
    EXPECT_LT(worst_error(family, c), tolerance(c));
  }
}

// ---- Selective RoPE phases ----------------------------------------------------------------------

double phase_error(const std::vector<std::int64_t>& lengths, std::int64_t B,
                   const std::vector<std::int64_t>& cu_values, bool shared_omega, bool with_h0) {
  torch::manual_seed(3);
  std::int64_t T = 0;
  for (auto n : lengths) T += n;
  const std::int64_t H = 3, R = 4;
  const std::int64_t N = cu_values.empty() ? B : static_cast<std::int64_t>(cu_values.size()) - 1;
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor phi = at::randn({B, T, H, R}, opt),
                   omega = shared_omega ? at::randn({R}, opt) : at::randn({H, R}, opt),
                   h0 = with_h0 ? at::randn({N, H, R}, opt) : at::Tensor(),
                   d_theta = at::randn({B, T, H, R}, opt), d_final = at::randn({N, H, R}, opt);
  const at::Tensor cu = cu_values.empty() ? at::Tensor() : at::tensor(cu_values, at::kLong);
  auto run = [&](std::int64_t begin, std::int64_t end, const ProcessGroupPtr* group) {
    const at::Tensor p = phi.narrow(1, begin, end - begin).clone().requires_grad_(true);
    const at::Tensor w = omega.clone().requires_grad_(true);
    const at::Tensor i = with_h0 ? h0.clone().requires_grad_(true) : at::Tensor();
    auto [theta, final_phase] =
        group ? phasor::cp::selective_rope_phases(p, w, maybe(i), true, maybe(cu), *group)
              : phasor::selective_rope_phases(p, w, maybe(i), true, maybe(cu));
    ((theta * d_theta.narrow(1, begin, end - begin)).sum() + (*final_phase * d_final).sum())
        .backward();
    std::map<std::string, at::Tensor> out{{"theta", theta.detach()},
                                          {"final_phase", final_phase->detach()},
                                          {"dphi", p.grad()},
                                          {"domega", w.grad()}};
    if (with_h0) out["dinitial_phase"] = i.grad();
    return out;
  };
  const auto expected = run(0, T, nullptr);
  std::mutex mutex;
  double worst = 0;
  run_ranks(static_cast<int>(lengths.size()), [&](int rank, const ProcessGroupPtr& group) {
    std::int64_t begin = 0;
    for (int r = 0; r < rank; ++r) begin += lengths[static_cast<std::size_t>(r)];
    const std::int64_t end = begin + lengths[static_cast<std::size_t>(rank)];
    const auto actual = run(begin, end, &group);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, e] : expected) {
      const bool per_token = name == "theta" || name == "dphi";
      ASSERT_TRUE(actual.at(name).defined()) << name;
      const double err = rel_rms(actual.at(name), per_token ? e.narrow(1, begin, end - begin) : e);
      EXPECT_LT(err, 1e-12) << "rank " << rank << ": " << name;
      worst = std::max(worst, err);
    }
  });
  return worst;
}

TEST_F(ContextParallel, SelectiveRopePhasesContinueAcrossRanks) {
  EXPECT_LT(phase_error({4, 0, 7, 5}, 2, {}, false, true), 1e-12);
  EXPECT_LT(phase_error({4, 6}, 1, {}, true, false), 1e-12);
  EXPECT_LT(phase_error({5, 7, 8}, 1, {0, 3, 3, 12, 13, 20}, false, true), 1e-12);
  EXPECT_LT(phase_error({6, 5, 0, 9}, 1, {0, 2, 18, 20, 20}, true, true), 1e-12);
}

// The CP phases feed the CP attention: the composition equals the single-process one.
TEST_F(ContextParallel, PhasesThenGlaComposeAcrossRanks) {
  torch::manual_seed(4);
  const std::vector<std::int64_t> lengths{7, 6};
  const std::int64_t T = 13, H = 2, K = 8, V = 4;
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q = at::randn({1, T, H, K}, opt), k = at::randn({1, T, H, K}, opt),
                   v = at::randn({1, T, H, V}, opt),
                   g = at::log_sigmoid(at::randn({1, T, H, K}, opt) + 2),
                   phi = at::randn({1, T, H, K / 2}, opt), omega = at::randn({H, K / 2}, opt);
  auto single = [&] {
    auto [theta, unused] = phasor::selective_rope_phases(phi, omega);
    return std::get<0>(
        phasor::chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, false, c10::nullopt, 4, theta));
  }();
  run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
    const std::int64_t begin = rank == 0 ? 0 : lengths[0],
                       len = lengths[static_cast<std::size_t>(rank)];
    auto s = [&](const at::Tensor& x) { return x.narrow(1, begin, len); };
    auto [theta, unused] =
        phasor::cp::selective_rope_phases(s(phi), omega, c10::nullopt, false, c10::nullopt, group);
    const at::Tensor o = std::get<0>(
        phasor::cp::chunk_gla(s(q), s(k), s(v), s(g), c10::nullopt, c10::nullopt, false,
                              c10::nullopt, 4, theta, phasor::RotaryLayout::half_split, group));
    EXPECT_LT(rel_rms(o, s(single)), 1e-12) << "rank " << rank;
  });
}

// ---- bad input ----------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(ContextParallel, BadInputNamesTheArgumentOnEveryRank) {
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  auto gla_on = [&](std::int64_t B, std::int64_t T, std::int64_t H,
                    const c10::optional<at::Tensor>& cu, const ProcessGroupPtr& group) {
    const at::Tensor q = at::randn({B, T, H, 4}, opt);
    phasor::cp::chunk_gla(q, q, q, -at::rand({B, T, H, 4}, opt), c10::nullopt, c10::nullopt, true,
                          cu, 4, c10::nullopt, phasor::RotaryLayout::half_split, group);
  };
  // cu_seqlens with B > 1 (on every rank).
  std::string e = error_of([&] {
    run_ranks(2, [&](int, const ProcessGroupPtr& group) {
      gla_on(2, 3, 2, at::tensor({0, 6}, at::kLong), group);
    });
  });
  EXPECT_NE(e.find("cp::chunk_gla: argument 'cu_seqlens'"), std::string::npos) << e;
  EXPECT_NE(e.find("B = 2"), std::string::npos) << e;
  // Slices with different numbers of heads.
  e = error_of([&] {
    run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
      gla_on(1, 3, rank == 0 ? 2 : 3, c10::nullopt, group);
    });
  });
  EXPECT_NE(e.find("argument 'q'"), std::string::npos) << e;
  EXPECT_NE(e.find("number of heads H"), std::string::npos) << e;
  // cu_seqlens[N] ≠ the sum of the slice lengths.
  e = error_of([&] {
    run_ranks(3, [&](int, const ProcessGroupPtr& group) {
      gla_on(1, 4, 2, at::tensor({0, 5, 10}, at::kLong), group);
    });
  });
  EXPECT_NE(e.find("argument 'cu_seqlens': expected cu_seqlens[N] = 12"), std::string::npos) << e;
  EXPECT_NE(e.find("got 10"), std::string::npos) << e;
  // Only one rank's argument is bad: every rank fails, naming it.
  std::mutex mutex;
  std::vector<std::string> messages;
  run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
    const at::Tensor q = at::randn({1, 3, 2, 4}, opt);
    const at::Tensor v = rank == 1 ? at::randn({1, 2, 2, 4}, opt) : q;
    const std::string m = error_of([&] {
      phasor::cp::chunk_gated_delta_rule(
          q, q, v, -at::rand({1, 3, 2}, opt), at::rand({1, 3, 2}, opt), c10::nullopt, c10::nullopt,
          false, c10::nullopt, false, 4, c10::nullopt, phasor::RotaryLayout::half_split, group);
    });
    std::lock_guard<std::mutex> lock(mutex);
    messages.push_back(m);
  });
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& m : messages)
    EXPECT_NE(m.find("cp::chunk_gated_delta_rule: argument 'v'"), std::string::npos) << m;
  // A value only the single-process op checks (a positive log gate) on one rank: that rank
  // raises the op's error, the others one naming the rank; nobody waits for the timeout.
  messages.clear();
  run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
    const at::Tensor q = at::randn({1, 3, 2, 4}, opt);
    const at::Tensor g = rank == 1 ? at::ones({1, 3, 2, 4}, opt) : -at::rand({1, 3, 2, 4}, opt);
    const std::string m = error_of([&] {
      phasor::cp::chunk_gla(q, q, q, g, c10::nullopt, c10::nullopt, true, c10::nullopt, 4,
                            c10::nullopt, phasor::RotaryLayout::half_split, group);
    });
    std::lock_guard<std::mutex> lock(mutex);
    messages.push_back(std::to_string(rank) + ": " + m);
  });
  ASSERT_EQ(messages.size(), 2u);
  std::sort(messages.begin(), messages.end());
  EXPECT_NE(messages[0].find("failed on rank 1"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("'g'"), std::string::npos) << messages[1];
  // Different global cu_seqlens on the ranks.
  e = error_of([&] {
    run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
      gla_on(1, 3, 2, at::tensor({0, rank == 0 ? 2 : 4, 6}, at::kLong), group);
    });
  });
  EXPECT_NE(e.find("argument 'cu_seqlens': expected the same global offsets"), std::string::npos)
      << e;
}

}  // namespace
