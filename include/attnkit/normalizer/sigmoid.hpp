// Sigmoid (Ramapuram et al. 2024): o_i = sum_j sigmoid(s_ij + b) v_j, with no row
// normalization. The recommended bias is b = -log(n): by default n is the call's key count
// Lk (the paper's -log of the sequence length); their training configs fix it instead to
// -log of the training length (`Sigmoid{-std::log(2048.f)}`). A bias per query head
// overrides both. Masked pairs weigh sigmoid(-inf) = 0, so empty rows give 0. No running
// maximum and no rescale: key tiles could be summed in any order (kRescales = false), and
// there is no row statistic (an Options::lse buffer is an Error).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct Sigmoid {
  using slot = NormalizerSlot;
  static constexpr bool kRescales = false;
  static constexpr RowStat kRowStat = RowStat::None;
  static constexpr float kLog2e = 1.4426950408889634f;

  std::optional<float> bias;     // default: -log(Lk) of the call
  std::vector<float> head_bias;  // [q_heads], when not empty: overrides `bias`

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    return detail::TagHash::of<Sigmoid>().add(bias).add(head_bias).value();
  }

  Sigmoid() = default;
  /// One bias for every head and call. Throws Error unless it is finite.
  explicit Sigmoid(float b) : bias(b) { check_biases(); }
  /// One bias per query head (must cover every head of the calls it is used in). Throws
  /// Error unless every bias is finite.
  static Sigmoid per_head(std::vector<float> biases) {
    Sigmoid s;
    s.head_bias = std::move(biases);
    s.check_biases();
    return s;
  }

  /// A part that runs as a call of its own (pages, ring steps) keeps the whole call's
  /// default bias, -log Lk of all the keys (normalizer/faces.hpp, KeyPart).
  Sigmoid part(const KeyPart& part) const {
    if (!part.own_call || !head_bias.empty() || bias) return *this;
    return Sigmoid{part.kv_len > 0 ? -std::log(static_cast<float>(part.kv_len)) : 0.f};
  }
  /// A one-head gathered call standing for head h keeps head h's bias.
  Sigmoid for_head(Index h) const {
    if (head_bias.empty()) return *this;
    return per_head({head_bias[static_cast<std::size_t>(h)]});
  }

  /// Throws Error naming the first bias that is not finite (a NaN makes every row NaN, an
  /// infinite one every weight 0 or 1).
  void check_biases() const {
    if (bias) detail::require(std::isfinite(*bias), "Sigmoid.bias", "finite", *bias);
    for (std::size_t h = 0; h < head_bias.size(); ++h)
      detail::require(std::isfinite(head_bias[h]), detail::cat("Sigmoid.head_bias[", h, "]"),
                      "finite", head_bias[h]);
  }

  /// The bias of the rows of ctx.head.
  float bias_for(const RowContext& ctx) const {
    if (!head_bias.empty()) return head_bias[static_cast<std::size_t>(ctx.head)];
    if (bias) return *bias;
    return ctx.kv_len > 0 ? -std::log(static_cast<float>(ctx.kv_len)) : 0.f;
  }

  struct State {
    simd::Vec bias;
  };

  State begin(const RowContext& ctx) const { return State{simd::Vec(bias_for(ctx))}; }

  /// s[keys, ld] -> sigmoid(s + b) = 1 / (1 + 2^(-(s + b) log2 e)). Returns 1: nothing to
  /// rescale (the kernel does not ask, kRescales = false).
  simd::Vec absorb(State& st, float* s, Index keys, Index ld) const {
    const simd::Vec one(1.f), neg_log2e(-kLog2e);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec x = simd::load(s + j * ld) + st.bias;
      simd::store(s + j * ld, one / (one + simd::exp2(x * neg_log2e)));
    }
    return one;
  }

  simd::Vec finalize(const State& /*st*/) const { return simd::Vec(1.f); }

  /// Reference rule in double: weights in place; returns NaN (there is no row statistic).
  double reference_row(double* s, Index n, const RowContext& ctx) const {
    const double b = static_cast<double>(bias_for(ctx));
    for (Index j = 0; j < n; ++j) s[j] = 1.0 / (1.0 + std::exp(-(s[j] + b)));
    return std::nan("");
  }

  // Backward (attention_backward()): P = sigmoid(s + b) is rebuilt from the logit, and
  // dS = dP P (1 - P); the bias's gradient is the sum of dS over the row's keys.
  static constexpr const char* kTrainedParam = "bias";  // ParamGrads::normalizer
  struct BackwardState {
    simd::Vec bias;
  };

  BackwardState begin_backward(const RowContext& ctx, simd::Vec /*stat*/,
                               simd::Vec /*delta*/) const {
    return BackwardState{simd::Vec(bias_for(ctx))};
  }

  /// s: logits -> P; ds: dP -> dS. Returns sum_j dS per lane (the bias's gradient).
  simd::Vec backward(const BackwardState& st, float* s, float* ds, Index keys, Index ld) const {
    const simd::Vec one(1.f), neg_log2e(-kLog2e);
    simd::Vec sum(0.f);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec x = simd::load(s + j * ld) + st.bias;
      const simd::Vec p = one / (one + simd::exp2(x * neg_log2e));
      const simd::Vec g = simd::load(ds + j * ld) * (p - p * p);
      simd::store(s + j * ld, p);
      simd::store(ds + j * ld, g);
      sum = sum + g;
    }
    return sum;
  }

  /// Reference backward in double (see Softmax::reference_backward); returns the row's
  /// share of its bias's gradient.
  double reference_backward(const double* /*s*/, const double* p, double* dp, Index n,
                            double /*stat*/, const RowContext& /*ctx*/) const {
    double sum = 0.0;
    for (Index j = 0; j < n; ++j) sum += (dp[j] = dp[j] * p[j] * (1.0 - p[j]));
    return sum;
  }

  /// Throws Error when a bias is not finite (the members are public) or a per-head bias does
  /// not cover the call's heads.
  void validate(Index /*q_len*/, Index /*kv_len*/, Index /*q_offset*/, Index /*batch*/,
                Index q_heads) const {
    check_biases();
    detail::require(head_bias.empty() || static_cast<Index>(head_bias.size()) == q_heads,
                    "Sigmoid.head_bias.size()", detail::cat("q_heads = ", q_heads),
                    head_bias.size());
  }
};

}  // namespace attnkit
