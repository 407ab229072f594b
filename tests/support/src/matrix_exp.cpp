#include "common/eigen.h"  // first: see there

#include "phasor/testing/matrix_exp.h"

#include <string>
#include <unsupported/Eigen/MatrixFunctions>

#include "phasor/common.h"

namespace phasor::testing {

Eigen::MatrixXd matrix_exp(const Eigen::MatrixXd& a) {
  if (a.rows() != a.cols())
    throw Error("phasor::testing::matrix_exp: 'a' must be square, got " + std::to_string(a.rows()) +
                "×" + std::to_string(a.cols()));
  return a.exp();
}

}  // namespace phasor::testing
