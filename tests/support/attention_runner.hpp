// Shared runner of the kernel tests: attention() and reference::attention() on the same
// random inputs of one shape (Case), compared element by element, with the rows that see no
// key checked for the exact contract (output 0, LSE -inf); and attention() alone, its output
// returned for comparing two specs with each other.
#pragma once

#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/reference/attention.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/case.hpp"

namespace attnkit::test {

/// Runs the kernel and the reference on the same random inputs (storage type T; the
/// reference reads the same rounded values) and compares them.
template <class T = float, class Spec>
Outcome run_case(const Spec& spec, const Case& c, std::uint32_t seed = 7) {
  const Index dv = c.dv();
  Tensor<T> q(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  Tensor<T> k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  Tensor<T> v(c.layout, c.batch, c.kv_heads, c.kv_len, dv);
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, dv);
  Tensor<double> expected(Layout::Bhsd, c.batch, c.q_heads, c.q_len, dv);
  q.randomize(seed, c.stddev);
  k.randomize(seed + 1, c.stddev);
  v.randomize(seed + 2);
  const auto rows = static_cast<std::size_t>(c.rows());
  std::vector<float> lse(rows), lse_expected(rows);

  const Options options = c.options();
  attention(spec, q.cview(), k.cview(), v.cview(), o.view, options.with_lse(lse));
  reference::attention(spec, q.cview(), k.cview(), v.cview(), expected.view,
                       options.with_lse(lse_expected));

  Outcome r;
  r.out_err = max_abs_diff(o.view, expected.view);
  r.lse_err = max_lse_diff(lse, lse_expected);
  const auto nan_count =
      std::count_if(o.memory.begin(), o.memory.end(), [](float x) { return std::isnan(x); });
  r.padding_intact =
      static_cast<Index>(nan_count) == static_cast<Index>(o.memory.size()) - c.rows() * dv;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index s = 0; s < c.q_len; ++s) {
        const auto at = static_cast<std::size_t>((b * c.q_heads + h) * c.q_len + s);
        if (lse_expected[at] != kNegInf) continue;
        ++r.empty_rows;
        const float* row = o.view.row(b, h, s);
        r.empty_rows_exact = r.empty_rows_exact && lse[at] == kNegInf &&
                             std::all_of(row, row + dv, [](float x) { return x == 0.f; });
      }
  return r;
}

/// call(o, options) into a Bhsd output, with the row statistic (42 where nothing is written)
/// when the normalizer has one; `options` are c.options() and the statistic's buffer.
template <class Spec, class Call>
KernelResult run_into(const Case& c, Call&& call) {
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  KernelResult r;
  Options options = c.options();
  if constexpr (detail::row_stat_kind<typename Spec::Normalizer>() != RowStat::None) {
    r.lse.assign(static_cast<std::size_t>(c.rows()), 42.f);
    options = options.with_lse(r.lse);
  }
  call(o.view, options);
  r.out = std::move(o.memory);
  return r;
}

/// Runs only the kernel, on the inputs run_case would draw for the same seed.
template <class T = float, class Spec>
KernelResult run_kernel(const Spec& spec, const Case& c, std::uint32_t seed = 7) {
  Tensor<T> q(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  Tensor<T> k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  Tensor<T> v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv());
  q.randomize(seed, c.stddev);
  k.randomize(seed + 1, c.stddev);
  v.randomize(seed + 2);
  return run_into<Spec>(c, [&](const View<float>& o, const Options& options) {
    attention(spec, q.cview(), k.cview(), v.cview(), o, options);
  });
}

}  // namespace attnkit::test
