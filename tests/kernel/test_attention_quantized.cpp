// attention() and decode() on block-quantized K/V (BlockQ8_0, BlockQ4_0: storage/blocks.hpp,
// read through storage/storage_rows.hpp and, in the decode row engine, simd/int_widen.hpp)
// against the f64 reference of the stored values (reference::attention() dequantizes them):
// Lq 1 to 16 (the row engine, split-KV decode and the tile kernel), ragged Lk, GQA 1 / 4 / 8,
// masks, every normalizer, Softcap and RoPE, K and V quantized together and each alone, f32
// and bf16 queries, padded layouts, bitwise stability over thread counts; and the error
// against the unquantized K/V, within the bound the rounding implies; and the shared latent of
// MLA (K and V views of one buffer); attention_varlen() over quantized views.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/kernel/varlen.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/storage/quantize.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::BlockQ4_0;
using ak::BlockQ8_0;
using ak::test::storage_name;

namespace {

// attention() and, for Lq <= kMaxDecodeQueries, decode() on the same inputs (K of storage K,
// V of V, Q of TQ), each against the reference of the stored values at f32 tolerances.
template <class K, class V, class TQ = float, class Spec>
void check_both(const std::string& what, const Spec& spec, const Case& c, std::uint32_t seed = 5) {
  INFO(what << ", " << ak::test::describe(c) << ", K " << storage_name<K>() << ", V "
            << storage_name<V>() << ", Q " << storage_name<TQ>());
  const ak::test::Inputs<K, TQ, V> in(c, seed);
  ak::test::check_attention_on(spec, c, in);
  if (c.q_len > ak::kMaxDecodeQueries) return;
  INFO("decode()");
  ak::test::check_agreement(
      ak::test::agreement(spec, c, in, [&](const ak::View<float>& o, const ak::Options& options) {
        ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
      }));
}

}  // namespace

TEST_CASE("quantized K/V: q8_0 and q4_0 match the reference over Lq 1..16, ragged Lk and GQA",
          "[attention][quant]") {
  const auto spec = ak::make_spec(Causal{});
  struct Heads {
    Index q, kv;
  };
  for (const Index lq : {1, 2, 5, 16})
    for (const Index lk : {1, 45, 300, 2500})
      for (const Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{8, 1}}) {
        const Case c = Case{}.lengths(lq, lk).heads(h.q, h.kv).dims(64, 32).laid_out(
            lq % 2 == 1 ? Layout::Padded : Layout::Bshd);
        check_both<BlockQ8_0, BlockQ8_0>("Causal", spec, c);
        check_both<BlockQ4_0, BlockQ4_0>("Causal", spec, c);
      }
}

TEST_CASE("quantized K/V: K or V quantized alone, bf16 queries, d 128, masks",
          "[attention][quant]") {
  for (const Index lq : {1, 3, 40}) {
    const Case c = Case{}.lengths(lq, 700).heads(4, 2).dims(128);
    check_both<BlockQ8_0, float>("Causal & SlidingWindow{200, 0}",
                                 ak::make_spec(Causal{} & SlidingWindow{200, 0}), c);
    check_both<float, BlockQ4_0>("Causal & (Sinks{4} | SlidingWindow{64, 0})",
                                 ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{64, 0})),
                                 c);
    check_both<BlockQ8_0, BlockQ4_0, Eigen::bfloat16>("Causal", ak::make_spec(Causal{}), c);
  }
}

