// PagedKv and attention_paged(): paged attention equals attention() on the same sequences
// stored contiguously (plain views, and a KvCache for sequences of equal length), for
// prefill and decode shapes, several sequences of different lengths (0 and 1 included),
// page sizes that do not divide the lengths, pages in random order in the pool (assign())
// and interleaved appends; every one-pass normalizer and the masks Full, Causal, windowed
// and Sinks | window; bf16 storage; bitwise identical results for 1..4 threads; errors
// (page index out of range, repeated or foreign page, pool exhausted, bad shapes) thrown
// before anything is written.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/cache/kv_cache.hpp>
#include <attnkit/cache/paged_kv.hpp>
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
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catalogue.hpp"
#include "support/error_checks.hpp"
#include "support/matchers.hpp"
#include "support/sequences.hpp"
#include "support/test_names.hpp"

using ak::PagedKv;
using ak::test::check_error;
using ak::test::under;

namespace {

constexpr Index kHkv = 2, kHq = 4, kD = 32, kDv = 24;

// Sequences stored contiguously: K [1, Hkv, Lk_b, D], V [..., Dv] per sequence, in T.
template <class T>
struct Sequences : ak::test::Sequences<T> {
  Sequences(std::vector<Index> lens, std::uint32_t seed)
      : ak::test::Sequences<T>(std::move(lens), kHkv, kD, kDv, seed) {}
};

// Appends each sequence in pieces of `step` tokens, sequences interleaved (so their pages
// interleave in the pool).
template <class T, class P>
void append_interleaved(PagedKv<P>& paged, const Sequences<T>& seqs, Index step) {
  for (Index b = 0; b < seqs.count(); ++b) paged.add_sequence();
  for (Index from = 0;; from += step) {
    bool any = false;
    for (Index b = 0; b < seqs.count(); ++b) {
      const Index len = seqs.lengths[static_cast<std::size_t>(b)];
      if (from >= len) continue;
      const Index n = std::min(step, len - from);
      paged.append(b, seqs.keys(b, from, n), seqs.values(b, from, n));
      any = true;
    }
    if (!any) return;
  }
}

template <class N>
constexpr bool has_stat() {
  return ak::detail::row_stat_kind<N>() != ak::RowStat::None;
}

struct Result {
  std::vector<float> out, stat;
};

// attention_paged() on the pool.
template <class Spec, class P>
Result paged_result(const Spec& spec, const Tensor<float>& q, const PagedKv<P>& paged,
                    int threads) {
  const Index B = q.view.batch, Lq = q.view.seq;
  Tensor<float> o(Layout::Bhsd, B, kHq, Lq, kDv);
  Result r;
  r.stat.assign(static_cast<std::size_t>(B * kHq * Lq), 42.f);
  ak::Options options = ak::Options{}.with_threads(threads);
  if constexpr (has_stat<typename Spec::Normalizer>()) options = options.with_lse(r.stat);
  ak::attention_paged(spec, q.cview(), paged, o.view, options);
  r.out = o.memory;
  return r;
}

// attention() sequence by sequence on the contiguous copies.
template <class Spec, class T>
Result contiguous_result(const Spec& spec, const Tensor<float>& q, const Sequences<T>& seqs) {
  const Index B = q.view.batch, Lq = q.view.seq;
  Result r;
  r.out.assign(static_cast<std::size_t>(B * kHq * Lq * kDv), 0.f);
  r.stat.assign(static_cast<std::size_t>(B * kHq * Lq), 42.f);
  for (Index b = 0; b < B; ++b) {
    const ak::View<const float> qb =
        ak::strided(q.view.row(b, 0, 0), {1, kHq, Lq, kD},
                    {q.view.batch_stride, q.view.head_stride, q.view.seq_stride});
    float* ob = r.out.data() + b * kHq * Lq * kDv;
    float* sb = r.stat.data() + b * kHq * Lq;
    if (seqs.lengths[static_cast<std::size_t>(b)] == 0) {  // attention() of no key: by hand
      using N = typename Spec::Normalizer;
      const bool sum = ak::detail::row_stat_kind<N>() == ak::RowStat::Sum;
      for (Index h = 0; h < kHq; ++h)
        for (Index i = 0; i < Lq; ++i)
          sb[h * Lq + i] = sum ? 0.f : static_cast<float>(ak::detail::sink_of(spec.normalizer, h));
      continue;
    }
    ak::Options options = ak::Options{}.with_threads(1);
    if constexpr (has_stat<typename Spec::Normalizer>()) options = options.with_lse(sb, kHq * Lq);
    ak::attention(spec, qb, seqs.keys(b), seqs.values(b), ak::bhsd(ob, 1, kHq, Lq, kDv), options);
  }
  return r;
}

// Largest difference, relative to max(1, |expected|); NaN counts as infinity.
double worst_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const double d =
        std::abs(double(got[i]) - double(want[i])) / std::max(1.0, std::abs(double(want[i])));
    worst = std::isnan(d) ? HUGE_VAL : std::max(worst, d);
  }
  return worst;
}

