// The one parallel loop of the kernels: items shared by OpenMP threads with a dynamic
// schedule, each thread with its own worker (scratch), built by the caller on the calling
// thread beforehand so that a failed allocation throws to the caller instead of calling
// std::terminate inside the parallel region. Without OpenMP the loop is serial.
#pragma once

#include <algorithm>
#include <cstddef>

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

}  // namespace attnkit::detail
