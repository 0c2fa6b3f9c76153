/* LayerNorm, GroupNorm and BatchNorm1d: the modules (kinds, state-dict names
 * and PyTorch's initial values, typed accessors, forward equal to the op,
 * BatchNorm1d's running statistics), the ops on inputs large enough to run
 * their kernels' parallel paths (against a double-precision reference), the
 * argument checks of the new ops, the edges of cross_entropy_ex and avg
 * pooling's exclude_pad the golden cases do not reach, and every allocation
 * of the new ops failing in turn. Values against PyTorch are in
 * tests/test_golden_ops.c. */
#include "nn/module.h"
#include "test_util.h"

/* Element-wise |a - b| <= tol for two tensors of one shape. */
static void check_close(ts_tensor *a, ts_tensor *b, double tol) {
    CHECK(a && b && ts_tensor_numel(a) == ts_tensor_numel(b));
    if (!a || !b || ts_tensor_numel(a) != ts_tensor_numel(b)) return;
    double d = tu_max_abs_diff(a, ts_tensor_data_f32(b));
    CHECK(d <= tol);
    if (d > tol) fprintf(stderr, "  max |diff| %.3g > %.3g\n", d, tol);
}

/* Names of a tensor list, comma-separated, compared with want. */
static void check_names(const ts_tensor_list *l, const char *want) {
    char got[256] = "";
    for (int i = 0; i < l->n; i++) {
        size_t len = strlen(got);
        snprintf(got + len, sizeof got - len, "%s%s", i ? "," : "", l->names[i]);
    }
    CHECK(strcmp(got, want) == 0);
    if (strcmp(got, want) != 0) fprintf(stderr, "  names '%s', expected '%s'\n", got, want);
}

/* Every element of t equals v. */
static bool all_equal(const ts_tensor *t, double v) {
    for (int64_t i = 0; i < ts_tensor_numel(t); i++)
        if (ts_tensor_item(t, i) != v) return false;
    return true;
}

