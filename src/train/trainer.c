/*
 * train/trainer.c — the training loop (tessera/train.h): epochs or max steps,
 * the learning rate per step, evaluation and checkpoints on rank 0, resume.
 *
 * Position. The trainer's (epoch, batch, step) is where the run goes on: batch
 * `batch` of epoch `epoch`, after `step` optimizer steps. Everything else a
 * resumed run needs is a pure function of that position — the source's order
 * (seed, epoch), the learning rate (step) — or lives in the checkpoint (model,
 * optimizer state, rng), so a resumed run is bit-identical to an uninterrupted
 * one.
 *
 * Checkpoint layout: train/ckpt_keys.h (the keys `tessera train` always wrote).
 *
 * Resume trusts nothing in the file: the keys it needs are present (a missing one is an error naming
 * it, never a silent default), the generator state is not all zeros, positions are in [0, TS_TRAIN_MAX_COUNT]
 * (so the loop's additions cannot overflow), every floating-point tensor is
 * finite, the optimizer state is complete for the optimizer
 * (ts_optimizer_check_state), and names from the file are printed escaped —
 * all before anything is loaded.
 *
 * Timeline and metrics (opts.trace_path, opts.metrics_csv): ts_trainer_run
 * starts the process's timeline recorder (core/timeline.h), records its own
 * spans on the trainer's lane (step, data wait, forward_backward, optimizer
 * step, evaluate, checkpoint; the strategies add forward and backward, DDP
 * and the pipeline their own lanes) and writes the trace when it returns;
 * rank 0 appends a CSV row after every optimizer step.
 */
#include "train/strategy.h"
#include "core/timeline.h"
#include "train/ckpt_keys.h"
#include "train/ckdir.h"
#include "core/crypto.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ts_trainer {
    ts_strategy *s;
    ts_optimizer *opt;
    ts_batch_source *train;
    ts_trainer_opts o;
    char *checkpoint, *checkpoint_dir, *model_name, *optimizer_name; /* owned copies of o's strings */
    ts_lr_schedule sched;
    bool has_sched;
    int64_t epoch, batch, step; /* where the run goes on */
    double last_loss;
    bool follower; /* not rank 0: never evaluates or writes checkpoints (see leader_of) */
    int64_t accum;  /* batches per optimizer step (>= 1) */
    ts_tensor_list params; /* the plain model's parameters: accumulation's scaling and clipping */
    char *trace_path, *metrics_csv; /* owned copies of o's */
    int trace_rank, trace_world;    /* the trace file's rank and world (names the file, pid) */
    FILE *csv;                      /* metrics_csv while a run writes it */
    bool scaling;                   /* o.grad_scaler given: dynamic loss scaling */
    ts_grad_scaler gs;              /* its state */
    int64_t skipped;                /* steps skipped for inf/NaN gradients in this run call */
    ts__lineage lineage;            /* this run's sessions, this one last (train/ckdir.h) */
    ts__ckdir ckdir;                /* rank 0: the checkpoint_dir files of that lineage (--keep) */
    ts_eval_result last_eval;       /* rank 0: the latest eval_every evaluation, at step evaluated_at */
    int64_t evaluated_at;
};

