// Rope and RopeTable (position/rope_table.hpp, rope.hpp, apply.hpp): the frequencies of every
// scaling against closed forms transcribed here from Hugging Face transformers'
// modeling_rope_utils.py, and hand-computed values (YaRN with and without truncation,
// proportional RoPE), and numbers pasted from transformers itself (gpt-oss's YaRN, Gemma 4's
// proportional RoPE: frequencies and turned rows); the cos / sin table against std::cos /
// std::sin in double at long positions; the relative-position property; NeoX vs GPT-J up to
// their permutation; partial rotary; Rope fused in attention() against apply_position() then
// attention() (q_offset / decode, GQA, position ids with gaps, BSHD and BHSD, 1 and 2
// threads) and against reference::attention() (f32, bf16, f16; each pairing and scaling,
// Softmax and SoftplusL1, Full / Causal / SlidingWindow); the errors. Built natively.
// Position ids are position/position_ids.hpp's; every row reaches the policy with its
// position/faces.hpp RowAt.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/position/apply.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/position/rope_table.hpp>
#include <attnkit/reference/attention.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/error_checks.hpp"
#include "support/matchers.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::Role;
using ak::Rope;
using ak::RopePairing;
using ak::RopeScaling;
using ak::RopeTable;

namespace {

constexpr double kPi = 3.14159265358979323846;
// Two double evaluations of the same formula (pow, log, a ramp) in a different order.
constexpr double kFreqRel = 1e-12;
// q_i . k_j of two rotated f32 rows of <= 64 N(0, 1) values: each element carries ~2 f32
// roundings (table, rotation), so the dot moves by ~ sum |q_c k_c| 3e-7 ~ 2e-5.
constexpr double kDotAbs = 1e-4;
// The same rotation computed on permuted dimensions: at most a contraction (FMA) apart.
constexpr double kPermutationAbs = 1e-6;

// Closed forms, written from the formulas of transformers' modeling_rope_utils.py
// (_compute_default / linear / dynamic-NTK at a fixed factor / yarn / llama3 parameters).
namespace hf {

std::vector<double> default_inv_freq(Index dim, double base) {
  std::vector<double> f;
  for (Index i = 0; i < dim; i += 2) f.push_back(1.0 / std::pow(base, double(i) / double(dim)));
  return f;
}

std::vector<double> linear(Index dim, double base, double factor) {
  std::vector<double> f = default_inv_freq(dim, base);
  for (double& x : f) x = x / factor;
  return f;
}

std::vector<double> ntk(Index dim, double base, double factor) {
  return default_inv_freq(dim, base * std::pow(factor, double(dim) / double(dim - 2)));
}

double find_correction_dim(double num_rotations, double dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2 * kPi))) / (2 * std::log(base));
}

struct Range {
  double low, high;
};

Range find_correction_range(double low_rot, double high_rot, double dim, double base,
                            double max_pos, bool truncate) {
  double low = find_correction_dim(low_rot, dim, base, max_pos);
  double high = find_correction_dim(high_rot, dim, base, max_pos);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  return {std::max(low, 0.0), std::min(high, dim - 1)};
}

std::vector<double> linear_ramp_factor(double min, double max, Index n) {
  if (min == max) max += 0.001;
  std::vector<double> ramp;
  for (Index i = 0; i < n; ++i) ramp.push_back(std::clamp((double(i) - min) / (max - min), 0., 1.));
  return ramp;
}

std::vector<double> yarn(Index dim, double base, double factor, double original, double beta_fast,
                         double beta_slow, bool truncate = true) {
  std::vector<double> f;
  const Range range =
      find_correction_range(beta_fast, beta_slow, double(dim), base, original, truncate);
  const std::vector<double> ramp = linear_ramp_factor(range.low, range.high, dim / 2);
  for (Index i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, double(2 * i) / double(dim));
    const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (factor * pos_freq);
    const double extrapolation_factor = 1.0 - ramp[std::size_t(i)];
    f.push_back(interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor);
  }
  return f;
}

double yarn_mscale(double factor) { return factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1.0; }

std::vector<double> llama3(Index dim, double base, double factor, double old_context_len,
                           double low_freq_factor, double high_freq_factor) {
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  std::vector<double> f = default_inv_freq(dim, base);
  for (double& inv_freq : f) {
    const double wavelen = 2 * kPi / inv_freq;
    double llama = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
    const double smooth =
        (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1 - smooth) * llama / factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    inv_freq = medium ? smoothed : llama;
  }
  return f;
}

// _compute_proportional_rope_parameters: rope_angles = int(rope_proportion * head_dim // 2)
// frequencies 1 / base^(2i / head_dim) (i = 0, 2, ..), then head_dim // 2 - rope_angles
// zeros; all divided by factor.
std::vector<double> proportional(Index head_dim, double base, double rope_proportion,
                                 double factor = 1.0) {
  const auto rope_angles = Index(std::floor(rope_proportion * double(head_dim) / 2));
  std::vector<double> f;
  for (Index i = 0; i < 2 * rope_angles; i += 2)
    f.push_back(1.0 / std::pow(base, double(i) / double(head_dim)));
  f.resize(std::size_t(head_dim / 2), 0.0);
  for (double& x : f) x /= factor;
  return f;
}

}  // namespace hf

void check_frequencies(const RopeTable& table, const std::vector<double>& expected) {
  REQUIRE(table.inv_freq().size() == expected.size());
  for (std::size_t m = 0; m < expected.size(); ++m) {
    INFO("pair " << m);
    CHECK_THAT(table.inv_freq()[m], WithinRel(expected[m], kFreqRel));
  }
}

// x[b, h, s, :] for a row-major BHSD tensor of `dim` columns.
template <class T>
float at(const Tensor<T>& t, Index b, Index h, Index s, Index c) {
  return float(t.view.row(b, h, s)[c]);
}

double dot(const float* a, const float* b, Index n) {
  double s = 0;
  for (Index c = 0; c < n; ++c) s += double(a[c]) * double(b[c]);
  return s;
}

// A Rope carrying only one role's position ids (apply_position() takes either form).
Rope query_side(const Rope& r) { return r.with_positions(r.q_positions, {}); }
Rope key_side(const Rope& r) { return r.with_positions({}, r.k_positions); }

// Every query row holds the same random vector x, every key row the same y, each turned at its
// position (queries from q_offset, keys from 0): after the rotation the rows differ only by
// their positions.
struct RepeatedRows {
  Tensor<float> x, y, q, k;
  RepeatedRows(const Rope& rope, Index dim, Index q_len, Index kv_len, Index q_offset,
               std::uint32_t seed)
      : x(Layout::Bhsd, 1, 1, 1, dim),
        y(Layout::Bhsd, 1, 1, 1, dim),
        q(Layout::Bhsd, 1, 1, q_len, dim),
        k(Layout::Bhsd, 1, 1, kv_len, dim) {
    x.randomize(seed);
    y.randomize(seed + 1);
    for (Index s = 0; s < q_len; ++s) std::copy_n(x.view.row(0, 0, 0), dim, q.view.row(0, 0, s));
    for (Index s = 0; s < kv_len; ++s) std::copy_n(y.view.row(0, 0, 0), dim, k.view.row(0, 0, s));
    ak::apply_position(rope, q.view, Role::Query, q_offset);
    ak::apply_position(rope, k.view, Role::Key);
  }
};

}  // namespace

