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
// Built for the native ISA and x86-64-v2 (ATTNKIT_PATH_TESTS; the aarch64 preset too).
// The engine under test is kernel/split_kv.hpp (chunks, items, the merge of the parts).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/position/fope.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/score/alibi.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catalogue.hpp"
#include "support/error_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::test::for_each_normalizer;  // every normalizer decode() takes: OnePass
using ak::test::OnePass;
using ak::test::under;

namespace {

enum class Call { Decode, Attention };

const char* name(Call call) { return call == Call::Decode ? "decode()" : "attention()"; }

// The call of check() as a type: a check instantiates only the entry point it runs (most specs
// here go through decode() alone; instantiating attention() for them too cost compile time).
template <Call kCall>
using CallOf = std::integral_constant<Call, kCall>;
constexpr CallOf<Call::Decode> kDecode{};
constexpr CallOf<Call::Attention> kAttention{};

// Q in f32, K and V (and |V|) in storage T: the f64 reference reads the same rounded values.
template <class T>
using Inputs = ak::test::Inputs<T, float>;

template <class Spec, class Q, class K, class V, class O>
void run(Call call, const Spec& spec, const ak::View<Q>& q, const ak::View<K>& k,
         const ak::View<V>& v, const ak::View<O>& o, const ak::Options& options) {
  if (call == Call::Decode)
    ak::decode(spec, q, k, v, o, options);
  else
    ak::attention(spec, q, k, v, o, options);
}

// The call against the reference on one Case, with the named tolerances of
// support/reference_check.hpp (normalized rules absolute, Sigmoid per unit of magnitude, row
// sums relative); rows that see no key exactly 0 with the empty statistic.
template <class T = float, class Spec, Call kCall>
void check(const std::string& what, const Spec& spec, const Case& c, CallOf<kCall> call,
           std::uint32_t seed = 11) {
  INFO(what << ", " << name(call) << " " << ak::test::describe(c) << ", K/V "
            << ak::test::storage_name<T>());
  const Inputs<T> in(c, seed);
  if constexpr (kCall == Call::Attention) {
    ak::test::check_attention_on(spec, c, in);
  } else {
    ak::test::check_agreement(
        ak::test::agreement(spec, c, in, [&](const ak::View<float>& o, const ak::Options& options) {
          ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
        }));
  }
}

Case decode_case(Index q_len, Index kv_len, Index q_heads, Index kv_heads, Index dim = 32,
                 int threads = 2) {
  return Case{}
      .lengths(q_len, kv_len)
      .heads(q_heads, kv_heads)
      .dims(dim)
      .laid_out(Layout::Bhsd)
      .on_threads(threads);
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
        check("Softmax, Causal", ak::make_spec(Causal{}), c, kDecode);
        check("Softmax, Causal", ak::make_spec(Causal{}), c, kAttention);
      }
  // Lq > Lk: the first queries see nothing under Causal (exact zero rows, LSE -inf).
  check("Softmax, Causal, Lq > Lk", ak::make_spec(Causal{}), decode_case(16, 5, 4, 1), kDecode);
  check("SoftplusL1, Causal, Lq > Lk", ak::make_spec(Causal{}, ak::SoftplusL1{}),
        decode_case(16, 5, 4, 1), kDecode);
  // batch > 1 and Dv != D
  Case c = decode_case(3, 1300, 4, 2);
  c.batch = 2;
  c.value_dim = 24;
  check("Softmax, Full, B2 Dv24", ak::make_spec(), c, kDecode);
}

// Softmax decode runs on the row engine (kernel/decode/decode_rows.hpp): queries kept in registers
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
          check("Softmax, Causal", ak::make_spec(Causal{}), c, kDecode);
          if (lq == 1)
            check<Eigen::bfloat16>("Softmax, Causal", ak::make_spec(Causal{}), c, kDecode);
          if (d == 64 && dv == 0) {
            check("Softmax, Causal & SlidingWindow{100, 0}",
                  ak::make_spec(Causal{} & SlidingWindow{100, 0}), c, kDecode);
            check("Softmax, Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}), c,
                  kDecode);
            check<Eigen::half>("Softmax, Causal", ak::make_spec(Causal{}), c, kDecode);
          }
        }
}

