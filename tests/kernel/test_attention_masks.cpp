// attention() under the static masks (SlidingWindow, Chunked, Sinks, PowerOfTwo and their
// combinations) against reference::attention(), over ragged lengths, Lq != Lk with any
// q_offset, Lq = 1, GQA, several head dimensions, each storage type and 1 or 2 threads;
// then properties of the kernel's mask paths: the runs() path, the keep() path and the
// walk over every key agree; a window reaching key 0 is Causal bit for bit; keep() runs on
// Partial tiles only. Built natively (the flavours run test_attention_paths.cpp).
// The mask paths are kernel/tiles/tile_mask.hpp's (runs() compares, keep() per element).
#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/tiles/tile_config.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/chunked.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/power_of_two.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/reference/attention.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cstring>
#include <string>
#include <type_traits>

#include "support/attention_runner.hpp"
#include "support/catalogue.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::Range;
using ak::test::Breadth;
using ak::test::for_each_mask;

namespace {

// M with its runs() hidden: the kernel masks Partial tiles with keep(), element by element,
// over the same tiles (same classify and key_ranges).
template <class M>
struct KeepPath {
  using slot = ak::MaskSlot;
  M mask;
  bool keep(Index b, Index h, Index i, Index j) const { return mask.keep(b, h, i, j); }
  ak::TileKind classify(Index b, Index h, Range q, Range kv) const {
    return mask.classify(b, h, q, kv);
  }
  auto key_ranges(Index b, Index h, Range q) const { return mask.key_ranges(b, h, q); }
};

static_assert(!ak::detail::has_runs<KeepPath<SlidingWindow>>::value, "KeepPath hides runs()");

// M with only its element rule: every tile is Partial and every key is walked.
template <class M>
struct KeepOnly {
  using slot = ak::MaskSlot;
  M mask;
  bool keep(Index b, Index h, Index i, Index j) const { return mask.keep(b, h, i, j); }
};

// Every mask of the catalogue passing Filter, and the same mask through Path<M> (another of
// the kernel's mask paths): equal within the f32 tolerances.
template <template <class> class Path, template <class> class Filter = ak::test::AnySpec>
void check_paths_agree(const Case& c) {
  for_each_mask<Filter>(
      [&](const std::string& name, const auto& mask) {
        using M = std::decay_t<decltype(mask)>;
        const auto fast = ak::test::run_kernel(ak::make_spec(mask), c);
        const auto other = ak::test::run_kernel(ak::make_spec(Path<M>{mask}), c);
        INFO(name << ", " << ak::test::describe(c));
        CHECK(ak::test::max_lse_diff(fast.out, other.out) <= tol::kF32);
        CHECK(ak::test::max_lse_diff(fast.lse, other.lse) <= tol::kLseF32);
      },
      Breadth::Variants);
}

// Kernel against reference; inputs of storage T are rounded before both read them, so the
// f32 tolerance holds for every storage type.
template <class T = float, class Spec>
ak::test::Outcome check(const std::string& mask, const Spec& spec, const Case& c) {
  INFO(mask << ", " << ak::test::describe(c) << ", " << ak::test::storage_name<T>());
  const ak::test::Outcome r = ak::test::run_case<T>(spec, c);
  ak::test::check_outcome(r);
  return r;
}

// Every mask of the catalogue (support/catalogue.hpp), its window and chunk sizes included.
template <class T = float>
void check_every_mask(const Case& c) {
  for_each_mask(
      [&](const std::string& name, const auto& mask) { check<T>(name, ak::make_spec(mask), c); },
      Breadth::Variants);
}

// One head (GQA has its own case): the masks do not depend on the head.
Case shape(Index q_len, Index kv_len, Index dim, int threads) {
  Case c = Case{}.lengths(q_len, kv_len).heads(1, 1).dims(dim).on_threads(threads);
  return c;
}

Case shape(Index q_len, Index kv_len, Index dim, int threads, Index q_offset) {
  Case c = shape(q_len, kv_len, dim, threads);
  c.q_offset = q_offset;
  return c;
}

// The kernel's key tiles for one (batch, head), as key_schedule.hpp documents them: per
// query tile, each key range clipped to [0, Lk) and cut into tiles of at most kBlockK keys,
// each classified. Pairs are (query, key) pairs of the tiles of each kind.
struct TilePairs {
  Index full = 0, partial = 0, walked = 0;  // walked: Full + Partial
};

template <class Mask>
TilePairs tile_pairs(const Mask& mask, Index q_len, Index kv_len, Index q_offset) {
  const Index bq = ak::TileConfig::kBlockQ, bk = ak::TileConfig::kBlockK;
  TilePairs t;
  for (Index q0 = 0; q0 < q_len; q0 += bq) {
    const Index nq = std::min(bq, q_len - q0);
    const Range rows{q0 + q_offset, q0 + nq + q_offset};
    for (const Range& r : mask.key_ranges(0, 0, rows)) {
      const Index end = std::clamp<Index>(r.end, 0, kv_len);
      for (Index k0 = std::clamp<Index>(r.begin, 0, end); k0 < end; k0 += bk) {
        const Index nk = std::min(bk, end - k0);
        const ak::TileKind kind = mask.classify(0, 0, rows, Range{k0, k0 + nk});
        if (kind == ak::TileKind::Full) t.full += nq * nk;
        if (kind == ak::TileKind::Partial) t.partial += nq * nk;
        if (kind != ak::TileKind::Empty) t.walked += nq * nk;
      }
    }
  }
  return t;
}

}  // namespace

