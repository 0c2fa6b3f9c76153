/*
 * tests/test_train.c — the training layer (tessera/train.h): batch sources
 * (the world of one equals R ranks at batch B / R; seek; custom sources; the
 * pipeline source's sample indices), strategies (each equals the plain model
 * within 1e-5), evaluation (real rows only, labels checked), and the trainer
 * (resume is bit-identical, checkpoints every N steps, callbacks, errors), and
 * DDP through the trainer on ranks as threads (equals one process at the global
 * batch; a resumed DDP run equals an uninterrupted one bit for bit). The trainer's
 * runs without a strategy and its DDP ranks train on TS_TEST_DEVICE (train_fixtures.h).
 */
#include "test_util.h"
#include "rank_threads.h"

#include <sys/stat.h>

#include "train_fixtures.h"

static ts_batch_source *dataset_source(ts_dataset *ds, int64_t batch, int rank, int world, bool shuffle) {
    ts_dataset_source_opts o = TS_DATASET_SOURCE_OPTS_INIT;
    o.batch_size = batch;
    o.seed = 11;
    o.rank = rank;
    o.world_size = world;
    o.shuffle = shuffle;
    ts_batch_source *s = NULL;
    CHECK_OK(ts_batch_source_dataset(ds, &o, &s));
    return s;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* World 1 at batch 8 and world 2 at batch 4 per rank see the same samples in every step (the
 * padded repeat of rank 1's last batch aside), and every row holds its sample's data. */
static void test_dataset_source_world_of_one(void) {
    ts_dataset *ds = make_dataset(103, 1);
    ts_batch_source *w1 = dataset_source(ds, 8, 0, 1, true);
    ts_batch_source *r0 = dataset_source(ds, 4, 0, 2, true), *r1 = dataset_source(ds, 4, 1, 2, true);
    CHECK(ts_batch_source_num_batches(w1, 0) == 13 && ts_batch_source_num_batches(r0, 0) == 13);
    CHECK(ts_batch_source_num_samples(r1) == 103);
    int64_t shape[TS_MAX_DIMS];
    CHECK(ts_batch_source_sample_shape(w1, shape) == 3 && shape[0] == 1 && shape[1] == 4 && shape[2] == 4);
    ts_tensor *dx = NULL;
    CHECK_OK(ts_dataset_tensors(ds, &dx, NULL));
    for (int epoch = 0; epoch < 2; epoch++) {
        CHECK_OK(ts_batch_source_set_epoch(w1, epoch));
        CHECK_OK(ts_batch_source_set_epoch(r0, epoch));
        CHECK_OK(ts_batch_source_set_epoch(r1, epoch));
        int64_t seen = 0, padded = 0;
        for (int64_t k = 0;; k++) {
            ts_batch a, b, c;
            CHECK_OK(ts_batch_source_next(w1, &a));
            CHECK_OK(ts_batch_source_next(r0, &b));
            CHECK_OK(ts_batch_source_next(r1, &c));
            if (!a.x) {
                CHECK(!b.x && !c.x);
                break;
            }
            CHECK(a.index == k && a.epoch == epoch && b.index == k);
            int64_t want[8], got[8], n = 0;
            for (int64_t i = 0; i < a.real; i++) want[i] = a.samples[i];
            for (int64_t i = 0; i < b.real; i++) got[n++] = b.samples[i];
            for (int64_t i = 0; i < c.real; i++) got[n++] = c.samples[i];
            padded += (b.size - b.real) + (c.size - c.real);
            CHECK(n == a.real && a.real == a.size);
            qsort(want, (size_t)a.real, sizeof *want, cmp_i64);
            qsort(got, (size_t)n, sizeof *got, cmp_i64);
            CHECK(memcmp(want, got, sizeof *got * (size_t)n) == 0);
            const float *px = ts_tensor_data_f32(a.x), *all = ts_tensor_data_f32(dx);
            for (int64_t i = 0; i < a.size; i++) CHECK(memcmp(px + i * D, all + a.samples[i] * D, sizeof(float) * D) == 0);
            seen += a.real;
        }
        CHECK(seen == 103);
        CHECK(padded == 1); /* 103 over 2 ranks: rank 1 repeats one sample */
    }
    ts_batch_source_free(w1);
    ts_batch_source_free(r0);
    ts_batch_source_free(r1);
    ts_dataset_free(ds);
}

static void test_source_seek(void) {
    ts_dataset *ds = make_dataset(50, 2);
    ts_batch_source *s = dataset_source(ds, 8, 0, 1, true);
    int64_t order[2][56];
    for (int e = 0; e < 2; e++) {
        CHECK_OK(ts_batch_source_set_epoch(s, e));
        ts_batch b;
        for (int k = 0; k < 7; k++) {
            CHECK_OK(ts_batch_source_next(s, &b));
            memcpy(order[e] + 8 * k, b.samples, sizeof(int64_t) * (size_t)b.size);
        }
        CHECK_OK(ts_batch_source_next(s, &b));
        CHECK(!b.x && b.index == 7); /* the end of the epoch, and it stays there */
        CHECK_OK(ts_batch_source_next(s, &b));
        CHECK(!b.x && ts_batch_source_batch_index(s) == 7);
    }
    CHECK(memcmp(order[0], order[1], sizeof(int64_t) * 50) != 0); /* a new shuffle each epoch */
    CHECK_OK(ts_batch_source_seek(s, 1, 5));
    CHECK(ts_batch_source_epoch(s) == 1 && ts_batch_source_batch_index(s) == 5);
    ts_batch b;
    CHECK_OK(ts_batch_source_next(s, &b));
    CHECK(b.epoch == 1 && b.index == 5 && b.size == 8 && memcmp(b.samples, order[1] + 40, sizeof(int64_t) * 8) == 0);
    CHECK_OK(ts_batch_source_next(s, &b));
    CHECK(b.size == 2 && memcmp(b.samples, order[1] + 48, sizeof(int64_t) * 2) == 0);
    CHECK_STATUS(ts_batch_source_seek(s, 0, 8), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("past its 7 batches");
    /* without shuffle: 0..N-1 in order */
    ts_batch_source *u = dataset_source(ds, 16, 0, 1, false);
    CHECK_OK(ts_batch_source_next(u, &b));
    for (int64_t i = 0; i < b.size; i++) CHECK(b.samples[i] == i);
    ts_batch_source_free(u);
    ts_batch_source_free(s);
    ts_dataset_free(ds);
}

/* A source of our own: batches of a constant, counted. */
typedef struct counter_src {
    int64_t epoch, next, nb;
    ts_tensor *x, *y;
    int64_t idx[2];
    int *destroyed;
} counter_src;
static int64_t cs_nb(void *impl, int64_t e) { return ((counter_src *)impl)->nb + e; }
static int64_t cs_ns(void *impl) { return 2 * ((counter_src *)impl)->nb; }
static ts_status cs_seek(void *impl, int64_t e, int64_t b) {
    counter_src *c = impl;
    c->epoch = e;
    c->next = b;
    return TS_OK;
}
static ts_status cs_next(void *impl, ts_batch *out) {
    counter_src *c = impl;
    if (c->next >= c->nb + c->epoch) return TS_OK;
    c->idx[0] = 2 * c->next;
    c->idx[1] = 2 * c->next + 1;
    c->next++;
    out->x = c->x;
    out->y = c->y;
    out->size = out->real = 2;
    out->samples = c->idx;
    return TS_OK;
}
static void cs_destroy(void *impl) {
    counter_src *c = impl;
    (*c->destroyed)++;
    ts_tensor_release(c->x);
    ts_tensor_release(c->y);
    free(c);
}
static const ts_batch_source_ops cs_ops = {cs_nb, cs_ns, cs_seek, cs_next, NULL, cs_destroy, NULL, NULL};
static const ts_batch_source_ops cs_bad_ops = {cs_nb, cs_ns, NULL, cs_next, NULL, cs_destroy, NULL, NULL};

static void test_custom_source(void) {
    int destroyed = 0;
    counter_src *c = calloc(1, sizeof *c);
    c->nb = 3;
    c->destroyed = &destroyed;
    ts_batch_source *s = NULL;
    CHECK_STATUS(ts_batch_source_new(&cs_bad_ops, c, &s), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("seek");
    CHECK(destroyed == 1 && !s); /* the implementation is freed on failure too */
    c = calloc(1, sizeof *c);
    c->nb = 3;
    c->destroyed = &destroyed;
    int64_t xs[2] = {2, 3}, n = 2;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 2, xs, &c->x));
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 1, &n, &c->y));
    CHECK_OK(ts_batch_source_new(&cs_ops, c, &s));
    int64_t shape[TS_MAX_DIMS];
    CHECK(ts_batch_source_sample_shape(s, shape) == 0);
    CHECK_OK(ts_batch_source_seek(s, 1, 2));
    ts_batch b;
    int got = 0;
    for (;;) {
        CHECK_OK(ts_batch_source_next(s, &b));
        if (!b.x) break;
        CHECK(b.epoch == 1 && b.index == 2 + got && b.samples[0] == 2 * (2 + got));
        got++;
    }
    CHECK(got == 2); /* epoch 1 has 4 batches; started at 2 */
    ts_batch_source_free(s);
    CHECK(destroyed == 2);
}

