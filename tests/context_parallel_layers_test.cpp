// phasor::cp::causal_conv1d and the phasor::nn layers' option context_parallel
// (phasor::cp::layer_context): ranks as threads over a Gloo group on the loopback
// (phasor::testing::run_ranks). Every rank's outputs must equal the slice of the single-process
// result; the convolution's gradients (dx of the slice; dweight, dbias, d initial_state whole) must
// equal the single-process op's (float64 to 1e-12), and the layers' parameter gradients summed
// over the ranks must equal the single-process layer's (float64 to 1e-10).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "phasor/common.h"
#include "phasor/context_parallel.h"
#include "phasor/nn.h"
#include "phasor/testing/distributed.h"
#include "phasor/torch.h"

namespace {

namespace pn = phasor::nn;
using phasor::distributed::ProcessGroupPtr;
using phasor::testing::run_ranks;

double rel_rms(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  EXPECT_EQ(a.sizes(), e.sizes());
  if (a.sizes() != e.sizes()) return 1e300;
  if (e.numel() == 0) return 0.0;
  const double norm = e.norm().item<double>(), diff = (a - e).norm().item<double>();
  return norm == 0.0 ? diff : diff / norm;
}

class ContextParallelLayers : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    phasor::set_num_threads(1);
  }
};

std::int64_t sum_of(const std::vector<std::int64_t>& v) {
  std::int64_t s = 0;
  for (auto x : v) s += x;
  return s;
}

std::int64_t begin_of(const std::vector<std::int64_t>& lengths, int rank) {
  std::int64_t b = 0;
  for (int r = 0; r < rank; ++r) b += lengths[static_cast<std::size_t>(r)];
  return b;
}

// ---- cp::causal_conv1d --------------------------------------------------------------------------

struct ConvCase {
  std::vector<std::int64_t> lengths;
  std::int64_t B = 1, D = 3, W = 4;
  std::vector<std::int64_t> cu;  // global offsets; empty: none
  bool bias = true, initial_state = true, final_state = true;
  std::string activation = "silu";
};

// Σ y·dy + Σ final·dF on [begin, end) (single process: the whole sequence, group null); returns
// the outputs and gradients by name.
std::map<std::string, at::Tensor> conv_run(const ConvCase& c,
                                           const std::map<std::string, at::Tensor>& in,
                                           std::int64_t begin, std::int64_t end,
                                           const ProcessGroupPtr* group) {
  const at::Tensor x = in.at("x").narrow(1, begin, end - begin).clone().requires_grad_(true);
  const at::Tensor w = in.at("weight").clone().requires_grad_(true);
  at::Tensor b, h0;
  if (c.bias) b = in.at("bias").clone().requires_grad_(true);
  if (c.initial_state) h0 = in.at("h0").clone().requires_grad_(true);
  c10::optional<at::Tensor> cu, bo, h0o;
  if (!c.cu.empty()) cu = at::tensor(c.cu, at::kLong);
  if (b.defined()) bo = b;
  if (h0.defined()) h0o = h0;
  auto [y, fin] =
      group ? phasor::cp::causal_conv1d(x, w, bo, c.activation, h0o, c.final_state, cu, *group)
            : phasor::causal_conv1d(x, w, bo, c.activation, h0o, c.final_state, cu);
  at::Tensor loss = (y * in.at("dy").narrow(1, begin, end - begin)).sum();
  if (fin) loss = loss + (*fin * in.at("dF")).sum();
  loss.backward();
  std::map<std::string, at::Tensor> out{{"y", y.detach()}, {"dx", x.grad()}, {"dweight", w.grad()}};
  if (fin) out["final_state"] = fin->detach();
  if (b.defined()) out["dbias"] = b.grad();
  if (h0.defined()) out["dh0"] = h0.grad();
  return out;
}

