// The softmax row engine (kernel/decode/decode_rows.hpp) behind decode() and attention_paged()
// (cache/paged_decode.hpp), at its edges: head dims that are not whole vectors (logits_any),
// value-dim tails, odd GQA groups, q_len 2..16 under Causal (rows of one head see different
// keys, so Full / Partial / Empty blocks mix inside one KV group), kv_len not a multiple of
// the 16-key block, q_offset putting rows before every key, masks without classify() or
// without runs(), masks that depend on the head, Sinks | SlidingWindow, Softcap, Rope, and
// bf16 / f16 K/V; the non-finite contract of Softmax::absorb (NaN / +inf logits, visible keys
// with -inf logits, masked poisoned keys); bitwise identity across 1..4 threads; paged decode
// over page sizes not a multiple of 16 or above kDecodeChunk, lengths 0 / 1, shuffled pages
// with NaN in every unused pool row, against the f64 reference and, for pages of whole
// blocks, bitwise against decode().
// bf16 K/V widened two vectors at a time (value dims with pairs, K and V in different
// storage). Built for the native ISA (test_decode runs the engine on every SIMD path).
// The block arithmetic (logits, online softmax, weighted values) is
// kernel/decode/decode_row_math.hpp's.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/cache/paged_kv.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "support/reference_check.hpp"
#include "support/sequences.hpp"
#include "support/test_names.hpp"

using ak::test::kNaN;

namespace {

// Keeps a head-dependent window that skips every seventh key (shifted by batch): no
// classify(), no runs(), no key_ranges(): every block is Partial.
struct HeadPattern {
  using slot = ak::MaskSlot;
  bool keep(Index b, Index h, Index i, Index j) const {
    return j <= i && i - j < 5 + 9 * h && (j + b) % 7 != 3;
  }
};

// A head-dependent causal prefix with classify() but no runs(): head h sees keys j <= i - h.
struct HeadLag {
  using slot = ak::MaskSlot;
  bool keep(Index /*b*/, Index h, Index i, Index j) const { return j <= i - h; }
  ak::TileKind classify(Index /*b*/, Index h, ak::Range q, ak::Range kv) const {
    if (kv.begin > q.last() - h) return ak::TileKind::Empty;
    return kv.last() <= q.begin - h ? ak::TileKind::Full : ak::TileKind::Partial;
  }
};

// Mask M with the batch index fixed to `batch`: paged sequence b's mask sees batch index b,
// the same sequence alone (a batch of one) must see it too. No classify(), as HeadPattern.
template <class M>
struct AtBatch {
  using slot = ak::MaskSlot;
  M mask;
  Index batch = 0;
  bool keep(Index /*b*/, Index h, Index i, Index j) const { return mask.keep(batch, h, i, j); }
};

// The shapes of this file: Case with the value dim always given (value_dim = dv()), Padded.
using Shape = ak::test::Case;

// Q in f32 and K/V in storage TK / TV, one layout; the reference reads the same rounded values.
template <class TK, class TV = TK>
using Inputs = ak::test::Inputs<TK, float, TV>;

// decode() on `in` into o (the Shape's layout) and the f64 reference into want (Bhsd).
template <class In, class Spec>
void decode_and_reference(const Spec& spec, const In& in, Tensor<float>& o, Tensor<double>& want,
                          const ak::Options& options, const ak::Options& ref_options) {
  ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), want.view, ref_options);
}

