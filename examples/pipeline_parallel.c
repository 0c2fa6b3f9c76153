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
 * The pipeline is the training strategy TS_STRATEGY_PIPELINE with explicit
 * stage bounds, trained by the library's loop (ts_trainer, at most one epoch)
 * on Fashion-MNIST's batch sources (ts_data_open); a callback after every
 * step collects what the pipeline measured (ts_pp_get_stats: busy time per
 * stage, the bubble, micro-batches in flight, memory) and the order each stage
 * ran its forwards F and backwards B in (ts_pp_trace), printed at the end with
 * the test accuracy.
 *
 * usage: example_pipeline_parallel [DATA_DIR] [MAX_STEPS] [gpipe|1f1b] [MICRO_BATCHES]
 *   (defaults: Fashion-MNIST, 300 (0: the whole epoch), 1f1b, 4)
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
    ts_pool2d_params pool = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
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

/* The callback's notes: the pipeline's stats after every training step. */
typedef struct pp_watch {
    ts_module *pipe;    /* the strategy's module: the pipeline (borrowed) */
    double bubble_sum;  /* over the steps */
    ts_pp_stats last;   /* the last step's (the trainer's evaluation runs the pipeline too) */
    char order[2][1024]; /* the events each stage ran in the last step, in the order it ran them */
} pp_watch;

static ts_status after_step(const ts_train_event *ev, void *user) {
    pp_watch *w = user;
    if (ev->kind != TS_TRAIN_STEP) return TS_OK;
    ts_status st = ts_pp_get_stats(w->pipe, &w->last);
    if (st != TS_OK) return st;
    w->bubble_sum += w->last.bubble;
    for (int s = 0; s < 2; s++)
        if (ts_pp_trace(w->pipe, s, w->order[s], sizeof w->order[s]) != TS_OK) snprintf(w->order[s], 16, "(too long)");
    if ((ev->step - 1) % 100 == 0) printf("step %4lld  loss %.4f\n", (long long)ev->step - 1, ev->loss);
    return TS_OK;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    long max_steps = argc > 2 ? atol(argv[2]) : 300;
    const char *schedule = argc > 3 ? argv[3] : "1f1b";
    int micro = argc > 4 ? atoi(argv[4]) : 4;

    ts_data_opts d = TS_DATA_OPTS_INIT; /* batches of 64, shuffled; the test set in batches of 1000 */
    d.path = dir;
    d.seed = 42;
    ts_batch_source *train, *test;
    CHECK(ts_data_open(&d, &train, &test));

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

    /* seq1 on cpu:0, seq2 + head on cpu:1; the strategy owns the model from here */
    ts_device *devs[2];
    CHECK(ts_device_get("cpu:0", &devs[0]));
    CHECK(ts_device_get("cpu:1", &devs[1]));
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    so.kind = TS_STRATEGY_PIPELINE;
    CHECK(ts_pp_schedule_parse(schedule, &so.schedule));
    so.micro_batches = micro;
    so.devices = devs;
    so.num_devices = 2;
    so.bounds = (const int[]){8, 18}; /* stage 0: children [0, 8), stage 1: [8, 18) */
    ts_strategy *s;
    CHECK(ts_strategy_new(model, &so, &s));
    char desc[256];
    ts_strategy_describe(s, desc, sizeof desc);
    printf("%s\n", desc);

    /* the optimizer on the model's parameters, which now live on their stages' devices */
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    CHECK(ts_module_parameters(ts_strategy_model(s), &params));
    ts_optimizer *opt;
    CHECK(ts_optimizer_by_name("sgd", &params, 0.05, 0.9, 5e-4, &opt));

    /* the library's loop: every step is ts_pp_train_step (forward of every micro-batch, loss,
     * backward — stage by stage on the devices' workers), then the optimizer; the test set at the end */
    pp_watch w = {.pipe = ts_strategy_module(s)};
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.max_steps = max_steps;
    to.eval = test;
    to.callback = after_step;
    to.user = &w;
    ts_trainer *t;
    CHECK(ts_trainer_new(s, opt, train, &to, &t));
    ts_train_result r;
    CHECK(ts_trainer_run(t, &r));

    printf("%lld steps, %.0f images/s; bubble %.3f measured, %.3f by (p-1)/(m+p-1)\n", (long long)r.steps,
           r.images_per_second, r.steps ? w.bubble_sum / (double)r.steps : 0.0, w.last.bubble_ideal);
    for (int i = 0; i < w.last.stages; i++)
        printf("stage %d (%s): %d layers, busy %.1f ms in the last step, %d micro-batches in flight at most, "
               "peak %.1f KiB above the step's start\n    ran %s\n",
               i, ts_device_name(devs[i]), w.last.layers[i], 1e3 * w.last.busy_s[i], w.last.peak_in_flight[i],
               (double)w.last.peak_bytes[i] / 1024.0, w.order[i]);
    /* evaluated in eval mode (BatchNorm uses running statistics) without a graph; the pipeline's
     * forward returns the logits on the CPU */
    printf("test accuracy %.2f%% (%lld images)\n", 100.0 * r.eval.accuracy, (long long)r.eval.samples);

    ts_trainer_free(t);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    return 0;
}
