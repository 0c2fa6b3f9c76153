/*
 * train/run.c — ts_run_open: a ts_run_config made into a run (tessera/run.h),
 * the policy `tessera train` used to spell itself:
 *
 *   settings   threads, the convolution algorithm and the precision (matmul precision + autocast here, the
 *              loss scaler in the trainer's options): process-wide, set once
 *   resume     the checkpoint_dir's newest complete checkpoint when no resume is given; the resumed
 *              checkpoint's model (ts_checkpoint_model_load), classes, image size and seed
 *   placement  the strategy's devices; under a launcher every process is a DDP rank, device "cuda" being
 *              cuda:LOCAL_RANK (wrapping around the GPUs); the group's backend (auto: nccl when every rank
 *              of the host has a GPU of its own, as PyTorch)
 *   data       ts_data_open for this rank (rank 0: the evaluation split too)
 *   model      the zoo's, with the data's classes (or num_classes), from init_from; or the caller's
 *              (config.module) through a share of its tensors, copied back after training when moved
 *   training   strategy, optimizer, the schedule over the run's steps (epochs x steps per epoch, or
 *              max_steps when fewer; warmup first), the trainer, the resumed position
 */
#include "core/env.h"
#include "core/internal.h"
#include "tessera/run.h"

#include <stdio.h>
#include <string.h>

struct ts_run {
    ts_run_config c;        /* resolved: model, num_classes, image_size, seed, resume */
    char model[64];         /* c.model's storage when it came from a checkpoint */
    char latest[4096];      /* c.resume's when it came from checkpoint_dir */
    ts_dist_env env;
    bool in_job;
    ts_process_group *pg;
    ts_device *devs[TS_MAX_CPU_DEVICES + 1];
    ts_strategy_opts so;
    ts_ddp_options dopt;
    ts_batch_source *train, *eval;
    ts_module *model_m;     /* until the strategy takes it */
    int64_t data_classes;
    ts_strategy *s;
    ts_tensor_list params;
    ts_optimizer *opt;
    ts_lr_schedule sched;
    ts_grad_scaler gs;
    ts_rng rng;
    ts_trainer *t;
    int64_t total_steps, steps_per_epoch;
    ts_train_checkpoint_info resumed;
    bool did_resume, initialised;
    bool tokens;            /* a GPT: token data, gpt below */
    ts_gpt_config gpt;      /* the GPT's configuration (tokens) */
};

static int rank_of(const ts_run *r) { return r->pg ? ts_pg_rank(r->pg) : 0; }

/* A failure of the job rather than of the config (joining the group, DDP's first collectives): whatever the
 * layer below said (a port still taken, a peer gone), a caller may try again — TS_ERR_REMOTE unless it timed
 * out or ran out of memory, the message kept and prefixed with what. */