// Output and LSE of decode() on `in`, and of the f64 reference, compared row by row: finite
// reference rows within tol::kF32 / tol::kLseF32; rows the reference makes NaN must be NaN
// (output and LSE); rows that see no key exactly 0 with LSE -inf. The output's padding
// (Padded layout: NaN) must be left alone.
template <class In, class Spec>
void check_against_reference(const std::string& what, const Spec& spec, const Shape& s,
                             const In& in) {
  INFO(what << ", " << ak::test::describe(s));
  Tensor<float> o(s.layout, s.batch, s.q_heads, s.q_len, s.value_dim);
  Tensor<double> want(Layout::Bhsd, s.batch, s.q_heads, s.q_len, s.value_dim);
  const auto rows = static_cast<std::size_t>(s.rows());
  std::vector<float> lse(rows, 42.f), lse_want(rows, 42.f);
  decode_and_reference(spec, in, o, want, s.options().with_lse(lse),
                       s.options().with_lse(lse_want));
  double worst = 0, worst_lse = 0;
  Index nan_rows = 0, empty_rows = 0, bad_nan = 0, bad_empty = 0;
  for (Index b = 0; b < s.batch; ++b)
    for (Index h = 0; h < s.q_heads; ++h)
      for (Index r = 0; r < s.q_len; ++r) {
        const auto at = static_cast<std::size_t>((b * s.q_heads + h) * s.q_len + r);
        const float* got = o.view.row(b, h, r);
        const double* ref = want.view.row(b, h, r);
        const bool ref_nan = std::isnan(lse_want[at]);
        if (ref_nan) {
          ++nan_rows;
          bool all_nan = std::isnan(lse[at]);
          for (Index c = 0; c < s.value_dim; ++c) all_nan = all_nan && std::isnan(got[c]);
          bad_nan += all_nan ? 0 : 1;
          continue;
        }
        if (lse_want[at] == ak::test::kNegInf) {
          ++empty_rows;
          bool exact = lse[at] == ak::test::kNegInf;
          for (Index c = 0; c < s.value_dim; ++c) exact = exact && got[c] == 0.f;
          bad_empty += exact ? 0 : 1;
          continue;
        }
        for (Index c = 0; c < s.value_dim; ++c) {
          const double d = std::abs(double(got[c]) - ref[c]);
          worst = std::isnan(d) ? HUGE_VAL : std::max(worst, d);
        }
        const double dl = std::abs(double(lse[at]) - double(lse_want[at]));
        worst_lse = std::isnan(dl) ? HUGE_VAL : std::max(worst_lse, dl);
      }
  const auto nan_total =
      std::count_if(o.memory.begin(), o.memory.end(), [](float x) { return std::isnan(x); });
  const Index padding = static_cast<Index>(o.memory.size()) - s.rows() * s.value_dim;
  INFO("rows NaN in the reference: " << nan_rows << ", rows that see no key: " << empty_rows);
  CHECK(worst <= tol::kF32);
  CHECK(worst_lse <= tol::kLseF32);
  CHECK(bad_nan == 0);
  CHECK(bad_empty == 0);
  CHECK(static_cast<Index>(nan_total) >= padding);
  if (s.layout == Layout::Padded && nan_rows == 0) CHECK(static_cast<Index>(nan_total) == padding);
}

template <class TK = float, class TV = TK, class Spec>
void check(const std::string& what, const Spec& spec, const Shape& s, std::uint32_t seed = 3) {
  const Inputs<TK, TV> in(s, seed);
  check_against_reference(what, spec, s, in);
}

Shape shape(Index q_heads, Index kv_heads, Index q_len, Index kv_len, Index dim, Index value_dim) {
  return Shape{}
      .heads(q_heads, kv_heads)
      .lengths(q_len, kv_len)
      .dims(dim, value_dim)
      .laid_out(Layout::Padded);
}

}  // namespace

TEST_CASE("decode rows: head dims, value-dim tails and odd groups match the reference",
          "[decode_rows]") {
  // d: 1, 3 and 17 / 40 / 130 (not whole vectors: logits_any with a scalar tail), 32 / 64 /
  // 128 (2, 4, 8 vectors on AVX-512: queries in registers, rows paired), 256 and 512 (16 and
  // 32 vectors on AVX-512: too many for registers, logits_any with whole vectors, the rows of
  // a group sharing each key load); dv: tails.
  struct Dims {
    Index d, dv;
  };
  const Dims dims[] = {{1, 1},   {3, 5},   {17, 33},   {32, 24},  {40, 129},
                       {64, 64}, {128, 7}, {130, 136}, {256, 40}, {512, 512}};
  struct Heads {
    Index q, kv;
  };
  const Heads heads[] = {{3, 1}, {5, 1}, {6, 2}, {2, 2}};
  for (const Dims& dm : dims)
    for (const Heads& h : heads) {
      Shape s = shape(h.q, h.kv, dm.d % 2 == 0 ? 3 : 1, 530, dm.d, dm.dv);
      s.layout = h.q == 6 ? Layout::Bshd : Layout::Padded;
      check("Causal", ak::make_spec(Causal{}), s);
    }
  {  // Lq 16, group 8 (128 rows), 8 query vectors on AVX-512, 8+ value slabs, all Full
    Shape w = shape(8, 1, 16, 1024, 128, 520);
    w.q_offset = 2000;
    check("Full blocks, group 8, d128, dv520", ak::make_spec(Causal{}), w);
    w.kv_len = 512;
    w.q_offset = 500;
    check<Eigen::half>("Causal, group 8, d128, dv520, f16", ak::make_spec(Causal{}), w);
  }
  Shape s = shape(6, 2, 2, 1041, 40, 24);
  s.batch = 2;
  check("Full, B2", ak::make_spec(), s);
  check<Eigen::bfloat16>("Full, B2, bf16", ak::make_spec(), s);
  check<Eigen::half>("Full, B2, f16", ak::make_spec(), s);
  s.dim = 64;
  check<Eigen::bfloat16>("Causal, d64, bf16", ak::make_spec(Causal{}), s);
  check<Eigen::half>("Causal, d64, f16", ak::make_spec(Causal{}), s);
}

