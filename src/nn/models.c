/*
 * nn/models.c — model builders with PyTorch's state-dict names: the reference
 * CNN and the MLP (both for 1x28x28 inputs, 10 classes), and lookup by name.
 */
#include "nn/module.h"

/* Appends *child, made by a constructor call whose status is st (read *child
 * only here: argument evaluation order is unspecified). */
static ts_status add(ts_module *seq, ts_status st, ts_module **child) {
    if (st != TS_OK) return st;
    ts_module *c = *child;
    *child = NULL;
    return ts_nn_sequential_add(seq, NULL, c);
}

ts_status ts_model_reference_cnn(ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_model_reference_cnn: NULL out");
    ts_module *s = NULL, *c = NULL;
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    ts_pool2d_params pool = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
    ts_status st;
    TS_CHECK_GOTO(ts_nn_sequential_new(&s));
    /* (N, 1, 28, 28) -> (N, 32, 14, 14) */
    TS_CHECK_GOTO(add(s, ts_nn_conv2d_new(1, 32, 3, 3, p, true, rng, &c), &c));        /* 0 */
    TS_CHECK_GOTO(add(s, ts_nn_batchnorm2d_new(32, 1e-5f, 0.1f, true, true, &c), &c)); /* 1 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                                      /* 2 */
    TS_CHECK_GOTO(add(s, ts_nn_maxpool2d_new(pool, &c), &c));                           /* 3 */
    /* -> (N, 64, 7, 7) */
    TS_CHECK_GOTO(add(s, ts_nn_conv2d_new(32, 64, 3, 3, p, true, rng, &c), &c));       /* 4 */
    TS_CHECK_GOTO(add(s, ts_nn_batchnorm2d_new(64, 1e-5f, 0.1f, true, true, &c), &c)); /* 5 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                                      /* 6 */
    TS_CHECK_GOTO(add(s, ts_nn_maxpool2d_new(pool, &c), &c));                           /* 7 */
    /* -> (N, 3136) -> (N, 128) -> (N, 10) */
    TS_CHECK_GOTO(add(s, ts_nn_flatten_new(&c), &c));                                   /* 8 */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(3136, 128, true, rng, &c), &c));              /* 9 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                                      /* 10 */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(128, 10, true, rng, &c), &c));                /* 11 */
    *out = s;
    return TS_OK;
fail:
    ts_module_free(s);
    return st;
}

ts_status ts_model_mlp(ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_model_mlp: NULL out");
    ts_module *s = NULL, *c = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_nn_sequential_new(&s));
    TS_CHECK_GOTO(add(s, ts_nn_flatten_new(&c), &c));                      /* 0: (N, 1, 28, 28) -> (N, 784) */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(784, 256, true, rng, &c), &c));  /* 1 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                         /* 2 */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(256, 10, true, rng, &c), &c));   /* 3 */
    *out = s;
    return TS_OK;
fail:
    ts_module_free(s);
    return st;
}

ts_status ts_model_by_name(const char *name, ts_rng *rng, ts_module **out) {
    TS_ARG(name && out, "ts_model_by_name: NULL argument");
    if (strcmp(name, "cnn") == 0) return ts_model_reference_cnn(rng, out);
    if (strcmp(name, "mlp") == 0) return ts_model_mlp(rng, out);
    return ts_error(TS_ERR_INVALID_ARG, "unknown model '%s' (known: cnn, mlp)", name);
}
