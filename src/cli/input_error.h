// Bad input to a `phasor` subcommand and the exit status it gets (commands.h: 2 for bad input).
#pragma once

#include <c10/util/Exception.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "phasor/common.h"

namespace phasor::cli {

// Bad input given by the user (a command-line value, a file it names): printed as is.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs `command` (which returns the exit status) and turns bad input into exit status 2: an
// InputError, or a phasor::Error or c10::Error raised by an argument check, is printed after
// `prefix` (a phasor::Error through `describe`, which may name the option the argument came
// from). Anything else propagates to main(), which prints it with status 1.
template <class Command>
int with_bad_input_status(const std::string& prefix, Command&& command,
                          std::string (*describe)(const std::string&) = nullptr) {
  try {
    return std::forward<Command>(command)();
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what());
  } catch (const Error& e) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(),
                 describe ? describe(e.what()).c_str() : e.what());
  } catch (const c10::Error& e) {  // the LibTorch layer's checks (and core errors it rethrows)
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what_without_backtrace());
  }
  return 2;
}

}  // namespace phasor::cli
