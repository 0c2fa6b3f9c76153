/*
 * tests/test_accum.c — gradient accumulation, clipping and loss scaling through
 * the trainer (tessera/train.h) and the gradient calls (tessera/optim.h):
 * K batches of B train as one batch of K x B (one process, the data strategy
 * on virtual devices, and DDP over 2 ranks, where only the K-th backward
 * all-reduces); an epoch's last short step; resume with the same K is
 * bit-identical and a different K is refused; ts_clip_grad_norm and
 * ts_scale_grads against hand-computed values; the grad scaler's rules;
 * DDP with bfloat16 gradient communication (close to float32, replicas equal).
 * The runs without a strategy and the DDP ranks train on TS_TEST_DEVICE (cuda:0 on
 * a GPU machine, cpu:1 a virtual CPU device; the CPU by default: train_fixtures.h).
 */
#include "test_util.h"
#include "rank_threads.h"

#include <math.h>

#include "train_fixtures.h"

/* One run's set-up and results (also a rank's context). */
typedef struct cfg {
    ts_dataset *ds;
    int64_t batch, accum, epochs, max_steps;
    double clip;
    ts_strategy_kind kind;
    const char *save, *resume; /* checkpoint written every 2 steps / resumed from */
    ts_dtype comm;             /* DDP's all-reduce dtype (0: float32) */
    const ts_grad_scaler *scaler; /* dynamic loss scaling (NULL: none) */
} cfg;

typedef struct result {
    float *params; /* flattened, malloc'd */
    int64_t nparams, steps, events, micro[64], syncs, skipped;
    float loss_scale;
    double norm[64];
    ts_status st;
    char err[512];
} result;

static ts_status on_step(const ts_train_event *ev, void *user) {
    result *r = user;
    if (ev->kind != TS_TRAIN_STEP) return TS_OK;
    if (r->events < 64) {
        r->micro[r->events] = ev->micro_batches;
        r->norm[r->events] = ev->grad_norm;
    }
    r->events++;
    return TS_OK;
}

/* Trains cfg's run (pg: a DDP rank, else NULL) into *r. */
static ts_status train(const cfg *c, ts_process_group *pg, result *r) {
    ts_strategy *s = NULL;
    ts_optimizer *opt = NULL;
    ts_trainer *t = NULL;
    ts_batch_source *src = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = c->kind;
    so.pg = pg;
    ts_device *dev;
    tf_place(&so, &dev);
    ts_ddp_options dopt = TS_DDP_OPTIONS_INIT;
    dopt.comm_dtype = c->comm;
    so.ddp = &dopt;
    ts_dataset_source_opts dso = TS_DATASET_SOURCE_OPTS_INIT;
    dso.batch_size = c->batch;
    dso.seed = 11;
    dso.rank = pg ? ts_pg_rank(pg) : 0;
    dso.world_size = pg ? ts_pg_size(pg) : 1;
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = c->epochs;
    to.max_steps = c->max_steps;
    to.accum_steps = c->accum;
    to.clip_grad_norm = c->clip;
    to.checkpoint = c->save;
    to.checkpoint_every = c->save ? 2 : 0;
    to.seed = 11;
    to.batch_size = c->batch;
    to.callback = on_step;
    to.user = r;
    to.grad_scaler = c->scaler;
    ts_train_result res;
    ts_status st;
    TS_CHECK_GOTO_T(ts_strategy_new(make_model(4), &so, &s));
    TS_CHECK_GOTO_T(ts_module_parameters(ts_strategy_model(s), &params));
    TS_CHECK_GOTO_T(ts_optimizer_by_name("sgd", &params, 0.3, 0.9, 5e-4, &opt));
    TS_CHECK_GOTO_T(ts_batch_source_dataset(c->ds, &dso, &src));
    TS_CHECK_GOTO_T(ts_trainer_new(s, opt, src, &to, &t));
    if (c->resume) TS_CHECK_GOTO_T(ts_trainer_resume(t, c->resume));
    TS_CHECK_GOTO_T(ts_trainer_run(t, &res));
    r->steps = res.steps;
    r->skipped = res.skipped_steps;
    r->loss_scale = res.loss_scale;
    if (ts_strategy_ddp(s)) {
        ts_ddp_stats ds;
        ts_ddp_get_stats(ts_strategy_ddp(s), &ds);
        r->syncs = ds.syncs;
    }
    r->params = tf_params_host(&params, c->kind == TS_STRATEGY_NONE || c->kind == TS_STRATEGY_DDP ? dev : NULL, &r->nparams, &st);
fail:
    r->st = st;
    if (st != TS_OK) snprintf(r->err, sizeof r->err, "%s", ts_last_error());
    ts_trainer_free(t);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(src);
    return st;
}