void check_conv(const ConvCase& c) {
  torch::manual_seed(7);
  const std::int64_t T = sum_of(c.lengths);
  const std::int64_t N = c.cu.empty() ? c.B : static_cast<std::int64_t>(c.cu.size()) - 1;
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  std::map<std::string, at::Tensor> in{
      {"x", at::randn({c.B, T, c.D}, opt)},  {"weight", at::randn({c.D, c.W}, opt)},
      {"bias", at::randn({c.D}, opt)},       {"h0", at::randn({N, c.D, c.W - 1}, opt)},
      {"dy", at::randn({c.B, T, c.D}, opt)}, {"dF", at::randn({N, c.D, c.W - 1}, opt)}};
  const auto expected = conv_run(c, in, 0, T, nullptr);
  std::mutex mutex;
  std::vector<std::string> problems;
  run_ranks(static_cast<int>(c.lengths.size()), [&](int rank, const ProcessGroupPtr& group) {
    const std::int64_t begin = begin_of(c.lengths, rank);
    const std::int64_t end = begin + c.lengths[static_cast<std::size_t>(rank)];
    const auto actual = conv_run(c, in, begin, end, &group);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, e] : expected) {
      auto it = actual.find(name);
      if (it == actual.end() || !it->second.defined()) {
        problems.push_back("rank " + std::to_string(rank) + ": " + name + " missing");
        continue;
      }
      const bool per_token = name == "y" || name == "dx";
      const double err = rel_rms(it->second, per_token ? e.narrow(1, begin, end - begin) : e);
      if (!(err < 1e-12))
        problems.push_back("rank " + std::to_string(rank) + ": " + name + " rel RMS " +
                           std::to_string(err));
    }
  });
  for (const auto& p : problems) ADD_FAILURE() << p;
}

TEST_F(ContextParallelLayers, CausalConvBatchShortAndEmptySlices) {
  // Slices shorter than W − 1 = 3 (1 and 2 tokens: the halo spans several ranks) and an empty one.
  ConvCase c;
  c.lengths = {5, 1, 0, 2, 6};
  c.B = 2;
  check_conv(c);
}

TEST_F(ContextParallelLayers, CausalConvVarlenCrossingRanks) {
  // Sequences straddling rank boundaries, one shorter than W − 1 inside a slice, one empty, one
  // starting exactly at a boundary; the initial states enter at each sequence's start.
  ConvCase c;
  c.lengths = {3, 4, 1, 5};
  c.cu = {0, 2, 2, 6, 7, 13};
  c.D = 4;
  check_conv(c);
}

TEST_F(ContextParallelLayers, CausalConvNoStateNoBiasIdentity) {
  ConvCase c;
  c.lengths = {2, 5, 3};
  c.bias = false, c.initial_state = false;
  c.activation = "none";
  c.W = 3;
  check_conv(c);
}

TEST_F(ContextParallelLayers, CausalConvWidthOne) {
  ConvCase c;
  c.lengths = {2, 3};
  c.W = 1;
  c.initial_state = false;
  check_conv(c);
}

TEST_F(ContextParallelLayers, CausalConvWithoutFinalStateAndVarlenWidthTwo) {
  ConvCase c;
  c.lengths = {4, 0, 3};
  c.final_state = false;
  check_conv(c);
  ConvCase v;
  v.lengths = {1, 1, 3, 2};
  v.cu = {0, 1, 4, 7};
  v.W = 2;
  v.initial_state = false;
  check_conv(v);
}

TEST_F(ContextParallelLayers, CausalConvOffsetsMustCoverTheSlices) {
  std::mutex mutex;
  std::vector<std::string> messages;
  run_ranks(2, [&](int, const ProcessGroupPtr& group) {
    const at::Tensor x = at::randn({1, 3, 2}, at::kDouble), w = at::randn({2, 4}, at::kDouble);
    try {
      phasor::cp::causal_conv1d(x, w, c10::nullopt, "silu", c10::nullopt, false,
                                at::tensor(std::vector<std::int64_t>{0, 2, 5}, at::kLong), group);
    } catch (const c10::Error& e) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(e.what_without_backtrace());
    }
  });
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& m : messages)
    EXPECT_NE(m.find("cp::causal_conv1d: argument 'cu_seqlens': expected cu_seqlens[N] = 6"),
              std::string::npos)
        << m;
}

