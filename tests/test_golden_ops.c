/*
 * tests/test_golden_ops.c — every op against PyTorch's values.
 *
 * tests/golden/ops.tsg (written by scripts/gen_golden.py; see golden_io.h for
 * the format) holds one case per op variant: inputs, op parameters, a random
 * upstream gradient gy, PyTorch's output y and the gradients of sum(y * gy)
 * with respect to each float input. For every case this runs the Tessera op,
 * ts_backward(y, gy) and compares y, each input's gradient and (batchnorm) the
 * updated running statistics with |got - want| <= ATOL + RTOL |want|.
 *
 * An op whose forward returns TS_ERR_UNSUPPORTED is reported as SKIP and does
 * not fail the test; any other error or mismatch does. One line per case gives
 * the worst difference. Run with case names (or op names) as arguments to run
 * only those: test_golden_ops conv2d batchnorm2d:eval
 */
#include "golden_io.h"
#include "test_util.h"

#define ATOL 1e-5
#define RTOL 1e-4
#define MAX_INPUTS 16

static ts_tensor_list golden = TS_TENSOR_LIST_INIT;
static ts_device *dev; /* TS_TEST_DEVICE: where the ops run (golden_io.h) */

/* One case being run: its name, op, and the tensors handed to the op (clones
 * of the golden inputs, so a case can run again and running stats can change). */
typedef struct gcase {
    const char *name; /* "conv2d:k3_s2_p1" */
    char op[64];      /* "conv2d" */
    int n;
    char names[MAX_INPUTS][32];
    ts_tensor *inputs[MAX_INPUTS];
} gcase;

/* The golden input `name` of the case as a fresh tensor (NULL when the case has
 * none: an optional argument). Float inputs with a stored gradient require grad. */
static ts_tensor *input(gcase *c, const char *name) {
    ts_tensor *g = tg_getf(&golden, "%s/%s", c->name, name);
    if (!g) return NULL;
    if (c->n == MAX_INPUTS) {
        fprintf(stderr, "%s: too many inputs\n", c->name);
        abort();
    }
    ts_tensor *t = tg_on_device(g, dev);
    if (t == g) { /* on the CPU: a clone, so a case can run again and running stats can change */
        ts_tensor_release(t);
        if (ts_tensor_clone(g, &t) != TS_OK) {
            fprintf(stderr, "%s: clone %s: %s\n", c->name, name, ts_last_error());
            abort();
        }
    }
    if (tg_getf(&golden, "%s/grad_%s", c->name, name)) ts_tensor_set_requires_grad(t, true);
    snprintf(c->names[c->n], sizeof c->names[0], "%s", name);
    c->inputs[c->n++] = t;
    return t;
}

static int64_t arg(const gcase *c, int i) { return tg_int(tg_getf(&golden, "%s/args", c->name), i); }
static float farg(const gcase *c, int i) { return tg_float(tg_getf(&golden, "%s/fargs", c->name), i); }

static ts_pool2d_params pool_params(const gcase *c) {
    ts_pool2d_params p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < 2; i++) {
        p.kernel[i] = (int)arg(c, i);
        p.stride[i] = (int)arg(c, 2 + i);
        p.padding[i] = (int)arg(c, 4 + i);
        p.dilation[i] = (int)arg(c, 6 + i);
    }
    p.ceil_mode = arg(c, 8) != 0;
    p.exclude_pad = arg(c, 9) != 0; /* absent (0) in the count_include_pad cases */
    return p;
}

/* Number of entries in the case's args (0 when it has none). */
static int nargs(const gcase *c) {
    ts_tensor *a = tg_getf(&golden, "%s/args", c->name);
    return a ? (int)ts_tensor_numel(a) : 0;
}

/* max_dim: y is the values; the indices must equal PyTorch's exactly (else an error fails the case). */
static ts_status run_max_dim(gcase *c, ts_tensor **y) {
    ts_tensor *idx = NULL;
    ts_status st = ts_max_dim(input(c, "x"), (int)arg(c, 0), arg(c, 1) != 0, y, &idx);
    if (st != TS_OK) return st;
    ts_tensor *on_dev = idx; /* read on the host */
    idx = tg_on_device(on_dev, ts_device_cpu());
    ts_tensor_release(on_dev);
    ts_tensor *want = tg_getf(&golden, "%s/indices", c->name);
    int64_t n = ts_tensor_numel(idx), bad = -1;
    bool same = want && ts_tensor_dtype(idx) == TS_I64 && ts_tensor_ndim(idx) == ts_tensor_ndim(want) &&
                !memcmp(ts_tensor_shape(idx), ts_tensor_shape(want), sizeof(int64_t) * (size_t)ts_tensor_ndim(idx));
    for (int64_t i = 0; same && i < n && bad < 0; i++)
        if (tg_int(idx, i) != tg_int(want, i)) bad = i;
    int64_t got_v = bad >= 0 ? tg_int(idx, bad) : 0, want_v = bad >= 0 ? tg_int(want, bad) : 0;
    ts_tensor_release(idx);
    if (!same || bad >= 0) {
        ts_tensor_release(*y);
        *y = NULL;
        return ts_error(TS_ERR_INTERNAL, "max_dim: indices differ from PyTorch's (%s; element %lld is %lld, expected %lld)",
                        same ? "values" : "shape or dtype", (long long)bad, (long long)got_v, (long long)want_v);
    }
    return TS_OK;
}

