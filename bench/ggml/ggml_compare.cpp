// ggml_compare: phasor against ggml on the CPU, one measurement per process (issue 13).
//
// bench/ggml-compare.sh runs this program many times, phasor and ggml interleaved on the same
// shapes, and turns the JSON lines it prints into a table. One measurement per process, so that
// neither library inherits the other's warm caches, thread pools or heap.
//
//   ggml_compare check [--T 1024] [--threads 2]
//       Computes every compared op with both libraries on the same inputs and prints, per op, the
//       max relative error max|phasor − ggml| / max|ggml| (outputs and final states) as JSON
//       lines; exits 1 if any exceeds its tolerance. A benchmark of two different functions
//       would be worthless, so the driver runs this first.
//   ggml_compare measure --library phasor|ggml --op gla|gdn|fox --mode forward|fwd_bwd|decode
//                        [--impl chunk|recurrent] --T N --threads N [--min-time S]
//                        [--gate-mean M]
//       One timing: a warm-up, then repeated calls (batched when short) until --min-time seconds
//       and at least 3 samples; prints the median time per call as one JSON line. The log gates
//       are log σ(M + N(0, 1)), M = 3 (σ(3) ≈ 0.95, a trained model's typical gate) unless given:
//       smaller M gives stronger gates (M = −1: ~−1.3 per token and channel), whose decay
//       factors reach float32's subnormal range within a chunk.
//
// Shapes: B = 1, H = 8, K = V = 128, float32 everywhere, as in bench/<op>_bench.cpp.
//
// How the two libraries are made to compute the same function (read from ggml's
// src/ggml-cpu/ops.cpp; ggml's ne[] lists dimensions innermost first, so ggml [S, H, T] is
// row-major [T, H, S], phasor's [B = 1, T, H, K]):
//  - GLA, ggml_gated_linear_attn(k, v, q, g, state, scale): S_t = diag(g_t) S_{t−1} + k_t v_tᵀ,
//    o_t = S_tᵀ (scale · q_t). Its g MULTIPLIES the state: it is the gate itself, not its log
//    (phasor's g is the log gate), so ggml gets exp(g). Its state [S·S·H, 1] is per head [K][V]
//    row-major, as phasor's [N, H, K, V]. The result packs o [T, H, V] and then the final state.
//  - Gated DeltaNet, ggml_gated_delta_net(q, k, v, g, beta, state, 1): decay by exp(g) (a log
//    gate, as phasor's), then the delta rule with β, o = S_tᵀ q · S_v^−1/2 (its scale is fixed at
//    S_v^−1/2; phasor's default K^−1/2 is the same here, K = V). It does not normalise q and k,
//    so both libraries get ℓ2-normalised q and k (phasor: use_qk_l2norm_in_kernel = false). Its
//    state is stored TRANSPOSED: per head [V][K] row-major (s[j·S + i] = S[i][j]), so states are
//    transposed on the way in and out.
//  - FoX, ggml_flash_attn_ext(q, k, v, mask, scale, 0, 0): logits scale · q·k + mask, softmax,
//    · v. FoX's logits add Σ_{s ∈ (j, i]} g_s, which ggml can only take as a mask holding that
//    sum per head ([T_kv, T_q, H] = 2·T²·H bytes: 4 GiB at T = 16384), built outside the timed
//    region. ggml requires the mask in float16: the sums are rounded to 11 significant bits (an
//    error of up to ~2.5·10⁻⁴ |sum| in a logit), so on realistic gates the outputs differ by
//    ~10⁻³, far above float32 rounding. The check therefore also runs gates that are multiples
//    of 2⁻⁶, whose sums float16 holds exactly wherever they matter (|sum| < 32; beyond, a
//    weight is below e⁻²⁰ of the largest), and there holds the two to float32 tolerance.
//    K and V are float32 for ggml too (llama.cpp's cache is often float16; this table is
//    float32 throughout).
//  - Decoding (T = 1, state in / state out): phasor updates the state in place (final_state =
//    initial_state, 64-byte aligned), as a serving loop calls it. ggml's ops read the state
//    tensor and write the new state into their result; the measurement leaves out the copy back
//    into the cache that llama.cpp adds to its graph, i.e. it times ggml's op alone.
//  - Threads: phasor::set_num_threads(n); ggml: a persistent ggml_threadpool of n threads passed
//    to ggml_graph_plan (OpenMP threads when ggml was built with OpenMP, its default), the graph
//    built and planned once, ggml_graph_compute per call.
#include <ggml-cpu.h>
#include <ggml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "phasor/phasor.h"