TEST_CASE(
    "decode rows: q_len 2..16 under Causal, kv_len off the 16-key block, rows before "
    "every key",
    "[decode_rows]") {
  for (const Index lq : {2, 5, 9, 16})
    for (const Index lk : {0, 1, 15, 17, 33, 511, 513, 1030}) {
      // bottom-right, then offsets that leave the first rows (or all) before key 0, and one
      // past the end (every key visible to every row: Full blocks, rows paired).
      for (const std::optional<Index> off :
           {std::optional<Index>{}, std::optional<Index>{-3}, std::optional<Index>{-lq},
            std::optional<Index>{lk + 40}}) {
        Shape s = shape(lk % 2 == 0 ? 4 : 3, 1, lq, lk, lq % 2 == 0 ? 32 : 24, 20);
        s.q_offset = off;
        s.layout = lk % 3 == 0 ? Layout::Bhsd : Layout::Padded;
        check("Causal", ak::make_spec(Causal{}), s);
      }
    }
}

TEST_CASE("decode rows: masks without classify() or runs(), head-dependent, sinks | window",
          "[decode_rows]") {
  for (const Index lq : {1, 3, 16})
    for (const Index lk : {18, 530, 1100}) {
      Shape s = shape(6, 2, lq, lk, lq == 3 ? 40 : 32, 24);
      s.batch = 2;
      check("HeadPattern (no classify)", ak::make_spec(HeadPattern{}), s);
      check("HeadLag (classify, no runs)", ak::make_spec(HeadLag{}), s);
      check("Causal & HeadLag", ak::make_spec(Causal{} & HeadLag{}), s);
      check("Causal & (Sinks{5} | SlidingWindow{37, 0})",
            ak::make_spec(Causal{} & (Sinks{5} | SlidingWindow{37, 0})), s);
      check("Sinks{20} | SlidingWindow{3, 0}, with softmax sinks",
            ak::make_spec(Sinks{20} | SlidingWindow{3, 0},
                          ak::Softmax::with_sinks({-1.f, 0.f, 1.f, 2.f, -2.f, 0.5f})),
            s);
      s.q_offset = -2;  // the first rows see only the sinks, or nothing
      check("Causal & (Sinks{5} | SlidingWindow{37, 0}), q_offset -2",
            ak::make_spec(Causal{} & (Sinks{5} | SlidingWindow{37, 0})), s);
      check<Eigen::bfloat16>("Causal & SlidingWindow{300, 0}, q_offset -2, bf16",
                             ak::make_spec(Causal{} & SlidingWindow{300, 0}), s);
    }
}

TEST_CASE("decode rows: Softcap and Rope match the reference", "[decode_rows]") {
  for (const Index d : {32, 40}) {
    Shape s = shape(5, 1, 7, 700, d, 24);
    check("Causal, Softcap{4}", ak::make_spec(Causal{}, ak::Softcap{4.f}), s);
    check("Causal, Rope", ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(d, 10000, 1024))), s);
  }
}

// ---- non-finite inputs: the contract of Softmax::absorb and reference::attention ---------

TEST_CASE("decode rows: NaN and +inf logits make exactly the rows that see them NaN",
          "[decode_rows][nonfinite]") {
  for (const Index d : {32, 40})
    for (const float poison : {kNaN, ak::test::kInf})
      for (const Index lk : {130, 1100}) {
        // Causal, Lq 16 at offset Lk - 30: key Lk - 20 is seen by rows 10..15 only, in a block
        // that is Partial for rows 0..14; key 40 by every row, in a Full block (with Lk 1100 in
        // the first of three split-KV chunks: the merge must keep the NaN).
        for (const Index bad : {lk - 20, Index{40}}) {
          Shape s = shape(4, 2, 16, lk, d, 24);
          s.q_offset = lk - 30;
          Inputs<float> in(s, 9);
          in.q.for_each([](float& x) { x = std::abs(x) + 0.1f; });  // q . (inf, 0, ..) = +inf
          for (Index g = 0; g < s.kv_heads; ++g) {
            float* key = in.k.view.row(0, g, bad);
            std::fill(key, key + d, 0.f);
            key[0] = poison;
          }
          check_against_reference(std::string("Causal, poisoned key ") + std::to_string(bad) +
                                      (std::isnan(poison) ? " (NaN)" : " (+inf)"),
                                  ak::make_spec(Causal{}), s, in);
        }
      }
}