/* Runs the case's op. TS_ERR_INVALID_ARG with a message for an unknown op. */
static ts_status run_op(gcase *c, ts_tensor **y) {
    const char *op = c->op;
    if (!strcmp(op, "add")) return ts_add(input(c, "a"), input(c, "b"), y);
    if (!strcmp(op, "sub")) return ts_sub(input(c, "a"), input(c, "b"), y);
    if (!strcmp(op, "mul")) return ts_mul(input(c, "a"), input(c, "b"), y);
    if (!strcmp(op, "scale")) return ts_scale(input(c, "x"), farg(c, 0), y);
    if (!strcmp(op, "relu")) return ts_relu(input(c, "x"), y);
    if (!strcmp(op, "sum")) return ts_sum(input(c, "x"), y);
    if (!strcmp(op, "mean")) return ts_mean(input(c, "x"), y);
    if (!strcmp(op, "matmul")) return ts_matmul(input(c, "a"), input(c, "b"), y);
    if (!strcmp(op, "linear")) {
        ts_tensor *x = input(c, "x"), *w = input(c, "w");
        return ts_linear(x, w, input(c, "bias"), y);
    }
    if (!strcmp(op, "conv2d")) {
        ts_tensor *x = input(c, "x"), *w = input(c, "w");
        ts_conv2d_params p = {{(int)arg(c, 0), (int)arg(c, 1)},
                              {(int)arg(c, 2), (int)arg(c, 3)},
                              {(int)arg(c, 4), (int)arg(c, 5)},
                              (int)arg(c, 6)};
        return ts_conv2d(x, w, input(c, "bias"), p, y);
    }
    if (!strcmp(op, "maxpool2d")) return ts_maxpool2d(input(c, "x"), pool_params(c), y);
    if (!strcmp(op, "avgpool2d")) return ts_avgpool2d(input(c, "x"), pool_params(c), y);
    if (!strcmp(op, "global_avgpool2d")) return ts_global_avgpool2d(input(c, "x"), y);
    if (!strcmp(op, "batchnorm2d")) {
        ts_tensor *x = input(c, "x"), *w = input(c, "weight"), *b = input(c, "bias");
        ts_tensor *rm = input(c, "running_mean"), *rv = input(c, "running_var");
        return ts_batchnorm2d(x, w, b, rm, rv, arg(c, 0) != 0, farg(c, 0), farg(c, 1), y);
    }
    if (!strcmp(op, "embedding")) {
        ts_tensor *idx = input(c, "idx");
        return ts_embedding(idx, input(c, "weight"), y);
    }
    if (!strcmp(op, "reshape")) {
        ts_tensor *a = tg_getf(&golden, "%s/args", c->name);
        int nd = a ? (int)ts_tensor_numel(a) : 0;
        int64_t shape[TS_MAX_DIMS] = {0};
        for (int i = 0; i < nd && i < TS_MAX_DIMS; i++) shape[i] = arg(c, i);
        return ts_reshape(input(c, "x"), nd, shape, y);
    }
    if (!strcmp(op, "flatten")) return ts_flatten(input(c, "x"), (int)arg(c, 0), y);
    if (!strcmp(op, "concat")) {
        int n = (int)arg(c, 1);
        ts_tensor *xs[MAX_INPUTS];
        for (int i = 0; i < n && i < MAX_INPUTS; i++) {
            char nm[16];
            snprintf(nm, sizeof nm, "x%d", i);
            xs[i] = input(c, nm);
        }
        return ts_concat(xs, n, (int)arg(c, 0), y);
    }
    if (!strcmp(op, "slice")) return ts_slice(input(c, "x"), (int)arg(c, 0), arg(c, 1), arg(c, 2), y);
    if (!strcmp(op, "dropout")) {
        ts_rng rng;
        ts_rng_seed(&rng, 7);
        return ts_dropout(input(c, "x"), farg(c, 0), arg(c, 0) != 0, &rng, y);
    }
    if (!strcmp(op, "log_softmax")) return ts_log_softmax(input(c, "x"), (int)arg(c, 0), y);
    if (!strcmp(op, "cross_entropy")) {
        ts_tensor *logits = input(c, "logits");
        return ts_cross_entropy(logits, input(c, "target"), farg(c, 0), y);
    }
    if (!strcmp(op, "mse_loss")) {
        ts_tensor *pred = input(c, "pred");
        return ts_mse_loss(pred, input(c, "target"), y);
    }
    /* ---- the second batch of ops ---- */
    if (!strcmp(op, "div")) return ts_div(input(c, "a"), input(c, "b"), y);
    if (!strcmp(op, "sigmoid")) return ts_sigmoid(input(c, "x"), y);
    if (!strcmp(op, "tanh")) return ts_tanh(input(c, "x"), y);
    if (!strcmp(op, "silu")) return ts_silu(input(c, "x"), y);
    if (!strcmp(op, "gelu")) return ts_gelu(input(c, "x"), arg(c, 0) != 0, y);
    if (!strcmp(op, "softmax")) return ts_softmax(input(c, "x"), (int)arg(c, 0), y);
    if (!strcmp(op, "sum_dims") || !strcmp(op, "mean_dims")) {
        int nd = nargs(c) - 1, dims[TS_MAX_DIMS] = {0};
        for (int i = 0; i < nd && i < TS_MAX_DIMS; i++) dims[i] = (int)arg(c, 1 + i);
        ts_tensor *x = input(c, "x");
        return !strcmp(op, "sum_dims") ? ts_sum_dims(x, nd, dims, arg(c, 0) != 0, y)
                                       : ts_mean_dims(x, nd, dims, arg(c, 0) != 0, y);
    }
    if (!strcmp(op, "max_dim")) return run_max_dim(c, y);
    if (!strcmp(op, "permute")) {
        int perm[TS_MAX_DIMS] = {0};
        for (int i = 0; i < nargs(c) && i < TS_MAX_DIMS; i++) perm[i] = (int)arg(c, i);
        return ts_permute(input(c, "x"), perm, y);
    }
    if (!strcmp(op, "transpose")) return ts_transpose(input(c, "x"), (int)arg(c, 0), (int)arg(c, 1), y);
    if (!strcmp(op, "flatten_range")) return ts_flatten_range(input(c, "x"), (int)arg(c, 0), (int)arg(c, 1), y);
    if (!strcmp(op, "bmm")) return ts_bmm(input(c, "a"), input(c, "b"), y);
    if (!strcmp(op, "adaptive_avgpool2d"))
        return ts_adaptive_avgpool2d(input(c, "x"), (int)arg(c, 0), (int)arg(c, 1), y);
    /* normalisation layers and loss options */
    if (!strcmp(op, "layer_norm")) {
        ts_tensor *x = input(c, "x"), *w = input(c, "weight"), *b = input(c, "bias");
        return ts_layer_norm(x, (int)arg(c, 0), w, b, farg(c, 0), y);
    }
    if (!strcmp(op, "group_norm")) {
        ts_tensor *x = input(c, "x"), *w = input(c, "weight"), *b = input(c, "bias");
        return ts_group_norm(x, (int)arg(c, 0), w, b, farg(c, 0), y);
    }
    if (!strcmp(op, "batchnorm1d")) {
        ts_tensor *x = input(c, "x"), *w = input(c, "weight"), *b = input(c, "bias");
        ts_tensor *rm = input(c, "running_mean"), *rv = input(c, "running_var");
        return ts_batchnorm1d(x, w, b, rm, rv, arg(c, 0) != 0, farg(c, 0), farg(c, 1), y);
    }
    if (!strcmp(op, "cross_entropy_ex")) {
        ts_tensor *logits = input(c, "logits"), *target = input(c, "target");
        ts_cross_entropy_opts o = TS_CROSS_ENTROPY_OPTS_INIT;
        o.reduction = (ts_reduction)arg(c, 0);
        o.ignore_index = arg(c, 1);
        o.weight = input(c, "weight");
        o.label_smoothing = farg(c, 0);
        return ts_cross_entropy_ex(logits, target, &o, y);
    }
    return ts_error(TS_ERR_INVALID_ARG, "no runner for op '%s' (add one to run_op)", op);
}