TEST_CASE("attention: masks match the reference for ragged lengths and Lq = 1",
          "[attention][mask][grid]") {
  check_every_mask(shape(1, 1, 32, 1));
  check_every_mask(shape(300, 300, 32, 2));  // neither a multiple of 64 nor of 256
  check_every_mask(shape(1, 517, 128, 1));   // decode: one query after 516 keys
  Case padded = shape(65, 257, 80, 2);
  padded.layout = Layout::Padded;  // NaN in every padding element
  check_every_mask(padded);
}

TEST_CASE("attention: masks match the reference when Lq != Lk, for any q_offset",
          "[attention][mask][grid]") {
  check_every_mask(shape(130, 90, 32, 2, -25));   // rows before key 0, Lq > Lk
  check_every_mask(shape(100, 260, 32, 1, 200));  // rows past the last key
  check_every_mask(shape(70, 333, 32, 2, 0));     // top-left aligned
  check_every_mask(shape(100, 260, 32, 2));       // bottom-right (the default)
  check_every_mask(shape(40, 90, 32, 1, -70));    // most rows before key 0
}

TEST_CASE("attention: masks match the reference with GQA and head dimensions 32, 80, 128",
          "[attention][mask][grid]") {
  const Index dim = GENERATE(32, 80, 128);
  Case c = shape(77, 200, dim, dim == 80 ? 1 : 2);
  c.batch = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  check_every_mask(c);
}

TEST_CASE("attention: masks match the reference for bf16 and f16 storage",
          "[attention][mask][dtype]") {
  // bf16 under every mask; f16 differs from it only in the packing (mask-independent), so it
  // runs here under one mask of each kind of tile schedule and in test_attention_paths.
  const Case c = shape(100, 270, 32, 2);
  check_every_mask<Eigen::bfloat16>(c);
  Case gqa = shape(33, 70, 80, 1, -5);
  gqa.q_heads = 4;
  gqa.kv_heads = 2;
  check_every_mask<Eigen::bfloat16>(gqa);
  for (const Case& f16 : {c, gqa}) {
    check<Eigen::half>("Causal", ak::make_spec(ak::Causal{}), f16);
    check<Eigen::half>("Causal & SlidingWindow{64, 0}",
                       ak::make_spec(ak::Causal{} & ak::SlidingWindow{64, 0}), f16);
  }
}

TEST_CASE("attention: long windows have Full tiles and match the reference",
          "[attention][mask][grid]") {
  // Windows and chunks longer than a key tile: Full tiles skip the mask entirely.
  const Case c = shape(800, 800, 16, 2);
  const auto run = [&](const char* name, const auto& mask) {
    const TilePairs t = tile_pairs(mask, c.q_len, c.kv_len, c.kv_len - c.q_len);
    INFO(name << ": Full pairs " << t.full << ", Partial pairs " << t.partial);
    CHECK(t.full > 0);
    CHECK(t.partial > 0);
    check(name, ak::make_spec(mask), c);
  };
  run("Causal & SlidingWindow{520, 0}", Causal{} & SlidingWindow{520, 0});
  run("SlidingWindow{520, 300}", SlidingWindow{520, 300});
  run("Causal & (Sinks{4} | SlidingWindow{520, 0})",
      Causal{} & (ak::Sinks{4} | SlidingWindow{520, 0}));
  run("Chunked{300}", ak::Chunked{300});  // query tiles straddle chunk ends: Partial tiles
  run("Causal & Chunked{512}", Causal{} & ak::Chunked{512});
  run("PowerOfTwo{4, 520}", ak::PowerOfTwo{4, 520});
}