TEST_CASE("RopeTable: each scaling's frequencies match transformers' closed forms",
          "[position][rope]") {
  struct Shape {
    Index dim;
    double base;
  };
  for (const Shape s : {Shape{128, 10000.0}, Shape{64, 500000.0}, Shape{32, 10000.0},
                        Shape{6, 100.0}, Shape{80, 1000000.0}}) {
    INFO("rotary_dim " << s.dim << " base " << s.base);
    const Index r = s.dim;
    check_frequencies(RopeTable(r, s.base, 4), hf::default_inv_freq(r, s.base));
    check_frequencies(RopeTable(r, s.base, 4, RopeScaling::linear(4)), hf::linear(r, s.base, 4));
    check_frequencies(RopeTable(r, s.base, 4, RopeScaling::ntk(8)), hf::ntk(r, s.base, 8));
    for (const double original : {64.0, 4096.0, 8192.0}) {
      INFO("original_max_len " << original);
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::yarn(8, original)),
                        hf::yarn(r, s.base, 8, original, 32, 1));
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::yarn(4, original, 16, 2)),
                        hf::yarn(r, s.base, 4, original, 16, 2));
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::yarn(8, original, 32, 1, 0, false)),
                        hf::yarn(r, s.base, 8, original, 32, 1, false));
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::yarn(4, original, 16, 2, 0, false)),
                        hf::yarn(r, s.base, 4, original, 16, 2, false));
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::llama3(8, original)),
                        hf::llama3(r, s.base, 8, original, 1, 4));
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::llama3(32, original, 2, 8)),
                        hf::llama3(r, s.base, 32, original, 2, 8));
    }
    for (const double p : {0.25, 0.5, 0.58, 1.0}) {
      INFO("partial_rotary_factor " << p);
      if (std::floor(p * double(r) / 2) < 1) continue;  // no pair turns: refused (tested below)
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::proportional(p)),
                        hf::proportional(r, s.base, p));
      check_frequencies(RopeTable(r, s.base, 4, RopeScaling::proportional(p, 8)),
                        hf::proportional(r, s.base, p, 8));
    }
  }
  CHECK_THAT(RopeTable(64, 1e4, 4, RopeScaling::yarn(8, 4096)).attention_factor(),
             WithinRel(hf::yarn_mscale(8), kFreqRel));
  CHECK_THAT(RopeTable(64, 1e4, 4, RopeScaling::yarn(0.5, 4096)).attention_factor(),
             WithinRel(hf::yarn_mscale(0.5), kFreqRel));
}

TEST_CASE("RopeTable: hand-computed frequencies of every scaling", "[position][rope]") {
  // Default, r = 128, base 10^4: theta_m = 10^(-m / 16).
  const RopeTable plain(128, 10000, 4);
  CHECK_THAT(plain.inv_freq()[0], WithinRel(1.0, kFreqRel));
  CHECK_THAT(plain.inv_freq()[16], WithinRel(0.1, kFreqRel));
  CHECK_THAT(plain.inv_freq()[32], WithinRel(0.01, kFreqRel));
  CHECK_THAT(plain.attention_factor(), WithinRel(1.0, kFreqRel));
  // Linear s = 4: every frequency / 4.
  CHECK_THAT(RopeTable(128, 10000, 4, RopeScaling::linear(4)).inv_freq()[32],
             WithinRel(0.0025, kFreqRel));
  // NTK, r = 4, s = 4: base 10^4 * 4^(4 / 2) = 160000, theta_1 = 160000^(-1/2) = 1 / 400.
  const RopeTable ntk(4, 10000, 4, RopeScaling::ntk(4));
  CHECK_THAT(ntk.inv_freq()[0], WithinRel(1.0, kFreqRel));
  CHECK_THAT(ntk.inv_freq()[1], WithinRel(1.0 / 400, kFreqRel));

  // YaRN, r = 128, base 10^4, 4096 original positions, s = 8: the pair turning 32 times over
  // 4096 positions is 128 ln(4096 / 64 pi) / (2 ln 10^4) = 20.94 -> floor 20; once: 45.03 ->
  // ceil 46. Pairs <= 20 keep their frequency, pairs >= 46 are divided by 8, and pair 33 sits
  // at the middle of the ramp: theta (1/2 + 1/16).
  const RopeTable yarn(128, 10000, 4, RopeScaling::yarn(8, 4096));
  for (Index m = 0; m <= 20; ++m)
    CHECK_THAT(yarn.inv_freq()[std::size_t(m)], WithinRel(plain.inv_freq()[std::size_t(m)], 1e-15));
  for (Index m = 46; m < 64; ++m)
    CHECK_THAT(yarn.inv_freq()[std::size_t(m)],
               WithinRel(plain.inv_freq()[std::size_t(m)] / 8, kFreqRel));
  CHECK_THAT(yarn.inv_freq()[33], WithinRel(plain.inv_freq()[33] * 0.5625, kFreqRel));
  CHECK(yarn.inv_freq()[21] < plain.inv_freq()[21]);  // the ramp starts right after 20
  CHECK(yarn.inv_freq()[45] > plain.inv_freq()[45] / 8);
  CHECK_THAT(yarn.attention_factor(), WithinRel(1.2079441541679836, kFreqRel));  // 1 + 0.1 ln 8
  CHECK_THAT(RopeTable(128, 10000, 4, RopeScaling::yarn(8, 4096, 32, 1, 1.5)).attention_factor(),
             WithinRel(1.5, kFreqRel));

  // Llama-3, r = 64, base 5 10^5, 4096 original positions, s = 8, factors 1 and 4: the
  // wavelengths 2 pi / theta_m of pairs 0..12 are below 4096 / 4 (kept), those of pairs 16..31
  // above 4096 (divided by 8); pairs 13..15 are smoothed between the two, less and less kept.
  const RopeTable base(64, 500000, 4);
  const RopeTable llama(64, 500000, 4, RopeScaling::llama3(8, 4096));
  for (Index m = 0; m <= 12; ++m)
    CHECK_THAT(llama.inv_freq()[std::size_t(m)], WithinRel(base.inv_freq()[std::size_t(m)], 1e-15));
  for (Index m = 16; m < 32; ++m)
    CHECK_THAT(llama.inv_freq()[std::size_t(m)],
               WithinRel(base.inv_freq()[std::size_t(m)] / 8, kFreqRel));
  double kept_before = 1.0;
  for (Index m = 13; m <= 15; ++m) {
    const double kept = llama.inv_freq()[std::size_t(m)] / base.inv_freq()[std::size_t(m)];
    CHECK(kept > 1.0 / 8);
    CHECK(kept < kept_before);
    kept_before = kept;
  }
  CHECK_THAT(llama.attention_factor(), WithinRel(1.0, kFreqRel));
}

namespace {

// inv_freq pasted from transformers 5.23.0, generated once with /work/venv-models/bin/python:
//   from transformers import LlamaConfig
//   from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as F
//   cfg = lambda d, rp: LlamaConfig(hidden_size=2 * d, num_attention_heads=2, head_dim=d,
//                                   rope_parameters=rp, max_position_embeddings=131072)
//   inv, att = F[rp["rope_type"]](cfg(d, rp)); print([repr(float(x)) for x in inv], att)
// torch forms them in f32 (base ** (arange / d), its reciprocal, the ramp: each rounded): the
// double ones are within 1.4e-7 relative of these (checked: 5e-7, ~4 f32 ulps).
constexpr double kTorchF32Rel = 5e-7;

void check_against_torch(const RopeTable& table, const std::vector<double>& torch) {
  REQUIRE(table.inv_freq().size() == torch.size());
  for (std::size_t m = 0; m < torch.size(); ++m) {
    INFO("pair " << m);
    CHECK_THAT(table.inv_freq()[m], WithinRel(torch[m], kTorchF32Rel));
  }
}

}  // namespace

