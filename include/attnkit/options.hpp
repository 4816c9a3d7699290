// Options: the per-call knobs of attention() that are not part of the variant itself —
// scale, query offset, thread count and the optional row-statistics output. Chainable
// setters stand in for designated initializers, which C++17 lacks.
#pragma once

#include <optional>

#include "attnkit/tensor.hpp"

namespace attnkit {

struct Options {
  static constexpr int kMaxThreads = 1024;  // a larger `threads` is an Error

  std::optional<float> scale;     // default 1/sqrt(head_dim)
  std::optional<Index> q_offset;  // absolute position of query row 0; default kv_len - q_len
  int threads = 0;                // 0: all OpenMP threads; 1: serial; at most kMaxThreads
  // Optional [batch, q_heads, q_len] row statistic of the normalizer: the log-sum-exp
  // (natural log) for Softmax, the row sum of the weights for l1 normalizers (ReluPower);
  // a normalizer without one (Sigmoid) refuses a buffer.
  float* lse = nullptr;

  // Setters return a modified copy, so `const auto& o = Options{}.with_lse(p);` is safe.
  Options with_scale(float s) const {
    Options o = *this;
    o.scale = s;
    return o;
  }
  Options with_q_offset(Index off) const {
    Options o = *this;
    o.q_offset = off;
    return o;
  }
  Options with_threads(int n) const {
    Options o = *this;
    o.threads = n;
    return o;
  }
  Options with_lse(float* out) const {
    Options o = *this;
    o.lse = out;
    return o;
  }
};

}  // namespace attnkit
