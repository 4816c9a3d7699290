// linear_attention_backward() and reference::linear_attention_backward(): the f64 reference
// against central finite differences of the f64 forward with state (loss sum d_o . o +
// sum dS_out . S_out + sum dz_out . z_out) for every feature map, with and without decay,
// causal and not, from an initial state (its gradient too), with a scale; then the fast
// path against the reference over ragged lengths, chunk sizes, GQA, the three layouts,
// f32, bf16 and f16 storage and the state gradients; a chained pair of calls against one
// call; bitwise identical results for 1 to 4 threads; every bad input refused with an Error
// before anything is written. Native build only (ATTNKIT_UNIT_TESTS).
// The engine under test: linear/linear_backward_heads.hpp on linear/linear_backward_rows.hpp.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/linear/linear_attention.hpp>
#include <attnkit/linear/linear_attention_backward.hpp>
#include <attnkit/linear/reference_backward.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/case.hpp"
#include "support/error_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Case;
using ak::test::Tensor;
using F64State = ak::reference::LinearStateF64;
namespace tol = ak::test::tol;

namespace {

// The reference against central differences (step kStep) of the f64 forward, relative to
// max(1, the gradient's largest element): truncation h^2 f''' / 6 and rounding eps L / h,
// both near 1e-10 on these shapes (the largest error seen is 5e-9).
constexpr double kStep = 1e-5;
constexpr double kFiniteDiff = 1e-7;
// The f32 kernel against the f64 reference, relative to each gradient's largest element:
// sums of up to L f32 terms in other orders (the largest error seen on these shapes is
// 1e-6, Taylor2 and the state gradients included).
constexpr double kGradF32 = 1e-5;

const std::vector<float> kDecay = {0.9f, 0.99f, 1.f, 0.5f};  // one per query head

// A user feature map with an element rule, its vector form and its derivative only.
struct Square {
  static constexpr bool kNormalizes = true;
  double element(double x) const { return x * x; }
  ak::simd::Vec vec(ak::simd::Vec x) const { return x * x; }
  double derivative(double x) const { return 2 * x; }
};

template <class Map>
Index features(const Map& map, Index dim) {
  return ak::detail::feature_count(map, dim);
}

// max |a - b| / max(1 or 0, max |b|) over two equally long sequences of values.
template <class A, class B>
double relative(const A& a, const B& b, bool floor_one) {
  double worst = 0, magnitude = floor_one ? 1.0 : 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    magnitude = std::max(magnitude, std::abs(double(b[i])));
  }
  return magnitude > 0 ? worst / magnitude : worst;
}

// Every element of a view, in order (padding left out).
template <class T>
std::vector<double> values(const ak::View<T>& x) {
  std::vector<double> out;
  for (Index b = 0; b < x.batch; ++b)
    for (Index h = 0; h < x.heads; ++h)
      for (Index s = 0; s < x.seq; ++s)
        for (Index c = 0; c < x.dim; ++c) out.push_back(double(x.row(b, h, s)[c]));
  return out;
}

std::vector<double> state_values(const ak::LinearState& st, bool z) {
  std::vector<double> out;
  for (Index b = 0; b < st.batch(); ++b)
    for (Index h = 0; h < st.heads(); ++h)
      for (Index f = 0; f < st.features(); ++f) {
        if (z) out.push_back(double(st.z(b, h, f)));
        for (Index c = 0; c < st.value_dim() && !z; ++c) out.push_back(double(st.s(b, h, f, c)));
      }
  return out;
}

// A state after a random history of `len` tokens (so that every denominator stays > 0).
template <class Map>
F64State history_state_f64(const ak::LinearSpec<Map>& spec, const Case& c, Index len) {
  Tensor<double> q(ak::test::Layout::Bhsd, c.batch, c.q_heads, len, c.dim),
      k(ak::test::Layout::Bhsd, c.batch, c.kv_heads, len, c.dim),
      v(ak::test::Layout::Bhsd, c.batch, c.kv_heads, len, c.dv()),
      o(ak::test::Layout::Bhsd, c.batch, c.q_heads, len, c.dv());
  q.randomize(91, 0.5f);
  k.randomize(92, 0.5f);
  v.randomize(93);
  F64State st(c.batch, c.q_heads, features(spec.map, c.dim), c.dv());
  ak::reference::linear_attention(spec.with_causal(true), q.cview(), k.cview(), v.cview(), o.view,
                                  st);
  return st;
}

