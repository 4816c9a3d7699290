// Block-quantized K/V (storage/blocks.hpp, storage/quantize.hpp, core/half_bits.hpp): the half
// conversions of the block scales against Eigen::half (every half, every midpoint between
// two halves and its neighbours, the overflow edge, random floats); quantize_row() byte for
// byte against a transcription of llama.cpp's quantize_row_q8_0_ref / quantize_row_q4_0_ref
// over many kinds of rows; the round-trip error bounds; the errors (each thrown before
// anything is written); KvCache storing exactly the blocks quantize_row() makes (from f32,
// bf16 and block rows, in one append or two); softmax decode over PagedKv<BlockQ8_0> pages
// equal to decode() over a KvCache (bitwise with pages of whole kDecodeBlock key blocks, as
// cache/paged_decode.hpp promises; within f32 tolerance with 7-key pages). attention() and
// decode() on quantized K/V against the reference: tests/kernel/test_attention_quantized.cpp.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/cache/kv_cache.hpp>
#include <attnkit/cache/paged_kv.hpp>
#include <attnkit/core/half_bits.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/kernel/varlen.hpp>  // detail::seq_rows
#include <attnkit/mask/causal.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/spec.hpp>
#include <attnkit/storage/quantize.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/error_checks.hpp"
#include "support/test_names.hpp"

using ak::BlockQ4_0;
using ak::BlockQ8_0;
using ak::test::check_error;

using ak::detail::seq_rows;  // rows [begin, begin + n) of a view along seq

namespace {

std::uint16_t eigen_bits(float f) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(f)); }
float eigen_float(std::uint16_t h) {
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(h));
}
bool is_nan_half(std::uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }

// CHECKs float_to_half_bits(f) == the bits of Eigen::half(f) (RNE) for every input (a NaN: a
// NaN half), reporting the first few that differ.
void check_to_half(const std::vector<float>& inputs, const char* what) {
  int wrong = 0;
  std::ostringstream first;
  for (const float f : inputs) {
    const std::uint16_t got = ak::detail::float_to_half_bits(f), want = eigen_bits(f);
    if (std::isnan(f) ? is_nan_half(got) : got == want) continue;
    if (wrong++ < 4)
      first << std::hexfloat << f << " -> 0x" << std::hex << got << " (Eigen 0x" << want << ")"
            << std::dec << "; ";
  }
  INFO(what << ", " << inputs.size() << " inputs: " << first.str());
  CHECK(wrong == 0);
}

