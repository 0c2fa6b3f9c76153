/*
 * tests/test_sampler.c — distributed samplers (src/data/sampler.c) and the
 * loader's caller-given index lists (ts_loader_set_indices).
 *
 * The golden cases are PyTorch 1.13's DistributedSampler index lists and raw
 * torch.randperm outputs, written by scripts/gen_sampler_golden.py into
 * tests/golden/sampler.tsg; every one must match exactly.
 */
#include "golden_io.h"
#include "test_util.h"
#include "tessera/dist.h"

#define GOLDEN TS_TEST_DIR "/golden/sampler.tsg"
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static ts_tensor_list golden;
static bool golden_loaded;

static const ts_tensor_list *load_golden(void) {
    if (!golden_loaded) {
        CHECK_OK(tg_load(GOLDEN, &golden));
        golden_loaded = true;
    }
    return &golden;
}

/* All of rank r's indices for (n, R, shuffle, seed, drop_last, epoch); *len gets their count. */
static int64_t *rank_indices(int64_t n, int64_t R, int64_t r, bool shuffle, uint64_t seed, bool drop, int64_t epoch,
                             int64_t *len) {
    ts_dist_sampler s;
    CHECK_OK(ts_dist_sampler_init(&s, n, R, r, shuffle, seed, drop));
    ts_dist_sampler_set_epoch(&s, epoch);
    *len = ts_dist_sampler_len(&s);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(*len + 1));
    CHECK_OK(ts_dist_sampler_indices(&s, idx));
    return idx;
}

/* ---- PyTorch golden values ----------------------------------------------------------------------- */
static void test_golden_distributed_sampler(void) {
    const ts_tensor_list *g = load_golden();
    ts_tensor *cases = tg_get(g, "cases"), *data = tg_get(g, "data");
    CHECK(cases && data);
    if (!cases || !data) return;
    CHECK(ts_tensor_ndim(cases) == 2 && ts_tensor_shape(cases)[1] == 7);
    int64_t K = ts_tensor_shape(cases)[0], off = 0, bad = 0, total = 0;
    CHECK(K > 1000);
    for (int64_t k = 0; k < K; k++) {
        int64_t n = tg_int(cases, 7 * k), R = tg_int(cases, 7 * k + 1), seed = tg_int(cases, 7 * k + 2);
        int64_t epoch = tg_int(cases, 7 * k + 3), ns = tg_int(cases, 7 * k + 6);
        bool shuffle = tg_int(cases, 7 * k + 4) != 0, drop = tg_int(cases, 7 * k + 5) != 0;
        for (int64_t r = 0; r < R; r++) {
            int64_t len = 0;
            int64_t *idx = rank_indices(n, R, r, shuffle, (uint64_t)seed, drop, epoch, &len);
            bool ok = len == ns;
            for (int64_t j = 0; ok && j < ns; j++) ok = idx[j] == tg_int(data, off + r * ns + j);
            if (!ok && bad++ < 5)
                fprintf(stderr,
                        "case %lld (N %lld, R %lld, rank %lld, seed %lld, epoch %lld, shuffle %d, drop_last %d): "
                        "len %lld (torch %lld) or indices differ\n",
                        (long long)k, (long long)n, (long long)R, (long long)r, (long long)seed, (long long)epoch,
                        shuffle, drop, (long long)len, (long long)ns);
            total++;
            free(idx);
        }
        off += R * ns;
    }
    CHECK(bad == 0);
    CHECK(off == ts_tensor_numel(data)); /* the table and the data agree */
    fprintf(stderr, "  %lld sampler cases, %lld rank lists, %lld indices compared\n", (long long)K, (long long)total,
            (long long)off);
}

