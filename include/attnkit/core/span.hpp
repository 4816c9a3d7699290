// Span<T>: a pointer with the number of elements behind it, for the flat buffers a call
// writes besides its views (the row statistic Options::lse, the parameter gradients of
// ParamGrads). A call checks the size against what it will write, so a buffer one element
// short is an Error, never a write past its end. Empty (data null) means "not asked for".
// The accessors are std::span's, so a C++20 caller's std::span converts by data() and size().
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace attnkit {

template <class T>
class Span {
 public:
  Span() = default;
  Span(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): "no buffer"
  Span(T* data, std::ptrdiff_t size) : data_(data), size_(data == nullptr ? 0 : size) {}
  /// Any contiguous container with data() and size() (std::vector, std::array, std::span).
  template <class C, class = std::enable_if_t<
                         std::is_convertible_v<decltype(std::declval<C&>().data()), T*>>>
  Span(C& c)  // NOLINT(google-explicit-constructor)
      : Span(c.data(), static_cast<std::ptrdiff_t>(c.size())) {}

  template <std::size_t N>
  Span(T (&a)[N])  // NOLINT(google-explicit-constructor)
      : Span(a, static_cast<std::ptrdiff_t>(N)) {}

  T* data() const { return data_; }
  std::ptrdiff_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  /// The span from element `at` on (at <= size()).
  Span subspan(std::ptrdiff_t at) const { return Span(data_ + at, size_ - at); }

 private:
  T* data_ = nullptr;
  std::ptrdiff_t size_ = 0;
};

}  // namespace attnkit