static void test_layernorm_module(void) {
    ts_module *m = NULL;
    const int64_t ns[2] = {3, 4};
    CHECK_OK(ts_nn_layernorm_new(2, ns, 1e-5f, true, &m));
    CHECK(ts_module_kind(m) == TS_MODULE_LAYERNORM && strcmp(ts_module_type_name(m), "LayerNorm") == 0);
    CHECK(strcmp(ts_module_kind_name(TS_MODULE_LAYERNORM), "LayerNorm") == 0);
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    check_names(&sd, "weight,bias");
    if (sd.n == 2) {
        CHECK(ts_tensor_ndim(sd.tensors[0]) == 2 && ts_tensor_shape(sd.tensors[0])[0] == 3 &&
              ts_tensor_shape(sd.tensors[0])[1] == 4);
        CHECK(all_equal(sd.tensors[0], 1.0) && all_equal(sd.tensors[1], 0.0));
    }
    ts_tensor_list_clear(&sd);

    int nd = 0;
    int64_t got[TS_MAX_DIMS] = {0};
    float eps = 0;
    bool affine = false;
    CHECK_OK(ts_layernorm_get_config(m, &nd, got, &eps, &affine));
    CHECK(nd == 2 && got[0] == 3 && got[1] == 4 && eps == 1e-5f && affine);

    /* forward equals the op with the module's parameters; weight/bias get gradients */
    ts_rng r;
    ts_rng_seed(&r, 11);
    ts_tensor *x = tu_rand(&r, 3, (int64_t[]){2, 3, 4}, -2, 2, false), *y = NULL, *want = NULL;
    ts_tensor_data_f32(m->params[0])[5] = 2.5f; /* not all ones, so the weight is used */
    CHECK_OK(ts_module_forward(m, x, &y));
    CHECK_OK(ts_layer_norm(x, 2, m->params[0], m->params[1], 1e-5f, &want));
    check_close(y, want, 0);
    ts_tensor *s = NULL;
    CHECK_OK(ts_sum(y, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    CHECK(ts_tensor_grad(m->params[0]) != NULL && ts_tensor_grad(m->params[1]) != NULL);
    if (ts_tensor_grad(m->params[1])) CHECK(all_equal(ts_tensor_grad(m->params[1]), 2.0)); /* d sum / d bias = N */
    ts_tensor_release(s);
    ts_tensor_release(y);
    ts_tensor_release(want);

    /* an input that does not end in the normalized shape */
    ts_tensor *bad = tu_rand(&r, 2, (int64_t[]){4, 3}, 0, 1, false);
    CHECK_STATUS(ts_module_forward(m, bad, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("normalized shape [3, 4]");
    ts_tensor_release(bad);
    ts_module_free(m);

    /* without affine: no parameters; the wrong kind for the accessors */
    CHECK_OK(ts_nn_layernorm_new(1, (int64_t[]){4}, 1e-3f, false, &m));
    CHECK(ts_module_num_parameters(m) == 0);
    CHECK_OK(ts_module_forward(m, x, &y));
    CHECK_OK(ts_layer_norm(x, 1, NULL, NULL, 1e-3f, &want));
    check_close(y, want, 0);
    ts_tensor_release(y);
    ts_tensor_release(want);
    CHECK_STATUS(ts_groupnorm_get_config(m, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("got a LayerNorm");
    CHECK_STATUS(ts_batchnorm2d_get_config(m, NULL, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    ts_module_free(m);
    ts_tensor_release(x);

    CHECK_STATUS(ts_nn_layernorm_new(0, ns, 1e-5f, true, &m), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_nn_layernorm_new(1, (int64_t[]){0}, 1e-5f, true, &m), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_nn_layernorm_new(1, ns, 0.0f, true, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("eps");
}

static void test_groupnorm_module(void) {
    ts_module *m = NULL;
    CHECK_OK(ts_nn_groupnorm_new(2, 6, 1e-5f, true, &m));
    CHECK(ts_module_kind(m) == TS_MODULE_GROUPNORM && strcmp(ts_module_type_name(m), "GroupNorm") == 0);
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    check_names(&sd, "weight,bias");
    if (sd.n == 2) {
        CHECK(ts_tensor_ndim(sd.tensors[0]) == 1 && ts_tensor_shape(sd.tensors[0])[0] == 6);
        CHECK(all_equal(sd.tensors[0], 1.0) && all_equal(sd.tensors[1], 0.0));
    }
    ts_tensor_list_clear(&sd);
    int groups = 0;
    int64_t ch = 0;
    float eps = 0;
    bool affine = false;
    CHECK_OK(ts_groupnorm_get_config(m, &groups, &ch, &eps, &affine));
    CHECK(groups == 2 && ch == 6 && eps == 1e-5f && affine);

    ts_rng r;
    ts_rng_seed(&r, 12);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 6, 3, 5}, -1, 3, false), *y = NULL, *want = NULL;
    ts_tensor_data_f32(m->params[1])[4] = -0.5f;
    CHECK_OK(ts_module_forward(m, x, &y));
    CHECK_OK(ts_group_norm(x, 2, m->params[0], m->params[1], 1e-5f, &want));
    check_close(y, want, 0);
    ts_tensor_release(y);
    ts_tensor_release(want);
    ts_tensor *bad = tu_rand(&r, 3, (int64_t[]){2, 4, 5}, 0, 1, false);
    CHECK_STATUS(ts_module_forward(m, bad, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("(N, 6, *)");
    ts_tensor_release(bad);
    ts_module_free(m);

    CHECK_OK(ts_nn_groupnorm_new(3, 6, 1e-5f, false, &m));
    CHECK(ts_module_num_parameters(m) == 0);
    CHECK_OK(ts_module_forward(m, x, &y));
    CHECK_OK(ts_group_norm(x, 3, NULL, NULL, 1e-5f, &want));
    check_close(y, want, 0);
    ts_tensor_release(y);
    ts_tensor_release(want);
    CHECK_STATUS(ts_layernorm_get_config(m, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("got a GroupNorm");
    ts_module_free(m);
    ts_tensor_release(x);

    CHECK_STATUS(ts_nn_groupnorm_new(4, 6, 1e-5f, true, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("divide num_channels 6");
    CHECK_STATUS(ts_nn_groupnorm_new(0, 6, 1e-5f, true, &m), TS_ERR_INVALID_ARG);
}

static void test_batchnorm1d_module(void) {
    ts_module *m = NULL;
    CHECK_OK(ts_nn_batchnorm1d_new(4, 1e-5f, 0.1f, true, true, &m));
    CHECK(ts_module_kind(m) == TS_MODULE_BATCHNORM1D && strcmp(ts_module_type_name(m), "BatchNorm1d") == 0);
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    check_names(&sd, "weight,bias,running_mean,running_var,num_batches_tracked");
    if (sd.n == 5) {
        CHECK(all_equal(sd.tensors[0], 1.0) && all_equal(sd.tensors[1], 0.0));
        CHECK(all_equal(sd.tensors[2], 0.0) && all_equal(sd.tensors[3], 1.0));
        CHECK(ts_tensor_dtype(sd.tensors[4]) == TS_I64 && ts_tensor_ndim(sd.tensors[4]) == 0);
    }
    ts_tensor_list_clear(&sd);
    int64_t nf = 0;
    float eps = 0, mom = 0;
    bool affine = false, track = false;
    CHECK_OK(ts_batchnorm1d_get_config(m, &nf, &eps, &mom, &affine, &track));
    CHECK(nf == 4 && eps == 1e-5f && mom == 0.1f && affine && track);
    CHECK_STATUS(ts_batchnorm2d_get_config(m, NULL, NULL, NULL, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("BatchNorm1d");

    /* training on (N, C, L) then (N, C): the op with the module's tensors, running stats
     * updated exactly as the op updates clones of them, num_batches_tracked counting */
    ts_rng r;
    ts_rng_seed(&r, 13);
    ts_tensor *x3 = tu_rand(&r, 3, (int64_t[]){3, 4, 5}, -1, 2, false);
    ts_tensor *x2 = tu_rand(&r, 2, (int64_t[]){6, 4}, -1, 2, false);
    ts_tensor *xs[2] = {x3, x2};
    for (int k = 0; k < 2; k++) {
        ts_tensor *rm = NULL, *rv = NULL, *y = NULL, *want = NULL;
        CHECK_OK(ts_tensor_clone(m->buffers[0], &rm));
        CHECK_OK(ts_tensor_clone(m->buffers[1], &rv));
        CHECK_OK(ts_module_forward(m, xs[k], &y));
        CHECK_OK(ts_batchnorm1d(xs[k], m->params[0], m->params[1], rm, rv, true, 0.1f, 1e-5f, &want));
        check_close(y, want, 0);
        check_close(m->buffers[0], rm, 0);
        check_close(m->buffers[1], rv, 0);
        CHECK(ts_tensor_item(m->buffers[2], 0) == k + 1);
        CHECK(ts_tensor_ndim(y) == ts_tensor_ndim(xs[k]));
        ts_tensor_release(rm);
        ts_tensor_release(rv);
        ts_tensor_release(y);
        ts_tensor_release(want);
    }
    CHECK(!all_equal(m->buffers[0], 0.0));
    /* eval: normalises with the running statistics, which stay put */
    ts_module_train(m, false);
    ts_tensor *y = NULL, *want = NULL, *rm0 = NULL;
    CHECK_OK(ts_tensor_clone(m->buffers[0], &rm0));
    CHECK_OK(ts_module_forward(m, x3, &y));
    CHECK_OK(ts_batchnorm1d(x3, m->params[0], m->params[1], m->buffers[0], m->buffers[1], false, 0.1f, 1e-5f, &want));
    check_close(y, want, 0);
    check_close(m->buffers[0], rm0, 0);
    CHECK(ts_tensor_item(m->buffers[2], 0) == 2);
    ts_tensor_release(y);
    ts_tensor_release(want);
    ts_tensor_release(rm0);
    /* a 4-D input is BatchNorm2d's */
    ts_tensor *x4 = tu_rand(&r, 4, (int64_t[]){2, 4, 3, 3}, 0, 1, false);
    CHECK_STATUS(ts_module_forward(m, x4, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("batchnorm1d: input [2, 4, 3, 3] must be (N, C) or (N, C, L)");
    ts_module_free(m);

    /* batchnorm1d is batchnorm2d on the (N, C, L, 1) view, gradients included */
    ts_tensor *a = NULL, *b = NULL, *a4 = NULL, *w = tu_rand(&r, 1, (int64_t[]){4}, 0.5f, 1.5f, true);
    ts_tensor_set_requires_grad(x3, true);
    CHECK_OK(ts_batchnorm1d(x3, w, NULL, NULL, NULL, true, 0.1f, 1e-5f, &a));
    CHECK_OK(ts_reshape(x3, 4, (int64_t[]){3, 4, 5, 1}, &a4));
    CHECK_OK(ts_batchnorm2d(a4, w, NULL, NULL, NULL, true, 0.1f, 1e-5f, &b));
    check_close(a, b, 0);
    ts_tensor *sa = NULL;
    CHECK_OK(ts_sum(a, &sa));
    CHECK_OK(ts_backward(sa, NULL, false));
    CHECK(ts_tensor_grad(x3) != NULL && ts_tensor_grad(w) != NULL);
    ts_tensor_release(sa);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(a4);
    ts_tensor_release(w);
    ts_tensor_release(x2);
    ts_tensor_release(x3);
    ts_tensor_release(x4);

    CHECK_STATUS(ts_nn_batchnorm1d_new(0, 1e-5f, 0.1f, true, true, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ts_nn_batchnorm1d_new: num_features");
    CHECK_OK(ts_nn_batchnorm1d_new(3, 1e-5f, 0.1f, false, false, &m));
    CHECK(ts_module_num_parameters(m) == 0);
    CHECK_OK(ts_module_buffers(m, &sd));
    CHECK(sd.n == 0);
    ts_tensor_list_clear(&sd);
    ts_module_free(m);
}

/* Reference row normalisation in double (k_norm.h's geometry): y, and the gradients of
 * sum(y * gy) for x, weight and bias. */
static void ref_row_norm(int64_t R, int64_t G, int64_t Cg, int64_t S, const float *x, const float *w, const float *b,
                         double eps, const float *gy, double *y, double *gx, double *gw, double *gb) {
    const int64_t D = Cg * S, P = G * Cg;
    for (int64_t p = 0; p < P; p++) gw[p] = gb[p] = 0;
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D, *gr = gy + r * D;
        double mu = 0, var = 0, A = 0, B = 0;
        for (int64_t j = 0; j < D; j++) mu += xr[j];
        mu /= (double)D;
        for (int64_t j = 0; j < D; j++) var += (xr[j] - mu) * (xr[j] - mu);
        double is = 1.0 / sqrt(var / (double)D + eps);
        for (int64_t j = 0; j < D; j++) {
            int64_t ch = (r % G) * Cg + j / S;
            double xh = (xr[j] - mu) * is, h = gr[j] * (double)w[ch];
            y[r * D + j] = xh * w[ch] + b[ch];
            gw[ch] += gr[j] * xh;
            gb[ch] += gr[j];
            A += h;
            B += h * xh;
        }
        for (int64_t j = 0; j < D; j++) {
            int64_t ch = (r % G) * Cg + j / S;
            double xh = (xr[j] - mu) * is;
            gx[r * D + j] = is * (gr[j] * (double)w[ch] - A / (double)D - xh * B / (double)D);
        }
    }
}

/* max |got - want| / (1e-4 + 1e-3 |want|) over n elements */
static double ratio(const float *got, const double *want, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]) / (1e-4 + 1e-3 * fabs(want[i])));
    return worst;
}

/* layer_norm and group_norm on inputs above the kernels' parallel threshold, against the reference. */
static void test_norm_ops_large(void) {
    ts_rng r;
    ts_rng_seed(&r, 21);
    for (int which = 0; which < 2; which++) {
        /* group_norm (4, 8, 40, 40), 4 groups; layer_norm over the last 2 dims of (50, 30, 40) */
        const bool gn = which == 0;
        const int64_t xs_gn[4] = {4, 8, 40, 40}, xs_ln[3] = {50, 30, 40};
        const int nd = gn ? 4 : 3;
        const int64_t *xshape = gn ? xs_gn : xs_ln;
        const int64_t R = gn ? 16 : 50, G = gn ? 4 : 1, Cg = gn ? 2 : 1200, S = gn ? 1600 : 1, P = G * Cg;
        const int64_t n = R * Cg * S;
        ts_tensor *x = tu_rand(&r, nd, xshape, -3, 5, true);
        ts_tensor *w = gn ? tu_rand(&r, 1, &P, 0.5f, 1.5f, true) : tu_rand(&r, 2, (int64_t[]){30, 40}, 0.5f, 1.5f, true);
        ts_tensor *b = gn ? tu_rand(&r, 1, &P, -1, 1, true) : tu_rand(&r, 2, (int64_t[]){30, 40}, -1, 1, true);
        ts_tensor *gy = tu_rand(&r, nd, xshape, -1, 1, false), *y = NULL;
        if (gn)
            CHECK_OK(ts_group_norm(x, 4, w, b, 1e-5f, &y));
        else
            CHECK_OK(ts_layer_norm(x, 2, w, b, 1e-5f, &y));
        if (!y) return;
        CHECK_OK(ts_backward(y, gy, false));
        double *ry = malloc(sizeof(double) * (size_t)n), *rgx = malloc(sizeof(double) * (size_t)n);
        double *rgw = malloc(sizeof(double) * (size_t)P), *rgb = malloc(sizeof(double) * (size_t)P);
        ref_row_norm(R, G, Cg, S, ts_tensor_data_f32(x), ts_tensor_data_f32(w), ts_tensor_data_f32(b), 1e-5,
                     ts_tensor_data_f32(gy), ry, rgx, rgw, rgb);
        double q[4] = {ratio(ts_tensor_data_f32(y), ry, n), ratio(ts_tensor_data_f32(ts_tensor_grad(x)), rgx, n),
                       ratio(ts_tensor_data_f32(ts_tensor_grad(w)), rgw, P),
                       ratio(ts_tensor_data_f32(ts_tensor_grad(b)), rgb, P)};
        for (int i = 0; i < 4; i++) {
            CHECK(q[i] <= 1);
            if (q[i] > 1) fprintf(stderr, "  %s: output %d off by %.3g of tolerance\n", gn ? "group_norm" : "layer_norm", i, q[i]);
        }
        CHECK(ts_tensor_ndim(ts_tensor_grad(w)) == ts_tensor_ndim(w)); /* the weight's own shape */
        free(ry);
        free(rgx);
        free(rgw);
        free(rgb);
        ts_tensor_release(y);
        ts_tensor_release(x);
        ts_tensor_release(w);
        ts_tensor_release(b);
        ts_tensor_release(gy);
    }
}

static void test_norm_op_errors(void) {
    ts_rng r;
    ts_rng_seed(&r, 22);
    ts_tensor *x = tu_rand(&r, 3, (int64_t[]){2, 6, 5}, 0, 1, false), *y = NULL;
    ts_tensor *w5 = tu_rand(&r, 1, (int64_t[]){5}, 0, 1, false), *w6 = tu_rand(&r, 1, (int64_t[]){6}, 0, 1, false);
    CHECK_STATUS(ts_layer_norm(x, 0, NULL, NULL, 1e-5f, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("normalized_ndim 0 is out of range [1, 3]");
    CHECK_STATUS(ts_layer_norm(x, 4, NULL, NULL, 1e-5f, &y), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_layer_norm(x, 2, w5, NULL, 1e-5f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("layer_norm: weight [5] does not fit input [2, 6, 5] (expected the normalized shape [6, 5])");
    CHECK_STATUS(ts_layer_norm(x, 1, NULL, w6, 1e-5f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("bias [6]");
    CHECK_STATUS(ts_layer_norm(x, 1, NULL, NULL, -1.0f, &y), TS_ERR_INVALID_ARG);
    CHECK_OK(ts_layer_norm(x, 1, w5, w5, 1e-5f, &y));
    ts_tensor_release(y);
    y = NULL;

    CHECK_STATUS(ts_group_norm(x, 4, NULL, NULL, 1e-5f, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("num_groups 4 must be >= 1 and divide the 6 channels");
    CHECK_STATUS(ts_group_norm(x, 0, NULL, NULL, 1e-5f, &y), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_group_norm(x, 3, w5, NULL, 1e-5f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("group_norm: weight [5] does not fit input [2, 6, 5] (6 channels)");
    ts_tensor *x1 = tu_rand(&r, 1, (int64_t[]){6}, 0, 1, false);
    CHECK_STATUS(ts_group_norm(x1, 1, NULL, NULL, 1e-5f, &y), TS_ERR_SHAPE);
    CHECK_STATUS(ts_batchnorm1d(x1, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f, &y), TS_ERR_SHAPE);
    CHECK_STATUS(ts_batchnorm1d(x, w5, NULL, NULL, NULL, true, 0.1f, 1e-5f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("batchnorm1d: weight [5] does not fit input [2, 6, 5] (6 channels)");
    CHECK_STATUS(ts_batchnorm1d(x, NULL, NULL, NULL, NULL, false, 0.1f, 1e-5f, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("batchnorm1d: eval mode needs running_mean");
    ts_tensor *one = tu_rand(&r, 2, (int64_t[]){1, 6}, 0, 1, false);
    CHECK_STATUS(ts_batchnorm1d(one, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("expected more than 1 value per channel");
    CHECK(y == NULL);
    ts_tensor_release(one);
    ts_tensor_release(x1);
    ts_tensor_release(x);
    ts_tensor_release(w5);
    ts_tensor_release(w6);
}

static ts_tensor *targets(int n, const int64_t *v) {
    ts_tensor *t = NULL;
    if (ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, (int64_t[]){n}, v, &t) != TS_OK) abort();
    return t;
}

static void test_cross_entropy_ex_edges(void) {
    ts_rng r;
    ts_rng_seed(&r, 23);
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){4, 3}, -2, 2, true), *y = NULL, *y2 = NULL;
    ts_tensor *t = targets(4, (int64_t[]){0, 2, 1, 2});
    /* ts_cross_entropy is the default options */
    ts_cross_entropy_opts o = TS_CROSS_ENTROPY_OPTS_INIT;
    CHECK(o.reduction == TS_REDUCTION_MEAN && o.weight == NULL && o.ignore_index == -100 && o.label_smoothing == 0);
    o.label_smoothing = 0.3f;
    CHECK_OK(ts_cross_entropy(x, t, 0.3f, &y));
    CHECK_OK(ts_cross_entropy_ex(x, t, &o, &y2));
    check_close(y, y2, 0);
    ts_tensor_release(y);
    ts_tensor_release(y2);
    CHECK_OK(ts_cross_entropy_ex(x, t, NULL, &y)); /* NULL options: the defaults */
    CHECK(ts_tensor_ndim(y) == 0);
    ts_tensor_release(y);

    /* out of range, not ignore_index: names the value, the sample and the ignore_index */
    ts_tensor *bad = targets(4, (int64_t[]){0, 2, 3, -100});
    CHECK_STATUS(ts_cross_entropy_ex(x, bad, NULL, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("target 3 of sample 2 is out of range [0, 3)");
    o = TS_CROSS_ENTROPY_OPTS_INIT;
    o.ignore_index = 3; /* now sample 2 is ignored but -100 at sample 3 is out of range */
    CHECK_STATUS(ts_cross_entropy_ex(x, bad, &o, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("target -100 of sample 3");
    CHECK_ERR_MENTIONS("ignore_index is 3");
    ts_tensor_release(bad);

    /* every target ignored: mean is NaN (0/0), sum 0, none all zeros, gradients zero */
    ts_tensor *ign = targets(4, (int64_t[]){-100, -100, -100, -100});
    CHECK_OK(ts_cross_entropy_ex(x, ign, NULL, &y));
    CHECK(isnan(ts_tensor_item(y, 0)));
    ts_tensor_release(y);
    o = TS_CROSS_ENTROPY_OPTS_INIT;
    o.reduction = TS_REDUCTION_SUM;
    CHECK_OK(ts_cross_entropy_ex(x, ign, &o, &y));
    CHECK(ts_tensor_item(y, 0) == 0);
    CHECK_OK(ts_backward(y, NULL, false));
    CHECK(ts_tensor_grad(x) && all_equal(ts_tensor_grad(x), 0.0));
    ts_tensor_release(y);
    o.reduction = TS_REDUCTION_NONE;
    CHECK_OK(ts_cross_entropy_ex(x, ign, &o, &y));
    CHECK(ts_tensor_ndim(y) == 1 && ts_tensor_shape(y)[0] == 4 && all_equal(y, 0.0));
    ts_tensor_release(y);
    ts_tensor_release(ign);
    y = NULL;

    /* bad options */
    o = TS_CROSS_ENTROPY_OPTS_INIT;
    o.reduction = (ts_reduction)7;
    CHECK_STATUS(ts_cross_entropy_ex(x, t, &o, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("reduction 7");
    o = TS_CROSS_ENTROPY_OPTS_INIT;
    ts_tensor *w4 = tu_rand(&r, 1, (int64_t[]){4}, 0, 1, false);
    o.weight = w4;
    CHECK_STATUS(ts_cross_entropy_ex(x, t, &o, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("weight [4] does not fit logits [4, 3] (expected [3])");
    o.weight = NULL;
    o.label_smoothing = 1.5f;
    CHECK_STATUS(ts_cross_entropy_ex(x, t, &o, &y), TS_ERR_INVALID_ARG);
    CHECK(y == NULL);
    ts_tensor_release(w4);
    ts_tensor_release(t);
    ts_tensor_release(x);
}

/* (N, C, H, W) logits are the (N*H*W, C) rows of their transpose, above the kernels' parallel
 * threshold; shape errors name the expected target. */
static void test_cross_entropy_spatial(void) {
    ts_rng r;
    ts_rng_seed(&r, 24);
    const int64_t N = 4, C = 10, H = 32, W = 32, S = H * W;
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){N, C, H, W}, -3, 3, true), *xt = NULL, *t = NULL, *t2 = NULL;
    ts_tensor *w = tu_rand(&r, 1, &C, 0.2f, 2.0f, false);
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){N * S, C}, &xt));
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_I64, 3, (int64_t[]){N, H, W}, &t));
    const float *px = ts_tensor_data_f32(x);
    float *pt = ts_tensor_data_f32(xt);
    int64_t *ti = ts_tensor_data(t);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t s = 0; s < S; s++) pt[(n * S + s) * C + c] = px[(n * C + c) * S + s];
    for (int64_t i = 0; i < N * S; i++) ti[i] = i % 7 == 3 ? -100 : (int64_t)(ts_rng_u64(&r) % (uint64_t)C);
    ts_tensor_set_requires_grad(xt, true);
    CHECK_OK(ts_reshape(t, 1, (int64_t[]){N * S}, &t2));
    for (int red = 0; red < 3; red++) {
        ts_cross_entropy_opts o = TS_CROSS_ENTROPY_OPTS_INIT;
        o.reduction = (ts_reduction)red;
        o.weight = w;
        o.label_smoothing = 0.15f;
        ts_tensor *y = NULL, *yt = NULL;
        CHECK_OK(ts_cross_entropy_ex(x, t, &o, &y));
        CHECK_OK(ts_cross_entropy_ex(xt, t2, &o, &yt));
        if (!y || !yt) return;
        CHECK(ts_tensor_ndim(y) == (red == TS_REDUCTION_NONE ? 3 : 0));
        check_close(y, yt, 1e-5 * (red == TS_REDUCTION_SUM ? 1000 : 1));
        ts_tensor_zero_grad(x);
        ts_tensor_zero_grad(xt);
        CHECK_OK(ts_backward(y, red == TS_REDUCTION_NONE ? y : NULL, false));
        CHECK_OK(ts_backward(yt, red == TS_REDUCTION_NONE ? yt : NULL, false));
        const float *gx = ts_tensor_data_f32(ts_tensor_grad(x)), *gt = ts_tensor_data_f32(ts_tensor_grad(xt));
        double worst = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t s = 0; s < S; s++)
                    worst = fmax(worst, fabs(gx[(n * C + c) * S + s] - gt[(n * S + s) * C + c]));
        CHECK(worst < 1e-6);
        ts_tensor_release(y);
        ts_tensor_release(yt);
    }
    ts_tensor *y = NULL;
    CHECK_STATUS(ts_cross_entropy_ex(x, t2, NULL, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("target [4096] does not fit logits [4, 10, 32, 32] (expected target [4, 32, 32])");
    ti[2 * S + 5] = 10;
    CHECK_STATUS(ts_cross_entropy_ex(x, t, NULL, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("target 10 of sample 2 at position 5");
    ts_tensor *x1 = tu_rand(&r, 1, &C, 0, 1, false);
    CHECK_STATUS(ts_cross_entropy_ex(x1, t, NULL, &y), TS_ERR_SHAPE);
    ts_tensor_release(x1);
    ts_tensor_release(x);
    ts_tensor_release(xt);
    ts_tensor_release(t);
    ts_tensor_release(t2);
    ts_tensor_release(w);
}

/* exclude_pad: equal to include-pad where no window touches padding; the average of the
 * input elements only at the corners; max pooling refuses it. */
static void test_avgpool_exclude_pad(void) {
    ts_tensor *x = NULL, *y = NULL, *y2 = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 4, (int64_t[]){1, 1, 4, 4}, 2.0f, &x));
    ts_pool2d_params p;
    memset(&p, 0, sizeof p);
    p.kernel[0] = p.kernel[1] = 3;
    p.stride[0] = p.stride[1] = 1;
    p.padding[0] = p.padding[1] = 1;
    p.exclude_pad = true;
    CHECK_OK(ts_avgpool2d(x, p, &y)); /* a constant input stays constant when padding is not counted */
    CHECK(y && all_equal(y, 2.0));
    ts_tensor_release(y);
    p.exclude_pad = false;
    CHECK_OK(ts_avgpool2d(x, p, &y)); /* counted: the corner window has 4 of 9 inputs */
    CHECK(y && fabs(ts_tensor_item(y, 0) - 8.0 / 9.0) < 1e-6);
    ts_tensor_release(y);
    p.padding[0] = p.padding[1] = 0;
    CHECK_OK(ts_avgpool2d(x, p, &y));
    p.exclude_pad = true;
    CHECK_OK(ts_avgpool2d(x, p, &y2));
    check_close(y, y2, 0);
    ts_tensor_release(y);
    ts_tensor_release(y2);
    y = NULL;
    CHECK_STATUS(ts_maxpool2d(x, p, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("exclude_pad");
    ts_tensor_release(x);
}

/* TileParallel cannot split an AvgPool2d that excludes height padding: a clear error, not wrong values. */
static void test_tile_rejects_exclude_pad(void) {
    ts_device *devs[2];
    CHECK_OK(ts_device_get("cpu:0", &devs[0]));
    CHECK_OK(ts_device_get("cpu:1", &devs[1]));
    ts_module *seq = NULL, *m = NULL, *tp = NULL;
    ts_pool2d_params p;
    memset(&p, 0, sizeof p);
    p.kernel[0] = p.kernel[1] = 3;
    p.stride[0] = p.stride[1] = 1;
    p.padding[0] = p.padding[1] = 1;
    p.exclude_pad = true;
    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_avgpool2d_new(p, &m));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, m));
    CHECK_STATUS(ts_nn_tile_parallel_new(seq, devs, 2, NULL, &tp), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("exclude_pad");
    /* and a LayerNorm cannot be tiled (a clear error naming it) */
    ts_module *seq2 = NULL;
    CHECK_OK(ts_nn_sequential_new(&seq2));
    CHECK_OK(ts_nn_layernorm_new(1, (int64_t[]){8}, 1e-5f, true, &m));
    CHECK_OK(ts_nn_sequential_add(seq2, NULL, m));
    CHECK_STATUS(ts_nn_tile_parallel_new(seq2, devs, 2, NULL, &tp), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("LayerNorm");
}

/* One forward + backward through op `which` on prepared inputs; every result released. */
static ts_status chain(int which, ts_tensor *x3, ts_tensor *w, ts_tensor *b, ts_tensor *logits, ts_tensor *target,
                       ts_tensor *cw, ts_tensor *rm, ts_tensor *rv) {
    ts_tensor *y = NULL, *s = NULL;
    ts_status st;
    ts_cross_entropy_opts o = TS_CROSS_ENTROPY_OPTS_INIT;
    ts_pool2d_params p;
    memset(&p, 0, sizeof p);
    switch (which) {
    case 0: st = ts_layer_norm(x3, 1, NULL, NULL, 1e-5f, &y); break;
    case 1: st = ts_group_norm(x3, 2, w, b, 1e-5f, &y); break;
    case 2: st = ts_batchnorm1d(x3, w, b, rm, rv, true, 0.1f, 1e-5f, &y); break;
    case 3:
        o.reduction = TS_REDUCTION_NONE;
        o.weight = cw;
        o.label_smoothing = 0.1f;
        st = ts_cross_entropy_ex(logits, target, &o, &y);
        break;
    default: {
        ts_tensor *x4 = NULL;
        st = ts_reshape(x3, 4, (int64_t[]){2, 4, 5, 1}, &x4);
        p.kernel[0] = 3; /* (3, 1) windows over (2, 4, 5, 1), height padding excluded */
        p.kernel[1] = 1;
        p.padding[0] = 1;
        p.exclude_pad = true;
        if (st == TS_OK) st = ts_avgpool2d(x4, p, &y);
        ts_tensor_release(x4);
    }
    }
    if (st == TS_OK) st = ts_sum(y, &s);
    if (st == TS_OK) st = ts_backward(s, NULL, false);
    ts_tensor_release(y);
    ts_tensor_release(s);
    return st;
}

/* Every allocation of each new op's forward and backward failing in turn: TS_ERR_NOMEM, no leak (ASan). */
static void test_alloc_failures(void) {
    ts_rng r;
    ts_rng_seed(&r, 25);
    ts_tensor *x3 = tu_rand(&r, 3, (int64_t[]){2, 4, 5}, -1, 1, true);
    ts_tensor *w = tu_rand(&r, 1, (int64_t[]){4}, 0.5f, 1.5f, true), *b = tu_rand(&r, 1, (int64_t[]){4}, -1, 1, true);
    ts_tensor *logits = tu_rand(&r, 3, (int64_t[]){2, 3, 4}, -1, 1, true), *target = NULL;
    ts_tensor *cw = tu_rand(&r, 1, (int64_t[]){3}, 0.5f, 1.5f, false);
    ts_tensor *rm = tu_rand(&r, 1, (int64_t[]){4}, 0, 1, false), *rv = tu_rand(&r, 1, (int64_t[]){4}, 1, 2, false);
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 2, (int64_t[]){2, 4},
                                 (int64_t[]){0, 2, -100, 1, 1, 1, 0, 2}, &target));
    for (int which = 0; which < 5; which++) {
        int runs = 0;
        for (long n = 0; n < 1000; n++) {
            ts__alloc_fail_after(n);
            ts_status st = chain(which, x3, w, b, logits, target, cw, rm, rv);
            long injected = ts__alloc_failures();
            ts__alloc_fail_after(-1);
            runs++;
            if (st == TS_OK && injected == 0) break;
            CHECK(st == TS_ERR_NOMEM);
            if (st != TS_ERR_NOMEM) {
                fprintf(stderr, "  op %d, failing after %ld allocations: %s (%s)\n", which, n, ts_status_name(st),
                        ts_last_error());
                break;
            }
        }
        CHECK(runs > 2);
    }
    ts_tensor_release(x3);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_tensor_release(logits);
    ts_tensor_release(target);
    ts_tensor_release(cw);
    ts_tensor_release(rm);
    ts_tensor_release(rv);
}

int main(int argc, char **argv) {
    if (ts_set_cpu_device_count(2) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    static const tu_test tests[] = {T(test_layernorm_module),       T(test_groupnorm_module),
                                    T(test_batchnorm1d_module),     T(test_norm_ops_large),
                                    T(test_norm_op_errors),         T(test_cross_entropy_ex_edges),
                                    T(test_cross_entropy_spatial),  T(test_avgpool_exclude_pad),    T(test_tile_rejects_exclude_pad),
                                    T(test_alloc_failures)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
