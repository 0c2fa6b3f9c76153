/*
 * optim/optimizer.c — SGD and AdamW over a named parameter list, as
 * torch.optim.SGD and torch.optim.AdamW (single-tensor path): per-parameter
 * state created lazily at the first step with a gradient; parameters whose
 * gradient is NULL are skipped. The element updates run in the device's
 * optim kernels (src/device/k_optim.h); scalars are computed here in double.
 *
 * A step first creates every state tensor it will need, then updates: a step
 * that fails for lack of memory leaves every parameter as it was.
 */
#include "tensor/tensor.h"
#include "device/k_optim.h"
#include "tessera/optim.h"

#include <math.h>
#include <stdio.h>

typedef enum opt_kind { OPT_SGD = 0, OPT_ADAMW = 1 } opt_kind;

typedef struct param_state {
    char *name;    /* owned copy */
    ts_tensor *p;  /* owned reference */
    ts_tensor *buf;                           /* SGD momentum buffer */
    bool buf_fresh;                           /* buf allocated by this step, not yet written */
    ts_tensor *exp_avg, *exp_avg_sq, *vmax;   /* AdamW */
    int64_t step;                             /* AdamW: steps taken by this parameter */
    bool no_decay;                            /* excluded from weight decay (ts_optimizer_set_decay) */
} param_state;

struct ts_optimizer {
    opt_kind kind;
    ts_sgd_config sgd;
    ts_adamw_config adamw;
    float lr;
    int64_t nsteps;
    int n;
    param_state *ps;
};

/* the state tensors of one parameter, in state order */
enum { S_BUF = 0, S_EXP_AVG, S_EXP_AVG_SQ, S_VMAX, S_COUNT };
static const char *const state_suffix[S_COUNT] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

static ts_tensor **state_slot(param_state *s, int k) {
    switch (k) {
    case S_BUF: return &s->buf;
    case S_EXP_AVG: return &s->exp_avg;
    case S_EXP_AVG_SQ: return &s->exp_avg_sq;
    default: return &s->vmax;
    }
}

/* Whether state k exists for this optimizer's configuration. */
static bool state_used(const ts_optimizer *o, int k) {
    if (o->kind == OPT_SGD) return k == S_BUF && o->sgd.momentum != 0.0f;
    if (k == S_BUF) return false;
    return k != S_VMAX || o->adamw.amsgrad;
}

/* ---- creation ----------------------------------------------------------------------------- */
static ts_status check_header(const char *fn, size_t size, unsigned magic, unsigned version, size_t want) {
    if (magic != TS_OPTIM_CONFIG_MAGIC || size != want)
        return ts_error(TS_ERR_INVALID_ARG, "%s: config not initialised with its _CONFIG_INIT macro", fn);
    if (version != TS_OPTIM_CONFIG_VERSION)
        return ts_error(TS_ERR_INVALID_ARG, "%s: config version %u, this library has version %u", fn, version,
                        TS_OPTIM_CONFIG_VERSION);
    return TS_OK;
}

static ts_status opt_new(const char *fn, opt_kind kind, const ts_tensor_list *params, ts_optimizer **out) {
    TS_ARG(params && out, "%s: NULL argument", fn);
    for (int i = 0; i < params->n; i++) {
        ts_tensor *p = params->tensors[i];
        TS_TRY(ts__check_f32(fn, params->names[i], p));
        if (!ts_tensor_is_contiguous(p))
            return ts_error(TS_ERR_INVALID_ARG, "%s: parameter '%s' is not contiguous", fn, params->names[i]);
        if (!ts_tensor_is_leaf(p))
            return ts_error(TS_ERR_INVALID_ARG, "%s: parameter '%s' is not a leaf tensor", fn, params->names[i]);
    }
    ts_optimizer *o = ts__calloc(1, sizeof *o);
    if (!o) return TS_ERR_NOMEM;
    o->kind = kind;
    o->ps = ts__calloc((size_t)(params->n ? params->n : 1), sizeof *o->ps);
    if (!o->ps) {
        free(o);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < params->n; i++) {
        o->ps[i].name = ts__strdup(params->names[i]);
        if (!o->ps[i].name) {
            ts_optimizer_free(o);
            return TS_ERR_NOMEM;
        }
        o->ps[i].p = ts_tensor_retain(params->tensors[i]);
        o->n = i + 1;
    }
    *out = o;
    return TS_OK;
}

