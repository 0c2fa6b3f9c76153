/* Pipeline parallelism: GPipe and 1F1B on virtual CPU devices against one device.
 *
 * Equivalence: for both schedules, 2 and 3 stages and micro-batch counts 1, 3
 * (not dividing the batch), 4 (torch.chunk gives fewer pieces than asked) and
 * more than the batch has samples, a pipeline training step gives the loss and
 * every parameter gradient of one device at the full batch (max abs diff <= 1e-5),
 * on an MLP, a conv net without BatchNorm and the reference CNN (eval-mode BN at
 * the full batch; training-mode BN against per-micro-batch steps on one device).
 * Then the schedule order per stage, 1F1B's in-flight bound and memory advantage,
 * the module's forward (evaluation, GPipe through ordinary autograd), ignore_index
 * targets and errors. */
#include "test_util.h"

static ts_device *dev(const char *name) {
    ts_device *d = NULL;
    CHECK_OK(ts_device_get(name, &d));
    return d;
}

static ts_device *stage_devs[4];

/* Largest differences seen, printed at the end (figures for the docs). */
static double worst_loss_diff, worst_grad_diff;

/* ---- models and data ------------------------------------------------------------------------------ */
typedef enum { MODEL_MLP, MODEL_CONV, MODEL_CNN } model_kind;

/* Appends *layer, made by a constructor call whose status is st (read *layer only
 * here: argument evaluation order is unspecified). */
static void add_layer(ts_module *seq, ts_status st, ts_module **layer) {
    CHECK_OK(st);
    ts_module *l = *layer;
    *layer = NULL;
    CHECK_OK(ts_nn_sequential_add(seq, NULL, l));
}

/* (B, 3, 2, 2) -> 5: Flatten, Linear, ReLU, Linear, ReLU, Linear */
static ts_module *make_mlp(uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *s = NULL, *c = NULL;
    CHECK_OK(ts_nn_sequential_new(&s));
    add_layer(s, ts_nn_flatten_new(&c), &c);
    add_layer(s, ts_nn_linear_new(12, 16, true, &r, &c), &c);
    add_layer(s, ts_nn_relu_new(&c), &c);
    add_layer(s, ts_nn_linear_new(16, 16, true, &r, &c), &c);
    add_layer(s, ts_nn_relu_new(&c), &c);
    add_layer(s, ts_nn_linear_new(16, 5, true, &r, &c), &c);
    return s;
}

/* (B, 2, 8, 8) -> 5: Conv, ReLU, MaxPool, Conv, ReLU, Flatten, Linear (no BatchNorm) */
static ts_module *make_conv(uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    ts_pool2d_params pool = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
    ts_module *s = NULL, *c = NULL;
    CHECK_OK(ts_nn_sequential_new(&s));
    add_layer(s, ts_nn_conv2d_new(2, 4, 3, 3, p, true, &r, &c), &c);
    add_layer(s, ts_nn_relu_new(&c), &c);
    add_layer(s, ts_nn_maxpool2d_new(pool, &c), &c);
    add_layer(s, ts_nn_conv2d_new(4, 6, 3, 3, p, true, &r, &c), &c);
    add_layer(s, ts_nn_relu_new(&c), &c);
    add_layer(s, ts_nn_flatten_new(&c), &c);
    add_layer(s, ts_nn_linear_new(96, 5, true, &r, &c), &c);
    return s;
}

static ts_module *make_model(model_kind k, uint64_t seed) {
    if (k == MODEL_MLP) return make_mlp(seed);
    if (k == MODEL_CONV) return make_conv(seed);
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *m = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &m));
    return m;
}

static const char *model_name(model_kind k) { return k == MODEL_MLP ? "mlp" : k == MODEL_CONV ? "conv" : "cnn"; }

static void make_batch(model_kind k, int64_t b, uint64_t seed, ts_tensor **x, ts_tensor **y) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    int64_t xs[4] = {b, 3, 2, 2};
    if (k == MODEL_CONV) xs[1] = 2, xs[2] = 8, xs[3] = 8;
    if (k == MODEL_CNN) xs[1] = 1, xs[2] = 28, xs[3] = 28;
    *x = tu_rand(&r, 4, xs, -1, 1, false);
    int64_t classes = k == MODEL_CNN ? 10 : 5;
    int64_t *lab = malloc(sizeof(int64_t) * (size_t)b);
    for (int64_t i = 0; i < b; i++) lab[i] = (int64_t)ts_rng_below(&r, (uint64_t)classes);
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &b, lab, y));
    free(lab);
}

