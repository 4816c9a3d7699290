// attention() under masks with gathered columns (mask/key_columns.hpp): the range part runs
// as key tiles, the query tile's columns row by row or, shared by its queries, as a gathered
// key tile (kernel/tiles/tile_columns.hpp), under the plan the kernel picks
// (kernel/tiles/tile_plan.hpp) or each plan forced. Against reference::attention(): PowerOfTwo
// alone and combined (Causal &, | Sinks), dilated and landmark masks written the way a user writes
// them, a BlockMask of narrow blocks through BlockColumns (mask/block_columns.hpp), ragged sizes,
// Lq != Lk and q_offset, GQA, two batches, decode (split-KV), every normalizer, bf16 / f16 /
// q8_0 storage, score mods (ALiBi, Softcap) and RoPE; more columns than a tile of logits
// holds; a NaN value row in a shared tile; the gathered and the element-rule (whole-mask)
// paths agree; threads bitwise.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <attnkit/kernel/tiles/tile_columns.hpp>
#include <attnkit/kernel/tiles/tile_plan.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "support/catalogue.hpp"
#include "support/error_checks.hpp"
#include "support/mask_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::PowerOfTwo;
using ak::detail::PlanChoice;
using ak::test::check_attention;

namespace user {

// Dilated attention, as a user adds it: query i sees its last `local` keys and `count` more
// at every `stride`-th distance beyond them. The local keys are a range (a mask with every
// face of its own); the dilated ones are columns, at most N of them.
template <int N = 64>
struct Dilated {
  using slot = ak::MaskSlot;
  Index local = 8, stride = 5, count = 40;  // count <= N

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    const Index d = i - j, beyond = d - (local - 1);
    return d >= 0 && (d < local || (beyond % stride == 0 && beyond / stride <= count));
  }
  // The keys a query range may see, so that the whole-mask path walks no more than these.
  ak::KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, ak::Range q) const {
    return ak::key_range(q.begin - (local - 1) - count * stride, q.end);
  }
  auto range_part() const { return Causal{} & ak::SlidingWindow{local - 1, 0}; }
  ak::KeyColumns<N> columns(Index /*b*/, Index /*h*/, Index i) const {
    ak::KeyColumns<N> c;
    for (Index t = count; t >= 1; --t)
      if (i - (local - 1) - t * stride >= 0) c.add(i - (local - 1) - t * stride);
    return c;
  }
};

// Landmarks, as a user adds them: query i sees its last `local` keys and every `every`-th
// key before them. The tile's queries share those columns, so the kernel gathers them into
// key tiles (tile_columns.hpp's shared form) instead of forming them query by query.
struct Landmarks {
  using slot = ak::MaskSlot;
  Index local = 8, every = 16;

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    return 0 <= j && j <= i && (i - j < local || j % every == 0);
  }
  ak::KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, ak::Range q) const {
    return ak::key_range(0, q.end);
  }
  auto range_part() const { return Causal{} & ak::SlidingWindow{local - 1, 0}; }
  ak::KeyColumns<128> columns(Index /*b*/, Index /*h*/, Index i) const {
    ak::KeyColumns<128> c;  // up to key 128 * every (every test shape)
    for (Index j = 0; j <= i - local; j += every) c.add(j);
    return c;
  }
};

// Keys picked per group of 16 queries, the way a router's top-k or a file gives them: query
// i sees key j <= i when j hashes into its group's picks, and the diagonal. A BlockMask of
// single-key (or 4-key) blocks holds it; BlockColumns gives it the columns face.
struct Picked {
  Index group = 16;
  bool keep(Index /*b*/, Index h, Index i, Index j) const {
    if (j > i) return false;
    const Index g = i / group;
    return j == i || (j * 7 + g * 3 + h) % 11 == 0 || j % 29 == 0;
  }
};

}  // namespace user

