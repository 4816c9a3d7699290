// fuzz_attention: a libFuzzer target for attention() and reference::attention(). Each input
// decodes (decode(), below) into one call: sizes, layouts, storage types, a spec, Options and
// data, valid or deliberately broken. Both entries run on it, and the harness aborts with a
// message when a property that must always hold is violated:
//   - invalid input throws attnkit::Error, from both entries alike, and writes nothing;
//   - valid input leaves q, k, v and the output padding alone, writes every output element,
//     gives the same bits for any thread count, and, on rows whose data are finite and moderate
//     (masked keys excepted: they may hold anything), agrees
//     with the f64 reference (a query that sees no key, by the mask's own keep(): output 0
//     and row statistic -inf, the sink logit with sinks, 0 for ReluPower).
// ASan and UBSan catch the rest. Inputs whose first byte is >= kEntriesTag (0xc0) go to
// fuzz_entries.cpp instead: the other entry points (decode(), merge(), varlen, paged, KvCache,
// the sparsity drivers) and the other normalizers, scores and positions. tests/fuzz/
// CMakeLists.txt builds it with clang and runs it on tests/fuzz/corpus/; run
// `fuzz_attention <file>...` to replay single inputs (ATTNKIT_FUZZ_DESCRIBE=1 prints the case
// of an entry-point input).
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <attnkit/attnkit.hpp>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_common.hpp"
#include "support/attnkit_test.hpp"

namespace ak = attnkit;
using ak::Index;
using attnkit_fuzz::Bytes;
using attnkit_fuzz::output_tolerance;
using attnkit_fuzz::returns;
using attnkit_fuzz::to_double;
using attnkit_fuzz::verdicts_differ;

