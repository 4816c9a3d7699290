// Problem and make_problem(): sizes deduced from the views, the defaults of scale and
// q_offset, Options overriding them, the GQA head mapping, and every error path with its
// message "attnkit: <argument>: expected <x>, got <y>" (error.hpp).
#include <algorithm>
#include <attnkit/core/error.hpp>
#include <attnkit/options.hpp>
#include <attnkit/problem.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Index;

namespace {

// 1/sqrt(D) computed in float by make_problem vs in double here.
constexpr double kScaleRel = 1e-6;

// make_problem() reads sizes, strides and addresses only; each view gets memory of its own
// (outputs may not alias inputs), kept for the whole run.
ak::View<float> view(Index B, Index H, Index S, Index D) {
  static std::deque<std::vector<float>> buffers;
  buffers.emplace_back(static_cast<std::size_t>(std::max<Index>(B * H * S * D, 1)));
  return ak::bhsd(buffers.back().data(), B, H, S, D);
}

// A consistent GQA problem: q [2, 8, 5, 64], k [2, 2, 7, 64], v [2, 2, 7, 48], o [2, 8, 5, 48].
struct Views {
  ak::View<float> q = view(2, 8, 5, 64), k = view(2, 2, 7, 64), v = view(2, 2, 7, 48),
                  o = view(2, 8, 5, 48);
  ak::Problem make(const ak::Options& options = {}) const {
    return ak::make_problem(q, k, v, o, options);
  }
};

// A valid problem for validate() to start from.
ak::Problem valid_problem() { return Views{}.make(); }

// Expects `call` to throw attnkit::Error whose message contains `text`.
void check_error(const std::function<void()>& call, const std::string& text) {
  INFO("expected message: " << text);
  CHECK_THROWS_MATCHES(call(), ak::Error, MessageMatches(Catch::Matchers::ContainsSubstring(text)));
}

}  // namespace

TEST_CASE("Problem: make_problem deduces every size from the views", "[problem]") {
  const ak::Problem p = Views{}.make();
  CHECK(p.batch == 2);
  CHECK(p.q_heads == 8);
  CHECK(p.kv_heads == 2);
  CHECK(p.q_len == 5);
  CHECK(p.kv_len == 7);
  CHECK(p.head_dim == 64);
  CHECK(p.value_dim == 48);
  CHECK(p.threads == 0);
}

TEST_CASE("Problem: the default scale is 1/sqrt(head_dim)", "[problem][defaults]") {
  const Index dim = GENERATE(1, 32, 64, 80, 128);
  Views w;
  w.q = view(1, 1, 3, dim);
  w.k = view(1, 1, 3, dim);
  w.v = view(1, 1, 3, 8);
  w.o = view(1, 1, 3, 8);
  CHECK_THAT(w.make().scale, Catch::Matchers::WithinRel(1.0 / std::sqrt(double(dim)), kScaleRel));
}

TEST_CASE("Problem: the default q_offset is kv_len - q_len (bottom-right)", "[problem][defaults]") {
  const auto [lq, lk] = GENERATE(table<Index, Index>({{5, 7}, {7, 5}, {6, 6}, {1, 1000}, {0, 3}}));
  Views w;
  w.q = view(2, 8, lq, 64);
  w.o = view(2, 8, lq, 48);
  w.k = view(2, 2, lk, 64);
  w.v = view(2, 2, lk, 48);
  CHECK(w.make().q_offset == lk - lq);
}

TEST_CASE("Problem: Options override scale, q_offset and threads", "[problem][options]") {
  const ak::Problem p =
      Views{}.make(ak::Options{}.with_scale(0.5f).with_q_offset(-3).with_threads(4));
  CHECK(p.scale == 0.5f);  // exact: the value is copied, not computed
  CHECK(p.q_offset == -3);
  CHECK(p.threads == 4);
  // An explicit q_offset equal to 0 is not mistaken for "unset".
  CHECK(Views{}.make(ak::Options{}.with_q_offset(0)).q_offset == 0);
}

