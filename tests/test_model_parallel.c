/* Model parallelism in depth over virtual CPU devices: the ToDevice module,
 * seed 001's "embedding on the CPU, the rest on another device", and
 * ModelParallel (stages of a Sequential on different devices, split by
 * parameter count or by explicit bounds). Loss, gradients and BatchNorm
 * running statistics equal one device's (max abs difference <= 1e-5; printed),
 * for the reference CNN and the MLP at uneven batch sizes; errors name what is
 * wrong. */
#include "test_util.h"

#define NDEV 3
#define TOL 1e-5
#define TS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static ts_device *D[NDEV];

static ts_device *dev(const char *name) {
    ts_device *d = NULL;
    CHECK_OK(ts_device_get(name, &d));
    return d;
}

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
    int64_t v[64];
    for (int64_t i = 0; i < n; i++) v[i] = (int64_t)ts_rng_below(r, 10);
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &n, v, &t));
    return t;
}

static ts_module *model(const char *name, uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *m = NULL;
    CHECK_OK(ts_model_by_name(name, &r, &m));
    return m;
}

static void test_to_device_module(void) {
    ts_module *td = NULL;
    CHECK_OK(ts_nn_to_device_new(D[1], &td));
    CHECK(strcmp(ts_module_type_name(td), "ToDevice") == 0 && ts_module_num_parameters(td) == 0);
    ts_tensor *x = tu_tensor(1, (int64_t[]){3}, (float[]){1, -2, 3}), *y = NULL, *sq = NULL, *s = NULL;
    ts_tensor_set_requires_grad(x, true);
    CHECK_OK(ts_module_forward(td, x, &y));
    CHECK(y && ts_tensor_device(y) == D[1]);
    CHECK_OK(ts_mul(y, y, &sq));
    CHECK_OK(ts_sum(sq, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor *g = ts_tensor_grad(x);
    CHECK(g && ts_tensor_device(g) == ts_device_cpu());
    CHECK(g && ts_tensor_item(g, 1) == -4.0);
    ts_tensor *y2 = NULL; /* already there: the tensor itself */
    CHECK_OK(ts_module_forward(td, y, &y2));
    CHECK(y2 == y);
    ts_tensor *objs[] = {x, y, y2, sq, s};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_module_free(td);
    CHECK_STATUS(ts_nn_to_device_new(NULL, &td), TS_ERR_INVALID_ARG);
}

/* Seed 001: the embedding computed on the CPU, the rest on another device. */
static void test_seed001_embedding_on_cpu(void) {
    ts_rng r;
    ts_module *emb = NULL, *rnn = NULL, *seq = NULL, *to = NULL;
    ts_rng_seed(&r, 21);
    CHECK_OK(ts_nn_embedding_new(1000, 10, &r, &emb));
    CHECK_OK(ts_nn_linear_new(10, 10, true, &r, &rnn));
    CHECK_OK(ts_module_to(rnn, D[0])); /* nn.Linear(10, 10).cuda(0) */
    CHECK_OK(ts_nn_to_device_new(D[0], &to));
    CHECK_OK(ts_nn_sequential_new(&seq));
    CHECK_OK(ts_nn_sequential_add(seq, "embedding", emb));
    CHECK_OK(ts_nn_sequential_add(seq, "to", to));
    CHECK_OK(ts_nn_sequential_add(seq, "rnn", rnn));
    /* the same model, all on the CPU */
    ts_module *e2 = NULL, *r2 = NULL;
    ts_rng_seed(&r, 21);
    CHECK_OK(ts_nn_embedding_new(1000, 10, &r, &e2));
    CHECK_OK(ts_nn_linear_new(10, 10, true, &r, &r2));
    int64_t idx[6] = {3, 999, 0, 3, 42, 7};
    ts_tensor *x = NULL, *y = NULL, *h = NULL, *yr = NULL, *s = NULL, *sr = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, (int64_t[]){6}, idx, &x));
    CHECK_OK(ts_module_forward(seq, x, &y));
    CHECK(y && ts_tensor_device(y) == D[0] && ts_tensor_ndim(y) == 2);
    CHECK_OK(ts_module_forward(e2, x, &h));
    CHECK_OK(ts_module_forward(r2, h, &yr));
    CHECK(max_diff(y, yr) <= 1e-6);
    CHECK_OK(ts_mean(y, &s));
    CHECK_OK(ts_mean(yr, &sr));
    CHECK_OK(ts_backward(s, NULL, false));
    CHECK_OK(ts_backward(sr, NULL, false));
    ts_tensor_list a = TS_TENSOR_LIST_INIT, b = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(seq, &a)); /* embedding.weight (cpu), rnn.weight, rnn.bias (cpu:0) */
    CHECK_OK(ts_module_parameters(e2, &b));
    CHECK_OK(ts_module_parameters(r2, &b));
    CHECK(a.n == 3 && b.n == 3);
    CHECK(ts_tensor_device(ts_tensor_grad(a.tensors[0])) == ts_device_cpu());
    CHECK(ts_tensor_device(ts_tensor_grad(a.tensors[1])) == D[0]);
    for (int i = 0; i < a.n && i < b.n; i++)
        CHECK(max_diff(ts_tensor_grad(a.tensors[i]), ts_tensor_grad(b.tensors[i])) <= 1e-6);
    ts_tensor_list_clear(&a);
    ts_tensor_list_clear(&b);
    ts_tensor *objs[] = {x, y, h, yr, s, sr};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_module_free(seq);
    ts_module_free(e2);
    ts_module_free(r2);
}

