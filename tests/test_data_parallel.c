/* Data parallelism in one process over virtual CPU devices (4 of them here):
 * torch.chunk splits (scatter), gather, replicate (Broadcast semantics: the
 * gradient of every replica sums into the module), parallel_apply (concurrent,
 * errors name the device), ts_data_parallel and the DataParallel module.
 *
 * Equivalence: for uneven batches (10 over 4, 3 over 2, 2 over 4, 1 over 2,
 * 64 over 2), the loss and every parameter gradient equal those of one device
 * (max abs difference <= 1e-5; the figures are printed): the MLP and the
 * reference CNN in eval mode against the whole batch on "cpu"; the CNN in
 * training mode (each replica normalises its own chunk, as in PyTorch) against
 * the same chunks run one after another on "cpu", running statistics included
 * (only devs[0]'s chunk updates them). Also: one-device DataParallel, modules
 * without parameters or with buffers only, replicas returning 0-dimensional
 * outputs, eval under no-grad, retain_graph,
 * a batch of 0, errors, and that forward AND backward of the replicas really
 * run at the same time (two replicas that wait for each other). */
#include "autograd/autograd.h"
#include "nn/module.h"
#include "test_util.h"

#include <stdatomic.h>

#define NDEV 4
#define TOL 1e-5

static ts_device *dev(const char *name) {
    ts_device *d = NULL;
    CHECK_OK(ts_device_get(name, &d));
    return d;
}

static ts_device *D[NDEV]; /* cpu:0 .. cpu:3 */

static void get_devices(void) {
    char name[16];
    for (int i = 0; i < NDEV; i++) {
        snprintf(name, sizeof name, "cpu:%d", i);
        D[i] = dev(name);
    }
}

/* Largest |a - b| over two tensors of equal numel, on any devices. */
static double max_diff(const ts_tensor *a, const ts_tensor *b) {
    if (!a || !b) return a == b ? 0.0 : INFINITY;
    int64_t n = ts_tensor_numel(a);
    if (n != ts_tensor_numel(b)) return INFINITY;
    float *pa = malloc(sizeof(float) * (size_t)(n ? n : 1)), *pb = malloc(sizeof(float) * (size_t)(n ? n : 1));
    double m = 0;
    if (ts_tensor_to_host(a, pa, sizeof(float) * (size_t)n) != TS_OK ||
        ts_tensor_to_host(b, pb, sizeof(float) * (size_t)n) != TS_OK)
        m = INFINITY;
    for (int64_t i = 0; i < n && isfinite(m); i++) m = fmax(m, fabs((double)pa[i] - pb[i]));
    free(pa);
    free(pb);
    return m;
}

static ts_tensor *labels(ts_rng *r, int64_t n) {
    int64_t *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = (int64_t)ts_rng_below(r, 10);
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &n, v, &t));
    free(v);
    return t;
}

static ts_module *model(const char *name, uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *m = NULL;
    CHECK_OK(ts_model_by_name(name, &r, &m));
    return m;
}

/* ---- chunk sizes, scatter, gather -------------------------------------------------------------------- */
static void test_chunk_sizes(void) {
    int64_t s[8];
    CHECK(ts_chunk_sizes(10, 4, s) == 4 && s[0] == 3 && s[1] == 3 && s[2] == 3 && s[3] == 1);
    CHECK(ts_chunk_sizes(2, 4, s) == 2 && s[0] == 1 && s[1] == 1);
    CHECK(ts_chunk_sizes(6, 4, s) == 3 && s[0] == 2 && s[1] == 2 && s[2] == 2);
    CHECK(ts_chunk_sizes(7, 3, s) == 3 && s[0] == 3 && s[1] == 3 && s[2] == 1);
    CHECK(ts_chunk_sizes(3, 2, s) == 2 && s[0] == 2 && s[1] == 1);
    CHECK(ts_chunk_sizes(64, 1, s) == 1 && s[0] == 64);
    CHECK(ts_chunk_sizes(0, 4, s) == 4 && s[0] == 0 && s[3] == 0);
    CHECK(ts_chunk_sizes(5, 0, s) == 0);
}

