/*
 * tessera/run.h — a training run described as data. A ts_run_config holds
 * everything `tessera train` takes (its flags are the config's fields, spelled
 * with '-' for '_'), ts_run_config_check says what is wrong with one, and
 * ts_run_open builds the run the way the command does: the launcher's process
 * group, the data, the model (or the resumed checkpoint's), the strategy, the
 * optimizer with its learning-rate schedule, the precision and the trainer.
 *
 *     ts_run_config c = TS_RUN_CONFIG_INIT;      // tessera train's defaults
 *     c.model = "resnet18"; c.image_size = 64; c.data = "/data/imagenette";
 *     c.precision = TS_PRECISION_BF16; c.max_steps = 500;
 *     ts_run *run;
 *     if (ts_run_open(&c, &run) != TS_OK) { puts(ts_last_error()); ... }
 *     ts_train_result r;  ts_run_train(run, &r);  // progress: c.callback
 *     ts_run_free(run);
 *
 * Under a launcher (torchrun, tessera run, mpirun, srun: ts_dist_env_detect)
 * every process is one DDP rank of the job; `nproc` > 1 outside one asks the
 * caller to start that many copies (ts_run_processes_to_start: `tessera train
 * --nproc N` re-runs itself under `tessera run` or mpirun).
 *
 * Messages name the config's fields (model, image_size, strategy, ...), which
 * are also the command's flags (--model, --image-size, --strategy, ...).
 *
 * Ownership: the config's strings are borrowed by ts_run_open and must outlive
 * the run; ts_run_free frees everything the run made.
 */
#ifndef TESSERA_RUN_H
#define TESSERA_RUN_H

#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- names of the config's enums ------------------------------------------------------------------------- */
/* The precision of a run, in one place: the matmul precision (ts_set_matmul_precision), autocast
 * (ts_set_autocast) and the trainer's loss scaler.
 *   TS_PRECISION_FP32 "fp32"  float32 everywhere.
 *   TS_PRECISION_BF16 "bf16"  matmuls and convolutions in bfloat16 with float32 accumulation, and autocast
 *                             on the CPU: bfloat16 activations between layers (TS_AUTOCAST=fp32 in the
 *                             environment: products only); weights, optimizer, losses stay float32.
 *   TS_PRECISION_FP16 "fp16"  operands rounded to float16 with dynamic loss scaling from loss_scale. */
typedef enum ts_precision { TS_PRECISION_FP32 = 0, TS_PRECISION_BF16, TS_PRECISION_FP16, TS_PRECISION_COUNT } ts_precision;
/* "fp32", "bf16", "fp16" (static), NULL for another value. */
const char *ts_precision_name(ts_precision p);
/* The precision called name (any case); another name is TS_ERR_INVALID_ARG listing the known ones. */
ts_status ts_precision_from_name(const char *name, ts_precision *out);
/* TS_F32, TS_BF16 or TS_F16. */
ts_dtype ts_precision_dtype(ts_precision p);
/* Sets the process-wide matmul precision and autocast for p (autocast: bfloat16 for TS_PRECISION_BF16, else
 * off; TS_AUTOCAST in the environment decides when it is set). What ts_run_open does; for other programs
 * (`tessera bench train`) that run without a ts_run. */
ts_status ts_precision_apply(ts_precision p);

/* The process group's backend: TS_RUN_BACKEND_AUTO "auto" (nccl when every rank of a host has a GPU of
 * its own: device "cuda", as PyTorch; else builtin), TS_RUN_BACKEND_BUILTIN "builtin" (shared memory +
 * TCP), TS_RUN_BACKEND_MPI "mpi" (the ranks of mpirun), TS_RUN_BACKEND_NCCL "nccl" (CUDA devices). */
typedef enum ts_run_backend {
    TS_RUN_BACKEND_AUTO = 0,
    TS_RUN_BACKEND_BUILTIN,
    TS_RUN_BACKEND_MPI,
    TS_RUN_BACKEND_NCCL,
    TS_RUN_BACKEND_COUNT
} ts_run_backend;
const char *ts_run_backend_name(ts_run_backend b);
ts_status ts_run_backend_from_name(const char *name, ts_run_backend *out);

