// The value guard of the tile engine (kernel/tiles/attention_tiles.hpp). A masked pair weighs 0,
// but 0 * inf and 0 * NaN are NaN: on a Partial tile a value row that is not finite (garbage past
// a KV cache's length, a poisoned future key) would leak into rows that cannot see it. These
// find such rows and add each one only to the rows whose mask keeps it.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

// True when every element of value rows [j0, j1) (dv_pad floats each) is finite: x - x is 0
// exactly for finite x and NaN for inf or NaN, and NaN survives the sum.
// Four sums, over the rows' vectors in turn: one sum would chain every add on the last.
inline bool rows_finite(const F32Rows& values, Index j0, Index j1, Index dv_pad) {
  simd::Vec s0(0.f), s1(0.f), s2(0.f), s3(0.f);
  const auto nan_if_not_finite = [](const float* p) {
    const simd::Vec x = simd::load(p);
    return x - x;
  };
  for (Index jj = j0; jj < j1; ++jj) {
    const float* row = values.data + jj * values.ld;
    Index c = 0;
    for (; c + 4 * simd::kWidth <= dv_pad; c += 4 * simd::kWidth) {
      s0 = s0 + nan_if_not_finite(row + c);
      s1 = s1 + nan_if_not_finite(row + c + simd::kWidth);
      s2 = s2 + nan_if_not_finite(row + c + 2 * simd::kWidth);
      s3 = s3 + nan_if_not_finite(row + c + 3 * simd::kWidth);
    }
    for (; c < dv_pad; c += simd::kWidth) s0 = s0 + nan_if_not_finite(row + c);
  }
  return simd::reduce_add((s0 + s1) + (s2 + s3)) == 0.f;
}

// Whether the value rows of a Partial tile that some query does not see are finite: with
// runs() the masking marked the rows every query sees (seen[jj] != 0); else every row counts.
template <class ScheduleMask>
bool rows_finite_unseen(const F32Rows& values, Index nk, const char* seen, Index dv_pad) {
  if constexpr (!has_runs<ScheduleMask>::value) {
    (void)seen;
    return rows_finite(values, 0, nk, dv_pad);
  }
  for (Index j0 = 0; j0 < nk;) {
    if (seen[j0] != 0) {
      ++j0;
      continue;
    }
    Index j1 = j0 + 1;
    while (j1 < nk && seen[j1] == 0) ++j1;
    if (!rows_finite(values, j0, j1, dv_pad)) return false;
    j0 = j1;
  }
  return true;
}

// acc[r] (rows dv_pad apart) += P[r, jj] * values[jj] for the query rows r < nq (at positions
// i0 + r) whose mask keeps key k0 + jj; P is read transposed from s (rows ld apart).
template <class Mask>
void add_to_visible_rows(const Mask& mask, const F32Rows& values, Index b, Index h, Index i0,
                         Index k0, Index jj, Index nq, const float* s, Index ld, float* acc_rows,
                         Index dv_pad) {
  const float* value = values.data + jj * values.ld;
  for (Index r = 0; r < nq; ++r) {
    if (!mask.keep(b, h, i0 + r, k0 + jj)) continue;
    const float w = s[jj * ld + r];
    float* acc = acc_rows + r * dv_pad;
    for (Index c = 0; c < dv_pad; ++c) acc[c] += w * value[c];
  }
}

// The backward's guard for rows of dO that are not finite (a NaN or inf loss gradient): they
// meet the zero weights and zero dS of the keys their query does not see. `rows` lists such
// rows r < nq of a query tile (at positions i0 + r), `saved` their dO (dv_pad floats each),
// zeroed in the tile's dO so the products leave them out.

// Lists the rows r < nq of d_o (rows ld apart) that are not finite in `rows`, keeps them in
// `saved` and zeroes them in d_o.
inline void set_aside_nonfinite_rows(float* d_o, Index nq, Index ld, std::vector<Index>& rows,
                                     std::vector<float>& saved) {
  rows.clear();
  if (rows_finite(F32Rows{d_o, ld}, 0, nq, ld)) return;
  saved.clear();
  for (Index r = 0; r < nq; ++r) {
    if (rows_finite(F32Rows{d_o, ld}, r, r + 1, ld)) continue;
    rows.push_back(r);
    saved.insert(saved.end(), d_o + r * ld, d_o + (r + 1) * ld);
    std::fill(d_o + r * ld, d_o + (r + 1) * ld, 0.f);
  }
}

// dS[jj, r] (rows ld apart) = 0 for each listed row r at the keys k0 + jj it does not see.
template <class Mask>
void zero_unseen_grads(const Mask& mask, const std::vector<Index>& rows, Index b, Index h, Index i0,
                       Index k0, Index nk, float* ds, Index ld) {
  for (const Index r : rows)
    for (Index jj = 0; jj < nk; ++jj)
      if (!mask.keep(b, h, i0 + r, k0 + jj)) ds[jj * ld + r] = 0.f;
}

// dv_acc[k0 + jj] (rows dv_pad apart) += P[jj, r] saved[r] for each listed row r and each key
// it sees (every key of a Full tile); P read from p [nk, ld].
template <class Mask>
void add_rows_to_seen_keys(const Mask& mask, bool full, const std::vector<Index>& rows,
                           const float* saved, Index b, Index h, Index i0, Index k0, Index nk,
                           const float* p, Index ld, float* dv_acc, Index dv_pad) {
  for (std::size_t n = 0; n < rows.size(); ++n) {
    const Index r = rows[n];
    const float* d_o = saved + static_cast<Index>(n) * dv_pad;
    for (Index jj = 0; jj < nk; ++jj) {
      if (!full && !mask.keep(b, h, i0 + r, k0 + jj)) continue;
      const float w = p[jj * ld + r];
      float* acc = dv_acc + (k0 + jj) * dv_pad;
      for (Index c = 0; c < dv_pad; ++c) acc[c] += w * d_o[c];
    }
  }
}

}  // namespace attnkit::detail