namespace {

// Sets the plan for masks with columns for one scope.
struct ForcedPlan {
  explicit ForcedPlan(PlanChoice c) { ak::detail::plan_choice() = c; }
  ~ForcedPlan() { ak::detail::plan_choice() = PlanChoice::Auto; }
};

const char* name(PlanChoice c) {
  switch (c) {
    case PlanChoice::Whole:
      return "whole mask";
    case PlanChoice::Gathered16:
      return "gathered, 16 rows";
    case PlanChoice::Gathered64:
      return "gathered, 64 rows";
    default:
      return "by cost";
  }
}

Case shape(Index q_len, Index kv_len, Index dim, Index q_offset) {
  return Case{}.lengths(q_len, kv_len).heads(2, 1).dims(dim).on_threads(2).at_offset(q_offset);
}

template <class Visit>
void for_each_mask(Visit&& visit) {
  visit("PowerOfTwo{4, 16}", PowerOfTwo{4, 16});
  visit("Causal & PowerOfTwo{0, 8}", Causal{} & PowerOfTwo{0, 8});
  visit("PowerOfTwo{2, 8} | Sinks{6}", PowerOfTwo{2, 8} | ak::Sinks{6});
  visit("Dilated{8, 5, 40}", user::Dilated<>{});
  visit("Landmarks{8, 16}", user::Landmarks{});
}

}  // namespace

TEST_CASE("columns: every mask and plan matches the reference on ragged shapes",
          "[attention][mask][columns]") {
  const PlanChoice plan =
      GENERATE(PlanChoice::Auto, PlanChoice::Whole, PlanChoice::Gathered16, PlanChoice::Gathered64);
  const ForcedPlan forced(plan);
  std::vector<Case> cases = {shape(300, 300, 64, 0), shape(130, 90, 32, -25)};
  if (plan == PlanChoice::Auto) {  // the plan chosen by cost on more shapes
    cases.push_back(shape(77, 700, 32, 623));
    cases.push_back(Case{}.lengths(200, 450).heads(4, 2).dims(48).on_threads(3).batches(2));
  }
  for (const Case& c : cases) {
    for_each_mask([&](const char* mask, const auto& m) {
      check_attention(std::string(mask) + ", " + name(plan), ak::make_spec(m), c);
    });
  }
}

TEST_CASE("columns: decode reads the columns of each key chunk", "[attention][mask][columns]") {
  // Lq <= 16 runs split-KV: 512-key chunks, each query's columns inside each chunk.
  for (const Index q_len : {1, 3, 16})
    for_each_mask([&](const char* mask, const auto& m) {
      check_attention(mask, ak::make_spec(m), shape(q_len, 1500, 64, 1500 - q_len));
    });
  check_attention("PowerOfTwo{4, 16}, GQA 8/2", ak::make_spec(PowerOfTwo{4, 16}),
                  Case{}.lengths(2, 1300).heads(8, 2).dims(64));
}

TEST_CASE("columns: every normalizer, score mod and RoPE", "[attention][mask][columns]") {
  // PowerOfTwo's columns row by row, the landmarks' as a shared key tile (each lane masked
  // to its query's columns, score mods and cosine norms per element).
  const ForcedPlan forced(PlanChoice::Gathered16);
  const Case c = shape(150, 400, 32, 250);
  const auto each = [&](const char* mask, const auto& m) {
    const std::string s = std::string(mask) + ", ";
    ak::test::for_each_normalizer(c.q_heads, [&](const std::string& name, const auto& n) {
      check_attention(s + name, ak::make_spec(m, n), c);
    });
    check_attention(s + "Alibi::standard(2)", ak::make_spec(m, ak::Alibi::standard(2)), c);
    check_attention(s + "Softcap{5}", ak::make_spec(m, ak::Softcap{5.f}), c);
    check_attention(s + "Rope", ak::make_spec(m, ak::Rope(ak::RopeTable(32, 10000, 512))), c);
  };
  each("PowerOfTwo{2, 8}", PowerOfTwo{2, 8});
  each("Landmarks{8, 16}", user::Landmarks{});
  check_attention("Tapa (the whole mask)", ak::make_spec(PowerOfTwo{2, 8}, ak::Tapa{}), c);
}