static void test_scatter_gather(void) {
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){10, 3}, -1, 1, true);
    ts_tensor *chunks[NDEV];
    int count = 0;
    CHECK_OK(ts_scatter(x, D, NDEV, chunks, &count));
    CHECK(count == 4);
    const int64_t want[4] = {3, 3, 3, 1};
    for (int i = 0; i < count; i++) {
        CHECK(ts_tensor_device(chunks[i]) == D[i]);
        CHECK(ts_tensor_dim(chunks[i], 0) == want[i] && ts_tensor_dim(chunks[i], 1) == 3);
    }
    CHECK(ts_tensor_item(chunks[3], 2) == ts_tensor_item(x, 29));
    /* gather on cpu:1, weight the rows, backward: x.grad = the weights, on x's device */
    ts_tensor *y = NULL, *w = tu_rand(&r, 2, (int64_t[]){10, 3}, -1, 1, false), *wd = NULL, *p = NULL, *s = NULL;
    CHECK_OK(ts_gather(chunks, count, D[1], &y));
    CHECK(y && ts_tensor_device(y) == D[1] && ts_tensor_dim(y, 0) == 10);
    CHECK(max_diff(y, x) == 0);
    CHECK_OK(ts_to_device(w, D[1], &wd));
    CHECK_OK(ts_mul(y, wd, &p));
    CHECK_OK(ts_sum(p, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    CHECK(ts_tensor_grad(x) && ts_tensor_device(ts_tensor_grad(x)) == ts_device_cpu());
    CHECK(max_diff(ts_tensor_grad(x), w) == 0);
    ts_tensor *objs[] = {y, wd, p, s, w};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    for (int i = 0; i < count; i++) ts_tensor_release(chunks[i]);

    /* a batch smaller than the device count: 2 over 4 gives 2 chunks, the rest NULL */
    ts_tensor *two = tu_rand(&r, 2, (int64_t[]){2, 3}, -1, 1, false);
    CHECK_OK(ts_scatter(two, D, NDEV, chunks, &count));
    CHECK(count == 2 && chunks[2] == NULL && chunks[3] == NULL);
    CHECK(ts_tensor_dim(chunks[1], 0) == 1 && ts_tensor_device(chunks[1]) == D[1]);
    for (int i = 0; i < count; i++) ts_tensor_release(chunks[i]);
    ts_tensor_release(two);

    /* a batch of 0: one empty chunk per device; gathering them gives (0, 3) */
    ts_tensor *empty = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 2, (int64_t[]){0, 3}, &empty));
    ts_tensor_set_requires_grad(empty, true);
    CHECK_OK(ts_scatter(empty, D, NDEV, chunks, &count));
    CHECK(count == NDEV);
    for (int i = 0; i < count; i++)
        CHECK(chunks[i] && ts_tensor_dim(chunks[i], 0) == 0 && ts_tensor_device(chunks[i]) == D[i]);
    y = NULL;
    CHECK_OK(ts_gather(chunks, count, D[0], &y));
    CHECK(y && ts_tensor_dim(y, 0) == 0 && ts_tensor_dim(y, 1) == 3);
    ts_tensor_release(y);
    for (int i = 0; i < count; i++) ts_tensor_release(chunks[i]);
    ts_tensor_release(empty);

    /* errors */
    ts_tensor *scalar = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 0, NULL, 2.0f, &scalar));
    CHECK_STATUS(ts_scatter(scalar, D, NDEV, chunks, &count), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("0-dimensional");
    ts_device *dup[3] = {D[0], D[1], D[0]};
    CHECK_STATUS(ts_scatter(x, dup, 3, chunks, &count), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("cpu:0 appears twice");
    /* gather: scalars become a vector; mismatched shapes are refused */
    ts_tensor *sc[2] = {scalar, scalar};
    CHECK_OK(ts_gather(sc, 2, D[1], &y));
    CHECK(y && ts_tensor_ndim(y) == 1 && ts_tensor_dim(y, 0) == 2 && ts_tensor_item(y, 1) == 2.0);
    ts_tensor_release(y);
    ts_tensor *a = tu_rand(&r, 2, (int64_t[]){2, 3}, -1, 1, false), *b = tu_rand(&r, 2, (int64_t[]){2, 4}, -1, 1, false);
    ts_tensor *ab[2] = {a, b};
    CHECK_STATUS(ts_gather(ab, 2, D[0], &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("ts_gather");
    ts_tensor *mixed[2] = {a, scalar};
    CHECK_STATUS(ts_gather(mixed, 2, D[0], &y), TS_ERR_SHAPE);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(scalar);
    ts_tensor_release(x);
}

/* ---- replicate ------------------------------------------------------------------------------------- */
static void test_replicate(void) {
    ts_rng r;
    ts_rng_seed(&r, 2);
    ts_module *seq = NULL, *lin = NULL, *bn = NULL;
    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_linear_new(4, 3, true, &r, &lin));
    CHECK_OK(ts_nn_sequential_add(seq, "fc", lin));
    CHECK_OK(ts_nn_batchnorm2d_new(3, 1e-5f, 0.1f, true, true, &bn)); /* only its buffers matter here */
    CHECK_OK(ts_nn_sequential_add(seq, "bn", bn));
    ts_module *reps[2] = {NULL, NULL};
    /* the module must live on devs[0] */
    CHECK_STATUS(ts_replicate(seq, D, 2, reps), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("devs[0]");
    CHECK_ERR_MENTIONS("fc.weight");
    CHECK(reps[0] == NULL && reps[1] == NULL);
    CHECK_OK(ts_module_to(seq, D[0]));
    CHECK_OK(ts_replicate(seq, D, 2, reps));
    ts_tensor_list p0 = TS_TENSOR_LIST_INIT, p1 = TS_TENSOR_LIST_INIT, src = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(reps[0], &p0));
    CHECK_OK(ts_module_parameters(reps[1], &p1));
    CHECK_OK(ts_module_parameters(seq, &src));
    CHECK(p1.n == 4 && strcmp(p1.names[0], "fc.weight") == 0);
    CHECK(p0.tensors[0] == src.tensors[0]); /* on devs[0]: the parameter itself */
    CHECK(ts_tensor_device(p1.tensors[0]) == D[1] && !ts_tensor_is_leaf(p1.tensors[0]));
    CHECK(max_diff(p1.tensors[0], src.tensors[0]) == 0);
    /* buffers: devs[0]'s replica shares the module's, the others have copies */
    ts_tensor_list b0 = TS_TENSOR_LIST_INIT, b1 = TS_TENSOR_LIST_INIT, bs = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_buffers(reps[0], &b0));
    CHECK_OK(ts_module_buffers(reps[1], &b1));
    CHECK_OK(ts_module_buffers(seq, &bs));
    CHECK(b0.n == 3 && b0.tensors[0] == bs.tensors[0]);
    CHECK(b1.tensors[0] != bs.tensors[0] && ts_tensor_device(b1.tensors[0]) == D[1]);
    ts_tensor_list_clear(&b0);
    ts_tensor_list_clear(&b1);
    ts_tensor_list_clear(&bs);

    /* backward through both replicas sums into the module's parameters */
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){5, 4}, -1, 1, false), *x0 = NULL, *x1 = NULL;
    CHECK_OK(ts_to_device(x, D[0], &x0));
    CHECK_OK(ts_to_device(x, D[1], &x1));
    ts_module *fc0 = ts_module_child(reps[0], "fc"), *fc1 = ts_module_child(reps[1], "fc");
    ts_tensor *y0 = NULL, *y1 = NULL, *s0 = NULL, *s1 = NULL, *s1d = NULL, *tot = NULL;
    CHECK_OK(ts_module_forward(fc0, x0, &y0));
    CHECK_OK(ts_module_forward(fc1, x1, &y1));
    CHECK_OK(ts_sum(y0, &s0));
    CHECK_OK(ts_sum(y1, &s1));
    CHECK_OK(ts_to_device(s1, D[0], &s1d));
    CHECK_OK(ts_add(s0, s1d, &tot));
    CHECK_OK(ts_backward(tot, NULL, false));
    ts_tensor *gb = ts_tensor_grad(src.tensors[1]);
    CHECK(gb && ts_tensor_device(gb) == D[0]);
    for (int k = 0; gb && k < 3; k++) CHECK_NEAR(ts_tensor_item(gb, k), 10.0, 1e-6); /* 5 rows x 2 replicas */
    ts_tensor *objs[] = {x, x0, x1, y0, y1, s0, s1, s1d, tot};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_tensor_list_clear(&p0);
    ts_tensor_list_clear(&p1);
    ts_tensor_list_clear(&src);
    ts_module_free(reps[0]);
    ts_module_free(reps[1]);
    /* duplicates */
    ts_device *dup[2] = {D[0], D[0]};
    CHECK_STATUS(ts_replicate(seq, dup, 2, reps), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("appears twice");
    ts_module_free(seq);
}

