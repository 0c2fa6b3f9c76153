/*
 * train/run_fields.c — the fields of a ts_run_config as a table (tessera/run.h): name, `tessera train`'s
 * flag, type, place in the struct, range and one line of help. The command builds its flags (and so its
 * config files) from it, the Python package's tessera.train(**fields) sets fields through ts_run_config_set,
 * and ts_run_config_check checks ranges and enums with it: one list of what a run can be told.
 */
#include "train/run_fields.h"

#include "core/internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

static const char *n_opt(int i) { return ts_optimizer_kind_name((ts_optimizer_kind)i); }
static const char *n_lr(int i) { return ts_lr_kind_name((ts_lr_kind)i); }
static const char *n_prec(int i) { return ts_precision_name((ts_precision)i); }
static const char *n_conv(int i) { return ts_conv_algo_name((ts_conv_algo)i); }
static const char *n_strat(int i) { return ts_strategy_kind_name((ts_strategy_kind)i); }
static const char *n_pp(int i) { return ts_pp_schedule_name((ts_pp_schedule)i); }
static const char *n_dec(int i) { return ts_decode_device_name((ts_decode_device)i); }
static const char *n_back(int i) { return ts_run_backend_name((ts_run_backend)i); }

/* The enum fields are written through an int. */
_Static_assert(sizeof(ts_precision) == sizeof(int) && sizeof(ts_strategy_kind) == sizeof(int) &&
                   sizeof(ts_optimizer_kind) == sizeof(int) && sizeof(ts_lr_kind) == sizeof(int) &&
                   sizeof(ts_conv_algo) == sizeof(int) && sizeof(ts_pp_schedule) == sizeof(int) &&
                   sizeof(ts_decode_device) == sizeof(int) && sizeof(ts_run_backend) == sizeof(int),
               "enum fields must be int-sized");

#define OFF(f) offsetof(ts_run_config, f)
#define F_INT(f, flag, lo, hi, help) {#f, flag, TS_RUN_FIELD_INT, OFF(f), lo, hi, NULL, help}
#define F_REAL(f, flag, lo, hi, help) {#f, flag, TS_RUN_FIELD_FLOAT, OFF(f), lo, hi, NULL, help}
#define F_STR(f, flag, help) {#f, flag, TS_RUN_FIELD_STRING, OFF(f), 1, 0, NULL, help}
#define F_BOOL(f, flag, help) {#f, flag, TS_RUN_FIELD_BOOL, OFF(f), 1, 0, NULL, help}
#define F_ENUM(f, flag, lo, hi, names, help) {#f, flag, TS_RUN_FIELD_ENUM, OFF(f), lo, hi, names, help}

