/*
 * tools/cmd_train.c — `tessera train`: flags in, progress out. Everything
 * else is the library's training layer (tessera/train.h): ts_data_open for the
 * batch sources, ts_strategy_new for DDP or a single-process strategy, the
 * trainer for the loop, evaluation, checkpoints and resume.
 *
 * Without a launcher this is the world of one (the distributed sampler's order
 * for rank 0 of 1), so `--batch-size 64` here and `--nproc 2 --batch-size 32`
 * train on the same samples in every step. Under a launcher whose world has more
 * than one process (ts_dist_env_detect: torchrun, tessera run, mpirun, srun,
 * mpiexec) every process is one DDP rank of that job, whatever --backend; rank 0
 * alone evaluates, prints and writes checkpoints.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef struct train_args {
    const char *data, *model, *optimizer, *schedule, *conv_algo;
    ts_conv_algo algo;
    const char *decode;     /* --decode: cpu or mixed (the training images' JPEGs on the --device GPU) */
    ts_decode_device dec;
    const char *checkpoint, *checkpoint_dir, *resume, *metrics_json, *init_from, *init_exclude;
    const char *trace, *metrics_csv; /* --trace, --metrics-csv */
    const char *backend; /* --backend: the process group's backend (builtin, mpi, nccl; NULL: chosen by device) */
    int64_t data_threads, epochs, max_steps, batch_size, seed, threads, nproc, checkpoint_every, keep, num_classes;
    int64_t image_size; /* --image-size: 0 is the model's default */
    double lr, momentum, weight_decay, label_smoothing, timeout;
    bool quiet, sync_bn;
    const char *strategy, *devices, *pp_schedule; /* one process, many devices */
    const char *device;                           /* --device: one process on one device (cuda:0) */
    int64_t micro_batches;
    int64_t accum_steps, warmup_steps; /* --accum-steps, --warmup-steps */
    double clip_grad_norm;             /* --clip-grad-norm (0: none) */
    const char *ddp_comm;              /* --ddp-comm: fp32 or bf16 */
    const char *precision;             /* --precision: fp32, bf16 or fp16 */
    double loss_scale;                 /* --loss-scale: fp16's initial scale */
    ts_dtype prec;
    ts_dtype comm_dtype;
} train_args;

/* What the trainer's callback prints with. */
typedef struct train_view {
    const train_args *a;
    cli_progress bar;
    int64_t test_images;
} train_view;

/* `tessera train --nproc N` outside a launcher: N copies of this command through
 * `tessera run` (RANK, WORLD_SIZE, MASTER_ADDR, ... set), or through mpirun for
 * the MPI backend, whose ranks are MPI_COMM_WORLD's. */
