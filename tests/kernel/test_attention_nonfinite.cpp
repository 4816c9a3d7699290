// attention() and reference::attention() with non-finite data. The contracts:
// - a key the mask excludes never affects any row, whatever its K and V hold (a KV cache's
//   garbage tail, poisoned future keys under Causal);
// - a NaN or +inf logit among a row's visible keys makes that row's output and LSE NaN, and
//   no other row changes ("no key", LSE -inf, is never reported for a row that saw one).
// Built for the native ISA and x86-64-v2 (ATTNKIT_PATH_TESTS): exp2, max and the product
// handle NaN and inf differently on each.
// Non-finite value rows on Partial tiles go through kernel/tiles/value_guard.hpp.
#include <Eigen/Core>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/reference/attention.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "support/reference_check.hpp"
#include "support/test_names.hpp"

namespace {

using ak::test::kInf;
using ak::test::kNaN;

// Keeps the first `valid` keys only: a KV cache whose storage runs past its length. No
// classify(): every tile is Partial, the kernel's slowest and most general path.
struct ValidPrefix {
  using slot = ak::MaskSlot;
  Index valid = 0;
  bool keep(Index /*b*/, Index /*h*/, Index /*i*/, Index j) const { return j < valid; }
};

// The same mask with a tile face: Full tiles inside the prefix, Empty past it.
struct ValidPrefixTiled : ValidPrefix {
  ak::TileKind classify(Index /*b*/, Index /*h*/, ak::Range /*q*/, ak::Range kv) const {
    if (kv.begin >= valid) return ak::TileKind::Empty;
    return kv.end <= valid ? ak::TileKind::Full : ak::TileKind::Partial;
  }
};

// Writes `value` into element `c` of key row j of every (batch, head) of t.
void poison_row(Tensor<float>& t, Index j, Index c, float value) {
  for (Index b = 0; b < t.view.batch; ++b)
    for (Index h = 0; h < t.view.heads; ++h) t.view.row(b, h, j)[c] = value;
}

struct Rows {
  Index nan = 0;       // rows with a NaN output element
  Index non_nan = 0;   // rows without
  double max_err = 0;  // over the rows that are expected finite
  bool lse_nan_matches = true;
};

// Compares fast and reference row by row: `expect_nan(b, h, r)` says which rows must be NaN
// (output and LSE); every other row must match the reference to f32 tolerance.
template <class Expect>
Rows compare_rows(const Tensor<float>& fast, const std::vector<float>& lse,
                  const Tensor<double>& ref, const std::vector<float>& lse_ref, Expect expect_nan) {
  Rows out;
  const auto& o = fast.view;
  for (Index b = 0; b < o.batch; ++b)
    for (Index h = 0; h < o.heads; ++h)
      for (Index r = 0; r < o.seq; ++r) {
        const auto at = static_cast<std::size_t>((b * o.heads + h) * o.seq + r);
        bool row_nan = false, ref_nan = false;
        double err = 0;
        for (Index c = 0; c < o.dim; ++c) {
          const float x = o.row(b, h, r)[c];
          const double y = ref.view.row(b, h, r)[c];
          row_nan = row_nan || std::isnan(x);
          ref_nan = ref_nan || std::isnan(y);
          err = std::max(err, std::abs(double(x) - y));
        }
        const bool want = expect_nan(b, h, r);
        if (row_nan)
          ++out.nan;
        else
          ++out.non_nan;
        out.lse_nan_matches = out.lse_nan_matches && std::isnan(lse[at]) == want &&
                              std::isnan(lse_ref[at]) == want && row_nan == want && ref_nan == want;
        if (!want) out.max_err = std::isnan(err) ? kInf : std::max(out.max_err, err);
      }
  return out;
}

// The inputs of a test: B batches of H heads (no GQA), Lq queries over Lk keys of dim D in
// `layout`, drawn as Inputs<float> draws them from seed 1.
ak::test::Inputs<float> inputs(Index B, Index H, Index Lq, Index Lk, Index D, Layout layout) {
  return {ak::test::Case{}.batches(B).heads(H, H).lengths(Lq, Lk).dims(D).laid_out(layout), 1};
}

// Runs the kernel and the reference on the same tensors; returns both outputs and LSEs.
struct Run {
  Tensor<float> o;
  Tensor<double> ref;
  std::vector<float> lse, lse_ref;
  Run(Index B, Index H, Index L, Index D)
      : o(Layout::Bshd, B, H, L, D),
        ref(Layout::Bhsd, B, H, L, D),
        lse(static_cast<std::size_t>(B * H * L)),
        lse_ref(lse.size()) {}
};

template <class Spec>
void run_both(const Spec& spec, const Tensor<float>& q, const Tensor<float>& k,
              const Tensor<float>& v, Run& run, int threads) {
  const auto options = ak::Options{}.with_threads(threads);
  ak::attention(spec, q.cview(), k.cview(), v.cview(), run.o.view, options.with_lse(run.lse));
  ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), run.ref.view,
                           options.with_lse(run.lse_ref));
}

