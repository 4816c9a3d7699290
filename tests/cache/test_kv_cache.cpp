// KvCache: serving a sequence through the cache (a prefill in two chunks, then one token at a
// time, each an attention() call over keys() / values() with Causal at the default,
// bottom-right q_offset) gives the attention of the whole sequence at once: f32, bf16 and f16
// storage against the f64 reference of the rounded inputs; RoPE both ways (keys stored
// rotated and queries turned by apply_position; keys stored plain and Rope fused); then the
// errors, each leaving the cache unchanged.
// The storage under test is cache/kv_storage.hpp (KvStorage: sizes, views, row writes), which
// PagedKv shares; tests/quant/test_quantize.cpp runs it with quantized blocks.
#include <Eigen/Core>
#include <attnkit/cache/kv_cache.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/varlen.hpp>  // detail::seq_rows
#include <attnkit/mask/causal.hpp>
#include <attnkit/position/apply.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/spec.hpp>
#include <attnkit/storage/quantize.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

#include "support/error_checks.hpp"
#include "support/test_names.hpp"

using ak::detail::seq_rows;  // rows [begin, begin + n) of a view along seq

namespace {

constexpr Index kB = 2, kHq = 4, kHkv = 2, kD = 64, kDv = 48;
constexpr Index kLen = 83;  // prefill 64 + 11, then 8 single tokens
const std::vector<Index> kSteps = {64, 11, 1, 1, 1, 1, 1, 1, 1, 1};

// One whole sequence: q, k, v in BSHD f32, and the same k, v rounded to storage T.
template <class T>
struct Sequence {
  Tensor<float> q{Layout::Bshd, kB, kHq, kLen, kD}, k{Layout::Bshd, kB, kHkv, kLen, kD},
      v{Layout::Bshd, kB, kHkv, kLen, kDv};
  Tensor<T> k_stored{Layout::Bshd, kB, kHkv, kLen, kD}, v_stored{Layout::Bshd, kB, kHkv, kLen, kDv};
  Sequence() {
    q.randomize(1);
    k.randomize(2);
    v.randomize(3);
    round_into(k, k_stored);
    round_into(v, v_stored);
  }
  // to = T(from), then from = float(to): both hold the rounded values.
  static void round_into(Tensor<float>& from, Tensor<T>& to) {
    for (std::size_t i = 0; i < from.memory.size(); ++i) {
      to.memory[i] = T(from.memory[i]);
      from.memory[i] = float(to.memory[i]);
    }
  }
};

// Serves the sequence through `cache` step by step, writing each step's output rows into
// `o` [B, Hq, kLen, Dv]; `step(q_rows, first_row, o_rows)` runs attention for one step after
// the step's keys and values are appended by `append(first_row, n)`.
template <class Append, class Step>
void serve(const ak::View<float>& o, Append append, Step step) {
  Index at = 0;
  for (const Index n : kSteps) {
    append(at, n);
    step(at, n, seq_rows(o, at, n));
    at += n;
  }
  REQUIRE(at == kLen);
}

}  // namespace

TEMPLATE_TEST_CASE("KvCache: prefill then single tokens equal attention over the whole sequence",
                   "[cache][kv_cache]", float, Eigen::bfloat16, Eigen::half) {
  const Sequence<TestType> seq;
  ak::KvCache<TestType> cache(kB, kHkv, kLen + 5, kD, kDv);
  const auto spec = ak::make_spec(ak::Causal{});
  Tensor<float> o(Layout::Bhsd, kB, kHq, kLen, kDv);
  serve(
      o.view,
      [&](Index at, Index n) {
        cache.append(seq_rows(seq.k.cview(), at, n), seq_rows(seq.v.cview(), at, n));
        REQUIRE(cache.length() == at + n);
      },
      [&](Index at, Index n, ak::View<float> out) {
        ak::attention(spec, seq_rows(seq.q.cview(), at, n), cache.keys(), cache.values(), out,
                      ak::Options{}.with_threads(2));
      });
  Tensor<double> expected(Layout::Bhsd, kB, kHq, kLen, kDv);
  ak::reference::attention(spec, seq.q.cview(), seq.k_stored.cview(), seq.v_stored.cview(),
                           expected.view);
  CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
  CHECK(ak::test::max_abs_diff(cache.keys(), seq.k_stored.cview()) == 0.0);  // stored as given
  CHECK(ak::test::max_abs_diff(cache.values(), seq.v_stored.cview()) == 0.0);
}

