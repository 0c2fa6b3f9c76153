/*
 * parallel/pipeline_parallel.c — pipeline parallelism: a Sequential cut into stages on
 * devices, each batch cut into micro-batches, GPipe and 1F1B schedules.
 *
 * The stages run a list of layers: the Sequential's children, or a GPT's (ts_model_gpt)
 * embedding piece, blocks and head piece (nn/gpt_stages.c), cut by block count with the
 * embedding on the first stage and ln_f + the tied head on the last. The tied weight is
 * read at both ends: a train run gives the head its own copy of wte (ts__gpt_head_untie)
 * and adds the copy's gradient into wte's after every stage has joined
 * (ts__gpt_head_retie), so two stages never backpropagate into one leaf at once.
 *
 * One call (a forward or a training step) is a *run*. Every stage gets one task
 * on its device's worker (ts_device_submit) that walks the stage's schedule, a
 * list of events "F i" (forward of micro-batch i) and "B i" (its backward),
 * and before each event waits until its input exists:
 *
 *     F(s, i) needs F(s-1, i): micro-batch i's activation from the stage before
 *     B(s, i) needs B(s+1, i): the gradient of that activation from the stage after
 *
 * Each worker runs its events one after the other in schedule order, so the
 * schedule is exactly the order of events per stage (recorded in the trace)
 * and stages overlap as far as the dependencies allow. GPipe and 1F1B are both
 * deadlock-free under these rules (every wait is on an event earlier in
 * another stage's list that itself only waits on earlier events).
 *
 * Training (ts_pp_train_step): stage s's input for micro-batch i is a
 * detached leaf requiring grad, made by copying the previous stage's output to
 * devs[s]; the stage's output (or, on the last stage, its weighted loss) is
 * kept until B(s, i), which calls ts_backward(output, gradient) on the stage's
 * own worker. The engine keeps its scratch in the nodes of the graph it walks,
 * and stages' graphs are disjoint (their own ops, their own parameters'
 * accumulate nodes, their own input leaf), so the stages' backward passes run
 * concurrently without sharing state; the micro-batches of one stage share
 * their parameters' accumulate nodes but run on one thread, one after another.
 *
 * Forward (the module's ts_module_forward): activations cross stages through
 * ts_to_device with autograd recorded, so a later ts_backward on the caller's
 * thread walks all stages as one graph.
 *
 * Errors: a failing event marks the run failed and wakes every waiter; the
 * other stages stop at their next wait and the caller gets the first failure,
 * naming the stage, device, pass and micro-batch.
 */
#include "core/timeline.h"
#include "device/device.h"
#include "nn/module.h"
#include "ops/loss.h"
#include "tessera/parallel.h"

#include <math.h>
#include <stdio.h>
#include <strings.h>

typedef struct pp_impl {
    int nstages, nlayers;
    ts_device *devs[TS_PP_MAX_STAGES];
    ts_device *out_dev;
    /* the layers run in order: a Sequential's children, or a GPT's embedding piece, blocks and head piece */
    ts_module **layers; /* borrowed from the model, but embed and head */
    char **names;       /* for messages (owned) */
    ts_module *embed, *head; /* a GPT's pieces (nn/gpt_stages.c; owned), or NULL */
    int first[TS_PP_MAX_STAGES + 1]; /* stage s runs layers [first[s], first[s+1]) */
    int micro_batches;
    ts_pp_schedule schedule;
    ts_pp_stats stats; /* of the most recent run */
    int *trace;              /* events of the most recent run: stage s's at trace[s * trace_stride] */
    int trace_stride;
    int trace_len[TS_PP_MAX_STAGES];
} pp_impl;

static void pipeline_free_impl(ts_module *m) {
    pp_impl *pp = m->impl;
    if (!pp) return;
    free(pp->trace);
    for (int k = 0; pp->names && k < pp->nlayers; k++) free(pp->names[k]);
    free(pp->names);
    free(pp->layers);
    ts_module_free(pp->embed);
    ts_module_free(pp->head);
}

static ts_status pipeline_forward(ts_module *m, const ts_tensor *x, ts_tensor **out);
static const ts_module_vt pipeline_vt = {.name = "PipelineParallel",
                                         .kind = TS_MODULE_PIPELINE_PARALLEL,
                                         .forward = pipeline_forward,
                                         .free_impl = pipeline_free_impl};

/* ---- schedules ------------------------------------------------------------------------------------ */
/* Events are ints: i >= 0 is F i, -(i + 1) is B i. */
#define EV_F(i) (i)
#define EV_B(i) (-(i)-1)

/* Writes stage s's events (at most 2m) for p stages and m micro-batches into ev; returns their count. */
static int pp_schedule(ts_pp_schedule kind, bool train, int p, int s, int m, int *ev) {
    int n = 0;
    if (!train) { /* forward only: micro-batches in order */
        for (int i = 0; i < m; i++) ev[n++] = EV_F(i);
        return n;
    }
    if (kind == TS_PP_GPIPE) { /* fill, then drain from the last micro-batch */
        for (int i = 0; i < m; i++) ev[n++] = EV_F(i);
        for (int i = m - 1; i >= 0; i--) ev[n++] = EV_B(i);
        return n;
    }
    /* 1F1B (PipeDream-flush): warm-up, steady one-forward-one-backward, cool-down */
    int w = TS_MIN(p - 1 - s, m);
    for (int i = 0; i < w; i++) ev[n++] = EV_F(i);
    for (int k = 0; k < m - w; k++) {
        ev[n++] = EV_F(w + k);
        ev[n++] = EV_B(k);
    }
    for (int i = m - w; i < m; i++) ev[n++] = EV_B(i);
    return n;
}

