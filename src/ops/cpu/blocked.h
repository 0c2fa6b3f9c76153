/*
 * ops/cpu/blocked.h — the layout changes of the convolutions dnnl_conv.c runs in
 * oneDNN's blocked layouts: activations NCHW <-> nChw16c (oneDNN's "aBcd16b":
 * channels in blocks of 16, the 16 channels of one position contiguous) and
 * weights OIhw <-> 16x16-blocked (below). Activations: same element
 * type on both sides (float32 or bfloat16: 4- or 2-byte elements, moved as
 * bits), 16x16 transposes in AVX-512 where cpuid has it, a scalar loop
 * elsewhere; threaded over (image, channel block) on the caller's OpenMP
 * budget. oneDNN's own reorders do the same (and run for every other layout),
 * but its bfloat16 ones are generic kernels: 0.5 ms for the reference CNN's
 * 64x32x28x28 activations against ~0.1 ms here.
 */
#ifndef TS_OPS_CPU_BLOCKED_H
#define TS_OPS_CPU_BLOCKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* plain (N, C, HW) -> blocked (N, ceil(C/16), HW, 16); the padding channels of the last block are zeroed. */
void ts__cpu_to_blocked16(const void *src, void *dst, int64_t N, int64_t C, int64_t HW, size_t esize);
/* blocked (N, ceil(C/16), HW, 16) -> plain (N, C, HW); the padding channels are not read. */
void ts__cpu_from_blocked16(const void *src, void *dst, int64_t N, int64_t C, int64_t HW, size_t esize);

/* Convolution weights: plain float32 OIhw (O, I, KK = kh * kw) <-> oneDNN's blocked (ceil(O/16), ceil(I/16), KK,
 * then a 16x16 block of (o, i) laid out as the kind says: o the output channel's index in its block, i the input
 * channel's). The 8x16x2 kinds are bfloat16 (rounded to nearest even, as ts_convert); their pairs of adjacent
 * channels share a 32-bit word. */
typedef enum ts_wblock {
    TS_WB_16I16O,  /* "ABcd16b16a", float32: i * 16 + o (the forward's float32 weights, their gradient) */
    TS_WB_16O16I,  /* "ABcd16a16b", float32: o * 16 + i (backward-data's) */
    TS_WB_8I16O2I, /* "ABcd8b16a2b", bfloat16: (i / 2) * 32 + o * 2 + i % 2 (the bfloat16 forward's) */
    TS_WB_8O16I2O, /* "ABcd8a16b2a", bfloat16: (o / 2) * 32 + i * 2 + o % 2 (bfloat16 backward-data's) */
} ts_wblock;
#define TS_WB_MAX_KK 25 /* kernels up to 5x5 (a tile's transposed copy lives on the stack) */
/* plain -> blocked; padding (o >= O, i >= I) zeroed. KK <= TS_WB_MAX_KK. */
void ts__cpu_weights_to_blocked(const float *w, void *dst, int64_t O, int64_t I, int64_t KK, ts_wblock kind);
/* blocked float32 (TS_WB_16I16O or TS_WB_16O16I) -> plain; padding not read. KK <= TS_WB_MAX_KK. */
void ts__cpu_weights_from_blocked(const float *src, float *w, int64_t O, int64_t I, int64_t KK, ts_wblock kind);


/* Tests: run the portable loops even where cpuid has AVX-512 (both paths stay checked on this project's
 * machines). */
void ts__cpu_blocked_portable(bool on);

#endif
