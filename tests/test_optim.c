/* Optimizers against torch.optim's formulas recomputed here in double
 * precision, state save/load, and learning-rate schedules against closed
 * forms and torch's recursive scheduler updates. The SGD and AdamW steps run
 * on TS_TEST_DEVICE (cuda:0 on a GPU machine, cpu:1 a virtual CPU device; the
 * CPU by default), the rest on the CPU. */
#include "test_util.h"
#include "golden_io.h"

#define NP 7     /* elements of the small parameter */
#define NSTEPS 3

/* Gradients for step `step` (0-based): the third is small, so AMSGrad's max matters. */
static float *grads_for(uint64_t seed, int step, int n) {
    ts_rng r;
    ts_rng_seed(&r, seed * 100 + (uint64_t)step);
    float *g = malloc(sizeof(float) * (size_t)n);
    double scale = step == 2 ? 0.01 : 1.0;
    for (int i = 0; i < n; i++) g[i] = (float)((ts_rng_uniform(&r) * 2 - 1) * scale);
    return g;
}

static ts_device *dev; /* where run_sgd_case and test_adamw's steps run (TS_TEST_DEVICE) */

static void set_grad(ts_tensor *p, const float *g) {
    ts_tensor *t = tu_tensor(ts_tensor_ndim(p), ts_tensor_shape(p), g), *d = tg_on_device(t, ts_tensor_device(p));
    ts_tensor_set_grad(p, d);
    ts_tensor_release(t);
    ts_tensor_release(d);
}

/* A parameter of n values on d (a leaf with requires_grad), its values in *ref as doubles */
static ts_tensor *param_on(ts_device *d, int n, uint64_t seed, double **ref) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_tensor *h = tu_rand(&r, 1, (int64_t[]){n}, -1, 1, true), *p = tg_on_device(h, d);
    ts_tensor_set_requires_grad(p, true);
    *ref = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) (*ref)[i] = ts_tensor_data_f32(h)[i];
    ts_tensor_release(h);
    return p;
}

static ts_tensor *param(int n, uint64_t seed, double **ref) { return param_on(ts_device_cpu(), n, seed, ref); }

static double max_rel_err(ts_tensor *p, const double *ref, int n) {
    double e = 0;
    ts_tensor *h = tg_on_device(p, ts_device_cpu());
    const float *v = ts_tensor_data_f32(h);
    for (int i = 0; i < n; i++) e = fmax(e, fabs(v[i] - ref[i]) / fmax(1.0, fabs(ref[i])));
    ts_tensor_release(h);
    return e;
}

/* ---- SGD --------------------------------------------------------------------------------------- */
/* torch.optim.SGD, single tensor:
 *   d = g (+ wd p);  buf = first ? d : mom buf + (1 - damp) d;  d = nesterov ? d + mom buf : buf;  p -= lr d */
static void ref_sgd(double *p, double *buf, bool first, const float *gf, int n, const ts_sgd_config *c) {
    double lr = c->lr, mom = c->momentum, damp = c->dampening, wd = c->weight_decay;
    for (int i = 0; i < n; i++) {
        double d = c->maximize ? -(double)gf[i] : gf[i];
        if (wd != 0) d += wd * p[i];
        if (mom != 0) {
            buf[i] = first ? d : mom * buf[i] + (1 - damp) * d;
            d = c->nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] -= lr * d;
    }
}

static void run_sgd_case(const char *what, ts_sgd_config c, int n) {
    double *ref = NULL;
    ts_tensor *p = param_on(dev, n, 11, &ref);
    double *buf = calloc((size_t)n, sizeof(double));
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor_list_append(&l, "w", p);
    ts_optimizer *opt = NULL;
    CHECK_OK(ts_optim_sgd_new(&l, &c, &opt));
    for (int s = 0; s < NSTEPS && opt; s++) {
        float *g = grads_for(11, s, n);
        set_grad(p, g);
        CHECK_OK(ts_optimizer_step(opt));
        ref_sgd(ref, buf, s == 0, g, n, &c);
        double e = max_rel_err(p, ref, n);
        if (!(e < 2e-6)) fprintf(stderr, "SGD %s: step %d: error %g\n", what, s + 1, e);
        CHECK(e < 2e-6);
        free(g);
    }
    CHECK(ts_optimizer_step_count(opt) == NSTEPS);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&l);
    ts_tensor_release(p);
    free(ref);
    free(buf);
}