namespace {

// ---------------------------------------------------------------------------------------
// Contracts of the hardening change (issue 5), checked only when on. All are on: the library
// meets them since commit d044b66. ATTNKIT_FUZZ_WITHOUT=all (or a comma-separated list of the
// names in quotes) turns them off, to fuzz a tree from before that change. The contract
// seeds (corpus/seed-contract-*) exercise each of them.
struct Contracts {
  bool masked_keys_inert = true;      // "masked": NaN/inf in a masked key affects no row
  bool nan_logits_poison_row = true;  // "nan": a NaN logit of a visible key -> row, LSE NaN
  bool aliasing_rejected = true;      // "alias": o over q/k/v, lse over anything -> Error
  bool huge_threads = true;           // "threads": Options::threads huge -> Error
  bool huge_sizes = true;  // "sizes": sizes whose strides, offsets or scratch overflow Index
                           // -> Error (before: signed overflow, found by UBSan)
};
Contracts g_contracts;

// ---------------------------------------------------------------------------------------
// The decoded input.

enum class Storage { F32, Bf16, Half };  // of q, k and v; the output is f32 or f16
enum class Factory { Bhsd, Bshd, Strided };

// Deliberate defects; at most one per input. Those marked (name) need that contract.
enum class Defect {
  None,
  NegativeSize,       // one size of one view < 0                               -> Error
  ZeroDim,            // head_dim or value_dim 0                                -> Error
  HeadsNotMultiple,   // Hq % Hkv != 0                                          -> Error
  SizeMismatch,       // one size of one view off by one                        -> Error
  NegativeStride,     // one stride of one view < 0                             -> Error
  OverlappingOutput,  // output rows share memory                     -> Error if > 1 row
  BroadcastInput,     // a stride of q, k or v is 0 (rows repeat)                  valid
  OverlappingInput,   // seq stride of q, k or v below its dim (rows overlap)      valid
  NullData,           // one view's data is nullptr                 -> Error unless empty
  HugeSize,           // one size of one view huge (so mismatched; never allocated) -> Error
  HugeUnitStride,     // a huge stride on a dimension of extent 1                  valid
  EmptyBatch,         // batch 0                                                   valid
  AliasOutput,        // o inside the q, k or v buffer (same storage type)  -> Error (alias)
  AliasLse,           // the LSE buffer inside q, k, v or o (f32 only)      -> Error (alias)
  HugeThreads,        // threads >= 2^16                                -> Error (threads)
  OverflowingLayout,  // bhsd/bshd sizes whose dense strides overflow       -> Error (sizes)
  HugeDimsOfEmpty,    // batch 0, head_dim or value_dim >= 2^21 (over 2^20) -> Error (sizes)
  kCount
};

const char* const kDefectNames[] = {"none",
                                    "negative-size",
                                    "zero-dim",
                                    "heads-not-multiple",
                                    "size-mismatch",
                                    "negative-stride",
                                    "overlapping-output",
                                    "broadcast-input",
                                    "overlapping-input",
                                    "null-data",
                                    "huge-size",
                                    "huge-unit-stride",
                                    "empty-batch",
                                    "alias-output",
                                    "alias-lse",
                                    "huge-threads",
                                    "overflowing-layout",
                                    "huge-dims-of-empty"};
static_assert(std::size(kDefectNames) == static_cast<std::size_t>(Defect::kCount));

// One view: sizes {B, H, S, D}, strides {batch, head, seq} in elements.
struct Shape {
  std::array<Index, 4> size{};
  std::array<Index, 3> stride{};
  Factory factory = Factory::Strided;  // how the view is made (bhsd/bshd: by attnkit)
  bool null_data = false;
};

struct Special {  // one element of q, k or v replaced by an extreme value
  int tensor;
  std::uint16_t at;
  float value;
};

// The extended specs (spec byte >> 6 != 0; their fields come after the specials). Storage
// is f32 in and out for these, to bound the template instantiations.
enum class MaskKind { Full, Causal, Window, SinksWindow, Chunked, Blocks, PowerOfTwo, kCount };
enum class NormKind { Softmax, Sinks, Sigmoid, ReluPower, kCount };
const char* const kMaskNames[] = {
    "full", "causal", "causal&window", "causal&(sinks|window)", "causal&chunked", "block(causal)"};
const char* const kNormNames[] = {"softmax", "softmax+sinks", "sigmoid", "relu-power"};

struct Case {
  Storage storage = Storage::F32;
  bool ext = false;  // an extended spec: mask and norm below
  MaskKind mask = MaskKind::Full;
  NormKind norm = NormKind::Softmax;
  Index window = 0, sink_count = 0, chunk = 1, block_q = 1, block_k = 1;
  std::vector<float> sink_logits;  // per query head
  float sigmoid_bias = 0.f, alpha = 1.f, relu_bias = 0.f;
  Index nominal_b = 0, nominal_lq = 0, nominal_lk = 0;  // for the block mask's layout
  bool half_out = false;
  bool causal = false, softcap = false;
  float cap = 1.f;
  Shape q, k, v, o;  // o: [B, Hq, Lq, Dv]
  std::optional<float> scale;
  std::optional<Index> q_offset;
  int threads = 1;
  bool with_lse = false;
  bool bf16_products = false;  // Options::products = Products::Bf16 (basic specs only)
  float q_mag = 1.f, k_mag = 1.f, v_mag = 1.f;
  std::uint32_t seed = 0;
  std::vector<Special> specials;
  Defect defect = Defect::None;
  int target = 0;            // the view (or buffer) a defect applies to: q, k, v, o
  bool must_reject = false;  // invalid whatever else the call looks like
};

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kFltMax = std::numeric_limits<float>::max();
constexpr float kFltMin = std::numeric_limits<float>::min();
constexpr Index kIndexMax = std::numeric_limits<Index>::max();
constexpr Index kIndexMin = std::numeric_limits<Index>::min();
constexpr Index kMaxOffset = Index{1} << 62;  // attnkit's q_offset bound

const float kCaps[] = {1e-38f, kFltMin, 1e-3f, 0.5f,    1.f,  5.f,  20.f, 30.f,
                       50.f,   1e4f,    1e30f, kFltMax, kInf, kNaN, -1.f, 0.f};
const float kScales[] = {1.f,   0.125f,  0.5f, 2.f,   -1.f, 1e-3f, 1e-30f, 1e-45f,
                         1e30f, kFltMax, kInf, -kInf, kNaN, 0.f,   -0.f,   10.f};
const Index kHugeOffsets[] = {kMaxOffset, -kMaxOffset, kMaxOffset + 1, -kMaxOffset - 1,
                              kIndexMax,  kIndexMin,   Index{1} << 40, -(Index{1} << 40)};
const int kThreads[] = {0, 1, 2, 3, 4, 1, 2, -1};
const float kMags[] = {1.f, 1.f,  1.f,  1.f,  1.f,   1.f,  0.5f,  2.f,
                       3.f, 0.1f, 10.f, 30.f, 100.f, 1e4f, 1e20f, 3e38f};
// 3.4e38: finite in f32, +inf once rounded to bf16 (Products::Bf16, issue 40's W1).
const float kSpecials[] = {kNaN, kInf, -kInf, 65504.f, -1e30f, 3e38f, 0.f, 1e-40f, 3.4e38f};
const Index kHugeSizes[] = {Index{1} << 31, Index{1} << 40, Index{1} << 62, kIndexMax};
const int kHugeThreads[] = {1 << 16, 1 << 20, 1 << 24, INT_MAX};
const Index kHugeDims[] = {Index{1} << 21, Index{1} << 31, Index{1} << 40, Index{1} << 58};
struct Heads {
  Index kv, q;
};
const Heads kHeads[] = {{1, 1}, {1, 2}, {1, 3}, {2, 2}, {3, 3}, {2, 4}, {1, 4}, {4, 4}};

const Index kWindows[] = {
    0,   1, 2, 3, 4, 7, 16, 63, 64, 100, 255, kIndexMax, Index{1} << 60, (Index{1} << 60) + 1,
    300, -1};
const Index kSinkCounts[] = {0, 1, 2, 4, 7, 64, kIndexMax, -1};
const Index kChunks[] = {
    1, 2, 3, 5, 8, 16, 64, 256, 300, 0, -1, 4, kIndexMax, 7, Index{1} << 60, (Index{1} << 60) + 1};
const float kSinkLogits[] = {0.f, 1.f, -1.f, 5.f, -5.f, 20.f, -20.f, -kInf};
const float kSigmoidBiases[] = {0.f, -1.f, -7.6246189f, 2.f, -3.f, 0.5f, -20.f, 10.f};
const float kAlphas[] = {1.f, 2.f, 0.5f, 3.f, 1.5f, 0.f, -1.f, kInf};
const float kReluBiases[] = {0.f, -0.5f, 0.5f, 1.f, -2.f, kNaN, 0.1f, 2.f};

bool valid_cap(float cap) { return std::isfinite(cap) && cap >= kFltMin; }

// Strides of a layout for sizes {B, H, S, D}; `pad` (padded layout only) spaces rows, heads
// and batches apart.
void lay_out(Shape& s, std::uint8_t layout) {
  // Saturating: some defects overflow on purpose; extent() then sees a huge view.
  const auto mul = [](Index a, Index b) {
    Index p = 0;
    return __builtin_mul_overflow(a, b, &p) ? kIndexMax : p;
  };
  const auto add = [](Index a, Index b) {
    Index p = 0;
    return __builtin_add_overflow(a, b, &p) ? kIndexMax : p;
  };
  const Index H = s.size[1], S = s.size[2], D = s.size[3];
  switch (layout % 3) {
    case 0:
      s.factory = Factory::Bhsd;
      s.stride = {mul(H, mul(S, D)), mul(S, D), D};
      break;
    case 1:
      s.factory = Factory::Bshd;
      s.stride = {mul(S, mul(H, D)), D, mul(H, D)};
      break;
    default: {
      const Index pad = 1 + (layout >> 2) % 7;
      s.factory = Factory::Strided;
      s.stride[2] = add(D, pad);
      s.stride[1] = add(mul(S, s.stride[2]), 2 * pad);
      s.stride[0] = add(mul(H, s.stride[1]), 3 * pad);
    }
  }
}

bool is_empty(const Shape& s) {
  return s.size[0] == 0 || s.size[1] == 0 || s.size[2] == 0 || s.size[3] == 0;
}

// The input format, one byte per field unless noted:
//   types, spec, B, heads, Lq, Lk, D, Dv, layout of q, k, v, o, options, scale, q_offset,
//   magnitude of q, k, v, seed (4 bytes), defect, defect parameters (2 bytes),
//   specials count, then per special: tensor, position (2 bytes), value; then, for an
//   extended spec (spec byte >> 6 != 0): mask, normalizer, window, sink count, chunk,
//   block sizes, normalizer parameters, sink logits.
// tests/fuzz/make_corpus.py writes seeds in this format.
Case decode(Bytes& in) {
  Case c;
  const std::uint8_t types = in.next();
  c.storage = static_cast<Storage>(types % 3);
  c.half_out = (types / 3) % 2 == 1;
  const std::uint8_t spec = in.next();
  c.causal = (spec & 1) != 0;
  c.softcap = (spec & 2) != 0;
  c.cap = kCaps[(spec >> 2) % std::size(kCaps)];
  c.ext = (spec >> 6) != 0;

  Index B = in.in(1, 3);
  Heads heads = in.pick(kHeads);
  Index Lq = in.in(0, 80);
  const std::uint8_t lk = in.next();
  // 250..525 keys span more than one 256-key tile; fewer queries keep the reference cheap.
  const Index Lk = lk < 200 ? lk % 81 : 250 + (lk - 200) * 5;
  if (Lk > 80) Lq %= 17;
  Index D = in.in(1, 72), Dv = in.in(1, 72);
  std::uint8_t layouts[4];
  for (std::uint8_t& l : layouts) l = in.next();

  const std::uint8_t options = in.next();
  c.with_lse = (options & 1) != 0;
  c.threads = kThreads[(options >> 1) % std::size(kThreads)];
  c.bf16_products = (options & 16) != 0;
  const std::uint8_t scale = in.next();
  if (scale >= 128) c.scale = kScales[scale % std::size(kScales)];
  const std::uint8_t offset = in.next();
  if (offset >= 224)
    c.q_offset = kHugeOffsets[offset % std::size(kHugeOffsets)];
  else if (offset >= 128)
    c.q_offset = Lk - Lq + (offset - 176);  // around the default, both ways
  c.q_mag = in.pick(kMags);
  c.k_mag = in.pick(kMags);
  c.v_mag = in.pick(kMags);
  c.seed = in.u32();

  const std::uint8_t defect = in.next(), p1 = in.next(), p2 = in.next();
  const int kinds = static_cast<int>(Defect::kCount);
  c.defect = defect < 128 ? Defect::None : static_cast<Defect>(1 + defect % (kinds - 1));
  c.target = p1 % 4;
  c.must_reject = (c.scale && (!std::isfinite(*c.scale) || *c.scale == 0.f)) ||
                  (c.q_offset && (*c.q_offset > kMaxOffset || *c.q_offset < -kMaxOffset)) ||
                  c.threads < 0;

  // Defects on the sizes, before the views are laid out.
  switch (c.defect) {
    case Defect::ZeroDim:
      (p1 & 1 ? D : Dv) = 0;
      c.must_reject = true;
      break;
    case Defect::HeadsNotMultiple:
      heads.kv = 2 + p2 % 2;
      heads.q = heads.kv + 1;
      c.must_reject = true;
      break;
    case Defect::EmptyBatch:
      B = 0;
      break;
    case Defect::HugeDimsOfEmpty:
      if (!g_contracts.huge_sizes) {
        c.defect = Defect::None;
        break;
      }
      B = 0;  // nothing to read or write, yet the scratch would be sized by the dims
      (p1 & 1 ? D : Dv) = kHugeDims[p2 % std::size(kHugeDims)];
      c.must_reject = true;
      break;
    case Defect::HugeThreads:
      if (g_contracts.huge_threads) {
        c.threads = kHugeThreads[p2 % std::size(kHugeThreads)];
        c.must_reject = true;
      } else {
        c.defect = Defect::None;
      }
      break;
    default:
      break;
  }
  c.nominal_b = B;
  c.nominal_lq = Lq;
  c.nominal_lk = Lk;
  c.q.size = {B, heads.q, Lq, D};
  c.k.size = {B, heads.kv, Lk, D};
  c.v.size = {B, heads.kv, Lk, Dv};
  c.o.size = {B, heads.q, Lq, Dv};
  Shape* views[4] = {&c.q, &c.k, &c.v, &c.o};
  for (int i = 0; i < 4; ++i) lay_out(*views[i], layouts[i]);

  // Defects on one view.
  Shape& t = *views[c.target];
  Shape& input = *views[c.target % 3];
  switch (c.defect) {
    case Defect::NegativeSize:
      t.size[p2 % 4] = -1 - (p2 >> 2) % 3;
      c.must_reject = true;
      break;
    case Defect::SizeMismatch:
      t.size[p2 % 4] += 1;  // every size is tied to another view's: a mismatch either way
      lay_out(t, layouts[c.target]);
      c.must_reject = true;
      break;
    case Defect::NegativeStride:
      t.stride[p2 % 3] = -1 - (p2 >> 2);
      t.factory = Factory::Strided;
      c.must_reject = true;
      break;
    case Defect::OverlappingOutput: {
      const auto [oB, oH, oS, oD] = c.o.size;
      c.o.factory = Factory::Strided;
      if (p2 & 1) {
        c.o.stride[2] = oD - 1;
        c.must_reject = oB >= 1 && oH >= 1 && oS >= 2;
      } else {
        c.o.stride[1] = 0;
        c.must_reject = oB >= 1 && oH >= 2 && oS >= 1;
      }
      break;
    }
    case Defect::BroadcastInput:
      input.stride[p2 % 3] = 0;
      input.factory = Factory::Strided;
      break;
    case Defect::OverlappingInput:
      input.stride[2] = input.size[3] > 0 ? p2 % input.size[3] : 0;
      input.factory = Factory::Strided;
      break;
    case Defect::NullData:
      t.null_data = true;
      c.must_reject = !is_empty(t);
      break;
    case Defect::HugeSize:
      // A huge output size overflowed the row-overlap check before the "sizes" contract
      // (corpus/regression-huge-output-seq).
      if (c.target == 3 && !g_contracts.huge_sizes) {
        c.defect = Defect::None;
        break;
      }
      t.size[p2 % 4] = kHugeSizes[(p2 >> 2) % std::size(kHugeSizes)];
      t.factory = Factory::Strided;
      c.must_reject = true;
      break;
    case Defect::HugeUnitStride: {
      const Index huge = p2 & 1 ? kMaxOffset : kIndexMax;
      for (int d = 2; d >= 0; --d)
        if (t.size[d] == 1) {
          t.stride[d] = huge;
          t.factory = Factory::Strided;
          break;
        }
      break;
    }
    case Defect::OverflowingLayout:
      if (!g_contracts.huge_sizes) {
        c.defect = Defect::None;
        break;
      }
      // Dense strides of 2^22 * 2^22 * 2^21 elements: past Index by a factor of 2.
      t.size = {2, Index{1} << 22, Index{1} << 22, Index{1} << 21};
      lay_out(t, p2 & 1);  // bhsd() or bshd()
      c.must_reject = true;
      break;
    case Defect::AliasOutput:
    case Defect::AliasLse:
      if (!g_contracts.aliasing_rejected) c.defect = Defect::None;  // run() checks the types
      break;
    default:
      break;
  }

  const std::uint8_t specials = in.next();
  const int n = specials < 160 ? 0 : 1 + specials % 3;
  for (int i = 0; i < n; ++i) {
    Special s{};
    s.tensor = in.next() % 3;
    s.at = static_cast<std::uint16_t>(in.next() << 8 | in.next());
    s.value = in.pick(kSpecials);
    c.specials.push_back(s);
  }

  // The extended spec: mask, normalizer, then one byte per parameter.
  if (c.ext) {
    c.storage = Storage::F32;
    c.half_out = false;
    c.causal = c.softcap = false;
    c.bf16_products = false;
    const std::uint8_t m = in.next(), n = in.next(), w = in.next(), sk = in.next(), ch = in.next(),
                       bl = in.next(), np = in.next(), sl = in.next();
    c.norm = static_cast<NormKind>(n % static_cast<int>(NormKind::kCount));
    // The new normalizers only with the simpler masks (instantiations).
    c.mask = static_cast<MaskKind>(m % (c.norm == NormKind::Softmax ? 7 : 3));
    c.window = kWindows[w % std::size(kWindows)];
    c.sink_count = kSinkCounts[sk % std::size(kSinkCounts)];
    c.chunk = kChunks[ch % std::size(kChunks)];
    c.block_q = 1 + bl % 8;
    c.block_k = 1 + (bl >> 3) % 8;
    c.sigmoid_bias = kSigmoidBiases[np % std::size(kSigmoidBiases)];
    c.alpha = kAlphas[np % std::size(kAlphas)];
    c.relu_bias = kReluBiases[(np >> 3) % std::size(kReluBiases)];
    for (Index h = 0; h < heads.q; ++h)
      c.sink_logits.push_back(kSinkLogits[(sl + 3 * h) % std::size(kSinkLogits)]);
    if (c.norm == NormKind::Sigmoid && c.with_lse) c.must_reject = true;  // no row statistic
  }
  return c;
}

std::string describe(const Case& c) {
  std::ostringstream s;
  const auto shape = [&](const char* name, const Shape& v) {
    s << " " << name << "[" << v.size[0] << "," << v.size[1] << "," << v.size[2] << "," << v.size[3]
      << "]/{" << v.stride[0] << "," << v.stride[1] << "," << v.stride[2] << "}"
      << (v.factory == Factory::Bhsd   ? "bhsd"
          : v.factory == Factory::Bshd ? "bshd"
                                       : "")
      << (v.null_data ? "(null)" : "");
  };
  s << "storage="
    << (c.storage == Storage::F32    ? "f32"
        : c.storage == Storage::Bf16 ? "bf16"
                                     : "f16")
    << " out=" << (c.half_out ? "f16" : "f32");
  if (c.ext) {
    s << " mask=" << kMaskNames[static_cast<int>(c.mask)] << "(window=" << c.window
      << " sinks=" << c.sink_count << " chunk=" << c.chunk << " blocks=" << c.block_q << "x"
      << c.block_k << ") norm=" << kNormNames[static_cast<int>(c.norm)]
      << "(bias=" << c.sigmoid_bias << " alpha=" << c.alpha << " relu_bias=" << c.relu_bias
      << " sinks=";
    for (float x : c.sink_logits) s << x << ",";
    s << ")";
  } else {
    s << " mask=" << (c.causal ? "causal" : "full") << " score=" << (c.softcap ? "softcap" : "dot");
  }
  if (c.softcap) s << "(" << c.cap << ")";
  shape("q", c.q);
  shape("k", c.k);
  shape("v", c.v);
  shape("o", c.o);
  s << " scale=" << (c.scale ? std::to_string(*c.scale) : "default")
    << " q_offset=" << (c.q_offset ? std::to_string(*c.q_offset) : "default")
    << " threads=" << c.threads << " lse=" << c.with_lse
    << " products=" << (c.bf16_products ? "bf16" : "exact") << " mags=" << c.q_mag << "/" << c.k_mag
    << "/" << c.v_mag << " specials=" << c.specials.size()
    << " defect=" << kDefectNames[static_cast<int>(c.defect)] << "@"
    << "qkvo"[c.target] << " must_reject=" << c.must_reject;
  return s.str();
}

[[noreturn]] void violated(const Case& c, const std::string& what) {
  std::fprintf(stderr, "\nfuzz_attention: property violated: %s\n  case: %s\n", what.c_str(),
               describe(c).c_str());
  std::abort();
}

// ---------------------------------------------------------------------------------------
// Memory behind the views.

constexpr Index kMaxBacked = Index{1} << 21;  // elements; larger views are never allocated

// Elements from a view's first element to one past its last, or -1 when that exceeds
// kMaxBacked (only defects that must be rejected make such views). Negative strides count
// as 0: such a view is rejected before it is read.
Index extent(const Shape& s) {
  for (Index n : s.size)
    if (n <= 0) return 0;
  Index total = s.size[3], term = 0;
  for (int d = 0; d < 3; ++d)
    if (__builtin_mul_overflow(s.size[d] - 1, std::max<Index>(s.stride[d], 0), &term) ||
        __builtin_add_overflow(total, term, &total))
      return -1;
  return total <= kMaxBacked ? total : -1;
}

template <class T>
T nan_of() {
  return static_cast<T>(std::numeric_limits<float>::quiet_NaN());
}
template <>
double nan_of<double>() {
  return std::numeric_limits<double>::quiet_NaN();
}

// Calls f(b, h, s, c, element) for every element of a view.
template <class T, class F>
void for_each(const ak::View<T>& v, F f) {
  for (Index b = 0; b < v.batch; ++b)
    for (Index h = 0; h < v.heads; ++h)
      for (Index s = 0; s < v.seq; ++s)
        for (Index c = 0; c < v.dim; ++c) f(b, h, s, c, v.row(b, h, s)[c]);
}

// The buffer behind one view. Input padding holds NaN (a stray read poisons the result);
// outputs start as all-ones bytes (a NaN no computation produces), so an element left
// unwritten, or a write outside the view, shows in a byte comparison.
template <class T>
struct Memory {
  Shape shape;
  bool backed;
  std::vector<T> data;
  std::vector<unsigned char> before;  // the bytes before the calls

