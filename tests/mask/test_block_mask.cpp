// BlockMask: the BCSR format (offsets and sorted key-block lists per batch, head and query
// block), keep() at element level, classify() exact at block granularity, the key ranges
// for_each_key_range() streams, to_string() / to_dense() / sparsity(), make_block_mask()
// against the element rule of several masks, and every constructor and validate() error.
#include <algorithm>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/chunked.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/mask/tile_kind.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/mask_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::Range;
using ak::TileKind;

namespace {

// A BlockList from one vector of key blocks per BCSR row.
ak::BlockList list_of(const std::vector<std::vector<Index>>& rows) {
  ak::BlockList list{{0}, {}};
  for (const auto& row : rows) {
    list.blocks.insert(list.blocks.end(), row.begin(), row.end());
    list.offsets.push_back(static_cast<Index>(list.blocks.size()));
  }
  return list;
}

ak::BlockMaskLayout layout_of(Index q_len, Index kv_len, Index block_q, Index block_k,
                              Index q_offset = 0, Index batch = 1, Index heads = 1) {
  ak::BlockMaskLayout l;
  l.batch = batch;
  l.heads = heads;
  l.q_len = q_len;
  l.kv_len = kv_len;
  l.block_q = block_q;
  l.block_k = block_k;
  l.q_offset = q_offset;
  return l;
}

// Keeps pairs whose position sum is even: a rule that is visibly not KeepAll.
struct EvenSum {
  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const { return (i + j) % 2 == 0; }
};

// A mask that depends on batch and head: a causal window of 5 + 7 * h + 3 * b keys.
struct HeadWindow {
  using slot = ak::MaskSlot;
  bool keep(Index b, Index h, Index i, Index j) const {
    return j <= i && i - j <= 5 + 7 * h + 3 * b;
  }
};

// The 3 x 3 pattern of 4 x 4 blocks (q_len 10, kv_len 12) used by the format tests:
//   row 0: full {0}, partial {2}        "#.+"
//   row 1: full {0, 1}                  "##."
//   row 2: partial {1}                  ".+."
ak::BlockMaskLayout small_layout(Index q_offset = 0) { return layout_of(10, 12, 4, 4, q_offset); }
ak::BlockList small_full() { return list_of({{0}, {0, 1}, {}}); }
ak::BlockList small_partial() { return list_of({{2}, {}, {1}}); }

// The kind of block (qb, kb) read straight from the lists of BCSR row r.
TileKind listed_kind(const ak::BlockList& full, const ak::BlockList& partial, Index r, Index kb) {
  const auto in = [&](const ak::BlockList& l) {
    const auto begin = l.blocks.begin() + l.offsets[static_cast<std::size_t>(r)];
    const auto end = l.blocks.begin() + l.offsets[static_cast<std::size_t>(r + 1)];
    return std::find(begin, end, kb) != end;
  };
  return in(full) ? TileKind::Full : in(partial) ? TileKind::Partial : TileKind::Empty;
}

// The kind of block (qb, kb) of `mask` at (b, h), from its pairs.
template <class Mask>
TileKind true_kind(const Mask& mask, const ak::BlockMaskLayout& l, Index b, Index h, Index qb,
                   Index kb) {
  Index kept = 0, pairs = 0;
  for (Index row = qb * l.block_q; row < std::min((qb + 1) * l.block_q, l.q_len); ++row)
    for (Index j = kb * l.block_k; j < std::min((kb + 1) * l.block_k, l.kv_len); ++j) {
      kept += mask.keep(b, h, row + l.q_offset, j) ? 1 : 0;
      ++pairs;
    }
  return kept == 0 ? TileKind::Empty : kept == pairs ? TileKind::Full : TileKind::Partial;
}

// make_block_mask(mask, layout) is exact: every block is listed as what its pairs are, and
// to_dense() of every (b, h) equals the element rule.
template <class Mask>
void check_block_mask_of(const Mask& mask, const ak::BlockMaskLayout& l) {
  INFO("Lq=" << l.q_len << " Lk=" << l.kv_len << " q_offset=" << l.q_offset
             << " block_q=" << l.block_q << " block_k=" << l.block_k << " batch=" << l.batch
             << " heads=" << l.heads);
  const auto bm = ak::make_block_mask(mask, l);
  bool blocks_exact = true, dense_exact = true;
  for (Index b = 0; b < l.batch; ++b)
    for (Index h = 0; h < l.heads; ++h) {
      for (Index qb = 0; qb < l.q_blocks(); ++qb)
        for (Index kb = 0; kb < l.kv_blocks(); ++kb) {
          const Index r = (b * l.heads + h) * l.q_blocks() + qb;
          blocks_exact = blocks_exact && listed_kind(bm.full_blocks(), bm.partial_blocks(), r,
                                                     kb) == true_kind(mask, l, b, h, qb, kb);
        }
      const std::vector<char> dense = bm.to_dense(b, h);
      REQUIRE(dense.size() == static_cast<std::size_t>(l.q_len * l.kv_len));
      for (Index row = 0; row < l.q_len; ++row)
        for (Index j = 0; j < l.kv_len; ++j)
          dense_exact = dense_exact && (dense[static_cast<std::size_t>(row * l.kv_len + j)] != 0) ==
                                           mask.keep(b, h, row + l.q_offset, j);
    }
  CHECK(blocks_exact);
  CHECK(dense_exact);
}

}  // namespace

