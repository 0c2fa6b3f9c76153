/*
 * bench/parallel_devices.c — training throughput of the reference CNN in one
 * process on virtual CPU devices, side by side in one run:
 *
 *   one device     the whole step (forward, cross-entropy, backward, SGD) as a
 *                  task on cpu:0's worker: one device, one kernel thread
 *   data parallel  DataParallel over cpu:0..cpu:N-1 (N = --devices, default 2),
 *                  --per-device images on each: replicas' forward and backward
 *                  run concurrently, one worker (one kernel thread) per device;
 *                  loss and SGD on the calling thread (also one thread)
 *   N independent  N separate models, each trained by a one-device step on its
 *                  own device, all at once: no communication at all, so this is
 *                  the ceiling the machine allows for N devices
 *
 * Every step is the same work per device (--per-device images, default 64), so
 * the ideal speedup is N. Modes alternate within each of --rounds rounds and
 * the best round counts (the build machine is shared); "CPU ms/image" is the
 * process's CPU time (all threads) per image in that round, so a mode that
 * adds work shows there even when the cores are busy with something else.
 * Random in-memory
 * batches, SGD with momentum 0.9 and weight decay 5e-4, as bench/train_vs_pytorch.
 *
 *   build/bench_parallel_devices [--steps 30] [--warmup 5] [--rounds 3] [--per-device 64] [--devices 2]
 *
 * Other strategies add a row by adding an entry to `modes` below (a name, a
 * setup that wraps the model, and optionally a step of their own).
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define MAX_DEV 16
#define TRY(expr)                         \
    do {                                  \
        ts_status st_ = (expr);           \
        if (st_ != TS_OK) return st_;     \
    } while (0)
#define NBATCH 4

typedef struct bench {
    ts_module *model;  /* what trains (the plain model or a runner around it) */
    ts_module *inner;  /* the plain model */
    ts_optimizer *opt;
    ts_tensor_list params;
    ts_device *dev0;   /* where the parameters (and the labels) live */
    int ndev;          /* devices used */
    int64_t batch;     /* images per step of this model */
    int64_t images;    /* images per step of the mode (N independent: N * batch) */
    struct bench *twins; /* N independent: the models on devices 1..N-1 */
    ts_tensor *xs[NBATCH], *ys[NBATCH];
    int next;
    float loss;
    bool move_input; /* copy the batch to dev0 first (a plain model on a device) */
} bench;

/* One step: forward, loss, backward, SGD. Runs where it is called. */
static ts_status plain_step(void *p) {
    bench *b = p;
    int k = b->next++ % NBATCH;
    ts_tensor *logits = NULL, *loss = NULL, *x = NULL;
    ts_status st = b->move_input ? ts_to_device(b->xs[k], b->dev0, &x) : TS_OK;
    if (st == TS_OK) st = ts_module_forward(b->model, x ? x : b->xs[k], &logits);
    ts_tensor_release(x);
    if (st == TS_OK) st = ts_cross_entropy(logits, b->ys[k], 0.0f, &loss);
    if (st == TS_OK) b->loss = (float)ts_tensor_item(loss, 0);
    if (st == TS_OK) st = ts_backward(loss, NULL, false);
    if (st == TS_OK) st = ts_optimizer_step(b->opt);
    ts_optimizer_zero_grad(b->opt);
    ts_tensor_release(loss);
    ts_tensor_release(logits);
    return st;
}

/* ---- modes -------------------------------------------------------------------------------------- */
typedef struct mode {
    const char *name;
    int ndev; /* devices it uses (0: --devices) */
    bool independent; /* one model per device (batch --per-device each) */
    /* wraps b->inner (already on b->dev0) into b->model */
    ts_status (*setup)(bench *b, ts_device *const *devs, int ndev);
    /* one training step (NULL: plain_step on the calling thread) */
    ts_status (*step)(bench *b);
} mode;

