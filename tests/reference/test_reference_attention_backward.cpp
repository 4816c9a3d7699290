// reference::attention_backward() checked independently of the fast kernel: central finite
// differences of the f64 forward reference::attention() with the loss L = sum dO * O, for every
// policy with a backward face (normalizers and their per-head parameters, masks, Softcap,
// ALiBi, RoPE, cosine logits; LSSAR with its fallback rows), GQA and offsets. Inputs are f64,
// so the differences resolve the derivative to about 1e-10 and the named tolerance
// (tol::kFdRel) is far from both.
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <attnkit/position/fope.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/score/alibi.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <string>
#include <vector>

#include "support/backward_check.hpp"
#include "support/test_names.hpp"

using ak::Causal;
using ak::test::Case;
using ak::test::Tensor;

namespace {

struct F64Inputs {
  Tensor<double> q, k, v, d_o;
  explicit F64Inputs(const Case& c)
      : q(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dim),
        k(Layout::Bhsd, c.batch, c.kv_heads, c.kv_len, c.dim),
        v(Layout::Bhsd, c.batch, c.kv_heads, c.kv_len, c.dv()),
        d_o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv()) {
    q.randomize(3, c.stddev);
    k.randomize(4, c.stddev);
    v.randomize(5);
    d_o.randomize(6);
  }
};

// L = sum dO * O of the f64 forward on `in`.
template <class Spec>
double loss(const Spec& spec, const Case& c, const F64Inputs& in) {
  Tensor<double> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, c.options());
  double l = 0.0;
  for (std::size_t i = 0; i < o.memory.size(); ++i) l += o.memory[i] * in.d_o.memory[i];
  return l;
}

// Every element of x's gradient `grad` against (L(x + h) - L(x - h)) / 2h, but those of the
// row `frozen` of batch 0 (in elements [frozen * dim, (frozen + 1) * dim) of each head).
template <class Spec>
void check_by_differences(const char* what, const Spec& spec, const Case& c, F64Inputs& in,
                          Tensor<double>& x, const Tensor<double>& grad, Index frozen = -1) {
  double worst = 0.0, scale = 1e-30;
  for (std::size_t e = 0; e < x.memory.size(); ++e) {
    if (frozen >= 0 && Index(e) / x.view.dim % x.view.seq == frozen &&
        Index(e) / (x.view.dim * x.view.seq * x.view.heads) == 0)
      continue;
    const double keep = x.memory[e], h = ak::test::tol::kFdStep;
    x.memory[e] = keep + h;
    const double up = loss(spec, c, in);
    x.memory[e] = keep - h;
    const double down = loss(spec, c, in);
    x.memory[e] = keep;
    worst = std::max(worst, std::abs((up - down) / (2 * h) - grad.memory[e]));
    scale = std::max(scale, std::abs(grad.memory[e]));
  }
  INFO(what << ": worst difference " << worst << " of largest element " << scale);
  CHECK(worst <= ak::test::tol::kFdRel * std::max(1.0, scale));
}

// zero_query >= 0: that query row (every head of batch 0) is zero. Its cosines are 0 by
// convention and jump to O(1) for any q near 0, so its dq is not checked by differences.
template <class Spec>
void check_reference(const std::string& name, const Spec& spec, const Case& c,
                     Index zero_query = -1) {
  INFO(name << ", " << ak::test::describe(c));
  F64Inputs in(c);
  for (Index h = 0; zero_query >= 0 && h < c.q_heads; ++h)
    for (Index x = 0; x < c.dim; ++x) in.q.view.row(0, h, zero_query)[x] = 0.0;
  Tensor<double> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  ak::test::Grads<double> g(c, Layout::Bhsd);
  std::vector<float> stat(static_cast<std::size_t>(c.rows()));
  ak::Options options = c.options();
  if constexpr (ak::detail::row_stat_kind<typename Spec::Normalizer>() != ak::RowStat::None)
    options = options.with_lse(stat);
  ak::reference::attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                                    in.d_o.cview(), g.dq.view, g.dk.view, g.dv.view, options);
  check_by_differences("dq", spec, c, in, in.q, g.dq, zero_query);
  check_by_differences("dk", spec, c, in, in.k, g.dk);
  check_by_differences("dv", spec, c, in, in.v, g.dv);
}