namespace {

using phasor::Impl;
using phasor::TensorView;
using json = nlohmann::json;

constexpr std::int64_t kHeads = 8, kDim = 128;  // H, and K = V
const double kScale = 1.0 / std::sqrt(static_cast<double>(kDim));

// ---- Inputs
// ---------------------------------------------------------------------------------------

std::vector<float> normal(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

// log σ(mean + N(0, 1)): σ(3) ≈ 0.95 is the typical forget gate of a trained model.
std::vector<float> log_sigmoid_gates(std::size_t n, std::mt19937_64& rng, float mean) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> g(n);
  for (auto& e : g) e = -std::log1p(std::exp(-(mean + dist(rng))));
  return g;
}

// Divides each row of `dim` values by its ℓ2 norm (Gated DeltaNet's q and k, normalised before
// either library sees them).
void l2_normalise_rows(std::vector<float>& x, std::int64_t dim) {
  for (std::size_t r = 0; r < x.size(); r += static_cast<std::size_t>(dim)) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < dim; ++i) sum += static_cast<double>(x[r + i]) * x[r + i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(sum + 1e-6));
    for (std::int64_t i = 0; i < dim; ++i) x[r + i] *= inv;
  }
}

// A zeroed float buffer on a 64-byte boundary, as LibTorch's tensors are: phasor's recurrent
// kernels then update a state in place (bench_util.h's aligned_state).
class AlignedFloats {
 public:
  explicit AlignedFloats(std::size_t count) : count_(count) {
    const std::size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), 0, bytes);
  }
  float* data() const { return data_.get(); }
  std::size_t size() const { return count_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  std::size_t count_;
};

// One problem, in phasor's layouts ([T, H, ·] row-major; states [H, K, V]). Every op's inputs
// are generated, only the op's are used.
struct Problem {
  enum class Op { gla, gdn, fox };
  Op op;
  std::int64_t T;
  std::vector<float> q, k, v;
  std::vector<float> log_gate;         // GLA [T, H, K]; Gated DeltaNet, FoX [T, H]
  std::vector<float> beta;             // Gated DeltaNet [T, H]
  std::vector<float> initial_state;    // GLA, Gated DeltaNet [H, K, V]
  std::vector<float> output_gradient;  // d_o [T, H, V], for forward + backward

  // random_state: a random initial state (the check) instead of zeros (the benchmark).
  // f16_exact_gates: FoX gates rounded to multiples of 2⁻⁶ (see the top of the file).
  // gate_mean: the gates are log σ(gate_mean + N(0, 1)).
  Problem(Op op_, std::int64_t T_, bool random_state, bool f16_exact_gates = false,
          float gate_mean = 3.f)
      : op(op_), T(T_) {
    const auto rows = static_cast<std::size_t>(T * kHeads);
    const auto elems = rows * static_cast<std::size_t>(kDim);
    std::mt19937_64 rng(42);
    q = normal(elems, rng);
    k = normal(elems, rng);
    v = normal(elems, rng);
    output_gradient = normal(elems, rng);
    switch (op) {
      case Op::gla:
        log_gate = log_sigmoid_gates(elems, rng, gate_mean);
        break;
      case Op::gdn: {
        log_gate = log_sigmoid_gates(rows, rng, gate_mean);
        beta = normal(rows, rng);  // β = σ(N(0, 1))
        for (auto& e : beta) e = 1.f / (1.f + std::exp(-e));
        l2_normalise_rows(q, kDim);
        l2_normalise_rows(k, kDim);
        break;
      }
      case Op::fox:
        log_gate = log_sigmoid_gates(rows, rng, gate_mean);
        if (f16_exact_gates)
          for (auto& e : log_gate) e = std::round(e * 64.f) / 64.f;
        break;
    }
    initial_state.assign(static_cast<std::size_t>(kHeads * kDim * kDim), 0.f);
    if (random_state && op != Op::fox) {
      // A state of the size the recurrence reaches: Σ of ~20 outer products k vᵀ for GLA
      // (gates σ(3) ≈ 0.95), about unit entries for Gated DeltaNet's normalised keys.
      initial_state = normal(initial_state.size(), rng);
      if (op == Op::gla)
        for (auto& e : initial_state) e *= 4.f;
    }
  }