/* The pipeline source over Fashion-MNIST's IDX files: every row's label is its sample's, and a seek
 * lands on the batch an uninterrupted pass yields there. */
static void test_pipeline_source(void) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        fprintf(stderr, "  (no %s: pipeline source not checked)\n", dir);
        return;
    }
    ts_batch_source *s[2] = {NULL, NULL};
    ts_pipeline *pp[2] = {NULL, NULL}; /* owned by the sources */
    for (int i = 0; i < 2; i++) {
        ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
        o.reader.idx_dir = dir;
        o.reader.idx_split = "test";
        o.reader.random_shuffle = true;
        o.reader.seed = 5;
        o.batch_size = 16;
        o.color = TS_COLOR_GRAY;
        o.out_width = o.out_height = 28;
        ts_pipeline *p = NULL;
        CHECK_OK(ts_pipeline_new(&o, &p));
        pp[i] = p;
        CHECK_OK(ts_batch_source_pipeline(p, &s[i]));
    }
    if (!s[0] || !s[1]) return;
    CHECK(ts_batch_source_num_samples(s[0]) == 10000 && ts_batch_source_num_batches(s[0], 0) == 625);
    int64_t shape[TS_MAX_DIMS];
    CHECK(ts_batch_source_sample_shape(s[0], shape) == 3 && shape[0] == 1 && shape[1] == 28);
    int64_t idx3[16];
    ts_batch b;
    for (int k = 0; k < 4; k++) {
        CHECK_OK(ts_batch_source_next(s[0], &b));
        CHECK(b.size == 16 && b.real == 16 && b.index == k);
        const int64_t *y = ts_tensor_data(b.y);
        int wrong = 0;
        for (int64_t i = 0; i < b.size; i++) wrong += y[i] != ts_reader_label(ts_pipeline_reader(pp[0]), b.samples[i]);
        CHECK(wrong == 0);
        if (k == 3) memcpy(idx3, b.samples, sizeof idx3);
    }
    CHECK_OK(ts_batch_source_seek(s[1], 0, 3));
    CHECK_OK(ts_batch_source_next(s[1], &b));
    CHECK(b.index == 3 && memcmp(b.samples, idx3, sizeof idx3) == 0);
    ts_batch_source_free(s[0]);
    ts_batch_source_free(s[1]);
}

