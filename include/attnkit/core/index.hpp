// Index: the signed size type of every shape, stride, length and position in attnkit
// (std::ptrdiff_t). Sizes that come from user data are checked against its range before they
// are multiplied (core/checked.hpp), so no size arithmetic overflows.
#pragma once

#include <cstddef>

namespace attnkit {

using Index = std::ptrdiff_t;

}  // namespace attnkit
