/* Modules: state-dict names and order (PyTorch's), load_state_dict and its
 * errors, train/eval, initialisers, forward values, a small training run, and
 * the reference CNN / ResidualBlock end to end. Parts that need ops still
 * returning TS_ERR_UNSUPPORTED print a note and are skipped. */
#include "test_util.h"

static int tu_skips;

/* True (and a note) when st says the op is not there yet. */
static bool skip_unsupported(ts_status st, const char *what) {
    if (st != TS_ERR_UNSUPPORTED) return false;
    fprintf(stderr, "  note: %s skipped (op not available yet): %s\n", what, ts_last_error());
    tu_skips++;
    return true;
}

/* Borrowed pointer to the values of m's parameter or buffer `name` (CPU). */
static ts_tensor *find_tensor(ts_module *m, const char *name) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor *t = NULL;
    if (ts_module_parameters(m, &l) == TS_OK) t = ts_tensor_list_find(&l, name);
    if (!t && ts_module_buffers(m, &l) == TS_OK) t = ts_tensor_list_find(&l, name);
    ts_tensor_list_clear(&l); /* the module keeps its own reference */
    if (!t) {
        fprintf(stderr, "no tensor '%s'\n", name);
        abort();
    }
    return t;
}

static void set_values(ts_module *m, const char *name, const float *v, int64_t n) {
    ts_tensor *t = find_tensor(m, name);
    CHECK(ts_tensor_numel(t) == n);
    memcpy(ts_tensor_data_f32(t), v, sizeof(float) * (size_t)n);
}

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    ts_dtype dt;
} want_entry;

static void check_list(const ts_tensor_list *l, const want_entry *w, int n) {
    CHECK(l->n == n);
    for (int i = 0; i < n && i < l->n; i++) {
        if (strcmp(l->names[i], w[i].name) != 0) {
            tu_failures++;
            fprintf(stderr, "entry %d: name '%s', expected '%s'\n", i, l->names[i], w[i].name);
            continue;
        }
        ts_tensor *t = l->tensors[i];
        CHECK(ts_tensor_ndim(t) == w[i].ndim);
        CHECK(ts_tensor_dtype(t) == w[i].dt);
        for (int d = 0; d < w[i].ndim && d < ts_tensor_ndim(t); d++)
            if (ts_tensor_dim(t, d) != w[i].shape[d]) {
                tu_failures++;
                fprintf(stderr, "%s: dim %d is %lld, expected %lld\n", w[i].name, d, (long long)ts_tensor_dim(t, d),
                        (long long)w[i].shape[d]);
            }
    }
}

#define F TS_F32
#define I TS_I64
/* nn.Sequential(Conv2d(1,32,3,padding=1), BatchNorm2d(32), ReLU(), MaxPool2d(2), Conv2d(32,64,3,padding=1),
 * BatchNorm2d(64), ReLU(), MaxPool2d(2), Flatten(), Linear(3136,128), ReLU(), Linear(128,10)).state_dict() */
static const want_entry cnn_sd[] = {
    {"0.weight", 4, {32, 1, 3, 3}, F},  {"0.bias", 1, {32}, F},          {"1.weight", 1, {32}, F},
    {"1.bias", 1, {32}, F},             {"1.running_mean", 1, {32}, F},  {"1.running_var", 1, {32}, F},
    {"1.num_batches_tracked", 0, {0}, I}, {"4.weight", 4, {64, 32, 3, 3}, F}, {"4.bias", 1, {64}, F},
    {"5.weight", 1, {64}, F},           {"5.bias", 1, {64}, F},          {"5.running_mean", 1, {64}, F},
    {"5.running_var", 1, {64}, F},      {"5.num_batches_tracked", 0, {0}, I}, {"9.weight", 2, {128, 3136}, F},
    {"9.bias", 1, {128}, F},            {"11.weight", 2, {10, 128}, F},  {"11.bias", 1, {10}, F},
};

static void test_cnn_state_dict_names(void) {
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_module *m = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &m));
    ts_tensor_list sd = TS_TENSOR_LIST_INIT, p = TS_TENSOR_LIST_INIT, b = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    check_list(&sd, cnn_sd, (int)(sizeof cnn_sd / sizeof cnn_sd[0]));
    CHECK_OK(ts_module_parameters(m, &p));
    CHECK(p.n == 12);
    const char *pn[12] = {"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias",
                          "5.weight", "5.bias", "9.weight", "9.bias", "11.weight", "11.bias"};
    for (int i = 0; i < 12 && i < p.n; i++) {
        CHECK(strcmp(p.names[i], pn[i]) == 0);
        CHECK(ts_tensor_requires_grad(p.tensors[i]) && ts_tensor_is_leaf(p.tensors[i]));
    }
    CHECK_OK(ts_module_buffers(m, &b));
    CHECK(b.n == 6);
    if (b.n == 6) CHECK(strcmp(b.names[5], "5.num_batches_tracked") == 0);
    CHECK(ts_module_num_parameters(m) == 421834);
    CHECK(strcmp(ts_module_type_name(m), "Sequential") == 0);
    CHECK(strcmp(ts_module_type_name(ts_module_child(m, "1")), "BatchNorm2d") == 0);
    CHECK(strcmp(ts_module_type_name(ts_module_child(m, "8")), "Flatten") == 0);
    CHECK(ts_module_child(m, "12") == NULL);
    CHECK(ts_nn_sequential_len(m) == 12);
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&p);
    ts_tensor_list_clear(&b);
    ts_module_free(m);

    static const want_entry mlp_sd[] = {
        {"1.weight", 2, {256, 784}, F}, {"1.bias", 1, {256}, F}, {"3.weight", 2, {10, 256}, F}, {"3.bias", 1, {10}, F}};
    CHECK_OK(ts_model_mlp(&r, &m));
    CHECK_OK(ts_module_state_dict(m, &sd));
    check_list(&sd, mlp_sd, 4);
    ts_tensor_list_clear(&sd);
    ts_module_free(m);
}

