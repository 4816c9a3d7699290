// Products::Bf16 (options.hpp): the tile kernel with its operands rounded to bfloat16
// (storage/bf16_round.hpp) and f32 accumulation, against the f64 reference. Two comparisons,
// each with the tolerance its rounding implies (u = 2^-8, bf16's relative rounding bound):
//  - on operands that are already bf16 (bf16 Q, K, V and a power-of-two scale) only the
//    weights P are rounded: each output moves by at most u sum_j w_j |v_j| / l <= u max|v|;
//  - on f32 inputs the logits move too, by at most delta, computed here in double from the
//    inputs and their bf16 roundings (not from any output), and V by u: the output by at most
//    8 delta + (2u + u^2) max|v| (the shared Tolerance rule for a logit error).
// Each on both kernels of the mode where the build has both (f32 FMAs on the rounded operands,
// and vdpbf16ps -- simd/bf16_dot.hpp's instruction in gemm/tile_gemm_bf16.hpp, through
// kernel/tiles/tile_pair_products.hpp (the query tile from kernel/tiles/tile_queries.hpp), on K and
// V packed once per call by kernel/tiles/pair_kv.hpp or per tile where those cannot serve), which
// are also compared with each other. Every normalizer, masks, d 32 to 256, GQA, ragged lengths, a
// 16K context, bitwise stability over thread counts, the paths that stay exact (decode), the pair
// GEMM alone, and the rounding itself against Eigen::bfloat16's conversion.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/gemm/tile_gemm_bf16.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/storage/bf16_round.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/error_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::Products;
using ak::gemm::Bf16Kernel;
using bf16 = Eigen::bfloat16;

namespace {

constexpr double kU = ak::detail::kBf16Unit;  // 2^-8

const char* name_of(Bf16Kernel k) {
  return k == Bf16Kernel::PairProducts ? "vdpbf16ps" : "f32 FMAs on rounded operands";
}

// Forces the mode's kernel for the scope of a test (the process-wide choice, back to Auto);
// name() for the test's INFO.
struct UsingKernel {
  explicit UsingKernel(Bf16Kernel k) : kernel(k) { ak::gemm::bf16_kernel() = k; }
  ~UsingKernel() { ak::gemm::bf16_kernel() = Bf16Kernel::Auto; }
  UsingKernel(const UsingKernel&) = delete;
  UsingKernel& operator=(const UsingKernel&) = delete;
  const char* name() const { return name_of(kernel); }
  Bf16Kernel kernel;
};

// A generator over the kernels the mode has in this build, named for the INFO.
Bf16Kernel kernel_here() {
  return ak::gemm::kHasBf16Dot ? GENERATE(Bf16Kernel::RoundedF32, Bf16Kernel::PairProducts)
                               : Bf16Kernel::RoundedF32;
}

// The fastest kernel here, for the largest grids (CI time): vdpbf16ps where the build has it.
// The portable form meets the same grids in test_attention_paths (every SIMD path) and,
// against vdpbf16ps, in "the vdpbf16ps kernel agrees with f32 FMAs on the same operands".
Bf16Kernel fastest_kernel_here() {
  return ak::gemm::kHasBf16Dot ? Bf16Kernel::PairProducts : Bf16Kernel::RoundedF32;
}

// attention(spec) on `in` with bf16 products, for agreement().
template <class Spec, class In>
auto bf16_products_on(const Spec& spec, const In& in) {
  return [&spec, &in](const ak::View<float>& o, const ak::Options& options) {
    ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o,
                  options.with_products(Products::Bf16));
  };
}

template <class T>
std::vector<double> values_of(const ak::test::Tensor<T>& x) {  // row-major [B, H, S, D]
  const std::vector<float> values = x.values();
  return {values.begin(), values.end()};
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (const double v : x) m = std::max(m, std::abs(v));
  return m;
}

double bf16_of(double x) { return double(float(bf16(float(x)))); }  // Eigen's rounding

