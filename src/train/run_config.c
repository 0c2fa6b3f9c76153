/*
 * train/run_config.c — a training run described as data (tessera/run.h): the
 * names of its enums, ts_run_config_check (every rule `tessera train` applies to
 * its flags, in the config's words: the fields are the flags' names), whether
 * the caller must start processes, and the precision applied in one place.
 */
#include "train/run_fields.h"

#include "core/env.h"
#include "core/internal.h"
#include "core/timeline.h"
#include "tessera/run.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

/* ---- names ------------------------------------------------------------------------------------------------ */
static const char *const precision_names[TS_PRECISION_COUNT] = {"fp32", "bf16", "fp16"};
static const char *const backend_names[TS_RUN_BACKEND_COUNT] = {"auto", "builtin", "mpi", "nccl"};

static ts_status from_name(const char *what, const char *const *names, int n, const char *name, int *out) {
    for (int i = 0; name && i < n; i++)
        if (strcasecmp(name, names[i]) == 0) {
            *out = i;
            return TS_OK;
        }
    char list[256];
    return ts_error(TS_ERR_INVALID_ARG, "unknown %s '%s' (expected %s)", what, name ? name : "(null)",
                    ts__name_list(names, n, list, sizeof list));
}

const char *ts_precision_name(ts_precision p) {
    return (int)p >= 0 && p < TS_PRECISION_COUNT ? precision_names[p] : NULL;
}

ts_status ts_precision_from_name(const char *name, ts_precision *out) {
    TS_ARG(out, "ts_precision_from_name: NULL argument");
    int i = 0;
    TS_TRY(from_name("precision", precision_names, TS_PRECISION_COUNT, name, &i));
    *out = (ts_precision)i;
    return TS_OK;
}

ts_dtype ts_precision_dtype(ts_precision p) { return p == TS_PRECISION_BF16 ? TS_BF16 : p == TS_PRECISION_FP16 ? TS_F16 : TS_F32; }

const char *ts_run_backend_name(ts_run_backend b) {
    return (int)b >= 0 && b < TS_RUN_BACKEND_COUNT ? backend_names[b] : NULL;
}

ts_status ts_run_backend_from_name(const char *name, ts_run_backend *out) {
    TS_ARG(out, "ts_run_backend_from_name: NULL argument");
    int i = 0;
    TS_TRY(from_name("backend", backend_names, TS_RUN_BACKEND_COUNT, name, &i));
    *out = (ts_run_backend)i;
    return TS_OK;
}

ts_status ts_precision_apply(ts_precision p) {
    TS_ARG((int)p >= 0 && p < TS_PRECISION_COUNT, "ts_precision_apply: %d is not a precision", (int)p);
    TS_TRY(ts_set_matmul_precision(ts_precision_dtype(p)));
    /* TS_AUTOCAST in the environment is autocast's starting value (core/threads.c): when set, it decides */
    if (!ts_env_is_set(TS_ENV_AUTOCAST)) TS_TRY(ts_set_autocast(p == TS_PRECISION_BF16 ? TS_BF16 : TS_F32));
    return TS_OK;
}

