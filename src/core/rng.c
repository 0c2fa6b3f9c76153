/*
 * core/rng.c — PCG-XSL-RR 128/64 (O'Neill 2014): small state, good statistics,
 * and a state that can be saved in a checkpoint and restored bit for bit.
 */
#include "core/internal.h"

#include <math.h>

/* 128-bit multiplier 2549297995355413924 * 2^64 + 4865540595714422341 */
#define PCG_MUL_HI 2549297995355413924ULL
#define PCG_MUL_LO 4865540595714422341ULL

static void pcg_step(ts_rng *r) {
    unsigned __int128 s = ((unsigned __int128)r->state_hi << 64) | r->state_lo;
    unsigned __int128 m = ((unsigned __int128)PCG_MUL_HI << 64) | PCG_MUL_LO;
    unsigned __int128 inc = ((unsigned __int128)r->inc_hi << 64) | r->inc_lo;
    s = s * m + inc;
    r->state_hi = (uint64_t)(s >> 64);
    r->state_lo = (uint64_t)s;
}

void ts_rng_seed(ts_rng *r, uint64_t seed) {
    /* splitmix64 spreads small seeds over the whole state */
    uint64_t z = seed;
    uint64_t w[4];
    for (int i = 0; i < 4; i++) {
        z += 0x9e3779b97f4a7c15ULL;
        uint64_t x = z;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        w[i] = x ^ (x >> 31);
    }
    r->state_hi = 0;
    r->state_lo = 0;
    r->inc_hi = w[2];
    r->inc_lo = w[3] | 1u;
    pcg_step(r);
    r->state_hi += w[0];
    r->state_lo += w[1];
    pcg_step(r);
    r->has_spare = 0;
    r->spare_normal = 0;
}

uint64_t ts_rng_u64(ts_rng *r) {
    pcg_step(r);
    uint64_t x = r->state_hi ^ r->state_lo;
    unsigned rot = (unsigned)(r->state_hi >> 58);
    return (x >> rot) | (x << ((-rot) & 63));
}

uint32_t ts_rng_u32(ts_rng *r) { return (uint32_t)(ts_rng_u64(r) >> 32); }

double ts_rng_uniform(ts_rng *r) { return (double)(ts_rng_u64(r) >> 11) * 0x1.0p-53; }

uint64_t ts_rng_below(ts_rng *r, uint64_t n) {
    if (n <= 1) return 0;
    /* Lemire's nearly-divisionless method, rejection for exact uniformity */
    uint64_t x = ts_rng_u64(r);
    unsigned __int128 m = (unsigned __int128)x * n;
    uint64_t l = (uint64_t)m;
    if (l < n) {
        uint64_t t = (0 - n) % n;
        while (l < t) {
            x = ts_rng_u64(r);
            m = (unsigned __int128)x * n;
            l = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double ts_rng_normal(ts_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare_normal;
    }
    double u1, u2;
    do u1 = ts_rng_uniform(r);
    while (u1 <= 0.0);
    u2 = ts_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    r->spare_normal = rad * sin(2.0 * M_PI * u2);
    r->has_spare = 1;
    return rad * cos(2.0 * M_PI * u2);
}

void ts_rng_shuffle_i64(ts_rng *r, int64_t *idx, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)ts_rng_below(r, (uint64_t)i + 1);
        int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

static _Thread_local ts_rng ts_default_rng;
static _Thread_local int ts_default_rng_init;

ts_rng *ts_rng_default(void) {
    if (!ts_default_rng_init) {
        ts_rng_seed(&ts_default_rng, 0x7e55e7a);
        ts_default_rng_init = 1;
    }
    return &ts_default_rng;
}

void ts_manual_seed(uint64_t seed) {
    ts_rng_seed(&ts_default_rng, seed);
    ts_default_rng_init = 1;
}

/* Dropout's keep mask (1 with probability 1 - p), drawn the same way by every backend: two 32-bit halves
 * per ts_rng_u64, in element order; keep iff the half >= p * 2^32. */
void ts__rng_keep_mask(ts_rng *r, uint8_t *m, int64_t n, float p) {
    double t = (double)p * 4294967296.0;
    uint64_t thr = t >= 4294967296.0 ? (uint64_t)1 << 32 : (uint64_t)t;
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t u = ts_rng_u64(r);
        m[i] = (u & 0xffffffffu) >= thr;
        m[i + 1] = (u >> 32) >= thr;
    }
    if (i < n) m[i] = (ts_rng_u64(r) & 0xffffffffu) >= thr;
}
