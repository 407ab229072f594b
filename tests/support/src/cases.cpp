#include "phasor/testing/cases.h"

#include <cstdlib>
#include <string>

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

std::int64_t long_sequence_length() {
  const char* size = std::getenv("PHASOR_TEST_SIZE");
  if (size == nullptr || std::string(size).empty() || std::string(size) == "full") return 65536;
  if (std::string(size) == "small") return 4096;
  throw Error(std::string("PHASOR_TEST_SIZE: expected \"small\" or \"full\" (or unset), got \"") +
              size + "\"");
}

}  // namespace phasor::testing