  std::size_t token_elems() const { return static_cast<std::size_t>(T * kHeads * kDim); }
};

// [H, A, B] → [H, B, A]: Gated DeltaNet's state between phasor ([K][V]) and ggml ([V][K]).
std::vector<float> transpose_heads(const float* x) {
  std::vector<float> y(static_cast<std::size_t>(kHeads * kDim * kDim));
  for (std::int64_t h = 0; h < kHeads; ++h)
    for (std::int64_t a = 0; a < kDim; ++a)
      for (std::int64_t b = 0; b < kDim; ++b)
        y[static_cast<std::size_t>((h * kDim + b) * kDim + a)] =
            x[static_cast<std::size_t>((h * kDim + a) * kDim + b)];
  return y;
}

// ---- phasor
// -----------------------------------------------------------------------------------------

// The op on phasor's public API: forward (o and the final state), forward + backward (a training
// step: the forward, then every input's gradient; GLA's and Gated DeltaNet's chunk forward keeps
// its chunk states for the backward, as phasor's LibTorch layer does when it trains), or one
// decoded token with the state updated in place.
class PhasorRunner {
 public:
  PhasorRunner(const Problem& p, Impl impl, bool in_place_state)
      : p_(p), impl_(impl), in_place_(in_place_state), state_(p.initial_state.size()) {
    std::copy(p.initial_state.begin(), p.initial_state.end(), state_.data());
    const std::int64_t T = p.T;
    const std::size_t n = p.token_elems();
    o_.assign(n, 0.f);
    final_state_.assign(p.initial_state.size(), 0.f);
    dq_.assign(n, 0.f);
    dk_.assign(n, 0.f);
    dv_.assign(n, 0.f);
    dg_.assign(p.log_gate.size(), 0.f);
    dbeta_.assign(p.beta.size(), 0.f);
    lse_.assign(static_cast<std::size_t>(T * kHeads), 0.f);
  }

  void forward() {
    switch (p_.op) {
      case Problem::Op::gla:
        phasor::gla_forward(gla_params(), impl_, view(o_), state_out());
        break;
      case Problem::Op::gdn:
        phasor::gated_delta_rule_forward(gdn_params(), impl_, view(o_), state_out());
        break;
      case Problem::Op::fox:
        phasor::forgetting_attn_forward(fox_params(), impl_, view(o_));
        break;
    }
  }