static void test_model_by_name(void) {
    ts_module *m = NULL;
    CHECK_OK(ts_model_by_name("cnn", NULL, &m));
    CHECK(m && ts_module_num_parameters(m) == 421834);
    ts_module_free(m);
    m = NULL;
    CHECK_OK(ts_model_by_name("mlp", NULL, &m));
    CHECK(m && ts_module_num_parameters(m) == 784 * 256 + 256 + 2570);
    ts_module_free(m);
    m = NULL;
    CHECK_STATUS(ts_model_by_name("resnet9000", NULL, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("resnet9000");
    CHECK(m == NULL);
    ts_module_free(NULL);
}

/* A copy of sd with entry `drop` left out, `replace` swapped for t, and (extra, t2) appended. */
static ts_tensor_list edited(const ts_tensor_list *sd, const char *drop, const char *replace, ts_tensor *t,
                             const char *extra, ts_tensor *t2) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    for (int i = 0; i < sd->n; i++) {
        if (drop && strcmp(sd->names[i], drop) == 0) continue;
        bool rep = replace && strcmp(sd->names[i], replace) == 0;
        ts_tensor_list_append(&l, sd->names[i], rep ? t : sd->tensors[i]);
    }
    if (extra) ts_tensor_list_append(&l, extra, t2);
    return l;
}

static bool same_values(ts_tensor *a, ts_tensor *b) {
    if (ts_tensor_numel(a) != ts_tensor_numel(b) || ts_tensor_dtype(a) != ts_tensor_dtype(b)) return false;
    for (int64_t i = 0; i < ts_tensor_numel(a); i++)
        if (ts_tensor_item(a, i) != ts_tensor_item(b, i)) return false;
    return true;
}

static void test_load_state_dict(void) {
    ts_rng r;
    ts_rng_seed(&r, 2);
    ts_module *a = NULL, *b = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &a));
    CHECK_OK(ts_model_reference_cnn(&r, &b));
    /* make a's buffers differ from the defaults too */
    ts_tensor_fill_(find_tensor(a, "1.running_mean"), 0.25f);
    int64_t seven = 7;
    ts_tensor_from_host(find_tensor(a, "5.num_batches_tracked"), &seven, sizeof seven);
    ts_tensor_list sa = TS_TENSOR_LIST_INIT, sb = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(a, &sa));
    CHECK(!same_values(find_tensor(a, "0.weight"), find_tensor(b, "0.weight")));
    CHECK_OK(ts_module_load_state_dict(b, &sa, true));
    CHECK_OK(ts_module_state_dict(b, &sb));
    CHECK(sa.n == sb.n);
    for (int i = 0; i < sa.n && i < sb.n; i++) CHECK(same_values(sa.tensors[i], sb.tensors[i]));
    CHECK(ts_tensor_item(find_tensor(b, "5.num_batches_tracked"), 0) == 7);
    /* values were copied, not shared */
    ts_tensor_fill_(find_tensor(a, "11.bias"), 3.0f);
    CHECK(ts_tensor_item(find_tensor(b, "11.bias"), 0) != 3.0);
    /* parameters stay leaves that require grad */
    CHECK(ts_tensor_requires_grad(find_tensor(b, "0.weight")) && ts_tensor_is_leaf(find_tensor(b, "0.weight")));

    ts_module *c = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &c));
    double c0 = ts_tensor_item(find_tensor(c, "0.weight"), 0);
    /* missing key */
    ts_tensor_list l = edited(&sa, "4.bias", NULL, NULL, NULL, NULL);
    CHECK_STATUS(ts_module_load_state_dict(c, &l, true), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("1 missing key in the state dict: '4.bias'");
    CHECK(ts_tensor_item(find_tensor(c, "0.weight"), 0) == c0); /* nothing copied */
    CHECK_OK(ts_module_load_state_dict(c, &l, false));
    CHECK(ts_tensor_item(find_tensor(c, "0.weight"), 0) == ts_tensor_item(find_tensor(a, "0.weight"), 0));
    ts_tensor_list_clear(&l);
    /* unexpected key */
    ts_tensor *junk = tu_tensor(1, (int64_t[]){3}, (float[]){1, 2, 3});
    l = edited(&sa, NULL, NULL, NULL, "12.weight", junk);
    CHECK_STATUS(ts_module_load_state_dict(c, &l, true), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("1 unexpected key in the state dict: '12.weight'");
    CHECK_OK(ts_module_load_state_dict(c, &l, false));
    ts_tensor_list_clear(&l);
    /* shape mismatch: an error even when not strict, naming both shapes */
    ts_tensor *bad = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 2, (int64_t[]){128, 100}, &bad));
    l = edited(&sa, NULL, "9.weight", bad, NULL, NULL);
    ts_tensor_fill_(find_tensor(c, "0.weight"), 0.5f);
    CHECK_STATUS(ts_module_load_state_dict(c, &l, false), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("9.weight");
    CHECK_ERR_MENTIONS("[128, 100]");
    CHECK_ERR_MENTIONS("[128, 3136]");
    CHECK(ts_tensor_item(find_tensor(c, "0.weight"), 0) == 0.5); /* nothing copied */
    ts_tensor_list_clear(&l);
    /* dtype mismatch */
    ts_tensor *fnbt = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 0, NULL, &fnbt));
    l = edited(&sa, NULL, "1.num_batches_tracked", fnbt, NULL, NULL);
    CHECK_STATUS(ts_module_load_state_dict(c, &l, true), TS_ERR_DTYPE);
    CHECK_ERR_MENTIONS("1.num_batches_tracked");
    ts_tensor_list_clear(&l);
    ts_tensor_release(fnbt);
    ts_tensor_release(bad);
    ts_tensor_release(junk);
    ts_tensor_list_clear(&sa);
    ts_tensor_list_clear(&sb);
    ts_module_free(a);
    ts_module_free(b);
    ts_module_free(c);
}

