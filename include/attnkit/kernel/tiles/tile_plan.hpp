// How attention() tiles a call whose mask has gathered columns (mask/key_columns.hpp): with
// the columns gathered or not, and with query tiles of 64 or 16 rows. A tile of 64 queries
// fills the GEMM's register block, but under a narrow range part (PowerOfTwo's window of 64)
// its key tiles are mostly masked: 16 queries visit 80 keys of a window of 64 where 64
// queries visit 128, unless the tile runs banded (kernel/tiles/tile_band.hpp: each 16 queries
// over their 80 keys, with narrower GEMMs). A gathered column costs more than a tiled pair (its K
// and V rows are read for one query, from L3 or memory). The plan compares the three costs on a
// sample of query tiles, in units of one tiled (query, key) pair, with the weights below.
#pragma once

#include <algorithm>
#include <atomic>
#include <vector>

#include "attnkit/kernel/tiles/tile_band.hpp"
#include "attnkit/kernel/tiles/tile_config.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/mask/key_schedule.hpp"
#include "attnkit/problem.hpp"

namespace attnkit::detail {

struct TilePlan {
  bool gather = false;  // the range part tiled, the columns gathered (else the whole mask)
  Index rows = 64;      // queries per tile
};

// Cost weights, relative to a pair of a Full tile of 64 queries (measured with bench_masks,
// d 128, f32, one thread, AVX-512): a pair of a 16-query tile costs 1.3 (one GEMM vector of
// queries), a Partial pair masked by keep() 1.5 more, by runs() 0.1 more, and a gathered
// column 6 (two rows read for one query; about 2 when they sit in L2). Columns that the
// tile's queries share form key tiles (kernel/tiles/tile_columns.hpp): a pair of those costs 2.5,
// its mask walked query by query (and 16-row tiles 1.3 times that). A Partial tile whose
// queries see a band of it (kernel/tiles/tile_band.hpp) costs 1.15 a pair of the band.
struct TileCosts {
  static constexpr double kNarrowRows = 1.3;
  static constexpr double kKeepMasked = 1.5;
  static constexpr double kRunsMasked = 0.1;
  static constexpr double kColumn = 6.0;
  static constexpr double kSharedPair = 2.5;
  static constexpr double kBandPair = 1.15;
};

/// Whether `distinct` columns, `total` of them counted query by query, cost less over `rows`
/// queries as key tiles (every query's pair with every distinct column) than row by row.
inline bool shares_columns(Index distinct, Index total, Index rows) {
  return double(distinct) * double(rows) * TileCosts::kSharedPair <=
         double(total) * TileCosts::kColumn;
}

/// The plan attention() takes for a mask with columns: by cost (Auto), or forced (tests
/// compare the paths, benches time each). Process-wide; other masks ignore it.
enum class PlanChoice { Auto, Whole, Gathered16, Gathered64 };
inline std::atomic<PlanChoice>& plan_choice() {
  static std::atomic<PlanChoice> choice{PlanChoice::Auto};
  return choice;
}

// The cost of the key tiles `mask` visits for query positions q (at most kv_len keys) of
// head h in batch b.
template <class Mask>
double tiled_cost(const Mask& mask, Index b, Index h, Range q, Index kv_len) {
  double cost = 0;
  const double masked = has_runs<Mask>::value ? TileCosts::kRunsMasked : TileCosts::kKeepMasked;
  const Index nq = q.end - q.begin;
  TileBand band;
  for_each_key_tile(mask, b, h, q, kv_len, TileConfig::kBlockK, [&](Range kv, TileKind kind) {
    const Index nk = kv.end - kv.begin;
    if (kind == TileKind::Full) return void(cost += double(nk) * double(nq));
    const bool banded = band.form(mask, b, h, q.begin, kv.begin, nk, nq, simd::round_up(nq));
    cost += (banded ? double(band.covered()) * TileCosts::kBandPair : double(nk) * double(nq)) *
            (1.0 + masked);
  });
  return cost;
}

// The cost of the columns of query positions q (in [0, kv_len)), in the form the engine
// gives them: key tiles when the queries share them (at least 8 queries), else row by row.
// `all` is scratch.
template <class Mask>
double columns_cost(const Mask& mask, Index b, Index h, Range q, Index kv_len, double rows_weight,
                    std::vector<Index>& all) {
  all.clear();
  for (Index i = q.begin; i < q.end; ++i)
    for (const Index j : mask.columns(b, h, i))
      if (j >= 0 && j < kv_len) all.push_back(j);
  const Index total = Index(all.size()), rows = q.end - q.begin;
  std::sort(all.begin(), all.end());
  const Index distinct = Index(std::unique(all.begin(), all.end()) - all.begin());
  if (rows >= 8 && shares_columns(distinct, total, rows))
    return double(distinct) * double(rows) * TileCosts::kSharedPair * rows_weight;
  return double(total) * TileCosts::kColumn;
}

/// The plan for a call of p's sizes under `mask`: eight query tiles spread over the call,
/// and over its batches and heads (a pattern may differ per head), are costed each way.
template <class Mask>
TilePlan plan_tiles(const Mask& mask, const Problem& p) {
  TilePlan plan;
  if constexpr (has_columns<Mask>::value) {
    switch (plan_choice().load()) {
      case PlanChoice::Whole:
        return plan;
      case PlanChoice::Gathered16:
        return TilePlan{true, 16};
      case PlanChoice::Gathered64:
        return TilePlan{true, 64};
      case PlanChoice::Auto:
        break;
    }
    const auto range_part = mask.range_part();
    std::vector<Index> scratch;
    double whole = 0, wide = 0, narrow = 0;
    constexpr Index kSamples = 8, kWide = TileConfig::kBlockQ, kNarrow = 16;
    for (Index s = 0; s < kSamples; ++s) {
      const Index q0 = std::max<Index>(0, (p.q_len - kWide) * s / (kSamples - 1)) / kWide * kWide;
      const Range q{q0 + p.q_offset, std::min(q0 + kWide, p.q_len) + p.q_offset};
      const Index b = s % std::max<Index>(p.batch, 1), h = s % std::max<Index>(p.q_heads, 1);
      whole += tiled_cost(mask, b, h, q, p.kv_len);
      wide += tiled_cost(range_part, b, h, q, p.kv_len) +
              columns_cost(mask, b, h, q, p.kv_len, 1.0, scratch);
      for (Index n0 = q.begin; n0 < q.end; n0 += kNarrow) {
        const Range part{n0, std::min(n0 + kNarrow, q.end)};
        narrow += TileCosts::kNarrowRows * tiled_cost(range_part, b, h, part, p.kv_len) +
                  columns_cost(mask, b, h, part, p.kv_len, TileCosts::kNarrowRows, scratch);
      }
    }
    if (std::min(wide, narrow) < whole) {
      plan.gather = true;
      plan.rows = narrow < wide ? kNarrow : kWide;
    }
  }
  (void)mask, (void)p;
  return plan;
}

}  // namespace attnkit::detail
