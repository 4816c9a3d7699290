// LinearState: the recurrent state of linear attention per (batch, query head): S [F, Dv]
// and z [F] (F = the feature map's feature count), in f32. linear_attention() reads it as
// the state before its first key and leaves the state after its last key, so a prefill
// followed by decode steps equals one long prefill. Stored as the kernel uses it, so the
// chunked form updates it in place with tile GEMMs: per head S as [F, ld] (ld = Dv rounded
// up to SIMD vectors, padding 0), then z [F].
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

class LinearState {
 public:
  LinearState() = default;

  /// A zero state for `batch` x `heads` query heads, `features` x `value_dim` each.
  /// Throws Error on negative sizes or when the total does not fit in Index.
  LinearState(Index batch, Index heads, Index features, Index value_dim)
      : batch_(batch), heads_(heads), features_(features), value_dim_(value_dim) {
    detail::require(batch >= 0 && heads >= 0 && features >= 0 && value_dim >= 0,
                    "LinearState sizes", "all >= 0", "a negative size");
    ld_ = simd::round_up(value_dim);
    Index total = 0;
    detail::require(detail::checked_product({batch, heads, features, ld_ + 1}, &total),
                    "LinearState sizes", "a product that fits in Index (int64)", "an overflow");
    head_floats_ = features * (ld_ + 1);
    data_.assign(static_cast<std::size_t>(total), 0.f);
  }

  Index batch() const { return batch_; }
  Index heads() const { return heads_; }
  Index features() const { return features_; }
  Index value_dim() const { return value_dim_; }
  Index ld() const { return ld_; }  // floats between two feature rows of one head

  /// S [features, ld] of head (b, h), followed by its z [features].
  float* head(Index b, Index h) { return data_.data() + (b * heads_ + h) * head_floats_; }
  const float* head(Index b, Index h) const {
    return data_.data() + (b * heads_ + h) * head_floats_;
  }
  float* z_row(Index b, Index h) { return head(b, h) + features_ * ld_; }
  /// S[f, c] and z[f] of head (b, h).
  float& s(Index b, Index h, Index f, Index c) { return head(b, h)[f * ld_ + c]; }
  float& z(Index b, Index h, Index f) { return z_row(b, h)[f]; }
  float s(Index b, Index h, Index f, Index c) const { return head(b, h)[f * ld_ + c]; }
  float z(Index b, Index h, Index f) const { return head(b, h)[features_ * ld_ + f]; }
  /// Every float of the state (all heads), for copies and comparisons.
  const std::vector<float>& floats() const { return data_; }

  /// Back to the empty history (all zero).
  void reset() { std::fill(data_.begin(), data_.end(), 0.f); }

 private:
  Index batch_ = 0, heads_ = 0, features_ = 0, value_dim_ = 0, ld_ = 0, head_floats_ = 0;
  std::vector<float> data_;
};

}  // namespace attnkit
