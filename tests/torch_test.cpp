// The LibTorch layer (phasor/torch.h): autograd against the core backward called directly,
// float64 central finite differences through the torch API, errors as c10::Error naming the
// argument, float16/bfloat16 inputs, gradients flowing from final_state, dtypes and strides,
// the chunk states kept for the backward (and read by it), the FoX decoder against the parallel
// forward, and the rotary ops, short convolution and fused rotation against plain torch
// operations.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "phasor/device.h"
#include "phasor/forgetting_attn.h"
#include "phasor/gated_delta_rule.h"
#include "phasor/gla.h"
#include "phasor/torch.h"
#include "torch_test_util.h"

namespace phasor {
namespace {

using namespace torch_test;

// log σ(x), x ~ N(mean, 1): realistic log forget gates.
at::Tensor log_gates(at::IntArrayRef shape, double mean = 2.0) {
  return at::log_sigmoid(at::randn(shape, f64) + mean);
}

// A leaf that requires grad, with the given values but a non-contiguous layout: every other
// element of a buffer twice as long in the last dimension, so the layer's strided path is
// exercised.
at::Tensor strided_leaf(const at::Tensor& values) {
  std::vector<std::int64_t> wide(values.sizes().begin(), values.sizes().end());
  wide.back() *= 2;
  at::Tensor storage = at::zeros(wide, values.options());
  at::Tensor leaf = storage.slice(-1, 0, wide.back(), 2);
  leaf.copy_(values);
  EXPECT_FALSE(leaf.is_contiguous());
  return leaf.detach().requires_grad_(true);
}

const Impl kImpls[] = {Impl::reference, Impl::recurrent, Impl::chunk};

}  // namespace

// So GoogleTest (and ctest's test names) show "chunk" rather than "1-byte object <02>".
void PrintTo(Impl impl, std::ostream* os) {
  *os << to_string(impl);
}
void PrintTo(RotaryLayout layout, std::ostream* os) {
  *os << to_string(layout);
}

namespace {

class TorchImpl : public ::testing::TestWithParam<Impl> {};
INSTANTIATE_TEST_SUITE_P(AllImpls, TorchImpl, ::testing::ValuesIn(kImpls),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// ---- autograd == core backward ------------------------------------------------------------------

TEST_P(TorchImpl, GlaAutogradMatchesCoreBackward) {
  const Impl impl = GetParam();
  torch::manual_seed(1);
  const std::int64_t B = 2, T = 9, H = 2, K = 4, V = 3;
  const at::Tensor q0 = at::randn({B, T, H, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                   v0 = at::randn({B, T, H, V}, f64), g0 = log_gates({B, T, H, K}),
                   h00 = at::randn({B, H, K, V}, f64);
  at::Tensor q = strided_leaf(q0), k = strided_leaf(k0), v = strided_leaf(v0), g = strided_leaf(g0),
             h0 = strided_leaf(h00);
  auto [o, ht] = gla(q, k, v, g, impl, 0.4, h0, true, c10::nullopt, /*chunk_size=*/4);
  ASSERT_TRUE(ht.has_value());
  const at::Tensor d_o = at::randn_like(o), dht = at::randn_like(*ht);
  torch::autograd::backward({o, *ht}, {d_o, dht});

  GlaParams p;
  p.q = core_view(q0), p.k = core_view(k0), p.v = core_view(v0), p.g = core_view(g0);
  p.initial_state = core_view(h00);
  p.scale = 0.4;
  p.chunk_size = 4;
  const at::Tensor o_ref = at::empty({B, T, H, V}, f64), ht_ref = at::empty({B, H, K, V}, f64);
  gla_forward(p, impl, core_view(o_ref), core_view(ht_ref));
  const at::Tensor dq = at::empty_like(q0), dk = at::empty_like(k0), dv = at::empty_like(v0),
                   dg = at::empty_like(g0), dh0 = at::empty_like(h00);
  gla_backward(p, impl, core_view(d_o), core_view(dht),
               {core_view(dq), core_view(dk), core_view(dv), core_view(dg), core_view(dh0), {}});

  EXPECT_CLOSE(o, o_ref, 1e-13, "o");
  EXPECT_CLOSE(*ht, ht_ref, 1e-13, "final_state");
  EXPECT_CLOSE(q.grad(), dq, 1e-13, "dq");
  EXPECT_CLOSE(k.grad(), dk, 1e-13, "dk");
  EXPECT_CLOSE(v.grad(), dv, 1e-13, "dv");
  EXPECT_CLOSE(g.grad(), dg, 1e-13, "dg");
  EXPECT_CLOSE(h0.grad(), dh0, 1e-13, "dh0");
}

TEST_P(TorchImpl, GlaVarlenAutogradMatchesCoreBackward) {
  const Impl impl = GetParam();
  torch::manual_seed(2);
  const std::int64_t T = 10, H = 1, K = 3, V = 2, N = 4;
  const at::Tensor cu = at::tensor({0, 3, 3, 9, 10}, at::kLong);  // one empty sequence
  const at::Tensor q0 = at::randn({1, T, H, K}, f64), k0 = at::randn({1, T, H, K}, f64),
                   v0 = at::randn({1, T, H, V}, f64), g0 = log_gates({1, T, H, K}),
                   h00 = at::randn({N, H, K, V}, f64);
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0), g = leaf(g0), h0 = leaf(h00);
  auto [o, ht] = gla(q, k, v, g, impl, c10::nullopt, h0, true, cu, 2);
  ASSERT_EQ(ht->sizes(), h00.sizes());
  const at::Tensor d_o = at::randn_like(o), dht = at::randn_like(*ht);
  torch::autograd::backward({o, *ht}, {d_o, dht});

  GlaParams p;
  p.q = core_view(q0), p.k = core_view(k0), p.v = core_view(v0), p.g = core_view(g0);
  p.initial_state = core_view(h00), p.cu_seqlens = core_view(cu), p.chunk_size = 2;
  const at::Tensor dq = at::empty_like(q0), dk = at::empty_like(k0), dv = at::empty_like(v0),
                   dg = at::empty_like(g0), dh0 = at::empty_like(h00);
  gla_backward(p, impl, core_view(d_o), core_view(dht),
               {core_view(dq), core_view(dk), core_view(dv), core_view(dg), core_view(dh0), {}});
  EXPECT_CLOSE(q.grad(), dq, 1e-13, "dq");
  EXPECT_CLOSE(k.grad(), dk, 1e-13, "dk");
  EXPECT_CLOSE(v.grad(), dv, 1e-13, "dv");
  EXPECT_CLOSE(g.grad(), dg, 1e-13, "dg");
  EXPECT_CLOSE(h0.grad(), dh0, 1e-13, "dh0");
  // The empty sequence passes its initial state through, and its gradient back.
  EXPECT_TRUE(at::equal((*ht)[1], h00[1]));
  EXPECT_TRUE(at::equal(h0.grad()[1], dht[1]));
}

TEST_P(TorchImpl, GatedDeltaRuleAutogradMatchesCoreBackward) {
  const Impl impl = GetParam();
  torch::manual_seed(3);
  const std::int64_t B = 2, T = 7, H = 1, HV = 2, K = 4, V = 3;
  const at::Tensor q0 = at::randn({B, T, H, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                   v0 = at::randn({B, T, HV, V}, f64), g0 = log_gates({B, T, HV}, 3.0),
                   beta0 = 2 * at::rand({B, T, HV}, f64), h00 = at::randn({B, HV, K, V}, f64);
  at::Tensor q = strided_leaf(q0), k = strided_leaf(k0), v = strided_leaf(v0), g = leaf(g0),
             beta = leaf(beta0), h0 = strided_leaf(h00);
  auto [o, ht] = gated_delta_rule(q, k, v, g, beta, impl, c10::nullopt, h0, true, c10::nullopt,
                                  /*use_qk_l2norm_in_kernel=*/true, /*chunk_size=*/3);
  const at::Tensor d_o = at::randn_like(o), dht = at::randn_like(*ht);
  torch::autograd::backward({o, *ht}, {d_o, dht});

  GatedDeltaRuleParams p;
  p.q = core_view(q0), p.k = core_view(k0), p.v = core_view(v0), p.g = core_view(g0);
  p.beta = core_view(beta0), p.initial_state = core_view(h00);
  p.use_qk_l2norm_in_kernel = true;
  p.chunk_size = 3;
  const at::Tensor o_ref = at::empty({B, T, HV, V}, f64), ht_ref = at::empty({B, HV, K, V}, f64);
  gated_delta_rule_forward(p, impl, core_view(o_ref), core_view(ht_ref));
  const at::Tensor dq = at::empty_like(q0), dk = at::empty_like(k0), dv = at::empty_like(v0),
                   dg = at::empty_like(g0), dbeta = at::empty_like(beta0),
                   dh0 = at::empty_like(h00);
  gated_delta_rule_backward(p, impl, core_view(d_o), core_view(dht),
                            {core_view(dq),
                             core_view(dk),
                             core_view(dv),
                             core_view(dg),
                             core_view(dbeta),
                             core_view(dh0),
                             {}});
  EXPECT_CLOSE(o, o_ref, 1e-13, "o");
  EXPECT_CLOSE(*ht, ht_ref, 1e-13, "final_state");
  EXPECT_CLOSE(q.grad(), dq, 1e-13, "dq");
  EXPECT_CLOSE(k.grad(), dk, 1e-13, "dk");
  EXPECT_CLOSE(v.grad(), dv, 1e-13, "dv");
  EXPECT_CLOSE(g.grad(), dg, 1e-13, "dg");
  EXPECT_CLOSE(beta.grad(), dbeta, 1e-13, "dbeta");
  EXPECT_CLOSE(h0.grad(), dh0, 1e-13, "dh0");
}

// ---- chunk states kept for the backward --------------------------------------------------------
// The layer keeps the chunk forward's states (and Gated DeltaNet's U_new) for the backward when
// autograd records the call (src/torch/torch.cpp: keep_chunk_states). The same bits come out
// either way, so the tests above cannot tell whether they were kept, nor whether the backward
// reads them. An allocator that records the CPU blocks the forward allocates finds the kept
// buffers by their size; NaN written into one of them must reach the gradients.

// Records the size of every live CPU block allocated while installed (a scope); blocks freed,
// then or later, are forgotten.
class RecordingCpuAllocator final : public c10::Allocator {
 public:
  RecordingCpuAllocator() : base_(c10::GetDefaultCPUAllocator()) {
    live().clear();  // blocks of earlier recorders still alive are not this one's
    c10::SetCPUAllocator(this, ++priority_);
  }
  ~RecordingCpuAllocator() override { c10::SetCPUAllocator(base_, ++priority_); }
  RecordingCpuAllocator(const RecordingCpuAllocator&) = delete;
  RecordingCpuAllocator& operator=(const RecordingCpuAllocator&) = delete;

  c10::DataPtr allocate(size_t bytes) const override {
    auto* block = new Block{base_->allocate(bytes)};
    void* data = block->inner.get();
    {
      std::lock_guard<std::mutex> lock(mutex());
      live()[data] = bytes;
    }
    return {data, block, &release, block->inner.device()};
  }

  // The live blocks of exactly `bytes` allocated since the scope began, in no particular order.
  std::vector<void*> live_blocks_of(std::size_t bytes) const {
    std::lock_guard<std::mutex> lock(mutex());
    std::vector<void*> out;
    for (const auto& [data, size] : live())
      if (size == bytes) out.push_back(data);
    return out;
  }

 private:
  struct Block {
    c10::DataPtr inner;
  };
  static void release(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    {
      std::lock_guard<std::mutex> lock(mutex());
      live().erase(block->inner.get());
    }
    delete block;  // frees through the default allocator's own deleter
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<void*, std::size_t>& live() {
    static std::map<void*, std::size_t> blocks;
    return blocks;
  }
  static inline std::uint8_t priority_ = 0;  // SetCPUAllocator keeps the highest priority set
  c10::Allocator* base_;
};

bool any_nan(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.isnan().any().item<bool>()) return true;
  return false;
}

// Fills the `count` doubles of a kept block with NaN, expects `grads()` to carry some NaN (the
// backward reads the block), and puts the values back.
void expect_backward_reads(void* block, std::size_t count, const char* what,
                           const std::function<std::vector<at::Tensor>()>& grads) {
  auto* x = static_cast<double*>(block);
  const std::vector<double> before(x, x + count);
  std::fill_n(x, count, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(any_nan(grads())) << "the backward did not read " << what;
  std::copy(before.begin(), before.end(), x);
}

TEST(Torch, ChunkForwardKeepsStatesThatTheBackwardReads) {
  torch::manual_seed(11);
  // T = 130 at chunk size 64: three chunks, so 3 states of H × K × V; sizes chosen so that no
  // other tensor of the call has the states' (or, below, v's) size by chance.
  const std::int64_t B = 1, T = 130, H = 2, K = 6, V = 10, C = 64, chunks = (T + C - 1) / C;
  const auto state_count = static_cast<std::size_t>(chunks * H * K * V);
  const at::Tensor q = leaf(at::randn({B, T, H, K}, f64)), k = leaf(at::randn({B, T, H, K}, f64)),
                   v = leaf(at::randn({B, T, H, V}, f64)), g = leaf(log_gates({B, T, H, K}));
  {
    RecordingCpuAllocator recorder;
    torch::NoGradGuard no_grad;  // nothing is kept when autograd does not record the call
    const at::Tensor o =
        std::get<0>(chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, false, c10::nullopt, C));
    EXPECT_TRUE(recorder.live_blocks_of(state_count * sizeof(double)).empty());
  }
  RecordingCpuAllocator recorder;
  const at::Tensor o =
      std::get<0>(chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, false, c10::nullopt, C));
  const std::vector<void*> kept = recorder.live_blocks_of(state_count * sizeof(double));
  ASSERT_EQ(kept.size(), 1u) << "the chunk states, kept alive by the autograd graph";
  const at::Tensor d_o = at::randn_like(o);
  const auto grads = [&] {
    return torch::autograd::grad({o}, {q, k, v, g}, {d_o}, /*retain_graph=*/true);
  };
  const std::vector<at::Tensor> clean = grads();
  ASSERT_FALSE(any_nan(clean));
  expect_backward_reads(kept[0], state_count, "the kept chunk states", grads);
  const std::vector<at::Tensor> again = grads();
  for (std::size_t i = 0; i < clean.size(); ++i) EXPECT_TRUE(at::equal(again[i], clean[i])) << i;
}

TEST(Torch, ChunkGatedDeltaRuleKeepsStatesAndVNewThatTheBackwardReads) {
  torch::manual_seed(12);
  const std::int64_t B = 1, T = 130, H = 2, K = 6, V = 10, C = 64, chunks = (T + C - 1) / C;
  const auto state_count = static_cast<std::size_t>(chunks * H * K * V);
  const auto v_new_count = static_cast<std::size_t>(B * T * H * V);
  const at::Tensor q = leaf(at::randn({B, T, H, K}, f64)), k = leaf(at::randn({B, T, H, K}, f64)),
                   v = leaf(at::randn({B, T, H, V}, f64)), g = leaf(log_gates({B, T, H})),
                   beta = leaf(at::rand({B, T, H}, f64));
  const auto forward = [&] {
    return std::get<0>(chunk_gated_delta_rule(q, k, v, g, beta, c10::nullopt, c10::nullopt, false,
                                              c10::nullopt,
                                              /*use_qk_l2norm_in_kernel=*/true, C));
  };
  {
    RecordingCpuAllocator recorder;
    torch::NoGradGuard no_grad;
    const at::Tensor o = forward();
    EXPECT_TRUE(recorder.live_blocks_of(state_count * sizeof(double)).empty());
    // o is the only live block of v's size without autograd.
    EXPECT_EQ(recorder.live_blocks_of(v_new_count * sizeof(double)).size(), 1u);
  }
  RecordingCpuAllocator recorder;
  const at::Tensor o = forward();
  const std::vector<void*> kept_states = recorder.live_blocks_of(state_count * sizeof(double));
  ASSERT_EQ(kept_states.size(), 1u) << "the chunk states, kept alive by the autograd graph";
  std::vector<void*> kept_v_new;
  for (void* block : recorder.live_blocks_of(v_new_count * sizeof(double)))
    if (block != o.data_ptr()) kept_v_new.push_back(block);
  ASSERT_EQ(kept_v_new.size(), 1u) << "U_new (v_new), kept beside the states";
  const at::Tensor d_o = at::randn_like(o);
  const auto grads = [&] {
    return torch::autograd::grad({o}, {q, k, v, g, beta}, {d_o}, /*retain_graph=*/true);
  };
  const std::vector<at::Tensor> clean = grads();
  ASSERT_FALSE(any_nan(clean));
  expect_backward_reads(kept_states[0], state_count, "the chunk states", grads);
  expect_backward_reads(kept_v_new[0], v_new_count, "v_new", grads);
  const std::vector<at::Tensor> again = grads();
  for (std::size_t i = 0; i < clean.size(); ++i) EXPECT_TRUE(at::equal(again[i], clean[i])) << i;
}

TEST_P(TorchImpl, ForgettingAttnAutogradMatchesCoreBackward) {
  const Impl impl = GetParam();
  torch::manual_seed(4);
  const std::int64_t B = 2, T = 9, HQ = 4, H = 2, K = 3, V = 5;
  for (c10::optional<std::int64_t> window :
       {c10::optional<std::int64_t>(), c10::make_optional<std::int64_t>(3)}) {
    SCOPED_TRACE(window ? "window 3" : "no window");
    const at::Tensor q0 = at::randn({B, T, HQ, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                     v0 = at::randn({B, T, H, V}, f64), g0 = log_gates({B, T, HQ}, 1.0);
    at::Tensor q = strided_leaf(q0), k = strided_leaf(k0), v = strided_leaf(v0), g = leaf(g0);
    const at::Tensor o = forgetting_attn(q, k, v, g, impl, 0.6, window, c10::nullopt, 4);
    const at::Tensor d_o = at::randn_like(o);
    o.backward(d_o);

    ForgettingAttnParams p;
    p.q = core_view(q0), p.k = core_view(k0), p.v = core_view(v0), p.g = core_view(g0);
    p.scale = 0.6;
    if (window) p.window_size = *window;
    p.block_size = 4;
    const at::Tensor o_ref = at::empty({B, T, HQ, V}, f64);
    forgetting_attn_forward(p, impl, core_view(o_ref));
    const at::Tensor dq = at::empty_like(q0), dk = at::empty_like(k0), dv = at::empty_like(v0),
                     dg = at::empty_like(g0);
    // No o / lse: the core recomputes them, so this also checks what the layer saved.
    ForgettingAttnGrads grads;
    grads.dq = core_view(dq), grads.dk = core_view(dk), grads.dv = core_view(dv);
    grads.dg = core_view(dg);
    forgetting_attn_backward(p, impl, core_view(d_o), {}, {}, grads);
    EXPECT_CLOSE(o, o_ref, 1e-13, "o");
    EXPECT_CLOSE(q.grad(), dq, 1e-12, "dq");
    EXPECT_CLOSE(k.grad(), dk, 1e-12, "dk");
    EXPECT_CLOSE(v.grad(), dv, 1e-12, "dv");
    EXPECT_CLOSE(g.grad(), dg, 1e-12, "dg");
  }
}

// ---- central finite differences through the torch API (float64) ---------------------------------

TEST_P(TorchImpl, GlaFiniteDifferences) {
  const Impl impl = GetParam();
  torch::manual_seed(5);
  const std::int64_t B = 1, T = 6, H = 2, K = 3, V = 4;
  const at::Tensor wo = at::randn({B, T, H, V}, f64), wh = at::randn({B, H, K, V}, f64);
  auto loss = [&](const std::vector<at::Tensor>& x) {
    auto [o, ht] = gla(x[0], x[1], x[2], x[3], impl, c10::nullopt, x[4], true, c10::nullopt, 4);
    return (o * wo).sum() + (*ht * wh).sum();
  };
  check_finite_differences(
      loss,
      {at::randn({B, T, H, K}, f64), at::randn({B, T, H, K}, f64), at::randn({B, T, H, V}, f64),
       log_gates({B, T, H, K}, 1.0), at::randn({B, H, K, V}, f64)},
      {"q", "k", "v", "g", "initial_state"});
}

TEST_P(TorchImpl, GatedDeltaRuleFiniteDifferences) {
  const Impl impl = GetParam();
  torch::manual_seed(6);
  const std::int64_t B = 1, T = 5, H = 1, HV = 2, K = 3, V = 3;
  const at::Tensor wo = at::randn({B, T, HV, V}, f64), wh = at::randn({B, HV, K, V}, f64);
  auto loss = [&](const std::vector<at::Tensor>& x) {
    auto [o, ht] = gated_delta_rule(x[0], x[1], x[2], x[3], x[4], impl, c10::nullopt, x[5], true,
                                    c10::nullopt, /*use_qk_l2norm_in_kernel=*/true, 2);
    return (o * wo).sum() + (*ht * wh).sum();
  };
  check_finite_differences(loss,
                           {at::randn({B, T, H, K}, f64), at::randn({B, T, H, K}, f64),
                            at::randn({B, T, HV, V}, f64), log_gates({B, T, HV}, 1.0),
                            0.2 + 1.6 * at::rand({B, T, HV}, f64), at::randn({B, HV, K, V}, f64)},
                           {"q", "k", "v", "g", "beta", "initial_state"});
}

TEST_P(TorchImpl, ForgettingAttnFiniteDifferences) {
  const Impl impl = GetParam();
  torch::manual_seed(7);
  const std::int64_t B = 1, T = 7, HQ = 2, H = 1, K = 3, V = 4;
  const at::Tensor wo = at::randn({B, T, HQ, V}, f64);
  auto loss = [&](const std::vector<at::Tensor>& x) {
    return (forgetting_attn(x[0], x[1], x[2], x[3], impl, c10::nullopt, 5, c10::nullopt, 2) * wo)
        .sum();
  };
  check_finite_differences(loss,
                           {at::randn({B, T, HQ, K}, f64), at::randn({B, T, H, K}, f64),
                            at::randn({B, T, H, V}, f64), log_gates({B, T, HQ}, 1.0)},
                           {"q", "k", "v", "g"});
}

// ---- final_state gradients, unused outputs, partial requires_grad -------------------------------

TEST_P(TorchImpl, FinalStateGradientFlowsWhenOnlyTheStateIsUsed) {
  const Impl impl = GetParam();
  torch::manual_seed(8);
  const std::int64_t B = 2, T = 5, H = 2, K = 3, V = 2;
  const at::Tensor q0 = at::randn({B, T, H, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                   v0 = at::randn({B, T, H, V}, f64), g0 = log_gates({B, T, H, K}),
                   h00 = at::randn({B, H, K, V}, f64);
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0), g = leaf(g0), h0 = leaf(h00);
  auto [o, ht] = gla(q, k, v, g, impl, c10::nullopt, h0, true);
  const at::Tensor dht = at::randn_like(*ht);
  (*ht * dht).sum().backward();  // o takes no part: its gradient is undefined, i.e. zero

  GlaParams p;
  p.q = core_view(q0), p.k = core_view(k0), p.v = core_view(v0), p.g = core_view(g0);
  p.initial_state = core_view(h00);
  const at::Tensor zeros = at::zeros({B, T, H, V}, f64);
  const at::Tensor dq = at::empty_like(q0), dk = at::empty_like(k0), dv = at::empty_like(v0),
                   dg = at::empty_like(g0), dh0 = at::empty_like(h00);
  gla_backward(p, impl, core_view(zeros), core_view(dht),
               {core_view(dq), core_view(dk), core_view(dv), core_view(dg), core_view(dh0), {}});
  EXPECT_CLOSE(k.grad(), dk, 1e-13, "dk");
  EXPECT_CLOSE(v.grad(), dv, 1e-13, "dv");
  EXPECT_CLOSE(g.grad(), dg, 1e-13, "dg");
  EXPECT_CLOSE(h0.grad(), dh0, 1e-13, "dh0");
  EXPECT_GT(k.grad().abs().sum().item<double>(), 0.0);
  // q only reaches o, which is unused.
  EXPECT_EQ(q.grad().abs().max().item<double>(), 0.0);

  // The same through gated DeltaNet: dht reaches g, beta and the initial state.
  const at::Tensor gg0 = log_gates({B, T, H}), b0 = at::rand({B, T, H}, f64);
  at::Tensor gg = leaf(gg0), beta = leaf(b0), h1 = leaf(h00);
  auto [o2, ht2] = gated_delta_rule(q0, k0, v0, gg, beta, impl, c10::nullopt, h1, true);
  (*ht2 * dht).sum().backward();
  GatedDeltaRuleParams pd;
  pd.q = core_view(q0), pd.k = core_view(k0), pd.v = core_view(v0), pd.g = core_view(gg0);
  pd.beta = core_view(b0), pd.initial_state = core_view(h00);
  const at::Tensor dgg = at::empty_like(gg0), dbeta = at::empty_like(b0), dh1 = at::empty_like(h00);
  gated_delta_rule_backward(pd, impl, core_view(zeros), core_view(dht),
                            {{}, {}, {}, core_view(dgg), core_view(dbeta), core_view(dh1), {}});
  EXPECT_CLOSE(gg.grad(), dgg, 1e-13, "dg (gated delta rule)");
  EXPECT_CLOSE(beta.grad(), dbeta, 1e-13, "dbeta");
  EXPECT_CLOSE(h1.grad(), dh1, 1e-13, "dh0 (gated delta rule)");
}

TEST(Torch, UnusedFinalStateCountsAsZeroGradient) {
  torch::manual_seed(9);
  const std::int64_t B = 1, T = 6, H = 1, K = 2, V = 3;
  const at::Tensor q0 = at::randn({B, T, H, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                   v0 = at::randn({B, T, H, V}, f64), g0 = log_gates({B, T, H, K}),
                   h00 = at::randn({B, H, K, V}, f64);
  // Same loss (o only), once with the final state requested but unused, once without it.
  at::Tensor h0a = leaf(h00), h0b = leaf(h00), ga = leaf(g0), gb = leaf(g0);
  auto [oa, hta] = chunk_gla(q0, k0, v0, ga, c10::nullopt, h0a, true);
  auto [ob, htb] = chunk_gla(q0, k0, v0, gb, c10::nullopt, h0b, false);
  EXPECT_FALSE(htb.has_value());
  oa.sum().backward();
  ob.sum().backward();
  EXPECT_TRUE(at::equal(h0a.grad(), h0b.grad()));
  EXPECT_TRUE(at::equal(ga.grad(), gb.grad()));
}

TEST(Torch, OnlyInputsThatRequireGradGetGradients) {
  torch::manual_seed(10);
  const std::int64_t B = 1, T = 5, H = 2, K = 3, V = 3;
  const at::Tensor q = at::randn({B, T, H, K}, f64), k = at::randn({B, T, H, K}, f64),
                   v = at::randn({B, T, H, V}, f64), g0 = log_gates({B, T, H, K});
  at::Tensor g = leaf(g0);
  auto [o, ht] = fused_recurrent_gla(q, k, v, g);
  EXPECT_TRUE(o.requires_grad());
  o.pow(2).sum().backward();
  EXPECT_FALSE(q.grad().defined());
  EXPECT_TRUE(g.grad().defined());

  // Without any input requiring grad, no graph is recorded.
  auto [o2, ht2] = fused_recurrent_gla(q, k, v, g0);
  EXPECT_FALSE(o2.requires_grad());
}

// ---- dtypes and layouts -------------------------------------------------------------------------

TEST(Torch, OutputDtypes) {
  torch::manual_seed(11);
  const std::int64_t B = 1, T = 4, H = 1, K = 2, V = 2;
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const auto opt = at::TensorOptions().dtype(dtype);
    const at::Tensor q = at::randn({B, T, H, K}, opt), k = at::randn({B, T, H, K}, opt),
                     v = at::randn({B, T, H, V}, opt), g = log_gates({B, T, H, K}).to(dtype);
    auto [o, ht] = chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, true);
    EXPECT_EQ(o.scalar_type(), dtype);
    EXPECT_EQ(ht->scalar_type(), dtype);
    auto [o2, ht2] = chunk_gated_delta_rule(q, k, v, g.select(3, 0), at::rand({B, T, H}, opt),
                                            c10::nullopt, c10::nullopt, true);
    EXPECT_EQ(o2.scalar_type(), dtype);
    EXPECT_EQ(ht2->scalar_type(), dtype);
    EXPECT_EQ(parallel_forgetting_attn(q, k, v, g.select(3, 0)).scalar_type(), dtype);
  }
}

// Half and bfloat16 inputs are computed in float32 and o cast back: the results are exactly the
// float32 results on the upcast inputs, rounded, and so are the gradients.
// The compute device for CPU tensors (phasor/torch.h): per thread, restored by the guard; cuda on a
// machine without a GPU is a c10::Error naming the op and the device, before anything runs.
TEST(Torch, ComputeDeviceGuardAndCudaWithoutAGpu) {
  EXPECT_EQ(compute_device(), Device::cpu);
  const at::Tensor q = at::randn({1, 4, 1, 8}), g = -at::rand({1, 4, 1, 8});
  {
    ComputeDeviceGuard guard(Device::emulated);
    EXPECT_EQ(compute_device(), Device::emulated);
    {
      ComputeDeviceGuard inner(Device::cuda);
      EXPECT_EQ(compute_device(), Device::cuda);
      if (cuda_device_count() == 0) {
        try {
          fused_recurrent_gla(q, q, q, g);
          ADD_FAILURE() << "no error without a GPU";
        } catch (const c10::Error& e) {
          const std::string what = e.what_without_backtrace();
          EXPECT_NE(what.find("fused_recurrent_gla: device cuda:"), std::string::npos) << what;
        }
      }
    }
    EXPECT_EQ(compute_device(), Device::emulated);
  }
  EXPECT_EQ(compute_device(), Device::cpu);
}

// The same ops on CPU tensors with the emulated GPU as the compute device (the CUDA kernels' source
// run by the CPU on the tensors' memory: rotary ops, short convolution, recurrent GLA and GDN,
// chunk_gla, parallel_forgetting_attn):
// outputs and autograd gradients equal the CPU kernels' within float32 rounding of a different
// summation order; an implementation without CUDA kernels is a c10::Error naming it.
namespace {

// Runs `f` on the CPU and on the emulated GPU; returns both result lists (outputs and gradients).
std::vector<std::vector<at::Tensor>> on_cpu_and_emulated(
    const std::function<std::vector<at::Tensor>()>& f) {
  std::vector<std::vector<at::Tensor>> results;
  results.push_back(f());
  ComputeDeviceGuard guard(Device::emulated);
  results.push_back(f());
  return results;
}

void expect_emulated_equals_cpu(const std::function<std::vector<at::Tensor>()>& f,
                                const std::string& what) {
  const auto results = on_cpu_and_emulated(f);
  ASSERT_EQ(results[0].size(), results[1].size());
  for (std::size_t i = 0; i < results[0].size(); ++i)
    EXPECT_CLOSE(results[1][i], results[0][i], 1e-6, what + " result " + std::to_string(i));
}

// Gradients of Σ o·d_o with respect to `leaves` (cleared first), after `o` is computed.
std::vector<at::Tensor> grads_of(const at::Tensor& o, const std::vector<at::Tensor>& leaves) {
  const at::Tensor d_o = at::randn(o.sizes(), o.options().requires_grad(false));
  (o * d_o).sum().backward();
  std::vector<at::Tensor> out{o.detach()};
  for (const at::Tensor& l : leaves) out.push_back(l.grad().clone());
  return out;
}

}  // namespace

TEST(Torch, EmulatedComputeDeviceEqualsCpu) {
  const std::int64_t B = 2, T = 9, H = 2, K = 6, V = 5, D = 7;
  const at::Tensor cu = at::tensor({0, 4, 4, 18}, at::kLong);
  torch::manual_seed(21);
  const at::Tensor phi = at::rand({1, 2 * T, H, K / 2}, f32), omega = at::rand({H, K / 2}, f32),
                   x = at::randn({B, T, H, K}, f32), theta = at::randn({B, T, H, K / 2}, f32) * 5,
                   cx = at::randn({1, 2 * T, D}, f32), weight = at::randn({D, 4}, f32),
                   bias = at::randn({D}, f32), cache = at::randn({3, D, 3}, f32);
  expect_emulated_equals_cpu(
      [&] {
        torch::manual_seed(1);
        at::Tensor p = leaf(phi), w = leaf(omega);
        auto [th, fin] = selective_rope_phases(p, w, c10::nullopt, true, cu);
        auto out = grads_of(th + fin->sum(), {p, w});
        return out;
      },
      "selective_rope_phases");
  for (RotaryLayout layout : {RotaryLayout::half_split, RotaryLayout::interleaved})
    expect_emulated_equals_cpu(
        [&] {
          torch::manual_seed(2);
          at::Tensor xl = leaf(x), tl = leaf(theta);
          return grads_of(apply_rotary(xl, tl, layout), {xl, tl});
        },
        std::string("apply_rotary ") + to_string(layout));
  expect_emulated_equals_cpu(
      [&] {
        torch::manual_seed(3);
        at::Tensor xl = leaf(cx), wl = leaf(weight), bl = leaf(bias), cl = leaf(cache);
        auto [y, fc] = causal_conv1d(xl, wl, bl, "silu", cl, true, cu);
        return grads_of(y + fc->sum(), {xl, wl, bl, cl});
      },
      "causal_conv1d");
  const at::Tensor q = at::randn({1, 2 * T, H, K}, f32), k = at::randn({1, 2 * T, H, K}, f32),
                   v = at::randn({1, 2 * T, H, V}, f32),
                   g = log_gates({1, 2 * T, H, K}).to(at::kFloat),
                   g3 = log_gates({1, 2 * T, H}).to(at::kFloat),
                   beta = 2 * at::rand({1, 2 * T, H}, f32), h0 = at::randn({3, H, K, V}, f32),
                   angles = at::randn({1, 2 * T, H, K / 2}, f32) * 5;
  expect_emulated_equals_cpu(
      [&] {
        torch::manual_seed(4);
        at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), gl = leaf(g), hl = leaf(h0),
                   tl = leaf(angles);
        auto [o, ht] = fused_recurrent_gla(ql, kl, vl, gl, c10::nullopt, hl, true, cu, tl);
        return grads_of(o + ht->sum(), {ql, kl, vl, gl, hl, tl});
      },
      "fused_recurrent_gla");
  expect_emulated_equals_cpu(
      [&] {
        torch::manual_seed(5);
        at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), gl = leaf(g3), bl = leaf(beta),
                   hl = leaf(h0), tl = leaf(angles);
        auto [o, ht] = fused_recurrent_gated_delta_rule(ql, kl, vl, gl, bl, c10::nullopt, hl, true,
                                                        cu, true, tl, RotaryLayout::interleaved);
        return grads_of(o + ht->sum(), {ql, kl, vl, gl, bl, hl, tl});
      },
      "fused_recurrent_gated_delta_rule");
  expect_emulated_equals_cpu(
      [&] {
        torch::manual_seed(6);
        at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), gl = leaf(g), hl = leaf(h0),
                   tl = leaf(angles);
        auto [o, ht] = chunk_gla(ql, kl, vl, gl, c10::nullopt, hl, true, cu, 16, tl);
        return grads_of(o + ht->sum(), {ql, kl, vl, gl, hl, tl});
      },
      "chunk_gla");
  expect_emulated_equals_cpu(
      [&] {
        torch::manual_seed(7);
        at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), gl = leaf(g3), bl = leaf(beta),
                   hl = leaf(h0), tl = leaf(angles);
        auto [o, ht] = chunk_gated_delta_rule(ql, kl, vl, gl, bl, c10::nullopt, hl, true, cu, true,
                                              16, tl, RotaryLayout::interleaved);
        return grads_of(o + ht->sum(), {ql, kl, vl, gl, bl, hl, tl});
      },
      "chunk_gated_delta_rule");
  for (bool causal : {false, true})
    expect_emulated_equals_cpu(
        [&] {
          torch::manual_seed(8);
          const at::Tensor w = at::randn({H, 11, K}, f32);
          at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), wl = leaf(w);
          const at::Tensor o =
              favor_attention(ql, kl, vl, wl, causal, c10::nullopt, cu, Impl::chunk, 16);
          return grads_of(o, {ql, kl, vl, wl});
        },
        causal ? "favor_attention (causal)" : "favor_attention");
  {
    const std::int64_t HQ = 2 * H;  // grouped query heads
    const at::Tensor fq = at::randn({1, 2 * T, HQ, K}, f32),
                     fg = log_gates({1, 2 * T, HQ}).to(at::kFloat),
                     sq = 0.2 * at::rand({1, 2 * T, HQ}, f32),
                     sk = 0.2 * at::rand({1, 2 * T, H}, f32);
    expect_emulated_equals_cpu(
        [&] {
          torch::manual_seed(7);
          at::Tensor ql = leaf(fq), kl = leaf(k), vl = leaf(v), gl = leaf(fg), tl = leaf(angles),
                     al = leaf(sq), bl = leaf(sk);
          const at::Tensor o = parallel_forgetting_attn(ql, kl, vl, gl, 0.6, 5, cu, 16, tl,
                                                        RotaryLayout::interleaved, al, bl);
          return grads_of(o, {ql, kl, vl, gl, tl, al, bl});
        },
        "parallel_forgetting_attn");
  }
  {
    ComputeDeviceGuard guard(Device::emulated);
    expect_torch_error([&] { gla(q, k, v, g, Impl::reference); },
                       {"gla_reference", "'impl'", "CUDA kernels"});
  }
}

TEST(Torch, HalfAndBFloat16ComputeInFloat32) {
  torch::manual_seed(12);
  const std::int64_t B = 1, T = 6, H = 2, HV = 2, K = 4, V = 3;
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto low = [&](const at::Tensor& x) { return x.to(dtype); };
    const at::Tensor q = low(at::randn({B, T, H, K}, f32)), k = low(at::randn({B, T, H, K}, f32)),
                     v = low(at::randn({B, T, HV, V}, f32)), g4 = low(log_gates({B, T, H, K})),
                     g3 = low(log_gates({B, T, HV})), beta = low(at::rand({B, T, HV}, f32)),
                     h0 = low(at::randn({B, HV, K, V}, f32));
    const at::Tensor d_o = at::randn({B, T, HV, V}, f32);

    // GLA: all grads come back in the input dtype, equal to the rounded float32 grads.
    {
      at::Tensor ql = leaf(q), gl = leaf(g4), hl = leaf(h0);
      auto [o, ht] = chunk_gla(ql, k, v, gl, c10::nullopt, hl, true);
      EXPECT_EQ(o.scalar_type(), dtype);
      EXPECT_EQ(ht->scalar_type(), at::kFloat);
      (o.to(at::kFloat) * d_o).sum().backward();
      at::Tensor qf = leaf(q.to(at::kFloat)), gf = leaf(g4.to(at::kFloat)),
                 hf = leaf(h0.to(at::kFloat));
      auto [of, htf] =
          chunk_gla(qf, k.to(at::kFloat), v.to(at::kFloat), gf, c10::nullopt, hf, true);
      (of.to(dtype).to(at::kFloat) * d_o).sum().backward();
      EXPECT_TRUE(at::equal(o, of.to(dtype)));
      EXPECT_TRUE(at::equal(*ht, *htf));
      EXPECT_EQ(ql.grad().scalar_type(), dtype);
      EXPECT_TRUE(at::equal(ql.grad(), qf.grad().to(dtype)));
      EXPECT_TRUE(at::equal(gl.grad(), gf.grad().to(dtype)));
      EXPECT_TRUE(at::equal(hl.grad(), hf.grad().to(dtype)));
    }
    // Gated DeltaNet.
    {
      at::Tensor bl = leaf(beta);
      auto [o, ht] = fused_recurrent_gated_delta_rule(q, k, v, g3, bl, c10::nullopt, h0, true);
      EXPECT_EQ(o.scalar_type(), dtype);
      EXPECT_EQ(ht->scalar_type(), at::kFloat);
      (o.to(at::kFloat) * d_o).sum().backward();
      at::Tensor bf = leaf(beta.to(at::kFloat));
      auto [of, htf] = fused_recurrent_gated_delta_rule(q.to(at::kFloat), k.to(at::kFloat),
                                                        v.to(at::kFloat), g3.to(at::kFloat), bf,
                                                        c10::nullopt, h0.to(at::kFloat), true);
      (of.to(dtype).to(at::kFloat) * d_o).sum().backward();
      EXPECT_TRUE(at::equal(o, of.to(dtype)));
      EXPECT_TRUE(at::equal(*ht, *htf));
      EXPECT_EQ(bl.grad().scalar_type(), dtype);
      EXPECT_TRUE(at::equal(bl.grad(), bf.grad().to(dtype)));
    }
    // FoX (HQ = H = 2 here).
    {
      at::Tensor kl = leaf(k);
      const at::Tensor vv = low(at::randn({B, T, H, V}, f32)), gq = low(log_gates({B, T, H}));
      const at::Tensor o = parallel_forgetting_attn(q, kl, vv, gq);
      EXPECT_EQ(o.scalar_type(), dtype);
      (o.to(at::kFloat) * d_o).sum().backward();
      at::Tensor kf = leaf(k.to(at::kFloat));
      const at::Tensor of =
          parallel_forgetting_attn(q.to(at::kFloat), kf, vv.to(at::kFloat), gq.to(at::kFloat));
      (of.to(dtype).to(at::kFloat) * d_o).sum().backward();
      EXPECT_TRUE(at::equal(o, of.to(dtype)));
      EXPECT_TRUE(at::equal(kl.grad(), kf.grad().to(dtype)));
    }
  }
}

// Any strides go straight in, including zero strides (expanded tensors) and sliced views.
TEST(Torch, StridedInputsMatchContiguous) {
  torch::manual_seed(13);
  const std::int64_t B = 2, T = 7, H = 2, K = 3, V = 4;
  const at::Tensor q = at::randn({B, T, H, 2 * K}, f64).slice(3, 0, 2 * K, 2);  // step 2
  const at::Tensor k = at::randn({B, T, 1, K}, f64).expand({B, T, H, K});       // stride 0
  const at::Tensor v = at::randn({T, B, H, V}, f64).transpose(0, 1);
  const at::Tensor g = log_gates({B, T, H, 1}).expand({B, T, H, K});
  ASSERT_FALSE(q.is_contiguous() || k.is_contiguous() || v.is_contiguous() || g.is_contiguous());
  for (Impl impl : kImpls) {
    auto [o, ht] = gla(q, k, v, g, impl, c10::nullopt, c10::nullopt, true);
    auto [oc, htc] = gla(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), impl,
                         c10::nullopt, c10::nullopt, true);
    EXPECT_TRUE(at::equal(o, oc)) << to_string(impl);
    EXPECT_TRUE(at::equal(*ht, *htc)) << to_string(impl);
  }
}

// ---- errors -------------------------------------------------------------------------------------

TEST(Torch, ErrorsAreC10ErrorsNamingTheArgument) {
  const std::int64_t B = 1, T = 4, H = 2, K = 3, V = 3;
  const at::Tensor q = at::randn({B, T, H, K}), k = at::randn({B, T, H, K}),
                   v = at::randn({B, T, H, V}), g = log_gates({B, T, H, K}).to(at::kFloat);
  // Core checks, rethrown as c10::Error with the same message.
  expect_torch_error(
      [&] {
        chunk_gla(q, at::randn({B, T, H, K + 1}), v, g);
      },
      {"chunk_gla: argument 'k': expected", "got shape [1, 4, 2, 4]"});
  expect_torch_error([&] { fused_recurrent_gla(q, k, v, -g); },
                     {"fused_recurrent_gla", "argument 'g'"});
  expect_torch_error(
      [&] { chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, false, c10::nullopt, 0); },
      {"chunk_gla", "chunk_size"});
  expect_torch_error(
      [&] {
        chunk_gla(at::randn({2, T, H, K}), at::randn({2, T, H, K}), at::randn({2, T, H, V}),
                  log_gates({2, T, H, K}), c10::nullopt, c10::nullopt, false,
                  at::tensor({0, 4}, at::kInt));
      },
      {"chunk_gla", "'cu_seqlens'", "B = 2"});
  expect_torch_error(
      [&] {
        chunk_gla(q, k, v, g, c10::nullopt, at::randn({B + 1, H, K, V}));
      },
      {"chunk_gla", "'initial_state'"});
  expect_torch_error(
      [&] {
        chunk_gated_delta_rule(q, k, v, g.select(3, 0), at::rand({B, T, H + 1}));
      },
      {"chunk_gated_delta_rule", "'beta'"});
  expect_torch_error([&] { parallel_forgetting_attn(q, k, v, g.select(3, 0), c10::nullopt, 0); },
                     {"parallel_forgetting_attn", "window_size"});
}

