// decode() and attention() at decode shapes (Lq <= 16 against up to 3000 keys, so one to six
// split-KV chunks of kDecodeChunk = 512, with the chunk edges 511 / 512 / 513 hit) against
// reference::attention(): every one-pass normalizer (Softmax, with sinks, Sigmoid, ReluPower,
// SoftplusL1), the masks Full, Causal, Causal & SlidingWindow, Causal & (Sinks | window) and a
// BlockMask, the positions Rope, Fope and Tapa, the score mods Softcap and Alibi, GQA groups
// of 1, 4 and 8, K/V stored f32 / bf16 / f16 (the f64 reference reads the same rounded
// values, so the error stays at f32 level), row statistics (LSE, l1 sums) included. Then:
// output and LSE bitwise identical for 1..4 threads; q_len > 16 refused before writing; keys
// holding NaN that the mask removes (whole chunks or part of one) leave no trace.
// The compile-time refusal of LSSAR is tests/compile_fail/decode_lssar.cpp.
// Built three times: native ISA, x86-64-v2, scalar.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/position/fope.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/alibi.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "support/attention_runner.hpp"

namespace ak = attnkit;
using ak::Causal;
using ak::Index;
using ak::Sinks;
using ak::SlidingWindow;
using ak::test::Case;
using ak::test::Layout;
using ak::test::Tensor;
namespace tol = ak::test::tol;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Row sums (SoftplusL1's l1 statistic) are sums of up to Lk positive f32 terms: relative.
constexpr double kRowSumRel = 1e-5;

enum class Call { Decode, Attention };

std::string describe(const Case& c, Call call) {
  std::ostringstream s;
  s << (call == Call::Decode ? "decode()" : "attention()") << " B" << c.batch << " Hq" << c.q_heads
    << " Hkv" << c.kv_heads << " Lq" << c.q_len << " Lk" << c.kv_len << " d" << c.dim << " "
    << ak::test::name(c.layout) << " threads " << c.threads;
  return s.str();
}

template <class T>
const char* storage_name() {
  return std::is_same_v<T, float> ? "f32" : std::is_same_v<T, Eigen::bfloat16> ? "bf16" : "f16";
}

template <class N>
constexpr bool is_sigmoid() {
  return std::is_same_v<N, ak::Sigmoid>;
}

// Q in f32, K and V (and |V|) in storage T: the f64 reference reads the same rounded values.
template <class T>
struct Inputs {
  Tensor<float> q;
  Tensor<T> k, v, v_abs;
  Inputs(const Case& c, std::uint32_t seed)
      : q(c.layout, c.batch, c.q_heads, c.q_len, c.dim),
        k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()),
        v_abs(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()) {
    q.randomize(seed, c.stddev);
    k.randomize(seed + 1, c.stddev);
    v.randomize(seed + 2);
    v_abs.randomize(seed + 2);
    v_abs.for_each([](T& x) { x = T(std::abs(float(x))); });
  }
};

template <class Spec, class Q, class K, class V, class O>
void run(Call call, const Spec& spec, const ak::View<Q>& q, const ak::View<K>& k,
         const ak::View<V>& v, const ak::View<O>& o, const ak::Options& options) {
  if (call == Call::Decode)
    ak::decode(spec, q, k, v, o, options);
  else
    ak::attention(spec, q, k, v, o, options);
}

