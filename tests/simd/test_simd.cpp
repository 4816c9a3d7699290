// The SIMD layer: every operation the kernels use, lane by lane, against the scalar
// standard library. Built for every path (native ISA, x86-64-v2, ATTNKIT_NO_SIMD with one
// lane, aarch64 NEON), so each assertion below runs on every path.
// On AArch64 exp2 and tanh are simd/neon_math.hpp's intrinsic polynomials.
#include <algorithm>
#include <array>
#include <attnkit/simd/simd.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "support/matchers.hpp"

namespace simd = attnkit::simd;
using simd::kWidth;

namespace {

// Tolerances of the transcendental functions against the f64 standard library: two float
// ulps (xsimd's polynomials measure about one).
constexpr double kExp2Rel = 2 * std::numeric_limits<float>::epsilon();
constexpr double kTanhRel = 2 * std::numeric_limits<float>::epsilon();
// a * b + c may round once (an FMA instruction) or twice (x86-64-v2 has none): two ulps of
// a sum of positive terms. Where the single rounding is promised, a case below checks it.
constexpr double kFmaRel = 2 * std::numeric_limits<float>::epsilon();

constexpr float kInf = std::numeric_limits<float>::infinity();

using Lanes = std::array<float, kWidth>;

Lanes lanes_of(simd::Vec v) {
  Lanes out;
  simd::store(out.data(), v);
  return out;
}

simd::Vec vec_of(const Lanes& l) { return simd::load(l.data()); }

// Applies `op` to xs kWidth values at a time (the tail padded with the last value) and
// returns one result per x.
template <class Op>
std::vector<float> map_lanes(const std::vector<float>& xs, Op op) {
  std::vector<float> out(xs.size());
  for (std::size_t i = 0; i < xs.size(); i += kWidth) {
    Lanes in;
    for (std::size_t l = 0; l < kWidth; ++l) in[l] = xs[std::min(i + l, xs.size() - 1)];
    const Lanes res = lanes_of(op(vec_of(in)));
    for (std::size_t l = 0; l < kWidth && i + l < xs.size(); ++l) out[i + l] = res[l];
  }
  return out;
}

// The points where `got` is not within `rel` of the f64 function `ref`, described for the
// failure message ("" when all agree).
template <class Ref>
std::string mismatches(const char* fn, const std::vector<float>& xs, const std::vector<float>& got,
                       Ref ref, double rel) {
  std::ostringstream out;
  out.precision(9);
  int count = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double expected = ref(double(xs[i]));
    if (std::abs(got[i] - expected) <= rel * std::abs(expected)) continue;  // NaN fails
    if (++count <= 5)
      out << fn << "(" << xs[i] << ") = " << got[i] << ", expected " << expected << "\n";
  }
  if (count > 5) out << "... " << count << " points in all\n";
  return out.str();
}

// CHECKs op (the SIMD form of fn) against ref (its double form) at every x of xs, within rel
// |ref(x)|; the INFO names the first points outside.
template <class Op, class Ref>
void check_within_rel(const char* fn, const std::vector<float>& xs, Op op, Ref ref, double rel) {
  const std::string bad = mismatches(fn, xs, map_lanes(xs, op), ref, rel);
  INFO("on " << simd::kArchName << ", outside " << rel << " relative:\n" << bad);
  CHECK(bad.empty());
}

}  // namespace

TEST_CASE("simd: the scalar fallback has one lane, vector paths a power of two", "[simd]") {
  INFO("path " << simd::kArchName << ", " << kWidth << " lanes");
#ifdef ATTNKIT_NO_SIMD
  STATIC_REQUIRE(kWidth == 1);
  CHECK(std::string_view(simd::kArchName) == "scalar");
#else
  STATIC_REQUIRE(kWidth >= 4);
  STATIC_REQUIRE((kWidth & (kWidth - 1)) == 0);
  CHECK(std::string_view(simd::kArchName) != "scalar");
#endif
  STATIC_REQUIRE(simd::kRegisters == 16 || simd::kRegisters == 32);
}

TEST_CASE("simd: load and store round-trip every lane bit for bit, unaligned", "[simd][memory]") {
  // Specials included: a copy must not canonicalize NaN, flush denormals or lose -0.
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -0.f,  kInf, -kInf, 1e-40f,
                            std::numeric_limits<float>::max(),       -1.5f, 3.25f};
  std::vector<float> src(kWidth + 1), dst(kWidth + 2, 7.f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = i < 8 ? specials[i] : 0.75f * float(i);
  simd::store(dst.data() + 1, simd::load(src.data() + 1));  // both one float off alignment
  CHECK(std::memcmp(dst.data() + 1, src.data() + 1, kWidth * sizeof(float)) == 0);
  // Exact: the neighbours of the stored vector are untouched.
  CHECK(dst.front() == 7.f);
  CHECK(dst.back() == 7.f);
}