const Case kSmall = Case{}.lengths(5, 7).heads(2, 1).dims(4, 3);

}  // namespace

TEST_CASE("reference::attention_backward: each normalizer matches finite differences",
          "[reference][backward]") {
  const auto window = Causal{} & (ak::Sinks{1} | ak::SlidingWindow{2, 0});
  check_reference("Softmax, Causal", ak::make_spec(Causal{}), kSmall);
  check_reference("Softmax::with_sinks, window",
                  ak::make_spec(window, ak::Softmax::with_sinks({0.5f, -1.f})), kSmall);
  check_reference("Sigmoid::per_head, window",
                  ak::make_spec(window, ak::Sigmoid::per_head({-1.f, 0.5f})), kSmall);
  check_reference("ReluPower{1.5, 0.1}, Causal", ak::make_spec(Causal{}, ak::ReluPower{1.5f, 0.1f}),
                  kSmall);
  check_reference("SoftplusL1, Causal", ak::make_spec(Causal{}, ak::SoftplusL1{}), kSmall);
  check_reference("SoftplusL1Reweighted{15}, Causal",
                  ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), kSmall);
  check_reference("SoftplusL1Reweighted{3}, window",
                  ak::make_spec(window, ak::SoftplusL1Reweighted{3.f}), kSmall);
}

TEST_CASE("reference::attention_backward: LSSAR's fallback rows match finite differences",
          "[reference][backward][lssar]") {
  // q_offset 0: row 0 sees one key; row 3's query is zero (its cosines all 0). Both take the
  // LSSA weights (statistic -inf); the others keep their r, p = 15 and 3.
  const Case c = Case{kSmall}.at_offset(0);
  check_reference("SoftplusL1Reweighted{15}, Causal, fallback rows",
                  ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), c, 3);
  check_reference("SoftplusL1Reweighted{3}, Full, fallback row",
                  ak::make_spec(ak::SoftplusL1Reweighted{3.f}), c, 3);
}

TEST_CASE("reference::attention_backward: score mods, RoPE and TAPA match finite differences",
          "[reference][backward]") {
  check_reference("Softcap{1.5}, Full", ak::make_spec(ak::Softcap{1.5f}),
                  Case{kSmall}.at_offset(2));
  check_reference("Alibi::standard(2), Causal", ak::make_spec(Causal{}, ak::Alibi::standard(2)),
                  kSmall);
  const ak::Rope rope(ak::RopeTable(4, 100, 16));
  check_reference("Rope, Causal", ak::make_spec(Causal{}, rope), kSmall);
  check_reference("Tapa{0.3, 0.5}, Causal", ak::make_spec(Causal{}, ak::Tapa{0.3f, 0.5f}), kSmall);
  check_reference("Tapa{0.1, 0.75}, Softcap{2}, ReluPower",
                  ak::make_spec(ak::Tapa{0.1f, 0.75f}, ak::Softcap{2.f}, ak::ReluPower{1.5f, 0.f}),
                  Case{kSmall}.at_offset(3));
  check_reference("Rope, SoftplusL1, Softcap{0.5}",
                  ak::make_spec(rope, ak::SoftplusL1{}, ak::Softcap{0.5f}), kSmall);
  check_reference("Rope, SoftplusL1Reweighted{3}, Softcap{0.5}",
                  ak::make_spec(rope, ak::SoftplusL1Reweighted{3.f}, ak::Softcap{0.5f}), kSmall);
}

