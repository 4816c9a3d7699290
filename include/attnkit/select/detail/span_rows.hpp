// The per-query engine of Superlinear span attention (select/superlinear.hpp): f32 access to
// key and value rows, a SIMD dot product, and exact softmax attention of one query over a
// short list of key ranges (its spans and window). Per query, not per tile: neighbouring
// queries choose different spans, and a 64-query tile would compute logits for the union of
// their choices (measured in superlinear.hpp); one query's few hundred keys stay in L1/L2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

/// A view's rows as f32: the view itself when it is f32, else a converted [B, H, S, D] copy.
template <class T>
class F32Rows4 {
 public:
  explicit F32Rows4(const View<T>& v) {
    if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
      view_ = v;
    } else {
      copy_.resize(static_cast<std::size_t>(v.batch * v.heads * v.seq * v.dim));
      for (Index b = 0; b < v.batch; ++b)
        for (Index h = 0; h < v.heads; ++h)
          pack_rows(v, b, h, 0, v.seq, copy_.data() + (b * v.heads + h) * v.seq * v.dim, v.dim);
      view_ = bhsd(static_cast<const float*>(copy_.data()), v.batch, v.heads, v.seq, v.dim);
    }
  }
  const float* row(Index b, Index h, Index s) const { return view_.row(b, h, s); }

 private:
  std::vector<float> copy_;
  View<const float> view_;
};

/// Per-thread scratch of span_attend(): logits [capacity rounded up], accumulator [Dv].
struct SpanScratch {
  std::vector<float> s, acc, q;
  SpanScratch(Index capacity, Index head_dim, Index value_dim)
      : s(static_cast<std::size_t>(simd::round_up(std::max<Index>(capacity, 1)))),
        acc(static_cast<std::size_t>(value_dim)),
        q(static_cast<std::size_t>(head_dim)) {}
};

/// out[Dv] = softmax(cap(q . K_j)) V_j over the keys j of `runs` (ascending, disjoint, inside
/// [0, Lk)); q is already scaled. Returns the natural LSE, -inf (and out = 0) for no key, -inf
/// and out = NaN for keys whose logits are all -inf.
/// `softcap` <= 0 means no cap. scratch.s holds at least the number of keys.
template <class KeyRow, class ValueRow>
float span_attend(const float* q, Index head_dim, const Range* runs, int run_count,
                  const KeyRow& key_row, const ValueRow& value_row, Index value_dim, float softcap,
                  SpanScratch& scratch, float* out) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr Index w = simd::kWidth;
  float* s = scratch.s.data();  // [n rounded up]: logits, then weights
  Index n = 0;
  for (int t = 0; t < run_count; ++t)
    for (Index j = runs[t].begin; j < runs[t].end; ++j) s[n++] = simd::dot(q, key_row(j), head_dim);
  std::fill(out, out + value_dim, 0.f);
  if (n == 0) return kNegInf;
  const Index padded = simd::round_up(n);
  if (softcap > 0.f) {  // cap * tanh(s / cap), as Softcap::apply_tile
    const simd::Vec cap(softcap), inv(1.f / softcap);
    for (Index c = 0; c < padded; c += w)
      simd::store(s + c, cap * simd::tanh(simd::load(s + c) * inv));
  }
  std::fill(s + n, s + padded, kNegInf);  // padding weighs exp2(-inf) = 0
  simd::Vec m_v(kNegInf);
  for (Index c = 0; c < padded; c += w) m_v = simd::max(m_v, simd::load(s + c));
  const float m = simd::reduce_max(m_v);
  if (m == kNegInf) {  // keys seen, every logit -inf (f32 products that overflowed): as attention()
    std::fill(out, out + value_dim, std::numeric_limits<float>::quiet_NaN());
    return kNegInf;
  }
  simd::Vec l_v(0.f);
  const simd::Vec neg_m(-m * kLog2e), log2e(kLog2e);
  for (Index c = 0; c < padded; c += w) {
    const simd::Vec p = simd::exp2(simd::fma(simd::load(s + c), log2e, neg_m));
    simd::store(s + c, p);
    l_v = l_v + p;
  }
  const float l = simd::reduce_add(l_v);  // >= 1: the max weighs exp2(0)

  float* acc = scratch.acc.data();  // [Dv]
  std::fill(acc, acc + value_dim, 0.f);
  const Index body = value_dim / w * w;
  Index t = 0;
  for (int r = 0; r < run_count; ++r)
    for (Index j = runs[r].begin; j < runs[r].end; ++j, ++t) {
      const float* vj = value_row(j);
      const simd::Vec p(s[t]);
      for (Index c = 0; c < body; c += w)
        simd::store(acc + c, simd::fma(p, simd::load(vj + c), simd::load(acc + c)));
      for (Index c = body; c < value_dim; ++c) acc[c] += s[t] * vj[c];
    }
  const float inv_l = 1.f / l;
  for (Index c = 0; c < value_dim; ++c) out[c] = acc[c] * inv_l;
  return m + std::log(l);
}

}  // namespace attnkit::detail
