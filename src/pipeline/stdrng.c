/*
 * pipeline/stdrng.c — the C++ standard library's random streams that DALI's
 * reader draws from, ported to C so the reader's order equals DALI's.
 *
 * DALI (dali/operators/reader/loader/loader.h, file_label_loader.h) uses
 *   - std::default_random_engine e_(std::seed_seq({seed})) and
 *     std::uniform_int_distribution<>(0, k - 1)(e_) to pick from the
 *     shuffling buffer; libstdc++'s default_random_engine is minstd_rand0;
 *   - std::shuffle(list, std::mt19937(524287)) for random_shuffle's global
 *     pre-shuffle;
 *   - std::shuffle(list, std::mt19937_64((epoch << 32) + shuffle_after_epoch_seed))
 *     for shuffle_after_epoch (DALI 2.4; the seed defaults to 524287).
 * The algorithms below follow GCC 12's libstdc++ (bits/random.tcc,
 * bits/uniform_int_dist.h, bits/stl_algo.h) step for step; tests/test_pipeline.c
 * compares the reader with streams DALI itself produced
 * (scripts/gen_dali_golden.py -> tests/golden/dali_reader.txt).
 */
#include "pipeline/pipeline_internal.h"

/* ---- std::mt19937 ---------------------------------------------------------------------------- */
void ts__mt19937_seed(ts__mt19937 *g, uint32_t seed) {
    g->mt[0] = seed;
    for (int i = 1; i < 624; i++) g->mt[i] = 1812433253u * (g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) + (uint32_t)i;
    g->i = 624;
}