TEST_CASE("KvCache: keys stored rotated with queries turned at their positions equal fused RoPE",
          "[cache][kv_cache][rope]") {
  const Sequence<float> seq;
  const ak::Rope rope{ak::RopeTable(kD, 10000.0, 128)};
  const auto causal = ak::make_spec(ak::Causal{});
  const auto fused = ak::make_spec(ak::Causal{}, rope);
  Tensor<double> expected(Layout::Bhsd, kB, kHq, kLen, kDv);
  ak::reference::attention(fused, seq.q.cview(), seq.k.cview(), seq.v.cview(), expected.view);

  SECTION("keys rotated once, in the cache; attention without a Position") {
    ak::KvCache<float> cache(kB, kHkv, kLen, kD, kDv);
    Tensor<float> o(Layout::Bhsd, kB, kHq, kLen, kDv), q_turned(Layout::Bhsd, kB, kHq, 64, kD);
    serve(
        o.view,
        [&](Index at, Index n) {
          cache.append(seq_rows(seq.k.cview(), at, n), seq_rows(seq.v.cview(), at, n), rope);
        },
        [&](Index at, Index n, ak::View<float> out) {
          const ak::View<float> q = seq_rows(q_turned.view, 0, n);
          for (Index b = 0; b < kB; ++b)
            for (Index h = 0; h < kHq; ++h)
              for (Index s = 0; s < n; ++s)
                std::copy_n(seq.q.view.row(b, h, at + s), kD, q.row(b, h, s));
          ak::apply_position(rope, q, ak::Role::Query, cache.length() - n);
          ak::attention(causal, ak::View<const float>(q), cache.keys(), cache.values(), out);
        });
    CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
  }
  SECTION("keys stored plain; Rope fused into attention at the default q_offset") {
    ak::KvCache<float> cache(kB, kHkv, kLen, kD, kDv);
    Tensor<float> o(Layout::Bhsd, kB, kHq, kLen, kDv);
    serve(
        o.view,
        [&](Index at, Index n) {
          cache.append(seq_rows(seq.k.cview(), at, n), seq_rows(seq.v.cview(), at, n));
        },
        [&](Index at, Index n, ak::View<float> out) {
          ak::attention(fused, seq_rows(seq.q.cview(), at, n), cache.keys(), cache.values(), out);
        });
    CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
  }
}

TEST_CASE("KvCache: views, capacity and clear", "[cache][kv_cache]") {
  ak::KvCache<Eigen::half> cache(3, 2, 10, 16);
  CHECK(cache.capacity() == 10);
  CHECK(cache.length() == 0);
  CHECK(cache.value_dim() == 16);
  Tensor<float> k(Layout::Bshd, 3, 2, 4, 16), v(Layout::Bshd, 3, 2, 4, 16);
  k.randomize(5);
  v.randomize(6);
  cache.append(k.cview(), v.cview());
  const ak::View<const Eigen::half> keys = cache.keys();
  CHECK((keys.batch == 3 && keys.heads == 2 && keys.seq == 4 && keys.dim == 16));
  CHECK(ak::test::max_abs_diff(keys, k.cview()) <= 1e-3 * 4);  // f16 rounding of N(0, 1)
  cache.clear();
  CHECK(cache.length() == 0);
  CHECK(cache.keys().seq == 0);
  cache.append(k.cview(), v.cview());
  cache.append(k.cview(), v.cview());
  CHECK(cache.length() == 8);
}

TEST_CASE("KvCache: storage starts on a cache line, and on a huge page from 2 MiB on",
          "[cache][kv_cache]") {
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const ak::KvCache<Eigen::bfloat16> small(1, 3, 7, 24);  // 1 KiB: line-aligned
  CHECK(address(small.keys().data) % 64 == 0);
  CHECK(address(small.values().data) % 64 == 0);
  const ak::KvCache<float> large(1, 2, 4096, 128);  // 4 MiB each: huge-page aligned
  CHECK(address(large.keys().data) % (std::uintptr_t{2} << 20) == 0);
  CHECK(address(large.values().data) % (std::uintptr_t{2} << 20) == 0);
  // The allocator hands back what it took (ASan checks the alignment it frees with).
  ak::detail::AlignedVector<float> grown(10);
  for (int i = 0; i < 20; ++i) grown.resize(grown.size() * 2);  // 64 B .. 40 MiB
  CHECK(address(grown.data()) % (std::uintptr_t{2} << 20) == 0);
  // A count whose bytes do not fit throws (as std::allocator), rather than wrapping around.
  CHECK_THROWS_AS(ak::detail::AlignedAllocator<float>{}.allocate(SIZE_MAX / 2), std::bad_alloc);
}

