// Internal to the LibTorch layer (src/torch/*.cpp): at::Tensor → TensorView conversion, argument
// checks in the core's message format, and autograd helpers shared by every op's Function.
#pragma once

#include <torch/autograd.h>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "phasor/common.h"
#include "phasor/device.h"
#include "phasor/ops.h"
#include "phasor/torch.h"

namespace phasor::torch_detail {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- names --------------------------------------------------------------------------------------

// The op name used in messages: the core's (phasor/ops.h), fla's name for the implementation.
inline std::string gla_op_name(Impl impl) {
  return op_name(Op::gla, impl);
}
inline std::string gated_delta_rule_op_name(Impl impl) {
  return op_name(Op::gated_delta_rule, impl);
}
inline std::string forgetting_attn_op_name(Impl impl) {
  return op_name(Op::forgetting_attn, impl);
}

// "[2, 3, 4]": how messages print a shape, the tensor's own or an expected one.
inline std::string shape_string(at::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}
inline std::string shape_of(const at::Tensor& t) {
  return shape_string(t.sizes());
}

// ---- torch-side checks --------------------------------------------------------------------------
// Messages follow the core's format: "<op>: argument '<name>': expected <...>, got <...>".

[[noreturn]] inline void fail(const std::string& op, const std::string& name,
                              const std::string& expected, const std::string& got) {
  TORCH_CHECK(false, op, ": argument '", name, "': expected ", expected, ", got ", got);
  std::abort();  // unreachable: TORCH_CHECK(false, ...) always throws
}

inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// A defined, dense, CPU tensor of the given rank. `layout` documents the expected dimensions.
inline void check_tensor(const std::string& op, const std::string& name, const at::Tensor& t,
                         int rank, const char* layout) {
  if (!t.defined()) fail(op, name, std::string("a tensor ") + layout, "an undefined tensor");
#if PHASOR_TORCH_CUDA
  if (!t.device().is_cpu() && !t.device().is_cuda())
    fail(op, name, "a tensor on the cpu or a CUDA device", "a tensor on " + t.device().str());
#else
  if (!t.device().is_cpu())
    fail(op, name,
         "a tensor on the cpu (this LibTorch has no CUDA; for the GPU kernels see "
         "phasor::set_compute_device)",
         "a tensor on " + t.device().str());
#endif
  if (t.layout() != at::kStrided) fail(op, name, "a dense (strided) tensor", "a sparse tensor");
  if (t.dim() != rank)
    fail(op, name, std::to_string(rank) + "-D tensor " + layout,
         std::to_string(t.dim()) + "-D tensor of shape " + shape_of(t));
}

inline void check_float(const std::string& op, const std::string& name, const at::Tensor& t,
                        int rank, const char* layout) {
  check_tensor(op, name, t, rank, layout);
  if (!is_float_dtype(t.scalar_type()))
    fail(op, name, "a floating dtype (float32, float64, float16 or bfloat16)",
         std::string("dtype ") + c10::toString(t.scalar_type()));
}

// A floating tensor of either of two ranks (e.g. angles per head or shared by heads); a tensor of
// any other rank is reported against `rank_a`, with `layout` naming both forms.
inline void check_float_either_rank(const std::string& op, const std::string& name,
                                    const at::Tensor& t, int rank_a, int rank_b,
                                    const char* layout) {
  check_float(op, name, t, t.defined() && t.dim() == rank_b ? rank_b : rank_a, layout);
}

inline void check_optional_float(const std::string& op, const std::string& name,
                                 const c10::optional<at::Tensor>& t, int rank, const char* layout) {
  if (t.has_value() && t->defined()) check_float(op, name, *t, rank, layout);
}

inline void check_cu_seqlens(const std::string& op, const c10::optional<at::Tensor>& cu) {
  if (!cu.has_value() || !cu->defined()) return;
  check_tensor(op, "cu_seqlens", *cu, 1, "[N + 1]");
  if (cu->scalar_type() != at::kInt && cu->scalar_type() != at::kLong)
    fail(op, "cu_seqlens", "dtype int32 or int64",
         std::string("dtype ") + c10::toString(cu->scalar_type()));
}

// ---- conversion ---------------------------------------------------------------------------------

// The one place an at::Tensor becomes a TensorView: same memory, sizes, strides (in elements, as
// in torch), dtype and device. Callers have checked device, layout, rank and dtype. float16 and
// bfloat16 tensors go to the core as they are (it converts them on load and computes in float32).
inline TensorView view_of(const at::Tensor& t) {
  TensorView v;
  if (!t.defined()) return v;  // absent optional
  TORCH_INTERNAL_ASSERT(t.dim() <= TensorView::kMaxRank, "rank ", t.dim(), " > 4");
  switch (t.scalar_type()) {
    case at::kFloat:
      v.dtype = DType::float32;
      break;
    case at::kDouble:
      v.dtype = DType::float64;
      break;
    case at::kInt:
      v.dtype = DType::int32;
      break;
    case at::kLong:
      v.dtype = DType::int64;
      break;
    case at::kBFloat16:
      v.dtype = DType::bfloat16;
      break;
    case at::kHalf:
      v.dtype = DType::float16;
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "unsupported dtype ", t.scalar_type());
  }
  v.device = t.device().is_cpu() ? Device::cpu : Device::cuda;
  v.data = t.data_ptr();
  v.rank = static_cast<int>(t.dim());
  for (int d = 0; d < v.rank; ++d) {
    v.sizes[static_cast<std::size_t>(d)] = t.size(d);
    v.strides[static_cast<std::size_t>(d)] = t.stride(d);
  }
  return v;
}

