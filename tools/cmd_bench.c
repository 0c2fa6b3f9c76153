/*
 * tools/cmd_bench.c — `tessera bench train`: training throughput of a model
 * on in-memory random batches (the loader is not timed), the Tessera half of
 * bench/train_vs_pytorch.sh and bench/resnet_vs_pytorch.sh; `tessera bench
 * gemm`: the sgemm rate the CPU reaches (the physical limit those compare to).
 */
#include "cli.h"
#include "commands.h"
#include <immintrin.h>

#include "tessera.h"

#include <string.h>

#define NBATCHES 16

typedef struct bench_args {
    const char *model, *device;
    ts_conv_algo algo;
    ts_precision prec;
    int64_t threads, steps, batch, warmup, image_size, classes;
    bool json;
} bench_args;


static int bench_train_flags(int argc, char **argv, bench_args *a) {
    const cli_flag flags[] = {
        {"model", CLI_STRING, &a->model, "a zoo model: cnn, mlp, resnet18, resnet34, resnet50, ...", 1, 0},
        {"image-size", CLI_INT, &a->image_size, "ResNets: the input's side (default 224)", 0, 4096},
        {"num-classes", CLI_INT, &a->classes, "output classes (0: the model's default: 10, or 1000 for ResNets)", 0, 1 << 20},
        {"threads", CLI_INT, &a->threads, "CPU threads (0: all)", 0, 4096},
        {"conv-algo", CLI_ENUM, CLI_ENUM_OF(a->algo, cli_name_conv), "convolutions: auto, im2col, winograd, winograd-f2, winograd-f4 or onednn", TS_CONV_AUTO, TS_CONV_ONEDNN},
        {"precision", CLI_ENUM, CLI_ENUM_OF(a->prec, cli_name_prec), "fp32 or bf16: bfloat16 autocast where the device's kernels take bfloat16 activations (the CPU: as tessera train --precision bf16), else bfloat16 products with float32 accumulation", TS_PRECISION_FP32, TS_PRECISION_BF16},
        {"device", CLI_STRING, &a->device, "where the model and the batches live: cpu or cuda:N", 1, 0},
        {"steps", CLI_INT, &a->steps, "timed steps", 1, 1e9},
        {"warmup", CLI_INT, &a->warmup, "untimed steps first", 0, 1e9},
        {"batch-size", CLI_INT, &a->batch, "images per step", 1, 1 << 20},
        {"json", CLI_BOOL, &a->json, "print one JSON object", 1, 0},
        {"classes", CLI_INT, &a->classes, NULL, 0, 1 << 20}, /* the old spelling */
    };
    const cli_command cmd = {"bench train", "tessera bench train [flags]",
                             "Times training steps (forward, cross-entropy, backward, SGD with momentum 0.9,\n"
                             "weight decay 5e-4) of a model on random in-memory batches.",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc;
    ts_model_desc md;
    if (ts_model_info(a->model, &md) && md.fixed_size && a->image_size && a->image_size != md.image_size)
        return cli_usage_error(&cmd, "--image-size %lld: --model %s takes %dx%d images only", (long long)a->image_size,
                               a->model, md.image_size, md.image_size);
    return 0;
}

/* NBATCHES random batches of the model's input with labels below classes, waiting on dev. */
static ts_status make_batches(const bench_args *a, const ts_model_desc *md, ts_device *dev, ts_rng *rng,
                              ts_tensor **xs, ts_tensor **ys) {
    int64_t side = md->fixed_size ? md->image_size : a->image_size ? a->image_size : md->image_size;
    int64_t ncls = a->classes ? a->classes : md->num_classes, batch = a->batch;
    for (int i = 0; i < NBATCHES; i++) {
        int64_t shape[4] = {batch, md->in_channels, side, side};
        ts_tensor *x = NULL, *y = NULL;
        ts_status st = ts_tensor_empty(NULL, TS_F32, 4, shape, &x);
        if (st == TS_OK) st = ts_tensor_normal_(x, 0, 1, rng);
        if (st == TS_OK) st = ts_tensor_empty(NULL, TS_I64, 1, &batch, &y);
        for (int64_t k = 0; st == TS_OK && k < batch; k++) ((int64_t *)ts_tensor_data(y))[k] = (int64_t)ts_rng_below(rng, (uint64_t)ncls);
        /* the batches wait on the device, as PyTorch benchmarks keep them */
        if (st == TS_OK) st = ts_to_device(x, dev, &xs[i]);
        if (st == TS_OK) st = ts_to_device(y, dev, &ys[i]);
        ts_tensor_release(x);
        ts_tensor_release(y);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

static void print_train(const bench_args *a, ts_device *dev, int64_t side, double dt, float loss) {
    double ips = (double)(a->steps * a->batch) / dt;
    if (a->json)
        printf("{\"framework\": \"tessera\", \"device\": \"%s\", \"model\": \"%s\", \"image_size\": %lld, \"threads\": %d, "
               "\"conv_algo\": \"%s\", \"precision\": \"%s\", \"autocast\": \"%s\", \"gemm\": \"%s\", "
               "\"batch_size\": %lld, \"steps\": %lld, \"seconds\": %.4f, \"images_per_second\": %.1f, "
               "\"final_loss\": %.5f}\n",
               ts_device_name(dev), a->model, (long long)side, ts_get_num_threads(), ts_conv_algo_name(a->algo),
               ts_dtype_name(ts_precision_dtype(a->prec)), ts_dtype_name(ts_get_autocast()), ts_cpu_gemm_library(),
               (long long)a->batch, (long long)a->steps, dt, ips, loss);
    else
        printf("%s on %s, batch %lld, %d threads, conv %s, %s (%s): %.1f images/s (%.2f ms/step over %lld steps)\n",
               a->model, ts_device_name(dev), (long long)a->batch, ts_get_num_threads(), ts_conv_algo_name(a->algo),
               ts_dtype_name(ts_precision_dtype(a->prec)), ts_cpu_gemm_library(), ips, 1e3 * dt / (double)a->steps,
               (long long)a->steps);
}

static int bench_train(int argc, char **argv) {
    bench_args a = {.model = "cnn", .device = "cpu", .algo = TS_CONV_AUTO, .prec = TS_PRECISION_FP32, .steps = 100,
                    .batch = 64, .warmup = 10};
    int rc = bench_train_flags(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    if (a.threads > 0) ts_set_num_threads((int)a.threads);
    ts_set_conv_algo(a.algo);
    ts_model_desc md;
    ts_rng rng;
    ts_rng_seed(&rng, 0);
    ts_module *model = NULL;
    ts_device *dev = NULL;
    if (ts_precision_apply(a.prec) != TS_OK || ts_model_new(a.model, a.classes, &rng, &model) != TS_OK ||
        !ts_model_info(a.model, &md) || ts_device_get(a.device, &dev) != TS_OK) {
        fprintf(stderr, "tessera bench train: %s\n", ts_last_error());
        ts_module_free(model);
        return CLI_EXIT_USAGE;
    }
    ts_strategy *strat = NULL;
    ts_optimizer *opt = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_tensor *xs[NBATCHES] = {0}, *ys[NBATCHES] = {0};
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT; /* the model on dev */
    so.devices = &dev;
    so.num_devices = 1;
    float loss = 0;
    int status = 1;
    if (ts_strategy_new(model, &so, &strat) != TS_OK || ts_module_parameters(model, &params) != TS_OK ||
        ts_optimizer_by_kind(TS_OPTIMIZER_SGD, &params, 0.05, 0.9, 5e-4, &opt) != TS_OK ||
        make_batches(&a, &md, dev, &rng, xs, ys) != TS_OK)
        goto done;
    ts_module_train(model, true);
    double t0 = 0;
    for (int64_t i = 0; i < a.warmup + a.steps; i++) {
        if (i == a.warmup) t0 = ts_time_now();
        if (ts_train_step(strat, opt, xs[i % NBATCHES], ys[i % NBATCHES], 0, &loss) != TS_OK) goto done;
    }
    if (ts_device_synchronize(dev) != TS_OK) goto done;
    print_train(&a, dev, md.fixed_size ? md.image_size : a.image_size ? a.image_size : md.image_size,
                ts_time_now() - t0, loss);
    status = 0;
done:
    if (status) fprintf(stderr, "tessera bench train: %s\n", ts_last_error());
    for (int i = 0; i < NBATCHES; i++) {
        ts_tensor_release(xs[i]);
        ts_tensor_release(ys[i]);
    }
    ts_tensor_list_clear(&params);
    ts_optimizer_free(opt);
    ts_strategy_free(strat);
    return status;
}

/* ---- the physical limit: FMA throughput of one thread, measured ---------------------------------------- */
/* 16 independent accumulator chains (latency x pipes of any current core) of `iters` FMAs each. The targets
 * are per function: the binary assumes no ISA, and each kernel runs only where cpuid has it. */
#define PEAK_CHAINS 16
__attribute__((target("avx2,fma"))) static double peak_avx2(int64_t iters) {
    __m256 acc[PEAK_CHAINS], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-6f);
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
    double t0 = ts_time_now();
    for (int64_t k = 0; k < iters; k++)
        for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    double dt = ts_time_now() - t0;
    float sink = 0;
    for (int i = 0; i < PEAK_CHAINS; i++) sink += _mm256_cvtss_f32(acc[i]);
    return sink == 12345.0f ? 0 : (double)iters * PEAK_CHAINS * 8 * 2 / dt / 1e9;
}

__attribute__((target("avx512f"))) static double peak_avx512(int64_t iters) {
    __m512 acc[PEAK_CHAINS], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
    double t0 = ts_time_now();
    for (int64_t k = 0; k < iters; k++)
        for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    double dt = ts_time_now() - t0;
    float sink = 0;
    for (int i = 0; i < PEAK_CHAINS; i++) sink += _mm512_reduce_add_ps(acc[i]);
    return sink == 12345.0f ? 0 : (double)iters * PEAK_CHAINS * 16 * 2 / dt / 1e9;
}

/* vdpbf16ps: 16 lanes x 2 bfloat16 products each, accumulated in float32 (4 flops per lane) */
__attribute__((target("avx512f,avx512bf16"))) static double peak_bf16(int64_t iters) {
    __m512 acc[PEAK_CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
    double t0 = ts_time_now();
    for (int64_t k = 0; k < iters; k++)
        for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    double dt = ts_time_now() - t0;
    float sink = 0;
    for (int i = 0; i < PEAK_CHAINS; i++) sink += _mm512_reduce_add_ps(acc[i]);
    return sink == 12345.0f ? 0 : (double)iters * PEAK_CHAINS * 16 * 4 / dt / 1e9;
}

/* Best of 5 runs of ~50 ms, for each thread of an OpenMP team of `threads` (the sum over threads). */
static double peak_of(double (*fn)(int64_t), int threads) {
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
        sum += fn(4000000);
        best = sum > best ? sum : best;
    }
    return best;
}

/* C = A B of n x n float32 matrices through ts_matmul: the best of `reps` GFLOP/s. */
static ts_status time_matmul(const ts_tensor *a, const ts_tensor *b, int64_t n, int64_t reps, double *gflops) {
    double best = 1e30;
    for (int64_t r = 0; r <= reps; r++) { /* the first is a warm-up */
        ts_tensor *c = NULL;
        double t0 = ts_time_now();
        ts_status st = ts_matmul(a, b, &c);
        if (st != TS_OK) return st;
        double dt = ts_time_now() - t0;
        ts_tensor_release(c);
        if (r > 0 && dt < best) best = dt;
    }
    *gflops = 2.0 * (double)n * (double)n * (double)n / best / 1e9;
    return TS_OK;
}

/* The GEMM rates of this CPU: OpenBLAS's and oneDNN's float32, bfloat16 precision, and the FMA peaks. */
static int bench_gemm(int argc, char **argv) {
    int64_t n = 1024, threads = 0, reps = 10;
    bool json = false;
    const cli_flag flags[] = {
        {"size", CLI_INT, &n, "matrix side", 16, 16384},
        {"threads", CLI_INT, &threads, "CPU threads (0: all)", 0, 4096},
        {"reps", CLI_INT, &reps, "timed products (the best counts)", 1, 1e6},
        {"json", CLI_BOOL, &json, "print one JSON object", 1, 0},
    };
    const cli_command cmd = {"bench gemm", "tessera bench gemm [flags]",
                             "GEMM rates (2 n^3 flops per product) through Tessera's matmul — float32 through OpenBLAS\n"
                             "and through oneDNN, and bfloat16 precision (--precision bf16) — beside the FMA peak of the\n"
                             "same threads measured in the same run (AVX2, AVX-512 and AVX512_BF16 dot products, where\n"
                             "the CPU has them): the limits the training benchmarks are compared to.",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (threads > 0) ts_set_num_threads((int)threads);
    const int nt = ts_get_num_threads();
    ts_rng rng;
    ts_rng_seed(&rng, 0);
    ts_tensor *a = NULL, *b = NULL;
    int64_t shape[2] = {n, n};
    const char *saved_lib = ts_cpu_gemm_library();
    ts_dtype saved_prec = ts_get_matmul_precision();
    double openblas = 0, onednn = 0, bf16 = 0;
    if (ts_tensor_empty(NULL, TS_F32, 2, shape, &a) != TS_OK || ts_tensor_normal_(a, 0, 1, &rng) != TS_OK ||
        ts_tensor_empty(NULL, TS_F32, 2, shape, &b) != TS_OK || ts_tensor_normal_(b, 0, 1, &rng) != TS_OK ||
        ts_set_matmul_precision(TS_F32) != TS_OK || ts_set_cpu_gemm_library("openblas") != TS_OK ||
        time_matmul(a, b, n, reps, &openblas) != TS_OK)
        goto fail;
    bool have_dnnl = ts_set_cpu_gemm_library("onednn") == TS_OK;
    if (have_dnnl && time_matmul(a, b, n, reps, &onednn) != TS_OK) goto fail;
    if (ts_set_matmul_precision(TS_BF16) != TS_OK || time_matmul(a, b, n, reps, &bf16) != TS_OK) goto fail;
    ts_set_matmul_precision(saved_prec);
    ts_set_cpu_gemm_library(saved_lib);
    __builtin_cpu_init();
    double p2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? peak_of(peak_avx2, nt) : 0;
    double p512 = __builtin_cpu_supports("avx512f") ? peak_of(peak_avx512, nt) : 0;
    double pbf = __builtin_cpu_supports("avx512bf16") ? peak_of(peak_bf16, nt) : 0;
    double peak = p512 > p2 ? p512 : p2;
    if (json)
        printf("{\"framework\": \"tessera\", \"size\": %lld, \"threads\": %d, \"openblas_gflops\": %.2f, "
               "\"onednn_gflops\": %.2f, \"bf16_gflops\": %.2f, \"gflops\": %.2f, \"fma_peak_avx2\": %.2f, "
               "\"fma_peak_avx512\": %.2f, \"bf16_peak\": %.2f}\n",
               (long long)n, nt, openblas, onednn, bf16, have_dnnl ? onednn : openblas, p2, p512, pbf);
    else {
        printf("gemm %lld x %lld x %lld, %d thread%s (GFLOP/s, best of %lld):\n", (long long)n, (long long)n,
               (long long)n, nt, nt == 1 ? "" : "s", (long long)reps);
        printf("  float32, OpenBLAS       %8.1f  (%.0f%% of the FMA peak)\n", openblas, peak > 0 ? 100 * openblas / peak : 0);
        if (have_dnnl)
            printf("  float32, oneDNN         %8.1f  (%.0f%% of the FMA peak)\n", onednn, peak > 0 ? 100 * onednn / peak : 0);
        printf("  bfloat16 precision      %8.1f  (%.2fx float32%s)\n", bf16, bf16 / (have_dnnl ? onednn : openblas),
               pbf > 0 ? "" : "; no AVX512_BF16 here");
        printf("  FMA peak: AVX2 %.1f, AVX-512 %.1f, AVX512_BF16 dot products %.1f (0: not on this CPU)\n", p2, p512, pbf);
    }
    ts_tensor_release(a);
    ts_tensor_release(b);
    return 0;
fail:
    fprintf(stderr, "tessera bench gemm: %s\n", ts_last_error());
    ts_set_matmul_precision(saved_prec);
    ts_tensor_release(a);
    ts_tensor_release(b);
    return 1;
}

int ts_cmd_bench(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: tessera bench WHAT [flags]\n\n  train    training throughput of a zoo model "
                   "(images/s)\n  allreduce  all-reduce time, algbw and busbw from 8 B to 256 MiB (nccl-tests style)"
                   "\n  loader   images/s of the input pipeline (decode + augment) beside raw libjpeg-turbo decoding"
                   "\n  gemm     sgemm GFLOP/s of this CPU (the peak training figures are compared to)"
                   "\n\n'tessera bench WHAT --help' lists the flags.\n");
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "train") == 0) return bench_train(argc - 1, argv + 1);
    if (strcmp(argv[1], "allreduce") == 0) return ts_bench_allreduce(argc - 1, argv + 1);
    if (strcmp(argv[1], "loader") == 0) return ts_bench_loader(argc - 1, argv + 1);
    if (strcmp(argv[1], "gemm") == 0) return bench_gemm(argc - 1, argv + 1);
    fprintf(stderr, "tessera bench: unknown benchmark '%s' (available: train, allreduce, loader, gemm)\n", argv[1]);
    return CLI_EXIT_USAGE;
}