/* ---- parallel_apply -------------------------------------------------------------------------------- */
static void test_parallel_apply(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_module *lin = NULL, *reps[2] = {NULL, NULL};
    CHECK_OK(ts_nn_linear_new(4, 2, true, &r, &lin));
    CHECK_OK(ts_module_to(lin, D[0]));
    CHECK_OK(ts_replicate(lin, D, 2, reps));
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){3, 4}, -1, 1, false), *x0 = NULL, *x1 = NULL, *ref = NULL;
    CHECK_OK(ts_to_device(x, D[0], &x0));
    CHECK_OK(ts_to_device(x, D[1], &x1));
    CHECK_OK(ts_module_forward(lin, x0, &ref));
    ts_tensor *in[2] = {x0, x1}, *out[2] = {NULL, NULL};
    CHECK_OK(ts_parallel_apply(reps, in, D, 2, out));
    CHECK(out[0] && ts_tensor_device(out[0]) == D[0] && out[1] && ts_tensor_device(out[1]) == D[1]);
    CHECK(max_diff(out[0], ref) == 0 && max_diff(out[1], ref) == 0);
    CHECK(ts_tensor_requires_grad(out[1])); /* grad mode carried to the workers */
    ts_tensor_release(out[0]);
    ts_tensor_release(out[1]);
    /* devs NULL: each input's device */
    CHECK_OK(ts_parallel_apply(reps, in, NULL, 2, out));
    CHECK(out[1] && ts_tensor_device(out[1]) == D[1]);
    ts_tensor_release(out[0]);
    ts_tensor_release(out[1]);
    /* under no-grad on the caller, the workers record nothing */
    bool prev = ts_grad_set_enabled(false);
    CHECK_OK(ts_parallel_apply(reps, in, D, 2, out));
    ts_grad_set_enabled(prev);
    CHECK(out[1] && !ts_tensor_requires_grad(out[1]));
    ts_tensor_release(out[0]);
    ts_tensor_release(out[1]);
    /* an input on the wrong device */
    ts_tensor *wrong[2] = {x0, x0};
    CHECK_STATUS(ts_parallel_apply(reps, wrong, D, 2, out), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("input 1 is on cpu:0, not on its replica's device cpu:1");
    CHECK(out[0] == NULL && out[1] == NULL);
    /* a failure inside replica 1 names its device and replica */
    ts_tensor *bad = tu_rand(&r, 2, (int64_t[]){3, 5}, -1, 1, false), *bad1 = NULL;
    CHECK_OK(ts_to_device(bad, D[1], &bad1));
    ts_tensor *in2[2] = {x0, bad1};
    CHECK_STATUS(ts_parallel_apply(reps, in2, D, 2, out), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("cpu:1: replica 1");
    CHECK(out[0] == NULL && out[1] == NULL);
    ts_tensor *objs[] = {x, x0, x1, ref, bad, bad1};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_module_free(reps[0]);
    ts_module_free(reps[1]);
    ts_module_free(lin);
}

/* ---- equivalence with one device --------------------------------------------------------------------- */
typedef enum { RUN_COMPOSED, RUN_FUNCTION, RUN_MODULE } run_kind;
static const char *run_names[] = {"primitives", "ts_data_parallel", "DataParallel"};

static double worst_loss, worst_grad; /* over every case, for the summary line */

/* Reference on "cpu": the whole batch at once, or (per_chunk: BatchNorm in
 * training) the scatter's chunks one after another, with the running
 * statistics kept from the first chunk only (as DataParallel's devs[0]). */
static float reference(ts_module *m, ts_tensor *x, ts_tensor *y, int ndev, bool per_chunk) {
    ts_tensor *logits = NULL, *loss = NULL;
    if (!per_chunk) {
        CHECK_OK(ts_module_forward(m, x, &logits));
    } else {
        int64_t sizes[NDEV];
        int k = ts_chunk_sizes(ts_tensor_dim(x, 0), ndev, sizes);
        ts_tensor *outs[NDEV] = {NULL};
        ts_tensor_list bufs = TS_TENSOR_LIST_INIT, saved = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_module_buffers(m, &bufs));
        int64_t off = 0;
        for (int i = 0; i < k; i++) {
            ts_tensor *xc = NULL;
            CHECK_OK(ts_slice(x, 0, off, off + sizes[i], &xc));
            CHECK_OK(ts_module_forward(m, xc, &outs[i]));
            ts_tensor_release(xc);
            off += sizes[i];
            if (i == 0)
                for (int b = 0; b < bufs.n; b++) {
                    ts_tensor *c = NULL;
                    CHECK_OK(ts_tensor_clone(bufs.tensors[b], &c));
                    CHECK_OK(ts_tensor_list_append(&saved, bufs.names[b], c));
                    ts_tensor_release(c);
                }
        }
        for (int b = 0; b < bufs.n; b++) CHECK_OK(ts_tensor_copy_(bufs.tensors[b], saved.tensors[b]));
        ts_tensor_list_clear(&bufs);
        ts_tensor_list_clear(&saved);
        CHECK_OK(ts_concat(outs, k, 0, &logits));
        for (int i = 0; i < k; i++) ts_tensor_release(outs[i]);
    }
    CHECK_OK(ts_cross_entropy(logits, y, 0.0f, &loss));
    float l = (float)ts_tensor_item(loss, 0);
    CHECK_OK(ts_backward(loss, NULL, false));
    ts_tensor_release(logits);
    ts_tensor_release(loss);
    return l;
}

