// Internal: option checks shared by the phasor::nn layers (nn.cpp, nn_rotations.cpp,
// nn_performer.cpp). Every message has the form "<layer>: option '<name>': expected <…>, got <…>".
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace phasor::nn::detail {

constexpr double kPi = 3.14159265358979323846;

inline void check_option(bool ok, const char* layer, const char* name, const std::string& expected,
                         const std::string& got) {
  TORCH_CHECK(ok, layer, ": option '", name, "': expected ", expected, ", got ", got);
}

inline void check_positive(const char* layer, const char* name, std::int64_t value) {
  check_option(value > 0, layer, name, "a positive number", std::to_string(value));
}

}  // namespace phasor::nn::detail
