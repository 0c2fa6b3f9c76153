/*
 * nn/checkpoint.c — activation checkpointing (ts_module_set_checkpointed), torch.utils.checkpoint's
 * reentrant form.
 *
 * Forward (ts_module_forward of a marked module with grad mode on): m's forward runs with autograd off, so
 * none of the unit's intermediate tensors is saved, and its output gets one "checkpoint" node whose inputs
 * are the unit's input and every parameter slot of m's subtree (in walk order). The node saves the input (a
 * detached alias) and, in its context, the generators' states at the start of the forward: the calling
 * thread's default generator (what ts_dropout(NULL) and the GPT draw from) and those of m's Dropout modules.
 *
 * Backward (the node's): with grad mode on, m's forward runs again on a fresh leaf aliasing the saved input,
 * with each parameter slot temporarily holding a fresh leaf aliasing its parameter (same storage, requiring
 * grad as the parameter does), each buffer slot a copy (so BatchNorm's running statistics are updated once,
 * by the first forward), and the generators set to the saved states (put back afterwards: the replay draws
 * nothing from the run's stream). Then a nested ts_backward over that recomputed graph with the incoming
 * gradient, and the aliases' gradients become the node's input gradients: the outer pass hands them to the
 * parameters' accumulate nodes as any op's, so a parameter used inside and outside the unit sums both, and
 * grad-ready hooks (DDP's buckets) fire from the outer pass as without checkpointing.
 *
 * Why the aliases: the engine's nested passes must run over graphs disjoint from the outer one (a node's
 * scratch holds one pass's state, autograd.c). Recording the recomputed forward over the parameters
 * themselves would share their accumulate nodes with the outer pass; over fresh leaves, the inner graph is
 * disjoint by construction. The same kernels run in the same order on the same values as without
 * checkpointing, so losses and gradients are bit-for-bit those of the plain forward (tests/test_checkpoint.c).
 */
#include "autograd/autograd.h"
#include "nn/module.h"

#include <stdlib.h>

#define CKPT_MAX_RNG 8

typedef struct ckpt_ctx {
    ts_module *m;                 /* borrowed: the module outlives the graph */
    int nslots;                   /* parameter slots of m's subtree, walk order (node input 1 + i) */
    ts_tensor ***slots;           /* [nslots] the slots (m's) */
    const ts_tensor **at_forward; /* [nslots] what each slot held at the forward (weak, for a check) */
    int nrng;
    ts_rng *rng[CKPT_MAX_RNG]; /* NULL: the calling thread's default generator */
    ts_rng state[CKPT_MAX_RNG];
} ckpt_ctx;

static void ctx_free(void *p) {
    ckpt_ctx *c = p;
    if (!c) return;
    free(c->slots);
    free(c->at_forward);
    free(c);
}

/* ---- walking the subtree --------------------------------------------------------------------------- */
/* The non-NULL parameter (buffers false) or buffer slots of m's subtree, pre-order: counted when slots is
 * NULL, else stored from slots[*k]. */
static int walk_slots(ts_module *m, bool buffers, ts_tensor ***slots, int k) {
    const int n = buffers ? m->nbuffers : m->nparams;
    ts_tensor **v = buffers ? m->buffers : m->params;
    for (int i = 0; i < n; i++)
        if (v[i]) {
            if (slots) slots[k] = &v[i];
            k++;
        }
    for (int i = 0; i < m->nchildren; i++) k = walk_slots(m->children[i], buffers, slots, k);
    return k;
}

static bool params_require_grad(const ts_module *m) {
    for (int i = 0; i < m->nparams; i++)
        if (m->params[i] && ts_tensor_requires_grad(m->params[i])) return true;
    for (int i = 0; i < m->nchildren; i++)
        if (params_require_grad(m->children[i])) return true;
    return false;
}

static ts_status add_rng(ckpt_ctx *c, ts_rng *r) {
    for (int i = 0; i < c->nrng; i++)
        if (c->rng[i] == r) return TS_OK;
    if (c->nrng == CKPT_MAX_RNG)
        return ts_error(TS_ERR_UNSUPPORTED, "activation checkpointing: %s's Dropout modules draw from more than %d "
                        "generators", c->m->vt->name, CKPT_MAX_RNG - 1);
    c->rng[c->nrng++] = r;
    return TS_OK;
}

static ts_status collect_rngs(ckpt_ctx *c, const ts_module *m) {
    ts_rng *r = ts__dropout_module_rng(m);
    if (r) TS_TRY(add_rng(c, r));
    for (int i = 0; i < m->nchildren; i++) TS_TRY(collect_rngs(c, m->children[i]));
    return TS_OK;
}

static ts_rng *rng_of(const ckpt_ctx *c, int i) { return c->rng[i] ? c->rng[i] : ts_rng_default(); }

/* ---- forward ------------------------------------------------------------------------------------------ */
static ts_status ckpt_backward(ts_node *n, ts_tensor *gout, ts_tensor **gin);

