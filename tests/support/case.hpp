// The shape of a kernel test (Case), stated in one line, and what a run of it gives
// (Outcome, KernelResult), with the checks and descriptions the tests share. Light: no
// kernel header, so support.cpp (built once, for every ISA the tests are built for) holds
// no SIMD code.
#pragma once

#include <attnkit/core/tensor.hpp>
#include <attnkit/options.hpp>
#include <optional>
#include <string>
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

/// The ragged cases each mechanism's attention() test runs over its grid, in order: a 77 x 77
/// square (bhsd), one query and one key (one thread), Lq != Lk bottom-right with GQA (one and
/// two key tiles, one thread), and rows that see no key under Causal (q_offset -9).
template <class Visit>
void for_each_ragged_case(Visit&& visit) {
  const Case square = Case{}.lengths(77, 77).dims(32).laid_out(Layout::Bhsd);
  visit(square);
  visit(Case{square}.lengths(1, 1).on_threads(1));
  visit(Case{}.lengths(37, 133).heads(4, 2).dims(32).on_threads(1));
  visit(Case{}.lengths(70, 300).heads(4, 2).dims(32).on_threads(1));
  visit(Case{}.lengths(50, 30).heads(3, 1).dims(32).at_offset(-9));
}

/// "B1 Hq2 Hkv1 Lq77 Lk77 d32 dv32 bhsd threads 2 q_offset 0 (default)", for INFO.
std::string describe(const Case& c);

/// The largest differences between kernel and reference, and the rows that see no key.
struct Outcome {
  double out_err = 0, lse_err = 0;
  bool padding_intact = true;    // the output's padding still holds NaN: nothing wrote there
  Index empty_rows = 0;          // rows whose reference LSE is -inf (they see no key)
  bool empty_rows_exact = true;  // each such row is exactly 0 with LSE -inf in the kernel too
};

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

}  // namespace attnkit::test
