// attention_backward(): the fast path against reference::attention_backward() (f64) for every
// normalizer with a backward face (LSSAR's three passes and its fallback rows too), masks of
// each kind, Softcap, ALiBi, RoPE, GQA, ragged tiles, layouts, offsets and storage types;
// bitwise identical gradients for 1..4 threads; masked keys that hold NaN never reach a
// gradient; every bad input refused before a write. The engine under test:
// kernel/backward/backward_tiles.hpp with kernel/backward/backward_rows.hpp,
// kernel/backward/backward_stages.hpp and (TAPA) kernel/tiles/owned_products.hpp; the parameter
// gradients go through param_grads.hpp.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/backward/backward_keys.hpp>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/chunked.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/power_of_two.hpp>
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
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catalogue.hpp"
#include "support/error_checks.hpp"
#include "support/keep_if.hpp"
#include "support/test_names.hpp"

using ak::Causal;
using ak::SlidingWindow;
using ak::test::Case;
using ak::test::check_backward;
using ak::test::kNegInf;

namespace {

// Each normalizer with a backward face (support/catalogue.hpp), per-head parameters sized for
// `heads`.
template <class Visit>
void for_each_normalizer(Index heads, Visit&& visit) {
  ak::test::for_each_normalizer<ak::test::HasBackward>(
      heads, [&](const std::string& name, const auto& n) { visit(name.c_str(), n); });
}

}  // namespace

TEST_CASE("attention_backward: every normalizer matches the reference, causal and windowed",
          "[backward]") {
  for (const Case& c : {Case{}.lengths(77, 77).dims(32),
                        Case{}.lengths(70, 300).heads(4, 2).dims(48).laid_out(Layout::Bshd),
                        Case{}.lengths(33, 90).dims(64, 40).at_offset(20)})
    for_each_normalizer(c.q_heads, [&](const char* name, const auto& n) {
      const std::string s(name);
      check_backward(s + ", Causal", ak::make_spec(Causal{}, n), c);
      check_backward(s + ", Causal & SlidingWindow{24, 0}",
                     ak::make_spec(Causal{} & SlidingWindow{24, 0}, n), c);
      check_backward(s + ", Full", ak::make_spec(n), c);
    });
}

// From kContiguousCopyQueries queries on, strided f32 Q, K, V and dO are read from contiguous
// copies (detail::tile_rows); below it, in place.
TEST_CASE(
    "attention_backward: BSHD and padded inputs (copied or read in place) match the reference",
    "[backward]") {
  for (const Index q_len : {ak::detail::kContiguousCopyQueries - 1, Index{300}})
    for (const Layout layout : {Layout::Bshd, Layout::Padded}) {
      Case c = Case{}.lengths(q_len, 300).heads(4, 2).dims(48).laid_out(layout);
      check_backward("Softmax, Causal", ak::make_spec(Causal{}), c);
    }
}

TEST_CASE("attention_backward: each kind of mask and score mod matches the reference",
          "[backward]") {
  const Case c = Case{}.lengths(150, 150).heads(2, 1).dims(32).laid_out(Layout::Padded);
  check_backward("Chunked{64} | SlidingWindow{10, 10}",
                 ak::make_spec(ak::Chunked{64} | SlidingWindow{10, 10}), c);
  check_backward("Causal & (Sinks{4} | SlidingWindow{40, 0})",
                 ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{40, 0})), c);
  check_backward("PowerOfTwo{2, 8}", ak::make_spec(ak::PowerOfTwo{2, 8}), c);
  check_backward(
      "BlockMask(Causal & SlidingWindow{50, 0}, 64 x 128)",
      ak::make_spec(ak::make_block_mask(Causal{} & SlidingWindow{50, 0}, 150, 150, 64, 128)), c);
  check_backward("Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}), c);
  check_backward("Causal, Alibi::standard(2)", ak::make_spec(Causal{}, ak::Alibi::standard(2)), c);
  check_backward("Sigmoid, Softcap{5}", ak::make_spec(ak::Sigmoid{}, ak::Softcap{5.f}), c);
  const ak::SoftplusL1Reweighted lssar;
  check_backward("LSSAR, Causal & (Sinks{4} | SlidingWindow{40, 0})",
                 ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{40, 0}), lssar), c);
  check_backward("LSSAR, PowerOfTwo{2, 8}", ak::make_spec(ak::PowerOfTwo{2, 8}, lssar), c);
  check_backward("LSSAR, Chunked{64} | SlidingWindow{10, 10}",
                 ak::make_spec(ak::Chunked{64} | SlidingWindow{10, 10}, lssar), c);
  check_backward("LSSAR, Causal, Softcap{0.5}", ak::make_spec(Causal{}, lssar, ak::Softcap{0.5f}),
                 c);
}