TEST_CASE("BlockMaskLayout: counts blocks, the last one ragged", "[mask][block_mask]") {
  const auto l = layout_of(10, 12, 4, 4, 0, 2, 3);
  CHECK(l.q_blocks() == 3);  // rows 0-3, 4-7, 8-9
  CHECK(l.kv_blocks() == 3);
  CHECK(l.rows() == 2 * 3 * 3);
  CHECK(layout_of(0, 0, 4, 4).q_blocks() == 0);
  CHECK(layout_of(128, 129, 128, 128).kv_blocks() == 2);
  const ak::BlockMaskLayout defaults;
  CHECK(defaults.batch == 1);
  CHECK(defaults.heads == 1);
  CHECK(defaults.block_q == 128);
  CHECK(defaults.block_k == 128);
  CHECK(defaults.q_offset == 0);
}

TEST_CASE("BlockMask: stores the BCSR lists it was given", "[mask][block_mask]") {
  const ak::BlockMask<> bm(small_layout(), small_partial(), small_full());
  CHECK(bm.layout().q_len == 10);
  CHECK(bm.layout().kv_len == 12);
  CHECK(bm.full_blocks().offsets == std::vector<Index>{0, 1, 3, 3});
  CHECK(bm.full_blocks().blocks == std::vector<Index>{0, 0, 1});
  CHECK(bm.partial_blocks().offsets == std::vector<Index>{0, 1, 1, 2});
  CHECK(bm.partial_blocks().blocks == std::vector<Index>{2, 1});
  const ak::BlockMask<> copy = bm;  // copies share the lists
  CHECK(&copy.full_blocks() == &bm.full_blocks());
}