static int relaunch(int argc, char **argv, int64_t nproc, bool mpi) {
    char exe[4096], nbuf[32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "tessera train: cannot find the tessera executable: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = '\0';
    snprintf(nbuf, sizeof nbuf, "%lld", (long long)nproc);
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
    fprintf(stderr, "tessera train: --backend mpi --nproc %lld: cannot run mpirun: %s (install openmpi-bin, or run "
                    "under mpirun -n N yourself)\n", (long long)nproc, strerror(errno));
    free(rargv);
    return 1;
}

/* --strategy / --devices into o (kind, devices), or a usage error. Without
 * TS_CPU_DEVICES, the virtual CPU devices grow to cover the highest cpu:K listed. */
static int parse_strategy(const cli_command *cmd, const train_args *a, bool launched, int local_rank,
                          ts_strategy_opts *o, ts_device **devs, int max) {
    if (a->strategy && ts_strategy_kind_parse(a->strategy, &o->kind) != TS_OK)
        return cli_usage_error(cmd, "--strategy: %s", ts_last_error());
    if (a->device) {
        if ((o->kind != TS_STRATEGY_NONE && o->kind != TS_STRATEGY_DDP) || a->devices)
            return cli_usage_error(cmd, "--device runs the model on one device per process; --strategy %s takes "
                                   "--devices", a->strategy ? a->strategy : "");
        if (launched && local_rank < 0) { /* the parent of --nproc N: its ranks choose */
            o->kind = TS_STRATEGY_DDP;
            return 0;
        }
        char name[32];
        snprintf(name, sizeof name, "%s", a->device);
        if (strcmp(a->device, "cuda") == 0 && launched) { /* one GPU per local rank, as torchrun scripts pick */
            int n = ts_cuda_device_count(NULL, 0);
            snprintf(name, sizeof name, "cuda:%d", n > 0 ? local_rank % n : 0);
        }
        if (ts_device_get(name, &devs[0]) != TS_OK) return cli_usage_error(cmd, "--device: %s", ts_last_error());
        o->devices = devs;
        o->num_devices = 1;
        if (launched) o->kind = TS_STRATEGY_DDP;
        else if (o->kind == TS_STRATEGY_DDP)
            return cli_usage_error(cmd, "--strategy ddp needs --nproc N or a launcher (tessera run, torchrun, mpirun)");
        return 0;
    }
    if (launched || o->kind == TS_STRATEGY_DDP) {
        if (o->kind != TS_STRATEGY_NONE && o->kind != TS_STRATEGY_DDP)
            return cli_usage_error(cmd, "--strategy %s runs one process on several devices; it cannot be combined "
                                        "with --nproc %lld or a launcher (DDP over processes): use one or the other",
                                   a->strategy, (long long)a->nproc);
        if (!launched) return cli_usage_error(cmd, "--strategy ddp needs --nproc N or a launcher (tessera run, torchrun, mpirun)");
        o->kind = TS_STRATEGY_DDP;
        return a->devices ? cli_usage_error(cmd, "--devices goes with --strategy data|model|pipeline|tile") : 0;
    }
    if (a->devices && o->kind == TS_STRATEGY_NONE)
        return cli_usage_error(cmd, "--devices needs --strategy (data, model, pipeline or tile)");
    if (ts_pp_schedule_parse(a->pp_schedule, &o->schedule) != TS_OK)
        return cli_usage_error(cmd, "unknown --schedule '%s' (expected gpipe or 1f1b)", a->pp_schedule);
    o->micro_batches = (int)a->micro_batches;
    if (!a->devices) return 0; /* the strategy takes every virtual CPU device */
    const char *env = getenv("TS_CPU_DEVICES");
    int want = 0;
    for (const char *p = strstr(a->devices, "cpu:"); p; p = strstr(p + 4, "cpu:")) {
        char *end;
        long k = strtol(p + 4, &end, 10);
        if (end != p + 4 && k >= 0 && k < TS_MAX_CPU_DEVICES && k + 1 > want) want = (int)k + 1;
    }
    if ((!env || !*env) && want > ts_cpu_device_count()) ts_set_cpu_device_count(want);
    if (ts_device_list_parse(a->devices, devs, max, &o->num_devices) != TS_OK)
        return cli_usage_error(cmd, "--devices: %s", ts_last_error());
    o->devices = devs;
    return 0;
}

/* Progress bar and epoch lines on rank 0. */
static ts_status on_event(const ts_train_event *ev, void *user) {
    train_view *v = user;
    if (ev->rank != 0) return TS_OK;
    char prefix[64], suffix[128];
    double ips = ev->epoch_seconds > 0 ? (double)ev->epoch_images / ev->epoch_seconds : 0.0;
    snprintf(prefix, sizeof prefix, "epoch %lld/%lld", (long long)ev->epoch + 1, (long long)ev->epochs);
    if (ev->kind == TS_TRAIN_STEP && !v->a->quiet) {
        snprintf(suffix, sizeof suffix, "loss %.4f  %.0f img/s  lr %.4g", ev->mean_loss, ips, ev->lr);
        cli_progress_update(&v->bar, prefix, ev->batch, ev->num_batches, suffix, false);
    } else if (ev->kind == TS_TRAIN_EPOCH_END) {
        if (!v->a->quiet && isfinite(ev->mean_loss)) {
            snprintf(suffix, sizeof suffix, "loss %.4f  %.0f img/s", ev->mean_loss, ips);
            cli_progress_update(&v->bar, prefix, ev->batch, ev->num_batches, suffix, true);
        }
        if (ev->eval)
            printf("epoch %lld/%lld: train loss %.4f, test accuracy %.2f%%, top-5 %.2f%%, test loss %.4f (%lld "
                   "images), %.1f s, %.0f images/s\n",
                   (long long)ev->epoch + 1, (long long)ev->epochs, ev->mean_loss, 100.0 * ev->eval->accuracy,
                   100.0 * ev->eval->top5_accuracy, ev->eval->loss, (long long)ev->eval->samples, ev->epoch_seconds,
                   ips);
    } else if (ev->kind == TS_TRAIN_CHECKPOINT) {
        printf("saved checkpoint to %s (epoch %lld, step %lld)\n", ev->checkpoint, (long long)ev->epoch + 1,
               (long long)ev->step);
    }
    fflush(stdout);
    return TS_OK;
}

static void print_banner(const train_args *a, ts_strategy *s, ts_batch_source *train) {
    int world = ts_strategy_world_size(s);
    bool ddp = ts_strategy_kind_of(s) == TS_STRATEGY_DDP;
    printf("training %s on %s: %lld images, %lld batches of %lld per epoch", a->model, a->data,
           (long long)ts_batch_source_num_samples(train), (long long)ts_batch_source_num_batches(train, 0),
           (long long)a->batch_size);
    if (ddp) printf(" per rank, %d ranks (DDP)", world);
    ts_device *devs[TS_MAX_CPU_DEVICES + 1];
    int ndev = ts_strategy_devices(s, devs, TS_MAX_CPU_DEVICES + 1);
    ts_strategy_kind kind = ts_strategy_kind_of(s);
    if (kind == TS_STRATEGY_NONE || kind == TS_STRATEGY_DDP) { /* one device per process */
        if (ndev == 1 && devs[0] != ts_device_cpu()) printf(", on %s", ts_device_name(devs[0]));
    } else if (ndev > 0) {
        char desc[512];
        ts_strategy_describe(s, desc, sizeof desc);
        ts_log(TS_LOG_INFO, "%s", desc);
        printf(", --strategy %s over", ts_strategy_kind_name(ts_strategy_kind_of(s)));
        for (int i = 0; i < ndev && i < TS_MAX_CPU_DEVICES + 1; i++) printf("%s %s", i ? "," : "", ts_device_name(devs[i]));
    }
    printf(", %lld parameters, %d threads%s\n", (long long)ts_module_num_parameters(ts_strategy_model(s)),
           ts_get_num_threads(), ddp ? " per rank" : "");
    if (ddp && a->sync_bn) printf("--sync-bn: BatchNorm2d layers are SyncBatchNorm over all %d ranks\n", world);
    if (ddp && a->comm_dtype == TS_BF16) printf("--ddp-comm bf16: gradient buckets are all-reduced in bfloat16\n");
    if (a->prec == TS_F16)
        printf("--precision fp16: matmul and convolution operands rounded to float16, float32 accumulation, dynamic "
               "loss scaling from %g\n", a->loss_scale);
    if (a->prec == TS_BF16)
        printf("--precision bf16: matmuls and convolutions in bfloat16 with float32 accumulation (%s)%s\n",
               ts_cpu_gemm_library(),
               ts_get_autocast() == TS_BF16 ? "; autocast: bfloat16 activations between layers on the CPU" : "");
    if (a->accum_steps > 1)
        printf("--accum-steps %lld: one optimizer step per %lld batches (%lld images%s)\n", (long long)a->accum_steps,
               (long long)a->accum_steps, (long long)(a->accum_steps * a->batch_size * world), world > 1 ? " over all ranks" : "");
}

static int write_metrics(const train_args *a, const ts_train_result *r, int world) {
    FILE *f = fopen(a->metrics_json, "w");
    if (!f) {
        fprintf(stderr, "tessera train: --metrics-json %s: %s\n", a->metrics_json, strerror(errno));
        return 1;
    }
    const char *base = strrchr(a->data, '/');
    fprintf(f,
            "{\n  \"model\": \"%s\",\n  \"test_accuracy\": %.6f,\n  \"images_per_second\": %.1f,\n"
            "  \"epochs\": %lld,\n  \"steps\": %lld,\n  \"final_loss\": %.6f,\n  \"train_seconds\": %.3f,\n"
            "  \"threads\": %d,\n  \"batch_size\": %lld,\n  \"processes\": %d,\n  \"data\": \"%s\",\n"
            "  \"precision\": \"%s\",\n  \"accum_steps\": %lld,\n  \"ddp_comm\": \"%s\"\n}\n",
            a->model, r->eval.accuracy, r->images_per_second, (long long)r->epochs, (long long)r->steps,
            isfinite(r->final_loss) ? r->final_loss : -1.0, r->train_seconds, ts_get_num_threads(),
            (long long)a->batch_size, world, base ? base + 1 : a->data, ts_dtype_name(a->prec),
            (long long)a->accum_steps, ts_dtype_name(a->comm_dtype));
    if (fclose(f) != 0) {
        fprintf(stderr, "tessera train: --metrics-json %s: %s\n", a->metrics_json, strerror(errno));
        return 1;
    }
    return 0;
}

/* The trainer's options from the flags. */
static ts_trainer_opts trainer_opts(const train_args *a, const ts_lr_schedule *sched, ts_batch_source *test,
                                    train_view *view, ts_rng *rng) {
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = a->epochs;
    to.max_steps = a->max_steps;
    to.schedule = sched;
    to.label_smoothing = (float)a->label_smoothing;
    to.num_classes = a->num_classes;
    to.eval = test;
    to.checkpoint = a->checkpoint;
    to.checkpoint_dir = a->checkpoint_dir;
    to.keep = (int)a->keep;
    to.checkpoint_every = a->checkpoint_every;
    to.callback = on_event;
    to.user = view;
    to.model_name = a->model;
    to.optimizer_name = a->optimizer;
    to.seed = (uint64_t)a->seed;
    to.batch_size = a->batch_size;
    to.rng = rng;
    to.accum_steps = a->accum_steps;
    to.clip_grad_norm = a->clip_grad_norm;
    to.trace_path = a->trace;
    to.metrics_csv = a->metrics_csv;
    static ts_grad_scaler gs; /* fp16: dynamic loss scaling, torch.amp.GradScaler's defaults */
    gs = TS_GRAD_SCALER_INIT;
    gs.scale = (float)a->loss_scale;
    if (a->prec == TS_F16) to.grad_scaler = &gs;
    return to;
}

/* The process group when a launcher started this process as one rank of a larger
 * job (ts_dist_env_detect: torchrun, tessera run, mpirun, srun, ...); ts_pg_new
 * gives the rank its share of the host's CPUs unless --threads or OMP_NUM_THREADS said. */
static ts_status join_group(const train_args *a, const ts_dist_env *env, ts_device *dev, ts_process_group **pg) {
    long local = env->local_world_size > 0 ? env->local_world_size : 1;
    ts_pg_options po = TS_PG_OPTIONS_INIT;
    po.timeout_s = a->timeout;
    po.backend = a->backend;
    bool cuda = dev && ts_device_type_of(dev) == TS_DEVICE_CUDA;
    if (!po.backend) /* NCCL when every rank of this host has a GPU of its own (--device cuda), as PyTorch */
        po.backend = cuda && a->device && strcmp(a->device, "cuda") == 0 && local <= ts_cuda_device_count(NULL, 0) &&
                             ts_pg_backend_available("nccl")
                         ? "nccl"
                         : "builtin";
    if (cuda) po.device = ts_device_name(dev);
    return ts_pg_new(&po, pg);
}

/* --checkpoint-dir without --resume: a restarted run goes on from the folder's newest complete checkpoint. */
static int find_restart(train_args *a, char *buf, size_t n) {
    bool found = false;
    if (!a->checkpoint_dir || a->resume) return 0;
    if (ts_train_checkpoint_latest(a->checkpoint_dir, buf, n, &found) != TS_OK) {
        fprintf(stderr, "tessera train: --checkpoint-dir: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    if (found) a->resume = buf;
    return 0;
}

/* The names given to --model, --optimizer, --lr-schedule and --backend, and --data's path. */
static int check_names(const cli_command *cmd, train_args *a) {
    ts_lr_schedule sched;
    ts_model_desc md;
    if (!ts_model_info(a->model, &md)) {
        char known[256] = "";
        for (int i = 0; ts_model_name_at(i); i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", ts_model_name_at(i));
        return cli_usage_error(cmd, "unknown --model '%s' (expected one of %s)", a->model, known);
    }
    if (md.fixed_size && a->image_size && a->image_size != md.image_size)
        return cli_usage_error(cmd, "--image-size %lld: --model %s takes %dx%d images only", (long long)a->image_size,
                               a->model, md.image_size, md.image_size);
    if (strcmp(a->optimizer, "sgd") != 0 && strcmp(a->optimizer, "adamw") != 0)
        return cli_usage_error(cmd, "unknown --optimizer '%s' (expected sgd or adamw)", a->optimizer);
    if (ts_lr_schedule_by_name(a->schedule, a->lr, 1, 1, &sched) != TS_OK)
        return cli_usage_error(cmd, "unknown --lr-schedule '%s' (expected none, step or cosine)", a->schedule);
    if (a->backend && strcmp(a->backend, "builtin") != 0 && strcmp(a->backend, "mpi") != 0 &&
        strcmp(a->backend, "nccl") != 0)
        return cli_usage_error(cmd, "unknown --backend '%s' (expected builtin, mpi or nccl)", a->backend);
    if (a->backend && !strcmp(a->backend, "nccl") && !ts_pg_backend_available("nccl"))
        return cli_usage_error(cmd, "--backend nccl: this Tessera was built without NCCL (CUDA and NCCL are found at "
                               "build time: see `tessera devices`)");
    if (a->init_exclude && !a->init_from) return cli_usage_error(cmd, "--init-exclude goes with --init-from");
    if (ts_conv_algo_parse(a->conv_algo, &a->algo) != TS_OK) return cli_usage_error(cmd, "--conv-algo: %s", ts_last_error());
    if (ts_decode_device_parse(a->decode, &a->dec) != TS_OK) return cli_usage_error(cmd, "--decode: %s", ts_last_error());
    if (a->dec == TS_DECODE_MIXED && !a->device)
        return cli_usage_error(cmd, "--decode mixed decodes the training images on the GPU the model trains on: give "
                               "--device cuda:N (or cuda)");
    if (ts_dtype_parse(a->precision, &a->prec) != TS_OK || (a->prec != TS_F32 && a->prec != TS_BF16 && a->prec != TS_F16))
        return cli_usage_error(cmd, "--precision '%s': expected fp32, bf16 or fp16", a->precision);
    if (a->prec == TS_F16 && a->strategy && !strcasecmp(a->strategy, "pipeline"))
        return cli_usage_error(cmd, "--precision fp16 (loss scaling) is not available with --strategy pipeline");
    if (ts_dtype_parse(a->ddp_comm, &a->comm_dtype) != TS_OK || (a->comm_dtype != TS_F32 && a->comm_dtype != TS_BF16))
        return cli_usage_error(cmd, "--ddp-comm '%s': expected fp32 or bf16", a->ddp_comm);
    if (a->comm_dtype == TS_BF16 && a->backend && !strcmp(a->backend, "mpi"))
        return cli_usage_error(cmd, "--ddp-comm bf16 needs --backend builtin or nccl (MPI has no bfloat16 reduction)");
    if (access(a->data, R_OK) != 0) return cli_usage_error(cmd, "--data %s: %s", a->data, strerror(errno));
    return 0;
}

int ts_cmd_train(int argc, char **argv) {
    train_args a = {.data = "/usr/share/datasets/fashion-mnist", .data_threads = 2, .model = "cnn",
                    .optimizer = "sgd", .schedule = "cosine", .epochs = 4, .batch_size = 64, .lr = 0.05,
                    .momentum = 0.9, .weight_decay = 5e-4, .nproc = 1, .micro_batches = 8, .pp_schedule = "1f1b",
                    .backend = NULL, .conv_algo = "auto", .decode = "cpu", .accum_steps = 1, .ddp_comm = "fp32",
                    .precision = "fp32", .loss_scale = 65536.0};
    const cli_flag flags[] = {
        {"data", CLI_STRING, &a.data, "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz], or images: a folder with one sub-folder per class (or its train/ and val/ or test/), or a \"path label\" list", 1, 0},
        {"data-threads", CLI_INT, &a.data_threads, "worker threads decoding images (image --data only)", 1, 256},
        {"decode", CLI_STRING, &a.decode, "where the training images' JPEGs are decoded: cpu (the worker threads) or mixed (read and cropped on the workers, decoded by nvJPEG and resized on the --device GPU, DALI's device=\"mixed\"; PNGs and evaluation on the workers)", 1, 0},
        {"model", CLI_STRING, &a.model, "cnn (the reference CNN), mlp, resnet18, resnet34, resnet50, resnet101 or resnet152 (torchvision's)", 1, 0},
        {"image-size", CLI_INT, &a.image_size, "ResNets: train on RGB crops of this side (64, 112, 224: the default); cnn and mlp take 28", 0, 4096},
        {"num-classes", CLI_INT, &a.num_classes, "outputs of the model's last layer (0: the data's classes; more keeps e.g. ImageNet's 1000 for --init-from)", 0, 1 << 20},
        {"epochs", CLI_INT, &a.epochs, "number of epochs", 1, 1e6},
        {"max-steps", CLI_INT, &a.max_steps, "stop after this many optimizer steps in all (0: no limit)", 0, 1e12},
        {"batch-size", CLI_INT, &a.batch_size, "images per step (per rank with --nproc)", 1, 1 << 20},
        {"lr", CLI_FLOAT, &a.lr, "peak learning rate", 0, 1e3},
        {"momentum", CLI_FLOAT, &a.momentum, "SGD momentum", 0, 1},
        {"weight-decay", CLI_FLOAT, &a.weight_decay, "weight decay (SGD: L2; AdamW: decoupled)", 0, 1},
        {"optimizer", CLI_STRING, &a.optimizer, "sgd or adamw", 1, 0},
        {"lr-schedule", CLI_STRING, &a.schedule, "none, step (x0.1 every epoch) or cosine (over all steps)", 1, 0},
        {"label-smoothing", CLI_FLOAT, &a.label_smoothing, "cross-entropy label smoothing", 0, 1},
        {"warmup-steps", CLI_INT, &a.warmup_steps, "linear learning-rate warmup over the first N steps, from lr/3 (torch's LinearLR), then --lr-schedule over the rest", 0, 1e12},
        {"accum-steps", CLI_INT, &a.accum_steps, "gradient accumulation: one optimizer step per K batches of --batch-size (DDP all-reduces on the K-th only)", 1, 1 << 20},
        {"clip-grad-norm", CLI_FLOAT, &a.clip_grad_norm, "clip the gradients' global L2 norm to this before each step (0: off)", 0, 1e12},
        {"seed", CLI_INT, &a.seed, "seed for initialisation and shuffling", 0, 9.2e18},
        {"threads", CLI_INT, &a.threads, "CPU threads (0: OMP_NUM_THREADS or all cores)", 0, 4096},
        {"conv-algo", CLI_STRING, &a.conv_algo, "convolutions: auto (oneDNN's primitives where built, else Winograd F(2x2) for 3x3 stride-1 ones from 16 channels), winograd (adds F(4x4): faster, rounds more), im2col, winograd-f2, winograd-f4 or onednn", 1, 0},
        {"checkpoint", CLI_STRING, &a.checkpoint, "save model+optimizer after every epoch and at the end", 1, 0},
        {"checkpoint-dir", CLI_STRING, &a.checkpoint_dir, "save a new step-<N>.ckpt here each time; a run whose folder holds one resumes from the newest complete one (restarts)", 1, 0},
        {"keep", CLI_INT, &a.keep, "--checkpoint-dir: keep the newest K checkpoints (0: all)", 0, 1e9},
        {"checkpoint-every", CLI_INT, &a.checkpoint_every, "also save every this many steps (0: epoch ends only)", 0, 1e12},
        {"resume", CLI_STRING, &a.resume, "continue the run saved in this checkpoint", 1, 0},
        {"init-from", CLI_STRING, &a.init_from, "start from these weights (safetensors file or checkpoint; strict; step 0, fresh optimizer; ignored when resuming)", 1, 0},
        {"init-exclude", CLI_STRING, &a.init_exclude, "--init-from: keep the fresh weights under these comma-separated prefixes (e.g. fc: a new classifier)", 1, 0},
        {"metrics-json", CLI_STRING, &a.metrics_json, "write final metrics to this JSON file", 1, 0},
        {"trace", CLI_STRING, &a.trace, "write a Chrome/Perfetto trace of the run (steps, data wait, forward, backward, optimizer, evaluation, DDP all-reduces, pipeline stages) to this file; with several ranks each writes its own, .rankR before the extension (trace.json -> trace.rank0.json): `tessera trace merge` joins them", 1, 0},
        {"metrics-csv", CLI_STRING, &a.metrics_csv, "rank 0: one CSV row per optimizer step (step, epoch, loss, lr, images_per_second, data_wait_share, allreduce_seconds), flushed as written", 1, 0},
        {"quiet", CLI_BOOL, &a.quiet, "no progress bar", 1, 0},
        {"nproc", CLI_INT, &a.nproc, "processes on this machine, each a DDP rank (launched through tessera run)", 1, 1024},
        {"strategy", CLI_STRING, &a.strategy, "one process, many devices: data, model, pipeline or tile (see --devices); ddp is implied by --nproc or a launcher", 1, 0},
        {"devices", CLI_STRING, &a.devices, "devices for --strategy, e.g. cpu:0,cpu:1 (default: every virtual CPU device)", 1, 0},
        {"device", CLI_STRING, &a.device, "the device the model trains on, one per process: cpu (default), cpu:K, cuda:N, or cuda (DDP: cuda:LOCAL_RANK, wrapping around the GPUs); `tessera devices` lists them", 1, 0},
        {"micro-batches", CLI_INT, &a.micro_batches, "--strategy pipeline: micro-batches per batch", 1, 1 << 20},
        {"schedule", CLI_STRING, &a.pp_schedule, "--strategy pipeline: gpipe or 1f1b", 1, 0},
        {"timeout", CLI_FLOAT, &a.timeout, "seconds a rank waits for the others (0: TS_DIST_TIMEOUT or 1800)", 0, 1e7},
        {"backend", CLI_STRING, &a.backend, "process group backend: builtin (shared memory + TCP), mpi (under mpirun; --nproc starts mpirun), or nccl (CUDA devices; the default with --device cuda when every rank has its own GPU)", 1, 0},
        {"precision", CLI_STRING, &a.precision, "fp32, bf16: autocast on the CPU — matmuls and convolutions take and return bfloat16 (float32 accumulation, AVX512_BF16 through oneDNN), BatchNorm/ReLU/max pooling/add keep bfloat16 activations (TS_AUTOCAST=fp32: products only, float32 between layers, as on CUDA); weights, optimizer, losses and normalisation statistics stay float32; or fp16: operands rounded to float16, with dynamic loss scaling (steps with inf/NaN gradients skipped; on this CPU float16 runs at float32 speed)", 1, 0},
        {"loss-scale", CLI_FLOAT, &a.loss_scale, "--precision fp16: the initial loss scale (grows x2 every 2000 clean steps, halves on overflow)", 1, 1e30},
        {"ddp-comm", CLI_STRING, &a.ddp_comm, "DDP gradient all-reduce in fp32, or bf16 (compressed: half the bytes, like PyTorch's bf16_compress_hook)", 1, 0},
        {"sync-bn", CLI_BOOL, &a.sync_bn, "with --nproc > 1: BatchNorm statistics over all ranks' batches (SyncBatchNorm)", 1, 0},
    };
    const cli_command cmd = {
        "train", "tessera train [flags]",
        "Trains a model on Fashion-MNIST (or any MNIST-format IDX data set, or an image folder), prints\n"
        "the test accuracy (top-1, top-5) after every epoch and saves checkpoints. The reference CNN is\n"
        "conv(1->32,3x3)-BN-ReLU-maxpool -> conv(32->64,3x3)-BN-ReLU-maxpool -> linear(3136->128)-ReLU -> linear(128->10).\n"
        "ResNets read RGB images at --image-size: random-resized-crop + flip for training, the central 0.875\n"
        "window for evaluation, ImageNet's normalisation; the output layer has one class per sub-folder.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_names(&cmd, &a)) != 0) return rc;
    bool mpi = a.backend && strcmp(a.backend, "mpi") == 0;
    ts_dist_env env; /* launched by torchrun, tessera run, mpirun, srun...? (--nproc is ignored then) */
    bool in_job = false;
    if (ts_dist_env_detect(&env, &in_job) != TS_OK) {
        fprintf(stderr, "tessera train: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
    ts_device *devs[TS_MAX_CPU_DEVICES + 1];
    if ((rc = parse_strategy(&cmd, &a, in_job || a.nproc > 1, in_job ? (env.local_rank > 0 ? env.local_rank : 0) : -1, &so, devs,
                             TS_MAX_CPU_DEVICES + 1)) != 0) return rc;
    if (a.nproc > 1 && !in_job) return relaunch(argc, argv, a.nproc, mpi);
    if (a.threads > 0) ts_set_num_threads((int)a.threads);
    ts_set_conv_algo(a.algo);
    ts_set_matmul_precision(a.prec);
    cli_set_autocast(a.prec);
    ts_train_checkpoint_info ck; /* resume: the checkpoint's seed decides the data order */
    char latest[4096];
    if ((rc = find_restart(&a, latest, sizeof latest)) != 0) return rc;
    if (a.resume && ts_train_checkpoint_read(a.resume, &ck) != TS_OK) {
        fprintf(stderr, "tessera train: --resume: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    if (a.resume) a.seed = ck.seed;

    int status = 1;
    ts_process_group *pg = NULL;
    ts_batch_source *train = NULL, *test = NULL;
    ts_strategy *s = NULL;
    ts_optimizer *opt = NULL;
    ts_trainer *t = NULL;
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    ts_module *model = NULL;
    ts_lr_schedule sched;
    ts_rng rng;
    ts_rng_seed(&rng, (uint64_t)a.seed);
    if (in_job && join_group(&a, &env, so.num_devices == 1 ? so.devices[0] : NULL, &pg) != TS_OK) {
        fprintf(stderr, "tessera train: joining the process group: %s\n", ts_last_error());
        return 1;
    }
    const int rank = pg ? ts_pg_rank(pg) : 0;
    if (a.checkpoint && rank == 0 && ts_ckpt_check_writable(a.checkpoint) != TS_OK) { /* before loading any data */
        fprintf(stderr, "tessera train: --checkpoint: %s\n", ts_last_error());
        status = CLI_EXIT_USAGE;
        goto done;
    }
    ts_data_opts d = TS_DATA_OPTS_INIT;
    d.path = a.data;
    d.batch_size = a.batch_size;
    d.seed = (uint64_t)a.seed;
    d.rank = rank;
    d.world_size = pg ? ts_pg_size(pg) : 1;
    d.threads = (int)a.data_threads;
    if (a.dec == TS_DECODE_MIXED) d.mixed_decode = so.devices[0];
    ts_model_desc md;
    ts_model_info(a.model, &md);
    d.image_size = md.fixed_size ? 0 : (int)(a.image_size ? a.image_size : md.image_size);
    if (ts_data_open(&d, &train, rank == 0 ? &test : NULL) != TS_OK) {
        fprintf(stderr, "tessera train: --data %s: %s\n", a.data, ts_last_error());
        status = CLI_EXIT_USAGE;
        goto done;
    }
    so.pg = pg;
    so.sync_bn = a.sync_bn;
    ts_ddp_options dopt = TS_DDP_OPTIONS_INIT;
    dopt.comm_dtype = a.comm_dtype;
    so.ddp = &dopt;
    so.sample_ndim = ts_batch_source_sample_shape(train, so.sample_shape);
    /* optimizer steps per epoch: batches / accum_steps, a last shorter step included */
    int64_t nb = (ts_batch_source_num_batches(train, 0) + a.accum_steps - 1) / a.accum_steps;
    /* the output layer follows the data's classes (an image folder's sub-folders), or --num-classes */
    const int64_t data_classes = ts_batch_source_num_classes(train);
    if (a.num_classes && a.num_classes < data_classes) {
        fprintf(stderr, "tessera train: --num-classes %lld: --data %s has %lld classes\n", (long long)a.num_classes,
                a.data, (long long)data_classes);
        status = CLI_EXIT_USAGE;
        goto done;
    }
    if (ts_model_new(a.model, a.num_classes ? a.num_classes : data_classes, &rng, &model) != TS_OK) goto fail;
    if (a.init_from && !a.resume && ts_weights_load_except(model, a.init_from, a.init_exclude) != TS_OK) {
        fprintf(stderr, "tessera train: --init-from: %s\n", ts_last_error());
        ts_module_free(model);
        status = CLI_EXIT_USAGE;
        goto done;
    }
    if (a.init_from && !a.resume && rank == 0)
        printf("initialised %s from %s%s%s\n", a.model, a.init_from, a.init_exclude ? " except " : "",
               a.init_exclude ? a.init_exclude : "");
    if (ts_strategy_new(model, &so, &s) != TS_OK ||
        ts_module_parameters(ts_strategy_model(s), &params) != TS_OK ||
        ts_optimizer_by_name(a.optimizer, &params, a.lr, a.momentum, a.weight_decay, &opt) != TS_OK ||
        ts_lr_schedule_by_name(a.schedule, a.lr, a.epochs * nb > a.warmup_steps ? a.epochs * nb - a.warmup_steps : 1, nb,
                               &sched) != TS_OK)
        goto fail;
    if (a.warmup_steps > 0) sched = ts_lr_with_warmup(sched, a.warmup_steps, 1.0 / 3.0);
    train_view view = {.a = &a};
    cli_progress_init(&view.bar);
    ts_trainer_opts to = trainer_opts(&a, &sched, test, &view, &rng);
    if (ts_trainer_new(s, opt, train, &to, &t) != TS_OK) goto fail;
    if (a.resume) {
        if (ts_trainer_resume(t, a.resume) != TS_OK) {
            fprintf(stderr, "tessera train: --resume: %s\n", ts_last_error());
            status = CLI_EXIT_USAGE;
            goto done;
        }
        if (rank == 0)
            printf("resumed from %s at epoch %lld, batch %lld (step %lld)\n", a.resume, (long long)ck.epoch + 1,
                   (long long)ck.batch, (long long)ck.step);
    }
    if (rank == 0) print_banner(&a, s, train);
    fflush(stdout);
    ts_train_result r;
    if (ts_trainer_run(t, &r) != TS_OK) goto fail;
    status = 0;
    if (rank != 0) goto done;
    printf("done: %lld steps, test accuracy %.2f%%, %.0f images/s, %.1f s training\n", (long long)r.steps,
           100.0 * r.eval.accuracy, r.images_per_second, r.train_seconds);
    if (a.prec == TS_F16)
        printf("loss scaling: %lld step%s skipped for inf/NaN gradients, scale now %g\n", (long long)r.skipped_steps,
               r.skipped_steps == 1 ? "" : "s", (double)r.loss_scale);
    if (a.metrics_json) status = write_metrics(&a, &r, ts_strategy_world_size(s));
    goto done;
fail:
    if (pg)
        fprintf(stderr, "\ntessera train: rank %d: %s\n", rank, ts_last_error());
    else
        fprintf(stderr, "\ntessera train: %s\n", ts_last_error());
done:
    ts_trainer_free(t);
    ts_tensor_list_clear(&params);
    ts_optimizer_free(opt);
    ts_strategy_free(s);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    if (pg && status != 0) ts_pg_abort(pg, "tessera train failed on this rank");
    ts_pg_free(pg);
    return status;
}