/* Raw torch.randperm(n) with manual_seed(seed): the sampler with one replica, shuffle, epoch 0. */
static void test_golden_randperm(void) {
    const ts_tensor_list *g = load_golden();
    ts_tensor *perm = tg_get(g, "perm");
    CHECK(perm != NULL);
    if (!perm) return;
    for (int64_t p = 0; p < ts_tensor_shape(perm)[0]; p++) {
        int64_t n = tg_int(perm, 3 * p), seed = tg_int(perm, 3 * p + 1), stride = tg_int(perm, 3 * p + 2);
        ts_tensor *head = tg_getf(g, "perm%lld/head", (long long)p), *tail = tg_getf(g, "perm%lld/tail", (long long)p);
        ts_tensor *every = tg_getf(g, "perm%lld/every", (long long)p);
        ts_tensor *hash = tg_getf(g, "perm%lld/hash", (long long)p);
        CHECK(head && tail && every && hash);
        if (!head || !tail || !every || !hash) continue;
        int64_t len = 0;
        int64_t *r = rank_indices(n, 1, 0, true, (uint64_t)seed, false, 0, &len);
        CHECK(len == n);
        int64_t nh = ts_tensor_numel(head), nt = ts_tensor_numel(tail), ne = ts_tensor_numel(every), bad = 0;
        for (int64_t i = 0; i < nh; i++) bad += r[i] != tg_int(head, i);
        for (int64_t i = 0; i < nt; i++) bad += r[n - nt + i] != tg_int(tail, i);
        for (int64_t i = 0; i < ne; i++) bad += r[i * stride] != tg_int(every, i);
        uint64_t h = 0;
        for (int64_t i = 0; i < n; i++) h += tg_splitmix64((uint64_t)r[i] + ((uint64_t)i << 32));
        if (bad || h != (uint64_t)tg_int(hash, 0))
            fprintf(stderr, "randperm(%lld) seed %lld: %lld sampled entries differ, hash %llu vs torch %llu\n",
                    (long long)n, (long long)seed, (long long)bad, (unsigned long long)h,
                    (unsigned long long)tg_int(hash, 0));
        CHECK(bad == 0);
        CHECK(h == (uint64_t)tg_int(hash, 0));
        free(r);
    }
}

/* ---- properties ------------------------------------------------------------------------------------ */
static void test_coverage_and_lengths(void) {
    static const int64_t ns[] = {0, 1, 2, 3, 5, 7, 8, 10, 31, 64, 99, 1000, 1001};
    for (size_t a = 0; a < NELEM(ns); a++)
        for (int64_t R = 1; R <= 9; R++)
            for (int drop = 0; drop < 2; drop++)
                for (int shuffle = 0; shuffle < 2; shuffle++) {
                    int64_t n = ns[a], want = drop ? n / R : (n + R - 1) / R;
                    int *seen = calloc((size_t)n + 1, sizeof(int));
                    int64_t total = 0;
                    for (int64_t r = 0; r < R; r++) {
                        int64_t len = 0;
                        int64_t *idx = rank_indices(n, R, r, shuffle, 7, drop, 2, &len);
                        CHECK(len == want);
                        for (int64_t j = 0; j < len; j++) {
                            CHECK(idx[j] >= 0 && idx[j] < n);
                            if (idx[j] >= 0 && idx[j] < n) seen[idx[j]]++;
                        }
                        total += len;
                        free(idx);
                    }
                    CHECK(total == want * R);
                    int64_t covered = 0, dups = 0;
                    for (int64_t i = 0; i < n; i++) {
                        covered += seen[i] > 0;
                        dups += seen[i] > 1 ? seen[i] - 1 : 0;
                    }
                    if (drop) {
                        CHECK(dups == 0); /* drop_last: distinct indices, total floor(N / R) R */
                        CHECK(covered == want * R);
                    } else {
                        CHECK(covered == n); /* every index is read by some rank */
                        CHECK(dups == want * R - n);
                    }
                    free(seen);
                }
}

static bool same(const int64_t *a, const int64_t *b, int64_t n) {
    return n == 0 || memcmp(a, b, sizeof *a * (size_t)n) == 0;
}