  Memory(const Shape& s, bool output, Index at_least = 0) : shape(s) {
    const Index n = extent(s);
    backed = n >= 0;
    data.resize(static_cast<std::size_t>(std::max<Index>({n, at_least, 16})));
    if (output)
      std::memset(static_cast<void*>(data.data()), 0xff, data.size() * sizeof(T));
    else
      std::fill(data.begin(), data.end(), nan_of<T>());
  }

  T* base() { return data.data(); }

  // The view as the caller makes it; bhsd() and bshd() validate their sizes in the fixed
  // library, so this may throw Error and is called inside the checked call.
  ak::View<T> view() {
    T* p = shape.null_data ? nullptr : data.data();
    const auto [B, H, S, D] = shape.size;
    if (shape.factory == Factory::Bhsd) return ak::bhsd(p, B, H, S, D);
    if (shape.factory == Factory::Bshd) return ak::bshd(p, B, S, H, D);
    return ak::strided(p, shape.size, shape.stride);
  }
  // The same view, for reading and filling: no factory (their sizes are small here).
  ak::View<T> plain() {
    return ak::strided(shape.null_data ? nullptr : data.data(), shape.size, shape.stride);
  }
  // Elements to fill and inspect: not for views that are empty or rejected as they stand.
  bool readable() const {
    const auto positive = [](Index n) { return n > 0; };
    const auto non_negative = [](Index n) { return n >= 0; };
    return backed && !shape.null_data &&
           std::all_of(shape.size.begin(), shape.size.end(), positive) &&
           std::all_of(shape.stride.begin(), shape.stride.end(), non_negative);
  }

