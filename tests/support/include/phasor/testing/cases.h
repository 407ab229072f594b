// phasor_testing — parameters of op test cases that several suites share.
#pragma once

#include "phasor/common.h"

namespace phasor::testing {

// The rotation by θ fused into the attention kernels (GLA, Gated DeltaNet, FoX), as a case
// parameter: none, or θ given in one of the two pair layouts.
enum class Rotation { none, half_split, interleaved };
constexpr Rotation kRotations[] = {Rotation::none, Rotation::half_split, Rotation::interleaved};

// "no theta", "half_split" or "interleaved".
const char* to_string(Rotation rotation);
// The pair layout of a rotation (half_split for none, whose layout is not used).
RotaryLayout layout_of(Rotation rotation);

}  // namespace phasor::testing