TEST_CASE("BlockMask: keep is true in full blocks, the rule in partial ones, false elsewhere",
          "[mask][block_mask]") {
  SECTION("without a rule, a partial block keeps every pair") {
    const ak::BlockMask<> bm(small_layout(), small_partial(), small_full());
    CHECK(bm.keep(0, 0, 0, 0));        // row 0, full block 0
    CHECK(bm.keep(0, 0, 3, 3));        // last pair of that block
    CHECK_FALSE(bm.keep(0, 0, 0, 4));  // block 1 is not listed for row 0
    CHECK(bm.keep(0, 0, 2, 9));        // partial block 2, KeepAll
    CHECK(bm.keep(0, 0, 7, 7));        // row 1, full block 1
    CHECK_FALSE(bm.keep(0, 0, 7, 8));
    CHECK(bm.keep(0, 0, 9, 5));  // row 2 (ragged), partial block 1
    CHECK_FALSE(bm.keep(0, 0, 9, 0));
  }
  SECTION("with a rule, a partial block keeps the pairs the rule keeps; full blocks ignore it") {
    const ak::BlockMask<EvenSum> bm(small_layout(), small_partial(), small_full());
    CHECK(bm.keep(0, 0, 0, 1));  // full block: the rule (odd sum) is not asked
    CHECK(bm.keep(0, 0, 1, 9));  // partial, even sum
    CHECK_FALSE(bm.keep(0, 0, 1, 10));
    CHECK(bm.keep(0, 0, 8, 6));
    CHECK_FALSE(bm.keep(0, 0, 8, 5));
  }
  SECTION("positions outside the layout are never kept") {
    const ak::BlockMask<> bm(small_layout(5), small_partial(), small_full());
    CHECK(bm.keep(0, 0, 5, 0));          // row 0 sits at position 5
    CHECK_FALSE(bm.keep(0, 0, 4, 0));    // before row 0
    CHECK_FALSE(bm.keep(0, 0, 15, 5));   // after row 9
    CHECK_FALSE(bm.keep(0, 0, 14, 12));  // past the last key
    CHECK_FALSE(bm.keep(0, 0, 14, -1));
    CHECK(bm.keep(0, 0, 14, 5));
  }
}

TEST_CASE("BlockMask: heads = 1 shares one pattern, heads = q_heads gives each its own",
          "[mask][block_mask]") {
  const auto shared_layout = layout_of(8, 8, 4, 4, 0, 2, 1);
  // batch 0: the diagonal blocks full; batch 1: everything partial.
  const ak::BlockMask<> shared(shared_layout, list_of({{}, {}, {0, 1}, {0, 1}}),
                               list_of({{0}, {1}, {}, {}}));
  for (Index h : {0, 1, 5}) {
    CHECK(shared.to_string(0, h) == "#.\n.#\n");
    CHECK(shared.to_string(1, h) == "++\n++\n");
  }
  const auto per_head = layout_of(8, 8, 4, 4, 0, 1, 2);
  const ak::BlockMask<> own(per_head, list_of({{}, {}, {1}, {}}), list_of({{0}, {0, 1}, {}, {1}}));
  CHECK(own.to_string(0, 0) == "#.\n##\n");
  CHECK(own.to_string(0, 1) == ".+\n.#\n");
  CHECK(own.keep(0, 0, 0, 0));
  CHECK_FALSE(own.keep(0, 1, 0, 0));
}

