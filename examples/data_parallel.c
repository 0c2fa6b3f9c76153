/*
 * examples/data_parallel.c — seed 002's data parallelism in one process, in C.
 *
 * 1. The primitives of torch.nn.parallel, composed into data_parallel() as in
 *    the seed:
 *
 *        def data_parallel(module, input, device_ids, output_device=None):
 *            replicas = nn.parallel.replicate(module, device_ids)
 *            inputs = nn.parallel.scatter(input, device_ids)
 *            replicas = replicas[:len(inputs)]
 *            outputs = nn.parallel.parallel_apply(replicas, inputs)
 *            return nn.parallel.gather(outputs, output_device)
 *
 *    and checked against the module run on one device (values and gradients).
 *
 * 2. The seed's DataParallelModel — block2 wrapped in DataParallel, the other
 *    blocks on the CPU — trained for a few steps on a toy regression:
 *
 *        self.block1 = nn.Linear(10, 20)
 *        self.block2 = nn.DataParallel(nn.Linear(20, 20))
 *        self.block3 = nn.Linear(20, 20)
 *
 *    "The code does not need to be changed in CPU-mode": run with --cpu and
 *    DataParallel gets the one device "cpu". Its loop stays written out: the
 *    loss is MSE, and the library's step (ts_train_step) is for classifiers.
 *
 * 3. DataParallel as it is mostly used — around a whole classifier — as the
 *    training strategy TS_STRATEGY_DATA: the reference CNN on Fashion-MNIST
 *    (--data DIR; skipped when absent) trained by the library's loop
 *    (ts_trainer) for the same N steps and evaluated on the test set. Each
 *    replica's BatchNorm normalises its own device's share of the batch, as
 *    in PyTorch.
 *
 * The devices are virtual CPU devices cpu:0 .. cpu:N-1 (TS_CPU_DEVICES, default
 * 2), each with its own memory and worker thread.
 *
 * usage: example_data_parallel [--cpu] [--steps N] [--data DIR]
 */
#include <tessera.h>

#include <math.h>
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

#define MAX_DEV 16

/* Seed 002's data_parallel(), from the primitives. *out is on output_device. */
static ts_status data_parallel(ts_module *module, ts_tensor *input, ts_device **devs, int n, ts_device *output_device,
                               ts_tensor **out) {
    ts_module *replicas[MAX_DEV] = {NULL};
    ts_tensor *inputs[MAX_DEV] = {NULL}, *outputs[MAX_DEV] = {NULL};
    int k = 0;
    ts_status st = ts_scatter(input, devs, n, inputs, &k); /* k <= n chunks (torch.chunk) */
    if (st == TS_OK) st = ts_replicate(module, devs, k, replicas);
    if (st == TS_OK) st = ts_parallel_apply(replicas, inputs, devs, k, outputs);
    if (st == TS_OK) st = ts_gather(outputs, k, output_device ? output_device : devs[0], out);
    for (int i = 0; i < k; i++) {
        ts_tensor_release(inputs[i]);
        ts_tensor_release(outputs[i]);
        ts_module_free(replicas[i]);
    }
    return st;
}

static double max_abs_diff(const ts_tensor *a, const ts_tensor *b) {
    int64_t n = ts_tensor_numel(a);
    float *pa = malloc(sizeof(float) * (size_t)n), *pb = malloc(sizeof(float) * (size_t)n);
    CHECK(ts_tensor_to_host(a, pa, sizeof(float) * (size_t)n));
    CHECK(ts_tensor_to_host(b, pb, sizeof(float) * (size_t)n));
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)pa[i] - pb[i]));
    free(pa);
    free(pb);
    return m;
}

static void part1_primitives(ts_device **devs, int n) {
    printf("1. data_parallel() from replicate, scatter, parallel_apply, gather over %d device%s\n", n, n > 1 ? "s" : "");
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_module *lin = NULL;
    CHECK(ts_nn_linear_new(20, 20, true, &r, &lin));
    CHECK(ts_module_to(lin, devs[0])); /* replicate wants the module on device_ids[0] */
    ts_tensor *x = NULL, *y = NULL, *ref = NULL, *s = NULL;
    CHECK(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){10, 20}, &x));
    CHECK(ts_tensor_normal_(x, 0, 1, &r));
    CHECK(data_parallel(lin, x, devs, n, ts_device_cpu(), &y)); /* 10 rows over n devices: torch.chunk */
    ts_tensor_list p = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(lin, &p));
    CHECK(ts_sum(y, &s));
    CHECK(ts_backward(s, NULL, false)); /* gradients of every replica summed into lin's */
    ts_tensor *g = NULL;
    CHECK(ts_tensor_clone(ts_tensor_grad(p.tensors[0]), &g));
    ts_module_zero_grad(lin);
    ts_tensor_release(s);
    /* the same on one device */
    ts_tensor *xd = NULL;
    CHECK(ts_to_device(x, devs[0], &xd));
    CHECK(ts_module_forward(lin, xd, &ref));
    CHECK(ts_sum(ref, &s));
    CHECK(ts_backward(s, NULL, false));
    printf("   output %s on %s; max |difference| to one device: output %.2g, weight gradient %.2g\n",
           ts_shape_str(ts_tensor_ndim(y), ts_tensor_shape(y), (char[64]){0}, 64), ts_device_name(ts_tensor_device(y)),
           max_abs_diff(y, ref), max_abs_diff(g, ts_tensor_grad(p.tensors[0])));
    ts_tensor_list_clear(&p);
    ts_tensor *objs[] = {x, xd, y, ref, s, g};
    for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) ts_tensor_release(objs[i]);
    ts_module_free(lin);
}

