/*
 * tools/cmd_train.c — `tessera train`: flags in, progress out. The flags are the
 * fields of the library's ts_run_config (tessera/run.h; --image-size sets
 * image_size), which checks them (ts_run_config_check) and builds the run
 * (ts_run_open: process group, data, model, strategy, optimizer and schedule,
 * precision, trainer, resume); this file parses, prints the banner, the
 * progress bar and the summary, and starts the processes of --nproc N.
 *
 * Without a launcher this is the world of one (the distributed sampler's order
 * for rank 0 of 1), so `--batch-size 64` here and `--nproc 2 --batch-size 32`
 * train on the same samples in every step. Under a launcher whose world has more
 * than one process (torchrun, tessera run, mpirun, srun, mpiexec) every process
 * is one DDP rank of that job; rank 0 alone evaluates, prints and writes
 * checkpoints.
 */
#include "cli.h"
#include "commands.h"
#include "core/json.h"

#include "tessera.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct train_args {
    ts_run_config c;
    bool quiet, print_config;
    const char *metrics_json, *config;
    cli_progress bar; /* what the trainer's callback draws */
} train_args;


#define SUMMARY                                                                                                     \
    "Trains a model on Fashion-MNIST (or any MNIST-format IDX data set, or an image folder), prints\n"             \
    "the test accuracy (top-1, top-5) after every epoch and saves checkpoints. The reference CNN is\n"            \
    "conv(1->32,3x3)-BN-ReLU-maxpool -> conv(32->64,3x3)-BN-ReLU-maxpool -> linear(3136->128)-ReLU -> linear(128->10).\n" \
    "ResNets read RGB images at --image-size: random-resized-crop + flip for training, the central 0.875\n"       \
    "window for evaluation, ImageNet's normalisation; the output layer has one class per sub-folder.\n"           \
    "Each flag is a field of the library's ts_run_config (--image-size: image_size); --config FILE reads\n"       \
    "`field = value` lines (what --print-config writes), flags on the command line win."

#define TRAIN_MAX_FLAGS 64

/* The command's flags: its own, then one per field of the run config (the library's table, ts_run_fields),
 * then the config's name of --schedule (what --print-config writes) as a hidden alias. */
static int train_flags(train_args *a, cli_flag *flags, cli_enum *enums) {
    int nf = 0, k = 0;
    const ts_run_field *rf = ts_run_fields(&nf);
    flags[k++] = (cli_flag){"config", CLI_STRING, &a->config, "read `field = value` lines (the fields are these flags' names) from this file first; the command line wins", 1, 0};
    flags[k++] = (cli_flag){"print-config", CLI_BOOL, &a->print_config, "print the configuration as `field = value` lines (what --config reads) and exit", 1, 0};
    flags[k++] = (cli_flag){"metrics-json", CLI_STRING, &a->metrics_json, "write final metrics to this JSON file", 1, 0};
    flags[k++] = (cli_flag){"quiet", CLI_BOOL, &a->quiet, "no progress bar", 1, 0};
    static const cli_type types[] = {[TS_RUN_FIELD_INT] = CLI_INT, [TS_RUN_FIELD_FLOAT] = CLI_FLOAT,
                                     [TS_RUN_FIELD_STRING] = CLI_STRING, [TS_RUN_FIELD_BOOL] = CLI_BOOL,
                                     [TS_RUN_FIELD_ENUM] = CLI_ENUM};
    for (int i = 0; i < nf && k < TRAIN_MAX_FLAGS - 1; i++) {
        void *field = (char *)&a->c + rf[i].offset;
        void *ptr = field;
        if (rf[i].kind == TS_RUN_FIELD_ENUM) {
            enums[i] = (cli_enum){field, rf[i].value_name};
            ptr = &enums[i];
        }
        flags[k++] = (cli_flag){rf[i].flag, types[rf[i].kind], ptr, rf[i].help, rf[i].min, rf[i].max};
        if (rf[i].offset == offsetof(ts_run_config, pp_schedule))
            flags[k++] = (cli_flag){"pp-schedule", CLI_ENUM, ptr, NULL, rf[i].min, rf[i].max};
    }
    return k;
}