static void test_epochs(void) {
    int64_t la = 0, lb = 0, lc = 0;
    int64_t *a = rank_indices(1000, 4, 1, true, 42, false, 0, &la);
    int64_t *b = rank_indices(1000, 4, 1, true, 42, false, 1, &lb);
    int64_t *c = rank_indices(1000, 4, 1, true, 42, false, 0, &lc);
    CHECK(la == 250 && lb == 250 && lc == 250);
    CHECK(!same(a, b, la)); /* set_epoch changes the order */
    CHECK(same(a, c, la));  /* and the same epoch gives the same order */
    /* seed + epoch is what seeds the generator (torch): seed 43 epoch 0 == seed 42 epoch 1 */
    int64_t ld = 0;
    int64_t *d = rank_indices(1000, 4, 1, true, 43, false, 0, &ld);
    CHECK(same(b, d, lb));
    free(d);
    /* without shuffle the epoch does not matter */
    int64_t lu = 0, lv = 0;
    int64_t *u = rank_indices(10, 3, 2, false, 42, false, 0, &lu);
    int64_t *v = rank_indices(10, 3, 2, false, 42, false, 5, &lv);
    CHECK(lu == 4 && same(u, v, lu));
    CHECK(u[0] == 2 && u[1] == 5 && u[2] == 8 && u[3] == 1); /* 2, 5, 8, then padding index 10 -> 0 + 1 */
    free(u);
    free(v);

    /* auto_epoch: each call uses the current epoch, then advances it */
    ts_dist_sampler s;
    CHECK_OK(ts_dist_sampler_init(&s, 1000, 4, 1, true, 42, false));
    CHECK(s.epoch == 0 && !s.auto_epoch);
    s.auto_epoch = true;
    int64_t x[250];
    CHECK_OK(ts_dist_sampler_indices(&s, x));
    CHECK(s.epoch == 1 && same(x, a, 250));
    CHECK_OK(ts_dist_sampler_indices(&s, x));
    CHECK(s.epoch == 2 && same(x, b, 250));
    ts_dist_sampler_set_epoch(&s, 0);
    CHECK_OK(ts_dist_sampler_indices(&s, x));
    CHECK(s.epoch == 1 && same(x, a, 250));
    /* without auto_epoch the epoch stays */
    s.auto_epoch = false;
    CHECK_OK(ts_dist_sampler_indices(&s, x));
    CHECK(s.epoch == 1 && same(x, b, 250));
    free(a);
    free(b);
    free(c);
}

/* ---- balanced sampler ---------------------------------------------------------------------------- */
typedef struct bal_result {
    int64_t k;
    double spread, max_cost, min_cost;
} bal_result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs every rank, checks equal counts, coverage and determinism, returns the cost spread. */
static bal_result check_balanced(const double *cost, int64_t n, int64_t R, uint64_t seed, int64_t epoch, bool shuffle) {
    bal_result res = {0, 0, 0, INFINITY};
    for (int64_t i = 0; i < n; i++) {
        res.max_cost = fmax(res.max_cost, cost[i]);
        res.min_cost = fmin(res.min_cost, cost[i]);
    }
    if (n == 0) res.min_cost = 0;
    int64_t k = -1;
    CHECK_OK(ts_balanced_sampler_indices(cost, n, R, 0, seed, epoch, shuffle, NULL, &k)); /* length only */
    CHECK(k == (n + R - 1) / R);
    res.k = k;
    int *seen = calloc((size_t)n + 1, sizeof(int));
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(k + 1)), *again = malloc(sizeof(int64_t) * (size_t)(k + 1));
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t r = 0; r < R; r++) {
        int64_t len = -1, len2 = -1;
        CHECK_OK(ts_balanced_sampler_indices(cost, n, R, r, seed, epoch, shuffle, idx, &len));
        CHECK_OK(ts_balanced_sampler_indices(cost, n, R, r, seed, epoch, shuffle, again, &len2));
        CHECK(len == k && len2 == k && same(idx, again, k)); /* equal counts; deterministic */
        double c = 0;
        for (int64_t j = 0; j < len; j++) {
            CHECK(idx[j] >= 0 && idx[j] < n);
            if (idx[j] < 0 || idx[j] >= n) continue;
            seen[idx[j]]++;
            c += cost[idx[j]];
        }
        lo = fmin(lo, c);
        hi = fmax(hi, c);
    }
    int64_t covered = 0, dups = 0, pads = k * R - n;
    for (int64_t i = 0; i < n; i++) {
        covered += seen[i] > 0;
        dups += seen[i] > 1 ? seen[i] - 1 : 0;
    }
    CHECK(covered == n); /* every sample is read */
    CHECK(dups == pads); /* and k R - n entries are padding repeats */
    if (pads > 0 && pads <= n) {
        /* the padding repeats the cheapest samples: none costs more than the pads-th cheapest */
        double *sorted = malloc(sizeof(double) * (size_t)n);
        memcpy(sorted, cost, sizeof(double) * (size_t)n);
        qsort(sorted, (size_t)n, sizeof(double), cmp_double);
        for (int64_t i = 0; i < n; i++)
            if (seen[i] > 1) CHECK(cost[i] <= sorted[pads - 1]);
        free(sorted);
    }
    res.spread = R > 0 && n > 0 ? hi - lo : 0;
    /* the documented guarantee */
    CHECK(res.spread <= res.max_cost - res.min_cost + 1e-9 * (1 + res.max_cost * (double)k));
    CHECK(res.spread <= res.max_cost + 1e-9 * (1 + res.max_cost * (double)k));
    free(seen);
    free(idx);
    free(again);
    return res;
}