/* The same step through data parallelism on D[0..ndev); logits gathered on "cpu". */
static float parallel_step(run_kind kind, ts_module **mp, ts_tensor *x, ts_tensor *y, int ndev) {
    ts_tensor *logits = NULL, *loss = NULL;
    ts_module *m = *mp;
    if (kind == RUN_MODULE) {
        ts_module *dp = NULL;
        CHECK_OK(ts_nn_data_parallel_new(m, D, ndev, ts_device_cpu(), &dp));
        CHECK_OK(ts_module_forward(dp, x, &logits));
        *mp = dp; /* the caller frees the wrapper; the model is its child "module" */
    } else if (kind == RUN_FUNCTION) {
        CHECK_OK(ts_module_to(m, D[0]));
        CHECK_OK(ts_data_parallel(m, x, D, ndev, ts_device_cpu(), &logits));
    } else { /* seed 002's data_parallel(), composed by hand */
        CHECK_OK(ts_module_to(m, D[0]));
        ts_module *reps[NDEV] = {NULL};
        ts_tensor *chunks[NDEV] = {NULL}, *outs[NDEV] = {NULL};
        int k = 0;
        CHECK_OK(ts_scatter(x, D, ndev, chunks, &k));
        CHECK_OK(ts_replicate(m, D, k, reps)); /* replicas = replicas[:len(inputs)] */
        CHECK_OK(ts_parallel_apply(reps, chunks, D, k, outs));
        CHECK_OK(ts_gather(outs, k, ts_device_cpu(), &logits));
        for (int i = 0; i < k; i++) {
            ts_tensor_release(chunks[i]);
            ts_tensor_release(outs[i]);
            ts_module_free(reps[i]);
        }
    }
    CHECK(logits && ts_tensor_device(logits) == ts_device_cpu());
    CHECK_OK(ts_cross_entropy(logits, y, 0.0f, &loss));
    float l = (float)ts_tensor_item(loss, 0);
    CHECK_OK(ts_backward(loss, NULL, false));
    ts_tensor_release(logits);
    ts_tensor_release(loss);
    return l;
}