/* The other enums have theirs beside them: ts_optimizer_kind and ts_lr_kind (tessera/train.h:
 * ts_optimizer_kind_name / _from_name, ts_lr_kind_name / _from_name), ts_strategy_kind
 * (ts_strategy_kind_name / _parse), ts_pp_schedule (tessera/parallel.h), ts_decode_device
 * (tessera/pipeline.h), ts_conv_algo (tessera/core.h). */

/* ---- the config ------------------------------------------------------------------------------------------ */
typedef struct ts_run_config {
    size_t size;          /* sizeof(ts_run_config) */
    unsigned int magic;   /* TS_RUN_CONFIG_MAGIC */
    unsigned int version; /* TS_RUN_CONFIG_VERSION */
    /* the model */
    const char *model;        /* a zoo name (ts_model_info); NULL: the resumed checkpoint's, else "cnn" */
    int64_t num_classes;      /* outputs of the last layer; 0: the data's classes (resuming: the checkpoint's) */
    int64_t image_size;       /* ResNets: the RGB crops' side; 0: the model's default (resuming: the
                                 checkpoint's); cnn and mlp take 28 only */
    const char *init_from;    /* start from these weights (safetensors or checkpoint; strict; ignored when
                                 resuming); NULL: fresh */
    const char *init_exclude; /* init_from: keep the fresh weights under these comma-separated prefixes */
    /* a GPT-2 model (model "gpt2", "gpt2-medium", ..., "gpt2-tiny": ts_gpt_preset), each 0 for the preset's */
    int64_t n_layer, n_head, n_embd;
    int64_t seq_len;          /* the context length; also the token data's rows (T) */
    int64_t vocab_size;       /* 0: the token data's (its largest id + 1), else the preset's */
    double dropout;           /* embedding and residual dropout */
    bool activation_checkpointing; /* the model's units (GPT blocks, ResNet residual blocks) keep only their
                                      input and recompute their forward in backward
                                      (ts_model_set_activation_checkpointing); a model without units fails */
    /* the data */
    const char *data;         /* IDX folder, image folder, "path label" list, or a folder of token shards */
    int64_t data_threads;     /* images: decoding worker threads */
    ts_decode_device decode;  /* images: TS_DECODE_MIXED decodes the training JPEGs on `device` (nvJPEG) */
    bool skip_corrupt;        /* images: leave out (and count) undecodable files instead of failing */
    int64_t batch_size;       /* images per step on each rank */
    int64_t seed;             /* initialisation and shuffling (resuming: the checkpoint's) */
    /* the optimization */
    ts_optimizer_kind optimizer;
    double lr, momentum, weight_decay, label_smoothing;
    ts_lr_kind lr_schedule;   /* over the run's steps: epochs x steps per epoch, or max_steps when fewer */
    int64_t warmup_steps;     /* linear warmup from lr/3 (torch's LinearLR) over these, then the schedule */
    int64_t epochs;
    int64_t max_steps;        /* the run's length in optimizer steps when fewer than the epochs' (0: none) */
    int64_t eval_every;       /* also evaluate (rank 0) every this many optimizer steps (0: at epoch ends) */
    int64_t eval_batches;     /* token data: evaluate on the first this many validation batches (0: all) */
    int64_t accum_steps;      /* batches per optimizer step (gradient accumulation) */
    double clip_grad_norm;    /* clip the gradients' global L2 norm to this (0: off) */
    /* the arithmetic */
    ts_precision precision;
    double loss_scale;        /* TS_PRECISION_FP16: the loss scaler's initial scale */
    ts_conv_algo conv_algo;
    int64_t threads;          /* CPU threads (0: OMP_NUM_THREADS, else the cores; a launched rank its share) */
    /* where it runs */
    ts_strategy_kind strategy; /* one process on several devices (DATA, MODEL, PIPELINE, TILE); NONE: one
                                  device, DDP under a launcher (or nproc > 1) */
    const char *devices;      /* the strategy's devices ("cpu:0,cpu:1"); NULL: every virtual CPU device */
    const char *device;       /* the one device of each process ("cpu", "cpu:K", "cuda:N"; "cuda": under a
                                 launcher cuda:LOCAL_RANK, wrapping around the GPUs); NULL: the CPU */
    int64_t micro_batches;    /* PIPELINE: micro-batches per batch */
    ts_pp_schedule pp_schedule; /* PIPELINE */
    int64_t nproc;            /* processes on this machine, each a DDP rank (see ts_run_processes_to_start) */
    ts_run_backend backend;
    double timeout;           /* seconds a rank waits for the others (0: TS_DIST_TIMEOUT or 1800) */
    bool sync_bn;             /* DDP: BatchNorm statistics over all ranks */
    ts_precision ddp_comm;    /* DDP: gradient all-reduce in fp32 or bf16 */
    /* checkpoints */
    const char *checkpoint;   /* rank 0 saves here after every epoch and at the end */
    const char *checkpoint_dir; /* ...and/or step-<N>.ckpt files here; a folder holding one resumes from the
                                   newest complete one */
    int64_t keep;             /* checkpoint_dir: the newest `keep` (0: all) */
    int64_t checkpoint_every; /* also save every this many steps (0: epoch ends only) */
    const char *resume;       /* continue the run saved here (its model, classes, image size and seed) */
    /* seeing inside */
    const char *trace, *metrics_csv; /* ts_trainer_opts.trace_path / .metrics_csv */
    ts_train_callback callback;      /* the trainer's events, on every rank (NULL: none) */
    void *user;
    /* a model of your own instead of the zoo's (a custom module, a Sequential of layers, a module written in
     * Python): borrowed, it must outlive the run. NULL: the zoo's `model`. The run trains it in place (through
     * ts_module_share, as the strategies own what they wrap; trained values on another device are copied
     * back when ts_run_train returns). `model` is then the name checkpoints record (NULL: its type name,
     * ts_module_type_name), not a zoo name; num_classes is the data's unless given (the module's outputs are
     * its own); image folders need image_size. Resuming (resume, checkpoint_dir) loads the checkpoint into it:
     * the checkpoint must come from a run of a module with that name and the same state-dict keys and shapes.
     * Not in the fields table: it is no flag. */
    ts_module *module;
} ts_run_config;