static void test_train_eval(void) {
    ts_module *m = NULL, *blk = NULL;
    CHECK_OK(ts_model_reference_cnn(NULL, &m));
    CHECK(ts_module_is_training(m));
    ts_module_train(m, false);
    CHECK(!ts_module_is_training(m));
    const char *kids[] = {"0", "1", "5", "8", "11"};
    for (int i = 0; i < 5; i++) CHECK(!ts_module_is_training(ts_module_child(m, kids[i])));
    ts_module_train(m, true);
    for (int i = 0; i < 5; i++) CHECK(ts_module_is_training(ts_module_child(m, kids[i])));
    ts_module_free(m);
    /* nested: a residual block inside a Sequential */
    CHECK_OK(ts_nn_sequential_new(&m));
    CHECK_OK(ts_nn_residual_block_new(4, 8, 2, NULL, &blk));
    CHECK_OK(ts_nn_sequential_add(m, "layer1", blk));
    ts_module_train(m, false);
    CHECK(!ts_module_is_training(ts_module_child(m, "layer1.downsample.1")));
    CHECK(!ts_module_is_training(ts_module_child(m, "layer1.bn2")));
    ts_module_free(m);
}

static void check_uniform_bound(ts_tensor *t, double bound) {
    double mx = 0, sum = 0;
    int64_t n = ts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = ts_tensor_item(t, i);
        mx = fmax(mx, fabs(v));
        sum += v;
    }
    CHECK(mx <= bound);
    if (n >= 100) {
        CHECK(mx > 0.9 * bound);                      /* spread over the whole range */
        CHECK(fabs(sum / (double)n) < 0.1 * bound);   /* centred */
    }
}

static void test_init(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_module *m = NULL, *m2 = NULL;
    CHECK_OK(ts_nn_linear_new(100, 50, true, &r, &m));
    check_uniform_bound(find_tensor(m, "weight"), 1 / sqrt(100.0));
    check_uniform_bound(find_tensor(m, "bias"), 1 / sqrt(100.0));
    /* same seed, same values */
    ts_rng_seed(&r, 3);
    CHECK_OK(ts_nn_linear_new(100, 50, true, &r, &m2));
    CHECK(same_values(find_tensor(m, "weight"), find_tensor(m2, "weight")));
    ts_module_free(m);
    ts_module_free(m2);
    /* no bias: no "bias" entry */
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_nn_linear_new(4, 2, false, &r, &m));
    CHECK_OK(ts_module_state_dict(m, &l));
    CHECK(l.n == 1 && strcmp(l.names[0], "weight") == 0);
    ts_tensor_list_clear(&l);
    ts_module_free(m);

    CHECK_OK(ts_nn_conv2d_new(3, 8, 5, 5, TS_CONV2D_DEFAULT, true, &r, &m));
    check_uniform_bound(find_tensor(m, "weight"), 1 / sqrt(75.0));
    check_uniform_bound(find_tensor(m, "bias"), 1 / sqrt(75.0));
    ts_module_free(m);
    ts_conv2d_params g = TS_CONV2D_DEFAULT;
    g.groups = 2;
    CHECK_OK(ts_nn_conv2d_new(4, 8, 3, 3, g, true, &r, &m));
    CHECK(ts_tensor_dim(find_tensor(m, "weight"), 1) == 2);
    check_uniform_bound(find_tensor(m, "weight"), 1 / sqrt(18.0));
    ts_module_free(m);
    CHECK_STATUS(ts_nn_conv2d_new(3, 8, 3, 3, g, true, &r, &m), TS_ERR_INVALID_ARG);

    CHECK_OK(ts_nn_batchnorm2d_new(6, 1e-5f, 0.1f, true, true, &m));
    for (int i = 0; i < 6; i++) {
        CHECK(ts_tensor_item(find_tensor(m, "weight"), i) == 1);
        CHECK(ts_tensor_item(find_tensor(m, "bias"), i) == 0);
        CHECK(ts_tensor_item(find_tensor(m, "running_mean"), i) == 0);
        CHECK(ts_tensor_item(find_tensor(m, "running_var"), i) == 1);
    }
    CHECK(ts_tensor_dtype(find_tensor(m, "num_batches_tracked")) == TS_I64);
    CHECK(ts_tensor_item(find_tensor(m, "num_batches_tracked"), 0) == 0);
    ts_module_free(m);
    /* affine=false: buffers only; track_running_stats=false: parameters only */
    CHECK_OK(ts_nn_batchnorm2d_new(6, 1e-5f, 0.1f, false, true, &m));
    CHECK_OK(ts_module_state_dict(m, &l));
    CHECK(l.n == 3 && strcmp(l.names[0], "running_mean") == 0);
    ts_tensor_list_clear(&l);
    ts_module_free(m);
    CHECK_OK(ts_nn_batchnorm2d_new(6, 1e-5f, 0.1f, true, false, &m));
    CHECK_OK(ts_module_state_dict(m, &l));
    CHECK(l.n == 2 && strcmp(l.names[1], "bias") == 0);
    ts_tensor_list_clear(&l);
    ts_module_free(m);

    CHECK_OK(ts_nn_embedding_new(1000, 20, &r, &m));
    ts_tensor *w = find_tensor(m, "weight");
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < 20000; i++) {
        double v = ts_tensor_item(w, i);
        s += v;
        s2 += v * v;
    }
    CHECK(fabs(s / 20000) < 0.05);
    CHECK(fabs(sqrt(s2 / 20000) - 1) < 0.05);
    ts_module_free(m);
}

