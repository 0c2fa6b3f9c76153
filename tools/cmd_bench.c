/*
 * tools/cmd_bench.c — `tessera bench train`: training throughput of a model
 * on in-memory random batches (the loader is not timed), the Tessera half of
 * bench/train_vs_pytorch.sh and bench/resnet_vs_pytorch.sh; `tessera bench
 * gemm`: the sgemm rate the CPU reaches (the physical limit those compare to).
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <string.h>

#define NBATCHES 16

static int bench_train(int argc, char **argv) {
    const char *model_name = "cnn", *conv_algo = "auto", *precision = "fp32";
    int64_t threads = 0, steps = 100, batch = 64, warmup = 10, image_size = 0, classes = 0;
    bool json = false;
    const cli_flag flags[] = {
        {"model", CLI_STRING, &model_name, "a zoo model: cnn, mlp, resnet18, resnet34, resnet50, ...", 1, 0},
        {"image-size", CLI_INT, &image_size, "ResNets: the input's side (default 224)", 0, 4096},
        {"classes", CLI_INT, &classes, "output classes (0: the model's default: 10, or 1000 for ResNets)", 0, 1 << 20},
        {"threads", CLI_INT, &threads, "CPU threads (0: all)", 0, 4096},
        {"conv-algo", CLI_STRING, &conv_algo, "convolutions: auto, im2col, winograd, winograd-f2, winograd-f4 or onednn", 1, 0},
        {"precision", CLI_STRING, &precision, "matmul/conv precision: fp32 or bf16 (operands rounded to bfloat16, float32 accumulation)", 1, 0},
        {"steps", CLI_INT, &steps, "timed steps", 1, 1e9},
        {"warmup", CLI_INT, &warmup, "untimed steps first", 0, 1e9},
        {"batch-size", CLI_INT, &batch, "images per step", 1, 1 << 20},
        {"json", CLI_BOOL, &json, "print one JSON object", 1, 0},
    };
    const cli_command cmd = {"bench train", "tessera bench train [flags]",
                             "Times training steps (forward, cross-entropy, backward, SGD with momentum 0.9,\n"
                             "weight decay 5e-4) of a model on random in-memory batches.",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (threads > 0) ts_set_num_threads((int)threads);
    ts_conv_algo algo;
    if (ts_conv_algo_parse(conv_algo, &algo) != TS_OK) return cli_usage_error(&cmd, "--conv-algo: %s", ts_last_error());
    ts_set_conv_algo(algo);
    ts_dtype prec;
    if (ts_dtype_parse(precision, &prec) != TS_OK || ts_set_matmul_precision(prec) != TS_OK)
        return cli_usage_error(&cmd, "--precision '%s': expected fp32 or bf16", precision);

    ts_rng rng;
    ts_rng_seed(&rng, 0);
    ts_module *model = NULL;
    ts_strategy *strat = NULL;
    ts_optimizer *opt = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_tensor *xs[NBATCHES] = {0}, *ys[NBATCHES] = {0};
    int status = 1;
    ts_model_desc md;
    if (ts_model_info(model_name, &md) && md.fixed_size && image_size && image_size != md.image_size)
        return cli_usage_error(&cmd, "--image-size %lld: --model %s takes %dx%d images only", (long long)image_size,
                               model_name, md.image_size, md.image_size);
    if (ts_model_new(model_name, classes, &rng, &model) != TS_OK) {
        fprintf(stderr, "tessera bench train: --model: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT; /* the model on the CPU */
    if (ts_strategy_new(model, &so, &strat) != TS_OK || ts_module_parameters(model, &params) != TS_OK ||
        ts_optimizer_by_name("sgd", &params, 0.05, 0.9, 5e-4, &opt) != TS_OK)
        goto fail;
    int64_t side = md.fixed_size ? md.image_size : image_size ? image_size : md.image_size;
    int64_t ncls = classes ? classes : md.num_classes;
    for (int i = 0; i < NBATCHES; i++) {
        int64_t xs_shape[4] = {batch, md.in_channels, side, side};
        if (ts_tensor_empty(NULL, TS_F32, 4, xs_shape, &xs[i]) != TS_OK || ts_tensor_normal_(xs[i], 0, 1, &rng) != TS_OK ||
            ts_tensor_empty(NULL, TS_I64, 1, &batch, &ys[i]) != TS_OK)
            goto fail;
        int64_t *y = ts_tensor_data(ys[i]);
        for (int64_t k = 0; k < batch; k++) y[k] = (int64_t)ts_rng_below(&rng, (uint64_t)ncls);
    }
    ts_module_train(model, true);
    float loss = 0;
    for (int64_t i = 0; i < warmup; i++)
        if (ts_train_step(strat, opt, xs[i % NBATCHES], ys[i % NBATCHES], 0, &loss) != TS_OK) goto fail;
    double t0 = ts_time_now();
    for (int64_t i = 0; i < steps; i++)
        if (ts_train_step(strat, opt, xs[i % NBATCHES], ys[i % NBATCHES], 0, &loss) != TS_OK) goto fail;
    double dt = ts_time_now() - t0, ips = (double)(steps * batch) / dt;
    if (json)
        printf("{\"framework\": \"tessera\", \"model\": \"%s\", \"image_size\": %lld, \"threads\": %d, "
               "\"conv_algo\": \"%s\", \"precision\": \"%s\", \"gemm\": \"%s\", \"batch_size\": %lld, \"steps\": %lld, "
               "\"seconds\": %.4f, \"images_per_second\": %.1f, \"final_loss\": %.5f}\n",
               model_name, (long long)side, ts_get_num_threads(), ts_conv_algo_name(algo), ts_dtype_name(prec),
               ts_cpu_gemm_library(), (long long)batch, (long long)steps, dt, ips, loss);
    else
        printf("%s, batch %lld, %d threads, conv %s, %s (%s): %.1f images/s (%.2f ms/step over %lld steps)\n",
               model_name, (long long)batch, ts_get_num_threads(), ts_conv_algo_name(algo), ts_dtype_name(prec),
               ts_cpu_gemm_library(), ips, 1e3 * dt / (double)steps, (long long)steps);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "tessera bench train: %s\n", ts_last_error());
