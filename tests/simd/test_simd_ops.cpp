// The SIMD layer's remaining operations (test_simd.cpp has load/store, arithmetic, exp2, tanh,
// the reductions and the bf16 pairs): log2, cos, softplus, min, abs, the mask comparisons and
// selects, dot, the block transpose (simd/transpose.hpp), the array widenings of bf16 and
// f16, one half's conversion, the int8 and 4-bit widenings of the quantized blocks and
// in_register, each against the scalar standard library. Built on every path (native ISA,
// x86-64-v2, ATTNKIT_NO_SIMD, aarch64 NEON under emulation), so each form an ISA has of these is
// checked where it is compiled. The masks are simd/lane_mask.hpp's; on AArch64 log2 and cos are
// simd/neon_math.hpp's.
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <attnkit/simd/simd.hpp>
#include <attnkit/simd/stream.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace simd = attnkit::simd;
using simd::kWidth;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kEps = std::numeric_limits<float>::epsilon();
// xsimd's log2 and cos polynomials against the f64 library: a few float ulps (log2 relative
// to |log2 x|, cos absolute over the range the TAPA logits use, |x| <= 1e3).
constexpr double kLog2Rel = 4 * kEps;
constexpr double kCosAbs = 1e3 * 4 * kEps;
// softplus (simd/math.hpp): a few ulp plus |x| / 2 ulp from rounding |x| log2 e.
constexpr double kSoftplusUlps = 8;

using Lanes = std::array<float, kWidth>;

Lanes lanes_of(simd::Vec v) {
  Lanes out;
  simd::store(out.data(), v);
  return out;
}

// Runs op over xs, kWidth at a time, and checks each lane with ok(x, got).
template <class Op, class Ok>
void each_lane(const std::vector<float>& xs, Op op, Ok ok) {
  for (std::size_t i = 0; i < xs.size(); i += kWidth) {
    Lanes in;
    for (std::size_t l = 0; l < kWidth; ++l) in[l] = xs[std::min(i + l, xs.size() - 1)];
    const Lanes out = lanes_of(op(simd::load(in.data())));
    for (std::size_t l = 0; l < kWidth; ++l) {
      INFO(simd::kArchName << ": x = " << in[l] << ", got " << out[l]);
      CHECK(ok(double(in[l]), double(out[l])));
    }
  }
}

std::vector<float> spread(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int k = 0; k <= n; ++k) xs.push_back(lo + (hi - lo) * float(k) / float(n));
  return xs;
}

}  // namespace

TEST_CASE("simd ops: log2 matches std::log2, -inf at 0", "[simd][log2]") {
  std::vector<float> xs = spread(1e-6f, 4.f, 3000);
  for (const float x : {1e-30f, 1.f, 2.f, 1e30f, 0.5f}) xs.push_back(x);
  each_lane(
      xs, [](simd::Vec v) { return simd::log2(v); },
      [](double x, double got) {
        const double want = std::log2(x);
        return std::abs(got - want) <= kLog2Rel * std::max(1.0, std::abs(want));
      });
  CHECK(lanes_of(simd::log2(simd::Vec(0.f)))[0] == -kInf);
}

TEST_CASE("simd ops: cos matches std::cos for |x| <= 1000", "[simd][cos]") {
  each_lane(
      spread(-1000.f, 1000.f, 4001), [](simd::Vec v) { return simd::cos(v); },
      [](double x, double got) { return std::abs(got - std::cos(x)) <= kCosAbs; });
}

// Down to x = -87, where e^x is still a normal float: below, exp2's flush to 0 at -127
// (simd/math.hpp) makes the result 0 instead of a subnormal.
TEST_CASE("simd ops: softplus is log(1 + e^x) for every x, edges included", "[simd][softplus]") {
  std::vector<float> xs = spread(-87.f, 90.f, 3540);
  for (const float x : {-kInf, kInf, 0.f, 1e-20f, -1e-20f}) xs.push_back(x);
  each_lane(
      xs, [](simd::Vec v) { return simd::softplus(v); },
      [](double x, double got) {
        const double want = std::log1p(std::exp(x));
        if (std::isinf(x)) return got == want;  // exactly 0 and +inf
        return std::abs(got - want) <= (kSoftplusUlps + std::abs(x) / 2) * kEps * want;
      });
}

