/*
 * ops/cpu/blocked.c — NCHW <-> nChw16c (see blocked.h).
 *
 * One (image, channel block) is a 16 x HW matrix (channels x positions) on the
 * plain side and its transpose on the blocked side: both directions move 16x16
 * tiles through one register transpose (4 rounds of 16 shuffles on 32-bit
 * lanes; bfloat16 tiles widen to 32 bits on the load and narrow on the store).
 * A tile of the last, partial channel block or of the plane's tail is loaded
 * and stored under masks.
 */
#include "ops/cpu/blocked.h"
#include "core/internal.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BLOCKED_AVX512 1
#endif

/* Blocks at least this many elements in all run on the OpenMP threads. */
#define PAR_MIN (1 << 15)

#ifdef BLOCKED_AVX512
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

/* r[i][j] -> r[j][i] for a 16x16 matrix of 32-bit lanes, one row per register. */
AVX512_TARGET static inline __attribute__((always_inline)) void transpose16(__m512i r[16]) {
    __m512i t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + k], 128-bit lane L: column 4L + k of rows 4g .. 4g + 3 */
    __m512i u[16];
#pragma GCC unroll 4
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), w = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88), w2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_i32x4(v, v2, 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(v, v2, 0xdd);
        r[4 + k] = _mm512_shuffle_i32x4(w, w2, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(w, w2, 0xdd);
    }
}

/* Row i (i < rows; zero beyond) of a tile: n (<= 16) elements from p. */
AVX512_TARGET static inline __attribute__((always_inline)) __m512i load_row(const char *p, int n, size_t es) {
    const __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    if (es == 4) return _mm512_maskz_loadu_epi32(m, p);
    return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
}

AVX512_TARGET static inline __attribute__((always_inline)) void store_row(char *p, __m512i v, int n, size_t es) {
    const __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    if (es == 4)
        _mm512_mask_storeu_epi32(p, m, v);
    else
        _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(v));
}

/* One (image, channel block): plain rows of stride HW (cr of them real) <-> blocked (HW, 16); es and
 * to_blocked constants in each of block_avx512's four instances. */
AVX512_TARGET static inline __attribute__((always_inline)) void block_tiles(const char *src, char *dst, int64_t HW,
                                                                           int cr, size_t es, bool to_blocked) {
    __m512i r[16];
    for (int64_t p0 = 0; p0 < HW; p0 += 16) {
        const int t = (int)TS_MIN(16, HW - p0);
        if (to_blocked) {
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = i < cr ? load_row(src + ((size_t)i * (size_t)HW + (size_t)p0) * es, t, es) : _mm512_setzero_si512();
            transpose16(r);
            if (t == 16) {
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++) store_row(dst + (size_t)(p0 + j) * 16 * es, r[j], 16, es);
            } else {
                for (int j = 0; j < t; j++) store_row(dst + (size_t)(p0 + j) * 16 * es, r[j], 16, es);
            }
        } else {
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                r[j] = j < t ? load_row(src + (size_t)(p0 + j) * 16 * es, 16, es) : _mm512_setzero_si512();
            transpose16(r);
            if (cr == 16) {
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) store_row(dst + ((size_t)i * (size_t)HW + (size_t)p0) * es, r[i], t, es);
            } else {
                for (int i = 0; i < cr; i++) store_row(dst + ((size_t)i * (size_t)HW + (size_t)p0) * es, r[i], t, es);
            }
        }
    }
}

AVX512_TARGET static void block_avx512(const char *src, char *dst, int64_t HW, int cr, size_t es, bool to_blocked) {
    if (es == 2 && to_blocked) block_tiles(src, dst, HW, cr, 2, true);
    if (es == 2 && !to_blocked) block_tiles(src, dst, HW, cr, 2, false);
    if (es == 4 && to_blocked) block_tiles(src, dst, HW, cr, 4, true);
    if (es == 4 && !to_blocked) block_tiles(src, dst, HW, cr, 4, false);
}

static bool have_avx512(void) {
    static _Atomic int have = -1; /* cpuid, asked once */
    if (have < 0)
        have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    return have > 0;
}
#endif

static void block_scalar(const char *src, char *dst, int64_t HW, int cr, size_t es, bool to_blocked) {
    for (int64_t p = 0; p < HW; p++)
        for (int i = 0; i < 16; i++) {
            char *b = (to_blocked ? dst : (char *)src) + ((size_t)p * 16 + (size_t)i) * es;
            if (i >= cr) {
                if (to_blocked) memset(b, 0, es);
                continue;
            }
            char *q = (to_blocked ? (char *)src : dst) + ((size_t)i * (size_t)HW + (size_t)p) * es;
            if (to_blocked)
                memcpy(b, q, es);
            else
                memcpy(q, b, es);
        }
}

static void convert(const void *src, void *dst, int64_t N, int64_t C, int64_t HW, size_t es, bool to_blocked) {
    const int64_t CB = (C + 15) / 16, nb = N * CB;
    bool vec = false;
#ifdef BLOCKED_AVX512
    vec = (es == 2 || es == 4) && have_avx512();
#endif
#pragma omp parallel for schedule(static) if (nb * HW * 16 >= PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t n = b / CB, cb = b % CB;
        const int cr = (int)TS_MIN(16, C - cb * 16);
        const char *plain = (const char *)(to_blocked ? src : dst) + (size_t)((n * C + cb * 16) * HW) * es;
        const char *blk = (const char *)(to_blocked ? dst : src) + (size_t)(b * HW * 16) * es;
        const char *s = to_blocked ? plain : blk;
        char *d = (char *)(to_blocked ? blk : plain);
#ifdef BLOCKED_AVX512
        if (vec) {
            block_avx512(s, d, HW, cr, es, to_blocked);
            continue;
        }
#endif
        block_scalar(s, d, HW, cr, es, to_blocked);
    }
    (void)vec;
}

void ts__cpu_to_blocked16(const void *src, void *dst, int64_t N, int64_t C, int64_t HW, size_t esize) {
    convert(src, dst, N, C, HW, esize, true);
}

void ts__cpu_from_blocked16(const void *src, void *dst, int64_t N, int64_t C, int64_t HW, size_t esize) {
    convert(src, dst, N, C, HW, esize, false);
}