TEST_CASE("RopeTable: YaRN with truncate = false keeps the ramp's ends as they are",
          "[position][rope]") {
  // r = 128, base 10^4, 4096 original positions, s = 8 (the hand-computed YaRN case above):
  // the ramp runs from c(32) = 20.94 to c(1) = 45.03, not from floor 20 to ceil 46.
  const double lo = 128 * std::log(4096 / (32 * 2 * kPi)) / (2 * std::log(1e4));
  const double hi = 128 * std::log(4096 / (1 * 2 * kPi)) / (2 * std::log(1e4));
  REQUIRE(lo > 20.9);
  REQUIRE(lo < 21);
  REQUIRE(hi > 45);
  REQUIRE(hi < 45.1);
  const RopeTable plain(128, 10000, 4);
  const RopeTable exact(128, 10000, 4, RopeScaling::yarn(8, 4096, 32, 1, 0, false));
  const RopeTable truncated(128, 10000, 4, RopeScaling::yarn(8, 4096));
  CHECK(RopeScaling::yarn(8, 4096).truncate);  // the default: as transformers
  const auto ramped = [&](Index m, double ramp) {
    const double theta = plain.inv_freq()[std::size_t(m)];
    return theta * (1 - ramp) + theta / 8 * ramp;
  };
  CHECK_THAT(exact.inv_freq()[20], WithinRel(plain.inv_freq()[20], 1e-15));
  for (const Index m : {Index{21}, Index{33}, Index{45}}) {
    INFO("pair " << m);
    CHECK_THAT(exact.inv_freq()[std::size_t(m)],
               WithinRel(ramped(m, (m - lo) / (hi - lo)), kFreqRel));
    CHECK_THAT(truncated.inv_freq()[std::size_t(m)],
               WithinRel(ramped(m, (m - 20.0) / (46.0 - 20.0)), kFreqRel));
  }
  CHECK_THAT(exact.inv_freq()[46], WithinRel(plain.inv_freq()[46] / 8, kFreqRel));
  CHECK(exact.attention_factor() == truncated.attention_factor());
}

TEST_CASE("RopeTable: YaRN with truncate = false matches gpt-oss's numbers from transformers",
          "[position][rope]") {
  // GptOssConfig's defaults (head_dim 64, rope_theta 150000) and rope_parameters: rp =
  // {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate":
  // False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0}, d = 64, printed
  // as above (check_against_torch); attention_factor 1.3465735902799727.
  // gpt-oss's YaRN: pairs 9..17 (the ramp) differ from truncate = true's, by up to 1.76x.
  const RopeTable gpt_oss(64, 150000, 4, RopeScaling::yarn(32, 4096, 32, 1, 0, false));
  check_against_torch(gpt_oss, {1.0,
                                0.6890442967414856,
                                0.4747820496559143,
                                0.32714587450027466,
                                0.22541800141334534,
                                0.15532298386096954,
                                0.1070244237780571,
                                0.07374456524848938,
                                0.05081327259540558,
                                0.031705696135759354,
                                0.019334999844431877,
                                0.011592049151659012,
                                0.006794959306716919,
                                0.0038603590801358223,
                                0.002093792660161853,
                                0.00105260219424963,
                                0.0004564839182421565,
                                0.00012931869423482567,
                                3.830881178146228e-05,
                                2.6396468456368893e-05,
                                1.818833698052913e-05,
                                1.253256959898863e-05,
                                8.635495760245249e-06,
                                5.95023948335438e-06,
                                4.099978468730114e-06,
                                2.8250667583051836e-06,
                                1.9465962850517826e-06,
                                1.3412909538601525e-06,
                                9.242089618055616e-07,
                                6.368209142237902e-07,
                                4.38797854940276e-07,
                                3.023511396804679e-07});
  CHECK_THAT(gpt_oss.attention_factor(), WithinRel(1.3465735902799727, kFreqRel));
  // With truncation (transformers' default) pair 17 is 0.0002279478358104825 instead.
  CHECK_THAT(RopeTable(64, 150000, 4, RopeScaling::yarn(32, 4096)).inv_freq()[17],
             WithinRel(0.0002279478358104825, kTorchF32Rel));
}

TEST_CASE("RopeTable: proportional RoPE, hand-computed: the head's exponent, zeros past p d / 2",
          "[position][rope]") {
  // Gemma 4's global layers: head_dim 512, partial_rotary_factor 0.25, rope_theta 10^6. 64 of
  // the 256 pairs turn, theta_m = 10^(-6 2m / 512) = 10^(-3m / 128); pairs 64..255 get 0.
  const RopeTable gemma(512, 1e6, 4, RopeScaling::proportional(0.25));
  CHECK(gemma.rotary_dim() == 512);
  CHECK(gemma.pairs() == 256);
  CHECK(gemma.turned_pairs() == 64);
  CHECK_THAT(gemma.inv_freq()[0], WithinRel(1.0, kFreqRel));
  CHECK_THAT(gemma.inv_freq()[32], WithinRel(std::pow(10.0, -0.75), kFreqRel));
  CHECK_THAT(gemma.inv_freq()[63], WithinRel(std::pow(10.0, -189.0 / 128), kFreqRel));
  for (std::size_t m = 64; m < 256; ++m) CHECK(gemma.inv_freq()[m] == 0.0);
  CHECK(gemma.attention_factor() == 1.0);
  // Not partial rotary over the 2 * 64 turned dimensions, whose exponent is 2m / 128:
  // theta_32 = 10^(-6 64 / 128) = 10^-3 there, 10^-0.75 here.
  const RopeTable partial(128, 1e6, 4);
  CHECK_THAT(partial.inv_freq()[32], WithinRel(1e-3, kFreqRel));

  // transformers' int(p * head_dim // 2), in double: 0.58 * 100 = 57.99999999999999 -> 28
  // pairs (not 29), 0.3 * 10 = 3.0000000000000004 -> 1, 0.25 * 10 = 2.5 -> 1.
  CHECK(RopeTable(100, 1e4, 4, RopeScaling::proportional(0.58)).turned_pairs() == 28);
  CHECK(RopeTable(10, 1e4, 4, RopeScaling::proportional(0.3)).turned_pairs() == 1);
  CHECK(RopeTable(10, 1e4, 4, RopeScaling::proportional(0.25)).turned_pairs() == 1);
  // p = 1 is the default table; the factor s divides every frequency (transformers' "factor").
  const RopeTable whole(12, 1e4, 4, RopeScaling::proportional(1.0));
  CHECK(whole.turned_pairs() == 6);
  check_frequencies(whole, RopeTable(12, 1e4, 4).inv_freq());
  const RopeTable stretched(12, 1e4, 4, RopeScaling::proportional(0.5, 4));
  check_frequencies(stretched, {0.25, 0.25 * std::pow(1e4, -2.0 / 12),
                                0.25 * std::pow(1e4, -4.0 / 12), 0.0, 0.0, 0.0});
}

