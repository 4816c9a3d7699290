// fuzz_grads: the fuzz target's runs of attention_backward(), and of attention() and decode()
// on a block-quantized KvCache (fuzz_linear.cpp: linear attention and its backward);
// fuzz_entries.cpp decodes the inputs, shape_grads_case() and grads_defects() below fit a
// decoded case to these four entries. A TU of its own so that the build compiles it beside
// the others. Properties:
//   - a defect throws attnkit::Error and writes nothing (gradients, outputs, states, blocks);
//   - a valid call agrees with its f64 reference (reference::attention_backward(),
//     reference::attention() on the stored blocks, reference::linear_attention(),
//     reference::linear_attention_backward()) where the reference is finite, within tolerances
//     scaled by the terms' magnitudes; gives the same bits for another thread count;
//   - non-finite data stays where the reference puts it: a NaN (or inf) in one element of d_o
//     reaches no gradient the reference keeps finite (keys its row cannot see), a NaN query
//     makes its linear-attention row NaN (e[0], e[1] place them);
//   - an empty call (batch 0) with the forward's options is accepted;
//   - keys stored in a q8_0 / q4_0 cache decode to finite values, or the append is an Error.
#include "fuzz/fuzz_grads.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace attnkit_fuzz {
namespace {

// ---------------------------------------------------------------------------------------
// attention_backward(): the forward's output and row statistic from reference::attention,
// then the fast backward against reference::attention_backward.

template <class Spec>
constexpr bool has_backward() {
  using N = typename Spec::Normalizer;
  // Cosine logits and TAPA's phase: ill-conditioned gradients; shape_grads_case() drops them.
  return ak::detail::has_normalizer_backward<N>::value && ak::detail::passes<N>() == 1 &&
         !ak::detail::cosine_logits<N>() && !std::is_same_v<typename Spec::Position, ak::Tapa>;
}

template <class Spec>
void backward_one(const Case& c, const Spec& spec) {
  using N = typename Spec::Normalizer;
  constexpr bool kStat = ak::detail::row_stat_kind<N>() != ak::RowStat::None;
  const Index off = c.q_offset.value_or(c.Lk - c.Lq), rows = c.B * c.Hq * c.Lq;
  Qkv<> in(c);
  Buf<float>&q = in.q, &k = in.k, &v = in.v;
  Buf<float> o(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]), d_o(c.B, c.Hq, c.Lq, c.Dv);
  d_o.fill(1.f, seed_of(c, 3));
  place_special(c, d_o);
  Stats lse(rows);
  // The row statistic as a training loop passes it: a buffer of the rows (none for zero
  // rows), or one for Sigmoid with the defect.
  const bool with_lse = (kStat && rows > 0) || c.defect == Defect::LseWithoutStat;
  const ak::Span<float> lse_span =
      with_lse ? ak::Span<float>(lse.x.data(), rows) : ak::Span<float>();
  const ak::Options fwd = options_of(c).with_lse(kStat ? lse_span : ak::Span<float>());
  if (!returns(
          [&] { ak::reference::attention(spec, q.view(), k.view(), v.view(), o.view(), fwd); }))
    violated(c, "backward: the forward reference rejected a valid call");
  const ak::Options opt = call_options(c).with_lse(lse_span);
  Buf<float> dq(c.B, c.Hq, c.Lq, c.D), dk(c.B, c.Hkv, c.Lk, c.D), dv(c.B, c.Hkv, c.Lk, c.Dv);
  for (auto* b : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) b->snapshot();
  lse.before = lse.x;
  const auto fast = [&](Buf<float>& gq, Buf<float>& gk, Buf<float>& gv, int threads) {
    ak::attention_backward(spec, q.view(), k.view(), v.view(), o.view(), d_o.view(), gq.view(),
                           gk.view(), gv.view(), opt.with_threads(threads));
  };
  const bool ok = returns([&] { fast(dq, dk, dv, c.threads); });
  Buf<double> rq(c.B, c.Hq, c.Lq, c.D), rk(c.B, c.Hkv, c.Lk, c.D), rv(c.B, c.Hkv, c.Lk, c.Dv);
  const bool ref_ok = returns([&] {
    ak::reference::attention_backward(spec, q.view(), k.view(), v.view(), o.view(), d_o.view(),
                                      rq.view(), rk.view(), rv.view(), opt);
  });
  for (auto* b : {&q, &k, &v, &o, &d_o})
    if (!b->unchanged()) violated(c, "attention_backward changed an input");
  if (!lse.unchanged()) violated(c, "attention_backward changed the row statistic");
  if (c.defect != Defect::None) {
    if (ok) violated(c, "attention_backward accepted an invalid call");
  } else if (!ok && rows == 0) {
    violated(c, "attention_backward rejected an empty call with the forward's options");
  } else if (ok != ref_ok) {
    violated(c, verdicts_differ("attention_backward", ok, ref_ok) + " (backward)");
  }
  if (!ok) {
    if (!dq.unchanged() || !dk.unchanged() || !dv.unchanged())
      violated(c, "a rejected attention_backward wrote a gradient");
    return;
  }
  {  // the same bits for another thread count
    Buf<float> gq(c.B, c.Hq, c.Lq, c.D), gk(c.B, c.Hkv, c.Lk, c.D), gv(c.B, c.Hkv, c.Lk, c.Dv);
    fast(gq, gk, gv, c.threads == 1 ? 2 : 1);
    if (!same_bits(gq, dq) || !same_bits(gk, dk) || !same_bits(gv, dv))
      violated(c, "attention_backward's gradients depend on the thread count");
  }
  // Bounds of each gradient's terms from the magnitudes (finite data only): dP = d_o . v,
  // dS <= 2 w dP (times the ReLU power's derivative), per query row weights summing to 1
  // (Sigmoid: up to Lk), each key seen by `group` rows.
  const double qmax = finite_max(q), kmax = finite_max(k), vmax = finite_max(v),
               gmax = finite_max(d_o);
  const double scale = c.scale ? std::abs(double(*c.scale)) : 1.0 / std::sqrt(double(c.D));
  const double group = double(c.Hq / c.Hkv) * double(c.Lq), dp = double(c.Dv) * gmax * vmax;
  double factor = 1.0;
  if (c.norm == Norm::Sigmoid) factor = double(std::max<Index>(c.Lk, 1));
  if (c.norm == Norm::ReluPower) factor = 2.0 * double(c.alpha) + 1.0;
  if (c.mod == Mod::Fope) factor *= std::pow(1.0 + double(c.fope_sigma) * double(c.D), 2.0);
  const Conditioning cond = conditioning(c, qmax, kmax, reach_of(c.Lq, c.Lk, off));
  const double rel = 1e-3 + 8.0 * cond.logit_err + 4.0 * cond.value_err;
  check_tensor(c, "attention_backward dq", dq, rq, rel * scale * 2.0 * dp * kmax * factor + 1e-30,
               false);
  check_tensor(c, "attention_backward dk", dk, rk,
               rel * scale * 2.0 * dp * qmax * group * factor + 1e-30, false);
  check_tensor(c, "attention_backward dv", dv, rv, rel * gmax * group * factor + 1e-30, false);
}