static double max_diff(const result *a, const result *b) {
    if (a->nparams != b->nparams || !a->params || !b->params) return INFINITY;
    double w = 0;
    for (int64_t i = 0; i < a->nparams; i++) w = fmax(w, fabs((double)a->params[i] - (double)b->params[i]));
    return w;
}

/* 96 samples: 4 batches of 8 per step vs 1 batch of 32, 2 epochs (6 steps). */
static void test_accum_equals_big_batch(void) {
    ts_dataset *ds = make_dataset(96, 5);
    cfg big = {ds, 32, 1, 2, 0, 0.0, TS_STRATEGY_NONE, NULL, NULL, TS_F32, NULL}, small = big, data = big;
    small.batch = 8;
    small.accum = 4;
    data.batch = 8;
    data.accum = 4;
    data.kind = TS_STRATEGY_DATA; /* replicas on every virtual CPU device; their gradients add up */
    result a = {0}, b = {0}, d = {0};
    CHECK_OK(train(&big, NULL, &a));
    CHECK_OK(train(&small, NULL, &b));
    CHECK_OK(train(&data, NULL, &d));
    fprintf(stderr, "  4 x 8 vs 1 x 32: max abs diff %.3g (data strategy %.3g)\n", max_diff(&a, &b), max_diff(&a, &d));
    CHECK(a.steps == 6 && b.steps == 6 && d.steps == 6);
    CHECK(max_diff(&a, &b) <= 1e-5);
    CHECK(max_diff(&a, &d) <= 1e-5);
    CHECK(b.micro[0] == 4 && a.micro[0] == 1);
    CHECK(isnan(a.norm[0])); /* no clipping: no norm */
    /* accumulation changes the result: 4 steps of 8 are not 1 step of 32 */
    cfg plain = small;
    plain.accum = 1;
    plain.max_steps = 24;
    result p = {0};
    CHECK_OK(train(&plain, NULL, &p));
    CHECK(max_diff(&a, &p) > 1e-3);
    free(a.params);
    free(b.params);
    free(d.params);
    free(p.params);
    ts_dataset_free(ds);
}

/* 100 samples at 8: 13 batches, the last of 4 samples; K = 4 makes steps of 4, 4, 4 and 1 batches. */
static void test_short_last_step(void) {
    ts_dataset *ds = make_dataset(100, 6);
    cfg c = {ds, 8, 4, 1, 0, 0.0, TS_STRATEGY_NONE, NULL, NULL, TS_F32, NULL};
    result r = {0};
    CHECK_OK(train(&c, NULL, &r));
    CHECK(r.steps == 4 && r.events == 4);
    CHECK(r.micro[0] == 4 && r.micro[1] == 4 && r.micro[2] == 4 && r.micro[3] == 1);
    free(r.params);
    ts_dataset_free(ds);
}

