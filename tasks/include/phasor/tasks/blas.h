// phasor::tasks — which BLAS kernels LibTorch's matmuls run on.
//
// Debian's LibTorch does its float matmuls through OpenBLAS, which picks its kernels by CPU model
// when it is loaded. A model it does not know gets its generic "Prescott" kernels (SSE3): OpenBLAS
// 0.3.21 (Debian 12) on an Emerald Rapids Xeon (family 6, model 207) trained the harness's quick
// suite 1.84x slower (geometric mean of its 19 arms) than with its AVX-512 ("SkylakeX") kernels.
// OPENBLAS_CORETYPE chooses the kernels, but only before OpenBLAS is loaded — so `phasor tasks run`
// and `phasor demo` re-execute themselves with it set (src/cli/main.cpp); a program of your own can
// check blas_core() and set the variable in its environment.
//
//   if (const char* core = phasor::tasks::suggested_openblas_core())
//     std::fprintf(stderr, "run with OPENBLAS_CORETYPE=%s\n", core);
//
// Plain C++17 and POSIX (no LibTorch): the answers come from the process's loaded OpenBLAS.
#pragma once

#include <string>

namespace phasor::tasks {

// OpenBLAS's name for the kernels it runs ("SkylakeX", "Haswell", "Prescott", ...), or "" when
// no OpenBLAS is loaded in the process (LibTorch built with MKL, or a program without LibTorch).
std::string blas_core();

// Where OpenBLAS fell back to its generic kernels ("Prescott") on a CPU that supports better
// ones, the OPENBLAS_CORETYPE value that selects them: "SkylakeX" with AVX-512 (F, CD, BW, DQ,
// VL), "Haswell" with AVX2 and FMA. nullptr otherwise, and when OPENBLAS_CORETYPE is already set
// (the user's choice, or a re-executed process's).
const char* suggested_openblas_core();

}  // namespace phasor::tasks
