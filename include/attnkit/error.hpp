// attnkit::Error, the one exception type of the library, and the helpers that build its
// messages. Every public entry validates its arguments first and throws Error naming the
// argument, the expected and the actual value; nothing is written before that.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace attnkit {

/// Thrown on invalid arguments. what() reads "attnkit: <argument>: expected <x>, got <y>".
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

template <class Expected, class Actual>
[[noreturn]] void fail(const std::string& argument, const Expected& expected,
                       const Actual& actual) {
  std::ostringstream msg;
  msg << "attnkit: " << argument << ": expected " << expected << ", got " << actual;
  throw Error(msg.str());
}

/// Throws Error(argument, expected, actual) when `ok` is false.
template <class Expected, class Actual>
void require(bool ok, const std::string& argument, const Expected& expected, const Actual& actual) {
  if (!ok) fail(argument, expected, actual);
}

}  // namespace detail
}  // namespace attnkit