static ts_status one_setup(bench *b, ts_device *const *devs, int ndev) {
    b->model = b->inner;
    b->move_input = true;
    return TS_OK;
}
/* the whole step as a task on the device's worker: that device's thread budget */
static ts_status one_step(bench *b) { return ts_device_run_parallel(&b->dev0, 1, plain_step, (void *[]){b}); }

static ts_status dp_setup(bench *b, ts_device *const *devs, int ndev) {
    return ts_nn_data_parallel_new(b->inner, devs, ndev, devs[0], &b->model);
}

static ts_status bench_init(bench *b, const struct mode *m, ts_device *const *devs, int ndev, int64_t per_device);

static ts_status independent_setup(bench *b, ts_device *const *devs, int ndev) {
    TRY(one_setup(b, devs, 1));
    if (ndev < 2) return TS_OK;
    b->twins = calloc((size_t)ndev - 1, sizeof *b->twins);
    if (!b->twins) return TS_ERR_NOMEM;
    static const mode one = {"one", 1, false, one_setup, NULL};
    for (int i = 1; i < ndev; i++) TRY(bench_init(&b->twins[i - 1], &one, devs + i, 1, b->batch));
    return TS_OK;
}
static ts_status independent_step(bench *b) {
    ts_device *devs[MAX_DEV];
    void *args[MAX_DEV];
    for (int i = 0; i < b->ndev; i++) {
        bench *t = i ? &b->twins[i - 1] : b;
        devs[i] = t->dev0;
        args[i] = t;
    }
    return ts_device_run_parallel(devs, b->ndev, plain_step, args);
}

static const mode modes[] = {
    {"1 device (cpu:0)", 1, false, one_setup, one_step},
    {"data parallel", 0, false, dp_setup, NULL},
    {"N independent models", 0, true, independent_setup, independent_step},
    /* pipeline, tile, ...: {"pipeline 1f1b", 0, false, pipeline_setup, pipeline_step}, */
};
#define NMODES ((int)(sizeof modes / sizeof modes[0]))

static ts_status bench_init(bench *b, const mode *m, ts_device *const *devs, int ndev, int64_t per_device) {
    memset(b, 0, sizeof *b);
    ts_rng rng;
    ts_rng_seed(&rng, 0);
    b->ndev = m->ndev ? m->ndev : ndev;
    b->batch = m->independent ? per_device : per_device * b->ndev;
    b->images = per_device * b->ndev;
    b->dev0 = devs[0];
    ts_status st = ts_model_reference_cnn(&rng, &b->inner);
    if (st == TS_OK) st = ts_module_to(b->inner, devs[0]);
    if (st == TS_OK && (st = m->setup(b, devs, b->ndev)) != TS_OK) b->inner = NULL; /* a wrapper frees it */
    if (st == TS_OK) st = ts_module_parameters(b->inner, &b->params);
    ts_sgd_config c = TS_SGD_CONFIG_INIT;
    c.lr = 0.05f;
    c.momentum = 0.9f;
    c.weight_decay = 5e-4f;
    if (st == TS_OK) st = ts_optim_sgd_new(&b->params, &c, &b->opt);
    for (int i = 0; i < NBATCH && st == TS_OK; i++) {
        int64_t shape[4] = {b->batch, 1, 28, 28};
        ts_tensor *y = NULL;
        st = ts_tensor_empty(ts_device_cpu(), TS_F32, 4, shape, &b->xs[i]); /* batches come from host memory */
        if (st == TS_OK) st = ts_tensor_normal_(b->xs[i], 0, 1, &rng);
        if (st == TS_OK) st = ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &b->batch, &y);
        if (st == TS_OK) {
            int64_t *v = ts_tensor_data(y);
            for (int64_t k = 0; k < b->batch; k++) v[k] = (int64_t)ts_rng_below(&rng, 10);
            st = ts_to_device(y, b->dev0, &b->ys[i]); /* next to the logits */
        }
        ts_tensor_release(y);
    }
    if (st == TS_OK) ts_module_train(b->model, true);
    return st;
}