/* One training step of `name` through ModelParallel over ndev devices vs on "cpu". */
static void equivalence_case(const char *name, int64_t b, int ndev, const int *bounds, const int *want_bounds) {
    ts_rng r;
    ts_rng_seed(&r, 200 + (uint64_t)b);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){b, 1, 28, 28}, 0, 1, false), *y = labels(&r, b);
    ts_module *ref = model(name, 5), *m = model(name, 5), *mp = NULL;
    CHECK_OK(ts_nn_model_parallel_new(m, D, ndev, bounds, ts_device_cpu(), &mp));
    if (!mp) return;
    int got[NDEV] = {0};
    CHECK(ts_model_parallel_bounds(mp, got, NDEV) == ndev);
    for (int i = 0; want_bounds && i < ndev; i++) CHECK(got[i] == want_bounds[i]);
    ts_tensor *lr = NULL, *lp = NULL, *o1 = NULL, *o2 = NULL;
    CHECK_OK(ts_module_forward(ref, x, &o1));
    CHECK_OK(ts_module_forward(mp, x, &o2));
    CHECK(o2 && ts_tensor_device(o2) == ts_device_cpu());
    CHECK_OK(ts_cross_entropy(o1, y, 0.0f, &lr));
    CHECK_OK(ts_cross_entropy(o2, y, 0.0f, &lp));
    CHECK_OK(ts_backward(lr, NULL, false));
    CHECK_OK(ts_backward(lp, NULL, false));
    ts_tensor_list sr = TS_TENSOR_LIST_INIT, sp = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(ref, &sr));
    CHECK_OK(ts_module_state_dict(mp, &sp));
    CHECK(sr.n == sp.n);
    double gd = 0, bd = 0;
    for (int i = 0; i < sr.n && i < sp.n; i++) {
        char want[256];
        snprintf(want, sizeof want, "module.%s", sr.names[i]);
        CHECK(strcmp(sp.names[i], want) == 0);
        if (ts_tensor_dtype(sr.tensors[i]) != TS_F32) continue;
        bd = fmax(bd, max_diff(sr.tensors[i], sp.tensors[i])); /* parameters and running stats */
    }
    ts_tensor_list pr = TS_TENSOR_LIST_INIT, pp = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(ref, &pr));
    CHECK_OK(ts_module_parameters(mp, &pp));
    for (int i = 0; i < pr.n && i < pp.n; i++) {
        ts_tensor *g = ts_tensor_grad(pp.tensors[i]);
        CHECK(g && ts_tensor_device(g) == ts_tensor_device(pp.tensors[i]));
        gd = fmax(gd, max_diff(ts_tensor_grad(pr.tensors[i]), g));
    }
    double ld = fabs(ts_tensor_item(lr, 0) - ts_tensor_item(lp, 0));
    printf("  %s batch %2lld over %d stages: |loss diff| %.2e, max |grad diff| %.2e, state %.2e\n", name, (long long)b,
           ndev, ld, gd, bd);
    CHECK(ld <= TOL && gd <= TOL && bd <= TOL);
    ts_tensor_list_clear(&sr);
    ts_tensor_list_clear(&sp);
    ts_tensor_list_clear(&pr);
    ts_tensor_list_clear(&pp);
    ts_tensor *objs[] = {x, y, lr, lp, o1, o2};
    for (size_t i = 0; i < TS_ARRAY_LEN(objs); i++) ts_tensor_release(objs[i]);
    ts_module_free(mp);
    ts_module_free(ref);
}