// (a) every gradient of the reference against central differences of the forward.
template <class Map>
void check_against_finite_differences(const ak::LinearSpec<Map>& spec, const Case& c) {
  using ak::test::Layout;
  Tensor<double> q(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dim),
      k(Layout::Bhsd, c.batch, c.kv_heads, c.kv_len, c.dim),
      v(Layout::Bhsd, c.batch, c.kv_heads, c.kv_len, c.dv()),
      d_o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv()),
      o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  q.randomize(1, 0.5f);
  k.randomize(2, 0.5f);
  v.randomize(3);
  d_o.randomize(4);
  const Index f = features(spec.map, c.dim);
  F64State s0 = history_state_f64(spec, c, 7), d_out(c.batch, c.q_heads, f, c.dv());
  const std::vector<float> noise = ak::test::normal_values(5, 1.f, d_out.s_data.size() + f * 8);
  for (std::size_t i = 0; i < d_out.s_data.size(); ++i) d_out.s_data[i] = noise[i];
  for (std::size_t i = 0; i < d_out.z_data.size(); ++i)
    d_out.z_data[i] = noise[d_out.s_data.size() + i];
  const auto options = ak::Options{}.with_scale(0.7f);

  const auto loss = [&]() {
    F64State st = s0;
    ak::reference::linear_attention(spec, q.cview(), k.cview(), v.cview(), o.view, st, options);
    double sum = 0;
    for (std::size_t i = 0; i < o.memory.size(); ++i) sum += d_o.memory[i] * o.memory[i];
    for (std::size_t i = 0; i < st.s_data.size(); ++i) sum += d_out.s_data[i] * st.s_data[i];
    for (std::size_t i = 0; i < st.z_data.size(); ++i) sum += d_out.z_data[i] * st.z_data[i];
    return sum;
  };
  const auto numeric = [&](std::vector<double>& x) {
    std::vector<double> grad(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + kStep;
      const double up = loss();
      x[i] = keep - kStep;
      const double down = loss();
      x[i] = keep;
      grad[i] = (up - down) / (2 * kStep);
    }
    return grad;
  };
  Tensor<double> dq(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dim),
      dk(Layout::Bhsd, c.batch, c.kv_heads, c.kv_len, c.dim),
      dv(Layout::Bhsd, c.batch, c.kv_heads, c.kv_len, c.dv());
  F64State ds0(c.batch, c.q_heads, f, c.dv());
  ak::reference::linear_attention_backward(spec, q.cview(), k.cview(), v.cview(), d_o.cview(),
                                           dq.view, dk.view, dv.view, &s0, &d_out, &ds0, options);
  CHECK(relative(dq.memory, numeric(q.memory), true) <= kFiniteDiff);
  CHECK(relative(dk.memory, numeric(k.memory), true) <= kFiniteDiff);
  CHECK(relative(dv.memory, numeric(v.memory), true) <= kFiniteDiff);
  CHECK(relative(ds0.s_data, numeric(s0.s_data), true) <= kFiniteDiff);
  CHECK(relative(ds0.z_data, numeric(s0.z_data), true) <= kFiniteDiff);
}

template <class Map>
void finite_differences_for(const Map& map, Index dim) {
  for (const bool causal : {true, false})
    for (const bool decay : {false, true}) {
      const auto spec = ak::linear_spec(map).with_causal(causal).with_decay(
          decay ? std::vector<float>{0.8f, 0.95f} : std::vector<float>{});
      const Case c = Case{}.heads(2, 1).lengths(causal ? 5 : 4, 6 - (causal ? 1 : 0)).dims(dim, 2);
      INFO((causal ? "causal" : "non-causal") << (decay ? " decay" : ""));
      check_against_finite_differences(spec, c);
    }
}

// The gradients of one fast call and their errors against the reference.
struct GradErrors {
  double dq = 0, dk = 0, dv = 0, ds = 0, dz = 0;
  double worst() const { return std::max({dq, dk, dv, ds, dz}); }
};

template <class T>
struct BackwardRun {
  Tensor<T> q, k, v, d_o, dq, dk, dv;
  ak::LinearState state_in, d_out, d_in;

