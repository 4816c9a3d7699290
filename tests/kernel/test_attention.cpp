// attention() against reference::attention() over a grid of shapes, layouts, masks,
// score mods, GQA ratios and thread counts; edge cases (empty rows, huge logits, empty
// key sets); validation errors. Built for the native ISA and x86-64-v2 (ATTNKIT_PATH_TESTS).
// The engine under test: kernel/tiles/attention_tiles.hpp with its buffers
// (kernel/tiles/tile_buffers.hpp), its rows' normalizer states (kernel/tiles/tile_rows.hpp), its
// output side, kernel/tiles/tile_output.hpp, and, on the last tiles of Lq 65 and 130 (<= 4
// queries), the narrow path of kernel/tiles/tile_narrow.hpp.
#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>

#include "support/attention_runner.hpp"
#include "support/error_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

#ifdef __linux__
#include <sys/resource.h>
#include <unistd.h>
#endif

namespace {

using ak::test::run_case;

template <class Spec>
void check(const Spec& spec, const Case& c) {
  INFO(ak::test::describe(c));
  ak::test::check_outcome(run_case(spec, c));
}

const auto kFull = ak::make_spec();
const auto kCausal = ak::make_spec(ak::Causal{});

}  // namespace

TEST_CASE("attention: matches the reference for every sequence length", "[attention][grid]") {
  const Index len = GENERATE(1, 7, 63, 64, 65, 200, 1000);
  Case c = Case{}.lengths(len, len);
  check(kFull, c);
  check(kCausal, c);
}

TEST_CASE("attention: matches the reference when Lq != Lk", "[attention][grid]") {
  const auto [lq, lk] = GENERATE(
      table<Index, Index>({{1, 200}, {7, 65}, {65, 7}, {64, 1000}, {200, 63}, {130, 257}}));
  Case c = Case{}.lengths(lq, lk);
  check(kFull, c);
  check(kCausal, c);  // bottom-right: Lq > Lk leaves the first rows with no key
}

TEST_CASE("attention: matches the reference for every head dimension", "[attention][grid]") {
  const Index dim = GENERATE(32, 64, 80, 96, 128, 256);
  Case c = Case{}.lengths(77, 130).dims(dim).laid_out(Layout::Bhsd);
  check(kFull, c);
  check(kCausal, c);
}

TEST_CASE("attention: value dimension may differ from the key dimension", "[attention][grid]") {
  const auto [d, dv] = GENERATE(table<Index, Index>({{64, 32}, {32, 80}, {128, 72}, {80, 5}}));
  Case c = Case{}.lengths(70, 90).dims(d, dv);
  check(kFull, c);
  check(kCausal, c);
}

TEST_CASE("attention: GQA and MQA share KV heads", "[attention][grid]") {
  const auto [hq, hkv] = GENERATE(table<Index, Index>({{8, 8}, {8, 4}, {8, 2}, {8, 1}, {3, 1}}));
  Case c = Case{}.lengths(66, 100).heads(hq, hkv).dims(32).batches(2);
  check(kFull, c);
  check(kCausal, c);
}

TEST_CASE("attention: layouts BHSD, BSHD and padded strides", "[attention][grid]") {
  const Layout layout = GENERATE(Layout::Bhsd, Layout::Bshd, Layout::Padded);
  Case c = Case{}.lengths(65, 129).heads(4, 2).dims(80).batches(2).laid_out(layout);
  check(kFull, c);
  check(kCausal, c);
}

// From kContiguousCopyQueries queries on, f32 K and V whose rows are not back to back are
// read from one contiguous copy (kernel/attention.hpp); below it, in place. Either way the
// tiles see the same values in the same order: the bits of BHSD, and the reference.
TEST_CASE("attention: BSHD and padded K/V (copied or read in place) give the bits of BHSD",
          "[attention][grid]") {
  const Index q_len = GENERATE(ak::detail::kContiguousCopyQueries - 1,
                               ak::detail::kContiguousCopyQueries, Index{300});
  Case c = Case{}.lengths(q_len, 300).heads(4, 2).dims(64).batches(2);
  c.value_dim = 48;
  const auto bhsd = ak::test::bytes_of(ak::test::run_kernel(kCausal, c));
  for (const Layout layout : {Layout::Bshd, Layout::Padded}) {
    c.layout = layout;
    INFO(ak::test::describe(c));
    CHECK(ak::test::bytes_of(ak::test::run_kernel(kCausal, c)) == bhsd);
    check(kCausal, c);
  }
}

