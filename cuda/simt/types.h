// Internal: plain types shared by both sides of the portability header (simt.h).
#pragma once

namespace phasor::simt {

// Grid and block dimensions, as CUDA's dim3 (converted to it for a launch on the GPU).
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

}  // namespace phasor::simt