TEST_CASE("attention_backward: RoPE gradients turn back by the transposed rotation",
          "[backward][position]") {
  const Case c = Case{}.lengths(70, 140).heads(4, 2).dims(32);
  const ak::Rope rope(ak::RopeTable(32, 10000, 256));
  check_backward("Causal, Rope", ak::make_spec(Causal{}, rope), c);
  check_backward("Causal, Rope, Sigmoid", ak::make_spec(Causal{}, rope, ak::Sigmoid{}), c);
  check_backward(
      "Causal, Rope(GptJ), SoftplusL1",
      ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(16, 500, 256), ak::RopePairing::GptJ),
                    ak::SoftplusL1{}),
      Case{c}.dims(32));
  check_backward("Causal, Rope, SoftplusL1Reweighted{3}",
                 ak::make_spec(Causal{}, rope, ak::SoftplusL1Reweighted{3.f}), c);
}

TEST_CASE("attention_backward: FoPE gradients and its coefficients' gradient",
          "[backward][position]") {
  ak::FopeConfig fc{32, 256, 100};  // train_len 100 clips the low frequencies
  fc.kv_heads = 2;
  fc.q_heads = 4;
  const ak::Fope fope = ak::Fope::drawn(fc, 0.3, 3);
  const Case c = Case{}.lengths(70, 140).heads(4, 2).dims(32);
  check_backward("Causal, Fope", ak::make_spec(Causal{}, fope), c);
  check_backward("Causal & SlidingWindow{40, 0}, Fope, Sigmoid",
                 ak::make_spec(Causal{} & SlidingWindow{40, 0}, fope, ak::Sigmoid{}), c);
  fc.padding = ak::FopePadding::ReferenceCode;
  check_backward("Causal, Fope (reference-code padding), SoftplusL1",
                 ak::make_spec(Causal{}, ak::Fope::drawn(fc, 0.3, 4), ak::SoftplusL1{}), c);
  check_backward("Causal, Fope (reference-code padding), SoftplusL1Reweighted",
                 ak::make_spec(Causal{}, ak::Fope::drawn(fc, 0.3, 4), ak::SoftplusL1Reweighted{}),
                 c);
}

TEST_CASE("attention_backward: TAPA splits dS into its amplitude and phase products",
          "[backward][position]") {
  // d 33: the split (17 amplitude dims) falls inside a SIMD vector; theta 1: no phase part.
  for (const Case& c : {Case{}.lengths(70, 300).heads(4, 2).dims(33, 20),
                        Case{}.lengths(3, 300).heads(4, 1).dims(64).at_offset(40)}) {
    check_backward("Causal, Tapa", ak::make_spec(Causal{}, ak::Tapa{}), c);
    check_backward("Causal, Tapa{0.3, 0.7}, Softcap{5}",
                   ak::make_spec(Causal{}, ak::Tapa{0.3f, 0.7f}, ak::Softcap{5.f}), c);
    check_backward("Full, Tapa{0.1, 1}, Sigmoid", ak::make_spec(ak::Tapa{0.1f, 1.f}, ak::Sigmoid{}),
                   c);
  }
}