TEST_CASE("attention: softcap with and without causal mask", "[attention][softcap]") {
  const float cap = GENERATE(5.f, 30.f);
  Case c = Case{}.lengths(100, 300);
  c.stddev = 3.f;  // logits large enough that the cap bends them
  check(ak::make_spec(ak::Softcap{cap}), c);
  check(ak::make_spec(ak::Causal{}, ak::Softcap{cap}), c);
}

TEST_CASE("attention: one and two threads, any q_offset", "[attention][threads]") {
  const int threads = GENERATE(1, 2);
  const Index offset = GENERATE(-20, 0, 50);
  Case c = Case{}.lengths(150, 180).on_threads(threads).at_offset(offset);
  check(kCausal, c);
}

TEST_CASE("attention: the thread count does not change a single bit", "[attention][threads]") {
  Tensor<float> q(Layout::Bshd, 2, 4, 300, 64), k(Layout::Bshd, 2, 2, 300, 64),
      v(Layout::Bshd, 2, 2, 300, 64), o1(Layout::Bshd, 2, 4, 300, 64),
      o2(Layout::Bshd, 2, 4, 300, 64);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  ak::attention(kCausal, q.cview(), k.cview(), v.cview(), o1.view, ak::Options{}.with_threads(1));
  ak::attention(kCausal, q.cview(), k.cview(), v.cview(), o2.view, ak::Options{}.with_threads(2));
  CHECK(std::memcmp(o1.memory.data(), o2.memory.data(), o1.memory.size() * sizeof(float)) == 0);
}

TEST_CASE("attention: a row with no visible key gives 0 and LSE -inf", "[attention][edge]") {
  // Causal with q_offset = -3: query rows 0..2 sit before key 0 and see nothing.
  ak::test::Inputs<float> in(
      ak::test::Case{}.heads(1, 1).lengths(10, 10).dims(32).laid_out(Layout::Bhsd), 1);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  Tensor<float> o(Layout::Bhsd, 1, 1, 10, 32);
  std::vector<float> lse(10);
  ak::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view,
                ak::Options{}.with_q_offset(-3).with_lse(lse));
  for (Index r = 0; r < 3; ++r) {
    CHECK(lse[r] == -std::numeric_limits<float>::infinity());
    for (Index c = 0; c < 32; ++c) CHECK(o.view.row(0, 0, r)[c] == 0.f);
  }
  for (Index r = 3; r < 10; ++r) CHECK(std::isfinite(lse[r]));
}

TEST_CASE("attention: no keys at all gives 0 and LSE -inf", "[attention][edge]") {
  Tensor<float> q(Layout::Bhsd, 1, 2, 5, 16), k(Layout::Bhsd, 1, 2, 0, 16),
      v(Layout::Bhsd, 1, 2, 0, 16), o(Layout::Bhsd, 1, 2, 5, 16);
  q.randomize(1);
  o.fill(42.f);
  std::vector<float> lse(10, 1.f);
  ak::attention(kFull, q.cview(), k.cview(), v.cview(), o.view, ak::Options{}.with_lse(lse));
  o.for_each([](float& x) { CHECK(x == 0.f); });
  for (float x : lse) CHECK(x == -std::numeric_limits<float>::infinity());
}

TEST_CASE("attention: huge logits (+-1e4) neither overflow nor lose the reference",
          "[attention][edge]") {
  // Integer data so that every logit is exact in f32: q . k = +-1e4 with scale 1.
  const Index L = 70, D = 16;
  Tensor<float> q(Layout::Bhsd, 1, 1, L, D), k(Layout::Bhsd, 1, 1, L, D),
      v(Layout::Bhsd, 1, 1, L, D), o(Layout::Bhsd, 1, 1, L, D);
  Tensor<double> expected(Layout::Bhsd, 1, 1, L, D);
  v.randomize(3);
  for (Index i = 0; i < L; ++i) {
    q.view.row(0, 0, i)[0] = (i % 2 == 0) ? 100.f : -100.f;
    k.view.row(0, 0, i)[0] = float(100 - 3 * (i % 7));  // logits in [+-8200, +-1e4]
  }
  std::vector<float> lse(L), lse_expected(L);
  const auto opts = ak::Options{}.with_scale(1.f);
  for (const bool causal : {false, true}) {
    if (causal) {
      ak::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view, opts.with_lse(lse));
      ak::reference::attention(kCausal, q.cview(), k.cview(), v.cview(), expected.view,
                               opts.with_lse(lse_expected));
    } else {
      ak::attention(kFull, q.cview(), k.cview(), v.cview(), o.view, opts.with_lse(lse));
      ak::reference::attention(kFull, q.cview(), k.cview(), v.cview(), expected.view,
                               opts.with_lse(lse_expected));
    }
    CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
    // LSE of order 1e4: compare relative to its magnitude (f32 has 24 bits).
    for (Index i = 0; i < L; ++i) CHECK(std::abs(lse[i] - lse_expected[i]) <= 1e4 * 1e-6);
  }
}

