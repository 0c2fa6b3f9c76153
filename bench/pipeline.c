/*
 * bench/pipeline.c — pipeline-parallel training throughput on 2 virtual CPU
 * devices (one core each) against one device on one thread, with the measured
 * bubble beside the formula (p-1)/(m+p-1).
 *
 * Two models, batch 64, SGD (momentum 0.9, weight decay 5e-4), random
 * in-memory batches, the best of ROUNDS alternating rounds of STEPS steps:
 *   cnn       the reference CNN (tessera train's model). Its cost sits in conv2
 *             (layer 4), so no cut between layers balances it: the best 2-stage
 *             split leaves one stage far busier than the other.
 *   balanced  8 x (Conv2d(32,32,3,pad 1), ReLU) on 32x14x14, global average pool,
 *             Flatten, Linear(32,10): four convolutions per stage, the case the
 *             formula describes (stage 0 is a little lighter: its first
 *             convolution computes no input gradient).
 * Both are split by ts_pp_split_by_time (timed on one thread).
 *
 * Columns: images/s; speedup over one device on 1 thread; the ideal speedup
 * p*m/(m+p-1) of balanced stages and the measured speedup as a share of it;
 * the ideal for the stages as measured, T1 / (max(busy) (m-1)/m + sum(busy)/m)
 * (fill-drain with unequal stages: the slowest stage sets the pace, the others
 * add one micro-batch each; equals p*m/(m+p-1) for equal stages with
 * T1 = sum(busy)); the measured bubble 1 - sum(busy)/(p*wall)
 * and the formula's; each stage's busy ms per step (balance); micro-batching
 * efficiency = one device's step time / sum of the stages' busy time (what
 * cutting the batch into micro-batches and the copies cost). Also one device on
 * 2 threads, the other way to use both cores.
 *
 * usage: bench_pipeline [STEPS] [MICRO_BATCHES] [ROUNDS]   (defaults 20, 8, 3)
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 64

static void check(ts_status s, const char *what) {
    if (s != TS_OK) {
        fprintf(stderr, "bench_pipeline: %s: %s\n", what, ts_last_error());
        exit(1);
    }
}

typedef enum { M_CNN, M_BALANCED } model_kind;

static ts_module *build(model_kind k) {
    ts_rng r;
    ts_rng_seed(&r, 42);
    ts_module *s = NULL, *c = NULL;
    if (k == M_CNN) {
        check(ts_model_reference_cnn(&r, &s), "reference cnn");
        return s;
    }
    check(ts_nn_sequential_new(&s), "sequential");
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    for (int i = 0; i < 8; i++) {
        check(ts_nn_conv2d_new(32, 32, 3, 3, p, true, &r, &c), "conv");
        check(ts_nn_sequential_add(s, NULL, c), "add");
        check(ts_nn_relu_new(&c), "relu");
        check(ts_nn_sequential_add(s, NULL, c), "add");
    }
    check(ts_nn_global_avgpool2d_new(&c), "avgpool");
    check(ts_nn_sequential_add(s, NULL, c), "add");
    check(ts_nn_flatten_new(&c), "flatten");
    check(ts_nn_sequential_add(s, NULL, c), "add");
    check(ts_nn_linear_new(32, 10, true, &r, &c), "linear");
    check(ts_nn_sequential_add(s, NULL, c), "add");
    return s;
}

static void make_batch(model_kind k, int64_t b, ts_tensor **x, ts_tensor **y) {
    ts_rng r;
    ts_rng_seed(&r, 7);
    int64_t xs[4] = {b, 1, 28, 28};
    if (k == M_BALANCED) xs[1] = 32, xs[2] = 14, xs[3] = 14;
    check(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, xs, x), "x");
    check(ts_tensor_uniform_(*x, -1, 1, &r), "x");
    int64_t *lab = malloc(sizeof(int64_t) * (size_t)b);
    for (int64_t i = 0; i < b; i++) lab[i] = (int64_t)ts_rng_below(&r, 10);
    check(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &b, lab, y), "y");
    free(lab);
}

static ts_optimizer *make_sgd(ts_module *m) {
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    check(ts_module_parameters(m, &params), "parameters");
    ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
    cfg.lr = 0.01f;
    cfg.momentum = 0.9f;
    cfg.weight_decay = 5e-4f;
    ts_optimizer *o = NULL;
    check(ts_optim_sgd_new(&params, &cfg, &o), "sgd");
    ts_tensor_list_clear(&params);
    return o;
}

typedef struct {
    double step_s;          /* best round's seconds per step */
    double busy[2], bubble; /* pipeline: mean busy seconds per stage and bubble per step (that round) */
    int layers[2];
} result;

