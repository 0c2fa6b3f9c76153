/*
 * ops/cpu/blocked.c — NCHW <-> nChw16c (see blocked.h).
 *
 * One (image, channel block) is a 16 x HW matrix (channels x positions) on the
 * plain side and its transpose on the blocked side: both directions move 16x16
 * tiles through one register transpose (4 rounds of 16 shuffles on 32-bit
 * lanes; bfloat16 tiles widen to 32 bits on the load and narrow on the store).
 * A tile of the last, partial channel block or of the plane's tail is loaded
 * and stored under masks.
 *
 * Weights: one (output block, input block) pair is a 16 x 16*KK matrix M (rows o, columns i * KK + cd) on the
 * plain side, contiguous rows of the OIhw tensor. KK transposes turn it into M^T, whose row i * KK + cd holds
 * the 16 o's of (i, cd) — the i-th row of the "16I16O" block of cd as it is; two such rows rounded to bfloat16
 * and interleaved are a row of words of "8I16O2I"; a 16x16 transpose of the block's 16 rows gives the "16O16I"
 * and "8O16I2O" ones. The way back (float32 gradients) runs the same steps backwards.
 */
#include "ops/cpu/blocked.h"
#include "core/half.h"
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

static _Atomic bool portable; /* ts__cpu_blocked_portable */

static bool have_avx512(void) { return !portable && ts__cpu_avx512bw(); }
#endif

void ts__cpu_blocked_portable(bool on) {
#ifdef BLOCKED_AVX512
    portable = on;
#else
    (void)on;
#endif
}

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

/* ---- weights ------------------------------------------------------------------------------------ */

static bool wb_bf16(ts_wblock k) { return k == TS_WB_8I16O2I || k == TS_WB_8O16I2O; }

/* Where (o, i) of a 16x16 block sits in it, in elements. */
static size_t wb_inner(ts_wblock k, int o, int i) {
    switch (k) {
    case TS_WB_16I16O: return (size_t)(i * 16 + o);
    case TS_WB_16O16I: return (size_t)(o * 16 + i);
    case TS_WB_8I16O2I: return (size_t)((i / 2) * 32 + o * 2 + i % 2);
    default: return (size_t)((o / 2) * 32 + i * 2 + o % 2);
    }
}

/* One (output block A, input block B) pair, every cd, element by element. */
static void wtile_scalar(const float *w, char *blk0, int64_t I, int64_t KK, int64_t o0, int64_t i0, int orr, int ir,
                         ts_wblock kind, bool to_blocked, float *wout) {
    const size_t es = wb_bf16(kind) ? 2 : 4;
    for (int64_t cd = 0; cd < KK; cd++) {
        char *blk = blk0 + (size_t)cd * 256 * es;
        for (int o = 0; o < 16; o++)
            for (int i = 0; i < 16; i++) {
                const size_t at = wb_inner(kind, o, i), pi = (size_t)(((o0 + o) * I + i0 + i) * KK + cd);
                const bool real = o < orr && i < ir;
                if (!to_blocked) {
                    if (real) wout[pi] = ((const float *)blk)[at];
                } else if (es == 4) {
                    ((float *)blk)[at] = real ? w[pi] : 0.0f;
                } else {
                    ((uint16_t *)blk)[at] = real ? ts__bf16_from_f32(w[pi]) : 0;
                }
            }
    }
}

#ifdef BLOCKED_AVX512
/* float32 bits -> bfloat16 bits in each 32-bit lane's low half (ts__bf16_from_f32: ties to even, NaN quiet) */
AVX512_TARGET static inline __m512i bf16_bits(__m512i x) {
    const __m512i one = _mm512_set1_epi32(1);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_si512(_mm512_srli_epi32(x, 16), one));
    r = _mm512_srli_epi32(r, 16);
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, q);
}

/* 16 words: a's rounded element in the low half, b's in the high half */
AVX512_TARGET static inline __m512i bf16_pairs(__m512i a, __m512i b) {
    return _mm512_or_si512(bf16_bits(a), _mm512_slli_epi32(bf16_bits(b), 16));
}

