// topk_attention(): with every key a query sees selected it is dense causal attention (within
// reassociation); random selections (-1 gaps, empty rows, any order) against
// reference::topk_attention() for MHA, GQA and MQA, f32 and bf16, with the LSE, for the
// softmax engine (dsa/topk_softmax.hpp, sinks too; its rows in place or widened by
// dsa/selected_rows.hpp: f32 and bf16, head dims of whole vectors or not) and the tiled path
// (a Softcap score, a Sigmoid normalizer); the thread count changes no bit; bad selections
// are refused before anything is written (dsa/topk_checks.hpp).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <attnkit/dsa/reference.hpp>
#include <attnkit/dsa/selected_rows.hpp>
#include <attnkit/dsa/topk_attention.hpp>
#include <attnkit/dsa/topk_checks.hpp>
#include <attnkit/dsa/topk_softmax.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/backward_check.hpp"
#include "support/dsa_cases.hpp"
#include "support/error_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;

namespace {

// f32 kernel against f64: sums of up to a few hundred f32 products.
constexpr double kF32 = 2e-5;

using Shape = ak::test::TopkShape;
std::vector<std::int32_t> selection(const Shape& s, bool all, std::uint32_t seed) {
  return ak::test::topk_selection(s, all, seed);
}

// The kernel and the reference on the same inputs; the worst relative errors of o and LSE.
template <class T, class Spec>
std::pair<double, double> against_reference(const Spec& spec, const Shape& s,
                                            const std::vector<std::int32_t>& sel, int threads,
                                            std::vector<float>* bits = nullptr) {
  Tensor<T> q(Layout::Bshd, s.B, s.Hq, s.Lq, s.D), k(Layout::Bhsd, s.B, s.Hkv, s.Lk, s.D),
      v(Layout::Bshd, s.B, s.Hkv, s.Lk, s.Dv);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  Tensor<float> o(Layout::Bshd, s.B, s.Hq, s.Lq, s.Dv);
  Tensor<double> want(Layout::Bshd, s.B, s.Hq, s.Lq, s.Dv);
  std::vector<float> lse(std::size_t(s.B * s.Hq * s.Lq));
  const ak::TopkKeys keys{ak::bhsd(sel.data(), s.B, 1, s.Lq, s.topk)};
  constexpr bool kSoftmax = std::is_same_v<typename Spec::Normalizer, ak::Softmax>;
  auto options = ak::Options{}.with_threads(threads);
  if (kSoftmax) options = options.with_lse(lse.data(), Index(lse.size()));  // its statistic
  ak::topk_attention(spec, q.cview(), k.cview(), v.cview(), o.view, keys, options);
  ak::reference::topk_attention(spec, q.cview(), k.cview(), v.cview(), want.view, keys);
  if (bits != nullptr) {
    bits->assign(o.memory.begin(), o.memory.end());
    bits->insert(bits->end(), lse.begin(), lse.end());
  }
  // The LSE against the log of the reference's softmax sum, rebuilt in double.
  double lse_err = 0;
  if constexpr (kSoftmax) {
    const double scale = 1.0 / std::sqrt(double(s.D));
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.Hq; ++h)
        for (Index t = 0; t < s.Lq; ++t) {
          double m = -std::numeric_limits<double>::infinity(), sum = 0;
          std::vector<double> x;
          for (Index i = 0; i < s.topk; ++i) {
            const std::int32_t j = sel[std::size_t((b * s.Lq + t) * s.topk + i)];
            if (j < 0) continue;
            double dot = 0;
            for (Index c = 0; c < s.D; ++c)
              dot += double(float(q.view.row(b, h, t)[c])) *
                     double(float(k.view.row(b, h / (s.Hq / s.Hkv), j)[c]));
            x.push_back(dot * scale);
            m = std::max(m, dot * scale);
          }
          if (!spec.normalizer.sinks.empty()) {
            x.push_back(double(spec.normalizer.sinks[std::size_t(h)]));
            m = std::max(m, x.back());
          }
          for (const double y : x) sum += std::exp(y - m);
          const double got = lse[std::size_t((b * s.Hq + h) * s.Lq + t)];
          if (x.empty())
            CHECK(got == -std::numeric_limits<float>::infinity());  // exact: no key
          else
            lse_err = std::max(lse_err, std::abs(got - (m + std::log(sum))));
        }
  }
  return {ak::test::relative_error(o.view, want.view), lse_err};
}

}  // namespace

