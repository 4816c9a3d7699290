// The error-path checks the tests share: a call throws attnkit::Error whose message names
// what it should (the argument, the expected and the actual value), and a refused call
// leaves every output buffer as it was (errors are thrown before anything is written).
#pragma once

#include <functional>
#include <initializer_list>
#include <vector>

namespace attnkit::test {

/// CHECKs that call() throws attnkit::Error whose message contains every one of `parts`.
void check_error(const std::function<void()>& call, std::initializer_list<const char*> parts);

/// check_error(call, parts), then CHECKs that each buffer still holds only `sentinel`.
void check_refused(const std::function<void()>& call, std::initializer_list<const char*> parts,
                   std::initializer_list<const std::vector<float>*> buffers, float sentinel = 42.f);

}  // namespace attnkit::test