TEST_CASE("decode rows: keys the mask removes never leak, whatever their K and V hold",
          "[decode_rows][nonfinite]") {
  // Causal, bottom rows at offset 100 of 140 keys: keys 116..139 are future for every row, and
  // keys 101..115 for some rows: in the same 16-key blocks as keys the rows see.
  for (const Index d : {17, 32, 64})
    for (const float poison : {kNaN, ak::test::kInf, ak::test::kNegInf}) {
      Shape s = shape(6, 2, 16, 140, d, 24);
      s.q_offset = 100;
      Inputs<float> in(s, 13);
      for (Index g = 0; g < s.kv_heads; ++g)
        for (Index j = 101; j < s.kv_len; ++j)
          if (j % 2 == 1 || j >= 116) {
            std::fill(in.k.view.row(0, g, j), in.k.view.row(0, g, j) + d, poison);
            std::fill(in.v.view.row(0, g, j), in.v.view.row(0, g, j) + s.value_dim, poison);
          }
      // Rows that see a poisoned key are NaN in the reference (a NaN or +-inf K gives a NaN
      // or +inf logit: random signs) or non-finite; the others must match it exactly.
      check_against_reference("Causal, poisoned K/V", ak::make_spec(Causal{}), s, in);
      check_against_reference("Causal & SlidingWindow{9, 0}, poisoned K/V",
                              ak::make_spec(Causal{} & SlidingWindow{9, 0}), s, in);
    }
}

TEST_CASE(
    "decode rows: a visible key whose logit is -inf weighs 0, and its value still counts "
    "(0 * NaN is NaN), in Partial blocks as in Full ones",
    "[decode_rows][nonfinite]") {
  // K row = (-inf, 0, ..., 0) and q > 0: the logit is -inf for every row that sees it, which
  // is a visible key (not a masked one): reference::attention and AttentionTiles add
  // 0 * v_j, so a NaN value row makes those rows' outputs NaN (LSE stays finite). The row
  // engine must do the same whether the key's block is Full or Partial for the row.
  for (const Index d : {32, 40})
    for (const Index bad : {Index{40}, Index{105}}) {  // Full block for all rows / Partial
      // Lq 4: the row engine runs (split-KV may hand more rows per head to the tiles).
      Shape s = shape(2, 1, 4, 120, d, 24);
      s.q_offset = 105;  // row r sees keys 0 .. 105 + r; block 96..111 is Partial for every row
      Inputs<float> in(s, 21);
      in.q.for_each([](float& x) { x = std::abs(x) + 0.1f; });
      float* key = in.k.view.row(0, 0, bad);
      std::fill(key, key + d, 0.f);
      key[0] = ak::test::kNegInf;
      std::fill(in.v.view.row(0, 0, bad), in.v.view.row(0, 0, bad) + s.value_dim, kNaN);
      INFO("the -inf key is " << bad);
      Tensor<float> o(s.layout, 1, s.q_heads, s.q_len, s.value_dim);
      Tensor<double> want(Layout::Bhsd, 1, s.q_heads, s.q_len, s.value_dim);
      decode_and_reference(ak::make_spec(Causal{}), in, o, want, s.options(), s.options());
      // AttentionTiles (called directly: attention() may route decode shapes to the row
      // engine) as the second witness of the contract.
      Tensor<float> tiles(s.layout, 1, s.q_heads, s.q_len, s.value_dim);
      const ak::Problem p =
          ak::make_problem(in.q.cview(), in.k.cview(), in.v.cview(), tiles.view, s.options());
      ak::detail::run_tiles(ak::make_spec(Causal{}), p, in.q.cview(), in.k.cview(), in.v.cview(),
                            tiles.view, nullptr);
      Index mismatched = 0, tiles_mismatched = 0, nan_rows = 0;
      for (Index h = 0; h < s.q_heads; ++h)
        for (Index r = 0; r < s.q_len; ++r) {
          const bool ref_nan = std::isnan(want.view.row(0, h, r)[0]);
          nan_rows += ref_nan;
          mismatched += std::isnan(o.view.row(0, h, r)[0]) != ref_nan;
          tiles_mismatched += std::isnan(tiles.view.row(0, h, r)[0]) != ref_nan;
        }
      CHECK(nan_rows == s.q_heads * s.q_len);  // every row sees the key
      CHECK(tiles_mismatched == 0);
      CHECK(mismatched == 0);
    }
}

TEST_CASE(
    "decode rows: a visible key whose f32 weight underflows to 0 still carries an "
    "infinite value row into the output, in Partial blocks as in Full ones",
    "[decode_rows][nonfinite]") {
  // Logit about -200 below the row's max: exp2 flushes its f32 weight to 0 (the SIMD
  // contract), the f64 reference keeps ~1e-87, and inf * 1e-87 = inf: the reference row is
  // non-finite, and so is AttentionTiles' (0 * inf). The engine must not hand back a finite
  // row because the key's block happened to be Partial.
  for (const Index bad : {Index{40}, Index{105}}) {
    Shape s = shape(2, 1, 4, 120, 32, 24);
    s.q_offset = 105;
    Inputs<float> in(s, 23);
    in.q.for_each([](float& x) { x = 1.f; });
    float* key = in.k.view.row(0, 0, bad);
    std::fill(key, key + s.dim, 0.f);
    key[0] = -200.f * std::sqrt(float(s.dim));  // logit -200 in every row
    std::fill(in.v.view.row(0, 0, bad), in.v.view.row(0, 0, bad) + s.value_dim, ak::test::kInf);
    INFO("the underflowing key is " << bad);
    Tensor<float> o(s.layout, 1, s.q_heads, s.q_len, s.value_dim);
    Tensor<double> want(Layout::Bhsd, 1, s.q_heads, s.q_len, s.value_dim);
    decode_and_reference(ak::make_spec(Causal{}), in, o, want, s.options(), s.options());
    Index finite_but_should_not = 0, ref_nonfinite = 0;
    for (Index h = 0; h < s.q_heads; ++h)
      for (Index r = 0; r < s.q_len; ++r) {
        const bool ref_bad = !std::isfinite(want.view.row(0, h, r)[0]);
        ref_nonfinite += ref_bad;
        finite_but_should_not += ref_bad && std::isfinite(o.view.row(0, h, r)[0]);
      }
    CHECK(ref_nonfinite == s.q_heads * s.q_len);
    CHECK(finite_but_should_not == 0);
  }
}