TEST_CASE("quantized K/V: every normalizer, Softcap and RoPE read quantized rows",
          "[attention][quant]") {
  const Index heads = 4;
  const std::vector<float> sinks = ak::test::head_sinks(heads);
  const std::vector<float> biases = ak::test::head_biases(heads);
  const auto mask = Causal{} & SlidingWindow{90, 0};
  for (const Index lq : {2, 130}) {
    const Case c = Case{}.lengths(lq, 333).heads(heads, 2).dims(64);
    check_both<BlockQ8_0, BlockQ8_0>("Softmax::with_sinks",
                                     ak::make_spec(mask, ak::Softmax::with_sinks(sinks)), c);
    check_both<BlockQ4_0, BlockQ8_0>("Sigmoid::per_head",
                                     ak::make_spec(mask, ak::Sigmoid::per_head(biases)), c);
    check_both<BlockQ8_0, BlockQ4_0>("ReluPower{1.5, 0.3}",
                                     ak::make_spec(mask, ak::ReluPower{1.5f, 0.3f}), c);
    check_both<BlockQ4_0, BlockQ4_0>("SoftplusL1 (cosine logits: norms of quantized rows)",
                                     ak::make_spec(mask, ak::SoftplusL1{}), c);
    check_both<BlockQ8_0, BlockQ8_0>("Softcap{5}", ak::make_spec(mask, ak::Softcap{5.f}), c);
    check_both<BlockQ4_0, BlockQ8_0>("Rope (keys turned from their quantized values)",
                                     ak::make_spec(mask, ak::Rope(ak::RopeTable(64, 10000, 512))),
                                     c);
  }
}

TEST_CASE("quantized K/V: output and LSE are bitwise identical for 1..4 threads",
          "[attention][quant][threads]") {
  const auto spec = ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{300, 0}));
  for (const Index lq : {1, 4, 150}) {
    const Case c = Case{}.lengths(lq, 3000).heads(8, 2).dims(64).on_threads(1);
    INFO(ak::test::describe(c));
    const ak::test::Inputs<BlockQ8_0, float, BlockQ4_0> in(c, 9);
    const auto run = [&](const Case& with) {
      return ak::test::bytes_of(
          ak::test::run_into<decltype(spec)>(with, ak::test::attention_on(spec, in)));
    };
    const auto one = run(c);
    for (int t = 2; t <= 4; ++t) {
      INFO("threads " << t);
      CHECK(run(Case{c}.on_threads(t)) == one);
    }
  }
}

TEST_CASE("quantized K/V: the error against unquantized K/V is within the rounding's bound",
          "[attention][quant]") {
  // Softmax over logits each moved by at most delta moves each weight by a factor within
  // e^(+-2 delta), so sum |dw| <= e^(2 delta) - 1, and the output by at most (e^(2 delta) - 1)
  // max|v| + max|dv| -- plus the f32 rounding of both runs. delta = max over query rows i and
  // keys j of scale |q_i . (k_j - k^_j)|, computed here in double from the inputs (the exact
  // and the dequantized keys), not from any output.
  const Case c = Case{}.lengths(16, 1500).heads(4, 2).dims(64).laid_out(Layout::Bhsd);
  const auto spec = ak::make_spec(Causal{});
  const auto check = [&](auto block_tag) {
    using Block = decltype(block_tag);
    const ak::test::Inputs<Block, float, Block> quantized(c, 21);
    const ak::test::Inputs<float> exact(c, 21);
    const std::vector<float> q = exact.q.values(), k = exact.k.values(), v = exact.v.values();
    const std::vector<float> kq = quantized.k.values(), vq = quantized.v.values();
    const Index d = c.dim, group = c.q_heads / c.kv_heads;
    double delta = 0.0, v_max = 0.0, dv = 0.0;
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index i = 0; i < c.q_len; ++i)
        for (Index j = 0; j < c.kv_len; ++j) {
          const float* qi = q.data() + (h * c.q_len + i) * d;
          const Index at = (h / group * c.kv_len + j) * d;
          double dot = 0.0;
          for (Index x = 0; x < d; ++x)
            dot += double(qi[x]) * (double(k[std::size_t(at + x)]) - kq[std::size_t(at + x)]);
          delta = std::max(delta, std::abs(dot) / std::sqrt(double(d)));
        }
    for (std::size_t i = 0; i < v.size(); ++i) {
      v_max = std::max(v_max, std::abs(double(v[i])));
      dv = std::max(dv, std::abs(double(v[i]) - vq[i]));
    }
    const double bound = std::expm1(2.0 * delta) * v_max + dv + 2.0 * ak::test::tol::kF32;
    const auto out = [&](const auto& in) {
      return ak::test::run_into<decltype(spec)>(c, ak::test::attention_on(spec, in)).out;
    };
    const std::vector<float> a = out(quantized), b = out(exact);
    double err = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, double(std::abs(a[i] - b[i])));
    INFO(storage_name<Block>() << ": logit shift <= " << delta << ", max |dv| " << dv << ", bound "
                               << bound << ", error against f32 K/V " << err);
    CHECK(err <= bound);
    CHECK(err > 0.0);  // the rounding is there: the comparison is not of a run with itself
  };
  check(BlockQ8_0{});
  check(BlockQ4_0{});
}