static ts_status ctx_new(ts_module *m, ckpt_ctx **out) {
    ckpt_ctx *c = ts__calloc(1, sizeof *c);
    if (!c) return ts_error(TS_ERR_NOMEM, "activation checkpointing: out of memory");
    c->m = m;
    c->nslots = walk_slots(m, false, NULL, 0);
    c->slots = ts__calloc((size_t)c->nslots + 1, sizeof *c->slots);
    c->at_forward = ts__calloc((size_t)c->nslots + 1, sizeof *c->at_forward);
    ts_status st = TS_OK;
    if (!c->slots || !c->at_forward) st = ts_error(TS_ERR_NOMEM, "activation checkpointing: out of memory");
    if (st == TS_OK) {
        walk_slots(m, false, c->slots, 0);
        for (int i = 0; i < c->nslots; i++) c->at_forward[i] = *c->slots[i];
        c->rng[c->nrng++] = NULL; /* the default generator */
        st = collect_rngs(c, m);
    }
    for (int i = 0; st == TS_OK && i < c->nrng; i++) c->state[i] = *rng_of(c, i);
    if (st != TS_OK) {
        ctx_free(c);
        return st;
    }
    *out = c;
    return TS_OK;
}

/* The checkpoint node over x and c's slots, attached to y; c is the node's from here on (also on failure). */
static ts_status record(ckpt_ctx *c, const ts_tensor *x, ts_tensor *y) {
    const ts_tensor **in = ts__calloc((size_t)c->nslots + 1, sizeof *in);
    if (!in) {
        ctx_free(c);
        return ts_error(TS_ERR_NOMEM, "activation checkpointing: out of memory");
    }
    in[0] = x;
    for (int i = 0; i < c->nslots; i++) in[1 + i] = c->at_forward[i];
    ts_node *n = NULL;
    ts_status st = ts__node_new("checkpoint", ckpt_backward, 1 + c->nslots, in, &n);
    free(in);
    if (st != TS_OK || !n) { /* !n: not reached, the caller checked that something requires grad */
        ctx_free(c);
        return st != TS_OK ? st : ts_error(TS_ERR_INTERNAL, "activation checkpointing: no node recorded");
    }
    n->ctx = c;
    n->free_ctx = ctx_free;
    ts__node_save(n, x);
    return ts__node_attach(n, y); /* on failure the node, and c with it, is released */
}

ts_status ts__checkpoint_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    if (!ts_tensor_requires_grad(x) && !params_require_grad(m)) return m->vt->forward(m, x, out);
    ckpt_ctx *c = NULL;
    TS_TRY(ctx_new(m, &c));
    ts_tensor *y = NULL;
    bool prev = ts_grad_set_enabled(false);
    ts_status st = m->vt->forward(m, x, &y);
    ts_grad_set_enabled(prev);
    if (st == TS_OK && ts_tensor_requires_grad(y)) { /* the forward returned a leaf (its input, a parameter) */
        ts_tensor *a = NULL;
        st = ts_tensor_detach(y, &a);
        ts_tensor_release(y);
        y = a;
    }
    if (st != TS_OK) {
        ctx_free(c);
        ts_tensor_release(y);
        return st;
    }
    st = record(c, x, y);
    if (st != TS_OK) {
        ts_tensor_release(y);
        return ts__error_prefix(st, "activation checkpointing of %s", m->vt->name);
    }
    *out = y;
    return TS_OK;
}

/* ---- backward ------------------------------------------------------------------------------------------- */
/* The recomputation's surroundings: fresh leaves in the parameter slots, copies in the buffer slots, the
 * generators at the forward's states; undo puts everything back. */
typedef struct ckpt_scene {
    ts_tensor **alias;   /* [nslots] leaves aliasing the parameters (owned) */
    ts_tensor **orig;    /* [nslots] the slots' tensors */
    int nbuf;
    ts_tensor ***bslots; /* [nbuf] buffer slots */
    ts_tensor **borig;   /* [nbuf] their tensors (the slots hold copies meanwhile) */
    int nswapped, nbswapped;
    ts_rng now[CKPT_MAX_RNG]; /* the generators' states before the replay */
} ckpt_scene;

/* Puts the slots and generators back (the aliases stay, for their gradients). */
static void scene_restore(const ckpt_ctx *c, ckpt_scene *s) {
    for (int i = 0; i < s->nswapped; i++) *c->slots[i] = s->orig[i];
    for (int i = 0; i < s->nbswapped; i++) {
        ts_tensor_release(*s->bslots[i]);
        *s->bslots[i] = s->borig[i];
    }
    s->nswapped = s->nbswapped = 0;
    for (int i = 0; i < c->nrng; i++) *rng_of(c, i) = s->now[i];
}

static void scene_free(const ckpt_ctx *c, ckpt_scene *s) {
    for (int i = 0; s->alias && i < c->nslots; i++) ts_tensor_release(s->alias[i]);
    free(s->alias);
    free(s->orig);
    free(s->bslots);
    free(s->borig);
}

