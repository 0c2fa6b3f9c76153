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
 *    Here the device is cuda:0 where this Tessera has CUDA and a GPU, else the
 *    virtual CPU device cpu:1, and the transfer is a ToDevice module:
 *    Sequential(embedding, ToDevice(dev), rnn). Autograd follows the copy, so
 *    the embedding's gradient comes back to the CPU.
 *
 * 2. Seed 002's "model parallelism in depth": the reference CNN's convolution
 *    blocks on cpu:0 and its classifier on cpu:1 — the training strategy
 *    TS_STRATEGY_MODEL (ModelParallel) with explicit stage bounds — trained on
 *    Fashion-MNIST (--data DIR; skipped when absent) with the library's step
 *    (ts_train_step) for N steps and evaluated on the test set (ts_evaluate).
 *    The optimizer updates the plain CNN's parameters, each on its device;
 *    they and the state dict keep the plain names ("0.weight"), so a
 *    checkpoint does not depend on the strategy.
 *
 * usage: example_model_parallel [--steps N] [--data DIR]
 *   part 1 runs 3N steps, part 2 N
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
    ts_optimizer *opt = NULL; /* lr 5: MSE averages over 640 values, the gradients are small */
    CHECK(ts_optimizer_by_name("sgd", &params, 5.0, 0.9, 0.0, &opt)); /* each parameter updated on its device */
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

static void part2_cnn_in_depth(ts_device **devs, int steps, const char *dir) {
    printf("2. the reference CNN in depth on Fashion-MNIST with the MODEL strategy, %d steps\n", steps);
    ts_data_opts d = TS_DATA_OPTS_INIT; /* batches of 64, shuffled */
    d.path = dir;
    ts_batch_source *train = NULL, *test = NULL;
    if (ts_data_open(&d, &train, &test) != TS_OK) {
        printf("   skipped: %s\n", ts_last_error());
        return;
    }
    ts_rng r;
    ts_rng_seed(&r, 2);
    ts_module *cnn = NULL;
    CHECK(ts_model_reference_cnn(&r, &cnn));
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_MODEL;
    so.devices = devs;
    so.num_devices = 2;
    so.bounds = (const int[]){8, 12}; /* children 0-7 (conv-BN-ReLU-pool x2) | 8-11 (flatten, linear, ReLU, linear) */
    ts_strategy *s = NULL;
    CHECK(ts_strategy_new(cnn, &so, &s)); /* owns the CNN; logits come back to the CPU */
    char desc[256];
    ts_strategy_describe(s, desc, sizeof desc);
    ts_tensor_list params = TS_TENSOR_LIST_INIT; /* the plain CNN's: plain names, as its state dict */
    CHECK(ts_module_parameters(ts_strategy_model(s), &params));
    printf("   %s\n   %s on %s ... %s on %s\n", desc, params.names[0],
           ts_device_name(ts_tensor_device(params.tensors[0])), params.names[params.n - 1],
           ts_device_name(ts_tensor_device(params.tensors[params.n - 1])));
    ts_optimizer *opt = NULL;
    CHECK(ts_optimizer_by_name("sgd", &params, 0.02, 0.9, 0.0, &opt));
    ts_strategy_train(s, true);
    for (int step = 0; step < steps; step++) {
        ts_batch b; /* borrowed from the source */
        CHECK(ts_batch_source_next(train, &b));
        if (!b.x) break; /* end of the epoch */
        float loss;
        CHECK(ts_train_step(s, opt, b.x, b.y, 0.0f, &loss)); /* gradients cross back from cpu:1 to cpu:0 */
        if (step % 5 == 0 || step == steps - 1) printf("   step %3d  loss %.4f\n", step, loss);
    }
    ts_eval_result ev;
    CHECK(ts_evaluate(ts_strategy_module(s), test, &ev));
    printf("   test accuracy %.2f%% (%lld images)\n", 100.0 * ev.accuracy, (long long)ev.samples);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
}

int main(int argc, char **argv) {
    int steps = 20;
    const char *dir = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            dir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--steps N] [--data DIR]\n", argv[0]);
            return 2;
        }
    }
    ts_device *devs[2];
    CHECK(ts_device_get("cpu:0", &devs[0]));
    CHECK(ts_device_get("cpu:1", &devs[1]));
    /* part 1 on a real GPU when there is one (seed 001's .cuda(0)), else on the virtual device cpu:1 */
    ts_device *gpu = devs[1];
    if (ts_cuda_device_count(NULL, 0) > 0) CHECK(ts_device_get("cuda:0", &gpu));
    part1_embedding_on_cpu(gpu, 3 * steps);
    part2_cnn_in_depth(devs, steps, dir);
    return 0;
}
