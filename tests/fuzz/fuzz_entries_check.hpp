// fuzz_entries_check: what the entry-point half of the fuzz target (fuzz_entries.cpp,
// fuzz_stores.cpp) runs its calls with: buffers, the comparison with the reference, the
// specs and storage types of a case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_entries.hpp"

namespace attnkit_fuzz {

// ---------------------------------------------------------------------------------------
// Buffers: dense tensors [B, H, S, D] (BHSD or BSHD memory) with a guard tail. Inputs hold
// random values, outputs start as all-ones bytes (a NaN no computation produces here), so an
// element left unwritten fails the value checks and a stray write shows in the guard.

constexpr Index kGuard = 16;

template <class T>
struct Buf {
  Index B = 0, H = 0, S = 0, D = 0;
  bool bshd = false;
  std::vector<T> data;
  std::vector<unsigned char> before;

  Buf() = default;
  Buf(Index b, Index h, Index s, Index d, bool bshd_ = false)
      : B(b), H(h), S(s), D(d), bshd(bshd_) {
    data.resize(static_cast<std::size_t>(B * H * S * D + kGuard));
    std::memset(static_cast<void*>(data.data()), 0xff, data.size() * sizeof(T));
  }
  ak::View<T> view() {
    return bshd ? ak::bshd(data.data(), B, S, H, D) : ak::bhsd(data.data(), B, H, S, D);
  }
  double at(Index b, Index h, Index s, Index d) { return to_double(view().row(b, h, s)[d]); }
  // xorshift32 values in [-mag, mag): cheap and good enough for test data.
  void fill(float mag, std::uint32_t seed) {
    std::uint32_t x = seed * 2654435761u + 0x9e3779b9u;
    for (Index i = 0; i < B * H * S * D; ++i) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      data[static_cast<std::size_t>(i)] =
          static_cast<T>((static_cast<float>(x >> 8) * 0x1p-23f - 1.f) * mag);
    }
  }
  double max_abs() {
    double m = 0.0;
    for (Index i = 0; i < B * H * S * D; ++i)
      m = std::max(m, std::abs(to_double(data[static_cast<std::size_t>(i)])));
    return m;
  }
  void snapshot() {
    const auto* p = reinterpret_cast<const unsigned char*>(data.data());
    before.assign(p, p + data.size() * sizeof(T));
  }
  bool unchanged() const { return std::memcmp(before.data(), data.data(), before.size()) == 0; }
  bool guard_intact() const {
    const std::size_t n = static_cast<std::size_t>(B * H * S * D) * sizeof(T);
    return std::memcmp(before.data() + n, reinterpret_cast<const unsigned char*>(data.data()) + n,
                       before.size() - n) == 0;
  }
};

// Rows [begin, begin + n) along seq of every batch and head (no copy).
template <class T>
ak::View<T> seq_rows(const ak::View<T>& x, Index begin, Index n) {
  ak::View<T> part = x;
  part.data = n > 0 ? x.row(0, 0, begin) : x.data;
  part.seq = n;
  return part;
}

// Appends k and v to `cache` in up to three runs, cut at c.e[1] and c.e[2] (turned by
// `position` when kTurns). True when every append returned; else the first that threw must
// have left the cache's length as it was (checked here) and false is returned.
template <bool kTurns, class Cache, class KB, class VB, class Position>
bool append_in_runs(const Case& c, Cache& cache, KB& k, VB& v, const Position& position) {
  std::vector<Index> cuts{0, c.Lk, c.e[1] % (c.Lk + 1), c.e[2] % (c.Lk + 1)};
  std::sort(cuts.begin(), cuts.end());
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    const Index k0 = cuts[i], n = cuts[i + 1] - k0, before = cache.length();
    const bool ok = returns([&] {
      if constexpr (kTurns)
        cache.append(seq_rows(k.view(), k0, n), seq_rows(v.view(), k0, n), position);
      else
        cache.append(seq_rows(k.view(), k0, n), seq_rows(v.view(), k0, n));
    });
    if (ok) continue;
    if (cache.length() != before) violated(c, "a rejected KvCache append changed the length");
    return false;
  }
  return true;
}
// Batch b alone.
template <class T>
ak::View<T> batch_of(const ak::View<T>& x, Index b) {
  ak::View<T> part = x;
  part.data = x.row(b, 0, 0);
  part.batch = 1;
  return part;
}

