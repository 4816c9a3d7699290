// fuzz_stores: the fuzz target's runs of attention_paged() on a PagedKv, attention() on a
// KvCache, moba_attention() and all_or_here(); fuzz_entries.cpp decodes the inputs. A TU of
// its own so that the build compiles the target's three in parallel.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_entries_check.hpp"

namespace attnkit_fuzz {
namespace {

const Index kPageSizes[] = {1, 2, 3, 4, 7, 8, 16, 33};
const Index kBlocks[] = {1, 2, 4, 7, 16, 64, 3, 512};
const Index kWindows[] = {1, 2, 3, 8, 64, 300, 5, 17};

}  // namespace

// attention_paged(): 1 to 3 sequences of their own lengths in a PagedKv, filled by append()
// (in two pieces) or by assign() and the page accessors; against reference::attention per
// sequence on its keys as appended.
// What attention_paged() takes: one pass, no position policy, no Alibi (static_asserts).
template <class Spec>
constexpr bool pageable() {
  using Score = typename Spec::Score;
  return ak::detail::passes<typename Spec::Normalizer>() == 1 &&
         std::is_same_v<typename Spec::Position, ak::NoPosition> &&
         !std::is_same_v<Score, ak::Alibi>;
}

template <class T, class Spec>
void paged_one(const Case& c0, const Spec& spec) {
  using Q = typename T::q;
  using P = typename T::k;  // the pool's storage
  using O = typename T::o;
  Case c = c0;
  const Index B = 1 + (c.B - 1 + c.e[0]) % 3, ps = kPageSizes[c.e[1] % std::size(kPageSizes)];
  std::vector<Index> len;
  Index pages = 0;
  for (Index b = 0; b < B; ++b) {
    const std::uint8_t x = c.e[static_cast<std::size_t>(2 + b)];
    len.push_back(x < 200 ? x % 81 : 500 + (x - 200) * 10);  // past 512: two decode chunks
    pages += (len.back() + ps - 1) / ps;
  }
  const bool assign = (c.e[6] & 1) != 0;
  // The pool's defects need pages to miss, and a page table to repeat a page in.
  if ((c.defect == Defect::PagedExhausted && pages == 0) ||
      ((c.defect == Defect::PagedRepeated || c.defect == Defect::PagedHugeLength) &&
       (!assign || pages == 0)))
    c.defect = Defect::None;
  const bool pool_defect = c.defect == Defect::PagedExhausted ||
                           c.defect == Defect::PagedRepeated || c.defect == Defect::PagedHugeLength;
  const Index spare = c.e[5] % 3;
  const Index pool = c.defect == Defect::PagedExhausted && !assign ? pages - 1 : pages + spare;
  ak::PagedKv<P> paged(pool, c.Hkv, ps, c.D, c.Dv);
  std::vector<Buf<P>> ks, vs;
  // Pool pages in a shuffled order, for assign().
  std::vector<Index> order(static_cast<std::size_t>(pool));
  for (Index p = 0; p < pool; ++p) order[static_cast<std::size_t>(p)] = p;
  std::uint32_t x = c.seed | 1;
  for (std::size_t i = order.size(); i > 1; --i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    std::swap(order[i - 1], order[x % i]);
  }
  std::size_t next = 0;
  bool broken = false;  // the page table defect applied (to the first sequence with pages)
  bool huge = false;    // PagedHugeLength: that sequence assigned a length near INT64_MAX
  for (Index b = 0; b < B; ++b) {
    ks.emplace_back(1, c.Hkv, len[static_cast<std::size_t>(b)], c.D);
    vs.emplace_back(1, c.Hkv, len[static_cast<std::size_t>(b)], c.Dv);
    ks.back().fill(c.k_mag, seed_of(c, 10 + static_cast<std::uint32_t>(b)));
    vs.back().fill(c.v_mag, seed_of(c, 20 + static_cast<std::uint32_t>(b)));
    const Index seq = paged.add_sequence(), n = len[static_cast<std::size_t>(b)];
    const ak::View<P> kb = ks.back().view(), vb = vs.back().view();
    // One append or assign; a rejected one (only a defect's) must leave the pool alone.
    const auto attempt = [&](auto op) {
      const Index free_before = paged.free_pages(), len_before = paged.length(seq);
      const std::vector<Index> table_before = paged.block_table(seq);
      if (returns(op)) return true;
      if (!pool_defect) violated(c, "PagedKv rejected a valid append or assign");
      if (paged.free_pages() != free_before || paged.block_table(seq) != table_before ||
          paged.length(seq) != len_before)
        violated(c, "a rejected PagedKv append or assign changed the pool");
      return false;
    };
    if (!assign) {
      const Index cut = c.e[7] % (n + 1);
      if (!attempt([&] { paged.append(seq, seq_rows(kb, 0, cut), seq_rows(vb, 0, cut)); }) ||
          !attempt(
              [&] { paged.append(seq, seq_rows(kb, cut, n - cut), seq_rows(vb, cut, n - cut)); }))
        return;
      continue;
    }
    const Index count = (n + ps - 1) / ps;
    std::vector<Index> mine(order.begin() + static_cast<std::ptrdiff_t>(next),
                            order.begin() + static_cast<std::ptrdiff_t>(next) + count);
    next += static_cast<std::size_t>(count);
    if (pool_defect && !broken && count > 0) {
      broken = true;
      if (c.defect == Defect::PagedHugeLength)
        huge = true;  // the length below, not the pages
      else if (c.defect == Defect::PagedExhausted)
        mine.pop_back();  // one page short of the length
      else if (count >= 2)
        mine[1] = mine[0];
      else
        mine[0] = pool;  // out of range
    }
    // The huge length: its page count overflows a naive (n + ps - 1) / ps.
    const Index length = huge ? std::numeric_limits<Index>::max() : n;
    if (!attempt([&] { paged.assign(seq, mine, length); })) return;
    for (Index t = 0; t < n; ++t)
      for (Index h = 0; h < c.Hkv; ++h) {
        const Index page = mine[static_cast<std::size_t>(t / ps)];
        std::copy_n(kb.row(0, h, t), c.D, paged.key_page(page).row(0, h, t % ps));
        std::copy_n(vb.row(0, h, t), c.Dv, paged.value_page(page).row(0, h, t % ps));
      }
  }
  if (pool_defect) violated(c, "PagedKv accepted an invalid append or assign");

  Buf<Q> q(B + (c.defect == Defect::PagedBatch), c.Hq, c.Lq, c.D + (c.defect == Defect::PagedDim),
           c.bshd[0]);
  Buf<O> o(B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  q.fill(c.q_mag, seed_of(c, 0));
  q.snapshot();
  o.snapshot();
  ak::View<O> out = o.view();
  bool alias = false;
  if constexpr (std::is_same_v<O, P>)
    if (c.defect == Defect::PagedAlias && c.Lq > 0)
      for (Index b = 0; b < B && !alias; ++b)
        if (!paged.block_table(b).empty()) {
          out.data = paged.key_page(paged.block_table(b)[0]).data;
          alias = true;
        }
  const bool invalid = c.defect != Defect::None && (c.defect != Defect::PagedAlias || alias);
  const Index rows = B * c.Hq * c.Lq;
  Stats lse(rows), ref_lse(rows);
  const ak::Options opt = options_of(c);
  const auto fast = [&](Buf<O>& dst, Stats& st, int threads) {
    ak::attention_paged(spec, q.view(), paged, alias ? out : dst.view(),
                        opt.with_threads(threads).with_lse(st.ptr(c.lse)));
  };
  const bool ok = returns([&] { fast(o, lse, c.threads); });
  if (!q.unchanged()) violated(c, "attention_paged changed q");
  if (invalid) {
    if (ok) violated(c, "attention_paged accepted an invalid call");
    rejected(c, ok, o, lse);
    for (Index b = 0; b < B; ++b)  // the pool's rows are the appended ones still
      for (Index p = 0; p < static_cast<Index>(paged.block_table(b).size()); ++p) {
        const ak::View<const P> kp = paged.sequence_keys(b, p);
        for (Index h = 0; h < c.Hkv; ++h)
          for (Index r = 0; r < kp.seq; ++r)
            if (std::memcmp(kp.row(0, h, r),
                            ks[static_cast<std::size_t>(b)].view().row(0, h, p * ps + r),
                            static_cast<std::size_t>(c.D) * sizeof(P)) != 0)
              violated(c, "a rejected attention_paged call wrote the pool");
      }
    return;
  }
  Buf<double> ref(B, c.Hq, c.Lq, c.Dv), mass(B, c.Hq, c.Lq, c.Dv);
  std::vector<Index> visible;
  bool ref_ok = true;
  Index need = 1;
  for (Index b = 0; b < B; ++b) {
    const Index n = len[static_cast<std::size_t>(b)], off = c.q_offset.value_or(n - c.Lq);
    ref_ok =
        ref_ok && returns([&] {
          ak::reference::attention(
              spec, batch_of(q.view(), b), ks[static_cast<std::size_t>(b)].view(),
              vs[static_cast<std::size_t>(b)].view(), batch_of(ref.view(), b),
              opt.with_lse(c.lse ? ak::Span<float>(ref_lse.x.data() + b * c.Hq * c.Lq, c.Hq * c.Lq)
                                 : nullptr));
        });
    if (ref_ok && c.norm == Norm::Sigmoid)
      ak::reference::attention(spec, batch_of(q.view(), b), ks[static_cast<std::size_t>(b)].view(),
                               ones_like(vs[static_cast<std::size_t>(b)]).view(),
                               batch_of(mass.view(), b), opt);
    if (!ref_ok) break;  // a q_offset past 2^62: no positions to count
    const std::vector<Index> nb = visible_keys(spec.mask, 1, c.Hq, c.Lq, n, off);
    visible.insert(visible.end(), nb.begin(), nb.end());
    need = std::max(need, reach_of(c.Lq, n, off));
  }
  if (ok != ref_ok) violated(c, verdicts_differ("attention_paged", ok, ref_ok) + " (per sequence)");
  if (rejected(c, ok, o, lse)) return;
  same_for_threads(c, o, lse, fast);
  double kmax = 0.0, vmax = 0.0;
  for (Index b = 0; b < B; ++b) {
    kmax = std::max(kmax, ks[static_cast<std::size_t>(b)].max_abs());
    vmax = std::max(vmax, vs[static_cast<std::size_t>(b)].max_abs());
  }
  compare(c, "attention_paged (page size " + std::to_string(ps) + ")", o, ref,
          c.lse ? &lse : nullptr, c.lse ? &ref_lse : nullptr, visible, vmax,
          conditioning(c, q.max_abs(), kmax, need),
          c.norm == Norm::Sigmoid ? row_mass(mass) : std::vector<double>{});
}

void run_paged(const Case& c) {
  const bool made = with_spec(c, c.Hq, 1, [&](const auto& spec) {
    using Spec = std::decay_t<decltype(spec)>;
    if constexpr (pageable<Spec>()) {
      if constexpr (mixable<Spec>())
        with_types(c.profile, [&](auto types) { paged_one<decltype(types)>(c, spec); });
      else
        paged_one<Types<float, float, float, float>>(c, spec);
    }
  });
  if (!made && c.defect != Defect::TableShort)
    violated(c, "a policy (or an unchecked call) threw Error");
}

// attention() on a KvCache filled in up to three appends -- keys turned by the spec's Rope or
// FoPE as they are stored, queries by apply_position() -- against reference::attention on the
// unturned keys with the position in the spec.
template <class T, class Spec>
void cache_one(const Case& c, const Spec& spec) {
  using Q = typename T::q;
  using S = typename T::k;  // the cache's storage
  using O = typename T::o;
  constexpr bool kTurns = !std::is_same_v<typename Spec::Position, ak::NoPosition>;
  const Index off = c.q_offset.value_or(c.Lk - c.Lq), rows = c.B * c.Hq * c.Lq;
  const Index spare = c.e[0] % 3;
  const Index capacity = c.defect == Defect::CacheFull ? c.Lk - 1 : c.Lk + spare;
  if (capacity < 0) return;  // no cache to overfill
  ak::KvCache<S> cache(c.B, c.Hkv, capacity, c.D, c.Dv);
  Buf<S> k(c.B + (c.defect == Defect::CacheBatch), c.Hkv, c.Lk, c.D, c.bshd[1]);
  Buf<S> v(c.B, c.Hkv, c.Lk, c.Dv, c.bshd[2]);
  k.fill(c.k_mag, seed_of(c, 1));
  v.fill(c.v_mag, seed_of(c, 2));
  if (!append_in_runs<kTurns>(c, cache, k, v, spec.position)) {
    if (c.defect != Defect::CacheFull && c.defect != Defect::CacheBatch)
      violated(c, "KvCache rejected a valid append");
    return;
  }
  if (c.defect == Defect::CacheBatch || c.defect == Defect::CacheFull)
    violated(c, "KvCache accepted an invalid append");

  Buf<Q> q(c.B, c.Hq, c.Lq, c.D, c.bshd[0]), turned(c.B, c.Hq, c.Lq, c.D, c.bshd[0]);
  Buf<O> o(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  Buf<double> ref(c.B, c.Hq, c.Lq, c.Dv);
  q.fill(c.q_mag, seed_of(c, 0));
  turned.data = q.data;
  o.snapshot();
  Stats lse(rows), ref_lse(rows);
  const ak::Options opt = options_of(c);
  bool ok = true;
  if constexpr (kTurns)
    ok = returns([&] { ak::apply_position(spec.position, turned.view(), ak::Role::Query, off); });
  const auto plain = ak::make_spec(spec.mask, spec.normalizer, spec.score);
  const auto fast = [&](Buf<O>& out, Stats& st, int threads) {
    ak::attention(plain, turned.view(), cache.keys(), cache.values(), out.view(),
                  opt.with_threads(threads).with_lse(st.ptr(c.lse)));
  };
  ok = ok && returns([&] { fast(o, lse, c.threads); });
  const bool ref_ok = returns([&] {
    ak::reference::attention(spec, q.view(), k.view(), v.view(), ref.view(),
                             opt.with_lse(ref_lse.ptr(c.lse)));
  });
  if (ok != ref_ok) violated(c, verdicts_differ("the cached call", ok, ref_ok));
  if (rejected(c, ok, o, lse)) return;
  same_for_threads(c, o, lse, fast);
  compare(c, "attention on a KvCache", o, ref, c.lse ? &lse : nullptr, c.lse ? &ref_lse : nullptr,
          visible_keys(spec.mask, c.B, c.Hq, c.Lq, c.Lk, off), v.max_abs(),
          conditioning(c, q.max_abs(), k.max_abs(), reach_of(c.Lq, c.Lk, off)));
}

void run_cache(const Case& c) {
  const bool made = with_call_spec(c, [&](const auto& spec) {
    using Spec = std::decay_t<decltype(spec)>;
    using Pos = typename Spec::Position;
    if constexpr (std::is_same_v<typename Spec::Normalizer, ak::Softmax> &&
                  std::is_same_v<typename Spec::Score, ak::Dot> &&
                  (std::is_same_v<Pos, ak::NoPosition> || ak::detail::transforms_rows<Pos>()))
      with_storage<Spec>(c, [&](auto types) { cache_one<decltype(types)>(c, spec); });
  });
  if (!made && c.defect != Defect::TableShort)
    violated(c, "a policy (or an unchecked call) threw Error");
}

// The sparsity drivers against reference::attention with a mask that states their routes.
struct RouteMask {  // MoBA: keys j <= i in the blocks chosen for the row
  using slot = ak::MaskSlot;
  const ak::BlockRoutes* routes;
  Index block;
  bool keep(Index b, Index h, Index i, Index j) const {
    if (j > i) return false;
    for (const Index chosen : routes->chosen(b, h, i - routes->q_offset))
      if (j / block == chosen) return true;
    return false;
  }
};
struct AhaMask {  // All-or-Here: causal, every key for full rows, else the last `window`
  using slot = ak::MaskSlot;
  const ak::AhaRoutes* routes;
  Index window, q_offset;
  bool keep(Index b, Index h, Index i, Index j) const {
    return j <= i && (routes->is_full(b, i - q_offset, h) || j > i - window);
  }
};

template <class Call, class RefMask>
void driver_one(const Case& c, const char* what, Call call, const RefMask& mask,
                const Buf<float>& q0, const Buf<float>& k0, const Buf<float>& v0) {
  Buf<float> q = q0, k = k0, v = v0, o(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  Buf<double> ref(c.B, c.Hq, c.Lq, c.Dv);
  const Index off = c.q_offset.value_or(c.Lk - c.Lq), rows = c.B * c.Hq * c.Lq;
  for (auto* b : {&q, &k, &v, &o}) b->snapshot();
  Stats lse(rows), ref_lse(rows);
  const auto fast = [&](Buf<float>& out, Stats& st, int threads) {
    call(q.view(), k.view(), v.view(), out.view(),
         options_of(c).with_threads(threads).with_lse(st.ptr(c.lse)));
  };
  const bool ok = returns([&] { fast(o, lse, c.threads); });
  if (!q.unchanged() || !k.unchanged() || !v.unchanged()) violated(c, "an input buffer changed");
  if (c.defect != Defect::None) {
    if (ok) violated(c, std::string(what) + " accepted an invalid call");
    rejected(c, ok, o, lse);
    return;
  }
  const bool ref_ok = returns([&] {
    ak::reference::attention(ak::make_spec(mask, softmax_of(c, c.Hq)), q.view(), k.view(), v.view(),
                             ref.view(), options_of(c).with_lse(ref_lse.ptr(c.lse)));
  });
  if (ok != ref_ok) violated(c, verdicts_differ(what, ok, ref_ok));
  if (rejected(c, ok, o, lse)) return;
  same_for_threads(c, o, lse, fast);
  compare(c, what, o, ref, c.lse ? &lse : nullptr, c.lse ? &ref_lse : nullptr,
          visible_keys(mask, c.B, c.Hq, c.Lq, c.Lk, off), v.max_abs(),
          conditioning(c, q.max_abs(), k.max_abs(), reach_of(c.Lq, c.Lk, off)));
}

void run_moba(const Case& c) {
  Qkv<> in(c);
  const Index block = kBlocks[c.e[0] % std::size(kBlocks)], topk = 1 + c.e[1] % 4;
  std::optional<ak::BlockRoutes> routes;
  if (!returns([&] {
        routes = ak::route_topk_blocks(in.q.view(), in.k.view(), block, topk, c.q_offset);
      }))
    violated(c, "route_topk_blocks rejected a valid call");
  Case d = c;
  switch (c.defect) {
    case Defect::RoutesOffset:
      routes->q_offset += 1;
      break;
    case Defect::RoutesList: {  // a row's own block (its last) dropped
      const auto row =
          std::find_if(routes->counts.begin(), routes->counts.end(), [](Index n) { return n > 0; });
      if (row == routes->counts.end())
        d.defect = Defect::None;  // no row chooses anything
      else
        *row -= 1;
      break;
    }
    default:
      break;
  }
  const Index call_block = c.defect == Defect::RoutesBlock ? block + 1 : block;
  const auto spec = ak::make_spec(softmax_of(d, d.Hq));
  driver_one(
      d, "moba_attention",
      [&](const auto& q, const auto& k, const auto& v, const auto& o, const ak::Options& opt) {
        ak::moba_attention(spec, q, k, v, o, *routes, call_block, opt);
      },
      RouteMask{&*routes, block}, in.q, in.k, in.v);
}

void run_all_or_here(const Case& c) {
  Qkv<> in(c);
  const Index window = c.defect == Defect::WindowZero ? 0 : kWindows[c.e[0] % std::size(kWindows)];
  const Index len = c.Lq + (c.defect == Defect::RoutesList);
  std::vector<unsigned char> full(static_cast<std::size_t>(c.B * len * c.Hq));
  std::uint32_t x = c.seed | 1;
  for (unsigned char& f : full) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    f = static_cast<unsigned char>(x % 4 < c.e[1] % 5);  // 0 to 4 quarters routed full
  }
  const ak::AhaRoutes routes(c.B, len, c.Hq, std::move(full));
  const auto spec = ak::make_spec(softmax_of(c, c.Hq));
  driver_one(
      c, "all_or_here",
      [&](const auto& q, const auto& k, const auto& v, const auto& o, const ak::Options& opt) {
        ak::all_or_here(spec, q, k, v, o, routes, window, opt);
      },
      AhaMask{&routes, std::max<Index>(window, 1), c.q_offset.value_or(c.Lk - c.Lq)}, in.q, in.k,
      in.v);
}

}  // namespace attnkit_fuzz
