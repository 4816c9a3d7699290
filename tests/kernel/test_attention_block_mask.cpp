// attention() with BlockMask: against reference::attention() over a grid (ragged sizes,
// Lq != Lk with q_offset, GQA with per-head and shared masks, batch 2, f32/bf16 storage, 1
// and 2 threads, rows that see nothing), against the element mask it was made from, bit for
// bit where the key tiles line up, on a user-built random pattern; the element rule is never
// asked about full or unlisted blocks; a BlockMask laid out for another call is refused.
// Built natively (the flavours run test_attention_paths.cpp).
#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/chunked.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/reference/attention.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/attention_runner.hpp"
#include "support/error_checks.hpp"
#include "support/mask_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

namespace {

using ak::test::block_layout;
using ak::test::Outcome;
using ak::test::run_case;
using ak::test::run_kernel;

template <class Spec>
void check(const Spec& spec, const Case& c) {
  INFO(ak::test::describe(c));
  ak::test::check_outcome(run_case(spec, c));
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i]));
    worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
  }
  return worst;
}

// A causal window whose length depends on batch and head: a mask no shared pattern fits.
struct HeadWindow {
  using slot = ak::MaskSlot;
  bool keep(Index b, Index h, Index i, Index j) const {
    return j <= i && i - j < 20 + 37 * h + 11 * b;
  }
};

// An element rule with no structure: keeps about 2 pairs in 3, differently per batch and head.
struct Scattered {
  bool keep(Index b, Index h, Index i, Index j) const {
    return (i * 7 + j * 13 + b * 5 + h * 3) % 3 != 0;
  }
};

// A random BCSR pattern: each (b, h, query block, key block) is listed with probability
// `live`, then full or partial with even odds.
struct RandomPattern {
  ak::BlockList partial{{0}, {}}, full{{0}, {}};
  std::vector<char> kinds;  // [rows, kv_blocks]: '#' full, '+' partial, '.' unlisted

  RandomPattern(const ak::BlockMaskLayout& l, double live, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::bernoulli_distribution listed(live), is_full(0.5);
    for (Index r = 0; r < l.rows(); ++r) {
      for (Index kb = 0; kb < l.kv_blocks(); ++kb) {
        char kind = '.';
        if (listed(rng)) kind = is_full(rng) ? '#' : '+';
        if (kind == '#') full.blocks.push_back(kb);
        if (kind == '+') partial.blocks.push_back(kb);
        kinds.push_back(kind);
      }
      full.offsets.push_back(static_cast<Index>(full.blocks.size()));
      partial.offsets.push_back(static_cast<Index>(partial.blocks.size()));
    }
  }
};

}  // namespace

TEST_CASE("attention with BlockMask: matches the reference for ragged lengths",
          "[attention][block_mask][grid]") {
  const Index len = GENERATE(1, 7, 65, 200, 333);
  const auto [block_q, block_k] =
      GENERATE(table<Index, Index>({{64, 64}, {128, 128}, {48, 80}, {16, 256}}));
  Case c = Case{}.lengths(len, len);
  check(ak::make_spec(ak::make_block_mask(ak::Causal{}, block_layout(c, block_q, block_k))), c);
  check(ak::make_spec(ak::make_block_mask(ak::Causal{} & ak::SlidingWindow{50, 0},
                                          block_layout(c, block_q, block_k))),
        c);
}

TEST_CASE("attention with BlockMask: Lq != Lk at any q_offset", "[attention][block_mask][grid]") {
  const auto [lq, lk, offset] = GENERATE(table<Index, Index, Index>({{150, 180, -20},
                                                                     {150, 180, 0},
                                                                     {150, 180, 50},
                                                                     {65, 7, -58},
                                                                     {1, 200, 199},
                                                                     {130, 257, 127},
                                                                     {64, 1000, 936}}));
  Case c = Case{}.lengths(lq, lk).at_offset(offset);
  check(ak::make_spec(ak::make_block_mask(ak::Causal{}, block_layout(c, 64, 128))), c);
  check(ak::make_spec(ak::make_block_mask(ak::Causal{} & (ak::Sinks{4} | ak::SlidingWindow{64, 0}),
                                          block_layout(c, 32, 64))),
        c);
}

TEST_CASE("attention with BlockMask: GQA with per-head and shared masks, batch 2",
          "[attention][block_mask][grid]") {
  const auto [hq, hkv] = GENERATE(table<Index, Index>({{4, 4}, {4, 2}, {3, 1}}));
  const int threads = GENERATE(1, 2);
  Case c = Case{}.lengths(150, 170).heads(hq, hkv).dims(32).batches(2).on_threads(threads);
  // heads = q_heads: each (batch, head) has its own block lists.
  check(
      ak::make_spec(ak::make_block_mask(HeadWindow{}, block_layout(c, 64, 32, /*per_head=*/true))),
      c);
  // heads = 1: one pattern for every head.
  check(ak::make_spec(
            ak::make_block_mask(ak::Causal{} & ak::SlidingWindow{40, 0}, block_layout(c, 32, 64))),
        c);
}

