// Products::Int8 (kernel/decode/decode_int8.hpp): decode over q8_0 / q4_0 K with the query rows
// quantized to int8 per block and integer K.Q products.
//  - exactness: with scale 1 the kernel quantizes the query as given, so its output is the f64
//    reference's on the query as quantized (the rule written out here, not read from the
//    kernel), at f32 tolerance: Lq 1 to 8 (the row engine), GQA 1 / 4 / 8 (four rows sharing
//    a key load), d 32 to 256 (every tail of the AVX-512 form's 2- and 4-block reads), ragged
//    Lk, V in q8_0, f32 and bf16, a sliding window (partial blocks);
//  - the bound: with the default scale, within the named bound of the exact decode;
//  - paged decode and thread counts give the same bits as decode(); other K storage and the
//    tile kernel ignore the mode.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/cache/attention_paged.hpp>
#include <attnkit/cache/paged_kv.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/storage/quantize.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::BlockQ4_0;
using ak::BlockQ8_0;
using ak::Products;
using ak::test::storage_name;

namespace {

// The query rule of Products::Int8, written out: per block of 32, dq = max|x| / 127 and
// x -> dq * round(x * (1 / dq)) (0 where dq is not a normal float).
void quantize_query_row(float* x, Index d) {
  for (Index b = 0; b < d; b += 32) {
    float amax = 0.f;
    for (Index c = b; c < b + 32; ++c) amax = std::max(amax, std::fabs(x[c]));
    const float dq = amax / 127.f;
    const bool zero = !(dq >= std::numeric_limits<float>::min());
    for (Index c = b; c < b + 32; ++c) x[c] = zero ? 0.f : dq * std::round(x[c] * (1.f / dq));
  }
}

// Every query row of t passed through f.
template <class F>
void for_each_row(ak::test::Tensor<float>& t, F f) {
  const ak::View<float>& v = t.view;
  for (Index b = 0; b < v.batch; ++b)
    for (Index h = 0; h < v.heads; ++h)
      for (Index s = 0; s < v.seq; ++s) f(v.row(b, h, s), v.dim);
}

// decode() with Int8 and scale 1 on `in` against the reference on the same K/V and the query
// quantized, then multiplied by sqrt(d) (the reference's default scale undoes it to f32
// accuracy: only the kernel's quantization step needs the exact query).
template <class K, class V, class Spec>
void check_exact(const std::string& what, const Spec& spec, const Case& c) {
  INFO(what << ", " << ak::test::describe(c) << ", K " << storage_name<K>() << ", V "
            << storage_name<V>());
  const ak::test::Inputs<K, float, V> in(c, 17);
  ak::test::Inputs<K, float, V> ref(c, 17);
  const float root = std::sqrt(float(c.dim));
  for_each_row(ref.q, [&](float* row, Index d) {
    quantize_query_row(row, d);
    for (Index x = 0; x < d; ++x) row[x] *= root;
  });
  ak::test::check_agreement(
      ak::test::agreement(spec, c, ref, [&](const ak::View<float>& o, const ak::Options& options) {
        ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), o,
                   options.with_products(Products::Int8).with_scale(1.f));
      }));
}

template <class K>
std::vector<float> run_decode(const ak::test::Inputs<K, float, K>& in, const Case& c,
                              Products products) {
  ak::test::Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, c.dv());
  ak::decode(ak::make_spec(Causal{}), in.q.cview(), in.k.cview(), in.v.cview(), o.view,
             c.options().with_products(products));
  return o.values();
}

}  // namespace

TEST_CASE("Products::Int8: decode equals the reference of the query as quantized",
          "[decode][quant][int8]") {
  const auto spec = ak::make_spec(Causal{});
  struct Heads {
    Index q, kv;
  };
  for (const Index d : {32, 64, 96, 128, 160, 256})
    for (const Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{8, 1}})
      for (const Index lq : {1, 3, 8}) {
        const Index lk = d == 128 ? 700 : 45 + 31 * lq;
        const Case c = Case{}.lengths(lq, lk).heads(h.q, h.kv).dims(d).laid_out(
            lq == 3 ? Layout::Padded : Layout::Bhsd);
        check_exact<BlockQ8_0, BlockQ8_0>("Causal", spec, c);
        check_exact<BlockQ4_0, float>("Causal", spec, c);
      }
  const Case c = Case{}.lengths(4, 900).heads(8, 2).dims(128);
  check_exact<BlockQ8_0, Eigen::bfloat16>("Causal & SlidingWindow{100, 0}",
                                          ak::make_spec(Causal{} & ak::SlidingWindow{100, 0}), c);
  check_exact<BlockQ4_0, BlockQ4_0>("Causal & SlidingWindow{100, 0}",
                                    ak::make_spec(Causal{} & ak::SlidingWindow{100, 0}), c);
}

