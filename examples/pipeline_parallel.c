/*
 * examples/pipeline_parallel.c — seed 002's "model parallelism in depth" as a
 * pipeline: the network's first two conv blocks (seq1) on one device, the rest
 * (seq2) on another, and each batch cut into micro-batches so both devices work
 * at once (PyTorch's version runs seq1 then seq2, one device idle at a time):
 *
 *     seq1 = Sequential(Conv2d(16), BatchNorm2d(), ReLU(), MaxPool2d(),
 *                       Conv2d(32), BatchNorm2d(), ReLU(), MaxPool2d()).to('cuda:0')
 *     seq2 = Sequential(Conv2d(64), BatchNorm2d(), ReLU(), MaxPool2d(),
 *                       Conv2d(128), BatchNorm2d(), ReLU(), MaxPool2d(), ...).to('cuda:1')
 *     x = seq2(seq1(x.to('cuda:0')).to('cuda:1'))
 *
 * Here the devices are the virtual CPU devices cpu:0 and cpu:1, the input is
 * Fashion-MNIST's 1x28x28 (so seq2 stops at 128 channels: 28 -> 14 -> 7 -> 3 -> 1
 * after four poolings; the seed's 128/256/512 assumed larger images), and a
 * Flatten + Linear head classifies. BatchNorm normalises each micro-batch.
 *
 * usage: example_pipeline_parallel [DATA_DIR] [MAX_STEPS] [gpipe|1f1b] [MICRO_BATCHES]
 */
#include <tessera.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        ts_status s_ = (call);                                                                       \
        if (s_ != TS_OK) {                                                                           \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, ts_last_error(), ts_status_name(s_));     \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