TEST_CASE("KvCache: bad appends throw before anything is written", "[cache][kv_cache][errors]") {
  ak::KvCache<float> cache(2, 2, 8, 16, 8);
  Tensor<float> k(Layout::Bshd, 2, 2, 5, 16), v(Layout::Bshd, 2, 2, 5, 8);
  k.randomize(1);
  v.randomize(2);
  cache.append(k.cview(), v.cview());
  const std::vector<float> keys_before(cache.keys().data, cache.keys().data + 2 * 2 * 8 * 16);
  const auto unchanged = [&] {
    CHECK(cache.length() == 5);
    CHECK(std::equal(keys_before.begin(), keys_before.end(), cache.keys().data));
  };

  SECTION("overflow of the capacity") {
    Tensor<float> k4(Layout::Bshd, 2, 2, 4, 16), v4(Layout::Bshd, 2, 2, 4, 8);
    ak::test::check_error([&] { cache.append(k4.cview(), v4.cview()); }, {"capacity"});
  }
  SECTION("shape mismatches") {
    Tensor<float> wrong_batch(Layout::Bshd, 1, 2, 1, 16), wrong_heads(Layout::Bshd, 2, 1, 1, 16),
        wrong_dim(Layout::Bshd, 2, 2, 1, 32), v1(Layout::Bshd, 2, 2, 1, 8),
        v2(Layout::Bshd, 2, 2, 2, 8), k1(Layout::Bshd, 2, 2, 1, 16),
        v_dim(Layout::Bshd, 2, 2, 1, 16);
    CHECK_THROWS_AS(cache.append(wrong_batch.cview(), v1.cview()), ak::Error);
    CHECK_THROWS_AS(cache.append(wrong_heads.cview(), v1.cview()), ak::Error);
    CHECK_THROWS_AS(cache.append(wrong_dim.cview(), v1.cview()), ak::Error);
    CHECK_THROWS_AS(cache.append(k1.cview(), v2.cview()), ak::Error);     // v seq != k seq
    CHECK_THROWS_AS(cache.append(k1.cview(), v_dim.cview()), ak::Error);  // v dim != value_dim
  }
  SECTION("a position beyond the RoPE table") {
    const ak::Rope short_rope{ak::RopeTable(16, 10000.0, 6)};
    Tensor<float> k2(Layout::Bshd, 2, 2, 2, 16), v2(Layout::Bshd, 2, 2, 2, 8);
    CHECK_THROWS_AS(cache.append(k2.cview(), v2.cview(), short_rope), ak::Error);
  }
  SECTION("new keys read from the cache itself") {
    CHECK_THROWS_AS(cache.append(seq_rows(cache.keys(), 0, 1), seq_rows(cache.values(), 0, 1)),
                    ak::Error);
  }
  unchanged();
}

TEST_CASE("KvCache<BlockQ8_0>: keys are checked as stored, after the Position turns them",
          "[cache][kv_cache][quant][errors]") {
  // Every key value 7e6 is below q8_0's bound (65520 * 127 = 8.3e6), but RoPE at position 1
  // turns pair (7e6, 7e6) by 1 radian to (-2.1e6, 9.7e6): that block's half scale would
  // overflow to inf and the row decode to +-inf. An Error, with nothing written.
  constexpr Index kD = 32;
  const ak::Rope rope{ak::RopeTable(kD, 10000.0, 16)};
  ak::KvCache<ak::BlockQ8_0> cache(1, 1, 8, kD, kD);
  std::vector<float> k(2 * kD, 7e6f), v(2 * kD, 1.f);
  const auto k_view = ak::bhsd(static_cast<const float*>(k.data()), 1, 1, 2, kD);
  const auto v_view = ak::bhsd(static_cast<const float*>(v.data()), 1, 1, 2, kD);
  ak::test::check_error([&] { cache.append(k_view, v_view, rope); },
                        {"k_new (turned by the Position) row (0, 0, 1)", "8.32", "quantized"});
  CHECK(cache.length() == 0);
  // Stored as given (no Position), the same keys encode.
  cache.append(k_view, v_view);
  std::vector<float> row(kD);
  ak::dequantize_row(cache.keys().row(0, 0, 1), kD, row.data());
  for (const float x : row) CHECK(std::isfinite(x));
  // Turned keys that stay below the bound after the turn are accepted and decode finite.
  std::fill(k.begin(), k.end(), 5e6f);  // turned: at most 5e6 * sqrt 2 = 7.1e6
  cache.clear();
  cache.append(k_view, v_view, rope);
  ak::dequantize_row(cache.keys().row(0, 0, 1), kD, row.data());
  for (const float x : row) CHECK(std::isfinite(x));
}

TEST_CASE("KvCache: bad sizes throw", "[cache][kv_cache][errors]") {
  CHECK_THROWS_AS(ak::KvCache<float>(-1, 1, 4, 8), ak::Error);
  CHECK_THROWS_AS(ak::KvCache<float>(1, 0, 4, 8), ak::Error);
  CHECK_THROWS_AS(ak::KvCache<float>(1, 1, -4, 8), ak::Error);
  CHECK_THROWS_AS(ak::KvCache<float>(1, 1, 4, 0), ak::Error);
  const Index huge = Index{1} << 40;
  CHECK_THROWS_AS(ak::KvCache<float>(huge, huge, 4, 8), ak::Error);
}