static const ts_run_field fields[] = {
    F_STR(data, "data", "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz], or images: a folder with one sub-folder per class (or its train/ and val/ or test/), or a \"path label\" list, or token shards (a folder from `tessera data tokenize`, for GPT models)"),
    F_INT(data_threads, "data-threads", 1, 256, "worker threads decoding images (image --data only)"),
    F_ENUM(decode, "decode", TS_DECODE_CPU, TS_DECODE_MIXED, n_dec, "where the training images' JPEGs are decoded: cpu (the worker threads) or mixed (read and cropped on the workers, decoded by nvJPEG and resized on the --device GPU, DALI's device=\"mixed\"; PNGs and evaluation on the workers)"),
    F_BOOL(skip_corrupt, "skip-corrupt", "image --data: leave out files that do not decode (each named in a warning, counted in the summary) instead of stopping"),
    F_STR(model, "model", "cnn (the reference CNN; the default, or with --resume the checkpoint's), mlp, resnet18, resnet34, resnet50, resnet101 or resnet152 (torchvision's); GPT-2: gpt2, gpt2-medium, gpt2-large, gpt2-xl or gpt2-tiny (sizes changed by --n-layer, --n-head, --n-embd, --seq-len)"),
    F_INT(image_size, "image-size", 0, 4096, "ResNets: train on RGB crops of this side (64, 112, 224: the default); cnn and mlp take 28"),
    F_INT(num_classes, "num-classes", 0, TS_MAX_CLASSES, "outputs of the model's last layer (0: the data's classes; more keeps e.g. ImageNet's 1000 for --init-from)"),
    F_INT(n_layer, "n-layer", 0, 1024, "GPT models: transformer blocks (0: the preset's)"),
    F_INT(n_head, "n-head", 0, 1024, "GPT models: attention heads (0: the preset's)"),
    F_INT(n_embd, "n-embd", 0, 1 << 16, "GPT models: the embedding width, a multiple of --n-head (0: the preset's)"),
    F_INT(seq_len, "seq-len", 0, 1 << 20, "GPT models: the context length, and the tokens per row of token --data (0: the preset's)"),
    F_INT(vocab_size, "vocab-size", 0, 1 << 24, "GPT models: the vocabulary (0: the token data's largest id + 1, else the preset's)"),
    F_REAL(dropout, "dropout", 0, 0.99, "GPT models: embedding and residual dropout"),
    F_BOOL(activation_checkpointing, "activation-checkpointing", "GPT models and ResNets: each block keeps only its input during forward and runs its forward again during backward (dropout masks replayed), for the same gradients with less activation memory and about one more forward of compute"),
    F_INT(epochs, "epochs", 1, 1e6, "number of epochs"),
    F_INT(max_steps, "max-steps", 0, 1e12, "the run's length in optimizer steps, when fewer than the epochs' (the learning-rate schedule spans them; 0: no limit)"),
    F_INT(eval_every, "eval-every", 0, 1e12, "also evaluate on rank 0 every N optimizer steps (a language model's validation loss during an epoch; 0: at epoch ends only)"),
    F_INT(eval_batches, "eval-batches", 0, 1e12, "token --data: evaluate on the first N validation batches (0: all of them)"),
    F_INT(batch_size, "batch-size", 1, 1 << 20, "images per step (per rank with --nproc)"),
    F_REAL(lr, "lr", 0, 1e3, "peak learning rate"),
    F_REAL(momentum, "momentum", 0, 1, "SGD momentum"),
    F_REAL(weight_decay, "weight-decay", 0, 1, "weight decay (SGD: L2; AdamW: decoupled)"),
    F_ENUM(optimizer, "optimizer", 0, TS_OPTIMIZER_COUNT - 1, n_opt, "sgd or adamw"),
    F_ENUM(lr_schedule, "lr-schedule", TS_LR_CONSTANT, TS_LR_COSINE, n_lr, "none, step (x0.1 every epoch) or cosine (to 0 over the run's steps)"),
    F_REAL(label_smoothing, "label-smoothing", 0, 1, "cross-entropy label smoothing"),
    F_INT(warmup_steps, "warmup-steps", 0, 1e12, "linear learning-rate warmup over the first N steps, from lr/3 (torch's LinearLR), then --lr-schedule over the rest"),
    F_INT(accum_steps, "accum-steps", 1, 1 << 20, "gradient accumulation: one optimizer step per K batches of --batch-size (DDP all-reduces on the K-th only)"),
    F_REAL(clip_grad_norm, "clip-grad-norm", 0, 1e12, "clip the gradients' global L2 norm to this before each step (0: off)"),
    F_INT(seed, "seed", 0, 9.2e18, "seed for initialisation and shuffling"),
    F_INT(threads, "threads", 0, 4096, "CPU threads (0: OMP_NUM_THREADS or all cores)"),
    F_ENUM(conv_algo, "conv-algo", TS_CONV_AUTO, TS_CONV_ONEDNN, n_conv, "convolutions: auto (oneDNN's primitives where built, else Winograd F(2x2) for 3x3 stride-1 ones from 16 channels), winograd (adds F(4x4): faster, rounds more), im2col, winograd-f2, winograd-f4 or onednn"),
    F_STR(checkpoint, "checkpoint", "save model+optimizer after every epoch and at the end"),
    F_STR(checkpoint_dir, "checkpoint-dir", "save a new step-<N>.ckpt here each time; a run whose folder holds one resumes from the newest complete one (restarts)"),
    F_INT(keep, "keep", 0, 1e9, "--checkpoint-dir: keep the newest K checkpoints (0: all)"),
    F_INT(checkpoint_every, "checkpoint-every", 0, 1e12, "also save every this many steps (0: epoch ends only)"),
    F_STR(resume, "resume", "continue the run saved in this checkpoint, with its model, classes, image size and seed"),
    F_STR(init_from, "init-from", "start from these weights (safetensors file or checkpoint; strict; step 0, fresh optimizer; ignored when resuming)"),
    F_STR(init_exclude, "init-exclude", "--init-from: keep the fresh weights under these comma-separated prefixes (e.g. fc: a new classifier)"),
    F_STR(trace, "trace", "write a Chrome/Perfetto trace of the run (steps, data wait, forward, backward, optimizer, evaluation, DDP all-reduces, pipeline stages) to this file; with several ranks each writes its own, .rankR before the extension (trace.json -> trace.rank0.json): `tessera trace merge` joins them"),
    F_STR(metrics_csv, "metrics-csv", "rank 0: one CSV row per optimizer step (step, epoch, loss, lr, images_per_second, data_wait_share, allreduce_seconds), flushed as written"),
    F_INT(nproc, "nproc", 1, 1024, "processes on this machine, each a DDP rank (launched through tessera run)"),
    F_ENUM(strategy, "strategy", 0, TS_STRATEGY_COUNT - 1, n_strat, "one process, many devices: data, model, pipeline or tile (see --devices); ddp is implied by --nproc or a launcher"),
    F_STR(devices, "devices", "devices for --strategy, e.g. cpu:0,cpu:1 (default: every virtual CPU device)"),
    F_STR(device, "device", "the device the model trains on, one per process: cpu (default), cpu:K, cuda:N, or cuda (DDP: cuda:LOCAL_RANK, wrapping around the GPUs); `tessera devices` lists them"),
    F_INT(micro_batches, "micro-batches", 1, 1 << 20, "--strategy pipeline: micro-batches per batch"),
    F_ENUM(pp_schedule, "schedule", TS_PP_GPIPE, TS_PP_1F1B, n_pp, "--strategy pipeline: gpipe or 1f1b"),
    F_REAL(timeout, "timeout", 0, 1e7, "seconds a rank waits for the others (0: TS_DIST_TIMEOUT or 1800)"),
    F_ENUM(backend, "backend", 0, TS_RUN_BACKEND_COUNT - 1, n_back, "process group backend: auto, builtin (shared memory + TCP), mpi (under mpirun; --nproc starts mpirun), or nccl (CUDA devices; what auto takes with --device cuda when every rank has its own GPU)"),
    F_ENUM(precision, "precision", 0, TS_PRECISION_COUNT - 1, n_prec, "fp32, bf16: autocast — matmuls and convolutions take and return bfloat16 (float32 accumulation: AVX512_BF16 through oneDNN on the CPU, tensor cores on CUDA), BatchNorm/ReLU/max pooling/add keep bfloat16 activations (TS_AUTOCAST=fp32: products only, float32 between layers); weights, optimizer, losses and normalisation statistics stay float32; or fp16: operands rounded to float16, with dynamic loss scaling (steps with inf/NaN gradients skipped; on the CPU float16 runs at float32 speed)"),
    F_REAL(loss_scale, "loss-scale", 1, 1e30, "--precision fp16: the initial loss scale (grows x2 every 2000 clean steps, halves on overflow)"),
    F_ENUM(ddp_comm, "ddp-comm", TS_PRECISION_FP32, TS_PRECISION_BF16, n_prec, "DDP gradient all-reduce in fp32, or bf16 (compressed: half the bytes, like PyTorch's bf16_compress_hook)"),
    F_BOOL(sync_bn, "sync-bn", "with --nproc > 1: BatchNorm statistics over all ranks' batches (SyncBatchNorm)"),
};