  template <class Map>
  BackwardRun(const ak::LinearSpec<Map>& spec, const Case& c)
      : q(c.layout, c.batch, c.q_heads, c.q_len, c.dim),
        k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()),
        d_o(c.layout, c.batch, c.q_heads, c.q_len, c.dv()),
        dq(c.layout, c.batch, c.q_heads, c.q_len, c.dim),
        dk(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        dv(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()) {
    q.randomize(11, 0.5f);
    k.randomize(12, 0.5f);
    v.randomize(13);
    d_o.randomize(14);
    // The initial state: the fast forward over a history of 23 tokens.
    Tensor<float> hq(c.layout, c.batch, c.q_heads, 23, c.dim),
        hk(c.layout, c.batch, c.kv_heads, 23, c.dim), hv(c.layout, c.batch, c.kv_heads, 23, c.dv()),
        ho(c.layout, c.batch, c.q_heads, 23, c.dv());
    hq.randomize(15, 0.5f);
    hk.randomize(16, 0.5f);
    hv.randomize(17);
    state_in = ak::make_linear_state(spec, hq.view, hv.view);
    ak::linear_attention(spec.with_causal(true), hq.cview(), hk.cview(), hv.cview(), ho.view,
                         state_in);
    d_out = d_in = ak::make_linear_state(spec, hq.view, hv.view);
    const auto noise = ak::test::normal_values(18, 1.f, d_out.floats().size());
    std::size_t next = 0;
    for (Index b = 0; b < d_out.batch(); ++b)
      for (Index h = 0; h < d_out.heads(); ++h)
        for (Index f = 0; f < d_out.features(); ++f) {
          for (Index e = 0; e < d_out.value_dim(); ++e) d_out.s(b, h, f, e) = noise[next++];
          d_out.z(b, h, f) = noise[next++];
        }
  }

  template <class Map>
  void run(const ak::LinearSpec<Map>& spec, const ak::Options& options) {
    ak::linear_attention_backward(spec, q.cview(), k.cview(), v.cview(), d_o.cview(), dq.view,
                                  dk.view, dv.view, &state_in, &d_out, &d_in, options);
  }

  template <class Map>
  GradErrors errors(const ak::LinearSpec<Map>& spec, const ak::Options& options) const {
    using ak::test::Layout;
    Tensor<double> rq(Layout::Bhsd, q.view.batch, q.view.heads, q.view.seq, q.view.dim),
        rk(Layout::Bhsd, k.view.batch, k.view.heads, k.view.seq, k.view.dim),
        rv(Layout::Bhsd, v.view.batch, v.view.heads, v.view.seq, v.view.dim);
    const F64State s0(state_in), dso(d_out);
    F64State dsi(s0.batch, s0.heads, s0.features, s0.value_dim);
    ak::reference::linear_attention_backward(spec, q.cview(), k.cview(), v.cview(), d_o.cview(),
                                             rq.view, rk.view, rv.view, &s0, &dso, &dsi, options);
    GradErrors e;
    e.dq = relative(values(dq.view), rq.memory, false);
    e.dk = relative(values(dk.view), rk.memory, false);
    e.dv = relative(values(dv.view), rv.memory, false);
    e.ds = relative(state_values(d_in, false), dsi.s_data, false);
    e.dz = relative(state_values(d_in, true), dsi.z_data, false);
    return e;
  }
};

template <class T, class Map>
GradErrors fast_vs_reference(const ak::LinearSpec<Map>& spec, const Case& c) {
  BackwardRun<T> pr(spec, c);
  const auto options = ak::Options{}.with_threads(c.threads).with_scale(0.8f);
  pr.run(spec, options);
  return pr.errors(spec, options);
}

#define CHECK_GRADS(e, bound)                                                              \
  do {                                                                                     \
    const GradErrors e_ = (e);                                                             \
    INFO("dq " << e_.dq << " dk " << e_.dk << " dv " << e_.dv << " dS " << e_.ds << " dz " \
               << e_.dz);                                                                  \
    CHECK(e_.worst() <= (bound));                                                          \
  } while (false)

// (b) every chunk size, causal and not (Lq != Lk), with and without decay, GQA, layouts.
template <class Map>
void check_fast_path(const Map& map, Index dim) {
  int layout = 0;
  for (const bool causal : {true, false})
    for (const bool decay : {false, true})
      for (const Index chunk : {Index{1}, Index{16}, Index{64}}) {
        const auto spec = ak::linear_spec(map).with_causal(causal).with_chunk(chunk).with_decay(
            decay ? kDecay : std::vector<float>{});
        const Case c = Case{}
                           .batches(2)
                           .heads(4, 2)
                           .lengths(causal ? 75 : 37, 75)
                           .dims(dim, 24)
                           .laid_out(ak::test::Layout(layout % 3))
                           .on_threads(1 + layout % 2);
        ++layout;
        INFO((causal ? "causal" : "non-causal")
             << (decay ? " decay" : "") << " chunk " << chunk << " " << ak::test::describe(c));
        CHECK_GRADS(fast_vs_reference<float>(spec, c), kGradF32);
      }
}

