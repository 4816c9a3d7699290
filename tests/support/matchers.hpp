// The Catch2 matchers the tests share, by their short names: the message of a thrown error
// (MessageMatches with ContainsSubstring or Equals) and floating-point closeness (WithinAbs,
// WithinRel).
#pragma once

#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;
using Catch::Matchers::MessageMatches;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