/* Three SGD steps of every strategy over two devices equal the plain model's within 1e-5. */
static void test_strategies_equal_plain(void) {
    ts_dataset *ds = make_dataset(64, 3);
    ts_tensor_list ref = TS_TENSOR_LIST_INIT;
    for (int k = TS_STRATEGY_NONE; k < TS_STRATEGY_COUNT; k++) {
        if (k == TS_STRATEGY_DDP) continue; /* tests/test_ddp.c and tests/cli_ddp.sh */
        ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
        so.kind = (ts_strategy_kind)k;
        so.micro_batches = 3;
        so.sample_ndim = 3;
        so.sample_shape[0] = 1;
        so.sample_shape[1] = so.sample_shape[2] = 4;
        ts_strategy *s = NULL;
        CHECK_OK(ts_strategy_new(make_model(9), &so, &s));
        if (!s) continue;
        ts_tensor_list params = TS_TENSOR_LIST_INIT;
        ts_optimizer *opt = NULL;
        CHECK_OK(ts_module_parameters(ts_strategy_model(s), &params));
        CHECK_OK(ts_optimizer_by_name("sgd", &params, 0.1, 0.9, 1e-4, &opt));
        ts_batch_source *src = dataset_source(ds, 16, 0, 1, true);
        ts_strategy_train(s, true);
        for (int step = 0; step < 3; step++) {
            ts_batch b;
            float loss = 0;
            CHECK_OK(ts_batch_source_next(src, &b));
            CHECK_OK(ts_train_step(s, opt, b.x, b.y, 0.0f, &loss));
            CHECK(isfinite(loss) && loss > 0);
        }
        ts_tensor_list sd = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_module_state_dict(ts_strategy_model(s), &sd));
        CHECK(sd.n == 4 && strcmp(sd.names[0], "1.weight") == 0); /* the plain model's keys */
        if (k == TS_STRATEGY_NONE) {
            for (int i = 0; i < sd.n; i++) {
                ts_tensor *c = NULL;
                CHECK_OK(ts_tensor_clone(sd.tensors[i], &c));
                CHECK_OK(ts_tensor_list_append(&ref, sd.names[i], c));
                ts_tensor_release(c);
            }
        } else {
            double worst = 0;
            for (int i = 0; i < sd.n && i < ref.n; i++) {
                ts_tensor *h = NULL;
                CHECK_OK(ts_to_device(sd.tensors[i], ts_device_cpu(), &h));
                worst = fmax(worst, tu_max_abs_diff(h, ts_tensor_data_f32(ref.tensors[i])));
                ts_tensor_release(h);
            }
            char desc[512];
            ts_strategy_describe(s, desc, sizeof desc);
            fprintf(stderr, "  %-8s vs none: max abs diff %.3g (%s)\n", ts_strategy_kind_name(so.kind), worst, desc);
            CHECK(worst <= 1e-5);
            ts_device *devs[4];
            CHECK(ts_strategy_devices(s, devs, 4) == ts_cpu_device_count());
        }
        ts_tensor_list_clear(&sd);
        ts_batch_source_free(src);
        ts_optimizer_free(opt);
        ts_tensor_list_clear(&params);
        ts_strategy_free(s);
    }
    ts_tensor_list_clear(&ref);
    ts_dataset_free(ds);
}

static void test_strategy_errors(void) {
    ts_strategy_kind k;
    CHECK_STATUS(ts_strategy_kind_parse("warp", &k), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("none, ddp, data, model, pipeline, tile");
    for (int i = 0; i < TS_STRATEGY_COUNT; i++) {
        CHECK_OK(ts_strategy_kind_parse(ts_strategy_kind_name((ts_strategy_kind)i), &k));
        CHECK((int)k == i && ts_strategy_kind_help(k));
    }
    CHECK(ts_strategy_kind_name(TS_STRATEGY_COUNT) == NULL);
    ts_strategy *s = NULL;
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.size = 3; /* not from the macro: refused, and the model is freed (ASan checks) */
    CHECK_STATUS(ts_strategy_new(make_model(1), &so, &s), TS_ERR_INVALID_ARG);
    so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_DDP; /* no process group */
    CHECK_STATUS(ts_strategy_new(make_model(1), &so, &s), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ddp");
    so.kind = TS_STRATEGY_PIPELINE; /* a device without a worker */
    ts_device *cpu = ts_device_cpu();
    so.devices = &cpu;
    so.num_devices = 1;
    CHECK_STATUS(ts_strategy_new(make_model(1), &so, &s), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("--strategy pipeline");
    CHECK(!s);
}

/* One-hot samples and an identity model: every prediction is right and the loss is known. */
static void test_evaluate(void) {
    int64_t n = 7, xs[2] = {7, C}, ys = 7;
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 2, xs, &x));
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &ys, &y));
    for (int64_t i = 0; i < n; i++) {
        ts_tensor_data_f32(x)[i * C + i % C] = 1.0f;
        ((int64_t *)ts_tensor_data(y))[i] = i % C;
    }
    ts_dataset *ds = NULL;
    CHECK_OK(ts_dataset_from_tensors(x, y, &ds));
    ts_module *lin = NULL;
    CHECK_OK(ts_nn_linear_new(C, C, true, NULL, &lin));
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(lin, &sd));
    float *w = ts_tensor_data_f32(sd.tensors[0]), *b = ts_tensor_data_f32(sd.tensors[1]);
    for (int i = 0; i < C * C; i++) w[i] = i % (C + 1) == 0 ? 1.0f : 0.0f;
    for (int i = 0; i < C; i++) b[i] = 0.0f;
    ts_tensor_list_clear(&sd);
    /* rank 1 of 2 gets samples at odd positions: 3 real and 1 repeat */
    ts_batch_source *src = dataset_source(ds, 3, 1, 2, false);
    ts_eval_result r;
    CHECK_OK(ts_evaluate(lin, src, &r));
    CHECK(r.samples == 3 && r.correct == 3 && r.accuracy == 1.0);
    CHECK_NEAR(r.loss, log(exp(1.0) + C - 1) - 1.0, 1e-6);
    CHECK(!ts_module_is_training(lin));
    ((int64_t *)ts_tensor_data(y))[3] = C; /* a label the model has no class for */
    CHECK_STATUS(ts_evaluate(lin, src, &r), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("sample 3");
    ts_batch_source_free(src);
    ts_module_free(lin);
    ts_dataset_free(ds);
    ts_tensor_release(x);
    ts_tensor_release(y);
}

/* ---- the trainer ---------------------------------------------------------------------------------- */
typedef struct counts {
    int steps, epochs, checkpoints, stop_at;
    int64_t last_step, eval_samples;
} counts;

