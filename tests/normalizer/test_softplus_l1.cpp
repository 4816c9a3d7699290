// SoftplusL1 (LSSA) building blocks: simd::softplus against log1p(exp(x)) in double over
// [-100, 100] (very negative x gives e^x, not 0; -inf, +inf and NaN as documented); the
// normalizer's absorb() / finalize() on lane blocks against softplus(log d log N_i cos)
// computed here; and visible_key_count() / visible_key_counts(), the N_i of each row,
// against a brute-force count through keep() for every mask kind, with q_offset and with
// fewer and more keys than queries. Built on every SIMD path (softplus is a SIMD routine).
#include <algorithm>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/chunked.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/power_of_two.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/mask/visible_keys.hpp>
#include <attnkit/normalizer/faces.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/simd/simd.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/lane_blocks.hpp"
#include "support/test_names.hpp"

namespace simd = attnkit::simd;
using ak::test::kInf;
using ak::test::kNaN;
using ak::test::kNegInf;

namespace {

using namespace attnkit::test::lanes;  // W, kLd, make_block, at, lanes_of

// softplus in f32 is 2^(-|x| log2 e) and a log2, each a few ulps; the rounding of
// -|x| log2 e itself is a relative error of up to |x| ulp/2 in e^x, so for x near -87 the
// result carries ~45 ulps. 1e-5 (~84 ulps) covers the whole range with room.
constexpr double kSoftplusRel = 1e-5;
// Below x = log(FLT_MIN) ~ -87.3, e^x is subnormal in f32 (or flushed to 0 by exp2 below
// -127 in the exponent): the absolute error is then bounded by FLT_MIN, not relatively.
constexpr double kSubnormalAbs = FLT_MIN;
// Weights of the normalizer: softplus of a scaled cosine in f32 (scale and product rounded).
constexpr double kWeightRel = 2e-5;

double softplus_f64(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

// simd::softplus of every x, kWidth at a time.
std::vector<float> softplus_all(const std::vector<float>& xs) {
  std::vector<float> padded(xs), out(xs.size() + W);
  padded.resize(xs.size() + W, 0.f);
  for (std::size_t i = 0; i < xs.size(); i += W)
    simd::store(out.data() + i, simd::softplus(simd::load(padded.data() + i)));
  out.resize(xs.size());
  return out;
}

}  // namespace

TEST_CASE("softplus: matches log1p(exp(x)) in double over [-100, 100]", "[softplus][simd]") {
  std::vector<float> xs;
  for (int i = -10000; i <= 10000; ++i) xs.push_back(float(i) * 0.01f);
  for (const float x : {-30.f, -50.f, -87.f, -88.5f, -1e-7f, 1e-7f, 15.f, 16.f, 17.f, 88.f})
    xs.push_back(x);
  const std::vector<float> got = softplus_all(xs);
  int bad = 0;
  std::ostringstream where;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double want = softplus_f64(double(xs[i]));
    const double err = std::abs(double(got[i]) - want);
    const bool ok = want >= double(FLT_MIN) ? err <= kSoftplusRel * want : err <= kSubnormalAbs;
    if (!ok && bad++ < 8)
      where << "x = " << xs[i] << ": got " << got[i] << ", want " << want << "\n";
  }
  INFO("on " << simd::kArchName << ":\n" << where.str());
  CHECK(bad == 0);
}

TEST_CASE("softplus: very negative x gives e^x, not 0", "[softplus][simd]") {
  const std::vector<float> xs{-20.f, -30.f, -60.f, -80.f};
  const std::vector<float> got = softplus_all(xs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    INFO("x = " << xs[i] << ", got " << got[i]);
    CHECK(got[i] > 0.f);
    CHECK(std::abs(double(got[i]) - std::exp(double(xs[i]))) <=
          kSoftplusRel * std::exp(double(xs[i])));
  }
}

TEST_CASE("softplus: -inf gives exactly 0, +inf gives +inf, NaN stays NaN", "[softplus][simd]") {
  const std::vector<float> got = softplus_all({kNegInf, kInf, kNaN, 0.f});
  CHECK(got[0] == 0.f);
  CHECK(got[1] == kInf);
  CHECK(std::isnan(got[2]));
  CHECK(std::abs(double(got[3]) - std::log(2.0)) <= kSoftplusRel * std::log(2.0));
}

TEST_CASE("SoftplusL1: logit scale log(d) log(N), at least FLT_MIN", "[softplus_l1]") {
  CHECK(ak::SoftplusL1::logit_scale(64, 1) == double(FLT_MIN));   // log 1 = 0: guarded
  CHECK(ak::SoftplusL1::logit_scale(64, 0) == double(FLT_MIN));   // no key
  CHECK(ak::SoftplusL1::logit_scale(1, 100) == double(FLT_MIN));  // d = 1
  CHECK(std::abs(ak::SoftplusL1::logit_scale(64, 10) - std::log(64.0) * std::log(10.0)) <= 1e-12);
}