ts_status ts_optim_sgd_new(const ts_tensor_list *params, const ts_sgd_config *c, ts_optimizer **out) {
    const char *fn = "ts_optim_sgd_new";
    TS_ARG(c, "%s: NULL config", fn);
    TS_TRY(check_header(fn, c->size, c->magic, c->version, sizeof *c));
    TS_ARG(c->lr >= 0, "%s: invalid learning rate %g", fn, (double)c->lr);
    TS_ARG(c->momentum >= 0, "%s: invalid momentum %g", fn, (double)c->momentum);
    TS_ARG(c->weight_decay >= 0, "%s: invalid weight_decay %g", fn, (double)c->weight_decay);
    TS_ARG(!c->nesterov || (c->momentum > 0 && c->dampening == 0),
           "%s: nesterov momentum requires a momentum and zero dampening", fn);
    TS_TRY(opt_new(fn, OPT_SGD, params, out));
    (*out)->sgd = *c;
    (*out)->lr = c->lr;
    return TS_OK;
}

ts_status ts_optim_adamw_new(const ts_tensor_list *params, const ts_adamw_config *c, ts_optimizer **out) {
    const char *fn = "ts_optim_adamw_new";
    TS_ARG(c, "%s: NULL config", fn);
    TS_TRY(check_header(fn, c->size, c->magic, c->version, sizeof *c));
    TS_ARG(c->lr >= 0, "%s: invalid learning rate %g", fn, (double)c->lr);
    TS_ARG(c->eps >= 0, "%s: invalid epsilon %g", fn, (double)c->eps);
    TS_ARG(c->beta1 >= 0 && c->beta1 < 1, "%s: invalid beta1 %g", fn, (double)c->beta1);
    TS_ARG(c->beta2 >= 0 && c->beta2 < 1, "%s: invalid beta2 %g", fn, (double)c->beta2);
    TS_ARG(c->weight_decay >= 0, "%s: invalid weight_decay %g", fn, (double)c->weight_decay);
    TS_TRY(opt_new(fn, OPT_ADAMW, params, out));
    (*out)->adamw = *c;
    (*out)->lr = c->lr;
    return TS_OK;
}

static void clear_state(param_state *s) {
    for (int k = 0; k < S_COUNT; k++) {
        ts_tensor_release(*state_slot(s, k));
        *state_slot(s, k) = NULL;
    }
    s->step = 0;
    s->buf_fresh = false;
}

void ts_optimizer_free(ts_optimizer *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        clear_state(&o->ps[i]);
        ts_tensor_release(o->ps[i].p);
        free(o->ps[i].name);
    }
    free(o->ps);
    free(o);
}

/* ---- small accessors ------------------------------------------------------------------------ */
void ts_optimizer_zero_grad(ts_optimizer *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) ts_tensor_zero_grad(o->ps[i].p);
}
void ts_optimizer_set_lr(ts_optimizer *o, float lr) {
    if (o) o->lr = lr;
}
float ts_optimizer_get_lr(const ts_optimizer *o) { return o ? o->lr : 0.0f; }
int64_t ts_optimizer_step_count(const ts_optimizer *o) { return o ? o->nsteps : 0; }
const char *ts_optimizer_name(const ts_optimizer *o) { return !o ? "" : o->kind == OPT_SGD ? "SGD" : "AdamW"; }