TEST(Torch, TorchLayerChecksNameTheArgument) {
  const std::int64_t B = 1, T = 4, H = 2, K = 3, V = 3;
  const at::Tensor q = at::randn({B, T, H, K}), k = at::randn({B, T, H, K}),
                   v = at::randn({B, T, H, V}), g = log_gates({B, T, H, K}).to(at::kFloat);
  expect_torch_error([&] { chunk_gla(q.to(at::kLong), k, v, g); },
                     {"chunk_gla: argument 'q': expected a floating dtype", "got dtype Long"});
  expect_torch_error([&] { chunk_gla(q, k, v[0], g); },
                     {"chunk_gla: argument 'v': expected 4-D tensor [B, T, H, V]", "got 3-D"});
  expect_torch_error([&] { chunk_gla(q, k, v, g.unsqueeze(0)); }, {"argument 'g'", "5-D"});
  expect_torch_error(
      [&] {
        chunk_gla(q, k, v, g, c10::nullopt, c10::nullopt, false, at::tensor({0.0, 4.0}));
      },
      {"chunk_gla: argument 'cu_seqlens': expected dtype int32 or int64", "got dtype Double"});
  expect_torch_error(
      [&] {
        chunk_gla(q, k, v, at::empty({B, T, H, K}, at::device(at::kMeta)));
      },
      {"chunk_gla: argument 'g': expected a tensor on the cpu", "meta"});
  expect_torch_error([&] { chunk_gla(q, at::Tensor(), v, g); }, {"argument 'k'", "undefined"});
  expect_torch_error(
      [&] {
        fused_recurrent_gated_delta_rule(q, k, v, g.select(3, 0), at::ones({B, T, H}, at::kInt));
      },
      {"fused_recurrent_gated_delta_rule: argument 'beta'", "floating dtype"});
  expect_torch_error([&] { forgetting_attn(q, k, v, g, Impl::recurrent); },
                     {"forgetting_attn_recurrent: argument 'g': expected 3-D tensor"});
}