TEST_CASE("reference::attention_backward: per-head parameter gradients match finite differences",
          "[reference][backward]") {
  // The sink logits (Softmax), the bias (Sigmoid, ReluPower): L at parameter +- h.
  F64Inputs in(kSmall);
  const auto check_param = [&](const char* name, auto make, std::vector<float> base) {
    INFO(name);
    const auto spec = ak::make_spec(Causal{}, make(base));
    Tensor<double> o(Layout::Bhsd, 1, 2, 5, 3);
    ak::test::Grads<double> g(kSmall, Layout::Bhsd);
    std::vector<float> stat(10), param(2);
    ak::Options options = kSmall.options();
    if constexpr (ak::detail::row_stat_kind<typename decltype(spec)::Normalizer>() !=
                  ak::RowStat::None)
      options = options.with_lse(stat);
    ak::reference::attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                                      in.d_o.cview(), g.dq.view, g.dk.view, g.dv.view, options,
                                      ak::ParamGrads{}.with_normalizer(param));
    for (std::size_t h = 0; h < 2; ++h) {
      // f32 parameters: a step of 2^-8 keeps them exact; the difference is then exact to h^2.
      const float step = 1.f / 256;
      std::vector<float> up = base, down = base;
      up[h] += step;
      down[h] -= step;
      const double fd = (loss(ak::make_spec(Causal{}, make(up)), kSmall, in) -
                         loss(ak::make_spec(Causal{}, make(down)), kSmall, in)) /
                        (2.0 * step);
      INFO("head " << h << ": finite difference " << fd << ", reference " << param[h]);
      CHECK(std::abs(fd - param[h]) <= 1e-4 * std::max(1.0, std::abs(fd)));
    }
  };
  check_param("Softmax sinks", [](std::vector<float> s) { return ak::Softmax::with_sinks(s); },
              {0.25f, -0.5f});
  check_param("Sigmoid bias", [](std::vector<float> b) { return ak::Sigmoid::per_head(b); },
              {-1.f, 0.5f});
}

TEST_CASE("reference::attention_backward: FoPE rows and coefficients match finite differences",
          "[reference][backward][position]") {
  ak::FopeConfig fc{4, 16, 0};
  fc.q_heads = 2;  // one coefficient set for both query heads (GQA)
  const ak::Fope fope = ak::Fope::drawn(fc, 0.3, 5);
  check_reference("Fope, Causal", ak::make_spec(Causal{}, fope), kSmall);
  ak::FopeConfig clipped = fc;
  clipped.padding = ak::FopePadding::ReferenceCode;
  clipped.train_len = 8;  // clips the lower frequency: one kept pair, one padded
  check_reference("Fope (clipped, reference-code padding), Sigmoid",
                  ak::make_spec(Causal{}, ak::Fope::drawn(clipped, 0.3, 6), ak::Sigmoid{}), kSmall);

  // dL/dC and dL/dS against (L(c + h) - L(c - h)) / 2h, each coefficient in double.
  F64Inputs in(kSmall);
  const ak::FopeTable& table = *fope.table;
  const auto with = [&](std::vector<double> cc, std::vector<double> ss) {
    return ak::make_spec(Causal{}, ak::Fope::with_coefficients(table.config(), cc, ss));
  };
  const auto spec = with(table.cos_coef(), table.sin_coef());
  Tensor<double> o(Layout::Bhsd, 1, 2, 5, 3);
  ak::test::Grads<double> g(kSmall, Layout::Bhsd);
  std::vector<float> stat(10), coef_grad(static_cast<std::size_t>(fope.param_count()));
  ak::reference::attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                                    in.d_o.cview(), g.dq.view, g.dk.view, g.dv.view,
                                    kSmall.options().with_lse(stat),
                                    ak::ParamGrads{}.with_position(coef_grad));
  const std::size_t per = table.cos_coef().size();  // one set: C then S
  REQUIRE(coef_grad.size() == 2 * per);
  for (std::size_t e = 0; e < 2 * per; ++e) {
    std::vector<double> up_c = table.cos_coef(), up_s = table.sin_coef();
    std::vector<double> down_c = up_c, down_s = up_s;
    const double h = ak::test::tol::kFdStep;
    (e < per ? up_c[e] : up_s[e - per]) += h;
    (e < per ? down_c[e] : down_s[e - per]) -= h;
    const double fd =
        (loss(with(up_c, up_s), kSmall, in) - loss(with(down_c, down_s), kSmall, in)) / (2 * h);
    INFO("coefficient " << e << ": finite difference " << fd << ", reference " << coef_grad[e]);
    CHECK(std::abs(fd - double(coef_grad[e])) <= 1e-5 * std::max(1.0, std::abs(fd)));
  }
}
