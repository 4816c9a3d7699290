// Must NOT compile: decode() with LSSAR. SoftplusL1Reweighted makes two passes over the keys
// (its weights need each row's whole LSSA sum), so split-KV chunks cannot be merged in one
// round; decode() refuses it with a static_assert. The test "decode: LSSAR does not compile"
// builds this file and passes only if the compiler says "cannot be merged in one round".
// Built with ATTNKIT_COMPILE_FAIL_CONTROL, the same call with SoftplusL1 (one pass) must
// compile, which shows the failure comes from the pass check, not from an include or a typo.
#include <attnkit/core/tensor.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <attnkit/spec.hpp>
#include <vector>

namespace ak = attnkit;

int main() {
  std::vector<float> q(4), k(8), v(8), o(4);
  const auto qv = ak::bhsd(static_cast<const float*>(q.data()), 1, 1, 1, 4);
  const auto kv = ak::bhsd(static_cast<const float*>(k.data()), 1, 1, 2, 4);
  const auto vv = ak::bhsd(static_cast<const float*>(v.data()), 1, 1, 2, 4);
#ifdef ATTNKIT_COMPILE_FAIL_CONTROL
  ak::decode(ak::make_spec(ak::SoftplusL1{}), qv, kv, vv, ak::bhsd(o.data(), 1, 1, 1, 4));
#else
  ak::decode(ak::make_spec(ak::SoftplusL1Reweighted{}), qv, kv, vv, ak::bhsd(o.data(), 1, 1, 1, 4));
#endif
  return 0;
}
