// The SIMD and the scalar path agree. Built twice (see CMakeLists.txt): with
// ATTNKIT_NO_SIMD this program writes the outputs and LSE of a few fixed problems as raw
// floats (`--write FILE`); built for the native ISA it recomputes them and compares element
// by element (`--compare FILE`), printing the worst difference and failing on a mismatch.
// Inputs come from mt19937 (fully specified by the standard), so both builds see the same
// data.
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

// Scalar vs vector path: both f32, differing only in summation order and in exp2/tanh
// (std:: vs xsimd polynomials), so outputs of order 1 and LSE of order 10 agree far
// closer than this.
constexpr double kTolerance = 1e-5;  // absolute, outputs and LSE alike

struct Case {
  const char* name;
  Index batch, q_heads, kv_heads, q_len, kv_len, dim, value_dim;
  bool causal;
  float softcap;  // 0: none
  float spread;   // inputs uniform in [-spread, spread]
};

// Ragged lengths (1, 65, 200), causal and not, softcap, GQA and MQA, Lq > Lk with rows
// that see no key.
const Case kCases[] = {
    {"full, Lq = Lk = 65", 1, 2, 2, 65, 65, 64, 64, false, 0.f, 1.5f},
    {"causal, Lq = Lk = 200, MQA 4:1", 1, 4, 1, 200, 200, 64, 64, true, 0.f, 1.5f},
    {"causal + softcap 20, decode Lq = 1, Lk = 200", 2, 2, 2, 1, 200, 80, 80, true, 20.f, 4.f},
    {"softcap 5, GQA 4:2, Lq = 200, Lk = 65, Dv = 48", 1, 4, 2, 200, 65, 32, 48, false, 5.f, 3.f},
    {"causal, Lq = 65 > Lk = 1 (64 rows see no key)", 1, 2, 1, 65, 1, 16, 16, true, 0.f, 1.5f},
    {"full, Lq = 1, Lk = 1", 1, 1, 1, 1, 1, 32, 32, false, 0.f, 1.5f},
};

std::vector<float> uniform(std::size_t n, float spread, std::mt19937& rng) {
  std::vector<float> x(n);
  for (float& v : x) v = spread * (2.f * float(double(rng()) / 4294967296.0) - 1.f);
  return x;
}

template <class Spec>
void run(const Spec& spec, const Case& c, std::uint32_t seed, std::vector<float>& out) {
  std::mt19937 rng(seed);
  const auto size = [](Index a, Index b, Index s, Index d) {
    return static_cast<std::size_t>(a * b * s * d);
  };
  std::vector<float> q = uniform(size(c.batch, c.q_heads, c.q_len, c.dim), c.spread, rng);
  std::vector<float> k = uniform(size(c.batch, c.kv_heads, c.kv_len, c.dim), c.spread, rng);
  std::vector<float> v = uniform(size(c.batch, c.kv_heads, c.kv_len, c.value_dim), 1.f, rng);
  std::vector<float> o(size(c.batch, c.q_heads, c.q_len, c.value_dim));
  std::vector<float> lse(size(c.batch, c.q_heads, c.q_len, 1));
  const float* cq = q.data();
  const float* ck = k.data();
  const float* cv = v.data();
  ak::attention(spec, ak::bhsd(cq, c.batch, c.q_heads, c.q_len, c.dim),
                ak::bhsd(ck, c.batch, c.kv_heads, c.kv_len, c.dim),
                ak::bhsd(cv, c.batch, c.kv_heads, c.kv_len, c.value_dim),
                ak::bhsd(o.data(), c.batch, c.q_heads, c.q_len, c.value_dim),
                ak::Options{}.with_threads(1).with_lse(lse));
  out.insert(out.end(), o.begin(), o.end());
  out.insert(out.end(), lse.begin(), lse.end());
}

// All outputs then all LSE of every case, in order; `ends[i]` is where case i stops.
std::vector<float> compute_all(std::vector<std::size_t>& ends) {
  std::vector<float> out;
  std::uint32_t seed = 1000;
  for (const Case& c : kCases) {
    if (c.causal && c.softcap > 0.f)
      run(ak::make_spec(ak::Causal{}, ak::Softcap{c.softcap}), c, seed, out);
    else if (c.causal)
      run(ak::make_spec(ak::Causal{}), c, seed, out);
    else if (c.softcap > 0.f)
      run(ak::make_spec(ak::Softcap{c.softcap}), c, seed, out);
    else
      run(ak::make_spec(), c, seed, out);
    ends.push_back(out.size());
    ++seed;
  }
  return out;
}

int write(const std::string& path) {
  std::vector<std::size_t> ends;
  const std::vector<float> values = compute_all(ends);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(values.data()),
             static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!file) {
    std::fprintf(stderr, "simd agreement: cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("simd agreement: %s path (%d lanes) wrote %zu floats to %s\n", ak::simd::kArchName,
              ak::simd::kWidth, values.size(), path.c_str());
  return 0;
}

// |a - b|, with equal infinities (the -inf LSE of an empty row) counting as 0 and NaN as inf.
double difference(float a, float b) {
  if (std::isinf(a) && a == b) return 0.0;
  const double d = std::abs(double(a) - double(b));
  return std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
}

int compare(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) {
    std::fprintf(stderr, "simd agreement: cannot read %s (did the scalar dump run?)\n",
                 path.c_str());
    return 1;
  }
  const auto bytes = static_cast<std::size_t>(file.tellg());
  std::vector<std::size_t> ends;
  const std::vector<float> mine = compute_all(ends);
  if (bytes != mine.size() * sizeof(float)) {
    std::fprintf(stderr,
                 "simd agreement: size mismatch: %s holds %zu bytes, this build computes %zu "
                 "floats (%zu bytes)\n",
                 path.c_str(), bytes, mine.size(), mine.size() * sizeof(float));
    return 1;
  }
  std::vector<float> theirs(mine.size());
  file.seekg(0);
  file.read(reinterpret_cast<char*>(theirs.data()), static_cast<std::streamsize>(bytes));
  if (!file) {
    std::fprintf(stderr, "simd agreement: short read from %s\n", path.c_str());
    return 1;
  }

  double worst = 0.0;
  std::size_t worst_at = 0, mismatches = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const double d = difference(mine[i], theirs[i]);
    if (d > kTolerance) ++mismatches;
    if (d > worst || (i == 0 && d == worst)) {
      worst = d;
      worst_at = i;
    }
  }
  std::size_t case_index = 0;
  while (worst_at >= ends[case_index]) ++case_index;
  const std::size_t begin = case_index == 0 ? 0 : ends[case_index - 1];
  std::printf(
      "simd agreement: %s path (%d lanes) vs scalar over %zu floats: worst |diff| %.3g at "
      "element %zu of case '%s' (native %.9g, scalar %.9g); tolerance %.1g\n",
      ak::simd::kArchName, ak::simd::kWidth, mine.size(), worst, worst_at - begin,
      kCases[case_index].name, double(mine[worst_at]), double(theirs[worst_at]), kTolerance);
  if (mismatches > 0) {
    std::fprintf(stderr, "simd agreement: FAILED, %zu values differ by more than %.1g\n",
                 mismatches, kTolerance);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--write") == 0) return write(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "--compare") == 0) return compare(argv[2]);
  std::fprintf(stderr, "usage: %s --write FILE | --compare FILE\n", argc > 0 ? argv[0] : "dump");
  return 2;
}