// Row statistics [rows] plus a guard, starting as all-ones bytes.
struct Stats {
  std::vector<float> x, before;
  Index rows = 0;
  explicit Stats(Index n = 0) : x(static_cast<std::size_t>(n + kGuard)), rows(n) {
    std::memset(x.data(), 0xff, x.size() * sizeof(float));
    before = x;
  }
  // The buffer as a call takes it: its rows, the guard after them not part of it.
  ak::Span<float> ptr(bool on) { return on ? ak::Span<float>(x.data(), rows) : nullptr; }
  bool unchanged() const { return std::memcmp(x.data(), before.data(), x.size() * 4) == 0; }
  bool guard_intact(Index rows) const {
    return std::memcmp(x.data() + rows, before.data() + rows, kGuard * sizeof(float)) == 0;
  }
};

// ---------------------------------------------------------------------------------------
// The properties of a valid call's values.

// How far a logit may be from its f64 value, and where the conditioning needs more.
struct Conditioning {
  double logit_err = 0.0;  // absolute error of one logit (f32 products, scores, positions)
  double value_err = 0.0;  // relative error of P.V's operands (bf16 products: P and V rounded)
};

// Positions a call's queries (at offset + [0, Lq)) and keys ([0, Lk)) reach.
Index reach_of(Index Lq, Index Lk, Index offset);
// The logit error of the case's spec whose positions (and distances) stay below `reach`.
Conditioning conditioning(const Case& c, double qmax, double kmax, Index reach);
// Softmax, with the case's sinks for `heads` query heads (one more with the defect).
ak::Softmax softmax_of(const Case& c, Index heads);
// Rope and FoPE with tables of `need` positions (one short with the defect).
ak::Rope make_rope(const Case& c, Index need);
ak::Fope make_fope(const Case& c, Index need);
ak::Options options_of(const Case& c);
std::uint32_t seed_of(const Case& c, std::uint32_t tensor);

// q, k and v of a case in its layouts, drawn from its seeds at its magnitudes: B batches, Lq
// queries over Lk keys (a varlen call's packed rows), the case's own by default.
template <class Q = float, class K = Q, class V = K>
struct Qkv {
  Buf<Q> q;
  Buf<K> k;
  Buf<V> v;
  Qkv(const Case& c, Index B, Index Lq, Index Lk)
      : q(B, c.Hq, Lq, c.D, c.bshd[0]),
        k(B, c.Hkv, Lk, c.D, c.bshd[1]),
        v(B, c.Hkv, Lk, c.Dv, c.bshd[2]) {
    q.fill(c.q_mag, seed_of(c, 0));
    k.fill(c.k_mag, seed_of(c, 1));
    v.fill(c.v_mag, seed_of(c, 2));
  }
  explicit Qkv(const Case& c) : Qkv(c, c.B, c.Lq, c.Lk) {}
};

