// One Gated Linear Attention layer in LibTorch on top of the installed phasor package:
// projections with torch::nn::Linear, log-sigmoid forget gates, phasor::chunk_gla as the token
// mixer. Runs forward and backward, prints the loss and a gradient norm, and checks the chunked
// kernel's output (and gradient) against phasor::fused_recurrent_gla. Exit status 1 if they differ.
#include <phasor/torch.h>
#include <torch/torch.h>

#include <cstdio>

namespace {

// x: [B, T, d_model] → [B, T, d_model]. Per head h: q, k ∈ R^K, v ∈ R^V, and a forget gate per
// key channel, g = log σ(W_g x) / gate_normalizer (≤ 0; the normalizer keeps gates near 1, as in
// the GLA paper and fla's GatedLinearAttention layer).
struct GlaLayerImpl : torch::nn::Module {
  GlaLayerImpl(std::int64_t d_model, std::int64_t heads, std::int64_t key_dim,
               std::int64_t value_dim)
      : H(heads), K(key_dim), V(value_dim) {
    using torch::nn::Linear;
    using torch::nn::LinearOptions;
    q_proj = register_module("q_proj", Linear(LinearOptions(d_model, H * K).bias(false)));
    k_proj = register_module("k_proj", Linear(LinearOptions(d_model, H * K).bias(false)));
    v_proj = register_module("v_proj", Linear(LinearOptions(d_model, H * V).bias(false)));
    g_proj = register_module("g_proj", Linear(LinearOptions(d_model, H * K)));
    o_proj = register_module("o_proj", Linear(LinearOptions(H * V, d_model).bias(false)));
  }

  // The token mixer's output o: [B, T, H, V], through the chosen phasor implementation.
  torch::Tensor mix(const torch::Tensor& x, phasor::Impl impl) {
    const std::int64_t B = x.size(0), T = x.size(1);
    const auto q = q_proj->forward(x).view({B, T, H, K});
    const auto k = k_proj->forward(x).view({B, T, H, K});
    const auto v = v_proj->forward(x).view({B, T, H, V});
    const auto g = torch::log_sigmoid(g_proj->forward(x)).view({B, T, H, K}) / gate_normalizer;
    auto [o, final_state] = impl == phasor::Impl::chunk
                                ? phasor::chunk_gla(q, k, v, g, /*scale=*/{}, /*initial_state=*/{},
                                                    /*output_final_state=*/false,
                                                    /*cu_seqlens=*/{}, /*chunk_size=*/32)
                                : phasor::fused_recurrent_gla(q, k, v, g);
    return o;
  }

  torch::Tensor forward(const torch::Tensor& x, phasor::Impl impl = phasor::Impl::chunk) {
    const auto o = mix(x, impl);
    return o_proj->forward(o.reshape({x.size(0), x.size(1), H * V}));
  }

  std::int64_t H, K, V;
  double gate_normalizer = 16.0;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, g_proj{nullptr},
      o_proj{nullptr};
};
TORCH_MODULE(GlaLayer);

double rel_rms(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kDouble), y = b.to(torch::kDouble);
  return std::sqrt((x - y).pow(2).sum().item<double>() / y.pow(2).sum().item<double>());
}

}  // namespace

int main() {
  torch::manual_seed(0);
  const std::int64_t B = 2, T = 200, d_model = 64, H = 4, K = 16, V = 16;
  GlaLayer layer(d_model, H, K, V);
  const auto x = torch::randn({B, T, d_model});
  const auto target = torch::randn({B, T, d_model});

  // Forward and backward through the chunked kernel.
  const auto loss = torch::mse_loss(layer->forward(x, phasor::Impl::chunk), target);
  loss.backward();
  const auto grad_chunk = layer->q_proj->weight.grad().clone();
  std::printf("gla_layer: B=%lld T=%lld d_model=%lld H=%lld K=%lld V=%lld\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(d_model),
              static_cast<long long>(H), static_cast<long long>(K), static_cast<long long>(V));
  std::printf("loss = %.6f, |d loss / d W_q| = %.6e\n", loss.item<double>(),
              grad_chunk.norm().item<double>());

  // The same through the token-by-token kernel: outputs and gradients must agree.
  layer->zero_grad();
  torch::mse_loss(layer->forward(x, phasor::Impl::recurrent), target).backward();
  const auto grad_recurrent = layer->q_proj->weight.grad();
  torch::Tensor o_chunk, o_recurrent;
  {
    torch::NoGradGuard no_grad;
    o_chunk = layer->mix(x, phasor::Impl::chunk);
    o_recurrent = layer->mix(x, phasor::Impl::recurrent);
  }
  const double err_o = rel_rms(o_chunk, o_recurrent);
  const double err_grad = rel_rms(grad_chunk, grad_recurrent);
  std::printf("chunk_gla vs fused_recurrent_gla: relative RMS difference o %.2e, dW_q %.2e\n",
              err_o, err_grad);
  const double tolerance = 1e-5;  // float32 kernels, different summation orders
  if (!(err_o <= tolerance && err_grad <= tolerance)) {
    std::printf("FAILED: the implementations disagree (tolerance %.0e)\n", tolerance);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
