// TopkRow: the exact top k of one query's stream of (score, key) pairs, fed in increasing
// key order (DeepSeek Sparse Attention's selection; dsa/indexer.hpp feeds it). Order: a
// higher score first, on equal scores the lower key. Candidates gather in a buffer of 2k;
// when it fills, nth_element keeps the best k and their lowest score becomes the threshold.
// The threshold only rises, and a later key loses every tie to an earlier one, so a score at
// or below it can never enter the top k: the result is exact, whatever the order of the
// feeds' blocks, and the same for any thread count (each row is one thread's).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnkit/core/index.hpp"

namespace attnkit::detail {

class TopkRow {
 public:
  struct Entry {
    float score;
    std::int32_t key;
  };
  /// True when a is before b in the selection's order.
  static bool better(const Entry& a, const Entry& b) {
    return a.score > b.score || (!(a.score < b.score) && a.key < b.key);
  }

  /// Starts a row that keeps k (>= 1) entries.
  void reset(Index k) {
    k_ = k;
    held_ = 0;
    threshold_ = -std::numeric_limits<float>::infinity();
    full_ = false;
    buffer_.resize(std::size_t(2 * k));
  }

  /// Offers the scores of keys first .. first + n (later than every key offered before).
  void offer(const float* scores, Index first, Index n) {
    for (Index i = 0; i < n; ++i) {
      const float s = scores[i];
      if (full_ ? !(s > threshold_) : false) continue;
      buffer_[std::size_t(held_++)] = {s, std::int32_t(first + i)};
      if (held_ == 2 * k_) compact();
    }
  }

  /// Offers one (score, key), the key later than every key offered before.
  void offer(float score, Index key) { offer(&score, key, 1); }

  /// The kept entries (at most k), in increasing key order; the row is then done.
  const Entry* kept(Index& count) {
    if (held_ > k_) compact();
    std::sort(buffer_.begin(), buffer_.begin() + held_,
              [](const Entry& a, const Entry& b) { return a.key < b.key; });
    count = held_;
    return buffer_.data();
  }

  /// The selected keys in increasing order into out[0, k); -1 past the keys offered.
  void finish(std::int32_t* out) {
    Index count = 0;
    const Entry* e = kept(count);
    for (Index i = 0; i < k_; ++i) out[i] = i < count ? e[i].key : -1;
  }

 private:
  // Keeps the best k of the held entries; the worst of them sets the threshold.
  void compact() {
    const auto first = buffer_.begin(), kth = first + k_;
    std::nth_element(first, kth - 1, first + held_, better);
    held_ = k_;
    threshold_ = (kth - 1)->score;  // the worst kept: nth_element puts it at k - 1
    full_ = true;
  }

  Index k_ = 0, held_ = 0;
  float threshold_ = 0;
  bool full_ = false;
  std::vector<Entry> buffer_;
};

}  // namespace attnkit::detail