TEST_CASE("decode: each normalizer under each mask matches the reference", "[decode]") {
  for (const Index lq : {1, 5, 16})
    for (const Index lk : {513, 1500}) {
      const Case c = decode_case(lq, lk, 4, 1);
      ak::test::for_each_spec<OnePass>(
          c.q_heads, ak::test::Breadth::Kinds,
          [&](const std::string& what, const auto& spec) {
            check(what, spec, c, kDecode);
            if (lk == 1500) check(what, spec, c, kAttention);
          },
          under("Full"), under("Causal", Causal{}),
          under("Causal & SlidingWindow{600, 0}", Causal{} & SlidingWindow{600, 0}),
          under("Causal & (Sinks{4} | SlidingWindow{300, 0})",
                Causal{} & (Sinks{4} | SlidingWindow{300, 0})),
          under("BlockMask(Causal & (Sinks{64} | SlidingWindow{700, 0}), 16 x 128)",
                ak::make_block_mask(Causal{} & (Sinks{64} | SlidingWindow{700, 0}), lq, lk, 16,
                                    128)));
    }
}

TEST_CASE("decode: score mods and positions match the reference", "[decode]") {
  for (const Index lq : {1, 16}) {
    const Case c = decode_case(lq, 1500, 4, 2, 32);
    for_each_normalizer<OnePass>(c.q_heads, [&](const std::string& nname, const auto& n) {
      const std::string s(nname);
      check(s + ", Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}, n), c, kDecode);
      if constexpr (!ak::detail::cosine_logits<std::decay_t<decltype(n)>>())  // see below
        check(s + ", Causal, Alibi::standard", ak::make_spec(Causal{}, ak::Alibi::standard(4), n),
              c, kDecode);
      check(s + ", Causal, Rope",
            ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(32, 10000, 2048)), n), c, kDecode);
      check(s + ", Causal & SlidingWindow, Rope",
            ak::make_spec(Causal{} & SlidingWindow{700, 0},
                          ak::Rope(ak::RopeTable(16, 500000, 2048)), n),
            c, kAttention);
      if constexpr (!ak::detail::cosine_logits<std::decay_t<decltype(n)>>())
        check(s + ", Causal, Tapa", ak::make_spec(Causal{}, ak::Tapa{}, n), c, kDecode);
    });
    ak::FopeConfig fc{32, 2048, 1000};
    fc.kv_heads = 2;
    fc.q_heads = 4;
    const ak::Fope fope = ak::Fope::drawn(fc, 0.3, 3);
    check("Softmax, Causal, Fope", ak::make_spec(Causal{}, fope), c, kDecode);
    check("SoftplusL1, Causal, Fope", ak::make_spec(Causal{}, fope, ak::SoftplusL1{}), c,
          kAttention);
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
          decode_case(lq, 1500, 4, 2, 32), kDecode);
}

TEST_CASE("decode: bf16 and f16 K/V stay at f32 accuracy against the rounded inputs", "[decode]") {
  for (const Index lq : {1, 16})
    for (const Index lk : {512, 3000}) {
      const Case c = decode_case(lq, lk, 8, 1, 32);
      for_each_normalizer<OnePass>(c.q_heads, [&](const std::string& nname, const auto& n) {
        const std::string s(nname);
        const auto spec = ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{1000, 0}), n);
        check<float>(s + ", sinks | window", spec, c, kDecode);
        check<Eigen::bfloat16>(s + ", sinks | window", spec, c, kDecode);
        check<Eigen::half>(s + ", sinks | window", spec, c, kDecode);
      });
      const auto rope = ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(32, 10000, 4096)));
      check<Eigen::bfloat16>("Softmax, Causal, Rope", rope, c, kAttention);
      check<Eigen::half>("Softmax, Causal, Rope", rope, c, kAttention);
    }
}