/* One case: model `name` (train or eval), batch b over ndev devices, for every way of running it. */
static void equivalence_case(const char *name, bool training, int64_t b, int ndev) {
    for (int kind = 0; kind < 3; kind++) {
        ts_rng r;
        ts_rng_seed(&r, 100 + (uint64_t)b);
        int64_t shape[4] = {b, 1, 28, 28};
        ts_tensor *x = tu_rand(&r, 4, shape, 0, 1, false), *y = labels(&r, b);
        ts_module *ref = model(name, 7), *m = model(name, 7);
        ts_module_train(ref, training);
        ts_module_train(m, training);
        bool per_chunk = training && strcmp(name, "cnn") == 0;
        float lr = reference(ref, x, y, ndev, per_chunk);
        ts_module *holder = m;
        float lp = parallel_step((run_kind)kind, &holder, x, y, ndev);
        ts_tensor_list sr = TS_TENSOR_LIST_INIT, sp = TS_TENSOR_LIST_INIT, br = TS_TENSOR_LIST_INIT,
                       bp = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_module_parameters(ref, &sr));
        CHECK_OK(ts_module_parameters(m, &sp));
        CHECK_OK(ts_module_buffers(ref, &br));
        CHECK_OK(ts_module_buffers(m, &bp));
        double gd = 0, bd = 0;
        CHECK(sr.n == sp.n && br.n == bp.n);
        for (int i = 0; i < sr.n && i < sp.n; i++) {
            ts_tensor *g = ts_tensor_grad(sp.tensors[i]);
            CHECK(g && ts_tensor_device(g) == D[0]);
            gd = fmax(gd, max_diff(ts_tensor_grad(sr.tensors[i]), g));
        }
        for (int i = 0; i < br.n && i < bp.n; i++) {
            if (ts_tensor_dtype(br.tensors[i]) != TS_F32) {
                CHECK(ts_tensor_item(br.tensors[i], 0) == ts_tensor_item(bp.tensors[i], 0));
                continue;
            }
            bd = fmax(bd, max_diff(br.tensors[i], bp.tensors[i]));
        }
        double ld = fabs((double)lr - lp);
        printf("  %-3s %-5s batch %2lld over %d, %-16s: |loss diff| %.2e, max |grad diff| %.2e, buffers %.2e\n",
               name, training ? "train" : "eval", (long long)b, ndev, run_names[kind], ld, gd, bd);
        CHECK(ld <= TOL);
        CHECK(gd <= TOL);
        CHECK(bd <= TOL);
        worst_loss = fmax(worst_loss, ld);
        worst_grad = fmax(worst_grad, gd);
        ts_tensor_list_clear(&sr);
        ts_tensor_list_clear(&sp);
        ts_tensor_list_clear(&br);
        ts_tensor_list_clear(&bp);
        ts_module_free(holder);
        ts_module_free(ref);
        ts_tensor_release(x);
        ts_tensor_release(y);
    }
}

static void test_equivalence_mlp(void) {
    const int64_t cases[][2] = {{10, 4}, {3, 2}, {2, 4}, {1, 2}, {64, 2}, {7, 3}};
    for (size_t i = 0; i < TS_ARRAY_LEN(cases); i++) equivalence_case("mlp", true, cases[i][0], (int)cases[i][1]);
}

static void test_equivalence_cnn(void) {
    const int64_t cases[][2] = {{10, 4}, {3, 2}, {2, 4}, {1, 2}, {64, 2}};
    for (size_t i = 0; i < TS_ARRAY_LEN(cases); i++) {
        equivalence_case("cnn", false, cases[i][0], (int)cases[i][1]);
        equivalence_case("cnn", true, cases[i][0], (int)cases[i][1]);
    }
    printf("  worst over all cases: |loss diff| %.2e, max |grad diff| %.2e (tolerance %.0e)\n", worst_loss, worst_grad,
           TOL);
}

/* ---- DataParallel specifics ------------------------------------------------------------------------- */
static void test_one_device(void) {
    ts_rng r;
    ts_rng_seed(&r, 4);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){5, 1, 28, 28}, 0, 1, false), *y = labels(&r, 5);
    ts_module *ref = model("cnn", 9), *m = model("cnn", 9), *dp = NULL;
    float lr = reference(ref, x, y, 1, false);
    CHECK_OK(ts_nn_data_parallel_new(m, D + 1, 1, NULL, &dp));
    CHECK(ts_module_child(dp, "module") == m);
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(dp, &sd));
    CHECK(sd.n > 0 && strcmp(sd.names[0], "module.0.weight") == 0);
    CHECK(ts_tensor_device(sd.tensors[0]) == D[1]); /* moved to devs[0] */
    ts_tensor_list_clear(&sd);
    ts_tensor *logits = NULL, *loss = NULL;
    CHECK_OK(ts_module_forward(dp, x, &logits));
    CHECK(logits && ts_tensor_device(logits) == D[1]); /* output_device NULL: devs[0] */
    ts_tensor *yd = NULL;
    CHECK_OK(ts_to_device(y, D[1], &yd));
    CHECK_OK(ts_cross_entropy(logits, yd, 0.0f, &loss));
    ts_tensor_release(yd);
    CHECK_NEAR(ts_tensor_item(loss, 0), lr, TOL);
    CHECK_OK(ts_backward(loss, NULL, false));
    ts_tensor_list a = TS_TENSOR_LIST_INIT, b = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ref, &a));
    CHECK_OK(ts_module_parameters(dp, &b));
    CHECK(a.n == b.n);
    double gd = 0;
    for (int i = 0; i < a.n && i < b.n; i++) gd = fmax(gd, max_diff(ts_tensor_grad(a.tensors[i]), ts_tensor_grad(b.tensors[i])));
    printf("  one device: |loss diff| %.2e, max |grad diff| %.2e\n", fabs(ts_tensor_item(loss, 0) - lr), gd);
    CHECK(gd <= TOL);
    ts_tensor_list_clear(&a);
    ts_tensor_list_clear(&b);
    ts_tensor_release(logits);
    ts_tensor_release(loss);
    ts_module_free(dp);
    ts_module_free(ref);
    ts_tensor_release(x);
    ts_tensor_release(y);
}