static ts_status count_events(const ts_train_event *ev, void *user) {
    counts *c = user;
    if (ev->kind == TS_TRAIN_STEP) {
        c->steps++;
        c->last_step = ev->step;
        if (c->stop_at && ev->step == c->stop_at) return ts_error(TS_ERR_STATE, "stopped by the test at %lld", (long long)ev->step);
    } else if (ev->kind == TS_TRAIN_EPOCH_END) {
        c->epochs++;
        if (ev->eval) c->eval_samples = ev->eval->samples;
    } else {
        c->checkpoints++;
    }
    return TS_OK;
}

typedef struct run {
    ts_strategy *s;
    ts_optimizer *opt;
    ts_batch_source *train, *eval;
    ts_trainer *t;
    ts_tensor_list params;
    counts c;
    ts_device *dev; /* where the model trains (TS_TEST_DEVICE) */
    ts_rng rng;     /* the trainer's generator (saved as train.rng) */
} run;

static void run_open(run *r, ts_dataset *ds, ts_dataset *test, const char *ckpt, int64_t max_steps,
                     int64_t every, const char *model_name) {
    memset(r, 0, sizeof *r);
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    tf_place(&so, &r->dev);
    CHECK_OK(ts_strategy_new(make_model(4), &so, &r->s));
    CHECK_OK(ts_module_parameters(ts_strategy_model(r->s), &r->params));
    CHECK_OK(ts_optimizer_by_name("sgd", &r->params, 0.2, 0.9, 5e-4, &r->opt));
    r->train = dataset_source(ds, 8, 0, 1, true);
    r->eval = dataset_source(test, 16, 0, 1, false);
    ts_lr_schedule sched;
    CHECK_OK(ts_lr_schedule_by_name("cosine", 0.2, 3 * 13, 13, &sched));
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = 3;
    to.max_steps = max_steps;
    to.schedule = &sched;
    to.eval = r->eval;
    to.checkpoint = ckpt;
    to.checkpoint_every = every;
    to.callback = count_events;
    to.user = &r->c;
    to.model_name = model_name;
    to.optimizer_name = "sgd";
    to.seed = 11;
    to.batch_size = 8;
    ts_rng_seed(&r->rng, 11);
    to.rng = &r->rng;
    CHECK_OK(ts_trainer_new(r->s, r->opt, r->train, &to, &r->t));
}

static void run_close(run *r) {
    ts_trainer_free(r->t);
    ts_optimizer_free(r->opt);
    ts_tensor_list_clear(&r->params);
    ts_strategy_free(r->s);
    ts_batch_source_free(r->train);
    ts_batch_source_free(r->eval);
}

static bool same_params(run *a, run *b) {
    int64_t na = 0, nb = 0;
    ts_status sa, sb;
    float *pa = tf_params_host(&a->params, a->dev, &na, &sa), *pb = tf_params_host(&b->params, b->dev, &nb, &sb);
    CHECK(sa == TS_OK && sb == TS_OK);
    bool same = pa && pb && na == nb && memcmp(pa, pb, sizeof(float) * (size_t)na) == 0;
    free(pa);
    free(pb);
    return same;
}

static void test_trainer_resume_bit_identical(void) {
    ts_dataset *ds = make_dataset(100, 5), *test = make_dataset(40, 6);
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/t.ckpt", tu_tmpdir());
    run a, b, c;
    ts_train_result ra, rb, rc;
    run_open(&a, ds, test, NULL, 0, 0, "tiny"); /* straight: 3 epochs of 13 steps */
    CHECK_OK(ts_trainer_run(a.t, &ra));
    CHECK(ra.steps == 39 && ra.epochs == 3 && a.c.steps == 39 && a.c.epochs == 3 && a.c.checkpoints == 0);
    CHECK(ra.images == 300 && ra.eval.samples == 40 && a.c.eval_samples == 40);
    fprintf(stderr, "  test accuracy after 3 epochs %.3f, loss %.4f\n", ra.eval.accuracy, ra.eval.loss);
    CHECK(ra.eval.accuracy > 0.35 && ra.eval.loss < log(C)); /* better than chance (0.2, ln 5) */
    run_open(&b, ds, test, ckpt, 17, 5, "tiny"); /* stops in epoch 2; checkpoints at 5, 10, 13 (epoch end), 15, 17 */
    CHECK_OK(ts_trainer_run(b.t, &rb));
    CHECK(rb.steps == 17 && rb.epochs == 1 && b.c.checkpoints == 5 && b.c.epochs == 2);
    ts_train_checkpoint_info info;
    CHECK_OK(ts_train_checkpoint_read(ckpt, &info));
    CHECK(info.epoch == 1 && info.batch == 4 && info.step == 17 && info.seed == 11 && info.batch_size == 8);
    CHECK(strcmp(info.model, "tiny") == 0 && strcmp(info.optimizer, "sgd") == 0 && info.world_size == 1);
    run_open(&c, ds, test, NULL, 0, 0, "tiny");
    CHECK_OK(ts_trainer_resume(c.t, ckpt));
    CHECK(ts_trainer_step(c.t) == 17 && ts_trainer_epoch(c.t) == 1);
    CHECK_OK(ts_trainer_run(c.t, &rc));
    CHECK(rc.steps == 39 && c.c.steps == 22 && rc.images == 22 * 8 - 4 * 2); /* two short final batches of 4 */
    CHECK(same_params(&a, &c));
    CHECK(rc.final_loss == ra.final_loss);
    CHECK(!same_params(&a, &b));
    /* a resumed run that is already over only evaluates */
    run d;
    run_open(&d, ds, test, NULL, 0, 0, "tiny");
    CHECK_OK(ts_trainer_save(a.t, ckpt));
    CHECK_OK(ts_trainer_resume(d.t, ckpt));
    ts_train_result rd;
    CHECK_OK(ts_trainer_run(d.t, &rd));
    CHECK(rd.steps == 39 && d.c.steps == 0 && rd.eval.samples == 40 && rd.eval.accuracy == ra.eval.accuracy);
    run_close(&a);
    run_close(&b);
    run_close(&c);
    run_close(&d);
    ts_dataset_free(ds);
    ts_dataset_free(test);
}

