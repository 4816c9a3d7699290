// simd/int8_dot.hpp: the integer products of decode's Products::Int8 mode, against the f64
// sum of the documented rule (the query block quantized as q8_0 with an f32 scale, the key
// block read in place), for each key layout, 1 to 17 blocks (the AVX-512 form reads two or
// four blocks at a time: every tail), 1, 2 and 4 query rows sharing the key, extreme bytes
// (-128, nibbles 0 and 15) and the edge queries (zero, tiny, non-finite). Built on every path
// (native ISA, x86-64-v2, ATTNKIT_NO_SIMD, aarch64 NEON under emulation).
#include <Eigen/Core>
#include <attnkit/simd/int8_dot.hpp>  // before Eigen (simd/vec.hpp)
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace simd = attnkit::simd;
using simd::KeyBlocks;

namespace {

// The f32 sums over blocks and lanes: a few roundings of terms at most |dk dq| * sum |k q|.
constexpr double kSumUlps = 4;

template <KeyBlocks F>
constexpr int block_bytes() {
  return F == KeyBlocks::Q8 ? 34 : 18;
}

// Key value c of a block, signed (q4_0: the nibble minus 8).
template <KeyBlocks F>
int key_value(const std::uint8_t* block, int c) {
  if (F == KeyBlocks::Q8) return static_cast<std::int8_t>(block[2 + c]);
  return (c < 16 ? block[2 + c] & 15 : block[2 + c - 16] >> 4) - 8;
}

double key_scale(const std::uint8_t* block) {
  std::uint16_t bits;
  std::memcpy(&bits, block, sizeof bits);
  return double(static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits)));
}

// The documented rule, written out: dq = max|x| / 127, q = round(x * (1 / dq)).
struct QueryBlock {
  float dq = 0.f;
  int q[32] = {};
};
QueryBlock quantized(const float* x) {
  QueryBlock out;
  float amax = 0.f;
  for (int c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(x[c]));
  const float d = amax / 127.f;
  if (!(d >= std::numeric_limits<float>::min())) return out;
  out.dq = d;
  for (int c = 0; c < 32; ++c) out.q[c] = static_cast<int>(std::round(x[c] * (1.f / d)));
  return out;
}

struct Expected {
  double value = 0, bound = 0;
};
template <KeyBlocks F>
Expected expected(const std::uint8_t* key, int blocks, const float* x) {
  Expected e;
  for (int b = 0; b < blocks; ++b) {
    const QueryBlock qb = quantized(x + 32 * b);
    const std::uint8_t* blk = key + b * block_bytes<F>();
    long long sum = 0, abs_sum = 0;
    for (int c = 0; c < 32; ++c) {
      sum += key_value<F>(blk, c) * qb.q[c];
      abs_sum += std::abs(key_value<F>(blk, c) * qb.q[c]);
    }
    const double f = key_scale(blk) * double(qb.dq);
    e.value += f * double(sum);
    e.bound += std::fabs(f) * double(abs_sum);
  }
  e.bound *= kSumUlps * (blocks + 4) * std::numeric_limits<float>::epsilon();
  return e;
}

float lane_sum(simd::Vec v) {
  float lanes[simd::kWidth];
  simd::store(lanes, v);
  double s = 0;
  for (float l : lanes) s += l;
  return float(s);
}

// A query row of `blocks` blocks quantized into 64-byte aligned storage.
template <KeyBlocks F>
struct QueryRow {
  std::vector<std::byte> storage;
  std::byte* at;
  QueryRow(const float* x, int blocks)
      : storage(static_cast<std::size_t>(simd::int8_query_bytes<F>(blocks) + 64)) {
    auto raw = reinterpret_cast<std::uintptr_t>(storage.data());
    at = storage.data() + (64 - raw % 64) % 64;
    simd::int8_query<F>(x, blocks, at);
  }
};