/* ---- checkpoint folders (train/ckdir.c) --------------------------------------------------------------- */
/* The folder exists (created when its parent does) and is a folder. */
static ts_status make_checkpoint_dir(const char *dir) {
    struct stat sb;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ts_error(TS_ERR_IO, "checkpoint folder %s: %s", dir, strerror(errno));
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ts_error(TS_ERR_IO, "checkpoint folder %s is not a folder", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return ts_error(TS_ERR_IO, "checkpoint folder %s: %s", dir, strerror(errno));
    return TS_OK;
}

/* Rank 0 alone evaluates and writes checkpoints: rank 0 of the strategy's group
 * and, for a strategy without one, rank 0 of the job the launch environment
 * describes (a process a launcher started as rank 1 of 2 that trains on its own
 * must not overwrite rank 0's checkpoint). */
static bool leader_of(const ts_strategy *s) {
    if (ts_strategy_rank(s) != 0) return false;
    if (ts_strategy_world_size(s) > 1) return true;
    ts_dist_env env;
    bool in_job = false;
    if (ts_dist_env_detect(&env, &in_job) != TS_OK) return true; /* unreadable: as before, the command reports it */
    if (in_job && env.rank != 0)
        ts_log(TS_LOG_WARN, "trainer: the launch environment says this process is rank %d of %d (%s) but its "
                            "strategy is not distributed: it trains alone and leaves evaluation and checkpoints to "
                            "rank 0 (join a process group and use the DDP strategy to train as one job)",
               env.rank, env.world_size, env.source);
    return !(in_job && env.rank != 0);
}

/* The rank and world a trace file is named for: the strategy's group, else the launch environment's
 * (a launched process training alone must not write over rank 0's file), else 0 of 1. */
static void trace_identity(const ts_strategy *s, int *rank, int *world) {
    *rank = ts_strategy_rank(s);
    *world = ts_strategy_world_size(s);
    ts_dist_env env;
    bool in_job = false;
    if (*world == 1 && ts_dist_env_detect(&env, &in_job) == TS_OK && in_job && env.world_size > 1) {
        *rank = env.rank;
        *world = env.world_size;
    }
}

/* This trainer's session: a random id and the wall-clock start, the only segment of a fresh run's lineage. */
static ts_status start_session(ts_trainer *t) {
    uint64_t id = 0;
    struct timespec ts;
    TS_TRY(ts__random_bytes(&id, sizeof id));
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts__lineage_extend(&t->lineage, NULL, id, 0, (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec);
}

ts_status ts_trainer_new(ts_strategy *s, ts_optimizer *opt, ts_batch_source *train, const ts_trainer_opts *o,
                         ts_trainer **out) {
    TS_ARG(s && opt && train && o && out, "ts_trainer_new: NULL argument");
    *out = NULL;
    TS_ARG(o->size == sizeof *o && o->magic == TS_TRAINER_OPTS_MAGIC && o->version == TS_TRAINER_OPTS_VERSION,
           "ts_trainer_new: options not initialised with TS_TRAINER_OPTS_INIT");
    TS_ARG(o->epochs >= 1, "ts_trainer_new: epochs is %lld; it must be at least 1", (long long)o->epochs);
    TS_ARG(o->max_steps >= 0 && o->checkpoint_every >= 0 && o->batch_size >= 0 && o->keep >= 0 && o->eval_every >= 0,
           "ts_trainer_new: max_steps, checkpoint_every, batch_size, keep and eval_every must be >= 0");
    TS_ARG(o->accum_steps >= 0 && o->accum_steps <= (1 << 20), "ts_trainer_new: accum_steps %lld outside [0, 2^20]",
           (long long)o->accum_steps);
    TS_ARG(o->clip_grad_norm >= 0 && isfinite(o->clip_grad_norm), "ts_trainer_new: clip_grad_norm %g must be >= 0",
           o->clip_grad_norm);
    TS_ARG(o->epochs <= TS_TRAIN_MAX_COUNT && o->max_steps <= TS_TRAIN_MAX_COUNT &&
               o->checkpoint_every <= TS_TRAIN_MAX_COUNT && o->batch_size <= TS_TRAIN_MAX_COUNT,
           "ts_trainer_new: epochs %lld, max_steps %lld, checkpoint_every %lld or batch_size %lld is above 2^40",
           (long long)o->epochs, (long long)o->max_steps, (long long)o->checkpoint_every, (long long)o->batch_size);
    if (o->checkpoint_dir && ts_strategy_rank(s) == 0) TS_TRY(make_checkpoint_dir(o->checkpoint_dir));
    if (o->schedule) TS_TRY(ts_lr_schedule_check(o->schedule));
    if (ts_batch_source_num_samples(train) <= 0)
        return ts_error(TS_ERR_INVALID_ARG, "ts_trainer_new: the training source has no samples");
    /* a checkpoint path that cannot work fails now, not at the end of the first epoch (rank 0 saves) */
    if (o->checkpoint && ts_strategy_rank(s) == 0) {
        ts_status st = ts_ckpt_check_writable(o->checkpoint);
        if (st != TS_OK) return ts__error_prefix(st, "checkpoint");
    }
    ts_trainer *t = ts__calloc(1, sizeof *t);
    if (!t) return TS_ERR_NOMEM;
    t->s = s;
    t->opt = opt;
    t->train = train;
    t->o = *o;
    t->last_loss = NAN;
    if (o->schedule) {
        t->sched = *o->schedule;
        t->has_sched = true;
    }
    if ((o->checkpoint && !(t->checkpoint = ts__strdup(o->checkpoint))) ||
        (o->checkpoint_dir && !(t->checkpoint_dir = ts__strdup(o->checkpoint_dir))) ||
        (o->model_name && !(t->model_name = ts__strdup(o->model_name))) ||
        (o->optimizer_name && !(t->optimizer_name = ts__strdup(o->optimizer_name)))) {
        ts_trainer_free(t);
        return TS_ERR_NOMEM;
    }
    t->o.checkpoint = t->checkpoint;
    t->o.checkpoint_dir = t->checkpoint_dir;
    t->o.model_name = t->model_name;
    t->o.optimizer_name = t->optimizer_name;
    t->o.schedule = NULL;
    t->follower = !leader_of(s);
    if ((o->trace_path && !(t->trace_path = ts__strdup(o->trace_path))) ||
        (o->metrics_csv && !(t->metrics_csv = ts__strdup(o->metrics_csv)))) {
        ts_trainer_free(t);
        return TS_ERR_NOMEM;
    }
    t->o.trace_path = t->trace_path;
    t->o.metrics_csv = t->metrics_csv;
    trace_identity(s, &t->trace_rank, &t->trace_world);
    t->accum = o->accum_steps > 1 ? o->accum_steps : 1;
    ts_status st = start_session(t);
    if (st == TS_OK) st = ts_module_parameters(ts_strategy_model(s), &t->params);
    if (st == TS_OK && o->grad_scaler) { /* loss scaling: checked now, not at the first step */
        t->scaling = true;
        t->gs = *o->grad_scaler;
        st = ts_grad_scaler_check(&t->gs);
        if (st == TS_OK) st = ts__strategy_can_scale_loss(s); /* run_step sets the scale before each step */
    }
    t->o.grad_scaler = NULL; /* t->gs is the trainer's own copy */
    if (st != TS_OK) {
        ts_trainer_free(t);
        return st;
    }
    *out = t;
    return TS_OK;
}

void ts_trainer_free(ts_trainer *t) {
    if (!t) return;
    free(t->checkpoint);
    free(t->checkpoint_dir);
    free(t->model_name);
    free(t->optimizer_name);
    free(t->trace_path);
    free(t->metrics_csv);
    if (t->csv) fclose(t->csv);
    ts_tensor_list_clear(&t->params);
    ts__lineage_clear(&t->lineage);
    ts__ckdir_clear(&t->ckdir);
    free(t);
}

int64_t ts_trainer_step(const ts_trainer *t) { return t ? t->step : 0; }
int64_t ts_trainer_epoch(const ts_trainer *t) { return t ? t->epoch : 0; }

/* ---- checkpoints ---------------------------------------------------------------------------------- */
bool ts_train_checkpoint_classes(const ts_ckpt *ck, int64_t *classes) {
    return ck && classes &&
           (ts_ckpt_get_i64(ck, CK_NUM_CLASSES, classes) == TS_OK || ts_ckpt_get_i64(ck, CK_DATA_CLASSES, classes) == TS_OK);
}

/* What the data looked like (for `tessera eval` and `tessera predict`): the sample shape, the class
 * count and the class names when the source has them. */
static ts_status save_data_info(ts_ckpt *ck, const ts_batch_source *src) {
    int64_t shape[TS_MAX_DIMS];
    int nd = ts_batch_source_sample_shape(src, shape);
    if (nd == 3) {
        TS_TRY(ts_ckpt_set_i64(ck, CK_DATA_C, shape[0]));
        TS_TRY(ts_ckpt_set_i64(ck, CK_DATA_H, shape[1]));
        TS_TRY(ts_ckpt_set_i64(ck, CK_DATA_W, shape[2]));
    }
    int64_t classes = ts_batch_source_num_classes(src);
    if (classes <= 0) return TS_OK;
    TS_TRY(ts_ckpt_set_i64(ck, CK_DATA_CLASSES, classes));
    size_t len = 0;
    for (int64_t k = 0; k < classes; k++) {
        const char *nm = ts_batch_source_class_name(src, k);
        if (!nm || strchr(nm, '\n')) return TS_OK; /* unnamed (an IDX set without classes.txt) */
        len += strlen(nm) + 1;
    }
    char *buf = ts__malloc(len), *w = buf;
    if (!buf) return ts_error(TS_ERR_NOMEM, "ts_trainer_save: out of memory");
    for (int64_t k = 0; k < classes; k++) {
        const char *nm = ts_batch_source_class_name(src, k);
        size_t n = strlen(nm);
        memcpy(w, nm, n);
        w[n] = '\n';
        w += n + 1;
    }
    ts_status st = ts_ckpt_set_bytes(ck, CK_DATA_NAMES, buf, len);
    free(buf);
    return st;
}

ts_status ts_trainer_save(ts_trainer *t, const char *path) {
    TS_ARG(t && path, "ts_trainer_save: NULL argument");
    ts_status st = TS_OK;
    ts_ckpt *ck = ts_ckpt_new();
    ts_tensor_list sd = TS_TENSOR_LIST_INIT, os = TS_TENSOR_LIST_INIT;
    if (!ck) return ts_error(TS_ERR_NOMEM, "ts_trainer_save: out of memory");
    TS_CHECK_GOTO(ts_module_state_dict(ts_strategy_model(t->s), &sd));
    TS_CHECK_GOTO(ts__checkpoint_save_model_config(ck, ts_strategy_model(t->s)));
    TS_CHECK_GOTO(ts_optimizer_state(t->opt, &os));
    TS_CHECK_GOTO(ts_ckpt_add_tensors(ck, CK_MODEL_PREFIX, &sd));
    TS_CHECK_GOTO(ts_ckpt_add_tensors(ck, CK_OPTIM_PREFIX, &os));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_EPOCH, t->epoch));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_BATCH, t->batch));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_STEP, t->step));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_SEED, (int64_t)t->o.seed));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_WORLD, ts_strategy_world_size(t->s)));
    TS_CHECK_GOTO(ts_ckpt_set_f64(ck, CK_LOSS, t->last_loss));
    if (t->o.batch_size > 0) TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_BATCH_SIZE, t->o.batch_size));
    if (t->model_name) TS_CHECK_GOTO(ts_ckpt_set_bytes(ck, CK_MODEL, t->model_name, strlen(t->model_name)));
    if (t->o.num_classes > 0) TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_NUM_CLASSES, t->o.num_classes));
    if (t->accum > 1) TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_ACCUM, t->accum));
    if (t->scaling) {
        TS_CHECK_GOTO(ts_ckpt_set_f64(ck, CK_SCALE, t->gs.scale));
        TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_SCALE_TRACKER, t->gs.growth_tracker));
    }
    if (t->optimizer_name)
        TS_CHECK_GOTO(ts_ckpt_set_bytes(ck, CK_OPTIM, t->optimizer_name, strlen(t->optimizer_name)));
    if (t->o.rng) TS_CHECK_GOTO(ts_ckpt_set_bytes(ck, CK_RNG, t->o.rng, sizeof *t->o.rng));
    TS_CHECK_GOTO(save_data_info(ck, t->train));
    TS_CHECK_GOTO(ts__lineage_write(ck, &t->lineage));
    TS_CHECK_GOTO(ts_ckpt_save(ck, path));
