// Benchmark support: heap accounting. bench/memory.cpp interposes malloc and friends in the
// benchmark programs (never in the library), so every allocation — Eigen's, the standard
// library's, phasor's — is counted.
#pragma once

#include <cstdint>

namespace phasor::bench {

std::int64_t heap_bytes_in_use();
// Starts a new peak measurement at the current usage; peak_heap_bytes() then reports the highest
// usage since, minus the usage at the start (bytes allocated on top of what was live).
void reset_peak_heap();
std::int64_t peak_heap_bytes();

}  // namespace phasor::bench