TEST_CASE("attention_backward: bf16 and f16 inputs and gradients", "[backward]") {
  const Case c = Case{}.lengths(65, 130).heads(4, 2).dims(32);
  const auto spec = ak::make_spec(Causal{} & SlidingWindow{50, 0});
  check_backward<Eigen::bfloat16>("bf16 inputs", spec, c);
  check_backward<Eigen::half>("f16 inputs", spec, c);
  check_backward<float, Eigen::bfloat16>("bf16 gradients", spec, c);
  check_backward<Eigen::half, Eigen::half>("f16 inputs and gradients", spec, c);
  const auto lssar = ak::make_spec(Causal{} & SlidingWindow{50, 0}, ak::SoftplusL1Reweighted{});
  check_backward<Eigen::bfloat16>("LSSAR, bf16 inputs", lssar, c);
  check_backward<float, Eigen::half>("LSSAR, f16 gradients", lssar, c);
}

TEST_CASE("attention_backward: LSSAR rows that fell back to the LSSA weights take LSSA's backward",
          "[backward][lssar]") {
  // Under Causal with q_offset 0, row 0 sees one key; keys 0 and 1 are made equal, so row 1
  // sees two equal cosines; row 5's query is zero (every cosine 0). The three take the LSSA
  // weights with statistic -inf (row 1 the only one whose dk is not 0 by construction: LSSA's
  // dS moves its two keys apart). The other rows keep their r.
  const Case c = Case{}.lengths(70, 70).heads(4, 2).dims(32).at_offset(0);
  for (const float p : {15.f, 3.f}) {
    const auto spec = ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{p});
    ak::test::BackwardCase<> in(spec, c);
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index x = 0; x < c.dim; ++x) in.q.view.row(0, h, 5)[x] = 0.f;
    for (Index h = 0; h < c.kv_heads; ++h)
      for (Index x = 0; x < c.dim; ++x) in.k.view.row(0, h, 1)[x] = in.k.view.row(0, h, 0)[x];
    in.forward(spec);
    for (Index h = 0; h < c.q_heads; ++h) {
      INFO("head " << h);
      for (const Index r : {0, 1, 5}) REQUIRE(in.stat[std::size_t(h * c.q_len + r)] == kNegInf);
      REQUIRE(std::isfinite(in.stat[std::size_t(h * c.q_len + 6)]));
    }
    check_backward(p == 15.f ? "LSSAR{15}, fallback rows" : "LSSAR{3}, fallback rows", spec, in);
  }
}

TEST_CASE("attention_backward: decode-like and single-row calls", "[backward]") {
  for (const Index lq : {1, 3, 16})
    for_each_normalizer(4, [&](const char* name, const auto& n) {
      check_backward(name, ak::make_spec(Causal{}, n),
                     Case{}.lengths(lq, 600).heads(4, 1).dims(64));
    });
}

namespace {

template <class G>
std::vector<unsigned char> bytes_of(const ak::test::Grads<G>& g) {
  std::vector<unsigned char> out;
  for (const auto* m : {&g.dq.memory, &g.dk.memory, &g.dv.memory}) {
    const auto* p = reinterpret_cast<const unsigned char*>(m->data());
    out.insert(out.end(), p, p + m->size() * sizeof(G));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(g.param.data());
  out.insert(out.end(), p, p + g.param.size() * sizeof(float));
  return out;
}

}  // namespace

TEST_CASE("attention_backward: gradients are bitwise identical for 1..4 threads",
          "[backward][threads]") {
  for_each_normalizer(4, [&](const char* name, const auto& n) {
    const auto spec = ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{60, 0}), n);
    ak::test::BackwardCase<> in(spec, Case{}.lengths(150, 330).heads(4, 2).batches(2).dims(32));
    INFO(name);
    ak::test::Grads<float> g(in.c, in.c.layout);
    in.c.threads = 1;
    ak::test::run_backward(spec, in, g);
    const auto one = bytes_of(g);
    for (int t = 2; t <= 4; ++t) {
      INFO("threads " << t);
      in.c.threads = t;
      g.dq.fill(0.f);
      g.dk.fill(0.f);
      g.dv.fill(0.f);
      ak::test::run_backward(spec, in, g);
      CHECK(bytes_of(g) == one);
    }
  });
}

