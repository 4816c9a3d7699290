// The short names the test files share: ak for attnkit, Index, Layout, Tensor and tol, and
// the non-finite float constants.
#pragma once

#include <limits>

#include "support/attnkit_test.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;
namespace tol = ak::test::tol;

namespace attnkit::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace attnkit::test
