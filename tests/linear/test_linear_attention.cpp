// linear_attention() against reference::linear_attention() (explicit weights in f64): the
// chunked form for chunk sizes 1, 16, 64 and 100 over a length that none divides, and the
// recurrent form, for every feature map, with and without a per-head decay, causal and not
// (Lq != Lk), GQA, the three layouts, f32, bf16 and f16 storage, 1 or 2 threads; then the
// state: a prefill followed by decode steps equals one long prefill; the thread count
// changes no bit; bad inputs throw Error before anything is written. Built for the
// native ISA and x86-64-v2 (ATTNKIT_PATH_TESTS).
// The engine under test: linear/linear_heads.hpp (LinearHeads, chunked and recurrent).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/linear/linear_attention.hpp>
#include <attnkit/linear/reference.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Tensor;
namespace tol = ak::test::tol;

namespace {

// Outputs are compared relative to max(1, max |reference|): unnormalized maps (Identity)
// give sums of up to L terms. The forms add the same terms in other orders (f32).
constexpr double kLinearF32 = 2e-5;
// Decode steps against one prefill: both f32, through different association orders.
constexpr double kStateF32 = 1e-5;

struct Shape {
  Index batch = 2, q_heads = 4, kv_heads = 2, q_len = 150, kv_len = 150, dim = 16, value_dim = 24;
  ak::test::Layout layout = ak::test::Layout::Bshd;
  int threads = 2;
};

const std::vector<float> kDecay = {0.9f, 0.99f, 1.f, 0.5f};  // one per query head

template <class T>
struct Inputs {
  Tensor<T> q, k, v;
  explicit Inputs(const Shape& s, std::uint32_t seed = 11)
      : q(s.layout, s.batch, s.q_heads, s.q_len, s.dim),
        k(s.layout, s.batch, s.kv_heads, s.kv_len, s.dim),
        v(s.layout, s.batch, s.kv_heads, s.kv_len, s.value_dim) {
    q.randomize(seed, 0.5f);
    k.randomize(seed + 1, 0.5f);
    v.randomize(seed + 2);
  }
};

// max |kernel - reference| / max(1, max |reference|) on one shape, storage T.
template <class T, class Map>
double error_vs_reference(const ak::LinearSpec<Map>& spec, const Shape& s) {
  Inputs<T> in(s);
  Tensor<T> o(s.layout, s.batch, s.q_heads, s.q_len, s.value_dim);
  Tensor<double> expected(ak::test::Layout::Bhsd, s.batch, s.q_heads, s.q_len, s.value_dim);
  const auto options = ak::Options{}.with_threads(s.threads);
  ak::linear_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
  ak::reference::linear_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), expected.view,
                                  options);
  double magnitude = 1;
  expected.for_each([&](double& x) { magnitude = std::max(magnitude, std::abs(x)); });
  return ak::test::max_abs_diff(o.view, expected.view) / magnitude;
}

// Every form and chunk size, with and without decay, causal and not, against the reference.
template <class Map>
void check_all_forms(const Map& map) {
  const ak::LinearSpec<Map> base = ak::linear_spec(map);
  int layout = 0;
  for (const bool causal : {true, false})
    for (const bool decay : {false, true})
      for (const Index chunk : {Index{0}, Index{1}, Index{16}, Index{64}, Index{100}}) {
        Shape s;
        s.layout = ak::test::Layout(layout++ % 3);
        s.threads = 1 + layout % 2;
        if (!causal) s.q_len = 37;
        auto spec = base.with_causal(causal).with_decay(decay ? kDecay : std::vector<float>{});
        spec = chunk == 0 ? spec.with_form(ak::LinearForm::Recurrent) : spec.with_chunk(chunk);
        INFO((causal ? "causal" : "non-causal")
             << (decay ? " decay" : "") << (chunk == 0 ? " recurrent" : " chunk ")
             << (chunk == 0 ? std::string() : std::to_string(chunk)) << " "
             << ak::test::name(s.layout));
        CHECK(error_vs_reference<float>(spec, s) <= kLinearF32);
      }
}

// A user feature map: an element rule and its vector form (phi >= 0, so it normalizes).
struct Square {
  static constexpr bool kNormalizes = true;
  double element(double x) const { return x * x; }
  ak::simd::Vec vec(ak::simd::Vec x) const { return x * x; }
};

}  // namespace