TEST_CASE("attention_backward: NaN and inf in masked keys and values reach no gradient",
          "[backward][nonfinite]") {
  // Keys and values past row 100 are poison; the causal queries at 0..99 never see them.
  const Case c = Case{}.lengths(100, 160).heads(1, 1).at_offset(0).dims(32);
  for_each_normalizer(1, [&](const char* name, const auto& n) {
    const auto spec = ak::make_spec(Causal{}, n);
    ak::test::BackwardCase<> in(spec, c);
    ak::test::Grads<float> clean(c, c.layout), poisoned(c, c.layout);
    ak::test::run_backward(spec, in, clean);
    for (Index j = 100; j < 160; ++j)
      for (Index x = 0; x < 32; ++x) {
        in.k.view.row(0, 0, j)[x] = x % 2 ? ak::test::kNaN : ak::test::kInf;
        in.v.view.row(0, 0, j)[x] = x % 2 ? ak::test::kInf : ak::test::kNaN;
      }
    ak::test::run_backward(spec, in, poisoned);
    INFO(name);
    CHECK(ak::test::max_abs_diff(poisoned.dq.view, clean.dq.view) == 0.0);
    CHECK(ak::test::max_abs_diff(poisoned.dv.view, clean.dv.view) == 0.0);
    bool masked_keys_zero = true;  // dK of keys no query sees: exactly 0
    for (Index j = 100; j < 160; ++j)
      for (Index x = 0; x < 32; ++x)
        masked_keys_zero = masked_keys_zero && poisoned.dk.view.row(0, 0, j)[x] == 0.f;
    CHECK(masked_keys_zero);
  });
}

TEST_CASE(
    "attention_backward: NaN keys inside a Partial tile, masked for every row, reach no gradient",
    "[backward][nonfinite]") {
  // keep() alone: every tile Partial, every pair asked. Keys j % 3 == 1 are masked for all
  // rows, yet sit in the tiles the kernel multiplies: poison there must not leak (0 * NaN).
  const auto mask =
      ak::test::keep_if([](Index, Index, Index i, Index j) { return j <= i && j % 3 != 1; });
  const Case c = Case{}.lengths(90, 90).heads(1, 1).dims(32);
  for_each_normalizer(1, [&](const char* name, const auto& n) {
    const auto spec = ak::make_spec(mask, n);
    ak::test::BackwardCase<> in(spec, c);
    ak::test::Grads<float> clean(c, c.layout), poisoned(c, c.layout);
    ak::test::run_backward(spec, in, clean);
    for (Index j = 1; j < 90; j += 3)
      for (Index x = 0; x < 32; ++x) {
        in.k.view.row(0, 0, j)[x] = ak::test::kNaN;
        in.v.view.row(0, 0, j)[x] = ak::test::kInf;
      }
    ak::test::run_backward(spec, in, poisoned);
    INFO(name);
    CHECK(ak::test::max_abs_diff(poisoned.dq.view, clean.dq.view) == 0.0);
    CHECK(ak::test::max_abs_diff(poisoned.dk.view, clean.dk.view) == 0.0);
    CHECK(ak::test::max_abs_diff(poisoned.dv.view, clean.dv.view) == 0.0);
  });
}

TEST_CASE(
    "attention_backward: one KV head, its query tiles in parts, as the reference and "
    "bitwise over threads",
    "[backward][threads]") {
  // B * Hkv = 1 < kBackwardSplitBelow: the item's 11 query tiles run as 8 parts on
  // any number of threads, their dK / dV summed in part order; Fope's coefficients and the
  // sinks' gradients sum over the parts' slots.
  const Case c = Case{}.lengths(700, 700).heads(4, 1).dims(32);
  ak::Problem shape;
  shape.batch = 1, shape.q_heads = 4, shape.kv_heads = 1, shape.q_len = shape.kv_len = 700;
  shape.head_dim = shape.value_dim = 32;
  REQUIRE(ak::detail::backward_parts(shape, 32, 32) == 8);
  check_backward("MQA, Causal, sinks",
                 ak::make_spec(Causal{}, ak::Softmax::with_sinks({0.5f, -1.f, 0.f, 2.f})), c);
  check_backward("MQA, Causal, LSSAR", ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), c);
  ak::FopeConfig cfg{32, 1024, 300};
  cfg.kv_heads = 1;
  cfg.q_heads = 4;
  const auto spec = ak::make_spec(Causal{}, ak::Fope::drawn(cfg, 0.3, 5));
  check_backward("MQA, Causal, Fope", spec, c);
  ak::test::BackwardCase<> in(spec, c);
  ak::test::Grads<float> g(in.c, in.c.layout);
  in.c.threads = 1;
  ak::test::run_backward(spec, in, g);
  const auto one = bytes_of(g);
  const std::vector<float> position_one = g.position;
  for (int t = 2; t <= 3; ++t) {
    INFO("threads " << t);
    in.c.threads = t;
    ak::test::run_backward(spec, in, g);
    CHECK(bytes_of(g) == one);
    CHECK(g.position == position_one);
  }
}

