/*
 * core/half.h — conversions between float32 and the 16-bit float formats
 * (internal; static inline so every kernel loop inlines and vectorises them,
 * and a CUDA file can include it too: no libc calls, integer arithmetic only).
 *
 *   bfloat16: sign, 8 exponent bits, 7 mantissa bits — float32's top half.
 *   float16 (IEEE binary16): sign, 5 exponent bits (bias 15), 10 mantissa
 *             bits; largest finite 65504, smallest normal 2^-14, smallest
 *             subnormal 2^-24.
 *
 * Float32 to 16 bits rounds to nearest, ties to even (PyTorch's and the
 * hardware's rounding: x86 VCVTNEPS2BF16 and VCVTPS2PH, CUDA __float2bfloat16
 * and __float2half). Overflow gives infinity (float16: from 65520 up, the
 * halfway point past 65504). NaN stays NaN: bfloat16 keeps the sign and the
 * top payload bits and sets the quiet bit (as VCVTNEPS2BF16 does); float16
 * gives sign | 0x7e00 (as c10's fp16_ieee_from_fp32_value). 16 bits to
 * float32 is exact.
 */
#ifndef TS_CORE_HALF_H
#define TS_CORE_HALF_H

#include <stdint.h>
#include <string.h>

#include "core/hd.h" /* TS_HD */

static inline TS_HD uint32_t ts__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline TS_HD float ts__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline TS_HD uint16_t ts__bf16_from_f32(float f) {
    uint32_t x = ts__f32_bits(f);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; /* ties to even */
    uint32_t q = (x >> 16) | 0x0040u;                     /* NaN: quiet */
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r); /* a select, so loops of it vectorise */
}

static inline TS_HD float ts__bf16_to_f32(uint16_t h) { return ts__f32_from_bits((uint32_t)h << 16); }

static inline TS_HD uint16_t ts__f16_from_f32(float f) {
    uint32_t x = ts__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: infinity */
    if (ax >= 0x38800000u) {                                /* a normal float16: >= 2^-14 */
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u; /* round, then rebias 127 -> 15 */
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25: rounds to zero (2^-25 ties to even 0) */
    /* a subnormal float16: m x 2^-24 with m = mantissa x 2^(e - 126), rounded to nearest even */
    uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e; /* 14..24 */
    uint32_t m = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) m++; /* m = 0x400 is the smallest normal: still right */
    return (uint16_t)(sign | m);
}

static inline TS_HD float ts__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return ts__f32_from_bits(sign | 0x7f800000u | (m << 13)); /* inf, NaN */
    if (e != 0) return ts__f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
    /* zero or subnormal: m x 2^-24, exact in float32 */
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

#endif