TEST(Torch, DoubleBackwardIsRefused) {
  torch::manual_seed(15);
  const at::Tensor q = leaf(at::randn({1, 4, 1, 2}, f64)), k = at::randn({1, 4, 1, 2}, f64),
                   v = at::randn({1, 4, 1, 2}, f64), g = log_gates({1, 4, 1, 2});
  auto [o, ht] = chunk_gla(q, k, v, g);
  expect_torch_error(
      [&] {
        torch::autograd::grad({o.pow(2).sum()}, {q}, {}, /*retain_graph=*/true,
                              /*create_graph=*/true);
      },
      {"chunk_gla backward: double backward (create_graph=true) is not supported"});
  // First-order gradients through the same graph still work.
  EXPECT_TRUE(torch::autograd::grad({o.pow(2).sum()}, {q})[0].defined());
}

// ---- FoX decoding -------------------------------------------------------------------------------

TEST(Torch, ForgettingAttnDecoderMatchesParallelForward) {
  torch::manual_seed(14);
  const std::int64_t B = 2, T = 8, HQ = 4, H = 2, K = 3, V = 5;
  const at::Tensor q = at::randn({B, T, HQ, K}, f64), k = at::randn({B, T, H, K}, f64),
                   v = at::randn({B, T, H, V}, f64), g = log_gates({B, T, HQ}, 1.0);
  for (c10::optional<std::int64_t> window :
       {c10::optional<std::int64_t>(), c10::make_optional<std::int64_t>(3)}) {
    SCOPED_TRACE(window ? "window 3" : "no window");
    const at::Tensor expected = parallel_forgetting_attn(q, k, v, g, 0.5, window);
    ForgettingAttnDecoder decoder(B, HQ, H, K, V, window, 0.5);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass after reset() must repeat the first
      for (std::int64_t t = 0; t < T; ++t) {
        const auto tok = [&](const at::Tensor& x) { return x.slice(1, t, t + 1); };
        const at::Tensor o = decoder.step(tok(q), tok(k), tok(v), tok(g));
        EXPECT_EQ(o.sizes(), (at::IntArrayRef{B, 1, HQ, V}));
        EXPECT_EQ(o.scalar_type(), at::kDouble);
        EXPECT_CLOSE(o, tok(expected), 1e-12, "o at token " + std::to_string(t));
      }
      EXPECT_EQ(decoder.length(), T);
      decoder.reset();
      EXPECT_EQ(decoder.length(), 0);
    }
  }
}