/* ---- step --------------------------------------------------------------------------------------- */
static ts_status check_grad(const ts_optimizer *o, const param_state *s) {
    ts_tensor *p = s->p, *g = p->grad;
    char a[96], b[96];
    if (g->dtype != TS_F32)
        return ts_error(TS_ERR_DTYPE, "%s step: gradient of '%s' has dtype %s", ts_optimizer_name(o), s->name,
                        ts_dtype_name(g->dtype));
    if (!ts__same_shape(p, g))
        return ts_error(TS_ERR_SHAPE, "%s step: gradient of '%s' has shape %s, the parameter %s", ts_optimizer_name(o),
                        s->name, ts_shape_str(g->ndim, g->shape, a, sizeof a), ts_shape_str(p->ndim, p->shape, b, sizeof b));
    if (g->storage->device != p->storage->device)
        return ts_error(TS_ERR_DEVICE, "%s step: gradient of '%s' is on %s, the parameter on %s", ts_optimizer_name(o),
                        s->name, ts_device_name(g->storage->device), ts_device_name(p->storage->device));
    const struct ts_kernels_optim *k = p->storage->device->k_optim;
    if (!k || (o->kind == OPT_SGD ? !k->sgd_step : !k->adamw_step))
        return ts_error(TS_ERR_UNSUPPORTED, "%s step: no optimizer kernel on device %s", ts_optimizer_name(o),
                        ts_device_name(p->storage->device));
    return TS_OK;
}

static ts_status zeros_like(const ts_tensor *p, ts_tensor **out) {
    return ts_tensor_zeros(p->storage->device, TS_F32, p->ndim, p->shape, out);
}

/* Creates the state tensors a step of parameter s needs (none are written yet
 * on failure; what was created stays for the next try). */
static ts_status state_prepare(ts_optimizer *o, param_state *s) {
    if (o->kind == OPT_SGD) {
        if (o->sgd.momentum != 0.0f && !s->buf) {
            TS_TRY(ts__new_like(s->p, &s->buf)); /* the kernel writes every element at the first step */
            s->buf_fresh = true;
        }
        return TS_OK;
    }
    if (!s->exp_avg) s->step = 0; /* new moments start over */
    if (!s->exp_avg) TS_TRY(zeros_like(s->p, &s->exp_avg));
    if (!s->exp_avg_sq) TS_TRY(zeros_like(s->p, &s->exp_avg_sq));
    if (o->adamw.amsgrad && !s->vmax) TS_TRY(zeros_like(s->p, &s->vmax));
    return TS_OK;
}

static ts_status step_sgd(ts_optimizer *o, param_state *s, const ts_tensor *g) {
    const ts_sgd_config *c = &o->sgd;
    const float wd = s->no_decay ? 0.0f : c->weight_decay;
    ts_sgd_args a = {o->lr, c->momentum, c->dampening, wd, c->nesterov, c->maximize, s->buf_fresh};
    TS_TRY(s->p->storage->device->k_optim->sgd_step(s->p, g, s->buf, &a));
    s->buf_fresh = false;
    return TS_OK;
}

static ts_status step_adamw(ts_optimizer *o, param_state *s, const ts_tensor *g) {
    const ts_adamw_config *c = &o->adamw;
    int64_t step = s->step + 1;
    double lr = o->lr, bc1 = 1.0 - pow((double)c->beta1, (double)step), bc2 = 1.0 - pow((double)c->beta2, (double)step);
    const float wd = s->no_decay ? 0.0f : c->weight_decay;
    ts_adamw_args a = {o->lr, c->beta1, c->beta2, c->eps, wd, (float)(lr / bc1), (float)sqrt(bc2),
                       (float)(1.0 - lr * (double)wd), c->amsgrad, c->maximize};
    TS_TRY(s->p->storage->device->k_optim->adamw_step(s->p, g, s->exp_avg, s->exp_avg_sq, c->amsgrad ? s->vmax : NULL,
                                                       &a));
    s->step = step;
    return TS_OK;
}