// The largest move of a logit scale q_i . k_j when the kernel rounds scale * q_i and k_j to
// bf16, over all pairs (bhsd layout, one batch): computed from the inputs alone.
double logit_shift(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                   double scale) {
  const Index d = c.dim, group = c.q_heads / c.kv_heads;
  double delta = 0.0;
  for (Index h = 0; h < c.q_heads; ++h)
    for (Index i = 0; i < c.q_len; ++i)
      for (Index j = 0; j < c.kv_len; ++j) {
        const double* qi = q.data() + (h * c.q_len + i) * d;
        const double* kj = k.data() + (h / group * c.kv_len + j) * d;
        double exact = 0.0, rounded = 0.0;
        for (Index x = 0; x < d; ++x) {
          const double sq = double(float(qi[x]) * float(scale));  // the kernel scales in f32
          exact += scale * qi[x] * kj[x];
          rounded += bf16_of(sq) * bf16_of(kj[x]);
        }
        delta = std::max(delta, std::abs(exact - rounded));
      }
  return delta;
}

// On bf16 Q, K, V with a power-of-two scale: only P is rounded.
template <class Spec>
void check_on_bf16_operands(const std::string& what, const Spec& spec, Case c, double logit = 0.0) {
  INFO(what << ", " << ak::test::describe(c));
  const ak::test::Inputs<bf16> in(c, 7);
  ak::test::Tolerance t;
  t.out = kU * max_abs(values_of(in.v)) + ak::test::tol::kF32;
  t.logit = logit;
  ak::test::check_agreement(ak::test::agreement(spec, c, in, bf16_products_on(spec, in), t));
}

}  // namespace

TEST_CASE("bf16 products: rounding matches Eigen::bfloat16 bit for bit", "[attention][bf16]") {
  std::vector<float> xs = {0.f,
                           -0.f,
                           1.f,
                           -1.f,
                           1.00390625f,
                           1.005859375f,
                           1.0078125f,
                           3.4e38f,
                           -3.4e38f,
                           3.3895314e38f,
                           1e-40f,
                           -1e-42f,
                           1.17549435e-38f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::max()};
  for (std::uint32_t bits = 0; bits < 0xFFFFF000u; bits += 0x000A3C5Bu) {  // a sweep of patterns
    float f;
    std::memcpy(&f, &bits, sizeof f);
    xs.push_back(f);
  }
  Index mismatches = 0, nans = 0;
  for (const float x : xs) {
    const float got = ak::detail::round_to_bf16(x), want = float(bf16(x));
    if (std::isnan(x)) {
      ++nans;
      mismatches += std::isnan(got) ? 0 : 1;
      continue;
    }
    std::uint32_t g, w;
    std::memcpy(&g, &got, sizeof g);
    std::memcpy(&w, &want, sizeof w);
    mismatches += g == w ? 0 : 1;
  }
  INFO(xs.size() << " values, " << nans << " NaN patterns");
  CHECK(nans > 0);
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 products: on bf16 operands only P is rounded, for every normalizer",
          "[attention][bf16]") {
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  const Index heads = 4;
  const std::vector<float> biases = ak::test::head_biases(heads);
  const std::vector<float> sinks = ak::test::head_sinks(heads);
  const auto window = Causal{} & SlidingWindow{100, 0};
  struct Shape {
    Index d, lq;  // d 64, 256: scale 1/8, 1/16, so scale * q is a bf16 value again
  };
  for (const Shape sh : {Shape{64, 17}, Shape{64, 150}, Shape{256, 40}}) {
    const Index d = sh.d, lq = sh.lq;
    const Case c = Case{}
                       .lengths(lq, lq + 250)
                       .heads(heads, 2)
                       .dims(d)
                       .laid_out(lq == 17 ? Layout::Padded : Layout::Bshd);
    check_on_bf16_operands("Causal", ak::make_spec(Causal{}), c);
    check_on_bf16_operands("Causal & SlidingWindow{100, 0}", ak::make_spec(window), c);
    check_on_bf16_operands("Sigmoid::per_head",
                           ak::make_spec(window, ak::Sigmoid::per_head(biases)), c);
    check_on_bf16_operands("ReluPower{1.5, 0.3}", ak::make_spec(window, ak::ReluPower{1.5f, 0.3f}),
                           c);
    check_on_bf16_operands("Softmax::with_sinks",
                           ak::make_spec(Causal{}, ak::Softmax::with_sinks(sinks)), c);
    // Cosine logits: the normalized query is rounded, so |d cos| <= u, and the logit is
    // log(d) log(N) cos.
    check_on_bf16_operands("SoftplusL1", ak::make_spec(Causal{}, ak::SoftplusL1{}), c,
                           kU * std::log(double(d)) * std::log(double(c.kv_len)));
  }
}