static void test_linear_relu_sequential_forward(void) {
    ts_module *seq = NULL, *fc1 = NULL, *relu = NULL, *fc2 = NULL, *empty = NULL;
    CHECK_OK(ts_nn_linear_new(3, 2, true, NULL, &fc1));
    CHECK_OK(ts_nn_relu_new(&relu));
    CHECK_OK(ts_nn_linear_new(2, 1, true, NULL, &fc2));
    set_values(fc1, "weight", (float[]){1, 2, 3, -1, 0, 1}, 6);
    set_values(fc1, "bias", (float[]){0.5f, -2}, 2);
    set_values(fc2, "weight", (float[]){1, -1}, 2);
    set_values(fc2, "bias", (float[]){0.25f}, 1);
    ts_tensor *x = tu_tensor(2, (int64_t[]){2, 3}, (float[]){1, 1, 1, 2, 0, -1});
    ts_tensor *y = NULL;
    CHECK_OK(ts_module_forward(fc1, x, &y));
    /* [1 2 3; -1 0 1] x + b: row 0: 6.5, -2; row 1: -0.5, -5 */
    CHECK(tu_max_abs_diff(y, (float[]){6.5f, -2, -0.5f, -5}) < 1e-6);
    ts_tensor *z = NULL;
    CHECK_OK(ts_module_forward(relu, y, &z));
    CHECK(tu_max_abs_diff(z, (float[]){6.5f, 0, 0, 0}) < 1e-6);
    ts_tensor_release(y);
    ts_tensor_release(z);

    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_sequential_add(seq, "fc1", fc1));
    CHECK_OK(ts_nn_sequential_add(seq, NULL, relu)); /* named "1" */
    CHECK_OK(ts_nn_sequential_add(seq, "fc2", fc2));
    CHECK_OK(ts_module_forward(seq, x, &y));
    CHECK(ts_tensor_ndim(y) == 2 && ts_tensor_dim(y, 0) == 2 && ts_tensor_dim(y, 1) == 1);
    CHECK(tu_max_abs_diff(y, (float[]){6.75f, 0.25f}) < 1e-6);
    /* backward reaches every parameter: d(sum y)/d fc2.weight = sum of relu outputs = [6.5, 0] */
    ts_tensor *s = NULL;
    CHECK_OK(ts_sum(y, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor *g = ts_tensor_grad(find_tensor(seq, "fc2.weight"));
    CHECK(g && tu_max_abs_diff(g, (float[]){6.5f, 0}) < 1e-6);
    /* fc1.weight grad: row 0 = fc2.w[0] * (sum of x rows where unit 0 active) = x row 0; row 1 = 0 */
    g = ts_tensor_grad(find_tensor(seq, "fc1.weight"));
    CHECK(g && tu_max_abs_diff(g, (float[]){1, 1, 1, 0, 0, 0}) < 1e-6);
    ts_module_zero_grad(seq);
    CHECK(ts_tensor_grad(find_tensor(seq, "fc1.weight")) == NULL);
    ts_tensor_release(s);
    ts_tensor_release(y);

    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(seq, &l));
    CHECK(l.n == 4 && strcmp(l.names[0], "fc1.weight") == 0 && strcmp(l.names[3], "fc2.bias") == 0);
    ts_tensor_list_clear(&l);

    /* add errors: the child is freed (ASan checks for leaks) */
    ts_module *c = NULL;
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_STATUS(ts_nn_sequential_add(seq, "fc1", c), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("fc1");
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_STATUS(ts_nn_sequential_add(seq, "a.b", c), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_nn_sequential_add(seq, NULL, NULL), TS_ERR_INVALID_ARG);
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_STATUS(ts_nn_sequential_add(c, NULL, NULL), TS_ERR_INVALID_ARG); /* not a Sequential */
    ts_module_free(c);
    CHECK(ts_nn_sequential_len(seq) == 3);

    /* an empty Sequential is the identity */
    CHECK_OK(ts_nn_sequential_new(&empty));
    CHECK_OK(ts_module_forward(empty, x, &y));
    CHECK(tu_max_abs_diff(y, (float[]){1, 1, 1, 2, 0, -1}) == 0);
    ts_tensor_release(y);
    ts_module_free(empty);
    /* a forward error names the child */
    ts_tensor *bad = tu_tensor(2, (int64_t[]){2, 4}, (float[]){0, 0, 0, 0, 0, 0, 0, 0});
    y = NULL;
    CHECK_STATUS(ts_module_forward(seq, bad, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("fc1");
    CHECK(y == NULL);
    ts_tensor_release(bad);
    ts_tensor_release(x);
    ts_module_free(seq);
}

/* mean((pred - target)^2), from ops that exist today */
static ts_status mse(ts_tensor *pred, ts_tensor *target, ts_tensor **out) {
    ts_tensor *d = NULL, *d2 = NULL;
    ts_status st = ts_sub(pred, target, &d);
    if (st == TS_OK) st = ts_mul(d, d, &d2);
    if (st == TS_OK) st = ts_mean(d2, out);
    ts_tensor_release(d);
    ts_tensor_release(d2);
    return st;
}

static void test_mlp_training(void) {
    ts_rng r;
    ts_rng_seed(&r, 4);
    ts_module *m = NULL, *c = NULL;
    CHECK_OK(ts_nn_sequential_new(&m));
    CHECK_OK(ts_nn_linear_new(4, 16, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(m, NULL, c));
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_OK(ts_nn_sequential_add(m, NULL, c));
    CHECK_OK(ts_nn_linear_new(16, 1, true, &r, &c));
    CHECK_OK(ts_nn_sequential_add(m, NULL, c));
    /* y = x0 - 2 x1 + 0.5 x2 x3 */
    float xs[32 * 4], ys[32];
    for (int i = 0; i < 32; i++) {
        for (int j = 0; j < 4; j++) xs[i * 4 + j] = (float)(ts_rng_uniform(&r) * 2 - 1);
        ys[i] = xs[i * 4] - 2 * xs[i * 4 + 1] + 0.5f * xs[i * 4 + 2] * xs[i * 4 + 3];
    }
    ts_tensor *x = tu_tensor(2, (int64_t[]){32, 4}, xs), *y = tu_tensor(2, (int64_t[]){32, 1}, ys);
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(m, &params));
    ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
    cfg.lr = 0.05f;
    cfg.momentum = 0.9f;
    ts_optimizer *opt = NULL;
    CHECK_OK(ts_optim_sgd_new(&params, &cfg, &opt));
    double first = 0, last = 0;
    for (int it = 0; it < 40 && opt; it++) {
        ts_tensor *pred = NULL, *loss = NULL;
        CHECK_OK(ts_module_forward(m, x, &pred));
        CHECK_OK(mse(pred, y, &loss));
        double l = ts_tensor_item(loss, 0);
        if (it == 0) first = l;
        last = l;
        ts_optimizer_zero_grad(opt);
        CHECK_OK(ts_backward(loss, NULL, false));
        CHECK_OK(ts_optimizer_step(opt));
        ts_tensor_release(pred);
        ts_tensor_release(loss);
    }
    CHECK(last < 0.3 * first);
    if (!(last < 0.3 * first)) fprintf(stderr, "loss %g -> %g\n", first, last);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_module_free(m);
}

static void test_module_to(void) {
    ts_module *m = NULL;
    CHECK_OK(ts_model_reference_cnn(NULL, &m));
    ts_tensor *w = find_tensor(m, "11.weight");
    ts_tensor *g = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 2, (int64_t[]){10, 128}, &g));
    ts_tensor_set_grad(w, g);
    ts_tensor_release(g);
    CHECK_OK(ts_module_to(m, ts_device_cpu())); /* already there: the same tensors */
    CHECK(find_tensor(m, "11.weight") == w);
    CHECK(ts_tensor_grad(w) != NULL);
    CHECK(ts_tensor_is_leaf(w) && ts_tensor_requires_grad(w));
    CHECK(ts_tensor_device(find_tensor(m, "1.num_batches_tracked")) == ts_device_cpu());
    CHECK_STATUS(ts_module_to(m, NULL), TS_ERR_INVALID_ARG);
    ts_module_free(m);
}

/* The module forward equals the same ops called by hand on the module's tensors. */
static void test_cnn_forward_backward(void) {
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_module *m = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &m));
    int64_t xs[4] = {2, 1, 28, 28};
    ts_tensor *x = tu_rand(&r, 4, xs, -1, 1, false), *y = NULL, *ye = NULL, *ye2 = NULL, *loss = NULL;
    ts_status st = ts_module_forward(m, x, &y);
    if (skip_unsupported(st, "reference CNN forward/backward")) goto out;
    CHECK_OK(st);
    if (st != TS_OK) goto out;
    CHECK(ts_tensor_ndim(y) == 2 && ts_tensor_dim(y, 0) == 2 && ts_tensor_dim(y, 1) == 10);
    CHECK(ts_tensor_item(find_tensor(m, "1.num_batches_tracked"), 0) == 1);
    CHECK(ts_tensor_item(find_tensor(m, "5.num_batches_tracked"), 0) == 1);
    {
        /* running stats moved from (0, 1) */
        ts_tensor *rm = find_tensor(m, "1.running_mean");
        double moved = 0;
        for (int i = 0; i < 32; i++) moved += fabs(ts_tensor_item(rm, i));
        CHECK(moved > 0);
    }
    {
        ts_tensor *sq = NULL;
        CHECK_OK(ts_mul(y, y, &sq));
        CHECK_OK(ts_mean(sq, &loss));
        ts_tensor_release(sq);
        CHECK_OK(ts_backward(loss, NULL, false));
        ts_tensor_list p = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_module_parameters(m, &p));
        for (int i = 0; i < p.n; i++) {
            ts_tensor *g = ts_tensor_grad(p.tensors[i]);
            CHECK(g != NULL);
            if (g) {
                CHECK(ts_tensor_numel(g) == ts_tensor_numel(p.tensors[i]));
                double n = 0;
                for (int64_t k = 0; k < ts_tensor_numel(g); k++) n += fabs(ts_tensor_item(g, k));
                if (!(n > 0)) fprintf(stderr, "zero gradient for %s\n", p.names[i]);
                CHECK(n > 0);
            }
        }
        ts_tensor_list_clear(&p);
    }
    /* eval: deterministic, no running-stat updates, equal to the ops by hand */
    ts_module_train(m, false);
    CHECK_OK(ts_module_forward(m, x, &ye));
    CHECK_OK(ts_module_forward(m, x, &ye2));
    CHECK(ts_tensor_item(find_tensor(m, "1.num_batches_tracked"), 0) == 1);
    if (ye && ye2) CHECK(tu_max_abs_diff(ye, ts_tensor_data_f32(ye2)) == 0);
    {
        bool prev = ts_grad_set_enabled(false);
        ts_conv2d_params cp = TS_CONV2D_DEFAULT;
        cp.padding[0] = cp.padding[1] = 1;
        ts_pool2d_params pp = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
        ts_tensor *h = ts_tensor_retain(x), *t = NULL;
#define STEP(call)              \
    do {                        \
        CHECK_OK(call);         \
        ts_tensor_release(h);   \
        h = t;                  \
        t = NULL;               \
    } while (0)
        const char *convs[2] = {"0", "4"}, *bns[2] = {"1", "5"};
        char a[64], b[64], c[64], d[64], e[64], f[64];
        for (int blk = 0; blk < 2 && h; blk++) {
            snprintf(a, sizeof a, "%s.weight", convs[blk]);
            snprintf(b, sizeof b, "%s.bias", convs[blk]);
            snprintf(c, sizeof c, "%s.weight", bns[blk]);
            snprintf(d, sizeof d, "%s.bias", bns[blk]);
            snprintf(e, sizeof e, "%s.running_mean", bns[blk]);
            snprintf(f, sizeof f, "%s.running_var", bns[blk]);
            STEP(ts_conv2d(h, find_tensor(m, a), find_tensor(m, b), cp, &t));
            if (!h) break;
            STEP(ts_batchnorm2d(h, find_tensor(m, c), find_tensor(m, d), find_tensor(m, e), find_tensor(m, f), false,
                                0.1f, 1e-5f, &t));
            if (!h) break;
            STEP(ts_relu(h, &t));
            STEP(ts_maxpool2d(h, pp, &t));
        }
        if (h) STEP(ts_flatten(h, 1, &t));
        if (h) STEP(ts_linear(h, find_tensor(m, "9.weight"), find_tensor(m, "9.bias"), &t));
        if (h) STEP(ts_relu(h, &t));
        if (h) STEP(ts_linear(h, find_tensor(m, "11.weight"), find_tensor(m, "11.bias"), &t));
#undef STEP
        if (h && ye) CHECK(tu_max_abs_diff(h, ts_tensor_data_f32(ye)) < 1e-5);
        ts_tensor_release(h);
        ts_grad_set_enabled(prev);
    }