// Every normalizer paged attention takes (one pass) under Full, Causal, windowed and sinks |
// window with Softcap, for the Hq = 4 of these tests.
template <class Visit>
void for_each_spec(Visit&& visit) {
  ak::test::for_each_spec<ak::test::OnePass>(
      kHq, ak::test::Breadth::Kinds, visit, under("Full"), under("Causal", Causal{}),
      under("Causal & SlidingWindow{150, 0}", Causal{} & SlidingWindow{150, 0}),
      under("Causal & (Sinks{5} | SlidingWindow{100, 0}), Softcap{8}",
            Causal{} & (Sinks{5} | SlidingWindow{100, 0}), ak::Softcap{8.f}));
}

template <class T, class P>
void check_equal(const std::string& what, const Sequences<T>& seqs, const PagedKv<P>& paged,
                 Index q_len) {
  Tensor<float> q(Layout::Bshd, seqs.count(), kHq, q_len, kD);
  q.randomize(99);
  for_each_spec([&](const std::string& name, const auto& spec) {
    INFO(what << ", " << name << ", Lq " << q_len << ", page_size " << paged.page_size());
    const Result want = contiguous_result(spec, q, seqs);
    for (const int threads : {1, 3}) {
      INFO("threads " << threads);
      const Result got = paged_result(spec, q, paged, threads);
      CHECK(worst_diff(got.out, want.out) <= 4 * tol::kF32);
      if constexpr (has_stat<typename std::decay_t<decltype(spec)>::Normalizer>())
        CHECK(worst_diff(got.stat, want.stat) <= 4 * tol::kLseF32);
    }
  });
}

}  // namespace

TEST_CASE("paged: equals contiguous attention for prefill and decode shapes", "[paged]") {
  const Sequences<float> seqs({37, 700, 1, 0, 1100}, 3);
  for (const Index page_size : {16, 100, 256}) {
    PagedKv<float> interleaved(200, kHkv, page_size, kD, kDv);
    append_interleaved(interleaved, seqs, 57);
    PagedKv<float> shuffled(200, kHkv, page_size, kD, kDv);
    assign_shuffled(shuffled, seqs, 11);
    for (const Index lq : {1, 4}) {
      check_equal("interleaved appends", seqs, interleaved, lq);
      check_equal("shuffled pages", seqs, shuffled, lq);
    }
  }
  PagedKv<float> pool(40, kHkv, 48, kD, kDv);
  append_interleaved(pool, seqs, 300);
  check_equal("prefill, interleaved", seqs, pool, 40);  // Lq > Lk for some: empty rows
}