TEST_CASE("simd: broadcast and + - * act lane by lane", "[simd][arith]") {
  Lanes a, b;
  for (int l = 0; l < kWidth; ++l) {
    a[l] = float(l) + 0.5f;
    b[l] = 2.f * float(l) - 3.f;
  }
  const Lanes sum = lanes_of(vec_of(a) + vec_of(b));
  const Lanes diff = lanes_of(vec_of(a) - vec_of(b));
  const Lanes prod = lanes_of(vec_of(a) * vec_of(b));
  const Lanes bcast = lanes_of(simd::Vec(2.5f));
  for (int l = 0; l < kWidth; ++l) {  // exact: small halves and integers
    INFO("lane " << l);
    CHECK(sum[l] == a[l] + b[l]);
    CHECK(diff[l] == a[l] - b[l]);
    CHECK(prod[l] == a[l] * b[l]);
    CHECK(bcast[l] == 2.5f);
  }
}

TEST_CASE("simd: fma computes a * b + c per lane", "[simd][arith]") {
  SECTION("exact on small integers") {
    Lanes a, b, c;
    for (int l = 0; l < kWidth; ++l) {
      a[l] = float(l + 1);
      b[l] = float(3 - l);
      c[l] = float(2 * l);
    }
    const Lanes r = lanes_of(simd::fma(vec_of(a), vec_of(b), vec_of(c)));
    for (int l = 0; l < kWidth; ++l) CHECK(r[l] == a[l] * b[l] + c[l]);
  }
  SECTION("within two ulps on random positive values") {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(0.5f, 2.f);
    for (int rep = 0; rep < 64; ++rep) {
      Lanes a, b, c;
      for (int l = 0; l < kWidth; ++l) {
        a[l] = dist(rng);
        b[l] = dist(rng);
        c[l] = dist(rng);
      }
      const Lanes r = lanes_of(simd::fma(vec_of(a), vec_of(b), vec_of(c)));
      for (int l = 0; l < kWidth; ++l)
        CHECK_THAT(r[l], WithinRel(double(a[l]) * b[l] + c[l], kFmaRel));
    }
  }
}

TEST_CASE("simd: fma rounds once wherever the target has an FMA instruction", "[simd][arith]") {
  // (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24 exactly. Rounded once that is the answer; rounded
  // twice, the product's 2^-24 is a tie that goes to even and the result is 0. Softmax
  // folds log2(e) into this one FMA and needs the single rounding for large logits.
  volatile float va = 1.f + 0x1p-12f, vc = -(1.f + 0x1p-11f);  // opaque: no constant folding
  Lanes a, c;
  a.fill(static_cast<float>(va));
  c.fill(static_cast<float>(vc));
  const Lanes r = lanes_of(simd::fma(vec_of(a), vec_of(a), vec_of(c)));
  for (int l = 0; l < kWidth; ++l) {
    INFO("lane " << l << " on " << simd::kArchName);
#if defined(ATTNKIT_NO_SIMD) || defined(__FMA__)
    CHECK(r[l] == 0x1p-24f);  // exact: the property is the single rounding
#else
    CHECK((r[l] == 0x1p-24f || r[l] == 0.f));  // no FMA instruction (x86-64-v2): either
#endif
  }
}

TEST_CASE("simd: max is lane-wise and handles infinities", "[simd][arith]") {
  Lanes a, b;
  for (int l = 0; l < kWidth; ++l) {
    a[l] = l % 3 == 0 ? -kInf : float(l);
    b[l] = l % 4 == 1 ? kInf : float(kWidth - l);
  }
  const Lanes r = lanes_of(simd::max(vec_of(a), vec_of(b)));
  for (int l = 0; l < kWidth; ++l) {
    INFO("lane " << l);
    CHECK(r[l] == std::max(a[l], b[l]));  // exact: max selects, it does not round
  }
  CHECK(lanes_of(simd::max(simd::Vec(-kInf), simd::Vec(-kInf)))[0] == -kInf);
}

TEST_CASE("simd: reduce_add sums all lanes", "[simd][reduce]") {
  Lanes ints;
  for (int l = 0; l < kWidth; ++l) ints[l] = float(l + 1);
  CHECK(simd::reduce_add(vec_of(ints)) == float(kWidth * (kWidth + 1) / 2));  // exact

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Lanes x;
  double sum = 0.0, magnitude = 0.0;
  for (int l = 0; l < kWidth; ++l) {
    x[l] = dist(rng);
    sum += x[l];
    magnitude += std::abs(x[l]);
  }
  // Any summation order: at most kWidth roundings of partial sums bounded by `magnitude`.
  CHECK_THAT(simd::reduce_add(vec_of(x)),
             WithinAbs(sum, kWidth * std::numeric_limits<float>::epsilon() * magnitude));
}

