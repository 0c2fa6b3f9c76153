/*
 * nn/module.c — what every module shares: creation and freeing, children,
 * train/eval, the recursive walk over parameters and buffers that gives
 * PyTorch's dotted names and order, state dicts, and moving between devices.
 */
#include "nn/module.h"

#include <stdio.h>

/* ---- creation and freeing ------------------------------------------------------------- */
ts_status ts__module_new(const ts_module_vt *vt, size_t impl_size, ts_module **out) {
    ts_module *m = ts__calloc(1, sizeof *m);
    if (!m) return TS_ERR_NOMEM;
    if (impl_size) {
        m->impl = ts__calloc(1, impl_size);
        if (!m->impl) {
            free(m);
            return TS_ERR_NOMEM;
        }
    }
    m->vt = vt;
    m->training = true;
    *out = m;
    return TS_OK;
}

ts_status ts__module_add_param(ts_module *m, const char *name, ts_tensor *t) {
    if (m->nparams == TS_MODULE_MAX_SLOTS) {
        ts_tensor_release(t);
        return ts_error(TS_ERR_INVALID_ARG, "%s: parameter '%s': a module holds at most %d parameters", m->vt->name,
                        name, TS_MODULE_MAX_SLOTS);
    }
    if (t) ts_tensor_set_requires_grad(t, true);
    m->param_names[m->nparams] = name;
    m->params[m->nparams++] = t;
    return TS_OK;
}

ts_status ts__module_add_buffer(ts_module *m, const char *name, ts_tensor *t) {
    if (m->nbuffers == TS_MODULE_MAX_SLOTS) {
        ts_tensor_release(t);
        return ts_error(TS_ERR_INVALID_ARG, "%s: buffer '%s': a module holds at most %d buffers", m->vt->name, name,
                        TS_MODULE_MAX_SLOTS);
    }
    m->buffer_names[m->nbuffers] = name;
    m->buffers[m->nbuffers++] = t;
    return TS_OK;
}

ts_status ts__module_new_replica(const ts_module *src, ts_module **out) {
    ts_module *r = NULL;
    TS_TRY(ts__module_new(src->vt, 0, &r));
    r->impl = src->impl;
    r->impl_borrowed = true;
    r->training = src->training;
    *out = r;
    return TS_OK;
}

ts_status ts__module_add_child(ts_module *m, const char *name, ts_module *child) {
    char idx[24];
    ts_status st = TS_OK;
    if (!child) return ts_error(TS_ERR_INVALID_ARG, "%s: add: NULL child", m->vt->name);
    if (!name) {
        snprintf(idx, sizeof idx, "%d", m->nchildren);
        name = idx;
    }
    if (!name[0] || strchr(name, '.')) {
        st = ts_error(TS_ERR_INVALID_ARG, "%s: add: child name '%s' is empty or contains '.'", m->vt->name, name);
        goto fail;
    }
    for (int i = 0; i < m->nchildren; i++)
        if (strcmp(m->child_names[i], name) == 0) {
            st = ts_error(TS_ERR_INVALID_ARG, "%s: add: a child named '%s' already exists", m->vt->name, name);
            goto fail;
        }
    if (m->nchildren == m->cap_children) {
        int cap = m->cap_children ? 2 * m->cap_children : 8;
        char **nn = realloc(m->child_names, sizeof *nn * (size_t)cap);
        if (!nn) goto nomem;
        m->child_names = nn;
        ts_module **cc = realloc(m->children, sizeof *cc * (size_t)cap);
        if (!cc) goto nomem;
        m->children = cc;
        m->cap_children = cap;
    }
    char *copy = ts__strdup(name);
    if (!copy) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    m->child_names[m->nchildren] = copy;
    m->children[m->nchildren++] = child;
    return TS_OK;
nomem:
    st = ts_error(TS_ERR_NOMEM, "%s: add: out of memory", m->vt->name);
fail:
    ts_module_free(child);
    return st;
}

