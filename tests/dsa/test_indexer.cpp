// DeepSeek Sparse Attention's selection: select_topk() (a radix select) against a full sort,
// with many ties, negative scores and -0; indexer_topk() against reference::indexer_topk()
// exactly on integer inputs (every score exact in f32, so ties are real ties), causal and
// not, decode (one query: the keys split over threads), bf16 inputs, any thread
// count; on random inputs, the selection's f64 scores against the reference's (near-ties may
// swap); Products::Int8 (dsa/indexer_int8.hpp): the reference's selection on inputs int8
// holds exactly, and on normal draws the top k of the inputs rounded to its grid; bad
// arguments refused before anything is written (dsa/indexer_checks.hpp).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/dsa/indexer.hpp>
#include <attnkit/dsa/indexer_checks.hpp>
#include <attnkit/dsa/indexer_int8.hpp>
#include <attnkit/dsa/reference.hpp>
#include <attnkit/dsa/topk_select.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/error_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;

namespace {

// Scores of the selection against the reference's: on random inputs the f32 and f64 scores
// of near-tied keys may order differently; a kept key's f64 score must then be within this
// (relative to the row's largest score) of the reference's k-th.
constexpr double kNearTie = 1e-5;

// The top k of scores by a full sort (higher score, then lower key), in increasing key order.
std::vector<std::int32_t> sorted_topk(const std::vector<float>& scores, Index k) {
  std::vector<std::int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    const float x = scores[std::size_t(a)], y = scores[std::size_t(b)];
    return x > y || (!(x < y) && a < b);
  });
  order.resize(std::min<std::size_t>(order.size(), std::size_t(k)));
  std::sort(order.begin(), order.end());
  order.resize(std::size_t(k), -1);
  return order;
}

// The inputs of one indexer call: q_I [B, Hi, Lq, D], w [B, Hi, Lq, 1], k_I [B, 1, Lk, D], in
// storage T; integers in [-3, 3] (exact products and sums) or N(0, 1).
template <class T>
struct IndexerInputs {
  Tensor<T> q, k;
  Tensor<float> w;
  IndexerInputs(Index B, Index Hi, Index Lq, Index Lk, Index D, bool integers, std::uint32_t seed)
      : q(Layout::Bshd, B, Hi, Lq, D), k(Layout::Bhsd, B, 1, Lk, D), w(Layout::Bshd, B, Hi, Lq, 1) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> small(-3, 3);
    std::normal_distribution<float> normal;
    const auto draw = [&] { return integers ? float(small(rng)) : normal(rng); };
    q.for_each([&](T& x) { x = T(draw()); });
    k.for_each([&](T& x) { x = T(draw()); });
    w.for_each([&](float& x) { x = draw(); });
  }
  std::vector<std::int32_t> select(const ak::IndexerSpec& spec, int threads, bool reference,
                                   const ak::Options& base = {}) const {
    std::vector<std::int32_t> out(std::size_t(q.view.batch * q.view.seq * spec.topk), -7);
    const auto sel = ak::bhsd(out.data(), q.view.batch, 1, q.view.seq, spec.topk);
    const auto options = base.with_threads(threads);
    if (reference)
      ak::reference::indexer_topk(spec, q.cview(), w.cview(), k.cview(), sel, options);
    else
      ak::indexer_topk(spec, q.cview(), w.cview(), k.cview(), sel, options);
    return out;
  }
};

