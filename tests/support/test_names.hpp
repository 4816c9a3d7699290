// The short names the test files share: ak for attnkit, Index, Layout, Tensor, Case and tol,
// the masks most cases state (Causal, Sinks, SlidingWindow), and the non-finite float
// constants.
#pragma once

#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <limits>

#include "support/attnkit_test.hpp"
#include "support/case.hpp"

namespace ak = attnkit;
using ak::Causal;
using ak::Index;
using ak::Sinks;
using ak::SlidingWindow;
using ak::test::Case;
using ak::test::Layout;
using ak::test::Tensor;
namespace tol = ak::test::tol;

namespace attnkit::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace attnkit::test