  void snapshot() {
    const auto* p = reinterpret_cast<const unsigned char*>(data.data());
    before.assign(p, p + data.size() * sizeof(T));
  }
  bool unchanged() const { return std::memcmp(before.data(), data.data(), before.size()) == 0; }
  // Every byte outside the view's elements is as it was, every element inside was written.
  std::string check_written() {
    std::vector<char> inside(data.size(), 0);
    std::string problem;
    for_each(plain(), [&](Index, Index, Index, Index, T& x) {
      const auto i = static_cast<std::size_t>(&x - data.data());
      inside[i] = 1;
      const auto* now = reinterpret_cast<const unsigned char*>(&x);
      if (problem.empty() && std::memcmp(now, before.data() + i * sizeof(T), sizeof(T)) == 0 &&
          std::all_of(now, now + sizeof(T), [](unsigned char b) { return b == 0xff; }))
        problem = "an output element was not written";
    });
    const auto* now = reinterpret_cast<const unsigned char*>(data.data());
    for (std::size_t i = 0; i < data.size() && problem.empty(); ++i)
      if (!inside[i] &&
          std::memcmp(now + i * sizeof(T), before.data() + i * sizeof(T), sizeof(T)) != 0)
        problem = "a write outside the output view (padding)";
    return problem;
  }
};

// Random values of magnitude `mag`, then the specials, into the elements of a view.
template <class T>
void fill(Memory<T>& m, float mag, std::uint32_t seed, int tensor, const Case& c) {
  if (!m.readable()) return;
  std::uint32_t x = seed * 2654435761u + 0x9e3779b9u * static_cast<std::uint32_t>(tensor + 1);
  const ak::View<T> v = m.plain();
  Index count = 0;
  for_each(v, [&](Index, Index, Index, Index, T& e) {
    x ^= x << 13;  // xorshift32: cheap and good enough for test data
    x ^= x >> 17;
    x ^= x << 5;
    e = static_cast<T>((static_cast<float>(x >> 8) * 0x1p-23f - 1.f) * mag);
    ++count;
  });
  for (const Special& s : c.specials) {
    if (s.tensor != tensor) continue;
    Index i = s.at % count;
    const Index d = v.dim, sq = v.seq, hd = v.heads;
    v.row(i / (d * sq * hd), i / (d * sq) % hd, i / d % sq)[i % d] = static_cast<T>(s.value);
  }
}

// A view's elements in f64, dense [B, H, S, D]: the value checks below need no types (and
// compile once instead of once per storage type and spec).
struct Grid {
  Index batch = 0, heads = 0, seq = 0, dim = 0;
  std::vector<double> x;
  std::size_t row(Index b, Index h, Index s) const {
    return static_cast<std::size_t>((b * heads + h) * seq + s);
  }
  double at(Index b, Index h, Index s, Index d) const {
    return x[row(b, h, s) * static_cast<std::size_t>(dim) + static_cast<std::size_t>(d)];
  }
};

template <class T>
Grid to_grid(const ak::View<T>& v) {
  Grid g{v.batch, v.heads, v.seq, v.dim, {}};
  g.x.reserve(static_cast<std::size_t>(v.batch * v.heads * v.seq * v.dim));
  for_each(v, [&](Index, Index, Index, Index, const T& e) { g.x.push_back(to_double(e)); });
  return g;
}

// Per row of an input: all finite? any NaN? And the largest finite |element|.
struct RowFacts {
  std::vector<char> finite, nan;
  std::vector<double> row_max;  // per row, the largest finite |element|
  double max_abs = 0.0;
  bool all_finite = true;
};

RowFacts row_facts(const Grid& g) {
  RowFacts f;
  const auto rows = static_cast<std::size_t>(g.batch * g.heads * g.seq);
  f.finite.assign(rows, 1);
  f.nan.assign(rows, 0);
  f.row_max.assign(rows, 0.0);
  for (std::size_t i = 0; i < g.x.size(); ++i) {
    const double x = g.x[i];
    const std::size_t row = i / static_cast<std::size_t>(g.dim);
    if (std::isnan(x)) f.nan[row] = 1;
    if (!std::isfinite(x)) {
      f.finite[row] = 0;
      f.all_finite = false;
    } else {
      f.max_abs = std::max(f.max_abs, std::abs(x));
      f.row_max[row] = std::max(f.row_max[row], std::abs(x));
    }
  }
  return f;
}

// What a valid call produced, in f64, next to its inputs.
struct Results {
  Grid q, k, v, out, ref;
  std::vector<float> lse, ref_lse;  // [B * Hq * Lq + guard]
  double tolerance;                 // of the output type, relative to max |v|
  std::vector<char> kept;           // [B, Hq, Lq, Lk]: the spec's mask keep()
};

// The values of a valid call. A row's expectations follow from the keys it sees, [0, visible).
void check_values(const Case& c, const Results& r) {
  const RowFacts qf = row_facts(r.q), kf = row_facts(r.k), vf = row_facts(r.v);
  const bool all_finite = qf.all_finite && kf.all_finite && vf.all_finite;
  const Index Hq = r.q.heads, Hkv = r.k.heads, Lk = r.k.seq, Dv = r.v.dim;
  const float scale = c.scale ? *c.scale : 1.f / std::sqrt(static_cast<float>(r.q.dim));
  // |logit| <= scale * D * max|q| * max|k|; past 1e4 f32 logits lose absolute precision.
  const double logit_bound = std::abs(double(scale)) * double(r.q.dim) * qf.max_abs * kf.max_abs;
  // Bf16 products round q, k (2^-8 each) and P, V: 2^-7 of the output, 2^-6 of the logits.
  const double bf16_out = c.bf16_products ? 0x1p-7 : 0.0,
               bf16_logit = c.bf16_products ? 0x1p-6 : 0.0;

  for (Index b = 0; b < r.q.batch; ++b)
    for (Index h = 0; h < Hq; ++h)
      for (Index i = 0; i < r.q.seq; ++i) {
        const Index hk = h / (Hq / Hkv);
        const std::size_t row = r.q.row(b, h, i);
        const char* kept = r.kept.data() + row * static_cast<std::size_t>(Lk);
        Index visible = 0;
        bool keys_finite = true, key_nan = false;
        double kmax = 0.0, vmax = 0.0;  // of the visible keys' finite elements
        for (Index j = 0; j < Lk; ++j) {
          if (!kept[j]) continue;
          ++visible;
          kmax = std::max(kmax, kf.row_max[r.k.row(b, hk, j)]);
          vmax = std::max(vmax, vf.row_max[r.v.row(b, hk, j)]);
          keys_finite = keys_finite && kf.finite[r.k.row(b, hk, j)] && vf.finite[r.v.row(b, hk, j)];
          key_nan = key_nan || kf.nan[r.k.row(b, hk, j)];
        }
        const float fast_lse = r.lse[row], slow_lse = r.ref_lse[row];
        const auto where = [&] {
          return " at b=" + std::to_string(b) + " h=" + std::to_string(h) +
                 " row=" + std::to_string(i) + " (" + std::to_string(visible) + " visible keys)";
        };

        if (visible == 0) {
          if (!all_finite && !g_contracts.masked_keys_inert) continue;
          for (Index d = 0; d < Dv; ++d)
            if (r.out.at(b, h, i, d) != 0.0 || r.ref.at(b, h, i, d) != 0.0)
              violated(c, "a query that sees no key has a non-zero output" + where());
          // The row statistic of an empty row: LSE -inf, the sink with sinks, sum 0.
          const float empty_stat = c.norm == NormKind::Sinks       ? c.sink_logits[h]
                                   : c.norm == NormKind::ReluPower ? 0.f
                                                                   : -kInf;
          if (c.with_lse && (fast_lse != empty_stat || slow_lse != empty_stat))
            violated(c, "a query that sees no key has a row statistic other than " +
                            std::to_string(empty_stat) + where());
          continue;
        }

        const bool row_clean = qf.finite[row] && keys_finite;
        // The row's own magnitudes: what its keys cannot see (masked keys) never counts.
        const double row_bound = std::abs(double(scale)) * double(r.q.dim) * qf.row_max[row] * kmax;
        const bool moderate = row_bound <= 1e4 && vmax <= 1e4;
        const double out_tol = std::max(vmax, 1e-30) *
                               (r.tolerance + 1e-5 * row_bound + bf16_out + bf16_logit * row_bound);
        if (moderate && (all_finite || (g_contracts.masked_keys_inert && row_clean))) {
          // Sigmoid outputs are sums of up to `visible` values weighted <= 1 (sigmoid' <= 1/4).
          double row_tol = c.norm == NormKind::Sigmoid ? out_tol * double(visible) : out_tol;
          double stat_tol = -1.0;  // ReluPower: of the row sum
          if (c.norm == NormKind::ReluPower) {
            // ReLU(s - b)^alpha is ill-conditioned near s = b: bound the weights of logits
            // moved by their f32 error delta, and the output by how far they may move it.
            const double delta = 1e-5 * logit_bound + 1e-6;
            double lo_sum = 0.0, spread = 0.0, hi_sum = 0.0;
            for (Index j = 0; j < Lk; ++j) {
              if (!kept[j]) continue;
              double dot = 0.0;
              for (Index e = 0; e < r.q.dim; ++e) dot += r.q.at(b, h, i, e) * r.k.at(b, hk, j, e);
              const double t = double(scale) * dot - double(c.relu_bias);
              const double hi = std::pow(std::max(t + delta, 0.0), double(c.alpha));
              const double lo = std::pow(std::max(t - delta, 0.0), double(c.alpha));
              lo_sum += lo;
              hi_sum += hi;
              spread += hi - lo;
            }
            if (!(lo_sum > 0.0)) continue;  // every weight may be 0: too ill-conditioned
            row_tol += 2.0 * std::max(vmax, 1e-30) * spread / lo_sum;
            stat_tol = spread + 1e-4 * hi_sum;
          }
          for (Index d = 0; d < Dv; ++d) {
            const double fast = r.out.at(b, h, i, d), slow = r.ref.at(b, h, i, d);
            if (!(std::abs(fast - slow) <= row_tol))  // NaN fails too
              violated(c, "attention " + std::to_string(fast) + " vs reference " +
                              std::to_string(slow) + " (tolerance " + std::to_string(row_tol) +
                              ")" + where() + " d=" + std::to_string(d));
          }
          const double lse_tol = stat_tol >= 0.0
                                     ? stat_tol
                                     : 1e-4 * std::max(1.0, std::abs(double(slow_lse))) +
                                           (1e-5 + bf16_logit) * row_bound;
          if (c.with_lse && !(std::abs(double(fast_lse) - double(slow_lse)) <= lse_tol))
            violated(c, "LSE " + std::to_string(fast_lse) + " vs reference " +
                            std::to_string(slow_lse) + where());
        } else if (g_contracts.nan_logits_poison_row && (qf.nan[row] || key_nan)) {
          for (Index d = 0; d < Dv; ++d)
            if (!std::isnan(r.out.at(b, h, i, d)) || !std::isnan(r.ref.at(b, h, i, d)))
              violated(c, "a NaN logit of a visible key did not make the row NaN" + where());
          if (c.with_lse && (!std::isnan(fast_lse) || !std::isnan(slow_lse)))
            violated(c, "a NaN logit of a visible key did not make the LSE NaN" + where());
        }
      }
}

// LSE rows [0, rows) written by both entries when asked for, nothing past them (guard).
void check_lse_written(const Case& c, const Results& r, const std::vector<float>& before,
                       Index rows) {
  for (std::size_t i = 0; i < before.size(); ++i) {
    const bool row = c.with_lse && i < static_cast<std::size_t>(rows);
    for (const std::vector<float>* l : {&r.lse, &r.ref_lse}) {
      const bool same = std::memcmp(&(*l)[i], &before[i], sizeof(float)) == 0;
      if (row && same) violated(c, "an LSE row was not written");
      if (!row && !same) violated(c, "a write past the LSE rows");
    }
  }
}

// ---------------------------------------------------------------------------------------
// The calls and the properties.

template <class T, class O, class Spec>
void run(const Case& c, const Spec& spec) {
  // Aliasing needs a buffer of the right type to alias: o over q/k/v of its own storage
  // type, the LSE over an f32 buffer. Without one the input runs without its defect.
  Defect defect = c.defect;
  if ((defect == Defect::AliasOutput && !(std::is_same_v<O, T> && c.target < 3)) ||
      (defect == Defect::AliasLse &&
       !(c.target < 3 ? std::is_same_v<T, float> : std::is_same_v<O, float>)))
    defect = Defect::None;
  const bool aliasing = defect == Defect::AliasOutput || defect == Defect::AliasLse;

  // LSE rows [B, Hq, Lq]; 0 when those sizes are not sane (the call is then rejected).
  Index lse_rows = 0;
  const bool sane = c.q.size[0] >= 0 && c.q.size[1] >= 0 && c.q.size[2] >= 0 &&
                    !__builtin_mul_overflow(c.q.size[0], c.q.size[1], &lse_rows) &&
                    !__builtin_mul_overflow(lse_rows, c.q.size[2], &lse_rows);
  if (!sane || lse_rows > kMaxBacked) lse_rows = 0;
  const Index alias_need =
      defect == Defect::AliasOutput ? std::max<Index>(extent(c.o), 0) : lse_rows;
  const auto need = [&](int i) { return aliasing && c.target == i ? alias_need : 0; };

  Memory<T> q(c.q, false, need(0)), k(c.k, false, need(1)), v(c.v, false, need(2));
  Memory<O> o(c.o, true, need(3));
  Memory<double> ref(c.o, true);  // the reference's output: o's shape, in f64
  constexpr Index kGuard = 16;    // floats past the LSE rows, which must stay untouched
  std::vector<float> lse_before(static_cast<std::size_t>(lse_rows + kGuard));
  std::memset(lse_before.data(), 0xff, lse_before.size() * sizeof(float));
  std::vector<float> lse = lse_before, ref_lse = lse_before;

  if ((!q.backed || !k.backed || !v.backed || !o.backed) && !c.must_reject)
    violated(c, "harness: a view that may be valid is not backed");
  fill(q, c.q_mag, c.seed, 0, c);
  fill(k, c.k_mag, c.seed, 1, c);
  fill(v, c.v_mag, c.seed, 2, c);
  for (auto* m : {&q, &k, &v}) m->snapshot();
  o.snapshot();
  ref.snapshot();

  ak::Options options;
  options.scale = c.scale;
  options.q_offset = c.q_offset;
  options.threads = c.threads;
  if (c.bf16_products) options.products = ak::Products::Bf16;
  float* lse_ptr = c.with_lse ? lse.data() : nullptr;
  float* ref_lse_ptr = c.with_lse ? ref_lse.data() : nullptr;
  Memory<T>* inputs[3] = {&q, &k, &v};
  if (defect == Defect::AliasLse) {
    lse_ptr = c.target < 3 ? reinterpret_cast<float*>(inputs[c.target]->base())
                           : reinterpret_cast<float*>(o.base());
    if (c.target < 3) ref_lse_ptr = lse_ptr;  // the reference gets the same defect
  }
  const auto out_view = [&] {
    ak::View<O> out = o.view();
    if constexpr (std::is_same_v<O, T>)
      if (defect == Defect::AliasOutput) out.data = inputs[c.target]->base();
    return out;
  };

  const bool fast_ok = returns([&] {
    ak::attention(spec, q.view(), k.view(), v.view(), out_view(),
                  options.with_lse(lse_ptr, lse_rows));
  });
  const bool ref_ok = returns([&] {
    ak::reference::attention(spec, q.view(), k.view(), v.view(), ref.view(),
                             options.with_lse(ref_lse_ptr, lse_rows));
  });

  if (aliasing) {  // decode() keeps these only under the aliasing contract
    // Memory is shared only when both sides hold at least one element.
    const bool shared =
        defect == Defect::AliasOutput
            ? !is_empty(c.o) && inputs[c.target]->readable()
            : lse_rows > 0 && (c.target < 3 ? inputs[c.target]->readable() : !is_empty(c.o));
    if (shared && fast_ok) violated(c, "attention accepted an output aliasing another buffer");
    if (shared && ref_ok && defect == Defect::AliasLse && c.target < 3)
      violated(c, "reference::attention accepted an LSE buffer aliasing an input");
    return;
  }

  if (!q.unchanged() || !k.unchanged() || !v.unchanged()) violated(c, "an input buffer changed");
  if (fast_ok != ref_ok) violated(c, verdicts_differ("attention", fast_ok, ref_ok));
  if (c.must_reject && fast_ok) violated(c, "an invalid call was accepted");
  if (!fast_ok) {
    if (!o.unchanged() || !ref.unchanged()) violated(c, "a rejected call wrote its output");
    if (std::memcmp(lse.data(), lse_before.data(), lse.size() * sizeof(float)) != 0 ||
        std::memcmp(ref_lse.data(), lse_before.data(), lse.size() * sizeof(float)) != 0)
      violated(c, "a rejected call wrote its LSE");
    return;
  }

  // From here on the call was valid, so the sizes are consistent and small.
  if (const std::string problem = o.check_written(); !problem.empty())
    violated(c, "attention: " + problem);
  if (const std::string problem = ref.check_written(); !problem.empty())
    violated(c, "reference::attention: " + problem);

  // Any thread count gives the same bits (the design promises it; tested with memcmp).
  {
    Memory<O> again(c.o, true);
    std::vector<float> lse_again = lse_before;
    const int threads = c.threads == 1 ? 2 : 1;
    ak::attention(
        spec, q.view(), k.view(), v.view(), again.view(),
        options.with_threads(threads).with_lse(c.with_lse ? lse_again.data() : nullptr, lse_rows));
    if (std::memcmp(again.data.data(), o.data.data(), o.data.size() * sizeof(O)) != 0 ||
        std::memcmp(lse_again.data(), lse.data(), lse.size() * sizeof(float)) != 0)
      violated(c, "the result depends on the thread count (" + std::to_string(c.threads) + " vs " +
                      std::to_string(threads) + ")");
  }

  // The pairs the mask keeps, by its own keep() at absolute query positions.
  const auto [B, Hq, Lq, D] = c.q.size;
  const Index Lk = c.k.size[2];
  const Index offset = c.q_offset ? *c.q_offset : Lk - Lq;  // |offset| <= 2^62: no overflow
  std::vector<char> kept(static_cast<std::size_t>(B * Hq * Lq * Lk));
  std::size_t at = 0;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < Hq; ++h)
      for (Index i = 0; i < Lq; ++i)
        for (Index j = 0; j < Lk; ++j) kept[at++] = spec.mask.keep(b, h, i + offset, j) ? 1 : 0;
  (void)D;
  Results results{to_grid(q.plain()), to_grid(k.plain()),    to_grid(v.plain()),
                  to_grid(o.plain()), to_grid(ref.plain()),  std::move(lse),
                  std::move(ref_lse), output_tolerance<O>(), std::move(kept)};
  check_lse_written(c, results, lse_before, lse_rows);
  check_values(c, results);
}

