// attention() through the tile kernel on one SIMD path, compactly: every normalizer (its vector
// finalize and row statistic), every kind of mask the kernel treats differently (runs() on
// Partial tiles, keep() only, key ranges that leave Full, Partial and Empty tiles, and/or
// combinations, a BlockMask), Softcap and ALiBi, RoPE, FoPE and TAPA, f32 / bf16 / f16 storage
// and q8_0 / q4_0 K/V, GQA, ragged tiles and d 128, bf16 products in their portable form
// (storage/bf16_round.hpp's rounding, f32 FMAs), each against the f64 reference (Lq 1 cases
// through split-KV decode);
// then bitwise stability over thread counts. In the scalar flavour (ATTNKIT_TEST_CI_SUBSET:
// the CI budget) the bf16 normalizer pass, the normalizers' Softcap pass and the positions are
// left out; the native, x86-64-v2 and aarch64 preset builds run them. The flavour builds
// (x86-64-v2, scalar, the aarch64 preset) run this file where the native build runs the full
// grids of test_attention_masks, test_attention_normalizers and test_attention_block_mask: what
// differs between ISAs is the vector code each policy reaches, which one pass over each reaches;
// the cross products check the policies' logic, which is the same source on every ISA.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/gemm/tile_gemm_bf16.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/position/fope.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/score/alibi.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/storage/bf16_round.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "support/catalogue.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::test::check_attention;
using ak::test::under;

namespace {

// Each normalizer with a windowed causal mask (Full, Partial and Empty tiles in one call) and
// with Softcap over every key.
template <class T = float>
void check_normalizers(const Case& c) {
  const auto check = [&](const std::string& name, const auto& spec) {
    check_attention<T>(name, spec, c);
  };
  ak::test::for_each_spec(c.q_heads, ak::test::Breadth::Kinds, check,
                          under("Causal & SlidingWindow{24, 0}", Causal{} & SlidingWindow{24, 0}));
#ifndef ATTNKIT_TEST_CI_SUBSET  // there Softcap runs in the ALiBi/Softcap case only
  ak::test::for_each_spec(c.q_heads, ak::test::Breadth::Kinds, check,
                          under("Full, Softcap{20}", ak::Softcap{20.f}));
#endif
}

}  // namespace

TEST_CASE("paths: every normalizer matches the reference on ragged tiles, GQA and d 128",
          "[attention][paths]") {
  check_normalizers(Case{}.lengths(77, 77).dims(32).laid_out(Layout::Bhsd));
  check_normalizers(Case{}.lengths(37, 133).heads(4, 2).dims(32).on_threads(1));
  check_normalizers(Case{}.lengths(33, 70).dims(128).at_offset(5));
}

// In the CI subset (ATTNKIT_TEST_CI_SUBSET) bf16 reaches the kernel through the ALiBi/Softcap
// case below; every normalizer in bf16 runs in the x86 flavours and the aarch64 preset.
#ifndef ATTNKIT_TEST_CI_SUBSET
TEST_CASE("paths: every normalizer matches the reference with bf16 storage", "[attention][paths]") {
  check_normalizers<Eigen::bfloat16>(Case{}.lengths(65, 65).heads(4, 2).dims(32));
}
#endif

TEST_CASE("paths: each kind of mask matches the reference, f32 and f16", "[attention][paths]") {
  const Case c = Case{}.lengths(150, 150).dims(64).laid_out(Layout::Padded);
  ak::test::for_each_mask([&](const std::string& name, const auto& mask) {
    check_attention(name, ak::make_spec(mask), c);
    check_attention(name, ak::make_spec(mask), Case{c}.lengths(1, 150));
  });
  for (const Index lq : {150, 1})  // a BlockMask is laid out for one (Lq, Lk)
    check_attention(
        "BlockMask(Causal & SlidingWindow{50, 0}, 64 x 128)",
        ak::make_spec(ak::make_block_mask(Causal{} & SlidingWindow{50, 0}, lq, 150, 64, 128)),
        Case{c}.lengths(lq, 150));
  check_attention<Eigen::half>("Causal & (Sinks{4} | SlidingWindow{64, 0})",
                               ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{64, 0})), c);
}

