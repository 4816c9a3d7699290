// What the two translation units of the fuzz target share: the byte reader, the Error probe,
// the output tolerances and the hand-over from fuzz_attention.cpp (which owns
// LLVMFuzzerTestOneInput) to fuzz_entries.cpp. Two TUs so that CI compiles them in parallel.
#pragma once

#include <attnkit/core/error.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "support/attnkit_test.hpp"

namespace attnkit_fuzz {

using Index = attnkit::Index;

// An input whose first byte is at least this goes to fuzz_entries() (the rest of its bytes),
// any other to fuzz_attention.cpp's own decoder, whose first byte (storage types) uses 0..5.
constexpr std::uint8_t kEntriesTag = 0xc0;

// The entry points besides attention() with its basic specs: fuzz_entries.cpp.
void fuzz_entries(const std::uint8_t* data, std::size_t size);

// Bytes, read front to back, one decision per byte (so a mutation changes one decision);
// past the end every byte reads as 0.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}
  std::uint8_t next() { return p_ < end_ ? *p_++ : 0; }
  Index in(Index lo, Index hi) { return lo + next() % (hi - lo + 1); }  // hi - lo < 256
  template <class T, std::size_t N>
  T pick(const T (&table)[N]) {
    return table[next() % N];
  }
  std::uint32_t u32() {
    std::uint32_t x = 0;
    for (int i = 0; i < 4; ++i) x = x << 8 | next();
    return x;
  }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

// x in double, through f32 for the 16-bit storage types (Eigen's have no double conversion).
template <class T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return static_cast<double>(static_cast<float>(x));
}

// "<call> accepted what reference::attention rejected" (or the other way round): the message
// of a call and the reference that disagree on whether the input is valid.
inline std::string verdicts_differ(const std::string& call, bool ok, bool ref_ok) {
  return call + (ok ? " accepted" : " rejected") + " what reference::attention " +
         (ref_ok ? "accepted" : "rejected");
}

// Runs f; true when it returned, false when it threw attnkit::Error. Anything else escapes
// to libFuzzer, which reports it as a crash.
template <class F>
bool returns(F f) {
  try {
    f();
    return true;
  } catch (const attnkit::Error&) {
    return false;
  }
}

// Loose on purpose: a fuzzer hunts for wrong answers, not for the last ulp; the unit tests
// hold the tight tolerances. Relative to the largest |v| (outputs are convex combinations).
template <class O>
double output_tolerance() {
  namespace tol = attnkit::test::tol;
  return std::is_same_v<O, float> ? 50 * tol::kF32 : 2 * tol::kHalf;
}

}  // namespace attnkit_fuzz
