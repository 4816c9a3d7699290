// AlignedVector<T>: a std::vector for the K/V storage that the caches own and the kernels
// stream (KvCache, PagedKv).
//  - Its storage starts on a 64-byte cache line. malloc aligns to 16 bytes, so a row of whole
//    lines (d 128: 512 bytes in f32, 256 in bf16) would straddle lines, and every 64-byte
//    load of it would touch two.
//  - From 2 MiB on, it is 2 MiB aligned and asks Linux for transparent huge pages
//    (madvise(MADV_HUGEPAGE); the default THP mode, "madvise", gives none otherwise). A
//    stream over 4 KiB pages misses the TLB every 4 KiB, and in a virtual machine each miss
//    walks two page tables: f32 decode, Lk 32K, H 32, Hkv 32, 1 thread, AVX-512 VM: 58 ->
//    45 ms. Without THP the advice is ignored and the pages stay small.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attnkit::detail {

inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}  // NOLINT: rebinding, as std::allocator
  T* allocate(std::size_t n) {
    const Block b = block(n);
    void* p = ::operator new (b.bytes, std::align_val_t{b.align});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (b.align >= kHugePage) madvise(p, b.bytes, MADV_HUGEPAGE);  // advice: failure is fine
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ::operator delete (p, std::align_val_t{block(n).align});
  }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept {
    return false;
  }

 private:
  struct Block {
    std::size_t bytes, align;
  };
  // n elements: cache-line aligned (or T's alignment, if larger), or whole huge pages from one
  // huge page on. A count whose bytes would not fit throws, as std::allocator does.
  static Block block(std::size_t n) {
    if (n > (SIZE_MAX - kHugePage) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return {bytes, std::max(kCacheLine, alignof(T))};
    return {(bytes + kHugePage - 1) / kHugePage * kHugePage, std::max(kHugePage, alignof(T))};
  }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace attnkit::detail
