// reference::attention(): the slow, obvious twin of attention(). It materializes the
// [Lq, Lk] logit matrix of each head in double and applies each policy's element rule
// (Score::modify, Mask::keep, Normalizer::reference_row). Tests compare every fast path
// against it; users can debug their own policies with it.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/detail/traits.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/options.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/spec.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::reference {
namespace detail {

// scale * q . k in double -- or cos(q, k) = q . k / (|q| |k|) (0 for a zero row) when the
// normalizer asks for cosine logits -- then the Score's element rule. A product beyond f32's
// range is +-inf, as the kernel's f32 product is (the normalizer says what that means).
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
  if constexpr (attnkit::detail::owns_product<typename Spec::Position>())
    s = spec.position.reference_logit(q, k, p.head_dim, i, j);
  if constexpr (attnkit::detail::cosine_logits<typename Spec::Normalizer>())
    s = qq == 0.0 || kk == 0.0 ? 0.0 : dot / (std::sqrt(qq) * std::sqrt(kk));
  if (std::fabs(s) > double(FLT_MAX)) s = std::copysign(HUGE_VAL, s);
  if constexpr (attnkit::detail::has_modify<typename Spec::Score>::value)
    return spec.score.modify(s, b, h, i, j);
  else
    return s;
}

// out[dim] = the row x in double, turned by the Position's reference rule if it has one.
template <class Position, class T>
void turn(const Position& position, const T* x, double* out, Index dim, const RowAt& at) {
  for (Index c = 0; c < dim; ++c) out[c] = double(x[c]);
  if constexpr (attnkit::detail::transforms_rows<Position>())
    position.reference_apply(out, dim, at);
}

// x itself, or for quantized storage its values dequantized into buf (dense, BHSD).
template <class T>
auto dequantized(const View<T>& x, std::vector<float>& buf) {
  if constexpr (attnkit::detail::is_block_quantized<T>()) {
    buf.resize(static_cast<std::size_t>(x.batch * x.heads * x.seq * x.dim));
    const View<float> out = bhsd(buf.data(), x.batch, x.heads, x.seq, x.dim);
    for (Index b = 0; b < x.batch; ++b)
      for (Index h = 0; h < x.heads; ++h)
        for (Index s = 0; s < x.seq; ++s) dequantize_row(x.row(b, h, s), x.dim, out.row(b, h, s));
    return View<const float>(out);
  } else {
    return x;
  }
}

}  // namespace detail

/// Same contract as attnkit::attention(); `o` may be a View<double> to keep full
/// precision. options.threads is ignored (the reference is serial). Quantized K or V
/// (storage/blocks.hpp) are dequantized first: the reference is that of the stored values.
template <class Spec, class Q, class K, class V, class O>
void attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
               const View<O>& o, const Options& options = {}) {
  using Position = typename Spec::Position;
  static_assert(std::is_same_v<Position, NoPosition> ||
                    attnkit::detail::transforms_rows<Position>() ||
                    attnkit::detail::owns_product<Position>(),
                "reference::attention(): a Position policy needs apply() and reference_apply(), "
                "or combine() and reference_logit()");
  static_assert(attnkit::detail::has_modify<typename Spec::Score>::value ||
                    !attnkit::detail::has_apply_tile<typename Spec::Score>::value,
                "reference::attention(): a Score policy with apply_tile() needs modify() too");
  if constexpr (attnkit::detail::is_block_quantized<K>() ||
                attnkit::detail::is_block_quantized<V>()) {
    make_problem(q, k, v, o, options);  // the views' checks, before anything is read
    std::vector<float> k_values, v_values;
    reference::attention(spec, q, detail::dequantized(k, k_values),
                         detail::dequantized(v, v_values), o, options);
  } else {
    const Problem p = make_problem(q, k, v, o, options);
    validate_policies(spec, p, options);
    const double neg_inf = -std::numeric_limits<double>::infinity();
    std::vector<double> s_row(static_cast<std::size_t>(p.kv_len));       // one row of [Lq, Lk]
    std::vector<char> kept_row(static_cast<std::size_t>(p.kv_len));      // the mask's row
    std::vector<double> out_row(static_cast<std::size_t>(p.value_dim));  // [Dv]
    double* s = s_row.data();
    char* kept = kept_row.data();
    double* out = out_row.data();

    // With a row-transforming Position (RoPE), q and k rows are turned in double by its
    // reference_apply(), each key row once per (batch, head), when a query first keeps it.
    constexpr bool kTurns =
        attnkit::detail::transforms_rows<Position>() || attnkit::detail::owns_product<Position>();
    const auto dim = static_cast<std::size_t>(p.head_dim);
    std::vector<double> q_turned(kTurns ? dim : 0),
        k_turned(kTurns ? dim * std::size_t(p.kv_len) : 0);
    std::vector<char> k_ready(kTurns ? std::size_t(p.kv_len) : 0);

    // A masked pair contributes nothing, exactly: its key is never read and its value never
    // multiplied (0 * inf would be NaN), so garbage in keys and values the mask excludes
    // cannot reach the output.
    for (Index b = 0; b < p.batch; ++b)
      for (Index h = 0; h < p.q_heads; ++h) {
        const Index hk = p.kv_head(h);
        std::fill(k_ready.begin(), k_ready.end(), char{0});
        for (Index r = 0; r < p.q_len; ++r) {
          const Index i = r + p.q_offset;  // absolute query position
          if constexpr (kTurns)
            detail::turn(spec.position, q.row(b, h, r), q_turned.data(), p.head_dim,
                         RowAt{b, h, r, p.q_len, i, Role::Query});
          for (Index j = 0; j < p.kv_len; ++j) {
            kept[j] = spec.mask.keep(b, h, i, j);
            if (!kept[j]) {
              s[j] = neg_inf;
            } else if constexpr (kTurns) {
              double* key = k_turned.data() + std::size_t(j) * dim;
              if (!k_ready[std::size_t(j)])
                detail::turn(spec.position, k.row(b, hk, j), key, p.head_dim,
                             RowAt{b, hk, j, p.kv_len, j, Role::Key});
              k_ready[std::size_t(j)] = 1;
              s[j] = detail::logit(spec, q_turned.data(), key, p, b, h, i, j);
            } else {
              s[j] = detail::logit(spec, q.row(b, h, r), k.row(b, hk, j), p, b, h, i, j);
            }
          }
          const Index row = (b * p.q_heads + h) * p.q_len + r;
          const auto visible = static_cast<float>(std::count(kept, kept + p.kv_len, char{1}));
          const double stat = attnkit::detail::reference_row(
              spec.normalizer, s, p.kv_len,
              RowContext{b, h, p.kv_len, p.head_dim, row, 1, &visible});
          std::fill(out, out + p.value_dim, 0.0);
          for (Index j = 0; j < p.kv_len; ++j)
            if (kept[j])
              for (Index c = 0; c < p.value_dim; ++c) out[c] += s[j] * double(v.row(b, hk, j)[c]);
          for (Index c = 0; c < p.value_dim; ++c)
            o.row(b, h, r)[c] = static_cast<std::remove_const_t<O>>(out[c]);
          if (!options.lse.empty()) options.lse.data()[row] = static_cast<float>(stat);
        }
      }
  }
}

}  // namespace attnkit::reference