/* The worst comparison of a case, for its report line. */
typedef struct worst {
    double max_abs, ratio;
    char what[48];
} worst;

/* Compares got with the golden tensor "<case>/<want>"; prints a FAIL detail
 * line when it is off. Returns false on a mismatch. */
static bool compare(const gcase *c, const char *what, ts_tensor *got, const char *want_name, worst *w) {
    ts_tensor *want = tg_getf(&golden, "%s/%s", c->name, want_name);
    if (!want) {
        fprintf(stderr, "  %s: golden tensor %s missing\n", c->name, want_name);
        return false;
    }
    ts_tensor *zeros = NULL;
    if (!got) { /* no gradient reached the input: it must be all zeros */
        if (ts_tensor_zeros(ts_device_cpu(), TS_F32, ts_tensor_ndim(want), ts_tensor_shape(want), &zeros) != TS_OK)
            abort();
        got = zeros;
    }
    tg_diff d = tg_compare(got, want, ATOL, RTOL);
    ts_tensor_release(zeros);
    char gs[96], ws[96];
    if (!d.shape_ok) {
        fprintf(stderr, "  %s: %s: shape/dtype %s %s, expected %s %s\n", c->name, what,
                ts_shape_str(ts_tensor_ndim(got), ts_tensor_shape(got), gs, sizeof gs),
                ts_dtype_name(ts_tensor_dtype(got)),
                ts_shape_str(ts_tensor_ndim(want), ts_tensor_shape(want), ws, sizeof ws),
                ts_dtype_name(ts_tensor_dtype(want)));
    } else if (d.ratio > 1) {
        fprintf(stderr, "  %s: %s: element %lld is %.9g, expected %.9g (max |diff| %.3g)\n", c->name, what,
                (long long)d.worst, d.got, d.want, d.max_abs);
    }
    if (d.ratio > w->ratio) {
        w->ratio = d.ratio;
        w->max_abs = d.max_abs;
        snprintf(w->what, sizeof w->what, "%s", what);
    }
    return d.shape_ok && d.ratio <= 1;
}