TEST_CASE("simd ops: min, max and abs are lane-wise", "[simd][arith]") {
  Lanes a, b;
  for (int l = 0; l < kWidth; ++l) {
    a[l] = float(l) - 1.5f;
    b[l] = l % 2 == 0 ? -kInf : 0.25f * float(l);
  }
  const simd::Vec va = simd::load(a.data()), vb = simd::load(b.data());
  const Lanes mn = lanes_of(simd::min(va, vb)), mx = lanes_of(simd::max(va, vb));
  const Lanes ab = lanes_of(simd::abs(va));
  for (int l = 0; l < kWidth; ++l) {
    INFO("lane " << l);
    CHECK(mn[l] == std::min(a[l], b[l]));
    CHECK(mx[l] == std::max(a[l], b[l]));
    CHECK(ab[l] == std::fabs(a[l]));
  }
}

TEST_CASE("simd ops: comparisons, masks and selects act lane by lane", "[simd][mask]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Lanes a, b;
  for (int l = 0; l < kWidth; ++l) {
    a[l] = l % 3 == 0 ? nan : float(l % 4);
    b[l] = float((l + 1) % 3);
  }
  const simd::Vec va = simd::load(a.data()), vb = simd::load(b.data());
  const simd::Mask eq = simd::equal(va, vb), gt = simd::greater(va, vb);
  const Lanes both = lanes_of(simd::select(simd::both(eq, gt), simd::Vec(1.f), simd::Vec(0.f)));
  const Lanes e = lanes_of(simd::select(eq, simd::Vec(1.f), simd::Vec(0.f)));
  const Lanes g = lanes_of(simd::select(gt, simd::Vec(1.f), simd::Vec(0.f)));
  const Lanes inv = lanes_of(simd::inverse_or_zero(va));
  bool any_gt = false;
  for (int l = 0; l < kWidth; ++l) {
    INFO("lane " << l << ": a " << a[l] << ", b " << b[l]);
    CHECK(e[l] == (a[l] == b[l] ? 1.f : 0.f));  // false where a is NaN
    CHECK(g[l] == (a[l] > b[l] ? 1.f : 0.f));
    CHECK(both[l] == 0.f);  // never equal and greater
    if (std::isnan(a[l]))
      CHECK(std::isnan(inv[l]));
    else
      CHECK(inv[l] == (a[l] == 0.f ? 0.f : 1.f / a[l]));
    any_gt = any_gt || a[l] > b[l];
  }
  CHECK(simd::any(gt) == any_gt);
  CHECK_FALSE(simd::any(simd::greater(simd::Vec(0.f), simd::Vec(1.f))));
}

TEST_CASE("simd ops: dot equals the f64 sum for every length and alignment", "[simd][dot]") {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(300), b(300);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  for (const std::ptrdiff_t n : {0, 1, 3, 4, 15, 16, 17, 33, 64, 128, 129, 299})
    for (const std::ptrdiff_t off : {0, 1}) {
      double want = 0, mag = 0;
      for (std::ptrdiff_t c = 0; c < n; ++c) {
        want += double(a[std::size_t(off + c)]) * double(b[std::size_t(off + c)]);
        mag += std::abs(double(a[std::size_t(off + c)]) * double(b[std::size_t(off + c)]));
      }
      // Any summation order of n products: within (n + 1) eps of the sum of magnitudes.
      INFO(simd::kArchName << ": n " << n << ", offset " << off);
      CHECK(std::abs(simd::dot(a.data() + off, b.data() + off, n) - want) <=
            double(n + 1) * kEps * mag);
    }
}

TEST_CASE("simd ops: widen_bf16 and widen_f16 convert whole arrays exactly, tails included",
          "[simd][memory]") {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (const std::ptrdiff_t n : {1, 7, 8, 9, 16, 17, 40}) {
    std::vector<std::uint16_t> bf(std::size_t(n) + 1), hf(std::size_t(n) + 1);
    const auto count = static_cast<std::size_t>(n);
    std::vector<float> want_bf(count), want_hf(count);
    for (std::ptrdiff_t i = 0; i < n; ++i) {
      const Eigen::bfloat16 x(normal(rng));
      const Eigen::half y(normal(rng));
      std::memcpy(&bf[std::size_t(i + 1)], &x, 2);
      std::memcpy(&hf[std::size_t(i + 1)], &y, 2);
      want_bf[std::size_t(i)] = float(x);
      want_hf[std::size_t(i)] = float(y);
    }
    std::vector<float> got(count, -1.f);
    INFO(simd::kArchName << ": n " << n);
    simd::widen_bf16(bf.data() + 1, got.data(), n);  // unaligned on purpose
    CHECK(got == want_bf);
    if (simd::widen_f16(hf.data() + 1, got.data(), n)) CHECK(got == want_hf);
  }
}