// What one call produced next to the reference, dense [B, H, Lq, Dv] rows, and the keys each
// row sees (visible[row]).
template <class O>
void compare(const Case& c, const std::string& what, Buf<O>& out, Buf<double>& ref,
             const Stats* lse, const Stats* ref_lse, const std::vector<Index>& visible, double vmax,
             const Conditioning& cond, const std::vector<double>& mass = {}) {
  const double tol = output_tolerance<O>(), eps = cond.logit_err;
  vmax = std::max(vmax, 1e-30);
  const Index H = ref.H, Lq = ref.S, Dv = ref.D;
  for (Index b = 0; b < ref.B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i) {
        const Index row = (b * H + h) * Lq + i, n = visible[static_cast<std::size_t>(row)];
        const auto where = [&] {
          std::ostringstream s;
          s << " at b=" << b << " h=" << h << " row=" << i << " (" << n << " visible keys)";
          return s.str();
        };
        const float fast_stat = lse ? lse->x[static_cast<std::size_t>(row)] : 0.f;
        const float slow_stat = ref_lse ? ref_lse->x[static_cast<std::size_t>(row)] : 0.f;
        if (n == 0) {
          for (Index d = 0; d < Dv; ++d)
            if (!(out.at(b, h, i, d) == 0.0 && ref.at(b, h, i, d) == 0.0))
              violated(c, what + ": a query that sees no key has a non-zero output" + where());
          const float empty = c.norm == Norm::Sinks ? c.sinks[static_cast<std::size_t>(h)]
                              : c.norm == Norm::ReluPower || c.norm == Norm::SoftplusL1 ? 0.f
                                                                                        : kNegInf;
          if (lse && !(fast_stat == empty && slow_stat == empty))
            violated(c, what + ": the row statistic of a query that sees no key is " +
                            std::to_string(fast_stat) + " (reference " + std::to_string(slow_stat) +
                            "), not " + std::to_string(empty) + where());
          continue;
        }
        // Relative weight error of the row: 2 eps for weights exp / softplus / ReLU^alpha
        // of the logits (the ReLU kept away from 0 by decode()); Sigmoid sums n weights.
        double rel = tol + cond.value_err + 2.0 * eps;
        if (c.norm == Norm::Sigmoid)  // a sum of weights <= 1, `mass` in all (else <= n)
          rel = (tol + 2.0 * eps) *
                (mass.empty() ? double(n) : std::max(mass[static_cast<std::size_t>(row)], 1e-6));
        if (c.norm == Norm::ReluPower) rel = tol + 4.0 * double(c.alpha) * eps;
        double stat_tol = 1e-4 * (1.0 + std::abs(double(slow_stat))) + 4.0 * eps;
        if (c.norm == Norm::ReluPower || c.norm == Norm::SoftplusL1)
          stat_tol = std::abs(double(slow_stat)) * (1e-4 + 4.0 * double(c.alpha) * eps);
        if (c.norm == Norm::Lssar) {
          // r = ReLU(N a - 1)^p over sum r: an error eps N a in N a moves r by up to
          // p N^p eps; the smaller sum r, the worse (a row near uniform LSSA weights).
          const double sum_r = std::max(std::exp(double(slow_stat)), std::exp(double(fast_stat)));
          const double moved =
              2.0 * double(c.power) * std::pow(double(n), double(c.power)) * (eps + 1e-6) / sum_r;
          rel += moved;
          stat_tol += moved;
          // Past that, f32 cannot resolve the r at all: one side may fall back (statistic
          // -inf) where the other sees r of 1e-38 (head_dim 1: every LSSA weight is log 2).
          if (moved >= 1.0) stat_tol = std::numeric_limits<double>::infinity();
        }
        const double row_tol = vmax * rel;
        for (Index d = 0; d < Dv; ++d) {
          const double fast = out.at(b, h, i, d), slow = ref.at(b, h, i, d);
          if (!(std::abs(fast - slow) <= row_tol))  // NaN (unwritten) fails too
            violated(c, what + ": " + std::to_string(fast) + " vs reference " +
                            std::to_string(slow) + " (tolerance " + std::to_string(row_tol) + ")" +
                            where() + " d=" + std::to_string(d));
        }
        if (lse && !(std::abs(double(fast_stat) - double(slow_stat)) <= stat_tol) &&
            !(fast_stat == slow_stat))  // both -inf (an LSSAR fallback row)
          violated(c, what + ": row statistic " + std::to_string(fast_stat) + " vs reference " +
                          std::to_string(slow_stat) + where());
      }
  if (!out.guard_intact()) violated(c, what + ": a write past the output");
  if (lse && !lse->guard_intact(ref.B * H * Lq)) violated(c, what + ": a write past the LSE");
}

// Sigmoid's weights do not sum to 1: their sum per row (the reference's output over values of
// 1, row_mass()) scales the row's error.
template <class V>
Buf<V> ones_like(const Buf<V>& v) {
  Buf<V> ones(v.B, v.H, v.S, v.D, v.bshd);
  std::fill(ones.data.begin(), ones.data.begin() + v.B * v.H * v.S * v.D, V(1.f));
  return ones;
}
inline std::vector<double> row_mass(Buf<double>& m) {
  std::vector<double> mass;
  for (Index b = 0; b < m.B; ++b)
    for (Index h = 0; h < m.H; ++h)
      for (Index i = 0; i < m.S; ++i) mass.push_back(m.at(b, h, i, 0));
  return mass;
}

// Per row [B, H, Lq] of a call, the keys its mask keeps at absolute query positions.
template <class Mask>
std::vector<Index> visible_keys(const Mask& mask, Index B, Index H, Index Lq, Index Lk,
                                Index offset) {
  std::vector<Index> n;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i) {
        Index count = 0;
        for (Index j = 0; j < Lk; ++j) count += mask.keep(b, h, i + offset, j) ? 1 : 0;
        n.push_back(count);
      }
  return n;
}

// ---------------------------------------------------------------------------------------
// Specs. One spec type per normalizer (with Dot) and per score or position policy (with
// Softmax), the mask SlidingWindow{left, right} with runtime reaches throughout.