// The decoder on the emulated compute device (the cache in the emulated GPU's memory, the CUDA
// decode kernels) equals the CPU decoder: windows, grouped heads, θ and slopes, across a reset().
TEST(Torch, ForgettingAttnDecoderOnTheEmulatedGpuEqualsTheCpu) {
  torch::manual_seed(15);
  const std::int64_t B = 2, T = 9, HQ = 4, H = 2, K = 4, V = 3;
  const at::Tensor q = at::randn({B, T, HQ, K}, f64), k = at::randn({B, T, H, K}, f64),
                   v = at::randn({B, T, H, V}, f64), g = log_gates({B, T, HQ}, 1.0),
                   theta = at::randn({B, T, H, K / 2}, f64) * 5,
                   a = at::rand({B, T, HQ}, f64) * 0.3, b = at::rand({B, T, H}, f64) * 0.3;
  for (c10::optional<std::int64_t> window :
       {c10::optional<std::int64_t>(), c10::make_optional<std::int64_t>(4)}) {
    SCOPED_TRACE(window ? "window 4" : "no window");
    const auto decode = [&](Device device) {
      ComputeDeviceGuard guard(device);
      ForgettingAttnDecoder decoder(B, HQ, H, K, V, window, 0.5);
      std::vector<at::Tensor> rounds;
      for (int round = 0; round < 2; ++round) {
        std::vector<at::Tensor> rows;
        for (std::int64_t t = 0; t < T; ++t) {
          const auto tok = [&](const at::Tensor& x) { return x.slice(1, t, t + 1); };
          rows.push_back(decoder.step(tok(q), tok(k), tok(v), tok(g), tok(theta),
                                      RotaryLayout::interleaved, tok(a), tok(b)));
        }
        rounds.push_back(at::cat(rows, 1));
        decoder.reset();
      }
      EXPECT_TRUE(at::equal(rounds[0], rounds[1])) << "the round after reset() differs";
      return rounds[0];
    };
    EXPECT_CLOSE(decode(Device::emulated), decode(Device::cpu), 1e-12, "o");
  }
}