fail:
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&os);
    ts_ckpt_free(ck);
    return st;
}

/* A name blob (model, optimizer) as printable text: other bytes become \xNN escapes. */
static void get_name(const ts_ckpt *ck, const char *key, char *buf, size_t n) {
    const void *p;
    size_t len;
    buf[0] = '\0';
    if (ts_ckpt_get_bytes(ck, key, &p, &len) != TS_OK) return;
    char raw[256];
    size_t k = 0;
    for (size_t i = 0; i < len && k + 1 < sizeof raw; i++) raw[k++] = ((const char *)p)[i] ? ((const char *)p)[i] : '\x01';
    raw[k] = '\0';
    ts__printable(raw, buf, n);
}

/* A position or size from the file must be in [lo, TS_TRAIN_MAX_COUNT]: the loop adds to it. */
static ts_status check_range(const char *path, const char *key, int64_t v, int64_t lo) {
    if (v < lo || v > TS_TRAIN_MAX_COUNT)
        return ts_error(TS_ERR_FORMAT, "%s: %s is %lld, outside [%lld, 2^40]", path, key, (long long)v, (long long)lo);
    return TS_OK;
}

static ts_status read_info(const ts_ckpt *ck, const char *path, ts_train_checkpoint_info *out) {
    static const char *const required[] = {CK_EPOCH, CK_BATCH, CK_STEP, CK_SEED};
    int64_t *dst[] = {&out->epoch, &out->batch, &out->step, &out->seed};
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < TS_ARRAY_LEN(required); i++)
        if (ts_ckpt_get_i64(ck, required[i], dst[i]) != TS_OK)
            return ts_error(TS_ERR_FORMAT, "%s is not a training checkpoint (no %s)", path, required[i]);
    TS_TRY(check_range(path, CK_EPOCH, out->epoch, 0));
    TS_TRY(check_range(path, CK_BATCH, out->batch, 0));
    TS_TRY(check_range(path, CK_STEP, out->step, 0));
    out->world_size = 1; /* absent in single-process checkpoints of old */
    ts_ckpt_get_i64(ck, CK_WORLD, &out->world_size);
    ts_ckpt_get_i64(ck, CK_BATCH_SIZE, &out->batch_size);
    TS_TRY(check_range(path, CK_WORLD, out->world_size, 1));
    TS_TRY(check_range(path, CK_BATCH_SIZE, out->batch_size, 0));
    out->accum_steps = 1;
    ts_ckpt_get_i64(ck, CK_ACCUM, &out->accum_steps);
    TS_TRY(check_range(path, CK_ACCUM, out->accum_steps, 1));
    out->loss = NAN;
    ts_ckpt_get_f64(ck, CK_LOSS, &out->loss);
    get_name(ck, CK_MODEL, out->model, sizeof out->model);
    get_name(ck, CK_OPTIM, out->optimizer, sizeof out->optimizer);
    if (!ts_train_checkpoint_classes(ck, &out->num_classes) || out->num_classes < 0) out->num_classes = 0;
    ts_ckpt_get_i64(ck, CK_DATA_C, &out->channels);
    ts_ckpt_get_i64(ck, CK_DATA_H, &out->height);
    ts_ckpt_get_i64(ck, CK_DATA_W, &out->width);
    return TS_OK;
}

