/*
 * examples/tile_parallel.c — tile parallelism for images, the C version of the
 * seed's ImageParallelExample (seed 002):
 *
 *     l = Sequential(Conv2d(16), BatchNorm2d(), ReLU(), MaxPool2d(),
 *                    Conv2d(32), BatchNorm2d(), ReLU(), MaxPool2d())
 *     layers = [l.to("cuda:%d" % i) for i in range(4)]      # parameters tied
 *     parts = [x[:, :, 0:h//2, 0:w//2], ...]                 # four tiles
 *     y = [f(x) for f, x in zip(self.layers, parts)]          # "need to worry about
 *     return vstack([hstack(...), hstack(...)])               #  boundary conditions"
 *
 * Here the tiles are bands of rows (ts_nn_tile_parallel_new splits along H) on
 * the virtual CPU devices cpu:0..cpu:N-1, and the boundary conditions are
 * handled: halo rows before every convolution and pooling, zero padding only
 * at the image's edges, BatchNorm statistics over the whole image, weight
 * gradients summed over the tiles. The program checks that claim: it runs the
 * same stack untiled and prints the largest difference in the output, the
 * input gradient and the parameter gradients, and times one step of each
 * (tiling is about memory and correctness here, not speed: backward runs on
 * one thread with one device's thread budget, so on a machine with few cores
 * the tiled step is often slower).
 *
 * Then the same tiling as a training strategy (TS_STRATEGY_TILE, what
 * `tessera train --strategy tile` runs): the reference CNN on Fashion-MNIST
 * (--data DIR; skipped when absent), each 28x28 image cut into N bands, trained
 * by the library's loop (ts_trainer) for S steps and evaluated on the test set.
 *
 * usage: example_tile_parallel [--tiles N] [--height H] [--width W] [--batch B] [--data DIR] [--steps S]
 *   (defaults 4, 61, 47, 2: odd sizes on purpose; Fashion-MNIST, 20)
 */
#include <tessera.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        ts_status s_ = (call);                                                               \
        if (s_ != TS_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, ts_last_error(), ts_status_name(s_)); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