TEST_CASE("RopeTable: proportional RoPE matches numbers from transformers", "[position][rope]") {
  // rp = {"rope_type": "proportional", "partial_rotary_factor": p, "rope_theta": theta} (plus
  // "factor": 2.0 for d = 10), printed as above (check_against_torch); attention_factor 1.0.
  // Gemma 4's global layers (d 512, p 0.25, theta 10^6): pairs 0, 1, 2, 17, 31, 62, 63, 64, 255.
  const RopeTable gemma(512, 1e6, 4, RopeScaling::proportional(0.25));
  const std::vector<std::size_t> at = {0, 1, 2, 17, 31, 62, 63, 64, 255};
  const std::vector<double> gemma_torch = {1.0,
                                           0.9474635124206543,
                                           0.8976871371269226,
                                           0.39954206347465515,
                                           0.1876884251832962,
                                           0.03522694483399391,
                                           0.03337624669075012,
                                           0.0,
                                           0.0};
  for (std::size_t i = 0; i < at.size(); ++i) {
    INFO("pair " << at[i]);
    CHECK_THAT(gemma.inv_freq()[at[i]], WithinRel(gemma_torch[i], kTorchF32Rel));
  }
  check_against_torch(RopeTable(12, 1e4, 4, RopeScaling::proportional(0.5)),
                      {1.0, 0.2154434472322464, 0.04641588404774666, 0.0, 0.0, 0.0});
  check_against_torch(RopeTable(10, 100, 4, RopeScaling::proportional(0.3, 2)),
                      {0.5, 0.0, 0.0, 0.0, 0.0});
  check_against_torch(RopeTable(8, 1e4, 4, RopeScaling::proportional(1.0)),
                      {1.0, 0.10000000149011612, 0.009999999776482582, 0.0010000000474974513});
}

TEST_CASE("RopeTable: cos and sin are the attention factor times cos / sin of t theta in double",
          "[position][rope]") {
  const RopeScaling scaling =
      GENERATE(RopeScaling{}, RopeScaling::yarn(8, 4096), RopeScaling::proportional(0.5));
  const RopeTable table(32, 10000, 65536, scaling);
  const double factor = table.attention_factor();
  // The table holds the turned pairs only: proportional's 8 of 16 (the rest have angle 0).
  CHECK(table.turned_pairs() == (scaling.kind == RopeScaling::Kind::Proportional ? 8 : 16));
  // One f32 rounding of the double value: within half an f32 ulp, eps / 2 relative.
  const double rounding = std::numeric_limits<float>::epsilon() / 2;
  for (const Index t : {Index{0}, Index{1}, Index{7}, Index{4095}, Index{40000}, Index{65535}}) {
    for (Index m = 0; m < table.turned_pairs(); ++m) {
      INFO("position " << t << " pair " << m);
      const double angle = double(t) * table.inv_freq()[std::size_t(m)];
      const double want_cos = factor * std::cos(angle), want_sin = factor * std::sin(angle);
      CHECK(std::abs(table.cos_at(t)[m] - want_cos) <= rounding * std::abs(want_cos) + 1e-38);
      CHECK(std::abs(table.sin_at(t)[m] - want_sin) <= rounding * std::abs(want_sin) + 1e-38);
    }
  }
  CHECK_THAT(table.cos_at(0)[5], WithinRel(factor, 1e-7));
}

TEST_CASE("Rope: after apply_position, q_i . k_j depends only on i - j", "[position][rope]") {
  const RopePairing pairing = GENERATE(RopePairing::NeoX, RopePairing::GptJ);
  // Proportional: 4 of the 16 pairs turn, the others stay (angle 0 at every position).
  const RopeScaling scaling =
      GENERATE(RopeScaling{}, RopeScaling::yarn(8, 4096), RopeScaling::proportional(0.25));
  const Index dim = 32, q_len = 8, q_offset = 1000, kv_len = q_offset + q_len;
  const Rope rope(RopeTable(dim, 10000, 65536, scaling), pairing);
  const RepeatedRows rows(rope, dim, q_len, kv_len, q_offset, 11);
  const Tensor<float>&x = rows.x, &y = rows.y, &q = rows.q, &k = rows.k;

  // Query row r sits at 1000 + r: the pairs (1000 + r, 1000 + r - delta) share i - j = delta.
  std::vector<double> by_delta;
  for (const Index delta : {Index{0}, Index{1}, Index{3}, Index{100}, Index{1000}}) {
    const double first = dot(q.view.row(0, 0, 0), k.view.row(0, 0, q_offset - delta), dim);
    for (Index r = 1; r < q_len; ++r) {
      INFO("delta " << delta << " query row " << r);
      CHECK_THAT(dot(q.view.row(0, 0, r), k.view.row(0, 0, q_offset + r - delta), dim),
                 WithinAbs(first, kDotAbs));
    }
    by_delta.push_back(first);
  }
  // The rotation does something: other distances give other dots.
  CHECK(std::abs(by_delta[0] - by_delta[1]) > 100 * kDotAbs);
  CHECK(std::abs(by_delta[0] - by_delta[3]) > 100 * kDotAbs);

  // Far apart in absolute position, through position ids: (65535, 65535 - d), (40000 + 7,
  // 40000 + 7 - d), (7, 0) for d = 7.
  const Rope far = rope.with_positions({65535, 40007, 7}, {65528, 40000, 0});
  Tensor<float> q3(Layout::Bhsd, 1, 1, 3, dim), k3(Layout::Bhsd, 1, 1, 3, dim);
  for (Index s = 0; s < 3; ++s) {
    std::copy_n(x.view.row(0, 0, 0), dim, q3.view.row(0, 0, s));
    std::copy_n(y.view.row(0, 0, 0), dim, k3.view.row(0, 0, s));
  }
  ak::apply_position(query_side(far), q3.view, Role::Query);
  ak::apply_position(key_side(far), k3.view, Role::Key);
  const double near = dot(q3.view.row(0, 0, 2), k3.view.row(0, 0, 2), dim);
  CHECK_THAT(dot(q3.view.row(0, 0, 0), k3.view.row(0, 0, 0), dim), WithinAbs(near, kDotAbs));
  CHECK_THAT(dot(q3.view.row(0, 0, 1), k3.view.row(0, 0, 1), dim), WithinAbs(near, kDotAbs));
}