// The call against the reference on one Case. Normalized rules: absolute tol::kF32. Sigmoid
// (an unnormalized sum of up to Lk terms): tol::kF32 times sum_j w_ij |v_j|, at least 1.
// Rows that see no key: exactly 0, with the empty statistic equal to the reference's.
template <class T = float, class Spec>
void check(const std::string& what, const Spec& spec, const Case& c, Call call,
           std::uint32_t seed = 11) {
  using N = typename Spec::Normalizer;
  constexpr bool kHasStat = ak::detail::row_stat_kind<N>() != ak::RowStat::None;
  constexpr bool kSum = ak::detail::row_stat_kind<N>() == ak::RowStat::Sum;
  INFO(what << ", " << describe(c, call) << ", K/V " << storage_name<T>());
  const Inputs<T> in(c, seed);
  const Index dv = c.dv();
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, dv);
  Tensor<double> expected(Layout::Bhsd, c.batch, c.q_heads, c.q_len, dv);
  Tensor<double> magnitude(Layout::Bhsd, c.batch, c.q_heads, c.q_len, dv);
  const auto rows = static_cast<std::size_t>(c.rows());
  std::vector<float> stat(rows, 42.f), stat_expected(rows, 42.f);
  ak::Options options = c.options(), ref_options = c.options();
  if constexpr (kHasStat) {
    options = options.with_lse(stat.data());
    ref_options = ref_options.with_lse(stat_expected.data());
  }
  run(call, spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), expected.view,
                           ref_options);
  if constexpr (is_sigmoid<N>())
    ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v_abs.cview(), magnitude.view,
                             c.options());

  double worst = 0.0, worst_stat = 0.0;  // error / allowed error
  bool empty_exact = true;
  Index empty = 0;
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index r = 0; r < c.q_len; ++r) {
        const float* got = o.view.row(b, h, r);
        const double* want = expected.view.row(b, h, r);
        bool zero_row = true;
        for (Index x = 0; x < dv; ++x) {
          const double allowed =
              tol::kF32 * (is_sigmoid<N>() ? std::max(1.0, magnitude.view.row(b, h, r)[x]) : 1.0);
          const double d = std::abs(double(got[x]) - want[x]);
          worst = std::isnan(d) ? HUGE_VAL : std::max(worst, d / allowed);
          zero_row = zero_row && want[x] == 0.0;
        }
        if constexpr (kHasStat) {
          const auto at = static_cast<std::size_t>((b * c.q_heads + h) * c.q_len + r);
          const double e = stat_expected[at], g = stat[at];
          double d = e == g ? 0.0 : std::abs(g - e);
          if constexpr (kSum)
            d /= kRowSumRel * std::max(1.0, std::abs(e));
          else
            d /= tol::kLseF32 + std::numeric_limits<float>::epsilon() * std::abs(e);
          worst_stat = std::isnan(d) ? HUGE_VAL : std::max(worst_stat, d);
          const bool empty_row = kSum ? e == 0.0 : e == double(kNegInf);
          if (empty_row) {
            ++empty;
            empty_exact = empty_exact && zero_row &&
                          std::all_of(got, got + dv, [](float x) { return x == 0.f; });
          }
        }
      }
  INFO("rows that see no key: " << empty);
  CHECK(worst <= 1.0);
  CHECK(worst_stat <= 1.0);
  CHECK(empty_exact);
}

template <class Visit>
void for_each_normalizer(Index heads, Visit&& visit) {
  std::vector<float> sinks;
  for (Index h = 0; h < heads; ++h) sinks.push_back(float(h % 3) - 1.f);  // -1, 0, 1
  visit("Softmax", ak::Softmax{});
  visit("Softmax::with_sinks", ak::Softmax::with_sinks(sinks));
  visit("Sigmoid{} (-log Lk)", ak::Sigmoid{});
  visit("ReluPower{1.5, 0.3}", ak::ReluPower{1.5f, 0.3f});
  visit("SoftplusL1", ak::SoftplusL1{});
}

// The masks of the grid for q_len queries at the end of kv_len keys.
template <class N, class Visit>
void for_each_mask(const N& n, Index q_len, Index kv_len, Visit&& visit) {
  visit("Full", ak::make_spec(n));
  visit("Causal", ak::make_spec(Causal{}, n));
  visit("Causal & SlidingWindow{600, 0}", ak::make_spec(Causal{} & SlidingWindow{600, 0}, n));
  visit("Causal & (Sinks{4} | SlidingWindow{300, 0})",
        ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{300, 0}), n));
  visit("BlockMask(Causal & (Sinks{64} | SlidingWindow{700, 0}), 16 x 128)",
        ak::make_spec(ak::make_block_mask(Causal{} & (Sinks{64} | SlidingWindow{700, 0}), q_len,
                                          kv_len, 16, 128),
                      n));
}

Case decode_case(Index q_len, Index kv_len, Index q_heads, Index kv_heads, Index dim = 32,
                 int threads = 2) {
  Case c;
  c.q_len = q_len;
  c.kv_len = kv_len;
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.dim = dim;
  c.threads = threads;
  c.layout = Layout::Bhsd;
  return c;
}

}  // namespace