/* Resume with the same K goes on bit for bit; another K is refused, naming both. */
static void test_accum_resume(void) {
    ts_dataset *ds = make_dataset(96, 7);
    char ck[512];
    snprintf(ck, sizeof ck, "%s/accum.ckpt", tu_tmpdir());
    cfg whole = {ds, 8, 3, 2, 0, 0.0, TS_STRATEGY_NONE, NULL, NULL, TS_F32, NULL}, first = whole, rest = whole, other = whole;
    first.max_steps = 5; /* stops after step 5 (mid-epoch 2: epochs have 4 steps), last save at step 4 */
    first.save = ck;
    rest.resume = ck;
    other.resume = ck;
    other.accum = 2;
    result a = {0}, b = {0}, c = {0}, d = {0};
    CHECK_OK(train(&whole, NULL, &a));
    CHECK_OK(train(&first, NULL, &b));
    CHECK_OK(train(&rest, NULL, &c));
    CHECK(a.steps == 8 && c.steps == 8);
    CHECK(a.nparams == c.nparams && memcmp(a.params, c.params, sizeof(float) * (size_t)a.nparams) == 0);
    ts_train_checkpoint_info info;
    CHECK_OK(ts_train_checkpoint_read(ck, &info));
    CHECK(info.accum_steps == 3);
    CHECK_STATUS(train(&other, NULL, &d), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("3 batches per step");
    free(a.params);
    free(b.params);
    free(c.params);
    free(d.params);
    ts_dataset_free(ds);
}

/* ---- DDP: 2 ranks at 4 per rank, K = 4, vs one process at 32 ---------------------------------------- */
typedef struct rank_ctx rank_ctx;
struct rank_ctx {
    TU_RANK_FIELDS(rank_ctx);
    result r;
};
TU_RANK_THREADS(rank_ctx, run_ranks)

static ts_status ddp_rank(rank_ctx *c, ts_process_group *pg) { return train(c->arg, pg, &c->r); }

static void test_ddp_accum(void) {
    ts_dataset *ds = make_dataset(96, 8);
    cfg one = {ds, 32, 1, 2, 0, 0.1, TS_STRATEGY_NONE, NULL, NULL, TS_F32, NULL}, ddp = one, unclipped = one;
    unclipped.clip = 0.0;
    ddp.batch = 4;
    ddp.accum = 4;
    ddp.kind = TS_STRATEGY_DDP;
    result a = {0}, u = {0};
    rank_ctx rk[2];
    CHECK_OK(train(&one, NULL, &a));
    CHECK_OK(train(&unclipped, NULL, &u));
    CHECK(max_diff(&a, &u) > 1e-4); /* clipping changed the run */
    if (run_ranks(2, ddp_rank, &ddp, rk)) {
        double w = max_diff(&a, &rk[0].r);
        fprintf(stderr, "  DDP 2 ranks x 4 x 4 (clip 0.1) vs one process x 32: max abs diff %.3g, %lld all-reduced "
                        "backward passes for %lld steps\n", w, (long long)rk[0].r.syncs, (long long)rk[0].r.steps);
        CHECK(w <= 1e-5);
        CHECK(rk[0].r.steps == 6 && rk[0].r.syncs == 6 && rk[1].r.syncs == 6); /* no_sync for 3 of every 4 */
        CHECK(memcmp(rk[0].r.params, rk[1].r.params, sizeof(float) * (size_t)a.nparams) == 0);
        fprintf(stderr, "  first step's gradient norm: %.6g (DDP) vs %.6g\n", rk[0].r.norm[0], a.norm[0]);
        CHECK(fabs(rk[0].r.norm[0] - a.norm[0]) <= 1e-5 * a.norm[0] && a.norm[0] > 0.1); /* it clipped */
        CHECK(rk[0].r.norm[0] == rk[1].r.norm[0]);
    }
    for (int i = 0; i < 2; i++) free(rk[i].r.params);
    free(a.params);
    free(u.params);
    ts_dataset_free(ds);
}

/* ---- the gradient calls ----------------------------------------------------------------------------- */
static ts_tensor *leaf_with_grad(int64_t n, const float *g) {
    ts_tensor *p = NULL, *gt = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, &n, &p));
    ts_tensor_set_requires_grad(p, true);
    gt = tu_tensor(1, &n, g);
    ts_tensor_set_grad(p, gt);
    ts_tensor_release(gt);
    return p;
}

