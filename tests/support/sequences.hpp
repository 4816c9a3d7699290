// Several sequences of K/V stored contiguously, one [1, Hkv, Lk_b, D] (V: Dv) block each, for
// the paged-cache tests: random values, views of any token range, and their installation in
// a paged pool on pages drawn in random order with NaN in every row no sequence holds.
#pragma once

#include <algorithm>
#include <attnkit/core/tensor.hpp>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

namespace attnkit::test {

/// K [1, Hkv, Lk_b, D] and V [1, Hkv, Lk_b, Dv] of each sequence b, in storage T.
template <class T>
struct Sequences {
  Index kv_heads, dim, value_dim;
  std::vector<Index> lengths;
  std::vector<std::vector<T>> k, v;

  /// N(0, 1) values by mt19937(seed), sequence by sequence, K then V.
  Sequences(std::vector<Index> lens, Index kv_heads_, Index dim_, Index value_dim_,
            std::uint32_t seed)
      : kv_heads(kv_heads_), dim(dim_), value_dim(value_dim_), lengths(std::move(lens)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    for (const Index n : lengths) {
      k.emplace_back(static_cast<std::size_t>(kv_heads * n * dim));
      v.emplace_back(static_cast<std::size_t>(kv_heads * n * value_dim));
      for (T& x : k.back()) x = T(dist(rng));
      for (T& x : v.back()) x = T(dist(rng));
    }
  }

  Index count() const { return static_cast<Index>(lengths.size()); }
  Index length(Index b) const { return lengths[static_cast<std::size_t>(b)]; }

  /// Tokens [from, from + n) of sequence b (n < 0: to the end).
  View<const T> keys(Index b, Index from = 0, Index n = -1) const {
    return slice(k[static_cast<std::size_t>(b)].data(), length(b), dim, from, n);
  }
  View<const T> values(Index b, Index from = 0, Index n = -1) const {
    return slice(v[static_cast<std::size_t>(b)].data(), length(b), value_dim, from, n);
  }

 private:
  View<const T> slice(const T* data, Index len, Index d, Index from, Index n) const {
    return strided(data + from * d, {1, kv_heads, n < 0 ? len - from : n, d},
                   {kv_heads * len * d, len * d, d});
  }
};

/// Installs every sequence on pages drawn in random order by mt19937(seed) (assign()),
/// copied through the page views; every other row of the pool holds NaN, which a correct
/// reader never touches.
template <class Paged, class T>
void assign_shuffled(Paged& paged, const Sequences<T>& seqs, std::uint32_t seed) {
  using P = std::remove_cv_t<std::remove_pointer_t<decltype(paged.key_page(0).data)>>;
  const P nan = P(std::numeric_limits<float>::quiet_NaN());
  const Index ps = paged.page_size();
  for (Index p = 0; p < paged.num_pages(); ++p) {
    const View<P> kp = paged.key_page(p), vp = paged.value_page(p);
    for (Index h = 0; h < seqs.kv_heads; ++h)
      for (Index r = 0; r < ps; ++r) {
        std::fill(kp.row(0, h, r), kp.row(0, h, r) + seqs.dim, nan);
        std::fill(vp.row(0, h, r), vp.row(0, h, r) + seqs.value_dim, nan);
      }
  }
  std::vector<Index> pool(static_cast<std::size_t>(paged.num_pages()));
  std::iota(pool.begin(), pool.end(), Index{0});
  std::shuffle(pool.begin(), pool.end(), std::mt19937(seed));
  std::size_t next = 0;
  for (Index b = 0; b < seqs.count(); ++b) {
    const Index len = seqs.length(b), n = (len + ps - 1) / ps;
    const std::vector<Index> pages(pool.begin() + static_cast<std::ptrdiff_t>(next),
                                   pool.begin() + static_cast<std::ptrdiff_t>(next) + n);
    next += static_cast<std::size_t>(n);
    paged.assign(paged.add_sequence(), pages, len);
    const View<const T> k = seqs.keys(b), v = seqs.values(b);
    for (Index s = 0; s < len; ++s) {
      const Index page = pages[static_cast<std::size_t>(s / ps)], r = s % ps;
      const View<P> kp = paged.key_page(page), vp = paged.value_page(page);
      for (Index h = 0; h < seqs.kv_heads; ++h) {
        std::transform(k.row(0, h, s), k.row(0, h, s) + seqs.dim, kp.row(0, h, r),
                       [](T x) { return P(float(x)); });
        std::transform(v.row(0, h, s), v.row(0, h, s) + seqs.value_dim, vp.row(0, h, r),
                       [](T x) { return P(float(x)); });
      }
    }
  }
}

}  // namespace attnkit::test