// ---------------------------------------------------------------------------------------
// attention() or decode() on a KvCache of q8_0 / q4_0 blocks (keys turned by Rope as they
// are stored), against reference::attention on the stored blocks (it dequantizes them).

template <class Block, class Spec>
void quant_one(const Case& c, const Spec& spec) {
  constexpr bool kTurns = !std::is_same_v<typename Spec::Position, ak::NoPosition>;
  const Index off = c.q_offset.value_or(c.Lk - c.Lq), rows = c.B * c.Hq * c.Lq;
  const bool huge = (c.e[3] & 8) != 0;  // keys near q8_0's bound: turned, they may pass it
  ak::KvCache<Block> cache(c.B, c.Hkv, c.Lk + 1 + c.e[0] % 3, c.D, c.Dv);
  Buf<float> k(c.B, c.Hkv, c.Lk, c.D, c.bshd[1]), v(c.B, c.Hkv, c.Lk, c.Dv, c.bshd[2]);
  k.fill(huge ? 7e6f : c.k_mag, seed_of(c, 1));
  v.fill(c.v_mag, seed_of(c, 2));
  if (c.defect == Defect::QuantizeCount) {  // quantize_row() of a negative count
    std::vector<Block> out(4);
    std::memset(static_cast<void*>(out.data()), 0xa5, out.size() * sizeof(Block));
    const std::vector<Block> before = out;
    if (returns([&] { ak::quantize_row(k.data.data(), -32, out.data()); }))
      violated(c, "quantize_row accepted a negative count");
    if (std::memcmp(out.data(), before.data(), out.size() * sizeof(Block)) != 0)
      violated(c, "a rejected quantize_row wrote its blocks");
    return;
  }
  if (!append_in_runs<kTurns>(c, cache, k, v, spec.position)) {
    if (!huge) violated(c, "a quantized KvCache rejected a valid append");
    return;
  }
  // Every stored key decodes to finite values (an append that cannot encode a row throws).
  std::vector<float> row(static_cast<std::size_t>(c.D));
  const ak::View<const Block> keys = cache.keys();
  for (Index b = 0; b < c.B; ++b)
    for (Index h = 0; h < c.Hkv; ++h)
      for (Index s = 0; s < keys.seq; ++s) {
        ak::dequantize_row(keys.row(b, h, s), c.D, row.data());
        for (const float x : row)
          if (!std::isfinite(x))
            violated(c, "a quantized KvCache stored a key that decodes to " + std::to_string(x) +
                            " at b=" + std::to_string(b) + " h=" + std::to_string(h) +
                            " s=" + std::to_string(s));
      }
  if (huge) return;  // logits of keys near 7e6: nothing to compare in f32

  Buf<float> q(c.B, c.Hq, c.Lq, c.D, c.bshd[0]), o(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  Buf<double> ref(c.B, c.Hq, c.Lq, c.Dv);
  q.fill(c.q_mag, seed_of(c, 0));
  if constexpr (kTurns)
    if (!returns([&] { ak::apply_position(spec.position, q.view(), ak::Role::Query, off); }))
      violated(c, "apply_position rejected a valid call");
  o.snapshot();
  Stats lse(rows), ref_lse(rows);
  const auto plain = ak::make_spec(spec.mask, spec.normalizer, spec.score);
  const bool decode = (c.e[3] & 4) != 0 && c.Lq <= ak::kMaxDecodeQueries;
  const auto fast = [&](Buf<float>& out, Stats& st, int threads) {
    const ak::Options opt = options_of(c).with_threads(threads).with_lse(
        c.lse ? ak::Span<float>(st.x.data(), rows) : ak::Span<float>());
    if (decode)
      ak::decode(plain, q.view(), cache.keys(), cache.values(), out.view(), opt);
    else
      ak::attention(plain, q.view(), cache.keys(), cache.values(), out.view(), opt);
  };
  const bool ok = returns([&] { fast(o, lse, c.threads); });
  const bool ref_ok = returns([&] {
    ak::reference::attention(plain, q.view(), cache.keys(), cache.values(), ref.view(),
                             options_of(c).with_lse(c.lse ? ak::Span<float>(ref_lse.x.data(), rows)
                                                          : ak::Span<float>()));
  });
  if (ok != ref_ok) violated(c, verdicts_differ("attention on a quantized KvCache", ok, ref_ok));
  if (rejected(c, ok, o, lse)) return;
  same_for_threads(c, o, lse, fast);
  Case plain_case = c;  // the queries are turned already: no position in the logit error
  plain_case.mod = c.mod == Mod::Rope ? Mod::Dot : c.mod;
  compare(plain_case, decode ? "decode on a quantized KvCache" : "attention on a quantized KvCache",
          o, ref, c.lse ? &lse : nullptr, c.lse ? &ref_lse : nullptr,
          visible_keys(spec.mask, c.B, c.Hq, c.Lq, c.Lk, off), v.max_abs(),
          conditioning(plain_case, q.max_abs(), k.max_abs(), reach_of(c.Lq, c.Lk, off)));
}

}  // namespace

