/* Distributed data parallel with ranks as threads (one process, an in-memory
 * store): DDP at world size 2 and 4 with per-rank batch B/N matches a single
 * process at batch B after 20 SGD(momentum) steps (MLP and a small CNN
 * without BatchNorm); the initial broadcast makes ranks built from different
 * seeds equal to rank 0 and buffers follow rank 0 at every forward; no_sync
 * accumulates locally and the next synchronised backward averages the sum;
 * bucket assignment in reverse parameter order under small caps; buckets are
 * launched before the last gradient of the pass is ready (overlap); an unused
 * parameter is reported by the next forward.
 *
 * The equivalence runs take TS_TEST_DEVICE (cpu:1 in make test, cuda:0 on a GPU
 * machine): model, batches and DDP's buckets' sources on that device.
 *
 * Rank threads never use CHECK (the counters are not atomic): each records
 * its first error and its results, and the main thread checks them. */
#include "core/internal.h" /* TS_TRY, TS_CHECK_GOTO, TS_ARRAY_LEN */
#include "rank_threads.h"

#define MAX_WORLD 4
#define STEPS 20
#define BATCH 16 /* global batch; divisible by 1, 2 and 4 */

/* ---- ranks as threads (tests/rank_threads.h) ------------------------------------------------ */
typedef struct rank_ctx rank_ctx;
struct rank_ctx {
    TU_RANK_FIELDS(rank_ctx);
    /* results */
    float *values; /* malloc'd by the rank function */
    int64_t nvalues;
    float *grads;
    int64_t ngrads;
    ts_ddp_stats stats;
    int64_t counters[8];
};
TU_RANK_THREADS(rank_ctx, run_ranks)

static void free_ranks(rank_ctx *c, int world) {
    for (int r = 0; r < world; r++) {
        free(c[r].values);
        free(c[r].grads);
    }
}

/* Appends the module just made (*m) to seq when making it succeeded. */
static ts_status push(ts_module *seq, ts_status made, ts_module **m) {
    return made == TS_OK ? ts_nn_sequential_add(seq, NULL, *m) : made;
}

/* ---- models and data ------------------------------------------------------------------------ */
typedef ts_status (*model_fn)(uint64_t seed, ts_module **out);

static ts_status make_mlp(uint64_t seed, ts_module **out) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    return ts_model_mlp(&r, out);
}