TEST_CASE("paged: decode steps through appends equal the contiguous calls", "[paged]") {
  const Sequences<Eigen::bfloat16> seqs({300, 517, 90}, 5);
  PagedKv<Eigen::bfloat16> paged(64, kHkv, 32, kD, kDv);
  const std::vector<Index> prompt = {290, 510, 80};
  for (Index b = 0; b < 3; ++b) {
    paged.add_sequence();
    paged.append(b, seqs.keys(b, 0, prompt[std::size_t(b)]),
                 seqs.values(b, 0, prompt[std::size_t(b)]));
  }
  const auto spec = ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{200, 0}));
  for (Index step = 0; step < 7; ++step) {
    std::vector<Index> lens;
    for (Index b = 0; b < 3; ++b) {
      paged.append(b, seqs.keys(b, prompt[std::size_t(b)] + step, 1),
                   seqs.values(b, prompt[std::size_t(b)] + step, 1));
      lens.push_back(prompt[std::size_t(b)] + step + 1);
    }
    Sequences<Eigen::bfloat16> prefix(lens, 0);
    for (Index b = 0; b < 3; ++b) {  // the first lens[b] tokens, contiguous
      const auto k = seqs.keys(b, 0, lens[std::size_t(b)]);
      const auto v = seqs.values(b, 0, lens[std::size_t(b)]);
      for (Index h = 0; h < kHkv; ++h)
        for (Index s = 0; s < lens[std::size_t(b)]; ++s) {
          std::copy(k.row(0, h, s), k.row(0, h, s) + kD,
                    prefix.k[std::size_t(b)].data() + (h * lens[std::size_t(b)] + s) * kD);
          std::copy(v.row(0, h, s), v.row(0, h, s) + kDv,
                    prefix.v[std::size_t(b)].data() + (h * lens[std::size_t(b)] + s) * kDv);
        }
    }
    Tensor<float> q(Layout::Bhsd, 3, kHq, 1, kD);
    q.randomize(static_cast<std::uint32_t>(step + 1));
    INFO("step " << step);
    const Result want = contiguous_result(spec, q, prefix);
    const Result got = paged_result(spec, q, paged, 2);
    CHECK(worst_diff(got.out, want.out) <= 4 * tol::kF32);
    CHECK(worst_diff(got.stat, want.stat) <= 4 * tol::kLseF32);
  }
}

TEST_CASE("paged: equal-length sequences equal a KvCache", "[paged]") {
  const Index B = 2, len = 777;
  Tensor<float> k(Layout::Bhsd, B, kHkv, len, kD), v(Layout::Bhsd, B, kHkv, len, kDv);
  k.randomize(1);
  v.randomize(2);
  ak::KvCache<Eigen::half> cache(B, kHkv, 1024, kD, kDv);
  cache.append(k.cview(), v.cview());
  PagedKv<Eigen::half> paged(100, kHkv, 64, kD, kDv);
  for (Index b = 0; b < B; ++b) {
    paged.add_sequence();
    const auto slice = [&](const Tensor<float>& t, Index dim) {
      return ak::strided(static_cast<const float*>(t.view.row(b, 0, 0)), {1, kHkv, len, dim},
                         {t.view.batch_stride, t.view.head_stride, t.view.seq_stride});
    };
    paged.append(b, slice(k, kD), slice(v, kDv));
  }
  for (const Index lq : {1, 16, 33}) {
    Tensor<float> q(Layout::Bhsd, B, kHq, lq, kD);
    q.randomize(7);
    const auto spec = ak::make_spec(Causal{}, ak::Softmax::with_sinks({0.f, 1.f, -1.f, 2.f}));
    Tensor<float> o(Layout::Bhsd, B, kHq, lq, kDv);
    std::vector<float> lse(static_cast<std::size_t>(B * kHq * lq));
    ak::attention(spec, q.cview(), cache.keys(), cache.values(), o.view,
                  ak::Options{}.with_lse(lse));
    const Result got = paged_result(spec, q, paged, 2);
    INFO("Lq " << lq);
    CHECK(worst_diff(got.out, o.memory) <= 4 * tol::kF32);
    CHECK(worst_diff(got.stat, lse) <= 4 * tol::kLseF32);
  }
}

