// attention_varlen(): packed sequences give bitwise the outputs and LSE of one attention()
// call per sequence on its own buffers (Full, Causal at bottom-right, Causal with RoPE at
// per-sequence positions; GQA; empty sequences); no query sees another sequence's keys (their
// K and V poisoned with NaN leave the output finite and unchanged); bad cu_seqlens and shapes
// throw before anything is written.
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/varlen.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "support/attnkit_test.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;

namespace {

constexpr Index kHq = 4, kHkv = 2, kD = 64, kDv = 32;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Sequence 1 has no token at all; sequence 2 has queries but no key (its rows are 0, LSE
// -inf); sequence 3 is longer than one query tile; sequence 5 has more queries than keys.
const std::vector<Index> kCuQ = {0, 5, 5, 8, 78, 79, 91};
const std::vector<Index> kCuK = {0, 9, 9, 9, 79, 119, 126};

// RoPE refuses negative positions: a sequence with more queries than keys has some.
const std::vector<Index> kRopeCuQ = {0, 5, 5, 75, 76};
const std::vector<Index> kRopeCuK = {0, 9, 9, 79, 119};

// The packed inputs [1, total, H, D] of one packing.
struct Packed {
  std::vector<Index> cu_q, cu_k;
  Tensor<float> q, k, v;
  explicit Packed(std::vector<Index> cq = kCuQ, std::vector<Index> ck = kCuK)
      : cu_q(std::move(cq)),
        cu_k(std::move(ck)),
        q(Layout::Bshd, 1, kHq, cu_q.back(), kD),
        k(Layout::Bshd, 1, kHkv, cu_k.back(), kD),
        v(Layout::Bshd, 1, kHkv, cu_k.back(), kDv) {
    q.randomize(1);
    k.randomize(2);
    v.randomize(3);
  }
  Index total_q() const { return cu_q.back(); }
};

struct Result {
  std::vector<float> out, lse;  // [1, total_q, Hq, Dv] (BSHD), [Hq, total_q]
};

template <class Spec>
Result run_varlen(const Spec& spec, const Packed& in) {
  Tensor<float> o(Layout::Bshd, 1, kHq, in.total_q(), kDv);
  Result r;
  r.lse.assign(static_cast<std::size_t>(kHq * in.total_q()), 42.f);
  ak::attention_varlen(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, in.cu_q, in.cu_k,
                       ak::Options{}.with_threads(2).with_lse(r.lse));
  r.out = std::move(o.memory);
  return r;
}

// Rows [begin, begin + n) of a packed tensor, copied into a buffer of their own.
void copy_rows(const Tensor<float>& from, Index begin, Index n, Tensor<float>& to) {
  for (Index h = 0; h < from.view.heads; ++h)
    for (Index s = 0; s < n; ++s)
      std::copy_n(from.view.row(0, h, begin + s), from.view.dim, to.view.row(0, h, s));
}

// One attention() call per sequence, on copies, assembled at the packed indices.
template <class Spec>
Result run_per_sequence(const Spec& spec, const Packed& in) {
  const Index total = in.total_q();
  Result r;
  r.out.assign(static_cast<std::size_t>(total * kHq * kDv), 0.f);
  r.lse.assign(static_cast<std::size_t>(kHq * total), 42.f);
  for (std::size_t s = 0; s + 1 < in.cu_q.size(); ++s) {
    const Index q0 = in.cu_q[s], nq = in.cu_q[s + 1] - q0;
    const Index k0 = in.cu_k[s], nk = in.cu_k[s + 1] - k0;
    if (nq == 0) continue;
    Tensor<float> q(Layout::Bshd, 1, kHq, nq, kD), k(Layout::Bshd, 1, kHkv, nk, kD),
        v(Layout::Bshd, 1, kHkv, nk, kDv), o(Layout::Bshd, 1, kHq, nq, kDv);
    copy_rows(in.q, q0, nq, q);
    copy_rows(in.k, k0, nk, k);
    copy_rows(in.v, k0, nk, v);
    std::vector<float> lse(static_cast<std::size_t>(kHq * nq));
    ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view,
                  ak::Options{}.with_threads(2).with_lse(lse));
    std::copy(o.memory.begin(), o.memory.end(), r.out.begin() + q0 * kHq * kDv);
    for (Index h = 0; h < kHq; ++h)
      std::copy_n(lse.data() + h * nq, nq, r.lse.begin() + h * total + q0);
  }
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float e) { return std::isfinite(e); });
}

}  // namespace

TEST_CASE("attention_varlen: packed sequences equal one attention() call per sequence, bitwise",
          "[kernel][varlen]") {
  const Packed in;
  SECTION("Full") {
    const auto spec = ak::make_spec(ak::Full{});
    const Result got = run_varlen(spec, in), want = run_per_sequence(spec, in);
    CHECK(bitwise_equal(got.out, want.out));
    CHECK(bitwise_equal(got.lse, want.lse));
  }
  SECTION("Causal, bottom-right per sequence") {
    const auto spec = ak::make_spec(ak::Causal{});
    const Result got = run_varlen(spec, in), want = run_per_sequence(spec, in);
    CHECK(bitwise_equal(got.out, want.out));
    CHECK(bitwise_equal(got.lse, want.lse));
  }
  SECTION("Causal with RoPE at per-sequence positions") {
    const Packed packed(kRopeCuQ, kRopeCuK);
    const auto spec = ak::make_spec(ak::Causal{}, ak::Rope{ak::RopeTable(kD, 10000.0, 128)});
    const Result got = run_varlen(spec, packed), want = run_per_sequence(spec, packed);
    CHECK(bitwise_equal(got.out, want.out));
    CHECK(bitwise_equal(got.lse, want.lse));
  }
}

