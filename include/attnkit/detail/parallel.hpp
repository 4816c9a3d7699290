// The parallel loops of attnkit, the only place that names OpenMP: items shared by threads
// with a dynamic schedule, either each thread with its own worker (scratch), built by the
// caller on the calling thread beforehand so that a failed allocation throws to the caller
// instead of calling std::terminate inside the parallel region (for_each_item), or items that
// need no worker (parallel_for). Without OpenMP the loops are serial.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attnkit/tensor.hpp"

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

/// run(worker, item) for every item in [0, items), worker = workers[thread]: one thread per
/// worker (a std::deque or std::vector of them), dynamic schedule of one item at a time.
template <class Workers, class Run>
void for_each_item(Workers& workers, Index items, Run&& run) {
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