TEST_CASE("attention: bf16 and f16 storage convert to f32 and match the reference",
          "[attention][dtype]") {
  Case c = Case{}.lengths(70, 150);
  // Same rounded inputs on both sides: the kernel computes in f32 from them.
  ak::test::check_outcome(run_case<Eigen::bfloat16>(kCausal, c));
  ak::test::check_outcome(run_case<Eigen::half>(kCausal, c));
}

template <class Out>
double rounded_output_error() {
  Tensor<float> q(Layout::Bhsd, 1, 2, 40, 64), k(Layout::Bhsd, 1, 2, 90, 64),
      v(Layout::Bhsd, 1, 2, 90, 64);
  Tensor<Out> o(Layout::Bhsd, 1, 2, 40, 64);
  Tensor<double> expected(Layout::Bhsd, 1, 2, 40, 64);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  ak::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view);
  ak::reference::attention(kCausal, q.cview(), k.cview(), v.cview(), expected.view);
  return ak::test::max_abs_diff(o.view, expected.view);
}

TEST_CASE("attention: bf16 and f16 outputs are the f32 result rounded", "[attention][dtype]") {
  CHECK(rounded_output_error<Eigen::bfloat16>() <= tol::kBf16);
  CHECK(rounded_output_error<Eigen::half>() <= tol::kHalf);
}

TEST_CASE("attention: empty batches and empty query sets write nothing and do not fail",
          "[attention][edge]") {
  const Index batch = GENERATE(0, 2);
  const Index q_len = batch == 0 ? 5 : 0;
  Tensor<float> q(Layout::Bhsd, batch, 2, q_len, 16), k(Layout::Bhsd, batch, 2, 9, 16),
      v(Layout::Bhsd, batch, 2, 9, 16), o(Layout::Bhsd, batch, 2, q_len, 16);
  k.randomize(1);
  v.randomize(2);
  CHECK_NOTHROW(ak::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view));
}

namespace {

// Causal without its runs() face (so Partial tiles call keep()), every keep() call counted.
struct CountingCausal {
  using slot = ak::MaskSlot;
  ak::Causal causal;
  std::atomic<long>* keep_calls;
  bool keep(Index b, Index h, Index i, Index j) const {
    keep_calls->fetch_add(1);
    return causal.keep(b, h, i, j);
  }
  ak::TileKind classify(Index b, Index h, ak::Range q, ak::Range kv) const {
    return causal.classify(b, h, q, kv);
  }
  ak::KeyRanges<1> key_ranges(Index b, Index h, ak::Range q) const {
    return causal.key_ranges(b, h, q);
  }
};

}  // namespace