static void bench_free(bench *b) {
    for (int i = 0; i < NBATCH; i++) {
        ts_tensor_release(b->xs[i]);
        ts_tensor_release(b->ys[i]);
    }
    ts_optimizer_free(b->opt);
    ts_tensor_list_clear(&b->params);
    ts_module_free(b->model ? b->model : b->inner);
    for (int i = 0; b->twins && i < b->ndev - 1; i++) bench_free(&b->twins[i]);
    free(b->twins);
}

static ts_status run_steps(bench *b, const mode *m, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        ts_status st = m->step ? m->step(b) : plain_step(b);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec + 1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

static long arg(int argc, char **argv, const char *name, long dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return atol(argv[i + 1]);
    return dflt;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: %s [--steps 30] [--warmup 5] [--rounds 3] [--per-device 64] [--devices 2]\n", argv[0]);
            return 0;
        }
    long steps = arg(argc, argv, "--steps", 30), warmup = arg(argc, argv, "--warmup", 5);
    long rounds = arg(argc, argv, "--rounds", 3), per = arg(argc, argv, "--per-device", 64);
    int ndev = (int)arg(argc, argv, "--devices", 2);
    if (steps < 1 || warmup < 0 || rounds < 1 || per < 1 || ndev < 1 || ndev > MAX_DEV) {
        fprintf(stderr, "bad arguments (see --help)\n");
        return 2;
    }
    if (ts_set_cpu_device_count(ndev) != TS_OK) {
        fprintf(stderr, "%s\n", ts_last_error());
        return 1;
    }
    ts_set_num_threads(1); /* the calling thread too: one kernel thread per device in every mode */
    ts_device *devs[MAX_DEV];
    for (int i = 0; i < ndev; i++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", i);
        if (ts_device_get(name, &devs[i]) != TS_OK) {
            fprintf(stderr, "%s\n", ts_last_error());
            return 1;
        }
    }
    printf("reference CNN training step, %ld images per device, SGD; %d virtual CPU devices with %d kernel thread(s) "
           "each; best of %ld rounds of %ld steps\n",
           per, ndev, ts_cpu_device_threads(), rounds, steps);

    bench b[NMODES];
    double best[NMODES], cpu_ms[NMODES];
    for (int k = 0; k < NMODES; k++) {
        best[k] = cpu_ms[k] = 0;
        if (bench_init(&b[k], &modes[k], devs, ndev, per) != TS_OK || run_steps(&b[k], &modes[k], warmup) != TS_OK) {
            fprintf(stderr, "%s: %s\n", modes[k].name, ts_last_error());
            return 1;
        }
    }
    for (long r = 0; r < rounds; r++)
        for (int k = 0; k < NMODES; k++) {
            double t0 = ts_time_now(), c0 = cpu_seconds();
            if (run_steps(&b[k], &modes[k], steps) != TS_OK) {
                fprintf(stderr, "%s: %s\n", modes[k].name, ts_last_error());
                return 1;
            }
            double ips = (double)(steps * b[k].images) / (ts_time_now() - t0);
            if (ips > best[k]) {
                best[k] = ips;
                cpu_ms[k] = 1e3 * (cpu_seconds() - c0) / (double)(steps * b[k].images);
            }
        }

    printf("\n| %-20s | devices | images/step | ms/step | images/s | speedup | CPU ms/image |\n", "mode");
    printf("|%s|--------:|------------:|--------:|---------:|--------:|-------------:|\n", "----------------------");
    for (int k = 0; k < NMODES; k++)
        printf("| %-20s | %7d | %11lld | %7.1f | %8.0f | %6.2fx | %12.3f |\n", modes[k].name, b[k].ndev,
               (long long)b[k].images, 1e3 * (double)b[k].images / best[k], best[k], best[k] / best[0], cpu_ms[k]);
    for (int k = 0; k < NMODES; k++) bench_free(&b[k]);
    return 0;
}
