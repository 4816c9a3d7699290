// The parallel loops of attnkit, the only place that names OpenMP: items shared by threads
// with a dynamic schedule, either each thread with its own worker (scratch), built by the
// caller on the calling thread beforehand so that a failed allocation throws to the caller
// instead of calling std::terminate inside the parallel region (for_each_item), or items that
// need no worker (parallel_for). Without OpenMP the loops are serial. Workers holds those
// per-thread workers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <new>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attnkit/core/index.hpp"

namespace attnkit::detail {

/// The threads a call uses: `requested` (> 0) or OpenMP's default, 1 without OpenMP.
inline int thread_count(int requested) {
#ifdef _OPENMP
  return requested > 0 ? requested : omp_get_max_threads();
#else
  (void)requested;
  return 1;
#endif
}

/// thread_count(requested), but never more threads than items (and at least 1).
inline int threads_for(int requested, Index items) {
  return static_cast<int>(std::min<Index>(thread_count(requested), std::max<Index>(items, 1)));
}

/// `count` workers T(args...), one per thread, built in place on the calling thread (a failed
/// allocation or constructor throws here, after destroying those built) and never moved: a
/// worker may hold pointers into itself. Each sits on cache lines of its own, so threads
/// writing their workers' members do not share a line. (A std::deque did the same, but each
/// kernel type instantiated its machinery anew: about 400 functions per type to compile.)
template <class T>
class Workers {
 public:
  template <class... Args>
  explicit Workers(int count, Args&&... args)  // each worker gets the same (lvalue) args
      : items_(static_cast<unsigned char*>(
            ::operator new(kStride* static_cast<std::size_t>(std::max(count, 1)), kAlign))) {
    try {
      for (; size_ < static_cast<std::size_t>(count); ++size_) new (slot(size_)) T(args...);
    } catch (...) {
      release();
      throw;
    }
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() { release(); }

  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return *std::launder(reinterpret_cast<T*>(slot(i))); }
  T& front() { return (*this)[0]; }

 private:
  static constexpr std::size_t kLine = 64;
  static constexpr std::size_t kStride = (sizeof(T) + kLine - 1) / kLine * kLine;
  static constexpr std::align_val_t kAlign{std::max(alignof(T), kLine)};
  unsigned char* slot(std::size_t i) const { return items_ + i * kStride; }
  void release() noexcept {
    while (size_ > 0) (*this)[--size_].~T();
    ::operator delete(items_, kAlign);
  }

  unsigned char* items_;
  std::size_t size_ = 0;
};

/// run(worker, item) for every item in [0, items), worker = workers[thread]: one thread per
/// worker (Workers, or a std::vector of them), dynamic schedule of one item at a time.
template <class Pool, class Run>
void for_each_item(Pool& workers, Index items, Run&& run) {
#ifdef _OPENMP
  const int threads = static_cast<int>(workers.size());
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    auto& mine = workers[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (Index item = 0; item < items; ++item) run(mine, item);
  }
#else
  for (Index item = 0; item < items; ++item) run(workers.front(), item);
#endif
}

/// run(item) for every item in [0, items) on `threads` threads (1: serial), handed out `chunk`
/// items at a time (dynamic schedule), for loops whose items need no scratch of their own.
/// Each item writes only its own outputs, so the thread count never changes a bit. An
/// exception from run() is caught inside the region; after the loop (the other items still
/// run) the one of the lowest item is rethrown, as a serial loop would have thrown it first.
template <class Run>
void parallel_for(int threads, Index items, Index chunk, Run&& run) {
  std::exception_ptr error;
  Index failed = items;  // the lowest item that threw
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, chunk) num_threads(threads) if (threads > 1)
#endif
  for (Index item = 0; item < items; ++item) {
    try {
      run(item);
    } catch (...) {
#ifdef _OPENMP
#pragma omp critical(attnkit_parallel_for_error)
#endif
      if (item < failed) {
        failed = item;
        error = std::current_exception();
      }
    }
  }
  (void)threads, (void)chunk;
  if (error) std::rethrow_exception(error);
}

}  // namespace attnkit::detail
