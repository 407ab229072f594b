// Internal: the validated problem of a short convolution and the kernels that compute it.
#pragma once

#include <cstdint>

#include "common/check.h"
#include "phasor/short_conv.h"
#include "short_conv/problem.h"

namespace phasor::detail::short_conv {

void reference_forward(const Problem& p, const TensorView& y, const TensorView& final_cache);
void reference_backward(const Problem& p, const TensorView& dy, const TensorView& d_final_cache,
                        const ShortConvGrads& grads);
void kernel_forward(const Problem& p, const TensorView& y, const TensorView& final_cache);
void kernel_backward(const Problem& p, const TensorView& dy, const TensorView& d_final_cache,
                     const ShortConvGrads& grads);

}  // namespace phasor::detail::short_conv
