// fuzz_entries: the fuzz target's entry-point half (with fuzz_stores.cpp). fuzz_attention.cpp hands
// it every input whose first byte is >= kEntriesTag (fuzz_common.hpp); the rest decodes (decode(),
// below) into one call of an entry point -- attention() and decode() with every normalizer,
// score and position policy, merge(), attention_varlen(), attention_paged() on a PagedKv,
// attention() on a KvCache, moba_attention() and all_or_here() -- with its sizes, storage
// types (per view), policy parameters and data, valid or with one deliberate defect. The
// harness aborts with a message when a property is violated:
//   - a defect (and only what the reference refuses too) throws attnkit::Error, before
//     anything is written: outputs, row statistics, caches and pools stay as they were;
//   - a valid call leaves its inputs alone, writes every output element and nothing past
//     them, gives the same bits for another thread count, and agrees with
//     attnkit::reference::attention on the same keys (per sequence, per page table, with a
//     mask that states the routes of the sparsity drivers) within the tolerances below.
// Data are finite and moderate here: fuzz_attention.cpp's own inputs hunt the extremes.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_entries_check.hpp"

namespace attnkit_fuzz {
namespace {

const char* const kEntryNames[] = {"attention", "decode", "merge",  "varlen",
                                   "paged",     "cache",  "moba",   "all_or_here",
                                   "backward",  "quant",  "linear", "linear_backward"};
const char* const kNormNames[] = {"softmax",    "softmax+sinks", "sigmoid",
                                  "relu-power", "softplus-l1",   "softplus-l1-reweighted"};
const char* const kModNames[] = {"dot", "softcap", "alibi", "rope", "fope", "tapa"};
const char* const kProfileNames[] = {"f32/f32/f32->f32", "bf16/f16/bf16->f32", "f16/bf16/f32->f16",
                                     "f32/bf16/bf16->f32"};
static_assert(std::size(kEntryNames) == static_cast<std::size_t>(Entry::kCount));
static_assert(std::size(kNormNames) == static_cast<std::size_t>(Norm::kCount));
static_assert(std::size(kModNames) == static_cast<std::size_t>(Mod::kCount));
static_assert(std::size(kProfileNames) == static_cast<std::size_t>(Profile::kCount));

struct Heads {
  Index kv, q;
};
const Heads kHeads[] = {{1, 1}, {1, 2}, {2, 2}, {2, 4}, {1, 4}, {3, 3}, {1, 3}, {4, 4}};
const Index kLefts[] = {kReach, kReach, 0, 1, 3, 16, 100, 700};
const Index kRights[] = {0, 0, kReach, 2};  // 0: causal, kReach: every later key too
const int kThreads[] = {1, 2, 0, 3};
const Index kFarOffsets[] = {Index{1} << 40, -(Index{1} << 40), Index{1} << 62,
                             std::numeric_limits<Index>::max()};  // the last: an Error
const float kMags[] = {1.f, 0.5f, 2.f, 4.f};
const float kCaps[] = {1.f, 5.f, 30.f, 0.5f};
const float kSinkLogits[] = {0.f, 2.f, -3.f, 8.f, kNegInf, -1.f, 5.f, 1.f};
const float kSigmoidBiases[] = {0.f, -1.f, 2.f, -4.f};  // or the default -log Lk
const float kAlphas[] = {1.f, 2.f, 0.5f, 3.f};          // ReluPower
const float kPowers[] = {1.f, 2.f, 3.f, 1.5f};          // LSSAR (sharper: ill-conditioned)
const float kTapaAlphas[] = {0.1f, 0.5f, 1.f, 0.25f};
const float kTapaThetas[] = {0.5f, 1.f, 0.25f, 0.75f};

const char* const kDefectNames[] = {"none",           "decode-17-rows",   "lse-without-stat",
                                    "scale-refused",  "policy-size",      "table-short",
                                    "merge-shape",    "merge-stats",      "merge-alias",
                                    "varlen-start",   "varlen-order",     "varlen-total",
                                    "varlen-count",   "varlen-batch",     "paged-batch",
                                    "paged-dim",      "paged-alias",      "paged-exhausted",
                                    "paged-repeated", "cache-full",       "cache-batch",
                                    "routes-offset",  "routes-block",     "routes-list",
                                    "window-zero",    "products-invalid", "linear-alias",
                                    "quantize-count", "paged-huge-length"};
static_assert(std::size(kDefectNames) == static_cast<std::size_t>(Defect::kCount));

}  // namespace

// The input format (after the tag byte), one byte per field:
//   entry, normalizer, score/position, mask (left, right), profile, B, heads, Lq, Lk, D, Dv,
//   layouts, options (lse, threads, bf16 products), scale, q_offset, magnitudes, seed (4 bytes),
//   policy parameters (4 bytes), entry parameters (8 bytes), defect (>= 128: 128 + the
//   index of a Defect less one, kept when it applies to the entry and spec).
// tests/fuzz/make_corpus.py writes seeds in this format (encode_entry()).
Case decode(Bytes& in) {
  Case c;
  c.entry = static_cast<Entry>(in.next() % static_cast<int>(Entry::kCount));
  Norm norm = static_cast<Norm>(in.next() % static_cast<int>(Norm::kCount));
  Mod mod = static_cast<Mod>(in.next() % static_cast<int>(Mod::kCount));
  const std::uint8_t mask = in.next(), profile = in.next();
  // What each entry takes (static_asserts otherwise, or instantiations saved).
  switch (c.entry) {
    case Entry::Decode:
    case Entry::Paged:
      if (norm == Norm::Lssar) norm = Norm::SoftplusL1;  // one pass only
      break;
    case Entry::Merge:
      if (norm == Norm::Lssar) norm = Norm::SoftplusL1;
      mod = Mod::Dot;
      break;
    case Entry::Cache:
      norm = softmax_like(norm) ? norm : Norm::Softmax;
      if (mod != Mod::Rope && mod != Mod::Fope) mod = Mod::Dot;  // keys stored turned
      break;
    case Entry::Moba:
      norm = Norm::Softmax;  // sinks only as a defect
      mod = Mod::Dot;
      break;
    case Entry::AllOrHere:
      norm = softmax_like(norm) ? norm : Norm::Softmax;
      mod = Mod::Dot;
      break;
    default:
      break;
  }
  if (c.entry == Entry::Paged && mod != Mod::Dot) mod = Mod::Softcap;  // position-free only
  if (mod != Mod::Dot && !softmax_like(norm)) norm = Norm::Softmax;
  c.norm = norm;
  c.mod = mod;
  const bool full_mask = c.entry == Entry::Moba || c.entry == Entry::AllOrHere;
  c.left = full_mask ? kReach : kLefts[mask % std::size(kLefts)];
  c.right = full_mask ? kReach : kRights[(mask >> 3) % std::size(kRights)];
  const bool mixed = softmax_like(norm) && mod == Mod::Dot &&
                     (c.entry == Entry::Attention || c.entry == Entry::Decode ||
                      c.entry == Entry::Paged || c.entry == Entry::Cache);
  c.profile =
      mixed ? static_cast<Profile>(profile % static_cast<int>(Profile::kCount)) : Profile::F32;

  c.B = in.in(1, 2);
  const Heads heads = in.pick(kHeads);
  c.Hq = heads.q;
  c.Hkv = heads.kv;
  c.Lq = in.in(0, 24);
  const std::uint8_t lk = in.next();
  // Lk >= 1024 takes attention() to split-KV (with Lq <= 16), 250..523 spans key tiles.
  c.Lk = lk < 160 ? lk % 65 : lk < 200 ? 250 + (lk - 160) * 7 : 1000 + (lk - 200) * 4;
  if (c.Lk >= 250 || c.entry == Entry::Decode) c.Lq %= 17;
  c.D = in.in(1, 40);
  c.Dv = in.in(1, 40);
  if (position(mod)) c.D += c.D % 2;  // Rope and FoPE turn pairs
  const std::uint8_t layouts = in.next();
  for (int i = 0; i < 4; ++i) c.bshd[static_cast<std::size_t>(i)] = (layouts >> i & 1) != 0;
  const std::uint8_t options = in.next();
  c.lse = (options & 1) != 0;
  c.threads = kThreads[(options >> 1) % std::size(kThreads)];
  const std::uint8_t scale = in.next(), offset = in.next();
  if (scale >= 192) c.scale = scale & 1 ? 0.5f : -0.25f;
  if (offset >= 192) c.q_offset = c.Lk - c.Lq + (offset % 9) - 4;  // around the default
  // Far positions (valid up to |q_offset| = 2^62, past it an Error), for the pages' iota.
  if (offset >= 252 && c.entry == Entry::Paged) c.q_offset = kFarOffsets[offset % 4];
  const std::uint8_t mags = in.next();
  c.q_mag = kMags[mags % 4];
  c.k_mag = kMags[(mags >> 2) % 4];
  c.v_mag = kMags[(mags >> 4) % 4];
  c.seed = in.u32();

  const std::uint8_t p0 = in.next(), p1 = in.next(), p2 = in.next(), p3 = in.next();
  c.cap = kCaps[p0 % 4];
  c.sigmoid_default = (p0 & 4) == 0;
  c.sigmoid_bias = kSigmoidBiases[(p0 >> 3) % 4];
  c.alpha = kAlphas[p0 % 4];
  c.power = kPowers[(p0 >> 3) % 4];
  c.tapa_alpha = kTapaAlphas[p1 % 4];
  c.tapa_theta = kTapaThetas[(p1 >> 2) % 4];
  c.gptj = (p1 & 1) != 0;
  c.partial_rope = (p1 & 2) != 0;
  c.fope_sigma = (p1 & 4) != 0 ? 0.1f : 0.f;
  c.fope_train = (p1 & 8) != 0 ? 64 : 0;
  c.fope_reference_code = (p1 & 16) != 0;
  for (Index h = 0; h < c.Hq; ++h)
    c.sinks.push_back(kSinkLogits[(p2 + 3 * static_cast<int>(h)) % std::size(kSinkLogits)]);
  c.rope_scaling = p3 % 3;
  for (std::uint8_t& b : c.e) b = in.next();
  if (grads_entry(c.entry)) shape_grads_case(c);
  // Bf16 products: a permission of the softmax tile kernel; the error bound of its rounded
  // operands (conditioning()) holds for the moderate data here.
  c.bf16_products = (options & 8) != 0 && softmax_like(c.norm) && c.mod != Mod::Fope &&
                    c.mod != Mod::Tapa && c.entry != Entry::Quant && c.entry != Entry::Linear &&
                    c.entry != Entry::LinearBackward;

  const std::uint8_t defect = in.next();
  if (defect >= 128) {
    // The defect named, if it applies to this entry and spec (else none).
    std::vector<Defect> apply;
    const auto add = [&](Defect d) { apply.push_back(d); };
    const bool call =
        c.entry == Entry::Attention || c.entry == Entry::Decode || c.entry == Entry::Varlen;
    if (c.entry == Entry::Decode) add(Defect::DecodeTooManyRows);
    if (norm == Norm::Sigmoid && c.entry != Entry::Cache) add(Defect::LseWithoutStat);
    if (call && (mod == Mod::Tapa || cosine(norm))) add(Defect::ScaleRefused);
    if (norm == Norm::Sinks || mod == Mod::Alibi || (call && norm == Norm::SoftplusL1))
      add(Defect::PolicySize);
    if (position(mod) && c.entry != Entry::Cache) add(Defect::TableShort);
    switch (c.entry) {
      case Entry::Merge:
        add(Defect::MergeShape);
        add(Defect::MergeAlias);
        if (norm != Norm::Sigmoid) add(Defect::MergeStats);  // Sigmoid's are ignored
        break;
      case Entry::Varlen:
        for (Defect d : {Defect::VarlenStart, Defect::VarlenOrder, Defect::VarlenTotal,
                         Defect::VarlenCount, Defect::VarlenBatch})
          add(d);
        break;
      case Entry::Paged:
        for (Defect d : {Defect::PagedBatch, Defect::PagedDim, Defect::PagedAlias,
                         Defect::PagedExhausted, Defect::PagedRepeated})
          add(d);
        add(Defect::PagedHugeLength);
        break;
      case Entry::Cache:
        add(Defect::CacheFull);
        add(Defect::CacheBatch);
        break;
      case Entry::Moba:
        for (Defect d :
             {Defect::RoutesOffset, Defect::RoutesBlock, Defect::RoutesList, Defect::PolicySize})
          add(d);
        break;
      case Entry::AllOrHere:
        add(Defect::RoutesList);
        add(Defect::WindowZero);
        break;
      default:
        break;
    }
    if (grads_entry(c.entry)) apply = grads_defects(c);
    const auto named =
        static_cast<Defect>(1 + (defect - 128) % (static_cast<int>(Defect::kCount) - 1));
    if (std::find(apply.begin(), apply.end(), named) != apply.end()) c.defect = named;
  }
  if (c.defect == Defect::DecodeTooManyRows) c.Lq = 17;
  if (c.defect == Defect::LseWithoutStat) c.lse = true;
  if (c.norm == Norm::Sigmoid && c.lse) c.defect = Defect::LseWithoutStat;  // no row statistic
  if (c.scale && (cosine(c.norm) || c.mod == Mod::Tapa) && c.defect == Defect::None) {
    if (c.entry == Entry::Merge)
      c.scale.reset();  // merge() has no scale: its parts would refuse it
    else if (c.entry == Entry::Attention || c.entry == Entry::Decode || c.entry == Entry::Varlen)
      c.defect = Defect::ScaleRefused;
  }
  if (c.defect == Defect::ScaleRefused && !c.scale) c.scale = 0.5f;
  if (c.defect == Defect::PolicySize && c.entry == Entry::Moba) c.norm = Norm::Sinks;
  // Queries at huge positions would ask for huge position tables: keep them near.
  if (position(mod) && c.q_offset && *c.q_offset > c.Lk + 8) c.q_offset = c.Lk;
  // ReLU(s - bias)^alpha is ill-conditioned near s = bias: logits in [-1/2, 1/2] with bias
  // -1 keep every weight away from it (fuzz_attention.cpp fuzzes the general case).
  if (c.norm == Norm::ReluPower) {
    const double scale = c.scale ? std::abs(*c.scale) : 1.0 / std::sqrt(double(c.D));
    c.q_mag = static_cast<float>(0.5 / (scale * double(c.D) * double(c.k_mag)));
  }
  return c;
}

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "entry=" << kEntryNames[static_cast<int>(c.entry)]
    << " norm=" << kNormNames[static_cast<int>(c.norm)]
    << " mod=" << kModNames[static_cast<int>(c.mod)]
    << " storage=" << kProfileNames[static_cast<int>(c.profile)] << " mask=window{"
    << (c.left == kReach ? "max" : std::to_string(c.left)) << ","
    << (c.right == kReach ? "max" : std::to_string(c.right)) << "} B=" << c.B << " Hq=" << c.Hq
    << " Hkv=" << c.Hkv << " Lq=" << c.Lq << " Lk=" << c.Lk << " D=" << c.D << " Dv=" << c.Dv
    << " layouts=" << c.bshd[0] << c.bshd[1] << c.bshd[2] << c.bshd[3] << " lse=" << c.lse
    << " threads=" << c.threads << " scale=" << (c.scale ? std::to_string(*c.scale) : "default")
    << " q_offset=" << (c.q_offset ? std::to_string(*c.q_offset) : "default") << " mags=" << c.q_mag
    << "/" << c.k_mag << "/" << c.v_mag << " seed=" << c.seed << " cap=" << c.cap
    << " sigmoid_bias=" << (c.sigmoid_default ? "default" : std::to_string(c.sigmoid_bias))
    << " alpha=" << c.alpha << " power=" << c.power << " tapa=" << c.tapa_alpha << "/"
    << c.tapa_theta << " rope=" << (c.gptj ? "gptj" : "neox") << (c.partial_rope ? "/partial" : "")
    << "/scaling" << c.rope_scaling << " fope=" << c.fope_sigma << "/" << c.fope_train
    << (c.fope_reference_code ? "/reference-code" : "")
    << " products=" << (c.bf16_products ? "bf16" : "exact") << " e=";
  for (std::uint8_t b : c.e) s << int(b) << ",";
  s << " defect=" << kDefectNames[static_cast<int>(c.defect)];
  return s.str();
}