ts_status ts_optimizer_step(ts_optimizer *o) {
    TS_ARG(o, "ts_optimizer_step: NULL optimizer");
    for (int i = 0; i < o->n; i++)
        if (o->ps[i].p->grad) TS_TRY(check_grad(o, &o->ps[i]));
    /* 1. everything the updates need: state tensors, contiguous gradients */
    ts_tensor **gs = ts__calloc((size_t)(o->n ? o->n : 1), sizeof *gs);
    if (!gs) return ts__error_prefix(TS_ERR_NOMEM, "%s step", ts_optimizer_name(o));
    ts_status st = TS_OK;
    for (int i = 0; i < o->n && st == TS_OK; i++) {
        param_state *s = &o->ps[i];
        if (!s->p->grad) continue;
        st = state_prepare(o, s);
        if (st == TS_OK) st = ts__contiguous(s->p->grad, &gs[i]);
        if (st != TS_OK) st = ts__error_prefix(st, "%s step: '%s'", ts_optimizer_name(o), s->name);
    }
    /* 2. the updates */
    bool prev = ts_grad_set_enabled(false);
    for (int i = 0; i < o->n && st == TS_OK; i++) {
        param_state *s = &o->ps[i];
        if (!gs[i]) continue;
        st = o->kind == OPT_SGD ? step_sgd(o, s, gs[i]) : step_adamw(o, s, gs[i]);
        if (st != TS_OK) st = ts__error_prefix(st, "%s step: '%s'", ts_optimizer_name(o), s->name);
    }
    ts_grad_set_enabled(prev);
    for (int i = 0; i < o->n; i++) ts_tensor_release(gs[i]);
    free(gs);
    if (st != TS_OK) {
        /* state created for this step but never written is not state: a checkpoint must not see it */
        for (int i = 0; i < o->n; i++) {
            param_state *s = &o->ps[i];
            if (s->buf_fresh || (o->kind == OPT_ADAMW && s->exp_avg && s->step == 0)) clear_state(s);
        }
        return st;
    }
    o->nsteps++;
    return TS_OK;
}

/* ---- weight-decay groups ------------------------------------------------------------------------------ */
ts_status ts_optimizer_set_decay(ts_optimizer *o, const char *name, bool decay) {
    TS_ARG(o && name, "ts_optimizer_set_decay: NULL argument");
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->ps[i].name, name)) {
            o->ps[i].no_decay = !decay;
            return TS_OK;
        }
    return ts_error(TS_ERR_INVALID_ARG, "ts_optimizer_set_decay: the %s optimizer has no parameter '%s'",
                    ts_optimizer_name(o), name);
}

ts_status ts_optimizer_set_decay_rule(ts_optimizer *o, ts_decay_rule rule) {
    TS_ARG(o, "ts_optimizer_set_decay_rule: NULL optimizer");
    TS_ARG(rule == TS_DECAY_ALL || rule == TS_DECAY_MATRICES, "ts_optimizer_set_decay_rule: unknown rule %d", (int)rule);
    for (int i = 0; i < o->n; i++) o->ps[i].no_decay = rule == TS_DECAY_MATRICES && o->ps[i].p->ndim < 2;
    return TS_OK;
}

bool ts_optimizer_decays(const ts_optimizer *o, const char *name) {
    for (int i = 0; o && name && i < o->n; i++)
        if (!strcmp(o->ps[i].name, name)) return !o->ps[i].no_decay;
    return false;
}

/* ---- state ------------------------------------------------------------------------------------------ */
static ts_status append_scalar(ts_tensor_list *out, const char *name, ts_dtype dt, const void *v) {
    ts_tensor *t = NULL;
    TS_TRY(ts_tensor_from_data(ts_device_cpu(), dt, 1, (int64_t[]){1}, v, &t));
    ts_status st = ts_tensor_list_append(out, name, t);
    ts_tensor_release(t);
    return st;
}