static void test_trainer_errors(void) {
    ts_dataset *ds = make_dataset(100, 5), *test = make_dataset(40, 6);
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/e.ckpt", tu_tmpdir());
    run a, b;
    run_open(&a, ds, test, ckpt, 3, 0, "tiny");
    CHECK_OK(ts_trainer_run(a.t, NULL));
    run_open(&b, ds, test, NULL, 0, 0, "other");
    CHECK_STATUS(ts_trainer_resume(b.t, ckpt), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("written with model tiny, this run has model other");
    CHECK(ts_trainer_step(b.t) == 0);
    run_close(&b);
    /* a callback's error stops the run and is returned */
    run_open(&b, ds, test, NULL, 0, 0, "tiny");
    b.c.stop_at = 4;
    CHECK_STATUS(ts_trainer_run(b.t, NULL), TS_ERR_STATE);
    CHECK_ERR_MENTIONS("stopped by the test at 4");
    CHECK(b.c.steps == 4);
    run_close(&b);
    /* a loss that is not finite fails the run naming the step */
    ts_tensor *x = NULL;
    CHECK_OK(ts_dataset_tensors(ds, &x, NULL));
    for (int64_t i = 0; i < ts_tensor_numel(x); i++) ts_tensor_data_f32(x)[i] = 1e30f; /* logits overflow */
    run_open(&b, ds, test, NULL, 0, 0, "tiny");
    CHECK_STATUS(ts_trainer_run(b.t, NULL), TS_ERR_STATE);
    CHECK_ERR_MENTIONS("the loss became");
    run_close(&b);
    /* options must come from the macro */
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = 0;
    ts_trainer *t = NULL;
    CHECK_STATUS(ts_trainer_new(a.s, a.opt, a.train, &to, &t), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_train_checkpoint_read("/nonexistent/x.ckpt", NULL), TS_ERR_INVALID_ARG);
    run_close(&a);
    ts_dataset_free(ds);
    ts_dataset_free(test);
}

/* A checkpoint folder keeps the newest `keep` files; the newest complete one is found, a damaged one skipped. */
static void test_checkpoint_dir(void) {
    ts_dataset *ds = make_dataset(100, 5), *test = make_dataset(40, 6);
    char dir[512], latest[4096];
    snprintf(dir, sizeof dir, "%s/ckdir", tu_tmpdir());
    bool found = true;
    CHECK_OK(ts_train_checkpoint_latest(dir, latest, sizeof latest, &found)); /* no folder yet: nothing */
    CHECK(!found);
    run a;
    run_open(&a, ds, test, NULL, 17, 5, "tiny");
    ts_trainer_free(a.t);
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = 3;
    to.max_steps = 17;
    to.checkpoint_dir = dir; /* created by ts_trainer_new */
    to.keep = 2;
    to.checkpoint_every = 5;
    to.callback = count_events;
    to.user = &a.c;
    to.seed = 11;
    to.batch_size = 8;
    CHECK_OK(ts_trainer_new(a.s, a.opt, a.train, &to, &a.t));
    CHECK_OK(ts_trainer_run(a.t, NULL));
    CHECK(a.c.checkpoints == 5); /* steps 5, 10, 13 (epoch end), 15, 17 */
    CHECK_OK(ts_train_checkpoint_latest(dir, latest, sizeof latest, &found));
    CHECK(found && strstr(latest, "step-000000000017.ckpt"));
    char older[4096];
    snprintf(older, sizeof older, "%s/step-000000000015.ckpt", dir);
    struct stat sb;
    CHECK(stat(older, &sb) == 0);
    snprintf(older, sizeof older, "%s/step-000000000013.ckpt", dir);
    CHECK(stat(older, &sb) != 0); /* pruned: keep 2 */
    /* a damaged newest file (a crash would leave the old one, but a disk can lose one) is skipped */
    FILE *f = fopen(latest, "r+b");
    if (f) {
        fseek(f, 200, SEEK_SET);
        fputc(0x5a, f);
        fclose(f);
    }
    CHECK_OK(ts_train_checkpoint_latest(dir, latest, sizeof latest, &found));
    CHECK(found && strstr(latest, "step-000000000015.ckpt"));
    /* a file where the folder should be */
    char notdir[600];
    snprintf(notdir, sizeof notdir, "%s/step-000000000015.ckpt", dir);
    to.checkpoint_dir = notdir;
    ts_trainer *t2 = NULL;
    CHECK_STATUS(ts_trainer_new(a.s, a.opt, a.train, &to, &t2), TS_ERR_IO);
    CHECK_ERR_MENTIONS("is not a folder");
    run_close(&a);
    ts_dataset_free(ds);
    ts_dataset_free(test);
}

/* ---- hostile checkpoints and bad paths ------------------------------------------------------------- */
/* A copy of src without the entry `skip` (any kind), with `mod` applied to it before saving. */
static void copy_ckpt(const char *from, const char *to, const char *skip, void (*mod)(ts_ckpt *)) {
    ts_ckpt *a = NULL, *b = ts_ckpt_new();
    CHECK_OK(ts_ckpt_load(from, &a));
    if (!a || !b) return;
    ts_tensor_list all = TS_TENSOR_LIST_INIT, keep = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_ckpt_get_tensors(a, NULL, &all));
    for (int i = 0; i < all.n; i++)
        if (!skip || strcmp(all.names[i], skip) != 0) CHECK_OK(ts_tensor_list_append(&keep, all.names[i], all.tensors[i]));
    CHECK_OK(ts_ckpt_add_tensors(b, NULL, &keep));
    for (int k = TS_CKPT_I64; k <= TS_CKPT_BYTES; k++)
        for (int i = 0; i < ts_ckpt_count(a, (ts_ckpt_kind)k); i++) {
            const char *n = ts_ckpt_name(a, (ts_ckpt_kind)k, i);
            if (skip && strcmp(n, skip) == 0) continue;
            if (k == TS_CKPT_I64) {
                int64_t v;
                CHECK_OK(ts_ckpt_get_i64(a, n, &v));
                CHECK_OK(ts_ckpt_set_i64(b, n, v));
            } else if (k == TS_CKPT_F64) {
                double v;
                CHECK_OK(ts_ckpt_get_f64(a, n, &v));
                CHECK_OK(ts_ckpt_set_f64(b, n, v));
            } else {
                const void *p;
                size_t len;
                CHECK_OK(ts_ckpt_get_bytes(a, n, &p, &len));
                CHECK_OK(ts_ckpt_set_bytes(b, n, p, len));
            }
        }
    if (mod) mod(b);
    CHECK_OK(ts_ckpt_save(b, to));
    ts_tensor_list_clear(&all);
    ts_tensor_list_clear(&keep);
    ts_ckpt_free(a);
    ts_ckpt_free(b);
}

