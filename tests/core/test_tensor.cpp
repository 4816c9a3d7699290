// View<T> and its factories: the strides bhsd(), bshd() and strided() set, where row()
// points for each layout, and the conversion to a const view. Int views keep every
// address check exact.
#include <attnkit/core/error.hpp>
#include <attnkit/core/tensor.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <vector>

#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Index;

namespace {

// Memory whose every element holds its own offset, so row(b, h, s)[d] names the element
// the view addresses.
std::vector<int> offsets(Index n) {
  std::vector<int> m(static_cast<std::size_t>(n));
  std::iota(m.begin(), m.end(), 0);
  return m;
}

// Every element of the view, visited through row(), lands on `expected(b, h, s, d)`.
template <class T, class F>
void check_addressing(const ak::View<T>& v, F expected) {
  for (Index b = 0; b < v.batch; ++b)
    for (Index h = 0; h < v.heads; ++h)
      for (Index s = 0; s < v.seq; ++s)
        for (Index d = 0; d < v.dim; ++d) {
          INFO("b=" << b << " h=" << h << " s=" << s << " d=" << d);
          CHECK(v.row(b, h, s)[d] == expected(b, h, s, d));
        }
}

constexpr Index B = 2, H = 3, S = 5, D = 4;

}  // namespace

TEST_CASE("View: Index is std::ptrdiff_t", "[tensor]") {
  STATIC_REQUIRE(std::is_same_v<ak::Index, std::ptrdiff_t>);
}

TEST_CASE("View: bhsd() strides are [H*S*D, S*D, D]", "[tensor][layout]") {
  auto mem = offsets(B * H * S * D);
  const ak::View<int> v = ak::bhsd(mem.data(), B, H, S, D);
  CHECK(v.data == mem.data());
  CHECK(v.batch == B);
  CHECK(v.heads == H);
  CHECK(v.seq == S);
  CHECK(v.dim == D);
  CHECK(v.batch_stride == H * S * D);
  CHECK(v.head_stride == S * D);
  CHECK(v.seq_stride == D);
  check_addressing(v, [](Index b, Index h, Index s, Index d) {
    return static_cast<int>(((b * H + h) * S + s) * D + d);
  });
}

TEST_CASE("View: bshd() strides are [S*H*D, D, H*D] with sizes still in BHSD order",
          "[tensor][layout]") {
  auto mem = offsets(B * S * H * D);
  const ak::View<int> v = ak::bshd(mem.data(), B, S, H, D);  // factory takes (B, S, H, D)
  CHECK(v.batch == B);
  CHECK(v.heads == H);
  CHECK(v.seq == S);
  CHECK(v.dim == D);
  CHECK(v.batch_stride == S * H * D);
  CHECK(v.head_stride == D);
  CHECK(v.seq_stride == H * D);
  check_addressing(v, [](Index b, Index h, Index s, Index d) {
    return static_cast<int>(((b * S + s) * H + h) * D + d);
  });
}

TEST_CASE("View: bhsd() and bshd() views cover their memory exactly once", "[tensor][layout]") {
  for (const bool heads_first : {true, false}) {
    INFO((heads_first ? "bhsd" : "bshd"));
    std::vector<int> hits(static_cast<std::size_t>(B * H * S * D), 0);
    const ak::View<int> v =
        heads_first ? ak::bhsd(hits.data(), B, H, S, D) : ak::bshd(hits.data(), B, S, H, D);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index s = 0; s < S; ++s)
          for (Index d = 0; d < D; ++d) ++v.row(b, h, s)[d];
    for (const int n : hits) CHECK(n == 1);
  }
}