  void forward_backward() {
    const TensorView d_o = view(p_.output_gradient);
    if (impl_ == Impl::chunk && p_.op != Problem::Op::fox && chunk_states_.empty()) {
      chunk_states_.assign(
          static_cast<std::size_t>(phasor::num_chunk_states(d_o, {}, 64) * kHeads * kDim * kDim),
          0.f);  // on the first (warm-up) call
      if (p_.op == Problem::Op::gdn) v_new_.assign(p_.token_elems(), 0.f);
    }
    switch (p_.op) {
      case Problem::Op::gla: {
        const phasor::GlaParams params = gla_params();
        phasor::gla_forward(params, impl_, view(o_), state_out(), chunk_states());
        phasor::GlaGrads grads;
        grads.dq = view(dq_);
        grads.dk = view(dk_);
        grads.dv = view(dv_);
        grads.dg = view(dg_);
        phasor::gla_backward(params, impl_, d_o, {}, grads, chunk_states());
        break;
      }
      case Problem::Op::gdn: {
        const phasor::GatedDeltaRuleParams params = gdn_params();
        // U_new kept beside the states, as the LibTorch layer trains (v_new).
        const TensorView v_new = v_new_.empty() ? TensorView{} : view(v_new_);
        phasor::gated_delta_rule_forward(params, impl_, view(o_), state_out(), chunk_states(),
                                         v_new);
        phasor::GatedDeltaRuleGrads grads;
        grads.dq = view(dq_);
        grads.dk = view(dk_);
        grads.dv = view(dv_);
        grads.dg = scalar_view(dg_);
        grads.dbeta = scalar_view(dbeta_);
        phasor::gated_delta_rule_backward(params, impl_, d_o, {}, grads, chunk_states(), v_new);
        break;
      }
      case Problem::Op::fox: {
        const phasor::ForgettingAttnParams params = fox_params();
        const TensorView lse = scalar_view(lse_);
        phasor::forgetting_attn_forward(params, impl_, view(o_), lse);
        phasor::ForgettingAttnGrads grads;
        grads.dq = view(dq_);
        grads.dk = view(dk_);
        grads.dv = view(dv_);
        grads.dg = scalar_view(dg_);
        phasor::forgetting_attn_backward(params, impl_, d_o, view(o_), lse, grads);
        break;
      }
    }
  }

  const std::vector<float>& output() const { return o_; }
  // The state after the last call, [H, K, V].
  const float* final_state() const { return in_place_ ? state_.data() : final_state_.data(); }

 private:
  TensorView view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {1, p_.T, kHeads, kDim});
  }
  TensorView scalar_view(const std::vector<float>& x) const {
    return TensorView::of(x.data(), {1, p_.T, kHeads});
  }
  TensorView state_in() const { return TensorView::of(state_.data(), {1, kHeads, kDim, kDim}); }
  // The chunk kernels' kept states (none for the other implementations).
  TensorView chunk_states() const {
    if (chunk_states_.empty()) return {};
    const auto count = static_cast<std::int64_t>(chunk_states_.size()) / (kHeads * kDim * kDim);
    return TensorView::of(chunk_states_.data(), {count, kHeads, kDim, kDim});
  }
  // Decoding writes the state over itself (phasor's in-place path), the forward into a buffer.
  TensorView state_out() const {
    return in_place_ ? state_in() : TensorView::of(final_state_.data(), {1, kHeads, kDim, kDim});
  }

  phasor::GlaParams gla_params() const {
    phasor::GlaParams params;
    params.q = view(p_.q);
    params.k = view(p_.k);
    params.v = view(p_.v);
    params.g = view(p_.log_gate);
    params.initial_state = state_in();
    params.scale = kScale;
    params.chunk_size = 64;
    return params;
  }
  phasor::GatedDeltaRuleParams gdn_params() const {
    phasor::GatedDeltaRuleParams params;
    params.q = view(p_.q);
    params.k = view(p_.k);
    params.v = view(p_.v);
    params.g = scalar_view(p_.log_gate);
    params.beta = scalar_view(p_.beta);
    params.initial_state = state_in();
    params.scale = kScale;                   // ggml's S_v^−1/2 (K = V)
    params.use_qk_l2norm_in_kernel = false;  // q and k are normalised beforehand, for both
    params.chunk_size = 64;
    return params;
  }
  phasor::ForgettingAttnParams fox_params() const {
    phasor::ForgettingAttnParams params;
    params.q = view(p_.q);
    params.k = view(p_.k);
    params.v = view(p_.v);
    params.g = scalar_view(p_.log_gate);
    params.scale = kScale;
    params.block_size = 64;
    return params;
  }

  const Problem& p_;
  Impl impl_;
  bool in_place_;
  AlignedFloats state_;  // initial state; also the final one when in place
  std::vector<float> o_, final_state_, dq_, dk_, dv_, dg_, dbeta_, lse_, chunk_states_, v_new_;
};