#define TS_RUN_CONFIG_MAGIC 0x7e5a7201u
#define TS_RUN_CONFIG_VERSION 2u
/* `tessera train`'s defaults. */
#define TS_RUN_CONFIG_INIT                                                                                      \
    ((ts_run_config){.size = sizeof(ts_run_config), .magic = TS_RUN_CONFIG_MAGIC,                              \
                     .version = TS_RUN_CONFIG_VERSION, .data = "/usr/share/datasets/fashion-mnist",          \
                     .data_threads = 2, .decode = TS_DECODE_CPU, .batch_size = 64, .optimizer = TS_OPTIMIZER_SGD, \
                     .lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .lr_schedule = TS_LR_COSINE, .epochs = 4,  \
                     .accum_steps = 1, .precision = TS_PRECISION_FP32, .loss_scale = 65536.0,                  \
                     .conv_algo = TS_CONV_AUTO, .strategy = TS_STRATEGY_NONE, .micro_batches = 8,              \
                     .pp_schedule = TS_PP_1F1B, .nproc = 1, .backend = TS_RUN_BACKEND_AUTO,                    \
                     .ddp_comm = TS_PRECISION_FP32})

/* ---- the config's fields by name ---------------------------------------------------------------------------- */
/* Every field a run can be told, as a table: what `tessera train` builds its flags from, the Python package's
 * tessera.train(**fields) sets through ts_run_config_set, and ts_run_config_check checks ranges and enums
 * with. (The callback, user and the header fields are not in it.) */
typedef enum ts_run_field_kind {
    TS_RUN_FIELD_INT,    /* int64_t */
    TS_RUN_FIELD_FLOAT,  /* double */
    TS_RUN_FIELD_STRING, /* const char * (borrowed) */
    TS_RUN_FIELD_BOOL,   /* bool */
    TS_RUN_FIELD_ENUM    /* an int-sized enum */
} ts_run_field_kind;

typedef struct ts_run_field {
    const char *name;  /* the config's field: "image_size" */
    const char *flag;  /* `tessera train`'s flag, without the dashes: "image-size" ("schedule" for pp_schedule) */
    ts_run_field_kind kind;
    size_t offset;     /* of the field in ts_run_config */
    double min, max;   /* INT, FLOAT: the range; ENUM: the first and last value allowed; else min > max */
    const char *(*value_name)(int); /* ENUM: the library's name of each value */
    const char *help;  /* one line, in the command's words */
} ts_run_field;