/* Modules without parameters (ReLU) and with buffers only (BatchNorm2d without affine). */
static void test_parameter_free_and_buffer_only(void) {
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_module *relu = NULL;
    CHECK_OK(ts_nn_relu_new(&relu));
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){5, 3}, -1, 1, true), *y = NULL, *s = NULL;
    CHECK_OK(ts_data_parallel(relu, x, D, 3, NULL, &y));
    CHECK(y && ts_tensor_device(y) == D[0] && ts_tensor_requires_grad(y));
    CHECK_OK(ts_sum(y, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor *g = ts_tensor_grad(x);
    CHECK(g && ts_tensor_device(g) == ts_device_cpu());
    for (int i = 0; g && i < 15; i++) CHECK(ts_tensor_item(g, i) == (ts_tensor_item(x, i) > 0 ? 1.0 : 0.0));
    ts_tensor_release(y);
    ts_tensor_release(s);
    /* nothing requires grad: no node, no graph */
    ts_tensor *xc = tu_rand(&r, 2, (int64_t[]){5, 3}, -1, 1, false);
    CHECK_OK(ts_data_parallel(relu, xc, D, 2, NULL, &y));
    CHECK(y && !ts_tensor_requires_grad(y));
    ts_tensor_release(y);
    ts_tensor_release(xc);
    ts_tensor_release(x);
    ts_module_free(relu);

    /* BatchNorm2d(affine=False): the replicas' outputs use their chunk's statistics;
     * running stats come from devs[0]'s chunk only */
    ts_module *bn = NULL, *bref = NULL;
    CHECK_OK(ts_nn_batchnorm2d_new(2, 1e-5f, 0.1f, false, true, &bn));
    CHECK_OK(ts_nn_batchnorm2d_new(2, 1e-5f, 0.1f, false, true, &bref));
    CHECK(ts_module_num_parameters(bn) == 0);
    CHECK_OK(ts_module_to(bn, D[0]));
    ts_tensor *xb = tu_rand(&r, 4, (int64_t[]){4, 2, 3, 3}, -2, 2, false), *yb = NULL;
    CHECK_OK(ts_data_parallel(bn, xb, D, 2, ts_device_cpu(), &yb));
    ts_tensor *h0 = NULL, *h1 = NULL, *r0 = NULL, *r1 = NULL, *cat = NULL;
    CHECK_OK(ts_slice(xb, 0, 0, 2, &h0));
    CHECK_OK(ts_slice(xb, 0, 2, 4, &h1));
    CHECK_OK(ts_module_forward(bref, h0, &r0));
    ts_tensor_list bl = TS_TENSOR_LIST_INIT, bd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_buffers(bref, &bl));
    CHECK_OK(ts_module_buffers(bn, &bd));
    double stats = fmax(max_diff(bl.tensors[0], bd.tensors[0]), max_diff(bl.tensors[1], bd.tensors[1]));
    CHECK(stats <= 1e-6);
    CHECK(ts_tensor_item(bd.tensors[2], 0) == 1); /* num_batches_tracked: one update (devs[0]'s) */
    CHECK_OK(ts_module_forward(bref, h1, &r1));
    ts_tensor *rr[2] = {r0, r1};
    CHECK_OK(ts_concat(rr, 2, 0, &cat));
    CHECK(max_diff(cat, yb) <= 1e-6);
    ts_tensor_list_clear(&bl);
    ts_tensor_list_clear(&bd);
    ts_tensor *objs[] = {xb, yb, h0, h1, r0, r1, cat};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_module_free(bn);
    ts_module_free(bref);
}

/* Replicas returning 0-dimensional outputs: gathered as a vector (PyTorch warns and does the same). */
static ts_status sum_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) { return ts_sum(x, out); }
static const ts_module_vt sum_vt = {.name = "Sum", .forward = sum_forward}; /* kind: TS_MODULE_CUSTOM */

static void test_scalar_outputs(void) {
    ts_rng r;
    ts_rng_seed(&r, 19);
    ts_module *sum = NULL;
    CHECK_OK(ts__module_new(&sum_vt, 0, &sum));
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){5, 2}, -1, 1, true), *y = NULL, *w = NULL, *p = NULL, *s = NULL;
    CHECK_OK(ts_data_parallel(sum, x, D, 3, ts_device_cpu(), &y)); /* rows 2, 2, 1 */
    CHECK(y && ts_tensor_ndim(y) == 1 && ts_tensor_dim(y, 0) == 3);
    double want = 0;
    for (int i = 0; i < 4; i++) want += ts_tensor_item(x, i);
    CHECK_NEAR(ts_tensor_item(y, 0), want, 1e-6); /* replica 0: rows 0-1 */
    CHECK_NEAR(ts_tensor_item(y, 2), ts_tensor_item(x, 8) + ts_tensor_item(x, 9), 1e-6); /* replica 2: row 4 */
    w = tu_tensor(1, (int64_t[]){3}, (float[]){1, 2, 3});
    CHECK_OK(ts_mul(y, w, &p));
    CHECK_OK(ts_sum(p, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor *g = ts_tensor_grad(x);
    CHECK(g && ts_tensor_device(g) == ts_device_cpu());
    for (int i = 0; g && i < 10; i++) CHECK(ts_tensor_item(g, i) == (double)(i / 4 + 1)); /* each row's replica weight */
    ts_tensor *objs[] = {x, y, w, p, s};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_module_free(sum);
}

/* Evaluation: eval mode under no-grad gives the plain model's output and records nothing. */
static void test_eval_no_grad(void) {
    ts_rng r;
    ts_rng_seed(&r, 6);
    ts_module *ref = model("cnn", 11), *m = model("cnn", 11), *dp = NULL;
    CHECK_OK(ts_nn_data_parallel_new(m, D, 2, ts_device_cpu(), &dp));
    ts_module_train(dp, false);
    ts_module_train(ref, false);
    CHECK(!ts_module_is_training(ts_module_child(dp, "module.1")));
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){9, 1, 28, 28}, 0, 1, false), *a = NULL, *b = NULL;
    bool prev = ts_grad_set_enabled(false);
    CHECK_OK(ts_module_forward(ref, x, &a));
    CHECK_OK(ts_module_forward(dp, x, &b));
    ts_grad_set_enabled(prev);
    CHECK(b && !ts_tensor_requires_grad(b) && ts_tensor_device(b) == ts_device_cpu());
    CHECK(max_diff(a, b) <= 1e-5);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(x);
    ts_module_free(dp);
    ts_module_free(ref);
}

