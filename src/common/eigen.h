// Eigen with GCC 12's false warnings silenced: the first include of every source file whose
// Eigen code trips them (the kernels with vectorised exp / sin / cos, the dense solvers). Headers
// include <Eigen/Core> directly, so the rest of the code keeps those warnings.
//
// GCC 12 reports false -Wmaybe-uninitialized and -Wuninitialized warnings inside its own AVX-512
// intrinsics headers when Eigen's vectorised code is inlined into ours with -march=native
// (_mm512_undefined_pd in Eigen's double exp, psincos_float in its float sin/cos, the GEMM packing
// of its dense solvers; GCC bug 105593). The warnings are emitted where the intrinsics are defined,
// so the pragmas must be in force before <immintrin.h> is first read, and they stay in force for
// the rest of the file (a push/pop around the include would not cover the inlined code). This is
// the one place that silences them; clang and other GCC versions are not affected.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <Eigen/Core>