TEST_CASE("attention with BlockMask: bf16 storage and 1 or 2 threads",
          "[attention][block_mask][dtype]") {
  const int threads = GENERATE(1, 2);
  Case c = Case{}.lengths(100, 230).heads(4, 2).batches(2).on_threads(threads);
  // Same rounded inputs on both sides: the kernel computes in f32 from them.
  const auto spec =
      ak::make_spec(ak::make_block_mask(ak::Causal{} & ak::Chunked{96}, block_layout(c, 64, 64)));
  ak::test::check_outcome(run_case<Eigen::bfloat16>(spec, c));
  ak::test::check_outcome(run_case<float>(spec, c));
}

TEST_CASE("attention with BlockMask: a row that sees nothing gives 0 and LSE -inf",
          "[attention][block_mask][edge]") {
  SECTION("query blocks with no listed block") {
    // 3 query blocks of 8 rows, 2 key blocks of 16: the middle query block lists nothing.
    Case c = Case{}.lengths(20, 30);
    const ak::BlockMask<> bm(block_layout(c, 8, 16), ak::BlockList{{0, 1, 1, 1}, {1}},
                             ak::BlockList{{0, 1, 1, 3}, {0, 0, 1}});
    const Outcome r = run_case(ak::make_spec(bm), c);
    CHECK(r.empty_rows == c.q_heads * 8);
    ak::test::check_outcome(r);
  }
  SECTION("causal rows before key 0 and an element rule that drops a whole row") {
    // rows 0..9 sit before key 0
    Case c = Case{}.lengths(70, 50).at_offset(-10);
    const Outcome r =
        run_case(ak::make_spec(ak::make_block_mask(ak::Causal{}, block_layout(c, 16, 16))), c);
    CHECK(r.empty_rows == c.q_heads * 10);
    ak::test::check_outcome(r);
    // A partial block whose rule keeps nothing for some rows: key block 0 (keys 0..3) is the
    // only one listed, with Chunked{4} as its rule, so rows 4..11 (other chunks) see nothing.
    Case d = Case{}.lengths(12, 12);
    const ak::BlockMask<ak::Chunked> chunks(block_layout(d, 12, 4), ak::BlockList{{0, 1}, {0}},
                                            ak::BlockList{{0, 0}, {}}, ak::Chunked{4});
    const Outcome e = run_case(ak::make_spec(chunks), d);
    CHECK(e.empty_rows == d.q_heads * 8);
    ak::test::check_outcome(e);
  }
}

TEST_CASE("attention with BlockMask: make_block_mask(m) gives the output of m",
          "[attention][block_mask]") {
  const auto sizes = GENERATE(table<Index, Index>({{64, 128}, {128, 64}, {40, 72}}));
  // Named copies, not a structured binding: C++17 (Clang 14) cannot capture one in a lambda.
  const Index block_q = std::get<0>(sizes), block_k = std::get<1>(sizes);
  Case c = Case{}.lengths(300, 420).laid_out(Layout::Bhsd);
  c.q_heads = 2;
  const auto same = [&](const auto& mask) {
    const ak::test::KernelResult direct = run_kernel(ak::make_spec(mask), c);
    const ak::test::KernelResult blocked =
        run_kernel(ak::make_spec(ak::make_block_mask(mask, block_layout(c, block_q, block_k))), c);
    CHECK(max_diff(direct.out, blocked.out) <= tol::kF32);
    CHECK(ak::test::max_lse_diff(direct.lse, blocked.lse) <= tol::kLseF32);
  };
  INFO("block_q=" << block_q << " block_k=" << block_k);
  same(ak::Causal{});
  same(ak::Causal{} & ak::SlidingWindow{100, 0});
  same(ak::Causal{} & (ak::Sinks{4} | ak::SlidingWindow{60, 0}));
  same(ak::Chunked{100});
  same(ak::Causal{} & ak::Chunked{128});
  same(ak::SlidingWindow{30, 30});
}