// The head dims a feature map is checked at: against finite differences (f64, every element
// perturbed: small) and on the fast path (Taylor2's features grow as d^2).
struct MapDims {
  Index finite_differences, fast_path;
};

// Each feature map, the built-in ones and a user map with only a derivative, with its name.
template <class Visit>
void for_each_map(Visit&& visit) {
  visit("EluPlusOne", ak::EluPlusOne{}, MapDims{3, 16});
  visit("Relu", ak::Relu{}, MapDims{4, 16});
  visit("Identity", ak::Identity{}, MapDims{3, 16});
  visit("Taylor2", ak::Taylor2{}, MapDims{3, 5});
  visit("a user map (derivative only)", Square{}, MapDims{3, 16});
}

}  // namespace

TEST_CASE("reference::linear_attention_backward: every feature map equals finite differences",
          "[linear][backward]") {
  for_each_map([](const char* name, const auto& map, MapDims dims) {
    DYNAMIC_SECTION(name) { finite_differences_for(map, dims.finite_differences); }
  });
}

TEST_CASE("linear_attention_backward: every feature map equals the f64 reference",
          "[linear][backward]") {
  for_each_map([](const char* name, const auto& map, MapDims dims) {
    DYNAMIC_SECTION(name) { check_fast_path(map, dims.fast_path); }
  });
}

TEST_CASE("linear_attention_backward: bf16 and f16 storage, MQA, the recurrent spec",
          "[linear][backward]") {
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay).with_chunk(16);
  const Case c = Case{}.batches(2).heads(4, 2).lengths(75, 75).dims(16, 24);
  CHECK_GRADS(fast_vs_reference<Eigen::bfloat16>(spec, c), tol::kBf16);
  CHECK_GRADS(fast_vs_reference<Eigen::half>(spec, c), tol::kHalf);
  CHECK_GRADS(fast_vs_reference<Eigen::half>(spec.with_causal(false), Case(c).lengths(30, 75)),
              tol::kHalf);
  CHECK_GRADS(fast_vs_reference<float>(spec, Case(c).heads(4, 1)), kGradF32);  // MQA
  CHECK_GRADS(fast_vs_reference<float>(spec.with_form(ak::LinearForm::Recurrent), c), kGradF32);
  CHECK_GRADS(fast_vs_reference<float>(spec.with_chunk(32), Case(c).dims(64, 64)), kGradF32);
}