TEST_CASE("decode: every decode shape and GQA group matches the reference", "[decode]") {
  const Index q_lens[] = {1, 2, 3, 4, 5, 16};
  const Index kv_lens[] = {1, 511, 512, 513, 1500, 3000};
  struct Heads {
    Index q, kv;
  };
  const Heads heads[] = {{2, 2}, {4, 1}, {8, 1}};  // groups of 1, 4 and 8
  for (const Index lq : q_lens)
    for (const Index lk : kv_lens)
      for (const Heads& h : heads) {
        if (lq > lk) continue;  // bottom-right: the first rows would see no key at all
        Case c = decode_case(lq, lk, h.q, h.kv);
        c.layout = lq % 2 == 0 ? Layout::Bshd : Layout::Padded;
        check("Softmax, Causal", ak::make_spec(Causal{}), c, Call::Decode);
        check("Softmax, Causal", ak::make_spec(Causal{}), c, Call::Attention);
      }
  // Lq > Lk: the first queries see nothing under Causal (exact zero rows, LSE -inf).
  check("Softmax, Causal, Lq > Lk", ak::make_spec(Causal{}), decode_case(16, 5, 4, 1),
        Call::Decode);
  check("SoftplusL1, Causal, Lq > Lk", ak::make_spec(Causal{}, ak::SoftplusL1{}),
        decode_case(16, 5, 4, 1), Call::Decode);
  // batch > 1 and Dv != D
  Case c = decode_case(3, 1300, 4, 2);
  c.batch = 2;
  c.value_dim = 24;
  check("Softmax, Full, B2 Dv24", ak::make_spec(), c, Call::Decode);
}

// Softmax decode runs on the row engine (kernel/decode_rows.hpp): queries kept in registers
// for 2, 4 or 8 whole vectors of head dims (else loaded, with a scalar tail), two rows of a
// KV group sharing each K/V load when both see a whole key block, value slabs of 1 to 8
// vectors plus a scalar tail. These shapes reach each of those paths on every SIMD width:
// odd groups (a row left over after the pairs), queries of one head whose blocks differ
// (Partial on the diagonal, Empty outside a window) and K/V widened in registers (bf16 two
// vectors at a time, in an order of their own: value dim 48 leaves a vector without its pair
// at 16 lanes, 136 at 8; 24 and 136 leave a scalar tail at 16 lanes).
TEST_CASE("decode: the softmax row engine over head dims, value dims and group sizes", "[decode]") {
  struct Heads {
    Index q, kv;
  };
  for (const Index d : {8, 16, 40, 64, 128, 256})  // 256: more query vectors than registers
    for (const Index dv : {Index{0}, Index{24}, Index{48}, Index{136}})
      for (const Heads& h : {Heads{3, 1}, Heads{4, 2}})
        for (const Index lq : {1, 2}) {
          Case c = decode_case(lq, 700, h.q, h.kv, d);
          c.value_dim = dv;
          c.layout = d == 40 ? Layout::Padded : Layout::Bshd;
          check("Softmax, Causal", ak::make_spec(Causal{}), c, Call::Decode);
          if (lq == 1)
            check<Eigen::bfloat16>("Softmax, Causal", ak::make_spec(Causal{}), c, Call::Decode);
          if (d == 64 && dv == 0) {
            check("Softmax, Causal & SlidingWindow{100, 0}",
                  ak::make_spec(Causal{} & SlidingWindow{100, 0}), c, Call::Decode);
            check("Softmax, Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}), c,
                  Call::Decode);
            check<Eigen::half>("Softmax, Causal", ak::make_spec(Causal{}), c, Call::Decode);
          }
        }
}

TEST_CASE("decode: each normalizer under each mask matches the reference", "[decode]") {
  for (const Index lq : {1, 5, 16})
    for (const Index lk : {513, 1500}) {
      const Case c = decode_case(lq, lk, 4, 1);
      for_each_normalizer(c.q_heads, [&](const char* nname, const auto& n) {
        for_each_mask(n, lq, lk, [&](const char* mname, const auto& spec) {
          const std::string what = std::string(nname) + ", " + mname;
          check(what, spec, c, Call::Decode);
          if (lk == 1500) check(what, spec, c, Call::Attention);
        });
      });
    }
}