/* ---- gradients on the host ------------------------------------------------------------------------------ */
typedef struct {
    int n;
    char **names;
    float **g;
    int64_t *len;
} grad_set;

static void grads_take(ts_module *m, grad_set *out) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(m, &l));
    out->n = l.n;
    out->names = calloc((size_t)l.n, sizeof *out->names);
    out->g = calloc((size_t)l.n, sizeof *out->g);
    out->len = calloc((size_t)l.n, sizeof *out->len);
    for (int k = 0; k < l.n; k++) {
        ts_tensor *g = ts_tensor_grad(l.tensors[k]);
        out->names[k] = strdup(l.names[k]);
        out->len[k] = ts_tensor_numel(l.tensors[k]);
        out->g[k] = calloc((size_t)out->len[k], sizeof(float));
        CHECK(g != NULL);
        if (g) CHECK_OK(ts_tensor_to_host(g, out->g[k], sizeof(float) * (size_t)out->len[k]));
    }
    ts_tensor_list_clear(&l);
}

static void grads_free(grad_set *s) {
    for (int k = 0; k < s->n; k++) {
        free(s->names[k]);
        free(s->g[k]);
    }
    free(s->names);
    free(s->g);
    free(s->len);
}

/* Largest absolute difference between two gradient sets (same parameters, same order). */
static double grads_diff(const grad_set *a, const grad_set *b, const char *what) {
    CHECK(a->n == b->n);
    double worst = 0;
    for (int k = 0; k < a->n && k < b->n; k++) {
        CHECK(a->len[k] == b->len[k]);
        double d = 0;
        for (int64_t i = 0; i < a->len[k] && a->len[k] == b->len[k]; i++)
            d = fmax(d, fabs((double)a->g[k][i] - b->g[k][i]));
        if (!(d <= 1e-5)) fprintf(stderr, "%s: gradient of %s differs by %.3g\n", what, b->names[k], d);
        worst = fmax(worst, d);
    }
    return worst;
}

/* One device ("cpu"), full batch: loss and gradients. */
static float reference_step(ts_module *m, ts_tensor *x, ts_tensor *y, float smoothing, grad_set *g) {
    ts_tensor *logits = NULL, *l = NULL;
    CHECK_OK(ts_module_forward(m, x, &logits));
    CHECK_OK(ts_cross_entropy(logits, y, smoothing, &l));
    float loss = (float)ts_tensor_item(l, 0);
    CHECK_OK(ts_backward(l, NULL, false));
    grads_take(m, g);
    ts_tensor_release(l);
    ts_tensor_release(logits);
    return loss;
}

/* One device, micro-batch by micro-batch with torch.chunk's split, each loss weighted by
 * its share of the batch: what a pipeline computes when BatchNorm is in training mode. */
static float reference_micro_steps(ts_module *m, ts_tensor *x, ts_tensor *y, int micro, float smoothing,
                                   grad_set *g) {
    int64_t b = ts_tensor_dim(x, 0), chunk = (b + micro - 1) / micro;
    double total = 0;
    for (int64_t lo = 0; lo < b; lo += chunk) {
        int64_t hi = lo + chunk < b ? lo + chunk : b;
        ts_tensor *xi = NULL, *yi = NULL, *logits = NULL, *ce = NULL, *l = NULL;
        CHECK_OK(ts_slice(x, 0, lo, hi, &xi));
        CHECK_OK(ts_slice(y, 0, lo, hi, &yi));
        CHECK_OK(ts_module_forward(m, xi, &logits));
        CHECK_OK(ts_cross_entropy(logits, yi, smoothing, &ce));
        CHECK_OK(ts_scale(ce, (float)((double)(hi - lo) / (double)b), &l));
        total += ts_tensor_item(l, 0);
        CHECK_OK(ts_backward(l, NULL, false));
        ts_tensor_release(l);
        ts_tensor_release(ce);
        ts_tensor_release(logits);
        ts_tensor_release(yi);
        ts_tensor_release(xi);
    }
    grads_take(m, g);
    return (float)total;
}