// Calls f(spec) with the spec of the case, for calls with `heads` query heads whose
// positions stay below `need` (the position tables' length); false when a policy's
// constructor threw (which no decoded parameter should make it do).
template <class F>
bool with_spec(const Case& c, Index heads, Index need, F f) {
  const ak::SlidingWindow mask{c.left, c.right};
  return returns([&] {
    switch (c.mod) {
      case Mod::Dot:
        switch (c.norm) {
          case Norm::Softmax:
          case Norm::Sinks:
            return f(ak::make_spec(mask, softmax_of(c, heads)));
          case Norm::Sigmoid:
            return f(ak::make_spec(
                mask, c.sigmoid_default ? ak::Sigmoid{} : ak::Sigmoid{c.sigmoid_bias}));
          case Norm::ReluPower:
            return f(ak::make_spec(mask, ak::ReluPower{c.alpha, -1.f}));
          case Norm::SoftplusL1:
            if (c.defect == Defect::PolicySize)  // key counts for more rows than any call has
              return f(ak::make_spec(
                  mask, ak::SoftplusL1::with_key_counts(std::vector<float>(kManyRows, 1.f))));
            return f(ak::make_spec(mask, ak::SoftplusL1{}));
          case Norm::Lssar:
            return f(ak::make_spec(mask, ak::SoftplusL1Reweighted{c.power}));
          default:
            return;
        }
      case Mod::Softcap:
        return f(ak::make_spec(mask, softmax_of(c, heads), ak::Softcap{c.cap}));
      case Mod::Alibi: {
        ak::Alibi alibi = ak::Alibi::standard(heads);
        if (c.defect == Defect::PolicySize) alibi.slopes.push_back(0.25f);
        return f(ak::make_spec(mask, softmax_of(c, heads), alibi));
      }
      case Mod::Rope:
        return f(ak::make_spec(mask, softmax_of(c, heads), make_rope(c, need)));
      case Mod::Fope:
        return f(ak::make_spec(mask, softmax_of(c, heads), make_fope(c, need)));
      case Mod::Tapa:
        return f(ak::make_spec(mask, softmax_of(c, heads), ak::Tapa{c.tapa_alpha, c.tapa_theta}));
      default:
        return;
    }
  });
}

// with_spec() for the one call of case c: Hq query heads at its offset, Lq queries over Lk
// keys.
template <class F>
bool with_call_spec(const Case& c, F f) {
  return with_spec(c, c.Hq, reach_of(c.Lq, c.Lk, c.q_offset.value_or(c.Lk - c.Lq)), f);
}

template <class Q, class K, class V, class O>
struct Types {
  using q = Q;
  using k = K;
  using v = V;
  using o = O;
};

// Calls f(Types<...>{}) with the storage types of the case's profile.
template <class F>
void with_types(Profile p, F f) {
  switch (p) {
    case Profile::Bf16F16:
      return f(Types<bf16, f16, bf16, float>{});
    case Profile::F16Bf16:
      return f(Types<f16, bf16, float, f16>{});
    case Profile::Bf16Kv:
      return f(Types<float, bf16, bf16, float>{});
    default:
      return f(Types<float, float, float, float>{});
  }
}

template <class Spec>
constexpr bool mixable() {
  using Score = typename Spec::Score;
  using Position = typename Spec::Position;
  return std::is_same_v<typename Spec::Normalizer, ak::Softmax> &&
         std::is_same_v<Position, ak::NoPosition> && std::is_same_v<Score, ak::Dot>;
}

// Calls f(Types) with the case's storage types when the spec takes mixed storage, else f32.
template <class Spec, class F>
void with_storage(const Case& c, F f) {
  if constexpr (mixable<Spec>())
    with_types(c.profile, f);
  else
    f(Types<float, float, float, float>{});
}

// Checks that a rejected call wrote nothing; true when the call was rejected.
template <class O>
bool rejected(const Case& c, bool ok, const Buf<O>& out, const Stats& lse) {
  if (ok) return false;
  if (!out.unchanged()) violated(c, "a rejected call wrote its output");
  if (!lse.unchanged()) violated(c, "a rejected call wrote its row statistic");
  return true;
}

// The same bits for another thread count (the design promises it; memcmp).
template <class O, class F>
void same_for_threads(const Case& c, const Buf<O>& out, const Stats& lse, F call) {
  Buf<O> again(out.B, out.H, out.S, out.D, out.bshd);
  Stats lse_again(static_cast<Index>(lse.x.size()) - kGuard);
  const int threads = c.threads == 1 ? 2 : 1;
  call(again, lse_again, threads);
  if (std::memcmp(again.data.data(), out.data.data(), out.data.size() * sizeof(O)) != 0 ||
      (c.lse && std::memcmp(lse_again.x.data(), lse.x.data(), lse.x.size() * sizeof(float)) != 0))
    violated(c, "the result depends on the thread count (" + std::to_string(c.threads) + " vs " +
                    std::to_string(threads) + ")");
}

}  // namespace attnkit_fuzz