TEST_CASE("decode: score mods and positions match the reference", "[decode]") {
  for (const Index lq : {1, 16}) {
    const Case c = decode_case(lq, 1500, 4, 2, 32);
    for_each_normalizer(c.q_heads, [&](const char* nname, const auto& n) {
      const std::string s(nname);
      check(s + ", Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}, n), c,
            Call::Decode);
      if constexpr (!ak::detail::cosine_logits<std::decay_t<decltype(n)>>())  // see below
        check(s + ", Causal, Alibi::standard", ak::make_spec(Causal{}, ak::Alibi::standard(4), n),
              c, Call::Decode);
      check(s + ", Causal, Rope",
            ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(32, 10000, 2048)), n), c, Call::Decode);
      check(s + ", Causal & SlidingWindow, Rope",
            ak::make_spec(Causal{} & SlidingWindow{700, 0},
                          ak::Rope(ak::RopeTable(16, 500000, 2048)), n),
            c, Call::Attention);
      if constexpr (!ak::detail::cosine_logits<std::decay_t<decltype(n)>>())
        check(s + ", Causal, Tapa", ak::make_spec(Causal{}, ak::Tapa{}, n), c, Call::Decode);
    });
    ak::FopeConfig fc{32, 2048, 1000};
    fc.kv_heads = 2;
    fc.q_heads = 4;
    const ak::Fope fope = ak::Fope::drawn(fc, 0.3, 3);
    check("Softmax, Causal, Fope", ak::make_spec(Causal{}, fope), c, Call::Decode);
    check("SoftplusL1, Causal, Fope", ak::make_spec(Causal{}, fope, ak::SoftplusL1{}), c,
          Call::Attention);
  }
}

// SoftplusL1 with Alibi: far chunks weigh e^-100 and less. The scalar exp2 once returned
// subnormals there (the SIMD one flushes to 0 at -127), so a chunk's row sum could be
// subnormal, 1 / sum infinite and that chunk's partial output -inf (found on the scalar build:
// Lq 1, Lk 1500, Hq 4 / Hkv 2, d 32, head 3). Both paths now share the flush.
TEST_CASE("decode: SoftplusL1 with Alibi matches the reference", "[decode]") {
  for (const Index lq : {1, 16})
    check("SoftplusL1, Causal, Alibi::standard",
          ak::make_spec(Causal{}, ak::Alibi::standard(4), ak::SoftplusL1{}),
          decode_case(lq, 1500, 4, 2, 32), Call::Decode);
}

TEST_CASE("decode: bf16 and f16 K/V stay at f32 accuracy against the rounded inputs", "[decode]") {
  for (const Index lq : {1, 16})
    for (const Index lk : {512, 3000}) {
      const Case c = decode_case(lq, lk, 8, 1, 32);
      for_each_normalizer(c.q_heads, [&](const char* nname, const auto& n) {
        const std::string s(nname);
        const auto spec = ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{1000, 0}), n);
        check<float>(s + ", sinks | window", spec, c, Call::Decode);
        check<Eigen::bfloat16>(s + ", sinks | window", spec, c, Call::Decode);
        check<Eigen::half>(s + ", sinks | window", spec, c, Call::Decode);
      });
      const auto rope = ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(32, 10000, 4096)));
      check<Eigen::bfloat16>("Softmax, Causal, Rope", rope, c, Call::Attention);
      check<Eigen::half>("Softmax, Causal, Rope", rope, c, Call::Attention);
    }
}

namespace {

// Output and LSE bytes of one call with `threads` threads.
template <class T, class Spec>
std::vector<unsigned char> bytes_of(const Spec& spec, Case c, int threads, Call call) {
  c.threads = threads;
  const Inputs<T> in(c, 5);
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  std::vector<float> stat(static_cast<std::size_t>(c.rows()), 42.f);
  ak::Options options = c.options();
  if constexpr (ak::detail::row_stat_kind<typename Spec::Normalizer>() != ak::RowStat::None)
    options = options.with_lse(stat.data());
  run(call, spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
  std::vector<unsigned char> out(o.memory.size() * sizeof(float) + stat.size() * sizeof(float));
  std::memcpy(out.data(), o.memory.data(), o.memory.size() * sizeof(float));
  std::memcpy(out.data() + o.memory.size() * sizeof(float), stat.data(),
              stat.size() * sizeof(float));
  return out;
}

}  // namespace

TEST_CASE("decode: output and LSE are bitwise identical for 1..4 threads", "[decode]") {
  const Case cases[] = {decode_case(1, 3000, 8, 1, 64), decode_case(4, 1500, 4, 2, 64),
                        decode_case(16, 2049, 2, 2, 64)};
  for (const Case& c : cases)
    for (const Call call : {Call::Decode, Call::Attention})
      for_each_normalizer(c.q_heads, [&](const char* nname, const auto& n) {
        const auto spec = ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{1100, 0}), n);
        INFO(nname << ", " << describe(c, call));
        const auto one = bytes_of<Eigen::half>(spec, c, 1, call);
        for (int t = 2; t <= 4; ++t) {
          INFO("threads " << t);
          CHECK(bytes_of<Eigen::half>(spec, c, t, call) == one);
        }
        const auto rope = ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(64, 10000, 4096)), n);
        const auto rope_one = bytes_of<float>(rope, c, 1, call);
        for (int t = 2; t <= 4; ++t) CHECK(bytes_of<float>(rope, c, t, call) == rope_one);
      });
}

