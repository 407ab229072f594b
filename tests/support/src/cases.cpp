#include "phasor/testing/cases.h"

#include <algorithm>
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

BatchChunks batch_chunks(std::int64_t B, std::int64_t T, const Tensor& cu_seqlens,
                         std::int64_t chunk_size) {
  const std::int64_t C = std::max<std::int64_t>(1, std::min(chunk_size, T));
  const std::int64_t per_row = (T + C - 1) / C;  // chunks of a full row
  const bool packed = cu_seqlens.defined();
  const std::int64_t N = packed ? cu_seqlens.numel() - 1 : B;
  BatchChunks out;
  out.slots = packed ? N + per_row : B * per_row;
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t start = packed ? static_cast<std::int64_t>(cu_seqlens.at(n)) : 0,
                       length =
                           packed ? static_cast<std::int64_t>(cu_seqlens.at(n + 1)) - start : T;
    for (std::int64_t c = 0; c * C < length; ++c)
      out.chunks.push_back(
          {n, packed ? 0 : n, start, c * C, packed ? n + start / C + c : n * per_row + c});
  }
  return out;
}

}  // namespace phasor::testing