TEST_CASE("BlockMask: classify is exact at block granularity", "[mask][block_mask]") {
  // A random pattern of 7 x 6 blocks of 5 x 7 (ragged: 33 rows, 40 keys), at q_offset 11.
  // A tile is Full when every block it touches is listed full, Empty when none is listed.
  const Index q_len = 33, kv_len = 40, offset = 11;
  const auto l = layout_of(q_len, kv_len, 5, 7, offset);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> pick(0, 3);  // 0, 1: unlisted, 2: partial, 3: full
  std::vector<std::vector<Index>> full_rows(7), partial_rows(7);
  for (Index qb = 0; qb < 7; ++qb)
    for (Index kb = 0; kb < 6; ++kb) {
      const int kind = pick(rng);
      if (kind == 2) partial_rows[static_cast<std::size_t>(qb)].push_back(kb);
      if (kind == 3) full_rows[static_cast<std::size_t>(qb)].push_back(kb);
    }
  const ak::BlockMask<> bm(l, list_of(partial_rows), list_of(full_rows));
  std::uniform_int_distribution<Index> row(0, q_len - 1), key(0, kv_len - 1), len(1, 20);
  int seen[3] = {0, 0, 0};
  for (int t = 0; t < 3000; ++t) {
    const Index r0 = row(rng), k0 = key(rng);
    const Range rows{r0, std::min(r0 + len(rng), q_len)}, keys{k0, std::min(k0 + len(rng), kv_len)};
    bool any = false, all_full = true;
    for (Index qb = rows.begin / 5; qb <= rows.last() / 5; ++qb)
      for (Index kb = keys.begin / 7; kb <= keys.last() / 7; ++kb) {
        const TileKind k = listed_kind(bm.full_blocks(), bm.partial_blocks(), qb, kb);
        any = any || k != TileKind::Empty;
        all_full = all_full && k == TileKind::Full;
      }
    const TileKind expected = !any       ? TileKind::Empty
                              : all_full ? TileKind::Full
                                         : TileKind::Partial;
    const Range q{rows.begin + offset, rows.end + offset};
    const TileKind kind = bm.classify(0, 0, q, keys);
    ++seen[static_cast<int>(kind)];
    INFO("rows [" << rows.begin << ", " << rows.end << ") keys [" << keys.begin << ", " << keys.end
                  << ")");
    CHECK(kind == expected);
    // And it agrees with keep(): Empty keeps nothing, Full keeps everything.
    const Index kept = ak::test::kept_pairs(bm, q, keys);
    if (kind == TileKind::Empty) CHECK(kept == 0);
    if (kind == TileKind::Full) CHECK(kept == (q.end - q.begin) * (keys.end - keys.begin));
  }
  CHECK(seen[0] > 0);
  CHECK(seen[1] > 0);
  CHECK(seen[2] > 0);
  // Query positions outside the layout's rows have no block: Empty.
  CHECK(bm.classify(0, 0, Range{0, offset}, Range{0, kv_len}) == TileKind::Empty);
  CHECK(bm.classify(0, 0, Range{offset + q_len, offset + q_len + 9}, Range{0, kv_len}) ==
        TileKind::Empty);
}

TEST_CASE("BlockMask: for_each_key_range streams maximal runs of listed key blocks",
          "[mask][block_mask]") {
  // 3 query blocks of 4 rows, 6 key blocks of 4 keys.
  //   row 0: full {0, 3}, partial {1}   -> keys [0, 8), [12, 16)
  //   row 1: partial {4}                -> keys [16, 20)
  //   row 2: nothing
  const auto l = layout_of(12, 24, 4, 4, 100);
  const ak::BlockMask<> bm(l, list_of({{1}, {4}, {}}), list_of({{0, 3}, {}, {}}));
  const auto ranges_of = [&](Range q) {
    std::vector<std::pair<Index, Index>> out;
    bm.for_each_key_range(0, 0, q, [&](Range r) { out.emplace_back(r.begin, r.end); });
    return out;
  };
  using Runs = std::vector<std::pair<Index, Index>>;
  CHECK(ranges_of({100, 104}) == Runs{{0, 8}, {12, 16}});
  CHECK(ranges_of({101, 102}) == Runs{{0, 8}, {12, 16}});  // any row of the block
  CHECK(ranges_of({104, 108}) == Runs{{16, 20}});
  CHECK(ranges_of({103, 105}) == Runs{{0, 8}, {12, 20}});  // blocks 3 and 4 merge into one run
  CHECK(ranges_of({100, 112}) == Runs{{0, 8}, {12, 20}});
  CHECK(ranges_of({108, 112}).empty());                   // a query block with nothing listed
  CHECK(ranges_of({90, 100}).empty());                    // rows before the layout
  CHECK(ranges_of({112, 130}).empty());                   // rows after it
  CHECK(ranges_of({95, 101}) == Runs{{0, 8}, {12, 16}});  // clipped to the layout's rows

  // On random patterns: the runs are sorted, disjoint, not touching, and hold exactly the
  // keys of the blocks listed for some query block of q.
  std::mt19937 rng(9);
  std::bernoulli_distribution live(0.3), full(0.5);
  const auto big = layout_of(50, 90, 8, 6, -3);  // 7 x 15 blocks, both ragged
  std::vector<std::vector<Index>> full_rows(7), partial_rows(7);
  for (std::size_t qb = 0; qb < 7; ++qb)
    for (Index kb = 0; kb < 15; ++kb)
      if (live(rng)) (full(rng) ? full_rows : partial_rows)[qb].push_back(kb);
  const ak::BlockMask<> random(big, list_of(partial_rows), list_of(full_rows));
  for (Index r0 = -5; r0 < 55; r0 += 3)
    for (Index len : {1, 7, 20}) {
      const Range q{r0 - 3, r0 - 3 + len};
      std::vector<char> expected(90, 0), got(90, 0);
      for (Index row = std::max<Index>(r0, 0); row < std::min<Index>(r0 + len, 50); ++row) {
        const auto qb = static_cast<std::size_t>(row / 8);
        for (const auto* rows : {&full_rows, &partial_rows})
          for (Index kb : (*rows)[qb])
            for (Index j = kb * 6; j < std::min<Index>(kb * 6 + 6, 90); ++j)
              expected[static_cast<std::size_t>(j)] = 1;
      }
      Index previous_end = -1;
      bool ordered = true;
      random.for_each_key_range(0, 0, q, [&](Range r) {
        ordered = ordered && r.begin < r.end && previous_end < r.begin;
        previous_end = r.end;
        for (Index j = r.begin; j < std::min<Index>(r.end, 90); ++j)
          got[static_cast<std::size_t>(j)] = 1;
      });
      INFO("q [" << q.begin << ", " << q.end << ")");
      CHECK(ordered);
      CHECK(got == expected);
    }
}