namespace {

// Output and LSE bytes of one call on `in` with `threads` threads.
template <class T, class Spec>
std::vector<unsigned char> bytes_of(const Spec& spec, Case c, const Inputs<T>& in, int threads,
                                    Call call) {
  c.threads = threads;
  return ak::test::bytes_of(
      ak::test::run_into<Spec>(c, [&](const ak::View<float>& o, const ak::Options& options) {
        run(call, spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
      }));
}

}  // namespace

TEST_CASE("decode: output and LSE are bitwise identical for 1..4 threads", "[decode]") {
  const Case cases[] = {decode_case(1, 3000, 8, 1, 64), decode_case(4, 1500, 4, 2, 64),
                        decode_case(16, 2049, 2, 2, 64)};
  for (const Case& c : cases) {
    const Inputs<Eigen::half> half_in(c, 5);  // drawn once: the calls differ in threads only
    const Inputs<float> float_in(c, 5);
    for (const Call call : {Call::Decode, Call::Attention})
      for_each_normalizer<OnePass>(c.q_heads, [&](const std::string& nname, const auto& n) {
        const auto spec = ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{1100, 0}), n);
        INFO(nname << ", " << name(call) << " " << ak::test::describe(c));
        const auto one = bytes_of(spec, c, half_in, 1, call);
        for (int t = 2; t <= 4; ++t) {
          INFO("threads " << t);
          CHECK(bytes_of(spec, c, half_in, t, call) == one);
        }
        const auto rope = ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(64, 10000, 4096)), n);
        const auto rope_one = bytes_of(rope, c, float_in, 1, call);
        for (int t = 2; t <= 4; ++t) CHECK(bytes_of(rope, c, float_in, t, call) == rope_one);
      });
  }
}

TEST_CASE("decode: q_len > 16 is an Error before anything is written", "[decode]") {
  const Case c = decode_case(17, 1500, 2, 1);
  const Inputs<float> in(c, 3);
  Tensor<float> o(Layout::Bhsd, 1, 2, 17, 32);
  o.fill(42.f);
  std::vector<float> lse(static_cast<std::size_t>(c.rows()), 42.f);
  ak::test::check_refused(
      [&] {
        ak::decode(ak::make_spec(Causal{}), in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                   c.options().with_lse(lse));
      },
      {"q_len"}, {&o.memory, &lse});
  // attention() takes the same shape (tiled path) and agrees with the reference.
  check("Softmax, Causal, Lq 17 through attention()", ak::make_spec(Causal{}), c, kAttention);
}

namespace {

// The call on keys where `poison(j)` holds NaN in K and V, against the same call with those
// keys finite: a masked key must not change a single bit (it never enters a sum).
template <class Spec, class Poison>
void check_masked_nan(const std::string& what, const Spec& spec, const Case& c, Call call,
                      Poison poison) {
  INFO(what << ", " << name(call) << " " << ak::test::describe(c));
  Inputs<float> clean(c, 21), dirty(c, 21);
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.kv_heads; ++h)
      for (Index j = 0; j < c.kv_len; ++j) {
        if (!poison(j)) continue;
        std::fill(dirty.k.view.row(b, h, j), dirty.k.view.row(b, h, j) + c.dim, ak::test::kNaN);
        std::fill(dirty.v.view.row(b, h, j), dirty.v.view.row(b, h, j) + c.dv(), ak::test::kNaN);
      }
  const auto on = [&](const Inputs<float>& in) {
    return ak::test::run_into<Spec>(c, [&](const ak::View<float>& o, const ak::Options& options) {
      run(call, spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
    });
  };
  const ak::test::KernelResult r_clean = on(clean), r_dirty = on(dirty);
  CHECK(
      std::none_of(r_dirty.out.begin(), r_dirty.out.end(), [](float x) { return std::isnan(x); }));
  CHECK(std::memcmp(r_clean.out.data(), r_dirty.out.data(), r_clean.out.size() * sizeof(float)) ==
        0);
  CHECK(std::memcmp(r_clean.lse.data(), r_dirty.lse.data(), r_clean.lse.size() * sizeof(float)) ==
        0);
}

}  // namespace

TEST_CASE("decode: NaN keys the mask removes do not leak into the result", "[decode]") {
  for (const Index lq : {1, 4})
    for (const Call call : {Call::Decode, Call::Attention}) {
      const Case c = decode_case(lq, 1500, 4, 1);
      for_each_normalizer<OnePass>(c.q_heads, [&](const std::string& nname, const auto& n) {
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