TEST_CASE("bf16 products: a 16K context, 64 queries at its end", "[attention][bf16]") {
  const UsingKernel kernel(fastest_kernel_here());
  INFO(kernel.name());
  const Case c = Case{}.lengths(64, 16384).heads(2, 1).dims(64).on_threads(2);
  check_on_bf16_operands("Causal", ak::make_spec(Causal{}), c);
}

TEST_CASE("bf16 products: on f32 inputs, within the bound of rounding Q, K, V and P",
          "[attention][bf16]") {
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  for (const Index d : {32, 80, 128})
    for (const Index lq : {40, 130}) {
      const Case c = Case{}.lengths(lq, 2 * lq + 75).heads(4, 2).dims(d).laid_out(Layout::Bhsd);
      INFO(ak::test::describe(c));
      const ak::test::Inputs<float> in(c, 3);
      const std::vector<double> q = values_of(in.q), k = values_of(in.k), v = values_of(in.v);
      const double scale = double(1.f / std::sqrt(float(d)));
      ak::test::Tolerance t;
      t.logit = logit_shift(c, q, k, scale);
      t.out = (2 * kU + kU * kU) * max_abs(v) + ak::test::tol::kF32;
      INFO("logit shift <= " << t.logit);
      const auto spec = ak::make_spec(Causal{});
      ak::test::check_agreement(ak::test::agreement(spec, c, in, bf16_products_on(spec, in), t));
      const auto sig = ak::make_spec(ak::Full{}, ak::Sigmoid{});
      ak::test::check_agreement(ak::test::agreement(sig, c, in, bf16_products_on(sig, in), t));
      // The rounding is there: against the exact f32 kernel the output moves.
      const auto run = [&](Products how) {
        return ak::test::run_into<decltype(spec)>(
                   c,
                   [&](const ak::View<float>& o, const ak::Options& options) {
                     ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o,
                                   options.with_products(how));
                   })
            .out;
      };
      const std::vector<float> exact = run(Products::Exact), rounded = run(Products::Bf16);
      double moved = 0.0;
      for (std::size_t i = 0; i < exact.size(); ++i)
        moved = std::max(moved, double(std::abs(exact[i] - rounded[i])));
      INFO("bf16 against exact products: max |diff| " << moved);
      CHECK(moved > 10 * ak::test::tol::kF32);
    }
}

TEST_CASE("bf16 products: RoPE turns the rows before they are rounded", "[attention][bf16]") {
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  // The turned rows keep their norms, so |d logit| <= scale |q| |k| (2u + u^2).
  const Case c = Case{}.lengths(100, 300).heads(2, 1).dims(64);
  const ak::test::Inputs<float> in(c, 5);
  const auto norms = [&](const ak::test::Tensor<float>& x) {
    double m = 0.0;
    const std::vector<double> val = values_of(x);
    for (std::size_t r = 0; r * 64 < val.size(); ++r) {
      double n = 0.0;
      for (std::size_t x2 = 0; x2 < 64; ++x2) n += val[r * 64 + x2] * val[r * 64 + x2];
      m = std::max(m, std::sqrt(n));
    }
    return m;
  };
  ak::test::Tolerance t;
  t.logit = 0.125 * norms(in.q) * norms(in.k) * (2 * kU + kU * kU);
  t.out = (2 * kU + kU * kU) * max_abs(values_of(in.v)) + ak::test::tol::kF32;
  const auto spec = ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(64, 10000, 512)));
  ak::test::check_agreement(ak::test::agreement(spec, c, in, bf16_products_on(spec, in), t));
}

TEST_CASE("bf16 products: bitwise identical for 1..3 threads; decode stays exact",
          "[attention][bf16][threads]") {
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  const auto spec = ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{300, 0}));
  for (const Index lq : {5, 200}) {
    const Case c = Case{}.lengths(lq, 1100).heads(4, 2).dims(64).on_threads(1);
    INFO(ak::test::describe(c));
    const ak::test::Inputs<float> in(c, 9);
    const auto run = [&](const Case& with, Products how) {
      return ak::test::bytes_of(ak::test::run_into<decltype(spec)>(
          with, [&](const ak::View<float>& o, const ak::Options& options) {
            ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o,
                          options.with_products(how));
          }));
    };
    const auto one = run(c, Products::Bf16);
    for (int t = 2; t <= 3; ++t) {
      INFO("threads " << t);
      CHECK(run(Case{c}.on_threads(t), Products::Bf16) == one);
    }
    // Lq <= 16 runs split-KV decode, which keeps f32 products.
    CHECK((run(c, Products::Exact) == one) == (lq <= ak::kMaxDecodeQueries));
  }
}