static ts_module *make_pipe(ts_module *seq, int p, const int *bounds, int micro, ts_pp_schedule sched) {
    ts_module *pipe = NULL;
    CHECK_OK(ts_nn_pipeline_parallel_new(seq, stage_devs, p, bounds, micro, sched, ts_device_cpu(), &pipe));
    return pipe;
}

/* ---- equivalence with one device ------------------------------------------------------------------------- */
static void check_equivalence(model_kind k, bool eval_bn) {
    const int64_t batch = 10;
    const int micros[] = {1, 3, 4, 13}; /* 13 > batch: ten micro-batches of one sample */
    const int expect_m[] = {1, 3, 4, 10};
    ts_tensor *x = NULL, *y = NULL;
    make_batch(k, batch, 11, &x, &y);
    float smoothing = k == MODEL_CONV ? 0.1f : 0.0f;
    for (int sched = 0; sched < 2; sched++)
        for (int p = 2; p <= 3; p++)
            for (int mi = 0; mi < 4; mi++) {
                ts_module *ref = make_model(k, 5);
                if (eval_bn) ts_module_train(ref, false);
                grad_set want = {0}, got = {0};
                float loss_ref = reference_step(ref, x, y, smoothing, &want);
                ts_module *pipe = make_pipe(make_model(k, 5), p, NULL, micros[mi], (ts_pp_schedule)sched);
                if (!pipe) continue;
                if (eval_bn) ts_module_train(pipe, false);
                float loss = 0;
                CHECK_OK(ts_pp_train_step(pipe, x, y, smoothing, &loss));
                grads_take(pipe, &got);
                char what[128];
                snprintf(what, sizeof what, "%s %s p=%d micro=%d", model_name(k),
                         ts_pp_schedule_name((ts_pp_schedule)sched), p, micros[mi]);
                double gd = grads_diff(&want, &got, what);
                double ld = fabs((double)loss - loss_ref);
                CHECK(gd <= 1e-5);
                CHECK_NEAR(loss, loss_ref, 1e-5);
                worst_grad_diff = fmax(worst_grad_diff, gd);
                worst_loss_diff = fmax(worst_loss_diff, ld);
                ts_pp_stats s;
                CHECK_OK(ts_pp_get_stats(pipe, &s));
                CHECK(s.micro_batches == expect_m[mi] && s.stages == p && s.train);
                grads_free(&want);
                grads_free(&got);
                ts_module_free(pipe);
                ts_module_free(ref);
            }
    ts_tensor_release(x);
    ts_tensor_release(y);
}

static void test_equivalence_mlp(void) { check_equivalence(MODEL_MLP, false); }
static void test_equivalence_conv(void) { check_equivalence(MODEL_CONV, false); }
static void test_equivalence_cnn_eval_bn(void) { check_equivalence(MODEL_CNN, true); }

/* ignore_index targets: each micro-batch is weighted by its share of the counted
 * targets, so the pipeline still equals the full batch — also when a whole
 * micro-batch is ignored (its mean is NaN; it adds nothing). */
static void test_ignore_index(void) {
    ts_tensor *x = NULL, *y = NULL;
    make_batch(MODEL_MLP, 10, 13, &x, &y);
    int64_t *t = ts_tensor_data(y);
    t[0] = t[1] = t[2] = t[3] = t[7] = -100; /* with 3 micro-batches (4, 4, 2) the first is all ignored */
    for (int sched = 0; sched < 2; sched++)
        for (int micro = 3; micro <= 13; micro += 10) {
            ts_module *ref = make_model(MODEL_MLP, 5);
            grad_set want = {0}, got = {0};
            float loss_ref = reference_step(ref, x, y, 0.05f, &want);
            ts_module *pipe = make_pipe(make_model(MODEL_MLP, 5), 2, NULL, micro, (ts_pp_schedule)sched);
            if (!pipe) continue;
            float loss = 0;
            CHECK_OK(ts_pp_train_step(pipe, x, y, 0.05f, &loss));
            grads_take(pipe, &got);
            CHECK(isfinite(loss));
            CHECK_NEAR(loss, loss_ref, 1e-5);
            double gd = grads_diff(&want, &got, "ignore_index");
            CHECK(gd <= 1e-5);
            worst_grad_diff = fmax(worst_grad_diff, gd);
            worst_loss_diff = fmax(worst_loss_diff, fabs((double)loss - loss_ref));
            grads_free(&want);
            grads_free(&got);
            ts_module_free(pipe);
            ts_module_free(ref);
        }
    ts_tensor_release(x);
    ts_tensor_release(y);
}

