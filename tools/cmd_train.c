/*
 * tools/cmd_train.c — `tessera train`: trains a model on IDX (MNIST-style)
 * data with a progress bar, evaluates after every epoch, writes checkpoints
 * and a metrics JSON, and resumes from a checkpoint bit for bit.
 */
#include "cli.h"
#include "commands.h"
#include "train_common.h"
#include "train_data.h"

#include "tessera.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TRY_GOTO(expr)              \
    do {                            \
        st = (expr);                \
        if (st != TS_OK) goto fail; \
    } while (0)

typedef struct train_args {
    const char *data, *model, *optimizer, *schedule;
    const char *checkpoint, *resume, *metrics_json;
    const char *backend; /* --backend: the process group's backend (builtin, mpi) */
    int64_t data_threads;
    int64_t epochs, max_steps, batch_size, seed, threads, nproc;
    double lr, momentum, weight_decay, label_smoothing, timeout;
    bool quiet;
    bool sync_bn; /* --sync-bn: BatchNorm2d -> SyncBatchNorm when distributed */
    /* --strategy NAME --devices LIST [--micro-batches N --schedule S]: one process, many devices */
    const char *strategy, *devices, *pp_schedule;
    int64_t micro_batches;
} train_args;

/* Checkpoint metadata keys. */
#define CK_EPOCH "train.epoch" /* epoch to continue with */
#define CK_BATCH "train.batch" /* batch index within that epoch */
#define CK_STEP "train.step"   /* optimizer steps done */
#define CK_SEED "train.seed"
#define CK_BATCH_SIZE "train.batch_size"
#define CK_MODEL "train.model"
#define CK_OPTIM "train.optimizer"
#define CK_RNG "train.rng"
#define CK_LOSS "train.loss"
#define CK_WORLD "train.world_size"

static ts_status save_checkpoint(const char *path, ts_module *model, ts_optimizer *opt, const train_args *a,
                                 int64_t epoch, int64_t batch, int64_t step, const ts_rng *rng, double loss,
                                 int world) {
    ts_status st;
    ts_ckpt *ck = ts_ckpt_new();
    ts_tensor_list sd = TS_TENSOR_LIST_INIT, os = TS_TENSOR_LIST_INIT;
    if (!ck) return TS_ERR_NOMEM;
    TRY_GOTO(ts_module_state_dict(model, &sd));
    TRY_GOTO(ts_optimizer_state(opt, &os));
    TRY_GOTO(ts_ckpt_add_tensors(ck, "model.", &sd));
    TRY_GOTO(ts_ckpt_add_tensors(ck, "optim.", &os));
    TRY_GOTO(ts_ckpt_set_i64(ck, CK_EPOCH, epoch));
    TRY_GOTO(ts_ckpt_set_i64(ck, CK_BATCH, batch));
    TRY_GOTO(ts_ckpt_set_i64(ck, CK_STEP, step));
    TRY_GOTO(ts_ckpt_set_i64(ck, CK_SEED, a->seed));
    TRY_GOTO(ts_ckpt_set_i64(ck, CK_BATCH_SIZE, a->batch_size));
    TRY_GOTO(ts_ckpt_set_f64(ck, CK_LOSS, loss));
    TRY_GOTO(ts_ckpt_set_i64(ck, CK_WORLD, world));
    TRY_GOTO(ts_ckpt_set_bytes(ck, CK_MODEL, a->model, strlen(a->model)));
    TRY_GOTO(ts_ckpt_set_bytes(ck, CK_OPTIM, a->optimizer, strlen(a->optimizer)));
    TRY_GOTO(ts_ckpt_set_bytes(ck, CK_RNG, rng, sizeof *rng));
    TRY_GOTO(ts_ckpt_save(ck, path));
fail:
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&os);
    ts_ckpt_free(ck);
    return st;
}

