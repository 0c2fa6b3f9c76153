/*
 * examples/model_parallel.c — model parallelism in one process, in C.
 *
 * 1. Seed 001's "part of the model on the CPU and part on the GPU":
 *
 *        class DistributedModel(nn.Module):
 *            embedding = nn.Embedding(1000, 10)        # on the CPU
 *            rnn = nn.Linear(10, 10).cuda(0)
 *            def forward(self, x):
 *                x = self.embedding(x)                  # compute embedding on CPU
 *                x = x.cuda(0)                          # transfer to the device
 *                return self.rnn(x)                     # compute on the device
 *
 *    Here the device is the virtual CPU device cpu:1 and the transfer is a
 *    ToDevice module: Sequential(embedding, ToDevice(cpu:1), rnn). Autograd
 *    follows the copy, so the embedding's gradient comes back to the CPU.
 *
 * 2. Seed 002's "model parallelism in depth": the reference CNN's convolution
 *    blocks on cpu:0 and its classifier on cpu:1 (ModelParallel with explicit
 *    stage bounds), trained for a few steps on random images; the state dict
 *    keeps the plain model's names under "module.".
 *
 * usage: example_model_parallel [--steps N]
 */
#include <tessera.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        ts_status s_ = (call);                                                              \
        if (s_ != TS_OK) {                                                                  \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, ts_last_error(), ts_status_name(s_)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static void part1_embedding_on_cpu(ts_device *gpu, int steps) {
    printf("1. Embedding(1000, 10) on cpu -> ToDevice(%s) -> Linear(10, 10) on %s\n", ts_device_name(gpu),
           ts_device_name(gpu));
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_module *model = NULL, *emb = NULL, *to = NULL, *rnn = NULL;
    CHECK(ts_nn_embedding_new(1000, 10, &r, &emb));
    CHECK(ts_nn_linear_new(10, 10, true, &r, &rnn));
    CHECK(ts_module_to(rnn, gpu)); /* .cuda(0) */
    CHECK(ts_nn_to_device_new(gpu, &to));
    CHECK(ts_nn_sequential_new(&model));
    CHECK(ts_nn_sequential_add(model, "embedding", emb));
    CHECK(ts_nn_sequential_add(model, "to", to));
    CHECK(ts_nn_sequential_add(model, "rnn", rnn));
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(model, &params));
    ts_sgd_config c = TS_SGD_CONFIG_INIT;
    c.lr = 5.0f; /* MSE averages over 640 values: the gradients are small */
    c.momentum = 0.9f;
    ts_optimizer *opt = NULL;
    CHECK(ts_optim_sgd_new(&params, &c, &opt)); /* updates each parameter on its own device */
    /* learn to map token t (of the first 100) to the one-hot vector of t mod 10 */
    int64_t n = 64;
    for (int step = 0; step < steps; step++) {
        int64_t idx[64];
        float tgt[64 * 10] = {0};
        for (int64_t i = 0; i < n; i++) {
            idx[i] = (int64_t)ts_rng_below(&r, 100);
            tgt[i * 10 + idx[i] % 10] = 1.0f;
        }
        ts_tensor *x = NULL, *t = NULL, *y = NULL, *loss = NULL;
        CHECK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &n, idx, &x)); /* indices on the CPU */
        CHECK(ts_tensor_from_data(gpu, TS_F32, 2, (int64_t[]){n, 10}, tgt, &t));
        CHECK(ts_module_forward(model, x, &y)); /* y on the device */
        CHECK(ts_mse_loss(y, t, &loss));
        CHECK(ts_backward(loss, NULL, false));
        if (step == 0) {
            ts_tensor *ge = ts_tensor_grad(params.tensors[0]), *gl = ts_tensor_grad(params.tensors[1]);
            printf("   gradients: %s on %s, %s on %s\n", params.names[0], ts_device_name(ts_tensor_device(ge)),
                   params.names[1], ts_device_name(ts_tensor_device(gl)));
        }
        CHECK(ts_optimizer_step(opt));
        ts_optimizer_zero_grad(opt);
        if (step % 20 == 0 || step == steps - 1) printf("   step %3d  loss %.4f\n", step, ts_tensor_item(loss, 0));
        ts_tensor *objs[] = {x, t, y, loss};
        for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) ts_tensor_release(objs[i]);
    }
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_module_free(model);
}

static void part2_cnn_in_depth(ts_device **devs, int steps) {
    ts_rng r;
    ts_rng_seed(&r, 2);
    ts_module *cnn = NULL, *mp = NULL;
    CHECK(ts_model_reference_cnn(&r, &cnn));
    const int bounds[2] = {8, 12}; /* children 0-7 (conv-BN-ReLU-pool x2) | 8-11 (flatten, linear, ReLU, linear) */
    CHECK(ts_nn_model_parallel_new(cnn, devs, 2, bounds, ts_device_cpu(), &mp));
    printf("2. reference CNN: layers 0-7 on %s, layers 8-11 on %s, logits back on cpu\n", ts_device_name(devs[0]),
           ts_device_name(devs[1]));
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(mp, &params));
    printf("   %s on %s ... %s on %s\n", params.names[0], ts_device_name(ts_tensor_device(params.tensors[0])),
           params.names[params.n - 1], ts_device_name(ts_tensor_device(params.tensors[params.n - 1])));
    ts_sgd_config c = TS_SGD_CONFIG_INIT;
    c.lr = 0.02f;
    c.momentum = 0.9f;
    ts_optimizer *opt = NULL;
    CHECK(ts_optim_sgd_new(&params, &c, &opt));
    int64_t b = 32;
    ts_tensor *x = NULL, *y = NULL;
    CHECK(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){b, 1, 28, 28}, &x));
    CHECK(ts_tensor_normal_(x, 0, 1, &r));
    CHECK(ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &b, &y));
    int64_t *lab = ts_tensor_data(y);
    for (int64_t i = 0; i < b; i++) lab[i] = i % 10;
    for (int step = 0; step < steps; step++) { /* memorise one batch */
        ts_tensor *logits = NULL, *loss = NULL;
        CHECK(ts_module_forward(mp, x, &logits));
        CHECK(ts_cross_entropy(logits, y, 0.0f, &loss));
        CHECK(ts_backward(loss, NULL, false)); /* gradients cross back from cpu:1 to cpu:0 */
        CHECK(ts_optimizer_step(opt));
        ts_optimizer_zero_grad(opt);
        if (step % 5 == 0 || step == steps - 1) printf("   step %3d  loss %.4f\n", step, ts_tensor_item(loss, 0));
        ts_tensor_release(logits);
        ts_tensor_release(loss);
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_module_free(mp);
}

int main(int argc, char **argv) {
    int steps = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--steps N]\n", argv[0]);
            return 2;
        }
    }
    ts_device *devs[2];
    CHECK(ts_device_get("cpu:0", &devs[0]));
    CHECK(ts_device_get("cpu:1", &devs[1]));
    part1_embedding_on_cpu(devs[1], 3 * steps);
    part2_cnn_in_depth(devs, steps);
    return 0;
}