TEST_CASE("linear_attention: EluPlusOne, chunked and recurrent, equal the f64 reference",
          "[linear]") {
  check_all_forms(ak::EluPlusOne{});
}

TEST_CASE("linear_attention: Relu, chunked and recurrent, equal the f64 reference", "[linear]") {
  check_all_forms(ak::Relu{});
}

TEST_CASE(
    "linear_attention: Identity (no denominator), chunked and recurrent, equal the f64 "
    "reference",
    "[linear]") {
  check_all_forms(ak::Identity{});
}

TEST_CASE("linear_attention: Taylor2 (state d^2), chunked and recurrent, equal the f64 reference",
          "[linear]") {
  check_all_forms(ak::Taylor2{});
}

TEST_CASE(
    "linear_attention: a user feature map (element rule and vector form) equals the f64 "
    "reference",
    "[linear]") {
  check_all_forms(Square{});
}

TEST_CASE("linear_attention: head sizes 32, 80, 128 and a normalized Identity", "[linear]") {
  for (const Index d : {32, 80, 128}) {
    Shape s;
    s.dim = d;
    s.value_dim = d;
    s.q_len = s.kv_len = 77;
    INFO("d " << d);
    const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay).with_chunk(32);
    CHECK(error_vs_reference<float>(spec, s) <= kLinearF32);
  }
  const auto normalized = ak::linear_spec(ak::Identity{}).with_normalize(true, 1e-3f);
  Shape s;
  s.q_len = s.kv_len = 40;  // Identity's denominators can cross 0: keep the sums short
  CHECK(error_vs_reference<float>(normalized.with_form(ak::LinearForm::Recurrent), s) <= 1e-3);
}

TEST_CASE("linear_attention: bf16 and f16 storage within their tolerances", "[linear]") {
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay).with_chunk(16);
  Shape s;
  CHECK(error_vs_reference<Eigen::bfloat16>(spec, s) <= tol::kBf16);
  CHECK(error_vs_reference<Eigen::half>(spec, s) <= tol::kHalf);
  CHECK(error_vs_reference<Eigen::half>(spec.with_form(ak::LinearForm::Recurrent), s) <=
        tol::kHalf);
  const auto taylor = ak::linear_spec(ak::Taylor2{}).with_chunk(64);
  CHECK(error_vs_reference<Eigen::bfloat16>(taylor, s) <= tol::kBf16);
}

TEST_CASE("linear_attention: a prefill then decode steps equal one long prefill", "[linear]") {
  Shape s;
  Inputs<float> in(s);
  const Index split = 70;  // prefill [0, 40) and [40, 70): neither a multiple of the chunk
  const auto rows = [](auto x, Index from, Index count) {
    auto part = x;
    part.data = x.row(0, 0, from);
    part.seq = count;
    return part;
  };
  for (const bool decay : {false, true}) {
    const auto spec = ak::linear_spec(ak::EluPlusOne{})
                          .with_chunk(16)
                          .with_decay(decay ? kDecay : std::vector<float>{});
    Tensor<float> whole(s.layout, s.batch, s.q_heads, s.q_len, s.value_dim);
    Tensor<float> parts(s.layout, s.batch, s.q_heads, s.q_len, s.value_dim);
    auto whole_state = ak::make_linear_state(spec, in.q.view, in.v.view);
    ak::linear_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), whole.view, whole_state);

    auto state = ak::make_linear_state(spec, in.q.view, in.v.view);
    const auto q = in.q.cview(), k = in.k.cview(), v = in.v.cview();
    for (const auto& [from, count] : {std::pair<Index, Index>{0, 40}, {40, split - 40}})
      ak::linear_attention(spec, rows(q, from, count), rows(k, from, count), rows(v, from, count),
                           rows(parts.view, from, count), state);  // two prefills, then decode
    const auto step = spec.with_form(ak::LinearForm::Recurrent);
    for (Index t = split; t < s.q_len; ++t)  // decode: one token per call
      ak::linear_attention(step, rows(q, t, 1), rows(k, t, 1), rows(v, t, 1),
                           rows(parts.view, t, 1), state);

    INFO((decay ? "decay" : "no decay"));
    CHECK(ak::test::max_abs_diff(parts.view, whole.view) <= kStateF32);
    double worst = 0, magnitude = 1;
    for (Index b = 0; b < s.batch; ++b)
      for (Index h = 0; h < s.q_heads; ++h)
        for (Index f = 0; f < state.features(); ++f) {
          for (Index c = 0; c < s.value_dim; ++c) {
            worst =
                std::max(worst, double(std::abs(state.s(b, h, f, c) - whole_state.s(b, h, f, c))));
            magnitude = std::max(magnitude, double(std::abs(whole_state.s(b, h, f, c))));
          }
          worst = std::max(worst, double(std::abs(state.z(b, h, f) - whole_state.z(b, h, f))));
        }
    CHECK(worst / magnitude <= kStateF32);
  }
}