void ts_module_free(ts_module *m) {
    if (!m) return;
    for (int i = 0; i < m->nchildren; i++) {
        ts_module_free(m->children[i]);
        free(m->child_names[i]);
    }
    free(m->children);
    free(m->child_names);
    for (int i = 0; i < m->nparams; i++) ts_tensor_release(m->params[i]);
    for (int i = 0; i < m->nbuffers; i++) ts_tensor_release(m->buffers[i]);
    if (!m->impl_borrowed) {
        if (m->vt->free_impl) m->vt->free_impl(m);
        free(m->impl);
    }
    free(m);
}

ts_status ts__param_uniform(int ndim, const int64_t *shape, double bound, ts_rng *rng, ts_tensor **out) {
    ts_tensor *t = NULL;
    TS_TRY(ts_tensor_empty(ts_device_cpu(), TS_F32, ndim, shape, &t));
    ts_status st = ts_tensor_uniform_(t, (float)-bound, (float)bound, rng);
    if (st != TS_OK) {
        ts_tensor_release(t);
        return st;
    }
    *out = t;
    return TS_OK;
}

/* ---- every module ------------------------------------------------------------------------ */
ts_status ts_module_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    TS_ARG(m && x && out, "ts_module_forward: NULL argument");
    ts_status st = m->vt->forward(m, x, out);
    if (st != TS_OK) *out = NULL;
    return st;
}

void ts_module_train(ts_module *m, bool training) {
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++) ts_module_train(m->children[i], training);
}

bool ts_module_is_training(const ts_module *m) { return m && m->training; }

const char *ts_module_type_name(const ts_module *m) { return m ? m->vt->name : ""; }

ts_module_kind_id ts_module_kind(const ts_module *m) { return m ? m->vt->kind : TS_MODULE_CUSTOM; }

const char *ts_module_kind_name(ts_module_kind_id kind) {
    /* the type names of the vtables of each kind (src/nn, src/parallel) */
    static const char *const names[TS_MODULE_KIND_COUNT] = {
        [TS_MODULE_CUSTOM] = "Custom",
        [TS_MODULE_SEQUENTIAL] = "Sequential",
        [TS_MODULE_LINEAR] = "Linear",
        [TS_MODULE_CONV2D] = "Conv2d",
        [TS_MODULE_BATCHNORM2D] = "BatchNorm2d",
        [TS_MODULE_SYNC_BATCHNORM] = "SyncBatchNorm",
        [TS_MODULE_RELU] = "ReLU",
        [TS_MODULE_MAXPOOL2D] = "MaxPool2d",
        [TS_MODULE_AVGPOOL2D] = "AvgPool2d",
        [TS_MODULE_ADAPTIVE_AVGPOOL2D] = "AdaptiveAvgPool2d",
        [TS_MODULE_FLATTEN] = "Flatten",
        [TS_MODULE_DROPOUT] = "Dropout",
        [TS_MODULE_EMBEDDING] = "Embedding",
        [TS_MODULE_RESIDUAL_BLOCK] = "BasicBlock",
        [TS_MODULE_DATA_PARALLEL] = "DataParallel",
        [TS_MODULE_MODEL_PARALLEL] = "ModelParallel",
        [TS_MODULE_PIPELINE_PARALLEL] = "PipelineParallel",
        [TS_MODULE_TILE_PARALLEL] = "TileParallel",
        [TS_MODULE_TO_DEVICE] = "ToDevice",
        [TS_MODULE_LAYERNORM] = "LayerNorm",
        [TS_MODULE_GROUPNORM] = "GroupNorm",
        [TS_MODULE_BATCHNORM1D] = "BatchNorm1d",
    };
    if ((int)kind < 0 || (int)kind >= TS_MODULE_KIND_COUNT || !names[kind]) return "?";
    return names[kind];
}

ts_module *ts_module_child(ts_module *m, const char *path) {
    if (!m || !path) return NULL;
    while (*path) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
        ts_module *next = NULL;
        for (int i = 0; i < m->nchildren && !next; i++)
            if (strlen(m->child_names[i]) == len && memcmp(m->child_names[i], path, len) == 0) next = m->children[i];
        if (!next) return NULL;
        m = next;
        path += len + (dot ? 1 : 0);
    }
    return m;
}

/* ---- the walk ------------------------------------------------------------------------------ */
#define NAME_MAX_LEN 512
enum { WALK_PARAMS = 1, WALK_BUFFERS = 2 };