TEST_CASE("decode: q_len > 16 is an Error before anything is written", "[decode]") {
  const Case c = decode_case(17, 1500, 2, 1);
  const Inputs<float> in(c, 3);
  Tensor<float> o(Layout::Bhsd, 1, 2, 17, 32);
  std::fill(o.memory.begin(), o.memory.end(), 42.f);
  std::vector<float> lse(static_cast<std::size_t>(c.rows()), 42.f);
  CHECK_THROWS_MATCHES(
      ak::decode(ak::make_spec(Causal{}), in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                 c.options().with_lse(lse.data())),
      ak::Error, Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring("q_len")));
  CHECK(std::all_of(o.memory.begin(), o.memory.end(), [](float x) { return x == 42.f; }));
  CHECK(std::all_of(lse.begin(), lse.end(), [](float x) { return x == 42.f; }));
  // attention() takes the same shape (tiled path) and agrees with the reference.
  check("Softmax, Causal, Lq 17 through attention()", ak::make_spec(Causal{}), c, Call::Attention);
}

namespace {

// The call on keys where `poison(j)` holds NaN in K and V, against the same call with those
// keys finite: a masked key must not change a single bit (it never enters a sum).
template <class Spec, class Poison>
void check_masked_nan(const std::string& what, const Spec& spec, const Case& c, Call call,
                      Poison poison) {
  INFO(what << ", " << describe(c, call));
  using N = typename Spec::Normalizer;
  constexpr bool kHasStat = ak::detail::row_stat_kind<N>() != ak::RowStat::None;
  Inputs<float> clean(c, 21), dirty(c, 21);
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.kv_heads; ++h)
      for (Index j = 0; j < c.kv_len; ++j) {
        if (!poison(j)) continue;
        std::fill(dirty.k.view.row(b, h, j), dirty.k.view.row(b, h, j) + c.dim, kNaN);
        std::fill(dirty.v.view.row(b, h, j), dirty.v.view.row(b, h, j) + c.dv(), kNaN);
      }
  Tensor<float> o_clean(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  Tensor<float> o_dirty(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  std::vector<float> s_clean(static_cast<std::size_t>(c.rows())), s_dirty(s_clean.size());
  ak::Options oc = c.options(), od = c.options();
  if constexpr (kHasStat) {
    oc = oc.with_lse(s_clean.data());
    od = od.with_lse(s_dirty.data());
  }
  run(call, spec, clean.q.cview(), clean.k.cview(), clean.v.cview(), o_clean.view, oc);
  run(call, spec, dirty.q.cview(), dirty.k.cview(), dirty.v.cview(), o_dirty.view, od);
  CHECK(std::none_of(o_dirty.memory.begin(), o_dirty.memory.end(),
                     [](float x) { return std::isnan(x); }));
  CHECK(std::memcmp(o_clean.memory.data(), o_dirty.memory.data(),
                    o_clean.memory.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(s_clean.data(), s_dirty.data(), s_clean.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("decode: NaN keys the mask removes do not leak into the result", "[decode]") {
  for (const Index lq : {1, 4})
    for (const Call call : {Call::Decode, Call::Attention}) {
      const Case c = decode_case(lq, 1500, 4, 1);
      for_each_normalizer(c.q_heads, [&](const char* nname, const auto& n) {
        const std::string s(nname);
        // Window of the last ~300 keys: chunks 0 and 1 whole, chunk 2 up to 1190 poisoned.
        check_masked_nan(s + ", window: chunks 0-1 and part of 2 NaN",
                         ak::make_spec(Causal{} & SlidingWindow{300, 0}, n), c, call,
                         [](Index j) { return j < 1190; });
        // Sinks 0..3 kept, the gap between them and the window poisoned (chunk 0 partly).
        check_masked_nan(s + ", sinks | window: the gap NaN",
                         ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{300, 0}), n), c, call,
                         [](Index j) { return j >= 4 && j < 1190; });
        // Future keys (beyond the causal limit) poisoned: q_offset puts the queries earlier.
        Case early = c;
        early.q_offset = 700;
        check_masked_nan(s + ", causal, keys after the queries NaN", ak::make_spec(Causal{}, n),
                         early, call, [&](Index j) { return j >= 700 + lq; });
      });
    }
}