static void mod_nan(ts_ckpt *ck) { ts_tensor_data_f32(ts_ckpt_find_tensor(ck, "model.3.weight"))[7] = NAN; }
static void mod_inf_state(ts_ckpt *ck) {
    ts_tensor_data_f32(ts_ckpt_find_tensor(ck, "optim.1.bias.momentum_buffer"))[0] = -INFINITY;
}
static void mod_step_max(ts_ckpt *ck) { CHECK_OK(ts_ckpt_set_i64(ck, "train.step", INT64_MAX)); }
static void mod_epoch_neg(ts_ckpt *ck) { CHECK_OK(ts_ckpt_set_i64(ck, "train.epoch", -1)); }
static void mod_world(ts_ckpt *ck) { CHECK_OK(ts_ckpt_set_i64(ck, "train.world_size", 0)); }
static void mod_model_name(ts_ckpt *ck) { CHECK_OK(ts_ckpt_set_bytes(ck, "train.model", "ti\x1b[2Jny", 8)); }
static void mod_rng_zero(ts_ckpt *ck) {
    ts_rng z;
    memset(&z, 0, sizeof z);
    CHECK_OK(ts_ckpt_set_bytes(ck, "train.rng", &z, sizeof z));
}
static void mod_lineage(ts_ckpt *ck) { CHECK_OK(ts_ckpt_set_bytes(ck, "train.lineage", "short", 5)); }
static void mod_optim_step(ts_ckpt *ck) { /* the optimizer's step count as a float with a fraction */
    ts_tensor *t = ts_ckpt_find_tensor(ck, "optim.step");
    ((int64_t *)ts_tensor_data(t))[0] = -5;
}