out:
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(ye);
    ts_tensor_release(ye2);
    ts_tensor_release(loss);
    ts_module_free(m);
}

static void test_residual_block(void) {
    ts_rng r;
    ts_rng_seed(&r, 6);
    ts_module *b = NULL, *id = NULL;
    CHECK_OK(ts_nn_residual_block_new(16, 32, 2, &r, &b));
    static const want_entry w[] = {
        {"conv1.weight", 4, {32, 16, 3, 3}, F},       {"bn1.weight", 1, {32}, F},
        {"bn1.bias", 1, {32}, F},                     {"bn1.running_mean", 1, {32}, F},
        {"bn1.running_var", 1, {32}, F},              {"bn1.num_batches_tracked", 0, {0}, I},
        {"conv2.weight", 4, {32, 32, 3, 3}, F},       {"bn2.weight", 1, {32}, F},
        {"bn2.bias", 1, {32}, F},                     {"bn2.running_mean", 1, {32}, F},
        {"bn2.running_var", 1, {32}, F},              {"bn2.num_batches_tracked", 0, {0}, I},
        {"downsample.0.weight", 4, {32, 16, 1, 1}, F}, {"downsample.1.weight", 1, {32}, F},
        {"downsample.1.bias", 1, {32}, F},            {"downsample.1.running_mean", 1, {32}, F},
        {"downsample.1.running_var", 1, {32}, F},     {"downsample.1.num_batches_tracked", 0, {0}, I},
    };
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(b, &l));
    check_list(&l, w, (int)(sizeof w / sizeof w[0]));
    ts_tensor_list_clear(&l);
    CHECK_OK(ts_nn_residual_block_new(16, 16, 1, &r, &id));
    CHECK_OK(ts_module_state_dict(id, &l));
    CHECK(l.n == 12); /* no downsample */
    CHECK(ts_module_child(id, "downsample") == NULL);
    ts_tensor_list_clear(&l);

    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 16, 8, 8}, -1, 1, false), *y = NULL, *y2 = NULL;
    ts_status st = ts_module_forward(b, x, &y);
    if (!skip_unsupported(st, "ResidualBlock forward")) {
        CHECK_OK(st);
        if (y) {
            CHECK(ts_tensor_ndim(y) == 4 && ts_tensor_dim(y, 1) == 32 && ts_tensor_dim(y, 2) == 4 &&
                  ts_tensor_dim(y, 3) == 4);
            double mn = 0;
            for (int64_t i = 0; i < ts_tensor_numel(y); i++) mn = fmin(mn, ts_tensor_item(y, i));
            CHECK(mn >= 0); /* ends with ReLU */
        }
        CHECK_OK(ts_module_forward(id, x, &y2));
        if (y2) CHECK(ts_tensor_dim(y2, 1) == 16 && ts_tensor_dim(y2, 2) == 8);
        /* a zero block (all BN weights 0) is relu(identity) */
        ts_module_train(id, false);
        ts_tensor_fill_(find_tensor(id, "bn2.weight"), 0.0f);
        ts_tensor_release(y2);
        y2 = NULL;
        CHECK_OK(ts_module_forward(id, x, &y2));
        if (y2) {
            double err = 0;
            for (int64_t i = 0; i < ts_tensor_numel(x); i++)
                err = fmax(err, fabs(ts_tensor_item(y2, i) - fmax(0, ts_tensor_item(x, i))));
            CHECK(err < 1e-6);
        }
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(y2);
    ts_module_free(b);
    ts_module_free(id);
}