TEST_CASE("Products::Int8: within the named bound of the exact decode", "[decode][quant][int8]") {
  // With the default scale s = 1/sqrt(128) (not a power of two: the scaled query is what is
  // quantized), a logit moves by at most delta_ij = sum_b s max|q_ib| / 254 * sum_{c in b}
  // |k_jc| (kernel/decode/decode_int8.hpp), so each softmax weight by a factor within e^(+-2 delta)
  // and the output by at most (e^(2 delta) - 1) max|v| (test_attention_quantized's argument),
  // plus the f32 rounding of both runs; delta = the largest delta_ij, from the inputs in double.
  const Case c = Case{}.lengths(2, 1200).heads(8, 2).dims(128).laid_out(Layout::Bhsd);
  const auto check = [&](auto block_tag) {
    using Block = decltype(block_tag);
    const ak::test::Inputs<Block, float, Block> in(c, 23);
    const std::vector<float> q = in.q.values(), k = in.k.values(), v = in.v.values();
    const Index d = c.dim, group = c.q_heads / c.kv_heads;
    const double s = 1.0 / std::sqrt(double(d));
    double delta = 0.0, v_max = 0.0;
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index i = 0; i < c.q_len; ++i)
        for (Index j = 0; j < c.kv_len; ++j) {
          const float* qi = q.data() + (h * c.q_len + i) * d;
          const float* kj = k.data() + (h / group * c.kv_len + j) * d;
          double shift = 0.0;
          for (Index b = 0; b < d; b += 32) {
            double q_max = 0.0, k_sum = 0.0;
            for (Index x = b; x < b + 32; ++x) {
              q_max = std::max(q_max, std::fabs(double(qi[x])));
              k_sum += std::fabs(double(kj[x]));
            }
            shift += s * q_max / 254.0 * k_sum;
          }
          delta = std::max(delta, shift);
        }
    for (const float x : v) v_max = std::max(v_max, std::fabs(double(x)));
    const double bound = std::expm1(2.0 * delta) * v_max + 2.0 * ak::test::tol::kF32;
    const std::vector<float> a = run_decode(in, c, Products::Int8),
                             b = run_decode(in, c, Products::Exact);
    double err = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, double(std::fabs(a[i] - b[i])));
    INFO(storage_name<Block>() << ": logit shift <= " << delta << ", bound " << bound
                               << ", error against the exact products " << err);
    CHECK(err <= bound);
    CHECK(err > 0.0);  // the query's rounding is there
  };
  check(BlockQ8_0{});
  check(BlockQ4_0{});
}

TEST_CASE("Products::Int8: paged decode and 1..3 threads give decode()'s bits",
          "[decode][quant][int8][paged]") {
  constexpr Index kB = 2, kHq = 8, kHkv = 2, kLk = 300, kD = 64;
  const Case c =
      Case{}.batches(kB).lengths(1, kLk).heads(kHq, kHkv).dims(kD).laid_out(Layout::Bhsd);
  const ak::test::Inputs<float> in(c, 31);
  ak::KvCache<BlockQ8_0> cache(kB, kHkv, kLk, kD);
  cache.append(in.k.cview(), in.v.cview());
  ak::PagedKv<BlockQ8_0> paged(2 * 20, kHkv, 16, kD);
  for (Index b = 0; b < kB; ++b) {
    paged.add_sequence();
    const auto one = [&](const ak::test::Tensor<float>& t) {
      return ak::strided(t.view.row(b, 0, 0), {1, kHkv, kLk, kD},
                         {t.view.batch_stride, t.view.head_stride, t.view.seq_stride});
    };
    paged.append(b, one(in.k), one(in.v));
  }
  const auto spec = ak::make_spec(Causal{});
  const auto options = ak::Options{}.with_products(Products::Int8);
  const auto bits = [](const ak::test::Tensor<float>& t) {
    std::vector<unsigned char> out(t.memory.size() * sizeof(float));
    std::memcpy(out.data(), t.memory.data(), out.size());
    return out;
  };
  ak::test::Tensor<float> want(Layout::Bhsd, kB, kHq, 1, kD), got(Layout::Bhsd, kB, kHq, 1, kD),
      exact(Layout::Bhsd, kB, kHq, 1, kD);
  ak::decode(spec, in.q.cview(), cache.keys(), cache.values(), want.view, options.with_threads(1));
  ak::decode(spec, in.q.cview(), cache.keys(), cache.values(), exact.view, ak::Options{});
  CHECK(bits(want) != bits(exact));  // the mode reached the row engine
  for (int t = 1; t <= 3; ++t) {
    INFO("threads " << t);
    ak::decode(spec, in.q.cview(), cache.keys(), cache.values(), got.view, options.with_threads(t));
    CHECK(bits(got) == bits(want));
    ak::attention_paged(spec, in.q.cview(), paged, got.view, options.with_threads(t));
    CHECK(bits(got) == bits(want));
  }
}

TEST_CASE("Products::Int8: f32, bf16 K and the tile kernel stay exact", "[decode][quant][int8]") {
  const auto spec = ak::make_spec(Causal{});
  const Case c = Case{}.lengths(2, 200).heads(4, 2).dims(64);
  const auto same = [&](const auto& in, Index lq) {
    const Case cc = Case{c}.lengths(lq, 200);
    const auto run = [&](Products p) {
      ak::test::Tensor<float> o(cc.layout, 1, 4, lq, 64);
      ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                    cc.options().with_products(p));
      return o.values();
    };
    const std::vector<float> a = run(Products::Int8), b = run(Products::Exact);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  same(ak::test::Inputs<float>(c, 3), 2);
  same(ak::test::Inputs<Eigen::bfloat16>(c, 3), 2);
  same(ak::test::Inputs<BlockQ8_0, float, BlockQ8_0>(Case{c}.lengths(40, 200), 3),
       40);  // the tile kernel
}
