// Scratch: 64-byte aligned float storage owned by one thread for one call. The kernel
// sizes it once and carves its named buffers out of it; nothing is allocated per tile.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "attnkit/core/index.hpp"

namespace attnkit::detail {

class Scratch {
 public:
  static constexpr std::size_t kAlign = 64;

  explicit Scratch(Index floats) : data_(allocate(floats)), size_(floats) {}

  /// Hands out the next `n` floats, rounded so that every buffer starts 64-byte aligned.
  float* carve(Index n) {
    const Index step = (n + kFloatsPerLine - 1) / kFloatsPerLine * kFloatsPerLine;
    float* p = data_.get() + used_;
    used_ += step;
    assert(used_ <= size_ && "Scratch: carved more than was sized");
    return p;
  }

  /// Floats this scratch holds.
  Index size() const { return size_; }

  /// Floats needed to carve buffers of the given sizes (each >= 0). A total that does not
  /// fit in memory throws std::bad_array_new_length (a std::bad_alloc), as `new` would.
  template <class... N>
  static Index size_for(N... n) {
    Index total = 0;
    const bool fits = (... && add_line_rounded(Index{n}, &total));
    if (!fits) throw std::bad_array_new_length();
    return total;
  }

 private:
  static constexpr Index kFloatsPerLine = kAlign / sizeof(float);
  static constexpr Index kMaxFloats = PTRDIFF_MAX / sizeof(float) / 2;  // bytes fit in Index

  // *total += n rounded up to whole lines; false when it passes kMaxFloats.
  static bool add_line_rounded(Index n, Index* total) {
    if (n > kMaxFloats - *total) return false;
    *total += (n + kFloatsPerLine - 1) / kFloatsPerLine * kFloatsPerLine;
    return true;
  }
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{kAlign}); }
  };
  static float* allocate(Index n) {
    return static_cast<float*>(::operator new[](
        static_cast<std::size_t>(n > 0 ? n : 1) * sizeof(float), std::align_val_t{kAlign}));
  }

  std::unique_ptr<float, Free> data_;
  Index size_ = 0;
  Index used_ = 0;
};

}  // namespace attnkit::detail