TEST_CASE("paths: ALiBi and Softcap match the reference under Causal", "[attention][paths]") {
  const Case c = Case{}.lengths(70, 140).heads(4, 2).dims(48);
  check_attention("Causal, Alibi::standard(4)", ak::make_spec(Causal{}, ak::Alibi::standard(4)), c);
  check_attention("Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}), c);
  check_attention<Eigen::bfloat16>("Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}),
                                   c);
}

// Not in the CI subset (ATTNKIT_TEST_CI_SUBSET): the positions' row transforms are scalar
// code, TAPA's SIMD cos is test_simd_ops'; the aarch64 preset runs this case with the whole path
// set.
#ifndef ATTNKIT_TEST_CI_SUBSET
TEST_CASE("paths: RoPE, FoPE and TAPA match the reference in prefill and decode",
          "[attention][paths][position]") {
  // Row transforms (the keys turned once per call, each query tile as it is packed) and a
  // product owner (TAPA's two half products and its SIMD cos), ragged, GQA, through the tile
  // kernel and (Lq 1) split-KV decode.
  ak::FopeConfig fc{32, 256, 1000};
  fc.kv_heads = 2;
  fc.q_heads = 4;
  const ak::Fope fope = ak::Fope::drawn(fc, 0.3, 3);
  for (const Index lq : {70, 1}) {
    const Case c = Case{}.lengths(lq, 140).heads(4, 2).dims(32);
    check_attention("Causal, Rope",
                    ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(32, 10000, 256))), c);
    check_attention("Causal, Fope", ak::make_spec(Causal{}, fope), c);
    check_attention("Causal, Tapa", ak::make_spec(Causal{}, ak::Tapa{}), c);
    check_attention<Eigen::bfloat16>(
        "Causal & SlidingWindow{40, 0}, Tapa, Sigmoid",
        ak::make_spec(Causal{} & SlidingWindow{40, 0}, ak::Tapa{}, ak::Sigmoid{}), c);
  }
}
#endif

TEST_CASE("paths: q8_0 keys and q4_0 values match the reference in prefill and decode",
          "[attention][paths][quant]") {
  // The int8 and 4-bit widenings (simd/int_widen.hpp) in the tile packing and the row engine.
  for (const Index lq : {1, 3, 70}) {
    const Case c = Case{}.lengths(lq, 400).heads(4, 2).dims(64, 32);
    INFO(ak::test::describe(c));
    ak::test::check_attention_on(ak::make_spec(Causal{}), c,
                                 ak::test::Inputs<ak::BlockQ8_0, float, ak::BlockQ4_0>(c, 3));
  }
}

TEST_CASE("paths: bf16 products in their portable form stay within their bound",
          "[attention][paths][bf16]") {
  // bf16 operands with d 64 (scale 1/8): the products are exact, only the weights P round,
  // so each output moves by at most u max|v| (u = 2^-8; tests/kernel/ has the whole grid).
  ak::gemm::bf16_kernel() = ak::gemm::Bf16Kernel::RoundedF32;
  const Case c = Case{}.lengths(100, 230).heads(4, 2).dims(64);
  const ak::test::Inputs<Eigen::bfloat16> in(c, 6);
  double v_max = 0.0;
  in.v.for_each(
      [&v_max](const Eigen::bfloat16& x) { v_max = std::max(v_max, std::abs(double(float(x)))); });
  ak::test::Tolerance t;
  t.out = ak::detail::kBf16Unit * v_max + ak::test::tol::kF32;
  const auto spec = ak::make_spec(Causal{} & SlidingWindow{24, 0});
  ak::test::check_agreement(ak::test::agreement(
      spec, c, in,
      [&](const ak::View<float>& o, const ak::Options& options) {
        ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o,
                      options.with_products(ak::Products::Bf16));
      },
      t));
  ak::gemm::bf16_kernel() = ak::gemm::Bf16Kernel::Auto;
}

TEST_CASE("paths: output and statistic are bitwise identical for 1..4 threads",
          "[attention][paths][threads]") {
  // Prefill (the tile kernel) and Lq 3 (attention() routes it to split-KV decode), each
  // normalizer with a sliding window and sinks: Full, Partial and Empty tiles in each call.
  for (const Index lq : {150, 3})
    ak::test::for_each_normalizer(2, [&](const std::string& name, const auto& n) {
      const auto spec = ak::make_spec(Causal{} & (ak::Sinks{4} | SlidingWindow{60, 0}), n);
      Case c = Case{}.lengths(lq, 600).dims(64).on_threads(1);
      INFO(name << ", " << ak::test::describe(c));
      const auto one = ak::test::bytes_of(ak::test::run_kernel(spec, c));
      for (int t = 2; t <= 4; ++t) {
        INFO("threads " << t);
        CHECK(ak::test::bytes_of(ak::test::run_kernel(spec, c.on_threads(t))) == one);
      }
    });
}