TEST_CASE("Rope: proportional RoPE turns (m, m + d / 2) for the first p d / 2 pairs only",
          "[position][rope]") {
  // x_c = (c + 1) / 8, sign alternating, turned at positions 5 and 17 (d = 12, p = 0.5,
  // theta 10^4: pairs (0, 6), (1, 7), (2, 8) turn, dimensions 3..5 and 9..11 stay) and at 3
  // (Gemma 4's d = 512, p = 0.25, theta 10^6: pairs (m, m + 256), m < 64), by transformers
  // 5.23.0: generated once with /work/venv-models/bin/python and
  //   from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
  //                                                         apply_rotary_pos_emb)
  //   c = cfg(d, {"rope_type": "proportional", "partial_rotary_factor": p, "rope_theta": theta})
  //   x = torch.tensor([(i + 1) / 8 * (-1 if i % 2 else 1) for i in range(d)])
  //   q = x.expand(1, 1, len(positions), d).contiguous()
  //   cos, sin = LlamaRotaryEmbedding(c)(q, torch.tensor([positions]))
  //   print(apply_rotary_pos_emb(q, q, cos, sin)[0][0])
  // (cfg as in the frequencies' test above). transformers turns in f32: angles t theta
  // within ~3e-7 relative (f32 theta, f32 product), <= 17 rad -> 5e-6 rad, times
  // |x_a| + |x_b| <= 2.5 at d = 12 (sensitivity <= 64 at d = 512 but t = 3: 1e-6 rad).
  const auto turned = [](Index d, double base, double p, Index position) {
    Tensor<float> x(Layout::Bhsd, 1, 1, 1, d);
    for (Index c = 0; c < d; ++c) x.view.row(0, 0, 0)[c] = float(c + 1) / 8 * (c % 2 ? -1.f : 1.f);
    ak::apply_position(Rope(RopeTable(d, base, 32, RopeScaling::proportional(p))), x.view,
                       Role::Key, position);
    return std::vector<float>(x.view.row(0, 0, 0), x.view.row(0, 0, 0) + d);
  };
  const std::vector<std::vector<double>> torch12 = {
      {0.8745165467262268, 0.7621975541114807, 0.10619443655014038, -0.5, 0.625, -0.75,
       0.12833888828754425, -0.6939415335655212, 1.1810896396636963, -1.25, 1.375, -1.5},
      {0.8068273663520813, -0.28086358308792114, -0.5342210531234741, -0.5, 0.625, -0.75,
       -0.3609426021575928, 0.9917739629745483, 1.0587056875228882, -1.25, 1.375, -1.5}};
  const Index positions[] = {5, 17};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::vector<float> mine = turned(12, 1e4, 0.5, positions[i]);
    for (std::size_t c = 0; c < 12; ++c) {
      INFO("position " << positions[i] << " dimension " << c);
      CHECK_THAT(mine[c], WithinAbs(torch12[i][c], 3e-5));
      if (c % 6 >= 3) CHECK(double(mine[c]) == torch12[i][c]);  // passed through, exactly
    }
  }
  const std::vector<std::size_t> at = {0, 1, 63, 64, 255, 256, 257, 319, 320, 511};
  const std::vector<double> torch512 = {
      -4.657229423522949,  9.744833946228027,  -3.961469888687134,  8.125,  -32.0,
      -31.785869598388672, 30.743507385253906, -40.599342346191406, 40.125, -64.0};
  const std::vector<float> gemma = turned(512, 1e6, 0.25, 3);
  for (std::size_t i = 0; i < at.size(); ++i) {
    INFO("dimension " << at[i]);
    CHECK_THAT(gemma[at[i]], WithinAbs(torch512[i], 1e-4));
  }
  // Every dimension of a pair m >= 64 is the input's, bit for bit.
  for (std::size_t c = 0; c < 512; ++c)
    if (c % 256 >= 64) CHECK(gemma[c] == float(c + 1) / 8 * (c % 2 ? -1.f : 1.f));
}

TEST_CASE("Rope: GPT-J on interleaved dimensions is NeoX on the rotate_half layout",
          "[position][rope]") {
  const Index dim = 80, rotary = 48, half = rotary / 2, len = 5;
  const RopeScaling scaling = GENERATE(RopeScaling{}, RopeScaling::llama3(8, 64));
  const RopeTable table(rotary, 10000, 256, scaling);
  Tensor<float> gptj(Layout::Bhsd, 2, 2, len, dim), neox(Layout::Bhsd, 2, 2, len, dim);
  gptj.randomize(21);
  // neox = P gptj: interleaved pair (2m, 2m + 1) moves to (m, m + r/2); the rest stays.
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index s = 0; s < len; ++s) {
        const float* in = gptj.view.row(b, h, s);
        float* out = neox.view.row(b, h, s);
        for (Index m = 0; m < half; ++m) {
          out[m] = in[2 * m];
          out[m + half] = in[2 * m + 1];
        }
        std::copy(in + rotary, in + dim, out + rotary);
      }
  const Role role = GENERATE(Role::Query, Role::Key);
  const Index offset = role == Role::Query ? 37 : 0;
  ak::apply_position(Rope(table, RopePairing::GptJ), gptj.view, role, offset);
  ak::apply_position(Rope(table, RopePairing::NeoX), neox.view, role, offset);
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index s = 0; s < len; ++s)
        for (Index m = 0; m < half; ++m) {
          INFO("b " << b << " h " << h << " row " << s << " pair " << m);
          CHECK_THAT(at(neox, b, h, s, m), WithinAbs(at(gptj, b, h, s, 2 * m), kPermutationAbs));
          CHECK_THAT(at(neox, b, h, s, m + half),
                     WithinAbs(at(gptj, b, h, s, 2 * m + 1), kPermutationAbs));
        }
}

template <class T>
void check_partial_rotary(RopePairing pairing, Role role) {
  const Index dim = 80, rotary = 32, len = 9;
  const Rope rope(RopeTable(rotary, 10000, 64), pairing);
  Tensor<T> x(Layout::Bshd, 1, 3, len, dim), original(Layout::Bshd, 1, 3, len, dim);
  x.randomize(31);
  original.randomize(31);
  ak::apply_position(rope, x.view, role, role == Role::Query ? 50 : 0);
  double moved = 0;
  for (Index h = 0; h < 3; ++h)
    for (Index s = 1; s < len; ++s) {  // row 0 of the keys sits at position 0: not turned
      for (Index c = rotary; c < dim; ++c)
        CHECK_THAT(at(x, 0, h, s, c), Catch::Matchers::WithinULP(at(original, 0, h, s, c), 0));
      for (Index c = 0; c < rotary; ++c)
        moved = std::max(moved, double(std::abs(at(x, 0, h, s, c) - at(original, 0, h, s, c))));
    }
  CHECK(moved > 0.1);  // the rotated dimensions did turn
}

TEST_CASE("Rope: partial rotary leaves the dimensions past rotary_dim untouched",
          "[position][rope]") {
  const RopePairing pairing = GENERATE(RopePairing::NeoX, RopePairing::GptJ);
  const Role role = GENERATE(Role::Query, Role::Key);
  check_partial_rotary<float>(pairing, role);
  check_partial_rotary<Eigen::bfloat16>(pairing, role);
}