/* Training-mode BatchNorm normalises each micro-batch: the pipeline equals one
 * device stepping through the same micro-batches — loss, gradients and the running
 * statistics (updated once per micro-batch, in micro-batch order). */
static void test_cnn_train_bn_per_micro_batch(void) {
    const int64_t batch = 10;
    ts_tensor *x = NULL, *y = NULL;
    make_batch(MODEL_CNN, batch, 12, &x, &y);
    const int micros[] = {3, 13};
    for (int sched = 0; sched < 2; sched++)
        for (int mi = 0; mi < 2; mi++) {
            ts_module *ref = make_model(MODEL_CNN, 6);
            grad_set want = {0}, got = {0};
            float loss_ref = reference_micro_steps(ref, x, y, micros[mi], 0.0f, &want);
            ts_module *pipe = make_pipe(make_model(MODEL_CNN, 6), 3, NULL, micros[mi], (ts_pp_schedule)sched);
            if (!pipe) continue;
            float loss = 0;
            CHECK_OK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
            grads_take(pipe, &got);
            double gd = grads_diff(&want, &got, "cnn train-mode BN");
            CHECK(gd <= 1e-5);
            CHECK_NEAR(loss, loss_ref, 1e-5);
            worst_grad_diff = fmax(worst_grad_diff, gd);
            worst_loss_diff = fmax(worst_loss_diff, fabs((double)loss - loss_ref));
            ts_tensor_list b0 = TS_TENSOR_LIST_INIT, b1 = TS_TENSOR_LIST_INIT;
            CHECK_OK(ts_module_buffers(ref, &b0));
            CHECK_OK(ts_module_buffers(pipe, &b1));
            CHECK(b0.n == b1.n && b0.n == 6);
            for (int k = 0; k < b0.n && k < b1.n; k++) {
                CHECK(strcmp(b1.names[k] + strlen("module."), b0.names[k]) == 0);
                for (int64_t i = 0; i < ts_tensor_numel(b0.tensors[k]); i++)
                    CHECK_NEAR(ts_tensor_item(b1.tensors[k], i), ts_tensor_item(b0.tensors[k], i), 1e-6);
            }
            /* num_batches_tracked counts micro-batches */
            CHECK(ts_tensor_item(b1.tensors[2], 0) == (micros[mi] == 3 ? 3 : 10));
            ts_tensor_list_clear(&b0);
            ts_tensor_list_clear(&b1);
            grads_free(&want);
            grads_free(&got);
            ts_module_free(pipe);
            ts_module_free(ref);
        }
    ts_tensor_release(x);
    ts_tensor_release(y);
}

/* Several steps with SGD: parameters stay equal to one device's (loss, grads each step). */
static void test_training_steps_with_optimizer(void) {
    ts_module *ref = make_model(MODEL_CONV, 8);
    ts_module *pipe = make_pipe(make_model(MODEL_CONV, 8), 3, NULL, 4, TS_PP_1F1B);
    if (!pipe) return;
    ts_tensor_list pr = TS_TENSOR_LIST_INIT, pp = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ref, &pr));
    CHECK_OK(ts_module_parameters(pipe, &pp));
    CHECK(pp.n == pr.n && strcmp(pp.names[0], "module.0.weight") == 0);
    CHECK(ts_tensor_device(pp.tensors[0]) == stage_devs[0]);
    CHECK(ts_tensor_device(pp.tensors[pp.n - 1]) == stage_devs[2]);
    ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
    cfg.lr = 0.1f;
    cfg.momentum = 0.9f;
    ts_optimizer *o1 = NULL, *o2 = NULL;
    CHECK_OK(ts_optim_sgd_new(&pr, &cfg, &o1));
    CHECK_OK(ts_optim_sgd_new(&pp, &cfg, &o2));
    for (int step = 0; step < 5; step++) {
        ts_tensor *x = NULL, *y = NULL, *logits = NULL, *l = NULL;
        make_batch(MODEL_CONV, 9, 100 + (uint64_t)step, &x, &y);
        CHECK_OK(ts_module_forward(ref, x, &logits));
        CHECK_OK(ts_cross_entropy(logits, y, 0.0f, &l));
        CHECK_OK(ts_backward(l, NULL, false));
        float loss = 0;
        CHECK_OK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
        CHECK_NEAR(loss, ts_tensor_item(l, 0), 1e-5);
        CHECK_OK(ts_optimizer_step(o1));
        CHECK_OK(ts_optimizer_step(o2));
        ts_optimizer_zero_grad(o1);
        ts_optimizer_zero_grad(o2);
        ts_tensor_release(l);
        ts_tensor_release(logits);
        ts_tensor_release(x);
        ts_tensor_release(y);
    }
    double worst = 0;
    for (int k = 0; k < pr.n && k < pp.n; k++)
        for (int64_t i = 0; i < ts_tensor_numel(pr.tensors[k]); i++)
            worst = fmax(worst, fabs(ts_tensor_item(pr.tensors[k], i) - ts_tensor_item(pp.tensors[k], i)));
    CHECK(worst <= 1e-5);
    fprintf(stderr, "  5 SGD steps, 1F1B, 3 stages: parameters differ by at most %.3g\n", worst);
    ts_optimizer_free(o1);
    ts_optimizer_free(o2);
    ts_tensor_list_clear(&pr);
    ts_tensor_list_clear(&pp);
    ts_module_free(pipe);
    ts_module_free(ref);
}

