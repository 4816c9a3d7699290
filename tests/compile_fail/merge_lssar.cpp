// Must NOT compile: merge() of LSSAR parts. SoftplusL1Reweighted makes two passes over the
// keys (its weights need each row's whole LSSA sum), so its parts cannot merge in one round;
// merge() refuses it with a static_assert naming the two-round form. The test "merge: LSSAR
// parts do not merge in one round" builds this file and passes only if the compiler says so.
// Built with ATTNKIT_COMPILE_FAIL_CONTROL, the same call with SoftplusL1 (one pass) must
// compile, which shows the failure comes from the pass check, not from an include or a typo.
#include <attnkit/core/tensor.hpp>
#include <attnkit/kernel/merge.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <vector>

namespace ak = attnkit;

int main() {
  std::vector<float> part(4), out(4), stat(1);
  const std::vector<ak::View<const float>> parts{
      ak::bhsd(static_cast<const float*>(part.data()), 1, 1, 1, 4)};
#ifdef ATTNKIT_COMPILE_FAIL_CONTROL
  ak::merge(ak::SoftplusL1{}, parts, {stat.data()}, ak::bhsd(out.data(), 1, 1, 1, 4));
#else
  ak::merge(ak::SoftplusL1Reweighted{}, parts, {stat.data()}, ak::bhsd(out.data(), 1, 1, 1, 4));
#endif
  return 0;
}