TEST_CASE("paged: results are bitwise identical for 1..4 threads", "[paged]") {
  const Sequences<float> seqs({1000, 333, 64}, 8);
  PagedKv<float> paged(100, kHkv, 50, kD, kDv);
  assign_shuffled(paged, seqs, 4);
  Tensor<float> q(Layout::Bhsd, 3, kHq, 3, kD);
  q.randomize(3);
  for_each_spec([&](const std::string& name, const auto& spec) {
    INFO(name);
    const Result one = paged_result(spec, q, paged, 1);
    for (int t = 2; t <= 4; ++t) {
      const Result r = paged_result(spec, q, paged, t);
      CHECK(std::memcmp(r.out.data(), one.out.data(), r.out.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(r.stat.data(), one.stat.data(), r.stat.size() * sizeof(float)) == 0);
    }
  });
}

// Softmax decode over pages runs the row engine on the same key blocks as decode() on the
// contiguous sequence when a page is a whole number of kDecodeBlock positions: the same bits.
TEST_CASE("paged: softmax decode with pages of whole key blocks equals decode() bit for bit",
          "[paged]") {
  const Sequences<Eigen::bfloat16> seqs({1300, 517, 16}, 21);
  for (const Index page_size : {ak::detail::kDecodeBlock, 4 * ak::detail::kDecodeBlock}) {
    PagedKv<Eigen::bfloat16> paged(200, kHkv, page_size, kD, kDv);
    assign_shuffled(paged, seqs, 5);
    Tensor<float> q(Layout::Bhsd, 3, kHq, 2, kD);
    q.randomize(8);
    const auto spec = ak::make_spec(Causal{} & SlidingWindow{600, 0});
    const Result got = paged_result(spec, q, paged, 2);
    for (Index b = 0; b < 3; ++b) {
      INFO("page_size " << page_size << ", sequence " << b);
      std::vector<float> out(static_cast<std::size_t>(kHq * 2 * kDv)),
          stat(static_cast<std::size_t>(kHq * 2));
      const ak::View<const float> qb =
          ak::strided(q.view.row(b, 0, 0), {1, kHq, 2, kD},
                      {q.view.batch_stride, q.view.head_stride, q.view.seq_stride});
      ak::decode(spec, qb, seqs.keys(b), seqs.values(b), ak::bhsd(out.data(), 1, kHq, 2, kDv),
                 ak::Options{}.with_lse(stat));
      CHECK(std::memcmp(out.data(), got.out.data() + b * kHq * 2 * kDv,
                        out.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(stat.data(), got.stat.data() + b * kHq * 2, stat.size() * sizeof(float)) ==
            0);
    }
  }
}

TEST_CASE("paged: bad inputs throw before anything is written", "[paged]") {
  const Sequences<float> seqs({40, 10}, 9);
  PagedKv<float> paged(5, kHkv, 16, kD, kDv);
  append_interleaved(paged, seqs, 40);  // pages: seq 0 -> 0, 1, 2; seq 1 -> 3
  REQUIRE(paged.free_pages() == 1);
  const std::vector<Index> table0 = paged.block_table(0);

  SECTION("assign: page index out of range, repeated, owned by another sequence") {
    const Index s = paged.add_sequence();
    check_error([&] { paged.assign(s, {5}, 3); }, {"page index in [0, 5)"});
    check_error([&] { paged.assign(s, {-1}, 3); }, {"page index"});
    check_error([&] { paged.assign(s, {4, 4}, 20); }, {"listed once"});
    check_error([&] { paged.assign(s, {3}, 3); }, {"sequence 1"});
    check_error([&] { paged.assign(s, {4}, 17); }, {"ceil(length / page_size)"});
    // A length near INT64_MAX: no signed overflow in the page count (UBSan), a clear Error.
    check_error(
        [&] { paged.assign(s, {0}, std::numeric_limits<Index>::max()); },
        {"PagedKv::assign: length: expected in [0, 1099511627776]", "got 9223372036854775807"});
    CHECK(paged.length(s) == 0);
    CHECK(paged.free_pages() == 1);
    CHECK_THROWS_AS(paged.key_page(5), ak::Error);
  }
  SECTION("append: pool exhausted, bad shapes, bad sequence; the pool is unchanged") {
    const Sequences<float> more({40}, 10);
    check_error([&] { paged.append(1, more.keys(0), more.values(0)); }, {"pool exhausted"});
    check_error([&] { paged.append(1, more.keys(0), more.values(0, 0, 39)); }, {"v_new.seq"});
    CHECK_THROWS_AS(paged.append(2, more.keys(0, 0, 1), more.values(0, 0, 1)), ak::Error);
    std::vector<float> wide(static_cast<std::size_t>(3 * kD));
    check_error(
        [&] {
          paged.append(1, ak::bhsd(static_cast<const float*>(wide.data()), 1, 3, 1, kD),
                       more.values(0, 0, 1));
        },
        {"k_new.heads"});
    CHECK(paged.length(1) == 10);
    CHECK(paged.free_pages() == 1);
    CHECK(paged.block_table(0) == table0);
    // The same append of 22 tokens fits (page 3 has 6 rows left, one free page for 16).
    CHECK_NOTHROW(paged.append(1, more.keys(0, 0, 22), more.values(0, 0, 22)));
    CHECK(paged.free_pages() == 0);
    CHECK(paged.length(1) == 32);
  }
  SECTION("attention_paged: bad shapes leave the output untouched") {
    Tensor<float> q(Layout::Bhsd, 2, kHq, 1, kD), q3(Layout::Bhsd, 3, kHq, 1, kD);
    Tensor<float> qh(Layout::Bhsd, 2, 3, 1, kD);
    Tensor<float> o(Layout::Bhsd, 2, kHq, 1, kDv), o_bad(Layout::Bhsd, 2, kHq, 1, kD);
    o.fill(42.f);
    o_bad.fill(42.f);
    const auto spec = ak::make_spec(Causal{});
    check_error([&] { ak::attention_paged(spec, q3.cview(), paged, o.view); }, {"q.batch"});
    check_error([&] { ak::attention_paged(spec, qh.cview(), paged, o.view); }, {"q.heads"});
    check_error([&] { ak::attention_paged(spec, q.cview(), paged, o_bad.view); }, {"o.dim"});
    ak::test::check_refused(
        [&] {
          ak::attention_paged(ak::make_spec(Causal{}, ak::Softmax::with_sinks({1.f})), q.cview(),
                              paged, o.view);
        },
        {"sinks"}, {&o.memory, &o_bad.memory});
  }
  SECTION("release returns pages; a new sequence reuses them") {
    paged.release(0);
    CHECK(paged.free_pages() == 4);
    CHECK(paged.length(0) == 0);
    const Index s = paged.add_sequence();
    const Sequences<float> more({64}, 12);
    paged.append(s, more.keys(0), more.values(0));
    CHECK(paged.free_pages() == 0);
    CHECK(paged.block_table(s).size() == 4);
  }
}

// A BlockMask carries the sizes it was laid out for. attention_paged() checks them against
// each sequence on both of its paths, as attention() does on the contiguous sequence, and
// writes nothing when they differ; the per-page path (Sigmoid, ReluPower) once skipped it.
TEST_CASE("paged: a block mask laid out for other sizes is refused on every path", "[paged]") {
  const Sequences<float> seqs({40}, 13);
  PagedKv<float> paged(4, kHkv, 16, kD, kDv);
  append_interleaved(paged, seqs, 40);
  Tensor<float> q(Layout::Bhsd, 1, kHq, 1, kD), o(Layout::Bhsd, 1, kHq, 1, kDv);
  q.randomize(14);
  const auto right = ak::make_block_mask(Causal{}, 1, 40, 16, 16);
  const auto wrong = ak::make_block_mask(Causal{}, 1, 64, 16, 16);  // kv_len 64, not 40
  CHECK_THROWS_MATCHES(
      ak::attention(ak::make_spec(wrong), q.cview(), seqs.keys(0), seqs.values(0), o.view),
      ak::Error, MessageMatches(ContainsSubstring("BlockMask.kv_len")));
  const auto refused = [&](const std::string& name, const auto& normalizer) {
    INFO(name);
    std::fill(o.memory.begin(), o.memory.end(), 42.f);
    const std::vector<float> before = o.memory;
    CHECK_THROWS_MATCHES(
        ak::attention_paged(ak::make_spec(wrong, normalizer), q.cview(), paged, o.view), ak::Error,
        MessageMatches(ContainsSubstring("BlockMask.kv_len")));
    CHECK(std::memcmp(o.memory.data(), before.data(), before.size() * sizeof(float)) == 0);
    CHECK_NOTHROW(ak::attention_paged(ak::make_spec(right, normalizer), q.cview(), paged, o.view));
  };
  refused("Softmax (row engine)", ak::Softmax{});
  refused("Sigmoid (one call per page)", ak::Sigmoid{});
  refused("ReluPower (one call per page)", ak::ReluPower{1.5f, 0.3f});
}