TEST_CASE("linear_attention: the thread count changes no bit", "[linear]") {
  Shape s;
  Inputs<float> in(s);
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay);
  std::vector<std::vector<float>> outs;
  for (const int threads : {1, 2}) {
    Tensor<float> o(ak::test::Layout::Bhsd, s.batch, s.q_heads, s.q_len, s.value_dim);
    ak::linear_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                         ak::Options{}.with_threads(threads));
    outs.push_back(o.memory);
  }
  CHECK(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)) == 0);
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST_CASE("feature maps: the SIMD form gives element()'s value on NaN, inf and the kink",
          "[linear][feature_map][nonfinite]") {
  // x86's min / max return their second operand for a NaN first one: a map written with
  // min(x, 0) gave phi(NaN) = 1 where element() (the reference's rule) gives NaN.
  // NaN where element() gives NaN, the same infinity, else within f32's exp2 (kLinearF32).
  const auto same = [](float got, double want) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return double(got) == want;
    return std::abs(double(got) - want) <= kLinearF32 * std::max(1.0, std::abs(want));
  };
  const auto lanes_agree = [&same](const auto& map, const char* name) {
    const float xs[] = {kNaN, -kNaN, kInf, -kInf, 0.f, -0.f, -3.f, 2.5f};
    for (const float x : xs) {
      INFO(name << " at " << x);
      const float vec = ak::simd::reduce_add(map.vec(ak::simd::Vec(x))) / ak::simd::kWidth;
      const double want = map.element(double(x));
      CHECK(same(vec, want));
      const float dvec =
          ak::simd::reduce_add(map.derivative_vec(ak::simd::Vec(x))) / ak::simd::kWidth;
      const double dwant = map.derivative(double(x));
      CHECK(same(dvec, dwant));
    }
  };
  lanes_agree(ak::EluPlusOne{}, "EluPlusOne");
  lanes_agree(ak::Relu{}, "Relu");
  lanes_agree(ak::Identity{}, "Identity");
}

TEST_CASE("linear_attention: a NaN in q gives that row NaN on the SIMD path, as the reference",
          "[linear][nonfinite]") {
  // D 16 (the SIMD path; D 4 runs the scalar tail): EluPlusOne, causal, q[row 5][3] = NaN.
  Shape s;
  s.batch = 1, s.q_heads = s.kv_heads = 1, s.q_len = s.kv_len = 12, s.dim = 16, s.value_dim = 8;
  s.layout = ak::test::Layout::Bhsd;
  Inputs<float> in(s);
  in.q.view.row(0, 0, 5)[3] = kNaN;
  Tensor<float> o(s.layout, 1, 1, 12, 8);
  Tensor<double> want(s.layout, 1, 1, 12, 8);
  const auto spec = ak::linear_spec(ak::EluPlusOne{});
  ak::linear_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view);
  ak::reference::linear_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), want.view);
  for (Index i = 0; i < 12; ++i)
    for (Index c = 0; c < 8; ++c) {
      INFO("row " << i << ", column " << c);
      const double w = want.view.row(0, 0, i)[c];
      const float got = o.view.row(0, 0, i)[c];
      CHECK(std::isnan(w) == (i == 5));
      if (std::isnan(w))
        CHECK(std::isnan(got));
      else
        CHECK(std::abs(double(got) - w) <= kLinearF32 * std::max(1.0, std::abs(w)));
    }
}