TEST(Torch, ForgettingAttnDecoderErrors) {
  expect_torch_error([&] { ForgettingAttnDecoder(1, 3, 2, 4, 4); },
                     {"argument 'num_q_heads'"});  // HQ not a multiple of H
  ForgettingAttnDecoder decoder(1, 2, 1, 3, 4);
  expect_torch_error(
      [&] {
        decoder.step(at::randn({1, 1, 2, 4}), at::randn({1, 1, 1, 3}), at::randn({1, 1, 1, 4}),
                     at::zeros({1, 1, 2}));
      },
      {"'q'"});
  expect_torch_error(
      [&] {
        decoder.step(at::randn({1, 1, 2}), at::randn({1, 1, 1, 3}), at::randn({1, 1, 1, 4}),
                     at::zeros({1, 1, 2}));
      },
      {"argument 'q': expected 4-D"});
}

// ---- rotary ops, short convolution and fused rotation
// --------------------------------------------- The expected values come from plain torch
// operations differentiated by torch's own autograd, an implementation independent of phasor's
// kernels.

// Rotation of x [B, T, H, K] by theta [B, T, H, R] (or [B, T, R]) written with torch ops.
at::Tensor torch_rotate(const at::Tensor& x, at::Tensor theta, RotaryLayout layout) {
  if (theta.dim() == 3) theta = theta.unsqueeze(2);
  const std::int64_t R = x.size(3) / 2;
  const at::Tensor c = theta.cos(), s = theta.sin();
  if (layout == RotaryLayout::half_split) {
    const at::Tensor a = x.slice(3, 0, R), b = x.slice(3, R, 2 * R);
    return at::cat({a * c - b * s, a * s + b * c}, 3);
  }
  const at::Tensor pairs = x.reshape({x.size(0), x.size(1), x.size(2), R, 2});
  const at::Tensor a = pairs.select(4, 0), b = pairs.select(4, 1);
  return at::stack({a * c - b * s, a * s + b * c}, 4).reshape(x.sizes());
}

