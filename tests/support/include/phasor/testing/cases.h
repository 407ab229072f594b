// phasor_testing — parameters of op test cases that several suites share.
#pragma once

#include <cstdint>
#include <vector>

#include "phasor/common.h"
#include "phasor/testing/tensor.h"

namespace phasor::testing {

// The rotation by θ fused into the attention kernels (GLA, Gated DeltaNet, FoX), as a case
// parameter: none, or θ given in one of the two pair layouts.
enum class Rotation { none, half_split, interleaved };
constexpr Rotation kRotations[] = {Rotation::none, Rotation::half_split, Rotation::interleaved};

// "no theta", "half_split" or "interleaved".
const char* to_string(Rotation rotation);
// The pair layout of a rotation (half_split for none, whose layout is not used).
RotaryLayout layout_of(Rotation rotation);

// The length of the suites' long-sequence cases: 65,536 tokens, or 4,096 when the environment has
// PHASOR_TEST_SIZE=small (scripts/sanitize.sh sets it: instrumented builds run 5–20× slower, and a
// 4,096-token sequence still spans 64 chunks and the kernels' by-chunk schedules). Any other
// value of PHASOR_TEST_SIZE is an error, so a typo cannot silently change what runs.
std::int64_t long_sequence_length();

// The kernels' subnormal handling (set_flush_denormals) for one scope, the previous setting
// restored after: suites run their reference comparisons in both, so that neither the flushing
// default nor IEEE gradual underflow can lose the bound unseen.
class FlushDenormalsScope {
 public:
  explicit FlushDenormalsScope(bool flush) : previous_(flush_denormals()) {
    set_flush_denormals(flush);
  }
  ~FlushDenormalsScope() { set_flush_denormals(previous_); }
  FlushDenormalsScope(const FlushDenormalsScope&) = delete;
  FlushDenormalsScope& operator=(const FlushDenormalsScope&) = delete;

 private:
  bool previous_;
};
constexpr bool kFlushDenormalModes[] = {true, false};

// The chunks of a batch and where their kept states go (phasor/common.h's num_chunk_states),
// written out from that description for the suites of the chunk kernels that keep them: chunk c
// of sequence n (batch row `batch`, first token `start`) is entered after the `before` tokens
// [start, start + before) of that row, and its state is at index `slot`.
struct BatchChunk {
  std::int64_t n, batch, start, before, slot;
};
struct BatchChunks {
  std::int64_t slots = 0;  // num_chunk_states
  std::vector<BatchChunk> chunks;
};
// B rows of T tokens, or (cu_seqlens defined) the sequences it packs into one row of T.
BatchChunks batch_chunks(std::int64_t B, std::int64_t T, const Tensor& cu_seqlens,
                         std::int64_t chunk_size);

}  // namespace phasor::testing