done:
    for (int i = 0; i < NBATCHES; i++) {
        ts_tensor_release(xs[i]);
        ts_tensor_release(ys[i]);
    }
    ts_tensor_list_clear(&params);
    ts_optimizer_free(opt);
    ts_strategy_free(strat);
    return status;
}

/* sgemm C = A B of n x n float32 matrices through ts_matmul (OpenBLAS): the best of `reps` GFLOP/s. */
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
                             "The sgemm rate (2 n^3 flops per product) of the CPU through Tessera's matmul: the peak\n"
                             "a training benchmark's GFLOP/s is compared to.",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (threads > 0) ts_set_num_threads((int)threads);
    ts_rng rng;
    ts_rng_seed(&rng, 0);
    ts_tensor *a = NULL, *b = NULL, *c = NULL;
    int64_t shape[2] = {n, n};
    double best = 1e30;
    if (ts_tensor_empty(NULL, TS_F32, 2, shape, &a) != TS_OK || ts_tensor_normal_(a, 0, 1, &rng) != TS_OK ||
        ts_tensor_empty(NULL, TS_F32, 2, shape, &b) != TS_OK || ts_tensor_normal_(b, 0, 1, &rng) != TS_OK)
        goto fail;
    for (int64_t r = 0; r <= reps; r++) { /* the first is a warm-up */
        double t0 = ts_time_now();
        if (ts_matmul(a, b, &c) != TS_OK) goto fail;
        double dt = ts_time_now() - t0;
        ts_tensor_release(c);
        c = NULL;
        if (r > 0 && dt < best) best = dt;
    }
    double gflops = 2.0 * (double)n * (double)n * (double)n / best / 1e9;
    if (json)
        printf("{\"framework\": \"tessera\", \"size\": %lld, \"threads\": %d, \"seconds\": %.6f, \"gflops\": %.2f}\n",
               (long long)n, ts_get_num_threads(), best, gflops);
    else
        printf("sgemm %lld x %lld, %d threads: %.1f GFLOP/s (best of %lld)\n", (long long)n, (long long)n,
               ts_get_num_threads(), gflops, (long long)reps);
    ts_tensor_release(a);
    ts_tensor_release(b);
    return 0;
fail:
    fprintf(stderr, "tessera bench gemm: %s\n", ts_last_error());
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
