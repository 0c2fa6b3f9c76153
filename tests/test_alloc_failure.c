/*
 * tests/test_alloc_failure.c — out of memory at every allocation of a training
 * step (forward, ts_cross_entropy, ts_backward, ts_optimizer_step, zero_grad).
 *
 * The hook (core/internal.h) counts the allocations made through ts__malloc,
 * ts__calloc, ts__realloc, ts__strdup and ts__device_alloc. A measuring run
 * counts a step's allocations (M); then for N = 0 .. M the hook fails the
 * allocation after the first N — only that one ("once"), and every one from it
 * on ("from then on") — and the test checks that
 *   - whenever a failure was injected, a call of the step returned TS_ERR_NOMEM
 *     with a message about memory (never TS_OK with a gradient missing);
 *   - with none injected (N = M) the step succeeds and every parameter got a
 *     gradient;
 *   - a failure in the optimizer step changed no parameter;
 *   - afterwards, disarmed, the same model trains a clean step (no engine state
 *     left behind by the failure);
 *   - nothing crashes or leaks (ASan, in `make sanitize`).
 * Each N starts from a freshly built model and optimizer, and the armed step is
 * either the first one (creating accumulate nodes and momentum buffers) or the
 * second one (reusing them).
 */
#include "test_util.h"
#include "core/internal.h"

#include <limits.h>

typedef struct step_case {
    const char *name;
    ts_status (*model)(ts_rng *rng, ts_module **out);
    bool adamw;
    int64_t batch;
} step_case;

/* One model + optimizer + batch. */
typedef struct rig {
    ts_module *m;
    ts_optimizer *opt;
    ts_tensor_list params;
    ts_tensor *x, *y;
} rig;

static void rig_free(rig *r) {
    ts_optimizer_free(r->opt);
    ts_tensor_list_clear(&r->params);
    ts_module_free(r->m);
    ts_tensor_release(r->x);
    ts_tensor_release(r->y);
    memset(r, 0, sizeof *r);
}

static bool rig_new(const step_case *c, rig *r) {
    memset(r, 0, sizeof *r);
    r->params = TS_TENSOR_LIST_INIT;
    ts_rng rng;
    ts_rng_seed(&rng, 7);
    ts_status st = c->model(&rng, &r->m);
    if (st == TS_OK) st = ts_module_parameters(r->m, &r->params);
    if (st == TS_OK && c->adamw) {
        ts_adamw_config a = TS_ADAMW_CONFIG_INIT;
        a.lr = 1e-3f;
        st = ts_optim_adamw_new(&r->params, &a, &r->opt);
    } else if (st == TS_OK) {
        ts_sgd_config s = TS_SGD_CONFIG_INIT;
        s.lr = 0.01f;
        s.momentum = 0.9f;
        s.weight_decay = 1e-4f;
        st = ts_optim_sgd_new(&r->params, &s, &r->opt);
    }
    int64_t xs[4] = {c->batch, 1, 28, 28};
    if (st == TS_OK) st = ts_tensor_empty(ts_device_cpu(), TS_F32, 4, xs, &r->x);
    if (st == TS_OK) st = ts_tensor_uniform_(r->x, 0.0f, 1.0f, &rng);
    int64_t labels[16];
    for (int64_t i = 0; i < c->batch; i++) labels[i] = (i * 3) % 10;
    if (st == TS_OK) st = ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &c->batch, labels, &r->y);
    if (st != TS_OK) {
        fprintf(stderr, "%s: building the rig: %s\n", c->name, ts_last_error());
        rig_free(r);
        return false;
    }
    return true;
}

/* What one step did. */
typedef struct step_out {
    ts_status st;             /* first failing status, TS_OK if none */
    const char *where;        /* the call that failed */
    char msg[TS_ERRMSG_MAX];  /* its message */
    bool missing_grad;        /* backward said TS_OK but a parameter has no gradient */
    bool params_changed;      /* the optimizer step failed but changed a parameter */
} step_out;

static double param_checksum(const rig *r) {
    double s = 0;
    for (int i = 0; i < r->params.n; i++) {
        ts_tensor *p = r->params.tensors[i];
        const float *d = ts_tensor_data_f32(p);
        for (int64_t k = 0; k < ts_tensor_numel(p); k++) s += (double)d[k] * (double)((k % 7) + 1);
    }
    return s;
}