TEST_CASE("BlockMask: to_string draws the block pattern of a causal mask",
          "[mask][block_mask][to_string]") {
  // 16 x 16 with 4 x 4 blocks: the diagonal blocks are partial, the ones below full.
  const auto square = ak::make_block_mask(ak::Causal{}, 16, 16, 4, 4);
  CHECK(square.to_string() ==
        "+...\n"
        "#+..\n"
        "##+.\n"
        "###+\n");
  // 8 queries at the end of 16 keys (bottom-right): rows sit at positions 8..15.
  const auto decode = ak::make_block_mask(ak::Causal{}, 8, 16, 4, 4);
  CHECK(decode.to_string() ==
        "##+.\n"
        "###+\n");
  // Ragged: 10 rows and keys in blocks of 4; the last block of 2 keys is still partial.
  const auto ragged = ak::make_block_mask(ak::Causal{}, 10, 10, 4, 4);
  CHECK(ragged.to_string() ==
        "+..\n"
        "#+.\n"
        "##+\n");
  // With 1 x 1 blocks every block is uniform: the drawing is the element pattern itself.
  const auto elements = ak::make_block_mask(ak::Causal{}, 3, 3, 1, 1);
  CHECK(elements.to_string() ==
        "#..\n"
        "##.\n"
        "###\n");
  CHECK(ak::make_block_mask(ak::Causal{}, 0, 0, 4, 4).to_string().empty());
}

TEST_CASE("BlockMask: make_block_mask and to_dense reproduce the element rule",
          "[mask][block_mask][to_dense]") {
  const Index block_q = GENERATE(16, 48, 64, 128);
  const Index block_k = GENERATE(16, 64, 128);
  const auto [q_len, kv_len] = GENERATE(table<Index, Index>({{100, 100}, {37, 150}, {150, 77}}));
  const auto l = layout_of(q_len, kv_len, block_q, block_k, kv_len - q_len);
  check_block_mask_of(ak::Causal{}, l);
  check_block_mask_of(ak::Causal{} & ak::SlidingWindow{40, 0}, l);
  check_block_mask_of(ak::Causal{} & (ak::Sinks{4} | ak::SlidingWindow{30, 0}), l);
  check_block_mask_of(ak::Chunked{50}, l);
  check_block_mask_of(ak::Causal{} & ak::Chunked{64}, l);
  check_block_mask_of(ak::SlidingWindow{20, 10}, l);
}