/* retain_graph: a second backward through the same DataParallel node doubles the gradients. */
static void test_retain_graph(void) {
    ts_rng r;
    ts_rng_seed(&r, 7);
    ts_module *m = model("mlp", 12), *dp = NULL;
    CHECK_OK(ts_nn_data_parallel_new(m, D, 2, ts_device_cpu(), &dp));
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){6, 1, 28, 28}, 0, 1, true), *y = labels(&r, 6), *logits = NULL,
              *loss = NULL;
    CHECK_OK(ts_module_forward(dp, x, &logits));
    CHECK_OK(ts_cross_entropy(logits, y, 0.0f, &loss));
    CHECK_OK(ts_backward(loss, NULL, true));
    ts_tensor_list p = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(dp, &p));
    ts_tensor *g1 = NULL, *gx1 = NULL, *g2 = NULL;
    CHECK_OK(ts_tensor_clone(ts_tensor_grad(p.tensors[0]), &g1));
    CHECK_OK(ts_tensor_clone(ts_tensor_grad(x), &gx1));
    CHECK_OK(ts_backward(loss, NULL, false));
    CHECK_OK(ts_scale(g1, 2.0f, &g2));
    CHECK(max_diff(ts_tensor_grad(p.tensors[0]), g2) <= 1e-6);
    ts_tensor *gx2 = NULL;
    CHECK_OK(ts_scale(gx1, 2.0f, &gx2));
    CHECK(max_diff(ts_tensor_grad(x), gx2) <= 1e-6);
    CHECK_STATUS(ts_backward(loss, NULL, false), TS_ERR_STATE); /* the graph is gone now */
    ts_tensor *objs[] = {x, y, logits, loss, g1, gx1, g2, gx2};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_tensor_list_clear(&p);
    ts_module_free(dp);
}

/* A batch of 0: every device runs an empty chunk; the output is (0, 10). */
static void test_batch_zero(void) {
    ts_module *m = model("mlp", 13), *dp = NULL;
    CHECK_OK(ts_nn_data_parallel_new(m, D, 2, ts_device_cpu(), &dp));
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 4, (int64_t[]){0, 1, 28, 28}, &x));
    CHECK_OK(ts_module_forward(dp, x, &y));
    CHECK(y && ts_tensor_ndim(y) == 2 && ts_tensor_dim(y, 0) == 0 && ts_tensor_dim(y, 1) == 10);
    ts_tensor_release(y);
    ts_tensor_release(x);
    ts_module_free(dp);
}

static void test_errors(void) {
    ts_rng r;
    ts_rng_seed(&r, 8);
    ts_module *m = model("mlp", 14), *dp = NULL;
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){4, 1, 28, 28}, 0, 1, false), *y = NULL;
    /* the module is on "cpu", not on devs[0] */
    CHECK_STATUS(ts_data_parallel(m, x, D, 2, NULL, &y), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("on device cpu:0 (devs[0]) but '1.weight' is on cpu");
    CHECK(y == NULL);
    ts_device *dup[2] = {D[1], D[1]};
    CHECK_STATUS(ts_nn_data_parallel_new(m, dup, 2, NULL, &dp), TS_ERR_INVALID_ARG); /* frees m */
    CHECK_ERR_MENTIONS("cpu:1 appears twice");
    CHECK(dp == NULL);
    m = model("mlp", 14);
    CHECK_STATUS(ts_nn_data_parallel_new(m, D, 0, NULL, &dp), TS_ERR_INVALID_ARG);
    m = model("mlp", 14);
    CHECK_OK(ts_nn_data_parallel_new(m, D, 2, NULL, &dp));
    /* moved off devs[0] after wrapping: refused at forward */
    CHECK_OK(ts_module_to(ts_module_child(dp, "module.1"), D[1]));
    CHECK_STATUS(ts_module_forward(dp, x, &y), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("'1.weight' is on cpu:1");
    CHECK_OK(ts_module_to(ts_module_child(dp, "module.1"), D[0]));
    /* a replica failing: the error names the device */
    ts_tensor *bad = tu_rand(&r, 2, (int64_t[]){4, 5}, 0, 1, false);
    CHECK_STATUS(ts_module_forward(dp, bad, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("cpu:0: replica 0");
    ts_tensor *scalar = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 0, NULL, 1.0f, &scalar));
    CHECK_STATUS(ts_module_forward(dp, scalar, &y), TS_ERR_SHAPE);
    ts_tensor_release(scalar);
    ts_tensor_release(bad);
    ts_tensor_release(x);
    ts_module_free(dp);
}

/* ---- forward and backward really run at the same time ------------------------------------------------- */
/* "Meet": an identity module whose forward and backward each wait (up to 10 s)
 * until the replica on the other device has arrived at the same point. */
typedef struct meet_impl {
    atomic_int fwd[2], bwd[2];
} meet_impl;

static ts_status meet_wait(atomic_int *flags, int me) {
    atomic_store(&flags[me], 1);
    double t0 = ts_time_now();
    while (!atomic_load(&flags[1 - me]))
        if (ts_time_now() - t0 > 10) return ts_error(TS_ERR_TIMEOUT, "replica %d never met the other one", me);
    return TS_OK;
}

static int replica_of(const ts_tensor *t) { return ts_tensor_device(t) == D[1] ? 1 : 0; }

static ts_status meet_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    meet_impl *c = n->ctx;
    TS_TRY(meet_wait(c->bwd, replica_of(g)));
    gin[0] = ts_tensor_retain(g);
    return TS_OK;
}