TEST_CASE("topk_attention: every key a query sees selected is dense causal attention",
          "[dsa][topk_attention]") {
  Shape s;
  s.topk = s.Lk;
  const auto sel = selection(s, true, 1);
  Tensor<float> q(Layout::Bshd, s.B, s.Hq, s.Lq, s.D), k(Layout::Bhsd, s.B, s.Hkv, s.Lk, s.D),
      v(Layout::Bshd, s.B, s.Hkv, s.Lk, s.Dv), o(Layout::Bshd, s.B, s.Hq, s.Lq, s.Dv),
      dense(Layout::Bshd, s.B, s.Hq, s.Lq, s.Dv);
  q.randomize(4);
  k.randomize(5);
  v.randomize(6);
  ak::topk_attention(ak::make_spec(), q.cview(), k.cview(), v.cview(), o.view,
                     ak::TopkKeys{ak::bhsd(sel.data(), s.B, 1, s.Lq, s.topk)});
  ak::attention(ak::make_spec(ak::Causal{}), q.cview(), k.cview(), v.cview(), dense.view);
  CHECK(ak::test::relative_error(o.view, dense.view) <= kF32);
}

TEST_CASE("topk_attention against reference::topk_attention", "[dsa][topk_attention]") {
  Shape gqa, mha, mqa, odd;
  mha.Hkv = mha.Hq = 4;
  mqa.Hkv = 1;
  mqa.Hq = 16;
  odd.D = 20;  // K rows read in place to an odd depth; V rows of whole vectors, in place too
  odd.Dv = 48;
  for (const Shape& s : {gqa, mha, mqa, odd}) {
    INFO("Hq " << s.Hq << " Hkv " << s.Hkv << " D " << s.D << " Dv " << s.Dv);
    const auto sel = selection(s, false, 7);
    const auto e = against_reference<float>(ak::make_spec(), s, sel, 2);
    CHECK(e.first <= kF32);
    CHECK(e.second <= kF32);
    const auto bf = against_reference<Eigen::bfloat16>(ak::make_spec(), s, sel, 2);
    CHECK(bf.first <= kF32);  // bf16 inputs widen exactly; f32 compute
    std::vector<float> sinks(std::size_t(s.Hq));
    for (Index h = 0; h < s.Hq; ++h) sinks[std::size_t(h)] = 0.3f * float(h) - 1.f;
    const auto with_sinks =
        against_reference<float>(ak::make_spec(ak::Softmax::with_sinks(sinks)), s, sel, 2);
    CHECK(with_sinks.first <= kF32);
    CHECK(with_sinks.second <= kF32);
    // The tiled path: another Score, another Normalizer.
    CHECK(against_reference<float>(ak::make_spec(ak::Softcap{5.f}), s, sel, 2).first <= kF32);
    CHECK(against_reference<float>(ak::make_spec(ak::Sigmoid{-2.f}), s, sel, 2).first <= kF32);
  }
}

TEST_CASE("topk_attention: the thread count changes no bit", "[dsa][topk_attention]") {
  const Shape s;
  const auto sel = selection(s, false, 9);
  std::vector<float> one, two, three;
  against_reference<float>(ak::make_spec(), s, sel, 1, &one);
  against_reference<float>(ak::make_spec(), s, sel, 2, &two);
  against_reference<float>(ak::make_spec(), s, sel, 3, &three);
  CHECK(one == two);
  CHECK(one == three);
  // Decode: one query, 48 heads over one KV head (their heads split over the threads).
  const Shape d{/*B*/ 1,    /*Hq*/ 48, /*Hkv*/ 1, /*Lq*/ 1, /*Lk*/ 300, /*D*/ 32, /*Dv*/ 24,
                /*topk*/ 64};
  const auto dsel = selection(d, false, 10);
  std::vector<float> d1, d2, d3;
  CHECK(against_reference<float>(ak::make_spec(), d, dsel, 1, &d1).first <= kF32);
  CHECK(against_reference<float>(ak::make_spec(), d, dsel, 2, &d2).first <= kF32);
  against_reference<float>(ak::make_spec(), d, dsel, 3, &d3);
  CHECK(d1 == d2);
  CHECK(d1 == d3);
}

TEST_CASE(
    "topk_attention: decode's key slices merge to the reference, the same bits for any "
    "thread count",
    "[dsa][topk_attention]") {
  // Two queries over two KV heads (4 items, fewer than kTopkSliceBelow): each item's 1200
  // selection entries run as slices of kTopkSliceKeys (512), one of them all -1, merged in
  // order; 20 heads a KV head (two parts of 10 with enough threads), with and without sinks.
  const Shape d{/*B*/ 1,      /*Hq*/ 40, /*Hkv*/ 2, /*Lq*/ 2,
                /*Lk*/ 1500,  /*D*/ 32,  /*Dv*/ 24,
                /*topk*/ 1200};
  static_assert(ak::detail::kTopkSliceKeys == 512 && ak::detail::kTopkSliceBelow > 4);
  auto sel = selection(d, false, 11);
  std::fill(sel.begin() + 512, sel.begin() + 1024, -1);  // query 0's second slice: no key
  std::vector<float> sinks(std::size_t(d.Hq));
  for (Index h = 0; h < d.Hq; ++h) sinks[std::size_t(h)] = 0.25f * float(h % 9) - 1.f;
  for (const bool with_sinks : {false, true}) {
    INFO((with_sinks ? "sinks" : "no sinks"));
    const auto spec = with_sinks ? ak::make_spec(ak::Softmax::with_sinks(sinks)) : ak::make_spec();
    std::vector<float> b1, b2, b3;
    const auto e = against_reference<float>(spec, d, sel, 1, &b1);
    CHECK(e.first <= kF32);
    CHECK(e.second <= kF32);
    against_reference<float>(spec, d, sel, 2, &b2);
    against_reference<float>(spec, d, sel, 3, &b3);
    CHECK(b1 == b2);
    CHECK(b1 == b3);
  }
}