static void test_small_layers(void) {
    ts_tensor *x = tu_tensor(4, (int64_t[]){1, 1, 2, 2}, (float[]){1, 2, 3, 4}), *y = NULL;
    ts_module *m = NULL;
    ts_pool2d_params pp = {{2, 2}, {0, 0}, {0, 0}, {0, 0}, false, false};
    CHECK_OK(ts_nn_maxpool2d_new(pp, &m));
    ts_status st = ts_module_forward(m, x, &y);
    if (!skip_unsupported(st, "MaxPool2d module")) {
        CHECK_OK(st);
        if (y) CHECK(ts_tensor_numel(y) == 1 && ts_tensor_item(y, 0) == 4);
    }
    ts_tensor_release(y);
    y = NULL;
    ts_module_free(m);
    CHECK_OK(ts_nn_avgpool2d_new(pp, &m));
    st = ts_module_forward(m, x, &y);
    if (!skip_unsupported(st, "AvgPool2d module")) {
        CHECK_OK(st);
        if (y) CHECK(ts_tensor_numel(y) == 1 && ts_tensor_item(y, 0) == 2.5);
    }
    ts_tensor_release(y);
    y = NULL;
    ts_module_free(m);
    CHECK_OK(ts_nn_global_avgpool2d_new(&m));
    CHECK(strcmp(ts_module_type_name(m), "AdaptiveAvgPool2d") == 0);
    st = ts_module_forward(m, x, &y);
    if (!skip_unsupported(st, "GlobalAvgPool2d module")) {
        CHECK_OK(st);
        if (y) CHECK(ts_tensor_ndim(y) == 4 && ts_tensor_numel(y) == 1 && ts_tensor_item(y, 0) == 2.5);
    }
    ts_tensor_release(y);
    y = NULL;
    ts_module_free(m);
    CHECK_OK(ts_nn_flatten_new(&m));
    st = ts_module_forward(m, x, &y);
    if (!skip_unsupported(st, "Flatten module")) {
        CHECK_OK(st);
        if (y) CHECK(ts_tensor_ndim(y) == 2 && ts_tensor_dim(y, 0) == 1 && ts_tensor_dim(y, 1) == 4);
    }
    ts_tensor_release(y);
    y = NULL;
    ts_module_free(m);

    /* Dropout: identity in eval mode, and for p = 0 */
    ts_rng r;
    ts_rng_seed(&r, 7);
    CHECK_STATUS(ts_nn_dropout_new(1.0f, &r, &m), TS_ERR_INVALID_ARG);
    CHECK_OK(ts_nn_dropout_new(0.5f, &r, &m));
    ts_module_train(m, false);
    CHECK_OK(ts_module_forward(m, x, &y));
    if (y) CHECK(tu_max_abs_diff(y, (float[]){1, 2, 3, 4}) == 0);
    ts_tensor_release(y);
    y = NULL;
    ts_module_train(m, true);
    ts_tensor *big = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){10000}, 1.0f, &big));
    st = ts_module_forward(m, big, &y);
    if (!skip_unsupported(st, "Dropout module (training)")) {
        CHECK_OK(st);
        if (y) {
            int zeros = 0;
            bool ok = true;
            for (int64_t i = 0; i < 10000; i++) {
                double v = ts_tensor_item(y, i);
                zeros += v == 0;
                ok &= v == 0 || fabs(v - 2) < 1e-6;
            }
            CHECK(ok);
            CHECK(zeros > 4500 && zeros < 5500);
        }
    }
    ts_tensor_release(y);
    y = NULL;
    ts_tensor_release(big);
    ts_module_free(m);

    /* Embedding: rows of the weight */
    CHECK_OK(ts_nn_embedding_new(5, 3, &r, &m));
    ts_tensor *idx = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 2, (int64_t[]){2, 2}, (int64_t[]){4, 0, 2, 4}, &idx));
    st = ts_module_forward(m, idx, &y);
    if (!skip_unsupported(st, "Embedding module")) {
        CHECK_OK(st);
        if (y) {
            CHECK(ts_tensor_ndim(y) == 3 && ts_tensor_dim(y, 2) == 3);
            ts_tensor *w = find_tensor(m, "weight");
            int64_t rows[4] = {4, 0, 2, 4};
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 3; j++) CHECK(ts_tensor_item(y, i * 3 + j) == ts_tensor_item(w, rows[i] * 3 + j));
        }
    }
    ts_tensor_release(y);
    ts_tensor_release(idx);
    ts_module_free(m);

    /* MLP model end to end: (3, 1, 28, 28) -> (3, 10) */
    CHECK_OK(ts_model_mlp(&r, &m));
    ts_tensor *img = tu_rand(&r, 4, (int64_t[]){3, 1, 28, 28}, 0, 1, false);
    y = NULL;
    st = ts_module_forward(m, img, &y);
    if (!skip_unsupported(st, "MLP model forward")) {
        CHECK_OK(st);
        if (y) CHECK(ts_tensor_ndim(y) == 2 && ts_tensor_dim(y, 0) == 3 && ts_tensor_dim(y, 1) == 10);
    }
    ts_tensor_release(y);
    ts_tensor_release(img);
    ts_tensor_release(x);
    ts_module_free(m);
}