// llama.cpp's ggml-quants.c, transcribed: quantize_row_q8_0_ref and quantize_row_q4_0_ref
// (QK8_0 = QK4_0 = 32; MAX, MIN as ggml-impl.h's; GGML_FP32_TO_FP16 rounds to nearest even:
// Eigen::half). x0 goes through a volatile float: the C source rounds x*id before adding 8.5,
// and a contracted FMA would not (the header has an asm barrier for the same reason).
#define GGML_MAX(a, b) ((a) > (b) ? (a) : (b))
#define GGML_MIN(a, b) ((a) < (b) ? (a) : (b))
void quantize_row_ref(const float* x, BlockQ8_0* y, int k) {  // quantize_row_q8_0_ref
  const int nb = k / 32;
  for (int i = 0; i < nb; i++) {
    float amax = 0.0f;  // absolute max
    for (int j = 0; j < 32; j++) {
      const float v = x[i * 32 + j];
      amax = GGML_MAX(amax, fabsf(v));
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = eigen_bits(d);
    for (int j = 0; j < 32; ++j) {
      const float x0 = x[i * 32 + j] * id;
      y[i].qs[j] = static_cast<std::int8_t>(roundf(x0));
    }
  }
}
void quantize_row_ref(const float* x, BlockQ4_0* y, int k) {  // quantize_row_q4_0_ref
  const int qk = 32, nb = k / qk;
  for (int i = 0; i < nb; i++) {
    float amax = 0.0f;  // absolute max
    float max = 0.0f;
    for (int j = 0; j < qk; j++) {
      const float v = x[i * qk + j];
      if (amax < fabsf(v)) {
        amax = fabsf(v);
        max = v;
      }
    }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = eigen_bits(d);
    for (int j = 0; j < qk / 2; ++j) {
      const volatile float x0 = x[i * qk + 0 + j] * id;
      const volatile float x1 = x[i * qk + qk / 2 + j] * id;
      const std::uint8_t xi0 = GGML_MIN(15, static_cast<std::int8_t>(x0 + 8.5f));
      const std::uint8_t xi1 = GGML_MIN(15, static_cast<std::int8_t>(x1 + 8.5f));
      y[i].qs[j] = xi0;
      y[i].qs[j] |= static_cast<std::uint8_t>(xi1 << 4);
    }
  }
}
#undef GGML_MAX
#undef GGML_MIN

// The kinds of rows the quantizers see, and row `seed` of length n of each.
enum Kind { kNormal, kUniform, kOutlier, kZeros, kEqual, kTiny, kExtreme, kTies, kNearTies };
constexpr int kKinds = kNearTies + 1;
const char* const kKindNames[] = {"normal",          "uniform",   "one outlier",
                                  "zeros",           "one value", "tiny (1e-30)",
                                  "large negatives", "ties",      "near ties"};
std::vector<float> make_row(int kind, Index n, std::uint32_t seed) {
  const auto size = static_cast<std::size_t>(n);
  std::vector<float> x = ak::test::normal_values(seed, 1.f, size);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> at(0, size - 1);
  std::uniform_real_distribution<float> uniform(-3.f, 3.f);
  const float sign = seed % 2 ? -1.f : 1.f;
  const float scale = std::ldexp(1.f, static_cast<int>(seed % 16));  // up to 2^15
  if (kind == kUniform)
    for (float& v : x) v = uniform(rng);
  if (kind == kOutlier) x[at(rng)] = sign * 60.f;
  if (kind == kZeros || kind == kEqual)
    std::fill(x.begin(), x.end(), kind == kZeros ? 0.f : sign * 0.7f * float(seed % 5 + 1));
  if (kind == kTiny)
    for (float& v : x) v *= 1e-30f;
  if (kind == kExtreme) {  // the largest magnitude negative, up to the largest q4_0 encodes
    for (float& v : x) v *= scale;
    x[at(rng)] = seed % 3 ? -524159.f : -8 * scale;
  }
  if (kind == kTies) {  // d = 1 (127 / 127 or 8 / 8): x * id lands on k + 0.5
    for (std::size_t j = 0; j < size; ++j) x[j] = float(int(j % 16) - 8) + 0.5f;
    for (std::size_t j = 0; j < size; j += 32) {
      x[j] = sign * (seed % 4 < 2 ? 8.f : 127.f);
      x[j + 5] = -x[j];  // the same magnitude, later: q4_0 keeps the first
    }
  }
  if (kind == kNearTies) {  // q4_0: x * id rounds to k + 0.5 but is not: (int8_t)(x0 + 8.5)
    const float m = sign * (1.f + float(seed) / 64), id = 1.f / (m / -8.f);  // tips over there
    for (std::size_t j = 0; j < size; ++j) {
      const float t = float(int(j % 16) - 8) + 0.5f;
      x[j] = j % 32 == 0 ? m : t / id;                              // the block's extreme first
      for (std::uint32_t off = 0; j % 32 != 0 && off < 7; ++off) {  // t / id and 3 ulps each side
        const float c = ak::detail::bits_to_float(ak::detail::float_to_bits(t / id) + off - 3);
        if (float(double(c) * id) == t && double(c) * id != t) x[j] = c;  // a contracted FMA
      }  // would truncate the exact product x * id + 8.5, to the other side of an integer
    }
  }
  return x;
}

constexpr Index kRowLengths[] = {32, 64, 96, 160, 256};

// The bytes of a view's blocks, row after row.
template <class Block>
std::vector<unsigned char> bytes_of(const ak::View<const Block>& x) {
  std::vector<unsigned char> bytes;
  for (Index b = 0; b < x.batch; ++b)
    for (Index h = 0; h < x.heads; ++h)
      for (Index s = 0; s < x.seq; ++s) {
        const auto* p = reinterpret_cast<const unsigned char*>(x.row(b, h, s));
        bytes.insert(bytes.end(), p, p + sizeof(Block) * static_cast<std::size_t>(x.dim / 32));
      }
  return bytes;
}
template <class Block>
bool same_blocks(const ak::View<const Block>& a, const ak::View<const Block>& b) {
  return a.seq == b.seq && bytes_of(a) == bytes_of(b);
}

// Dense BHSD blocks of a tensor's f32 values, made by quantize_row() row by row.
template <class Block>
struct Blocks {
  std::vector<Block> memory;
  ak::View<Block> view;
  explicit Blocks(const Tensor<float>& x) {
    const ak::View<const float> f = x.cview();
    memory.resize(static_cast<std::size_t>(f.batch * f.heads * f.seq * f.dim / 32));
    view = ak::bhsd(memory.data(), f.batch, f.heads, f.seq, f.dim);
    for (Index b = 0; b < f.batch; ++b)
      for (Index h = 0; h < f.heads; ++h)
        for (Index s = 0; s < f.seq; ++s)
          ak::quantize_row(f.row(b, h, s), f.dim, view.row(b, h, s));
  }
  ak::View<const Block> cview() const { return view; }
};

}  // namespace