TEST_CASE("attention: Full tiles never evaluate keep() and Empty tiles are skipped",
          "[attention][mask]") {
  // 200 queries after 100 earlier keys (Lk = 300). With 64-query and 256-key tiles, the
  // only keep() calls allowed are those on Partial tiles, i.e. near the diagonal.
  const Index Lq = 200, Lk = 300, D = 32;
  ak::test::Inputs<float> in(
      ak::test::Case{}.heads(1, 1).lengths(Lq, Lk).dims(D).laid_out(Layout::Bhsd), 1);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  Tensor<float> o(Layout::Bhsd, 1, 1, Lq, D);
  std::atomic<long> calls{0};
  CountingCausal mask;
  mask.keep_calls = &calls;
  ak::attention(ak::make_spec(mask), q.cview(), k.cview(), v.cview(), o.view,
                ak::Options{}.with_threads(1));

  // Upper bound: for each query tile, every (query, key) pair of the key tiles that
  // classify() calls Partial, over the keys the mask lets the tile see.
  const Index bq = ak::TileConfig::kBlockQ, bk = ak::TileConfig::kBlockK, offset = Lk - Lq;
  long bound = 0, dense = 0;
  for (Index q0 = 0; q0 < Lq; q0 += bq) {
    const Index nq = std::min(bq, Lq - q0);
    const ak::Range rows{q0 + offset, q0 + nq + offset};
    const ak::Range keys = mask.key_ranges(0, 0, rows).ranges[0];
    for (Index k0 = keys.begin; k0 < keys.end; k0 += bk) {
      const Index nk = std::min(bk, keys.end - k0);
      dense += nq * nk;
      if (mask.classify(0, 0, rows, {k0, k0 + nk}) == ak::TileKind::Partial) bound += nq * nk;
    }
  }
  INFO("keep() calls " << calls.load() << ", Partial pairs " << bound << ", visible pairs "
                       << dense);
  CHECK(calls.load() > 0);
  CHECK(calls.load() <= bound);
  CHECK(bound < dense);  // the shape does have Full tiles, so the bound is not vacuous

  Tensor<double> expected(Layout::Bhsd, 1, 1, Lq, D);
  ak::reference::attention(ak::make_spec(mask), q.cview(), k.cview(), v.cview(), expected.view);
  CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
}

TEST_CASE("attention: invalid arguments throw attnkit::Error and leave the output untouched",
          "[attention][errors]") {
  Tensor<float> q(Layout::Bhsd, 2, 4, 8, 32), k(Layout::Bhsd, 2, 2, 9, 32),
      v(Layout::Bhsd, 2, 2, 9, 32), o(Layout::Bhsd, 2, 4, 8, 32);
  Tensor<float> k_bad_dim(Layout::Bhsd, 2, 2, 9, 16), k_bad_heads(Layout::Bhsd, 2, 3, 9, 32),
      v_bad_len(Layout::Bhsd, 2, 2, 10, 32), o_bad_len(Layout::Bhsd, 2, 4, 7, 32),
      o_bad_dim(Layout::Bhsd, 2, 4, 8, 16), q_bad_batch(Layout::Bhsd, 1, 4, 8, 32);
  auto check_throws = [&](auto call, const char* names, Tensor<float>& out) {
    out.fill(42.f);
    ak::test::check_error(call, {names});
    CHECK(out.holds(42.f));
  };
  const auto K = k.cview();
  const auto V = v.cview();
  check_throws([&] { ak::attention(kFull, q.cview(), k_bad_dim.cview(), V, o.view); },
               "k.dim: expected 32", o);
  {  // the LSE buffer is left alone too
    std::vector<float> lse(64, 7.f);
    ak::test::check_refused(
        [&] {
          ak::attention(kFull, q.cview(), k_bad_dim.cview(), V, o.view,
                        ak::Options{}.with_lse(lse));
        },
        {"k.dim"}, {&lse}, 7.f);
  }
  check_throws(
      [&] {
        ak::attention(kFull, q.cview(), K, V, o.view,
                      ak::Options{}.with_q_offset(ak::Problem::kMaxOffset + 1));
      },
      "q_offset: expected within +-2^62", o);
  {  // output rows that overlap (a zero head stride) would be written by several threads
    auto overlapping = o.view;
    overlapping.head_stride = 0;
    check_throws([&] { ak::attention(kFull, q.cview(), K, V, overlapping); },
                 "o.head_stride: expected >= 32 (rows must not overlap), got 0", o);
  }
  check_throws([&] { ak::attention(kFull, q.cview(), k_bad_heads.cview(), V, o.view); },
               "v.heads: expected 3", o);
  check_throws([&] { ak::attention(kFull, q.cview(), K, v_bad_len.cview(), o.view); },
               "v.seq: expected 9", o);
  check_throws([&] { ak::attention(kFull, q.cview(), K, V, o_bad_len.view); }, "o.seq: expected 8",
               o_bad_len);
  check_throws([&] { ak::attention(kFull, q.cview(), K, V, o_bad_dim.view); }, "o.dim: expected 32",
               o_bad_dim);
  check_throws([&] { ak::attention(kFull, q_bad_batch.cview(), K, V, o.view); },
               "k.batch: expected 1", o);
  Tensor<float> q_odd_heads(Layout::Bhsd, 2, 3, 8, 32), o_odd_heads(Layout::Bhsd, 2, 3, 8, 32);
  check_throws([&] { ak::attention(kFull, q_odd_heads.cview(), K, V, o_odd_heads.view); },
               "q_heads: expected a positive multiple of kv_heads (2), got 3", o_odd_heads);
  check_throws(
      [&] { ak::attention(kFull, q.cview(), K, V, o.view, ak::Options{}.with_scale(NAN)); },
      "scale: expected finite and non-zero", o);
  check_throws(
      [&] { ak::attention(kFull, q.cview(), K, V, o.view, ak::Options{}.with_threads(-1)); },
      "threads: expected 0 (all) to 1024, got -1", o);
  check_throws(
      [&] { ak::attention(kFull, q.cview(), K, V, o.view, ak::Options{}.with_threads(100000)); },
      "threads: expected 0 (all) to 1024, got 100000", o);
  {  // the row statistic carries its size: one float short is an Error, nothing written
    std::vector<float> short_lse(2 * 4 * 8 - 1, 7.f);
    check_throws(
        [&] { ak::attention(kFull, q.cview(), K, V, o.view, ak::Options{}.with_lse(short_lse)); },
        "Options.lse.size(): expected 64 (q.batch * q.heads * q.seq", o);
    CHECK(std::all_of(short_lse.begin(), short_lse.end(), [](float x) { return x == 7.f; }));
  }
  {  // in place over q is refused: o and q are the same memory
    auto in_place = q.view;
    check_throws([&] { ak::attention(kFull, q.cview(), K, V, in_place); },
                 "o: expected memory disjoint from q", q);
    std::vector<float> lse(64, 7.f);
    check_throws(
        [&] {
          ak::attention(kFull, q.cview(), K, V, o.view,
                        ak::Options{}.with_lse(o.view.data + 8, 64));
        },
        "lse: expected memory disjoint from o", o);
  }
  auto null_q = q.cview();
  null_q.data = nullptr;
  check_throws([&] { ak::attention(kFull, null_q, K, V, o.view); }, "q.data: expected non-null", o);
  auto negative = k.cview();
  negative.seq_stride = -32;
  check_throws([&] { ak::attention(kFull, q.cview(), negative, V, o.view); },
               "k.seq_stride: expected >= 0, got -32", o);
}