const RotaryLayout kLayouts[] = {RotaryLayout::half_split, RotaryLayout::interleaved};

TEST(TorchRotary, ApplyRotaryMatchesTorchOpsWithGradients) {
  torch::manual_seed(20);
  const std::int64_t B = 2, T = 5, H = 3, K = 6;
  for (RotaryLayout layout : kLayouts) {
    for (bool shared : {false, true}) {
      SCOPED_TRACE(std::string(to_string(layout)) + (shared ? " shared over heads" : " per head"));
      const at::Tensor x0 = at::randn({B, T, H, K}, f64);
      const at::Tensor t0 =
          shared ? at::randn({B, T, K / 2}, f64) * 3 : at::randn({B, T, H, K / 2}, f64) * 3;
      at::Tensor x = strided_leaf(x0), theta = leaf(t0), xr = leaf(x0), tr = leaf(t0);
      const at::Tensor y = apply_rotary(x, theta, layout), y_ref = torch_rotate(xr, tr, layout);
      EXPECT_CLOSE(y, y_ref, 1e-14, "y");
      const at::Tensor dy = at::randn_like(y_ref);
      y.backward(dy);
      y_ref.backward(dy);
      EXPECT_CLOSE(x.grad(), xr.grad(), 1e-14, "dx");
      EXPECT_CLOSE(theta.grad(), tr.grad(), 1e-13, "dtheta");
    }
  }
  // float32 and float16 inputs keep their dtype.
  const at::Tensor xh = at::randn({1, 3, 2, 4}).to(at::kHalf);
  EXPECT_EQ(apply_rotary(xh, at::randn({1, 3, 2})).scalar_type(), at::kHalf);
  EXPECT_EQ(apply_rotary(xh.to(at::kFloat), at::randn({1, 3, 2})).scalar_type(), at::kFloat);
}

