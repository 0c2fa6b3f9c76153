/*
 * tests/test_determinism.c — the same step on the same data gives the same bits.
 *
 * Runs the reference CNN's forward + cross-entropy + backward on one fixed
 * batch 300 times with two kernel threads and compares every parameter
 * gradient with the first pass's, byte for byte. This caught OpenBLAS 0.3.21
 * corrupting conv2d's concurrent per-thread sgemms when src/ops/cpu/blas.c
 * changed OpenBLAS's thread count inside a parallel region (about one pass in
 * 60 differed, by up to 1.0 in conv 4's weight gradient; scripts/openblas_race.c).
 * It also guards the per-thread accumulators of conv2d's backward and every
 * other reduction against orders that depend on timing.
 */
#include "test_util.h"

#define PASSES 200

static void test_cnn_step_bitwise(void) {
    ts_set_num_threads(2);
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_module *m = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &m));
    ts_module_train(m, false); /* BatchNorm in eval mode: the running statistics stay put between passes */
    int64_t xs[4] = {32, 1, 28, 28}, n = 32;
    ts_tensor *x = tu_rand(&r, 4, xs, -1.0f, 1.0f, false), *y = NULL;
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &n, &y));
    for (int64_t i = 0; i < n; i++) ((int64_t *)ts_tensor_data(y))[i] = i % 10;
    ts_tensor_list p = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(m, &p));
    ts_tensor *ref[16] = {0};
    int differing = 0;
    for (int pass = 0; pass < PASSES && p.n <= 16; pass++) {
        ts_tensor *logits = NULL, *loss = NULL;
        CHECK_OK(ts_module_forward(m, x, &logits));
        CHECK_OK(ts_cross_entropy(logits, y, 0.0f, &loss));
        CHECK_OK(ts_backward(loss, NULL, false));
        for (int i = 0; i < p.n; i++) {
            ts_tensor *g = ts_tensor_grad(p.tensors[i]);
            if (!g) continue;
            if (!ref[i]) {
                CHECK_OK(ts_tensor_clone(g, &ref[i]));
            } else if (memcmp(ts_tensor_data_f32(ref[i]), ts_tensor_data_f32(g), ts_tensor_nbytes(g)) != 0) {
                if (differing++ < 5)
                    fprintf(stderr, "  pass %d: the gradient of %s differs by %.3g\n", pass, p.names[i],
                            tu_max_abs_diff(g, ts_tensor_data_f32(ref[i])));
            }
        }
        ts_module_zero_grad(m);
        ts_tensor_release(logits);
        ts_tensor_release(loss);
    }
    CHECK(differing == 0);
    for (int i = 0; i < 16; i++) ts_tensor_release(ref[i]);
    ts_tensor_list_clear(&p);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_module_free(m);
}

TU_MAIN(T(test_cnn_step_bitwise))