// ---- ggml
// -------------------------------------------------------------------------------------------

// The op as a one-node ggml graph on the CPU backend: inputs copied in once, the graph built and
// planned once with a persistent thread pool, then compute() per call.
class GgmlRunner {
 public:
  GgmlRunner(const Problem& p, int threads) : p_(p) {
    const std::int64_t T = p.T, H = kHeads, D = kDim;
    const std::size_t token_bytes = p.token_elems() * sizeof(float);
    const std::size_t state_bytes = p.initial_state.size() * sizeof(float);
    // Inputs, the result (outputs + state) and the FoX mask; ggml rounds each tensor up a little.
    std::size_t data_bytes = 6 * token_bytes + 2 * state_bytes;
    if (p.op == Problem::Op::fox)
      data_bytes += static_cast<std::size_t>(T) * static_cast<std::size_t>(T) *
                    static_cast<std::size_t>(H) * sizeof(ggml_fp16_t);
    ggml_init_params init{};
    init.mem_size = data_bytes + ggml_graph_overhead() + 64 * ggml_tensor_overhead() + (1 << 20);
    init.mem_buffer = nullptr;
    init.no_alloc = false;
    ctx_ = ggml_init(init);
    if (!ctx_)
      throw std::runtime_error("ggml_init failed (" + std::to_string(init.mem_size) + " B)");

    // [D, H, T] tensors: row-major [T, H, D], phasor's [1, T, H, D] byte for byte.
    auto tokens = [&](const std::vector<float>& x) {
      ggml_tensor* t = ggml_new_tensor_3d(ctx_, GGML_TYPE_F32, D, H, T);
      std::memcpy(t->data, x.data(), token_bytes);
      return t;
    };
    auto per_head = [&](const std::vector<float>& x) {  // [1, H, T]
      ggml_tensor* t = ggml_new_tensor_3d(ctx_, GGML_TYPE_F32, 1, H, T);
      std::memcpy(t->data, x.data(), x.size() * sizeof(float));
      return t;
    };

    switch (p.op) {
      case Problem::Op::gla: {
        std::vector<float> gate(p.log_gate.size());  // ggml multiplies by the gate itself
        for (std::size_t i = 0; i < gate.size(); ++i) gate[i] = std::exp(p.log_gate[i]);
        ggml_tensor* state = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, D * D * H, 1);
        std::memcpy(state->data, p.initial_state.data(), state_bytes);  // [H][K][V], as phasor
        result_ = ggml_gated_linear_attn(ctx_, tokens(p.k), tokens(p.v), tokens(p.q), tokens(gate),
                                         state, static_cast<float>(kScale));
        break;
      }
      case Problem::Op::gdn: {
        ggml_tensor* state = ggml_new_tensor_4d(ctx_, GGML_TYPE_F32, D, D, H, 1);
        const std::vector<float> transposed = transpose_heads(p.initial_state.data());
        std::memcpy(state->data, transposed.data(), state_bytes);  // [H][V][K]
        // One sequence: ne[3] = 1. K = 1: keep only the final state.
        result_ = ggml_gated_delta_net(ctx_, tokens(p.q), tokens(p.k), tokens(p.v),
                                       per_head(p.log_gate), per_head(p.beta), state, 1);
        break;
      }
      case Problem::Op::fox: {
        // flash_attn_ext wants [D, T, H]: permuted views of the [D, H, T] tensors.
        auto heads_outer = [&](ggml_tensor* t) { return ggml_permute(ctx_, t, 0, 2, 1, 3); };
        ggml_tensor* mask = ggml_new_tensor_3d(ctx_, GGML_TYPE_F16, T, T, H);
        fill_forget_mask(p.log_gate, T, static_cast<ggml_fp16_t*>(mask->data));
        result_ = ggml_flash_attn_ext(ctx_, heads_outer(tokens(p.q)), heads_outer(tokens(p.k)),
                                      heads_outer(tokens(p.v)), mask, static_cast<float>(kScale),
                                      0.f, 0.f);
        ggml_flash_attn_ext_set_prec(result_, GGML_PREC_F32);
        break;
      }
    }
    graph_ = ggml_new_graph(ctx_);
    ggml_build_forward_expand(graph_, result_);