static void test_sgd(void) {
    ts_sgd_config c = TS_SGD_CONFIG_INIT;
    c.lr = 0.1f;
    run_sgd_case("plain", c, NP);
    c.momentum = 0.9f;
    run_sgd_case("momentum", c, NP);
    c.dampening = 0.3f;
    run_sgd_case("momentum+dampening", c, NP);
    c.dampening = 0;
    c.nesterov = true;
    run_sgd_case("nesterov", c, NP);
    c.weight_decay = 0.05f;
    run_sgd_case("nesterov+weight_decay", c, NP);
    c.nesterov = false;
    c.dampening = 0.5f;
    c.maximize = true;
    run_sgd_case("momentum+dampening+wd+maximize", c, NP);
    ts_sgd_config w = TS_SGD_CONFIG_INIT;
    w.lr = 0.01f;
    w.weight_decay = 0.1f;
    run_sgd_case("weight_decay", w, NP);
    /* large: the OpenMP path */
    c.maximize = false;
    run_sgd_case("large", c, 100000);
}

/* ---- AdamW ---------------------------------------------------------------------------------------- */
typedef struct {
    double *m, *v, *vmax;
    int64_t step;
} adam_ref;

/* torch.optim.AdamW, single tensor */
static void ref_adamw(double *p, adam_ref *s, const float *gf, int n, const ts_adamw_config *c) {
    double lr = c->lr, b1 = c->beta1, b2 = c->beta2, eps = c->eps, wd = c->weight_decay;
    s->step++;
    double bc1 = 1 - pow(b1, (double)s->step), bc2 = 1 - pow(b2, (double)s->step);
    for (int i = 0; i < n; i++) {
        double g = c->maximize ? -(double)gf[i] : gf[i];
        p[i] *= 1 - lr * wd;
        s->m[i] = b1 * s->m[i] + (1 - b1) * g;
        s->v[i] = b2 * s->v[i] + (1 - b2) * g * g;
        double v = s->v[i];
        if (c->amsgrad) {
            s->vmax[i] = fmax(s->vmax[i], v);
            v = s->vmax[i];
        }
        double denom = sqrt(v) / sqrt(bc2) + eps;
        p[i] -= lr / bc1 * s->m[i] / denom;
    }
}

/* Two parameters; the second has no gradient at step 2 (skipped, its state not advanced). */
static void run_adamw_case(const char *what, ts_adamw_config c, int n) {
    double *ref[2];
    ts_tensor *p[2] = {param_on(dev, n, 21, &ref[0]), param_on(dev, n, 22, &ref[1])};
    adam_ref s[2];
    for (int k = 0; k < 2; k++) {
        s[k].m = calloc((size_t)n, sizeof(double));
        s[k].v = calloc((size_t)n, sizeof(double));
        s[k].vmax = calloc((size_t)n, sizeof(double));
        s[k].step = 0;
    }
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor_list_append(&l, "a.weight", p[0]);
    ts_tensor_list_append(&l, "b.weight", p[1]);
    ts_optimizer *opt = NULL;
    CHECK_OK(ts_optim_adamw_new(&l, &c, &opt));
    for (int st = 0; st < NSTEPS && opt; st++) {
        ts_optimizer_zero_grad(opt);
        float *g[2] = {grads_for(21, st, n), grads_for(22, st, n)};
        for (int k = 0; k < 2; k++) {
            if (k == 1 && st == 1) continue;
            set_grad(p[k], g[k]);
            ref_adamw(ref[k], &s[k], g[k], n, &c);
        }
        CHECK_OK(ts_optimizer_step(opt));
        for (int k = 0; k < 2; k++) {
            double e = max_rel_err(p[k], ref[k], n);
            if (!(e < 2e-6)) fprintf(stderr, "AdamW %s: step %d param %d: error %g\n", what, st + 1, k, e);
            CHECK(e < 2e-6);
            free(g[k]);
        }
    }
    /* per-parameter steps: 3 and 2 */
    ts_tensor_list sl = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_optimizer_state(opt, &sl));
    ts_tensor *sa = ts_tensor_list_find(&sl, "a.weight.step"), *sb = ts_tensor_list_find(&sl, "b.weight.step");
    CHECK(sa && ts_tensor_item(sa, 0) == 3);
    CHECK(sb && ts_tensor_item(sb, 0) == 2);
    CHECK((ts_tensor_list_find(&sl, "a.weight.max_exp_avg_sq") != NULL) == c.amsgrad);
    ts_tensor_list_clear(&sl);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&l);
    for (int k = 0; k < 2; k++) {
        ts_tensor_release(p[k]);
        free(ref[k]);
        free(s[k].m);
        free(s[k].v);
        free(s[k].vmax);
    }
}