/* fn gets the dotted name and the slot (so it may replace the tensor). */
typedef ts_status (*walk_fn)(void *ctx, const char *name, ts_tensor **slot, bool is_param);

static ts_status walk(ts_module *m, char *name, size_t len, int what, walk_fn fn, void *ctx) {
    for (int pass = 0; pass < 2; pass++) {
        bool params = pass == 0;
        if (!(what & (params ? WALK_PARAMS : WALK_BUFFERS))) continue;
        int n = params ? m->nparams : m->nbuffers;
        for (int i = 0; i < n; i++) {
            ts_tensor **slot = params ? &m->params[i] : &m->buffers[i];
            if (!*slot) continue;
            const char *leaf = params ? m->param_names[i] : m->buffer_names[i];
            if (len + strlen(leaf) + 1 > NAME_MAX_LEN)
                return ts_error(TS_ERR_INVALID_ARG, "module: name '%.*s%s' is too long", (int)len, name, leaf);
            strcpy(name + len, leaf);
            TS_TRY(fn(ctx, name, slot, params));
        }
    }
    for (int i = 0; i < m->nchildren; i++) {
        size_t cl = strlen(m->child_names[i]);
        if (len + cl + 2 > NAME_MAX_LEN)
            return ts_error(TS_ERR_INVALID_ARG, "module: name '%.*s%s' is too long", (int)len, name, m->child_names[i]);
        memcpy(name + len, m->child_names[i], cl);
        name[len + cl] = '.';
        name[len + cl + 1] = '\0';
        TS_TRY(walk(m->children[i], name, len + cl + 1, what, fn, ctx));
    }
    name[len] = '\0';
    return TS_OK;
}

static ts_status walk_root(ts_module *m, int what, walk_fn fn, void *ctx) {
    char name[NAME_MAX_LEN];
    name[0] = '\0';
    return walk(m, name, 0, what, fn, ctx);
}

static ts_status append_live(void *ctx, const char *name, ts_tensor **slot, bool is_param) {
    return ts_tensor_list_append((ts_tensor_list *)ctx, name, *slot);
}

static ts_status append_detached(void *ctx, const char *name, ts_tensor **slot, bool is_param) {
    ts_tensor *d = NULL;
    TS_TRY(ts_tensor_detach(*slot, &d));
    ts_status st = ts_tensor_list_append((ts_tensor_list *)ctx, name, d);
    ts_tensor_release(d);
    return st;
}

ts_status ts_module_parameters(ts_module *m, ts_tensor_list *out) {
    TS_ARG(m && out, "ts_module_parameters: NULL argument");
    return walk_root(m, WALK_PARAMS, append_live, out);
}

ts_status ts_module_buffers(ts_module *m, ts_tensor_list *out) {
    TS_ARG(m && out, "ts_module_buffers: NULL argument");
    return walk_root(m, WALK_BUFFERS, append_live, out);
}

ts_status ts_module_state_dict(ts_module *m, ts_tensor_list *out) {
    TS_ARG(m && out, "ts_module_state_dict: NULL argument");
    return walk_root(m, WALK_PARAMS | WALK_BUFFERS, append_detached, out);
}

static ts_status count_params(void *ctx, const char *name, ts_tensor **slot, bool is_param) {
    *(int64_t *)ctx += ts_tensor_numel(*slot);
    return TS_OK;
}

int64_t ts_module_num_parameters(ts_module *m) {
    int64_t n = 0;
    if (m) walk_root(m, WALK_PARAMS, count_params, &n);
    return n;
}

static ts_status zero_grad_fn(void *ctx, const char *name, ts_tensor **slot, bool is_param) {
    ts_tensor_zero_grad(*slot);
    return TS_OK;
}

void ts_module_zero_grad(ts_module *m) {
    if (m) walk_root(m, WALK_PARAMS, zero_grad_fn, NULL);
}

/* ---- load_state_dict ----------------------------------------------------------------------- */
typedef struct load_ctx {
    const ts_tensor_list *sd;
    bool strict, copy;
    unsigned char *seen; /* per sd entry */
} load_ctx;