inline at::Tensor value_or_undefined(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// float16/bfloat16 → float32 (differentiable, so their gradients come back in their dtype);
// float32/float64 pass through untouched.
inline at::Tensor to_compute(const at::Tensor& t) {
  if (t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16))
    return t.to(at::kFloat);
  return t;
}
inline c10::optional<at::Tensor> to_compute(const c10::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return c10::nullopt;
  return to_compute(*t);
}

// ---- the compute device (phasor/torch.h: set_compute_device)
// --------------------------------------

// The views of the ops with CUDA kernels: a CPU tensor is viewed on this thread's compute device —
// its own memory labelled Device::emulated, or for Device::cuda a copy on the GPU (staged: an
// input is copied there now; an output is copied back by rethrow_as_torch when the core call
// succeeds, and every staged copy is freed then). Other tensors: view_of.
TensorView compute_view(const at::Tensor& t, bool output);
inline TensorView compute_view_of(const at::Tensor& t) {
  return compute_view(t, false);
}
inline TensorView compute_out_view_of(const at::Tensor& t) {
  return compute_view(t, true);
}
// Copies the staged outputs back (when asked) and frees every staged copy of this thread.
void settle_staged(bool copy_outputs_back);
// A c10::Error naming `op` and the device when the compute device is cuda and unusable.
void check_compute_device(const std::string& op);
#if PHASOR_TORCH_CUDA
// LibTorch's current CUDA stream (phasor's CUDA work of a call runs on it), and its caching
// allocator set as phasor's workspace allocator on first use.
cuda::Stream current_torch_stream();
#endif

// Runs a core call; a phasor::Error becomes a c10::Error with the same message. Settles the
// staged copies of the compute device: outputs back on success, all freed either way. The call
// is a RecordFunction user scope named "phasor::kernel" (kKernelScope), so that LibTorch's
// profiler and RecordFunction observers (phasor::tasks::OpTimer) see the time spent in phasor's
// kernels; without an observer the scope costs a check of a thread-local flag.
inline constexpr const char* kKernelScope = "phasor::kernel";
template <class F>
inline void rethrow_as_torch(F&& f) {
  RECORD_USER_SCOPE(kKernelScope);
  try {
#if PHASOR_TORCH_CUDA
    cuda::StreamGuard stream(current_torch_stream());
#endif
    f();
  } catch (const Error& e) {
    settle_staged(/*copy_outputs_back=*/false);
    TORCH_CHECK(false, e.what());
  } catch (...) {
    settle_staged(/*copy_outputs_back=*/false);
    throw;
  }
  settle_staged(/*copy_outputs_back=*/true);
}

// Number of sequences: N + 1 entries of cu_seqlens, or the batch size. A malformed cu_seqlens is
// reported by the core; here it only must not produce a negative size.
inline std::int64_t num_sequences(const at::Tensor& q, const at::Tensor& cu_seqlens) {
  if (!cu_seqlens.defined()) return q.size(0);
  return std::max<std::int64_t>(cu_seqlens.numel() - 1, 0);
}

// The dtype of final states and of FoX's saved log-sum-exp: float64 for float64 q, else float32.
inline at::ScalarType state_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// A fresh contiguous gradient buffer for `input` (same shape and dtype), or undefined when the
// input is absent or does not require grad.
inline at::Tensor grad_buffer(const at::Tensor& input, bool needed) {
  if (!needed || !input.defined()) return at::Tensor();
  return at::empty(input.sizes(), input.options());
}

// The incoming gradient of output i; undefined when that output took no part in the loss
// (materialize_grads is off), which the callers treat as zero.
inline at::Tensor incoming_grad(const variable_list& grads, std::size_t i) {
  return i < grads.size() ? grads[i] : at::Tensor();
}

inline c10::IValue optional_double(c10::optional<double> x) {
  return x ? c10::IValue(*x) : c10::IValue();
}
inline c10::optional<double> to_optional_double(const c10::IValue& x) {
  return x.isNone() ? c10::nullopt : c10::optional<double>(x.toDouble());
}

// Which inputs need gradients. Read in forward (requires_grad of the function's inputs) and kept
// for backward, so gradients nobody asked for are not computed.
inline bool requires_grad(const at::Tensor& t) {
  return t.defined() && t.requires_grad();
}

// The backward passes are not themselves differentiable (the core returns plain numbers), so a
// graph built through them would silently give wrong second derivatives. Autograd runs backward
// with grad mode on only for create_graph=true: refuse that instead.
inline void check_first_order(const std::string& op) {
  TORCH_CHECK(
      !at::GradMode::is_enabled(), op,
      " backward: double backward (create_graph=true) is not supported; phasor's gradients are "
      "first order only");
}

// The rotary layout a Function's forward saved in ctx->saved_data["rotary_layout"].
inline RotaryLayout saved_layout(AutogradContext* ctx) {
  return static_cast<RotaryLayout>(ctx->saved_data["rotary_layout"].toInt());
}

// o in q's original dtype (float16/bfloat16 inputs were computed in float32).
inline at::Tensor in_dtype_of(const at::Tensor& o, const at::Tensor& q) {
  return o.scalar_type() == q.scalar_type() ? o : o.to(q.scalar_type());
}

}  // namespace phasor::torch_detail
