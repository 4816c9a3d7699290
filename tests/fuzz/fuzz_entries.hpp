// fuzz_entries: the decoded input of the fuzz target's entry-point half (fuzz_entries.cpp
// decodes it; fuzz_entries.cpp and fuzz_stores.cpp run it).
#pragma once

#include <Eigen/Core>
#include <array>
#include <attnkit/attnkit.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.hpp"

namespace attnkit_fuzz {

namespace ak = attnkit;
using bf16 = Eigen::bfloat16;
using f16 = Eigen::half;

// ---------------------------------------------------------------------------------------
// The decoded input.

enum class Entry {
  Attention,
  Decode,
  Merge,
  Varlen,
  Paged,
  Cache,
  Moba,
  AllOrHere,
  Backward,
  Quant,
  Linear,
  LinearBackward,  // fuzz_grads.cpp, fuzz_linear.cpp
  kCount
};
enum class Norm { Softmax, Sinks, Sigmoid, ReluPower, SoftplusL1, Lssar, kCount };
enum class Mod { Dot, Softcap, Alibi, Rope, Fope, Tapa, kCount };  // score or position
// Storage of q, k, v and o. Mixed types run with Softmax and Dot only (fuzz_attention.cpp
// runs Softcap in bf16 and f16), to bound the instantiations; everything else is f32.
enum class Profile { F32, Bf16F16, F16Bf16, Bf16Kv, kCount };

constexpr Index kReach = ak::SlidingWindow::kMaxReach;
constexpr std::size_t kManyRows = 1000;  // more query rows than any decoded call has
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One deliberate defect; which one is entry-specific (decode() and the entry's code).
enum class Defect {
  None,
  DecodeTooManyRows,  // decode(): Lq = 17
  LseWithoutStat,     // a row statistic buffer for Sigmoid
  ScaleRefused,       // Options::scale with TAPA or cosine logits (SoftplusL1, LSSAR)
  PolicySize,         // sinks, Alibi slopes or SoftplusL1 key counts for Hq + 1 heads
  TableShort,         // Rope / Fope table one position too short
  MergeShape,         // merge(): a part one row longer than out
  MergeStats,         // merge(): one statistic more than parts
  MergeAlias,         // merge(): out is a part's memory
  VarlenStart,        // cu_seqlens_q[0] = 1
  VarlenOrder,        // cu_seqlens_k decreasing somewhere
  VarlenTotal,        // cu_seqlens_q.back() != the packed length
  VarlenCount,        // cu_seqlens_k one entry short
  VarlenBatch,        // q, k, v, o with batch 2
  PagedBatch,         // q.batch = sequences + 1
  PagedDim,           // q.dim = head_dim + 1
  PagedAlias,         // o over the pool's memory
  PagedExhausted,     // one page too few for the appends
  PagedRepeated,      // assign() with a page listed twice
  CacheFull,          // KvCache one position short
  CacheBatch,         // k_new.batch off by one
  RoutesOffset,       // MoBA routes for another q_offset
  RoutesBlock,        // MoBA called with another block size
  RoutesList,         // MoBA: a row's own block dropped; AhA: routes for Lq + 1 rows
  WindowZero,         // all_or_here(): window 0
  ProductsInvalid,    // Options::products = Products(5) (backward, linear)
  LinearAlias,        // linear_attention(): o over the LinearState
  QuantizeCount,      // quantize_row() with n = -32
  PagedHugeLength,    // PagedKv::assign() of a length near INT64_MAX
  kCount
};
struct Case {
  Entry entry = Entry::Attention;
  Norm norm = Norm::Softmax;
  Mod mod = Mod::Dot;
  Profile profile = Profile::F32;
  Index left = kReach, right = 0;  // the mask: SlidingWindow{left, right}
  Index B = 1, Hq = 1, Hkv = 1, Lq = 1, Lk = 1, D = 1, Dv = 1;
  std::array<bool, 4> bshd{};  // layout of q, k, v, o
  bool lse = false;
  int threads = 1;
  std::optional<float> scale;
  std::optional<Index> q_offset;
  float q_mag = 1.f, k_mag = 1.f, v_mag = 1.f;
  std::uint32_t seed = 0;
  // Policy parameters.
  float cap = 1.f, sigmoid_bias = 0.f, alpha = 1.f, power = 1.f, tapa_alpha = 0.1f,
        tapa_theta = 0.5f, fope_sigma = 0.f;
  bool sigmoid_default = true, gptj = false, partial_rope = false;
  bool fope_reference_code = false;  // FopePadding::ReferenceCode
  bool bf16_products = false;        // Options::products = Products::Bf16
  Index fope_train = 0;
  int rope_scaling = 0;      // none, linear 2, YaRN 4 over 32 positions
  std::vector<float> sinks;  // per query head
  // Entry parameters: parts / sequences / pages / chunks / routes, one byte each.
  std::array<std::uint8_t, 8> e{};
  Defect defect = Defect::None;
};

inline bool softmax_like(Norm n) { return n == Norm::Softmax || n == Norm::Sinks; }
inline bool cosine(Norm n) { return n == Norm::SoftplusL1 || n == Norm::Lssar; }
inline bool position(Mod m) { return m == Mod::Rope || m == Mod::Fope; }

// Decodes one input (fuzz_entries.cpp documents the format).
Case decode(Bytes& in);
std::string describe(const Case& c);
[[noreturn]] void violated(const Case& c, const std::string& what);

// The entry points' runs: fuzz_entries.cpp (call, merge, varlen), fuzz_stores.cpp (the rest).
void run_call(const Case& c);
void run_merge(const Case& c);
void run_varlen(const Case& c);
void run_paged(const Case& c);
void run_cache(const Case& c);
void run_moba(const Case& c);
void run_all_or_here(const Case& c);
// fuzz_grads.cpp: the case fitted to the entries below, and the defects they take.
bool grads_entry(Entry e);
void shape_grads_case(Case& c);
std::vector<Defect> grads_defects(const Case& c);
void run_backward(const Case& c);
void run_quant(const Case& c);
// fuzz_linear.cpp
void run_linear(const Case& c);
void run_linear_backward(const Case& c);

}  // namespace attnkit_fuzz