TEST_CASE("attention_varlen: a sequence with queries but no key gives 0 and LSE -inf",
          "[kernel][varlen]") {
  const Packed in;
  const Result got = run_varlen(ak::make_spec(ak::Causal{}), in);
  const Index q0 = kCuQ[2], nq = kCuQ[3] - q0;  // sequence 2: 3 queries, no key
  for (Index s = q0; s < q0 + nq; ++s)
    for (Index c = 0; c < kHq * kDv; ++c)
      CHECK(got.out[static_cast<std::size_t>(s * kHq * kDv + c)] == 0.f);
  for (Index h = 0; h < kHq; ++h)
    for (Index s = q0; s < q0 + nq; ++s)
      CHECK(got.lse[static_cast<std::size_t>(h * kCuQ.back() + s)] ==
            -std::numeric_limits<float>::infinity());
}

TEST_CASE("attention_varlen: no query attends to another sequence's keys", "[kernel][varlen]") {
  const auto spec = ak::make_spec(ak::Full{});  // no mask clips the keys: only cu_seqlens do
  const Packed clean;
  const Result want = run_varlen(spec, clean);
  for (std::size_t s = 0; s + 1 < kCuQ.size(); ++s) {
    INFO("sequence " << s);
    Packed poisoned;
    for (Index j = 0; j < kCuK.back(); ++j) {
      if (j >= kCuK[s] && j < kCuK[s + 1]) continue;
      for (Index h = 0; h < kHkv; ++h) {
        std::fill_n(poisoned.k.view.row(0, h, j), kD, kNaN);
        std::fill_n(poisoned.v.view.row(0, h, j), kDv, kNaN);
      }
    }
    const Result got = run_varlen(spec, poisoned);
    const auto begin = static_cast<std::ptrdiff_t>(kCuQ[s] * kHq * kDv);
    const auto end = static_cast<std::ptrdiff_t>(kCuQ[s + 1] * kHq * kDv);
    const std::vector<float> mine(got.out.begin() + begin, got.out.begin() + end);
    const std::vector<float> expected(want.out.begin() + begin, want.out.begin() + end);
    CHECK(all_finite(mine));
    CHECK(bitwise_equal(mine, expected));
  }
}

TEST_CASE("attention_varlen: bad cu_seqlens and shapes throw before writing",
          "[kernel][varlen][errors]") {
  const Packed in;
  const auto spec = ak::make_spec(ak::Causal{});
  Tensor<float> o(Layout::Bshd, 1, kHq, kCuQ.back(), kDv);
  std::fill(o.memory.begin(), o.memory.end(), 42.f);
  std::vector<float> lse(static_cast<std::size_t>(kHq * kCuQ.back()), 42.f);
  const auto call = [&](const std::vector<Index>& cu_q, const std::vector<Index>& cu_k) {
    ak::attention_varlen(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, cu_q, cu_k,
                         ak::Options{}.with_lse(lse));
  };
  const Index tq = kCuQ.back(), tk = kCuK.back();
  CHECK_THROWS_AS(call({1, 5, tq}, {0, 9, tk}), ak::Error);           // does not start at 0
  CHECK_THROWS_AS(call({0, 50, 40, tq}, {0, 9, 19, tk}), ak::Error);  // decreasing
  CHECK_THROWS_AS(call({0, 5, tq - 1}, {0, 9, tk}), ak::Error);       // last != total_q
  CHECK_THROWS_AS(call({0, 5, tq}, {0, 9, tk + 1}), ak::Error);       // last != total_k
  CHECK_THROWS_AS(call({0, 5, tq}, {0, 9, 20, tk}), ak::Error);       // counts differ
  CHECK_THROWS_AS(call({}, {}), ak::Error);                           // no entry at all
  // A policy that does not fit one sequence (RoPE table shorter than its keys) is refused
  // before the sequences that fit run.
  const auto short_rope = ak::make_spec(ak::Causal{}, ak::Rope{ak::RopeTable(kD, 10000.0, 30)});
  CHECK_THROWS_AS(ak::attention_varlen(short_rope, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                                       kCuQ, kCuK),
                  ak::Error);
  // Two batches of 45 queries and 63 keys: varlen wants every token along seq of batch 1.
  const auto q2 = ak::bshd(in.q.memory.data(), 2, 45, kHq, kD);
  const auto k2 = ak::bshd(in.k.memory.data(), 2, 63, kHkv, kD);
  const auto v2 = ak::bshd(in.v.memory.data(), 2, 63, kHkv, kDv);
  const auto o2 = ak::bshd(o.memory.data(), 2, 45, kHq, kDv);
  CHECK_THROWS_MATCHES(
      ak::attention_varlen(spec, ak::View<const float>(q2), ak::View<const float>(k2),
                           ak::View<const float>(v2), o2, {0, 45}, {0, 63}),
      ak::Error, Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring("q.batch")));
  CHECK(std::all_of(o.memory.begin(), o.memory.end(), [](float x) { return x == 42.f; }));
  CHECK(std::all_of(lse.begin(), lse.end(), [](float x) { return x == 42.f; }));
}
