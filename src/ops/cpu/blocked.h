/*
 * ops/cpu/blocked.h — NCHW <-> nChw16c layout changes (oneDNN's "aBcd16b":
 * channels in blocks of 16, the 16 channels of one position contiguous), for
 * the convolutions dnnl_conv.c runs in oneDNN's blocked layout. Same element
 * type on both sides (float32 or bfloat16: 4- or 2-byte elements, moved as
 * bits), 16x16 transposes in AVX-512 where cpuid has it, a scalar loop
 * elsewhere; threaded over (image, channel block) on the caller's OpenMP
 * budget. oneDNN's own reorder does the same (and is what runs without these),
 * but its bfloat16 one is a generic kernel: 0.5 ms for the reference CNN's
 * 64x32x28x28 activations against ~0.1 ms here.
 */
#ifndef TS_OPS_CPU_BLOCKED_H
#define TS_OPS_CPU_BLOCKED_H

#include <stddef.h>
#include <stdint.h>

/* plain (N, C, HW) -> blocked (N, ceil(C/16), HW, 16); the padding channels of the last block are zeroed. */
void ts__cpu_to_blocked16(const void *src, void *dst, int64_t N, int64_t C, int64_t HW, size_t esize);
/* blocked (N, ceil(C/16), HW, 16) -> plain (N, C, HW); the padding channels are not read. */
void ts__cpu_from_blocked16(const void *src, void *dst, int64_t N, int64_t C, int64_t HW, size_t esize);

#endif