TEST_CASE("Taylor2: phi(q) . phi(k) is 1 + q.k + (q.k)^2 / 2", "[linear][feature_map]") {
  const double q[3] = {0.5, -1.25, 2}, k[3] = {1.5, 0.25, -0.75};
  const ak::Taylor2 map;
  std::vector<double> fq(std::size_t(map.features(3))), fk(fq.size());
  map.map_row(q, 3, fq.data());
  map.map_row(k, 3, fk.data());
  double dot = 0, qk = 0;
  for (std::size_t i = 0; i < fq.size(); ++i) dot += fq[i] * fk[i];
  for (int i = 0; i < 3; ++i) qk += q[i] * k[i];
  CHECK(std::abs(dot - (1 + qk + qk * qk / 2)) <= 1e-12);
}

TEST_CASE("linear_attention: bad inputs throw Error before anything is written",
          "[linear][errors]") {
  Shape s;
  Inputs<float> in(s);
  Tensor<float> o(ak::test::Layout::Bhsd, s.batch, s.q_heads, s.q_len, s.value_dim);
  const auto spec = ak::linear_spec(ak::EluPlusOne{});
  const auto q = in.q.cview(), k = in.k.cview(), v = in.v.cview();
  const auto expect_error = [&](auto call, const std::string& text) {
    std::fill(o.memory.begin(), o.memory.end(), 42.f);
    CHECK_THROWS_MATCHES(call(), ak::Error,
                         Catch::Matchers::MessageMatches(ContainsSubstring(text)));
    CHECK(std::all_of(o.memory.begin(), o.memory.end(), [](float x) { return x == 42.f; }));
  };
  const auto with_state = [&](ak::LinearState state, const std::string& text) {
    state.s(0, 0, 0, 0) = 3.f;  // a history, which a failed call must leave alone
    state.z(0, 0, 0) = 5.f;
    const ak::LinearState before = state;
    expect_error([&] { ak::linear_attention(spec, q, k, v, o.view, state); }, text);
    CHECK(before.floats() == state.floats());
  };
  with_state(ak::LinearState(s.batch, s.q_heads, s.dim + 1, s.value_dim), "state.features");
  with_state(ak::LinearState(s.batch, s.kv_heads, s.dim, s.value_dim), "state.heads");
  with_state(ak::LinearState(s.batch + 1, s.q_heads, s.dim, s.value_dim), "state.batch");
  with_state(ak::LinearState(s.batch, s.q_heads, s.dim, s.value_dim + 1), "state.value_dim");
  expect_error([&] { ak::linear_attention(spec.with_decay({0.5f}), q, k, v, o.view); }, "decay");
  expect_error(
      [&] {
        ak::linear_attention(spec.with_decay({1, 1, 1.5f, 1}), q, k, v, o.view);
      },
      "decay");
  expect_error([&] { ak::linear_attention(spec.with_chunk(0), q, k, v, o.view); }, "chunk");
  expect_error([&] { ak::linear_attention(spec.with_normalize(true, -1.f), q, k, v, o.view); },
               "eps");
  expect_error([&] { ak::linear_attention(spec, q, k, v, o.view, ak::Options{}.with_q_offset(3)); },
               "q_offset");
  std::vector<float> lse(std::size_t(s.batch * s.q_heads * s.q_len));
  expect_error([&] { ak::linear_attention(spec, q, k, v, o.view, ak::Options{}.with_lse(lse)); },
               "lse");
  auto short_q = q;
  short_q.seq = 10;
  auto short_o = o.view;
  short_o.seq = 10;
  expect_error([&] { ak::linear_attention(spec, short_q, k, v, short_o); }, "k.seq");
  // 4 query heads are not a multiple of 3 KV heads (real buffers of 3 heads: a view widened
  // past its memory would meet the aliasing checks first, depending on the heap).
  Tensor<float> k3(ak::test::Layout::Bhsd, s.batch, 3, s.kv_len, s.dim),
      v3(ak::test::Layout::Bhsd, s.batch, 3, s.kv_len, s.value_dim);
  expect_error([&] { ak::linear_attention(spec, q, k3.cview(), v3.cview(), o.view); }, "q_heads");
  // Non-causal: Lq != Lk is legal.
  CHECK_NOTHROW(ak::linear_attention(spec.with_causal(false), short_q, k, v, short_o));
  {  // an output view inside the state it updates: refused, state and output untouched
    Tensor<float> q1(ak::test::Layout::Bhsd, 1, 1, 2, s.dim),
        k1(ak::test::Layout::Bhsd, 1, 1, 5, s.dim),
        v1(ak::test::Layout::Bhsd, 1, 1, 5, s.value_dim);
    ak::LinearState state = ak::make_linear_state(spec, q1.cview(), v1.cview());
    state.s(0, 0, 0, 0) = 3.f;
    const ak::LinearState before = state;
    const auto in_state = ak::bhsd(state.head(0, 0), 1, 1, 2, s.value_dim);
    CHECK_THROWS_MATCHES(ak::linear_attention(spec.with_causal(false), q1.cview(), k1.cview(),
                                              v1.cview(), in_state, state),
                         ak::Error,
                         Catch::Matchers::MessageMatches(
                             ContainsSubstring("o: expected memory disjoint from state")));
    CHECK(before.floats() == state.floats());
  }
}