ts_status ts_pp_schedule_parse(const char *name, ts_pp_schedule *out) {
    TS_ARG(name && out, "ts_pp_schedule_parse: NULL argument");
    if (strcasecmp(name, "gpipe") == 0) {
        *out = TS_PP_GPIPE;
        return TS_OK;
    }
    if (strcasecmp(name, "1f1b") == 0) {
        *out = TS_PP_1F1B;
        return TS_OK;
    }
    return ts_error(TS_ERR_INVALID_ARG, "unknown pipeline schedule '%s' (known: gpipe, 1f1b)", name);
}

const char *ts_pp_schedule_name(ts_pp_schedule s) {
    return s == TS_PP_GPIPE ? "gpipe" : s == TS_PP_1F1B ? "1f1b" : "unknown";
}

/* ---- construction ----------------------------------------------------------------------------------- */
/* What a model is cut into: a Sequential's children (units = layers), or a GPT's blocks (the
 * embedding joins the first stage, ln_f and the tied head the last). */
typedef struct pp_units {
    bool gpt;
    int n;               /* children or blocks */
    const char *what;    /* "Sequential" or "GPT", for messages */
    const char *unit;    /* "layers" or "blocks" */
} pp_units;

static ts_status pp_units_of(ts_module *model, pp_units *u) {
    if (ts_module_kind(model) == TS_MODULE_SEQUENTIAL) {
        *u = (pp_units){false, model->nchildren, "Sequential", "layers"};
        return TS_OK;
    }
    if (ts__is_gpt(model)) {
        ts_gpt_config c;
        TS_TRY(ts_gpt_get_config(model, &c));
        *u = (pp_units){true, (int)c.n_layer, "GPT", "blocks"};
        return TS_OK;
    }
    return ts_error(TS_ERR_INVALID_ARG,
                    "ts_nn_pipeline_parallel_new: the module to split must be a Sequential or a GPT (got %s)",
                    ts_module_type_name(model));
}

static ts_status pp_check_devices(ts_device *const *devs, int nstages) {
    for (int s = 0; s < nstages; s++) {
        if (!devs[s]) return ts_error(TS_ERR_INVALID_ARG, "ts_nn_pipeline_parallel_new: device of stage %d is NULL", s);
        if (!devs[s]->stream)
            return ts_error(TS_ERR_DEVICE,
                            "ts_nn_pipeline_parallel_new: stage %d's device '%s' has no worker thread, so it "
                            "cannot run concurrently with the other stages (use virtual devices cpu:0, cpu:1, ...)",
                            s, devs[s]->name);
        for (int t = 0; t < s; t++)
            if (devs[t] == devs[s])
                return ts_error(TS_ERR_INVALID_ARG,
                                "ts_nn_pipeline_parallel_new: device %s is given to stages %d and %d", devs[s]->name,
                                t, s);
    }
    return TS_OK;
}

static ts_status pp_check_args(const pp_units *u, ts_device *const *devs, int nstages, int micro_batches,
                               ts_pp_schedule schedule) {
    if (nstages < 1 || nstages > TS_PP_MAX_STAGES)
        return ts_error(TS_ERR_INVALID_ARG, "ts_nn_pipeline_parallel_new: %d stages (want 1 to %d)", nstages,
                        TS_PP_MAX_STAGES);
    if (nstages > u->n)
        return ts_error(TS_ERR_INVALID_ARG,
                        "ts_nn_pipeline_parallel_new: %d stages but the %s has only %d %s (each stage needs at least "
                        "one)",
                        nstages, u->what, u->n, u->unit);
    if (micro_batches < 1)
        return ts_error(TS_ERR_INVALID_ARG, "ts_nn_pipeline_parallel_new: micro_batches is %d; it must be at least 1",
                        micro_batches);
    if (schedule != TS_PP_GPIPE && schedule != TS_PP_1F1B)
        return ts_error(TS_ERR_INVALID_ARG, "ts_nn_pipeline_parallel_new: unknown schedule %d", (int)schedule);
    return pp_check_devices(devs, nstages);
}

/* counts[s]: the units of stage s, from bounds (stage s: units [bounds[s-1], bounds[s]), bounds[-1] = 0)
 * or, without bounds, as equal as possible (the first stages get the remainder). */
static ts_status pp_counts(const pp_units *u, int nstages, const int *bounds, int *counts) {
    if (!bounds) {
        for (int s = 0; s < nstages; s++) counts[s] = u->n / nstages + (s < u->n % nstages);
        return TS_OK;
    }
    const char *one = u->gpt ? "block" : "layer";
    for (int s = 0; s < nstages; s++) {
        int lo = s ? bounds[s - 1] : 0;
        if (bounds[s] <= lo) {
            if (s)
                return ts_error(TS_ERR_INVALID_ARG,
                                "ts_nn_pipeline_parallel_new: bounds[%d] = %d does not come after bounds[%d] = %d "
                                "(bounds must increase: every stage needs at least one %s)",
                                s, bounds[s], s - 1, lo, one);
            return ts_error(TS_ERR_INVALID_ARG,
                            "ts_nn_pipeline_parallel_new: bounds[0] = %d (stage 0 needs at least one %s)",
                            bounds[0], one);
        }
        counts[s] = bounds[s] - lo;
    }
    if (bounds[nstages - 1] != u->n)
        return ts_error(TS_ERR_INVALID_ARG, "ts_nn_pipeline_parallel_new: the bounds end at %d but the %s has %d %s",
                        bounds[nstages - 1], u->what, u->n, u->unit);
    return TS_OK;
}