/* The flags, the config file and the command line into a; *cfg_buf holds the file's strings (free it). */
static int parse(int argc, char **argv, train_args *a, char **cfg_buf) {
    cli_flag flags[TRAIN_MAX_FLAGS];
    cli_enum enums[TRAIN_MAX_FLAGS];
    const cli_command cmd = {"train", "tessera train [flags]", SUMMARY, flags, train_flags(a, flags, enums)};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc == 0 && a->config && (rc = cli_load_config(&cmd, a->config, cfg_buf)) == 0)
        rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL); /* the command line wins */
    if (rc == 0 && ts_run_config_check(&a->c) != TS_OK) return cli_usage_error(&cmd, "%s", ts_last_error());
    if (rc == 0 && a->print_config) {
        static const char *const skip[] = {"config", "print-config", "schedule", NULL}; /* pp_schedule instead */
        cli_print_config(&cmd, stdout, skip);
        return 1;
    }
    return rc;
}

/* Progress bar and epoch lines on rank 0. */
static ts_status on_event(const ts_train_event *ev, void *user) {
    train_args *a = user;
    if (ev->rank != 0) return TS_OK;
    char prefix[64], suffix[128], rate[32];
    bool tokens = ev->epoch_tokens > 0; /* token data: tokens/s and validation loss, not images and accuracy */
    double ips = ev->epoch_seconds > 0 ? (double)ev->epoch_images / ev->epoch_seconds : 0.0;
    double tps = ev->epoch_seconds > 0 ? (double)ev->epoch_tokens / ev->epoch_seconds : 0.0;
    snprintf(rate, sizeof rate, tokens ? "%.0f tok/s" : "%.0f img/s", tokens ? tps : ips);
    snprintf(prefix, sizeof prefix, "epoch %lld/%lld", (long long)ev->epoch + 1, (long long)ev->epochs);
    if (ev->kind == TS_TRAIN_STEP && !a->quiet) {
        snprintf(suffix, sizeof suffix, "loss %.4f  %s  lr %.4g", ev->mean_loss, rate, ev->lr);
        cli_progress_update(&a->bar, prefix, ev->batch, ev->num_batches, suffix, false);
    } else if (ev->kind == TS_TRAIN_EVAL && ev->eval) {
        snprintf(suffix, sizeof suffix, "loss %.4f  %s  lr %.4g", ev->mean_loss, rate, ev->lr);
        if (!a->quiet) cli_progress_update(&a->bar, prefix, ev->batch, ev->num_batches, suffix, true);
        printf("step %lld: train loss %.4f (last step %.4f), %s %.4f, %s\n", (long long)ev->step, ev->mean_loss,
               ev->loss, tokens ? "val loss" : "test loss", ev->eval->loss, rate);
    } else if (ev->kind == TS_TRAIN_EPOCH_END) {
        if (!a->quiet && isfinite(ev->mean_loss)) {
            snprintf(suffix, sizeof suffix, "loss %.4f  %s", ev->mean_loss, rate);
            cli_progress_update(&a->bar, prefix, ev->batch, ev->num_batches, suffix, true);
        }
        if (ev->eval && tokens)
            printf("epoch %lld/%lld: train loss %.4f, val loss %.4f (%.3f bits/token, %lld tokens), %.1f s, %.0f "
                   "tokens/s\n", (long long)ev->epoch + 1, (long long)ev->epochs, ev->mean_loss, ev->eval->loss,
                   ev->eval->loss / log(2.0), (long long)ev->eval->samples, ev->epoch_seconds, tps);
        else if (ev->eval)
            printf("epoch %lld/%lld: train loss %.4f, test accuracy %.2f%%, top-5 %.2f%%, test loss %.4f (%lld "
                   "images), %.1f s, %.0f images/s\n",
                   (long long)ev->epoch + 1, (long long)ev->epochs, ev->mean_loss, 100.0 * ev->eval->accuracy,
                   100.0 * ev->eval->top5_accuracy, ev->eval->loss, (long long)ev->eval->samples, ev->epoch_seconds,
                   ips);
    } else if (ev->kind == TS_TRAIN_CHECKPOINT) {
        char esc[1024];
        printf("saved checkpoint to %s (epoch %lld, step %lld)\n", cli_printable(ev->checkpoint, esc, sizeof esc),
               (long long)ev->epoch + 1, (long long)ev->step);
    }
    fflush(stdout);
    return TS_OK;
}

