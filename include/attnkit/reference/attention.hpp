// reference::attention(): the slow, obvious twin of attention(). It materializes the
// [Lq, Lk] logit matrix of each head in double and applies each policy's element rule
// (Score::modify, Mask::keep, Normalizer::reference_row). Tests compare every fast path
// against it; users can debug their own policies with it.
#pragma once

#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/detail/traits.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/spec.hpp"

namespace attnkit::reference {

/// Same contract as attnkit::attention(); `o` may be a View<double> to keep full
/// precision. options.threads is ignored (the reference is serial).
template <class Spec, class Q, class K, class V, class O>
void attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
               const View<O>& o, const Options& options = {}) {
  static_assert(std::is_same_v<typename Spec::Position, NoPosition>,
                "reference::attention(): only NoPosition is supported yet");
  static_assert(detail::has_modify<typename Spec::Score>::value ||
                    !detail::has_apply_tile<typename Spec::Score>::value,
                "reference::attention(): a Score policy with apply_tile() needs modify() too");
  const Problem p = make_problem(q, k, v, o, options);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> s(static_cast<std::size_t>(p.kv_len));  // one row of [Lq, Lk]
  std::vector<double> out(static_cast<std::size_t>(p.value_dim));

  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h) {
      const Index hk = p.kv_head(h);
      for (Index r = 0; r < p.q_len; ++r) {
        const Index i = r + p.q_offset;  // absolute query position
        for (Index j = 0; j < p.kv_len; ++j) {
          double dot = 0.0;
          for (Index c = 0; c < p.head_dim; ++c)
            dot += double(q.row(b, h, r)[c]) * double(k.row(b, hk, j)[c]);
          double logit = double(p.scale) * dot;
          if constexpr (detail::has_modify<typename Spec::Score>::value)
            logit = spec.score.modify(logit, b, h, i, j);
          s[j] = spec.mask.keep(b, h, i, j) ? logit : neg_inf;
        }
        const double lse = spec.normalizer.reference_row(s.data(), p.kv_len);
        std::fill(out.begin(), out.end(), 0.0);
        for (Index j = 0; j < p.kv_len; ++j)
          for (Index c = 0; c < p.value_dim; ++c) out[c] += s[j] * double(v.row(b, hk, j)[c]);
        for (Index c = 0; c < p.value_dim; ++c)
          o.row(b, h, r)[c] = static_cast<std::remove_const_t<O>>(out[c]);
        if (options.lse != nullptr)
          options.lse[(b * p.q_heads + h) * p.q_len + r] = static_cast<float>(lse);
      }
    }
}

}  // namespace attnkit::reference