/* pp->layers and pp->names: the Sequential's children, or the GPT's embedding piece, blocks and head piece. */
static ts_status pp_layers_init(pp_impl *pp, ts_module *model, const pp_units *u) {
    ts_module *list = model;
    int off = 0;
    if (u->gpt) {
        TS_TRY(ts__gpt_pieces(model, &pp->embed, &list, &pp->head));
        off = 1;
    }
    pp->nlayers = list->nchildren + 2 * off;
    pp->layers = ts__calloc((size_t)pp->nlayers, sizeof *pp->layers);
    pp->names = ts__calloc((size_t)pp->nlayers, sizeof *pp->names);
    if (!pp->layers || !pp->names) return ts_error(TS_ERR_NOMEM, "ts_nn_pipeline_parallel_new: out of memory");
    for (int k = 0; k < pp->nlayers; k++) {
        char name[96];
        if (u->gpt && (k == 0 || k == pp->nlayers - 1))
            snprintf(name, sizeof name, "%s", k ? "transformer.ln_f + lm_head" : "transformer.wte + wpe");
        else
            snprintf(name, sizeof name, "%s%s", u->gpt ? "transformer.h." : "", list->child_names[k - off]);
        pp->layers[k] = k < off ? pp->embed : k - off < list->nchildren ? list->children[k - off] : pp->head;
        if (!(pp->names[k] = ts__strdup(name)))
            return ts_error(TS_ERR_NOMEM, "ts_nn_pipeline_parallel_new: out of memory");
    }
    return TS_OK;
}

/* Stage bounds over pp->layers from the unit counts (a GPT's embedding in stage 0, its head in the last),
 * and each stage's layers moved to its device. */
static ts_status pp_place(pp_impl *pp, const int *counts) {
    int p = pp->nstages, extra = pp->embed ? 1 : 0;
    pp->first[0] = 0;
    for (int s = 0; s < p; s++) {
        pp->first[s + 1] = pp->first[s] + counts[s] + (s == 0 ? extra : 0) + (s == p - 1 ? extra : 0);
        pp->stats.layers[s] = counts[s];
    }
    for (int s = 0; s < p; s++)
        for (int k = pp->first[s]; k < pp->first[s + 1]; k++) {
            ts_module *l = pp->layers[k];
            bool piece = l == pp->embed || l == pp->head;
            ts_status st = piece ? ts__gpt_piece_to(l, pp->devs[s]) : ts_module_to(l, pp->devs[s]);
            if (st != TS_OK)
                return ts__error_prefix(st, "ts_nn_pipeline_parallel_new: moving layer %s to %s", pp->names[k],
                                        pp->devs[s]->name);
        }
    return TS_OK;
}

ts_status ts_nn_pipeline_parallel_new(ts_module *seq, ts_device *const *devs, int nstages, const int *bounds,
                                      int micro_batches, ts_pp_schedule schedule, ts_device *output_device,
                                      ts_module **out) {
    ts_status st = TS_OK;
    ts_module *m = NULL;
    pp_units u = {0};
    int counts[TS_PP_MAX_STAGES];
    if (!seq || !devs || !out) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_nn_pipeline_parallel_new: NULL argument");
        goto fail;
    }
    *out = NULL;
    TS_CHECK_GOTO(pp_units_of(seq, &u));
    TS_CHECK_GOTO(pp_check_args(&u, devs, nstages, micro_batches, schedule));
    TS_CHECK_GOTO(pp_counts(&u, nstages, bounds, counts));
    TS_CHECK_GOTO(ts__module_new(&pipeline_vt, sizeof(pp_impl), &m));
    pp_impl *pp = m->impl;
    pp->nstages = nstages;
    pp->micro_batches = micro_batches;
    pp->schedule = schedule;
    pp->out_dev = output_device ? output_device : devs[nstages - 1];
    for (int s = 0; s < nstages; s++) pp->devs[s] = devs[s];
    pp->stats.stages = nstages;
    pp->stats.schedule = schedule;
    m->training = seq->training;
    TS_CHECK_GOTO(pp_layers_init(pp, seq, &u));
    TS_CHECK_GOTO(pp_place(pp, counts));
    st = ts__module_add_child(m, "module", seq);
    seq = NULL; /* owned by m now, or freed */
    TS_CHECK_GOTO(st);
    *out = m;
    return TS_OK;
fail:
    ts_module_free(seq);
    ts_module_free(m);
    return st;
}

static ts_status pp_get(const ts_module *m, const char *fn, pp_impl **out) {
    if (!m || m->vt != &pipeline_vt)
        return ts_error(TS_ERR_INVALID_ARG, "%s: not a pipeline module (got %s)", fn,
                        m ? ts_module_type_name(m) : "NULL");
    *out = m->impl;
    return TS_OK;
}