namespace {

// attention() with Rope fused, and apply_position() on copies of q and k then attention()
// without a Position: the same numbers up to f32 rounding.
double fused_vs_standalone(const Rope& rope, const Case& c) {
  Tensor<float> q(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  Tensor<float> k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  Tensor<float> v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  Tensor<float> q_turned(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  Tensor<float> k_turned(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  Tensor<float> fused(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dim);
  Tensor<float> standalone(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dim);
  q.randomize(41);
  q_turned.randomize(41);
  k.randomize(42);
  k_turned.randomize(42);
  v.randomize(43);
  ak::attention(ak::make_spec(ak::Causal{}, rope), q.cview(), k.cview(), v.cview(), fused.view,
                c.options());
  ak::apply_position(query_side(rope), q_turned.view, Role::Query, c.offset());
  ak::apply_position(key_side(rope), k_turned.view, Role::Key);
  ak::attention(ak::make_spec(ak::Causal{}), q_turned.cview(), k_turned.cview(), v.cview(),
                standalone.view, c.options());
  return ak::test::max_abs_diff(fused.view, standalone.view);
}

// Ids with gaps, per batch: key j at 3 j + b, query r at the position of key Lk - Lq + r.
Rope with_gapped_ids(const Rope& rope, const Case& c) {
  std::vector<Index> q_ids, k_ids;
  for (Index b = 0; b < c.batch; ++b) {
    for (Index r = 0; r < c.q_len; ++r) q_ids.push_back(3 * (c.kv_len - c.q_len + r) + b);
    for (Index j = 0; j < c.kv_len; ++j) k_ids.push_back(3 * j + b);
  }
  return rope.with_positions(q_ids, k_ids);
}

}  // namespace

TEST_CASE("Rope: fused in attention() equals apply_position() then attention()",
          "[position][rope][attention]") {
  const Layout layout = GENERATE(Layout::Bshd, Layout::Bhsd);
  const int threads = GENERATE(1, 2);
  const RopePairing pairing = GENERATE(RopePairing::NeoX, RopePairing::GptJ);
  struct Shape {
    Index q_len, kv_len, dim, rotary;
  };
  // Prefill (ragged), decode (1..3 queries at the end of the keys), partial rotary in d 80.
  for (const Shape s : {Shape{77, 77, 64, 64}, Shape{1, 150, 64, 64}, Shape{2, 150, 64, 64},
                        Shape{3, 150, 64, 64}, Shape{37, 70, 80, 32}}) {
    Case c = Case{}
                 .lengths(s.q_len, s.kv_len)
                 .heads(4, 2)
                 .dims(s.dim)
                 .batches(2)
                 .laid_out(layout)
                 .on_threads(threads);
    const Rope rope(RopeTable(s.rotary, 10000, 512, RopeScaling::yarn(4, 64)), pairing);
    INFO("Lq " << c.q_len << " Lk " << c.kv_len << " d " << c.dim << " rotary " << s.rotary << " "
               << ak::test::name(layout) << " threads " << threads);
    CHECK(fused_vs_standalone(rope, c) <= tol::kF32);
    CHECK(fused_vs_standalone(with_gapped_ids(rope, c), c) <= tol::kF32);
  }
}

TEST_CASE("Rope: a Rope that turns rows differently does not pass as the standalone one",
          "[position][rope][attention]") {
  // The comparison above can fail: fused with one table, standalone with another.
  Case c = Case{}.lengths(20, 40);
  const Rope a(RopeTable(64, 10000, 64)), b(RopeTable(64, 10000, 64, RopeScaling::linear(2)));
  Tensor<float> q(c.layout, 1, 2, 20, 64), k(c.layout, 1, 1, 40, 64), v(c.layout, 1, 1, 40, 64);
  Tensor<float> o_a(Layout::Bhsd, 1, 2, 20, 64), o_b(Layout::Bhsd, 1, 2, 20, 64);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  ak::attention(ak::make_spec(a), q.cview(), k.cview(), v.cview(), o_a.view);
  ak::attention(ak::make_spec(b), q.cview(), k.cview(), v.cview(), o_b.view);
  CHECK(ak::test::max_abs_diff(o_a.view, o_b.view) > 100 * tol::kF32);
}

TEST_CASE("Rope: fused attention() matches reference::attention() in f32, bf16 and f16",
          "[position][rope][attention][reference]") {
  const Layout layout = GENERATE(Layout::Bshd, Layout::Bhsd);
  const int threads = GENERATE(1, 2);
  const Index q_len = GENERATE(1, 3, 45);
  Case c = Case{}.lengths(q_len, 70).heads(4, 2).batches(2).laid_out(layout).on_threads(threads);
  INFO("Lq " << q_len << " " << ak::test::name(layout) << " threads " << threads);
  const Rope rope(RopeTable(64, 10000, 256, RopeScaling::llama3(8, 64)), RopePairing::GptJ);
  const auto spec = ak::make_spec(ak::Causal{}, rope);
  ak::test::check_outcome(ak::test::run_case<float>(spec, c));
  const auto ids = ak::make_spec(ak::Causal{}, with_gapped_ids(rope, c));
  CHECK(ak::test::run_case<float>(ids, c).out_err <= tol::kF32);
  // The reference reads the same rounded inputs: the differences are f32 arithmetic only.
  const auto bf16 = ak::test::run_case<Eigen::bfloat16>(spec, c);
  CHECK(bf16.out_err <= tol::kF32);
  CHECK(bf16.lse_err <= tol::kLseF32);
  const auto f16 = ak::test::run_case<Eigen::half>(ids, c);
  CHECK(f16.out_err <= tol::kF32);
  CHECK(f16.lse_err <= tol::kLseF32);
}

TEST_CASE("Rope: every pairing and scaling, fused, matches the reference under each mask",
          "[position][rope][attention][reference]") {
  const RopePairing pairing = GENERATE(RopePairing::NeoX, RopePairing::GptJ);
  const RopeScaling scaling = GENERATE(RopeScaling{}, RopeScaling::linear(4), RopeScaling::ntk(4),
                                       RopeScaling::yarn(8, 64), RopeScaling::llama3(8, 64));
  Case c = Case{}.lengths(37, 70).heads(4, 2).dims(80).laid_out(Layout::Padded);
  const Rope rope(RopeTable(48, 10000, 128, scaling), pairing);  // partial: 48 of 80
  INFO("pairing " << (pairing == RopePairing::NeoX ? "NeoX" : "GptJ") << " scaling "
                  << int(scaling.kind));
  // Against the reference with the named tolerances of support/reference_check.hpp: Softmax's
  // LSE and SoftplusL1's row sums included, the padding intact, rows that see no key exact.
  const auto run = [&](const std::string& what, const auto& normalizer) {
    ak::test::check_attention(what + ", Full", ak::make_spec(ak::Full{}, normalizer, rope), c, 7);
    ak::test::check_attention(what + ", Causal", ak::make_spec(ak::Causal{}, normalizer, rope), c,
                              7);
    ak::test::check_attention(what + ", SlidingWindow{16, 0}",
                              ak::make_spec(ak::SlidingWindow{16, 0}, normalizer, rope), c, 7);
  };
  run("Softmax", ak::Softmax{});
  run("SoftplusL1", ak::SoftplusL1{});
}

TEST_CASE("Rope: proportional RoPE, fused, matches the reference and apply_position()",
          "[position][rope][attention][reference]") {
  // d = 80, p = 0.25: 10 of the 40 pairs turn (transformers' int(0.25 * 80 // 2)).
  const RopePairing pairing = GENERATE(RopePairing::NeoX, RopePairing::GptJ);
  INFO("pairing " << (pairing == RopePairing::NeoX ? "NeoX" : "GptJ"));
  const Rope rope(RopeTable(80, 1e6, 512, RopeScaling::proportional(0.25)), pairing);
  Case c = Case{}.lengths(37, 70).heads(4, 2).dims(80).laid_out(Layout::Padded);
  ak::test::check_attention("Softmax, Causal", ak::make_spec(ak::Causal{}, ak::Softmax{}, rope), c,
                            7);
  ak::test::check_attention("Softmax, SlidingWindow{16, 0}",
                            ak::make_spec(ak::SlidingWindow{16, 0}, ak::Softmax{}, rope), c, 7);
  Case decode = Case{}.lengths(2, 100).heads(4, 2).dims(80).batches(2);
  CHECK(fused_vs_standalone(rope, decode) <= tol::kF32);
  CHECK(fused_vs_standalone(with_gapped_ids(rope, decode), decode) <= tol::kF32);
}

namespace {

constexpr float kSentinel = 7.f;

// attention() with `spec` throws Error naming `field` and leaves the output untouched.
template <class Spec>
void check_attention_refuses(const Spec& spec, Index q_len, Index kv_len, Index dim,
                             std::optional<Index> q_offset, const std::string& field) {
  Tensor<float> q(Layout::Bhsd, 2, 2, q_len, dim), k(Layout::Bhsd, 2, 1, kv_len, dim),
      v(Layout::Bhsd, 2, 1, kv_len, dim), o(Layout::Bhsd, 2, 2, q_len, dim);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  o.fill(kSentinel);
  ak::Options options;
  options.q_offset = q_offset;
  ak::test::check_refused(
      [&] { ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view, options); },
      {field.c_str()}, {&o.memory}, kSentinel);
}

// apply_position() throws Error naming `field` and leaves x untouched.
void check_apply_refuses(const Rope& rope, Index len, Index dim, Role role, Index offset,
                         const std::string& field) {
  Tensor<float> x(Layout::Bhsd, 2, 2, len, dim), original(Layout::Bhsd, 2, 2, len, dim);
  x.randomize(5);
  original.randomize(5);
  ak::test::check_error([&] { ak::apply_position(rope, x.view, role, offset); }, {field.c_str()});
  CHECK(ak::test::max_abs_diff(x.view, original.view) == 0.0);
}

}  // namespace

TEST_CASE("Rope: positions outside the table and bad ids throw before writing",
          "[position][rope][errors]") {
  const Rope rope(RopeTable(64, 10000, 64));
  const auto causal = ak::make_spec(ak::Causal{}, rope);
  const auto full = ak::make_spec(ak::Full{}, rope);
  // Queries 61..64 over 64 keys: the last query position is past max_len = 64.
  check_attention_refuses(causal, 4, 8, 64, Index{61}, "the last query position");
  check_attention_refuses(full, 4, 8, 64, Index{-64}, "q_offset");  // -64 .. -61: |t| < 64
  check_attention_refuses(causal, 4, 65, 64, Index{0}, "the last key position");
  check_attention_refuses(causal, 4, 8, 32, std::nullopt, "RopeTable.rotary_dim");  // 64 > 32
  std::vector<Index> q_ids(8, 3), k_ids(16, 5);  // B = 2: [B * Lq], [B * Lk]
  std::vector<Index> bad = q_ids;
  bad[5] = 64;
  check_attention_refuses(ak::make_spec(rope.with_positions(bad, k_ids)), 4, 8, 64, std::nullopt,
                          "Rope.q_positions[...]");
  bad = k_ids;
  bad[15] = -64;
  check_attention_refuses(ak::make_spec(rope.with_positions(q_ids, bad)), 4, 8, 64, std::nullopt,
                          "Rope.k_positions[...]");
  check_attention_refuses(ak::make_spec(rope.with_positions({1, 2, 3}, k_ids)), 4, 8, 64,
                          std::nullopt, "Rope.q_positions.size()");
  check_attention_refuses(ak::make_spec(rope.with_positions(q_ids, {1})), 4, 8, 64, std::nullopt,
                          "Rope.k_positions.size()");

  check_apply_refuses(rope, 4, 64, Role::Query, 61, "the last query position");
  check_apply_refuses(rope, 4, 64, Role::Query, -64, "q_offset");
  check_apply_refuses(rope, 65, 64, Role::Key, 0, "the last key position");
  check_apply_refuses(rope, 4, 32, Role::Key, 0, "RopeTable.rotary_dim");

  // Proportional RoPE spans the head: a table of 32 on heads of 64 is refused (as partial
  // rotary it would pair (m, m + 16) and leave 32..63: neither transformers' layout).
  const Rope proportional(RopeTable(32, 1e6, 64, RopeScaling::proportional(0.25)));
  check_attention_refuses(ak::make_spec(ak::Causal{}, proportional), 4, 8, 64, std::nullopt,
                          "proportional RoPE spans the head");
  check_apply_refuses(proportional, 4, 64, Role::Query, 0, "RopeTable.rotary_dim");
  check_apply_refuses(proportional, 4, 64, Role::Key, 0, "== head_dim = 64");
  check_apply_refuses(rope.with_positions({1, 2, 3}, {}), 4, 64, Role::Query, 0,
                      "Rope.q_positions.size()");
  check_apply_refuses(rope.with_positions({}, std::vector<Index>(8, 64)), 4, 64, Role::Key, 0,
                      "Rope.k_positions[...]");
}

TEST_CASE("RopeTable: bad sizes, bases and scaling parameters throw naming the field",
          "[position][rope][errors]") {
  const auto refuses = [](auto make, const char* field) {
    ak::test::check_error([&] { (void)make(); }, {field});
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  refuses([] { return RopeTable(63, 10000, 8); }, "RopeTable.rotary_dim");
  refuses([] { return RopeTable(0, 10000, 8); }, "RopeTable.rotary_dim");
  refuses([] { return RopeTable(-2, 10000, 8); }, "RopeTable.rotary_dim");
  refuses([] { return RopeTable(64, 1.0, 8); }, "RopeTable.base");
  refuses([] { return RopeTable(64, 0.5, 8); }, "RopeTable.base");
  refuses([&] { return RopeTable(64, nan, 8); }, "RopeTable.base");
  refuses([] { return RopeTable(64, 10000, 0); }, "RopeTable.max_len");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::linear(0)); }, "RopeScaling.factor");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::ntk(-1)); }, "RopeScaling.factor");
  refuses([&] { return RopeTable(64, 10000, 8, RopeScaling::yarn(nan, 4096)); },
          "RopeScaling.factor");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::yarn(8, 0)); },
          "RopeScaling.original_max_len");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::yarn(8, 4096, 1, 32)); },
          "RopeScaling.beta_fast");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::yarn(8, 4096, 32, 0)); },
          "RopeScaling.beta_fast");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::yarn(8, 4096, 32, 1, -1)); },
          "RopeScaling.attention_factor");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::llama3(8, 0)); },
          "RopeScaling.original_max_len");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::llama3(8, 8192, 4, 1)); },
          "RopeScaling.high_freq_factor");
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::llama3(8, 8192, 0, 4)); },
          "RopeScaling.high_freq_factor");
  refuses([] { return Rope(std::shared_ptr<const RopeTable>(), RopePairing::NeoX); }, "Rope.table");
  // Proportional: p in (0, 1], at least one pair turning, the factor > 0.
  for (const double p : {0.0, -0.25, 1.5, nan, std::numeric_limits<double>::infinity()}) {
    INFO("partial_rotary_factor " << p);
    ak::test::check_error([&] { (void)RopeTable(64, 1e4, 8, RopeScaling::proportional(p)); },
                          {"RopeScaling.partial_rotary_factor", "in (0, 1]"});
  }
  // 0.2 * 8 // 2 = 0 pairs: NoPosition in disguise.
  ak::test::check_error([] { (void)RopeTable(8, 1e4, 8, RopeScaling::proportional(0.2)); },
                        {"RopeScaling.partial_rotary_factor", "no pair would turn"});
  refuses([] { return RopeTable(64, 10000, 8, RopeScaling::proportional(0.25, 0)); },
          "RopeScaling.factor");
  refuses([] { return RopeTable(63, 10000, 8, RopeScaling::proportional(0.25)); },
          "RopeTable.rotary_dim");
}

