// A mask given by its element rule alone: keep_if(rule) wraps a callable rule(b, h, i, j) as a
// mask policy with no classify(), key_ranges() or runs(), so every tile is Partial and every
// pair is asked. The brute-force definition a test states a selection or routing by, for the
// reference to run against the kernel's own faces.
#pragma once

#include <attnkit/core/slots.hpp>
#include <attnkit/core/tensor.hpp>

namespace attnkit::test {

template <class Rule>
struct KeepIf {
  using slot = MaskSlot;
  Rule rule;
  bool keep(Index b, Index h, Index i, Index j) const { return rule(b, h, i, j); }
};

template <class Rule>
KeepIf<Rule> keep_if(Rule rule) {
  return KeepIf<Rule>{rule};
}

}  // namespace attnkit::test