static ts_status job_failure(ts_status st, const char *what) {
    ts__error_prefix(st, "%s", what);
    if (st == TS_ERR_TIMEOUT || st == TS_ERR_NOMEM || st == TS_ERR_REMOTE) return st;
    char msg[TS_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", ts_last_error());
    return ts_error(TS_ERR_REMOTE, "%s", msg);
}

/* ---- resume: the checkpoint's model, classes, image size and seed ------------------------------------------ */
static ts_status open_resume(ts_run *r) {
    ts_run_config *c = &r->c;
    if (c->checkpoint_dir && !c->resume) { /* a restarted job goes on from the folder's newest checkpoint */
        bool found = false;
        ts_status st = ts_train_checkpoint_latest(c->checkpoint_dir, r->latest, sizeof r->latest, &found);
        if (st != TS_OK) return ts__error_prefix(st, "checkpoint_dir");
        if (found) c->resume = r->latest;
    }
    if (!c->resume) return TS_OK;
    ts_status st;
    if (c->module) { /* the caller's model: the trainer loads the checkpoint into it (strictly, names checked) */
        if ((st = ts_train_checkpoint_read(c->resume, &r->resumed)) != TS_OK) return ts__error_prefix(st, "resume");
        c->seed = r->resumed.seed;
        r->did_resume = true;
        return TS_OK;
    }
    ts_checkpoint_model_info mi = {0};
    st = ts_train_checkpoint_read(c->resume, &r->resumed);
    if (st == TS_OK) st = ts_checkpoint_model_load(c->resume, c->model, &r->model_m, &mi);
    if (st != TS_OK) {
        ts_checkpoint_model_info_clear(&mi);
        return ts__error_prefix(st, "resume");
    }
    if (c->num_classes && c->num_classes != mi.num_classes)
        st = ts_error(TS_ERR_INVALID_ARG, "num_classes %lld: %s was written with %lld classes",
                      (long long)c->num_classes, c->resume, (long long)mi.num_classes);
    snprintf(r->model, sizeof r->model, "%s", mi.model);
    c->model = r->model;
    c->num_classes = mi.num_classes;
    if (!c->image_size) c->image_size = mi.image_size;
    c->seed = r->resumed.seed; /* the data order is the checkpoint's */
    r->did_resume = true;
    ts_checkpoint_model_info_clear(&mi);
    return st;
}

/* ---- placement ---------------------------------------------------------------------------------------------- */
/* The strategy's kind and devices (so), and the one device of a process. */
static ts_status open_devices(ts_run *r) {
    const ts_run_config *c = &r->c;
    ts_strategy_opts *so = &r->so;
    so->kind = r->in_job ? TS_STRATEGY_DDP : c->strategy;
    so->schedule = c->pp_schedule;
    so->micro_batches = (int)c->micro_batches;
    if (c->device) {
        char name[64];
        snprintf(name, sizeof name, "%s", c->device);
        if (strcmp(c->device, "cuda") == 0 && r->in_job) { /* one GPU per local rank, as torchrun scripts pick */
            int n = ts_cuda_device_count(NULL, 0), local = r->env.local_rank > 0 ? r->env.local_rank : 0;
            snprintf(name, sizeof name, "cuda:%d", n > 0 ? local % n : 0);
        }
        ts_status st = ts_device_get(name, &r->devs[0]);
        if (st != TS_OK) return ts__error_prefix(st, "device");
        so->devices = r->devs;
        so->num_devices = 1;
        return TS_OK;
    }
    if (!c->devices) return TS_OK; /* the strategy takes every virtual CPU device */
    /* without TS_CPU_DEVICES, the virtual CPU devices grow to cover the highest cpu:K listed */
    int want = 0;
    for (const char *p = strstr(c->devices, "cpu:"); p; p = strstr(p + 4, "cpu:")) {
        char *end;
        long k = strtol(p + 4, &end, 10);
        if (end != p + 4 && k >= 0 && k < TS_MAX_CPU_DEVICES && k + 1 > want) want = (int)k + 1;
    }
    if (!ts_env_is_set(TS_ENV_CPU_DEVICES) && want > ts_cpu_device_count()) ts_set_cpu_device_count(want);
    ts_status st = ts_device_list_parse(c->devices, r->devs, TS_MAX_CPU_DEVICES + 1, &so->num_devices);
    if (st != TS_OK) return ts__error_prefix(st, "devices");
    so->devices = r->devs;
    return TS_OK;
}

/* Under a launcher: the process group (ts_pg_new gives the rank its share of the host's CPUs unless threads or
 * OMP_NUM_THREADS said). */
static ts_status open_group(ts_run *r) {
    const ts_run_config *c = &r->c;
    long local = r->env.local_world_size > 0 ? r->env.local_world_size : 1;
    ts_device *dev = r->so.num_devices == 1 ? r->so.devices[0] : NULL;
    bool cuda = dev && ts_device_type_of(dev) == TS_DEVICE_CUDA;
    ts_run_backend b = c->backend;
    if (b == TS_RUN_BACKEND_AUTO) /* NCCL when every rank of this host has a GPU of its own (device cuda) */
        b = cuda && strcmp(c->device, "cuda") == 0 && local <= ts_cuda_device_count(NULL, 0) &&
                    ts_pg_backend_available("nccl")
                ? TS_RUN_BACKEND_NCCL
                : TS_RUN_BACKEND_BUILTIN;
    ts_pg_options po = TS_PG_OPTIONS_INIT;
    po.timeout_s = c->timeout;
    po.backend = ts_run_backend_name(b);
    if (cuda) po.device = ts_device_name(dev);
    ts_status st = ts_pg_new(&po, &r->pg);
    return st == TS_OK ? TS_OK : job_failure(st, "joining the process group");
}

/* ---- a GPT's configuration: the resumed model's, or the preset's with the config's sizes ------------------------ */
/* The resolved sizes into the config, as ts_run_config_of shows them. */
static void show_gpt_config(ts_run *r) {
    ts_run_config *c = &r->c;
    c->n_layer = r->gpt.n_layer;
    c->n_head = r->gpt.n_head;
    c->n_embd = r->gpt.n_embd;
    c->seq_len = r->gpt.seq_len;
    c->vocab_size = c->num_classes = r->gpt.vocab_size;
    c->dropout = r->gpt.dropout;
}

static ts_status open_gpt_config(ts_run *r) {
    ts_run_config *c = &r->c;
    ts_model_desc md = {0};
    if (c->module) { /* the caller's module: a GPT of ts_model_gpt trains on token shards as the zoo's does */
        if (ts_gpt_get_config(c->module, &r->gpt) != TS_OK) {
            ts_clear_error();
            return TS_OK;
        }
        r->tokens = true;
        c->model = "gpt2"; /* the checkpoint's model: ts_checkpoint_model_load rebuilds it from the gpt.* keys */
        return TS_OK;
    }
    if (!ts_model_info(c->model, &md) || !md.tokens) return TS_OK;
    r->tokens = true;
    if (r->model_m) { /* resumed: the checkpoint's */
        TS_TRY(ts_gpt_get_config(r->model_m, &r->gpt));
        show_gpt_config(r);
        return TS_OK;
    }
    TS_TRY(ts_gpt_preset(c->model, &r->gpt));
    if (c->n_layer) r->gpt.n_layer = c->n_layer;
    if (c->n_head) r->gpt.n_head = c->n_head;
    if (c->n_embd) r->gpt.n_embd = c->n_embd;
    if (c->seq_len) r->gpt.seq_len = c->seq_len;
    r->gpt.dropout = (float)c->dropout;
    ts_status st = ts_gpt_config_check(&r->gpt);
    return st == TS_OK ? TS_OK : ts__error_prefix(st, "model %s", c->model);
}

/* ---- data and model ------------------------------------------------------------------------------------------ */
/* A model with a fixed input (cnn, mlp: 1 x 28 x 28) must get samples of that shape: said up front, naming both
 * shapes, rather than as a shape error from inside the model's first Linear layer. */
static ts_status check_sample_shape(const ts_run *r, const ts_model_desc *md) {
    int64_t sh[TS_MAX_DIMS];
    int nd = ts_batch_source_sample_shape(r->train, sh);
    if (!md->fixed_size || nd != 3 ||
        (sh[0] == md->in_channels && sh[1] == md->image_size && sh[2] == md->image_size))
        return TS_OK;
    return ts_error(TS_ERR_INVALID_ARG, "data %s: its samples are %lldx%lldx%lld (channels x height x width), but model "
                    "%s takes %dx%dx%d only (the reference cnn and mlp have fixed input sizes; the ResNets take any "
                    "image size)", r->c.data, (long long)sh[0], (long long)sh[1], (long long)sh[2], r->c.model,
                    md->in_channels, md->image_size, md->image_size);
}

static ts_status open_data(ts_run *r) {
    const ts_run_config *c = &r->c;
    ts_model_desc md = {0}; /* a module of the caller's: no fixed input, image folders at image_size */
    if (!c->module) ts_model_info(c->model, &md);
    ts_status st = c->checkpoint && rank_of(r) == 0 ? ts_ckpt_check_writable(c->checkpoint) : TS_OK;
    if (st != TS_OK) return ts__error_prefix(st, "checkpoint"); /* before loading any data */
    ts_data_opts d = TS_DATA_OPTS_INIT;
    d.path = c->data;
    d.batch_size = c->batch_size;
    d.seed = (uint64_t)c->seed;
    d.rank = rank_of(r);
    d.world_size = r->pg ? ts_pg_size(r->pg) : 1;
    d.threads = (int)c->data_threads;
    d.skip_corrupt = c->skip_corrupt;
    if (c->decode == TS_DECODE_MIXED) d.mixed_decode = r->so.devices[0];
    d.image_size = md.fixed_size || r->tokens ? 0 : (int)(c->image_size ? c->image_size : md.image_size);
    d.seq_len = r->tokens ? r->gpt.seq_len : d.seq_len;
    d.eval_max_batches = c->eval_batches;
    if (r->tokens != ts_data_is_tokens(c->data))
        return ts_error(TS_ERR_INVALID_ARG, r->tokens ? "data %s: model %s is a language model: it trains on token "
                        "shards (a folder from `tessera data tokenize`)" : "data %s holds token shards: model %s "
                        "takes images; train a GPT on them (model gpt2, gpt2-tiny, ...)", c->data, c->model);
    st = ts_data_open(&d, &r->train, d.rank == 0 ? &r->eval : NULL);
    if (st != TS_OK) return ts__error_prefix(st, "data %s", c->data);
    r->c.image_size = d.image_size;
    if (!r->tokens) TS_TRY(check_sample_shape(r, &md));
    /* the output layer follows the data's classes (an image folder's sub-folders), or num_classes */
    r->data_classes = ts_batch_source_num_classes(r->train);
    if (c->num_classes && c->num_classes < r->data_classes)
        return ts_error(TS_ERR_INVALID_ARG, "num_classes %lld: data %s has %lld classes", (long long)c->num_classes,
                        c->data, (long long)r->data_classes);
    return TS_OK;
}

static ts_status open_model(ts_run *r) {
    ts_run_config *c = &r->c;
    if (c->module) { /* the caller's, trained in place: the strategy owns a share of its tensors */
        if (r->tokens && r->gpt.vocab_size < r->data_classes)
            return ts_error(TS_ERR_INVALID_ARG, "the GPT's vocab_size %lld: data %s holds token ids up to %lld",
                            (long long)r->gpt.vocab_size, c->data, (long long)r->data_classes - 1);
        TS_TRY(ts_module_share(c->module, &r->model_m));
        if (r->did_resume) return TS_OK; /* the trainer loads the checkpoint into it */
    } else if (r->did_resume) {
        return TS_OK; /* the checkpoint's */
    } else if (r->tokens) { /* the vocabulary: the config's, else the data's, else the preset's */
        if (c->vocab_size) r->gpt.vocab_size = c->vocab_size;
        else if (c->num_classes) r->gpt.vocab_size = c->num_classes;
        else if (r->data_classes) r->gpt.vocab_size = r->data_classes;
        if (r->gpt.vocab_size < r->data_classes)
            return ts_error(TS_ERR_INVALID_ARG, "vocab_size %lld: data %s holds token ids up to %lld",
                            (long long)r->gpt.vocab_size, c->data, (long long)r->data_classes - 1);
        TS_TRY(ts_model_gpt(&r->gpt, &r->rng, &r->model_m));
    } else {
        TS_TRY(ts_model_new(c->model, c->num_classes ? c->num_classes : r->data_classes, &r->rng, &r->model_m));
    }
    if (r->tokens) show_gpt_config(r);
    if (!c->num_classes) c->num_classes = r->data_classes;
    if (!c->init_from) return TS_OK;
    ts_status st = ts_weights_load_except(r->model_m, c->init_from, c->init_exclude);
    if (st != TS_OK) return ts__error_prefix(st, "init_from");
    r->initialised = true;
    return TS_OK;
}

/* ---- training: strategy, optimizer, schedule, trainer ---------------------------------------------------------- */
/* The schedule over the run's steps: an epoch's optimizer steps are its batches / accum_steps (a last shorter
 * step included); the run's are the epochs', or max_steps when fewer (torch's CosineAnnealingLR with T_max =
 * the steps that run); warmup first, the schedule over the rest. */
static ts_status open_schedule(ts_run *r) {
    const ts_run_config *c = &r->c;
    int64_t nb = (ts_batch_source_num_batches(r->train, 0) + c->accum_steps - 1) / c->accum_steps;
    r->steps_per_epoch = nb;
    r->total_steps = c->epochs * nb;
    if (c->max_steps > 0 && c->max_steps < r->total_steps) r->total_steps = c->max_steps;
    int64_t rest = r->total_steps > c->warmup_steps ? r->total_steps - c->warmup_steps : 1;
    TS_TRY(ts_lr_schedule_by_kind(c->lr_schedule, c->lr, rest, nb, &r->sched));
    if (c->warmup_steps > 0) r->sched = ts_lr_with_warmup(r->sched, c->warmup_steps, 1.0 / 3.0);
    return TS_OK;
}

static ts_trainer_opts trainer_opts(ts_run *r) {
    const ts_run_config *c = &r->c;
    ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
    to.epochs = c->epochs;
    to.max_steps = c->max_steps;
    to.eval_every = c->eval_every;
    to.schedule = &r->sched;
    to.label_smoothing = (float)c->label_smoothing;
    to.num_classes = c->num_classes != r->data_classes ? c->num_classes : 0;
    to.eval = r->eval;
    to.checkpoint = c->checkpoint;
    to.checkpoint_dir = c->checkpoint_dir;
    to.keep = (int)c->keep;
    to.checkpoint_every = c->checkpoint_every;
    to.callback = c->callback;
    to.user = c->user;
    to.model_name = c->model;
    to.optimizer_name = ts_optimizer_kind_name(c->optimizer);
    to.seed = (uint64_t)c->seed;
    to.batch_size = c->batch_size;
    to.rng = &r->rng;
    to.accum_steps = c->accum_steps;
    to.clip_grad_norm = c->clip_grad_norm;
    to.trace_path = c->trace;
    to.metrics_csv = c->metrics_csv;
    r->gs = TS_GRAD_SCALER_INIT; /* fp16: dynamic loss scaling, torch.amp.GradScaler's defaults */
    r->gs.scale = (float)c->loss_scale;
    if (c->precision == TS_PRECISION_FP16) to.grad_scaler = &r->gs;
    return to;
}

static ts_status open_training(ts_run *r) {
    const ts_run_config *c = &r->c;
    r->so.pg = r->pg;
    r->so.sync_bn = c->sync_bn;
    r->dopt = TS_DDP_OPTIONS_INIT;
    r->dopt.comm_dtype = ts_precision_dtype(c->ddp_comm);
    r->so.ddp = &r->dopt;
    r->so.sample_ndim = ts_batch_source_sample_shape(r->train, r->so.sample_shape);
    if (c->activation_checkpointing) { /* before the strategy: replicas and stages inherit the marks */
        int units = 0;
        TS_TRY(ts_model_set_activation_checkpointing(r->model_m, true, &units));
        ts_log(TS_LOG_INFO, "activation checkpointing: %d units recompute their forward in backward", units);
    }
    ts_module *m = r->model_m;
    r->model_m = NULL; /* the strategy owns it now, also on failure */
    ts_status st = ts_strategy_new(m, &r->so, &r->s);
    if (st != TS_OK) return r->so.kind == TS_STRATEGY_DDP ? job_failure(st, "DDP") : st;
    TS_TRY(ts_module_parameters(ts_strategy_model(r->s), &r->params));
    TS_TRY(ts_optimizer_by_kind(c->optimizer, &r->params, c->lr, c->momentum, c->weight_decay, &r->opt));
    if (r->tokens) TS_TRY(ts_optimizer_set_decay_rule(r->opt, TS_DECAY_MATRICES)); /* nanoGPT's, llm.c's groups */
    TS_TRY(open_schedule(r));
    ts_trainer_opts to = trainer_opts(r);
    TS_TRY(ts_trainer_new(r->s, r->opt, r->train, &to, &r->t));
    st = r->did_resume ? ts_trainer_resume(r->t, c->resume) : TS_OK;
    return st == TS_OK ? TS_OK : ts__error_prefix(st, "resume");
}

/* ---- the run ------------------------------------------------------------------------------------------------- */
static ts_status open_all(ts_run *r) {
    ts_run_config *c = &r->c;
    TS_TRY(ts_dist_env_detect(&r->env, &r->in_job));
    if (c->nproc > 1 && !r->in_job)
        return ts_error(TS_ERR_INVALID_ARG, "nproc %lld: this process is not one rank of a launched job; start "
                        "the processes first (ts_run_processes_to_start)", (long long)c->nproc);
    if (c->threads > 0) ts_set_num_threads((int)c->threads);
    ts_set_conv_algo(c->conv_algo);
    TS_TRY(ts_precision_apply(c->precision));
    TS_TRY(open_resume(r));
    if (!c->model) c->model = c->module ? ts_module_type_name(c->module) : "cnn";
    ts_rng_seed(&r->rng, (uint64_t)c->seed);
    TS_TRY(open_gpt_config(r));
    TS_TRY(open_devices(r));
    if (r->in_job) TS_TRY(open_group(r));
    TS_TRY(open_data(r));
    TS_TRY(open_model(r));
    return open_training(r);
}

ts_status ts_run_open(const ts_run_config *c, ts_run **out) {
    TS_ARG(c && out, "ts_run_open: NULL argument");
    *out = NULL;
    TS_TRY(ts_run_config_check(c));
    ts_run *r = ts__calloc(1, sizeof *r);
    if (!r) return TS_ERR_NOMEM;
    r->c = *c;
    r->so = TS_STRATEGY_OPTS_INIT;
    ts_status st = open_all(r);
    if (st != TS_OK) {
        if (r->pg && ts_pg_size(r->pg) > 1) ts__error_prefix(st, "rank %d", ts_pg_rank(r->pg));
        if (r->pg) ts_pg_abort(r->pg, "the run failed to start on this rank");
        ts_run_free(r);
        return st;
    }
    *out = r;
    return TS_OK;
}

/* config.module: the values the run trained on another device (the strategy moved its share's tensors) copied
 * back into the module; tensors the share still holds are the module's own and skipped. */
static ts_status copy_back(ts_run *r) {
    ts_tensor_list from = TS_TENSOR_LIST_INIT, to = TS_TENSOR_LIST_INIT;
    ts_status st = ts_module_state_dict(ts_strategy_model(r->s), &from);
    if (st == TS_OK) st = ts_module_state_dict(r->c.module, &to);
    if (st == TS_OK && from.n != to.n)
        st = ts_error(TS_ERR_STATE, "ts_run_train: the trained model has %d tensors, config.module %d", from.n, to.n);
    for (int i = 0; st == TS_OK && i < to.n; i++)
        if (ts_tensor_address(from.tensors[i]) != ts_tensor_address(to.tensors[i]))
            st = ts_tensor_copy_(to.tensors[i], from.tensors[i]);
    ts_tensor_list_clear(&from);
    ts_tensor_list_clear(&to);
    return st;
}

ts_status ts_run_train(ts_run *r, ts_train_result *out) {
    TS_ARG(r, "ts_run_train: NULL run");
    ts_status st = ts_trainer_run(r->t, out);
    if (r->c.module) {
        ts_status cb = copy_back(r);
        if (st == TS_OK) st = cb;
    }
    if (st != TS_OK && r->pg) ts_pg_abort(r->pg, "training failed on this rank");
    return st;
}

void ts_run_free(ts_run *r) {
    if (!r) return;
    ts_trainer_free(r->t);
    ts_tensor_list_clear(&r->params);
    ts_optimizer_free(r->opt);
    ts_strategy_free(r->s);
    ts_module_free(r->model_m);
    ts_batch_source_free(r->train);
    ts_batch_source_free(r->eval);
    ts_pg_free(r->pg);
    free(r);
}

const ts_run_config *ts_run_config_of(const ts_run *r) { return r ? &r->c : NULL; }
int ts_run_rank(const ts_run *r) { return r ? rank_of(r) : 0; }
int ts_run_world_size(const ts_run *r) { return r && r->pg ? ts_pg_size(r->pg) : 1; }
ts_strategy *ts_run_strategy(ts_run *r) { return r ? r->s : NULL; }
ts_batch_source *ts_run_train_source(ts_run *r) { return r ? r->train : NULL; }
ts_batch_source *ts_run_eval_source(ts_run *r) { return r ? r->eval : NULL; }
ts_process_group *ts_run_process_group(ts_run *r) { return r ? r->pg : NULL; }
int64_t ts_run_total_steps(const ts_run *r) { return r ? r->total_steps : 0; }
int64_t ts_run_steps_per_epoch(const ts_run *r) { return r ? r->steps_per_epoch : 0; }
bool ts_run_initialised(const ts_run *r) { return r && r->initialised; }

const char *ts_run_resumed(const ts_run *r, ts_train_checkpoint_info *info) {
    if (!r || !r->did_resume) return NULL;
    if (info) *info = r->resumed;
    return r->c.resume;
}