TEST_F(ContextParallelLayers, CausalConvMismatchRaisesOnEveryRank) {
  std::mutex mutex;
  std::vector<std::string> messages;
  run_ranks(2, [&](int rank, const ProcessGroupPtr& group) {
    const auto opt = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor x = at::randn({1, 3, 2}, opt);
    const at::Tensor w = at::randn({2, rank == 0 ? 4 : 3}, opt);
    try {
      phasor::cp::causal_conv1d(x, w, c10::nullopt, "silu", c10::nullopt, false, c10::nullopt,
                                group);
    } catch (const c10::Error& e) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(e.what_without_backtrace());
    }
  });
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& m : messages) {
    EXPECT_NE(m.find("cp::causal_conv1d"), std::string::npos) << m;
    EXPECT_NE(m.find("'weight'"), std::string::npos) << m;
  }
}

// ---- the layers ---------------------------------------------------------------------------------

// Runs `make()`'s layer (float64) on the whole sequence, and a copy of it on each rank's slice with
// context_parallel set; checks every rank's output slice, its dx slice and the parameter gradients
// summed over the ranks.
template <typename Holder>
void check_layer(const std::function<Holder()>& make, std::int64_t hidden,
                 const std::vector<std::int64_t>& lengths, std::int64_t B = 2) {
  torch::manual_seed(11);
  Holder reference = make();
  reference->to(at::kDouble);
  const int world = static_cast<int>(lengths.size());
  std::vector<Holder> copies;
  for (int r = 0; r < world; ++r)
    copies.push_back(std::dynamic_pointer_cast<typename Holder::ContainedType>(reference->clone()));
  const std::int64_t T = sum_of(lengths);
  const at::Tensor x = at::randn({B, T, hidden}, at::kDouble);
  const at::Tensor dy = at::randn({B, T, hidden}, at::kDouble);
  const at::Tensor xs = x.clone().requires_grad_(true);
  const at::Tensor y = reference->forward(xs);
  (y * dy).sum().backward();
  const auto params = reference->named_parameters();

  std::mutex mutex;
  std::vector<std::string> problems;
  run_ranks(world, [&](int rank, const ProcessGroupPtr& group) {
    Holder layer = copies[static_cast<std::size_t>(rank)];
    layer->options.context_parallel(phasor::cp::layer_context(group));
    const std::int64_t begin = begin_of(lengths, rank), n = lengths[static_cast<std::size_t>(rank)];
    const at::Tensor xr = x.narrow(1, begin, n).clone().requires_grad_(true);
    const at::Tensor yr = layer->forward(xr);
    (yr * dy.narrow(1, begin, n)).sum().backward();
    std::vector<std::pair<std::string, double>> errors{
        {"y", rel_rms(yr.detach(), y.detach().narrow(1, begin, n))},
        {"dx", rel_rms(xr.grad(), xs.grad().narrow(1, begin, n))}};
    for (const auto& p : layer->named_parameters()) {
      at::Tensor g =
          p.value().grad().defined() ? p.value().grad().clone() : at::zeros_like(p.value());
      std::vector<at::Tensor> tensors{g};
      group->allreduce(tensors)->wait();
      const at::Tensor e = params[p.key()].grad();
      errors.emplace_back("d " + p.key(),
                          e.defined() ? rel_rms(g, e) : g.abs().max().item<double>());
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, err] : errors)
      if (!(err < 1e-10))
        problems.push_back("rank " + std::to_string(rank) + ": " + name + " rel RMS " +
                           std::to_string(err));
  });
  for (const auto& p : problems) ADD_FAILURE() << p;
  EXPECT_GT(params.size(), 3u);
}

TEST_F(ContextParallelLayers, GatedLinearAttentionShortConvSelectiveRoPE) {
  check_layer<pn::GatedLinearAttention>(
      [] {
        return pn::GatedLinearAttention(
            pn::GatedLinearAttentionOptions(16, 2).use_short_conv(true).chunk_size(4).pos_encoding(
                pn::PosEncoding::selective_rope));
      },
      16, {5, 2, 1, 7});
}

TEST_F(ContextParallelLayers, GatedLinearAttentionRoPEGlobalPositions) {
  check_layer<pn::GatedLinearAttention>(
      [] {
        return pn::GatedLinearAttention(
            pn::GatedLinearAttentionOptions(16, 2).chunk_size(4).pos_encoding(
                pn::PosEncoding::rope));
      },
      16, {4, 3, 5});
}