// compare_rows() on a Run, CHECKing what every caller expects: NaN exactly in the rows
// expect_nan names (output and LSE, kernel and reference), the others within tol::kF32.
template <class Expect>
Rows check_rows(const Run& run, Expect expect_nan) {
  const Rows rows = compare_rows(run.o, run.lse, run.ref, run.lse_ref, expect_nan);
  CHECK(rows.lse_nan_matches);
  CHECK(rows.max_err <= tol::kF32);
  return rows;
}

}  // namespace

TEST_CASE("attention: garbage past a KV cache's valid length never reaches the output",
          "[attention][nonfinite]") {
  const float garbage = GENERATE(kNaN, kInf, -kInf);
  const bool tiled = GENERATE(false, true);
  const Index B = 1, H = 2, Lq = 70, capacity = 300, valid = 203, D = 32;
  INFO("garbage " << garbage << (tiled ? ", mask with classify()" : ", keep() only"));
  auto in = inputs(B, H, Lq, capacity, D, Layout::Bshd);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  for (Index j = valid; j < capacity; ++j)
    for (Index c = 0; c < D; ++c) {
      poison_row(k, j, c, garbage);
      poison_row(v, j, c, garbage);
    }
  // The truth: the same call on the valid prefix alone.
  Tensor<double> expected(Layout::Bhsd, B, H, Lq, D);
  auto k_valid = k.cview(), v_valid = v.cview();
  k_valid.seq = v_valid.seq = valid;
  ak::reference::attention(ak::make_spec(ak::Full{}), q.cview(), k_valid, v_valid, expected.view);

  Run run(B, H, Lq, D);
  if (tiled)
    run_both(ak::make_spec(ValidPrefixTiled{{valid}}), q, k, v, run, 2);
  else
    run_both(ak::make_spec(ValidPrefix{valid}), q, k, v, run, 2);
  CHECK(ak::test::max_abs_diff(run.ref.view, expected.view) <= 1e-12);  // f64 vs f64
  CHECK(ak::test::max_abs_diff(run.o.view, expected.view) <= tol::kF32);
  for (std::size_t i = 0; i < run.lse.size(); ++i) CHECK(std::isfinite(run.lse[i]));
}

