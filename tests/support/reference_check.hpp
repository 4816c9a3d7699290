// A kernel call against the f64 reference on the inputs of one Case, with the allowed error
// of every element named (Tolerance): outputs of normalized rules within an absolute bound,
// unnormalized (Sigmoid) rows relative to their magnitude sum_j w_ij |v_j|, the row
// statistic (LSE or l1 sum) within its own bound, and the rows that see no key checked for
// the exact contract (output 0, the normalizer's empty statistic).
#pragma once

#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/reference/attention.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "support/attention_runner.hpp"
#include "support/tolerance.hpp"

namespace attnkit::test {

/// Q in storage TQ, K in T, V and |V| (the magnitude of unnormalized rows) in TV, drawn as
/// run_case draws them for the same seed; the reference reads the same rounded values.
template <class T = float, class TQ = T, class TV = T>
struct Inputs {
  Tensor<TQ> q;
  Tensor<T> k;
  Tensor<TV> v, v_abs;
  Inputs(const Case& c, std::uint32_t seed)
      : q(c.layout, c.batch, c.q_heads, c.q_len, c.dim),
        k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()),
        v_abs(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()) {
    q.randomize(seed, c.stddev);
    k.randomize(seed + 1, c.stddev);
    v.randomize(seed + 2);
    v_abs.randomize(seed + 2);
    if constexpr (detail::is_block_quantized<TV>()) {  // |V| rounded to blocks: a magnitude
      std::vector<float> row(static_cast<std::size_t>(detail::kQuantBlock));
      v_abs.for_each([&row](TV& blk) {
        dequantize_row(&blk, detail::kQuantBlock, row.data());
        for (float& x : row) x = std::abs(x);
        quantize_row(row.data(), detail::kQuantBlock, &blk);
      });
    } else {
      v_abs.for_each([](TV& x) { x = TV(std::abs(float(x))); });
    }
  }
};

template <class N>
constexpr bool has_row_stat() {
  return detail::row_stat_kind<N>() != RowStat::None;
}

/// The row statistic a row of head h that sees no key must report (Sigmoid has none).
template <class N>
float empty_row_stat(const N& n, Index h) {
  if constexpr (detail::row_stat_kind<N>() == RowStat::Sum) {
    return 0.f;
  } else if constexpr (std::is_same_v<N, Sigmoid>) {
    return std::numeric_limits<float>::quiet_NaN();  // no statistic: never compared
  } else if constexpr (std::is_same_v<N, Softmax>) {
    return n.sinks.empty() ? -std::numeric_limits<float>::infinity()
                           : n.sinks[static_cast<std::size_t>(h)];
  } else {
    return -std::numeric_limits<float>::infinity();
  }
}

/// Whether query row r of head h (absolute position r + q_offset) keeps any key.
template <class Mask>
bool sees_a_key(const Mask& mask, const Case& c, Index b, Index h, Index r) {
  for (Index j = 0; j < c.kv_len; ++j)
    if (mask.keep(b, h, r + c.offset(), j)) return true;
  return false;
}

/// run(o, options) (the kernel under test, on `in`, writing o [B, Hq, Lq, Dv] in c.layout)
/// against reference::attention(ref, in) with the same options. `ref` names the variant in
/// full (its mask decides which rows see no key).
template <class RefSpec, class T, class TQ, class TV, class Run>
Agreement agreement(const RefSpec& ref, const Case& c, const Inputs<T, TQ, TV>& in, Run&& run,
                    const Tolerance& t = {}) {
  using N = typename RefSpec::Normalizer;
  constexpr RowStat kStat = detail::row_stat_kind<N>();
  constexpr bool kUnnormalized = std::is_same_v<N, Sigmoid>;
  const Index dv = c.dv();
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, dv);
  o.for_each([](float& x) { x = std::numeric_limits<float>::quiet_NaN(); });  // all written
  Tensor<double> expected(Layout::Bhsd, c.batch, c.q_heads, c.q_len, dv);
  Tensor<double> magnitude(Layout::Bhsd, c.batch, c.q_heads, c.q_len, dv);
  const auto rows = static_cast<std::size_t>(c.rows());
  std::vector<float> stat(rows, 42.f), stat_expected(rows, 42.f);
  Options options = c.options(), ref_options = c.options();
  if constexpr (kStat != RowStat::None) {
    options = options.with_lse(stat);
    ref_options = ref_options.with_lse(stat_expected);
  }
  run(o.view, options);
  reference::attention(ref, in.q.cview(), in.k.cview(), in.v.cview(), expected.view, ref_options);
  if constexpr (kUnnormalized)
    reference::attention(ref, in.q.cview(), in.k.cview(), in.v_abs.cview(), magnitude.view,
                         c.options());

  std::vector<char> sees(rows);
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index r = 0; r < c.q_len; ++r)
        sees[static_cast<std::size_t>((b * c.q_heads + h) * c.q_len + r)] =
            sees_a_key(ref.mask, c, b, h, r);
  std::vector<float> empty_stat(static_cast<std::size_t>(c.q_heads));
  for (Index h = 0; h < c.q_heads; ++h)
    empty_stat[static_cast<std::size_t>(h)] = empty_row_stat(ref.normalizer, h);
  if constexpr (kStat == RowStat::None) {  // nothing to compare
    stat.clear();
    stat_expected.clear();
  }
  return compare_rows({c, o, expected, kUnnormalized ? &magnitude : nullptr, stat, stat_expected,
                       kStat == RowStat::Sum, sees, empty_stat},
                      t);
}

/// The kernel call of agreement() for attention(spec) on `in`.
template <class Spec, class T, class TQ, class TV>
auto attention_on(const Spec& spec, const Inputs<T, TQ, TV>& in) {
  return [&spec, &in](const View<float>& o, const Options& options) {
    attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
  };
}

/// attention(spec) against the reference on `in`, CHECKed (check_agreement).
template <class Spec, class T, class TQ, class TV>
void check_attention_on(const Spec& spec, const Case& c, const Inputs<T, TQ, TV>& in,
                        const Tolerance& t = {}) {
  check_agreement(agreement(spec, c, in, attention_on(spec, in), t));
}

/// The same on Inputs<T>(c, seed), with `what`, the Case and T in the INFO.
template <class T = float, class Spec>
void check_attention(const std::string& what, const Spec& spec, const Case& c,
                     std::uint32_t seed = 11, const Tolerance& t = {}) {
  INFO(what << ", " << describe(c) << ", " << storage_name<T>());
  check_attention_on(spec, c, Inputs<T>(c, seed), t);
}

}  // namespace attnkit::test