/* forward, cross-entropy, backward, optimizer step, zero_grad */
static void run_step(rig *r, step_out *o) {
    memset(o, 0, sizeof *o);
    ts_clear_error();
    ts_tensor *logits = NULL, *loss = NULL;
    o->where = "forward";
    o->st = ts_module_forward(r->m, r->x, &logits);
    if (o->st == TS_OK) {
        o->where = "cross_entropy";
        o->st = ts_cross_entropy(logits, r->y, 0.0f, &loss);
    }
    if (o->st == TS_OK) {
        o->where = "backward";
        o->st = ts_backward(loss, NULL, false);
    }
    if (o->st == TS_OK)
        for (int i = 0; i < r->params.n; i++) o->missing_grad |= ts_tensor_grad(r->params.tensors[i]) == NULL;
    if (o->st == TS_OK) {
        o->where = "optimizer_step";
        double before = param_checksum(r);
        o->st = ts_optimizer_step(r->opt);
        o->params_changed = o->st != TS_OK && param_checksum(r) != before;
    }
    if (o->st != TS_OK) snprintf(o->msg, sizeof o->msg, "%s", ts_last_error());
    ts_optimizer_zero_grad(r->opt);
    ts_tensor_release(logits);
    ts_tensor_release(loss);
}

/* Allocations of one step (the first or the second one of a fresh rig). */
static long count_step_allocs(const step_case *c, bool second) {
    rig r;
    if (!rig_new(c, &r)) return -1;
    step_out o;
    if (second) run_step(&r, &o);
    ts__alloc_fail_after(LONG_MAX);
    run_step(&r, &o);
    long n = ts__alloc_count();
    ts__alloc_fail_after(-1);
    CHECK_OK(o.st);
    CHECK(!o.missing_grad);
    rig_free(&r);
    return n;
}

typedef struct sweep_stats {
    long allocs, runs, injected_runs, failed_in[4];
} sweep_stats;

static int where_index(const char *w) {
    return strcmp(w, "forward") == 0 ? 0 : strcmp(w, "cross_entropy") == 0 ? 1 : strcmp(w, "backward") == 0 ? 2 : 3;
}

/* One armed step per N = 0 .. allocs, each on a fresh rig. */
static void sweep(const step_case *c, bool second, bool once, sweep_stats *ss) {
    memset(ss, 0, sizeof *ss);
    ss->allocs = count_step_allocs(c, second);
    CHECK(ss->allocs > 0);
    if (ss->allocs <= 0) return;
    const char *mode = once ? "once" : "from then on";
    for (long n = 0; n <= ss->allocs + 1; n++) {
        rig r;
        if (!rig_new(c, &r)) {
            tu_failures++;
            return;
        }
        step_out o;
        if (second) {
            run_step(&r, &o);
            CHECK_OK(o.st);
        }
        if (once)
            ts__alloc_fail_once_after(n);
        else
            ts__alloc_fail_after(n);
        run_step(&r, &o);
        long injected = ts__alloc_failures();
        ts__alloc_fail_after(-1);
        ss->runs++;
        bool bad = false;
        if (injected > 0) {
            ss->injected_runs++;
            ss->failed_in[where_index(o.where)] += o.st != TS_OK;
            bad = o.st != TS_ERR_NOMEM || !strstr(o.msg, "memory") || o.params_changed;
        } else {
            bad = o.st != TS_OK || o.missing_grad;
            CHECK(n >= ss->allocs); /* every allocation before the count is a point that fails */
        }
        if (o.missing_grad && injected > 0) bad = true;
        if (bad) {
            tu_failures++;
            fprintf(stderr,
                    "%s (%s step, fail %s after %ld of %ld allocations): %ld injected, %s returned %s%s%s '%s'\n",
                    c->name, second ? "second" : "first", mode, n, ss->allocs, injected, o.where,
                    ts_status_name(o.st), o.missing_grad ? ", a gradient is missing" : "",
                    o.params_changed ? ", parameters changed" : "", o.msg);
        }
        /* the same model trains a clean step afterwards */
        step_out again;
        run_step(&r, &again);
        if (again.st != TS_OK || again.missing_grad) {
            tu_failures++;
            fprintf(stderr, "%s: the clean step after failing at allocation %ld (%s): %s returned %s '%s'%s\n",
                    c->name, n, mode, again.where, ts_status_name(again.st), again.msg,
                    again.missing_grad ? ", a gradient is missing" : "");
        }
        rig_free(&r);
    }
    fprintf(stderr,
            "  %s, %s step, fail %s: %ld allocations, %ld runs with a failure (it surfaced in forward %ld, "
            "cross_entropy %ld, backward %ld, optimizer step %ld)\n",
            c->name, second ? "second" : "first", mode, ss->allocs, ss->injected_runs, ss->failed_in[0],
            ss->failed_in[1], ss->failed_in[2], ss->failed_in[3]);
    CHECK(ss->injected_runs == ss->allocs);
}

