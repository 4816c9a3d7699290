// The scratch buffers of one thread's tile engine (kernel/tiles/attention_tiles.hpp), sized once
// from the call and carved from one allocation (detail/scratch.hpp): nothing is allocated
// per tile. A buffer the call does not need is not carved (nullptr).
#pragma once

#include <algorithm>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/kernel/tiles/tile_config.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

struct TileBuffers {
  // Which optional buffers the call needs.
  struct Needs {
    bool keys, values;  // K / V rows packed (storage that is not read in place)
    bool counts;        // visible keys per query (kCountsKeys)
    bool row;           // a query row being turned (a row-transforming Position)
    bool product;       // a second logit tile and its table (a Position owning the product)
    bool columns;       // gathered columns' K and V rows
    Index query_rows;   // queries kept in row form (narrow tiles, gathered columns)
  };
  static constexpr Index kBq = TileConfig::kBlockQ, kBk = TileConfig::kBlockK;

  TileBuffers(Index d, Index dv_pad, const Needs& n)
      : scratch(Scratch::size_for(d * kBq, n.keys ? kBk * d : 0, n.values ? kBk * dv_pad : 0,
                                  kBk * kBq, kBq * dv_pad, kBq, n.counts ? kBq : 0, n.row ? d : 0,
                                  n.product ? kBk * kBq : 0, n.product ? kBq + kBk : 0,
                                  n.query_rows * d,
                                  n.columns ? simd::kWidth * std::max(d, dv_pad) : 0)),
        qt(scratch.carve(d * kBq)),
        kp(n.keys ? scratch.carve(kBk * d) : nullptr),
        vp(n.values ? scratch.carve(kBk * dv_pad) : nullptr),
        s(scratch.carve(kBk * kBq)),
        acc(scratch.carve(kBq * dv_pad)),
        factor(scratch.carve(kBq)),
        counts(n.counts ? scratch.carve(kBq) : nullptr),
        row(n.row ? scratch.carve(d) : nullptr),
        s2(n.product ? scratch.carve(kBk * kBq) : nullptr),
        work(n.product ? scratch.carve(kBq + kBk) : nullptr),
        qr(scratch.carve(n.query_rows * d)),
        col_rows(n.columns ? scratch.carve(simd::kWidth * std::max(d, dv_pad)) : nullptr) {}

  Scratch scratch;
  float* qt;        // [D, kBq]          scaled queries, transposed
  float* kp;        // [kBk, D]          f32 keys (only for non-f32 storage)
  float* vp;        // [kBk, dv_pad]     f32 values, padded (only when not used in place)
  float* s;         // [kBk, kBq]        logits, then weights
  float* acc;       // [kBq, dv_pad]     output accumulator
  float* factor;    // [kBq]             per-query scale, rescale, finalize factors
  float* counts;    // [kBq]             visible keys per query (kCountsKeys only)
  float* row;       // [D]               one query row being transformed (Position)
  float* s2;        // [kBk, kBq]        second product (a Position that owns it)
  float* work;      // [kBq + kBk]       its per-tile table
  float* qr;        // [query_rows, D]   the packed queries in rows (narrow, columns)
  float* col_rows;  // [kWidth, max(D, dv_pad)] gathered K or V rows in f32
};

}  // namespace attnkit::detail