static ts_status meet_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    meet_impl *c = m->impl;
    TS_TRY(meet_wait(c->fwd, replica_of(x)));
    TS_TRY(ts_tensor_clone(x, out));
    ts_node *n = NULL;
    ts_status st = ts__node_new("meet", meet_backward, 1, &x, &n);
    if (n) {
        n->ctx = c; /* borrowed: the impl outlives the graph in this test */
        st = ts__node_attach(n, *out);
    }
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}
static const ts_module_vt meet_vt = {.name = "Meet", .forward = meet_forward}; /* kind: TS_MODULE_CUSTOM */

/* devs: two devices, the second one cpu:1 */
static void meet_case(ts_device **devs) {
    ts_rng r;
    ts_rng_seed(&r, 15);
    ts_module *seq = NULL, *lin = NULL, *meet = NULL, *dp = NULL;
    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_linear_new(3, 3, true, &r, &lin));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, lin));
    CHECK_OK(ts__module_new(&meet_vt, sizeof(meet_impl), &meet));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, meet));
    CHECK_OK(ts_nn_data_parallel_new(seq, devs, 2, ts_device_cpu(), &dp));
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){4, 3}, -1, 1, false), *y = NULL, *s = NULL;
    CHECK_OK(ts_module_forward(dp, x, &y)); /* fails with TS_ERR_TIMEOUT if the forwards ran in turn */
    CHECK(y != NULL);
    if (y) {
        CHECK_OK(ts_sum(y, &s));
        CHECK_OK(ts_backward(s, NULL, false)); /* the same for the backward passes */
        ts_tensor_list p = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_module_parameters(dp, &p));
        ts_tensor *gb = ts_tensor_grad(p.tensors[1]);
        for (int k = 0; gb && k < 3; k++) CHECK_NEAR(ts_tensor_item(gb, k), 4.0, 1e-6);
        CHECK(gb != NULL);
        ts_tensor_list_clear(&p);
    }
    ts_tensor_release(s);
    ts_tensor_release(y);
    ts_tensor_release(x);
    ts_module_free(dp);
}

static void test_replicas_run_concurrently(void) {
    ts_device *two[2] = {D[0], D[1]};
    meet_case(two);
    /* "cpu" has no worker: its replica runs on the calling thread (backward nested in the
     * outer pass) while cpu:1's runs on its worker */
    ts_device *with_host[2] = {ts_device_cpu(), D[1]};
    meet_case(with_host);
}

/* A Dropout in training mode: replicas share its generator, so their forwards run in turn; still correct. */
static void test_dropout_serialised(void) {
    ts_rng r, dr;
    ts_rng_seed(&r, 16);
    ts_rng_seed(&dr, 17);
    ts_module *seq = NULL, *lin = NULL, *drop = NULL, *dp = NULL;
    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_linear_new(8, 8, true, &r, &lin));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, lin));
    CHECK_OK(ts_nn_dropout_new(0.5f, &dr, &drop));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, drop));
    CHECK_OK(ts_nn_data_parallel_new(seq, D, 4, ts_device_cpu(), &dp));
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){16, 8}, 1, 2, false), *y = NULL, *s = NULL;
    CHECK_OK(ts_module_forward(dp, x, &y));
    int zeros = 0;
    for (int i = 0; y && i < 128; i++) zeros += ts_tensor_item(y, i) == 0.0;
    CHECK(zeros > 20 && zeros < 108);
    CHECK_OK(ts_sum(y, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor_release(s);
    ts_tensor_release(y);
    ts_tensor_release(x);
    ts_module_free(dp);
}

int main(int argc, char **argv) {
    const char *e = getenv("TS_CPU_DEVICES");
    if (ts_set_cpu_device_count(e && atoi(e) >= NDEV ? atoi(e) : NDEV) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    get_devices();
    static const tu_test tests[] = {T(test_chunk_sizes),
                                    T(test_scatter_gather),
                                    T(test_replicate),
                                    T(test_parallel_apply),
                                    T(test_equivalence_mlp),
                                    T(test_equivalence_cnn),
                                    T(test_one_device),
                                    T(test_parameter_free_and_buffer_only),
                                    T(test_scalar_outputs),
                                    T(test_eval_no_grad),
                                    T(test_retain_graph),
                                    T(test_batch_zero),
                                    T(test_errors),
                                    T(test_replicas_run_concurrently),
                                    T(test_dropout_serialised)};
    return tu_run(tests, (int)TS_ARRAY_LEN(tests), argc, argv);
}
