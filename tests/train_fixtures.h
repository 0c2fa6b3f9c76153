/*
 * tests/train_fixtures.h — the small learnable problem the training tests share
 * (tests/test_train.c, tests/test_accum.c): samples (N, 1, 4, 4) whose label is the
 * largest of their first C values, and an MLP that works under every strategy.
 * Header-only; include test_util.h first.
 */
#ifndef TS_TEST_TRAIN_FIXTURES_H
#define TS_TEST_TRAIN_FIXTURES_H

#define D 16 /* sample (1, 4, 4) */
#define C 5  /* classes */

/* In rank functions (which must not use CHECK): with a `ts_status st` and a `fail:` label. */
#define TS_CHECK_GOTO_T(expr)         \
    do {                              \
        if ((st = (expr)) != TS_OK) goto fail; \
    } while (0)

/* N samples (N, 1, 4, 4) uniform in [-1, 1), labels from a fixed rule so the problem is learnable. */
static ts_dataset *make_dataset(int64_t n, uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    int64_t xs[4] = {n, 1, 4, 4};
    ts_tensor *x = tu_rand(&r, 4, xs, -1.0f, 1.0f, false), *y = NULL;
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &n, &y));
    const float *px = ts_tensor_data_f32(x);
    int64_t *py = ts_tensor_data(y);
    for (int64_t i = 0; i < n; i++) {
        int64_t best = 0;
        for (int64_t k = 1; k < C; k++)
            if (px[i * D + k] > px[i * D + best]) best = k;
        py[i] = best;
    }
    ts_dataset *ds = NULL;
    CHECK_OK(ts_dataset_from_tensors(x, y, &ds));
    ts_tensor_release(x);
    ts_tensor_release(y);
    return ds;
}

/* Flatten -> Linear(16, 12) -> ReLU -> Linear(12, C): works under every strategy. */
static ts_module *make_model(uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *m = NULL, *l = NULL;
    CHECK_OK(ts_nn_sequential_new(&m));
    CHECK_OK(ts_nn_flatten_new(&l));
    CHECK_OK(ts_nn_sequential_add(m, NULL, l));
    CHECK_OK(ts_nn_linear_new(D, 12, true, &r, &l));
    CHECK_OK(ts_nn_sequential_add(m, NULL, l));
    CHECK_OK(ts_nn_relu_new(&l));
    CHECK_OK(ts_nn_sequential_add(m, NULL, l));
    CHECK_OK(ts_nn_linear_new(12, C, true, &r, &l));
    CHECK_OK(ts_nn_sequential_add(m, NULL, l));
    return m;
}

/* Where the single-device runs (no strategy, a DDP rank) train: TS_TEST_DEVICE (tu_test_device; cuda:0 on a
 * GPU machine, cpu:1 for a virtual CPU device), into a strategy's options. The CPU leaves them as they are. */
static inline void tf_place(ts_strategy_opts *so, ts_device **dev) {
    *dev = tu_test_device();
    if ((so->kind == TS_STRATEGY_NONE || so->kind == TS_STRATEGY_DDP) && *dev != ts_device_cpu()) {
        so->devices = dev;
        so->num_devices = 1;
    }
}

/* The tensors of ps (float32, all on device `on` unless it is NULL, else an error naming the first that is not) flattened
 * into a malloc'd host array of *n values; NULL with the status in *st when a check or a copy fails. */
static inline float *tf_params_host(const ts_tensor_list *ps, ts_device *on, int64_t *n, ts_status *st) {
    *n = 0;
    *st = TS_OK;
    for (int i = 0; i < ps->n; i++) {
        if (on && ts_tensor_device(ps->tensors[i]) != on) {
            *st = ts_error(TS_ERR_DEVICE, "parameter %s is on %s, the test placed the model on %s", ps->names[i],
                           ts_device_name(ts_tensor_device(ps->tensors[i])), ts_device_name(on));
            return NULL;
        }
        *n += ts_tensor_numel(ps->tensors[i]);
    }
    float *h = malloc(sizeof(float) * (size_t)(*n ? *n : 1));
    if (!h) {
        *st = ts_error(TS_ERR_NOMEM, "tf_params_host: %lld floats", (long long)*n);
        return NULL;
    }
    for (int64_t i = 0, off = 0; i < ps->n && *st == TS_OK; off += ts_tensor_numel(ps->tensors[i]), i++)
        *st = ts_tensor_to_host(ps->tensors[i], h + off, ts_tensor_nbytes(ps->tensors[i]));
    if (*st != TS_OK) {
        free(h);
        return NULL;
    }
    return h;
}

#endif