const ts_run_field *ts_run_fields(int *n) {
    if (n) *n = (int)TS_ARRAY_LEN(fields);
    return fields;
}

/* a and b equal with '-' and '_' alike. */
static bool same_name(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
        if (x != y) return false;
    }
    return *a == *b;
}

const ts_run_field *ts_run_field_find(const char *name) {
    for (size_t i = 0; name && i < TS_ARRAY_LEN(fields); i++)
        if (same_name(name, fields[i].name) || same_name(name, fields[i].flag)) return &fields[i];
    return NULL;
}

/* "a, b or c": the names of an enum field's values allowed. */
static const char *enum_list(const ts_run_field *f, char *buf, size_t cap) {
    const char *names[64];
    int n = 0;
    for (int i = (int)f->min; i <= (int)f->max && n < (int)TS_ARRAY_LEN(names); i++) names[n++] = f->value_name(i);
    return ts__name_list(names, n, buf, cap);
}

static ts_status set_number(ts_run_config *c, const ts_run_field *f, const char *v) {
    char *end = NULL;
    errno = 0;
    int64_t i = 0;
    double x = f->kind == TS_RUN_FIELD_INT ? (double)(i = strtoll(v, &end, 10)) : strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x))
        return ts_error(TS_ERR_INVALID_ARG, "%s: expected %s, got '%s'", f->name,
                        f->kind == TS_RUN_FIELD_INT ? "an integer" : "a number", v);
    if (x < f->min || x > f->max)
        return ts_error(TS_ERR_INVALID_ARG, "%s %s: expected a value in [%g, %g]", f->name, v, f->min, f->max);
    if (f->kind == TS_RUN_FIELD_INT)
        memcpy((char *)c + f->offset, &i, sizeof i);
    else
        memcpy((char *)c + f->offset, &x, sizeof x);
    return TS_OK;
}

