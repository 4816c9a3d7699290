// The non-template pieces of tests/support, compiled once for every test executable, with
// optimization (the random inputs are drawn here). It includes no kernel or SIMD header
// (case.hpp, tolerance.hpp are light); it is compiled for each ISA the tests are, for the
// reason tests/CMakeLists.txt gives.
#include <algorithm>
#include <attnkit/core/error.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>

#include "support/case.hpp"
#include "support/error_checks.hpp"
#include "support/tolerance.hpp"

namespace attnkit::test {

std::vector<float> normal_values(std::uint32_t seed, float stddev, std::size_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "B" << c.batch << " Hq" << c.q_heads << " Hkv" << c.kv_heads << " Lq" << c.q_len << " Lk"
    << c.kv_len << " d" << c.dim << " dv" << c.dv() << " " << name(c.layout) << " threads "
    << c.threads << " q_offset " << c.offset() << (c.q_offset ? "" : " (default)");
  return s.str();
}

std::vector<unsigned char> bytes_of(const KernelResult& r) {
  std::vector<unsigned char> out((r.out.size() + r.lse.size()) * sizeof(float));
  std::memcpy(out.data(), r.out.data(), r.out.size() * sizeof(float));
  std::memcpy(out.data() + r.out.size() * sizeof(float), r.lse.data(),
              r.lse.size() * sizeof(float));
  return out;
}

Agreement compare_rows(const ComparedRows& rows, const Tolerance& t) {
  const Case& c = rows.c;
  const Index dv = c.dv();
  const double out_allowed = t.out + 8.0 * t.logit;
  const bool has_stat = !rows.stat.empty();
  Agreement a;
  const auto& memory = rows.out.memory;
  const auto nan_count =
      std::count_if(memory.begin(), memory.end(), [](float x) { return std::isnan(x); });
  a.padding_intact = nan_count == static_cast<Index>(memory.size()) - c.rows() * dv;
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index r = 0; r < c.q_len; ++r) {
        const float* got = rows.out.view.row(b, h, r);
        const double* want = rows.expected.view.row(b, h, r);
        const double* magnitude = rows.magnitude ? rows.magnitude->view.row(b, h, r) : nullptr;
        for (Index x = 0; x < dv; ++x) {
          const double size = magnitude ? std::max(1.0, magnitude[x]) : 1.0;
          const double d = std::abs(double(got[x]) - want[x]);
          a.out = std::isnan(d) ? HUGE_VAL : std::max(a.out, d / (out_allowed * size));
        }
        const auto at = static_cast<std::size_t>((b * c.q_heads + h) * c.q_len + r);
        if (has_stat) {
          const double e = rows.stat_expected[at], g = rows.stat[at];
          const double d = e == g ? 0.0 : std::abs(g - e);  // equal infinities: 0
          const double allowed = rows.stat_is_sum
                                     ? t.sum_rel * std::max(1.0, std::abs(e)) +
                                           2.0 * t.logit * (double(c.kv_len) + std::abs(e))
                                     : t.lse + t.logit + t.lse_rel * std::abs(e);
          a.stat = std::isnan(d) ? HUGE_VAL : std::max(a.stat, d / allowed);
        }
        if (rows.sees_a_key[at]) continue;
        ++a.empty_rows;
        const auto zero = [](double x) { return x == 0.0; };
        a.empty_exact =
            a.empty_exact && std::all_of(got, got + dv, zero) && std::all_of(want, want + dv, zero);
        if (has_stat)
          a.empty_exact = a.empty_exact &&
                          rows.stat[at] == rows.empty_stat[static_cast<std::size_t>(h)] &&
                          rows.stat_expected[at] == rows.stat[at];
      }
  return a;
}

void check_agreement(const Agreement& a) {
  INFO("rows that see no key: " << a.empty_rows);
  CHECK(a.out <= 1.0);
  CHECK(a.stat <= 1.0);
  CHECK(a.padding_intact);
  CHECK(a.empty_exact);
}

void check_outcome(const Outcome& r, double lse_tol) {
  INFO("rows that see no key: " << r.empty_rows);
  CHECK(r.out_err <= tol::kF32);
  CHECK(r.lse_err <= lse_tol);
  CHECK(r.padding_intact);
  CHECK(r.empty_rows_exact);  // a row that sees no key: output 0, LSE -inf
}

namespace {

// The message of an attnkit::Error contains every part.
class ContainsAll final : public Catch::Matchers::MatcherBase<Error> {
 public:
  explicit ContainsAll(std::initializer_list<const char*> parts)
      : parts_(parts.begin(), parts.end()) {}
  bool match(const Error& e) const override {
    const std::string what = e.what();
    for (const std::string& p : parts_)
      if (what.find(p) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string s = "message contains";
    for (const std::string& p : parts_) s += " \"" + p + "\"";
    return s;
  }

 private:
  std::vector<std::string> parts_;
};

}  // namespace

void check_error(const std::function<void()>& call, std::initializer_list<const char*> parts) {
  CHECK_THROWS_MATCHES(call(), Error, ContainsAll(parts));
}

void check_refused(const std::function<void()>& call, std::initializer_list<const char*> parts,
                   std::initializer_list<const std::vector<float>*> buffers, float sentinel) {
  check_error(call, parts);
  for (const std::vector<float>* b : buffers) CHECK(all_equal_to(*b, sentinel));
}

}  // namespace attnkit::test