static void sweep_all(const step_case *c) {
    /* one kernel thread: the steps are tiny and the machine may be shared (the
     * allocations are the same for any thread count) */
    ts_set_num_threads(1);
    sweep_stats ss;
    for (int second = 0; second < 2; second++)
        for (int once = 1; once >= 0; once--) sweep(c, second, once, &ss);
}

static void test_cnn_sgd(void) {
    step_case c = {"reference CNN + SGD", ts_model_reference_cnn, false, 2};
    sweep_all(&c);
}

static void test_mlp_sgd(void) {
    step_case c = {"MLP + SGD", ts_model_mlp, false, 4};
    sweep_all(&c);
}

static void test_mlp_adamw(void) {
    step_case c = {"MLP + AdamW", ts_model_mlp, true, 4};
    sweep_all(&c);
}

/* The hook itself: counts, once vs from then on, disarming. */
static void test_hook(void) {
    ts__alloc_fail_once_after(1);
    void *a = ts__malloc(8), *b = ts__malloc(8), *c = ts__malloc(8);
    CHECK(a && !b && c);
    CHECK(strstr(ts_last_error(), "memory") != NULL);
    CHECK(ts__alloc_failures() == 1);
    CHECK(ts__alloc_count() == 2); /* once fired, the hook disarms itself */
    free(a);
    free(c);
    ts__alloc_fail_after(0);
    ts_tensor *t = NULL;
    CHECK_STATUS(ts_tensor_empty(ts_device_cpu(), TS_F32, 1, (int64_t[]){4}, &t), TS_ERR_NOMEM);
    char *s = ts__strdup("x");
    void *r = ts__realloc(NULL, 4);
    CHECK(!s && !r);
    CHECK(ts__alloc_failures() == 3);
    ts__alloc_fail_after(-1);
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_F32, 1, (int64_t[]){4}, &t));
    ts_tensor_release(t);
    CHECK(ts__alloc_failures() == 0 && ts__alloc_count() == 0);
    /* device memory: the hook sits above the CPU allocator's cache */
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_F32, 1, (int64_t[]){1024}, &t));
    ts_tensor_release(t); /* its block may now sit in the cache */
    ts__alloc_fail_once_after(2); /* the tensor struct, the storage struct, then the data */
    CHECK_STATUS(ts_tensor_empty(ts_device_cpu(), TS_F32, 1, (int64_t[]){1024}, &t), TS_ERR_NOMEM);
    CHECK(strstr(ts_last_error(), "device cpu") != NULL);
    ts__alloc_fail_after(-1);
}

/* ts__node_new's contract as ops see it: no graph needed is NULL and TS_OK (no
 * allocation); out of memory anywhere in an op that records a node fails the
 * op with TS_ERR_NOMEM and no result. */
static void test_node_new_contract(void) {
    ts_tensor *x = NULL, *y = NULL, *p = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){3}, 1.0f, &x));
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){3}, 2.0f, &p));
    ts_tensor_set_requires_grad(p, true);
    long plain = -1, recorded = -1;
    ts__alloc_fail_after(LONG_MAX);
    CHECK_OK(ts_mul(x, x, &y)); /* nothing requires grad */
    plain = ts__alloc_count();
    CHECK(!ts_tensor_requires_grad(y));
    ts_tensor_release(y);
    bool prev = ts_grad_set_enabled(false);
    ts__alloc_fail_after(LONG_MAX);
    CHECK_OK(ts_mul(p, x, &y)); /* grad mode off */
    CHECK(ts__alloc_count() == plain && !ts_tensor_requires_grad(y));
    ts_tensor_release(y);
    ts_grad_set_enabled(prev);
    CHECK_OK(ts_mul(p, x, &y)); /* creates p's accumulate node */
    ts_tensor_release(y);
    ts__alloc_fail_after(LONG_MAX);
    CHECK_OK(ts_mul(p, x, &y)); /* a node and two saved aliases */
    recorded = ts__alloc_count();
    ts__alloc_fail_after(-1);
    CHECK(ts_tensor_requires_grad(y));
    CHECK(recorded > plain);
    ts_tensor_release(y);
    ts_tensor_zero_grad(p);
    for (long n = 0; n <= recorded; n++) {
        y = NULL;
        ts__alloc_fail_once_after(n);
        ts_status st = ts_mul(p, x, &y);
        long inj = ts__alloc_failures();
        ts__alloc_fail_after(-1);
        if (n < recorded) {
            CHECK(inj == 1);
            CHECK_STATUS(st, TS_ERR_NOMEM);
            CHECK(y == NULL);
            CHECK(strstr(ts_last_error(), "memory") != NULL);
        } else {
            CHECK(inj == 0);
            CHECK_OK(st);
            CHECK(y && ts_tensor_requires_grad(y));
        }
        ts_tensor_release(y);
    }
    ts_tensor_release(x);
    ts_tensor_release(p);
}