TEST_CASE("attention: a non-finite future key under Causal leaves earlier rows untouched",
          "[attention][nonfinite]") {
  // Key j = 100 is poisoned in K, in V, or in both; under Causal (Lq = Lk) rows r < 100
  // cannot see it and must match the reference. Rows >= 100 see it: with NaN or +inf in V
  // they are not finite, and with NaN in K their logit (and so output and LSE) is NaN.
  const Index B = 2, H = 2, L = 230, D = 48, j = 100;
  const int where = GENERATE(0, 1, 2);  // 0: K, 1: V, 2: both
  const float poison = GENERATE(kNaN, kInf);
  const int threads = GENERATE(1, 2);
  INFO("poison " << poison << " in "
                 << (where == 0   ? "K"
                     : where == 1 ? "V"
                                  : "K and V")
                 << ", threads " << threads);
  auto in = inputs(B, H, L, L, D, Layout::Bshd);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  if (where != 1) poison_row(k, j, 5, poison == kInf ? kNaN : poison);  // inf in K: next case
  if (where != 0) poison_row(v, j, 7, poison);

  Run run(B, H, L, D);
  run_both(ak::make_spec(ak::Causal{}), q, k, v, run, threads);
  const auto& o = run.o.view;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index r = 0; r < L; ++r) {
        const bool finite_row =
            std::isfinite(o.row(b, h, r)[7]) && std::isfinite(o.row(b, h, r)[0]);
        if (r < j) {
          REQUIRE(finite_row);
        } else {
          REQUIRE_FALSE(finite_row);
          const auto at = static_cast<std::size_t>((b * H + h) * L + r);
          REQUIRE(std::isnan(run.lse[at]) == (where != 1));  // NaN logit <=> NaN LSE
          REQUIRE(std::isnan(run.lse_ref[at]) == (where != 1));
        }
      }
  auto first = run.o.cview();  // rows [0, j) of every head
  auto first_ref = run.ref.cview();
  first.seq = first_ref.seq = j;
  CHECK(ak::test::max_abs_diff(first, first_ref) <= tol::kF32);
}

TEST_CASE("attention: a NaN query gives NaN output and LSE in that row only",
          "[attention][nonfinite]") {
  const Index B = 1, H = 3, L = 150, D = 64, bad_row = 77, bad_head = 1;
  const bool causal = GENERATE(false, true);
  auto in = inputs(B, H, L, L, D, Layout::Bshd);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  q.view.row(0, bad_head, bad_row)[3] = kNaN;
  Run run(B, H, L, D);
  if (causal)
    run_both(ak::make_spec(ak::Causal{}), q, k, v, run, 2);
  else
    run_both(ak::make_spec(ak::Full{}), q, k, v, run, 2);
  const Rows rows =
      check_rows(run, [&](Index, Index h, Index r) { return h == bad_head && r == bad_row; });
  CHECK(rows.nan == 1);
}

TEST_CASE("attention: an infinite key gives NaN exactly where its logit is +inf or NaN",
          "[attention][nonfinite]") {
  // k[j][0] = +inf: the logit of query r is +inf where q[r][0] > 0 (its row is NaN), -inf
  // where q[r][0] < 0 (weight 0: a finite row, as if the key were masked), NaN where 0.
  const Index L = 90, D = 32, j = 40;
  auto in = inputs(1, 1, L, L, D, Layout::Bhsd);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  q.view.row(0, 0, 11)[0] = 0.f;
  k.view.row(0, 0, j)[0] = kInf;
  Run run(1, 1, L, D);
  run_both(ak::make_spec(ak::Full{}), q, k, v, run, 2);
  const Rows rows =
      check_rows(run, [&](Index, Index, Index r) { return !(q.view.row(0, 0, r)[0] < 0.f); });
  CHECK(rows.nan > 0);
  CHECK(rows.non_nan > 0);  // the seed gives both signs: the test sees both outcomes
}

TEST_CASE("attention: logits that overflow f32 give NaN, never LSE -inf",
          "[attention][nonfinite]") {
  // q . k = 1e40 overflows f32 (to +inf) but not f64: the reference stays finite, and the
  // fast path must say NaN for that row rather than "saw no key" or a silent value.
  const Index L = 20, D = 16, row = 4;
  auto in = inputs(1, 1, L, L, D, Layout::Bhsd);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  Tensor<float> o(Layout::Bhsd, 1, 1, L, D);
  for (Index c = 0; c < D; ++c) q.view.row(0, 0, row)[c] = 1e20f;
  for (Index c = 0; c < D; ++c) k.view.row(0, 0, 9)[c] = 1e20f;
  std::vector<float> lse(L);
  ak::attention(ak::make_spec(ak::Full{}), q.cview(), k.cview(), v.cview(), o.view,
                ak::Options{}.with_scale(1.f).with_lse(lse));
  CHECK(std::isnan(lse[row]));
  for (Index c = 0; c < D; ++c) CHECK(std::isnan(o.view.row(0, 0, row)[c]));
  for (Index r = 0; r < L; ++r)
    if (r != row) CHECK(std::isfinite(lse[static_cast<std::size_t>(r)]));
}

