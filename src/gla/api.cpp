// GLA: argument validation and dispatch to the reference, recurrent and chunk kernels.
//
// Every check happens here, before any kernel runs, so a bad call never writes to an output.
#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/rotation.h"
#include "gla/kernels.h"
#include "phasor/gla.h"

namespace phasor {
namespace {

using detail::gla::Problem;

// The fla name of each implementation, used in every error message.
std::string op_name(Impl impl) {
  switch (impl) {
    case Impl::reference:
      return "gla_reference";
    case Impl::recurrent:
      return "fused_recurrent_gla";
    case Impl::chunk:
      return "chunk_gla";
  }
  return "gla";
}

// True when every element of g is ≤ 0 (−inf included; NaN and positive values fail). A plain
// strided scan: detail::check_log_gates decodes a multi-index per element, which costs as much as
// the chunk kernel itself on large inputs, so it only runs to name the offending element.
template <class T>
bool all_log_gates(const TensorView& g) {
  const T* data = static_cast<const T*>(g.data);
  bool ok = true;
  for (std::int64_t b = 0; b < g.size(0); ++b)
    for (std::int64_t t = 0; t < g.size(1); ++t)
      for (std::int64_t h = 0; h < g.size(2); ++h) {
        const T* row = data + b * g.stride(0) + t * g.stride(1) + h * g.stride(2);
        for (std::int64_t k = 0; k < g.size(3); ++k) ok &= row[k * g.stride(3)] <= T(0);
      }
  return ok;
}

// Checks every input of `params` against q's dimensions and resolves sequences and options.
Problem validate_inputs(const std::string& op, const GlaParams& params, Impl impl) {
  detail::check_float_rank(op, "q", params.q, 4, "[B, T, H, K]");
  const std::int64_t B = params.q.size(0), T = params.q.size(1), H = params.q.size(2),
                     K = params.q.size(3);
  detail::check_float_tensor(op, "k", params.k, {{B, "B"}, {T, "T"}, {H, "H"}, {K, "K"}});
  detail::check_float_rank(op, "v", params.v, 4, "[B, T, H, V]");
  const std::int64_t V = params.v.size(3);
  detail::check_float_tensor(op, "v", params.v, {{B, "B"}, {T, "T"}, {H, "H"}, {V, "V"}});
  detail::check_float_tensor(op, "g", params.g, {{B, "B"}, {T, "T"}, {H, "H"}, {K, "K"}});

  Problem p;
  p.q = params.q;
  p.k = params.k;
  p.v = params.v;
  p.g = params.g;
  p.sequences = detail::sequences(op, params.cu_seqlens, B, T);
  p.H = H;
  p.K = K;
  p.V = V;
  const std::int64_t N = p.num_sequences();
  if (params.initial_state.defined())
    detail::check_float_tensor(op, "initial_state", params.initial_state,
                               {{N, "N"}, {H, "H"}, {K, "K"}, {V, "V"}});
  p.initial_state = params.initial_state;
  detail::check_theta(op, params.theta, B, T, H, K);
  p.theta = params.theta;
  p.rotary_layout = params.rotary_layout;
  p.scale = detail::resolve_scale(op, params.scale, K);
  // The recurrent kernel uses chunk_size as its backward checkpoint interval; only the
  // reference ignores it.
  if (impl != Impl::reference) detail::check_positive(op, "chunk_size", params.chunk_size);
  // A chunk longer than the batch is the whole sequence; clamping keeps the kernels' offset
  // arithmetic (offset + chunk_size) far from overflow for huge values.
  p.chunk_size = std::max<std::int64_t>(1, std::min<std::int64_t>(params.chunk_size, T));
  const bool gates_ok = params.g.dtype == DType::float32 ? all_log_gates<float>(params.g)
                                                         : all_log_gates<double>(params.g);
  if (!gates_ok) detail::check_log_gates(op, "g", params.g);
  return p;
}

}  // namespace

void gla_forward(const GlaParams& params, Impl impl, const TensorView& o,
                 const TensorView& final_state) {
  const std::string op = op_name(impl);
  const Problem p = validate_inputs(op, params, impl);
  const std::int64_t B = params.q.size(0), T = params.q.size(1);
  detail::check_output(op, "o", o, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.V, "V"}});
  if (final_state.defined())
    detail::check_output(op, "final_state", final_state,
                         {{p.num_sequences(), "N"}, {p.H, "H"}, {p.K, "K"}, {p.V, "V"}});
  switch (impl) {
    case Impl::reference:
      detail::gla::reference_forward(p, o, final_state);
      return;
    case Impl::recurrent:
      detail::gla::recurrent_forward(p, o, final_state);
      return;
    case Impl::chunk:
      detail::gla::chunk_forward(p, o, final_state);
      return;
  }
}

void gla_backward(const GlaParams& params, Impl impl, const TensorView& d_o,
                  const TensorView& d_final_state, const GlaGrads& grads) {
  const std::string op = op_name(impl);
  const Problem p = validate_inputs(op, params, impl);
  const std::int64_t B = params.q.size(0), T = params.q.size(1), N = p.num_sequences();
  detail::check_float_tensor(op, "d_o", d_o, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.V, "V"}});
  if (d_final_state.defined())
    detail::check_float_tensor(op, "d_final_state", d_final_state,
                               {{N, "N"}, {p.H, "H"}, {p.K, "K"}, {p.V, "V"}});
  if (grads.dq.defined())
    detail::check_output(op, "dq", grads.dq, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.dk.defined())
    detail::check_output(op, "dk", grads.dk, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.dv.defined())
    detail::check_output(op, "dv", grads.dv, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.V, "V"}});
  if (grads.dg.defined())
    detail::check_output(op, "dg", grads.dg, {{B, "B"}, {T, "T"}, {p.H, "H"}, {p.K, "K"}});
  if (grads.dh0.defined()) {
    if (!params.initial_state.defined())
      detail::fail(op, "dh0", "initial_state to be given (dh0 is its gradient)",
                   "dh0 requested without initial_state");
    detail::check_output(op, "dh0", grads.dh0, {{N, "N"}, {p.H, "H"}, {p.K, "K"}, {p.V, "V"}});
  }
  detail::check_dtheta(op, grads.dtheta, params.theta);
  switch (impl) {
    case Impl::reference:
      detail::gla::reference_backward(p, d_o, d_final_state, grads);
      return;
    case Impl::recurrent:
      detail::gla::recurrent_backward(p, d_o, d_final_state, grads);
      return;
    case Impl::chunk:
      detail::gla::chunk_backward(p, d_o, d_final_state, grads);
      return;
  }
}

}  // namespace phasor
