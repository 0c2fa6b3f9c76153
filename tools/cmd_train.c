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
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The flag table writes enum fields through an int. */
_Static_assert(sizeof(ts_precision) == sizeof(int) && sizeof(ts_strategy_kind) == sizeof(int) &&
                   sizeof(ts_optimizer_kind) == sizeof(int) && sizeof(ts_lr_kind) == sizeof(int),
               "enum fields must be int-sized");

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

/* The flags, the config file and the command line into a; *cfg_buf holds the file's strings (free it). */
static int parse(int argc, char **argv, train_args *a, char **cfg_buf) {
    ts_run_config *c = &a->c;
    const cli_flag flags[] = {
        {"config", CLI_STRING, &a->config, "read `field = value` lines (the fields are these flags' names) from this file first; the command line wins", 1, 0},
        {"print-config", CLI_BOOL, &a->print_config, "print the configuration as `field = value` lines (what --config reads) and exit", 1, 0},
        {"data", CLI_STRING, &c->data, "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz], or images: a folder with one sub-folder per class (or its train/ and val/ or test/), or a \"path label\" list", 1, 0},
        {"data-threads", CLI_INT, &c->data_threads, "worker threads decoding images (image --data only)", 1, 256},
        {"decode", CLI_ENUM, CLI_ENUM_OF(c->decode, cli_name_dec), "where the training images' JPEGs are decoded: cpu (the worker threads) or mixed (read and cropped on the workers, decoded by nvJPEG and resized on the --device GPU, DALI's device=\"mixed\"; PNGs and evaluation on the workers)", TS_DECODE_CPU, TS_DECODE_MIXED},
        {"skip-corrupt", CLI_BOOL, &c->skip_corrupt, "image --data: leave out files that do not decode (each named in a warning, counted in the summary) instead of stopping", 1, 0},
        {"model", CLI_STRING, &c->model, "cnn (the reference CNN; the default, or with --resume the checkpoint's), mlp, resnet18, resnet34, resnet50, resnet101 or resnet152 (torchvision's)", 1, 0},
        {"image-size", CLI_INT, &c->image_size, "ResNets: train on RGB crops of this side (64, 112, 224: the default); cnn and mlp take 28", 0, 4096},
        {"num-classes", CLI_INT, &c->num_classes, "outputs of the model's last layer (0: the data's classes; more keeps e.g. ImageNet's 1000 for --init-from)", 0, 1 << 20},
        {"epochs", CLI_INT, &c->epochs, "number of epochs", 1, 1e6},
        {"max-steps", CLI_INT, &c->max_steps, "the run's length in optimizer steps, when fewer than the epochs' (the learning-rate schedule spans them; 0: no limit)", 0, 1e12},
        {"batch-size", CLI_INT, &c->batch_size, "images per step (per rank with --nproc)", 1, 1 << 20},
        {"lr", CLI_FLOAT, &c->lr, "peak learning rate", 0, 1e3},
        {"momentum", CLI_FLOAT, &c->momentum, "SGD momentum", 0, 1},
        {"weight-decay", CLI_FLOAT, &c->weight_decay, "weight decay (SGD: L2; AdamW: decoupled)", 0, 1},
        {"optimizer", CLI_ENUM, CLI_ENUM_OF(c->optimizer, cli_name_opt), "sgd or adamw", 0, TS_OPTIMIZER_COUNT - 1},
        {"lr-schedule", CLI_ENUM, CLI_ENUM_OF(c->lr_schedule, cli_name_lr), "none, step (x0.1 every epoch) or cosine (to 0 over the run's steps)", TS_LR_CONSTANT, TS_LR_COSINE},
        {"label-smoothing", CLI_FLOAT, &c->label_smoothing, "cross-entropy label smoothing", 0, 1},
        {"warmup-steps", CLI_INT, &c->warmup_steps, "linear learning-rate warmup over the first N steps, from lr/3 (torch's LinearLR), then --lr-schedule over the rest", 0, 1e12},
        {"accum-steps", CLI_INT, &c->accum_steps, "gradient accumulation: one optimizer step per K batches of --batch-size (DDP all-reduces on the K-th only)", 1, 1 << 20},
        {"clip-grad-norm", CLI_FLOAT, &c->clip_grad_norm, "clip the gradients' global L2 norm to this before each step (0: off)", 0, 1e12},
        {"seed", CLI_INT, &c->seed, "seed for initialisation and shuffling", 0, 9.2e18},
        {"threads", CLI_INT, &c->threads, "CPU threads (0: OMP_NUM_THREADS or all cores)", 0, 4096},
        {"conv-algo", CLI_ENUM, CLI_ENUM_OF(c->conv_algo, cli_name_conv), "convolutions: auto (oneDNN's primitives where built, else Winograd F(2x2) for 3x3 stride-1 ones from 16 channels), winograd (adds F(4x4): faster, rounds more), im2col, winograd-f2, winograd-f4 or onednn", TS_CONV_AUTO, TS_CONV_ONEDNN},
        {"checkpoint", CLI_STRING, &c->checkpoint, "save model+optimizer after every epoch and at the end", 1, 0},
        {"checkpoint-dir", CLI_STRING, &c->checkpoint_dir, "save a new step-<N>.ckpt here each time; a run whose folder holds one resumes from the newest complete one (restarts)", 1, 0},
        {"keep", CLI_INT, &c->keep, "--checkpoint-dir: keep the newest K checkpoints (0: all)", 0, 1e9},
        {"checkpoint-every", CLI_INT, &c->checkpoint_every, "also save every this many steps (0: epoch ends only)", 0, 1e12},
        {"resume", CLI_STRING, &c->resume, "continue the run saved in this checkpoint, with its model, classes, image size and seed", 1, 0},
        {"init-from", CLI_STRING, &c->init_from, "start from these weights (safetensors file or checkpoint; strict; step 0, fresh optimizer; ignored when resuming)", 1, 0},
        {"init-exclude", CLI_STRING, &c->init_exclude, "--init-from: keep the fresh weights under these comma-separated prefixes (e.g. fc: a new classifier)", 1, 0},
        {"metrics-json", CLI_STRING, &a->metrics_json, "write final metrics to this JSON file", 1, 0},
        {"trace", CLI_STRING, &c->trace, "write a Chrome/Perfetto trace of the run (steps, data wait, forward, backward, optimizer, evaluation, DDP all-reduces, pipeline stages) to this file; with several ranks each writes its own, .rankR before the extension (trace.json -> trace.rank0.json): `tessera trace merge` joins them", 1, 0},
        {"metrics-csv", CLI_STRING, &c->metrics_csv, "rank 0: one CSV row per optimizer step (step, epoch, loss, lr, images_per_second, data_wait_share, allreduce_seconds), flushed as written", 1, 0},
        {"quiet", CLI_BOOL, &a->quiet, "no progress bar", 1, 0},
        {"nproc", CLI_INT, &c->nproc, "processes on this machine, each a DDP rank (launched through tessera run)", 1, 1024},
        {"strategy", CLI_ENUM, CLI_ENUM_OF(c->strategy, cli_name_strat), "one process, many devices: data, model, pipeline or tile (see --devices); ddp is implied by --nproc or a launcher", 0, TS_STRATEGY_COUNT - 1},
        {"devices", CLI_STRING, &c->devices, "devices for --strategy, e.g. cpu:0,cpu:1 (default: every virtual CPU device)", 1, 0},
        {"device", CLI_STRING, &c->device, "the device the model trains on, one per process: cpu (default), cpu:K, cuda:N, or cuda (DDP: cuda:LOCAL_RANK, wrapping around the GPUs); `tessera devices` lists them", 1, 0},
        {"micro-batches", CLI_INT, &c->micro_batches, "--strategy pipeline: micro-batches per batch", 1, 1 << 20},
        {"schedule", CLI_ENUM, CLI_ENUM_OF(c->pp_schedule, cli_name_pp), "--strategy pipeline: gpipe or 1f1b", TS_PP_GPIPE, TS_PP_1F1B},
        /* the config's name of --schedule (what --print-config writes), not listed */
        {"pp-schedule", CLI_ENUM, CLI_ENUM_OF(c->pp_schedule, cli_name_pp), NULL, TS_PP_GPIPE, TS_PP_1F1B},
        {"timeout", CLI_FLOAT, &c->timeout, "seconds a rank waits for the others (0: TS_DIST_TIMEOUT or 1800)", 0, 1e7},
        {"backend", CLI_ENUM, CLI_ENUM_OF(c->backend, cli_name_back), "process group backend: auto, builtin (shared memory + TCP), mpi (under mpirun; --nproc starts mpirun), or nccl (CUDA devices; what auto takes with --device cuda when every rank has its own GPU)", 0, TS_RUN_BACKEND_COUNT - 1},
        {"precision", CLI_ENUM, CLI_ENUM_OF(c->precision, cli_name_prec), "fp32, bf16: autocast — matmuls and convolutions take and return bfloat16 (float32 accumulation: AVX512_BF16 through oneDNN on the CPU, tensor cores on CUDA), BatchNorm/ReLU/max pooling/add keep bfloat16 activations (TS_AUTOCAST=fp32: products only, float32 between layers); weights, optimizer, losses and normalisation statistics stay float32; or fp16: operands rounded to float16, with dynamic loss scaling (steps with inf/NaN gradients skipped; on the CPU float16 runs at float32 speed)", 0, TS_PRECISION_COUNT - 1},
        {"loss-scale", CLI_FLOAT, &c->loss_scale, "--precision fp16: the initial loss scale (grows x2 every 2000 clean steps, halves on overflow)", 1, 1e30},
        {"ddp-comm", CLI_ENUM, CLI_ENUM_OF(c->ddp_comm, cli_name_prec), "DDP gradient all-reduce in fp32, or bf16 (compressed: half the bytes, like PyTorch's bf16_compress_hook)", TS_PRECISION_FP32, TS_PRECISION_BF16},
        {"sync-bn", CLI_BOOL, &c->sync_bn, "with --nproc > 1: BatchNorm statistics over all ranks' batches (SyncBatchNorm)", 1, 0},
    };
    const cli_command cmd = {"train", "tessera train [flags]", SUMMARY, flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc == 0 && a->config && (rc = cli_load_config(&cmd, a->config, cfg_buf)) == 0)
        rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL); /* the command line wins */
    if (rc == 0 && ts_run_config_check(c) != TS_OK) return cli_usage_error(&cmd, "%s", ts_last_error());
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
    char prefix[64], suffix[128];
    double ips = ev->epoch_seconds > 0 ? (double)ev->epoch_images / ev->epoch_seconds : 0.0;
    snprintf(prefix, sizeof prefix, "epoch %lld/%lld", (long long)ev->epoch + 1, (long long)ev->epochs);
    if (ev->kind == TS_TRAIN_STEP && !a->quiet) {
        snprintf(suffix, sizeof suffix, "loss %.4f  %.0f img/s  lr %.4g", ev->mean_loss, ips, ev->lr);
        cli_progress_update(&a->bar, prefix, ev->batch, ev->num_batches, suffix, false);
    } else if (ev->kind == TS_TRAIN_EPOCH_END) {
        if (!a->quiet && isfinite(ev->mean_loss)) {
            snprintf(suffix, sizeof suffix, "loss %.4f  %.0f img/s", ev->mean_loss, ips);
            cli_progress_update(&a->bar, prefix, ev->batch, ev->num_batches, suffix, true);
        }
        if (ev->eval)
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
    printf("training %s on %s: %lld images, %lld batches of %lld per epoch", c->model, c->data,
           (long long)ts_batch_source_num_samples(train), (long long)ts_batch_source_num_batches(train, 0),
           (long long)c->batch_size);
    if (ddp) printf(" per rank, %d ranks (DDP)", world);
    print_placement(s);
    printf(", %lld parameters, %d threads%s\n", (long long)ts_module_num_parameters(ts_strategy_model(s)),
           ts_get_num_threads(), ddp ? " per rank" : "");
    if (ddp && c->sync_bn) printf("--sync-bn: BatchNorm2d layers are SyncBatchNorm over all %d ranks\n", world);
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
