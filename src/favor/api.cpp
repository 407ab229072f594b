// FAVOR+ ops: argument validation and dispatch to the reference and optimized kernels.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <cmath>
#include <string>

#include "common/check.h"
#include "common/dispatch.h"
#include "favor/favor.h"
#include "favor/kernels.h"
#include "phasor/favor.h"
#include "phasor/ops.h"

namespace phasor {

const char* to_string(FavorMatrixKind kind) {
  switch (kind) {
    case FavorMatrixKind::orthogonal_chi:
      return "orthogonal_chi";
    case FavorMatrixKind::orthogonal_fixed:
      return "orthogonal_fixed";
    case FavorMatrixKind::iid:
      return "iid";
  }
  return "?";
}

namespace {

using detail::check_owned_output;

using detail::favor::AttentionProblem;
using detail::favor::FeatureProblem;
using detail::favor::Shape;

// w: [m, d] or [H, m, d] with m ≥ 1; d must equal `d` (from x or q).
void check_w(const std::string& op, const std::string& name, const TensorView& w, std::int64_t H,
             std::int64_t d, bool output = false, Device device = Device::cpu) {
  if (!w.defined() || (w.rank != 2 && w.rank != 3))
    detail::fail(op, name,
                 "[m, d] (shared) or [H, m, d] (per head) with d = " + std::to_string(d) +
                     ", H = " + std::to_string(H),
                 w.shape_string());
  const std::int64_t m = w.size(w.rank - 2);
  if (m < 1) detail::fail(op, name, "at least one feature (m ≥ 1)", w.shape_string());
  if (w.rank == 2) {
    if (output)
      check_owned_output(op, name, w, {{m, "m"}, {d, "d"}}, device);
    else
      detail::check_float_tensor(op, name, w, {{m, "m"}, {d, "d"}}, device);
  } else {
    if (output)
      check_owned_output(op, name, w, {{H, "H"}, {m, "m"}, {d, "d"}}, device);
    else
      detail::check_float_tensor(op, name, w, {{H, "H"}, {m, "m"}, {d, "d"}}, device);
  }
}

// A gradient of w: exactly w's shape.
void check_w_grad(const std::string& op, const std::string& name, const TensorView& dw,
                  const Shape& sh, Device device) {
  if (sh.w_per_head)
    check_owned_output(op, name, dw, {{sh.H, "H (as w)"}, {sh.m, "m (as w)"}, {sh.d, "d (as w)"}},
                       device);
  else
    check_owned_output(op, name, dw, {{sh.m, "m (as w)"}, {sh.d, "d (as w)"}}, device);
}

// The shapes, and the call's device (that of x / q). The value checks (cu_seqlens's offsets) run
// in run_on_device, on that device.
Shape make_shape(const std::string& op, const char* x_name, const TensorView& x,
                 const TensorView& w, const TensorView& cu_seqlens, Device& device) {
  device = detail::call_device(op, x_name, x, /*gpu_capable=*/true);
  detail::check_float_rank(op, x_name, x, 4, "[B, T, H, d]", device);
  Shape sh;
  sh.H = x.size(2);
  sh.d = x.size(3);
  if (sh.d < 1) detail::fail(op, x_name, "a head dimension d ≥ 1", x.shape_string());
  check_w(op, "w", w, sh.H, sh.d, false, device);
  sh.w_per_head = w.rank == 3;
  sh.m = w.size(w.rank - 2);
  sh.sequences = detail::sequences(op, cu_seqlens, x.size(0), x.size(1), device);
  return sh;
}

detail::ValueChecks offset_checks(const Shape& sh) {
  detail::ValueChecks checks;
  checks.sequences = sh.sequences;
  return checks;
}

FeatureProblem validate_features(const std::string& op, const FavorFeatureParams& params,
                                 Device& device) {
  FeatureProblem p;
  p.shape = make_shape(op, "x", params.x, params.w, params.cu_seqlens, device);
  p.x = params.x;
  p.w = params.w;
  p.stabilizer = params.stabilizer;
  return p;
}

AttentionProblem validate_attention(const std::string& op, const FavorAttentionParams& params,
                                    Impl impl, Device& device) {
  AttentionProblem p;
  p.shape = make_shape(op, "q", params.q, params.w, params.cu_seqlens, device);
  const std::int64_t B = params.q.size(0), T = params.q.size(1), H = p.shape.H, d = p.shape.d;
  detail::check_float_tensor(op, "k", params.k,
                             {{B, "B (as q)"}, {T, "T (as q)"}, {H, "H (as q)"}, {d, "d (as q)"}},
                             device);
  detail::check_float_rank(op, "v", params.v, 4, "[B, T, H, V]", device);
  p.V = params.v.size(3);
  detail::check_float_tensor(
      op, "v", params.v, {{B, "B (as q)"}, {T, "T (as q)"}, {H, "H (as q)"}, {p.V, "V"}}, device);
  const double scale = detail::resolve_scale(op, params.scale, d);
  if (!(scale > 0))
    detail::fail(op, "scale", "a finite positive softmax scale", std::to_string(scale));
  detail::check_positive(op, "chunk_size", params.chunk_size);
  p.q = params.q;
  p.k = params.k;
  p.v = params.v;
  p.w = params.w;
  p.cu_seqlens = params.cu_seqlens;
  p.causal = params.causal;
  p.input_scale = std::sqrt(scale);  // q̂ = s q, k̂ = s k: q̂ᵀk̂ = scale · qᵀk
  p.chunk_size = params.chunk_size;
  p.impl = impl == Impl::recurrent ? Impl::recurrent : Impl::chunk;
  // The causal attention on a GPU device runs GLA's GPU kernels on the m features: their chunk
  // sizes (chunk) and key-dimension limit (recurrent) apply.
  if (device != Device::cpu && p.causal && impl != Impl::reference) {
    if (p.impl == Impl::chunk && p.chunk_size != 16 && p.chunk_size != 32 && p.chunk_size != 64)
      detail::fail(op, "chunk_size", "16, 32 or 64 for the causal attention on a GPU device",
                   std::to_string(p.chunk_size));
    if (p.impl == Impl::recurrent && p.shape.m > 256)
      detail::fail(op, "w",
                   "at most 256 features (m) for the recurrent causal attention on a GPU device",
                   "m = " + std::to_string(p.shape.m));
  }
  return p;
}

}  // namespace

void favor_random_matrix(FavorMatrixKind kind, std::uint64_t seed, const TensorView& w) {
  const std::string op = "favor_random_matrix";
  if (!w.defined() || (w.rank != 2 && w.rank != 3))
    detail::fail(op, "w", "[m, d] or [H, m, d]", w.shape_string());
  if (kind != FavorMatrixKind::orthogonal_chi && kind != FavorMatrixKind::orthogonal_fixed &&
      kind != FavorMatrixKind::iid)
    detail::fail(op, "kind", "orthogonal_chi, orthogonal_fixed or iid",
                 std::to_string(static_cast<int>(kind)));
  const std::int64_t m = w.size(w.rank - 2), d = w.size(w.rank - 1);
  if (m < 1 || d < 1) detail::fail(op, "w", "m ≥ 1 rows and d ≥ 1 columns", w.shape_string());
  check_w(op, "w", w, w.rank == 3 ? w.size(0) : 1, d, /*output=*/true);
  detail::favor::random_matrix(kind, seed, w);
}

void favor_features_forward(const FavorFeatureParams& params, Impl impl, const TensorView& phi) {
  const std::string op = op_name(Op::favor_features, impl);
  Device device;
  const FeatureProblem p = validate_features(op, params, device);
  const std::int64_t B = params.x.size(0), T = params.x.size(1);
  check_owned_output(op, "phi", phi,
                     {{B, "B"}, {T, "T"}, {p.shape.H, "H"}, {p.shape.m, "m (as w)"}}, device);
  detail::run_on_device(
      op, Op::favor_features, impl, device, offset_checks(p.shape),
      [&] {
        if (impl == Impl::reference)
          detail::favor::reference_features_forward(p, phi);
        else
          detail::favor::features_forward(p, phi);
      },
      [&] { PHASOR_ON_GPU(device, favor::features_forward(p, phi)); });
}

void favor_features_backward(const FavorFeatureParams& params, Impl impl, const TensorView& d_phi,
                             const TensorView& dx, const TensorView& dw) {
  const std::string op = op_name(Op::favor_features, impl);
  Device device;
  const FeatureProblem p = validate_features(op, params, device);
  const std::int64_t B = params.x.size(0), T = params.x.size(1), H = p.shape.H;
  detail::check_float_tensor(op, "d_phi", d_phi,
                             {{B, "B"}, {T, "T"}, {H, "H"}, {p.shape.m, "m (as w)"}}, device);
  if (dx.defined())
    check_owned_output(op, "dx", dx, {{B, "B"}, {T, "T"}, {H, "H"}, {p.shape.d, "d"}}, device);
  if (dw.defined()) check_w_grad(op, "dw", dw, p.shape, device);
  detail::run_on_device(
      op, Op::favor_features, impl, device, offset_checks(p.shape),
      [&] {
        if (impl == Impl::reference)
          detail::favor::reference_features_backward(p, d_phi, dx, dw);
        else
          detail::favor::features_backward(p, d_phi, dx, dw);
      },
      [&] { PHASOR_ON_GPU(device, favor::features_backward(p, d_phi, dx, dw)); });
}

void favor_attention_forward(const FavorAttentionParams& params, Impl impl, const TensorView& o) {
  const std::string op = op_name(Op::favor_attention, impl);
  Device device;
  const AttentionProblem p = validate_attention(op, params, impl, device);
  check_owned_output(
      op, "o", o, {{params.q.size(0), "B"}, {params.q.size(1), "T"}, {p.shape.H, "H"}, {p.V, "V"}},
      device);
  detail::run_on_device(
      op, Op::favor_attention, impl, device, offset_checks(p.shape),
      [&] {
        if (impl == Impl::reference)
          detail::favor::reference_attention_forward(p, o);
        else
          detail::favor::attention_forward(p, o);
      },
      [&] { PHASOR_ON_GPU(device, favor::attention_forward(p, o)); });
}

void favor_attention_backward(const FavorAttentionParams& params, Impl impl, const TensorView& d_o,
                              const FavorAttentionGrads& grads) {
  const std::string op = op_name(Op::favor_attention, impl);
  Device device;
  const AttentionProblem p = validate_attention(op, params, impl, device);
  const std::int64_t B = params.q.size(0), T = params.q.size(1), H = p.shape.H, d = p.shape.d;
  detail::check_float_tensor(op, "d_o", d_o, {{B, "B"}, {T, "T"}, {H, "H"}, {p.V, "V"}}, device);
  if (grads.dq.defined())
    check_owned_output(op, "dq", grads.dq, {{B, "B"}, {T, "T"}, {H, "H"}, {d, "d"}}, device);
  if (grads.dk.defined())
    check_owned_output(op, "dk", grads.dk, {{B, "B"}, {T, "T"}, {H, "H"}, {d, "d"}}, device);
  if (grads.dv.defined())
    check_owned_output(op, "dv", grads.dv, {{B, "B"}, {T, "T"}, {H, "H"}, {p.V, "V"}}, device);
  if (grads.dw.defined()) check_w_grad(op, "dw", grads.dw, p.shape, device);
  detail::run_on_device(
      op, Op::favor_attention, impl, device, offset_checks(p.shape),
      [&] {
        if (impl == Impl::reference)
          detail::favor::reference_attention_backward(p, d_o, grads);
        else
          detail::favor::attention_backward(p, d_o, grads);
      },
      [&] { PHASOR_ON_GPU(device, favor::attention_backward(p, d_o, grads)); });
}

}  // namespace phasor