static void test_balanced_sampler(void) {
    ts_rng rng;
    ts_rng_seed(&rng, 99);
    static const int64_t ns[] = {0, 1, 2, 5, 7, 8, 33, 100, 257, 1000};
    double *cost = malloc(sizeof(double) * 1000);
    double worst_ratio = 0;
    for (size_t a = 0; a < NELEM(ns); a++)
        for (int64_t R = 1; R <= 8; R++)
            for (int dist = 0; dist < 4; dist++) {
                int64_t n = ns[a];
                for (int64_t i = 0; i < n; i++) {
                    double u = ts_rng_uniform(&rng);
                    cost[i] = dist == 0   ? u                       /* uniform */
                              : dist == 1 ? exp(6 * u)              /* heavy-tailed (sequence lengths) */
                              : dist == 2 ? (double)(1 + i % 3)     /* many ties */
                                          : (i == n / 2 ? 1e4 : u); /* one giant sample */
                }
                bal_result r = check_balanced(cost, n, R, 5, 1, dist != 2);
                if (r.max_cost > 0) worst_ratio = fmax(worst_ratio, r.spread / r.max_cost);
            }
    fprintf(stderr, "  worst (max - min rank cost) / max sample cost: %.3f\n", worst_ratio);

    /* balance is much better than the bound when costs are spread out: 1000 samples, 8 ranks */
    for (int64_t i = 0; i < 1000; i++) cost[i] = exp(4 * ts_rng_uniform(&rng));
    bal_result r = check_balanced(cost, 1000, 8, 3, 0, true);
    CHECK(r.spread < 0.05 * r.max_cost);

    /* shuffle: the epoch changes the lists (ties broken by the permutation); without, it does not */
    for (int64_t i = 0; i < 100; i++) cost[i] = (double)(i % 2);
    int64_t a0[25], a1[25], b0[25], b1[25], len = 0;
    CHECK_OK(ts_balanced_sampler_indices(cost, 100, 4, 2, 7, 0, true, a0, &len));
    CHECK_OK(ts_balanced_sampler_indices(cost, 100, 4, 2, 7, 1, true, a1, &len));
    CHECK(len == 25 && !same(a0, a1, 25));
    CHECK_OK(ts_balanced_sampler_indices(cost, 100, 4, 2, 7, 0, false, b0, &len));
    CHECK_OK(ts_balanced_sampler_indices(cost, 100, 4, 2, 7, 1, false, b1, &len));
    CHECK(same(b0, b1, 25));
    /* zero costs are fine */
    for (int64_t i = 0; i < 10; i++) cost[i] = 0;
    check_balanced(cost, 10, 3, 0, 0, true);
    free(cost);
}

/* ---- loader integration ------------------------------------------------------------------------------ */
/* A dataset of n samples, x[i] = (i, -i), y[i] = i. */
static ts_dataset *counting_dataset(int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)(2 * n));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = -(float)i;
        y[i] = i;
    }
    int64_t xs[2] = {n, 2};
    ts_tensor *tx = tu_tensor(2, xs, x), *ty = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &n, y, &ty));
    ts_dataset *ds = NULL;
    CHECK_OK(ts_dataset_from_tensors(tx, ty, &ds));
    ts_tensor_release(tx);
    ts_tensor_release(ty);
    free(x);
    free(y);
    return ds;
}