TEST_CASE("reference::attention: masked keys are never read, whatever they hold",
          "[reference][nonfinite]") {
  // Same inputs with the masked keys clean or poisoned: bit-identical results.
  const Index L = 40, D = 16;
  auto in = inputs(1, 1, L, L, D, Layout::Bhsd);
  Tensor<float>&q = in.q, &k = in.k, &v = in.v;
  const auto spec = ak::make_spec(ak::Causal{});
  const auto options = ak::Options{}.with_q_offset(-10);  // keys 30.. are every row's future
  Tensor<double> clean(Layout::Bhsd, 1, 1, L, D), poisoned(Layout::Bhsd, 1, 1, L, D);
  ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), clean.view, options);
  for (Index j = 30; j < L; ++j) {
    poison_row(k, j, 0, kNaN);
    poison_row(v, j, 1, kInf);
  }
  ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), poisoned.view, options);
  CHECK(ak::test::max_abs_diff(clean.view, poisoned.view) == 0.0);
}

namespace {

// Whether every element of row r of head 0 is NaN, and whether every other row is finite and
// within f32 tolerance of the reference.
template <class O>
bool row_all_nan(const O& o, Index r) {
  for (Index c = 0; c < o.dim; ++c)
    if (!std::isnan(double(o.row(0, 0, r)[c]))) return false;
  return true;
}
bool others_match(const Tensor<float>& o, const Tensor<double>& ref, Index skip) {
  for (Index r = 0; r < o.view.seq; ++r)
    for (Index c = 0; r != skip && c < o.view.dim; ++c) {
      const double x = o.view.row(0, 0, r)[c], y = ref.view.row(0, 0, r)[c];
      if (!(std::abs(x - y) <= tol::kF32)) return false;
    }
  return true;
}

}  // namespace

TEST_CASE("attention: a row whose visible logits all overflow f32 to -inf is NaN, not empty",
          "[attention][nonfinite]") {
  // q = 1e20, k = -1e20: every logit of row 4 is -4e40, -inf in f32. The row saw keys, so it
  // is not "no key" (a zero row that a merge drops); f32 cannot weigh them, so its output is
  // NaN. Its LSE stays -inf: the row's mass is below anything f32 holds, so a merge with a
  // part holding a finite LSE weighs it 0, exactly as f64 would. The reference, whose logits
  // go through f32's range too, agrees; other rows are untouched.
  const bool causal = GENERATE(false, true);
  const Index L = 20, D = 16, row = 4;
  Tensor<float> q(Layout::Bhsd, 1, 1, L, D), k(Layout::Bhsd, 1, 1, L, D),
      v(Layout::Bhsd, 1, 1, L, D);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  for (Index r = 0; r < L; ++r)  // the other rows small: their logits are O(1)
    for (Index c = 0; c < D; ++c)
      q.view.row(0, 0, r)[c] = r == row ? 1e20f : q.view.row(0, 0, r)[c] * 1e-20f;
  for (Index j = 0; j < L; ++j)
    for (Index c = 0; c < D; ++c) k.view.row(0, 0, j)[c] = -1e20f;
  Run run(1, 1, L, D);
  if (causal)
    run_both(ak::make_spec(ak::Causal{}), q, k, v, run, 2);
  else
    run_both(ak::make_spec(ak::Full{}), q, k, v, run, 2);
  CHECK(row_all_nan(run.o.view, row));
  CHECK(row_all_nan(run.ref.view, row));
  CHECK(run.lse[row] == -kInf);
  CHECK(run.lse_ref[row] == -kInf);
  CHECK(others_match(run.o, run.ref, row));
}