TEST_CASE("attention: rows that see no key give 0 and LSE -inf under every mask",
          "[attention][mask][edge]") {
  // Expected counts per head, from each mask's rule over query positions i and keys [0, Lk).
  const auto count = [](const char* name, const auto& mask, const Case& c) {
    return check(name, ak::make_spec(mask), c).empty_rows / c.q_heads;
  };
  const Case before = shape(130, 90, 32, 2, -25);  // positions -25 .. 104, keys 0 .. 89
  CHECK(count("Causal & SlidingWindow{16, 0}", Causal{} & SlidingWindow{16, 0}, before) == 25);
  CHECK(count("Causal & (Sinks{4} | SlidingWindow{8, 0})",
              Causal{} & (ak::Sinks{4} | SlidingWindow{8, 0}), before) == 25);
  CHECK(count("PowerOfTwo{2, 8}", ak::PowerOfTwo{2, 8}, before) == 25);
  // Chunks [-50, 0) and [100, 150) hold no key: positions -25..-1 and 100..104.
  CHECK(count("Chunked{50}", ak::Chunked{50}, before) == 30);
  // Windows [i - 5, i + 3]: empty for i <= -4 and for i >= 55 (Lk = 50).
  CHECK(count("SlidingWindow{5, 3}", SlidingWindow{5, 3}, shape(100, 50, 32, 1, -10)) == 7 + 35);
  CHECK(count("SlidingWindow{5, 3}", SlidingWindow{5, 3}, shape(100, 50, 32, 2, 40)) == 85);
  CHECK(count("Sinks{0}", ak::Sinks{0}, shape(10, 20, 32, 2)) == 10);
  CHECK(count("Causal & Sinks{0}", Causal{} & ak::Sinks{0}, shape(70, 300, 32, 1)) == 70);
}

TEST_CASE("attention: SlidingWindow{w, 0} & Causal equals Causal bit for bit when w reaches key 0",
          "[attention][mask][property]") {
  // With w >= the last query position, every window starts at or before key 0: the key
  // ranges intersect to Causal's, each tile's kind is Causal's (the window's Full and Empty
  // conditions reduce to Causal's), and the runs clamp to the same interval in every tile.
  // Same tiles, same masked logits, same order of operations: the same bits, not merely
  // the same values within tolerance. One key less (w - 1) drops key 0 from the last row.
  const auto [q_len, kv_len, q_offset] = GENERATE(table<Index, Index, Index>(
      {{300, 300, 0}, {1, 517, 516}, {130, 90, -25}, {100, 260, 200}, {77, 333, 0}}));
  const Case c = shape(q_len, kv_len, 32, 1, q_offset);
  const Index w = q_len - 1 + q_offset;  // the last query's position: its window is [0, w]
  INFO(ak::test::describe(c) << ", w = " << w);
  const auto causal = ak::test::run_kernel(ak::make_spec(Causal{}), c);
  const auto same = [&](const ak::test::KernelResult& r) {
    return r.out.size() == causal.out.size() &&
           std::memcmp(r.out.data(), causal.out.data(), r.out.size() * sizeof(float)) == 0 &&
           std::memcmp(r.lse.data(), causal.lse.data(), r.lse.size() * sizeof(float)) == 0;
  };
  CHECK(same(ak::test::run_kernel(ak::make_spec(SlidingWindow{w, 0} & Causal{}), c)));
  CHECK(same(ak::test::run_kernel(ak::make_spec(Causal{} & SlidingWindow{w, 0}), c)));
  CHECK(same(ak::test::run_kernel(ak::make_spec(SlidingWindow{w, 0}), c)));
  CHECK(same(ak::test::run_kernel(ak::make_spec(SlidingWindow{Index{1} << 62, 0} & Causal{}), c)));
  CHECK_FALSE(same(ak::test::run_kernel(ak::make_spec(SlidingWindow{w - 1, 0} & Causal{}), c)));
}