/* ", on cuda:0" or ", --strategy data over cpu:0, cpu:1" */
static void print_placement(ts_strategy *s) {
    ts_device *devs[TS_MAX_CPU_DEVICES + 1];
    int ndev = ts_strategy_devices(s, devs, TS_MAX_CPU_DEVICES + 1);
    ts_strategy_kind kind = ts_strategy_kind_of(s);
    if (kind == TS_STRATEGY_NONE || kind == TS_STRATEGY_DDP) { /* one device per process */
        if (ndev == 1 && devs[0] != ts_device_cpu()) printf(", on %s", ts_device_name(devs[0]));
        return;
    }
    if (ndev <= 0) return;
    char desc[512];
    ts_strategy_describe(s, desc, sizeof desc);
    ts_log(TS_LOG_INFO, "%s", desc);
    printf(", --strategy %s over", ts_strategy_kind_name(kind));
    for (int i = 0; i < ndev && i < TS_MAX_CPU_DEVICES + 1; i++) printf("%s %s", i ? "," : "", ts_device_name(devs[i]));
}

static void print_banner(ts_run *run) {
    const ts_run_config *c = ts_run_config_of(run);
    ts_strategy *s = ts_run_strategy(run);
    ts_batch_source *train = ts_run_train_source(run);
    int world = ts_run_world_size(run);
    bool ddp = ts_strategy_kind_of(s) == TS_STRATEGY_DDP;
    ts_train_checkpoint_info ck;
    const char *resumed = ts_run_resumed(run, &ck);
    if (ts_run_initialised(run))
        printf("initialised %s from %s%s%s\n", c->model, c->init_from, c->init_exclude ? " except " : "",
               c->init_exclude ? c->init_exclude : "");
    char esc[1024];
    if (resumed)
        printf("resumed from %s at epoch %lld, batch %lld (step %lld)\n", cli_printable(resumed, esc, sizeof esc),
               (long long)ck.epoch + 1, (long long)ck.batch, (long long)ck.step);
    if (c->seq_len > 0 && ts_data_is_tokens(c->data))
        printf("training %s (%lld layers, %lld heads, %lld wide, context %lld, %lld tokens) on %s: %lld batches of "
               "%lld x %lld tokens per epoch", c->model, (long long)c->n_layer, (long long)c->n_head,
               (long long)c->n_embd, (long long)c->seq_len, (long long)c->vocab_size, c->data,
               (long long)ts_batch_source_num_batches(train, 0), (long long)c->batch_size, (long long)c->seq_len);
    else
        printf("training %s on %s: %lld images, %lld batches of %lld per epoch", c->model, c->data,
               (long long)ts_batch_source_num_samples(train), (long long)ts_batch_source_num_batches(train, 0),
               (long long)c->batch_size);
    if (ddp) printf(" per rank, %d ranks (DDP)", world);
    print_placement(s);
    printf(", %lld parameters, %d threads%s\n", (long long)ts_module_num_parameters(ts_strategy_model(s)),
           ts_get_num_threads(), ddp ? " per rank" : "");
    if (ddp && c->sync_bn) printf("--sync-bn: BatchNorm2d layers are SyncBatchNorm over all %d ranks\n", world);
    if (c->activation_checkpointing)
        printf("--activation-checkpointing: each block keeps only its input and runs its forward again in backward\n");
    if (ddp && c->ddp_comm == TS_PRECISION_BF16) printf("--ddp-comm bf16: gradient buckets are all-reduced in bfloat16\n");
    if (c->precision == TS_PRECISION_FP16)
        printf("--precision fp16: matmul and convolution operands rounded to float16, float32 accumulation, dynamic "
               "loss scaling from %g\n", c->loss_scale);
    ts_device *dev0 = NULL;
    bool on_cuda = ts_strategy_devices(s, &dev0, 1) >= 1 && ts_device_type_of(dev0) == TS_DEVICE_CUDA;
    if (c->precision == TS_PRECISION_BF16)
        printf("--precision bf16: matmuls and convolutions in bfloat16 with float32 accumulation (%s)%s\n",
               on_cuda ? "cuBLAS, cuDNN" : ts_cpu_gemm_library(),
               ts_get_autocast() == TS_BF16 ? "; autocast: bfloat16 activations between layers" : "");
    if (c->accum_steps > 1)
        printf("--accum-steps %lld: one optimizer step per %lld batches (%lld images%s)\n", (long long)c->accum_steps,
               (long long)c->accum_steps, (long long)(c->accum_steps * c->batch_size * world), world > 1 ? " over all ranks" : "");
    fflush(stdout);
}