/* Drains the loader's epoch and checks it yields exactly want[0..n) in batches of B. */
static void expect_batches(ts_loader *ld, const int64_t *want, int64_t n, int64_t B, bool drop) {
    int64_t got = 0, batches = 0;
    for (;;) {
        ts_tensor *x = NULL, *y = NULL;
        CHECK_OK(ts_loader_next(ld, &x, &y));
        if (!x) break;
        int64_t cnt = ts_tensor_shape(y)[0];
        CHECK(cnt == B || (!drop && cnt == n % B && got + cnt == n));
        const int64_t *yy = ts_tensor_data(y);
        const float *xx = ts_tensor_data_f32(x);
        for (int64_t j = 0; j < cnt && got + j < n; j++) {
            CHECK(yy[j] == want[got + j]);
            CHECK(xx[2 * j] == (float)want[got + j] && xx[2 * j + 1] == -(float)want[got + j]);
        }
        got += cnt;
        batches++;
        if (batches > n + 2) break;
    }
    int64_t nb = drop ? n / B : (n + B - 1) / B;
    CHECK(batches == nb);
    CHECK(got == (drop ? nb * B : n));
}

static void test_loader_set_indices(void) {
    const int64_t N = 103;
    ts_dataset *ds = counting_dataset(N);
    for (int drop = 0; drop < 2; drop++) {
        ts_loader_opts o = TS_LOADER_OPTS_INIT;
        o.batch_size = 8;
        o.drop_last = drop;
        o.seed = 11;
        ts_loader *ld = NULL;
        CHECK_OK(ts_loader_new(ds, &o, &ld));
        if (!ld) continue;
        int64_t own_nb = ts_loader_num_batches(ld);
        /* rank 2 of 3 (35 samples: 4 full batches and a short one of 3) */
        int64_t len = 0;
        int64_t *idx = rank_indices(N, 3, 2, true, 5, false, 4, &len);
        CHECK(len == 35);
        CHECK_OK(ts_loader_set_indices(ld, idx, len, 0));
        CHECK(ts_loader_num_batches(ld) == (drop ? 4 : 5));
        int64_t on = 0;
        const int64_t *ord = ts_loader_order(ld, &on);
        CHECK(on == len && same(ord, idx, len));
        expect_batches(ld, idx, len, 8, drop);
        /* resume at batch 2 */
        CHECK_OK(ts_loader_set_indices(ld, idx, len, 2));
        CHECK(ts_loader_batch_index(ld) == 2);
        expect_batches(ld, idx + 16, len - 16, 8, drop);
        /* the caller's array was copied */
        int64_t *copy = malloc(sizeof(int64_t) * (size_t)len);
        memcpy(copy, idx, sizeof(int64_t) * (size_t)len);
        CHECK_OK(ts_loader_set_indices(ld, idx, len, 0));
        for (int64_t j = 0; j < len; j++) idx[j] = 0;
        expect_batches(ld, copy, len, 8, drop);
        free(copy);
        free(idx);
        /* longer than the dataset (repeats): the order array grows; a different tail size */
        int64_t many = 3 * N + 5;
        int64_t *rep = malloc(sizeof(int64_t) * (size_t)many);
        for (int64_t j = 0; j < many; j++) rep[j] = (j * 37) % N;
        CHECK_OK(ts_loader_set_indices(ld, rep, many, 0));
        expect_batches(ld, rep, many, 8, drop);
        /* exact multiple of the batch size: no tail */
        CHECK_OK(ts_loader_set_indices(ld, rep, 16, 0));
        expect_batches(ld, rep, 16, 8, false);
        /* empty list: an empty epoch */
        CHECK_OK(ts_loader_set_indices(ld, NULL, 0, 0));
        CHECK(ts_loader_num_batches(ld) == 0);
        expect_batches(ld, rep, 0, 8, drop);
        free(rep);
        /* ts_loader_set_epoch returns to the loader's own order */
        CHECK_OK(ts_loader_set_epoch(ld, 3, 0));
        CHECK(ts_loader_num_batches(ld) == own_nb && ts_loader_epoch(ld) == 3);
        ord = ts_loader_order(ld, &on);
        CHECK(on == N);
        int64_t *own = malloc(sizeof(int64_t) * (size_t)N);
        memcpy(own, ord, sizeof(int64_t) * (size_t)N);
        expect_batches(ld, own, N, 8, drop);
        /* that order is the one a fresh loader has at epoch 3 */
        ts_loader *fresh = NULL;
        CHECK_OK(ts_loader_new(ds, &o, &fresh));
        CHECK_OK(ts_loader_set_epoch(fresh, 3, 0));
        CHECK(same(ts_loader_order(fresh, NULL), own, N));
        ts_loader_free(fresh);
        free(own);
        ts_loader_free(ld);
    }
    ts_dataset_free(ds);
}