bool grads_entry(Entry e) {
  return e == Entry::Backward || e == Entry::Quant || e == Entry::Linear ||
         e == Entry::LinearBackward;
}

void shape_grads_case(Case& c) {
  c.profile = Profile::F32;
  switch (c.entry) {
    case Entry::Backward:  // what the backward takes, conditioned as fuzz_entries.cpp sees it
      if (cosine(c.norm)) c.norm = Norm::Softmax;  // |q|, |k| near 0: ill-conditioned
      if (c.mod == Mod::Tapa) c.mod = Mod::Dot;    // the phase's derivative: likewise
      if (c.Lk >= 250) c.Lk = c.Lk % 65;           // the f64 backward is O(Lq Lk D)
      if (c.e[2] & 1) c.B = 0;                     // an empty batch
      break;
    case Entry::Quant:
      c.norm = softmax_like(c.norm) ? c.norm : Norm::Softmax;
      if (c.mod != Mod::Rope && c.mod != Mod::Softcap) c.mod = Mod::Dot;
      c.D = 32 * (1 + c.D % 2);  // whole blocks
      c.Dv = 32 * (1 + c.Dv % 2);
      break;
    default: {  // linear attention: no normalizer, score or position; Lq = Lk when causal
      c.norm = Norm::Softmax;
      c.mod = Mod::Dot;
      c.lse = false;
      c.q_offset.reset();
      c.left = kReach;
      c.right = 0;
      c.Lk %= 65;
      const int map = c.e[4] & 3;
      if (map == 2) c.D = 1 + c.D % 8;  // Taylor2: 1 + D + D^2 features
      if (c.entry == Entry::LinearBackward && map == 1) c.e[4] &= ~3;  // Relu's kink: Elu
      if ((c.e[4] & 4) == 0) c.Lq = c.Lk;
      // NaN queries: the forward only, and not with Relu (whose reference maps NaN to 0).
      if (c.entry == Entry::LinearBackward || map == 1) c.e[0] = 0;
    }
  }
}