static int write_metrics(const char *path, ts_run *run, const ts_train_result *r) {
    const ts_run_config *c = ts_run_config_of(run);
    ts_outfile *o = NULL;
    if (ts_outfile_open(path, "a metrics file", &o) != TS_OK) {
        fprintf(stderr, "tessera train: --metrics-json: %s\n", ts_last_error());
        return 1;
    }
    FILE *f = ts_outfile_stream(o);
    const char *base = strrchr(c->data, '/');
    fputs("{\n  \"model\": ", f);
    ts__json_put_string(f, c->model);
    fprintf(f,
            ",\n  \"test_accuracy\": %.6f,\n  \"images_per_second\": %.1f,\n"
            "  \"epochs\": %lld,\n  \"steps\": %lld,\n  \"final_loss\": %.6f,\n  \"train_seconds\": %.3f,\n"
            "  \"threads\": %d,\n  \"batch_size\": %lld,\n  \"processes\": %d,\n  \"data\": ",
            r->eval.accuracy, r->images_per_second, (long long)r->epochs, (long long)r->steps,
            isfinite(r->final_loss) ? r->final_loss : -1.0, r->train_seconds, ts_get_num_threads(),
            (long long)c->batch_size, ts_run_world_size(run));
    ts__json_put_string(f, base ? base + 1 : c->data);
    fprintf(f, ",\n  \"eval_loss\": %.6f,\n  \"tokens_per_second\": %.1f", isfinite(r->eval.loss) ? r->eval.loss : -1.0,
            r->tokens_per_second);
    fprintf(f, ",\n  \"precision\": \"%s\",\n  \"accum_steps\": %lld,\n  \"ddp_comm\": \"%s\",\n  \"skipped_samples\": %lld\n}\n",
            ts_dtype_name(ts_precision_dtype(c->precision)), (long long)c->accum_steps,
            ts_dtype_name(ts_precision_dtype(c->ddp_comm)), (long long)r->skipped_samples);
    if (ts_outfile_close(o) != TS_OK) {
        fprintf(stderr, "tessera train: --metrics-json: %s\n", ts_last_error());
        return 1;
    }
    return 0;
}

/* After training: rank 0's summary (and the metrics file); any rank's corrupt-file count. */
static int print_summary(ts_run *run, const train_args *a, const ts_train_result *r) {
    const ts_run_config *c = ts_run_config_of(run);
    if (r->skipped_samples > 0)
        printf("--skip-corrupt: %lld training image%s left out as corrupt%s (named in the warnings above)\n",
               (long long)r->skipped_samples, r->skipped_samples == 1 ? "" : "s",
               ts_run_world_size(run) > 1 ? " in this rank's shard" : "");
    if (ts_run_rank(run) != 0) return 0;
    if (r->tokens > 0)
        printf("done: %lld steps, val loss %.4f, %.0f tokens/s, %.1f s training\n", (long long)r->steps, r->eval.loss,
               r->tokens_per_second, r->train_seconds);
    else
        printf("done: %lld steps, test accuracy %.2f%%, %.0f images/s, %.1f s training\n", (long long)r->steps,
               100.0 * r->eval.accuracy, r->images_per_second, r->train_seconds);
    if (c->precision == TS_PRECISION_FP16)
        printf("loss scaling: %lld step%s skipped for inf/NaN gradients, scale now %g\n", (long long)r->skipped_steps,
               r->skipped_steps == 1 ? "" : "s", (double)r->loss_scale);
    return a->metrics_json ? write_metrics(a->metrics_json, run, r) : 0;
}

