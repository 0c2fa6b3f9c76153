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

#endif