/* BatchNorm2d running statistics: momentum and PyTorch's momentum=None (cumulative average). */
static void test_batchnorm_running_stats(void) {
    ts_module *m = NULL;
    CHECK_OK(ts_nn_batchnorm2d_new(1, 1e-5f, -1.0f, true, true, &m)); /* momentum None */
    ts_tensor *x1 = tu_tensor(4, (int64_t[]){2, 1, 1, 2}, (float[]){1, 2, 3, 4});     /* mean 2.5 */
    ts_tensor *x2 = tu_tensor(4, (int64_t[]){2, 1, 1, 2}, (float[]){-1, -1, -1, -1}); /* mean -1 */
    ts_tensor *y = NULL;
    ts_status st = ts_module_forward(m, x1, &y);
    if (!skip_unsupported(st, "BatchNorm2d running stats")) {
        CHECK_OK(st);
        ts_tensor_release(y);
        y = NULL;
        CHECK_OK(ts_module_forward(m, x2, &y));
        CHECK(ts_tensor_item(find_tensor(m, "num_batches_tracked"), 0) == 2);
        /* cumulative average of the batch means: (2.5 + -1) / 2 */
        CHECK_NEAR(ts_tensor_item(find_tensor(m, "running_mean"), 0), 0.75, 1e-6);
        /* unbiased variances 5/3 and 0; running starts at 1 with factor 1 at the first batch */
        CHECK_NEAR(ts_tensor_item(find_tensor(m, "running_var"), 0), (5.0 / 3.0) / 2, 1e-5);
    }
    ts_tensor_release(y);
    ts_tensor_release(x1);
    ts_tensor_release(x2);
    ts_module_free(m);
}