ts_status ts_optimizer_state(const ts_optimizer *o, ts_tensor_list *out) {
    TS_ARG(o && out, "ts_optimizer_state: NULL argument");
    TS_TRY(append_scalar(out, "step", TS_I64, &o->nsteps));
    TS_TRY(append_scalar(out, "lr", TS_F32, &o->lr));
    char name[512];
    for (int i = 0; i < o->n; i++) {
        param_state *s = &o->ps[i];
        if (o->kind == OPT_ADAMW && s->exp_avg) {
            snprintf(name, sizeof name, "%s.step", s->name);
            TS_TRY(append_scalar(out, name, TS_I64, &s->step));
        }
        for (int k = 0; k < S_COUNT; k++) {
            ts_tensor *t = *state_slot(s, k);
            if (!t || !state_used(o, k)) continue;
            snprintf(name, sizeof name, "%s.%s", s->name, state_suffix[k]);
            TS_TRY(ts_tensor_list_append(out, name, t));
        }
    }
    return TS_OK;
}

/* Splits "<param>.<suffix>" into the parameter index and the state index
 * (S_COUNT for ".step"). Returns false when no parameter/suffix matches. */
static bool parse_key(const ts_optimizer *o, const char *key, int *pi, int *ki) {
    size_t kl = strlen(key);
    for (int k = 0; k <= S_COUNT; k++) {
        const char *suf = k < S_COUNT ? state_suffix[k] : "step";
        if (k < S_COUNT && !state_used(o, k)) continue;
        if (k == S_COUNT && o->kind != OPT_ADAMW) continue;
        size_t sl = strlen(suf);
        if (kl < sl + 2 || key[kl - sl - 1] != '.' || strcmp(key + kl - sl, suf) != 0) continue;
        size_t nl = kl - sl - 1;
        for (int i = 0; i < o->n; i++)
            if (strlen(o->ps[i].name) == nl && memcmp(o->ps[i].name, key, nl) == 0) {
                *pi = i;
                *ki = k;
                return true;
            }
    }
    return false;
}