static void test_clip_and_scale(void) {
    const float g1[3] = {3, 0, 0}, g2[2] = {0, 4};
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor *a = leaf_with_grad(3, g1), *b = leaf_with_grad(2, g2), *none = NULL;
    int64_t one = 1;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, &one, &none)); /* no gradient: skipped */
    CHECK_OK(ts_tensor_list_append(&l, "a", a));
    CHECK_OK(ts_tensor_list_append(&l, "none", none));
    CHECK_OK(ts_tensor_list_append(&l, "b", b));
    double norm = 0;
    CHECK_OK(ts_clip_grad_norm(&l, 10.0, &norm)); /* under the limit: unchanged */
    CHECK_NEAR(norm, 5.0, 1e-12);
    CHECK(ts_tensor_data_f32(ts_tensor_grad(a))[0] == 3.0f);
    CHECK_OK(ts_clip_grad_norm(&l, 1.0, &norm)); /* x 1 / (5 + 1e-6) */
    CHECK_NEAR(norm, 5.0, 1e-12);
    CHECK_NEAR(ts_tensor_data_f32(ts_tensor_grad(a))[0], 3.0 / (5.0 + 1e-6), 1e-7);
    CHECK_NEAR(ts_tensor_data_f32(ts_tensor_grad(b))[1], 4.0 / (5.0 + 1e-6), 1e-7);
    CHECK_OK(ts_clip_grad_norm(&l, 1.0, &norm));
    CHECK_NEAR(norm, 1.0, 1e-6);
    CHECK_STATUS(ts_clip_grad_norm(&l, 0.0, &norm), TS_ERR_INVALID_ARG);
    bool finite = false;
    CHECK_OK(ts_scale_grads(&l, 2.0f, &finite));
    CHECK(finite);
    CHECK_NEAR(ts_tensor_data_f32(ts_tensor_grad(b))[1], 8.0 / (5.0 + 1e-6), 3e-6); /* the second clip: x ~(1 - 8e-7) */
    ts_tensor_data_f32(ts_tensor_grad(a))[2] = INFINITY;
    CHECK_OK(ts_scale_grads(&l, 0.5f, &finite));
    CHECK(!finite);
    CHECK_OK(ts_clip_grad_norm(&l, 1.0, &norm)); /* an infinite norm: reported, nothing scaled */
    CHECK(isinf(norm));
    CHECK_NEAR(ts_tensor_data_f32(ts_tensor_grad(b))[1], 4.0 / (5.0 + 1e-6), 3e-6);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(none);
    ts_tensor_list_clear(&l);
}

/* Scaling rules (torch.amp.GradScaler's _amp_update_scale_): back off on overflow, grow after
 * growth_interval clean steps, never to infinity. */