enum { PASS, SKIP, FAIL };

static int run_case(const char *name) {
    gcase c;
    memset(&c, 0, sizeof c);
    c.name = name;
    size_t oplen = strcspn(name, ":");
    snprintf(c.op, sizeof c.op, "%.*s", (int)oplen, name);
    ts_tensor *y = NULL;
    ts_status st = run_op(&c, &y);
    int result = PASS;
    worst w = {0, -1, ""};
    if (st == TS_ERR_UNSUPPORTED) {
        printf("SKIP %s: op not yet available (%s)\n", name, ts_last_error());
        result = SKIP;
        goto done;
    }
    if (st != TS_OK) {
        printf("FAIL %s: forward returned %s: %s\n", name, ts_status_name(st), ts_last_error());
        result = FAIL;
        goto done;
    }
    bool ok = compare(&c, "y", y, "y", &w);
    /* backward with the stored upstream gradient */
    ts_tensor *gy = tg_getf(&golden, "%s/gy", name);
    bool any_grad = false;
    for (int i = 0; i < c.n; i++) any_grad |= ts_tensor_requires_grad(c.inputs[i]);
    if (any_grad) {
        ts_tensor *gyd = gy ? tg_on_device(gy, dev) : NULL;
        st = gy ? ts_backward(y, gyd, false) : ts_error(TS_ERR_FORMAT, "no gy");
        ts_tensor_release(gyd);
        if (st != TS_OK) {
            printf("FAIL %s: backward returned %s: %s\n", name, ts_status_name(st), ts_last_error());
            result = FAIL;
            goto done;
        }
        for (int i = 0; i < c.n; i++) {
            if (!ts_tensor_requires_grad(c.inputs[i])) continue;
            char what[48];
            snprintf(what, sizeof what, "grad_%s", c.names[i]);
            ok &= compare(&c, what, ts_tensor_grad(c.inputs[i]), what, &w);
        }
    }
    /* batchnorm updates its running statistics in place */
    for (int i = 0; i < c.n; i++) {
        if (strncmp(c.names[i], "running_", 8) != 0) continue;
        char want[48];
        snprintf(want, sizeof want, "%s_out", c.names[i]);
        ok &= compare(&c, c.names[i], c.inputs[i], want, &w);
    }
    result = ok ? PASS : FAIL;
    printf("%s %-32s worst %-18s max|diff| %.2e  (%.3g of tolerance)\n", ok ? "ok  " : "FAIL", name, w.what,
           w.max_abs, w.ratio);
done:
    ts_tensor_release(y);
    for (int i = 0; i < c.n; i++) ts_tensor_release(c.inputs[i]);
    fflush(stdout);
    return result;
}