ts_status ts_optimizer_load_state(ts_optimizer *o, const ts_tensor_list *sl) {
    TS_ARG(o && sl, "ts_optimizer_load_state: NULL argument");
    const char *fn = "ts_optimizer_load_state";
    /* per parameter: index into sl of each state (and of ".step" at S_COUNT), or -1 */
    int (*idx)[S_COUNT + 1] = ts__calloc((size_t)(o->n ? o->n : 1), sizeof *idx);
    param_state *fresh = ts__calloc((size_t)(o->n ? o->n : 1), sizeof *fresh);
    ts_status st = TS_OK;
    int step_i = -1, lr_i = -1;
    if (!idx || !fresh) {
        st = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < o->n; i++)
        for (int k = 0; k <= S_COUNT; k++) idx[i][k] = -1;
    /* check */
    for (int e = 0; e < sl->n; e++) {
        const char *key = sl->names[e];
        ts_tensor *t = sl->tensors[e];
        int pi, ki;
        if (strcmp(key, "step") == 0 || strcmp(key, "lr") == 0) {
            if (ts_tensor_numel(t) != 1) {
                st = ts_error(TS_ERR_SHAPE, "%s: '%s' must have one element", fn, key);
                goto done;
            }
            *(key[0] == 's' ? &step_i : &lr_i) = e;
            continue;
        }
        if (!parse_key(o, key, &pi, &ki)) {
            st = ts_error(TS_ERR_INVALID_ARG, "%s: unexpected key '%s' for this %s optimizer", fn, key,
                          ts_optimizer_name(o));
            goto done;
        }
        idx[pi][ki] = e;
        ts_tensor *p = o->ps[pi].p;
        char a[96], b[96];
        if (ki == S_COUNT) {
            if (ts_tensor_numel(t) != 1) {
                st = ts_error(TS_ERR_SHAPE, "%s: '%s' must have one element", fn, key);
                goto done;
            }
        } else if (!ts__same_shape(t, p) || t->dtype != TS_F32) {
            st = ts_error(TS_ERR_SHAPE, "%s: '%s' has shape %s %s, the parameter %s float32", fn, key,
                          ts_shape_str(t->ndim, t->shape, a, sizeof a), ts_dtype_name(t->dtype),
                          ts_shape_str(p->ndim, p->shape, b, sizeof b));
            goto done;
        }
    }
    if (o->kind == OPT_ADAMW)
        for (int i = 0; i < o->n; i++) {
            int have = 0, need = 0;
            for (int k = S_EXP_AVG; k <= S_COUNT; k++) {
                if (k < S_COUNT && !state_used(o, k)) continue;
                need++;
                have += idx[i][k] >= 0;
            }
            if (have && have != need) {
                st = ts_error(TS_ERR_INVALID_ARG, "%s: incomplete AdamW state for '%s' (%d of %d entries%s)", fn,
                              o->ps[i].name, have, need, o->adamw.amsgrad ? ", amsgrad needs max_exp_avg_sq" : "");
                goto done;
            }
        }
    /* copy into fresh state on each parameter's device */
    for (int i = 0; i < o->n; i++) {
        for (int k = 0; k < S_COUNT; k++) {
            if (idx[i][k] < 0) continue;
            ts_tensor **slot = state_slot(&fresh[i], k);
            const ts_tensor *src = sl->tensors[idx[i][k]];
            st = ts__new(o->ps[i].p->storage->device, TS_F32, src->ndim, src->shape, slot);
            if (st == TS_OK) st = ts_tensor_copy_(*slot, src);
            if (st != TS_OK) {
                st = ts__error_prefix(st, "%s: '%s'", fn, sl->names[idx[i][k]]);
                goto done;
            }
        }
        if (idx[i][S_COUNT] >= 0) fresh[i].step = (int64_t)ts_tensor_item(sl->tensors[idx[i][S_COUNT]], 0);
    }
    /* commit */
    for (int i = 0; i < o->n; i++) {
        clear_state(&o->ps[i]);
        for (int k = 0; k < S_COUNT; k++) {
            *state_slot(&o->ps[i], k) = *state_slot(&fresh[i], k);
            *state_slot(&fresh[i], k) = NULL;
        }
        o->ps[i].step = fresh[i].step;
    }
    o->nsteps = step_i >= 0 ? (int64_t)ts_tensor_item(sl->tensors[step_i], 0) : 0;
    if (lr_i >= 0) o->lr = (float)ts_tensor_item(sl->tensors[lr_i], 0);
done:
    if (fresh)
        for (int i = 0; i < o->n; i++) clear_state(&fresh[i]);
    free(fresh);
    free(idx);
    return st;
}

/* ---- checking a saved state ------------------------------------------------------------------------- */
/* A scalar counter read from a checkpoint: one element, integral, in [0, 2^53]. */
static ts_status state_count(const char *fn, const char *key, const ts_tensor *t, int64_t *out) {
    double v = ts_tensor_numel(t) == 1 ? ts_tensor_item(t, 0) : NAN;
    if (!(v >= 0 && v <= 9007199254740992.0 && v == floor(v)))
        return ts_error(TS_ERR_FORMAT, "%s: '%s' is %g, not a step count (an integer in [0, 2^53])", fn, key, v);
    *out = (int64_t)v;
    return TS_OK;
}