TEST(TorchRotary, SelectiveRopePhasesMatchTorchCumsumWithGradients) {
  torch::manual_seed(21);
  const std::int64_t T = 9, H = 2, R = 3;
  const at::Tensor cu = at::tensor({0, 4, 4, 9}, at::kLong);  // one empty sequence
  for (bool per_head_omega : {true, false}) {
    SCOPED_TRACE(per_head_omega ? "omega [H, R]" : "omega [R]");
    const at::Tensor phi0 = at::randn({1, T, H, R}, f64),
                     w0 = per_head_omega ? at::rand({H, R}, f64) : at::rand({R}, f64),
                     p00 = at::randn({3, H, R}, f64);
    at::Tensor phi = leaf(phi0), omega = leaf(w0), p0 = leaf(p00);
    auto [theta, final_phase] = selective_rope_phases(phi, omega, p0, true, cu);
    ASSERT_TRUE(final_phase.has_value());
    // Reference: a cumulative sum per sequence, restarted at each boundary of cu_seqlens.
    at::Tensor phir = leaf(phi0), omegar = leaf(w0), p0r = leaf(p00);
    std::vector<at::Tensor> pieces, finals;
    const std::int64_t bounds[] = {0, 4, 4, 9};
    for (int n = 0; n < 3; ++n) {
      const at::Tensor run =
          p0r[n] + phir.slice(1, bounds[n], bounds[n + 1]).cumsum(1);  // [1, L, H, R]
      pieces.push_back(run * omegar);
      finals.push_back(p0r[n] + phir.slice(1, bounds[n], bounds[n + 1]).sum(at::IntArrayRef{0, 1}));
    }
    const at::Tensor theta_ref = at::cat(pieces, 1), final_ref = at::stack(finals, 0);
    EXPECT_CLOSE(theta, theta_ref, 1e-14, "theta");
    EXPECT_CLOSE(*final_phase, final_ref, 1e-14, "final_phase");
    const at::Tensor dtheta = at::randn_like(theta_ref), dfinal = at::randn_like(final_ref);
    torch::autograd::backward({theta, *final_phase}, {dtheta, dfinal});
    torch::autograd::backward({theta_ref, final_ref}, {dtheta, dfinal});
    EXPECT_CLOSE(phi.grad(), phir.grad(), 1e-13, "dphi");
    EXPECT_CLOSE(omega.grad(), omegar.grad(), 1e-13, "domega");
    EXPECT_CLOSE(p0.grad(), p0r.grad(), 1e-13, "dinitial_phase");
  }
  // Continuing from final_phase equals one call over the whole sequence.
  const at::Tensor phi = at::randn({2, 8, H, R}, f64), omega = at::rand({R}, f64);
  const at::Tensor whole = std::get<0>(selective_rope_phases(phi, omega));
  auto [first, mid] = selective_rope_phases(phi.slice(1, 0, 5), omega, c10::nullopt, true);
  const at::Tensor rest = std::get<0>(selective_rope_phases(phi.slice(1, 5, 8), omega, *mid));
  EXPECT_CLOSE(at::cat({first, rest}, 1), whole, 1e-14, "continued phases");
}

TEST(TorchRotary, RopeAnglesArePositionTimesFrequency) {
  const std::int64_t K = 8;
  const at::Tensor theta = rope_angles(2, 5, K, 10000.0, 3, c10::nullopt, at::kDouble);
  ASSERT_EQ(theta.sizes(), (at::IntArrayRef{2, 5, K / 2}));
  const at::Tensor pos = at::arange(3, 8, f64).view({1, 5, 1});
  const at::Tensor freq = at::pow(10000.0, -at::arange(0, K, 2, f64) / K).view({1, 1, K / 2});
  EXPECT_CLOSE(theta, (pos * freq).expand({2, 5, K / 2}), 1e-15, "rope angles");
  // Positions restart at every sequence of cu_seqlens.
  const at::Tensor packed =
      rope_angles(1, 6, K, 10000.0, 0, at::tensor({0, 2, 6}, at::kInt), at::kDouble);
  EXPECT_TRUE(at::allclose(packed[0][2], packed[0][0].mul(0)));
  EXPECT_TRUE(at::allclose(packed[0][3], packed[0][1]));
  expect_torch_error([] { rope_angles(1, 4, 7); }, {"argument 'head_dim'"});
  expect_torch_error([] { rope_angles(1, 4, 8, 10000.0, 0, c10::nullopt, at::kInt); },
                     {"argument 'dtype'"});
}

TEST(TorchRotary, StandardRopeLogitsDependOnlyOnTheOffset) {
  // q·k after RoPE at positions (m, n) equals the same at (m + d, n + d): the relative law.
  torch::manual_seed(22);
  const std::int64_t T = 12, K = 8;
  const at::Tensor q = at::randn({1, 1, 1, K}, f64).expand({1, T, 1, K}),
                   k = at::randn({1, 1, 1, K}, f64).expand({1, T, 1, K});
  const at::Tensor theta = rope_angles(1, T, K, 10000.0, 0, c10::nullopt, at::kDouble);
  for (RotaryLayout layout : kLayouts) {
    const at::Tensor qr = apply_rotary(q, theta, layout)[0].select(1, 0),
                     kr = apply_rotary(k, theta, layout)[0].select(1, 0);
    const at::Tensor logits = qr.matmul(kr.t());  // [T, T]
    for (std::int64_t m = 0; m + 3 < T; ++m)
      for (std::int64_t n = 0; n + 3 < T; ++n)
        EXPECT_NEAR(logits[m][n].item<double>(), logits[m + 3][n + 3].item<double>(), 1e-12);
  }
}

TEST(TorchRotary, CausalConv1dMatchesTorchConvWithGradientsAndCache) {
  torch::manual_seed(23);
  const std::int64_t B = 2, T = 7, D = 5, W = 4;
  for (const char* activation : {"none", "silu"}) {
    SCOPED_TRACE(activation);
    const at::Tensor x0 = at::randn({B, T, D}, f64), w0 = at::randn({D, W}, f64),
                     b0 = at::randn({D}, f64), c0 = at::randn({B, D, W - 1}, f64);
    at::Tensor x = leaf(x0), w = leaf(w0), b = leaf(b0), c = leaf(c0);
    auto [y, final_state] = causal_conv1d(x, w, b, activation, c, true);
    // Reference: depthwise conv1d over [cache, x] along time.
    at::Tensor xr = leaf(x0), wr = leaf(w0), br = leaf(b0), cr = leaf(c0);
    const at::Tensor ext = at::cat({cr, xr.transpose(1, 2)}, 2);  // [B, D, W-1+T]
    at::Tensor y_ref = at::conv1d(ext, wr.unsqueeze(1), br, at::IntArrayRef{1}, at::IntArrayRef{0},
                                  at::IntArrayRef{1}, D)
                           .transpose(1, 2);
    if (std::string(activation) == "silu") y_ref = at::silu(y_ref);
    const at::Tensor final_ref = ext.slice(2, T, T + W - 1);
    EXPECT_CLOSE(y, y_ref, 1e-14, "y");
    EXPECT_CLOSE(*final_state, final_ref, 1e-15, "final_state");
    const at::Tensor dy = at::randn_like(y_ref), dfinal = at::randn_like(final_ref);
    torch::autograd::backward({y, *final_state}, {dy, dfinal});
    torch::autograd::backward({y_ref, final_ref}, {dy, dfinal});
    EXPECT_CLOSE(x.grad(), xr.grad(), 1e-13, "dx");
    EXPECT_CLOSE(w.grad(), wr.grad(), 1e-13, "dweight");
    EXPECT_CLOSE(b.grad(), br.grad(), 1e-13, "dbias");
    EXPECT_CLOSE(c.grad(), cr.grad(), 1e-13, "dinitial_state");
  }
  // Decoding one token at a time through the cache reproduces the full call.
  const at::Tensor x = at::randn({B, T, D}, f64), w = at::randn({D, W}, f64);
  const at::Tensor full = std::get<0>(causal_conv1d(x, w, c10::nullopt, "silu"));
  at::Tensor cache = at::zeros({B, D, W - 1}, f64);
  for (std::int64_t t = 0; t < T; ++t) {
    auto [y, next] = causal_conv1d(x.slice(1, t, t + 1), w, c10::nullopt, "silu", cache, true);
    EXPECT_CLOSE(y, full.slice(1, t, t + 1), 1e-14, "decoded token " + std::to_string(t));
    cache = *next;
  }
  expect_torch_error([&] { causal_conv1d(x, w, c10::nullopt, "gelu"); }, {"activation"});
  expect_torch_error([&] { causal_conv1d(x, at::randn({D + 1, W}, f64)); }, {"'weight'"});
}

// Fused rotation through the torch API == apply_rotary on q and k, then the op without theta:
// outputs and every gradient, theta's included (autograd sums the q and k paths of the explicit
// version; the fused kernel returns the same sum).
class TorchFusedRotation : public ::testing::TestWithParam<std::tuple<Impl, RotaryLayout>> {};
INSTANTIATE_TEST_SUITE_P(AllImplsAndLayouts, TorchFusedRotation,
                         ::testing::Combine(::testing::ValuesIn(kImpls),
                                            ::testing::ValuesIn(kLayouts)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  to_string(std::get<1>(info.param));
                         });