TEST_CASE("simd: reduce_max finds the maximum in any lane, -inf lanes included", "[simd][reduce]") {
  for (int at = 0; at < kWidth; ++at) {
    INFO("maximum in lane " << at);
    Lanes x;
    for (int l = 0; l < kWidth; ++l) x[l] = l % 2 == 0 ? -kInf : -float(l);
    x[at] = 0.5f;
    CHECK(simd::reduce_max(vec_of(x)) == 0.5f);  // exact: selection
  }
  CHECK(simd::reduce_max(simd::Vec(-kInf)) == -kInf);  // a fully masked block
  Lanes neg;
  for (int l = 0; l < kWidth; ++l) neg[l] = l == kWidth - 1 ? -3.f : -kInf;
  CHECK(simd::reduce_max(vec_of(neg)) == -3.f);
}

TEST_CASE("simd: zero_if_neg_inf zeroes only -inf lanes", "[simd][arith]") {
  const float values[] = {-kInf, kInf, -1.5f, 0.f, 2.f, std::numeric_limits<float>::lowest()};
  Lanes x;
  for (int l = 0; l < kWidth; ++l) x[l] = values[(l + kWidth) % 6];
  for (int shift = 0; shift < 6; ++shift) {  // every value in lane 0 at least once
    x[0] = values[shift];
    const Lanes r = lanes_of(simd::zero_if_neg_inf(vec_of(x)));
    for (int l = 0; l < kWidth; ++l) {
      INFO("lane " << l << " input " << x[l]);
      CHECK(r[l] == (x[l] == -kInf ? 0.f : x[l]));  // exact: a select
    }
  }
}

TEST_CASE("simd: exp2 matches std::exp2 within kExp2Rel for -126 <= x < 127", "[simd][exp2]") {
  // Every 1/64 over the documented domain (x < 127; xsimd overflows to inf at 127).
  std::vector<float> xs;
  for (int k = -126 * 64; k < 127 * 64; ++k) xs.push_back(float(k) / 64.f);
  check_within_rel(
      "exp2", xs, [](simd::Vec v) { return simd::exp2(v); }, [](double x) { return std::exp2(x); },
      kExp2Rel);
}

TEST_CASE("simd: exp2 of -inf is exactly 0 and of 0 exactly 1", "[simd][exp2]") {
  // The softmax relies on both: masked logits weigh exactly 0, the row maximum exactly 1.
  Lanes x;
  for (int l = 0; l < kWidth; ++l) x[l] = l % 2 == 0 ? -kInf : 0.f;
  const Lanes r = lanes_of(simd::exp2(vec_of(x)));
  for (int l = 0; l < kWidth; ++l) {
    INFO("lane " << l);
    CHECK(r[l] == (l % 2 == 0 ? 0.f : 1.f));
  }
  CHECK(lanes_of(simd::exp2(simd::Vec(-kInf)))[kWidth - 1] == 0.f);
}

TEST_CASE("simd: tanh matches std::tanh within kTanhRel and saturates to +-1", "[simd][tanh]") {
  std::vector<float> xs;
  for (int k = -20 * 256; k <= 20 * 256; ++k) xs.push_back(float(k) / 256.f);
  for (const float x : {1e-30f, -1e-30f, 50.f, -50.f, 1e30f, -1e30f, kInf, -kInf}) xs.push_back(x);
  check_within_rel(
      "tanh", xs, [](simd::Vec v) { return simd::tanh(v); }, [](double x) { return std::tanh(x); },
      kTanhRel);
}

TEST_CASE("simd: round_up rounds to a whole number of vectors", "[simd]") {
  STATIC_REQUIRE(simd::round_up(0) == 0);
  STATIC_REQUIRE(simd::round_up(1) == kWidth);
  STATIC_REQUIRE(simd::round_up(kWidth) == kWidth);
  STATIC_REQUIRE(simd::round_up(kWidth + 1) == 2 * kWidth);
  STATIC_REQUIRE(simd::round_up(2 * kWidth + 1) == 3 * kWidth);
  for (std::ptrdiff_t n = 0; n < 100; ++n) {
    const std::ptrdiff_t r = simd::round_up(n);
    CHECK(r % kWidth == 0);
    CHECK(r >= n);
    CHECK(r - n < kWidth);
  }
}

