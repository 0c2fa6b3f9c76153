/*
 * data/sampler.c — distributed samplers: which sample indices each rank reads.
 *
 * ts_dist_sampler_* reproduces torch.utils.data.DistributedSampler (PyTorch
 * 1.13) index for index, so a Tessera job and a PyTorch job with the same
 * (N, num_replicas, rank, seed, epoch, shuffle, drop_last) read the same
 * samples. That needs two pieces of PyTorch's CPU code, rebuilt here from
 * ATen's MT19937RNGEngine.h and checked against torch.randperm
 * (scripts/gen_sampler_golden.py, tests/golden/sampler.tsg):
 *
 *   - the generator: Generator.manual_seed(s) makes a standard 32-bit
 *     mt19937 seeded init_genrand-style from s & 0xffffffff; random() is its
 *     next tempered 32-bit output.
 *   - randperm_cpu (1.13, every n; no switch at 2^24 or 2^32 / 20):
 *         r = 0..n-1; for i in 0..n-2: z = random() % (n - i); swap(r[i], r[i + z])
 *
 * ts_balanced_sampler_indices is Tessera's own: an equal-count greedy
 * assignment by per-sample cost (see the comment above it).
 *
 * Ownership: every output array is the caller's; nothing is kept between calls
 * except the fields of the caller's ts_dist_sampler.
 */
#include "core/internal.h"
#include "tessera/dist.h"

#include <math.h>

/* ---- PyTorch's CPU generator (at::mt19937) --------------------------------------------------- */
enum { MT_N = 624, MT_M = 397 };

typedef struct mt19937 {
    uint32_t s[MT_N];
    int left, next;
} mt19937;

/* at::mt19937::init_with_uint32: only the low 32 bits of the seed count. */
static void mt_seed(mt19937 *m, uint64_t seed) {
    m->s[0] = (uint32_t)(seed & 0xffffffffu);
    for (uint32_t j = 1; j < MT_N; j++) m->s[j] = 1812433253u * (m->s[j - 1] ^ (m->s[j - 1] >> 30)) + j;
    m->left = 1; /* the first draw regenerates the state */
    m->next = 0;
}