// Constructs a policy; checks that it throws Error exactly when it must (`valid`).
template <class P, class Make>
std::optional<P> make_policy(const Case& c, bool valid, const char* what, Make make) {
  std::optional<P> p;
  const bool made = returns([&] { p.emplace(make()); });
  if (made != valid)
    violated(c,
             std::string(what) + (made ? " accepted invalid parameters" : " rejected valid ones"));
  return p;
}

template <class Mask>
void run_ext_norm(const Case& c, const Mask& mask) {
  switch (c.norm) {
    case NormKind::Softmax:
      run<float, float>(c, ak::make_spec(mask));
      break;
    case NormKind::Sinks:
      run<float, float>(c, ak::make_spec(mask, ak::Softmax::with_sinks(c.sink_logits)));
      break;
    case NormKind::Sigmoid:
      run<float, float>(c, ak::make_spec(mask, ak::Sigmoid{c.sigmoid_bias}));
      break;
    case NormKind::ReluPower: {
      const bool valid = std::isfinite(c.alpha) && c.alpha > 0.f && std::isfinite(c.relu_bias);
      const auto relu = make_policy<ak::ReluPower>(c, valid, "ReluPower", [&] {
        return ak::ReluPower{c.alpha, c.relu_bias};
      });
      if (relu) run<float, float>(c, ak::make_spec(mask, *relu));
      break;
    }
    default:
      break;
  }
}