TEST_CASE("attention: a mask through runs() and through keep() gives the same output",
          "[attention][mask][property]") {
  // KeepPath hides runs(): the same tiles are visited and classified alike, and Partial
  // tiles are masked by keep() instead of the SIMD compares. The masked logits are the same
  // -inf, so the outputs agree within the f32 tolerance (equal in practice).
  const auto [q_len, kv_len, q_offset] = GENERATE(
      table<Index, Index, Index>({{300, 300, 0}, {130, 90, -25}, {1, 517, 516}, {100, 260, 200}}));
  check_paths_agree<KeepPath, ak::test::WithRuns>(shape(q_len, kv_len, 32, 1, q_offset));
}

TEST_CASE("attention: banded Partial tiles give the bits of the whole tile",
          "[attention][mask][property]") {
  // With runs(), a Partial tile whose queries see a band of it (kernel/tiles/tile_band.hpp) runs
  // its two products over each group's hull of keys only; KeepPath's tiles (no runs()) run
  // them over the whole tile. Each logit is the same dot product in the same order and the
  // skipped keys weigh exactly 0, so the outputs are equal bit for bit. The shapes give
  // ragged last tiles (6 and 8 rows), a head dim with a tail past whole vectors, GQA, a
  // value dim of its own and two threads; each also against the reference.
  const auto [q_len, kv_len, q_offset, dim] = GENERATE(table<Index, Index, Index, Index>(
      {{200, 200, 0, 40}, {70, 330, 260, 32}, {136, 136, 0, 19}}));
  const Case c =
      Case{}.lengths(q_len, kv_len).heads(4, 2).dims(dim, 24).on_threads(2).at_offset(q_offset);
  const auto band_masks = [](auto&& visit) {
    visit("Causal & SlidingWindow{20, 0}", Causal{} & SlidingWindow{20, 0});
    visit("Causal & (Sinks{4} | SlidingWindow{64, 0})",
          Causal{} & (ak::Sinks{4} | SlidingWindow{64, 0}));
    visit("SlidingWindow{7, 30}", SlidingWindow{7, 30});
    visit("Causal", Causal{});
    visit("Chunked{24}", ak::Chunked{24});
  };
  band_masks([&](const char* name, const auto& mask) {
    using M = std::decay_t<decltype(mask)>;
    INFO(name << ", " << ak::test::describe(c));
    const auto banded = ak::test::run_kernel(ak::make_spec(mask), c);
    const auto whole = ak::test::run_kernel(ak::make_spec(KeepPath<M>{mask}), c);
    REQUIRE(banded.out.size() == whole.out.size());
    CHECK(ak::test::bytes_of(banded) == ak::test::bytes_of(whole));
    check(name, ak::make_spec(mask), c);
  });
}

TEST_CASE(
    "attention: each lane block's weights over its own keys give the bits of the whole "
    "tile, for every normalizer",
    "[attention][mask][normalizer][property]") {
  // With runs(), the masking of a Partial tile finds each lane block's hull of keys and the
  // normalizer absorbs only that hull (the rows outside are -inf, weight 0 under every
  // normalizer, stored as 0). KeepPath's tiles absorb every row. A window the tile's blocks
  // see in part, sinks far from it (two runs per query), a ragged last tile, GQA and two
  // threads; the two-pass LSSAR observes the whole tile and absorbs the hulls.
  const Case c = Case{}.lengths(150, 150).heads(4, 2).dims(24, 24).on_threads(2);
  const auto mask = Causal{} & (ak::Sinks{3} | SlidingWindow{21, 0});
  using M = std::decay_t<decltype(mask)>;
  ak::test::for_each_normalizer(c.q_heads, [&](const std::string& name, const auto& normalizer) {
    INFO(name << ", " << ak::test::describe(c));
    const auto runs = ak::test::run_kernel(ak::make_spec(mask, normalizer), c);
    const auto keep = ak::test::run_kernel(ak::make_spec(KeepPath<M>{mask}, normalizer), c);
    REQUIRE(runs.out.size() == keep.out.size());
    CHECK(ak::test::bytes_of(runs) == ak::test::bytes_of(keep));
    // LSSAR's row statistic misses the f64 reference's tolerance for rows that see only a
    // few near-uniform keys (Causal & Sinks{3} alone fails it the same way on every path):
    // there r = N a - 1 is a difference of near-equal f32 numbers, and p log r magnifies
    // it. For LSSAR (two passes) the bits alone are compared.
    if constexpr (ak::detail::passes<std::decay_t<decltype(normalizer)>>() == 1)
      ak::test::check_attention(name, ak::make_spec(mask, normalizer), c);
  });
}