static ts_status scene_set(const ckpt_ctx *c, const ts_node *n, ckpt_scene *s) {
    for (int i = 0; i < c->nrng; i++) s->now[i] = *rng_of(c, i);
    const size_t k = (size_t)c->nslots + 1;
    s->nbuf = walk_slots(c->m, true, NULL, 0);
    s->alias = ts__calloc(k, sizeof *s->alias);
    s->orig = ts__calloc(k, sizeof *s->orig);
    s->bslots = ts__calloc((size_t)s->nbuf + 1, sizeof *s->bslots);
    s->borig = ts__calloc((size_t)s->nbuf + 1, sizeof *s->borig);
    if (!s->alias || !s->orig || !s->bslots || !s->borig)
        return ts_error(TS_ERR_NOMEM, "activation checkpointing: out of memory");
    for (int i = 0; i < c->nslots; i++) {
        if (*c->slots[i] != c->at_forward[i])
            return ts_error(TS_ERR_STATE, "activation checkpointing of %s: parameter %d was replaced between the "
                            "forward and the backward", c->m->vt->name, i);
        TS_TRY(ts_tensor_detach(*c->slots[i], &s->alias[i]));
        ts_tensor_set_requires_grad(s->alias[i], n->needs[1 + i]);
    }
    for (; s->nswapped < c->nslots; s->nswapped++) {
        s->orig[s->nswapped] = *c->slots[s->nswapped];
        *c->slots[s->nswapped] = s->alias[s->nswapped];
    }
    walk_slots(c->m, true, s->bslots, 0);
    for (; s->nbswapped < s->nbuf; s->nbswapped++) {
        ts_tensor *copy = NULL;
        TS_TRY(ts_tensor_clone(*s->bslots[s->nbswapped], &copy));
        s->borig[s->nbswapped] = *s->bslots[s->nbswapped];
        *s->bslots[s->nbswapped] = copy;
    }
    for (int i = 0; i < c->nrng; i++) *rng_of(c, i) = c->state[i];
    return TS_OK;
}

/* Recomputes m's forward on a leaf aliasing the saved input, then backward through it with gout: the input's
 * gradient into gin[0], parameter i's into gin[1 + i]. */
static ts_status ckpt_backward(ts_node *n, ts_tensor *gout, ts_tensor **gin) {
    const ckpt_ctx *c = n->ctx;
    ts_tensor *x = NULL, *y = NULL;
    ckpt_scene s = {0};
    ts_status st;
    TS_CHECK_GOTO(ts_tensor_detach(ts__node_saved(n, 0), &x));
    ts_tensor_set_requires_grad(x, n->needs[0]);
    st = scene_set(c, n, &s);
    if (st == TS_OK) {
        bool prev = ts_grad_set_enabled(true);
        st = c->m->vt->forward(c->m, x, &y);
        ts_grad_set_enabled(prev);
    }
    scene_restore(c, &s);
    if (st == TS_OK && ts_tensor_requires_grad(y)) st = ts_backward(y, gout, false);
    if (st == TS_OK && n->needs[0] && ts_tensor_grad(x)) gin[0] = ts_tensor_retain(ts_tensor_grad(x));
    for (int i = 0; st == TS_OK && i < c->nslots; i++)
        if (n->needs[1 + i] && ts_tensor_grad(s.alias[i])) gin[1 + i] = ts_tensor_retain(ts_tensor_grad(s.alias[i]));
    scene_free(c, &s);
fail:
    ts_tensor_release(x);
    ts_tensor_release(y);
    return st;
}

/* ---- marking ------------------------------------------------------------------------------------------- */
ts_status ts_module_set_checkpointed(ts_module *m, bool on) {
    TS_ARG(m, "ts_module_set_checkpointed: NULL module");
    m->checkpointed = on;
    return TS_OK;
}

bool ts_module_is_checkpointed(const ts_module *m) { return m && m->checkpointed; }

/* Marks the residual blocks of m's subtree; returns how many. */
static int mark_blocks(ts_module *m, bool on) {
    const ts_module_kind_id k = ts_module_kind(m);
    if (k == TS_MODULE_RESIDUAL_BLOCK || k == TS_MODULE_BOTTLENECK) {
        m->checkpointed = on;
        return 1;
    }
    int n = 0;
    for (int i = 0; i < m->nchildren; i++) n += mark_blocks(m->children[i], on);
    return n;
}

ts_status ts_model_set_activation_checkpointing(ts_module *model, bool on, int *units) {
    TS_ARG(model, "ts_model_set_activation_checkpointing: NULL model");
    int n = 0;
    if (ts__is_gpt(model)) {
        ts_module *h = ts_module_child(model, "transformer.h");
        for (int i = 0; h && i < h->nchildren; i++) h->children[i]->checkpointed = on;
        n = h ? h->nchildren : 0;
    } else {
        n = mark_blocks(model, on);
    }
    if (units) *units = n;
    if (n == 0)
        return ts_error(TS_ERR_INVALID_ARG, "activation checkpointing: the model (%s) has no unit to checkpoint "
                        "(GPT blocks, ResNet residual blocks); mark its modules with ts_module_set_checkpointed",
                        model->model_name ? model->model_name : model->vt->name);
    return TS_OK;
}