static void test_adamw(void) {
    ts_adamw_config c = TS_ADAMW_CONFIG_INIT;
    c.lr = 0.1f;
    c.weight_decay = 0;
    run_adamw_case("no weight decay", c, NP);
    c.weight_decay = 0.1f;
    run_adamw_case("weight decay", c, NP);
    c.amsgrad = true;
    run_adamw_case("amsgrad", c, NP);
    c.beta1 = 0.5f;
    c.beta2 = 0.9f;
    c.eps = 1e-3f;
    c.maximize = true;
    run_adamw_case("amsgrad, other betas, maximize", c, NP);
    ts_adamw_config d = TS_ADAMW_CONFIG_INIT; /* PyTorch's defaults */
    run_adamw_case("defaults", d, NP);
    c.maximize = false;
    run_adamw_case("large", c, 100000);
}

/* ---- state save / load ---------------------------------------------------------------------------------- */
static ts_tensor *clone_param(ts_tensor *p) {
    ts_tensor *c = NULL;
    CHECK_OK(ts_tensor_clone(p, &c));
    ts_tensor_set_requires_grad(c, true);
    return c;
}

/* Optimizer A runs 2 steps; B starts from A's parameters and state; both run step 3 identically. */
static void check_resume(bool adamw) {
    double *ref = NULL, *ref2 = NULL;
    ts_tensor *pa = param(NP, 31, &ref), *pa2 = param(5, 32, &ref2);
    free(ref);
    free(ref2);
    ts_tensor_list la = TS_TENSOR_LIST_INIT, lb = TS_TENSOR_LIST_INIT;
    ts_tensor_list_append(&la, "0.weight", pa);
    ts_tensor_list_append(&la, "0.bias", pa2);
    ts_sgd_config sc = TS_SGD_CONFIG_INIT;
    sc.lr = 0.1f;
    sc.momentum = 0.9f;
    sc.nesterov = true;
    sc.weight_decay = 0.01f;
    ts_adamw_config ac = TS_ADAMW_CONFIG_INIT;
    ac.lr = 0.05f;
    ac.amsgrad = true;
    ts_optimizer *a = NULL, *b = NULL;
    CHECK_OK(adamw ? ts_optim_adamw_new(&la, &ac, &a) : ts_optim_sgd_new(&la, &sc, &a));
    for (int s = 0; s < 2; s++) {
        float *g = grads_for(31, s, NP), *g2 = grads_for(32, s, 5);
        set_grad(pa, g);
        if (s == 0) set_grad(pa2, g2); /* 0.bias: gradient only at the first step */
        else ts_tensor_zero_grad(pa2);
        CHECK_OK(ts_optimizer_step(a));
        free(g);
        free(g2);
    }
    ts_optimizer_set_lr(a, 0.07f);
    ts_tensor *pb = clone_param(pa), *pb2 = clone_param(pa2);
    ts_tensor_list_append(&lb, "0.weight", pb);
    ts_tensor_list_append(&lb, "0.bias", pb2);
    CHECK_OK(adamw ? ts_optim_adamw_new(&lb, &ac, &b) : ts_optim_sgd_new(&lb, &sc, &b));
    ts_tensor_list st = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_optimizer_state(a, &st));
    if (!adamw) {
        CHECK(st.n == 4);
        if (st.n == 4) {
            CHECK(strcmp(st.names[0], "step") == 0 && strcmp(st.names[1], "lr") == 0);
            CHECK(strcmp(st.names[2], "0.weight.momentum_buffer") == 0);
            CHECK(strcmp(st.names[3], "0.bias.momentum_buffer") == 0);
        }
    } else {
        CHECK(st.n == 2 + 2 * 4);
        CHECK(ts_tensor_list_find(&st, "0.weight.exp_avg_sq") && ts_tensor_list_find(&st, "0.bias.max_exp_avg_sq"));
    }
    CHECK(ts_tensor_item(ts_tensor_list_find(&st, "step"), 0) == 2);
    CHECK_OK(ts_optimizer_load_state(b, &st));
    CHECK(ts_optimizer_step_count(b) == 2);
    CHECK(ts_optimizer_get_lr(b) == 0.07f);
    /* the loaded state is a copy */
    ts_tensor *live = ts_tensor_list_find(&st, adamw ? "0.weight.exp_avg" : "0.weight.momentum_buffer");
    ts_tensor_list st2 = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_optimizer_state(b, &st2));
    CHECK(ts_tensor_list_find(&st2, adamw ? "0.weight.exp_avg" : "0.weight.momentum_buffer") != live);
    ts_tensor_list_clear(&st2);
    float *g = grads_for(31, 2, NP), *g2 = grads_for(32, 2, 5);
    set_grad(pa, g);
    set_grad(pb, g);
    set_grad(pa2, g2);
    set_grad(pb2, g2);
    CHECK_OK(ts_optimizer_step(a));
    CHECK_OK(ts_optimizer_step(b));
    CHECK(tu_max_abs_diff(pb, ts_tensor_data_f32(pa)) == 0);
    CHECK(tu_max_abs_diff(pb2, ts_tensor_data_f32(pa2)) == 0);
    free(g);
    free(g2);

    /* errors leave the state unchanged */
    ts_tensor_list bad = TS_TENSOR_LIST_INIT;
    ts_tensor *t5 = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, (int64_t[]){5}, &t5));
    ts_tensor_list_append(&bad, "1.weight.exp_avg", t5);
    CHECK_STATUS(ts_optimizer_load_state(b, &bad), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("1.weight.exp_avg");
    ts_tensor_list_clear(&bad);
    ts_tensor_list_append(&bad, adamw ? "0.weight.exp_avg" : "0.weight.momentum_buffer", t5); /* shape [5] vs [7] */
    CHECK_STATUS(ts_optimizer_load_state(b, &bad), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[7]");
    ts_tensor_list_clear(&bad);
    if (adamw) {
        ts_tensor_list_append(&bad, "0.bias.exp_avg", t5);
        CHECK_STATUS(ts_optimizer_load_state(b, &bad), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("incomplete");
        ts_tensor_list_clear(&bad);
        ts_tensor_list_append(&bad, "0.bias.momentum_buffer", t5); /* an SGD key */
        CHECK_STATUS(ts_optimizer_load_state(b, &bad), TS_ERR_INVALID_ARG);
        ts_tensor_list_clear(&bad);
    }
    CHECK(ts_optimizer_step_count(b) == 3);
    /* an empty state resets the optimizer */
    CHECK_OK(ts_optimizer_load_state(b, &bad));
    CHECK(ts_optimizer_step_count(b) == 0);
    ts_tensor_list_clear(&st);
    CHECK_OK(ts_optimizer_state(b, &st));
    CHECK(st.n == 2);
    ts_tensor_release(t5);
    ts_tensor_list_clear(&st);
    ts_optimizer_free(a);
    ts_optimizer_free(b);
    ts_tensor_list_clear(&la);
    ts_tensor_list_clear(&lb);
    ts_tensor_release(pa);
    ts_tensor_release(pa2);
    ts_tensor_release(pb);
    ts_tensor_release(pb2);
}

static void test_state_save_load(void) {
    check_resume(false);
    check_resume(true);
}

static void test_misc_api(void) {
    double *ref = NULL;
    ts_tensor *p = param(NP, 41, &ref);
    free(ref);
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor_list_append(&l, "w", p);
    ts_optimizer *o = NULL;
    /* an uninitialised config */
    ts_sgd_config raw;
    memset(&raw, 0, sizeof raw);
    raw.lr = 0.1f;
    CHECK_STATUS(ts_optim_sgd_new(&l, &raw, &o), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("INIT");
    ts_sgd_config c = TS_SGD_CONFIG_INIT;
    c.nesterov = true;
    CHECK_STATUS(ts_optim_sgd_new(&l, &c, &o), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("nesterov");
    c = TS_SGD_CONFIG_INIT;
    c.lr = -1;
    CHECK_STATUS(ts_optim_sgd_new(&l, &c, &o), TS_ERR_INVALID_ARG);
    ts_adamw_config ac = TS_ADAMW_CONFIG_INIT;
    ac.beta2 = 1.0f;
    CHECK_STATUS(ts_optim_adamw_new(&l, &ac, &o), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("beta2");
    CHECK(o == NULL);

    c = TS_SGD_CONFIG_INIT;
    CHECK_OK(ts_optim_sgd_new(&l, &c, &o));
    CHECK(strcmp(ts_optimizer_name(o), "SGD") == 0);
    CHECK(ts_optimizer_get_lr(o) == 1e-3f);
    ts_optimizer_set_lr(o, 0.5f);
    CHECK(ts_optimizer_get_lr(o) == 0.5f);
    /* no gradient: nothing changes */
    float before = ts_tensor_data_f32(p)[0];
    CHECK_OK(ts_optimizer_step(o));
    CHECK(ts_tensor_data_f32(p)[0] == before);
    float g[NP] = {1, 1, 1, 1, 1, 1, 1};
    set_grad(p, g);
    CHECK_OK(ts_optimizer_step(o));
    CHECK_NEAR(ts_tensor_data_f32(p)[0], before - 0.5, 1e-6);
    ts_optimizer_zero_grad(o);
    CHECK(ts_tensor_grad(p) == NULL);
    /* a gradient of the wrong shape */
    ts_tensor *wrong = tu_tensor(1, (int64_t[]){2}, (float[]){1, 2});
    ts_tensor_set_grad(p, wrong);
    CHECK_STATUS(ts_optimizer_step(o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("'w'");
    ts_tensor_set_grad(p, NULL);
    ts_tensor_release(wrong);
    ts_optimizer_free(o);
    ts_optimizer_free(NULL);
    ts_tensor_list_clear(&l);
    ts_tensor_release(p);
}

/* ---- schedules ---------------------------------------------------------------------------------------- */
static void test_schedules(void) {
    /* StepLR(step_size=3, gamma=0.1), against torch's recursive update */
    ts_lr_schedule s = ts_lr_step(0.1, 3, 0.1);
    CHECK_OK(ts_lr_schedule_check(&s));
    double lr = 0.1;
    for (int t = 0; t < 12; t++) {
        if (t > 0 && t % 3 == 0) lr *= 0.1;
        CHECK_NEAR(ts_lr_schedule_at(&s, t), lr, 1e-12);
    }
    CHECK_NEAR(ts_lr_schedule_at(&s, 7), 0.001, 1e-12);
    /* CosineAnnealingLR(T_max=10, eta_min=0.001), against torch's recursive get_lr, over two periods */
    const double base = 0.1, emin = 0.001;
    const int T = 10;
    ts_lr_schedule c = ts_lr_cosine(base, T, emin);
    CHECK_OK(ts_lr_schedule_check(&c));
    lr = base;
    for (int t = 0; t <= 2 * T; t++) {
        if (t == 0)
            lr = base;
        else if ((t - 1 - T) % (2 * T) == 0)
            lr = lr + (base - emin) * (1 - cos(M_PI / T)) / 2;
        else
            lr = (1 + cos(M_PI * t / T)) / (1 + cos(M_PI * (t - 1) / T)) * (lr - emin) + emin;
        CHECK_NEAR(ts_lr_schedule_at(&c, t), lr, 1e-9);
    }
    CHECK_NEAR(ts_lr_schedule_at(&c, 0), base, 1e-12);
    CHECK_NEAR(ts_lr_schedule_at(&c, 5), (base + emin) / 2, 1e-12);
    CHECK_NEAR(ts_lr_schedule_at(&c, 10), emin, 1e-12);
    /* warmup: LinearLR(start_factor=0.1, total_iters=5) then cosine from 0 */
    ts_lr_schedule w = ts_lr_with_warmup(c, 5, 0.1);
    CHECK_OK(ts_lr_schedule_check(&w));
    CHECK_NEAR(ts_lr_schedule_at(&w, 0), 0.01, 1e-12);
    CHECK_NEAR(ts_lr_schedule_at(&w, 2), 0.1 * (0.1 + 0.9 * 2 / 5.0), 1e-12);
    CHECK_NEAR(ts_lr_schedule_at(&w, 5), base, 1e-12);
    CHECK_NEAR(ts_lr_schedule_at(&w, 8), emin + (base - emin) * (1 + cos(M_PI * 3 / T)) / 2, 1e-12);
    CHECK_NEAR(ts_lr_schedule_at(&w, 15), emin, 1e-12);
    ts_lr_schedule k = ts_lr_constant(0.3);
    CHECK_NEAR(ts_lr_schedule_at(&k, 100), 0.3, 0);
    /* errors */
    ts_lr_schedule bad = ts_lr_step(0.1, 0, 0.1);
    CHECK_STATUS(ts_lr_schedule_check(&bad), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("step_size");
    bad = ts_lr_cosine(0.1, 0, 0);
    CHECK_STATUS(ts_lr_schedule_check(&bad), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("T_max");
    bad = ts_lr_with_warmup(c, 3, 0);
    CHECK_STATUS(ts_lr_schedule_check(&bad), TS_ERR_INVALID_ARG);
}

int main(int argc, char **argv) {
    dev = tu_test_device();
    if (dev != ts_device_cpu()) printf("SGD and AdamW steps on %s\n", ts_device_name(dev));
    static const tu_test tests[] = {T(test_sgd), T(test_adamw), T(test_state_save_load), T(test_misc_api),
                                    T(test_schedules)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
