// The band of a Partial key tile (kernel/attention_tiles.hpp): for each group of kLanes
// queries, the hull of the tile's keys any of them may see, from the mask's runs(). A
// sliding window's tiles, PowerOfTwo's window and the causal diagonal see a band of the
// tile: with 64 queries and a 64-key window, half of the 64 x 128 box the tile GEMMs would
// compute. When the hulls leave enough of the box out, the tile's two products run group by
// group over their hulls: the logits outside a group's hull are -inf without a product (the
// masking then leaves them so), and its queries' weighted sum skips those keys, whose
// weights are 0. Each group's products are tile GEMMs of kLanes columns (one vector on
// AVX-512), which run at most of the rate of the whole tile's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>

#include "attnkit/detail/pack.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/tile_config.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

class TileBand {
 public:
  // Queries per group: one AVX-512 vector (16 lanes), two AVX2 vectors.
  static constexpr Index kLanes = simd::kWidth >= 16 ? simd::kWidth : 16;
  static constexpr Index kMaxGroups = (TileConfig::kBlockQ + kLanes - 1) / kLanes;

  /// Forms the hulls of keys [k0, k0 + nk) for queries i0 .. i0 + nq - 1 (head h of batch b)
  /// and returns whether the banded products pay: the hulls cover at most kPays of the box
  /// nk x lanes. Always false for a mask without runs().
  template <class Mask>
  bool form(const Mask& mask, Index b, Index h, Index i0, Index k0, Index nk, Index nq,
            Index lanes) {
    if constexpr (!has_runs<Mask>::value) {
      (void)mask, (void)b, (void)h, (void)i0, (void)k0, (void)nk, (void)nq, (void)lanes;
      return false;
    } else {
      groups_ = (lanes + kLanes - 1) / kLanes;
      Index covered = 0;
      for (Index g = 0; g < groups_; ++g) {
        Index lo = nk, hi = 0;
        for (Index r = g * kLanes; r < std::min(nq, (g + 1) * kLanes); ++r)
          for (const Range& run : mask.runs(b, h, i0 + r)) {
            const Index a = std::max<Index>(run.begin - k0, 0);
            const Index e = std::min<Index>(run.end - k0, nk);
            if (a < e) lo = std::min(lo, a), hi = std::max(hi, e);
          }
        hull_[g] = lo < hi ? Range{lo, hi} : Range{0, 0};
        covered += (hull_[g].end - hull_[g].begin) * std::min(kLanes, lanes - g * kLanes);
      }
      covered_ = covered;
      return covered * kPaysDen <= nk * lanes * kPaysNum;
    }
  }

  /// The (key, lane) pairs the last form() found in the hulls.
  Index covered() const { return covered_; }

  /// s[nk, lanes] (rows lds apart) = keys * qt [d, ldq] where a group's hull holds the key,
  /// -inf elsewhere: block by block of gemm::kMR keys, over the groups whose hulls reach it
  /// (and any between), in one GEMM of that many vectors.
  void logits(const F32Rows& keys, Index nk, Index lanes, const float* qt, Index ldq, Index d,
              float* s, Index lds) const {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (Index j0 = 0; j0 < nk; j0 += gemm::kMR) {
      const Index j1 = std::min(nk, j0 + Index{gemm::kMR});
      Index g0 = groups_, g1 = 0;
      for (Index g = 0; g < groups_; ++g)
        if (hull_[g].begin < j1 && hull_[g].end > j0) g0 = std::min(g0, g), g1 = g + 1;
      const Index c0 = std::min(g0 * kLanes, lanes),
                  c1 = std::max(c0, std::min(g1 * kLanes, lanes));
      for (Index jj = j0; jj < j1; ++jj) {
        std::fill(s + jj * lds, s + jj * lds + c0, kNegInf);
        std::fill(s + jj * lds + c1, s + jj * lds + lanes, kNegInf);
      }
      if (c0 < c1)
        gemm::gemm(j1 - j0, c1 - c0, d, {keys.data + j0 * keys.ld, keys.ld, 1}, qt + c0, ldq,
                   s + j0 * lds + c0, lds, false);
    }
  }

  /// acc[nq, dv_pad] += P[nq, j0:j1] * values[j0:j1] on each group's hull, P read transposed
  /// from s (rows lds apart).
  void weighted_sum(const float* s, Index lds, const F32Rows& values, Index j0, Index j1, Index nq,
                    float* acc, Index dv_pad) const {
    for (Index g = 0; g < groups_; ++g) {
      const Index r0 = g * kLanes, m = std::min(kLanes, nq - r0);
      const Index a = std::max(j0, hull_[g].begin), e = std::min(j1, hull_[g].end);
      if (m > 0 && a < e)
        gemm::gemm(m, dv_pad, e - a, {s + a * lds + r0, 1, lds}, values.data + a * values.ld,
                   values.ld, acc + r0 * dv_pad, dv_pad, true);
    }
  }

 private:
  // The banded products pay when the hulls cover at most 3/4 of the box (measured: a group's
  // GEMM of one vector of columns runs at ~85% of the whole tile's rate).
  static constexpr Index kPaysNum = 3, kPaysDen = 4;

  Range hull_[std::size_t{kMaxGroups}] = {};
  Index groups_ = 0, covered_ = 0;
};

}  // namespace attnkit::detail
