// phasor_testing — the dense matrix exponential, the rotation suites' independent reference for
// exp(Σ_k r_k L_k) (STRING, GRAPE, the structured rotations).
#pragma once

#include <Eigen/Core>

namespace phasor::testing {

// exp(A) of a square float64 matrix by Eigen's MatrixFunctions (scaling and squaring with a Padé
// approximant); a phasor::Error when A is not square. Compiled once here rather than in each
// suite: the MatrixFunctions templates take 8 s to compile, 23 s under ASan + UBSan.
Eigen::MatrixXd matrix_exp(const Eigen::MatrixXd& a);

}  // namespace phasor::testing