/* Sequential runs a ReLU followed by a MaxPool2d as the pool, then the ReLU (nn/containers.c): the output and
 * the input's gradient equal the ops in the written order bit for bit — windows all negative, zeros, ties,
 * padding — for a 2x2 pool and a padded, overlapping 3x3 one. */
static void test_relu_pool_order(void) {
    ts_pool2d_params ps[2] = {{{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false}, {{3, 3}, {2, 2}, {1, 1}, {1, 1}, true, false}};
    int64_t xs[4] = {2, 3, 7, 7}, n = 2 * 3 * 7 * 7;
    float *xv = malloc(sizeof(float) * (size_t)n), *gv = malloc(sizeof(float) * (size_t)n);
    ts_rng r;
    ts_rng_seed(&r, 8);
    for (int64_t i = 0; i < n; i++) xv[i] = (float)((int)ts_rng_below(&r, 7) - 4) * 0.5f; /* -2 .. 1: ties, zeros */
    for (int k = 0; k < 2; k++) {
        ts_tensor *x[2], *y[2];
        ts_module *seq = NULL, *relu = NULL, *pool = NULL;
        CHECK_OK(ts_nn_sequential_new(&seq));
        CHECK_OK(ts_nn_relu_new(&relu));
        CHECK_OK(ts_nn_maxpool2d_new(ps[k], &pool));
        CHECK_OK(ts_nn_sequential_add(seq, "relu", relu));
        CHECK_OK(ts_nn_sequential_add(seq, "pool", pool));
        for (int v = 0; v < 2; v++) {
            CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_F32, 4, xs, xv, &x[v]));
            ts_tensor_set_requires_grad(x[v], true);
        }
        CHECK_OK(ts_module_forward(seq, x[0], &y[0]));
        ts_tensor *h = NULL;
        CHECK_OK(ts_relu(x[1], &h));
        CHECK_OK(ts_maxpool2d(h, ps[k], &y[1]));
        ts_tensor_release(h);
        int64_t ny = ts_tensor_numel(y[0]);
        for (int64_t i = 0; i < ny; i++) gv[i] = (float)(i % 5) - 2.0f;
        ts_tensor *gy = tu_tensor(ts_tensor_ndim(y[0]), ts_tensor_shape(y[0]), gv);
        for (int v = 0; v < 2; v++) CHECK_OK(ts_backward(y[v], gy, false));
        CHECK(ts_tensor_numel(y[1]) == ny);
        CHECK(!memcmp(ts_tensor_data_f32(y[0]), ts_tensor_data_f32(y[1]), sizeof(float) * (size_t)ny));
        ts_tensor *g0 = ts_tensor_grad(x[0]), *g1 = ts_tensor_grad(x[1]);
        CHECK(g0 && g1 && !memcmp(ts_tensor_data_f32(g0), ts_tensor_data_f32(g1), sizeof(float) * (size_t)n));
        ts_tensor_release(gy);
        for (int v = 0; v < 2; v++) {
            ts_tensor_release(x[v]);
            ts_tensor_release(y[v]);
        }
        ts_module_free(seq);
    }
    free(xv);
    free(gv);
}

TU_MAIN(T(test_cnn_state_dict_names), T(test_model_by_name), T(test_load_state_dict), T(test_train_eval),
        T(test_init), T(test_linear_relu_sequential_forward), T(test_mlp_training), T(test_module_to),
        T(test_cnn_forward_backward), T(test_residual_block), T(test_small_layers),
        T(test_batchnorm_running_stats), T(test_relu_pool_order))