/* Appends conv3x3(cin -> cout, pad 1), BatchNorm2d, ReLU, MaxPool2d(2) to seq. */
static ts_status conv_block(ts_module *seq, int64_t cin, int64_t cout, ts_rng *rng) {
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    ts_pool2d_params pool = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false};
    ts_module *m = NULL;
    ts_status st = ts_nn_conv2d_new(cin, cout, 3, 3, p, true, rng, &m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    if (st == TS_OK) st = ts_nn_batchnorm2d_new(cout, 1e-5f, 0.1f, true, true, &m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    if (st == TS_OK) st = ts_nn_relu_new(&m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    if (st == TS_OK) st = ts_nn_maxpool2d_new(pool, &m);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, NULL, m);
    return st;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    long max_steps = argc > 2 ? atol(argv[2]) : 300;
    const char *schedule = argc > 3 ? argv[3] : "1f1b";
    int micro = argc > 4 ? atoi(argv[4]) : 4;

    ts_dataset *train, *test;
    CHECK(ts_dataset_load_mnist(dir, "train", &train));
    CHECK(ts_dataset_load_mnist(dir, "test", &test));

    /* the model: seq1's 8 layers, then seq2's 8 and the head's 2, as one Sequential */
    ts_rng rng;
    ts_rng_seed(&rng, 42);
    ts_module *model, *m;
    CHECK(ts_nn_sequential_new(&model));
    CHECK(conv_block(model, 1, 16, &rng));   /* seq1: (N,1,28,28) -> (N,16,14,14) */
    CHECK(conv_block(model, 16, 32, &rng));  /*       -> (N,32,7,7) */
    CHECK(conv_block(model, 32, 64, &rng));  /* seq2: -> (N,64,3,3) */
    CHECK(conv_block(model, 64, 128, &rng)); /*       -> (N,128,1,1) */
    CHECK(ts_nn_flatten_new(&m));
    CHECK(ts_nn_sequential_add(model, NULL, m));
    CHECK(ts_nn_linear_new(128, 10, true, &rng, &m));
    CHECK(ts_nn_sequential_add(model, NULL, m));

    /* seq1 on cpu:0, seq2 + head on cpu:1; the pipeline owns the model from here */
    ts_device *devs[2];
    CHECK(ts_device_get("cpu:0", &devs[0]));
    CHECK(ts_device_get("cpu:1", &devs[1]));
    ts_pp_schedule sched;
    CHECK(ts_pp_schedule_parse(schedule, &sched));
    const int bounds[2] = {8, 18}; /* stage 0: children [0, 8), stage 1: [8, 18) */
    ts_module *pipe;
    CHECK(ts_nn_pipeline_parallel_new(model, devs, 2, bounds, micro, sched, ts_device_cpu(), &pipe));

    /* build the optimizer after the move: the parameters now live on their stages' devices */
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(pipe, &params));
    ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
    cfg.lr = 0.05f;
    cfg.momentum = 0.9f;
    cfg.weight_decay = 5e-4f;
    ts_optimizer *opt;
    CHECK(ts_optim_sgd_new(&params, &cfg, &opt));

    ts_loader_opts lo = TS_LOADER_OPTS_INIT; /* batch 64, shuffled */
    lo.seed = 42;
    ts_loader *loader;
    CHECK(ts_loader_new(train, &lo, &loader));
    CHECK(ts_loader_set_epoch(loader, 0, 0));

    printf("%s schedule, %d micro-batches per batch of %lld; seq1 on %s, seq2 on %s\n",
           ts_pp_schedule_name(sched), micro, (long long)lo.batch_size, ts_device_name(devs[0]),
           ts_device_name(devs[1]));
    ts_module_train(pipe, true);
    ts_tensor *x, *y; /* borrowed from the loader */
    double t0 = ts_time_now(), bubble = 0;
    long steps = 0;
    for (long step = 0; step < max_steps; step++) {
        CHECK(ts_loader_next(loader, &x, &y));
        if (!x) break; /* end of the epoch */
        float loss;
        /* forward of every micro-batch, loss, backward — stage by stage on the devices' workers */
        CHECK(ts_pp_train_step(pipe, x, y, 0.0f, &loss));
        CHECK(ts_optimizer_step(opt));
        ts_optimizer_zero_grad(opt);
        ts_pp_stats st;
        CHECK(ts_pp_get_stats(pipe, &st));
        bubble += st.bubble;
        steps++;
        if (step % 100 == 0) printf("step %4ld  loss %.4f\n", step, loss);
    }
    double secs = ts_time_now() - t0;
    ts_pp_stats st;
    CHECK(ts_pp_get_stats(pipe, &st));
    printf("%ld steps, %.0f images/s; bubble %.3f measured, %.3f by (p-1)/(m+p-1)\n", steps,
           (double)steps * (double)lo.batch_size / secs, steps ? bubble / (double)steps : 0.0, st.bubble_ideal);
    for (int s = 0; s < st.stages; s++)
        printf("stage %d (%s): %d layers, busy %.1f ms in the last step, %d micro-batches in flight at most, "
               "peak %.1f KiB above the step's start\n",
               s, ts_device_name(devs[s]), st.layers[s], 1e3 * st.busy_s[s], st.peak_in_flight[s],
               (double)st.peak_bytes[s] / 1024.0);

    /* evaluate: eval mode (BatchNorm uses running statistics), no graph; the
     * pipeline's forward returns the logits on the CPU */
    ts_module_train(pipe, false);
    bool prev = ts_grad_set_enabled(false);
    ts_loader_opts eo = TS_LOADER_OPTS_INIT;
    eo.batch_size = 1000;
    eo.shuffle = false;
    ts_loader *eval;
    CHECK(ts_loader_new(test, &eo, &eval));
    long correct = 0, total = 0;
    for (;;) {
        CHECK(ts_loader_next(eval, &x, &y));
        if (!x) break;
        ts_tensor *logits;
        CHECK(ts_module_forward(pipe, x, &logits));
        const float *p = ts_tensor_data_f32(logits);
        const int64_t *label = ts_tensor_data(y);
        for (int64_t i = 0; i < ts_tensor_dim(logits, 0); i++, total++) {
            int best = 0;
            for (int k = 1; k < 10; k++)
                if (p[i * 10 + k] > p[i * 10 + best]) best = k;
            correct += best == label[i];
        }
        ts_tensor_release(logits);
    }
    ts_grad_set_enabled(prev);
    printf("test accuracy %.2f%% (%ld images)\n", 100.0 * (double)correct / (double)total, total);

    ts_loader_free(eval);
    ts_loader_free(loader);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_module_free(pipe);
    ts_dataset_free(train);
    ts_dataset_free(test);
    return 0;
}