// apply_position() checks the ids of its own role only (Rope::validate_role): the Rope made by
// with_positions(q_ids, k_ids) that attention() takes turns each role standalone too.
TEST_CASE("apply_position: a Rope with both query and key ids turns each role with its ids",
          "[position][rope]") {
  // Each row turned by the ids equals the same row turned alone by a Rope without ids at that
  // position (apply_position's offset); a row left unturned would differ (checked too).
  const Rope rope = Rope(RopeTable(16, 10000, 64)).with_positions({3, 9}, {1, 2, 4});
  const Rope plain(RopeTable(16, 10000, 64));
  const auto check = [&](Role role, const std::vector<Index>& ids, std::uint32_t seed) {
    const Index n = static_cast<Index>(ids.size());
    Tensor<float> x(Layout::Bhsd, 1, 1, n, 16), original(Layout::Bhsd, 1, 1, n, 16);
    x.randomize(seed);
    original.randomize(seed);
    ak::apply_position(rope, x.view, role);
    for (Index s = 0; s < n; ++s) {
      Tensor<float> one(Layout::Bhsd, 1, 1, 1, 16);
      std::copy(original.view.row(0, 0, s), original.view.row(0, 0, s) + 16, one.view.row(0, 0, 0));
      // RoPE turns a query and a key at one position alike; an offset is a query's.
      ak::apply_position(plain, one.view, Role::Query, ids[static_cast<std::size_t>(s)]);
      double turned = 0, moved = 0;
      for (Index c = 0; c < 16; ++c) {
        turned =
            std::max(turned, double(std::abs(x.view.row(0, 0, s)[c] - one.view.row(0, 0, 0)[c])));
        moved = std::max(moved,
                         double(std::abs(x.view.row(0, 0, s)[c] - original.view.row(0, 0, s)[c])));
      }
      INFO((role == Role::Query ? "query" : "key")
           << " row " << s << " at id " << ids[std::size_t(s)]);
      CHECK(turned <= ak::test::tol::kF32);
      CHECK(moved > 1e-3);  // the id turned it: the comparison is not of a row with itself
    }
  };
  check(Role::Query, {3, 9}, 1);
  check(Role::Key, {1, 2, 4}, 2);
}

