// reference::attention(): the slow, obvious twin of attention(). It materializes the
// [Lq, Lk] logit matrix of each head in double and applies each policy's element rule
// (Score::modify, Mask::keep, Normalizer::reference_row). Tests compare every fast path
// against it; users can debug their own policies with it.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/detail/traits.hpp"
#include "attnkit/normalizer/row_context.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/spec.hpp"

namespace attnkit::reference {
namespace detail {

// scale * q . k in double -- or cos(q, k) = q . k / (|q| |k|) (0 for a zero row) when the
// normalizer asks for cosine logits -- then the Score's element rule.
template <class Spec, class Q, class K>
double logit(const Spec& spec, const Q* q, const K* k, const Problem& p, Index b, Index h, Index i,
             Index j) {
  double dot = 0.0, qq = 0.0, kk = 0.0;
  for (Index c = 0; c < p.head_dim; ++c) {
    const double x = double(q[c]), y = double(k[c]);
    dot += x * y;
    qq += x * x;
    kk += y * y;
  }
  double s = double(p.scale) * dot;
  if constexpr (attnkit::detail::cosine_logits<typename Spec::Normalizer>())
    s = qq == 0.0 || kk == 0.0 ? 0.0 : dot / (std::sqrt(qq) * std::sqrt(kk));
  if constexpr (attnkit::detail::has_modify<typename Spec::Score>::value)
    return spec.score.modify(s, b, h, i, j);
  else
    return s;
}

}  // namespace detail

/// Same contract as attnkit::attention(); `o` may be a View<double> to keep full
/// precision. options.threads is ignored (the reference is serial).
template <class Spec, class Q, class K, class V, class O>
void attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
               const View<O>& o, const Options& options = {}) {
  static_assert(std::is_same_v<typename Spec::Position, NoPosition>,
                "reference::attention(): only NoPosition is supported yet");
  static_assert(attnkit::detail::has_modify<typename Spec::Score>::value ||
                    !attnkit::detail::has_apply_tile<typename Spec::Score>::value,
                "reference::attention(): a Score policy with apply_tile() needs modify() too");
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> s_row(static_cast<std::size_t>(p.kv_len));       // one row of [Lq, Lk]
  std::vector<char> kept_row(static_cast<std::size_t>(p.kv_len));      // the mask's row
  std::vector<double> out_row(static_cast<std::size_t>(p.value_dim));  // [Dv]
  double* s = s_row.data();
  char* kept = kept_row.data();
  double* out = out_row.data();

  // A masked pair contributes nothing, exactly: its key is never read and its value never
  // multiplied (0 * inf would be NaN), so garbage in keys and values the mask excludes
  // cannot reach the output.
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h) {
      const Index hk = p.kv_head(h);
      for (Index r = 0; r < p.q_len; ++r) {
        const Index i = r + p.q_offset;  // absolute query position
        for (Index j = 0; j < p.kv_len; ++j) {
          kept[j] = spec.mask.keep(b, h, i, j);
          s[j] = kept[j] ? detail::logit(spec, q.row(b, h, r), k.row(b, hk, j), p, b, h, i, j)
                         : neg_inf;
        }
        const Index row = (b * p.q_heads + h) * p.q_len + r;
        const auto visible = static_cast<float>(std::count(kept, kept + p.kv_len, char{1}));
        const double stat = attnkit::detail::reference_row(
            spec.normalizer, s, p.kv_len, RowContext{b, h, p.kv_len, p.head_dim, row, 1, &visible});
        std::fill(out, out + p.value_dim, 0.0);
        for (Index j = 0; j < p.kv_len; ++j)
          if (kept[j])
            for (Index c = 0; c < p.value_dim; ++c) out[c] += s[j] * double(v.row(b, hk, j)[c]);
        for (Index c = 0; c < p.value_dim; ++c)
          o.row(b, h, r)[c] = static_cast<std::remove_const_t<O>>(out[c]);
        if (options.lse != nullptr) options.lse[row] = static_cast<float>(stat);
      }
    }
}

}  // namespace attnkit::reference