    ggml_threadpool_params pool_params = ggml_threadpool_params_default(threads);
    pool_ = ggml_threadpool_new(&pool_params);
    if (!pool_) throw std::runtime_error("ggml_threadpool_new failed");
    plan_ = ggml_graph_plan(graph_, threads, pool_);
    work_.resize(plan_.work_size);
    plan_.work_data = work_.empty() ? nullptr : work_.data();
  }
  ~GgmlRunner() {
    if (pool_) ggml_threadpool_free(pool_);
    if (ctx_) ggml_free(ctx_);
  }
  GgmlRunner(const GgmlRunner&) = delete;
  GgmlRunner& operator=(const GgmlRunner&) = delete;

  void compute() {
    if (ggml_graph_compute(graph_, &plan_) != GGML_STATUS_SUCCESS)
      throw std::runtime_error("ggml_graph_compute failed");
  }

  // o, [T, H, V] (every op's result starts with it).
  const float* output() const { return static_cast<const float*>(result_->data); }
  // The final state in phasor's layout [H, K, V] (GLA, Gated DeltaNet).
  std::vector<float> final_state() const {
    const float* state = output() + p_.token_elems();
    if (p_.op == Problem::Op::gdn) return transpose_heads(state);
    return std::vector<float>(state, state + p_.initial_state.size());
  }

 private:
  // mask[h][i][j] = Σ_{s ∈ (j, i]} g_s for j ≤ i (summed in float64, then rounded to float16),
  // −inf above the diagonal. Gates are [T, H].
  static void fill_forget_mask(const std::vector<float>& log_gate, std::int64_t T,
                               ggml_fp16_t* mask) {
    std::vector<float> row(static_cast<std::size_t>(T));
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        double sum = 0.0;
        row[static_cast<std::size_t>(i)] = 0.f;
        for (std::int64_t j = i - 1; j >= 0; --j) {
          sum += log_gate[static_cast<std::size_t>((j + 1) * kHeads + h)];
          row[static_cast<std::size_t>(j)] = static_cast<float>(sum);
        }
        std::fill(row.begin() + i + 1, row.end(), -INFINITY);
        ggml_fp32_to_fp16_row(row.data(), mask + (h * T + i) * T, T);
      }
  }

  const Problem& p_;
  ggml_context* ctx_ = nullptr;
  ggml_tensor* result_ = nullptr;
  ggml_cgraph* graph_ = nullptr;
  ggml_threadpool* pool_ = nullptr;
  ggml_cplan plan_{};
  std::vector<std::uint8_t> work_;
};

// ---- Timing
// -----------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Timing {
  double median_s;              // per call
  std::vector<double> samples;  // per call, one per batch
  std::int64_t batch;           // calls per sample
};

// Warm-up (at least one call and 0.2 s), then samples of `batch` calls each (batch sized to about
// 10 ms, so that µs calls are timed in bulk) until min_time seconds and at least 3 samples (5
// when a sample is short).
Timing time_calls(const std::function<void()>& call, double min_time) {
  Clock::time_point start = Clock::now();
  std::int64_t warm_calls = 0;
  do {
    call();
    ++warm_calls;
  } while (seconds_since(start) < 0.2);
  const double per_call = seconds_since(start) / static_cast<double>(warm_calls);
  Timing timing;
  timing.batch = std::max<std::int64_t>(1, static_cast<std::int64_t>(0.01 / per_call));
  const std::size_t min_samples = per_call > 0.5 ? 3 : 5;
  double total = 0.0;
  while (total < min_time || timing.samples.size() < min_samples) {
    start = Clock::now();
    for (std::int64_t c = 0; c < timing.batch; ++c) call();
    const double elapsed = seconds_since(start);
    total += elapsed;
    timing.samples.push_back(elapsed / static_cast<double>(timing.batch));
    if (timing.samples.size() >= 1000) break;
  }
  std::vector<double> sorted = timing.samples;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  timing.median_s = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  return timing;
}