static void test_model_parallel_cnn(void) {
    /* by parameter count: conv/bn/pool stages (19008 parameters) | linear-relu-linear (402826) */
    const int want2[2] = {9, 12};
    equivalence_case("cnn", 10, 2, NULL, want2);
    equivalence_case("cnn", 3, 2, NULL, want2);
    equivalence_case("cnn", 1, 2, NULL, want2);
    const int b3[3] = {4, 8, 12};
    equivalence_case("cnn", 7, 3, b3, b3);
    /* placement follows the stages */
    ts_module *mp = NULL;
    CHECK_OK(ts_nn_model_parallel_new(model("cnn", 1), D, 2, NULL, NULL, &mp));
    ts_tensor_list p = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(mp, &p));
    CHECK(strcmp(p.names[0], "module.0.weight") == 0 && ts_tensor_device(p.tensors[0]) == D[0]);
    CHECK(strcmp(p.names[p.n - 1], "module.11.bias") == 0 && ts_tensor_device(p.tensors[p.n - 1]) == D[1]);
    ts_tensor_list_clear(&p);
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 1, 28, 28}, 0, 1, false), *y = NULL;
    CHECK_OK(ts_module_forward(mp, x, &y));
    CHECK(y && ts_tensor_device(y) == D[1]); /* output_device NULL: the last stage's */
    ts_tensor_release(y);
    ts_tensor_release(x);
    ts_module_free(mp);
}

static void test_model_parallel_mlp(void) {
    const int b3[3] = {1, 3, 4};
    equivalence_case("mlp", 5, 3, b3, b3);
    const int want[3] = {2, 3, 4}; /* flatten, linear(784->256) | relu | linear(256->10): ties go to later bounds */
    equivalence_case("mlp", 4, 3, NULL, want);
}

static void test_errors(void) {
    ts_module *mp = NULL, *lin = NULL;
    CHECK_OK(ts_nn_linear_new(2, 2, true, NULL, &lin));
    CHECK_STATUS(ts_nn_model_parallel_new(lin, D, 2, NULL, NULL, &mp), TS_ERR_INVALID_ARG); /* frees lin */
    CHECK_ERR_MENTIONS("must be a Sequential, got a Linear");
    ts_device *many[5] = {D[0], D[1], D[2], D[0], D[1]};
    CHECK_STATUS(ts_nn_model_parallel_new(model("mlp", 1), many, 5, NULL, NULL, &mp), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("4 children over 5 devices");
    const int bad1[2] = {2, 2}, bad2[2] = {1, 3}, bad3[2] = {0, 4};
    CHECK_STATUS(ts_nn_model_parallel_new(model("mlp", 1), D, 2, bad1, NULL, &mp), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("bounds[1] = 2");
    CHECK_STATUS(ts_nn_model_parallel_new(model("mlp", 1), D, 2, bad2, NULL, &mp), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("must end at");
    CHECK_STATUS(ts_nn_model_parallel_new(model("mlp", 1), D, 2, bad3, NULL, &mp), TS_ERR_INVALID_ARG);
    ts_device *nul[2] = {D[0], NULL};
    CHECK_STATUS(ts_nn_model_parallel_new(model("mlp", 1), nul, 2, NULL, NULL, &mp), TS_ERR_INVALID_ARG);
    CHECK(mp == NULL);
    ts_module *seq = model("mlp", 1);
    CHECK(ts_model_parallel_bounds(seq, NULL, 0) == -1);
    /* a failing stage names itself */
    CHECK_OK(ts_nn_model_parallel_new(seq, D, 2, NULL, NULL, &mp));
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 2, (int64_t[]){2, 5}, &x));
    CHECK_STATUS(ts_module_forward(mp, x, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("ModelParallel stage 0 (cpu:0): '1' (Linear)");
    ts_tensor_release(x);
    ts_module_free(mp);
}

int main(int argc, char **argv) {
    const char *e = getenv("TS_CPU_DEVICES");
    if (ts_set_cpu_device_count(e && atoi(e) >= NDEV ? atoi(e) : NDEV) != TS_OK) {
        fprintf(stderr, "ts_set_cpu_device_count: %s\n", ts_last_error());
        return 1;
    }
    D[0] = dev("cpu:0");
    D[1] = dev("cpu:1");
    D[2] = dev("cpu:2");
    static const tu_test tests[] = {T(test_to_device_module), T(test_seed001_embedding_on_cpu),
                                    T(test_model_parallel_cnn), T(test_model_parallel_mlp), T(test_errors)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
