#include "phasor/testing/cases.h"

namespace phasor::testing {

const char* to_string(Rotation rotation) {
  switch (rotation) {
    case Rotation::none:
      return "no theta";
    case Rotation::half_split:
      return "half_split";
    case Rotation::interleaved:
      return "interleaved";
  }
  return "unknown";
}

RotaryLayout layout_of(Rotation rotation) {
  return rotation == Rotation::interleaved ? RotaryLayout::interleaved : RotaryLayout::half_split;
}

}  // namespace phasor::testing