uint32_t ts__mt19937_next(ts__mt19937 *g) {
    if (g->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (g->mt[k] & 0x80000000u) | (g->mt[(k + 1) % 624] & 0x7fffffffu);
            g->mt[k] = g->mt[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        g->i = 0;
    }
    uint32_t y = g->mt[g->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* uniform_int_distribution<unsigned long>{0, range - 1}(mt19937): the generator's range is exactly
 * 32 bits, so libstdc++ takes Lemire's nearly divisionless path (_S_nd<uint64_t>). */
static uint64_t mt_below(ts__mt19937 *g, uint64_t range) {
    uint32_t r32 = (uint32_t)range; /* libstdc++ narrows to __UINT32_TYPE__ here */
    uint64_t product = (uint64_t)ts__mt19937_next(g) * r32;
    uint32_t low = (uint32_t)product;
    if (low < r32) {
        uint32_t threshold = (uint32_t)(-r32) % r32;
        while (low < threshold) {
            product = (uint64_t)ts__mt19937_next(g) * r32;
            low = (uint32_t)product;
        }
    }
    return product >> 32;
}

static void swap_i64(int64_t *a, int64_t i, int64_t j) {
    int64_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

void ts__std_shuffle_i64(int64_t *a, int64_t n, ts__mt19937 *g) {
    if (n <= 0) return;
    const uint64_t urngrange = 0xffffffffu, urange = (uint64_t)n;
    if (urngrange / urange >= urange) {
        int64_t i = 1;
        if (urange % 2 == 0) swap_i64(a, i++, (int64_t)mt_below(g, 2));
        while (i != n) {
            uint64_t swap_range = (uint64_t)i + 1, b1 = swap_range + 1;
            uint64_t x = mt_below(g, swap_range * b1); /* __gen_two_uniform_ints */
            swap_i64(a, i++, (int64_t)(x / b1));
            swap_i64(a, i++, (int64_t)(x % b1));
        }
        return;
    }
    for (int64_t i = 1; i != n; i++) swap_i64(a, i, (int64_t)mt_below(g, (uint64_t)i + 1));
}

/* ---- std::mt19937_64 ------------------------------------------------------------------------- */
void ts__mt19937_64_seed(ts__mt19937_64 *g, uint64_t seed) {
    g->mt[0] = seed;
    for (int i = 1; i < 312; i++)
        g->mt[i] = 6364136223846793005ull * (g->mt[i - 1] ^ (g->mt[i - 1] >> 62)) + (uint64_t)i;
    g->i = 312;
}

uint64_t ts__mt19937_64_next(ts__mt19937_64 *g) {
    if (g->i >= 312) {
        const uint64_t upper = ~0ull << 31, lower = ~upper;
        for (int k = 0; k < 312; k++) {
            uint64_t y = (g->mt[k] & upper) | (g->mt[(k + 1) % 312] & lower);
            g->mt[k] = g->mt[(k + 156) % 312] ^ (y >> 1) ^ ((y & 1u) ? 0xb5026f5aa96619e9ull : 0u);
        }
        g->i = 0;
    }
    uint64_t y = g->mt[g->i++];
    y ^= (y >> 29) & 0x5555555555555555ull;
    y ^= (y << 17) & 0x71d67fffeda60000ull;
    y ^= (y << 37) & 0xfff7eee000000000ull;
    y ^= y >> 43;
    return y;
}

/* a * b as 128 bits (hi, lo), without relying on __int128. */
static void mul_64x64(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo) {
    uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;
    *lo = (mid << 32) | (uint32_t)p00;
    *hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

/* uniform_int_distribution<unsigned long>{0, range - 1}(mt19937_64): the generator's range is exactly
 * 64 bits, so libstdc++ takes Lemire's method on unsigned __int128 (_S_nd<unsigned __int128>). */
static uint64_t mt64_below(ts__mt19937_64 *g, uint64_t range) {
    uint64_t hi, low;
    mul_64x64(ts__mt19937_64_next(g), range, &hi, &low);
    if (low < range) {
        uint64_t threshold = (0 - range) % range;
        while (low < threshold) mul_64x64(ts__mt19937_64_next(g), range, &hi, &low);
    }
    return hi;
}

void ts__std_shuffle64_i64(int64_t *a, int64_t n, ts__mt19937_64 *g) {
    if (n <= 0) return;
    const uint64_t urngrange = ~0ull, urange = (uint64_t)n;
    if (urngrange / urange >= urange) {
        int64_t i = 1;
        if (urange % 2 == 0) swap_i64(a, i++, (int64_t)mt64_below(g, 2));
        while (i != n) {
            uint64_t swap_range = (uint64_t)i + 1, b1 = swap_range + 1;
            uint64_t x = mt64_below(g, swap_range * b1); /* __gen_two_uniform_ints */
            swap_i64(a, i++, (int64_t)(x / b1));
            swap_i64(a, i++, (int64_t)(x % b1));
        }
        return;
    }
    for (int64_t i = 1; i != n; i++) swap_i64(a, i, (int64_t)mt64_below(g, (uint64_t)i + 1));
}

/* ---- std::minstd_rand0 through std::seed_seq --------------------------------------------------- */
#define MINSTD_M 2147483647u

void ts__minstd_seed_seq(ts__minstd *g, int64_t seed) {
    /* seed_seq({seed}) keeps seed mod 2^32; minstd_rand0::seed(seq) asks for k + 3 = 4 words
     * (k = (floor(log2(m)) + 31) / 32 = 1) and uses word 3. */
    const uint32_t v0 = (uint32_t)(uint64_t)seed;
    uint32_t b[4];
    const size_t n = 4, s = 1, t = (n - 1) / 2, p = (n - t) / 2, q = p + t, m = s + 1 > n ? s + 1 : n;
    for (size_t i = 0; i < n; i++) b[i] = 0x8b8b8b8bu;
    {
        uint32_t r1 = 1371501266u, r2 = r1 + (uint32_t)s;
        b[p] += r1;
        b[q] += r2;
        b[0] = r2;
    }
    for (size_t k = 1; k <= s; k++) {
        size_t kn = k % n, kpn = (k + p) % n, kqn = (k + q) % n;
        uint32_t arg = b[kn] ^ b[kpn] ^ b[(k - 1) % n];
        uint32_t r1 = 1664525u * (arg ^ (arg >> 27));
        uint32_t r2 = r1 + (uint32_t)kn + v0;
        b[kpn] += r1;
        b[kqn] += r2;
        b[kn] = r2;
    }
    for (size_t k = s + 1; k < m; k++) {
        size_t kn = k % n, kpn = (k + p) % n, kqn = (k + q) % n;
        uint32_t arg = b[kn] ^ b[kpn] ^ b[(k - 1) % n];
        uint32_t r1 = 1664525u * (arg ^ (arg >> 27));
        uint32_t r2 = r1 + (uint32_t)kn;
        b[kpn] += r1;
        b[kqn] += r2;
        b[kn] = r2;
    }
    for (size_t k = m; k < m + n; k++) {
        size_t kn = k % n, kpn = (k + p) % n, kqn = (k + q) % n;
        uint32_t arg = b[kn] + b[kpn] + b[(k - 1) % n];
        uint32_t r3 = 1566083941u * (arg ^ (arg >> 27));
        uint32_t r4 = r3 - (uint32_t)kn;
        b[kpn] ^= r3;
        b[kqn] ^= r4;
        b[kn] = r4;
    }
    uint64_t x = (uint64_t)b[3] % MINSTD_M;
    g->x = x == 0 ? 1 : x; /* c == 0: the state may not be 0 */
}

static uint64_t minstd_next(ts__minstd *g) {
    g->x = (g->x * 16807u) % MINSTD_M;
    return g->x;
}

int ts__minstd_uniform_int(ts__minstd *g, int lo, int hi) {
    /* __uctype = unsigned long; the generator's range (2^31 - 3) is neither 2^32 - 1 nor 2^64 - 1,
     * so libstdc++ scales down with two divisions and rejection. */
    const uint64_t urngmin = 1, urngrange = (MINSTD_M - 1) - urngmin;
    const uint64_t urange = (uint64_t)(unsigned)hi - (uint64_t)(unsigned)lo;
    const uint64_t uerange = urange + 1, scaling = urngrange / uerange, past = uerange * scaling;
    uint64_t ret;
    do ret = minstd_next(g) - urngmin;
    while (ret >= past);
    return (int)(ret / scaling) + lo;
}