TEST_CASE("columns: bf16, f16 and q8_0 rows are widened per column", "[attention][mask][columns]") {
  const ForcedPlan forced(PlanChoice::Gathered16);
  const Case c = shape(100, 333, 64, 233);
  const auto spec = ak::make_spec(Causal{} & PowerOfTwo{1, 4});
  check_attention<Eigen::bfloat16>("Causal & PowerOfTwo{1, 4}", spec, c);
  check_attention<Eigen::half>("Causal & PowerOfTwo{1, 4}", spec, c);
  INFO("q8_0 K and V");
  ak::test::check_attention_on(spec, c,
                               ak::test::Inputs<ak::BlockQ8_0, float, ak::BlockQ8_0>(c, 5));
}

TEST_CASE("columns: more columns per query than a tile of logits holds",
          "[attention][mask][columns]") {
  // 300 columns a query against the engine's 256-row logit tile: two column tiles.
  const user::Dilated<320> many{4, 2, 300};
  const ForcedPlan forced(PlanChoice::Gathered16);
  check_attention("Dilated{4, 2, 300}", ak::make_spec(many), shape(40, 700, 32, 660));
  // Far queries: 40 powers of two, three transposing adds of 16 a query.
  check_attention("PowerOfTwo{0, 0} at 2^40", ak::make_spec(PowerOfTwo{0, 0}),
                  shape(20, 64, 32, Index{1} << 40));
}

TEST_CASE("columns: the gathered and the element-rule paths agree, bitwise over threads",
          "[attention][mask][columns]") {
  const Case c = shape(333, 333, 64, 0);
  const auto spec = ak::make_spec(PowerOfTwo{3, 12});
  const auto run = [&](PlanChoice plan, int threads) {
    const ForcedPlan forced(plan);
    Case t = c;
    t.threads = threads;
    return ak::test::run_kernel(spec, t);
  };
  const auto whole = run(PlanChoice::Whole, 1);
  for (const PlanChoice plan : {PlanChoice::Gathered16, PlanChoice::Gathered64}) {
    INFO(name(plan));
    const auto one = run(plan, 1);
    double worst = 0;
    for (std::size_t x = 0; x < one.out.size(); ++x)
      worst = std::max(worst, double(std::abs(one.out[x] - whole.out[x])));
    CHECK(worst <= 2 * ak::test::tol::kF32);  // two f32 evaluations of one attention
    for (const int threads : {2, 3})
      CHECK(ak::test::bytes_of(run(plan, threads)) == ak::test::bytes_of(one));
  }
}

TEST_CASE("columns: the plan follows the cost", "[attention][mask][columns]") {
  ak::Problem p{};
  p.q_len = p.kv_len = 16384;
  const auto plan = [&](const auto& mask) { return ak::detail::plan_tiles(mask, p); };
  // A narrow window: 64 queries a tile, whose window tiles run banded (kernel/tiles/tile_band.hpp),
  // beat 16 queries a tile, whose window tiles are whole but narrow GEMMs.
  CHECK(plan(PowerOfTwo{4, 64}).gather);
  CHECK(plan(PowerOfTwo{4, 64}).rows == 64);
  CHECK(plan(PowerOfTwo{4, 1024}).gather);  // a wide one: 64
  CHECK(plan(PowerOfTwo{4, 1024}).rows == 64);
  // Columns at every other key, within its key ranges: tiles that keep half their pairs beat
  // two rows read per pair.
  CHECK_FALSE(plan(user::Dilated<320>{4, 2, 300}).gather);
  const ForcedPlan forced(PlanChoice::Gathered64);
  CHECK(plan(user::Dilated<320>{4, 2, 300}).rows == 64);
}

