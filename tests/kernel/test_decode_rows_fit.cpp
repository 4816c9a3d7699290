// decode_rows_fit() (kernel/decode/decode_rows_fit.hpp): which specs the decode row engine
// takes. Softmax only (the engine writes softmax's online rescale itself; sinks are added by
// the merge); a logit mod that reads no position (none, Softcap, a Score that says so); no
// Position or one that turns rows (RoPE: the key rows arrive turned); no gathered key columns.
// Everything else runs query tiles. And the row count it serves: up to 8 rows a head.
#include <attnkit/kernel/decode/decode_rows_fit.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/power_of_two.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/score/alibi.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>

namespace ak = attnkit;
using ak::detail::decode_rows_fit;

namespace {

template <class... Policies>
using SpecOf = decltype(ak::make_spec(std::declval<Policies>()...));

}  // namespace

TEST_CASE("decode_rows_fit: softmax rows, position-free scores, turned rows, no columns",
          "[decode][decode_rows_fit]") {
  // Taken: the default spec, causal or windowed, soft-capped, with RoPE.
  STATIC_CHECK(decode_rows_fit<SpecOf<ak::Causal>>());
  STATIC_CHECK(decode_rows_fit<SpecOf<decltype(ak::Causal{} & ak::SlidingWindow{0, 0})>>());
  STATIC_CHECK(decode_rows_fit<SpecOf<ak::Causal, ak::Softcap>>());
  STATIC_CHECK(decode_rows_fit<SpecOf<ak::Causal, ak::Rope>>());
  // Not taken: other normalizers, a score that reads positions (ALiBi), a Position that owns
  // the product (TAPA), a mask with gathered columns (PowerOfTwo's distances).
  STATIC_CHECK_FALSE(decode_rows_fit<SpecOf<ak::Causal, ak::Sigmoid>>());
  STATIC_CHECK_FALSE(decode_rows_fit<SpecOf<ak::Causal, ak::SoftplusL1>>());
  STATIC_CHECK_FALSE(decode_rows_fit<SpecOf<ak::Causal, ak::Alibi>>());
  STATIC_CHECK_FALSE(decode_rows_fit<SpecOf<ak::Causal, ak::Tapa>>());
  STATIC_CHECK_FALSE(decode_rows_fit<SpecOf<ak::PowerOfTwo>>());
  // The rows per head it serves, as the README and docs/mechanisms.md say (up to 8).
  STATIC_CHECK(ak::detail::kDecodeRowsMaxQueries == 8);
}