TEST_CASE("BlockMask: make_block_mask of a per-head, per-batch mask and other q_offsets",
          "[mask][block_mask][to_dense]") {
  // HeadWindow has no classify(): every block is decided by counting its pairs.
  check_block_mask_of(HeadWindow{}, layout_of(70, 90, 16, 48, 20, 2, 3));
  check_block_mask_of(ak::Causal{}, layout_of(70, 90, 48, 16, -30));  // rows before key 0
  check_block_mask_of(ak::Causal{} & ak::SlidingWindow{10, 0}, layout_of(33, 200, 64, 16, 150));
  // The short form: q_len queries at the end of kv_len keys, one batch, shared heads.
  const auto bm = ak::make_block_mask(ak::Causal{}, 30, 50, 8, 16);
  CHECK(bm.layout().q_offset == 20);
  CHECK(bm.layout().batch == 1);
  CHECK(bm.layout().heads == 1);
  CHECK(bm.layout().block_q == 8);
  CHECK(bm.layout().block_k == 16);
  CHECK(ak::make_block_mask(ak::Causal{}, 30, 50).layout().block_q == 128);
}

TEST_CASE("BlockMask: sparsity is the fraction of blocks not listed", "[mask][block_mask]") {
  // The 3 x 3 pattern lists 5 of 9 blocks.
  const ak::BlockMask<> bm(small_layout(), small_partial(), small_full());
  CHECK_THAT(bm.sparsity(), Catch::Matchers::WithinAbs(4.0 / 9.0, 1e-15));
  // Causal, 4 x 4 blocks: 10 of 16 listed.
  CHECK_THAT(ak::make_block_mask(ak::Causal{}, 16, 16, 4, 4).sparsity(),
             Catch::Matchers::WithinAbs(0.375, 1e-15));
  CHECK_THAT(ak::make_block_mask(ak::Full{}, 100, 300, 64, 64).sparsity(),
             Catch::Matchers::WithinAbs(0.0, 1e-15));
  // Nothing listed: everything skipped.
  const ak::BlockMask<> none(layout_of(8, 8, 4, 4), list_of({{}, {}}), list_of({{}, {}}));
  CHECK_THAT(none.sparsity(), Catch::Matchers::WithinAbs(1.0, 1e-15));
  // Counted over every batch and head: batch 0 keeps all 4 blocks, batch 1 only one.
  const ak::BlockMask<> two(layout_of(8, 8, 4, 4, 0, 2, 1), list_of({{1}, {0}, {}, {}}),
                            list_of({{0}, {1}, {0}, {}}));
  CHECK_THAT(two.sparsity(), Catch::Matchers::WithinAbs(3.0 / 8.0, 1e-15));
  // No pairs at all: nothing to skip.
  CHECK_THAT(ak::make_block_mask(ak::Causal{}, 0, 0, 4, 4).sparsity(),
             Catch::Matchers::WithinAbs(0.0, 1e-15));
}

TEST_CASE("BlockMask: accepts empty rows and blocks repeated across rows", "[mask][block_mask]") {
  // Sortedness is per row: row 1 may start below row 0's last block.
  CHECK_NOTHROW(ak::BlockMask<>(small_layout(), list_of({{1, 2}, {0}, {}}), list_of({{}, {}, {}})));
  CHECK_NOTHROW(ak::BlockMask<>(small_layout(), list_of({{}, {}, {}}), list_of({{}, {}, {}})));
  // A block may be full in one row and partial in another.
  CHECK_NOTHROW(ak::BlockMask<>(small_layout(), list_of({{0}, {}, {}}), list_of({{}, {0}, {}})));
  // Zero batches: one offset, no blocks.
  CHECK_NOTHROW(ak::BlockMask<>(layout_of(8, 8, 4, 4, 0, 0), list_of({}), list_of({})));
}

