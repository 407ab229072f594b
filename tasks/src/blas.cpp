// Which BLAS kernels LibTorch's matmuls run on (phasor/tasks/blas.h).
#include "phasor/tasks/blas.h"

#include <dlfcn.h>
#include <strings.h>

#include <cstdlib>

namespace phasor::tasks {

std::string blas_core() {
  // openblas_get_corename is OpenBLAS's public API (cblas.h); looked up rather than linked, so
  // that a LibTorch with another BLAS (or none) simply has no OpenBLAS core.
  using CoreName = char* (*)();
  const auto core_name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core_name == nullptr) return {};
  const char* name = core_name();
  return name == nullptr ? std::string() : std::string(name);
}

const char* suggested_openblas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  if (strcasecmp(blas_core().c_str(), "prescott") != 0) return nullptr;
  __builtin_cpu_init();
  // OpenBLAS's SkylakeX kernels use AVX-512 F, CD, BW, DQ and VL; its Haswell kernels AVX2 and
  // FMA. A core the CPU lacks would stop the process with SIGILL, so only these are suggested.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace phasor::tasks