/* ---- rules ------------------------------------------------------------------------------------------------ */
static ts_status check_model(const ts_run_config *c) {
    ts_model_desc md;
    if (c->module) { /* a model of the caller's: `model` is only the name checkpoints record */
        if (c->init_exclude && !c->init_from) return ts_error(TS_ERR_INVALID_ARG, "init_exclude goes with init_from");
        return c->model && !c->model[0] ? ts_error(TS_ERR_INVALID_ARG, "model: an empty name") : TS_OK;
    }
    if (c->model && !ts_model_info(c->model, &md)) {
        char known[256] = "", esc[128];
        for (int i = 0; ts_model_name_at(i); i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", ts_model_name_at(i));
        return ts_error(TS_ERR_INVALID_ARG, "unknown model '%s' (expected one of %s)",
                        ts__printable(c->model, esc, sizeof esc), known);
    }
    if (c->model && md.fixed_size && c->image_size && c->image_size != md.image_size)
        return ts_error(TS_ERR_INVALID_ARG, "image_size %lld: model %s takes %dx%d images only",
                        (long long)c->image_size, c->model, md.image_size, md.image_size);
    if (c->init_exclude && !c->init_from) return ts_error(TS_ERR_INVALID_ARG, "init_exclude goes with init_from");
    return TS_OK;
}

/* One process on one device (device), on several (strategy + devices), or one of several processes (DDP:
 * launched, or nproc > 1 for the caller to start). */
static ts_status check_placement(const ts_run_config *c, bool launched) {
    const char *sname = ts_strategy_kind_name(c->strategy);
    bool one = c->strategy == TS_STRATEGY_NONE || c->strategy == TS_STRATEGY_DDP;
    if (c->device && c->devices)
        return ts_error(TS_ERR_INVALID_ARG, "device runs the model on one device per process, devices spreads it "
                        "over several (strategy data, model, pipeline or tile): give one or the other");
    if (c->device && !one)
        return ts_error(TS_ERR_INVALID_ARG, "device runs the model on one device per process; strategy %s takes "
                        "devices", sname);
    if (c->strategy == TS_STRATEGY_DDP && !launched)
        return ts_error(TS_ERR_INVALID_ARG, "strategy ddp needs nproc N or a launcher (tessera run, torchrun, mpirun)");
    if (launched && !one)
        return ts_error(TS_ERR_INVALID_ARG, "strategy %s runs one process on several devices; it cannot be combined "
                        "with nproc %lld or a launcher (DDP over processes): use one or the other", sname,
                        (long long)c->nproc);
    if (launched && c->devices)
        return ts_error(TS_ERR_INVALID_ARG, "devices goes with strategy data, model, pipeline or tile");
    if (c->devices && c->strategy == TS_STRATEGY_NONE)
        return ts_error(TS_ERR_INVALID_ARG, "devices needs strategy (data, model, pipeline or tile)");
    if (c->decode == TS_DECODE_MIXED && !c->device)
        return ts_error(TS_ERR_INVALID_ARG, "decode mixed decodes the training images on the GPU the model trains "
                        "on: give device cuda:N (or cuda)");
    if (c->precision == TS_PRECISION_FP16 && c->strategy == TS_STRATEGY_PIPELINE)
        return ts_error(TS_ERR_INVALID_ARG, "precision fp16 (loss scaling) is not available with strategy pipeline");
    return TS_OK;
}

static ts_status check_backend(const ts_run_config *c) {
    if (c->ddp_comm == TS_PRECISION_BF16 && c->backend == TS_RUN_BACKEND_MPI)
        return ts_error(TS_ERR_INVALID_ARG, "ddp_comm bf16 needs backend builtin or nccl (MPI has no bfloat16 "
                        "reduction)");
    if (c->backend == TS_RUN_BACKEND_NCCL && !ts_pg_backend_available("nccl"))
        return ts_error(TS_ERR_UNSUPPORTED, "backend nccl: this Tessera was built without NCCL (CUDA and NCCL are "
                        "found at build time: see `tessera devices`)");
    if (c->backend == TS_RUN_BACKEND_MPI && !ts_pg_backend_available("mpi"))
        return ts_error(TS_ERR_UNSUPPORTED, "backend mpi: this Tessera was built without MPI (install "
                        "libopenmpi-dev and rebuild)");
    return TS_OK;
}

/* The files a run writes besides checkpoints (a FIFO or a device there would block or be written into
 * after the banner): this process's trace (its rank's name in a job; rank 0's for a run that starts its
 * own processes) and the metrics CSV (rank 0 writes it). */
static ts_status check_outputs(const ts_run_config *c, const ts_dist_env *env) {
    if (c->trace) {
        int world = env->world_size > 1 ? env->world_size : c->nproc > 1 ? (int)c->nproc : 1;
        char path[4096];
        if (!ts__tl_rank_path(c->trace, env->world_size > 1 ? env->rank : 0, world, path, sizeof path))
            return ts_error(TS_ERR_INVALID_ARG, "trace %s: path too long", c->trace);
        TS_TRY(ts__error_prefix(ts_outfile_check(path, "a trace"), "trace"));
    }
    if (c->metrics_csv && (env->world_size <= 1 || env->rank == 0))
        TS_TRY(ts__error_prefix(ts_outfile_check(c->metrics_csv, "a metrics CSV file"), "metrics_csv"));
    return TS_OK;
}

ts_status ts_run_config_check(const ts_run_config *c) {
    TS_ARG(c, "ts_run_config_check: NULL config");
    TS_ARG(c->size == sizeof *c && c->magic == TS_RUN_CONFIG_MAGIC && c->version == TS_RUN_CONFIG_VERSION,
           "ts_run_config_check: the config was not initialised with TS_RUN_CONFIG_INIT");
    TS_ARG(c->data, "data: no data set given");
    TS_TRY(ts__run_config_check_fields(c)); /* ranges and enums */
    TS_TRY(check_model(c));
    TS_TRY(check_backend(c));
    ts_dist_env env;
    bool in_job = false;
    TS_TRY(ts_dist_env_detect(&env, &in_job));
    TS_TRY(check_placement(c, in_job || c->nproc > 1));
    if (access(c->data, R_OK) != 0) return ts_error(TS_ERR_IO, "data %s: %s", c->data, strerror(errno));
    return check_outputs(c, &env);
}

int ts_run_processes_to_start(const ts_run_config *c) {
    ts_dist_env env;
    bool in_job = false;
    if (!c || c->nproc <= 1 || ts_dist_env_detect(&env, &in_job) != TS_OK || in_job) return 0;
    return (int)c->nproc;
}