// ---- Checking
// -----------------------------------------------------------------------------------------

// max|a − b| / max|b| over n elements: the error relative to the reference's largest magnitude,
// so that elements near zero do not dominate. Infinite if any is not finite, or if the reference
// is all zeros (agreeing on zeros would prove nothing).
double max_relative_error(const float* a, const float* b, std::size_t n) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0.0 ? diff / scale : INFINITY;
}

Problem::Op op_from_string(const std::string& name) {
  if (name == "gla") return Problem::Op::gla;
  if (name == "gdn") return Problem::Op::gdn;
  if (name == "fox") return Problem::Op::fox;
  throw std::invalid_argument("op: expected gla, gdn or fox, got '" + name + "'");
}
const char* to_string(Problem::Op op) {
  return op == Problem::Op::gla ? "gla" : op == Problem::Op::gdn ? "gdn" : "fox";
}

// Runs phasor (impl) and ggml on the same problem and prints one JSON line per compared
// quantity; returns false if any error exceeds `tolerance`.
bool check_one(const char* label, const Problem& p, Impl impl, bool decode, int threads,
               double tolerance) {
  PhasorRunner ours(p, impl, /*in_place_state=*/decode);
  ours.forward();
  GgmlRunner theirs(p, threads);
  theirs.compute();
  struct Compared {
    const char* what;
    double error;
  };
  std::vector<Compared> compared = {
      {"output", max_relative_error(ours.output().data(), theirs.output(), p.token_elems())}};
  if (p.op != Problem::Op::fox) {
    const std::vector<float> state = theirs.final_state();
    compared.push_back(
        {"final_state", max_relative_error(ours.final_state(), state.data(), state.size())});
  }
  bool ok = true;
  for (const Compared& c : compared) {
    const bool pass = c.error <= tolerance;
    ok = ok && pass;
    json line = {{"check", label},
                 {"op", to_string(p.op)},
                 {"impl", phasor::to_string(impl)},
                 {"T", p.T},
                 {"compared", c.what},
                 {"max_relative_error", c.error},
                 {"tolerance", tolerance},
                 {"pass", pass}};
    std::cout << line.dump() << std::endl;
  }
  return ok;
}

int run_check(std::int64_t T, int threads) {
  phasor::set_num_threads(threads);
  using Op = Problem::Op;
  // float32 rounding through T-token recurrences and differently ordered sums: ~10⁻⁶ in
  // practice; 10⁻⁴ leaves room yet catches any difference of semantics (those are O(1)).
  const double f32_tolerance = 1e-4;
  // FoX with realistic gates: ggml's float16 mask (see the top of the file); 1.5·10⁻⁴ measured
  // at T = 1024.
  const double f16_mask_tolerance = 2e-3;
  bool ok = true;
  for (Op op : {Op::gla, Op::gdn}) {
    const Problem prefill(op, T, /*random_state=*/true);
    for (Impl impl : {Impl::chunk, Impl::recurrent})
      ok &= check_one("forward", prefill, impl, false, threads, f32_tolerance);
    const Problem token(op, 1, /*random_state=*/true);
    ok &= check_one("decode", token, Impl::recurrent, true, threads, f32_tolerance);
  }
  ok &= check_one("forward/f16_exact_gates", Problem(Op::fox, T, false, /*f16_exact_gates=*/true),
                  Impl::chunk, false, threads, f32_tolerance);
  ok &= check_one("forward/realistic_gates", Problem(Op::fox, T, false), Impl::chunk, false,
                  threads, f16_mask_tolerance);
  if (!ok)
    std::cerr << "ggml_compare check: phasor and ggml DISAGREE beyond the tolerance (above): the "
                 "benchmark would compare two different functions\n";
  return ok ? 0 : 1;
}

