// The SIMD layer, whole: simd::Vec and its arithmetic (vec.hpp), elementwise functions
// (math.hpp), lane masks (lane_mask.hpp), bf16 / f16 conversions (convert.hpp), int8 / 4-bit
// widening (int_widen.hpp), bf16 pair products (bf16_dot.hpp), int8 products of quantized
// key rows (int8_dot.hpp) and a block transpose (transpose.hpp). Kernels include this
// header; only simd/ names xsimd or intrinsics.
#pragma once

#include "attnkit/simd/bf16_dot.hpp"
#include "attnkit/simd/convert.hpp"
#include "attnkit/simd/int8_dot.hpp"
#include "attnkit/simd/int_widen.hpp"
#include "attnkit/simd/lane_mask.hpp"
#include "attnkit/simd/math.hpp"
#include "attnkit/simd/transpose.hpp"
#include "attnkit/simd/vec.hpp"
