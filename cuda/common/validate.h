// The value checks of a call (common/check.h: log gates ≤ 0, finite slopes, cu_seqlens offsets) on
// the device that holds its data, for both GPU backends. Declared alike for phasor::cuda (nvcc) and
// phasor::emulated (the emulated GPU); defined in cuda/common/validate.cu, compiled both ways.
//
// The pattern every op's GPU entry points follow: a macro lists the declarations once, and each
// backend's namespace gets them (the dispatcher, src/common/dispatch.h, picks one by the call's
// device with PHASOR_ON_GPU).
#pragma once

#include "common/check.h"

// Scans every check of `checks` on the device and returns the first failure, in the order the
// host scan uses (offsets, then each item's elements in row-major order), so that
// detail::raise_value_failure gives the CPU's message. One host sync: the verdict is copied back.
#define PHASOR_VALIDATE_GPU_ENTRY_POINTS \
  ::phasor::detail::ValueVerdict find_value_failure(const ::phasor::detail::ValueChecks& checks);

namespace phasor::cuda {
PHASOR_VALIDATE_GPU_ENTRY_POINTS
}  // namespace phasor::cuda
namespace phasor::emulated {
PHASOR_VALIDATE_GPU_ENTRY_POINTS
}  // namespace phasor::emulated