static void test_grad_scaler_rules(void) {
    ts_grad_scaler gs = TS_GRAD_SCALER_INIT;
    gs.growth_interval = 3;
    CHECK_OK(ts_grad_scaler_check(&gs));
    ts_grad_scaler_update(&gs, false);
    ts_grad_scaler_update(&gs, false);
    CHECK(gs.scale == 65536.0f && gs.growth_tracker == 2);
    ts_grad_scaler_update(&gs, false);
    CHECK(gs.scale == 131072.0f && gs.growth_tracker == 0);
    ts_grad_scaler_update(&gs, false);
    ts_grad_scaler_update(&gs, true);
    CHECK(gs.scale == 65536.0f && gs.growth_tracker == 0);
    gs.scale = 3e38f;
    gs.growth_tracker = 2;
    ts_grad_scaler_update(&gs, false);
    CHECK(gs.scale == 3e38f && gs.growth_tracker == 0);
    gs.backoff_factor = 1.5f;
    CHECK_STATUS(ts_grad_scaler_check(&gs), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("backoff_factor");
    /* unscale: gradients / scale, overflow found */
    const float g[2] = {1024.0f, -2048.0f};
    ts_grad_scaler ok = TS_GRAD_SCALER_INIT;
    ok.scale = 1024.0f;
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor *p = leaf_with_grad(2, g);
    CHECK_OK(ts_tensor_list_append(&l, "p", p));
    bool inf = true;
    CHECK_OK(ts_grad_scaler_unscale(&ok, &l, &inf));
    CHECK(!inf && ts_tensor_data_f32(ts_tensor_grad(p))[1] == -2.0f);
    ts_tensor_data_f32(ts_tensor_grad(p))[0] = NAN;
    CHECK_OK(ts_grad_scaler_unscale(&ok, &l, &inf));
    CHECK(inf);
    ts_tensor_release(p);
    ts_tensor_list_clear(&l);
}

/* bfloat16 buckets: every rank ends with the same parameters, near the float32 run's but not equal to them */
/* float16 training (matmul operands rounded to float16) with dynamic loss scaling, through the trainer: at
 * torch's initial scale nothing overflows and the run stays near float32's; from 2^24 the scaled gradients
 * overflow float16 (65504) in the first steps, which are skipped while the scale halves (exactly), then it
 * trains; the checkpoint keeps the scale; the pipeline strategy is refused. */
static void test_fp16_loss_scaling(void) {
    ts_dataset *ds = make_dataset(96, 3);
    char path[512];
    snprintf(path, sizeof path, "%s/fp16.ckpt", tu_tmpdir());
    cfg c = {ds, 8, 1, 2, 0, 0, TS_STRATEGY_NONE, NULL, NULL, 0, NULL};
    result r32 = {0}, r16 = {0}, rbig = {0};
    CHECK_OK(train(&c, NULL, &r32));
    ts_grad_scaler gs = TS_GRAD_SCALER_INIT, big = TS_GRAD_SCALER_INIT;
    big.scale = 16777216.0f;
    CHECK_OK(ts_set_matmul_precision(TS_F16));
    c.scaler = &gs;
    CHECK_OK(train(&c, NULL, &r16));
    double d = max_diff(&r32, &r16);
    printf("fp16 + scale 65536: %lld steps, %lld skipped, max |fp16 - fp32| %.3g\n", (long long)r16.steps,
           (long long)r16.skipped, d);
    CHECK(r16.steps == 24 && r16.skipped == 0 && r16.loss_scale == 65536.0f);
    CHECK(d > 0 && d < 2e-2);
    c.scaler = &big;
    c.save = path;
    CHECK_OK(train(&c, NULL, &rbig));
    float want = 16777216.0f;
    for (int64_t i = 0; i < rbig.skipped; i++) want *= 0.5f;
    printf("fp16 from 2^24: %lld of %lld steps skipped, scale %g; max |result - fp32| %.3g\n", (long long)rbig.skipped,
           (long long)rbig.steps, (double)rbig.loss_scale, max_diff(&r32, &rbig));
    CHECK(rbig.skipped >= 2 && rbig.skipped <= 12 && rbig.loss_scale == want);
    ts_ckpt *ck = NULL;
    double saved = 0;
    CHECK_OK(ts_ckpt_load(path, &ck));
    if (ck) CHECK_OK(ts_ckpt_get_f64(ck, "train.loss_scale", &saved));
    CHECK(saved == (double)rbig.loss_scale);
    ts_ckpt_free(ck);
    /* the pipeline strategy cannot scale its loss */
    c.save = NULL;
    c.kind = TS_STRATEGY_PIPELINE;
    result rp = {0};
    CHECK(train(&c, NULL, &rp) == TS_ERR_UNSUPPORTED);
    CHECK(strstr(rp.err, "pipeline") != NULL);
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    free(r32.params);
    free(r16.params);
    free(rbig.params);
    free(rp.params);
    ts_dataset_free(ds);
}

static void test_ddp_bf16_comm(void) {
    ts_dataset *ds = make_dataset(96, 9);
    cfg f32 = {ds, 8, 1, 2, 0, 0.0, TS_STRATEGY_DDP, NULL, NULL, TS_F32, NULL}, bf16 = f32;
    bf16.comm = TS_BF16;
    rank_ctx a[2], b[2];
    if (run_ranks(2, ddp_rank, &f32, a) && run_ranks(2, ddp_rank, &bf16, b)) {
        double w = max_diff(&a[0].r, &b[0].r), scale = 0;
        for (int64_t i = 0; i < a[0].r.nparams; i++) scale = fmax(scale, fabs((double)a[0].r.params[i]));
        fprintf(stderr, "  DDP 2 ranks, 12 steps: bfloat16 vs float32 communication, max abs diff %.3g (largest "
                        "parameter %.3g)\n", w, scale);
        CHECK(w > 0 && w <= 2e-2 * scale);
        CHECK(memcmp(b[0].r.params, b[1].r.params, sizeof(float) * (size_t)b[0].r.nparams) == 0);
    }
    for (int i = 0; i < 2; i++) {
        free(a[i].r.params);
        free(b[i].r.params);
    }
    ts_dataset_free(ds);
}

int main(int argc, char **argv) {
    ts_set_num_threads(1);
    static const tu_test tests[] = {
        T(test_accum_equals_big_batch), T(test_short_last_step), T(test_accum_resume), T(test_ddp_accum),
        T(test_clip_and_scale), T(test_grad_scaler_rules), T(test_ddp_bf16_comm), T(test_fp16_loss_scaling),
    };
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    return rc;
}