TEST_CASE("SoftplusL1: absorb gives softplus(log d log N_i cos), finalize 1 / sum",
          "[softplus_l1][absorb]") {
  // Per-lane key counts through RowContext::visible_keys; lane 0 sees no key (all -inf).
  std::vector<float> counts(W);
  for (int q = 0; q < W; ++q) counts[static_cast<std::size_t>(q)] = float(q == 0 ? 0 : 3 + 17 * q);
  const Index d = 48, keys = 37;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> cosine(-1.f, 1.f);
  const auto block = make_block(keys, [&](int q, Index) { return q == 0 ? kNegInf : cosine(rng); });
  ak::RowContext ctx;
  ctx.kv_len = 1000;
  ctx.head_dim = d;
  ctx.rows = W;
  ctx.visible_keys = counts.data();
  const ak::SoftplusL1 lssa;
  auto st = lssa.begin(ctx);
  std::vector<float> tile(block);
  const auto factor = lanes_of(lssa.absorb(st, tile.data(), keys, kLd));
  const auto sums = lanes_of(lssa.row_sum(st));
  const auto inv = lanes_of(lssa.finalize(st));
  for (int q = 0; q < W; ++q) {
    INFO("lane " << q << ", N " << counts[static_cast<std::size_t>(q)]);
    CHECK(factor[static_cast<std::size_t>(q)] == 1.f);
    const double n = counts[static_cast<std::size_t>(q)];
    const double c = std::max(std::log(double(d)) * std::log(std::max(n, 1.0)), double(FLT_MIN));
    double sum = 0;
    for (Index j = 0; j < keys; ++j) {
      const float s = at(block, j, q);
      const double want = s == kNegInf ? 0.0 : softplus_f64(c * double(s));
      sum += want;
      if (want == 0.0)
        CHECK(at(tile, j, q) == 0.f);
      else
        CHECK(std::abs(double(at(tile, j, q)) - want) <= kWeightRel * want);
    }
    if (sum == 0.0) {
      CHECK(sums[static_cast<std::size_t>(q)] == 0.f);
      CHECK(inv[static_cast<std::size_t>(q)] == 0.f);
    } else {
      CHECK(std::abs(double(sums[static_cast<std::size_t>(q)]) - sum) <= kWeightRel * sum);
      CHECK(std::abs(double(inv[static_cast<std::size_t>(q)]) * sum - 1.0) <= kWeightRel);
    }
  }
}

namespace {

// The brute-force N_i: keys j in [0, kv_len) with keep(b, h, r + q_offset, j).
template <class Mask>
Index brute_count(const Mask& mask, Index b, Index h, Index i, Index kv_len) {
  Index n = 0;
  for (Index j = 0; j < kv_len; ++j) n += mask.keep(b, h, i, j) ? 1 : 0;
  return n;
}

constexpr Index kBatch = 2, kHeads = 2, kQLen = 37;

template <class Mask>
void check_counts(const std::string& what, const Mask& mask, Index kv_len, Index q_offset) {
  INFO(what << ", Lk " << kv_len << ", Lq " << kQLen << ", q_offset " << q_offset);
  const std::vector<float> counts =
      ak::visible_key_counts(mask, kBatch, kHeads, kQLen, kv_len, q_offset);
  REQUIRE(counts.size() == static_cast<std::size_t>(kBatch * kHeads * kQLen));
  int bad = 0;
  std::ostringstream where;
  for (Index b = 0; b < kBatch; ++b)
    for (Index h = 0; h < kHeads; ++h)
      for (Index r = 0; r < kQLen; ++r) {
        const Index want = brute_count(mask, b, h, r + q_offset, kv_len);
        const Index one = ak::visible_key_count(mask, b, h, r + q_offset, kv_len);
        const float all = counts[static_cast<std::size_t>((b * kHeads + h) * kQLen + r)];
        if ((one != want || all != float(want)) && bad++ < 5)
          where << "b " << b << " h " << h << " row " << r << ": want " << want << ", count " << one
                << ", counts " << all << "\n";
      }
  INFO(where.str());
  CHECK(bad == 0);
}

// A data mask whose partial blocks keep pairs by a rule that depends on batch and head.
struct Scattered {
  bool keep(Index b, Index h, Index i, Index j) const {
    return (i * 7 + j * 3 + b + 2 * h) % 5 < 2;
  }
};

// A hand-built BlockMask: per (b, h, query block) some key blocks full, some partial.
ak::BlockMask<Scattered> scattered_block_mask(Index kv_len, Index q_offset) {
  ak::BlockMaskLayout l;
  l.batch = kBatch;
  l.heads = kHeads;
  l.q_len = kQLen;
  l.kv_len = kv_len;
  l.block_q = 16;
  l.block_k = 32;
  l.q_offset = q_offset;
  ak::BlockList partial{{0}, {}}, full{{0}, {}};
  for (Index r = 0; r < l.rows(); ++r) {
    for (Index kb = 0; kb < l.kv_blocks(); ++kb) {
      const Index pick = (r + kb) % 3;  // 0: full, 1: partial, 2: skipped
      if (pick == 0) full.blocks.push_back(kb);
      if (pick == 1) partial.blocks.push_back(kb);
    }
    full.offsets.push_back(static_cast<Index>(full.blocks.size()));
    partial.offsets.push_back(static_cast<Index>(partial.blocks.size()));
  }
  return ak::BlockMask<Scattered>(l, std::move(partial), std::move(full));
}

}  // namespace