TEST_CASE("Problem: kv_head maps query heads to KV heads for MHA, GQA and MQA", "[problem][gqa]") {
  ak::Problem p = valid_problem();
  p.q_heads = 8;
  SECTION("MHA: one KV head per query head") {
    p.kv_heads = 8;
    for (Index h = 0; h < 8; ++h) CHECK(p.kv_head(h) == h);
  }
  SECTION("GQA: consecutive query heads share a KV head") {
    p.kv_heads = 2;
    const std::vector<Index> expected{0, 0, 0, 0, 1, 1, 1, 1};
    for (Index h = 0; h < 8; ++h) CHECK(p.kv_head(h) == expected[static_cast<std::size_t>(h)]);
  }
  SECTION("GQA with a group size that is not a power of two") {
    p.q_heads = 6;
    p.kv_heads = 3;
    const std::vector<Index> expected{0, 0, 1, 1, 2, 2};
    for (Index h = 0; h < 6; ++h) CHECK(p.kv_head(h) == expected[static_cast<std::size_t>(h)]);
  }
  SECTION("MQA: every query head reads KV head 0") {
    p.kv_heads = 1;
    for (Index h = 0; h < 8; ++h) CHECK(p.kv_head(h) == 0);
  }
}

TEST_CASE("Problem: validate accepts a valid problem and empty sizes", "[problem][errors]") {
  CHECK_NOTHROW(valid_problem().validate());
  ak::Problem p = valid_problem();
  p.batch = 0;
  p.q_len = 0;
  p.kv_len = 0;
  CHECK_NOTHROW(p.validate());
}

TEST_CASE("Problem: validate names the invalid field, what it expected and what it got",
          "[problem][errors]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Bad {
    const char* what;
    std::function<void(ak::Problem&)> spoil;
    const char* message;
  };
  const std::vector<Bad> cases{
      {"batch < 0", [](ak::Problem& p) { p.batch = -1; }, "attnkit: batch: expected >= 0, got -1"},
      {"q_len < 0", [](ak::Problem& p) { p.q_len = -2; }, "attnkit: q_len: expected >= 0, got -2"},
      {"kv_len < 0", [](ak::Problem& p) { p.kv_len = -3; },
       "attnkit: kv_len: expected >= 0, got -3"},
      {"head_dim 0", [](ak::Problem& p) { p.head_dim = 0; },
       "attnkit: head_dim: expected 1 to 2^20, got 0"},
      {"value_dim 0", [](ak::Problem& p) { p.value_dim = 0; },
       "attnkit: value_dim: expected 1 to 2^20, got 0"},
      {"kv_heads 0", [](ak::Problem& p) { p.kv_heads = 0; },
       "attnkit: kv_heads: expected >= 1, got 0"},
      {"q_heads 0", [](ak::Problem& p) { p.q_heads = 0; },
       "attnkit: q_heads: expected a positive multiple of kv_heads (2), got 0"},
      {"q_heads not a multiple", [](ak::Problem& p) { p.q_heads = 3; },
       "attnkit: q_heads: expected a positive multiple of kv_heads (2), got 3"},
      {"scale 0", [](ak::Problem& p) { p.scale = 0.f; },
       "attnkit: scale: expected finite and non-zero, got 0"},
      {"scale inf", [=](ak::Problem& p) { p.scale = inf; },
       "attnkit: scale: expected finite and non-zero, got inf"},
      {"scale -inf", [=](ak::Problem& p) { p.scale = -inf; },
       "attnkit: scale: expected finite and non-zero, got -inf"},
      {"scale NaN", [=](ak::Problem& p) { p.scale = nan; },
       "attnkit: scale: expected finite and non-zero, got "},  // "nan" or "-nan"
      {"threads < 0", [](ak::Problem& p) { p.threads = -1; },
       "attnkit: threads: expected 0 (all) to 1024, got -1"},
  };
  for (const Bad& bad : cases) {
    INFO(bad.what);
    ak::Problem p = valid_problem();
    bad.spoil(p);
    check_error([&] { p.validate(); }, bad.message);
  }
}

