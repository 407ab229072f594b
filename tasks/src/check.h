// The harness's argument errors, in the core's form
//   "<op>: argument '<name>': expected <what>, got <what was given>"
// thrown as phasor::Error (phasor/common.h). tasks/ builds against phasor's public headers only,
// so it has its own copy of this one-liner rather than the core's private common/check.h.
#pragma once

#include <string>

#include "phasor/common.h"

namespace phasor::tasks::detail {

[[noreturn]] inline void fail(const std::string& op, const std::string& arg,
                              const std::string& expected, const std::string& got) {
  throw Error(op + ": argument '" + arg + "': expected " + expected + ", got " + got);
}

}  // namespace phasor::tasks::detail