/* Conv2d(c_in, c_out, 3, padding=1), BatchNorm2d, ReLU, MaxPool2d(2), appended to seq. */
static ts_status add_block(ts_module *seq, int64_t c_in, int64_t c_out, ts_rng *rng) {
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.padding[0] = cp.padding[1] = 1;
    ts_pool2d_params pool;
    memset(&pool, 0, sizeof pool);
    pool.kernel[0] = pool.kernel[1] = 2;
    ts_module *m = NULL;
    ts_status st = ts_nn_conv2d_new(c_in, c_out, 3, 3, cp, true, rng, &m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    if (st == TS_OK) st = ts_nn_batchnorm2d_new(c_out, 1e-5f, 0.1f, true, true, &m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    if (st == TS_OK) st = ts_nn_relu_new(&m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    if (st == TS_OK) st = ts_nn_maxpool2d_new(pool, &m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    return st;
}

static ts_status make_stack(uint64_t seed, ts_module **out) {
    ts_rng rng;
    ts_rng_seed(&rng, seed);
    ts_status st = ts_nn_sequential_new(out);
    if (st == TS_OK) st = add_block(*out, 3, 16, &rng);
    if (st == TS_OK) st = add_block(*out, 16, 32, &rng);
    return st;
}

static double max_diff(const ts_tensor *a, const ts_tensor *b) {
    int64_t n = ts_tensor_numel(a);
    float *pa = malloc(sizeof(float) * (size_t)n), *pb = malloc(sizeof(float) * (size_t)n);
    double m = 0;
    if (pa && pb && ts_tensor_to_host(a, pa, sizeof(float) * (size_t)n) == TS_OK &&
        ts_tensor_to_host(b, pb, sizeof(float) * (size_t)n) == TS_OK)
        for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)pa[i] - pb[i]));
    else
        m = INFINITY;
    free(pa);
    free(pb);
    return m;
}

/* forward + mean(out * r) + backward; *out keeps the output. */
static ts_status step(ts_module *m, ts_tensor *x, const ts_tensor *r, ts_tensor **out) {
    ts_tensor *o = NULL, *oc = NULL, *p = NULL, *loss = NULL;
    ts_status st = ts_module_forward(m, x, &o);
    if (st == TS_OK) st = ts_to_device(o, ts_device_cpu(), &oc);
    if (st == TS_OK) st = ts_mul(oc, r, &p);
    if (st == TS_OK) st = ts_mean(p, &loss);
    if (st == TS_OK) st = ts_backward(loss, NULL, false);
    ts_tensor_release(oc);
    ts_tensor_release(p);
    ts_tensor_release(loss);
    if (st == TS_OK)
        *out = o;
    else
        ts_tensor_release(o);
    return st;
}

/* The reference CNN trained with the TILE strategy over devs for `steps` steps, then evaluated. */
static int train_classifier(ts_device **devs, int tiles, const char *dir, long steps) {
    ts_data_opts d = TS_DATA_OPTS_INIT; /* batches of 64, shuffled */
    d.path = dir;
    ts_batch_source *train = NULL, *test = NULL;
    if (ts_data_open(&d, &train, &test) != TS_OK) {
        printf("training with the tile strategy skipped: %s\n", ts_last_error());
        return 0;
    }
    ts_rng rng;
    ts_rng_seed(&rng, 42);
    ts_module *cnn;
    CHECK(ts_model_reference_cnn(&rng, &cnn));
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_TILE; /* the convolutions on bands of rows; Flatten and the Linear layers on the CPU */
    so.devices = devs;
    so.num_devices = tiles;
    ts_strategy *s;
    CHECK(ts_strategy_new(cnn, &so, &s));
    ts_tensor_list params = TS_TENSOR_LIST_INIT; /* on the CPU; each forward copies them to the tiles */
    ts_optimizer *opt;
    CHECK(ts_module_parameters(ts_strategy_model(s), &params));
    CHECK(ts_optimizer_by_name("sgd", &params, 0.05, 0.9, 5e-4, &opt));
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.max_steps = steps;
    to.eval = test; /* evaluated after the last step */
    ts_trainer *t;
    CHECK(ts_trainer_new(s, opt, train, &to, &t));
    ts_train_result r;
    CHECK(ts_trainer_run(t, &r));
    char desc[256];
    ts_strategy_describe(s, desc, sizeof desc);
    printf("reference CNN on Fashion-MNIST, %s: loss %.4f after %lld steps (%.0f images/s), test accuracy %.2f%%\n",
           desc, r.final_loss, (long long)r.steps, r.images_per_second, 100.0 * r.eval.accuracy);
    ts_trainer_free(t);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    return 0;
}

int main(int argc, char **argv) {
    int tiles = 4;
    int64_t H = 61, W = 47, B = 2;
    const char *dir = "/usr/share/datasets/fashion-mnist";
    long steps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--tiles") == 0) tiles = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--height") == 0) H = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--width") == 0) W = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0) B = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--data") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--steps") == 0) steps = atol(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--tiles N] [--height H] [--width W] [--batch B] [--data DIR] [--steps S]\n",
                    argv[0]);
            return 2;
        }
    }
    if (tiles < 1 || tiles > TS_MAX_CPU_DEVICES || H < 4 || W < 4 || B < 1) {
        fprintf(stderr, "bad sizes: tiles 1..%d, height and width >= 4, batch >= 1\n", TS_MAX_CPU_DEVICES);
        return 2;
    }
    CHECK(ts_set_cpu_device_count(tiles));
    ts_device *devs[TS_MAX_CPU_DEVICES];
    for (int t = 0; t < tiles; t++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", t);
        CHECK(ts_device_get(name, &devs[t]));
    }

    /* two copies of the same stack: one untiled on the CPU, one cut into bands */
    ts_module *plain = NULL, *stack = NULL, *tiled = NULL;
    CHECK(make_stack(42, &plain));
    CHECK(make_stack(42, &stack));
    CHECK(ts_nn_tile_parallel_new(stack, devs, tiles, ts_device_cpu(), &tiled));

    ts_rng rng;
    ts_rng_seed(&rng, 7);
    int64_t shape[4] = {B, 3, H, W};
    ts_tensor *x1 = NULL, *x2 = NULL, *r = NULL, *y1 = NULL, *y2 = NULL;
    CHECK(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, shape, &x1));
    CHECK(ts_tensor_uniform_(x1, -1.0f, 1.0f, &rng));
    CHECK(ts_tensor_clone(x1, &x2));
    ts_tensor_set_requires_grad(x1, true);
    ts_tensor_set_requires_grad(x2, true);

    /* loss = mean(out * r): out is (B, 32, H/4, W/4) after the two 2x2 poolings */
    int64_t oshape[4] = {B, 32, H / 2 / 2, W / 2 / 2};
    CHECK(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, oshape, &r));
    CHECK(ts_tensor_uniform_(r, -1.0f, 1.0f, &rng));

    /* a first step warms up both (allocator caches, worker threads), then the measured one */
    double t0 = 0, t1 = 0, t2 = 0;
    for (int pass = 0; pass < 2; pass++) {
        ts_tensor_release(y1);
        ts_tensor_release(y2);
        y1 = y2 = NULL;
        ts_module_zero_grad(plain);
        ts_module_zero_grad(tiled);
        ts_tensor_zero_grad(x1);
        ts_tensor_zero_grad(x2);
        t0 = ts_time_now();
        CHECK(step(plain, x1, r, &y1));
        t1 = ts_time_now();
        CHECK(step(tiled, x2, r, &y2));
        t2 = ts_time_now();
    }

    printf("input (%lld, 3, %lld, %lld) -> output (%lld, %lld, %lld, %lld), %d bands of rows on cpu:0..cpu:%d\n",
           (long long)B, (long long)H, (long long)W, (long long)ts_tensor_dim(y2, 0), (long long)ts_tensor_dim(y2, 1),
           (long long)ts_tensor_dim(y2, 2), (long long)ts_tensor_dim(y2, 3), tiles, tiles - 1);
    printf("max |tiled - untiled|: output %.3g, input gradient %.3g", max_diff(y1, y2),
           max_diff(ts_tensor_grad(x1), ts_tensor_grad(x2)));
    ts_tensor_list pa = TS_TENSOR_LIST_INIT, pb = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(plain, &pa));
    CHECK(ts_module_parameters(tiled, &pb));
    double gp = 0;
    for (int i = 0; i < pa.n; i++) gp = fmax(gp, max_diff(ts_tensor_grad(pa.tensors[i]), ts_tensor_grad(pb.tensors[i])));
    printf(", parameter gradients %.3g (%d tensors, e.g. %s)\n", gp, pb.n, pb.names[0]);
    printf("forward + backward: untiled %.1f ms, tiled %.1f ms\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    ts_tensor_list_clear(&pa);
    ts_tensor_list_clear(&pb);

    ts_tensor_release(y1);
    ts_tensor_release(y2);
    ts_tensor_release(r);
    ts_tensor_release(x1);
    ts_tensor_release(x2);
    ts_module_free(tiled);
    ts_module_free(plain);
    return train_classifier(devs, tiles, dir, steps);
}