namespace {

// Rope with its range check moved into apply(): records a row outside the table instead of
// reading past it, so the missing check below shows without undefined behaviour.
struct RangeRecordingRope {
  Rope rope;
  bool* outside;
  void apply(float* x, Index dim, const ak::RowAt& at) const {
    const Index t = rope.position_of(at);
    if (t < 0 || t >= rope.table->max_len())
      *outside = true;
    else
      rope.apply(x, dim, at);
  }
  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index heads) const {
    rope.validate(q_len, kv_len, q_offset, batch, heads);
  }
  void validate_head_dim(Index dim) const { rope.validate_head_dim(dim); }
};

}  // namespace

// Keys sit at s + offset: an offset that puts them past max_len (keys of a decode step
// written to a cache at its length) is refused before anything is read or written -- by
// validate_role() for Rope and Fope, and for a policy with validate() alone, any key offset.
TEST_CASE("apply_position: keys at an offset past the table are refused",
          "[position][rope][errors]") {
  bool outside = false;
  const RangeRecordingRope policy{Rope(RopeTable(16, 10000, 64)), &outside};
  Tensor<float> k(Layout::Bhsd, 1, 1, 4, 16);
  k.randomize(3);
  CHECK_THROWS_AS(ak::apply_position(policy, k.view, Role::Key, 62), ak::Error);  // 62..65
  CHECK_FALSE(outside);
}

TEST_CASE("apply_position: Rope keys at an offset inside and past the table", "[position][rope]") {
  const Rope rope(RopeTable(16, 10000, 64));
  Tensor<float> k(Layout::Bhsd, 1, 1, 4, 16), at_60(Layout::Bhsd, 1, 1, 4, 16);
  k.randomize(3);
  at_60.randomize(3);
  ak::apply_position(rope, at_60.view, Role::Key, 60);  // 60..63: the last rows of the table
  ak::test::check_error([&] { ak::apply_position(rope, k.view, Role::Key, 61); },
                        {"the last key position"});
  ak::test::check_error([&] { ak::apply_position(rope, k.view, Role::Key, -64); },
                        {"the first key position"});
}

TEST_CASE("Rope: q_i . k_j depends only on i - j for negative query positions too",
          "[position][rope]") {
  // Queries at -40 .. -33 over keys 0 .. 15: a varlen sequence with more queries than keys
  // puts its first queries before key 0. Every query row holds the same x, every key row y.
  const RopePairing pairing = GENERATE(RopePairing::NeoX, RopePairing::GptJ);
  const Index dim = 32, q_len = 8, q_offset = -40, kv_len = 16;
  const Rope rope(RopeTable(dim, 10000, 64, RopeScaling::yarn(4, 32)), pairing);
  const RepeatedRows rows(rope, dim, q_len, kv_len, q_offset, 13);
  const Tensor<float>&x = rows.x, &y = rows.y, &q = rows.q, &k = rows.k;
  // x turned at position i dotted with y turned at j, one row each.
  const auto dot_at = [&](Index i, Index j) {
    std::vector<float> a(x.view.row(0, 0, 0), x.view.row(0, 0, 0) + dim);
    std::vector<float> b(y.view.row(0, 0, 0), y.view.row(0, 0, 0) + dim);
    ak::apply_position(rope, ak::bhsd(a.data(), 1, 1, 1, dim), Role::Query, i);
    ak::apply_position(rope, ak::bhsd(b.data(), 1, 1, 1, dim), Role::Key, j);
    return dot(a.data(), b.data(), dim);
  };
  // Each pair below has i - j = delta, as do positions (63 + delta, 63), inside the table.
  for (const Index delta : {Index{-40}, Index{-45}, Index{-55}}) {
    const double expected = dot_at(63 + delta, 63);
    for (Index r = 0; r < q_len; ++r) {
      const Index j = r + q_offset - delta;  // key position: i - j = delta
      if (j < 0 || j >= kv_len) continue;
      INFO("delta " << delta << " query position " << r + q_offset << " key " << j);
      CHECK_THAT(dot(q.view.row(0, 0, r), k.view.row(0, 0, j), dim), WithinAbs(expected, kDotAbs));
    }
  }
  // A negative position turns backwards: (-21, 0) is (0, 21), and not (21, 0).
  CHECK_THAT(dot_at(-21, 0), WithinAbs(dot_at(0, 21), kDotAbs));
  CHECK(std::abs(dot_at(-21, 0) - dot_at(21, 0)) > 100 * kDotAbs);
}

TEST_CASE("Rope: more queries than keys (negative query positions) matches the reference",
          "[position][rope][attention][reference]") {
  const RopePairing pairing = GENERATE(RopePairing::NeoX, RopePairing::GptJ);
  const Rope rope(RopeTable(64, 10000, 128, RopeScaling::llama3(8, 64)), pairing);
  Case c;
  c.batch = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.q_len = 70;  // bottom-right: queries at -40 .. 29
  c.kv_len = 30;
  const auto full = ak::test::run_case<float>(ak::make_spec(ak::Full{}, rope), c);
  CHECK(full.out_err <= tol::kF32);
  CHECK(full.lse_err <= tol::kLseF32);
  const auto causal = ak::test::run_case<float>(ak::make_spec(ak::Causal{}, rope), c);
  CHECK(causal.out_err <= tol::kF32);
  CHECK(causal.empty_rows_exact);
  // Ids shifted by +50 for queries and keys alike give the same attention: only i - j counts.
  std::vector<Index> q_ids, k_ids;
  for (Index b = 0; b < c.batch; ++b) {
    for (Index r = 0; r < c.q_len; ++r) q_ids.push_back(r - 40 + 50);
    for (Index j = 0; j < c.kv_len; ++j) k_ids.push_back(j + 50);
  }
  Tensor<float> q(Layout::Bshd, c.batch, c.q_heads, c.q_len, c.dim),
      k(Layout::Bshd, c.batch, c.kv_heads, c.kv_len, c.dim),
      v(Layout::Bshd, c.batch, c.kv_heads, c.kv_len, c.dim),
      o(Layout::Bshd, c.batch, c.q_heads, c.q_len, c.dim),
      shifted(Layout::Bshd, c.batch, c.q_heads, c.q_len, c.dim);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  ak::attention(ak::make_spec(ak::Full{}, rope), q.cview(), k.cview(), v.cview(), o.view);
  ak::attention(ak::make_spec(ak::Full{}, rope.with_positions(q_ids, k_ids)), q.cview(), k.cview(),
                v.cview(), shifted.view);
  CHECK(ak::test::max_abs_diff(o.view, shifted.view) <= tol::kF32);
}