TEST_CASE("bf16 products: split-KV decode rounds where it runs the tile kernel (Sigmoid)",
          "[attention][bf16]") {
  // Softmax decode runs the row engine, which keeps f32 products (above); a normalizer the
  // row engine does not take (Sigmoid) runs the tile kernel's chunks, which take the mode.
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  const std::vector<float> biases = ak::test::head_biases(4);
  const auto spec = ak::make_spec(Causal{}, ak::Sigmoid::per_head(biases));
  const Case c = Case{}.lengths(4, 1100).heads(4, 2).dims(64);
  check_on_bf16_operands("Sigmoid, split-KV decode", spec, c);
  const ak::test::Inputs<bf16> in(c, 7);
  const auto run = [&](Products how) {
    return ak::test::bytes_of(ak::test::run_into<decltype(spec)>(
        c, [&](const ak::View<float>& o, const ak::Options& options) {
          ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options.with_products(how));
        }));
  };
  CHECK(run(Products::Bf16) != run(Products::Exact));  // P rounded
}

TEST_CASE("bf16 products: an Options::products value that is no mode is an Error",
          "[attention][bf16][errors]") {
  const Case c = Case{}.lengths(8, 8).heads(1, 1).dims(32);
  const ak::test::Inputs<float> in(c, 1);
  ak::test::Tensor<float> o(c.layout, 1, 1, 8, 32);
  ak::test::check_error(
      [&] {
        ak::attention(ak::make_spec(Causal{}), in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                      ak::Options{}.with_products(static_cast<Products>(7)));
      },
      {"products", "Products::Exact, Bf16 or Int8", "7"});
}

TEST_CASE("bf16 products: the vdpbf16ps kernel agrees with f32 FMAs on the same operands",
          "[attention][bf16]") {
  if (!ak::gemm::kHasBf16Dot) SKIP("this build has no AVX512-BF16 (vdpbf16ps)");
  // Both multiply the same bf16 operands and add in f32; only the order of the additions (and
  // subnormal products, flushed by the instruction) differs. So the logits agree to f32 level,
  // and with them the LSE (its row sums are of the f32 weights); a weight that lies next to a
  // bf16 rounding boundary may round to neighbouring values in the two (2u apart), which
  // bounds the outputs' difference by 2u max|v|.
  for (const Index d : {32, 80, 128})
    for (const Index lq : {70, 200}) {
      const Case c = Case{}.lengths(lq, lq + 900).heads(4, 1).dims(d).laid_out(Layout::Bshd);
      INFO(ak::test::describe(c));
      const ak::test::Inputs<float> in(c, 13);
      const auto spec = ak::make_spec(Causal{} & SlidingWindow{500, 0});
      const auto run = [&](Bf16Kernel k) {
        const UsingKernel using_kernel(k);
        return ak::test::run_into<decltype(spec)>(c, bf16_products_on(spec, in));
      };
      const ak::test::KernelResult f32 = run(Bf16Kernel::RoundedF32),
                                   pairs = run(Bf16Kernel::PairProducts);
      double out = 0.0, lse = 0.0;
      for (std::size_t i = 0; i < f32.out.size(); ++i)
        out = std::max(out, double(std::abs(f32.out[i] - pairs.out[i])));
      for (std::size_t i = 0; i < f32.lse.size(); ++i)
        lse = std::max(lse, double(std::abs(f32.lse[i] - pairs.lse[i])));
      INFO("max |diff| out " << out << ", LSE " << lse);
      CHECK(lse <= ak::test::tol::kLseF32);
      CHECK(out <= 2 * kU * max_abs(values_of(in.v)) + ak::test::tol::kF32);
      CHECK(ak::test::bytes_of(f32) != ak::test::bytes_of(pairs));  // two kernels ran
    }
}