std::vector<Defect> grads_defects(const Case& c) {
  std::vector<Defect> d;
  switch (c.entry) {
    case Entry::Backward:
      d.push_back(Defect::ProductsInvalid);
      if (c.norm == Norm::Sigmoid && c.B * c.Lq > 0)  // a buffer of no row passes as none
        d.push_back(Defect::LseWithoutStat);
      break;
    case Entry::Quant:
      d.push_back(Defect::QuantizeCount);
      break;
    case Entry::Linear:
      d.push_back(Defect::ProductsInvalid);
      // An output of no element overlaps nothing.
      if (c.Lq > 0) d.push_back(Defect::LinearAlias);
      break;
    default:
      d.push_back(Defect::ProductsInvalid);
  }
  return d;
}

void run_backward(const Case& c) {
  const bool made = with_call_spec(c, [&](const auto& spec) {
    if constexpr (has_backward<std::decay_t<decltype(spec)>>()) backward_one(c, spec);
  });
  if (!made) violated(c, "a policy (or an unchecked call) threw Error");
}

void run_quant(const Case& c) {
  const bool made = with_call_spec(c, [&](const auto& spec) {
    using Spec = std::decay_t<decltype(spec)>;
    using Pos = typename Spec::Position;
    if constexpr (std::is_same_v<typename Spec::Normalizer, ak::Softmax> &&
                  (std::is_same_v<Pos, ak::NoPosition> ||
                   std::is_same_v<Pos, ak::Rope>)&&!std::is_same_v<typename Spec::Score,
                                                                   ak::Alibi> &&
                  !std::is_same_v<typename Spec::Score, ak::Tapa>) {
      if ((c.e[3] & 1) != 0)
        quant_one<ak::BlockQ4_0>(c, spec);
      else
        quant_one<ak::BlockQ8_0>(c, spec);
    }
  });
  if (!made) violated(c, "a policy (or an unchecked call) threw Error");
}

}  // namespace attnkit_fuzz