/* One device ("cpu") on `threads` threads: forward, loss, backward, SGD step. */
static void run_plain(model_kind k, int threads, int steps, result *best) {
    ts_set_num_threads(threads);
    ts_module *m = build(k);
    ts_optimizer *o = make_sgd(m);
    ts_tensor *x, *y;
    make_batch(k, BATCH, &x, &y);
    double t_start = 0;
    for (int it = -3; it < steps; it++) {
        if (it == 0) t_start = ts_time_now();
        ts_tensor *logits = NULL, *l = NULL;
        check(ts_module_forward(m, x, &logits), "forward");
        check(ts_cross_entropy(logits, y, 0.0f, &l), "loss");
        check(ts_backward(l, NULL, false), "backward");
        check(ts_optimizer_step(o), "step");
        ts_optimizer_zero_grad(o);
        ts_tensor_release(l);
        ts_tensor_release(logits);
    }
    double per = (ts_time_now() - t_start) / steps;
    if (best->step_s == 0 || per < best->step_s) best->step_s = per;
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_optimizer_free(o);
    ts_module_free(m);
}

static void run_pipe(model_kind k, ts_device **devs, ts_pp_schedule sched, int micro, const int *bounds,
                     int steps, result *best) {
    ts_set_num_threads(1); /* the caller's thread runs the optimizer step */
    ts_module *pipe = NULL;
    check(ts_nn_pipeline_parallel_new(build(k), devs, 2, bounds, micro, sched, ts_device_cpu(), &pipe), "pipeline");
    ts_optimizer *o = make_sgd(pipe);
    ts_tensor *x, *y;
    make_batch(k, BATCH, &x, &y);
    double t_start = 0, busy[2] = {0, 0}, bubble = 0;
    for (int it = -3; it < steps; it++) {
        if (it == 0) t_start = ts_time_now();
        float loss;
        check(ts_pp_train_step(pipe, x, y, 0.0f, &loss), "train step");
        check(ts_optimizer_step(o), "step");
        ts_optimizer_zero_grad(o);
        if (it >= 0) {
            ts_pp_stats s;
            check(ts_pp_get_stats(pipe, &s), "stats");
            busy[0] += s.busy_s[0];
            busy[1] += s.busy_s[1];
            bubble += s.bubble;
        }
    }
    double per = (ts_time_now() - t_start) / steps;
    if (best->step_s == 0 || per < best->step_s) {
        best->step_s = per;
        best->busy[0] = busy[0] / steps;
        best->busy[1] = busy[1] / steps;
        best->bubble = bubble / steps;
        ts_pp_stats s;
        check(ts_pp_get_stats(pipe, &s), "stats");
        best->layers[0] = s.layers[0];
        best->layers[1] = s.layers[1];
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_optimizer_free(o);
    ts_module_free(pipe);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    int micro = argc > 2 ? atoi(argv[2]) : 8;
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    if (steps < 2 || micro < 1 || rounds < 1) {
        fprintf(stderr, "usage: bench_pipeline [STEPS >= 2] [MICRO_BATCHES >= 1] [ROUNDS >= 1]\n");
        return 2;
    }
    check(ts_set_cpu_device_count(2), "device count");
    ts_set_cpu_device_threads(1);
    ts_device *devs[2];
    check(ts_device_get("cpu:0", &devs[0]), "cpu:0");
    check(ts_device_get("cpu:1", &devs[1]), "cpu:1");
    const int p = 2;
    int64_t micro_size = (BATCH + micro - 1) / micro;
    int m = (int)((BATCH + micro_size - 1) / micro_size);
    double ideal = (double)p * m / (m + p - 1), bubble_formula = (double)(p - 1) / (m + p - 1);

    printf("pipeline parallelism: %d virtual CPU devices x 1 thread, batch %d in %d micro-batches of %lld, "
           "SGD, best of %d rounds of %d steps\n\n",
           p, BATCH, m, (long long)micro_size, rounds, steps);
    printf("| model    | run                 | images/s | speedup | ideal p·m/(m+p-1) | of ideal "
           "| ideal, these stages | bubble | (p-1)/(m+p-1) | stage busy ms/step (layers) | micro-batch eff. |\n");
    printf("|----------|---------------------|---------:|--------:|------------------:|---------:|--------------------:"
           "|-------:|--------------:|-----------------------------|-----------------:|\n");
    for (int k = 0; k < 2; k++) {
        const char *name = k == M_CNN ? "cnn" : "balanced";
        /* the split: timed on one thread at the micro-batch size */
        int bounds[2];
        {
            ts_set_num_threads(1);
            ts_module *seq = build((model_kind)k);
            ts_tensor *x, *y;
            make_batch((model_kind)k, micro_size, &x, &y);
            check(ts_pp_split_by_time(seq, x, p, bounds), "split");
            ts_tensor_release(x);
            ts_tensor_release(y);
            ts_module_free(seq);
        }
        result one = {0}, two = {0}, pipe[2];
        memset(pipe, 0, sizeof pipe);
        for (int round = 0; round < rounds; round++) {
            run_plain((model_kind)k, 1, steps, &one);
            run_plain((model_kind)k, 2, steps, &two);
            for (int sc = 0; sc < 2; sc++)
                run_pipe((model_kind)k, devs, (ts_pp_schedule)sc, micro, bounds, steps, &pipe[sc]);
        }
        printf("| %-8s | 1 device, 1 thread  | %8.0f | %7.2f | | | | | | | |\n", name, BATCH / one.step_s, 1.0);
        printf("| %-8s | 1 device, 2 threads | %8.0f | %7.2f | | | | | | | |\n", name, BATCH / two.step_s,
               one.step_s / two.step_s);
        for (int sc = 0; sc < 2; sc++) {
            result *r = &pipe[sc];
            double speedup = one.step_s / r->step_s;
            double mx = r->busy[0] > r->busy[1] ? r->busy[0] : r->busy[1], sum = r->busy[0] + r->busy[1];
            double stage_ideal = one.step_s / (mx * (m - 1) / m + sum / m);
            printf("| %-8s | %s, 2 stages    | %8.0f | %7.2f | %17.2f | %7.0f%% | %6.2f (%3.0f%%)       | %6.3f "
                   "| %13.3f | %.1f (%d) / %.1f (%d) | %15.0f%% |\n",
                   name, sc == 0 ? "GPipe" : "1F1B ", BATCH / r->step_s, speedup, ideal, 100 * speedup / ideal,
                   stage_ideal, 100 * speedup / stage_ideal, r->bubble, bubble_formula, 1e3 * r->busy[0],
                   r->layers[0], 1e3 * r->busy[1], r->layers[1], 100 * one.step_s / sum);
        }
    }
    printf("\nspeedup = micro-batch eff. x p x (1 - bubble) (up to the optimizer step on the caller's thread);\n"
           "with unequal stages the bubble also holds the lighter stage's waiting, which the formula leaves out.\n");
    return 0;
}