TEST_CASE("BlockMask: a layout whose block count overflows is refused",
          "[mask][block_mask][errors]") {
  // Found by review: (q_len + block_q - 1) overflowed for block_q = INT64_MAX, giving 0 rows.
  ak::BlockMaskLayout l = layout_of(100, 100, std::numeric_limits<Index>::max(), 4);
  CHECK(l.q_blocks() == 1);
  CHECK_NOTHROW(ak::BlockMask<>(l, ak::BlockList{{0, 0}, {}}, ak::BlockList{{0, 0}, {}}));
  l.batch = Index{1} << 40;
  CHECK_THROWS_MATCHES(ak::BlockMask<>(l, ak::BlockList{{0}, {}}, ak::BlockList{{0}, {}}),
                       ak::Error,
                       Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring(
                           "BlockMask: expected batch * heads * q_blocks below 2^40")));
}

TEST_CASE("BlockMask: to_string and to_dense refuse a batch or head out of range",
          "[mask][block_mask][errors]") {
  const auto mask = ak::make_block_mask(ak::Causal{}, 8, 8, 4, 4);
  CHECK_THROWS_MATCHES(mask.to_string(3, 0), ak::Error,
                       Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring(
                           "BlockMask: b: expected in [0, 1), got 3")));
  CHECK_THROWS_AS(mask.to_dense(-1, 0), ak::Error);
  CHECK_THROWS_AS(mask.to_dense(0, -1), ak::Error);
  CHECK_NOTHROW(mask.to_string(0, 5));  // shared across heads: any head reads the one pattern
}

TEST_CASE("BlockMask: every malformed list throws attnkit::Error naming the field",
          "[mask][block_mask][errors]") {
  const auto l = small_layout();  // 3 BCSR rows, 3 key blocks
  const auto throws = [&](ak::BlockList partial, ak::BlockList full, const std::string& message) {
    INFO(message);
    CHECK_THROWS_MATCHES(
        ak::BlockMask<>(l, std::move(partial), std::move(full)), ak::Error,
        Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring(message)));
  };
  const auto empty = [] { return list_of({{}, {}, {}}); };

  SECTION("offsets of the wrong size") {
    throws(ak::BlockList{{0, 0, 0}, {}}, empty(),
           "BlockMask.partial.offsets.size(): expected batch * heads * q_blocks + 1 = 4, got 3");
    throws(empty(), ak::BlockList{{0, 0, 0, 0, 0}, {}},
           "BlockMask.full.offsets.size(): expected batch * heads * q_blocks + 1 = 4, got 5");
    throws(empty(), ak::BlockList{{}, {}}, "BlockMask.full.offsets.size()");
  }
  SECTION("offsets not starting at 0") {
    throws(empty(), ak::BlockList{{1, 1, 2, 2}, {0, 1}},
           "BlockMask.full.offsets[0]: expected 0, got 1");
  }
  SECTION("offsets not ending at blocks.size()") {
    throws(ak::BlockList{{0, 1, 1, 1}, {0, 1}}, empty(),
           "BlockMask.partial.offsets[rows]: expected blocks.size() = 2, got 1");
    throws(empty(), ak::BlockList{{0, 1, 2, 3}, {0, 1}},
           "BlockMask.full.offsets[rows]: expected blocks.size() = 2, got 3");
  }
  SECTION("decreasing offsets") {
    throws(ak::BlockList{{0, 2, 1, 3}, {0, 1, 2}}, empty(),
           "BlockMask.partial.offsets[2]: expected >= offsets[1] = 2 and <= blocks.size(), got 1");
    throws(empty(), ak::BlockList{{0, 0, -1, 0}, {}},
           "BlockMask.full.offsets[2]: expected >= offsets[1] = 0 and <= blocks.size(), got -1");
  }
  SECTION("offsets past blocks.size() are caught before any block is read") {
    // Regression: offsets that rise past the end and fall back made the block checks read
    // blocks[] out of bounds (found by a reviewer under ASan).
    throws(ak::BlockList{{0, 5, 3, 3}, {0, 1, 2}}, empty(),
           "BlockMask.partial.offsets[1]: expected >= offsets[0] = 0 and <= blocks.size(), got 5");
  }
  SECTION("unsorted or repeated block indices") {
    throws(list_of({{2, 1}, {}, {}}), empty(),
           "BlockMask.partial.blocks[1]: expected greater than the previous block of its row "
           "(sorted, no repeats), got 1");
    throws(empty(), list_of({{}, {0, 1, 1}, {}}),
           "BlockMask.full.blocks[2]: expected greater than the previous block of its row "
           "(sorted, no repeats), got 1");
  }
  SECTION("block indices out of range") {
    throws(list_of({{}, {3}, {}}), empty(),
           "BlockMask.partial.blocks[0]: expected a key block in [0, 3), got 3");
    throws(empty(), list_of({{0}, {}, {-1}}),
           "BlockMask.full.blocks[1]: expected a key block in [0, 3), got -1");
  }
  SECTION("a block both full and partial") {
    throws(list_of({{}, {0, 2}, {}}), list_of({{1}, {2}, {}}),
           "BlockMask.full.blocks[1]: expected a block not also listed partial in row 1, got 2");
  }
}

