// GLA's kernels on the GPU — recurrent (fused_recurrent_gla, cuda/gla/recurrent.cu) and chunk
// (chunk_gla, cuda/gla/chunk.cu), forward and backward — for both GPU backends: declared alike
// for phasor::cuda::gla (nvcc) and phasor::emulated::gla (the emulated GPU), compiled both ways.
// src/gla/api.cpp calls them through PHASOR_ON_GPU once the metadata and the value checks (gates,
// cu_seqlens) have passed; they take the CPU kernels' problem description (src/gla/problem.h) and
// compute what src/gla/recurrent.cpp and src/gla/chunk.cpp compute. Work is queued on
// phasor::cuda::current_stream(); no host synchronisation.
#pragma once

#include "gla/problem.h"
#include "phasor/gla.h"

#define PHASOR_GLA_GPU_ENTRY_POINTS                                                               \
  void recurrent_forward(const ::phasor::detail::gla::Problem& p, const ::phasor::TensorView& o,  \
                         const ::phasor::TensorView& final_state);                                \
  void recurrent_backward(                                                                        \
      const ::phasor::detail::gla::Problem& p, const ::phasor::TensorView& d_o,                   \
      const ::phasor::TensorView& d_final_state, const ::phasor::GlaGrads& grads);                \
  void chunk_forward(const ::phasor::detail::gla::Problem& p, const ::phasor::TensorView& o,      \
                     const ::phasor::TensorView& final_state,                                     \
                     const ::phasor::TensorView& chunk_states);                                   \
  void chunk_backward(const ::phasor::detail::gla::Problem& p, const ::phasor::TensorView& d_o,   \
                      const ::phasor::TensorView& d_final_state, const ::phasor::GlaGrads& grads, \
                      const ::phasor::TensorView& chunk_states);

namespace phasor::cuda::gla {
PHASOR_GLA_GPU_ENTRY_POINTS
}  // namespace phasor::cuda::gla
namespace phasor::emulated::gla {
PHASOR_GLA_GPU_ENTRY_POINTS
}  // namespace phasor::emulated::gla
