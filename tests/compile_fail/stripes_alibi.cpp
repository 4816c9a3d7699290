// Must NOT compile: stripe_attention() with Alibi. A gathered call sees gathered indices (its
// query rows and key columns are not at their true positions), so a Score that reads positions
// would bias by the wrong distances: with one head the output was silently wrong. The gathered
// drivers share one static_assert (select::check_gathered_spec) that refuses such a Score. The
// test "stripes: stripe_attention with Alibi does not compile" builds this file and passes
// only if the compiler says "a position-free Score". Built with ATTNKIT_COMPILE_FAIL_CONTROL,
// the same call with Softcap must compile, which shows the failure comes from that check.
#include <attnkit/core/tensor.hpp>
#include <attnkit/score/alibi.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/select/stripes.hpp>
#include <attnkit/spec.hpp>
#include <vector>

namespace ak = attnkit;

int main() {
  std::vector<float> q(8), k(8), v(8), o(8);
  const auto view = [](std::vector<float>& x) { return ak::bhsd(x.data(), 1, 1, 1, 8); };
  const ak::View<const float> Q = view(q), K = view(k), V = view(v);
  const ak::StripeSelection selection = ak::anchor_stripes(Q, K);
#ifdef ATTNKIT_COMPILE_FAIL_CONTROL
  ak::stripe_attention(ak::make_spec(ak::Softcap{30.f}), Q, K, V, view(o), selection);
#else
  ak::stripe_attention(ak::make_spec(ak::Alibi{{0.5f}}), Q, K, V, view(o), selection);
#endif
  return 0;
}