TEST_CASE("BlockMask: bad layout sizes throw attnkit::Error naming the field",
          "[mask][block_mask][errors]") {
  const auto [field, value] = GENERATE(table<std::string, Index>({{"batch", -1},
                                                                  {"heads", 0},
                                                                  {"q_len", -1},
                                                                  {"kv_len", -2},
                                                                  {"block_q", 0},
                                                                  {"block_k", -4}}));
  auto l = layout_of(8, 8, 4, 4);
  if (field == "batch") l.batch = value;
  if (field == "heads") l.heads = value;
  if (field == "q_len") l.q_len = value;
  if (field == "kv_len") l.kv_len = value;
  if (field == "block_q") l.block_q = value;
  if (field == "block_k") l.block_k = value;
  const std::string message = "BlockMask." + field + ": expected " +
                              (field == "heads" || field.rfind("block", 0) == 0 ? ">= 1" : ">= 0") +
                              ", got " + std::to_string(value);
  INFO(message);
  CHECK_THROWS_MATCHES(
      ak::BlockMask<>(l, list_of({{}, {}}), list_of({{}, {}})), ak::Error,
      Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring(message)));
  CHECK_THROWS_MATCHES(
      ak::make_block_mask(ak::Causal{}, l), ak::Error,
      Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring(message)));
}

TEST_CASE("BlockMask: validate checks the layout against the call", "[mask][block_mask][errors]") {
  // Laid out for batch 2, 4 heads of their own, 10 queries at position 5 over 12 keys.
  const auto l = layout_of(10, 12, 4, 4, 5, 2, 4);
  const auto bm = ak::make_block_mask(ak::Causal{}, l);
  CHECK_NOTHROW(bm.validate(10, 12, 5, 2, 4));
  const auto throws = [&](Index q_len, Index kv_len, Index q_offset, Index batch, Index heads,
                          const std::string& message) {
    INFO(message);
    CHECK_THROWS_MATCHES(
        bm.validate(q_len, kv_len, q_offset, batch, heads), ak::Error,
        Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring(message)));
  };
  throws(11, 12, 5, 2, 4, "BlockMask.q_len: expected 11, got 10");
  throws(10, 13, 5, 2, 4, "BlockMask.kv_len: expected 13, got 12");
  throws(10, 12, 2, 2, 4, "BlockMask.q_offset: expected 2, got 5");
  throws(10, 12, 5, 1, 4, "BlockMask.batch: expected 1, got 2");
  throws(10, 12, 5, 2, 8, "BlockMask.heads: expected 1 (shared) or q_heads = 8, got 4");
  // A shared mask (heads = 1) fits any head count.
  const auto shared = ak::make_block_mask(ak::Causal{}, 10, 12, 4, 4);
  CHECK_NOTHROW(shared.validate(10, 12, 2, 1, 1));
  CHECK_NOTHROW(shared.validate(10, 12, 2, 1, 16));
}