TEST_CASE("bf16 products: gemm_bf16 matches the double product of its bf16 operands",
          "[gemm][bf16]") {
#ifndef ATTNKIT_BF16_DOT
  SKIP("this build has no AVX512-BF16 (vdpbf16ps)");
#else
  for (const Index m : {1, 5, 6, 13})
    for (const Index k : {1, 2, 7, 64, 129})
      for (const Index n : {16, 64, 80}) {
        INFO("m " << m << " k " << k << " n " << n);
        std::vector<float> a(std::size_t(m * k)), b(std::size_t(k * n));
        std::uint32_t x = 1234567u + std::uint32_t(m * 1000 + k * 10 + n);
        const auto next = [&x] {
          x = x * 1664525u + 1013904223u;
          return ak::detail::round_to_bf16(float(int(x >> 8) - (1 << 23)) / float(1 << 23));
        };
        for (float& v : a) v = next();
        for (float& v : b) v = next();
        const Index lda = k + k % 2, ldc = n + 16;
        std::vector<std::uint16_t> ap(std::size_t(m * lda));
        std::vector<std::uint32_t> bp(std::size_t((k + 1) / 2 * n));
        ak::gemm::pack_bf16_rows(a.data(), k, 1, m, k, ap.data(), lda);
        ak::gemm::pack_bf16_pairs(b.data(), n, k, n, bp.data(), n);
        std::vector<float> c(std::size_t(m * ldc), 0.5f);
        for (const bool accumulate : {false, true}) {
          ak::gemm::gemm_bf16(m, n, k, ap.data(), lda, bp.data(), n, c.data(), ldc, accumulate);
          double worst = 0.0;
          for (Index i = 0; i < m; ++i)
            for (Index j = 0; j < n; ++j) {
              double want = 0.0, size = 0.0;
              for (Index p = 0; p < k; ++p) {
                want += double(a[std::size_t(i * k + p)]) * b[std::size_t(p * n + j)];
                size += std::abs(double(a[std::size_t(i * k + p)]) * b[std::size_t(p * n + j)]);
              }
              worst = std::max(
                  worst, std::abs(c[std::size_t(i * ldc + j)] - (accumulate ? 2 * want : want)) /
                             (1.0 + size));
            }
          CHECK(worst <= 4 * k * 6e-8);  // f32 additions: k of them, each within 2^-24 relative
          CHECK(c[std::size_t(ldc - 1)] == 0.5f);  // nothing past n
        }
      }
#endif
}

TEST_CASE("bf16 products: Auto rounds only where a kernel makes them faster", "[attention][bf16]") {
  // Auto (gemm::bf16_products_here()): vdpbf16ps on AMD CPUs; elsewhere the products stay
  // exact, bit for bit, since no kernel there is faster than exact products.
  const Case c = Case{}.lengths(150, 400).heads(2, 1).dims(64).on_threads(1);
  const ak::test::Inputs<float> in(c, 4);
  const auto spec = ak::make_spec(Causal{});
  const auto run = [&](Products how) {
    return ak::test::bytes_of(ak::test::run_into<decltype(spec)>(
        c, [&](const ak::View<float>& o, const ak::Options& options) {
          ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o,
                        options.with_products(how));
        }));
  };
  INFO("Auto rounds here: " << ak::gemm::bf16_products_here()
                            << ", on vdpbf16ps: " << ak::gemm::pair_products_chosen());
  CHECK((run(Products::Bf16) == run(Products::Exact)) == !ak::gemm::bf16_products_here());
  CHECK(ak::gemm::pair_products_chosen() == ak::gemm::bf16_products_here());
}