ts_status ts_train_checkpoint_read(const char *path, ts_train_checkpoint_info *out) {
    TS_ARG(path && out, "ts_train_checkpoint_read: NULL argument");
    ts_ckpt *ck = NULL;
    char esc[TS__PATH_ESC];
    TS_TRY(ts_ckpt_load(path, &ck));
    ts_status st = read_info(ck, ts__path(path, esc), out);
    ts_ckpt_free(ck);
    return st;
}

/* The checkpoint must describe this run: same model, optimizer, seed, batch size and world size. */
static ts_status check_same_run(const ts_trainer *t, const ts_train_checkpoint_info *in, const char *path) {
    if (t->model_name && in->model[0] && strcmp(in->model, t->model_name) != 0)
        return ts_error(TS_ERR_INVALID_ARG, "%s was written with model %s, this run has model %s", path, in->model,
                        t->model_name);
    if (t->optimizer_name && in->optimizer[0] && strcmp(in->optimizer, t->optimizer_name) != 0)
        return ts_error(TS_ERR_INVALID_ARG, "%s was written with optimizer %s, this run has optimizer %s", path,
                        in->optimizer, t->optimizer_name);
    int world = ts_strategy_world_size(t->s);
    if (t->o.batch_size > 0 && in->batch_size > 0 && in->batch_size * in->world_size != t->o.batch_size * world) {
        if (in->world_size == world)
            return ts_error(TS_ERR_INVALID_ARG, "%s was written with batch size %lld, this run has batch size %lld",
                            path, (long long)in->batch_size, (long long)t->o.batch_size);
        return ts_error(TS_ERR_INVALID_ARG, "%s was written by %lld processes at batch size %lld (global %lld), this "
                        "run has %d at %lld (global %lld): a different world size needs the same global batch",
                        path, (long long)in->world_size, (long long)in->batch_size,
                        (long long)(in->batch_size * in->world_size), world, (long long)t->o.batch_size,
                        (long long)(t->o.batch_size * world));
    }
    if (in->accum_steps != t->accum)
        return ts_error(TS_ERR_INVALID_ARG, "%s was written with %lld batches per step (accum_steps), this run has "
                        "%lld", path, (long long)in->accum_steps, (long long)t->accum);
    if ((uint64_t)in->seed != t->o.seed)
        return ts_error(TS_ERR_INVALID_ARG, "%s was written with seed %lld, this run has seed %llu", path,
                        (long long)in->seed, (unsigned long long)t->o.seed);
    if (in->world_size != world && !(t->o.batch_size > 0 && in->batch_size > 0))
        return ts_error(TS_ERR_INVALID_ARG, "%s was written by %lld processes, this run has %d (without batch sizes "
                        "recorded, a different world size cannot be checked)", path, (long long)in->world_size, world);
    int64_t nb = ts_batch_source_num_batches(t->train, in->epoch);
    if (in->batch > nb)
        return ts_error(TS_ERR_INVALID_ARG, "%s: batch %lld of epoch %lld is past the data's %lld batches", path,
                        (long long)in->batch, (long long)in->epoch + 1, (long long)nb);
    return TS_OK;
}

/* Every floating-point tensor of the checkpoint is finite: NaN or infinite weights or state would
 * resume "successfully" and poison every later step. */
static ts_status check_finite(const ts_ckpt *ck, const char *path) {
    for (int i = 0; i < ts_ckpt_count(ck, TS_CKPT_TENSOR); i++) {
        const char *name = ts_ckpt_name(ck, TS_CKPT_TENSOR, i);
        ts_tensor *t = ts_ckpt_find_tensor(ck, name);
        ts_dtype dt = ts_tensor_dtype(t);
        if (dt != TS_F32 && dt != TS_F16 && dt != TS_BF16) continue;
        const unsigned char *p = ts_tensor_data(t); /* loaded checkpoints hold contiguous CPU tensors */
        for (int64_t j = 0; j < ts_tensor_numel(t); j++) {
            bool bad;
            if (dt == TS_F32) {
                uint32_t u;
                memcpy(&u, p + 4 * j, 4);
                bad = (u & 0x7f800000u) == 0x7f800000u;
            } else {
                uint16_t u;
                memcpy(&u, p + 2 * j, 2);
                bad = dt == TS_F16 ? (u & 0x7c00u) == 0x7c00u : (u & 0x7f80u) == 0x7f80u;
            }
            if (bad) {
                char nb[160];
                return ts_error(TS_ERR_FORMAT, "%s: tensor '%s' holds a NaN or infinite value at element %lld of %lld",
                                path, ts__printable(name, nb, sizeof nb), (long long)j,
                                (long long)ts_tensor_numel(t));
            }
        }
    }
    return TS_OK;
}