TEST_F(ContextParallelLayers, GatedDeltaNetShortConvs) {
  check_layer<pn::GatedDeltaNet>(
      [] { return pn::GatedDeltaNet(pn::GatedDeltaNetOptions(12, 2, 4).chunk_size(4)); }, 12,
      {6, 1, 5});
}

TEST_F(ContextParallelLayers, GatedDeltaNetSelectiveRoPEGroupedValues) {
  check_layer<pn::GatedDeltaNet>(
      [] {
        return pn::GatedDeltaNet(
            pn::GatedDeltaNetOptions(12, 2, 4).num_v_heads(4).chunk_size(4).pos_encoding(
                pn::PosEncoding::selective_rope));
      },
      12, {3, 6, 2});
}

TEST_F(ContextParallelLayers, ForgettingAttentionSelectiveRoPEAndGates) {
  check_layer<pn::ForgettingAttention>(
      [] {
        return pn::ForgettingAttention(pn::ForgettingAttentionOptions(16, 4)
                                           .num_kv_heads(2)
                                           .block_size(4)
                                           .use_output_gate(true)
                                           .pos_encoding(pn::PosEncoding::selective_rope));
      },
      16, {5, 3, 4});
}

TEST_F(ContextParallelLayers, ForgettingAttentionRoPEWindowGrapeBias) {
  check_layer<pn::ForgettingAttention>(
      [] {
        return pn::ForgettingAttention(pn::ForgettingAttentionOptions(16, 2)
                                           .block_size(4)
                                           .window_size(5)
                                           .additive_bias(pn::AdditiveBias::grape_a)
                                           .pos_encoding(pn::PosEncoding::rope));
      },
      16, {4, 4, 3});
}

TEST_F(ContextParallelLayers, GatedLinearAttentionStringRotationGlobalPositions) {
  check_layer<pn::GatedLinearAttention>(
      [] {
        return pn::GatedLinearAttention(pn::GatedLinearAttentionOptions(16, 2)
                                            .chunk_size(4)
                                            .pos_encoding(pn::PosEncoding::string_cayley)
                                            .rotation(pn::RotationEncodingOptions().init_std(0.3)));
      },
      16, {3, 5, 4});
}

TEST_F(ContextParallelLayers, RefusalsNameTheOption) {
  run_ranks(1, [&](int, const ProcessGroupPtr& group) {
    const auto context = phasor::cp::layer_context(group);
    const at::Tensor x = at::randn({1, 3, 8});
    pn::PerformerAttention performer(pn::PerformerAttentionOptions(8, 2).context_parallel(context));
    try {
      performer->forward(x);
      ADD_FAILURE() << "PerformerAttention accepted context_parallel";
    } catch (const c10::Error& e) {
      const std::string m = e.what_without_backtrace();
      EXPECT_NE(m.find("PerformerAttention: option 'context_parallel'"), std::string::npos) << m;
    }
    pn::GatedLinearAttention gla(pn::GatedLinearAttentionOptions(8, 2).context_parallel(context));
    pn::LayerCache cache;
    try {
      gla->forward(x, &cache);
      ADD_FAILURE() << "GatedLinearAttention accepted a cache with context_parallel";
    } catch (const c10::Error& e) {
      const std::string m = e.what_without_backtrace();
      EXPECT_NE(m.find("GatedLinearAttention: option 'context_parallel'"), std::string::npos) << m;
    }
    pn::ShortConvolution conv(pn::ShortConvolutionOptions(8).context_parallel(context));
    at::Tensor state;
    try {
      conv->forward(x, &state);
      ADD_FAILURE() << "ShortConvolution accepted a state with context_parallel";
    } catch (const c10::Error& e) {
      const std::string m = e.what_without_backtrace();
      EXPECT_NE(m.find("ShortConvolution: option 'context_parallel'"), std::string::npos) << m;
    }
    // Without a cache a single rank is the single-process layer.
    pn::GatedLinearAttention plain(pn::GatedLinearAttentionOptions(8, 2));
    pn::GatedLinearAttention copy =
        std::dynamic_pointer_cast<pn::GatedLinearAttentionImpl>(plain->clone());
    copy->options.context_parallel(context);
    EXPECT_TRUE(at::allclose(copy->forward(x), plain->forward(x), 1e-5, 1e-6));
  });
}

}  // namespace