TEST_CASE("topk_attention: bad selections throw Error before anything is written",
          "[dsa][topk_attention]") {
  using ak::test::check_refused;
  const Index B = 1, H = 2, L = 8, D = 8, K = 3;
  Tensor<float> q(Layout::Bhsd, B, H, L, D), k(Layout::Bhsd, B, 1, L, D),
      v(Layout::Bhsd, B, 1, L, D), o(Layout::Bhsd, B, H, L, D);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  o.fill(42.f);
  std::vector<std::int32_t> sel(static_cast<std::size_t>(L * K), -1);
  const auto call = [&](bool causal = true) {
    ak::topk_attention(ak::make_spec(), q.cview(), k.cview(), v.cview(), o.view,
                       ak::TopkKeys{ak::bhsd(sel.data(), B, 1, L, K), causal});
  };
  sel[std::size_t(5 * K + 1)] = 8;
  check_refused([&] { call(); }, {"keys.indices[0, 0, 5, 1]", "[0, 8)", "8"}, {&o.memory});
  sel[std::size_t(5 * K + 1)] = 6;
  check_refused([&] { call(); }, {"keys.indices[0, 0, 5, 1]", "<= 5", "6"}, {&o.memory});
  call(false);  // not causal: a later key is allowed
  o.fill(42.f);
  sel[std::size_t(5 * K + 1)] = 2;
  sel[std::size_t(5 * K + 2)] = 2;
  check_refused([&] { call(); }, {"keys.indices[0, 0, 5, 2]", "2 twice"}, {&o.memory});
  sel[std::size_t(5 * K + 2)] = -3;
  check_refused([&] { call(); }, {"keys.indices[0, 0, 5, 2]", "-3"}, {&o.memory});
  check_refused(
      [&] {
        ak::topk_attention(ak::make_spec(), q.cview(), k.cview(), v.cview(), o.view,
                           ak::TopkKeys{ak::bhsd(sel.data(), B, 1, L, 0)});
      },
      {"keys.indices.dim (topk)", ">= 1", "0"}, {&o.memory});
  check_refused(
      [&] {
        ak::topk_attention(ak::make_spec(), q.cview(), k.cview(), v.cview(), o.view,
                           ak::TopkKeys{ak::bhsd(sel.data(), B, 1, L - 1, K)});
      },
      {"keys.indices.seq", "8", "7"}, {&o.memory});
  const auto over_o = ak::View<const std::int32_t>(
      ak::bhsd(reinterpret_cast<const std::int32_t*>(o.memory.data()), B, 1, L, K));
  check_refused(
      [&] {
        ak::topk_attention(ak::make_spec(), q.cview(), k.cview(), v.cview(), o.view,
                           ak::TopkKeys{over_o});
      },
      {"o", "keys.indices", "overlapping"}, {&o.memory});
}

TEST_CASE("topk_attention: MLA's latent, the values a view of the keys' first dims",
          "[dsa][topk_attention]") {
  const Index L = 50, H = 8, D = 40, Dv = 24, K = 16;
  Shape s;
  s.B = 1;
  s.Hq = H;
  s.Hkv = 1;
  s.Lq = s.Lk = L;
  s.D = D;
  s.Dv = Dv;
  s.topk = K;
  const auto sel = selection(s, false, 13);
  Tensor<float> q(Layout::Bshd, 1, H, L, D), latent(Layout::Bhsd, 1, 1, L, D),
      o(Layout::Bshd, 1, H, L, Dv);
  Tensor<double> want(Layout::Bshd, 1, H, L, Dv);
  q.randomize(1);
  latent.randomize(2);
  ak::View<const float> values = latent.cview();
  values.dim = Dv;  // the first 24 of each latent row, the same memory
  const ak::TopkKeys keys{ak::bhsd(sel.data(), 1, 1, L, K)};
  ak::topk_attention(ak::make_spec(), q.cview(), latent.cview(), values, o.view, keys);
  ak::reference::topk_attention(ak::make_spec(), q.cview(), latent.cview(), values, want.view,
                                keys);
  CHECK(ak::test::relative_error(o.view, want.view) <= kF32);
}
