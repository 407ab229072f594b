// Internal: the validated problem of a short convolution and the kernels that compute it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/check.h"
#include "phasor/short_conv.h"

namespace phasor::detail::short_conv {

// Everything the kernels need, checked by api.cpp.
struct Problem {
  TensorView x, weight, bias, initial_cache;  // bias, initial_cache: possibly undefined
  std::vector<Sequence> sequences;
  std::int64_t D = 0, W = 1;
  bool silu = false;
  std::int64_t num_sequences() const { return static_cast<std::int64_t>(sequences.size()); }
};

void reference_forward(const Problem& p, const TensorView& y, const TensorView& final_cache);
void reference_backward(const Problem& p, const TensorView& dy, const TensorView& d_final_cache,
                        const ShortConvGrads& grads);
void kernel_forward(const Problem& p, const TensorView& y, const TensorView& final_cache);
void kernel_backward(const Problem& p, const TensorView& dy, const TensorView& d_final_cache,
                     const ShortConvGrads& grads);

}  // namespace phasor::detail::short_conv