TEST_CASE("attention: a mask with key_ranges and the same mask with only keep() agree",
          "[attention][mask][property]") {
  // KeepOnly has neither classify nor key_ranges: every key is walked, every tile is Partial.
  // The tiles differ (key tiles start at 0, not at the key ranges), so the order of the
  // online softmax differs too: equal within the f32 tolerance, not bit for bit.
  const auto [q_len, kv_len, q_offset] =
      GENERATE(table<Index, Index, Index>({{300, 300, 0}, {130, 90, -25}, {100, 260, 200}}));
  check_paths_agree<KeepOnly>(shape(q_len, kv_len, 32, 1, q_offset));
}

namespace {

// A mask without runs(), so Partial tiles call keep(), every call counted.
template <class M>
struct CountingKeep {
  using slot = ak::MaskSlot;
  M mask;
  std::atomic<long>* keep_calls;
  bool keep(Index b, Index h, Index i, Index j) const {
    keep_calls->fetch_add(1, std::memory_order_relaxed);
    return mask.keep(b, h, i, j);
  }
  ak::TileKind classify(Index b, Index h, Range q, Range kv) const {
    return mask.classify(b, h, q, kv);
  }
  auto key_ranges(Index b, Index h, Range q) const { return mask.key_ranges(b, h, q); }
};

}  // namespace

TEST_CASE("attention: a sliding window calls keep() on Partial tiles only",
          "[attention][mask][property]") {
  // 300 queries after 700 keys. The kernel masks every pair of a Partial tile with keep()
  // and no other: the calls are at most the pairs of Partial tiles (the bound), which are
  // fewer than the pairs walked (Full tiles exist) and those fewer than all pairs (keys
  // outside the key ranges are skipped). A keep() on any Full or skipped tile would add
  // its pairs on top of the Partial ones and break the bound.
  const Index Lq = 300, Lk = 1000;
  const Case c = shape(Lq, Lk, 32, GENERATE(1, 2));
  const auto run = [&](const char* name, const auto& window) {
    std::atomic<long> calls{0};
    const CountingKeep<std::decay_t<decltype(window)>> mask{window, &calls};
    STATIC_REQUIRE_FALSE(ak::detail::has_runs<decltype(mask)>::value);
    Tensor<float> q(Layout::Bhsd, 1, 1, Lq, c.dim), k(Layout::Bhsd, 1, 1, Lk, c.dim),
        v(Layout::Bhsd, 1, 1, Lk, c.dim), o(Layout::Bhsd, 1, 1, Lq, c.dim);
    q.randomize(1);
    k.randomize(2);
    v.randomize(3);
    ak::attention(ak::make_spec(mask), q.cview(), k.cview(), v.cview(), o.view, c.options());
    const TilePairs t = tile_pairs(mask, Lq, Lk, Lk - Lq);
    INFO(name << ", threads " << c.threads << ": keep() calls " << calls.load()
              << ", Partial pairs " << t.partial << ", walked pairs " << t.walked);
    CHECK(calls.load() > 0);
    CHECK(calls.load() <= t.partial);
    CHECK(t.partial < t.walked);  // the shape has Full tiles: the bound is not vacuous
    CHECK(t.walked < Lq * Lk);    // and skipped keys
    Tensor<double> expected(Layout::Bhsd, 1, 1, Lq, c.dim);
    ak::reference::attention(ak::make_spec(window), q.cview(), k.cview(), v.cview(), expected.view);
    CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
  };
  run("SlidingWindow{600, 40}", SlidingWindow{600, 40});
  run("Causal & (Sinks{4} | SlidingWindow{600, 0})",
      Causal{} & (ak::Sinks{4} | SlidingWindow{600, 0}));
}

TEST_CASE("attention: PowerOfTwo sees the key at distance 2^62 (q_offset = 2^62)",
          "[attention][mask][edge]") {
  // Regression: PowerOfTwo::keep() keeps distance 2^62 (query position 2^62, the largest
  // valid q_offset, and key 0); key_ranges() once stopped at 2^61, so the kernel never
  // visited that key and the row came out empty (0, LSE -inf) while the reference used it.
  const ak::test::Outcome r =
      ak::test::run_case(ak::make_spec(ak::PowerOfTwo{0, 0}), shape(1, 4, 32, 1, Index{1} << 62));
  REQUIRE(r.empty_rows == 0);  // the reference sees key 0
  ak::test::check_outcome(r);
}
