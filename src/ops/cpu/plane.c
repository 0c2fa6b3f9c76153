/*
 * ops/cpu/plane.c — the plane kernels of plane.h: BatchNorm's and the conv bias
 * gradient's sums, BatchNorm's affine maps, on float32 and bfloat16 planes.
 *
 * Each kernel is written once, over elements loaded as float32 (el: a bfloat16
 * one widened) and stored from float32 (el_set: rounded once to bfloat16); the
 * TS_CLONES wrappers (a copy per ISA, core/internal.h) pass the element type as
 * a constant, so each instance is specialised and vectorised.
 *
 * The sums keep TS_PLANE_LANES = 16 float partial sums in an array: lane j
 * starts at element j and adds elements j + 16, j + 32, ... in order, block by
 * block of 16 (the block loops are elementwise), for a run of at most
 * TS_PLANE_RUN = 16 blocks (256 elements); at the end of each run lane j is
 * added to double lane j (the first run's lanes become the double lanes), so a
 * float lane never adds more than 16 terms and the rounding error does not
 * grow with the plane (a 2^17-element LayerNorm row, a 224x224 plane). The
 * double lanes are totalled by a fixed pairwise tree (lanes_total), and the
 * last n % 16 elements (all of a plane shorter than 16) are added to that total
 * in double, in order. Planes of at most 256 elements (one run) give the bits
 * of plain 16-lane float sums.
 * Every step is a plain float or double operation whose order the source fixes,
 * so the compiler vectorises the block loop (omp simd: two ymm registers per
 * array under AVX2, a zmm or two ymm under AVX-512, four xmm on baseline x86-64)
 * without reassociating anything: float32 and bfloat16 planes, and every ISA's
 * clone, give the same bits. (The `omp simd reduction`
 * loops this replaces let the vectoriser pick the lanes: 8 for float32 and 16 for
 * bfloat16 under AVX2, 16 for both under AVX-512, so BatchNorm's running
 * statistics of a bfloat16 input differed from its float32 widening's on AVX2
 * machines.)
 *
 * This file is compiled with -ffp-contract=off (CMakeLists.txt): GCC's
 * x86-64-v4 clone has FMA and fused b += d * d into one rounding, while its
 * "avx2" clone has no FMA (that target string does not enable it) and rounded
 * twice, so an AVX-512 machine's sums differed from an AVX2 machine's for that
 * reason too. Here every clone rounds the product, then the sum.
 */
#include "ops/cpu/plane.h"
#include "core/half.h"
#include "core/internal.h"

#define L TS_PLANE_LANES
#define PLANE_INLINE static inline __attribute__((always_inline))