TEST_CASE("shared latent (MLA): K and V views of one buffer, f32 and q8_0, match the reference",
          "[attention][quant][mla]") {
  // DeepSeek's absorbed MLA: one latent row of Dk = 576 per position, one KV head for every
  // query head; V is the first Dv = 512 columns of the same rows (a view with V's dim and K's
  // row stride), so the latent is read once.
  constexpr Index kDk = 576, kDv = 512, kHeads = 8;
  const auto check = [](auto storage_tag, Index lq, Index len) {
    using T = decltype(storage_tag);
    const Case c = Case{}.lengths(lq, len).heads(kHeads, 1).dims(kDk, kDv).laid_out(Layout::Bhsd);
    INFO(storage_name<T>() << ", " << ak::test::describe(c));
    ak::test::Inputs<T, float, T> in(c, 13);
    const ak::View<const T> latent = in.k.cview();
    const ak::View<const T> values =
        ak::strided(latent.data, {1, 1, len, kDv},
                    {latent.batch_stride, latent.head_stride, latent.seq_stride});
    const auto spec = ak::make_spec(Causal{});
    ak::test::Tensor<float> o(Layout::Bhsd, 1, kHeads, lq, kDv);
    ak::test::Tensor<double> want(Layout::Bhsd, 1, kHeads, lq, kDv);
    ak::attention(spec, in.q.cview(), latent, values, o.view, c.options());
    ak::reference::attention(spec, in.q.cview(), latent, values, want.view, c.options());
    CHECK(ak::test::max_abs_diff(o.view, want.view) <= ak::test::tol::kF32);
  };
  for (const Index lq : {1, 4, 40}) {
    check(float{}, lq, 900);
    check(BlockQ8_0{}, lq, 900);
  }
}

TEST_CASE("quantized K/V: attention_varlen() equals attention() on each sequence, bitwise",
          "[attention][quant][varlen]") {
  // Three packed sequences (5, 1 and 40 queries against 37, 300 and 40 keys): varlen runs
  // attention() on block views of each; the same calls by hand give the same bits.
  const std::vector<Index> cu_q{0, 5, 6, 46}, cu_k{0, 37, 337, 377};
  const Case all = Case{}.lengths(46, 377).heads(4, 2).dims(64).laid_out(Layout::Bshd);
  const ak::test::Inputs<BlockQ8_0, float, BlockQ4_0> in(all, 17);
  const auto spec = ak::make_spec(Causal{});
  ak::test::Tensor<float> packed(Layout::Bshd, 1, 4, 46, 64), each(Layout::Bshd, 1, 4, 46, 64);
  ak::attention_varlen(spec, in.q.cview(), in.k.cview(), in.v.cview(), packed.view, cu_q, cu_k);
  using ak::detail::seq_rows;  // the sub-views attention_varlen() forms
  for (std::size_t s = 0; s + 1 < cu_q.size(); ++s)
    ak::attention(spec, seq_rows(in.q.cview(), cu_q[s], cu_q[s + 1] - cu_q[s]),
                  seq_rows(in.k.cview(), cu_k[s], cu_k[s + 1] - cu_k[s]),
                  seq_rows(in.v.cview(), cu_k[s], cu_k[s + 1] - cu_k[s]),
                  seq_rows(each.view, cu_q[s], cu_q[s + 1] - cu_q[s]));
  CHECK(packed.memory == each.memory);
}
