// attnkit::Error, the one exception type of the library, and the helpers that build its
// messages. Every public entry validates its arguments first and throws Error naming the
// argument, the expected and the actual value; nothing is written before that.
#pragma once

#include <cstddef>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>

namespace attnkit {

/// Thrown on invalid arguments. what() reads "attnkit: <argument>: expected <x>, got <y>".
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

/// How a message piece is held: string literals as const char*, anything else by reference.
/// So the formatting is instantiated once per kind of piece, not once per literal length (a
/// check named "q" and one named "kv_len" would otherwise format through two copies).
template <class T>
struct Piece {
  using type = const T&;
};
template <std::size_t N>
struct Piece<char[N]> {
  using type = const char*;
};
template <class T>
using piece_t = typename Piece<T>::type;

/// Pieces of a message, written one after the other when it is printed: `cat(name, ".batch")`
/// or `cat(">= ", span, " (rows must not overlap)")` in a check costs nothing until the check
/// fails (a std::string built with + and std::to_string costs a heap string on every call).
/// Holds references to its pieces: build it in the call that uses it.
template <class... Pieces>
struct Cat {
  std::tuple<Pieces...> parts;
};

template <class... Parts>
Cat<piece_t<Parts>...> cat(const Parts&... parts) {
  return Cat<piece_t<Parts>...>{std::tuple<piece_t<Parts>...>(parts...)};
}

template <class... Pieces>
std::ostream& operator<<(std::ostream& os, const Cat<Pieces...>& c) {
  std::apply([&os](const auto&... part) { (os << ... << part); }, c.parts);
  return os;
}

template <class Argument, class Expected, class Actual>
[[noreturn]] void fail_with(const Argument& argument, const Expected& expected,
                            const Actual& actual) {
  std::ostringstream msg;
  msg << "attnkit: " << argument << ": expected " << expected << ", got " << actual;
  throw Error(msg.str());
}

/// Throws Error("attnkit: <argument>: expected <expected>, got <actual>"); each of the three
/// is anything an std::ostream prints (a string, a number, a cat()).
template <class Argument, class Expected, class Actual>
[[noreturn]] void fail(const Argument& argument, const Expected& expected, const Actual& actual) {
  fail_with<piece_t<Argument>, piece_t<Expected>, piece_t<Actual>>(argument, expected, actual);
}

/// Throws Error(argument, expected, actual) when `ok` is false; the message is formatted only
/// then.
template <class Argument, class Expected, class Actual>
void require(bool ok, const Argument& argument, const Expected& expected, const Actual& actual) {
  if (!ok) fail(argument, expected, actual);
}

}  // namespace detail
}  // namespace attnkit