TEST_CASE("attention_backward: a NaN or inf row of dO reaches only the keys its query sees",
          "[backward][nonfinite]") {
  // Causal: query row 2 sees keys 0..2. With dO row 2 poisoned, the gradients of keys 3..99
  // (which row 2 does not see) and dQ of every other row must be those of a dO whose row 2
  // is 0 (a masked pair's gradient is exactly zero, whatever dO holds), bit for bit.
  const Case c = Case{}.lengths(100, 100).heads(1, 1).dims(32);
  for (const float poison : {ak::test::kNaN, ak::test::kInf}) {
    for_each_normalizer(1, [&](const char* name, const auto& n) {
      const auto spec = ak::make_spec(Causal{}, n);
      ak::test::BackwardCase<> in(spec, c);
      ak::test::Grads<float> zero_row(c, c.layout), poisoned(c, c.layout);
      for (Index x = 0; x < 32; ++x) in.d_o.view.row(0, 0, 2)[x] = 0.f;
      ak::test::run_backward(spec, in, zero_row);
      for (Index x = 0; x < 32; ++x) in.d_o.view.row(0, 0, 2)[x] = x % 3 ? 0.5f : poison;
      ak::test::run_backward(spec, in, poisoned);
      INFO(name << ", dO row 2 holds " << poison);
      bool unseen_same = true, others_same = true;
      for (Index j = 3; j < 100; ++j)
        for (Index x = 0; x < 32; ++x)
          unseen_same = unseen_same &&
                        poisoned.dk.view.row(0, 0, j)[x] == zero_row.dk.view.row(0, 0, j)[x] &&
                        poisoned.dv.view.row(0, 0, j)[x] == zero_row.dv.view.row(0, 0, j)[x];
      for (Index i = 0; i < 100; ++i)
        for (Index x = 0; i != 2 && x < 32; ++x)
          others_same =
              others_same && poisoned.dq.view.row(0, 0, i)[x] == zero_row.dq.view.row(0, 0, i)[x];
      CHECK(unseen_same);
      CHECK(others_same);
      CHECK_FALSE(std::isfinite(poisoned.dv.view.row(0, 0, 0)[0]));  // a key row 2 sees
    });
  }
}

TEST_CASE("attention_backward: an empty batch or no query takes the forward's Options",
          "[backward]") {
  // A training loop's empty batch: the forward accepts Options without a statistic buffer for
  // zero rows, so the backward must too (nothing to read or write).
  constexpr std::size_t kFloats = 2 * 2 * 8 * 16;  // [batch 2, heads 2, seq 8, dim 16]
  std::vector<float> x(kFloats, 1.f), o(kFloats, 0.f), d_o(kFloats, 1.f), dq(kFloats, 42.f),
      dk(kFloats, 42.f), dv(kFloats, 42.f);
  const auto in = [&](Index b, Index s) {
    return ak::bhsd(static_cast<const float*>(x.data()), b, 2, s, 16);
  };
  const auto out = [](std::vector<float>& y, Index b, Index s) {
    return ak::bhsd(y.data(), b, 2, s, 16);
  };
  const auto spec = ak::make_spec(Causal{});
  for (const auto& [batch, q_len] : {std::pair<Index, Index>{0, 8}, {2, 0}}) {
    INFO("batch " << batch << ", q_len " << q_len);
    const ak::Options options;  // as the forward took them: no row statistic
    ak::attention(spec, in(batch, q_len), in(batch, 8), in(batch, 8), out(o, batch, q_len),
                  options);
    CHECK_NOTHROW(ak::attention_backward(
        spec, in(batch, q_len), in(batch, 8), in(batch, 8),
        ak::bhsd(static_cast<const float*>(o.data()), batch, 2, q_len, 16),
        ak::bhsd(static_cast<const float*>(d_o.data()), batch, 2, q_len, 16), out(dq, batch, q_len),
        out(dk, batch, 8), out(dv, batch, 8), options));
  }
  // Keys with no query: their gradients are zero (written), dq has no row.
  CHECK(std::all_of(dk.begin(), dk.end(), [](float y) { return y == 0.f; }));
}