// ---- bf16 two vectors at a time ---------------------------------------------------------
// load_bf16_pair() widens bf16 K/V two vectors at a time in its own order (AVX-512 / AVX2:
// even and odd elements apart): the queries kept in registers and the value accumulators'
// whole pairs live in that order until finish(). Value dims that hold pairs at every width,
// on Partial blocks, with Rope and Softcap, K and V in different storage, and paged.

using bf16 = Eigen::bfloat16;

TEST_CASE("decode rows: bf16 pairs on Partial blocks, value dims with pairs, Softcap, Rope",
          "[decode_rows][bf16]") {
  struct Dims {
    Index d, dv;
  };
  // d 32 / 64 / 128: queries in registers (split) on AVX-512, AVX2 and scalar; 40: logits_any
  // (not split). dv: 2, 3, 5, 8 + 1, 16 + 8 vectors at kWidth 16 (pairs, an unpaired vector,
  // a second slab, a scalar tail).
  const Dims dims[] = {{32, 32}, {64, 48}, {128, 80}, {40, 136}, {64, 264}, {128, 136}};
  for (const Dims& dm : dims)
    for (const Index lq : {2, 3, 4}) {
      Shape s = shape(lq == 3 ? 3 : 4, lq == 3 ? 1 : 2, lq, 530, dm.d, dm.dv);
      s.layout = lq == 2 ? Layout::Bshd : Layout::Padded;
      check<bf16>("Causal", ak::make_spec(Causal{}), s);
      check<bf16>("Causal & SlidingWindow{37, 0}", ak::make_spec(Causal{} & SlidingWindow{37, 0}),
                  s);
      check<bf16>("HeadPattern (Partial in every block)", ak::make_spec(HeadPattern{}), s);
      check<bf16>("Causal, Softcap{4}", ak::make_spec(Causal{}, ak::Softcap{4.f}), s);
      check<bf16>("Causal, Rope",
                  ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(dm.d, 10000, 1024))), s);
    }
}

TEST_CASE("decode rows: K and V in different storage", "[decode_rows][bf16]") {
  for (const Index d : {32, 64, 40})
    for (const Index dv : {Index{48}, Index{136}}) {
      Shape s = shape(3, 1, 2, 700, d, dv);
      check<bf16, float>("Causal, K bf16, V f32", ak::make_spec(Causal{}), s);
      check<float, bf16>("Causal, K f32, V bf16", ak::make_spec(Causal{}), s);
      check<bf16, Eigen::half>("Causal, K bf16, V f16", ak::make_spec(Causal{}), s);
      check<Eigen::half, bf16>("Causal, K f16, V bf16", ak::make_spec(Causal{}), s);
    }
}

// ---- threads ---------------------------------------------------------------------------

namespace {

template <class T, class Spec>
std::vector<unsigned char> decode_bytes(const Spec& spec, Shape s, int threads) {
  s.threads = threads;
  const Inputs<T> in(s, 17);
  return ak::test::bytes_of(
      ak::test::run_into<Spec>(s, [&](const ak::View<float>& o, const ak::Options& options) {
        ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
      }));
}

}  // namespace

TEST_CASE("decode rows: output and LSE are bitwise identical for 1..4 threads", "[decode_rows]") {
  Shape s = shape(6, 2, 5, 1600, 40, 20);
  s.batch = 2;
  s.q_offset = 1590;
  const auto spec = ak::make_spec(Causal{} & (Sinks{3} | SlidingWindow{700, 0}),
                                  ak::Softmax::with_sinks({0.f, 1.f, -1.f, 2.f, 0.f, 3.f}));
  const auto one = decode_bytes<Eigen::bfloat16>(spec, s, 1);
  const auto one_pat = decode_bytes<float>(ak::make_spec(HeadPattern{}), s, 1);
  s.dim = 64;
  const auto one64 = decode_bytes<Eigen::half>(ak::make_spec(Causal{}), s, 1);
  for (int t = 2; t <= 4; ++t) {
    INFO("threads " << t);
    s.dim = 40;
    CHECK(decode_bytes<Eigen::bfloat16>(spec, s, t) == one);
    CHECK(decode_bytes<float>(ak::make_spec(HeadPattern{}), s, t) == one_pat);
    s.dim = 64;
    CHECK(decode_bytes<Eigen::half>(ak::make_spec(Causal{}), s, t) == one64);
  }
}