/* ---- one run ------------------------------------------------------------------------------------------ */
typedef struct pp_run {
    pp_impl *pp;
    bool train, grad_mode;
    const ts_tensor *x, *y; /* borrowed from the caller, who waits for the run */
    float smoothing;
    int p, m;
    int64_t batch, chunk;
    ts_tensor **in, **out;  /* [s * m + i]: stage s's input / output for micro-batch i */
    ts_tensor **loss;       /* [i] train: micro-batch i's weighted loss (on the last stage) */
    double *loss_val;       /* [i] its value */
    double *weight;         /* [i] train: micro-batch i's share of the batch's counted targets */
    unsigned char *fdone, *bdone; /* [s * m + i], guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool failed;            /* guarded by mu */
    ts_status fail_st;
    char fail_msg[TS_ERRMSG_MAX];
    int *ev;                /* executed events, stage s's at ev[s * 2m] */
    int nev[TS_PP_MAX_STAGES];
    double busy[TS_PP_MAX_STAGES];
    int inflight[TS_PP_MAX_STAGES], peak_inflight[TS_PP_MAX_STAGES];
    bool trace;             /* the calling thread records a timeline (core/timeline.h) */
} pp_run;

typedef struct pp_stage_arg {
    pp_run *r;
    int s;
} pp_stage_arg;