TEST_CASE("columns: a value row that is not finite reaches only the queries with its column",
          "[attention][mask][columns]") {
  // Landmark key 240 NaN (its K and V rows): the tiles' shared columns form a key tile in
  // which queries 236 .. 239, before the key, have weight 0 for it (and 0 * NaN is NaN). Those
  // rows must come out as without the NaN; the rows that see key 240 are NaN.
  const Case c = shape(64, 300, 32, 236);  // queries 236 .. 299
  const auto spec = ak::make_spec(user::Landmarks{});
  for (const PlanChoice plan : {PlanChoice::Gathered16, PlanChoice::Gathered64}) {
    INFO(name(plan));
    const ForcedPlan forced(plan);
    ak::test::Inputs<float> clean(c, 3), dirty(c, 3);
    for (Index h = 0; h < c.kv_heads; ++h) {
      std::fill(dirty.k.view.row(0, h, 240), dirty.k.view.row(0, h, 240) + c.dim, ak::test::kNaN);
      std::fill(dirty.v.view.row(0, h, 240), dirty.v.view.row(0, h, 240) + c.dv(), ak::test::kNaN);
    }
    const auto on = [&](const ak::test::Inputs<float>& in) {
      return ak::test::run_into<decltype(spec)>(
          c, [&](const ak::View<float>& o, const ak::Options& options) {
            ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
          });
    };
    const auto r_clean = on(clean), r_dirty = on(dirty);
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index r = 0; r < c.q_len; ++r) {
        const float* x = r_dirty.out.data() + (h * c.q_len + r) * c.dv();
        const float* y = r_clean.out.data() + (h * c.q_len + r) * c.dv();
        if (236 + r >= 240) {  // the shape's q_offset
          CHECK(std::isnan(x[0]));
        } else {
          CHECK(std::equal(x, x + c.dv(), y));
        }
      }
  }
}

TEST_CASE("columns: BlockColumns, a BlockMask of narrow key blocks, matches the reference",
          "[attention][mask][columns]") {
  const PlanChoice plan =
      GENERATE(PlanChoice::Auto, PlanChoice::Whole, PlanChoice::Gathered16, PlanChoice::Gathered64);
  const ForcedPlan forced(plan);
  const std::vector<Case> cases = {shape(130, 300, 32, 170), shape(77, 77, 64, 0),
                                   Case{}.lengths(40, 200).heads(4, 2).dims(32).batches(2)};
  for (const Case& c : cases)
    // Single keys shared by query blocks of 16 (key tiles) or 8 or 3 (rows), 4-key blocks,
    // one pattern per head.
    for (const auto& [block_q, block_k, per_head] :
         {std::tuple{16, 1, false}, {8, 1, true}, {3, 1, false}, {16, 4, true}}) {
      INFO("blocks " << block_q << " x " << block_k << (per_head ? ", per head" : ""));
      const auto blocks = ak::make_block_mask(
          user::Picked{}, ak::test::block_layout(c, block_q, block_k, per_head));
      check_attention(name(plan), ak::make_spec(ak::block_columns<320>(blocks)), c);
    }
}

TEST_CASE("columns: BlockColumns keeps what its BlockMask keeps, and checks its capacity",
          "[mask][columns]") {
  const Case c = shape(64, 400, 32, 336);
  for (const Index block_k : {1, 3}) {
    const auto blocks =
        ak::make_block_mask(user::Picked{}, ak::test::block_layout(c, 16, block_k, false));
    const ak::BlockColumns<400, user::Picked> mask(blocks);
    std::vector<Index> positions;
    for (Index i = 330; i < 400; i += 7) positions.push_back(i);  // before the queries too
    INFO("block_k " << block_k);
    ak::test::check_columns_split_keep(mask, positions, 400);
  }
  // A query block lists about 60 keys (the diagonal's 16, the picks, every 29th): 16 is refused.
  const auto blocks = ak::make_block_mask(user::Picked{}, ak::test::block_layout(c, 16, 1, false));
  ak::test::check_error([&] { ak::BlockColumns<16, user::Picked>{blocks}; },
                        {"BlockColumns: N", ">= the most keys a query block lists", "16"});
}