TEST_CASE("half bits: every half to f32 and f32 to half as Eigen::half", "[quant][half]") {
  int wrong = 0;
  std::vector<float> halves, midpoints;
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float got = ak::detail::half_bits_to_float(bits), want = eigen_float(bits);
    const bool same =
        std::isnan(want) ? std::isnan(got) : std::memcmp(&got, &want, sizeof got) == 0;  // -0 too
    if (!same && wrong++ < 4) UNSCOPED_INFO("half 0x" << std::hex << h << " -> " << got);
    halves.push_back(want);
    if ((h & 0x7FFFu) > 0x7BFFu) continue;  // from each finite half to the next one up in size
    const float next = (h & 0x7FFFu) == 0x7BFFu ? std::copysign(65536.f, want)
                                                : eigen_float(static_cast<std::uint16_t>(h + 1));
    const float mid = (want + next) / 2;  // exact: 12 significant bits
    for (const float m : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 2 * next)})
      midpoints.push_back(m);
  }
  CHECK(wrong == 0);
  check_to_half(halves, "every half (round trip)");
  check_to_half(midpoints, "midpoints of adjacent halves (ties to even) and their neighbours");
  check_to_half({65504.f,         65519.99f,         65520.f,      -65520.f,     1e6f,
                 ak::test::kInf,  ak::test::kNegInf, -0.f,         0.f,          ak::test::kNaN,
                 -ak::test::kNaN, FLT_MAX,           FLT_MIN,      1e-45f,       0x1p-25f,
                 0x1.8p-25f,      0x1p-26f,          0x1.ffcp-15f, 0x1.ffep-15f, 0x1.fffp-15f},
                "edges (overflow at 65520, subnormal halves, f32 subnormals)");
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7FFFFFu), sign(0, 1);
  std::uniform_int_distribution<std::uint32_t> exponent(127 - 40, 127 + 24);  // 2^-40 .. 2^24
  std::vector<float> random(100000);
  for (float& f : random)
    f = ak::detail::bits_to_float(sign(rng) << 31 | exponent(rng) << 23 | mantissa(rng));
  check_to_half(random, "random floats of exponents -40 .. 24");
}

TEMPLATE_TEST_CASE("quantize_row: bit for bit llama.cpp's reference quantizer", "[quant]",
                   BlockQ8_0, BlockQ4_0) {
  int rows = 0, wrong = 0;
  for (const Index n : kRowLengths)
    for (int kind = 0; kind < kKinds; ++kind)
      for (std::uint32_t seed = 1; seed <= 40; ++seed) {
        const std::vector<float> x = make_row(kind, n, seed);
        std::vector<TestType> got(static_cast<std::size_t>(n / 32)), want(got.size());
        ak::quantize_row(x.data(), n, got.data());
        quantize_row_ref(x.data(), want.data(), static_cast<int>(n));
        ++rows;
        if (std::memcmp(got.data(), want.data(), got.size() * sizeof(TestType)) != 0 && wrong++ < 4)
          UNSCOPED_INFO("differs: " << kKindNames[kind] << " row, n " << n << ", seed " << seed);
      }
  INFO(rows << " rows");
  CHECK(wrong == 0);
}

// q8_0, value x of a block with d = max|x| / 127 (f32) and stored scale d_h = half(d):
// x^ = q d_h with q = round(x / d), so x - x^ = (x - q d) + q (d - d_h): |x - q d| <= d / 2
// and |q| <= |x| / d + 1. q4_0, d = m / -8 (m the value of largest magnitude): x / d lies in
// [-8, 8], q - 8 = floor(x / d + 1/2) but clamped to 7 at the top, so the value -m (x / d = 8)
// is off by a whole step: |x - (q - 8) d| <= |d|, and |q - 8| <= 8. Both add the f32 roundings
// of 1 / d, x * id and the decoded product, each 2^-24 relative on at most 128 steps:
// 3 * 128 * 2^-24 < 2^-15 steps, allowed 2^-14 of the larger of |d|, |d_h|.
constexpr double kRoundingSteps = 0x1p-14;