[[noreturn]] void violated(const Case& c, const std::string& what) {
  std::fprintf(stderr, "\nfuzz_entries: property violated: %s\n  case: %s\n", what.c_str(),
               describe(c).c_str());
  std::abort();
}

// Positions a call's queries (at offset + [0, Lq)) and keys ([0, Lk)) reach.
// Positions run from offset to offset + Lq - 1 (queries) and 0 to Lk - 1 (keys); a table of
// `reach` positions holds (-reach, reach), open at both ends: -offset needs reach 1 - offset.
// Without queries the offset is no position at all: a table need not reach it (a varlen
// sequence of no query and one key at offset 15 was expected refused with a 14-row table).
Index reach_of(Index Lq, Index Lk, Index offset) {
  const Index queries = Lq > 0 ? std::max(offset + Lq, 1 - offset) : 1;
  return std::max<Index>({Lk, queries, 1});
}

// The logit error of a spec whose positions (and distances) stay below `reach`.
Conditioning conditioning(const Case& c, double qmax, double kmax, Index reach_) {
  const double D = double(c.D), reach = double(reach_);
  const double scale = c.scale ? std::abs(double(*c.scale)) : 1.0 / std::sqrt(D);
  double bound = scale * D * qmax * kmax;  // |q . k| scaled; rotations keep norms
  if (c.mod == Mod::Fope) bound *= std::pow(1.0 + double(c.fope_sigma) * D, 2.0);
  if (c.mod == Mod::Alibi) bound += 0.5 * reach;  // slopes <= 1/2
  if (c.mod == Mod::Tapa)  // the phase's argument 2 pi |i - j|^alpha q_P . k_P / sqrt(d - a)
    bound *= 1.0 + 6.3 * std::pow(reach, double(c.tapa_alpha)) * std::sqrt(D) * qmax * kmax;
  if (cosine(c.norm)) bound = std::log(D + 1.0) * std::log(reach + 2.0) + 1.0;
  // Bf16 products round q and k (2^-8 of each: 2^-7 of the logit's terms) and P and V.
  if (c.bf16_products) return Conditioning{1e-5 * bound + 1e-6 + 0x1p-7 * bound, 0x1p-7};
  return Conditioning{1e-5 * bound + 1e-6};
}