/* What a resumed run cannot do without: every key the trainer always writes that resume uses (a file
 * with one removed would resume with a fresh value without a word), and a generator state that is one. */
static ts_status check_resume_keys(const ts_trainer *t, const ts_ckpt *ck, const char *path) {
    static const struct { const char *key; ts_ckpt_kind kind; } need[] = {
        {CK_WORLD, TS_CKPT_I64}, {CK_OPTIM_PREFIX "step", TS_CKPT_TENSOR}, {CK_OPTIM_PREFIX "lr", TS_CKPT_TENSOR},
        {CK_RNG, TS_CKPT_BYTES}};
    for (size_t i = 0; i < TS_ARRAY_LEN(need); i++) {
        if (need[i].kind == TS_CKPT_BYTES && !t->o.rng) continue; /* a trainer without a generator */
        if (!ts_ckpt_has(ck, need[i].kind, need[i].key))
            return ts_error(TS_ERR_FORMAT, "%s: no %s: a training checkpoint always has it, so resuming without it "
                            "would silently start it afresh", path, need[i].key);
    }
    const void *rb = NULL;
    size_t rn = 0;
    if (!t->o.rng) return TS_OK;
    TS_TRY(ts_ckpt_get_bytes(ck, CK_RNG, &rb, &rn));
    if (rn != sizeof *t->o.rng)
        return ts_error(TS_ERR_FORMAT, "%s: %s holds %zu bytes, not a generator state (%zu)", path, CK_RNG, rn,
                        sizeof *t->o.rng);
    bool zero = true;
    for (size_t i = 0; i < rn && zero; i++) zero = ((const unsigned char *)rb)[i] == 0;
    if (zero) /* xoshiro's one fixed point: every later draw would be 0 */
        return ts_error(TS_ERR_FORMAT, "%s: %s is all zeros, not a generator state", path, CK_RNG);
    return TS_OK;
}

ts_status ts_trainer_resume(ts_trainer *t, const char *file) {
    TS_ARG(t && file, "ts_trainer_resume: NULL argument");
    char esc[TS__PATH_ESC];
    const char *path = ts__path(file, esc); /* what messages name */
    ts_ckpt *ck = NULL;
    ts_tensor_list sd = TS_TENSOR_LIST_INIT, os = TS_TENSOR_LIST_INIT;
    ts_train_checkpoint_info in;
    ts__lineage parent = {0}, lin = {0};
    bool has_parent = false;
    const void *rb = NULL;
    size_t rn = 0;
    ts_status st;
    TS_CHECK_GOTO(ts_ckpt_load(file, &ck));
    TS_CHECK_GOTO(read_info(ck, path, &in));
    TS_CHECK_GOTO(check_resume_keys(t, ck, path));
    TS_CHECK_GOTO(check_same_run(t, &in, path));
    TS_CHECK_GOTO(ts__lineage_read(ck, path, &parent, &has_parent));
    const ts__lineage_seg *self = &t->lineage.seg[t->lineage.n - 1]; /* this session goes on from the file's */
    TS_CHECK_GOTO(ts__lineage_extend(&lin, has_parent ? &parent : NULL, self->id, in.step, self->start_ns));
    if (t->o.rng) TS_CHECK_GOTO(ts_ckpt_get_bytes(ck, CK_RNG, &rb, &rn)); /* checked above */
    TS_CHECK_GOTO(check_finite(ck, path));
    TS_CHECK_GOTO(ts_ckpt_get_tensors(ck, CK_MODEL_PREFIX, &sd));
    TS_CHECK_GOTO(ts_ckpt_get_tensors(ck, CK_OPTIM_PREFIX, &os));
    if ((st = ts_optimizer_check_state(t->opt, &os)) != TS_OK) {
        ts__error_prefix(st, "%s", path);
        goto fail;
    }
    /* each load checks everything before it changes anything */
    if ((st = ts_module_load_state_dict(ts_strategy_model(t->s), &sd, true)) != TS_OK ||
        (st = ts_optimizer_load_state(t->opt, &os)) != TS_OK) {
        ts__error_prefix(st, "%s", path);
        goto fail;
    }
    if (t->o.rng && rb) memcpy(t->o.rng, rb, sizeof *t->o.rng);
    double scale = 0;
    int64_t tracker = 0;
    if (t->scaling && ts_ckpt_get_f64(ck, CK_SCALE, &scale) == TS_OK) { /* a run without scaling has none */
        if (!(scale > 0 && isfinite(scale)) || ts_ckpt_get_i64(ck, CK_SCALE_TRACKER, &tracker) != TS_OK ||
            tracker < 0) {
            st = ts_error(TS_ERR_FORMAT, "%s: %s %g / %s: not a loss scaler's state", path, CK_SCALE, scale,
                          CK_SCALE_TRACKER);
            goto fail;
        }
        t->gs.scale = (float)scale;
        t->gs.growth_tracker = tracker;
    }
    /* a run already past its last epoch trains no more (walking a pipeline's order to a far epoch is slow) */
    if (in.epoch < t->o.epochs) TS_CHECK_GOTO(ts_batch_source_seek(t->train, in.epoch, in.batch));
    t->epoch = in.epoch;
    t->batch = in.batch;
    t->step = in.step;
    t->last_loss = in.loss;
    ts__lineage_clear(&t->lineage);
    t->lineage = lin;
    lin = (ts__lineage){0};
    t->ckdir.scanned = false; /* which files are this run's changed */
fail:
    ts__lineage_clear(&parent);
    ts__lineage_clear(&lin);
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&os);
    ts_ckpt_free(ck);
    return st;
}

/* ---- timeline and metrics (opts.trace_path, opts.metrics_csv; core/timeline.h) ------------------------ */
#define CSV_HEADER "step,epoch,loss,lr,images_per_second,data_wait_share,allreduce_seconds"

/* Rank 0's metrics file: a resumed run (step > 0) appends to a file that starts with the header;
 * otherwise the file is written anew. */