TEST_CASE("attention_backward: rows that see no key get zero gradients", "[backward]") {
  // Queries 0..19 at positions -20..-1 (q_offset -20) see no key under Causal.
  check_backward("Causal, q_offset -20", ak::make_spec(Causal{}),
                 Case{}.lengths(60, 60).at_offset(-20).dims(32));
  check_backward("Sigmoid, Causal, q_offset -20", ak::make_spec(Causal{}, ak::Sigmoid{}),
                 Case{}.lengths(60, 60).at_offset(-20).dims(32));
  check_backward("LSSAR, Causal, q_offset -20", ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}),
                 Case{}.lengths(60, 60).at_offset(-20).dims(32));
}

TEST_CASE("row_statistic_of: the statistic each normalizer's backward reads", "[backward]") {
  STATIC_REQUIRE(ak::row_statistic_of<ak::Softmax>() == ak::RowStat::LogSumExp);
  STATIC_REQUIRE(ak::row_statistic_of<ak::Sigmoid>() == ak::RowStat::None);
  STATIC_REQUIRE(ak::row_statistic_of<ak::ReluPower>() == ak::RowStat::Sum);
  STATIC_REQUIRE(ak::row_statistic_of<ak::SoftplusL1>() == ak::RowStat::Sum);
  STATIC_REQUIRE(ak::row_statistic_of<ak::SoftplusL1Reweighted>() == ak::RowStat::LogSumExp);
  STATIC_REQUIRE(ak::detail::backward_passes<ak::SoftplusL1Reweighted>() == 3);
  STATIC_REQUIRE(ak::detail::backward_passes<ak::SoftplusL1>() == 1);
}