TEMPLATE_TEST_CASE("quantize_row: round trip within a step, zero blocks exactly 0", "[quant]",
                   BlockQ8_0, BlockQ4_0) {
  constexpr bool kQ8 = std::is_same_v<TestType, BlockQ8_0>;
  double worst = 0;  // error over bound
  for (const Index n : kRowLengths)
    for (int kind = 0; kind < kKinds; ++kind)
      for (std::uint32_t seed = 1; seed <= 20; ++seed) {
        if (kind == kExtreme) continue;  // a scale of 65520 or more is an inf half (ggml too)
        const std::vector<float> x = make_row(kind, n, seed);
        std::vector<TestType> blocks(static_cast<std::size_t>(n / 32));
        std::vector<float> back(x.size());
        ak::quantize_row(x.data(), n, blocks.data());
        ak::dequantize_row(static_cast<const TestType*>(blocks.data()), n, back.data());
        for (Index b = 0; b < n / 32; ++b) {
          const float* xb = x.data() + b * 32;
          float m = 0;  // the value of largest magnitude, the first one on ties
          for (Index j = 0; j < 32; ++j) m = std::fabs(xb[j]) > std::fabs(m) ? xb[j] : m;
          const double d = kQ8 ? std::fabs(m) / 127.f : m / -8.f;
          const double d_h = static_cast<float>(Eigen::half(static_cast<float>(d)));
          const double slack = kRoundingSteps * std::max(std::fabs(d), std::fabs(d_h));
          for (Index j = 0; j < 32; ++j) {
            const double err =
                std::fabs(double(xb[j]) - back[static_cast<std::size_t>(b * 32 + j)]);
            const double bound =
                kQ8 ? d / 2 + (std::fabs(xb[j]) / d + 1) * std::fabs(d - d_h) + slack
                    : std::fabs(d) + 8 * std::fabs(d - d_h) + slack;
            worst = std::max(worst, d == 0 ? (err == 0 ? 0 : HUGE_VAL) : err / bound);
          }
        }
      }
  CHECK(worst <= 1);
  const std::vector<float> zeros(64, 0.f);
  std::vector<TestType> blocks(2);
  std::vector<float> back(64, 42.f);
  ak::quantize_row(zeros.data(), 64, blocks.data());
  ak::dequantize_row(static_cast<const TestType*>(blocks.data()), 64, back.data());
  CHECK(ak::test::all_equal_to(back, 0.f));
  CHECK((blocks[0].d & 0x7FFFu) == 0);  // scale 0 (q4_0: -0, as llama.cpp's 0 / -8)
  // A block so small that 1 / d overflows (x * inf would leave the integers' range): zeros.
  const std::vector<float> tiny(64, 1e-38f);
  std::fill(back.begin(), back.end(), 42.f);
  ak::quantize_row(tiny.data(), 64, blocks.data());
  ak::dequantize_row(static_cast<const TestType*>(blocks.data()), 64, back.data());
  CHECK(ak::test::all_equal_to(back, 0.f));
}