ts_status ts_run_config_set(ts_run_config *c, const char *name, const char *value) {
    TS_ARG(c && name && value, "ts_run_config_set: NULL argument");
    const ts_run_field *f = ts_run_field_find(name);
    if (!f) return ts_error(TS_ERR_INVALID_ARG, "unknown field '%s' (the fields are tessera train's flags)", name);
    char *p = (char *)c + f->offset;
    switch (f->kind) {
    case TS_RUN_FIELD_INT:
    case TS_RUN_FIELD_FLOAT: return set_number(c, f, value);
    case TS_RUN_FIELD_STRING:
        TS_ARG(*value, "%s: expected a non-empty value", f->name);
        memcpy(p, &value, sizeof value);
        return TS_OK;
    case TS_RUN_FIELD_BOOL: {
        bool b;
        if (strcasecmp(value, "true") == 0 || strcmp(value, "1") == 0) b = true;
        else if (strcasecmp(value, "false") == 0 || strcmp(value, "0") == 0) b = false;
        else return ts_error(TS_ERR_INVALID_ARG, "%s: expected true or false, got '%s'", f->name, value);
        memcpy(p, &b, sizeof b);
        return TS_OK;
    }
    case TS_RUN_FIELD_ENUM:
        for (int i = (int)f->min; i <= (int)f->max; i++)
            if (strcasecmp(value, f->value_name(i)) == 0) {
                memcpy(p, &i, sizeof i);
                return TS_OK;
            }
        char list[512];
        return ts_error(TS_ERR_INVALID_ARG, "%s: unknown value '%s' (expected %s)", f->name, value,
                        enum_list(f, list, sizeof list));
    }
    return ts_error(TS_ERR_INVALID_ARG, "%s: a field of unknown kind", f->name);
}

/* Every number in its range and every enum one of its values: the part of ts_run_config_check the table
 * says. */
ts_status ts__run_config_check_fields(const ts_run_config *c) {
    for (size_t i = 0; i < TS_ARRAY_LEN(fields); i++) {
        const ts_run_field *f = &fields[i];
        const char *p = (const char *)c + f->offset;
        double v;
        int64_t x;
        int e;
        switch (f->kind) {
        case TS_RUN_FIELD_INT: memcpy(&x, p, sizeof x), v = (double)x; break;
        case TS_RUN_FIELD_FLOAT: memcpy(&v, p, sizeof v); break;
        case TS_RUN_FIELD_ENUM: memcpy(&e, p, sizeof e), v = e; break;
        default: continue; /* strings and booleans: any value */
        }
        if (v >= f->min && v <= f->max) continue; /* NaN fails */
        if (f->kind != TS_RUN_FIELD_ENUM)
            return ts_error(TS_ERR_INVALID_ARG, "%s %g: expected a value in [%g, %g]", f->name, v, f->min, f->max);
        char list[512];
        return ts_error(TS_ERR_INVALID_ARG, "%s %d: expected %s", f->name, e, enum_list(f, list, sizeof list));
    }
    return TS_OK;
}
