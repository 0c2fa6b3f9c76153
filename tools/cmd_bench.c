/*
 * tools/cmd_bench.c — `tessera bench train`: training throughput of a model
 * on in-memory random batches (the loader is not timed), the Tessera half of
 * bench/train_vs_pytorch.sh.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <string.h>

#define NBATCHES 16

static int bench_train(int argc, char **argv) {
    const char *model_name = "cnn";
    int64_t threads = 0, steps = 100, batch = 64, warmup = 10;
    bool json = false;
    const cli_flag flags[] = {
        {"model", CLI_STRING, &model_name, "cnn or mlp", 1, 0},
        {"threads", CLI_INT, &threads, "CPU threads (0: all)", 0, 4096},
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

    ts_rng rng;
    ts_rng_seed(&rng, 0);
    ts_module *model = NULL;
    ts_strategy *strat = NULL;
    ts_optimizer *opt = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_tensor *xs[NBATCHES] = {0}, *ys[NBATCHES] = {0};
    int status = 1;
    if (ts_model_by_name(model_name, &rng, &model) != TS_OK) {
        fprintf(stderr, "tessera bench train: --model: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT; /* the model on the CPU */
    if (ts_strategy_new(model, &so, &strat) != TS_OK || ts_module_parameters(model, &params) != TS_OK ||
        ts_optimizer_by_name("sgd", &params, 0.05, 0.9, 5e-4, &opt) != TS_OK)
        goto fail;
    for (int i = 0; i < NBATCHES; i++) {
        int64_t xs_shape[4] = {batch, 1, 28, 28};
        if (ts_tensor_empty(NULL, TS_F32, 4, xs_shape, &xs[i]) != TS_OK || ts_tensor_normal_(xs[i], 0, 1, &rng) != TS_OK ||
            ts_tensor_empty(NULL, TS_I64, 1, &batch, &ys[i]) != TS_OK)
            goto fail;
        int64_t *y = ts_tensor_data(ys[i]);
        for (int64_t k = 0; k < batch; k++) y[k] = (int64_t)ts_rng_below(&rng, 10);
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
        printf("{\"framework\": \"tessera\", \"model\": \"%s\", \"threads\": %d, \"batch_size\": %lld, \"steps\": %lld, "
               "\"seconds\": %.4f, \"images_per_second\": %.1f, \"final_loss\": %.5f}\n",
               model_name, ts_get_num_threads(), (long long)batch, (long long)steps, dt, ips, loss);
    else
        printf("%s, batch %lld, %d threads: %.1f images/s (%.2f ms/step over %lld steps)\n", model_name,
               (long long)batch, ts_get_num_threads(), ips, 1e3 * dt / (double)steps, (long long)steps);
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

int ts_cmd_bench(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: tessera bench WHAT [flags]\n\n  train    training throughput of the reference CNN "
                   "(images/s)\n  allreduce  all-reduce time, algbw and busbw from 8 B to 256 MiB (nccl-tests style)"
                   "\n  loader   images/s of the input pipeline (decode + augment) beside raw libjpeg-turbo decoding"
                   "\n\n'tessera bench WHAT --help' lists the flags.\n");
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "train") == 0) return bench_train(argc - 1, argv + 1);
    if (strcmp(argv[1], "allreduce") == 0) return ts_bench_allreduce(argc - 1, argv + 1);
    if (strcmp(argv[1], "loader") == 0) return ts_bench_loader(argc - 1, argv + 1);
    fprintf(stderr, "tessera bench: unknown benchmark '%s' (available: train, allreduce, loader)\n", argv[1]);
    return CLI_EXIT_USAGE;
}
