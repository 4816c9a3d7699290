// TileConfig: the tile sizes of the tiled attention kernel, tuned with bench_dense.
#pragma once

#include "attnkit/core/tensor.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct TileConfig {
  // Queries per tile: one GEMM column block on AVX-512 (kNR * kWidth = 64); a whole
  // number of vectors everywhere, since queries are the SIMD lanes of the softmax.
  static constexpr Index kBlockQ = 64;
  // Keys per tile: long enough to amortize the per-tile softmax bookkeeping, short enough
  // that the logit tile [kBlockK, kBlockQ] (64 KiB) stays in L2 next to Q^T and V.
  static constexpr Index kBlockK = 256;

  static_assert(kBlockQ % simd::kWidth == 0, "kBlockQ must be a whole number of vectors");
};

}  // namespace attnkit