/* ---- the module's forward ------------------------------------------------------------------------------- */
/* Evaluation (no grad) returns one device's logits on the output device; with grad on,
 * forward + loss + ts_backward on the caller's thread trains like one device (GPipe's
 * forward, plain backward through the copies between stages). */
static void test_forward_eval_and_autograd(void) {
    ts_tensor *x = NULL, *y = NULL;
    make_batch(MODEL_CONV, 7, 21, &x, &y);
    for (int mi = 1; mi <= 8; mi += 3) {
        ts_module *ref = make_model(MODEL_CONV, 9);
        ts_module *pipe = make_pipe(make_model(MODEL_CONV, 9), 3, (const int[]){2, 5, 7}, mi, TS_PP_GPIPE);
        if (!pipe) continue;
        ts_tensor *a = NULL, *b = NULL;
        bool prev = ts_grad_set_enabled(false);
        CHECK_OK(ts_module_forward(ref, x, &a));
        CHECK_OK(ts_module_forward(pipe, x, &b));
        ts_grad_set_enabled(prev);
        CHECK(b && ts_tensor_device(b) == ts_device_cpu() && !ts_tensor_requires_grad(b));
        CHECK(b && ts_tensor_dim(b, 0) == 7 && ts_tensor_dim(b, 1) == 5);
        for (int64_t i = 0; b && i < 35; i++) CHECK_NEAR(ts_tensor_item(b, i), ts_tensor_item(a, i), 1e-5);
        ts_pp_stats s;
        CHECK_OK(ts_pp_get_stats(pipe, &s));
        CHECK(!s.train && s.peak_in_flight[0] == 0);
        ts_tensor_release(a);
        ts_tensor_release(b);

        grad_set want = {0}, got = {0};
        float lr = reference_step(ref, x, y, 0.0f, &want);
        float lp = reference_step(pipe, x, y, 0.0f, &got);
        CHECK_NEAR(lp, lr, 1e-5);
        CHECK(grads_diff(&want, &got, "forward + ts_backward") <= 1e-5);
        char tr[256];
        CHECK_OK(ts_pp_trace(pipe, 2, tr, sizeof tr));
        CHECK(strncmp(tr, "F0", 2) == 0 && !strchr(tr, 'B'));
        grads_free(&want);
        grads_free(&got);
        ts_module_free(pipe);
        ts_module_free(ref);
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
}

/* ---- schedule order and in-flight micro-batches -------------------------------------------------------------- */
/* The expected order, written out independently of the library's generator. */
static void expected_order(ts_pp_schedule sched, int p, int s, int m, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
#define EMIT(c, i) len += (size_t)snprintf(buf + len, n - len, "%s%c%d", len ? " " : "", (c), (i))
    if (sched == TS_PP_GPIPE) {
        for (int i = 0; i < m; i++) EMIT('F', i);
        for (int i = m - 1; i >= 0; i--) EMIT('B', i);
        return;
    }
    /* 1F1B: a forward whenever forwards are left and fewer than p - s micro-batches are
     * in flight (stage s holds at most p - s), else the oldest backward */
    int f = 0, b = 0;
    while (b < m) {
        if (f < m && f - b < p - s) {
            EMIT('F', f);
            f++;
        } else {
            EMIT('B', b);
            b++;
        }
    }
#undef EMIT
}

static void test_schedule_order(void) {
    const int ms[] = {1, 2, 3, 5, 8};
    for (int sched = 0; sched < 2; sched++)
        for (int p = 2; p <= 4; p++)
            for (int mi = 0; mi < 5; mi++) {
                int m = ms[mi];
                ts_module *pipe = make_pipe(make_model(MODEL_MLP, 3), p, NULL, m, (ts_pp_schedule)sched);
                if (!pipe) continue;
                ts_tensor *x = NULL, *y = NULL;
                make_batch(MODEL_MLP, m, 4, &x, &y); /* one sample per micro-batch */
                float loss;
                CHECK_OK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
                ts_pp_stats st;
                CHECK_OK(ts_pp_get_stats(pipe, &st));
                CHECK(st.micro_batches == m);
                CHECK_NEAR(st.bubble_ideal, (double)(p - 1) / (m + p - 1), 1e-12);
                CHECK(st.wall_s > 0 && st.bubble >= 0 && st.bubble < 1);
                for (int s = 0; s < p; s++) {
                    char got[512], want[512];
                    CHECK_OK(ts_pp_trace(pipe, s, got, sizeof got));
                    expected_order((ts_pp_schedule)sched, p, s, m, want, sizeof want);
                    if (strcmp(got, want) != 0)
                        fprintf(stderr, "%s p=%d m=%d stage %d: ran '%s', expected '%s'\n",
                                ts_pp_schedule_name((ts_pp_schedule)sched), p, m, s, got, want);
                    CHECK(strcmp(got, want) == 0);
                    CHECK(st.busy_s[s] > 0);
                    int bound = sched == TS_PP_GPIPE ? m : (m < p - s ? m : p - s);
                    CHECK(st.peak_in_flight[s] == bound);
                    if (sched == TS_PP_1F1B) CHECK(st.peak_in_flight[s] <= p - s);
                }
                ts_tensor_release(x);
                ts_tensor_release(y);
                ts_module_free(pipe);
            }
}

/* The literal sequences of the 1F1B picture for 4 stages and 8 micro-batches. */
static void test_1f1b_literal(void) {
    ts_module *pipe = make_pipe(make_model(MODEL_MLP, 3), 4, NULL, 8, TS_PP_1F1B);
    if (!pipe) return;
    ts_tensor *x = NULL, *y = NULL;
    make_batch(MODEL_MLP, 8, 4, &x, &y);
    float loss;
    CHECK_OK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
    const char *want[4] = {
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    };
    for (int s = 0; s < 4; s++) {
        char got[256];
        CHECK_OK(ts_pp_trace(pipe, s, got, sizeof got));
        if (strcmp(got, want[s]) != 0) fprintf(stderr, "stage %d ran '%s'\n", s, got);
        CHECK(strcmp(got, want[s]) == 0);
    }
    char tiny[8];
    CHECK_STATUS(ts_pp_trace(pipe, 0, tiny, sizeof tiny), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("too few");
    CHECK_STATUS(ts_pp_trace(pipe, 4, tiny, sizeof tiny), TS_ERR_INVALID_ARG);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_module_free(pipe);
}

/* 1F1B keeps fewer activations alive: the first stage's device peak is lower than GPipe's. */
static void test_1f1b_memory_advantage(void) {
    size_t peak[2] = {0, 0};
    ts_tensor *x = NULL, *y = NULL;
    make_batch(MODEL_CONV, 32, 5, &x, &y);
    for (int sched = 0; sched < 2; sched++) {
        ts_module *pipe = make_pipe(make_model(MODEL_CONV, 3), 2, (const int[]){4, 7}, 8, (ts_pp_schedule)sched);
        if (!pipe) continue;
        float loss;
        CHECK_OK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
        ts_module_zero_grad(pipe);
        CHECK_OK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
        ts_pp_stats st;
        CHECK_OK(ts_pp_get_stats(pipe, &st));
        peak[sched] = st.peak_bytes[0];
        CHECK(st.peak_in_flight[0] == (sched == TS_PP_GPIPE ? 8 : 2));
        fprintf(stderr, "  %s: stage 0 peak %zu bytes, %d micro-batches in flight\n",
                ts_pp_schedule_name((ts_pp_schedule)sched), st.peak_bytes[0], st.peak_in_flight[0]);
        ts_module_free(pipe);
    }
    CHECK(peak[1] > 0 && peak[1] * 2 < peak[0]);
    ts_tensor_release(x);
    ts_tensor_release(y);
}

/* ---- split by time ----------------------------------------------------------------------------------------------- */
static void test_split_by_time(void) {
    ts_module *m = make_model(MODEL_CNN, 2);
    ts_tensor *x = NULL, *y = NULL;
    make_batch(MODEL_CNN, 4, 3, &x, &y);
    ts_tensor_list before = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &before));
    float rm0 = (float)ts_tensor_item(before.tensors[4], 0); /* 1.running_mean */
    int bounds[3] = {0, 0, 0};
    CHECK_OK(ts_pp_split_by_time(m, x, 3, bounds));
    CHECK(0 < bounds[0] && bounds[0] < bounds[1] && bounds[1] < bounds[2] && bounds[2] == 12);
    fprintf(stderr, "  reference CNN split by time over 3 stages: bounds %d, %d, %d\n", bounds[0], bounds[1],
            bounds[2]);
    CHECK(ts_tensor_item(before.tensors[4], 0) == rm0); /* running stats restored */
    CHECK(ts_tensor_item(before.tensors[6], 0) == 0);   /* num_batches_tracked */
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(m, &params));
    for (int k = 0; k < params.n; k++) CHECK(ts_tensor_grad(params.tensors[k]) == NULL); /* grads restored */
    ts_tensor_list_clear(&params);
    ts_tensor_list_clear(&before);
    CHECK_STATUS(ts_pp_split_by_time(m, x, 13, bounds), TS_ERR_INVALID_ARG);
    ts_module *pipe = make_pipe(m, 3, bounds, 2, TS_PP_1F1B);
    ts_pp_stats st;
    CHECK_OK(ts_pp_get_stats(pipe, &st));
    CHECK(st.layers[0] == bounds[0] && st.layers[2] == 12 - bounds[1]);
    ts_module_free(pipe);
    ts_tensor_release(x);
    ts_tensor_release(y);
}