// A causal selection `got` of in's queries (Lq = Lk): each row keeps min(topk, t + 1) keys
// (checked), and the worst shortfall of a kept key's f64 score below the row's k-th best,
// relative to the row's largest score (0 when every kept key is among the top k).
double worst_shortfall(const IndexerInputs<float>& in, const ak::IndexerSpec& spec,
                       const std::vector<std::int32_t>& got) {
  const Index Lq = in.q.view.seq, Lk = in.k.view.seq, topk = spec.topk;
  std::vector<std::int32_t> unused(static_cast<std::size_t>(Lq * topk));
  const std::vector<double> I = ak::reference::indexer_scores(
      spec, in.q.cview(), in.w.cview(), in.k.cview(), ak::bhsd(unused.data(), 1, 1, Lq, topk));
  double worst = 0;
  for (Index t = 0; t < Lq; ++t) {
    std::vector<double> row(I.begin() + t * Lk, I.begin() + t * Lk + t + 1);
    std::sort(row.begin(), row.end(), std::greater<>());
    const Index kept = std::min<Index>(topk, t + 1);
    const double kth = row[std::size_t(kept - 1)], top = std::max(1.0, std::abs(row[0]));
    for (Index i = 0; i < topk; ++i) {
      const std::int32_t s = got[std::size_t(t * topk + i)];
      CHECK((i < kept) == (s >= 0));
      if (s >= 0) worst = std::max(worst, (kth - I[std::size_t(t * Lk + s)]) / top);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("select_topk: the exact top k, ties to the lower key", "[dsa][topk]") {
  std::mt19937 rng(5);
  std::vector<std::uint32_t> scratch;
  std::vector<Index> candidates;
  for (const Index n : {0, 1, 7, 64, 300, 1000, 5000})
    for (const Index k : {1, 5, 64, 300, 400})
      for (const int kind : {0, 1, 2}) {
        // 0: integers 0..9 (many ties); 1: normal draws; 2: signed values with -0 and +0.
        std::uniform_int_distribution<int> tens(0, 9);
        std::normal_distribution<float> normal;
        std::vector<float> scores(static_cast<std::size_t>(n));
        for (float& x : scores)
          x = kind == 0   ? float(tens(rng))
              : kind == 1 ? normal(rng)
                          : float(tens(rng) - 5) * 0.f - float(tens(rng) % 3);
        std::vector<std::int32_t> got(static_cast<std::size_t>(k));
        ak::detail::select_topk(scores.data(), n, k, got.data(), scratch, candidates);
        INFO("n " << n << " k " << k << " kind " << kind);
        CHECK(got == sorted_topk(scores, k));
      }
}

TEST_CASE("indexer_topk: the reference's selection exactly on integer inputs", "[dsa][indexer]") {
  struct Case {
    Index B, Hi, Lq, Lk, D, topk;
    bool causal;
    const char* what;
  };
  const Case cases[] = {
      {2, 4, 300, 300, 32, 20, true, "causal prefill"},
      {1, 64, 70, 70, 16, 8, true, "64 heads (blocks of 6 queries)"},
      {1, 3, 50, 90, 24, 16, false, "not causal, Lq < Lk"},
      {1, 4, 40, 200, 32, 300, true, "topk above every query's keys: -1 past them"},
      {1, 4, 1, 3000, 32, 64, true, "decode: one query, keys in parts"},
      {2, 4, 3, 2500, 16, 32, true, "three queries of two batches against 2500 keys"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const IndexerInputs<float> in(c.B, c.Hi, c.Lq, c.Lk, c.D, true, 11);
    const ak::IndexerSpec spec{c.topk, c.causal};
    const auto want = in.select(spec, 1, true);
    CHECK(in.select(spec, 1, false) == want);
    CHECK(in.select(spec, 2, false) == want);
    CHECK(in.select(spec, 3, false) == want);
  }
  const IndexerInputs<Eigen::bfloat16> bf16(1, 8, 100, 100, 32, true, 3);  // integers: exact
  CHECK(bf16.select({16, true}, 2, false) == bf16.select({16, true}, 1, true));
  const IndexerInputs<float> shifted(1, 4, 20, 120, 16, true, 4);  // q_offset given
  const auto at50 = ak::Options{}.with_q_offset(50);
  CHECK(shifted.select({24, true}, 2, false, at50) == shifted.select({24, true}, 1, true, at50));
}

TEST_CASE("indexer_topk: on random inputs the kept keys' scores are the top k's",
          "[dsa][indexer]") {
  const Index Lq = 200, Lk = 200, topk = 32;
  const IndexerInputs<float> in(1, 16, Lq, Lk, 64, false, 21);
  const ak::IndexerSpec spec{topk, true};
  const auto got = in.select(spec, 2, false);
  CHECK(worst_shortfall(in, spec, got) <= kNearTie);
  // Decode shapes (one query and three; the keys as GEMM rows on more threads than query
  // blocks): the same selection, bit for bit, on any thread count.
  for (const Index queries : {1, 3}) {
    const IndexerInputs<float> dec(1, 64, queries, 3000, 128, false, 23);
    const auto one = dec.select({256, true}, 1, false);
    CHECK(dec.select({256, true}, 2, false) == one);
    CHECK(dec.select({256, true}, 3, false) == one);
  }
}

namespace {

// Products::Int8's rule (dsa/indexer_int8.hpp), applied to every row of x in place: x = a q with
// a = max|x| / 127 (f32) and q = round(x / a) (halves away from 0); a row of zeros stays 0.
template <class T>
void to_int8_grid(Tensor<T>& x) {
  const auto& v = x.view;
  for (Index b = 0; b < v.batch; ++b)
    for (Index h = 0; h < v.heads; ++h)
      for (Index t = 0; t < v.seq; ++t) {
        T* row = v.row(b, h, t);
        float top = 0.f;
        for (Index c = 0; c < v.dim; ++c) top = std::max(top, std::abs(float(row[c])));
        const float a = top / 127.f;
        if (!(a >= std::numeric_limits<float>::min())) continue;
        for (Index c = 0; c < v.dim; ++c)
          row[c] = T(a * float(std::lround(float(row[c]) * (1.f / a))));
      }
}

// Integers in [-127, 127] with each row's first value +-127: int8 with a scale of 1 holds
// them exactly, and every score is an exact integer in f32.
template <class T>
void int8_exact(Tensor<T>& x, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> value(-127, 127);
  x.for_each([&](T& y) { y = T(float(value(rng))); });
  const auto& v = x.view;
  for (Index b = 0; b < v.batch; ++b)
    for (Index h = 0; h < v.heads; ++h)
      for (Index t = 0; t < v.seq; ++t)
        v.row(b, h, t)[0] = T((b + h + t) % 2 != 0 ? 127.f : -127.f);
}

}  // namespace

TEST_CASE("indexer_topk: int8 products select the reference's keys where int8 is exact",
          "[dsa][indexer][int8]") {
  // Integer inputs int8 holds exactly: the selection is the f64 reference's, bit for bit, for
  // any thread count (on 8, keys in parts), D not a multiple of 4 (the packed depth's zero
  // tail) and bf16 inputs.
  struct Case {
    Index B, Hi, Lq, Lk, D, topk;
    bool causal;
    const char* what;
  };
  const Case cases[] = {
      {2, 4, 150, 150, 32, 20, true, "causal prefill"},
      {1, 3, 70, 90, 30, 16, false, "not causal, D 30"},
      {1, 4, 64, 3000, 32, 64, true, "64 queries against 3000 keys (in parts on 8 threads)"},
      {1, 16, 70, 700, 64, 300, true, "16 heads, topk above some queries' keys"},
      {1, 4, 1, 3000, 32, 64, true, "decode: one query (f32 products below 64 queries)"},
  };
  static_assert(ak::detail::kInt8MinQueries == 64);
  const auto int8 = ak::Options{}.with_products(ak::Products::Int8);
  for (const Case& c : cases) {
    INFO(c.what);
    IndexerInputs<float> in(c.B, c.Hi, c.Lq, c.Lk, c.D, true, 31);
    int8_exact(in.q, 1);
    int8_exact(in.k, 2);
    const ak::IndexerSpec spec{c.topk, c.causal};
    const auto want = in.select(spec, 1, true);
    CHECK(in.select(spec, 1, false, int8) == want);
    CHECK(in.select(spec, 2, false, int8) == want);
    CHECK(in.select(spec, 3, false, int8) == want);
    CHECK(in.select(spec, 8, false, int8) == want);
  }
  IndexerInputs<Eigen::bfloat16> bf16(1, 8, 80, 80, 32, true, 5);
  int8_exact(bf16.q, 3);
  int8_exact(bf16.k, 4);
  CHECK(bf16.select({16, true}, 2, false, int8) == bf16.select({16, true}, 1, true));
}

TEST_CASE("indexer_topk: int8 products keep the top k of the quantized inputs",
          "[dsa][indexer][int8]") {
  // Normal draws (a row of q_I and one of k_I all zero): the kept keys' f64 scores on the
  // inputs rounded to the int8 grid are the top k's of those, within kNearTie; the same
  // selection for any thread count.
  const Index Lq = 200, Lk = 200, topk = 32;
  const auto zero_rows = [](IndexerInputs<float>& x) {
    std::fill(x.q.view.row(0, 3, 17), x.q.view.row(0, 3, 17) + 64, 0.f);
    std::fill(x.k.view.row(0, 0, 9), x.k.view.row(0, 0, 9) + 64, 0.f);
  };
  IndexerInputs<float> in(1, 16, Lq, Lk, 64, false, 41), grid(1, 16, Lq, Lk, 64, false, 41);
  zero_rows(in);
  zero_rows(grid);
  to_int8_grid(grid.q);
  to_int8_grid(grid.k);
  const ak::IndexerSpec spec{topk, true};
  const auto int8 = ak::Options{}.with_products(ak::Products::Int8);
  const auto got = in.select(spec, 2, false, int8);
  CHECK(in.select(spec, 1, false, int8) == got);
  if constexpr (!ak::detail::kInt8Indexer) {  // no AVX-512 VNNI: the request runs f32
    CHECK(got == in.select(spec, 2, false));
    return;
  }
  CHECK(worst_shortfall(grid, spec, got) <= kNearTie);
}

TEST_CASE("indexer_topk: int8 scores: the kernel's are the integer loop's, bit for bit",
          "[dsa][indexer][int8]") {
  // int8_scores() (AVX-512 VNNI where built) against int8_scores_portable() on the same packed
  // rows: every row remainder of the 6-row blocks, whole and single groups of keys, a depth
  // that is not a multiple of 4.
  for (const Index D : {30, 128}) {
    const Index Lk = 100, rows = 13;
    IndexerInputs<float> in(1, rows, 1, Lk, D, false, 51);
    ak::detail::IndexerShape s;
    s.batch = 1;
    s.k_len = Lk;
    s.dim = D;
    s.ldd = ak::simd::round_up(D);
    const auto keys = ak::detail::pack_int8_keys(s, in.k.cview(), 2);
    std::vector<float> a(std::size_t(rows * s.ldd), 0.f);
    for (Index r = 0; r < rows; ++r) std::copy_n(in.q.view.row(0, r, 0), D, a.begin() + r * s.ldd);
    ak::detail::Int8Queries q;
    q.set(a.data(), rows, s.ldd, D, keys.d4);
    for (const Index m : {1, 5, 6, 7, 13})
      for (const Index groups : {1, 4, 5, 7}) {
        INFO("D " << D << " rows " << m << " groups " << groups);
        const Index cols = groups * ak::detail::kInt8Group;
        std::vector<float> got(std::size_t(m * cols), -1.f), want(got.size(), -2.f);
        ak::detail::int8_scores(q, m, keys, 0, 0, groups, got.data(), cols);
        ak::detail::int8_scores_portable(q, m, keys, 0, 0, groups, want.data(), cols);
        CHECK(got == want);
      }
  }
}

TEST_CASE("indexer_topk: bad arguments throw Error before anything is written", "[dsa][indexer]") {
  using ak::test::check_error;
  const Index Hi = 4, L = 10, D = 8, K = 4;
  IndexerInputs<float> in(1, Hi, L, L, D, true, 1);
  std::vector<std::int32_t> out(static_cast<std::size_t>(L * K), 42);
  const auto sel = ak::bhsd(out.data(), 1, 1, L, K);
  const auto untouched = [&] {
    CHECK(std::all_of(out.begin(), out.end(), [](std::int32_t x) { return x == 42; }));
  };
  const auto call = [&](const ak::IndexerSpec& spec, const ak::View<std::int32_t>& s,
                        const ak::Options& options = {}) {
    ak::indexer_topk(spec, in.q.cview(), in.w.cview(), in.k.cview(), s, options);
  };
  check_error(
      [&] {
        call({0, true}, ak::bhsd(out.data(), 1, 1, L, 0));
      },
      {"spec.topk", ">= 1", "0"});
  check_error([&] { call({K + 1, true}, sel); }, {"selected.dim", "5", "4"});
  check_error([&] { call({K, true}, sel, ak::Options{}.with_scale(0.5f)); }, {"options.scale"});
  Tensor<float> k2(Layout::Bhsd, 1, 2, L, D);
  check_error(
      [&] {
        ak::indexer_topk(ak::IndexerSpec{K, true}, in.q.cview(), in.w.cview(), k2.cview(), sel);
      },
      {"k_index.heads", "1", "2"});
  in.q.view.row(0, 1, 3)[2] = std::numeric_limits<float>::quiet_NaN();
  check_error([&] { call({K, true}, sel); }, {"q_index", "finite"});
  in.q.view.row(0, 1, 3)[2] = 0.f;
  const auto over_q = ak::View<std::int32_t>(
      ak::bhsd(reinterpret_cast<std::int32_t*>(in.q.memory.data()), 1, 1, L, K));
  check_error([&] { call({K, true}, over_q); }, {"selected", "q_index", "overlapping"});
  untouched();
}