// The extended specs; decode() pairs the new normalizers only with the first three masks.
void run_ext(const Case& c) {
  const auto window = make_policy<ak::SlidingWindow>(c, c.window >= 0, "SlidingWindow", [&] {
    return ak::SlidingWindow{c.window, 0};
  });
  switch (c.mask) {
    case MaskKind::Full:
      run_ext_norm(c, ak::Full{});
      return;
    case MaskKind::Causal:
      run_ext_norm(c, ak::Causal{});
      return;
    case MaskKind::Window:
      if (window) run_ext_norm(c, ak::Causal{} & *window);
      return;
    default:
      break;
  }
  // Softmax only from here on.
  switch (c.mask) {
    case MaskKind::SinksWindow: {
      const auto sinks = make_policy<ak::Sinks>(c, c.sink_count >= 0, "Sinks",
                                                [&] { return ak::Sinks{c.sink_count}; });
      if (window && sinks) run<float, float>(c, ak::make_spec(ak::Causal{} & (*sinks | *window)));
      return;
    }
    case MaskKind::Chunked: {
      const auto chunked =
          make_policy<ak::Chunked>(c, c.chunk >= 1 && c.chunk <= (Index{1} << 60), "Chunked",
                                   [&] { return ak::Chunked{c.chunk}; });
      if (chunked) run<float, float>(c, ak::make_spec(ak::Causal{} & *chunked));
      return;
    }
    case MaskKind::Blocks: {
      // Laid out for the call as decoded (a call with broken sizes is rejected anyway); an
      // out-of-range q_offset (rejected) lays out at the default.
      ak::BlockMaskLayout layout;
      layout.batch = c.nominal_b;
      layout.q_len = c.nominal_lq;
      layout.kv_len = c.nominal_lk;
      layout.block_q = c.block_q;
      layout.block_k = c.block_k;
      const bool offset_ok = c.q_offset && *c.q_offset <= kMaxOffset && *c.q_offset >= -kMaxOffset;
      layout.q_offset = offset_ok ? *c.q_offset : c.nominal_lk - c.nominal_lq;
      run<float, float>(c, ak::make_spec(ak::make_block_mask(ak::Causal{}, layout)));
      return;
    }
    case MaskKind::PowerOfTwo: {  // gathered columns, under the plan the kernel picks
      const auto power =
          make_policy<ak::PowerOfTwo>(c, c.sink_count >= 0 && c.window >= 0, "PowerOfTwo", [&] {
            return ak::PowerOfTwo{c.sink_count, c.window};
          });
      if (power) run<float, float>(c, ak::make_spec(*power));
      return;
    }
    default:
      return;
  }
}