/* ---- errors -------------------------------------------------------------------------------------------- */
static void test_errors(void) {
    ts_dist_sampler s;
    CHECK_STATUS(ts_dist_sampler_init(&s, 10, 4, 4, true, 0, false), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("invalid rank 4");
    CHECK_ERR_MENTIONS("[0, 3]");
    CHECK_ERR_MENTIONS("num_replicas 4");
    CHECK_STATUS(ts_dist_sampler_init(&s, 10, 4, -1, true, 0, false), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("invalid rank -1");
    CHECK_STATUS(ts_dist_sampler_init(&s, 10, 0, 0, true, 0, false), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("num_replicas 0");
    CHECK_STATUS(ts_dist_sampler_init(&s, -5, 2, 0, true, 0, false), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("-5");
    CHECK_STATUS(ts_dist_sampler_init(NULL, 10, 2, 0, true, 0, false), TS_ERR_INVALID_ARG);
    /* a sampler edited into a bad state after init */
    CHECK_OK(ts_dist_sampler_init(&s, 10, 2, 1, true, 0, false));
    s.rank = 7;
    int64_t idx[16];
    CHECK_STATUS(ts_dist_sampler_indices(&s, idx), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("invalid rank 7");
    CHECK(ts_dist_sampler_len(NULL) == 0);

    double cost[4] = {1, 2, -3, 4};
    int64_t len = 0;
    CHECK_STATUS(ts_balanced_sampler_indices(cost, 4, 2, 0, 0, 0, true, idx, &len), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("cost[2] = -3");
    cost[2] = NAN;
    CHECK_STATUS(ts_balanced_sampler_indices(cost, 4, 2, 0, 0, 0, true, idx, &len), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("cost[2]");
    cost[2] = 3;
    CHECK_STATUS(ts_balanced_sampler_indices(cost, 4, 2, 2, 0, 0, true, idx, &len), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("invalid rank 2");
    CHECK_ERR_MENTIONS("[0, 1]");
    CHECK_STATUS(ts_balanced_sampler_indices(cost, 4, 0, 0, 0, 0, true, idx, &len), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("num_replicas 0");
    CHECK_STATUS(ts_balanced_sampler_indices(cost, 4, 2, 0, 0, 0, true, idx, NULL), TS_ERR_INVALID_ARG);

    ts_dataset *ds = counting_dataset(10);
    ts_loader_opts o = TS_LOADER_OPTS_INIT;
    o.batch_size = 4;
    ts_loader *ld = NULL;
    CHECK_OK(ts_loader_new(ds, &o, &ld));
    int64_t good[3] = {1, 2, 3}, badi[4] = {1, 9, 10, -1};
    CHECK_OK(ts_loader_set_indices(ld, good, 3, 0));
    CHECK_STATUS(ts_loader_set_indices(ld, badi, 4, 0), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("index 10 at position 2");
    CHECK_ERR_MENTIONS("[0, 10)");
    badi[2] = 0;
    CHECK_STATUS(ts_loader_set_indices(ld, badi, 4, 0), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("index -1 at position 3");
    CHECK_STATUS(ts_loader_set_indices(ld, good, 3, 2), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("start batch 2");
    CHECK_ERR_MENTIONS("[0, 1]");
    CHECK_STATUS(ts_loader_set_indices(ld, good, -1, 0), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("-1");
    CHECK_STATUS(ts_loader_set_indices(ld, NULL, 3, 0), TS_ERR_INVALID_ARG);
    /* failures left the loader as it was */
    int64_t on = 0;
    const int64_t *ord = ts_loader_order(ld, &on);
    CHECK(on == 3 && same(ord, good, 3) && ts_loader_num_batches(ld) == 1);
    expect_batches(ld, good, 3, 4, false);
    ts_loader_free(ld);
    ts_dataset_free(ds);
}

static void test_cleanup(void) {
    ts_tensor_list_clear(&golden);
    golden_loaded = false;
}

TU_MAIN(T(test_golden_distributed_sampler), T(test_golden_randperm), T(test_coverage_and_lengths), T(test_epochs),
        T(test_balanced_sampler), T(test_loader_set_indices), T(test_errors), T(test_cleanup))