TEMPLATE_TEST_CASE("quantize: errors name the argument and write nothing", "[quant][errors]",
                   BlockQ8_0, BlockQ4_0) {
  std::vector<float> x = ak::test::normal_values(3, 1.f, 64), out(64, 42.f);
  std::vector<TestType> blocks(2);
  std::memset(static_cast<void*>(blocks.data()), 0xA5, sizeof(TestType) * blocks.size());
  const std::vector<TestType> before = blocks;
  check_error([&] { ak::quantize_row(x.data(), 48, blocks.data()); },
              {"quantize_row(): n", "a multiple of 32", "48"});
  // A negative multiple of 32 is no row either (it was a silent no-op).
  check_error([&] { ak::quantize_row(x.data(), -32, blocks.data()); },
              {"quantize_row(): n", ">= 0", "got -32"});
  x[37] = ak::test::kNaN;
  check_error([&] { ak::quantize_row(x.data(), 64, blocks.data()); },
              {"quantize_row(): x[37]", "a finite value", "nan"});
  x[37] = 1.f;
  x[5] = ak::test::kNegInf;
  check_error([&] { ak::quantize_row(x.data(), 64, blocks.data()); },
              {"quantize_row(): x[5]", "a finite value", "inf"});
  x[5] = 1.f;
  // The largest |x| a block encodes: its half scale |x| / 127 (q8_0) or / 8 (q4_0) below 65520.
  const float too_large = std::is_same_v<TestType, BlockQ8_0> ? 8321040.f : 524160.f;
  x[50] = -too_large;
  check_error([&] { ak::quantize_row(x.data(), 64, blocks.data()); },
              {"quantize_row(): x[50]", "magnitude below"});
  CHECK(std::memcmp(blocks.data(), before.data(), sizeof(TestType) * blocks.size()) == 0);
  x[50] = std::nextafter(-too_large, 0.f);  // the largest magnitude encoded: a finite scale
  ak::quantize_row(x.data(), 64, blocks.data());
  ak::dequantize_row(static_cast<const TestType*>(blocks.data()), 64, out.data());
  CHECK(std::isfinite(out[50]));
  CHECK(std::abs(out[50] - x[50]) <=
        0.5f * too_large / (std::is_same_v<TestType, BlockQ8_0> ? 127.f : 8.f) + 1.f);
  std::fill(out.begin(), out.end(), 42.f);
  std::memcpy(static_cast<void*>(blocks.data()), before.data(), sizeof(TestType) * blocks.size());
  check_error(
      [&] { ak::dequantize_row(static_cast<const TestType*>(blocks.data()), 40, out.data()); },
      {"dequantize_row(): n", "a multiple of 32", "40"});
  check_error(
      [&] { ak::dequantize_row(static_cast<const TestType*>(blocks.data()), -32, out.data()); },
      {"dequantize_row(): n", ">= 0", "got -32"});
  CHECK(ak::test::all_equal_to(out, 42.f));
  check_error([&] { (void)ak::bshd(blocks.data(), 1, 1, 1, 48); }, {"bshd: D", "a multiple of 32"});
  check_error([&] { (void)ak::bhsd(blocks.data(), 1, 1, 1, 48); }, {"bhsd: D", "a multiple of 32"});
  check_error([] { ak::KvCache<TestType>(1, 1, 8, 48); }, {"KvCache.head_dim", "a multiple of 32"});
  check_error([] { ak::PagedKv<TestType>(4, 1, 16, 64, 40); },
              {"PagedKv.value_dim", "a multiple of 32", "40"});
  const ak::View<const TestType> bad =  // strided: no factory checks the dim
      ak::strided(static_cast<const TestType*>(blocks.data()), {1, 1, 1, 48}, {2, 2, 2});
  const auto f32 = ak::bhsd(static_cast<const float*>(x.data()), 1, 1, 1, 48);
  const auto o = ak::bhsd(out.data(), 1, 1, 1, 48);
  const auto spec = ak::make_spec(ak::Causal{});
  check_error([&] { ak::attention(spec, f32, bad, f32, o); }, {"k.dim", "a multiple of 32", "48"});
  check_error([&] { ak::attention(spec, f32, f32, bad, o); }, {"v.dim", "a multiple of 32", "48"});
  CHECK(ak::test::all_equal_to(out, 42.f));
}