static uint32_t mt_twist(uint32_t u, uint32_t v) {
    return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

static void mt_next_state(mt19937 *m) {
    int j = 0;
    for (; j < MT_N - MT_M; j++) m->s[j] = m->s[j + MT_M] ^ mt_twist(m->s[j], m->s[j + 1]);
    for (; j < MT_N - 1; j++) m->s[j] = m->s[j + MT_M - MT_N] ^ mt_twist(m->s[j], m->s[j + 1]);
    m->s[MT_N - 1] = m->s[MT_M - 1] ^ mt_twist(m->s[MT_N - 1], m->s[0]);
    m->left = MT_N;
    m->next = 0;
}

/* CPUGeneratorImpl::random(): the next tempered 32-bit output. */
static uint32_t mt_random(mt19937 *m) {
    if (--m->left == 0) mt_next_state(m);
    uint32_t y = m->s[m->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* r[0..n) = torch.randperm(n, generator=g) with g.manual_seed(seed) (randperm_cpu, 1.13). */
static void torch_randperm(int64_t *r, int64_t n, uint64_t seed) {
    mt19937 m;
    mt_seed(&m, seed);
    for (int64_t i = 0; i < n; i++) r[i] = i;
    for (int64_t i = 0; i < n - 1; i++) {
        int64_t z = (int64_t)((uint64_t)mt_random(&m) % (uint64_t)(n - i));
        int64_t t = r[i];
        r[i] = r[i + z];
        r[i + z] = t;
    }
}

/* ---- DistributedSampler ---------------------------------------------------------------------- */
static ts_status check_layout(const char *fn, int64_t n, int64_t num_replicas, int64_t rank) {
    TS_ARG(n >= 0, "%s: dataset size %lld must be >= 0", fn, (long long)n);
    TS_ARG(num_replicas >= 1, "%s: num_replicas %lld must be >= 1", fn, (long long)num_replicas);
    TS_ARG(rank >= 0 && rank < num_replicas,
           "%s: invalid rank %lld, rank should be in the interval [0, %lld] (num_replicas %lld)", fn, (long long)rank,
           (long long)(num_replicas - 1), (long long)num_replicas);
    return TS_OK;
}

ts_status ts_dist_sampler_init(ts_dist_sampler *s, int64_t n, int64_t num_replicas, int64_t rank, bool shuffle,
                               uint64_t seed, bool drop_last) {
    TS_ARG(s, "ts_dist_sampler_init: NULL sampler");
    TS_TRY(check_layout("ts_dist_sampler_init", n, num_replicas, rank));
    *s = (ts_dist_sampler){.n = n, .num_replicas = num_replicas, .rank = rank, .shuffle = shuffle,
                           .drop_last = drop_last, .auto_epoch = false, .seed = seed, .epoch = 0};
    return TS_OK;
}

void ts_dist_sampler_set_epoch(ts_dist_sampler *s, int64_t epoch) {
    if (s) s->epoch = epoch;
}

/* torch: drop_last and N % R != 0: ceil((N - R) / R), which is floor(N / R)
 * (0 when N < R); otherwise ceil(N / R). */
int64_t ts_dist_sampler_len(const ts_dist_sampler *s) {
    if (!s || s->num_replicas < 1 || s->n < 0) return 0;
    return s->drop_last ? s->n / s->num_replicas : (s->n + s->num_replicas - 1) / s->num_replicas;
}

/* Rank r's j-th index is list[r + j R] of the padded list; padding repeats the
 * list from its start as often as needed, so position p of it is order[p % N]
 * (drop_last only ever reads p < floor(N / R) R <= N). */
ts_status ts_dist_sampler_indices(ts_dist_sampler *s, int64_t *idx) {
    TS_ARG(s, "ts_dist_sampler_indices: NULL sampler");
    TS_TRY(check_layout("ts_dist_sampler_indices", s->n, s->num_replicas, s->rank));
    int64_t len = ts_dist_sampler_len(s), n = s->n, R = s->num_replicas;
    TS_ARG(idx || len == 0, "ts_dist_sampler_indices: NULL idx");
    if (len > 0) {
        if (s->shuffle) {
            int64_t *perm = ts__malloc(sizeof(int64_t) * (size_t)n);
            if (!perm) return TS_ERR_NOMEM;
            torch_randperm(perm, n, s->seed + (uint64_t)s->epoch); /* Python int addition; only 32 bits matter */
            for (int64_t j = 0; j < len; j++) idx[j] = perm[(s->rank + j * R) % n];
            free(perm);
        } else {
            for (int64_t j = 0; j < len; j++) idx[j] = (s->rank + j * R) % n;
        }
    }
    if (s->auto_epoch) s->epoch++;
    return TS_OK;
}

/* ---- cost-balanced sampler ----------------------------------------------------------------------
 * Every rank gets k = ceil(N / R) samples (N < R, N % R != 0: some are
 * repeats, as in DistributedSampler). Algorithm, run identically on every rank:
 *   1. order = torch.randperm(N) seeded with seed + epoch (identity without
 *      shuffle); sort the samples by cost, largest first, ties in `order`.
 *   2. Extend the sorted list to k R entries with padding: the cheapest samples
 *      again (cheapest first, cycling when N < the number of pads).
 *   3. Take the list in blocks of R; in each block the j-th most expensive entry
 *      goes to the j-th least loaded rank so far (ties: lower rank first).
 *   4. Rank r reads its real samples in `order`, then its padding.
 * Guarantee: max rank cost - min rank cost <= the largest (cost range within
 * one block) <= max cost - min cost <= max single cost. Proof: with loads
 * l_1 <= ... <= l_R (spread D) and block costs a_1 >= ... >= a_R, the new
 * load difference (l_i + a_i) - (l_j + a_j) for i < j lies in
 * [-(l_j - l_i), a_i - a_j], so the new spread is <= max(D, a_1 - a_R).
 */
typedef struct bal_item {
    double cost;
    int64_t key; /* sorting tie-break, unique: position in `order`, then in the extended list */
    int64_t sample;
} bal_item;

/* Dearest first; equal costs by key. */
static int bal_item_cmp(const void *pa, const void *pb) {
    const bal_item *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    return (a->key > b->key) - (a->key < b->key);
}

typedef struct bal_rank {
    double load;
    int64_t rank;
} bal_rank;

static int bal_rank_cmp(const void *pa, const void *pb) {
    const bal_rank *a = pa, *b = pb;
    if (a->load != b->load) return a->load < b->load ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

ts_status ts_balanced_sampler_indices(const double *cost, int64_t n, int64_t num_replicas, int64_t rank,
                                      uint64_t seed, int64_t epoch, bool shuffle, int64_t *idx, int64_t *len) {
    TS_ARG(len, "ts_balanced_sampler_indices: NULL len");
    TS_TRY(check_layout("ts_balanced_sampler_indices", n, num_replicas, rank));
    TS_ARG(cost || n == 0, "ts_balanced_sampler_indices: NULL cost");
    for (int64_t i = 0; i < n; i++)
        TS_ARG(isfinite(cost[i]) && cost[i] >= 0,
               "ts_balanced_sampler_indices: cost[%lld] = %g must be finite and >= 0", (long long)i, cost[i]);
    int64_t R = num_replicas, k = (n + R - 1) / R;
    *len = k;
    if (!idx || k == 0) return TS_OK; /* idx NULL: the caller only asked for the length */

    ts_status st = TS_OK;
    int64_t *order = ts__malloc(sizeof(int64_t) * (size_t)n);
    int64_t *owner = ts__malloc(sizeof(int64_t) * (size_t)n); /* owner[sample] = rank */
    bal_item *items = ts__malloc(sizeof(bal_item) * (size_t)n);
    bal_rank *ranks = ts__malloc(sizeof(bal_rank) * (size_t)R);
    bal_item *block = ts__malloc(sizeof(bal_item) * (size_t)R);
    if (!order || !owner || !items || !ranks || !block) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    if (shuffle)
        torch_randperm(order, n, seed + (uint64_t)epoch);
    else
        for (int64_t i = 0; i < n; i++) order[i] = i;
    for (int64_t p = 0; p < n; p++) items[p] = (bal_item){cost[order[p]], p, order[p]};
    qsort(items, (size_t)n, sizeof *items, bal_item_cmp);
    for (int64_t r = 0; r < R; r++) ranks[r] = (bal_rank){0.0, r};

    int64_t npad = 0; /* this rank's padding, written after its real samples */
    int64_t pads[1];  /* a rank gets at most one pad: they all fall in the last block */
    for (int64_t b = 0; b < k; b++) {
        /* entry e of the extended list: items[e] when e < n, else pad e - n, a copy
         * of items[n - 1 - (e - n) % n]; only the last block holds pads */
        for (int64_t j = 0; j < R; j++) {
            int64_t e = b * R + j;
            block[j] = e < n ? items[e] : items[n - 1 - (e - n) % n];
            block[j].key = e; /* e >= n marks a pad */
        }
        if (b == k - 1) qsort(block, (size_t)R, sizeof *block, bal_item_cmp); /* other blocks are sorted */
        qsort(ranks, (size_t)R, sizeof *ranks, bal_rank_cmp);
        for (int64_t j = 0; j < R; j++) {
            ranks[j].load += block[j].cost;
            if (block[j].key < n)
                owner[block[j].sample] = ranks[j].rank;
            else if (ranks[j].rank == rank)
                pads[npad++] = block[j].sample;
        }
    }
    int64_t m = 0;
    for (int64_t p = 0; p < n; p++)
        if (owner[order[p]] == rank) idx[m++] = order[p];
    for (int64_t j = 0; j < npad; j++) idx[m++] = pads[j];
    /* every rank got exactly one entry of each of the k blocks */
    if (m != k) st = ts_error(TS_ERR_INTERNAL, "ts_balanced_sampler_indices: rank %lld got %lld of %lld samples",
                              (long long)rank, (long long)m, (long long)k);
fail:
    free(order);
    free(owner);
    free(items);
    free(ranks);
    free(block);
    return st;
}