int run_measure(const std::string& library, Problem::Op op, const std::string& mode,
                const std::string& impl_name, std::int64_t T, int threads, double min_time,
                float gate_mean) {
  const bool decode = mode == "decode";
  if (decode && T != 1) throw std::invalid_argument("mode decode: T must be 1");
  if (decode && op == Problem::Op::fox) throw std::invalid_argument("mode decode: gla or gdn only");
  const Problem p(op, T, /*random_state=*/decode, /*f16_exact_gates=*/false, gate_mean);
  const Impl impl = decode ? Impl::recurrent : phasor::impl_from_string(impl_name);
  json line = {{"library", library}, {"op", to_string(op)},   {"mode", mode}, {"T", T},
               {"threads", threads}, {"gate_mean", gate_mean}};
  Timing timing;
  if (library == "phasor") {
    phasor::set_num_threads(threads);
    PhasorRunner runner(p, impl, /*in_place_state=*/decode);
    if (mode == "forward" || decode) {
      timing = time_calls([&] { runner.forward(); }, min_time);
    } else if (mode == "fwd_bwd") {
      timing = time_calls([&] { runner.forward_backward(); }, min_time);
    } else {
      throw std::invalid_argument("mode: expected forward, fwd_bwd or decode");
    }
    line["impl"] = phasor::to_string(impl);
  } else if (library == "ggml") {
    if (mode == "fwd_bwd") throw std::invalid_argument("ggml: no backward of these ops");
    GgmlRunner runner(p, threads);
    timing = time_calls([&] { runner.compute(); }, min_time);
    line["impl"] = op == Problem::Op::fox   ? "flash_attn_ext"
                   : op == Problem::Op::gla ? "gated_linear_attn"
                                            : "gated_delta_net";
  } else {
    throw std::invalid_argument("library: expected phasor or ggml");
  }
  line["seconds"] = timing.median_s;
  line["tokens_per_s"] = static_cast<double>(T) / timing.median_s;
  line["us_per_call"] = timing.median_s * 1e6;
  line["samples"] = timing.samples.size();
  line["batch"] = timing.batch;
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"phasor vs ggml on the CPU: one measurement per process (bench/ggml-compare.sh)"};
  app.require_subcommand(1);

  std::int64_t check_T = 1024;
  int check_threads = 2;
  CLI::App* check = app.add_subcommand("check", "check that both libraries compute the same");
  check->add_option("--T", check_T, "tokens")->capture_default_str();
  check->add_option("--threads", check_threads, "threads")->capture_default_str();

  std::string library, op, mode = "forward", impl = "chunk";
  std::int64_t T = 1024;
  int threads = 2;
  double min_time = 1.0;
  float gate_mean = 3.f;
  CLI::App* measure = app.add_subcommand("measure", "time one op of one library");
  measure->add_option("--library", library)->required()->check(CLI::IsMember({"phasor", "ggml"}));
  measure->add_option("--op", op)->required()->check(CLI::IsMember({"gla", "gdn", "fox"}));
  measure->add_option("--mode", mode)
      ->check(CLI::IsMember({"forward", "fwd_bwd", "decode"}))
      ->capture_default_str();
  measure->add_option("--impl", impl, "phasor's implementation (ignored for ggml)")
      ->check(CLI::IsMember({"chunk", "recurrent"}))
      ->capture_default_str();
  measure->add_option("--T", T, "tokens (1 for decode)")->capture_default_str();
  measure->add_option("--threads", threads)->capture_default_str();
  measure->add_option("--min-time", min_time, "seconds of timed calls")->capture_default_str();
  measure
      ->add_option("--gate-mean", gate_mean,
                   "log gates log σ(M + N(0, 1)); smaller M, stronger gates")
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (check->parsed()) return run_check(check_T, check_threads);
    return run_measure(library, op_from_string(op), mode, impl, T, threads, min_time, gate_mean);
  } catch (const std::exception& e) {
    std::cerr << "ggml_compare: " << e.what() << "\n";
    return 2;
  }
}