TEMPLATE_TEST_CASE("KvCache: stores the blocks quantize_row() makes", "[quant][kv_cache]",
                   BlockQ8_0, BlockQ4_0) {
  constexpr Index kB = 2, kHkv = 2, kN = 20, kD = 64, kDv = 96;
  Tensor<float> k(Layout::Bshd, kB, kHkv, kN, kD), v(Layout::Bshd, kB, kHkv, kN, kDv);
  k.randomize(1);
  v.randomize(2);
  const Blocks<TestType> k_blocks(k), v_blocks(v);  // quantize_row() of every row
  SECTION("f32 rows, in one append and in two") {
    ak::KvCache<TestType> one(kB, kHkv, 32, kD, kDv), two(kB, kHkv, 32, kD, kDv);
    one.append(k.cview(), v.cview());
    two.append(seq_rows(k.cview(), 0, 13), seq_rows(v.cview(), 0, 13));
    two.append(seq_rows(k.cview(), 13, kN - 13), seq_rows(v.cview(), 13, kN - 13));
    CHECK(same_blocks(one.keys(), k_blocks.cview()));
    CHECK(same_blocks(one.values(), v_blocks.cview()));
    CHECK(same_blocks(two.keys(), one.keys()));
    CHECK(same_blocks(two.values(), one.values()));
  }
  SECTION("bf16 rows: quantize_row() of their f32 values") {
    Tensor<Eigen::bfloat16> kb(Layout::Bshd, kB, kHkv, kN, kD), vb(Layout::Bshd, kB, kHkv, kN, kDv);
    kb.randomize(1);
    vb.randomize(2);
    Tensor<float> kw(Layout::Bshd, kB, kHkv, kN, kD), vw(Layout::Bshd, kB, kHkv, kN, kDv);
    for (std::size_t i = 0; i < kb.memory.size(); ++i) kw.memory[i] = float(kb.memory[i]);
    for (std::size_t i = 0; i < vb.memory.size(); ++i) vw.memory[i] = float(vb.memory[i]);
    ak::KvCache<TestType> cache(kB, kHkv, 32, kD, kDv);
    cache.append(kb.cview(), vb.cview());
    CHECK(same_blocks(cache.keys(), Blocks<TestType>(kw).cview()));
    CHECK(same_blocks(cache.values(), Blocks<TestType>(vw).cview()));
  }
  SECTION("block rows copy unchanged") {
    ak::KvCache<TestType> cache(kB, kHkv, 32, kD, kDv);
    cache.append(k_blocks.cview(), v_blocks.cview());
    CHECK(same_blocks(cache.keys(), k_blocks.cview()));
    CHECK(same_blocks(cache.values(), v_blocks.cview()));
  }
  SECTION("a non-finite f32 row is refused, the cache unchanged") {
    ak::KvCache<TestType> cache(kB, kHkv, 32, kD, kDv);
    cache.append(seq_rows(k.cview(), 0, 5), seq_rows(v.cview(), 0, 5));
    const std::vector<unsigned char> before = bytes_of(cache.keys());
    k.view.row(1, 0, 7)[3] = ak::test::kNaN;  // row (1, 0, 2) of the new rows
    check_error([&] { cache.append(seq_rows(k.cview(), 5, 4), seq_rows(v.cview(), 5, 4)); },
                {"k_new row (1, 0, 2)", "finite"});
    CHECK(cache.length() == 5);
    CHECK(bytes_of(cache.keys()) == before);
  }
}

TEST_CASE("PagedKv<BlockQ8_0>: softmax decode over pages equals decode() on a KvCache",
          "[quant][paged]") {
  constexpr Index kB = 2, kHq = 4, kHkv = 2, kLk = 100, kD = 64;
  Tensor<float> k(Layout::Bhsd, kB, kHkv, kLk, kD), v(Layout::Bhsd, kB, kHkv, kLk, kD);
  k.randomize(4);
  v.randomize(5);
  ak::KvCache<BlockQ8_0> cache(kB, kHkv, kLk, kD);
  cache.append(k.cview(), v.cview());
  const auto spec = ak::make_spec(ak::Causal{});
  for (const Index page_size : {16, 7})
    for (const Index lq : {1, 3}) {
      INFO("page_size " << page_size << ", Lq " << lq);
      ak::PagedKv<BlockQ8_0> paged(2 * 15, kHkv, page_size, kD);
      for (Index from = 0; from < kLk; from += 40)  // interleaved: the pages alternate
        for (Index b = 0; b < kB; ++b) {
          if (from == 0) paged.add_sequence();
          const Index n = std::min<Index>(40, kLk - from);
          const auto slice = [&](const Tensor<float>& t) {
            return seq_rows(
                ak::strided(t.view.row(b, 0, 0), {1, kHkv, kLk, kD},
                            {t.view.batch_stride, t.view.head_stride, t.view.seq_stride}),
                from, n);
          };
          paged.append(b, slice(k), slice(v));
        }
      Tensor<float> q(Layout::Bhsd, kB, kHq, lq, kD), want(Layout::Bhsd, kB, kHq, lq, kD),
          got(Layout::Bhsd, kB, kHq, lq, kD);
      q.randomize(6);
      std::vector<float> lse_want(kB * kHq * lq), lse_got(lse_want.size());
      ak::decode(spec, q.cview(), cache.keys(), cache.values(), want.view,
                 ak::Options{}.with_lse(lse_want));
      ak::attention_paged(spec, q.cview(), paged, got.view, ak::Options{}.with_lse(lse_got));
      if (page_size % ak::detail::kDecodeBlock == 0) {  // the same key blocks: the same bits
        CHECK(std::memcmp(got.memory.data(), want.memory.data(),
                          want.memory.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(lse_got.data(), lse_want.data(), lse_want.size() * sizeof(float)) == 0);
      } else {  // other blocks of keys, other f32 roundings: each within kF32 of the f64 result
        CHECK(ak::test::max_abs_diff(got.cview(), want.cview()) <= 2 * tol::kF32);
        CHECK(ak::test::max_lse_diff(lse_got, lse_want) <= 2 * tol::kLseF32);
      }
    }
}