static ts_status csv_open(ts_trainer *t) {
    TS_TRY(ts__check_write_target(t->metrics_csv, "a metrics CSV file"));
    bool append = false;
    int fd = -1;
    if (t->step > 0 && ts__open_regular(t->metrics_csv, "a metrics CSV file", &fd, NULL) == TS_OK) {
        char line[sizeof CSV_HEADER + 1] = "";
        ssize_t k = read(fd, line, sizeof line - 1);
        append = k == (ssize_t)sizeof CSV_HEADER && memcmp(line, CSV_HEADER "\n", sizeof CSV_HEADER) == 0;
        close(fd);
    }
    ts_clear_error();
    ts_status st = ts__open_output_stream(t->metrics_csv, "a metrics CSV file", append, &t->csv);
    if (st != TS_OK) return ts__error_prefix(st, "metrics CSV");
    if (!append && (fputs(CSV_HEADER "\n", t->csv) < 0 || fflush(t->csv) != 0))
        return ts_error(TS_ERR_IO, "metrics CSV %s: %s", t->metrics_csv, strerror(errno));
    return TS_OK;
}

/* One optimizer step's row, flushed (a run that dies keeps its rows). */
static ts_status csv_row(ts_trainer *t, double loss, double lr, int64_t images, double seconds, double wait) {
    double allreduce = ts__tl_take(TS__TL_ALLREDUCE_S);
    if (fprintf(t->csv, "%lld,%lld,%.6g,%.6g,%.2f,%.4f,%.6f\n", (long long)t->step, (long long)t->epoch + 1, loss, lr,
                seconds > 0 ? (double)images / seconds : 0.0, seconds > 0 ? wait / seconds : 0.0, allreduce) < 0 ||
        fflush(t->csv) != 0)
        return ts_error(TS_ERR_IO, "metrics CSV %s: %s", t->metrics_csv, strerror(errno));
    return TS_OK;
}

/* This rank's trace file name into path (n bytes). */
static ts_status trace_file(const ts_trainer *t, char *path, size_t n) {
    if (!ts__tl_rank_path(t->trace_path, t->trace_rank, t->trace_world, path, n))
        return ts_error(TS_ERR_INVALID_ARG, "trace %s: path too long", t->trace_path);
    return TS_OK;
}

/* Starts the recorder when this run traces (every rank) or writes metrics (rank 0: counters only
 * unless it traces too), writes the (empty) trace once so that a path that cannot work fails before
 * training, and opens the metrics file. *recording: this run started the recorder. */
static ts_status observe_start(ts_trainer *t, bool leader, bool *recording) {
    bool csv = leader && t->metrics_csv;
    if (!t->trace_path && !csv) return TS_OK;
    TS_TRY(ts__tl_start(t->trace_path ? TS__TL_DEFAULT_MAX_EVENTS : 0));
    *recording = true;
    ts__tl_lane(TS__TL_TRAINER, "trainer");
    if (ts_strategy_ddp(t->s)) ts__tl_lane(TS__TL_COMM, "DDP all-reduce (communication thread)");
    char path[4096];
    ts_status st = TS_OK;
    if (t->trace_path && (st = trace_file(t, path, sizeof path)) == TS_OK)
        st = ts__tl_write(path, t->trace_rank, t->trace_world);
    if (st == TS_OK && csv) st = csv_open(t);
    if (st != TS_OK) {
        ts__tl_stop();
        *recording = false;
    }
    return st;
}

/* Writes the trace (also after a failure, best effort), stops the recorder and closes the metrics
 * file; returns st, or the first error of these when st is TS_OK. */
