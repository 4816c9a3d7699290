// Masking of a Partial tile of logits s[keys, lanes] (one SIMD lane per query): pairs the
// mask drops become -inf. A mask with runs() is applied with SIMD compares, one key row at a
// time against each lane's visible key intervals; any other mask calls keep() per element.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

/// The hull [min lo, max hi) of the non-empty intervals [lo[t][lane], hi[t][lane]) of the first
/// `real` lanes (kWidth lanes a slot), or {0, 0} when they have none.
inline Range lanes_hull(const float* lo, const float* hi, int slots, Index real) {
  Index begin = 0, end = 0;
  for (int t = 0; t < slots; ++t)
    for (Index lane = 0; lane < real; ++lane) {
      const Index a = static_cast<Index>(lo[t * simd::kWidth + lane]);
      const Index e = static_cast<Index>(hi[t * simd::kWidth + lane]);
      if (a >= e) continue;
      if (begin == end)
        begin = a, end = e;
      else
        begin = std::min(begin, a), end = std::max(end, e);
    }
  return Range{begin, end};
}

/// s[nk, ld]: keys k0 .. k0+nk-1 against queries i0 .. i0+nq-1 (lanes up to `lanes` are
/// padding and get -inf too when masked by runs; they are never written out). With
/// `seen_by_all` [nk] (runs path only, else left alone), each key row is marked 1 when all nq
/// queries see it, else 0: only the others need the value guard (kernel/tiles/value_guard.hpp).
template <class Mask>
void mask_partial_tile(const Mask& mask, float* s, Index ld, Index b, Index h, Index i0, Index k0,
                       Index nk, Index nq, Index lanes, char* seen_by_all = nullptr,
                       Range* lane_keys = nullptr) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if constexpr (has_runs<Mask>::value) {
    using Runs = decltype(mask.runs(b, h, i0));
    constexpr int kRuns = Runs::kCapacity;
    constexpr std::size_t kSlots = std::size_t{kRuns}, kLanes = std::size_t{simd::kWidth};
    const simd::Vec neg_inf(kNegInf), zero(0.f), one(1.f);
    if (seen_by_all != nullptr) std::fill(seen_by_all, seen_by_all + nk, char{1});
    for (Index c = 0; c < lanes; c += simd::kWidth) {
      // Each lane's intervals relative to k0, clamped to [0, nk]: small integers, exact in f32.
      alignas(64) float lo[kSlots][kLanes] = {}, hi[kSlots][kLanes] = {};
      for (int lane = 0; lane < simd::kWidth && c + lane < nq; ++lane) {
        const Runs runs = mask.runs(b, h, i0 + c + lane);
        for (int t = 0; t < runs.count; ++t) {
          lo[t][lane] = static_cast<float>(std::clamp<Index>(runs.ranges[t].begin - k0, 0, nk));
          hi[t][lane] = static_cast<float>(std::clamp<Index>(runs.ranges[t].end - k0, 0, nk));
        }
      }
      simd::Vec lo_v[kSlots], hi_v[kSlots];
      for (int t = 0; t < kRuns; ++t) {
        lo_v[t] = simd::load(lo[t]);
        hi_v[t] = simd::load(hi[t]);
      }
      alignas(64) float pad[kLanes];  // 1 on the padding lanes: they need not see a key
      for (int lane = 0; lane < simd::kWidth; ++lane) pad[lane] = c + lane < nq ? 0.f : 1.f;
      const simd::Vec padding = simd::load(pad);
      // The keys any of the vector's queries see; the key rows outside are -inf throughout,
      // seen by none of them (a vector holds at least one query).
      const Range hull =
          lanes_hull(&lo[0][0], &hi[0][0], kRuns, std::min<Index>(simd::kWidth, nq - c));
      if (lane_keys != nullptr) lane_keys[c / simd::kWidth] = hull;
      const auto unseen = [&](Index j0, Index j1) {  // 0 <= j0, j1 <= nk; may be empty
        for (Index jj = j0; jj < j1; ++jj) {
          simd::store(s + jj * ld + c, neg_inf);
          if (seen_by_all != nullptr) seen_by_all[jj] = 0;
        }
      };
      unseen(0, hull.begin);
      unseen(hull.end, nk);
      for (Index jj = hull.begin; jj < hull.end; ++jj) {
        const simd::Vec key(static_cast<float>(jj));
        simd::Mask visible = simd::in_range(key, lo_v[0], hi_v[0]);
        for (int t = 1; t < kRuns; ++t)
          visible = simd::either(visible, simd::in_range(key, lo_v[t], hi_v[t]));
        float* row = s + jj * ld + c;
        simd::store(row, simd::select(visible, simd::load(row), neg_inf));
        if (seen_by_all != nullptr &&
            simd::any(simd::equal(simd::select(visible, one, padding), zero)))
          seen_by_all[jj] = 0;
      }
    }
  } else {
    (void)lanes, (void)seen_by_all;
    for (Index jj = 0; jj < nk; ++jj) {
      float* row = s + jj * ld;  // one key, ld queries
      for (Index r = 0; r < nq; ++r)
        if (!mask.keep(b, h, i0 + r, k0 + jj)) row[r] = kNegInf;
    }
  }
}

}  // namespace attnkit::detail