TEST_CASE("decode: logits that all overflow to -inf give NaN; chunks that do give way to others",
          "[decode][nonfinite]") {
  // One overflowing query over 1100 keys (three split-KV chunks), on the row engine (Lq = 1)
  // and on query tiles (Lq = 5). Every key at -1e20: the row is NaN (LSE -inf), in decode()
  // and attention() as in the reference. Only keys [0, 600) at -1e20: chunk 0 is all -inf for
  // that row, but the merge weighs it 0 against the finite chunks -- the answer f64 gives,
  // whatever the chunking.
  const Index q_len = GENERATE(Index{1}, Index{5});
  const Index L = 1100, D = 32;
  for (const Index overflowing : {L, Index{600}}) {
    INFO("Lq " << q_len << ", keys at -1e20: " << overflowing);
    Tensor<float> q(Layout::Bhsd, 1, 1, q_len, D), k(Layout::Bhsd, 1, 1, L, D),
        v(Layout::Bhsd, 1, 1, L, D), o(Layout::Bhsd, 1, 1, q_len, D),
        o_attention(Layout::Bhsd, 1, 1, q_len, D);
    Tensor<double> ref(Layout::Bhsd, 1, 1, q_len, D);
    q.randomize(1);
    k.randomize(2);
    v.randomize(3);
    for (Index r = 0; r < q_len; ++r)  // the other rows small: their logits are O(1)
      for (Index c = 0; c < D; ++c)
        q.view.row(0, 0, r)[c] = r == 0 ? 1e20f : q.view.row(0, 0, r)[c] * 1e-20f;
    for (Index j = 0; j < L; ++j)  // the other keys small: row 0's finite logits are O(1)
      for (Index c = 0; c < D; ++c)
        k.view.row(0, 0, j)[c] = j < overflowing ? -1e20f : k.view.row(0, 0, j)[c] * 1e-20f;
    std::vector<float> lse(q_len), lse_attention(q_len), lse_ref(q_len);
    const auto spec = ak::make_spec(ak::Causal{});
    ak::decode(spec, q.cview(), k.cview(), v.cview(), o.view, ak::Options{}.with_lse(lse));
    ak::attention(spec, q.cview(), k.cview(), v.cview(), o_attention.view,
                  ak::Options{}.with_lse(lse_attention));
    ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), ref.view,
                             ak::Options{}.with_lse(lse_ref));
    if (overflowing == L) {
      CHECK(row_all_nan(o.view, 0));
      CHECK(row_all_nan(o_attention.view, 0));
      CHECK(row_all_nan(ref.view, 0));
      CHECK(lse[0] == -kInf);
      CHECK(lse_attention[0] == -kInf);
      CHECK(lse_ref[0] == -kInf);
      CHECK(others_match(o, ref, 0));
    } else {
      CHECK(others_match(o, ref, -1));
      CHECK(others_match(o_attention, ref, -1));
      CHECK(std::abs(double(lse[0]) - double(lse_ref[0])) <= tol::kLseF32);
    }
  }
}

TEST_CASE("merge: parts that all saw keys they could not weigh give NaN, not an empty row",
          "[merge][nonfinite]") {
  // Two parts, each with LSE -inf: a NaN row (keys seen, every logit -inf) and a zero row (no
  // key). The merged row is NaN; two zero rows merge to a zero row with LSE -inf.
  const Index D = 4;
  std::vector<float> nan_row(D, kNaN), zero_row(D, 0.f), out(D, 7.f);
  const std::vector<float> stat{-kInf};
  const auto part = [&](std::vector<float>& x) {
    return ak::bhsd(static_cast<const float*>(x.data()), 1, 1, 1, D);
  };
  float merged = 0.f;
  using Parts = std::vector<ak::View<const float>>;
  ak::merge(ak::Softmax{}, Parts{part(zero_row), part(nan_row)}, {stat.data(), stat.data()},
            ak::bhsd(out.data(), 1, 1, 1, D), ak::Span<float>(&merged, 1));
  for (const float x : out) CHECK(std::isnan(x));
  CHECK(merged == -kInf);
  ak::merge(ak::Softmax{}, Parts{part(zero_row), part(zero_row)}, {stat.data(), stat.data()},
            ak::bhsd(out.data(), 1, 1, 1, D), ak::Span<float>(&merged, 1));
  for (const float x : out) CHECK(x == 0.f);
  CHECK(merged == -kInf);
}
