// Must NOT compile: make_spec() with two policies for the Mask slot. The test
// "spec: two policies for one slot do not compile" builds this file and passes only if the
// compiler names the offending slot. Built with ATTNKIT_COMPILE_FAIL_CONTROL, the same file
// takes one mask and must compile, which shows the failure above comes from the slot check
// and not from an include or a typo.
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/spec.hpp>

namespace ak = attnkit;

int main() {
#ifdef ATTNKIT_COMPILE_FAIL_CONTROL
  auto spec = ak::make_spec(ak::Causal{});
#else
  auto spec = ak::make_spec(ak::Causal{}, ak::Full{});
#endif
  (void)spec;
  return 0;
}