TEST_CASE("linear_attention_backward: thread counts 1 to 4 change no bit", "[linear][backward]") {
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay).with_chunk(16);
  const Case c = Case{}.batches(2).heads(4, 2).lengths(75, 75).dims(16, 24);
  std::vector<std::vector<float>> runs;
  for (const int threads : {1, 2, 3, 4}) {
    BackwardRun<float> pr(spec, c);
    pr.run(spec, ak::Options{}.with_threads(threads));
    std::vector<float> all = pr.dq.memory;
    for (const std::vector<float>* part : std::initializer_list<const std::vector<float>*>{
             &pr.dk.memory, &pr.dv.memory, &pr.d_in.floats()})
      all.insert(all.end(), part->begin(), part->end());
    runs.push_back(all);
  }
  for (std::size_t t = 1; t < runs.size(); ++t) {
    INFO("threads " << t + 1);
    CHECK(std::memcmp(runs[0].data(), runs[t].data(), runs[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("linear_attention_backward: two chained calls equal the reference over the whole",
          "[linear][backward]") {
  // The forward as two calls, [0, 40) then [40, 75); the backward in reverse, the second
  // call's d_state_in feeding the first call's d_state_out.
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay).with_chunk(16);
  const Case c = Case{}.batches(2).heads(4, 2).lengths(75, 75).dims(16, 24);
  BackwardRun<float> whole(spec, c);
  const auto rows = [](auto x, Index from, Index count) {
    auto part = x;
    part.data = x.row(0, 0, from);
    part.seq = count;
    return part;
  };
  ak::LinearState middle = whole.state_in;  // the state between the two calls
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, c.dv());
  ak::linear_attention(spec, rows(whole.q.cview(), 0, 40), rows(whole.k.cview(), 0, 40),
                       rows(whole.v.cview(), 0, 40), rows(o.view, 0, 40), middle);
  ak::LinearState d_middle = whole.d_in;
  const auto backward = [&](Index from, Index count, const ak::LinearState& start,
                            const ak::LinearState& d_end, ak::LinearState& d_start) {
    ak::linear_attention_backward(
        spec, rows(whole.q.cview(), from, count), rows(whole.k.cview(), from, count),
        rows(whole.v.cview(), from, count), rows(whole.d_o.cview(), from, count),
        rows(whole.dq.view, from, count), rows(whole.dk.view, from, count),
        rows(whole.dv.view, from, count), &start, &d_end, &d_start);
  };
  backward(40, 35, middle, whole.d_out, d_middle);
  backward(0, 40, whole.state_in, d_middle, whole.d_in);
  CHECK_GRADS(whole.errors(spec, ak::Options{}), kGradF32);
}

TEST_CASE("linear_attention_backward: no query, or only keys (non-causal)", "[linear][backward]") {
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_decay(kDecay);
  // No token: the state's gradient passes through unchanged.
  BackwardRun<float> empty(spec, Case{}.batches(2).heads(4, 2).lengths(0, 0).dims(16, 24));
  empty.run(spec, ak::Options{});
  CHECK(empty.d_in.floats() == empty.d_out.floats());
  // Non-causal without queries: dk, dv and d_state_in come from d_state_out alone.
  const auto encoder = spec.with_causal(false);
  BackwardRun<float> keys(encoder, Case{}.batches(2).heads(4, 2).lengths(0, 50).dims(16, 24));
  keys.run(encoder, ak::Options{});
  CHECK_GRADS(keys.errors(encoder, ak::Options{}), kGradF32);
}

TEST_CASE("linear_attention_backward: bad inputs throw Error before anything is written",
          "[linear][backward][errors]") {
  const auto spec = ak::linear_spec(ak::EluPlusOne{});
  const Case c = Case{}.batches(2).heads(4, 2).lengths(30, 30).dims(16, 24);
  BackwardRun<float> run(spec, c);
  const auto q = run.q.cview(), k = run.k.cview(), v = run.v.cview(), d_o = run.d_o.cview();
  using ak::test::Layout;
  const auto refused = [&](const auto& call, std::initializer_list<const char*> parts) {
    run.dq.fill(42.f);
    run.dk.fill(42.f);
    run.dv.fill(42.f);
    for (Index b = 0; b < c.batch; ++b)  // a sentinel where d_state_in's values go
      for (Index h = 0; h < c.q_heads; ++h) run.d_in.s(b, h, 0, 0) = run.d_in.z(b, h, 0) = 7.f;
    const std::vector<float> before = run.d_in.floats();
    ak::test::check_refused(call, parts, {&run.dq.memory, &run.dk.memory, &run.dv.memory});
    CHECK(before == run.d_in.floats());
  };
  const auto with = [&](const auto& s, auto dq, auto dk, auto dv, const ak::Options& o = {}) {
    return [&, s, dq, dk, dv, o] {
      ak::linear_attention_backward(s, q, k, v, d_o, dq, dk, dv, &run.state_in, &run.d_out,
                                    &run.d_in, o);
    };
  };
  const auto dq = run.dq.view, dk = run.dk.view, dv = run.dv.view;
  SECTION("shapes") {
    auto short_dq = dq;
    short_dq.seq = 29;
    refused(with(spec, short_dq, dk, dv), {"dq.seq", "30 (q.seq)", "29"});
    Tensor<float> wide(Layout::Bhsd, c.batch, c.q_heads, c.kv_len, c.dim);
    refused(with(spec, dq, wide.view, dv), {"dk.heads", "2 (k.heads)", "4"});
    auto narrow_dv = dv;
    narrow_dv.dim = 23;
    refused(with(spec, dq, dk, narrow_dv), {"dv.dim", "24 (v.dim)", "23"});
    auto short_d_o = d_o;
    short_d_o.seq = 10;
    refused([&] { ak::linear_attention_backward(spec, q, k, v, short_d_o, dq, dk, dv); },
            {"d_o.seq", "30 (q.seq)", "10"});
  }
  SECTION("an Options::products value that is no mode, as every other entry point refuses") {
    refused(with(spec, dq, dk, dv, ak::Options{}.with_products(static_cast<ak::Products>(5))),
            {"products: expected Products::Exact, Bf16 or Int8", "got 5"});
  }
  SECTION("aliasing") {
    refused(with(spec, run.q.view, dk, dv), {"dq", "memory disjoint from q"});
    auto dq_over_d_o = dq;
    dq_over_d_o.data = run.d_o.view.data;
    refused(with(spec, dq_over_d_o, dk, dv), {"dq", "memory disjoint from d_o"});
    // dk and dv in one buffer, overlapping by 100 floats.
    const Index dk_floats = c.batch * c.kv_heads * c.kv_len * c.dim;
    std::vector<float> shared(std::size_t(dk_floats + c.batch * c.kv_heads * c.kv_len * c.dv()),
                              42.f);
    const auto dk_shared = ak::bhsd(shared.data(), c.batch, c.kv_heads, c.kv_len, c.dim);
    const auto dv_shared =
        ak::bhsd(shared.data() + dk_floats - 100, c.batch, c.kv_heads, c.kv_len, c.dv());
    ak::test::check_refused(with(spec, dq, dk_shared, dv_shared),
                            {"dk", "memory disjoint from dv", "400 bytes"}, {&shared});
  }
  SECTION("states") {
    const auto call = [&](const ak::LinearState* s_in, const ak::LinearState* d_out,
                          ak::LinearState* d_in) {
      return [&, s_in, d_out, d_in] {
        ak::linear_attention_backward(spec, q, k, v, d_o, dq, dk, dv, s_in, d_out, d_in);
      };
    };
    const ak::LinearState few_features(c.batch, c.q_heads, c.dim - 1, c.dv());
    refused(call(&few_features, nullptr, nullptr), {"state_in.features", "16", "15"});
    const ak::LinearState kv_heads(c.batch, c.kv_heads, c.dim, c.dv());
    refused(call(nullptr, &kv_heads, nullptr), {"d_state_out.heads", "4 (q.heads)", "2"});
    ak::LinearState narrow(c.batch, c.q_heads, c.dim, c.dv() - 1);
    refused(call(nullptr, nullptr, &narrow), {"d_state_in.value_dim", "24 (v.dim)", "23"});
    refused(call(&run.d_in, nullptr, &run.d_in), {"d_state_in", "memory disjoint from state_in"});
    refused(call(nullptr, &run.d_in, &run.d_in),
            {"d_state_in", "memory disjoint from d_state_out"});
    // A gradient view into the memory of a state the call reads.
    ak::LinearState one(1, 1, c.dim, c.dv());
    auto q1 = q, k1 = k, v1 = v, d_o1 = d_o;
    auto dq1 = ak::bhsd(one.head(0, 0), 1, 1, 1, c.dim);
    auto dk1 = dk, dv1 = dv;
    for (auto* x : {&q1, &k1, &v1, &d_o1}) x->batch = x->heads = x->seq = 1;
    for (auto* x : {&dk1, &dv1}) x->batch = x->heads = x->seq = 1;
    refused(
        [&] {
          ak::linear_attention_backward(spec, q1, k1, v1, d_o1, dq1, dk1, dv1, &one, nullptr,
                                        nullptr);
        },
        {"dq", "memory disjoint from state_in"});
    CHECK(ak::test::all_equal_to(one.floats(), 0.f));
  }
  SECTION("spec and options") {
    refused(with(spec.with_decay({0.5f}), dq, dk, dv), {"decay", "one gamma per query head"});
    refused(with(spec.with_decay({1, 1, 1.5f, 1}), dq, dk, dv), {"decay", "[0, 1]", "1.5"});
    refused(with(spec.with_chunk(0), dq, dk, dv), {"chunk", "1 to 4096", "0"});
    refused(with(spec.with_normalize(true, -1.f), dq, dk, dv), {"eps", ">= 0", "-1"});
    refused(with(spec, dq, dk, dv, ak::Options{}.with_q_offset(3)), {"Options.q_offset", "3"});
    std::vector<float> lse(std::size_t(c.rows()));
    refused(with(spec, dq, dk, dv, ak::Options{}.with_lse(lse)), {"lse", "nullptr"});
    refused(with(spec, dq, dk, dv, ak::Options{}.with_scale(0.f)), {"scale", "non-zero"});
    auto short_q = q;
    short_q.seq = 10;
    auto short_dq = dq;
    short_dq.seq = 10;
    auto short_d_o = d_o;
    short_d_o.seq = 10;
    refused(
        [&] { ak::linear_attention_backward(spec, short_q, k, v, short_d_o, short_dq, dk, dv); },
        {"k.seq", "10 (q.seq: causal linear attention)", "30"});
  }
}