TEST_CASE("attention_backward: bad input throws Error naming it, before any write",
          "[backward][errors]") {
  const auto spec = ak::make_spec(Causal{});
  const Case c = Case{}.lengths(20, 20).heads(1, 1).dims(16);
  ak::test::BackwardCase<> in(spec, c);
  ak::test::Grads<float> g(c, Layout::Bhsd);
  g.dq.fill(42.f);
  g.dk.fill(42.f);
  g.dv.fill(42.f);
  const auto refused = [&](auto&& call, std::initializer_list<const char*> parts) {
    ak::test::check_error(call, parts);
    CHECK(g.dq.holds(42.f));
    CHECK(g.dk.holds(42.f));
    CHECK(g.dv.holds(42.f));
  };
  const auto Q = in.q.cview();
  const auto K = in.k.cview();
  const auto V = in.v.cview();
  const auto O = in.o.cview();
  const auto dO = in.d_o.cview();
  const ak::Options with_stat = in.options_for(spec);
  ak::test::Tensor<float> wrong(Layout::Bhsd, 1, 1, 20, 8);  // dim 8 instead of 16
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, wrong.view, g.dk.view, g.dv.view, with_stat);
      },
      {"dq.dim: expected 16 (q.dim)", "got 8"});
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, wrong.view, g.dv.view, with_stat);
      },
      {"dk.dim: expected 16 (k.dim)"});
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, wrong.cview(), g.dq.view, g.dk.view, g.dv.view,
                               with_stat);
      },
      {"d_o.dim: expected 16 (v.dim)"});
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, g.dk.view, g.dv.view, c.options());
      },
      {"Options.lse", "row statistic", "nullptr"});
  // gradients aliasing an input, or each other
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, in.k.view, g.dv.view, with_stat);
      },
      {"dk: expected memory disjoint from k"});
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, g.dk.view, in.d_o.view, with_stat);
      },
      {"dv: expected memory disjoint from d_o"});
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, g.dq.view, g.dv.view, with_stat);
      },
      {"dq: expected memory disjoint from dk"});
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, g.dk.view, g.dv.view, with_stat,
                               ak::ParamGrads{}.with_normalizer(in.stat.data() + 3, 1));
      },
      {"ParamGrads.normalizer: expected memory disjoint from lse"});
  // A statistic or gradient buffer carries its size: one float short (or long) is refused.
  std::vector<float> short_stat(in.stat.begin(), in.stat.end() - 1), two_heads(2);
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, g.dk.view, g.dv.view,
                               with_stat.with_lse(short_stat));
      },
      {"Options.lse.size(): expected 20", "got 19"});
  refused(
      [&] {
        ak::attention_backward(spec, Q, K, V, O, dO, g.dq.view, g.dk.view, g.dv.view, with_stat,
                               ak::ParamGrads{}.with_normalizer(two_heads));
      },
      {"ParamGrads.normalizer.size(): expected 1 (q.heads), got 2"});
  refused(
      [&] {
        std::vector<float> d(1);
        const auto lssa = ak::make_spec(Causal{}, ak::SoftplusL1{});
        ak::attention_backward(lssa, Q, K, V, O, dO, g.dq.view, g.dk.view, g.dv.view, with_stat,
                               ak::ParamGrads{}.with_normalizer(d));
      },
      {"ParamGrads.normalizer: expected nullptr (this normalizer has no trained parameter)"});
  refused(
      [&] {
        const auto sig = ak::make_spec(Causal{}, ak::Sigmoid{});
        ak::attention_backward(sig, Q, K, V, O, dO, g.dq.view, g.dk.view, g.dv.view, with_stat);
      },
      {"lse: expected nullptr (this normalizer has no row statistic)"});
  refused(
      [&] {
        const auto sinks = ak::make_spec(Causal{}, ak::Softmax::with_sinks({1.f, 2.f}));
        ak::attention_backward(sinks, Q, K, V, O, dO, g.dq.view, g.dk.view, g.dv.view, with_stat);
      },
      {"Softmax.sinks.size()"});
}

TEST_CASE("KeyGrads: rows zeroed as far as the key tiles reach, parts summed over their rows",
          "[backward]") {
  // kernel/backward/backward_keys.hpp: a part's rows past those it wrote hold garbage (NaN here)
  // and must not be read; the sum keeps part order and zeroes the keys no part reached.
  constexpr Index kLen = 5, kD = 2, kDv = 1;
  std::vector<float> k(kLen * kD, 7.f), v(kLen * kDv, 7.f);
  ak::detail::KeyGrads acc;
  acc.d_pad = kD, acc.dv_pad = kDv;
  acc.begin(k.data(), v.data());
  acc.reach(2);
  CHECK(acc.zeroed == 2);
  CHECK(k == std::vector<float>{0, 0, 0, 0, 7, 7, 7, 7, 7, 7});
  acc.reach(1);  // nothing below the mark again
  k[0] = 3.f;
  acc.reach(3);
  CHECK(k[0] == 3.f);
  CHECK(acc.zeroed == 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Two parts: part 0 wrote 2 rows, part 1 wrote 4; the rest of each is garbage.
  std::vector<float> parts_k(2 * kLen * kD, nan), parts_v(2 * kLen * kDv, nan);
  for (Index i = 0; i < 2 * kD; ++i) parts_k[std::size_t(i)] = 1.f + float(i);
  for (Index i = 0; i < 4 * kD; ++i) parts_k[std::size_t(kLen * kD + i)] = 10.f;
  for (Index i = 0; i < 2; ++i) parts_v[std::size_t(i)] = 0.5f;
  for (Index i = 0; i < 4; ++i) parts_v[std::size_t(kLen + i)] = 2.f;
  const Index written[2] = {2, 4};
  acc.begin(k.data(), v.data());
  acc.sum_parts(parts_k.data(), parts_v.data(), 2, kLen, written);
  CHECK(k == std::vector<float>{11, 12, 13, 14, 10, 10, 10, 10, 0, 0});
  CHECK(v == std::vector<float>{2.5f, 2.5f, 2, 2, 0});
}