TEST_CASE("simd: is_nan, in_range, either and select act lane by lane", "[simd][mask]") {
  // Regression: is_nan was `a != a`, which xsimd 8.1's AVX and AVX-512 paths compare with an
  // ordered predicate (false for NaN), so ReluPower turned NaN logits into weight 0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs{nan, 1.f, -inf, inf, 0.f, -2.5f, nan, 3.f};
  const auto picked = map_lanes(xs, [](simd::Vec x) {
    return simd::select(simd::is_nan(x), simd::Vec(1.f), simd::Vec(0.f));
  });
  for (std::size_t i = 0; i < xs.size(); ++i) CHECK(picked[i] == (std::isnan(xs[i]) ? 1.f : 0.f));
  // in_range is lo <= x < hi; either is a lane-wise or.
  const auto ranged = map_lanes(xs, [](simd::Vec x) {
    const simd::Mask in = simd::either(simd::in_range(x, simd::Vec(0.f), simd::Vec(3.f)),
                                       simd::in_range(x, simd::Vec(-3.f), simd::Vec(-2.f)));
    return simd::select(in, simd::Vec(1.f), simd::Vec(0.f));
  });
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    CHECK(ranged[i] == (((0.f <= x && x < 3.f) || (-3.f <= x && x < -2.f)) ? 1.f : 0.f));
  }
}

TEST_CASE("simd: transpose_add puts the sum of row t in lane t", "[simd][reduce]") {
  // Integers small enough to add exactly in any order: a lane out of place cannot hide
  // (row t sums to 100 t kWidth + kWidth (kWidth - 1) / 2, distinct for every t).
  std::array<simd::Vec, kWidth> rows;
  for (int t = 0; t < kWidth; ++t) {
    Lanes x;
    for (int l = 0; l < kWidth; ++l) x[l] = float(100 * t + l);
    rows[t] = vec_of(x);
  }
  const Lanes sums = lanes_of(simd::transpose_add(rows.data()));
  for (int t = 0; t < kWidth; ++t) {
    INFO("lane " << t);
    CHECK(sums[t] == float(100 * t * kWidth + kWidth * (kWidth - 1) / 2));
  }
}

TEST_CASE("simd: load_bf16 and load_f16 widen every lane exactly", "[simd][memory]") {
  // bf16 is the high half of an f32; f16 bit patterns of 1 + t/1024 (exact in both).
  std::array<std::uint16_t, kWidth + 1> bf16{}, f16{};
  for (int l = 0; l < kWidth; ++l) {
    const float x = float(l) - 2.5f;
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bf16[l + 1] = static_cast<std::uint16_t>(bits >> 16);
    f16[l + 1] = static_cast<std::uint16_t>(0x3C00 + l);  // 1 + l / 1024
  }
  const Lanes b = lanes_of(simd::load_bf16(bf16.data() + 1));  // unaligned on purpose
  for (int l = 0; l < kWidth; ++l) CHECK(b[l] == float(l) - 2.5f);
  if constexpr (simd::kWidensF16) {
    const Lanes h = lanes_of(simd::load_f16(f16.data() + 1));
    for (int l = 0; l < kWidth; ++l) CHECK(h[l] == 1.f + float(l) / 1024.f);
  }
}

TEST_CASE("simd: load_bf16_pair widens 2 kWidth values in the order of pair_element",
          "[simd][memory]") {
  // Element e holds e - 7.5 (exact in bf16 for e < 64); unaligned on purpose.
  std::array<std::uint16_t, 2 * kWidth + 1> bits{};
  std::array<float, 2 * kWidth> memory{};
  for (int e = 0; e < 2 * kWidth; ++e) {
    memory[e] = float(e) - 7.5f;
    std::uint32_t b;
    std::memcpy(&b, &memory[e], sizeof b);
    bits[e + 1] = static_cast<std::uint16_t>(b >> 16);
  }
  simd::Vec even, odd;
  simd::load_bf16_pair(bits.data() + 1, even, odd);
  std::array<float, 2 * kWidth> split{};
  simd::split_pairs(memory.data(), split.data());
  const Lanes a = lanes_of(even), b = lanes_of(odd);
  for (int l = 0; l < kWidth; ++l) {
    INFO("lane " << l);
    CHECK(a[l] == split[l]);
    CHECK(b[l] == split[kWidth + l]);
  }
  for (int e = 0; e < 2 * kWidth; ++e) CHECK(split[e] == memory[simd::pair_element(e)]);
  // Where the ISA splits, even lanes hold the even elements (the order the kernels assume).
  if constexpr (simd::kSplitsBf16Pairs) CHECK(b[0] == memory[1]);
  // join_pairs() undoes split_pairs(), times a factor (a power of two here: exact).
  std::array<float, 2 * kWidth + 1> joined{};
  simd::join_pairs(split.data(), 0.25f, joined.data() + 1);
  for (int e = 0; e < 2 * kWidth; ++e) {
    INFO("element " << e);
    CHECK(joined[e + 1] == memory[e] * 0.25f);
  }
}
