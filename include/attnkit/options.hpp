// Options: the per-call knobs of attention() that are not part of the variant itself —
// scale, query offset, thread count, how the products are formed and the optional
// row-statistics output. Chainable setters stand in for designated initializers, which C++17
// lacks.
#pragma once

#include <optional>
#include <utility>

#include "attnkit/core/span.hpp"
#include "attnkit/core/tensor.hpp"

namespace attnkit {

/// How the kernels form the products Q.K and P.V.
///  - Exact (default): f32 products of the stored values (bf16 / f16 / quantized K/V widened).
///  - Bf16: the tile kernel (attention(), attention_paged() / attention_varlen() prefill, and
///    split-KV chunks of the normalizers the decode row engine does not take) may round the
///    operands to bfloat16 -- the scaled, position-turned query rows, the key and value rows,
///    and the weights P before P.V (their row sums stay f32) -- and multiply them with bf16
///    products, accumulating in f32 throughout, as FlashAttention does on GPUs. It is a
///    permission, chosen per call: paths where it would not be faster (the decode row engine
///    -- softmax decode, memory-bound -- the backward, linear attention) stay exact, and every
///    result is within the mode's error bound (docs/mechanisms.md, "bf16 products").
///  - Int8: decode over q8_0 / q4_0 K (the split-KV row engine: decode(), KvCache, paged
///    decode) may quantize each scaled, position-turned query row to int8 per block of 32
///    (q8_0's rule, f32 scale) and form Q.K with integer dot products on the keys' bytes, as
///    ggml and ik_llama.cpp do; the softmax and P.V stay f32. Each logit then differs from the
///    exact one by at most sum over blocks of max|q_b| / 254 * sum |k|
///    (kernel/decode/decode_int8.hpp; docs/mechanisms.md, "Int8 products"). A permission too: other
///    K storage and the tile kernel stay exact.
enum class Products { Exact, Bf16, Int8 };

namespace detail {

/// A copy of `self` with one field set: the chainable with_...() setters of the option
/// structs (Options, ParamGrads, RingOptions, ShardedDecodeOptions) are one line each.
template <class O, class F, class V>
O with_field(O self, F O::*field, V&& value) {
  self.*field = std::forward<V>(value);
  return self;
}

}  // namespace detail

struct Options {
  static constexpr int kMaxThreads = 1024;  // a larger `threads` is an Error

  std::optional<float> scale;     // default 1/sqrt(head_dim)
  std::optional<Index> q_offset;  // absolute position of query row 0; default kv_len - q_len
  int threads = 0;                // 0: all OpenMP threads; 1: serial; at most kMaxThreads
  Products products = Products::Exact;
  // Optional [batch, q_heads, q_len] row statistic of the normalizer: the log-sum-exp
  // (natural log) for Softmax, the row sum of the weights for l1 normalizers (ReluPower);
  // a normalizer without one (Sigmoid) refuses a buffer. Its size must be the call's
  // batch * q_heads * q_len (an Error otherwise, before anything is written).
  Span<float> lse;

  // Setters return a modified copy, so `const auto& o = Options{}.with_lse(lse);` is safe.
  Options with_scale(float s) const { return detail::with_field(*this, &Options::scale, s); }
  Options with_q_offset(Index off) const {
    return detail::with_field(*this, &Options::q_offset, off);
  }
  Options with_threads(int n) const { return detail::with_field(*this, &Options::threads, n); }
  Options with_products(Products how) const {
    return detail::with_field(*this, &Options::products, how);
  }
  Options with_lse(Span<float> out) const { return detail::with_field(*this, &Options::lse, out); }
  Options with_lse(float* out, Index size) const { return with_lse(Span<float>(out, size)); }
};

}  // namespace attnkit