TEST_CASE("visible_key_count(s): N_i equals a brute-force count through keep()",
          "[softplus_l1][visible_keys][mask]") {
  const Index kv_len = GENERATE(Index{20}, Index{37}, Index{300}, Index{600});
  // Bottom-right, top-left, queries before every key, queries far past the keys.
  const Index q_offset = GENERATE_COPY(kv_len - kQLen, Index{0}, Index{-10}, Index{250});
  using ak::Causal;
  using ak::Chunked;
  using ak::PowerOfTwo;
  using ak::Sinks;
  using ak::SlidingWindow;
  check_counts("Causal", Causal{}, kv_len, q_offset);
  check_counts("SlidingWindow{5, 3}", SlidingWindow{5, 3}, kv_len, q_offset);
  check_counts("Causal & SlidingWindow{16, 0}", Causal{} & SlidingWindow{16, 0}, kv_len, q_offset);
  check_counts("Sinks{4} | SlidingWindow{8, 0}", Sinks{4} | SlidingWindow{8, 0}, kv_len, q_offset);
  check_counts("Causal & (Sinks{4} | SlidingWindow{8, 0})",
               Causal{} & (Sinks{4} | SlidingWindow{8, 0}), kv_len, q_offset);
  check_counts("Chunked{13}", Chunked{13}, kv_len, q_offset);
  check_counts("Causal & Chunked{64}", Causal{} & Chunked{64}, kv_len, q_offset);
  check_counts("PowerOfTwo{2, 3}", PowerOfTwo{2, 3}, kv_len, q_offset);
  check_counts("PowerOfTwo{0, 0}", PowerOfTwo{0, 0}, kv_len, q_offset);

  ak::BlockMaskLayout layout;
  layout.batch = kBatch;
  layout.heads = 1;
  layout.q_len = kQLen;
  layout.kv_len = kv_len;
  layout.block_q = 16;
  layout.block_k = 64;
  layout.q_offset = q_offset;
  check_counts("make_block_mask(Causal & SlidingWindow{40, 0})",
               ak::make_block_mask(Causal{} & SlidingWindow{40, 0}, layout), kv_len, q_offset);
  check_counts("make_block_mask(PowerOfTwo{1, 2})", ak::make_block_mask(PowerOfTwo{1, 2}, layout),
               kv_len, q_offset);
  check_counts("BlockMask, per (b, h) pattern with a rule", scattered_block_mask(kv_len, q_offset),
               kv_len, q_offset);
}

TEST_CASE("visible_key_counts: no rows gives an empty vector; no keys gives zeros",
          "[softplus_l1][visible_keys]") {
  CHECK(ak::visible_key_counts(ak::Causal{}, 1, 2, 0, 10).empty());
  const auto zeros = ak::visible_key_counts(ak::Causal{}, 1, 2, 5, 0, 3);
  CHECK(zeros.size() == 10);
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](float x) { return x == 0.f; }));
}

TEST_CASE("SoftplusL1: key counts that are NaN, infinite or negative throw naming the count",
          "[softplus_l1][errors]") {
  const auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const ak::Error& e) {
      return e.what();
    }
    return "no error";
  };
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.f}) {
    INFO("count " << bad);
    CHECK(message_of([&] {
            ak::SoftplusL1::with_key_counts({4.f, bad});
          }).find("SoftplusL1.key_counts[1]") != std::string::npos);
    ak::SoftplusL1 set_later;  // the members are public: validate() checks them too
    set_later.key_counts = {4.f, bad};
    CHECK(message_of([&] { set_later.validate(2, 8, 0, 1, 1); }).find("SoftplusL1.key_counts[1]") !=
          std::string::npos);
  }
  CHECK_NOTHROW(ak::SoftplusL1::with_key_counts({0.f, 3.f}).validate(2, 8, 0, 1, 1));
}