TEST_CASE("simd ops: load_i8 and load_u4 widen every byte exactly, at every offset",
          "[simd][memory]") {
  // Every byte value, twice, so each vector of kWidth bytes starts at every offset.
  std::vector<std::uint8_t> bytes(512 + kWidth);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::uint8_t(i * 37 + 11);
  for (std::size_t at = 0; at + kWidth <= bytes.size(); ++at) {
    const std::uint8_t* p = bytes.data() + at;
    Lanes i8, lo, hi;
    std::array<std::int8_t, kWidth> s8;
    std::memcpy(s8.data(), p, kWidth);
    for (int l = 0; l < kWidth; ++l) {
      i8[l] = float(s8[std::size_t(l)]);
      lo[l] = float((p[l] & 15) - 8);
      hi[l] = float((p[l] >> 4) - 8);
    }
    INFO(simd::kArchName << ": offset " << at);
    CHECK(lanes_of(simd::load_i8(reinterpret_cast<const std::int8_t*>(p))) == i8);
    CHECK(lanes_of(simd::load_u4(p, false)) == lo);
    CHECK(lanes_of(simd::load_u4(p, true)) == hi);
  }
}

TEST_CASE("simd ops: half_to_float equals the bit form for every half", "[simd][memory]") {
  // F16C's instruction where the ISA has it, core/half_bits.hpp's bit form elsewhere: the
  // same f32 bits for each of the 65536 patterns (NaN payloads included).
  std::uint32_t mismatches = 0, first = 0;
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float got = simd::half_to_float(bits);
    const float want = attnkit::detail::half_bits_to_float(bits);
    if (std::memcmp(&got, &want, sizeof got) != 0 && mismatches++ == 0) first = h;
  }
  INFO(simd::kArchName << ": first mismatch at half bits " << first);
  CHECK(mismatches == 0);
}

TEST_CASE("simd ops: in_register returns its argument", "[simd]") {
  Lanes a;
  for (int l = 0; l < kWidth; ++l) a[l] = float(l) * 0.5f - 1.f;
  CHECK(lanes_of(simd::in_register(simd::load(a.data()))) == a);
}

TEST_CASE("simd ops: transpose_block moves element (r, c) to (c, r)", "[simd][transpose]") {
  const std::ptrdiff_t lds = kWidth + 3, ldd = kWidth + 5;  // strides wider than a block
  std::vector<float> src(static_cast<std::size_t>(kWidth * lds)),
      dst(static_cast<std::size_t>(kWidth * ldd), -1.f);
  for (std::size_t x = 0; x < src.size(); ++x) src[x] = static_cast<float>(x);
  simd::transpose_block(src.data(), lds, dst.data(), ldd);
  int wrong = 0;
  for (int r = 0; r < kWidth; ++r)
    for (int c = 0; c < kWidth; ++c)
      wrong +=
          dst[static_cast<std::size_t>(c * ldd + r)] != src[static_cast<std::size_t>(r * lds + c)];
  CHECK(wrong == 0);
  for (int c = 0; c < kWidth; ++c)  // nothing written past a row of the block
    for (std::ptrdiff_t x = kWidth; x < ldd; ++x)
      CHECK(dst[static_cast<std::size_t>(c * ldd + x)] == -1.f);
}

TEST_CASE("stream_copy: every length, to aligned and unaligned rows, bit for bit",
          "[simd][stream]") {
  // 64-byte aligned storage; offsets 0 (streamed where the ISA has it) and 1 (plain copy).
  alignas(64) static float dst[256 + 16];
  std::vector<float> src(256);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = float(i) * 0.5f - 7.f;
  for (const attnkit::Index n : {0, 1, 15, 16, 17, 33, 100, 256})
    for (const int offset : {0, 1}) {
      std::fill(std::begin(dst), std::end(dst), -1.f);
      simd::stream_copy(src.data(), n, dst + offset);
      simd::stream_fence();
      INFO("n " << n << " offset " << offset);
      CHECK(std::memcmp(dst + offset, src.data(), std::size_t(n) * sizeof(float)) == 0);
      CHECK(dst[std::size_t(offset + n)] == -1.f);  // exact: nothing past n written
      if (offset == 1) CHECK(dst[0] == -1.f);
    }
}