/* A graph larger than the engine's first node list (64): out of memory at any
 * allocation of a retain_graph pass, then a clean pass over the same graph
 * gives the exact gradients (a failed pass leaves no node marked or holding a
 * gradient). h = x * w * w * ... (100 times), w = 1: d/dw = 100 x, d/dx = 1. */
static void test_backward_recovers(void) {
    enum { CHAIN = 100 };
    ts_set_num_threads(1);
    const float xv[4] = {1, 2, 3, 4};
    ts_tensor *x = NULL, *w = NULL, *h = NULL, *loss = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_F32, 1, (int64_t[]){4}, xv, &x));
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){4}, 1.0f, &w));
    ts_tensor_set_requires_grad(x, true);
    ts_tensor_set_requires_grad(w, true);
    h = ts_tensor_retain(x);
    for (int k = 0; k < CHAIN; k++) {
        ts_tensor *next = NULL;
        CHECK_OK(ts_mul(h, w, &next));
        ts_tensor_release(h);
        h = next;
    }
    CHECK_OK(ts_sum(h, &loss));
    ts__alloc_fail_after(LONG_MAX);
    CHECK_OK(ts_backward(loss, NULL, true));
    long allocs = ts__alloc_count();
    ts__alloc_fail_after(-1);
    CHECK(allocs > 2 * CHAIN);
    long failed = 0;
    for (long n = 0; n <= allocs; n++) {
        for (int once = 0; once < 2; once++) {
            ts_tensor_zero_grad(x);
            ts_tensor_zero_grad(w);
            ts_clear_error();
            if (once)
                ts__alloc_fail_once_after(n);
            else
                ts__alloc_fail_after(n);
            ts_status st = ts_backward(loss, NULL, true);
            long inj = ts__alloc_failures();
            ts__alloc_fail_after(-1);
            if (inj > 0) {
                failed++;
                if (st != TS_ERR_NOMEM || !strstr(ts_last_error(), "memory")) {
                    tu_failures++;
                    fprintf(stderr, "backward failing at allocation %ld: %s '%s'\n", n, ts_status_name(st),
                            ts_last_error());
                }
            } else {
                CHECK_OK(st);
            }
            ts_tensor_zero_grad(x);
            ts_tensor_zero_grad(w);
            st = ts_backward(loss, NULL, true);
            CHECK_OK(st);
            ts_tensor *gx = ts_tensor_grad(x), *gw = ts_tensor_grad(w);
            bool good = st == TS_OK && gx && gw;
            for (int k = 0; good && k < 4; k++)
                good = ts_tensor_item(gx, k) == 1.0 && ts_tensor_item(gw, k) == (double)CHAIN * xv[k];
            if (!good) {
                tu_failures++;
                fprintf(stderr, "the clean pass after failing at allocation %ld (%s) gave wrong gradients\n", n,
                        once ? "once" : "from then on");
            }
        }
    }
    fprintf(stderr, "  backward over %d nodes: %ld allocations, %ld failing passes\n", CHAIN + 2, allocs, failed);
    CHECK(failed == 2 * allocs);
    ts_tensor_release(loss);
    ts_tensor_release(h);
    ts_tensor_release(x);
    ts_tensor_release(w);
}

TU_MAIN(T(test_hook), T(test_node_new_contract), T(test_backward_recovers), T(test_mlp_sgd), T(test_mlp_adamw), T(test_cnn_sgd))
