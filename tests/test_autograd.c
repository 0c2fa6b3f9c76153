/* Autograd engine and the core ops: elementwise, matmul, linear. */
#include "test_util.h"

#include "autograd/autograd.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static ts_status f_add(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_add(in[0], in[1], out); }
static ts_status f_sub(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_sub(in[0], in[1], out); }
static ts_status f_mul(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_mul(in[0], in[1], out); }
static ts_status f_scale(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_scale(in[0], -1.5f, out); }
static ts_status f_relu(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_relu(in[0], out); }
static ts_status f_sum(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_sum(in[0], out); }
static ts_status f_mean(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_mean(in[0], out); }
static ts_status f_matmul(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_matmul(in[0], in[1], out); }
static ts_status f_linear(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_linear(in[0], in[1], in[2], out); }

static void test_grad_elementwise(void) {
    ts_rng r;
    ts_rng_seed(&r, 1);
    int64_t s[3] = {2, 3, 4}, sb[2] = {1, 4}, sc[1] = {1};
    ts_tensor *a = tu_rand(&r, 3, s, -1, 1, true), *b = tu_rand(&r, 3, s, -1, 1, true);
    ts_tensor *bb = tu_rand(&r, 2, sb, -1, 1, true), *c = tu_rand(&r, 1, sc, -1, 1, true);
    ts_tensor *in[2] = {a, b};
    CHECK(tu_gradcheck("add", f_add, in, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    CHECK(tu_gradcheck("sub", f_sub, in, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    CHECK(tu_gradcheck("mul", f_mul, in, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    ts_tensor *inb[2] = {a, bb}; /* broadcast (2,3,4) with (1,4) */
    CHECK(tu_gradcheck("add broadcast", f_add, inb, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    CHECK(tu_gradcheck("mul broadcast", f_mul, inb, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    ts_tensor *inc[2] = {c, a}; /* scalar-like on the left */
    CHECK(tu_gradcheck("sub broadcast", f_sub, inc, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    CHECK(tu_gradcheck("scale", f_scale, in, 1, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    CHECK(tu_gradcheck("relu", f_relu, in, 1, NULL, 1e-3, 1e-3, 1e-2) <= 1);
    CHECK(tu_gradcheck("sum", f_sum, in, 1, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    CHECK(tu_gradcheck("mean", f_mean, in, 1, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    ts_tensor *o = NULL;
    int64_t s2[2] = {3, 5};
    ts_tensor *x = tu_rand(&r, 2, s2, -1, 1, false);
    CHECK_STATUS(ts_add(a, x, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[2, 3, 4]");
    ts_tensor_release(x);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(bb);
    ts_tensor_release(c);
}

static void test_grad_linear(void) {
    ts_rng r;
    ts_rng_seed(&r, 2);
    int64_t sa[2] = {5, 7}, sb[2] = {7, 3}, sw[2] = {4, 7}, sbias[1] = {4};
    ts_tensor *a = tu_rand(&r, 2, sa, -1, 1, true), *b = tu_rand(&r, 2, sb, -1, 1, true);
    ts_tensor *w = tu_rand(&r, 2, sw, -1, 1, true), *bias = tu_rand(&r, 1, sbias, -1, 1, true);
    ts_tensor *in[3] = {a, b, NULL};
    CHECK(tu_gradcheck("matmul", f_matmul, in, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    ts_tensor *inl[3] = {a, w, bias};
    CHECK(tu_gradcheck("linear", f_linear, inl, 3, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    ts_tensor *inn[3] = {a, w, NULL};
    CHECK(tu_gradcheck("linear no bias", f_linear, inn, 3, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    /* a known value: [1 2; 3 4] @ [5; 6] = [17; 39] */
    ts_tensor *m = tu_tensor(2, (int64_t[]){2, 2}, (float[]){1, 2, 3, 4});
    ts_tensor *v = tu_tensor(2, (int64_t[]){2, 1}, (float[]){5, 6});
    ts_tensor *o = NULL;
    CHECK_OK(ts_matmul(m, v, &o));
    CHECK_NEAR(ts_tensor_data_f32(o)[0], 17, 0);
    CHECK_NEAR(ts_tensor_data_f32(o)[1], 39, 0);
    ts_tensor_release(o);
    CHECK_STATUS(ts_matmul(v, v, &o), TS_ERR_SHAPE);
    CHECK_STATUS(ts_linear(a, b, NULL, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("linear");
    ts_tensor *objs[] = {a, b, w, bias, m, v};
    for (size_t i = 0; i < 6; i++) ts_tensor_release(objs[i]);
}

/* gradients accumulate across backward calls; set_to_none clears */
static void test_accumulate_and_reuse(void) {
    ts_tensor *x = tu_tensor(1, (int64_t[]){3}, (float[]){1, 2, 3});
    ts_tensor_set_requires_grad(x, true);
    for (int pass = 0; pass < 2; pass++) {
        ts_tensor *y = NULL, *z = NULL, *s = NULL;
        CHECK_OK(ts_mul(x, x, &y)); /* x used twice in one op */
        CHECK_OK(ts_add(y, x, &z)); /* and again: d/dx = 2x + 1 */
        CHECK_OK(ts_sum(z, &s));
        CHECK_OK(ts_backward(s, NULL, false));
        ts_tensor_release(y);
        ts_tensor_release(z);
        ts_tensor_release(s);
    }
    float *g = ts_tensor_data_f32(ts_tensor_grad(x));
    CHECK_NEAR(g[0], 2 * 3, 1e-6);
    CHECK_NEAR(g[2], 2 * 7, 1e-6);
    ts_tensor_zero_grad(x);
    CHECK(ts_tensor_grad(x) == NULL);
    ts_tensor_release(x);
}

static void test_no_grad_and_errors(void) {
    ts_tensor *x = tu_tensor(1, (int64_t[]){2}, (float[]){1, 2});
    ts_tensor_set_requires_grad(x, true);
    bool prev = ts_grad_set_enabled(false);
    CHECK(prev);
    ts_tensor *y = NULL;
    CHECK_OK(ts_scale(x, 2, &y));
    CHECK(!ts_tensor_requires_grad(y));
    CHECK_STATUS(ts_backward(y, NULL, false), TS_ERR_STATE);
    ts_tensor_release(y);
    ts_grad_set_enabled(true);
    /* second backward without retain_graph */
    ts_tensor *z = NULL, *s = NULL;
    CHECK_OK(ts_mul(x, x, &z));
    CHECK_OK(ts_sum(z, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    CHECK_STATUS(ts_backward(s, NULL, false), TS_ERR_STATE);
    CHECK_ERR_MENTIONS("second time");
    ts_tensor_release(s);
    ts_tensor_release(z);
    /* retain_graph allows it */
    ts_tensor_zero_grad(x);
    CHECK_OK(ts_mul(x, x, &z));
    CHECK_OK(ts_sum(z, &s));
    CHECK_OK(ts_backward(s, NULL, true));
    CHECK_OK(ts_backward(s, NULL, false));
    CHECK_NEAR(ts_tensor_data_f32(ts_tensor_grad(x))[1], 8, 1e-6);
    /* non-scalar root needs an explicit gradient */
    CHECK_STATUS(ts_backward(z, NULL, false), TS_ERR_SHAPE);
    ts_tensor_release(s);
    ts_tensor_release(z);
    ts_tensor_release(x);
}

/* The grad-ready hook fires once per leaf per pass, after its gradient is
 * final, in reverse order of use (the last layer first). */
typedef struct {
    ts_tensor *order[8];
    int n;
    float seen[8];
} hook_log;

static void on_ready(ts_tensor *t, void *user) {
    hook_log *h = user;
    h->seen[h->n] = ts_tensor_data_f32(ts_tensor_grad(t))[0];
    h->order[h->n++] = t;
}

static void test_grad_ready_hook(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){4, 3}, -1, 1, false);
    ts_tensor *w1 = tu_rand(&r, 2, (int64_t[]){5, 3}, -1, 1, true);
    ts_tensor *w2 = tu_rand(&r, 2, (int64_t[]){2, 5}, -1, 1, true);
    hook_log h = {0};
    ts_tensor_add_grad_ready_hook(w1, on_ready, &h);
    int id2 = ts_tensor_add_grad_ready_hook(w2, on_ready, &h);
    ts_tensor *h1 = NULL, *a1 = NULL, *h2 = NULL, *h3 = NULL, *l = NULL;
    CHECK_OK(ts_linear(x, w1, NULL, &h1));
    CHECK_OK(ts_relu(h1, &a1));
    CHECK_OK(ts_linear(a1, w2, NULL, &h2));
    CHECK_OK(ts_mul(h2, h2, &h3));
    CHECK_OK(ts_sum(h3, &l));
    CHECK_OK(ts_backward(l, NULL, false));
    CHECK(h.n == 2);
    CHECK(h.order[0] == w2 && h.order[1] == w1);
    CHECK(h.seen[0] == ts_tensor_data_f32(ts_tensor_grad(w2))[0]);
    ts_tensor_remove_grad_ready_hook(w2, id2);
    ts_tensor *objs[] = {h1, a1, h2, h3, l, x, w1, w2};
    for (size_t i = 0; i < 8; i++) ts_tensor_release(objs[i]);
}

/* Releasing every tensor frees the whole graph (checked by ASan in the sanitizer build). */
static void test_graph_lifetime(void) {
    size_t before = ts_device_memory_allocated(ts_device_cpu());
    ts_rng r;
    ts_rng_seed(&r, 4);
    ts_tensor *w = tu_rand(&r, 2, (int64_t[]){8, 8}, -1, 1, true);
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){8, 8}, -1, 1, false);
    ts_tensor *y = NULL, *s = NULL;
    CHECK_OK(ts_matmul(x, w, &y));
    CHECK_OK(ts_mean(y, &s));
    ts_tensor_release(x);
    ts_tensor_release(y); /* the graph keeps what backward needs */
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor_release(s);
    ts_tensor_release(w);
    CHECK(ts_device_memory_allocated(ts_device_cpu()) == before);
}

/* A backward that passes one gradient tensor to two inputs (add) must not let a
 * later accumulation into one input's gradient change the other's. */
static void test_shared_gradient_not_aliased(void) {
    ts_tensor *p = tu_tensor(1, (int64_t[]){1}, (float[]){1});
    ts_tensor *q = tu_tensor(1, (int64_t[]){1}, (float[]){1});
    ts_tensor_set_requires_grad(p, true);
    ts_tensor_set_requires_grad(q, true);
    ts_tensor *a = NULL, *b = NULL, *w = NULL, *z = NULL, *s1 = NULL, *s2 = NULL, *l = NULL;
    CHECK_OK(ts_relu(p, &a));
    CHECK_OK(ts_relu(q, &b));
    CHECK_OK(ts_scale(a, 3, &w));
    CHECK_OK(ts_add(a, b, &z));
    CHECK_OK(ts_sum(z, &s1));
    CHECK_OK(ts_sum(w, &s2));
    CHECK_OK(ts_add(s1, s2, &l));
    CHECK_OK(ts_backward(l, NULL, false));
    CHECK_NEAR(ts_tensor_data_f32(ts_tensor_grad(p))[0], 4, 1e-6);
    CHECK_NEAR(ts_tensor_data_f32(ts_tensor_grad(q))[0], 1, 1e-6);
    ts_tensor *objs[] = {p, q, a, b, w, z, s1, s2, l};
    for (size_t i = 0; i < 9; i++) ts_tensor_release(objs[i]);
}

/* An identity op whose backward records that it ran. */
static int probe_ran;
static ts_status probe_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    probe_ran = 1;
    gin[0] = ts_tensor_retain(g);
    return TS_OK;
}
static ts_tensor *probe(ts_tensor *x) {
    ts_tensor *o = NULL;
    ts_tensor_clone(x, &o);
    const ts_tensor *in[1] = {x};
    ts_node *n = NULL;
    CHECK_OK(ts__node_new("probe", probe_backward, 1, in, &n));
    CHECK_OK(ts__node_attach(n, o));
    return o;
}
static void on_ready_probe(ts_tensor *t, void *user) { *(int *)user = probe_ran ? 2 : 1; }

/* In every iteration (not only the first), a leaf's hook fires as soon as its
 * gradient is final: w2's before the backward of anything earlier in forward. */
static void test_hook_fires_early_every_iteration(void) {
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){4, 3}, -1, 1, false);
    ts_tensor *w1 = tu_rand(&r, 2, (int64_t[]){5, 3}, -1, 1, true);
    ts_tensor *w2 = tu_rand(&r, 2, (int64_t[]){2, 5}, -1, 1, true);
    int seen = 0;
    ts_tensor_add_grad_ready_hook(w2, on_ready_probe, &seen);
    for (int it = 0; it < 3; it++) {
        probe_ran = 0;
        seen = 0;
        ts_tensor *h1 = NULL, *h2 = NULL, *l = NULL;
        CHECK_OK(ts_linear(x, w1, NULL, &h1));
        ts_tensor *p = probe(h1);
        CHECK_OK(ts_linear(p, w2, NULL, &h2));
        CHECK_OK(ts_sum(h2, &l));
        CHECK_OK(ts_backward(l, NULL, false));
        CHECK(probe_ran == 1);
        CHECK(seen == 1); /* the hook ran before the probe's backward */
        ts_tensor *objs[] = {h1, p, h2, l};
        for (size_t i = 0; i < 4; i++) ts_tensor_release(objs[i]);
        ts_tensor_zero_grad(w1);
        ts_tensor_zero_grad(w2);
    }
    ts_tensor_release(x);
    ts_tensor_release(w1);
    ts_tensor_release(w2);
}

/* A node with more inputs than it stores inline (TS_NODE_INLINE_INPUTS): out =
 * sum_i (i + 1) * x_i, recorded as ONE node over 21 inputs, some of them not
 * requiring grad, one used twice and one the output of another op. */
#define MANY 21
static ts_status many_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    for (int i = 0; i < n->ninputs; i++) {
        if (!n->needs[i]) continue;
        if (n->in_ndim[i] != 1 || n->in_shape[i][0] != 3) return ts_error(TS_ERR_INTERNAL, "input %d's shape lost", i);
        TS_TRY(ts_scale(g, (float)(i + 1), &gin[i]));
    }
    return TS_OK;
}

static void test_node_many_inputs(void) {
    CHECK(MANY > TS_NODE_INLINE_INPUTS);
    ts_rng r;
    ts_rng_seed(&r, 6);
    ts_tensor *x[MANY], *y = NULL, *out = NULL, *s = NULL;
    for (int i = 0; i < MANY; i++) x[i] = tu_rand(&r, 1, (int64_t[]){3}, -1, 1, i % 5 != 3);
    CHECK_OK(ts_scale(x[20], 2.0f, &y)); /* input 19 is y = 2 x20: x20 gets 2 * 20 + 21 */
    const ts_tensor *in[MANY];
    for (int i = 0; i < MANY; i++) in[i] = x[i];
    in[19] = y;
    in[9] = x[0]; /* x0 twice: 1 + 10 */
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, (int64_t[]){3}, &out));
    ts_node *n = NULL;
    CHECK_OK(ts__node_new("many", many_backward, MANY, in, &n));
    CHECK(n != NULL);
    if (!n) return;
    CHECK(n->ninputs == MANY && n->needs[20] && !n->needs[3] && n->next[19] == y->grad_fn);
    CHECK_OK(ts__node_attach(n, out));
    CHECK_OK(ts_sum(out, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    for (int i = 0; i < MANY; i++) {
        ts_tensor *g = ts_tensor_grad(x[i]);
        double want = i == 0 ? 11 : i == 20 ? 61 : i == 9 || i == 19 || i % 5 == 3 ? 0 : i + 1;
        if (want == 0) {
            CHECK(g == NULL);
            continue;
        }
        CHECK(g != NULL);
        for (int k = 0; g && k < 3; k++) CHECK_NEAR(ts_tensor_item(g, k), want, 1e-6);
    }
    ts_tensor_release(s);
    ts_tensor_release(out);
    ts_tensor_release(y);
    for (int i = 0; i < MANY; i++) ts_tensor_release(x[i]); /* frees the node's heap arrays (ASan) */
}

/* Debug builds: fn(arg) must die of an internal assertion (abort). */
#ifndef NDEBUG
static void expect_abort(const char *what, void (*fn)(void *), void *arg) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        fn(arg);
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT)) {
        tu_failures++;
        fprintf(stderr, "%s: expected an assertion failure (abort), got status %d\n", what, status);
    }
}
static void read_slot_1(void *n) { (void)ts__node_saved(n, 1); }
static void read_slot_neg(void *n) { (void)ts__node_saved(n, -1); }
static void save_ninth(void *n) {
    for (int i = 0; i < TS_NODE_MAX_SAVED + 1; i++) (void)ts__node_save(n, NULL);
}
#endif

/* A node's saved slots are bounds-checked: reading past what was saved is an
 * assertion in debug builds and NULL in release builds; saving more than
 * TS_NODE_MAX_SAVED is an assertion / TS_ERR_INTERNAL reported by attach. */
static void test_node_saved_slots(void) {
    ts_rng r;
    ts_rng_seed(&r, 9);
    ts_tensor *x = tu_rand(&r, 1, (int64_t[]){3}, -1, 1, true), *y = NULL, *o = NULL;
    CHECK_OK(ts_relu(x, &y)); /* saves its output: one slot */
    ts_node *n = y->grad_fn;
    CHECK(n && n->nsaved == 1 && ts__node_saved(n, 0) != NULL);
    ts_node *m = NULL;
    const ts_tensor *in[1] = {x};
    CHECK_OK(ts__node_new("probe", probe_backward, 1, in, &m));
#ifdef NDEBUG
    CHECK(ts__node_saved(n, 1) == NULL && ts__node_saved(n, -1) == NULL);
    ts_status last = TS_OK;
    for (int i = 0; i < TS_NODE_MAX_SAVED + 1; i++) last = ts__node_save(m, x);
    CHECK(last == TS_ERR_INTERNAL);
    CHECK_ERR_MENTIONS("probe");
    CHECK_OK(ts_tensor_clone(x, &o));
    CHECK_STATUS(ts__node_attach(m, o), TS_ERR_INTERNAL); /* releases m */
    CHECK(ts_tensor_is_leaf(o));
#else
    expect_abort("saved slot 1 of 1", read_slot_1, n);
    expect_abort("saved slot -1", read_slot_neg, n);
    expect_abort("a ninth saved tensor", save_ninth, m);
    ts__node_release(m);
#endif
    ts_tensor_release(o);
    ts_tensor_release(y);
    ts_tensor_release(x);
}

TU_MAIN(T(test_node_many_inputs), T(test_hook_fires_early_every_iteration), T(test_shared_gradient_not_aliased), T(test_grad_elementwise), T(test_grad_linear), T(test_accumulate_and_reuse), T(test_no_grad_and_errors),
        T(test_grad_ready_hook), T(test_graph_lifetime), T(test_node_saved_slots))