ak::Softmax softmax_of(const Case& c, Index heads) {
  if (c.norm != Norm::Sinks) return ak::Softmax{};
  std::vector<float> sinks = c.sinks;
  if (c.defect == Defect::PolicySize) sinks.push_back(0.f);
  sinks.resize(static_cast<std::size_t>(heads + (c.defect == Defect::PolicySize)));
  return ak::Softmax::with_sinks(sinks);
}

// Position tables of `need` positions (reach_of()), one short with the defect (0: the
// table's constructor refuses it).
Index table_len(const Case& c, Index need) {
  return c.defect == Defect::TableShort ? need - 1 : need;
}

ak::Rope make_rope(const Case& c, Index need) {
  const Index rot = c.partial_rope && c.D >= 4 ? c.D / 2 - (c.D / 2) % 2 : c.D;
  ak::RopeScaling scaling;
  if (c.rope_scaling == 1) scaling = ak::RopeScaling::linear(2.0);
  if (c.rope_scaling == 2) scaling = ak::RopeScaling::yarn(4.0, 32.0);
  return ak::Rope(ak::RopeTable(rot, 10000.0, table_len(c, need), scaling),
                  c.gptj ? ak::RopePairing::GptJ : ak::RopePairing::NeoX);
}

ak::Fope make_fope(const Case& c, Index need) {
  ak::FopeConfig cfg;
  cfg.head_dim = c.D;
  cfg.max_len = table_len(c, need);
  cfg.train_len = c.fope_train;
  cfg.kv_heads = c.Hkv;
  cfg.q_heads = c.Hq;
  if (c.fope_reference_code) cfg.padding = ak::FopePadding::ReferenceCode;
  return ak::Fope::drawn(cfg, c.fope_sigma, c.seed);
}