TEST_P(TorchFusedRotation, GlaMatchesExplicitRotation) {
  const auto [impl, layout] = GetParam();
  torch::manual_seed(24);
  const std::int64_t B = 2, T = 7, H = 2, K = 4, V = 3;
  const at::Tensor q0 = at::randn({B, T, H, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                   v0 = at::randn({B, T, H, V}, f64), g0 = log_gates({B, T, H, K}),
                   t0 = at::randn({B, T, H, K / 2}, f64) * 4, h00 = at::randn({B, H, K, V}, f64);
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0), g = leaf(g0), theta = leaf(t0),
             h0 = leaf(h00);
  auto [o, ht] = gla(q, k, v, g, impl, c10::nullopt, h0, true, c10::nullopt, 3, theta, layout);
  at::Tensor qr = leaf(q0), kr = leaf(k0), vr = leaf(v0), gr = leaf(g0), tr = leaf(t0),
             h0r = leaf(h00);
  auto [o_ref, ht_ref] = gla(apply_rotary(qr, tr, layout), apply_rotary(kr, tr, layout), vr, gr,
                             impl, c10::nullopt, h0r, true, c10::nullopt, 3);
  EXPECT_CLOSE(o, o_ref, 1e-12, "o");
  EXPECT_CLOSE(*ht, *ht_ref, 1e-12, "final_state");
  const at::Tensor d_o = at::randn_like(o_ref), dht = at::randn_like(*ht_ref);
  torch::autograd::backward({o, *ht}, {d_o, dht});
  torch::autograd::backward({o_ref, *ht_ref}, {d_o, dht});
  EXPECT_CLOSE(q.grad(), qr.grad(), 1e-12, "dq");
  EXPECT_CLOSE(k.grad(), kr.grad(), 1e-12, "dk");
  EXPECT_CLOSE(v.grad(), vr.grad(), 1e-12, "dv");
  EXPECT_CLOSE(g.grad(), gr.grad(), 1e-12, "dg");
  EXPECT_CLOSE(h0.grad(), h0r.grad(), 1e-12, "dh0");
  EXPECT_CLOSE(theta.grad(), tr.grad(), 1e-12, "dtheta");
}

TEST_P(TorchFusedRotation, GatedDeltaRuleMatchesExplicitRotation) {
  const auto [impl, layout] = GetParam();
  torch::manual_seed(25);
  const std::int64_t B = 2, T = 7, H = 1, HV = 2, K = 4, V = 3;
  const at::Tensor q0 = at::randn({B, T, H, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                   v0 = at::randn({B, T, HV, V}, f64), g0 = log_gates({B, T, HV}, 3.0),
                   beta0 = 2 * at::rand({B, T, HV}, f64), t0 = at::randn({B, T, H, K / 2}, f64),
                   h00 = at::randn({B, HV, K, V}, f64);
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0), g = leaf(g0), beta = leaf(beta0),
             theta = leaf(t0), h0 = leaf(h00);
  auto [o, ht] = gated_delta_rule(q, k, v, g, beta, impl, c10::nullopt, h0, true, c10::nullopt,
                                  true, 3, theta, layout);
  at::Tensor qr = leaf(q0), kr = leaf(k0), vr = leaf(v0), gr = leaf(g0), br = leaf(beta0),
             tr = leaf(t0), h0r = leaf(h00);
  auto [o_ref, ht_ref] =
      gated_delta_rule(apply_rotary(qr, tr, layout), apply_rotary(kr, tr, layout), vr, gr, br, impl,
                       c10::nullopt, h0r, true, c10::nullopt, true, 3);
  EXPECT_CLOSE(o, o_ref, 1e-12, "o");
  EXPECT_CLOSE(*ht, *ht_ref, 1e-12, "final_state");
  const at::Tensor d_o = at::randn_like(o_ref), dht = at::randn_like(*ht_ref);
  torch::autograd::backward({o, *ht}, {d_o, dht});
  torch::autograd::backward({o_ref, *ht_ref}, {d_o, dht});
  EXPECT_CLOSE(q.grad(), qr.grad(), 1e-12, "dq");
  EXPECT_CLOSE(k.grad(), kr.grad(), 1e-12, "dk");
  EXPECT_CLOSE(v.grad(), vr.grad(), 1e-12, "dv");
  EXPECT_CLOSE(g.grad(), gr.grad(), 1e-12, "dg");
  EXPECT_CLOSE(beta.grad(), br.grad(), 1e-12, "dbeta");
  EXPECT_CLOSE(h0.grad(), h0r.grad(), 1e-12, "dh0");
  EXPECT_CLOSE(theta.grad(), tr.grad(), 1e-12, "dtheta");
}

TEST_P(TorchFusedRotation, ForgettingAttnMatchesExplicitRotation) {
  const auto [impl, layout] = GetParam();
  torch::manual_seed(26);
  const std::int64_t B = 2, T = 9, HQ = 4, H = 2, K = 4, V = 3;
  const at::Tensor q0 = at::randn({B, T, HQ, K}, f64), k0 = at::randn({B, T, H, K}, f64),
                   v0 = at::randn({B, T, H, V}, f64), g0 = log_gates({B, T, HQ}, 1.0),
                   t0 = at::randn({B, T, H, K / 2}, f64) * 4;
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0), g = leaf(g0), theta = leaf(t0);
  const at::Tensor o =
      forgetting_attn(q, k, v, g, impl, c10::nullopt, c10::nullopt, c10::nullopt, 4, theta, layout);
  at::Tensor qr = leaf(q0), kr = leaf(k0), vr = leaf(v0), gr = leaf(g0), tr = leaf(t0);
  // Each query head uses the angles of its key head: repeat theta over the query group.
  const at::Tensor tq = tr.repeat_interleave(HQ / H, 2);
  const at::Tensor o_ref =
      forgetting_attn(apply_rotary(qr, tq, layout), apply_rotary(kr, tr, layout), vr, gr, impl,
                      c10::nullopt, c10::nullopt, c10::nullopt, 4);
  EXPECT_CLOSE(o, o_ref, 1e-12, "o");
  const at::Tensor d_o = at::randn_like(o_ref);
  o.backward(d_o);
  o_ref.backward(d_o);
  EXPECT_CLOSE(q.grad(), qr.grad(), 1e-12, "dq");
  EXPECT_CLOSE(k.grad(), kr.grad(), 1e-12, "dk");
  EXPECT_CLOSE(v.grad(), vr.grad(), 1e-12, "dv");
  EXPECT_CLOSE(g.grad(), gr.grad(), 1e-12, "dg");
  EXPECT_CLOSE(theta.grad(), tr.grad(), 1e-12, "dtheta");
}

TEST(TorchRotary, ForgettingAttnDecoderWithThetaMatchesParallelForward) {
  torch::manual_seed(27);
  const std::int64_t B = 2, T = 8, HQ = 4, H = 2, K = 4, V = 3;
  const at::Tensor q = at::randn({B, T, HQ, K}, f64), k = at::randn({B, T, H, K}, f64),
                   v = at::randn({B, T, H, V}, f64), g = log_gates({B, T, HQ}, 1.0),
                   theta = at::randn({B, T, H, K / 2}, f64) * 5;
  for (RotaryLayout layout : kLayouts) {
    const at::Tensor expected = parallel_forgetting_attn(q, k, v, g, c10::nullopt, c10::nullopt,
                                                         c10::nullopt, 64, theta, layout);
    ForgettingAttnDecoder decoder(B, HQ, H, K, V);
    for (std::int64_t t = 0; t < T; ++t) {
      const auto tok = [&](const at::Tensor& x) { return x.slice(1, t, t + 1); };
      const at::Tensor o = decoder.step(tok(q), tok(k), tok(v), tok(g), tok(theta), layout);
      EXPECT_CLOSE(o, tok(expected), 1e-12, "o at token " + std::to_string(t));
    }
  }
}

TEST(TorchRotary, ThetaErrorsNameTheArgument) {
  const at::Tensor q = at::randn({1, 4, 2, 6}), v = at::randn({1, 4, 2, 3}),
                   g = at::zeros({1, 4, 2, 6});
  expect_torch_error(
      [&] {
        chunk_gla(q, q, v, g, {}, {}, false, {}, 64, at::zeros({1, 4, 2}));
      },
      {"chunk_gla", "argument 'theta'", "4-D"});
  expect_torch_error(
      [&] {
        chunk_gla(q, q, v, g, {}, {}, false, {}, 64, at::zeros({1, 4, 2, 2}));
      },
      {"chunk_gla", "argument 'theta'", "K/2=3"});
  expect_torch_error(
      [&] {
        parallel_forgetting_attn(q, q, v, at::zeros({1, 4, 2}), {}, {}, {}, 64,
                                 at::zeros({1, 4, 1, 3}));
      },
      {"argument 'theta'"});
  expect_torch_error([&] { apply_rotary(q, at::zeros({1, 4, 2, 2})); }, {"argument 'theta'"});
  expect_torch_error(
      [&] {
        selective_rope_phases(at::zeros({1, 4, 2, 3}), at::zeros({2, 2}));
      },
      {"argument 'omega'"});
}

}  // namespace
}  // namespace phasor
