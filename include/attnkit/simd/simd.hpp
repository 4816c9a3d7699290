// The SIMD layer, whole: simd::Vec and its arithmetic (vec.hpp), elementwise functions
// (math.hpp), lane masks (lane_mask.hpp) and bf16 / f16 conversions (convert.hpp). Kernels
// include this header; only simd/ names xsimd or intrinsics.
#pragma once

#include "attnkit/simd/convert.hpp"
#include "attnkit/simd/int_widen.hpp"
#include "attnkit/simd/lane_mask.hpp"
#include "attnkit/simd/math.hpp"
#include "attnkit/simd/vec.hpp"