ts_status ts_optimizer_check_state(const ts_optimizer *o, const ts_tensor_list *sl) {
    TS_ARG(o && sl, "ts_optimizer_check_state: NULL argument");
    const char *fn = "optimizer state";
    int (*idx)[S_COUNT + 1] = ts__calloc((size_t)(o->n ? o->n : 1), sizeof *idx);
    if (!idx) return TS_ERR_NOMEM;
    for (int i = 0; i < o->n; i++)
        for (int k = 0; k <= S_COUNT; k++) idx[i][k] = -1;
    ts_status st = TS_OK;
    int64_t steps = 0, pstep = 0;
    char a[96], b[96];
    for (int e = 0; e < sl->n && st == TS_OK; e++) {
        const char *key = sl->names[e];
        const ts_tensor *t = sl->tensors[e];
        int pi, ki;
        if (strcmp(key, "step") == 0) {
            st = state_count(fn, key, t, &steps);
        } else if (strcmp(key, "lr") == 0) {
            double lr = ts_tensor_numel(t) == 1 ? ts_tensor_item(t, 0) : NAN;
            if (!(lr >= 0 && isfinite(lr)))
                st = ts_error(TS_ERR_FORMAT, "%s: 'lr' is %g, not a learning rate", fn, lr);
        } else if (!parse_key(o, key, &pi, &ki)) {
            st = ts_error(TS_ERR_FORMAT, "%s: unexpected key '%s' for this %s optimizer", fn, key,
                          ts_optimizer_name(o));
        } else if (idx[pi][ki] >= 0) {
            st = ts_error(TS_ERR_FORMAT, "%s: '%s' appears twice", fn, key);
        } else {
            idx[pi][ki] = e;
            const ts_tensor *p = o->ps[pi].p;
            if (ki == S_COUNT) {
                st = state_count(fn, key, t, &pstep);
            } else if (!ts__same_shape(t, p) || t->dtype != TS_F32) {
                st = ts_error(TS_ERR_FORMAT, "%s: '%s' has shape %s %s, the parameter %s float32", fn, key,
                              ts_shape_str(t->ndim, t->shape, a, sizeof a), ts_dtype_name(t->dtype),
                              ts_shape_str(p->ndim, p->shape, b, sizeof b));
            }
        }
    }
    /* After a step, every trainable parameter has the whole state of its optimizer (torch creates it at
     * the first step with a gradient; Tessera's reference models give every parameter one): a state
     * with parameters missing would restart their momentum or moments from zero without a word. */
    for (int i = 0; i < o->n && st == TS_OK; i++) {
        bool trainable = ts_tensor_requires_grad(o->ps[i].p);
        int have = 0, need = 0;
        for (int k = 0; k <= S_COUNT; k++) {
            if (k < S_COUNT ? !state_used(o, k) : o->kind != OPT_ADAMW) continue;
            need++;
            have += idx[i][k] >= 0;
        }
        if (have == need || (have == 0 && (steps == 0 || !trainable))) continue;
        for (int k = 0; k <= S_COUNT; k++) {
            if (k < S_COUNT ? !state_used(o, k) : o->kind != OPT_ADAMW) continue;
            if (idx[i][k] >= 0) continue;
            st = ts_error(TS_ERR_FORMAT, "%s: incomplete: the optimizer took %lld steps but '%s' has no '%s.%s' "
                                         "(%s keeps %d state entries per parameter)",
                          fn, (long long)steps, o->ps[i].name, o->ps[i].name, k < S_COUNT ? state_suffix[k] : "step",
                          ts_optimizer_name(o), need);
            break;
        }
    }
    /* AdamW's per-parameter step counts bias correction: at least one, at most the optimizer's steps. */
    for (int i = 0; i < o->n && st == TS_OK; i++) {
        if (idx[i][S_COUNT] < 0) continue;
        int64_t ps = 0;
        st = state_count(fn, sl->names[idx[i][S_COUNT]], sl->tensors[idx[i][S_COUNT]], &ps);
        if (st == TS_OK && (ps < 1 || ps > steps))
            st = ts_error(TS_ERR_FORMAT, "%s: '%s' is %lld, outside [1, %lld] (the optimizer's steps)", fn,
                          sl->names[idx[i][S_COUNT]], (long long)ps, (long long)steps);
    }
    free(idx);
    return st;
}