/* ---- errors --------------------------------------------------------------------------------------------------- */
static void test_errors(void) {
    ts_module *pipe = NULL;
    ts_module *two = NULL, *c = NULL;
    ts_rng r;
    ts_rng_seed(&r, 1);
    CHECK_OK(ts_nn_sequential_new(&two));
    add_layer(two, ts_nn_flatten_new(&c), &c);
    add_layer(two, ts_nn_linear_new(12, 5, true, &r, &c), &c);
    CHECK_STATUS(ts_nn_pipeline_parallel_new(two, stage_devs, 3, NULL, 2, TS_PP_GPIPE, NULL, &pipe),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("3 stages but the Sequential has only 2 layers");
    CHECK(pipe == NULL);

    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), stage_devs, 2, (const int[]){1, 7}, 2, TS_PP_GPIPE, NULL,
                                    &pipe),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("the bounds end at 7 but the Sequential has 6 layers");
    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), stage_devs, 2, (const int[]){0, 6}, 2, TS_PP_GPIPE, NULL,
                                    &pipe),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("bounds[0] = 0");
    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), stage_devs, 3, (const int[]){3, 3, 6}, 2, TS_PP_GPIPE, NULL,
                                    &pipe),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("bounds[1] = 3 does not come after bounds[0] = 3");
    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), stage_devs, 2, NULL, 0, TS_PP_GPIPE, NULL, &pipe),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("micro_batches is 0; it must be at least 1");
    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), stage_devs, 0, NULL, 2, TS_PP_GPIPE, NULL, &pipe),
                 TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), stage_devs, 2, NULL, 2, (ts_pp_schedule)7, NULL, &pipe),
                 TS_ERR_INVALID_ARG);
    ts_device *bad[2] = {stage_devs[0], ts_device_cpu()};
    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), bad, 2, NULL, 2, TS_PP_GPIPE, NULL, &pipe), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("no worker thread");
    ts_device *twice[2] = {stage_devs[1], stage_devs[1]};
    CHECK_STATUS(ts_nn_pipeline_parallel_new(make_mlp(1), twice, 2, NULL, 2, TS_PP_GPIPE, NULL, &pipe),
                 TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("given to stages 0 and 1");
    ts_module *lin = NULL;
    CHECK_OK(ts_nn_linear_new(3, 3, true, &r, &lin));
    CHECK_STATUS(ts_nn_pipeline_parallel_new(lin, stage_devs, 1, NULL, 2, TS_PP_GPIPE, NULL, &pipe), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("must be a Sequential or a GPT (got Linear)");

    ts_pp_schedule sched;
    CHECK_OK(ts_pp_schedule_parse("1F1B", &sched));
    CHECK(sched == TS_PP_1F1B);
    CHECK_STATUS(ts_pp_schedule_parse("zigzag", &sched), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("'zigzag' (known: gpipe, 1f1b)");

    /* not a pipeline; targets that do not fit */
    ts_tensor *x = NULL, *y = NULL, *x3 = NULL, *y3 = NULL;
    make_batch(MODEL_MLP, 6, 1, &x, &y);
    make_batch(MODEL_MLP, 3, 1, &x3, &y3);
    ts_tensor_release(x3);
    float loss;
    ts_module *plain = make_mlp(2);
    CHECK_STATUS(ts_pp_train_step(plain, x, y, 0.0f, &loss), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("not a pipeline module (got Sequential)");
    ts_module_free(plain);
    pipe = make_pipe(make_mlp(2), 2, NULL, 2, TS_PP_1F1B);
    CHECK_STATUS(ts_pp_train_step(pipe, x, y3, 0.0f, &loss), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("targets of shape [3]");
    ts_module_free(pipe);

    /* a layer that fails in the second stage (16 features come in, it wants 15): the
     * error names the stage, device, pass, micro-batch and layer, and nobody hangs */
    for (int s = 0; s < 2; s++) {
        ts_module *seq = NULL;
        CHECK_OK(ts_nn_sequential_new(&seq));
        add_layer(seq, ts_nn_flatten_new(&c), &c);
        add_layer(seq, ts_nn_linear_new(12, 16, true, &r, &c), &c);
        add_layer(seq, ts_nn_linear_new(15, 5, true, &r, &c), &c);
        pipe = make_pipe(seq, 2, (const int[]){2, 3}, 3, (ts_pp_schedule)s);
        CHECK_STATUS(ts_pp_train_step(pipe, x, y, 0.0f, &loss), TS_ERR_SHAPE);
        CHECK_ERR_MENTIONS("pipeline stage 1 (cpu:1), forward of micro-batch 0: layer 2 (Linear)");
        ts_tensor *out = NULL;
        CHECK_STATUS(ts_module_forward(pipe, x, &out), TS_ERR_SHAPE);
        CHECK_ERR_MENTIONS("PipelineParallel: pipeline stage 1 (cpu:1)");
        CHECK(out == NULL);
        ts_module_free(pipe);
    }
    /* after the failures a new pipeline runs fine: nothing was left waiting on the workers */
    pipe = make_pipe(make_mlp(2), 2, NULL, 2, TS_PP_1F1B);
    CHECK_OK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
    ts_tensor *empty = NULL;
    int64_t es[4] = {0, 3, 2, 2};
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 4, es, &empty));
    CHECK_STATUS(ts_pp_train_step(pipe, empty, y, 0.0f, &loss), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("no batch to split");
    ts_tensor_release(empty);
    ts_module_free(pipe);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(y3);
}

static void test_report(void) {
    fprintf(stderr, "  equivalence with one device: loss differs by at most %.3g, gradients by at most %.3g\n",
            worst_loss_diff, worst_grad_diff);
    CHECK(worst_grad_diff <= 1e-5);
}

int main(int argc, char **argv) {
    if (ts_set_cpu_device_count(4) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    const char *names[4] = {"cpu:0", "cpu:1", "cpu:2", "cpu:3"};
    for (int i = 0; i < 4; i++) stage_devs[i] = dev(names[i]);
    static const tu_test tests[] = {T(test_equivalence_mlp),
                                    T(test_equivalence_conv),
                                    T(test_equivalence_cnn_eval_bn),
                                    T(test_ignore_index),
                                    T(test_cnn_train_bn_per_micro_batch),
                                    T(test_training_steps_with_optimizer),
                                    T(test_forward_eval_and_autograd),
                                    T(test_schedule_order),
                                    T(test_1f1b_literal),
                                    T(test_1f1b_memory_advantage),
                                    T(test_split_by_time),
                                    T(test_errors),
                                    T(test_report)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