#if defined(__SANITIZE_ADDRESS__)
#define ATTNKIT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTNKIT_TEST_ASAN 1
#endif
#endif

TEST_CASE("attention: scratch that cannot be allocated throws std::bad_alloc to the caller",
          "[attention][errors]") {
#if defined(ATTNKIT_TEST_ASAN) || !defined(__linux__)
  SKIP("needs RLIMIT_AS on Linux, which AddressSanitizer's shadow memory defeats");
#elif defined(ATTNKIT_TEST_EMULATED)
  SKIP("under qemu user emulation RLIMIT_AS caps the emulator's address space, not the test's");
#else
  // The largest head and value dimension (2^20) needs 512 MiB of tile scratch per thread. Cap
  // the address space at what is mapped now plus 256 MiB: the allocation must fail on the
  // calling thread, before any worker starts, and the output stays untouched. Lq is one more
  // than decode takes (up to kMaxDecodeQueries rows run on the decode row engine, whose
  // scratch is a few rows).
  const Index D = ak::Problem::kMaxDim, Lq = ak::kMaxDecodeQueries + 1;
  Tensor<float> q(Layout::Bhsd, 1, 1, Lq, D), k(Layout::Bhsd, 1, 1, 1, D),
      v(Layout::Bhsd, 1, 1, 1, D), o(Layout::Bhsd, 1, 1, Lq, D);
  o.fill(42.f);
  long pages = 0;
  {
    std::FILE* statm = std::fopen("/proc/self/statm", "r");
    REQUIRE(statm != nullptr);
    REQUIRE(std::fscanf(statm, "%ld", &pages) == 1);
    std::fclose(statm);
  }
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_AS, &saved) == 0);
  rlimit capped = saved;
  capped.rlim_cur =
      static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t{256} << 20);
  REQUIRE(setrlimit(RLIMIT_AS, &capped) == 0);
  bool threw_bad_alloc = false;
  try {
    ak::attention(kFull, q.cview(), k.cview(), v.cview(), o.view, ak::Options{}.with_threads(2));
  } catch (const std::bad_alloc&) {
    threw_bad_alloc = true;
  }
  REQUIRE(setrlimit(RLIMIT_AS, &saved) == 0);
  CHECK(threw_bad_alloc);
  CHECK(o.holds(42.f));
#endif
}