TEST_CASE("bf16 products: a masked key's infinite value reaches only the rows that see it",
          "[attention][bf16][nonfinite]") {
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  // Causal prefill: key 150's value is +inf; rows 0..149 do not see it (their tiles are
  // Partial there, and the packed pairs hold the inf), rows 150.. do.
  const Case c = Case{}.lengths(300, 300).heads(2, 1).dims(64).laid_out(Layout::Bhsd);
  ak::test::Inputs<bf16> in(c, 8);
  const double v_max = max_abs(values_of(in.v));
  for (Index x = 0; x < 64; ++x) in.v.view.row(0, 0, 150)[x] = bf16(INFINITY);
  const auto spec = ak::make_spec(Causal{});
  ak::test::Tensor<float> o(Layout::Bhsd, 1, 2, 300, 64);
  ak::test::Tensor<double> want(Layout::Bhsd, 1, 2, 300, 64);
  ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                c.options().with_products(Products::Bf16));
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), want.view);
  double worst = 0.0;
  bool clean = true, reached = true;
  for (Index h = 0; h < 2; ++h)
    for (Index r = 0; r < 300; ++r)
      for (Index x = 0; x < 64; ++x) {
        const float got = o.view.row(0, h, r)[x];
        if (r < 150) {
          clean = clean && std::isfinite(got);
          worst = std::max(worst, std::abs(double(got) - want.view.row(0, h, r)[x]));
        } else {
          reached = reached && !std::isfinite(got);
        }
      }
  INFO("rows before the key: max |error| " << worst);
  CHECK(clean);
  CHECK(reached);
  CHECK(worst <= kU * v_max + ak::test::tol::kF32);
}

TEST_CASE("bf16 products: a masked key's f32 value that rounds to inf reaches no other row",
          "[attention][bf16][nonfinite]") {
  // 3.4e38 is finite in f32 and +inf once rounded to bf16: the guard must judge the values as
  // the products see them. Causal, f32 inputs, key 40's first value poisoned: rows 0..39 do not
  // see it and must equal the same call on the clean value (up to the order of f32 sums).
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  const Case c = Case{}.lengths(100, 100).heads(1, 1).dims(32).laid_out(Layout::Bhsd);
  ak::test::Inputs<float> in(c, 9);
  const auto spec = ak::make_spec(Causal{});
  ak::test::Tensor<float> clean(Layout::Bhsd, 1, 1, 100, 32), poisoned(Layout::Bhsd, 1, 1, 100, 32);
  in.v.view.row(0, 0, 40)[0] = 0.f;
  ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), clean.view,
                c.options().with_products(Products::Bf16));
  in.v.view.row(0, 0, 40)[0] = 3.4e38f;
  ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), poisoned.view,
                c.options().with_products(Products::Bf16));
  double worst = 0.0;
  bool finite = true;
  for (Index r = 0; r < 40; ++r)
    for (Index x = 0; x < 32; ++x) {
      const float got = poisoned.view.row(0, 0, r)[x];
      finite = finite && std::isfinite(got);
      worst = std::max(worst, std::abs(double(got) - double(clean.view.row(0, 0, r)[x])));
    }
  INFO("rows before the key: max |poisoned - clean| " << worst);
  CHECK(finite);
  CHECK(worst <= ak::test::tol::kF32);
}

TEST_CASE("bf16 products: subnormal values, within the bound's absolute term n 2^-126",
          "[attention][bf16][nonfinite]") {
  // The relative bound u max|v| holds for normal operands only: vdpbf16ps flushes subnormal
  // operands and products to 0 (measured: V of 1e-39 moved outputs by 0.61 max|v|). On bf16
  // operands (only P rounds) with every odd key's value subnormal, each output stays within
  // u max|v| + n 2^-126 of the f64 reference, n the row's keys.
  const UsingKernel kernel(kernel_here());
  INFO(kernel.name());
  const Case c = Case{}.lengths(64, 64).heads(1, 1).dims(64).laid_out(Layout::Bhsd);
  ak::test::Inputs<bf16> in(c, 21);
  for (Index j = 1; j < 64; j += 2)
    for (Index x = 0; x < 64; ++x)
      in.v.view.row(0, 0, j)[x] = bf16(1e-39f * float(in.v.view.row(0, 0, j)[x]));
  const double v_max = max_abs(values_of(in.v));
  const auto spec = ak::make_spec(Causal{});
  ak::test::Tensor<float> o(Layout::Bhsd, 1, 1, 64, 64);
  ak::test::Tensor<double> want(Layout::Bhsd, 1, 1, 64, 64);
  ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                c.options().with_products(Products::Bf16));
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), want.view, c.options());
  constexpr double kMinNormal = 0x1p-126;
  bool within = true;
  for (Index i = 0; i < 64; ++i)
    for (Index x = 0; x < 64; ++x) {
      const double err = std::abs(double(o.view.row(0, 0, i)[x]) - want.view.row(0, 0, i)[x]);
      within = within && err <= kU * v_max + double(i + 1) * kMinNormal;  // NaN fails
    }
  CHECK(within);
}