TEST_CASE("attention with BlockMask: bit-identical to Causal and Causal & Chunked{256}",
          "[attention][block_mask]") {
  // Why bit for bit: the kernel cuts each key range into 256-key tiles from the range's
  // start. Causal's ranges start at key 0 and Causal & Chunked{256}'s at a chunk start, a
  // multiple of 256; a BlockMask's runs start at the first listed key block, which for 64,
  // 128 or 256-key blocks begins at that same key. So both walk tiles that begin at the
  // same multiples of 256, and every kept key sits at the same place of the same tile, in
  // the same GEMM step. The BlockMask may walk longer tiles, or whole tiles a query tile
  // cannot see (its blocks are coarser than the mask): those extra keys are masked to -inf,
  // weigh exp2(-inf) = 0 and add exact zeros -- to the softmax sum, to the P V product
  // (fma(0, v, acc) = acc) -- while the running max, and so the rescale factor exp2(0) = 1,
  // stay the same. Full or Partial on the same tile computes the same numbers too. (With
  // 48-key blocks the runs of Chunked{256} start at key 240: the tiles, and so the order of
  // the sums, differ, and the outputs agree only within f32 rounding.)
  const Index block_q = GENERATE(64, 128, 256);
  const Index block_k = GENERATE(64, 128, 256);
  const auto [lq, lk] = GENERATE(table<Index, Index>({{700, 700}, {300, 812}, {200, 300}}));
  Case c = Case{}.lengths(lq, lk).laid_out(Layout::Bhsd);
  c.q_heads = 1;
  INFO("block_q=" << block_q << " block_k=" << block_k << " Lq=" << lq << " Lk=" << lk);
  const auto identical = [&](const auto& mask) {
    const ak::test::KernelResult direct = run_kernel(ak::make_spec(mask), c);
    const ak::test::KernelResult blocked =
        run_kernel(ak::make_spec(ak::make_block_mask(mask, block_layout(c, block_q, block_k))), c);
    CHECK(std::memcmp(direct.out.data(), blocked.out.data(), direct.out.size() * sizeof(float)) ==
          0);
    CHECK(std::memcmp(direct.lse.data(), blocked.lse.data(), direct.lse.size() * sizeof(float)) ==
          0);
  };
  identical(ak::Causal{});
  identical(ak::Causal{} & ak::Chunked{256});
}

TEST_CASE("attention with BlockMask: a user-built random pattern matches the reference",
          "[attention][block_mask][random]") {
  // 10% of the blocks live, half of them partial with a rule of their own; per head and
  // per batch; ragged blocks (32 x 48 over 300 x 500); many query blocks see nothing.
  const int threads = GENERATE(1, 2);
  Case c =
      Case{}.lengths(300, 500).heads(4, 2).dims(32).batches(2).on_threads(threads).at_offset(37);
  const ak::BlockMaskLayout l = block_layout(c, 32, 48, /*per_head=*/true);
  const RandomPattern pattern(l, 0.1, 2024);
  const ak::BlockMask<Scattered> bm(l, pattern.partial, pattern.full);
  INFO("sparsity " << bm.sparsity());
  CHECK(bm.sparsity() > 0.85);
  const Outcome r = run_case(ak::make_spec(bm), c);
  CHECK(r.empty_rows > 0);
  ak::test::check_outcome(r);
}

namespace {

// An element rule that counts its calls and those made for a pair outside a partial block.
struct CountingRule {
  const std::vector<char>* kinds;  // [q_blocks, kv_blocks] of the pattern, one batch and head
  Index block_q, block_k, kv_blocks, q_offset;
  std::atomic<long>* calls;
  std::atomic<long>* outside_partial;

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    calls->fetch_add(1);
    const Index qb = (i - q_offset) / block_q, kb = j / block_k;
    if ((*kinds)[static_cast<std::size_t>(qb * kv_blocks + kb)] != '+')
      outside_partial->fetch_add(1);
    return (i + 2 * j) % 3 != 0;
  }
};

}  // namespace