PLANE_INLINE float el(const void *p, int64_t i, bool h) {
    return h ? ts__bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
PLANE_INLINE void el_set(void *p, int64_t i, float v, bool h) {
    if (h)
        ((uint16_t *)p)[i] = ts__bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}

/* the double lanes' total, a fixed pairwise tree (lane j + lane j + 8, then j + 4, j + 2, j + 1): four
 * dependent adds instead of sixteen, which short planes (7x7) would wait on */
PLANE_INLINE double lanes_total(const double *s) {
    double t[L / 2];
    for (int j = 0; j < L / 2; j++) t[j] = s[j] + s[j + L / 2];
    for (int j = 0; j < L / 4; j++) t[j] += t[j + L / 4];
    for (int j = 0; j < L / 8; j++) t[j] += t[j + L / 8];
    return t[0] + t[1];
}

/* the end of a run: d[j] = (first ? 0 : d[j]) + s[j] in double */
PLANE_INLINE void fold_run(double *restrict d, const float *restrict s, bool first) {
#pragma omp simd
    for (int j = 0; j < L; j++) d[j] = first ? (double)s[j] : d[j] + (double)s[j];
}

/* the end of the run that starts at r, which ends at the whole blocks' end w = n / 16 * 16 at the latest */
PLANE_INLINE int64_t run_end(int64_t r, int64_t w) {
    return w - r > (int64_t)L * TS_PLANE_RUN ? r + L * TS_PLANE_RUN : w;
}

/* s[j] = (first ? 0 : s[j]) + p[i + j] for the block of L elements at i (first: the lanes start at their
 * first element, so no zeroed array is stored and reloaded) */
PLANE_INLINE void sum_block(float *restrict s, const void *restrict p, int64_t i, bool first, bool h) {
#pragma omp simd
    for (int j = 0; j < L; j++) s[j] = first ? el(p, i + j, h) : s[j] + el(p, i + j, h);
}

PLANE_INLINE double plane_sum_t(const void *p, int64_t n, bool h) {
    double t = 0.0;
    if (n >= L) {
        float s[L];
        double d[L];
        for (int64_t r = 0, w = n / L * L; r < w; r += L * TS_PLANE_RUN) {
            sum_block(s, p, r, true, h);
            for (int64_t i = r + L, e = run_end(r, w); i < e; i += L) sum_block(s, p, i, false, h);
            fold_run(d, s, r == 0);
        }
        t = lanes_total(d);
    }
    for (int64_t i = n / L * L; i < n; i++) t += (double)el(p, i, h); /* the last n % 16 */
    return t;
}

/* a[j] += d, b[j] += d * d with d = p[i + j] - m, for the block at i (first: a[j] = d, b[j] = d * d) */
PLANE_INLINE void shifted_block(float *restrict a, float *restrict b, const void *restrict p, int64_t i, float m,
                                bool first, bool h) {
#pragma omp simd
    for (int j = 0; j < L; j++) {
        const float d = el(p, i + j, h) - m;
        a[j] = first ? d : a[j] + d;
        b[j] = first ? d * d : b[j] + d * d;
    }
}

PLANE_INLINE void plane_shifted_sums_t(const void *p, int64_t n, float m, double *s1, double *s2, bool h) {
    double t1 = 0.0, t2 = 0.0;
    if (n >= L) {
        float a[L], b[L];
        double da[L], db[L];
        for (int64_t r = 0, w = n / L * L; r < w; r += L * TS_PLANE_RUN) {
            shifted_block(a, b, p, r, m, true, h);
            for (int64_t i = r + L, e = run_end(r, w); i < e; i += L) shifted_block(a, b, p, i, m, false, h);
            fold_run(da, a, r == 0);
            fold_run(db, b, r == 0);
        }
        t1 = lanes_total(da);
        t2 = lanes_total(db);
    }
    for (int64_t i = n / L * L; i < n; i++) {
        const float d = el(p, i, h) - m;
        t1 += (double)d;
        t2 += (double)(d * d);
    }
    *s1 += t1;
    *s2 += t2;
}

/* a[j] += g, b[j] += g * (x - m) at i + j, for the block at i (first: a[j] = g, b[j] = g * (x - m)) */
PLANE_INLINE void dot_dev_block(float *restrict a, float *restrict b, const void *restrict g, const void *restrict x,
                                int64_t i, float m, bool first, bool h) {
#pragma omp simd
    for (int j = 0; j < L; j++) {
        const float gj = el(g, i + j, h), p = gj * (el(x, i + j, h) - m);
        a[j] = first ? gj : a[j] + gj;
        b[j] = first ? p : b[j] + p;
    }
}

PLANE_INLINE void plane_dot_dev_t(const void *g, const void *x, int64_t n, float m, double *sg, double *sgx, bool h) {
    double t1 = 0.0, t2 = 0.0;
    if (n >= L) {
        float a[L], b[L];
        double da[L], db[L];
        for (int64_t r = 0, w = n / L * L; r < w; r += L * TS_PLANE_RUN) {
            dot_dev_block(a, b, g, x, r, m, true, h);
            for (int64_t i = r + L, e = run_end(r, w); i < e; i += L) dot_dev_block(a, b, g, x, i, m, false, h);
            fold_run(da, a, r == 0);
            fold_run(db, b, r == 0);
        }
        t1 = lanes_total(da);
        t2 = lanes_total(db);
    }
    for (int64_t i = n / L * L; i < n; i++) {
        const float gi = el(g, i, h);
        t1 += (double)gi;
        t2 += (double)(gi * (el(x, i, h) - m));
    }
    *sg += t1;
    *sgx += t2;
}

/* centred on m: x - m is exact when x is within a factor 2 of m, so nothing cancels when |m| >> the spread of
 * x (x b + (k - m b) would round x b, as large as |m / std| times the result, then cancel it) */
PLANE_INLINE void plane_axpbyc_t(void *o, const void *g, const void *x, int64_t n, float a, float b, float m, float k,
                                 bool h) {
    for (int64_t i = 0; i < n; i++) el_set(o, i, a * el(g, i, h) + b * (el(x, i, h) - m) + k, h);
}

PLANE_INLINE void plane_affine_t(void *o, const void *x, int64_t n, float m, float s, float t, bool h) {
    for (int64_t i = 0; i < n; i++) el_set(o, i, (el(x, i, h) - m) * s + t, h);
}

TS_CLONES static double plane_sum(const float *p, int64_t n) { return plane_sum_t(p, n, false); }
TS_CLONES static double plane_sum16(const uint16_t *p, int64_t n) { return plane_sum_t(p, n, true); }
TS_CLONES static void plane_shifted_sums(const float *p, int64_t n, float m, double *s1, double *s2) {
    plane_shifted_sums_t(p, n, m, s1, s2, false);
}
TS_CLONES static void plane_shifted_sums16(const uint16_t *p, int64_t n, float m, double *s1, double *s2) {
    plane_shifted_sums_t(p, n, m, s1, s2, true);
}
TS_CLONES static void plane_dot_dev(const float *g, const float *x, int64_t n, float m, double *sg, double *sgx) {
    plane_dot_dev_t(g, x, n, m, sg, sgx, false);
}
TS_CLONES static void plane_dot_dev16(const uint16_t *g, const uint16_t *x, int64_t n, float m, double *sg,
                                      double *sgx) {
    plane_dot_dev_t(g, x, n, m, sg, sgx, true);
}
TS_CLONES static void plane_axpbyc(float *o, const float *g, const float *x, int64_t n, float a, float b, float m,
                                   float k) {
    plane_axpbyc_t(o, g, x, n, a, b, m, k, false);
}
TS_CLONES static void plane_axpbyc16(uint16_t *o, const uint16_t *g, const uint16_t *x, int64_t n, float a, float b,
                                     float m, float k) {
    plane_axpbyc_t(o, g, x, n, a, b, m, k, true);
}
TS_CLONES static void plane_affine(float *o, const float *x, int64_t n, float m, float s, float t) {
    plane_affine_t(o, x, n, m, s, t, false);
}
TS_CLONES static void plane_affine16(uint16_t *o, const uint16_t *x, int64_t n, float m, float s, float t) {
    plane_affine_t(o, x, n, m, s, t, true);
}

double ts__cpu_plane_sum(const void *p, int64_t n, bool bf16) { return bf16 ? plane_sum16(p, n) : plane_sum(p, n); }

void ts__cpu_plane_shifted_sums(const void *p, int64_t n, float m, bool bf16, double *s1, double *s2) {
    if (bf16)
        plane_shifted_sums16(p, n, m, s1, s2);
    else
        plane_shifted_sums(p, n, m, s1, s2);
}

void ts__cpu_plane_dot_dev(const void *g, const void *x, int64_t n, float m, bool bf16, double *sg, double *sgx) {
    if (bf16)
        plane_dot_dev16(g, x, n, m, sg, sgx);
    else
        plane_dot_dev(g, x, n, m, sg, sgx);
}

void ts__cpu_plane_axpbyc(void *o, const void *g, const void *x, int64_t n, float a, float b, float m, float k,
                          bool bf16) {
    if (bf16)
        plane_axpbyc16(o, g, x, n, a, b, m, k);
    else
        plane_axpbyc(o, g, x, n, a, b, m, k);
}

void ts__cpu_plane_affine(void *o, const void *x, int64_t n, float m, float s, float t, bool bf16) {
    if (bf16)
        plane_affine16(o, x, n, m, s, t);
    else
        plane_affine(o, x, n, m, s, t);
}