/* The table (static) and, when n is not NULL, its length. */
const ts_run_field *ts_run_fields(int *n);
/* The field called name — its field name or its flag, '-' and '_' alike — or NULL. */
const ts_run_field *ts_run_field_find(const char *name);
/* Sets the field called name from its text form: an integer, a number, a non-empty string (borrowed: it must
 * outlive the run), true/false/1/0, or an enum value's name (any case). Unknown fields, malformed values and
 * values out of the field's range are TS_ERR_INVALID_ARG naming the field; c is unchanged then. */
ts_status ts_run_config_set(ts_run_config *c, const char *name, const char *value);

/* What is wrong with c, before anything is built: TS_OK, or TS_ERR_INVALID_ARG (TS_ERR_IO for a data path
 * that cannot be read, TS_ERR_UNSUPPORTED for a backend this build lacks) with a message naming the field:
 * an unknown model, values out of range, an image_size the model cannot take, combinations that cannot work
 * (strategy with nproc or a launcher, device with devices, decode mixed without a GPU device, fp16 with the
 * pipeline strategy, ddp_comm bf16 over MPI, init_exclude without init_from, ...). Reads the launch
 * environment (whether this process is one rank of a job) and checks that data exists. */
ts_status ts_run_config_check(const ts_run_config *c);

/* The processes the caller must start, each running this config (0: none, this process trains): nproc
 * when it is above 1 and this process is not already one rank of a launched job. */
int ts_run_processes_to_start(const ts_run_config *c);

/* ---- the run ---------------------------------------------------------------------------------------------- */
typedef struct ts_run ts_run;

/* Checks c, then builds the run (what `tessera train` does): the process-wide settings (threads, conv
 * algorithm, precision), the checkpoint_dir's newest complete checkpoint as resume, the resumed
 * checkpoint's model (ts_checkpoint_model_load: a model that disagrees is an error naming both) and seed,
 * the process group under a launcher (every rank calls this), the devices, the data (rank 0 also the
 * evaluation split), the model (init_from), the strategy, the optimizer and the schedule over the run's
 * steps, the trainer and the resumed position. Errors name the field (and the rank in a job of more than
 * one); on failure nothing is left and the group, if joined, is aborted so the other ranks stop too.
 * Failures of the job rather than of the config — joining the process group, DDP's first collectives — come
 * back as TS_ERR_REMOTE, TS_ERR_TIMEOUT or TS_ERR_NOMEM (worth another try); the others (TS_ERR_INVALID_ARG,
 * _IO, _FORMAT, _DEVICE, _UNSUPPORTED: a file, a device, a model that cannot work as asked) would fail again. */
ts_status ts_run_open(const ts_run_config *c, ts_run **out);
/* Trains to the end (ts_trainer_run); out (may be NULL) gets the figures. A failure aborts the group. */
ts_status ts_run_train(ts_run *r, ts_train_result *out);
/* Frees the run: trainer, optimizer, strategy and model, sources, the process group. NULL is fine. */
void ts_run_free(ts_run *r);

/* The config as the run resolved it (model, num_classes, image_size, seed, resume filled in; borrowed). */
const ts_run_config *ts_run_config_of(const ts_run *r);
int ts_run_rank(const ts_run *r);
int ts_run_world_size(const ts_run *r);
ts_strategy *ts_run_strategy(ts_run *r);          /* borrowed */
ts_batch_source *ts_run_train_source(ts_run *r);  /* borrowed */
ts_batch_source *ts_run_eval_source(ts_run *r);   /* borrowed; NULL on ranks other than 0 */
ts_process_group *ts_run_process_group(ts_run *r); /* borrowed; NULL outside a launched job */
/* The optimizer steps the schedule spans (the run's length) and the steps of one epoch. */
int64_t ts_run_total_steps(const ts_run *r);
int64_t ts_run_steps_per_epoch(const ts_run *r);
/* Where the run resumed: the checkpoint's path (NULL when it starts afresh) and, when info is not NULL,
 * its position. */
const char *ts_run_resumed(const ts_run *r, ts_train_checkpoint_info *info);
/* Whether the model started from config.init_from (false when resuming). */
bool ts_run_initialised(const ts_run *r);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_RUN_H */