/* `tessera train --nproc N` outside a launcher: N copies of this command through `tessera run` (RANK,
 * WORLD_SIZE, MASTER_ADDR, ... set), or through mpirun for the MPI backend, whose ranks are MPI_COMM_WORLD's. */
static int relaunch(int argc, char **argv, int nproc, bool mpi) {
    char exe[4096], nbuf[32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "tessera train: cannot find the tessera executable: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = '\0';
    snprintf(nbuf, sizeof nbuf, "%d", nproc);
    char **rargv = calloc((size_t)argc + 8, sizeof *rargv);
    if (!rargv) return 1;
    int k = 0;
    if (mpi) {
        rargv[k++] = "mpirun";
        if (geteuid() == 0) rargv[k++] = "--allow-run-as-root";
        rargv[k++] = "--oversubscribe"; /* like tessera run: any N on this machine */
    } else {
        rargv[k++] = "run";
    }
    rargv[k++] = "-n";
    rargv[k++] = nbuf;
    if (!mpi) rargv[k++] = "--";
    rargv[k++] = exe;
    for (int i = 0; i < argc; i++) rargv[k++] = argv[i]; /* "train" and its flags */
    if (!mpi) {
        int rc = ts_cmd_run(k, rargv);
        free(rargv);
        return rc;
    }
    fflush(NULL);
    execvp("mpirun", rargv);
    fprintf(stderr, "tessera train: --backend mpi --nproc %d: cannot run mpirun: %s (install openmpi-bin, or run "
                    "under mpirun -n N yourself)\n", nproc, strerror(errno));
    free(rargv);
    return 1;
}

int ts_cmd_train(int argc, char **argv) {
    train_args a = {.c = TS_RUN_CONFIG_INIT};
    a.c.callback = on_event;
    a.c.user = &a;
    char *cfg_buf = NULL;
    int rc = parse(argc, argv, &a, &cfg_buf);
    int nproc = rc == 0 ? ts_run_processes_to_start(&a.c) : 0;
    if (rc != 0 || nproc > 0) {
        if (nproc > 0) rc = relaunch(argc, argv, nproc, a.c.backend == TS_RUN_BACKEND_MPI);
        free(cfg_buf);
        return rc == 1 && nproc == 0 ? 0 : rc; /* 1 from parse: --help or --print-config */
    }
    cli_progress_init(&a.bar);
    ts_run *run = NULL;
    ts_status st = a.metrics_json ? ts_outfile_check(a.metrics_json, "a metrics file") : TS_OK; /* before training */
    if (st != TS_OK) {
        fprintf(stderr, "tessera train: --metrics-json: %s\n", ts_last_error());
        free(cfg_buf);
        return CLI_EXIT_USAGE;
    }
    st = ts_run_open(&a.c, &run);
    if (st != TS_OK) {
        fprintf(stderr, "tessera train: %s\n", ts_last_error());
        free(cfg_buf);
        return cli_exit_for(st);
    }
    if (ts_run_rank(run) == 0) print_banner(run);
    ts_train_result r;
    if (ts_run_train(run, &r) != TS_OK) {
        if (ts_run_world_size(run) > 1)
            fprintf(stderr, "\ntessera train: rank %d: %s\n", ts_run_rank(run), ts_last_error());
        else
            fprintf(stderr, "\ntessera train: %s\n", ts_last_error());
        rc = 1;
    } else {
        rc = print_summary(run, &a, &r);
    }
    ts_run_free(run);
    free(cfg_buf);
    return rc;
}