/* Compares a string stored in the checkpoint with the run's value. */
static int check_same(const ts_ckpt *ck, const char *key, const char *want, const char *flag, const char *path) {
    const void *p;
    size_t n;
    if (ts_ckpt_get_bytes(ck, key, &p, &n) != TS_OK) {
        fprintf(stderr, "tessera train: --resume %s: not a training checkpoint (no %s)\n", path, key);
        return CLI_EXIT_USAGE;
    }
    if (n != strlen(want) || memcmp(p, want, n) != 0) {
        fprintf(stderr, "tessera train: --resume %s was written with %s %.*s, this run has %s %s\n", path, flag,
                (int)n, (const char *)p, flag, want);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* `tessera train --nproc N` outside a launcher: run N copies of this command
 * through `tessera run`, which sets RANK, WORLD_SIZE, MASTER_ADDR, ... */
static int relaunch(int argc, char **argv, int64_t nproc) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "tessera train: cannot find the tessera executable: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = '\0';
    char nbuf[32];
    snprintf(nbuf, sizeof nbuf, "%lld", (long long)nproc);
    char **rargv = calloc((size_t)argc + 6, sizeof *rargv);
    if (!rargv) return 1;
    int k = 0;
    rargv[k++] = "run";
    rargv[k++] = "-n";
    rargv[k++] = nbuf;
    rargv[k++] = "--";
    rargv[k++] = exe;
    for (int i = 0; i < argc; i++) rargv[k++] = argv[i]; /* "train" and its flags */
    int rc = ts_cmd_run(k, rargv);
    free(rargv);
    return rc;
}

/* `tessera train --backend mpi --nproc N` outside mpirun: the MPI backend's ranks are
 * MPI_COMM_WORLD's, so run N copies of this command through mpirun instead. */
static int relaunch_mpirun(int argc, char **argv, int64_t nproc) {
    char exe[4096], nbuf[32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "tessera train: cannot find the tessera executable: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = '\0';
    snprintf(nbuf, sizeof nbuf, "%lld", (long long)nproc);
    char **margv = calloc((size_t)argc + 8, sizeof *margv);
    if (!margv) return 1;
    int k = 0;
    margv[k++] = "mpirun";
    if (geteuid() == 0) margv[k++] = "--allow-run-as-root";
    margv[k++] = "--oversubscribe"; /* like tessera run: any N on this machine */
    margv[k++] = "-n";
    margv[k++] = nbuf;
    margv[k++] = exe;
    for (int i = 0; i < argc; i++) margv[k++] = argv[i]; /* "train" and its flags */
    fflush(NULL);
    execvp("mpirun", margv);
    fprintf(stderr, "tessera train: --backend mpi --nproc %lld: cannot run mpirun: %s (install openmpi-bin, or run "
                    "under mpirun -n N yourself)\n", (long long)nproc, strerror(errno));
    free(margv);
    return 1;
}

static const char *basename_of(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* --strategy/--devices: the strategy and its devices, or a usage error (exit status). Without
 * TS_CPU_DEVICES, the number of virtual CPU devices grows to cover the highest cpu:K listed. */
static int parse_strategy(const cli_command *cmd, const train_args *a, const train_strategy **s, ts_device **devs,
                          int max, int *ndev) {
    if (!a->strategy) return cli_usage_error(cmd, "--devices needs --strategy (%s)", strategy_names());
    if (!(*s = strategy_find(a->strategy)))
        return cli_usage_error(cmd, "unknown --strategy '%s' (expected %s)", a->strategy, strategy_names());
    if (a->nproc > 1 || getenv("WORLD_SIZE"))
        return cli_usage_error(cmd, "--strategy %s runs one process on several devices; it cannot be combined with "
                                    "--nproc %lld or a launcher (DDP over processes): use one or the other",
                               a->strategy, (long long)a->nproc);
    if (strcmp(a->pp_schedule, "gpipe") != 0 && strcmp(a->pp_schedule, "1f1b") != 0)
        return cli_usage_error(cmd, "unknown --schedule '%s' (expected gpipe or 1f1b)", a->pp_schedule);
    char list[512];
    if (a->devices) {
        const char *env = getenv("TS_CPU_DEVICES");
        int want = 0;
        for (const char *p = strstr(a->devices, "cpu:"); p; p = strstr(p + 4, "cpu:")) {
            char *end;
            long k = strtol(p + 4, &end, 10);
            if (end != p + 4 && k >= 0 && k < TS_MAX_CPU_DEVICES && k + 1 > want) want = (int)k + 1;
        }
        if ((!env || !*env) && want > ts_cpu_device_count()) ts_set_cpu_device_count(want);
        snprintf(list, sizeof list, "%s", a->devices);
    } else {
        size_t len = 0;
        for (int i = 0; i < ts_cpu_device_count() && len < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%scpu:%d", i ? "," : "", i);
    }
    if (ts_device_list_parse(list, devs, max, ndev) != TS_OK)
        return cli_usage_error(cmd, "--devices: %s", ts_last_error());
    return 0;
}

int ts_cmd_train(int argc, char **argv) {
    train_args a = {
        .data = "/usr/share/datasets/fashion-mnist",
        .data_threads = 2,
        .model = "cnn",
        .optimizer = "sgd",
        .schedule = "cosine",
        .epochs = 4,
        .max_steps = 0,
        .batch_size = 64,
        .seed = 0,
        .threads = 0,
        .lr = 0.05,
        .momentum = 0.9,
        .weight_decay = 5e-4,
        .label_smoothing = 0.0,
        .nproc = 1,
        .micro_batches = 8,
        .pp_schedule = "1f1b",
        .backend = "builtin",
        .timeout = 0.0,
    };
    const cli_flag flags[] = {
        {"data", CLI_STRING, &a.data, "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz], or images: a folder with one sub-folder per class (or its train/ and test/), or a \"path label\" list", 1, 0},
        {"data-threads", CLI_INT, &a.data_threads, "worker threads decoding images (image --data only)", 1, 256},
        {"model", CLI_STRING, &a.model, "cnn (the reference CNN) or mlp", 1, 0},
        {"epochs", CLI_INT, &a.epochs, "number of epochs", 1, 1e6},
        {"max-steps", CLI_INT, &a.max_steps, "stop after this many optimizer steps in all (0: no limit)", 0, 1e12},
        {"batch-size", CLI_INT, &a.batch_size, "images per step", 1, 1 << 20},
        {"lr", CLI_FLOAT, &a.lr, "peak learning rate", 0, 1e3},
        {"momentum", CLI_FLOAT, &a.momentum, "SGD momentum", 0, 1},
        {"weight-decay", CLI_FLOAT, &a.weight_decay, "weight decay (SGD: L2; AdamW: decoupled)", 0, 1},
        {"optimizer", CLI_STRING, &a.optimizer, "sgd or adamw", 1, 0},
        {"lr-schedule", CLI_STRING, &a.schedule, "none, step (x0.1 every epoch) or cosine (over all steps)", 1, 0},
        {"label-smoothing", CLI_FLOAT, &a.label_smoothing, "cross-entropy label smoothing", 0, 1},
        {"seed", CLI_INT, &a.seed, "seed for initialisation and shuffling", 0, 9.2e18},
        {"threads", CLI_INT, &a.threads, "CPU threads (0: OMP_NUM_THREADS or all cores)", 0, 4096},
        {"checkpoint", CLI_STRING, &a.checkpoint, "save model+optimizer after every epoch and at the end", 1, 0},
        {"resume", CLI_STRING, &a.resume, "continue the run saved in this checkpoint", 1, 0},
        {"metrics-json", CLI_STRING, &a.metrics_json, "write final metrics to this JSON file", 1, 0},
        {"quiet", CLI_BOOL, &a.quiet, "no progress bar", 1, 0},
        {"nproc", CLI_INT, &a.nproc, "processes on this machine, each a DDP rank (launched through tessera run)", 1, 1024},
        {"strategy", CLI_STRING, &a.strategy, "one process, many devices: data, model, pipeline or tile (see --devices)", 1, 0},
        {"devices", CLI_STRING, &a.devices, "devices for --strategy, e.g. cpu:0,cpu:1 (default: every virtual CPU device)", 1, 0},
        {"micro-batches", CLI_INT, &a.micro_batches, "--strategy pipeline: micro-batches per batch", 1, 1 << 20},
        {"schedule", CLI_STRING, &a.pp_schedule, "--strategy pipeline: gpipe or 1f1b", 1, 0},
        {"timeout", CLI_FLOAT, &a.timeout, "seconds a rank waits for the others (0: TS_DIST_TIMEOUT or 1800)", 0, 1e7},
        {"backend", CLI_STRING, &a.backend, "process group backend: builtin, or mpi (under mpirun; --nproc starts mpirun)", 1, 0},
        {"sync-bn", CLI_BOOL, &a.sync_bn, "with --nproc > 1: BatchNorm statistics over all ranks' batches (SyncBatchNorm)", 1, 0},
    };
    const cli_command cmd = {
        "train", "tessera train [flags]",
        "Trains a model on Fashion-MNIST (or any MNIST-format IDX data set), prints the test\n"
        "accuracy after every epoch and saves checkpoints. The reference CNN is\n"
        "conv(1->32,3x3)-BN-ReLU-maxpool -> conv(32->64,3x3)-BN-ReLU-maxpool -> linear(3136->128)-ReLU -> linear(128->10).",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;

    if (strcmp(a.model, "cnn") != 0 && strcmp(a.model, "mlp") != 0)
        return cli_usage_error(&cmd, "unknown --model '%s' (expected cnn or mlp)", a.model);
    if (strcmp(a.optimizer, "sgd") != 0 && strcmp(a.optimizer, "adamw") != 0)
        return cli_usage_error(&cmd, "unknown --optimizer '%s' (expected sgd or adamw)", a.optimizer);
    if (strcmp(a.schedule, "none") != 0 && strcmp(a.schedule, "step") != 0 && strcmp(a.schedule, "cosine") != 0)
        return cli_usage_error(&cmd, "unknown --lr-schedule '%s' (expected none, step or cosine)", a.schedule);
    if (strcmp(a.backend, "builtin") != 0 && strcmp(a.backend, "mpi") != 0)
        return cli_usage_error(&cmd, "unknown --backend '%s' (expected builtin or mpi)", a.backend);
    struct stat sb;
    if (stat(a.data, &sb) != 0 || !(S_ISDIR(sb.st_mode) || S_ISREG(sb.st_mode)))
        return cli_usage_error(&cmd, "--data %s: %s", a.data,
                               stat(a.data, &sb) != 0 ? strerror(errno) : "not a directory or a file list");
    /* --strategy: one process, many devices (tools/strategy.h) */
    const train_strategy *strategy = NULL;
    ts_device *devs[TS_MAX_CPU_DEVICES + 1];
    int ndev = 0;
    if ((a.strategy || a.devices) &&
        (rc = parse_strategy(&cmd, &a, &strategy, devs, (int)(sizeof devs / sizeof devs[0]), &ndev)) != 0)
        return rc;
    /* distributed: WORLD_SIZE set by a launcher (tessera run, torchrun, mpirun via env) */
    const char *ws_env = getenv("WORLD_SIZE");
    bool use_mpi = strcmp(a.backend, "mpi") == 0;
    if (!ws_env && use_mpi) ws_env = getenv("OMPI_COMM_WORLD_SIZE"); /* plain mpirun sets no WORLD_SIZE */
    if (a.nproc > 1 && !ws_env && use_mpi) return relaunch_mpirun(argc, argv, a.nproc);
    if (a.nproc > 1 && !ws_env) return relaunch(argc, argv, a.nproc);
    /* A launched world of 1 is distributed too: its DistributedSampler order is the union of
     * the shares of N ranks at batch B/N, so runs compare across world sizes (tests/cli_ddp.sh). */
    bool distributed = ws_env && atoi(ws_env) >= 1;
    if (a.threads > 0) {
        ts_set_num_threads((int)a.threads);
    } else if (distributed) { /* share the cores between the local ranks */
        const char *lws = getenv("LOCAL_WORLD_SIZE");
        if (!lws && use_mpi) lws = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        long cores = sysconf(_SC_NPROCESSORS_ONLN), local = lws ? atol(lws) : 1;
        ts_set_num_threads((int)(local > 0 && cores / local > 0 ? cores / local : 1));
    }
    ts_process_group *pg = NULL;
    int rank = 0, world = 1;
    if (distributed) {
        ts_pg_options po = TS_PG_OPTIONS_INIT;
        po.timeout_s = a.timeout;
        po.backend = a.backend;
        if (ts_pg_new(&po, &pg) != TS_OK) {
            fprintf(stderr, "tessera train: joining the process group: %s\n", ts_last_error());
            return 1;
        }
        rank = ts_pg_rank(pg);
        world = ts_pg_size(pg);
    }
    const bool leader = rank == 0;

    /* resume: read the checkpoint first so its seed decides the data order */
    ts_ckpt *ck = NULL;
    int64_t start_epoch = 0, start_batch = 0, step = 0;
    if (a.resume) {
        if (ts_ckpt_load(a.resume, &ck) != TS_OK) {
            fprintf(stderr, "tessera train: --resume: %s\n", ts_last_error());
            ts_pg_free(pg);
            return CLI_EXIT_USAGE;
        }
        int64_t seed = 0, bs = 0;
        if ((rc = check_same(ck, CK_MODEL, a.model, "--model", a.resume)) ||
            (rc = check_same(ck, CK_OPTIM, a.optimizer, "--optimizer", a.resume))) {
            ts_ckpt_free(ck);
            ts_pg_free(pg);
            return rc;
        }
        if (ts_ckpt_get_i64(ck, CK_EPOCH, &start_epoch) != TS_OK || ts_ckpt_get_i64(ck, CK_BATCH, &start_batch) != TS_OK ||
            ts_ckpt_get_i64(ck, CK_STEP, &step) != TS_OK || ts_ckpt_get_i64(ck, CK_SEED, &seed) != TS_OK ||
            ts_ckpt_get_i64(ck, CK_BATCH_SIZE, &bs) != TS_OK) {
            fprintf(stderr, "tessera train: --resume %s: missing training state: %s\n", a.resume, ts_last_error());
            ts_ckpt_free(ck);
            ts_pg_free(pg);
            return CLI_EXIT_USAGE;
        }
        if (bs != a.batch_size) {
            fprintf(stderr, "tessera train: --resume %s was written with --batch-size %lld, this run has %lld\n",
                    a.resume, (long long)bs, (long long)a.batch_size);
            ts_ckpt_free(ck);
            ts_pg_free(pg);
            return CLI_EXIT_USAGE;
        }
        int64_t ck_world = 1;
        ts_ckpt_get_i64(ck, CK_WORLD, &ck_world); /* absent in single-process checkpoints */
        if (ck_world != world) {
            fprintf(stderr, "tessera train: --resume %s was written by %lld processes, this run has %d\n", a.resume,
                    (long long)ck_world, world);
            ts_ckpt_free(ck);
            ts_pg_free(pg);
            return CLI_EXIT_USAGE;
        }
        a.seed = seed;
    }

    int status = 1;
    ts_status st = TS_OK;
    ts_dataset *train = NULL, *test = NULL;
    ts_loader *loader = NULL;
    ts_pipeline *pipe = NULL; /* image --data: the DALI-style pipeline replaces train and loader */
    ts_module *model = NULL; /* what trains: the model, or the --strategy runner around it */
    ts_module *net = NULL;   /* the model itself (borrowed): checkpoints hold its state dict */
    ts_optimizer *opt = NULL;
    ts_ddp *ddp = NULL;
    ts_dist_sampler sampler;
    int64_t *rank_idx = NULL, rank_len = 0;
    ts_tensor_list params = TS_TENSOR_LIST_INIT, sd = TS_TENSOR_LIST_INIT, os = TS_TENSOR_LIST_INIT;
    ts_rng rng;
    ts_rng_seed(&rng, (uint64_t)a.seed);

    if (train_data_is_images(a.data)
            ? train_images_open(a.data, a.batch_size, a.seed, (int)a.data_threads, rank, world, leader, &pipe, &test) != TS_OK
            : (ts_dataset_load_mnist(a.data, "train", &train) != TS_OK || ts_dataset_load_mnist(a.data, "test", &test) != TS_OK)) {
        fprintf(stderr, "tessera train: --data %s: %s\n", a.data, ts_last_error());
        status = CLI_EXIT_USAGE;
        goto done;
    }
    ts_loader_opts lo = TS_LOADER_OPTS_INIT;
    lo.batch_size = a.batch_size;
    lo.seed = (uint64_t)a.seed;
    if (!pipe && (st = ts_loader_new(train, &lo, &loader)) != TS_OK) goto fail;
    int64_t nbatches = pipe ? ts_pipeline_num_batches(pipe, 0) : ts_loader_num_batches(loader);
    if (distributed && !pipe) { /* each rank iterates its DistributedSampler share (a pipeline reads its shard) */
        if ((st = ts_dist_sampler_init(&sampler, ts_dataset_size(train), world, rank, true, (uint64_t)a.seed, false)) !=
            TS_OK)
            goto fail;
        rank_len = ts_dist_sampler_len(&sampler);
        if (!(rank_idx = malloc(sizeof *rank_idx * (size_t)(rank_len ? rank_len : 1)))) {
            st = ts_error(TS_ERR_NOMEM, "out of memory for %lld sample indices", (long long)rank_len);
            goto fail;
        }
        nbatches = (rank_len + a.batch_size - 1) / a.batch_size;
    }

    if ((st = ts_model_by_name(a.model, &rng, &model)) != TS_OK) goto fail;
    /* before DDP wraps the model (as torch's convert_sync_batchnorm); one process: nothing to synchronise */
    if (a.sync_bn && distributed && (st = ts_nn_convert_sync_batchnorm(model, pg)) != TS_OK) goto fail;
    net = model;
    if (strategy) { /* the runner owns the model (its child "module"), also when wrap fails */
        strategy_config scfg = {(int)a.micro_batches, a.pp_schedule};
        ts_module *runner = NULL;
        st = strategy->wrap(model, devs, ndev, &scfg, &runner);
        model = runner;
        if (st != TS_OK) goto fail;
        net = ts_module_child(model, "module");
    }
    /* the model's own parameter names, so optimizer state in checkpoints is the same with or without --strategy */
    if ((st = ts_module_parameters(net, &params)) != TS_OK) goto fail;
    if (strcmp(a.optimizer, "sgd") == 0) {
        ts_sgd_config c = TS_SGD_CONFIG_INIT;
        c.lr = (float)a.lr;
        c.momentum = (float)a.momentum;
        c.weight_decay = (float)a.weight_decay;
        st = ts_optim_sgd_new(&params, &c, &opt);
    } else {
        ts_adamw_config c = TS_ADAMW_CONFIG_INIT;
        c.lr = (float)a.lr;
        c.weight_decay = (float)a.weight_decay;
        st = ts_optim_adamw_new(&params, &c, &opt);
    }
    if (st != TS_OK) goto fail;

    int64_t total_steps = a.epochs * nbatches;
    ts_lr_schedule sched = strcmp(a.schedule, "cosine") == 0 ? ts_lr_cosine(a.lr, total_steps, 0.0)
                           : strcmp(a.schedule, "step") == 0 ? ts_lr_step(a.lr, nbatches, 0.1)
                                                             : ts_lr_constant(a.lr);

    if (ck) {
        const void *rb;
        size_t rn;
        if ((st = ts_ckpt_get_tensors(ck, "model.", &sd)) != TS_OK ||
            (st = ts_module_load_state_dict(net, &sd, true)) != TS_OK ||
            (st = ts_ckpt_get_tensors(ck, "optim.", &os)) != TS_OK || (st = ts_optimizer_load_state(opt, &os)) != TS_OK) {
            fprintf(stderr, "tessera train: --resume %s: %s\n", a.resume, ts_last_error());
            status = CLI_EXIT_USAGE;
            goto done;
        }
        if (ts_ckpt_get_bytes(ck, CK_RNG, &rb, &rn) == TS_OK && rn == sizeof rng) memcpy(&rng, rb, sizeof rng);
        if (leader)
            printf("resumed from %s at epoch %lld, batch %lld (step %lld)\n", a.resume, (long long)start_epoch + 1,
               (long long)start_batch, (long long)step);
    }

    if (distributed && (st = ts_ddp_new(model, pg, NULL, &ddp)) != TS_OK) goto fail;
    if (leader) {
        printf("training %s on %s: %lld images, %lld batches of %lld per epoch", a.model, a.data,
               (long long)(pipe ? ts_reader_size(ts_pipeline_reader(pipe)) : ts_dataset_size(train)), (long long)nbatches,
               (long long)a.batch_size);
        if (distributed) printf(" per rank, %d ranks (DDP)", world);
        if (strategy) {
            printf(", --strategy %s over", strategy->name);
            for (int i = 0; i < ndev; i++) printf("%s %s", i ? "," : "", ts_device_name(devs[i]));
        }
        printf(", %lld parameters, %d threads%s\n", (long long)ts_module_num_parameters(model), ts_get_num_threads(),
               distributed ? " per rank" : "");
        if (distributed && a.sync_bn) printf("--sync-bn: BatchNorm2d layers are SyncBatchNorm over all %d ranks\n", world);
    }
    fflush(stdout);

    cli_progress bar;
    cli_progress_init(&bar);
    double train_seconds = 0, last_loss = NAN, test_acc = NAN;
    int64_t images = 0, epochs_done = start_epoch;
    bool stopped = false;
    for (int64_t epoch = start_epoch; epoch < a.epochs && !stopped; epoch++) {
        int64_t first = epoch == start_epoch ? start_batch : 0;
        if (pipe) { /* the pipeline runs on from epoch to epoch; seek only to resume */
            if ((ts_pipeline_epoch(pipe) != epoch || ts_pipeline_batch_index(pipe) != first) &&
                (st = ts_pipeline_seek(pipe, epoch, first)) != TS_OK)
                goto fail;
        } else if (distributed) {
            ts_dist_sampler_set_epoch(&sampler, epoch);
            if ((st = ts_dist_sampler_indices(&sampler, rank_idx)) != TS_OK ||
                (st = ts_loader_set_indices(loader, rank_idx, rank_len, first)) != TS_OK)
                goto fail;
        } else if ((st = ts_loader_set_epoch(loader, epoch, first)) != TS_OK) {
            goto fail;
        }
        ts_module_train(model, true);
        double t0 = ts_time_now(), loss_sum = 0;
        int64_t epoch_images = 0, epoch_steps = 0;
        char prefix[64];
        snprintf(prefix, sizeof prefix, "epoch %lld/%lld", (long long)epoch + 1, (long long)a.epochs);
        for (;;) {
            if (a.max_steps > 0 && step >= a.max_steps) {
                stopped = true;
                break;
            }
            ts_tensor *x = NULL, *y = NULL;
            if ((st = pipe ? ts_pipeline_next(pipe, &x, &y, NULL) : ts_loader_next(loader, &x, &y)) != TS_OK) goto fail;
            if (!x) break;
            double lr = ts_lr_schedule_at(&sched, step);
            ts_optimizer_set_lr(opt, (float)lr);
            float loss;
            st = strategy ? train_step_strategy(model, strategy, opt, x, y, (float)a.label_smoothing, &loss)
                          : train_step(model, ddp, opt, x, y, (float)a.label_smoothing, &loss);
            if (st != TS_OK) goto fail;
            step++;
            epoch_steps++;
            epoch_images += ts_tensor_dim(x, 0) * world; /* every rank ran a batch like this one */
            loss_sum += loss;
            last_loss = loss;
            if (!isfinite(loss)) {
                fprintf(stderr, "\ntessera train: the loss became %f at step %lld (epoch %lld); lower --lr\n", loss,
                        (long long)step, (long long)epoch + 1);
                goto done;
            }
            if (!a.quiet && leader) {
                char suffix[128];
                double dt = ts_time_now() - t0;
                snprintf(suffix, sizeof suffix, "loss %.4f  %.0f img/s  lr %.4g", loss_sum / (double)epoch_steps,
                         dt > 0 ? (double)epoch_images / dt : 0.0, lr);
                cli_progress_update(&bar, prefix, train_batch_index(loader, pipe), nbatches, suffix, false);
            }
        }
        double dt = ts_time_now() - t0;
        train_seconds += dt;
        images += epoch_images;
        if (!a.quiet && leader && epoch_steps > 0) {
            char suffix[128];
            snprintf(suffix, sizeof suffix, "loss %.4f  %.0f img/s", loss_sum / (double)epoch_steps,
                     dt > 0 ? (double)epoch_images / dt : 0.0);
            cli_progress_update(&bar, prefix, train_batch_index(loader, pipe), nbatches, suffix, true);
        }
        int64_t next_epoch = stopped ? epoch : epoch + 1, next_batch = stopped ? train_batch_index(loader, pipe) : 0;
        epochs_done = stopped ? epoch : epoch + 1;
        if (!leader) continue; /* rank 0 evaluates and checkpoints; the others go on */
        if ((st = evaluate(model, test, 1000, &test_acc)) != TS_OK) goto fail;
        printf("epoch %lld/%lld: train loss %.4f, test accuracy %.2f%% (%lld images), %.1f s, %.0f images/s\n",
               (long long)epoch + 1, (long long)a.epochs, epoch_steps ? loss_sum / (double)epoch_steps : NAN,
               100.0 * test_acc, (long long)ts_dataset_size(test), dt, dt > 0 ? (double)epoch_images / dt : 0.0);
        if (a.checkpoint) {
            if ((st = save_checkpoint(a.checkpoint, net, opt, &a, next_epoch, next_batch, step, &rng, last_loss,
                                      world)) != TS_OK) {
                fprintf(stderr, "tessera train: saving checkpoint: %s\n", ts_last_error());
                goto done;
            }
            printf("saved checkpoint to %s (epoch %lld, step %lld)\n", a.checkpoint, (long long)next_epoch,
                   (long long)step);
        }
        fflush(stdout);
    }
    if (!leader) {
        status = 0;
        goto done;
    }
    if (isnan(test_acc) && (st = evaluate(model, test, 1000, &test_acc)) != TS_OK) goto fail;

    double ips = train_seconds > 0 ? (double)images / train_seconds : 0.0;
    printf("done: %lld steps, test accuracy %.2f%%, %.0f images/s, %.1f s training\n", (long long)step,
           100.0 * test_acc, ips, train_seconds);
    if (a.metrics_json) {
        FILE *f = fopen(a.metrics_json, "w");
        if (!f) {
            fprintf(stderr, "tessera train: --metrics-json %s: %s\n", a.metrics_json, strerror(errno));
            goto done;
        }
        fprintf(f,
                "{\n  \"model\": \"%s\",\n  \"test_accuracy\": %.6f,\n  \"images_per_second\": %.1f,\n"
                "  \"epochs\": %lld,\n  \"steps\": %lld,\n  \"final_loss\": %.6f,\n  \"train_seconds\": %.3f,\n"
                "  \"threads\": %d,\n  \"batch_size\": %lld,\n  \"processes\": %d,\n  \"data\": \"%s\"\n}\n",
                a.model, test_acc, ips, (long long)epochs_done, (long long)step, isfinite(last_loss) ? last_loss : -1.0,
                train_seconds, ts_get_num_threads(), (long long)a.batch_size, world, basename_of(a.data));
        if (fclose(f) != 0) {
            fprintf(stderr, "tessera train: --metrics-json %s: %s\n", a.metrics_json, strerror(errno));
            goto done;
        }
    }
    status = 0;
    goto done;

fail:
    if (distributed)
        fprintf(stderr, "tessera train: rank %d: %s\n", rank, ts_last_error());
    else
        fprintf(stderr, "tessera train: %s\n", ts_last_error());
    status = 1;
done:
    ts_ddp_free(ddp);
    free(rank_idx);
    ts_tensor_list_clear(&params);
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&os);
    ts_optimizer_free(opt);
    ts_module_free(model);
    ts_loader_free(loader);
    ts_pipeline_free(pipe);
    ts_dataset_free(train);
    ts_dataset_free(test);
    ts_ckpt_free(ck);
    if (pg && status != 0) ts_pg_abort(pg, "tessera train failed on this rank");
    ts_pg_free(pg);
    return status;
}
