// Must NOT compile: Tapa with SoftplusL1. Tapa forms the logits itself (an amplitude product
// times a cosine in the distance), and SoftplusL1 needs cosine logits q . k / (|q| |k|) that
// it forms its own way; attention() and decode() refuse the pair with one static_assert
// (detail::check_entry_types(), kernel/attention.hpp) saying they "cannot be combined". This
// file calls decode(), whose own copy of the checks had lacked this one. The test "tapa: Tapa with
// SoftplusL1 does not compile" builds this file and passes only if the compiler says so. Built with
// ATTNKIT_COMPILE_FAIL_CONTROL, the same call with Softmax must compile, which shows the
// failure comes from that check, not from an include or a typo.
#include <attnkit/core/tensor.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/spec.hpp>
#include <vector>

namespace ak = attnkit;

int main() {
  std::vector<float> q(8), k(8), v(8), o(8);
  const auto view = [](std::vector<float>& x) { return ak::bhsd(x.data(), 1, 1, 1, 8); };
  const ak::View<const float> Q = view(q), K = view(k), V = view(v);
#ifdef ATTNKIT_COMPILE_FAIL_CONTROL
  ak::decode(ak::make_spec(ak::Tapa{}, ak::Softmax{}), Q, K, V, view(o));
#else
  ak::decode(ak::make_spec(ak::Tapa{}, ak::SoftplusL1{}), Q, K, V, view(o));
#endif
  return 0;
}