/* conv(1,4,3,pad 1) - relu - maxpool 2 - flatten - linear(64, 10) on 1x8x8 inputs. */
static ts_status make_cnn(uint64_t seed, ts_module **out) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *seq = NULL, *m = NULL;
    TS_TRY(ts_nn_sequential_new(&seq));
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.padding[0] = cp.padding[1] = 1;
    ts_pool2d_params pp = {{2, 2}, {0, 0}, {0, 0}, {0, 0}, false, false};
    ts_status st = push(seq, ts_nn_conv2d_new(1, 4, 3, 3, cp, true, &r, &m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_relu_new(&m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_maxpool2d_new(pp, &m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_flatten_new(&m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_linear_new(64, 10, true, &r, &m), &m);
    if (st != TS_OK) {
        ts_module_free(seq);
        return st;
    }
    *out = seq;
    return TS_OK;
}

/* conv(1,2,3,pad 1) - BatchNorm2d(2) - relu - flatten - linear(128, 10) on 1x8x8 inputs. */
static ts_status make_bn_cnn(uint64_t seed, ts_module **out) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *seq = NULL, *m = NULL;
    TS_TRY(ts_nn_sequential_new(&seq));
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.padding[0] = cp.padding[1] = 1;
    ts_status st = push(seq, ts_nn_conv2d_new(1, 2, 3, 3, cp, true, &r, &m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_batchnorm2d_new(2, 1e-5f, 0.1f, true, true, &m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_relu_new(&m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_flatten_new(&m), &m);
    if (st == TS_OK) st = push(seq, ts_nn_linear_new(128, 10, true, &r, &m), &m);
    if (st != TS_OK) {
        ts_module_free(seq);
        return st;
    }
    *out = seq;
    return TS_OK;
}

/* Three Linear(4, 4): parameters of 64 and 16 bytes, for bucket tests. */
static ts_status make_tiny(uint64_t seed, ts_module **out) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *seq = NULL, *m = NULL;
    TS_TRY(ts_nn_sequential_new(&seq));
    ts_status st = TS_OK;
    for (int i = 0; i < 3 && st == TS_OK; i++) {
        st = ts_nn_linear_new(4, 4, true, &r, &m);
        if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    }
    if (st != TS_OK) {
        ts_module_free(seq);
        return st;
    }
    *out = seq;
    return TS_OK;
}

/* Rows [lo, hi) of the global batch of `step`: x (hi-lo, 1, side, side) uniform
 * in [-1, 1) and labels in [0, 10), each row from its own seeded generator, so
 * any split of the batch sees the same samples. */
static ts_status make_batch(uint64_t step, int64_t lo, int64_t hi, int64_t side, ts_tensor **x, ts_tensor **y) {
    int64_t n = hi - lo, xs[4] = {n, 1, side, side};
    TS_TRY(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, xs, x));
    ts_status st = ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &n, y);
    if (st != TS_OK) {
        ts_tensor_release(*x);
        return st;
    }
    float *px = ts_tensor_data_f32(*x);
    int64_t *py = ts_tensor_data(*y);
    for (int64_t i = 0; i < n; i++) {
        ts_rng r;
        ts_rng_seed(&r, step * 1000003u + (uint64_t)(lo + i) + 17u);
        for (int64_t k = 0; k < side * side; k++) px[i * side * side + k] = (float)(ts_rng_uniform(&r) * 2 - 1);
        py[i] = (int64_t)ts_rng_below(&r, 10);
    }
    return TS_OK;
}

/* All parameters of m, flattened in order, into a new malloc'd array. */
static ts_status flat_params(ts_module *m, bool grads, float **out, int64_t *n) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    TS_TRY(ts_module_parameters(m, &l));
    int64_t total = 0;
    for (int i = 0; i < l.n; i++) total += ts_tensor_numel(l.tensors[i]);
    float *v = calloc((size_t)total + 1, sizeof(float));
    ts_status st = v ? TS_OK : TS_ERR_NOMEM;
    int64_t off = 0;
    for (int i = 0; i < l.n && st == TS_OK; i++) {
        ts_tensor *t = grads ? ts_tensor_grad(l.tensors[i]) : l.tensors[i];
        int64_t k = ts_tensor_numel(l.tensors[i]);
        if (t) st = ts_tensor_to_host(t, v + off, (size_t)k * sizeof(float));
        off += k;
    }
    ts_tensor_list_clear(&l);
    if (st != TS_OK) {
        free(v);
        return st;
    }
    *out = v;
    *n = total;
    return TS_OK;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* ---- (a) equivalence with a single process ---------------------------------------------------- */
typedef struct train_cfg {
    model_fn make;
    int64_t side;
    ts_ddp_options opts;
} train_cfg;

static ts_device *test_dev; /* where train() runs: TS_TEST_DEVICE (cpu; cpu:1, cuda:0), set by check_equivalence */

/* STEPS steps of SGD(lr 0.05, momentum 0.9) on this rank's share of each
 * global batch; pg NULL: a single process on the whole batch. The model and the batches
 * live on test_dev. */
static ts_status train(const train_cfg *cfg, ts_process_group *pg, rank_ctx *c) {
    int rank = pg ? ts_pg_rank(pg) : 0, world = pg ? ts_pg_size(pg) : 1;
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_optimizer *opt = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(cfg->make(1234, &m));
    TS_CHECK_GOTO(ts_module_to(m, test_dev));
    if (pg) TS_CHECK_GOTO(ts_ddp_new(m, pg, &cfg->opts, &ddp));
    TS_CHECK_GOTO(ts_module_parameters(m, &params));
    if (params.n && ts_tensor_device(params.tensors[0]) != test_dev) {
        st = ts_error(TS_ERR_DEVICE, "the model is on %s, not on %s", ts_device_name(ts_tensor_device(params.tensors[0])),
                      ts_device_name(test_dev));
        goto fail;
    }
    ts_sgd_config sc = TS_SGD_CONFIG_INIT;
    sc.lr = 0.05f;
    sc.momentum = 0.9f;
    TS_CHECK_GOTO(ts_optim_sgd_new(&params, &sc, &opt));
    int64_t per = BATCH / world;
    for (int step = 0; step < STEPS; step++) {
        ts_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
        st = make_batch((uint64_t)step, rank * per, (rank + 1) * per, cfg->side, &x, &y);
        for (int k = 0; k < 2 && st == TS_OK && test_dev != ts_device_cpu(); k++) {
            ts_tensor **t = k ? &y : &x, *moved = NULL;
            st = ts_to_device(*t, test_dev, &moved);
            ts_tensor_release(*t);
            *t = moved;
        }
        if (st == TS_OK) st = ddp ? ts_ddp_forward(ddp, x, &logits) : ts_module_forward(m, x, &logits);
        if (st == TS_OK) st = ts_cross_entropy(logits, y, 0.0f, &loss);
        if (st == TS_OK) st = ts_backward(loss, NULL, false);
        if (st == TS_OK && ddp) st = ts_ddp_sync_status(ddp);
        if (st == TS_OK) st = ts_optimizer_step(opt);
        ts_optimizer_zero_grad(opt);
        ts_tensor_release(x);
        ts_tensor_release(y);
        ts_tensor_release(logits);
        ts_tensor_release(loss);
        if (st != TS_OK) goto fail;
    }
    TS_CHECK_GOTO(flat_params(m, false, &c->values, &c->nvalues));
    if (ddp) ts_ddp_get_stats(ddp, &c->stats);
    if (ddp) c->counters[0] = ts_ddp_num_buckets(ddp);
fail:
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static ts_status train_rank(rank_ctx *c, ts_process_group *pg) { return train(c->arg, pg, c); }

static void check_equivalence(const char *what, const train_cfg *cfg, int world) {
    rank_ctx ref = {0}, c[MAX_WORLD];
    ts_set_num_threads(1);
    test_dev = tu_test_device();
    CHECK_OK(train(cfg, NULL, &ref));
    if (!ref.values) return;
    if (run_ranks(world, train_rank, cfg, c)) {
        double worst = 0, spread = 0;
        for (int r = 0; r < world; r++) {
            CHECK(c[r].nvalues == ref.nvalues);
            if (c[r].nvalues != ref.nvalues) continue;
            worst = fmax(worst, max_diff(c[r].values, ref.values, ref.nvalues));
            spread = fmax(spread, max_diff(c[r].values, c[0].values, ref.nvalues));
            CHECK(c[r].stats.syncs == STEPS);
        }
        fprintf(stderr, "  %s, world %d (%lld buckets): max |ddp - single| = %.3g, max |rank r - rank 0| = %.3g\n",
                what, world, (long long)c[0].counters[0], worst, spread);
        CHECK(worst <= 1e-5);
        CHECK(spread == 0);
    }
    free_ranks(c, world);
    free(ref.values);
}

static void test_equivalence_mlp(void) {
    train_cfg cfg = {make_mlp, 28, TS_DDP_OPTIONS_INIT};
    check_equivalence("MLP, default buckets", &cfg, 2);
    check_equivalence("MLP, default buckets", &cfg, 4);
    cfg.opts.first_bucket_cap_mb = 0.0005; /* 524 bytes */
    cfg.opts.bucket_cap_mb = 0.01;         /* 10486 bytes: four buckets */
    check_equivalence("MLP, small buckets", &cfg, 2);
    check_equivalence("MLP, small buckets", &cfg, 4);
}

static void test_equivalence_cnn(void) {
    train_cfg cfg = {make_cnn, 8, TS_DDP_OPTIONS_INIT};
    check_equivalence("CNN, default buckets", &cfg, 2);
    check_equivalence("CNN, default buckets", &cfg, 4);
    cfg.opts.first_bucket_cap_mb = 0.00002; /* 21 bytes */
    cfg.opts.bucket_cap_mb = 0.0002;        /* 210 bytes */
    check_equivalence("CNN, small buckets", &cfg, 4);
}

/* ---- (b) initial broadcast and buffer broadcast ----------------------------------------------- */
static ts_status broadcast_rank(rank_ctx *c, ts_process_group *pg) {
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_tensor *x = NULL, *y = NULL, *out = NULL;
    ts_tensor_list bufs = TS_TENSOR_LIST_INIT;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(make_bn_cnn(100 + (uint64_t)c->rank, &m)); /* a different model on every rank */
    TS_CHECK_GOTO(ts_module_buffers(m, &bufs));
    ts_tensor *rm = ts_tensor_list_find(&bufs, "1.running_mean");
    ts_tensor *rv = ts_tensor_list_find(&bufs, "1.running_var");
    ts_tensor *nbt = ts_tensor_list_find(&bufs, "1.num_batches_tracked");
    ts_tensor_fill_(rm, (float)(c->rank + 1));
    ((int64_t *)ts_tensor_data(nbt))[0] = 10 + c->rank;
    st = ts_ddp_new(m, pg, NULL, &ddp);
    if (st == TS_OK) st = flat_params(m, false, &c->values, &c->nvalues);
    if (st == TS_OK) {
        c->counters[0] = (int64_t)lround(ts_tensor_item(rm, 0) * 1000);
        c->counters[1] = (int64_t)ts_tensor_item(nbt, 0);
    }
    /* a buffer changed on one rank follows rank 0 again at the next forward (eval: BN leaves it alone) */
    if (st == TS_OK && c->rank == 1) st = ts_tensor_fill_(rv, 5.0f);
    ts_module_train(m, false);
    if (st == TS_OK) st = make_batch(0, 0, 2, 8, &x, &y);
    if (st == TS_OK) st = ts_ddp_forward(ddp, x, &out);
    if (st == TS_OK) c->counters[2] = (int64_t)lround(ts_tensor_item(rv, 1) * 1000);
fail:
    ts_tensor_list_clear(&bufs);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(out);
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static void test_initial_broadcast(void) {
    rank_ctx c[MAX_WORLD];
    ts_module *m0 = NULL;
    float *want = NULL;
    int64_t n = 0;
    CHECK_OK(make_bn_cnn(100, &m0));
    CHECK_OK(flat_params(m0, false, &want, &n));
    if (run_ranks(3, broadcast_rank, NULL, c)) {
        for (int r = 0; r < 3; r++) {
            CHECK(c[r].nvalues == n);
            if (c[r].nvalues == n) CHECK(max_diff(c[r].values, want, n) == 0);
            CHECK(c[r].counters[0] == 1000); /* rank 0's running_mean (1.0) */
            CHECK(c[r].counters[1] == 10);   /* rank 0's num_batches_tracked */
            CHECK(c[r].counters[2] == 1000); /* rank 0's running_var (1.0), not rank 1's 5.0 */
        }
        /* and rank 1's own model was different before */
        float *own = NULL;
        int64_t k = 0;
        ts_module *m1 = NULL;
        CHECK_OK(make_bn_cnn(101, &m1));
        CHECK_OK(flat_params(m1, false, &own, &k));
        if (own && k == n) CHECK(max_diff(own, want, n) > 1e-3);
        free(own);
        ts_module_free(m1);
    }
    free_ranks(c, 3);
    free(want);
    ts_module_free(m0);
}

/* ---- (c) no_sync: two local micro-batches, then a synchronised one ------------------------------ */
#define MICRO 4

/* Micro-batch m of rank r covers global rows r*3*MICRO + m*MICRO ... ; loss scaled by 1/3. */
static ts_status micro_step(ts_module *m, ts_ddp *ddp, int rank, int micro) {
    ts_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL, *scaled = NULL;
    int64_t lo = (int64_t)rank * 3 * MICRO + (int64_t)micro * MICRO;
    ts_status st = make_batch(99, lo, lo + MICRO, 28, &x, &y);
    if (st == TS_OK) st = ddp ? ts_ddp_forward(ddp, x, &logits) : ts_module_forward(m, x, &logits);
    if (st == TS_OK) st = ts_cross_entropy(logits, y, 0.0f, &loss);
    if (st == TS_OK) st = ts_scale(loss, 1.0f / 3.0f, &scaled);
    if (st == TS_OK) st = ts_backward(scaled, NULL, false);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(logits);
    ts_tensor_release(loss);
    ts_tensor_release(scaled);
    return st;
}

static ts_status no_sync_rank(rank_ctx *c, ts_process_group *pg) {
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(make_mlp(7, &m));
    TS_CHECK_GOTO(ts_ddp_new(m, pg, NULL, &ddp));
    ts_ddp_set_require_sync(ddp, false);
    TS_CHECK_GOTO(micro_step(m, ddp, c->rank, 0));
    TS_CHECK_GOTO(micro_step(m, ddp, c->rank, 1));
    ts_ddp_get_stats(ddp, &c->stats);
    c->counters[0] = c->stats.buckets_launched; /* no communication while off */
    /* the local (unsynchronised) gradient: differs between ranks */
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    TS_CHECK_GOTO(ts_module_parameters(m, &l));
    c->counters[1] = (int64_t)lround(ts_tensor_item(ts_tensor_grad(l.tensors[3]), 0) * 1e6);
    ts_tensor_list_clear(&l);
    ts_ddp_set_require_sync(ddp, true);
    TS_CHECK_GOTO(micro_step(m, ddp, c->rank, 2));
    TS_CHECK_GOTO(ts_ddp_sync_status(ddp));
    ts_ddp_get_stats(ddp, &c->stats);
    TS_CHECK_GOTO(flat_params(m, true, &c->grads, &c->ngrads));
fail:
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static void test_no_sync(void) {
    /* reference: one process, the 2 * 3 * MICRO rows of both ranks in one batch */
    ts_module *m = NULL;
    float *want = NULL;
    int64_t n = 0;
    CHECK_OK(make_mlp(7, &m));
    {
        ts_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
        CHECK_OK(make_batch(99, 0, 2 * 3 * MICRO, 28, &x, &y));
        CHECK_OK(ts_module_forward(m, x, &logits));
        CHECK_OK(ts_cross_entropy(logits, y, 0.0f, &loss));
        CHECK_OK(ts_backward(loss, NULL, false));
        CHECK_OK(flat_params(m, true, &want, &n));
        ts_tensor_release(x);
        ts_tensor_release(y);
        ts_tensor_release(logits);
        ts_tensor_release(loss);
    }
    rank_ctx c[MAX_WORLD];
    if (run_ranks(2, no_sync_rank, NULL, c)) {
        for (int r = 0; r < 2; r++) {
            CHECK(c[r].counters[0] == 0);
            CHECK(c[r].stats.syncs == 1);
            CHECK(c[r].ngrads == n);
            if (c[r].ngrads == n) {
                double d = max_diff(c[r].grads, want, n);
                fprintf(stderr, "  no_sync: rank %d max |grad - big batch grad| = %.3g\n", r, d);
                CHECK(d <= 1e-6);
            }
        }
        CHECK(c[0].counters[1] != c[1].counters[1]); /* local gradients differed before the sync */
    }
    free_ranks(c, 2);
    free(want);
    ts_module_free(m);
}

/* ---- (d) bucket assignment ------------------------------------------------------------------------ */
typedef struct bucket_case {
    double first_mb, cap_mb;
    int want_nb;
    int want_of[6];
    int64_t want_numel[6];
} bucket_case;

static ts_status bucket_rank(rank_ctx *c, ts_process_group *pg) {
    const bucket_case *bc = c->arg;
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(make_tiny(3, &m));
    ts_ddp_options o = TS_DDP_OPTIONS_INIT;
    o.first_bucket_cap_mb = bc->first_mb;
    o.bucket_cap_mb = bc->cap_mb;
    TS_CHECK_GOTO(ts_ddp_new(m, pg, &o, &ddp));
    c->counters[0] = ts_ddp_num_buckets(ddp);
    for (int i = 0; i < 6; i++) c->counters[1] |= (int64_t)(ts_ddp_bucket_of(ddp, i) != bc->want_of[i]) << i;
    for (int b = 0; b < bc->want_nb; b++)
        c->counters[2] |= (int64_t)(ts_ddp_bucket_numel(ddp, b) != bc->want_numel[b]) << b;
    c->counters[3] = ts_ddp_bucket_of(ddp, 6) == -1 && ts_ddp_bucket_numel(ddp, bc->want_nb) == 0;
    /* one synchronised step through all the buckets */
    ts_tensor *x = NULL, *out = NULL, *loss = NULL;
    int64_t xs[2] = {2, 4};
    st = ts_tensor_full(ts_device_cpu(), 2, xs, 0.5f + (float)c->rank, &x);
    if (st == TS_OK) st = ts_ddp_forward(ddp, x, &out);
    if (st == TS_OK) st = ts_sum(out, &loss);
    if (st == TS_OK) st = ts_backward(loss, NULL, false);
    if (st == TS_OK) st = ts_ddp_sync_status(ddp);
    if (st == TS_OK) st = flat_params(m, true, &c->grads, &c->ngrads);
    ts_ddp_get_stats(ddp, &c->stats);
    ts_tensor_release(x);
    ts_tensor_release(out);
    ts_tensor_release(loss);
fail:
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static void test_buckets(void) {
    /* parameters: 0.weight (64 B), 0.bias (16 B), 1.weight, 1.bias, 2.weight, 2.bias */
    const double B = 1.0 / 1048576.0; /* one byte in MiB */
    const bucket_case cases[] = {
        {1.0, 25.0, 1, {0, 0, 0, 0, 0, 0}, {60}},                     /* defaults: one bucket */
        {80 * B, 80 * B, 3, {2, 2, 1, 1, 0, 0}, {20, 20, 20}},         /* one layer per bucket, last layer first */
        {16 * B, 80 * B, 4, {3, 2, 2, 1, 1, 0}, {4, 20, 20, 16}},      /* small first bucket */
        {-1, 1 * B, 6, {5, 4, 3, 2, 1, 0}, {4, 16, 4, 16, 4, 16}},     /* cap below every size: one each */
        {70 * B, 80 * B, 3, {2, 2, 1, 1, 0, 0}, {20, 20, 20}},         /* 2.weight crosses the first cap: it stays */
    };
    for (size_t k = 0; k < TS_ARRAY_LEN(cases); k++) {
        rank_ctx c[MAX_WORLD];
        if (run_ranks(2, bucket_rank, &cases[k], c)) {
            for (int r = 0; r < 2; r++) {
                CHECK(c[r].counters[0] == cases[k].want_nb);
                CHECK(c[r].counters[1] == 0);
                CHECK(c[r].counters[2] == 0);
                CHECK(c[r].counters[3] == 1);
                CHECK(c[r].stats.syncs == 1);
                CHECK(c[r].stats.buckets_launched == cases[k].want_nb);
            }
            if (c[0].counters[1] || c[0].counters[2])
                fprintf(stderr, "  case %zu: %lld buckets, bucket_of mismatch mask %llx, numel mismatch mask %llx\n",
                        k, (long long)c[0].counters[0], (long long)c[0].counters[1], (long long)c[0].counters[2]);
            /* inputs 0.5 and 1.5: the averaged gradient equals the gradient at both inputs' mean; ranks agree */
            CHECK(c[0].ngrads == 60 && c[1].ngrads == 60);
            if (c[0].ngrads == 60 && c[1].ngrads == 60) CHECK(max_diff(c[0].grads, c[1].grads, 60) == 0);
        }
        free_ranks(c, 2);
    }
}

/* ---- (e) overlap: buckets go out before the last gradient is ready ----------------------------- */
static ts_status overlap_rank(rank_ctx *c, ts_process_group *pg) {
    train_cfg cfg = {make_mlp, 28, TS_DDP_OPTIONS_INIT};
    /* the MLP's parameters, last first: 3.bias 40 B, 3.weight 10 KiB, 1.bias 1 KiB, 1.weight 784 KiB; caps
     * below each: one bucket per parameter */
    cfg.opts.first_bucket_cap_mb = 32.0 / 1048576;
    cfg.opts.bucket_cap_mb = 1000.0 / 1048576;
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(make_mlp(5, &m));
    TS_CHECK_GOTO(ts_ddp_new(m, pg, &cfg.opts, &ddp));
    TS_CHECK_GOTO(make_batch(1, c->rank * 8, c->rank * 8 + 8, 28, &x, &y));
    TS_CHECK_GOTO(ts_ddp_forward(ddp, x, &logits));
    TS_CHECK_GOTO(ts_cross_entropy(logits, y, 0.0f, &loss));
    TS_CHECK_GOTO(ts_backward(loss, NULL, false));
    TS_CHECK_GOTO(ts_ddp_sync_status(ddp));
    ts_ddp_get_stats(ddp, &c->stats);
    c->counters[0] = ts_ddp_num_buckets(ddp);
fail:
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(logits);
    ts_tensor_release(loss);
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static void test_overlap(void) {
    rank_ctx c[MAX_WORLD];
    if (run_ranks(2, overlap_rank, NULL, c)) {
        for (int r = 0; r < 2; r++) {
            const ts_ddp_stats *s = &c[r].stats;
            CHECK(c[r].counters[0] == 4);
            CHECK(s->buckets_launched == 4);
            /* bucket 0 (the last layer's bias) went out after the first gradient, long before the last */
            CHECK(s->last_first_launch_at == 1);
            CHECK(s->last_num_reported == 4);
            CHECK(s->buckets_launched_early == 3); /* all but the bucket that ends the pass */
            CHECK(s->buckets_held == 0);
        }
    }
    free_ranks(c, 2);
}

/* ---- buckets complete out of order are held until the earlier ones have gone out ---------------- */
/* loss = sum over layers 2, 1, 0 (in that order) of sum((rank + 1) * weight) + sum(bias): the gradients of
 * layer 0 (the last bucket) are ready first, layer 2's (bucket 0) last. */
static ts_status held_rank(rank_ctx *c, ts_process_group *pg) {
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_tensor *total = NULL;
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(make_tiny(3, &m));
    ts_ddp_options o = TS_DDP_OPTIONS_INIT;
    o.first_bucket_cap_mb = o.bucket_cap_mb = 80.0 / 1048576.0; /* one layer per bucket */
    TS_CHECK_GOTO(ts_ddp_new(m, pg, &o, &ddp));
    TS_CHECK_GOTO(ts_module_parameters(m, &l));
    for (int layer = 2; layer >= 0; layer--)
        for (int k = 0; k < 2; k++) {
            ts_tensor *p = l.tensors[2 * layer + k], *scaled = NULL, *sum = NULL, *next = NULL;
            st = ts_scale(p, k == 0 ? (float)(c->rank + 1) : 1.0f, &scaled);
            if (st == TS_OK) st = ts_sum(scaled, &sum);
            if (st == TS_OK && total) st = ts_add(total, sum, &next);
            ts_tensor_release(scaled);
            if (st == TS_OK && !total) next = ts_tensor_retain(sum);
            ts_tensor_release(sum);
            ts_tensor_release(total);
            total = next;
            if (st != TS_OK) goto fail;
        }
    TS_CHECK_GOTO(ts_backward(total, NULL, false));
    TS_CHECK_GOTO(ts_ddp_sync_status(ddp));
    TS_CHECK_GOTO(flat_params(m, true, &c->grads, &c->ngrads));
    ts_ddp_get_stats(ddp, &c->stats);
fail:
    ts_tensor_release(total);
    ts_tensor_list_clear(&l);
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static void test_buckets_held_in_order(void) {
    rank_ctx c[MAX_WORLD];
    if (run_ranks(2, held_rank, NULL, c)) {
        for (int r = 0; r < 2; r++) {
            CHECK(c[r].stats.buckets_launched == 3);
            CHECK(c[r].stats.buckets_held == 2); /* buckets 2 and 1 waited for bucket 0 */
            CHECK(c[r].stats.buckets_launched_early == 0);
            CHECK(c[r].ngrads == 60);
            /* weights: the mean of 1 and 2; biases: 1 */
            for (int64_t i = 0; i < c[r].ngrads; i++) CHECK_NEAR(c[r].grads[i], i % 20 < 16 ? 1.5 : 1.0, 0);
        }
    }
    free_ranks(c, 2);
}

/* ---- unused parameters --------------------------------------------------------------------------- */
static ts_status unused_rank(rank_ctx *c, ts_process_group *pg) {
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_tensor *x = NULL, *out = NULL, *loss = NULL;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(make_tiny(3, &m));
    ts_ddp_options o = TS_DDP_OPTIONS_INIT;
    o.first_bucket_cap_mb = o.bucket_cap_mb = 80.0 / 1048576.0; /* one layer per bucket */
    TS_CHECK_GOTO(ts_ddp_new(m, pg, &o, &ddp));
    int64_t xs[2] = {2, 4};
    TS_CHECK_GOTO(ts_tensor_full(ts_device_cpu(), 2, xs, 1.0f, &x));
    /* backward through the last layer only: layers 0 and 1 get no gradient */
    TS_CHECK_GOTO(ts_ddp_forward(ddp, x, &out));
    ts_tensor_release(out);
    out = NULL;
    TS_CHECK_GOTO(ts_module_forward(ts_module_child(m, "2"), x, &out));
    TS_CHECK_GOTO(ts_sum(out, &loss));
    TS_CHECK_GOTO(ts_backward(loss, NULL, false));
    ts_status s1 = ts_ddp_sync_status(ddp);
    c->counters[0] = s1;
    c->counters[1] = strstr(ts_last_error(), "0.weight") != NULL;
    ts_tensor_release(out);
    out = NULL;
    ts_status s2 = ts_ddp_forward(ddp, x, &out);
    c->counters[2] = s2;
    c->counters[3] = strstr(ts_last_error(), "0.weight, 0.bias, 1.weight, 1.bias were not used") != NULL &&
                     strstr(ts_last_error(), "find_unused_parameters") != NULL;
    if (!c->counters[3]) snprintf(c->err, sizeof c->err, "%s", ts_last_error());
    /* recovered: the next full step works */
    ts_tensor_release(out);
    out = NULL;
    ts_tensor_release(loss);
    loss = NULL;
    TS_CHECK_GOTO(ts_ddp_forward(ddp, x, &out));
    TS_CHECK_GOTO(ts_sum(out, &loss));
    TS_CHECK_GOTO(ts_backward(loss, NULL, false));
    TS_CHECK_GOTO(ts_ddp_sync_status(ddp));
    ts_ddp_get_stats(ddp, &c->stats);
fail:
    ts_tensor_release(x);
    ts_tensor_release(out);
    ts_tensor_release(loss);
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static void test_unused_parameters(void) {
    rank_ctx c[MAX_WORLD];
    if (run_ranks(2, unused_rank, NULL, c)) {
        for (int r = 0; r < 2; r++) {
            CHECK(c[r].counters[0] == TS_ERR_STATE);
            CHECK(c[r].counters[1] == 1);
            CHECK(c[r].counters[2] == TS_ERR_STATE);
            CHECK(c[r].counters[3] == 1);
            if (!c[r].counters[3]) fprintf(stderr, "  message: %s\n", c[r].err);
            CHECK(c[r].stats.syncs == 1);
        }
    }
    free_ranks(c, 2);
}

/* ---- join: uneven inputs --------------------------------------------------------------------------- */
#define JOIN_PER 4

/* Rank r trains 3 + 2r steps on rows [r*JOIN_PER, (r+1)*JOIN_PER) of each step's batch. pg NULL: the single-process
 * reference, which sees what DDP computes: steps where both ranks train average both halves; steps where only
 * rank 1 trains get rank 1's gradient divided by the world size (2). */
static ts_status join_train(rank_ctx *c, ts_process_group *pg) {
    int rank = pg ? ts_pg_rank(pg) : 0;
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    ts_optimizer *opt = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(make_cnn(77, &m));
    if (pg) TS_CHECK_GOTO(ts_ddp_new(m, pg, NULL, &ddp));
    if (pg) TS_CHECK_GOTO(ts_ddp_join_begin(ddp));
    TS_CHECK_GOTO(ts_module_parameters(m, &params));
    ts_sgd_config sc = TS_SGD_CONFIG_INIT;
    sc.lr = 0.05f;
    sc.momentum = 0.9f;
    TS_CHECK_GOTO(ts_optim_sgd_new(&params, &sc, &opt));
    int nsteps = pg ? 3 + 2 * rank : 5;
    for (int step = 0; step < nsteps; step++) {
        ts_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL, *scaled = NULL;
        int64_t lo = pg ? rank * JOIN_PER : (step < 3 ? 0 : JOIN_PER), hi = pg ? lo + JOIN_PER : 2 * JOIN_PER;
        st = make_batch((uint64_t)step + 500, lo, hi, 8, &x, &y);
        if (st == TS_OK) st = ddp ? ts_ddp_forward(ddp, x, &logits) : ts_module_forward(m, x, &logits);
        if (st == TS_OK) st = ts_cross_entropy(logits, y, 0.0f, &loss);
        if (st == TS_OK) st = ts_scale(loss, !pg && step >= 3 ? 0.5f : 1.0f, &scaled);
        if (st == TS_OK) st = ts_backward(scaled, NULL, false);
        if (st == TS_OK && ddp) st = ts_ddp_sync_status(ddp);
        if (st == TS_OK) st = ts_optimizer_step(opt);
        ts_optimizer_zero_grad(opt);
        ts_tensor_release(x);
        ts_tensor_release(y);
        ts_tensor_release(logits);
        ts_tensor_release(loss);
        ts_tensor_release(scaled);
        if (st != TS_OK) goto fail;
    }
    if (ddp) TS_CHECK_GOTO(ts_ddp_join(ddp));
    TS_CHECK_GOTO(flat_params(m, false, &c->values, &c->nvalues));
    if (ddp) ts_ddp_get_stats(ddp, &c->stats);
fail:
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_ddp_free(ddp);
    ts_module_free(m);
    return st;
}

static void test_join_uneven_inputs(void) {
    rank_ctx ref = {0}, c[MAX_WORLD];
    ts_set_num_threads(1);
    CHECK_OK(join_train(&ref, NULL));
    if (ref.values && run_ranks(2, join_train, NULL, c)) {
        for (int r = 0; r < 2; r++) {
            CHECK(c[r].nvalues == ref.nvalues);
            if (c[r].nvalues != ref.nvalues) continue;
            double d = max_diff(c[r].values, ref.values, ref.nvalues);
            fprintf(stderr, "  join: rank %d (%d steps) max |ddp - reference| = %.3g\n", r, 3 + 2 * r, d);
            CHECK(d <= 1e-5);
        }
        CHECK(c[0].stats.syncs == 3 && c[1].stats.syncs == 5);
    }
    free_ranks(c, 2);
    free(ref.values);
}

/* ---- options ---------------------------------------------------------------------------------------- */
static ts_status options_rank(rank_ctx *c, ts_process_group *pg) {
    ts_module *m = NULL;
    ts_ddp *ddp = NULL;
    TS_TRY(make_tiny(3, &m));
    ts_ddp_options o = TS_DDP_OPTIONS_INIT;
    o.bucket_cap_mb = 0;
    c->counters[0] = ts_ddp_new(m, pg, &o, &ddp);
    ts_ddp_options bad = {0};
    c->counters[1] = ts_ddp_new(m, pg, &bad, &ddp);
    c->counters[2] = strstr(ts_last_error(), "TS_DDP_OPTIONS_INIT") != NULL;
    ts_module_free(m);
    return TS_OK;
}

static void test_options(void) {
    rank_ctx c[MAX_WORLD];
    if (run_ranks(1, options_rank, NULL, c)) {
        CHECK(c[0].counters[0] == TS_ERR_INVALID_ARG);
        CHECK(c[0].counters[1] == TS_ERR_INVALID_ARG);
        CHECK(c[0].counters[2] == 1);
    }
    free_ranks(c, 1);
}

TU_MAIN(T(test_options), T(test_buckets), T(test_initial_broadcast), T(test_overlap),
        T(test_no_sync), T(test_buckets_held_in_order), T(test_unused_parameters), T(test_join_uneven_inputs),
        T(test_equivalence_mlp), T(test_equivalence_cnn))