TEST_CASE("Problem: make_problem names the view and the size that disagree", "[problem][errors]") {
  // Base: q [2, 8, 5, 64], k [2, 2, 7, 64], v [2, 2, 7, 48], o [2, 8, 5, 48].
  struct Bad {
    std::function<void(Views&)> spoil;
    const char* message;
  };
  const std::vector<Bad> cases{
      {[](Views& w) { w.k = view(1, 2, 7, 64); }, "attnkit: k.batch: expected 2 (q.batch), got 1"},
      {[](Views& w) { w.v = view(3, 2, 7, 48); }, "attnkit: v.batch: expected 2 (q.batch), got 3"},
      {[](Views& w) { w.o = view(1, 8, 5, 48); }, "attnkit: o.batch: expected 2 (q.batch), got 1"},
      {[](Views& w) { w.k = view(2, 2, 7, 32); }, "attnkit: k.dim: expected 64 (q.dim), got 32"},
      {[](Views& w) { w.v = view(2, 4, 7, 48); }, "attnkit: v.heads: expected 2 (k.heads), got 4"},
      {[](Views& w) { w.v = view(2, 2, 6, 48); }, "attnkit: v.seq: expected 7 (k.seq), got 6"},
      {[](Views& w) { w.o = view(2, 4, 5, 48); }, "attnkit: o.heads: expected 8 (q.heads), got 4"},
      {[](Views& w) { w.o = view(2, 8, 6, 48); }, "attnkit: o.seq: expected 5 (q.seq), got 6"},
      {[](Views& w) { w.o = view(2, 8, 5, 64); }, "attnkit: o.dim: expected 48 (v.dim), got 64"},
      // Consistent views that break a Problem rule are reported by validate().
      {[](Views& w) {
         w.k = view(2, 3, 7, 64);
         w.v = view(2, 3, 7, 48);
       },
       "attnkit: q_heads: expected a positive multiple of kv_heads (3), got 8"},
      {[](Views& w) {
         w.k = view(2, 0, 7, 64);
         w.v = view(2, 0, 7, 48);
       },
       "attnkit: kv_heads: expected >= 1, got 0"},
      {[](Views& w) {
         w.v = view(2, 2, 7, 0);
         w.o = view(2, 8, 5, 0);
       },
       "attnkit: value_dim: expected 1 to 2^20, got 0"},
      // D = 0 is reported as such (the default scale would be 1/sqrt(0)).
      {[](Views& w) {
         w.q = view(2, 8, 5, 0);
         w.k = view(2, 2, 7, 0);
       },
       "attnkit: head_dim: expected 1 to 2^20, got 0"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    Views w;
    cases[i].spoil(w);
    check_error([&] { w.make(); }, cases[i].message);
  }
}

TEST_CASE("Problem: make_problem rejects negative sizes, negative strides and null data",
          "[problem][errors]") {
  const auto which = GENERATE(as<std::string>{}, "q", "k", "v", "o");
  const auto pick = [&](Views& w) -> ak::View<float>& {
    return which == "q" ? w.q : which == "k" ? w.k : which == "v" ? w.v : w.o;
  };
  INFO("view " << which);
  SECTION("a negative size") {
    Views w;
    pick(w).seq = -1;
    check_error([&] { w.make(); }, "attnkit: " + which + ".seq: expected >= 0, got -1");
  }
  SECTION("a negative stride") {
    Views w;
    pick(w).head_stride = -1;
    check_error([&] { w.make(); }, "attnkit: " + which + ".head_stride: expected >= 0, got -1");
  }
  SECTION("null data in a non-empty view") {
    Views w;
    pick(w).data = nullptr;
    check_error([&] { w.make(); }, "attnkit: " + which + ".data: expected non-null, got nullptr");
  }
}

TEST_CASE("Problem: make_problem accepts null data in empty views", "[problem]") {
  // No keys at all: k and v have seq 0 and may be null.
  Views w;
  w.k = ak::bhsd(static_cast<float*>(nullptr), 2, 2, 0, 64);
  w.v = ak::bhsd(static_cast<float*>(nullptr), 2, 2, 0, 48);
  ak::Problem p;
  CHECK_NOTHROW(p = w.make());
  CHECK(p.kv_len == 0);
  CHECK(p.q_offset == -5);
}

TEST_CASE("Problem: make_problem validates the Options", "[problem][errors]") {
  check_error([] { Views{}.make(ak::Options{}.with_scale(0.f)); },
              "attnkit: scale: expected finite and non-zero, got 0");
  check_error(
      [] { Views{}.make(ak::Options{}.with_scale(std::numeric_limits<float>::infinity())); },
      "attnkit: scale: expected finite and non-zero, got inf");
  check_error([] { Views{}.make(ak::Options{}.with_threads(-2)); },
              "attnkit: threads: expected 0 (all) to 1024, got -2");
}

TEST_CASE("Problem: threads above Options::kMaxThreads are refused", "[problem][errors]") {
  // 100000 segfaulted inside libgomp; 5000 took minutes to start with libomp.
  check_error([] { Views{}.make(ak::Options{}.with_threads(100000)); },
              "attnkit: threads: expected 0 (all) to 1024, got 100000");
  CHECK_NOTHROW(Views{}.make(ak::Options{}.with_threads(ak::Options::kMaxThreads)));
}

TEST_CASE("Problem: head and value dimensions above 2^20 are refused", "[problem][errors]") {
  // They bound the per-thread scratch (kBlockK x head_dim floats), so its size cannot overflow.
  float x = 0.f;
  const Index big = ak::Problem::kMaxDim + 1;
  const auto one_row = [&](Index dim) { return ak::bhsd(&x, 1, 1, 1, dim); };
  std::vector<float> q(static_cast<std::size_t>(big)), o(static_cast<std::size_t>(big));
  check_error(
      [&] {
        ak::make_problem(ak::bhsd(q.data(), 1, 1, 1, big), one_row(big), one_row(8),
                         ak::bhsd(o.data(), 1, 1, 1, 8));
      },
      "attnkit: head_dim: expected 1 to 2^20, got 1048577");
}

TEST_CASE("Problem: a view whose element offsets overflow Index is refused", "[problem][errors]") {
  const auto which = GENERATE(as<std::string>{}, "q", "k", "v", "o");
  Views w;
  ak::View<float>& view = which == "q" ? w.q : which == "k" ? w.k : which == "v" ? w.v : w.o;
  view.batch_stride = Index{1} << 62;  // (batch - 1) * stride * sizeof(float) > 2^63
  check_error([&] { w.make(); }, "attnkit: " + which +
                                     ": expected sizes and strides whose element offsets fit in "
                                     "Index (int64), got an overflow");
}

TEST_CASE("Problem: outputs that share memory with an input or each other are refused",
          "[problem][errors][alias]") {
  // One buffer holding q, k, v and o back to back, so views can be made to overlap.
  std::vector<float> mem(4096);
  float* base = mem.data();
  const auto at = [&](Index offset, Index S, Index D) {
    return ak::bhsd(base + offset, 1, 2, S, D);
  };
  const auto q = at(0, 5, 32), k = at(400, 7, 32), v = at(1000, 7, 16), o = at(1300, 5, 16);
  REQUIRE_NOTHROW(ak::make_problem(q, k, v, o));  // disjoint: fine

  SECTION("o over q, in place") {
    check_error([&] { ak::make_problem(q, k, v, ak::bhsd(base, 1, 2, 5, 16)); },
                "attnkit: o: expected memory disjoint from q, got ");
  }
  SECTION("o over the tail of k") {
    check_error(
        [&] { ak::make_problem(q, k, v, at(800, 5, 16)); },
        "attnkit: o: expected memory disjoint from k, got address ranges overlapping by 192 bytes");
  }
  SECTION("o over v") {
    check_error([&] { ak::make_problem(q, k, v, at(1100, 5, 16)); },
                "attnkit: o: expected memory disjoint from v");
  }
  SECTION("lse over o, q, k or v") {
    const std::pair<Index, const char*> cases[] = {
        {1300 + 150, "o"}, {4, "q"}, {420, "k"}, {1100, "v"}};
    for (const auto& [offset, name] : cases) {
      INFO("lse at " << offset);
      check_error(
          [&, off = offset] {
            ak::make_problem(q, k, v, o, ak::Options{}.with_lse(base + off, 10));
          },
          std::string("attnkit: lse: expected memory disjoint from ") + name);
    }
    CHECK_NOTHROW(ak::make_problem(q, k, v, o, ak::Options{}.with_lse(base + 3000, 10)));
  }
}

TEST_CASE("Error: derives from std::invalid_argument", "[error]") {
  STATIC_REQUIRE(std::is_base_of_v<std::invalid_argument, ak::Error>);
  CHECK_THROWS_AS(Views{}.make(ak::Options{}.with_threads(-1)), std::invalid_argument);
}

TEST_CASE("Error: detail::require reads \"attnkit: <argument>: expected <x>, got <y>\"",
          "[error]") {
  CHECK_NOTHROW(ak::detail::require(true, "width", ">= 1", 0));
  CHECK_THROWS_MATCHES(ak::detail::require(false, "width", ">= 1", 0), ak::Error,
                       MessageMatches(Equals("attnkit: width: expected >= 1, got 0")));
  CHECK_THROWS_MATCHES(ak::detail::require(false, "ratio", 1.5, 2.25), ak::Error,
                       MessageMatches(Equals("attnkit: ratio: expected 1.5, got 2.25")));
  CHECK_THROWS_MATCHES(
      ak::detail::require(false, std::string("name"), std::string("\"a\""), "\"b\""), ak::Error,
      MessageMatches(Equals("attnkit: name: expected \"a\", got \"b\"")));
  CHECK_THROWS_MATCHES(ak::detail::fail("x", "y", "z"), ak::Error,
                       MessageMatches(Equals("attnkit: x: expected y, got z")));
}