ak::Options options_of(const Case& c) {
  ak::Options o;
  o.scale = c.scale;
  o.q_offset = c.q_offset;
  o.threads = c.threads;
  if (c.bf16_products) o.products = ak::Products::Bf16;
  return o;
}

std::uint32_t seed_of(const Case& c, std::uint32_t tensor) {
  return c.seed ^ (tensor * 0x85ebca6bu);
}

// attention() or decode() on one call, against reference::attention on the same views.
template <class T, class Spec>
void call_one(const Case& c, const Spec& spec) {
  using Q = typename T::q;
  using K = typename T::k;
  using V = typename T::v;
  using O = typename T::o;
  const Index off = c.q_offset.value_or(c.Lk - c.Lq), rows = c.B * c.Hq * c.Lq;
  Qkv<Q, K, V> in(c);
  Buf<Q>& q = in.q;
  Buf<K>& k = in.k;
  Buf<V>& v = in.v;
  Buf<O> o(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  Buf<double> ref(c.B, c.Hq, c.Lq, c.Dv);
  q.snapshot();
  k.snapshot();
  v.snapshot();
  o.snapshot();
  Stats lse(rows), ref_lse(rows);
  const ak::Options opt = options_of(c);
  const bool decode = c.entry == Entry::Decode;
  const auto fast = [&](Buf<O>& out, Stats& st, int threads) {
    const ak::Options o2 = opt.with_threads(threads).with_lse(st.ptr(c.lse));
    if constexpr (ak::detail::passes<typename Spec::Normalizer>() == 1)  // decode() takes it
      if (decode) return ak::decode(spec, q.view(), k.view(), v.view(), out.view(), o2);
    ak::attention(spec, q.view(), k.view(), v.view(), out.view(), o2);
  };
  const bool ok = returns([&] { fast(o, lse, c.threads); });
  const bool ref_ok = returns([&] {
    ak::reference::attention(spec, q.view(), k.view(), v.view(), ref.view(),
                             opt.with_lse(ref_lse.ptr(c.lse)));
  });
  if (!q.unchanged() || !k.unchanged() || !v.unchanged()) violated(c, "an input buffer changed");
  if (c.defect != Defect::None && ok) violated(c, "an invalid call was accepted");
  if (c.defect != Defect::DecodeTooManyRows && ok != ref_ok)
    violated(c, verdicts_differ(decode ? "decode" : "attention", ok, ref_ok));
  if (rejected(c, ok, o, lse)) return;
  same_for_threads(c, o, lse, fast);
  Buf<double> mass(c.B, c.Hq, c.Lq, c.Dv);
  if (c.norm == Norm::Sigmoid)
    ak::reference::attention(spec, q.view(), k.view(), ones_like(v).view(), mass.view(), opt);
  compare(c, decode ? "decode" : "attention", o, ref, c.lse ? &lse : nullptr,
          c.lse ? &ref_lse : nullptr, visible_keys(spec.mask, c.B, c.Hq, c.Lq, c.Lk, off),
          v.max_abs(), conditioning(c, q.max_abs(), k.max_abs(), reach_of(c.Lq, c.Lk, off)),
          c.norm == Norm::Sigmoid ? row_mass(mass) : std::vector<double>{});
}

void run_call(const Case& c) {
  const bool made = with_call_spec(c, [&](const auto& spec) {
    using Spec = std::decay_t<decltype(spec)>;
    with_storage<Spec>(c, [&](auto types) { call_one<decltype(types)>(c, spec); });
  });
  if (!made && c.defect != Defect::TableShort)
    violated(c, "a policy (or an unchecked call) threw Error");
}

// merge(): attention() over 1 to 3 key ranges, each with its row statistic, merged; against
// reference::attention over all the keys. The parts run as split-KV would run them: plain
// Softmax (the sink counts once, in the merge), the whole call's Sigmoid bias and SoftplusL1
// key counts.
template <class O, class Whole, class Part>
void merge_one(const Case& c0, const Whole& whole, const Part& part_norm,
               const std::vector<Index>& visible) {
  Case c = c0;  // an output of no element overlaps nothing
  if (c.defect == Defect::MergeAlias && c.Lq == 0) c.defect = Defect::None;
  constexpr bool kStat = ak::detail::row_stat_kind<Whole>() != ak::RowStat::None;
  const Index off = c.q_offset.value_or(c.Lk - c.Lq), rows = c.B * c.Hq * c.Lq;
  const ak::SlidingWindow mask{c.left, c.right};
  Qkv<> in(c);
  Buf<float>&q = in.q, &k = in.k, &v = in.v;
  std::vector<Index> cuts{0, c.Lk};
  for (Index p = 1; p < 1 + c.e[0] % 3; ++p)
    cuts.push_back(c.e[static_cast<std::size_t>(p)] % (c.Lk + 1));
  std::sort(cuts.begin(), cuts.end());
  const std::size_t n = cuts.size() - 1;
  std::vector<Buf<float>> part_out(n);
  std::vector<Stats> part_stat(n, Stats(rows));
  std::vector<ak::View<const float>> parts;
  std::vector<const float*> stats;
  const ak::Options opt = options_of(c);
  for (std::size_t p = 0; p < n; ++p) {
    const Index k0 = cuts[p], nk = cuts[p + 1] - k0;
    part_out[p] = Buf<float>(c.B, c.Hq, c.Lq, c.Dv);
    const bool ok = returns([&] {
      ak::attention(ak::make_spec(mask, part_norm), q.view(), seq_rows(k.view(), k0, nk),
                    seq_rows(v.view(), k0, nk), part_out[p].view(),
                    opt.with_q_offset(off - k0).with_lse(part_stat[p].ptr(kStat)));
    });
    if (!ok) violated(c, "merge: a part's attention() call was rejected");
    parts.push_back(part_out[p].view());
    if (kStat) stats.push_back(part_stat[p].x.data());
  }
  Buf<O> out(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  ak::View<O> out_view = out.view();
  if constexpr (std::is_same_v<O, float>)
    if (c.defect == Defect::MergeAlias) out_view = part_out[0].view();
  if (c.defect == Defect::MergeShape) parts[0].seq += 1;
  if (c.defect == Defect::MergeStats) stats.push_back(part_stat[0].x.data());
  out.snapshot();
  for (Buf<float>& p : part_out) p.snapshot();
  Stats lse(rows), ref_lse(rows);
  const bool ok = returns([&] { ak::merge(whole, parts, stats, out_view, lse.ptr(c.lse)); });
  for (Buf<float>& p : part_out)
    if (!p.unchanged()) violated(c, "merge changed a part");
  if (c.defect != Defect::None) {
    if (ok) violated(c, "merge accepted an invalid call");
    rejected(c, ok, out, lse);
    return;
  }
  Buf<double> ref(c.B, c.Hq, c.Lq, c.Dv);
  const bool ref_ok = returns([&] {
    ak::reference::attention(ak::make_spec(mask, whole), q.view(), k.view(), v.view(), ref.view(),
                             opt.with_lse(ref_lse.ptr(c.lse)));
  });
  if (!ok || !ref_ok) violated(c, "merge or the reference rejected a valid call");
  Buf<double> mass(c.B, c.Hq, c.Lq, c.Dv);
  if (c.norm == Norm::Sigmoid)
    ak::reference::attention(ak::make_spec(mask, whole), q.view(), k.view(), ones_like(v).view(),
                             mass.view(), opt);
  compare(c, "merge of " + std::to_string(n) + " parts", out, ref, c.lse ? &lse : nullptr,
          c.lse ? &ref_lse : nullptr, visible, v.max_abs(),
          conditioning(c, q.max_abs(), k.max_abs(), reach_of(c.Lq, c.Lk, off)),
          c.norm == Norm::Sigmoid ? row_mass(mass) : std::vector<double>{});
}

void run_merge(const Case& c) {
  const Index off = c.q_offset.value_or(c.Lk - c.Lq);
  const std::vector<Index> visible =
      visible_keys(ak::SlidingWindow{c.left, c.right}, c.B, c.Hq, c.Lq, c.Lk, off);
  const auto go = [&](const auto& whole, const auto& part) {
    if (c.e[4] & 1 && c.defect != Defect::MergeAlias)
      merge_one<f16>(c, whole, part, visible);
    else
      merge_one<float>(c, whole, part, visible);
  };
  switch (c.norm) {
    case Norm::Softmax:
    case Norm::Sinks:
      return go(softmax_of(c, c.Hq), ak::Softmax{});
    case Norm::Sigmoid: {
      const float bias = c.Lk > 0 ? -std::log(static_cast<float>(c.Lk)) : 0.f;
      const ak::Sigmoid whole = c.sigmoid_default ? ak::Sigmoid{} : ak::Sigmoid{c.sigmoid_bias};
      return go(whole, ak::Sigmoid{c.sigmoid_default ? bias : c.sigmoid_bias});
    }
    case Norm::ReluPower:
      return go(ak::ReluPower{c.alpha, -1.f}, ak::ReluPower{c.alpha, -1.f});
    default:
      return go(ak::SoftplusL1{}, ak::SoftplusL1::with_key_counts(
                                      std::vector<float>(visible.begin(), visible.end())));
  }
}

// attention_varlen(): 1 to 4 packed sequences, against reference::attention per sequence.
struct Packing {
  std::vector<Index> cu_q{0}, cu_k{0};
  Index need = 1;  // positions any sequence reaches
};

Packing packing(const Case& c) {
  Packing p;
  const Index seqs = 1 + c.e[0] % 4;
  for (Index s = 0; s < seqs; ++s) {
    const std::uint8_t b = c.e[static_cast<std::size_t>(1 + s)];
    const Index nq = (b & 15) % 9, nk = (b >> 4) * 5 + c.e[5] % 5;
    p.cu_q.push_back(p.cu_q.back() + nq);
    p.cu_k.push_back(p.cu_k.back() + nk);
    p.need = std::max(p.need, reach_of(nq, nk, c.q_offset.value_or(nk - nq)));
  }
  return p;
}

template <class Spec>
void varlen_one(const Case& c, const Spec& spec, const Packing& pk) {
  const Index TQ = pk.cu_q.back(), TK = pk.cu_k.back(), B = c.defect == Defect::VarlenBatch ? 2 : 1;
  Qkv<> in(c, B, TQ, TK);
  Buf<float>&q = in.q, &k = in.k, &v = in.v;
  Buf<float> o(B, c.Hq, TQ, c.Dv, c.bshd[3]);
  q.snapshot();
  k.snapshot();
  v.snapshot();
  o.snapshot();
  std::vector<Index> cu_q = pk.cu_q, cu_k = pk.cu_k;
  switch (c.defect) {
    case Defect::VarlenStart:
      cu_q[0] = 1;
      break;
    case Defect::VarlenOrder:  // {0, TK + 1, ..., TK}: decreasing at the end
      cu_k.insert(cu_k.begin() + 1, TK + 1);
      cu_q.insert(cu_q.begin() + 1, cu_q[1]);
      break;
    case Defect::VarlenTotal:
      cu_q.back() += 1;
      break;
    case Defect::VarlenCount:
      cu_k.pop_back();
      break;
    default:
      break;
  }
  const Index rows = B * c.Hq * TQ;
  Stats lse(rows), ref_lse(rows);
  const ak::Options opt = options_of(c);
  const auto fast = [&](Buf<float>& out, Stats& st, int threads) {
    ak::attention_varlen(spec, q.view(), k.view(), v.view(), out.view(), cu_q, cu_k,
                         opt.with_threads(threads).with_lse(st.ptr(c.lse)));
  };
  const bool ok = returns([&] { fast(o, lse, c.threads); });
  if (!q.unchanged() || !k.unchanged() || !v.unchanged()) violated(c, "an input buffer changed");
  if (c.defect != Defect::None) {
    if (ok) violated(c, "attention_varlen accepted an invalid call");
    rejected(c, ok, o, lse);
    return;
  }
  // The reference, sequence by sequence; the call is valid when every sequence is.
  Buf<double> ref(1, c.Hq, TQ, c.Dv), mass(1, c.Hq, TQ, c.Dv);
  Buf<float> ones = ones_like(v);
  std::vector<Index> visible(static_cast<std::size_t>(rows));
  bool ref_ok = true;
  Index need = 1;
  for (std::size_t s = 0; s + 1 < cu_q.size(); ++s) {
    const Index q0 = cu_q[s], nq = cu_q[s + 1] - q0, k0 = cu_k[s], nk = cu_k[s + 1] - k0;
    const Index off = c.q_offset.value_or(nk - nq);
    Stats part(c.Hq * nq);
    ref_ok =
        ref_ok && returns([&] {
          ak::reference::attention(spec, seq_rows(q.view(), q0, nq), seq_rows(k.view(), k0, nk),
                                   seq_rows(v.view(), k0, nk), seq_rows(ref.view(), q0, nq),
                                   opt.with_lse(part.ptr(c.lse)));
        });
    if (ref_ok && c.norm == Norm::Sigmoid)
      ak::reference::attention(spec, seq_rows(q.view(), q0, nq), seq_rows(k.view(), k0, nk),
                               seq_rows(ones.view(), k0, nk), seq_rows(mass.view(), q0, nq), opt);
    const std::vector<Index> n = visible_keys(spec.mask, 1, c.Hq, nq, nk, off);
    for (Index h = 0; h < c.Hq; ++h)
      for (Index r = 0; r < nq; ++r) {
        const auto at = static_cast<std::size_t>(h * TQ + q0 + r);
        visible[at] = n[static_cast<std::size_t>(h * nq + r)];
        ref_lse.x[at] = part.x[static_cast<std::size_t>(h * nq + r)];
      }
    need = std::max(need, reach_of(nq, nk, off));
  }
  if (ok != ref_ok)
    violated(c, verdicts_differ("attention_varlen", ok, ref_ok) + " (per sequence)");
  if (rejected(c, ok, o, lse)) return;
  same_for_threads(c, o, lse, fast);
  compare(c, "attention_varlen", o, ref, c.lse ? &lse : nullptr, c.lse ? &ref_lse : nullptr,
          visible, v.max_abs(), conditioning(c, q.max_abs(), k.max_abs(), need),
          c.norm == Norm::Sigmoid ? row_mass(mass) : std::vector<double>{});
}

void run_varlen(const Case& c) {
  const Packing pk = packing(c);
  if (!with_spec(c, c.Hq, pk.need, [&](const auto& spec) { varlen_one(c, spec, pk); }) &&
      c.defect != Defect::TableShort)
    violated(c, "a policy (or an unchecked call) threw Error");
}

void fuzz_entries(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const Case c = decode(in);
  if (std::getenv("ATTNKIT_FUZZ_DESCRIBE") != nullptr)  // to see what a replayed input runs
    std::fprintf(stderr, "fuzz_entries: %s\n", describe(c).c_str());
  // The runner of each entry, in the order of Entry (attention() and decode() share one).
  using Runner = void (*)(const Case&);
  static constexpr Runner kRunners[] = {run_call,     run_call,  run_merge,  run_varlen,
                                        run_paged,    run_cache, run_moba,   run_all_or_here,
                                        run_backward, run_quant, run_linear, run_linear_backward};
  static_assert(std::size(kRunners) == static_cast<std::size_t>(Entry::kCount));
  const auto entry = static_cast<std::size_t>(c.entry);
  if (entry < std::size(kRunners)) kRunners[entry](c);
}

}  // namespace attnkit_fuzz