static int g_argc;
static char **g_argv;

/* A case runs when no filter is given or an argument names it or its op. */
static bool selected(const char *name) {
    if (g_argc < 2) return true;
    size_t oplen = strcspn(name, ":");
    for (int i = 1; i < g_argc; i++)
        if (!strcmp(g_argv[i], name) || (strlen(g_argv[i]) == oplen && !strncmp(g_argv[i], name, oplen)))
            return true;
    return false;
}

static void test_golden_ops(void) {
    ts_status st = tg_load(TS_TEST_DIR "/golden/ops.tsg", &golden);
    CHECK_OK(st);
    if (st != TS_OK) return;
    CHECK(golden.n > 100);
    int counts[3] = {0, 0, 0};
    char prev[TG_MAX_NAME] = "";
    for (int i = 0; i < golden.n; i++) {
        char name[TG_MAX_NAME];
        snprintf(name, sizeof name, "%s", golden.names[i]);
        char *slash = strchr(name, '/');
        if (!slash) continue;
        *slash = '\0';
        if (!strcmp(name, prev)) continue; /* records of one case are contiguous */
        snprintf(prev, sizeof prev, "%s", name);
        if (!selected(name)) continue;
        counts[run_case(name)]++;
    }
    /* every op of ops.h with a PyTorch counterpart has cases (ts_to_device has none) */
    static const char *const ops[] = {"add", "sub", "mul", "scale", "relu", "sum", "mean", "matmul", "linear",
                                      "conv2d", "maxpool2d", "avgpool2d", "global_avgpool2d", "batchnorm2d",
                                      "embedding", "reshape", "flatten", "concat", "slice", "dropout",
                                      "log_softmax", "cross_entropy", "mse_loss",
                                      /* the second batch */
                                      "div", "sigmoid", "tanh", "gelu", "silu", "softmax", "sum_dims", "mean_dims",
                                      "max_dim", "permute", "transpose", "flatten_range", "bmm",
                                      "adaptive_avgpool2d",
                                      /* normalisation layers and loss options */
                                      "layer_norm", "group_norm", "batchnorm1d", "cross_entropy_ex"};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        char key[80];
        snprintf(key, sizeof key, "%s:", ops[k]);
        bool found = false;
        for (int i = 0; i < golden.n && !found; i++) found = !strncmp(golden.names[i], key, strlen(key));
        tu_checks++;
        if (!found) {
            fprintf(stderr, "ops.tsg has no case for %s\n", ops[k]);
            tu_failures++;
        }
    }
    printf("golden ops: %d passed, %d skipped (op not yet available), %d failed\n", counts[PASS], counts[SKIP],
           counts[FAIL]);
    tu_checks++;
    if (counts[FAIL]) tu_failures++;
    if (counts[PASS] + counts[SKIP] + counts[FAIL] == 0) {
        fprintf(stderr, "no case matched the arguments\n");
        tu_failures++;
    }
    ts_tensor_list_clear(&golden);
}

/* The reader rejects a missing file, a file that is not TSG1 and a truncated one. */
static void test_reader_errors(void) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_STATUS(tg_load(TS_TEST_DIR "/golden/does-not-exist.tsg", &l), TS_ERR_IO);
    CHECK_STATUS(tg_load(TS_TEST_DIR "/test_golden_ops.c", &l), TS_ERR_FORMAT);
    CHECK(l.n == 0);
    /* the first 3000 bytes of ops.tsg: some whole records, then a cut */
    FILE *in = fopen(TS_TEST_DIR "/golden/ops.tsg", "rb");
    CHECK(in != NULL);
    if (!in) return;
    char buf[3000];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    CHECK(n == sizeof buf);
    const char *path = "golden_truncated.tsg"; /* in the working directory (the build dir under ctest) */
    FILE *out = fopen(path, "wb");
    CHECK(out != NULL);
    if (!out) return;
    fwrite(buf, 1, n, out);
    fclose(out);
    CHECK_STATUS(tg_load(path, &l), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("truncated");
    CHECK(l.n > 0);
    ts_tensor_list_clear(&l);
    remove(path);
}

int main(int argc, char **argv) {
    g_argc = argc;
    g_argv = argv;
    dev = tu_test_device();
    printf("ops on %s\n", ts_device_name(dev));
    static const tu_test tests[] = {T(test_reader_errors), T(test_golden_ops)};
    /* case filters are handled by selected(), not by tu_run */
    return tu_run(tests, 2, 1, argv);
}