static void part2_model(ts_device **devs, int n, int steps) {
    printf("2. DataParallelModel: block1 (cpu) -> DataParallel(block2) over");
    for (int i = 0; i < n; i++) printf(" %s", ts_device_name(devs[i]));
    printf(" -> block3 (cpu)\n");
    ts_rng r;
    ts_rng_seed(&r, 2);
    ts_module *model = NULL, *b1 = NULL, *b2 = NULL, *b3 = NULL, *dp = NULL;
    CHECK(ts_nn_sequential_new(&model));
    CHECK(ts_nn_linear_new(10, 20, true, &r, &b1));
    CHECK(ts_nn_linear_new(20, 20, true, &r, &b2));
    CHECK(ts_nn_linear_new(20, 20, true, &r, &b3));
    CHECK(ts_nn_data_parallel_new(b2, devs, n, ts_device_cpu(), &dp)); /* output back on the CPU for block3 */
    CHECK(ts_nn_sequential_add(model, "block1", b1));
    CHECK(ts_nn_sequential_add(model, "block2", dp));
    CHECK(ts_nn_sequential_add(model, "block3", b3));
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(model, &params)); /* block2.module.weight lives on devs[0] */
    printf("   parameters:");
    for (int i = 0; i < params.n; i++)
        printf(" %s (%s)", params.names[i], ts_device_name(ts_tensor_device(params.tensors[i])));
    printf("\n");
    ts_optimizer *opt = NULL;
    CHECK(ts_optimizer_by_name("sgd", &params, 0.05, 0.9, 0.0, &opt));
    /* a toy regression: y = x W* for a fixed random W* (10 -> 20), batches of 32 */
    ts_tensor *wstar = NULL;
    CHECK(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){10, 20}, &wstar));
    CHECK(ts_tensor_normal_(wstar, 0, 0.5f, &r));
    for (int step = 0; step < steps; step++) {
        ts_tensor *x = NULL, *target = NULL, *pred = NULL, *loss = NULL;
        CHECK(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){32, 10}, &x));
        CHECK(ts_tensor_normal_(x, 0, 1, &r));
        bool prev = ts_grad_set_enabled(false);
        CHECK(ts_matmul(x, wstar, &target));
        ts_grad_set_enabled(prev);
        CHECK(ts_module_forward(model, x, &pred));
        CHECK(ts_mse_loss(pred, target, &loss));
        CHECK(ts_backward(loss, NULL, false)); /* the replicas' backward runs on their devices at once */
        CHECK(ts_optimizer_step(opt));
        ts_optimizer_zero_grad(opt);
        if (step % 10 == 0 || step == steps - 1) printf("   step %3d  loss %.4f\n", step, ts_tensor_item(loss, 0));
        ts_tensor *objs[] = {x, target, pred, loss};
        for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) ts_tensor_release(objs[i]);
    }
    ts_tensor_release(wstar);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_module_free(model);
}

static void part3_classifier(ts_device **devs, int n, int steps, const char *dir) {
    printf("3. the reference CNN on Fashion-MNIST with the DATA strategy, %d steps\n", steps);
    ts_data_opts d = TS_DATA_OPTS_INIT; /* batches of 64: 64 / n rows per device */
    d.path = dir;
    ts_batch_source *train = NULL, *test = NULL;
    if (ts_data_open(&d, &train, &test) != TS_OK) {
        printf("   skipped: %s\n", ts_last_error());
        return;
    }
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_module *cnn = NULL;
    CHECK(ts_model_reference_cnn(&r, &cnn));
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_DATA; /* nn.DataParallel(cnn, device_ids) */
    so.devices = devs;
    so.num_devices = n;
    ts_strategy *s = NULL;
    CHECK(ts_strategy_new(cnn, &so, &s)); /* owns the CNN, now on devs[0] */
    char desc[256];
    ts_strategy_describe(s, desc, sizeof desc);
    printf("   %s\n", desc);
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_optimizer *opt = NULL;
    CHECK(ts_module_parameters(ts_strategy_model(s), &params));
    CHECK(ts_optimizer_by_name("sgd", &params, 0.05, 0.9, 5e-4, &opt));
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.max_steps = steps;
    to.eval = test; /* evaluated after the last step */
    ts_trainer *t = NULL;
    CHECK(ts_trainer_new(s, opt, train, &to, &t));
    ts_train_result res;
    CHECK(ts_trainer_run(t, &res));
    printf("   loss %.4f after %lld steps (%.0f images/s); test accuracy %.2f%%\n", res.final_loss,
           (long long)res.steps, res.images_per_second, 100.0 * res.eval.accuracy);
    ts_trainer_free(t);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
}

int main(int argc, char **argv) {
    bool cpu_mode = false;
    int steps = 50;
    const char *dir = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cpu") == 0)
            cpu_mode = true;
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            dir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--cpu] [--steps N] [--data DIR]\n", argv[0]);
            return 2;
        }
    }
    ts_device *devs[MAX_DEV];
    int n = 1;
    if (cpu_mode) {
        devs[0] = ts_device_cpu();
    } else {
        n = ts_cpu_device_count() < MAX_DEV ? ts_cpu_device_count() : MAX_DEV;
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "cpu:%d", i);
            CHECK(ts_device_get(name, &devs[i]));
        }
    }
    part1_primitives(devs, n);
    part2_model(devs, n, steps);
    part3_classifier(devs, n, steps, dir);
    return 0;
}