TEST_CASE("linear_attention: one token, no token, and a non-causal call that only reads keys",
          "[linear]") {
  Shape s;
  s.q_len = s.kv_len = 1;
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay);
  CHECK(error_vs_reference<float>(spec, s) <= kLinearF32);  // Lq = 1 through the chunked form

  Shape full;
  Inputs<float> in(full);
  Tensor<float> o(ak::test::Layout::Bhsd, full.batch, full.q_heads, full.q_len, full.value_dim);
  auto causal_state = ak::make_linear_state(spec, in.q.view, in.v.view);
  ak::linear_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, causal_state);

  // No query rows: a non-causal call still folds every key into the state, the same state.
  auto no_queries = in.q.cview();
  no_queries.seq = 0;
  auto no_rows = o.view;
  no_rows.seq = 0;
  auto state = ak::make_linear_state(spec, in.q.view, in.v.view);
  ak::linear_attention(spec.with_causal(false), no_queries, in.k.cview(), in.v.cview(), no_rows,
                       state);
  double worst = 0;
  for (Index f = 0; f < state.features(); ++f)
    for (Index c = 0; c < full.value_dim; ++c)
      worst = std::max(worst, double(std::abs(state.s(1, 3, f, c) - causal_state.s(1, 3, f, c))));
  CHECK(worst <= kStateF32 * 10);  // sums of 150 terms of order 1

  // No token at all: the state is unchanged.
  auto no_keys = in.k.cview();
  no_keys.seq = 0;
  auto no_values = in.v.cview();
  no_values.seq = 0;
  const ak::LinearState before = state;
  ak::linear_attention(spec, no_queries, no_keys, no_values, no_rows, state);
  CHECK(before.floats() == state.floats());

  // Queries but no key, from the empty history: rows that see nothing get 0, even a NaN query
  // (the fuzz test found phi(NaN) . 0 = NaN there); from a history, they read it.
  auto three = in.q.cview();
  three.seq = 3;
  in.q.view.row(0, 1, 1)[0] = std::numeric_limits<float>::quiet_NaN();
  auto three_rows = o.view;
  three_rows.seq = 3;
  o.fill(42.f);
  auto empty = ak::make_linear_state(spec, in.q.view, in.v.view);
  ak::linear_attention(spec.with_causal(false), three, no_keys, no_values, three_rows, empty);
  bool zeros = true;
  for (Index b = 0; b < full.batch; ++b)
    for (Index h = 0; h < full.q_heads; ++h)
      for (Index i = 0; i < 3; ++i)
        for (Index c = 0; c < full.value_dim; ++c)
          zeros = zeros && three_rows.row(b, h, i)[c] == 0.f;
  CHECK(zeros);
  ak::linear_attention(spec.with_causal(false), three, no_keys, no_values, three_rows, state);
  CHECK(std::isnan(three_rows.row(0, 1, 1)[0]));     // the NaN query row reads the history
  CHECK(std::isfinite(three_rows.row(0, 1, 0)[0]));  // the others are finite
}