static int find_index(const ts_tensor_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0) return i;
    return -1;
}

static ts_status load_fn(void *vctx, const char *name, ts_tensor **slot, bool is_param) {
    load_ctx *c = vctx;
    int i = find_index(c->sd, name);
    if (i < 0) {
        if (c->strict) return ts_error(TS_ERR_INVALID_ARG, "load_state_dict: missing key '%s' in the state dict", name);
        return TS_OK;
    }
    c->seen[i] = 1;
    ts_tensor *src = c->sd->tensors[i], *dst = *slot;
    if (!c->copy) {
        char a[128], b[128];
        if (!ts__same_shape(src, dst))
            return ts_error(TS_ERR_SHAPE,
                            "load_state_dict: size mismatch for '%s': the state dict has shape %s, the model has shape %s",
                            name, ts_shape_str(src->ndim, src->shape, a, sizeof a),
                            ts_shape_str(dst->ndim, dst->shape, b, sizeof b));
        if (src->dtype != dst->dtype)
            return ts_error(TS_ERR_DTYPE, "load_state_dict: dtype mismatch for '%s': the state dict has %s, the model has %s",
                            name, ts_dtype_name(src->dtype), ts_dtype_name(dst->dtype));
        return TS_OK;
    }
    ts_status st = ts_tensor_copy_(dst, src);
    if (st != TS_OK) return ts__error_prefix(st, "load_state_dict: '%s'", name);
    return TS_OK;
}

ts_status ts_module_load_state_dict(ts_module *m, const ts_tensor_list *sd, bool strict) {
    TS_ARG(m && sd, "ts_module_load_state_dict: NULL argument");
    load_ctx c = {sd, strict, false, NULL};
    c.seen = ts__calloc((size_t)(sd->n ? sd->n : 1), 1);
    if (!c.seen) return TS_ERR_NOMEM;
    /* pass 1: check every key, shape and dtype; pass 2: copy */
    ts_status st = walk_root(m, WALK_PARAMS | WALK_BUFFERS, load_fn, &c);
    if (st == TS_OK && strict)
        for (int i = 0; i < sd->n; i++)
            if (!c.seen[i]) {
                st = ts_error(TS_ERR_INVALID_ARG, "load_state_dict: unexpected key '%s' in the state dict", sd->names[i]);
                break;
            }
    if (st == TS_OK) {
        bool prev = ts_grad_set_enabled(false);
        c.copy = true;
        st = walk_root(m, WALK_PARAMS | WALK_BUFFERS, load_fn, &c);
        ts_grad_set_enabled(prev);
    }
    free(c.seen);
    return st;
}

/* ---- moving between devices ------------------------------------------------------------------- */
static ts_status move_tensor(ts_tensor *t, ts_device *dev, ts_tensor **out) {
    ts_tensor *o = NULL;
    TS_TRY(ts__new(dev, t->dtype, t->ndim, t->shape, &o));
    ts_status st = ts_tensor_copy_(o, t);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

static ts_status to_fn(void *ctx, const char *name, ts_tensor **slot, bool is_param) {
    ts_device *dev = ctx;
    ts_tensor *t = *slot, *o = NULL, *g = NULL;
    if (t->storage->device == dev) return TS_OK;
    ts_status st = move_tensor(t, dev, &o);
    if (st == TS_OK && t->grad) st = move_tensor(t->grad, dev, &g);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return ts__error_prefix(st, "ts_module_to: '%s'", name);
    }
    if (t->name) ts_tensor_set_name(o, t->name);
    if (is_param || t->requires_grad) ts_tensor_set_requires_grad(o, true);
    if (g) {
        ts_tensor_set_grad(o, g);
        ts_tensor_release(g);
    }
    ts_tensor_release(t);
    *slot = o;
    return TS_OK;
}

ts_status ts_module_to(ts_module *m, ts_device *dev) {
    TS_ARG(m && dev, "ts_module_to: NULL argument");
    bool prev = ts_grad_set_enabled(false);
    ts_status st = walk_root(m, WALK_PARAMS | WALK_BUFFERS, to_fn, dev);
    ts_grad_set_enabled(prev);
    return st;
}