TEST_CASE("attention with BlockMask: the rule is never asked about full or unlisted blocks",
          "[attention][block_mask][mask]") {
  // 32 x 64 blocks are smaller than the kernel's 64 x 256 tiles, so its Partial tiles hold
  // full, partial and unlisted blocks side by side: keep() runs on every pair of such a
  // tile, and must ask the rule only inside partial blocks -- each such pair exactly once.
  // Query blocks 0-1 list key blocks 0-3 full: a whole Full tile, where keep() never runs.
  const int threads = GENERATE(1, 2);
  Case c = Case{}.lengths(200, 700).dims(32).on_threads(threads);
  c.q_heads = 1;
  ak::BlockMaskLayout l = block_layout(c, 32, 64);
  RandomPattern pattern(l, 0.5, 7);
  for (Index qb = 0; qb < 2; ++qb)
    for (Index kb = 0; kb < 4; ++kb)
      pattern.kinds[static_cast<std::size_t>(qb * l.kv_blocks() + kb)] = '#';
  ak::BlockList partial{{0}, {}}, full{{0}, {}};
  long partial_pairs = 0;
  for (Index qb = 0; qb < l.q_blocks(); ++qb) {
    for (Index kb = 0; kb < l.kv_blocks(); ++kb) {
      const char kind = pattern.kinds[static_cast<std::size_t>(qb * l.kv_blocks() + kb)];
      if (kind == '#') full.blocks.push_back(kb);
      if (kind != '+') continue;
      partial.blocks.push_back(kb);
      partial_pairs += std::min(l.block_q, l.q_len - qb * l.block_q) *
                       std::min(l.block_k, l.kv_len - kb * l.block_k);
    }
    full.offsets.push_back(static_cast<Index>(full.blocks.size()));
    partial.offsets.push_back(static_cast<Index>(partial.blocks.size()));
  }
  std::atomic<long> calls{0}, outside{0};
  const CountingRule rule{&pattern.kinds, l.block_q, l.block_k, l.kv_blocks(),
                          l.q_offset,     &calls,    &outside};
  const ak::BlockMask<CountingRule> bm(l, partial, full, rule);
  const auto spec = ak::make_spec(bm);

  Tensor<float> q(Layout::Bhsd, 1, 1, c.q_len, c.dim), k(Layout::Bhsd, 1, 1, c.kv_len, c.dim),
      v(Layout::Bhsd, 1, 1, c.kv_len, c.dim), o(Layout::Bhsd, 1, 1, c.q_len, c.dim);
  Tensor<double> expected(Layout::Bhsd, 1, 1, c.q_len, c.dim);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view, c.options());
  INFO("rule calls " << calls.load() << ", pairs in partial blocks " << partial_pairs);
  CHECK(outside.load() == 0);
  CHECK(calls.load() == partial_pairs);
  CHECK(partial_pairs > 0);

  ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), expected.view, c.options());
  CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
}

TEST_CASE("attention with BlockMask: a mask laid out for another call throws and writes nothing",
          "[attention][block_mask][errors]") {
  // The call: batch 2, 4 query heads over 2 KV heads, 40 queries after 60 keys (q_offset 20).
  Case c = Case{}.lengths(40, 60).heads(4, 2).batches(2).dims(32).laid_out(Layout::Bhsd);
  const ak::test::Inputs<float> in(c, 1);
  Tensor<float> o(Layout::Bhsd, 2, 4, 40, 32);
  const auto refused = [&](const auto& spec, const ak::Options& options, const char* message) {
    o.fill(42.f);
    std::vector<float> lse(static_cast<std::size_t>(c.rows()), 42.f);
    ak::test::check_refused(
        [&] {
          ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                        options.with_lse(lse));
        },
        {message}, {&o.memory, &lse}, 42.f);
    Tensor<double> ref(Layout::Bhsd, 2, 4, 40, 32);
    ak::test::check_error(
        [&] {
          ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), ref.view,
                                   options);
        },
        {message});
  };
  // Alone and inside a combination (found by review: `Causal & blocks` went unchecked).
  const auto throws = [&](const ak::BlockMaskLayout& l, const ak::Options& options,
                          const char* message) {
    INFO(message);
    const auto blocks = ak::make_block_mask(ak::Causal{}, l);
    refused(ak::make_spec(blocks), options, message);
    refused(ak::make_spec(ak::Causal{} & blocks), options, message);
    refused(ak::make_spec(ak::Sinks{0} | blocks), options, message);
  };
  const ak::Options defaults;
  ak::BlockMaskLayout l = block_layout(c, 16, 16);
  l.q_len = 41;
  throws(l, defaults, "BlockMask.q_len: expected 40, got 41");
  l = block_layout(c, 16, 16);
  l.kv_len = 64;
  throws(l, defaults, "BlockMask.kv_len: expected 60, got 64");
  l = block_layout(c, 16, 16);
  throws(l, ak::Options{}.with_q_offset(0), "BlockMask.q_offset: expected 0, got 20");
  l.q_offset = 0;  // laid out for q_offset 0, called with the default 20
  throws(l, defaults, "BlockMask.q_offset: expected 20, got 0");
  l = block_layout(c, 16, 16);
  l.batch = 1;
  throws(l, defaults, "BlockMask.batch: expected 2, got 1");
  l = block_layout(c, 16, 16);
  l.heads = 2;  // one pattern per KV head is not a layout attention() knows
  throws(l, defaults, "BlockMask.heads: expected 1 (shared) or q_heads = 4, got 2");

  // The same masks laid out right run.
  CHECK_NOTHROW(
      ak::attention(ak::make_spec(ak::make_block_mask(ak::Causal{}, block_layout(c, 16, 16))),
                    in.q.cview(), in.k.cview(), in.v.cview(), o.view));
  CHECK_NOTHROW(
      ak::attention(ak::make_spec(ak::make_block_mask(ak::Causal{}, block_layout(c, 16, 16, true))),
                    in.q.cview(), in.k.cview(), in.v.cview(), o.view));
}