static ts_status observe_finish(ts_trainer *t, ts_status st) {
    char path[4096];
    ts_status ws = TS_OK;
    if (t->trace_path) {
        if (trace_file(t, path, sizeof path) != TS_OK)
            ws = TS_ERR_INVALID_ARG;
        else if (st != TS_OK) { /* keep the run's error message */
            char msg[TS_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", ts_last_error());
            if (ts__tl_write(path, t->trace_rank, t->trace_world) != TS_OK)
                ts_log(TS_LOG_WARN, "trace of the failed run: %s", ts_last_error());
            ts_error(st, "%s", msg);
        } else {
            ws = ts__tl_write(path, t->trace_rank, t->trace_world);
        }
        if (ws == TS_OK && ts__tl_dropped() > 0)
            ts_log(TS_LOG_WARN, "trace %s: %lld events past the first %lld were dropped", path,
                   (long long)ts__tl_dropped(), (long long)TS__TL_DEFAULT_MAX_EVENTS);
    }
    ts__tl_stop();
    if (t->csv && fclose(t->csv) != 0 && ws == TS_OK)
        ws = ts_error(TS_ERR_IO, "metrics CSV %s: %s", t->metrics_csv, strerror(errno));
    t->csv = NULL;
    return st != TS_OK ? st : ws;
}

/* ---- the loop --------------------------------------------------------------------------------------- */
typedef struct epoch_state {
    ts_train_event ev; /* what callbacks see */
    double t0, loss_sum;
    int64_t steps;
} epoch_state;

static ts_status notify(ts_trainer *t, epoch_state *e, ts_train_event_kind kind) {
    if (!t->o.callback) return TS_OK;
    e->ev.kind = kind;
    e->ev.mean_loss = e->steps ? e->loss_sum / (double)e->steps : NAN;
    ts_status st = t->o.callback(&e->ev, t->o.user);
    if (st != TS_OK && !ts_last_error()[0]) ts_error(st, "the training callback stopped the run");
    return st;
}

static ts_status save_one(ts_trainer *t, epoch_state *e, const char *path) {
    double t0 = ts__tl_now();
    ts_status st = ts_trainer_save(t, path);
    ts__tl_event(TS__TL_TRAINER, "checkpoint", t0, ts__tl_now(), "step", t->step, NULL, 0);
    if (st != TS_OK) return ts__error_prefix(st, "saving the checkpoint");
    e->ev.checkpoint = path;
    st = notify(t, e, TS_TRAIN_CHECKPOINT);
    e->ev.checkpoint = NULL;
    return st;
}

/* Rank 0's save: the checkpoint file and/or a new file in the checkpoint folder. */
static ts_status save_and_notify(ts_trainer *t, epoch_state *e) {
    if (t->checkpoint) TS_TRY(save_one(t, e, t->checkpoint));
    if (!t->checkpoint_dir) return TS_OK;
    char path[4096];
    if (!t->ckdir.scanned) ts__ckdir_scan(&t->ckdir, t->checkpoint_dir, &t->lineage);
    TS_TRY(ts__ckdir_prepare(&t->ckdir, t->checkpoint_dir, t->step, path, sizeof path));
    TS_TRY(save_one(t, e, path));
    ts__ckdir_saved(&t->ckdir, t->checkpoint_dir, t->step, path, t->o.keep);
    return TS_OK;
}

static bool saves(const ts_trainer *t) { return t->checkpoint || t->checkpoint_dir; }

/* Forward + backward of up to `want` batches of the source, their gradients added (DDP: the last one's
 * backward all-reduces the sum); *m gets how many ran (0: the epoch is over), *last the last one's index. */
static ts_status accumulate(ts_trainer *t, int64_t want, int64_t *m, int64_t *last, double *loss, int64_t *images,
                            int64_t *tokens, double *wait) {
    ts_ddp *ddp = ts_strategy_ddp(t->s);
    *m = *images = *tokens = 0;
    *loss = *wait = 0.0;
    while (*m < want) {
        ts_batch b;
        double t0 = ts__tl_now(); /* timeline on: the wait for the batch, then its forward + backward */
        TS_TRY(ts_batch_source_next(t->train, &b));
        if (t0 > 0) {
            double t1 = ts_time_now();
            *wait += t1 - t0;
            ts__tl_event(TS__TL_TRAINER, "data wait", t0, t1, b.x ? "batch" : NULL, b.x ? b.index : 0, NULL, 0);
        }
        if (!b.x) break;
        if (ddp) ts_ddp_set_require_sync(ddp, *m == want - 1);
        float l = 0.0f;
        t0 = ts__tl_now();
        ts_status st = ts_strategy_forward_backward(t->s, b.x, b.y, t->o.label_smoothing, &l);
        ts__tl_event(TS__TL_TRAINER, "forward_backward", t0, ts__tl_now(), "batch", b.index, NULL, 0);
        if (ddp) ts_ddp_set_require_sync(ddp, true);
        if (st != TS_OK) return st;
        *loss += l;
        *images += b.size;
        if (ts_tensor_ndim(b.y) >= 2) *tokens += ts_tensor_numel(b.y); /* labels per position: token data */
        *last = b.index;
        ++*m;
    }
    if (ddp && *m > 0 && *m < want) /* every rank has the same batch count: a short epoch means the source broke */
        return ts_error(TS_ERR_STATE, "the training source ended after %lld of the %lld batches it announced for "
                        "epoch %lld (rank %d): the accumulated gradients were never all-reduced", (long long)(t->batch + *m),
                        (long long)(t->batch + want), (long long)t->epoch + 1, ts_strategy_rank(t->s));
    *loss /= (double)(*m ? *m : 1);
    return TS_OK;
}

/* Rank 0's evaluation every eval_every steps (the others go on to the next all-reduce, where they wait for
 * it), with a TS_TRAIN_EVAL event; the model back in training mode. */
static ts_status evaluate_now(ts_trainer *t, epoch_state *e, bool leader) {
    if (!leader || !t->o.eval) return TS_OK;
    double t0 = ts__tl_now(), e0 = ts_time_now();
    ts_status st = ts_evaluate(ts_strategy_module(t->s), t->o.eval, &t->last_eval);
    ts__tl_span(TS__TL_TRAINER, "evaluate", t0);
    ts_strategy_train(t->s, true);
    e->t0 += ts_time_now() - e0; /* the epoch's training time leaves the evaluation out */
    TS_TRY(st);
    t->evaluated_at = t->step;
    e->ev.eval = &t->last_eval;
    st = notify(t, e, TS_TRAIN_EVAL);
    e->ev.eval = NULL;
    return st;
}

/* One optimizer step of the current epoch over up to accum_steps batches; *done when the epoch or the
 * run (max_steps) is over. */
static ts_status run_step(ts_trainer *t, epoch_state *e, bool leader, bool *done, bool *stopped) {
    if (t->o.max_steps > 0 && t->step >= t->o.max_steps) {
        *done = *stopped = true;
        return TS_OK;
    }
    int64_t left = ts_batch_source_num_batches(t->train, t->epoch) - t->batch;
    int64_t want = left < t->accum ? left : t->accum, m = 0, last = t->batch - 1, images = 0, tokens = 0;
    if (want <= 0) want = 1; /* a source that announces no more batches still gets asked (it ends the epoch) */
    double lr = t->has_sched ? ts_lr_schedule_at(&t->sched, t->step) : ts_optimizer_get_lr(t->opt);
    ts_optimizer_set_lr(t->opt, (float)lr);
    double loss = 0.0, norm = NAN, wait = 0.0, t0 = ts__tl_now();
    if (t0 > 0) (void)ts__tl_take(TS__TL_ALLREDUCE_S); /* this step's all-reduces from here */
    ts_status st = t->scaling ? ts__strategy_set_loss_scale(t->s, t->gs.scale) : TS_OK;
    if (st == TS_OK) st = accumulate(t, want, &m, &last, &loss, &images, &tokens, &wait);
    if (st == TS_OK && m == 0) {
        *done = true;
        return TS_OK;
    }
    double topt = ts__tl_now();
    bool overflow = false; /* loss scaling: a gradient is inf or NaN, so this step is skipped */
    if (st == TS_OK && t->scaling) {
        st = ts_grad_scaler_unscale(&t->gs, &t->params, &overflow);
        if (st == TS_OK) ts_grad_scaler_update(&t->gs, overflow);
        if (overflow) t->skipped++;
    }
    if (st == TS_OK && m > 1 && !overflow) st = ts_scale_grads(&t->params, (float)(1.0 / (double)m), NULL);
    if (st == TS_OK && t->o.clip_grad_norm > 0 && !overflow)
        st = ts_clip_grad_norm(&t->params, t->o.clip_grad_norm, &norm);
    if (st == TS_OK && !overflow) st = ts_optimizer_step(t->opt);
    ts_optimizer_zero_grad(t->opt);
    ts__tl_span(TS__TL_TRAINER, "optimizer step", topt);
    ts__tl_event(TS__TL_TRAINER, "step", t0, ts__tl_now(), "step", t->step + 1, "epoch", t->epoch + 1);
    TS_TRY(st);
    t->step++;
    t->batch = last + 1;
    t->last_loss = loss;
    if (t->csv && t0 > 0) TS_TRY(csv_row(t, loss, lr, images * ts_strategy_world_size(t->s), ts_time_now() - t0, wait));
    if (!isfinite(loss))
        return ts_error(TS_ERR_STATE, "the loss became %f at step %lld (epoch %lld, batch %lld); lower the learning "
                                      "rate", loss, (long long)t->step, (long long)t->epoch + 1, (long long)last);
    e->steps++;
    e->loss_sum += loss;
    e->ev.loss = loss;
    e->ev.lr = lr;
    e->ev.batch = t->batch;
    e->ev.step = t->step;
    e->ev.micro_batches = m;
    e->ev.grad_norm = norm;
    e->ev.epoch_images += images * ts_strategy_world_size(t->s); /* every rank ran batches like these */
    e->ev.epoch_tokens += tokens * ts_strategy_world_size(t->s);
    e->ev.epoch_seconds = ts_time_now() - e->t0;
    TS_TRY(notify(t, e, TS_TRAIN_STEP));
    if (t->o.eval_every > 0 && t->step % t->o.eval_every == 0) TS_TRY(evaluate_now(t, e, leader));
    if (leader && saves(t) && t->o.checkpoint_every > 0 && t->step % t->o.checkpoint_every == 0)
        TS_TRY(save_and_notify(t, e));
    return TS_OK;
}

ts_status ts_trainer_run(ts_trainer *t, ts_train_result *out) {
    TS_ARG(t, "ts_trainer_run: NULL trainer");
    ts_train_result r = {0};
    t->skipped = 0;
    const int64_t skipped0 = ts_batch_source_skipped(t->train);
    r.final_loss = t->last_loss;
    r.eval.accuracy = r.eval.loss = NAN;
    const int rank = ts_strategy_rank(t->s);
    const bool leader = rank == 0 && !t->follower;
    bool stopped = false, evaluated = false, recording = false;
    ts_status st = observe_start(t, leader, &recording);
    if (leader && t->checkpoint_dir && !t->ckdir.scanned) ts__ckdir_scan(&t->ckdir, t->checkpoint_dir, &t->lineage);
    while (st == TS_OK && !stopped && t->epoch < t->o.epochs) {
        epoch_state e = {.t0 = ts_time_now()};
        e.ev.rank = rank;
        e.ev.epoch = t->epoch;
        e.ev.epochs = t->o.epochs;
        e.ev.batch = t->batch;
        e.ev.step = t->step;
        e.ev.num_batches = ts_batch_source_num_batches(t->train, t->epoch);
        e.ev.lr = ts_optimizer_get_lr(t->opt);
        e.ev.grad_norm = NAN;
        if ((st = ts_batch_source_seek(t->train, t->epoch, t->batch)) != TS_OK) break;
        ts_strategy_train(t->s, true);
        for (bool done = false; st == TS_OK && !done;) st = run_step(t, &e, leader, &done, &stopped);
        double dt = e.ev.epoch_seconds = ts_time_now() - e.t0; /* training only: before evaluating */
        r.train_seconds += dt;
        r.images += e.ev.epoch_images;
        r.tokens += e.ev.epoch_tokens;
        if (st != TS_OK) break;
        if (!stopped) { /* the epoch is complete: go on at the next one */
            t->epoch++;
            t->batch = 0;
        }
        if (leader && t->o.eval) { /* rank 0 evaluates and checkpoints; the others go on */
            double t0 = ts__tl_now();
            st = ts_evaluate(ts_strategy_module(t->s), t->o.eval, &r.eval);
            ts__tl_span(TS__TL_TRAINER, "evaluate", t0);
            if (st != TS_OK) break;
            evaluated = true;
            e.ev.eval = &r.eval;
        }
        if ((st = notify(t, &e, TS_TRAIN_EPOCH_END)) != TS_OK) break;
        e.ev.eval = NULL;
        if (leader && saves(t) && (st = save_and_notify(t, &e)) != TS_OK) break;
    }
    if (st == TS_OK && leader && t->o.eval && !evaluated && t->evaluated_at == t->step && t->step > 0) {
        r.eval = t->last_eval; /* eval_every evaluated the model as it ends */
        evaluated = true;
    }
    if (st == TS_OK && leader && t->o.eval && !evaluated) {
        double t0 = ts__tl_now();
        st = ts_evaluate(ts_strategy_module(t->s), t->o.eval, &r.eval);
        ts__tl_span(TS__TL_TRAINER, "evaluate", t0);
    }
    if (recording) st = observe_finish(t, st);
    r.steps = t->step;
    r.epochs = t->epoch;
    r.final_loss = t->last_loss;
    r.images_per_second = r.train_seconds > 0 ? (double)r.images / r.train_seconds : 0.0;
    r.tokens_per_second = r.train_seconds > 0 ? (double)r.tokens / r.train_seconds : 0.0;
    r.skipped_steps = t->skipped;
    r.skipped_samples = ts_batch_source_skipped(t->train) - skipped0;
    r.loss_scale = t->scaling ? t->gs.scale : 0.0f;
    if (t->scaling) (void)ts__strategy_set_loss_scale(t->s, 1.0f); /* the strategy's later users see no scale */
    if (out) *out = r;
    return st;
}
