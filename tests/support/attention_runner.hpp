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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/attnkit_test.hpp"

namespace attnkit::test {

/// One shape of a kernel test: sizes, layout, threads and the query offset.
struct Case {
  Index batch = 1, q_heads = 2, kv_heads = 1;
  Index q_len = 0, kv_len = 0, dim = 64, value_dim = 0;  // value_dim 0: same as dim
  Layout layout = Layout::Bshd;
  int threads = 2;
  std::optional<Index> q_offset;  // default kv_len - q_len (bottom-right)
  float stddev = 1.f;

  // Chainable setters, to state a case in one line: Case{}.lengths(70, 150).heads(4, 2).
  Case& lengths(Index q, Index kv) {
    q_len = q;
    kv_len = kv;
    return *this;
  }
  Case& heads(Index q, Index kv) {
    q_heads = q;
    kv_heads = kv;
    return *this;
  }
  Case& dims(Index d, Index dv_ = 0) {
    dim = d;
    value_dim = dv_;
    return *this;
  }
  Case& batches(Index b) {
    batch = b;
    return *this;
  }
  Case& laid_out(Layout l) {
    layout = l;
    return *this;
  }
  Case& on_threads(int t) {
    threads = t;
    return *this;
  }
  Case& at_offset(std::optional<Index> o) {
    q_offset = o;
    return *this;
  }

  Index dv() const { return value_dim > 0 ? value_dim : dim; }
  Index rows() const { return batch * q_heads * q_len; }
  Index offset() const { return q_offset ? *q_offset : kv_len - q_len; }
  Options options() const {
    Options o = Options{}.with_threads(threads);
    o.q_offset = q_offset;
    return o;
  }
};

/// "B1 Hq2 Hkv1 Lq77 Lk77 d32 dv32 bhsd threads 2 q_offset 0 (default)", for INFO.
std::string describe(const Case& c);

/// The largest differences between kernel and reference, and the rows that see no key.
struct Outcome {
  double out_err = 0, lse_err = 0;
  bool padding_intact = true;    // the output's padding still holds NaN: nothing wrote there
  Index empty_rows = 0;          // rows whose reference LSE is -inf (they see no key)
  bool empty_rows_exact = true;  // each such row is exactly 0 with LSE -inf in the kernel too
};

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
  attention(spec, q.cview(), k.cview(), v.cview(), o.view, options.with_lse(lse.data()));
  reference::attention(spec, q.cview(), k.cview(), v.cview(), expected.view,
                       options.with_lse(lse_expected.data()));

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

/// CHECKs an Outcome: the output within tol::kF32 and the LSE within lse_tol of the reference,
/// the padding intact, the rows that see no key exact.
void check_outcome(const Outcome& r, double lse_tol = tol::kLseF32);

/// attention()'s output [B, Hq, Lq, Dv] (row-major) and LSE [B, Hq, Lq] for one Case; compare
/// two with max_lse_diff (NaN counts as infinity, equal infinities as 0).
struct KernelResult {
  std::vector<float> out, lse;
};

/// The bytes of r.out then r.lse, for comparing two results bit for bit.
std::vector<unsigned char> bytes_of(const KernelResult& r);

/// call(o, options) into a Bhsd output, with the row statistic (42 where nothing is written)
/// when the normalizer has one; `options` are c.options() and the statistic's buffer.
template <class Spec, class Call>
KernelResult run_into(const Case& c, Call&& call) {
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  KernelResult r;
  Options options = c.options();
  if constexpr (detail::row_stat_kind<typename Spec::Normalizer>() != RowStat::None) {
    r.lse.assign(static_cast<std::size_t>(c.rows()), 42.f);
    options = options.with_lse(r.lse.data());
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