/* Every forged checkpoint is refused with a message naming what is wrong, and changes nothing. */
static void test_resume_refuses_forged_checkpoints(void) {
    ts_dataset *ds = make_dataset(100, 5), *test = make_dataset(40, 6);
    char ckpt[512], bad[512];
    snprintf(ckpt, sizeof ckpt, "%s/good.ckpt", tu_tmpdir());
    snprintf(bad, sizeof bad, "%s/bad.ckpt", tu_tmpdir());
    run a, b;
    run_open(&a, ds, test, ckpt, 3, 0, "tiny"); /* 3 SGD steps with momentum: every parameter has a buffer */
    CHECK_OK(ts_trainer_run(a.t, NULL));
    struct {
        const char *skip;
        void (*mod)(ts_ckpt *);
        ts_status st;
        const char *msg;
    } cases[] = {
        {NULL, mod_nan, TS_ERR_FORMAT, "tensor 'model.3.weight' holds a NaN or infinite value at element 7"},
        {NULL, mod_inf_state, TS_ERR_FORMAT, "'optim.1.bias.momentum_buffer' holds a NaN or infinite value"},
        {"optim.3.weight.momentum_buffer", NULL, TS_ERR_FORMAT, "took 3 steps but '3.weight' has no '3.weight.momentum_buffer'"},
        {NULL, mod_step_max, TS_ERR_FORMAT, "train.step is 9223372036854775807, outside [0, 2^40]"},
        {NULL, mod_epoch_neg, TS_ERR_FORMAT, "train.epoch is -1"},
        {NULL, mod_world, TS_ERR_FORMAT, "train.world_size is 0"},
        {NULL, mod_model_name, TS_ERR_INVALID_ARG, "written with model ti\\x1b[2Jny, this run has model tiny"},
        {NULL, mod_optim_step, TS_ERR_FORMAT, "'step' is -5, not a step count"},
        {"train.step", NULL, TS_ERR_FORMAT, "is not a training checkpoint (no train.step)"},
        {"train.rng", NULL, TS_ERR_FORMAT, "no train.rng: a training checkpoint always has it"},
        {"optim.lr", NULL, TS_ERR_FORMAT, "no optim.lr: a training checkpoint always has it"},
        {"optim.step", NULL, TS_ERR_FORMAT, "no optim.step"},
        {"train.world_size", NULL, TS_ERR_FORMAT, "no train.world_size"},
        {NULL, mod_rng_zero, TS_ERR_FORMAT, "train.rng is all zeros, not a generator state"},
        {NULL, mod_lineage, TS_ERR_FORMAT, "train.lineage holds 5 bytes"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        copy_ckpt(ckpt, bad, cases[k].skip, cases[k].mod);
        run_open(&b, ds, test, NULL, 0, 0, "tiny");
        int64_t n0 = 0, n1 = 0;
        ts_status s0, s1;
        float *before = tf_params_host(&b.params, b.dev, &n0, &s0);
        CHECK_STATUS(ts_trainer_resume(b.t, bad), cases[k].st);
        CHECK_ERR_MENTIONS(cases[k].msg);
        CHECK_ERR_MENTIONS("bad.ckpt");
        CHECK(ts_trainer_step(b.t) == 0 && ts_trainer_epoch(b.t) == 0);
        float *after = tf_params_host(&b.params, b.dev, &n1, &s1);
        CHECK(before && after && n0 == n1 && memcmp(before, after, sizeof(float) * (size_t)n0) == 0); /* nothing loaded */
        free(before);
        free(after);
        CHECK(ts_optimizer_step_count(b.opt) == 0);
        run_close(&b);
    }
    /* the unmodified copy resumes */
    copy_ckpt(ckpt, bad, NULL, NULL);
    run_open(&b, ds, test, NULL, 0, 0, "tiny");
    CHECK_OK(ts_trainer_resume(b.t, bad));
    CHECK(ts_trainer_step(b.t) == 3);
    run_close(&b);
    run_close(&a);
    ts_dataset_free(ds);
    ts_dataset_free(test);
}

/* ts_optimizer_check_state: AdamW's moments and steps; frozen parameters need no state. */
static void test_optimizer_state_check(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    int64_t s2[1] = {2};
    ts_tensor *w = tu_rand(&r, 1, s2, -1, 1, true), *frozen = tu_rand(&r, 1, s2, -1, 1, false);
    ts_tensor_list params = TS_TENSOR_LIST_INIT, st = TS_TENSOR_LIST_INIT, part = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_tensor_list_append(&params, "w", w));
    CHECK_OK(ts_tensor_list_append(&params, "frozen", frozen));
    ts_adamw_config c = TS_ADAMW_CONFIG_INIT;
    ts_optimizer *o = NULL;
    CHECK_OK(ts_optim_adamw_new(&params, &c, &o));
    CHECK_OK(ts_optimizer_state(o, &st));
    CHECK_OK(ts_optimizer_check_state(o, &st)); /* no step yet: no state needed */
    ts_tensor_list_clear(&st);
    for (int k = 0; k < 2; k++) { /* two steps with a gradient for w only */
        ts_tensor *loss = NULL;
        CHECK_OK(ts_sum(w, &loss));
        CHECK_OK(ts_backward(loss, NULL, false));
        ts_tensor_release(loss);
        CHECK_OK(ts_optimizer_step(o));
        ts_optimizer_zero_grad(o);
    }
    CHECK_OK(ts_optimizer_state(o, &st));
    CHECK_OK(ts_optimizer_check_state(o, &st));
    for (int i = 0; i < st.n; i++) /* drop exp_avg_sq */
        if (!strstr(st.names[i], "exp_avg_sq")) CHECK_OK(ts_tensor_list_append(&part, st.names[i], st.tensors[i]));
    CHECK_STATUS(ts_optimizer_check_state(o, &part), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("'w' has no 'w.exp_avg_sq'");
    ts_tensor_list_clear(&part);
    for (int i = 0; i < st.n; i++) /* a per-parameter step above the optimizer's */
        if (strcmp(st.names[i], "w.step") == 0) ((int64_t *)ts_tensor_data(st.tensors[i]))[0] = 9;
    CHECK_STATUS(ts_optimizer_check_state(o, &st), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("'w.step' is 9, outside [1, 2]");
    ts_tensor_list_clear(&st);
    ts_tensor_list_clear(&params);
    ts_optimizer_free(o);
    ts_tensor_release(w);
    ts_tensor_release(frozen);
}

/* A checkpoint path that cannot work, an empty training source and an empty evaluation source fail
 * at once, naming the problem. */
static void test_trainer_checks_at_start(void) {
    ts_dataset *ds = make_dataset(40, 5), *test = make_dataset(10, 6);
    run a;
    run_open(&a, ds, test, NULL, 0, 0, "tiny");
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    ts_trainer *t = NULL;
    char p[512];
    snprintf(p, sizeof p, "%s/no/such/dir/x.ckpt", tu_tmpdir());
    to.checkpoint = p;
    CHECK_STATUS(ts_trainer_new(a.s, a.opt, a.train, &to, &t), TS_ERR_IO);
    CHECK_ERR_MENTIONS("no/such/dir: No such file or directory");
    CHECK(t == NULL);
    struct stat sb;
    if (stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode)) {
        to.checkpoint = "/dev/full";
        CHECK_STATUS(ts_trainer_new(a.s, a.opt, a.train, &to, &t), TS_ERR_IO);
        CHECK_ERR_MENTIONS("/dev/full: is a character device");
        CHECK(stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode));
    }
    snprintf(p, sizeof p, "%s/fifo.ckpt", tu_tmpdir());
    CHECK(mkfifo(p, 0600) == 0);
    to.checkpoint = p;
    CHECK_STATUS(ts_trainer_new(a.s, a.opt, a.train, &to, &t), TS_ERR_IO);
    CHECK_ERR_MENTIONS("FIFO");
    snprintf(p, sizeof p, "%s/ok.ckpt", tu_tmpdir());
    to.checkpoint = p;
    CHECK_OK(ts_trainer_new(a.s, a.opt, a.train, &to, &t));
    CHECK(stat(p, &sb) != 0); /* the check leaves nothing behind */
    ts_trainer_free(t);
    t = NULL;
    to.checkpoint = NULL;
    to.epochs = TS_TRAIN_MAX_COUNT + 1;
    CHECK_STATUS(ts_trainer_new(a.s, a.opt, a.train, &to, &t), TS_ERR_INVALID_ARG);
    to.epochs = 1;
    /* empty sources */
    int64_t zero = 0, xs[4] = {0, 1, 4, 4};
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_tensor_empty(NULL, TS_F32, 4, xs, &x));
    CHECK_OK(ts_tensor_empty(NULL, TS_I64, 1, &zero, &y));
    ts_dataset *empty = NULL;
    CHECK_OK(ts_dataset_from_tensors(x, y, &empty));
    ts_dataset_source_opts so = TS_DATASET_SOURCE_OPTS_INIT;
    ts_batch_source *es = NULL;
    CHECK_OK(ts_batch_source_dataset(empty, &so, &es));
    if (es) {
        CHECK_STATUS(ts_trainer_new(a.s, a.opt, es, &to, &t), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("the training source has no samples");
        ts_eval_result er;
        CHECK_STATUS(ts_evaluate(ts_strategy_module(a.s), es, &er), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("has no samples");
        ts_batch_source_free(es);
    }
    ts_dataset_free(empty);
    ts_tensor_release(x);
    ts_tensor_release(y);
    run_close(&a);
    ts_dataset_free(ds);
    ts_dataset_free(test);
}

/* ---- DDP through the trainer, ranks as threads ------------------------------------------------------ */
typedef struct ddp_cfg {
    ts_dataset *ds, *test;
    int64_t max_steps;
    const char *ckpt;   /* saved every 10 steps by rank 0 */
    const char *resume; /* NULL: from the start */
} ddp_cfg;

typedef struct rank_ctx rank_ctx;
struct rank_ctx {
    TU_RANK_FIELDS(rank_ctx);
    float *params; /* the model's parameters after the run, flattened */
    int64_t nparams, steps, eval_samples;
};
TU_RANK_THREADS(rank_ctx, run_ranks)

static ts_status ddp_rank(rank_ctx *c, ts_process_group *pg) {
    const ddp_cfg *cfg = c->arg;
    ts_strategy *s = NULL;
    ts_optimizer *opt = NULL;
    ts_trainer *t = NULL;
    ts_batch_source *train = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = c->world > 1 ? TS_STRATEGY_DDP : TS_STRATEGY_NONE; /* one rank: the plain model */
    so.pg = pg;
    ts_device *dev;
    tf_place(&so, &dev);
    ts_dataset_source_opts dso = TS_DATASET_SOURCE_OPTS_INIT;
    dso.batch_size = 8 / c->world;
    dso.seed = 11;
    dso.rank = c->rank;
    dso.world_size = c->world;
    ts_lr_schedule sched = ts_lr_cosine(0.2, 26, 0.0);
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = 2;
    to.max_steps = cfg->max_steps;
    to.schedule = &sched;
    to.checkpoint = cfg->ckpt;
    to.checkpoint_every = 10;
    to.seed = 11;
    to.batch_size = dso.batch_size;
    ts_train_result r;
    ts_batch_source *eval = NULL;
    ts_status st;
    TS_CHECK_GOTO_T(ts_strategy_new(make_model(4), &so, &s));
    TS_CHECK_GOTO_T(ts_module_parameters(ts_strategy_model(s), &params));
    TS_CHECK_GOTO_T(ts_optimizer_by_name("sgd", &params, 0.2, 0.9, 5e-4, &opt));
    TS_CHECK_GOTO_T(ts_batch_source_dataset(cfg->ds, &dso, &train));
    if (c->rank == 0) {
        ts_dataset_source_opts eo = TS_DATASET_SOURCE_OPTS_INIT;
        eo.shuffle = false;
        TS_CHECK_GOTO_T(ts_batch_source_dataset(cfg->test, &eo, &eval));
    }
    to.eval = eval;
    TS_CHECK_GOTO_T(ts_trainer_new(s, opt, train, &to, &t));
    if (cfg->resume) TS_CHECK_GOTO_T(ts_trainer_resume(t, cfg->resume));
    TS_CHECK_GOTO_T(ts_trainer_run(t, &r));
    c->steps = r.steps;
    c->eval_samples = r.eval.samples;
    c->params = tf_params_host(&params, dev, &c->nparams, &st);
fail:
    ts_trainer_free(t);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(eval);
    return st;
}

static void test_ddp_trainer(void) {
    ts_dataset *ds = make_dataset(100, 5), *test = make_dataset(40, 6);
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/ddp.ckpt", tu_tmpdir());
    rank_ctx a[2], b[2], c[2];
    ddp_cfg straight = {ds, test, 20, NULL, NULL}, first = {ds, test, 10, ckpt, NULL}, rest = {ds, test, 20, NULL, ckpt};
    ddp_cfg single = {ds, test, 20, NULL, NULL};
    rank_ctx w1[1], w1r[1];
    if (run_ranks(1, ddp_rank, &single, w1) && run_ranks(2, ddp_rank, &straight, a) &&
        run_ranks(2, ddp_rank, &first, b) && run_ranks(2, ddp_rank, &rest, c) &&
        run_ranks(1, ddp_rank, &rest, w1r)) { /* the 2-rank checkpoint goes on in one process at batch 8 */
        double cross = 0;
        for (int64_t i = 0; i < a[0].nparams; i++) cross = fmax(cross, fabs((double)a[0].params[i] - w1r[0].params[i]));
        fprintf(stderr, "  DDP world 2 to step 10, then one process to 20, vs world 2 throughout: %.3g\n", cross);
        CHECK(cross <= 1e-5 && w1r[0].steps == 20);
        CHECK(a[0].steps == 20 && a[1].steps == 20 && c[0].steps == 20 && b[1].steps == 10);
        CHECK(a[0].eval_samples == 40 && a[1].eval_samples == 0); /* rank 0 evaluates */
        double worst = 0;
        for (int64_t i = 0; i < a[0].nparams; i++) worst = fmax(worst, fabs((double)a[0].params[i] - w1[0].params[i]));
        fprintf(stderr, "  DDP world 2 at batch 4 vs one process at batch 8, 20 steps: max abs diff %.3g\n", worst);
        CHECK(worst <= 1e-5);
        CHECK(memcmp(a[0].params, a[1].params, sizeof(float) * (size_t)a[0].nparams) == 0); /* replicas equal */
        CHECK(memcmp(a[0].params, c[0].params, sizeof(float) * (size_t)a[0].nparams) == 0); /* resume: bit-identical */
        CHECK(memcmp(a[0].params, b[0].params, sizeof(float) * (size_t)a[0].nparams) != 0);
    }
    for (int i = 0; i < 2; i++) {
        free(a[i].params);
        free(b[i].params);
        free(c[i].params);
    }
    free(w1[0].params);
    free(w1r[0].params);
    ts_dataset_free(ds);
    ts_dataset_free(test);
}

static void test_by_name(void) {
    ts_lr_schedule s;
    CHECK_OK(ts_lr_schedule_by_name("step", 0.5, 100, 10, &s));
    CHECK_NEAR(ts_lr_schedule_at(&s, 10), 0.05, 1e-12);
    CHECK_OK(ts_lr_schedule_by_name("cosine", 0.5, 100, 10, &s));
    CHECK_NEAR(ts_lr_schedule_at(&s, 50), 0.25, 1e-12);
    CHECK_STATUS(ts_lr_schedule_by_name("linear", 0.5, 100, 10, &s), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("'linear'");
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_optimizer *o = NULL;
    CHECK_STATUS(ts_optimizer_by_name("lion", &params, 0.1, 0, 0, &o), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("'lion'");
}

int main(int argc, char **argv) {
    ts_set_num_threads(1);
    static const tu_test tests[] = {
        T(test_dataset_source_world_of_one), T(test_source_seek), T(test_custom_source), T(test_pipeline_source),
        T(test_strategies_equal_plain), T(test_strategy_errors), T(test_evaluate), T(test_trainer_resume_bit_identical),
        T(test_trainer_errors), T(test_checkpoint_dir), T(test_resume_refuses_forged_checkpoints),
        T(test_optimizer_state_check), T(test_trainer_checks_at_start), T(test_ddp_trainer), T(test_by_name),
    };
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    return rc;
}