// R query rows against one key row (the last bytes of its vector: nothing is read past it).
template <KeyBlocks F, int R>
void check_rows(std::mt19937& rng, int blocks) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 4.f), value(-2.f, 2.f);
  std::vector<std::uint8_t> key(static_cast<std::size_t>(blocks * block_bytes<F>()));
  for (int b = 0; b < blocks; ++b) {
    std::uint8_t* blk = key.data() + b * block_bytes<F>();
    const std::uint16_t bits = Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(scale(rng)));
    std::memcpy(blk, &bits, sizeof bits);
    for (int i = 2; i < block_bytes<F>(); ++i) blk[i] = static_cast<std::uint8_t>(byte(rng));
    blk[2] = 0x80;  // -128 in q8_0; nibbles 0 and 8 in q4_0
    blk[3] = 0xF0;  // nibbles 0 and 15
  }
  std::vector<std::vector<float>> x(R, std::vector<float>(std::size_t(32 * blocks)));
  for (auto& row : x)
    for (float& v : row) v = value(rng);
  x[0][0] = 0.f;  // rows of different ranges per block
  if (blocks > 1) std::fill(x[0].begin() + 32, x[0].begin() + 64, 0.f);  // a zero block
  std::vector<QueryRow<F>> q;
  for (int r = 0; r < R; ++r) q.emplace_back(x[std::size_t(r)].data(), blocks);
  const std::byte* rows[R];
  simd::Vec a[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = q[std::size_t(r)].at;
    a[r] = simd::Vec(0.f);
  }
  simd::int8_key_dot<F, R>(key.data(), blocks, rows, a);
  for (int r = 0; r < R; ++r) {
    const Expected e = expected<F>(key.data(), blocks, x[std::size_t(r)].data());
    INFO(simd::kArchName << ": blocks " << blocks << ", row " << r << " of " << R << ": got "
                         << lane_sum(a[r]) << ", expected " << e.value);
    CHECK(std::fabs(double(lane_sum(a[r])) - e.value) <= e.bound);
  }
}

template <KeyBlocks F>
void check_layout() {
  std::mt19937 rng(7);
  for (int blocks = 1; blocks <= 17; ++blocks) {
    check_rows<F, 1>(rng, blocks);
    check_rows<F, 2>(rng, blocks);
    check_rows<F, 4>(rng, blocks);
  }
}

template <KeyBlocks F>
float dot_with_unit_key(const std::vector<float>& x) {
  const int blocks = int(x.size() / 32);
  std::vector<std::uint8_t> key(static_cast<std::size_t>(blocks * block_bytes<F>()), 0);
  for (int b = 0; b < blocks; ++b) {  // dk = 1, every value 1
    std::uint8_t* blk = key.data() + b * block_bytes<F>();
    blk[1] = 0x3C;
    std::fill(blk + 2, blk + block_bytes<F>(), F == KeyBlocks::Q8 ? 1 : 0x99);
  }
  QueryRow<F> q(x.data(), blocks);
  const std::byte* rows[1] = {q.at};
  simd::Vec a[1] = {simd::Vec(0.f)};
  simd::int8_key_dot<F, 1>(key.data(), blocks, rows, a);
  return lane_sum(a[0]);
}

}  // namespace

TEST_CASE("int8 dot: q8_0 key rows times quantized queries equal the f64 sum of the rule",
          "[simd][int8]") {
  check_layout<KeyBlocks::Q8>();
}

TEST_CASE("int8 dot: q4_0 key rows times quantized queries equal the f64 sum of the rule",
          "[simd][int8]") {
  check_layout<KeyBlocks::Q4>();
}

TEST_CASE("int8 dot: zero and tiny query blocks give 0, a non-finite value gives NaN",
          "[simd][int8]") {
  std::vector<float> x(96, 0.f);
  CHECK(dot_with_unit_key<KeyBlocks::Q8>(x) == 0.f);
  CHECK(dot_with_unit_key<KeyBlocks::Q4>(x) == 0.f);
  std::fill(x.begin() + 32, x.begin() + 64, 1e-37f);  // max|x| / 127 is not a normal float
  CHECK(dot_with_unit_key<KeyBlocks::Q8>(x) == 0.f);
  x[5] = 1.f;  // one value 1: q = 127, dq = 1 / 127
  CHECK(std::fabs(dot_with_unit_key<KeyBlocks::Q8>(x) - 1.f) <= 1e-6f);
  CHECK(std::fabs(dot_with_unit_key<KeyBlocks::Q4>(x) - 1.f) <= 1e-6f);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    x[70] = bad;
    CHECK(std::isnan(dot_with_unit_key<KeyBlocks::Q8>(x)));
    CHECK(std::isnan(dot_with_unit_key<KeyBlocks::Q4>(x)));
  }
}