// ---- paged decode ----------------------------------------------------------------------

namespace {

constexpr Index kHkv = 2, kHq = 6;

// Sequences of the given lengths, K [1, Hkv, Lk, D] / V [.., Dv] in f32 (exact in T when T
// is float; rounded to T on the way in otherwise, and the contiguous copies rounded alike).
template <class T>
struct PagedCase {
  Index d, dv, page;
  ak::test::Sequences<T> seqs;  // the contiguous copies
  const std::vector<Index>& lengths = seqs.lengths;
  ak::PagedKv<T> paged;
  Tensor<float> q;  // [B, Hq, Lq, D]

  PagedCase(std::vector<Index> lens, Index page_size, Index dim, Index value_dim, Index lq,
            std::uint32_t seed)
      : d(dim),
        dv(value_dim),
        page(page_size),
        seqs(std::move(lens), kHkv, dim, value_dim, seed + 1),
        paged(pool_pages(seqs.lengths, page_size) + 3, kHkv, page_size, dim, value_dim),
        q(Layout::Padded, seqs.count(), kHq, lq, dim) {
    q.randomize(seed);
    ak::test::assign_shuffled(paged, seqs, seed + 2);  // NaN in every unused pool row
  }

  static Index pool_pages(const std::vector<Index>& lens, Index page_size) {
    Index n = 0;
    for (const Index l : lens) n += (l + page_size - 1) / page_size;
    return n;
  }
  Index batch() const { return static_cast<Index>(lengths.size()); }
  Index lq() const { return q.view.seq; }
  ak::View<const T> keys(Index b) const { return seqs.keys(b); }
  ak::View<const T> values(Index b) const { return seqs.values(b); }
  ak::View<const float> query(Index b) const {
    const ak::View<float>& x = q.view;
    return ak::strided(static_cast<const float*>(x.row(b, 0, 0)), {1, kHq, x.seq, x.dim},
                       {x.batch_stride, x.head_stride, x.seq_stride});
  }
};

struct PagedResult {
  std::vector<float> out, lse;  // [B, Hq, Lq, Dv], [B, Hq, Lq]
};

template <class T, class Spec>
PagedResult run_paged(const Spec& spec, const PagedCase<T>& c, ak::Options options) {
  const Index B = c.batch(), lq = c.lq();
  PagedResult r;
  r.out.assign(static_cast<std::size_t>(B * kHq * lq * c.dv), kNaN);
  r.lse.assign(static_cast<std::size_t>(B * kHq * lq), 42.f);
  ak::attention_paged(spec, c.q.cview(), c.paged, ak::bhsd(r.out.data(), B, kHq, lq, c.dv),
                      options.with_lse(r.lse));
  return r;
}

// Sequence b alone, contiguous: decode() (call = true) or the f64 reference.
template <class T, class Spec>
void run_contiguous(const Spec& spec, const PagedCase<T>& c, Index b, ak::Options options,
                    std::vector<float>& out, std::vector<float>& lse, std::vector<double>& ref,
                    std::vector<float>& ref_lse) {
  const Index lq = c.lq(), len = c.lengths[static_cast<std::size_t>(b)];
  if (!options.q_offset) options.q_offset = len - lq;
  out.assign(static_cast<std::size_t>(kHq * lq * c.dv), kNaN);
  lse.assign(static_cast<std::size_t>(kHq * lq), 42.f);
  ref.assign(out.size(), 0.0);
  ref_lse.assign(lse.size(), 42.f);
  ak::decode(spec, c.query(b), c.keys(b), c.values(b), ak::bhsd(out.data(), 1, kHq, lq, c.dv),
             options.with_lse(lse));
  ak::reference::attention(spec, c.query(b), c.keys(b), c.values(b),
                           ak::bhsd(ref.data(), 1, kHq, lq, c.dv), options.with_lse(ref_lse));
}

// The spec sequence b runs with on its own (batch 0): `spec` itself, unless its mask reads
// the batch index (see AtBatch below).
template <class Spec>
const Spec& alone(const Spec& spec, Index /*b*/) {
  return spec;
}

template <class N, class P>
ak::AttentionSpec<ak::Dot, AtBatch<HeadPattern>, N, P> alone(
    const ak::AttentionSpec<ak::Dot, HeadPattern, N, P>& spec, Index b) {
  return {spec.score, AtBatch<HeadPattern>{spec.mask, b}, spec.normalizer, spec.position};
}

template <class T, class Spec>
void check_paged(const std::string& what, const Spec& spec, const PagedCase<T>& c,
                 ak::Options options, bool expect_bitwise) {
  INFO(what << ", page " << c.page << ", d " << c.d << ", dv " << c.dv << ", Lq " << c.lq());
  const PagedResult got = run_paged(spec, c, options);
  const Index lq = c.lq(), per = kHq * lq;
  for (Index b = 0; b < c.batch(); ++b) {
    INFO("sequence " << b << " of length " << c.lengths[static_cast<std::size_t>(b)]);
    std::vector<float> out, lse, ref_lse;
    std::vector<double> ref;
    run_contiguous(alone(spec, b), c, b, options, out, lse, ref, ref_lse);
    const float* g = got.out.data() + b * per * c.dv;
    const float* gl = got.lse.data() + b * per;
    double worst = 0, worst_lse = 0;
    for (std::size_t x = 0; x < out.size(); ++x) {
      const double e = std::abs(double(g[x]) - ref[x]);
      worst = std::isnan(e) ? HUGE_VAL : std::max(worst, e);
    }
    for (std::size_t x = 0; x < lse.size(); ++x) {
      if (gl[x] == ref_lse[x]) continue;
      const double e = std::abs(double(gl[x]) - double(ref_lse[x]));
      worst_lse = std::isnan(e) ? HUGE_VAL : std::max(worst_lse, e);
    }
    CHECK(worst <= tol::kF32);
    CHECK(worst_lse <= tol::kLseF32);
    if (expect_bitwise) {
      CHECK(std::memcmp(g, out.data(), out.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(gl, lse.data(), lse.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("paged decode: any page size, lengths 0 and 1, shuffled pages, NaN in unused rows",
          "[decode_rows][paged]") {
  const std::vector<Index> lengths = {0, 1, 17, 530, 1100};
  for (const Index page : {1, 5, 16, 48, 600, 1040})
    for (const Index lq : {1, 4}) {
      const Index d = page % 2 == 0 ? 32 : 40, dv = page == 5 ? 7 : 24;
      const PagedCase<float> c(lengths, page, d, dv, lq, 5 + static_cast<std::uint32_t>(page));
      // Pages of whole 16-key blocks give decode()'s bits (the engine's own claim).
      const bool bitwise = page % ak::detail::kDecodeBlock == 0;
      check_paged("Causal", ak::make_spec(Causal{}), c, ak::Options{}.with_threads(2), bitwise);
      check_paged("Full, sinks, q_offset 3",
                  ak::make_spec(ak::Softmax::with_sinks({0.f, 1.f, -1.f, 2.f, 0.f, 3.f})), c,
                  ak::Options{}.with_threads(2).with_q_offset(3), bitwise);
      check_paged("Causal & (Sinks{4} | SlidingWindow{40, 0}), Softcap",
                  ak::make_spec(Causal{} & (Sinks{4} | SlidingWindow{40, 0}), ak::Softcap{6.f}), c,
                  ak::Options{}.with_threads(2), bitwise);
      check_paged("HeadLag", ak::make_spec(HeadLag{}), c, ak::Options{}.with_threads(2), bitwise);
      if (lq == 4)
        check_paged("HeadPattern (batch- and head-dependent, no classify), q_offset -2",
                    ak::make_spec(HeadPattern{}), c,
                    ak::Options{}.with_threads(2).with_q_offset(-2), bitwise);
    }
  const PagedCase<Eigen::bfloat16> c(lengths, 24, 32, 24, 3, 99);
  check_paged("Causal, bf16", ak::make_spec(Causal{}), c, ak::Options{}.with_threads(2), false);
}

TEST_CASE("paged decode: bitwise identical for 1..4 threads", "[decode_rows][paged]") {
  const PagedCase<Eigen::half> c({700, 0, 1, 1300}, 40, 40, 24, 5, 31);
  const auto spec = ak::make_spec(Causal{} & (Sinks{2} | SlidingWindow{900, 0}),
                                  ak::Softmax::with_sinks({0.f, 1.f, -1.f, 2.f, 0.f, 3.f}));
  const PagedResult one = run_paged(spec, c, ak::Options{}.with_threads(1));
  for (int t = 2; t <= 4; ++t) {
    INFO("threads " << t);
    const PagedResult r = run_paged(spec, c, ak::Options{}.with_threads(t));
    CHECK(std::memcmp(r.out.data(), one.out.data(), one.out.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(r.lse.data(), one.lse.data(), one.lse.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("paged decode: bf16 pairs over several KV groups, value dims with pairs",
          "[decode_rows][paged][bf16]") {
  const std::vector<Index> lengths = {0, 1, 17, 530, 1100};
  struct Dims {
    Index d, dv;
  };
  for (const Dims& dm : {Dims{64, 48}, Dims{128, 136}, Dims{32, 80}, Dims{40, 64}})
    for (const Index page : {16, 24})
      for (const Index lq : {1, 3}) {
        const PagedCase<bf16> c(lengths, page, dm.d, dm.dv, lq,
                                7 + static_cast<std::uint32_t>(page));
        check_paged("Causal, bf16", ak::make_spec(Causal{}), c, ak::Options{}.with_threads(2),
                    page % ak::detail::kDecodeBlock == 0);
        check_paged("HeadPattern, bf16", ak::make_spec(HeadPattern{}), c,
                    ak::Options{}.with_threads(2), page % ak::detail::kDecodeBlock == 0);
      }
}

TEST_CASE("decode rows: d 512 MQA, rows sharing each key load, gives each head's own bits",
          "[decode_rows]") {
  // Head dim 512 (Gemma 4's global layers, DeepSeek-V4's shared-KV MQA): 32 query vectors on
  // AVX-512, loaded from L1 by each of four rows that share the key vector (logits_any<4>);
  // every row sums in the order one row alone does, so 8 heads over one KV head give the bits
  // of each head decoded alone, and match the reference.
  const Shape s = shape(8, 1, 1, 1100, 512, 512);
  const auto spec = ak::make_spec(Causal{});
  check("MQA 8/1, d512", spec, s);
  check<Eigen::bfloat16>("MQA 8/1, d512, bf16", spec, s);
  const auto bits = [&](auto tag) {
    using T = decltype(tag);
    const Inputs<T> in(s, 11);
    Tensor<float> all(Layout::Padded, 1, 8, 1, 512), one(Layout::Padded, 1, 1, 1, 512);
    ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), all.view, s.options());
    for (Index h = 0; h < 8; ++h) {
      const auto q =
          ak::strided(static_cast<const float*>(in.q.view.row(0, h, 0)), {1, 1, 1, 512},
                      {in.q.view.batch_stride, in.q.view.head_stride, in.q.view.seq_stride});
      ak::decode(spec, q, in.k.cview(), in.v.cview(), one.view, s.options());
      CHECK(std::equal(one.view.row(0, 0, 0), one.view.row(0, 0, 0) + 512, all.view.row(0, h, 0)));
    }
  };
  bits(float{});
  bits(Eigen::bfloat16{});
}

TEST_CASE("decode rows: the K/V prefetch is chosen per CPU and changes no bit",
          "[decode_rows][prefetch]") {
  // Auto prefetches on Intel CPUs (a gain on the Xeon, 1.6-1.9x slower on Zen 4), but not for
  // MHA over f32 K rows wider than 256 bytes (f32 d 128: 6-14% slower on the Xeon): see
  // detail/prefetch.hpp; the CPU is read at run time, not from the build.
  CHECK(ak::detail::decode_prefetch_for(true, 4, 512));               // f32 GQA
  CHECK(ak::detail::decode_prefetch_for(true, 1, 256));               // f16 / bf16 MHA, d 128
  CHECK_FALSE(ak::detail::decode_prefetch_for(true, 1, 512));         // f32 MHA, d 128
  CHECK_FALSE(ak::detail::decode_prefetch_for(true, 1, 2048, true));  // f32 MHA, d 512
  CHECK(ak::detail::decode_prefetch_for(true, 1, 1024, false));       // bf16 MHA, d 512
  CHECK(ak::detail::decode_prefetch_for(true, 1, 544, false));        // q8_0 MHA, d 512
  CHECK_FALSE(ak::detail::decode_prefetch_for(false, 4, 256));        // AMD, Arm
  struct Restore {
    ~Restore() { ak::decode_prefetch() = ak::DecodePrefetch::Auto; }
  } restore;
  REQUIRE(ak::decode_prefetch() == ak::DecodePrefetch::Auto);
  CHECK(ak::detail::decode_prefetch_keys(4, 256) ==
        (ak::detail::cpu_is_intel() ? ak::detail::kDecodePrefetchAhead : 0));
  ak::decode_prefetch() = ak::DecodePrefetch::Off;
  CHECK(ak::detail::decode_prefetch_keys(4, 256) == 0);
  ak::decode_prefetch() = ak::DecodePrefetch::Ahead;
  CHECK(ak::detail::decode_prefetch_keys(1, 512) == ak::detail::kDecodePrefetchAhead);
  // With and without the prefetch, decode gives the same bits (GQA, bf16 K/V, 300 keys).
  const Shape s = Shape{}.lengths(3, 300).heads(8, 2).dims(64).laid_out(Layout::Bhsd);
  Inputs<Eigen::bfloat16> in(s, 17);
  const auto spec = ak::make_spec(Causal{});
  Tensor<float> off(Layout::Bhsd, s.batch, s.q_heads, s.q_len, s.dv()),
      ahead(Layout::Bhsd, s.batch, s.q_heads, s.q_len, s.dv());
  ak::decode_prefetch() = ak::DecodePrefetch::Off;
  ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), off.view, s.options());
  ak::decode_prefetch() = ak::DecodePrefetch::Ahead;
  ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), ahead.view, s.options());
  CHECK(off.memory == ahead.memory);
}