template <class T, class O>
void run_spec(const Case& c) {
  if (!c.softcap) {
    if (c.causal)
      run<T, O>(c, ak::make_spec(ak::Causal{}));
    else
      run<T, O>(c, ak::make_spec());
    return;
  }
  std::optional<ak::Softcap> cap;
  const bool made = returns([&] { cap.emplace(c.cap); });
  if (made != valid_cap(c.cap))
    violated(c, made ? "Softcap accepted an invalid cap" : "Softcap rejected a valid cap");
  if (!made) return;
  if (c.causal)
    run<T, O>(c, ak::make_spec(ak::Causal{}, *cap));
  else
    run<T, O>(c, ak::make_spec(*cap));
}

template <class T>
void run_types(const Case& c) {
  if (c.half_out)
    run_spec<T, Eigen::half>(c);
  else
    run_spec<T, float>(c);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  const char* env = std::getenv("ATTNKIT_FUZZ_WITHOUT");
  const std::string list = env != nullptr ? std::string(",") + env + "," : "";
  const auto off = [&](const char* name) {
    return list.find(",all,") != std::string::npos ||
           list.find("," + std::string(name) + ",") != std::string::npos;
  };
  g_contracts.masked_keys_inert = !off("masked");
  g_contracts.nan_logits_poison_row = !off("nan");
  g_contracts.aliasing_rejected = !off("alias");
  g_contracts.huge_threads = !off("threads");
  g_contracts.huge_sizes = !off("sizes");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 0 && data[0] >= attnkit_fuzz::kEntriesTag) {
    attnkit_fuzz::fuzz_entries(data + 1, size - 1);
    return 0;
  }
  Bytes in(data, size);
  const Case c = decode(in);
  if (c.ext) {
    run_ext(c);
    return 0;
  }
  switch (c.storage) {
    case Storage::F32:
      run_types<float>(c);
      break;
    case Storage::Bf16:
      run_types<Eigen::bfloat16>(c);
      break;
    case Storage::Half:
      run_types<Eigen::half>(c);
      break;
  }
  return 0;
}