AVX512_TARGET static void wtile_avx512(const float *w, char *blk0, int64_t I, int64_t KK, int64_t o0, int64_t i0,
                                       int orr, int ir, ts_wblock kind, bool to_blocked, float *wout) {
    __m512i mt[16 * TS_WB_MAX_KK]; /* M^T: row i * KK + cd, lane o */
    __m512i r[16];
    const size_t es = wb_bf16(kind) ? 2 : 4;
    const int64_t cols = ir * KK; /* M's real columns */
    const bool by_o = kind == TS_WB_16O16I || kind == TS_WB_8O16I2O; /* the block's rows run over o */
    if (to_blocked) {
        for (int64_t j = 0; j < KK; j++) {
            const int n = (int)TS_MAX(0, TS_MIN(16, cols - 16 * j));
#pragma GCC unroll 16
            for (int o = 0; o < 16; o++)
                r[o] = o < orr && n > 0 ? load_row((const char *)(w + ((o0 + o) * I + i0) * KK + 16 * j), n, 4)
                                        : _mm512_setzero_si512();
            transpose16(r);
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) mt[16 * j + t] = r[t];
        }
        for (int64_t cd = 0; cd < KK; cd++) {
            char *blk = blk0 + (size_t)cd * 256 * es;
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) r[i] = mt[i * KK + cd];
            if (by_o) transpose16(r); /* r[o]: lane i */
            if (es == 4) {
#pragma GCC unroll 16
                for (int k = 0; k < 16; k++) _mm512_storeu_si512(blk + k * 64, r[k]);
            } else {
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++) _mm512_storeu_si512(blk + k * 64, bf16_pairs(r[2 * k], r[2 * k + 1]));
            }
        }
        return;
    }
    for (int64_t cd = 0; cd < KK; cd++) { /* float32 blocks only */
        const char *blk = blk0 + (size_t)cd * 1024;
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_si512(blk + k * 64);
        if (by_o) transpose16(r);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) mt[i * KK + cd] = r[i];
    }
    for (int64_t j = 0; j < KK; j++) {
        const int n = (int)TS_MAX(0, TS_MIN(16, cols - 16 * j));
        if (n == 0) continue;
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++) r[t] = mt[16 * j + t];
        transpose16(r);
        for (int o = 0; o < orr; o++) store_row((char *)(wout + ((o0 + o) * I + i0) * KK + 16 * j), r[o], n, 4);
    }
}
#endif

static void weights(const float *w, char *blocked, int64_t O, int64_t I, int64_t KK, ts_wblock kind, bool to_blocked,
                    float *wout) {
    const int64_t OB = (O + 15) / 16, IB = (I + 15) / 16;
    const size_t es = wb_bf16(kind) ? 2 : 4;
    bool vec = false;
#ifdef BLOCKED_AVX512
    vec = KK <= TS_WB_MAX_KK && have_avx512();
#endif
#pragma omp parallel for schedule(static) if (OB * IB * KK * 256 >= PAR_MIN)
    for (int64_t t = 0; t < OB * IB; t++) {
        const int64_t A = t / IB, B = t % IB;
        const int orr = (int)TS_MIN(16, O - A * 16), ir = (int)TS_MIN(16, I - B * 16);
        char *blk0 = blocked + (size_t)(t * KK * 256) * es;
#ifdef BLOCKED_AVX512
        if (vec) {
            wtile_avx512(w, blk0, I, KK, A * 16, B * 16, orr, ir, kind, to_blocked, wout);
            continue;
        }
#endif
        wtile_scalar(w, blk0, I, KK, A * 16, B * 16, orr, ir, kind, to_blocked, wout);
    }
    (void)vec;
}

void ts__cpu_weights_to_blocked(const float *w, void *dst, int64_t O, int64_t I, int64_t KK, ts_wblock kind) {
    weights(w, dst, O, I, KK, kind, true, NULL);
}

void ts__cpu_weights_from_blocked(const float *src, float *w, int64_t O, int64_t I, int64_t KK, ts_wblock kind) {
    weights(NULL, (char *)src, O, I, KK, kind, false, w);
}