TEST_CASE("View: strided() keeps the given sizes and strides, padding unaddressed",
          "[tensor][layout]") {
  // Each level padded: seq rows of D + 3, heads of S rows + 5, batches of H heads + 7.
  const Index ss = D + 3, hs = S * ss + 5, bs = H * hs + 7;
  auto mem = offsets(B * bs);
  const ak::View<int> v = ak::strided(mem.data(), {B, H, S, D}, {bs, hs, ss});
  CHECK(v.batch == B);
  CHECK(v.heads == H);
  CHECK(v.seq == S);
  CHECK(v.dim == D);
  CHECK(v.batch_stride == bs);
  CHECK(v.head_stride == hs);
  CHECK(v.seq_stride == ss);
  check_addressing(v, [=](Index b, Index h, Index s, Index d) {
    return static_cast<int>(b * bs + h * hs + s * ss + d);
  });
}

TEST_CASE("View: strided() with a zero stride broadcasts one head to all heads",
          "[tensor][layout]") {
  // Strides are taken as given: head_stride 0 is a legal, copy-free broadcast.
  auto mem = offsets(S * D);
  const ak::View<int> v = ak::strided(mem.data(), {1, H, S, D}, {0, 0, D});
  for (Index h = 1; h < H; ++h)
    for (Index s = 0; s < S; ++s) CHECK(v.row(0, h, s) == v.row(0, 0, s));
}

TEST_CASE("View: converts to a const view of the same memory and shape", "[tensor][const]") {
  auto mem = offsets(B * S * H * D);
  const ak::View<int> v = ak::bshd(mem.data(), B, S, H, D);
  const ak::View<const int> c = v;
  CHECK(c.data == v.data);
  CHECK(c.batch == v.batch);
  CHECK(c.heads == v.heads);
  CHECK(c.seq == v.seq);
  CHECK(c.dim == v.dim);
  CHECK(c.batch_stride == v.batch_stride);
  CHECK(c.head_stride == v.head_stride);
  CHECK(c.seq_stride == v.seq_stride);
  CHECK(c.row(1, 2, 3) == v.row(1, 2, 3));
}

TEST_CASE("View: constness only goes one way and value_type drops it", "[tensor][const]") {
  STATIC_REQUIRE(std::is_convertible_v<ak::View<float>, ak::View<const float>>);
  STATIC_REQUIRE_FALSE(std::is_convertible_v<ak::View<const float>, ak::View<float>>);
  STATIC_REQUIRE(std::is_same_v<ak::View<const float>::value_type, float>);
  STATIC_REQUIRE(std::is_same_v<ak::View<float>::value_type, float>);
  // A factory given a const pointer builds a read-only view.
  const float* p = nullptr;
  STATIC_REQUIRE(std::is_same_v<decltype(ak::bhsd(p, 1, 1, 1, 1)), ak::View<const float>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ak::View<float>{}.row(0, 0, 0)), float*>);
  STATIC_REQUIRE(std::is_same_v<decltype(ak::View<const float>{}.row(0, 0, 0)), const float*>);
}

TEST_CASE("View: a default view is empty and null", "[tensor]") {
  const ak::View<float> v;
  CHECK(v.data == nullptr);
  CHECK(v.batch == 0);
  CHECK(v.heads == 0);
  CHECK(v.seq == 0);
  CHECK(v.dim == 0);
}

TEST_CASE("View: bhsd() and bshd() refuse sizes whose strides overflow Index", "[tensor][errors]") {
  // S = H = 2^31, D = 2: S*H*D = 2^63 wraps (to a negative or zero stride) in Index.
  const Index big = Index{1} << 31;
  float x = 0.f;
  CHECK_THROWS_MATCHES(ak::bshd(&x, 1, big, big, 2), ak::Error,
                       MessageMatches(ContainsSubstring("bshd: S*H*D: expected a product that "
                                                        "fits in Index (int64), got an overflow")));
  CHECK_THROWS_MATCHES(ak::bhsd(&x, 1, big, big, 2), ak::Error,
                       MessageMatches(ContainsSubstring("bhsd: H*S*D")));
  CHECK_THROWS_AS(ak::bshd(&x, 1, 2, big * 4, big), ak::Error);  // H*D alone overflows
  CHECK_NOTHROW(ak::bshd(&x, 1, big, 2, 2));                     // large, but representable
}