static void pp_fail(pp_run *r, ts_status st) {
    pthread_mutex_lock(&r->mu);
    if (!r->failed) {
        r->failed = true;
        r->fail_st = st;
        snprintf(r->fail_msg, sizeof r->fail_msg, "%s", ts_last_error());
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Waits until flags[idx] is set; TS_ERR_STATE when another stage failed first. */
static ts_status pp_wait(pp_run *r, const unsigned char *flags, int idx) {
    pthread_mutex_lock(&r->mu);
    while (!flags[idx] && !r->failed) pthread_cond_wait(&r->cv, &r->mu);
    bool failed = r->failed;
    pthread_mutex_unlock(&r->mu);
    return failed ? ts_error(TS_ERR_STATE, "pipeline: stopped because another stage failed") : TS_OK;
}

static void pp_mark(pp_run *r, unsigned char *flags, int idx) {
    pthread_mutex_lock(&r->mu);
    flags[idx] = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The last stage's loss of micro-batch i (samples [lo, hi)): its mean cross-entropy weighted by its
 * share of the batch, kept for B(last, i). Takes the reference logits. */
static ts_status pp_loss(pp_run *r, ts_device *dev, int i, int64_t lo, int64_t hi, ts_tensor *logits) {
    ts_tensor *tmp = NULL, *yd = NULL, *ce = NULL, *l = NULL;
    bool prev = ts_grad_set_enabled(false);
    ts_status st = ts_slice(r->y, 0, lo, hi, &tmp);
    if (st == TS_OK) st = ts_to_device(tmp, dev, &yd);
    ts_grad_set_enabled(prev);
    ts_tensor_release(tmp);
    if (st == TS_OK) st = ts__cross_entropy_seq(logits, yd, r->smoothing, &ce);
    if (st == TS_OK) st = ts_scale(ce, (float)r->weight[i], &l);
    if (st == TS_OK) {
        /* a micro-batch whose targets are all ignored has a NaN mean and weight 0:
         * it adds nothing (its backward gives zero gradients) */
        r->loss_val[i] = r->weight[i] != 0 ? ts_tensor_item(l, 0) : 0.0;
        r->loss[i] = l;
    }
    ts_tensor_release(ce);
    ts_tensor_release(yd);
    ts_tensor_release(logits);
    return st == TS_OK ? TS_OK : ts__error_prefix(st, "loss");
}

/* F(s, i): stage s's layers on micro-batch i. */
static ts_status pp_forward(pp_run *r, int s, int i) {
    pp_impl *pp = r->pp;
    ts_device *dev = pp->devs[s];
    int m = r->m;
    int64_t lo = (int64_t)i * r->chunk, hi = TS_MIN(r->batch, lo + r->chunk);
    ts_tensor *in = NULL, *tmp = NULL, *cur = NULL;
    ts_status st = TS_OK;
    if (s == 0) { /* slice the caller's batch; in training no gradient flows back to x */
        bool prev = r->train ? ts_grad_set_enabled(false) : ts_grad_is_enabled();
        st = ts_slice(r->x, 0, lo, hi, &tmp);
        if (st == TS_OK) st = ts_to_device(tmp, dev, &in);
        ts_grad_set_enabled(prev);
    } else {
        ts_tensor **src = &r->out[(s - 1) * m + i];
        if (r->train) { /* a detached copy: this stage's graph starts at its own leaf */
            st = ts_tensor_detach(*src, &tmp);
            if (st == TS_OK) st = ts_to_device(tmp, dev, &in);
            if (st == TS_OK) ts_tensor_set_requires_grad(in, true);
        } else { /* recorded copy: one graph across stages; the stage before no longer needs it */
            st = ts_to_device(*src, dev, &in);
            ts_tensor_release(*src);
            *src = NULL;
        }
    }
    ts_tensor_release(tmp);
    tmp = NULL;
    if (st != TS_OK) return ts__error_prefix(st, "copying the input to %s", dev->name);
    cur = ts_tensor_retain(in);
    for (int k = pp->first[s]; k < pp->first[s + 1] && st == TS_OK; k++) {
        ts_module *layer = pp->layers[k];
        ts_tensor *next = NULL;
        st = ts_module_forward(layer, cur, &next);
        if (st != TS_OK) ts__error_prefix(st, "layer %s (%s)", pp->names[k], ts_module_type_name(layer));
        ts_tensor_release(cur);
        cur = next;
    }
    if (r->train && s > 0)
        r->in[s * m + i] = in; /* its gradient goes to stage s-1 */
    else
        ts_tensor_release(in);
    if (st != TS_OK) return st;
    if (r->train && s == r->p - 1) return pp_loss(r, dev, i, lo, hi, cur); /* takes cur */
    r->out[s * m + i] = cur;
    return TS_OK;
}

/* B(s, i): backward of stage s for micro-batch i, from the next stage's input gradient. */
static ts_status pp_backward(pp_run *r, int s, int i) {
    int m = r->m, last = r->p - 1;
    ts_device *dev = r->pp->devs[s];
    ts_status st = TS_OK;
    ts_tensor *root = NULL, *g = NULL;
    if (s == last) {
        root = r->loss[i];
        r->loss[i] = NULL;
    } else {
        root = r->out[s * m + i];
        r->out[s * m + i] = NULL;
        ts_tensor **next_in = &r->in[(s + 1) * m + i];
        ts_tensor *gn = *next_in ? ts_tensor_grad(*next_in) : NULL;
        if (gn) st = ts_to_device(gn, dev, &g);
        ts_tensor_release(*next_in); /* stage s+1 is done with it */
        *next_in = NULL;
    }
    /* a stage with nothing to differentiate (no parameters, input needs no grad) or
     * no gradient coming back has nothing to do */
    if (st == TS_OK && root && ts_tensor_requires_grad(root) && (s == last || g)) st = ts_backward(root, g, false);
    ts_tensor_release(g);
    ts_tensor_release(root);
    return st;
}

static ts_status pp_stage_main(void *arg) {
    pp_stage_arg *a = arg;
    pp_run *r = a->r;
    int s = a->s, m = r->m;
    int *plan = ts__malloc(sizeof(int) * (size_t)(2 * m));
    if (!plan) {
        pp_fail(r, TS_ERR_NOMEM);
        return TS_ERR_NOMEM;
    }
    int n = pp_schedule(r->pp->schedule, r->train, r->p, s, m, plan);
    bool prev = ts_grad_set_enabled(r->train ? true : r->grad_mode);
    ts_status st = TS_OK;
    for (int k = 0; k < n; k++) {
        int e = plan[k];
        bool fwd = e >= 0;
        int i = fwd ? e : -e - 1;
        if (fwd && s > 0) st = pp_wait(r, r->fdone, (s - 1) * m + i);
        if (!fwd && s < r->p - 1) st = pp_wait(r, r->bdone, (s + 1) * m + i);
        if (st != TS_OK) break; /* another stage failed: it reports */
        double t0 = ts_time_now();
        st = fwd ? pp_forward(r, s, i) : pp_backward(r, s, i);
        double t1 = ts_time_now();
        r->busy[s] += t1 - t0;
        if (r->trace) /* the timeline: this event on the stage's lane (core/timeline.h) */
            ts__tl_event(TS__TL_DEVICE + s, fwd ? "forward" : "backward", t0, t1, "micro_batch", i, "stage", s);
        if (st != TS_OK) {
            ts__error_prefix(st, "pipeline stage %d (%s), %s of micro-batch %d", s, r->pp->devs[s]->name,
                             fwd ? "forward" : "backward", i);
            pp_fail(r, st);
            break;
        }
        r->ev[s * 2 * m + r->nev[s]++] = e;
        if (r->train) {
            r->inflight[s] += fwd ? 1 : -1;
            r->peak_inflight[s] = TS_MAX(r->peak_inflight[s], r->inflight[s]);
        }
        pp_mark(r, fwd ? r->fdone : r->bdone, s * m + i);
    }
    ts_grad_set_enabled(prev);
    free(plan);
    return st;
}

static void pp_run_clear(pp_run *r) {
    int n = r->p * r->m;
    for (int k = 0; r->in && k < n; k++) ts_tensor_release(r->in[k]);
    for (int k = 0; r->out && k < n; k++) ts_tensor_release(r->out[k]);
    for (int k = 0; r->loss && k < r->m; k++) ts_tensor_release(r->loss[k]);
    free(r->in);
    free(r->out);
    free(r->loss);
    free(r->loss_val);
    free(r->weight);
    free(r->fdone);
    free(r->bdone);
    free(r->ev);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

/* weight[i] = counted targets of micro-batch i / counted targets of the batch, so
 * sum_i weight[i] * mean_i = the batch's mean cross-entropy (ignore_index targets
 * count in neither, as in ts_cross_entropy; a sample has numel(y) / B targets: a
 * sequence's every position); size / B when none is counted. */
static ts_status pp_weights(pp_run *r, const ts_tensor *y) {
    int64_t n_all = ts_tensor_numel(y), row = n_all / r->batch;
    int64_t *t = ts__malloc(sizeof(int64_t) * (size_t)n_all);
    if (!t) return TS_ERR_NOMEM;
    ts_status st = ts_tensor_to_host(y, t, sizeof(int64_t) * (size_t)n_all);
    int64_t total = 0;
    for (int64_t k = 0; st == TS_OK && k < n_all; k++) total += t[k] != -100;
    for (int i = 0; st == TS_OK && i < r->m; i++) {
        int64_t lo = (int64_t)i * r->chunk, hi = TS_MIN(r->batch, lo + r->chunk), n = 0;
        for (int64_t k = lo * row; k < hi * row; k++) n += t[k] != -100;
        r->weight[i] = total ? (double)n / (double)total : (double)(hi - lo) / (double)r->batch;
    }
    free(t);
    return st;
}

static void pp_record(pp_run *r, bool train, double wall, const size_t *base);

/* Runs every stage's schedule over x (and y when training). On success the
 * caller takes what it needs from r and calls pp_run_clear. */
static ts_status pp_run_all(ts_module *pm, const char *fn, const ts_tensor *x, const ts_tensor *y, float smoothing,
                            bool train, pp_run *r) {
    pp_impl *pp = pm->impl;
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->pp = pp;
    r->train = train;
    r->grad_mode = ts_grad_is_enabled();
    r->x = x;
    r->y = y;
    r->smoothing = smoothing;
    r->p = pp->nstages;
    char a[96], b[96];
    if (ts_tensor_ndim(x) < 1 || ts_tensor_dim(x, 0) < 1)
        return ts_error(TS_ERR_SHAPE, "%s: input of shape %s has no batch to split", fn,
                        ts_shape_str(ts_tensor_ndim(x), ts_tensor_shape(x), a, sizeof a));
    r->batch = ts_tensor_dim(x, 0);
    if (y && (ts_tensor_ndim(y) < 1 || ts_tensor_dim(y, 0) != r->batch || ts_tensor_dtype(y) != TS_I64))
        return ts_error(TS_ERR_SHAPE, "%s: targets of shape %s (%s) for inputs of shape %s (want (%lld, ...) int64)",
                        fn,
                        ts_shape_str(ts_tensor_ndim(y), ts_tensor_shape(y), a, sizeof a),
                        ts_dtype_name(ts_tensor_dtype(y)),
                        ts_shape_str(ts_tensor_ndim(x), ts_tensor_shape(x), b, sizeof b), (long long)r->batch);
    /* torch.chunk: pieces of ceil(B / micro_batches), as many as it takes */
    r->chunk = (r->batch + pp->micro_batches - 1) / pp->micro_batches;
    r->m = (int)((r->batch + r->chunk - 1) / r->chunk);
    int p = r->p, m = r->m;
    size_t n = (size_t)p * (size_t)m;
    r->in = ts__calloc(n, sizeof *r->in);
    r->out = ts__calloc(n, sizeof *r->out);
    r->loss = ts__calloc((size_t)m, sizeof *r->loss);
    r->loss_val = ts__calloc((size_t)m, sizeof *r->loss_val);
    r->weight = ts__calloc((size_t)m, sizeof *r->weight);
    r->fdone = ts__calloc(n, 1);
    r->bdone = ts__calloc(n, 1);
    r->ev = ts__calloc(2 * n, sizeof *r->ev);
    if (!r->in || !r->out || !r->loss || !r->loss_val || !r->weight || !r->fdone || !r->bdone || !r->ev)
        return TS_ERR_NOMEM;
    if (y) { /* weights: each micro-batch's share of the counted (not ignore_index) targets */
        TS_TRY(pp_weights(r, y));
    }

    size_t base[TS_PP_MAX_STAGES];
    for (int s = 0; s < p; s++) {
        base[s] = ts_device_memory_allocated(pp->devs[s]);
        ts_device_memory_reset_peak(pp->devs[s]);
    }
    if (pp->head) { /* a GPT: the last stage's own copy of the tied weight (nn/gpt_stages.c) */
        ts_status st = ts__gpt_head_untie(pp->head, pp->devs[p - 1], train);
        if (st != TS_OK) return ts__error_prefix(st, "%s", fn);
    }
    pp_stage_arg args[TS_PP_MAX_STAGES];
    ts_task *tasks[TS_PP_MAX_STAGES] = {0};
    r->trace = ts__tl_on(); /* the caller's recorder: the stage workers record for it */
    for (int s = 0; s < p && r->trace; s++) {
        char lane[64];
        snprintf(lane, sizeof lane, "pipeline stage %d (%s)", s, pp->devs[s]->name);
        ts__tl_lane(TS__TL_DEVICE + s, lane);
    }
    double t0 = ts_time_now();
    for (int s = 0; s < p; s++) {
        args[s] = (pp_stage_arg){r, s};
        ts_status st = ts_device_submit(pp->devs[s], pp_stage_main, &args[s], &tasks[s]);
        if (st != TS_OK) {
            ts__error_prefix(st, "pipeline stage %d (%s)", s, pp->devs[s]->name);
            pp_fail(r, st); /* the stages already started stop at their next wait */
            break;
        }
    }
    for (int s = 0; s < p; s++) {
        if (!tasks[s]) continue;
        ts_status st = ts_task_wait(tasks[s]);
        (void)st; /* failures are recorded in r */
        ts_task_free(tasks[s]);
    }
    double wall = ts_time_now() - t0;
    pp_record(r, train, wall, base);
    if (pp->head) { /* every stage's backward is over: the head's gradient into wte's */
        ts_status st = ts__gpt_head_retie(pp->head, train && !r->failed);
        if (st != TS_OK && !r->failed) return ts__error_prefix(st, "%s", fn);
    }
    if (r->failed) return ts_error(r->fail_st, "%s: %s", fn, r->fail_msg);
    return TS_OK;
}

/* The run's stats and trace into the pipeline (ts_pp_get_stats, ts_pp_trace). */
static void pp_record(pp_run *r, bool train, double wall, const size_t *base) {
    pp_impl *pp = r->pp;
    int p = r->p, m = r->m;
    size_t n = (size_t)p * (size_t)m;
    ts_pp_stats *S = &pp->stats;
    S->micro_batches = m;
    S->train = train;
    S->wall_s = wall;
    double busy = 0;
    for (int s = 0; s < p; s++) {
        S->busy_s[s] = r->busy[s];
        busy += r->busy[s];
        S->peak_in_flight[s] = r->peak_inflight[s];
        size_t peak = ts_device_memory_peak(pp->devs[s]);
        S->peak_bytes[s] = peak > base[s] ? peak - base[s] : 0;
    }
    S->bubble = wall > 0 ? 1.0 - busy / ((double)p * wall) : 0.0;
    S->bubble_ideal = (double)(p - 1) / (double)(m + p - 1);
    int *trace = realloc(pp->trace, sizeof(int) * 2 * n);
    if (trace) {
        pp->trace = trace;
        pp->trace_stride = 2 * m;
        memcpy(trace, r->ev, sizeof(int) * 2 * n);
        for (int s = 0; s < p; s++) pp->trace_len[s] = r->nev[s];
    }
}

/* ---- the module's forward: outputs concatenated on the output device --------------------------------- */
static ts_status pipeline_forward(ts_module *pm, const ts_tensor *x, ts_tensor **out) {
    pp_impl *pp = pm->impl;
    pp_run r;
    ts_status st = pp_run_all(pm, "PipelineParallel", x, NULL, 0.0f, false, &r);
    ts_tensor **parts = NULL;
    int m = r.m, last = (r.p - 1) * m;
    if (st == TS_OK) {
        parts = ts__calloc((size_t)m, sizeof *parts);
        if (!parts) st = TS_ERR_NOMEM;
    }
    for (int i = 0; st == TS_OK && i < m; i++) st = ts_to_device(r.out[last + i], pp->out_dev, &parts[i]);
    if (st == TS_OK) {
        if (m == 1)
            *out = ts_tensor_retain(parts[0]);
        else
            st = ts_concat(parts, m, 0, out);
        if (st != TS_OK) ts__error_prefix(st, "Pipeline: gathering the outputs on %s", pp->out_dev->name);
    }
    for (int i = 0; parts && i < m; i++) ts_tensor_release(parts[i]);
    free(parts);
    pp_run_clear(&r);
    return st;
}

/* ---- a training step -------------------------------------------------------------------------------------- */
ts_status ts_pp_train_step(ts_module *pipe, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                                 float *loss) {
    pp_impl *pp = NULL;
    TS_TRY(pp_get(pipe, "ts_pp_train_step", &pp));
    TS_ARG(x && y && loss, "ts_pp_train_step: NULL argument");
    pp_run r;
    ts_status st = pp_run_all(pipe, "ts_pp_train_step", x, y, label_smoothing, true, &r);
    if (st == TS_OK) {
        double total = 0;
        for (int i = 0; i < r.m; i++) total += r.loss_val[i];
        *loss = (float)total;
    }
    pp_run_clear(&r);
    return st;
}

/* ---- stats, trace ------------------------------------------------------------------------------------------- */
ts_status ts_pp_get_stats(const ts_module *pipe, ts_pp_stats *out) {
    pp_impl *pp = NULL;
    TS_TRY(pp_get(pipe, "ts_pp_get_stats", &pp));
    TS_ARG(out, "ts_pp_get_stats: NULL out");
    *out = pp->stats;
    return TS_OK;
}

ts_status ts_pp_trace(const ts_module *pipe, int stage, char *buf, size_t n) {
    pp_impl *pp = NULL;
    TS_TRY(pp_get(pipe, "ts_pp_trace", &pp));
    TS_ARG(buf && n > 0, "ts_pp_trace: no buffer");
    TS_ARG(stage >= 0 && stage < pp->nstages, "ts_pp_trace: stage %d of a %d-stage pipeline", stage,
           pp->nstages);
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; pp->trace && k < pp->trace_len[stage]; k++) {
        int e = pp->trace[stage * pp->trace_stride + k];
        int w = snprintf(buf + len, n - len, "%s%c%d", k ? " " : "", e >= 0 ? 'F' : 'B', e >= 0 ? e : -e - 1);
        if (w < 0 || (size_t)w >= n - len)
            return ts_error(TS_ERR_INVALID_ARG, "ts_pp_trace: %zu bytes are too few for stage %d's %d events",
                            n, stage, pp->trace_len[stage]);
        len += (size_t)w;
    }
    return TS_OK;
}

/* ---- split by measured time ---------------------------------------------------------------------------------- */
/* The device of a layer's first parameter or buffer, or NULL. */
static ts_device *layer_device(ts_module *layer) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_device *d = NULL;
    if (ts_module_state_dict(layer, &l) == TS_OK && l.n > 0) d = ts_tensor_device(l.tensors[0]);
    ts_tensor_list_clear(&l);
    return d;
}

/* Fastest of 3 (after a warm-up) forward + backward of layer on a (a detached leaf that
 * requires grad when req). *next gets the layer's output, detached. */
static ts_status time_layer(ts_module *layer, ts_tensor *a, bool req, double *cost, ts_tensor **next) {
    double best = INFINITY;
    ts_status st = TS_OK;
    for (int rep = 0; rep < 4 && st == TS_OK; rep++) {
        ts_tensor *in = NULL, *o = NULL, *g = NULL;
        st = ts_tensor_detach(a, &in);
        if (st != TS_OK) break;
        ts_tensor_set_requires_grad(in, req);
        double t0 = ts_time_now();
        st = ts_module_forward(layer, in, &o);
        if (st == TS_OK && ts_tensor_requires_grad(o)) {
            st = ts_tensor_full(ts_tensor_device(o), ts_tensor_ndim(o), ts_tensor_shape(o), 1.0f, &g);
            if (st == TS_OK) st = ts_backward(o, g, false);
        }
        double t = ts_time_now() - t0;
        if (rep > 0) best = fmin(best, t);
        if (st == TS_OK && rep == 3) st = ts_tensor_detach(o, next);
        ts_tensor_release(g);
        ts_tensor_release(o);
        ts_tensor_release(in);
    }
    *cost = best;
    return st;
}

ts_status ts_pp_split_by_time(ts_module *seq, const ts_tensor *sample, int nstages, int *bounds) {
    TS_ARG(seq && sample && bounds, "ts_pp_split_by_time: NULL argument");
    TS_ARG(ts_module_kind(seq) == TS_MODULE_SEQUENTIAL,
           "ts_pp_split_by_time: the module must be a Sequential (got %s)", ts_module_type_name(seq));
    int n = seq->nchildren;
    TS_ARG(nstages >= 1 && nstages <= n,
           "ts_pp_split_by_time: %d stages for a Sequential of %d layers (want 1 to %d)", nstages, n, n);
    ts_status st = TS_OK;
    ts_tensor_list bufs = TS_TENSOR_LIST_INIT, saved = TS_TENSOR_LIST_INIT, params = TS_TENSOR_LIST_INIT;
    ts_tensor **grads = NULL;
    ts_tensor *a = NULL;
    double *cost = ts__calloc((size_t)n, sizeof *cost);
    double *dp = ts__calloc((size_t)(n + 1) * (size_t)(nstages + 1), sizeof *dp);
    int *cut = ts__calloc((size_t)(n + 1) * (size_t)(nstages + 1), sizeof *cut);
    bool prev = ts_grad_set_enabled(true);
    if (!cost || !dp || !cut) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    /* keep the buffers (BatchNorm statistics move in training mode) and the gradients */
    TS_CHECK_GOTO(ts_module_buffers(seq, &bufs));
    for (int k = 0; k < bufs.n; k++) {
        ts_tensor *c = NULL;
        TS_CHECK_GOTO(ts_tensor_clone(bufs.tensors[k], &c));
        st = ts_tensor_list_append(&saved, bufs.names[k], c);
        ts_tensor_release(c);
        TS_CHECK_GOTO(st);
    }
    TS_CHECK_GOTO(ts_module_parameters(seq, &params));
    grads = ts__calloc((size_t)params.n + 1, sizeof *grads);
    if (!grads) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    for (int k = 0; k < params.n; k++) {
        ts_tensor *g = ts_tensor_grad(params.tensors[k]);
        grads[k] = g ? ts_tensor_retain(g) : NULL;
        ts_tensor_zero_grad(params.tensors[k]);
    }
    {
        bool gprev = ts_grad_set_enabled(false);
        st = ts_tensor_detach(sample, &a);
        ts_grad_set_enabled(gprev);
        TS_CHECK_GOTO(st);
    }
    for (int k = 0; k < n; k++) {
        ts_module *layer = seq->children[k];
        ts_device *d = layer_device(layer);
        if (d && d != ts_tensor_device(a)) {
            ts_tensor *moved = NULL;
            TS_CHECK_GOTO(ts_to_device(a, d, &moved));
            ts_tensor_release(a);
            a = moved;
        }
        ts_tensor *next = NULL;
        st = time_layer(layer, a, k > 0, &cost[k], &next);
        if (st != TS_OK) {
            ts__error_prefix(st, "ts_pp_split_by_time: layer %s (%s)", seq->child_names[k], ts_module_type_name(layer));
            goto fail;
        }
        ts_log(TS_LOG_DEBUG, "pipeline split: layer %s (%s) forward + backward %.3f ms", seq->child_names[k],
               ts_module_type_name(layer), 1e3 * cost[k]);
        ts_tensor_release(a);
        a = next;
    }
    /* dp[j][k]: the cheapest most expensive stage over the first k layers cut into j stages */
    {
        int W = n + 1;
        double *pre = ts__calloc((size_t)n + 1, sizeof *pre);
        if (!pre) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
        for (int k = 0; k < n; k++) pre[k + 1] = pre[k] + cost[k];
        for (int k = 0; k <= n; k++) dp[k] = k == 0 ? 0 : INFINITY;
        for (int j = 1; j <= nstages; j++)
            for (int k = 0; k <= n; k++) {
                double best = INFINITY;
                int bc = 0;
                for (int c = j - 1; c < k; c++) { /* stage j takes layers [c, k) */
                    double v = fmax(dp[(j - 1) * W + c], pre[k] - pre[c]);
                    if (v < best) best = v, bc = c;
                }
                dp[j * W + k] = best;
                cut[j * W + k] = bc;
            }
        for (int j = nstages, k = n; j >= 1; j--) {
            int c = cut[j * W + k];
            bounds[j - 1] = k;
            ts_log(TS_LOG_DEBUG, "pipeline split: stage %d gets layers %d..%d, %.3f ms", j - 1, c, k - 1,
                   1e3 * (pre[k] - pre[c]));
            k = c;
        }
        free(pre);
    }
fail:
    ts_grad_set_enabled(prev);
    /* put the buffers and gradients back */
    for (int k = 0; k < saved.n && k < bufs.n; k++) {
        ts_status s2 = ts_tensor_copy_(bufs.tensors[k], saved.tensors[k]);
        if (st == TS_OK) st = s2;
    }
    for (int k = 0; grads && k < params.n; k++) {
        ts_tensor_set_grad(params.tensors[k], grads[k]);
        ts_tensor_release(grads[k]);
    }
    free(grads);
    ts_tensor_release(a);
    ts_tensor_list_clear(&bufs);
    ts_tensor_list_clear(&saved);
    ts_tensor_list_clear(&params);
    free(cost);
    free(dp);
    free(cut);
    return st;
}
